"""Bandwidth of the deterministic tree sum of 2^28 float32 next to cupy.sum (and the atomic path), same run."""

from __future__ import annotations

import json
import sys

from falsification.engine import time_ms
from falsification.reductions_tests import moderate_floats
from native import reductions as red
from obligations.core.device import cuda_available

__all__ = ["main"]


def main(n: int = 1 << 28, reps: int = 20) -> int:
    """Print GB/s of tree_sum, atomic_sum and cupy.sum; exit 0 (figures only)."""
    ok, why = cuda_available()
    if not ok:
        print(f"bench_reductions: skipped ({why})")
        return 0
    import cupy

    x = cupy.asarray(moderate_floats(0, 1 << 20)).repeat(n >> 20)[:n]
    rows = {
        "tree_sum": lambda: red.tree_sum(x, device="cuda"),
        "atomic_sum": lambda: red.atomic_sum(x, device="cuda"),
        "cupy.sum": lambda: cupy.sum(x),
    }
    ms = {k: time_ms(f, reps, warmup=3) for k, f in rows.items()}
    gbs = {k: n * 4 / v / 1e6 for k, v in ms.items()}
    ratio = gbs["tree_sum"] / gbs["cupy.sum"]
    print(json.dumps({"n": n, "timings_ms": ms, "GB_per_s": gbs, "ratio_tree_vs_cupy": ratio, "goal": 0.8}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:])))
