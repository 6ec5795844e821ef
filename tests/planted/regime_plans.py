"""Plans with regimes for the regimes engine's tests: a correct grid-stride plan and two planted defects."""

from __future__ import annotations

from typing import Any

from obligations.core.symbolic import all_of, cdiv, smax, smin


def loop_plan(n: Any, block: Any = 256, max_grid: Any = 65536) -> dict:
    """A grid-stride loop's geometry and the three paths it selects."""
    grid = smin(smax(cdiv(n, block), 1), max_grid)
    iterations = cdiv(n, grid * block)
    return {
        "grid": grid,
        "iterations": iterations,
        "regimes": {"empty": n == 0, "one_trip": (n > 0) & (iterations <= 1), "grid_stride": iterations > 1},
    }


def gap_plan(n: Any, block: Any = 256, max_grid: Any = 65536) -> dict:
    """Planted: the regimes forget the empty input (coverage fails at n == 0)."""
    q = loop_plan(n, block, max_grid)
    q["regimes"] = {"one_trip": q["iterations"] == 1, "grid_stride": q["iterations"] > 1}
    return q


def unreachable_plan(n: Any, block: Any = 256, max_grid: Any = 65536) -> dict:
    """Planted: a 'capped' regime (grid hits max_grid) that the item's bounds cannot reach."""
    q = loop_plan(n, block, max_grid)
    q["regimes"] = {**q["regimes"], "grid_capped": q["grid"] == max_grid}
    return q


def guarded_plan(n: Any, block: Any = 256, max_grid: Any = 65536) -> dict:
    """A grid-stride loop with a guard on its buffer: ``fits(size)`` accepts n <= size and n < 2^20."""
    q = loop_plan(n, block, max_grid)
    q["fits"] = lambda size: all_of(n <= size, n < (1 << 20))
    return q


def dead_limit_plan(n: Any, block: Any = 256, max_grid: Any = 65536) -> dict:
    """Planted: a guard whose ``n <= size`` never accepts at its limit (another conjunct refuses n == size)."""
    q = loop_plan(n, block, max_grid)
    q["fits"] = lambda size: all_of(n <= size, n != size)
    return q
