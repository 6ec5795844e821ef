"""The triton-softmax family: the Triton tutorials' "Fused Softmax" kernel (:mod:`native.tritonk.softmax`), its
launch plan, host wrapper and audit builds.

The plan is the tutorial's host code: ``BLOCK_SIZE`` the next power of two of the row length (one block holds
the whole row, so rows are at most SOFTMAX_MAX_LENGTH), ``num_warps`` 4 (8 from 2048 lanes, 16 from 4096), one
program per row (:class:`native.triton.TritonRowPlan`). The kernel uses Triton's fp32 lowering: ``/`` is
div.full.f32 and ``tl.exp`` ex2.approx.f32 (PTX, approximate); each build declares them
(:func:`spec.triton_softmax.declared_opcodes`) and the contract bounds the results against spec.norm's real
softmax with them. The sum is a ``tl.sum`` tree (any order: the bound's gamma_{n-1} holds for every order).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from native.builds import Build, register_builds
from native.triton import MAX_BLOCK, TritonRowPlan, host_rows, next_power_of_2, plan_builds, row_plan
from native.tritonrt import launch, load_kernel_module
from obligations.core.entrypoints import entry_point
from obligations.core.symbolic import as_type, select
from spec.triton_softmax import declared_opcodes

__all__ = ["FAMILY", "KERNELS", "SOFTMAX_MAX_LENGTH", "DECLARED", "softmax_plan", "softmax"]

FAMILY = "triton-softmax"
KERNELS = "native.tritonk.softmax"
SOFTMAX_MAX_LENGTH = MAX_BLOCK  # one block per row: longer rows would spill the registers of one program
DECLARED = declared_opcodes()


def softmax_plan(rows: Any, length: Any) -> TritonRowPlan:
    """The fused-softmax tutorial's launch: BLOCK_SIZE = next_power_of_2(n_cols), num_warps 4 (8 from 2048, 16 from
    4096), one program per row, rows of at most SOFTMAX_MAX_LENGTH."""
    block = next_power_of_2(as_type(length, "int64"))
    warps = select(block >= 4096, 16, select(block >= 2048, 8, 4))
    return row_plan(rows, length, block, warps, SOFTMAX_MAX_LENGTH)


@entry_point(FAMILY)
def softmax(x: Any, mask: Any = None, device: str = "auto") -> Any:
    """Softmax along the last axis by the Triton tutorial kernel (no mask: the kernel has none)."""
    if mask is not None:
        raise ValueError("the Triton softmax takes no mask (the tutorial kernel has none)")
    dev, xp, x, plan = host_rows(x, device, softmax_plan)
    y = xp.empty_like(x)
    kernel = load_kernel_module(KERNELS).softmax_kernel
    launch(kernel, plan, y, x, int(plan.length), int(plan.length), int(plan.length), device=dev)
    return y


_SIGNATURE = {"output_ptr": "*fp32", "input_ptr": "*fp32", "input_row_stride": "i32", "output_row_stride": "i32"}
_SIGNATURE["n_cols"] = "i32"


@register_builds(FAMILY)
def _builds() -> Iterator[Build]:
    yield from plan_builds(FAMILY, f"{KERNELS}:softmax_kernel", softmax_plan, _SIGNATURE, DECLARED)
