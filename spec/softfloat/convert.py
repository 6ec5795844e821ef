"""Conversions: between float formats, float <-> integer, and bit-pattern views of host floats."""

from __future__ import annotations

import numpy as np

from . import core
from .core import I32, W64, patch, round_pack, unpack
from .env import FloatEnv, default_nan, resolve_env
from .formats import BINARY32, RNE, RTZ, Format, check_rounding

__all__ = [
    "convert",
    "to_int",
    "from_int",
    "f32_to_bits",
    "bits_to_f32",
    "to_bits",
    "from_bits",
    "INT_DTYPES",
]

INT_DTYPES = ("int32", "int64", "uint32", "uint64")
_HOST_FLOAT = {np.dtype(np.float16): 16, np.dtype(np.float32): 32, np.dtype(np.float64): 64}
_UINT = {16: np.uint16, 32: np.uint32, 64: np.uint64}


def f32_to_bits(x):
    """View a float32 array as its uint32 bit patterns (no value conversion); TypeError otherwise."""
    if getattr(x, "dtype", None) != np.float32:
        raise TypeError(f"x: expected a float32 array, got {getattr(x, 'dtype', type(x).__name__)}")
    return x.view(np.uint32)


def bits_to_f32(u):
    """View uint32 bit patterns as float32 (no value conversion); TypeError otherwise."""
    if getattr(u, "dtype", None) != np.uint32:
        raise TypeError(f"u: expected a uint32 array, got {getattr(u, 'dtype', type(u).__name__)}")
    return u.view(np.float32)


def to_bits(x):
    """View a float16/float32/float64 array as uint16/uint32/uint64 bit patterns; TypeError otherwise."""
    dt = getattr(x, "dtype", None)
    if dt not in _HOST_FLOAT:
        raise TypeError(f"x: expected a float16, float32 or float64 array, got {dt}")
    return x.view(_UINT[_HOST_FLOAT[dt]])


def from_bits(u, fmt: Format):
    """View bit patterns of binary16/32/64 as the host float dtype of the same width; TypeError otherwise."""
    want = {16: np.float16, 32: np.float32, 64: np.float64}
    if fmt.bits not in want or (fmt.bits == 16 and fmt.exp_bits != 5):
        raise TypeError(f"fmt: {fmt.name} has no host float dtype")
    core.check_bits(u, fmt, "u")
    return u.view(want[fmt.bits])


# ---------------------------------------------------------------------------------------------------
# float -> float


def _convert_chunk(xp, a, src: Format, dst: Format, rounding: str, env: FloatEnv, want_flags: bool):
    A = unpack(xp, src, a, W64, env.daz)
    res, fl = round_pack(xp, dst, W64, A.sign, A.e, A.sig, rounding, env, want_flags)

    def special(idx):
        x = a[idx].astype(np.uint64)
        u = np.uint64
        frac = x & u(src.frac_mask)
        sign = (x >> u(src.bits - 1)) << u(dst.bits - 1)
        # NaN payload keeps its most significant bits (shifted up or truncated), then is quieted.
        if dst.frac_bits >= src.frac_bits:
            pay = frac << u(dst.frac_bits - src.frac_bits)
        else:
            pay = frac >> u(src.frac_bits - dst.frac_bits)
        nan = frac != u(0)
        r = sign | u(dst.inf_bits) | xp.where(nan, pay | u(dst.quiet_bit), u(0))
        if env.nan_policy == "cuda":
            r = xp.where(nan, u(default_nan(dst, env)), r)
        f = None
        if want_flags:
            f = core.flags_from(xp, x.shape, invalid=core.is_snan_bits(src, a[idx]))
        return r.astype(dst.dtype), f

    return patch(xp, res, A.special, special, fl)


def convert(a, src_fmt: Format, dst_fmt: Format, *, rounding: str = RNE, env="ieee", flags: bool = False):
    """Convert bit patterns of src_fmt to dst_fmt, correctly rounded; NaN payloads keep their top bits."""
    rounding, env = check_rounding(rounding), resolve_env(env)
    for f, n in ((src_fmt, "src_fmt"), (dst_fmt, "dst_fmt")):
        if not isinstance(f, Format):
            raise TypeError(f"{n}: expected a Format, got {type(f).__name__}")
    a = core.check_bits(a, src_fmt, "a")
    return core.run_chunked(
        lambda xp, x: _convert_chunk(xp, x, src_fmt, dst_fmt, rounding, env, flags),
        [a],
        ["a"],
        dst_fmt.dtype,
        flags,
    )


# ---------------------------------------------------------------------------------------------------
# float -> integer


def _int_info(int_dtype: str):
    if str(int_dtype) not in INT_DTYPES:
        raise ValueError(f"int_dtype: expected one of {INT_DTYPES}, got {int_dtype!r}")
    dt = np.dtype(str(int_dtype))
    n = dt.itemsize * 8
    signed = dt.kind == "i"
    lo = -(1 << (n - 1)) if signed else 0
    hi = (1 << (n - 1)) - 1 if signed else (1 << n) - 1
    return dt, n, signed, lo, hi


