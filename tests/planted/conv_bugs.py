"""Deliberately wrong convolution and pooling: each must be caught by the contract item meant to catch it."""

from __future__ import annotations

from typing import Any

import numpy as np

from native import conv as nc
from obligations.core.symbolic import select, smax

__all__ = [
    "conv_axis_plan_off_by_one",
    "conv_pad_off_by_one",
    "conv_stride_wrong_axis",
    "max_pool2d_last_tie",
    "max_pool2d_last_nan",
    "avg_pool2d_exclude_pad",
    "smooth_max_pool2d_counts_padding",
    "smooth_max_pool2d_backward_unnormalised",
    "im2col_pad_off_by_one",
    "conv_im2col_drops_bias",
    "im2col2d_plan_kh_for_kw",
    "cudnn_flipped_filter",
]


def conv_axis_plan_off_by_one(size: Any, kernel: Any, stride: Any, padding: Any, dilation: Any) -> nc.ConvAxis:
    """BUG: the output size counts the padding once too often (size + 2p + 1)."""
    a = nc.conv_axis_plan(size, kernel, stride, padding, dilation)
    out = select(a.valid, smax(a.padded + 1 - a.span, 0) // smax(a.stride, 1) + 1, 0)
    return nc.ConvAxis(a.size, a.kernel, a.stride, a.padding, a.dilation, a.valid, a.span, a.padded, out)


def conv_pad_off_by_one(
    x: Any,
    w: Any,
    b: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str = "auto",
) -> Any:
    """BUG: every tap reads one cell earlier (o*s - p - 1 + k*d) on every spatial axis."""
    x = np.asarray(x, dtype=np.float32)
    shifted = np.zeros_like(x)
    shifted[(slice(None), slice(None)) + (slice(1, None),) * (x.ndim - 2)] = x[
        (slice(None), slice(None)) + (slice(None, -1),) * (x.ndim - 2)
    ]
    return nc.conv(shifted, w, b, stride, padding, dilation, groups, device=device)


def conv_stride_wrong_axis(
    x: Any,
    w: Any,
    b: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str = "auto",
) -> Any:
    """BUG: the strides are applied to the axes in reverse order."""
    st = tuple(stride) if not isinstance(stride, int) else (stride,) * (np.ndim(x) - 2)
    return nc.conv(x, w, b, st[::-1], padding, dilation, groups, device=device)


def max_pool2d_last_tie(
    x: Any, kernel: Any, stride: Any = None, padding: Any = 0, device: str = "auto", nan_only: bool = False
) -> tuple[Any, Any]:
    """BUG: ties go to the last row-major argmax."""
    y, arg = nc.max_pool2d(x, kernel, stride, padding, device="host")
    x = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-2], x.shape[-1])
    plan = nc._pool_guard(x.shape, kernel, stride, padding, int(x.size))
    yb = y.reshape(x.shape[0], -1).view(np.uint32)
    flat = x.reshape(x.shape[0], -1)
    a, b = plan.axes
    out = arg.reshape(x.shape[0], -1).copy()
    for oh in range(int(a.out)):
        for ow in range(int(b.out)):
            for kh in range(int(a.kernel)):
                for kw in range(int(b.kernel)):
                    ih, iw = oh * int(a.stride) - int(a.padding) + kh, ow * int(b.stride) - int(b.padding) + kw
                    if 0 <= ih < int(a.size) and 0 <= iw < int(b.size):
                        v = flat[:, ih * int(b.size) + iw]
                        q = oh * int(b.out) + ow
                        same = (v.view(np.uint32) == yb[:, q]) | (np.isnan(v) & np.isnan(yb[:, q].view(np.float32)))
                        same &= np.isnan(v) | (not nan_only)
                        out[:, q] = np.where(same, ih * int(b.size) + iw, out[:, q])
    return y, out.reshape(arg.shape)


def max_pool2d_last_nan(
    x: Any, kernel: Any, stride: Any = None, padding: Any = 0, device: str = "auto"
) -> tuple[Any, Any]:
    """BUG: among several NaNs in a window the last one is the argmax (equal finite maxima still go to the first):
    only a window with two NaNs tells."""
    return max_pool2d_last_tie(x, kernel, stride, padding, device, nan_only=True)


