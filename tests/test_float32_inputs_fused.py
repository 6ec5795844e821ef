"""The fused batch generator (falsification.float32_inputs.GENERATE_SOURCE) is the array code, bit for bit.

The array code of :func:`falsification.float32_inputs.generate_bits` is the definition; on CuPy the batch is
expanded by one fused CUDA kernel. Its very source is compiled here for the host (the binary64 intrinsics as
the host's IEEE binary64 operations, no flushing) and compared with the NumPy array code for every mix, every
arity it serves, sizes 0/1/odd/large and several seeds; a planted change in one field of the source is caught.
On CUDA the kernel itself is compared with the NumPy array code.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from falsification import float32_inputs as fs
from obligations.core.device import cuda_available

CUDA_OK, _ = cuda_available()

_HARNESS = r"""
extern "C" void kc_gen_host(long long n, int arity, const g_u64* keys, g_u64 kc, long long c0, long long c1,
                            long long c2, long long c3, int correlate, g_u32* out) {
    for (long long i = 0; i < n; ++i) {
        g_u32 x[4];
        kc_gen_element((g_u64)i, arity, keys, kc, c0, c1, c2, c3, correlate, x);
        for (int k = 0; k < arity; ++k) out[k * n + i] = x[k];
    }
}
"""


def _build(tmp_path_factory: pytest.TempPathFactory, source: str, tag: str) -> ctypes.CDLL:
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler to build the generator source")
    d = tmp_path_factory.mktemp(f"gen-{tag}")
    src, lib = d / "gen.cpp", d / "libgen.so"
    src.write_text("#define KC_GEN_HOST 1\n" + source + _HARNESS)
    cmd = [cxx, "-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC", "-o", str(lib)]
    subprocess.run([*cmd, str(src)], check=True)
    return ctypes.CDLL(str(lib))


@pytest.fixture(scope="module")
def host_gen(tmp_path_factory):
    return _build(tmp_path_factory, fs.GENERATE_SOURCE, "shipped")


def _host_generate(lib: ctypes.CDLL, spec: fs.BatchSpec, arity: int) -> list[np.ndarray]:
    """generate_bits' operands (before explicit elements) by the host build of the fused source."""
    n = spec.size
    keys, kc, c, corr = fs.generate_args(spec.seed, n, arity, fs.MIXES[spec.mix])
    k = np.array(keys, dtype=np.uint64)
    out = np.zeros((arity, n), dtype=np.uint32)
    p = ctypes.c_void_p
    lib.kc_gen_host.argtypes = [ctypes.c_longlong, ctypes.c_int, p, ctypes.c_ulonglong, *[ctypes.c_longlong] * 4]
    lib.kc_gen_host.argtypes += [ctypes.c_int, p]
    lib.kc_gen_host(n, arity, k.ctypes.data, kc, *c, corr, out.ctypes.data)
    return [out[j] for j in range(arity)]


SIZES = (0, 1, 7, 4099, 1 << 16)


@pytest.mark.parametrize("mix", sorted(fs.MIXES))
@pytest.mark.parametrize("arity", range(1, fs.FUSED_MAX_ARITY + 1))
def test_fused_source_equals_the_array_code(host_gen, mix, arity):
    for seed in (0, 1, 2**32 - 1):
        for n in SIZES:
            spec = fs.BatchSpec(seed=seed, size=n, mix=mix)
            want = fs.generate_bits(spec, arity)
            got = _host_generate(host_gen, spec, arity)
            for k in range(arity):
                assert np.array_equal(got[k], want[k]), (mix, arity, seed, n, k)


def test_the_comparison_sees_every_category_and_correlation_kind(host_gen):
    """The compared batches reach each category (uniform, TestFloat, special, subnormal) and the fma triples."""
    ops = _host_generate(host_gen, fs.BatchSpec(seed=3, size=1 << 16, mix="correlated"), 3)
    a, b, c = ops
    sub = ((a & 0x7F800000) == 0) & ((a & 0x7FFFFF) != 0)
    nan = ((a & 0x7F800000) == 0x7F800000) & ((a & 0x7FFFFF) != 0)
    assert sub.any() and nan.any() and np.isin(a, np.array(fs.SPECIAL_BITS, np.uint32)).any()
    with np.errstate(all="ignore"):
        prod = a.view(np.float32).astype(np.float64) * b.view(np.float32).astype(np.float64)
    assert (np.isnan(prod) & (c == 0xFFC00000)).any(), "a NaN product's z is the one quiet NaN, negated"


@pytest.mark.parametrize(
    "old,new",
    [
        ("% 23ull + 1ull", "% 22ull + 1ull"),  # the multiplication-tie exponent
        ("(e - 127u + 1023u)", "(e - 126u + 1023u)"),  # the exact widening of the fma triple's operands
        ("KC_GEN_SPECIAL[(g >> 16)", "KC_GEN_SPECIAL[(g >> 15)"),  # which special value is picked
        ("if ((p & 0x7F800000u) == 0u) p &= 0x80000000u;", ""),  # subnormal z kept
    ],
)
def test_a_planted_change_in_the_source_is_caught(tmp_path_factory, old, new):
    assert old in fs.GENERATE_SOURCE
    lib = _build(tmp_path_factory, fs.GENERATE_SOURCE.replace(old, new), "planted")
    caught = False
    for mix in ("correlated", "subnormal", "balanced"):
        spec = fs.BatchSpec(seed=5, size=1 << 15, mix=mix)
        want, got = fs.generate_bits(spec, 3), _host_generate(lib, spec, 3)
        caught |= any(not np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert caught


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_OK, reason="no CUDA device")
def test_fused_kernel_on_the_device_equals_the_array_code():
    import cupy

    for mix in sorted(fs.MIXES):
        for arity in range(1, fs.FUSED_MAX_ARITY + 1):
            for n in SIZES:
                spec = fs.BatchSpec(seed=9, size=n, mix=mix, explicit=((3, (0x7F800001, 0x80000000, 1, 2)),))
                want = fs.generate_bits(spec, arity)
                got = fs.generate_bits(spec, arity, cupy)
                for k in range(arity):
                    assert np.array_equal(cupy.asnumpy(got[k]), want[k]), (mix, arity, n, k)
    fs.set_fused(False)
    try:
        spec = fs.BatchSpec(seed=4, size=5000, mix="correlated")
        arrays = fs.generate_bits(spec, 3, cupy)
    finally:
        fs.set_fused(True)
    for a, w in zip(arrays, fs.generate_bits(spec, 3), strict=True):
        assert np.array_equal(cupy.asnumpy(a), w)


def test_fused_source_compiles_with_nvrtc():
    """The device build of the source (the nvrtc-ieee route's options) compiles, where NVRTC is importable."""
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    from native.nvrtc import get_route

    opts = [o.encode() for o in get_route("nvrtc-ieee").flags.options()] + [b"-arch=compute_80"]
    err, prog = nvrtc.nvrtcCreateProgram(fs.GENERATE_SOURCE.encode(), b"gen.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, log.decode(errors="replace")
