"""norm-softmax-v1: the contract holds on the host, planted bugs are caught, the IR's ops mean the spec."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from native import norm as nn
from obligations.check import check_contract
from spec import norm as sn
from tests.contract_helpers import CONTRACTS, check_items, contract_variant, needs_cuda

CONTRACT = CONTRACTS / "norm-softmax-v1.yaml"


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_contract_holds_on_host():
    res = check_contract(CONTRACT, device="host")
    bad = {it["id"]: it["status"] for it in res["items"] if it["status"] not in ("proved", "exhausted", "passed")}
    assert bad == {"NORM-SANITIZE": "skipped"}, bad  # compute-sanitizer runs on cuda
    assert not res["unchecked_entry_points"], res["unchecked_entry_points"]
    insensitive = [it["id"] for it in res["items"] if (it.get("evidence") or {}).get("order_insensitive")]
    assert not insensitive, insensitive


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
