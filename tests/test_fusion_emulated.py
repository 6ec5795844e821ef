"""The fusion backend's pre-written CUDA kernels run on a CPU emulator: indexing, barriers and order, on the host.

Each kernel's CUDA source (the very text NVRTC compiles) is compiled by g++ against a small emulation header: every
CUDA thread is a ``std::thread``, ``__syncthreads`` a ``std::barrier`` over the block, ``__shared__`` a block-wide
buffer, blocks run one after another, float arithmetic is IEEE binary32 without contraction (``-ffp-contract=off``).
This checks what a GPU-less run can: every element is written from the right inputs in the stated order (RMSNorm's
two kernels: the general one's persistent loop over rows, the fast one's blocks of two rows with its asynchronous
copy as a plain copy; RoPE, the embedding gather and its error flag, the masked softmax), bit for bit against the
host models (NaN compared as canonical: x86 keeps NaN payloads, the GPU does not).
It says nothing about speed or about the GPU's own arithmetic; the ``cuda`` tests and the contract's device run do.
Skipped without g++ (C++20).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from native import fusion_kernels as fk
from spec.ir.denote import denote_all, floats, rope_tables
from spec.ir.graph import GraphBuilder

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")

_HEADER = r"""
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
struct uint3 { unsigned x, y, z; };
thread_local uint3 threadIdx, blockIdx;
uint3 blockDim, gridDim;
std::barrier<>* g_bar;
unsigned char* g_dyn;
#define __syncthreads() g_bar->arrive_and_wait()
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define KC_COPY16(dst, src) (*(dst) = *(src))
#define KC_COPY_WAIT()
#define __shared__ static
struct float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline unsigned atomicExch(unsigned* p, unsigned v) {
    static std::mutex m; std::lock_guard<std::mutex> g(m); unsigned o = *p; *p = v; return o;
}
inline long long clock64() { static thread_local long long c = 0; return c += 4096; }  // a stagger's wait ends
inline float kc_expf(float x) { return std::exp(x); }
inline float kc_floorf(float x) { return std::floor(x); }
#define expf kc_expf
#define floorf kc_floorf
template <class F> void launch(unsigned grid, unsigned block, size_t smem, F kernel) {
    gridDim = {grid, 1, 1}; blockDim = {block, 1, 1};
    std::vector<unsigned char> dyn(smem + 64);
    g_dyn = dyn.data();
    for (unsigned b = 0; b < grid; ++b) {
        std::barrier<> bar(block);
        g_bar = &bar;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < block; ++t)
            ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {b, 0, 0}; kernel(); });
        for (auto& th : ts) th.join();
    }
}
template <class T> std::vector<T> rd(const char* f, size_t n) {
    std::vector<T> v(n); FILE* h = fopen(f, "rb"); if (n) fread(v.data(), sizeof(T), n, h); fclose(h); return v;
}
template <class T> void wr(const char* f, const std::vector<T>& v) {
    FILE* h = fopen(f, "wb"); fwrite(v.data(), sizeof(T), v.size(), h); fclose(h);
}
"""

_MAIN = r"""
int main(int argc, char** argv) {
    const int which = atoi(argv[1]);
    const long long a = atoll(argv[2]), b = atoll(argv[3]), c = atoll(argv[4]), e = atoll(argv[5]);
    const unsigned grid = (unsigned)atoi(argv[6]);
    if (which <= 1) {  // rmsnorm: rows a, d b, weight row stride c, eps stride e
        const long long wn = c ? a * b : b, en = e ? a : 1;
        auto x = rd<float>("x.bin", a * b); auto w = rd<float>("w.bin", wn); auto ep = rd<float>("e.bin", en);
        std::vector<float> y(a * b, -7.0f);
        if (which == 0) {
            launch(grid, 128, 16 * (b / 4 + 5), [&] {
                kc_fused_rmsnorm(x.data(), w.data(), c, ep.data(), e, y.data(), a, b, (int)(b % 4 == 0)); });
        } else {
            launch(grid, ROWS_T, 16 * (ROWS_R * (b / 4 + 1) + 3), [&] {  // rmsnorm_rows_plan's shared_bytes
                kc_fused_rmsnorm_rows(x.data(), w.data(), c, ep.data(), e, y.data(), a, b); });
        }
        wr("y.bin", y);
    } else if (which == 2) {  // masked softmax: rows a, d b
        auto x = rd<float>("x.bin", a * b); auto m = rd<float>("w.bin", a * b);
        std::vector<float> y(a * b, -7.0f);
        launch((unsigned)a, 128, 4 * b, [&] { kc_fused_masked_softmax(x.data(), m.data(), y.data(), b); });
        wr("y.bin", y);
    } else if (which == 3) {  // rope: n a, T b, D c
        auto x = rd<float>("x.bin", a);
        auto cs = rd<float>("w.bin", b * c / 2), sn = rd<float>("e.bin", b * c / 2);
        std::vector<float> y(a, -7.0f);
        launch(grid, 32, 0, [&] { kc_fused_rope(x.data(), cs.data(), sn.data(), y.data(), a / 2, b, c / 2); });
        wr("y.bin", y);
    } else {  // embedding: ids a, dim b, vocab c
        auto ids = rd<float>("x.bin", a); auto tab = rd<unsigned>("w.bin", c * b);
        std::vector<unsigned> y(a * b, 7u); unsigned err = 0;
        launch(grid, 32, 0, [&] { kc_fused_embedding(ids.data(), tab.data(), y.data(), &err, a * b, b, c); });
        wr("y.bin", y); std::vector<unsigned> ev{err}; wr("e.bin", ev);
    }
}
"""

_SHARED = {
    "extern __shared__ float4 row4[];": "float4* row4 = (float4*)g_dyn;",
    "extern __shared__ float4 sm4[];": "float4* sm4 = (float4*)g_dyn;",
    "extern __shared__ float row[];": "float* row = (float*)g_dyn;",
}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The four kernels' sources compiled with the emulation header into one program."""
    d = tmp_path_factory.mktemp("emu")
    src = _HEADER
    for text in (fk.SOURCES[k][0] for k in ("rmsnorm", "rmsnorm_rows", "masked_softmax", "rope", "embedding")):
        for a, b in _SHARED.items():
            text = text.replace(a, b)
        src += text + "\n"
    rows_kernel = f"#define ROWS_T {fk.ROWS_THREADS}\n#define ROWS_R {fk.ROWS_R}\n"  # the launcher's block shape
    (d / "k.cpp").write_text(src + rows_kernel + _MAIN)
    cmd = ["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-pthread", "-w", "-o", str(d / "k"), str(d / "k.cpp")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        pytest.skip(f"g++ cannot build the emulator: {res.stderr[:300]}")
    return d


def _run(d: Path, which: int, *args: int, **arrays: np.ndarray) -> None:
    for name, arr in arrays.items():
        np.ascontiguousarray(arr).tofile(d / f"{name}.bin")
    subprocess.run([str(d / "k"), str(which), *map(str, args)], cwd=d, check=True, timeout=120)


def _canon(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, np.float32)
    return np.where(np.isnan(a), np.uint32(0x7FFFFFFF), a.view(np.uint32))


@pytest.mark.parametrize("which", [0, 1])
def test_rmsnorm_kernels_equal_the_host_model(emulator, which):
    rng = np.random.default_rng(which)
    for rows, d in ((1, 4), (3, 5), (11, 16), (23, 36), (12, 260), (3, 1024)):
        if which == 1 and d % 4:
            continue
        for full_w, per_row_eps in ((False, False), (True, True)):
            x = rng.standard_normal((rows, d)).astype(np.float32)
            x[0, 0] = np.nan if rows > 2 else x[0, 0]
            w = rng.standard_normal((rows, d) if full_w else (d,)).astype(np.float32)
            e = (rng.random(rows) * 1e-3).astype(np.float32) if per_row_eps else np.array([1e-6], np.float32)
            # general: fewer blocks than rows, so its persistent loop runs; rows: the plan's grid, 2 rows per block
            grid = fk.rmsnorm_rows_plan(rows, d)["grid"] if which == 1 else min(rows, 3)
            _run(emulator, which, rows, d, d if full_w else 0, int(per_row_eps), grid, x=x, w=w, e=e)
            y = np.fromfile(emulator / "y.bin", np.float32).reshape(rows, d)
            want = fk.rmsnorm_host(x, w, e.reshape(-1, 1) if per_row_eps else e[0])
            assert np.array_equal(_canon(y), _canon(want)), (which, rows, d, full_w, per_row_eps)


def test_rope_and_embedding_kernels_equal_the_denotation(emulator):
    rng = np.random.default_rng(2)
    for shape in ((1, 3, 4), (2, 5, 8)):
        t_len, dim = shape[-2:]
        x = rng.standard_normal(shape).astype(np.float32)
        c, s = rope_tables(t_len, dim, 10000.0)
        _run(emulator, 3, x.size, t_len, dim, 0, 2, x=x, w=floats(c), e=floats(s))
        b = GraphBuilder()
        b.add("rope", (b.add("input", (), shape),), shape)
        g, p = b.build()
        want = denote_all(g, p, [x]).value[1]
        assert np.array_equal(_canon(np.fromfile(emulator / "y.bin", np.float32).reshape(shape)), _canon(want))
    table = rng.standard_normal((5, 4)).astype(np.float32)
    for ids, ok in (([0, 4, 2, 2], True), ([1, 5], False), ([0.5], False), ([np.nan, 1], False), ([-1], False)):
        ids = np.array(ids, np.float32)
        _run(emulator, 4, ids.size, 4, 5, 0, 2, x=ids, w=table.view(np.uint32))
        err = int(np.fromfile(emulator / "e.bin", np.uint32)[0])
        assert err == int(not ok), ids
        if ok:
            y = np.fromfile(emulator / "y.bin", np.uint32).reshape(ids.size, 4)
            assert np.array_equal(y, table.view(np.uint32)[ids.astype(np.int64)])


def test_masked_softmax_kernel_runs_the_unfused_order(emulator):
    from native.ir import run_node
    from spec.ir.graph import Node

    rng = np.random.default_rng(3)
    for rows, d in ((1, 1), (3, 7), (2, 130)):
        x = rng.standard_normal((rows, d)).astype(np.float32)
        m = np.where(rng.random((rows, d)) < 0.3, -np.inf, 0.0).astype(np.float32)
        m[:, 0] = 0.0
        _run(emulator, 2, rows, d, 0, 0, 1, x=x, w=m)
        y = np.fromfile(emulator / "y.bin", np.float32).reshape(rows, d)
        a = run_node(Node(2, (0, 1), "add", (rows, d), {}), [x, m], None, "host")
        want = run_node(Node(3, (2,), "softmax", (rows, d), {"axis": -1}), [a], None, "host")
        # the emulator's expf is the C library's, the host model's exp is float64 rounded once: 1 ulp apart at most
        assert np.all(np.abs(y - want) <= 2.0**-22 * np.abs(want))
