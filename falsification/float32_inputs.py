"""Hypothesis strategies and vectorised generators for binary32 operands.

Two layers, both public:

* Strategies for single values (``float32_bits``, ``special_bits``, ``testfloat_bits``, ``subnormal_bits``,
  ``nan_bits``) draw *bit patterns* as integers, so every encoding is reachable: signaling NaNs with any
  payload, both zeros, subnormals at both ends, the neighbours of 2^-126, values next to overflow, and
  exact rounding ties. ``hypothesis.strategies.floats(width=32)`` alone yields about 1% subnormals and no
  signaling NaN.
* Batches: :func:`batch_specs` draws a small :class:`BatchSpec` (seed, size, mix, a few explicit special
  elements, scalar operands, layout) that Hypothesis can shrink; :func:`generate_bits` expands it into
  millions of operands with integer-only array code (SplitMix64 counters), identical on NumPy and CuPy,
  so a seed replays bit-for-bit on either device. The expansion mixes uniform bit patterns, TestFloat-
  style exponent-class x significand-pattern operands, the special table, random subnormals, and
  correlated operand tuples (addition ties, multiplication ties, near-cancellation, fma-sensitive
  triples where ``z = -fl(x*y)`` exposes contraction). On CuPy the expansion is one fused CUDA kernel
  (:data:`GENERATE_SOURCE`, the same integer arithmetic written once in C++: one launch per batch instead of
  ~150 array operations); the array code stays the definition, and the test suite compiles the kernel's very
  source for the host and checks it bit for bit against the array code for every mix, arity and size class.

Example::

    from hypothesis import given
    from falsification import float32_inputs as fs

    @given(fs.float32_bits(), fs.float32_bits())
    def test_my_add(a, b): ...
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from hypothesis import strategies as st

__all__ = [
    "SPECIALS",
    "SPECIAL_BITS",
    "EXPONENT_CLASSES",
    "SIGNIFICAND_PATTERNS",
    "MIXES",
    "LAYOUTS",
    "special_bits",
    "nan_bits",
    "subnormal_bits",
    "testfloat_bits",
    "uniform_bits",
    "float32_bits",
    "sizes",
    "shapes",
    "broadcast_shapes",
    "BatchSpec",
    "batch_specs",
    "splitmix64",
    "generate_bits",
    "layout_arrays",
    "GENERATE_SOURCE",
    "FUSED_MAX_ARITY",
    "set_fused",
]

SPECIALS: dict[str, int] = {
    "+0": 0x00000000,
    "-0": 0x80000000,
    "+inf": 0x7F800000,
    "-inf": 0xFF800000,
    "qnan": 0x7FC00000,
    "-qnan": 0xFFC00000,
    "qnan_payload": 0x7FC12345,
    "qnan_max": 0x7FFFFFFF,
    "snan_min": 0x7F800001,
    "snan": 0x7FA00000,
    "snan_max": 0x7FBFFFFF,
    "-snan_payload": 0xFF812345,
    "min_subnormal": 0x00000001,
    "-min_subnormal": 0x80000001,
    "subnormal_2": 0x00000002,
    "max_subnormal": 0x007FFFFF,
    "-max_subnormal": 0x807FFFFF,
    "half_min_normal": 0x00400000,
    "min_normal": 0x00800000,
    "-min_normal": 0x80800000,
    "min_normal_next": 0x00800001,
    "max_finite": 0x7F7FFFFF,
    "-max_finite": 0xFF7FFFFF,
    "max_finite_prev": 0x7F7FFFFE,
    "2^127": 0x7F000000,
    "1": 0x3F800000,
    "-1": 0xBF800000,
    "1_next": 0x3F800001,
    "1_prev": 0x3F7FFFFF,
    "2": 0x40000000,
    "0.5": 0x3F000000,
    "3": 0x40400000,
    "2^-24": 0x33800000,
    "2^-23": 0x34000000,
    "2^24": 0x4B800000,
    "2^24+2": 0x4B800001,
    "1+2^-12": 0x3F800800,
    "pi": 0x40490FDB,
    "e": 0x402DF854,
    "exp_overflow": 0x42B17218,
    "exp_underflow": 0xC2CFF1B5,
}
SPECIAL_BITS: tuple[int, ...] = tuple(sorted(set(SPECIALS.values())))

# Biased exponents (TestFloat-style classes): zero/subnormal, 2^-126 and above, around 2^-24, around 1,
# around 2^24, the top finite exponents, and Inf/NaN.
EXPONENT_CLASSES: tuple[int, ...] = (
    0,
    1,
    2,
    102,
    103,
    104,
    125,
    126,
    127,
    128,
    129,
    150,
    151,
    152,
    253,
    254,
    255,
)


def _sig_patterns() -> tuple[int, ...]:
    full = (1 << 23) - 1
    pats = {0, 1, 2, 3, full, full - 1, full >> 1, 1 << 22, (1 << 22) | 1}
    for j in range(0, 23, 2):
        pats |= {1 << j, full ^ (1 << j), full ^ ((1 << j) - 1), (1 << j) - 1}
    return tuple(sorted(pats))


SIGNIFICAND_PATTERNS: tuple[int, ...] = _sig_patterns()

# Category weights out of 256 for the batch expansion: uniform, testfloat, special, subnormal, correlated.
MIXES: dict[str, tuple[int, int, int, int, int]] = {
    "balanced": (64, 80, 32, 40, 40),
    "uniform": (256, 0, 0, 0, 0),
    "subnormal": (32, 48, 16, 128, 32),
    "special": (16, 64, 112, 32, 32),
    "correlated": (32, 48, 16, 16, 144),
}

LAYOUTS: tuple[str, ...] = ("contiguous", "strided", "transposed", "broadcast")


# -- single-value strategies -----------------------------------------------------------------------


def special_bits() -> st.SearchStrategy[int]:
    """One of the named special encodings (zeros, infinities, every NaN kind, subnormal edges, ...)."""
    return st.sampled_from(SPECIAL_BITS)


def nan_bits(signaling: bool | None = None) -> st.SearchStrategy[int]:
    """A NaN of either sign with any payload; quiet only, signaling only, or either (None)."""
    lo, hi = {None: (1, (1 << 23) - 1), True: (1, (1 << 22) - 1), False: (1 << 22, (1 << 23) - 1)}[signaling]
    return st.builds(lambda s, p: (s << 31) | 0x7F800000 | p, st.integers(0, 1), st.integers(lo, hi))


def subnormal_bits() -> st.SearchStrategy[int]:
    """A subnormal of either sign, biased to both ends of the range."""
    sig = st.one_of(st.integers(1, 255), st.integers((1 << 23) - 256, (1 << 23) - 1), st.integers(1, (1 << 23) - 1))
    return st.builds(lambda s, m: (s << 31) | m, st.integers(0, 1), sig)


def testfloat_bits() -> st.SearchStrategy[int]:
    """TestFloat-style operand: sign x exponent class x significand pattern."""
    return st.builds(
        lambda s, e, m: (s << 31) | (e << 23) | m,
        st.integers(0, 1),
        st.sampled_from(EXPONENT_CLASSES),
        st.sampled_from(SIGNIFICAND_PATTERNS),
    )


def uniform_bits() -> st.SearchStrategy[int]:
    """Any 32-bit pattern, uniformly."""
    return st.integers(0, 0xFFFFFFFF)


def float32_bits(
    *, specials: bool = True, testfloat: bool = True, subnormals: bool = True, nans: bool = True
) -> st.SearchStrategy[int]:
    """binary32 bit patterns mixing specials, TestFloat classes, subnormals, NaNs and uniform bits."""
    parts = [uniform_bits()]
    parts += [special_bits()] if specials else []
    parts += [testfloat_bits()] if testfloat else []
    parts += [subnormal_bits()] if subnormals else []
    parts += [nan_bits()] if nans else []
    return st.one_of(*parts)


def sizes(max_size: int = 1 << 16) -> st.SearchStrategy[int]:
    """Batch sizes with the edge cases first: 0, 1, small odd, block-boundary +-1, and large."""
    edges = [s for s in (0, 1, 2, 3, 31, 255, 256, 257, 1023, 1025) if s <= max_size]
    return st.one_of(st.sampled_from(edges), st.integers(0, max_size), st.just(max_size))


def shapes(max_size: int = 1 << 16, max_dims: int = 3) -> st.SearchStrategy[tuple[int, ...]]:
    """Array shapes (including empty and single-element) whose size is at most ``max_size``."""
    side = max(1, int(max_size ** (1 / max_dims)))
    return st.one_of(
        st.builds(lambda n: (n,), sizes(max_size)),
        st.lists(st.integers(0, side), min_size=2, max_size=max_dims).map(tuple),
    )


def broadcast_shapes(shape: tuple[int, ...]) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes that broadcast against ``shape``: dimensions dropped from the left or set to 1."""
    if not shape:
        return st.just(())

    def make(drop: int, ones: list[bool]) -> tuple[int, ...]:
        kept = shape[drop:]
        return tuple(1 if o else d for d, o in zip(kept, ones, strict=False))

    return st.builds(
        make, st.integers(0, len(shape)), st.lists(st.booleans(), min_size=len(shape), max_size=len(shape))
    )


