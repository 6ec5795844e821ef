"""Softmax, log-softmax, layernorm and RMSNorm along the last axis: row plan, host NumPy paths, CUDA kernels.

One thread per row folds in index order, so every sum is the fold of :mod:`spec.norm`. Layernorm and
RMSNorm use only correctly rounded float32 operations plus ``rsqrt`` as ``(float)(1.0 / sqrt((double)v))``
(IEEE double sqrt and division, rounded once to float32: the spec's real rsqrt in float64 rounded once), so
host and CUDA are bitwise the spec. Softmax's exp and log-softmax's log are libdevice ``expf``/``logf`` on
the GPU (declared approximate: 2 and 1 ulp, CUDA Programming Guide) and float64 rounded once on the host,
so the CUDA softmax is claimed within its derived bound, the host softmax bitwise to the spec.
Kernels compile through ``nvrtc-ieee``; NaN results are 0x7FFFFFFF on both paths.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from native.builds import Build, register_builds
from native.elementwise import launch_plan
from native.workloads import register_workload
from obligations.core.device import array_module, resolve_device
from obligations.core.entrypoints import entry_point
from obligations.core.symbolic import all_of, as_type, smax

__all__ = [
    "MAX_ELEMENTS",
    "ROUTE",
    "RowPlan",
    "row_plan",
    "RowsRefused",
    "softmax",
    "log_softmax",
    "softmax_backward",
    "log_softmax_backward",
    "layernorm",
    "layernorm_backward",
    "rmsnorm",
    "rmsnorm_backward",
    "kernel_source",
]

MAX_ELEMENTS = 1 << 40
ROUTE = "nvrtc-ieee"
F32 = np.float32
CANONICAL_NAN = np.uint32(0x7FFFFFFF)


class RowsRefused(ValueError):
    """Raised before any launch when the row plan's guard refuses a shape (empty last axis, > 2^40 elements)."""


@dataclass(frozen=True)
class RowPlan:
    """rows x length elements, row-major; ``admissible``: at most MAX_ELEMENTS; offsets int64."""

    rows: Any
    length: Any
    elems: Any
    admissible: Any
    shape_ok: Any  # the part of the guard a call with real arrays reaches: rows >= 0, a non-empty last axis

    def offset(self, r: Any, k: Any) -> Any:
        """Offset of element k of row r."""
        return as_type(r, "int64") * self.length + k

    def regimes(self) -> dict[str, Any]:
        """Paths a call selects: no rows (nothing launched), rows of one element, rows of several."""
        return {
            "no_rows": self.rows == 0,
            "unit_rows": all_of(self.rows >= 1, self.length == 1),
            "rows": all_of(self.rows >= 1, self.length >= 2),
        }

    def accepts(self, x_len: Any, y_len: Any) -> Any:
        """The guard: admissible and both buffers hold rows * length elements."""
        return all_of(self.admissible, x_len >= self.elems, y_len >= self.elems)


