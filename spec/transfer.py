"""Reference semantics of host<->device float transfer: conversions by the integer softfloat, bit identity back.

Host -> device: a float64 host value becomes the target format (binary32, binary16, bfloat16) rounded to
nearest, ties to even, with overflow to infinity and subnormal results kept (IEEE 754-2019 convertFormat,
:func:`spec.softfloat.convert`). For NaN inputs the claim is only "a NaN": NumPy keeps the payload (and
keeps a binary16 NaN signaling), CUDA writes a canonical NaN; payload behaviour is recorded as evidence.
Device -> host: every bit pattern of the stored format comes back unchanged (NaN payloads, signaling
NaNs, -0, subnormals).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spec import softfloat as sf

__all__ = ["TargetFormat", "TARGETS", "get_target", "convert_reference", "is_nan_bits", "overflow_threshold_bits"]


@dataclass(frozen=True)
class TargetFormat:
    """A device storage format: its softfloat format, storage dtype and field widths."""

    name: str
    fmt: sf.Format
    dtype: type
    exp_bits: int
    man_bits: int

    @property
    def bias(self) -> int:
        """Exponent bias."""
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def width(self) -> int:
        """Storage width in bits."""
        return 1 + self.exp_bits + self.man_bits


TARGETS: dict[str, TargetFormat] = {
    t.name: t
    for t in (
        TargetFormat("binary32", sf.BINARY32, np.uint32, 8, 23),
        TargetFormat("binary16", sf.BINARY16, np.uint16, 5, 10),
        TargetFormat("bfloat16", sf.BFLOAT16, np.uint16, 8, 7),
    )
}


def get_target(name: str) -> TargetFormat:
    """The target format ``name``; KeyError lists the known ones."""
    try:
        return TARGETS[name]
    except KeyError:
        raise KeyError(f"unknown transfer format {name!r}; known: {sorted(TARGETS)}") from None


def convert_reference(x_bits: np.ndarray, target: str, rounding: str = sf.RNE) -> np.ndarray:
    """Target bits of float64 bit patterns converted by softfloat (IEEE environment: payload top bits kept)."""
    t = get_target(target)
    return np.asarray(
        sf.convert(np.asarray(x_bits, dtype=np.uint64), sf.BINARY64, t.fmt, rounding=rounding), dtype=t.dtype
    )


def is_nan_bits(bits: np.ndarray, target: str) -> np.ndarray:
    """True where the target-format bit pattern is a NaN (exponent all ones, significand nonzero)."""
    t = get_target(target)
    b = np.asarray(bits).astype(np.uint64)
    exp = (b >> np.uint64(t.man_bits)) & np.uint64((1 << t.exp_bits) - 1)
    man = b & np.uint64((1 << t.man_bits) - 1)
    return (exp == np.uint64((1 << t.exp_bits) - 1)) & (man != 0)


def overflow_threshold_bits(target: str) -> int:
    """float64 bits of (2 - 2^-(p)) * 2^emax: the midpoint above the largest finite value (rounds to Inf, RNE)."""
    t = get_target(target)
    emax = t.bias
    # Significand 1.11...1 (man_bits ones) followed by a single 1: the tie between max finite and 2^(emax+1).
    sig = ((1 << (t.man_bits + 1)) - 1) << (52 - t.man_bits - 1)  # bits below the hidden one
    return ((emax + 1023) << 52) | (sig & ((1 << 52) - 1))
