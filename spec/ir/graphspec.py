"""GraphSpec: a typed model DSL with two meanings, a pure binary32 reference and a lowering to the graph IR.

A model is written once from :class:`Primitive` records composed with ``>>`` (the seed's ``>>>``:
sequential composition; Python has no ``>>>`` operator) and, for sharing, skip connections and
multi-input nodes, the DAG surface :class:`DagBuilder`. Then

* ``spec(g)(params, x)`` evaluates it directly, structurally over the chain (each primitive's spec
  forward in IEEE binary32, through the same per-op semantics as :mod:`spec.ir.denote`), and
* ``lower(g, params)`` compiles it to an IR :class:`~spec.ir.graph.Graph` plus its
  :class:`~spec.ir.graph.Payload`: the sequential form is first lowered into the DAG surface
  (:func:`to_dag`), then every DAG step emits IR nodes through its primitive's lowering.

``denote(lower(g, p)) == spec(g)(p, x)`` bit for bit is the claim contract item ``IR-GS-LOWER-meaning``
tests on generated models.

Shapes are checked when a graph is built: ``a >> b`` instantiates ``b`` at ``a``'s output shape and a
mismatch raises :class:`GraphSpecShapeError` naming both shapes and the position in the chain.
Shape-polymorphic primitives (activations, softmax, layer norm, pooling, ``Linear`` over leading axes)
take their input shape from the stage before them. A graph maps one tensor of its input shape; there is
no implicit batch axis (a ``Linear`` acts on the last axis, so a leading axis is allowed).

The parameter ABI of a graph is the concatenation of its parts' typed parameter lists (:class:`ParamSpec`,
in chain / DAG-step order); evaluation splits a flat parameter list canonically. :func:`init_params` gives
deterministic parameters: the i-th layer occurrence (primitives with ``counts_as_layer``, i from 0 in
ABI order) draws its weight from SplitMix64 seed ``2 i`` and its bias from seed ``2 i + 1``
(:mod:`spec.rng`), uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]``; norm scales start at 1, shifts at 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spec import rng as srng
from spec.ir.checks import node_attrs
from spec.ir.denote import EVALUATORS
from spec.ir.denote import bits as _bits
from spec.ir.denote import floats as _floats
from spec.ir.graph import Graph as IRGraph
from spec.ir.graph import GraphBuilder, Node, Payload
from spec.ir.ops import ShapeRuleError, get_op

__all__ = [
    "Shape",
    "GraphSpecShapeError",
    "GraphSpecParamError",
    "ParamSpec",
    "Primitive",
    "PrimitiveKind",
    "PRIMITIVE_KINDS",
    "register_primitive_kind",
    "Template",
    "BlockTemplate",
    "Graph",
    "Id",
    "Prim",
    "Seq",
    "Block",
    "identity",
    "id",
    "prim",
    "seq",
    "Linear",
    "ReLU",
    "Tanh",
    "Sigmoid",
    "Conv2d",
    "Pool",
    "MaxPool",
    "AvgPool",
    "Flatten",
    "Softmax",
    "LayerNorm",
    "Value",
    "DagStep",
    "DagOp",
    "DAG_OPS",
    "Dag",
    "DagBuilder",
    "residual",
    "to_dag",
    "spec",
    "split_params",
    "init_params",
    "Lowered",
    "lower",
    "lower_dag",
]

Shape = tuple[int, ...]


class GraphSpecShapeError(ValueError):
    """A graph that does not type-check: names both shapes and where (chain position or DAG step)."""


class GraphSpecParamError(ValueError):
    """A parameter list that does not match the graph's ABI (count or a shape), naming the slot."""


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _f32(a: Any) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype == np.uint32:
        return np.ascontiguousarray(arr).view(np.float32)
    return np.ascontiguousarray(arr, dtype=np.float32)


# -- primitives -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamSpec:
    """One typed slot of a parameter ABI: its name, shape, role and how :func:`init_params` fills it."""

    name: str
    shape: Shape
    init: str  # "uniform" (seeded, bound 1/sqrt(fan_in)), "ones" or "zeros"
    fan_in: int = 1


@dataclass(frozen=True)
class Primitive:
    """A primitive at concrete shapes: kind, attributes, parameter ABI, input and output shape.

    Its spec forward and its lowering are those of its registered :class:`PrimitiveKind` (looked up by
    ``kind`` at evaluation / lowering time, so both meanings come from one record).
    """

    kind: str
    attrs: tuple[tuple[str, Any], ...]
    params: tuple[ParamSpec, ...]
    in_shape: Shape
    out_shape: Shape
    counts_as_layer: bool = False

    @property
    def attr(self) -> dict[str, Any]:
        """The attributes as a dict."""
        return dict(self.attrs)

    @property
    def label(self) -> str:
        """A readable name: ``Linear(4 -> 8)``."""
        return PRIMITIVE_KINDS[self.kind].label(self)

    def forward(self, params: Sequence[np.ndarray], x: np.ndarray) -> np.ndarray:
        """The spec forward: binary32 output of this primitive on ``x`` with its parameter slice."""
        return PRIMITIVE_KINDS[self.kind].forward(self, tuple(_f32(p) for p in params), _f32(x))

    def __rshift__(self, other: Any) -> Graph:
        return seq(prim(self), other)


