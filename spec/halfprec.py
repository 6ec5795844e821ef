"""Reference semantics of binary16 and bfloat16 arithmetic on the device: float64 evaluation, one rounding.

The definition is the softfloat (:mod:`spec.softfloat`, round to nearest even, subnormals kept). On the
device the reference is computed *exactly by construction*: decode both operands to binary64 (exact), apply
the binary64 operation (one IEEE rounding to p' = 53 bits), and round once to the format (p = 11 for
binary16, 8 for bfloat16) by integer operations. By the double-rounding theorem (Figueroa 1995: for
+, -, x, / and sqrt of p-bit operands, rounding to p' >= 2p + 2 bits and then to p bits equals rounding once
to p bits), ``RN_p(RN_53(a op b)) == RN_p(a op b)``: 53 >= 2 * 11 + 2 = 24 and 53 >= 2 * 8 + 2 = 18. The
binary64 intermediate is always normal here (binary16/bfloat16 values and their sums, products, quotients
and roots lie far inside binary64's exponent range), so subnormal results of the target format are rounded
once from a 53-bit value too. :func:`reference` is the NumPy form; the test suite checks it against the
softfloat on edge classes and a dense sample.

NaN results are compared by class (CUDA returns its canonical NaN, the softfloat its own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "FORMATS",
    "OPS",
    "UNARY",
    "to_f64",
    "round_f64",
    "reference",
    "softfloat_reference",
    "is_nan",
    "theorem_holds",
]

# name -> (exponent bits, fraction bits)
FORMATS: dict[str, tuple[int, int]] = {"binary16": (5, 10), "bfloat16": (8, 7)}
_OPS: dict[str, Callable[..., Any]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "sqrt": np.sqrt,
}
OPS: tuple[str, ...] = tuple(_OPS)
UNARY: frozenset[str] = frozenset({"sqrt"})


def theorem_holds(fmt: str, intermediate_bits: int = 53) -> bool:
    """The double-rounding condition p' >= 2p + 2 for the format's precision p."""
    return intermediate_bits >= 2 * (FORMATS[fmt][1] + 1) + 2


def to_f64(bits: np.ndarray, fmt: str) -> np.ndarray:
    """Exact binary64 values of ``fmt`` bit patterns (NaN for NaN patterns)."""
    eb, fb = FORMATS[fmt]
    b = np.asarray(bits).astype(np.int64)
    bias = (1 << (eb - 1)) - 1
    e = (b >> fb) & ((1 << eb) - 1)
    f = b & ((1 << fb) - 1)
    mag = np.where(
        e == 0,
        np.ldexp(f.astype(np.float64), 1 - bias - fb),
        np.ldexp((f + (1 << fb)).astype(np.float64), (e - bias - fb).astype(np.int64)),
    )
    mag = np.where(e == (1 << eb) - 1, np.where(f == 0, np.inf, np.nan), mag)
    return np.where((b >> (eb + fb)) & 1 == 1, -mag, mag)


def round_f64(y: np.ndarray, fmt: str) -> np.ndarray:
    """Bits of RN_fmt(y) for binary64 ``y`` by integer operations on its bits (the device's algorithm).

    Subnormals kept, overflow to infinity, NaN to the quiet pattern with the top fraction bit.
    """
    eb, fb = FORMATS[fmt]
    bias = (1 << (eb - 1)) - 1
    emin = 1 - bias
    d = np.asarray(y, dtype=np.float64).view(np.uint64)
    s = ((d >> np.uint64(63)) & np.uint64(1)).astype(np.uint64) << np.uint64(eb + fb)
    e = ((d >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    m = d & np.uint64((1 << 52) - 1)
    big_e = e - 1023
    sig = m | np.uint64(1 << 52)
    shift = np.where(big_e >= emin, 52 - fb, 52 - fb + (emin - big_e)).astype(np.int64)
    sh = np.clip(shift, 1, 63).astype(np.uint64)
    kept = sig >> sh
    rem = sig & ((np.uint64(1) << sh) - np.uint64(1))
    half = np.uint64(1) << (sh - np.uint64(1))
    kept = kept + ((rem > half) | ((rem == half) & ((kept & np.uint64(1)) == np.uint64(1)))).astype(np.uint64)
    normal = big_e >= emin
    biased = np.clip(big_e + bias, 0, (1 << eb) - 1).astype(np.uint64)
    out = np.where(normal, (biased << np.uint64(fb)) + kept - np.uint64(1 << fb), kept)
    out = np.where((shift > 63) | (e == 0), np.uint64(0), out)
    inf = np.uint64(((1 << eb) - 1) << fb)
    out = np.where((big_e > bias) & (e != 0x7FF), inf, out)
    out = np.minimum(out, inf)  # a carry out of the largest binade is infinity
    out = np.where(e == 0x7FF, np.where(m == 0, inf, inf | np.uint64(1 << (fb - 1))), out)
    return (out | s).astype(np.uint16)


def reference(op: str, a: np.ndarray, b: np.ndarray | None, fmt: str) -> np.ndarray:
    """The device reference: binary64 ``op`` on the exact operands, rounded once to ``fmt``."""
    with np.errstate(all="ignore"):
        y = _OPS[op](to_f64(a, fmt)) if op in UNARY else _OPS[op](to_f64(a, fmt), to_f64(b, fmt))
    return round_f64(y, fmt)


def softfloat_reference(op: str, a: np.ndarray, b: np.ndarray | None, fmt: str) -> np.ndarray:
    """The definition: the integer softfloat in ``fmt`` (env ieee: round to nearest even, subnormals kept)."""
    from spec import softfloat as sf

    f = {"binary16": sf.BINARY16, "bfloat16": sf.BFLOAT16}[fmt]
    a = np.asarray(a, dtype=np.uint16)
    if op in UNARY:
        return np.asarray(getattr(sf, op)(a, fmt=f, env="ieee"), dtype=np.uint16)
    return np.asarray(getattr(sf, op)(a, np.asarray(b, dtype=np.uint16), fmt=f, env="ieee"), dtype=np.uint16)


def is_nan(bits: np.ndarray, fmt: str) -> np.ndarray:
    """NaN patterns of ``fmt``."""
    eb, fb = FORMATS[fmt]
    b = np.asarray(bits).astype(np.int64) & ((1 << (eb + fb)) - 1)
    return b > (((1 << eb) - 1) << fb)
