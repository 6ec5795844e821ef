"""Deliberately wrong reductions: each must be caught by the contract item meant to catch it."""

from __future__ import annotations

from typing import Any

import numpy as np

from native import reductions as red

__all__ = ["INTERLEAVED", "tree_sum_interleaved"]


def _host_interleaved(sh: np.ndarray) -> np.ndarray:
    # BUG: interleaved pairs (sh[2t] + sh[2t+1], ...) — fixed and reproducible, but not the stated tree.
    sh = sh.copy()
    s = 1
    while s < sh.shape[1]:
        sh[:, 0::2 * s] = sh[:, 0::2 * s] + sh[:, s::2 * s]
        s *= 2
    return sh[:, 0]


INTERLEAVED = red.register_tree_order(red.TreeOrder(
    "interleaved",
    "for (int s = 1; s < {block}; s <<= 1) {{ if (t % (2 * s) == 0) sh[t] = sh[t] + sh[t + s]; __syncthreads(); }}",
    _host_interleaved, "planted: interleaved-pair tree"))


def tree_sum_interleaved(x: Any, device: str = "auto") -> Any:
    """The tree sum built with the interleaved combine order."""
    return red.tree_sum(x, device=device, order=INTERLEAVED)
