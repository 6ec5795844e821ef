"""Reverse mode over the graph IR (spec.ir.vjp): structure, refusals, the IR-VJP-* checks and their planted bugs."""

from __future__ import annotations

import numpy as np
import pytest

from falsification import ir_vjp_tests as vt
from falsification.ir_strategies import GraphCase
from falsification.registry import FalsifyContext, get_test
from spec.ir.checks import IRError, check_inferred_shapes, check_well_formed
from spec.ir.denote import denote_all
from spec.ir.graph import GraphBuilder
from spec.ir.ops import op_names
from spec.ir.vjp import REFUSED, VJP_RULES, Backward, vjp
from tests.contract_helpers import needs_cuda


def _run(test: str, **params: object) -> object:
    return get_test(test).run(FalsifyContext("host", "quick", 0, {"id": "X", "test": test, "params": params}))


def _mlp() -> GraphCase:
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.add("input", (), (2, 3))
    h = b.add(
        "linear",
        (x,),
        (2, 4),
        params={"weight": rng.uniform(-1, 1, (4, 3)), "bias": rng.uniform(-1, 1, 4)},
        out_features=4,
    )
    t = b.add("tanh", (h,), (2, 4))
    n = b.add("layernorm", (t,), (2, 4), params={"weight": rng.uniform(0.5, 1.5, 4), "bias": rng.uniform(-1, 1, 4)})
    s = b.add("softmax", (n,), (2, 4), axis=-1)
    r = b.add("add", (s, t), (2, 4))  # t fans out to layernorm and here
    b.add("reduceSum", (r,), (2,), axis=-1)
    g, p = b.build()
    return GraphCase(g, p, (rng.uniform(-1, 1, (2, 3)).astype(np.float32),))


def test_every_op_has_a_rule_or_a_refusal() -> None:
    leaves = {"input", "const", "randUniform", "bernoulliMask"}
    missing = [k for k in op_names() if k not in VJP_RULES and k not in REFUSED and k not in leaves]
    assert missing == []


def test_backward_graph_layout_and_fanout_order() -> None:
    b = GraphBuilder()
    x = b.add("input", (), (3,))
    b.add("mul_elem", (x, x), (3,))  # x read twice by one node: two contributions
    g, p = b.build()
    back = vjp(g, p)
    assert isinstance(back, Backward)
    assert back.graph.input_ids() == (0, 2) and back.cotangents == (2,) and back.wrt == (0,)
    assert not check_well_formed(back.graph) and not check_inferred_shapes(back.graph)
    last = back.graph[back.grads[0]]
    # the fold of the contributions in (consumer id, operand position) order: dy * x (operand 0) + dy * x (operand 1)
    assert last.kind == "add" and [back.graph[q].kind for q in last.parents] == ["mul_elem", "mul_elem"]
    assert back.graph[last.parents[0]].parents == (2, 0)  # operand 0's cotangent dy * (operand 1)
    xs, dy = np.array([1.5, -2.0, 0.25], np.float32), np.array([1.0, 0.5, -3.0], np.float32)
    out = denote_all(back.graph, back.payload, back.inputs([xs], [dy])).value[back.grads[0]]
    assert np.array_equal(out, 2 * xs * dy)


def test_sub_rule_and_unused_input_zero() -> None:
    b = GraphBuilder()
    x = b.add("input", (), (2,))
    b.add("input", (), (2,))
    b.add("sub", (x, x), (2,))
    g, p = b.build()
    back = vjp(g, p)
    dy = np.array([1.0, -2.0], np.float32)
    vals = denote_all(back.graph, back.payload, back.inputs([dy, dy], [dy])).value
    assert np.array_equal(vals[back.grads[0]], np.zeros(2)) and np.array_equal(vals[back.grads[1]], np.zeros(2))
    assert back.graph[back.grads[1]].kind == "const"  # y: nothing flows to it


def test_refused_at_its_node_only_on_the_path() -> None:
    b = GraphBuilder()
    x = b.add("input", (), (1, 2, 2))
    qkv = b.add("const", (), (1, 1, 2, 2), params={"value": np.ones((1, 1, 2, 2))})
    lens = b.add("relu", (b.add("const", (), (1,), params={"value": [1.0]}),), (1,))  # computed, from no input
    att = b.add("attention", (qkv, qkv, qkv, lens), (1, 1, 2, 2))
    b.add("add", (x, b.add("reshape", (att,), (1, 2, 2), shape=(1, 2, 2))), (1, 2, 2))
    g, p = b.build()
    assert isinstance(vjp(g, p), Backward)  # the attention reads no input: no cotangent asked of it
    assert isinstance(vjp(g, p, wrt=[1]), IRError)  # a const is no input
    err = vjp(_attention_graph(True).graph, _attention_graph(True).payload)
    assert isinstance(err, IRError) and err.kind == "no-vjp" and err.op == "attention" and "kv_lens" in str(err)


