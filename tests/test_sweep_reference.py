"""The sweep's fused exact references agree with softfloat (the definition) bit for bit.

The float64 route (one binary64 operation, one rounding to binary32: exact by the double-rounding theorem
since 53 >= 2 * 24 + 2) and the softfloat route of ``native.sweep_compare`` are compiled for the host from the
very CUDA source (the binary64 intrinsics as the host's IEEE binary64 operations, SSE2, no flushing) and
compared with spec.elementwise's softfloat references on every edge class (zeros, subnormals, Inf, NaNs
with payloads, max finite, rounding ties, overflow and underflow boundaries) and a dense sample. On CUDA
the sweep itself is checked: fused references against the array-code reference, and planted bugs caught.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from native.sweep_compare import EXACT_OPS, EXACT_ROUTES, F64_ROUTE_SOURCE, exact_route_supports
from obligations.core.device import cuda_available
from spec import softfloat as sf
from spec.elementwise import get_reference
from spec.softfloat import device as sfd
from tests.test_softfloat_device import EDGES, operands

CUDA_OK, _ = cuda_available()
NON_FLUSHING = ("cuda", "ieee", "x86-sse")
BINARY = ("add", "sub", "mul", "div")
UNARY = ("sqrt", "inv", "neg", "abs", "relu")

_SHIMS = r"""
#define KC_SOFTFLOAT_HOST 1
#include <cmath>
#include <cstring>
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return std::sqrt(a); }
static inline float __double2float_rn(double r) { return (float)r; }
"""

_HARNESS = r"""
extern "C" void kc_host_ref(int route, int op, const kc_u32* x, const kc_u32* c, kc_u32* r, long n,
                            int rnd, int ftz, int daz, int nanc, int tin, kc_u32 dn) {
    const KcEnv env = {rnd, ftz, daz, nanc, tin, dn};
    for (long i = 0; i < n; ++i) r[i] = route == 0 ? kc_ref_f64(op, x[i], c[i], env) : kc_ref_sf(op, x[i], c[i], env);
}
"""


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler to build the reference source")
    d = tmp_path_factory.mktemp("sweepref")
    src, lib = d / "ref.cpp", d / "libref.so"
    src.write_text(_SHIMS + sfd.SOURCE + F64_ROUTE_SOURCE + _HARNESS)
    cmd = [
        cxx,
        "-O2",
        "-std=c++17",
        "-ffp-contract=off",
        "-fno-fast-math",
        "-shared",
        "-fPIC",
        "-o",
        str(lib),
        str(src),
    ]
    subprocess.run(cmd, check=True)
    return ctypes.CDLL(str(lib))


def host_ref(lib, route: str, op: str, x: np.ndarray, c: np.ndarray, env: str) -> np.ndarray:
    """The fused reference of ``op`` by ``route``, compiled for the host."""
    x, c = np.ascontiguousarray(x, np.uint32), np.ascontiguousarray(c, np.uint32)
    out = np.empty(x.size, np.uint32)
    p = ctypes.POINTER(ctypes.c_uint32)
    args = sfd.env_args("rne", sf.get_env(env))
    lib.kc_host_ref(
        ctypes.c_int(EXACT_ROUTES[route]),
        ctypes.c_int(EXACT_OPS[op]),
        x.ctypes.data_as(p),
        c.ctypes.data_as(p),
        out.ctypes.data_as(p),
        ctypes.c_long(x.size),
        *[ctypes.c_int(v) for v in args[:5]],
        ctypes.c_uint32(args[5]),
    )
    return out


def definition(op: str, x: np.ndarray, c: np.ndarray | None, env: str) -> np.ndarray:
    """spec.elementwise's reference (softfloat) of ``op``: what the sweep promises to compare with."""
    extra = () if c is None else (c,)
    return np.asarray(get_reference(op).evaluate(x, *extra, env=env).bits)


