"""ONNX's own node test cases through the importer and the denotation (falsification/onnx_conformance.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from spec.ir.graph import GraphBuilder

onnx = pytest.importorskip("onnx")

from falsification import onnx_conformance as C  # noqa: E402
from spec.ir.checks import check_inferred_shapes  # noqa: E402
from spec.ir.onnx import OnnxImportError, import_onnx  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "graphs.md"
BEGIN, END = "<!-- onnx-conformance:begin -->", "<!-- onnx-conformance:end -->"


@pytest.fixture(scope="module")
def results() -> list[C.CaseResult]:
    return C.run_conformance()


def test_conformance_target(results: list[C.CaseResult]) -> None:
    counts = C.summary(results)
    n = len(results)
    passed = counts["bitwise"] + counts["within"]
    assert n >= 250, counts  # the supported ops' float32 cases, not a handful
    assert counts["mismatch"] == 0 and counts["error"] == 0, [r for r in results if r.status in ("mismatch", "error")]
    assert passed >= 0.95 * n, counts
    for r in results:
        if r.status == "refused":  # every refusal names the node (index, op type) and what it refuses
            assert re.match(r"ONNX node \d+ '.*' \(\w+\): ", r.detail), r
            assert r.op_type in r.detail and len(r.detail.split(": ", 1)[1]) > 10, r


def test_docs_table_is_current(results: list[C.CaseResult]) -> None:
    text = DOC.read_text()
    assert BEGIN in text and END in text, "docs/graphs.md lacks the conformance table markers"
    body = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    want = C.table_markdown(results).strip()
    assert body == want, (
        "docs/graphs.md's ONNX conformance table is stale: regenerate it with "
        "`python3 -m falsification.onnx_conformance --write-docs`"
    )


def test_a_wrong_import_is_a_mismatch_not_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: Flatten's old axis % (rank + 1) rule is caught as a mismatch by the harness."""
    from spec.ir import onnx as imp

    def old_flatten(ctx, node):  # type: ignore[no-untyped-def]
        a = imp._only(node, {"axis": None}, ctx)
        x = ctx.value(node.input[0])
        s = ctx.shape(x)
        ax = int(a.get("axis", 1)) % (len(s) + 1)
        return ctx.reshape(x, (imp._prod(s[:ax]), imp._prod(s[ax:])))

    monkeypatch.setitem(imp.ONNX_OPS, "Flatten", old_flatten)
    got = {r.name: r.status for r in C.run_conformance(["Flatten"])}
    assert got["test_flatten_negative_axis1"] == "mismatch" and got["test_flatten_axis1"] == "bitwise", got


def _model(node, in_shape, out_shape, inits=()):  # type: ignore[no-untyped-def]
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
        list(inits),
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("axis,shape", [(-1, (24, 5)), (-2, (6, 20)), (-3, (2, 60)), (-4, (1, 120)), (4, (120, 1))])
def test_flatten_negative_axis_counts_from_the_back(axis: int, shape: tuple[int, int]) -> None:
    from onnx import helper

    imp = import_onnx(_model(helper.make_node("Flatten", ["x"], ["y"], axis=axis), (2, 3, 4, 5), shape))
    assert imp.graph.nodes[imp.output].out_shape == shape


def test_flatten_axis_out_of_range_names_the_attribute() -> None:
    from onnx import helper

    with pytest.raises(OnnxImportError, match=r"ONNX node 0 .*Flatten.*attribute axis=-5 is out of range"):
        import_onnx(_model(helper.make_node("Flatten", ["x"], ["y"], axis=-5), (2, 3, 4, 5), (1, 120)))


def test_pool_messages_say_what_is_wrong() -> None:
    b = GraphBuilder()
    x = b.add("input", (), (1, 3, 32))
    b.add("pool", (x,), (1, 3, 31), kernel=(2,))
    err = check_inferred_shapes(b.build()[0])[0]
    assert "kernel [2] must be one int or two" in err.message and "tuple index" not in err.message, err
    b = GraphBuilder()
    x = b.add("input", (), (1, 3, 28, 28))
    b.add("pool", (x,), (1, 3, 30, 30), kernel=(3, 3), padding=(2, 2))
    err = check_inferred_shapes(b.build()[0])[0]
    assert "padding 2 is more than half the kernel 3 (the rule: 2 * padding <= kernel)" in err.message, err


def test_one_d_and_large_pad_pools_import() -> None:
    from onnx import helper

    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2])
    imp = import_onnx(_model(node, (1, 3, 8), (1, 3, 7)))
    assert imp.graph.nodes[imp.output].out_shape == (1, 3, 7)
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[2, 2, 2, 2], count_include_pad=1)
    imp = import_onnx(_model(node, (1, 1, 5, 5), (1, 1, 7, 7)))
    assert imp.graph.nodes[imp.output].out_shape == (1, 1, 7, 7)


def test_shape_chain_folds_into_reshape() -> None:
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as exporters write x.view(B, -1): folded to constants."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]),
        helper.make_node("Concat", ["b1", "m1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, np.int64), "i0"),
        numpy_helper.from_array(np.array([0], np.int64), "ax"),
        numpy_helper.from_array(np.array([-1], np.int64), "m1"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])],
        inits,
    )
    imp = import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert [n.kind for n in imp.graph.nodes] == ["input", "reshape"]
    assert imp.graph.nodes[1].out_shape == (2, 12)


