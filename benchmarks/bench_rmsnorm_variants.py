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

# TILE with its rows loaded in KC_C column chunks (one cp.async group each, all issued at once): the fold of
# chunk c starts when chunk c has landed, while the later chunks are still in flight.
TILEC = r"""
#ifndef KC_R
#define KC_R 2
#endif
#ifndef KC_T
#define KC_T 256
#endif
#ifndef KC_C
#define KC_C 4
#endif
#define KC_FOLD4(v) acc = __fadd_rn(acc, __fmul_rn(v.x, v.x)); acc = __fadd_rn(acc, __fmul_rn(v.y, v.y)); \
    acc = __fadd_rn(acc, __fmul_rn(v.z, v.z)); acc = __fadd_rn(acc, __fmul_rn(v.w, v.w));
__device__ __forceinline__ void kc_wait_pending(unsigned n) {  // cp.async.wait_group takes an immediate
    switch (n) {
        case 0: asm volatile("cp.async.wait_group 0;\n" ::); break;
        case 1: asm volatile("cp.async.wait_group 1;\n" ::); break;
        case 2: asm volatile("cp.async.wait_group 2;\n" ::); break;
        case 3: asm volatile("cp.async.wait_group 3;\n" ::); break;
        case 4: asm volatile("cp.async.wait_group 4;\n" ::); break;
        case 5: asm volatile("cp.async.wait_group 5;\n" ::); break;
        case 6: asm volatile("cp.async.wait_group 6;\n" ::); break;
        default: asm volatile("cp.async.wait_group 7;\n" ::); break;
    }
}
extern "C" __global__ void __launch_bounds__(KC_T)
kc_rmsnorm_tilec(const float* __restrict__ x, const float* __restrict__ w, long long w_stride,
                 const float* __restrict__ eps, long long eps_stride, float* __restrict__ y, long long rows,
                 long long d) {
    extern __shared__ float4 sm4[];
    __shared__ float rsh[KC_R];
    const long long q = d >> 2, s4 = q + 1;
    const long long row0 = (long long)blockIdx.x * KC_R;
    const long long cw = (q + KC_C - 1) / KC_C;
    for (unsigned c = 0; c < KC_C; ++c) {
        const long long lo = c * cw, hi = min(q, lo + cw);
        #pragma unroll
        for (unsigned r = 0; r < KC_R; ++r) {
            const long long row = row0 + r;
            if (row < rows) {
                const float4* x4 = (const float4*)(x + row * d);
                for (long long j = lo + threadIdx.x; j < hi; j += KC_T) {
                    const unsigned dst = (unsigned)__cvta_generic_to_shared(sm4 + r * s4 + j);
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(x4 + j));
                }
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
    }
    const bool folds = threadIdx.x < KC_R && row0 + threadIdx.x < rows;
    const float4* rr = sm4 + (long long)threadIdx.x * s4;
    float acc = 0.0f;
    for (unsigned c = 0; c < KC_C; ++c) {
        kc_wait_pending(KC_C - 1 - c);
        __syncthreads();
        if (folds) {
            const long long lo = c * cw, hi = min(q, lo + cw);
            long long k = lo;
            #pragma unroll 4
            for (; k + 2 <= hi; k += 2) {
                const float4 a0 = rr[k], a1 = rr[k + 1];
                KC_FOLD4(a0) KC_FOLD4(a1)
            }
            if (k < hi) { const float4 a0 = rr[k]; KC_FOLD4(a0) }
        }
    }
    if (folds) {
        const long long row = row0 + threadIdx.x;
        const float ms = __fdiv_rn(acc, (float)d);
        const float v = __fadd_rn(ms, eps[row * eps_stride]);
        rsh[threadIdx.x] = (float)(1.0 / sqrt((double)v));
    }
    __syncthreads();
    #pragma unroll
    for (unsigned r = 0; r < KC_R; ++r) {
        const long long row = row0 + r;
        if (row < rows) {
            const float rr2 = rsh[r];
            for (long long j = threadIdx.x; j < q; j += KC_T) {
                const float4 a = sm4[r * s4 + j], g = ((const float4*)(w + row * w_stride))[j];
                float4 o;
                o.x = __fmul_rn(__fmul_rn(a.x, rr2), g.x);
                o.y = __fmul_rn(__fmul_rn(a.y, rr2), g.y);
                o.z = __fmul_rn(__fmul_rn(a.z, rr2), g.z);
                o.w = __fmul_rn(__fmul_rn(a.w, rr2), g.w);
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
    configs = [("tile", TILE, "kc_rmsnorm_tile", 1, r, t, 1) for r, t in ((2, 128), (2, 256), (3, 256), (4, 512))]
    configs += [
        ("tilec", TILEC, "kc_rmsnorm_tilec", 1, r, t, c)
        for r in (1, 2, 3, 4)
        for t in (128, 256, 512)
        for c in (2, 4, 8)
    ]
    for kind, src, name, asyn, r, t, c in configs:
        defs = f"#define KC_R {r}\n#define KC_T {t}\n#define KC_ASYNC {asyn}\n#define KC_C {c}\n"
        try:
            fn = compile_function(defs + src, name, fk.ROUTE)
        except Exception as e:  # noqa: BLE001
            print(kind, r, t, "compile failed", str(e)[:300])
            continue
        smem = 16 * (r * (q + 1) + 1)
        if smem > 227 * 1024 or not fk._prefer_shared(fn, smem):
            continue
        grid = -(-rows // r)
        y.fill(0)
        launch = lambda fn=fn, grid=grid, t=t, smem=smem: fn((grid,), (t,), args, shared_mem=smem)  # noqa: E731
        launch()
        same = bool(cupy.array_equal(y.view(cupy.uint32), ref.view(cupy.uint32)))
        ms = _time(cupy, launch)
        results.append((copy_ms / ms, kind, r, t, c, ms, same))
        print(f"{kind:6s} R={r:2d} T={t:4d} C={c} {ms:.4f} ms copy/ours {copy_ms / ms:.3f} bitwise={same}", flush=True)
    copy2 = _time(cupy, lambda: cupy.copyto(y, x))
    print(f"copy again {copy2:.4f} ms")
    # odd shapes: every variant config that won must agree bitwise on them too
    for rows2, d2 in ((7, 4), (33, 1028), (5, 12264), (1000, 2048)):
        x2 = cupy.asarray(rng.standard_normal((rows2, d2), dtype=np.float32))
        w2 = cupy.asarray(rng.standard_normal((d2,), dtype=np.float32))
        ref2 = fk.rmsnorm_cuda((gen, fast), x2, w2, eps)
        y2 = cupy.empty_like(x2)
        a2 = (x2, w2, np.int64(0), eps, np.int64(0), y2, np.int64(rows2), np.int64(d2))
        for r, t, c in ((2, 256, 4), (2, 256, 8), (3, 256, 4)):
            defs = f"#define KC_R {r}\n#define KC_T {t}\n#define KC_C {c}\n"
            fn = compile_function(defs + TILEC, "kc_rmsnorm_tilec", fk.ROUTE)
            smem = 16 * (r * (d2 // 4 + 1) + 1)
            fk._prefer_shared(fn, smem)
            fn((-(-rows2 // r),), (t,), a2, shared_mem=smem)
            print("odd", rows2, d2, r, t, c, bool(cupy.array_equal(y2.view(cupy.uint32), ref2.view(cupy.uint32))))
    results.sort(reverse=True)
    print("best:", results[:5])


if __name__ == "__main__":
    main()
