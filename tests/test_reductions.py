"""Reductions: the shipped contract on the host, planted bugs caught by their items, host API edge cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from native import reductions as red
from obligations.check import check_contract
from spec import reductions as ref
from tests.contract_helpers import needs_cuda

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "contracts" / "reductions-v1.yaml"


def _variant(tmp_path: Path, old: str, new: str, count: int = -1) -> Path:
    text = CONTRACT.read_text()
    assert old in text, old
    out = tmp_path / "reductions-v1.yaml"
    out.write_text(text.replace(old, new, count))
    return out


def _items(path: Path, ids: list[str], device: str = "host") -> dict[str, dict]:
    return {it["id"]: it for it in check_contract(path, only=ids, device=device)["items"]}


def test_shipped_contract_holds_on_host():
    entry = check_contract(CONTRACT, device="host")
    by = {it["id"]: it for it in entry["items"]}
    bad = {k: (v["status"], v["reason"]) for k, v in by.items() if v["status"] in ("violated", "error", "unknown")}
    assert not bad, bad
    for iid in ("RED-TREE-cover-z3", "RED-TREE-once-z3", "RED-TREE-probe-z3", "RED-AXIS-inbounds-z3"):
        assert by[iid]["status"] == "proved", iid
    assert by["RED-TREE-bitwise"]["status"] == "passed"
    assert by["RED-ATOMIC-not-reproducible"]["evidence"]["distinct_results"] >= 2
    assert by["RED-BANDWIDTH"]["status"] == "skipped" and "cuda" in by["RED-BANDWIDTH"]["reason"].lower()


def test_order_changed_tree_is_caught_by_the_tree_item(tmp_path):
    path = _variant(
        tmp_path,
        'params: {impl: "native.reductions:tree_sum"}\n  - id: RED-TREE-mean',
        'params: {impl: "tests.planted.reduction_bugs:tree_sum_interleaved"}\n  - id: RED-TREE-mean',
        1,
    )
    it = _items(path, ["RED-TREE-bitwise"])["RED-TREE-bitwise"]
    assert it["status"] == "violated", it["reason"]
    assert "interleaved" in it["reason"]
    # The planted tree is reproducible: only the bitwise-against-the-stated-tree claim can catch it.
    path2 = _variant(
        tmp_path,
        'params: {impl: "native.reductions:tree_sum", runs: 5}\n  - id: RED-TREE-bound',
        'params: {impl: "tests.planted.reduction_bugs:tree_sum_interleaved", runs: 5}\n  - id: RED-TREE-bound',
        1,
    )
    assert _items(path2, ["RED-TREE-determinism"])["RED-TREE-determinism"]["status"] == "passed"


def test_atomic_path_claimed_deterministic_is_caught_by_the_determinism_item(tmp_path):
    path = _variant(
        tmp_path,
        'params: {impl: "native.reductions:tree_sum", runs: 5}\n  - id: RED-TREE-bound',
        'params: {impl: "native.reductions:atomic_sum", runs: 5}\n  - id: RED-TREE-bound',
        1,
    )
    it = _items(path, ["RED-TREE-determinism"])["RED-TREE-determinism"]
    assert it["status"] == "violated", it["reason"]
    out = it["counterexample"]["element"]["outputs"]["r"]  # a later run against the first, one case
    assert it["counterexample"]["kind"] == "case" and out["native"] != out["reference"]


def test_tree_claimed_nonreproducible_is_refuted(tmp_path):
    path = _variant(
        tmp_path,
        'params: {impl: "native.reductions:atomic_sum", runs: 20}',
        'params: {impl: "native.reductions:tree_sum", runs: 20}',
        1,
    )
    assert _items(path, ["RED-ATOMIC-not-reproducible"])["RED-ATOMIC-not-reproducible"]["status"] == "violated"


def test_unadmitted_axis_plan_overflows_int64(tmp_path):
    old = 'given: "admissible and o < outer and r < length and q < inner"\n    prove: "0 <= offset(o, r, q) and '
    path = _variant(
        tmp_path,
        old + "offset(o, r, q) < total and out_offset",
        old.replace("admissible and ", "") + "offset(o, r, q) < total and out_offset",
        1,
    )
    it = _items(path, ["RED-AXIS-inbounds-z3"])["RED-AXIS-inbounds-z3"]
    assert it["status"] == "violated" and "int64 overflow" in it["reason"]


def test_tree_reference_is_not_the_fold():
    x = np.zeros(300, dtype=np.float32)
    x[0], x[1], x[129] = 1.0, 2.0**-24, 2.0**-24
    bits = x.view(np.uint32)
    fold = int(ref.fold_left(bits[None, :])[0])
    tree = int(ref.tree_sum(bits.copy(), red.pass_grids(x.size), red.BLOCK))
    assert fold == 0x3F800000  # 1 + u + u rounds to 1 twice in the fold
    assert tree == 0x3F800001  # the tree adds u + u first (threads 1 and 129 meet at s = 128)
    assert int(np.asarray(red.tree_sum(x, device="host")).view(np.uint32)) == tree
    assert int(np.asarray(red.fold_sum(x, device="host")).view(np.uint32)) == fold


def test_axis_kinds_and_scatter_on_host():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for axis in (None, 0, 1, 2):
        np.testing.assert_array_equal(red.fold_sum(x, axis=axis, device="host"), x.sum(axis=axis))
        np.testing.assert_array_equal(red.fold_max(x, axis=axis, device="host"), x.max(axis=axis))
    out = red.scatter_add(np.zeros(3, np.float32), [2, 0, 2], [1.0, 5.0, 2.0**25], device="host")
    np.testing.assert_array_equal(out, np.array([5.0, 0.0, 2.0**25], np.float32))  # 1 first, then 2^25: 1 lost
    with pytest.raises(IndexError):
        red.scatter_add(np.zeros(3, np.float32), [3], [1.0], device="host")
    assert np.isnan(red.fold_max(np.array([1.0, np.nan, 3.0], np.float32), device="host"))
    assert np.signbit(red.fold_max(np.array([-0.0, 0.0], np.float32), device="host")) == np.False_


@pytest.mark.cuda
def test_cuda_reductions_match_the_reference():
    from obligations.core.device import cuda_available

    ok, why = cuda_available()
    if not ok:
        pytest.skip("no CUDA device")
    entry = check_contract(CONTRACT, device="cuda")
    # Correctness only: the bandwidth goal is a measurement reported by kc check and the benchmark.
    bad = {
        it["id"]: it["reason"]
        for it in entry["items"]
        if it["status"] in ("violated", "error") and it["id"] != "RED-BANDWIDTH"
    }
    assert not bad, bad


@pytest.mark.cuda
def test_cuda_planted_bugs_are_caught(tmp_path):
    from obligations.core.device import cuda_available

    if not cuda_available()[0]:
        pytest.skip("no CUDA device")
    path = _variant(
        tmp_path,
        'params: {impl: "native.reductions:tree_sum", runs: 5}\n  - id: RED-TREE-bound',
        'params: {impl: "native.reductions:atomic_sum", runs: 5}\n  - id: RED-TREE-bound',
        1,
    )
    assert _items(path, ["RED-TREE-determinism"], "cuda")["RED-TREE-determinism"]["status"] == "violated"
    path = _variant(
        tmp_path,
        'params: {impl: "native.reductions:tree_sum"}\n  - id: RED-TREE-mean',
        'params: {impl: "tests.planted.reduction_bugs:tree_sum_interleaved"}\n  - id: RED-TREE-mean',
        1,
    )
    assert _items(path, ["RED-TREE-bitwise"], "cuda")["RED-TREE-bitwise"]["status"] == "violated"


@pytest.mark.parametrize("plan", ["scatter_plan_int32_keys", "scatter_plan_unguarded"])
def test_scatter_key_overflow_is_caught_by_z3(tmp_path, plan):
    path = _variant(tmp_path, "plan: native.reductions:scatter_plan", f"plan: tests.planted.reduction_bugs:{plan}")
    it = _items(path, ["RED-SCATTER-keys-z3"])["RED-SCATTER-keys-z3"]
    assert it["status"] == "violated", (it["status"], it["reason"])


def test_host_scatter_keeps_the_bits_of_outputs_no_source_reaches():
    """An untouched output keeps its NaN payload (the spec copies ``out``); a NaN sum is the canonical NaN."""
    from spec import reductions as sr

    out = np.array([0x7FC00001, 0xFFC00002, 0x3F800000], np.uint32)
    src = np.array([0x7FA00003], np.uint32)  # a signalling NaN with a payload, added to output 1
    got = red.scatter_add(out.view(np.float32), [1], src.view(np.float32), device="host").view(np.uint32)
    want = sr.scatter_add(out, np.array([1]), src)
    assert got[0] == want[0] == 0x7FC00001
    assert got[1] == want[1] == 0x7FFFFFFF and got[2] == want[2] == 0x3F800000


def test_scatter_refuses_a_call_beyond_the_key_space():
    plan = red.scatter_plan(1 << 40, 1 << 40)
    assert not plan.admissible and red.scatter_plan(1 << 31, 1 << 31).admissible
    assert int(red.scatter_plan(5, 3).key(2, 4)) == 14


# -- the float32-numpy route: exact by construction, checked against the softfloat (the definition) --------


def _dense(rows: int, cols: int, seed: int) -> np.ndarray:
    """Edge operands everywhere (each edge value in every row) mixed with the batch generator's mixes."""
    from falsification.float32_inputs import BatchSpec, generate_bits

    parts = [np.resize(ref.EDGES, rows * cols).reshape(rows, cols)]
    for k, mix in enumerate(("balanced", "special", "subnormal", "correlated", "uniform")):
        parts.append(generate_bits(BatchSpec(seed=seed + k, size=rows * cols, mix=mix), 1)[0].reshape(rows, cols))
    x = np.concatenate(parts, axis=0)
    return np.random.default_rng(seed).permuted(x, axis=1)  # edges at every position of a row


