"""Falsification tests of binary16 / bfloat16 device arithmetic (contracts/halfprec-v1.yaml).

Registered names and their ``params``:

* ``halfprec.exhaustive`` {op, fmt} (CUDA only) -- every operand pair (add, sub, mul, div: 2^32) or operand
  (sqrt: 2^16) of the device intrinsic (``__hadd __hsub __hmul __hdiv hsqrt``, round to nearest even)
  against the exact reference of :mod:`spec.halfprec` computed on the device (binary64, one rounding);
  bitwise with NaNs compared by class. Skipped with the reason where the CUDA half headers are missing.
* ``halfprec.reference`` {fmt, sample} (CPU work on any device) -- the device reference's algorithm (NumPy
  form) against the softfloat, the definition: all 2^16 operands of sqrt, every pair of edge-class values
  and a seeded sample of pairs for add, sub, mul, div; plus the double-rounding condition p' >= 2p + 2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from falsification import engine
from falsification.registry import FalsifyContext, register_test
from obligations.core.results import Outcome, skipped
from spec import halfprec as spec

__all__ = ["edge_values", "reference_mismatches"]


def edge_values(fmt: str) -> np.ndarray:
    """Edge classes of ``fmt``: zeros, subnormals (smallest, largest), smallest normal, 1 and its neighbours,
    2, the largest finite, infinity, quiet and signalling NaNs, both signs."""
    eb, fb = spec.FORMATS[fmt]
    one = ((1 << (eb - 1)) - 1) << fb
    inf = ((1 << eb) - 1) << fb
    v = [0, 1, 2, (1 << fb) - 1, 1 << fb, (1 << fb) + 1, one - 1, one, one + 1, one + (1 << fb), inf - 1, inf]
    v += [inf | (1 << (fb - 1)), inf | 1, one + 3, one - (3 << fb)]
    b = np.array(v, dtype=np.uint16)
    return np.concatenate([b, b | np.uint16(1 << (eb + fb))])


def reference_mismatches(op: str, fmt: str, a: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """Indices where the device reference's algorithm and the softfloat disagree (NaNs by class)."""
    r = spec.reference(op, a, b, fmt)
    s = spec.softfloat_reference(op, a, b, fmt)
    same = (spec.is_nan(r, fmt) & spec.is_nan(s, fmt)) | (r == s)
    return np.flatnonzero(~same)


@register_test("halfprec.reference")
def halfprec_reference(ctx: FalsifyContext) -> Outcome:
    """The device reference (binary64 operation, one rounding) equals the softfloat on edges and a dense sample."""
    p = ctx.params
    fmt = p["fmt"]
    n = int(p.get("sample", 200_000))
    rng = np.random.default_rng(ctx.seed)
    e = edge_values(fmt)
    cases = 0
    ev: dict[str, Any] = {"fmt": fmt, "theorem": f"53 >= 2 * {spec.FORMATS[fmt][1] + 1} + 2"}
    if not spec.theorem_holds(fmt):
        return engine.outcome_violated(ctx, {"fmt": fmt}, "p' >= 2p + 2 fails: the one-rounding reference is not exact")
    for op in spec.OPS:
        if op in spec.UNARY:
            a, b = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16), None
        else:
            a = np.concatenate([np.repeat(e, len(e)), rng.integers(0, 1 << 16, n).astype(np.uint16)])
            b = np.concatenate([np.tile(e, len(e)), rng.integers(0, 1 << 16, n).astype(np.uint16)])
        bad = reference_mismatches(op, fmt, a, b)
        cases += len(a)
        if len(bad):
            i = int(bad[0])
            ai, bi = a[i : i + 1], None if b is None else b[i : i + 1]
            ce = {
                "op": op,
                "a": f"0x{int(a[i]):04X}",
                **({} if b is None else {"b": f"0x{int(b[i]):04X}"}),
                "reference": f"0x{int(spec.reference(op, ai, bi, fmt)[0]):04X}",
                "softfloat": f"0x{int(spec.softfloat_reference(op, ai, bi, fmt)[0]):04X}",
            }
            return engine.outcome_violated(ctx, ce, f"{len(bad)} {op} cases disagree", None, cases=cases, **ev)
    return engine.outcome_passed(ctx, cases, None, **ev)


@register_test("halfprec.exhaustive", devices=("cuda",), device_pure=True)
def halfprec_exhaustive(ctx: FalsifyContext) -> Outcome:
    """Every operand pair (or operand) of the device's half/bfloat16 op against the exact reference, bitwise."""
    from native import halfprec as native

    p = ctx.params
    try:
        r = native.sweep_op(p["op"], p["fmt"], hi=p.get("hi"))
    except native.HeadersUnavailable as exc:
        return skipped(str(exc), **engine.evidence(ctx))
    ev = {k: v for k, v in r.items() if k != "first_mismatches"}
    ev["reference"] = "binary64 operation on the exact operands, one rounding (exact: double-rounding theorem)"
    if r["mismatches"]:
        return engine.outcome_violated(
            ctx,
            {"first": r["first_mismatches"][:8]},
            f"{r['mismatches']} of {r['elements']} cases differ from the correctly rounded result",
            None,
            cases=r["elements"],
            **ev,
        )
    return engine.outcome_passed(ctx, r["elements"], None, **ev)