def row_plan(rows: Any, length: Any) -> RowPlan:
    """The row layout: the product checked by division before it is formed."""
    r64, l64 = as_type(rows, "int64"), as_type(length, "int64")
    shape_ok = all_of(rows >= 0, length >= 1)
    ok = all_of(shape_ok, r64 <= MAX_ELEMENTS // smax(l64, 1))
    return RowPlan(r64, l64, r64 * l64, ok, shape_ok)


# -- CUDA sources ----------------------------------------------------------------------------------------

_HEAD = """\
__device__ __forceinline__ float kc_maximum(float a, float b) {
    if (a != a || b != b) return __int_as_float(0x7fffffff);
    if (a == b) return __int_as_float(__float_as_int(a) & __float_as_int(b));
    return a > b ? a : b;
}
__device__ __forceinline__ float kc_rsqrt(float v) { return (float)(1.0 / sqrt((double)v)); }
#define ROWS for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < rows; \\
                  j += (long long)blockDim.x * gridDim.x)
#define OK(k) (has_mask == 0 || mask[j * L + (k)] != 0)
"""

_SOFTMAX = """\
extern "C" __global__ void kc_{name}(const float* __restrict__ x, const unsigned char* __restrict__ mask,
        float* __restrict__ y, long long rows, long long L, int has_mask) {{
    ROWS {{
        const float* xr = x + j * L; float* yr = y + j * L;
        float m = __int_as_float(0xff800000); int any = 0;
        for (long long k = 0; k < L; ++k) if (OK(k)) {{ m = kc_maximum(m, xr[k]); any = 1; }}
        float s = 0.0f;
        for (long long k = 0; k < L; ++k) if (OK(k)) s = s + expf(xr[k] - m);
        {finish}
    }}
}}
"""

_FINISH = {
    "softmax": "for (long long k = 0; k < L; ++k) yr[k] = OK(k) ? expf(xr[k] - m) / s : 0.0f; (void)any;",
    "log_softmax": "const float ls = logf(s);\n        for (long long k = 0; k < L; ++k) "
    "yr[k] = OK(k) ? (xr[k] - m) - ls : __int_as_float(0xff800000); (void)any;",
}

_SOFTMAX_BWD = """\
extern "C" __global__ void kc_{name}_bwd(const float* __restrict__ y, const float* __restrict__ dy,
        const unsigned char* __restrict__ mask, float* __restrict__ dx, long long rows, long long L, int has_mask) {{
    ROWS {{
        const float* yr = y + j * L; const float* gr = dy + j * L; float* dr = dx + j * L;
        float t = 0.0f;
        for (long long k = 0; k < L; ++k) if (OK(k)) t = t + {term};
        for (long long k = 0; k < L; ++k) dr[k] = OK(k) ? {out} : 0.0f;
    }}
}}
"""

_SOFTMAX_BWD_OPS = {
    "softmax": ("gr[k] * yr[k]", "yr[k] * (gr[k] - t)"),
    "log_softmax": ("gr[k]", "gr[k] - expf(yr[k]) * t"),
}

_NORM_FWD = """\
extern "C" __global__ void kc_{name}(const float* __restrict__ x, const float* __restrict__ w,
        const float* __restrict__ b, float* __restrict__ y, long long rows, long long L, float eps) {{
    ROWS {{
        const float* xr = x + j * L; float* yr = y + j * L;
        {body}
    }}
}}
"""

_LN_FWD = """float s = 0.0f; for (long long k = 0; k < L; ++k) s = s + xr[k];
        const float mu = s / (float)L;
        float v = 0.0f; for (long long k = 0; k < L; ++k) { const float d = xr[k] - mu; v = v + d * d; }
        const float r = kc_rsqrt(v / (float)L + eps);
        for (long long k = 0; k < L; ++k) yr[k] = ((xr[k] - mu) * r) * w[k] + b[k];"""

_RMS_FWD = """float s = 0.0f; for (long long k = 0; k < L; ++k) s = s + xr[k] * xr[k];
        const float r = kc_rsqrt(s / (float)L + eps);
        for (long long k = 0; k < L; ++k) yr[k] = (xr[k] * r) * w[k]; (void)b;"""

_NORM_BWD = """\
extern "C" __global__ void kc_{name}_bwd(const float* __restrict__ x, const float* __restrict__ w,
        const float* __restrict__ dy, float* __restrict__ dx, float* __restrict__ xh, long long rows, long long L,
        float eps) {{
    ROWS {{
        const float* xr = x + j * L; const float* gr = dy + j * L; float* dr = dx + j * L; float* hr = xh + j * L;
        {body}
    }}
}}
"""

_LN_BWD = """float s = 0.0f; for (long long k = 0; k < L; ++k) s = s + xr[k];
        const float mu = s / (float)L;
        float v = 0.0f; for (long long k = 0; k < L; ++k) { const float d = xr[k] - mu; v = v + d * d; }
        const float r = kc_rsqrt(v / (float)L + eps);
        float ga = 0.0f, gc = 0.0f;
        for (long long k = 0; k < L; ++k) { hr[k] = (xr[k] - mu) * r; const float g = gr[k] * w[k]; ga = ga + g;
                                            gc = gc + g * hr[k]; }
        const float a = ga / (float)L, c = gc / (float)L;
        for (long long k = 0; k < L; ++k) dr[k] = r * ((gr[k] * w[k] - a) - hr[k] * c);"""

_RMS_BWD = """float s = 0.0f; for (long long k = 0; k < L; ++k) s = s + xr[k] * xr[k];
        const float r = kc_rsqrt(s / (float)L + eps);
        float gc = 0.0f;
        for (long long k = 0; k < L; ++k) { hr[k] = xr[k] * r; gc = gc + (gr[k] * w[k]) * hr[k]; }
        const float c = gc / (float)L;
        for (long long k = 0; k < L; ++k) dr[k] = r * (gr[k] * w[k] - hr[k] * c);"""

_COLS = """\
extern "C" __global__ void kc_norm_cols(const float* __restrict__ dy, const float* __restrict__ xh,
        float* __restrict__ dw, float* __restrict__ db, long long rows, long long L) {
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < L;
         k += (long long)blockDim.x * gridDim.x) {
        float a = 0.0f, c = 0.0f;
        for (long long j = 0; j < rows; ++j) { a = a + dy[j * L + k] * xh[j * L + k]; c = c + dy[j * L + k]; }
        dw[k] = a; db[k] = c;
    }
}
"""

_BATCHNORM_EVAL = """\
extern "C" __global__ void kc_batchnorm_eval(const float* __restrict__ x, const float* __restrict__ mean,
        const float* __restrict__ var, const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ y,
        long long n, long long C, long long HW, float eps) {
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < n;
         p += (long long)blockDim.x * gridDim.x) {
        const long long c = (p / HW) % C;
        const float r = kc_rsqrt(var[c] + eps);
        y[p] = ((x[p] - mean[c]) * r) * w[c] + b[c];
    }
}
"""

_APPROX = ("softmax", "log_softmax", "log_softmax_bwd")


def kernel_source(kind: str) -> tuple[str, str]:
    """(CUDA source, function) of softmax, log_softmax, *_bwd, layernorm, rmsnorm, *_bwd or cols."""
    if kind in _FINISH:
        return _HEAD + _SOFTMAX.format(name=kind, finish=_FINISH[kind]), f"kc_{kind}"
    if kind in ("softmax_bwd", "log_softmax_bwd"):
        base = kind.removesuffix("_bwd")
        term, out = _SOFTMAX_BWD_OPS[base]
        return _HEAD + _SOFTMAX_BWD.format(name=base, term=term, out=out), f"kc_{kind}"
    if kind in ("layernorm", "rmsnorm"):
        return _HEAD + _NORM_FWD.format(name=kind, body=_LN_FWD if kind == "layernorm" else _RMS_FWD), f"kc_{kind}"
    if kind in ("layernorm_bwd", "rmsnorm_bwd"):
        base = kind.removesuffix("_bwd")
        return _HEAD + _NORM_BWD.format(name=base, body=_LN_BWD if base == "layernorm" else _RMS_BWD), f"kc_{kind}"
    if kind == "batchnorm_eval":
        return _HEAD + _BATCHNORM_EVAL, "kc_batchnorm_eval"
    return _COLS, "kc_norm_cols"


KERNELS = (
    "softmax",
    "log_softmax",
    "softmax_bwd",
    "log_softmax_bwd",
    "layernorm",
    "rmsnorm",
    "layernorm_bwd",
    "rmsnorm_bwd",
    "cols",
    "batchnorm_eval",
)


@register_builds("norm")
def _builds() -> Iterator[Build]:
    for kind in KERNELS:
        src, fn = kernel_source(kind)
        yield Build("norm", kind, src, fn, ROUTE, approximate=kind in _APPROX, index_bits=64)


def _launch(kind: str, count: int, args: tuple) -> None:
    from native.nvrtc import compile_function

    if count == 0:
        return
    fn = compile_function(*kernel_source(kind), ROUTE)
    plan = launch_plan(count)
    fn((int(plan["grid"]),), (int(plan["block"]),), args)


# -- host paths -------------------------------------------------------------------------------------------------


def _canon(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=F32)
    return np.where(np.isnan(a), CANONICAL_NAN, a.view(np.uint32)).astype(np.uint32).view(F32)


def _once(fn: Any, a: np.ndarray) -> np.ndarray:
    """fn in float64 rounded once to float32 (the spec's exp/log/rsqrt)."""
    with np.errstate(all="ignore"):
        return fn(a.astype(np.float64)).astype(F32)


def _ieee_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    nan = np.isnan(a) | np.isnan(b)
    tied = (a.view(np.uint32) & b.view(np.uint32)).view(F32)
    return np.where(nan, F32(np.nan), np.where(a == b, tied, np.where(a > b, a, b))).astype(F32)


def _fold(x: np.ndarray, ok: np.ndarray | None = None) -> np.ndarray:
    acc = np.zeros(x.shape[:-1], dtype=F32)
    for k in range(x.shape[-1]):
        nxt = (acc + x[..., k]).astype(F32)
        acc = nxt if ok is None else np.where(ok[..., k], nxt, acc)
    return acc


def _host_softmax(x: np.ndarray, ok: np.ndarray, log: bool) -> np.ndarray:
    with np.errstate(all="ignore"):
        m = np.full(x.shape[:-1], -np.inf, dtype=F32)
        for k in range(x.shape[-1]):
            m = np.where(ok[..., k], _ieee_max(m, x[..., k]), m)
        t = (x - m[..., None]).astype(F32)
        e = np.where(ok, _once(np.exp, t), F32(0))
        s = _fold(e)
        if log:
            return _canon(np.where(ok, (t - _once(np.log, s)[..., None]).astype(F32), F32(-np.inf)))
        return _canon(np.where(ok, (e / s[..., None]).astype(F32), F32(0)))


# -- the shared front end ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rows:
    dev: str
    xp: Any
    x: Any
    rows: int
    length: int


def _rows(x: Any, device: str) -> _Rows:
    dev = resolve_device(device)
    xp = array_module(dev)
    x = xp.ascontiguousarray(xp.asarray(x, dtype=xp.float32))
    length = int(x.shape[-1]) if x.ndim else 1
    rows = int(x.size) // max(length, 1)
    if not row_plan(rows, length).accepts(int(x.size), int(x.size)):
        raise RowsRefused(f"rows of shape {tuple(x.shape)} refused by the row plan (empty last axis or > 2^40)")
    return _Rows(dev, xp, x, rows, length)


def _mask(r: _Rows, mask: Any) -> tuple[Any, int]:
    if mask is None:
        return r.xp.zeros(1, dtype=r.xp.uint8), 0
    m = r.xp.ascontiguousarray(r.xp.broadcast_to(r.xp.asarray(mask, dtype=bool), r.x.shape)).astype(r.xp.uint8)
    return m, 1


def _softmax(x: Any, mask: Any, device: str, kind: str) -> Any:
    r = _rows(x, device)
    if r.dev == "host":
        ok = np.ones(r.x.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), r.x.shape)
        return _host_softmax(r.x, ok, kind == "log_softmax")
    m, has = _mask(r, mask)
    y = r.xp.empty_like(r.x)
    _launch(kind, r.rows, (r.x, m, y, np.int64(r.rows), np.int64(r.length), np.int32(has)))
    return y


