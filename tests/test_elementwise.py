"""Elementwise family: launch plan, host kernels under the contract items, planted bugs caught, CUDA."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from falsification.registry import FalsifyContext, get_test
from native import elementwise as ew
from native.nvrtc import ROUTES, CompileFlags
from obligations.core.device import DeviceUnavailable, cuda_available, device_info, resolve_device

CUDA_OK, CUDA_WHY = cuda_available()
cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not CUDA_OK, reason="no CUDA device")
DEVICE_PARAMS = ["host", pytest.param("cuda", marks=[cuda, needs_cuda])]
EXACT = [
    "add",
    "sub",
    "mul",
    "div",
    "fma",
    "sqrt",
    "inv",
    "neg",
    "abs",
    "min",
    "max",
    "relu",
    "scale",
    "axpy",
    "clamp",
]
APPROX = {
    "exp": {"bound": 2},
    "log": {"bound": 1},
    "tanh": {"bound": 2},
    "sigmoid": {"bound_fn": "sigmoid"},
    "gelu": {"bound_fn": "gelu"},
}
BACKWARD = [
    "relu_bwd",
    "abs_bwd",
    "sqrt_bwd",
    "clamp_bwd",
    "min_bwd",
    "max_bwd",
    "gelu_bwd",
    # the rules with a convention beyond a kink (exp's binary32 overflow, log outside its domain, div's two outputs);
    # tanh_bwd, sigmoid_bwd and inv_bwd are checked by their FALSIFY-EW-*-backward items in `kc check contracts`
    "exp_bwd",
    "log_bwd",
    "div_bwd",
]


def check(test: str, params: dict, device: str = "host", seed: int = 1, profile: str = "quick", **item):
    ctx = FalsifyContext(
        device=device,
        profile=profile,
        seed=seed,
        item={"id": "it", "test": test, "params": params, **item},
        contract_path="c.yaml",
    )
    out = get_test(test).run(ctx)
    json.dumps(out.to_json())  # evidence must be JSON-serialisable
    return out


def figure(name: str, **vals) -> None:
    """Print one figure line for the GPU run's log (pytest -s)."""
    print(f"FIGURE {name} " + json.dumps(vals, default=str))


# -- plan and build ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 10**6, (1 << 31) - 1, (1 << 32) + 5])
def test_launch_plan_covers_n_within_limits(n):
    p = ew.launch_plan(n)
    assert all(isinstance(v, int) for k, v in p.items() if not callable(v) and k != "regimes")
    assert sum(map(bool, p["regimes"].values())) >= 1  # every n selects a regime (one_trip and capped may overlap)
    assert p["step"](n) == n + p["stride"] and p["thread_index"](1, 2) == p["block"] + 2
    assert p["grid"] >= 1 and p["grid"] <= ew.DEFAULT_MAX_GRID and p["stride"] == p["grid"] * p["block"]
    assert p["stride"] * p["iterations"] >= n and (p["iterations"] - 1) * p["stride"] < max(n, 1)


def test_kernel_sources_use_64_bit_index_and_variants_differ():
    src, name = ew.kernel_source("add")
    assert "long long i" in src and "i < n" in src and name == "kc_add"
    assert "int i" in ew.kernel_source("add", "wrap32")[0]
    assert "i <= n" in ew.kernel_source("add", "tail_over")[0]
    assert ew.kernel_plan("add", 10, "wrap32")["index_bits"] == 32
    with pytest.raises(KeyError, match="tail_short"):
        ew.get_kernel("add").variant("nope")


def test_routes_record_explicit_flags():
    assert ROUTES["nvrtc-ieee"].flags.options() == (
        "-ftz=false",
        "-fmad=false",
        "-prec-div=true",
        "-prec-sqrt=true",
    )
    assert ROUTES["cupy-stock"].env == "cuda-ftz" and ROUTES["cupy-stock"].flags is None
    assert CompileFlags(fast_math=True).options() == ("--use_fast_math",)


