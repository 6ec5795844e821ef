"""The triton-rmsnorm family: an RMSNorm (forward) in the style of the Triton tutorials' "Layer Normalization"
kernel (:mod:`native.tritonk.rmsnorm`), its launch plan, host wrapper and audit builds.

The plan is the tutorial's host code: ``BLOCK_SIZE`` the next power of two of the row length, at most
MAX_FUSED_SIZE (64 KiB of float32; longer rows loop over blocks), ``num_warps`` min(max(BLOCK_SIZE // 256, 1), 8),
one program per row (:class:`native.triton.TritonRowPlan`). The kernel uses Triton's fp32 lowering: ``/`` is
div.full.f32 and ``tl.sqrt`` sqrt.approx.ftz.f32 (PTX, approximate), and fusion contracts x*x + acc; each build
declares them (:func:`spec.triton_rmsnorm.declared_opcodes`) and the contract bounds the results against
spec.norm's real RMSNorm with them. The square sum is a ``tl.sum`` tree (any order).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from native.builds import Build, register_builds
from native.triton import MAX_BLOCK, TritonRowPlan, host_rows, next_power_of_2, plan_builds, row_plan
from native.tritonrt import launch, load_kernel_module
from obligations.core.entrypoints import entry_point
from obligations.core.symbolic import as_type, select, smin
from spec.triton_rmsnorm import declared_opcodes

__all__ = ["FAMILY", "KERNELS", "MAX_FUSED_SIZE", "DECLARED", "rmsnorm_plan", "rmsnorm"]

FAMILY = "triton-rmsnorm"
KERNELS = "native.tritonk.rmsnorm"
MAX_FUSED_SIZE = MAX_BLOCK  # the tutorial's bound on a row block: 65536 // 4, 64 KiB of float32
DECLARED = declared_opcodes()


def rmsnorm_plan(rows: Any, length: Any) -> TritonRowPlan:
    """The layer-norm tutorial's launch: BLOCK_SIZE = min(MAX_FUSED_SIZE, next_power_of_2(N)), num_warps =
    min(max(BLOCK_SIZE // 256, 1), 8), one program per row (longer rows loop over blocks)."""
    l64 = as_type(length, "int64")
    block = smin(MAX_FUSED_SIZE, next_power_of_2(smin(l64, MAX_FUSED_SIZE)))
    warps = smin(select(block // 256 >= 1, block // 256, 1), 8)
    return row_plan(rows, length, block, warps, None)


@entry_point(FAMILY)
def rmsnorm(x: Any, weight: Any, eps: float = 1e-6, device: str = "auto") -> Any:
    """RMSNorm along the last axis by the Triton tutorial-style kernel: y = x * (1 / sqrt(mean(x * x) + eps)) * w."""
    dev, xp, x, plan = host_rows(x, device, rmsnorm_plan)
    w = xp.ascontiguousarray(xp.asarray(weight, dtype=xp.float32)).reshape(-1)
    if int(w.size) != int(plan.length):
        raise ValueError(f"a weight of {w.size} elements for a last axis of {plan.length}")
    y = xp.empty_like(x)
    kernel = load_kernel_module(KERNELS).rms_norm_fwd
    n = int(plan.length)
    launch(kernel, plan, x, y, w, n, n, float(np.float32(eps)), device=dev)
    return y


_SIGNATURE = {"X": "*fp32", "Y": "*fp32", "W": "*fp32", "stride": "i32", "N": "i32", "eps": "fp32"}


@register_builds(FAMILY)
def _builds() -> Iterator[Build]:
    yield from plan_builds(FAMILY, f"{KERNELS}:rms_norm_fwd", rmsnorm_plan, _SIGNATURE, DECLARED)
