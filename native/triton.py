"""The triton family: the Triton softmax and RMSNorm (forward) of :mod:`native.tritonk.norm`, their launch plans,
host wrappers and builds (the runtime that launches and compiles them is :mod:`native.tritonrt`).

Each plan is the tutorial's host code as a plan: ``BLOCK_SIZE`` (the kernel's one ``tl.constexpr``) is the next
power of two of the row length (RMSNorm: at most 64 KiB of float32 per block, the tutorial's MAX_FUSED_SIZE,
looping over longer rows), ``num_warps`` the tutorial's rule, the grid one program per row. The wrappers launch
through :func:`native.tritonrt.launch`, which reads exactly these, so what the contracts prove about a plan
(every access in bounds in the kernel's int32 arithmetic, every element covered) is about the launch.

The tutorials index in int32 (``row * stride + col``, Triton's type for ints below 2^31): the guards admit at
most MAX_ELEMENTS elements so no offset wraps (with 2^31 elements a row's offset would turn negative). The
kernels use Triton's fp32 lowering: ``/`` is div.full.f32, ``tl.exp`` ex2.approx.f32, ``tl.sqrt``
sqrt.approx.ftz.f32 (PTX, approximate), and fusion contracts x*x + acc: each build declares the opcodes and
the contracts bound the results against spec.norm's real values with them. Sums are ``tl.sum`` trees (any
order: the bounds' gamma_{n-1} holds for every order).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from native.builds import Build, register_builds
from native.norm import RowsRefused
from native.tritonrt import launch, load_kernel_module, triton_build
from obligations.core.device import array_module, resolve_device
from obligations.core.entrypoints import entry_point
from obligations.core.symbolic import all_of, as_type, select, smax, smin
from spec.triton import declared

__all__ = [
    "MAX_ELEMENTS",
    "MAX_FUSED_SIZE",
    "SOFTMAX_MAX_LENGTH",
    "KERNELS",
    "TritonRowPlan",
    "next_power_of_2",
    "softmax_plan",
    "rmsnorm_plan",
    "softmax",
    "rmsnorm",
]

KERNELS = "native.tritonk.norm"
MAX_FUSED_SIZE = 65536 // 4  # the tutorial's bound on a row block: 64 KiB of float32
SOFTMAX_MAX_LENGTH = 1 << 14  # one block per row: longer rows would spill the registers of one program
MAX_ELEMENTS = (1 << 31) - (1 << 16)  # int32 offsets: row * stride + col, and col + BLOCK_SIZE, never wrap
_POWERS = tuple(1 << e for e in range(15))  # up to SOFTMAX_MAX_LENGTH = MAX_FUSED_SIZE = 2^14


def next_power_of_2(n: Any) -> Any:
    """``triton.next_power_of_2`` for 1 <= n <= 2^14 as a select chain (the same at launch and in the checker);
    2^15 above (a length no guard admits)."""
    out: Any = 1 << 15
    for p in reversed(_POWERS):
        out = select(n <= p, p, out)
    return out


@dataclass(frozen=True)
class TritonRowPlan:
    """rows x length float32, row-major, one program per row; the kernel's ``BLOCK_SIZE`` and ``num_warps``."""

    rows: Any
    length: Any
    elems: Any
    BLOCK_SIZE: Any  # noqa: N815 - the kernel's tl.constexpr of this name: the launch reads it by name
    num_warps: Any
    programs: Any
    admissible: Any
    shape_ok: Any  # the guard's part a call with real arrays reaches: rows >= 0, a non-empty (softmax: short) row
    looped: bool  # the kernel loops over blocks (RMSNorm); the softmax's one block holds the whole row

    def grid(self) -> tuple[Any, ...]:
        """The launch grid: one program per row."""
        return (self.programs,)

    def col(self, j: Any, lane: Any) -> Any:
        """Column of lane ``lane`` in block ``j``: ``off + tl.arange(0, BLOCK_SIZE)`` in int32."""
        return as_type(j, "int32") * as_type(self.BLOCK_SIZE, "int32") + as_type(lane, "int32")

    def offset(self, r: Any, k: Any) -> Any:
        """The kernel's element offset ``row * stride + col`` in int32 (Triton's type of program_id and stride)."""
        return as_type(r, "int32") * as_type(self.length, "int32") + as_type(k, "int32")

    def blocks(self) -> Any:
        """Blocks per row (the loop's trip count; 1 for the one-block softmax)."""
        return (self.length + self.BLOCK_SIZE - 1) // self.BLOCK_SIZE

    def accepts(self, x_len: Any, y_len: Any) -> Any:
        """The guard: admissible and both buffers hold rows * length elements."""
        return all_of(self.admissible, x_len >= self.elems, y_len >= self.elems)

    def regimes(self) -> dict[str, Any]:
        """Paths a call selects: no rows, a row filling its block, a row with masked lanes, several blocks."""
        some = self.rows >= 1
        paths = {
            "no_rows": self.rows == 0,
            "full_block": all_of(some, self.length == self.BLOCK_SIZE),
            "masked_block": all_of(some, self.length < self.BLOCK_SIZE),
        }
        if self.looped:
            paths["several_blocks"] = all_of(some, self.length > self.BLOCK_SIZE)
        return paths


