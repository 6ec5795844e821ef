"""RMSNorm (forward) in the style of the Triton tutorial "Layer Normalization": one program per row, the grid and
``BLOCK_SIZE`` from :func:`native.triton_rmsnorm.rmsnorm_plan`, which launches it.

The kernel loops over the row in blocks, accumulating x*x per lane, then ``rstd = 1 / tl.sqrt(mean + eps)`` and
``y = x * rstd * w``. Offsets are int32, as in the tutorial (``program_id * stride``): the plan's guard keeps
them in range.
"""

import triton
import triton.language as tl


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