def avg_pool2d_exclude_pad(x: Any, kernel: Any, stride: Any = None, padding: Any = 0, device: str = "auto") -> Any:
    """BUG: divides by the real cells only (count_include_pad=False) where the contract counts padding."""
    y = nc.avg_pool2d(x, kernel, stride, padding, device="host")
    ones = nc.avg_pool2d(np.ones(np.shape(x), np.float32), kernel, stride, padding, device="host")
    with np.errstate(all="ignore"):
        return (y / ones).astype(np.float32)


def smooth_max_pool2d_counts_padding(
    x: Any, kernel: Any, stride: Any = None, padding: Any = 0, beta: float = 1.0, device: str = "auto"
) -> Any:
    """BUG: padded cells join the log-sum-exp as zeros (the contract ignores the padding, as max pooling)."""
    xs = np.asarray(x, dtype=np.float32)
    k = (kernel, kernel) if isinstance(kernel, int) else tuple(kernel)
    s = k if stride is None else ((stride, stride) if isinstance(stride, int) else tuple(stride))
    p = (padding, padding) if isinstance(padding, int) else tuple(padding)
    padded = np.pad(xs, [(0, 0)] * (xs.ndim - 2) + [(p[0], p[0]), (p[1], p[1])])
    return nc.smooth_max_pool2d(padded, k, s, 0, beta=beta, device=device)


def smooth_max_pool2d_backward_unnormalised(
    dy: Any, x: Any, kernel: Any, stride: Any = None, padding: Any = 0, beta: float = 1.0, device: str = "auto"
) -> Any:
    """BUG: the gradient forgets the softmax's denominator when a window has more than one real tap (x2)."""
    return nc.smooth_max_pool2d_backward(dy, x, kernel, stride, padding, beta, device=device) * np.float32(2)


def im2col_pad_off_by_one(
    x: Any,
    kernel: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    bias_row: bool = False,
    device: str = "auto",
) -> Any:
    """BUG: every tap reads one cell earlier on every spatial axis."""
    x = np.asarray(x, dtype=np.float32)
    shifted = np.zeros_like(x)
    shifted[(slice(None), slice(None)) + (slice(1, None),) * (x.ndim - 2)] = x[
        (slice(None), slice(None)) + (slice(None, -1),) * (x.ndim - 2)
    ]
    return nc.im2col(shifted, kernel, stride, padding, dilation, groups, bias_row, device=device)


def conv_im2col_drops_bias(
    x: Any,
    w: Any,
    b: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str = "auto",
) -> Any:
    """BUG: the bias row is left out of the GEMM."""
    return nc.conv_im2col(x, w, None, stride, padding, dilation, groups, device=device)


class _Im2colKhForKw(nc.Im2colPlan):
    """BUG: the window column is decoded with kh where kw belongs (r mod kh)."""

    def b(self, r: Any) -> Any:
        """r mod kh (wrong: the row-major (ci, a, b) column is r mod kw)."""
        return nc.as_type(r, "int64") % self.conv.axes[0].kernel


def im2col2d_plan_kh_for_kw(
    batch: Any,
    c_in: Any,
    height: Any,
    width: Any,
    c_out: Any,
    groups: Any,
    kh: Any,
    kw: Any,
    sh: Any,
    sw: Any,
    ph: Any,
    pw: Any,
    dh: Any,
    dw: Any,
    bias: Any,
) -> nc.Im2colPlan:
    """BUG: :func:`native.conv.im2col2d_plan` with the column decode taken modulo kh."""
    p = nc.im2col2d_plan(batch, c_in, height, width, c_out, groups, kh, kw, sh, sw, ph, pw, dh, dw, bias)
    return _Im2colKhForKw(**{f: getattr(p, f) for f in nc.Im2colPlan.__dataclass_fields__})


def cudnn_flipped_filter(
    x: Any,
    w: Any,
    b: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str = "cuda",
) -> Any:
    """BUG: the cuDNN step given the filter flipped on every spatial axis (a true convolution, not the IR's
    cross-correlation): CONV-CUDNN-bound catches it wherever a window has two unequal taps."""
    from native import cudnn

    ws = w[(slice(None), slice(None)) + (slice(None, None, -1),) * (w.ndim - 2)]
    return cudnn.conv(x, ws, b, stride, padding, dilation, groups, device)
