"""CUDA sweep kernels of the math-library audit: every binary32 input of one function, reduced on the device.

One kernel per function (:func:`kernel_source`), compiled through the project's NVRTC route of the float
environment (``cuda`` -> ``nvrtc-ieee``: subnormals kept; ``cuda-ftz`` -> ``nvrtc-ftz``: ``-ftz=true``). Each
thread takes input bits ``x`` from its index (no input array), computes the CUDA float function ``g = f(x)``
and the double function ``y = f64(x)`` (the input read as zero where the environment flushes it), and the
float64-tier reference of :mod:`spec.libm`: ``RN32(y)`` by integer operations on the bits of ``y`` (so the
route's ``-ftz`` cannot touch the reference), with the window ``W`` decided by rounding ``y - W`` (rounded
down) and ``y + W`` (rounded up). Per chunk the device reduces to a few numbers -- the ULP histogram, the
maxima with their inputs (packed ``value << 32 | x`` and ``atomicMax``), violations of the documented bound
(pieces passed as numbers), zero-sign mismatches -- and lists only the ambiguous inputs (to be settled with
MPFR on the host), the first violations, and a fixed sample of ``(x, y)`` for the reference self-check.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from native.builds import Build, register_builds
from spec.libm import LibmFunction, get_function

__all__ = [
    "ROUTES",
    "OUT_FIELDS",
    "kernel_source",
    "kernel_name",
    "values_source",
    "values",
    "sweep_function",
    "SAMPLE_MOD",
]

# Float environment -> the compile route that realises it (native.nvrtc).
ROUTES: dict[str, str] = {"cuda": "nvrtc-ieee", "cuda-ftz": "nvrtc-ftz"}
SAMPLE_MOD = 4194301  # inputs x with x % SAMPLE_MOD == 0 (1024 of 2^32) return (x, y) for the reference self-check

OUT_FIELDS: tuple[str, ...] = (
    *(f"hist{i}" for i in range(10)),
    "max_ulp_packed",
    "max_ulp_judged_packed",
    "max_abs_packed",
    "violations",
    "worst_ulp_violation_packed",
    "worst_abs_violation_packed",
    "ambiguous",
    "violation_list",
    "zero_sign_mismatch",
    "samples",
    "judged",
    "series_ties",
)
_OUT = {k: i for i, k in enumerate(OUT_FIELDS)}

_COMMON = r"""
typedef unsigned long long u64;
__device__ __forceinline__ double kc_f2d(unsigned b) {
    unsigned s = b >> 31, e = (b >> 23) & 0xFFu, f = b & 0x7FFFFFu;
    u64 r;
    if (e == 0xFFu) r = (0x7FFull << 52) | ((u64)f << 29);
    else if (e == 0u) {
        if (f == 0u) r = 0ull;
        else { int n = 31 - __clz(f); r = ((u64)(n - 149 + 1023) << 52) | (((u64)f << (52 - n)) & 0xFFFFFFFFFFFFFull); }
    } else r = ((u64)(e - 127 + 1023) << 52) | ((u64)f << 29);
    return __longlong_as_double((long long)(r | ((u64)s << 63)));
}
// RN32 of a double by integer operations; *tie: the dropped bits were exactly one half.
__device__ __forceinline__ unsigned kc_rn32(double v, int* tie) {
    u64 d = (u64)__double_as_longlong(v);
    unsigned s = (unsigned)(d >> 32) & 0x80000000u;
    int e = (int)((d >> 52) & 0x7FF);
    u64 m = d & 0xFFFFFFFFFFFFFull;
    *tie = 0;
    if (e == 0x7FF) return m ? 0x7FFFFFFFu : (s | 0x7F800000u);
    if (e == 0) return s;
    int E = e - 1023;
    if (E > 127) return s | 0x7F800000u;
    int shift = E >= -126 ? 29 : 29 + (-126 - E);
    if (shift > 63) return s;
    u64 sig = m | (1ull << 52);
    u64 kept = sig >> shift, rem = sig & ((1ull << shift) - 1ull), half = 1ull << (shift - 1);
    if (rem > half || (rem == half && (kept & 1ull))) kept++;
    *tie = rem == half;
    unsigned bits = E >= -126 ? (((unsigned)(E + 127) << 23) + (unsigned)(kept - (1ull << 23))) : (unsigned)kept;
    return s | bits;
}
__device__ __forceinline__ unsigned kc_flush(unsigned b, int ftz) {
    return (ftz && (b & 0x7F800000u) == 0u) ? (b & 0x80000000u) : b;
}
__device__ __forceinline__ bool kc_nan32(unsigned b) { return (b & 0x7FFFFFFFu) > 0x7F800000u; }
// Key of a binary32 on its number line; under ftz the flushed line (no subnormals, +-0 next to +-FLT_MIN).
__device__ __forceinline__ long long kc_key(unsigned a, int ftz) {
    unsigned m = a & 0x7FFFFFFFu;
    if (ftz) m = m >= 0x00800000u ? m - 0x007FFFFFu : 0u;
    return (a & 0x80000000u) ? -(long long)m : (long long)m;
}
__device__ __forceinline__ unsigned kc_dist(unsigned a, unsigned b, int ftz) {
    bool na = kc_nan32(a), nb = kc_nan32(b);
    if (na && nb) return 0u;
    if (na || nb) return 0xFFFFFFFFu;
    long long d = kc_key(a, ftz) - kc_key(b, ftz);
    d = d < 0 ? -d : d;
    return d > 0xFFFFFFFEll ? 0xFFFFFFFEu : (unsigned)d;
}
__device__ __forceinline__ int kc_piece(const double* P, int np, double x) {
    for (int k = 0; k < np; ++k) {
        const double* q = P + 6 * k;
        int r = (int)q[0];
        bool in;
        if (r == 0) in = true;
        else if (x != x) in = false;
        else if (r == 1) in = q[1] <= x && x <= q[2];
        else if (r == 2) in = x < q[1] || x > q[2];
        else if (r == 3) in = fabs(x) < q[1];
        else in = fabs(x) >= q[1];
        if (in) return k;
    }
    return -1;
}
__device__ __forceinline__ u64 kc_wsum(u64 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    return v;
}
__device__ __forceinline__ u64 kc_wmax(u64 v) {
    for (int o = 16; o > 0; o >>= 1) { u64 w = __shfl_down_sync(0xFFFFFFFFu, v, o); v = w > v ? w : v; }
    return v;
}
__device__ __forceinline__ void kc_push(u64* out, int slot, unsigned* buf, unsigned cap, unsigned a, unsigned b) {
    unsigned long long k = atomicAdd(&out[slot], 1ull);
    if (k < cap) { buf[2 * k] = a; buf[2 * k + 1] = b; }
}
"""

_KERNEL = r"""
extern "C" __global__ void __NAME__(u64 base, u64 n, int ftz, const double* P, int np, double K,
                                    double abs_thr, double abs_err, u64* out, unsigned* amb, unsigned amb_cap,
                                    unsigned* viol, unsigned viol_cap, double* samples, unsigned sample_cap,
                                    unsigned sample_mod, double tie_t, double tie_c, int tie_dir) {
    u64 h[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    u64 mx = 0, mxj = 0, mxa = 0, nviol = 0, wv = 0, wva = 0, zs = 0, judged = 0, ties = 0;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned xb = (unsigned)(base + i);
        float x = __uint_as_float(xb);
        float g = __FCALL__;
        unsigned gb = __float_as_uint(g);
        unsigned xr = kc_flush(xb, ftz);
        double xd = kc_f2d(xr);
        double yd = __DCALL__;
        double xo = kc_f2d(xb);
        if (sample_mod && xb % sample_mod == 0u) {
            unsigned long long k = atomicAdd(&out[__SAMPLES__], 1ull);
            if (k < sample_cap) { samples[2 * k] = xo; samples[2 * k + 1] = yd; }
        }
        int k = kc_piece(P, np, xo);
        int bk = k >= 0 ? (int)P[6 * k + 3] : 0;
        if (bk == 3) {  // absolute bound
            h[9]++; judged++;
            double E = P[6 * k + 4];
            bool gn = kc_nan32(gb), rn = yd != yd;
            bool bad;
            double err = 0.0;
            if (gn || rn) bad = gn != rn;
            else if (isinf(yd) || isinf(g)) bad = kc_f2d(gb) != yd;
            else {
                double gd = kc_f2d(gb);
                err = fabs(gd - yd);
                double wa = __dadd_ru(__dmul_ru(K * 2.0 * 1.1102230246251565e-16, fabs(gd) + fabs(yd)),
                                      (abs_thr > 0.0 && fabs(xo) >= abs_thr) ? 2.0 * abs_err : 0.0);
                if (fabs(err - E) <= wa) { kc_push(out, __AMB__, amb, amb_cap, xb, gb); h[9]--; judged--; continue; }
                bad = err > E;
                u64 pe = ((u64)__float_as_uint(__double2float_ru(err)) << 32) | xb;
                mxa = pe > mxa ? pe : mxa;
            }
            if (bad) {
                nviol++;
                bool sp = gn || rn || isinf(yd) || isinf(g);
                u64 pe = ((u64)(sp ? 0x7F800000u : __float_as_uint(__double2float_ru(err))) << 32) | xb;
                wva = pe > wva ? pe : wva;
                kc_push(out, __VLIST__, viol, viol_cap, xb, gb);
            }
            continue;
        }
        unsigned r;
        bool am = false;
        if (yd != yd) r = 0x7FFFFFFFu;
        else if (isinf(yd)) r = (yd < 0.0 ? 0x80000000u : 0u) | 0x7F800000u;
        else {
            double w = __dadd_ru(__dmul_ru(K * 2.220446049250313e-16, fabs(yd)), K * 4.9406564584124654e-324);
            if (abs_thr > 0.0 && fabs(xo) >= abs_thr) w = __dadd_ru(w, 2.0 * abs_err);
            int t0, t1, t2;
            r = kc_flush(kc_rn32(yd, &t0), ftz);
            unsigned rl = kc_flush(kc_rn32(__dsub_rd(yd, w), &t1), ftz);
            unsigned rh = kc_flush(kc_rn32(__dadd_ru(yd, w), &t2), ftz);
            bool bz = ((rl | rh) & 0x7FFFFFFFu) == 0u;
            am = (rl != rh && !bz) || t1 || t2;
            // an exact tie y == c x at a tiny x: the series remainder's known sign decides (spec.libm.tiny_tie)
            if (am && t0 && tie_t > 0.0 && xd != 0.0 && fabs(xd) < tie_t && yd == tie_c * xd) {
                r = ((yd > 0.0) == (tie_dir < 0)) ? rl : rh;
                am = false;
                ties++;
            }
        }
        if (am) { kc_push(out, __AMB__, amb, amb_cap, xb, gb); continue; }
        unsigned d = kc_dist(gb, r, ftz);
        if (((gb | r) & 0x7FFFFFFFu) == 0u && gb != r) zs++;
        int bucket = d == 0xFFFFFFFFu ? 8 : d <= 4u ? (int)d : d <= 8u ? 5 : d <= 16u ? 6 : 7;
        h[bucket]++;
        u64 pk = ((u64)d << 32) | xb;
        mx = pk > mx ? pk : mx;
        if (bk == 1 || bk == 2) {
            judged++;
            mxj = pk > mxj ? pk : mxj;
            double B = bk == 1 ? P[6 * k + 4] : P[6 * k + 4] + floor(fabs(P[6 * k + 5] * xo));
            if ((double)d > B) {
                nviol++;
                wv = pk > wv ? pk : wv;
                kc_push(out, __VLIST__, viol, viol_cap, xb, gb);
            }
        }
    }
    for (int j = 0; j < 10; ++j) h[j] = kc_wsum(h[j]);
    nviol = kc_wsum(nviol); zs = kc_wsum(zs); judged = kc_wsum(judged); ties = kc_wsum(ties);
    mx = kc_wmax(mx); mxj = kc_wmax(mxj); mxa = kc_wmax(mxa); wv = kc_wmax(wv); wva = kc_wmax(wva);
    if ((threadIdx.x & 31) == 0) {
        for (int j = 0; j < 10; ++j) if (h[j]) atomicAdd(&out[j], h[j]);
        if (mx) atomicMax(&out[10], mx);
        if (mxj) atomicMax(&out[11], mxj);
        if (mxa) atomicMax(&out[12], mxa);
        if (nviol) atomicAdd(&out[13], nviol);
        if (wv) atomicMax(&out[14], wv);
        if (wva) atomicMax(&out[15], wva);
        if (zs) atomicAdd(&out[18], zs);
        if (judged) atomicAdd(&out[20], judged);
        if (ties) atomicAdd(&out[21], ties);
    }
}
"""


_VALUES = r"""
extern "C" __global__ void __NAME___values(const unsigned* xs, u64 n, int ftz, unsigned* g, double* y) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        unsigned xb = xs[i];
        float x = __uint_as_float(xb);
        g[i] = __float_as_uint(__FCALL__);
        double xd = kc_f2d(kc_flush(xb, ftz));
        y[i] = __DCALL__;
    }
}
"""


def values_source(name: str) -> tuple[str, str]:
    """(CUDA source, kernel name) of a kernel writing, per input, the float result bits and the float64 tier value."""
    fn = get_function(name)
    kname = kernel_name(fn) + "_values"
    body = _VALUES.replace("__NAME__", kernel_name(fn)).replace("__FCALL__", fn.cuda).replace("__DCALL__", fn.double)
    return _COMMON + body, kname


def values(name: str, env: str, xs: Any) -> tuple[np.ndarray, np.ndarray]:
    """(float result bits, float64 tier values) of ``name`` at input bits ``xs`` on the GPU under ``env``."""
    import cupy

    from native.nvrtc import compile_function

    src, kname = values_source(name)
    k = compile_function(src, kname, ROUTES[env])
    x = cupy.asarray(np.asarray(xs, np.uint32))
    g = cupy.zeros(x.size, cupy.uint32)
    y = cupy.zeros(x.size, cupy.float64)
    k((256,), (256,), (x, np.uint64(x.size), np.int32(env == "cuda-ftz"), g, y))
    return g.get(), y.get()


def kernel_name(fn: LibmFunction) -> str:
    """The extern "C" name of ``fn``'s sweep kernel."""
    return "kc_libm_" + fn.name.strip("_").replace("__", "_") + ("_intr" if fn.intrinsic else "")


