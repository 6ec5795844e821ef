"""Cooperative stopping: the item's deadline and the run's stop request, seen by every engine.

One place both sides meet: the run loop (``obligations.check``, ``obligations.isolation``) sets an item's
deadline and requests a stop on a signal; the engines read :func:`remaining` to size their own budgets
(Z3's timeout), call :func:`checkpoint` in long loops, and register a way to abort native work in flight
(Z3's ``Context.interrupt``) with :func:`on_stop`. A signal handler cannot stop a C call that holds the
main thread; a callback registered here can.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

__all__ = [
    "StopRequested",
    "DeadlinePassed",
    "item_deadline",
    "remaining",
    "request_stop",
    "stop_requested",
    "clear_stop",
    "on_stop",
    "checkpoint",
]


class StopRequested(BaseException):
    """The run was asked to stop (SIGINT/SIGTERM): never an item's outcome (BaseException: engines let it pass)."""

    def __init__(self, reason: str = "stop requested"):
        super().__init__(reason)
        self.reason = reason


class DeadlinePassed(BaseException):
    """The item ran past its time limit (raised by :func:`checkpoint`; the run loop records the timeout)."""


_local = threading.local()
_lock = threading.Lock()
_stop_reason: str | None = None
_callbacks: dict[int, Callable[[], None]] = {}
_next_id = 0


@contextlib.contextmanager
def item_deadline(seconds: float | None) -> Iterator[None]:
    """Within the block, this thread's item must end ``seconds`` from now (None: no limit)."""
    old = getattr(_local, "deadline", None)
    _local.deadline = None if not seconds else time.monotonic() + seconds
    try:
        yield
    finally:
        _local.deadline = old


def remaining() -> float | None:
    """Seconds left before this thread's item deadline (never negative), or None without a deadline."""
    deadline = getattr(_local, "deadline", None)
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def request_stop(reason: str) -> None:
    """Ask the whole run to stop: every registered callback is called once (safe from a signal handler)."""
    global _stop_reason
    with _lock:
        if _stop_reason is None:
            _stop_reason = reason
        callbacks = list(_callbacks.values())
    for cb in callbacks:
        with contextlib.suppress(Exception):  # a callback of work that just ended must not stop the others
            cb()


def stop_requested() -> str | None:
    """The reason the run was asked to stop, or None."""
    return _stop_reason


def clear_stop() -> None:
    """Forget a stop request (a new run in the same process, and tests)."""
    global _stop_reason
    with _lock:
        _stop_reason = None


@contextlib.contextmanager
def on_stop(callback: Callable[[], None]) -> Iterator[None]:
    """Within the block, a stop request also calls ``callback`` (e.g. to interrupt a solver in flight)."""
    global _next_id
    with _lock:
        key, _next_id = _next_id, _next_id + 1
        _callbacks[key] = callback
        already = _stop_reason
    try:
        if already is not None:
            callback()
        yield
    finally:
        with _lock:
            _callbacks.pop(key, None)


def checkpoint() -> None:
    """Raise StopRequested if the run is stopping, DeadlinePassed if this thread's item is out of time."""
    if _stop_reason is not None:
        raise StopRequested(_stop_reason)
    left = remaining()
    if left is not None and left <= 0:
        raise DeadlinePassed()
