"""Pre-written kernels of the fusion backend (the seed's ``cuda_templates.py``): RMSNorm in one kernel.

``rmsnorm`` over the last axis (rows of length ``d``) is one block per row: the block stages the row in shared
memory (coalesced loads), thread 0 folds ``x_k * x_k`` left to right from +0 (each product and sum rounded to
binary32, the denotation's ``fold_left`` order), divides by ``float(d)``, adds eps, takes ``1 / sqrt`` in double
rounded once to binary32 (the denotation's "real function rounded once": IEEE double sqrt and division, as NumPy
computes it), and every thread writes ``(x * r) * w``. Every operation is the denotation's, in its order, so
the kernel equals ``spec.ir.denote``'s rmsnorm bit for bit; the host path is the same order in NumPy. Rows are
indexed in 64 bits; the grid is one block per row (capped at 2^31 - 1 rows by ``rmsnorm_plan``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from obligations.core.symbolic import all_of, as_type

__all__ = ["RMSNORM_NAME", "RMSNORM_BLOCK", "rmsnorm_source", "rmsnorm_plan", "rmsnorm_host", "rmsnorm_cuda", "ROUTE"]

ROUTE = "nvrtc-ieee"
RMSNORM_NAME = "kc_fused_rmsnorm"
RMSNORM_BLOCK = 256
F32 = np.float32

_SOURCE = """\
extern "C" __global__ void kc_fused_rmsnorm(const float* __restrict__ x, const float* __restrict__ w,
                                            float* __restrict__ y, long long d, float eps) {
    extern __shared__ float row[];
    __shared__ float r_shared;
    const long long base = (long long)blockIdx.x * d;
    for (long long j = threadIdx.x; j < d; j += blockDim.x) row[j] = x[base + j];
    __syncthreads();
    if (threadIdx.x == 0) {
        float acc = 0.0f;
        for (long long j = 0; j < d; ++j) acc = __fadd_rn(acc, __fmul_rn(row[j], row[j]));
        const float ms = __fdiv_rn(acc, (float)d);
        const float v = __fadd_rn(ms, eps);
        r_shared = (float)(1.0 / sqrt((double)v));
    }
    __syncthreads();
    const float r = r_shared;
    for (long long j = threadIdx.x; j < d; j += blockDim.x) y[base + j] = __fmul_rn(__fmul_rn(row[j], r), w[j]);
}
"""


def rmsnorm_source() -> tuple[str, str]:
    """(CUDA source, function name) of the fused RMSNorm kernel."""
    return _SOURCE, RMSNORM_NAME


def rmsnorm_plan(rows: Any, d: Any, block: Any = RMSNORM_BLOCK) -> dict:
    """One block per row: grid = rows (accepted while rows <= 2^31 - 1 and rows * d fits int64), shared d floats."""
    total = as_type(rows, "int64") * as_type(d, "int64")
    accepts = all_of(rows >= 1, rows <= 2147483647, d >= 1, d <= 12288)

    def offset(row: Any, j: Any) -> Any:
        """Element (row, j)'s index, computed as the kernel does: int64(row) * d + j."""
        return as_type(row, "int64") * as_type(d, "int64") + as_type(j, "int64")

    return {"grid": rows, "block": block, "shared_bytes": 4 * d, "total": total, "accepts": accepts, "offset": offset}


def _canon(r: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(r), np.uint32(0x7FFFFFFF), r.view(np.uint32)).astype(np.uint32).view(F32)


def rmsnorm_host(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The kernel's operations in its order, in NumPy float32 (IEEE, subnormals kept; NaN results canonical)."""
    x = np.ascontiguousarray(x, F32)
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    with np.errstate(all="ignore"):
        acc = np.zeros(rows.shape[0], F32)
        for j in range(d):
            acc = acc + rows[:, j] * rows[:, j]
        v = acc / F32(d) + F32(eps)
        r = (1.0 / np.sqrt(v.astype(np.float64))).astype(F32)
        y = (rows * r[:, None]) * np.asarray(w, F32)[None, :]
    return _canon(y).reshape(x.shape)


def rmsnorm_cuda(fn: Any, x: Any, w: Any, eps: float, out: Any = None) -> Any:
    """Launch the compiled kernel ``fn`` on CuPy arrays (one block per row)."""
    import cupy

    x = cupy.ascontiguousarray(x, dtype=cupy.float32)
    d = int(x.shape[-1])
    rows = int(x.size // d) if d else 0
    y = cupy.empty_like(x) if out is None else out
    if rows:
        fn(
            (rows,),
            (RMSNORM_BLOCK,),
            (x, cupy.ascontiguousarray(w, dtype=cupy.float32), y, np.int64(d), np.float32(eps)),
            shared_mem=4 * d,
        )
    return y
