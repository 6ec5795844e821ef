"""Experiment (not the product's; run 2026-11-28 on an H200 and lost, docs/fusion.md): RMSNorm with rows split
between shared memory and registers, so more rows are in flight an SM than shared memory alone holds (~13 for d = 4096).

One persistent block an SM of KC_S slots. Writer warp s owns slot s: the head of its row (the first KC_H float4)
lands in shared memory by one TMA bulk copy (an mbarrier a slot), the tail (the other KC_Q - KC_H float4) in the
warp's registers (KC_TR float4 a lane, coalesced loads). Lane l of fold warp f folds slot s = f * KC_FL + l: the head
from shared memory, then the tail through a ring of KC_RC chunks of 64 float4 that the writer fills from its
registers (produced/consumed counters). The fold is the rows kernel's (x_k * x_k added left to right from +0), so
the result is bitwise the rows kernel's. Then the writer writes (x * r) * w: the head from shared memory, the tail
from its registers, and issues the next row's head copy as soon as the head is written.
Specialised for d = KC_Q * 4 (default 4096) and 16-byte aligned rows.
Locally: python3 benchmarks/bench_rmsnorm_split.py --compile      Device: python3 benchmarks/bench_rmsnorm_split.py"""

import sys

import numpy as np

KERNEL = r"""
#ifndef KC_S
#define KC_S 18
#endif
#ifndef KC_FL
#define KC_FL 9
#endif
#ifndef KC_Q
#define KC_Q 1024
#endif
#ifndef KC_H
#define KC_H 512
#endif
#ifndef KC_RC
#define KC_RC 2
#endif
#define KC_FW ((KC_S + KC_FL - 1) / KC_FL)
#define KC_TR ((KC_Q - KC_H) / 32)
#define KC_NC ((KC_Q - KC_H) / 64)
#define KC_T (32 * (KC_S + KC_FW))
static_assert((KC_Q - KC_H) % 64 == 0 && KC_H % 4 == 0, "whole tail chunks");
#define KC_FOLD4(v) acc = __fadd_rn(acc, __fmul_rn(v.x, v.x)); acc = __fadd_rn(acc, __fmul_rn(v.y, v.y)); \
    acc = __fadd_rn(acc, __fmul_rn(v.z, v.z)); acc = __fadd_rn(acc, __fmul_rn(v.w, v.w));
__device__ __forceinline__ unsigned sa(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void wait_parity(unsigned bar, unsigned parity) {
    unsigned ok = 0;
    while (!ok)
        asm volatile("{ .reg .pred r; mbarrier.try_wait.parity.shared.b64 r, [%1], %2; selp.u32 %0, 1, 0, r; }"
                     : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
}
// The fold of n float4 at rr (four ahead), into acc.
__device__ __forceinline__ float fold(float acc, const float4* rr, unsigned n) {
    float4 a0 = rr[0], a1 = rr[1], a2 = rr[2], a3 = rr[3];
    #pragma unroll 1
    for (unsigned j = 4; j < n; j += 4) {
        const float4 b0 = rr[j], b1 = rr[j + 1], b2 = rr[j + 2], b3 = rr[j + 3];
        KC_FOLD4(a0) KC_FOLD4(a1) KC_FOLD4(a2) KC_FOLD4(a3)
        a0 = b0; a1 = b1; a2 = b2; a3 = b3;
    }
    KC_FOLD4(a0) KC_FOLD4(a1) KC_FOLD4(a2) KC_FOLD4(a3)
    return acc;
}
extern "C" __global__ void __launch_bounds__(KC_T, 1)
kc_rmsnorm_split(const float* __restrict__ x, const float* __restrict__ w, long long w_stride,
                 const float* __restrict__ eps, long long eps_stride, float* __restrict__ y, long long rows) {
    extern __shared__ float4 smem[];  // heads [KC_S][KC_H + 1], then rings [KC_S][KC_RC][64 + 1]
    float4* heads = smem;
    float4* rings = smem + KC_S * (KC_H + 1);
    __shared__ __align__(8) unsigned long long hbar[KC_S];
    __shared__ float sums[KC_S][2];
    __shared__ volatile int produced[KC_S], consumed[KC_S], done[KC_S];
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long stride = (long long)gridDim.x * KC_S;
    if (threadIdx.x < KC_S) {
        produced[threadIdx.x] = 0; consumed[threadIdx.x] = 0; done[threadIdx.x] = 0;
        asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"(sa(hbar + threadIdx.x)));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    if (warp < KC_S) {  // the writer of slot s = warp
        const unsigned s = warp;
        const long long first = (long long)blockIdx.x * KC_S + s;
        const long long nrows = first < rows ? (rows - 1 - first) / stride + 1 : 0;
        float4* head = heads + s * (KC_H + 1);
        float4* ring = rings + s * KC_RC * 65;
        const unsigned bar = sa(hbar + s);
        if (nrows > 0 && lane == 0) {
            asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(bar), "r"(KC_H * 16) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         :: "r"(sa(head)), "l"(x + first * (4 * KC_Q)), "r"(KC_H * 16), "r"(bar) : "memory");
        }
        for (long long k = 0; k < nrows; ++k) {
            const long long row = first + k * stride;
            const float4* x4 = (const float4*)(x + row * (4 * KC_Q));
            float4 t[KC_TR];  // the tail: float4 KC_H + lane + 32 i
            #pragma unroll
            for (unsigned i = 0; i < KC_TR; ++i) t[i] = x4[KC_H + lane + 32 * i];
            #pragma unroll
            for (unsigned c = 0; c < KC_NC; ++c) {  // tail chunk c: registers 2c, 2c + 1 of every lane
                const int n = (int)(k * KC_NC + c);  // chunks of this slot so far
                if (n >= KC_RC)
                    while (consumed[s] < n - KC_RC + 1) __nanosleep(32);
                float4* dst = ring + (n % KC_RC) * 65;
                dst[lane] = t[2 * c];
                dst[32 + lane] = t[2 * c + 1];
                __syncwarp();
                if (lane == 0) { __threadfence_block(); produced[s] = n + 1; }
            }
            while (done[s] <= k) __nanosleep(64);
            __threadfence_block();
            const float acc = sums[s][k & 1];
            const float v = __fadd_rn(__fdiv_rn(acc, (float)(4 * KC_Q)), eps[row * eps_stride]);
            const float r = (float)(1.0 / sqrt((double)v));
            const float4* w4 = (const float4*)(w + row * w_stride);
            float4* y4 = (float4*)(y + row * (4 * KC_Q));
            #pragma unroll 4
            for (unsigned j = lane; j < KC_H; j += 32) {
                const float4 a = head[j], g = w4[j];
                float4 o;
                o.x = __fmul_rn(__fmul_rn(a.x, r), g.x); o.y = __fmul_rn(__fmul_rn(a.y, r), g.y);
                o.z = __fmul_rn(__fmul_rn(a.z, r), g.z); o.w = __fmul_rn(__fmul_rn(a.w, r), g.w);
                __stcs(y4 + j, o);
            }
            __syncwarp();  // every lane's reads of the head done: the next row's copy may land there
            if (k + 1 < nrows && lane == 0) {
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(bar), "r"(KC_H * 16)
                             : "memory");
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                             :: "r"(sa(head)), "l"(x + (row + stride) * (4 * KC_Q)), "r"(KC_H * 16), "r"(bar)
                             : "memory");
            }
            #pragma unroll
            for (unsigned i = 0; i < KC_TR; ++i) {
                const unsigned j = KC_H + lane + 32 * i;
                const float4 a = t[i], g = w4[j];
                float4 o;
                o.x = __fmul_rn(__fmul_rn(a.x, r), g.x); o.y = __fmul_rn(__fmul_rn(a.y, r), g.y);
                o.z = __fmul_rn(__fmul_rn(a.z, r), g.z); o.w = __fmul_rn(__fmul_rn(a.w, r), g.w);
                __stcs(y4 + j, o);
            }
        }
        return;
    }
    // fold warps: lane l of fold warp f folds slot f * KC_FL + l
    const unsigned s = (warp - KC_S) * KC_FL + lane;
    if (lane >= KC_FL || s >= KC_S) return;
    const long long first = (long long)blockIdx.x * KC_S + s;
    const long long nrows = first < rows ? (rows - 1 - first) / stride + 1 : 0;
    const float4* head = heads + s * (KC_H + 1);
    const float4* ring = rings + s * KC_RC * 65;
    const unsigned bar = sa(hbar + s);
    for (long long k = 0; k < nrows; ++k) {
        wait_parity(bar, (unsigned)(k & 1));
        float acc = fold(0.0f, head, KC_H);
        for (unsigned c = 0; c < KC_NC; ++c) {
            const int n = (int)(k * KC_NC + c);
            while (produced[s] <= n) {}
            __threadfence_block();
            acc = fold(acc, ring + (n % KC_RC) * 65, 64);
            __threadfence_block();  // the chunk's loads are performed before the writer may refill its slot
            consumed[s] = n + 1;
        }
        sums[s][k & 1] = acc;
        __threadfence_block();
        done[s] = (int)(k + 1);
    }
}
"""


