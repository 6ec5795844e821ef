"""Reference semantics of softmax, log-softmax, layernorm and RMSNorm along the last axis, on binary32 bits.

Rounded operations are the integer softfloat's (env ``cuda``); exp, log and rsqrt are the real function in
float64 rounded once to binary32 (the graph IR's ``approx`` convention, spec/ir/denote.py). Orders:

* softmax(x, mask): m = IEEE maximum fold from -Inf over the allowed entries; e_k = exp(x_k - m) (the
  difference rounded, exp rounded once) for allowed k, +0 for masked; s = fold from +0 of e; y = e / s. A
  row with no allowed entry is all +0. log-softmax: y_k = (x_k - m) - log(s), masked -Inf; empty row -Inf.
* softmax backward: dot = fold over allowed k of dy_k * y_k; dx_k = y_k * (dy_k - dot), masked +0.
  log-softmax backward: t = fold over allowed k of dy_k; dx_k = dy_k - exp(y_k) * t, masked +0.
* layernorm: mu = fold(x) / n; d = x - mu; var = fold(d * d) / n; r = rsqrt(var + eps); y = (d * r) * w + b.
  backward: xh = d * r; g = dy * w; a = fold(g) / n; c = fold(g * xh) / n; dx = r * ((g - a) - xh * c);
  dw = fold over rows of dy * xh; db = fold over rows of dy.
* rmsnorm: ms = fold(x * x) / n; r = rsqrt(ms + eps); y = (x * r) * w. backward: xh = x * r; g = dy * w;
  c = fold(g * xh) / n; dx = r * (g - xh * c); dw = fold over rows of dy * xh.

Without a mask and with weight/bias payloads, softmax, layernorm and rmsnorm are the IR's ``softmax``,
``layernorm`` and ``rmsnorm``. :func:`softmax_f64` is the real-valued softmax for the error bounds; the
``*_backward_f64`` functions are the real-valued backward passes (the exact gradients, eps included) evaluated
in float64 from the same float32 inputs, in the kernels' order of operations, so that their own rounding is
the kernels' derivation with u = 2^-53 (falsification/norm_tests.py adds it to each bound).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spec import softfloat as sf
from spec.reductions import NEG_INF, POS_ZERO

__all__ = [
    "ENV",
    "softmax",
    "log_softmax",
    "softmax_backward",
    "log_softmax_backward",
    "layernorm",
    "layernorm_backward",
    "rmsnorm",
    "rmsnorm_backward",
    "softmax_f64",
    "softmax_backward_f64",
    "log_softmax_backward_f64",
    "layernorm_backward_f64",
    "rmsnorm_backward_f64",
    "real_once",
    "batchnorm_eval",
]

ENV = "cuda"
CANONICAL_NAN = 0x7FFFFFFF


def _b(a: Any, shape: tuple[int, ...]) -> np.ndarray:
    return np.ascontiguousarray(np.broadcast_to(np.asarray(a, dtype=np.uint32), shape))


def _add(a: Any, b: Any) -> np.ndarray:
    a, b = np.broadcast_arrays(np.asarray(a, np.uint32), np.asarray(b, np.uint32))
    return sf.add(np.ascontiguousarray(a), np.ascontiguousarray(b), env=ENV)


def _sub(a: Any, b: Any) -> np.ndarray:
    a, b = np.broadcast_arrays(np.asarray(a, np.uint32), np.asarray(b, np.uint32))
    return sf.sub(np.ascontiguousarray(a), np.ascontiguousarray(b), env=ENV)


def _mul(a: Any, b: Any) -> np.ndarray:
    a, b = np.broadcast_arrays(np.asarray(a, np.uint32), np.asarray(b, np.uint32))
    return sf.mul(np.ascontiguousarray(a), np.ascontiguousarray(b), env=ENV)


def _div(a: Any, b: Any) -> np.ndarray:
    a, b = np.broadcast_arrays(np.asarray(a, np.uint32), np.asarray(b, np.uint32))
    return sf.div(np.ascontiguousarray(a), np.ascontiguousarray(b), env=ENV)


def real_once(fn: Any, u: np.ndarray) -> np.ndarray:
    """fn over float64 of binary32 bits, rounded once (nearest even) to binary32; NaN -> 0x7FFFFFFF."""
    with np.errstate(all="ignore"):
        v = fn(np.asarray(u, np.uint32).view(np.float32).astype(np.float64)).astype(np.float32)
    return np.where(np.isnan(v), np.uint32(CANONICAL_NAN), v.view(np.uint32)).astype(np.uint32)


def _fold(x: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
    acc = np.full(x.shape[:-1], POS_ZERO, dtype=np.uint32)
    for k in range(x.shape[-1]):
        nxt = _add(acc, x[..., k])
        acc = nxt if allowed is None else np.where(allowed[..., k], nxt, acc)
    return acc


def _allowed(x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    return np.ones(x.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), x.shape)


def _n(length: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.full(shape, np.float32(length).view(np.uint32), dtype=np.uint32)


def _max_shift(x: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    m = np.full(x.shape[:-1], NEG_INF, dtype=np.uint32)
    for k in range(x.shape[-1]):
        m = np.where(ok[..., k], sf.maximum(m, np.ascontiguousarray(x[..., k]), env=ENV), m)
    t = _sub(x, m[..., None])
    e = np.where(ok, real_once(np.exp, t), np.uint32(POS_ZERO)).astype(np.uint32)
    return m, t, e


def softmax(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Masked softmax along the last axis (mask True = allowed), bits in and out."""
    ok = _allowed(x, mask)
    _, _, e = _max_shift(x, ok)
    s = _fold(e)
    y = _div(e, s[..., None])
    return np.where(ok, y, np.uint32(POS_ZERO)).astype(np.uint32)


