"""The worker side of ``kc check --cluster``: a Dask task runs one item through the run's executor.

A module of its own, named by string from :mod:`obligations.cluster` (as ``python -m obligations.worker`` is
started by name), so that the run side never imports the checker that its workers run.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from functools import partial
from typing import Any

from obligations.isolation import QUIET_METHODS, Executor, error_fields, make_executor, worker_contract

__all__ = ["run_on_worker", "stop_items", "sweep_part", "audit_part", "dask_setup", "dask_teardown"]

_contracts: dict[tuple[str, str], Any] = {}  # the contracts this worker process has loaded (worker_contract)
# This Dask worker's kc worker processes (or in-process executors), idle ones by (isolation, settings, kc
# environment): an item takes one (a thread runs one item at a time: no process is shared) and gives it back.
_idle: dict[tuple[Any, ...], list[Executor]] = {}
_busy: list[Executor] = []
# kc worker processes started with this Dask worker (dask_setup), each with the kc environment it was started in:
# an item with no idle executor takes one started in the environment its request carries.
_spares: list[tuple[dict[str, str], Executor]] = []
_lock = threading.Lock()  # guards _idle, _busy and _spares


def _kc_environment() -> dict[str, str]:
    from obligations.cluster import ENV_PREFIX

    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}


def dask_setup(worker: Any) -> None:
    """Dask preload of the workers of a local cluster: start one kc worker process per thread at once, so that their
    imports overlap the cluster's opening and the run's loading instead of each thread's first item: the items of a
    2 x H200 check began 2.5 s after the cluster was open, each thread starting its process (2026-11-27). They do
    not import the measure items' peers (torch, cupyx) before they are ready: 30 processes of a 2 x H100 cluster
    doing so began the first item 4.4 s into the run, against 1.2 s on one GPU (2026-11-28); by the measure items,
    sent last, most have imported them for items of their own, and a measure item takes the warmest of those."""
    state = getattr(worker, "state", worker)
    threads = int(getattr(state, "nthreads", 1) or 1)
    cuda = float((getattr(state, "total_resources", None) or {}).get("GPU", 0)) > 0
    settings = {"device": "cuda" if cuda else "host", "profile": "quick", "seed": 0}  # a request sets its own
    env = _kc_environment()
    for _ in range(threads):
        executor = make_executor("process", None, settings)  # a process takes its record fields from requests
        try:
            executor.prestart()
        except Exception:  # a spare is an optimisation: an item starts its own process
            executor.close()
            return
        with _lock:
            _spares.append((env, executor))
    # What run_on_worker needs, imported beside the processes' own start rather than before it: the worker joins the
    # cluster at once (its first task, if one comes first, waits on the import lock), and the processes started
    # above import their own meanwhile (2 x H200: the preload with this import first held the opening 3.3 s).
    threading.Thread(target=importlib.import_module, args=("obligations.check",), daemon=True).start()


def dask_teardown(worker: Any) -> None:
    """Stop this worker's kc processes (its spares too) as the Dask worker closes."""
    stop_items()


def _has_peers(executor: Executor) -> bool:
    """Whether ``executor``'s process has imported the measure items' peers (its preload or an item of its own)."""
    from falsification.measure import PEER_LIBRARIES

    return set(PEER_LIBRARIES) <= set(getattr(executor, "imported", ()))


def _pick(executors: list[Any], measure: bool) -> int | None:
    """The index of the executor an item takes from ``executors`` (None from an empty list): a measure item the
    warmest one with the peers imported (a fresh process pays its CUDA context, handles and kernel loads inside
    the item: ATT-PERF-fwd32 took 1.9 s against 0.1 on a 2 x H100 cluster, 2026-11-28), any other item the first."""
    if not executors:
        return None
    if not measure:
        return 0
    return max(range(len(executors)), key=lambda n: (_has_peers(executors[n]), getattr(executors[n], "items", 0)))


def _take(key: tuple[Any, ...], settings: dict[str, Any], isolate: str, env: dict[str, str], measure: bool) -> Executor:
    """An executor for one item: an idle one of ``key``, else a spare started in ``env``, else a new one."""
    from obligations.check import item_fields

    with _lock:
        idle = _idle.get(key, [])
        n = _pick(idle, measure)
        executor = idle.pop(n) if n is not None else None
        if executor is None and isolate == "process":
            matching = [k for k, (spare_env, _) in enumerate(_spares) if spare_env == env]
            n = _pick([_spares[k][1] for k in matching], measure)
            if n is not None:
                executor = _spares.pop(matching[n])[1]
                executor.settings = dict(settings)  # the process takes its settings with each request
                executor.fields = partial(item_fields, **settings)
        if executor is not None:
            _busy.append(executor)
            return executor
    executor = make_executor(isolate, partial(item_fields, **settings), settings)
    if settings["device"] == "cuda" and measure:
        # As the run's own executor on one GPU: a measure item's peers' libraries (torch, cupyx) are imported
        # before its process is ready, not in its timed item's set-up (FALSIFY-CUBLAS-010 took 2.5 s on a
        # 2 x H200 cluster against 0.16 s on one GPU, 2026-11-27)
        from falsification.measure import PEER_LIBRARIES

        executor.prestart(preload=PEER_LIBRARIES)
    with _lock:
        _busy.append(executor)
    return executor


