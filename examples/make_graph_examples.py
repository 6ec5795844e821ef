"""Write the graph examples of examples/README.md: an IR graph in its JSON form and a small ONNX model.

* ``mlp.graph.json``: Linear(4, 8) -> ReLU -> Linear(8, 3) -> Softmax as IR nodes, weights in the payload,
  with one input vector (``kc graph show --trace`` evaluates it without INPUT);
* ``tiny_cnn.onnx``: Conv(1 -> 2, 3x3, pad 1) -> Relu -> MaxPool 2x2 -> Flatten -> Gemm(8 -> 3), written with
  ``onnx.helper`` (opset 17), and ``tiny_cnn.input.json``, its input for ``--trace``.

Deterministic (SplitMix64 weights through GraphSpec's init_params, NumPy's seeded generator for the CNN):
``python3 examples/make_graph_examples.py [OUTDIR]`` rewrites the committed files byte for byte.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def write(out: Path = HERE) -> list[Path]:
    """Write the three example files into ``out``; returns their paths."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from spec.ir import graphspec as gs
    from spec.ir.jsonform import tensor_to_json, to_json

    g = gs.Linear(4, 8) >> gs.ReLU() >> gs.Linear(8, 3) >> gs.Softmax()
    low = gs.lower(g, gs.init_params(g))
    x = np.array([0.5, -1.0, 0.25, 2.0], dtype=np.float32)
    mlp = out / "mlp.graph.json"
    mlp.write_text(json.dumps(to_json(low.graph, low.payload, inputs=[x], output=low.output), indent=1) + "\n")

    rng = np.random.default_rng(26)
    w = (0.5 * rng.standard_normal((2, 1, 3, 3))).astype(np.float32)
    b = (0.1 * rng.standard_normal(2)).astype(np.float32)
    fc = (0.5 * rng.standard_normal((3, 8))).astype(np.float32)
    fcb = (0.1 * rng.standard_normal(3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (fc, "fc"), (fcb, "fcb"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kc-examples")
    model.ir_version = 8
    cnn = out / "tiny_cnn.onnx"
    onnx.save(model, str(cnn))
    xin = out / "tiny_cnn.input.json"
    image = np.linspace(-1.0, 1.0, 16, dtype=np.float32).reshape(1, 1, 4, 4)
    xin.write_text(json.dumps({"inputs": [tensor_to_json(image)]}, indent=1) + "\n")
    return [mlp, cnn, xin]


if __name__ == "__main__":
    for p in write(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(p)