def test_reshape_shape_computed_from_a_graph_input_is_refused_at_its_node() -> None:
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
    )
    with pytest.raises(OnnxImportError, match=r"element type 7 is not float32|Reshape shape 's' must be a constant"):
        import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("KC_CHECK_ONNX_FIXTURE"),
    reason="set KC_CHECK_ONNX_FIXTURE=1 to rebuild ONNX's pool cases (~10 s) and compare them with the fixture",
)
def test_pool_fixture_equals_fresh_cases(tmp_path: Path) -> None:
    """The committed pool cases are the ones onnx builds now (slow: ONNX's pure-Python pool reference). The loader
    uses the fixture only when its recorded onnx version is the installed one, so a stale fixture is never read."""
    fixed = {c.name: c for c in C._fixture_cases() or []}
    assert fixed, "fixture missing or written by another onnx version"
    for mod in C.FIXTURE_MODULES:
        for c in C._build_module(mod):
            if C._float32_case(c):
                f = fixed.pop(c.name)
                assert f.model.SerializeToString() == c.model.SerializeToString(), c.name
                fresh = list(c.data_sets[0][0]) + list(c.data_sets[0][1])
                for a, b in zip(f.data_sets[0][0] + f.data_sets[0][1], fresh, strict=True):
                    assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8)), c.name
    assert not fixed, sorted(fixed)


def _ctx(test: str, **params: object):  # type: ignore[no-untyped-def]
    from falsification.registry import FalsifyContext

    return FalsifyContext("host", "quick", 0, {"id": "X", "test": test, "params": params})


def test_registered_items_pass_and_a_planted_window_rule_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from spec.ir import ops

    assert C.onnx_window_test(_ctx("ir.onnx_window")).status.value == "passed"
    assert C.onnx_conformance_test(_ctx("ir.onnx_conformance", ops=["Flatten", "Gather"])).status.value == "passed"
    real = ops.window_plan

    def no_decrement(size, kernel, stride, dilation, pad_begin, pad_end, ceil):  # type: ignore[no-untyped-def]
        p = real(size, kernel, stride, dilation, pad_begin, pad_end, False)
        rest = p["padded"] - p["span"]
        return {**p, "out": p["out"] + (1 if ceil and rest % stride else 0)}  # ceil without ONNX's last-window rule

    monkeypatch.setattr(ops, "window_plan", no_decrement)
    out = C.onnx_window_test(_ctx("ir.onnx_window"))
    assert out.status.value == "violated" and "ONNX's reference gives" in out.reason, out


def test_attention_tolerance_catches_a_planted_causal_frontier(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: ONNX Attention's causal frontier one key late (past + 1) is a mismatch, not within tolerance."""
    from spec.ir import onnx as imp

    real = imp._attention_bias

    def late(lq, lk, mask, causal, left, right, past, nonpad):  # type: ignore[no-untyped-def]
        return real(lq, lk, mask, causal, left, right, past + 1 if causal else past, nonpad)

    monkeypatch.setattr(imp, "_attention_bias", late)
    cases = ["test_attention_4d_causal", "test_attention_4d"]
    got = {r.name: r.status for r in C.run_conformance(["Attention"], names=cases)}
    assert got["test_attention_4d_causal"] == "mismatch" and got["test_attention_4d"] != "mismatch", got


def test_token_ids_index_an_embedding_table() -> None:
    """An int64 graph input feeding Gather on a constant 2-d table is the IR's embedding (the ids carried as binary32
    values); used as data, it is refused at its node."""
    from onnx import TensorProto, helper, numpy_helper

    from spec.ir.denote import denote

    table = np.arange(12, dtype=np.float32).reshape(4, 3) - 5.5
    g = helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 3])],
        [numpy_helper.from_array(table, "E")],
    )
    imp = import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert [n.kind for n in imp.graph.nodes] == ["input", "embedding", "relu"]
    ids = np.array([[3, 0, 2, 2, 1]])
    y = denote(imp.graph, imp.payload, [ids.astype(np.float32)], imp.output).value
    assert np.array_equal(y, np.maximum(table[ids], 0))
    g.node[1].input[0] = "ids"
    with pytest.raises(OnnxImportError, match=r"ONNX node 1 .*integer graph input 'ids' used as data"):
        import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_causal_mask_built_from_constants_folds_to_a_const() -> None:
    """Shape of an initializer -> Gather -> Range -> Unsqueeze x 2 -> Less -> Where(-inf, 0): exporters' mask
    arithmetic folds (exact: shapes, comparisons, selection) and only the Add of the data remains."""
    from onnx import TensorProto, helper, numpy_helper

    from spec.ir.denote import denote

    nodes = [
        helper.make_node("Shape", ["pos"], ["ps"]),
        helper.make_node("Gather", ["ps", "zero"], ["t"], axis=0),
        helper.make_node("Range", ["zero", "t", "one"], ["r"]),
        helper.make_node("Unsqueeze", ["r", "ax1"], ["ri"]),
        helper.make_node("Unsqueeze", ["r", "ax0"], ["rj"]),
        helper.make_node("Less", ["ri", "rj"], ["m"]),
        helper.make_node("Where", ["m", "ninf", "zf"], ["bias"]),
        helper.make_node("Add", ["x", "bias"], ["y"]),
    ]
    arrays = {
        "pos": np.zeros((3, 2), np.float32),
        "zero": np.array(0, np.int64),
        "one": np.array(1, np.int64),
        "ax1": np.array([1], np.int64),
        "ax0": np.array([0], np.int64),
        "ninf": np.array(-np.inf, np.float32),
        "zf": np.array(0, np.float32),
    }
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 3])],
        [numpy_helper.from_array(v, k) for k, v in arrays.items()],
    )
    imp = import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert [n.kind for n in imp.graph.nodes] == ["input", "const", "add"]
    y = denote(imp.graph, imp.payload, [np.ones((3, 3), np.float32)], imp.output).value
    assert np.array_equal(y, np.where(np.triu(np.ones((3, 3)), 1) > 0, -np.inf, 1).astype(np.float32))
