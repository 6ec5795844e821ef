"""norm-softmax-v1: the contract holds on the host, planted bugs are caught, the IR's ops mean the spec."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from falsification import norm_tests as nt
from native import norm as nn
from obligations.check import check_contract
from spec import norm as sn
from tests.contract_helpers import CONTRACTS, check_items, contract_variant, needs_cuda

CONTRACT = CONTRACTS / "norm-softmax-v1.yaml"
DOC = CONTRACTS.parent / "docs" / "norm.md"


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_contract_holds_on_host():
    res = check_contract(CONTRACT, device="host")
    bad = {it["id"]: it["status"] for it in res["items"] if it["status"] not in ("proved", "exhausted", "passed")}
    assert bad == {"NORM-SANITIZE": "skipped"}, bad  # compute-sanitizer runs on cuda
    assert not res["unchecked_entry_points"], res["unchecked_entry_points"]
    insensitive = [it["id"] for it in res["items"] if (it.get("evidence") or {}).get("order_insensitive")]
    assert not insensitive, insensitive


def test_planted_guard_without_the_empty_axis_limit_is_caught_by_the_rejected_witness(tmp_path):
    planted = 'impl: "tests.planted.norm_bugs:softmax_empty_rows"}'
    path = contract_variant(CONTRACT, tmp_path, 'impl: "native.norm:softmax"}', planted, count=-1)
    got = check_items(path, ["NORM-REGIMES", "SOFTMAX-host-bitwise"])["SOFTMAX-host-bitwise"]
    assert got["status"] == "violated" and got["counterexample"]["kind"] == "guard"
    assert got["counterexample"]["detail"].startswith("length >= 1 @reject")


@pytest.mark.parametrize(
    ("items", "old", "new"),
    [
        (
            ["SOFTMAX-sum", "FALSIFY-NORM-001"],
            'impl: "native.norm:softmax"}',
            'impl: "tests.planted.norm_bugs:softmax_mask_after"}',
        ),
        (
            ["SOFTMAX-BWD-bitwise"],
            'impl: "native.norm:softmax_backward"}',
            'impl: "tests.planted.norm_bugs:softmax_backward_no_diagonal"}',
        ),
        (["RMSNORM-bitwise"], 'impl: "native.norm:rmsnorm"}', 'impl: "tests.planted.norm_bugs:rmsnorm_no_eps"}'),
        (
            ["LAYERNORM-bound"],
            'impl: "native.norm:layernorm"}',
            'impl: "tests.planted.norm_bugs:layernorm_unbiased_variance"}',
        ),
        (
            ["LOGSOFTMAX-BWD-bound"],
            'impl: "native.norm:log_softmax_backward"}',
            'impl: "tests.planted.norm_bugs:log_softmax_backward_no_exp"}',
        ),
    ],
)
def test_planted_bug_is_caught(tmp_path, items, old, new):
    path = contract_variant(CONTRACT, tmp_path, old, new, count=-1)
    got = check_items(path, items)
    assert {k: v["status"] for k, v in got.items()} == dict.fromkeys(items, "violated")


@pytest.mark.parametrize(
    ("item", "old", "new"),
    [
        (
            "SOFTMAX-BWD-bound",
            'impl: "native.norm:softmax_backward"',
            'impl: "tests.planted.norm_bugs:softmax_backward_no_diagonal"',
        ),
        (
            "LAYERNORM-BWD-bound",
            'impl: "native.norm:layernorm_backward"',
            'impl: "tests.planted.norm_bugs:layernorm_backward_no_mean"',
        ),
        (
            "RMSNORM-BWD-bound",
            'impl: "native.norm:rmsnorm_backward"',
            'impl: "tests.planted.norm_bugs:rmsnorm_backward_no_rsqrt_term"',
        ),
    ],
)
def test_planted_backward_bug_is_caught_by_its_bound(tmp_path, item, old, new):
    """A softmax backward without the Jacobian's diagonal, a layernorm backward without mean(g), an RMSNorm
    backward without the rsqrt-derivative term: each violates its float64 error-bound item."""
    got = check_items(contract_variant(CONTRACT, tmp_path, old, new, count=-1), [item])
    assert got[item]["status"] == "violated", got[item].get("reason")


@pytest.mark.parametrize("op", ["softmax_bwd", "layernorm_bwd", "rmsnorm_bwd"])
def test_planted_loose_bound_is_caught_by_the_tightness_item(monkeypatch, op):
    """A backward bound formula 8x too loose (every output) passes its bound item but violates its -tight item."""
    item = {"softmax_bwd": "SOFTMAX", "layernorm_bwd": "LAYERNORM", "rmsnorm_bwd": "RMSNORM"}[op] + "-BWD-bound"
    true_bound = nt._BOUNDS[op]

    def loose(i: Any, tol: float) -> tuple[np.ndarray, np.ndarray]:
        value, bound = true_bound.fn(i, tol)
        return value, 8 * bound

    monkeypatch.setitem(nt._BOUNDS, op, dataclasses.replace(true_bound, fn=loose))
    got = check_items(CONTRACT, [item, f"{item}-tight"])
    assert got[item]["status"] == "passed", got[item].get("reason")
    tight = got[f"{item}-tight"]
    assert tight["status"] == "violated", tight.get("reason")
    assert min(tight["evidence"]["lowest_worst_ratio"]) < tight["tolerance"], tight["evidence"]


@pytest.mark.parametrize(
    ("planted", "items"),
    [
        ("underflow", ["SOFTMAX-BWD-bound", "LAYERNORM-BWD-bound", "RMSNORM-BWD-bound"]),
        # RMSNorm's fold terms are dominated by the rsqrt's e_xh carried into every product (e_xh ~ (n + 2) u |XH|),
        # so dropping them leaves a bound the kernel still meets: its tightness item bounds that slack (8x)
        ("folds", ["SOFTMAX-BWD-bound", "LAYERNORM-BWD-bound"]),
    ],
)
def test_planted_too_tight_bound_is_caught(monkeypatch, planted, items):
    """Backward bounds without their underflow terms (tiny = 0) or their folds' rounding (gamma_k = 0) are too
    tight: the bound items see the shipped kernels' subnormal products and fold errors beyond them."""
    if planted == "underflow":
        monkeypatch.setattr(nt, "KERNEL", dataclasses.replace(nt.KERNEL, tiny=0.0))
    else:
        monkeypatch.setattr(nt, "_gamma", lambda k, u=nt.U: np.zeros(np.shape(k)) if np.ndim(k) else 0.0)
    got = check_items(CONTRACT, items)
    assert {k: v["status"] for k, v in got.items()} == dict.fromkeys(items, "violated")


