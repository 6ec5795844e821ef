"""Hypothesis strategies for the graph IR: well-formed, shape-checked graphs with payloads and inputs.

:func:`graph_cases` draws a :class:`GraphCase` (graph, payload, inputs). A graph starts with one or two
``input`` nodes and grows by templates, each of which picks parents among the existing nodes and declares
the shape the op's rule gives, so every drawn graph passes ``check_well_formed``, ``check_inferred_shapes``
and ``check_payload``. Templates are listed simplest first and the node count is a drawn list length, so
Hypothesis shrinks a failure towards fewer nodes and simpler ops; ``str(case)`` prints the graph in its
text form with its payload and inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from spec.ir.graph import Graph, GraphBuilder, Payload, format_graph
from spec.ir.ops import conv_plan, pool_plan

__all__ = ["GraphCase", "graph_cases", "f32_arrays", "SPECIAL_VALUES", "TEMPLATES", "DEFAULT_TEMPLATES"]

SPECIAL_VALUES: tuple[float, ...] = (
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    2.0,
    -3.25,
    1e-40,
    -1e-45,
    1e30,
    -7.5,
    math.inf,
    -math.inf,
    math.nan,
)
Shape = tuple[int, ...]


@dataclass(frozen=True)
class GraphCase:
    """A drawn graph with its payload and one input array per input node (id order)."""

    graph: Graph
    payload: Payload
    inputs: tuple[np.ndarray, ...]

    def __str__(self) -> str:
        lines = [format_graph(self.graph)]
        for nid, tensors in sorted(self.payload.entries.items()):
            for name, a in tensors.items():
                lines.append(f"payload[{nid}].{name} = {a.reshape(-1).tolist()} (shape {list(a.shape)})")
        for i, a in zip(self.graph.input_ids(), self.inputs, strict=True):
            lines.append(f"input {i} = {a.reshape(-1).tolist()} (shape {list(a.shape)})")
        return "\n".join(lines)


def f32_arrays(shape: Shape, specials: bool = True) -> st.SearchStrategy[np.ndarray]:
    """float32 arrays of ``shape``: small integers first (shrink target), then specials and any binary32."""
    n = math.prod(shape)
    elems = st.one_of(
        st.sampled_from((0.0, 1.0, 2.0, -1.0)),
        st.sampled_from(SPECIAL_VALUES) if specials else st.sampled_from((0.5, -2.0, 3.0)),
        st.floats(width=32, allow_nan=specials, allow_infinity=specials),
    )
    return st.lists(elems, min_size=n, max_size=n).map(lambda v: np.array(v, dtype=np.float32).reshape(shape))


# A template: (draw, builder, shapes) -> None, appending nodes to the builder (shapes: declared shape per id).
Template = Callable[[Any, GraphBuilder, list[Shape]], None]


def _pick(draw: Any, shapes: list[Shape], ok: Callable[[Shape], bool] = lambda s: True) -> int | None:
    cands = [i for i, s in enumerate(shapes) if ok(s)]
    if not cands:
        return None
    # Half the time the newest candidate: chains of ops (what rewrites and fusions look at) are common.
    return cands[-1] if draw(st.booleans()) else draw(st.sampled_from(cands))


def _add(
    b: GraphBuilder,
    shapes: list[Shape],
    kind: str,
    parents: tuple[int, ...],
    out_shape: Shape,
    params: dict | None = None,
    **attrs: Any,
) -> None:
    b.add(kind, parents, out_shape, params=params, **attrs)
    shapes.append(tuple(out_shape))


def _unary(kind: str) -> Template:
    def t(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
        p = _pick(draw, shapes)
        _add(b, shapes, kind, (p,), shapes[p])

    return t


def _binary(kind: str) -> Template:
    def t(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
        p = _pick(draw, shapes)
        q = _pick(draw, shapes, lambda s: s == shapes[p])
        _add(b, shapes, kind, (p, q), shapes[p])

    return t


def _where(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    # the condition is any node of the shape (NaN and -0.0 included: nonzero and zero), the operands two others
    p = _pick(draw, shapes)
    c = _pick(draw, shapes, lambda s: s == shapes[p])
    q = _pick(draw, shapes, lambda s: s == shapes[p])
    _add(b, shapes, "where", (c, p, q), shapes[p])


def _const(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    s = shapes[_pick(draw, shapes)]
    _add(b, shapes, "const", (), s, params={"value": draw(f32_arrays(s))})


def _reshape(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    p = _pick(draw, shapes)
    n = math.prod(shapes[p])
    target = draw(st.sampled_from([(n,), (1, n), (n, 1)] + ([shapes[p]] if shapes[p] else [])))
    _add(b, shapes, "reshape", (p,), target, shape=target)


def _flatten(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    p = _pick(draw, shapes, lambda s: len(s) >= 1)
    if p is not None:
        _add(b, shapes, "flatten", (p,), (math.prod(shapes[p]),))


def _reduce(kind: str) -> Template:
    def t(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
        p = _pick(draw, shapes, lambda s: len(s) >= 1)
        if p is None:
            return
        s = shapes[p]
        ax = draw(st.integers(0, len(s) - 1))
        keep = draw(st.booleans())
        _add(b, shapes, kind, (p,), s[:ax] + ((1,) if keep else ()) + s[ax + 1 :], axis=ax, keepdim=keep)

    return t


def _sum(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    _add(b, shapes, "sum", (_pick(draw, shapes),), ())


def _transpose(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    p = _pick(draw, shapes, lambda s: len(s) >= 2)
    if p is None:
        return
    s = list(shapes[p])
    s[0], s[-1] = s[-1], s[0]
    _add(b, shapes, "transpose", (p,), tuple(s), dim0=0, dim1=-1)


def _concat(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    p = _pick(draw, shapes, lambda s: len(s) >= 1)
    if p is None:
        return
    q = _pick(draw, shapes, lambda s: s == shapes[p])
    s = shapes[p]
    _add(b, shapes, "concat", (p, q), (2 * s[0],) + s[1:], axis=0)


def _slice(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    p = _pick(draw, shapes, lambda s: len(s) >= 1 and s[-1] >= 1)
    if p is None:
        return
    s = shapes[p]
    start = draw(st.integers(0, s[-1] - 1))
    stop = draw(st.integers(start, s[-1]))
    step = draw(st.integers(1, 2))
    _add(b, shapes, "slice", (p,), s[:-1] + (-(-(stop - start) // step),), axis=-1, start=start, stop=stop, step=step)


def _broadcast(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    p = _pick(draw, shapes)
    target = (2,) + tuple(2 if d == 1 else d for d in shapes[p])
    _add(b, shapes, "broadcastTo", (p,), target, shape=target)


def _softmax(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    p = _pick(draw, shapes, lambda s: len(s) >= 1)
    if p is not None:
        _add(b, shapes, "softmax", (p,), shapes[p], axis=-1)


def _linear(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    p = _pick(draw, shapes, lambda s: len(s) >= 1)
    if p is None:
        return
    s = shapes[p]
    fo = draw(st.integers(1, 3))
    w = draw(f32_arrays((fo, s[-1]), specials=False))
    bias = draw(f32_arrays((fo,), specials=False))
    _add(b, shapes, "linear", (p,), s[:-1] + (fo,), params={"weight": w, "bias": bias}, out_features=fo)


def _matmul(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    p = _pick(draw, shapes, lambda s: len(s) == 2)
    if p is None:
        return
    m, k = shapes[p]
    n = draw(st.integers(1, 2))
    _add(b, shapes, "const", (), (k, n), params={"value": draw(f32_arrays((k, n), specials=False))})
    _add(b, shapes, "matmul", (p, len(shapes) - 1), (m, n))


def _norm(kind: str) -> Template:
    def t(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
        p = _pick(draw, shapes, lambda s: len(s) >= 1)
        if p is None:
            return
        d = shapes[p][-1]
        params = {"weight": draw(f32_arrays((d,), specials=False))}
        if kind == "layernorm":
            params["bias"] = draw(f32_arrays((d,), specials=False))
        _add(b, shapes, kind, (p,), shapes[p], params=params)

    return t


def _random(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    s = shapes[_pick(draw, shapes)]
    kind = draw(st.sampled_from(("randUniform", "bernoulliMask")))
    extra = {"keep_prob": draw(st.sampled_from((0.5, 0.25, 1.0)))} if kind == "bernoulliMask" else {}
    _add(b, shapes, kind, (), s, seed=draw(st.integers(0, 2**64 - 1)), counter=draw(st.integers(0, 3)), **extra)


def _conv_pool(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    s = (1, draw(st.integers(2, 3)), draw(st.integers(2, 3)))
    _add(b, shapes, "const", (), s, params={"value": draw(f32_arrays(s, specials=False))})
    x = len(shapes) - 1
    k, stride, pad = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(0, 1))
    ho, wo = ((s[1] + 2 * pad - k) // stride + 1, (s[2] + 2 * pad - k) // stride + 1)
    params = {"weight": draw(f32_arrays((2, 1, k, k), specials=False)), "bias": draw(f32_arrays((2,), False))}
    _add(
        b,
        shapes,
        "conv2d",
        (x,),
        (2, ho, wo),
        params=params,
        out_channels=2,
        kernel=(k, k),
        stride=(stride, stride),
        padding=(pad, pad),
    )
    if ho >= 2 and wo >= 2:
        mode = draw(st.sampled_from(("max", "avg")))
        _add(b, shapes, "pool", (len(shapes) - 1,), (2, ho // 2, wo // 2), mode=mode, kernel=(2, 2), stride=(2, 2))


def _attention(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    # q (B, Hkv * group, Lq, D), k and v (B, Hkv, Lk, D): an existing node of the shape or a fresh const each;
    # causal, a scale and a kv_lens operand (a const of integers in [0, Lk]) each drawn or left out.
    bsz, hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    lq, lk, d = draw(st.integers(0, 3)), draw(st.integers(0, 3)), draw(st.integers(1, 3))
    q_shape, kv_shape = (bsz, hkv * group, lq, d), (bsz, hkv, lk, d)
    ids = []
    for s in (q_shape, kv_shape, kv_shape):
        p = _pick(draw, shapes, lambda t, s=s: t == s)
        if p is None or draw(st.booleans()):
            _add(b, shapes, "const", (), s, params={"value": draw(f32_arrays(s))})
            p = len(shapes) - 1
        ids.append(p)
    attrs: dict[str, Any] = {}
    if draw(st.booleans()):
        attrs["causal"] = True
    if draw(st.booleans()):
        attrs["scale"] = draw(st.sampled_from((0.5, 1.0, 3.0)))
    if draw(st.booleans()):
        lens = np.array(draw(st.lists(st.integers(0, lk), min_size=bsz, max_size=bsz)), np.float32)
        _add(b, shapes, "const", (), (bsz,), params={"value": lens})
        ids.append(len(shapes) - 1)
    _add(b, shapes, "attention", tuple(ids), q_shape, **attrs)


def _conv_node(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    # conv2d over an existing (C, H, W) or (N, C, H, W) node: every window attribute drawn, kept when it fits
    p = _pick(draw, shapes, lambda s: len(s) in (3, 4) and 1 <= s[-3] <= 3 and min(s[-2:]) >= 1)
    if p is None:
        return
    s = shapes[p]
    k, stride = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pad, dil, co = draw(st.integers(0, 1)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    hw = [conv_plan(d, k, stride, pad, dil) for d in s[-2:]]
    if not all(h["valid"] for h in hw):
        return
    w = draw(f32_arrays((co, s[-3], k, k), specials=False))
    params = {"weight": w, "bias": draw(f32_arrays((co,), specials=False))}
    attrs = {"kernel": (k, k), "stride": (stride, stride), "padding": (pad, pad), "dilation": (dil, dil)}
    _add(b, shapes, "conv2d", (p,), s[:-3] + (co, hw[0]["out"], hw[1]["out"]), params=params, out_channels=co, **attrs)


def _pool_node(draw: Any, b: GraphBuilder, shapes: list[Shape]) -> None:
    p = _pick(draw, shapes, lambda s: len(s) in (3, 4) and min(s[-2:]) >= 1)
    if p is None:
        return
    s = shapes[p]
    k, stride = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pad = draw(st.integers(0, k // 2))
    hw = [pool_plan(d, k, stride, pad) for d in s[-2:]]
    if not all(h["valid"] for h in hw):
        return
    out = s[:-2] + (hw[0]["out"], hw[1]["out"])
    mode = draw(st.sampled_from(("avg", "max")))
    _add(b, shapes, "pool", (p,), out, mode=mode, kernel=(k, k), stride=(stride, stride), padding=(pad, pad))


TEMPLATES: dict[str, Template] = {
    "relu": _unary("relu"),
    "add": _binary("add"),
    "const": _const,
    "reshape": _reshape,
    "neg": _unary("neg"),
    "sub": _binary("sub"),
    "mul_elem": _binary("mul_elem"),
    "div": _binary("div"),
    "maxElem": _binary("maxElem"),
    "minElem": _binary("minElem"),
    "sqrt": _unary("sqrt"),
    "inv": _unary("inv"),
    "abs": _unary("abs"),
    "tanh": _unary("tanh"),
    "sigmoid": _unary("sigmoid"),
    "exp": _unary("exp"),
    "silu": _unary("silu"),
    "gelu": _unary("gelu"),
    "erf": _unary("erf"),
    "where": _where,
    "sin": _unary("sin"),
    "cos": _unary("cos"),
    "rsqrt": _unary("rsqrt"),
    "pow": _binary("pow"),
    "flatten": _flatten,
    "reduceSum": _reduce("reduceSum"),
    "reduceMean": _reduce("reduceMean"),
    "sum": _sum,
    "transpose": _transpose,
    "concat": _concat,
    "slice": _slice,
    "broadcastTo": _broadcast,
    "softmax": _softmax,
    "linear": _linear,
    "matmul": _matmul,
    "layernorm": _norm("layernorm"),
    "rmsnorm": _norm("rmsnorm"),
    "random": _random,
    "conv_pool": _conv_pool,
    "attention": _attention,
    "conv_node": _conv_node,
    "pool_node": _pool_node,
}
# conv_node and pool_node (convolutions and pools over any node, reverse mode's templates) are opt-in: the default
# draws stay what the other IR items were written against
DEFAULT_TEMPLATES: tuple[str, ...] = tuple(t for t in TEMPLATES if t not in ("conv_node", "pool_node"))


@st.composite
def graph_cases(
    draw: Any,
    max_nodes: int = 6,
    max_dim: int = 3,
    templates: tuple[str, ...] = DEFAULT_TEMPLATES,
    specials: bool = True,
) -> GraphCase:
    """A well-formed, shape-checked graph with payload and inputs; shrinks to fewer nodes and simpler ops."""
    b = GraphBuilder()
    shapes: list[Shape] = []
    n_inputs = draw(st.integers(1, 2))
    for _ in range(n_inputs):
        s = tuple(draw(st.lists(st.integers(1, max_dim), min_size=0, max_size=3)))
        _add(b, shapes, "input", (), s)
    steps = draw(st.lists(st.sampled_from(templates), min_size=0, max_size=max_nodes))
    for name in steps:
        TEMPLATES[name](draw, b, shapes)
    graph, payload = b.build()
    inputs = tuple(draw(f32_arrays(graph.nodes[i].out_shape, specials)) for i in graph.input_ids())
    return GraphCase(graph, payload, inputs)
