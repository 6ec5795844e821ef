"""matmul's call cache: the key covers everything that changes the call (planted short keys are caught), and the
cached path computes what the uncached path computes, bit for bit (CUDA)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from native import gemm as ng
from tests.contract_helpers import needs_cuda

# -- host: what the key must tell apart --------------------------------------------------------------------------


def _base() -> dict[str, Any]:
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((4, 4)).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32)
    return {"a": a, "b": b, "c": np.full((4, 4), 0.5, np.float32)}


def _variants() -> dict[str, dict[str, Any]]:
    """Calls that differ from the base call in one thing the prepared call depends on (same shapes unless named)."""
    base = _base()
    a, b = base["a"], base["b"]
    return {
        "shape": {"a": a[:, :3].copy(), "b": b[:3].copy()},
        "strides": {"a": np.asfortranarray(a)},  # same shape and dtype, another layout
        "dtype": {"a": a.astype(np.float16), "b": b.astype(np.float16), "c": base["c"].astype(np.float16)},
        "c dtype": {"c": base["c"].astype(np.float16)},
        "c absent": {"c": None},
        "trans_a": {"trans_a": True},
        "trans_b": {"trans_b": True},
        "alpha": {"alpha": 2.0},
        "beta": {"beta": 1.0},
        "compute": {"compute": ng.COMPUTE_32F_FAST_TF32},
    }


def _want(call: dict[str, Any]) -> np.ndarray:
    a, b = call["a"].astype(np.float64), call["b"].astype(np.float64)
    if call.get("compute") == ng.COMPUTE_32F_FAST_TF32:
        a, b = ng._tf32(call["a"]).astype(np.float64), ng._tf32(call["b"]).astype(np.float64)
    a = a.T if call.get("trans_a") else a
    b = b.T if call.get("trans_b") else b
    r = call.get("alpha", 1.0) * (a @ b)
    if call.get("beta", 0.0) and call.get("c") is not None:
        r = r + call["beta"] * call["c"].astype(np.float64)
    return r


def _reused(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Run the base call, then each variant after it: the variants that reused the base's prepared call (no
    prepare of their own) or whose result is wrong, with what went wrong."""
    prepares = []
    real_prepare = ng.prepare_gemm
    monkeypatch.setattr(ng, "prepare_gemm", lambda *a, **k: prepares.append(1) or real_prepare(*a, **k))
    monkeypatch.setattr(ng, "_PREPARED", {})
    bad = {}
    for name, change in _variants().items():
        ng.clear_calls()
        for call in (_base(), {**_base(), **change}):
            c = call["c"] if call["c"] is None else call["c"].copy()
            opts = {k: call[k] for k in ("trans_a", "trans_b", "alpha", "beta", "compute") if k in call}
            before = len(prepares)
            got = ng.matmul(call["a"], call["b"], c=c, device="host", **opts)
        if len(prepares) == before:
            bad[name] = "reused the base call's prepared call"
        tol = 1e-2 if call["a"].dtype == np.float16 or (c is not None and c.dtype == np.float16) else 1e-5
        if not np.allclose(got.astype(np.float64), _want(call), rtol=tol, atol=tol):
            bad.setdefault(name, "wrong result")
    return bad


def test_no_call_reuses_a_prepared_call_made_for_another_layout_dtype_or_option(monkeypatch):
    assert _reused(monkeypatch) == {}


# Planted short keys: each drops one thing the prepared call depends on.
_PLANTED = {
    "strides": lambda a, b, c, *o: (a.shape, a.dtype, b.shape, b.dtype, None if c is None else (c.shape, c.dtype), *o),
    "dtype": lambda a, b, c, *o: (a.shape, a.strides, b.shape, b.strides, None if c is None else c.shape, *o),
    "trans_a": lambda a, b, c, ta, *o: ng._numpy_key(a, b, c, False, *o),
    "alpha": lambda a, b, c, ta, tb, alpha, *o: ng._numpy_key(a, b, c, ta, tb, 1.0, *o),
}


@pytest.mark.parametrize("dropped", sorted(_PLANTED))
def test_a_key_that_drops_what_the_call_depends_on_is_caught(monkeypatch, dropped):
    monkeypatch.setattr(ng, "_CALL_KEYS", {np.ndarray: _PLANTED[dropped]})
    caught = _reused(monkeypatch)
    assert any(dropped in name for name in caught), caught  # e.g. "dtype" shows on the fp16 C of fp32 operands


def test_a_negative_zero_alpha_is_not_served_the_positive_zero_call(monkeypatch):
    # -0.0 == 0.0 as floats (one dict slot), but alpha = -0.0 makes every zero product negative.
    monkeypatch.setattr(ng, "_PREPARED", {})
    a = np.ones((2, 2), np.float32)
    assert not np.signbit(ng.matmul(a, a, alpha=0.0, device="host")).any()
    assert np.signbit(ng.matmul(a, a, alpha=-0.0, device="host")).all()
    ng.matmul(a, a, alpha=float("nan"), device="host")
    assert ng._PREPARED == {}  # neither zero nor NaN (never equal to itself) is cached


def test_the_cached_path_is_a_lookup_and_the_prepared_call(monkeypatch):
    # The second call of a key prepares nothing and runs the backend once (the count is the call's own).
    monkeypatch.setattr(ng, "_PREPARED", {})
    a = np.ones((3, 3), np.float32)
    ng.matmul(a, a, device="host")
    monkeypatch.setattr(ng, "prepare_gemm", lambda *x, **k: pytest.fail("a cached key prepared again"))
    api = ng.get_context("host").api
    before = api.calls["gemm"]
    np.testing.assert_array_equal(ng.matmul(a, a, device="host"), np.full((3, 3), 3.0, np.float32))
    assert api.calls["gemm"] - before == 1


