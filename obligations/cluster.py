"""Running a check's items on a Dask cluster: a local one (one worker per GPU, or N CPU workers) or a scheduler's.

``kc check --cluster local[:N]`` starts a local cluster; ``--cluster tcp://HOST:PORT`` uses a running scheduler
(``dask scheduler`` + one ``dask worker --resources GPU=1`` per GPU, docs/scale-out.md). :class:`ClusterRunner`
has the run-ahead interface of :class:`obligations.isolation.Prefetcher` (submit, publish, take, close), so the
in-order run of :func:`obligations.check.check_contract` is the same on every executor: records are taken in the
contract's order (the log has each as it lands), an item naming a regimes item's witnesses is sent only once that
record is in, and each thread of a Dask worker runs its items through the run's own executor (a kc worker
process replaced after a timeout, a crash or a broken CUDA context; in the Dask worker with ``--isolate none``).
On a cuda run a measure item holds its worker's whole ``GPU`` resource, so nothing else runs on that GPU while
it times; every other device item holds a share (:data:`GPU_SHARE`), host-only items none. Measure items are
sent last, once every other item has landed (:meth:`ClusterRunner.seal`), as on one machine: the workers' kc
processes have imported and compiled what they share by then (sent first, on 2 H100s each measure item paid a
fresh process's start-up, 23 s for what one warm process times in 13 s, while the GPU-share items waited). A Dask
worker that dies takes only the items it was running: each is sent once more (to the worker that replaces it, or
another), then recorded as ``error`` (worker lost) with both workers' names. Dask is an
optional dependency (``pip install kernel-contracts[scale]``); nothing here imports it before a cluster is
asked for.
"""

from __future__ import annotations

import contextlib
import heapq
import importlib
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from falsification.measure import Shared, share_key
from obligations.core import cancel
from obligations.isolation import (
    HOST_METHODS,
    QUIET_METHODS,
    Key,
    error_fields,
    item_key,
    known_witnesses,
    worker_request,
)

__all__ = [
    "OpeningCluster",
    "ClusterSpec",
    "ClusterError",
    "parse_cluster",
    "dask_missing",
    "visible_gpus",
    "open_cluster",
    "ClusterRunner",
    "run_tasks",
    "gpu_slots",
    "GPU_SHARE",
    "SWEEP_PART",
    "AUDIT_PART",
    "AUDIT_SHARE",
    "AUDIT_LAYOUT",
    "WorkerLayout",
    "CHECK_LAYOUT",
    "WORKER_LOST",
]

# The reason of an item whose Dask worker died under it twice (first words: what reports and tests look for).
WORKER_LOST = "worker lost"

# The part of a worker's GPU (resource GPU=1) that a device item other than a measure item holds: up to 16 share a
# GPU (a binary fraction: the worker's sums stay exact); a measure item holds all of it, so it times alone.
GPU_SHARE = 1 / 16

# The timeline's name of a kc process's start that an item waited for (as -j's worker lanes show theirs)
START_WORKER: Key = ("", "", "start worker")

# How many times an item is sent after its worker died under it (the "retried once on another worker").
RETRIES = 1


class ClusterError(Exception):
    """A cluster that cannot be used: Dask missing, a scheduler that does not answer, a bad --cluster value."""


@dataclass(frozen=True)
class ClusterSpec:
    """A parsed ``--cluster`` value: ``local`` (``workers`` None: one per GPU, or cores - 1) or a scheduler address."""

    kind: str  # "local" or "scheduler"
    workers: int | None = None
    address: str | None = None

    def __str__(self) -> str:
        if self.kind == "local":
            return "local" if self.workers is None else f"local:{self.workers}"
        return str(self.address)


_ADDRESS = re.compile(r"^(tcp|tls|ucx|inproc)://[^\s/]+$")


def parse_cluster(text: str) -> ClusterSpec:
    """``local``, ``local:N`` (N >= 1) or ``tcp://HOST:PORT``; ValueError naming what is wrong otherwise."""
    text = text.strip()
    if text == "local":
        return ClusterSpec("local")
    if text.startswith("local:"):
        n = text.partition(":")[2]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"{text!r}: local:N needs a number of workers N >= 1")
        return ClusterSpec("local", workers=int(n))
    if _ADDRESS.match(text):
        return ClusterSpec("scheduler", address=text)
    raise ValueError(f"{text!r} is not local, local:N or a scheduler address (tcp://HOST:PORT)")


