"""The fused ULP distance (falsification.agreement.ULP_DISTANCE_BODY, CuPy's path) equals the array code.

The body of the CuPy elementwise kernel is compiled for the host and compared with the array code of
:func:`falsification.agreement.ulp_distance` (softfloat's distance, NaN rules) on every pair of edge operands
and a dense random sample; a planted change (signed zeros apart) is caught. On CUDA the kernel itself is
compared. :func:`falsification.agreement.max_finite` is the boolean-indexed maximum it replaces.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from falsification import agreement as ag
from obligations.core.device import cuda_available
from spec import reductions as red

CUDA_OK, _ = cuda_available()


def _build(tmp_path_factory: pytest.TempPathFactory, body: str) -> ctypes.CDLL:
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    d = tmp_path_factory.mktemp("ulp")
    src, lib = d / "ulp.cpp", d / "libulp.so"
    src.write_text(
        'extern "C" void kc_ulp(const unsigned* A, const unsigned* B, long long* D, long n) {\n'
        "  for (long i = 0; i < n; ++i) { const unsigned a = A[i], b = B[i]; long long d;\n"
        + body
        + "\n  D[i] = d; }\n}\n"
    )
    subprocess.run([cxx, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return ctypes.CDLL(str(lib))


def _pairs() -> tuple[np.ndarray, np.ndarray]:
    e = red.EDGES
    a, b = (g.reshape(-1) for g in np.meshgrid(e, e, indexing="ij"))
    rng = np.random.default_rng(0)
    ra = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    rb = ra ^ rng.integers(0, 1 << 12, ra.size, dtype=np.uint64).astype(np.uint32)  # near pairs
    rc = rng.integers(0, 1 << 32, ra.size, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([a, ra, ra]), np.concatenate([b, rb, rc])


def _host(lib: ctypes.CDLL, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d = np.zeros(a.size, dtype=np.int64)
    lib.kc_ulp(
        a.ctypes.data_as(ctypes.c_void_p), b.ctypes.data_as(ctypes.c_void_p), d.ctypes.data_as(ctypes.c_void_p), a.size
    )
    return d


def test_fused_body_equals_the_array_code(tmp_path_factory):
    a, b = _pairs()
    assert np.array_equal(_host(_build(tmp_path_factory, ag.ULP_DISTANCE_BODY), a, b), ag.ulp_distance(a, b))


def test_a_planted_change_in_the_body_is_caught(tmp_path_factory):
    planted = ag.ULP_DISTANCE_BODY.replace("-(long long)ma : (long long)ma", "-(long long)ma - 1 : (long long)ma")
    assert planted != ag.ULP_DISTANCE_BODY
    a, b = _pairs()
    assert not np.array_equal(_host(_build(tmp_path_factory, planted), a, b), ag.ulp_distance(a, b))


def test_max_finite_is_the_masked_maximum():
    d = np.array([3, ag.NAN_MISMATCH, 0, 7, ag.NAN_MISMATCH], dtype=np.int64)
    assert ag.max_finite(d) == 7
    assert ag.max_finite(np.array([ag.NAN_MISMATCH], dtype=np.int64)) is None
    assert ag.max_finite(np.zeros(0, dtype=np.int64)) is None
    c = ag.make_agreement("bitwise").compare(np.array([1, 2], np.uint32), np.array([1, 5], np.uint32))
    assert c.summary == {
        "kind": "bitwise",
        "elements": 2,
        "disagreements": 1,
        "max_ulp": 3,
        "nan_mismatches": 0,
    }


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_OK, reason="no CUDA device")
def test_fused_kernel_on_the_device_equals_the_array_code():
    import cupy

    a, b = _pairs()
    got = ag.ulp_distance(cupy.asarray(a), cupy.asarray(b))
    assert got.dtype == cupy.int64 and np.array_equal(cupy.asnumpy(got), ag.ulp_distance(a, b))
