"""Independent scalar oracles for spec.softfloat tests: exact rationals rounded by a simple routine.

Written separately from spec/softfloat/core.py on purpose (exact fractions n/d, per element, plain Python
ints) so that a shared mistake is unlikely. Only the Format constants are shared.
"""

from __future__ import annotations

import math
from fractions import Fraction

INEXACT, UNDERFLOW, OVERFLOW, DIVBYZERO, INVALID = 1, 2, 4, 8, 16
MODES = ("rne", "rna", "rtz", "rup", "rdn", "rto")


class Env:
    """Oracle-side environment description."""

    def __init__(self, ftz=False, daz=False, nan_policy="ieee", tininess="after"):
        self.ftz, self.daz, self.nan_policy, self.tininess = ftz, daz, nan_policy, tininess


IEEE = Env()


class Fmt:
    """Format constants computed directly from the widths."""

    def __init__(self, exp_bits, frac_bits):
        self.eb, self.f = exp_bits, frac_bits
        self.p = frac_bits + 1
        self.bias = 2 ** (exp_bits - 1) - 1
        self.emin, self.emax = 1 - self.bias, self.bias
        self.nbits = 1 + exp_bits + frac_bits
        self.sign = 2 ** (self.nbits - 1)
        self.inf = (2**exp_bits - 1) * 2**frac_bits
        self.qbit = 2 ** (frac_bits - 1)


def default_nan(F: Fmt, env: Env) -> int:
    if env.nan_policy == "cuda":
        return F.sign - 1
    n = F.inf | F.qbit
    return n | F.sign if env.nan_policy == "x86" else n


def decode(F: Fmt, x: int, env: Env = IEEE):
    """('nan', x) / ('inf', sign) / ('num', sign, Fraction magnitude)."""
    key = (F.eb, F.f, x, env.daz)
    r = _DECODED.get(key)
    if r is None:
        r = _DECODED[key] = _decode(F, x, env)
    return r


_DECODED: dict = {}


def _decode(F: Fmt, x: int, env: Env):
    s = x >> (F.nbits - 1)
    ef = (x >> F.f) & (2**F.eb - 1)
    fr = x & (2**F.f - 1)
    if ef == 2**F.eb - 1:
        return ("nan", x) if fr else ("inf", s)
    if ef == 0:
        if env.daz:
            return ("num", s, Fraction(0))
        return ("num", s, Fraction(fr) * Fraction(2) ** (F.emin - F.f))
    return ("num", s, Fraction(2**F.f + fr) * Fraction(2) ** (ef - F.bias - F.f))


def is_snan(F, x):
    return (x & (F.sign - 1)) > F.inf and not (x & F.qbit)


def nan_out(F, env, ops):
    """NaN result: first NaN operand quieted (ieee/x86) or canonical (cuda); invalid if any sNaN."""
    fl = INVALID if any(is_snan(F, o) for o in ops) else 0
    if env.nan_policy == "cuda":
        return default_nan(F, env), fl
    for o in ops:
        if (o & (F.sign - 1)) > F.inf:
            return o | F.qbit, fl
    raise AssertionError


def _round_int(n: int, d: int, sign: int, mode: str):
    """Round n/d (n >= 0, d > 0) to an integer in `mode`; return (integer, inexact)."""
    q, r = divmod(n, d)
    if r == 0:
        return q, False
    if mode == "rtz":
        return q, True
    if mode == "rto":
        return q | 1, True
    if mode == "rup":
        return q + (sign == 0), True
    if mode == "rdn":
        return q + (sign == 1), True
    if 2 * r > d:
        return q + 1, True
    if 2 * r < d:
        return q, True
    return (q + 1 if mode == "rna" or q % 2 else q), True


def _ge_pow2(N: int, e: int, k: int) -> bool:
    """N * 2**e >= 2**k for an integer N >= 1."""
    return N >= (1 << (k - e)) if k >= e else True


