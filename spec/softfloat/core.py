"""Shared machinery: array namespace, validation, chunking, unpacking and the one rounding/packing core.

Every arithmetic result goes through `round_pack`: the exact result is handed over as an unsigned
integer significand `sig` (with any bits lost before the call ORed into its last bit, "jamming") and an
int32 exponent `e`, meaning sig * 2**e. The core normalises, rounds once per mode, and packs with
subnormal, overflow, FTZ and flag handling. Only integer dtypes are used.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence

import numpy as np

from .env import FloatEnv, default_nan
from .formats import RDN, RNA, RNE, RTO, RTZ, RUP, Flags, Format

I32 = np.int32
U8 = np.uint8

# Elements per chunk: big enough to amortise per-call overhead, small enough that the ~30 temporaries of
# one operation stay in cache on a CPU (NumPy) or stay a bounded slice of device memory (CuPy).
CHUNK = {"numpy": 1 << 17, "cupy": 1 << 24}


def set_chunk_size(n: int, backend: str = "numpy") -> None:
    """Set the number of elements processed per chunk for `backend` ('numpy' or 'cupy')."""
    if n < 1:
        raise ValueError("n: chunk size must be positive")
    CHUNK[backend] = int(n)


def get_xp(x: object):
    """Array namespace of `x`: cupy for CuPy arrays (imported only then), numpy otherwise."""
    mod = type(x).__module__
    if mod.startswith("cupy"):
        import cupy  # noqa: PLC0415 - never imported unless a CuPy array is passed

        return cupy
    return np


def is_numpy(xp) -> bool:
    return xp is np


_SCALARS: dict[tuple[type, int], object] = {}


def k(t, v: int):
    """The NumPy scalar ``t(v)``, built once per process: building one costs about as much as a whole operation
    on a small array, and the sequential folds of the references call the core with small arrays."""
    try:
        return _SCALARS[t, v]
    except KeyError:
        c = _SCALARS[t, v] = t(v)
        return c


def none_set(xp, mask) -> bool:
    """True where ``mask`` selects nothing and that is cheap to know (NumPy); always False for CuPy (no sync)."""
    return xp is np and not np.count_nonzero(mask)


class Work:
    """Integer width used inside one operation: 32 bits when everything fits (twice the SIMD lanes)."""

    def __init__(self, bits: int):
        self.bits = bits
        self.u = np.uint32 if bits == 32 else np.uint64
        self.P = bits - 3  # the core normalises significands to the bit P, leaving headroom for carries


W32 = Work(32)
W64 = Work(64)


def work_for(nbits: int) -> Work:
    """Smallest work width whose significands of `nbits` bits stay below 2**(width-2)."""
    return W32 if nbits <= 29 else W64


# ---------------------------------------------------------------------------------------------------
# validation and chunked execution


def check_bits(x, fmt: Format, name: str):
    """Return `x` as an array of `fmt`'s storage dtype or raise TypeError naming the argument."""
    if isinstance(x, np.generic):
        x = np.asarray(x)
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"{name}: expected an array of {fmt.dtype} bit patterns, got {type(x).__name__}")
    if x.dtype != fmt.dtype:
        raise TypeError(
            f"{name}: expected dtype {fmt.dtype} (bit patterns of {fmt.name}), got {x.dtype}; "
            "convert floats with f32_to_bits (a view), never by value"
        )
    return x


def common_shape(arrays: Sequence, names: Sequence[str]) -> tuple:
    """Shape shared by all arrays (0-d arrays broadcast); ValueError naming the mismatched argument."""
    shape = None
    for a, n in zip(arrays, names, strict=True):
        if a.ndim == 0:
            continue
        if shape is None:
            shape = a.shape
        elif a.shape != shape:
            raise ValueError(f"{n}: shape {a.shape} does not match {names[0]} shape {shape}")
    return () if shape is None else shape


def run_chunked(
    fn: Callable,
    arrays: Sequence,
    names: Sequence[str],
    out_dtype,
    want_flags: bool,
):
    """Apply fn(xp, *chunks) -> (bits, flags|None) over flattened, equally shaped inputs in chunks."""
    xp = get_xp(arrays[0])
    for a, n in zip(arrays[1:], names[1:], strict=True):
        if get_xp(a) is not xp:
            raise TypeError(f"{n}: array library differs from that of {names[0]}")
    shape = common_shape(arrays, names)
    size = math.prod(shape)
    flat = []
    for a in arrays:
        if a.ndim == 0:
            a = xp.broadcast_to(a, shape)
        flat.append(xp.ascontiguousarray(a).reshape(-1))
    step = CHUNK["numpy" if is_numpy(xp) else "cupy"]
    if 0 < size <= step:  # one chunk (most calls): its results are the output, copied so they never alias an input
        bits, f = fn(xp, *flat)
        out = xp.array(bits, dtype=out_dtype).reshape(shape)
        return (out, xp.array(f, dtype=U8).reshape(shape)) if want_flags else out
    out = xp.empty(size, dtype=out_dtype)
    fl = xp.zeros(size, dtype=U8) if want_flags else None
    for s in range(0, size, step):
        e = min(size, s + step)
        bits, f = fn(xp, *[a[s:e] for a in flat])
        out[s:e] = bits
        if want_flags:
            fl[s:e] = f
    out = out.reshape(shape)
    if want_flags:
        return out, fl.reshape(shape)
    return out


