"""Arithmetic on arrays of bit patterns: add, sub, mul, div, fma, sqrt, recip, scalb, round_to_integral."""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from . import core, device
from .core import I32, W64, Work, k, patch, round_pack, unpack, work_for
from .env import FloatEnv, default_nan, resolve_env
from .formats import BINARY32, RNE, Format, check_rounding

__all__ = [
    "add",
    "sub",
    "mul",
    "div",
    "fma",
    "sqrt",
    "recip",
    "scalb",
    "round_to_integral",
    "neg",
    "abs",
    "copysign",
]

_abs = abs


def _arith_fmt(fmt: Format, op: str) -> None:
    # fma aligns a 2p-bit product with the addend inside 61 bits; binary64 arithmetic is out of scope.
    if 2 * fmt.precision > 56:
        raise NotImplementedError(f"fmt: {op} supports precisions up to 28 bits, {fmt.name} has {fmt.precision}")


def _args(fmt, rounding, env):
    if not isinstance(fmt, Format):
        raise TypeError(f"fmt: expected a Format, got {type(fmt).__name__}")
    return check_rounding(rounding), resolve_env(env)


def _specials_flags(xp, fmt, env, invalid=None, divbyzero=None, shape=None):
    return core.flags_from(xp, shape, invalid=invalid, divbyzero=divbyzero)


# ---------------------------------------------------------------------------------------------------
# add / sub

_ADD_GUARD = 3  # guard bits below the significand so a jammed sticky bit never reaches the round bit


def _add_chunk(xp, a, b, fmt: Format, rounding: str, env: FloatEnv, want_flags: bool, negate_b: bool):
    t = fmt.dtype.type
    w = work_for(fmt.precision + _ADD_GUARD + 1)
    u = w.u
    bb = b ^ k(t, fmt.sign_mask) if negate_b else b
    # Order by magnitude so the aligned difference is never negative.
    abs_mask = k(t, fmt.abs_mask)
    swap = (bb & abs_mask) > (a & abs_mask)
    hi = xp.where(swap, bb, a)
    lo = xp.where(swap, a, bb)
    H = unpack(xp, fmt, hi, w, env.daz)
    L = unpack(xp, fmt, lo, w, env.daz)
    d = xp.minimum(H.e - L.e, k(I32, w.bits - 1)).astype(u)
    A = H.sig << k(u, _ADD_GUARD)
    Bf = L.sig << k(u, _ADD_GUARD)
    B = Bf >> d
    B = B | ((B << d) != Bf).astype(u)  # jam the bits shifted out
    same = H.sign == L.sign
    X = xp.where(same, A + B, A - B)
    # An exact zero from opposite signs is +0 (-0 when rounding down); equal signs keep theirs.
    sign = H.sign
    zero = X == k(u, 0)
    if not core.none_set(xp, zero):  # exact cancellation is rare: skip the select when absent
        sign = xp.where(same | ~zero, sign, core.zero_sum_sign(u, rounding))
    res, fl = round_pack(xp, fmt, w, sign, H.e - k(I32, _ADD_GUARD), X, rounding, env, want_flags)

    def special(idx):
        x, y, yb = a[idx], b[idx], bb[idx]
        inf_x = (x & t(fmt.abs_mask)) == t(fmt.inf_bits)
        inf_y = (y & t(fmt.abs_mask)) == t(fmt.inf_bits)
        r = xp.where(inf_x, x, yb)
        bad = inf_x & inf_y & ((x ^ yb) >= t(fmt.sign_mask))  # Inf - Inf
        r = xp.where(bad, t(default_nan(fmt, env)), r)
        nan = core.is_nan_bits(fmt, x) | core.is_nan_bits(fmt, y)
        r = xp.where(nan, core.nan_result(xp, fmt, env, [x, y]), r)
        f = core.flags_from(xp, x.shape, invalid=bad | core.any_snan(fmt, [x, y])) if want_flags else None
        return r, f

    return patch(xp, res, H.special | L.special, special, fl)


