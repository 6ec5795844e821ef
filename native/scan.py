"""Selective scan (Mamba, diagonal): chunk plan, host NumPy path and CUDA kernels, forward and VJP.

Shapes: x, delta_raw (L, D); A (D, N); B, C (L, N); Dskip (D,). Stages (contracts/scan-selective-v1.yaml):

1. discretise: delta = softplus(delta_raw), a[t,d,n] = exp(delta[t,d] A[d,n]), b[t,d,n] = (delta B[t,n]) x[t,d];
2. states: h[t] = a[t] h[t-1] + b[t] from h[-1] = 0, either ``sequential`` (one thread per lane (d, n) walks
   t) or ``chunked``: the chunks of :func:`chunk_plan` fold their (a, b) pairs with the combine operator
   (a1, b1) o (a2, b2) = (a1 a2, a2 b1 + b2), a carry pass applies the chunk composites in order, and each chunk
   re-runs its recurrence from its carried state (legal because the combine is associative);
3. output: y[t,d] = (sum over n in order of C[t,n] h[t,d,n]) + Dskip[d] x[t,d].

All float arithmetic is written with ``__fmul_rn``/``__fadd_rn`` (no contraction whatever the route); the
host path performs the same float operations in the same order. Kernels are templated on the float type
(``float`` and ``double``): the float64 build is what the VJP is checked with. Planted bugs are registry
entries (:data:`SOFTPLUS`, :data:`COMBINES`), never branches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from native.builds import Build, register_builds
from obligations.core.symbolic import all_of, as_type, cdiv, smax, smin

__all__ = [
    "BLOCK",
    "CHUNK",
    "MAX_STATES",
    "ROUTE",
    "ChunkPlan",
    "chunk_plan",
    "Softplus",
    "SOFTPLUS",
    "Combine",
    "COMBINES",
    "combine",
    "ScanBuild",
    "kernel_source",
    "discretize",
    "states",
    "output",
    "selective_scan",
    "selective_scan_vjp",
    "ScanGrads",
]

BLOCK = 256
CHUNK = 64
MAX_STATES = 1 << 40  # L * D * N elements at most: every int64 index stays far from 2^63
MAX_GRID = 65535
ROUTE = "nvrtc-ieee"
# The kernels split 64-bit indices with / and %; NVRTC emits a 32-bit fast path for 64-bit division (div.u32,
# mul.lo.s32, taken only when both operands fit in 32 bits), which the audit's index-64 rule cannot tell from a
# 32-bit index, so that rule is not claimed for these builds: the int64 index arithmetic is proved on the plan.
INDEX_BITS_AUDITED = None


# -- the chunk plan (ints at launch time, checker terms in kc check) -----------------------------------------


@dataclass(frozen=True)
class ChunkPlan:
    """Chunks [start(c), end(c)) of a length-L sequence for ``lanes`` = D * N independent recurrences."""

    length: Any
    lanes: Any
    chunk: Any
    nchunks: Any
    states: Any
    admissible: Any

    def start(self, c: Any) -> Any:
        """First step of chunk ``c`` (int64)."""
        return as_type(c, "int64") * self.chunk

    def end(self, c: Any) -> Any:
        """One past the last step of chunk ``c``."""
        return smin(self.start(c) + self.chunk, as_type(self.length, "int64"))

    def chunk_of(self, t: Any) -> Any:
        """The chunk that holds step ``t``."""
        return t // self.chunk

    def state(self, t: Any, j: Any) -> Any:
        """Offset of h[t, lane j] in the (L, D*N) state buffer (int64)."""
        return as_type(t, "int64") * self.lanes + j

    def carry(self, c: Any, j: Any) -> Any:
        """Offset of chunk ``c``'s composite / carried state for lane ``j`` (int64)."""
        return as_type(c, "int64") * self.lanes + j

    def regimes(self) -> dict[str, Any]:
        """The chunked order's paths: no step, one chunk shorter than ``chunk``, whole chunks only, and several
        chunks of which the last is partial (the fold and apply loops stop at ``end(c) < start(c) + chunk``)."""
        L, k = as_type(self.length, "int64"), as_type(self.chunk, "int64")
        return {
            "empty": L == 0,
            "one_partial_chunk": all_of(L > 0, L < k),
            "whole_chunks": all_of(L > 0, L % smax(k, 1) == 0),
            "partial_last_chunk": all_of(L > k, L % smax(k, 1) != 0),
        }


