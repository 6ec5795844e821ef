"""binary16 / bfloat16: the device reference (binary64 op, one rounding) against the softfloat; contract items."""

from __future__ import annotations

import numpy as np
import pytest

from falsification import halfprec_tests as ht
from falsification.sweep import round_to_format
from spec import halfprec as spec
from spec import softfloat as sf
from tests.contract_helpers import CONTRACTS, check_items, needs_cuda

CONTRACT = CONTRACTS / "halfprec-v1.yaml"
_SF = {"binary16": sf.BINARY16, "bfloat16": sf.BFLOAT16}


@pytest.mark.parametrize("fmt", ["binary16", "bfloat16"])
def test_integer_rounding_matches_the_independent_frexp_rounding(fmt):
    rng = np.random.default_rng(4)
    y = rng.standard_normal(100_000) * 2.0 ** rng.integers(-150, 140, 100_000)
    eb, fb = spec.FORMATS[fmt]
    unit = 2.0 ** (2 - (1 << (eb - 1)) - fb)  # smallest subnormal
    ties = (np.arange(1, 200) + 0.5) * unit  # exact subnormal midpoints
    y = np.concatenate([y, ties, -ties, [0.0, -0.0, np.inf, -np.inf, np.nan, 1e300]])
    got, want = spec.round_f64(y, fmt), round_to_format(y, _SF[fmt])
    nan = np.isnan(y)
    assert np.array_equal(got[~nan], want[~nan]) and spec.is_nan(got[nan], fmt).all()


@pytest.mark.parametrize("fmt", ["binary16", "bfloat16"])
def test_theorem_and_every_sqrt_operand(fmt):
    assert spec.theorem_holds(fmt) and not spec.theorem_holds(fmt, 2 * (spec.FORMATS[fmt][1] + 1) + 1)
    a = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    assert len(ht.reference_mismatches("sqrt", fmt, a, None)) == 0


@pytest.mark.parametrize("fmt", ["binary16", "bfloat16"])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_reference_equals_softfloat_on_edge_pairs_and_a_dense_sample(op, fmt):
    e = ht.edge_values(fmt)
    rng = np.random.default_rng(11)
    a = np.concatenate([np.repeat(e, len(e)), rng.integers(0, 1 << 16, 50_000).astype(np.uint16)])
    b = np.concatenate([np.tile(e, len(e)), rng.integers(0, 1 << 16, 50_000).astype(np.uint16)])
    assert len(ht.reference_mismatches(op, fmt, a, b)) == 0


def test_contract_host_items_pass_and_device_items_need_cuda():
    items = check_items(CONTRACT, ["HP-REF-binary16", "HP-REF-bfloat16", "HP-DIV-binary16"])
    assert items["HP-REF-binary16"]["status"] == items["HP-REF-bfloat16"]["status"] == "passed"
    assert items["HP-DIV-binary16"]["status"] == "skipped" and "runs on cuda" in items["HP-DIV-binary16"]["reason"]


def test_planted_truncating_reference_is_violated(monkeypatch):
    real = spec.round_f64

    def truncating(y, fmt):  # round toward zero: a plausible wrong reference
        r = real(y, fmt)
        back = spec.to_f64(r, fmt)
        with np.errstate(invalid="ignore"):
            over = np.isfinite(back) & (np.abs(back) > np.abs(np.asarray(y)))
        return np.where(over, r - np.uint16(1), r).astype(np.uint16)

    monkeypatch.setattr(spec, "round_f64", truncating)
    item = check_items(CONTRACT, ["HP-REF-binary16"])["HP-REF-binary16"]
    assert item["status"] == "violated" and item["counterexample"]["a"].startswith("0x")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("fmt", ["binary16", "bfloat16"])
@pytest.mark.parametrize("op", ["add", "mul", "div", "sqrt"])
def test_cuda_sweep_agrees_with_the_host_reference_on_a_range(op, fmt):
    from native import halfprec as native

    lo = 0x3C000000 if op != "sqrt" else 0
    hi = lo + (1 << 20) if op != "sqrt" else 1 << 16
    r = native.sweep_op(op, fmt, lo=lo, hi=hi)
    k = np.arange(lo, hi, dtype=np.uint64)
    a = (k & 0xFFFF if op == "sqrt" else (k >> 16) & 0xFFFF).astype(np.uint16)
    b = None if op == "sqrt" else (k & 0xFFFF).astype(np.uint16)
    host = spec.reference(op, a, b, fmt)
    assert r["elements"] == hi - lo
    # the device reference is the host's algorithm: any mismatch listed must be a device-result difference
    for m in r["first_mismatches"]:
        i = int(m["a"], 16) if b is None else np.flatnonzero((a == int(m["a"], 16)) & (b == int(m["b"], 16)))[0]
        assert int(m["reference"], 16) == int(host[i])
    print(f"\n{op} {fmt}: {r['mismatches']} mismatches of {r['elements']}, kernel {r['kernel_ms']} ms")
