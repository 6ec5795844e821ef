"""Binary interchange formats, rounding modes and exception flags for the softfloat reference."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

__all__ = [
    "Format",
    "BINARY16",
    "BFLOAT16",
    "BINARY32",
    "BINARY64",
    "RNE",
    "RNA",
    "RTZ",
    "RUP",
    "RDN",
    "RTO",
    "ROUNDING_MODES",
    "Flags",
    "check_rounding",
]

# Rounding modes are plain strings so callers may pass either the constant or its value.
RNE = "rne"  # round to nearest, ties to even
RNA = "rna"  # round to nearest, ties away from zero
RTZ = "rtz"  # toward zero
RUP = "rup"  # toward +infinity
RDN = "rdn"  # toward -infinity
RTO = "rto"  # round to odd (truncate, then set the last bit if inexact)
ROUNDING_MODES = (RNE, RNA, RTZ, RUP, RDN, RTO)


def check_rounding(rounding: str) -> str:
    """Return the canonical rounding-mode string or raise ValueError naming `rounding`."""
    r = str(rounding).lower() if isinstance(rounding, str) else rounding
    if r not in ROUNDING_MODES:
        raise ValueError(f"rounding: unknown rounding mode {rounding!r}; expected one of {ROUNDING_MODES}")
    return r


class Flags(enum.IntFlag):
    """IEEE 754 exception flags; the per-element flags array is uint8 holding an OR of these bits."""

    INEXACT = 1
    UNDERFLOW = 2
    OVERFLOW = 4
    DIVBYZERO = 8
    INVALID = 16


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: 1 sign bit, `exp_bits` exponent bits, `frac_bits` fraction bits."""

    exp_bits: int
    frac_bits: int
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not (2 <= self.exp_bits <= 11 and 1 <= self.frac_bits <= 52):
            raise ValueError(f"Format: unsupported widths exp_bits={self.exp_bits} frac_bits={self.frac_bits}")
        if not self.name:
            object.__setattr__(self, "name", f"e{self.exp_bits}m{self.frac_bits}")

    # Derived constants are computed on first use and kept (the softfloat reads them several times per call); they
    # are not fields, so the dataclass stays trivially hashable and comparable.
    @cached_property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.frac_bits

    @cached_property
    def precision(self) -> int:
        return self.frac_bits + 1

    @cached_property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @cached_property
    def emax(self) -> int:
        return self.bias

    @cached_property
    def emin(self) -> int:
        return 1 - self.bias

    @cached_property
    def dtype(self) -> np.dtype:
        for b, dt in ((8, np.uint8), (16, np.uint16), (32, np.uint32), (64, np.uint64)):
            if self.bits <= b:
                return np.dtype(dt)
        raise AssertionError("unreachable")

    @cached_property
    def sign_mask(self) -> int:
        return 1 << (self.bits - 1)

    @cached_property
    def abs_mask(self) -> int:
        return self.sign_mask - 1

    @cached_property
    def exp_field_max(self) -> int:
        return (1 << self.exp_bits) - 1

    @cached_property
    def frac_mask(self) -> int:
        return (1 << self.frac_bits) - 1

    @cached_property
    def inf_bits(self) -> int:
        return self.exp_field_max << self.frac_bits

    @cached_property
    def quiet_bit(self) -> int:
        return 1 << (self.frac_bits - 1)

    @cached_property
    def max_finite_bits(self) -> int:
        return self.inf_bits - 1

    def __repr__(self) -> str:
        return f"Format({self.exp_bits}, {self.frac_bits}, name={self.name!r})"


BINARY16 = Format(5, 10, "binary16")
BFLOAT16 = Format(8, 7, "bfloat16")
BINARY32 = Format(8, 23, "binary32")
BINARY64 = Format(11, 52, "binary64")
