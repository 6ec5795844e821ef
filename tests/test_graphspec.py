"""GraphSpec DSL, its lowering, ONNX import and the reference executor; planted bugs must be caught."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from falsification import graphspec_tests as T
from falsification.registry import FalsifyContext
from native import ir as nir
from obligations.core.device import cuda_available
from spec import rng as srng
from spec.ir import graphspec as gs
from spec.ir.checks import check_inferred_shapes, check_well_formed
from spec.ir.denote import denote, denote_all

CONTRACTS = Path(__file__).resolve().parent.parent / "contracts"
CUDA_OK, _WHY = cuda_available()
cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not CUDA_OK, reason=_WHY or "no CUDA device")


def _ctx(test: str, device: str = "host", seed: int = 1, **params: object) -> FalsifyContext:
    return FalsifyContext(device=device, profile="quick", seed=seed, item={"id": test, "test": test, "params": params})


def _u(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_mlp_lowers_to_the_seed_graph_and_meanings_agree() -> None:
    g = gs.Linear(4, 8) >> gs.ReLU() >> gs.Linear(8, 3)
    assert g.param_shapes == ((8, 4), (8,), (3, 8), (3,))
    p = gs.init_params(g)
    low = gs.lower(g, p)
    assert [(n.kind, n.parents) for n in low.graph.nodes] == [
        ("input", ()),
        ("linear", (0,)),
        ("relu", (1,)),
        ("linear", (2,)),
    ]
    assert set(low.payload.entries) == {1, 3}  # W, b keyed by the linear node ids, not extra parents
    assert not check_well_formed(low.graph) and not check_inferred_shapes(low.graph)
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    assert np.array_equal(_u(denote(low.graph, low.payload, x, low.output).value), _u(gs.spec(g)(p, x)))


def test_init_is_seeded_by_layer_occurrence() -> None:
    g = gs.Linear(3, 2) >> gs.Tanh() >> gs.Linear(2, 2)
    w0, b0, w1, b1 = gs.init_params(g)
    for arr, seed, fan_in in ((w0, 0, 3), (b0, 1, 3), (w1, 2, 2), (b1, 3, 2)):
        u = srng.uniform_reference(srng.bits_reference(seed, 0, arr.size)).view(np.float32)
        bound = np.float32(1 / np.sqrt(fan_in))
        assert np.array_equal(arr.reshape(-1), (u * np.float32(2) - np.float32(1)) * bound)
    assert all(np.array_equal(a, b) for a, b in zip(gs.init_params(g), gs.init_params(g), strict=True))


def test_parameter_abi_is_checked_and_split_canonically() -> None:
    g = gs.Linear(2, 3) >> gs.LayerNorm() >> gs.Linear(3, 1)
    assert [s.name for s in g.params] == ["weight", "bias", "weight", "bias", "weight", "bias"]
    p = gs.init_params(g)
    with pytest.raises(gs.GraphSpecParamError, match="takes 6 parameter tensors, got 5"):
        gs.spec(g)(p[:5], np.zeros(2, np.float32))
    bad = list(p)
    bad[2] = np.ones(4, np.float32)
    with pytest.raises(gs.GraphSpecParamError, match=r"parameter 2 \(weight\) must have shape \[3\], got \[4\]"):
        gs.spec(g)(bad, np.zeros(2, np.float32))


def test_shape_mismatch_names_both_shapes_and_the_position() -> None:
    with pytest.raises(gs.GraphSpecShapeError) as exc:
        gs.Linear(4, 8) >> gs.ReLU() >> gs.Linear(6, 3)
    msg = str(exc.value)
    assert "position 2" in msg and "[..., 6]" in msg and "[8]" in msg
    with pytest.raises(gs.GraphSpecShapeError, match=r"position 1 .*expects \[7\].*produces \[8\]"):
        gs.Linear(4, 8) >> gs.identity((7,))
    b = gs.DagBuilder((3,))
    h = b.apply(gs.Linear(3, 5), b.input)
    with pytest.raises(gs.GraphSpecShapeError, match=r"DAG step 1 .*\[5\] vs \[3\]"):
        b.add(h, b.input)


def test_conv_chain_and_residual_block() -> None:
    cnn = gs.Conv2d(1, 4, 3, padding=1, in_hw=(6, 6)) >> gs.ReLU() >> gs.MaxPool(2) >> gs.Flatten() >> gs.Linear(36, 5)
    assert cnn.out_shape == (5,)
    res = gs.Linear(4, 8) >> gs.residual(gs.identity((8,)) >> gs.Linear(8, 8) >> gs.Tanh()) >> gs.Linear(8, 2)
    low = gs.lower(res)
    assert [n.kind for n in low.graph.nodes] == ["input", "linear", "linear", "tanh", "add", "linear"]
    assert low.graph.nodes[4].parents == (1, 3)  # the skip (x) first, then the body
    for g, x in ((cnn, np.random.default_rng(0).standard_normal((1, 6, 6))), (res, np.arange(4) / 3)):
        p = gs.init_params(g)
        lw = gs.lower(g, p)
        assert np.array_equal(_u(denote(lw.graph, lw.payload, x, lw.output).value), _u(gs.spec(g)(p, x)))


@pytest.mark.parametrize("test", ["graphspec.lowering_meaning", "graphspec.shape_errors", "graphspec.onnx_meaning"])
def test_registered_tests_pass(test: str) -> None:
    if test.endswith("onnx_meaning"):
        pytest.importorskip("onnx")
    fn = getattr(T, test.split(".")[1])
    out = fn(_ctx(test))
    assert out.status == "passed", (out.reason, out.counterexample)


@pytest.mark.parametrize(
    "bug", ["lower_swapped_operands", "lower_dropped_bias", "lower_transposed_weight", "lower_shifted_params"]
)
def test_planted_lowering_bugs_are_caught(bug: str) -> None:
    out = T.lowering_meaning(_ctx("graphspec.lowering_meaning", lower=f"tests.planted.graphspec_bugs:{bug}"))
    assert out.status == "violated", bug
    assert "differs from spec" in out.reason and "replay" in out.counterexample


def test_onnx_unsupported_op_fails_at_its_node() -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from spec.ir.onnx import OnnxImportError, import_onnx

    vi = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])]
    for op, why in (("Elu", "unsupported operator 'Elu'"), ("Celu", "unsupported operator 'Celu'")):
        nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node(op, ["a", "x"], ["y"], name="bad")]
        with pytest.raises(OnnxImportError, match=why) as exc:
            import_onnx(helper.make_model(helper.make_graph(nodes, "g", vi, out)))
        assert (exc.value.index, exc.value.name, exc.value.op_type) == (1, "bad", op)
        assert str(exc.value).startswith(f"ONNX node 1 'bad' ({op})")
    ln = helper.make_node("LayerNormalization", ["x", "W"], ["y"], stash_type=0)
    model = helper.make_model(
        helper.make_graph(
            [ln],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
            [onnx.numpy_helper.from_array(np.ones(3, dtype=np.float32), "W")],
        )
    )
    with pytest.raises(OnnxImportError, match="attribute stash_type=0 is not supported"):
        import_onnx(model)


def test_onnx_round_trip_of_the_doc_models() -> None:
    pytest.importorskip("onnx")
    from falsification.graphspec_onnx import export
    from spec.ir.onnx import import_onnx

    for g in (
        gs.Linear(4, 8) >> gs.ReLU() >> gs.Linear(8, 3) >> gs.Softmax(),
        gs.Conv2d(2, 3, 3, padding=1, in_hw=(5, 5)) >> gs.ReLU() >> gs.AvgPool(2) >> gs.Flatten() >> gs.Linear(12, 2),
    ):
        p = gs.init_params(g)
        x = np.random.default_rng(1).standard_normal(g.in_shape).astype(np.float32)
        imp = import_onnx(export(g, p))
        assert np.array_equal(_u(denote(imp.graph, imp.payload, x, imp.output).value), _u(gs.spec(g)(p, x)))


def test_host_executor_runs_and_agrees_per_node() -> None:
    g = (
        gs.Conv2d(1, 2, 3, padding=1, in_hw=(4, 4))
        >> gs.Sigmoid()
        >> gs.MaxPool(2)
        >> gs.Flatten()
        >> gs.Linear(8, 4)
        >> gs.LayerNorm()
        >> gs.Softmax()
    )
    low = gs.lower(g)
    x = np.random.default_rng(2).standard_normal((1, 4, 4)).astype(np.float32)
    want = denote_all(low.graph, low.payload, x).value
    ex = nir.run_graph(low.graph, low.payload, x, "host")
    assert ex.device == "host" and ex.host(low.output).shape == g.out_shape
    for n in low.graph.nodes[1:]:
        parents = [want[p] for p in n.parents]
        got = np.asarray(nir.run_node(n, parents, low.payload.get(n.id), "host"))
        assert nir.agree(n, parents, low.payload.get(n.id), got, want[n.id]).all(), n


def test_executor_refuses_an_unsupported_op_at_its_node() -> None:
    from spec.ir.graph import GraphBuilder

    b = GraphBuilder()
    x = b.add("input", (), (2, 4))
    b.add("rope", (x,), (2, 4))
    graph, payload = b.build()
    with pytest.raises(nir.ExecError, match=r"node 1 \(rope\)"):
        nir.run_graph(graph, payload, np.zeros((2, 4), np.float32), "host")


def _bad_relu(node, a, args, entry, device):  # noqa: ANN001, ANN202
    xp = nir._xp(device)
    return xp.maximum(args[0], xp.float32(-0.0))  # BUG: relu(-0) is -0 and relu(NaN) keeps the payload


def _bad_tanh(node, a, args, entry, device):  # noqa: ANN001, ANN202
    return nir._kernel("sigmoid", *args, device=device)  # BUG: the wrong kernel


@pytest.mark.parametrize("op,bug", [("relu", _bad_relu), ("tanh", _bad_tanh)])
def test_planted_executor_bugs_are_caught(monkeypatch: pytest.MonkeyPatch, op: str, bug: object) -> None:
    monkeypatch.setitem(nir.EXECUTORS, op, bug)
    out = T.executor_agreement(_ctx("graphspec.executor_agreement", seed=3))
    assert out.status == "violated" and out.counterexample["op"] == op, out.reason


def test_ulp_bounds_are_the_elementwise_contracts() -> None:
    yaml = pytest.importorskip("ruamel.yaml")
    doc = yaml.YAML(typ="safe").load((CONTRACTS / "elementwise-float32-v1.yaml").read_text())
    stated = {
        it["params"]["op"]: it.get("tolerance")
        for it in doc["falsification"]
        if it.get("test") == "elementwise.max_ulp" and "tolerance" in it
    }
    for op, ulps in nir.ULP_BOUNDS.items():
        if op in stated:
            assert stated[op] == ulps, op
    assert {"exp", "tanh"} <= set(stated)


@cuda
@needs_cuda
def test_cuda_executor_agrees_with_the_denotation() -> None:
    out = T.executor_agreement(_ctx("graphspec.executor_agreement", device="cuda", seed=5))
    assert out.status == "passed", (out.reason, out.counterexample)


@cuda
@needs_cuda
def test_cuda_executor_runs_the_doc_models() -> None:
    g = gs.Linear(4, 8) >> gs.ReLU() >> gs.Linear(8, 3)
    low = gs.lower(g)
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    ex = nir.run_graph(low.graph, low.payload, x, "cuda")
    assert ex.device == "cuda"
    want = denote(low.graph, low.payload, x, low.output).value
    assert np.allclose(ex.host(low.output), want, rtol=1e-5, atol=1e-6)


# -- attention: the family's op in GraphSpec, the executor and the agreement rule ------------------------------


def _attention_model(causal: bool = True, lens: tuple[int, ...] | None = (0, 3)) -> gs.Graph:
    b = gs.DagBuilder((2, 1, 5, 3))
    q = b.concat(b.apply(gs.Linear(3, 3), b.input), b.apply(gs.Linear(3, 3), b.input), axis=1)  # 2 query heads
    k, v = b.apply(gs.Linear(3, 3), b.input), b.apply(gs.Linear(3, 3), b.input)  # per KV head (GQA)
    return b.build(b.attention(q, k, v, causal=causal, kv_lens=lens)).as_block("attention")


def test_attention_lowers_to_the_ir_op_and_the_host_executor_agrees_per_node() -> None:
    g = _attention_model()
    low = gs.lower(g)
    att = low.graph.nodes[low.output]
    assert att.kind == "attention" and len(att.parents) == 4 and g.out_shape == (2, 2, 5, 3)
    assert low.graph.nodes[att.parents[3]].kind == "const"  # kv_lens lowers to the op's 4th operand
    x = np.random.default_rng(4).standard_normal(g.in_shape).astype(np.float32)
    want = denote_all(low.graph, low.payload, x).value
    assert np.array_equal(_u(want[low.output]), _u(gs.spec(g)(gs.init_params(g), x)))
    assert not _u(want[low.output][0]).any() and _u(want[low.output][1]).any()  # kv_len 0: rows of +0
    ex = nir.run_graph(low.graph, low.payload, x, "host")
    for n in low.graph.nodes[1:]:
        parents = [want[p] for p in n.parents]
        got = np.asarray(nir.run_node(n, parents, low.payload.get(n.id), "host"))
        assert nir.agree(n, parents, low.payload.get(n.id), got, want[n.id]).all(), n
    assert ex.host(low.output).shape == g.out_shape


def test_attention_shape_errors_name_the_dag_step() -> None:
    b = gs.DagBuilder((1, 2, 4, 3))
    q = b.concat(b.input, b.input, b.input, axis=1)  # 6 heads
    k = b.concat(b.input, b.input, axis=1)  # 4 heads: 6 is not a multiple
    with pytest.raises(gs.GraphSpecShapeError, match=r"DAG step 2 \(attention.*not a positive multiple of heads_kv 4"):
        b.attention(q, k, k)
    with pytest.raises(gs.GraphSpecShapeError, match=r"kv_lens \[5\] must lie in \[0, 4\]"):
        b.attention(b.input, b.input, b.input, kv_lens=[5])


def _mask_after_softmax(node, a, args, entry, device):  # noqa: ANN001, ANN202
    # BUG: softmax over every key, then the mask applied to the probabilities (no renormalisation).
    from spec import attention as sa

    q, k, v = (np.asarray(x, np.float64) for x in args[:3])
    lens = None if len(args) < 4 else np.asarray(args[3]).astype(np.int64)
    p = sa.probs(q, k, scale=a["scale"]) * sa.mask(q.shape[0], q.shape[2], k.shape[2], a["causal"], lens)
    return np.einsum("bhij,bhjd->bhid", p, np.repeat(v, q.shape[1] // v.shape[1], axis=1)).astype(np.float32)


def test_planted_attention_executor_bug_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(nir.EXECUTORS, "attention", _mask_after_softmax)
    out = T.executor_agreement(_ctx("graphspec.executor_agreement", seed=3, families=["attention"]))
    assert out.status == "violated" and out.counterexample["op"] == "attention", out.reason
    assert out.counterexample["rule"] == "error-bound"


def test_attention_agreement_is_the_attention_contracts_bound() -> None:
    yaml = pytest.importorskip("ruamel.yaml")
    doc = yaml.YAML(typ="safe").load((CONTRACTS / "attention-v1.yaml").read_text())
    fwd = next(it for it in doc["falsification"] + doc["obligations"] if it["id"] == "ATT-FWD-bound")
    assert fwd["tolerance"].startswith("spec.attention.forward_bound (u_out = 2^-24")
    assert "spec.attention.forward_bound" in nir.AGREEMENT["attention"].statement
    assert "u_out = 2^-24" in nir.AGREEMENT["attention"].statement


@cuda
@needs_cuda
def test_cuda_executor_agrees_on_attention_models() -> None:
    out = T.executor_agreement(_ctx("graphspec.executor_agreement", device="cuda", seed=7, families=["attention"]))
    assert out.status == "passed" and out.evidence.details["by_rule"].get("error-bound"), out.reason


def test_onnx_attention_is_composed_and_a_data_mask_fails_at_its_node() -> None:
    """ONNX Attention imports as ONNX defines it (matmul, softmax, bias; not the IR's attention op, whose meaning is
    the family's float64 SDPA); a mask computed from data is refused at its node."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from spec.ir.onnx import OnnxImportError, import_onnx

    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 3, 4]) for n in "qkv"]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 4])]
    nodes = [helper.make_node("Relu", ["q"], ["a"], name="r"), helper.make_node("Attention", ["a", "k", "v"], ["y"])]
    opset = [helper.make_opsetid("", 23)]
    imp = import_onnx(helper.make_model(helper.make_graph(nodes, "g", vi, out), opset_imports=opset))
    kinds = {n.kind for n in imp.graph.nodes}
    assert "attention" not in kinds and {"matmul", "softmax"} <= kinds
    mask = [helper.make_tensor_value_info("m", TensorProto.FLOAT, [3, 3])]
    nodes[1] = helper.make_node("Attention", ["a", "k", "v", "m"], ["y"])
    with pytest.raises(OnnxImportError, match="attn_mask 'm' computed from data") as exc:
        import_onnx(helper.make_model(helper.make_graph(nodes, "g", vi + mask, out), opset_imports=opset))
    assert (exc.value.index, exc.value.op_type) == (1, "Attention")