def _as_int64(v: int) -> np.int64:
    """Two's-complement int64 holding the low 64 bits of v (uint64 max becomes -1)."""
    return np.int64(v - (1 << 64) if v >= (1 << 63) else v)


def _to_int_chunk(xp, a, fmt: Format, int_dtype: str, rounding: str, env: FloatEnv, want_flags: bool):
    dt, n, signed, lo, hi = _int_info(int_dtype)
    u = np.uint64
    A = unpack(xp, fmt, a, W64, env.daz)
    sig, e = A.sig, A.e
    frac_bits = xp.minimum(xp.maximum(-e, I32(0)), I32(61)).astype(u)
    # Two extra low bits keep the rounding shift >= 2 (see core._round_shift).
    rounded = core._round_shift(xp, W64, sig << u(2), frac_bits + u(2), A.sign, rounding)
    inexact = ((sig >> frac_bits) << frac_bits) != sig
    top = core.msb(xp, sig, W64) + e  # exponent of the leading bit
    big = (top >= I32(64)) & (sig != u(0))
    lsh = xp.minimum(xp.maximum(e, I32(0)), I32(63)).astype(u)
    mag = xp.where(e >= I32(0), xp.where(big, u(0), sig << lsh), rounded)
    neg = A.sign != u(0)
    if signed:
        ok = xp.where(neg, mag <= u(-lo), mag <= u(hi))
    else:
        ok = xp.where(neg, mag == u(0), mag <= u(hi))
    nan = core.is_nan_bits(fmt, a)
    ok = ok & ~big & ~A.special
    val = xp.where(neg, u(0) - mag, mag).view(np.int64)
    if env.convert_policy == "ieee":
        # x86 "integer indefinite": the most negative signed value, all ones for unsigned.
        bad = np.int64(lo) if signed else _as_int64(hi)
        val = xp.where(ok, val, bad)
    else:
        # CUDA cvt saturates: NaN -> 0, out of range -> nearest bound.
        sat = xp.where(neg, np.int64(lo), _as_int64(hi))
        val = xp.where(ok, val, xp.where(nan, np.int64(0), sat))
    out = val.view(np.uint64).astype(dt) if dt == np.uint64 else val.astype(dt)
    fl = None
    if want_flags:
        fl = core.flags_from(xp, a.shape, invalid=~ok, inexact=ok & inexact & (e < I32(0)))
    return out, fl


def to_int(
    a,
    *,
    fmt: Format = BINARY32,
    int_dtype: str = "int32",
    rounding: str = RTZ,
    env="ieee",
    flags: bool = False,
):
    """Convert to int32/int64/uint32/uint64 in `rounding`; out-of-range and NaN per env.convert_policy."""
    rounding, env = check_rounding(rounding), resolve_env(env)
    dt = _int_info(int_dtype)[0]
    a = core.check_bits(a, fmt, "a")
    return core.run_chunked(
        lambda xp, x: _to_int_chunk(xp, x, fmt, str(int_dtype), rounding, env, flags), [a], ["a"], dt, flags
    )


# ---------------------------------------------------------------------------------------------------
# integer -> float


def _from_int_chunk(xp, a, fmt: Format, rounding: str, env: FloatEnv, want_flags: bool):
    u = np.uint64
    if a.dtype.kind == "i":
        x = a.astype(np.int64)
        neg = x < np.int64(0)
        mag = x.view(u)
        mag = xp.where(neg, u(0) - mag, mag)
    else:
        mag = a.astype(u)
        neg = xp.zeros(a.shape, dtype=bool)
    sign = neg.astype(u)
    # The core takes significands below 2**62: pre-shift the largest magnitudes by two bits, jammed.
    big = mag >= u(1 << 62)
    mag = xp.where(big, (mag >> u(2)) | ((mag & u(3)) != u(0)).astype(u), mag)
    e = xp.where(big, I32(2), I32(0))
    return round_pack(xp, fmt, W64, sign, e, mag, rounding, env, want_flags)


def from_int(a, *, fmt: Format = BINARY32, rounding: str = RNE, env="ieee", flags: bool = False):
    """Convert a signed or unsigned integer array (<= 64 bits) to `fmt`, correctly rounded."""
    rounding, env = check_rounding(rounding), resolve_env(env)
    if getattr(a, "dtype", None) is None or a.dtype.kind not in "iu":
        raise TypeError(f"a: expected an integer array, got {getattr(a, 'dtype', type(a).__name__)}")
    return core.run_chunked(
        lambda xp, x: _from_int_chunk(xp, x, fmt, rounding, env, flags), [a], ["a"], fmt.dtype, flags
    )
