"""Import ONNX models (a stated op subset) into the graph IR plus its Payload.

``import_onnx(model)`` takes a ``onnx.ModelProto`` or a path. Every graph input needs a static float32
shape; initializers become payload tensors (Gemm / MatMul weights, Conv and normalisation parameters) or
``const`` nodes. Each ONNX node maps to IR nodes of the same meaning through one entry of :data:`ONNX_OPS`
(often several IR nodes: explicit broadcasts, paddings, window taps; docs/graphs.md lists the mappings);
a node whose op is not there, or whose attributes ask for something the IR does not mean, raises
:class:`OnnxImportError` naming the node (index, name, op type) and the attribute or operand: nothing is
dropped or approximated silently. :data:`REFUSED` lists ops refused on purpose with the reason.

Constant folding: a node whose inputs are all constants is evaluated at import (ONNX's reference) when it
only moves or selects values or computes on integers (shapes, axes, indices), and Shape/Size of a tensor
of static shape is its shape, so exporters' ``Shape -> Gather -> Concat -> Reshape`` chains become constant
targets. Float arithmetic on constants is imported, never folded, so it keeps the IR's meaning.

Where a parameter is absent (Gemm without C, MatMul, Conv without B, LayerNormalization without B), the IR
node gets a bias of -0.0: ``v + (-0.0) == v`` bit for bit for every binary32 v (both zeros and NaN
included), so the added node changes no value. Shapes come from the IR ops' own shape rules.

The ``onnx`` package is needed only to read models (``pip install onnx``, in the ``test`` extra).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from spec.ir.checks import node_attrs
from spec.ir.graph import Graph, GraphBuilder, Payload
from spec.ir.ops import ShapeRuleError, get_op, window_plan

__all__ = ["OnnxImportError", "Imported", "ONNX_OPS", "REFUSED", "import_onnx", "supported_onnx_ops"]


class OnnxImportError(ValueError):
    """An ONNX model the importer refuses, located at its node (index, name, op type) where there is one."""

    def __init__(self, message: str, index: int | None = None, name: str = "", op_type: str = ""):
        where = "model" if index is None else f"ONNX node {index} {name!r} ({op_type})"
        super().__init__(f"{where}: {message}")
        self.index, self.name, self.op_type = index, name, op_type


@dataclass(frozen=True)
class Imported:
    """The imported model: IR graph, payload, the output node id and the IR node of each ONNX tensor name."""

    graph: Graph
    payload: Payload
    output: int
    tensors: Mapping[str, int] = field(default_factory=dict)
    outputs: tuple[int, ...] = ()
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)


class _Ctx:
    """Import state: the builder, tensor name -> IR node id, constants (initializers and folded values), the node."""

    def __init__(self) -> None:
        self.b = GraphBuilder()
        self.ids: dict[str, int] = {}
        self.inits: dict[str, np.ndarray] = {}
        self.node: Any = None
        self.index = 0
        self.opset = 13
        self.index_inputs: set[str] = set()  # integer graph inputs, carried as binary32 values (indices only)

    def fail(self, msg: str) -> OnnxImportError:
        return OnnxImportError(msg, self.index, self.node.name, self.node.op_type)

    def shape(self, nid: int) -> tuple[int, ...]:
        return self.b.nodes[nid].out_shape

    def emit(self, kind: str, parents: tuple[int, ...], params: Mapping[str, Any] | None = None, **attrs: Any) -> int:
        """Append an IR node whose shape the op's own rule infers from its parents (refusal -> at this node)."""
        op = get_op(kind)
        probe = node_attrs(_Probe(attrs), op)
        try:
            shape = op.shape_rule(tuple(self.shape(p) for p in parents), probe, ())
        except (ShapeRuleError, KeyError, TypeError, IndexError) as exc:
            raise self.fail(f"{kind}: {exc}") from None
        return self.b.add(kind, parents, shape, params=params, **attrs)

    def const(self, arr: np.ndarray) -> int:
        """A const node holding ``arr`` (float32)."""
        a = np.array(arr, dtype=np.float32, order="C")  # (np.ascontiguousarray would make a rank-0 value 1-d)
        return self.b.add("const", (), a.shape, params={"value": a})

    def scalar(self, v: float) -> int:
        """A rank-0 const node (broadcast where it is used)."""
        return self.const(np.asarray(v, np.float32))

    def reshape(self, nid: int, shape: tuple[int, ...]) -> int:
        """``nid`` reshaped (no node when the shape is already ``shape``)."""
        shape = tuple(int(d) for d in shape)
        return nid if self.shape(nid) == shape else self.emit("reshape", (nid,), shape=shape)

    def broadcast_to(self, nid: int, shape: tuple[int, ...]) -> int:
        """``nid`` broadcast (NumPy rules, a bit copy) to ``shape``."""
        shape = tuple(int(d) for d in shape)
        return nid if self.shape(nid) == shape else self.emit("broadcastTo", (nid,), shape=shape)

    def broadcast_all(self, ids: list[int]) -> list[int]:
        """The operands broadcast to their common shape (ONNX multidirectional broadcasting made explicit)."""
        try:
            shape = tuple(int(d) for d in np.broadcast_shapes(*(self.shape(i) for i in ids)))
        except ValueError:
            shapes = ", ".join(str(list(self.shape(i))) for i in ids)
            raise self.fail(f"operand shapes {shapes} do not broadcast") from None
        return [self.broadcast_to(i, shape) for i in ids]

    def value(self, name: str) -> int:
        """The IR node of tensor ``name`` (a float32 constant used as data becomes a const node)."""
        if name in self.index_inputs:
            raise self.fail(f"integer graph input {name!r} used as data (only as Gather indices into a constant table)")
        if name in self.ids:
            return self.ids[name]
        if name in self.inits:
            arr = self.inits[name]
            if arr.dtype != np.float32:
                raise self.fail(f"input {name!r} is a {arr.dtype} constant where float32 data is expected")
            self.ids[name] = self.const(arr)
            return self.ids[name]
        raise self.fail(f"input {name!r} is neither a graph input, an initializer nor an earlier node's output")

    def init(self, name: str, what: str) -> np.ndarray:
        """Constant ``name`` as a float32 array (refused if the parameter is computed from graph inputs)."""
        if name not in self.inits:
            raise self.fail(f"{what} {name!r} must be a constant (an initializer or folded from constants)")
        return np.asarray(self.inits[name]).astype(np.float32)

    def consts(self, name: str, what: str) -> np.ndarray:
        """Constant ``name`` as it is (integer shapes, axes, pads), or a refusal naming the input."""
        if name not in self.inits:
            raise self.fail(f"{what} {name!r} must be a constant (an initializer or folded from constants)")
        return self.inits[name]


class _Probe:
    """Just enough of a Node for node_attrs: the attributes."""

    def __init__(self, attrs: Mapping[str, Any]):
        self.attrs = dict(attrs)


def _attrs(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _only(node: Any, allowed: Mapping[str, Any], ctx: _Ctx) -> dict[str, Any]:
    """The node's attributes; any not in ``allowed`` (name -> accepted values or None for any) is refused."""
    a = _attrs(node)
    for k, v in a.items():
        if k not in allowed:
            raise ctx.fail(f"attribute {k}={v!r} is not supported")
        ok = allowed[k]
        if ok is not None and _plain(v) not in ok:
            raise ctx.fail(f"attribute {k}={_plain(v)!r} is not supported (accepted: {list(ok)})")
    return a


def _plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list):
        return tuple(v)
    return v


NEG_ZERO = np.float32(-0.0)
NEG_INF = np.float32(-np.inf)


def _neg_zero(n: int) -> np.ndarray:
    return np.full((n,), NEG_ZERO, dtype=np.float32)


def _prod(dims: Any) -> int:
    return int(np.prod(tuple(dims), dtype=np.int64))


# -- op mappings ----------------------------------------------------------------------------------------

OnnxOp = Callable[[_Ctx, Any], Any]
ONNX_OPS: dict[str, OnnxOp] = {}
REFUSED: dict[str, str] = {}


def onnx_op(*names: str) -> Callable[[OnnxOp], OnnxOp]:
    """Decorator: the importer of ONNX op types ``names`` (returns an IR node id, or a tuple for several outputs)."""

    def deco(fn: OnnxOp) -> OnnxOp:
        for n in names:
            ONNX_OPS[n] = fn
        return fn

    return deco


def supported_onnx_ops() -> tuple[str, ...]:
    """The ONNX op types the importer maps."""
    return tuple(sorted(ONNX_OPS))


def _input(node: Any, i: int) -> str:
    """Name of the node's i-th input, or '' where it is absent."""
    return node.input[i] if len(node.input) > i else ""


def _single_output(ctx: _Ctx, node: Any, what: str) -> None:
    if len(node.output) > 1 and any(node.output[1:]):
        raise ctx.fail(f"{what}: only the first output is supported (outputs {list(node.output)})")


_UNARY = {
    "Relu": "relu",
    "Tanh": "tanh",
    "Sigmoid": "sigmoid",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Neg": "neg",
    "Abs": "abs",
    "Reciprocal": "inv",
    "Sin": "sin",
    "Cos": "cos",
    "Erf": "erf",
}


@onnx_op(*_UNARY)
def _unary(ctx: _Ctx, node: Any) -> int:
    _only(node, {}, ctx)
    return ctx.emit(_UNARY[node.op_type], (ctx.value(node.input[0]),))


@onnx_op("Identity")
def _identity(ctx: _Ctx, node: Any) -> int:
    _only(node, {}, ctx)
    return ctx.value(node.input[0])


@onnx_op("Dropout")
def _dropout(ctx: _Ctx, node: Any) -> int:
    # Inference Dropout is the identity (ONNX: training_mode absent or false); training would need the IR's explicit,
    # seeded bernoulliMask, which ONNX's unseeded op cannot give.
    a = _only(node, {"seed": None, "ratio": None}, ctx)
    if _input(node, 2):
        mode = ctx.consts(node.input[2], "Dropout training_mode")
        ratio = np.asarray(ctx.consts(node.input[1], "Dropout ratio")).reshape(-1) if _input(node, 1) else [0.5]
        if bool(np.asarray(mode).reshape(-1)[0]) and float(ratio[0]) != 0.0:  # ratio 0 drops nothing: the identity
            raise ctx.fail("Dropout training_mode=true is randomness without a seed the IR can state; refused")
    del a
    _single_output(ctx, node, "Dropout (the mask output)")
    return ctx.value(node.input[0])