def _vjp(f: Any, x: np.ndarray, dy: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """dy^T J_f(x) by central differences in float64."""
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        out[idx] = np.sum(dy * (f(x + e) - f(x - e))) / (2 * h)
    return out


def test_float64_backward_specs_are_the_gradients():
    """The *_backward_f64 specs equal central-difference VJPs of the float64 forward (eps included)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    w = rng.standard_normal(6).astype(np.float32)
    dy = rng.standard_normal((3, 6)).astype(np.float32)
    x64, w64, g64 = (a.astype(np.float64) for a in (x, w, dy))
    mask = rng.random((3, 6)) < 0.7
    y = sn.softmax_f64(x64, mask).astype(np.float32)
    got = sn.softmax_backward_f64(y, dy, mask)
    want = _vjp(lambda z: sn.softmax_f64(z, mask), x64, g64)  # at y rounded to float32: compare loosely
    assert np.allclose(got, want, atol=1e-6)
    eps = float(np.float32(1e-5))

    def ln(z: np.ndarray, centred: bool = True) -> np.ndarray:
        d = z - z.mean(-1, keepdims=True) if centred else z
        return d / np.sqrt((d * d).mean(-1, keepdims=True) + eps) * w64

    dx, dw, db = sn.layernorm_backward_f64(x, w, dy, 1e-5)
    assert np.allclose(dx, _vjp(ln, x64, g64), rtol=1e-6, atol=1e-7)
    xh = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + eps)
    assert np.allclose(dw, (g64 * xh).sum(0)) and np.allclose(db, g64.sum(0))
    eps = float(np.float32(1e-6))
    dx, dw = sn.rmsnorm_backward_f64(x, w, dy, 1e-6)
    assert np.allclose(dx, _vjp(lambda z: ln(z, False), x64, g64), rtol=1e-6, atol=1e-7)


def test_backward_bound_evidence_reports_the_worst_ratio():
    """The backward bound items report the worst error/bound, by output, and no element without a bound."""
    items = ["SOFTMAX-BWD-bound", "LAYERNORM-BWD-bound", "RMSNORM-BWD-bound", "LAYERNORM-BWD-bound-tight"]
    got = check_items(CONTRACT, items)
    for item in items[:3]:
        ev = got[item]["evidence"]
        assert got[item]["status"] == "passed" and 0 < ev["worst_error_over_bound"] <= 1, (item, ev)
        assert ev["elements_without_bound"] == 0
    assert set(got["LAYERNORM-BWD-bound"]["evidence"]["worst_error_over_bound_by_output"]) == {"dx", "dw", "db"}
    tight = got["LAYERNORM-BWD-bound-tight"]["evidence"]
    assert tight["outputs"] == ["dx", "dw", "db"] and min(tight["lowest_worst_ratio"]) >= 0.0625


def test_docs_python_blocks_run(tmp_path):
    """docs/norm.md's python blocks run as written."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks
    for k, code in enumerate(blocks):
        script = tmp_path / f"block{k}.py"
        script.write_text(code)
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(DOC.parent.parent)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"block {k}:\n{done.stdout}\n{done.stderr}"


def test_fully_masked_row_is_documented_value():
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    mask = np.array([[True, False, True], [False, False, False]])
    y = nn.softmax(x, mask, device="host")
    assert np.array_equal(y[1], np.zeros(3, np.float32)) and not np.signbit(y[1]).any()
    assert y[0, 1] == 0 and abs(float(y[0].sum()) - 1) < 1e-6
    assert np.isneginf(nn.log_softmax(x, mask, device="host")[1]).all()


def test_ir_softmax_layernorm_rmsnorm_denote_the_spec():
    from spec.ir.denote import denote
    from spec.ir.graph import GraphBuilder

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 9)) * 3).astype(np.float32)
    w, b = rng.standard_normal(9).astype(np.float32), rng.standard_normal(9).astype(np.float32)
    gb = GraphBuilder()
    i = gb.add("input", (), x.shape)
    s = gb.add("softmax", (i,), x.shape, axis=-1)
    ln = gb.add("layernorm", (i,), x.shape, eps=1e-5, params={"weight": w, "bias": b})
    rms = gb.add("rmsnorm", (i,), x.shape, eps=1e-6, params={"weight": w})
    g, payload = gb.build()
    assert np.array_equal(_bits(denote(g, payload, x, s).value), sn.softmax(_bits(x)))
    assert np.array_equal(_bits(denote(g, payload, x, ln).value), sn.layernorm(_bits(x), _bits(w), _bits(b), 1e-5))
    assert np.array_equal(_bits(denote(g, payload, x, rms).value), sn.rmsnorm(_bits(x), _bits(w), 1e-6))
    assert np.array_equal(_bits(nn.layernorm(x, w, b, device="host")), sn.layernorm(_bits(x), _bits(w), _bits(b)))


