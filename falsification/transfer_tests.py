"""Falsification tests of host<->device float transfer (contracts/transfer-float32-v1.yaml).

Registered names and their ``params`` (``variant`` selects a planted-bug build; the project's tests only):

* ``transfer.h2d_rounding`` {format: binary32|binary16|bfloat16} -- float64 host values uploaded to the
  run's device and downloaded again equal :func:`spec.transfer.convert_reference` (softfloat, round to
  nearest even) bit for bit; NaN inputs must give a NaN (payload agreement is counted as evidence).
  Inputs: a fixed edge set (overflow threshold, subnormal results, ties, specials), a bulk sample of
  target-precision values with chosen tails, raw bit patterns, then a Hypothesis search that shrinks a
  disagreement to one simplest input.
* ``transfer.d2h_bits`` {formats} -- every bit pattern stored on the device comes back unchanged
  (all 2^16 patterns of binary16/bfloat16; specials, NaN payloads, -0, subnormals and random patterns of
  binary32/binary64).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from falsification import engine
from falsification.agreement import Expected
from falsification.engine import Check, Elements
from falsification.registry import FalsifyContext, guarded, register_test
from native import transfer as native
from obligations.core.device import array_module
from obligations.core.plans import regime_of
from obligations.core.results import Outcome
from spec.transfer import TargetFormat, convert_reference, get_target, is_nan_bits, overflow_threshold_bits

__all__ = ["edge_inputs", "bulk_inputs", "f64_bits", "h2d_disagreements", "D2H_FORMATS", "d2h_patterns"]

# float64 values a minimised input is tried at first: zeros, one, the smallest subnormal, Inf, NaN, 2.
_F64_COMMON = (0, 1 << 63, 0x3FF0000000000000, 1, 0x7FF0000000000000, 0x7FF8000000000000, 0x4000000000000000)


def _compose(sign: int, exp: int, man: int, tail: int, t: TargetFormat) -> int:
    """float64 bits of sign * 2^exp * (1.man) followed by ``tail`` below the target's last place."""
    drop = 52 - t.man_bits
    return (sign << 63) | ((exp + 1023) << 52) | (man << drop) | (tail & ((1 << drop) - 1))


def _tails(t: TargetFormat) -> tuple[int, ...]:
    half = 1 << (52 - t.man_bits - 1)
    return (0, 1, half - 1, half, half + 1, 2 * half - 1)


def edge_inputs(target: str) -> np.ndarray:
    """float64 bit patterns at every rounding and range boundary of ``target``."""
    t = get_target(target)
    thr = overflow_threshold_bits(target)
    emin = 1 - t.bias
    out = [
        0,
        1 << 63,
        0x7FF0000000000000,
        0xFFF0000000000000,
        0x7FF8000000000000,
        0xFFF8000000000000,
        0x7FF0000000000001,
        0x7FF8000000012345,
        0xFFF4000000000ABC,
        0x0000000000000001,
        0x7FEFFFFFFFFFFFFF,
        thr,
        thr - 1,
        thr + 1,
        thr | (1 << 63),
        (t.bias + 1 + 1023) << 52,
        0x3FF0000000000000,
    ]
    for sign in (0, 1):
        for tail in _tails(t):
            out += [
                _compose(sign, 0, 0, tail, t),
                _compose(sign, 0, 1, tail, t),
                _compose(sign, t.bias, (1 << t.man_bits) - 1, tail, t),
                _compose(sign, emin, 0, tail, t),
            ]
            # Subnormal results: 2^(emin - k) for k = 1 .. man_bits + 2 with the tails at the subnormal place.
            for k in range(1, t.man_bits + 3):
                out.append(_compose(sign, emin - k, 0, tail, t))
                out.append(_compose(sign, emin - k, (1 << t.man_bits) - 1, tail, t))
    return np.array(sorted(set(out)), dtype=np.uint64)


