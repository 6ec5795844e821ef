"""Deliberately wrong GraphSpec lowerings: each must be caught by ``graphspec.lowering_meaning``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from spec.ir import graphspec as gs
from spec.ir.graph import Graph, Payload


def _rebuild(low: gs.Lowered, graph: Graph | None = None, payload: Payload | None = None) -> gs.Lowered:
    return gs.Lowered(graph or low.graph, payload or low.payload, low.output, low.node_of_step)


def lower_swapped_operands(g: Any, params: Sequence[Any] | None = None) -> gs.Lowered:
    """BUG: multi-input nodes (sub, concat, add) get their parents in reverse order."""
    low = gs.lower(g, params)
    nodes = tuple(
        n.replace(parents=n.parents[::-1]) if n.kind in ("sub", "concat", "add") else n for n in low.graph.nodes
    )
    return _rebuild(low, graph=Graph(nodes))


def lower_dropped_bias(g: Any, params: Sequence[Any] | None = None) -> gs.Lowered:
    """BUG: linear and conv2d nodes get a zero bias instead of theirs."""
    low = gs.lower(g, params)
    entries = {
        k: ({**v, "bias": np.zeros_like(v["bias"])} if "bias" in v and low.graph.nodes[k].kind != "layernorm" else v)
        for k, v in low.payload.entries.items()
    }
    return _rebuild(low, payload=Payload(entries))


def lower_transposed_weight(g: Any, params: Sequence[Any] | None = None) -> gs.Lowered:
    """BUG: square linear weights are stored transposed (same shape, so every check of shapes passes)."""
    low = gs.lower(g, params)
    entries = {
        k: (
            {**v, "weight": np.ascontiguousarray(v["weight"].T)}
            if low.graph.nodes[k].kind == "linear" and v["weight"].shape[0] == v["weight"].shape[1]
            else v
        )
        for k, v in low.payload.entries.items()
    }
    return _rebuild(low, payload=Payload(entries))


def lower_shifted_params(g: Any, params: Sequence[Any] | None = None) -> gs.Lowered:
    """BUG: the canonical ABI split is off: layer i gets layer i+1's parameters where the shapes allow it."""
    ps = list(gs.init_params(g) if params is None else params)
    abi = (g if isinstance(g, gs.Dag) else gs.to_dag(g)).params
    for i in range(len(ps) - 2):
        if abi[i].shape == abi[i + 2].shape:
            ps[i], ps[i + 2] = ps[i + 2], ps[i]
            break
    return gs.lower(g, ps)