@dataclass(frozen=True)
class PrimitiveKind:
    """A registered primitive kind: how it instantiates at an input shape, its spec forward, its lowering.

    ``at(in_shape, attrs) -> Primitive`` raises :class:`GraphSpecShapeError` (without position; the caller
    adds it) when the input shape does not fit. ``forward(p, params, x)`` is the pure reference;
    ``lower(b, p, params, x_id) -> id`` emits IR nodes into a :class:`~spec.ir.graph.GraphBuilder`.
    """

    name: str
    at: Callable[[Shape, Mapping[str, Any]], Primitive]
    forward: Callable[[Primitive, tuple[np.ndarray, ...], np.ndarray], np.ndarray]
    lower: Callable[[GraphBuilder, Primitive, tuple[np.ndarray, ...], int], int]
    label: Callable[[Primitive], str]
    doc: str = ""


PRIMITIVE_KINDS: dict[str, PrimitiveKind] = {}


def register_primitive_kind(kind: PrimitiveKind) -> PrimitiveKind:
    """Add a primitive kind by name (names are unique)."""
    if kind.name in PRIMITIVE_KINDS:
        raise ValueError(f"primitive kind {kind.name!r} is registered twice")
    PRIMITIVE_KINDS[kind.name] = kind
    return kind


@dataclass(frozen=True)
class Template:
    """A primitive not yet at a shape (``ReLU()``, ``Linear(4, 8)``): instantiated where it is composed.

    ``default_in`` is the input shape it takes when it starts a chain (None: it needs one from context,
    e.g. ``identity((4,)) >> ReLU()``).
    """

    kind: str
    attrs: tuple[tuple[str, Any], ...]
    default_in: Shape | None = None

    def at(self, in_shape: Shape) -> Primitive:
        """The primitive at input shape ``in_shape`` (GraphSpecShapeError if it does not fit)."""
        return PRIMITIVE_KINDS[self.kind].at(tuple(int(d) for d in in_shape), dict(self.attrs))

    def instantiate(self, in_shape: Shape) -> Graph:
        """The one-stage graph at input shape ``in_shape``."""
        return Prim(self.at(in_shape))

    @property
    def label(self) -> str:
        """The kind and attributes, for messages."""
        inner = ", ".join(f"{k}={v}" for k, v in self.attrs)
        return f"{self.kind}({inner})"

    def __rshift__(self, other: Any) -> Graph:
        return seq(prim(self), other)


@dataclass(frozen=True)
class BlockTemplate:
    """A residual block whose body is a template chain: instantiated where it is composed."""

    body: Template
    name: str = "residual"

    @property
    def default_in(self) -> Shape | None:
        """The body's default input shape."""
        return self.body.default_in

    @property
    def label(self) -> str:
        """For messages."""
        return f"{self.name}({self.body.label})"

    def instantiate(self, in_shape: Shape) -> Graph:
        """The residual block at ``in_shape``."""
        return residual(self.body.instantiate(in_shape))

    def __rshift__(self, other: Any) -> Graph:
        return seq(prim(self), other)


# -- sequential graphs ------------------------------------------------------------------------------------


class Graph:
    """A GraphSpec graph: input shape, output shape and parameter ABI; ``a >> b`` composes sequentially."""

    in_shape: Shape
    out_shape: Shape

    @property
    def params(self) -> tuple[ParamSpec, ...]:
        """The parameter ABI: the parts' typed lists concatenated in order."""
        raise NotImplementedError

    @property
    def param_shapes(self) -> tuple[Shape, ...]:
        """Shapes of the ABI's slots, in order."""
        return tuple(p.shape for p in self.params)

    def stages(self) -> tuple[Graph, ...]:
        """The chain flattened into its stages (Prim and Block values; Id contributes none)."""
        raise NotImplementedError

    def __rshift__(self, other: Any) -> Graph:
        return seq(self, other)

    def __rrshift__(self, other: Any) -> Graph:
        return seq(other, self)

    def describe(self) -> str:
        """The chain as ``Linear(4 -> 8) >> ReLU[8] >> ...``."""
        parts = [_stage_label(s) for s in self.stages()]
        return " >> ".join(parts) if parts else f"id{_fmt(self.in_shape)}"


@dataclass(frozen=True, eq=True)
class Id(Graph):
    """The identity graph on ``shape``: no parameters."""

    shape: Shape

    @property
    def in_shape(self) -> Shape:  # type: ignore[override]
        return self.shape

    @property
    def out_shape(self) -> Shape:  # type: ignore[override]
        return self.shape

    @property
    def params(self) -> tuple[ParamSpec, ...]:
        return ()

    def stages(self) -> tuple[Graph, ...]:
        return ()


@dataclass(frozen=True, eq=True)
class Prim(Graph):
    """A single primitive as a graph."""

    p: Primitive

    @property
    def in_shape(self) -> Shape:  # type: ignore[override]
        return self.p.in_shape

    @property
    def out_shape(self) -> Shape:  # type: ignore[override]
        return self.p.out_shape

    @property
    def params(self) -> tuple[ParamSpec, ...]:
        return self.p.params

    def stages(self) -> tuple[Graph, ...]:
        return (self,)


@dataclass(frozen=True, eq=True)
class Seq(Graph):
    """``first >> second``: parameter lists concatenate (first's, then second's)."""

    first: Graph
    second: Graph

    @property
    def in_shape(self) -> Shape:  # type: ignore[override]
        return self.first.in_shape

    @property
    def out_shape(self) -> Shape:  # type: ignore[override]
        return self.second.out_shape

    @property
    def params(self) -> tuple[ParamSpec, ...]:
        return self.first.params + self.second.params

    def stages(self) -> tuple[Graph, ...]:
        return self.first.stages() + self.second.stages()


