"""GEMM/BMM: wiring of the contract on the host, planted wrapper bugs caught by their items, the host model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from native import gemm as ng
from obligations.contract import load_contract
from tests.contract_helpers import check_items, contract_variant, needs_cuda

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "contracts" / "gemm-cublas-v1.yaml"
ALL_IDS = [f"PO-GEMM-0{i}" for i in (1, 3, 4, 5, 6, 7, 8)] + [f"FALSIFY-CUBLAS-{i:03d}" for i in range(1, 12)]


def _variant(tmp_path: Path, old: str, new: str) -> Path:
    return contract_variant(CONTRACT, tmp_path, old, new, -1)


def _items(path: Path, ids: list[str], device: str = "host") -> dict[str, dict]:
    return check_items(path, ids, device)


NOT_ADOPTED = {"PO-GEMM-05", "FALSIFY-CUBLAS-004", "FALSIFY-CUBLAS-007"}  # -009: adopted on training-v1's step


def test_every_obligation_and_falsification_test_is_wired_never_silently_dropped():
    # every seed id is either an item or declared not adopted (with a reason), never silently dropped
    declared = {c["id"] for c in load_contract(CONTRACT).data["not_adopted"]}
    assert declared == NOT_ADOPTED
    items = _items(CONTRACT, [i for i in ALL_IDS if i not in NOT_ADOPTED])
    assert set(items) | declared == set(ALL_IDS) and not set(items) & declared
    for iid, it in items.items():
        assert not (it["reason"] or "").startswith("no check wired"), iid
        assert it["status"] in ("passed", "skipped"), (iid, it["status"], it["reason"])
        if it["status"] == "skipped":
            assert it["reason"].startswith(("needs a CUDA device", "runs on cuda")), (
                iid,
                it["reason"],
            )
    for iid in (
        "PO-GEMM-01",
        "PO-GEMM-03",
        "PO-GEMM-06",
        "PO-GEMM-07",
        "PO-GEMM-08",
        "FALSIFY-CUBLAS-001",
        "FALSIFY-CUBLAS-002",
        "FALSIFY-CUBLAS-005",
        "FALSIFY-CUBLAS-006",
        "FALSIFY-CUBLAS-011",
    ):
        assert items[iid]["status"] == "passed", iid
    assert items["PO-GEMM-01"]["evidence"]["layouts"] == ["NN", "NT", "TN", "TT"]
    assert items["PO-GEMM-03"]["evidence"]["calls"] == {"create": 1, "setStream": 3, "gemm": 12, "destroy": 1}


def test_wrong_transpose_flag_is_caught_by_the_layout_item(tmp_path):
    path = _variant(
        tmp_path,
        'params: {impl: "native.gemm:matmul", dtypes: [float32]}',
        'params: {impl: "tests.planted.gemm_kernel_bugs:matmul_wrong_transpose", dtypes: [float32]}',
    )
    it = _items(path, ["FALSIFY-CUBLAS-011"])["FALSIFY-CUBLAS-011"]
    assert it["status"] == "violated", it["reason"]
    assert it["counterexample"]["case"]["trans_a"] != it["counterexample"]["case"]["trans_b"]


def test_tf32_is_caught_on_the_host_model_too(tmp_path):
    path = _variant(
        tmp_path,
        'test: gemm.compute_type\n    params: {impl: "native.gemm:matmul"}',
        'test: gemm.compute_type\n    params: {impl: "tests.planted.gemm_kernel_bugs:matmul_tf32"}',
    )
    it = _items(path, ["PO-GEMM-08"])["PO-GEMM-08"]
    assert it["status"] == "violated" and str(ng.COMPUTE_32F_FAST_TF32) in it["counterexample"]["compute_types"]


@pytest.mark.cuda
@needs_cuda
def test_tf32_switched_on_is_caught_on_the_gpu(tmp_path):
    path = _variant(
        tmp_path,
        'test: gemm.compute_type\n    params: {impl: "native.gemm:matmul"}',
        'test: gemm.compute_type\n    params: {impl: "tests.planted.gemm_kernel_bugs:matmul_tf32"}',
    )
    it = _items(path, ["PO-GEMM-08"], "cuda")["PO-GEMM-08"]
    assert it["status"] == "violated", it["reason"]
    assert it["evidence"]["probe"]["got"] == [64.0]  # the tensor cores really read TF32
    path = _variant(
        tmp_path,
        'params: {impl: "native.gemm:matmul", dtypes: [float32, float16]}',
        'params: {impl: "tests.planted.gemm_kernel_bugs:matmul_tf32", dtypes: [float32]}',
    )
    assert _items(path, ["PO-GEMM-01"], "cuda")["PO-GEMM-01"]["status"] == "violated"


@pytest.mark.cuda
@pytest.mark.quiet_gpu
@needs_cuda
def test_a_bound_call_that_revalidates_every_time_is_caught_by_the_overhead_item(tmp_path):
    path = _variant(
        tmp_path, 'impl: "native.gemm:bind_matmul"', 'impl: "tests.planted.gemm_kernel_bugs:bind_matmul_revalidating"'
    )
    it = _items(path, ["PO-GEMM-04-thin"], "cuda")["PO-GEMM-04-thin"]
    assert it["status"] == "violated", it["reason"]
    thin = it["evidence"]["cases_measured"]["4096x256x1024:float16"]
    assert thin["status"] == "violated" and thin["interval"]["low"] > thin["threshold"]  # misses the whole limit


@pytest.mark.cuda
@pytest.mark.quiet_gpu
@needs_cuda
def test_a_matmul_without_its_call_cache_is_caught_by_the_per_call_overhead_item(tmp_path):
    path = _variant(
        tmp_path,
        'call: per_call\n      impl: "native.gemm:matmul"',
        'call: per_call\n      impl: "tests.planted.gemm_kernel_bugs:matmul_uncached"',
    )
    it = _items(path, ["PO-GEMM-04-matmul"], "cuda")["PO-GEMM-04-matmul"]
    assert it["status"] == "violated", it["reason"]
    thin = it["evidence"]["cases_measured"]["4096x256x1024:float16"]
    assert thin["status"] == "violated" and thin["interval"]["low"] > 1.2  # every call validates and prepares


def test_a_measure_item_names_a_known_call_mode():
    from falsification.gemm_tests import _claimed_call

    assert _claimed_call("per_call", None)[0] == "native.gemm:matmul"
    assert _claimed_call("bound", None)[0] == "native.gemm:bind_matmul"
    with pytest.raises(ValueError, match="params.call"):
        _claimed_call("graph", None)


@pytest.mark.cuda
@needs_cuda
def test_cuda_contract_items_hold():
    perf = {"PO-GEMM-04", "FALSIFY-CUBLAS-003", "FALSIFY-CUBLAS-008", "FALSIFY-CUBLAS-010"}  # kc check reports them
    items = _items(CONTRACT, [i for i in ALL_IDS if i not in perf], "cuda")
    bad = {k: (v["status"], v["reason"]) for k, v in items.items() if v["status"] in ("violated", "error")}
    assert not bad, bad


def test_undersized_buffer_raises_before_the_backend():
    gc = ng.GemmContext(ng.HostBlas(), "host")
    a, b, c = np.zeros(12, np.float32), np.zeros(12, np.float32), np.zeros(8, np.float32)  # C needs 9
    with pytest.raises(ng.BufferTooSmall):
        ng.gemm_raw(gc, a, b, c, 3, 3, 4, 4, 3, 3, False, False)
    assert gc.api.calls["gemm"] == 0 and gc.api.calls["setStream"] == 0


def test_host_model_refuses_out_of_bounds_reads_that_a_bad_flag_would_make():
    with pytest.raises(RuntimeError, match="host BLAS"):
        ng._colmajor(np.zeros(5, np.float32), 2, 3, 2)


def test_batched_fp16_to_fp32_matches_per_batch_products():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4, 5)).astype(np.float16)
    b = rng.standard_normal((3, 6, 5)).astype(np.float16)
    got = ng.bmm(a, b, trans_b=True, out_dtype="float32", device="host")
    want = np.stack([a[i].astype(np.float64) @ b[i].astype(np.float64).T for i in range(3)])
    np.testing.assert_allclose(got, want, rtol=1e-6)  # fp16 products are exact in fp32


def test_prepared_calls_are_reused_per_signature_and_never_alias_outputs():
    ng.close_contexts()
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    first, second = ng.matmul(a, b, device="host"), ng.matmul(a, b, device="host")
    assert first is not second and np.array_equal(first, second)
    api = ng.get_context("host").api
    entries = len(ng._PREPARED)
    c = np.zeros((5, 4), np.float32)
    before = api.calls["gemm"]
    for _ in range(3):
        ng.matmul(a, b, c=c, device="host")
    assert api.calls["gemm"] - before == 3 and len(ng._PREPARED) == entries + 1  # one prepare, three calls
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-6)
    at = np.ascontiguousarray(a.T)
    np.testing.assert_allclose(ng.matmul(at, b, trans_a=True, device="host"), c, rtol=1e-6)
    np.testing.assert_allclose(ng.matmul(a.T.T[:, :2], b[:2], device="host"), a[:, :2] @ b[:2], rtol=1e-6)
    with pytest.raises(ValueError, match="C must be"):
        ng.matmul(a, b, c=np.zeros((4, 5), np.float32), device="host")


def test_the_first_call_of_an_unregistered_array_class_registers_it_and_is_cached(monkeypatch):
    monkeypatch.setattr(ng, "_CALL_KEYS", {})
    monkeypatch.setattr(ng, "_PREPARED", {})
    a = np.ones((3, 2), np.float32)
    ng.matmul(a, a.T.copy(), device="host")
    assert list(ng._CALL_KEYS) == [np.ndarray] and len(ng._PREPARED) == 1


def test_closing_the_context_drops_its_prepared_calls():
    a = np.ones((2, 2), np.float32)
    ng.matmul(a, a, device="host")
    ctx = ng.get_context("host")
    assert any(call.context is ctx for call in ng._PREPARED.values())
    ng.close_contexts()
    assert not any(call.context is ctx for call in ng._PREPARED.values())
    assert np.array_equal(ng.matmul(a, a, device="host"), 2 * a) and ng.get_context("host") is not ctx


def _same_arrays_on_the_host(monkeypatch):
    # The same-arrays path admits CuPy's arrays only; NumPy's stand in here (their shape is settable in place too).
    monkeypatch.setattr(ng, "_SAME", {})
    monkeypatch.setattr(ng, "_SAME_ARRAYS", {np.ndarray: lambda: 0})
    monkeypatch.setattr(ng, "_LAST_IDS", [None])


def test_the_same_arrays_path_runs_the_prepared_call_and_counts_it(monkeypatch):
    _same_arrays_on_the_host(monkeypatch)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    c = np.zeros((6, 3), np.float32)
    ng.matmul(a, b, c=c, device="host")  # prepares
    ng.matmul(a, b, c=c, device="host")  # cached; the triple seen once
    assert not ng._SAME
    ng.matmul(a, b, c=c, device="host")  # cached; the same triple twice in a row: remembered
    assert list(ng._SAME) == [id(c)]
    api = ng.get_context("host").api
    before = api.calls["gemm"]
    a[...] = 2 * a  # later writes are seen: the path reads the buffers, it does not replay a result
    got = ng.matmul(a, b, c=c, device="host")
    assert got is c and api.calls["gemm"] - before == 1
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-6)
    other = np.zeros((6, 3), np.float32)
    ng.matmul(a, b, c=other, device="host")  # another C: not this entry
    assert np.array_equal(other, c)


def test_the_same_arrays_path_never_runs_a_stale_call(monkeypatch):
    _same_arrays_on_the_host(monkeypatch)
    a, b, c = np.ones((4, 6), np.float32), np.ones((6, 4), np.float32), np.zeros((4, 4), np.float32)
    for _ in range(3):
        ng.matmul(a, b, c=c, device="host")
    assert ng._SAME
    # Options that differ from the remembered call's: its entry is dropped, the right call runs.
    d = np.zeros((4, 4), np.float32)
    for _ in range(3):
        ng.matmul(a, b, c=d, device="host")
    np.testing.assert_allclose(ng.matmul(a, b, c=d, alpha=2.0, device="host"), 12.0)
    # A shape set in place (same buffer): the remembered (4, 6) x (6, 4) call must not run on (6, 4) x (6, 4).
    a.shape = (6, 4)
    with pytest.raises(ValueError, match="do not match"):
        ng.matmul(a, b, c=c, device="host")
    a.shape = (4, 6)
    # A closed context: the remembered parts are not used, a new context runs the call.
    for _ in range(3):
        ng.matmul(a, b, c=c, device="host")
    old = ng.get_context("host")
    ng.close_contexts()
    c[...] = 0
    np.testing.assert_allclose(ng.matmul(a, b, c=c, device="host"), 6.0)
    assert ng.get_context("host") is not old
    # A dead array's id reused by a new array: its weak reference is dead, the entry is not used.
    for _ in range(3):
        ng.matmul(a, b, c=c, device="host")
    entry = ng._SAME[id(c)]
    del a
    assert entry[0]() is None


def test_a_cache_keyed_without_shapes_is_caught_by_the_agreement_item(tmp_path):
    ng.close_contexts()
    path = _variant(
        tmp_path,
        'params: {impl: "native.gemm:matmul", dtypes: [float32, float16]}',
        'params: {impl: "tests.planted.gemm_kernel_bugs:matmul_stale_cache", dtypes: [float32, float16]}',
    )
    it = _items(path, ["PO-GEMM-01"])["PO-GEMM-01"]
    assert it["status"] == "violated" and "disagrees" in it["reason"], it["reason"]  # a stale result is refuted


def test_a_bound_call_runs_on_its_buffers_and_sees_later_writes():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32)
    call = ng.bind_matmul(a, b, device="host")
    api = ng.get_context("host").api
    before = api.calls["gemm"]
    assert call() is call.c
    np.testing.assert_allclose(call.c, a.astype(np.float64) @ b, rtol=1e-6)
    a[:] = 2 * a
    call()
    np.testing.assert_allclose(call.c, a.astype(np.float64) @ b, rtol=1e-6)
    assert api.calls["gemm"] - before == 2 and api.compute_types[ng.COMPUTE_32F] >= 2
    with pytest.raises(ValueError, match="binds C-contiguous"):
        ng.bind_matmul(np.asfortranarray(a), b, device="host")


def test_binding_undersized_buffers_raises_before_the_backend():
    gc = ng.GemmContext(ng.HostBlas(), "host")
    a, b, c = np.zeros(12, np.float32), np.zeros(12, np.float32), np.zeros(8, np.float32)  # C needs 9
    with pytest.raises(ng.BufferTooSmall):
        ng.bind_gemm(gc, a, b, c, 3, 3, 4, 4, 3, 3, False, False)
    assert gc.api.calls["gemm"] == 0


def test_a_backend_that_does_not_run_on_the_current_stream_is_refused():
    class Unbound(ng.HostBlas):
        binds_current_stream = False

    with pytest.raises(TypeError, match="current stream"):
        ng.GemmContext(Unbound(), "host")


def _backends() -> list:
    from tests.contract_helpers import CUDA_OK

    return [ng.HostBlas] + ([ng.CupyBlas] if CUDA_OK else [])


@pytest.mark.parametrize("backend", _backends(), ids=lambda b: b.name)
def test_every_blas_backend_conforms(backend):
    """The extension point's contract: handle lifecycle, prepare and bind compute column-major gemmEx."""
    from obligations.core.device import array_module, to_host

    assert issubclass(backend, ng.BlasBackend) and backend.binds_current_stream
    api = backend()
    xp = array_module("cuda" if backend is ng.CupyBlas else "host")
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    want = a.astype(np.float64) @ b
    handle = api.create()
    try:
        # Row-major C = A B as column-major C^T = B^T A^T: cuBLAS (m, n, k) = (4, 5, 3), B first.
        args = (handle, ng.OP_N, ng.OP_N, 4, 5, 3, 1.0, 4, 0, 3, 0, 0.0, 4, 0, 1, ng.COMPUTE_32F, a.dtype, a.dtype)
        da, db = xp.asarray(a.ravel()), xp.asarray(b.ravel())
        c1, c2 = xp.zeros(20, xp.float32), xp.zeros(20, xp.float32)
        run = api.prepare(*args)
        run(db, da, c1)
        api.bind(*args, db, da, c2)()
        for c in (c1, c2):
            np.testing.assert_allclose(to_host(c).reshape(5, 4), want, rtol=1e-5, atol=1e-6)
        # bind_unowned: None, or bind's call holding no buffer (only their pointers): the same bits
        import gc
        import sys

        c3 = xp.zeros(20, xp.float32)
        refs = sys.getrefcount(c3)
        unowned = api.bind_unowned(*args, db, da, c3)
        if unowned is not None:
            gc.collect()
            assert sys.getrefcount(c3) == refs  # it keeps no reference to the buffers
            unowned()
            assert np.array_equal(to_host(c3).view(np.uint32), to_host(c1).view(np.uint32))
    finally:
        api.destroy(handle)


