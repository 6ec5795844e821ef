"""Planted bugs for the coverage mechanisms: each is caught only by the mechanism it targets."""

from __future__ import annotations

from typing import Any

from native import reductions as red
from obligations.core.device import array_module, resolve_device
from obligations.core.entrypoints import entry_point

__all__ = ["REVERSED", "tree_sum_reversed_loop", "mean_reciprocal", "MEAN_RECIPROCAL"]

# BUG: the unrolled main loop adds its loads last-first. Only calls with n > (unroll - 1) * grid * block run
# that loop: tens of millions of elements at the shipped grid, 225 with the main_loop witness's shrunken grid.
REVERSED = red.register_main_loop(
    red.MainLoop(
        "reversed",
        "for (int u = {unroll} - 1; u >= 0; --u) acc = acc + v[u];",
        lambda unroll: list(range(unroll))[::-1],
        "planted: the group's loads added in reverse trip order",
    )
)


def tree_sum_reversed_loop(x: Any, device: str = "auto", block: int = red.BLOCK, max_grid: int = red.MAX_GRID) -> Any:
    """The tree sum with the planted main loop."""
    return red.tree_sum(x, device=device, block=block, max_grid=max_grid, loop=REVERSED)


def _mean_reciprocal(x: Any, device: str = "auto") -> Any:
    """BUG: the mean multiplies by fl(1/n) instead of dividing once by n (differs in the last bit)."""
    xp = array_module(resolve_device(device))
    x = xp.asarray(x, dtype=xp.float32)
    return red.fold_sum(x, device=device) * (xp.float32(1) / xp.float32(max(int(x.size), 1)))


MEAN_RECIPROCAL = ("reductions", "mean_reciprocal")


def mean_reciprocal() -> Any:
    """Register the planted entry point (a reductions entry point that no contract item calls) and return it."""
    # Planted in the shipped module (as if native/reductions.py had gained it): the contract answers for it.
    _mean_reciprocal.__module__ = "native.reductions"
    return entry_point("reductions", name="mean_reciprocal")(_mean_reciprocal)