@dataclass(frozen=True, eq=True)
class Block(Graph):
    """A DAG with one input and one output used as a stage of a chain (e.g. a residual block)."""

    dag: Dag
    name: str = "block"

    @property
    def in_shape(self) -> Shape:  # type: ignore[override]
        return self.dag.in_shape

    @property
    def out_shape(self) -> Shape:  # type: ignore[override]
        return self.dag.out_shape

    @property
    def params(self) -> tuple[ParamSpec, ...]:
        return self.dag.params

    def stages(self) -> tuple[Graph, ...]:
        return (self,)


def _stage_label(g: Graph) -> str:
    if isinstance(g, Prim):
        return g.p.label
    if isinstance(g, Block):
        return f"{g.name}{_fmt(g.in_shape)}"
    return type(g).__name__


def identity(shape: Sequence[int]) -> Graph:
    """The identity graph on ``shape`` (the seed's ``id``)."""
    return Id(tuple(int(d) for d in shape))


id = identity  # noqa: A001  (the seed's name for it)


def prim(p: Primitive | Template | Graph, in_shape: Sequence[int] | None = None) -> Graph:
    """A primitive (or a template at ``in_shape`` / its default input shape) as a graph."""
    if isinstance(p, Graph):
        return p
    if isinstance(p, Primitive):
        return Prim(p)
    if isinstance(p, Template | BlockTemplate):
        shape = tuple(in_shape) if in_shape is not None else p.default_in
        if shape is None:
            raise GraphSpecShapeError(
                f"position 0: {p.label} has no input shape to take; start the chain with "
                f"identity(shape) >> ... or give the primitive its input size"
            )
        try:
            return p.instantiate(shape)
        except GraphSpecShapeError as exc:
            raise GraphSpecShapeError(f"position 0 ({p.label}): {exc}") from None
    raise TypeError(f"cannot use {type(p).__name__} as a GraphSpec graph")


def seq(a: Any, b: Any) -> Graph:
    """Sequential composition ``a >> b`` with the shape check at the join (names both shapes, the position)."""
    ga = prim(a)
    pos = len(ga.stages())
    prev = _stage_label(ga.stages()[-1]) if ga.stages() else f"identity{_fmt(ga.out_shape)}"
    if isinstance(b, Template | BlockTemplate):
        try:
            gb: Graph = b.instantiate(ga.out_shape)
        except GraphSpecShapeError as exc:
            raise GraphSpecShapeError(
                f"shape mismatch at position {pos} of the chain: {b.label} cannot take {_fmt(ga.out_shape)}, "
                f"the output of position {pos - 1} ({prev}): {exc}"
            ) from None
        return Seq(ga, gb)
    gb = prim(b)
    if gb.in_shape != ga.out_shape:
        nxt = _stage_label(gb.stages()[0]) if gb.stages() else f"identity{_fmt(gb.in_shape)}"
        raise GraphSpecShapeError(
            f"shape mismatch at position {pos} of the chain: {nxt} expects {_fmt(gb.in_shape)} but position "
            f"{pos - 1} ({prev}) produces {_fmt(ga.out_shape)}"
        )
    return Seq(ga, gb)


# -- the DAG surface --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Value:
    """A value of a DAG under construction: its index (0 = the input) and shape."""

    index: int
    shape: Shape


@dataclass(frozen=True)
class DagOp:
    """A multi-input DAG node kind: shape rule, spec forward (binary32) and the IR node it lowers to."""

    name: str
    shape_rule: Callable[[tuple[Shape, ...], Mapping[str, Any]], Shape]
    forward: Callable[[tuple[np.ndarray, ...], Mapping[str, Any]], np.ndarray]
    lower: Callable[[GraphBuilder, tuple[int, ...], Shape, Mapping[str, Any]], int]
    arity: int | None = 2


DAG_OPS: dict[str, DagOp] = {}


@dataclass(frozen=True)
class DagStep:
    """One DAG step: ``apply`` a unary graph to one value, or a multi-input :class:`DagOp` on several."""

    op: str  # "apply" or a DAG_OPS name
    args: tuple[int, ...]
    shape: Shape
    graph: Graph | None = None
    attrs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Dag:
    """A built DAG: input shape, steps (value i + 1 is step i's result) and the output value index."""

    in_shape: Shape
    steps: tuple[DagStep, ...]
    out: int

    @property
    def out_shape(self) -> Shape:
        """Shape of the output value."""
        return self.in_shape if self.out == 0 else self.steps[self.out - 1].shape

    @property
    def params(self) -> tuple[ParamSpec, ...]:
        """The ABI: the applied graphs' parameter lists in step order (a graph applied twice counts twice)."""
        return tuple(p for s in self.steps if s.graph is not None for p in s.graph.params)

    def as_block(self, name: str = "block") -> Graph:
        """This DAG as one stage of a chain."""
        return Block(self, name)


