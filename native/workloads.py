"""Small runs of each family's kernels at the sizes that reach each of their code paths, for sanitizers.

A workload launches the family's kernels on CUDA at the regime witnesses of its plans (empty, one trip,
grid-stride with a shrunken grid, several passes, the tail), so ``compute-sanitizer`` sees every path
with few elements. Workloads register by name; ``python -m native.workloads --run NAME`` runs one (the
process the sanitizer watches).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

import numpy as np

__all__ = ["register_workload", "get_workload", "workloads", "main"]

_WORKLOADS: dict[str, Callable[[], int]] = {}


def register_workload(name: str) -> Callable[[Callable[[], int]], Callable[[], int]]:
    """Decorator: register ``fn() -> launches`` under ``name``."""

    def deco(fn: Callable[[], int]) -> Callable[[], int]:
        if name in _WORKLOADS and _WORKLOADS[name] is not fn:
            raise ValueError(f"workload {name!r} registered twice")
        _WORKLOADS[name] = fn
        return fn

    return deco


def get_workload(name: str) -> Callable[[], int]:
    """The workload ``name``; KeyError lists the known ones."""
    try:
        return _WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {sorted(_WORKLOADS)}") from None


def workloads() -> list[str]:
    """Registered workload names."""
    return sorted(_WORKLOADS)


# (n, block, max_grid): empty, one element, one trip, a grid-stride loop reached by a one-block grid, a tail.
_GEOMETRIES = ((0, 256, 65536), (1, 256, 65536), (256, 256, 65536), (33, 32, 1), (1000, 32, 2))


@register_workload("elementwise")
def _elementwise() -> int:
    import cupy

    from native import elementwise as ew

    launches = 0
    rng = np.random.default_rng(0)
    for name in sorted(ew.KERNELS):
        k = ew.get_kernel(name)
        for n, block, max_grid in _GEOMETRIES:
            ins = [cupy.asarray(rng.standard_normal(n).astype(np.float32)) for _ in k.inputs]
            ew.run_flat(name, ins, tuple(1.5 for _ in k.scalars), device="cuda", n=n, block=block, max_grid=max_grid)
            launches += 1
    cupy.cuda.runtime.deviceSynchronize()
    return launches


@register_workload("reductions")
def _reductions() -> int:
    import cupy

    from native import reductions as red

    launches = 0
    # One pass, several passes, the unrolled main loop (n >= unroll * grid * block at max_grid 1), a tail.
    for n in (0, 1, 255, 256, 257, 70_000, 8 * 256 + 3):
        x = cupy.asarray(np.random.default_rng(n).standard_normal(n).astype(np.float32))
        red.tree_sum(x, device="cuda")
        red.atomic_sum(x, device="cuda")
        red.fold_sum(x, device="cuda")
        red.tree_sum(x, device="cuda", block=32, max_grid=1)  # the unrolled main loop with few elements
        red.mean(x, device="cuda", order="tree", block=32, max_grid=2)
        launches += 5
    cupy.cuda.runtime.deviceSynchronize()
    return launches


@register_workload("rng")
def _rng() -> int:
    import cupy

    from native import rng

    launches = 0
    x = cupy.ones(1000, dtype=cupy.float32)
    for n, block, max_grid in _GEOMETRIES:  # every mode at each loop regime's geometry
        for mode in rng.MODES:
            xs = x[:n] if mode == "dropout" else None
            rng.generate(mode, (n,), 7, 0, device="cuda", keep_prob=0.5, x=xs, block=block, max_grid=max_grid)
            launches += 1
    cupy.cuda.runtime.deviceSynchronize()
    return launches


@register_workload("transfer")
def _transfer() -> int:
    import cupy

    from native import transfer
    from spec.transfer import TARGETS

    launches = 0
    for n, block, max_grid in _GEOMETRIES:
        values = np.random.default_rng(n).standard_normal(n)
        for target in sorted(TARGETS):
            transfer.upload(values, target, device="cuda", block=block, max_grid=max_grid)
            launches += 1
    cupy.cuda.runtime.deviceSynchronize()
    return launches


def main(argv: list[str] | None = None) -> int:
    """``python -m native.workloads --run NAME [--module M]``: run one registered workload."""
    from native.builds import load_native_modules

    p = argparse.ArgumentParser(prog="python -m native.workloads")
    p.add_argument("--run", required=True, help="registered workload name")
    p.add_argument("--module", action="append", default=[], help="extra module that registers workloads")
    args = p.parse_args(argv)
    load_native_modules()
    for mod in args.module:
        importlib.import_module(mod)
    # Run as __main__ this file is a second module object: the registry is the imported native.workloads.
    registry = importlib.import_module("native.workloads")
    launches = registry.get_workload(args.run)()
    print(f"workload {args.run}: {launches} launches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
