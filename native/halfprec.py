"""Exhaustive sweeps of the device's binary16 / bfloat16 arithmetic (cuda_fp16.h / cuda_bf16.h intrinsics).

One kernel per (operation, format): every operand pair (2^32, ``a = i >> 16``, ``b = i & 0xFFFF``) or every
operand (2^16, sqrt) from the thread index; the device result of ``__hadd __hsub __hmul __hdiv hsqrt``
(round to nearest even) against the reference of :mod:`spec.halfprec` computed in the same thread (binary64
operation on the exact operands, one rounding by integer operations: exact by the double-rounding theorem).
NaN results compare by class. The device reduces to a mismatch count, a NaN count and the first 64
mismatches ``(a, b, got, reference)``.

The intrinsics live in the CUDA headers ``cuda_fp16.h``/``cuda_bf16.h``: :func:`header_dir` finds them (the
CUDA toolkit, CuPy's bundled copies, the ``nvidia-cuda-runtime`` wheels); without them the sweep cannot be
compiled and the contract's items say so (skipped, never passed). Compiled with the ``nvrtc-ieee`` route's
flags plus ``-I`` that directory.
"""

from __future__ import annotations

import functools
import glob
import os
import time
from typing import Any

import numpy as np

from spec.halfprec import FORMATS, OPS, UNARY

__all__ = ["ROUTE", "HeadersUnavailable", "header_dir", "kernel_source", "sweep_op"]

ROUTE = "nvrtc-ieee"

_DEV = {
    ("binary16", "add"): "__half_as_ushort(__hadd(__ushort_as_half(a), __ushort_as_half(b)))",
    ("binary16", "sub"): "__half_as_ushort(__hsub(__ushort_as_half(a), __ushort_as_half(b)))",
    ("binary16", "mul"): "__half_as_ushort(__hmul(__ushort_as_half(a), __ushort_as_half(b)))",
    ("binary16", "div"): "__half_as_ushort(__hdiv(__ushort_as_half(a), __ushort_as_half(b)))",
    ("binary16", "sqrt"): "__half_as_ushort(hsqrt(__ushort_as_half(a)))",
    ("bfloat16", "add"): "__bfloat16_as_ushort(__hadd(__ushort_as_bfloat16(a), __ushort_as_bfloat16(b)))",
    ("bfloat16", "sub"): "__bfloat16_as_ushort(__hsub(__ushort_as_bfloat16(a), __ushort_as_bfloat16(b)))",
    ("bfloat16", "mul"): "__bfloat16_as_ushort(__hmul(__ushort_as_bfloat16(a), __ushort_as_bfloat16(b)))",
    ("bfloat16", "div"): "__bfloat16_as_ushort(__hdiv(__ushort_as_bfloat16(a), __ushort_as_bfloat16(b)))",
    ("bfloat16", "sqrt"): "__bfloat16_as_ushort(hsqrt(__ushort_as_bfloat16(a)))",
}
_REF = {"add": "x + y", "sub": "x - y", "mul": "x * y", "div": "x / y", "sqrt": "sqrt(x)"}

_SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef unsigned long long u64;
#define EB __EB__
#define FB __FB__
__device__ __forceinline__ double kc_to_f64(unsigned b) {
    const int bias = (1 << (EB - 1)) - 1;
    unsigned s = (b >> (EB + FB)) & 1u, e = (b >> FB) & ((1u << EB) - 1u), f = b & ((1u << FB) - 1u);
    double m;
    if (e == (1u << EB) - 1u)
        m = __longlong_as_double(f ? 0x7FF8000000000000ll : 0x7FF0000000000000ll);
    else if (e == 0u) m = ldexp((double)f, 1 - bias - FB);
    else m = ldexp((double)(f | (1u << FB)), (int)e - bias - FB);
    return s ? -m : m;
}
// RN to the format from a binary64, by integer operations (spec.halfprec.round_f64)
__device__ __forceinline__ unsigned kc_rn(double v) {
    const int bias = (1 << (EB - 1)) - 1, emin = 1 - bias;
    const unsigned inf = ((1u << EB) - 1u) << FB;
    u64 d = (u64)__double_as_longlong(v);
    unsigned s = (unsigned)(d >> 63) << (EB + FB);
    int e = (int)((d >> 52) & 0x7FF);
    u64 m = d & 0xFFFFFFFFFFFFFull;
    if (e == 0x7FF) return m ? (inf | (1u << (FB - 1))) : (s | inf);
    if (e == 0) return s;
    int E = e - 1023;
    if (E > bias) return s | inf;
    int shift = E >= emin ? 52 - FB : 52 - FB + (emin - E);
    if (shift > 63) return s;
    u64 sig = m | (1ull << 52);
    u64 kept = sig >> shift, rem = sig & ((1ull << shift) - 1ull), half = 1ull << (shift - 1);
    if (rem > half || (rem == half && (kept & 1ull))) kept++;
    u64 out = E >= emin ? (((u64)(E + bias) << FB) + kept - (1ull << FB)) : kept;
    if (out > inf) out = inf;
    return s | (unsigned)out;
}
__device__ __forceinline__ bool kc_nan(unsigned b) {
    return (b & ((1u << (EB + FB)) - 1u)) > (((1u << EB) - 1u) << FB);
}
__device__ __forceinline__ u64 kc_wsum(u64 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    return v;
}
extern "C" __global__ void __NAME__(u64 base, u64 n, u64* out, unsigned* bad, unsigned cap) {
    u64 mism = 0, nans = 0;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        u64 k = base + i;
        unsigned short a = (unsigned short)(__UNARY__ ? (k & 0xFFFFull) : ((k >> 16) & 0xFFFFull));
        unsigned short b = (unsigned short)(k & 0xFFFFull);
        unsigned got = (unsigned)(__DEV__);
        double x = kc_to_f64(a), y = kc_to_f64(b);
        unsigned ref = kc_rn(__REF__);
        bool gn = kc_nan(got), rn = kc_nan(ref);
        bool wrong = (gn || rn) ? (gn != rn) : (got != ref);
        nans += gn;
        if (wrong) {
            mism++;
            unsigned long long j = atomicAdd(&out[2], 1ull);
            if (j < cap) { bad[4 * j] = a; bad[4 * j + 1] = b; bad[4 * j + 2] = got; bad[4 * j + 3] = ref; }
        }
    }
    mism = kc_wsum(mism);
    nans = kc_wsum(nans);
    if ((threadIdx.x & 31) == 0) {
        if (mism) atomicAdd(&out[0], mism);
        if (nans) atomicAdd(&out[1], nans);
    }
}
"""


class HeadersUnavailable(RuntimeError):
    """cuda_fp16.h / cuda_bf16.h cannot be found: the device intrinsics cannot be compiled."""


def _candidates() -> list[str]:
    roots: list[str] = []
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            roots.append(os.path.join(os.environ[env], "include"))
    roots += ["/usr/local/cuda/include"]
    try:
        import cupy

        get = getattr(cupy.cuda, "get_cuda_path", None)
        if get and get():
            roots.append(os.path.join(get(), "include"))
        roots += sorted(
            glob.glob(os.path.join(os.path.dirname(cupy.__file__), "_core", "include", "cupy", "_cuda", "*"))
        )
    except ImportError:
        pass
    try:
        import nvidia

        for base in getattr(nvidia, "__path__", []):
            roots += sorted(glob.glob(os.path.join(base, "*", "include")))
            roots += sorted(glob.glob(os.path.join(base, "*", "*", "include")))
    except ImportError:
        pass
    return roots


@functools.cache
def header_dir() -> str:
    """A directory holding both cuda_fp16.h and cuda_bf16.h; HeadersUnavailable lists where it looked."""
    tried = _candidates()
    for d in tried:
        if os.path.isfile(os.path.join(d, "cuda_fp16.h")) and os.path.isfile(os.path.join(d, "cuda_bf16.h")):
            return d
    raise HeadersUnavailable(f"cuda_fp16.h and cuda_bf16.h not found (looked in {tried})")


def kernel_source(op: str, fmt: str) -> tuple[str, str]:
    """(CUDA source, kernel name) of the sweep of ``op`` in ``fmt``."""
    if op not in OPS or fmt not in FORMATS:
        raise KeyError(f"unknown op/format {op!r}/{fmt!r}; ops {OPS}, formats {sorted(FORMATS)}")
    eb, fb = FORMATS[fmt]
    name = f"kc_halfprec_{op}_{fmt}"
    src = (
        _SOURCE.replace("__EB__", str(eb))
        .replace("__FB__", str(fb))
        .replace("__NAME__", name)
        .replace("__UNARY__", "1" if op in UNARY else "0")
        .replace("__DEV__", _DEV[(fmt, op)])
        .replace("__REF__", _REF[op])
    )
    return src, name


@functools.cache
def _kernel(op: str, fmt: str) -> Any:
    import cupy

    from native.nvrtc import get_route

    src, name = kernel_source(op, fmt)
    opts = (*get_route(ROUTE).flags.options(), f"-I{header_dir()}")
    arch = str(cupy.cuda.Device().compute_capability)
    compiled = cupy.cuda.compiler.compile_using_nvrtc(src, options=opts, arch=arch)
    binary = compiled[0] if isinstance(compiled, tuple) else compiled
    module = cupy.cuda.function.Module()
    module.load(binary)
    return module.get_function(name)


def sweep_op(op: str, fmt: str, *, lo: int = 0, hi: int | None = None, cap: int = 64) -> dict[str, Any]:
    """Every operand pair (or operand) in [lo, hi) of ``op`` in ``fmt`` on the GPU against the exact reference."""
    import cupy

    total = 1 << 16 if op in UNARY else 1 << 32
    hi = total if hi is None else min(hi, total)
    t0 = time.perf_counter()
    k = _kernel(op, fmt)
    compile_s = time.perf_counter() - t0
    out = cupy.zeros(3, dtype=cupy.uint64)
    bad = cupy.zeros(4 * cap, dtype=cupy.uint32)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for base in range(lo, hi, 1 << 30):
        n = min(1 << 30, hi - base)
        k((132 * 16,), (256,), (np.uint64(base), np.uint64(n), out, bad, np.uint32(cap)))
    stop.record()
    stop.synchronize()
    o = [int(v) for v in out.get()]
    nb = min(o[2], cap)
    rows = bad[: 4 * nb].get().reshape(-1, 4)
    return {
        "op": op,
        "fmt": fmt,
        "route": ROUTE,
        "elements": hi - lo,
        "exhaustive": lo == 0 and hi == total,
        "mismatches": o[0],
        "nan_results": o[1],
        "first_mismatches": [
            {
                "a": f"0x{a:04X}",
                **({} if op in UNARY else {"b": f"0x{b:04X}"}),
                "device": f"0x{g:04X}",
                "reference": f"0x{r:04X}",
            }
            for a, b, g, r in rows.tolist()
        ],
        "kernel_ms": round(cupy.cuda.get_elapsed_time(start, stop), 3),
        "compile_s": round(compile_s, 3),
    }