def test_device_selection_fails_loudly_without_cuda():
    assert resolve_device("host") == "host"
    if CUDA_OK:
        pytest.skip("a CUDA device is present")
    assert resolve_device("auto") == "host" and ("CuPy" in CUDA_WHY or "CUDA" in CUDA_WHY)
    with pytest.raises(DeviceUnavailable, match="--device cuda"):
        resolve_device("cuda")
    assert device_info("host")["kind"] == "host"


def test_apply_broadcasts_and_handles_views():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.float32([1, 2, 3, 4])
    assert (ew.apply("add", a.T.T[:, ::2], b[::2], device="host") == a[:, ::2] + b[::2]).all()
    assert ew.apply("scale", a, scalars=(2.0,), device="host").tolist() == (a * 2).tolist()
    da, db = ew.apply("max_bwd", np.float32([1, 2, 3]), np.float32([3, 2, 1]), np.float32([1, 1, 1]), device="host")
    assert da.tolist() == [0, 0.5, 1] and db.tolist() == [1, 0.5, 0]
    assert ew.apply("add", np.zeros(0, np.float32), np.zeros(0, np.float32), device="host").shape == (0,)


def test_host_nan_rule_is_the_environments():
    x = np.array([0x7FC12345, 0xFFC00000], dtype=np.uint32).view(np.float32)
    out = ew.apply("add", x, np.float32(1), device="host").view(np.uint32)
    assert out.tolist() == [0x7FFFFFFF, 0x7FFFFFFF]
    assert ew.apply("neg", x, device="host").view(np.uint32).tolist() == [0xFFC12345, 0x7FC00000]


# -- contract items on the host (and on CUDA where present) ----------------------------------------


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("op", EXACT)
def test_bitwise_ops_agree_with_softfloat(op, device):
    out = check("elementwise.bitwise", {"op": op}, device)
    assert out.status.value == "passed", (out.reason, out.counterexample)
    assert out.evidence["env"] == "cuda" and out.evidence["elements"] > 1000
    if device == "cuda":
        figure(f"bitwise.{op}", elements=out.evidence["elements"], elements_per_s=out.evidence["elements_per_s"])


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("op", sorted(APPROX))
def test_transcendentals_within_bounds(op, device):
    out = check("elementwise.max_ulp", {"op": op, **APPROX[op]}, device)
    assert out.status.value == "passed", (out.reason, out.counterexample)
    if device == "cuda":
        figure(f"max_ulp.{op}", max_ulp=out.evidence["max_ulp_observed"])


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("op", BACKWARD)
def test_backward_rules_match_finite_differences(op, device):
    out = check("elementwise.backward_fd", {"op": op}, device)
    assert out.status.value == "passed", (out.reason, out.counterexample)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_rn_muladd_and_axpy_keep_separate_rounding(device):
    for op in ("muladd_rn", "axpy"):
        out = check("elementwise.fma_contraction", {"op": op, "promise": "separate"}, device)
        assert out.status.value == "passed", (op, out.reason, out.counterexample)
        assert out.evidence["other_promise"]["refuted"], "the check must be able to tell fused from separate"


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_determinism_and_grid_coverage(device):
    assert check("elementwise.determinism", {"op": "gelu"}, device).status.value == "passed"
    assert check("elementwise.grid_coverage", {"op": "add"}, device).status.value == "passed"


def test_stock_route_is_skipped_on_host_with_reason():
    out = check("elementwise.bitwise", {"op": "add", "route": "cupy-stock", "refute_envs": ["cuda"]})
    assert out.status.value == "skipped" and "runs on cuda" in out.reason and "cupy-stock" in out.reason


# -- planted bugs: each caught by the item meant to catch it ---------------------------------------