def round_value(F: Fmt, sign: int, q: Fraction, mode: str, env: Env = IEEE):
    """Round the exact magnitude q with sign to F; return (bits, flags). q == 0 gives a signed zero."""
    sbit = F.sign if sign else 0
    n, d = q.numerator, q.denominator
    if n == 0:
        return sbit, 0
    # E = floor(log2(q)): 2**E <= n/d < 2**(E+1)
    E = n.bit_length() - d.bit_length()
    if (n << max(-E, 0)) < (d << max(E, 0)):
        E -= 1

    def scaled(k):  # q * 2**-k as (numerator, denominator)
        return (n, d << k) if k >= 0 else (n << -k, d)

    # Bounded-range rounding: quantum 2**(max(E, emin) - f).
    eq = max(E, F.emin) - F.f
    N, inexact = _round_int(*scaled(eq), sign, mode)
    # Unbounded-exponent rounding to p bits decides overflow and tininess after rounding.
    Nu, _ = _round_int(*scaled(E - F.f), sign, mode)
    if _ge_pow2(Nu, E - F.f, F.emax + 1):
        to_inf = mode in ("rne", "rna") or (mode == "rup" and not sign) or (mode == "rdn" and sign)
        return sbit | (F.inf if to_inf else F.inf - 1), OVERFLOW | INEXACT
    if env.tininess == "after":
        tiny = not _ge_pow2(Nu, E - F.f, F.emin)
    else:
        tiny = E < F.emin
    if env.ftz and tiny:
        return sbit, UNDERFLOW | INEXACT
    fl = (INEXACT if inexact else 0) | (UNDERFLOW if tiny and inexact else 0)
    if N == 0:
        return sbit, fl
    if N >= 2**F.p:  # carry out of the significand
        N //= 2
        eq += 1
    if N < 2**F.f:  # subnormal (eq == emin - f)
        return sbit | N, fl
    return sbit | ((eq + F.f + F.bias) << F.f) | (N - 2**F.f), fl


def _zero_sum_sign(mode):
    return 1 if mode == "rdn" else 0


def add(F, a, b, mode, env=IEEE, negate_b=False):
    A, B = decode(F, a, env), decode(F, b, env)
    if A[0] == "nan" or B[0] == "nan":
        return nan_out(F, env, [a, b])
    bs = (B[1] ^ 1) if negate_b else B[1]
    if A[0] == "inf" and B[0] == "inf":
        return (default_nan(F, env), INVALID) if A[1] != bs else (A[1] * F.sign | F.inf, 0)
    if A[0] == "inf":
        return A[1] * F.sign | F.inf, 0
    if B[0] == "inf":
        return bs * F.sign | F.inf, 0
    x = (-A[2] if A[1] else A[2]) + (-B[2] if bs else B[2])
    if x == 0:
        s = A[1] if (A[1] == bs) else _zero_sum_sign(mode)
        return s * F.sign, 0
    return round_value(F, int(x < 0), abs(x), mode, env)


def sub(F, a, b, mode, env=IEEE):
    return add(F, a, b, mode, env, negate_b=True)


def mul(F, a, b, mode, env=IEEE):
    A, B = decode(F, a, env), decode(F, b, env)
    if A[0] == "nan" or B[0] == "nan":
        return nan_out(F, env, [a, b])
    s = A[1] ^ B[1]
    if A[0] == "inf" or B[0] == "inf":
        other = B if A[0] == "inf" else A
        if other[0] == "num" and other[2] == 0:
            return default_nan(F, env), INVALID
        return s * F.sign | F.inf, 0
    return round_value(F, s, A[2] * B[2], mode, env)


def div(F, a, b, mode, env=IEEE):
    A, B = decode(F, a, env), decode(F, b, env)
    if A[0] == "nan" or B[0] == "nan":
        return nan_out(F, env, [a, b])
    s = A[1] ^ B[1]
    if A[0] == "inf":
        return (default_nan(F, env), INVALID) if B[0] == "inf" else (s * F.sign | F.inf, 0)
    if B[0] == "inf":
        return s * F.sign, 0
    if B[2] == 0:
        return (default_nan(F, env), INVALID) if A[2] == 0 else (s * F.sign | F.inf, DIVBYZERO)
    return round_value(F, s, A[2] / B[2], mode, env)


def fma(F, a, b, c, mode, env=IEEE):
    A, B, C = decode(F, a, env), decode(F, b, env), decode(F, c, env)
    zero_inf = (A[0] == "inf" and B[0] == "num" and B[2] == 0) or (B[0] == "inf" and A[0] == "num" and A[2] == 0)
    if "nan" in (A[0], B[0], C[0]):
        r, fl = nan_out(F, env, [a, b, c])
        return r, fl | (INVALID if zero_inf else 0)
    if zero_inf:
        return default_nan(F, env), INVALID
    sp = A[1] ^ B[1]
    if A[0] == "inf" or B[0] == "inf":
        if C[0] == "inf" and C[1] != sp:
            return default_nan(F, env), INVALID
        return sp * F.sign | F.inf, 0
    if C[0] == "inf":
        return C[1] * F.sign | F.inf, 0
    p = A[2] * B[2]
    x = (-p if sp else p) + (-C[2] if C[1] else C[2])
    if x == 0:
        # The product is a zero of sign sp when it is zero; exact cancellation otherwise.
        s = sp if (sp == C[1]) else _zero_sum_sign(mode)
        return s * F.sign, 0
    return round_value(F, int(x < 0), abs(x), mode, env)


