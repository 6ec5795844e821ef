"""Deliberately wrong RNG plans: each one must be caught by the obligation meant to catch it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from native import rng
from obligations.core.symbolic import as_type

__all__ = ["plan_index_off_by_one", "plan_int32_offset"]


@dataclass(frozen=True)
class _OffByOne(rng.RngPlan):
    def draw_offset(self, i: Any, j: Any) -> Any:
        # BUG: element i reads the word of element i + 1 (the last element reads past its call's range).
        return i * self.draws + j + 1


@dataclass(frozen=True)
class _Int32Offset(rng.RngPlan):
    def draw_offset(self, i: Any, j: Any) -> Any:
        # BUG: a 32-bit index, as in kernels written with `int i`: wraps past 2^31 - 1.
        return as_type(i, "int32") * as_type(self.draws, "int32") + as_type(j, "int32")


def _rebuild(cls: type, plan: rng.RngPlan) -> Any:
    return cls(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)})


def plan_index_off_by_one(n_elems: Any, draws: Any) -> Any:
    """The shipped plan with draw_offset(i, j) = i * draws + j + 1."""
    return _rebuild(_OffByOne, rng.rng_plan(n_elems, draws))


def plan_int32_offset(n_elems: Any, draws: Any) -> Any:
    """The shipped plan with the offset computed in int32."""
    return _rebuild(_Int32Offset, rng.rng_plan(n_elems, draws))
