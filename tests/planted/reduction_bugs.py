"""Deliberately wrong reductions: each must be caught by the contract item meant to catch it."""

from __future__ import annotations

from typing import Any

import numpy as np

from native import reductions as red
from obligations.core.symbolic import all_of, as_type

__all__ = ["INTERLEAVED", "tree_sum_interleaved", "scatter_plan_int32_keys", "scatter_plan_unguarded"]


def _host_interleaved(sh: np.ndarray) -> np.ndarray:
    # BUG: interleaved pairs (sh[2t] + sh[2t+1], ...) — fixed and reproducible, but not the stated tree.
    sh = sh.copy()
    s = 1
    while s < sh.shape[1]:
        sh[:, 0 :: 2 * s] = sh[:, 0 :: 2 * s] + sh[:, s :: 2 * s]
        s *= 2
    return sh[:, 0]


INTERLEAVED = red.register_tree_order(
    red.TreeOrder(
        "interleaved",
        "for (int s = 1; s < {block}; s <<= 1) {{ if (t % (2 * s) == 0) sh[t] = sh[t] + sh[t + s]; __syncthreads(); }}",
        _host_interleaved,
        "planted: interleaved-pair tree",
    )
)


def tree_sum_interleaved(x: Any, device: str = "auto") -> Any:
    """The tree sum built with the interleaved combine order."""
    return red.tree_sum(x, device=device, order=INTERLEAVED)


class _Int32Keys(red.ScatterPlan):
    def key(self, i: Any, j: Any) -> Any:
        # BUG: the target index is multiplied in int32 (a C `int` key): wraps once target * m >= 2^31.
        return as_type(as_type(i, "int32") * as_type(self.m, "int32"), "int64") + j


def scatter_plan_int32_keys(m: Any, n_out: Any) -> red.ScatterPlan:
    """scatter_plan whose keys are computed in int32."""
    p = red.scatter_plan(m, n_out)
    return _Int32Keys(p.m, p.n_out, p.keys, p.admissible)


def scatter_plan_unguarded(m: Any, n_out: Any) -> red.ScatterPlan:
    """scatter_plan without the key-space guard (BUG: target * m can exceed int64 for 2^40 x 2^40)."""
    p = red.scatter_plan(m, n_out)
    return red.ScatterPlan(p.m, p.n_out, as_type(n_out, "int64") * m, all_of(m >= 0, n_out >= 0))