_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul_elem", "Div": "div", "Pow": "pow"}


@onnx_op(*_BINARY)
def _binary(ctx: _Ctx, node: Any) -> int:
    _only(node, {}, ctx)
    ex = node.input[1]
    if node.op_type == "Pow" and ex in ctx.inits and ex not in ctx.ids and ctx.inits[ex].dtype.kind in "iu":
        e = np.asarray(ctx.inits[ex])
        if not np.array_equal(e.astype(np.float32).astype(e.dtype), e):
            raise ctx.fail(f"Pow exponent {ex!r}: integers beyond binary32's exact range")
        ctx.ids[ex] = ctx.const(e.astype(np.float32))  # an integer exponent, exactly a binary32 value
    a, b = ctx.broadcast_all([ctx.value(node.input[0]), ctx.value(ex)])
    return ctx.emit(_BINARY[node.op_type], (a, b))


def _stack_reduce(ctx: _Ctx, parts: list[int], mode: str) -> int:
    """max over equal-shape parts (IEEE maximum fold, NaN propagates): the IR pool over a stacked last axis."""
    shape = ctx.shape(parts[0])
    m = _prod(shape)
    cols = [ctx.reshape(p, (1, m, 1)) for p in parts]
    st = cols[0] if len(cols) == 1 else ctx.emit("concat", tuple(cols), axis=2)
    t = len(parts)
    if mode == "max":
        y = ctx.emit("pool", (st,), mode="max", kernel=(1, t), stride=(1, t), padding=(0, 0))
    else:
        y = ctx.emit("reduceSum", (st,), axis=2, keepdim=True)
    return ctx.reshape(y, shape)


def _max_of(ctx: _Ctx, ids: list[int]) -> int:
    return _stack_reduce(ctx, ctx.broadcast_all(ids), "max")


def _min_of(ctx: _Ctx, ids: list[int]) -> int:
    # min(a, b) == -max(-a, -b) exactly: neg is a sign flip, the maximum fold picks one operand's bits.
    ids = ctx.broadcast_all(ids)
    return ctx.emit("neg", (_stack_reduce(ctx, [ctx.emit("neg", (i,)) for i in ids], "max"),))


@onnx_op("Max", "Min")
def _maxmin(ctx: _Ctx, node: Any) -> int:
    # ONNX Max/Min propagate NaN: the IR's pool max (IEEE maximum fold), not maxElem (C fmaxf drops a NaN operand).
    _only(node, {}, ctx)
    ids = [ctx.value(n) for n in node.input if n]
    return (_max_of if node.op_type == "Max" else _min_of)(ctx, ids)


@onnx_op("Clip")
def _clip(ctx: _Ctx, node: Any) -> int:
    _only(node, {}, ctx)
    x = ctx.value(node.input[0])
    if _input(node, 1):
        x = _max_of(ctx, [x, ctx.value(node.input[1])])
    if _input(node, 2):
        x = _min_of(ctx, [x, ctx.value(node.input[2])])
    return x


def _scaled(ctx: _Ctx, x: int, v: float) -> int:
    """v * x, one rounded product (a broadcast scalar const)."""
    return ctx.emit("mul_elem", tuple(ctx.broadcast_all([ctx.scalar(v), x])))


@onnx_op("LeakyRelu", "PRelu")
def _leaky(ctx: _Ctx, node: Any) -> int:
    # x if x >= 0 else slope x == max(x, slope x) for 0 <= slope <= 1 (exactly: the maximum picks one operand, NaN
    # propagates, -0 stays -0), the IR's max fold over the two; other slopes are refused.
    a = _only(node, {"alpha": None}, ctx)
    x = ctx.value(node.input[0])
    if node.op_type == "LeakyRelu":
        slope = np.asarray(np.float32(a.get("alpha", 0.01)))
        sx = _scaled(ctx, x, float(slope))
    else:
        slope = ctx.init(node.input[1], "PRelu slope")
        sx = ctx.emit("mul_elem", tuple(ctx.broadcast_all([ctx.const(slope), x])))
    if not ((slope >= 0) & (slope <= 1)).all():
        raise ctx.fail(f"{node.op_type} slope outside [0, 1]: max(x, slope x) would not be its meaning; refused")
    return _max_of(ctx, [x, sx])


@onnx_op("HardSigmoid", "HardSwish")
def _hard_sigmoid(ctx: _Ctx, node: Any) -> int:
    # max(0, min(1, alpha x + beta)), each op rounded in that order; HardSwish is x times it (alpha 1/6, beta 0.5)
    a = _only(node, {"alpha": None, "beta": None}, ctx)
    x = ctx.value(node.input[0])
    alpha = float(np.float32(a.get("alpha", 0.2 if node.op_type == "HardSigmoid" else 1 / 6)))
    beta = float(np.float32(a.get("beta", 0.5)))
    z = ctx.emit("add", tuple(ctx.broadcast_all([_scaled(ctx, x, alpha), ctx.scalar(beta)])))
    h = _max_of(ctx, [ctx.scalar(0.0), _min_of(ctx, [ctx.scalar(1.0), z])])
    return h if node.op_type == "HardSigmoid" else ctx.emit("mul_elem", (x, h))


@onnx_op("Softplus", "Mish")
def _softplus(ctx: _Ctx, node: Any) -> int:
    # Softplus: log(exp(x) + 1), each op rounded (ONNX's formula as written); Mish: x tanh(softplus(x))
    _only(node, {}, ctx)
    x = ctx.value(node.input[0])
    sp = ctx.emit("log", (ctx.emit("add", tuple(ctx.broadcast_all([ctx.emit("exp", (x,)), ctx.scalar(1.0)]))),))
    return sp if node.op_type == "Softplus" else ctx.emit("mul_elem", (x, ctx.emit("tanh", (sp,))))


@onnx_op("Gemm")
def _gemm(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"alpha": None, "beta": None, "transA": (0, 1), "transB": (0, 1)}, ctx)
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    x = ctx.value(node.input[0])
    if len(ctx.shape(x)) != 2:
        raise ctx.fail(f"Gemm input A must be 2-D, got {list(ctx.shape(x))}")
    if a.get("transA", 0):
        x = ctx.emit("permute", (x,), perm=(1, 0))
    c_name = _input(node, 2)
    if node.input[1] in ctx.inits:
        w = ctx.init(node.input[1], "Gemm B")
        w = w if a.get("transB", 0) else w.T
        n = int(w.shape[0])
        vec = c_name in ctx.inits and ctx.inits[c_name].shape == (n,) and alpha == 1.0 and beta == 1.0
        bias = ctx.inits[c_name].astype(np.float32) if vec else _neg_zero(n)
        y = ctx.emit("linear", (x,), {"weight": np.ascontiguousarray(w), "bias": bias}, out_features=n)
        if vec:
            return y
    else:
        b = ctx.value(node.input[1])
        if a.get("transB", 0):
            b = ctx.emit("permute", (b,), perm=(1, 0))
        y = ctx.emit("matmul", (x, b))
    # ONNX: alpha * (A B) + beta * C, each product and the sum rounded in binary32
    if alpha != 1.0:
        y = ctx.emit("mul_elem", ctx.broadcast_all([y, ctx.scalar(alpha)]))
    if c_name:
        c = ctx.value(c_name)
        if beta != 1.0:
            c = ctx.emit("mul_elem", ctx.broadcast_all([c, ctx.scalar(beta)]))
        try:
            c = ctx.broadcast_to(c, ctx.shape(y))
        except OnnxImportError:
            raise ctx.fail(f"Gemm C of shape {list(ctx.shape(c))} does not broadcast to {list(ctx.shape(y))}") from None
        y = ctx.emit("add", (y, c))
    return y


@onnx_op("MatMul")
def _matmul(ctx: _Ctx, node: Any) -> int:
    _only(node, {}, ctx)
    x = ctx.value(node.input[0])
    if node.input[1] in ctx.inits and ctx.inits[node.input[1]].ndim == 2 and len(ctx.shape(x)) >= 1:
        w = ctx.inits[node.input[1]].T  # x @ B == linear with W = B^T and a -0.0 bias (changes no value)
        if ctx.shape(x)[-1] != w.shape[1]:
            raise ctx.fail(f"MatMul {list(ctx.shape(x))} @ {list(w.T.shape)}: inner dimensions differ")
        return ctx.emit(
            "linear",
            (x,),
            {"weight": np.ascontiguousarray(w), "bias": _neg_zero(w.shape[0])},
            out_features=int(w.shape[0]),
        )
    y = ctx.value(node.input[1])
    sa, sb = ctx.shape(x), ctx.shape(y)
    if not sa or not sb:
        raise ctx.fail(f"MatMul of a scalar operand ({list(sa)} @ {list(sb)})")
    # numpy.matmul: a 1-D left operand is a row (axis removed after), a 1-D right operand a column
    xa = ctx.reshape(x, (1,) + sa) if len(sa) == 1 else x
    yb = ctx.reshape(y, sb + (1,)) if len(sb) == 1 else y
    sa2, sb2 = ctx.shape(xa), ctx.shape(yb)
    if sa2[-1] != sb2[-2]:
        raise ctx.fail(f"MatMul {list(sa)} @ {list(sb)}: inner dimensions {sa2[-1]} and {sb2[-2]} differ")
    try:
        batch = tuple(int(d) for d in np.broadcast_shapes(sa2[:-2], sb2[:-2]))
    except ValueError:
        raise ctx.fail(f"MatMul {list(sa)} @ {list(sb)}: batch dimensions do not broadcast") from None
    xa = ctx.broadcast_to(xa, batch + sa2[-2:])
    yb = ctx.broadcast_to(yb, batch + sb2[-2:])
    out = ctx.emit("matmul", (xa, yb))
    want = batch + ((sa2[-2],) if len(sa) > 1 else ()) + ((sb2[-1],) if len(sb) > 1 else ())
    return ctx.reshape(out, want) if ctx.shape(out) != want else out


