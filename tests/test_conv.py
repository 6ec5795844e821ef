"""conv-pool-v1: the contract holds on the host, planted bugs are caught by their items, the IR's ops mean the spec."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from falsification.registry import FalsifyContext, get_test
from native import conv as nc
from obligations.check import check_contract
from spec import conv as sc
from tests.contract_helpers import CONTRACTS, check_items, contract_variant, needs_cuda

CONTRACT = CONTRACTS / "conv-pool-v1.yaml"


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_contract_holds_on_host():
    res = check_contract(CONTRACT, device="host")
    bad = {
        it["id"]: (it["status"], it["reason"])
        for it in res["items"]
        if it["status"] in ("violated", "error", "unknown")
    }
    assert not bad, bad
    skipped = {it["id"]: it["reason"] for it in res["items"] if it["status"] == "skipped"}
    assert set(skipped) == {"CONV-SANITIZE", "CONV-CUDNN-bound"}, skipped  # compute-sanitizer, cuDNN: on cuda
    assert skipped["CONV-CUDNN-bound"].startswith("needs cuda and torch"), skipped
    assert not res["unchecked_entry_points"], res["unchecked_entry_points"]
    insensitive = [it["id"] for it in res["items"] if (it.get("evidence") or {}).get("order_insensitive")]
    assert not insensitive, insensitive


@pytest.mark.parametrize(
    ("item", "old", "new"),
    [
        ("CONV-FWD-bitwise", 'impl: "native.conv:conv"}', 'impl: "tests.planted.conv_bugs:conv_pad_off_by_one"}'),
        ("CONV-FWD-bitwise", 'impl: "native.conv:conv"}', 'impl: "tests.planted.conv_bugs:conv_stride_wrong_axis"}'),
        ("POOL-MAX-bitwise", 'impl: "native.conv:max_pool2d"}', 'impl: "tests.planted.conv_bugs:max_pool2d_last_tie"}'),
        (
            "POOL-AVG-bitwise",
            'impl: "native.conv:avg_pool2d"}',
            'impl: "tests.planted.conv_bugs:avg_pool2d_exclude_pad"}',
        ),
        (
            "POOL-SMOOTH-bound",
            'impl: "native.conv:smooth_max_pool2d"}',
            'impl: "tests.planted.conv_bugs:smooth_max_pool2d_counts_padding"}',
        ),
        (
            "POOL-SMOOTH-fd",
            'impl: "native.conv:smooth_max_pool2d_backward"}',
            'impl: "tests.planted.conv_bugs:smooth_max_pool2d_backward_unnormalised"}',
        ),
        (
            "CONV-IM2COL-layout",
            'impl: "native.conv:im2col"}',
            'impl: "tests.planted.conv_bugs:im2col_pad_off_by_one"}',
        ),
        (
            "CONV-IM2COL",
            'impl: "native.conv:conv_im2col"}',
            'impl: "tests.planted.conv_bugs:conv_im2col_drops_bias"}',
        ),
    ],
)
def test_planted_kernel_bug_is_caught(tmp_path, item, old, new):
    path = contract_variant(CONTRACT, tmp_path, old, new, count=-1)
    assert check_items(path, [item])[item]["status"] == "violated"


def test_tie_cases_put_several_maxima_and_nans_in_a_window_and_a_planted_last_nan_argmax_is_caught():
    def run(impl: str) -> object:
        item = {"id": "X", "test": "conv.pool_bitwise", "params": {"op": "max", "impl": impl, "max_examples": 4}}
        return get_test("conv.pool_bitwise").run(FalsifyContext("host", "quick", 0, item))

    good = run("native.conv:max_pool2d")
    assert good.status.value == "passed", good.reason
    assert good.evidence["windows_with_equal_maxima"] > 0 and good.evidence["windows_with_several_nans"] > 0
    bad = run("tests.planted.conv_bugs:max_pool2d_last_nan")
    assert bad.status.value == "violated" and "argmax" in str(bad.counterexample)


def test_planted_plan_off_by_one_is_caught(tmp_path):
    path = contract_variant(
        CONTRACT,
        tmp_path,
        "plan: native.conv:conv_axis_plan",
        "plan: tests.planted.conv_bugs:conv_axis_plan_off_by_one",
    )
    got = check_items(path, ["CONV-AXIS-size-z3", "CONV-AXIS-enum"])
    assert {k: v["status"] for k, v in got.items()} == {"CONV-AXIS-size-z3": "violated", "CONV-AXIS-enum": "violated"}


def test_planted_im2col_decode_is_caught(tmp_path):
    path = contract_variant(
        CONTRACT,
        tmp_path,
        "plan: native.conv:im2col2d_plan",
        "plan: tests.planted.conv_bugs:im2col2d_plan_kh_for_kw",
    )
    # Z3 answers unknown on this plan within its limits (nonlinear remainders): the enumeration refutes it.
    assert check_items(path, ["IM2COL-rows-enum"])["IM2COL-rows-enum"]["status"] == "violated"


def test_guard_refuses_undersized_and_invalid_calls():
    x = np.zeros((1, 2, 5, 5), np.float32)
    with pytest.raises(ValueError):
        nc.conv(x, np.zeros((2, 2, 7, 1), np.float32), device="host")  # window larger than the input
    with pytest.raises(ValueError):
        nc.conv(x, np.zeros((3, 1, 3, 3), np.float32), groups=2, device="host")  # 3 channels for 2 groups
    with pytest.raises(ValueError):
        nc.conv(x, np.zeros((2, 2, 3, 3), np.float32), np.zeros(1, np.float32), device="host")  # short bias
    with pytest.raises(ValueError):
        nc.max_pool2d(x, 2, 1, 2, device="host")  # padding over half the window
    plan = nc.conv2d_plan(1, 2, 5, 5, 2, 1, 3, 3, 1, 1, 0, 0, 1, 1)
    assert plan.accepts(int(plan.x_elems), int(plan.w_elems), 0, int(plan.y_elems))
    assert not plan.accepts(int(plan.x_elems) - 1, int(plan.w_elems), 0, int(plan.y_elems))


def test_ir_conv2d_and_pool_denote_the_spec():
    from spec.ir.denote import denote
    from spec.ir.graph import GraphBuilder

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    gb = GraphBuilder()
    i = gb.add("input", (), x.shape)
    c = gb.add(
        "conv2d",
        (i,),
        (2, 4, 3, 7),
        out_channels=4,
        kernel=(3, 2),
        stride=(2, 1),
        padding=(1, 1),
        dilation=(1, 2),
        params={"weight": w, "bias": b},
    )
    m = gb.add("pool", (i,), (2, 3, 3, 4), mode="max", kernel=(3, 2), stride=(2, 2), padding=(1, 1))
    a = gb.add("pool", (i,), (2, 3, 3, 4), mode="avg", kernel=(3, 2), stride=(2, 2), padding=(1, 1))
    g, payload = gb.build()
    conv_ir = denote(g, payload, x, c).value
    assert np.array_equal(_bits(conv_ir), sc.conv(_bits(x), _bits(w), _bits(b), (2, 1), (1, 1), (1, 2)))
    assert np.array_equal(_bits(denote(g, payload, x, m).value), sc.max_pool2d(_bits(x), (3, 2), (2, 2), (1, 1))[0])
    assert np.array_equal(_bits(denote(g, payload, x, a).value), sc.avg_pool2d(_bits(x), (3, 2), (2, 2), (1, 1)))
    assert np.array_equal(_bits(nc.conv2d(x, w, b, (2, 1), (1, 1), (1, 2), device="host")), _bits(conv_ir))


def test_smooth_max_pool_limits_and_gradient():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 5, 6)).astype(np.float32)
    m, _ = nc.max_pool2d(x, 3, 1, 1, device="host")
    for beta in (0.5, 4.0, 1024.0):
        y = sc.smooth_max_pool2d_f64(x, 3, 1, 1, beta)[0]
        taps, real, _ = sc.pool_windows_f64(x, 3, 1, 1)
        k = real.sum(-1)[None]
        assert np.all(y >= m - 1e-12) and np.all(y <= m + np.log(k) / beta + 1e-12)
    y = nc.smooth_max_pool2d(x, 3, 1, 1, beta=2.0, device="host")
    dy = np.ones_like(y)
    dx = nc.smooth_max_pool2d_backward(dy, x, 3, 1, 1, beta=2.0, device="host")
    p = sc.smooth_max_pool2d_f64(x, 3, 1, 1, 2.0)[3]
    assert np.allclose(p.sum(-1), 1.0) and abs(float(dx.sum()) - y.size) < 1e-4  # each window's softmax sums to 1


def test_cuda_launches_pass_every_kernel_parameter(monkeypatch):
    """Each CUDA launch passes exactly the parameters its kernel declares (a missing int faults on the device)."""
    import re

    import native.nvrtc as nv

    launches = []

    def fake_compile(source, name, route):
        head = source[source.index(f"void {name}(") :]
        params = head[head.index("(") + 1 : head.index(")")].split(",")

        def fn(grid, block, args):
            launches.append(name)
            assert len(args) == len(params), (name, len(args), len(params))
            for a, p in zip(args, params, strict=True):
                if "*" in p:
                    assert isinstance(a, np.ndarray), (name, p)
                elif re.search(r"\blong long\b", p):
                    assert isinstance(a, np.int64), (name, p, type(a))
                elif re.search(r"\bint\b", p):
                    assert isinstance(a, np.int32), (name, p, type(a))
                elif re.search(r"\bfloat\b", p):
                    assert isinstance(a, np.float32), (name, p, type(a))

        return fn

    monkeypatch.setattr(nv, "compile_function", fake_compile)
    monkeypatch.setattr(nc, "resolve_device", lambda device: "cuda")
    monkeypatch.setattr(nc, "array_module", lambda dev: np)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    w = rng.standard_normal((2, 2, 3, 3)).astype(np.float32)
    b = np.ones(2, np.float32)
    y = nc.conv(x, w, b, padding=1)
    nc.conv(x, w, None, padding=1)
    nc.conv_transpose(y, w, b, padding=1)
    nc.conv_weight_grad(x, y, (3, 3), padding=1)
    nc.bias_grad(y)
    nc.im2col(x, (3, 3), padding=1, bias_row=True)
    for fn in (nc.max_pool2d, nc.avg_pool2d, nc.smooth_max_pool2d):
        fn(x, 2, 1, 1)
    pooled = np.zeros((1, 2, 6, 6), np.float32)
    nc.max_pool2d_backward(pooled, np.zeros((1, 2, 6, 6), np.int64), x.shape, 2, 1, 1)
    nc.avg_pool2d_backward(pooled, x.shape, 2, 1, 1)
    nc.smooth_max_pool2d_backward(pooled, x, 2, 1, 1)
    assert len(set(launches)) == 11, sorted(set(launches))


@pytest.mark.skipif(
    shutil.which("g++") is None, reason="needs g++ (with libasan) to compile the CUDA sources for the host"
)
def test_cuda_sources_match_the_host_path_under_sanitizers():
    """The CUDA text, compiled as C++ with ASan/UBSan and run one thread at a time, equals the host path."""
    from tests.host_cuda import run_under_asan

    res = run_under_asan("conv")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "conv: 0 mismatches" in res.stdout


@needs_cuda
@pytest.mark.cuda
def test_contract_holds_on_cuda():
    from ruamel.yaml import YAML

    data = YAML(typ="safe").load(CONTRACT.read_text())
    items = data["obligations"] + data.get("falsification", [])
    # compute-sanitizer items are evidenced by `kc check --device cuda` itself (each tool is a fresh process)
    res = check_contract(CONTRACT, device="cuda", only=[it["id"] for it in items if it.get("method") != "sanitize"])
    bad = {
        it["id"]: (it["status"], it.get("reason"))
        for it in res["items"]
        if it["status"] in ("violated", "error", "unknown")
    }
    assert not bad, bad


def test_cudnn_bound_check_runs_the_axis_witnesses_and_refusals(tmp_path):
    """CONV-CUDNN-bound's check (conv.error_bound's, with CONV-AXIS-REGIMES' witnesses) on the host, through the
    direct kernel in cuDNN's place: every witness run, the refused window refused by the guard."""
    path = contract_variant(CONTRACT, tmp_path, "test: conv.cudnn_bound", "test: conv.error_bound")
    path.write_text(
        path.read_text().replace('impl: "native.cudnn:conv"}', 'impl: "native.conv:conv", max_examples: 5}')
    )
    got = check_items(path, ["CONV-AXIS-REGIMES", "CONV-CUDNN-bound"])["CONV-CUDNN-bound"]
    assert got["status"] == "passed", got["reason"]
    ev = got["evidence"]
    assert ev["worst_error_over_bound"] <= 1.0
    assert not ev["boundaries_unreached"] and any(k.endswith("@reject") for k in ev["boundaries_reached"]), ev
    assert ev["regimes_reached"], sorted(ev)


