"""Reverse mode over the graph IR: ``vjp(graph, payload, outputs, wrt)`` builds the backward graph.

The backward graph is an ordinary IR graph (the denotation, the reference executor and the fusion backend run
it as they run a forward one). Its nodes are, in id order:

1. a copy of every forward node at its own id (forward ``input`` nodes stay inputs, payload entries keep their
   ids), so the backward graph recomputes the forward values it needs;
2. one ``input`` node per output, the output's cotangent (same shape), in the order of ``outputs``;
3. the nodes the VJP rules emit, walking the forward nodes from the last id down to the first.

So its inputs, in id order, are the forward inputs followed by the output cotangents, and its results
(:attr:`Backward.grads`) are the cotangents of the ``wrt`` inputs (ids of backward-graph nodes).

Each op has one rule in :data:`VJP_RULES` (registered by op name, as shape rules and evaluators are):
``rule(e, node, attrs, entry, xs, y, dy) -> one cotangent id (or None) per parent``, where ``xs`` are the
parents' ids, ``y`` the node's own id (its recomputed value), ``dy`` the id of its accumulated cotangent, and
``e`` an :class:`Emitter` that appends IR nodes with the shape their op's rule infers. ``None`` means no
cotangent flows to that operand (a piecewise-constant operand: ``where``'s condition, ``embedding``'s indices,
``attention``'s kv_lens). An op with no rule would be in :data:`REFUSED` with its reason (none is now), and a rule
may refuse one case (attention whose kv_lens operand is computed, not a const); asking a backward through such a
node is an :class:`~spec.ir.checks.IRError` of kind ``no-vjp`` at that node (nodes off every path from ``wrt`` to
``outputs`` are never asked). Every rule emits IR ops only: conv2d and avg pool are transposed convolutions (a
zero-woven, padded dy through ``conv2d`` with the kernel flipped), max pool routes dy to each window's first
maximum through strided slices and ``where``, attention is spec.attention.sdpa_vjp's formulas with matmul, softmax
and a constant mask.

Fan-out: a node read by several consumers (or twice by one) gets one contribution per read; its cotangent is the
left fold of IR ``add`` nodes over the contributions in ascending (consumer id, operand position) order, the
output seed (the cotangent input) first. A wrt input no output depends on gets a zero ``const``.

Parameters: payload tensors (weights, tables, constants) get cotangents only with ``params=True``
(:attr:`Backward.param_grads`, by :data:`PARAM_RULES`, one rule per payload-reading op).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spec import attention as sattn
from spec.elementwise import GELU_C, GELU_K
from spec.ir.checks import IRError, check_inferred_shapes, check_well_formed, node_attrs
from spec.ir.graph import Graph, GraphBuilder, Node, Payload
from spec.ir.ops import get_op

__all__ = [
    "Backward",
    "Emitter",
    "VjpRule",
    "VJP_RULES",
    "REFUSED",
    "register_vjp",
    "PARAM_RULES",
    "ParamRule",
    "register_param_vjp",
    "refuse_vjp",
    "vjp",
]

Shape = tuple[int, ...]


class Emitter:
    """Appends IR nodes to the backward graph, each with the shape its op's shape rule infers."""

    def __init__(self, builder: GraphBuilder, shapes: list[Shape]) -> None:
        self.b = builder
        self.shapes = shapes
        self.rounded: list[int] = []  # consts holding a real number rounded to binary32

    def shape(self, i: int) -> Shape:
        """The shape of node ``i`` of the backward graph."""
        return self.shapes[i]

    def op(self, kind: str, *parents: int, params: Mapping[str, Any] | None = None, **attrs: Any) -> int:
        """Append ``kind(parents, attrs)`` (payload ``params``) with its inferred shape; return its id."""
        op = get_op(kind)
        if op is None:  # a bug in a rule, not a bad graph
            raise ValueError(f"VJP rule emits unknown op {kind!r}")
        full = {a.name: a.default for a in op.attrs}
        full.update(attrs)
        shape = tuple(op.shape_rule(tuple(self.shapes[p] for p in parents), full, ()))
        return self._add(kind, parents, shape, params, attrs)

    def const(self, value: Any) -> int:
        """Append a ``const`` node holding ``value`` (rounded to binary32)."""
        v = np.asarray(value, np.float32)
        return self._add("const", (), v.shape, {"value": v}, {})

    def full(self, shape: Sequence[int], value: float) -> int:
        """A ``const`` of ``shape`` filled with ``value``."""
        return self.const(np.full(tuple(shape), value, np.float32))

    def zeros_like(self, i: int) -> int:
        """A zero ``const`` of node ``i``'s shape."""
        return self.full(self.shapes[i], 0.0)

    def _add(self, kind: str, parents: Sequence[int], shape: Shape, params: Any, attrs: Mapping[str, Any]) -> int:
        nid = self.b.add(kind, parents, shape, params=params, **attrs)
        self.shapes.append(tuple(shape))
        return nid

    # shorthands used by the rules
    def add(self, a: int, b: int) -> int:
        """a + b."""
        return self.op("add", a, b)

    def sub(self, a: int, b: int) -> int:
        """a - b."""
        return self.op("sub", a, b)

    def mul(self, a: int, b: int) -> int:
        """a * b."""
        return self.op("mul_elem", a, b)

    def div(self, a: int, b: int) -> int:
        """a / b."""
        return self.op("div", a, b)

    def neg(self, a: int) -> int:
        """-a."""
        return self.op("neg", a)

    def scale(self, a: int, c: float) -> int:
        """a * c (c rounded to a binary32 constant of a's shape; recorded in ``rounded`` unless exact)."""
        k = self.full(self.shapes[a], c)
        if float(np.float32(c)) != c:
            self.rounded.append(k)
        return self.mul(a, k)

    def where_pos(self, cond: int, a: int, b: int | None = None) -> int:
        """a where cond != 0 else b (zero when b is None)."""
        return self.op("where", cond, a, self.zeros_like(a) if b is None else b)

    def broadcast(self, a: int, shape: Sequence[int]) -> int:
        """broadcastTo(a, shape)."""
        return self.op("broadcastTo", a, shape=tuple(shape))

    def row_mean(self, a: int, axis: int = -1) -> int:
        """reduceMean along ``axis`` with the axis kept, broadcast back to a's shape."""
        return self.broadcast(self.op("reduceMean", a, axis=axis, keepdim=True), self.shapes[a])


