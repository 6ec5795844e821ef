"""Pre-written kernels of the fusion backend (the seed's ``cuda_templates.py``): RMSNorm, masked softmax, RoPE,
embedding.

Every kernel computes the denotation's operations in the denotation's order (or, for masked softmax, the unfused
executor's: add, then softmax as ``native.ir`` runs it), each rounded to binary32, so the fused form changes no bit:

* ``rmsnorm`` (the IR op, and the six-op pattern pow -> reduceMean -> add -> rsqrt -> mul -> mul): two kernels, one
  order. The fast one (``rmsnorm_rows``, 16-byte aligned rows with d % 4 == 0; :func:`rmsnorm_rows_plan`) gives each
  block ``tile_rows`` rows (rows, threads, column ranges and folding warp chosen from the device's properties by
  :func:`choose_rows_config`), copied into shared memory by ``cp.async``; lane r of one warp folds row r's
  ``x_k * x_k`` left to right from +0 (``spec.reductions.fold_left``, the denotation's order: the fold is a dependent
  chain of adds, so other blocks' memory traffic overlaps it instead of a tree reordering it). The general one
  (persistent blocks of 128 threads, 8 per SM, any row) stages its row in shared memory and loads its next row into
  registers while thread 0 folds. Both divide by ``float(d)``,
  add the row's eps, take ``1 / sqrt`` in double rounded once to binary32 (the denotation's "real function
  rounded once": IEEE double sqrt and division, as NumPy computes it), and every thread writes ``(x * r) * w``
  from shared memory. The weight is read with a row stride (0: one weight row broadcast) and eps with an eps
  stride (0: one scalar), so the six-op pattern's broadcast operands need no copy.
* ``masked_softmax`` (add -> softmax over the last axis): one block per row; a = x + mask (rounded) staged in
  shared memory; thread 0 folds the IEEE maximum from -Inf in index order (``native.reductions.fold_max``'s
  ``kc_maximum``); every thread forms e = expf(a - m) (the elementwise ``sub`` and ``exp`` kernels' bodies);
  thread 0 folds e from +0 in index order; every thread writes e / s. These are the unfused executor's kernels
  op for op (``native.ir`` softmax: fold_max, sub, exp, fold_sum, div), so the step is bitwise the unfused run
  on the same device and within the softmax bound (``native.ir.AGREEMENT['softmax']``) of the denotation.
* ``rope``: a 64-bit grid-stride loop over the (x[2i], x[2i+1]) pairs; c, s come from a (T, D/2) table that the
  host computes once per shape with the denotation's own function (``spec.ir.denote.rope_tables``);
  y0 = x0 c - x1 s, y1 = x0 s + x1 c, each product and sum rounded (``__fmul_rn``/``__fadd_rn``/``__fsub_rn``).
* ``embedding``: a 64-bit grid-stride bit copy of table rows; an index that is not an integer in [0, V) sets an
  error flag and the launcher raises (the denotation's error), never a wrapped read.

Row kernels index in 64 bits (``row_plan``: block b takes rows b, b + grid, ...; masked softmax one block per row,
RMSNorm at most 8 blocks per SM); the grid-stride
kernels use the elementwise family's proved plan (``native.elementwise.launch_plan``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from obligations.core.symbolic import all_of, as_type, cdiv, smin

__all__ = [
    "ROUTE",
    "RMSNORM_NAME",
    "RMSNORM_BLOCK",
    "ROW_BLOCK",
    "rmsnorm_source",
    "rmsnorm_plan",
    "row_plan",
    "rmsnorm_host",
    "rmsnorm_cuda",
    "masked_softmax_source",
    "masked_softmax_cuda",
    "rope_source",
    "rope_cuda",
    "embedding_source",
    "embedding_cuda",
    "SOURCES",
    "APPROXIMATE",
    "MAX_ROW",
    "TUNING",
    "TUNE_MIN_ELEMENTS",
    "rmsnorm_choice",
    "ROWS_R",
    "ROWS_THREADS",
    "rmsnorm_rows_plan",
    "embedding_plan",
    "ROWS_MAX_R",
    "ROWS_MAX_THREADS",
    "DeviceProps",
    "RowsConfig",
    "ROWS_DEFAULT",
    "ROWS_CANDIDATES",
    "rows_blocks_per_sm",
    "rows_model_ms",
    "choose_rows_config",
    "device_props",
    "rows_config",
    "rmsnorm_rows_launch",
]

ROUTE = "nvrtc-ieee"
MAX_ROW = 12268  # the longest row a row kernel stages in 48 KiB of shared memory (row_plan accepts d <= 12288)
RMSNORM_NAME = "kc_fused_rmsnorm"
RMSNORM_BLOCK = 128
ROW_BLOCK = 128
F32 = np.float32

_RMSNORM = """\
#define KC_PF 8
extern "C" __global__ void __launch_bounds__(128, 8)
kc_fused_rmsnorm(const float* __restrict__ x, const float* __restrict__ w, long long w_stride,
                 const float* __restrict__ eps, long long eps_stride, float* __restrict__ y, long long rows,
                 long long d, int vec) {
    extern __shared__ float4 row4[];
    float* row = (float*)row4;
    __shared__ float r_shared;
    const long long q = d >> 2;
    const bool pf = vec && q <= (long long)KC_PF * blockDim.x;  // the next row is prefetched into registers
    float4 nxt[KC_PF];
    long long rid = (long long)blockIdx.x;
    if (pf && rid < rows) {
        const float4* x4 = (const float4*)(x + rid * d);
        #pragma unroll
        for (unsigned k = 0; k < KC_PF; ++k) {
            const long long j = (long long)threadIdx.x + (long long)k * blockDim.x;
            if (j < q) nxt[k] = x4[j];
        }
    }
    for (; rid < rows; rid += gridDim.x) {
        const long long base = rid * d;
        const float* wr = w + rid * w_stride;
        if (pf) {
            #pragma unroll
            for (unsigned k = 0; k < KC_PF; ++k) {
                const long long j = (long long)threadIdx.x + (long long)k * blockDim.x;
                if (j < q) row4[j] = nxt[k];
            }
        } else if (vec) {
            const float4* x4 = (const float4*)(x + base);
            for (long long j = threadIdx.x; j < q; j += blockDim.x) row4[j] = x4[j];
        } else {
            for (long long j = threadIdx.x; j < d; j += blockDim.x) row[j] = x[base + j];
        }
        __syncthreads();
        const long long nr = rid + gridDim.x;
        if (pf && nr < rows) {  // in flight while thread 0 folds
            const float4* x4 = (const float4*)(x + nr * d);
            #pragma unroll
            for (unsigned k = 0; k < KC_PF; ++k) {
                const long long j = (long long)threadIdx.x + (long long)k * blockDim.x;
                if (j < q) nxt[k] = x4[j];
            }
        }
        if (threadIdx.x == 0) {  // the left fold; shared loads run two float4 ahead of the add chain
            float acc = 0.0f;
            const unsigned q32 = (unsigned)q;  // q <= 3072 (row_plan: d <= 12288); the buffer has 4 float4 of pad
            float4 a0 = row4[0], a1 = row4[1];
            unsigned c = 0;
            #pragma unroll 2
            for (; c + 2 <= q32; c += 2) {
                const float4 b0 = row4[c + 2], b1 = row4[c + 3];
                acc = __fadd_rn(acc, __fmul_rn(a0.x, a0.x));
                acc = __fadd_rn(acc, __fmul_rn(a0.y, a0.y));
                acc = __fadd_rn(acc, __fmul_rn(a0.z, a0.z));
                acc = __fadd_rn(acc, __fmul_rn(a0.w, a0.w));
                acc = __fadd_rn(acc, __fmul_rn(a1.x, a1.x));
                acc = __fadd_rn(acc, __fmul_rn(a1.y, a1.y));
                acc = __fadd_rn(acc, __fmul_rn(a1.z, a1.z));
                acc = __fadd_rn(acc, __fmul_rn(a1.w, a1.w));
                a0 = b0;
                a1 = b1;
            }
            if (c < q32) {
                acc = __fadd_rn(acc, __fmul_rn(a0.x, a0.x));
                acc = __fadd_rn(acc, __fmul_rn(a0.y, a0.y));
                acc = __fadd_rn(acc, __fmul_rn(a0.z, a0.z));
                acc = __fadd_rn(acc, __fmul_rn(a0.w, a0.w));
            }
            for (long long j = 4 * q; j < d; ++j) acc = __fadd_rn(acc, __fmul_rn(row[j], row[j]));
            const float ms = __fdiv_rn(acc, (float)d);
            const float v = __fadd_rn(ms, eps[rid * eps_stride]);
            r_shared = (float)(1.0 / sqrt((double)v));
        }
        __syncthreads();
        const float r = r_shared;
        if (vec && w_stride % 4 == 0) {
            float4* y4 = (float4*)(y + base);
            const float4* w4 = (const float4*)wr;
            for (long long j = threadIdx.x; j < q; j += blockDim.x) {
                const float4 a = row4[j], g = w4[j];
                float4 o;
                o.x = __fmul_rn(__fmul_rn(a.x, r), g.x);
                o.y = __fmul_rn(__fmul_rn(a.y, r), g.y);
                o.z = __fmul_rn(__fmul_rn(a.z, r), g.z);
                o.w = __fmul_rn(__fmul_rn(a.w, r), g.w);
                y4[j] = o;
            }
        } else {
            for (long long j = threadIdx.x; j < d; j += blockDim.x) {
                y[base + j] = __fmul_rn(__fmul_rn(row[j], r), wr[j]);
            }
        }
        __syncthreads();  // the row buffer is refilled by the next trip
    }
}
"""

# The fast RMSNorm path (16-byte aligned rows, d % 4 == 0): block b takes rows b*tile_rows .. b*tile_rows +
# tile_rows - 1 (one launch covers the rows, no persistent loop). Its rows land in shared memory by cp.async (16 bytes
# per copy, no register staging) at a padded stride (q + 1 float4: the folding lanes hit different banks), in
# ``chunks`` column ranges, one cp.async group each, so the fold of range c starts while ranges c+1.. are in flight;
# lane r of one warp folds row r left to right (range after range: the same order as one pass), then every thread
# writes (x * r) * w from shared memory. Several blocks share an SM, so one block's fold, a dependent chain of d adds,
# overlaps the others' loads and stores. The rows per block, the threads, the ranges and which warp folds are launch
# arguments (one compiled kernel; :func:`choose_rows_config` picks them from the device's properties): fold_mode 1
# takes the warp from the block's hardware warp slot (%warpid), so co-resident blocks fold on different schedulers.
# KC_COPY16/KC_COPY_COMMIT/KC_COPY_WAIT_GROUP/KC_WARPID are the asynchronous copy and the slot (a host emulator
# defines them as a copy, nothing and a number).
ROWS_R = 2  # rows per block of the fast RMSNorm kernel's default plan ...
ROWS_THREADS = 256  # ... and its threads per block
ROWS_MAX_R = 8  # the most rows per block (the kernel's rsh[]; one folding lane each)
ROWS_MAX_THREADS = 512  # the kernel's __launch_bounds__ ...
ROWS_MIN_BLOCKS = 3  # ... with 3 blocks of 512 resident: at most 40 registers, so 1536 threads fit 64K registers
_RMSNORM_ROWS = (
    f"#define KC_RMAX {ROWS_MAX_R}\n#define KC_TMAX {ROWS_MAX_THREADS}\n#define KC_MIN_BLOCKS {ROWS_MIN_BLOCKS}\n"
    + """\
