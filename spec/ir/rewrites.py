"""Graph rewrites that preserve the denotation bit for bit and keep graphs well formed and shape-checked.

* :func:`eliminate_dead_nodes` -- keep the output nodes, their ancestors and every input node (inputs are
  the graph's interface), renumber ids in order, re-key the payload.
* :func:`fold_reshapes` -- a reshape/flatten whose parent is a reshape/flatten reads the grandparent
  directly (row-major reshapes compose); a reshape/flatten to its parent's own shape is bypassed (its
  consumers read the parent). Ids are kept; bypassed nodes become dead.
* :func:`fold_constants` -- a node with at least one parent whose parents are all ``const`` becomes a
  ``const`` whose payload value is that node's denotation (computed by the same evaluator). Ids are kept.
* :func:`simplify` -- fold_reshapes, fold_constants, then eliminate_dead_nodes.

Each returns a :class:`Rewritten` with the new graph and payload and ``mapping``: old id -> new id for every
node whose value the new graph still computes (``denote(g, p, x, o) == denote(g', p', x, mapping[o])``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from spec.ir.checks import check_well_formed
from spec.ir.denote import eval_node, floats
from spec.ir.graph import Attrs, Graph, Node, Payload

__all__ = [
    "Rewritten",
    "RESHAPE_LIKE",
    "eliminate_dead_nodes",
    "fold_reshapes",
    "fold_constants",
    "simplify",
    "REWRITES",
]

RESHAPE_LIKE: tuple[str, ...] = ("reshape", "flatten")  # ops whose value is the row-major reshape of a parent


@dataclass(frozen=True)
class Rewritten:
    """A rewrite's result: graph, payload and old id -> new id for the nodes it still computes."""

    graph: Graph
    payload: Payload
    mapping: Mapping[int, int]


def _require_well_formed(graph: Graph) -> None:
    errs = check_well_formed(graph)
    if errs:
        raise ValueError(f"rewrites need a well-formed graph: {errs[0]}")


def _live(graph: Graph, outputs: Iterable[int]) -> set[int]:
    """Ids of the outputs, their ancestors and the input nodes."""
    live: set[int] = set()
    stack = list(outputs)
    while stack:
        i = stack.pop()
        if i not in live:
            live.add(i)
            stack.extend(graph.nodes[i].parents)
    return live | set(graph.input_ids())


def eliminate_dead_nodes(graph: Graph, payload: Payload, outputs: Iterable[int] | None = None) -> Rewritten:
    """Drop nodes no output depends on (inputs stay); renumber; re-key the payload."""
    _require_well_formed(graph)
    outs = [len(graph.nodes) - 1] if outputs is None else list(outputs)
    if not graph.nodes:
        return Rewritten(graph, payload, {})
    live = _live(graph, outs)
    mapping: dict[int, int] = {}
    nodes: list[Node] = []
    for n in graph.nodes:
        if n.id in live:
            mapping[n.id] = len(nodes)
            nodes.append(n.replace(id=len(nodes), parents=tuple(mapping[p] for p in n.parents)))
    return Rewritten(Graph(tuple(nodes)), payload.remap(mapping), mapping)


def fold_reshapes(graph: Graph, payload: Payload) -> Rewritten:
    """Compose chained reshapes and bypass identity reshapes (ids kept)."""
    _require_well_formed(graph)
    nodes = list(graph.nodes)
    redirect: dict[int, int] = {}
    for i, n in enumerate(nodes):
        parents = tuple(redirect.get(p, p) for p in n.parents)
        n = n.replace(parents=parents)
        if n.kind in RESHAPE_LIKE:
            src = nodes[parents[0]]
            if src.kind in RESHAPE_LIKE:
                n = Node(n.id, (src.parents[0],), "reshape", n.out_shape, Attrs({"shape": n.out_shape}))
            if nodes[n.parents[0]].out_shape == n.out_shape:
                redirect[i] = n.parents[0]
        nodes[i] = n
    mapping = {i: redirect.get(i, i) for i in range(len(nodes))}
    return Rewritten(Graph(tuple(nodes)), payload, mapping)


def _fold_value(graph: Graph, payload: Payload, values: dict[int, np.ndarray], node: Node) -> np.ndarray | None:
    """The denotation of ``node`` from its constant parents' values (bits), or None if it cannot evaluate."""
    table: list[np.ndarray] = [values.get(i, np.zeros(0, np.uint32)) for i in range(node.id)]
    out = eval_node(graph, payload, table, node, {})
    return out if isinstance(out, np.ndarray) else None


def fold_constants(graph: Graph, payload: Payload) -> Rewritten:
    """Replace every non-leaf node whose parents are all constants by a constant with its value (ids kept)."""
    _require_well_formed(graph)
    nodes = list(graph.nodes)
    entries = dict(payload.entries)
    values: dict[int, np.ndarray] = {}
    for i, n in enumerate(nodes):
        if n.kind == "const":
            v = (entries.get(i) or {}).get("value")
            if v is not None and tuple(v.shape) == n.out_shape:
                values[i] = np.array(v, dtype=np.float32).view(np.uint32)
            continue
        if not n.parents or n.kind == "input" or not all(p in values for p in n.parents):
            continue
        out = _fold_value(Graph(tuple(nodes)), Payload(entries), values, n)
        if out is None:
            continue
        values[i] = out
        nodes[i] = Node(i, (), "const", n.out_shape)
        entries[i] = {"value": floats(out).copy()}
    return Rewritten(Graph(tuple(nodes)), Payload(entries), {i: i for i in range(len(nodes))})


def simplify(graph: Graph, payload: Payload, outputs: Iterable[int] | None = None) -> Rewritten:
    """fold_reshapes, fold_constants, then eliminate_dead_nodes; mapping composed."""
    outs = [len(graph.nodes) - 1] if outputs is None else list(outputs)
    r1 = fold_reshapes(graph, payload)
    r2 = fold_constants(r1.graph, r1.payload)
    r3 = eliminate_dead_nodes(r2.graph, r2.payload, [r1.mapping[o] for o in outs])
    mapping = {o: r3.mapping[r1.mapping[o]] for o in range(len(graph.nodes)) if r1.mapping[o] in r3.mapping}
    return Rewritten(r3.graph, r3.payload, mapping)


# Every rewrite, by name: fn(graph, payload) -> Rewritten.
REWRITES = {
    "dead-node-elimination": lambda g, p: eliminate_dead_nodes(g, p),
    "reshape-folding": fold_reshapes,
    "constant-folding": fold_constants,
    "simplify": lambda g, p: simplify(g, p),
}
