"""The worker process of ``kc check -j N`` / ``--isolate process`` (``python -m obligations.worker``).

It serves item requests (:func:`obligations.isolation.worker_request`) on stdin and answers each on its
original stdout; the run side (pools, time limits, replacement after a crash) is ``obligations.isolation``.
A module of its own so that the run side never imports the checker that the worker runs.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from obligations.core import cancel
from obligations.isolation import (
    NICE_ENV,
    PRELOAD_ENV,
    QUIET_METHODS,
    cpu_seconds,
    error_fields,
    seed_witnesses,
    timeout_record,
    worker_contract,
)

__all__: list[str] = []

PROFILE_ENV = "KC_PROFILE_DIR"


def _release_device_memory() -> None:
    """Give the item's cached device and pinned blocks back: many workers share one GPU's memory."""
    if "cupy" not in sys.modules:
        return
    import cupy

    with contextlib.suppress(Exception):  # a broken context is _cuda_healthy's to report
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()


def _cuda_healthy(device: str) -> tuple[bool, str]:
    if device != "cuda" or "cupy" not in sys.modules:
        return True, ""
    try:
        import cupy

        cupy.cuda.runtime.deviceSynchronize()  # a sticky error (illegal address) raises here, every time
        return True, ""
    except Exception as e:  # any failure to synchronise: the context is gone for this process
        return False, f"{type(e).__name__}: {e}"


def _worker() -> int:
    """Serve item requests on stdin; answer each on the original stdout (the item's prints go to stderr)."""
    import obligations.check  # noqa: F401  (imported before "ready": not the first item's time)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    with contextlib.suppress(ValueError, OSError):  # the CPU priority the run gives up for its sanitizer plan
        os.nice(int(os.environ.get(NICE_ENV) or 0))
    _exit_with_parent()
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    contracts: dict[tuple[str, str], Any] = {}
    from falsification.registry import load_builtin_tests

    load_builtin_tests()  # what the first falsify item would import (Hypothesis, the test modules): not its time
    run_wait = _apply_run_wait()
    for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
        with contextlib.suppress(ImportError):  # an absent library: the item that needs it says so
            importlib.import_module(name)
    try:
        # "at": the timeline's worker start; "imported": the measure items' peers its preload brought in
        answers.write(json.dumps({"ready": True, "at": time.time(), "imported": _peers_imported()}) + "\n")
        answers.flush()
        _serve(answers, contracts, run_wait)
    except BrokenPipeError:  # the run went away (killed): nobody is left to answer
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), answers.fileno())
    return 0


def _exit_with_parent() -> None:
    """End this worker when the run that started it is gone (killed with SIGKILL: nothing stopped us)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="kc-parent-watch", daemon=True).start()


@contextlib.contextmanager
def _profiled(contract_id: str, item_id: str) -> Iterator[None]:
    """cProfile the item into ``$KC_PROFILE_DIR/<contract>__<item>.prof`` when that variable is set (developers:
    where a run's CPU goes, summed over its workers with ``pstats.Stats(*files)``)."""
    where = os.environ.get(PROFILE_ENV)
    if not where:
        yield
        return
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        os.makedirs(where, exist_ok=True)
        prof.dump_stats(os.path.join(where, f"{contract_id}__{item_id}.prof"))


def _peers_imported() -> list[str]:
    """The measure items' peers this process has imported (its preload or an item): a run places those items here."""
    from falsification.measure import PEER_LIBRARIES

    return [name for name in PEER_LIBRARIES if name in sys.modules]


def _apply_run_wait() -> str | None:
    """Set this process's CUDA wait from the run's environment (native.cuda_driver); the wait set, or None."""
    from native.cuda_driver import set_wait, wait_from_env

    mode = wait_from_env()
    if mode is None:
        return None
    why = set_wait(mode)
    if why is not None:  # no driver or no GPU (a host run): the items that need one say so
        return None
    return mode


@contextlib.contextmanager
def _item_wait(method: str, run_wait: str | None) -> Iterator[None]:
    """A measure item waits for its GPU by spinning (no wake-up latency in what it times); the run's wait after."""
    from native.cuda_driver import MEASURE_WAIT, set_wait

    switch = run_wait is not None and run_wait != MEASURE_WAIT and method in QUIET_METHODS
    if switch:
        set_wait(MEASURE_WAIT)
    try:
        yield
    finally:
        if switch:
            set_wait(run_wait)


def _serve(answers: Any, contracts: dict[tuple[str, str], Any], run_wait: str | None = None) -> None:
    from obligations.check import item_fields, item_method

    for line in sys.stdin:
        req = json.loads(line)
        contract = worker_contract(contracts, req)
        answers.write(json.dumps({"loaded": True}) + "\n")  # the item's time limit starts here
        answers.flush()
        if contract.sha256 != req["sha256"]:
            fields = error_fields(f"{req['path']} changed during the run")
        else:
            seed_witnesses(contract, req.get("witnesses") or {})
            limit = req.get("limit")
            cpu0 = cpu_seconds()
            try:
                item = contract.item(req["item"])
                with (
                    cancel.item_deadline(limit),
                    _profiled(contract.id, req["item"]),
                    _item_wait(item_method(item), run_wait),
                ):
                    fields = item_fields(
                        contract,
                        item,
                        device=req["device"],
                        profile=req["profile"],
                        seed=req["seed"],
                    )
                # CPU against wall (the item's ``seconds``): did the item compute or wait (GPU, lock, a peer)?
                fields["cpu_seconds"] = round(cpu_seconds() - cpu0, 3)
            except cancel.DeadlinePassed:
                fields = timeout_record(limit or 0, "stopped in the worker process")
        _release_device_memory()
        healthy, why = _cuda_healthy(req["device"])
        answer = {"fields": fields, "healthy": healthy, "why": why, "imported": _peers_imported()}
        answers.write(json.dumps(answer, default=str) + "\n")
        answers.flush()


if __name__ == "__main__":
    sys.exit(_worker())
