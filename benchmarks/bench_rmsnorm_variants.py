"""The fused RMSNorm kernels against the device's copy bandwidth (one run, CUDA events, median of 20 after warm-up).

Times, for (T, D) = (8192, 4096) float32 by default: ``cupy.copyto`` of the same array (the peer), the shipped
launcher (``native.fusion_kernels.rmsnorm_cuda``, its kernel chosen by timing), the general kernel, and the rows
kernel's source compiled with other rows-per-block (``KC_R``) and threads-per-block (``KC_T``) than it ships with;
prints copy/variant and whether each variant's output is bit-identical to the launcher's (every variant folds x*x
left to right, so all must agree bit for bit). How the shipped (KC_R, KC_T) = (2, 256) was chosen; on an H100
(2026-11-23) it gave copy/ours 0.84 where the former 10-rows-per-block kernel gave 0.48.

    python benchmarks/bench_rmsnorm_variants.py [--rows 8192] [--d 4096]
"""

from __future__ import annotations

import argparse

import numpy as np

# Persistent, double-buffered: block b takes tiles b, b + grid, ...; tile t + grid is copied (cp.async) into the other
# slot while tile t folds, so loads never wait for a fold (the non-persistent rows kernel's blocks start, load, fold
# and write in lockstep waves across the GPU).
PIPE = r"""
#ifndef KC_R
#define KC_R 2
#endif
#ifndef KC_T
#define KC_T 256
#endif
#define KC_COPY16(dst, src) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" \
    :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src))
#define KC_COPY_COMMIT() asm volatile("cp.async.commit_group;\n" ::)
#define KC_COPY_WAIT1() asm volatile("cp.async.wait_group 1;\n" ::)
#define KC_FOLD4(v) acc = __fadd_rn(acc, __fmul_rn(v.x, v.x)); acc = __fadd_rn(acc, __fmul_rn(v.y, v.y)); \
    acc = __fadd_rn(acc, __fmul_rn(v.z, v.z)); acc = __fadd_rn(acc, __fmul_rn(v.w, v.w));
extern "C" __global__ void __launch_bounds__(KC_T)
kc_rmsnorm_pipe(const float* __restrict__ x, const float* __restrict__ w, long long w_stride,
                const float* __restrict__ eps, long long eps_stride, float* __restrict__ y, long long rows,
                long long d) {
    extern __shared__ float4 sm4[];
    __shared__ float rsh[KC_R];
    const long long q = d >> 2, s4 = q + 1, slot4 = KC_R * s4 + 1;
    const long long tiles = (rows + KC_R - 1) / KC_R, g = gridDim.x;
    long long t = blockIdx.x;
    #pragma unroll
    for (unsigned k = 0; k < 2; ++k) {
        const long long tt = t + k * g;
        if (tt < tiles) {
            #pragma unroll
            for (unsigned r = 0; r < KC_R; ++r) {
                const long long row = tt * KC_R + r;
                if (row < rows) {
                    const float4* x4 = (const float4*)(x + row * d);
                    for (long long j = threadIdx.x; j < q; j += KC_T) KC_COPY16(sm4 + k * slot4 + r * s4 + j, x4 + j);
                }
            }
        }
        KC_COPY_COMMIT();
    }
    for (unsigned i = 0; t < tiles; ++i, t += g) {
        const float4* sl = sm4 + (i & 1) * slot4;
        KC_COPY_WAIT1();
        __syncthreads();
        if (threadIdx.x < KC_R && t * KC_R + threadIdx.x < rows) {
            const long long row = t * KC_R + threadIdx.x;
            const float4* rr = sl + (long long)threadIdx.x * s4;
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
            const long long row = t * KC_R + r;
            if (row < rows) {
                const float rr = rsh[r];
                for (long long j = threadIdx.x; j < q; j += KC_T) {
                    const float4 a = sl[r * s4 + j], gg = ((const float4*)(w + row * w_stride))[j];
                    float4 o;
                    o.x = __fmul_rn(__fmul_rn(a.x, rr), gg.x);
                    o.y = __fmul_rn(__fmul_rn(a.y, rr), gg.y);
                    o.z = __fmul_rn(__fmul_rn(a.z, rr), gg.z);
                    o.w = __fmul_rn(__fmul_rn(a.w, rr), gg.w);
                    ((float4*)(y + row * d))[j] = o;
                }
            }
        }
        __syncthreads();
        const long long tt = t + 2 * g;
        if (tt < tiles) {
            #pragma unroll
            for (unsigned r = 0; r < KC_R; ++r) {
                const long long row = tt * KC_R + r;
                if (row < rows) {
                    const float4* x4 = (const float4*)(x + row * d);
                    for (long long j = threadIdx.x; j < q; j += KC_T)
                        KC_COPY16(sm4 + (i & 1) * slot4 + r * s4 + j, x4 + j);
                }
            }
        }
        KC_COPY_COMMIT();
    }
}
"""