# -- windows: Conv and the pools --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Window:
    """One window sweep per spatial axis: kernel, stride, dilation, begin/end pads, output length."""

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    begin: tuple[int, ...]
    end: tuple[int, ...]
    out: tuple[int, ...]


def _window(ctx: _Ctx, a: Mapping[str, Any], spatial: tuple[int, ...], kernel: tuple[int, ...]) -> _Window:
    """ONNX's window arithmetic (auto_pad, pads, ceil_mode) as explicit pads and output sizes per axis."""
    r = len(spatial)
    if len(kernel) != r:
        raise ctx.fail(f"kernel_shape {list(kernel)} has {len(kernel)} axes; the input has {r} spatial axes")
    stride = tuple(int(v) for v in a.get("strides", (1,) * r))
    dil = tuple(int(v) for v in a.get("dilations", (1,) * r))
    pads = tuple(int(v) for v in a.get("pads", (0,) * (2 * r)))
    if len(stride) != r or len(dil) != r or len(pads) != 2 * r:
        raise ctx.fail(f"strides {list(stride)}, dilations {list(dil)} or pads {list(pads)} do not match {r} axes")
    if min(stride + dil + kernel, default=1) < 1 or min(pads, default=0) < 0:
        raise ctx.fail(f"strides {list(stride)}, dilations {list(dil)}, kernel {list(kernel)} or pads {list(pads)} < 0")
    auto = _plain(a.get("auto_pad", "NOTSET"))
    ceil = bool(a.get("ceil_mode", 0))
    begin, end, out = list(pads[:r]), list(pads[r:]), []
    for i in range(r):
        span = dil[i] * (kernel[i] - 1) + 1
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-spatial[i] // stride[i])
            total = max((o - 1) * stride[i] + span - spatial[i], 0)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            begin[i], end[i] = lo, total - lo
        elif auto == "VALID":
            begin[i], end[i] = 0, 0
        elif auto != "NOTSET":
            raise ctx.fail(f"attribute auto_pad={auto!r} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")
        plan = window_plan(spatial[i], kernel[i], stride[i], dil[i], begin[i], end[i], ceil)
        if not plan["valid"]:
            raise ctx.fail(
                f"window of span {span} (kernel {kernel[i]}, dilation {dil[i]}) does not fit the padded spatial size "
                f"{plan['padded']} (size {spatial[i]} + pads {begin[i]} + {end[i]})"
            )
        o = plan["out"]
        out.append(o)
    return _Window(kernel, stride, dil, tuple(begin), tuple(end), tuple(out))


def _pad_axis(ctx: _Ctx, x: int, axis: int, before: int, after: int, value: float) -> int:
    """x padded along ``axis`` with ``before``/``after`` copies of ``value`` (concat with const nodes)."""
    s = ctx.shape(x)
    parts = []
    if before:
        parts.append(ctx.const(np.full(s[:axis] + (before,) + s[axis + 1 :], value, np.float32)))
    parts.append(x)
    if after:
        parts.append(ctx.const(np.full(s[:axis] + (after,) + s[axis + 1 :], value, np.float32)))
    return parts[0] if len(parts) == 1 else ctx.emit("concat", tuple(parts), axis=axis)


def _crop_axis(ctx: _Ctx, x: int, axis: int, start: int, stop: int) -> int:
    s = ctx.shape(x)
    if start == 0 and stop == s[axis]:
        return x
    return ctx.emit("slice", (x,), axis=axis, start=start, stop=stop, step=1)


def _taps(ctx: _Ctx, x: int, w: _Window, fill: float) -> tuple[list[int], list[tuple[int, ...]]]:
    """Every window tap of x (N, C, *spatial) as a node (N, C, *out), in row-major tap order, and its offsets.

    x is padded explicitly with ``fill`` so that every tap of every window lies inside the padded array (the end
    pad grows for ceil_mode windows that overhang it); tap t of axis i reads padded index o * stride + t * dilation.
    """
    sp = ctx.shape(x)[2:]
    r = len(sp)
    for i in range(r):
        need = (w.out[i] - 1) * w.stride[i] + w.dilation[i] * (w.kernel[i] - 1) + 1
        end = max(w.end[i], need - sp[i] - w.begin[i])
        x = _pad_axis(ctx, x, 2 + i, w.begin[i], end, fill)
    taps, offsets = [], []
    for off in itertools.product(*(range(k) for k in w.kernel)):
        t = x
        for i, ti in enumerate(off):
            start = ti * w.dilation[i]
            stop = start + (w.out[i] - 1) * w.stride[i] + 1
            if start != 0 or stop != ctx.shape(t)[2 + i] or w.stride[i] != 1:
                t = ctx.emit("slice", (t,), axis=2 + i, start=start, stop=stop, step=w.stride[i])
        taps.append(t)
        offsets.append(off)
    return taps, offsets


@onnx_op("MaxPool", "AveragePool")
def _pool(ctx: _Ctx, node: Any) -> int:
    allowed: dict[str, Any] = {
        "kernel_shape": None,
        "strides": None,
        "pads": None,
        "auto_pad": None,
        "ceil_mode": (0, 1),
        "dilations": None,
    }
    if node.op_type == "MaxPool":
        allowed["storage_order"] = (0, 1)
    else:
        allowed["count_include_pad"] = (0, 1)
    a = _only(node, allowed, ctx)
    _single_output(ctx, node, "MaxPool (the Indices output)")
    x = ctx.value(node.input[0])
    s = ctx.shape(x)
    if len(s) < 3:
        raise ctx.fail(f"{node.op_type} needs (N, C, spatial...) with at least one spatial axis, got {list(s)}")
    kernel = tuple(int(v) for v in a["kernel_shape"])
    w = _window(ctx, a, s[2:], kernel)
    r = len(s) - 2
    mode = "max" if node.op_type == "MaxPool" else "avg"
    include = bool(a.get("count_include_pad", 0))
    half = all(2 * p <= k for p, k in zip(w.begin, kernel, strict=True))
    simple = w.begin == w.end and all(d == 1 for d in w.dilation) and half
    simple = simple and all(
        o == (n + 2 * p - k) // st + 1 for o, n, p, k, st in zip(w.out, s[2:], w.begin, kernel, w.stride, strict=True)
    )
    simple = simple and (mode == "max" or include or not any(w.begin))
    if simple and r in (1, 2):
        # the IR's pool op: max is the IEEE maximum fold from -Inf, avg the fold from +0 / (kh kw) (pads counted)
        lift = r == 1
        xi = ctx.reshape(x, s[:2] + (1,) + s[2:]) if lift else x
        pair = (lambda v: (1, v[0])) if lift else (lambda v: tuple(v))
        y = ctx.emit(
            "pool",
            (xi,),
            mode=mode,
            kernel=pair(kernel),
            stride=pair(w.stride),
            padding=(0, w.begin[0]) if lift else tuple(w.begin),
        )
        return ctx.reshape(y, s[:2] + w.out) if lift else y
    # every other window: explicit taps, then the IR's max fold (pool over the stacked taps) or sum / count
    taps, offsets = _taps(ctx, x, w, float(NEG_INF) if mode == "max" else 0.0)
    if mode == "max":
        return _stack_reduce(ctx, taps, "max")
    total = _stack_reduce(ctx, taps, "sum")
    count = np.zeros(w.out, np.float64)
    for off in offsets:
        ok = np.ones(w.out, bool)
        for i, ti in enumerate(off):
            pos = np.arange(w.out[i]) * w.stride[i] + ti * w.dilation[i] - w.begin[i]  # index into x
            lo, hi = (-w.begin[i], s[2 + i] + w.end[i]) if include else (0, s[2 + i])
            shape = [1] * r
            shape[i] = w.out[i]
            ok = ok & ((pos >= lo) & (pos < hi)).reshape(shape)
        count += ok
    cnt = ctx.const(np.broadcast_to(count.astype(np.float32), s[:2] + w.out).copy())
    return ctx.emit("div", (total, cnt))


@onnx_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx: _Ctx, node: Any) -> int:
    _only(node, {}, ctx)
    x = ctx.value(node.input[0])
    s = ctx.shape(x)
    if len(s) < 3:
        raise ctx.fail(f"{node.op_type} needs (N, C, spatial...), got {list(s)}")
    flat = ctx.reshape(x, s[:2] + (_prod(s[2:]),))
    if node.op_type == "GlobalAveragePool":
        y = ctx.emit("reduceMean", (flat,), axis=2, keepdim=True)
    else:
        m = _prod(s[:2])
        y = ctx.emit(
            "pool", (ctx.reshape(flat, (1, m, _prod(s[2:]))),), mode="max", kernel=(1, _prod(s[2:])), stride=(1, 1)
        )
    return ctx.reshape(y, s[:2] + (1,) * (len(s) - 2))


@onnx_op("Conv")
def _conv(ctx: _Ctx, node: Any) -> int:
    a = _only(
        node,
        {"kernel_shape": None, "strides": None, "pads": None, "dilations": None, "group": None, "auto_pad": None},
        ctx,
    )
    x = ctx.value(node.input[0])
    w = ctx.init(node.input[1], "Conv W")
    s = ctx.shape(x)
    if w.ndim not in (3, 4) or len(s) != w.ndim:
        raise ctx.fail(f"only 1-d and 2-d convolution are supported (input {list(s)}, weight {list(w.shape)})")
    b = ctx.init(node.input[2], "Conv B") if _input(node, 2) else _neg_zero(w.shape[0])
    kernel = tuple(int(v) for v in a.get("kernel_shape", w.shape[2:]))
    if kernel != tuple(w.shape[2:]):
        raise ctx.fail(f"kernel_shape {list(kernel)} differs from the weight's {list(w.shape[2:])}")
    win = _window(ctx, a, s[2:], kernel)
    group = int(a.get("group", 1))
    if group < 1 or s[1] % group or w.shape[0] % group or w.shape[1] * group != s[1]:
        raise ctx.fail(f"group={group} does not divide input channels {s[1]} and weight {list(w.shape)}")
    lift = w.ndim == 3
    if lift:  # 1-d as 2-d with a unit height
        x = ctx.reshape(x, s[:2] + (1,) + s[2:])
        w = w[:, :, None, :]
    r = 2
    k2 = tuple(w.shape[2:])
    st = (1,) + win.stride if lift else win.stride
    dl = (1,) + win.dilation if lift else win.dilation
    bg = (0,) + win.begin if lift else win.begin
    en = (0,) + win.end if lift else win.end
    # asymmetric pads: pad explicitly with zeros (the conv's own zero padding), then convolve unpadded
    pad = tuple(min(p, q) for p, q in zip(bg, en, strict=True))
    for i in range(r):
        x = _pad_axis(ctx, x, 2 + i, bg[i] - pad[i], en[i] - pad[i], 0.0)
    cin = w.shape[1]
    cout_g = w.shape[0] // group
    outs = []
    for g in range(group):
        xg = x if group == 1 else _crop_axis(ctx, x, 1, g * cin, (g + 1) * cin)
        wg = np.ascontiguousarray(w[g * cout_g : (g + 1) * cout_g])
        outs.append(
            ctx.emit(
                "conv2d",
                (xg,),
                {"weight": wg, "bias": np.ascontiguousarray(b[g * cout_g : (g + 1) * cout_g])},
                out_channels=int(cout_g),
                kernel=k2,
                stride=st,
                padding=pad,
                dilation=dl,
            )
        )
    y = outs[0] if group == 1 else ctx.emit("concat", tuple(outs), axis=1)
    return ctx.reshape(y, s[:2][:1] + (w.shape[0],) + win.out) if lift else y