@entry_point("norm")
def softmax(x: Any, mask: Any = None, device: str = "auto") -> Any:
    """Masked softmax along the last axis (mask True = allowed; a row with none allowed is +0)."""
    return _softmax(x, mask, device, "softmax")


@entry_point("norm")
def log_softmax(x: Any, mask: Any = None, device: str = "auto") -> Any:
    """Masked log-softmax along the last axis (masked entries and empty rows -Inf)."""
    return _softmax(x, mask, device, "log_softmax")


def _softmax_bwd(y: Any, dy: Any, mask: Any, device: str, kind: str) -> Any:
    r = _rows(y, device)
    g = r.xp.ascontiguousarray(r.xp.asarray(dy, dtype=r.xp.float32))
    if g.shape != r.x.shape:
        raise ValueError(f"dy {tuple(g.shape)} is not y's shape {tuple(r.x.shape)}")
    if r.dev == "host":
        ok = np.ones(r.x.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), r.x.shape)
        with np.errstate(all="ignore"):
            if kind == "softmax_bwd":
                t = _fold((g * r.x).astype(F32), ok)
                dx = (r.x * (g - t[..., None]).astype(F32)).astype(F32)
            else:
                t = _fold(g, ok)
                dx = (g - (_once(np.exp, r.x) * t[..., None]).astype(F32)).astype(F32)
        return _canon(np.where(ok, dx, F32(0)))
    m, has = _mask(r, mask)
    dx = r.xp.empty_like(r.x)
    _launch(kind, r.rows, (r.x, g, m, dx, np.int64(r.rows), np.int64(r.length), np.int32(has)))
    return dx


