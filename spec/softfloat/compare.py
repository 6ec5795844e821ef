"""Comparisons, min/max operations, classification and ULP distance on bit patterns."""

from __future__ import annotations

import numpy as np

from . import core
from .env import FloatEnv, resolve_env
from .formats import BINARY32, Format

__all__ = [
    "eq",
    "lt",
    "le",
    "unordered",
    "minimum",
    "maximum",
    "minimum_number",
    "maximum_number",
    "fmin",
    "fmax",
    "classify",
    "is_nan",
    "is_snan",
    "is_inf",
    "is_zero",
    "is_subnormal",
    "is_normal",
    "ulp_distance",
    "ULP_NAN",
    "ZERO",
    "SUBNORMAL",
    "NORMAL",
    "INF",
    "QNAN",
    "SNAN",
]

# classify codes
ZERO, SUBNORMAL, NORMAL, INF, QNAN, SNAN = range(6)


def _daz(xp, fmt: Format, x, env: FloatEnv):
    """Subnormal patterns replaced by the zero of the same sign when the environment has DAZ."""
    if not env.daz:
        return x
    t = fmt.dtype.type
    sub = (x & t(fmt.inf_bits)) == t(0)
    return xp.where(sub, x & t(fmt.sign_mask), x)


def _key(xp, fmt: Format, x, zero_signed: bool):
    """Signed int64 whose order is the numeric order; -0 sorts below +0 when zero_signed."""
    t = fmt.dtype.type
    mag = (x & t(fmt.abs_mask)).astype(np.int64)
    neg = x >= t(fmt.sign_mask)
    return xp.where(neg, -mag - np.int64(1) if zero_signed else -mag, mag)


def _cmp_chunk(xp, a, b, fmt, env, signaling, want_flags, op):
    a, b = _daz(xp, fmt, a, env), _daz(xp, fmt, b, env)
    nan = core.is_nan_bits(fmt, a) | core.is_nan_bits(fmt, b)
    if op == "unordered":
        r = nan
    else:
        ka, kb = _key(xp, fmt, a, False), _key(xp, fmt, b, False)
        r = {"eq": ka == kb, "lt": ka < kb, "le": ka <= kb}[op] & ~nan
    fl = None
    if want_flags:
        inv = nan if signaling else core.any_snan(fmt, [a, b])
        fl = core.flags_from(xp, a.shape, invalid=inv)
    return r, fl


def _compare(op):
    def fn(a, b, *, fmt: Format = BINARY32, signaling: bool = False, env="ieee", flags: bool = False):
        env = resolve_env(env)
        a, b = core.check_bits(a, fmt, "a"), core.check_bits(b, fmt, "b")
        return core.run_chunked(
            lambda xp, x, y: _cmp_chunk(xp, x, y, fmt, env, signaling, flags, op),
            [a, b],
            ["a", "b"],
            np.bool_,
            flags,
        )

    fn.__name__ = op
    return fn


eq = _compare("eq")
eq.__doc__ = "a == b (bool array); NaN is unequal to everything, +0 == -0; invalid on sNaN (any NaN if signaling)."
lt = _compare("lt")
lt.__doc__ = "a < b (bool array); false when unordered; invalid on sNaN (any NaN if signaling)."
le = _compare("le")
le.__doc__ = "a <= b (bool array); false when unordered; invalid on sNaN (any NaN if signaling)."
unordered = _compare("unordered")
unordered.__doc__ = "True where a or b is NaN; invalid on sNaN (any NaN if signaling)."


def _minmax_chunk(xp, a, b, fmt, env, want_flags, is_max, kind):
    x, y = _daz(xp, fmt, a, env), _daz(xp, fmt, b, env)
    kx, ky = _key(xp, fmt, x, True), _key(xp, fmt, y, True)
    r = xp.where((kx >= ky) if is_max else (kx <= ky), x, y)
    nx, ny = core.is_nan_bits(fmt, a), core.is_nan_bits(fmt, b)
    nan_r = core.nan_result(xp, fmt, env, [a, b])
    if kind == "propagate":
        r = xp.where(nx | ny, nan_r, r)
    else:
        r = xp.where(nx & ~ny, y, r)
        r = xp.where(ny & ~nx, x, r)
        r = xp.where(nx & ny, nan_r, r)
    fl = None
    if want_flags:
        inv = core.any_snan(fmt, [a, b]) if kind != "c" else None
        fl = core.flags_from(xp, a.shape, invalid=inv)
    return r, fl