# -- CUDA: the cached path against the uncached path, bit for bit --------------------------------------------------

_CUDA_CASES = [
    ((4096, 256, 1024), "float16", False, False),
    ((256, 256, 256), "float16", True, False),
    ((512, 512, 512), "float32", False, True),
    ((96, 200, 72), "float32", True, True),
]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("shape,dtype,ta,tb", _CUDA_CASES)
def test_cached_bound_and_uncached_calls_agree_bit_for_bit(shape, dtype, ta, tb):
    import cupy

    m, k, n = shape
    rng = cupy.random.RandomState(5)
    a = rng.standard_normal((k, m) if ta else (m, k), dtype=cupy.float32).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=cupy.float32).astype(dtype)
    opts = {"trans_a": ta, "trans_b": tb, "device": "cuda"}
    ng.clear_calls()
    uncached = ng.matmul(a, b, **opts)  # prepared now
    ng.clear_calls()
    first = ng.matmul(a, b, c=cupy.full_like(uncached, 7), **opts)  # prepared for c given
    cached = [ng.matmul(a, b, c=cupy.full_like(uncached, 7), **opts) for _ in range(3)]
    cached_new_c = ng.matmul(a, b, **opts)
    bound = ng.bind_matmul(a, b, cupy.full_like(uncached, 7), trans_a=ta, trans_b=tb, device="cuda")
    bound()
    bits = uncached.view(cupy.uint16 if dtype == "float16" else cupy.uint32)
    for got in (first, *cached, cached_new_c, bound.c):
        assert cupy.array_equal(got.view(bits.dtype), bits)


@pytest.mark.cuda
@needs_cuda
def test_a_cached_call_runs_on_the_callers_current_stream():
    # The key has no stream: one prepared call serves every stream, because the binding sets the current stream
    # on each call. A call that ran on the stream it was prepared on would finish while this stream still spins.
    import cupy

    a = cupy.ones((512, 512), cupy.float32)
    c = cupy.zeros((512, 512), cupy.float32)
    ng.clear_calls()
    ng.matmul(a, a, c=cupy.zeros_like(c), device="cuda")  # prepared on the default stream
    early = _behind_a_spin(lambda: ng.matmul(a, a, c=c, device="cuda"), c)
    assert not early.any(), "the cached call did not wait for its caller's stream"
    assert bool((c == 512).all())


def _behind_a_spin(call, c):  # noqa: ANN001, ANN202
    """Run ``call`` on a stream busy with a ~1 s spin kernel; return ``c`` as another stream reads it meanwhile
    (all zeros where ``call`` ran on its caller's stream, behind the spin)."""
    import cupy

    from falsification.gemm_tests import _SPIN

    spin = cupy.RawKernel(_SPIN, "kc_spin")
    busy, reader = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    with busy:
        spin((1,), (1,), (np.int64(2_000_000_000),))  # about a second on any current GPU
        call()
    with reader:
        early = c.get(stream=reader)
    reader.synchronize()
    busy.synchronize()
    return early


@pytest.mark.cuda
@needs_cuda
def test_the_same_arrays_path_replays_a_cuda_graph_on_the_current_stream():
    # Calls on the same arrays: from the fourth on a hit, whose GEMM is a captured graph bound to the arrays'
    # pointers. It must read the arrays' contents at launch (not at capture), run on the caller's current stream,
    # and never be launched into a caller's own capture (the bound call runs there, which CuPy refuses as before).
    import cupy

    rng = cupy.random.RandomState(3)
    a = rng.standard_normal((256, 128), dtype=cupy.float32)
    b = rng.standard_normal((128, 64), dtype=cupy.float32)
    c = cupy.zeros((256, 64), cupy.float32)
    ng.clear_calls()
    for _ in range(3):
        ng.matmul(a, b, c=c, device="cuda")
    call = ng._SAME[id(c)][-1]
    assert isinstance(call, ng.GraphedCall) and ng.matmul_path(c) == "graph", type(call)
    assert call.launches == 0  # the third call kept the arrays and ran the prepared call; the fourth launches
    ng.matmul(a, b, c=c, device="cuda")
    assert call.launches == 1
    assert cupy.array_equal(c.view(cupy.uint32), ng.matmul(a, b, device="cuda").view(cupy.uint32))
    a[...] = rng.standard_normal((256, 128), dtype=cupy.float32)  # new contents, the same buffer
    ng.matmul(a, b, c=c, device="cuda")
    assert call.launches == 2
    assert cupy.array_equal(c.view(cupy.uint32), ng.matmul(a, b, device="cuda").view(cupy.uint32))
    want = c.copy()
    c.fill(0)
    cupy.cuda.Device().synchronize()
    early = _behind_a_spin(lambda: ng.matmul(a, b, c=c, device="cuda"), c)
    assert not early.any(), "the graph did not run on its caller's stream"
    assert cupy.array_equal(c, want) and call.launches == 3
    capture = cupy.cuda.Stream(non_blocking=True)
    with capture:
        capture.begin_capture()
        try:  # a graph cannot be launched into a capture: the bound call runs, which CuPy refuses there as before
            with pytest.raises(NotImplementedError):
                ng.matmul(a, b, c=c, device="cuda")
        finally:
            capture.end_capture()
    assert call.launches == 3 and ng.matmul_path(c) == "graph"
    ng.GRAPHS = False
    try:  # without graphs the same arrays take the bound call
        ng.clear_calls()
        for _ in range(3):
            ng.matmul(a, b, c=c, device="cuda")
        assert ng.matmul_path(c) == "bound" and cupy.array_equal(c, want)
    finally:
        ng.GRAPHS = True