def test_cuda_launches_pass_every_kernel_parameter(monkeypatch):
    """Each CUDA launch passes exactly the parameters its kernel declares, with the declared scalar types."""
    import native.nvrtc as nv

    launches = []
    kinds = {"long long": np.int64, "int": np.int32, "float": np.float32}

    def fake_compile(source, name, route):
        head = source[source.index(f"void {name}(") :]
        params = [p.strip() for p in head[head.index("(") + 1 : head.index(")")].split(",")]

        def fn(grid, block, args):
            launches.append(name)
            assert len(args) == len(params), (name, len(args), len(params))
            for a, p in zip(args, params, strict=True):
                if "*" in p:
                    assert isinstance(a, np.ndarray), (name, p)
                else:
                    assert isinstance(a, kinds[p.rsplit(" ", 1)[0]]), (name, p, type(a))

        return fn

    monkeypatch.setattr(nv, "compile_function", fake_compile)
    monkeypatch.setattr(nn, "resolve_device", lambda device: "cuda")
    monkeypatch.setattr(nn, "array_module", lambda dev: np)
    x = np.ones((3, 5), np.float32)
    w = np.ones(5, np.float32)
    mask = np.ones((3, 5), bool)
    for fn in (nn.softmax, nn.log_softmax):
        fn(x, mask)
    for fn in (nn.softmax_backward, nn.log_softmax_backward):
        fn(x, x, None)
    nn.layernorm(x, w, w)
    nn.rmsnorm(x, w)
    nn.layernorm_backward(x, w, x)
    nn.rmsnorm_backward(x, w, x)
    assert len(set(launches)) == 9, sorted(set(launches))


@pytest.mark.skipif(
    shutil.which("g++") is None, reason="needs g++ (with libasan) to compile the CUDA sources for the host"
)
def test_cuda_sources_match_the_host_path_under_sanitizers():
    """The CUDA text, compiled as C++ with ASan/UBSan and run one thread at a time, equals the host path."""
    from tests.host_cuda import run_under_asan

    res = run_under_asan("norm")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "norm: 0 mismatches" in res.stdout


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


def test_batchnorm_eval_with_mean_added_is_caught(monkeypatch):
    """Planted: x + mean instead of x - mean: BATCHNORM-EVAL-bitwise refutes it."""
    real = nn.batchnorm_eval
    monkeypatch.setattr(
        nn, "batchnorm_eval", lambda x, m, v, w, b, eps=1e-5, device="auto": real(x, -m, v, w, b, eps, device)
    )
    it = check_items(CONTRACT, ["BATCHNORM-EVAL-bitwise"])["BATCHNORM-EVAL-bitwise"]
    assert it["status"] == "violated", it["reason"]


@pytest.mark.cuda
@needs_cuda
def test_batchnorm_eval_kernel_is_bitwise_the_host_path():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 7, 5)).astype(np.float32)
    x[0, 1, 2, 3] = np.nan
    m, w, b = (rng.standard_normal(4).astype(np.float32) for _ in range(3))
    v = np.abs(rng.standard_normal(4)).astype(np.float32)
    host = nn.batchnorm_eval(x, m, v, w, b, device="host").view(np.uint32)
    dev = nn.batchnorm_eval(x, m, v, w, b, device="cuda").get().view(np.uint32)
    np.testing.assert_array_equal(dev, host)