def sqrt(F, a, mode, env=IEEE):
    A = decode(F, a, env)
    if A[0] == "nan":
        return nan_out(F, env, [a])
    if A[0] == "inf":
        return (default_nan(F, env), INVALID) if A[1] else (F.inf, 0)
    if A[2] == 0:
        return A[1] * F.sign, 0
    if A[1]:
        return default_nan(F, env), INVALID
    # sqrt(q) = isqrt(q * 4**K) / 2**K plus a remainder; with K large, (s + 1/2) / 2**K stands for any
    # point strictly inside (s, s+1) / 2**K, and no rounding boundary falls inside that interval.
    K = 4 * (F.bias + F.p) + 8
    n, d = A[2].numerator, A[2].denominator
    s = math.isqrt(n * 4**K // d)
    exact = s * s * d == n * 4**K
    q = Fraction(s, 2**K) if exact else Fraction(2 * s + 1, 2 ** (K + 1))
    return round_value(F, 0, q, mode, env)


def value_of(F, x):
    """Float value (Python float) of a finite non-NaN pattern, for messages."""
    D = decode(F, x)
    if D[0] != "num":
        return D
    return float(-D[2] if D[1] else D[2])


# ---------------------------------------------------------------------------------------------------
# TestFloat-style operand generator (vectorised, NumPy)


def _sig_patterns(f: int):
    full = (1 << f) - 1
    pats = {0, 1, full, full - 1}
    for k in range(f):
        pats.add(1 << k)  # walking ones
        pats.add(full ^ (1 << k))  # walking zeros
        pats.add((full << k) & full)  # runs of leading ones
        pats.add((1 << k) - 1)  # runs of trailing ones
    return sorted(pats)


def testfloat_operands(n: int, nops: int, seed: int, fmt_exp_bits: int = 8, fmt_frac_bits: int = 23):
    """`nops` uint arrays of n bit patterns: exponent classes x significand patterns, near-equal exponents
    for cancellation, and uniform random bit patterns (a quarter of the elements)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    F = Fmt(fmt_exp_bits, fmt_frac_bits)
    dt = np.uint32 if F.nbits == 32 else np.uint64 if F.nbits > 32 else np.uint16
    emax_field = 2**F.eb - 1
    classes = sorted(
        {
            0,
            1,
            2,
            max(F.bias - F.p, 1),
            F.bias - 2,
            F.bias - 1,
            F.bias,
            F.bias + 1,
            F.bias + 2,
            min(F.bias + F.p, emax_field - 1),
            emax_field - 2,
            emax_field - 1,
            emax_field,
        }
    )
    pats = np.array(_sig_patterns(F.f), dtype=np.uint64)
    out = []
    prev_exp = None
    for _k in range(nops):
        sign = rng.integers(0, 2, n, dtype=np.uint64)
        exp = np.array(classes, dtype=np.int64)[rng.integers(0, len(classes), n)]
        exp = exp + rng.integers(-1, 2, n) * (rng.random(n) < 0.3)
        if prev_exp is not None:  # near-equal exponents make cancellation and tie cases frequent
            near = rng.random(n) < 0.35
            exp = np.where(near, prev_exp + rng.integers(-2, 3, n), exp)
        exp = np.clip(exp, 0, emax_field).astype(np.uint64)
        sig = np.where(
            rng.random(n) < 0.8,
            pats[rng.integers(0, pats.size, n)],
            rng.integers(0, 1 << F.f, n, dtype=np.uint64),
        )
        sig = np.where(rng.random(n) < 0.06, np.uint64(0), sig)  # zeros and infinities
        bits = (sign << np.uint64(F.nbits - 1)) | (exp << np.uint64(F.f)) | sig
        rnd = (
            rng.integers(0, 1 << F.nbits, n, dtype=np.uint64)
            if F.nbits < 64
            else rng.integers(0, 2**63, n, dtype=np.uint64)
        )
        bits = np.where(rng.random(n) < 0.25, rnd, bits)
        out.append(bits.astype(dt))
        prev_exp = exp.astype(np.int64)
    return out
