"""Deliberately wrong fusion pieces: each must be caught by the contract item meant to catch it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from native import elementwise as ew
from native import fusion as nf
from native import fusion_kernels as fk
from spec.ir.graph import Graph

__all__ = [
    "extend_across_consumers",
    "compile_multi_consumer",
    "fused_plan_int32",
    "rmsnorm_rows_plan_unpadded",
    "rmsnorm_rows_plan_floor_grid",
]


def extend_across_consumers(
    graph: Graph, tail: int, node: int, uses: dict[int, int], fusable: Callable[[str], bool]
) -> bool:
    """BUG: a chain grows through a producer that has other consumers (no multi-consumer barrier)."""
    n, t = graph[node], graph[tail]
    return fusable(n.kind) and bool(n.parents) and n.parents[0] == tail and n.out_shape == t.out_shape


def compile_multi_consumer(graph: Graph, outputs: Any = None, **kw: Any) -> nf.CUDAProgram:
    """compile_subgraph with the chain rule that ignores multi-consumer barriers."""
    return nf.compile_subgraph(graph, outputs, extend=extend_across_consumers, **kw)


def fused_plan_int32(n: Any, block: Any = ew.DEFAULT_BLOCK, max_grid: Any = ew.DEFAULT_MAX_GRID) -> dict:
    """BUG: the generated kernels' plan with a 32-bit grid-stride index (the seed's `int idx`)."""
    return ew.launch_plan(n, block, max_grid, index_bits=32)


def rmsnorm_rows_plan_unpadded(rows: Any, d: Any) -> dict:
    """BUG: the fast RMSNorm plan with shared rows at stride q (no pad float4): the fold's read-ahead leaves the
    buffer."""
    p = fk.rmsnorm_rows_plan(rows, d)
    q, t = p["q"], p["tile_rows"]
    return {**p, "smem_float4": t * q + 3, "smem_index": lambda r, j: r * q + j}


def rmsnorm_rows_plan_floor_grid(rows: Any, d: Any) -> dict:
    """BUG: the fast RMSNorm plan with grid = rows // tile_rows: a partial last tile has no block."""
    p = fk.rmsnorm_rows_plan(rows, d)
    return {**p, "grid": rows // p["tile_rows"]}