@needs_cuda
@pytest.mark.cuda
def test_cudnn_conv_within_its_bound_and_a_flipped_filter_is_caught(tmp_path):
    from native.cudnn import cudnn_missing

    if cudnn_missing():
        pytest.skip(cudnn_missing())
    assert check_items(CONTRACT, ["CONV-AXIS-REGIMES", "CONV-CUDNN-bound"], "cuda")["CONV-CUDNN-bound"]["status"] == (
        "passed"
    )
    path = contract_variant(
        CONTRACT, tmp_path, 'impl: "native.cudnn:conv"}', 'impl: "tests.planted.conv_bugs:cudnn_flipped_filter"}'
    )
    assert check_items(path, ["CONV-AXIS-REGIMES", "CONV-CUDNN-bound"], "cuda")["CONV-CUDNN-bound"]["status"] == (
        "violated"
    )


def test_the_step_path_of_the_cudnn_check_builds_the_calls_graph_and_refuses_what_the_guard_refuses():
    """conv.cudnn_bound's second half runs each call as a one-conv2d program (rank 1 as a unit H axis): on the host
    the cudnn step is the direct kernel's host path, so it must equal native.conv bit for bit."""
    from falsification.conv_tests import ConvCase, _operands, fusion_step_conv

    for axes in (((5, 3, 2, 1, 1, 0),), ((4, 2, 1, 0, 2, 0), (6, 3, 1, 1, 1, 0)), ((3, 3, 1, 0, 1, 0),)):
        for bias in (0, 1):
            c = ConvCase(7, 0, 2, 1, 2, 3, bias, axes)
            d, win = _operands(c, np, "fwd").dev, c.window()
            b = d["b"] if bias else None
            got = fusion_step_conv(d["x"], d["w"], b, device="host", **win)
            assert np.array_equal(_bits(got), _bits(nc.conv(d["x"], d["w"], b, device="host", **win))), axes
    c = ConvCase(7, 0, 1, 1, 1, 2, 1, ((2, 5, 1, 0, 1, 0),))  # a window wider than the input: refused
    d = _operands(c, np, "fwd").dev
    with pytest.raises(nc.ConvRefused):
        fusion_step_conv(d["x"], d["w"], d["b"], device="host", **c.window())