@entry_point("norm")
def softmax_backward(y: Any, dy: Any, mask: Any = None, device: str = "auto") -> Any:
    """dx = y * (dy - fold(dy * y)) over the allowed entries (masked +0)."""
    return _softmax_bwd(y, dy, mask, device, "softmax_bwd")


@entry_point("norm")
def log_softmax_backward(y: Any, dy: Any, mask: Any = None, device: str = "auto") -> Any:
    """dx = dy - exp(y) * fold(dy) over the allowed entries (masked +0)."""
    return _softmax_bwd(y, dy, mask, device, "log_softmax_bwd")


def _params(r: _Rows, *ps: Any) -> list[Any]:
    out = []
    for p in ps:
        a = r.xp.ascontiguousarray(r.xp.asarray(p, dtype=r.xp.float32)).reshape(-1)
        if int(a.size) != r.length:
            raise ValueError(f"a parameter of {a.size} elements for a last axis of {r.length}")
        out.append(a)
    return out


def _host_stats(x: np.ndarray, eps: float, centred: bool) -> tuple[np.ndarray, np.ndarray]:
    n = F32(x.shape[-1])
    with np.errstate(all="ignore"):
        if centred:
            mu = (_fold(x) / n).astype(F32)
            d = (x - mu[..., None]).astype(F32)
        else:
            d = x
        v = (_fold((d * d).astype(F32)) / n).astype(F32)
        r = _once(lambda z: 1.0 / np.sqrt(z), (v + F32(eps)).astype(F32))
    return d, r