def source(s: int = 18, fl: int = 9, q: int = 1024, h: int = 512, rc: int = 2) -> tuple[str, int, int]:
    """(source, threads, dynamic shared bytes)."""
    head = f"#define KC_S {s}\n#define KC_FL {fl}\n#define KC_Q {q}\n#define KC_H {h}\n#define KC_RC {rc}\n"
    fw = -(-s // fl)
    return head + KERNEL, 32 * (s + fw), 16 * (s * (h + 1) + s * rc * 65)


CONFIGS = [
    (18, 9, 1024, 512, 2),
    (16, 8, 1024, 512, 2),
    (18, 9, 1024, 512, 4),
    (20, 10, 1024, 512, 2),
    (16, 16, 1024, 512, 2),
    (14, 7, 1024, 640, 2),
]
OPTIONS = ("-ftz=false", "-fmad=false", "-prec-div=true", "-prec-sqrt=true")

if __name__ == "__main__" and "--compile" in sys.argv:
    from native.ptx import _check, _nvrtc

    for cfg in CONFIGS:
        src, nt, sm = source(*cfg)
        nvrtc = _nvrtc()
        _, prog = _check(nvrtc.nvrtcCreateProgram(src.encode(), b"k.cu", 0, [], []), "create")
        o = [x.encode() for x in (*OPTIONS, "--gpu-architecture=sm_90a", "--ptxas-options=-v")]
        (rc,) = nvrtc.nvrtcCompileProgram(prog, len(o), o)
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * n
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = [ln for ln in buf.decode().splitlines() if "registers" in ln or "spill" in ln or "error" in ln]
        print(cfg, "threads", nt, "smem", sm, rc, log)
    sys.exit(0)

if __name__ == "__main__":
    import cupy
    from cupy.cuda import driver

    from native import fusion_kernels as fk
    from native.nvrtc import compile_function

    dev = cupy.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "SMs", sms, flush=True)
    gen = compile_function(*fk.SOURCES["rmsnorm"], fk.ROUTE)
    rowsk = compile_function(*fk.SOURCES["rmsnorm_rows"], fk.ROUTE)
    kern = {}

    def split_fn(cfg):
        if cfg not in kern:
            src, nt, sm = source(*cfg)
            fn = compile_function(src, "kc_rmsnorm_split", fk.ROUTE)
            driver.funcSetAttribute(fn.ptr, 8, sm)
            kern[cfg] = (fn, nt, sm)
        return kern[cfg]

    def split(cfg, x, w, eps, y):
        fn, nt, sm = split_fn(cfg)
        rows, d = x.shape
        assert d == 4 * cfg[2]
        wa, ws = fk._row_operand(cupy, w, rows, d)
        ea, es = fk._eps_operand(cupy, eps, rows)
        grid = min(sms, -(-rows // cfg[0]))
        fn((grid,), (nt,), (x, wa, np.int64(ws), ea, np.int64(es), y, np.int64(rows)), shared_mem=sm)
        return y

    def ref(x, w, eps):
        return fk.rmsnorm_cuda((gen, rowsk), x, w, eps)

    rng = np.random.default_rng(0)
    ok = True
    for rows in (8192, 1000, 37, 1, 5000):
        x = cupy.asarray(rng.standard_normal((rows, 4096)).astype(np.float32))
        w = cupy.asarray(rng.standard_normal(4096).astype(np.float32))
        eps = cupy.asarray(rng.uniform(1e-6, 1e-3, rows).astype(np.float32)) if rows == 1000 else 1e-6
        r = ref(x, w, eps)
        for cfg in CONFIGS:
            y = cupy.full_like(x, np.nan)
            split(cfg, x, w, eps, y)
            cupy.cuda.Device().synchronize()
            same = bool(cupy.array_equal(y, r))
            ok &= same
            if not same:
                print("DIFF", rows, cfg, int((y != r).sum()), flush=True)
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
    for cfg in CONFIGS:
        runs[f"split {cfg}"] = lambda cfg=cfg: split(cfg, x, w, 1e-6, y)
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
        print(f"{n:34s} {np.median(tm[n]) * 1000:8.1f} us  copy/ours {r[4]:.3f} [{r[1]:.3f}, {r[7]:.3f}]", flush=True)