def _time(cupy, fn, reps: int = 20) -> float:  # noqa: ANN001
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
    """Time the launcher, the general kernel and rows-kernel variants; print copy/variant and bit agreement."""
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
    general = compile_function(*fk.rmsnorm_source(), fk.ROUTE)
    source, name = fk.SOURCES["rmsnorm_rows"]
    ref = fk.rmsnorm_cuda((general, compile_function(source, name, fk.ROUTE)), x, w, eps)
    cupy.cuda.Device().synchronize()
    print("launcher's choice", fk.rmsnorm_choice(rows, d))
    ms = _time(cupy, lambda: fk.rmsnorm_cuda((general, compile_function(source, name, fk.ROUTE)), x, w, eps, out=y))
    print(f"launcher {ms:.4f} ms  copy/ours {copy_ms / ms:.3f}")
    ms = _time(cupy, lambda: fk.rmsnorm_cuda(general, x, w, eps, out=y))
    print(f"general  {ms:.4f} ms  copy/ours {copy_ms / ms:.3f}")
    args = (x, w, np.int64(0), eps, np.int64(0), y, np.int64(rows), np.int64(d))
    results = []
    for r in (1, 2, 3, 4, 6):
        for t in (128, 256, 512):
            fn = compile_function(f"#define KC_R {r}\n#define KC_T {t}\n" + source, name, fk.ROUTE)
            plan = fk.rmsnorm_rows_plan(rows, d, tile_rows=r, block=t)
            if not fk._prefer_shared(fn, plan["shared_bytes"]):
                continue
            y.fill(0)

            def launch(fn=fn, plan=plan, t=t) -> None:  # noqa: ANN001
                fn((plan["grid"],), (t,), args, shared_mem=plan["shared_bytes"])

            launch()
            same = bool(cupy.array_equal(y.view(cupy.uint32), ref.view(cupy.uint32)))
            ms = _time(cupy, launch)
            results.append((round(copy_ms / ms, 3), r, t, same))
            print(f"rows KC_R={r} KC_T={t:4d} {ms:.4f} ms copy/ours {copy_ms / ms:.3f} bitwise={same}", flush=True)
    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    for r in (1, 2, 3, 4, 6):
        for t in (128, 256, 512):
            fn = compile_function(f"#define KC_R {r}\n#define KC_T {t}\n" + PIPE, "kc_rmsnorm_pipe", fk.ROUTE)
            smem = 16 * 2 * (r * (d // 4 + 1) + 1)
            if not fk._prefer_shared(fn, smem):
                continue
            fit = min(2048 // t, 32, 233472 // (smem + 1024))
            for per_sm in sorted({1, 2, fit}):
                if per_sm > fit or per_sm < 1:
                    continue
                grid = max(1, min(-(-rows // r), per_sm * sms))
                y.fill(0)

                def launch(fn=fn, grid=grid, t=t, smem=smem) -> None:  # noqa: ANN001
                    fn((grid,), (t,), args, shared_mem=smem)

                launch()
                same = bool(cupy.array_equal(y.view(cupy.uint32), ref.view(cupy.uint32)))
                ms = _time(cupy, launch)
                results.append((round(copy_ms / ms, 3), f"pipe R={r} T={t} per_sm={per_sm}", same))
                print(
                    f"pipe KC_R={r} KC_T={t:4d} per_sm={per_sm} {ms:.4f} ms copy/ours {copy_ms / ms:.3f} "
                    f"bitwise={same}",
                    flush=True,
                )
    # back-to-back launches (the contract item's timer): launch gaps overlap, as in a model
    from falsification.engine import time_ms

    best = sorted(results, key=lambda z: z[0], reverse=True)[:4]
    print("best single-launch:", best)
    copy_b = time_ms(lambda: cupy.copyto(y, x), iters=50, warmup=5)
    print(f"back-to-back: copy {copy_b:.4f} ms")
    for r, t in ((2, 256), (3, 256)):
        fn = compile_function(f"#define KC_R {r}\n#define KC_T {t}\n" + source, name, fk.ROUTE)
        plan = fk.rmsnorm_rows_plan(rows, d, tile_rows=r, block=t)
        fk._prefer_shared(fn, plan["shared_bytes"])
        ms = time_ms(
            lambda fn=fn, plan=plan, t=t: fn((plan["grid"],), (t,), args, shared_mem=plan["shared_bytes"]),
            iters=50,
            warmup=5,
        )
        print(f"back-to-back rows R={r} T={t}: {ms:.4f} ms copy/ours {copy_b / ms:.3f}")
    for r in (1, 2, 3, 4):
        for t in (128, 256, 512):
            fn = compile_function(f"#define KC_R {r}\n#define KC_T {t}\n" + PIPE, "kc_rmsnorm_pipe", fk.ROUTE)
            smem = 16 * 2 * (r * (d // 4 + 1) + 1)
            if not fk._prefer_shared(fn, smem):
                continue
            fit = min(2048 // t, 32, 233472 // (smem + 1024))
            grid = max(1, min(-(-rows // r), fit * sms))
            ms = time_ms(
                lambda fn=fn, grid=grid, t=t, smem=smem: fn((grid,), (t,), args, shared_mem=smem), iters=50, warmup=5
            )
            print(f"back-to-back pipe R={r} T={t} per_sm={fit}: {ms:.4f} ms copy/ours {copy_b / ms:.3f}", flush=True)


if __name__ == "__main__":
    main()