# -- batches ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchSpec:
    """What Hypothesis draws for one batch; :func:`generate_bits` expands it deterministically.

    ``explicit``: (position, operand bits) pairs written over the generated operands at position mod size.
    """

    seed: int
    size: int
    mix: str = "balanced"
    explicit: tuple[tuple[int, tuple[int, ...]], ...] = ()
    scalars: tuple[int, ...] = ()
    layout: str = "contiguous"

    def to_json(self) -> dict[str, Any]:
        """JSON form (bits as hex strings) for evidence and replay."""
        return {
            "seed": self.seed,
            "size": self.size,
            "mix": self.mix,
            "layout": self.layout,
            "explicit": [[p, [f"0x{b:08X}" for b in bits]] for p, bits in self.explicit],
            "scalars": [f"0x{b:08X}" for b in self.scalars],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BatchSpec:
        """The spec of :meth:`to_json`'s form."""
        return cls(
            seed=int(d["seed"]),
            size=int(d["size"]),
            mix=str(d["mix"]),
            explicit=tuple((int(p), tuple(int(b, 16) for b in bits)) for p, bits in d["explicit"]),
            scalars=tuple(int(b, 16) for b in d["scalars"]),
            layout=str(d["layout"]),
        )


def batch_specs(
    arity: int,
    n_scalars: int = 0,
    max_size: int = 1 << 16,
    max_explicit: int = 6,
    mixes: tuple[str, ...] = tuple(MIXES),
    layouts: tuple[str, ...] = ("contiguous",),
    scalar_bits: st.SearchStrategy[int] | None = None,
) -> st.SearchStrategy[BatchSpec]:
    """Batch specs for an ``arity``-operand op: shrink toward small sizes, few explicit elements, seed 0."""
    element = st.tuples(*[float32_bits() for _ in range(arity)])
    return st.builds(
        BatchSpec,
        seed=st.integers(0, 2**32 - 1),
        size=sizes(max_size),
        mix=st.sampled_from(mixes),
        explicit=st.lists(st.tuples(st.integers(0, max_size), element), max_size=max_explicit).map(tuple),
        scalars=st.tuples(*[float32_bits() if scalar_bits is None else scalar_bits for _ in range(n_scalars)]),
        layout=st.sampled_from(layouts),
    )


_M64 = (1 << 64) - 1


def splitmix64(x: Any) -> Any:
    """SplitMix64 finaliser on a uint64 array (wrap-around arithmetic), NumPy or CuPy."""
    xp = _ns(x)
    z = x + xp.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> xp.uint64(30))) * xp.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> xp.uint64(27))) * xp.uint64(0x94D049BB133111EB)
    return z ^ (z >> xp.uint64(31))