def add(a, b, *, fmt: Format = BINARY32, rounding: str = RNE, env="ieee", flags: bool = False):
    """Correctly rounded a + b on bit patterns of `fmt`; returns bits, or (bits, uint8 flags) if flags."""
    rounding, env = _args(fmt, rounding, env)
    _arith_fmt(fmt, "add")
    a, b = core.check_bits(a, fmt, "a"), core.check_bits(b, fmt, "b")
    if device.applies([a, b], fmt, flags):
        core.common_shape([a, b], ["a", "b"])
        return device.run("add", [a, b], rounding, env)
    return core.run_chunked(
        lambda xp, x, y: _add_chunk(xp, x, y, fmt, rounding, env, flags, False),
        [a, b],
        ["a", "b"],
        fmt.dtype,
        flags,
    )


def sub(a, b, *, fmt: Format = BINARY32, rounding: str = RNE, env="ieee", flags: bool = False):
    """Correctly rounded a - b; a NaN b is propagated with its own sign (not negated)."""
    rounding, env = _args(fmt, rounding, env)
    _arith_fmt(fmt, "sub")
    a, b = core.check_bits(a, fmt, "a"), core.check_bits(b, fmt, "b")
    if device.applies([a, b], fmt, flags):
        core.common_shape([a, b], ["a", "b"])
        return device.run("sub", [a, b], rounding, env)
    return core.run_chunked(
        lambda xp, x, y: _add_chunk(xp, x, y, fmt, rounding, env, flags, True),
        [a, b],
        ["a", "b"],
        fmt.dtype,
        flags,
    )


# ---------------------------------------------------------------------------------------------------
# mul


def _mul_chunk(xp, a, b, fmt: Format, rounding: str, env: FloatEnv, want_flags: bool):
    t = fmt.dtype.type
    w = work_for(2 * fmt.precision)
    A = unpack(xp, fmt, a, w, env.daz)
    B = unpack(xp, fmt, b, w, env.daz)
    sign = A.sign ^ B.sign
    res, fl = round_pack(xp, fmt, w, sign, A.e + B.e, A.sig * B.sig, rounding, env, want_flags)

    def special(idx):
        x, y = a[idx], b[idx]
        xa, ya = x & t(fmt.abs_mask), y & t(fmt.abs_mask)
        if env.daz:
            # A subnormal read as zero times Inf is invalid too.
            xa = xp.where(xa <= t(fmt.frac_mask), t(0), xa)
            ya = xp.where(ya <= t(fmt.frac_mask), t(0), ya)
        s = (x ^ y) & t(fmt.sign_mask)
        bad = ((xa == t(fmt.inf_bits)) & (ya == t(0))) | ((ya == t(fmt.inf_bits)) & (xa == t(0)))
        r = xp.where(bad, t(default_nan(fmt, env)), s | t(fmt.inf_bits))
        nan = core.is_nan_bits(fmt, x) | core.is_nan_bits(fmt, y)
        r = xp.where(nan, core.nan_result(xp, fmt, env, [x, y]), r)
        f = core.flags_from(xp, x.shape, invalid=bad | core.any_snan(fmt, [x, y])) if want_flags else None
        return r, f

    return patch(xp, res, A.special | B.special, special, fl)


def mul(a, b, *, fmt: Format = BINARY32, rounding: str = RNE, env="ieee", flags: bool = False):
    """Correctly rounded a * b on bit patterns of `fmt`; returns bits, or (bits, flags) if flags."""
    rounding, env = _args(fmt, rounding, env)
    _arith_fmt(fmt, "mul")
    a, b = core.check_bits(a, fmt, "a"), core.check_bits(b, fmt, "b")
    if device.applies([a, b], fmt, flags):
        core.common_shape([a, b], ["a", "b"])
        return device.run("mul", [a, b], rounding, env)
    return core.run_chunked(
        lambda xp, x, y: _mul_chunk(xp, x, y, fmt, rounding, env, flags), [a, b], ["a", "b"], fmt.dtype, flags
    )


# ---------------------------------------------------------------------------------------------------
# div


def _normalize(xp, w: Work, sig, e, top: int):
    """Shift significands left so the leading bit sits at `top` (subnormal inputs); zero stays zero."""
    u = w.u
    if core.none_set(xp, (sig < k(u, 1 << top)) & (sig != k(u, 0))):
        return sig, e  # common case: no subnormal operand in this chunk
    s = xp.maximum(k(I32, top) - core.msb(xp, sig, w), k(I32, 0))
    s = xp.where(sig == k(u, 0), k(I32, 0), s)
    return sig << s.astype(u), e - s


