"""Reference semantics of the deterministic RNG family (SplitMix64 keyed by seed and counter).

Everything here is written independently of :mod:`native.rng`: SplitMix64 and the uniform map in Python
integers (no NumPy wrap-around; over arrays, :func:`splitmix64_words` and :func:`uniform_reference` use
32-bit limbs that never wrap and integer bit search, held to the scalar functions by tests/test_rng.py), the
mask and dropout through the integer softfloat, and the Box-Muller normal in extended precision. The native
kernels are checked against these functions.

Definitions (docs/rng.md):

* ``splitmix64(x)``: the SplitMix64 finaliser of ``x + 0x9e3779b97f4a7c15`` (uint64 wrap-around by design).
* ``key(seed, counter) = splitmix64(seed + counter)``; element ``i`` (row-major linear index) draws
  ``low32(splitmix64(key + draws * i + j))`` for ``j < draws`` (1 draw, 2 for Box-Muller).
* uniform (ours, [0, 1)): ``(u >> 8) * 2^-24`` -- exact in binary32, largest value ``1 - 2^-24``.
* uniform (kernel-families design): binary32 rounding of ``u * 2^-32`` -- equals 1.0 for
  ``u >= 4294967168`` (128 of 2^32 values); kept as :func:`design_uniform_bits` so the contract can refute it.
* mask: ``keep_prob > uniform`` (binary32 compare); dropout ``y = (x * mask) / keep_prob`` in binary32 ops.
* normal: ``u1 = fl64((r1 + 1) / 4294967297)``, ``t = fl64(fl64(2 pi) * r2 * 2^-32)``,
  ``z = sqrt(-2 ln u1) cos t`` evaluated exactly at those doubles and rounded once to binary32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spec import softfloat as sf

__all__ = [
    "MASK64",
    "GOLDEN",
    "MIX1",
    "MIX2",
    "ONE_BITS",
    "DESIGN_ONE_THRESHOLD",
    "TWO_PI",
    "DIVISOR_U1",
    "splitmix64",
    "key",
    "draw_words",
    "splitmix64_words",
    "bits_reference",
    "uniform_bits",
    "design_uniform_bits",
    "uniform_reference",
    "mask_reference",
    "dropout_reference",
    "NormalReference",
    "normal_reference",
    "symmetric_reference",
    "symmetric_moments",
]

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
ONE_BITS = 0x3F800000  # binary32 1.0
# The design's u * 2^-32 rounds to 1.0 from here on: 2^32 - 128 is the midpoint 1 - 2^-25, a tie to even (1.0).
DESIGN_ONE_THRESHOLD = (1 << 32) - 128
TWO_PI = 6.283185307179586  # fl64(2 pi): the pinned constant the kernels multiply by
DIVISOR_U1 = 4294967297.0  # 2^32 + 1, exact in binary64


def splitmix64(x: int) -> int:
    """SplitMix64 of one uint64 in Python integers (wrap-around by masking)."""
    z = (x + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def key(seed: int, counter: int) -> int:
    """The stream key of (seed, counter): splitmix64(seed + counter), uint64 wrap-around."""
    return splitmix64((seed + counter) & MASK64)


def draw_words(seed: int, counter: int, n: int, draws: int = 1) -> np.ndarray:
    """uint32 array [n, draws]: low32(splitmix64(key + draws * i + j)) for every element i and draw j."""
    k = key(seed, counter)
    offsets = np.arange(n * draws, dtype=np.uint64)  # draws * i + j, row-major
    return splitmix64_words(k, offsets).reshape(n, draws)


def splitmix64_words(base: int, offsets: np.ndarray) -> np.ndarray:
    """uint32 array: low32(splitmix64((base + o) mod 2^64)) for each offset o of a uint64 array.

    :func:`splitmix64` over whole arrays without relying on NumPy's uint64 wrap-around: every 64-bit value is
    held as two 32-bit limbs in uint64 lanes and each step keeps its intermediates below 2^64 (products of two
    32-bit limbs), masking explicitly where the definition wraps. tests/test_rng.py holds it to the scalar
    function, wrap-around included.
    """
    o = np.asarray(offsets, dtype=np.uint64).reshape(-1)
    base &= MASK64
    lo = (o & _L32) + np.uint64(base & 0xFFFFFFFF)
    hi = (o >> _S32) + np.uint64(base >> 32) + (lo >> _S32)
    hi, lo = _add64(hi & _L32, lo & _L32, GOLDEN)
    hi, lo = _mul64(*_xor_shift(hi, lo, 30), MIX1)
    hi, lo = _mul64(*_xor_shift(hi, lo, 27), MIX2)
    _, lo = _xor_shift(hi, lo, 31)
    return lo.astype(np.uint32)


_L32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


def _add64(hi: np.ndarray, lo: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) + c mod 2^64 on 32-bit limbs."""
    lo = lo + np.uint64(c & 0xFFFFFFFF)
    hi = hi + np.uint64(c >> 32) + (lo >> _S32)
    return hi & _L32, lo & _L32


