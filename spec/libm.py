"""Reference semantics of the CUDA math-library audit: the correctly rounded binary32 value of each function.

The reference of ``f`` at a binary32 input ``x`` is ``RN32(f(x))``: the exact real value rounded once to
binary32 (round to nearest, ties to even, subnormals kept; env ``cuda-ftz`` reads a subnormal input as a
zero of its sign and flushes a subnormal result to a zero of its sign). It is computed in two tiers:

1. **float64 tier** (on the device, or here with NumPy for tests): ``y = f64(x)`` (CUDA's double function)
   and one rounding ``RN32(y)``. The double function has a documented error bound (CUDA Programming Guide,
   double-precision table): ``k`` ulp, or an absolute error ``a`` on a range (Bessel functions, ``|x| >= 8``).
   The *window* of ``y`` is ``W = K * 2^-52 * |y| + K * 2^-1074 + A`` with ``K = 2k + 1`` (twice the
   documented bound, plus one ulp for the binade edge) and ``A = 2a`` where an absolute bound applies. The
   true value lies in ``[y - W, y + W]``; if ``RN32`` maps both ends to the same binary32 value (zeros of
   either sign counting as one) and neither end is a rounding tie, ``RN32(y)`` is the correctly rounded
   value. Otherwise the input is **ambiguous**.
2. **MPFR tier** (host, gmpy2): an ambiguous input is *settled*: MPFR evaluates ``f`` correctly rounded in
   the binary32 context (``gmpy2.ieee(32)``), or, for the functions MPFR lacks (rcbrt, normcdf, sinpi,
   cospi, erfinv, erfcinv, normcdfinv), by a Ziv loop: evaluate at precision ``p`` with a stated error, round
   both ends of the error interval, and double ``p`` until they agree. The inverse functions solve
   ``F(t) = y`` by Newton's method at precision ``p`` and prove the bracket ``F(t - d) <= y <= F(t + d)``
   with directed roundings before rounding.

Comparison: the ULP distance of two binary32 values is the distance of their keys (sign-magnitude mapped to
a line, ``+0`` and ``-0`` one point; ``+inf`` is the point after ``FLT_MAX``). A NaN result matches any NaN
reference; a NaN on one side only is a *nan mismatch*. Zeros of different sign are at distance 0 and
counted apart (``zero_sign_mismatch``).

Documented bounds are not code: they are the contract's item tolerances, a list of *pieces*
(:func:`parse_tolerance`), each a region of ``x`` and a bound: ``ulp: N``, ``ulp_linear: [a, b]``
(``a + floor(|b x|)`` ulp), ``abs: E`` or ``abs_log2: L`` (``|got - f(x)| <= 2^L``). An input in no piece
is measured but not judged (e.g. lgammaf inside (-10.001, -2.264), __sinf outside [-pi, pi]).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "LibmFunction",
    "FUNCTIONS",
    "STANDARD",
    "INTRINSICS",
    "ENVS",
    "get_function",
    "Piece",
    "parse_tolerance",
    "piece_index",
    "HIST_KEYS",
    "bucket_of",
    "ulp_distance",
    "f32_bits_to_f64",
    "round_f64_to_f32",
    "reference_with_window",
    "float64_tier",
    "window",
    "daz_bits",
    "ftz_bits",
    "settle",
    "mp_value",
    "abs_error_exceeds",
    "SettlementError",
    "round_mpfr_to_bits",
]

ENVS: tuple[str, ...] = ("cuda", "cuda-ftz")

# ULP histogram buckets (inputs judged by ULP), then NaN mismatches and inputs judged by absolute error.
HIST_KEYS: tuple[str, ...] = ("0", "1", "2", "3", "4", "5-8", "9-16", ">16", "nan-mismatch", "abs-range")
NAN_MISMATCH = 1 << 32


@dataclass(frozen=True)
class LibmFunction:
    """A unary binary32 CUDA function, its double counterpart with that one's documented error, its MPFR form."""

    name: str
    cuda: str  # the CUDA float call, argument x
    double: str  # the CUDA double call, argument xd
    double_ulp: float  # documented max ulp error of the double function (CUDA Programming Guide)
    mp: str  # key into the MPFR evaluators
    double_abs: tuple[float, float] | None = None  # (|x| threshold, absolute error of the double beyond it)
    intrinsic: bool = False
    # (T, c, dir): for 0 < |x| < T, f(x) = c x (1 + d) with sign(d) = dir and |d| far below an ulp, so an
    # exact tie y == c x resolves toward zero (dir -1) or away (dir +1) without MPFR (j1: x/2 - x^3/16 ...).
    tiny_tie: tuple[float, float, int] | None = None

    @property
    def window_ulps(self) -> float:
        """K: the float64 tier's window in double ulps (twice the documented bound, plus one)."""
        return 2 * self.double_ulp + 1