def _upsample_axis(ctx: _Ctx, x: int, axis: int, s: int) -> int:
    """x with s - 1 zeros inserted between neighbours along ``axis`` (a concat with a const, then a reshape)."""
    if s == 1:
        return x
    sh = ctx.shape(x)
    n = sh[axis]
    col = ctx.reshape(x, sh[: axis + 1] + (1,) + sh[axis + 1 :])
    zeros = ctx.const(np.zeros(sh[: axis + 1] + (s - 1,) + sh[axis + 1 :], np.float32))
    woven = ctx.reshape(ctx.emit("concat", (col, zeros), axis=axis + 1), sh[:axis] + (n * s,) + sh[axis + 1 :])
    return _crop_axis(ctx, woven, axis, 0, s * (n - 1) + 1)


@onnx_op("ConvTranspose")
def _conv_transpose(ctx: _Ctx, node: Any) -> int:
    # The transposed convolution as ONNX defines it (output index o = i stride + t dilation - pad_begin), written as
    # the IR's conv2d of the input with stride - 1 zeros woven in, padded by span - 1 - pad (cropped where negative),
    # with the kernel flipped and its channel axes swapped. The zeros add +-0 products: the sums are those of ONNX.
    a = _only(
        node,
        {
            "kernel_shape": None,
            "strides": None,
            "pads": None,
            "dilations": None,
            "group": None,
            "auto_pad": None,
            "output_padding": None,
            "output_shape": None,
        },
        ctx,
    )
    x = ctx.value(node.input[0])
    w = ctx.init(node.input[1], "ConvTranspose W")
    s = ctx.shape(x)
    r = len(s) - 2
    if w.ndim != len(s) or r not in (1, 2):
        raise ctx.fail(f"only 1-d and 2-d transposed convolution are supported (input {list(s)}, W {list(w.shape)})")
    kernel = tuple(int(v) for v in a.get("kernel_shape", w.shape[2:]))
    if kernel != tuple(w.shape[2:]):
        raise ctx.fail(f"kernel_shape {list(kernel)} differs from the weight's {list(w.shape[2:])}")
    group = int(a.get("group", 1))
    if group < 1 or s[1] != w.shape[0] or s[1] % group:
        raise ctx.fail(f"group={group} does not fit input channels {s[1]} and W {list(w.shape)}")
    cout = w.shape[1] * group
    b = ctx.init(node.input[2], "ConvTranspose B") if _input(node, 2) else _neg_zero(cout)
    st = tuple(int(v) for v in a.get("strides", (1,) * r))
    dl = tuple(int(v) for v in a.get("dilations", (1,) * r))
    op = tuple(int(v) for v in a.get("output_padding", (0,) * r))
    auto = _plain(a.get("auto_pad", "NOTSET"))
    if len(st) != r or len(dl) != r or len(op) != r or min(st + dl, default=1) < 1 or min(op, default=0) < 0:
        raise ctx.fail(f"strides {list(st)}, dilations {list(dl)} or output_padding {list(op)} do not fit {r} axes")
    span = tuple(d * (k - 1) + 1 for d, k in zip(dl, kernel, strict=True))
    full = tuple(t * (n - 1) + p + q for t, n, p, q in zip(st, s[2:], op, span, strict=True))
    if "pads" not in a and auto in ("SAME_UPPER", "SAME_LOWER"):
        out = tuple(int(v) for v in a.get("output_shape", tuple(n * t for n, t in zip(s[2:], st, strict=True))))
        total = tuple(f - o for f, o in zip(full, out, strict=True))
        lo = tuple(t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total)
        begin, end = lo, tuple(t - q for t, q in zip(total, lo, strict=True))
    elif auto not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise ctx.fail(f"attribute auto_pad={auto!r} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")
    else:
        pads = tuple(int(v) for v in a.get("pads", (0,) * (2 * r)))
        if len(pads) != 2 * r:
            raise ctx.fail(f"pads {list(pads)} do not match {r} axes")
        begin, end = pads[:r], pads[r:]
        natural = tuple(f - p - q for f, p, q in zip(full, begin, end, strict=True))
        out = tuple(int(v) for v in a.get("output_shape", natural))
    if len(out) != r or min(out, default=1) < 1:
        raise ctx.fail(f"output shape {list(out)} does not fit {r} axes")
    for i in range(r):
        x = _upsample_axis(ctx, x, 2 + i, st[i])
        u = ctx.shape(x)[2 + i]
        lo = span[i] - 1 - begin[i]
        hi = out[i] - u - lo + span[i] - 1
        x = _crop_axis(ctx, x, 2 + i, max(-lo, 0), u - max(-hi, 0))
        x = _pad_axis(ctx, x, 2 + i, max(lo, 0), max(hi, 0), 0.0)
    lift = r == 1
    if lift:
        x = ctx.reshape(x, ctx.shape(x)[:2] + (1,) + ctx.shape(x)[2:])
        w = w[:, :, None, :]
        dl = (1,) + dl
    cin_g, cout_g = s[1] // group, w.shape[1]
    outs = []
    for g in range(group):
        xg = x if group == 1 else _crop_axis(ctx, x, 1, g * cin_g, (g + 1) * cin_g)
        wg = np.ascontiguousarray(np.flip(w[g * cin_g : (g + 1) * cin_g], axis=(2, 3)).transpose(1, 0, 2, 3))
        outs.append(
            ctx.emit(
                "conv2d",
                (xg,),
                {"weight": wg, "bias": np.ascontiguousarray(b[g * cout_g : (g + 1) * cout_g])},
                out_channels=int(cout_g),
                kernel=tuple(wg.shape[2:]),
                dilation=dl,
            )
        )
    y = outs[0] if group == 1 else ctx.emit("concat", tuple(outs), axis=1)
    return ctx.reshape(y, (s[0], cout) + out) if lift else y


def _take(ctx: _Ctx, x: int, axis: int, idx: Any) -> int:
    """x[..., idx, ...] along ``axis`` (bit copies): runs of equally spaced ascending indices become one slice."""
    idx = [int(i) for i in np.asarray(idx).reshape(-1)]
    if not idx:
        raise ctx.fail("a gather of no index")
    parts, i = [], 0
    while i < len(idx):
        j, step = i + 1, (idx[i + 1] - idx[i]) if i + 1 < len(idx) else 1
        if step >= 1:
            while j < len(idx) and idx[j] - idx[j - 1] == step:
                j += 1
        else:
            step = 1
        start, stop = idx[i], idx[j - 1] + 1
        dim = ctx.shape(x)[axis]
        if (start, stop, step) != (0, dim, 1):
            parts.append(ctx.emit("slice", (x,), axis=axis, start=start, stop=stop, step=step))
        else:
            parts.append(x)
        i = j
    return parts[0] if len(parts) == 1 else ctx.emit("concat", tuple(parts), axis=axis)


def _reference_resize(ctx: _Ctx, node: Any, x: np.ndarray, extra: Mapping[str, Any]) -> np.ndarray:
    """ONNX's reference Resize of the constant ``x`` with the node's attributes updated by ``extra`` (its inputs
    roi/scales/sizes in ``extra['inputs']``): how the op's own definition places every output on the input grid."""
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    attrs = {**_attrs(node), **{k: v for k, v in extra.items() if k != "inputs"}}
    names = ["X", "roi", "scales", "sizes"]
    feeds = {"X": x, **{n: v for n, v in extra["inputs"].items() if v is not None}}
    ins = [n if n in feeds else "" for n in names]
    while ins and not ins[-1]:
        ins.pop()
    single = helper.make_node("Resize", ins, ["Y"], **{k: v for k, v in attrs.items() if v is not None})
    try:
        return np.asarray(ReferenceEvaluator(single, opsets={"": max(ctx.opset, 19)}).run(None, feeds)[0])
    except Exception as e:  # noqa: BLE001 - ONNX's reference refusing these attributes is a refusal at the node
        raise ctx.fail(f"Resize: ONNX's reference cannot place these windows: {type(e).__name__}: {e}") from None
    finally:
        del onnx


