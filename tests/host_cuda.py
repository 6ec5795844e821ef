"""Run the conv, norm and indexing CUDA kernel sources (indexing: with the reductions' dot/VJP kernels and the RNG
initializers) on the host: g++ compiles each source as C++ (one thread at a time, AddressSanitizer and UBSan on),
ctypes launches it over the plan's grid, the result is compared with the host path.

This is no GPU evidence (no warps, no libdevice): it shows that the CUDA text the device would run reads and writes
only inside its buffers, has no signed overflow on the shapes it is given, receives every parameter it declares,
and computes what the host path computes (bitwise for the correctly rounded kernels; within a few ulp where the
source calls expf/logf, here glibc's). Run as ``python -m tests.host_cuda conv|norm|indexing`` with libasan preloaded
(:func:`run_under_asan` does that); it exits non-zero on the first mismatch or sanitizer report.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PRELUDE", "host_compile", "run_under_asan", "main"]

PRELUDE = r"""
#include <math.h>
#include <cmath>
#include <cstring>
using std::signbit;
struct kc_dim3 { unsigned int x, y, z; };
static kc_dim3 blockIdx, threadIdx, blockDim, gridDim;
extern "C" void kc_set_index(unsigned bx, unsigned tx, unsigned bd, unsigned gd) {
    blockIdx.x = bx; threadIdx.x = tx; blockDim.x = bd; gridDim.x = gd;
}
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
static inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
// One thread at a time: the atomic is a plain add (no flush; the device's f32 atomic flushes subnormals).
static inline float atomicAdd(float* a, float v) { const float o = *a; *a = o + v; return o; }
"""

_FLAGS = [
    "-shared",
    "-fPIC",
    "-O1",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-Wno-unknown-pragmas",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
]
_CACHE = Path(tempfile.gettempdir()) / "kc_host_cuda"


def _params(source: str, name: str) -> list[str]:
    head = source[source.index(f"void {name}(") :]
    return [p.strip() for p in head[head.index("(") + 1 : head.index(")")].split(",")]


def _ctype(param: str) -> Any:
    if "*" in param:
        return ctypes.c_void_p
    kind = param.rsplit(" ", 1)[0].replace("const ", "")
    return {"long long": ctypes.c_longlong, "int": ctypes.c_int, "float": ctypes.c_float, "unsigned": ctypes.c_uint}[
        kind
    ]


def host_compile(source: str, name: str, route: str) -> Callable[..., None]:
    """A launcher ``fn(grid, block, args)`` running ``name`` of ``source`` on the host, one thread after another."""
    del route
    _CACHE.mkdir(exist_ok=True)
    key = hashlib.sha256((PRELUDE + source).encode()).hexdigest()[:16]
    lib_path = _CACHE / f"{name}_{key}.so"
    if not lib_path.exists():
        src = _CACHE / f"{name}_{key}.cpp"
        src.write_text(PRELUDE + source)
        subprocess.run(["g++", *_FLAGS, str(src), "-o", str(lib_path)], check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(lib_path))
    fn = getattr(lib, name)
    params = _params(source, name)
    fn.argtypes = [_ctype(p) for p in params]
    fn.restype = None

    def launch(grid: tuple[int, ...], block: tuple[int, ...], args: tuple) -> None:
        if len(args) != len(params):
            raise TypeError(f"{name}: {len(args)} arguments for {len(params)} parameters")
        conv = [a.ctypes.data_as(ctypes.c_void_p) if isinstance(a, np.ndarray) else a for a in args]
        for bx in range(grid[0]):
            for tx in range(block[0]):
                lib.kc_set_index(bx, tx, block[0], grid[0])
                fn(*conv)

    return launch


def _same(a: np.ndarray, b: np.ndarray, ulp: int = 0) -> bool:
    a, b = np.asarray(a, np.float32).ravel(), np.asarray(b, np.float32).ravel()
    if a.shape != b.shape:
        return False
    nan = np.isnan(a) | np.isnan(b)
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    ia, ib = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
    ia, ib = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia), np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return bool(np.all(nan | (np.abs(ia - ib) <= ulp)))


def _patch(module: Any) -> None:
    import native.nvrtc as nv

    nv.compile_function = host_compile
    module.array_module = lambda dev: np
    module.resolve_device = lambda device: device


def _fake_cupy() -> None:
    """A ``cupy`` whose arrays are NumPy's, so a family's sanitizer workload runs through the host launcher."""
    import types

    fake = types.ModuleType("cupy")
    fake.asarray = np.asarray  # type: ignore[attr-defined]
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(deviceSynchronize=lambda: None))  # type: ignore[attr-defined]
    sys.modules["cupy"] = fake


def _conv_cases() -> list[str]:
    from native import conv as nc

    _patch(nc)
    rng = np.random.default_rng(7)
    bad = []

    def r(*shape: int) -> np.ndarray:
        return rng.uniform(-2, 2, shape).astype(np.float32)

    windows = [
        ((1, 2, 7), (4, 2, 3), dict(stride=2, padding=1, dilation=2, groups=1)),
        ((2, 4, 6, 5), (6, 2, 3, 2), dict(stride=(2, 1), padding=(1, 1), dilation=(1, 2), groups=2)),
        ((1, 2, 4, 3, 5), (2, 1, 2, 2, 3), dict(stride=(1, 2, 1), padding=(1, 0, 1), dilation=1, groups=2)),
    ]
    for xs, ws, win in windows:
        x, w, b = r(*xs), r(*ws), r(ws[0])
        for bias in (b, None):
            y = nc.conv(x, w, bias, device="host", **win)
            if not _same(nc.conv(x, w, bias, device="cuda", **win), y):
                bad.append(f"conv {xs} {ws} bias={bias is not None}")
        dy = r(*y.shape)
        kernel = ws[2:]
        if not _same(
            nc.conv_weight_grad(x, dy, kernel, device="cuda", **win),
            nc.conv_weight_grad(x, dy, kernel, device="host", **win),
        ):
            bad.append(f"wgrad {xs}")
        if not _same(nc.bias_grad(dy, device="cuda"), nc.bias_grad(dy, device="host")):
            bad.append(f"bgrad {xs}")
        for bias_row in (False, True):
            got = nc.im2col(x, kernel, device="cuda", bias_row=bias_row, **win)
            if not _same(got, nc.im2col(x, kernel, device="host", bias_row=bias_row, **win)):
                bad.append(f"im2col {xs} bias_row={bias_row}")
        dx_h = nc.conv_backward(x, w, dy, device="host", **win)[0]
        if not _same(nc.conv_backward(x, w, dy, device="cuda", **win)[0], dx_h):
            bad.append(f"conv_transpose (dx) {xs}")
        tw = r(ws[0], ws[1], *ws[2:])
        tb = r(ws[1] * win["groups"] + 1)  # one element longer than the output channels: only those are read
        ty = nc.conv_transpose(y, tw, tb, output_padding=0, device="host", **win)
        if not _same(nc.conv_transpose(y, tw, tb, output_padding=0, device="cuda", **win), ty):
            bad.append(f"conv_transpose {xs} with bias")
    x = r(2, 3, 6, 7)
    x[0, 0, 1, 1:4] = 1.5  # ties
    for win in (dict(kernel=3, stride=1, padding=1), dict(kernel=(2, 3), stride=(2, 1), padding=(1, 0))):
        y, arg = nc.max_pool2d(x, device="host", **win)
        yc, argc = nc.max_pool2d(x, device="cuda", **win)
        if not (_same(yc, y) and np.array_equal(argc, arg)):
            bad.append(f"max_pool2d {win}")
        dy = r(*y.shape)
        if not _same(
            nc.max_pool2d_backward(dy, arg, x.shape, device="cuda", **win),
            nc.max_pool2d_backward(dy, arg, x.shape, device="host", **win),
        ):
            bad.append(f"max_pool2d_backward {win}")
        if not _same(nc.avg_pool2d(x, device="cuda", **win), nc.avg_pool2d(x, device="host", **win)):
            bad.append(f"avg_pool2d {win}")
        if not _same(
            nc.avg_pool2d_backward(dy, x.shape, device="cuda", **win),
            nc.avg_pool2d_backward(dy, x.shape, device="host", **win),
        ):
            bad.append(f"avg_pool2d_backward {win}")
        for beta in (0.5, 3.0, 100.0):
            ys = nc.smooth_max_pool2d(x, beta=beta, device="host", **win)
            if not _same(nc.smooth_max_pool2d(x, beta=beta, device="cuda", **win), ys, ulp=4):
                bad.append(f"smooth_max_pool2d {win} beta={beta}")
            dxs = nc.smooth_max_pool2d_backward(dy, x, beta=beta, device="host", **win)
            got = nc.smooth_max_pool2d_backward(dy, x, beta=beta, device="cuda", **win)
            if not np.allclose(got, dxs, rtol=1e-5, atol=1e-6):
                bad.append(f"smooth_max_pool2d_backward {win} beta={beta}")
    _fake_cupy()
    print("conv workload:", nc._workload(), "launches")
    return bad


def _norm_cases() -> list[str]:
    from native import norm as nn

    _patch(nn)
    rng = np.random.default_rng(8)
    bad = []
    for rows, length in ((1, 1), (3, 17), (4, 40)):
        x = rng.uniform(-3, 3, (rows, length)).astype(np.float32)
        dy = rng.uniform(-1, 1, (rows, length)).astype(np.float32)
        w, b = rng.uniform(-1, 1, length).astype(np.float32), rng.uniform(-1, 1, length).astype(np.float32)
        mask = rng.random((rows, length)) < 0.6
        mask[0] = False
        for m in (None, mask):
            for fn in (nn.softmax, nn.log_softmax):
                if not _same(fn(x, m, device="cuda"), fn(x, m, device="host"), ulp=4):
                    bad.append(f"{fn.__name__} {rows}x{length} mask={m is not None}")
            if not _same(nn.softmax_backward(x, dy, m, device="cuda"), nn.softmax_backward(x, dy, m, device="host")):
                bad.append(f"softmax_backward {rows}x{length}")
            got = nn.log_softmax_backward(x, dy, m, device="cuda")
            if not np.allclose(got, nn.log_softmax_backward(x, dy, m, device="host"), rtol=1e-5, atol=1e-5):
                bad.append(f"log_softmax_backward {rows}x{length}")
        if not _same(nn.layernorm(x, w, b, device="cuda"), nn.layernorm(x, w, b, device="host")):
            bad.append(f"layernorm {rows}x{length}")
        if not _same(nn.rmsnorm(x, w, device="cuda"), nn.rmsnorm(x, w, device="host")):
            bad.append(f"rmsnorm {rows}x{length}")
        for fn in (nn.layernorm_backward, nn.rmsnorm_backward):
            got, want = fn(x, w, dy, device="cuda"), fn(x, w, dy, device="host")
            if not all(_same(g, h) for g, h in zip(got, want, strict=True)):
                bad.append(f"{fn.__name__} {rows}x{length}")
        x4 = x.reshape(rows, 1, 1, length)  # batchnorm eval: one channel per row's first element, any spatial size
        bn = (w[:1], w[:1] * w[:1], b[:1], w[:1])
        if not _same(nn.batchnorm_eval(x4, *bn, device="cuda"), nn.batchnorm_eval(x4, *bn, device="host")):
            bad.append(f"batchnorm_eval {rows}x{length}")
    _fake_cupy()
    print("norm workload:", nn._workload(), "launches")
    return bad


def _indexing_cases() -> list[str]:
    """Every indexing kernel (and the reductions' dot / VJP kernels and the RNG initializers) against its host path."""
    from native import indexing as ni
    from native import reductions as nr
    from native import rng as ng
    from spec.indexing import atomic_bound

    for mod in (ni, nr):
        _patch(mod)
        mod.compile_function = host_compile
    rng = np.random.default_rng(9)
    bad = []
    t = rng.standard_normal((7, 3)).astype(np.float32)
    x = rng.standard_normal((2, 6, 3)).astype(np.float32)
    x[0, 2, 1] = x[0, 4, 1]  # a tie for the argmax
    x[1, 3, 2] = np.nan
    m = rng.random(x.shape) < 0.5
    ix = np.array([6, 0, 6, 3, 6], np.int64)
    pairs: dict[str, Callable[[str], Any]] = {
        "gather": lambda d: ni.gather(t, ix, device=d),
        "gather_vjp": lambda d: ni.gather_vjp(x[0, :5], ix, 7, device=d),
        "index_copy": lambda d: ni.index_copy(t, [5, 1], x[0, :2], device=d),
        "where": lambda d: ni.where(m, x, -x, device=d),
        "masked_fill": lambda d: ni.masked_fill(x, m, -np.inf, device=d),
        "slice": lambda d: ni.slice_axis(x, 1, 1, 4, device=d),
        "slice_vjp": lambda d: ni.slice_vjp(x[:, :2], x.shape, 1, 3, device=d),
        "concat": lambda d: ni.concat([x, x[:, :2]], 1, device=d),
        "concat_vjp": lambda d: np.concatenate([v.ravel() for v in ni.concat_vjp(x, [2, 4], 1, device=d)]),
        "reduce_to_shape": lambda d: ni.reduce_to_shape(x, (6, 1), device=d),
        "dot": lambda d: nr.dot(x, x[::-1].copy(), axis=1, device=d),
        "sum_vjp": lambda d: nr.sum_vjp(x[:, 0], x.shape, axis=1, device=d),
        "mean_vjp": lambda d: nr.mean_vjp(x[:, 0], x.shape, axis=1, device=d),
        "max_vjp": lambda d: nr.max_vjp(x, x[:, 0], axis=1, device=d),
    }
    for name, call in pairs.items():
        if not _same(call("cuda"), call("host")):
            bad.append(name)
    src = rng.uniform(-1, 1, 300).astype(np.float32)
    to = rng.integers(0, 4, 300)
    got = ni.scatter_add_atomic(np.zeros(4, np.float32), to, src, device="cuda")
    value, bound = atomic_bound(np.zeros(4, np.float32), to, src)
    if not np.all(np.abs(got.astype(np.float64) - value) <= bound):
        bad.append("scatter_add_atomic (bound)")
    u = ng.uniform(1000, 5, device="host")
    out = np.empty(1000, np.float32)
    b = ng.xavier_bound(30, 7)
    host_compile(ng.INIT_SOURCE, "kc_init_symmetric", ng.ROUTE)((4,), (256,), (u, out, np.int64(1000), b))
    if not _same(out, ng.xavier_uniform(1000, 30, 7, 5, device="host")):
        bad.append("init_symmetric")
    filled = np.empty(300, np.uint32)
    host_compile(ng.INIT_SOURCE, "kc_init_fill", ng.ROUTE)((2,), (256,), (filled, np.int64(300), np.uint32(0x3F800000)))
    if not np.all(filled == 0x3F800000):
        bad.append("init_fill")
    return bad


def run_under_asan(family: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -m tests.host_cuda family`` with libasan preloaded; the completed process."""
    asan = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True, check=True)
    env = {
        **os.environ,
        "LD_PRELOAD": asan.stdout.strip(),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    }
    root = Path(__file__).resolve().parents[1]
    return subprocess.run(
        [sys.executable, "-m", "tests.host_cuda", family],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def main(argv: list[str] | None = None) -> int:
    """Exercise every CUDA launch of ``conv``, ``norm`` or ``indexing`` on the host; 0 when each matches the host."""
    family = (argv or sys.argv[1:] or ["conv"])[0]
    bad = {"conv": _conv_cases, "norm": _norm_cases, "indexing": _indexing_cases}[family]()
    for b in bad:
        print("MISMATCH", b)
    print(f"{family}: {len(bad)} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
