"""Export a GraphSpec model to ONNX with ``onnx.helper`` (for the import tests; no downloads).

The exporter works from the model's lowered IR graph, one ONNX node (or a few) per IR node: linear as
MatMul + Add (Gemm for 2-d inputs), conv2d and pool wrapped in Reshapes adding and dropping the batch axis
ONNX needs, flatten as Reshape. ``unsupported_at=i`` inserts an unsupported node at node position i (it
reads the graph input, so the model stays valid) for the importer's refusal to locate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from spec.ir import graphspec as gs
from spec.ir.graph import Node

__all__ = ["export", "EXPORTERS"]


class _Out:
    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.k = 0

    def name(self, stem: str) -> str:
        self.k += 1
        return f"{stem}_{self.k}"

    def init(self, arr: np.ndarray, stem: str) -> str:
        n = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), n))
        return n

    def node(self, op: str, ins: Sequence[str], **attrs: Any) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, list(ins), [out], name=out, **attrs))
        return out

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        return self.node("Reshape", [x, self.init(np.asarray(shape, dtype=np.int64), "shape")])


Exporter = Callable[[_Out, Node, list[str], Any, list[tuple[int, ...]]], str]


def _linear(o: _Out, n: Node, ins: list[str], entry: Any, shapes: list[tuple[int, ...]]) -> str:
    w, b = entry["weight"], entry["bias"]
    if len(shapes[0]) == 2:
        return o.node("Gemm", [ins[0], o.init(w, "W"), o.init(b, "b")], transB=1)
    return o.node("Add", [o.node("MatMul", [ins[0], o.init(np.ascontiguousarray(w.T), "WT")]), o.init(b, "b")])


def _batched(op: str, attrs: Callable[[Node], dict], params: bool) -> Exporter:
    def ex(o: _Out, n: Node, ins: list[str], entry: Any, shapes: list[tuple[int, ...]]) -> str:
        x = o.reshape(ins[0], (1,) + shapes[0]) if len(shapes[0]) == 3 else ins[0]
        extra = [o.init(entry["weight"], "W"), o.init(entry["bias"], "b")] if params else []
        y = o.node(op, [x, *extra], **attrs(n))
        return o.reshape(y, n.out_shape) if len(shapes[0]) == 3 else y

    return ex


def _pads(p: Sequence[int]) -> list[int]:
    return [int(p[0]), int(p[1]), int(p[0]), int(p[1])]


def _conv_attrs(n: Node) -> dict:
    a = n.attrs
    return {
        "kernel_shape": list(a["kernel"]),
        "strides": list(a["stride"]),
        "pads": _pads(a["padding"]),
        "dilations": list(a["dilation"]),
    }


def _pool_attrs(n: Node) -> dict:
    a = n.attrs
    out = {"kernel_shape": list(a["kernel"]), "strides": list(a["stride"]), "pads": _pads(a["padding"])}
    return out if a["mode"] == "max" else {**out, "count_include_pad": 1}


def _simple(op: str, **fixed: Any) -> Exporter:
    return lambda o, n, ins, entry, shapes: o.node(
        op, ins, **fixed, **{k: n.attrs[k] for k in ("axis",) if k in n.attrs}
    )


EXPORTERS: dict[str, Exporter] = {
    "linear": _linear,
    "relu": _simple("Relu"),
    "tanh": _simple("Tanh"),
    "sigmoid": _simple("Sigmoid"),
    "add": _simple("Add"),
    "sub": _simple("Sub"),
    "mul_elem": _simple("Mul"),
    "softmax": _simple("Softmax"),
    "concat": _simple("Concat"),
    "flatten": lambda o, n, ins, entry, shapes: o.reshape(ins[0], n.out_shape),
    "layernorm": lambda o, n, ins, entry, shapes: o.node(
        "LayerNormalization",
        [ins[0], o.init(entry["weight"], "scale"), o.init(entry["bias"], "B")],
        axis=-1,
        epsilon=float(n.attrs["eps"]),
    ),
    "conv2d": _batched("Conv", _conv_attrs, True),
    "pool": lambda o, n, ins, entry, shapes: _batched(
        "MaxPool" if n.attrs["mode"] == "max" else "AveragePool", _pool_attrs, False
    )(o, n, ins, entry, shapes),
}


def export(
    g: gs.Graph, params: Sequence[np.ndarray], unsupported_at: int | None = None, unsupported_op: str = "Elu"
) -> onnx.ModelProto:
    """The model as an ONNX ModelProto (opset 17), optionally with an unsupported node at ``unsupported_at``."""
    low = gs.lower(g, params)
    o = _Out()
    names: list[str] = []
    for n in low.graph.nodes:
        if n.kind == "input":
            names.append("x")
            continue
        names.append(
            EXPORTERS[n.kind](
                o,
                n,
                [names[p] for p in n.parents],
                low.payload.get(n.id),
                [low.graph.nodes[p].out_shape for p in n.parents],
            )
        )
    if unsupported_at is not None:
        pos = min(unsupported_at, len(o.nodes))
        o.nodes.insert(pos, helper.make_node(unsupported_op, ["x"], ["planted_out"], name="planted"))
    graph = helper.make_graph(
        o.nodes,
        "graphspec",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(g.in_shape))],
        [helper.make_tensor_value_info(names[low.output], TensorProto.FLOAT, list(g.out_shape))],
        o.inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
