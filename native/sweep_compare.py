"""The sweep's chunk comparison as one CUDA kernel: ULP distance, histogram, maximum and disagreement count.

Same semantics as ``falsification.sweep.compare_chunk`` (array ops), which the test suite checks it against
on edge and random bit patterns. Integer-only code, so the compile route's float flags do not matter.

For the exact operations (sqrt, 1/x, x + c, x - c, x * c, x / c, neg, abs, relu) :func:`sweep_exact_chunk`
computes the reference inside the comparison kernel, so a chunk costs one pass over the kernel's output:
either by the float64 route (:data:`F64_ROUTE_SOURCE`: operands widened exactly, one IEEE binary64
operation, one rounding to binary32; exact by the double-rounding theorem since 53 >= 2 * 24 + 2, see
docs/elementwise.md) or by the softfloat kernels of :mod:`spec.softfloat.device`. Compiled through the
project's ``nvrtc-ieee`` route (no flushing, IEEE division and square root, no contraction).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from native.nvrtc import compile_function
from spec.softfloat import device as sfd
from spec.softfloat.env import FloatEnv

__all__ = [
    "COMPARE_SOURCE",
    "F64_ROUTE_SOURCE",
    "EXACT_SOURCE",
    "EXACT_OPS",
    "EXACT_ROUTES",
    "bit_patterns",
    "compare_chunk_fused",
    "exact_route_supports",
    "exact_source",
    "sweep_exact_chunk",
]

COMPARE_SOURCE = r"""
typedef unsigned long long u64;
__device__ __forceinline__ bool kc_is_nan(unsigned x) { return (x & 0x7FFFFFFFu) > 0x7F800000u; }
__device__ __forceinline__ long long kc_key(unsigned x) {
    long long mag = (long long)(x & 0x7FFFFFFFu);
    return (x & 0x80000000u) ? -mag : mag;  // +0 and -0 are one point
}
__device__ __forceinline__ u64 kc_dist(unsigned a, unsigned b) {
    bool na = kc_is_nan(a), nb = kc_is_nan(b);
    if (na && nb) return 0ull;
    if (na || nb) return 1ull << 32;  // NAN_MISMATCH
    long long d = kc_key(a) - kc_key(b);
    return (u64)(d < 0 ? -d : d);
}
__device__ __forceinline__ u64 kc_warp_sum(u64 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    return v;
}
__device__ __forceinline__ u64 kc_warp_max(u64 v) {
    for (int o = 16; o > 0; o >>= 1) { u64 w = __shfl_down_sync(0xFFFFFFFFu, v, o); v = w > v ? w : v; }
    return v;
}
// out: [hist0, hist1, hist2, hist3, hist_rest, disagreements, max_finite_ulp]
extern "C" __global__ void kc_sweep_compare(const unsigned* nat, const unsigned* ref, const unsigned* alt,
                                            long long n, u64 bound, int exact, u64* out) {
    u64 h[5] = {0, 0, 0, 0, 0}, bad = 0, mx = 0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned g = nat[i], r = ref[i];
        u64 d = kc_dist(g, r);
        if (alt) { u64 da = kc_dist(g, alt[i]); d = da < d ? da : d; }
        bool b = exact ? (g != r) : (d > bound);
        if (alt && bound == 0) b = b && (g != alt[i]);
        bad += b;
        bool finite = d < (1ull << 32);
        h[finite && d < 4 ? d : 4] += 1;
        if (finite && d > mx) mx = d;
    }
    for (int j = 0; j < 5; ++j) h[j] = kc_warp_sum(h[j]);
    bad = kc_warp_sum(bad);
    mx = kc_warp_max(mx);
    if ((threadIdx.x & 31) == 0) {
        for (int j = 0; j < 5; ++j) if (h[j]) atomicAdd(&out[j], h[j]);
        if (bad) atomicAdd(&out[5], bad);
        if (mx) atomicMax(&out[6], mx);
    }
}
"""


def compare_chunk_fused(nat: Any, ref: Any, alt: Any, bound: int, *, exact: bool) -> tuple[np.ndarray, int, int]:
    """:func:`falsification.sweep.compare_chunk` in one CUDA kernel (one pass over the chunk instead of ~30 array ops).

    Same semantics; the test suite checks the two against each other on edge and random bit patterns.
    """
    import cupy

    kernel = _fused_kernel()
    nat, ref = (cupy.ascontiguousarray(v).astype(cupy.uint32, copy=False) for v in (nat, ref))
    if alt is not None:
        alt = cupy.ascontiguousarray(alt).astype(cupy.uint32, copy=False)
    n = int(nat.size)
    out = cupy.zeros(7, dtype=cupy.uint64)
    if n:
        blocks = min(max((n + 255) // 256, 1), 4096)  # grid-stride: whole warps, no partial-warp shuffles
        kernel(
            (blocks,),
            (256,),
            (nat, ref, alt if alt is not None else 0, np.int64(n), np.uint64(bound), np.int32(exact), out),
        )
    got = out.get().astype(np.int64)
    return got[:5], int(got[6]), int(got[5])


_PATTERNS_SOURCE = r"""
extern "C" __global__ void kc_bit_patterns(unsigned int* out, unsigned int first, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = first + (unsigned int)i;  // the caller keeps first + n <= 2^32: no wrap
}
"""


def bit_patterns(first: int, n: int) -> Any:
    """The uint32 bit patterns first, first + 1, ..., first + n - 1 on the GPU (first + n <= 2^32).

    One raw kernel, not ``arange + first``: a CuPy ufunc's first call imports cupyx, and with it SciPy
    (~0.5 s of a fresh ``kc sweep``'s start-up on the device).
    """
    if not (0 <= first and 0 <= n and first + n <= 1 << 32):
        raise ValueError(f"bit patterns [{first}, {first + n}) leave the 32-bit range")
    import cupy

    out = cupy.empty(n, dtype=cupy.uint32)
    if n:
        _patterns_kernel()((min((n + 255) // 256, 8192),), (256,), (out, np.uint32(first), np.int64(n)))
    return out


@functools.cache
def _patterns_kernel() -> Any:
    import cupy

    return cupy.RawKernel(_PATTERNS_SOURCE, "kc_bit_patterns")


@functools.cache
def _fused_kernel() -> Any:
    import cupy

    return cupy.RawKernel(COMPARE_SOURCE, "kc_sweep_compare")


# Reference codes of the exact operations (x is the swept operand, c the fixed one).
EXACT_OPS: dict[str, int] = {"add": 0, "sub": 1, "mul": 2, "div": 3, "sqrt": 4, "inv": 5, "neg": 6, "abs": 7, "relu": 8}
EXACT_ROUTES: dict[str, int] = {"float64": 0, "softfloat": 1}

F64_ROUTE_SOURCE = r"""
// binary32 bits -> the same value in binary64, built from the fields (no float operation, so no flushing).
KC_DEV double kc_f32_to_f64(kc_u32 x) {
    const kc_u64 s = (kc_u64)(x >> 31) << 63;
    const int ef = (int)((x >> 23) & 0xFFu);
    kc_u32 f = x & 0x7FFFFFu;
    int e64;
    if (ef == 0xFF) {
        e64 = 2047;
    } else if (ef == 0) {
        if (f == 0u) return __longlong_as_double((long long)s);
        const int sh = kc_clz32(f) - 8;  // leading bit to bit 23
        f = (f << sh) & 0x7FFFFFu;
        e64 = 1 - 127 - sh + 1023;
    } else {
        e64 = ef - 127 + 1023;
    }
    return __longlong_as_double((long long)(s | ((kc_u64)e64 << 52) | ((kc_u64)f << 29)));
}

// The reference by the float64 route: NaN operands by the environment's NaN rule (integer code), otherwise
// one IEEE binary64 operation and one rounding to binary32 (exact: 53 >= 2*24 + 2), an invalid result
// becoming the environment's default NaN. neg/abs are sign-bit operations; relu compares in binary64.
KC_DEV kc_u32 kc_ref_f64(int op, kc_u32 x, kc_u32 c, const KcEnv& env) {
    if (op == 6) return x ^ KC_SIGN;
    if (op == 7) return x & KC_ABS;
    if (op == 8) {
        if (kc_isnan(x)) return kc_nan_result(x, x, 0u, 2, env);
        return kc_f32_to_f64(x) > 0.0 ? x : 0u;
    }
    const bool binary = op <= 3;
    if (kc_isnan(x) || (binary && kc_isnan(c))) return kc_nan_result(x, c, 0u, binary ? 2 : 1, env);
    const double a = kc_f32_to_f64(x), b = kc_f32_to_f64(c);
    double r;
    switch (op) {
    case 0: r = __dadd_rn(a, b); break;
    case 1: r = __dsub_rn(a, b); break;
    case 2: r = __dmul_rn(a, b); break;
    case 3: r = __ddiv_rn(a, b); break;
    case 4: r = __dsqrt_rn(a); break;
    default: r = __ddiv_rn(1.0, a); break;
    }
    if (r != r) return env.dn;
    return __float_as_uint(__double2float_rn(r));
}

// The reference by the softfloat kernels (the definition), same operation codes.
KC_DEV kc_u32 kc_ref_sf(int op, kc_u32 x, kc_u32 c, const KcEnv& env) {
    switch (op) {
    case 0: return kc_sf_add(x, c, 0, env);
    case 1: return kc_sf_add(x, c, 1, env);
    case 2: return kc_sf_mul(x, c, env);
    case 3: return kc_sf_div(x, c, env);
    case 4: return kc_sf_sqrt(x, env);
    case 5: return kc_sf_div(0x3F800000u, x, env);
    case 6: return x ^ KC_SIGN;
    case 7: return x & KC_ABS;
    default:
        if (kc_isnan(x)) return kc_nan_result(x, x, 0u, 2, env);
        return ((x & KC_SIGN) == 0u && x != 0u) ? x : 0u;
    }
}
"""

EXACT_SOURCE = (
    sfd.SOURCE
    + F64_ROUTE_SOURCE
    + COMPARE_SOURCE
    + r"""
// out as kc_sweep_compare's; ref_out (optional) receives the reference bits (counterexample recovery).
// KC_SWEEP_OP and KC_SWEEP_ROUTE are defined per build: only the one reference is compiled.
extern "C" __global__ void kc_sweep_exact(const unsigned* nat, const unsigned* xs, long long n, unsigned c, int rnd,
                                          int ftz, int daz, int nanc, int tin, unsigned dn, unsigned* ref_out,
                                          u64* out) {
    const KcEnv env = {rnd, ftz, daz, nanc, tin, dn};
    const int op = KC_SWEEP_OP, route = KC_SWEEP_ROUTE;
    u64 h[5] = {0, 0, 0, 0, 0}, bad = 0, mx = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const unsigned x = xs[i];
        const unsigned r = route == 0 ? kc_ref_f64(op, x, c, env) : kc_ref_sf(op, x, c, env);
        if (ref_out) ref_out[i] = r;
        const unsigned g = nat[i];
        const u64 d = kc_dist(g, r);
        bad += (g != r);
        const bool finite = d < (1ull << 32);
        h[finite && d < 4 ? d : 4] += 1;
        if (finite && d > mx) mx = d;
    }
    for (int j = 0; j < 5; ++j) h[j] = kc_warp_sum(h[j]);
    bad = kc_warp_sum(bad);
    mx = kc_warp_max(mx);
    if ((threadIdx.x & 31) == 0) {
        for (int j = 0; j < 5; ++j) if (h[j]) atomicAdd(&out[j], h[j]);
        if (bad) atomicAdd(&out[5], bad);
        if (mx) atomicMax(&out[6], mx);
    }
}
"""
)


def exact_source(op: str, route: str) -> str:
    """The comparison kernel's source computing ``op``'s reference by ``route`` (one reference per build)."""
    return f"#define KC_SWEEP_OP {EXACT_OPS[op]}\n#define KC_SWEEP_ROUTE {EXACT_ROUTES[route]}\n" + EXACT_SOURCE


def exact_route_supports(op: str, route: str, env: FloatEnv) -> bool:
    """Whether :func:`sweep_exact_chunk` realises reference ``op`` by ``route`` under ``env``.

    The float64 route models no flushing (binary32 subnormals are exact binary64 normals, and the one
    rounding to binary32 keeps subnormal results), so it serves the non-flushing environments only; relu's
    comparison with zero is written for them too. The softfloat route serves every environment otherwise.
    """
    if op not in EXACT_OPS or route not in EXACT_ROUTES:
        return False
    if route == "float64" or op == "relu":
        return not (env.ftz or env.daz)
    return True


def sweep_exact_chunk(
    nat: Any, x: Any, op: str, c: int, route: str, env: FloatEnv, *, want_reference: bool = False
) -> tuple[np.ndarray, int, int, Any]:
    """(histogram, max finite ULP, disagreements, reference bits or None) of one chunk, bitwise comparison.

    The reference of ``op`` on inputs ``x`` (with fixed operand bits ``c``) is computed inside the comparison
    kernel by ``route`` ("float64" or "softfloat") in round-to-nearest-even under ``env``.
    """
    import cupy

    if not exact_route_supports(op, route, env):
        raise ValueError(f"the fused {route} reference does not cover {op} under env {env.name}")
    fn = compile_function(exact_source(op, route), "kc_sweep_exact", "nvrtc-ieee")
    nat = cupy.ascontiguousarray(nat).view(cupy.uint32)
    x = cupy.ascontiguousarray(x).view(cupy.uint32)
    n = int(nat.size)
    out = cupy.zeros(7, dtype=cupy.uint64)
    ref = cupy.empty(n, dtype=cupy.uint32) if want_reference else None
    if n:
        rnd, ftz, daz, nanc, tin, dn = sfd.env_args("rne", env)
        blocks = min(max((n + 255) // 256, 1), 8192)
        fn(
            (blocks,),
            (256,),
            (
                nat,
                x,
                np.int64(n),
                np.uint32(c),
                np.int32(rnd),
                np.int32(ftz),
                np.int32(daz),
                np.int32(nanc),
                np.int32(tin),
                np.uint32(dn),
                ref if ref is not None else 0,
                out,
            ),
        )
    got = out.get().astype(np.int64)
    return got[:5], int(got[6]), int(got[5]), ref