def dense_unary() -> np.ndarray:
    """Every edge, every 1021st bit pattern (all exponents, both signs), and the neighbourhoods of edges."""
    edges = np.array(EDGES, dtype=np.uint64)
    around = (edges[:, None] + np.arange(-64, 65, dtype=np.int64)[None, :].astype(np.uint64)) & np.uint64(0xFFFFFFFF)
    strided = np.arange(0, 1 << 32, 1021, dtype=np.uint64)
    return np.unique(np.concatenate([edges, around.reshape(-1), strided])).astype(np.uint32)


def _diff(x, c, got, want):
    i = int(np.flatnonzero(got != want)[0])
    return {
        "x": hex(int(x[i])),
        "c": None if c is None else hex(int(c[i])),
        "got": hex(int(got[i])),
        "want": hex(int(want[i])),
    }


@pytest.mark.parametrize("op", UNARY)
@pytest.mark.parametrize("route", ["float64", "softfloat"])
def test_fused_unary_reference_equals_softfloat(host_lib, op, route):
    x = dense_unary()
    for env in NON_FLUSHING:
        want = definition(op, x, None, env)
        got = host_ref(host_lib, route, op, x, np.zeros_like(x), env)
        assert np.array_equal(got, want), (env, _diff(x, None, got, want))


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("route", ["float64", "softfloat"])
def test_fused_binary_reference_equals_softfloat(host_lib, op, route):
    x, c = operands(2, seed=3, n_random=100000)
    for env in NON_FLUSHING:
        want = definition(op, x, c, env)
        got = host_ref(host_lib, route, op, x, c, env)
        assert np.array_equal(got, want), (env, _diff(x, c, got, want))


@pytest.mark.parametrize("op", ("add", "sub", "mul", "div", "sqrt", "inv"))
def test_softfloat_route_covers_flushing_envs(host_lib, op):
    x, c = operands(2, seed=5, n_random=20000)
    for env in ("cuda-ftz", "x86-sse-ftz"):
        want = definition(op, x, None if op in UNARY else c, env)
        got = host_ref(host_lib, "softfloat", op, x, c, env)
        assert np.array_equal(got, want), (env, _diff(x, c, got, want))


def test_float64_route_refuses_flushing_envs():
    assert exact_route_supports("sqrt", "float64", sf.get_env("cuda"))
    assert not exact_route_supports("sqrt", "float64", sf.get_env("cuda-ftz"))
    assert exact_route_supports("sqrt", "softfloat", sf.get_env("cuda-ftz"))
    assert not exact_route_supports("relu", "softfloat", sf.get_env("cuda-ftz"))


def test_planted_wrong_rounding_is_caught(tmp_path):
    """The comparison has teeth: the float64 route with its final rounding truncating instead differs."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    rtz = (
        "static inline float __double2float_rn(double r) { float f = (float)r;"
        " if (std::fabs((double)f) > std::fabs(r)) f = std::nextafter(f, 0.0f); return f; }"
    )
    shims = _SHIMS.replace("static inline float __double2float_rn(double r) { return (float)r; }", rtz)
    src, lib = tmp_path / "bad.cpp", tmp_path / "libbad.so"
    src.write_text(shims + sfd.SOURCE + F64_ROUTE_SOURCE + _HARNESS)
    subprocess.run([cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    x = dense_unary()
    got = host_ref(ctypes.CDLL(str(lib)), "float64", "sqrt", x, np.zeros_like(x), "cuda")
    assert not np.array_equal(got, definition("sqrt", x, None, "cuda"))


def test_sweep_loop_with_a_fused_reference(host_lib, monkeypatch):
    """The sweep's fused branch (counts folded, counterexamples named) driven on the host by the same source."""
    import falsification.sweep as sw
    from falsification.sweep import ReferenceProvider, compare_chunk

    def provider(op, env, device, reference="auto", operand=None):
        name = sw._FUSED_NAMES[sw.get_kernel(op).reference]

        def ref(x):
            return host_ref(host_lib, "float64", name, x, np.full_like(x, operand or 0), env)

        def fused(nat, x, want_reference=False):
            r = ref(x)
            h, mx, nb = compare_chunk(nat, r, None, 0, exact=True)
            return h, mx, nb, (r if want_reference else None)

        return ReferenceProvider("host-compiled float64 route", lambda x: (ref(x), None), False, fused)

    monkeypatch.setattr(sw, "reference_provider", provider)
    ok = sw.sweep("add", device="host", lo=0x7F000000, hi=0x80800000, operand=0x3F800000, chunk=1 << 20)
    assert ok["disagreements"] == 0 and ok["comparison"].startswith("reference and comparison")
    assert sum(ok["histogram"].values()) == ok["elements"] == 0x01800000
    bad = sw.sweep("relu", device="host", lo=0x7F000000, hi=0x80800000, variant="nan_as_number", chunk=1 << 20)
    assert bad["disagreements"] == (1 << 23) - 1  # every NaN input returns 0 instead of the canonical NaN
    first = bad["first_counterexamples"][0]
    assert first == {"input": "0x7F800001", "native": "0x00000000", "reference": "0x7FFFFFFF", "ulp": "nan-mismatch"}
    assert len(bad["first_counterexamples"]) == 8