class DagBuilder:
    """Build a DAG step by step: ``x = b.input``; ``h = b.apply(g, x)``; ``y = b.add(x, h)``; ``b.build(y)``."""

    def __init__(self, in_shape: Sequence[int]):
        self.in_shape: Shape = tuple(int(d) for d in in_shape)
        self.steps: list[DagStep] = []
        self.input = Value(0, self.in_shape)

    def _push(self, step: DagStep) -> Value:
        self.steps.append(step)
        return Value(len(self.steps), step.shape)

    def _own(self, v: Value) -> Value:
        if not 0 <= v.index <= len(self.steps):
            raise ValueError(f"value {v.index} does not belong to this DAG")
        return v

    def apply(self, g: Graph | Primitive | Template | BlockTemplate, x: Value) -> Value:
        """Apply a unary graph (or primitive / template) to ``x``; its input shape must be x's."""
        x = self._own(x)
        where = f"DAG step {len(self.steps)}"
        if isinstance(g, Template | BlockTemplate):
            try:
                g = g.instantiate(x.shape)
            except GraphSpecShapeError as exc:
                raise GraphSpecShapeError(
                    f"shape mismatch at {where}: {g.label} cannot take {_fmt(x.shape)} (value {x.index}): {exc}"
                ) from None
        g = prim(g)
        if g.in_shape != x.shape:
            raise GraphSpecShapeError(
                f"shape mismatch at {where}: {g.describe()} expects {_fmt(g.in_shape)} but "
                f"value {x.index} has shape {_fmt(x.shape)}"
            )
        return self._push(DagStep("apply", (x.index,), g.out_shape, g))

    def node(self, op: str, *args: Value, **attrs: Any) -> Value:
        """A multi-input node of kind ``op`` (a DAG_OPS name) on ``args``."""
        kind = DAG_OPS[op]
        vals = [self._own(a) for a in args]
        if kind.arity is not None and len(vals) != kind.arity:
            raise GraphSpecShapeError(f"DAG step {len(self.steps)} ({op}) takes {kind.arity} values, got {len(vals)}")
        try:
            shape = kind.shape_rule(tuple(v.shape for v in vals), attrs)
        except GraphSpecShapeError as exc:
            raise GraphSpecShapeError(
                f"shape mismatch at DAG step {len(self.steps)} ({op} of values {[v.index for v in vals]}): {exc}"
            ) from None
        return self._push(DagStep(op, tuple(v.index for v in vals), shape, None, tuple(sorted(attrs.items()))))

    def add(self, a: Value, b: Value) -> Value:
        """Elementwise a + b (the residual add); shapes must be equal."""
        return self.node("add", a, b)

    def sub(self, a: Value, b: Value) -> Value:
        """Elementwise a - b; shapes must be equal."""
        return self.node("sub", a, b)

    def mul(self, a: Value, b: Value) -> Value:
        """Elementwise a * b; shapes must be equal."""
        return self.node("mul", a, b)

    def concat(self, *vals: Value, axis: int = -1) -> Value:
        """Concatenation along ``axis``, in argument order."""
        return self.node("concat", *vals, axis=axis)

    def attention(
        self,
        q: Value,
        k: Value,
        v: Value,
        *,
        causal: bool = False,
        scale: float | None = None,
        kv_lens: Sequence[int] | None = None,
    ) -> Value:
        """The IR's attention (the attention family's op) on q (B, Hq, Lq, D), k and v (B, Hkv, Lk, D).

        ``kv_lens`` (B key lengths in [0, Lk], fixed when the graph is built) lowers to a const node, the op's 4th
        operand; ``scale`` defaults to 1/sqrt(D).
        """
        attrs: dict[str, Any] = {"causal": bool(causal)}
        if scale is not None:
            attrs["scale"] = float(scale)
        if kv_lens is not None:
            attrs["kv_lens"] = tuple(int(n) for n in kv_lens)
        return self.node("attention", q, k, v, **attrs)

    def build(self, out: Value) -> Dag:
        """The DAG with output ``out``."""
        return Dag(self.in_shape, tuple(self.steps), self._own(out).index)


def residual(body: Graph | Template | Primitive, in_shape: Sequence[int] | None = None) -> BlockTemplate | Graph:
    """The residual block ``x + body(x)`` (body's input and output shapes must be equal), as a chain stage.

    Without ``in_shape`` and with a template body, the block is instantiated where it is composed.
    """
    if isinstance(body, Template) and in_shape is None:
        return BlockTemplate(body)
    g = prim(body, in_shape)
    b = DagBuilder(g.in_shape)
    h = b.apply(g, b.input)
    if h.shape != g.in_shape:
        raise GraphSpecShapeError(
            f"residual body maps {_fmt(g.in_shape)} to {_fmt(h.shape)}: the skip add needs equal shapes"
        )
    return Block(b.build(b.add(b.input, h)), "residual")


def to_dag(g: Graph) -> Dag:
    """The sequential graph lowered into the DAG surface: one apply step per primitive, blocks inlined."""
    b = DagBuilder(g.in_shape)
    cur = b.input
    for s in g.stages():
        if isinstance(s, Block):
            base = len(b.steps)
            remap = {0: cur.index}
            for i, st in enumerate(s.dag.steps):
                args = tuple(remap[a] for a in st.args)
                b.steps.append(DagStep(st.op, args, st.shape, st.graph, st.attrs))
                remap[i + 1] = base + i + 1
            cur = Value(remap[s.dag.out], s.out_shape)
        else:
            cur = b.apply(s, cur)
    return b.build(cur)


# -- parameters: ABI split and deterministic init ---------------------------------------------------------


def split_params(
    abi: Sequence[ParamSpec], params: Sequence[Any], counts: Sequence[int]
) -> list[tuple[np.ndarray, ...]]:
    """Check ``params`` against the ABI (count, each shape) and split it into consecutive slices of ``counts``."""
    if len(params) != len(abi):
        raise GraphSpecParamError(f"the graph takes {len(abi)} parameter tensors, got {len(params)}")
    arrs = []
    for i, (p, slot) in enumerate(zip(params, abi, strict=True)):
        a = _f32(p)
        if a.shape != slot.shape:
            raise GraphSpecParamError(
                f"parameter {i} ({slot.name}) must have shape {_fmt(slot.shape)}, got {_fmt(a.shape)}"
            )
        arrs.append(a)
    out, k = [], 0
    for c in counts:
        out.append(tuple(arrs[k : k + c]))
        k += c
    return out