def chunk_plan(length: Any, lanes: Any, chunk: Any = CHUNK) -> ChunkPlan:
    """Chunks of ``chunk`` steps over ``length``; admissible: lanes >= 1, chunk >= 1, length * lanes <= 2^40."""
    per_lane = MAX_STATES // smax(as_type(lanes, "int64"), 1)
    admissible = all_of(length >= 0, lanes >= 1, chunk >= 1, as_type(length, "int64") <= per_lane)
    nchunks = cdiv(as_type(length, "int64"), smax(as_type(chunk, "int64"), 1))
    return ChunkPlan(length, lanes, chunk, nchunks, as_type(length, "int64") * lanes, admissible)


def _grid(threads: int) -> int:
    return max(1, min(-(-threads // BLOCK), MAX_GRID))


# -- registries of the operators a planted bug swaps ----------------------------------------------------------


@dataclass(frozen=True)
class Softplus:
    """delta = softplus(raw): CUDA expression (``{EXP}``/``{LOG1P}`` per float type), host function, derivative."""

    name: str
    cuda: str
    host: Callable[[Any], Any]
    grad: Callable[[Any], Any]


def _softplus(r: Any) -> Any:
    with np.errstate(over="ignore"):
        return np.where(r > 20, r, np.log1p(np.exp(np.minimum(r, 20)))).astype(r.dtype)


def _sigmoid(r: Any) -> Any:
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-r))).astype(r.dtype)


SOFTPLUS: dict[str, Softplus] = {
    "softplus": Softplus("softplus", "(r > (T)20 ? r : {LOG1P}({EXP}(r)))", _softplus, _sigmoid),
    "exp": Softplus("exp", "{EXP}(r)", lambda r: np.exp(r).astype(r.dtype), lambda r: np.exp(r).astype(r.dtype)),
}


@dataclass(frozen=True)
class Combine:
    """The scan's combine (a1, b1) o (a2, b2): CUDA statements updating (A, B) with (a, b), and the host function."""

    name: str
    cuda: str
    host: Callable[[tuple[Any, Any], tuple[Any, Any]], tuple[Any, Any]]


COMBINES: dict[str, Combine] = {
    # (A, B) o (a, b) = (A a, a B + b): the earlier composite first, then step t.
    "stated": Combine(
        "stated",
        "{ const T nA = MUL(A, a); B = ADD(MUL(a, B), b); A = nA; }",
        lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1]),
    ),
    # planted: step t applied first, then the earlier composite ((a, b) o (A, B)).
    "reversed": Combine(
        "reversed",
        "{ const T nA = MUL(a, A); B = ADD(MUL(A, b), B); A = nA; }",
        lambda p, q: (q[0] * p[0], p[0] * q[1] + p[1]),
    ),
}


def combine(p: tuple[Any, Any], q: tuple[Any, Any], name: str = "stated") -> tuple[Any, Any]:
    """(a1, b1) o (a2, b2) under the registered combine ``name`` (numbers, arrays or sympy symbols)."""
    return COMBINES[name].host(p, q)


# -- CUDA source ------------------------------------------------------------------------------------------

_TYPES: dict[str, dict[str, str]] = {
    "float": {"T": "float", "MUL": "__fmul_rn", "ADD": "__fadd_rn", "EXP": "expf", "LOG1P": "log1pf"},
    "double": {"T": "double", "MUL": "__dmul_rn", "ADD": "__dadd_rn", "EXP": "exp", "LOG1P": "log1p"},
}