def kernel_source(name: str) -> tuple[str, str]:
    """(CUDA source, kernel name) of the sweep kernel of function ``name``."""
    fn = get_function(name)
    kname = kernel_name(fn)
    body = (
        _KERNEL.replace("__NAME__", kname)
        .replace("__FCALL__", fn.cuda)
        .replace("__DCALL__", fn.double)
        .replace("__SAMPLES__", str(_OUT["samples"]))
        .replace("__AMB__", str(_OUT["ambiguous"]))
        .replace("__VLIST__", str(_OUT["violation_list"]))
    )
    return _COMMON + body, kname


@functools.cache
def _kernel(name: str, route: str) -> Any:
    from native.nvrtc import compile_function

    src, kname = kernel_source(name)
    return compile_function(src, kname, route)


def _unpack(v: int) -> tuple[int, int] | None:
    return None if v == 0 else (v >> 32, v & 0xFFFFFFFF)


def sweep_function(
    name: str,
    env: str,
    pieces: Sequence[float] = (),
    *,
    lo: int = 0,
    hi: int = 1 << 32,
    chunk: int = 1 << 30,
    amb_cap: int = 1 << 20,
    viol_cap: int = 64,
    sample_mod: int = SAMPLE_MOD,
) -> dict[str, Any]:
    """Sweep inputs [lo, hi) of ``name`` on the GPU under ``env``; pieces are the flattened kernel numbers.

    Returns the device's reduction (histogram counts, packed maxima, counts), the ambiguous inputs
    ``(x, got)`` and the first violations as arrays, the reference samples, and the timing.
    """
    import cupy

    fn = get_function(name)
    route = ROUTES[env]
    t0 = time.perf_counter()
    kernel = _kernel(name, route)
    compile_s = time.perf_counter() - t0
    np_pieces = len(pieces) // 6
    P = cupy.asarray(np.array(list(pieces) or [0.0] * 6, dtype=np.float64))
    out = cupy.zeros(len(OUT_FIELDS), dtype=cupy.uint64)
    amb = cupy.zeros(2 * amb_cap, dtype=cupy.uint32)
    viol = cupy.zeros(2 * viol_cap, dtype=cupy.uint32)
    sample_cap = 4096
    samples = cupy.zeros(2 * sample_cap, dtype=cupy.float64)
    thr, aerr = fn.double_abs or (0.0, 0.0)
    tie = fn.tiny_tie or (0.0, 0.0, 0)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    chunks = 0
    for base in range(lo, hi, chunk):
        n = min(chunk, hi - base)
        blocks = 132 * 16
        kernel(
            (blocks,),
            (256,),
            (
                np.uint64(base),
                np.uint64(n),
                np.int32(env == "cuda-ftz"),
                P,
                np.int32(np_pieces),
                np.float64(fn.window_ulps),
                np.float64(thr),
                np.float64(aerr),
                out,
                amb,
                np.uint32(amb_cap),
                viol,
                np.uint32(viol_cap),
                samples,
                np.uint32(sample_cap),
                np.uint32(sample_mod),
                np.float64(tie[0]),
                np.float64(tie[1]),
                np.int32(tie[2]),
            ),
        )
        chunks += 1
    stop.record()
    stop.synchronize()
    kernel_ms = cupy.cuda.get_elapsed_time(start, stop)
    o = [int(v) for v in out.get()]
    res = dict(zip(OUT_FIELDS, o, strict=True))
    n_amb = min(res["ambiguous"], amb_cap)
    n_viol = min(res["violation_list"], viol_cap)
    n_smp = min(res["samples"], sample_cap)
    a = amb[: 2 * n_amb].get().reshape(-1, 2)
    v = viol[: 2 * n_viol].get().reshape(-1, 2)
    s = samples[: 2 * n_smp].get().reshape(-1, 2)
    return {
        "function": name,
        "env": env,
        "route": route,
        "inputs": hi - lo,
        "chunks": chunks,
        "hist": [res[f"hist{i}"] for i in range(10)],
        "max_ulp": _unpack(res["max_ulp_packed"]),
        "max_ulp_judged": _unpack(res["max_ulp_judged_packed"]),
        "max_abs": _unpack(res["max_abs_packed"]),
        "violations": res["violations"],
        "worst_ulp_violation": _unpack(res["worst_ulp_violation_packed"]),
        "worst_abs_violation": _unpack(res["worst_abs_violation_packed"]),
        "ambiguous_total": res["ambiguous"],
        "ambiguous_overflow": res["ambiguous"] > amb_cap,
        "ambiguous": a,
        "violation_list": v,
        "zero_sign_mismatch": res["zero_sign_mismatch"],
        "judged": res["judged"],
        "series_ties": res["series_ties"],
        "samples": s,
        "kernel_ms": round(kernel_ms, 3),
        "compile_s": round(compile_s, 3),
    }


@register_builds("libm")
def _builds() -> Iterator[Build]:
    # The audit compiles each registered build's PTX on the CPU; one representative per route keeps CI fast
    # (every libm kernel shares the same reference code and differs only in the two calls).
    for name in ("expf", "__expf"):
        src, kname = kernel_source(name)
        for env, route in ROUTES.items():
            del env
            yield Build("libm", f"{name}@{route}", src, kname, route, approximate=True, fused=False)
