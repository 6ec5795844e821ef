"""Exhaustive checks of spec.softfloat on tiny formats against exact rational arithmetic.

Every operand pair of 8-bit formats (add, sub, mul, div), every operand of several formats (sqrt), and
every operand triple of a 6-bit format (fma), in all six rounding modes, bits and flags both.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # the oracle helper module lives beside the tests
import softfloat_oracles as O  # noqa: E402

from spec import softfloat as sf  # noqa: E402

# KC_SOFTFLOAT_FULL=1 runs every environment and extra format shape in all modes; CI runs a subset.
FULL = os.environ.get("KC_SOFTFLOAT_FULL") == "1"
ENV_MODES = sf.ROUNDING_MODES if FULL else ("rne",)
SHAPE_MODES = sf.ROUNDING_MODES if FULL else ("rup",)

E4M3 = sf.Format(4, 3)  # 8 bits
E5M2 = sf.Format(5, 2)  # 8 bits, wide exponent
E3M4 = sf.Format(3, 4)  # 8 bits, narrow exponent
E3M2 = sf.Format(3, 2)  # 6 bits, for fma triples

ENV_CASES = {
    "ieee": (sf.get_env("ieee"), O.Env()),
    "before": (sf.FloatEnv("before", tininess="before"), O.Env(tininess="before")),
    "x86-sse": (sf.get_env("x86-sse"), O.Env(nan_policy="x86")),
    "cuda": (sf.get_env("cuda"), O.Env(nan_policy="cuda")),
    "cuda-ftz": (sf.get_env("cuda-ftz"), O.Env(ftz=True, daz=True, nan_policy="cuda")),
    "ftz-before": (
        sf.FloatEnv("ftz-before", ftz=True, daz=False, tininess="before"),
        O.Env(ftz=True, tininess="before"),
    ),
}


def _pairs(fmt):
    n = 1 << fmt.bits
    v = np.arange(n, dtype=np.uint64).astype(fmt.dtype)
    return np.repeat(v, n), np.tile(v, n)


def _check(fmt, got_bits, got_flags, oracle, operands, label):
    F = O.Fmt(fmt.exp_bits, fmt.frac_bits)
    bad = []
    ops = [o.tolist() for o in operands]
    gb, gf = got_bits.tolist(), got_flags.tolist()
    for i in range(len(gb)):
        eb, ef = oracle(F, *[o[i] for o in ops])
        if eb != gb[i] or ef != gf[i]:
            bad.append((tuple(hex(o[i]) for o in ops), hex(gb[i]), gf[i], hex(eb), ef))
            if len(bad) >= 5:
                break
    assert not bad, f"{label}: (operands, got bits, got flags, want bits, want flags): {bad}"


@pytest.mark.parametrize("mode", sf.ROUNDING_MODES)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_ops_all_pairs_e4m3(op, mode):
    a, b = _pairs(E4M3)
    bits, fl = getattr(sf, op)(a, b, fmt=E4M3, rounding=mode, flags=True)
    _check(E4M3, bits, fl, lambda F, x, y: getattr(O, op)(F, x, y, mode), [a, b], f"{op} {mode}")


@pytest.mark.parametrize("env", [k for k in ENV_CASES if k != "ieee"])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_ops_all_pairs_envs(op, env):
    sf_env, o_env = ENV_CASES[env]
    a, b = _pairs(E4M3)
    for mode in ENV_MODES:
        bits, fl = getattr(sf, op)(a, b, fmt=E4M3, rounding=mode, env=sf_env, flags=True)
        oracle = lambda F, x, y, m=mode: getattr(O, op)(F, x, y, m, o_env)  # noqa: E731
        _check(E4M3, bits, fl, oracle, [a, b], f"{op} {mode} {env}")


@pytest.mark.parametrize("fmt", [E5M2, E3M4], ids=["e5m2", "e3m4"])
@pytest.mark.parametrize("op", ["add", "mul", "div"])
def test_binary_ops_all_pairs_other_shapes(op, fmt):
    a, b = _pairs(fmt)
    for mode in SHAPE_MODES:
        bits, fl = getattr(sf, op)(a, b, fmt=fmt, rounding=mode, flags=True)
        _check(fmt, bits, fl, lambda F, x, y, m=mode: getattr(O, op)(F, x, y, m), [a, b], f"{op} {mode}")


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E3M4, sf.BINARY16, sf.BFLOAT16], ids=lambda f: f.name)
@pytest.mark.parametrize("mode", sf.ROUNDING_MODES)
def test_sqrt_every_operand(fmt, mode):
    a = np.arange(1 << fmt.bits, dtype=np.uint64).astype(fmt.dtype)
    bits, fl = sf.sqrt(a, fmt=fmt, rounding=mode, flags=True)
    _check(fmt, bits, fl, lambda F, x: O.sqrt(F, x, mode), [a], f"sqrt {mode}")


@pytest.mark.parametrize("env", ["cuda-ftz", "before", "cuda"])
def test_sqrt_envs(env):
    sf_env, o_env = ENV_CASES[env]
    a = np.arange(1 << 16, dtype=np.uint16)
    bits, fl = sf.sqrt(a, fmt=sf.BINARY16, rounding="rne", env=sf_env, flags=True)
    _check(sf.BINARY16, bits, fl, lambda F, x: O.sqrt(F, x, "rne", o_env), [a], f"sqrt {env}")


def _triples(fmt):
    n = 1 << fmt.bits
    v = np.arange(n, dtype=np.uint8)
    a = np.repeat(v, n * n)
    b = np.tile(np.repeat(v, n), n)
    c = np.tile(v, n * n)
    return a, b, c


@pytest.mark.parametrize("mode", sf.ROUNDING_MODES)
def test_fma_all_triples_e3m2(mode):
    a, b, c = _triples(E3M2)
    bits, fl = sf.fma(a, b, c, fmt=E3M2, rounding=mode, flags=True)
    _check(E3M2, bits, fl, lambda F, x, y, z: O.fma(F, x, y, z, mode), [a, b, c], f"fma {mode}")


@pytest.mark.parametrize("env", ["cuda-ftz", "x86-sse", "before"] if FULL else ["cuda-ftz"])
def test_fma_all_triples_envs(env):
    sf_env, o_env = ENV_CASES[env]
    a, b, c = _triples(E3M2)
    for mode in ENV_MODES:
        bits, fl = sf.fma(a, b, c, fmt=E3M2, rounding=mode, env=sf_env, flags=True)
        oracle = lambda F, x, y, z, m=mode: O.fma(F, x, y, z, m, o_env)  # noqa: E731
        _check(E3M2, bits, fl, oracle, [a, b, c], f"fma {mode} {env}")


def test_fma_matches_mul_then_add_when_exact():
    """Sanity of the triple generator: fma(a, 1, c) == add(a, c) for every pair of E4M3."""
    a, c = _pairs(E4M3)
    one = np.full_like(a, E4M3.bias << E4M3.frac_bits)
    for mode in sf.ROUNDING_MODES:
        np.testing.assert_array_equal(sf.fma(a, one, c, fmt=E4M3, rounding=mode), sf.add(a, c, fmt=E4M3, rounding=mode))
