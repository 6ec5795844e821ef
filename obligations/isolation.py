"""Running one item with a time limit: in this process (a SIGALRM timer) or in a replaceable worker process.

A worker process (``python -m obligations.isolation``) runs items one at a time and answers over a pipe.
Past its limit an item's worker is killed and the item is ``error (timeout)``; a worker that dies (a
segfault, ``os._exit``) or whose CUDA context is broken after an item (an illegal address poisons every
later launch) is replaced, so one faulting kernel costs one item and the run goes on.

A :class:`Prefetcher` runs the host-only items (proofs, enumerations, audits: :data:`HOST_METHODS`) ahead of
the run in ``jobs`` such workers, while the run goes on in order with the items that use the device; the
run then takes their records where it reaches them, so the output keeps the contract's order.
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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ItemTimeout",
    "PROFILE_TIMEOUT_S",
    "item_timeout",
    "Executor",
    "InProcess",
    "WorkerPool",
    "EXECUTORS",
    "make_executor",
    "timeout_record",
    "HOST_METHODS",
    "Prefetcher",
    "default_jobs",
    "known_witnesses",
    "seed_witnesses",
]

# Seconds an item may run before it is stopped, per profile (an item's ``timeout_s`` or --item-timeout win).
PROFILE_TIMEOUT_S: dict[str, float] = {"quick": 300.0, "full": 1200.0}

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


def timeout_record(seconds: float, how: str) -> dict[str, Any]:
    """The outcome fields of an item stopped at its limit."""
    return {
        "status": "error",
        "claim": "none",
        "evidence": {"kind": "none", "timeout_s": seconds},
        "counterexample": None,
        "reason": f"timeout: the item ran past its limit of {seconds:g} s ({how})",
    }


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

    def close(self) -> None:
        """Release what the executor holds (a worker process)."""


class InProcess(Executor):
    """Items run in this process; a Python-level hang is stopped by a SIGALRM timer (main thread only)."""

    def run(
        self, contract: Any, item: dict[str, Any], limit: float | None, witnesses: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        seed_witnesses(contract, witnesses or {})
        try:
            with _alarm(limit):
                return self.fields(contract, item)
        except ItemTimeout:
            return {**timeout_record(limit or 0, "stopped in process"), "entry_points": []}


class WorkerPool(Executor):
    """Items run in a worker process, replaced after a timeout, a crash or a broken CUDA context."""

    def __init__(self, fields: RecordFn, settings: dict[str, Any]):
        super().__init__(fields)
        self.settings = settings
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0
        self._buf = b""

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "obligations.isolation"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self.started += 1
        self._buf = b""
        return self.proc

    def _kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=10)
            for stream in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(Exception):
                    stream.close()
        self.proc = None

    def close(self) -> None:
        self._kill()

    def _read_line(self, deadline: float | None) -> bytes | None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                raise ItemTimeout()
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def run(
        self, contract: Any, item: dict[str, Any], limit: float | None, witnesses: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
        request = {
            **self.settings,
            "path": str(Path(contract.path).resolve()),
            "sha256": contract.sha256,
            "item": item["id"],
            "witnesses": witnesses or {},
        }
        t0 = time.monotonic()
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            proc.stdin.flush()
            line = self._read_line(None if not limit else t0 + limit)
        except ItemTimeout:
            self._kill()
            return {**timeout_record(limit or 0, "worker process killed and replaced"), "entry_points": []}
        except BrokenPipeError:
            line = None
        except BaseException:  # Ctrl-C while waiting: the worker goes with the run
            self._kill()
            raise
        if line is None:
            code = proc.wait(timeout=10)
            self._kill()
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            return {
                "status": "error",
                "claim": "none",
                "evidence": {"kind": "none", "worker_exit": code},
                "counterexample": None,
                "entry_points": [],
                "reason": f"the worker process died running this item ({how}); it was replaced",
            }
        answer = json.loads(line)
        if not answer.get("healthy", True):
            self._kill()  # a broken CUDA context would fail every later item: the next item gets a new worker
            answer["fields"].setdefault("evidence", {})["worker_replaced"] = answer.get("why", "unhealthy")
        return answer["fields"]


def make_executor(mode: str, fields: RecordFn, settings: dict[str, Any]) -> Executor:
    """The executor named ``mode`` (see EXECUTORS); ``auto``: a worker on cuda, in process on the host."""
    if mode == "auto":
        mode = "process" if settings.get("device") == "cuda" else "none"
    return EXECUTORS[mode](fields, settings)


EXECUTORS: dict[str, Callable[[RecordFn, dict[str, Any]], Executor]] = {
    "none": lambda fields, _settings: InProcess(fields),
    "process": WorkerPool,
}


# Methods whose items never touch the device and depend on no other item's run: safe to run ahead, in parallel.
HOST_METHODS = frozenset({"z3", "enumerate", "sympy", "regimes", "audit", "assume"})


def default_jobs() -> int:
    """Prefetch workers by default: one core is the run's own; at most 4 (each worker holds its imports)."""
    return max(1, min(4, (os.cpu_count() or 2) - 1))