def _plan(rows: Any, length: Any, block: Any, warps: Any, max_length: int | None) -> TritonRowPlan:
    r64, l64 = as_type(rows, "int64"), as_type(length, "int64")
    shape_ok = (
        all_of(rows >= 0, length >= 1) if max_length is None else all_of(rows >= 0, length >= 1, l64 <= max_length)
    )
    # the product checked by division before it is formed; MAX_ELEMENTS also bounds the row (rows >= 1)
    ok = all_of(shape_ok, l64 <= MAX_ELEMENTS, r64 <= MAX_ELEMENTS // smax(l64, 1))
    return TritonRowPlan(r64, l64, r64 * l64, block, warps, r64, ok, shape_ok, max_length is None)


def softmax_plan(rows: Any, length: Any) -> TritonRowPlan:
    """The fused-softmax tutorial's launch: BLOCK_SIZE = next_power_of_2(n_cols), num_warps 4 (8 from 2048, 16 from
    4096), one program per row, rows of at most SOFTMAX_MAX_LENGTH."""
    block = next_power_of_2(as_type(length, "int64"))
    warps = select(block >= 4096, 16, select(block >= 2048, 8, 4))
    return _plan(rows, length, block, warps, SOFTMAX_MAX_LENGTH)


def rmsnorm_plan(rows: Any, length: Any) -> TritonRowPlan:
    """The layer-norm tutorial's launch: BLOCK_SIZE = min(MAX_FUSED_SIZE, next_power_of_2(N)), num_warps =
    min(max(BLOCK_SIZE // 256, 1), 8), one program per row (longer rows loop over blocks)."""
    l64 = as_type(length, "int64")
    block = smin(MAX_FUSED_SIZE, next_power_of_2(smin(l64, MAX_FUSED_SIZE)))
    warps = smin(select(block // 256 >= 1, block // 256, 1), 8)
    return _plan(rows, length, block, warps, None)


# -- the host wrappers ------------------------------------------------------------------------------------------


def _rows(x: Any, device: str, plan_fn: Any) -> tuple[str, Any, Any, TritonRowPlan]:
    dev = resolve_device(device)
    xp = array_module(dev)
    x = xp.ascontiguousarray(xp.asarray(x, dtype=xp.float32))
    length = int(x.shape[-1]) if x.ndim else 1
    rows = int(x.size) // max(length, 1)
    plan = plan_fn(rows, length)
    if not plan.accepts(int(x.size), int(x.size)):
        raise RowsRefused(f"rows of shape {tuple(x.shape)} refused by {plan_fn.__name__} (empty or too long a row)")
    return dev, xp, x, plan


@entry_point("triton")
def softmax(x: Any, mask: Any = None, device: str = "auto") -> Any:
    """Softmax along the last axis by the Triton tutorial kernel (no mask: the kernel has none)."""
    if mask is not None:
        raise ValueError("the Triton softmax takes no mask (the tutorial kernel has none)")
    dev, xp, x, plan = _rows(x, device, softmax_plan)
    y = xp.empty_like(x)
    kernel = load_kernel_module(KERNELS).softmax_kernel
    launch(kernel, plan, y, x, int(plan.length), int(plan.length), int(plan.length), device=dev)
    return y


@entry_point("triton")
def rmsnorm(x: Any, weight: Any, eps: float = 1e-6, device: str = "auto") -> Any:
    """RMSNorm along the last axis by the Triton tutorial-style kernel: y = x * (1 / sqrt(mean(x * x) + eps)) * w."""
    dev, xp, x, plan = _rows(x, device, rmsnorm_plan)
    w = xp.ascontiguousarray(xp.asarray(weight, dtype=xp.float32)).reshape(-1)
    if int(w.size) != int(plan.length):
        raise ValueError(f"a weight of {w.size} elements for a last axis of {plan.length}")
    y = xp.empty_like(x)
    kernel = load_kernel_module(KERNELS).rms_norm_fwd
    n = int(plan.length)
    launch(kernel, plan, x, y, w, n, n, float(np.float32(eps)), device=dev)
    return y


# -- the builds the audit compiles (one per BLOCK_SIZE/num_warps regime of each plan) ---------------------------

# Triton's fp32 lowering of each kernel's operations (spec.triton): the contract's bounds model exactly these.
SOFTMAX_DECLARED = declared("div", "exp")
RMSNORM_DECLARED = declared("div", "sqrt")
AUDIT_LENGTHS = (100, 16384)  # a short row and the largest block: the PTX of each launch configuration kind


_SOFTMAX_SIG = {"output_ptr": "*fp32", "input_ptr": "*fp32", "input_row_stride": "i32", "output_row_stride": "i32"}
_SOFTMAX_SIG["n_cols"] = "i32"
_RMSNORM_SIG = {"X": "*fp32", "Y": "*fp32", "W": "*fp32", "stride": "i32", "N": "i32", "eps": "fp32"}


def _plan_builds(
    family: str, kernel: str, plan_fn: Any, signature: dict[str, str], declared: frozenset[str]
) -> Iterator[Build]:
    """One build per distinct (BLOCK_SIZE, num_warps) the plan chooses at AUDIT_LENGTHS: the launches' own."""
    seen = set()
    for n in AUDIT_LENGTHS:
        p = plan_fn(1, n)
        key = (int(p.BLOCK_SIZE), int(p.num_warps))
        if key in seen:
            continue
        seen.add(key)
        yield triton_build(
            family,
            f"{kernel}-block{key[0]}-warps{key[1]}",
            f"{KERNELS}:{kernel}",
            signature,
            {"BLOCK_SIZE": key[0]},
            num_warps=key[1],
            declared=declared,
            index_bits=32,
        )


@register_builds("triton")
def _builds() -> Iterator[Build]:
    yield from _plan_builds("triton", "softmax_kernel", softmax_plan, _SOFTMAX_SIG, SOFTMAX_DECLARED)
    yield from _plan_builds("triton", "rms_norm_fwd", rmsnorm_plan, _RMSNORM_SIG, RMSNORM_DECLARED)
