"""Kinds of kernel a contract may name besides its Python entry point: a role key in the kernel's mapping.

A kind (``triton``: a ``@triton.jit`` function) registers what its role must name, whether it can run here
(its toolchain installed) and what validation checks against the kernel's plan. The engines ask
:func:`unavailable` before they run an item on a kernel of that kind: an item that cannot run here is
``skipped`` with the kind's reason, never passed. Kinds register from the modules named in :data:`KIND_MODULES`
(imported on first use: they import no toolchain until one is asked for).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["KernelKind", "KIND_MODULES", "register_kind", "kinds", "unavailable"]

KIND_MODULES: tuple[str, ...] = ("native.tritonrt",)


@dataclass(frozen=True)
class KernelKind:
    """A kernel role: the object it names (``accepts``), why it cannot run here (None: it can), and the problems of
    that object against the kernel's plan quantities (``problems(obj, plan_quantity_names)``)."""

    name: str
    what: str
    accepts: Callable[[Any], bool]
    unavailable: Callable[[], str | None]
    problems: Callable[[Any, set[str] | None], list[str]]


_KINDS: dict[str, KernelKind] = {}


def register_kind(kind: KernelKind) -> KernelKind:
    """Add a kernel kind by name (its role key; names are unique)."""
    if kind.name in _KINDS and _KINDS[kind.name] != kind:
        raise ValueError(f"kernel kind {kind.name!r} registered twice")
    _KINDS[kind.name] = kind
    return kind


def kinds() -> dict[str, KernelKind]:
    """Every registered kind by name (the plug-in modules imported first)."""
    for module in KIND_MODULES:
        importlib.import_module(module)
    return dict(_KINDS)


def unavailable(kernel: Mapping[str, Any] | None) -> str | None:
    """Why a contract kernel (its mapping) cannot run here: the first of its kinds that cannot, else None."""
    if not kernel:
        return None
    for name, kind in kinds().items():
        if name in kernel and (why := kind.unavailable()):
            return why
    return None