def _uniform(seed: int, shape: Shape, bound: float) -> np.ndarray:
    """SplitMix64 stream ``seed`` (spec.rng, counter 0) as uniform float32 in [-bound, bound), row-major."""
    n = int(np.prod(shape, dtype=np.int64))
    u = srng.uniform_reference(srng.bits_reference(seed, 0, n)).view(np.float32)
    b = np.float32(bound)
    return ((u * np.float32(2) - np.float32(1)) * b).astype(np.float32).reshape(shape)


_INIT: dict[str, Callable[[ParamSpec, int], np.ndarray]] = {
    "uniform": lambda s, seed: _uniform(seed, s.shape, 1.0 / math.sqrt(max(s.fan_in, 1))),
    "ones": lambda s, seed: np.ones(s.shape, np.float32),
    "zeros": lambda s, seed: np.zeros(s.shape, np.float32),
}


def _primitives(g: Graph) -> list[Primitive]:
    """Primitives in ABI order (a DAG's applied graphs in step order)."""
    out: list[Primitive] = []
    for s in g.stages():
        if isinstance(s, Prim):
            out.append(s.p)
        elif isinstance(s, Block):
            for st in s.dag.steps:
                if st.graph is not None:
                    out.extend(_primitives(st.graph))
    return out


def init_params(g: Graph | Dag) -> list[np.ndarray]:
    """Deterministic parameters: layer occurrence i draws seedW = 2 i (weight), seedB = 2 i + 1 (bias)."""
    g = g.as_block() if isinstance(g, Dag) else g
    out, layer = [], 0
    for p in _primitives(g):
        for j, slot in enumerate(p.params):
            out.append(_INIT[slot.init](slot, 2 * layer + min(j, 1)))
        layer += int(p.counts_as_layer)
    return out


# -- the two meanings -------------------------------------------------------------------------------------


def _spec_graph(g: Graph, params: tuple[np.ndarray, ...], x: np.ndarray) -> np.ndarray:
    return _SPEC[type(g)](g, params, x)


def _spec_seq(g: Seq, params: tuple[np.ndarray, ...], x: np.ndarray) -> np.ndarray:
    k = len(g.first.params)
    return _spec_graph(g.second, params[k:], _spec_graph(g.first, params[:k], x))


def _spec_dag(d: Dag, params: tuple[np.ndarray, ...], x: np.ndarray) -> np.ndarray:
    env: list[np.ndarray] = [x]
    k = 0
    for st in d.steps:
        if st.graph is not None:
            n = len(st.graph.params)
            env.append(_spec_graph(st.graph, params[k : k + n], env[st.args[0]]))
            k += n
        else:
            env.append(DAG_OPS[st.op].forward(tuple(env[a] for a in st.args), dict(st.attrs)))
    return env[d.out]


_SPEC: dict[type, Callable[[Any, tuple[np.ndarray, ...], np.ndarray], np.ndarray]] = {
    Id: lambda g, ps, x: x,
    Prim: lambda g, ps, x: g.p.forward(ps, x),
    Seq: _spec_seq,
    Block: lambda g, ps, x: _spec_dag(g.dag, ps, x),
}


def spec(g: Graph | Dag) -> Callable[[Sequence[Any], Any], np.ndarray]:
    """The pure reference meaning: ``spec(g)(params, x)`` in binary32, structurally over the chain."""
    graph = g.as_block() if isinstance(g, Dag) else g

    def run(params: Sequence[Any], x: Any) -> np.ndarray:
        """Evaluate the graph on ``x`` with the flat parameter list ``params`` (checked against the ABI)."""
        (ps,) = split_params(graph.params, params, [len(graph.params)])
        xa = _f32(x)
        if xa.shape != graph.in_shape:
            raise GraphSpecShapeError(f"input has shape {_fmt(xa.shape)}, the graph takes {_fmt(graph.in_shape)}")
        return _spec_graph(graph, ps, xa)

    return run


@dataclass(frozen=True)
class Lowered:
    """A lowered model: the IR graph, its payload and the id of the output node."""

    graph: IRGraph
    payload: Payload
    output: int
    node_of_step: tuple[int, ...] = field(default=())


def lower_dag(d: Dag, params: Sequence[Any]) -> Lowered:
    """Lower a DAG to IR: node 0 is the input; each step emits its nodes (parameters into the payload)."""
    (ps,) = split_params(d.params, params, [len(d.params)])
    b = GraphBuilder()
    ids = [b.add("input", (), d.in_shape)]
    k = 0
    for st in d.steps:
        if st.graph is not None:
            n = len(st.graph.params)
            ids.append(_lower_graph(b, st.graph, ps[k : k + n], ids[st.args[0]]))
            k += n
        else:
            ids.append(DAG_OPS[st.op].lower(b, tuple(ids[a] for a in st.args), st.shape, dict(st.attrs)))
    graph, payload = b.build()
    return Lowered(graph, payload, ids[d.out], tuple(ids))


def _lower_graph(b: GraphBuilder, g: Graph, params: tuple[np.ndarray, ...], x_id: int) -> int:
    """Emit a unary graph applied to node ``x_id`` (through its DAG form); the id of its result."""
    d = to_dag(g)
    ids = [x_id]
    k = 0
    for st in d.steps:
        if isinstance(st.graph, Prim):
            p = st.graph.p
            n = len(p.params)
            ids.append(PRIMITIVE_KINDS[p.kind].lower(b, p, params[k : k + n], ids[st.args[0]]))
            k += n
        elif st.graph is not None:
            n = len(st.graph.params)
            ids.append(_lower_graph(b, st.graph, params[k : k + n], ids[st.args[0]]))
            k += n
        else:
            ids.append(DAG_OPS[st.op].lower(b, tuple(ids[a] for a in st.args), st.shape, dict(st.attrs)))
    return ids[d.out]


