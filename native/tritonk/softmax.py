"""Softmax written the way the Triton tutorial "Fused Softmax" teaches it: one program per row, the grid and
``BLOCK_SIZE`` from :func:`native.triton_softmax.softmax_plan`, which launches it.

The kernel loads the whole row as one block (``BLOCK_SIZE`` the next power of two of its length, padded lanes
-inf), subtracts the row maximum, exponentiates (``tl.exp``), sums (``tl.sum``) and divides. Offsets are int32,
as in the tutorial (``program_id * stride``): the plan's guard keeps them in range.
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