def _f(name: str, double: str, k: float, mp: str | None = None, **kw: Any) -> LibmFunction:
    return LibmFunction(name, f"{name}(x)", f"{double}(xd)", k, mp or double, **kw)


_BESSEL_ABS = (8.0, 5e-12)
STANDARD: tuple[LibmFunction, ...] = (
    _f("expf", "exp", 1),
    _f("exp2f", "exp2", 1),
    _f("exp10f", "exp10", 1),
    _f("expm1f", "expm1", 1),
    _f("logf", "log", 1),
    _f("log2f", "log2", 1),
    _f("log10f", "log10", 1),
    _f("log1pf", "log1p", 1),
    _f("sinf", "sin", 2),
    _f("cosf", "cos", 2),
    _f("tanf", "tan", 2),
    _f("sinpif", "sinpi", 2),
    _f("cospif", "cospi", 2),
    _f("asinf", "asin", 2),
    _f("acosf", "acos", 2),
    _f("atanf", "atan", 2),
    _f("sinhf", "sinh", 2),
    _f("coshf", "cosh", 1),
    _f("tanhf", "tanh", 1),
    _f("asinhf", "asinh", 3),
    _f("acoshf", "acosh", 3),
    _f("atanhf", "atanh", 2),
    _f("erff", "erf", 2),
    _f("erfcf", "erfc", 5),
    _f("erfinvf", "erfinv", 5),
    _f("erfcinvf", "erfcinv", 6),
    _f("cbrtf", "cbrt", 1),
    _f("rcbrtf", "rcbrt", 1),
    _f("rsqrtf", "rsqrt", 1),
    _f("lgammaf", "lgamma", 4),
    _f("tgammaf", "tgamma", 10),
    _f("normcdff", "normcdf", 5),
    _f("normcdfinvf", "normcdfinv", 8),
    _f("j0f", "j0", 7, double_abs=_BESSEL_ABS),
    _f("j1f", "j1", 7, double_abs=_BESSEL_ABS, tiny_tie=(2.0**-60, 0.5, -1)),
    _f("y0f", "y0", 7, double_abs=_BESSEL_ABS),
    _f("y1f", "y1", 7, double_abs=_BESSEL_ABS),
)
INTRINSICS: tuple[LibmFunction, ...] = (
    LibmFunction("__expf", "__expf(x)", "exp(xd)", 1, "exp", intrinsic=True),
    LibmFunction("__exp10f", "__exp10f(x)", "exp10(xd)", 1, "exp10", intrinsic=True),
    LibmFunction("__logf", "__logf(x)", "log(xd)", 1, "log", intrinsic=True),
    LibmFunction("__log2f", "__log2f(x)", "log2(xd)", 1, "log2", intrinsic=True),
    LibmFunction("__log10f", "__log10f(x)", "log10(xd)", 1, "log10", intrinsic=True),
    LibmFunction("__sinf", "__sinf(x)", "sin(xd)", 2, "sin", intrinsic=True),
    LibmFunction("__cosf", "__cosf(x)", "cos(xd)", 2, "cos", intrinsic=True),
    LibmFunction("__tanf", "__tanf(x)", "tan(xd)", 2, "tan", intrinsic=True),
)
FUNCTIONS: dict[str, LibmFunction] = {f.name: f for f in STANDARD + INTRINSICS}


def get_function(name: str) -> LibmFunction:
    """The registered function ``name``; KeyError lists the known ones."""
    try:
        return FUNCTIONS[name]
    except KeyError:
        raise KeyError(f"unknown libm function {name!r}; known: {sorted(FUNCTIONS)}") from None


