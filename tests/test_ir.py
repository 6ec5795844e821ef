"""The graph IR (spec/ir): checks, denotation, JSON form, rewrites, shape rules, and planted bugs caught."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from falsification import ir_tests as T
from falsification.registry import FalsifyContext
from obligations.check import check_contract
from obligations.core.symbolic import select, smax
from spec import rng as srng
from spec.ir import ops, rewrites
from spec.ir.checks import ERROR_KINDS, check_inferred_shapes, check_payload, check_shapes, check_well_formed, checklist
from spec.ir.denote import EVALUATORS, Ok, denote, denote_all
from spec.ir.graph import Graph, GraphBuilder, Node, Payload
from spec.ir.jsonform import from_json, load, schema, to_json

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "contracts" / "graph-ir-v1.yaml"
ISSUE_OPS = (
    "input const reshape flatten concat permute add sub mul_elem sqrt inv maxElem minElem broadcastTo "
    "reduceSum reduceMean sum linear conv2d relu tanh sigmoid softmax layernorm randUniform bernoulliMask "
    "matmul bmm silu gelu neg div pow rsqrt sin cos rmsnorm pool expand slice transpose embedding "
    "rope attention"
).split()


def _example() -> tuple[Graph, Payload]:
    b = GraphBuilder()
    x = b.add("input", (), (2,))
    c = b.add("const", (), (2,), params={"value": [0.25, 0.25]})
    b.add("add", (x, c), (2,))
    return b.build()


def _ctx(name: str, profile: str = "quick", **params: object) -> FalsifyContext:
    return FalsifyContext("host", profile, 0, {"id": "X", "test": name, "params": params})


# -- registry ---------------------------------------------------------------------------------------------


def test_every_issue_op_is_registered_with_rule_and_evaluator():
    for name in ISSUE_OPS:
        op = ops.get_op(name)
        assert op is not None, name
        assert callable(op.shape_rule) and op.meaning, name
        assert name in EVALUATORS, name
    assert set(EVALUATORS) == set(ops.OPS)


def test_max_elem_and_reduction_max_state_their_nan_rules():
    assert "NaN operand is dropped" in ops.OPS["maxElem"].meaning
    assert "NaN propagates" in ops.OPS["pool"].meaning
    b = GraphBuilder()
    x = b.add("input", (), (2,))
    y = b.add("input", (), (2,))
    b.add("maxElem", (x, y), (2,))
    g, p = b.build()
    nan = np.float32("nan")
    res = denote(g, p, [np.array([nan, 1], np.float32), np.array([2, nan], np.float32)])
    assert res.value.tolist() == [2.0, 1.0]


# -- golden examples ---------------------------------------------------------------------------------------


def test_seed_worked_example_bits():
    g, p = _example()
    assert check_well_formed(g) == [] and check_shapes(g) == [] and check_inferred_shapes(g) == []
    res = denote_all(g, p, np.array([0.6, -0.2], np.float32))
    assert [hex(v) for v in res.value[2].view(np.uint32)] == ["0x3f59999a", "0x3d4ccccc"]
    assert check_shapes is check_inferred_shapes
    assert T.worked_examples(_ctx("ir.worked_examples")).status.value == "passed"


def test_denote_is_entry_of_denote_all_and_errors_are_values():
    g, p = _example()
    x = np.array([1, 2], np.float32)
    assert np.array_equal(denote(g, p, x, 1).value, denote_all(g, p, x).value[1])
    assert denote(g, p, x, 7).kind == "output"
    assert denote(g, p.without(1), x).kind == "missing-payload" and denote(g, p.without(1), x).node == 1
    bad_in = denote(g, p, np.zeros(3, np.float32))
    assert bad_in.kind == "input" and bad_in.node == 0
    ill = Graph((g[0], g[1], g[2].replace(parents=(0, 2))))
    err = denote_all(ill, p, x)
    assert not isinstance(err, Ok) and err.kind == "forward-parent" and err.node == 2


# -- checks, each error naming node, op and shapes -----------------------------------------------------------


@pytest.mark.parametrize(
    "mutate, kind",
    [
        (lambda n: n.replace(parents=(0, 2)), "forward-parent"),
        (lambda n: n.replace(parents=(0, 9)), "parent-out-of-bounds"),
        (lambda n: n.replace(parents=(0, -1)), "parent-out-of-bounds"),
        (lambda n: n.replace(parents=(0,)), "arity"),
        (lambda n: n.replace(id=5), "id-mismatch"),
        (lambda n: n.replace(out_shape=(3,)), "shape-mismatch"),
        (lambda n: n.replace(kind="frobnicate"), "unknown-op"),
        (lambda n: n.replace(attrs={"axis": 0}), "attr"),
    ],
)
def test_each_defect_is_reported_at_its_node(mutate, kind):
    g, _ = _example()
    bad = Graph((g[0], g[1], mutate(g[2])))
    errs = check_inferred_shapes(bad)
    assert errs and errs[0].kind == kind and errs[0].node == 2, errs
    assert kind in ERROR_KINDS
    assert "node 2" in str(errs[0])


def test_shape_errors_name_both_shapes():
    b = GraphBuilder()
    x = b.add("input", (), (2,))
    y = b.add("input", (), (3,))
    b.add("add", (x, y), (2,))
    g, _ = b.build()
    err = check_shapes(g)[0]
    assert err.kind == "shape-rule" and err.op == "add" and err.parent_shapes == ((2,), (3,))
    assert "[2]" in str(err) and "[3]" in str(err)
    g2 = Graph((g[0], g[0].replace(id=1), g[2].replace(out_shape=(3,))))
    mis = check_shapes(g2)[0]
    assert (mis.declared, mis.inferred) == ((3,), (2,)) and "declared [3]" in str(mis) and "inferred [2]" in str(mis)


def test_first_error_is_the_lowest_node():
    g, _ = _example()
    bad = Graph((g[0], g[1].replace(id=4), g[2].replace(parents=(0, 2))))
    errs = check_well_formed(bad)
    assert [e.node for e in errs] == [1, 2]


def test_payload_checklist():
    g, p = _example()
    assert checklist(g, p.without(1), 2)["payload"][0].kind == "missing-payload"
    assert checklist(g, p.with_entry(1, value=np.zeros(3)), 2)["payload"][0].kind == "payload-shape"
    assert checklist(g, p, 9)["output"][0].kind == "output"
    lin = GraphBuilder()
    x = lin.add("input", (), (3,))
    lin.add("linear", (x,), (2,), params={"weight": np.zeros((2, 4)), "bias": np.zeros(2)}, out_features=2)
    g2, p2 = lin.build()
    assert check_payload(g2, p2)[0].kind == "payload-shape"
    assert check_well_formed(Graph((g2[0], g2[1].replace(parents=(0, 0)))))[0].kind == "arity"


def test_a_payload_copies_what_it_is_given_once_and_shares_what_payloads_froze():
    """Payloads are rebuilt at every rewrite: a tensor another payload froze is taken as it is (copying each one
    each time was 0.9 of a 1.3 s training step graph, #24); a caller's array is copied and frozen, its later
    writes unseen; the values (and uint32 bit patterns) are those given."""
    w = np.arange(6, dtype=np.float64).reshape(2, 3)
    bits = np.array([0x7FC00001, 0x80000000], np.uint32)
    p = Payload({1: {"value": w, "bits": bits}})
    w[0, 0], bits[0] = 99.0, 0
    a = p.tensor(1, "value")
    assert a.dtype == np.float32 and not a.flags.writeable and a[0, 0] == 0 and a.tolist()[1] == [3, 4, 5]
    assert p.tensor(1, "bits").view(np.uint32).tolist() == [0x7FC00001, 0x80000000]
    again = p.remap({1: 4}).with_entry(5, value=np.ones(2))
    assert again.tensor(4, "value") is a and again.tensor(4, "bits") is p.tensor(1, "bits")
    assert again.remap({4: 1}) == Payload(
        {1: {"value": np.arange(6.0).reshape(2, 3), "bits": np.array([0x7FC00001, 0x80000000], np.uint32)}}
    )
    mine = np.zeros(2, np.float32)
    mine.flags.writeable = False  # read-only, but the caller's: still copied
    assert Payload({0: {"value": mine}}).tensor(0, "value") is not mine


# -- randomness is explicit and replayable ------------------------------------------------------------------


def test_random_nodes_are_splitmix64_and_pure():
    b = GraphBuilder()
    b.add("randUniform", (), (2, 3), seed=7, counter=1)
    g, p = b.build()
    first = denote(g, p, []).value
    np.random.seed(123)
    random.seed(5)
    assert np.array_equal(first.view(np.uint32), denote(g, p, []).value.view(np.uint32))
    want = srng.uniform_reference(srng.bits_reference(7, 1, 6)).reshape(2, 3)
    assert np.array_equal(first.view(np.uint32), want)
    other = Graph((g[0].replace(attrs={"seed": 8, "counter": 1}),))
    assert not np.array_equal(first, denote(other, p, []).value)


# -- JSON form -----------------------------------------------------------------------------------------------


def test_json_round_trip_and_node_level_errors(tmp_path):
    g, p = _example()
    doc = to_json(g, p, [np.array([np.nan, 1], np.float32)], 2)
    back = from_json(json.loads(json.dumps(doc)))
    assert back.ok and back.graph == g and back.payload == p and back.output == 2
    assert np.isnan(back.inputs[0][0])
    doc["nodes"][1]["attrs"] = {"w": [[1.0, 2.0]]}  # a tensor in an attribute
    doc["nodes"][2]["parents"] = "0"
    errs = from_json(doc).errors
    assert any(e.startswith("node 1") for e in errs) and any(e.startswith("node 2") for e in errs)
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  nope")
    assert ":2:" in load(bad).errors[0]
    assert schema()["properties"]["format"]["const"] == "kc-graph-ir"


# -- rewrites ------------------------------------------------------------------------------------------------


def _rewrite_graph() -> tuple[Graph, Payload, np.ndarray]:
    b = GraphBuilder()
    x = b.add("input", (), (2, 3))
    c1 = b.add("const", (), (3,), params={"value": [1e8, 1, -1e8]})
    s = b.add("sum", (c1,), ())
    b.add("relu", (x,), (2, 3))  # dead
    r = b.add("reshape", (x,), (6,), shape=(6,))
    r2 = b.add("reshape", (r,), (3, 2), shape=(3, 2))
    t = b.add("transpose", (r2,), (2, 3), dim0=0, dim1=1)
    sb = b.add("broadcastTo", (s,), (2, 3), shape=(2, 3))
    b.add("add", (t, sb), (2, 3))
    g, p = b.build()
    return g, p, np.arange(6, dtype=np.float32).reshape(2, 3)


@pytest.mark.parametrize("name", sorted(rewrites.REWRITES))
def test_rewrites_preserve_denotation(name):
    g, p, x = _rewrite_graph()
    out = rewrites.REWRITES[name](g, p)
    assert check_inferred_shapes(out.graph) == [] and check_payload(out.graph, out.payload) == []
    before, after = denote_all(g, p, x).value, denote_all(out.graph, out.payload, x).value
    for o, n in out.mapping.items():
        assert np.array_equal(before[o].view(np.uint32), after[n].view(np.uint32)), (name, o)
    assert T.rewrite_failure(name, T.GraphCase(g, p, (x,))) is None


def test_simplify_shrinks():
    g, p, x = _rewrite_graph()
    out = rewrites.simplify(g, p)
    assert len(out.graph) < len(g)
    assert [n.kind for n in out.graph] == ["input", "reshape", "transpose", "const", "add"]


def test_planted_reshape_folding_bug_is_caught(monkeypatch):
    monkeypatch.setattr(rewrites, "RESHAPE_LIKE", ("reshape", "flatten", "transpose"))
    out = T.rewrite_preserves(_ctx("ir.rewrite_preserves", "full", rewrite="reshape-folding"))
    assert out.status.value == "violated" and "node" in out.counterexample["graph"]


def test_planted_dead_node_bug_is_caught(monkeypatch):
    monkeypatch.setattr(rewrites, "_live", lambda g, outs: set(outs) | set(g.input_ids()))
    g, p, x = _rewrite_graph()
    assert T.rewrite_failure("dead-node-elimination", T.GraphCase(g, p, (x,))) is not None
    out = T.rewrite_preserves(_ctx("ir.rewrite_preserves", rewrite="dead-node-elimination"))
    assert out.status.value == "violated"


def test_planted_constant_folding_bug_is_caught(monkeypatch):
    real = rewrites._fold_value

    def float64_sum(graph, payload, values, node):
        if node.kind == "sum":  # folds in float64 instead of the binary32 left fold
            v = values[node.parents[0]].view(np.float32).astype(np.float64).sum()
            return np.array(v, dtype=np.float32).view(np.uint32)
        return real(graph, payload, values, node)

    monkeypatch.setattr(rewrites, "_fold_value", float64_sum)
    g, p, x = _rewrite_graph()
    why = T.rewrite_failure("constant-folding", T.GraphCase(g, p, (x,)))
    assert why is not None and "changes value" in why


# -- checker soundness: the enumeration and its planted bugs ------------------------------------------------


def test_checker_enumeration_small():
    counts, cex = T.checker_enum_run(1, 2)
    assert cex is None and counts["accepted"] > 0 and counts["rejected"] > 0


def test_the_enumeration_shares_nodes_and_yields_every_graph_a_graph_at_a_time_build_would():
    # the nodes of a position are built once and shared (a third of IR-CHECK-enum's time was building them)
    import itertools

    def one_at_a_time(max_nodes, ssa_nodes):
        def node(i, op, ps, s):
            return Node(i, ps, op, s, {"shape": s} if op == "reshape" else {})

        for n in range(1, max_nodes + 1):
            for combo in itertools.product(T._choices(range(-1, max_nodes + 1)), repeat=n):
                yield Graph(tuple(node(i, *c) for i, c in enumerate(combo)))
        if ssa_nodes > max_nodes:
            for combo in itertools.product(*(T._choices(range(i)) for i in range(ssa_nodes))):
                yield Graph(tuple(node(i, *c) for i, c in enumerate(combo)))
        for n in (1, 2):
            for combo in itertools.product(*(T._choices(range(i)) for i in range(n))):
                base = [node(i, *c) for i, c in enumerate(combo)]
                for k, shift in itertools.product(range(n), (-1, 1, 2)):
                    yield Graph(tuple(nd.replace(id=nd.id + shift) if i == k else nd for i, nd in enumerate(base)))

    for bounds in ((1, 2), (1, 0)):
        assert list(T.enumerate_graphs(*bounds)) == list(one_at_a_time(*bounds)), bounds


@pytest.mark.parametrize(
    "dropped", ["forward-parent", "parent-out-of-bounds", "arity", "id-mismatch", "shape-mismatch"]
)
def test_planted_checker_bugs_are_caught(dropped):
    def buggy(g):
        return [e for e in check_inferred_shapes(g) if e.kind != dropped]

    counts, cex = T.checker_enum_run(2, 3, accepts=lambda g: not buggy(g))
    assert cex is not None and "oracle finds a defect" in cex["why"], dropped
    counts, miss = T.planted_run(3, check=buggy)
    assert miss is not None, dropped


# -- shape rules: the contract's proofs catch planted arithmetic bugs ----------------------------------------


def _items(ids: list[str]) -> dict[str, dict]:
    return {it["id"]: it for it in check_contract(CONTRACT, only=ids, device="host")["items"]}


def test_planted_conv_rule_bug_is_caught(monkeypatch):
    real = ops.conv_plan

    def off_by_one(size, kernel, stride, padding, dilation):
        plan = real(size, kernel, stride, padding, dilation)
        return {**plan, "out": plan["out"] + select(plan["valid"], 1, 0)}

    monkeypatch.setattr(ops, "conv_plan", off_by_one)
    items = _items(["IR-SHAPE-conv-z3", "IR-SHAPE-conv-enum"])
    assert {v["status"] for v in items.values()} == {"violated"}


def test_planted_slice_rule_bug_is_caught(monkeypatch):
    def floor_len(dim, start, stop, step):
        valid = (start >= 0) & (start <= stop) & (stop <= dim) & (step >= 1)
        out = select(valid, smax(stop - start, 0) // smax(step, 1), 0)
        return {"valid": valid, "out": out, "index": lambda j: start + j * step}

    monkeypatch.setattr(ops, "slice_plan", floor_len)
    assert {v["status"] for v in _items(["IR-SHAPE-slice-z3", "IR-SHAPE-slice-enum"]).values()} == {"violated"}


def test_planted_numel_overflow_is_caught(monkeypatch):
    monkeypatch.setattr(ops, "_mul_sat", lambda acc, d: select(acc * d <= ops.MAX_NUMEL, acc * d, ops.MAX_NUMEL + 1))
    assert _items(["IR-SHAPE-reshape-z3"])["IR-SHAPE-reshape-z3"]["status"] == "violated"


def test_planted_broadcast_rule_bug_is_caught(monkeypatch):
    def loose(src, dst):
        return {"ok": (src >= 0) & (dst >= 0), "out": dst, "source": lambda j: select(src == 1, 0, j)}

    monkeypatch.setattr(ops, "broadcast_plan", loose)
    assert _items(["IR-SHAPE-broadcast-z3"])["IR-SHAPE-broadcast-z3"]["status"] == "violated"


def test_shape_rules_use_the_proved_plans():
    b = GraphBuilder()
    x = b.add("input", (), (1, 5, 5))
    b.add("pool", (x,), (1, 2, 2), kernel=(2, 2), stride=(2, 2))
    g, _ = b.build()
    assert check_shapes(g) == []
    assert check_shapes(Graph((g[0], g[1].replace(attrs={"kernel": (2, 2), "stride": (2, 2), "padding": (2, 2)}))))
    assert ops.conv_plan(5, 3, 2, 1, 1)["out"] == 3 and ops.slice_plan(10, 1, 8, 3)["out"] == 3
    assert ops.numel(1 << 30, 1 << 30, 0) == ops.MAX_NUMEL + 1  # saturates on a prefix product


def test_nodes_hold_no_tensors_or_callables():
    with pytest.raises(TypeError):
        Node(0, (), "const", (2,), {"value": np.zeros((2, 2))})
    with pytest.raises(TypeError):
        Node(0, (), "const", (2,), {"f": len})


# -- kc graph ------------------------------------------------------------------------------------------------


def test_kc_graph_check_and_show(tmp_path, capsys):
    from obligations.cli import main
    from spec.ir.jsonform import dump

    g, p = _example()
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    dump(good, g, p, [np.array([0.6, -0.2], np.float32)], 2)
    dump(bad, Graph((g[0], g[1], g[2].replace(out_shape=(3,)))), p)
    assert main(["graph", "check", str(good)]) == 0
    assert main(["graph", "check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "node 2 (add): shape-mismatch" in out and "declared [3]" in out and "inferred [2]" in out
    assert main(["graph", "show", str(good), "--trace", "--bits"]) == 0
    out = capsys.readouterr().out
    assert "0x3f59999a, 0x3d4ccccc" in out
    assert main(["graph", "show", str(bad)]) == 1
    assert "! node 2" in capsys.readouterr().out
    (tmp_path / "broken.json").write_text("{")
    assert main(["graph", "check", str(tmp_path / "broken.json")]) == 2


@pytest.mark.parametrize("op", ["relu", "neg", "exp", "add"])
def test_rank0_elementwise_nodes_keep_their_shape_and_agree_with_the_denotation(op):
    from native.ir import run_graph
    from spec.ir import GraphBuilder, denote_all

    g = GraphBuilder()
    a, b = g.add("input", [], ()), g.add("input", [], ())
    g.add(op, [a, b] if op == "add" else [a], ())
    graph, payload = g.build()
    inputs = {a: np.float32(-1.5), b: np.float32(2.0)}
    got = run_graph(graph, payload, inputs, device="host").values[-1]
    want = denote_all(graph, payload, inputs).value[-1]
    assert got.shape == () and np.asarray(want).shape == ()
    assert np.asarray(got).tobytes() == np.asarray(want, dtype=np.float32).tobytes()


# Ops with a kernel family: (op, family, its spec function, its native entry point, attrs, shape, payload shapes)
_FAMILY_OPS = [
    (
        "conv2d",
        "conv",
        "conv",
        "conv2d",
        {"out_channels": 1, "kernel": [1, 1]},
        (1, 2, 2),
        {"weight": (1, 1, 1, 1), "bias": (1,)},
    ),
    ("pool", "conv", "max_pool2d", "max_pool2d", {"mode": "max", "kernel": [1, 1]}, (1, 2, 2), None),
    ("pool", "conv", "avg_pool2d", "avg_pool2d", {"mode": "avg", "kernel": [1, 1]}, (1, 2, 2), None),
    ("softmax", "norm", "softmax", "softmax", {"axis": -1}, (2, 2), None),
    ("layernorm", "norm", "layernorm", "layernorm", {"eps": 1e-5}, (2, 2), {"weight": (2,), "bias": (2,)}),
    ("rmsnorm", "norm", "rmsnorm", "rmsnorm", {"eps": 1e-6}, (2, 2), {"weight": (2,)}),
]
_OP_NAMES = ("kind", "family", "spec_fn", "native_fn", "attrs", "shape", "entry")


@pytest.mark.parametrize(_OP_NAMES, _FAMILY_OPS)
def test_ops_with_a_kernel_family_mean_that_familys_spec(
    monkeypatch, kind, family, spec_fn, native_fn, attrs, shape, entry
):
    """One meaning per op: the IR evaluates these ops by calling the family spec (a stand-in shows through)."""
    import importlib
    import sys

    from spec.ir.checks import node_attrs
    from spec.ir.graph import Attrs, Node
    from spec.ir.ops import get_op

    importlib.import_module("spec.ir.denote")
    denote_mod = sys.modules["spec.ir.denote"]
    spec_mod = importlib.import_module(f"spec.{family}")
    marker = np.full(((1,) if kind == "conv2d" else ()) + shape, 0x3F800000, dtype=np.uint32)  # conv: (N, CO, H, W)
    stand_in = (lambda *a, **k: (marker, None)) if spec_fn == "max_pool2d" else (lambda *a, **k: marker)
    monkeypatch.setattr(spec_mod, spec_fn, stand_in)
    node = Node(1, (0,), kind, shape, Attrs(attrs))
    payload = None if entry is None else {k: np.ones(v, np.float32) for k, v in entry.items()}
    x = np.zeros(shape, np.uint32)
    got = denote_mod.EVALUATORS[kind](node, node_attrs(node, get_op(kind)), [x], payload)
    assert got.shape == shape and np.array_equal(got.reshape(-1), marker.reshape(-1))


@pytest.mark.parametrize(_OP_NAMES, _FAMILY_OPS)
def test_the_reference_executor_runs_these_ops_on_the_familys_kernels(
    monkeypatch, kind, family, spec_fn, native_fn, attrs, shape, entry
):
    """One kernel per op: the executor's conv2d, pool, softmax, layernorm and rmsnorm are the family's native entry
    points (a stand-in shows through), not compositions of elementwise and fold kernels."""
    import importlib

    from native import ir as nir
    from spec.ir.graph import Attrs, Node

    native_mod = importlib.import_module(f"native.{family}")
    marker = np.full(shape, 7.0, np.float32)
    stand_in = (lambda *a, **k: (marker, None)) if native_fn == "max_pool2d" else (lambda *a, **k: marker)
    monkeypatch.setattr(native_mod, native_fn, stand_in)
    node = Node(1, (0,), kind, shape, Attrs(attrs))
    payload = None if entry is None else {k: np.ones(v, np.float32) for k, v in entry.items()}
    got = nir.run_node(node, [np.zeros(shape, np.float32)], payload, "host")
    assert np.array_equal(np.asarray(got), marker)


# -- attention: the attention family's op --------------------------------------------------------------------


def _attention_graph(q, k, lens=None, declared=None, **attrs):  # noqa: ANN001, ANN202
    b = GraphBuilder()
    ids = [b.add("input", (), q), b.add("input", (), k), b.add("input", (), k)]
    if lens is not None:
        ids.append(b.add("const", (), (len(lens),), params={"value": np.asarray(lens, np.float32)}))
    b.add("attention", tuple(ids), q if declared is None else declared, **attrs)
    return b.build()


def test_attention_means_the_attention_familys_spec(monkeypatch):
    """The IR's attention calls spec.attention.sdpa (a stand-in shows through), rounded once to binary32."""
    import spec.attention as sa

    seen = {}

    def stand_in(q, k, v, **kw):  # noqa: ANN001, ANN003, ANN202
        seen.update(kw, shapes=(q.shape, k.shape, v.shape))
        return np.full(q.shape, 1.0 + 2.0**-30)  # rounds to 1.0 in binary32

    monkeypatch.setattr(sa, "sdpa", stand_in)
    g, p = _attention_graph((1, 4, 2, 3), (1, 2, 5, 3), lens=[4], causal=True, scale=0.5)
    ins = [np.ones(s, np.float32) for s in ((1, 4, 2, 3), (1, 2, 5, 3), (1, 2, 5, 3))]
    got = denote(g, p, ins).value
    assert np.array_equal(got.view(np.uint32), np.full((1, 4, 2, 3), 0x3F800000, np.uint32))
    assert seen["causal"] is True and seen["scale"] == 0.5 and seen["kv_lens"].tolist() == [4]
    assert seen["shapes"] == ((1, 4, 2, 3), (1, 2, 5, 3), (1, 2, 5, 3))  # GQA: k, v as given, the spec groups


def test_attention_denotes_the_float64_sdpa_rounded_once_and_the_host_kernel_agrees():
    import native.ir as nir
    import spec.attention as sa

    rng = np.random.default_rng(5)
    for lk in (0, 3, 70):
        g, p = _attention_graph((2, 4, 3, 2), (2, 2, lk, 2), lens=[min(2, lk), lk], causal=True)
        ins = [rng.standard_normal(n.out_shape).astype(np.float32) for n in g.nodes[:3]]
        want = denote_all(g, p, ins).value
        if lk:
            ref = sa.sdpa(*(x.astype(np.float64) for x in ins), causal=True, kv_lens=np.array([min(2, lk), lk]))
            assert np.array_equal(want[-1], ref.astype(np.float32))
        else:
            assert not want[-1].view(np.uint32).any()  # no key: every row is fully masked, +0
        node = g.nodes[-1]
        got = np.asarray(nir.run_graph(g, p, ins, "host").host(node.id))
        assert nir.agree(node, [want[i] for i in node.parents], None, got, want[-1]).all()


@pytest.mark.parametrize(
    ("q", "k", "lens", "declared", "needle"),
    [
        ((1, 3, 2, 4), (1, 2, 2, 4), None, None, "heads_q 3 is not a positive multiple of heads_kv 2"),
        ((1, 2, 2, 129), (1, 1, 2, 129), None, None, "head dim 129 is not in 1..128"),
        ((2, 2, 4), (2, 2, 4), None, None, "attention needs q (B, Hq, Lq, D)"),
        ((1, 2, 2, 4), (2, 2, 2, 4), None, None, "with q's B and D"),
        ((2, 2, 2, 4), (2, 1, 3, 4), [1, 2, 3], None, "kv_lens operand must have shape [2]"),
        ((1, 2, 2, 4), (1, 1, 3, 4), None, (1, 2, 3, 4), "declared shape differs"),
    ],
)
def test_attention_shape_errors_name_the_node(q, k, lens, declared, needle):
    g, _ = _attention_graph(q, k, lens, declared)
    errs = check_inferred_shapes(g)
    node = len(g.nodes) - 1
    assert errs and errs[0].node == node and errs[0].op == "attention", errs
    assert needle in str(errs[0]) and f"node {node} (attention)" in str(errs[0])


def test_attention_arity_and_kv_lens_values_are_errors_at_the_node():
    b = GraphBuilder()
    x = b.add("input", (), (1, 1, 2, 2))
    b.add("attention", (x, x), (1, 1, 2, 2))
    errs = check_well_formed(b.build()[0])
    assert errs[0].kind == "arity" and "takes 3 or 4 parents, got 2" in str(errs[0])
    g, p = _attention_graph((1, 1, 2, 2), (1, 1, 3, 2), lens=[2.5])
    res = denote(g, p, [np.zeros((1, 1, 2, 2), np.float32)] + [np.zeros((1, 1, 3, 2), np.float32)] * 2)
    assert res.kind == "value" and res.node == 4 and "kv_lens value 2.5 is not an integer in [0, 3]" in str(res)


def test_attention_json_round_trip():
    g, p = _attention_graph((1, 2, 2, 3), (1, 1, 4, 3), lens=[3], causal=True, scale=0.25)
    back = from_json(to_json(g, p))
    assert not back.errors and back.graph == g and back.payload == p


def test_planted_attention_rule_that_forgets_gqa_grouping_is_caught(monkeypatch):
    real = ops.attention_plan

    def no_groups(batch, heads_q, heads_kv, seq_q, seq_k, head_dim):  # noqa: ANN001, ANN202
        plan = real(batch, heads_q, heads_kv, seq_q, seq_k, head_dim)
        # BUG: any heads_kv <= heads_q accepted (the "multiple of" condition dropped)
        valid = (batch >= 1) & (heads_kv >= 1) & (heads_q >= heads_kv) & (head_dim >= 1) & (head_dim <= 128)
        return {**plan, "valid": valid & (plan["grid_y"] <= 65535)}

    monkeypatch.setattr(ops, "attention_plan", no_groups)
    items = _items(["IR-SHAPE-attention-z3", "IR-SHAPE-attention-family"])
    assert {v["status"] for v in items.values()} == {"violated"}


def test_planted_attention_rule_that_reads_one_kv_head_per_query_head_is_caught(monkeypatch):
    real = ops.attention_plan

    def no_grouping(batch, heads_q, heads_kv, seq_q, seq_k, head_dim):  # noqa: ANN001, ANN202
        plan = real(batch, heads_q, heads_kv, seq_q, seq_k, head_dim)
        return {**plan, "kv_head": lambda h: h}  # BUG: query head h reads KV head h

    monkeypatch.setattr(ops, "attention_plan", no_grouping)
    assert _items(["IR-SHAPE-attention-z3"])["IR-SHAPE-attention-z3"]["status"] == "violated"


def test_attention_domain_is_the_familys():
    counts, cex = T.attention_domain_run()
    assert cex is None and counts["accepted"] > 100 and counts["cases"] > counts["accepted"]


def test_rope_denotes_its_rotation():
    # The tables were _approx's cos/sin of theta read as binary32 bit patterns (theta = 1.0 as the subnormal 1e-45:
    # cos 1, sin ~0, nearly no rotation); they are cos/sin of the float64 theta rounded once.
    from spec.ir.denote import floats, rope_tables
    from spec.ir.real import real_all

    c, s = rope_tables(3, 4, 10000.0)
    theta = np.arange(3)[:, None] * 10000.0 ** (-np.arange(2)[None, :] / 2)
    assert np.array_equal(floats(c), np.cos(theta).astype(np.float32))
    assert np.array_equal(floats(s), np.sin(theta).astype(np.float32))
    b = GraphBuilder()
    b.add("rope", (b.add("input", (), (2, 3, 4)),), (2, 3, 4))
    g, p = b.build()
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    vals, errs = real_all(g, p, [x.astype(np.float64)])
    assert np.all(np.abs(denote(g, p, x).value - vals[1]) <= errs[1])
