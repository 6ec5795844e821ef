"""Deliberately wrong transfer plans: each one must be caught by the obligation meant to catch it."""

from __future__ import annotations

import dataclasses
from typing import Any

from native import transfer
from obligations.core.symbolic import as_type

__all__ = ["plan_int32_bytes"]


def plan_int32_bytes(n_elems: Any, src_bytes: Any, dst_bytes: Any) -> Any:
    """BUG: the source byte count computed in int32 (a 2^28-element float64 buffer already overflows it)."""
    plan = transfer.transfer_plan(n_elems, src_bytes, dst_bytes)
    return dataclasses.replace(plan, src_nbytes=as_type(n_elems, "int32") * as_type(src_bytes, "int32"))