def patch(xp, res, mask, fn: Callable, fl=None):
    """Overwrite res[mask] with fn(index) -> (bits, flags); skipped cheaply when nothing is selected.

    Special operands (NaN, Inf, zero divisors) are rare in sweeps, so they are handled on the gathered
    subset instead of with full-width selects.
    """
    if none_set(xp, mask):
        return res, fl
    idx = xp.nonzero(mask.reshape(-1))[0]
    if idx.size == 0:
        return res, fl
    bits, f = fn(idx)
    res[idx] = bits
    if fl is not None and f is not None:
        fl[idx] = f
    return res, fl


# ---------------------------------------------------------------------------------------------------
# bit-level helpers


def msb(xp, x, w: Work):
    """Index of the highest set bit of each element of the unsigned array x (int32), -1 where x == 0."""
    u = w.u
    if hasattr(xp, "bitwise_count"):
        # Smear the top bit downwards, then count: msb = popcount - 1.
        y = x | (x >> k(u, 1))
        y |= y >> k(u, 2)
        y |= y >> k(u, 4)
        y |= y >> k(u, 8)
        y |= y >> k(u, 16)
        if w.bits == 64:
            y |= y >> k(u, 32)
        return xp.bitwise_count(y).astype(I32) - k(I32, 1)
    # Fallback for namespaces without popcount: branch-free binary search.
    r = xp.zeros(x.shape, dtype=I32)
    y = x
    for s in (32, 16, 8, 4, 2, 1) if w.bits == 64 else (16, 8, 4, 2, 1):
        m = y >= u(1 << s)
        y = xp.where(m, y >> u(s), y)
        r += m.astype(I32) * I32(s)
    return xp.where(x == u(0), I32(-1), r)


class Unpacked:
    """Fields of bit patterns widened to a work width: sign (0/1), exponent e and significand sig."""

    __slots__ = ("sign", "e", "sig", "ef", "special")


def unpack(xp, fmt: Format, x, w: Work, daz: bool) -> Unpacked:
    """Split bit patterns into sign, significand and exponent so that |x| = sig * 2**e for finite x."""
    u = w.u
    xs = x.astype(u) if x.dtype.type is not u else x
    r = Unpacked()
    r.sign = xs >> k(u, fmt.bits - 1)
    ef = (xs >> k(u, fmt.frac_bits)) & k(u, fmt.exp_field_max)
    normal = ef != k(u, 0)
    sig = (xs & k(u, fmt.frac_mask)) | (normal.astype(u) << k(u, fmt.frac_bits))
    if daz:
        sig = xp.where(normal, sig, k(u, 0))  # DAZ: subnormal operands read as zero of the same sign
    r.sig = sig
    # Subnormals share the exponent of the smallest normal: field 0 behaves like field 1.
    r.ef = ef
    r.e = xp.maximum(ef, k(u, 1)).astype(I32) - k(I32, fmt.bias + fmt.frac_bits)
    r.special = ef == k(u, fmt.exp_field_max)
    return r


def is_nan_bits(fmt: Format, x):
    """Boolean mask of NaN bit patterns (storage dtype input)."""
    t = x.dtype.type
    return (x & t(fmt.abs_mask)) > t(fmt.inf_bits)


def is_snan_bits(fmt: Format, x):
    """Boolean mask of signaling NaN bit patterns."""
    t = x.dtype.type
    return is_nan_bits(fmt, x) & ((x & t(fmt.quiet_bit)) == t(0))


def nan_result(xp, fmt: Format, env: FloatEnv, operands: Sequence):
    """NaN result for lanes with at least one NaN operand: first NaN operand quieted, or canonical."""
    t = fmt.dtype.type
    dn = t(default_nan(fmt, env))
    res = xp.full(operands[0].shape, dn, dtype=fmt.dtype)
    if env.nan_policy == "cuda":
        return res
    for op in reversed(operands):  # reversed so the first NaN operand wins
        res = xp.where(is_nan_bits(fmt, op), op | t(fmt.quiet_bit), res)
    return res


def any_snan(fmt: Format, operands: Sequence):
    """Mask of lanes where any operand is a signaling NaN (these raise invalid)."""
    m = is_snan_bits(fmt, operands[0])
    for op in operands[1:]:
        m = m | is_snan_bits(fmt, op)
    return m