# -- on the device: the sweep with fused references --------------------------------------------------

needs_cuda = pytest.mark.skipif(not CUDA_OK, reason="no CUDA device")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("op", UNARY)
def test_cuda_fused_reference_equals_softfloat(op):
    import cupy

    from native.sweep_compare import sweep_exact_chunk

    x = dense_unary()
    xd = cupy.asarray(x)
    for env in NON_FLUSHING:
        want = definition(op, x, None, env)
        for route in ("float64", "softfloat"):
            *_, ref = sweep_exact_chunk(xd, xd, op, 0, route, sf.get_env(env), want_reference=True)
            got = cupy.asnumpy(ref)
            assert np.array_equal(got, want), (route, env, _diff(x, None, got, want))


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("op", BINARY)
def test_cuda_fused_binary_reference_equals_softfloat(op):
    import cupy

    from native.sweep_compare import sweep_exact_chunk

    x, c = operands(2, seed=9, n_random=100000)
    for cv in (0x3F800000, 0x00000001, 0x7F7FFFFF, 0xBF7FFFFF, 0x33800000, 0x7FC00001, 0x00000000):
        cc = np.full_like(c, cv)
        want = definition(op, x, cc, "cuda")
        xd = cupy.asarray(x)
        for route in ("float64", "softfloat"):
            *_, ref = sweep_exact_chunk(xd, xd, op, cv, route, sf.get_env("cuda"), want_reference=True)
            got = cupy.asnumpy(ref)
            assert np.array_equal(got, want), (route, hex(cv), _diff(x, cc, got, want))


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize(
    "op,kw",
    [("sqrt", {}), ("inv", {}), ("relu", {}), ("neg", {}), ("add", {"operand": 0x3F800000})],
)
def test_cuda_sweep_routes_agree(op, kw):
    """Sweeps by the float64 route and by the softfloat kernels agree on ranges full of edge classes."""
    from falsification.sweep import sweep

    for lo, hi in ((0, 1 << 24), (0x7F000000, 0x80800000), (0xFF000000, 1 << 32)):
        fused = sweep(op, device="cuda", lo=lo, hi=hi, **kw)
        soft = sweep(op, device="cuda", lo=lo, hi=hi, reference="softfloat", **kw)
        assert fused["disagreements"] == soft["disagreements"] == 0, (fused, soft)
        assert "float64 route" in fused["reference"] and fused["histogram"] == soft["histogram"]