def _xor_shift(hi: np.ndarray, lo: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
    """z ^ (z >> s) on 32-bit limbs, 0 < s < 32."""
    sh = np.uint64(s)
    return hi ^ (hi >> sh), lo ^ (((lo >> sh) | (hi << np.uint64(32 - s))) & _L32)


def _mul64(hi: np.ndarray, lo: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) * c mod 2^64 on 32-bit limbs: each partial product of two limbs is below 2^64."""
    ch, cl = np.uint64(c >> 32), np.uint64(c & 0xFFFFFFFF)
    p = lo * cl
    mid = ((hi * cl) & _L32) + ((lo * ch) & _L32) + (p >> _S32)
    return mid & _L32, p & _L32


def bits_reference(seed: int, counter: int, n: int) -> np.ndarray:
    """The raw uint32 words of n elements."""
    return draw_words(seed, counter, n)[:, 0]


def uniform_bits(u: int) -> int:
    """binary32 bits of (u >> 8) * 2^-24, built from the integer (exponent = bit length, no float used)."""
    u24 = (u & 0xFFFFFFFF) >> 8
    if u24 == 0:
        return 0
    e = u24.bit_length() - 1  # value = 2^(e - 24) * (u24 / 2^e), u24 / 2^e in [1, 2)
    return ((e - 24 + 127) << 23) | ((u24 << (23 - e)) & 0x7FFFFF)


def design_uniform_bits(u: int) -> int:
    """binary32 bits of the kernel-families design: u * 2^-32 rounded to nearest even (softfloat)."""
    r = int(sf.from_int(np.array([u & 0xFFFFFFFF], dtype=np.uint32), fmt=sf.BINARY32)[0])
    # Scaling by 2^-32 only lowers the exponent: every nonzero value stays >= 2^-32, a normal number.
    return r if r == 0 else r - (32 << 23)


def uniform_reference(words: np.ndarray) -> np.ndarray:
    """uint32 bits of the uniform of each raw word (:func:`uniform_bits` over an array, integers only)."""
    u24 = (np.asarray(words).ravel().astype(np.uint64) & _L32) >> np.uint64(8)
    # e = bit_length(u24) - 1 by a branch-free binary search over the 24 bits (no float used)
    e = np.zeros(u24.shape, dtype=np.int64)
    y = u24.copy()
    for s in (16, 8, 4, 2, 1):
        m = y >= np.uint64(1 << s)
        y = np.where(m, y >> np.uint64(s), y)
        e += m.astype(np.int64) * s
    frac = (u24 << (np.int64(23) - e).astype(np.uint64)) & np.uint64(0x7FFFFF)
    bits = ((e - 24 + 127).astype(np.uint64) << np.uint64(23)) | frac
    return np.where(u24 == 0, np.uint64(0), bits).astype(np.uint32)


def mask_reference(uniform: np.ndarray, keep_prob_bits: int) -> np.ndarray:
    """uint8 mask: 1 where keep_prob > uniform (binary32 compare by softfloat)."""
    p = np.full(uniform.shape, keep_prob_bits, dtype=np.uint32)
    return sf.lt(np.asarray(uniform, dtype=np.uint32), p).astype(np.uint8)


def dropout_reference(x_bits: np.ndarray, mask: np.ndarray, keep_prob_bits: int, env: str = "cuda") -> np.ndarray:
    """uint32 bits of (x * mask) / keep_prob in binary32 under ``env`` (mask as 0.0f / 1.0f)."""
    m = np.where(np.asarray(mask) != 0, np.uint32(ONE_BITS), np.uint32(0)).astype(np.uint32)
    p = np.full(m.shape, keep_prob_bits, dtype=np.uint32)
    return sf.div(sf.mul(np.asarray(x_bits, dtype=np.uint32), m, env=env), p, env=env)


@dataclass(frozen=True)
class NormalReference:
    """binary32 bits of the Box-Muller normal from extended precision, and which carrier computed it."""

    bits: np.ndarray
    carrier: str


def normal_reference(r1: np.ndarray, r2: np.ndarray) -> NormalReference | None:
    """Correctly rounded binary32 normal from the pinned doubles u1, t (None without an extended float type).

    x86 ``long double`` (64-bit significand) evaluates log, sqrt, cos to about 2^-62 relative; the result
    is then rounded once to binary32, which is the correctly rounded value except within ~2^-60 of a tie.
    """
    if np.finfo(np.longdouble).nmant < 60:
        return None
    r1 = np.asarray(r1, dtype=np.uint32).astype(np.float64)
    r2 = np.asarray(r2, dtype=np.uint32).astype(np.float64)
    u1 = (r1 + 1.0) / DIVISOR_U1  # pinned: one correctly rounded double division
    t = TWO_PI * (r2 * 2.0**-32)  # pinned: exact scaling, one correctly rounded double multiply
    ld = np.longdouble
    z = np.sqrt(ld(-2.0) * np.log(u1.astype(ld))) * np.cos(t.astype(ld))
    return NormalReference(z.astype(np.float32).view(np.uint32), "numpy longdouble (x87 80-bit)")


def symmetric_reference(uniform: np.ndarray, bound_bits: int, env: str = "cuda") -> np.ndarray:
    """uint32 bits of w = b * (2u - 1) by softfloat: the initializers' map of a uniform u to [-b, b]."""
    u = np.asarray(uniform, dtype=np.uint32)
    two = np.full(u.shape, 0x40000000, dtype=np.uint32)
    one = np.full(u.shape, ONE_BITS, dtype=np.uint32)
    s = sf.sub(sf.mul(two, u, env=env), one, env=env)
    return sf.mul(np.full(u.shape, bound_bits, dtype=np.uint32), s, env=env)


def symmetric_moments(bound_bits: int, log2_points: int = 24) -> tuple[float, float]:
    """(mean, variance) of w = fl(b (2u - 1)) over the uniforms u = k 2^-24 on a lattice of 2^log2_points k values.

    log2_points = 24 is every uniform the stream gives (exhaustive). 2u - 1 = (2k - 2^24) 2^-24 is exact and so is
    b (2u - 1) in binary64 (a 24-bit times a 25-bit significand); binary64 -> binary32 conversion rounds it once
    (RNE): that is w. RNE is sign-symmetric, so w(k) = -w(2^24 - k) and w(0) = -b: only k >= 2^23 is evaluated, the
    mean is exactly -b 2^-24 (the unpaired k = 0; on a coarser lattice -b 2^-log2_points) and the variance is formed
    in binary64 (error about 2^-40 relative).
    """
    b = float(np.uint32(bound_bits).view(np.float32))
    step = 1 << (24 - log2_points)
    k = np.arange(1 << 23, 1 << 24, step, dtype=np.int64)
    w = (b * ((2 * k - (1 << 24)).astype(np.float64) * 2.0**-24)).astype(np.float32).astype(np.float64)
    n = float(1 << log2_points)
    mean = -b / n
    return mean, float((2.0 * np.sum(w[1:] * w[1:]) + b * b) / n - mean * mean)