def test_float32_route_equals_the_softfloat_on_edges_and_a_dense_sample():
    assert ref.float32_route_ok()
    x = _dense(40, 70, 1)
    assert ref.route_for(x, "cuda", "auto") == "float32-numpy"
    for cols in (0, 1, 2, 7, 70):
        part = np.ascontiguousarray(x[:, :cols])
        sums = ref.fold_left(part)
        assert np.array_equal(sums, ref.fold_left(part, route="auto")), cols
        assert np.array_equal(ref.fold_max(part), ref.fold_max(part, route="auto")), cols
        assert np.array_equal(ref.mean_of(sums, cols), ref.mean_of(sums, cols, route="auto")), cols
        init = x[:, 0]
        assert np.array_equal(ref.fold_left(part, init=init), ref.fold_left(part, init=init, route="auto")), cols
    flat = x.reshape(-1)
    for n, grids, block in ((1, [1], 8), (300, [2, 1], 16), (flat.size, [8, 1], 32), (flat.size, [3, 2, 1], 4)):
        a, b = ref.tree_sum(flat[:n], grids, block), ref.tree_sum(flat[:n], grids, block, route="auto")
        assert int(a) == int(b), (n, grids, block)
    idx = np.random.default_rng(2).integers(0, 50, flat.size // 4)
    out0, src = flat[:50], flat[50 : 50 + idx.size]
    assert np.array_equal(ref.scatter_add(out0, idx, src), ref.scatter_add(out0, idx, src, route="auto"))


def test_float32_route_serves_only_the_envs_it_is_exact_for():
    x = np.zeros((2, 3), np.uint32)
    for env in ("ieee", "x86-sse", "x86-sse-ftz", "cuda-ftz"):
        assert ref.route_for(x, env, "auto") == "softfloat", env
    assert ref.route_for(x, "cuda", "softfloat") == "softfloat"
    with pytest.raises(ValueError):
        ref.route_for(x, "cuda", "fast")


@pytest.mark.parametrize("bug", ["ftz", "payload", "daz"])
def test_a_float32_route_wrong_in_one_edge_class_is_refused(monkeypatch, bug):
    """A host whose binary32 unit flushes subnormal results or inputs, or a route that keeps NaN payloads:
    the edge check fails, so the folds take the softfloat route (and the evidence says so)."""
    good = ref._add32

    def planted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = np.asarray(a, np.uint32), np.asarray(b, np.uint32)
        sub = lambda u: ((u & 0x7F800000) == 0) & ((u & 0x7FFFFF) != 0)  # noqa: E731
        if bug == "payload":
            with np.errstate(all="ignore"):
                return (a.view(np.float32) + b.view(np.float32)).view(np.uint32)
        if bug == "daz":
            a = np.where(sub(a), a & np.uint32(0x80000000), a).astype(np.uint32)
            return good(a, b)
        r = good(a, b)
        return np.where(sub(r), r & np.uint32(0x80000000), r).astype(np.uint32)

    monkeypatch.setattr(ref, "_add32", planted)
    ref.float32_route_ok.cache_clear()
    try:
        assert not ref.float32_route_ok()
        assert ref.route_for(np.zeros(1, np.uint32), "cuda", "auto") == "softfloat"
        assert ref.route_name("cuda") == ref.ROUTES["softfloat"]
    finally:
        ref.float32_route_ok.cache_clear()


def test_exact_sum_is_math_fsum():
    import math

    rng = np.random.default_rng(3)
    cases = [
        np.zeros(0, np.float32),
        np.array([2.0**127, 2.0**-149, -(2.0**127)], np.float32),
        np.array([1.0, 2.0**-24, 2.0**-24, -1.0], np.float32),
        (rng.uniform(-1, 1, 100_000) * np.exp2(rng.integers(-149, 128, 100_000))).astype(np.float32),
        _dense(8, 64, 4).reshape(-1).view(np.float32),
        np.array([np.inf, 1.0], np.float32),
    ]
    for x in cases:
        x = x[np.isfinite(x)] if x.size > 3 else x
        with np.errstate(all="ignore"):
            x64 = x.astype(np.float64)
        want = (math.fsum(x64), math.fsum(np.abs(x64)))
        assert ref.exact_sum(x) == want, x[:4]


def test_fold_evidence_names_the_reference_route(monkeypatch):
    it = _items(CONTRACT, ["RED-FOLD-sum", "RED-TREE-bitwise", "RED-TREE-bound"])
    assert "float32-numpy (exact:" in it["RED-FOLD-sum"]["evidence"]["reference"]
    assert "float32-numpy (exact:" in it["RED-TREE-bitwise"]["evidence"]["reference"]
    assert "exact_sum" in it["RED-TREE-bound"]["evidence"]["reference"]
    monkeypatch.setattr(ref, "float32_route_ok", lambda: False)
    it = _items(CONTRACT, ["RED-FOLD-mean"])["RED-FOLD-mean"]
    assert it["status"] == "passed" and it["evidence"]["reference"].endswith(ref.ROUTES["softfloat"])


def test_planted_maximum_that_keeps_the_first_of_equal_candidates_is_caught(monkeypatch):
    """A fold max that keeps its accumulator on a tie (max(-0, +0) = -0 when -0 came first) and passes the first NaN's
    payload through: the drawn windows of several equal or NaN candidates (mix "ties") refute it."""
    import numpy as np

    from falsification import reductions_tests as rt
    from obligations.check import check_contract

    def first_of_equals(x, axis=None, device="auto"):
        f = np.moveaxis(np.asarray(x, np.float32), -1 if axis is None else axis, -1)
        f = f.reshape(-1) if axis is None else f
        acc = np.full(f.shape[:-1], -np.inf, np.float32)
        for k in range(f.shape[-1]):
            v = f[..., k]
            keep = np.isnan(acc) | (~np.isnan(v) & (acc >= v))
            acc = np.where(keep, acc, v).astype(np.float32)
        return acc

    monkeypatch.setitem(rt._FOLD_NATIVE, "max", first_of_equals)
    path = Path(__file__).resolve().parent.parent / "contracts" / "reductions-v1.yaml"
    item = check_contract(path, only=["RED-FOLD-max"])["items"][0]
    assert item["status"] == "violated", item.get("reason")
    # the explicit tie windows alone refute it: each holds several equal (or NaN) candidates
    for seed, shape, axis, mix in rt._TIE_CASES:
        bits = rt._input_bits(seed, int(np.prod(shape)), mix, np)[0].reshape(shape)
        x3 = red._axis_view(bits, axis)[2]
        assert rt.tie_windows(bits.reshape(x3)) > 0
    bits = rt._input_bits(0, 45, "ties", np)[0].reshape(5, 9)  # the zeros pool: the maximum is +0
    want = rt._fold_reference("max", bits.reshape(5, 9, 1))
    got = first_of_equals(bits.view(np.float32), axis=1).view(np.uint32)
    assert not np.array_equal(got.reshape(-1), want.reshape(-1))


def test_max_vjp_to_the_last_argmax_is_caught(monkeypatch):
    """Planted: dy routed to the last of several equal maxima: the tie windows refute it."""
    real = red.max_vjp

    def last(x, dy, axis=None, device="auto"):
        ax = -1 if axis is None else axis
        flip = np.flip(np.asarray(x), axis=None if axis is None else ax)
        out = real(flip, dy, axis=axis, device=device)
        return np.flip(np.asarray(out), axis=None if axis is None else ax)

    monkeypatch.setattr(red, "max_vjp", last)
    it = _items(CONTRACT, ["RED-MAX-VJP-bitwise"])["RED-MAX-VJP-bitwise"]
    assert it["status"] == "violated", it["reason"]


def test_dot_and_vjps_on_host():
    x = np.array([[1.0, 2.0**24, 1.0], [-0.0, 0.0, -1.0]], np.float32)
    assert red.dot(x, np.ones_like(x), axis=1, device="host")[0] == np.float32(2.0**24)  # 1 + 2^24 rounds, + 1 again
    g = red.max_vjp(
        np.array([[3.0, 3.0, np.nan, np.nan]], np.float32), np.array([5.0], np.float32), axis=1, device="host"
    )
    np.testing.assert_array_equal(g, np.array([[0.0, 0.0, 5.0, 0.0]], np.float32))  # the first NaN
    g0 = red.max_vjp(np.array([-0.0, 0.0], np.float32), np.float32(1.0), device="host")
    np.testing.assert_array_equal(g0, np.array([0.0, 1.0], np.float32))  # +0 above -0
    m = red.mean_vjp(np.array([1.0], np.float32), (1, 3), axis=1, device="host")
    assert m.view(np.uint32).tolist() == [[np.float32(1 / 3).view(np.uint32)] * 3]


@pytest.mark.cuda
@needs_cuda
def test_dot_and_vjp_kernels_are_bitwise_the_host_path():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 33, 5)).astype(np.float32)
    x[:, 3, :] = x[:, 7, :]  # ties for the argmax
    x[1, 9, 2] = np.nan
    for ax in (None, 0, 1, 2):
        dyx = rng.standard_normal(red._axis_view(x, ax)[1] or ()).astype(np.float32)
        cases = {
            "dot": lambda d, ax=ax: red.dot(x, x[::-1].copy(), axis=ax, device=d),
            "sum_vjp": lambda d, ax=ax, g=dyx: red.sum_vjp(g, x.shape, axis=ax, device=d),
            "mean_vjp": lambda d, ax=ax, g=dyx: red.mean_vjp(g, x.shape, axis=ax, device=d),
            "max_vjp": lambda d, ax=ax, g=dyx: red.max_vjp(x, g, axis=ax, device=d),
        }
        for name, call in cases.items():
            host = np.asarray(call("host"), np.float32).view(np.uint32)
            dev = np.asarray(call("cuda").get(), np.float32).view(np.uint32)
            np.testing.assert_array_equal(dev, host, err_msg=f"{name} axis {ax}")