def dask_missing() -> str | None:
    """Why Dask cannot be used here (the install command), or None where ``distributed`` is installed (found, not
    imported: the import, 0.4 s, is the opening cluster's, beside the run's own start; a broken install is a
    ClusterError there)."""
    import importlib.util

    if importlib.util.find_spec("distributed") is None:
        return "Dask is not installed (no module named 'distributed'); pip install 'kernel-contracts[scale]'"
    return None


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries (its own setting, else every device)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    from native.cuda_driver import device_count

    # The driver's count, not CuPy's: the thread that opens a cluster would wait on CuPy's import while the run's
    # main thread imports it for the device probe (on 2 x H200 the scheduler started 1.5 s into the opening).
    return [str(n) for n in range(device_count() or 0)]  # no driver or no GPU: none to give a worker


def gpu_slots(gpus: int, cpus: int | None = None) -> int:
    """Items a local cuda cluster's worker runs at once on its GPU: the CPUs (less the run's own) shared by the
    GPUs, at most 15 (``-j``'s default on one GPU: each slot is a kc worker process, ~0.5 GB)."""
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
    return max(1, min(15, (cpus - 1) // max(1, gpus)))


@dataclass(frozen=True)
class WorkerLayout:
    """What a local cluster's workers are for a command: ``spares``: each GPU worker starts its threads' kc worker
    processes (kc check); ``preload``: modules every worker imports as it starts (its tasks' own); ``per_gpu``:
    worker processes per GPU (a power of two), each holding 1/per_gpu of it (resource GPU) with one thread, for
    tasks whose host work holds the GIL (an audit cell's MPFR settlement) beside other tasks' kernels."""

    spares: bool = False
    preload: tuple[str, ...] = ()
    per_gpu: int = 1

    def __post_init__(self) -> None:
        if self.per_gpu < 1 or self.per_gpu & (self.per_gpu - 1):
            raise ValueError(f"per_gpu={self.per_gpu}: a power of two (the workers' GPU shares must sum exactly)")


# kc check's: one worker per GPU whose threads each drive a kc worker process started with the worker
CHECK_LAYOUT = WorkerLayout(spares=True)


def _worker_specs(spec: ClusterSpec, device: str, layout: WorkerLayout = WorkerLayout()) -> dict[str, dict[str, Any]]:
    """Dask worker specs: on cuda ``layout.per_gpu`` per visible GPU (that GPU only; with one, resource GPU=1 and
    :func:`gpu_slots` threads or N with local:N; with several, one thread and GPU=1/per_gpu each), else N CPU
    workers of one thread (local: cores - 1)."""
    from distributed import Nanny

    from obligations.isolation import default_jobs

    base = {"nthreads": 1, "memory_limit": 0, "silence_logs": 40}  # logging.ERROR
    if device == "cuda":
        gpus = visible_gpus()
        if not gpus:
            raise ClusterError("--cluster local on cuda: no visible GPU")
        # A check: each thread drives its own kc worker process (as -j's workers), started with the Dask worker:
        # items overlap on the GPU as on one GPU with -j, the measure items hold the whole GPU (GPU=1) and every
        # other device item a share of it. A sweep's or an audit's parts run in the Dask worker itself.
        modules = [SPARES_PRELOAD, *layout.preload] if layout.spares else list(layout.preload)
        n = layout.per_gpu
        threads = 1 if n > 1 else spec.workers or gpu_slots(len(gpus))
        names = {(g, k): f"gpu{g}" if n == 1 else f"gpu{g}.{k}" for g in gpus for k in range(n)}
        return {
            name: {
                "cls": Nanny,
                "options": {
                    **base,
                    "nthreads": threads,
                    "resources": {"GPU": 1 / n},
                    "env": {"CUDA_VISIBLE_DEVICES": g},
                    "name": name,
                    **({"preload": modules} if modules else {}),
                },
            }
            for (g, _), name in names.items()
        }
    n = spec.workers if spec.workers is not None else default_jobs()
    imports = {"preload": list(layout.preload)} if layout.preload else {}
    return {f"cpu{k}": {"cls": Nanny, "options": {**base, "name": f"cpu{k}", **imports}} for k in range(n)}


# What the fork server of a local cluster imports before it forks the workers, besides the layout's own preload
# (an audit's modules, once for its eight workers): Dask, and the module a check's workers
# preload (its imports are light; the checker it needs is imported in the worker, beside its kc processes' start).
FORKSERVER_PRELOAD = ("distributed", "obligations.cluster_worker")
# CUDA's libraries stay out of the fork server: each worker sets its CUDA_VISIBLE_DEVICES after the fork, and none of
# them may have read it before (each worker imports them itself, as its Dask preload).
_CUDA_LIBRARIES = frozenset({"cupy", "cupyx", "torch", "triton"})


def _start_forkserver(preload: Sequence[str] = ()) -> None:
    """Start the fork server of a local cluster's workers now, importing :data:`FORKSERVER_PRELOAD` and ``preload``
    only (but CUDA's libraries), so that its imports overlap this process's import of Dask.
    Dask's own choice adds pandas and lz4, imported in the server and, first, in this process (the thread that opens
    the cluster, beside the contracts' load): with it the first opening of a 2 x H200 check took 4.4 s against 3.5 s
    by spawning. Where Dask no longer keeps its once-only flag, its own list is used when the server is not running
    yet: slower, not wrong."""
    import multiprocessing
    from multiprocessing import forkserver

    ours = [m for m in preload if m.split(".")[0] not in _CUDA_LIBRARIES]
    multiprocessing.get_context("forkserver").set_forkserver_preload([*FORKSERVER_PRELOAD, *ours])
    forkserver.ensure_running()
    try:
        import distributed.utils
    except ImportError:  # open_cluster says why, next
        return
    if hasattr(distributed.utils, "_forkserver_preload_set"):
        distributed.utils._forkserver_preload_set = True


def open_cluster(
    spec: ClusterSpec, device: str, timeout: float = 30.0, layout: WorkerLayout = WorkerLayout()
) -> tuple[Any, Any]:
    """(Dask client, the local cluster it started or None) for ``spec``; ClusterError when that cannot be;
    ``layout``: what a local cluster's workers are (a scheduler's workers are what their hosts started)."""
    why = dask_missing()
    if why:
        raise ClusterError(why)
    if spec.kind == "local":
        _start_forkserver(layout.preload)
    try:
        from distributed import Client, Scheduler, SpecCluster
    except ImportError as e:
        raise ClusterError(f"Dask does not import ({e}); pip install 'kernel-contracts[scale]'") from None

    cluster = None
    try:
        if spec.kind == "local":
            import dask

            # Worker processes forked from a server that has imported Dask once, not each a fresh interpreter that
            # imports it (2 x H200: 0.13 s against 1.66 s to open two bare workers, once the server is up); each
            # worker still sets its own CUDA_VISIBLE_DEVICES before anything in it starts CUDA (_start_forkserver).
            with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
                cluster = SpecCluster(
                    workers=_worker_specs(spec, device, layout),
                    scheduler={
                        "cls": Scheduler,
                        "options": {"dashboard": False, "dashboard_address": ":0", "port": 0},
                    },
                    silence_logs=40,
                    name="kc",
                )
            client = Client(cluster, timeout=timeout)
        else:
            client = Client(spec.address, timeout=timeout)
        # The scheduler gives up on an item at its first lost worker: the retry on another worker is ours, so
        # that it is one on every cluster (a scheduler's default is three) and the record names the workers.
        client.run_on_scheduler(_no_scheduler_retries)
    except ClusterError:
        if cluster is not None:
            cluster.close()
        raise
    except (OSError, TimeoutError) as e:
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close()
        raise ClusterError(f"cluster {spec}: {type(e).__name__}: {e}") from None
    return client, cluster


class OpeningCluster:
    """A cluster being opened in the background (kc check: while the contracts load, as its workers start on one
    machine); :meth:`take` waits for it, :meth:`close` closes it if nobody took it."""

    def __init__(
        self,
        spec: ClusterSpec,
        device: str,
        timeout: float = 30.0,
        layout: WorkerLayout = WorkerLayout(),
    ) -> None:
        self.spec, self.device, self.layout = spec, device, layout
        self._done = threading.Event()
        self._opened: tuple[Any, Any] | None = None
        self._error: BaseException | None = None
        self._taken = False
        self.began = time.perf_counter()
        self.ended: float | None = None  # when it was open (the run's timeline)
        threading.Thread(target=self._open, args=(timeout,), name="kc-cluster-open", daemon=True).start()

    def _open(self, timeout: float) -> None:
        try:
            self._opened = open_cluster(self.spec, self.device, timeout, self.layout)
        except BaseException as e:  # ClusterError, or a stop: the taker raises it
            self._error = e
        finally:
            self.ended = time.perf_counter()
            self._done.set()

    def take(self) -> tuple[Any, Any]:
        """(client, the local cluster or None), once opened; the error that stopped it, raised here."""
        while not self._done.wait(0.25):  # short waits: a stop signal is handled in the caller's thread
            cancel.checkpoint()
        if self._error is not None:
            raise self._error
        self._taken = True
        assert self._opened is not None
        return self._opened

    def close(self) -> None:
        """Close what was opened, unless a run took it (the run closes it then)."""
        self._done.wait()
        if self._taken or self._opened is None:
            return
        client, cluster = self._opened
        with contextlib.suppress(Exception):
            client.close(timeout=10)
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close(timeout=20)


def _needs_gpus(client: Any, cluster: Any, spec: ClusterSpec, device: str) -> None:
    """On a cuda run, ClusterError (client and local cluster closed) unless a worker declares a GPU resource:
    the run's device items would wait for one for ever."""
    workers = client.scheduler_info().get("workers", {})
    if device != "cuda" or any((w.get("resources") or {}).get("GPU") for w in workers.values()):
        return
    with contextlib.suppress(Exception):
        client.close(timeout=10)
    if cluster is not None:
        with contextlib.suppress(Exception):
            cluster.close(timeout=20)
    raise ClusterError(
        f"{spec}: no worker declares a GPU ({len(workers)} worker(s)); start one per GPU with "
        "dask worker --resources GPU=1 (docs/scale-out.md)"
    )


def _worker_threads(workers: dict[str, Any]) -> dict[str, tuple[int, bool]]:
    """Address -> (threads, whether it has a GPU resource) of the workers in a scheduler_info() listing."""
    return {
        address: (int(w.get("nthreads", 1) or 1), float((w.get("resources") or {}).get("GPU", 0)) > 0)
        for address, w in workers.items()
    }


def _no_scheduler_retries(dask_scheduler: Any) -> None:
    dask_scheduler.allowed_failures = 0


def _call(name: str, *args: Any) -> Any:
    """On a worker: call the function named ``module.function`` (the run side never imports the checker that
    the workers run, as it starts ``python -m obligations.worker`` by name: no import circle through check)."""
    module, _, function = name.rpartition(".")
    return getattr(importlib.import_module(module), function)(*args)


# The worker side's functions (obligations/cluster_worker.py), by name.
RUN_ITEM = "obligations.cluster_worker.run_on_worker"
STOP_ITEMS = "obligations.cluster_worker.stop_items"
SWEEP_PART = "obligations.cluster_worker.sweep_part"
AUDIT_PART = "obligations.cluster_worker.audit_part"
# An audit's local cluster: four worker processes per GPU, each importing the audit's modules as it starts (while
# the run parses), so that a cell's host work (the MPFR settlement, the reference self-check, the kernel's load;
# it holds the GIL) runs beside the other cells' sweeps on the GPU; one process per GPU settled one cell at a time.
AUDIT_LAYOUT = WorkerLayout(preload=("falsification.libm_tests", "native.libm", "cupy"), per_gpu=4)
# What an audit cell holds of a GPU: a quarter (a scheduler's worker of many threads runs four at once there)
AUDIT_SHARE = 1 / AUDIT_LAYOUT.per_gpu
# The Dask preload of a local cluster's workers (its dask_setup starts a kc worker process per thread)
SPARES_PRELOAD = "obligations.cluster_worker"

# Environment variables that carry run settings to the engines (--z3-stability, --no-proof-cache, ...): they
# travel with each item, since a scheduler's workers did not inherit the run's environment.
ENV_PREFIX = "KC_"


# -- the run's side -----------------------------------------------------------------------------------------


@dataclass
class _Slot:
    contract: Any
    item: dict[str, Any]
    limit: float | None
    after: Key | None
    order: int
    attempts: int = 0
    lost: tuple[str, ...] = ()
    future: Any = None
    result: tuple[dict[str, Any], float] | None = None
    worker: str | None = None  # the address the item is in flight on


class ClusterRunner:
    """Runs every item of a check on a Dask cluster; the in-order run takes the records (Prefetcher's interface).

    Unlike :class:`obligations.isolation.Prefetcher`, :meth:`take` waits for every submitted item: on a cluster
    the run's own process runs nothing (it is not a GPU worker).
    """

    def __init__(
        self,
        spec: ClusterSpec,
        settings: dict[str, Any],
        isolate: str,
        method: Callable[[dict[str, Any]], str],
        ran: Callable[[Key, str, float, float], None] | None = None,
        landed: Callable[[Any, dict[str, Any], dict[str, Any], float], None] | None = None,
        opened: OpeningCluster | None = None,
    ):
        self.spec = spec
        self.method = method  # an item's method (obligations.check.item_method): measure, proofs, the rest
        self.settings = dict(settings)
        self.isolate = isolate
        early = opened is not None and opened.spec == spec and opened.device == settings["device"]
        self.client, self.cluster = (
            opened.take() if early else open_cluster(spec, settings["device"], layout=CHECK_LAYOUT)
        )
        _needs_gpus(self.client, self.cluster, spec, settings["device"])
        self._ran = ran
        self._landed_fn = landed  # (contract, item, fields, seconds) of each item that lands with an outcome
        self._clock = time.perf_counter() - time.time()  # the workers' wall times on the run's timeline clock
        self.finished: dict[Key, tuple[dict[str, Any], float]] = {}
        self._slots: dict[Key, _Slot] = {}
        self._published: dict[Key, dict[str, Any]] = {}
        self._waiting: dict[Key, list[Key]] = {}
        self._landed = threading.Condition()
        self._lock = threading.RLock()
        self._order = 0
        self._closed = False
        info = self.client.scheduler_info().get("workers", {})
        self.workers = sorted(info)
        # Each item goes to a worker with a free thread, pinned there (workers=[address], no other): an item waits
        # here, never in a busy worker's queue, so a worker that dies takes only the items it was running with it
        # and no thread idles while another worker holds a backlog. Dask's own choice (by its occupancy estimates)
        # sent everything to one GPU for 5 s of a 2 x H200 run while the other's 14 threads idled beside one long
        # item (2026-11-27). A lost worker is taken off at once; the table is read again from the scheduler.
        self._threads_of = _worker_threads(info)  # address -> (threads, has a GPU)
        self._full = sum(t for t, _ in self._threads_of.values())
        self._busy: dict[str, int] = {}  # address -> items in flight there
        self._timing: set[str] = set()  # addresses running a measure item (it holds the whole GPU)
        self._ready: list[tuple[int, int, Key]] = []  # heap of (-priority, order, key)
        self._held: list[Key] = []  # measure items, sent once every other item has landed and the run is sealed
        self._followers: dict[Key, list[Key]] = {}  # measure items waiting for the same measurement's record
        self._measured = Shared()
        self._sealed = False
        self._recount = threading.Event()
        threading.Thread(target=self._watch_workers, name="kc-cluster-workers", daemon=True).start()

    def _watch_workers(self) -> None:
        while not self._closed:
            with self._lock:
                live = sum(t for t, _ in self._threads_of.values())
                short = live == 0 or live < self._full  # a lost worker not yet replaced, or none joined yet
            self._recount.wait(1.0 if short else 5.0)
            self._recount.clear()
            if self._closed:
                return
            try:
                table = _worker_threads(self.client.scheduler_info().get("workers", {}))
            except Exception:  # the client is closing, or the scheduler is away for a moment: next time
                continue
            with self._lock:
                self._threads_of = table  # a replaced worker comes back under a new address
                self._full = max(self._full, sum(t for t, _ in table.values()))
            self._pump()

    def _pick(self, key: Key) -> str | None:
        """The worker ``key`` goes to now: the live one with the most free threads (a measure item: one not
        timing another; a GPU item: one with a GPU), or None while there is none."""
        slot = self._slots[key]
        method = self.method(slot.item)
        gpu = self.settings["device"] == "cuda" and method not in HOST_METHODS
        free = [
            (threads - self._busy.get(address, 0), address)
            for address, (threads, has_gpu) in self._threads_of.items()
            if (has_gpu or not gpu) and not (method in QUIET_METHODS and address in self._timing)
        ]
        best = max(free, key=lambda fa: (fa[0], -self._busy.get(fa[1], 0), fa[1]), default=None)
        return best[1] if best is not None and best[0] > 0 else None

    @property
    def started(self) -> int:
        """Workers of the cluster when the run began (provenance)."""
        return len(self.workers)

    def submit(self, contract: Any, item: dict[str, Any], limit: float | None, after: Key | None = None) -> None:
        """Send ``item`` to the cluster; ``after``: the regimes item whose record (witnesses) it waits for."""
        key = item_key(contract, item["id"])
        with self._lock:
            self._order += 1
            self._slots[key] = _Slot(contract, item, limit, after, self._order)
            if after is not None and after not in self._published:
                self._waiting.setdefault(after, []).append(key)
                return
        self._send(key)

    def _send(self, key: Key, first: bool = False) -> None:
        """Queue ``key`` to go out when a worker thread is free, in the run's order; a measure item is held until
        every other item has landed; ``first``: before every other (an item sent again after its worker died)."""
        with self._lock:
            slot = self._slots[key]
            if not first and self.method(slot.item) in QUIET_METHODS:
                self._held.append(key)
            else:
                heapq.heappush(self._ready, (-2 if first else 0, slot.order, key))
        self._release()

    def seal(self) -> None:
        """Every item of the run is submitted: the measure items may go once the others have landed."""
        with self._lock:
            self._sealed = True
        self._release()

    def _release(self) -> None:
        """Send the held measure items once the run is sealed and no other item is still to land; then pump."""
        with self._lock:
            if self._held and self._sealed:
                others = (
                    s for s in self._slots.values() if s.result is None and self.method(s.item) not in QUIET_METHODS
                )
                if next(others, None) is None:
                    leaders: dict[str, Key] = {}  # one measurement per share key: the others take its record
                    for key in self._held:
                        same = share_key(self._slots[key].item)
                        if same is not None and same in leaders:
                            self._followers.setdefault(leaders[same], []).append(key)
                            continue
                        if same is not None:
                            leaders[same] = key
                        heapq.heappush(self._ready, (-1, self._slots[key].order, key))
                    self._held.clear()
        self._pump()

    def _pump(self) -> None:
        while True:
            with self._lock:
                if self._closed or not self._ready:
                    return
                key = self._ready[0][2]
                address = self._pick(key)
                if address is None:  # the next item waits for a thread (of a GPU, or a GPU not timing)
                    return
                heapq.heappop(self._ready)
                self._busy[address] = self._busy.get(address, 0) + 1
                if self.method(self._slots[key].item) in QUIET_METHODS:
                    self._timing.add(address)
                self._slots[key].worker = address
            self._dispatch(key, address)

    def _dispatch(self, key: Key, address: str) -> None:
        with self._lock:
            slot = self._slots[key]
            if self._closed:
                return
            witnesses: dict[str, Any] = {}
            if slot.after is not None and slot.after in self._published:
                witnesses = known_witnesses(slot.contract, slot.item, {slot.after[2]: self._published[slot.after]})
            method = self.method(slot.item)
            request = worker_request(self.settings, slot.contract, slot.item, witnesses, slot.limit)
            request["isolate"] = self.isolate
            request["env"] = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
            gpu = self.settings["device"] == "cuda" and method not in HOST_METHODS
            priority = (1 << 20 if method in QUIET_METHODS else 0) - slot.order
            slot.attempts += 1
            slot.future = self.client.submit(
                _call,
                RUN_ITEM,
                request,
                key=f"kc-{slot.item['id']}-{slot.attempts}-{os.urandom(4).hex()}",
                pure=False,
                resources=({"GPU": 1} if method in QUIET_METHODS else {"GPU": GPU_SHARE}) if gpu else None,
                priority=priority,
                workers=[address],
                allow_other_workers=False,
            )
        slot.future.add_done_callback(partial(self._land, key))

    def _land(self, key: Key, future: Any) -> None:
        from distributed.scheduler import KilledWorker

        slot = self._slots[key]
        if future is not slot.future or slot.result is not None:
            return
        with self._lock:
            if slot.worker is not None:  # its thread is free again (a measure item's GPU too)
                self._busy[slot.worker] = max(0, self._busy.get(slot.worker, 0) - 1)
                if self.method(slot.item) in QUIET_METHODS:
                    self._timing.discard(slot.worker)
                slot.worker = None
        answer: dict[str, Any] | None = None
        try:
            answer = future.result()
        except KilledWorker as e:
            last = getattr(e, "last_worker", None)
            who = f"{last.name} ({last.address})" if last is not None else "unknown"
            slot.lost = (*slot.lost, who)
            with self._lock:
                if last is not None:  # gone from the table until the scheduler lists a worker there again
                    self._threads_of.pop(last.address, None)
            self._recount.set()
            if slot.attempts <= RETRIES and not self._closed and cancel.stop_requested() is None:
                self._send(key, first=True)  # once more, on the worker that replaces it or another
                return
            fields = error_fields(
                f"{WORKER_LOST}: the Dask worker running this item died, {len(slot.lost)} time(s) "
                f"(workers: {', '.join(slot.lost)})",
                workers_lost=list(slot.lost),
            )
            seconds = 0.0
        except BaseException as e:  # cancelled by close, or a failure of Dask itself: no outcome of the item
            fields = error_fields(f"the cluster could not run this item: {type(e).__name__}: {e}")
            seconds = 0.0
        if answer is not None:
            fields, seconds = answer["fields"], answer["seconds"]
            if slot.lost:
                fields.setdefault("evidence", {})["workers_lost"] = list(slot.lost)
            if self._ran is not None:
                with contextlib.suppress(Exception):  # the timeline is a view: never a reason to lose the record
                    start, ready = answer["start"] + self._clock, answer.get("ready")
                    if ready is not None:  # it waited for its kc process to start: that wait is not the item's
                        self._ran(START_WORKER, answer["worker"], start, ready + self._clock)
                        start = ready + self._clock
                    self._ran(key, answer["worker"], start, answer["end"] + self._clock)
        slot.future = None
        self._finish(key, fields, seconds, answer is not None or bool(slot.lost))  # else cancelled: no outcome
        self._share(key, fields)

    def _finish(self, key: Key, fields: dict[str, Any], seconds: float, outcome: bool) -> None:
        """``key``'s record is in: the run may take it (if the item had an ``outcome`` and the run goes on), the
        log has it, the items waiting for its witnesses go on (without them if it has none), held items may go."""
        slot = self._slots[key]
        with self._landed:
            slot.result = (fields, seconds)
            outcome = outcome and not self._closed and cancel.stop_requested() is None
            if outcome:
                self.finished[key] = slot.result
            self._landed.notify_all()
        try:
            if outcome and self._landed_fn is not None:
                self._landed_fn(slot.contract, slot.item, fields, seconds)
        except Exception:  # a log that cannot be written here: the in-order run writes the record and says why
            pass
        finally:
            self.publish(key, fields)
            self._release()

    def _share(self, key: Key, fields: dict[str, Any]) -> None:
        """The measure items that make the measurement ``key`` made take its record (falsification.measure.Shared,
        as on one GPU); after an error or a skip each measures its own."""
        with self._lock:
            followers = self._followers.pop(key, [])
        if not followers:
            return
        slot = self._slots[key]
        self._measured.keep(f"{slot.contract.id}:{slot.item['id']}", slot.item, fields)
        for other in followers:
            reused = self._measured.reuse(self._slots[other].item)
            if reused is not None:
                self._finish(other, reused, 0.0, True)
            else:
                with self._lock:
                    heapq.heappush(self._ready, (-1, self._slots[other].order, other))
                self._pump()

    def publish(self, key: Key, fields: dict[str, Any]) -> None:
        """A record is in (run here, landed, or resumed): send the items that wait for its witnesses."""
        with self._lock:
            self._published[key] = fields
            waiting = self._waiting.pop(key, [])
        for k in waiting:
            self._send(k)

    def done(self, key: Key, fields: dict[str, Any], seconds: float) -> None:
        """Hand over a record the run made itself: :meth:`take` returns it."""
        with self._landed:
            self.finished[key] = (fields, seconds)
        self.publish(key, fields)

    def take(self, contract: Any, item: dict[str, Any]) -> tuple[dict[str, Any], float] | None:
        """The (record fields, seconds) of a submitted item, waiting for it; None if it was never submitted."""
        key = item_key(contract, item["id"])
        slot = self._slots.get(key)
        if slot is None:
            return self.finished.get(key)
        with self._landed:
            while slot.result is None and not self._closed:
                self._landed.wait(0.25)  # short waits: a stop signal is handled in this (the main) thread
        return slot.result

    def drain(self) -> None:
        """Wait until every submitted item has landed."""
        for slot in list(self._slots.values()):
            with self._landed:
                while slot.result is None and not self._closed:
                    self._landed.wait(0.25)

    def close(self) -> None:
        """Cancel what is queued or running, stop the workers' kc processes, close the client (and a local
        cluster: no worker is left behind)."""
        with self._lock:
            self._closed = True
            futures = [s.future for s in self._slots.values() if s.future is not None]
        self._recount.set()  # the watcher ends
        with self._landed:
            self._landed.notify_all()
        with contextlib.suppress(Exception):
            self.client.cancel(futures, force=True)
        with contextlib.suppress(Exception):
            self.client.run(_call, STOP_ITEMS, wait=True)
        with contextlib.suppress(Exception):
            self.client.close(timeout=10)
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.close(timeout=20)


class _HereLane:
    """The run's own lane of :func:`run_tasks`: a thread of this process that takes requests from the end of the
    order (the shortest) from before the cluster is open until none is left, on this host's first GPU."""

    def __init__(
        self,
        function: str,
        requests: list[Any],
        pending: deque[int],
        lock: threading.Lock,
        landed: Callable[[int, Any], None],
    ) -> None:
        self.function, self.requests, self.pending, self.lock, self.landed = function, requests, pending, lock, landed
        self.stopping = threading.Event()
        self.error: tuple[int, BaseException] | None = None
        self.thread = threading.Thread(target=self._run, name="kc-here-lane", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set() and cancel.stop_requested() is None:  # a stop: no request started after it
            with self.lock:
                if not self.pending:
                    return
                n = self.pending.pop()
            try:
                self.landed(n, _call(self.function, self.requests[n]))
            except BaseException as e:  # noqa: BLE001 (the run raises it as the part's error)
                self.error = (n, e)
                return

    def stop(self) -> None:
        """Take no more requests; wait for the one in hand (a cell is a second or less)."""
        self.stopping.set()
        self.thread.join(timeout=60)


def run_tasks(
    spec: ClusterSpec | OpeningCluster,
    device: str,
    function: str,
    requests: list[Any] | Callable[[int], list[Any]],
    progress: Callable[[int, int], None] | None = None,
    share: float = 1.0,
    order: Sequence[int] | None = None,
    here: bool = False,
) -> list[Any]:
    """``function(request)`` of each request on the cluster (``spec``, or one the caller began opening), results
    in the requests' order (``requests`` may be a function of the cluster's number of workers). On cuda each task
    holds ``share`` of a worker's GPU (a binary fraction: 1/4 runs four at once there). A task whose worker died is
    sent once more, then the run fails (ClusterError naming the workers): an exhaustive sweep has no partial
    verdict. A stop signal (Ctrl-C, SIGTERM) cancels the tasks and closes a local cluster, then raises;
    ``progress(done, total)`` hears each task that lands; ``order``: the requests' indices in the order they should
    start (longest first: no long task left for the end), else theirs. ``here`` (a list of requests): this process
    runs requests too, from the end of the order, starting before the cluster is open (a local cluster opens in
    ~1.5 s, the first of 74 audit cells could start in 0.7); the cluster then gets them as its workers free up,
    at most two a worker thread ahead, so that what is left stays takeable here."""
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    from obligations.isolation import raising_on_stop, stop_on_signals

    lock = threading.Lock()
    results: list[Any] = []
    done = 0

    def landed(n: int, value: Any) -> None:
        nonlocal done
        with lock:
            results[n] = value
            done += 1
            count = done
        if progress is not None:
            progress(count, len(results))

    pending: deque[int] = deque()

    def queue(count: int) -> None:
        """``count`` requests to run, none landed: the pending indices in their start order."""
        results[:] = [None] * count
        pending.extend(order if order is not None else range(count))

    lane: _HereLane | None = None
    if here and not callable(requests):
        queue(len(requests))
        lane = _HereLane(function, requests, pending, lock, landed)
    client = cluster = None
    futures: list[Any] = []
    try:
        if isinstance(spec, OpeningCluster):
            client, cluster = spec.take()
            spec = spec.spec
        else:
            client, cluster = open_cluster(spec, device)
        _needs_gpus(client, cluster, spec, device)
        if callable(requests):
            requests = requests(max(1, len(client.scheduler_info().get("workers", {}))))
        if lane is None:
            queue(len(requests))
        rank = {n: r for r, n in enumerate(order or ())}
        sent = 0  # requests in flight on the cluster

        def window() -> int:
            """Requests the cluster may hold: all, unless this process takes some too (then two a worker thread,
            counted as they join)."""
            if lane is None:
                return len(requests)
            threads = _worker_threads(client.scheduler_info().get("workers", {}))
            return 2 * max(1, sum(t for t, _ in threads.values()))

        with stop_on_signals(), raising_on_stop():
            resources = {"GPU": share} if device == "cuda" else None

            def send(n: int, attempt: int) -> Any:
                fut = client.submit(
                    _call,
                    function,
                    requests[n],
                    key=f"kc-part-{n}-{attempt}-{os.urandom(4).hex()}",
                    pure=False,
                    resources=resources,
                    priority=-rank.get(n, n),
                )
                index[fut.key] = (n, attempt)
                futures.append(fut)
                return fut

            def fill(waiting: Any) -> None:
                nonlocal sent
                limit = window()
                while sent < limit:
                    with lock:
                        n = pending.popleft() if pending else None
                    if n is None:
                        return
                    waiting.add(send(n, 1))
                    sent += 1

            index: dict[str, tuple[int, int]] = {}
            lost: dict[int, list[str]] = {}
            waiting = as_completed()
            fill(waiting)
            for fut in waiting:
                n, attempt = index[fut.key]
                if fut.status == "error":
                    exc = fut.exception()
                    if not isinstance(exc, KilledWorker):
                        raise ClusterError(f"part {n} of {len(requests)}: {type(exc).__name__}: {exc}")
                    last = getattr(exc, "last_worker", None)
                    lost.setdefault(n, []).append(f"{last.name} ({last.address})" if last is not None else "unknown")
                    if attempt > RETRIES:
                        raise ClusterError(f"part {n}: {WORKER_LOST} ({', '.join(lost[n])})")
                    waiting.add(send(n, attempt + 1))
                    continue
                landed(n, fut.result())
                sent -= 1
                if lane is not None and lane.error is not None:
                    break  # the run fails with the lane's error: nothing more is sent
                fill(waiting)
            if lane is not None:
                lane.thread.join()
                if lane.error is not None:
                    n, exc = lane.error
                    raise ClusterError(f"part {n} of {len(requests)} (here): {type(exc).__name__}: {exc}")
            return results
    finally:
        if lane is not None:
            lane.stop()
        if client is not None:
            with contextlib.suppress(Exception):
                client.cancel(futures, force=True)
            with contextlib.suppress(Exception):
                client.close(timeout=10)
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close(timeout=20)
