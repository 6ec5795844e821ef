"""Graph IR data types: frozen nodes, graphs that hold only structure, and payloads keyed by node id.

A :class:`Graph` is a tuple of :class:`Node` values (id == index, parents strictly earlier: SSA). A node
holds its id, parent ids, op tag (a name registered in :mod:`spec.ir.ops`), declared output shape and its
attributes (ints, floats, strings and tuples of ints only: never tensors, never callables). Parameters
live outside the graph in a :class:`Payload` keyed by node id (the seed's "linear with one parent"
convention): ``payload.get(1)`` is ``{"weight": W, "bias": b}`` for a linear node 1.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Attrs", "Node", "Graph", "GraphBuilder", "Payload", "PAYLOAD_KINDS", "format_graph", "format_shape"]

# Payload entry kinds: the tensor names each kind holds (the shapes are checked in spec.ir.checks).
PAYLOAD_KINDS: dict[str, tuple[str, ...]] = {
    "const": ("value",),
    "linear": ("weight", "bias"),
    "conv2d": ("weight", "bias"),
    "norm": ("weight", "bias"),
    "rmsnorm": ("weight",),
    "embedding": ("table",),
}

_SCALARS = (bool, int, float, str)


def _freeze(value: Any) -> Any:
    """An attribute value as an immutable scalar or tuple of scalars; TypeError for anything else."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, list | tuple):
        items = tuple(_freeze(v) for v in value)
        if any(isinstance(v, tuple) for v in items):
            raise TypeError("attribute values are scalars or flat tuples of scalars (no nested data, no tensors)")
        return items
    raise TypeError(
        f"attribute values are scalars or tuples of scalars, not {type(value).__name__} "
        "(parameters belong in the Payload)"
    )


class Attrs(Mapping[str, Any]):
    """An immutable, hashable mapping of attribute name to scalar or tuple value."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()):
        pairs = items.items() if isinstance(items, Mapping) else items
        self._items: tuple[tuple[str, Any], ...] = tuple(sorted((str(k), _freeze(v)) for k, v in pairs))

    def __getitem__(self, key: str) -> Any:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Attrs):
            return self._items == other._items
        if isinstance(other, Mapping):
            return dict(self._items) == {k: _freeze(v) for k, v in other.items()}
        return NotImplemented

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}: {v!r}" for k, v in self._items) + "}"


@dataclass(frozen=True)
class Node:
    """One IR node: id (== its index), parent ids, op tag, declared output shape, attributes."""

    id: int
    parents: tuple[int, ...]
    kind: str
    out_shape: tuple[int, ...]
    attrs: Attrs = field(default_factory=Attrs)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parents", tuple(int(p) for p in self.parents))
        object.__setattr__(self, "out_shape", tuple(int(d) for d in self.out_shape))
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs))

    def replace(self, **changes: Any) -> Node:
        """A copy with the given fields changed."""
        fields = {
            "id": self.id,
            "parents": self.parents,
            "kind": self.kind,
            "out_shape": self.out_shape,
            "attrs": self.attrs,
        }
        fields.update(changes)
        return Node(**fields)


@dataclass(frozen=True)
class Graph:
    """A graph: its nodes in id order (structure only; parameters are in a Payload)."""

    nodes: tuple[Node, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __getitem__(self, i: int) -> Node:
        return self.nodes[i]

    def input_ids(self) -> tuple[int, ...]:
        """Ids of the ``input`` nodes, in id order (the order inputs are passed in)."""
        return tuple(n.id for n in self.nodes if n.kind == "input")

    def consumers(self) -> dict[int, tuple[int, ...]]:
        """For each node index, the ids of the nodes that read it."""
        out: dict[int, list[int]] = {i: [] for i in range(len(self.nodes))}
        for n in self.nodes:
            for p in n.parents:
                if p in out:
                    out[p].append(n.id)
        return {k: tuple(v) for k, v in out.items()}

    def text(self) -> str:
        """The graph in its text form, one node per line."""
        return format_graph(self)

    def __str__(self) -> str:
        return format_graph(self)


class GraphBuilder:
    """Append-only construction: ``b.add(kind, parents, out_shape, **attrs)`` returns the new node's id."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.payload: dict[int, dict[str, Any]] = {}

    def add(
        self,
        kind: str,
        parents: Iterable[int],
        out_shape: Iterable[int],
        *,
        params: Mapping[str, Any] | None = None,
        **attrs: Any,
    ) -> int:
        """Append a node (id = its index), with optional payload tensors; return its id."""
        nid = len(self.nodes)
        self.nodes.append(Node(nid, tuple(parents), kind, tuple(out_shape), Attrs(attrs)))
        if params is not None:
            self.payload[nid] = dict(params)
        return nid

    def build(self) -> tuple[Graph, Payload]:
        """The graph and payload built so far."""
        return Graph(tuple(self.nodes)), Payload(self.payload)


