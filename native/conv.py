"""Convolution and pooling (channel-first): index plans, host NumPy paths and CUDA kernels, forward and backward.

Every kernel is ours (no cuBLAS, no im2col) and accumulates in one stated order, so each output is bitwise
the softfloat spec of :mod:`spec.conv` (contracts/conv-pool-v1.yaml):

* ``conv`` (rank 1..3 spatial, ``conv2d`` its rank-2 case): ``y[n, co, o] = fold over (ci, k) row-major
  from +0 of w[co, ci, k] * xpad[n, g*cin_g + ci, o*s - p + k*d]``, padded taps read +0 and are multiplied,
  then ``+ b[co]``; product and sum each rounded (no contraction).
* ``conv_transpose``: the gather form of the adjoint, ``y[n, co, o] = fold over (ci, k) row-major of
  x[n, c, (o + p - k*d) / s] * w[c, co_l, k]`` over the taps where the division is exact and in range only.
  The input gradient of ``conv`` is ``conv_transpose`` of dy with the same weight (and vice versa).
* ``conv_weight_grad``: ``dw[co, ci, k] = fold over (n, o) row-major of dy * xpad``; ``bias_grad``: fold of
  dy over (n, o).
* ``max_pool2d``: value and first row-major argmax of the real (unpadded) taps under the order NaN > +Inf
  > ... > +0 > -0 > ... (ties keep the first); its backward adds dy into the argmax, each input cell's
  contributions in row-major output order from +0.
* ``avg_pool2d``: fold from +0 over the window (padding +0 counted) then / float32(kh*kw); backward: the
  fold of dy over the windows containing a cell, in row-major output order, then / float32(kh*kw).

Plans (:func:`conv_axis_plan`, :func:`tconv_axis_plan`, :func:`pool_axis_plan`, :func:`conv2d_plan`,
:func:`pool2d_plan`) are integer code run with ints by the guards below and with Z3 terms by ``kc check``.
Kernels compile through the ``nvrtc-ieee`` route (subnormals kept, no contraction); NaN results are the CUDA
canonical NaN 0x7FFFFFFF on both paths.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

from native.builds import Build, register_builds
from native.elementwise import launch_plan
from native.workloads import register_workload
from obligations.core.device import array_module, resolve_device
from obligations.core.entrypoints import entry_point
from obligations.core.symbolic import all_of, any_of, as_type, cdiv, select, smax, smin

__all__ = [
    "MAX_ELEMENTS",
    "MAX_RANK",
    "ROUTE",
    "ConvRefused",
    "ConvAxis",
    "conv_axis_plan",
    "TConvAxis",
    "tconv_axis_plan",
    "PoolAxis",
    "pool_axis_plan",
    "GroupPlan",
    "group_plan",
    "Dense3",
    "dense3_plan",
    "Dense4",
    "dense4_plan",
    "ConvPlan",
    "conv_nd_plan",
    "conv2d_plan",
    "Pool2dPlan",
    "pool2d_plan",
    "conv",
    "conv2d",
    "conv_transpose",
    "conv_weight_grad",
    "bias_grad",
    "conv_backward",
    "conv_transpose_backward",
    "max_pool2d",
    "max_pool2d_backward",
    "avg_pool2d",
    "avg_pool2d_backward",
    "Im2colPlan",
    "im2col2d_plan",
    "Im2colRows",
    "im2col_rows_plan",
    "Im2colCols",
    "im2col_cols_plan",
    "im2col",
    "conv_im2col",
    "smooth_max_pool2d",
    "smooth_max_pool2d_backward",
    "kernel_source",
    "KERNELS",
    "APPROXIMATE",
]

MAX_ELEMENTS = 1 << 40  # largest buffer (elements) a guard admits: every int64 offset stays far from 2^63
MAX_RANK = 3  # spatial ranks with a CUDA build (the host path takes any rank)
ROUTE = "nvrtc-ieee"
CANONICAL_NAN = np.uint32(0x7FFFFFFF)
F32 = np.float32


# -- plans ---------------------------------------------------------------------------------------------


class ConvRefused(ValueError):
    """Raised before any launch when a convolution, transposed convolution or pooling plan's guard refuses a call."""


@dataclass(frozen=True)
class ConvAxis:
    """One spatial axis of a convolution window sweep; every quantity int64."""

    size: Any
    kernel: Any
    stride: Any
    padding: Any
    dilation: Any
    valid: Any
    span: Any
    padded: Any
    out: Any

    def tap(self, o: Any, t: Any) -> Any:
        """Input index (may be in the padding) read by output ``o`` at tap ``t``: o*s - p + t*d."""
        return as_type(o, "int64") * self.stride - self.padding + as_type(t, "int64") * self.dilation

    def real(self, i: Any) -> Any:
        """Whether input index ``i`` is a real (unpadded) cell."""
        return all_of(i >= 0, i < self.size)

    def regimes(self) -> dict[str, Any]:
        """Window sweeps a valid axis selects: dense (no padding, stride or dilation), padded, strided, dilated,
        one output (the window covers the padded input) and an empty input read only through its padding."""
        return {
            "dense": all_of(self.padding == 0, self.stride == 1, self.dilation == 1),
            "padded": self.padding > 0,
            "strided": self.stride > 1,
            "dilated": self.dilation > 1,
            "one_output": self.out == 1,
            "all_padding": self.size == 0,
        }