def _minmax(is_max: bool, kind: str, name: str, doc: str):
    def fn(a, b, *, fmt: Format = BINARY32, env="ieee", flags: bool = False):
        env = resolve_env(env)
        a, b = core.check_bits(a, fmt, "a"), core.check_bits(b, fmt, "b")
        return core.run_chunked(
            lambda xp, x, y: _minmax_chunk(xp, x, y, fmt, env, flags, is_max, kind),
            [a, b],
            ["a", "b"],
            fmt.dtype,
            flags,
        )

    fn.__name__ = name
    fn.__doc__ = doc
    return fn


minimum = _minmax(False, "propagate", "minimum", "IEEE 754-2019 minimum: NaN if either is NaN, -0 < +0.")
maximum = _minmax(True, "propagate", "maximum", "IEEE 754-2019 maximum: NaN if either is NaN, -0 < +0.")
minimum_number = _minmax(
    False,
    "number",
    "minimum_number",
    "IEEE 754-2019 minimumNumber: a NaN operand loses to a number; -0 < +0.",
)
maximum_number = _minmax(
    True, "number", "maximum_number", "IEEE 754-2019 maximumNumber: a NaN operand loses to a number; -0 < +0."
)
fmin = _minmax(
    False, "c", "fmin", "C fminf / CUDA fminf: NaN operands are ignored (no invalid even for sNaN); -0 < +0."
)
fmax = _minmax(True, "c", "fmax", "C fmaxf / CUDA fmaxf: NaN operands are ignored (no invalid even for sNaN); -0 < +0.")


# ---------------------------------------------------------------------------------------------------
# classification and distance


def classify(a, fmt: Format = BINARY32):
    """Class code per element (uint8): ZERO, SUBNORMAL, NORMAL, INF, QNAN, SNAN."""
    a = core.check_bits(a, fmt, "a")
    xp = core.get_xp(a)
    t = fmt.dtype.type
    ef = a & t(fmt.inf_bits)
    frac = a & t(fmt.frac_mask)
    r = xp.full(a.shape, NORMAL, dtype=np.uint8)
    r = xp.where(ef == t(0), xp.where(frac == t(0), np.uint8(ZERO), np.uint8(SUBNORMAL)), r)
    top = ef == t(fmt.inf_bits)
    quiet = (a & t(fmt.quiet_bit)) != t(0)
    special = xp.where(frac == t(0), np.uint8(INF), xp.where(quiet, np.uint8(QNAN), np.uint8(SNAN)))
    return xp.where(top, special, r)


def is_nan(a, fmt: Format = BINARY32):
    """True for NaN patterns (quiet or signaling)."""
    return core.is_nan_bits(fmt, core.check_bits(a, fmt, "a"))


def is_snan(a, fmt: Format = BINARY32):
    """True for signaling NaN patterns."""
    return core.is_snan_bits(fmt, core.check_bits(a, fmt, "a"))


def is_inf(a, fmt: Format = BINARY32):
    """True for +-Inf."""
    a = core.check_bits(a, fmt, "a")
    return (a & fmt.dtype.type(fmt.abs_mask)) == fmt.dtype.type(fmt.inf_bits)


def is_zero(a, fmt: Format = BINARY32):
    """True for +-0."""
    a = core.check_bits(a, fmt, "a")
    return (a & fmt.dtype.type(fmt.abs_mask)) == fmt.dtype.type(0)


def is_subnormal(a, fmt: Format = BINARY32):
    """True for nonzero numbers with a zero exponent field."""
    return classify(a, fmt) == np.uint8(SUBNORMAL)


def is_normal(a, fmt: Format = BINARY32):
    """True for normal finite nonzero numbers."""
    return classify(a, fmt) == np.uint8(NORMAL)


ULP_NAN = 1 << 32  # sentinel for binary32; other formats use 2**bits (2**63 - 1 for binary64)


def _ulp_nan(fmt: Format) -> int:
    return (1 << fmt.bits) if fmt.bits < 63 else (1 << 63) - 1


def ulp_distance(a_bits, b_bits, fmt: Format = BINARY32):
    """Steps between a and b on the ordered line of representable values (int64).

    +0 and -0 are one point (distance 0); two NaNs are at distance 0; a NaN against a non-NaN gives the
    sentinel 2**fmt.bits (2**32 for binary32), larger than any distance between two non-NaN values.
    """
    a, b = core.check_bits(a_bits, fmt, "a_bits"), core.check_bits(b_bits, fmt, "b_bits")
    core.common_shape([a, b], ["a_bits", "b_bits"])
    xp = core.get_xp(a)
    ka, kb = _key(xp, fmt, a, False), _key(xp, fmt, b, False)
    d = xp.abs(ka - kb)
    na, nb = core.is_nan_bits(fmt, a), core.is_nan_bits(fmt, b)
    d = xp.where(na & nb, np.int64(0), d)
    return xp.where(na ^ nb, np.int64(_ulp_nan(fmt)), d)