def _div_chunk(xp, a, b, fmt: Format, rounding: str, env: FloatEnv, want_flags: bool):
    t = fmt.dtype.type
    p = fmt.precision
    w = work_for(2 * p + 3)
    u = w.u
    A = unpack(xp, fmt, a, w, env.daz)
    B = unpack(xp, fmt, b, w, env.daz)
    sa, ea = _normalize(xp, w, A.sig, A.e, p - 1)
    sb, eb = _normalize(xp, w, B.sig, B.e, p - 1)
    zero_b = sb == k(u, 0)
    sb = xp.maximum(sb, k(u, 1))  # zero divisors are patched below; avoid dividing by zero here
    num = sa << k(u, p + 2)  # quotient has p+2 or p+3 bits: at least two below the round bit
    q = num // sb
    rem = num - q * sb
    q = q | (rem != k(u, 0)).astype(u)
    res, fl = round_pack(xp, fmt, w, A.sign ^ B.sign, ea - eb - k(I32, p + 2), q, rounding, env, want_flags)

    def special(idx):
        x, y = a[idx], b[idx]
        xa, ya = x & t(fmt.abs_mask), y & t(fmt.abs_mask)
        if env.daz:
            xa = xp.where(xa <= t(fmt.frac_mask), t(0), xa)
            ya = xp.where(ya <= t(fmt.frac_mask), t(0), ya)
        s = (x ^ y) & t(fmt.sign_mask)
        inf = t(fmt.inf_bits)
        bad = ((xa == inf) & (ya == inf)) | ((xa == t(0)) & (ya == t(0)))
        dbz = (ya == t(0)) & (xa != t(0)) & (xa < inf)
        # x/Inf -> 0, Inf/y -> Inf, x/0 -> Inf
        r = xp.where(ya == inf, s, s | inf)
        r = xp.where(bad, t(default_nan(fmt, env)), r)
        nan = core.is_nan_bits(fmt, x) | core.is_nan_bits(fmt, y)
        r = xp.where(nan, core.nan_result(xp, fmt, env, [x, y]), r)
        f = None
        if want_flags:
            f = core.flags_from(xp, x.shape, invalid=bad | core.any_snan(fmt, [x, y]), divbyzero=dbz & ~nan)
        return r, f

    return patch(xp, res, A.special | B.special | zero_b, special, fl)


def div(a, b, *, fmt: Format = BINARY32, rounding: str = RNE, env="ieee", flags: bool = False):
    """Correctly rounded a / b on bit patterns of `fmt`; returns bits, or (bits, flags) if flags."""
    rounding, env = _args(fmt, rounding, env)
    _arith_fmt(fmt, "div")
    a, b = core.check_bits(a, fmt, "a"), core.check_bits(b, fmt, "b")
    if device.applies([a, b], fmt, flags):
        core.common_shape([a, b], ["a", "b"])
        return device.run("div", [a, b], rounding, env)
    return core.run_chunked(
        lambda xp, x, y: _div_chunk(xp, x, y, fmt, rounding, env, flags), [a, b], ["a", "b"], fmt.dtype, flags
    )


def recip(a, *, fmt: Format = BINARY32, rounding: str = RNE, env="ieee", flags: bool = False):
    """Correctly rounded 1 / a (same rules as div with dividend 1)."""
    a = core.check_bits(a, fmt, "a")
    xp = core.get_xp(a)
    one = xp.full(a.shape, fmt.bias << fmt.frac_bits, dtype=fmt.dtype)
    return div(one, a, fmt=fmt, rounding=rounding, env=env, flags=flags)


# ---------------------------------------------------------------------------------------------------
# fma

_FMA_TOP = 60  # both summands are normalised to bit 60 so their sum stays below 2**62 (core limit)


