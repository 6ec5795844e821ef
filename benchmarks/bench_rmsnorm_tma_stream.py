"""Experiment (not the product's): RMSNorm with F folding lanes per block, each streaming its own rows through a
per-lane cp.async ring in shared memory (no whole rows held), and one writer warp per folding lane that writes
(x * r) * w re-reading x from global memory (L2) once the lane publishes the row's sum of squares.
Same fold order as kc_fused_rmsnorm_rows: bitwise the same expected.
Locally: python3 benchmarks/bench_rmsnorm_tma_stream.py --compile   Device: python3 benchmarks/bench_rmsnorm_tma_stream.py"""

import sys

import numpy as np

KERNEL = r"""
#ifndef KC_F
#define KC_F 16
#endif
#ifndef KC_CH
#define KC_CH 64
#endif
#ifndef KC_NCH
#define KC_NCH 8
#endif
#define KC_T (32 * (KC_F + 1))
__device__ __forceinline__ void cp16(float4* dst, const float4* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void wait_ring() { asm volatile("cp.async.wait_group %0;\n" :: "n"(KC_NCH - 1) : "memory"); }
__device__ __forceinline__ void wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
#define KC_FOLD4(v) acc = __fadd_rn(acc, __fmul_rn(v.x, v.x)); acc = __fadd_rn(acc, __fmul_rn(v.y, v.y)); \
    acc = __fadd_rn(acc, __fmul_rn(v.z, v.z)); acc = __fadd_rn(acc, __fmul_rn(v.w, v.w));
extern "C" __global__ void __launch_bounds__(KC_T, 1)
kc_rmsnorm_stream(const float* __restrict__ x, const float* __restrict__ w, long long w_stride,
                  const float* __restrict__ eps, long long eps_stride, float* __restrict__ y, long long rows,
                  long long d) {
    extern __shared__ float4 ring[];  // [KC_F][KC_NCH * KC_CH + 1]: one ring per folding lane (+1: lanes on other banks)
    __shared__ float sums[KC_F][2];
    __shared__ __align__(8) unsigned long long bars[KC_F * KC_NCH];
    __shared__ volatile int done[KC_F], freed[KC_F];
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long q = d >> 2;
    const long long stride = (long long)gridDim.x * KC_F;
    if (threadIdx.x < KC_F) { done[threadIdx.x] = 0; freed[threadIdx.x] = 0; }
    __syncthreads();
    if (warp == 0) {
        // Lane f < KC_F folds stream f (rows first + f, + stride, ...): its chunks arrive by TMA bulk copies (one
        // instruction a chunk) into its ring, each slot's arrival on its own mbarrier.
        if (lane >= KC_F) return;
        const long long first = (long long)blockIdx.x * KC_F + lane;
        const long long cpr = (q + KC_CH - 1) / KC_CH;
        const long long total = first < rows ? ((rows - 1 - first) / stride + 1) * cpr : 0;
        float4* my = ring + (long long)lane * (KC_NCH * KC_CH + 1);
        unsigned long long* mb = bars + lane * KC_NCH;
        for (int sl = 0; sl < KC_NCH; ++sl)
            asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"((unsigned)__cvta_generic_to_shared(mb + sl)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        #define ISSUE(p) do { const long long pp = (p); if (pp < total) { \
            const long long kk = pp / cpr, cc = pp - kk * cpr; \
            const unsigned n = (unsigned)min((long long)KC_CH, q - cc * KC_CH); \
            const float4* src = (const float4*)(x + (first + kk * stride) * d) + cc * KC_CH; \
            const unsigned sl = (unsigned)(pp % KC_NCH); \
            const unsigned bar = (unsigned)__cvta_generic_to_shared(mb + sl); \
            const unsigned dst = (unsigned)__cvta_generic_to_shared(my + sl * KC_CH); \
            asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(bar), "r"(n * 16u) : "memory"); \
            CP_BULK(dst, src, n * 16u, bar); } } while (0)
#ifdef KC_EVICT_LAST
        unsigned long long pol;
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
#define CP_BULK(dst, src, bytes, bar) asm volatile( \
    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" \
    :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol) : "memory")
#else
#define CP_BULK(dst, src, bytes, bar) asm volatile( \
    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" \
    :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory")
#endif
        #pragma unroll 1
        for (int p = 0; p + 1 < KC_NCH; ++p) ISSUE(p);
        float acc = 0.0f;
        long long k = 0, c = 0;
        #pragma unroll 1
        for (long long p = 0; p < total; ++p) {
            ISSUE(p + KC_NCH - 1);  // into the slot chunk p - 1 used: its folds have all issued (in order)
            {
                const unsigned bar = (unsigned)__cvta_generic_to_shared(mb + p % KC_NCH);
                const unsigned parity = (unsigned)((p / KC_NCH) & 1);
                unsigned ok = 0;
                while (!ok)
                    asm volatile("{ .reg .pred r; mbarrier.try_wait.parity.shared.b64 r, [%1], %2; selp.u32 %0, 1, 0, r; }"
                                 : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
            }
            const float4* rr = my + (p % KC_NCH) * KC_CH;
            const unsigned n = (unsigned)min((long long)KC_CH, q - c * KC_CH);
#ifndef KC_NOFOLD
            if (n == KC_CH) {
                float4 a0 = rr[0], a1 = rr[1], a2 = rr[2], a3 = rr[3];
                #pragma unroll 1
                for (unsigned j = 4; j < KC_CH; j += 4) {
                    const float4 b0 = rr[j], b1 = rr[j + 1], b2 = rr[j + 2], b3 = rr[j + 3];
                    KC_FOLD4(a0) KC_FOLD4(a1) KC_FOLD4(a2) KC_FOLD4(a3)
                    a0 = b0; a1 = b1; a2 = b2; a3 = b3;
                }
                KC_FOLD4(a0) KC_FOLD4(a1) KC_FOLD4(a2) KC_FOLD4(a3)
            } else {
                for (unsigned j = 0; j < n; ++j) { const float4 a = rr[j]; KC_FOLD4(a) }
            }
#endif
            if (++c == cpr) {  // the row's sum of squares to its writer
                while (freed[lane] + 2 <= k) {}
                sums[lane][k & 1] = acc;
                __threadfence_block();
                done[lane] = (int)(k + 1);
                acc = 0.0f;
                c = 0;
                ++k;
            }
        }
        return;
    }
    const unsigned l = warp - 1;  // the writer of folding lane l
    const long long first = (long long)blockIdx.x * KC_F + l;
    const long long nrows = first < rows ? (rows - 1 - first) / stride + 1 : 0;
    for (long long k = 0; k < nrows; ++k) {
        while (done[l] <= k) __nanosleep(200);
        __threadfence_block();
        const float acc = sums[l][k & 1];
        __syncwarp();
        if (lane == 0) freed[l] = (int)(k + 1);
        const long long row = first + k * stride;
        const float ms = __fdiv_rn(acc, (float)d);
        const float v = __fadd_rn(ms, eps[row * eps_stride]);
        const float r = (float)(1.0 / sqrt((double)v));
        const float4* x4 = (const float4*)(x + row * d);
        const float4* w4 = (const float4*)(w + row * w_stride);
        float4* y4 = (float4*)(y + row * d);
#ifdef KC_NOWRITE
        continue;
#endif
        #pragma unroll 8
        for (long long j = lane; j < q; j += 32) {
            const float4 a = __ldcs(x4 + j), g = w4[j];
            float4 o;
            o.x = __fmul_rn(__fmul_rn(a.x, r), g.x);
            o.y = __fmul_rn(__fmul_rn(a.y, r), g.y);
            o.z = __fmul_rn(__fmul_rn(a.z, r), g.z);
            o.w = __fmul_rn(__fmul_rn(a.w, r), g.w);
            __stcs(y4 + j, o);
        }
    }
}
"""


