"""GEMM on row-major buffers through column-major cuBLAS: the launch/buffer plan, its guard, and the call.

The plan is the arithmetic that runs: :func:`gemm_plan` is called with ints before every cuBLAS call and
with checker terms by ``kc check`` (contracts/cublas-gemm-v1.yaml), so the proof is about this code.

Layout. ``op(A)`` is m x k, ``op(B)`` is k x n, C is m x n, all row-major. A stored matrix is read as
``op(X) = X`` (``trans_x`` false, stored rows x cols = logical) or ``op(X) = X^T`` (``trans_x`` true, the
stored matrix is the transpose). Leading dimensions count elements between consecutive stored rows.
Sizes are in elements of ``elem_size`` bytes (2 for fp16, 4 for fp32); buffer lengths are in bytes.
cuBLAS dimensions and leading dimensions are C ``int`` (int32); offsets and element counts are int64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from obligations.symbolic import all_of, as_type, select

__all__ = ["GemmPlan", "gemm_plan", "BufferTooSmall", "check_buffers", "ELEMENT_SIZES"]

ELEMENT_SIZES = {"float16": 2, "float32": 4}


class BufferTooSmall(ValueError):
    """Raised before cuBLAS is reached when a buffer cannot hold the matrix the call would touch."""


@dataclass(frozen=True)
class GemmPlan:
    """Stored shapes and element counts of one row-major GEMM call."""

    m: Any
    n: Any
    k: Any
    lda: Any
    ldb: Any
    ldc: Any
    trans_a: Any
    trans_b: Any
    elem_size: Any
    a_rows: Any
    a_cols: Any
    b_rows: Any
    b_cols: Any
    a_elems: Any
    b_elems: Any
    c_elems: Any
    shape_ok: Any

    def accepts(self, a_bytes: Any, b_bytes: Any, c_bytes: Any) -> Any:
        """The guard: true iff the shape is valid and every buffer holds its stored matrix."""
        es = self.elem_size
        # Divide the buffer instead of multiplying the need: elems * elem_size can pass int64 at 2^31 dims.
        return all_of(
            self.shape_ok,
            a_bytes >= 0,
            b_bytes >= 0,
            c_bytes >= 0,
            self.a_elems <= a_bytes // es,
            self.b_elems <= b_bytes // es,
            self.c_elems <= c_bytes // es,
        )

    def a_offset(self, i: Any, p: Any) -> Any:
        """Element offset of op(A)[i, p] in A's buffer."""
        row, col = select(self.trans_a, p, i), select(self.trans_a, i, p)
        return as_type(row, "int64") * self.lda + col

    def b_offset(self, p: Any, j: Any) -> Any:
        """Element offset of op(B)[p, j] in B's buffer."""
        row, col = select(self.trans_b, j, p), select(self.trans_b, p, j)
        return as_type(row, "int64") * self.ldb + col

    def c_offset(self, i: Any, j: Any) -> Any:
        """Element offset of C[i, j] in C's buffer."""
        return as_type(i, "int64") * self.ldc + j


def gemm_plan(m: Any, n: Any, k: Any, lda: Any, ldb: Any, ldc: Any, trans_a: Any, trans_b: Any,
              elem_size: Any) -> GemmPlan:
    """The plan of C[m,n] = op(A)[m,k] op(B)[k,n]: stored shapes, element counts and shape validity."""
    a_rows, a_cols = select(trans_a, k, m), select(trans_a, m, k)
    b_rows, b_cols = select(trans_b, n, k), select(trans_b, k, n)
    shape_ok = all_of(m >= 1, n >= 1, k >= 1, lda >= a_cols, ldb >= b_cols, ldc >= n,
                      elem_size >= 1)
    # Last touched element + 1 of a rows x cols matrix with leading dimension ld, in int64.
    a_elems = (as_type(a_rows, "int64") - 1) * lda + a_cols
    b_elems = (as_type(b_rows, "int64") - 1) * ldb + b_cols
    c_elems = (as_type(m, "int64") - 1) * ldc + n
    return GemmPlan(m, n, k, lda, ldb, ldc, trans_a, trans_b, elem_size,
                    a_rows, a_cols, b_rows, b_cols, a_elems, b_elems, c_elems, shape_ok)


def check_buffers(plan: GemmPlan, a_bytes: int, b_bytes: int, c_bytes: int) -> None:
    """Raise BufferTooSmall unless ``plan.accepts`` the buffer lengths (runs before every cuBLAS call)."""
    if not plan.accepts(a_bytes, b_bytes, c_bytes):
        es = plan.elem_size
        raise BufferTooSmall(
            f"GEMM m={plan.m} n={plan.n} k={plan.k} lda={plan.lda} ldb={plan.ldb} ldc={plan.ldc} "
            f"trans_a={plan.trans_a} trans_b={plan.trans_b}: needs A {plan.a_elems * es} B {plan.b_elems * es} "
            f"C {plan.c_elems * es} bytes (and ld >= stored cols), got A {a_bytes} B {b_bytes} C {c_bytes}"
        )