def test_mfu_formula_and_the_split_of_po_gemm_05():
    from falsification.gemm_tests import PEAK_FLOPS, mfu

    assert mfu(370_000_000, 4096, 1.0) == 6 * 370_000_000 * 4096 / PEAK_FLOPS
    items = _items(CONTRACT, ["PO-GEMM-05-floor", "FALSIFY-CUBLAS-002"])
    # the PTX comparison is declared scope, not an item: it has no status, only its reason
    not_adopted = {c["id"]: c for c in load_contract(CONTRACT).data["not_adopted"]}
    assert set(not_adopted) == NOT_ADOPTED
    assert "PTX" in not_adopted["PO-GEMM-05"]["reason"]
    assert items["PO-GEMM-05-floor"]["status"] == "skipped" and "cuda" in items["PO-GEMM-05-floor"]["reason"]
    assert items["FALSIFY-CUBLAS-002"]["status"] == "passed"
    assert "float64" in items["FALSIFY-CUBLAS-002"]["evidence"]["baseline"]


def test_the_mfu_floors_model_is_drawn_in_float32_from_the_small_models_distributions():
    """gemm.mfu_floor draws its model on the device (#24: the host's draws were ~0.4 s of the quiet phase); the
    drawing is array-module generic, so NumPy checks it here: shapes, float32, spreads, t = tanh(x W / 4)."""
    from falsification.gemm_tests import drawn_model

    x, t, w1, w2 = drawn_model(np, np.random.default_rng(0), 512, 64, 256, 32)
    assert [a.shape for a in (x, t, w1, w2)] == [(512, 64), (512, 32), (64, 256), (256, 32)]
    assert {a.dtype for a in (x, t, w1, w2)} == {np.dtype(np.float32)}
    assert 0.9 < x.std() < 1.1 and 0.9 < w1.std() * 8 < 1.1 and 0.9 < w2.std() * 16 < 1.1
    assert np.abs(t).max() < 1 and 0.2 < t.std() < 2  # tanh of x W / 4: spread ~ sqrt(64) / 4 before the tanh