# The arrays payloads have frozen (copied, read-only), by id: another payload takes one as it is. Payloads are
# rebuilt at every rewrite (remap, build, dead-node elimination), and copying each tensor each time was 0.9 of a
# 1.3 s training step graph (MLP 2048-4096-2048, batch 4096; TRAIN-MFU).
_FROZEN: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def _as_f32(a: Any) -> np.ndarray:
    if _FROZEN.get(id(a)) is a:
        return a
    arr = np.asarray(a)
    if arr.dtype == np.uint32:  # bit patterns
        out = np.array(arr, order="C").view(np.float32)
    else:
        out = np.array(arr, dtype=np.float32, order="C")
    out.flags.writeable = False
    _FROZEN[id(out)] = out
    return out


@dataclass(frozen=True)
class Payload:
    """Parameters outside the graph: node id -> {tensor name: float32 array}. Lookups return None if absent."""

    entries: Mapping[int, Mapping[str, np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        frozen: dict[int, dict[str, np.ndarray]] = {}
        for nid, tensors in dict(self.entries).items():
            frozen[int(nid)] = {}
            for name, arr in dict(tensors).items():
                frozen[int(nid)][str(name)] = _as_f32(arr)
        object.__setattr__(self, "entries", frozen)

    def get(self, node_id: int) -> Mapping[str, np.ndarray] | None:
        """The tensors stored for ``node_id``, or None."""
        return self.entries.get(node_id)

    def tensor(self, node_id: int, name: str) -> np.ndarray | None:
        """One tensor stored for ``node_id``, or None."""
        entry = self.entries.get(node_id)
        return None if entry is None else entry.get(name)

    def with_entry(self, node_id: int, **tensors: Any) -> Payload:
        """A payload with ``node_id``'s entry replaced by ``tensors``."""
        return Payload({**self.entries, node_id: tensors})

    def without(self, node_id: int) -> Payload:
        """A payload without ``node_id``'s entry."""
        return Payload({k: v for k, v in self.entries.items() if k != node_id})

    def remap(self, mapping: Mapping[int, int]) -> Payload:
        """Entries re-keyed by ``mapping`` (old id -> new id); ids not in it are dropped."""
        return Payload({mapping[k]: v for k, v in self.entries.items() if k in mapping})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Payload):
            return NotImplemented
        if self.entries.keys() != other.entries.keys():
            return False
        for k, tensors in self.entries.items():
            o = other.entries[k]
            if tensors.keys() != o.keys():
                return False
            for name, a in tensors.items():
                b = o[name]
                if a.shape != b.shape or not np.array_equal(a.view(np.uint32), b.view(np.uint32)):
                    return False
        return True

    __hash__ = None  # type: ignore[assignment]


def format_shape(shape: Iterable[int]) -> str:
    """A shape as ``[2, 3]`` (a scalar is ``[]``)."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def format_graph(graph: Graph) -> str:
    """The text form: ``node 1 : linear  parents [0]  shape [3]  {out_features: 3}`` per line."""
    width = max((len(n.kind) for n in graph.nodes), default=0)
    lines = []
    for i, n in enumerate(graph.nodes):
        attrs = f"  {n.attrs!r}" if len(n.attrs) else ""
        mark = "" if n.id == i else f"  (at index {i})"
        lines.append(
            f"node {n.id} : {n.kind:<{width}}  parents {format_shape(n.parents)}  "
            f"shape {format_shape(n.out_shape)}{attrs}{mark}"
        )
    return "\n".join(lines)
