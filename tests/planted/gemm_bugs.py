"""Deliberately wrong GEMM plans: each one must be caught by the obligation meant to catch it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from native import gemm
from obligations.core.symbolic import all_of, as_type, select


def _rebuild(cls: type, plan: gemm.GemmPlan, **changes: Any) -> Any:
    values = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
    values.update(changes)
    return cls(**values)


@dataclass(frozen=True)
class _MissingElemSize(gemm.GemmPlan):
    def accepts(self, a_bytes: Any, b_bytes: Any, c_bytes: Any) -> Any:
        # BUG: compares element counts with byte lengths.
        return all_of(
            self.shape_ok,
            a_bytes >= 0,
            b_bytes >= 0,
            c_bytes >= 0,
            self.a_elems <= a_bytes,
            self.b_elems <= b_bytes,
            self.c_elems <= c_bytes,
        )


def plan_missing_elem_size(m, n, k, lda, ldb, ldc, trans_a, trans_b, elem_size):  # noqa: ANN001, ANN201
    return _rebuild(_MissingElemSize, gemm.gemm_plan(m, n, k, lda, ldb, ldc, trans_a, trans_b, elem_size))


@dataclass(frozen=True)
class _Int32Offset(gemm.GemmPlan):
    def a_offset(self, i: Any, p: Any) -> Any:
        # BUG: row * lda in int32 wraps once it passes 2^31 - 1.
        row, col = select(self.trans_a, p, i), select(self.trans_a, i, p)
        return row * self.lda + col


def plan_int32_offset(m, n, k, lda, ldb, ldc, trans_a, trans_b, elem_size):  # noqa: ANN001, ANN201
    return _rebuild(_Int32Offset, gemm.gemm_plan(m, n, k, lda, ldb, ldc, trans_a, trans_b, elem_size))


def plan_ld_ignores_transpose(m, n, k, lda, ldb, ldc, trans_a, trans_b, elem_size):  # noqa: ANN001, ANN201
    plan = gemm.gemm_plan(m, n, k, lda, ldb, ldc, trans_a, trans_b, elem_size)
    # BUG: A's leading dimension checked against k whatever the layout (stored A^T has m columns).
    shape_ok = all_of(m >= 1, n >= 1, k >= 1, lda >= k, ldb >= plan.b_cols, ldc >= n, elem_size >= 1)
    a_elems = (as_type(plan.a_rows, "int64") - 1) * lda + k
    return dataclasses.replace(plan, shape_ok=shape_ok, a_elems=a_elems)