_SOURCE = r"""
typedef @T@ T;
#define MUL @MUL@
#define ADD @ADD@
__device__ __forceinline__ T kc_softplus(T r) { return @SOFTPLUS@; }

extern "C" __global__ void scan_discretize(const T* __restrict__ x, const T* __restrict__ raw,
        const T* __restrict__ Am, const T* __restrict__ Bm, T* __restrict__ delta, T* __restrict__ a,
        T* __restrict__ b, long long L, long long D, long long N) {
    const long long total = L * D * N;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        const long long n = i % N, td = i / N, d = td % D, t = td / D;
        const T dl = kc_softplus(raw[td]);
        if (n == 0) delta[td] = dl;
        a[i] = @EXP@(MUL(dl, Am[d * N + n]));
        b[i] = MUL(MUL(dl, Bm[t * N + n]), x[td]);
    }
}

extern "C" __global__ void scan_sequential(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ h,
        long long L, long long lanes) {
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < lanes;
         j += (long long)blockDim.x * gridDim.x) {
        T hh = (T)0;
        for (long long t = 0; t < L; ++t) {
            const long long s = t * lanes + j;
            hh = ADD(MUL(a[s], hh), b[s]);
            h[s] = hh;
        }
    }
}

extern "C" __global__ void scan_chunk_fold(const T* __restrict__ ap, const T* __restrict__ bp, T* __restrict__ Ac,
        T* __restrict__ Bc, long long L, long long lanes, long long chunk, long long nchunks) {
    const long long total = nchunks * lanes;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        const long long c = i / lanes, j = i % lanes;
        const long long t0 = c * chunk, t1 = t0 + chunk < L ? t0 + chunk : L;
        T A = (T)1, B = (T)0;
        for (long long t = t0; t < t1; ++t) {
            const T a = ap[t * lanes + j], b = bp[t * lanes + j];
            @COMBINE@
        }
        Ac[i] = A;
        Bc[i] = B;
    }
}

extern "C" __global__ void scan_chunk_carry(const T* __restrict__ Ac, const T* __restrict__ Bc,
        T* __restrict__ hin, long long lanes, long long nchunks) {
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < lanes;
         j += (long long)blockDim.x * gridDim.x) {
        T hh = (T)0;
        for (long long c = 0; c < nchunks; ++c) {
            const long long s = c * lanes + j;
            hin[s] = hh;
            hh = ADD(MUL(Ac[s], hh), Bc[s]);
        }
    }
}

extern "C" __global__ void scan_chunk_apply(const T* __restrict__ a, const T* __restrict__ b,
        const T* __restrict__ hin, T* __restrict__ h, long long L, long long lanes, long long chunk,
        long long nchunks) {
    const long long total = nchunks * lanes;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        const long long c = i / lanes, j = i % lanes;
        const long long t0 = c * chunk, t1 = t0 + chunk < L ? t0 + chunk : L;
        T hh = hin[i];
        for (long long t = t0; t < t1; ++t) {
            const long long s = t * lanes + j;
            hh = ADD(MUL(a[s], hh), b[s]);
            h[s] = hh;
        }
    }
}

extern "C" __global__ void scan_output(const T* __restrict__ Cm, const T* __restrict__ h, const T* __restrict__ x,
        const T* __restrict__ Dk, T* __restrict__ y, long long L, long long D, long long N) {
    const long long total = L * D;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        const long long t = i / D, d = i % D;
        T acc = (T)0;
        for (long long n = 0; n < N; ++n) acc = ADD(acc, MUL(Cm[t * N + n], h[i * N + n]));
        y[i] = ADD(acc, MUL(Dk[d], x[i]));
    }
}

extern "C" __global__ void scan_backward(const T* __restrict__ a, const T* __restrict__ h,
        const T* __restrict__ Cm, const T* __restrict__ dy, T* __restrict__ da, T* __restrict__ db,
        long long L, long long D, long long N) {
    const long long lanes = D * N;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < lanes;
         j += (long long)blockDim.x * gridDim.x) {
        const long long d = j / N, n = j % N;
        T g = (T)0;
        for (long long t = L - 1; t >= 0; --t) {
            const long long s = t * lanes + j;
            const T total = ADD(MUL(Cm[t * N + n], dy[t * D + d]), g);
            da[s] = MUL(total, t > 0 ? h[s - lanes] : (T)0);
            db[s] = total;
            g = MUL(total, a[s]);
        }
    }
}
"""

KERNELS = (
    "scan_discretize",
    "scan_sequential",
    "scan_chunk_fold",
    "scan_chunk_carry",
    "scan_chunk_apply",
    "scan_output",
    "scan_backward",
)


@dataclass(frozen=True)
class ScanBuild:
    """One source configuration: float type, softplus and combine (planted bugs pick other entries)."""

    ftype: str = "float"
    softplus: str = "softplus"
    combine: str = "stated"


def kernel_source(build: ScanBuild = ScanBuild(), kernel: str | None = None) -> str:
    """The CUDA source of ``kernel`` (every scan kernel where None) for ``build``: the prelude plus its text."""
    t = _TYPES[build.ftype]
    src = _SOURCE.replace(
        "@SOFTPLUS@", SOFTPLUS[build.softplus].cuda.replace("{EXP}", t["EXP"]).replace("{LOG1P}", t["LOG1P"])
    ).replace("@COMBINE@", COMBINES[build.combine].cuda)
    for k, v in t.items():
        src = src.replace(f"@{k}@", v)
    prelude, *bodies = src.split('extern "C"')
    if kernel is not None:
        bodies = [b for b in bodies if b.split("(")[0].split()[-1] == kernel]
        if kernel != "scan_discretize":
            prelude = prelude.split("__device__")[0]  # softplus (libdevice) only where it is used
    return prelude + "".join('extern "C"' + b for b in bodies)


