"""A deliberately wrong elementwise launch plan: the kernel build whose loop index is a 32-bit int."""

from __future__ import annotations

from typing import Any

from native.elementwise import DEFAULT_BLOCK, DEFAULT_MAX_GRID, launch_plan


def launch_plan_wrap32(n: Any, block: Any = DEFAULT_BLOCK, max_grid: Any = DEFAULT_MAX_GRID) -> dict:
    # BUG: `int i` in the kernel: the final i += stride past n wraps near 2^31.
    return launch_plan(n, block, max_grid, index_bits=32)