@entry_point("norm")
def layernorm(x: Any, weight: Any, bias: Any, eps: float = 1e-5, device: str = "auto") -> Any:
    """y = ((x - mu) * rsqrt(var + eps)) * w + b along the last axis, in the spec's order."""
    r = _rows(x, device)
    w, b = _params(r, weight, bias)
    if r.dev == "host":
        d, rs = _host_stats(r.x, eps, True)
        with np.errstate(all="ignore"):
            return _canon(((d * rs[..., None]).astype(F32) * w).astype(F32) + b)
    y = r.xp.empty_like(r.x)
    _launch("layernorm", r.rows, (r.x, w, b, y, np.int64(r.rows), np.int64(r.length), np.float32(eps)))
    return y


@entry_point("norm")
def rmsnorm(x: Any, weight: Any, eps: float = 1e-6, device: str = "auto") -> Any:
    """y = (x * rsqrt(mean(x * x) + eps)) * w along the last axis, in the spec's order."""
    r = _rows(x, device)
    (w,) = _params(r, weight)
    if r.dev == "host":
        _, rs = _host_stats(r.x, eps, False)
        with np.errstate(all="ignore"):
            return _canon(((r.x * rs[..., None]).astype(F32) * w).astype(F32))
    y = r.xp.empty_like(r.x)
    _launch("rmsnorm", r.rows, (r.x, w, w, y, np.int64(r.rows), np.int64(r.length), np.float32(eps)))
    return y