@register_builds("scan")
def _builds() -> Iterator[Build]:
    """Every kernel of the shipped float and double builds (discretize is declared approximate: libdevice)."""
    for ftype in ("float", "double"):
        for k in KERNELS:
            yield Build(
                "scan",
                f"{k}<{ftype}>",
                kernel_source(ScanBuild(ftype), k),
                k,
                ROUTE,
                approximate=k == "scan_discretize",
                index_bits=INDEX_BITS_AUDITED,
            )


def _fn(build: ScanBuild, name: str) -> Any:
    from native.nvrtc import compile_function

    return compile_function(kernel_source(build, name), name, ROUTE)


def _xp(device: str) -> Any:
    from obligations.core.device import array_module

    return array_module(device)


def _dtype(build: ScanBuild) -> Any:
    return np.float32 if build.ftype == "float" else np.float64


# -- stages -------------------------------------------------------------------------------------------------


def discretize(
    x: Any, raw: Any, A: Any, B: Any, *, device: str = "host", build: ScanBuild = ScanBuild()
) -> tuple[Any, Any, Any]:
    """(delta (L, D), a (L, D, N), b (L, D, N)) for the build's float type."""
    xp, dt = _xp(device), _dtype(build)
    x, raw, A, B = (xp.ascontiguousarray(v, dtype=dt) for v in (x, raw, A, B))
    L, D = x.shape
    N = A.shape[1]
    if device == "host":
        sp = SOFTPLUS[build.softplus]
        delta = sp.host(raw)
        with np.errstate(over="ignore", under="ignore"):
            a = np.exp(delta[:, :, None] * A[None]).astype(dt)
        b = ((delta[:, :, None] * B[:, None, :]).astype(dt) * x[:, :, None]).astype(dt)
        return delta, a, b
    delta, a, b = xp.empty((L, D), dt), xp.empty((L, D, N), dt), xp.empty((L, D, N), dt)
    _fn(build, "scan_discretize")(
        (_grid(L * D * N),), (BLOCK,), (x, raw, A, B, delta, a, b, np.int64(L), np.int64(D), np.int64(N))
    )
    return delta, a, b


def _host_chunked(a: np.ndarray, b: np.ndarray, plan: ChunkPlan, comb: Combine) -> np.ndarray:
    L, lanes, chunk, nc = int(plan.length), int(plan.lanes), int(plan.chunk), int(plan.nchunks)
    dt = a.dtype
    Ac, Bc = np.ones((nc, lanes), dt), np.zeros((nc, lanes), dt)
    for c in range(nc):
        for t in range(c * chunk, min(c * chunk + chunk, L)):
            Ac[c], Bc[c] = comb.host((Ac[c], Bc[c]), (a[t], b[t]))
    hin, hh = np.zeros((nc, lanes), dt), np.zeros(lanes, dt)
    for c in range(nc):
        hin[c] = hh
        hh = Ac[c] * hh + Bc[c]
    h = np.empty_like(a)
    for c in range(nc):
        hh = hin[c]
        for t in range(c * chunk, min(c * chunk + chunk, L)):
            hh = a[t] * hh + b[t]
            h[t] = hh
    return h


def states(
    a: Any, b: Any, *, order: str = "chunked", chunk: int = CHUNK, device: str = "host", build: ScanBuild = ScanBuild()
) -> Any:
    """h (L, D, N) by the ``sequential`` or ``chunked`` order; the chunk plan guards the launch."""
    xp = _xp(device)
    shape = a.shape
    L = int(shape[0])
    lanes = int(np.prod(shape[1:], dtype=np.int64))
    plan = chunk_plan(L, lanes, chunk)
    if not plan.admissible:
        raise ValueError(f"scan of {L} steps x {lanes} lanes with chunk {chunk} is outside the proved plan")
    a2, b2 = xp.ascontiguousarray(a).reshape(L, lanes), xp.ascontiguousarray(b).reshape(L, lanes)
    if device == "host":
        if order == "sequential":
            h, hh = np.empty_like(a2), np.zeros(lanes, a2.dtype)
            for t in range(L):
                hh = a2[t] * hh + b2[t]
                h[t] = hh
        else:
            h = _host_chunked(a2, b2, plan, COMBINES[build.combine])
        return h.reshape(shape)
    h = xp.empty_like(a2)
    if order == "sequential":
        _fn(build, "scan_sequential")((_grid(lanes),), (BLOCK,), (a2, b2, h, np.int64(L), np.int64(lanes)))
        return h.reshape(shape)
    nc = int(plan.nchunks)
    Ac, Bc, hin = (xp.empty((nc, lanes), a2.dtype) for _ in range(3))
    args = (np.int64(L), np.int64(lanes), np.int64(chunk), np.int64(nc))
    _fn(build, "scan_chunk_fold")((_grid(nc * lanes),), (BLOCK,), (a2, b2, Ac, Bc, *args))
    _fn(build, "scan_chunk_carry")((_grid(lanes),), (BLOCK,), (Ac, Bc, hin, np.int64(lanes), np.int64(nc)))
    _fn(build, "scan_chunk_apply")((_grid(nc * lanes),), (BLOCK,), (a2, b2, hin, h, *args))
    return h.reshape(shape)


