"""The fused softfloat kernels (spec.softfloat.device) are bit-identical to the array code.

On the host the very CUDA source is compiled by the C++ compiler (count-leading-zeros from the compiler
builtins) and run against the NumPy run of spec.softfloat on edge classes and dense samples, in every
rounding mode and environment. On CUDA the device kernels are checked the same way against the host.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from obligations.core.device import cuda_available
from spec import softfloat as sf
from spec.softfloat import device as sfd

CUDA_OK, _ = cuda_available()
OPS = ("add", "sub", "mul", "div", "fma", "sqrt")
ENVS = tuple(sf.ENVIRONMENTS)

EDGES = [
    0x00000000,
    0x00000001,
    0x00000002,
    0x00000003,
    0x007FFFFF,
    0x007FFFFE,
    0x00400000,
    0x00800000,
    0x00800001,
    0x00FFFFFF,
    0x01000000,
    0x0B800000,
    0x33800000,
    0x33800001,
    0x34000000,
    0x3F000000,
    0x3F7FFFFF,
    0x3F800000,
    0x3F800001,
    0x3F800002,
    0x3FFFFFFF,
    0x40000000,
    0x4B000000,
    0x4B7FFFFF,
    0x5F800000,
    0x7E800000,
    0x7F000000,
    0x7F7FFFFE,
    0x7F7FFFFF,
    0x7F800000,
    0x7F800001,
    0x7FA00000,
    0x7FC00000,
    0x7FC00001,
    0x7FFFFFFF,
]
EDGES = EDGES + [e | 0x80000000 for e in EDGES]


def operands(arity: int, seed: int = 7, n_random: int = 60000) -> list[np.ndarray]:
    """Every edge pair (or edge x edge x random triple) plus random patterns, near-ties and cancellations."""
    rng = np.random.default_rng(seed)
    edges = np.array(EDGES, dtype=np.uint32)
    cols: list[list[np.ndarray]] = [[] for _ in range(arity)]
    if arity == 1:
        cols[0].append(edges)
    else:
        g = np.meshgrid(*([edges] * 2), indexing="ij")
        for k in range(2):
            cols[k].append(g[k].reshape(-1))
        for k in range(2, arity):
            cols[k].append(rng.choice(edges, g[0].size))
    uni = [rng.integers(0, 1 << 32, n_random, dtype=np.uint64).astype(np.uint32) for _ in range(arity)]
    # near exponents (cancellation, ties), small exponents (subnormal results), large ones (overflow)
    base = rng.integers(0, 1 << 32, n_random, dtype=np.uint64).astype(np.uint32)
    near = [base ^ (rng.integers(0, 1 << 8, n_random, dtype=np.uint32) << np.uint32(rng.integers(0, 24)))]
    near += [rng.integers(0, 1 << 32, n_random, dtype=np.uint64).astype(np.uint32) for _ in range(arity - 1)]
    near[0], near[-1] = near[-1], near[0]
    if arity > 1:
        near[1] = base
    exps = rng.choice(np.array([0, 1, 2, 20, 40, 60, 63, 64, 65, 100, 127, 190, 230, 253, 254], np.uint32), n_random)
    small = [
        (rng.integers(0, 1 << 23, n_random, dtype=np.uint32) | (exps << np.uint32(23)))
        | (rng.integers(0, 2, n_random, dtype=np.uint32) << np.uint32(31))
        for _ in range(arity)
    ]
    ties = [np.full(n_random, 0x3F800000, np.uint32) | rng.integers(0, 4, n_random, dtype=np.uint32)]
    ties += [
        np.uint32(0x33800000) | rng.integers(0, 2, n_random, dtype=np.uint32) << np.uint32(31) for _ in range(arity - 1)
    ]
    # operands whose result lies at the underflow boundary: near-one times near-2^-126 (tininess after rounding)
    sgn = [rng.integers(0, 2, n_random, dtype=np.uint32) << np.uint32(31) for _ in range(arity)]
    one = np.uint32(0x3F800000) - np.uint32(32) + rng.integers(0, 64, n_random, dtype=np.uint32)
    tiny = np.uint32(0x00800000) - np.uint32(32) + rng.integers(0, 64, n_random, dtype=np.uint32)
    boundary = [(one if k == 0 else tiny) | sgn[k] for k in range(arity)]
    for group in (uni, near, small, ties, boundary):
        for k in range(arity):
            cols[k].append(np.asarray(group[k], dtype=np.uint32))
    return [np.concatenate(c) for c in cols]


def reference(op: str, ops: list[np.ndarray], rounding: str, env: str) -> np.ndarray:
    """The array code (NumPy) of ``op``."""
    return getattr(sf, op)(*ops, rounding=rounding, env=env)


_HARNESS = r"""
extern "C" void kc_host_run(int op, const kc_u32* a, const kc_u32* b, const kc_u32* c, kc_u32* r, long n,
                            int rnd, int ftz, int daz, int nanc, int tin, kc_u32 dn) {
    const KcEnv env = {rnd, ftz, daz, nanc, tin, dn};
    for (long i = 0; i < n; ++i) {
        switch (op) {
        case 0: r[i] = kc_sf_add(a[i], b[i], 0, env); break;
        case 1: r[i] = kc_sf_add(a[i], b[i], 1, env); break;
        case 2: r[i] = kc_sf_mul(a[i], b[i], env); break;
        case 3: r[i] = kc_sf_div(a[i], b[i], env); break;
        case 4: r[i] = kc_sf_fma(a[i], b[i], c[i], env); break;
        default: r[i] = kc_sf_sqrt(a[i], env); break;
        }
    }
}
"""


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler to build the kernel source")
    d = tmp_path_factory.mktemp("sfdev")
    src, lib = d / "sf.cpp", d / "libsf.so"
    src.write_text("#define KC_SOFTFLOAT_HOST 1\n" + sfd.SOURCE + _HARNESS)
    subprocess.run([cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return ctypes.CDLL(str(lib))


def host_run(lib, op: str, ops: list[np.ndarray], rounding: str, env: str) -> np.ndarray:
    """The kernel source compiled for the host, on NumPy operands."""
    n = ops[0].size
    full = [np.ascontiguousarray(o, dtype=np.uint32) for o in ops] + [np.zeros(n, np.uint32)] * (3 - len(ops))
    out = np.empty(n, np.uint32)
    p = ctypes.POINTER(ctypes.c_uint32)
    args = sfd.env_args(rounding, sf.get_env(env))
    lib.kc_host_run(
        ctypes.c_int(OPS.index(op)),
        *[o.ctypes.data_as(p) for o in full],
        out.ctypes.data_as(p),
        ctypes.c_long(n),
        *[ctypes.c_int(v) for v in args[:5]],
        ctypes.c_uint32(args[5]),
    )
    return out


def _first_diff(ops, got, want):
    i = int(np.flatnonzero(got != want)[0])
    return {"operands": [hex(int(o[i])) for o in ops], "kernel": hex(int(got[i])), "array_code": hex(int(want[i]))}


@pytest.mark.parametrize("op", OPS)
def test_kernel_source_matches_array_code_on_host(host_lib, op):
    ops = operands({"sqrt": 1, "fma": 3}.get(op, 2))
    for env in ENVS:
        for rounding in sf.ROUNDING_MODES:
            want = reference(op, ops, rounding, env)
            got = host_run(host_lib, op, ops, rounding, env)
            assert np.array_equal(got, want), (env, rounding, _first_diff(ops, got, want))


def test_sqrt_table_is_the_array_codes():
    from spec.softfloat.arith import _sqrt_params, _sqrt_table

    assert _sqrt_params(24)[1] == 26
    assert sfd.sqrt_table() == [int(v) for v in _sqrt_table(26)]


def test_dispatch_only_for_cupy_binary32_without_flags():
    a = np.array([0x3F800000], np.uint32)
    assert not sfd.applies([a, a], sf.BINARY32, False)  # NumPy operands: the array code


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_OK, reason="no CUDA device")
@pytest.mark.parametrize("op", OPS)
def test_device_kernel_matches_host_array_code(op):
    import cupy

    ops = operands({"sqrt": 1, "fma": 3}.get(op, 2), seed=11)
    dev = [cupy.asarray(o) for o in ops]
    for env in ENVS:
        for rounding in sf.ROUNDING_MODES:
            want = reference(op, ops, rounding, env)
            got = cupy.asnumpy(getattr(sf, op)(*dev, rounding=rounding, env=env))
            assert np.array_equal(got, want), (env, rounding, _first_diff(ops, got, want))
    # and the array code on the device (the kernel disabled) agrees too
    sfd.set_enabled(False)
    try:
        got = cupy.asnumpy(getattr(sf, op)(*dev, env="cuda"))
    finally:
        sfd.set_enabled(True)
    assert np.array_equal(got, reference(op, ops, "rne", "cuda"))
