"""What the Triton tutorial kernels' families share (triton-softmax: :mod:`native.triton_softmax`, triton-rmsnorm:
:mod:`native.triton_rmsnorm`): the row plan their launches read, the host side of a call, and their audit builds
(the runtime that launches and compiles them is :mod:`native.tritonrt`).

Each family's plan is its tutorial's host code as a :class:`TritonRowPlan`: ``BLOCK_SIZE`` (the kernel's one
``tl.constexpr``) a power of two from :func:`next_power_of_2` of the row length, ``num_warps`` the tutorial's rule,
the grid one program per row. The wrappers launch through :func:`native.tritonrt.launch`, which reads exactly
these, so what the contracts prove about a plan (every access in bounds in the kernel's int32 arithmetic, every
element covered) is about the launch.

The tutorials index in int32 (``row * stride + col``, Triton's type for ints below 2^31): the guards admit at
most MAX_ELEMENTS elements so no offset wraps (with 2^31 elements a row's offset would turn negative).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from native.builds import Build
from native.norm import RowsRefused
from native.tritonrt import triton_build
from obligations.core.device import array_module, resolve_device
from obligations.core.symbolic import all_of, as_type, select, smax

__all__ = [
    "MAX_ELEMENTS",
    "MAX_BLOCK",
    "AUDIT_LENGTHS",
    "TritonRowPlan",
    "next_power_of_2",
    "row_plan",
    "host_rows",
    "plan_builds",
]

MAX_BLOCK = 1 << 14  # the largest BLOCK_SIZE either family chooses (64 KiB of float32)
MAX_ELEMENTS = (1 << 31) - (1 << 16)  # int32 offsets: row * stride + col, and col + BLOCK_SIZE, never wrap
AUDIT_LENGTHS = (100, 16384)  # a short row and the largest block: the PTX of each launch configuration kind
_POWERS = tuple(1 << e for e in range(15))  # up to MAX_BLOCK = 2^14


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


def row_plan(rows: Any, length: Any, block: Any, warps: Any, max_length: int | None) -> TritonRowPlan:
    """The plan of ``rows`` rows of ``length`` at ``block`` lanes and ``warps`` warps; rows of at most
    ``max_length`` (one block per row), or of any admitted length looped over blocks (None)."""
    r64, l64 = as_type(rows, "int64"), as_type(length, "int64")
    shape_ok = (
        all_of(rows >= 0, length >= 1) if max_length is None else all_of(rows >= 0, length >= 1, l64 <= max_length)
    )
    # the product checked by division before it is formed; MAX_ELEMENTS also bounds the row (rows >= 1)
    ok = all_of(shape_ok, l64 <= MAX_ELEMENTS, r64 <= MAX_ELEMENTS // smax(l64, 1))
    return TritonRowPlan(r64, l64, r64 * l64, block, warps, r64, ok, shape_ok, max_length is None)


def host_rows(x: Any, device: str, plan_fn: Callable[[int, int], TritonRowPlan]) -> tuple[str, Any, Any, TritonRowPlan]:
    """A call's device, array module, contiguous float32 ``x`` and the plan of its rows; RowsRefused where the
    plan's guard refuses them (an empty or too long a row)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    x = xp.ascontiguousarray(xp.asarray(x, dtype=xp.float32))
    length = int(x.shape[-1]) if x.ndim else 1
    rows = int(x.size) // max(length, 1)
    plan = plan_fn(rows, length)
    if not plan.accepts(int(x.size), int(x.size)):
        raise RowsRefused(f"rows of shape {tuple(x.shape)} refused by {plan_fn.__name__} (empty or too long a row)")
    return dev, xp, x, plan


def plan_builds(
    family: str,
    kernel: str,
    plan_fn: Callable[[int, int], TritonRowPlan],
    signature: dict[str, str],
    declared: frozenset[str],
) -> Iterator[Build]:
    """One build of ``kernel`` (module:attr) per distinct (BLOCK_SIZE, num_warps) the plan chooses at
    AUDIT_LENGTHS: the launches' own."""
    seen = set()
    name = kernel.partition(":")[2]
    for n in AUDIT_LENGTHS:
        p = plan_fn(1, n)
        key = (int(p.BLOCK_SIZE), int(p.num_warps))
        if key in seen:
            continue
        seen.add(key)
        yield triton_build(
            family,
            f"{name}-block{key[0]}-warps{key[1]}",
            kernel,
            signature,
            {"BLOCK_SIZE": key[0]},
            num_warps=key[1],
            declared=declared,
            index_bits=32,
        )