@onnx_op("Resize")
def _resize(ctx: _Ctx, node: Any) -> int:
    # Resize is separable and linear in x: nearest is a gather (each output one input element, found by running ONNX's
    # reference on the element indices), linear and cubic per axis y = sum_t c_t[o] x[i_t[o]] with the taps and
    # coefficients ONNX's reference gives on an identity (rounded to binary32; products and adds rounded, t ascending).
    a = _only(
        node,
        {
            "mode": ("nearest", "linear", "cubic"),
            "coordinate_transformation_mode": None,
            "cubic_coeff_a": None,
            "exclude_outside": (0, 1),
            "extrapolation_value": None,
            "nearest_mode": None,
            "antialias": (0, 1),
            "axes": None,
            "keep_aspect_ratio_policy": None,
        },
        ctx,
    )
    x = ctx.value(node.input[0])
    s = ctx.shape(x)
    const = {}
    for i, n in ((1, "roi"), (2, "scales"), (3, "sizes")):
        if _input(node, i):
            v = np.asarray(ctx.consts(node.input[i], f"Resize {n}"))
            const[n] = v if v.size else None
        else:
            const[n] = None
    zeros = _reference_resize(ctx, node, np.zeros(s, np.float32), {"inputs": const})
    out = tuple(int(d) for d in zeros.shape)
    mode = _plain(a.get("mode", "nearest"))
    total = _prod(s)
    if mode == "nearest":
        if total >= 1 << 24:
            raise ctx.fail(f"Resize nearest of {total} elements: indices beyond binary32's exact integers")
        where = _reference_resize(ctx, node, np.arange(total, dtype=np.float32).reshape(s), {"inputs": const})
        flat = ctx.reshape(x, (1, total))
        return ctx.reshape(_take(ctx, flat, 1, where.astype(np.int64).reshape(-1)), out)
    if _plain(a.get("keep_aspect_ratio_policy", "stretch")) != "stretch":
        raise ctx.fail("attribute keep_aspect_ratio_policy with linear/cubic mode is not supported")
    axes = [int(v) % len(s) for v in a.get("axes", range(len(s)))]
    y = x
    for k, ax in enumerate(axes):
        n_in, n_out = s[ax], out[ax]
        sub: dict[str, Any] = {"roi": None, "scales": None, "sizes": None}
        if const["scales"] is not None:
            sub["scales"] = np.asarray([const["scales"].reshape(-1)[k if "axes" in a else ax]], np.float32)
        if const["sizes"] is not None:
            sub["sizes"] = np.asarray([n_out], np.int64)
        if const["roi"] is not None:
            r = const["roi"].reshape(-1)
            half = r.size // 2
            j = k if "axes" in a else ax
            sub["roi"] = np.asarray([r[j], r[half + j]], r.dtype)
        eye = np.eye(n_in, dtype=np.float32)
        base = _reference_resize(
            ctx, node, np.zeros_like(eye), {"inputs": sub, "axes": [1], "keep_aspect_ratio_policy": None}
        )
        coef = (
            _reference_resize(ctx, node, eye, {"inputs": sub, "axes": [1], "keep_aspect_ratio_policy": None}) - base
        ).T
        if coef.shape != (n_out, n_in):
            raise ctx.fail(f"Resize axis {ax}: the per-axis reference gives {list(coef.shape)}, not [{n_out}, {n_in}]")
        if n_in == n_out and np.array_equal(coef, np.eye(n_in, dtype=coef.dtype)):
            continue
        taps = max(int((coef != 0).sum(axis=1).max(initial=0)), 1)
        idx = np.zeros((n_out, taps), np.int64)
        w = np.zeros((n_out, taps), np.float32)
        for o in range(n_out):
            nz = np.flatnonzero(coef[o])
            fill = nz[0] if nz.size else 0
            idx[o] = np.concatenate([nz, np.full(taps - nz.size, fill)])
            w[o, : nz.size] = coef[o, nz]
        shape = tuple(n_out if i == ax else 1 for i in range(len(s)))
        acc = None
        for t in range(taps):
            g = _take(ctx, y, ax, idx[:, t])
            c = ctx.broadcast_to(ctx.const(w[:, t].reshape(shape)), ctx.shape(g))
            term = ctx.emit("mul_elem", (c, g))
            acc = term if acc is None else ctx.emit("add", (acc, term))
        y = acc
    fill = float(a.get("extrapolation_value", 0.0))
    outside = zeros != 0
    if fill != 0.0 and outside.any():  # tf_crop_and_resize: positions outside the roi take the extrapolation value
        y = ctx.emit(
            "where",
            (ctx.const(outside.astype(np.float32)), ctx.broadcast_to(ctx.scalar(fill), out), y),
        )
    if ctx.shape(y) != out:
        raise ctx.fail(f"Resize: composed shape {list(ctx.shape(y))} differs from ONNX's {list(out)}")
    return y


# -- normalisations and softmax ----------------------------------------------------------------------------


@onnx_op("Softmax", "LogSoftmax")
def _softmax(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"axis": None}, ctx)
    x = ctx.value(node.input[0])
    rank = len(ctx.shape(x))
    axis = int(a.get("axis", -1 if ctx.opset >= 13 else 1))
    if not -rank <= axis < max(rank, 1):
        raise ctx.fail(f"attribute axis={axis} is out of range for rank {rank}")
    s = ctx.shape(x)
    if ctx.opset < 13:  # opsets 1..12 coerce to 2-d at axis: softmax over the flattened trailing axes
        ax = axis % max(rank, 1)
        x2 = ctx.reshape(x, (_prod(s[:ax]), _prod(s[ax:])))
        return ctx.reshape(_softmax_last(ctx, node, x2, 1), s)
    return _softmax_last(ctx, node, x, axis % max(rank, 1))


def _softmax_last(ctx: _Ctx, node: Any, x: int, axis: int) -> int:
    if node.op_type == "Softmax":
        return ctx.emit("softmax", (x,), axis=axis)
    # LogSoftmax: (x - m) - log(fold(exp(x - m))), m the IEEE max along the axis; each op rounded as the IR states
    s = ctx.shape(x)
    perm = tuple(i for i in range(len(s)) if i != axis) + (axis,)
    xt = ctx.emit("permute", (x,), perm=perm) if axis != len(s) - 1 else x
    st = ctx.shape(xt)
    rows, n = _prod(st[:-1]), st[-1]
    m = ctx.emit("pool", (ctx.reshape(xt, (1, rows, n)),), mode="max", kernel=(1, n), stride=(1, 1))
    d = ctx.emit("sub", (xt, ctx.broadcast_to(ctx.reshape(m, st[:-1] + (1,)), st)))
    lse = ctx.emit("log", (ctx.emit("reduceSum", (ctx.emit("exp", (d,)),), axis=-1, keepdim=True),))
    y = ctx.emit("sub", (d, ctx.broadcast_to(lse, st)))
    if axis != len(s) - 1:
        inv = tuple(int(i) for i in np.argsort(perm))
        y = ctx.emit("permute", (y,), perm=inv)
    return y


def _normalised_axes(ctx: _Ctx, node: Any) -> tuple[dict, Any, tuple[int, ...], int, int]:
    """LayerNormalization's and RMSNormalization's common reading: (attributes, x, x's shape, the first normalised
    axis in [0, rank), the count of normalised elements per row); an axis out of range is refused at the node."""
    a = _only(node, {"axis": None, "epsilon": None, "stash_type": (1,)}, ctx)
    x = ctx.value(node.input[0])
    s = ctx.shape(x)
    rank = len(s)
    axis = int(a.get("axis", -1))
    if not -rank <= axis < rank:
        raise ctx.fail(f"attribute axis={axis} is out of range for rank {rank}")
    axis %= rank
    return a, x, s, axis, _prod(s[axis:])


@onnx_op("LayerNormalization")
def _layernorm(ctx: _Ctx, node: Any) -> Any:
    a, x, s, axis, inner = _normalised_axes(ctx, node)
    rank = len(s)
    w = ctx.init(node.input[1], "LayerNormalization Scale")
    b = ctx.init(node.input[2], "LayerNormalization B") if _input(node, 2) else _neg_zero(inner)
    eps = float(np.float32(a.get("epsilon", 1e-5)))
    try:
        wf = np.broadcast_to(w, s[axis:]).reshape(inner).astype(np.float32)
        bf = np.broadcast_to(b, s[axis:]).reshape(inner).astype(np.float32)
    except ValueError:
        raise ctx.fail(f"Scale {list(w.shape)} or B {list(b.shape)} does not broadcast to {list(s[axis:])}") from None
    # normalising axes axis.. == the last axis of the (outer, inner) reshape: the same row-major fold
    x2 = ctx.reshape(x, (_prod(s[:axis]), inner))
    y = ctx.reshape(ctx.emit("layernorm", (x2,), {"weight": wf, "bias": bf}, eps=eps), s)
    if not (len(node.output) > 1 and any(node.output[1:])):
        return y
    # Mean and InvStdDev: the layernorm's own mu = fold(x)/n and r = rsqrt(fold(d d)/n + eps) (rounded once)
    stat = s[:axis] + (1,) * (rank - axis)
    mu = ctx.emit("reduceMean", (x2,), axis=1, keepdim=True)
    d = ctx.emit("sub", (x2, ctx.broadcast_to(mu, ctx.shape(x2))))
    var = ctx.emit("reduceMean", (ctx.emit("mul_elem", (d, d)),), axis=1, keepdim=True)
    r = ctx.emit("rsqrt", (ctx.emit("add", ctx.broadcast_all([var, ctx.scalar(eps)])),))
    return (y, ctx.reshape(mu, stat), ctx.reshape(r, stat))


@onnx_op("RMSNormalization")
def _rmsnorm(ctx: _Ctx, node: Any) -> int:
    a, x, s, axis, inner = _normalised_axes(ctx, node)
    w = ctx.init(node.input[1], "RMSNormalization scale")
    try:
        wf = np.broadcast_to(w, s[axis:]).reshape(inner).astype(np.float32)
    except ValueError:
        raise ctx.fail(f"scale {list(w.shape)} does not broadcast to {list(s[axis:])}") from None
    x2 = ctx.reshape(x, (_prod(s[:axis]), inner))
    y = ctx.emit("rmsnorm", (x2,), {"weight": wf}, eps=float(np.float32(a.get("epsilon", 1e-5))))
    return ctx.reshape(y, s)