# -- documented bounds: tolerance pieces ----------------------------------------------------------------------

_REGIONS = {"all": 0, "x_in": 1, "x_outside": 2, "abs_x_lt": 3, "abs_x_ge": 4}
_BOUNDS = {"ulp": 1, "ulp_linear": 2, "abs": 3}


@dataclass(frozen=True)
class Piece:
    """One documented bound on one region of x: region kind and its numbers, bound kind and its numbers."""

    region: str  # all | x_in [a, b] | x_outside [a, b] (x < a or x > b) | abs_x_lt a | abs_x_ge a
    a: float
    b: float
    bound: str  # ulp N | ulp_linear (N + floor(|M x|)) | abs E
    p1: float
    p2: float = 0.0
    text: str = ""

    def contains(self, x: float) -> bool:
        """Whether binary32 input ``x`` (as a float) lies in this piece's region (NaN lies only in 'all')."""
        if self.region == "all":
            return True
        if math.isnan(x):
            return False
        return {
            "x_in": lambda: self.a <= x <= self.b,
            "x_outside": lambda: x < self.a or x > self.b,
            "abs_x_lt": lambda: abs(x) < self.a,
            "abs_x_ge": lambda: abs(x) >= self.a,
        }[self.region]()

    def ulp_bound(self, x: float) -> float:
        """The ULP bound at ``x`` (ulp and ulp_linear pieces)."""
        if self.bound == "ulp_linear":
            t = abs(self.p2 * x)
            return self.p1 + math.floor(t) if math.isfinite(t) else math.inf  # no finite bound at inf/NaN x
        return self.p1

    def as_params(self) -> list[float]:
        """Six numbers for the device kernel: region code, a, b, bound code, p1, p2."""
        return [float(_REGIONS[self.region]), self.a, self.b, float(_BOUNDS[self.bound]), self.p1, self.p2]

    def describe(self) -> str:
        """The piece as text, e.g. '|x| < 8: 9 ulp'."""
        where = {
            "all": "all x",
            "x_in": f"x in [{self.a:g}, {self.b:g}]",
            "x_outside": f"x outside [{self.a:g}, {self.b:g}]",
            "abs_x_lt": f"|x| < {self.a:g}",
            "abs_x_ge": f"|x| >= {self.a:g}",
        }[self.region]
        what = {
            "ulp": f"{self.p1:g} ulp",
            "ulp_linear": f"{self.p1:g} + floor(|{self.p2:g} x|) ulp",
            "abs": f"abs error {self.p1:.3g}",
        }[self.bound]
        return f"{where}: {what}"


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
        raise ValueError(f"{what} must be a finite number, not {v!r}")
    return float(v)


def _parse_piece(d: Mapping[str, Any]) -> Piece:
    if not isinstance(d, Mapping):
        raise ValueError(f"a tolerance piece is a mapping, not {d!r}")
    unknown = set(d) - {"where", "ulp", "ulp_linear", "abs", "abs_log2"}
    if unknown:
        raise ValueError(f"unknown key(s) in tolerance piece: {sorted(unknown)}")
    where = d.get("where", "all")
    region, a, b = "all", 0.0, 0.0
    if where != "all":
        if not isinstance(where, Mapping) or len(where) != 1:
            raise ValueError(f"'where' is 'all' or one of {sorted(_REGIONS)[1:]} with its numbers, not {where!r}")
        ((region, val),) = where.items()
        if region not in _REGIONS or region == "all":
            raise ValueError(f"unknown region {region!r}; known: {sorted(_REGIONS)}")
        if region in ("x_in", "x_outside"):
            if not isinstance(val, Sequence) or len(val) != 2:
                raise ValueError(f"{region} takes [lo, hi], not {val!r}")
            a, b = _number(val[0], f"{region} lo"), _number(val[1], f"{region} hi")
            if a > b:
                raise ValueError(f"{region} [{a}, {b}] is empty")
        else:
            a = _number(val, region)
    kinds = [k for k in ("ulp", "ulp_linear", "abs", "abs_log2") if k in d]
    if len(kinds) != 1:
        raise ValueError(f"a tolerance piece states exactly one bound (ulp, ulp_linear, abs, abs_log2), not {kinds}")
    kind = kinds[0]
    if kind == "ulp":
        n = _number(d["ulp"], "ulp")
        if n < 0:
            raise ValueError("ulp bound must be >= 0")
        return Piece(region, a, b, "ulp", n, text=str(dict(d)))
    if kind == "ulp_linear":
        v = d["ulp_linear"]
        if not isinstance(v, Sequence) or len(v) != 2:
            raise ValueError(f"ulp_linear takes [N, M] (N + floor(|M x|)), not {v!r}")
        return Piece(region, a, b, "ulp_linear", _number(v[0], "N"), _number(v[1], "M"), text=str(dict(d)))
    e = _number(d[kind], kind)
    e = 2.0**e if kind == "abs_log2" else e
    if e <= 0:
        raise ValueError("an absolute bound must be > 0")
    return Piece(region, a, b, "abs", e, text=str(dict(d)))