def source(f: int = 16, ch: int = 64, nch: int = 8, extra: str = "") -> tuple[str, int, int]:
    """(source, threads, shared bytes)."""
    head = f"#define KC_F {f}\n#define KC_CH {ch}\n#define KC_NCH {nch}\n" + "".join(
        f"#define {m}\n" for m in extra.split()
    )
    return head + KERNEL, 32 * (f + 1), 16 * f * (nch * ch + 1)


if __name__ == "__main__" and "--compile" in sys.argv:
    from native.ptx import _compile_now

    for cfg in ((16, 64, 8), (12, 64, 8), (8, 64, 12)):
        src, nt, sm = source(*cfg)
        print(cfg, len(_compile_now(src, ("-ftz=false", "-fmad=false"), "sm_90a", "CUBIN")), nt, sm)
    sys.exit(0)

if __name__ == "__main__":
    import cupy
    from cupy.cuda import driver

    from native import fusion_kernels as fk
    from native.nvrtc import compile_function

    dev = cupy.cuda.Device()
    print(
        cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "SMs",
        dev.attributes["MultiProcessorCount"],
        flush=True,
    )
    sms = dev.attributes["MultiProcessorCount"]
    gen = compile_function(*fk.SOURCES["rmsnorm"], fk.ROUTE)
    rowsk = compile_function(*fk.SOURCES["rmsnorm_rows"], fk.ROUTE)
    kern = {}

    def stream_fn(cfg):
        if cfg not in kern:
            src, nt, sm = source(*cfg)
            fn = compile_function(src, "kc_rmsnorm_stream", fk.ROUTE)
            driver.funcSetAttribute(fn.ptr, 8, sm)
            kern[cfg] = (fn, nt, sm)
        return kern[cfg]

    def stream(cfg, x, w, eps, y, bps=1):
        fn, nt, sm = stream_fn(cfg)
        rows, d = x.shape
        wa, ws = fk._row_operand(cupy, w, rows, d)
        ea, es = fk._eps_operand(cupy, eps, rows)
        grid = min(sms * bps, -(-rows // cfg[0]))
        fn((grid,), (nt,), (x, wa, np.int64(ws), ea, np.int64(es), y, np.int64(rows), np.int64(d)), shared_mem=sm)
        return y

    def ref(x, w, eps):
        return fk.rmsnorm_cuda((gen, rowsk), x, w, eps)

    rng = np.random.default_rng(0)
    ok = True
    cfgs = [(16, 64, 8), (8, 128, 8)]
    for rows, d in ((8192, 4096), (1000, 4096), (37, 260), (3, 8), (5000, 1028), (300, 12264)):
        x = cupy.asarray(rng.standard_normal((rows, d)).astype(np.float32))
        w = cupy.asarray(rng.standard_normal(d).astype(np.float32))
        r = ref(x, w, 1e-6)
        for cfg in cfgs:
            y = cupy.full_like(x, np.nan)
            stream(cfg, x, w, 1e-6, y)
            same = bool(cupy.array_equal(y, r))
            ok &= same
            if not same:
                print("DIFF", rows, d, cfg, int((y != r).sum()), flush=True)
    print("all bitwise == rows kernel:", ok, flush=True)

    def ev(f, iters=10):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record()
        for _ in range(iters):
            f()
        e.record()
        e.synchronize()
        return cupy.cuda.get_elapsed_time(s, e) / iters

    x = cupy.asarray(rng.standard_normal((8192, 4096)).astype(np.float32))
    w = cupy.asarray(rng.standard_normal(4096).astype(np.float32))
    y = cupy.empty_like(x)
    runs = {"copy": lambda: cupy.copyto(y, x), "rows": lambda: ref(x, w, 1e-6)}
    for cfg in cfgs + [
        (16, 64, 8, "KC_EVICT_LAST"),
        (12, 64, 8, "KC_EVICT_LAST"),
        (24, 32, 8, "KC_EVICT_LAST"),
        (16, 64, 8, "KC_NOFOLD"),
    ]:
        runs[f"stream {cfg}"] = lambda cfg=cfg: stream(cfg, x, w, 1e-6, y)
    for f in runs.values():
        for _ in range(3):
            f()
    tm = {n: [] for n in runs}
    for _ in range(9):
        for n, f in runs.items():
            tm[n].append(ev(f))
    cp_ = np.array(tm["copy"])
    for n in runs:
        r = np.sort(cp_ / np.array(tm[n]))
        print(f"{n:28s} {np.median(tm[n]) * 1000:8.1f} us  copy/ours {r[4]:.3f} [{r[1]:.3f}, {r[7]:.3f}]", flush=True)
