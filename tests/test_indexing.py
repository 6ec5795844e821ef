"""Indexing family: the shipped contract on the host, planted bugs caught by their items, CUDA kernels vs the host."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from native import indexing as ni
from obligations.check import check_contract
from spec import indexing as si
from tests.contract_helpers import CONTRACTS, check_items, contract_variant, needs_cuda

CONTRACT = CONTRACTS / "indexing-v1.yaml"


def test_shipped_contract_holds_on_host():
    by = {it["id"]: it for it in check_contract(CONTRACT, device="host")["items"]}
    bad = {k: (v["status"], v["reason"]) for k, v in by.items() if v["status"] in ("violated", "error", "unknown")}
    assert not bad, bad
    for iid in ("IDX-ROWS-inbounds-z3", "IDX-ROWS-refuses-table-size-z3", "IDX-COPY-inbounds-z3", "IDX-ROWS-regimes"):
        assert by[iid]["status"] == "proved", iid
    w = by["IDX-ROWS-regimes"]["evidence"]["witnesses"]["index < rows @reject"]
    assert w["index"] == w["rows"]  # an index equal to the table size is a rejected witness
    assert by["IDX-GATHER-bitwise"]["evidence"]["boundaries_unreached"] == []
    assert by["IDX-SCATTER-ATOMIC-determinism"]["status"] == "violated_expected"
    assert by["IDX-GATHER-VJP-determinism"]["status"] == "passed"
    assert by["IDX-GATHER-VJP-bitwise"]["evidence"]["order_sensitive_cases"] > 0
    assert by["IDX-SANITIZE"]["status"] == "skipped"


def test_row_guard_off_by_one_is_caught_by_the_z3_item(tmp_path):
    path = contract_variant(
        CONTRACT, tmp_path, "plan: native.indexing:rows_plan", "plan: tests.planted.indexing_bugs:rows_plan_off_by_one"
    )
    it = check_items(path, ["IDX-ROWS-inbounds-z3", "IDX-ROWS-refuses-table-size-z3"])
    assert it["IDX-ROWS-inbounds-z3"]["status"] == "violated"
    assert it["IDX-ROWS-refuses-table-size-z3"]["status"] == "violated"


def test_gather_vjp_in_decreasing_order_is_caught(monkeypatch):
    real = ni.gather_vjp

    def reversed_order(dy, idx, rows, device="auto"):
        return real(np.asarray(dy)[::-1], np.asarray(idx)[::-1], rows, device=device)

    monkeypatch.setattr(ni, "gather_vjp", reversed_order)
    it = check_items(CONTRACT, ["IDX-GATHER-VJP-bitwise"])["IDX-GATHER-VJP-bitwise"]
    assert it["status"] == "violated", it["reason"]


def test_guards_refuse_out_of_range_and_duplicates():
    t = np.arange(6, dtype=np.float32).reshape(3, 2)
    for bad in ([3], [-1]):
        with pytest.raises(IndexError):
            ni.gather(t, bad, device="host")
        with pytest.raises(IndexError):
            ni.gather_vjp(np.ones((1, 2), np.float32), bad, 3, device="host")
    with pytest.raises(ValueError):
        ni.index_copy(t, [1, 1], np.zeros((2, 2), np.float32), device="host")
    with pytest.raises(IndexError):
        ni.slice_axis(t, 0, 2, 4, device="host")
    out = ni.gather_vjp(np.array([[1.0], [2.0**25]], np.float32), [0, 0], 2, device="host")
    assert out[0, 0] == np.float32(2.0**25) and out[1, 0] == 0  # 1 first, then 2^25: the 1 is lost to rounding


def _cases(rng: np.random.Generator) -> dict:
    t = rng.standard_normal((7, 3)).astype(np.float32)
    ix = np.array([6, 0, 6, 3, 6], np.int64)
    x = rng.standard_normal((2, 6, 3)).astype(np.float32)
    m = rng.random((2, 6, 3)) < 0.5
    return {
        "gather": lambda d: ni.gather(t, ix, device=d),
        "gather_vjp": lambda d: ni.gather_vjp(x[0, :5], ix, 7, device=d),
        "index_copy": lambda d: ni.index_copy(t, [5, 1], x[0, :2], device=d),
        "where": lambda d: ni.where(m, x, -x, device=d),
        "masked_fill": lambda d: ni.masked_fill(x, m, -np.inf, device=d),
        "slice": lambda d: ni.slice_axis(x, 1, 1, 4, device=d),
        "slice_vjp": lambda d: ni.slice_vjp(x[:, :2], x.shape, 1, 3, device=d),
        "concat": lambda d: ni.concat([x, x[:, :2]], 1, device=d),
        "concat_vjp": lambda d: np.concatenate([np.ravel(v) for v in _host(ni.concat_vjp(x, [2, 4], 1, device=d))]),
        "reduce_to_shape": lambda d: ni.reduce_to_shape(x, (6, 1), device=d),
    }


def _host(a):
    if isinstance(a, list):
        return [_host(v) for v in a]
    return a.get() if hasattr(a, "get") else np.asarray(a)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("op", list(_cases(np.random.default_rng(0))))
def test_cuda_kernel_is_bitwise_the_host_path(op):
    call = _cases(np.random.default_rng(0))[op]
    host = np.ascontiguousarray(_host(call("host")), np.float32).view(np.uint32)
    dev = np.ascontiguousarray(_host(call("cuda")), np.float32).view(np.uint32)
    np.testing.assert_array_equal(dev, host)


@pytest.mark.cuda
@needs_cuda
def test_cuda_atomic_scatter_within_bound_and_contract_on_cuda():
    rng = np.random.default_rng(1)
    ix = rng.integers(0, 4, 1 << 14)
    src = rng.uniform(-1, 1, ix.size).astype(np.float32)
    got = _host(ni.scatter_add_atomic(np.zeros(4, np.float32), ix, src, device="cuda"))
    value, bound = si.atomic_bound(np.zeros(4, np.float32), ix, src)
    assert np.all(np.abs(got.astype(np.float64) - value) <= bound)
    by = {it["id"]: it for it in check_contract(CONTRACT, device="cuda")["items"]}
    bad = {k: (v["status"], v["reason"]) for k, v in by.items() if v["status"] in ("violated", "error", "unknown")}
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("g++") is None, reason="needs g++ (with libasan) to compile the CUDA sources for the host"
)
def test_cuda_sources_match_the_host_path_under_sanitizers():
    """The indexing, reductions-VJP and initializer CUDA text, compiled as C++ under ASan/UBSan, equals the host."""
    from tests.host_cuda import run_under_asan

    res = run_under_asan("indexing")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "indexing: 0 mismatches" in res.stdout