def parse_tolerance(tol: Any) -> tuple[Piece, ...]:
    """The documented bound of one item: a list of pieces (at most 2), an empty list for 'no documented bound'."""
    if tol is None:
        return ()
    if not isinstance(tol, Sequence) or isinstance(tol, str):
        raise ValueError(f"a libm tolerance is a list of pieces, not {tol!r}")
    pieces = tuple(_parse_piece(p) for p in tol)
    if len(pieces) > 2:
        raise ValueError("at most 2 tolerance pieces per function")
    return pieces


def piece_index(pieces: Sequence[Piece], x: float) -> int:
    """Index of the first piece containing ``x``, or -1 (measured, not judged)."""
    for i, p in enumerate(pieces):
        if p.contains(x):
            return i
    return -1


# -- binary32 keys, ULP distance, histogram -------------------------------------------------------------------


def _key(b: int, ftz: bool = False) -> int:
    mag = b & 0x7FFFFFFF
    if ftz:  # the flushed number line: no subnormals, +-0 adjacent to +-FLT_MIN
        mag = mag - 0x007FFFFF if mag >= 0x00800000 else 0
    return -mag if b & 0x80000000 else mag


def _is_nan(b: int) -> bool:
    return (b & 0x7FFFFFFF) > 0x7F800000


def ulp_distance(a: int, b: int, ftz: bool = False) -> int:
    """ULP distance of binary32 bits ``a`` and ``b``: key distance, NaN vs NaN 0, NaN vs number NAN_MISMATCH.

    ``ftz`` (env cuda-ftz): distance on the flushed number line, where subnormals read as zero and +-0 is
    one ulp from +-FLT_MIN (a result flushed at the FLT_MIN boundary is one ulp off, not 2^23).
    """
    na, nb = _is_nan(a), _is_nan(b)
    if na and nb:
        return 0
    if na or nb:
        return NAN_MISMATCH
    return abs(_key(a, ftz) - _key(b, ftz))


def bucket_of(d: int) -> str:
    """The histogram bucket of a ULP distance."""
    if d >= NAN_MISMATCH:
        return "nan-mismatch"
    if d <= 4:
        return str(d)
    return "5-8" if d <= 8 else "9-16" if d <= 16 else ">16"


# -- float64 tier (NumPy form of the device code) -------------------------------------------------------------