@onnx_op("BatchNormalization")
def _batchnorm(ctx: _Ctx, node: Any) -> int:
    # inference form: y = (x - mean) / sqrt(var + eps) * scale + B, per channel (axis 1), each op rounded in order
    a = _only(node, {"epsilon": None, "momentum": None, "training_mode": (0,), "spatial": (1,)}, ctx)
    _single_output(ctx, node, "BatchNormalization (training outputs)")
    x = ctx.value(node.input[0])
    s = ctx.shape(x)
    if len(s) < 2:
        raise ctx.fail(f"BatchNormalization needs (N, C, ...), got {list(s)}")
    cshape = (1, s[1]) + (1,) * (len(s) - 2)

    def chan(i: int, what: str) -> int:
        v = ctx.init(node.input[i], f"BatchNormalization {what}").astype(np.float32)
        if v.shape != (s[1],):
            raise ctx.fail(f"BatchNormalization {what} has shape {list(v.shape)}, not [{s[1]}]")
        return ctx.broadcast_to(ctx.const(v.reshape(cshape)), s)

    eps = float(np.float32(a.get("epsilon", 1e-5)))
    scale, bias, mean, var = (chan(i, n) for i, n in ((1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")))
    den = ctx.emit("sqrt", (ctx.emit("add", (var, ctx.broadcast_to(ctx.scalar(eps), s))),))
    y = ctx.emit("div", (ctx.emit("sub", (x, mean)), den))
    return ctx.emit("add", (ctx.emit("mul_elem", (y, scale)), bias))


@onnx_op("Gelu")
def _gelu(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"approximate": ("tanh", "none")}, ctx)
    x = ctx.value(node.input[0])
    if _plain(a.get("approximate", "none")) == "tanh":
        return ctx.emit("gelu", (x,))
    # ONNX: 0.5 * x * (1 + erf(x / sqrt(2))), evaluated left to right, each op rounded
    s = ctx.shape(x)
    z = ctx.emit("erf", (ctx.emit("div", (x, ctx.broadcast_to(ctx.scalar(np.sqrt(np.float32(2.0))), s))),))
    one = ctx.emit("add", (ctx.broadcast_to(ctx.scalar(1.0), s), z))
    half = ctx.emit("mul_elem", (ctx.broadcast_to(ctx.scalar(0.5), s), x))
    return ctx.emit("mul_elem", (half, one))


@onnx_op("Where")
def _where(ctx: _Ctx, node: Any) -> int:
    _only(node, {}, ctx)
    c = node.input[0]
    if c not in ctx.inits:
        raise ctx.fail(f"Where condition {c!r} computed from data (the IR has no comparison op: constant masks only)")
    cond = ctx.const(np.asarray(ctx.inits[c]).astype(bool).astype(np.float32))
    ids = ctx.broadcast_all([cond, ctx.value(node.input[1]), ctx.value(node.input[2])])
    return ctx.emit("where", tuple(ids))


# -- reductions ---------------------------------------------------------------------------------------------


def _axes(ctx: _Ctx, node: Any, a: Mapping[str, Any], rank: int) -> tuple[int, ...] | None:
    """The reduced axes (from the attribute or, opset >= 13/18, the second input), normalised; None = all."""
    if "axes" in a:
        raw = list(a["axes"])
    elif _input(node, 1):
        raw = [int(v) for v in np.asarray(ctx.consts(node.input[1], f"{node.op_type} axes")).reshape(-1)]
    else:
        return None
    if not raw:
        return None
    for v in raw:
        if not -rank <= v < rank:
            raise ctx.fail(f"axes {raw} out of range for rank {rank}")
    return tuple(sorted({v % rank for v in raw}))


@onnx_op("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")
def _reduce(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"axes": None, "keepdims": (0, 1), "noop_with_empty_axes": (0, 1)}, ctx)
    x = ctx.value(node.input[0])
    s = ctx.shape(x)
    axes = _axes(ctx, node, a, len(s))
    if axes is None:
        if a.get("noop_with_empty_axes", 0):
            return x
        axes = tuple(range(len(s)))
    keep = bool(a.get("keepdims", 1))
    rest = tuple(i for i in range(len(s)) if i not in axes)
    final = tuple(1 if i in axes else d for i, d in enumerate(s)) if keep else tuple(s[i] for i in rest)
    if not s:
        return x
    # the reduced axes moved last and merged: one fold over them in row-major order
    xt = ctx.emit("permute", (x,), perm=rest + axes) if rest + axes != tuple(range(len(s))) else x
    rows, n = _prod(s[i] for i in rest), _prod(s[i] for i in axes)
    if n == 0 and node.op_type in ("ReduceMax", "ReduceMin"):  # ONNX: the identity of the fold, -Inf / +Inf
        return ctx.const(np.full(final, -np.inf if node.op_type == "ReduceMax" else np.inf, np.float32))
    flat = ctx.reshape(xt, (1, rows, n))
    if node.op_type == "ReduceSum":
        y = ctx.emit("reduceSum", (flat,), axis=2, keepdim=True)
    elif node.op_type == "ReduceMean":
        y = ctx.emit("reduceMean", (flat,), axis=2, keepdim=True)
    elif node.op_type == "ReduceMax":
        y = ctx.emit("pool", (flat,), mode="max", kernel=(1, n), stride=(1, 1))
    else:
        neg = ctx.emit("neg", (flat,))
        y = ctx.emit("neg", (ctx.emit("pool", (neg,), mode="max", kernel=(1, n), stride=(1, 1)),))
    return ctx.reshape(y, final)


# -- data movement -------------------------------------------------------------------------------------------


@onnx_op("Flatten")
def _flatten(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"axis": None}, ctx)
    x = ctx.value(node.input[0])
    s = ctx.shape(x)
    rank = len(s)
    axis = int(a.get("axis", 1))
    if not -rank <= axis <= rank:
        raise ctx.fail(f"attribute axis={axis} is out of range [-{rank}, {rank}] for rank {rank}")
    ax = axis + rank if axis < 0 else axis  # ONNX: a negative axis counts from the back, -1 == rank - 1
    return ctx.reshape(x, (_prod(s[:ax]), _prod(s[ax:])))


@onnx_op("Reshape")
def _reshape(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"allowzero": (0, 1)}, ctx)
    x = ctx.value(node.input[0])
    want = [int(v) for v in np.asarray(ctx.consts(node.input[1], "Reshape shape")).reshape(-1)]
    s = ctx.shape(x)
    if not a.get("allowzero", 0):
        if any(v == 0 and i >= len(s) for i, v in enumerate(want)):
            raise ctx.fail(f"target shape {want}: a 0 copies an input dimension the input {list(s)} lacks")
        want = [s[i] if v == 0 else v for i, v in enumerate(want)]
    if want.count(-1) > 1 or any(v < -1 for v in want):
        raise ctx.fail(f"target shape {want} has more than one -1 or a negative dimension")
    if -1 in want:
        rest = _prod([v for v in want if v != -1])
        total = _prod(s)
        if rest == 0 or total % rest:
            raise ctx.fail(f"cannot reshape {list(s)} to {want}")
        want[want.index(-1)] = total // rest
    return ctx.reshape(x, tuple(want))


@onnx_op("Squeeze", "Unsqueeze")
def _squeeze(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"axes": None}, ctx)
    x = ctx.value(node.input[0])
    s = ctx.shape(x)
    if "axes" in a:
        raw = [int(v) for v in a["axes"]]
    elif _input(node, 1):
        raw = [int(v) for v in np.asarray(ctx.consts(node.input[1], f"{node.op_type} axes")).reshape(-1)]
    else:
        raw = None
    if node.op_type == "Squeeze":
        axes = [i for i, d in enumerate(s) if d == 1] if raw is None else [v % max(len(s), 1) for v in raw]
        if any(s[i] != 1 for i in axes):
            raise ctx.fail(f"Squeeze axes {raw} of {list(s)}: a squeezed axis is not of length 1")
        return ctx.reshape(x, tuple(d for i, d in enumerate(s) if i not in axes))
    if raw is None:
        raise ctx.fail("Unsqueeze needs axes")
    out_rank = len(s) + len(raw)
    axes = sorted(v % out_rank for v in raw)
    shape, it = [], iter(s)
    for i in range(out_rank):
        shape.append(1 if i in axes else next(it))
    return ctx.reshape(x, tuple(shape))


@onnx_op("Transpose")
def _transpose(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"perm": None}, ctx)
    x = ctx.value(node.input[0])
    perm = tuple(a.get("perm", tuple(reversed(range(len(ctx.shape(x)))))))
    return ctx.emit("permute", (x,), perm=perm)


@onnx_op("Concat")
def _concat(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"axis": None}, ctx)
    ids = [ctx.value(n) for n in node.input if n]
    ids = [i for i in ids if _prod(ctx.shape(i)) or len(ids) == 1]  # empty operands add nothing
    return ids[0] if len(ids) == 1 else ctx.emit("concat", tuple(ids), axis=int(a["axis"]))


@onnx_op("Expand")
def _expand(ctx: _Ctx, node: Any) -> int:
    _only(node, {}, ctx)
    x = ctx.value(node.input[0])
    want = tuple(int(v) for v in np.asarray(ctx.consts(node.input[1], "Expand shape")).reshape(-1))
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(ctx.shape(x), want))
    except ValueError:
        raise ctx.fail(f"Expand {list(ctx.shape(x))} to {list(want)}: shapes do not broadcast") from None
    return ctx.broadcast_to(x, shape)


def _slice_bounds(start: int, end: int, step: int, dim: int) -> range:
    return range(*slice(start, end, step).indices(dim))


@onnx_op("Slice")
def _slice(ctx: _Ctx, node: Any) -> int:
    _only(node, {}, ctx)
    x = ctx.value(node.input[0])
    s = ctx.shape(x)
    starts = [int(v) for v in np.asarray(ctx.consts(node.input[1], "Slice starts")).reshape(-1)]
    ends = [int(v) for v in np.asarray(ctx.consts(node.input[2], "Slice ends")).reshape(-1)]
    axes = (
        [int(v) for v in np.asarray(ctx.consts(node.input[3], "Slice axes")).reshape(-1)]
        if _input(node, 3)
        else list(range(len(starts)))
    )
    steps = (
        [int(v) for v in np.asarray(ctx.consts(node.input[4], "Slice steps")).reshape(-1)]
        if _input(node, 4)
        else [1] * len(starts)
    )
    for st, en, ax, sp in zip(starts, ends, axes, steps, strict=True):
        if not -len(s) <= ax < len(s):
            raise ctx.fail(f"Slice axis {ax} out of range for rank {len(s)}")
        if sp == 0:
            raise ctx.fail("Slice step 0")
        ax %= len(s)
        dim = ctx.shape(x)[ax]
        st = max(-(2**62), min(st, 2**62))
        en = max(-(2**62), min(en, 2**62))
        idx = _slice_bounds(st, en, sp, dim)
        if sp > 0:
            lo = idx.start if len(idx) else 0
            hi = idx[-1] + 1 if len(idx) else 0
            x = ctx.emit("slice", (x,), axis=ax, start=lo, stop=hi, step=sp) if (lo, hi, sp) != (0, dim, 1) else x
        else:  # a negative step: the picked positions one by one, concatenated (bit copies)
            parts = [ctx.emit("slice", (x,), axis=ax, start=i, stop=i + 1, step=1) for i in idx]
            if not parts:
                raise ctx.fail(f"Slice with step {sp} selects nothing on axis {ax}")
            x = parts[0] if len(parts) == 1 else ctx.emit("concat", tuple(parts), axis=ax)
    return x