#ifndef KC_COPY16
#define KC_COPY16(dst, src) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" \\
    :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src))
#define KC_COPY_COMMIT() asm volatile("cp.async.commit_group;\\n" ::)
#define KC_COPY_WAIT_GROUP(n) kc_wait_group(n)
#define KC_WARPID() kc_warpid()
static __device__ __forceinline__ void kc_wait_group(int n) {  // wait_group takes an immediate
    if (n <= 0) asm volatile("cp.async.wait_group 0;\\n" ::);
    else if (n == 1) asm volatile("cp.async.wait_group 1;\\n" ::);
    else if (n == 2) asm volatile("cp.async.wait_group 2;\\n" ::);
    else asm volatile("cp.async.wait_group 3;\\n" ::);
}
static __device__ __forceinline__ unsigned kc_warpid() {
    unsigned w;
    asm volatile("mov.u32 %0, %%warpid;" : "=r"(w));
    return w;
}
#endif
#define KC_FOLD4(v) acc = __fadd_rn(acc, __fmul_rn(v.x, v.x)); acc = __fadd_rn(acc, __fmul_rn(v.y, v.y)); \\
    acc = __fadd_rn(acc, __fmul_rn(v.z, v.z)); acc = __fadd_rn(acc, __fmul_rn(v.w, v.w));