@pytest.mark.cuda
@needs_cuda
def test_cuda_sweep_catches_planted_bug():
    from falsification.sweep import sweep

    r = sweep("relu", device="cuda", lo=0x7F000000, hi=0x80800000, variant="nan_as_number")
    assert r["disagreements"] > 0 and r["first_counterexamples"]
    assert (
        r["first_counterexamples"][0]["input"].startswith("0x7F8") or r["first_counterexamples"][0]["input"] > "0x7F8"
    )


# -- compile time: NVRTC disk cache and CuPy reductions without CUB (host, with a stand-in CuPy) ------------


def _fake_cupy(calls: list) -> object:
    import types

    def compile_using_nvrtc(source, options=(), arch=None):
        calls.append((source, tuple(options), arch))
        return (f"// ptx of {len(source)} chars for {arch}", {})

    cupy = types.ModuleType("cupy")
    cupy.__version__ = "0.test"
    cupy.cuda = types.SimpleNamespace(
        compiler=types.SimpleNamespace(compile_using_nvrtc=compile_using_nvrtc, _get_arch=lambda: "90"),
        nvrtc=types.SimpleNamespace(getVersion=lambda: (13, 0)),
    )
    accel: dict = {}
    cupy._core = types.SimpleNamespace(
        set_routine_accelerators=lambda v: accel.__setitem__("routine", list(v)),
        set_reduction_accelerators=lambda v: accel.__setitem__("reduction", list(v)),
    )
    cupy.accel = accel
    return cupy


def test_nvrtc_binaries_are_cached_on_disk(tmp_path, monkeypatch):
    import sys

    from native import nvrtc

    calls: list = []
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(calls))
    nvrtc._arch.cache_clear()
    monkeypatch.setenv("KC_KERNEL_CACHE", str(tmp_path))
    opts = ("-ftz=false",)
    first = nvrtc._binary("kernel A", opts)
    again = nvrtc._binary("kernel A", opts)  # what a later process gets: read back, not compiled
    assert first == again and len(calls) == 1 and len(list(tmp_path.glob("*.bin"))) == 1
    nvrtc._binary("kernel A", ("-ftz=true",))  # other options: another entry
    nvrtc._binary("kernel B", opts)
    assert len(calls) == 3 and len(list(tmp_path.glob("*.bin"))) == 3
    monkeypatch.setenv("KC_KERNEL_CACHE", "0")  # off: compiled every time
    nvrtc._binary("kernel A", opts)
    assert len(calls) == 4
    nvrtc._arch.cache_clear()


def test_the_nvrtc_cache_is_on_by_default_in_the_per_user_cache_dir(tmp_path, monkeypatch):
    import sys

    from native import nvrtc

    monkeypatch.delenv("KC_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert nvrtc._cache_dir() == tmp_path / "xdg" / "kernel-contracts" / "nvrtc"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # the XDG spec says: ignore a relative path
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert nvrtc._cache_dir() == tmp_path / "home" / ".cache" / "kernel-contracts" / "nvrtc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert nvrtc._cache_dir() == tmp_path / "home" / ".cache" / "kernel-contracts" / "nvrtc"
    # With nothing set, a second process (here: a second call) reads the binary back instead of compiling.
    calls: list = []
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(calls))
    nvrtc._arch.cache_clear()
    nvrtc._binary("kernel A", ("-ftz=false",))
    nvrtc._binary("kernel A", ("-ftz=false",))
    assert len(calls) == 1 and len(list((tmp_path / "home" / ".cache" / "kernel-contracts" / "nvrtc").glob("*.bin")))
    nvrtc._arch.cache_clear()


def test_cupy_reductions_without_cub_unless_asked(monkeypatch):
    from obligations.core import device

    fake = _fake_cupy([])
    monkeypatch.delenv("CUPY_ACCELERATORS", raising=False)
    device._plain_reductions.__wrapped__(fake)
    assert fake.accel == {"routine": [], "reduction": []}
    asked = _fake_cupy([])
    monkeypatch.setenv("CUPY_ACCELERATORS", "cub")
    device._plain_reductions.__wrapped__(asked)
    assert asked.accel == {}  # an explicit CUPY_ACCELERATORS is respected


