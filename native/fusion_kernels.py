"""Pre-written kernels of the fusion backend (the seed's ``cuda_templates.py``): RMSNorm, masked softmax, RoPE,
embedding.

Every kernel computes the denotation's operations in the denotation's order (or, for masked softmax, the unfused
executor's: add, then softmax as ``native.ir`` runs it), each rounded to binary32, so the fused form changes no bit:

* ``rmsnorm`` (the IR op, and the six-op pattern pow -> reduceMean -> add -> rsqrt -> mul -> mul): two kernels, one
  order. The fast one (``rmsnorm_rows``, 16-byte aligned rows with d % 4 == 0; :func:`rmsnorm_rows_plan`) gives each
  block of 256 threads two rows, copied into shared memory by ``cp.async``; lane r of warp 0 folds row r's
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
    "ROW_FOLD",
    "FOLD4_MACRO",
    "COPY16_MACROS",
    "embedding_plan",
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

# The fast RMSNorm path (16-byte aligned rows, d % 4 == 0): block b takes rows b*KC_R .. b*KC_R + KC_R - 1 (one
# launch covers the rows, no persistent loop). Its rows land in shared memory by cp.async (16 bytes per copy, no
# register staging, all of a block's copies in flight at once) at a padded stride (q + 1 float4: the folding lanes hit
# different banks); lane r of warp 0 folds row r left to right; then every thread writes (x * r) * w from shared
# memory. Several blocks share an SM (2 rows each: ~33 KB of shared memory for d = 4096), so one block's fold, a
# dependent chain of d adds, overlaps the others' loads and stores: the kernel runs at the copy bandwidth's pace
# instead of the fold's. KC_COPY16/KC_COPY_WAIT are the asynchronous copy (a host emulator defines them as a copy).
# The left fold of a row staged in shared memory at float4* rr (four float4 of loads ahead of the dependent adds),
# then its mean square plus the row's eps: the denotation's order, written once (the rows kernel takes it).
# cp.async of 16 bytes into shared memory and its wait (a host emulator defines them as a copy first), and the fold's
# four steps of one float4 (x*x added left to right)
COPY16_MACROS = """\
#ifndef KC_COPY16
#define KC_COPY16(dst, src) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" \\
    :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src))
#define KC_COPY_WAIT() asm volatile("cp.async.wait_all;\\n" ::)
#endif
"""
FOLD4_MACRO = """\
#define KC_FOLD4(v) acc = __fadd_rn(acc, __fmul_rn(v.x, v.x)); acc = __fadd_rn(acc, __fmul_rn(v.y, v.y)); \\
    acc = __fadd_rn(acc, __fmul_rn(v.z, v.z)); acc = __fadd_rn(acc, __fmul_rn(v.w, v.w));
"""
ROW_FOLD = """\
        float4 a0 = rr[0], a1 = rr[1], a2 = rr[2], a3 = rr[3];
        const float4* p = rr + 4;
        unsigned left = (unsigned)q;
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
        const float ms = __fdiv_rn(acc, (float)d);
        const float v = __fadd_rn(ms, eps[row * eps_stride]);
"""
ROWS_R = 2  # rows per block of the fast RMSNorm kernel (KC_R) ...
ROWS_THREADS = 256  # ... and its threads per block (KC_T): the source's defaults and rmsnorm_rows_plan's
_RMSNORM_ROWS = (
    (f"#ifndef KC_R\n#define KC_R {ROWS_R}\n#endif\n#ifndef KC_T\n#define KC_T {ROWS_THREADS}\n#endif\n")
    + COPY16_MACROS
    + FOLD4_MACRO
    + """\