def flags_from(xp, shape, **conds):
    """Build a uint8 flags array from boolean masks keyed by Flags member names (lower case)."""
    f = xp.zeros(shape, dtype=U8)
    for k, m in conds.items():
        if m is not None:
            f |= m.astype(U8) * U8(Flags[k.upper()])
    return f


# ---------------------------------------------------------------------------------------------------
# rounding core


def _round_shift(xp, w: Work, sig, rsh, sign, rounding: str):
    """Round unsigned sig right by rsh (>= 1) bits in `rounding`; the last bit of sig is sticky."""
    u = w.u
    one = k(u, 1)
    if rounding == RTZ:
        return sig >> rsh
    if rounding == RNE:
        # Add half-minus-one plus the kept LSB: ties go up exactly when the kept part is odd.
        return (sig + (((one << rsh) >> one) - one) + ((sig >> rsh) & one)) >> rsh
    if rounding == RNA:
        return (sig + ((one << rsh) >> one)) >> rsh
    if rounding in (RUP, RDN):
        away = sign == (u(0) if rounding == RUP else u(1))
        return (sig + xp.where(away, (one << rsh) - one, u(0))) >> rsh
    if rounding == RTO:
        q = sig >> rsh
        return q | ((q << rsh) != sig).astype(u)
    raise ValueError(f"rounding: unknown rounding mode {rounding!r}")


def overflow_bits(xp, fmt: Format, sign, rounding: str, u):
    """Magnitude delivered on overflow: Inf, or the largest finite number for modes that never reach Inf."""
    inf, mx = u(fmt.inf_bits), u(fmt.max_finite_bits)
    if rounding in (RNE, RNA):
        return inf
    if rounding in (RTZ, RTO):
        return mx
    to_inf_sign = u(0) if rounding == RUP else u(1)
    return xp.where(sign == to_inf_sign, inf, mx)


def round_pack(xp, fmt: Format, w: Work, sign, e, sig, rounding: str, env: FloatEnv, want_flags: bool):
    """Round sign * sig * 2**e (sig < 2**(w.bits-2), last bit sticky) to `fmt`; return (bits, flags|None).

    Zero sig gives a zero with the given sign. Tininess per env.tininess; FTZ flushes tiny results.
    """
    u = w.u
    P = w.P
    f = fmt.frac_bits
    m = msb(xp, sig, w)
    sig_n = sig << (k(I32, P) - m).astype(u)  # leading bit now at P (zero stays zero)
    E = e + m  # exponent of the leading bit of the exact value
    t = E + k(I32, fmt.bias - 1)  # biased exponent minus one; < 0 means subnormal
    ebf = xp.maximum(t, k(I32, 0))
    # Bits to drop: P - f for normal results, more for subnormal ones; capped where sig_n >> cap == 0
    # and the round bit is 0, which is exactly right for any larger shift (a clip, without its wrapper's cost).
    rsh = xp.minimum(xp.maximum(k(I32, P - f) - t, k(I32, P - f)), k(I32, w.bits - 1)).astype(u)
    mant = _round_shift(xp, w, sig_n, rsh, sign, rounding)
    # Adding the significand (hidden bit included) to (biased exponent - 1) << f lets a carry out of
    # rounding bump the exponent and turns subnormals into normals for free.
    enc = (xp.minimum(ebf, k(I32, fmt.exp_field_max)).astype(u) << k(u, f)) + mant
    nz = sig != k(u, 0)
    enc = xp.where(nz, enc, k(u, 0))
    ovf = enc >= k(u, fmt.inf_bits)
    if not none_set(xp, ovf):
        enc = xp.where(ovf, overflow_bits(xp, fmt, sign, rounding, u), enc)
    tiny = None
    if env.ftz or want_flags:
        tiny = nz & (E < I32(fmt.emin))  # tininess before rounding
        if env.tininess == "after":
            # Tiny after rounding unless the value just below 2**emin rounds up to it at full precision.
            m_full = _round_shift(xp, w, sig_n, u(P - f), sign, rounding)
            tiny = tiny & ~((E == I32(fmt.emin - 1)) & (m_full >> u(fmt.precision) != u(0)))
        if env.ftz:
            enc = xp.where(tiny, u(0), enc)
    if enc.dtype == fmt.dtype:
        out = enc | (sign << k(u, fmt.bits - 1))
    else:
        out = enc.astype(fmt.dtype) | (sign.astype(fmt.dtype) << fmt.dtype.type(fmt.bits - 1))
    if not want_flags:
        return out, None
    inexact = (sig_n & ((u(1) << rsh) - u(1))) != u(0)
    inexact = inexact | ovf
    under = tiny & inexact
    if env.ftz:
        under = under | tiny
        inexact = inexact | tiny
    return out, flags_from(xp, sig.shape, inexact=inexact, overflow=ovf, underflow=under)


def zero_sum_sign(u, rounding: str):
    """Sign of an exact zero sum of operands with opposite signs: -0 only when rounding down."""
    return u(1) if rounding == RDN else u(0)


def module_self():
    return sys.modules[__name__]