def lower(g: Graph | Dag, params: Sequence[Any] | None = None) -> Lowered:
    """Lower a graph to IR + Payload (through :func:`to_dag`); ``params`` default to :func:`init_params`."""
    d = g if isinstance(g, Dag) else to_dag(g)
    return lower_dag(d, init_params(d) if params is None else params)


# -- the registered primitives ----------------------------------------------------------------------------


def _op(
    kind: str,
    inputs: Sequence[np.ndarray],
    out_shape: Shape,
    params: Mapping[str, np.ndarray] | None = None,
    **attrs: Any,
) -> np.ndarray:
    """One IR op's binary32 meaning on float32 arrays: the per-op evaluator of :mod:`spec.ir.denote`."""
    node = Node(0, tuple(range(len(inputs))), kind, tuple(out_shape), attrs)
    a = node_attrs(node, get_op(kind))
    with np.errstate(all="ignore"):
        out = EVALUATORS[kind](node, a, [_bits(x) for x in inputs], params)
    return _floats(np.asarray(out, dtype=np.uint32)).reshape(out_shape)


def _prim(
    kind: str,
    attrs: Mapping[str, Any],
    params: tuple[ParamSpec, ...],
    in_shape: Shape,
    out_shape: Shape,
    layer: bool = False,
) -> Primitive:
    return Primitive(kind, tuple(sorted(attrs.items())), params, tuple(in_shape), tuple(out_shape), layer)


def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise GraphSpecShapeError(msg)


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int | np.integer) else (int(v[0]), int(v[1]))


# linear ------------------------------------------------------------------------------------------------


def _linear_at(s: Shape, a: Mapping[str, Any]) -> Primitive:
    fi, fo = a["in_features"], a["out_features"]
    _need(len(s) >= 1 and s[-1] == fi, f"Linear({fi} -> {fo}) expects [..., {fi}], got {_fmt(s)}")
    ps = (ParamSpec("weight", (fo, fi), "uniform", fi), ParamSpec("bias", (fo,), "uniform", fi))
    return _prim("linear", a, ps, s, s[:-1] + (fo,), layer=True)


def _linear_lower(b: GraphBuilder, p: Primitive, ps: tuple[np.ndarray, ...], x: int) -> int:
    return b.add(
        "linear", (x,), p.out_shape, params={"weight": ps[0], "bias": ps[1]}, out_features=p.attr["out_features"]
    )


register_primitive_kind(
    PrimitiveKind(
        "linear",
        _linear_at,
        lambda p, ps, x: _op(
            "linear", (x,), p.out_shape, {"weight": ps[0], "bias": ps[1]}, out_features=p.attr["out_features"]
        ),
        _linear_lower,
        lambda p: f"Linear({p.attr['in_features']} -> {p.attr['out_features']})",
        "y = W x + b over the last axis; params [W (out, in), b (out,)]",
    )
)


# parameter-free elementwise and axis ops ---------------------------------------------------------------


def _same_at(kind: str) -> Callable[[Shape, Mapping[str, Any]], Primitive]:
    def at(s: Shape, a: Mapping[str, Any]) -> Primitive:
        if kind in ("softmax",):
            ax = a.get("axis", -1)
            _need(-len(s) <= ax < len(s), f"softmax axis {ax} out of range for {_fmt(s)}")
        return _prim(kind, a, (), s, s)

    return at


def _unary_lower(kind: str) -> Callable[[GraphBuilder, Primitive, tuple[np.ndarray, ...], int], int]:
    def lower_(b: GraphBuilder, p: Primitive, ps: tuple[np.ndarray, ...], x: int) -> int:
        return b.add(kind, (x,), p.out_shape, **p.attr)

    return lower_


def _unary_forward(kind: str) -> Callable[[Primitive, tuple[np.ndarray, ...], np.ndarray], np.ndarray]:
    return lambda p, ps, x: _op(kind, (x,), p.out_shape, None, **p.attr)


for _kind, _label in (("relu", "ReLU"), ("tanh", "Tanh"), ("sigmoid", "Sigmoid"), ("softmax", "Softmax")):
    register_primitive_kind(
        PrimitiveKind(
            _kind,
            _same_at(_kind),
            _unary_forward(_kind),
            _unary_lower(_kind),
            (lambda lab: lambda p: f"{lab}{_fmt(p.in_shape)}")(_label),
            f"{_label}, shape-preserving, no parameters",
        )
    )


# layer norm -------------------------------------------------------------------------------------------


def _layernorm_at(s: Shape, a: Mapping[str, Any]) -> Primitive:
    _need(len(s) >= 1, f"LayerNorm needs rank >= 1, got {_fmt(s)}")
    d = a.get("dim")
    _need(d is None or s[-1] == d, f"LayerNorm({d}) expects [..., {d}], got {_fmt(s)}")
    ps = (ParamSpec("weight", (s[-1],), "ones"), ParamSpec("bias", (s[-1],), "zeros"))
    return _prim("layernorm", {"eps": float(a.get("eps", 1e-5))}, ps, s, s)


register_primitive_kind(
    PrimitiveKind(
        "layernorm",
        _layernorm_at,
        lambda p, ps, x: _op("layernorm", (x,), p.out_shape, {"weight": ps[0], "bias": ps[1]}, eps=p.attr["eps"]),
        lambda b, p, ps, x: b.add(
            "layernorm", (x,), p.out_shape, params={"weight": ps[0], "bias": ps[1]}, eps=p.attr["eps"]
        ),
        lambda p: f"LayerNorm({p.in_shape[-1]})",
        "last-axis layer norm; params [weight (d,), bias (d,)]",
    )
)


# conv2d and pool --------------------------------------------------------------------------------------


