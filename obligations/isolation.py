"""Running one item with a time limit: in this process (a SIGALRM timer) or in a replaceable worker process.

A worker process (``python -m obligations.isolation``) runs items one at a time and answers over a pipe.
Past its limit an item's worker is killed and the item is ``error (timeout)``; a worker that dies (a
segfault, ``os._exit``) or whose CUDA context is broken after an item (an illegal address poisons every
later launch) is replaced, so one faulting kernel costs one item and the run goes on.

A :class:`Prefetcher` runs items ahead of the run in ``jobs`` such workers (on CUDA they share the GPU), while
the run goes on in order, taking their records where it reaches them and running itself any item no worker
has started, so the output keeps the contract's order. The items that time the machine
(:data:`QUIET_METHODS`) run first, before any worker starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from native.cuda_driver import WAIT_ENV, wait_from_env
from obligations.core import cancel

__all__ = [
    "ItemTimeout",
    "PROFILE_TIMEOUT_S",
    "PRELOAD_ENV",
    "item_timeout",
    "Executor",
    "InProcess",
    "WorkerPool",
    "worker_request",
    "worker_contract",
    "EXECUTORS",
    "make_executor",
    "timeout_record",
    "error_fields",
    "HOST_METHODS",
    "QUIET_METHODS",
    "SHARED_METHODS",
    "item_key",
    "Prefetcher",
    "RunsAhead",
    "default_jobs",
    "all_cores",
    "THREAD_POOL_VARS",
    "WORKER_WAIT",
    "NICE_ENV",
    "WORKER_NICE",
    "known_witnesses",
    "seed_witnesses",
    "STOP_SIGNALS",
    "cpu_seconds",
    "stop_on_signals",
    "raising_on_stop",
]

# Seconds an item may run before it is stopped, per profile (an item's ``timeout_s`` or --item-timeout win).
PROFILE_TIMEOUT_S: dict[str, float] = {"quick": 300.0, "full": 1200.0, "deep": 1200.0}

RecordFn = Callable[[Any, dict[str, Any]], dict[str, Any]]


class ItemTimeout(BaseException):
    """Raised inside an in-process item when its time limit passes (BaseException: engines must not catch it)."""


def item_timeout(item: dict[str, Any], profile: str, override: float | None = None) -> float | None:
    """The item's limit in seconds: ``--item-timeout``, else the item's ``timeout_s``, else the profile's."""
    if override is not None:
        return override if override > 0 else None
    if item.get("timeout_s") is not None:
        return float(item["timeout_s"])
    return PROFILE_TIMEOUT_S.get(profile)


def error_fields(reason: str, **evidence: Any) -> dict[str, Any]:
    """The record fields of an item the run could not run to an outcome (no claim, no entry point reached)."""
    return {
        "status": "error",
        "claim": "none",
        "evidence": {"kind": "none", **evidence},
        "counterexample": None,
        "entry_points": [],
        "reason": reason,
    }


def timeout_record(seconds: float, how: str) -> dict[str, Any]:
    """The outcome fields of an item stopped at its limit."""
    return error_fields(f"timeout: the item ran past its limit of {seconds:g} s ({how})", timeout_s=seconds)


@contextlib.contextmanager
def _alarm(seconds: float | None) -> Iterator[None]:
    usable = seconds and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def fire(_signum: int, _frame: Any) -> None:
        raise ItemTimeout(seconds)

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# The signals that stop a run, by the name a stop request carries, and the exit code each gives (128 + signal).
STOP_SIGNALS: dict[str, int] = {"SIGINT": 130, "SIGTERM": 143}

_armed = False  # the handler raises StopRequested in the main thread (while items run); else it only records
_raised = False  # it raised once already: a second signal while the run writes what it has must not cut that
_installed = 0  # nesting of stop_on_signals (an inner one leaves the outer's handlers and request in place)