def test_the_library_leaves_cupys_accelerators_alone_only_kc_on_cuda_opts_in(monkeypatch):
    import sys

    from obligations import check
    from obligations.core import device

    fake = _fake_cupy([])
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.delenv("CUPY_ACCELERATORS", raising=False)
    monkeypatch.setattr(device, "resolve_device", lambda d: d)
    device._plain_reductions.cache_clear()
    try:
        assert device.array_module("cuda") is fake and fake.accel == {}  # a user of native keeps CuPy's defaults
        monkeypatch.setattr(check, "run_item", lambda *a, **k: check.skipped("probe"))
        check.item_fields(None, {"id": "X"}, device="host")
        assert fake.accel == {}
        check.item_fields(None, {"id": "X"}, device="cuda")  # a kc check item on cuda opts in
        assert fake.accel == {"routine": [], "reduction": []}
    finally:
        device._plain_reductions.cache_clear()


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_OK, reason="no CUDA device")
@pytest.mark.parametrize(("first", "n"), [(0, 0), (0, 1000), ((1 << 32) - 777, 777), ((1 << 31) - 5, 3_000_001)])
def test_the_sweeps_device_bit_patterns_are_the_range_itself(first, n):
    from falsification.sweep import chunk_inputs
    from native.sweep_compare import bit_patterns

    want = (np.arange(n, dtype=np.uint64) + first).astype(np.uint32)
    np.testing.assert_array_equal(bit_patterns(first, n).get(), want)
    import cupy

    chunks = list(chunk_inputs(cupy, lo=first, total=n, chunk=1 << 20, sample=None, seed=0))
    got = np.concatenate([c.get() for c in chunks]) if chunks else np.zeros(0, np.uint32)
    np.testing.assert_array_equal(got, want)


def test_bit_patterns_refuse_a_range_past_2_to_the_32():
    from native.sweep_compare import bit_patterns

    with pytest.raises(ValueError, match="32-bit range"):
        bit_patterns((1 << 32) - 3, 4)


def test_processes_that_miss_the_same_nvrtc_entry_at_once_compile_it_once(tmp_path, monkeypatch):
    """A fresh 2-GPU cluster's 30 kc processes missed the same entries together and each compiled them (its check
    took 56.9 s against 34.9 with warm caches): one compiles under the entry's lock, the others read its entry;
    different kernels still compile side by side. Without the lock (planted) every thread compiles."""
    import contextlib
    import sys
    import threading
    import time

    from native import nvrtc

    calls: list = []
    together = threading.Barrier(2, timeout=10)  # kernels B and C: each compile waits for the other to be in one

    def slow(source, options=(), arch=None):
        calls.append(source)
        if source in ("kernel B", "kernel C"):
            together.wait()  # broken (an error) if the two compiles were serialised
        time.sleep(0.3)
        return f"ptx of {source}"

    cupy = _fake_cupy(calls)
    cupy.cuda.compiler.compile_using_nvrtc = slow
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    nvrtc._arch.cache_clear()
    monkeypatch.setenv("KC_KERNEL_CACHE", str(tmp_path))

    def race(sources):
        got: list = []
        threads = [threading.Thread(target=lambda s=s: got.append(nvrtc._binary(s, ("-ftz=false",)))) for s in sources]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return got

    assert race(["kernel A"] * 4) == ["ptx of kernel A"] * 4 and calls == ["kernel A"]
    assert sorted(race(["kernel B", "kernel C"])) == ["ptx of kernel B", "ptx of kernel C"]  # side by side
    assert sorted(calls) == ["kernel A", "kernel B", "kernel C"] and not together.broken
    monkeypatch.setattr(nvrtc, "_compiling", lambda path: contextlib.nullcontext())
    race(["kernel D"] * 4)
    assert calls.count("kernel D") == 4  # the planted race: every thread compiled
    nvrtc._arch.cache_clear()
