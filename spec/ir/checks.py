"""Graph checks: well-formedness (SSA discipline), inferred shapes and payloads, as error values.

* :func:`check_well_formed` -- per node, in id order: its id equals its index; its op is registered; every
  parent id is in bounds (0 <= p < len) and strictly earlier (p < id); its parent count is the op's arity;
  its attributes are the op's (names known, required ones present, values of the stated kind). Arity is a
  well-formedness check (so every later pass may index parents by arity).
* :func:`check_inferred_shapes` (alias :func:`check_shapes`) -- runs :func:`check_well_formed` first and
  returns its errors if any; otherwise, in id order, infers each node's shape from its parents' *declared*
  shapes (each already checked against its own inference) and reports a refusal of the shape rule or an
  inferred shape different from the declared one.
* :func:`check_payload` -- every node whose op reads a payload has its entry, with every tensor of the
  right shape.

Every failure is an :class:`IRError` naming the node id, its op, and the shapes involved; errors come in
id order, so the first error is the lowest malformed node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spec.ir.graph import PAYLOAD_KINDS, Graph, Node, Payload, format_shape
from spec.ir.ops import REQUIRED, OpKind, Shape, ShapeRuleError, get_op

__all__ = [
    "IRError",
    "ERROR_KINDS",
    "check_well_formed",
    "check_inferred_shapes",
    "check_shapes",
    "check_payload",
    "check_output",
    "checklist",
    "infer_shapes",
    "node_attrs",
    "expected_payload_shapes",
]

# Every error kind a check or the denotation can return, with what it means.
ERROR_KINDS: dict[str, str] = {
    "id-mismatch": "nodes[i].id != i",
    "unknown-op": "the op tag is not registered",
    "parent-out-of-bounds": "a parent id < 0 or >= the number of nodes",
    "forward-parent": "a parent id >= the node's own id (not topological)",
    "arity": "wrong number of parents for the op",
    "attr": "an attribute is unknown, missing or of the wrong kind",
    "shape-rule": "the parents' shapes or the attributes do not fit the op",
    "shape-mismatch": "the declared shape differs from the inferred one",
    "missing-payload": "a parameterised node has no payload entry (or a tensor is missing)",
    "payload-shape": "a payload tensor has the wrong shape",
    "input": "an input array is missing or has the wrong shape",
    "value": "a value the op cannot evaluate (e.g. an embedding index out of range)",
    "output": "the requested output id is not a node",
}


@dataclass(frozen=True)
class IRError:
    """One check or evaluation failure, located at a node: kind, node id, op, message and shapes."""

    kind: str
    node: int | None
    op: str | None
    message: str
    declared: Shape | None = None
    inferred: Shape | None = None
    parent_shapes: tuple[Shape, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        where = "graph" if self.node is None else f"node {self.node}" + (f" ({self.op})" if self.op else "")
        extra = []
        if self.parent_shapes:
            extra.append("parents " + ", ".join(format_shape(s) for s in self.parent_shapes))
        if self.declared is not None:
            extra.append(f"declared {format_shape(self.declared)}")
        if self.inferred is not None:
            extra.append(f"inferred {format_shape(self.inferred)}")
        tail = f" [{'; '.join(extra)}]" if extra else ""
        return f"{where}: {self.kind}: {self.message}{tail}"


def _attr_ok(kind: str, v: Any) -> bool:
    """Whether attribute value v is of attribute kind ``kind``."""
    is_int = isinstance(v, int) and not isinstance(v, bool)
    checks = {
        "int": lambda: is_int,
        "bool": lambda: isinstance(v, bool),
        "uint64": lambda: is_int and 0 <= v < (1 << 64),
        "float": lambda: isinstance(v, float | int) and not isinstance(v, bool),
        "str": lambda: isinstance(v, str),
        "ints": lambda: (
            is_int or (isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v))
        ),
    }
    return checks[kind]()


def node_attrs(node: Node, op: OpKind) -> dict[str, Any]:
    """The node's attributes with the op's defaults filled in."""
    out = {a.name: a.default for a in op.attrs if a.default is not REQUIRED}
    out.update(node.attrs)
    return out


def _attr_errors(node: Node, op: OpKind) -> list[IRError]:
    errs = []
    known = {a.name: a for a in op.attrs}
    for name in node.attrs:
        if name not in known:
            errs.append(IRError("attr", node.id, node.kind, f"unknown attribute {name!r} (known: {sorted(known)})"))
    for a in op.attrs:
        if a.name not in node.attrs:
            if a.default is REQUIRED:
                errs.append(IRError("attr", node.id, node.kind, f"missing attribute {a.name!r}"))
            continue
        v = node.attrs[a.name]
        if not _attr_ok(a.kind, v):
            errs.append(IRError("attr", node.id, node.kind, f"attribute {a.name}={v!r} is not a {a.kind}"))
        elif a.choices and v not in a.choices:
            errs.append(IRError("attr", node.id, node.kind, f"attribute {a.name}={v!r} not one of {a.choices}"))
    return errs


def check_well_formed(graph: Graph) -> list[IRError]:
    """Ids == indices, known ops, parents in bounds and strictly earlier, arity, attributes; [] if well formed."""
    errs: list[IRError] = []
    n = len(graph.nodes)
    for i, node in enumerate(graph.nodes):
        if node.id != i:
            errs.append(IRError("id-mismatch", i, node.kind, f"node at index {i} has id {node.id}"))
        op = get_op(node.kind)
        if op is None:
            errs.append(IRError("unknown-op", i, node.kind, f"unsupported operator {node.kind!r}"))
            continue
        for p in node.parents:
            if not 0 <= p < n:
                errs.append(IRError("parent-out-of-bounds", i, node.kind, f"parent {p} is not a node id (0..{n - 1})"))
            elif p >= i:
                errs.append(IRError("forward-parent", i, node.kind, f"parent {p} is not earlier than node {i}"))
        k = len(node.parents)
        if not op.accepts_arity(k):
            errs.append(IRError("arity", i, node.kind, f"{node.kind} takes {op.arity_text()} parents, got {k}"))
        if any(d < 0 for d in node.out_shape):
            errs.append(
                IRError("shape-rule", i, node.kind, "negative dimension in the declared shape", declared=node.out_shape)
            )
        errs.extend(_attr_errors(node, op))
    return errs


def infer_node(graph: Graph, node: Node) -> tuple[Shape | None, IRError | None]:
    """The inferred shape of one node of a well-formed graph from its parents' declared shapes."""
    op = get_op(node.kind)
    assert op is not None
    parents = tuple(graph.nodes[p].out_shape for p in node.parents)
    try:
        return tuple(op.shape_rule(parents, node_attrs(node, op), node.out_shape)), None
    except ShapeRuleError as e:
        return None, IRError("shape-rule", node.id, node.kind, str(e), declared=node.out_shape, parent_shapes=parents)