def _on_signal(signum: int, _frame: Any) -> None:
    global _raised
    name = signal.Signals(signum).name
    cancel.request_stop(name)
    if _armed and not _raised:
        _raised = True
        raise cancel.StopRequested(name)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block SIGINT and SIGTERM request a stop (:func:`cancel.request_stop`, which also fires the
    engines' callbacks) and, inside :func:`raising_on_stop`, raise StopRequested in the main thread.

    A watcher thread hears the signal through the wakeup fd, so a C call holding the main thread (a Z3 check)
    is interrupted by its registered callback at once, not when it returns. A no-op off the main thread.
    """
    global _raised, _installed
    if threading.current_thread() is not threading.main_thread() or _installed:
        yield
        return
    cancel.clear_stop()
    _raised = False
    old = {name: signal.getsignal(getattr(signal, name)) for name in STOP_SIGNALS}
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)
    numbers = {int(getattr(signal, name)): name for name in STOP_SIGNALS}

    def watch() -> None:
        while True:
            try:
                data = os.read(rfd, 64)
            except OSError:
                return
            if not data:
                return
            for n in data:
                if n in numbers:
                    cancel.request_stop(numbers[n])

    watcher = threading.Thread(target=watch, name="kc-signals", daemon=True)
    watcher.start()
    try:
        old_fd = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        for name in STOP_SIGNALS:
            if old[name] is not signal.SIG_IGN:  # nohup's choice stands
                signal.signal(getattr(signal, name), _on_signal)
    except (ValueError, OSError):  # not the main thread of the main interpreter after all
        os.close(wfd)
        os.close(rfd)
        yield
        return
    _installed += 1
    try:
        yield
    finally:
        _installed -= 1
        for name, handler in old.items():
            signal.signal(getattr(signal, name), handler if handler is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(old_fd)
        os.close(wfd)  # the watcher reads end-of-file and ends
        watcher.join(timeout=1)
        os.close(rfd)
        cancel.clear_stop()  # the run that was stopped is over: a later run in this process starts afresh


@contextlib.contextmanager
def raising_on_stop() -> Iterator[None]:
    """Within the block a stop signal raises StopRequested in the main thread (once); a stop already requested
    raises at once. Outside it the signal only records the request, for the run to see at a safe point."""
    global _armed, _raised
    was = _armed
    _armed = True
    try:
        reason = cancel.stop_requested()
        if reason is not None:
            _raised = True
            raise cancel.StopRequested(reason)
        yield
    finally:
        _armed = was


def known_witnesses(contract: Any, item: dict[str, Any], records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{regimes item id: its witnesses} for ``item``'s ``witnesses:``, where that regimes item's record is at hand
    (proved, with witnesses), so whoever runs ``item`` need not solve the same optimisation again."""
    rid = item.get("witnesses")
    rec = records.get(str(rid)) if rid else None
    if rec is None or rec.get("status") != "proved":
        return {}
    w = (rec.get("evidence") or {}).get("witnesses")
    return {str(rid): w} if w else {}


def seed_witnesses(contract: Any, witnesses: dict[str, Any]) -> None:
    """Put regimes items' witnesses (from their records) in the falsify engine's per-process cache."""
    from obligations import engines

    for rid, w in witnesses.items():
        engines._WITNESSES.setdefault((contract.path, contract.sha256, rid), dict(w))


@dataclass
class Executor:
    """Runs one item of a contract and returns its record fields (see obligations.check.item_fields).

    ``witnesses``: regimes items' witnesses already found in this run ({regimes item id: witnesses}), handed to
    the process that runs the item (the regimes item ran in another process, a prefetch worker).
    """

    fields: RecordFn

    def run(
        self, contract: Any, item: dict[str, Any], limit: float | None, witnesses: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        raise NotImplementedError

    def seconds(self, wall: float) -> float:
        """The seconds the last item ran, given the caller's ``wall`` time around :meth:`run` (a worker's start
        and its loading of the contract are not the item's time)."""
        return wall

    def prestart(self, preload: tuple[str, ...] = ()) -> None:
        """Start what the first item will need (a worker process, importing ``preload`` too) without waiting for it;
        a no-op in process."""

    def signal_stop(self) -> None:
        """Tell what the executor holds to end now without waiting for it (:meth:`close` waits): a run ending its
        workers signals them all first, so their ends (a CUDA context's teardown each) overlap."""

    def close(self) -> None:
        """Release what the executor holds (a worker process)."""


def cpu_seconds() -> float:
    """CPU seconds this process and its waited-for children have used (user + system, every thread)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class InProcess(Executor):
    """Items run in this process; a Python-level hang is stopped by a SIGALRM timer (main thread only)."""

    def run(
        self, contract: Any, item: dict[str, Any], limit: float | None, witnesses: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        seed_witnesses(contract, witnesses or {})
        cpu0 = cpu_seconds()
        try:
            # The deadline sizes the engines' own budgets (Z3's timeout); the timer stops Python-level hangs.
            with cancel.item_deadline(limit), _alarm(limit):
                fields = self.fields(contract, item)
        except (ItemTimeout, cancel.DeadlinePassed):
            return timeout_record(limit or 0, "stopped in process")
        # CPU against wall (``seconds``) says whether an item computed or waited (on the GPU, a lock, a peer)
        return {**fields, "cpu_seconds": round(cpu_seconds() - cpu0, 3)}


# Seconds a worker may take to start (import the run's modules) or to load a contract and its test modules.
WORKER_START_S = 300.0
# Modules (comma-separated) a worker imports before it says it is ready, besides the run's own (WorkerPool.preload).
PRELOAD_ENV = "KC_WORKER_PRELOAD"


class WorkerStartError(RuntimeError):
    """A worker process died or hung before it was ready for its first item."""


def worker_request(
    settings: dict[str, Any],
    contract: Any,
    item: dict[str, Any],
    witnesses: dict[str, Any] | None,
    limit: float | None = None,
) -> dict[str, Any]:
    """The JSON request that asks a worker process to run one item."""
    return {
        **settings,
        "path": str(Path(contract.path).resolve()),
        # as the user named it (relative to the shared working directory): replay commands quote it
        "shown": str(contract.path),
        "sha256": contract.sha256,
        "item": item["id"],
        "witnesses": witnesses or {},
        "limit": limit,  # the worker sets it as the item's deadline: Z3 sizes its timeout from it
    }


_TESTS_IMPORTED: set[tuple[str, str]] = set()  # the contracts whose test modules this process has imported


def worker_contract(cache: dict[tuple[str, str], Any], req: dict[str, Any], tests: bool = True) -> Any:
    """The contract a worker's request names, parsed once: read by its absolute path, named as the run names it;
    ``tests``: its test modules imported (a process that runs its items; not one that hands them on)."""
    from obligations.contract import add_project_root, import_test_modules, parse_contract

    key = (req["path"], req.get("shown", req["path"]))
    if key not in cache:
        cache[key] = replace(parse_contract(req["path"], cache=True), path=key[1])  # as the run: the load cache
        # The worker may have started before the run loaded the contracts (which put the checked project's root
        # on the run's sys.path): its test modules import from that root.
        add_project_root(req["path"])
    if tests and key not in _TESTS_IMPORTED:  # this process's imports, whichever cache the contract is in
        import_test_modules(cache[key])
        _TESTS_IMPORTED.add(key)
    return cache[key]


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Reap a killed worker: at once where it is gone, else in a daemon thread. A killed process that held a CUDA
    context ends after the driver tears the context down (~0.13 s on an H200, one process after another): waiting
    here for fifteen of them held the end of a run by 2 s (and 0.05 s each still by 0.8 s). They are dead to the
    run either way (SIGKILL)."""
    with contextlib.suppress(Exception):  # already reaped by another thread
        if proc.poll() is None:
            threading.Thread(target=proc.wait, name="kc-reap", daemon=True).start()


class WorkerPool(Executor):
    """Items run in a worker process, replaced after a timeout, a crash or a broken CUDA context."""

    def __init__(self, fields: RecordFn, settings: dict[str, Any]):
        super().__init__(fields)
        self.settings = settings
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0
        self.threads: int | None = None  # size of the worker's BLAS/OpenMP thread pools (None: the libraries')
        self._buf = b""
        self._item_seconds: float | None = None
        self._closed = False
        self._ready = False  # the worker said it imported the run's modules
        self.preload: tuple[str, ...] = ()  # modules the worker imports before it says it is ready (PRELOAD_ENV)
        self.items = 0  # items the current process has answered: how warm it is (contexts, handles, kernels loaded)
        self.imported: frozenset[str] = frozenset()  # the measure items' peers it has imported (its last answer)
        # (spawned, ready) of each worker process, perf_counter seconds (ready: None until heard): the timeline's
        self.starts: list[tuple[float, float | None]] = []

    def prestart(self, preload: tuple[str, ...] = ()) -> None:
        """Spawn the worker now and let it import the run's modules (and the modules ``preload`` names) while the
        caller does other work (kc check: while the contracts load); the first :meth:`run` waits for it to be ready."""
        self.preload = tuple(preload)
        if self.proc is None or self.proc.poll() is not None:
            self._spawn()

    def _start(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            self._spawn()
        return self._await_ready()

    def _spawn(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env.pop(PRELOAD_ENV, None)
        if self.preload:
            env[PRELOAD_ENV] = ",".join(self.preload)
        if self.threads:
            for var in THREAD_POOL_VARS:  # a variable the user set wins
                env.setdefault(var, str(self.threads))
        if self.settings.get("device") == "cuda":
            wait_from_env()  # a wait the user set that is none: said here, by the run, not by a dying worker
            env.setdefault(WAIT_ENV, WORKER_WAIT)  # a wait the user set wins
            env.setdefault(NICE_ENV, str(WORKER_NICE))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "obligations.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self.started += 1
        self.items, self.imported = 0, frozenset()
        self.starts.append((time.perf_counter(), None))
        self._buf = b""
        self._ready = False

    def _await_ready(self) -> subprocess.Popen[bytes]:
        proc = self.proc
        if self._closed or proc is None:
            self._kill()
            raise WorkerStartError("the run stopped")
        if self._ready:
            return proc
        # The item's limit starts once the worker has imported the run's modules: a start is not the item's time.
        try:
            ready = self._read_line(time.monotonic() + WORKER_START_S)
        except ItemTimeout:
            ready = None
        answer = json.loads(ready) if ready is not None else {}
        if self._closed or answer.get("ready") is not True:
            self._kill()
            raise WorkerStartError(f"a worker process did not start within {WORKER_START_S:g} s")
        self._ready = True
        self.imported = frozenset(answer.get("imported") or ())
        if self.starts and isinstance(answer.get("at"), int | float):  # the worker's clock: when it was ready
            self.starts[-1] = (self.starts[-1][0], time.perf_counter() - max(0.0, time.time() - answer["at"]))
        return proc

    def _kill(self) -> None:
        proc, self.proc = self.proc, None  # the run's thread and a prefetch thread may both get here
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            _reap(proc)
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(Exception):
                    stream.close()

    def signal_stop(self) -> None:
        """SIGKILL the worker's process group now; :meth:`close` reaps it."""
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        self._closed = True  # a start under way in another thread kills its process instead of keeping it
        self._kill()

    def _read_line(self, deadline: float | None) -> bytes | None:
        proc = self.proc
        if proc is None or proc.stdout is None:  # closed by another thread (the run is stopping)
            return None
        try:
            fd = proc.stdout.fileno()
        except ValueError:  # its pipe was closed meanwhile
            return None
        while b"\n" not in self._buf:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                ready, _, _ = select.select([fd], [], [], wait)
                if not ready:
                    raise ItemTimeout()
                chunk = os.read(fd, 1 << 16)
            except (OSError, ValueError):  # the pipe was closed by another thread (the run is stopping)
                return None
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def seconds(self, wall: float) -> float:
        """The last item's own seconds (from its worker's "loaded" line to its answer) where it answered."""
        return wall if self._item_seconds is None else min(wall, self._item_seconds)

    def run(
        self, contract: Any, item: dict[str, Any], limit: float | None, witnesses: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        self._item_seconds: float | None = None
        try:
            proc = self.proc if self._ready and self.proc is not None and self.proc.poll() is None else self._start()
        except WorkerStartError as e:
            return error_fields(str(e))
        request = worker_request(self.settings, contract, item, witnesses, limit)
        t0 = time.monotonic()
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            proc.stdin.flush()
            # loading the contract and its test modules (once per worker) is not the item's time
            line = self._read_line(t0 + WORKER_START_S)
            if line is not None:
                t0 = time.monotonic()
                # a little past the limit: an engine that honours the deadline itself ends with its own record
                line = self._read_line(None if not limit else t0 + limit * 1.05 + 0.5)
        except ItemTimeout:
            self._kill()
            return timeout_record(limit or 0, "worker process killed and replaced")
        except BrokenPipeError:
            line = None
        except BaseException:  # Ctrl-C while waiting: the worker goes with the run
            self._kill()
            raise
        if line is None:
            code = proc.wait(timeout=10)
            self._kill()
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            return error_fields(f"the worker process died running this item ({how}); it was replaced", worker_exit=code)
        self._item_seconds = time.monotonic() - t0
        answer = json.loads(line)
        self.items += 1
        self.imported = self.imported | frozenset(answer.get("imported") or ())
        if not answer.get("healthy", True):
            self._kill()  # a broken CUDA context would fail every later item: the next item gets a new worker
            answer["fields"].setdefault("evidence", {})["worker_replaced"] = answer.get("why", "unhealthy")
        return answer["fields"]


def all_cores() -> frozenset[int]:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def make_executor(mode: str, fields: RecordFn, settings: dict[str, Any]) -> Executor:
    """The executor named ``mode`` (see EXECUTORS); ``auto``: a worker on cuda, in process on the host."""
    if mode == "auto":
        mode = "process" if settings.get("device") == "cuda" else "none"
    return EXECUTORS[mode](fields, settings)


EXECUTORS: dict[str, Callable[[RecordFn, dict[str, Any]], Executor]] = {
    "none": lambda fields, _settings: InProcess(fields),
    "process": WorkerPool,
}


# Methods whose items time the machine: they run first, alone, before any worker starts (a quiet machine).
QUIET_METHODS = frozenset({"measure"})

# Methods whose items never touch the device: queued before the others once the measure items are done.
HOST_METHODS = frozenset({"z3", "enumerate", "sympy", "regimes", "audit", "assume"})

# Methods whose items share one run-wide job that the first of them to start runs (obligations.sanitize_batch:
# one compute-sanitizer process per tool for every workload); the others only wait for it and read their part.
SHARED_METHODS = frozenset({"sanitize"})

Key = tuple[str, str, str]


def item_key(contract: Any, item_id: str) -> Key:
    """The key of one item of one contract version: (path, sha256, item id)."""
    return (str(contract.path), contract.sha256, item_id)


def default_jobs() -> int:
    """Workers by default: one core is the run's own; at most 15 (each worker holds its imports, ~0.5 GB)."""
    return max(1, min(15, (os.cpu_count() or 2) - 1))


# How a worker of a cuda run waits for its GPU (native.cuda_driver): the driver would spin a core a worker.
WORKER_WAIT = "blocking"
# The CPU priority a worker of a cuda run gives up (os.nice): the run's sanitizer processes, its longest job, keep
# theirs and take the CPUs first where the items' workers want more than there are (a 2-GPU cluster's 30 workers
# left them none; with this and the plan started by the run it took 16 s of the cluster's run instead of 25, 2 x
# H200). Alone on the machine a worker loses nothing.
NICE_ENV = "KC_WORKER_NICE"
WORKER_NICE = 5
# The thread-pool sizes of NumPy's BLAS and OpenMP code: N workers each starting one thread per CPU would run
# N x CPUs threads on CPUs threads' worth of cores (the float64 references of GEMM, attention and conv use BLAS).
THREAD_POOL_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


class RunsAhead(Protocol):
    """What runs a check's items away from the in-order run, which takes their records in the contracts' order:
    :class:`Prefetcher` (``-j``: kc worker processes on this host) and ``obligations.cluster.ClusterRunner``
    (``--cluster``: a Dask cluster). Each runs an item through an :class:`Executor` (in process or a kc worker
    process), so limits and isolation are the same; the in-order run with no runner is the third way."""

    finished: dict[Key, tuple[dict[str, Any], float]]  # items run to their end: (record fields, seconds)

    def submit(self, contract: Any, item: dict[str, Any], limit: float | None, after: Key | None = None) -> None:
        """Queue ``item``; ``after``: the regimes item whose record (witnesses) it waits for."""

    def publish(self, key: Key, fields: dict[str, Any]) -> None:
        """A record is in (run here, or resumed): the items waiting for its witnesses may go."""

    def done(self, key: Key, fields: dict[str, Any], seconds: float) -> None:
        """Hand over a record the run made itself."""

    def take(self, contract: Any, item: dict[str, Any]) -> tuple[dict[str, Any], float] | None:
        """The (fields, seconds) of a submitted item, waiting for it; None: the run does the item itself."""

    def close(self) -> None:
        """Drop what has not started and stop every process the runner started."""


class Prefetcher:
    """Runs items ahead in ``jobs`` worker processes; the in-order run takes their records where it reaches them.
    Records the run makes itself later (:meth:`defer`, :meth:`done`: the measure items) are waited for; ``own``
    keeps the run's executor to one of them at a time.

    An item no worker has started yet when the run reaches it is the run's own (:meth:`take` returns None), so
    the run never waits on a queue and is never slower than running in order. An item that names a regimes
    item's ``witnesses`` earlier in the run waits for that item's record (:meth:`publish`) and gets its
    witnesses, as it would in order; the records are the same as in order.
    """

    def __init__(
        self,
        jobs: int,
        fields: RecordFn,
        settings: dict[str, Any],
        ran: Callable[[Key, str, float, float], None] | None = None,
    ):
        self._free: queue.Queue[WorkerPool] = queue.Queue()
        self._workers = [WorkerPool(fields, settings) for _ in range(jobs)]
        threads = max(1, len(all_cores()) // jobs)  # the workers share the CPUs: so do their thread pools
        for w in self._workers:
            w.threads = threads
            self._free.put(w)
        self.ran = ran  # (key, lane, start, end) of each item a worker ran: the run's timeline
        # Daemon threads, not a ThreadPoolExecutor: the interpreter joins an executor's threads at exit, so a
        # thread still waiting on a worker would hold a stopped run's exit until the item's limit.
        self._tasks: queue.Queue[tuple[Future[Any], Callable[[], Any]] | None] = queue.Queue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"kc-prefetch-{n}", daemon=True) for n in range(jobs)
        ]
        for t in self._threads:
            t.start()
        self.finished: dict[Key, tuple[dict[str, Any], float]] = {}  # items run to their end: (fields, seconds)
        self._futures: dict[Key, Future[tuple[dict[str, Any], float]]] = {}
        self._submitted: list[Future[tuple[dict[str, Any], float]]] = []  # what the workers were given
        self._deferred: dict[Key, Future[tuple[dict[str, Any], float]]] = {}  # records the run hands over later
        # Held by the run while it runs an item itself and by the deferred records' maker while it makes them: the
        # run's own executor is theirs in turn, never both at once (nothing runs beside the measure items)
        self.own = threading.Lock()
        self._published: dict[Key, dict[str, Any]] = {}
        self._events: dict[Key, threading.Event] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._lendable: Executor | None = None  # the run's executor, once lent (:meth:`lend`)
        self._lent: threading.Thread | None = None

    def _serve(self) -> None:
        while (task := self._tasks.get()) is not None:
            self._do(task)

    @staticmethod
    def _do(task: tuple[Future[Any], Callable[..., Any]], **how: Any) -> None:
        fut, fn = task
        if not fut.set_running_or_notify_cancel():  # withdrawn: the run does the item itself
            return
        try:
            fut.set_result(fn(**how))
        except BaseException as e:  # handed to the run, which re-raises it where it takes the record
            fut.set_exception(e)

    def lend(self, executor: Executor) -> None:
        """Let ``executor`` (the run's own) take queued items too, from the moment the run waits on a record it
        makes itself later (:meth:`defer`: the first measure item) until the queue is empty. The run reaches the
        first measure item early (attention's, the first contract) and waits there until the measure phase: its
        worker sat idle for 20 of an H200's 32 s and 26 of an H100's 37 s of worker items (2026-11-27)."""
        self._lendable = executor

    def _lend_now(self) -> None:
        with self._lock:
            if self._lendable is None or self._lent is not None or self._closed:
                return
            self._lent = threading.Thread(
                target=self._serve_lent, args=(self._lendable,), name="kc-prefetch-run", daemon=True
            )
        self._lent.start()

    def _serve_lent(self, executor: Executor) -> None:
        """Run queued items on the lent executor until the queue is empty (all the run's items are queued at its
        start, so an empty queue stays empty), each under :attr:`own` (the measure phase takes it after them)."""
        while not self._closed:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                return
            if task is None:  # a serving thread's end (close): theirs
                self._tasks.put(None)
                return
            self._do(task, lent=executor)

    def _event(self, key: Key) -> threading.Event:
        with self._lock:
            ev = self._events.setdefault(key, threading.Event())
            if self._closed:  # nothing more will be published: nobody may wait
                ev.set()
            return ev

    def publish(self, key: Key, fields: dict[str, Any]) -> None:
        """Make an item's record fields available to the items waiting for its witnesses."""
        with self._lock:
            self._published[key] = fields
        self._event(key).set()

    def submit(self, contract: Any, item: dict[str, Any], limit: float | None, after: Key | None = None) -> None:
        """Queue ``item`` of ``contract`` for the next free worker; ``after``: the regimes item whose witnesses it
        takes (it must be earlier in the run: submitted before it, or run by the in-order run before it)."""
        key = item_key(contract, item["id"])
        fut: Future[tuple[dict[str, Any], float]] = Future()
        self._futures[key] = fut
        self._submitted.append(fut)
        self._tasks.put((fut, partial(self._run, contract, item, limit, after)))

    def defer(self, contract: Any, item: dict[str, Any]) -> None:
        """Promise ``item``'s record: the run makes it itself later (:meth:`done`), and :meth:`take` waits for it
        instead of handing the item back (the measure items, timed once the workers are idle)."""
        key = item_key(contract, item["id"])
        fut: Future[tuple[dict[str, Any], float]] = Future()
        fut.set_running_or_notify_cancel()  # running: take() waits for it, it is never withdrawn
        self._futures[key] = self._deferred[key] = fut

    def wait_idle(self) -> bool:
        """Wait until every item given to the workers has ended; False if the run stopped meanwhile."""
        for fut in list(self._submitted):
            with contextlib.suppress(BaseException):
                fut.exception()
        return not self._closed and cancel.stop_requested() is None

    def _run(
        self,
        contract: Any,
        item: dict[str, Any],
        limit: float | None,
        after: Key | None,
        lent: Executor | None = None,
    ) -> tuple[dict[str, Any], float]:
        key = item_key(contract, item["id"])
        fields: dict[str, Any] = error_fields("the run stopped before this item finished")
        try:
            witnesses: dict[str, Any] = {}
            if after is not None:  # waited for before a worker is taken: no worker idles on it
                self._event(after).wait()
                with self._lock:
                    done = self._published.get(after)
                if done is not None:
                    witnesses = known_witnesses(contract, item, {after[2]: done})
            if self._closed:
                return fields, 0.0
            if lent is not None:
                with self.own:
                    fields, seconds = self._run_on(lent, "run", key, contract, item, limit, witnesses)
                return fields, seconds
            worker = self._free.get()
            try:
                fields, seconds = self._run_on(worker, None, key, contract, item, limit, witnesses)
                return fields, seconds
            finally:
                self._free.put(worker)
        finally:
            self.publish(key, fields)

    def _run_on(
        self,
        worker: Any,
        lane: str | None,
        key: Key,
        contract: Any,
        item: dict[str, Any],
        limit: float | None,
        witnesses: dict[str, Any],
    ) -> tuple[dict[str, Any], float]:
        t0 = time.perf_counter()
        fields = worker.run(contract, item, limit, witnesses)
        t1 = time.perf_counter()
        if self._closed or cancel.stop_requested() is not None:  # cut by the stop: no outcome
            return error_fields("the run stopped before this item finished"), 0.0
        seconds = round(worker.seconds(t1 - t0), 4)
        with self._lock:
            self.finished[key] = (fields, seconds)
        if self.ran is not None:  # from its start where the worker started for it (its own span)
            starts = getattr(worker, "starts", None)
            ready = starts[-1][1] if starts else None
            self.ran(key, lane or self._lane(worker), max(t0, ready or t0), t1)
        return fields, seconds

    def _lane(self, worker: WorkerPool) -> str:
        return f"worker {next(n for n, w in enumerate(self._workers) if w is worker) + 1}"

    def signal_stop(self) -> None:
        """Signal every worker to end now, without waiting (their ends overlap; :meth:`close` waits for them)."""
        self._closed = True  # first: a thread whose worker dies now returns the stop's record, not a crash's
        lent = [self._lendable] if self._lent is not None else []
        for w in [*self._workers, *lent]:
            getattr(w, "signal_stop", lambda: None)()

    def prestart(self, preload: tuple[str, ...] = ()) -> None:
        """Spawn every worker now (each imports the run's modules while the caller goes on: kc check on cuda, while
        the contracts load); a closed prefetcher starts none."""
        if self._closed:
            return
        for w in self._workers:
            w.prestart(preload)

    def starts(self) -> list[tuple[str, float, float]]:
        """(lane, spawned, ready) of every worker start heard ready, perf_counter seconds (the run's timeline)."""
        return [(self._lane(w), t0, t1) for w in self._workers for t0, t1 in getattr(w, "starts", ()) if t1 is not None]

    def done(self, key: Key, fields: dict[str, Any], seconds: float) -> None:
        """Hand over a record the run made itself (a measure item, deferred or not): :meth:`take` returns it."""
        fut = self._deferred.pop(key, None)
        if fut is None:
            fut = Future()
            self._futures[key] = fut
        with self._lock:
            self.finished[key] = (fields, seconds)
        fut.set_result((fields, seconds))
        self.publish(key, fields)

    def take(self, contract: Any, item: dict[str, Any]) -> tuple[dict[str, Any], float] | None:
        """The (record fields, seconds the item ran) of a submitted item, waiting while a worker runs it; None if
        it was never submitted or no worker has started it (it is withdrawn: the run does it itself)."""
        key = item_key(contract, item["id"])
        fut = self._futures.pop(key, None)
        if fut is None or fut.cancel():
            return None
        if key in self._deferred and not fut.done():  # the run waits until the measure phase: lend its executor
            self._lend_now()
        return fut.result()

    @property
    def started(self) -> int:
        """Worker processes started so far (first starts and replacements)."""
        return sum(getattr(w, "started", 0) for w in self._workers)

    def drain(self) -> None:
        """Wait until every submitted item has finished (its record stays to be taken)."""
        for fut in list(self._futures.values()):
            fut.exception()

    def close(self) -> None:
        """Drop what has not started and stop every worker."""
        self._closed = True
        for fut in self._futures.values():
            fut.cancel()
        self._futures.clear()
        for fut in self._deferred.values():  # nobody will make these now: a waiting take() gets the stop's record
            fut.set_result((error_fields("the run stopped before this item finished"), 0.0))
        self._deferred.clear()
        with self._lock:
            events = list(self._events.values())
        for ev in events:  # a thread waiting for witnesses that will not come
            ev.set()
        self.signal_stop()
        for w in self._workers:
            w.close()
        for _ in self._threads:
            self._tasks.put(None)
        deadline = time.monotonic() + 5  # each ends once its worker is killed (a dead pipe reads end-of-file)
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        for w in self._workers:  # a worker a thread was starting when it was closed
            w.close()