def f32_bits_to_f64(bits: np.ndarray) -> np.ndarray:
    """The exact float64 value of binary32 bit patterns (integer construction, no float conversion)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(bits, dtype=np.uint32).view(np.float32).astype(np.float64)


def round_f64_to_f32(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(binary32 bits of RN32(y), tie mask) from float64 ``y`` by integer operations (NaN -> 0x7FFFFFFF)."""
    d = np.asarray(y, dtype=np.float64).view(np.uint64)
    s = ((d >> np.uint64(32)) & np.uint64(0x80000000)).astype(np.uint64)
    e = ((d >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    m = d & np.uint64((1 << 52) - 1)
    big_e = e - 1023
    sig = m | np.uint64(1 << 52)
    shift = np.where(big_e >= -126, 29, 29 + (-126 - big_e)).astype(np.int64)
    shift_c = np.clip(shift, 1, 63).astype(np.uint64)
    kept = sig >> shift_c
    rem = sig & ((np.uint64(1) << shift_c) - np.uint64(1))
    half = np.uint64(1) << (shift_c - np.uint64(1))
    up = (rem > half) | ((rem == half) & ((kept & np.uint64(1)) == np.uint64(1)))
    kept = kept + up.astype(np.uint64)
    tie = rem == half
    normal = big_e >= -126
    nb = np.where(
        normal, (np.clip(big_e + 127, 0, 255).astype(np.uint64) << np.uint64(23)) + kept - np.uint64(1 << 23), kept
    )
    far = (shift > 63) | (e == 0)
    nb = np.where(far, np.uint64(0), nb)
    tie = tie & ~far
    over = (big_e > 127) & (e != 0x7FF)
    nb = np.where(over, np.uint64(0x7F800000), nb)
    nb = np.where(e == 0x7FF, np.where(m == 0, np.uint64(0x7F800000), np.uint64(0x7FFFFFFF)), nb)
    tie = tie & ~over & (e != 0x7FF)
    nan = (e == 0x7FF) & (m != 0)
    out = np.where(nan, nb, nb | s).astype(np.uint32)
    return out, tie


def window(fn: LibmFunction, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """W per input: K * 2^-52 * |y| + K * 2^-1074 (+ twice the double's absolute bound where it applies)."""
    k = fn.window_ulps
    w = k * 2.0**-52 * np.abs(y) + k * 2.0**-1074
    if fn.double_abs is not None:
        thr, a = fn.double_abs
        w = np.where(np.abs(x) >= thr, w + 2 * a, w)
    return w


def _rounded_ends(y: np.ndarray, w: np.ndarray, ftz: bool) -> tuple[np.ndarray, ...]:
    y = np.asarray(y, dtype=np.float64)
    with np.errstate(all="ignore"):
        lo = np.nextafter(y - w, -np.inf)  # directed: the rounded sum may lie inside the true interval
        hi = np.nextafter(y + w, np.inf)
    r, t0 = round_f64_to_f32(y)
    rl, tl = round_f64_to_f32(lo)
    rh, th = round_f64_to_f32(hi)
    if ftz:
        r, rl, rh = ftz_bits(r), ftz_bits(rl), ftz_bits(rh)
    both_zero = ((rl & 0x7FFFFFFF) == 0) & ((rh & 0x7FFFFFFF) == 0)
    amb = np.isfinite(y) & (((rl != rh) & ~both_zero) | tl | th)
    return r, t0, rl, rh, amb


def reference_with_window(y: np.ndarray, w: np.ndarray, ftz: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(RN32(y) bits, ambiguous mask): ambiguous where RN32 of y - W and y + W differ, or either end is a tie.

    ``ftz``: the three roundings are flushed (env cuda-ftz) before they are compared.
    """
    r, _, _, _, amb = _rounded_ends(y, w, ftz)
    return r, amb


def float64_tier(
    fn: LibmFunction, x_in: np.ndarray, x_read: np.ndarray, y: np.ndarray, ftz: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(reference bits, ambiguous mask, tie-rule mask) of the float64 tier, as the device computes it.

    ``x_in`` the input as given (for the window's range), ``x_read`` as the environment reads it (flushed
    under cuda-ftz), ``y`` the double function's value at ``x_read``. Where ``fn.tiny_tie`` applies (an exact
    tie ``y == c x`` at a tiny x) the known sign of the series remainder decides the rounding.
    """
    y = np.asarray(y, dtype=np.float64)
    r, t0, rl, rh, amb = _rounded_ends(y, window(fn, x_in, y), ftz)
    rule = np.zeros(y.shape, bool)
    if fn.tiny_tie is not None:
        big_t, c, direction = fn.tiny_tie
        xr = np.asarray(x_read, dtype=np.float64)
        with np.errstate(all="ignore"):
            rule = amb & t0 & (xr != 0) & (np.abs(xr) < big_t) & (y == c * xr)
        pick_lo = (y > 0) == (direction < 0)
        r = np.where(rule, np.where(pick_lo, rl, rh), r).astype(np.uint32)
        amb = amb & ~rule
    return r, amb, rule


def daz_bits(b: np.ndarray) -> np.ndarray:
    """Subnormal inputs read as a zero of their sign (env cuda-ftz)."""
    b = np.asarray(b, dtype=np.uint32)
    return np.where((b & 0x7F800000) == 0, b & 0x80000000, b).astype(np.uint32)


def ftz_bits(b: np.ndarray) -> np.ndarray:
    """Subnormal results flushed to a zero of their sign (env cuda-ftz)."""
    return daz_bits(b)


# -- MPFR tier ---------------------------------------------------------------------------------------------------


class SettlementError(RuntimeError):
    """MPFR could not decide the rounding of an input up to the precision limit."""


def _gmpy2() -> Any:
    try:
        import gmpy2
    except ImportError as exc:  # pragma: no cover - a test dependency
        raise SettlementError(f"gmpy2 is needed to settle ambiguous inputs: {exc}") from None
    return gmpy2


_NATIVE = {
    "exp": "exp",
    "exp2": "exp2",
    "exp10": "exp10",
    "expm1": "expm1",
    "log": "log",
    "log2": "log2",
    "log10": "log10",
    "log1p": "log1p",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "asin": "asin",
    "acos": "acos",
    "atan": "atan",
    "sinh": "sinh",
    "cosh": "cosh",
    "tanh": "tanh",
    "asinh": "asinh",
    "acosh": "acosh",
    "atanh": "atanh",
    "erf": "erf",
    "erfc": "erfc",
    "cbrt": "cbrt",
    "rsqrt": "rec_sqrt",
    "tgamma": "gamma",
    "j0": "j0",
    "j1": "j1",
    "y0": "y0",
    "y1": "y1",
}


def _native_value(ctx: Any, name: str, x: Any) -> Any:
    if name == "lgamma":
        return ctx.lgamma(x)[0]
    return getattr(ctx, _NATIVE[name])(x)


def _div(c: Any, a: Any, b: Any) -> Any:
    """a / b in context c (gmpy2 2.2's ``context.div`` ignores the context's precision)."""
    with c:
        return a / b


def round_mpfr_to_bits(v: Any) -> int:
    """binary32 bits of RN32(v) for an mpfr ``v``, by exact rational arithmetic (subnormals, overflow to inf)."""
    if v.is_nan():
        return 0x7FFFFFFF
    sign = 0x80000000 if v.is_signed() else 0
    if v.is_infinite():
        return sign | 0x7F800000
    if v.is_zero():
        return sign
    n, d = v.as_integer_ratio()
    n = abs(int(n))
    d = int(d)
    e = n.bit_length() - d.bit_length()  # 2^e <= n/d < 2^(e+2)
    if n < d << e if e >= 0 else (n << -e) < d:
        e -= 1
    while (n >= d << (e + 1)) if e + 1 >= 0 else ((n << -(e + 1)) >= d):
        e += 1
    q = max(e, -126) - 23  # exponent of one unit in the last place
    num, den = (n, d << q) if q >= 0 else (n << -q, d)
    r, rem = divmod(num, den)
    if 2 * rem > den or (2 * rem == den and r & 1):
        r += 1
    if r >= 1 << 24:
        r >>= 1  # exact: r == 2^24
        q += 1
    if r >= 1 << 23:
        biased = q + 23 + 127
        if biased >= 255:
            return sign | 0x7F800000
        return sign | (biased << 23) | (r - (1 << 23))
    return sign | r


def _sinpi_cospi(g: Any, name: str, x: Any, p: int) -> tuple[Any, bool]:
    """(value at precision p, exact): sin(pi x) or cos(pi x) after the exact reduction x mod 2."""
    ctx = g.context(precision=max(p, 300))
    r = ctx.fmod(x, 2)  # exact: x has 24 bits
    if name == "sinpi" and ctx.is_integer(r):
        return g.mpfr(0), True
    if name == "cospi" and ctx.is_integer(ctx.sub(r, g.mpfr("0.5"))):
        return g.mpfr(0), True
    # |r - zero of the function| >= 2^-26 for binary32 x: 64 extra bits in pi r keep the relative error < 2^-p
    wide = g.context(precision=p + 64)
    arg = wide.mul(wide.const_pi(), r)
    c = g.context(precision=p)
    return (c.sin(arg) if name == "sinpi" else c.cos(arg)), False


def _inverse_f(g: Any, name: str, c: Any, t: Any) -> Any:
    if name == "erfinv":
        return c.erf(t)
    if name == "erfcinv":
        return c.erfc(t)
    return _div(c, c.erfc(_div(c, c.minus(t), c.sqrt(2))), 2)


def _inverse_df(g: Any, name: str, c: Any, t: Any) -> Any:
    if name == "normcdfinv":
        return _div(c, c.exp(c.minus(_div(c, c.mul(t, t), 2))), c.sqrt(c.mul(2, c.const_pi())))
    k = c.mul(_div(c, 2, c.sqrt(c.const_pi())), c.exp(c.minus(c.mul(t, t))))
    return k if name == "erfinv" else c.minus(k)


def _initial_root(name: str, y: float) -> float:
    from statistics import NormalDist

    nd = NormalDist()
    try:
        if name == "erfinv":
            return y * math.sqrt(math.pi) / 2 if abs(y) < 1e-8 else nd.inv_cdf((1 + y) / 2) / math.sqrt(2)
        if name == "erfcinv":
            return -nd.inv_cdf(y / 2) / math.sqrt(2)
        return nd.inv_cdf(y)
    except (ValueError, OverflowError, ZeroDivisionError):
        return 0.0


def _invert(g: Any, name: str, y: Any, p: int) -> tuple[Any, Any]:
    """An interval [t - d, t + d] proven (with margins) to hold the root of F(t) = y, at precision p.

    F is erf (erfinv), erfc (erfcinv) or Phi (normcdfinv); Newton's method at precision p, then the bracket
    is checked at precision p + 40 with a relative margin of 2^-(p+20) on each F value.
    """
    ctx = g.context(precision=p)
    t = g.mpfr(_initial_root(name, float(y)), p)
    close = 0
    for _ in range(200):
        step = _div(ctx, ctx.sub(_inverse_f(g, name, ctx, t), y), _inverse_df(g, name, ctx, t))
        if step.is_nan() or step.is_infinite():
            raise _NotYet
        t = ctx.sub(t, step)
        if step == 0 or abs(step) <= abs(t) * g.mpfr(2) ** (-(p * 3) // 4):
            close += 1  # quadratic convergence: one more step reaches the working precision
            if close == 2:
                break
    d = abs(t) * g.mpfr(2, p) ** (-(p // 2)) + g.mpfr(2, p) ** (-p - 300)
    fine = g.context(precision=p + 40)
    lo, hi = fine.sub(t, d), fine.add(t, d)
    flo, fhi = _inverse_f(g, name, fine, lo), _inverse_f(g, name, fine, hi)
    m = fine.pow(2, -p - 20)
    if name == "erfcinv":  # decreasing
        ok = fine.mul(flo, fine.sub(1, m)) >= y >= fine.mul(fhi, fine.add(1, m))
    else:
        ok = fine.mul(flo, fine.add(1, m)) <= y <= fine.mul(fhi, fine.sub(1, m))
    if not ok:
        raise _NotYet
    return lo, hi


class _NotYet(Exception):
    pass


def _inputs(g: Any, xb: int, env: str) -> Any:
    if env == "cuda-ftz":
        xb = int(daz_bits(np.array([xb], np.uint32))[0])
    x = float(np.array([xb], np.uint32).view(np.float32)[0])
    return g.mpfr(x, 64), x


def _finish(bits: int, env: str) -> int:
    if env == "cuda-ftz":
        bits = int(ftz_bits(np.array([bits], np.uint32))[0])
    return bits


def _to_bits32(v: Any) -> int:
    f = float(v)
    if math.isnan(f):
        return 0x7FFFFFFF
    return int(np.array([f], np.float32).view(np.uint32)[0])


def _special(fn: LibmFunction, x: float) -> float | None:
    """Values at the edges of the inverse functions' domains (NaN/inf/0), where no root is sought."""
    name = fn.mp
    if math.isnan(x):
        return math.nan
    if name == "erfinv":
        return math.copysign(math.inf, x) if abs(x) == 1 else math.nan if abs(x) > 1 else (x if x == 0 else None)
    if name == "erfcinv":
        if x == 0:
            return math.inf
        if x == 2:
            return -math.inf
        if x < 0 or x > 2:
            return math.nan
        return 0.0 if x == 1 else None
    if name == "normcdfinv":
        if x == 0:
            return -math.inf
        if x == 1:
            return math.inf
        if x < 0 or x > 1:
            return math.nan
        return 0.0 if x == 0.5 else None
    if name == "rcbrt":
        if x == 0:
            return math.copysign(math.inf, x)
        if math.isinf(x):
            return math.copysign(0.0, x)
        return None
    if name == "rsqrt" and x == 0:
        return math.copysign(math.inf, x)  # IEEE 754 rSqrt(-0) = -inf (MPFR's rec_sqrt(-0) is +inf)
    if name == "normcdf" and math.isinf(x):
        return 1.0 if x > 0 else 0.0
    if name in ("sinpi", "cospi") and math.isinf(x):
        return math.nan
    return None


def mp_value(fn: LibmFunction, x: float, p: int = 160) -> tuple[Any, Any]:
    """An interval [lo, hi] (mpfr) holding f(x) exactly, of relative width about 2^-(p-12)."""
    g = _gmpy2()
    xm = g.mpfr(x, 64)
    sp = _special(fn, x)
    if sp is not None:
        v = g.mpfr(sp, 64)
        return v, v
    name = fn.mp
    if name in _NATIVE or name == "lgamma":
        lo = _native_value(g.context(precision=p, round=g.RoundDown), name, xm)
        hi = _native_value(g.context(precision=p, round=g.RoundUp), name, xm)
        return lo, hi
    while True:
        try:
            if name in ("erfinv", "erfcinv", "normcdfinv"):
                return _invert(g, name, xm, p)
            if name in ("sinpi", "cospi"):
                v, exact = _sinpi_cospi(g, name, xm, p)
            else:
                c = g.context(precision=p + 16)
                if name == "rcbrt":
                    v = _div(c, 1, c.cbrt(xm))
                elif name == "normcdf":
                    v = _div(c, c.erfc(_div(c, c.minus(xm), c.sqrt(2))), 2)
                else:
                    raise SettlementError(f"no MPFR form for {name!r}")
                exact = False
            if exact:
                return v, v
            c = g.context(precision=p + 32)
            e = c.mul(abs(v), c.pow(2, -p + 12))
            return c.sub(v, e), c.add(v, e)
        except _NotYet:
            p *= 2
            if p > 4096:
                raise SettlementError(f"{fn.name}: no root bracket at x={x!r} up to 4096 bits") from None


def settle(fn: LibmFunction, xb: int, env: str = "cuda") -> int:
    """The correctly rounded binary32 bits of ``fn`` at input bits ``xb`` under ``env`` (MPFR)."""
    g = _gmpy2()
    xm, x = _inputs(g, xb, env)
    ieee = g.ieee(32)
    sp = _special(fn, x)
    if sp is not None:
        return _finish(_to_bits32(sp), env)
    if fn.mp in _NATIVE or fn.mp == "lgamma":
        if math.isnan(x):
            return 0x7FFFFFFF
        return _finish(_to_bits32(_native_value(ieee, fn.mp, xm)), env)
    p = 96
    while p <= 4096:
        lo, hi = mp_value(fn, x, p)
        a, b = round_mpfr_to_bits(lo), round_mpfr_to_bits(hi)
        if a == b or ((a | b) & 0x7FFFFFFF) == 0:
            return _finish(b, env)
        p *= 2
    raise SettlementError(f"{fn.name}: rounding of x=0x{xb:08X} undecided at 4096 bits")


def abs_error_exceeds(fn: LibmFunction, xb: int, got_bits: int, bound: float, env: str = "cuda") -> bool:
    """Whether |got - f(x)| > bound, decided with MPFR (NaN must meet NaN; an infinity must equal its reference)."""
    g = _gmpy2()
    _, x = _inputs(g, xb, env)
    got = float(np.array([got_bits], np.uint32).view(np.float32)[0])
    lo, hi = mp_value(fn, x, 160)
    if lo.is_nan() or math.isnan(got):
        return not (lo.is_nan() and math.isnan(got))
    if lo.is_infinite() or math.isinf(got):
        return not (lo == hi == got)
    c = g.context(precision=256)
    gm = g.mpfr(got, 64)
    with c:
        err = max(abs(gm - lo), abs(hi - gm))
    return bool(err > bound)