def _window_out(size: int, k: int, st: int, pad: int, dil: int) -> int:
    span = dil * (k - 1) + 1
    return (size + 2 * pad - span) // st + 1 if span <= size + 2 * pad else -1


def _conv_at(s: Shape, a: Mapping[str, Any]) -> Primitive:
    cin, cout = a["in_channels"], a["out_channels"]
    _need(
        len(s) in (3, 4) and s[-3] == cin,
        f"Conv2d({cin} -> {cout}) expects [{cin}, H, W] (or [N, {cin}, H, W]), got {_fmt(s)}",
    )
    k, st, pad, dil = (_pair(a[n]) for n in ("kernel", "stride", "padding", "dilation"))
    hw = tuple(_window_out(s[-2 + i], k[i], st[i], pad[i], dil[i]) for i in range(2))
    _need(min(hw) >= 1, f"Conv2d window {k} (stride {st}, padding {pad}, dilation {dil}) does not fit {_fmt(s)}")
    fan_in = cin * k[0] * k[1]
    ps = (
        ParamSpec("weight", (cout, cin, k[0], k[1]), "uniform", fan_in),
        ParamSpec("bias", (cout,), "uniform", fan_in),
    )
    attrs = {"in_channels": cin, "out_channels": cout, "kernel": k, "stride": st, "padding": pad, "dilation": dil}
    return _prim("conv2d", attrs, ps, s, s[:-3] + (cout,) + hw, layer=True)


def _conv_attrs(p: Primitive) -> dict[str, Any]:
    a = p.attr
    return {n: a[n] for n in ("out_channels", "kernel", "stride", "padding", "dilation")}


register_primitive_kind(
    PrimitiveKind(
        "conv2d",
        _conv_at,
        lambda p, ps, x: _op("conv2d", (x,), p.out_shape, {"weight": ps[0], "bias": ps[1]}, **_conv_attrs(p)),
        lambda b, p, ps, x: b.add(
            "conv2d", (x,), p.out_shape, params={"weight": ps[0], "bias": ps[1]}, **_conv_attrs(p)
        ),
        lambda p: f"Conv2d({p.attr['in_channels']} -> {p.attr['out_channels']}, k={p.attr['kernel']})",
        "2-d convolution, groups 1; params [W (Cout, Cin, kh, kw), b (Cout,)]",
    )
)


def _pool_at(s: Shape, a: Mapping[str, Any]) -> Primitive:
    _need(len(s) in (3, 4), f"Pool expects [C, H, W] (or [N, C, H, W]), got {_fmt(s)}")
    k = _pair(a["kernel"])
    st = _pair(a.get("stride") or k)
    pad = _pair(a.get("padding", 0))
    hw = tuple(_window_out(s[-2 + i], k[i], st[i], pad[i], 1) for i in range(2))
    _need(
        min(hw) >= 1 and 2 * max(pad) <= min(k), f"Pool window {k} (stride {st}, padding {pad}) does not fit {_fmt(s)}"
    )
    return _prim("pool", {"mode": a.get("mode", "max"), "kernel": k, "stride": st, "padding": pad}, (), s, s[:-2] + hw)


register_primitive_kind(
    PrimitiveKind(
        "pool",
        _pool_at,
        _unary_forward("pool"),
        _unary_lower("pool"),
        lambda p: f"{p.attr['mode'].capitalize()}Pool(k={p.attr['kernel']})",
        "max or average pooling over H, W",
    )
)


# flatten ----------------------------------------------------------------------------------------------


def _flatten_at(s: Shape, a: Mapping[str, Any]) -> Primitive:
    start = a.get("start", 0)
    _need(len(s) >= 1 and -len(s) <= start < len(s), f"Flatten(start={start}) cannot take {_fmt(s)}")
    lo = start % len(s)
    return _prim("flatten", {"start": start, "end": -1}, (), s, s[:lo] + (int(np.prod(s[lo:], dtype=np.int64)),))


register_primitive_kind(
    PrimitiveKind(
        "flatten",
        _flatten_at,
        _unary_forward("flatten"),
        _unary_lower("flatten"),
        lambda p: f"Flatten{_fmt(p.in_shape)}",
        "merge the axes from start to the last (row-major)",
    )
)


# -- constructors ---------------------------------------------------------------------------------------


def Linear(in_features: int, out_features: int) -> Template:  # noqa: N802 (layer names as in the seed)
    """Dense layer y = W x + b over the last axis (starts a chain at input [in_features])."""
    return Template(
        "linear", (("in_features", int(in_features)), ("out_features", int(out_features))), (int(in_features),)
    )


def ReLU(shape: Sequence[int] | None = None) -> Template:  # noqa: N802
    """relu(x) = x if x > 0 else +0, elementwise."""
    return Template("relu", (), None if shape is None else tuple(shape))


def Tanh(shape: Sequence[int] | None = None) -> Template:  # noqa: N802
    """tanh, elementwise."""
    return Template("tanh", (), None if shape is None else tuple(shape))


def Sigmoid(shape: Sequence[int] | None = None) -> Template:  # noqa: N802
    """1 / (1 + e^-x), elementwise."""
    return Template("sigmoid", (), None if shape is None else tuple(shape))


def Softmax(axis: int = -1, shape: Sequence[int] | None = None) -> Template:  # noqa: N802
    """Softmax along ``axis`` (default the last)."""
    return Template("softmax", (("axis", int(axis)),), None if shape is None else tuple(shape))


def LayerNorm(dim: int | None = None, eps: float = 1e-5) -> Template:  # noqa: N802
    """Layer norm over the last axis with scale and shift parameters (initialised to 1 and 0)."""
    attrs = (("dim", dim), ("eps", float(eps)))
    return Template("layernorm", attrs, None if dim is None else (int(dim),))