def test_a_closed_context_keeps_its_handle_until_its_last_bound_call_is_gone():
    # A bound call checks nothing per call (one frame, as a raw cuBLAS call): the handle in its C-level partial
    # must therefore outlive it, so close() destroys the handle only when the last bound call is collected.
    gc = ng.GemmContext(ng.HostBlas(), "host")
    a, b = np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
    ints = (2, 2, 3, 3, 2, 2)  # row-major 2x3 @ 3x2: m, n, k, lda, ldb, ldc
    call = ng.bind_gemm(gc, a.ravel(), b.ravel(), np.zeros(4, np.float32), *ints, False, False)
    gc.close()
    assert gc.api.calls["destroy"] == 0  # the bound call still holds the handle
    np.testing.assert_array_equal(call(), np.full(4, 3.0, np.float32))  # and runs on it
    del call
    import gc as collector

    collector.collect()
    assert gc.api.calls["destroy"] == 1
    other = ng.GemmContext(ng.HostBlas(), "host")
    other.close()  # no bound call: destroyed at once
    assert other.api.calls["destroy"] == 1


def test_matmul_vjp_without_the_transpose_of_b_is_caught(monkeypatch):
    """Planted: dA = dC op(B) (the transpose forgotten): PO-GEMM-VJP refutes it (wrong values or a shape refused)."""
    real = ng.matmul_vjp

    def forgot(a, b, dc, *, trans_a=False, trans_b=False, device="auto"):
        _, db = real(a, b, dc, trans_a=trans_a, trans_b=trans_b, device=device)
        return ng.matmul(dc, b, trans_b=trans_b, device=device), db

    monkeypatch.setattr(ng, "matmul_vjp", forgot)
    it = check_items(CONTRACT, ["PO-GEMM-VJP"])["PO-GEMM-VJP"]
    assert it["status"] == "violated", it["reason"]