extern "C" __global__ void __launch_bounds__(KC_TMAX, KC_MIN_BLOCKS)
kc_fused_rmsnorm_rows(const float* __restrict__ x, const float* __restrict__ w, long long w_stride,
                      const float* __restrict__ eps, long long eps_stride, float* __restrict__ y, long long rows,
                      long long d, unsigned tile_rows, unsigned chunks, unsigned fold_mode) {
    extern __shared__ float4 sm4[];
    __shared__ float rsh[KC_RMAX];
    __shared__ unsigned fold_warp;
    const long long q = d >> 2, s4 = q + 1;  // padded row stride (rmsnorm_rows_plan: smem_index)
    const long long row0 = (long long)blockIdx.x * tile_rows;
    const unsigned nwarps = blockDim.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {  // which warp folds: any one is right (the same order); the slot only spreads the work
        const unsigned n4 = nwarps < 4 ? nwarps : 4;
        fold_warp = fold_mode ? (KC_WARPID() / nwarps) % n4 : 0;
    }
    for (unsigned c = 0; c < chunks; ++c) {  // column range c of every row: one cp.async group
        const long long lo = q * c / chunks, hi = q * (c + 1) / chunks;
        float4* srow = sm4;  // row r's shared float4 at r * s4, stepped (no 32-bit product)
        for (unsigned r = 0; r < tile_rows; ++r, srow += s4) {
            const long long row = row0 + r;
            if (row < rows) {
                const float4* x4 = (const float4*)(x + row * d);
                for (long long j = lo + threadIdx.x; j < hi; j += blockDim.x) KC_COPY16(srow + j, x4 + j);
            }
        }
        KC_COPY_COMMIT();
    }
    float acc = 0.0f;
    const float4* rr = sm4 + (long long)lane * s4;
    for (unsigned c = 0; c < chunks; ++c) {
        KC_COPY_WAIT_GROUP((int)(chunks - 1 - c));  // this thread's copies of ranges 0..c have landed ...
        __syncthreads();                     // ... and every thread's
        if ((threadIdx.x >> 5) == fold_warp && lane < tile_rows && row0 + lane < rows) {
            // the left fold of range [lo, hi), continuing acc: shared loads run four float4 ahead of the add
            // chain (a dependent add per element: ~30 cycles of load latency hide behind 16 adds); the pad float4
            // and the buffer's 3 extra keep them inside it (smem_index(tile_rows - 1, q + 3) < smem_float4); a
            // read past hi may see a range still in flight, and its value is never used
            const long long lo = q * c / chunks, hi = q * (c + 1) / chunks;
            const float4* p = rr + lo;
            float4 a0 = p[0], a1 = p[1], a2 = p[2], a3 = p[3];
            p += 4;
            unsigned left = (unsigned)(hi - lo);
            for (; left >= 4; left -= 4, p += 4) {
                const float4 b0 = p[0], b1 = p[1], b2 = p[2], b3 = p[3];
                KC_FOLD4(a0) KC_FOLD4(a1) KC_FOLD4(a2) KC_FOLD4(a3)
                a0 = b0;
                a1 = b1;
                a2 = b2;
                a3 = b3;
            }
            if (left > 0) { KC_FOLD4(a0) }
            if (left > 1) { KC_FOLD4(a1) }
            if (left > 2) { KC_FOLD4(a2) }
        }
    }
    if ((threadIdx.x >> 5) == fold_warp && lane < tile_rows && row0 + lane < rows) {
        const long long row = row0 + lane;
        const float ms = __fdiv_rn(acc, (float)d);
        const float v = __fadd_rn(ms, eps[row * eps_stride]);
        rsh[lane] = (float)(1.0 / sqrt((double)v));
    }
    __syncthreads();
    const float4* srow = sm4;
    for (unsigned r = 0; r < tile_rows; ++r, srow += s4) {
        const long long row = row0 + r;
        if (row < rows) {
            const float rr = rsh[r];
            for (long long j = threadIdx.x; j < q; j += blockDim.x) {
                const float4 a = srow[j], g = ((const float4*)(w + row * w_stride))[j];
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
)

_MASKED_SOFTMAX = """\
__device__ __forceinline__ float kc_maximum(float a, float b) {
    if (a != a || b != b) return __int_as_float(0x7fffffff);
    if (a == b) return __int_as_float(__float_as_int(a) & __float_as_int(b));  // max(-0, +0) = +0
    return a > b ? a : b;
}
extern "C" __global__ void kc_fused_masked_softmax(const float* __restrict__ x, const float* __restrict__ mask,
                                                   float* __restrict__ y, long long d) {
    extern __shared__ float row[];
    __shared__ float m_shared, s_shared;
    const long long base = (long long)blockIdx.x * d;
    for (long long j = threadIdx.x; j < d; j += blockDim.x) row[j] = x[base + j] + mask[base + j];
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = __int_as_float(0xff800000);
        for (long long j = 0; j < d; ++j) m = kc_maximum(m, row[j]);
        m_shared = m;
    }
    __syncthreads();
    const float m = m_shared;
    for (long long j = threadIdx.x; j < d; j += blockDim.x) row[j] = expf(row[j] - m);
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (long long j = 0; j < d; ++j) s = s + row[j];
        s_shared = s;
    }
    __syncthreads();
    const float s = s_shared;
    for (long long j = threadIdx.x; j < d; j += blockDim.x) y[base + j] = row[j] / s;
}
"""

_ROPE = """\
extern "C" __global__ void kc_fused_rope(const float* __restrict__ x, const float* __restrict__ c,
                                         const float* __restrict__ s, float* __restrict__ y, long long pairs,
                                         long long t_len, long long half) {
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < pairs;
         p += (long long)blockDim.x * gridDim.x) {
        const long long i = p % half, t = (p / half) % t_len;
        const float x0 = x[2 * p], x1 = x[2 * p + 1];
        const float cc = c[t * half + i], ss = s[t * half + i];
        y[2 * p] = __fsub_rn(__fmul_rn(x0, cc), __fmul_rn(x1, ss));
        y[2 * p + 1] = __fadd_rn(__fmul_rn(x0, ss), __fmul_rn(x1, cc));
    }
}
"""

_EMBEDDING = """\
extern "C" __global__ void kc_fused_embedding(const float* __restrict__ ids, const unsigned* __restrict__ table,
                                              unsigned* __restrict__ y, unsigned* __restrict__ err, long long n,
                                              long long dim, long long vocab) {
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < n;
         p += (long long)blockDim.x * gridDim.x) {
        const long long i = p / dim, k = p - i * dim;
        const float v = ids[i];
        const bool ok = v >= 0.0f && v < (float)vocab && v == floorf(v);  // false for NaN
        if (!ok) { atomicExch(err, 1u); y[p] = 0u; continue; }
        y[p] = table[(long long)v * dim + k];
    }
}
"""

APPROXIMATE = frozenset({"masked_softmax"})  # libdevice expf (2 ulp): the softmax bound, not bitwise
SOURCES: dict[str, tuple[str, str]] = {
    "rmsnorm": (_RMSNORM, RMSNORM_NAME),
    "rmsnorm_rows": (_RMSNORM_ROWS, "kc_fused_rmsnorm_rows"),
    "masked_softmax": (_MASKED_SOFTMAX, "kc_fused_masked_softmax"),
    "rope": (_ROPE, "kc_fused_rope"),
    "embedding": (_EMBEDDING, "kc_fused_embedding"),
}


def rmsnorm_source() -> tuple[str, str]:
    """(CUDA source, function name) of the fused RMSNorm kernel."""
    return SOURCES["rmsnorm"]


def masked_softmax_source() -> tuple[str, str]:
    """(CUDA source, function name) of the fused add -> softmax kernel."""
    return SOURCES["masked_softmax"]


def rope_source() -> tuple[str, str]:
    """(CUDA source, function name) of the RoPE kernel."""
    return SOURCES["rope"]


def embedding_source() -> tuple[str, str]:
    """(CUDA source, function name) of the embedding gather kernel."""
    return SOURCES["embedding"]


def row_plan(rows: Any, d: Any, block: Any = ROW_BLOCK, max_grid: Any = 2147483647) -> dict:
    """Rows over blocks: block b takes rows b, b + grid, ... (64-bit row index), grid = min(rows, max_grid);
    accepted while rows <= 2^31 - 1 and d <= MAX_ROW (the row, and RMSNorm's 4 float4 of pad, fit 48 KiB of
    shared memory: the launchers refuse a longer row); element (row, j) at int64(row) * d + j. Regimes: a row
    every thread covers in one pass (d <= block) or a block-strided one."""
    total = as_type(rows, "int64") * as_type(d, "int64")
    accepts = all_of(rows >= 1, rows <= 2147483647, d >= 1, d <= MAX_ROW, max_grid >= 1)

    def offset(row: Any, j: Any) -> Any:
        """Element (row, j)'s index, computed as the kernel does: int64(row) * d + j."""
        return as_type(row, "int64") * as_type(d, "int64") + as_type(j, "int64")

    return {
        "grid": smin(rows, max_grid),
        "block": block,
        "shared_bytes": 4 * d,
        "total": total,
        "accepts": accepts,
        "offset": offset,
        "max_row": MAX_ROW,
        "regimes": {"one_pass_row": d <= block, "block_strided_row": d > block},
    }


def rmsnorm_plan(rows: Any, d: Any, block: Any = RMSNORM_BLOCK, max_grid: Any = 2147483647) -> dict:
    """The general RMSNorm kernel's plan: :func:`row_plan` (persistent: at most 8 blocks per SM, each looping over
    rows). Its regimes are the kernel's paths: a scalar row (d % 4 != 0, also its vec = 0 launches), a float4 row
    whose next row is prefetched into registers (q = d / 4 <= 8 block) or one streamed from global memory; the fold's
    odd float4 pair; a block that loops over several rows (rows > grid)."""
    plan = row_plan(rows, d, block, max_grid)
    d64 = as_type(d, "int64")
    q = d64 // 4
    vec = d64 % 4 == 0
    plan["regimes"] = {
        "scalar_row": d64 % 4 != 0,
        "vec_prefetched": all_of(vec, q <= 8 * as_type(block, "int64")),
        "vec_streamed": all_of(vec, q > 8 * as_type(block, "int64")),
        "fold_odd_pair": q % 2 == 1,
        "several_rows_per_block": rows > max_grid,
    }
    return plan


def rmsnorm_rows_plan(rows: Any, d: Any, tile_rows: Any = ROWS_R, block: Any = ROWS_THREADS) -> dict:
    """The fast RMSNorm kernel's plan: block b takes rows b * tile_rows + r (r < tile_rows), grid = ceil(rows /
    tile_rows); row ``row``'s float4 j (j < q = d / 4) sits at shared float4 r * (q + 1) + j, and the fold reads up to
    j = q + 3 (four float4 ahead, from any of its column ranges); accepted while d % 4 == 0, 4 <= d <= MAX_ROW, rows
    <= 2^31 - 1 and 1 <= tile_rows <= ROWS_MAX_R (one folding lane and one rsh[] slot a row); element (row, k) at
    int64(row) * d + k."""
    rows64, d64 = as_type(rows, "int64"), as_type(d, "int64")
    q = d64 // 4
    stride = q + 1
    accepts = all_of(
        rows64 >= 1,
        rows64 <= 2147483647,
        d64 >= 4,
        d64 <= MAX_ROW,
        d64 % 4 == 0,
        tile_rows >= 1,
        tile_rows <= ROWS_MAX_R,
    )

    def row_of(b: Any, r: Any) -> Any:
        """The row lane r of block b folds (and the block's threads write): int64(b) * tile_rows + r."""
        return as_type(b, "int64") * tile_rows + as_type(r, "int64")

    def offset(row: Any, k: Any) -> Any:
        """Element (row, k)'s index, computed as the kernel does: int64(row) * d + k."""
        return as_type(row, "int64") * d64 + as_type(k, "int64")

    def smem_index(r: Any, j: Any) -> Any:
        """Float4 j of the block's row r in shared memory: r * (q + 1) + j."""
        return as_type(r, "int64") * stride + as_type(j, "int64")

    left = q % 4  # the float4 the unrolled fold leaves for its tail (the three `if (left > i)`)
    return {
        "regimes": {
            "fold_tail_0": left == 0,
            "fold_tail_1": left == 1,
            "fold_tail_2": left == 2,
            "fold_tail_3": left == 3,
            "partial_tile": rows64 % tile_rows != 0,
            "strided_copy": q > as_type(block, "int64"),
        },
        "grid": cdiv(rows64, tile_rows),
        "block": block,
        "tile_rows": tile_rows,
        "q": q,
        "smem_float4": tile_rows * stride + 3,
        "shared_bytes": 16 * (tile_rows * stride + 3),
        "total": rows64 * d64,
        "accepts": accepts,
        "row_of": row_of,
        "offset": offset,
        "smem_index": smem_index,
    }


def embedding_plan(vocab: Any, index: Any) -> dict:
    """The embedding kernel's guard on one looked-up ``index`` (an integer id): it reads table row ``index`` only while
    0 <= index < vocab, else sets the error flag (the launcher raises ValueError). Its grid-stride loop over the
    n = ids * dim outputs is the generated kernels' (``native.fusion_codegen.fused_plan``). Regimes: the first, an
    inner and the last row."""
    return {
        "accepts": all_of(index >= 0, index < vocab),
        "regimes": {
            "first_row": index == 0,
            "inner_row": all_of(index > 0, index < vocab - 1),
            "last_row": all_of(index > 0, index == vocab - 1),
        },
    }


@dataclass(frozen=True)
class DeviceProps:
    """The device properties the fast RMSNorm kernel's configuration is chosen from (:func:`device_props`)."""

    sm_count: int
    smem_per_sm: int  # bytes of shared memory an SM has (cudaDevAttrMaxSharedMemoryPerMultiprocessor)
    smem_per_block: int  # the opt-in limit of one block's shared memory
    reserved_smem_per_block: int  # what the runtime keeps per resident block
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    clock_khz: int  # SM clock
    memory_clock_khz: int
    bus_width_bits: int
    l2_bytes: int

    @property
    def bandwidth(self) -> float:
        """Theoretical DRAM bandwidth in bytes/s: 2 (double data rate) x memory clock x bus width."""
        return 2.0 * self.memory_clock_khz * 1e3 * self.bus_width_bits / 8


@dataclass(frozen=True)
class RowsConfig:
    """One launch configuration of the fast RMSNorm kernel: rows per block, threads, column ranges, folding warp."""

    tile_rows: int
    block: int
    chunks: int = 1
    fold_mode: int = 0  # 0: warp 0 folds; 1: the warp the block's hardware slot (%warpid) picks

    def label(self) -> str:
        """A short name: R<rows>xT<threads>/C<chunks>/F<mode>."""
        return f"R{self.tile_rows}xT{self.block}/C{self.chunks}/F{self.fold_mode}"


ROWS_DEFAULT = RowsConfig(ROWS_R, ROWS_THREADS)  # the configuration before issue #29 (the bench's baseline)
# The candidates the chooser weighs and the bench times (every one folds in the spec's order: the same bits).
ROWS_CANDIDATES: tuple[RowsConfig, ...] = tuple(
    RowsConfig(r, t, c, f)
    for r, t in ((1, 128), (2, 256), (3, 256), (4, 256), (4, 512), (6, 512), (8, 512))
    for c in (1, 4)
    for f in (0, 1)
)
# The performance model's constants (sm_90, fp32). A fold is a chain of dependent adds (FADD_CYCLES each); a folding
# warp issues ~FOLD_ISSUE instructions per element (FMUL, FADD, a quarter LDS.128: counted in the SASS), so a
# scheduler holding several folding warps stretches their folds. fold_mode 0 puts every block's warp 0 folding;
# COLLIDE_MODE0 warps of those share a scheduler (calibrated: with it the model gives the (2, 256) kernel's measured
# 0.84x copy on an H100 and 0.64x on an H200, within ~10%); fold_mode 1 spreads them over the 4 schedulers.
FADD_CYCLES = 4.0
FOLD_ISSUE = 2.3
SCHEDULERS = 4
COLLIDE_MODE0 = 0.5  # the fraction of the SM's folding warps on one scheduler under fold_mode 0
DRAM_LATENCY_S = 1e-6
KERNEL_STATIC_SMEM = 64  # rsh[KC_RMAX] and fold_warp (ptxas: 48 bytes), rounded up


def rows_blocks_per_sm(props: DeviceProps, d: int, cfg: RowsConfig, regs_per_thread: int) -> int:
    """Resident blocks of ``cfg`` on one SM: the least of what shared memory, threads, registers and the block limit
    allow (0 when one block's shared memory exceeds the opt-in limit)."""
    smem = 16 * (cfg.tile_rows * (d // 4 + 1) + 3) + KERNEL_STATIC_SMEM
    if smem > props.smem_per_block:
        return 0
    regs = -(-max(regs_per_thread, 1) // 8) * 8 * cfg.block  # registers are allocated 8 a thread at a time
    return max(
        0,
        min(
            props.smem_per_sm // (smem + props.reserved_smem_per_block),
            props.max_threads_per_sm // cfg.block,
            props.regs_per_sm // regs,
            props.max_blocks_per_sm,
        ),
    )


def rows_model_ms(props: DeviceProps, rows: int, d: int, cfg: RowsConfig, regs_per_thread: int) -> float:
    """The model's time of one launch (ms): an SM's rows at its share of the DRAM bandwidth, or at the rate its
    resident rows (blocks x tile_rows) pass through load, fold and store, whichever is slower (inf if none fit).

    A row stays resident for DRAM_LATENCY_S + its block's load / chunks (the fold starts on the first range) + the
    fold (d dependent adds, stretched when a scheduler issues for several folding warps) + its block's store."""
    return max(_rows_model(props, rows, d, cfg, regs_per_thread))


def _rows_model(props: DeviceProps, rows: int, d: int, cfg: RowsConfig, regs_per_thread: int) -> tuple[float, float]:
    """(the DRAM-bound time, the residency-bound time) of :func:`rows_model_ms`, in ms."""
    blocks = rows_blocks_per_sm(props, d, cfg, regs_per_thread)
    if blocks == 0 or cfg.tile_rows > ROWS_MAX_R or cfg.block > ROWS_MAX_THREADS:
        return math.inf, math.inf
    per_sm = props.bandwidth / props.sm_count
    clock = props.clock_khz * 1e3
    sharing = math.ceil(blocks / SCHEDULERS) if cfg.fold_mode else max(1.0, COLLIDE_MODE0 * blocks)
    fold = FADD_CYCLES * d / clock * max(1.0, sharing * FOLD_ISSUE / FADD_CYCLES)
    block_bytes = 4.0 * d * cfg.tile_rows
    resident = DRAM_LATENCY_S + block_bytes / per_sm / cfg.chunks + fold + block_bytes / per_sm
    rows_sm = math.ceil(rows / props.sm_count)
    return 1e3 * rows_sm * 8.0 * d / per_sm, 1e3 * rows_sm * resident / (blocks * cfg.tile_rows)


def choose_rows_config(
    props: DeviceProps, rows: int, d: int, regs_per_thread: int, candidates: tuple[RowsConfig, ...] = ROWS_CANDIDATES
) -> RowsConfig:
    """The candidate of least modelled time on this device (:func:`rows_model_ms`), from its properties alone; among
    those at the DRAM bound the one with the most slack (least residency-bound time: the model's error is there),
    then fewer rows per block and fewer threads; ROWS_DEFAULT when none fits."""
    scored = []
    for c in candidates:
        dram, resident = _rows_model(props, rows, d, c, regs_per_thread)
        scored.append((max(dram, resident), resident, c.tile_rows, c.block, c.chunks, c.fold_mode, c))
    best = min(scored, key=lambda z: z[:6])
    return best[-1] if math.isfinite(best[0]) else ROWS_DEFAULT


_PROPS: list[DeviceProps] = []
# cudaDeviceAttr names as CuPy's Device.attributes spells them (getDeviceProperties lost the clocks in CUDA 13)
_ATTRS = {
    "sm_count": "MultiProcessorCount",
    "smem_per_sm": "MaxSharedMemoryPerMultiprocessor",
    "smem_per_block": "MaxSharedMemoryPerBlockOptin",
    "reserved_smem_per_block": "ReservedSharedMemoryPerBlock",
    "max_threads_per_sm": "MaxThreadsPerMultiProcessor",
    "max_blocks_per_sm": "MaxBlocksPerMultiprocessor",
    "regs_per_sm": "MaxRegistersPerMultiprocessor",
    "clock_khz": "ClockRate",
    "memory_clock_khz": "MemoryClockRate",
    "bus_width_bits": "GlobalMemoryBusWidth",
    "l2_bytes": "L2CacheSize",
}


def device_props() -> DeviceProps:
    """The current CUDA device's :class:`DeviceProps` (read once)."""
    if not _PROPS:
        import cupy

        attrs = cupy.cuda.Device().attributes
        _PROPS.append(DeviceProps(**{k: int(attrs[v]) for k, v in _ATTRS.items()}))
    return _PROPS[0]


_SM_COUNT: list[int] = []


def _sm_count() -> int:
    if not _SM_COUNT:
        import cupy

        _SM_COUNT.append(int(cupy.cuda.Device().attributes["MultiProcessorCount"]))
    return _SM_COUNT[0]


def _persistent_grid(rows: int) -> int:
    """min(rows, 8 blocks per SM): one resident wave; each block prefetches its next row during its fold."""
    return max(1, min(rows, 8 * _sm_count()))


_PREFERRED: dict[tuple[int, int], bool] = {}
# CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES (static), ..._MAX_DYNAMIC_SHARED_SIZE_BYTES, ..._PREFERRED_SHARED_MEMORY_CARVEOUT
_STATIC_SHARED, _MAX_DYNAMIC_SHARED, _CARVEOUT = 1, 8, 9


def _prefer_shared(fn: Any, smem: int) -> bool:
    """Allow ``smem`` bytes of dynamic shared memory (above 48 KiB needs the opt-in) and ask for the largest
    carveout, once per function; False when the opt-in is refused (the caller takes another kernel)."""
    key = (id(fn), smem)
    if key not in _PREFERRED:
        from cupy.cuda import driver

        ok = True
        static = 0
        try:
            # The 48 KiB without opt-in counts the kernel's static shared memory too: the general RMSNorm kernel
            # stages exactly 48 KiB at d = MAX_ROW beside its own __shared__ scalars (its regime witness at that
            # boundary failed to launch, CUDA_ERROR_INVALID_VALUE, while smem alone was not above 48 KiB).
            static = int(driver.funcGetAttribute(_STATIC_SHARED, fn.ptr))
            if smem + static > 48 * 1024:
                driver.funcSetAttribute(fn.ptr, _MAX_DYNAMIC_SHARED, smem)
            driver.funcSetAttribute(fn.ptr, _CARVEOUT, 100)
        except Exception:  # noqa: BLE001 (any driver refusal: fall back)
            ok = smem + static <= 48 * 1024
        _PREFERRED[key] = ok
    return _PREFERRED[key]


def _canon(r: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(r), np.uint32(0x7FFFFFFF), r.view(np.uint32)).astype(np.uint32).view(F32)


def rmsnorm_host(x: np.ndarray, w: np.ndarray, eps: Any) -> np.ndarray:
    """The kernel's operations in its order, in NumPy float32 (IEEE, subnormals kept; NaN results canonical).

    ``w``: the weight, broadcast to x's shape; ``eps``: a scalar or one value per row (shape x.shape[:-1] or
    x.shape[:-1] + (1,))."""
    x = np.ascontiguousarray(x, F32)
    d = x.shape[-1]
    if d > MAX_ROW:  # the kernels' guard (rmsnorm_cuda, row_plan), so a program runs on both devices or on neither
        raise ValueError(f"rmsnorm rows of {d} floats exceed the row kernels' {MAX_ROW} (row_plan)")
    rows = x.reshape(-1, d)
    with np.errstate(all="ignore"):
        acc = np.zeros(rows.shape[0], F32)
        for j in range(d):
            acc = acc + rows[:, j] * rows[:, j]
        e = np.broadcast_to(np.asarray(eps, F32).reshape(-1), (rows.shape[0],))
        v = acc / F32(d) + e
        r = (1.0 / np.sqrt(v.astype(np.float64))).astype(F32)
        wb = np.broadcast_to(np.asarray(w, F32), x.shape).reshape(-1, d)
        y = (rows * r[:, None]) * wb
    return _canon(y).reshape(x.shape)


def _row_operand(cupy: Any, a: Any, rows: int, d: int) -> tuple[Any, int]:
    """(pointer array, row stride) of an operand broadcast to (rows, d): stride 0 for one broadcast row."""
    a = cupy.asarray(a, dtype=cupy.float32)
    if a.size == d:
        return cupy.ascontiguousarray(a.reshape(-1)), 0
    a2 = a.reshape(rows, d) if a.flags.c_contiguous else cupy.broadcast_to(a, a.shape).reshape(rows, d)
    if a2.strides[0] == 0 and a2.strides[1] == 4:
        return a2, 0
    return cupy.ascontiguousarray(a2), d


def _eps_operand(cupy: Any, eps: Any, rows: int) -> tuple[Any, int]:
    if np.isscalar(eps) or (isinstance(eps, np.ndarray) and eps.size == 1):
        return cupy.full((1,), np.float32(np.asarray(eps).reshape(-1)[0]), dtype=cupy.float32), 0
    e = cupy.asarray(eps, dtype=cupy.float32)
    if e.size == 1:
        return cupy.ascontiguousarray(e.reshape(1)), 0
    e = e.reshape(rows) if e.flags.c_contiguous else cupy.ascontiguousarray(cupy.broadcast_to(e, e.shape)).reshape(rows)
    return e, 1


TUNING: dict[tuple[int, int, bool], dict[str, float]] = {}  # (rows, d, rows kernel applies) -> kernel -> ms
_CHOICE: dict[tuple[int, int, bool], str] = {}
TUNE_MIN_ELEMENTS = 1 << 22


def _fastest(launchers: dict[str, Any], key: tuple[int, int, bool]) -> str:
    """Time each candidate (one warm-up, three timed launches, CUDA events) and keep the fastest."""
    import cupy

    times = {}
    for name, launch in launchers.items():
        launch()
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(3):
            launch()
        stop.record()
        stop.synchronize()
        times[name] = cupy.cuda.get_elapsed_time(start, stop) / 3
    TUNING[key] = times
    return min(times, key=times.__getitem__)


_NUM_REGS = 4  # CU_FUNC_ATTRIBUTE_NUM_REGS
_CONFIG: dict[tuple[int, int, int], RowsConfig] = {}


def rows_config(fast: Any, rows: int, d: int) -> RowsConfig:
    """The fast kernel's configuration for (rows, d) on the current device: :func:`choose_rows_config` of its
    properties and the compiled kernel's registers per thread (once per shape)."""
    key = (id(fast), rows, d)
    if key not in _CONFIG:
        from cupy.cuda import driver

        regs = int(driver.funcGetAttribute(_NUM_REGS, fast.ptr))
        _CONFIG[key] = choose_rows_config(device_props(), rows, d, regs)
    return _CONFIG[key]


def rmsnorm_rows_launch(fast: Any, args: tuple, rows: int, d: int, cfg: RowsConfig) -> Any:
    """The fast kernel's launch for ``cfg`` (its plan's grid and shared memory), or None when the plan does not
    accept the shape or the shared memory is refused."""
    plan = rmsnorm_rows_plan(rows, d, cfg.tile_rows, cfg.block)
    if not plan["accepts"] or not _prefer_shared(fast, plan["shared_bytes"]):
        return None
    grid, smem = int(plan["grid"]), int(plan["shared_bytes"])
    full = (*args, np.uint32(cfg.tile_rows), np.uint32(cfg.chunks), np.uint32(cfg.fold_mode))
    return lambda: fast((grid,), (cfg.block,), full, shared_mem=smem)


def rmsnorm_cuda(
    fn: Any, x: Any, w: Any, eps: Any, out: Any = None, max_grid: int | None = None, config: RowsConfig | None = None
) -> Any:
    """Launch on CuPy arrays: ``fn`` is the general kernel or the pair (general, rows) whose rows kernel takes
    16-byte aligned rows with d % 4 == 0 (:func:`rmsnorm_rows_plan`); ``w`` broadcasts to x's shape, ``eps`` is a
    scalar or one value per row. Both kernels fold in the same order (the results are the same bits); for a large
    shape the faster one is chosen once by timing both (:data:`TUNING`), for a small one the rows kernel when it
    applies. ``max_grid`` caps the general kernel's persistent grid (:func:`rmsnorm_plan`: a regime witness's
    blocks that loop over several rows); ``config`` forces the fast kernel (with that configuration) where it applies,
    else the device's (:func:`rows_config`) takes part in the timing."""
    import cupy

    general, fast = fn if isinstance(fn, tuple) else (fn, None)
    x = cupy.ascontiguousarray(x, dtype=cupy.float32)
    d = int(x.shape[-1])
    if d > MAX_ROW:
        raise ValueError(f"rmsnorm rows of {d} floats exceed the row kernels' {MAX_ROW} (row_plan)")
    rows = int(x.size // d) if d else 0
    y = cupy.empty_like(x) if out is None else out
    if not rows:
        return y
    wa, ws = _row_operand(cupy, w, rows, d)
    ea, es = _eps_operand(cupy, eps, rows)
    vec = d % 4 == 0 and ws % 4 == 0 and all(int(a.data.ptr) % 16 == 0 for a in (x, y, wa))
    args = (x, wa, np.int64(ws), ea, np.int64(es), y, np.int64(rows), np.int64(d))
    gen_smem = 16 * (d // 4 + 5)  # the row, its tail and 4 float4 the fold may read past it
    _prefer_shared(general, gen_smem)
    launchers = {
        "general": lambda: general(
            (min(_persistent_grid(rows), max_grid or rows),),
            (RMSNORM_BLOCK,),
            (*args, np.int32(vec)),
            shared_mem=gen_smem,
        )
    }
    fast_launch = None
    if fast is not None and vec:
        fast_launch = rmsnorm_rows_launch(fast, args, rows, d, config or rows_config(fast, rows, d))
    if fast_launch is not None:
        if config is not None:
            fast_launch()
            return y
        launchers["rows"] = fast_launch
    key = (rows, d, "rows" in launchers)
    choice = _CHOICE.get(key)
    if choice is None:
        small = rows * d < TUNE_MIN_ELEMENTS or len(launchers) == 1
        choice = _CHOICE[key] = ("rows" if "rows" in launchers else "general") if small else _fastest(launchers, key)
    launchers[choice]()
    return y


def rmsnorm_choice(rows: int, d: int) -> dict[str, Any]:
    """The kernel chosen for (rows, d) and the timings behind the choice (empty when not timed)."""
    picks = {k: v for k, v in _CHOICE.items() if k[:2] == (rows, d)}
    return {
        "chosen": sorted(set(picks.values())),
        "timings_ms": {str(k): v for k, v in TUNING.items() if k[:2] == (rows, d)},
    }


def masked_softmax_cuda(fn: Any, x: Any, mask: Any, block: int = ROW_BLOCK) -> Any:
    """softmax(x + mask) over the last axis (one block of ``block`` threads per row; :func:`row_plan`)."""
    import cupy

    x = cupy.ascontiguousarray(x, dtype=cupy.float32)
    m = cupy.ascontiguousarray(cupy.broadcast_to(cupy.asarray(mask, dtype=cupy.float32), x.shape))
    d = int(x.shape[-1])
    if d > MAX_ROW:
        raise ValueError(f"softmax rows of {d} floats exceed the row kernel's {MAX_ROW} (row_plan)")
    rows = int(x.size // d) if d else 0
    y = cupy.empty_like(x)
    if rows:
        fn((rows,), (int(block),), (x, m, y, np.int64(d)), shared_mem=4 * d)
    return y


def _grid(n: int, block: int | None = None, max_grid: int | None = None) -> tuple[tuple[int], tuple[int]]:
    from native.elementwise import DEFAULT_BLOCK, DEFAULT_MAX_GRID, launch_plan

    plan = launch_plan(n, block or DEFAULT_BLOCK, max_grid or DEFAULT_MAX_GRID, index_bits=64)
    return (int(plan["grid"]),), (int(plan["block"]),)


def rope_cuda(fn: Any, x: Any, c: Any, s: Any, block: int | None = None, max_grid: int | None = None) -> Any:
    """RoPE of x (..., T, D) with the (T, D/2) tables c, s (float32 arrays of the device); ``block``/``max_grid``:
    the grid-stride plan's knobs (a regime witness's geometry), default the shipped ones."""
    import cupy

    x = cupy.ascontiguousarray(x, dtype=cupy.float32)
    y = cupy.empty_like(x)
    t_len, dim = int(x.shape[-2]), int(x.shape[-1])
    pairs = int(x.size // 2)
    if pairs:
        grid, blk = _grid(pairs, block, max_grid)
        fn(grid, blk, (x, c, s, y, np.int64(pairs), np.int64(t_len), np.int64(dim // 2)))
    return y


def embedding_cuda(fn: Any, ids: Any, table: Any, block: int | None = None, max_grid: int | None = None) -> Any:
    """table[ids] as a bit copy; ValueError when an index is not an integer in [0, V) (the denotation's error;
    :func:`embedding_plan`'s guard); ``block``/``max_grid`` as for :func:`rope_cuda`."""
    import cupy

    ids = cupy.ascontiguousarray(ids, dtype=cupy.float32)
    table = cupy.ascontiguousarray(table, dtype=cupy.float32)
    vocab, dim = int(table.shape[0]), int(table.shape[1])
    y = cupy.empty(ids.shape + (dim,), dtype=cupy.float32)
    err = cupy.zeros((1,), dtype=cupy.uint32)
    n = int(y.size)
    if n:
        grid, blk = _grid(n, block, max_grid)
        fn(
            grid,
            blk,
            (ids, table.view(cupy.uint32), y.view(cupy.uint32), err, np.int64(n), np.int64(dim), np.int64(vocab)),
        )
        if int(err.get()[0]):
            raise ValueError(f"embedding index is not an integer in [0, {vocab})")
    return y
