"""Models exported from PyTorch (examples/export_torch_models.py): import, onnxruntime per node, CUDA executor.

The committed ``examples/models/*.onnx`` were exported on a GPU machine with torch (its version in
``examples/models/provenance.json``); CI imports them and checks every node of the IR denotation against
onnxruntime's CPU run of that node alone on the same inputs, by the op's stated tolerance
(``falsification.onnx_conformance.TOLERANCES``). Where torch is importable the export itself is re-run; where CUDA
is, the reference executor (``native.ir``) runs every IR node on the GPU against the denotation (``native.ir.agree``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from obligations.core.device import cuda_available

onnx = pytest.importorskip("onnx")

from falsification import onnx_conformance as C  # noqa: E402
from spec.ir.checks import check_inferred_shapes, check_payload, check_well_formed  # noqa: E402
from spec.ir.denote import denote_all  # noqa: E402
from spec.ir.onnx import import_onnx  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"
SHAPES = {"cnn": (1, 3, 16, 16), "decoder": (1, 8, 16)}
CUDA_OK, _WHY = cuda_available()


def _input(name: str) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(SHAPES[name]).astype(np.float32)  # = export script's input


def _ort_run(model: object, feed: dict) -> list:
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime (the test extra's ONNX peer) is not installed")
    if model.ir_version > 10:  # onnx writes its newest IR version; runtimes lag (1.30 reads up to 13): 10 suffices
        m = onnx.ModelProto()
        m.CopyFrom(model)
        m.ir_version = 10
        model = m
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # each node as written, unfused
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def _load(name: str) -> tuple[object, object, tuple]:
    path = MODELS / f"{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not there: run examples/export_torch_models.py where torch is installed")
    model = onnx.load(str(path))
    imp = import_onnx(model)
    res = denote_all(imp.graph, imp.payload, [_input(name)])
    assert hasattr(res, "value"), res
    return model, imp, res.value


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_exported_model_imports_and_every_node_agrees_with_onnxruntime(name: str) -> None:
    model, imp, values = _load(name)
    assert not check_well_formed(imp.graph) and not check_inferred_shapes(imp.graph)
    assert not check_payload(imp.graph, imp.payload)
    rows = C.node_by_node(model, imp, values, _ort_run)
    assert rows, "no node compared"
    bad = [r for r in rows if r.status == "mismatch"]
    assert not bad, bad
    # end to end: torch's own output (saved at export) and onnxruntime's, against the denotation
    y = np.asarray(values[imp.output], np.float64)
    ort_y = np.asarray(_ort_run(model, {model.graph.input[0].name: _input(name)})[0], np.float64)
    scale = float(np.abs(ort_y).max())
    assert np.abs(y - ort_y).max() <= 1e-5 * scale, (name, float(np.abs(y - ort_y).max()), scale)
    expected = MODELS / f"{name}.expected.npy"
    if expected.exists():
        assert np.abs(y - np.load(expected)).max() <= 1e-5 * scale


def test_provenance_names_the_torch_version() -> None:
    prov = MODELS / "provenance.json"
    if not prov.exists():
        pytest.skip("examples/models/provenance.json is not there (models not exported yet)")
    doc = json.loads(prov.read_text())
    assert doc["torch"] and doc["exporter"] in ("torchscript", "dynamo")


def test_graphspec_export_agrees_with_onnxruntime_node_by_node() -> None:
    """The same per-node check on a model exported by onnx.helper (runs wherever onnxruntime is installed)."""
    from falsification.graphspec_onnx import export
    from spec.ir import graphspec as gs

    g = gs.Conv2d(2, 3, 3, padding=1, in_hw=(6, 6)) >> gs.ReLU() >> gs.MaxPool(2) >> gs.Flatten() >> gs.Linear(27, 4)
    model = export(g, gs.init_params(g))
    imp = import_onnx(model)
    x = np.random.default_rng(3).standard_normal(g.in_shape).astype(np.float32)
    values = denote_all(imp.graph, imp.payload, [x]).value
    rows = C.node_by_node(model, imp, values, _ort_run)
    assert {r.op_type for r in rows} >= {"Conv", "Relu", "MaxPool", "MatMul", "Add"}
    assert all(r.status != "mismatch" for r in rows), rows


def test_a_wrong_denotation_is_caught_node_by_node() -> None:
    """Planted: one node's value perturbed by 64 ulp is a mismatch at that node."""
    from falsification.graphspec_onnx import export
    from spec.ir import graphspec as gs

    g = gs.Linear(4, 8) >> gs.ReLU() >> gs.Linear(8, 3)
    model = export(g, gs.init_params(g))
    imp = import_onnx(model)
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    values = list(denote_all(imp.graph, imp.payload, [x]).value)
    relu_out = model.graph.node[1].output[0]
    v = values[imp.tensors[relu_out]].copy()
    v.view(np.uint32)[np.argmax(v)] += 64
    values[imp.tensors[relu_out]] = v
    rows = C.node_by_node(model, imp, tuple(values), _ort_run)
    assert [r.status for r in rows if r.op_type == "Relu"] == ["mismatch"], rows


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_reexport_with_torch_imports_and_agrees(name: str, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed (CI: the committed exports are tested instead)")
    import sys

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import export_torch_models as ex
    finally:
        sys.path.pop(0)
    ex.export(tmp_path)
    imp = import_onnx(str(tmp_path / f"{name}.onnx"))
    y = np.asarray(denote_all(imp.graph, imp.payload, [_input(name)]).value[imp.output], np.float64)
    want = np.load(tmp_path / f"{name}.expected.npy").astype(np.float64)
    assert np.abs(y - want).max() <= 1e-5 * float(np.abs(want).max())


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_OK, reason=_WHY or "no CUDA device")
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_cuda_executor_agrees_with_the_denotation(name: str) -> None:
    """Every IR node of the imported model run by native.ir on the GPU from the denotation's parent values."""
    from native import ir as nir
    from obligations.core.device import to_host

    _, imp, values = _load(name)
    by_rule: dict[str, int] = {}
    for node in imp.graph.nodes:
        if node.kind == "input":
            continue
        parents = [np.asarray(values[p], np.float32) for p in node.parents]
        got = np.asarray(to_host(nir.run_node(node, parents, imp.payload.get(node.id), "cuda")), np.float32)
        want = np.asarray(values[node.id], np.float32)
        ok = nir.agree(node, parents, imp.payload.get(node.id), got, want)
        assert ok.all(), (name, node, nir.AGREEMENT[node.kind].statement)
        kind = nir.AGREEMENT[node.kind].kind
        by_rule[kind] = by_rule.get(kind, 0) + 1
    print(name, "cuda per-node agreement:", by_rule)
    run = nir.run_graph(imp.graph, imp.payload, [_input(name)], "cuda")
    assert run.host(imp.output).shape == imp.graph.nodes[imp.output].out_shape