@pytest.mark.cuda
@needs_cuda
def test_training_entry_points_on_cuda():
    by = check_items(CONTRACT, ["PO-GEMM-VJP", "PO-GEMM-LINEAR", "PO-GEMM-ADDMM"], device="cuda")
    assert all(it["status"] == "passed" for it in by.values()), {k: v["reason"] for k, v in by.items()}


@pytest.mark.cuda
@needs_cuda
def test_the_same_arrays_path_on_cupy_gives_the_bound_calls_bits_on_any_stream():
    import cupy

    rng = cupy.random.RandomState(3)
    a = rng.standard_normal((64, 32), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((32, 48), dtype=cupy.float32).astype(cupy.float16)
    c, want = cupy.zeros((64, 48), cupy.float16), cupy.zeros((64, 48), cupy.float16)
    ng.bind_matmul(a, b, want, device="cuda")()
    for _ in range(3):
        ng.matmul(a, b, c=c, device="cuda")
    assert id(c) in ng._SAME  # the same three arrays twice in a row: remembered
    c[...] = 0
    ng.matmul(a, b, c=c, device="cuda")  # the same-arrays path
    assert cupy.array_equal(c.view(cupy.uint16), want.view(cupy.uint16))
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        c[...] = 0
        ng.matmul(a, b, c=c, device="cuda")  # on the caller's current stream (CuPy's binding sets it per call)
        side.synchronize()
    assert cupy.array_equal(c.view(cupy.uint16), want.view(cupy.uint16))
    a.shape = (32, 64)  # a shape set in place: the remembered call must not run
    with pytest.raises(ValueError, match="do not match"):
        ng.matmul(a, b, c=c, device="cuda")