PLANTED = [
    ("elementwise.bitwise", {"op": "div", "variant": "fast_math"}, "element"),
    ("elementwise.bitwise", {"op": "add", "variant": "fast_math"}, "element"),
    ("elementwise.bitwise", {"op": "add", "variant": "tail_short"}, "element"),
    ("elementwise.bitwise", {"op": "mul", "variant": "tail_over"}, "out_of_bounds_write"),
    ("elementwise.bitwise", {"op": "relu", "variant": "nan_as_number"}, "element"),
    ("elementwise.bitwise", {"op": "clamp", "variant": "nan_as_number"}, "element"),
    (
        "elementwise.fma_contraction",
        {"op": "axpy", "variant": "contracted", "promise": "separate"},
        "element",
    ),
]


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize(("test", "params", "kind"), PLANTED, ids=[f"{p['op']}-{p['variant']}" for _, p, _ in PLANTED])
def test_planted_bug_is_caught(test, params, kind, device):
    out = check(test, params, device)
    assert out.status.value == "violated", (out.reason, out.evidence)
    ce = out.counterexample
    assert ce["kind"] == kind and ce["replay"]
    if kind == "element":
        assert ce["size"] == 1 and ce["element"]["outputs"]
    if params["variant"] == "nan_as_number":
        ops = list(ce["element"]["operands"].values())
        assert int(ops[0], 16) & 0x7F800000 == 0x7F800000 and int(ops[0], 16) & 0x7FFFFF, "a NaN input"
    if params["variant"] == "fast_math" and params["op"] == "add":
        a = [int(v, 16) for v in ce["element"]["operands"].values()]
        assert any((v & 0x7F800000) == 0 and v & 0x7FFFFF for v in a), "a subnormal operand"
    if device == "cuda":
        figure(f"planted.{params['op']}.{params['variant']}", counterexample=ce.get("element", ce.get("detail")))


def test_wrapping_grid_stride_index_is_caught():
    out = check("elementwise.grid_coverage", {"op": "add", "variant": "wrap32"})
    assert out.status.value == "violated" and out.counterexample["index"] < 0
    assert out.counterexample["n"] == (1 << 31) - 1


def test_tail_guard_bug_also_fails_grid_coverage():
    assert check("elementwise.grid_coverage", {"op": "add", "variant": "tail_short"}).status.value == "violated"


# -- CUDA-only claims ------------------------------------------------------------------------------


@cuda
@needs_cuda
def test_cuda_stock_route_is_ftz_and_refutes_ieee():
    out = check("elementwise.bitwise", {"op": "add", "route": "cupy-stock", "refute_envs": ["cuda"]}, "cuda")
    assert out.status.value == "passed", (out.reason, out.counterexample)
    (r,) = out.evidence["refuted_claims"]
    assert r["refuted"], r
    ops = [int(v, 16) for v in r["counterexample"]["element"]["operands"].values()]
    assert any((v & 0x7F800000) == 0 and v & 0x7FFFFF for v in ops), "a subnormal counterexample"
    figure("stock_route.ieee_refuted", counterexample=r["counterexample"]["element"])


@cuda
@needs_cuda
def test_cuda_plain_muladd_is_contracted_under_fmad():
    fused = check("elementwise.fma_contraction", {"op": "muladd", "route": "nvrtc-fmad", "promise": "fused"}, "cuda")
    assert fused.status.value == "passed", (fused.reason, fused.counterexample)
    assert fused.evidence["other_promise"]["refuted"]
    sep = check("elementwise.fma_contraction", {"op": "muladd", "route": "nvrtc-ieee", "promise": "separate"}, "cuda")
    assert sep.status.value == "passed", (sep.reason, sep.counterexample)
    rn = check(
        "elementwise.fma_contraction",
        {"op": "muladd_rn", "route": "nvrtc-fmad", "promise": "separate"},
        "cuda",
    )
    assert rn.status.value == "passed", (rn.reason, rn.counterexample)
    figure("contraction", plain_fmad_separate_refuted=fused.evidence["other_promise"]["counterexample"])


