"""Deliberately wrong GEMM wrappers: each must be caught by the contract item meant to catch it."""

from __future__ import annotations

from typing import Any

from native import gemm

__all__ = [
    "args_wrong_transpose",
    "matmul_wrong_transpose",
    "matmul_tf32",
    "matmul_stale_cache",
    "bind_matmul_revalidating",
    "matmul_uncached",
]


def args_wrong_transpose(
    m: int, n: int, k: int, lda: int, ldb: int, ldc: int, trans_a: bool, trans_b: bool
) -> gemm.CublasCall:
    """BUG: B's transpose flag is taken from trans_a (the flags of the two operands crossed)."""
    good = gemm.cublas_args(m, n, k, lda, ldb, ldc, trans_a, trans_b)
    return gemm.CublasCall(
        gemm.OP_T if trans_a else gemm.OP_N,
        good.transb,
        good.m,
        good.n,
        good.k,
        good.first,
        good.lda,
        good.ldb,
        good.ldc,
    )


def matmul_wrong_transpose(a: Any, b: Any, **kw: Any) -> Any:
    """native.gemm.matmul with the crossed transpose flag."""
    return gemm.matmul(a, b, args=args_wrong_transpose, **kw)


def matmul_tf32(a: Any, b: Any, **kw: Any) -> Any:
    """BUG: TF32 switched on (CUBLAS_COMPUTE_32F_FAST_TF32), as CUPY_TF32=1 would."""
    return gemm.matmul(a, b, compute=gemm.COMPUTE_32F_FAST_TF32, **kw)


def _key_without_shapes(a: Any, b: Any, c: Any, *options: Any) -> tuple:
    return ("stale", a.dtype, b.dtype, None if c is None else c.dtype, *options)


def matmul_stale_cache(a: Any, b: Any, **kw: Any) -> Any:
    """BUG: prepared calls keyed without shapes, so a new shape reuses another shape's guarded call."""
    real = gemm._CALL_KEYS[type(a)]
    gemm._CALL_KEYS[type(a)] = _key_without_shapes
    try:
        return gemm.matmul(a, b, **kw)
    finally:
        gemm._CALL_KEYS[type(a)] = real


def bind_matmul_revalidating(a: Any, b: Any, c: Any = None, **kw: Any) -> Any:
    """BUG (performance): the "bound" call redoes the whole per-call validation and preparation every time."""
    gemm.bind_matmul(a, b, c, **kw)  # same checks up front as the real one

    def call() -> Any:
        return gemm._matmul_first(
            None, a, b, False, False, 1.0, 0.0, c, None, kw.get("device", "auto"), gemm.COMPUTE_32F, gemm.cublas_args
        )

    return call


def matmul_uncached(a: Any, b: Any, **kw: Any) -> Any:
    """BUG (performance): no call cache, every call validates, guards and prepares anew (a first call each time)."""
    gemm.clear_calls()
    return gemm.matmul(a, b, **kw)
