"""Reference semantics of convolution and pooling (channel-first), on binary32 bit patterns.

Every rounded operation is the integer softfloat's under the ``cuda`` environment (subnormals kept, NaN
results 0x7FFFFFFF), in the order the contract states, and each formulation is written from the
definition (padded windows, scatter of the transposed map), not from the kernels' index plans:

* :func:`conv`: zero-padded input; ``y[n, co, o] = fold over (ci, k) row-major from +0 of w * xpad``, then
  ``+ b[co]``; for spatial rank 2 with groups 1 this is the graph IR's ``conv2d`` (spec/ir/ops.py).
* :func:`conv_transpose`: each input cell i scatters ``x[i] * w[k]`` to output ``i*s - p + k*d``; every
  output adds its contributions in (ci, k) row-major order from +0 (cells outside the output are dropped).
* :func:`conv_weight_grad`, :func:`bias_grad`: folds over (n, o) row-major from +0.
* :func:`max_pool2d`: IEEE maximum fold from -Inf over the window (padding -Inf: the IR's ``pool`` max);
  the argmax is the first real tap in row-major order whose bits are the maximum's (the first NaN for NaN).
  :func:`max_pool2d_backward` adds dy into the argmax, outputs in row-major order, from +0.
* :func:`avg_pool2d`: fold from +0 over the window (padding +0, counted), then / float32(kh * kw) (the IR's
  ``pool`` avg); :func:`avg_pool2d_backward` folds dy over the windows containing a cell, then / float32(kh * kw).

* :func:`im2col`: the column matrix (groups, cin_g * taps, N * P) of the padded windows: row (ci, k)
  row-major within a group, column (n, o) row-major (a copy: bits in, bits out).
* :func:`smooth_max_pool2d_f64`: smooth max pooling with temperature beta > 0 (MK-23c; the seed names it but
  gives no formula, so we state it): over the real taps of each window (padding ignored, as max pooling),
  ``y = (1/beta) log sum_k exp(beta x_k) = m + (1/beta) log sum_k exp(beta (x_k - m))``, m the taps' maximum,
  so ``m <= y <= m + log(k)/beta`` with k the window's real taps (y -> max as beta -> inf).
  :func:`smooth_max_pool2d_backward_f64` (MK-23d): ``dx_i = sum over the windows o containing i of dy_o p_{o,i}``,
  ``p_o = softmax(beta x)`` over window o's real taps (the gradient of the log-sum-exp).

``*_f64`` functions are the real-valued definitions in float64 (products of binary32 values are exact there)
with the magnitudes the error bounds of the contract use.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from typing import Any

import numpy as np

from spec import softfloat as sf
from spec.reductions import NEG_INF, POS_ZERO

__all__ = [
    "ENV",
    "conv",
    "conv_transpose",
    "conv_weight_grad",
    "bias_grad",
    "max_pool2d",
    "max_pool2d_backward",
    "avg_pool2d",
    "avg_pool2d_backward",
    "conv_f64",
    "conv_transpose_f64",
    "conv_weight_grad_f64",
    "im2col",
    "smooth_max_pool2d_f64",
    "smooth_max_pool2d_backward_f64",
    "pool_windows_f64",
    "out_size",
    "tconv_out_size",
]

ENV = "cuda"


def _t(v: int | Sequence[int], rank: int) -> tuple[int, ...]:
    return (int(v),) * rank if isinstance(v, int | np.integer) else tuple(int(e) for e in v)


def out_size(size: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> int:
    """floor((size + 2p - d(k - 1) - 1) / s) + 1."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def tconv_out_size(size: int, kernel: int, stride: int, padding: int, dilation: int, out_pad: int) -> int:
    """(size - 1) s - 2p + d(k - 1) + out_pad + 1."""
    return (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + out_pad + 1


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    return sf.add(np.ascontiguousarray(a), np.ascontiguousarray(b), env=ENV)


def _mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    return sf.mul(np.ascontiguousarray(a), np.ascontiguousarray(b), env=ENV)


def _pad(x: np.ndarray, padding: Sequence[int], fill: int) -> np.ndarray:
    rank = len(padding)
    shape = x.shape[:-rank] + tuple(s + 2 * p for s, p in zip(x.shape[-rank:], padding, strict=True))
    out = np.full(shape, fill, dtype=np.uint32)
    out[(...,) + tuple(slice(p, p + s) for p, s in zip(padding, x.shape[-rank:], strict=True))] = x
    return out


def _window(
    xpad: np.ndarray, ks: Sequence[int], stride: Sequence[int], dilation: Sequence[int], outs: Sequence[int]
) -> np.ndarray:
    """The tap ks of every window: xpad[..., k*d + o*s] over the trailing axes."""
    sl = tuple(slice(k * d, k * d + s * (o - 1) + 1, s) for k, d, s, o in zip(ks, dilation, stride, outs, strict=True))
    return np.ascontiguousarray(xpad[(...,) + sl])


def conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    """Convolution on bits: x (N, C, *in), w (CO, C/g, *k), b (CO) or None -> y (N, CO, *out) bits."""
    rank = x.ndim - 2
    st, pd, dl = _t(stride, rank), _t(padding, rank), _t(dilation, rank)
    kernel = w.shape[2:]
    outs = tuple(out_size(s, k, a, p, d) for s, k, a, p, d in zip(x.shape[2:], kernel, st, pd, dl, strict=True))
    n, c, co = x.shape[0], x.shape[1], w.shape[0]
    cin_g, cout_g = c // groups, co // groups
    xpad = _pad(x, pd, POS_ZERO)
    acc = np.full((n, co) + outs, POS_ZERO, dtype=np.uint32)
    in_ch = np.array([(o // cout_g) * cin_g for o in range(co)])  # first input channel of each output channel
    spatial = (1,) * rank
    for ci in range(cin_g):
        for ks in product(*(range(k) for k in kernel)):
            tap = _window(xpad[:, in_ch + ci], ks, st, dl, outs)  # (N, CO, *out)
            wv = w[(slice(None), ci) + ks].reshape((1, co) + spatial)
            acc = _add(acc, _mul(wv, tap))
    if b is not None:
        acc = _add(acc, b.reshape((1, co) + spatial))
    return acc


def conv_transpose(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    output_padding: Any = 0,
) -> np.ndarray:
    """Transposed convolution on bits: x (N, C, *in), w (C, CO/g, *k) -> y (N, CO, *out), by scatter."""
    rank = x.ndim - 2
    st, pd, dl, op = _t(stride, rank), _t(padding, rank), _t(dilation, rank), _t(output_padding, rank)
    kernel, sizes = w.shape[2:], x.shape[2:]
    outs = tuple(tconv_out_size(*a) for a in zip(sizes, kernel, st, pd, dl, op, strict=True))
    n, c, cout_g = x.shape[0], x.shape[1], w.shape[1]
    cin_g, co = c // groups, cout_g * groups
    # canvas position i*s + k*d; output o = position - p
    canvas = tuple(
        max((s - 1) * a + d * (k - 1) + 1, o + p)
        for s, a, d, k, o, p in zip(sizes, st, dl, kernel, outs, pd, strict=True)
    )
    acc = np.full((n, co) + canvas, POS_ZERO, dtype=np.uint32)
    src = np.array([(o // cout_g) * cin_g for o in range(co)])
    col = np.array([o % cout_g for o in range(co)])
    spatial = (1,) * rank
    for ci in range(cin_g):
        for ks in product(*(range(k) for k in kernel)):
            contrib = _mul(x[:, src + ci], w[(src + ci, col) + ks].reshape((1, co) + spatial))
            sl = (slice(None), slice(None)) + tuple(
                slice(k * d, k * d + a * (s - 1) + 1, a) for k, d, a, s in zip(ks, dl, st, sizes, strict=True)
            )
            acc[sl] = _add(acc[sl], contrib)
    y = np.ascontiguousarray(
        acc[(slice(None), slice(None)) + tuple(slice(p, p + o) for p, o in zip(pd, outs, strict=True))]
    )
    if b is not None:
        y = _add(y, b.reshape((1, co) + spatial))
    return y


def conv_weight_grad(
    x: np.ndarray,
    dy: np.ndarray,
    kernel: Sequence[int],
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    """dw (CO, C/g, *k) bits: fold over (n, o) row-major from +0 of dy[n, co, o] * xpad[n, c, o*s - p + k*d]."""
    rank = x.ndim - 2
    st, pd, dl = _t(stride, rank), _t(padding, rank), _t(dilation, rank)
    n, c, co = x.shape[0], x.shape[1], dy.shape[1]
    cin_g, cout_g = c // groups, co // groups
    outs = dy.shape[2:]
    xpad = _pad(x, pd, POS_ZERO)
    taps = list(product(*(range(k) for k in kernel)))
    # windows[t][n, c, o] for every tap t; per output channel its group's channels
    win = np.stack([_window(xpad, ks, st, dl, outs) for ks in taps])  # (T, N, C, *out)
    chans = np.array([[(o // cout_g) * cin_g + ci for ci in range(cin_g)] for o in range(co)])  # (CO, cin_g)
    acc = np.full((co, cin_g, len(taps)), POS_ZERO, dtype=np.uint32)
    for b in range(n):
        for q in np.ndindex(*outs):
            xv = win[(slice(None), b, slice(None)) + q][:, chans]  # (T, CO, cin_g)
            acc = _add(acc, _mul(dy[(b, slice(None)) + q].reshape(co, 1, 1), np.moveaxis(xv, 0, -1)))
    return acc.reshape((co, cin_g) + tuple(kernel))


def bias_grad(dy: np.ndarray) -> np.ndarray:
    """db (CO) bits: fold over (n, o) row-major of dy from +0."""
    acc = np.full(dy.shape[1], POS_ZERO, dtype=np.uint32)
    for b in range(dy.shape[0]):
        for q in np.ndindex(*dy.shape[2:]):
            acc = _add(acc, dy[(b, slice(None)) + q])
    return acc


def _pool_windows(
    x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int], fill: int
) -> tuple[list[np.ndarray], tuple[int, int]]:
    outs = tuple(out_size(s, k, a, p) for s, k, a, p in zip(x.shape[-2:], kernel, stride, padding, strict=True))
    xpad = _pad(x, padding, fill)
    return [_window(xpad, ks, stride, (1, 1), outs) for ks in product(range(kernel[0]), range(kernel[1]))], outs


def _is_nan(u: np.ndarray) -> np.ndarray:
    return ((u & 0x7F800000) == 0x7F800000) & ((u & 0x007FFFFF) != 0)


def max_pool2d(x: np.ndarray, kernel: Any, stride: Any = None, padding: Any = 0) -> tuple[np.ndarray, np.ndarray]:
    """(y bits, argmax ih * W + iw) over (..., H, W): IEEE maximum fold, first row-major argmax of real taps."""
    k, s, p = _t(kernel, 2), _t(stride if stride is not None else kernel, 2), _t(padding, 2)
    taps, outs = _pool_windows(x, k, s, p, NEG_INF)
    y = np.full(x.shape[:-2] + outs, NEG_INF, dtype=np.uint32)
    for tap in taps:
        y = sf.maximum(y, tap, env=ENV)
    width = x.shape[-1]
    ident = np.arange(x.shape[-2] * width, dtype=np.int64).reshape(x.shape[-2:])
    where, _ = _pool_windows(ident.astype(np.uint32) + 1, k, s, p, 0)  # 1 + flat index, 0 in the padding
    arg = np.full(y.shape, -1, dtype=np.int64)
    for tap, pos in zip(taps, where, strict=True):
        same = (tap == y) | (_is_nan(tap) & _is_nan(y))
        hit = (arg < 0) & (pos > 0) & same
        arg = np.where(hit, pos.astype(np.int64) - 1, arg)
    return y, arg


def max_pool2d_backward(dy: np.ndarray, argmax: np.ndarray, x_shape: Sequence[int]) -> np.ndarray:
    """dx bits: for each output in row-major order, dx[argmax] = dx[argmax] + dy (from +0)."""
    planes = int(np.prod(x_shape[:-2], dtype=np.int64))
    dx = np.full((planes, x_shape[-2] * x_shape[-1]), POS_ZERO, dtype=np.uint32)
    outs = int(np.prod(dy.shape[-2:], dtype=np.int64))  # explicit: with no planes -1 is ambiguous
    dys = dy.reshape(planes, outs)
    args = argmax.reshape(planes, outs)
    rows = np.arange(planes)
    for q in range(dys.shape[1]):
        dx[rows, args[:, q]] = _add(dx[rows, args[:, q]], dys[:, q])
    return dx.reshape(tuple(x_shape))


def avg_pool2d(x: np.ndarray, kernel: Any, stride: Any = None, padding: Any = 0) -> np.ndarray:
    """y bits: fold from +0 over the window (padding +0, counted), then / float32(kh * kw)."""
    k, s, p = _t(kernel, 2), _t(stride if stride is not None else kernel, 2), _t(padding, 2)
    taps, outs = _pool_windows(x, k, s, p, POS_ZERO)
    acc = np.full(x.shape[:-2] + outs, POS_ZERO, dtype=np.uint32)
    for tap in taps:
        acc = _add(acc, tap)
    return sf.div(acc, np.full(acc.shape, np.float32(k[0] * k[1]).view(np.uint32), dtype=np.uint32), env=ENV)


def avg_pool2d_backward(
    dy: np.ndarray, x_shape: Sequence[int], kernel: Any, stride: Any = None, padding: Any = 0
) -> np.ndarray:
    """dx bits: fold of dy over the windows containing each cell (row-major outputs), then / float32(kh * kw)."""
    k, s, p = _t(kernel, 2), _t(stride if stride is not None else kernel, 2), _t(padding, 2)
    h, w = x_shape[-2:]
    planes = int(np.prod(x_shape[:-2], dtype=np.int64))
    acc = np.full((planes, h + 2 * p[0], w + 2 * p[1]), POS_ZERO, dtype=np.uint32)
    dys = dy.reshape(planes, dy.shape[-2], dy.shape[-1])
    for oh in range(dys.shape[1]):
        for ow in range(dys.shape[2]):
            r, c = oh * s[0], ow * s[1]
            block = acc[:, r : r + k[0], c : c + k[1]]
            acc[:, r : r + k[0], c : c + k[1]] = _add(block, dys[:, oh, ow].reshape(-1, 1, 1))
    inner = np.ascontiguousarray(acc[:, p[0] : p[0] + h, p[1] : p[1] + w])
    out = sf.div(inner, np.full(inner.shape, np.float32(k[0] * k[1]).view(np.uint32), dtype=np.uint32), env=ENV)
    return out.reshape(tuple(x_shape))


# -- real-valued references (float64) -------------------------------------------------------------------------


def conv_f64(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """(value, magnitude) in float64: y = sum w x (+ b) and sum |w||x| (+ |b|), x, w float arrays."""
    rank = x.ndim - 2
    st, pd, dl = _t(stride, rank), _t(padding, rank), _t(dilation, rank)
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    kernel = w.shape[2:]
    outs = tuple(out_size(s, k, a, p, d) for s, k, a, p, d in zip(x.shape[2:], kernel, st, pd, dl, strict=True))
    n, c, co = x.shape[0], x.shape[1], w.shape[0]
    cin_g, cout_g = c // groups, co // groups
    xpad = np.zeros(x.shape[:2] + tuple(s + 2 * p for s, p in zip(x.shape[2:], pd, strict=True)))
    xpad[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(pd, x.shape[2:], strict=True))] = x64
    val = np.zeros((n, co) + outs)
    mag = np.zeros((n, co) + outs)
    in_ch = np.array([(o // cout_g) * cin_g for o in range(co)])
    spatial = (1,) * rank
    for ci in range(cin_g):
        for ks in product(*(range(k) for k in kernel)):
            sl = tuple(slice(k * d, k * d + s * (o - 1) + 1, s) for k, d, s, o in zip(ks, dl, st, outs, strict=True))
            tap = xpad[(slice(None), in_ch + ci) + sl]
            wv = w64[(slice(None), ci) + ks].reshape((1, co) + spatial)
            val += wv * tap
            mag += np.abs(wv * tap)
    if b is not None:
        b64 = np.asarray(b, np.float64).reshape((1, co) + spatial)
        val, mag = val + b64, mag + np.abs(b64)
    return val, mag


def conv_transpose_f64(
    x: np.ndarray,
    w: np.ndarray,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    output_padding: Any = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(value, magnitude) of the transposed convolution in float64 (no bias)."""
    rank = x.ndim - 2
    st, pd, dl, op = _t(stride, rank), _t(padding, rank), _t(dilation, rank), _t(output_padding, rank)
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    kernel, sizes = w.shape[2:], x.shape[2:]
    outs = tuple(tconv_out_size(*a) for a in zip(sizes, kernel, st, pd, dl, op, strict=True))
    n, c, cout_g = x.shape[0], x.shape[1], w.shape[1]
    cin_g, co = c // groups, cout_g * groups
    canvas = tuple(
        max((s - 1) * a + d * (k - 1) + 1, o + p)
        for s, a, d, k, o, p in zip(sizes, st, dl, kernel, outs, pd, strict=True)
    )
    val, mag = np.zeros((n, co) + canvas), np.zeros((n, co) + canvas)
    src = np.array([(o // cout_g) * cin_g for o in range(co)])
    col = np.array([o % cout_g for o in range(co)])
    spatial = (1,) * rank
    for ci in range(cin_g):
        for ks in product(*(range(k) for k in kernel)):
            contrib = x64[:, src + ci] * w64[(src + ci, col) + ks].reshape((1, co) + spatial)
            sl = (slice(None), slice(None)) + tuple(
                slice(k * d, k * d + a * (s - 1) + 1, a) for k, d, a, s in zip(ks, dl, st, sizes, strict=True)
            )
            val[sl] += contrib
            mag[sl] += np.abs(contrib)
    crop = (slice(None), slice(None)) + tuple(slice(p, p + o) for p, o in zip(pd, outs, strict=True))
    return val[crop], mag[crop]


def conv_weight_grad_f64(
    x: np.ndarray,
    dy: np.ndarray,
    kernel: Sequence[int],
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    """dw in float64 (exact products, float64 sums) of float arrays x, dy: sum over (n, o) of dy * xpad."""
    rank = x.ndim - 2
    st, pd, dl = _t(stride, rank), _t(padding, rank), _t(dilation, rank)
    x64, dy64 = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    c, co = x.shape[1], dy.shape[1]
    cin_g, cout_g = c // groups, co // groups
    outs = dy.shape[2:]
    xpad = np.zeros(x.shape[:2] + tuple(s + 2 * p for s, p in zip(x.shape[2:], pd, strict=True)))
    xpad[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(pd, x.shape[2:], strict=True))] = x64
    dw = np.zeros((co, cin_g) + tuple(kernel))
    for ks in product(*(range(k) for k in kernel)):
        sl = tuple(slice(k * d, k * d + s * (o - 1) + 1, s) for k, d, s, o in zip(ks, dl, st, outs, strict=True))
        win = xpad[(slice(None), slice(None)) + sl]  # (N, C, *out)
        for o in range(co):
            chans = (o // cout_g) * cin_g + np.arange(cin_g)
            prods = dy64[:, o].reshape(len(dy64), 1, -1) * win[:, chans].reshape(len(dy64), cin_g, -1)
            dw[(o, slice(None)) + ks] = prods.sum(axis=(0, 2))
    return dw


def im2col(
    x: np.ndarray, kernel: Sequence[int], stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1
) -> np.ndarray:
    """The column matrix of bits x (N, C, *in): cols[g, ci * taps + t, n * P + o] = xpad[n, g cin_g + ci, tap]."""
    rank = x.ndim - 2
    st, pd, dl = _t(stride, rank), _t(padding, rank), _t(dilation, rank)
    kernel = tuple(int(k) for k in kernel)
    outs = tuple(out_size(s, k, a, p, d) for s, k, a, p, d in zip(x.shape[2:], kernel, st, pd, dl, strict=True))
    n, c = x.shape[0], x.shape[1]
    cin_g = c // groups
    xpad = _pad(x, pd, POS_ZERO)
    taps = list(product(*(range(k) for k in kernel)))
    p = int(np.prod(outs, dtype=np.int64))
    cols = np.zeros((groups, cin_g * len(taps), n * p), dtype=np.uint32)
    for g in range(groups):
        for ci in range(cin_g):
            for t, ks in enumerate(taps):
                win = _window(xpad[:, g * cin_g + ci], ks, st, dl, outs)  # (N, *out)
                cols[g, ci * len(taps) + t] = win.reshape(-1)
    return cols


def pool_windows_f64(
    x: np.ndarray, kernel: Any, stride: Any = None, padding: Any = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(taps, real, index) over (planes, OH, OW, T): float64 taps (0 where padded), real mask, flat ih * W + iw."""
    k, s, p = _t(kernel, 2), _t(stride if stride is not None else kernel, 2), _t(padding, 2)
    h, w = x.shape[-2:]
    xs = np.asarray(x, np.float64).reshape(-1, h, w)
    oh, ow = out_size(h, k[0], s[0], p[0]), out_size(w, k[1], s[1], p[1])
    rows = np.arange(oh)[:, None, None, None] * s[0] - p[0] + np.arange(k[0])[None, None, :, None]
    cols = np.arange(ow)[None, :, None, None] * s[1] - p[1] + np.arange(k[1])[None, None, None, :]
    rows, cols = np.broadcast_arrays(rows, cols)  # (OH, OW, kh, kw)
    real = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
    idx = np.where(real, rows * w + cols, 0).reshape(oh, ow, -1)
    taps = xs.reshape(xs.shape[0], h * w)[:, idx]  # (planes, OH, OW, T); h * w, not -1: there may be no planes
    return np.where(real.reshape(oh, ow, -1)[None], taps, 0.0), real.reshape(oh, ow, -1), idx


def smooth_max_pool2d_f64(
    x: np.ndarray, kernel: Any, stride: Any = None, padding: Any = 0, beta: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(y, m, log S, p) in float64 of finite x: y = m + log(S) / beta, S = sum exp(beta (x - m)), p the softmax."""
    taps, real, _ = pool_windows_f64(x, kernel, stride, padding)
    b = float(beta)
    m = np.max(np.where(real[None], taps, -np.inf), axis=-1)
    e = np.where(real[None], np.exp(b * np.where(real[None], taps - m[..., None], 0.0)), 0.0)
    big_s = e.sum(axis=-1)
    y = m + np.log(big_s) / b
    shape = tuple(x.shape[:-2]) + m.shape[-2:]
    return y.reshape(shape), m.reshape(shape), np.log(big_s).reshape(shape), e / big_s[..., None]


def smooth_max_pool2d_backward_f64(
    x: np.ndarray, dy: np.ndarray, kernel: Any, stride: Any = None, padding: Any = 0, beta: float = 1.0
) -> np.ndarray:
    """dx in float64: dx_i = sum over the windows o containing i of dy_o softmax(beta x over window o)_i."""
    _, real, idx = pool_windows_f64(x, kernel, stride, padding)
    p = smooth_max_pool2d_f64(x, kernel, stride, padding, beta)[3]  # (planes, OH, OW, T)
    h, w = x.shape[-2:]
    contrib = np.asarray(dy, np.float64).reshape(p.shape[:-1])[..., None] * p
    dx = np.zeros((p.shape[0], h * w))
    flat = np.where(real, idx, h * w)  # padded taps to a discarded cell
    acc = np.zeros((p.shape[0], h * w + 1))
    np.add.at(acc, (slice(None), flat.reshape(-1)), contrib.reshape(p.shape[0], flat.size))  # not -1: no planes
    dx[:] = acc[:, : h * w]
    return dx.reshape(tuple(x.shape))