def _fma_chunk(xp, a, b, c, fmt: Format, rounding: str, env: FloatEnv, want_flags: bool):
    t = fmt.dtype.type
    w = W64
    u = w.u
    A = unpack(xp, fmt, a, w, env.daz)
    B = unpack(xp, fmt, b, w, env.daz)
    C = unpack(xp, fmt, c, w, env.daz)
    prod = A.sig * B.sig  # exact: at most 2p <= 56 bits
    sp = A.sign ^ B.sign
    mp = core.msb(xp, prod, w)
    mc = core.msb(xp, C.sig, w)
    P = prod << (I32(_FMA_TOP) - mp).astype(u)
    Cn = C.sig << (I32(_FMA_TOP) - mc).astype(u)
    # Exponent of the bit-0 position of each normalised word; a zero summand gets a tiny exponent so the
    # other one sets the frame.
    lowest = I32(-(1 << 20))
    ep = xp.where(prod == u(0), lowest, A.e + B.e - (I32(_FMA_TOP) - mp))
    ec = xp.where(C.sig == u(0), lowest, C.e - (I32(_FMA_TOP) - mc))
    d = ep - ec
    cap = I32(62)
    dp = xp.minimum(xp.maximum(-d, I32(0)), cap).astype(u)  # right shift of the product
    dc = xp.minimum(xp.maximum(d, I32(0)), cap).astype(u)  # right shift of the addend
    Ps = P >> dp
    Ps = Ps | ((Ps << dp) != P).astype(u)
    Cs = Cn >> dc
    Cs = Cs | ((Cs << dc) != Cn).astype(u)
    e = xp.maximum(ep, ec)
    same = sp == C.sign
    c_big = Cs > Ps
    X = xp.where(same, Ps + Cs, xp.where(c_big, Cs - Ps, Ps - Cs))
    sign = xp.where(~same & c_big, C.sign, sp)
    sign = xp.where(same | (X != u(0)), sign, core.zero_sum_sign(u, rounding))
    res, fl = round_pack(xp, fmt, w, sign, e, X, rounding, env, want_flags)

    def special(idx):
        x, y, z = a[idx], b[idx], c[idx]
        inf = t(fmt.inf_bits)
        xa, ya, za = x & t(fmt.abs_mask), y & t(fmt.abs_mask), z & t(fmt.abs_mask)
        if env.daz:
            xa = xp.where(xa <= t(fmt.frac_mask), t(0), xa)
            ya = xp.where(ya <= t(fmt.frac_mask), t(0), ya)
        s = (x ^ y) & t(fmt.sign_mask)
        zero_inf = ((xa == inf) & (ya == t(0))) | ((ya == inf) & (xa == t(0)))
        p_inf = ((xa == inf) | (ya == inf)) & ~zero_inf
        nan = core.is_nan_bits(fmt, x) | core.is_nan_bits(fmt, y) | core.is_nan_bits(fmt, z)
        bad = zero_inf | (p_inf & ~nan & (za == inf) & ((s ^ z) >= t(fmt.sign_mask)))
        r = xp.where(p_inf, s | inf, z)  # otherwise c is Inf and the product finite
        r = xp.where(bad, t(default_nan(fmt, env)), r)
        r = xp.where(nan, core.nan_result(xp, fmt, env, [x, y, z]), r)
        # 0 * Inf + qNaN signals invalid too (the choice IEEE 754 leaves open; SoftFloat does the same).
        f = core.flags_from(xp, x.shape, invalid=bad | core.any_snan(fmt, [x, y, z])) if want_flags else None
        return r, f

    return patch(xp, res, A.special | B.special | C.special, special, fl)


def fma(a, b, c, *, fmt: Format = BINARY32, rounding: str = RNE, env="ieee", flags: bool = False):
    """a * b + c with a single rounding on bit patterns of `fmt`; returns bits, or (bits, flags)."""
    rounding, env = _args(fmt, rounding, env)
    _arith_fmt(fmt, "fma")
    a, b, c = core.check_bits(a, fmt, "a"), core.check_bits(b, fmt, "b"), core.check_bits(c, fmt, "c")
    if device.applies([a, b, c], fmt, flags):
        core.common_shape([a, b, c], ["a", "b", "c"])
        return device.run("fma", [a, b, c], rounding, env)
    return core.run_chunked(
        lambda xp, x, y, z: _fma_chunk(xp, x, y, z, fmt, rounding, env, flags),
        [a, b, c],
        ["a", "b", "c"],
        fmt.dtype,
        flags,
    )


# ---------------------------------------------------------------------------------------------------
# sqrt


