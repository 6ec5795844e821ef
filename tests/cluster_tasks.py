"""Tasks that the cluster tests send by name (obligations.cluster.run_tasks): importable by a Dask worker."""

from __future__ import annotations

import os
import time


def pid_after(seconds: float) -> int:
    """The process that ran the task, after ``seconds`` of work."""
    time.sleep(seconds)
    return os.getpid()


def planted_failure(what: str) -> str:
    """Raise on the request ``"fail"``; echo any other."""
    if what == "fail":
        raise ValueError("planted: this part fails")
    return what