def output(C: Any, h: Any, x: Any, Dk: Any, *, device: str = "host", build: ScanBuild = ScanBuild()) -> Any:
    """y[t, d] = fold over n of C[t, n] h[t, d, n] from 0, then + Dskip[d] x[t, d]."""
    xp, dt = _xp(device), _dtype(build)
    C, h, x, Dk = (xp.ascontiguousarray(v, dtype=dt) for v in (C, h, x, Dk))
    L, D, N = h.shape
    if device == "host":
        acc = np.zeros((L, D), dt)
        for n in range(N):
            acc = acc + C[:, None, n] * h[:, :, n]
        return acc + Dk[None, :] * x
    y = xp.empty((L, D), dt)
    _fn(build, "scan_output")((_grid(L * D),), (BLOCK,), (C, h, x, Dk, y, np.int64(L), np.int64(D), np.int64(N)))
    return y


def selective_scan(
    x: Any,
    raw: Any,
    A: Any,
    B: Any,
    C: Any,
    Dk: Any,
    *,
    order: str = "chunked",
    chunk: int = CHUNK,
    device: str = "host",
    build: ScanBuild = ScanBuild(),
) -> tuple[Any, Any]:
    """Forward: (y (L, D), h (L, D, N))."""
    _, a, b = discretize(x, raw, A, B, device=device, build=build)
    h = states(a, b, order=order, chunk=chunk, device=device, build=build)
    return output(C, h, x, Dk, device=device, build=build), h


@dataclass(frozen=True)
class ScanGrads:
    """Gradients of <dy, y> with respect to every input of the selective scan."""

    x: Any
    raw: Any
    A: Any
    B: Any
    C: Any
    D: Any


def selective_scan_vjp(
    x: Any,
    raw: Any,
    A: Any,
    B: Any,
    C: Any,
    Dk: Any,
    dy: Any,
    *,
    device: str = "host",
    chunk: int = CHUNK,
    build: ScanBuild = ScanBuild(),
) -> ScanGrads:
    """Backward: the reverse-time recurrence on the device, then the chain through the discretisation."""
    xp, dt = _xp(device), _dtype(build)
    x, raw, A, B, C, Dk, dy = (xp.ascontiguousarray(v, dtype=dt) for v in (x, raw, A, B, C, Dk, dy))
    delta, a, b = discretize(x, raw, A, B, device=device, build=build)
    h = states(a, b, chunk=chunk, device=device, build=build)
    L, D, N = a.shape
    if device == "host":
        da, db, g = np.empty_like(a), np.empty_like(a), np.zeros((D, N), dt)
        for t in range(L - 1, -1, -1):
            total = C[t][None, :] * dy[t][:, None] + g
            da[t] = total * (h[t - 1] if t > 0 else 0)
            db[t] = total
            g = total * a[t]
    else:
        da, db = xp.empty_like(a), xp.empty_like(a)
        _fn(build, "scan_backward")(
            (_grid(D * N),), (BLOCK,), (a, h, C, dy, da, db, np.int64(L), np.int64(D), np.int64(N))
        )
    dpre = da * a  # d/d(delta A) of a = exp(delta A)
    ddelta = (dpre * A[None]).sum(axis=2) + (db * B[:, None, :]).sum(axis=2) * x
    sp = SOFTPLUS[build.softplus]
    graw = sp.grad(xp.asnumpy(raw) if device != "host" else raw)
    return ScanGrads(
        x=(db * B[:, None, :]).sum(axis=2) * delta + dy * Dk[None, :],
        raw=ddelta * xp.asarray(graw),
        A=(dpre * delta[:, :, None]).sum(axis=0),
        B=(db * (delta * x)[:, :, None]).sum(axis=1),
        C=(dy[:, :, None] * h).sum(axis=1),
        D=(dy * x).sum(axis=0),
    )