def conv_axis_plan(size: Any, kernel: Any, stride: Any, padding: Any, dilation: Any) -> ConvAxis:
    """out = floor((size + 2p - d(k - 1) - 1) / s) + 1 where the window fits, computed in int64."""
    size64, k64, s64, p64, d64 = (as_type(v, "int64") for v in (size, kernel, stride, padding, dilation))
    span = d64 * (k64 - 1) + 1
    padded = size64 + 2 * p64
    valid = all_of(size >= 0, kernel >= 1, stride >= 1, dilation >= 1, padding >= 0, span <= padded)
    out = select(valid, smax(padded - span, 0) // smax(s64, 1) + 1, 0)
    return ConvAxis(size64, k64, s64, p64, d64, valid, span, padded, out)


@dataclass(frozen=True)
class TConvAxis:
    """One spatial axis of a transposed convolution (gather form); every quantity int64."""

    size: Any
    kernel: Any
    stride: Any
    padding: Any
    dilation: Any
    out_pad: Any
    valid: Any
    out: Any
    back: Any

    def src(self, o: Any, t: Any) -> Any:
        """Numerator o + p - t*d whose exact quotient by s is the input index output ``o`` gathers at tap ``t``."""
        return as_type(o, "int64") + self.padding - as_type(t, "int64") * self.dilation

    def hit(self, o: Any, t: Any) -> Any:
        """Whether tap ``t`` of output ``o`` reads a real input: src >= 0, s | src, src / s < size."""
        n = self.src(o, t)
        q = smax(n, 0)
        return all_of(n >= 0, q % self.stride == 0, q // self.stride < self.size)

    def source(self, o: Any, t: Any) -> Any:
        """The input index of a hit: src / s."""
        return smax(self.src(o, t), 0) // self.stride

    def forward(self, i: Any, t: Any) -> Any:
        """The conv index map this gather inverts: the output of input ``i`` at tap ``t`` is i*s - p + t*d."""
        return as_type(i, "int64") * self.stride - self.padding + as_type(t, "int64") * self.dilation

    def regimes(self) -> dict[str, Any]:
        """Gathers a valid axis selects: unit (every tap of every output hits), strided (taps between inputs
        miss), padded (outputs cropped), output-padded (a tail of outputs past the last input) and dilated."""
        return {
            "unit": all_of(self.stride == 1, self.padding == 0, self.out_pad == 0, self.dilation == 1),
            "strided": self.stride > 1,
            "padded": self.padding > 0,
            "out_padded": self.out_pad > 0,
            "dilated": self.dilation > 1,
        }


def tconv_axis_plan(size: Any, kernel: Any, stride: Any, padding: Any, dilation: Any, out_pad: Any) -> TConvAxis:
    """out = (size - 1) s - 2p + d(k - 1) + out_pad + 1 with 0 <= out_pad < s, int64.

    PyTorch also admits s <= out_pad < d; there the convolution of the output is not the input size (see
    CONV-TCONV-inverse-z3) and the entry point's adjoint guard refuses the call, so the plan refuses it too (the
    boundary witnesses of CONV-TCONV-REGIMES found a plan that accepted what the entry point refused).

    ``back``: the convolution output size of ``out`` with the same window, which the contract proves is ``size``.
    """
    size64, k64, s64, p64, d64, op64 = (as_type(v, "int64") for v in (size, kernel, stride, padding, dilation, out_pad))
    raw = (size64 - 1) * s64 - 2 * p64 + d64 * (k64 - 1) + op64 + 1
    valid = all_of(
        size >= 1,
        kernel >= 1,
        stride >= 1,
        dilation >= 1,
        padding >= 0,
        out_pad >= 0,
        out_pad < s64,
        raw >= 1,
    )
    out = select(valid, raw, 0)
    span = d64 * (k64 - 1) + 1
    back = select(valid, smax(out + 2 * p64 - span, 0) // smax(s64, 1) + 1, 0)
    return TConvAxis(size64, k64, s64, p64, d64, op64, valid, out, back)


@dataclass(frozen=True)
class PoolAxis:
    """One spatial axis of a pooling window sweep (dilation 1; padding at most half the window)."""

    size: Any
    kernel: Any
    stride: Any
    padding: Any
    valid: Any
    out: Any

    def start(self, o: Any) -> Any:
        """First (possibly padded) input index of window ``o``."""
        return as_type(o, "int64") * self.stride - self.padding

    def covers(self, o: Any, i: Any) -> Any:
        """Whether window ``o`` contains input index ``i``."""
        return all_of(self.start(o) <= i, i <= self.start(o) + self.kernel - 1)

    def first_out(self, i: Any) -> Any:
        """First window containing input ``i`` (the backward gather's lower end)."""
        return cdiv(smax(as_type(i, "int64") + self.padding - self.kernel + 1, 0), self.stride)

    def last_out(self, i: Any) -> Any:
        """Last window containing input ``i`` (the backward gather's upper end, inclusive)."""
        return smin((as_type(i, "int64") + self.padding) // self.stride, self.out - 1)


def pool_axis_plan(size: Any, kernel: Any, stride: Any, padding: Any) -> PoolAxis:
    """The convolution rule with dilation 1 and 2 * padding <= kernel (so every window holds a real cell)."""
    c = conv_axis_plan(size, kernel, stride, padding, 1)
    valid = all_of(c.valid, 2 * c.padding <= c.kernel, size >= 1)
    return PoolAxis(c.size, c.kernel, c.stride, c.padding, valid, select(valid, c.out, 0))


def _prod_checked(dims: Sequence[Any], limit: int = MAX_ELEMENTS) -> tuple[Any, Any]:
    """(product in int64, whether it is at most ``limit``), checked by division before multiplying."""
    ok: Any = True
    acc: Any = as_type(1, "int64")
    for d in dims:
        d64 = as_type(d, "int64")
        ok = all_of(ok, d64 >= 0, d64 <= limit // smax(acc, 1))
        acc = acc * select(ok, d64, 0)
    return acc, ok


@dataclass(frozen=True)
class Dense4:
    """A row-major rank-4 tensor (N, C, H, W): its element count (admitted up to MAX_ELEMENTS) and offsets."""

    d0: Any
    d1: Any
    d2: Any
    d3: Any
    elems: Any
    admissible: Any

    def offset(self, a: Any, b: Any, c: Any, d: Any) -> Any:
        """Offset of element [a, b, c, d]: ((a d1 + b) d2 + c) d3 + d, int64."""
        return ((as_type(a, "int64") * self.d1 + b) * self.d2 + c) * self.d3 + d


def dense4_plan(d0: Any, d1: Any, d2: Any, d3: Any) -> Dense4:
    """The layout of a (d0, d1, d2, d3) tensor: element count by :func:`_prod_checked`, offsets in int64."""
    elems, ok = _prod_checked([d0, d1, d2, d3])
    return Dense4(*(as_type(v, "int64") for v in (d0, d1, d2, d3)), elems, ok)


@dataclass(frozen=True)
class Dense3:
    """A row-major rank-3 buffer (d0, d1, d2) of int64 dimensions: its element count (admitted up to MAX_ELEMENTS)."""

    d0: Any
    d1: Any
    d2: Any
    elems: Any
    admissible: Any

    def offset(self, a: Any, b: Any, c: Any) -> Any:
        """Offset of element [a, b, c]: (a d1 + b) d2 + c, int64."""
        return (as_type(a, "int64") * self.d1 + b) * self.d2 + c


def dense3_plan(e0: Any, e1: Any, e2: Any) -> Dense3:
    """The layout of a (e0, e1, e2) buffer: element count by :func:`_prod_checked`, offsets in int64."""
    elems, ok = _prod_checked([e0, e1, e2])
    return Dense3(*(as_type(v, "int64") for v in (e0, e1, e2)), elems, ok)


@dataclass(frozen=True)
class GroupPlan:
    """Channel grouping: c_in = groups * cin_g input and c_out = groups * cout_g output channels."""

    c_in: Any
    c_out: Any
    groups: Any
    cin_g: Any
    cout_g: Any
    valid: Any

    def group(self, co: Any) -> Any:
        """The group of output channel ``co``."""
        return as_type(co, "int64") // self.cout_g

    def channel_of(self, g: Any, ci: Any) -> Any:
        """Input channel ``ci`` of group ``g``: g * cin_g + ci."""
        return as_type(g, "int64") * self.cin_g + ci

    def channel(self, co: Any, ci: Any) -> Any:
        """The input channel that output channel ``co`` reads as its ``ci``-th."""
        return self.channel_of(self.group(co), ci)


def group_plan(c_in: Any, c_out: Any, groups: Any) -> GroupPlan:
    """Both channel counts divisible by ``groups`` >= 1; per-group counts by exact division."""
    g64 = smax(as_type(groups, "int64"), 1)
    cin64, cout64 = as_type(c_in, "int64"), as_type(c_out, "int64")
    cin_g, cout_g = cin64 // g64, cout64 // g64
    valid = all_of(groups >= 1, c_in >= 1, c_out >= 1, cin_g * g64 == cin64, cout_g * g64 == cout64)
    return GroupPlan(cin64, cout64, g64, cin_g, cout_g, valid)


@dataclass(frozen=True)
class ConvPlan:
    """A rank-r convolution: axes, channel grouping, buffer sizes (elements, int64) and offsets."""

    batch: Any
    c_in: Any
    c_out: Any
    groups: Any
    cin_g: Any
    cout_g: Any
    axes: tuple[ConvAxis, ...]
    taps: Any
    valid: Any
    x_elems: Any
    w_elems: Any
    y_elems: Any

    def accepts(self, x_len: Any, w_len: Any, b_len: Any, y_len: Any) -> Any:
        """The guard: a valid shape and every buffer at least its size (b_len 0: no bias)."""
        return all_of(
            self.valid, x_len >= self.x_elems, w_len >= self.w_elems, y_len >= self.y_elems, any_bias(b_len, self.c_out)
        )

    def channel(self, co: Any, ci: Any) -> Any:
        """The input channel that output channel ``co`` reads as its ``ci``-th (:class:`GroupPlan`)."""
        return group_plan(self.c_in, self.c_out, self.groups).channel(co, ci)


def any_bias(b_len: Any, c_out: Any) -> Any:
    """A bias buffer is absent (length 0) or holds at least c_out elements."""
    return (b_len == 0) | (b_len >= c_out)


def conv_nd_plan(
    batch: Any,
    c_in: Any,
    c_out: Any,
    groups: Any,
    sizes: Sequence[Any],
    kernel: Sequence[Any],
    stride: Sequence[Any],
    padding: Sequence[Any],
    dilation: Sequence[Any],
) -> ConvPlan:
    """The plan of a rank-len(sizes) convolution: what the guard admits, sizes and offsets, in int64."""
    axes = tuple(conv_axis_plan(*a) for a in zip(sizes, kernel, stride, padding, dilation, strict=True))
    gp = group_plan(c_in, c_out, groups)
    cin_g, cout_g = gp.cin_g, gp.cout_g
    x_elems, x_ok = _prod_checked([batch, c_in, *(a.size for a in axes)])
    y_elems, y_ok = _prod_checked([batch, c_out, *(a.out for a in axes)])
    taps, t_ok = _prod_checked([a.kernel for a in axes])
    w_elems, w_ok = _prod_checked([c_out, cin_g, *(a.kernel for a in axes)])
    valid = all_of(batch >= 0, gp.valid, x_ok, y_ok, t_ok, w_ok, *(a.valid for a in axes))
    return ConvPlan(batch, gp.c_in, gp.c_out, gp.groups, cin_g, cout_g, axes, taps, valid, x_elems, w_elems, y_elems)


@dataclass(frozen=True)
class Conv2dPlan(ConvPlan):
    """The rank-2 convolution plan with NCHW offsets the contract's statements call."""

    out_h: Any = None
    out_w: Any = None

    def x_offset(self, n: Any, c: Any, ih: Any, iw: Any) -> Any:
        """Offset of x[n, c, ih, iw] (:func:`dense4_plan`)."""
        return dense4_plan(self.batch, self.c_in, self.axes[0].size, self.axes[1].size).offset(n, c, ih, iw)

    def w_offset(self, co: Any, ci: Any, kh: Any, kw: Any) -> Any:
        """Offset of w[co, ci, kh, kw]."""
        return dense4_plan(self.c_out, self.cin_g, self.axes[0].kernel, self.axes[1].kernel).offset(co, ci, kh, kw)

    def y_offset(self, n: Any, co: Any, oh: Any, ow: Any) -> Any:
        """Offset of y[n, co, oh, ow]."""
        return dense4_plan(self.batch, self.c_out, self.axes[0].out, self.axes[1].out).offset(n, co, oh, ow)

    def row(self, oh: Any, kh: Any) -> Any:
        """Input row read by output row ``oh`` at tap row ``kh``."""
        return self.axes[0].tap(oh, kh)

    def col(self, ow: Any, kw: Any) -> Any:
        """Input column read by output column ``ow`` at tap column ``kw``."""
        return self.axes[1].tap(ow, kw)

    def real(self, ih: Any, iw: Any) -> Any:
        """Whether (ih, iw) is a real cell (the kernel reads x there, else +0)."""
        return all_of(self.axes[0].real(ih), self.axes[1].real(iw))


def conv2d_plan(
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
) -> Conv2dPlan:
    """The NCHW convolution plan: :func:`conv_nd_plan` of rank 2 with named offsets."""
    p = conv_nd_plan(batch, c_in, c_out, groups, (height, width), (kh, kw), (sh, sw), (ph, pw), (dh, dw))
    return Conv2dPlan(
        **{f: getattr(p, f) for f in ConvPlan.__dataclass_fields__}, out_h=p.axes[0].out, out_w=p.axes[1].out
    )


@dataclass(frozen=True)
class Pool2dPlan:
    """A 2-d pooling over (batch * channels) planes: axes, sizes and offsets, int64."""

    planes: Any
    axes: tuple[PoolAxis, PoolAxis]
    valid: Any
    x_elems: Any
    y_elems: Any
    out_h: Any
    out_w: Any

    def accepts(self, x_len: Any, y_len: Any) -> Any:
        """The guard: valid windows and both buffers at least their sizes."""
        return all_of(self.valid, x_len >= self.x_elems, y_len >= self.y_elems)

    def windows_ok(self) -> Any:
        """The window part of the guard (each axis' valid, planes >= 0): what a call with real arrays reaches; the
        2^40-element limits of ``valid`` are proved by the z3 and enumeration items (their calls need 4 TiB)."""
        return all_of(self.planes >= 0, *(a.valid for a in self.axes))

    def regimes(self) -> dict[str, Any]:
        """Sweeps a valid pooling selects: no planes, unpadded or padded windows, overlapping windows (a backward
        input gathers several), gaps (inputs no window covers) and a single window per plane."""
        a, b = self.axes
        some = self.planes >= 1
        return {
            "no_planes": self.planes == 0,
            "unpadded": all_of(some, a.padding == 0, b.padding == 0),
            "padded": all_of(some, any_of(a.padding > 0, b.padding > 0)),
            "overlapping": all_of(some, any_of(a.stride < a.kernel, b.stride < b.kernel)),
            "gaps": all_of(some, any_of(a.stride > a.kernel, b.stride > b.kernel)),
            "one_window": all_of(some, self.out_h == 1, self.out_w == 1),
        }

    def x_offset(self, q: Any, ih: Any, iw: Any) -> Any:
        """Offset of x[plane q, ih, iw]."""
        return (as_type(q, "int64") * self.axes[0].size + ih) * self.axes[1].size + iw

    def y_offset(self, q: Any, oh: Any, ow: Any) -> Any:
        """Offset of y[plane q, oh, ow]."""
        return (as_type(q, "int64") * self.axes[0].out + oh) * self.axes[1].out + ow

    def row(self, oh: Any, kh: Any) -> Any:
        """Input row of output row ``oh`` at window row ``kh``."""
        return self.axes[0].start(oh) + kh

    def col(self, ow: Any, kw: Any) -> Any:
        """Input column of output column ``ow`` at window column ``kw``."""
        return self.axes[1].start(ow) + kw


def pool2d_plan(
    planes: Any, height: Any, width: Any, kh: Any, kw: Any, sh: Any, sw: Any, ph: Any, pw: Any
) -> Pool2dPlan:
    """The plan of a 2-d pooling over ``planes`` = batch * channels planes."""
    axes = (pool_axis_plan(height, kh, sh, ph), pool_axis_plan(width, kw, sw, pw))
    x_elems, x_ok = _prod_checked([planes, axes[0].size, axes[1].size])
    y_elems, y_ok = _prod_checked([planes, axes[0].out, axes[1].out])
    return Pool2dPlan(
        as_type(planes, "int64"),
        axes,
        all_of(planes >= 0, x_ok, y_ok, *(a.valid for a in axes)),
        x_elems,
        y_elems,
        axes[0].out,
        axes[1].out,
    )


@dataclass(frozen=True)
class Im2colRows:
    """The rows of the im2col column matrix: row ``r = (ci * kh + a) * kw + b`` of group ``g`` holds tap (a, b)
    of input channel ``g * cin_g + ci``; K = cin_g * kh * kw rows per group. Its own guard ``valid`` is the
    part of :func:`conv2d_plan`'s (grouping, the window and the weight buffer) the row decode needs, so Z3
    proves the decode over these five sizes alone (IM2COL-rows-z3) and :class:`Im2colPlan` decodes through it.
    """

    c_in: Any
    groups: Any
    cin_g: Any
    kh: Any
    kw: Any
    taps: Any
    k: Any
    valid: Any

    def ci(self, r: Any) -> Any:
        """The channel (within the group) of row ``r``: r / (kh kw)."""
        return as_type(r, "int64") // self.taps

    def a(self, r: Any) -> Any:
        """The window row of row ``r``: (r mod kh kw) / kw."""
        return (as_type(r, "int64") % self.taps) // self.kw

    def b(self, r: Any) -> Any:
        """The window column of row ``r``: r mod kw."""
        return as_type(r, "int64") % self.kw

    def channel(self, g: Any, r: Any) -> Any:
        """The input channel row ``r`` of group ``g`` reads: g cin_g + ci(r)."""
        return as_type(g, "int64") * self.cin_g + self.ci(r)


def im2col_rows_plan(c_in: Any, c_out: Any, groups: Any, kh: Any, kw: Any) -> Im2colRows:
    """The row side of :func:`im2col2d_plan`: grouping, taps = kh kw and K = cin_g taps as conv2d_plan has them."""
    gp = group_plan(c_in, c_out, groups)
    taps, t_ok = _prod_checked([kh, kw])
    k, k_ok = _prod_checked([gp.cin_g, taps])  # conv2d_plan's weight buffer (c_out >= 1 of them) bounds it already
    k64 = as_type(kh, "int64"), as_type(kw, "int64")
    return Im2colRows(gp.c_in, gp.groups, gp.cin_g, *k64, taps, k, all_of(gp.valid, t_ok, k_ok))


@dataclass(frozen=True)
class Im2colCols:
    """The columns of the im2col column matrix: column ``q = (n * out_h + oh) * out_w + ow``, P = out_h out_w
    per image, N P in all (each admitted up to MAX_ELEMENTS). Z3 proves the column decode for every int64
    out_h, out_w (IM2COL-cols-z3), so for the ones the convolution's axes compute; :class:`Im2colPlan` decodes
    through it.
    """

    batch: Any
    out_h: Any
    out_w: Any
    p: Any
    cols: Any
    valid: Any

    def n(self, q: Any) -> Any:
        """The batch index of column ``q``: q / P."""
        return as_type(q, "int64") // self.p

    def oh(self, q: Any) -> Any:
        """The output row of column ``q``: (q mod P) / out_w."""
        return (as_type(q, "int64") % self.p) // self.out_w

    def ow(self, q: Any) -> Any:
        """The output column of column ``q``: q mod out_w."""
        return as_type(q, "int64") % self.out_w


def im2col_cols_plan(batch: Any, h_out: Any, w_out: Any) -> Im2colCols:
    """The column side of :func:`im2col2d_plan` for output sizes h_out x w_out: P and N P, products checked."""
    p, p_ok = _prod_checked([h_out, w_out])
    cols, q_ok = _prod_checked([batch, p])
    return Im2colCols(
        as_type(batch, "int64"), as_type(h_out, "int64"), as_type(w_out, "int64"), p, cols, all_of(p_ok, q_ok)
    )


@dataclass(frozen=True)
class Im2colPlan:
    """The im2col route of a 2-d convolution: the column matrix (groups, K + bias, N * P) and its index maps.

    Row ``r = (ci * kh + a) * kw + b`` of group ``g`` holds tap (a, b) of input channel ``g * cin_g + ci``
    (K = cin_g * kh * kw rows, then a row of ones when ``bias`` is 1); column ``q = (n * out_h + oh) * out_w
    + ow``. The kernel writes element ``(g * kb + r) * cols + q`` and decodes r and q by division
    (:class:`Im2colRows`, :class:`Im2colCols`, whose guards are part of ``valid``); the GEMM
    ``W[g] (cout_g x kb) @ cols[g] (kb x cols)`` is the guarded :func:`native.gemm.matmul`.
    """

    conv: Conv2dPlan
    rows: Im2colRows
    colmap: Im2colCols
    bias: Any
    k: Any
    kb: Any
    cols: Any
    p: Any
    valid: Any
    cols_elems: Any
    cin_g: Any
    taps: Any
    out_h: Any
    out_w: Any
    x_elems: Any

    def accepts(self, x_len: Any, cols_len: Any) -> Any:
        """The guard: a valid convolution, a bias flag of 0 or 1, and both buffers at least their sizes."""
        return all_of(self.valid, x_len >= self.conv.x_elems, cols_len >= self.cols_elems)

    def col_offset(self, g: Any, r: Any, q: Any) -> Any:
        """Offset of cols[g, r, q]: (g kb + r) cols + q, the :func:`dense3_plan` offset of (groups, kb, cols)."""
        return dense3_plan(self.conv.groups, self.kb, self.cols).offset(g, r, q)

    def ci(self, r: Any) -> Any:
        """The channel (within the group) of row ``r``: r / (kh kw)."""
        return self.rows.ci(r)

    def a(self, r: Any) -> Any:
        """The window row of row ``r``: (r mod kh kw) / kw."""
        return self.rows.a(r)

    def b(self, r: Any) -> Any:
        """The window column of row ``r``: r mod kw."""
        return self.rows.b(r)

    def n(self, q: Any) -> Any:
        """The batch index of column ``q``: q / P."""
        return self.colmap.n(q)

    def oh(self, q: Any) -> Any:
        """The output row of column ``q``: (q mod P) / out_w."""
        return self.colmap.oh(q)

    def ow(self, q: Any) -> Any:
        """The output column of column ``q``: q mod out_w."""
        return self.colmap.ow(q)

    def row(self, q: Any, r: Any) -> Any:
        """The input row column ``q`` reads at row ``r`` (may be in the padding)."""
        return self.conv.row(self.oh(q), self.a(r))

    def col(self, q: Any, r: Any) -> Any:
        """The input column column ``q`` reads at row ``r`` (may be in the padding)."""
        return self.conv.col(self.ow(q), self.b(r))

    def real(self, q: Any, r: Any) -> Any:
        """Whether the tap is a real cell (the kernel reads x there, else writes +0)."""
        return self.conv.real(self.row(q, r), self.col(q, r))

    def channel(self, g: Any, r: Any) -> Any:
        """The input channel row ``r`` of group ``g`` reads: g cin_g + ci(r)."""
        return self.rows.channel(g, r)

    def x_offset(self, g: Any, q: Any, r: Any) -> Any:
        """Offset of the x element the kernel reads for cols[g, r, q] (the :func:`dense4_plan` offset of x)."""
        return self.conv.x_offset(self.n(q), self.channel(g, r), self.row(q, r), self.col(q, r))


def im2col2d_plan(
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
) -> Im2colPlan:
    """The im2col plan of :func:`conv2d_plan`'s convolution: K = cin_g kh kw, kb = K + bias, cols = N P."""
    c = conv2d_plan(batch, c_in, height, width, c_out, groups, kh, kw, sh, sw, ph, pw, dh, dw)
    rows = im2col_rows_plan(c_in, c_out, groups, kh, kw)  # the same grouping and taps as c's (same functions)
    colmap = im2col_cols_plan(batch, c.out_h, c.out_w)
    kb = rows.k + as_type(bias, "int64")
    layout = dense3_plan(c.groups, kb, colmap.cols)
    elems, e_ok = layout.elems, layout.admissible
    valid = all_of(c.valid, rows.valid, colmap.valid, bias >= 0, bias <= 1, e_ok)
    return Im2colPlan(
        c,
        rows,
        colmap,
        as_type(bias, "int64"),
        rows.k,
        kb,
        colmap.cols,
        colmap.p,
        valid,
        elems,
        c.cin_g,
        c.taps,
        c.out_h,
        c.out_w,
        c.x_elems,
    )


# -- CUDA sources ----------------------------------------------------------------------------------------

_META = """\
    const long long N = meta[0], C = meta[1], CO = meta[2], G = meta[3];
    const long long* in = meta + 4; const long long* out = in + R; const long long* kk = out + R;
    const long long* st = kk + R; const long long* pd = st + R; const long long* dl = pd + R;
    const long long cin_g = C / G, cout_g = CO / G;
    long long taps = 1, osz = 1, isz = 1;
    #pragma unroll
    for (int r = 0; r < R; ++r) { taps *= kk[r]; osz *= out[r]; isz *= in[r]; }
"""

# a - (a / b) * b: with '%' NVRTC's 32-bit fast path computes the remainder with mul.lo.s32 (a 32-bit index
# step the audit's index-64 rule refuses); this form keeps every index operation 64-bit.
_REM = "__device__ __forceinline__ long long kc_rem(long long a, long long b) { return a - (a / b) * b; }\n"

_LOOP = (
    "for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < total; "
    "j += (long long)blockDim.x * gridDim.x)"
)

_SPLIT_TAP = """\
            long long tr = t, ks[R];
            #pragma unroll
            for (int r = R - 1; r >= 0; --r) { ks[r] = kc_rem(tr, kk[r]); tr /= kk[r]; }
"""

_CONV = """\
#define R {rank}
extern "C" __global__ void kc_conv{rank}_fwd(const float* __restrict__ x, const float* __restrict__ w,
        const float* __restrict__ b, float* __restrict__ y, const long long* __restrict__ meta, long long total,
        int has_bias) {{
{meta}
    {loop} {{
        long long rem = j, o[R];
        #pragma unroll
        for (int r = R - 1; r >= 0; --r) {{ o[r] = kc_rem(rem, out[r]); rem /= out[r]; }}
        const long long co = kc_rem(rem, CO), n = rem / CO, g = co / cout_g;
        float acc = 0.0f;
        for (long long ci = 0; ci < cin_g; ++ci) {{
            const float* xc = x + (n * C + g * cin_g + ci) * isz;
            const float* wc = w + (co * cin_g + ci) * taps;
            for (long long t = 0; t < taps; ++t) {{
{split}
                bool ok = true; long long off = 0;
                #pragma unroll
                for (int r = 0; r < R; ++r) {{
                    const long long i = o[r] * st[r] - pd[r] + ks[r] * dl[r];
                    ok = ok && i >= 0 && i < in[r]; off = off * in[r] + i;
                }}
                const float xv = ok ? xc[off] : 0.0f;
                acc = acc + wc[t] * xv;
            }}
        }}
        if (has_bias) acc = acc + b[co];
        y[j] = acc;
    }}
}}
"""

_TCONV = """\
#define R {rank}
extern "C" __global__ void kc_conv{rank}_tgather(const float* __restrict__ x, const float* __restrict__ w,
        const float* __restrict__ b, float* __restrict__ y, const long long* __restrict__ meta, long long total,
        int has_bias) {{
{meta}
    {loop} {{
        long long rem = j, o[R];
        #pragma unroll
        for (int r = R - 1; r >= 0; --r) {{ o[r] = kc_rem(rem, out[r]); rem /= out[r]; }}
        const long long co = kc_rem(rem, CO), n = rem / CO, g = co / cout_g, col = kc_rem(co, cout_g);
        float acc = 0.0f;
        for (long long ci = 0; ci < cin_g; ++ci) {{
            const long long c = g * cin_g + ci;
            const float* xc = x + (n * C + c) * isz;
            const float* wc = w + (c * cout_g + col) * taps;
            for (long long t = 0; t < taps; ++t) {{
{split}
                bool ok = true; long long off = 0;
                #pragma unroll
                for (int r = 0; r < R; ++r) {{
                    const long long num = o[r] + pd[r] - ks[r] * dl[r];
                    ok = ok && num >= 0 && kc_rem(num, st[r]) == 0 && num / st[r] < in[r];
                    off = off * in[r] + num / st[r];
                }}
                if (ok) acc = acc + xc[off] * wc[t];
            }}
        }}
        if (has_bias) acc = acc + b[co];
        y[j] = acc;
    }}
}}
"""

_WGRAD = """\
#define R {rank}
extern "C" __global__ void kc_conv{rank}_wgrad(const float* __restrict__ x, const float* __restrict__ dy,
        float* __restrict__ dw, const long long* __restrict__ meta, long long total) {{
{meta}
    {loop} {{
        const long long t = kc_rem(j, taps), ci = kc_rem(j / taps, cin_g), co = j / (taps * cin_g), g = co / cout_g;
{split}
        float acc = 0.0f;
        for (long long n = 0; n < N; ++n) {{
            const float* xc = x + (n * C + g * cin_g + ci) * isz;
            const float* dyc = dy + (n * CO + co) * osz;
            for (long long q = 0; q < osz; ++q) {{
                long long rem = q, o[R];
                #pragma unroll
                for (int r = R - 1; r >= 0; --r) {{ o[r] = kc_rem(rem, out[r]); rem /= out[r]; }}
                bool ok = true; long long off = 0;
                #pragma unroll
                for (int r = 0; r < R; ++r) {{
                    const long long i = o[r] * st[r] - pd[r] + ks[r] * dl[r];
                    ok = ok && i >= 0 && i < in[r]; off = off * in[r] + i;
                }}
                const float xv = ok ? xc[off] : 0.0f;
                acc = acc + dyc[q] * xv;
            }}
        }}
        dw[j] = acc;
    }}
}}
"""

_BGRAD = """\
extern "C" __global__ void kc_conv_bgrad(const float* __restrict__ dy, float* __restrict__ db, long long N,
        long long CO, long long osz) {
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < CO;
         j += (long long)blockDim.x * gridDim.x) {
        float acc = 0.0f;
        for (long long n = 0; n < N; ++n)
            for (long long q = 0; q < osz; ++q) acc = acc + dy[(n * CO + j) * osz + q];
        db[j] = acc;
    }
}
"""

_POOL_META = """\
    const long long H = meta[0], W = meta[1], OH = meta[2], OW = meta[3], KH = meta[4], KW = meta[5];
    const long long SH = meta[6], SW = meta[7], PH = meta[8], PW = meta[9];
"""

_MAXPOOL = """\
__device__ __forceinline__ bool kc_above(float v, float best) {{
    if (best != best) return false;                 // a NaN is never beaten (first NaN kept)
    if (v != v) return true;                        // NaN is above every number
    if (v == best) return v == 0.0f && signbit(best) && !signbit(v);  // +0 above -0
    return v > best;
}}
extern "C" __global__ void kc_maxpool2d(const float* __restrict__ x, float* __restrict__ y,
        long long* __restrict__ arg, const long long* __restrict__ meta, long long total) {{
{meta}
    {loop} {{
        const long long ow = kc_rem(j, OW), oh = kc_rem(j / OW, OH), q = j / (OW * OH);
        const float* xq = x + q * H * W;
        float best = 0.0f; long long bi = -1;
        for (long long a = 0; a < KH; ++a) {{
            const long long ih = oh * SH - PH + a;
            if (ih < 0 || ih >= H) continue;
            for (long long c = 0; c < KW; ++c) {{
                const long long iw = ow * SW - PW + c;
                if (iw < 0 || iw >= W) continue;
                const float v = xq[ih * W + iw];
                if (bi < 0 || kc_above(v, best)) {{ best = v; bi = ih * W + iw; }}
            }}
        }}
        y[j] = best != best ? __int_as_float(0x7fffffff) : best;
        arg[j] = bi;
    }}
}}
"""

_POOL_BWD = """\
extern "C" __global__ void kc_{name}2d_bwd(const float* __restrict__ dy, const long long* __restrict__ arg,
        float* __restrict__ dx, const long long* __restrict__ meta, long long total) {{
{meta}
    {loop} {{
        const long long iw = kc_rem(j, W), ih = kc_rem(j / W, H), q = j / (W * H);
        const long long oh0 = (ih + PH - KH + 1 > 0 ? ih + PH - KH + 1 + SH - 1 : 0) / SH;
        const long long oh1 = (ih + PH) / SH < OH - 1 ? (ih + PH) / SH : OH - 1;
        const long long ow0 = (iw + PW - KW + 1 > 0 ? iw + PW - KW + 1 + SW - 1 : 0) / SW;
        const long long ow1 = (iw + PW) / SW < OW - 1 ? (iw + PW) / SW : OW - 1;
        float acc = 0.0f;
        for (long long oh = oh0; oh <= oh1; ++oh)
            for (long long ow = ow0; ow <= ow1; ++ow) {{
                const long long o = (q * OH + oh) * OW + ow;
                {take}
            }}
        dx[j] = {final};
    }}
}}
"""

_AVGPOOL = """\
extern "C" __global__ void kc_avgpool2d(const float* __restrict__ x, float* __restrict__ y,
        const long long* __restrict__ meta, long long total) {{
{meta}
    {loop} {{
        const long long ow = kc_rem(j, OW), oh = kc_rem(j / OW, OH), q = j / (OW * OH);
        const float* xq = x + q * H * W;
        float acc = 0.0f;
        for (long long a = 0; a < KH; ++a) {{
            const long long ih = oh * SH - PH + a;
            for (long long c = 0; c < KW; ++c) {{
                const long long iw = ow * SW - PW + c;
                const float v = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? xq[ih * W + iw] : 0.0f;
                acc = acc + v;
            }}
        }}
        y[j] = acc / (float)(KH * KW);
    }}
}}
"""

_IM2COL = """\
#define R {rank}
extern "C" __global__ void kc_im2col{rank}(const float* __restrict__ x, float* __restrict__ cols,
        const long long* __restrict__ meta, long long total, long long kb) {{
{meta}
    const long long K = cin_g * taps, Q = N * osz;
    {loop} {{
        const long long q = kc_rem(j, Q), r = kc_rem(j / Q, K), g = j / (Q * K);
        const long long n = q / osz, t = kc_rem(r, taps), ci = r / taps;
        long long rem = kc_rem(q, osz), o[R];
        #pragma unroll
        for (int d = R - 1; d >= 0; --d) {{ o[d] = kc_rem(rem, out[d]); rem /= out[d]; }}
{split}
        bool ok = true; long long off = 0;
        #pragma unroll
        for (int d = 0; d < R; ++d) {{
            const long long i = o[d] * st[d] - pd[d] + ks[d] * dl[d];
            ok = ok && i >= 0 && i < in[d]; off = off * in[d] + i;
        }}
        cols[(g * kb + r) * Q + q] = ok ? x[(n * C + g * cin_g + ci) * isz + off] : 0.0f;
    }}
}}
"""

# Smooth max pooling: m = maximum of the real taps; s = fold from +0, row-major over the real taps, of
# expf(beta * (x - m)) (each operation rounded); y = m + logf(s) / beta.
_SMOOTH_STATS = """\
__device__ __forceinline__ bool kc_above(float v, float best) {
    if (best != best) return false;
    if (v != v) return true;
    if (v == best) return v == 0.0f && signbit(best) && !signbit(v);
    return v > best;
}
__device__ __forceinline__ void kc_smooth_stats(const float* xq, long long oh, long long ow, long long H,
        long long W, long long KH, long long KW, long long SH, long long SW, long long PH, long long PW, float beta,
        float* m_out, float* s_out) {
    float m = 0.0f; bool any = false;
    for (long long a = 0; a < KH; ++a) {
        const long long ih = oh * SH - PH + a;
        if (ih < 0 || ih >= H) continue;
        for (long long c = 0; c < KW; ++c) {
            const long long iw = ow * SW - PW + c;
            if (iw < 0 || iw >= W) continue;
            const float v = xq[ih * W + iw];
            if (!any || kc_above(v, m)) { m = v; any = true; }
        }
    }
    float s = 0.0f;
    for (long long a = 0; a < KH; ++a) {
        const long long ih = oh * SH - PH + a;
        if (ih < 0 || ih >= H) continue;
        for (long long c = 0; c < KW; ++c) {
            const long long iw = ow * SW - PW + c;
            if (iw < 0 || iw >= W) continue;
            s = s + expf(beta * (xq[ih * W + iw] - m));
        }
    }
    *m_out = m; *s_out = s;
}
"""

_SMOOTH = """\
extern "C" __global__ void kc_smoothpool2d(const float* __restrict__ x, float* __restrict__ y,
        const long long* __restrict__ meta, long long total, float beta) {{
{meta}
    {loop} {{
        const long long ow = kc_rem(j, OW), oh = kc_rem(j / OW, OH), q = j / (OW * OH);
        float m, s;
        kc_smooth_stats(x + q * H * W, oh, ow, H, W, KH, KW, SH, SW, PH, PW, beta, &m, &s);
        y[j] = m + logf(s) / beta;
    }}
}}
"""

_SMOOTH_BWD = """\
extern "C" __global__ void kc_smoothpool2d_bwd(const float* __restrict__ dy, const float* __restrict__ x,
        float* __restrict__ dx, const long long* __restrict__ meta, long long total, float beta) {{
{meta}
    {loop} {{
        const long long iw = kc_rem(j, W), ih = kc_rem(j / W, H), q = j / (W * H);
        const long long oh0 = (ih + PH - KH + 1 > 0 ? ih + PH - KH + 1 + SH - 1 : 0) / SH;
        const long long oh1 = (ih + PH) / SH < OH - 1 ? (ih + PH) / SH : OH - 1;
        const long long ow0 = (iw + PW - KW + 1 > 0 ? iw + PW - KW + 1 + SW - 1 : 0) / SW;
        const long long ow1 = (iw + PW) / SW < OW - 1 ? (iw + PW) / SW : OW - 1;
        const float* xq = x + q * H * W;
        const float xv = xq[ih * W + iw];
        float acc = 0.0f;
        for (long long oh = oh0; oh <= oh1; ++oh)
            for (long long ow = ow0; ow <= ow1; ++ow) {{
                float m, s;
                kc_smooth_stats(xq, oh, ow, H, W, KH, KW, SH, SW, PH, PW, beta, &m, &s);
                acc = acc + dy[(q * OH + oh) * OW + ow] * (expf(beta * (xv - m)) / s);
            }}
        dx[j] = acc;
    }}
}}
"""

_POOL_TAKE = {
    "maxpool": ("if (arg[o] == ih * W + iw) acc = acc + dy[o];", "acc"),
    "avgpool": ("acc = acc + dy[o];", "acc / (float)(KH * KW)"),
}


def kernel_source(kind: str, rank: int = 2) -> tuple[str, str]:
    """(CUDA source, function name) of kernel ``kind`` (fwd, tgather, wgrad, bgrad, maxpool, avgpool, *_bwd)."""
    src, name = _kernel_source(kind, rank)
    return _REM + src, name


def _kernel_source(kind: str, rank: int) -> tuple[str, str]:
    fmt = {"meta": _META, "loop": _LOOP, "split": _SPLIT_TAP, "rank": rank}
    if kind == "fwd":
        return _CONV.format(**fmt), f"kc_conv{rank}_fwd"
    if kind == "tgather":
        return _TCONV.format(**fmt), f"kc_conv{rank}_tgather"
    if kind == "wgrad":
        return _WGRAD.format(**fmt), f"kc_conv{rank}_wgrad"
    if kind == "bgrad":
        return _BGRAD, "kc_conv_bgrad"
    if kind == "maxpool":
        return _MAXPOOL.format(meta=_POOL_META, loop=_LOOP), "kc_maxpool2d"
    if kind == "avgpool":
        return _AVGPOOL.format(meta=_POOL_META, loop=_LOOP), "kc_avgpool2d"
    if kind == "im2col":
        return _IM2COL.format(**fmt), f"kc_im2col{rank}"
    if kind == "smoothpool":
        return _SMOOTH_STATS + _SMOOTH.format(meta=_POOL_META, loop=_LOOP), "kc_smoothpool2d"
    if kind == "smoothpool_bwd":
        return _SMOOTH_STATS + _SMOOTH_BWD.format(meta=_POOL_META, loop=_LOOP), "kc_smoothpool2d_bwd"
    name = kind.removesuffix("_bwd")
    take, final = _POOL_TAKE[name]
    return _POOL_BWD.format(meta=_POOL_META, loop=_LOOP, name=name, take=take, final=final), f"kc_{name}2d_bwd"


KERNELS: tuple[tuple[str, int], ...] = (
    *((k, r) for k in ("fwd", "tgather", "wgrad") for r in range(1, MAX_RANK + 1)),
    ("bgrad", 0),
    ("maxpool", 2),
    ("avgpool", 2),
    ("maxpool_bwd", 2),
    ("avgpool_bwd", 2),
    *(("im2col", r) for r in range(1, MAX_RANK + 1)),
    ("smoothpool", 2),
    ("smoothpool_bwd", 2),
)
APPROXIMATE = ("smoothpool", "smoothpool_bwd")  # libdevice expf / logf (2 / 1 ulp): claimed within a bound


@register_builds("conv")
def _builds() -> Iterator[Build]:
    for kind, rank in KERNELS:
        src, fn = kernel_source(kind, rank)
        yield Build("conv", f"{kind}{rank or ''}", src, fn, ROUTE, approximate=kind in APPROXIMATE, index_bits=64)


def _launch(kind: str, rank: int, total: int, args: tuple, tail: tuple = ()) -> None:
    """Launch kernel ``kind`` over ``total`` outputs: its arguments, then ``total`` (int64), then ``tail``."""
    from native.nvrtc import compile_function

    if total == 0:
        return
    fn = compile_function(*kernel_source(kind, rank), ROUTE)
    plan = launch_plan(total)
    fn((int(plan["grid"]),), (int(plan["block"]),), (*args, np.int64(total), *tail))


# -- shared front end ----------------------------------------------------------------------------------------


def _tuple(v: int | Sequence[int], rank: int) -> tuple[int, ...]:
    return (int(v),) * rank if isinstance(v, int | np.integer) else tuple(int(e) for e in v)


def _canon(a: np.ndarray) -> np.ndarray:
    """NaNs as the CUDA canonical NaN 0x7FFFFFFF (x86 keeps payloads)."""
    a = np.asarray(a, dtype=F32)
    return np.where(np.isnan(a), CANONICAL_NAN, a.view(np.uint32)).astype(np.uint32).view(F32)


@dataclass(frozen=True)
class _Call:
    """A guarded convolution call: device, array module, plan, window tuples and launch metadata."""

    dev: str
    xp: Any
    plan: ConvPlan
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    kernel: tuple[int, ...]


def _f32(xp: Any, a: Any) -> Any:
    return xp.ascontiguousarray(xp.asarray(a, dtype=xp.float32))


def _guard(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    b_len: int,
    c_out: int,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
    x_len: int,
    w_len: int,
    y_len: int | None = None,
) -> ConvPlan:
    """The plan of a convolution call, raising ValueError where the guard refuses it."""
    rank = len(x_shape) - 2
    if rank < 1 or len(w_shape) != rank + 2:
        raise ValueError(f"x {tuple(x_shape)} and w {tuple(w_shape)} are not a rank-{max(rank, 1)} convolution")
    kernel = tuple(int(k) for k in w_shape[2:])
    plan = conv_nd_plan(
        x_shape[0],
        x_shape[1],
        c_out,
        groups,
        tuple(x_shape[2:]),
        kernel,
        _tuple(stride, rank),
        _tuple(padding, rank),
        _tuple(dilation, rank),
    )
    y_len = int(plan.y_elems) if y_len is None else y_len
    if not plan.accepts(x_len, w_len, b_len, y_len):
        raise ConvRefused(
            f"convolution refused by its plan: x {tuple(x_shape)}, w {tuple(w_shape)}, bias {b_len}, "
            f"stride {stride}, padding {padding}, dilation {dilation}, groups {groups}"
        )
    return plan


def _meta(
    xp: Any,
    plan: ConvPlan,
    sizes: Sequence[int],
    outs: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    c_in: int,
    c_out: int,
) -> Any:
    return xp.asarray(
        np.array(
            [int(plan.batch), c_in, c_out, int(plan.groups), *sizes, *outs, *kernel, *stride, *padding, *dilation],
            dtype=np.int64,
        )
    )


def _host_taps(xs: np.ndarray, idx: Sequence[np.ndarray]) -> np.ndarray:
    """xs[..., idx_0, idx_1, ...] over the trailing spatial axes (outer product), +0 where an index is out of range."""
    out = xs
    for d, ix in enumerate(idx):
        axis = out.ndim - len(idx) + d
        size = xs.shape[axis]
        if size == 0:  # an empty input axis read only through its padding (the plan admits it): every tap is +0
            shape = list(out.shape)
            shape[axis] = ix.shape[0]
            out = np.zeros(shape, dtype=F32)
            continue
        ok = (ix >= 0) & (ix < size)
        taken = np.take(out, np.where(ok, ix, 0), axis=axis)
        shape = [1] * taken.ndim
        shape[axis] = ix.shape[0]
        out = np.where(ok.reshape(shape), taken, F32(0))
    return out


def _host_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, plan: ConvPlan) -> np.ndarray:
    """Forward in the stated order, vectorised over outputs: (ci, k) row-major fold from +0, then + b."""
    n, g, cin_g, cout_g = int(plan.batch), int(plan.groups), int(plan.cin_g), int(plan.cout_g)
    outs = tuple(int(a.out) for a in plan.axes)
    xg = x.reshape((n, g, cin_g) + x.shape[2:])
    wg = w.reshape((g, cout_g, cin_g) + w.shape[2:])
    acc = np.zeros((n, g, cout_g) + outs, dtype=F32)
    spatial = (1,) * len(outs)
    with np.errstate(all="ignore"):
        for ci in range(cin_g):
            for ks in product(*(range(int(a.kernel)) for a in plan.axes)):
                idx = [
                    int(a.tap(0, k)) + np.arange(o, dtype=np.int64) * int(a.stride)
                    for a, k, o in zip(plan.axes, ks, outs, strict=True)
                ]
                xv = _host_taps(xg[:, :, ci], idx)[:, :, None]
                wv = wg[(slice(None), slice(None), ci) + ks].reshape((1, g, cout_g) + spatial)
                acc = (acc + (wv * xv).astype(F32)).astype(F32)
        acc = acc.reshape((n, g * cout_g) + outs)
        if b is not None:
            acc = (acc + b.reshape((1, -1) + spatial)).astype(F32)
    return _canon(acc)


def _host_tconv(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, axes: Sequence[TConvAxis], groups: int
) -> np.ndarray:
    """Transposed convolution by gather in the stated order: (ci, k) row-major over the hit taps only."""
    n, c = x.shape[:2]
    cin_g, cout_g = c // groups, w.shape[1]
    outs = tuple(int(a.out) for a in axes)
    xg = x.reshape((n, groups, cin_g) + x.shape[2:])
    wg = w.reshape((groups, cin_g, cout_g) + w.shape[2:])
    acc = np.zeros((n, groups, cout_g) + outs, dtype=F32)
    spatial = (1,) * len(outs)
    with np.errstate(all="ignore"):
        for ci in range(cin_g):
            for ks in product(*(range(int(a.kernel)) for a in axes)):
                idx, hits = [], []
                for a, k in zip(axes, ks, strict=True):
                    num = np.arange(int(a.out), dtype=np.int64) + int(a.padding) - k * int(a.dilation)
                    hit = (num >= 0) & (num % int(a.stride) == 0) & (num // int(a.stride) < int(a.size))
                    idx.append(np.where(hit, num // int(a.stride), -1))
                    hits.append(hit)
                mask = hits[0]
                for h in hits[1:]:
                    mask = np.multiply.outer(mask, h)
                xv = _host_taps(xg[:, :, ci], idx)[:, :, None]
                wv = wg[(slice(None), ci, slice(None)) + ks].reshape((1, groups, cout_g) + spatial)
                acc = np.where(mask, (acc + (xv * wv).astype(F32)).astype(F32), acc)
        acc = acc.reshape((n, groups * cout_g) + outs)
        if b is not None:
            acc = (acc + b.reshape((1, -1) + spatial)).astype(F32)
    return _canon(acc)


def _host_wgrad(x: np.ndarray, dy: np.ndarray, plan: ConvPlan) -> np.ndarray:
    """dw[co, ci, k] = fold over (n, o) row-major of dy * xpad, from +0."""
    n, g, cin_g, cout_g = int(plan.batch), int(plan.groups), int(plan.cin_g), int(plan.cout_g)
    outs = tuple(int(a.out) for a in plan.axes)
    kernel = tuple(int(a.kernel) for a in plan.axes)
    xg = x.reshape((n, g, cin_g) + x.shape[2:])
    dyg = dy.reshape((n, g, cout_g, 1) + outs)
    dw = np.zeros((g, cout_g, cin_g) + kernel, dtype=F32)
    with np.errstate(all="ignore"):
        for ks in product(*(range(k) for k in kernel)):
            idx = [
                int(a.tap(0, k)) + np.arange(o, dtype=np.int64) * int(a.stride)
                for a, k, o in zip(plan.axes, ks, outs, strict=True)
            ]
            xv = _host_taps(xg, idx)[:, :, None]  # (n, g, 1, cin_g, *outs)
            prods = (dyg * xv).astype(F32).reshape(n, g, cout_g, cin_g, -1)
            acc = np.zeros((g, cout_g, cin_g), dtype=F32)
            for b in range(n):
                for q in range(prods.shape[-1]):
                    acc = (acc + prods[b, ..., q]).astype(F32)
            dw[(slice(None), slice(None), slice(None)) + ks] = acc
    return _canon(dw.reshape((g * cout_g, cin_g) + kernel))


def _host_bgrad(dy: np.ndarray) -> np.ndarray:
    n, co = dy.shape[:2]
    flat = dy.reshape(n, co, -1)
    acc = np.zeros(co, dtype=F32)
    with np.errstate(all="ignore"):
        for b in range(n):
            for q in range(flat.shape[2]):
                acc = (acc + flat[b, :, q]).astype(F32)
    return _canon(acc)


# -- public entry points ----------------------------------------------------------------------------------------


@entry_point("conv")
def conv(
    x: Any,
    w: Any,
    b: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str = "auto",
) -> Any:
    """Rank-generic convolution, x (N, C, *in), w (CO, C/groups, *k), bias (CO) or None: y (N, CO, *out)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    x, w = _f32(xp, x), _f32(xp, w)
    b = None if b is None else _f32(xp, b).reshape(-1)
    rank = x.ndim - 2
    plan = _guard(
        x.shape,
        w.shape,
        0 if b is None else int(b.size),
        int(w.shape[0]),
        stride,
        padding,
        dilation,
        groups,
        int(x.size),
        int(w.size),
    )
    outs = tuple(int(a.out) for a in plan.axes)
    if dev == "host":
        return _host_conv(x, w, None if b is None else b[: int(w.shape[0])], plan)
    if rank > MAX_RANK:
        raise ValueError(f"the CUDA builds take spatial rank <= {MAX_RANK}, not {rank}")
    y = xp.empty((x.shape[0], w.shape[0]) + outs, dtype=xp.float32)
    meta = _meta(
        xp,
        plan,
        x.shape[2:],
        outs,
        w.shape[2:],
        *(_tuple(v, rank) for v in (stride, padding, dilation)),
        x.shape[1],
        w.shape[0],
    )
    bias = b if b is not None else xp.zeros(1, dtype=xp.float32)
    _launch("fwd", rank, int(y.size), (x, w, bias, y, meta), (np.int32(b is not None),))
    return y


def conv2d(
    x: Any,
    w: Any,
    b: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str = "auto",
) -> Any:
    """NCHW convolution: :func:`conv` of spatial rank 2."""
    if len(x.shape) != 4:
        raise ValueError("conv2d takes x of shape (N, C, H, W)")
    return conv(x, w, b, stride, padding, dilation, groups, device)


def _tconv_axes(
    x_shape: Sequence[int], kernel: Sequence[int], stride: Any, padding: Any, dilation: Any, output_padding: Any
) -> tuple[TConvAxis, ...]:
    rank = len(x_shape) - 2
    axes = tuple(
        tconv_axis_plan(*a)
        for a in zip(
            x_shape[2:],
            kernel,
            _tuple(stride, rank),
            _tuple(padding, rank),
            _tuple(dilation, rank),
            _tuple(output_padding, rank),
            strict=True,
        )
    )
    if not all(bool(a.valid) for a in axes):
        raise ConvRefused(
            f"transposed convolution refused by its plan: input {tuple(x_shape)}, kernel {kernel}, "
            f"stride {stride}, padding {padding}, dilation {dilation}, output_padding {output_padding}"
        )
    return axes


@entry_point("conv")
def conv_transpose(
    x: Any,
    w: Any,
    b: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    output_padding: Any = 0,
    device: str = "auto",
) -> Any:
    """Transposed convolution, x (N, C, *in), w (C, CO/groups, *k) (PyTorch's layout): y (N, CO, *out)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    x, w = _f32(xp, x), _f32(xp, w)
    b = None if b is None else _f32(xp, b).reshape(-1)
    rank = x.ndim - 2
    kernel = tuple(int(k) for k in w.shape[2:])
    axes = _tconv_axes(x.shape, kernel, stride, padding, dilation, output_padding)
    outs = tuple(int(a.out) for a in axes)
    c_out = int(w.shape[1]) * groups
    if x.shape[1] % groups:
        raise ValueError(f"{x.shape[1]} input channels are not divisible by {groups} groups")
    # The guard of the adjoint convolution (its input is this call's output) admits exactly these buffers.
    _guard(
        (x.shape[0], c_out) + outs,
        (x.shape[1], w.shape[1]) + kernel,
        0,
        int(x.shape[1]),
        stride,
        padding,
        dilation,
        groups,
        x.shape[0] * c_out * int(np.prod(outs)),
        int(w.size),
        int(x.size),
    )
    if b is not None and int(b.size) < c_out:
        raise ValueError(f"bias of {b.size} elements for {c_out} output channels")
    if dev == "host":
        return _host_tconv(x, w, None if b is None else b[:c_out], axes, groups)
    y = xp.empty((x.shape[0], c_out) + outs, dtype=xp.float32)
    meta = _meta(
        xp,
        _guard_stub(x.shape[0], groups),
        x.shape[2:],
        outs,
        kernel,
        *(_tuple(v, rank) for v in (stride, padding, dilation)),
        x.shape[1],
        c_out,
    )
    bias = b if b is not None else xp.zeros(1, dtype=xp.float32)
    _launch("tgather", rank, int(y.size), (x, w, bias, y, meta), (np.int32(b is not None),))
    return y


def _guard_stub(batch: int, groups: int) -> ConvPlan:
    return ConvPlan(batch, 0, 0, groups, 0, 0, (), 0, True, 0, 0, 0)


@entry_point("conv")
def conv_weight_grad(
    x: Any,
    dy: Any,
    kernel: Sequence[int],
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str = "auto",
) -> Any:
    """dw (CO, C/groups, *kernel) of :func:`conv` given its input x and output gradient dy."""
    dev = resolve_device(device)
    xp = array_module(dev)
    x, dy = _f32(xp, x), _f32(xp, dy)
    rank = x.ndim - 2
    c_out = int(dy.shape[1])
    kernel = tuple(int(k) for k in kernel)
    w_shape = (c_out, x.shape[1] // max(groups, 1)) + kernel
    plan = _guard(
        x.shape, w_shape, 0, c_out, stride, padding, dilation, groups, int(x.size), int(np.prod(w_shape)), int(dy.size)
    )
    if tuple(dy.shape) != (x.shape[0], c_out) + tuple(int(a.out) for a in plan.axes):
        raise ValueError(f"dy {tuple(dy.shape)} is not the output shape of x {tuple(x.shape)} under this window")
    if dev == "host":
        return _host_wgrad(x, dy, plan)
    dw = xp.empty(w_shape, dtype=xp.float32)
    meta = _meta(
        xp,
        plan,
        x.shape[2:],
        dy.shape[2:],
        kernel,
        *(_tuple(v, rank) for v in (stride, padding, dilation)),
        x.shape[1],
        c_out,
    )
    _launch("wgrad", rank, int(dw.size), (x, dy, dw, meta))
    return dw


@entry_point("conv")
def bias_grad(dy: Any, device: str = "auto") -> Any:
    """db (CO) = fold over (n, o) row-major of dy[n, co, o] from +0."""
    dev = resolve_device(device)
    xp = array_module(dev)
    dy = _f32(xp, dy)
    if dev == "host":
        return _host_bgrad(dy)
    n, co = int(dy.shape[0]), int(dy.shape[1])
    db = xp.empty(co, dtype=xp.float32)
    if co:
        from native.nvrtc import compile_function

        fn = compile_function(*kernel_source("bgrad"), ROUTE)
        plan = launch_plan(co)
        fn(
            (int(plan["grid"]),),
            (int(plan["block"]),),
            (dy, db, np.int64(n), np.int64(co), np.int64(int(np.prod(dy.shape[2:])))),
        )
    return db


def conv_backward(
    x: Any, w: Any, dy: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1, device: str = "auto"
) -> tuple[Any, Any, Any]:
    """(dx, dw, db) of :func:`conv`: dx = conv_transpose(dy, w) cropped to x's size, dw, db by their folds."""
    rank = len(x.shape) - 2
    sizes = tuple(int(s) for s in x.shape[2:])
    kernel = tuple(int(k) for k in w.shape[2:])
    st, pd, dl = (_tuple(v, rank) for v in (stride, padding, dilation))
    outs = tuple(int(s) for s in dy.shape[2:])
    # output_padding recovers sizes the forward's floor dropped: size - ((out - 1) s - 2p + d(k - 1) + 1).
    op = tuple(
        s - ((o - 1) * a - 2 * p + d * (k - 1) + 1)
        for s, o, a, p, d, k in zip(sizes, outs, st, pd, dl, kernel, strict=True)
    )
    dx = conv_transpose(dy, w, None, st, pd, dl, groups, op, device=device)
    return dx, conv_weight_grad(x, dy, kernel, st, pd, dl, groups, device=device), bias_grad(dy, device=device)


def conv_transpose_backward(
    x: Any, w: Any, dy: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1, device: str = "auto"
) -> tuple[Any, Any, Any]:
    """(dx, dw, db) of :func:`conv_transpose`: dx = conv(dy, w), dw = conv_weight_grad(dy, x), db = bias_grad."""
    kernel = tuple(int(k) for k in w.shape[2:])
    dx = conv(dy, w, None, stride, padding, dilation, groups, device=device)
    dw = conv_weight_grad(dy, x, kernel, stride, padding, dilation, groups, device=device)
    return dx, dw, bias_grad(dy, device=device)


# -- pooling -----------------------------------------------------------------------------------------------------


def _pool_guard(shape: Sequence[int], kernel: Any, stride: Any, padding: Any, x_len: int) -> Pool2dPlan:
    if len(shape) < 2:
        raise ValueError(f"pooling takes (..., H, W), not {tuple(shape)}")
    k, s, p = _tuple(kernel, 2), _tuple(stride if stride is not None else kernel, 2), _tuple(padding, 2)
    planes = int(np.prod(shape[:-2], dtype=np.int64))
    plan = pool2d_plan(planes, shape[-2], shape[-1], k[0], k[1], s[0], s[1], p[0], p[1])
    if not plan.accepts(x_len, int(plan.y_elems)):
        raise ConvRefused(f"pooling refused by its plan: input {tuple(shape)}, kernel {k}, stride {s}, padding {p}")
    return plan


def _pool_meta(xp: Any, plan: Pool2dPlan) -> Any:
    a, b = plan.axes
    return xp.asarray(
        np.array(
            [
                int(v)
                for v in (a.size, b.size, a.out, b.out, a.kernel, b.kernel, a.stride, b.stride, a.padding, b.padding)
            ],
            dtype=np.int64,
        )
    )


def _windows(plan: Pool2dPlan) -> Iterator[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]:
    """(kh, kw, rows, cols, real mask) per window tap, rows/cols over the output grid."""
    a, b = plan.axes
    for kh in range(int(a.kernel)):
        for kw in range(int(b.kernel)):
            rows = np.arange(int(a.out), dtype=np.int64) * int(a.stride) - int(a.padding) + kh
            cols = np.arange(int(b.out), dtype=np.int64) * int(b.stride) - int(b.padding) + kw
            real = np.multiply.outer((rows >= 0) & (rows < int(a.size)), (cols >= 0) & (cols < int(b.size)))
            yield kh, kw, rows, cols, real


def _above(v: np.ndarray, best: np.ndarray) -> np.ndarray:
    """The kernel's kc_above: NaN above all numbers (first NaN kept), +0 above -0, else >."""
    bn, vn = np.isnan(best), np.isnan(v)
    zero_up = (v == best) & (v == 0) & np.signbit(best) & ~np.signbit(v)
    return ~bn & (vn | zero_up | (v > best))


@entry_point("conv")
def max_pool2d(x: Any, kernel: Any, stride: Any = None, padding: Any = 0, device: str = "auto") -> tuple[Any, Any]:
    """(y, argmax) over (..., H, W): the maximum of the real taps and its first row-major index ih * W + iw."""
    dev = resolve_device(device)
    xp = array_module(dev)
    x = _f32(xp, x)
    plan = _pool_guard(x.shape, kernel, stride, padding, int(x.size))
    a, b = plan.axes
    out_shape = tuple(x.shape[:-2]) + (int(a.out), int(b.out))
    if dev == "host":
        xs = x.reshape(-1, int(a.size), int(b.size))
        best = np.zeros((xs.shape[0], int(a.out), int(b.out)), dtype=F32)
        arg = np.full(best.shape, -1, dtype=np.int64)
        for _, _, rows, cols, real in _windows(plan):
            v = _host_taps(xs, [rows, cols])
            take = real[None] & ((arg < 0) | _above(v, best))
            best = np.where(take, v, best)
            arg = np.where(take, np.add.outer(rows * int(b.size), cols)[None], arg)
        return _canon(best).reshape(out_shape), arg.reshape(out_shape)
    y = xp.empty(out_shape, dtype=xp.float32)
    arg = xp.empty(out_shape, dtype=xp.int64)
    _launch("maxpool", 2, int(y.size), (x, y, arg, _pool_meta(xp, plan)))
    return y, arg


def _host_pool_bwd(dy: np.ndarray, plan: Pool2dPlan, weight: Any) -> np.ndarray:
    """dx[cell] = fold over windows containing it, row-major output order, of weight(window, cell) * dy."""
    a, b = plan.axes
    h, w = int(a.size), int(b.size)
    dys = dy.reshape(-1, int(a.out), int(b.out))
    dx = np.zeros((dys.shape[0], h * w), dtype=F32)
    planes = np.arange(dys.shape[0])
    with np.errstate(all="ignore"):
        for oh in range(int(a.out)):
            for ow in range(int(b.out)):
                for cell, take in weight(oh, ow):
                    upd = (dx[planes, cell] + dys[:, oh, ow]).astype(F32)
                    dx[planes, cell] = np.where(take, upd, dx[planes, cell])
    return dx


@entry_point("conv")
def max_pool2d_backward(
    dy: Any,
    argmax: Any,
    x_shape: Sequence[int],
    kernel: Any,
    stride: Any = None,
    padding: Any = 0,
    device: str = "auto",
) -> Any:
    """dx: each dy added into its window's argmax, each cell's contributions in row-major output order from +0."""
    dev = resolve_device(device)
    xp = array_module(dev)
    dy = _f32(xp, dy)
    arg = xp.ascontiguousarray(xp.asarray(argmax, dtype=xp.int64))
    plan = _pool_guard(x_shape, kernel, stride, padding, int(np.prod(x_shape)))
    if int(dy.size) != int(plan.y_elems) or int(arg.size) != int(plan.y_elems):
        raise ValueError(f"dy {tuple(dy.shape)} / argmax {tuple(arg.shape)} do not match the pooled shape")
    if dev == "host":
        args = arg.reshape(-1, int(plan.axes[0].out), int(plan.axes[1].out))
        ok = args >= 0

        def routes(oh: int, ow: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            yield np.where(ok[:, oh, ow], args[:, oh, ow], 0), ok[:, oh, ow]

        return _canon(_host_pool_bwd(dy, plan, routes)).reshape(tuple(x_shape))
    dx = xp.empty(tuple(int(s) for s in x_shape), dtype=xp.float32)
    _launch("maxpool_bwd", 2, int(dx.size), (dy, arg, dx, _pool_meta(xp, plan)))
    return dx


@entry_point("conv")
def avg_pool2d(x: Any, kernel: Any, stride: Any = None, padding: Any = 0, device: str = "auto") -> Any:
    """Fold from +0 over the window (padded cells +0, counted), then / float32(kh * kw)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    x = _f32(xp, x)
    plan = _pool_guard(x.shape, kernel, stride, padding, int(x.size))
    a, b = plan.axes
    out_shape = tuple(x.shape[:-2]) + (int(a.out), int(b.out))
    if dev == "host":
        xs = x.reshape(-1, int(a.size), int(b.size))
        acc = np.zeros((xs.shape[0], int(a.out), int(b.out)), dtype=F32)
        with np.errstate(all="ignore"):
            for _, _, rows, cols, _ in _windows(plan):
                acc = (acc + _host_taps(xs, [rows, cols])).astype(F32)
            acc = (acc / F32(int(a.kernel) * int(b.kernel))).astype(F32)
        return _canon(acc).reshape(out_shape)
    y = xp.empty(out_shape, dtype=xp.float32)
    _launch("avgpool", 2, int(y.size), (x, y, _pool_meta(xp, plan)))
    return y


@entry_point("conv")
def avg_pool2d_backward(
    dy: Any, x_shape: Sequence[int], kernel: Any, stride: Any = None, padding: Any = 0, device: str = "auto"
) -> Any:
    """dx[cell] = (fold of dy over the windows containing the cell, row-major output order) / float32(kh * kw)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    dy = _f32(xp, dy)
    plan = _pool_guard(x_shape, kernel, stride, padding, int(np.prod(x_shape)))
    if int(dy.size) != int(plan.y_elems):
        raise ValueError(f"dy {tuple(dy.shape)} does not match the pooled shape")
    if dev == "host":
        a, b = plan.axes
        w = int(b.size)
        taps = list(_windows(plan))

        def routes(oh: int, ow: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            for _, _, rows, cols, real in taps:
                if real[oh, ow]:
                    yield np.int64(rows[oh] * w + cols[ow]), np.bool_(True)

        with np.errstate(all="ignore"):
            dx = (_host_pool_bwd(dy, plan, routes) / F32(int(a.kernel) * int(b.kernel))).astype(F32)
        return _canon(dx).reshape(tuple(x_shape))
    dx = xp.empty(tuple(int(s) for s in x_shape), dtype=xp.float32)
    dummy = xp.zeros(1, dtype=xp.int64)
    _launch("avgpool_bwd", 2, int(dx.size), (dy, dummy, dx, _pool_meta(xp, plan)))
    return dx


# -- im2col + cuBLAS ---------------------------------------------------------------------------------------------


def _host_im2col(x: np.ndarray, plan: ConvPlan, kb: int) -> np.ndarray:
    """cols (groups, kb, N * P): row (ci, k) row-major of each group, column (n, o) row-major; +0 in the padding."""
    n, g, cin_g = int(plan.batch), int(plan.groups), int(plan.cin_g)
    outs = tuple(int(a.out) for a in plan.axes)
    p = int(np.prod(outs, dtype=np.int64))
    xg = x.reshape((n, g, cin_g) + x.shape[2:])
    cols = np.zeros((g, kb, n * p), dtype=F32)
    for ci in range(cin_g):
        for t, ks in enumerate(product(*(range(int(a.kernel)) for a in plan.axes))):
            idx = [
                int(a.tap(0, k)) + np.arange(o, dtype=np.int64) * int(a.stride)
                for a, k, o in zip(plan.axes, ks, outs, strict=True)
            ]
            taps = _host_taps(xg[:, :, ci], idx)  # (n, g, *outs)
            cols[:, ci * int(plan.taps) + t] = np.moveaxis(taps.reshape(n, g, p), 1, 0).reshape(g, n * p)
    return cols


@entry_point("conv")
def im2col(
    x: Any,
    kernel: Sequence[int],
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    bias_row: bool = False,
    device: str = "auto",
) -> Any:
    """The column matrix (groups, cin_g * taps (+ 1 row of ones), N * P) of x (N, C, *in) under the window."""
    dev = resolve_device(device)
    xp = array_module(dev)
    x = _f32(xp, x)
    rank = x.ndim - 2
    kernel = tuple(int(k) for k in kernel)
    w_shape = (groups, x.shape[1] // max(groups, 1)) + kernel
    plan = _guard(x.shape, w_shape, 0, groups, stride, padding, dilation, groups, int(x.size), int(np.prod(w_shape)))
    k = int(plan.cin_g) * int(plan.taps)
    kb = k + int(bias_row)
    p = int(np.prod([int(a.out) for a in plan.axes], dtype=np.int64))
    q = int(plan.batch) * p
    if int(plan.groups) * kb * q > MAX_ELEMENTS:
        raise ValueError(f"the column matrix of {int(plan.groups) * kb * q} elements exceeds 2^40")
    if dev == "host":
        cols = _host_im2col(x, plan, kb)
    else:
        if rank > MAX_RANK:
            raise ValueError(f"the CUDA builds take spatial rank <= {MAX_RANK}, not {rank}")
        cols = xp.empty((int(plan.groups), kb, q), dtype=xp.float32)
        meta = _meta(
            xp,
            plan,
            x.shape[2:],
            [int(a.out) for a in plan.axes],
            kernel,
            *(_tuple(v, rank) for v in (stride, padding, dilation)),
            x.shape[1],
            groups,
        )
        _launch("im2col", rank, int(plan.groups) * k * q, (x, cols, meta), (np.int64(kb),))
    if bias_row:
        cols[:, k, :] = 1.0
    return cols


@entry_point("conv")
def conv_im2col(
    x: Any,
    w: Any,
    b: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str = "auto",
) -> Any:
    """:func:`conv` through im2col and the guarded GEMM (cuBLAS on CUDA): W[g] @ cols[g], the bias a K+1-th term.

    Every output is one inner product of K = cin_g * taps (+1 with a bias) terms in cuBLAS's order: within
    gamma_{K(+1)} (sum |w x| + |b|) of the exact value (contracts/conv-pool-v1.yaml, CONV-IM2COL).
    """
    from native.gemm import matmul

    dev = resolve_device(device)
    xp = array_module(dev)
    x, w = _f32(xp, x), _f32(xp, w)
    b = None if b is None else _f32(xp, b).reshape(-1)
    plan = _guard(
        x.shape,
        w.shape,
        0 if b is None else int(b.size),
        int(w.shape[0]),
        stride,
        padding,
        dilation,
        groups,
        int(x.size),
        int(w.size),
    )
    g, cout_g = int(plan.groups), int(plan.cout_g)
    outs = tuple(int(a.out) for a in plan.axes)
    n = int(plan.batch)
    cols = im2col(x, w.shape[2:], stride, padding, dilation, groups, bias_row=b is not None, device=dev)
    k = int(plan.cin_g) * int(plan.taps)
    wm = w.reshape(g, cout_g, k)
    if b is not None:
        wm = xp.ascontiguousarray(xp.concatenate([wm, b[: g * cout_g].reshape(g, cout_g, 1)], axis=2))
    if n * int(np.prod(outs, dtype=np.int64)) == 0 or cout_g == 0:
        return xp.zeros((n, g * cout_g) + outs, dtype=xp.float32)
    y = matmul(xp.ascontiguousarray(wm), cols, device=dev)  # (g, cout_g, N * P)
    y = y.reshape((g, cout_g, n) + outs)
    y = xp.ascontiguousarray(xp.moveaxis(y, 2, 0)).reshape((n, g * cout_g) + outs)
    return _canon(y) if dev == "host" else y


# -- smooth max pooling ------------------------------------------------------------------------------------------


def _beta(beta: float) -> np.float32:
    bf = F32(beta)
    if not (np.isfinite(bf) and bf > 0):
        raise ValueError(f"smooth max pooling takes a finite beta > 0 (as float32), not {beta}")
    return bf


def _host_smooth_stats(xs: np.ndarray, plan: Pool2dPlan, beta: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """(m, s) per window: the maximum of the real taps, then the fold of exp(beta (x - m)) in row-major tap order."""
    a, b = plan.axes
    m = np.zeros((xs.shape[0], int(a.out), int(b.out)), dtype=F32)
    seen = np.zeros(m.shape, dtype=bool)
    with np.errstate(all="ignore"):
        for _, _, rows, cols, real in _windows(plan):
            v = _host_taps(xs, [rows, cols])
            take = real[None] & (~seen | _above(v, m))
            m = np.where(take, v, m)
            seen |= real[None]
        s = np.zeros(m.shape, dtype=F32)
        for _, _, rows, cols, real in _windows(plan):
            v = _host_taps(xs, [rows, cols])
            e = _exp32((beta * (v - m).astype(F32)).astype(F32))
            s = np.where(real[None], (s + e).astype(F32), s)
    return m, s


def _exp32(v: np.ndarray) -> np.ndarray:
    """exp in float64 rounded once to float32 (the host's expf)."""
    with np.errstate(all="ignore"):
        return np.exp(v.astype(np.float64)).astype(F32)


@entry_point("conv")
def smooth_max_pool2d(
    x: Any, kernel: Any, stride: Any = None, padding: Any = 0, beta: float = 1.0, device: str = "auto"
) -> Any:
    """y = m + log(sum over the real taps of exp(beta (x - m))) / beta, m the taps' maximum (padding ignored)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    x = _f32(xp, x)
    bf = _beta(beta)
    plan = _pool_guard(x.shape, kernel, stride, padding, int(x.size))
    a, b = plan.axes
    out_shape = tuple(x.shape[:-2]) + (int(a.out), int(b.out))
    if dev == "host":
        m, s = _host_smooth_stats(x.reshape(-1, int(a.size), int(b.size)), plan, bf)
        with np.errstate(all="ignore"):
            ls = np.log(s.astype(np.float64)).astype(F32)
            y = (m + (ls / bf).astype(F32)).astype(F32)
        return _canon(y).reshape(out_shape)
    y = xp.empty(out_shape, dtype=xp.float32)
    _launch("smoothpool", 2, int(y.size), (x, y, _pool_meta(xp, plan)), (bf,))
    return y


@entry_point("conv")
def smooth_max_pool2d_backward(
    dy: Any,
    x: Any,
    kernel: Any,
    stride: Any = None,
    padding: Any = 0,
    beta: float = 1.0,
    device: str = "auto",
) -> Any:
    """dx[i] = fold over the windows o containing i (row-major) of dy[o] * (exp(beta (x_i - m_o)) / s_o)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    dy, x = _f32(xp, dy), _f32(xp, x)
    bf = _beta(beta)
    plan = _pool_guard(x.shape, kernel, stride, padding, int(x.size))
    if int(dy.size) != int(plan.y_elems):
        raise ValueError(f"dy {tuple(dy.shape)} does not match the pooled shape")
    if dev == "host":
        a, b = plan.axes
        h, w = int(a.size), int(b.size)
        xs = x.reshape(-1, h, w)
        m, s = _host_smooth_stats(xs, plan, bf)
        dys = dy.reshape(m.shape)
        xf = xs.reshape(xs.shape[0], h * w)  # h * w, not -1: a call with no planes (POOL-REGIMES' no_planes)
        dx = np.zeros(xf.shape, dtype=F32)
        planes = np.arange(xf.shape[0])
        with np.errstate(all="ignore"):
            for cell in range(h * w):  # gather form: each cell's windows in row-major output order
                ih, iw = divmod(cell, w)
                for oh in range(int(a.out)):
                    for ow in range(int(b.out)):
                        if not (0 <= ih - (oh * int(a.stride) - int(a.padding)) < int(a.kernel)):
                            continue
                        if not (0 <= iw - (ow * int(b.stride) - int(b.padding)) < int(b.kernel)):
                            continue
                        mo, so = m[:, oh, ow], s[:, oh, ow]
                        e = _exp32((bf * (xf[planes, cell] - mo).astype(F32)).astype(F32))
                        dx[:, cell] = (dx[:, cell] + (dys[:, oh, ow] * (e / so).astype(F32)).astype(F32)).astype(F32)
        return _canon(dx).reshape(tuple(x.shape))
    dx = xp.empty(tuple(x.shape), dtype=xp.float32)
    _launch("smoothpool_bwd", 2, int(dx.size), (dy, x, dx, _pool_meta(xp, plan)), (bf,))
    return dx


@register_workload("conv")
def _workload() -> int:
    """Every conv/pool CUDA build once or more on small shapes (for compute-sanitizer): launches made."""
    import cupy

    rng = np.random.default_rng(0)

    def r(*shape: int) -> Any:
        return cupy.asarray(rng.uniform(-2, 2, shape).astype(np.float32))

    launches = 0
    for xs, ws, win in (
        ((1, 2, 7), (4, 2, 3), {"stride": 2, "padding": 1, "dilation": 2, "groups": 1}),
        ((2, 4, 6, 5), (6, 2, 3, 2), {"stride": (2, 1), "padding": (1, 1), "dilation": (1, 2), "groups": 2}),
        ((1, 2, 4, 3, 5), (2, 1, 2, 2, 3), {"stride": (1, 2, 1), "padding": (1, 0, 1), "dilation": 1, "groups": 2}),
    ):
        x, w = r(*xs), r(*ws)
        y = conv(x, w, r(ws[0]), device="cuda", **win)
        conv(x, w, None, device="cuda", **win)
        conv_backward(x, w, y, device="cuda", **win)
        im2col(x, ws[2:], bias_row=True, device="cuda", **win)
        launches += 6
    x = r(2, 3, 6, 7)
    for pool in ({"kernel": 3, "stride": 1, "padding": 1}, {"kernel": (2, 3), "stride": (2, 1), "padding": (1, 0)}):
        y, arg = max_pool2d(x, device="cuda", **pool)
        dy = r(*y.shape)
        max_pool2d_backward(dy, arg, x.shape, device="cuda", **pool)
        avg_pool2d(x, device="cuda", **pool)
        avg_pool2d_backward(dy, x.shape, device="cuda", **pool)
        smooth_max_pool2d(x, beta=3.0, device="cuda", **pool)
        smooth_max_pool2d_backward(dy, x, beta=3.0, device="cuda", **pool)
        launches += 6
    cupy.cuda.runtime.deviceSynchronize()
    return launches