def _erf_where_graph():  # type: ignore[no-untyped-def]
    from spec.ir.graph import GraphBuilder

    b = GraphBuilder()
    x = b.add("input", (), (4, 64))
    e = b.add("erf", (x,), (4, 64))
    rng = np.random.default_rng(5)
    cond = rng.integers(0, 2, (4, 64)).astype(np.float32)
    cond[0, :4] = (np.nan, -0.0, 0.0, 2.0)
    c = b.add("const", (), (4, 64), params={"value": cond})
    b.add("where", (c, x, e), (4, 64))
    g, p = b.build()
    x = (3 * rng.standard_normal((4, 64))).astype(np.float32)
    x[0, :6] = (np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30)
    return g, p, x


@pytest.mark.parametrize(
    "device",
    [
        "host",
        pytest.param(
            "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA_OK, reason=_WHY or "no CUDA device")]
        ),
    ],
)
def test_executor_erf_and_where_agree_with_the_denotation(device: str) -> None:
    """The two IR ops the ONNX import added, each node run from the denotation's parent values (as IR-EXEC-agreement
    does): where bit for bit, erf within 2 ulp (libdevice erff) on CUDA, bit for bit on the host."""
    from native import ir as nir
    from obligations.core.device import to_host

    g, p, x = _erf_where_graph()
    values = denote_all(g, p, [x]).value
    for node in g.nodes[1:]:
        parents = [np.asarray(values[q], np.float32) for q in node.parents]
        got = np.asarray(to_host(nir.run_node(node, parents, p.get(node.id), device)), np.float32)
        want = np.asarray(values[node.id], np.float32)
        assert nir.agree(node, parents, p.get(node.id), got, want).all(), (device, node.kind)
        if device == "host" and node.kind == "erf":  # the host executor is the denotation's real erf, rounded once
            finite = ~np.isnan(want)
            assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))


def test_planted_where_executor_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: a where executor testing cond > 0 (NaN and negative conditions pick b) disagrees at its node."""
    from native import ir as nir

    def bad(node, a, args, entry, device):  # type: ignore[no-untyped-def]
        return np.where(args[0] > 0, args[1], args[2])

    monkeypatch.setitem(nir.EXECUTORS, "where", bad)
    g, p, x = _erf_where_graph()
    values = denote_all(g, p, [x]).value
    node = g.nodes[3]
    parents = [np.asarray(values[q], np.float32) for q in node.parents]
    got = np.asarray(nir.run_node(node, parents, p.get(node.id), "host"), np.float32)
    assert not nir.agree(node, parents, None, got, np.asarray(values[3], np.float32)).all()