def _host_cols(dy: np.ndarray, xh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = dy.shape[-1]
    g2, h2 = dy.reshape(-1, n), xh.reshape(-1, n)
    dw, db = np.zeros(n, F32), np.zeros(n, F32)
    with np.errstate(all="ignore"):
        for j in range(g2.shape[0]):
            dw = (dw + (g2[j] * h2[j]).astype(F32)).astype(F32)
            db = (db + g2[j]).astype(F32)
    return _canon(dw), _canon(db)


def _norm_bwd(kind: str, x: Any, weight: Any, dy: Any, eps: float, device: str) -> tuple[Any, Any, Any]:
    r = _rows(x, device)
    (w,) = _params(r, weight)
    g = r.xp.ascontiguousarray(r.xp.asarray(dy, dtype=r.xp.float32))
    if g.shape != r.x.shape:
        raise ValueError(f"dy {tuple(g.shape)} is not x's shape {tuple(r.x.shape)}")
    if r.dev == "host":
        d, rs = _host_stats(r.x, eps, kind == "layernorm")
        n = F32(r.length)
        with np.errstate(all="ignore"):
            xh = (d * rs[..., None]).astype(F32)
            gw = (g * w).astype(F32)
            c = (_fold((gw * xh).astype(F32)) / n).astype(F32)
            if kind == "layernorm":
                a = (_fold(gw) / n).astype(F32)
                inner = ((gw - a[..., None]).astype(F32) - (xh * c[..., None]).astype(F32)).astype(F32)
            else:
                inner = (gw - (xh * c[..., None]).astype(F32)).astype(F32)
            dx = _canon((rs[..., None] * inner).astype(F32))
        dw, db = _host_cols(g, xh)
        return dx, dw, db
    dx, xh = r.xp.empty_like(r.x), r.xp.empty_like(r.x)
    _launch(f"{kind}_bwd", r.rows, (r.x, w, g, dx, xh, np.int64(r.rows), np.int64(r.length), np.float32(eps)))
    dw, db = r.xp.empty(r.length, r.xp.float32), r.xp.empty(r.length, r.xp.float32)
    _launch("cols", r.length, (g, xh, dw, db, np.int64(r.rows), np.int64(r.length)))
    return dx, dw, db


@entry_point("norm")
def layernorm_backward(x: Any, weight: Any, dy: Any, eps: float = 1e-5, device: str = "auto") -> tuple[Any, Any, Any]:
    """(dx, dw, db) of :func:`layernorm` in the spec's order."""
    return _norm_bwd("layernorm", x, weight, dy, eps, device)


@entry_point("norm")
def rmsnorm_backward(x: Any, weight: Any, dy: Any, eps: float = 1e-6, device: str = "auto") -> tuple[Any, Any]:
    """(dx, dw) of :func:`rmsnorm` in the spec's order."""
    dx, dw, _ = _norm_bwd("rmsnorm", x, weight, dy, eps, device)
    return dx, dw


@entry_point("norm")
def batchnorm_eval(x: Any, mean: Any, var: Any, weight: Any, bias: Any, eps: float = 1e-5, device: str = "auto") -> Any:
    """Eval-mode batchnorm of NC... input (MK-64): y = ((x - mean_c) * rsqrt(var_c + eps)) * w_c + b_c per channel c."""
    dev = resolve_device(device)
    xp = array_module(dev)
    x = xp.ascontiguousarray(xp.asarray(x, dtype=xp.float32))
    if x.ndim < 2:
        raise ValueError(f"batchnorm_eval takes (N, C, ...) input, not shape {tuple(x.shape)}")
    c = int(x.shape[1])
    hw = int(np.prod(x.shape[2:], dtype=np.int64))
    ps = [xp.ascontiguousarray(xp.asarray(a, dtype=xp.float32)).reshape(-1) for a in (mean, var, weight, bias)]
    if any(int(a.size) != c for a in ps):
        raise ValueError(f"batchnorm_eval: per-channel parameters of {[int(a.size) for a in ps]} for {c} channels")
    if not row_plan(int(x.size) // max(hw, 1), max(hw, 1)).admissible:
        raise RowsRefused(f"batchnorm_eval: shape {tuple(x.shape)} refused by the row plan (> 2^40 elements)")
    if dev == "host":
        m, v, w, b = (a.reshape((1, c) + (1,) * (x.ndim - 2)) for a in ps)
        with np.errstate(all="ignore"):
            r = _once(lambda z: 1.0 / np.sqrt(z), (v + F32(eps)).astype(F32))
            return _canon(((((x - m).astype(F32) * r).astype(F32) * w).astype(F32) + b).astype(F32))
    y = xp.empty_like(x)
    _launch("batchnorm_eval", int(x.size), (x, *ps, y, np.int64(x.size), np.int64(c), np.int64(hw), np.float32(eps)))
    return y


@register_workload("norm")
def _workload() -> int:
    """Every norm/softmax CUDA build on small rows, with and without masks (for compute-sanitizer): launches."""
    import cupy

    rng = np.random.default_rng(0)
    launches = 0
    for rows, length in ((1, 1), (3, 17), (300, 40)):
        x = cupy.asarray(rng.uniform(-3, 3, (rows, length)).astype(np.float32))
        dy = cupy.asarray(rng.uniform(-1, 1, (rows, length)).astype(np.float32))
        w = cupy.asarray(rng.uniform(-1, 1, length).astype(np.float32))
        mask = cupy.asarray(rng.random((rows, length)) < 0.6)
        for m in (None, mask):
            softmax(x, m, device="cuda")
            log_softmax(x, m, device="cuda")
            softmax_backward(x, dy, m, device="cuda")
            log_softmax_backward(x, dy, m, device="cuda")
            launches += 4
        layernorm(x, w, w, device="cuda")
        rmsnorm(x, w, device="cuda")
        layernorm_backward(x, w, dy, device="cuda")
        rmsnorm_backward(x, w, dy, device="cuda")
        batchnorm_eval(x.reshape(rows, 1, length), w[:1], w[:1] * w[:1], w[:1], w[:1], device="cuda")
        launches += 7
    cupy.cuda.runtime.deviceSynchronize()
    return launches
