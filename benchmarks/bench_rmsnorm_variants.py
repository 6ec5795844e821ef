"""RMSNorm kernel variants against the device's copy bandwidth (one run, CUDA events, median of 20 after warm-up).

Prints, for (T, D) = (8192, 4096) float32, each variant's time, its ratio copy/variant and whether its output is
bit-identical to the shipped kernel's (every variant folds x*x left to right, so all must agree bit for bit).

    python benchmarks/bench_rmsnorm_variants.py [--rows 8192] [--d 4096]
"""

from __future__ import annotations

import argparse

import numpy as np

# Non-persistent: block b stages rows b*R .. b*R+R-1 in shared memory (cp.async when KC_ASYNC), lanes 0..R-1 of
# warp 0 fold them, every thread writes; several blocks per SM overlap one block's fold with others' traffic.
TILE = r"""
#ifndef KC_R
#define KC_R 4
#endif
#ifndef KC_T
#define KC_T 256
#endif
#define KC_FOLD4(v) acc = __fadd_rn(acc, __fmul_rn(v.x, v.x)); acc = __fadd_rn(acc, __fmul_rn(v.y, v.y)); \
    acc = __fadd_rn(acc, __fmul_rn(v.z, v.z)); acc = __fadd_rn(acc, __fmul_rn(v.w, v.w));
extern "C" __global__ void __launch_bounds__(KC_T)
kc_rmsnorm_tile(const float* __restrict__ x, const float* __restrict__ w, long long w_stride,
                const float* __restrict__ eps, long long eps_stride, float* __restrict__ y, long long rows,
                long long d) {
    extern __shared__ float4 sm4[];
    __shared__ float rsh[KC_R];
    const long long q = d >> 2, s4 = q + 1;
    const long long row0 = (long long)blockIdx.x * KC_R;
    #pragma unroll
    for (unsigned r = 0; r < KC_R; ++r) {
        const long long row = row0 + r;
        if (row < rows) {
            const float4* x4 = (const float4*)(x + row * d);
            for (long long j = threadIdx.x; j < q; j += KC_T) {
#if KC_ASYNC
                const unsigned dst = (unsigned)__cvta_generic_to_shared(sm4 + r * s4 + j);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(x4 + j));
#else
                sm4[r * s4 + j] = x4[j];
#endif
            }
        }
    }
#if KC_ASYNC
    asm volatile("cp.async.wait_all;\n" ::);
#endif
    __syncthreads();
    if (threadIdx.x < KC_R && row0 + threadIdx.x < rows) {
        const long long row = row0 + threadIdx.x;
        const float4* rr = sm4 + (long long)threadIdx.x * s4;
        float acc = 0.0f;
        float4 a0 = rr[0], a1 = rr[1];
        const float4* p = rr + 2;
        unsigned left = (unsigned)q;
        #pragma unroll 2
        for (; left >= 2; left -= 2, p += 2) {
            const float4 b0 = p[0], b1 = p[1];
            KC_FOLD4(a0) KC_FOLD4(a1)
            a0 = b0;
            a1 = b1;
        }
        if (left) { KC_FOLD4(a0) }
        const float ms = __fdiv_rn(acc, (float)d);
        const float v = __fadd_rn(ms, eps[row * eps_stride]);
        rsh[threadIdx.x] = (float)(1.0 / sqrt((double)v));
    }
    __syncthreads();
    #pragma unroll
    for (unsigned r = 0; r < KC_R; ++r) {
        const long long row = row0 + r;
        if (row < rows) {
            const float rr = rsh[r];
            for (long long j = threadIdx.x; j < q; j += KC_T) {
                const float4 a = sm4[r * s4 + j], g = ((const float4*)(w + row * w_stride))[j];
                float4 o;
                o.x = __fmul_rn(__fmul_rn(a.x, rr), g.x);
                o.y = __fmul_rn(__fmul_rn(a.y, rr), g.y);
                o.z = __fmul_rn(__fmul_rn(a.z, rr), g.z);
                o.w = __fmul_rn(__fmul_rn(a.w, rr), g.w);
                ((float4*)(y + row * d))[j] = o;
            }
        }
    }
}
"""