def Conv2d(
    in_channels: int,
    out_channels: int,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] = 1,  # noqa: N802
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    in_hw: Sequence[int] | None = None,
) -> Template:
    """2-d convolution (groups 1) on [Cin, H, W]; ``in_hw`` gives H, W when it starts a chain."""
    attrs = (
        ("in_channels", int(in_channels)),
        ("out_channels", int(out_channels)),
        ("kernel", _pair(kernel)),
        ("stride", _pair(stride)),
        ("padding", _pair(padding)),
        ("dilation", _pair(dilation)),
    )
    return Template("conv2d", attrs, None if in_hw is None else (int(in_channels), *map(int, in_hw)))


def Pool(
    kernel: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,  # noqa: N802
    mode: str = "max",
) -> Template:
    """Max (or average) pooling over H, W; stride defaults to the window."""
    k = _pair(kernel)
    return Template(
        "pool",
        (
            ("kernel", k),
            ("mode", mode),
            ("padding", _pair(padding)),
            ("stride", k if stride is None else _pair(stride)),
        ),
    )


def MaxPool(kernel: int | Sequence[int], stride: int | Sequence[int] | None = None) -> Template:  # noqa: N802
    """Max pooling (IEEE maximum over the window: NaN propagates)."""
    return Pool(kernel, stride, mode="max")


def AvgPool(kernel: int | Sequence[int], stride: int | Sequence[int] | None = None) -> Template:  # noqa: N802
    """Average pooling (fold sum over the window, then one division)."""
    return Pool(kernel, stride, mode="avg")


def Flatten(start: int = 0) -> Template:  # noqa: N802
    """Merge the axes from ``start`` to the last."""
    return Template("flatten", (("start", int(start)),))


# -- multi-input DAG ops ----------------------------------------------------------------------------------


def _equal_shapes(shapes: tuple[Shape, ...], attrs: Mapping[str, Any]) -> Shape:
    if any(s != shapes[0] for s in shapes[1:]):
        raise GraphSpecShapeError(f"shapes differ: {' vs '.join(_fmt(s) for s in shapes)}")
    return shapes[0]


def _concat_shape(shapes: tuple[Shape, ...], attrs: Mapping[str, Any]) -> Shape:
    r = len(shapes[0])
    ax = attrs.get("axis", -1)
    if r == 0 or not -r <= ax < r:
        raise GraphSpecShapeError(f"concat axis {ax} out of range for {_fmt(shapes[0])}")
    ax %= r
    for s in shapes[1:]:
        if len(s) != r or s[:ax] + s[ax + 1 :] != shapes[0][:ax] + shapes[0][ax + 1 :]:
            raise GraphSpecShapeError(f"concat along axis {ax}: {_fmt(shapes[0])} and {_fmt(s)} differ off the axis")
    return shapes[0][:ax] + (sum(s[ax] for s in shapes),) + shapes[0][ax + 1 :]


def _binary_dag_op(name: str, ir_kind: str) -> DagOp:
    return DagOp(
        name,
        _equal_shapes,
        lambda xs, a: _op(ir_kind, xs, xs[0].shape),
        lambda b, ids, shape, a: b.add(ir_kind, ids, shape),
    )


def _attention_ir_attrs(a: Mapping[str, Any]) -> dict[str, Any]:
    """The IR attributes of an attention DAG step (kv_lens is an operand there, not an attribute)."""
    return {k: a[k] for k in ("causal", "scale") if k in a}


def _attention_shape(shapes: tuple[Shape, ...], attrs: Mapping[str, Any]) -> Shape:
    # The IR op's own shape rule (one rule for both surfaces), then the fixed key lengths against Lk.
    lens = attrs.get("kv_lens")
    ins = tuple(shapes) + (() if lens is None else ((len(lens),),))
    op = get_op("attention")
    try:
        out = op.shape_rule(ins, {"causal": False, "scale": None, **_attention_ir_attrs(attrs)}, ())
    except ShapeRuleError as exc:
        raise GraphSpecShapeError(str(exc)) from None
    if lens is not None and not all(0 <= n <= shapes[1][2] for n in lens):
        raise GraphSpecShapeError(f"attention kv_lens {list(lens)} must lie in [0, {shapes[1][2]}] (Lk)")
    return out


def _attention_forward(xs: tuple[np.ndarray, ...], a: Mapping[str, Any]) -> np.ndarray:
    lens = a.get("kv_lens")
    ins = xs + (() if lens is None else (np.asarray(lens, np.float32),))
    return _op("attention", ins, xs[0].shape, **_attention_ir_attrs(a))


def _attention_lower(b: GraphBuilder, ids: tuple[int, ...], shape: Shape, a: Mapping[str, Any]) -> int:
    lens = a.get("kv_lens")
    if lens is not None:
        ids = ids + (b.add("const", (), (len(lens),), params={"value": np.asarray(lens, np.float32)}),)
    return b.add("attention", ids, shape, **_attention_ir_attrs(a))


for _dag in (
    _binary_dag_op("add", "add"),
    _binary_dag_op("sub", "sub"),
    _binary_dag_op("mul", "mul_elem"),
    DagOp(
        "concat",
        _concat_shape,
        lambda xs, a: _op("concat", xs, _concat_shape(tuple(x.shape for x in xs), a), axis=a.get("axis", -1)),
        lambda b, ids, shape, a: b.add("concat", ids, shape, axis=a.get("axis", -1)),
        None,
    ),
    DagOp("attention", _attention_shape, _attention_forward, _attention_lower, 3),
):
    DAG_OPS[_dag.name] = _dag