def _give_back(key: tuple[Any, ...], executor: Executor) -> None:
    """``executor`` is idle again (unless :func:`stop_items` closed it meanwhile)."""
    with _lock:
        if executor in _busy:  # else stop_items closed it meanwhile
            _busy.remove(executor)
            _idle.setdefault(key, []).append(executor)


def _who() -> str:
    try:
        from distributed import get_worker

        w = get_worker()
        return f"{w.name} ({w.address})" if w.name is not None and str(w.name) != w.address else str(w.address)
    except Exception:  # not in a Dask worker: the run's own lane (run_tasks(here=True)), or a direct call
        return f"run (pid {os.getpid()})"


def run_on_worker(request: dict[str, Any]) -> dict[str, Any]:
    """Run one item where this task landed: its record fields, seconds, the worker's name and wall times."""
    begin = time.time()
    os.environ.update(request.get("env") or {})  # the run's kc settings (proof cache, z3 stability)
    # Items in kc worker processes import the contract's test modules there: this process, whose threads share one
    # GIL, only hands them on (importing them here held a 2 x H100 cluster's first items ~1.4 s, 2026-11-28).
    contract = worker_contract(_contracts, request, tests=request["isolate"] == "none")
    if contract.sha256 != request["sha256"]:
        fields = error_fields(f"{request['path']} on worker {_who()} is not the file the run checks (sha256 differs)")
        return {"fields": fields, "seconds": 0.0, "worker": _who(), "start": begin, "end": time.time()}
    settings = {k: request[k] for k in ("device", "profile", "seed")}
    # As the run's prefetch workers: a kc worker process (hard limits, replaced after a crash or a broken CUDA
    # context) unless the run asked for none; then the limit is the engines' own deadline (not the main thread).
    isolate = "none" if request["isolate"] == "none" else "process"
    key = (isolate, tuple(sorted(settings.items())), tuple(sorted(request["env"].items())))
    item = contract.item(request["item"])
    executor = _take(key, settings, isolate, request["env"], item.get("method") in QUIET_METHODS)
    start = time.time()
    t0 = time.perf_counter()
    try:
        fields = executor.run(contract, item, request["limit"], request["witnesses"])
        seconds = round(executor.seconds(time.perf_counter() - t0), 4)
        ready = _ready_since(executor, t0)
    finally:
        _give_back(key, executor)
    answer = {"fields": fields, "seconds": seconds, "worker": _who(), "start": start, "end": time.time()}
    if ready is not None:  # the item waited for its kc process to start: the timeline shows the wait apart
        answer["ready"] = answer["end"] - (time.perf_counter() - ready)
    return answer


def _ready_since(executor: Executor, t0: float) -> float | None:
    """When (perf_counter) ``executor``'s kc process became ready, if that was after ``t0``; else None."""
    starts = getattr(executor, "starts", None) or []
    ready = starts[-1][1] if starts else None
    return ready if ready is not None and ready > t0 else None


def stop_items() -> None:
    """Stop the kc worker processes running items here (the run that sent them stopped), and the spares."""
    with _lock:
        executors = [*_busy, *(e for idle in _idle.values() for e in idle), *(e for _, e in _spares)]
        _busy.clear()
        _idle.clear()
        _spares.clear()
    for executor in executors:
        executor.close()


def sweep_part(request: dict[str, Any]) -> dict[str, Any]:
    """One part of ``kc sweep --cluster``: falsification.sweep.sweep over the request's range, on this worker."""
    from falsification.sweep import sweep

    if request.get("device") == "cuda":
        from obligations.core.device import use_plain_reductions

        use_plain_reductions()
    args = dict(request)
    return sweep(args.pop("op"), args.pop("env", None), **args)


def audit_part(request: dict[str, Any]) -> dict[str, Any]:
    """One cell of ``kc audit-libm --cluster``'s function x environment matrix, on this worker's GPU (on a stream
    of its own: the cells that share the GPU neither wait for each other's kernels nor time them)."""
    import cupy

    from falsification.libm_tests import audit_function

    start = time.time()
    with cupy.cuda.Stream(non_blocking=True):
        audit = audit_function(request["function"], request["env"], request["tolerance"])
    # the run's timeline: where and when, and when this worker's process began (its start before its first cell)
    ran = {"worker": _who(), "start": start, "end": time.time(), "process": _process_began()}
    return {**audit, "ran": ran}


def _process_began() -> float | None:
    """When this process was created (wall seconds), or None where that cannot be read."""
    try:
        import psutil  # distributed's own requirement

        return float(psutil.Process().create_time())
    except Exception:  # the timeline is a view: no start shown
        return None