# Thread per row straight from global memory (8 float4 in flight per lane), then every thread re-reads x (L2).
DIRECT = r"""
#ifndef KC_R
#define KC_R 8
#endif
#ifndef KC_T
#define KC_T 256
#endif
#define KC_FOLD4(v) acc = __fadd_rn(acc, __fmul_rn(v.x, v.x)); acc = __fadd_rn(acc, __fmul_rn(v.y, v.y)); \
    acc = __fadd_rn(acc, __fmul_rn(v.z, v.z)); acc = __fadd_rn(acc, __fmul_rn(v.w, v.w));
extern "C" __global__ void __launch_bounds__(KC_T)
kc_rmsnorm_direct(const float* __restrict__ x, const float* __restrict__ w, long long w_stride,
                  const float* __restrict__ eps, long long eps_stride, float* __restrict__ y, long long rows,
                  long long d) {
    __shared__ float rsh[KC_R];
    const long long q = d >> 2;
    const long long row0 = (long long)blockIdx.x * KC_R;
    if (threadIdx.x < KC_R && row0 + threadIdx.x < rows) {
        const long long row = row0 + threadIdx.x;
        const float4* p = (const float4*)(x + row * d);
        float acc = 0.0f;
        long long c = 0;
        for (; c + 8 <= q; c += 8) {
            float4 a[8];
            #pragma unroll
            for (int k = 0; k < 8; ++k) a[k] = __ldg(p + c + k);
            #pragma unroll
            for (int k = 0; k < 8; ++k) { KC_FOLD4(a[k]) }
        }
        for (; c < q; ++c) { const float4 a = p[c]; KC_FOLD4(a) }
        const float ms = __fdiv_rn(acc, (float)d);
        const float v = __fadd_rn(ms, eps[row * eps_stride]);
        rsh[threadIdx.x] = (float)(1.0 / sqrt((double)v));
    }
    __syncthreads();
    #pragma unroll
    for (unsigned r = 0; r < KC_R; ++r) {
        const long long row = row0 + r;
        if (row < rows) {
            const float rr = rsh[r];
            for (long long j = threadIdx.x; j < q; j += KC_T) {
                const float4 a = ((const float4*)(x + row * d))[j], g = ((const float4*)(w + row * w_stride))[j];
                float4 o;
                o.x = __fmul_rn(__fmul_rn(a.x, rr), g.x);
                o.y = __fmul_rn(__fmul_rn(a.y, rr), g.y);
                o.z = __fmul_rn(__fmul_rn(a.z, rr), g.z);
                o.w = __fmul_rn(__fmul_rn(a.w, rr), g.w);
                ((float4*)(y + row * d))[j] = o;
            }
        }
    }
}
"""


def _time(cupy, fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(a, b))
    return float(np.median(ts))


def main() -> None:
    """Time every variant and print copy/variant and bit-agreement with the shipped kernel."""
    import cupy

    from native import fusion_kernels as fk
    from native.nvrtc import compile_function

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--d", type=int, default=4096)
    a = ap.parse_args()
    rows, d = a.rows, a.d
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((rows, d), dtype=np.float32))
    w = cupy.asarray(rng.standard_normal((d,), dtype=np.float32))
    eps = cupy.full((1,), np.float32(1e-6), dtype=cupy.float32)
    y = cupy.empty_like(x)
    copy_ms = _time(cupy, lambda: cupy.copyto(y, x))
    print(f"device {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()} rows {rows} d {d}")
    print(f"copy {copy_ms:.4f} ms ({2 * x.nbytes / copy_ms / 1e6:.0f} GB/s)")
    gen = compile_function(*fk.rmsnorm_source(), fk.ROUTE)
    fast = compile_function(*fk.SOURCES["rmsnorm_rows"], fk.ROUTE)
    ref = fk.rmsnorm_cuda((gen, fast), x, w, eps)
    cupy.cuda.Device().synchronize()
    print("shipped choice", fk.rmsnorm_choice(rows, d))
    shipped_ms = _time(cupy, lambda: fk.rmsnorm_cuda((gen, fast), x, w, eps, out=y))
    print(f"shipped {shipped_ms:.4f} ms  copy/ours {copy_ms / shipped_ms:.3f}")
    q = d // 4
    args = (x, w, np.int64(0), eps, np.int64(0), y, np.int64(rows), np.int64(d))
    results = []
    for kind, src, name in (("tile", TILE, "kc_rmsnorm_tile"), ("direct", DIRECT, "kc_rmsnorm_direct")):
        for asyn in (0, 1) if kind == "tile" else (0,):
            for r in (1, 2, 3, 4, 6, 8, 12, 16) if kind == "tile" else (4, 8, 16, 32):
                for t in (128, 256, 512, 1024):
                    defs = f"#define KC_R {r}\n#define KC_T {t}\n#define KC_ASYNC {asyn}\n"
                    try:
                        fn = compile_function(defs + src, name, fk.ROUTE)
                    except Exception as e:  # noqa: BLE001
                        print(kind, r, t, "compile failed", str(e)[:200])
                        continue
                    smem = 16 * (r * (q + 1) + 1) if kind == "tile" else 0
                    if smem > 227 * 1024 or not fk._prefer_shared(fn, smem):
                        continue
                    grid = -(-rows // r)
                    y.fill(0)
                    launch = lambda fn=fn, grid=grid, t=t, smem=smem: fn((grid,), (t,), args, shared_mem=smem)  # noqa: E731
                    launch()
                    same = bool(cupy.array_equal(y.view(cupy.uint32), ref.view(cupy.uint32)))
                    ms = _time(cupy, launch)
                    results.append((copy_ms / ms, kind, asyn, r, t, ms, same))
                    print(
                        f"{kind:6s} async={asyn} R={r:2d} T={t:4d} {ms:.4f} ms copy/ours {copy_ms / ms:.3f} bitwise={same}",
                        flush=True,
                    )
    results.sort(reverse=True)
    print("best:", results[:5])


if __name__ == "__main__":
    main()