def _sqrt_params(p: int):
    # Normalise to an even bit position pp, so S = sig << s lies in [2**2m, 2**(2m+2)) with m = p + 2:
    # the root then has p + 3 bits, two of them below the round bit.
    pp = p - 1 if (p - 1) % 2 == 0 else p
    m = p + 2
    s = 2 * m - pp
    return pp, m, s


@cache
def _sqrt_table(m: int) -> np.ndarray:
    # Initial overestimates ceil(sqrt((T + 1) * 2**(2m - 8))) for the top 10 bits T of S: relative error
    # below 2**-9, so two Newton steps from above leave the floor or floor + 1 of the root.
    sh = 2 * m - 8
    tab = np.zeros(1024, dtype=np.uint64)
    for T in range(256, 1024):
        v = (T + 1) << sh
        r = math.isqrt(v)
        tab[T] = r if r * r == v else r + 1
    return tab


def _sqrt_chunk(xp, a, fmt: Format, rounding: str, env: FloatEnv, want_flags: bool):
    t = fmt.dtype.type
    p = fmt.precision
    pp, m, s = _sqrt_params(p)
    w = work_for(2 * m + 2)
    u = w.u
    A = unpack(xp, fmt, a, w, env.daz)
    sig, e = A.sig, A.e
    if pp == p:  # even precision: move every significand up one bit so the target bit pp is even
        sig, e = sig << u(1), e - I32(1)
    sig, e = _normalize(xp, w, sig, e, pp)
    odd = (e & I32(1)).astype(u)  # make the exponent even so it halves exactly
    sig = sig << odd
    e = e - odd.astype(I32)
    S = sig << u(s)
    tab = _sqrt_table(m)
    if not core.is_numpy(xp):
        tab = xp.asarray(tab)
    T = (S >> u(2 * m - 8)).astype(np.intp)
    r = xp.take(tab, T).astype(u)
    for _ in range(2):
        r = (r + S // xp.maximum(r, u(1))) >> u(1)
    r = r - (r * r > S).astype(u)
    r = r | (r * r != S).astype(u)
    zero = A.sig == u(0)
    e2 = (e - I32(s)) >> I32(1)
    res, fl = round_pack(xp, fmt, w, u(0) * A.sign, e2, xp.where(zero, u(0), r), rounding, env, want_flags)

    def special(idx):
        x = a[idx]
        xa = x & t(fmt.abs_mask)
        if env.daz:
            xa = xp.where(xa <= t(fmt.frac_mask), t(0), xa)
        neg = (x >= t(fmt.sign_mask)) & (xa != t(0))
        r = xp.where(xa == t(0), x & t(fmt.sign_mask), x)  # +-0 -> +-0, +Inf -> +Inf
        r = xp.where(neg, t(default_nan(fmt, env)), r)
        nan = core.is_nan_bits(fmt, x)
        r = xp.where(nan, core.nan_result(xp, fmt, env, [x]), r)
        f = core.flags_from(xp, x.shape, invalid=(neg & ~nan) | core.is_snan_bits(fmt, x)) if want_flags else None
        return r, f

    return patch(xp, res, A.special | (A.sign != u(0)) | zero, special, fl)


def sqrt(a, *, fmt: Format = BINARY32, rounding: str = RNE, env="ieee", flags: bool = False):
    """Correctly rounded square root; sqrt(-0) = -0, negative operands are invalid."""
    rounding, env = _args(fmt, rounding, env)
    _arith_fmt(fmt, "sqrt")
    a = core.check_bits(a, fmt, "a")
    if device.applies([a], fmt, flags):
        core.common_shape([a], ["a"])
        return device.run("sqrt", [a], rounding, env)
    return core.run_chunked(lambda xp, x: _sqrt_chunk(xp, x, fmt, rounding, env, flags), [a], ["a"], fmt.dtype, flags)


# ---------------------------------------------------------------------------------------------------
# scalb, round_to_integral


def _scalb_chunk(xp, a, n, fmt, rounding, env, want_flags):
    w = W64
    A = unpack(xp, fmt, a, w, env.daz)
    # Clamp n: anything beyond the whole exponent range plus precision already over/underflows.
    lim = 4 * (fmt.bias + fmt.precision) + 8
    nn = xp.clip(n.astype(np.int64), -lim, lim).astype(I32)
    res, fl = round_pack(xp, fmt, w, A.sign, A.e + nn, A.sig, rounding, env, want_flags)

    def special(idx):
        x = a[idx]
        r = xp.where(core.is_nan_bits(fmt, x), core.nan_result(xp, fmt, env, [x]), x)
        f = core.flags_from(xp, x.shape, invalid=core.is_snan_bits(fmt, x)) if want_flags else None
        return r, f

    return patch(xp, res, A.special, special, fl)


def scalb(a, n, *, fmt: Format = BINARY32, rounding: str = RNE, env="ieee", flags: bool = False):
    """a * 2**n correctly rounded (n: integer array or int); over/underflow and FTZ apply."""
    rounding, env = _args(fmt, rounding, env)
    a = core.check_bits(a, fmt, "a")
    xp = core.get_xp(a)
    if isinstance(n, int | np.integer):
        n = xp.asarray(n, dtype=np.int64)
    if not hasattr(n, "dtype") or n.dtype.kind not in "iu":
        raise TypeError(f"n: expected an integer array or int, got {getattr(n, 'dtype', type(n).__name__)}")
    return core.run_chunked(
        lambda xp, x, y: _scalb_chunk(xp, x, y, fmt, rounding, env, flags),
        [a, n],
        ["a", "n"],
        fmt.dtype,
        flags,
    )


def _round_int_chunk(xp, a, fmt, rounding, env, want_flags, exact):
    w = W64
    u = w.u
    A = unpack(xp, fmt, a, w, env.daz)
    # Integral already when e >= 0; otherwise round sig at the binary point (two extra low bits keep
    # the rounding shift >= 2 as _round_shift's tie rule needs at least one bit).
    frac_bits = xp.minimum(xp.maximum(-A.e, I32(0)), I32(61)).astype(u)
    s4 = A.sig << u(2)
    mag = core._round_shift(xp, w, s4, frac_bits + u(2), A.sign, rounding)
    inexact = ((A.sig >> frac_bits) << frac_bits) != A.sig
    # Re-pack the (exact) integer magnitude; integral inputs keep their bits.
    e0 = xp.where(A.e >= I32(0), A.e, I32(0))
    mag = xp.where(A.e >= I32(0), A.sig, mag)
    res, _ = round_pack(xp, fmt, w, A.sign, e0, mag, rounding, env, False)
    fl = None
    if want_flags:
        fl = core.flags_from(xp, a.shape, inexact=(inexact & (A.e < I32(0))) if exact else None)

    def special(idx):
        x = a[idx]
        r = xp.where(core.is_nan_bits(fmt, x), core.nan_result(xp, fmt, env, [x]), x)
        f = core.flags_from(xp, x.shape, invalid=core.is_snan_bits(fmt, x)) if want_flags else None
        return r, f

    return patch(xp, res, A.special, special, fl)


def round_to_integral(
    a, *, fmt: Format = BINARY32, rounding: str = RNE, env="ieee", flags: bool = False, exact: bool = False
):
    """Round to an integral value in `fmt` (sign of zero kept); inexact is raised only when exact=True."""
    rounding, env = _args(fmt, rounding, env)
    a = core.check_bits(a, fmt, "a")
    return core.run_chunked(
        lambda xp, x: _round_int_chunk(xp, x, fmt, rounding, env, flags, exact), [a], ["a"], fmt.dtype, flags
    )


# ---------------------------------------------------------------------------------------------------
# sign operations: quiet, bit-level, no NaN policy and no flags (IEEE 754-2019 5.5.1)


def neg(a, *, fmt: Format = BINARY32):
    """Flip the sign bit (also of NaNs)."""
    a = core.check_bits(a, fmt, "a")
    return a ^ fmt.dtype.type(fmt.sign_mask)


def abs(a, *, fmt: Format = BINARY32):  # noqa: A001 - the API name mirrors IEEE's abs
    """Clear the sign bit (also of NaNs)."""
    a = core.check_bits(a, fmt, "a")
    return a & fmt.dtype.type(fmt.abs_mask)


def copysign(a, b, *, fmt: Format = BINARY32):
    """Magnitude of a with the sign bit of b."""
    a, b = core.check_bits(a, fmt, "a"), core.check_bits(b, fmt, "b")
    core.common_shape([a, b], ["a", "b"])
    t = fmt.dtype.type
    return (a & t(fmt.abs_mask)) | (b & t(fmt.sign_mask))