Cts = tuple[int | None, ...]
VjpRule = Callable[[Emitter, Node, dict[str, Any], Mapping[str, np.ndarray] | None, tuple[int, ...], int, int], Cts]
VJP_RULES: dict[str, VjpRule] = {}
REFUSED: dict[str, str] = {}


def register_vjp(*names: str) -> Callable[[VjpRule], VjpRule]:
    """Decorator: the VJP rule of the ops ``names`` (one rule per op)."""

    def deco(fn: VjpRule) -> VjpRule:
        for name in names:
            if name in VJP_RULES or name in REFUSED:
                raise ValueError(f"VJP rule for {name!r} registered twice")
            VJP_RULES[name] = fn
        return fn

    return deco


def refuse_vjp(name: str, reason: str) -> None:
    """Record that op ``name`` has no VJP rule, and why (the refusal names it at its node)."""
    if name in VJP_RULES or name in REFUSED:
        raise ValueError(f"VJP rule for {name!r} registered twice")
    REFUSED[name] = reason


# -- elementwise ------------------------------------------------------------------------------------------


@register_vjp("add")
def _add(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (dy, dy)


@register_vjp("sub")
def _sub(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (dy, e.neg(dy))


@register_vjp("mul_elem")
def _mul(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.mul(dy, xs[1]), e.mul(dy, xs[0]))


@register_vjp("div")
def _div(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    da = e.div(dy, xs[1])  # d(a/b)/db = -(a/b)/b: the b cotangent is -(dy/b) * y
    return (da, e.neg(e.mul(da, y)))


# The kinks (ties of max/min, 0 of relu/abs) take one side; relu(a - b) != 0 iff a > b (binary32 subtraction of
# distinct finite values is never 0 with subnormals kept), so it is the IR's comparison.
@register_vjp("maxElem")
def _max(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    gt = e.op("relu", e.sub(xs[0], xs[1]))
    return (e.where_pos(gt, dy), e.where_pos(gt, e.zeros_like(dy), dy))


@register_vjp("minElem")
def _min(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    lt = e.op("relu", e.sub(xs[1], xs[0]))
    return (e.where_pos(lt, dy), e.where_pos(lt, e.zeros_like(dy), dy))


@register_vjp("neg")
def _neg(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.neg(dy),)


@register_vjp("abs")
def _abs(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.where_pos(e.op("relu", xs[0]), dy, e.neg(dy)),)


@register_vjp("relu")
def _relu(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.where_pos(y, dy),)  # y != 0 iff x > 0


@register_vjp("sqrt")
def _sqrt(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.div(dy, e.add(y, y)),)


@register_vjp("inv")
def _inv(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.neg(e.mul(e.mul(dy, y), y)),)


@register_vjp("rsqrt")
def _rsqrt(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.mul(dy, e.scale(e.mul(y, e.mul(y, y)), -0.5)),)


@register_vjp("exp")
def _exp(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.mul(dy, y),)


@register_vjp("log")
def _log(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.div(dy, xs[0]),)


@register_vjp("sin")
def _sin(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.mul(dy, e.op("cos", xs[0])),)


@register_vjp("cos")
def _cos(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.neg(e.mul(dy, e.op("sin", xs[0]))),)


@register_vjp("tanh")
def _tanh(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.mul(dy, e.sub(e.full(e.shape(y), 1.0), e.mul(y, y))),)


@register_vjp("sigmoid")
def _sigmoid(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.mul(dy, e.mul(y, e.sub(e.full(e.shape(y), 1.0), y))),)


@register_vjp("silu")
def _silu(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    # d(x s)/dx = s (1 + x (1 - s)), s = sigmoid(x)
    x = xs[0]
    s = e.op("sigmoid", x)
    one = e.full(e.shape(x), 1.0)
    return (e.mul(dy, e.mul(s, e.add(one, e.mul(x, e.sub(one, s))))),)


@register_vjp("gelu")
def _gelu(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    # g = 0.5 x (1 + t), t = tanh(K (x + C x^3)): g' = 0.5 (1 + t) + 0.5 x (1 - t^2) K (1 + 3 C x^2)
    # (spec.elementwise's constants: K = sqrt(2 / pi), C = 0.044715)
    x = xs[0]
    shape = e.shape(x)
    one = e.full(shape, 1.0)
    x2 = e.mul(x, x)
    t = e.op("tanh", e.scale(e.add(x, e.mul(e.scale(x2, GELU_C), x)), GELU_K))
    left = e.scale(e.add(one, t), 0.5)
    right = e.mul(e.scale(e.mul(x, e.sub(one, e.mul(t, t))), 0.5 * GELU_K), e.add(one, e.scale(x2, 3.0 * GELU_C)))
    return (e.mul(dy, e.add(left, right)),)


@register_vjp("erf")
def _erf(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    x = xs[0]
    return (e.mul(dy, e.scale(e.op("exp", e.neg(e.mul(x, x))), 2.0 / math.sqrt(math.pi))),)


@register_vjp("pow")
def _pow(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    # d a^b / da = b a^(b - 1); d a^b / db = a^b ln a (defined for a > 0)
    base, ex = xs
    dbase = e.mul(dy, e.mul(ex, e.op("pow", base, e.sub(ex, e.full(e.shape(ex), 1.0)))))
    return (dbase, e.mul(dy, e.mul(y, e.op("log", base))))


@register_vjp("where")
def _where(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    c = xs[0]
    return (None, e.where_pos(c, dy), e.where_pos(c, e.zeros_like(dy), dy))


# -- data movement ----------------------------------------------------------------------------------------


@register_vjp("reshape", "flatten")
def _reshape(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.op("reshape", dy, shape=e.shape(xs[0])),)


@register_vjp("transpose")
def _transpose(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (e.op("transpose", dy, dim0=a["dim0"], dim1=a["dim1"]),)


@register_vjp("permute")
def _permute(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    perm = [p % len(a["perm"]) for p in a["perm"]]
    return (e.op("permute", dy, perm=tuple(int(i) for i in np.argsort(perm))),)


@register_vjp("concat")
def _concat(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    ax = a["axis"] % len(e.shape(y))
    out, start = [], 0
    for p in xs:
        d = e.shape(p)[ax]
        out.append(e.op("slice", dy, axis=ax, start=start, stop=start + d, step=1))
        start += d
    return tuple(out)


def _unslice(e: Emitter, g: int, ax: int, start: int, step: int, dim: int) -> int:
    """The cotangent of x from that of x[start::step] (g) along axis ax of length dim: each taken element is followed
    by step - 1 zeros (a concat on a new axis, reshaped), start zeros go before and the tail is padded or cut."""
    s = e.shape(g)
    pre, k, post = s[:ax], s[ax], s[ax + 1 :]
    if k == 0:
        return e.full(pre + (dim,) + post, 0.0)
    if step > 1:
        col = e.op("reshape", g, shape=pre + (k, 1) + post)
        wide = e.op("concat", col, e.full(pre + (k, step - 1) + post, 0.0), axis=ax + 1)
        g = e.op("reshape", wide, shape=pre + (k * step,) + post)
    length = k * step
    if start + length > dim:
        g = e.op("slice", g, axis=ax, start=0, stop=dim - start, step=1)
        length = dim - start
    parts = ([e.full(pre + (start,) + post, 0.0)] if start else []) + [g]
    if start + length < dim:
        parts.append(e.full(pre + (dim - start - length,) + post, 0.0))
    return e.op("concat", *parts, axis=ax) if len(parts) > 1 else g


@register_vjp("slice")
def _slice(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    src = e.shape(xs[0])
    ax = a["axis"] % len(src)
    return (_unslice(e, dy, ax, a["start"], a["step"], src[ax]),)


def _reduce_to(e: Emitter, g: int, shape: Shape) -> int:
    """Sum g over the axes a broadcast to g's shape added or stretched from ``shape`` (the broadcast's VJP)."""
    while len(e.shape(g)) > len(shape):
        g = e.op("reduceSum", g, axis=0, keepdim=False)
    for ax, d in enumerate(shape):
        if d == 1 and e.shape(g)[ax] != 1:
            g = e.op("reduceSum", g, axis=ax, keepdim=True)
    return g


@register_vjp("broadcastTo", "expand")
def _broadcast(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (_reduce_to(e, dy, e.shape(xs[0])),)


# -- reductions -------------------------------------------------------------------------------------------


@register_vjp("reduceSum", "reduceMean")
def _reduce(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    src = e.shape(xs[0])
    ax = a["axis"] % len(src)
    g = dy if a["keepdim"] else e.op("reshape", dy, shape=src[:ax] + (1,) + src[ax + 1 :])
    g = e.broadcast(g, src)
    return (e.div(g, e.full(src, float(src[ax]))) if n.kind == "reduceMean" else g,)


@register_vjp("sum")
def _sum(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    src = e.shape(xs[0])
    return (e.broadcast(e.op("reshape", dy, shape=(1,) * len(src)), src),)


# -- contractions ---------------------------------------------------------------------------------------


@register_vjp("linear")
def _linear(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    # dx = dy W: a linear node with weight W^T and a zero bias (x + 0 is x)
    w = np.asarray(entry["weight"], np.float32)
    fan_in = w.shape[1]
    params = {"weight": np.ascontiguousarray(w.T), "bias": np.zeros(fan_in, np.float32)}
    return (e.op("linear", dy, params=params, out_features=fan_in),)


def _pair(v: Any) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _spread(e: Emitter, g: int, ax: int, stride: int, left: int, right: int) -> int:
    """g along axis ax with stride - 1 zeros woven between its elements, then ``left``/``right`` zeros added at the
    ends (cells cut where negative): the input of a transposed convolution."""
    s = e.shape(g)
    pre, k, post = s[:ax], s[ax], s[ax + 1 :]
    if stride > 1 and k > 0:
        col = e.op("reshape", g, shape=pre + (k, 1) + post)
        wide = e.op("concat", col, e.full(pre + (k, stride - 1) + post, 0.0), axis=ax + 1)
        g = e.op("reshape", wide, shape=pre + (k * stride,) + post)
        g = e.op("slice", g, axis=ax, start=0, stop=(k - 1) * stride + 1, step=1)
    parts = [g]
    if left > 0:
        parts.insert(0, e.full(pre + (left,) + post, 0.0))
    if right > 0:
        parts.append(e.full(pre + (right,) + post, 0.0))
    if len(parts) > 1:
        g = e.op("concat", *parts, axis=ax)
    n = e.shape(g)[ax]
    lo, hi = max(0, -left), n - max(0, -right)
    return g if (lo, hi) == (0, n) else e.op("slice", g, axis=ax, start=lo, stop=hi, step=1)


def _transposed_conv(
    e: Emitter, dy: int, src: Shape, weight: np.ndarray, k: tuple, st: tuple, p: tuple, d: tuple
) -> int:
    """The input cotangent of a convolution (weight (Cout, Cin, kh, kw)) of input shape ``src``: dy woven by the
    stride, padded by d (k - 1) - p (plus the rows the last window left uncovered), convolved at stride 1 with the
    kernel flipped and its channel axes swapped. A tap a of output o reads input o s - p + a d; in the spread dy
    output o sits at d (k - 1) - p + o s, which the flipped tap k - 1 - a of output i = o s - p + a d reads."""
    g = dy
    rank = len(src)
    for i in range(2):
        ax = rank - 2 + i
        span = d[i] * (k[i] - 1)
        left = span - p[i]
        uncovered = (src[ax] + 2 * p[i] - span - 1) % st[i]
        g = _spread(e, g, ax, st[i], left, left + uncovered)
    wt = np.ascontiguousarray(np.flip(np.asarray(weight, np.float32), (2, 3)).transpose(1, 0, 2, 3))
    params = {"weight": wt, "bias": np.zeros(wt.shape[0], np.float32)}
    return e.op("conv2d", g, params=params, out_channels=wt.shape[0], kernel=k, dilation=d)


@register_vjp("conv2d")
def _conv2d(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    k, st, p, d = (_pair(a[name]) for name in ("kernel", "stride", "padding", "dilation"))
    return (_transposed_conv(e, dy, e.shape(xs[0]), entry["weight"], k, st, p, d),)


@register_vjp("pool")
def _pool(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    # avg: the transposed box filter of dy / (kh kw), a convolution whose weight is the identity on channels
    # (conv2d has groups 1; the zero weights add exact zeros); max: dy routed to each window's argmax
    k, st, p = (_pair(a[name]) for name in ("kernel", "stride", "padding"))
    if a["mode"] == "max":
        return (_max_pool(e, xs[0], y, dy, k, st, p),)
    src = e.shape(xs[0])
    c = src[-3]
    eye = np.zeros((c, c) + k, np.float32)
    eye[np.arange(c), np.arange(c)] = 1.0
    g = e.div(dy, e.full(e.shape(dy), float(k[0] * k[1])))
    return (_transposed_conv(e, g, src, eye, k, st, p, (1, 1)),)


def _max_pool(e: Emitter, x: int, y: int, dy: int, k: tuple, st: tuple, p: tuple) -> int:
    """dy routed to each window's first row-major maximum (spec.conv.max_pool2d's argmax): per tap, the tap view of
    the -Inf-padded x (two strided slices), hit = tap == y (relu(y - tap) == 0, the tap never exceeding y) and no
    earlier tap hit, where(hit, dy, 0) scattered back through the slices; summed over taps, the padding cut."""
    src = e.shape(x)
    rank = len(src)
    outs = e.shape(y)[-2:]
    padded = x
    for i in range(2):
        if p[i]:
            ax = rank - 2 + i
            s = e.shape(padded)
            edge = e.full(s[:ax] + (p[i],) + s[ax + 1 :], -math.inf)
            padded = e.op("concat", edge, padded, edge, axis=ax)
    dims = e.shape(padded)[-2:]
    zero, one = e.zeros_like(dy), e.full(e.shape(dy), 1.0)
    taken = acc = None
    for ta in range(k[0]):
        for tb in range(k[1]):
            tap = padded
            for i, t in enumerate((ta, tb)):
                stop = t + (outs[i] - 1) * st[i] + 1
                tap = e.op("slice", tap, axis=rank - 2 + i, start=t, stop=stop, step=st[i])
            hit = e.op("where", e.op("relu", e.sub(y, tap)), zero, one)
            if taken is not None:
                hit = e.op("where", taken, zero, hit)
                taken = e.op("maxElem", taken, hit)
            else:
                taken = hit
            g = e.op("where", hit, dy, zero)
            for i, t in ((1, tb), (0, ta)):
                g = _unslice(e, g, rank - 2 + i, t, st[i], dims[i])
            acc = g if acc is None else e.add(acc, g)
    assert acc is not None  # kernel >= 1
    for i in range(2):
        if p[i]:
            acc = e.op("slice", acc, axis=rank - 2 + i, start=p[i], stop=p[i] + src[rank - 2 + i], step=1)
    return acc


class Refused(Exception):
    """A rule's refusal of one node (a mode or attribute it has no VJP for); vjp turns it into an IRError."""


def _refuse(n: Node, why: str) -> Cts:
    raise Refused(why)


@register_vjp("matmul", "bmm")
def _matmul(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    lhs, rhs = xs
    da = e.op(n.kind, dy, e.op("transpose", rhs, dim0=-2, dim1=-1))
    db = e.op(n.kind, e.op("transpose", lhs, dim0=-2, dim1=-1), dy)
    return (da, db)


# -- normalisations ---------------------------------------------------------------------------------------


@register_vjp("softmax")
def _softmax(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    # dx = y (dy - sum(dy y)) along the axis (spec.norm.softmax_backward_f64)
    s = e.op("reduceSum", e.mul(dy, y), axis=a["axis"], keepdim=True)
    return (e.mul(y, e.sub(dy, e.broadcast(s, e.shape(y)))),)


def _weight(e: Emitter, w: Any, shape: Shape) -> int:
    return e.broadcast(e.const(np.asarray(w, np.float32)), shape)


@register_vjp("layernorm")
def _layernorm(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    # dx = r ((g - mean g) - xh mean(g xh)), g = dy w, xh = (x - mean x) r, r = 1 / sqrt(var + eps)
    # (spec.norm.layernorm_backward_f64), the statistics recomputed with IR ops (inv of sqrt, not rsqrt: native.ir
    # runs those two)
    x = xs[0]
    shape = e.shape(x)
    d = e.sub(x, e.row_mean(x))
    r = e.op("inv", e.op("sqrt", e.add(e.row_mean(e.mul(d, d)), e.full(shape, a["eps"]))))
    xh = e.mul(d, r)
    g = e.mul(dy, _weight(e, entry["weight"], shape))
    inner = e.sub(e.sub(g, e.row_mean(g)), e.mul(xh, e.row_mean(e.mul(g, xh))))
    return (e.mul(r, inner),)


@register_vjp("rmsnorm")
def _rmsnorm(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    # dx = r (g - xh mean(g xh)), g = dy w, xh = x r, r = 1 / sqrt(mean(x^2) + eps) (spec.norm.rmsnorm_backward_f64)
    x = xs[0]
    shape = e.shape(x)
    r = e.op("inv", e.op("sqrt", e.add(e.row_mean(e.mul(x, x)), e.full(shape, a["eps"]))))
    xh = e.mul(x, r)
    g = e.mul(dy, _weight(e, entry["weight"], shape))
    return (e.mul(r, e.sub(g, e.mul(xh, e.row_mean(e.mul(g, xh))))),)


@register_vjp("rope")
def _rope(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    # RoPE rotates each pair by R(theta); its VJP rotates by R(theta)^T = R(-theta) = P R(theta) P, P negating the
    # odd lane of each pair (an exact sign flip): dx = P rope(P dy).
    shape = e.shape(dy)
    flip = np.ones(shape, np.float32)
    flip[..., 1::2] = -1.0
    p = e.const(flip)
    return (e.mul(e.op("rope", e.mul(dy, p), base=a["base"]), p),)


@register_vjp("embedding")
def _embedding(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    return (None,)  # integer indices: piecewise constant; the table's cotangent is a parameter's (not computed)


def _heads(e: Emitter, t: int, group: int) -> int:
    """(B, Hkv, L, D) -> (B, Hkv * group, L, D), query head h reading KV head h // group."""
    b, hkv, seq, d = e.shape(t)
    if group == 1:
        return t
    wide = e.broadcast(e.op("reshape", t, shape=(b, hkv, 1, seq, d)), (b, hkv, group, seq, d))
    return e.op("reshape", wide, shape=(b, hkv * group, seq, d))


def _group_sum(e: Emitter, t: int, group: int) -> int:
    """(B, Hkv * group, L, D) -> (B, Hkv, L, D): the sum over the query heads sharing a KV head."""
    b, hq, seq, d = e.shape(t)
    if group == 1:
        return t
    return e.op("reduceSum", e.op("reshape", t, shape=(b, hq // group, group, seq, d)), axis=2, keepdim=False)


def _t(e: Emitter, t: int) -> int:
    return e.op("transpose", t, dim0=-2, dim1=-1)


@register_vjp("attention")
def _attention(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> Cts:
    # P = softmax(where(M, q k^T s, -Inf)) with rows allowing no key set to 0 (the mask M is constant: causal and a
    # const kv_lens operand); dV = P^T dy, dS = P (dP - sum(dP P)) s with dP = dy V^T (zero where blocked, P being
    # 0 there), dQ = dS K, dK = dS^T Q; GQA: K and V repeated per query head, dK and dV summed over each group
    # (spec.attention.sdpa_vjp's formulas).
    q, k, v = xs[:3]
    bsz, hq, lq, d = e.shape(q)
    hkv, lk = e.shape(k)[1], e.shape(k)[2]
    lens = None
    if len(xs) == 4:
        src = e.b.nodes[xs[3]]
        if src.kind != "const":
            return _refuse(n, "its kv_lens operand is computed, so the mask is no constant of the backward graph")
        lens = np.asarray(e.b.payload[xs[3]]["value"], np.float64).reshape(-1)
        if not np.all((lens == np.floor(lens)) & (lens >= 0) & (lens <= lk)):
            return _refuse(n, f"kv_lens {lens.tolist()} are not integers in [0, {lk}]")
        lens = lens.astype(np.int64)
    if min(bsz, hq, lq, lk, d) == 0:  # no score at all: every cotangent is zero
        return (e.zeros_like(q), e.zeros_like(k), e.zeros_like(v)) + ((None,) if len(xs) == 4 else ())
    group = hq // hkv
    sc = sattn.scale_of(d, a["scale"])
    ok = np.broadcast_to(sattn.mask(bsz, lq, lk, bool(a["causal"]), lens), (bsz, hq, lq, lk))
    ke, ve = _heads(e, k, group), _heads(e, v, group)
    s = e.scale(e.op("matmul", q, _t(e, ke)), sc)
    shape = e.shape(s)
    masked = e.op("where", e.const(ok.astype(np.float32)), s, e.full(shape, -math.inf))
    p = e.op("softmax", masked, axis=-1)
    p = e.op("where", e.const(np.broadcast_to(ok.any(-1, keepdims=True), shape).astype(np.float32)), p, e.zeros_like(s))
    dv = _group_sum(e, e.op("matmul", _t(e, p), dy), group)
    dp = e.op("matmul", dy, _t(e, ve))
    ds = e.scale(e.mul(p, e.sub(dp, e.broadcast(e.op("reduceSum", e.mul(dp, p), axis=-1, keepdim=True), shape))), sc)
    dq = e.op("matmul", ds, ke)
    dk = _group_sum(e, e.op("matmul", _t(e, ds), q), group)
    return (dq, dk, dv) + ((None,) if len(xs) == 4 else ())


# -- parameter cotangents (vjp(..., params=True)) ---------------------------------------------------------

ParamRule = Callable[
    [Emitter, Node, dict[str, Any], Mapping[str, np.ndarray] | None, tuple[int, ...], int, int], dict[str, int]
]
PARAM_RULES: dict[str, ParamRule] = {}


def register_param_vjp(*names: str) -> Callable[[ParamRule], ParamRule]:
    """Decorator: the rule giving the cotangents of the payload tensors of the ops ``names``."""

    def deco(fn: ParamRule) -> ParamRule:
        for name in names:
            if name in PARAM_RULES:
                raise ValueError(f"parameter VJP rule for {name!r} registered twice")
            PARAM_RULES[name] = fn
        return fn

    return deco


def _rows(e: Emitter, t: int) -> int:
    """t (..., n) as (M, n), M the product of its leading dims."""
    s = e.shape(t)
    return e.op("reshape", t, shape=(math.prod(s[:-1]), s[-1]) if s else (1, 1))


@register_param_vjp("const")
def _p_const(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> dict[str, int]:
    return {"value": dy}


@register_param_vjp("linear")
def _p_linear(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> dict[str, int]:
    # y = x W^T + b over rows: dW = dy^T x, db = the column sums of dy
    g, x = _rows(e, dy), _rows(e, xs[0])
    return {"weight": e.op("matmul", _t(e, g), x), "bias": e.op("reduceSum", g, axis=0, keepdim=False)}


def _xhat(e: Emitter, x: int, eps: float, centred: bool) -> int:
    shape = e.shape(x)
    d = e.sub(x, e.row_mean(x)) if centred else x
    r = e.op("inv", e.op("sqrt", e.add(e.row_mean(e.mul(d, d)), e.full(shape, eps))))
    return e.mul(d, r)


@register_param_vjp("layernorm", "rmsnorm")
def _p_norm(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> dict[str, int]:
    # y = xh w (+ b): dw = the column sums of dy xh, db = those of dy
    xh = _xhat(e, xs[0], a["eps"], n.kind == "layernorm")
    out = {"weight": e.op("reduceSum", _rows(e, e.mul(dy, xh)), axis=0, keepdim=False)}
    if n.kind == "layernorm":
        out["bias"] = e.op("reduceSum", _rows(e, dy), axis=0, keepdim=False)
    return out


@register_param_vjp("conv2d")
def _p_conv2d(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> dict[str, int]:
    # dW[:, :, ta, tb] = sum over batch and outputs of dy[co] x_tap[ci] (x_tap: the tap's strided view of the
    # zero-padded x), a matmul per tap; db = the sums of dy over everything but its channel
    k, st, p, d = (_pair(a[name]) for name in ("kernel", "stride", "padding", "dilation"))
    x = xs[0]
    src, outs = e.shape(x), e.shape(dy)[-2:]
    rank = len(src)
    padded = x
    for i in range(2):
        if p[i]:
            ax = rank - 2 + i
            sh = e.shape(padded)
            edge = e.full(sh[:ax] + (p[i],) + sh[ax + 1 :], 0.0)
            padded = e.op("concat", edge, padded, edge, axis=ax)

    def channels_first(t: int) -> int:  # (..., C, H, W) -> (C, M)
        s = e.shape(t)
        if len(s) == 4:
            t = e.op("permute", t, perm=(1, 0, 2, 3))
            s = e.shape(t)
        return e.op("reshape", t, shape=(s[0], math.prod(s[1:])))

    g = channels_first(dy)  # (Cout, M)
    taps = []
    for ta in range(k[0]):
        for tb in range(k[1]):
            tap = padded
            for i, t in enumerate((ta * d[0], tb * d[1])):
                stop = t + (outs[i] - 1) * st[i] + 1
                tap = e.op("slice", tap, axis=rank - 2 + i, start=t, stop=stop, step=st[i])
            w_tap = e.op("matmul", g, _t(e, channels_first(tap)))  # (Cout, Cin)
            taps.append(e.op("reshape", w_tap, shape=e.shape(w_tap) + (1,)))
    cout, cin = e.shape(g)[0], src[-3]
    dw = e.op("concat", *taps, axis=2) if len(taps) > 1 else taps[0]
    return {
        "weight": e.op("reshape", dw, shape=(cout, cin) + k),
        "bias": e.op("reduceSum", g, axis=1, keepdim=False),
    }


@register_param_vjp("embedding")
def _p_embedding(e: Emitter, n: Node, a: dict, entry: Any, xs: tuple[int, ...], y: int, dy: int) -> dict[str, int]:
    # dT = onehot(idx)^T dy over rows (a scatter-add as a matmul): onehot[m, v] = 1 iff idx[m] == v, i.e. iff
    # relu(idx - v) + relu(v - idx) == 0 (exact for the integer indices the op requires)
    vocab = int(np.shape(entry["table"])[0])
    idx = e.op("reshape", xs[0], shape=(math.prod(e.shape(xs[0])), 1))
    m = e.shape(idx)[0]
    diff = e.sub(e.broadcast(idx, (m, vocab)), e.const(np.broadcast_to(np.arange(vocab, dtype=np.float32), (m, vocab))))
    ne = e.add(e.op("relu", diff), e.op("relu", e.neg(diff)))
    onehot = e.op("where", ne, e.full((m, vocab), 0.0), e.full((m, vocab), 1.0))
    return {"table": e.op("matmul", _t(e, onehot), _rows(e, dy))}


# -- reverse mode ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backward:
    """A backward graph: the forward nodes at their ids, the output cotangents as inputs, the wrt cotangents."""

    graph: Graph
    payload: Payload
    outputs: tuple[int, ...]  # forward output ids
    cotangents: tuple[int, ...]  # backward input node of each output's cotangent (same order)
    wrt: tuple[int, ...]  # forward input ids whose cotangents are computed
    grads: tuple[int, ...]  # backward node holding each wrt input's cotangent (same order)
    rounded: tuple[int, ...] = ()  # consts of the rules holding a real constant rounded to binary32
    param_grads: tuple[tuple[tuple[int, str], int], ...] = ()  # ((node id, tensor name), backward node), params=True

    def inputs(self, forward_inputs: Sequence[Any], cotangents: Sequence[Any]) -> tuple[np.ndarray, ...]:
        """The backward graph's inputs, in its id order: the forward inputs, then the cotangents."""
        return tuple(np.asarray(x, np.float32) for x in (*forward_inputs, *cotangents))


def _reach(graph: Graph, start: Sequence[int], down: bool) -> set[int]:
    seen = set(start)
    nodes = graph.nodes if down else reversed(graph.nodes)
    for n in nodes:
        if down and any(p in seen for p in n.parents):
            seen.add(n.id)
        elif not down and n.id in seen:
            seen.update(n.parents)
    return seen


def vjp(
    graph: Graph,
    payload: Payload | None = None,
    outputs: Sequence[int] | None = None,
    wrt: Sequence[int] | None = None,
    *,
    params: bool = False,
    rules: Mapping[str, VjpRule] | None = None,
    param_rules: Mapping[str, ParamRule] | None = None,
    accumulate: str = "all",
) -> Backward | IRError:
    """The backward graph of ``graph`` (outputs: default the last node; wrt: default every input), or the first
    error: an ill-formed graph, a bad output/wrt id, or a node on the way whose op has no VJP rule (``no-vjp``).

    ``params=True`` also gives the cotangent of every payload tensor an output depends on (``Backward.param_grads``:
    (node id, tensor name) -> backward node, by :data:`PARAM_RULES`). ``rules``/``param_rules`` replace the rule
    tables and ``accumulate="first"`` keeps only the first contribution of a fan-out: these only plant bugs for the
    tests that must catch them."""
    errs = check_well_formed(graph) or check_inferred_shapes(graph)
    if errs:
        return errs[0]
    payload = payload if payload is not None else Payload()
    rules = VJP_RULES if rules is None else rules
    n = len(graph.nodes)
    outs = (n - 1,) if outputs is None else tuple(int(o) for o in outputs)
    ins = graph.input_ids() if wrt is None else tuple(int(w) for w in wrt)
    for o in outs:
        if not 0 <= o < n:
            return IRError("output", None, None, f"output id {o} is not a node (0..{n - 1})")
    for w in ins:
        if not (0 <= w < n and graph.nodes[w].kind == "input"):
            return IRError("wrt", None, None, f"wrt id {w} is not an input node (inputs: {list(graph.input_ids())})")
    # parameter holders: the nodes with a payload entry (every op of the graph is registered: checked above)
    holders = tuple(nd.id for nd in graph.nodes if params and get_op(nd.kind).payload)  # type: ignore[union-attr]
    live = _reach(graph, ins + holders, down=True) & _reach(graph, outs, down=False)

    b = GraphBuilder()
    shapes: list[Shape] = []
    for node in graph.nodes:
        b.nodes.append(node)
        shapes.append(node.out_shape)
    b.payload.update({k: dict(v) for k, v in payload.entries.items()})
    e = Emitter(b, shapes)
    cts = tuple(e._add("input", (), graph.nodes[o].out_shape, None, {}) for o in outs)

    contrib: dict[int, list[tuple[tuple[int, int], int]]] = {}
    for j, (o, c) in enumerate(zip(outs, cts, strict=True)):
        contrib.setdefault(o, []).append(((-1, j), c))
    total: dict[int, int] = {}
    pgrads: dict[tuple[int, str], int] = {}
    for node in reversed(graph.nodes):
        i = node.id
        if i not in live or i not in contrib:
            continue
        parts = [c for _, c in sorted(contrib[i])]
        if accumulate == "first":
            parts = parts[:1]
        acc = parts[0]
        for c in parts[1:]:
            acc = e.add(acc, c)
        total[i] = acc
        if node.kind == "input":
            continue
        op = get_op(node.kind)
        assert op is not None  # checked well formed
        entry = payload.get(i) if op.payload else None
        if i in holders:
            prule = (PARAM_RULES if param_rules is None else param_rules).get(node.kind)
            if prule is None:  # every payload kind has one; a new one must add it
                return IRError("no-vjp", i, node.kind, "no parameter VJP rule is registered for this op")
            for name, c in prule(e, node, node_attrs(node, op), entry, node.parents, i, acc).items():
                pgrads[(i, name)] = c
        if not any(p in live for p in node.parents):
            continue  # only its parameters needed its cotangent
        rule = rules.get(node.kind)
        if rule is None:
            why = REFUSED.get(node.kind, "no VJP rule is registered for this op")
            return IRError("no-vjp", i, node.kind, f"no reverse mode through this node: {why}")
        try:
            got = rule(e, node, node_attrs(node, op), entry, node.parents, i, acc)
        except Refused as why:
            return IRError("no-vjp", i, node.kind, f"no reverse mode through this node: {why}")
        for pos, (p, c) in enumerate(zip(node.parents, got, strict=True)):
            if c is not None and p in live:
                contrib.setdefault(p, []).append(((i, pos), c))
    grads = tuple(total[w] if w in total else e.full(graph.nodes[w].out_shape, 0.0) for w in ins)
    for h in holders:  # a parameter no output depends on: zero cotangents
        for name, arr in payload.get(h).items():  # type: ignore[union-attr]
            if (h, name) not in pgrads:
                pgrads[(h, name)] = e.full(np.shape(arr), 0.0)
    bg, bp = b.build()
    return Backward(bg, bp, outs, cts, ins, grads, tuple(e.rounded), tuple(sorted(pgrads.items())))
