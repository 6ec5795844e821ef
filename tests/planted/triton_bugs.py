"""Deliberately wrong Triton kernels and plans: each must be caught by the contract item meant to catch it.

The kernels are the tutorials' (native/tritonk/softmax.py, native/tritonk/rmsnorm.py) with one line changed; the
wrappers launch them exactly as native.triton_softmax and native.triton_rmsnorm launch the right ones (the same
plans, through native.tritonrt.launch).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import triton
import triton.language as tl

from native import triton_rmsnorm as trms
from native import triton_softmax as tsm
from native.triton import TritonRowPlan
from native.tritonrt import launch
from obligations.core.device import array_module, resolve_device
from obligations.core.symbolic import all_of, smax

__all__ = ["softmax_mask_off_by_one", "rmsnorm_mean_over_block", "rmsnorm_plan_short_grid", "rmsnorm_plan_wide_guard"]


@triton.jit
def _softmax_mask_le(output_ptr, input_ptr, input_row_stride, output_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0)
    row_start_ptr = input_ptr + row_idx * input_row_stride
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets <= n_cols  # BUG: one lane past the row is loaded and stored
    row = tl.load(row_start_ptr + col_offsets, mask=mask, other=-float("inf"))
    numerator = tl.exp(row - tl.max(row, axis=0))
    softmax_output = numerator / tl.sum(numerator, axis=0)
    tl.store(output_ptr + row_idx * output_row_stride + col_offsets, softmax_output, mask=mask)


@triton.jit
def _rms_norm_mean_over_block(X, Y, W, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    Y += row * stride
    X += row * stride
    _sq = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
        _sq += x * x
    ms = tl.sum(_sq, axis=0) / BLOCK_SIZE  # BUG: the mean over the block's lanes, not over the row's N
    rstd = 1 / tl.sqrt(ms + eps)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = tl.load(W + cols, mask=mask)
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + cols, x * rstd * w, mask=mask)


def softmax_mask_off_by_one(x: Any, mask: Any = None, device: str = "auto") -> Any:
    """The tutorial softmax with ``col_offsets <= n_cols``: rows shorter than their block read and write one past."""
    dev = resolve_device(device)
    xp = array_module(dev)
    x = xp.ascontiguousarray(xp.asarray(x, dtype=xp.float32))
    rows, n = int(x.size) // int(x.shape[-1]), int(x.shape[-1])
    y = xp.empty_like(x)
    launch(_softmax_mask_le, tsm.softmax_plan(rows, n), y, x, n, n, n, device=dev)
    return y


def rmsnorm_mean_over_block(x: Any, weight: Any, eps: float = 1e-6, device: str = "auto") -> Any:
    """The RMSNorm kernel dividing the sum of squares by BLOCK_SIZE instead of N."""
    dev = resolve_device(device)
    xp = array_module(dev)
    x = xp.ascontiguousarray(xp.asarray(x, dtype=xp.float32))
    rows, n = int(x.size) // int(x.shape[-1]), int(x.shape[-1])
    y = xp.empty_like(x)
    w = xp.asarray(weight, dtype=xp.float32)
    launch(_rms_norm_mean_over_block, trms.rmsnorm_plan(rows, n), x, y, w, n, n, float(eps), device=dev)
    return y


def rmsnorm_plan_short_grid(rows: Any, length: Any) -> TritonRowPlan:
    """BUG: a grid of rows - 1 programs (the last row is never normalised)."""
    plan = trms.rmsnorm_plan(rows, length)
    return replace(plan, programs=plan.rows - 1)


def rmsnorm_plan_wide_guard(rows: Any, length: Any) -> TritonRowPlan:
    """BUG: the guard admits 2^40 elements, as the CUDA kernels' row plan does, but the kernel's offsets are int32."""
    plan = trms.rmsnorm_plan(rows, length)
    return replace(plan, admissible=all_of(plan.shape_ok, plan.rows <= (1 << 40) // smax(plan.length, 1)))
