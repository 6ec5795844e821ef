"""How native code ran while a check ran (a GPU, Triton's interpreter on the host), noted for the check's evidence.

Native code calls :func:`note` when how it executed is part of what a result means: a Triton kernel checked on a
CPU ran through Triton's interpreter (NumPy), not the compiled GPU code, and its evidence must say so. The
falsification engine collects the notes made while an item runs (:func:`noting`) into the item's evidence.
Outside a collection a note costs one context-variable lookup.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["note", "noting"]

_NOTES: contextvars.ContextVar[dict[str, dict[str, Any]] | None] = contextvars.ContextVar("kc_exec_notes", default=None)


def note(what: str, **facts: Any) -> None:
    """Record that ``what`` (e.g. "triton") ran with ``facts`` (mode, version, ...), counting the calls."""
    notes = _NOTES.get()
    if notes is None:
        return
    entry = notes.setdefault(what, {**facts, "calls": 0})
    entry.update(facts)
    entry["calls"] += 1


@contextmanager
def noting() -> Iterator[dict[str, dict[str, Any]]]:
    """Collect the notes made inside the block (a nested collection also reports to the outer one)."""
    outer = _NOTES.get()
    notes: dict[str, dict[str, Any]] = {}
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)
        if outer is not None:
            for what, entry in notes.items():
                merged = outer.setdefault(what, {**entry, "calls": 0})
                merged["calls"] += entry["calls"]