@cuda
@needs_cuda
def test_cuda_full_profile_throughput():
    out = check("elementwise.bitwise", {"op": "fma", "max_examples": 40}, "cuda", profile="full")
    assert out.status.value == "passed", (out.reason, out.counterexample)
    figure(
        "full_profile.fma",
        elements=out.evidence["elements"],
        wall_s=out.evidence["wall_s"],
        elements_per_s=out.evidence["elements_per_s"],
        device=device_info("cuda"),
    )


@cuda
@needs_cuda
@pytest.mark.slow
@pytest.mark.parametrize("op", ["sqrt", "neg", "relu", "inv", "exp", "log", "tanh", "sigmoid", "gelu"])
def test_cuda_exhaustive_sweep(op):
    from falsification.sweep import sweep

    bound = {"gelu": 10**6}.get(op)  # gelu's bound is per input; the sweep reports its max ULP
    t = time.perf_counter()
    r = sweep(op, device="cuda", bound=bound)
    figure(
        f"sweep.{op}",
        seconds=r["seconds"],
        native_s=r["native_seconds"],
        reference_s=r["reference_seconds"],
        max_ulp=r["max_ulp"],
        disagreements=r["disagreements"],
        hist=r["histogram"],
        first=r["first_counterexamples"][:3],
        wall=round(time.perf_counter() - t, 3),
    )
    assert r["exhaustive"] and r["elements"] == 1 << 32
    if op in ("sqrt", "inv"):
        f = sweep(op, device="cuda", reference="float64")
        figure(f"sweep.{op}.float64ref", seconds=f["seconds"], disagreements=f["disagreements"])
    if os.environ.get("KC_STRICT_SWEEP", "1") == "1" and op != "gelu":
        assert r["disagreements"] == 0, r["first_counterexamples"]


def test_precompile_builds_each_kernel_the_contracts_items_launch_once(monkeypatch, tmp_path):
    """On cuda the first elementwise item builds every (kernel, route) of the contract's items side by side."""
    from pathlib import Path

    from falsification import elementwise_tests as et
    from falsification.registry import FalsifyContext
    from native import elementwise as ne
    from native import nvrtc
    from obligations.contract import load_contract

    contract = load_contract(Path(__file__).resolve().parent.parent / "contracts" / "elementwise-float32-v1.yaml")
    ctx = FalsifyContext(device="cuda", profile="full", seed=0, item={"id": "x"}, contract=contract.data)
    assert et.precompile(FalsifyContext(device="host", profile="full", seed=0, item={"id": "x"})) == 0
    built = []
    monkeypatch.setattr(nvrtc, "_binary", lambda src, opts: built.append((src, opts)) or b"")
    monkeypatch.setattr(nvrtc, "_arch", lambda: "90")
    monkeypatch.setattr(nvrtc, "_cache_dir", lambda: tmp_path)
    monkeypatch.setattr(et, "_BUILT", set())
    n = et.precompile(ctx)
    want = set()
    for item in et._items(contract.data):
        p = item.get("params") or {}
        if str(item.get("test", "")).startswith("elementwise.") and "op" in p:
            route = nvrtc.get_route(p.get("route", "nvrtc-ieee"))
            if route.flags is not None:
                src, _ = ne.kernel_source(p["op"], None, ne.kernel_plan(p["op"], 1))
                want.add((src, route.flags.options()))
    assert n == len(built) == len(want) > 20 and set(built) == want
    assert et.precompile(ctx) == 0  # once per process


def test_a_wrong_div_backward_rule_is_caught(monkeypatch):
    """Planted: db = -dy / b^2 (the factor a dropped): the finite differences refute it."""
    wrong = ew.Variant(
        "planted_db",
        body="r = dy / b; r2 = -(dy / (b * b));",
        host=lambda a, b, dy: ((dy / b).astype(np.float32), (-(dy / (b * b))).astype(np.float32)),
    )
    monkeypatch.setitem(ew.get_kernel("div_bwd").variants, "planted_db", wrong)
    out = check("elementwise.backward_fd", {"op": "div_bwd", "variant": "planted_db"})
    assert out.status.value == "violated", out.reason