class Prefetcher:
    """Runs host-only items ahead in ``jobs`` worker processes; ``take`` hands a record to the in-order run."""

    def __init__(self, jobs: int, fields: RecordFn, settings: dict[str, Any]):
        self._free: queue.Queue[WorkerPool] = queue.Queue()
        self._workers = [WorkerPool(fields, settings) for _ in range(jobs)]
        for w in self._workers:
            self._free.put(w)
        self._threads = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="kc-prefetch")
        self._futures: dict[tuple[str, str, str], Future[tuple[dict[str, Any], float]]] = {}
        self._gate = threading.Condition()
        self._paused, self._busy = False, 0

    def submit(self, contract: Any, item: dict[str, Any], limit: float | None) -> None:
        """Queue ``item`` of ``contract`` to run in the next free worker."""
        key = (str(contract.path), contract.sha256, item["id"])
        self._futures[key] = self._threads.submit(self._run, contract, item, limit)

    def _run(self, contract: Any, item: dict[str, Any], limit: float | None) -> tuple[dict[str, Any], float]:
        with self._gate:
            while self._paused:  # a measure item is running: no new item starts until it is done
                self._gate.wait()
            self._busy += 1
        worker = self._free.get()
        try:
            t0 = time.perf_counter()
            fields = worker.run(contract, item, limit)
            return fields, round(time.perf_counter() - t0, 4)
        finally:
            self._free.put(worker)
            with self._gate:
                self._busy -= 1
                self._gate.notify_all()

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """While inside: no item starts, after the ones running have finished (a measure item's quiet machine).

        Unlike :meth:`drain`, the items still queued wait for the end of the block instead of all running first.
        """
        with self._gate:
            self._paused = True
            while self._busy:
                self._gate.wait()
        try:
            yield
        finally:
            with self._gate:
                self._paused = False
                self._gate.notify_all()

    def take(self, contract: Any, item: dict[str, Any]) -> tuple[dict[str, Any], float] | None:
        """The (record fields, seconds the item ran) of a submitted item, waiting for it; None if not submitted."""
        fut = self._futures.pop((str(contract.path), contract.sha256, item["id"]), None)
        return None if fut is None else fut.result()

    def drain(self) -> None:
        """Wait until every submitted item has finished (its record stays to be taken): a quiet machine."""
        for fut in list(self._futures.values()):
            fut.exception()

    def close(self) -> None:
        """Drop what has not started and stop every worker."""
        with self._gate:
            self._paused = False
            self._gate.notify_all()
        for fut in self._futures.values():
            fut.cancel()
        self._futures.clear()
        for w in self._workers:
            w.close()
        self._threads.shutdown(wait=False, cancel_futures=True)
        for w in self._workers:  # a worker a thread was still waiting on when it was closed
            w.close()


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
    from obligations.check import item_fields
    from obligations.contract import import_test_modules, parse_contract

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    contracts: dict[str, Any] = {}
    for line in sys.stdin:
        req = json.loads(line)
        contract = contracts.get(req["path"])
        if contract is None:
            contract = contracts[req["path"]] = parse_contract(req["path"])
            import_test_modules(contract)
        if contract.sha256 != req["sha256"]:
            fields = {
                "status": "error",
                "claim": "none",
                "evidence": {"kind": "none"},
                "counterexample": None,
                "entry_points": [],
                "reason": f"{req['path']} changed during the run",
            }
        else:
            seed_witnesses(contract, req.get("witnesses") or {})
            fields = item_fields(
                contract, contract.item(req["item"]), device=req["device"], profile=req["profile"], seed=req["seed"]
            )
        healthy, why = _cuda_healthy(req["device"])
        answers.write(json.dumps({"fields": fields, "healthy": healthy, "why": why}, default=str) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_worker())