extern "C" __global__ void __launch_bounds__(KC_T)
kc_fused_rmsnorm_rows(const float* __restrict__ x, const float* __restrict__ w, long long w_stride,
                      const float* __restrict__ eps, long long eps_stride, float* __restrict__ y, long long rows,
                      long long d) {
    extern __shared__ float4 sm4[];
    __shared__ float rsh[KC_R];
    const long long q = d >> 2, s4 = q + 1;  // padded row stride (rmsnorm_rows_plan: smem_index)
    const long long row0 = (long long)blockIdx.x * KC_R;
    #pragma unroll
    for (unsigned r = 0; r < KC_R; ++r) {
        const long long row = row0 + r;
        if (row < rows) {
            const float4* x4 = (const float4*)(x + row * d);
            for (long long j = threadIdx.x; j < q; j += KC_T) KC_COPY16(sm4 + r * s4 + j, x4 + j);
        }
    }
    KC_COPY_WAIT();
    __syncthreads();
    if (threadIdx.x < KC_R && row0 + threadIdx.x < rows) {  // the left fold, one row per lane
        const long long row = row0 + threadIdx.x;
        const float4* rr = sm4 + (long long)threadIdx.x * s4;
        float acc = 0.0f;
        // Shared loads run four float4 ahead of the add chain (a dependent add per element: ~30 cycles of load
        // latency hide behind 16 adds); the pad float4 and the buffer's 3 extra keep them inside it
        // (smem_index(KC_R - 1, q + 3) < smem_float4).
"""
    + ROW_FOLD
    + """        rsh[threadIdx.x] = (float)(1.0 / sqrt((double)v));
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
    j = q + 3 (four float4 ahead); accepted while d % 4 == 0, 4 <= d <= MAX_ROW and rows <= 2^31 - 1; element (row,
    k) at int64(row) * d + k."""
    rows64, d64 = as_type(rows, "int64"), as_type(d, "int64")
    q = d64 // 4
    stride = q + 1
    accepts = all_of(rows64 >= 1, rows64 <= 2147483647, d64 >= 4, d64 <= MAX_ROW, d64 % 4 == 0, tile_rows >= 1)

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
_DYNAMIC_LIMIT: dict[int, int] = {}  # per function: the dynamic shared memory its attribute allows now
# CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES (static), ..._MAX_DYNAMIC_SHARED_SIZE_BYTES, ..._PREFERRED_SHARED_MEMORY_CARVEOUT
_STATIC_SHARED, _MAX_DYNAMIC_SHARED, _CARVEOUT = 1, 8, 9


def _prefer_shared(fn: Any, smem: int) -> bool:
    """Allow ``smem`` bytes of dynamic shared memory (above 48 KiB needs the opt-in) and ask for the largest
    carveout, once per (function, size); False when the opt-in is refused (the caller takes another kernel). The
    attribute only grows: a smaller size set after a larger one would make the larger one's launches invalid."""
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
            if smem + static > 48 * 1024 and smem > _DYNAMIC_LIMIT.get(id(fn), 0):
                driver.funcSetAttribute(fn.ptr, _MAX_DYNAMIC_SHARED, smem)
                _DYNAMIC_LIMIT[id(fn)] = smem
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


def rmsnorm_cuda(fn: Any, x: Any, w: Any, eps: Any, out: Any = None, max_grid: int | None = None) -> Any:
    """Launch on CuPy arrays: ``fn`` is the general kernel or the pair (general, rows) whose rows kernel takes
    16-byte aligned rows with d % 4 == 0 (:func:`rmsnorm_rows_plan`); ``w`` broadcasts to x's shape, ``eps`` is a
    scalar or one value per row. Both kernels fold in the same order (the results are the same bits); for a large
    shape the faster one is chosen once by timing both (:data:`TUNING`), for a small one the rows kernel when it
    applies. ``max_grid`` caps the general kernel's persistent grid (:func:`rmsnorm_plan`: a regime witness's
    blocks that loop over several rows)."""
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
    plan = rmsnorm_rows_plan(rows, d)
    _prefer_shared(general, gen_smem)
    launchers = {
        "general": lambda: general(
            (min(_persistent_grid(rows), max_grid or rows),),
            (RMSNORM_BLOCK,),
            (*args, np.int32(vec)),
            shared_mem=gen_smem,
        )
    }
    if fast is not None and vec and plan["accepts"] and _prefer_shared(fast, plan["shared_bytes"]):
        launchers["rows"] = lambda: fast((plan["grid"],), (ROWS_THREADS,), args, shared_mem=plan["shared_bytes"])
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