@pytest.mark.parametrize(
    ("kind", "hw", "k", "s", "p", "d"),
    [
        ("conv2d", (4, 5), 2, 2, 1, 1),  # stride leaves a row uncovered
        ("conv2d", (3, 3), 1, 1, 2, 1),  # padding beyond the span: the spread dy is cut
        ("conv2d", (5, 4), 2, 1, 0, 2),  # dilated
        ("pool", (5, 4), 2, 2, 1, 1),
        ("pool", (3, 3), 3, 1, 1, 1),
        ("max_pool", (5, 4), 2, 1, 1, 1),  # overlapping windows: a cell may win several
        ("max_pool", (4, 5), 3, 2, 1, 1),
    ],
)
def test_conv_and_pool_vjps_against_central_differences(kind: str, hw: tuple, k: int, s: int, p: int, d: int) -> None:
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    x = b.add("input", (), (2,) + hw)
    outs = tuple((n + 2 * p - d * (k - 1) - 1) // s + 1 for n in hw)
    win = {"kernel": (k, k), "stride": (s, s), "padding": (p, p)}
    if kind == "conv2d":
        params = {"weight": rng.uniform(-1, 1, (3, 2, k, k)), "bias": rng.uniform(-1, 1, 3)}
        b.add("conv2d", (x,), (3,) + outs, params=params, out_channels=3, dilation=(d, d), **win)
    else:
        b.add("pool", (x,), (2,) + outs, mode="max" if kind == "max_pool" else "avg", **win)
    g, pl = b.build()
    size = 2 * hw[0] * hw[1]  # distinct values 0.1 apart: no max pool window near a tie
    xs = ((rng.permutation(size) - size / 2) * 0.1).astype(np.float32).reshape((2,) + hw)
    case = GraphCase(g, pl, (xs,))
    status, why, n = vt.vjp_check(case, rng.uniform(-1, 1, g[1].out_shape).astype(np.float32))
    assert status == "checked" and why is None and n == 2 * hw[0] * hw[1]


def test_linear_matmul_against_numpy() -> None:
    rng = np.random.default_rng(0)
    a, bm = rng.uniform(-1, 1, (2, 3)).astype(np.float32), rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    b = GraphBuilder()
    x, y = b.add("input", (), (2, 3)), b.add("input", (), (3, 4))
    b.add("matmul", (x, y), (2, 4))
    g, p = b.build()
    back = vjp(g, p)
    dy = rng.uniform(-1, 1, (2, 4)).astype(np.float32)
    vals = denote_all(back.graph, back.payload, back.inputs([a, bm], [dy])).value
    np.testing.assert_allclose(vals[back.grads[0]], dy.astype(np.float64) @ bm.T, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(vals[back.grads[1]], a.T.astype(np.float64) @ dy, rtol=1e-6, atol=1e-6)


def test_mlp_against_central_differences() -> None:
    case = _mlp()
    dy = np.array([0.7, -1.2], np.float32)
    status, why, n = vt.vjp_check(case, dy)
    assert (status, why, n) == ("checked", None, 6)


def test_contract_items_pass_quick() -> None:
    for test in ("ir.vjp_fd", "ir.vjp_spec", "ir.vjp_exec"):
        o = _run(test)
        assert o.status.value == "passed", (test, o.reason)
        assert test != "ir.vjp_fd" or o.evidence.details["graphs_checked"] >= 5


@pytest.mark.parametrize("variant", vt.PLANTS)
def test_planted_vjp_bugs_are_caught(variant: str) -> None:
    extra = {"params": True, "templates": ["linear"], "max_examples": 20} if variant == "linear-weight-sign" else {}
    o = _run(
        "ir.vjp_fd", variant=variant, **{"templates": ["add", "sub", "mul_elem", "tanh"], "max_examples": 60, **extra}
    )
    assert o.status.value == "violated", o.reason
    assert "central difference" in o.reason


def test_executors_run_a_backward_graph_host() -> None:
    case = _mlp()
    assert vt.exec_check(case, np.array([0.7, -1.2], np.float32), "host") is None


@pytest.mark.cuda
@needs_cuda
def test_executors_run_a_backward_graph_cuda() -> None:
    case = _mlp()
    assert vt.exec_check(case, np.array([0.7, -1.2], np.float32), "cuda") is None
    o = get_test("ir.vjp_exec").run(
        FalsifyContext("cuda", "quick", 0, {"id": "X", "test": "ir.vjp_exec", "params": {}})
    )
    assert o.status.value == "passed", o.reason


def _attention_graph(lens_from_input: bool) -> GraphCase:
    rng = np.random.default_rng(2)
    b = GraphBuilder()
    q, k = b.add("input", (), (2, 4, 3, 2)), b.add("input", (), (2, 2, 3, 2))  # GQA: 2 query heads per KV head
    v = b.add("const", (), (2, 2, 3, 2), params={"value": rng.uniform(-1, 1, (2, 2, 3, 2))})
    if lens_from_input:
        lens = b.add("relu", (b.add("input", (), (2,)),), (2,))
    else:
        lens = b.add("const", (), (2,), params={"value": np.array([3.0, 1.0], np.float32)})
    b.add("attention", (q, k, v, lens), (2, 4, 3, 2), causal=True)
    g, p = b.build()
    ins = tuple(rng.uniform(-1, 1, g[i].out_shape).astype(np.float32) for i in g.input_ids())
    return GraphCase(g, p, ins)


def test_attention_vjp_against_central_differences() -> None:
    case = _attention_graph(False)
    dy = np.random.default_rng(4).uniform(-1, 1, (2, 4, 3, 2)).astype(np.float32)
    assert vt.vjp_check(case, dy)[1:] == (None, 48 + 24)  # every element of q and k


def test_parameter_cotangents_against_central_differences() -> None:
    case = _mlp()
    dy = np.array([0.7, -1.2], np.float32)
    back = vjp(case.graph, case.payload, params=True)
    assert [k for k, _ in back.param_grads] == [(1, "bias"), (1, "weight"), (3, "bias"), (3, "weight")]
    assert vt.vjp_check(case, dy, back) == ("checked", None, 6 + 4 + 12 + 4 + 4)
    rng = np.random.default_rng(5)
    b = GraphBuilder()
    x = b.add("input", (), (2, 2, 4, 3))
    params = {"weight": rng.uniform(-1, 1, (3, 2, 2, 2)), "bias": rng.uniform(-1, 1, 3)}
    c = b.add("conv2d", (x,), (2, 3, 3, 1), params=params, out_channels=3, kernel=(2, 2), stride=(2, 2), padding=(1, 0))
    b.add("rmsnorm", (c,), (2, 3, 3, 1), params={"weight": rng.uniform(0.5, 1.5, 1)})
    g, p = b.build()
    conv = GraphCase(g, p, (rng.uniform(-1, 1, (2, 2, 4, 3)).astype(np.float32),))
    dy = rng.uniform(-1, 1, (2, 3, 3, 1)).astype(np.float32)
    assert vt.vjp_check(conv, dy, params=True) == ("checked", None, 48 + 24 + 3 + 1)


def test_embedding_table_cotangent_is_a_scatter_add() -> None:
    b = GraphBuilder()
    ids = b.add("input", (), (4,))
    b.add("embedding", (ids,), (4, 2), params={"table": np.arange(6, dtype=np.float32).reshape(3, 2)}, dim=2)
    g, p = b.build()
    back = vjp(g, p, params=True)
    dy = np.array([[1, 2], [3, 4], [5, 6], [7, 8]], np.float32)
    table = denote_all(back.graph, back.payload, back.inputs([np.array([2, 0, 2, 1], np.float32)], [dy])).value
    got = dict(back.param_grads)
    assert np.array_equal(table[got[(1, "table")]], [[3, 4], [7, 8], [6, 8]])
    assert np.array_equal(table[back.grads[0]], np.zeros(4))  # indices: no cotangent


def test_backward_graph_is_a_citizen_json_and_checks() -> None:
    from spec.ir.checks import check_payload
    from spec.ir.jsonform import from_json, to_json

    case = _mlp()
    back = vjp(case.graph, case.payload, params=True)
    assert check_payload(back.graph, back.payload) == []
    loaded = from_json(to_json(back.graph, back.payload))
    assert loaded.errors == () and loaded.graph == back.graph and loaded.payload == back.payload


def test_the_float64_reference_takes_an_empty_softmax_axis() -> None:
    # IR-VJP-fd failed on an H200 (profile full, seed 0) with 'zero-size array to reduction operation maximum': a
    # drawn softmax over an axis of length 0. Its meaning is an empty array, with an empty bound.
    from spec.ir.real import real_all

    b = GraphBuilder()
    x = b.add("input", (), (2, 0))
    b.add("softmax", (x,), (2, 0), axis=-1)
    g, p = b.build()
    vals, errs = real_all(g, p, [np.zeros((2, 0))])
    assert vals[-1].shape == (2, 0) and errs[-1].shape == (2, 0)