def infer_shapes(graph: Graph) -> list[Shape | None]:
    """Inferred shape per node of a well-formed graph (None where the shape rule refuses)."""
    return [infer_node(graph, node)[0] for node in graph.nodes]


def check_inferred_shapes(graph: Graph) -> list[IRError]:
    """Well-formedness first; then each node's inferred shape equals its declared one; [] if all agree."""
    errs = check_well_formed(graph)
    if errs:
        return errs
    for node in graph.nodes:
        inferred, err = infer_node(graph, node)
        if err is not None:
            errs.append(err)
        elif inferred != node.out_shape:
            parents = tuple(graph.nodes[p].out_shape for p in node.parents)
            errs.append(
                IRError(
                    "shape-mismatch",
                    node.id,
                    node.kind,
                    "declared shape differs from the inferred shape",
                    declared=node.out_shape,
                    inferred=inferred,
                    parent_shapes=parents,
                )
            )
    return errs


check_shapes = check_inferred_shapes


def expected_payload_shapes(graph: Graph, node: Node) -> dict[str, Shape]:
    """Tensor name -> required shape for the payload entry of ``node`` (a node of a shape-checked graph)."""
    op = get_op(node.kind)
    if op is None or op.payload is None:
        return {}
    a = node_attrs(node, op)
    ps = [graph.nodes[p].out_shape for p in node.parents]
    rules: dict[str, Any] = {
        "const": lambda: {"value": node.out_shape},
        "linear": lambda: {"weight": (a["out_features"], ps[0][-1]), "bias": (a["out_features"],)},
        "conv2d": lambda: {"weight": (a["out_channels"], ps[0][-3]) + _pair(a["kernel"]), "bias": (a["out_channels"],)},
        "norm": lambda: {"weight": (ps[0][-1],), "bias": (ps[0][-1],)},
        "rmsnorm": lambda: {"weight": (ps[0][-1],)},
        "embedding": lambda: {"table": (-1, a["dim"])},
    }
    return rules[op.payload]()


def _pair(v: Any) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (v[0], v[1])


def check_payload(graph: Graph, payload: Payload) -> list[IRError]:
    """Every parameterised node of a shape-checked graph has its payload entry with correctly shaped tensors."""
    errs: list[IRError] = []
    for node in graph.nodes:
        op = get_op(node.kind)
        if op is None or op.payload is None:
            continue
        entry = payload.get(node.id)
        if entry is None:
            errs.append(
                IRError(
                    "missing-payload",
                    node.id,
                    node.kind,
                    f"no payload entry (needs {op.payload}: {PAYLOAD_KINDS[op.payload]})",
                )
            )
            continue
        for name, want in expected_payload_shapes(graph, node).items():
            t = entry.get(name)
            if t is None:
                errs.append(IRError("missing-payload", node.id, node.kind, f"payload[{node.id}] has no {name!r}"))
            elif len(t.shape) != len(want) or any(w not in (-1, d) for w, d in zip(want, t.shape, strict=True)):
                errs.append(
                    IRError(
                        "payload-shape",
                        node.id,
                        node.kind,
                        f"payload[{node.id}].{name} has shape {format_shape(t.shape)}, expected {format_shape(want)}",
                    )
                )
    return errs


def check_output(graph: Graph, output: int | None) -> list[IRError]:
    """The intended output id names a node (None: the last node)."""
    if output is None:
        return [] if graph.nodes else [IRError("output", None, None, "the graph has no nodes")]
    if not 0 <= output < len(graph.nodes):
        return [IRError("output", None, None, f"output id {output} is not a node (0..{len(graph.nodes) - 1})")]
    return []


def checklist(
    graph: Graph, payload: Payload | None = None, output: int | None = None
) -> dict[str, list[IRError] | None]:
    """The compiler checklist: well-formed, shapes, payload, output id; None where a failed step blocks it."""
    wf = check_well_formed(graph)
    shapes = None if wf else check_inferred_shapes(graph)
    ok = not wf and not shapes
    out: dict[str, list[IRError] | None] = {"well-formed": wf, "shapes": shapes}
    out["payload"] = check_payload(graph, payload) if ok and payload is not None else None
    out["output"] = check_output(graph, output)
    return out
