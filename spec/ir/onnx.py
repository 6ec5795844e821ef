"""Import ONNX models (a stated op subset) into the graph IR plus its Payload.

``import_onnx(model)`` takes a ``onnx.ModelProto`` or a path. Every graph input needs a static float32
shape; initializers become payload tensors (Gemm / MatMul weights, Conv and LayerNormalization
parameters) or ``const`` nodes. Each ONNX node maps to IR nodes through one entry of
:data:`ONNX_OPS`; a node whose op is not there, or whose attributes ask for something the IR op does not
mean, raises :class:`OnnxImportError` naming the node (index, name, op type) and why: nothing is dropped
or approximated silently. :data:`REFUSED` lists ops refused on purpose because the closest IR op means
something else (ONNX ``Max`` propagates NaN where the IR's ``maxElem`` drops it).

Where a parameter is absent (Gemm without C, MatMul, Conv without B, LayerNormalization without B), the IR
node gets a bias of -0.0: ``v + (-0.0) == v`` bit for bit for every binary32 v (both zeros and NaN
included), so the added node changes no value. ONNX broadcasting of Add/Sub/Mul/Div operands is made
explicit with ``broadcastTo`` nodes (bit copies). Shapes come from the IR ops' own shape rules.

The ``onnx`` package is needed only to read models (``pip install onnx``, in the ``test`` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from spec.ir.checks import node_attrs
from spec.ir.graph import Graph, GraphBuilder, Payload
from spec.ir.ops import ShapeRuleError, get_op

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


class _Ctx:
    """Import state: the builder, tensor name -> IR node id, initializer arrays, and the node being imported."""

    def __init__(self) -> None:
        self.b = GraphBuilder()
        self.ids: dict[str, int] = {}
        self.inits: dict[str, np.ndarray] = {}
        self.node: Any = None
        self.index = 0
        self.opset = 13

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

    def value(self, name: str) -> int:
        """The IR node of tensor ``name`` (an initializer used as data becomes a const node)."""
        if name in self.ids:
            return self.ids[name]
        if name in self.inits:
            arr = self.inits[name].astype(np.float32)
            self.ids[name] = self.b.add("const", (), arr.shape, params={"value": arr})
            return self.ids[name]
        raise self.fail(f"input {name!r} is neither a graph input, an initializer nor an earlier node's output")

    def init(self, name: str, what: str) -> np.ndarray:
        """Initializer ``name`` as a float32 array (refused if the parameter is computed in the graph)."""
        if name not in self.inits:
            raise self.fail(f"{what} {name!r} must be an initializer (a constant parameter)")
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


def _neg_zero(n: int) -> np.ndarray:
    return np.full((n,), NEG_ZERO, dtype=np.float32)


# -- op mappings ----------------------------------------------------------------------------------------

OnnxOp = Callable[[_Ctx, Any], int]
ONNX_OPS: dict[str, OnnxOp] = {}
REFUSED: dict[str, str] = {
    "Max": "ONNX Max propagates NaN; the IR's maxElem is C fmaxf (drops a NaN operand): refused, not remapped",
    "Min": "ONNX Min propagates NaN; the IR's minElem is C fminf (drops a NaN operand): refused, not remapped",
    "Dropout": "dropout is randomness: the IR's is explicit (bernoulliMask with a seed), ONNX's is not seeded",
}


def onnx_op(*names: str) -> Callable[[OnnxOp], OnnxOp]:
    """Decorator: the importer of ONNX op types ``names``."""

    def deco(fn: OnnxOp) -> OnnxOp:
        for n in names:
            ONNX_OPS[n] = fn
        return fn

    return deco


def supported_onnx_ops() -> tuple[str, ...]:
    """The ONNX op types the importer maps."""
    return tuple(sorted(ONNX_OPS))


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
}


@onnx_op(*_UNARY)
def _unary(ctx: _Ctx, node: Any) -> int:
    _only(node, {}, ctx)
    return ctx.emit(_UNARY[node.op_type], (ctx.value(node.input[0]),))


@onnx_op("Identity")
def _identity(ctx: _Ctx, node: Any) -> int:
    _only(node, {}, ctx)
    return ctx.value(node.input[0])


_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul_elem", "Div": "div"}


@onnx_op(*_BINARY)
def _binary(ctx: _Ctx, node: Any) -> int:
    _only(node, {}, ctx)
    a, b = ctx.value(node.input[0]), ctx.value(node.input[1])
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(ctx.shape(a), ctx.shape(b)))
    except ValueError:
        raise ctx.fail(f"operand shapes {list(ctx.shape(a))} and {list(ctx.shape(b))} do not broadcast") from None
    a, b = (p if ctx.shape(p) == shape else ctx.emit("broadcastTo", (p,), shape=shape) for p in (a, b))
    return ctx.emit(_BINARY[node.op_type], (a, b))


@onnx_op("Gemm")
def _gemm(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"alpha": (1.0,), "beta": (1.0,), "transA": (0,), "transB": (0, 1)}, ctx)
    x = ctx.value(node.input[0])
    if len(ctx.shape(x)) != 2:
        raise ctx.fail(f"Gemm input A must be 2-D, got {list(ctx.shape(x))}")
    w = ctx.init(node.input[1], "Gemm B")
    w = w if a.get("transB", 0) else w.T
    c = ctx.init(node.input[2], "Gemm C") if len(node.input) > 2 and node.input[2] else _neg_zero(w.shape[0])
    if c.shape != (w.shape[0],):
        raise ctx.fail(f"Gemm C of shape {list(c.shape)}: only a bias vector of length N={w.shape[0]} is supported")
    return ctx.emit("linear", (x,), {"weight": np.ascontiguousarray(w), "bias": c}, out_features=int(w.shape[0]))


@onnx_op("MatMul")
def _matmul(ctx: _Ctx, node: Any) -> int:
    _only(node, {}, ctx)
    x = ctx.value(node.input[0])
    if node.input[1] in ctx.inits and ctx.inits[node.input[1]].ndim == 2 and len(ctx.shape(x)) >= 1:
        w = ctx.inits[node.input[1]].T  # x @ B == linear with W = B^T and a -0.0 bias (changes no value)
        return ctx.emit(
            "linear",
            (x,),
            {"weight": np.ascontiguousarray(w), "bias": _neg_zero(w.shape[0])},
            out_features=int(w.shape[0]),
        )
    return ctx.emit("matmul", (x, ctx.value(node.input[1])))


def _sym_pads(ctx: _Ctx, pads: Any, what: str) -> tuple[int, int]:
    p = tuple(int(v) for v in (pads or (0, 0, 0, 0)))
    if len(p) != 4 or p[0] != p[2] or p[1] != p[3]:
        raise ctx.fail(f"{what} pads {list(p)}: only symmetric 2-d padding (top == bottom, left == right)")
    return p[0], p[1]


@onnx_op("Conv")
def _conv(ctx: _Ctx, node: Any) -> int:
    a = _only(
        node,
        {
            "kernel_shape": None,
            "strides": None,
            "pads": None,
            "dilations": None,
            "group": (1,),
            "auto_pad": ("NOTSET",),
        },
        ctx,
    )
    x = ctx.value(node.input[0])
    w = ctx.init(node.input[1], "Conv W")
    if w.ndim != 4:
        raise ctx.fail(f"only 2-d convolution is supported (weight {list(w.shape)})")
    b = ctx.init(node.input[2], "Conv B") if len(node.input) > 2 and node.input[2] else _neg_zero(w.shape[0])
    kernel = tuple(int(v) for v in a.get("kernel_shape", w.shape[2:]))
    if kernel != tuple(w.shape[2:]):
        raise ctx.fail(f"kernel_shape {list(kernel)} differs from the weight's {list(w.shape[2:])}")
    return ctx.emit(
        "conv2d",
        (x,),
        {"weight": w, "bias": b},
        out_channels=int(w.shape[0]),
        kernel=kernel,
        stride=tuple(a.get("strides", (1, 1))),
        padding=_sym_pads(ctx, a.get("pads"), "Conv"),
        dilation=tuple(a.get("dilations", (1, 1))),
    )


@onnx_op("MaxPool", "AveragePool")
def _pool(ctx: _Ctx, node: Any) -> int:
    allowed: dict[str, Any] = {
        "kernel_shape": None,
        "strides": None,
        "pads": None,
        "auto_pad": ("NOTSET",),
        "ceil_mode": (0,),
    }
    if node.op_type == "MaxPool":
        allowed.update({"storage_order": (0,), "dilations": ((1, 1),)})
    a = _only(node, {**allowed, "count_include_pad": (0, 1)}, ctx)
    if len(node.output) > 1:
        raise ctx.fail("the Indices output of MaxPool is not supported")
    pad = _sym_pads(ctx, a.get("pads"), node.op_type)
    if node.op_type == "AveragePool" and any(pad) and not a.get("count_include_pad", 0):
        raise ctx.fail(
            "AveragePool with padding and count_include_pad=0 divides by the unpadded count; the IR's "
            "avg pool counts the padding (count_include_pad=1)"
        )
    kernel = tuple(int(v) for v in a["kernel_shape"])
    return ctx.emit(
        "pool",
        (ctx.value(node.input[0]),),
        mode="max" if node.op_type == "MaxPool" else "avg",
        kernel=kernel,
        stride=tuple(a.get("strides", (1, 1))),
        padding=pad,
    )


@onnx_op("Softmax")
def _softmax(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"axis": None}, ctx)
    x = ctx.value(node.input[0])
    rank = len(ctx.shape(x))
    axis = int(a.get("axis", -1))
    if ctx.opset < 13 and axis % max(rank, 1) != rank - 1:
        raise ctx.fail(
            f"opset {ctx.opset} Softmax coerces to 2-d at axis {axis}; only the last axis maps to the "
            "IR's softmax (use opset >= 13)"
        )
    return ctx.emit("softmax", (x,), axis=axis)


@onnx_op("Flatten")
def _flatten(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"axis": None}, ctx)
    x = ctx.value(node.input[0])
    s = ctx.shape(x)
    ax = int(a.get("axis", 1)) % (len(s) + 1)
    shape = (int(np.prod(s[:ax], dtype=np.int64)), int(np.prod(s[ax:], dtype=np.int64)))
    return ctx.emit("reshape", (x,), shape=shape)


@onnx_op("Reshape")
def _reshape(ctx: _Ctx, node: Any) -> int:
    _only(node, {"allowzero": (0,)}, ctx)
    x = ctx.value(node.input[0])
    if node.input[1] not in ctx.inits:
        raise ctx.fail("the target shape must be an initializer")
    want = [int(v) for v in ctx.inits[node.input[1]].reshape(-1)]
    s = ctx.shape(x)
    want = [s[i] if v == 0 else v for i, v in enumerate(want)]
    if want.count(-1) > 1:
        raise ctx.fail(f"target shape {want} has more than one -1")
    if -1 in want:
        rest = int(np.prod([v for v in want if v != -1], dtype=np.int64))
        total = int(np.prod(s, dtype=np.int64))
        if rest == 0 or total % rest:
            raise ctx.fail(f"cannot reshape {list(s)} to {want}")
        want[want.index(-1)] = total // rest
    return ctx.emit("reshape", (x,), shape=tuple(want))


@onnx_op("Transpose")
def _transpose(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"perm": None}, ctx)
    x = ctx.value(node.input[0])
    perm = tuple(a.get("perm", tuple(reversed(range(len(ctx.shape(x)))))))
    return ctx.emit("permute", (x,), perm=perm)


@onnx_op("Concat")
def _concat(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"axis": None}, ctx)
    return ctx.emit("concat", tuple(ctx.value(n) for n in node.input), axis=int(a["axis"]))


@onnx_op("LayerNormalization")
def _layernorm(ctx: _Ctx, node: Any) -> int:
    a = _only(node, {"axis": None, "epsilon": None, "stash_type": (1,)}, ctx)
    x = ctx.value(node.input[0])
    if int(a.get("axis", -1)) % len(ctx.shape(x)) != len(ctx.shape(x)) - 1:
        raise ctx.fail(f"LayerNormalization over axes from {a['axis']}: only the last axis is supported")
    if len(node.output) > 1 and any(node.output[1:]):
        raise ctx.fail("the Mean / InvStdDev outputs are not supported")
    w = ctx.init(node.input[1], "LayerNormalization Scale")
    b = (
        ctx.init(node.input[2], "LayerNormalization B")
        if len(node.input) > 2 and node.input[2]
        else _neg_zero(w.shape[-1])
    )
    return ctx.emit("layernorm", (x,), {"weight": w, "bias": b}, eps=float(np.float32(a.get("epsilon", 1e-5))))


@onnx_op("Constant")
def _constant(ctx: _Ctx, node: Any) -> int:
    import onnx

    a = _only(node, {"value": None}, ctx)
    arr = onnx.numpy_helper.to_array(a["value"])
    if arr.dtype != np.float32:
        ctx.inits[node.output[0]] = arr  # integer constants (shapes) stay initializer-like
        return -1
    return ctx.b.add("const", (), arr.shape, params={"value": arr})


# -- the import -----------------------------------------------------------------------------------------


def _static_shape(vi: Any) -> tuple[int, ...]:
    import onnx

    t = vi.type.tensor_type
    if t.elem_type != onnx.TensorProto.FLOAT:
        raise OnnxImportError(f"graph input {vi.name!r}: element type {t.elem_type} is not float32")
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
    for i, node in enumerate(g.node):
        ctx.node, ctx.index = node, i
        if node.domain not in ("", "ai.onnx"):
            raise ctx.fail(f"operator domain {node.domain!r} is not supported")
        if node.op_type in REFUSED:
            raise ctx.fail(f"unsupported operator: {REFUSED[node.op_type]}")
        fn = ONNX_OPS.get(node.op_type)
        if fn is None:
            raise ctx.fail(f"unsupported operator {node.op_type!r} (supported: {', '.join(supported_onnx_ops())})")
        nid = fn(ctx, node)
        if nid >= 0:
            ctx.ids[node.output[0]] = nid
    if len(g.output) != 1:
        raise OnnxImportError(f"the model has {len(g.output)} outputs; exactly one is supported")
    name = g.output[0].name
    if name not in ctx.ids:
        raise OnnxImportError(f"output {name!r} is not computed by the graph")
    graph, payload = ctx.b.build()
    return Imported(graph, payload, ctx.ids[name], dict(ctx.ids))