def log_softmax(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Masked log-softmax along the last axis: (x - m) - log(s); masked and empty rows -Inf."""
    ok = _allowed(x, mask)
    _, t, e = _max_shift(x, ok)
    ls = real_once(np.log, _fold(e))
    y = _sub(t, ls[..., None])
    return np.where(ok, y, np.uint32(NEG_INF)).astype(np.uint32)


def softmax_backward(y: np.ndarray, dy: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """dx = y * (dy - fold(dy * y)) over the allowed entries, masked +0."""
    ok = _allowed(y, mask)
    dot = _fold(_mul(dy, y), ok)
    dx = _mul(y, _sub(dy, dot[..., None]))
    return np.where(ok, dx, np.uint32(POS_ZERO)).astype(np.uint32)


def log_softmax_backward(y: np.ndarray, dy: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """dx = dy - exp(y) * fold(dy) over the allowed entries, masked +0."""
    ok = _allowed(y, mask)
    t = _fold(dy, ok)
    dx = _sub(dy, _mul(real_once(np.exp, y), t[..., None]))
    return np.where(ok, dx, np.uint32(POS_ZERO)).astype(np.uint32)


def _rsqrt_eps(v: np.ndarray, eps: float) -> np.ndarray:
    return real_once(lambda z: 1.0 / np.sqrt(z), _add(v, np.float32(eps).view(np.uint32)))


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Layernorm over the last axis in the stated order (bits)."""
    n = x.shape[-1]
    mu = _div(_fold(x), _n(n, x.shape[:-1]))
    d = _sub(x, mu[..., None])
    r = _rsqrt_eps(_div(_fold(_mul(d, d)), _n(n, x.shape[:-1])), eps)
    return _add(_mul(_mul(d, r[..., None]), _b(w, x.shape)), _b(b, x.shape))


def layernorm_backward(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, eps: float = 1e-5
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dw, db) bits of :func:`layernorm` (rows = every leading index, row-major)."""
    n = x.shape[-1]
    rows = x.shape[:-1]
    mu = _div(_fold(x), _n(n, rows))
    d = _sub(x, mu[..., None])
    r = _rsqrt_eps(_div(_fold(_mul(d, d)), _n(n, rows)), eps)
    xh = _mul(d, r[..., None])
    g = _mul(dy, _b(w, x.shape))
    a = _div(_fold(g), _n(n, rows))
    c = _div(_fold(_mul(g, xh)), _n(n, rows))
    dx = _mul(r[..., None], _sub(_sub(g, a[..., None]), _mul(xh, c[..., None])))
    flat_dy, flat_xh = dy.reshape(-1, n), xh.reshape(-1, n)
    dw = _fold(np.ascontiguousarray(_mul(flat_dy, flat_xh).T))
    db = _fold(np.ascontiguousarray(flat_dy.T))
    return dx, dw, db


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm over the last axis in the stated order (bits)."""
    r = _rsqrt_eps(_div(_fold(_mul(x, x)), _n(x.shape[-1], x.shape[:-1])), eps)
    return _mul(_mul(x, r[..., None]), _b(w, x.shape))


def rmsnorm_backward(x: np.ndarray, w: np.ndarray, dy: np.ndarray, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dw) bits of :func:`rmsnorm`."""
    n = x.shape[-1]
    rows = x.shape[:-1]
    r = _rsqrt_eps(_div(_fold(_mul(x, x)), _n(n, rows)), eps)
    xh = _mul(x, r[..., None])
    g = _mul(dy, _b(w, x.shape))
    c = _div(_fold(_mul(g, xh)), _n(n, rows))
    dx = _mul(r[..., None], _sub(g, _mul(xh, c[..., None])))
    dw = _fold(np.ascontiguousarray(_mul(dy.reshape(-1, n), xh.reshape(-1, n)).T))
    return dx, dw


def softmax_f64(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Real masked softmax in float64 of float values (masked and empty rows 0)."""
    x64 = np.asarray(x, np.float64)
    ok = _allowed(x64, mask)
    m = np.max(np.where(ok, x64, -np.inf), axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        e = np.where(ok, np.exp(x64 - np.where(np.isfinite(m), m, 0.0)), 0.0)
        s = e.sum(axis=-1, keepdims=True)
        return np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)


def _f64_rows(*arrays: Any) -> list[np.ndarray]:
    return [np.asarray(a, np.float32).astype(np.float64) for a in arrays]


def softmax_backward_f64(y: np.ndarray, dy: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Real dx = y (dy - sum_allowed dy y) in float64 of float32 y, dy (masked entries 0)."""
    y64, g64 = _f64_rows(y, dy)
    ok = _allowed(y64, mask)
    dot = np.where(ok, g64 * y64, 0.0).sum(-1, keepdims=True)
    return np.where(ok, y64 * (g64 - dot), 0.0)


def log_softmax_backward_f64(y: np.ndarray, dy: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Real dx = dy - exp(y) sum_allowed dy in float64 of float32 y, dy (masked entries 0)."""
    y64, g64 = _f64_rows(y, dy)
    ok = _allowed(y64, mask)
    t = np.where(ok, g64, 0.0).sum(-1, keepdims=True)
    with np.errstate(all="ignore"):
        return np.where(ok, g64 - np.exp(y64) * t, 0.0)


def _norm_backward_f64(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, eps: float, centred: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x64, w64, g64 = _f64_rows(x, w, dy)
    n = x64.shape[-1]
    d = x64 - x64.sum(-1, keepdims=True) / n if centred else x64
    r = 1.0 / np.sqrt((d * d).sum(-1, keepdims=True) / n + float(np.float32(eps)))
    xh = d * r
    g = g64 * w64
    c = (g * xh).sum(-1, keepdims=True) / n
    inner = (g - g.sum(-1, keepdims=True) / n) - xh * c if centred else g - xh * c
    rows_g, rows_xh = g64.reshape(-1, n), xh.reshape(-1, n)
    return r * inner, (rows_g * rows_xh).sum(0), rows_g.sum(0)


def layernorm_backward_f64(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, eps: float = 1e-5
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Real (dx, dw, db) of layernorm in float64 of float32 inputs: r ((g - mean g) - xh mean(g xh)), g = dy w."""
    return _norm_backward_f64(x, w, dy, eps, True)


def rmsnorm_backward_f64(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, eps: float = 1e-6
) -> tuple[np.ndarray, np.ndarray]:
    """Real (dx, dw) of RMSNorm in float64 of float32 inputs: r (g - xh mean(g xh)), g = dy w."""
    dx, dw, _ = _norm_backward_f64(x, w, dy, eps, False)
    return dx, dw


def batchnorm_eval(
    x: np.ndarray, mean: np.ndarray, var: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5
) -> np.ndarray:
    """Eval-mode batchnorm over axis 1 of (N, C, ...) bits: ((x - mean_c) * rsqrt(var_c + eps)) * w_c + b_c."""
    x = np.asarray(x, np.uint32)
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    m, v, ww, bb = (np.asarray(a, np.uint32).reshape(shape) for a in (mean, var, w, b))
    r = _rsqrt_eps(v, eps)
    return _add(_mul(_mul(_sub(x, m), r), ww), bb)