@onnx_op("Split")
def _split(ctx: _Ctx, node: Any) -> tuple[int, ...]:
    a = _only(node, {"axis": None, "split": None, "num_outputs": None}, ctx)
    x = ctx.value(node.input[0])
    s = ctx.shape(x)
    ax = int(a.get("axis", 0)) % len(s)
    if "split" in a:
        sizes = [int(v) for v in a["split"]]
    elif _input(node, 1):
        sizes = [int(v) for v in np.asarray(ctx.consts(node.input[1], "Split split")).reshape(-1)]
    else:
        k = int(a.get("num_outputs", len(node.output)))
        each = -(-s[ax] // k)
        sizes = [min(each, s[ax] - i * each) for i in range(k)]
    if sum(sizes) != s[ax] or len(sizes) != len(node.output) or min(sizes) < 0:
        raise ctx.fail(f"split sizes {sizes} do not cover axis {ax} of {list(s)} in {len(node.output)} outputs")
    outs, start = [], 0
    for n in sizes:
        outs.append(ctx.emit("slice", (x,), axis=ax, start=start, stop=start + n, step=1))
        start += n
    return tuple(outs)


@onnx_op("Pad")
def _pad(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"mode": ("constant",)}, ctx)
    del a
    x = ctx.value(node.input[0])
    s = ctx.shape(x)
    pads = [int(v) for v in np.asarray(ctx.consts(node.input[1], "Pad pads")).reshape(-1)]
    value = 0.0
    if _input(node, 2):
        cv = np.asarray(ctx.consts(node.input[2], "Pad constant_value")).reshape(-1)
        value = float(cv[0]) if cv.size else 0.0
    axes = (
        [int(v) % len(s) for v in np.asarray(ctx.consts(node.input[3], "Pad axes")).reshape(-1)]
        if _input(node, 3)
        else list(range(len(s)))
    )
    if len(pads) != 2 * len(axes):
        raise ctx.fail(f"pads {pads} do not match {len(axes)} axes")
    for i, ax in enumerate(axes):
        lo, hi = pads[i], pads[len(axes) + i]
        dim = ctx.shape(x)[ax]
        x = _crop_axis(ctx, x, ax, max(-lo, 0), dim - max(-hi, 0))  # negative pads crop
        x = _pad_axis(ctx, x, ax, max(lo, 0), max(hi, 0), value)
    return x


@onnx_op("Gather")
def _gather(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"axis": None}, ctx)
    if node.input[1] in ctx.index_inputs:  # token ids into an embedding table: the IR's embedding op
        table = ctx.init(node.input[0], "Gather data indexed by a graph input")
        if table.ndim != 2 or int(a.get("axis", 0)) % 2 != 0:
            raise ctx.fail(f"Gather by graph-input indices needs a 2-d table on axis 0, got {list(table.shape)}")
        return ctx.emit("embedding", (ctx.ids[node.input[1]],), {"table": table}, dim=int(table.shape[1]))
    x = ctx.value(node.input[0])
    s = ctx.shape(x)
    ax = int(a.get("axis", 0))
    if not -len(s) <= ax < len(s):
        raise ctx.fail(f"attribute axis={ax} is out of range for rank {len(s)}")
    ax %= len(s)
    idx = np.asarray(ctx.consts(node.input[1], "Gather indices"), np.int64)
    flat = idx.reshape(-1)
    if ((flat < -s[ax]) | (flat >= s[ax])).any():
        raise ctx.fail(f"Gather index out of range for axis {ax} of length {s[ax]}")
    parts = [ctx.emit("slice", (x,), axis=ax, start=int(i) % s[ax], stop=int(i) % s[ax] + 1, step=1) for i in flat]
    if not parts:
        raise ctx.fail("Gather with no index")
    y = parts[0] if len(parts) == 1 else ctx.emit("concat", tuple(parts), axis=ax)
    return ctx.reshape(y, s[:ax] + idx.shape + s[ax + 1 :])


@onnx_op("Cast")
def _cast(ctx: _Ctx, node: Any) -> int:
    import onnx

    a = _only(node, {"to": None, "saturate": None, "round_mode": None}, ctx)
    if int(a["to"]) != onnx.TensorProto.FLOAT:
        raise ctx.fail(f"attribute to={a['to']}: only a cast to float32 of a float32 tensor is the identity")
    return ctx.value(node.input[0])


@onnx_op("Constant")
def _constant(ctx: _Ctx, node: Any) -> int | None:
    import onnx

    a = _only(
        node, {"value": None, "value_float": None, "value_floats": None, "value_int": None, "value_ints": None}, ctx
    )
    if "value" in a:
        arr = onnx.numpy_helper.to_array(a["value"])
    elif "value_float" in a or "value_floats" in a:
        arr = np.asarray(a.get("value_float", a.get("value_floats")), np.float32)
    else:
        arr = np.asarray(a.get("value_int", a.get("value_ints")), np.int64)
    ctx.inits[node.output[0]] = arr  # a constant: folded where it is read, a const node where it is data
    return None


# -- attention (ONNX opset 23+) -------------------------------------------------------------------------------


def _attention_bias(
    lq: int, lk: int, mask: np.ndarray | None, causal: bool, left: int, right: int, past: int, nonpad: np.ndarray | None
) -> np.ndarray:
    """ONNX Attention's additive bias (0 / -Inf and float mask values), as its definition builds it in float32: only
    exact operations (x + 0, x + -Inf), so the constant is the one ONNX's reference adds."""
    f32 = np.float32
    ninf = f32(-np.inf)
    bias = np.zeros((lq, lk), f32)
    if mask is not None and mask.shape[-1] < lk:
        pad = [(0, 0)] * (mask.ndim - 1) + [(0, lk - mask.shape[-1])]
        mask = np.pad(mask, pad, constant_values=False if mask.dtype == np.bool_ else ninf)
    i = np.arange(lq).reshape(lq, 1)
    j = np.arange(lk).reshape(1, lk)
    offset: Any = (nonpad.reshape(-1) - lq) if (past == 0 and nonpad is not None) else past

    def frontier(base: np.ndarray, allowed_of: Callable[[Any], np.ndarray]) -> np.ndarray:
        per_batch = np.ndim(offset) > 0
        allowed = allowed_of(np.reshape(offset, (-1, 1, 1)) if per_batch else int(offset))
        add = np.where(allowed, f32(0), ninf).astype(f32)
        return base + (add.reshape(add.shape[0], 1, lq, lk) if per_batch else add)

    if causal:
        if mask is not None and mask.dtype == np.bool_:
            mask = np.where(mask, f32(0), ninf).astype(f32)
        base = np.zeros((lq, lk), f32) if mask is None else mask.astype(f32)
        if left >= 0 or right >= 0:
            base = np.zeros((lq, lk), f32) + base
        bias = frontier(base, lambda off: j <= i + off)
    elif mask is not None:
        m = mask
        if m.dtype == np.bool_:
            m = (1 - m).astype(f32)
            m[m == 1] = ninf
        bias = bias + m.astype(f32)
    if left >= 0 or right >= 0:
        bias = np.zeros((lq, lk), f32) + bias

        def window(off: Any) -> np.ndarray:
            diff = (i + off) - j
            ok = np.ones_like(diff, dtype=bool)
            if left >= 0:
                ok &= diff <= left
            if right >= 0:
                ok &= -diff <= right
            return ok

        bias = frontier(bias, window)
    if nonpad is not None:
        keep = (np.arange(lk) < nonpad.reshape(-1, 1)).reshape(-1, 1, 1, lk)
        bias = bias + np.where(keep, f32(0), ninf).astype(f32)
    return bias.astype(f32)


