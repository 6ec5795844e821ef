"""The sweep's chunk comparison as one CUDA kernel: ULP distance, histogram, maximum and disagreement count.

Same semantics as ``falsification.sweep.compare_chunk`` (array ops), which the test suite checks it against
on edge and random bit patterns. Integer-only code, so the compile route's float flags do not matter.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = ["COMPARE_SOURCE", "compare_chunk_fused"]

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


@functools.cache
def _fused_kernel() -> Any:
    import cupy

    return cupy.RawKernel(COMPARE_SOURCE, "kc_sweep_compare")
