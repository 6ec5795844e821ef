"""The worker side of ``kc check --cluster``: a Dask task runs one item through the run's executor.

A module of its own, named by string from :mod:`obligations.cluster` (as ``python -m obligations.worker`` is
started by name), so that the run side never imports the checker that its workers run.
"""

from __future__ import annotations

import os
import threading
import time
from functools import partial
from typing import Any

from obligations.isolation import Executor, error_fields, make_executor, worker_contract

__all__ = ["run_on_worker", "stop_items", "sweep_part", "audit_part", "dask_setup", "dask_teardown"]

_contracts: dict[tuple[str, str], Any] = {}  # the contracts this worker process has loaded (worker_contract)
_executors: dict[tuple[Any, ...], Executor] = {}  # per thread, settings and environment: a kc process is not shared
# kc worker processes started with this Dask worker (dask_setup), each with the kc environment it was started in:
# a thread's first item takes one started in the environment its request carries instead of starting its own.
_spares: list[tuple[dict[str, str], Executor]] = []
_spares_lock = threading.Lock()


def _kc_environment() -> dict[str, str]:
    from obligations.cluster import ENV_PREFIX

    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}


def dask_setup(worker: Any) -> None:
    """Dask preload of the workers of a local cluster: start one kc worker process per thread at once (on a GPU
    worker importing the peers' libraries, as the run's own executor on one GPU does), so that their imports
    overlap the cluster's opening and the run's loading instead of each thread's first item: the items of a
    2 x H200 check began 2.5 s after the cluster was open, each thread starting its process (2026-11-27)."""
    state = getattr(worker, "state", worker)
    threads = int(getattr(state, "nthreads", 1) or 1)
    cuda = float((getattr(state, "total_resources", None) or {}).get("GPU", 0)) > 0
    settings = {"device": "cuda" if cuda else "host", "profile": "quick", "seed": 0}  # a request sets its own
    env = _kc_environment()
    preload: tuple[str, ...] = ()
    if cuda:
        from falsification.measure import PEER_LIBRARIES

        preload = PEER_LIBRARIES
    for _ in range(threads):
        executor = make_executor("process", None, settings)  # a process takes its record fields from requests
        try:
            executor.prestart(preload=preload)
        except Exception:  # a spare is an optimisation: the thread starts its own process at its first item
            executor.close()
            return
        with _spares_lock:
            _spares.append((env, executor))


def dask_teardown(worker: Any) -> None:
    """Stop this worker's kc processes (its spares too) as the Dask worker closes."""
    stop_items()


def _spare(settings: dict[str, Any], env: dict[str, str]) -> Executor | None:
    """A kc worker process started with this worker in ``env`` (now running ``settings``), or None."""
    from obligations.check import item_fields

    with _spares_lock:
        n = next((n for n, (spare_env, _) in enumerate(_spares) if spare_env == env), None)
        if n is None:
            return None
        executor = _spares.pop(n)[1]
    executor.settings = dict(settings)  # the process takes its settings with each request
    executor.fields = partial(item_fields, **settings)
    return executor


def _who() -> str:
    try:
        from distributed import get_worker

        w = get_worker()
        return f"{w.name} ({w.address})" if w.name is not None and str(w.name) != w.address else str(w.address)
    except Exception:  # not in a Dask worker (a direct call)
        return f"pid {os.getpid()}"


def run_on_worker(request: dict[str, Any]) -> dict[str, Any]:
    """Run one item where this task landed: its record fields, seconds, the worker's name and wall times."""
    from obligations.check import item_fields

    begin = time.time()
    os.environ.update(request.get("env") or {})  # the run's kc settings (proof cache, z3 stability)
    contract = worker_contract(_contracts, request)
    if contract.sha256 != request["sha256"]:
        fields = error_fields(f"{request['path']} on worker {_who()} is not the file the run checks (sha256 differs)")
        return {"fields": fields, "seconds": 0.0, "worker": _who(), "start": begin, "end": time.time()}
    settings = {k: request[k] for k in ("device", "profile", "seed")}
    # As the run's prefetch workers: a kc worker process (hard limits, replaced after a crash or a broken CUDA
    # context) unless the run asked for none; then the limit is the engines' own deadline (not the main thread).
    isolate = "none" if request["isolate"] == "none" else "process"
    key = (threading.get_ident(), isolate, tuple(sorted(settings.items())), tuple(sorted(request["env"].items())))
    executor = _executors.get(key)
    if executor is None and isolate == "process":
        executor = _spare(settings, request["env"])
        if executor is not None:
            _executors[key] = executor
    if executor is None:
        executor = _executors[key] = make_executor(isolate, partial(item_fields, **settings), settings)
        if settings["device"] == "cuda":
            # As the run's own executor on one GPU: any process of a GPU worker may be given a measure item, whose
            # peers' libraries (torch, cupyx) a fresh process would import inside its timed item's set-up
            # (FALSIFY-CUBLAS-010 took 2.5 s on a 2 x H200 cluster against 0.16 s on one GPU, 2026-11-27).
            from falsification.measure import PEER_LIBRARIES

            executor.prestart(preload=PEER_LIBRARIES)
    start = time.time()
    t0 = time.perf_counter()
    fields = executor.run(contract, contract.item(request["item"]), request["limit"], request["witnesses"])
    seconds = round(executor.seconds(time.perf_counter() - t0), 4)
    answer = {"fields": fields, "seconds": seconds, "worker": _who(), "start": start, "end": time.time()}
    ready = _ready_since(executor, t0)
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
    for executor in list(_executors.values()):
        executor.close()
    _executors.clear()
    with _spares_lock:
        spares = [executor for _, executor in _spares]
        _spares.clear()
    for executor in spares:
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

    with cupy.cuda.Stream(non_blocking=True):
        return audit_function(request["function"], request["env"], request["tolerance"])