@onnx_op("Attention")
def _attention_onnx(ctx: _Ctx, node: Any) -> tuple[int, ...]:
    # ONNX Attention composed from IR ops as ONNX defines it: q and k each scaled by sqrt(scale), q k^T (matmul),
    # softcap as c tanh(s / c), + the constant bias (masks, causal, window, padding), softmax, rows whose bias is all
    # -Inf set to 0 (where), @ v. GQA repeats each KV head for its group of query heads (broadcastTo).
    a = _only(
        node,
        {
            "is_causal": (0, 1),
            "kv_num_heads": None,
            "q_num_heads": None,
            "qk_matmul_output_mode": (0, 1, 2, 3),
            "scale": None,
            "softcap": None,
            "softmax_precision": (1, 11),  # float32 (or double: the IR's binary32 softmax is within its tolerance)
            "left_window_size": None,
            "right_window_size": None,
        },
        ctx,
    )
    q, k, v = (ctx.value(node.input[i]) for i in range(3))
    rank = len(ctx.shape(q))
    if rank not in (3, 4) or len(ctx.shape(k)) != rank or len(ctx.shape(v)) != rank:
        raise ctx.fail(f"Q, K, V must all be 3-d or all 4-d, got {[list(ctx.shape(t)) for t in (q, k, v)]}")
    if rank == 3:
        if "q_num_heads" not in a or "kv_num_heads" not in a:
            raise ctx.fail("3-d Q, K, V need the attributes q_num_heads and kv_num_heads")
        heads = (int(a["q_num_heads"]), int(a["kv_num_heads"]), int(a["kv_num_heads"]))
        four = []
        for t, h in zip((q, k, v), heads, strict=True):
            b, n, hid = ctx.shape(t)
            if h < 1 or hid % h:
                raise ctx.fail(f"hidden size {hid} is not a multiple of {h} heads")
            four.append(ctx.emit("permute", (ctx.reshape(t, (b, n, h, hid // h)),), perm=(0, 2, 1, 3)))
        q, k, v = four
    elif "q_num_heads" in a or "kv_num_heads" in a:
        raise ctx.fail("attributes q_num_heads/kv_num_heads are for 3-d inputs only")
    past = 0
    if _input(node, 4) or _input(node, 5):
        if not (_input(node, 4) and _input(node, 5)):
            raise ctx.fail("past_key and past_value must be given together")
        pk, pv = ctx.value(node.input[4]), ctx.value(node.input[5])
        past = ctx.shape(pk)[2]
        k = ctx.emit("concat", (pk, k), axis=2)
        v = ctx.emit("concat", (pv, v), axis=2)
    present_k, present_v = k, v
    bsz, hq, lq, d = ctx.shape(q)
    hkv, lk = ctx.shape(k)[1], ctx.shape(k)[2]
    if hq != hkv:
        if hkv < 1 or hq % hkv or ctx.shape(v)[1] != hkv:
            raise ctx.fail(f"{hq} query heads are not a multiple of {hkv} key/value heads")
        g = hq // hkv

        def rep(t: int) -> int:
            s = ctx.shape(t)
            t5 = ctx.broadcast_to(ctx.reshape(t, (s[0], s[1], 1) + s[2:]), (s[0], s[1], g) + s[2:])
            return ctx.reshape(t5, (s[0], hq) + s[2:])

        k, v = rep(k), rep(v)
    mask = None
    if _input(node, 3):
        if node.input[3] not in ctx.inits:
            raise ctx.fail(f"attn_mask {node.input[3]!r} computed from data: only a constant mask is imported")
        mask = np.asarray(ctx.inits[node.input[3]])
    nonpad = None
    if _input(node, 6):
        if past:
            raise ctx.fail("nonpad_kv_seqlen cannot be combined with past_key/past_value")
        nonpad = np.asarray(ctx.consts(node.input[6], "Attention nonpad_kv_seqlen"), np.int64)
    left, right = int(a.get("left_window_size", -1)), int(a.get("right_window_size", -1))
    try:
        bias = _attention_bias(lq, lk, mask, bool(a.get("is_causal", 0)), left, right, past, nonpad)
        full = np.broadcast_shapes(bias.shape, (bsz, hq, lq, lk))
    except ValueError as e:
        raise ctx.fail(f"attn_mask {list(mask.shape) if mask is not None else None} does not fit: {e}") from None
    scale = float(a["scale"]) if "scale" in a else 1 / np.sqrt(d)
    s2 = np.float32(np.sqrt(scale))
    qs = ctx.emit("mul_elem", tuple(ctx.broadcast_all([q, ctx.scalar(s2)])))
    ks = ctx.emit("mul_elem", tuple(ctx.broadcast_all([k, ctx.scalar(s2)])))
    qk = ctx.emit("matmul", (qs, ctx.emit("permute", (ks,), perm=(0, 1, 3, 2))))
    cap = a.get("softcap")
    if cap is not None and float(cap) > 0:
        c = ctx.broadcast_to(ctx.scalar(float(cap)), ctx.shape(qk))
        qk = ctx.emit("mul_elem", (ctx.emit("tanh", (ctx.emit("div", (qk, c)),)), c))
    with_bias = ctx.emit("add", (qk, ctx.broadcast_to(ctx.const(bias), tuple(full))))
    p = ctx.emit("softmax", (with_bias,), axis=-1)
    dead = np.broadcast_to(np.isneginf(np.max(bias, axis=-1, keepdims=True)), bias.shape[:-1] + (1,))
    if dead.any():  # a row with no allowed key is 0 (ONNX), where the IR's softmax of an all -Inf row is NaN
        cond = ctx.broadcast_to(ctx.const(dead.astype(np.float32)), tuple(full))
        p = ctx.emit("where", (cond, ctx.broadcast_to(ctx.scalar(0.0), tuple(full)), p))
    y = ctx.emit("matmul", (p, v))
    if rank == 3:
        yb, yh, yl, yd = ctx.shape(y)
        y = ctx.reshape(ctx.emit("permute", (y,), perm=(0, 2, 1, 3)), (yb, yl, yh * yd))
    mode = int(a.get("qk_matmul_output_mode", 0))
    qk_out = {0: qk, 1: qk, 2: with_bias, 3: p}[mode]
    return (y, present_k, present_v, qk_out)


# -- constant folding -------------------------------------------------------------------------------------

# Ops folded when every input is a constant: they only move or select values, or compute on integers (shapes,
# axes, indices), so evaluating them with ONNX's reference gives exactly the values the graph means. Float
# arithmetic on constants is not folded: it is imported (const nodes and IR ops) and means what the IR says.
_MOVE_OPS = frozenset(
    "Identity Reshape Transpose Concat Gather Slice Squeeze Unsqueeze Expand Split Tile Where ConstantOfShape "
    "Flatten Shape Size Equal Less Greater LessOrEqual GreaterOrEqual Not And Or IsNaN IsInf".split()
)  # (comparisons are exact on any type)
_INT_OPS = frozenset(
    "Add Sub Mul Div Neg Abs Equal Less Greater LessOrEqual GreaterOrEqual Not And Or Range Min Max Floor Ceil "
    "ReduceProd ReduceSum ReduceMax ReduceMin Cast Mod Sign Trilu".split()
)


def _fold(ctx: _Ctx, node: Any) -> bool:
    """Fold ``node`` into ctx.inits when it is Shape/Size of a tensor of static shape, or a foldable op of
    constants; return whether it was folded."""
    if node.op_type in ("Shape", "Size") and node.input[0] in ctx.ids:
        shape = ctx.shape(ctx.ids[node.input[0]])
        if node.op_type == "Size":
            ctx.inits[node.output[0]] = np.asarray(_prod(shape), np.int64)
            return True
        a = _attrs(node)
        lo, hi = int(a.get("start", 0)), int(a.get("end", len(shape)))
        ctx.inits[node.output[0]] = np.asarray(shape[slice(lo, hi)], np.int64)
        return True
    ins = [n for n in node.input if n]
    if node.op_type == "Constant" or not ins or not all(n in ctx.inits and n not in ctx.ids for n in ins):
        return False
    arrays = [np.asarray(ctx.inits[n]) for n in ins]
    exact = node.op_type in _MOVE_OPS or (node.op_type in _INT_OPS and all(a.dtype.kind in "iub" for a in arrays))
    if node.op_type == "Cast" and all(a.dtype.kind in "iub" for a in arrays):
        exact = True  # checked below: the cast result must convert back to the same integers
    if not exact:
        return False
    import onnx
    from onnx.reference import ReferenceEvaluator

    feed = {n: np.asarray(ctx.inits[n]) for n in ins}
    try:
        ev = ReferenceEvaluator(node, opsets={"": ctx.opset})
        outs = ev.run(None, feed)
    except Exception as e:  # noqa: BLE001 - ONNX's reference refusing the node is a refusal at this node
        raise ctx.fail(f"constant folding failed: {type(e).__name__}: {e}") from None
    for name, val in zip(node.output, outs, strict=False):
        val = np.asarray(val)
        if node.op_type == "Cast" and val.dtype.kind == "f":
            src = arrays[0]
            if not np.array_equal(val.astype(src.dtype), src):
                raise ctx.fail("constant Cast to a float type is not exact for these values")
        if name:
            ctx.inits[name] = val
    del onnx
    return True


# -- the import -----------------------------------------------------------------------------------------


INDEX_TYPES = (6, 7)  # onnx.TensorProto.INT32, INT64: token ids and other indices


def _static_shape(vi: Any) -> tuple[int, ...]:
    import onnx

    t = vi.type.tensor_type
    if t.elem_type != onnx.TensorProto.FLOAT and t.elem_type not in INDEX_TYPES:
        raise OnnxImportError(f"graph input {vi.name!r}: element type {t.elem_type} is neither float32 nor int32/int64")
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value"):
            raise OnnxImportError(f"graph input {vi.name!r}: dimension {d.dim_param or '?'} is not static")
        dims.append(int(d.dim_value))
    return tuple(dims)


def import_onnx(model: Any) -> Imported:
    """An ONNX model (ModelProto or path) as IR + Payload; OnnxImportError at the first node it cannot map."""
    import onnx

    if isinstance(model, str | Path):
        model = onnx.load(str(model))
    g = model.graph
    ctx = _Ctx()
    ctx.opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=13)
    for t in g.initializer:
        arr = onnx.numpy_helper.to_array(t)
        ctx.inits[t.name] = arr.astype(np.float32) if arr.dtype.kind == "f" else arr
        if arr.dtype.kind == "f" and arr.dtype != np.float32:
            raise OnnxImportError(f"initializer {t.name!r} is {arr.dtype}, not float32")
    for vi in g.input:
        if vi.name in ctx.inits:
            continue
        ctx.ids[vi.name] = ctx.b.add("input", (), _static_shape(vi))
        if vi.type.tensor_type.elem_type in INDEX_TYPES:
            ctx.index_inputs.add(vi.name)
    for i, node in enumerate(g.node):
        ctx.node, ctx.index = node, i
        if node.domain not in ("", "ai.onnx"):
            raise ctx.fail(f"operator domain {node.domain!r} is not supported")
        if _fold(ctx, node):
            continue
        if node.op_type in REFUSED:
            raise ctx.fail(f"unsupported operator: {REFUSED[node.op_type]}")
        fn = ONNX_OPS.get(node.op_type)
        if fn is None:
            raise ctx.fail(f"unsupported operator {node.op_type!r} (supported: {', '.join(supported_onnx_ops())})")
        got = fn(ctx, node)
        if got is None:
            continue
        for name, nid in zip(node.output, got if isinstance(got, tuple) else (got,), strict=False):
            if name:
                ctx.ids[name] = nid
    outs = []
    for vi in g.output:
        if vi.name not in ctx.ids and vi.name in ctx.inits and ctx.inits[vi.name].dtype == np.float32:
            ctx.ids[vi.name] = ctx.const(ctx.inits[vi.name])
        if vi.name not in ctx.ids:
            raise OnnxImportError(f"output {vi.name!r} is not computed by the graph")
        outs.append(ctx.ids[vi.name])
    if not outs:
        raise OnnxImportError("the model has no output")
    graph, payload = ctx.b.build()
    return Imported(graph, payload, outs[0], dict(ctx.ids), tuple(outs), dict(ctx.inits))