def _ns(a: Any) -> ModuleType:
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def _key(seed: int, stream: int) -> int:
    """A per-(seed, stream) 64-bit key: scalar SplitMix64 in Python ints."""
    z = (seed * 0x100000001B3 + stream * 0x9E3779B97F4A7C15 + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _pick(xp: ModuleType, table: tuple[int, ...], r: Any) -> Any:
    return xp.asarray(np.asarray(table, dtype=np.uint32))[(r % xp.uint64(len(table))).astype(xp.int64)]


def _single(xp: ModuleType, h: Any, g: Any, weights: tuple[int, ...]) -> Any:
    """Independent operand bits from two 64-bit hashes per element, by category weights."""
    u32 = lambda v: (v & xp.uint64(0xFFFFFFFF)).astype(xp.uint32)  # noqa: E731
    sel = (h >> xp.uint64(56)).astype(xp.int64)
    sign = (u32(g >> xp.uint64(63)) << xp.uint32(31)).astype(xp.uint32)
    uniform = u32(h)
    exp = _pick(xp, EXPONENT_CLASSES, g >> xp.uint64(8))
    sig = _pick(xp, SIGNIFICAND_PATTERNS, g >> xp.uint64(24))
    rand_sig = u32(g) & xp.uint32(0x7FFFFF)
    # a quarter of TestFloat operands take a random exponent / random significand
    exp = xp.where((g & xp.uint64(3)) == 0, u32(g >> xp.uint64(40)) & xp.uint32(0xFF), exp)
    sig = xp.where(((g >> xp.uint64(2)) & xp.uint64(3)) == 0, rand_sig, sig)
    testfloat = sign | (exp << xp.uint32(23)) | sig
    special = _pick(xp, SPECIAL_BITS, g >> xp.uint64(16))
    small = u32(g >> xp.uint64(8)) & xp.uint32(0xFF)
    sub_kind = (g >> xp.uint64(4)) & xp.uint64(3)
    subm = xp.where(
        sub_kind == 0,
        small + xp.uint32(1),
        xp.where(sub_kind == 1, xp.uint32(0x7FFFFF) - small, xp.maximum(rand_sig, xp.uint32(1))),
    )
    subnormal = sign | subm
    c = np.cumsum(weights)
    out = xp.where(
        sel < int(c[0]),
        uniform,
        xp.where(
            sel < int(c[1]),
            testfloat,
            xp.where(sel < int(c[2]), special, xp.where(sel < int(c[3]), subnormal, testfloat)),
        ),
    )
    return out.astype(xp.uint32)


def _correlate(xp: ModuleType, ops: list, row: Any, weights: tuple[int, ...]) -> list:
    """Overwrite a share of elements with correlated operand tuples (ties, cancellation, fma-sensitive)."""
    sel = (row >> xp.uint64(56)).astype(xp.int64)
    chosen = sel >= int(np.sum(weights[:4]))
    kind = (row >> xp.uint64(8)) & xp.uint64(3)
    j = ((row >> xp.uint64(16)) % xp.uint64(23) + xp.uint64(1)).astype(xp.uint32)  # 1..23
    e0 = (((row >> xp.uint64(24)) % xp.uint64(200)) + xp.uint64(30)).astype(xp.uint32)  # biased 30..229
    s0 = ((row >> xp.uint64(40)) & xp.uint64(1)).astype(xp.uint32) << xp.uint32(31)
    s1 = ((row >> xp.uint64(41)) & xp.uint64(1)).astype(xp.uint32) << xp.uint32(31)
    m0 = (row & xp.uint64(0x7FFFFF)).astype(xp.uint32)
    a = ops[0]
    # add tie: b is exactly half an ulp of a (a power of two 24 exponents below)
    tie_a = s0 | (e0 << xp.uint32(23)) | m0
    tie_b = s1 | ((e0 - xp.uint32(24)) << xp.uint32(23))
    # mul tie: (1 + 2^-j)(1 + 2^-(24-j)) = 1 + 2^-j + 2^-(24-j) + 2^-24, the last term half an ulp
    mt_a = s0 | (e0 << xp.uint32(23)) | (xp.uint32(1) << (xp.uint32(23) - j))
    mt_b = s1 | (xp.uint32(127) << xp.uint32(23)) | (xp.uint32(1) << xp.maximum(j, xp.uint32(1)) - xp.uint32(1))
    # near cancellation: b = -(a +- a few ulps)
    delta = ((row >> xp.uint64(48)) & xp.uint64(7)).astype(xp.uint32)
    near_b = (a ^ xp.uint32(0x80000000)) + delta
    new0 = xp.where(kind == 0, tie_a, xp.where(kind == 1, mt_a, a))
    new1 = xp.where(kind == 0, tie_b, xp.where(kind == 1, mt_b, near_b))
    out = [xp.where(chosen, new0, a).astype(xp.uint32)]
    if len(ops) >= 2:
        out.append(xp.where(chosen, new1, ops[1]).astype(xp.uint32))
    if len(ops) >= 3:
        # z = -fl(x*y): separately rounded x*y + z is (nearly) 0, a fused one is the product's rounding
        # error. Subnormal z is zeroed: such cases are covered elsewhere and the value stays simple.
        from spec.elementwise import bits_to_f64, f64_to_f32_bits  # flush-free on CuPy too

        with np.errstate(all="ignore"):
            prod = bits_to_f64(out[0]) * bits_to_f64(out[1])
            # A NaN product becomes the one quiet NaN (its payload would be the platform's NaN rule).
            p = xp.where(xp.isnan(prod), xp.uint32(0x7FC00000), f64_to_f32_bits(prod)) ^ xp.uint32(0x80000000)
        p = xp.where((p & xp.uint32(0x7F800000)) == 0, p & xp.uint32(0x80000000), p)
        out.append(xp.where(chosen & (kind >= 2), p, ops[2]).astype(xp.uint32))
    out += ops[len(out) :]
    return out


def generate_bits(spec: BatchSpec, arity: int, xp: ModuleType = np, size: int | None = None) -> list:
    """Expand ``spec`` into ``arity`` uint32 arrays of ``size`` (default spec.size) on ``xp``.

    Integer-only SplitMix64 counter arithmetic: the same spec gives the same bits on NumPy and CuPy.
    """
    n = spec.size if size is None else size
    weights = MIXES[spec.mix]
    if xp is not np and _FUSED["on"] and 0 < arity <= FUSED_MAX_ARITY:
        return _explicit(spec, _generate_fused(spec.seed, n, arity, weights, xp), n, arity)
    idx = xp.arange(n, dtype=xp.uint64)
    ops = []
    for k in range(arity):
        h = splitmix64(idx + xp.uint64(_key(spec.seed, 2 * k + 1)))
        g = splitmix64(idx + xp.uint64(_key(spec.seed, 2 * k + 2)))
        ops.append(_single(xp, h, g, weights))
    if weights[4] and n:
        ops = _correlate(xp, ops, splitmix64(idx + xp.uint64(_key(spec.seed, 99))), weights)
    return _explicit(spec, ops, n, arity)


def _explicit(spec: BatchSpec, ops: list, n: int, arity: int) -> list:
    """Write the spec's explicit elements over the generated operands (later entries win)."""
    if n:
        for pos, bits in spec.explicit:
            for k in range(arity):
                ops[k][pos % n] = bits[k % len(bits)]
    return ops


# -- the fused CUDA generator -------------------------------------------------------------------------

FUSED_MAX_ARITY = 4
_FUSED = {"on": True}


def set_fused(on: bool) -> None:
    """Use the fused CUDA generator for CuPy (True, the default) or the array code (False)."""
    _FUSED["on"] = bool(on)


def _table(name: str, values: tuple[int, ...]) -> str:
    body = ", ".join(f"0x{v:08X}u" for v in values)
    return f"KC_GEN_TABLE g_u32 {name}[{len(values)}] = {{{body}}};\n#define {name}_N {len(values)}ull\n"


# The array code's operations, in the same order and widths (u32(v) = low 32 bits; `%` on uint64).
GENERATE_SOURCE = (
    r"""
typedef unsigned int g_u32;
typedef unsigned long long g_u64;
#ifdef KC_GEN_HOST
#include <cmath>
#include <cstring>
#define KC_GEN_DEV static inline
#define KC_GEN_TABLE static const
static inline double kc_gen_bits_f64(g_u64 b) { double d; std::memcpy(&d, &b, 8); return d; }
static inline g_u64 kc_gen_f64_bits(double d) { g_u64 b; std::memcpy(&b, &d, 8); return b; }
static inline g_u32 kc_gen_f2u(float f) { g_u32 u; std::memcpy(&u, &f, 4); return u; }
static inline float kc_gen_d2f(double d) { return (float)d; }
static inline g_u32 kc_gen_rint_u32(double x) { return (g_u32)std::nearbyint(x); }  // x in [0, 2^23]
#else
#define KC_GEN_DEV __device__ __forceinline__
#define KC_GEN_TABLE __device__ const
KC_GEN_DEV double kc_gen_bits_f64(g_u64 b) { return __longlong_as_double((long long)b); }
KC_GEN_DEV g_u64 kc_gen_f64_bits(double d) { return (g_u64)__double_as_longlong(d); }
KC_GEN_DEV g_u32 kc_gen_f2u(float f) { return __float_as_uint(f); }
KC_GEN_DEV float kc_gen_d2f(double d) { return __double2float_rn(d); }
KC_GEN_DEV g_u32 kc_gen_rint_u32(double x) { return __double2uint_rn(x); }
#endif
"""
    + _table("KC_GEN_EXP", EXPONENT_CLASSES)
    + _table("KC_GEN_SIG", SIGNIFICAND_PATTERNS)
    + _table("KC_GEN_SPECIAL", SPECIAL_BITS)
    + r"""
KC_GEN_DEV g_u64 kc_gen_splitmix(g_u64 x) {
    g_u64 z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// _single: category by the top byte of h, operand fields from g.
KC_GEN_DEV g_u32 kc_gen_single(g_u64 h, g_u64 g, long long c0, long long c1, long long c2, long long c3) {
    const long long sel = (long long)(h >> 56);
    const g_u32 sign = ((g_u32)(g >> 63)) << 31;
    const g_u32 uniform = (g_u32)h;
    g_u32 e = KC_GEN_EXP[(g >> 8) % KC_GEN_EXP_N];
    g_u32 sig = KC_GEN_SIG[(g >> 24) % KC_GEN_SIG_N];
    const g_u32 rand_sig = ((g_u32)g) & 0x7FFFFFu;
    if ((g & 3ull) == 0ull) e = ((g_u32)(g >> 40)) & 0xFFu;
    if (((g >> 2) & 3ull) == 0ull) sig = rand_sig;
    const g_u32 testfloat = sign | (e << 23) | sig;
    const g_u32 special = KC_GEN_SPECIAL[(g >> 16) % KC_GEN_SPECIAL_N];
    const g_u32 small = ((g_u32)(g >> 8)) & 0xFFu;
    const g_u64 sub_kind = (g >> 4) & 3ull;
    const g_u32 subm =
        sub_kind == 0ull ? small + 1u : (sub_kind == 1ull ? 0x7FFFFFu - small : (rand_sig > 1u ? rand_sig : 1u));
    const g_u32 subnormal = sign | subm;
    if (sel < c0) return uniform;
    if (sel < c1) return testfloat;
    if (sel < c2) return special;
    return sel < c3 ? subnormal : testfloat;
}

// bits_to_f64: the exact binary64 value of binary32 bits (fields, no float32 operation: no flushing).
KC_GEN_DEV double kc_gen_f64(g_u32 x) {
    const g_u32 e = (x >> 23) & 0xFFu, f = x & 0x7FFFFFu;
    double v;
    if (e == 0xFFu) v = kc_gen_bits_f64(f ? 0x7FF8000000000000ull : 0x7FF0000000000000ull);
    else if (e == 0u) v = (double)f * kc_gen_bits_f64(0x36A0000000000000ull);  // 2^-149
    else v = kc_gen_bits_f64(((g_u64)(e - 127u + 1023u) << 52) | ((g_u64)f << 29));
    return (x >> 31) ? -v : v;
}

// f64_to_f32_bits (r not NaN): round to nearest-even, subnormal results by rint(|r| 2^149).
KC_GEN_DEV g_u32 kc_gen_f32_bits(double r) {
    const double a = r < 0.0 ? -r : r;
    const g_u32 sign = (g_u32)(kc_gen_f64_bits(r) >> 63) << 31;
    if (a < kc_gen_bits_f64(0x3810000000000000ull)) {  // 2^-126
        return sign | kc_gen_rint_u32(a * kc_gen_bits_f64(0x4940000000000000ull));  // 2^149, exact
    }
    return kc_gen_f2u(kc_gen_d2f(r));
}

// _correlate on one element's operands x[0..arity).
KC_GEN_DEV void kc_gen_correlate(g_u32* x, int arity, g_u64 row, long long c3) {
    const bool chosen = (long long)(row >> 56) >= c3;
    const g_u64 kind = (row >> 8) & 3ull;
    const g_u32 j = (g_u32)((row >> 16) % 23ull + 1ull);
    const g_u32 e0 = (g_u32)((row >> 24) % 200ull + 30ull);
    const g_u32 s0 = ((g_u32)((row >> 40) & 1ull)) << 31;
    const g_u32 s1 = ((g_u32)((row >> 41) & 1ull)) << 31;
    const g_u32 m0 = (g_u32)(row & 0x7FFFFFull);
    const g_u32 a = x[0];
    const g_u32 tie_a = s0 | (e0 << 23) | m0;
    const g_u32 tie_b = s1 | ((e0 - 24u) << 23);
    const g_u32 mt_a = s0 | (e0 << 23) | (1u << (23u - j));
    const g_u32 mt_b = s1 | (127u << 23) | (1u << ((j > 1u ? j : 1u) - 1u));
    const g_u32 near_b = (a ^ 0x80000000u) + (g_u32)((row >> 48) & 7ull);
    const g_u32 new0 = kind == 0ull ? tie_a : (kind == 1ull ? mt_a : a);
    const g_u32 new1 = kind == 0ull ? tie_b : (kind == 1ull ? mt_b : near_b);
    x[0] = chosen ? new0 : a;
    if (arity >= 2) x[1] = chosen ? new1 : x[1];
    if (arity >= 3) {
        const double prod = kc_gen_f64(x[0]) * kc_gen_f64(x[1]);
        g_u32 p = (prod != prod ? 0x7FC00000u : kc_gen_f32_bits(prod)) ^ 0x80000000u;
        if ((p & 0x7F800000u) == 0u) p &= 0x80000000u;
        if (chosen && kind >= 2ull) x[2] = p;
    }
}

KC_GEN_DEV void kc_gen_element(g_u64 i, int arity, const g_u64* keys, g_u64 kc, long long c0, long long c1,
                               long long c2, long long c3, int correlate, g_u32* x) {
    for (int k = 0; k < arity; ++k) {
        x[k] = kc_gen_single(kc_gen_splitmix(i + keys[2 * k]), kc_gen_splitmix(i + keys[2 * k + 1]), c0, c1, c2, c3);
    }
    if (correlate) kc_gen_correlate(x, arity, kc_gen_splitmix(i + kc), c3);
}

#ifndef KC_GEN_HOST
extern "C" __global__ void kc_generate_bits(long long n, int arity, g_u64 k0, g_u64 k1, g_u64 k2, g_u64 k3, g_u64 k4,
                                            g_u64 k5, g_u64 k6, g_u64 k7, g_u64 kc, long long c0, long long c1,
                                            long long c2, long long c3, int correlate, g_u32* out) {
    const g_u64 keys[8] = {k0, k1, k2, k3, k4, k5, k6, k7};
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        g_u32 x[4];
        kc_gen_element((g_u64)i, arity, keys, kc, c0, c1, c2, c3, correlate, x);
        for (int k = 0; k < arity; ++k) out[(long long)k * n + i] = x[k];
    }
}
#endif
"""
)


def generate_args(seed: int, n: int, arity: int, weights: tuple[int, ...]) -> tuple[list[int], int, list[int], int]:
    """(operand keys h0, g0, h1, g1, ... padded to 8, correlation key, cumulative weights c0..c3, correlate?)."""
    keys = [_key(seed, j) for j in range(1, 2 * arity + 1)] + [0] * (2 * FUSED_MAX_ARITY - 2 * arity)
    c = [int(v) for v in np.cumsum(weights)[:4]]
    return keys, _key(seed, 99), c, int(bool(weights[4]) and n > 0)


def _generate_fused(seed: int, n: int, arity: int, weights: tuple[int, ...], xp: ModuleType) -> list:
    """generate_bits' operands (before explicit elements) by the fused kernel: one launch."""
    from native.nvrtc import compile_function

    out = xp.empty((arity, n), dtype=xp.uint32)
    if n:
        fn = compile_function(GENERATE_SOURCE, "kc_generate_bits", "nvrtc-ieee")
        keys, kc, c, corr = generate_args(seed, n, arity, weights)
        blocks = min(max((n + 255) // 256, 1), 8192)
        args = (np.int64(n), np.int32(arity), *(np.uint64(k) for k in keys), np.uint64(kc))
        fn((blocks,), (256,), (*args, *(np.int64(v) for v in c), np.int32(corr), out))
    return [out[k] for k in range(arity)]


def layout_arrays(ops: list, layout: str, xp: ModuleType = np) -> list:
    """Views of the operand bit arrays in ``layout`` (same logical values, different memory layout).

    "strided": every other element of a buffer twice as long; "transposed": a column-major 2-D view;
    "broadcast": operands after the first become one row broadcast against a 2-D first operand.
    The flat, C-order, broadcast values are what the reference sees.
    """
    n = ops[0].shape[0]
    if layout == "contiguous" or n == 0:
        return ops
    if layout == "strided":
        out = []
        for a in ops:
            buf = xp.zeros(2 * n, dtype=xp.uint32)
            buf[::2] = a
            out.append(buf[::2])
        return out
    rows = next((r for r in (7, 5, 3, 2) if n % r == 0), 1)
    if layout == "transposed":
        return [xp.asfortranarray(a.reshape(rows, n // rows)) for a in ops]
    if layout == "broadcast":
        first = ops[0].reshape(rows, n // rows)
        return [first] + [a[: n // rows].reshape(1, n // rows) for a in ops[1:]]
    raise ValueError(f"unknown layout {layout!r}; known: {LAYOUTS}")