def bulk_inputs(target: str, n: int, seed: int) -> np.ndarray:
    """n target-precision values with boundary tails, across the target's range and just beyond, plus n/4 raw."""
    t = get_target(target)
    g = np.random.default_rng(seed)
    exp = g.integers(1 - t.bias - t.man_bits - 3, t.bias + 2, n)
    man = g.integers(0, 1 << t.man_bits, n, dtype=np.uint64)
    drop = 52 - t.man_bits
    tails = np.array(_tails(t), dtype=np.uint64)
    tail = np.where(
        g.integers(0, 2, n) == 0, tails[g.integers(0, tails.size, n)], g.integers(0, 1 << drop, n, dtype=np.uint64)
    )
    sign = g.integers(0, 2, n).astype(np.uint64)
    x = (sign << np.uint64(63)) | ((exp + 1023).astype(np.uint64) << np.uint64(52)) | (man << np.uint64(drop)) | tail
    raw = g.integers(0, 2**64, n // 4, dtype=np.uint64)
    return np.concatenate([x, raw])


def f64_bits(target: str) -> st.SearchStrategy[int]:
    """Hypothesis strategy of float64 bit patterns: edges, target-precision values with tails, raw bits."""
    t = get_target(target)
    composed = st.builds(
        lambda s, e, m, tl: _compose(s, e, m, tl, t),
        st.integers(0, 1),
        st.integers(1 - t.bias - t.man_bits - 3, t.bias + 1),
        st.integers(0, (1 << t.man_bits) - 1),
        st.one_of(st.sampled_from(_tails(t)), st.integers(0, (1 << (52 - t.man_bits)) - 1)),
    )
    return st.one_of(composed, st.sampled_from([int(v) for v in edge_inputs(target)]), st.integers(0, 2**64 - 1))


def h2d_disagreements(x_bits: np.ndarray, target: str, device: str, variant: str | None) -> dict[str, Any]:
    """Upload then download ``x_bits`` (float64 patterns) and compare with softfloat; indices of failures."""
    ref = convert_reference(x_bits, target)
    dev = native.upload(x_bits.view(np.float64), target, device=device, variant=variant)
    got = native.download(dev)
    ref_nan = is_nan_bits(ref, target)
    bad = np.where(ref_nan, ~is_nan_bits(got, target), got != ref)
    return {
        "ref": ref,
        "got": got,
        "bad": np.flatnonzero(bad),
        "nan_inputs": int(ref_nan.sum()),
        "nan_payload_equal": int((ref_nan & (got == ref)).sum()),
    }


def _element(x: int, target: str, got: int, ref: int) -> dict[str, Any]:
    width = get_target(target).width // 4
    return {
        "input_bits": f"0x{x:016X}",
        "input": repr(float(np.array([x], np.uint64).view(np.float64)[0])),
        "native": f"0x{got:0{width}X}",
        "reference": f"0x{ref:0{width}X}",
    }


def _stock_astype_probe(x: np.ndarray, target: str) -> dict[str, Any] | None:
    """CUDA only, evidence: does CuPy's stock astype (compiled with -ftz=true) agree with softfloat?"""
    if target not in ("binary32", "binary16"):
        return None
    import cupy

    dt = cupy.float32 if target == "binary32" else cupy.float16
    ref = convert_reference(x, target)
    with np.errstate(all="ignore"):
        got = cupy.asarray(x.view(np.float64)).astype(dt).get().view(get_target(target).dtype)
    bad = np.flatnonzero((got != ref) & ~is_nan_bits(ref, target))
    ex = _element(int(x[bad[0]]), target, int(got[bad[0]]), int(ref[bad[0]])) if bad.size else None
    return {"route": "cupy-stock astype", "non_nan_disagreements": int(bad.size), "example": ex}


def _case_json(case: tuple[int, ...]) -> dict[str, Any]:
    if len(case) <= 32:
        return {"inputs": [f"0x{v:016X}" for v in case]}
    return {"inputs": len(case), "kind": "edge inputs and the bulk sample"}


def _encode(case: tuple[int, ...]) -> tuple[int, ...]:
    if len(case) > 32:
        raise ValueError("the bulk case replays by its seed")
    return case


@register_test("transfer.h2d_rounding")
@guarded()
def h2d_rounding(ctx: FalsifyContext) -> Outcome:
    """float64 -> target on the device equals softfloat round-to-nearest-even (NaN -> a NaN)."""
    target = str(ctx.params["format"])
    t = get_target(target)
    variant = ctx.params.get("variant")
    b = ctx.budget
    edges = edge_inputs(target)
    x = np.concatenate([edges, bulk_inputs(target, b.bulk, ctx.seed)])
    width = t.width // 4

    # A regime witness's inputs (an array, kept alive here) -> its launch knobs, keyed by the array's id: the
    # engine hands the case object to regime_of and, through inputs (np.asarray of a uint64 array is the array
    # itself), to the native call; the bulk and witness cases stay arrays, never tuples of millions of ints.
    launches: dict[int, tuple[int, int]] = {}
    alive: list[np.ndarray] = []
    default = (native.DEFAULT_BLOCK, native.DEFAULT_MAX_GRID)
    bulk_stats: dict[str, int] = {}

    def native_bits(xs: np.ndarray) -> np.ndarray:
        block, max_grid = launches.get(id(xs), default)
        return native.download(
            native.upload(
                xs.view(np.float64), target, device=ctx.device, variant=variant, block=block, max_grid=max_grid
            )
        )

    def from_witness(w: Any) -> np.ndarray:
        case = np.resize(x, int(w["n_elems"])).astype(np.uint64)
        alive.append(case)
        launches[id(case)] = (int(w["block"]), int(w["max_grid"]))
        return case

    def regimes(case: Any) -> list[str]:
        block, max_grid = launches.get(id(case), default)
        return regime_of(
            native.transfer_plan,
            {"n_elems": len(case), "src_bytes": 8, "dst_bytes": t.width // 8, "block": block, "max_grid": max_grid},
        )

    def observe_bulk(j: engine.Judgement) -> None:
        """NaN statistics of the bulk case, from its judged outputs (no second upload of the bulk)."""
        if j.inputs is x and not bulk_stats:
            ref, got = np.asarray(j.expected[0].bits), np.asarray(j.native[0])
            ref_nan = is_nan_bits(ref, target)
            bulk_stats.update(nan_inputs=int(ref_nan.sum()), nan_payload_equal=int((ref_nan & (got == ref)).sum()))

    def describe_element(xs: np.ndarray, i: int) -> dict[str, Any]:
        v = int(xs[i])
        return {"input_bits": f"0x{v:016X}", "input": repr(float(np.array([v], np.uint64).view(np.float64)[0]))}

    check = Check(
        name=f"float64 -> {target}",
        inputs=lambda case: np.asarray(case, dtype=np.uint64),
        native=native_bits,
        reference=lambda xs: Expected(bits=convert_reference(xs, target)),
        agreement=engine.item_agreement(ctx, "bitwise", nan_policy="class", fmt=target),
        cases=st.lists(f64_bits(target), min_size=1, max_size=b.max_size).map(tuple),
        explicit=(x,),
        observe=observe_bulk,
        count=lambda j: j.n,
        encode=_encode,
        from_witness=from_witness,
        regime_of=regimes,
        decode=lambda rp: tuple(rp.values),
        describe=_case_json,
        elements=Elements(
            operands=lambda xs, i: (int(xs[i]),),
            batch=lambda tuples, case: tuple(v for (v,) in tuples),
            describe=describe_element,
            common=_F64_COMMON,
            width=64,
        ),
        build={
            "format": target,
            "variant": variant or "default",
            "digits": width,
            "reference": "spec.softfloat.convert (binary64 -> target, rne, env ieee)",
            "edge_inputs": int(edges.size),
            "bulk_inputs": int(x.size - edges.size),
        },
    )

    def extra() -> dict[str, Any]:
        if not bulk_stats:  # the bulk case did not run to its judgement (a failure before it): measure it here
            res = h2d_disagreements(x, target, ctx.device, variant)
            bulk_stats.update(nan_inputs=res["nan_inputs"], nan_payload_equal=res["nan_payload_equal"])
        ev = dict(bulk_stats)
        if ctx.device == "cuda":
            ev["compile"] = native.route_evidence()
            ev["stock_cupy_astype"] = _stock_astype_probe(x, target)
        return ev

    return engine.run(ctx, check, extra)


# -- device -> host ------------------------------------------------------------------------------------

# format -> (storage uint dtype, float dtype on the device or None where the array library has none)
D2H_FORMATS: dict[str, tuple[str, str | None]] = {
    "binary32": ("uint32", "float32"),
    "binary16": ("uint16", "float16"),
    "bfloat16": ("uint16", None),
    "binary64": ("uint64", "float64"),
}


def d2h_patterns(fmt: str, seed: int, n_random: int) -> np.ndarray:
    """Bit patterns to round-trip: every pattern for 16-bit formats; specials, NaN payloads and random otherwise."""
    udt, _ = D2H_FORMATS[fmt]
    if udt == "uint16":
        return np.arange(1 << 16, dtype=np.uint64).astype(np.uint16)
    bits = 32 if udt == "uint32" else 64
    man = 23 if bits == 32 else 52
    exp_all = ((1 << (bits - 1 - man)) - 1) << man
    sign = 1 << (bits - 1)
    specials = [0, sign, exp_all, sign | exp_all, 1, sign | 1, (1 << man) - 1, exp_all - 1]
    for k in range(man):  # every single-bit NaN payload, quiet and signaling, both signs
        specials += [exp_all | (1 << k), sign | exp_all | (1 << k), exp_all | (1 << k) | (1 << (man - 1))]
    g = np.random.default_rng(seed)
    rnd = g.integers(0, 2**bits, n_random, dtype=np.uint64)
    return np.concatenate([np.array(specials, dtype=np.uint64), rnd]).astype(udt)


@register_test("transfer.d2h_bits")
@guarded()
def d2h_bits(ctx: FalsifyContext) -> Outcome:
    """Arrays stored on the device come back to the host with every bit unchanged (NaN payloads, sNaN, -0)."""
    formats = tuple(ctx.params.get("formats", list(D2H_FORMATS)))
    variant = ctx.params.get("variant")
    xp = array_module(ctx.device)
    n_random = ctx.budget.bulk
    per: dict[str, Any] = {}

    def native_bits(a: tuple[str, np.ndarray]) -> np.ndarray:
        fmt, pat = a
        udt, fdt = D2H_FORMATS[fmt]
        dev = xp.asarray(pat)  # stored by a byte copy, then read back as the float type the device holds
        dev = dev.view(getattr(xp, fdt)) if fdt else dev
        got = native.download(dev, variant=variant).view(udt)
        per[fmt] = {"patterns": int(pat.size), "changed": int((got != pat).sum()), "dtype_on_device": fdt or udt}
        return got

    check = Check(
        name="device -> host bits",
        inputs=lambda fmt: (fmt, d2h_patterns(fmt, ctx.seed, n_random)),
        native=native_bits,
        reference=lambda a: Expected(bits=a[1]),
        agreement=engine.item_agreement(ctx, "bitwise"),
        explicit=formats,
        count=lambda j: j.n,
        encode=lambda fmt: (list(D2H_FORMATS).index(fmt),),
        decode=lambda rp: list(D2H_FORMATS)[rp.values[0]],
        describe=lambda fmt: {"format": fmt},
        build={"variant": variant or "default"},
    )
    return engine.run(ctx, check, lambda: {"formats": dict(per)})
