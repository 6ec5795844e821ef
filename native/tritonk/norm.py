"""Softmax and RMSNorm (forward) written the way the Triton tutorials teach them ("Fused Softmax", "Layer
Normalization"): one program per row; the grid and every ``tl.constexpr`` come from the plans of
:mod:`native.triton`, which launch them.

Softmax loads the whole row as one block (``BLOCK_SIZE`` the next power of two of its length, padded lanes
-inf), subtracts the row maximum, exponentiates (``tl.exp``), sums (``tl.sum``) and divides. RMSNorm loops over
the row in blocks, accumulating x*x per lane, then ``rstd = 1 / tl.sqrt(mean + eps)`` and ``y = x * rstd * w``.
Offsets are int32, as in the tutorials (``program_id * stride``): the plans' guards keep them in range.
"""

import triton
import triton.language as tl


@triton.jit
def softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0)
    row_start_ptr = input_ptr + row_idx * input_row_stride
    col_offsets = tl.arange(0, BLOCK_SIZE)
    input_ptrs = row_start_ptr + col_offsets
    mask = col_offsets < n_cols
    row = tl.load(input_ptrs, mask=mask, other=-float("inf"))
    row_minus_max = row - tl.max(row, axis=0)
    numerator = tl.exp(row_minus_max)
    denominator = tl.sum(numerator, axis=0)
    softmax_output = numerator / denominator
    output_row_start_ptr = output_ptr + row_idx * output_row_stride
    output_ptrs = output_row_start_ptr + col_offsets
    tl.store(output_ptrs, softmax_output, mask=mask)


@triton.jit
def rms_norm_fwd(X, Y, W, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    Y += row * stride
    X += row * stride
    _sq = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
        _sq += x * x
    ms = tl.sum(_sq, axis=0) / N
    rstd = 1 / tl.sqrt(ms + eps)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = tl.load(W + cols, mask=mask)
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        y = x * rstd * w
        tl.store(Y + cols, y, mask=mask)
