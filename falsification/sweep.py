"""Exhaustive sweeps: unary binary32 kernels on all 2^32 inputs (GPU); all pairs of small formats (CPU).

``sweep("sqrt", device="cuda")`` runs the kernel over every binary32 bit pattern in chunks on the GPU and
compares each chunk with the reference computed on the GPU as well (softfloat for correctly rounded ops,
float64 evaluation for transcendentals), so no 16 GiB array ever crosses the bus. On the host a 2^32
sweep is too slow: pass ``lo``/``hi`` (a bit-pattern range) or ``sample`` (that many seeded patterns).

For formats of at most 16 bits (``fmt="e4m3"``, ``"binary16"``, ...) the sweep checks the *reference*:
softfloat in that format on every operand pair against an independent oracle (the operation in float64,
exact or innocuously double-rounded for p <= 11, rounded once to the format by :func:`round_to_format`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from falsification.agreement import NAN_MISMATCH, ulp_distance
from falsification.float32_inputs import BatchSpec, generate_bits
from falsification.fused_reference import fused_approx_reference, has_fused_reference
from native.elementwise import get_kernel, run_flat
from native.nvrtc import get_route
from obligations.core.device import array_module, resolve_device
from spec import softfloat as sf
from spec.elementwise import array_namespace, bits_to_f64, canonical_nan, get_reference, round_f64_to_f32

__all__ = ["sweep", "compare_chunk", "compare_chunk_fused", "round_to_format", "resolve_format",
           "DEFAULT_ULP_BOUNDS", "HOST_DEFAULT_SAMPLE"]

# CUDA C++ Programming Guide maxima for the transcendental kernels, and the project's derived ones.
DEFAULT_ULP_BOUNDS: dict[str, int] = {"exp": 2, "log": 1, "tanh": 2, "sigmoid": 6}
HOST_DEFAULT_SAMPLE = 1 << 22
_ALL = 1 << 32


def resolve_format(fmt: Any) -> Any:
    """A softfloat Format from a Format, "binary32"/"binary16"/"bfloat16", or "eXmY"."""
    if not isinstance(fmt, str):
        return fmt
    named = {
        "binary32": sf.BINARY32,
        "binary16": sf.BINARY16,
        "bfloat16": sf.BFLOAT16,
        "binary64": sf.BINARY64,
    }
    if fmt in named:
        return named[fmt]
    if fmt.startswith("e") and "m" in fmt:
        e, m = fmt[1:].split("m")
        return sf.Format(int(e), int(m))
    raise ValueError(f"unknown format {fmt!r}: use binary32, binary16, bfloat16 or eXmY (e.g. e4m3)")


def round_to_format(x: np.ndarray, fmt: Any) -> np.ndarray:
    """Bits of float64 ``x`` rounded to nearest-even in ``fmt`` (subnormals, overflow to Inf; NaN quiet).

    Written from the format's parameters only (frexp/rint), independently of softfloat's integer code.
    """
    p, bias, fb = fmt.frac_bits + 1, (1 << (fmt.exp_bits - 1)) - 1, fmt.frac_bits
    emin, emax = 1 - bias, bias
    sign = np.signbit(x).astype(np.uint64) << np.uint64(fmt.bits - 1)
    ax = np.abs(x)
    with np.errstate(all="ignore"):
        _, e2 = np.frexp(ax)
        q = np.maximum(e2 - 1, emin) - (p - 1)  # exponent of one unit in the last place
        r = np.rint(np.ldexp(ax, -q))  # exact scaling, then round half to even
        carry = r >= 2**p
        r = np.where(carry, r / 2, r)
        q = np.where(carry, q + 1, q)
        normal = r >= 2 ** (p - 1)
        biased = np.where(normal, q + (p - 1) + bias, 0).astype(np.int64)
        frac = np.where(normal, r - 2 ** (p - 1), r).astype(np.uint64)
    bits = (biased.astype(np.uint64) << np.uint64(fb)) | frac
    inf = np.uint64(((1 << fmt.exp_bits) - 1) << fb)
    bits = np.where(np.isinf(ax) | (biased > emax + bias), inf, bits)
    bits = np.where(ax == 0, np.uint64(0), bits)
    bits = np.where(np.isnan(x), inf | np.uint64(1 << (fb - 1)), bits | sign)
    return bits.astype(fmt.dtype)


def _to_f64(bits: np.ndarray, fmt: Any) -> np.ndarray:
    b = bits.astype(np.int64)
    fb, bias = fmt.frac_bits, (1 << (fmt.exp_bits - 1)) - 1
    e = (b >> fb) & ((1 << fmt.exp_bits) - 1)
    f = b & ((1 << fb) - 1)
    mag = np.where(
        e == 0,
        np.ldexp(f.astype(np.float64), 1 - bias - fb),
        np.ldexp((f + (1 << fb)).astype(np.float64), (e - bias - fb).astype(np.int64)),
    )
    mag = np.where(e == (1 << fmt.exp_bits) - 1, np.where(f == 0, np.inf, np.nan), mag)
    return np.where((b >> (fmt.bits - 1)) & 1 == 1, -mag, mag)


_ORACLE = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def _small_format_sweep(op: str, fmt: Any, lo: int, hi: int | None, max_ce: int) -> dict[str, Any]:
    nvals = 1 << fmt.bits
    unary = op == "sqrt"
    total = nvals if unary else nvals * nvals
    hi = total if hi is None else min(hi, total)
    t0 = time.perf_counter()
    idx = np.arange(lo, hi, dtype=np.int64)
    a = (idx % nvals).astype(fmt.dtype) if unary else (idx // nvals).astype(fmt.dtype)
    b = None if unary else (idx % nvals).astype(fmt.dtype)
    with np.errstate(all="ignore"):
        if unary:
            got = sf.sqrt(a, fmt=fmt, env="ieee")
            want = round_to_format(np.sqrt(_to_f64(a, fmt)), fmt)
        else:
            got = getattr(sf, op)(a, b, fmt=fmt, env="ieee")
            want = round_to_format(_ORACLE[op](_to_f64(a, fmt), _to_f64(b, fmt)), fmt)
    nan_g, nan_w = sf.is_nan(got, fmt), sf.is_nan(want, fmt)
    bad = np.where(nan_g | nan_w, nan_g != nan_w, got != want)  # NaN results compared by class
    secs = time.perf_counter() - t0
    where = np.flatnonzero(bad)[:max_ce]
    return {
        "op": op,
        "fmt": fmt.name,
        "subject": "softfloat reference",
        "oracle": "float64 rounded once (frexp/rint)",
        "device": "host",
        "elements": int(hi - lo),
        "exhaustive": lo == 0 and hi == total,
        "range": [lo, hi],
        "seconds": round(secs, 4),
        "disagreements": int(bad.sum()),
        "first_counterexamples": [
            {
                "a": hex(int(a[i])),
                **({} if unary else {"b": hex(int(b[i]))}),
                "softfloat": hex(int(got[i])),
                "oracle": hex(int(want[i])),
            }
            for i in where
        ],
    }


def _distance_and_bad(nat: Any, ref: Any, alt: Any, bound: int, exact: bool) -> tuple[Any, Any]:
    """Per element: ULP distance to the reference (the nearer of ref/alt) and the disagreement mask."""
    xp = array_namespace(nat)
    d = ulp_distance(nat, ref)
    if alt is not None:
        d = xp.minimum(d, ulp_distance(nat, alt))
    bad = (nat != ref) if exact else (d > bound)
    if alt is not None and bound == 0:
        bad &= nat != alt
    return d, bad


def compare_chunk(nat: Any, ref: Any, alt: Any, bound: int, *, exact: bool) -> tuple[np.ndarray, int, int]:
    """(histogram of 0/1/2/3/>3-or-NaN ULPs, max finite ULP, disagreements) of one chunk, array ops."""
    xp = array_namespace(nat)
    d, bad = _distance_and_bad(nat, ref, alt, bound, exact)
    finite = d < NAN_MISMATCH
    m = int(d.size)
    max_ulp = int(xp.where(finite, d, 0).max()) if m else 0
    h = [int(((d == v) & finite).sum()) for v in range(4)]
    return np.array(h + [m - sum(h)], dtype=np.int64), max_ulp, int(bad.sum())


_FUSED_COMPARE = r"""
typedef unsigned long long u64;
__device__ __forceinline__ bool kc_is_nan(unsigned x) { return (x & 0x7FFFFFFFu) > 0x7F800000u; }
__device__ __forceinline__ long long kc_key(unsigned x) {
    long long mag = (long long)(x & 0x7FFFFFFFu);
    return (x & 0x80000000u) ? -mag : mag;  // +0 and -0 are one point
}
__device__ __forceinline__ u64 kc_dist(unsigned a, unsigned b) {
    bool na = kc_is_nan(a), nb = kc_is_nan(b);
    if (na && nb) return 0ull;
    if (na || nb) return 1ull << 32;  // NAN_MISMATCH
    long long d = kc_key(a) - kc_key(b);
    return (u64)(d < 0 ? -d : d);
}
__device__ __forceinline__ u64 kc_warp_sum(u64 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    return v;
}
__device__ __forceinline__ u64 kc_warp_max(u64 v) {
    for (int o = 16; o > 0; o >>= 1) { u64 w = __shfl_down_sync(0xFFFFFFFFu, v, o); v = w > v ? w : v; }
    return v;
}
// out: [hist0, hist1, hist2, hist3, hist_rest, disagreements, max_finite_ulp]
extern "C" __global__ void kc_sweep_compare(const unsigned* nat, const unsigned* ref, const unsigned* alt,
                                            long long n, u64 bound, int exact, u64* out) {
    u64 h[5] = {0, 0, 0, 0, 0}, bad = 0, mx = 0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned g = nat[i], r = ref[i];
        u64 d = kc_dist(g, r);
        if (alt) { u64 da = kc_dist(g, alt[i]); d = da < d ? da : d; }
        bool b = exact ? (g != r) : (d > bound);
        if (alt && bound == 0) b = b && (g != alt[i]);
        bad += b;
        bool finite = d < (1ull << 32);
        h[finite && d < 4 ? d : 4] += 1;
        if (finite && d > mx) mx = d;
    }
    for (int j = 0; j < 5; ++j) h[j] = kc_warp_sum(h[j]);
    bad = kc_warp_sum(bad);
    mx = kc_warp_max(mx);
    if ((threadIdx.x & 31) == 0) {
        for (int j = 0; j < 5; ++j) if (h[j]) atomicAdd(&out[j], h[j]);
        if (bad) atomicAdd(&out[5], bad);
        if (mx) atomicMax(&out[6], mx);
    }
}
"""


def compare_chunk_fused(nat: Any, ref: Any, alt: Any, bound: int, *, exact: bool) -> tuple[np.ndarray, int, int]:
    """:func:`compare_chunk` in one CUDA kernel (one pass over the chunk instead of ~30 array ops).

    Same semantics; the test suite checks the two against each other on edge and random bit patterns.
    """
    import cupy

    kernel = _fused_kernel()
    nat, ref = (cupy.ascontiguousarray(v).astype(cupy.uint32, copy=False) for v in (nat, ref))
    if alt is not None:
        alt = cupy.ascontiguousarray(alt).astype(cupy.uint32, copy=False)
    n = int(nat.size)
    out = cupy.zeros(7, dtype=cupy.uint64)
    if n:
        blocks = min(max((n + 255) // 256, 1), 4096)  # grid-stride: whole warps, no partial-warp shuffles
        kernel((blocks,), (256,), (nat, ref, alt if alt is not None else 0, np.int64(n),
                                   np.uint64(bound), np.int32(exact), out))
    got = out.get().astype(np.int64)
    return got[:5], int(got[6]), int(got[5])


@functools.cache
def _fused_kernel() -> Any:
    import cupy

    return cupy.RawKernel(_FUSED_COMPARE, "kc_sweep_compare")


# The chunk comparison per device: one fused kernel on CUDA, array ops on the host.
_COMPARE: dict[str, Callable[..., tuple[np.ndarray, int, int]]] = {"host": compare_chunk, "cuda": compare_chunk_fused}


def _counterexamples(x: Any, nat: Any, ref: Any, alt: Any, bound: int, exact: bool, limit: int) -> list[dict]:
    """The first ``limit`` disagreeing inputs of a chunk (recomputed with array ops: chunks with any are rare)."""
    xp = array_namespace(nat)
    d, bad = _distance_and_bad(nat, ref, alt, bound, exact)
    return [{"input": f"0x{int(x[i]):08X}", "native": f"0x{int(nat[i]):08X}", "reference": f"0x{int(ref[i]):08X}",
             "ulp": "nan-mismatch" if int(d[i]) >= NAN_MISMATCH else int(d[i])}
            for i in xp.flatnonzero(bad)[:limit].tolist()]


def sweep(
    op: str,
    env: str | None = None,
    device: str = "auto",
    fmt: Any = "binary32",
    *,
    lo: int = 0,
    hi: int | None = None,
    sample: int | None = None,
    route: str = "nvrtc-ieee",
    bound: int | None = None,
    reference: str = "softfloat",
    chunk: int | None = None,
    max_counterexamples: int = 8,
    seed: int = 0,
    variant: str | None = None,
) -> dict[str, Any]:
    """Check a unary kernel on every binary32 pattern in [lo, hi) (default: all 2^32) or ``sample`` ones.

    Returns a JSON-ready dict: elements, seconds, elements_per_s, max_ulp, disagreements (beyond
    ``bound``: 0 for correctly rounded ops, the guide's bound for transcendentals), a distance histogram
    and the first counterexamples. ``fmt`` other than binary32 sweeps the softfloat reference itself.
    ``reference="float64"`` uses float64 evaluation for correctly rounded ops (exact for sqrt/inv).
    """
    f = resolve_format(fmt)
    if f.bits <= 16:
        return _small_format_sweep(op, f, lo, hi, max_counterexamples)
    if f != sf.BINARY32:
        raise ValueError(f"kernel sweeps are binary32 only, not {f.name}")
    dev = resolve_device(device)
    xp = array_module(dev)
    k = get_kernel(op)
    if len(k.inputs) != 1 or k.scalars:
        raise ValueError(
            f"sweep covers unary kernels without scalars; {op} has inputs {k.inputs} scalars {k.scalars}"
        )
    env = env or get_route(route).env
    ref_op = get_reference(k.reference)
    approx = ref_op.kind == "approx" or reference == "float64"
    # On the GPU an approx reference (float64-defined whatever ``reference`` says) with a one-kernel form
    # uses it; the form is cross-checked against the array form.
    fused_ref = dev == "cuda" and ref_op.kind == "approx" and has_fused_reference(k.reference)
    bound = bound if bound is not None else (DEFAULT_ULP_BOUNDS.get(op, 0) if ref_op.kind == "approx" else 0)
    if hi is None and sample is None and dev == "host":
        sample = HOST_DEFAULT_SAMPLE  # 2^32 on one CPU core would take hours
    hi = _ALL if hi is None else hi
    total = sample if sample is not None else hi - lo
    chunk = chunk or (1 << 27 if dev == "cuda" else 1 << 20)
    hist = np.zeros(5, dtype=np.int64)  # 0, 1, 2, 3, >3 ulps (NaN mismatches in the last)
    max_ulp, bad_total, ces = 0, 0, []
    sync = (lambda: xp.cuda.Device().synchronize()) if dev == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    t_native = t_ref = t_cmp = 0.0
    done = 0
    while done < total:
        m = min(chunk, total - done)
        if sample is not None:
            x = generate_bits(BatchSpec(seed=seed + done, size=m, mix="uniform"), 1, xp)[0]
        else:
            x = (xp.arange(lo + done, lo + done + m, dtype=xp.uint64)).astype(xp.uint32)
        ta = time.perf_counter()
        (out,), _ = run_flat(op, [x.view(xp.float32)], (), device=dev, route=route, variant=variant)
        nat = out.view(xp.uint32)
        sync()
        tb = time.perf_counter()
        if approx and ref_op.kind != "approx":
            with np.errstate(all="ignore"):
                r64 = {"sqrt": xp.sqrt, "inv": lambda v: 1.0 / v}[op](bits_to_f64(x))
            ref_bits, _ = round_f64_to_f32(r64)  # exact for sqrt and 1/x (Roux 2014)
            nan = ((ref_bits & 0x7F800000) == 0x7F800000) & ((ref_bits & 0x7FFFFF) != 0)
            ref_bits = xp.where(nan, xp.uint32(canonical_nan(env)), ref_bits).astype(xp.uint32)
            if env.endswith("-ftz"):
                raise ValueError("reference='float64' implements non-flushing environments only")
            alt = None
        else:
            r = (fused_approx_reference(k.reference, x, env) if fused_ref else ref_op.evaluate(x, env=env))
            ref_bits, alt = r.bits, r.alt
        sync()
        tc = time.perf_counter()
        h, chunk_max, nb = _COMPARE[dev](nat, ref_bits, alt, bound, exact=bound == 0 and not approx)
        hist += h
        max_ulp = max(max_ulp, chunk_max)
        bad_total += nb
        if nb and len(ces) < max_counterexamples:
            ces += _counterexamples(x, nat, ref_bits, alt, bound, bound == 0 and not approx,
                                    max_counterexamples - len(ces))
        t_native += tb - ta
        t_ref += tc - tb
        t_cmp += time.perf_counter() - tc
        done += m
    sync()
    secs = time.perf_counter() - t0
    return {
        "op": op,
        "fmt": "binary32",
        "env": env,
        "device": dev,
        "route": route,
        "variant": variant or "default",
        "reference": ("float64 rounded once (ambiguous roundings accept both neighbours)"
                      + ("; one-kernel CUDA form of spec.elementwise" if fused_ref else "")) if approx
        else "softfloat (on the same device)",
        "range": None if sample is not None else [lo, hi],
        "sample": sample,
        "seed": seed if sample else None,
        "elements": int(total),
        "exhaustive": sample is None and lo == 0 and hi == _ALL,
        "seconds": round(secs, 4),
        "native_seconds": round(t_native, 4),
        "reference_seconds": round(t_ref, 4),
        "compare_seconds": round(t_cmp, 4),
        "comparison": "one fused CUDA kernel per chunk" if dev == "cuda" else "array ops",
        "elements_per_s": round(total / secs, 1) if secs else None,
        "bound": bound,
        "max_ulp": max_ulp,
        "disagreements": bad_total,
        "histogram": {
            "0": int(hist[0]),
            "1": int(hist[1]),
            "2": int(hist[2]),
            "3": int(hist[3]),
            ">3_or_nan": int(hist[4]),
        },
        "first_counterexamples": ces,
    }
