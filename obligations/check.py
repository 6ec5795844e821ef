"""Running contracts: every item through its engine, into the JSON result that reports are made from."""

from __future__ import annotations

import contextlib
import datetime as _dt
import fnmatch
import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from obligations import __version__
from obligations.cluster import ClusterRunner, parse_cluster, visible_gpus
from obligations.contract import Contract, ContractError, load_contract, load_contracts, shown_path
from obligations.core import cancel, entrypoints
from obligations.core.device import use_plain_reductions
from obligations.core.evidence import FORMAT as EVIDENCE_FORMAT
from obligations.core.results import Outcome, Status, apply_expectation, error, skipped
from obligations.engines import Job, get_engine
from obligations.isolation import (
    HOST_METHODS,
    QUIET_METHODS,
    SHARED_METHODS,
    STOP_SIGNALS,
    Executor,
    Prefetcher,
    RunsAhead,
    WorkerPool,
    item_key,
    item_timeout,
    known_witnesses,
    make_executor,
    raising_on_stop,
)
from obligations.runorder import item_name, last_seconds, longest_first, record_seconds, shared_last
from obligations.sanitize_batch import RUN_ENV, PlanRun, run_scope, share, start_plan

__all__ = [
    "check_contract",
    "merge_results",
    "gate_status",
    "check_paths",
    "selected",
    "run_item",
    "exit_code",
    "provenance",
    "summarize",
    "replay_command",
    "result_json",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "RunOptions",
    "item_fields",
    "raised_at",
    "write_timeline",
]

EXIT_INTERRUPTED = 130  # the shell's code for a run stopped by Ctrl-C (SIGINT)
EXIT_TERMINATED = 143  # and by SIGTERM (timeout(1), docker stop, a cancelled CI job)

ProgressFn = Callable[[str, dict[str, Any] | None], None]


def item_method(item: dict[str, Any]) -> str:
    """The method an item is discharged by (falsification items default to ``falsify``)."""
    return item.get("method") or ("falsify" if item["kind"] == "falsification" else "assume")


def run_item(
    contract: Contract, item: dict[str, Any], *, device: str = "host", profile: str = "quick", seed: int = 0
) -> Outcome:
    """Discharge one item; a crash inside an engine is an ``error`` outcome carrying the traceback."""
    if "pending" in item:
        return skipped(f"no check wired yet: {item['pending']}")
    job = Job(contract, item, device=device, profile=profile, seed=seed)
    try:
        outcome = get_engine(item_method(item)).discharge(job)
    except SystemExit as e:  # a test or plan that calls sys.exit ends its item, not the run
        return error(
            f"the check called sys.exit({e.code!r}) instead of returning an outcome",
            traceback=traceback.format_exc(limit=6),
        )
    except Exception as e:  # engines are fallible code; the run goes on and the item says why
        where = raised_at(e)
        return error(
            f"{type(e).__name__}: {e}" + (f" (raised at {where})" if where else ""),
            traceback=traceback.format_exc(limit=6),
        )
    if not isinstance(outcome, Outcome):
        return error(
            f"the check returned {type(outcome).__name__}, not an Outcome (a registered test must "
            "return passed/violated/skipped/... from obligations.core.results)"
        )
    return apply_expectation(outcome, item)  # ``expect: violated``: a reproduced finding is not a failure


def raised_at(exc: BaseException) -> str | None:
    """``file:line`` of the innermost frame of ``exc``'s traceback in project code (not stdlib/site-packages)."""
    frames = traceback.extract_tb(exc.__traceback__)
    library = (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])
    for frame in reversed(frames):
        if not frame.filename.startswith(library) and not frame.filename.startswith("<"):
            return f"{_relative(frame.filename)}:{frame.lineno}"
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


def _relative(filename: str) -> str:
    try:
        return Path(filename).relative_to(Path.cwd()).as_posix()
    except ValueError:
        return filename


def item_fields(
    contract: Contract, item: dict[str, Any], *, device: str = "host", profile: str = "quick", seed: int = 0
) -> dict[str, Any]:
    """The outcome fields of one item's record and the entry points its check called (JSON, for workers too)."""
    if device == "cuda":
        use_plain_reductions()
    with entrypoints.recording() as calls:
        outcome = run_item(contract, item, device=device, profile=profile, seed=seed)
    return {**outcome.to_json(), "entry_points": [c.to_json() for c in sorted(calls)]}


def _call_of(data: dict[str, Any]) -> entrypoints.Call:
    family, _, name = data["entry"].partition(".")
    axes = tuple((k, str(v)) for k, v in data.items() if k not in ("entry", "device"))
    return entrypoints.Call(family, name, data["device"], axes)


def _kernel_modules(contract: Contract) -> set[str]:
    """Modules the contract's kernels name (entry, plan, spec): the code whose entry points it answers for."""
    return {
        str(path).partition(":")[0]
        for k in contract.data["kernels"].values()
        for role, path in k.items()
        if role in ("entry", "plan", "spec") and isinstance(path, str)
    }


def _import_kernel_modules(contract: Contract) -> None:
    """Import the modules the contract's kernels name (their imports register its entry points)."""
    import importlib

    for name in sorted(_kernel_modules(contract)):
        with contextlib.suppress(Exception):  # validation reported a module that does not import
            importlib.import_module(name)


def _agreement_kind(applied: Any) -> str | None:
    """The agreement kind from what the engine recorded (a kind name, or a dict with its parameters)."""
    return applied.get("kind") if isinstance(applied, dict) else applied


def replay_command(contract: Contract, item_id: str, device: str, seed: int) -> str:
    """The command that re-runs exactly this item."""
    return f"kc check {shown_path(contract.path)} --only {item_id} --device {device} --seed {seed}"


def selected(item_id: str, patterns: Iterable[str]) -> bool:
    """True iff ``item_id`` equals one of ``patterns`` or matches it as a shell glob (``RED-FOLD-*``)."""
    return any(item_id == p or fnmatch.fnmatchcase(item_id, p) for p in patterns)


def _record(
    contract: Contract, item: dict[str, Any], fields: dict[str, Any], device: str, seed: int, seconds: float
) -> dict[str, Any]:
    statement = {k: item[k] for k in ("given", "prove") if item.get(k)} or None
    fields = dict(fields)
    calls = fields.pop("entry_points", [])
    return {
        "id": item["id"],
        "kind": item["kind"],
        "type": item.get("type", "falsification"),
        "property": item.get("property") or item.get("rule"),
        "prediction": item.get("prediction"),
        "equation": item.get("equation"),
        "method": item_method(item),
        "statement": statement,
        # What the engine applied and recorded, never the contract's own word for it.
        # The kind of agreement the engine applied and recorded (its parameters stay in the evidence).
        "agreement": _agreement_kind((fields.get("evidence") or {}).get("agreement")),
        "tolerance": item.get("tolerance"),
        "test": item.get("test"),
        **fields,
        "replay": replay_command(contract, item["id"], device, seed),
        "location": item["location"],
        "seconds": seconds,
        # Which native entry points (and variants) the item's check called: observed, not declared.
        "entry_points": calls,
    }


@dataclass(frozen=True)
class RunOptions:
    """How items run: time limits, the executor, records already finished (resume) and the results log."""

    item_timeout: float | None = None
    isolate: str = "none"
    done: Mapping[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    log: Callable[[Contract, dict[str, Any]], None] | None = None
    maxfail: int | None = None
    jobs: int = 0  # worker processes running items ahead (0: every item in order, by the run itself)
    timeline: str | Path | None = None  # write where and when each item ran here (Chrome trace JSON)
    cluster: str | None = None  # run every item on this Dask cluster (local, local:N, tcp://HOST:PORT)
    # the run's own executor, made (and started, Executor.prestart) ahead by the caller; the run closes it
    executor: Executor | None = None
    # worker processes started ahead by the caller (kc check on cuda: while the contracts load), with ``jobs``
    # workers: the run's prefetcher where it runs items ahead, else closed at once; the run closes it
    prefetcher: Prefetcher | None = None
    # the --cluster being opened ahead by the caller (while the contracts load): the run takes it
    cluster_opening: Any = None
    # (name, start, end) in perf_counter seconds of what the caller did before the run (load contracts, ...): the
    # timeline's "run" lane, beside the items
    phases: tuple[tuple[str, float, float], ...] = ()


def check_contract(
    path: str | Path | Contract,
    *,
    device: str = "host",
    only: Iterable[str] | None = None,
    profile: str = "quick",
    seed: int = 0,
    progress: ProgressFn | None = None,
    options: RunOptions | None = None,
    executor: Executor | None = None,
    failures: list[int] | None = None,
    prefetcher: RunsAhead | None = None,
    ran: Callable[[tuple[str, str, str], str, float, float], None] | None = None,
) -> dict[str, Any]:
    """Check one contract and return its entry of the JSON result (items a ``prefetcher`` ran are taken from it;
    ``ran`` hears (item key, "run", start, end) of each item run here)."""
    contract = path if isinstance(path, Contract) else load_contract(path)
    options = options or RunOptions()
    own = executor is None
    if executor is None:
        executor = make_executor(
            options.isolate,
            partial(item_fields, device=device, profile=profile, seed=seed),
            {"device": device, "profile": profile, "seed": seed},
        )
    failures = failures if failures is not None else [0]
    wanted = list(only) if only else None
    entry: dict[str, Any] = {
        "id": contract.id,
        "version": contract.data["version"],
        "family": contract.data["family"],
        "summary": contract.data["summary"],
        "path": contract.path,
        "sha256": contract.sha256,
        "qa_gate": contract.data["qa_gate"],
        # Declared scope, not results: these seed claims get no status (docs/reports.md).
        "not_adopted": list(contract.data.get("not_adopted") or []),
        "items": [],
    }
    if progress:
        progress("contract", entry)
    called: set[entrypoints.Call] = set()
    records: dict[str, dict[str, Any]] = {}  # this run's records by item id (regimes witnesses for later items)
    current = None
    try:
        for item in contract.items:
            current = item["id"]
            if wanted is not None and not selected(item["id"], wanted):
                continue
            if options.maxfail is not None and failures[0] >= options.maxfail:
                entry["stopped"] = f"stopped after {failures[0]} failing item(s) (--maxfail {options.maxfail})"
                break
            record = options.done.get((contract.id, contract.sha256, item["id"]))
            resumed = record is not None
            if record is None:
                if progress:
                    progress("start", item)
                t0 = time.perf_counter()
                ahead = prefetcher.take(contract, item) if prefetcher is not None else None
                if ahead is None:
                    limit = item_timeout(item, profile, options.item_timeout)
                    with getattr(prefetcher, "own", None) or contextlib.nullcontext():  # never beside measure items
                        fields = executor.run(contract, item, limit, known_witnesses(contract, item, records))
                    seconds = round(executor.seconds(time.perf_counter() - t0), 4)
                    if ran is not None:
                        ran(item_key(contract, item["id"]), "run", t0, t0 + seconds)
                    if prefetcher is not None:
                        prefetcher.publish(item_key(contract, item["id"]), fields)
                else:
                    fields, seconds = ahead
                if cancel.stop_requested() is not None:  # an item the stop cut short has no outcome: not recorded,
                    entry["interrupted"] = item["id"]  # so --resume runs it again (never an `unknown` of the user's)
                    break
                record = _record(contract, item, fields, device, seed, seconds)
                if options.log:
                    options.log(contract, record)
            called |= {_call_of(c) for c in record.get("entry_points") or []}
            records[item["id"]] = record
            entry["items"].append(record)
            if record["status"] in ("violated", "error"):
                failures[0] += 1
            if progress:
                progress("done", {**record, "resumed": True} if resumed else record)
    except (KeyboardInterrupt, cancel.StopRequested):  # stop; the caller writes what was checked so far
        entry["interrupted"] = current
    finally:
        if own:
            executor.close()
    if wanted is None and "interrupted" not in entry and "stopped" not in entry:
        # a partial run cannot say what no item calls; the entry points are those the kernels' modules register
        # here (imported by validation, unless it came from the load cache, or by the items run in this process)
        _import_kernel_modules(contract)
        entry["unchecked_entry_points"] = [
            c.to_json()
            for c in entrypoints.unchecked(
                contract.data["family"], called, devices=(device,), modules=_kernel_modules(contract)
            )
        ]
    entry["qa_gate_status"] = gate_status(entry)
    return entry


def gate_status(entry: dict[str, Any]) -> str:
    """The contract entry's QA gate: passed when every required item has evidence (proved, exhausted, passed)."""
    statuses = {it["id"]: it["status"] for it in entry["items"]}
    required = [statuses.get(i) for i in entry["qa_gate"]["requires"]]
    if any(s is None for s in required):
        return "not evaluated"
    return "passed" if all(s in ("proved", "exhausted", "passed") for s in required) else "not passed"


def merge_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from several runs (per-contract runs, or a host and a device run of the same contracts).

    The primary run is the first one on cuda (else the first): its provenance heads the result and, for an item
    that several runs evidenced, its record wins. A contract in several runs must be the same file (sha256);
    an item a run skipped only because it runs on the other device takes the record of a run that ran it.
    Each item names the run it came from (``from_run``, an index into ``provenance.merged_runs``); gates,
    unchecked entry points (per device, so their union) and the summary are recomputed.
    """
    if len(results) == 1:
        return results[0]
    primary = next((k for k, r in enumerate(results) if _run_device(r) == "cuda"), 0)
    order = [k for k in range(len(results)) if k != primary] + [primary]  # the primary run's records last: they win
    entries: dict[str, dict[str, Any]] = {}
    for run in order:
        for c in results[run]["contracts"]:
            items = [{**it, "from_run": run} for it in c["items"]]
            old = entries.get(c["id"])
            if old is None:
                entries[c["id"]] = {**c, "items": items}
                continue
            if old["sha256"] != c["sha256"]:
                raise ValueError(f"contract {c['id']!r} differs between the runs (sha256): not the same file")
            by_id = {it["id"]: it for it in old["items"]}
            for it in items:
                prev = by_id.get(it["id"])
                if prev is not None and _other_device(it) is not None and _other_device(prev) is None:
                    continue  # this run could not run the item; keep the record of the run that did
                by_id[it["id"]] = it
            old["items"] = list(by_id.values())
            unchecked = (old.get("unchecked_entry_points") or []) + (c.get("unchecked_entry_points") or [])
            old["unchecked_entry_points"] = [
                json.loads(s) for s in sorted({json.dumps(u, sort_keys=True) for u in unchecked})
            ]
    contracts = list(entries.values())
    for c in contracts:
        c["qa_gate_status"] = gate_status(c)
    merged = dict(results[primary])
    merged["provenance"] = {**results[primary]["provenance"], "merged_runs": [r["provenance"] for r in results]}
    merged["contracts"] = contracts
    merged["summary"] = summarize(contracts)
    merged["exit_code"] = max(r["exit_code"] for r in results)
    return merged


def _run_device(result: dict[str, Any]) -> str | None:
    device = (result.get("provenance") or {}).get("device")
    return device.get("kind") if isinstance(device, dict) else device


def summarize(contracts: list[dict[str, Any]]) -> dict[str, int]:
    """Counts of items per status across contracts."""
    counts = {s.value: 0 for s in Status}
    for c in contracts:
        for it in c["items"]:
            counts[it["status"]] += 1
    counts["unchecked_entry_points"] = sum(len(c.get("unchecked_entry_points") or []) for c in contracts)
    items = [it for c in contracts for it in c["items"]]
    # Skipped only because the item's test or engine runs on the other device (README: --strict): cuda-only items
    # on a host run, host-only items (a claim about the host path) on a cuda run.
    counts["skipped_cuda_only"] = sum(_other_device(it) == ("cuda", "host") for it in items)
    counts["skipped_host_only"] = sum(_other_device(it) == ("host", "cuda") for it in items)
    # A named assumption (method assume) is a declared premise, reported as assumed; --strict does not fail on it.
    counts["skipped_assumed"] = sum(it["status"] == "skipped" and it.get("claim") == "assumed" for it in items)
    counts["unreached_regimes"] = sum(len((it.get("evidence") or {}).get("regimes_unreached") or []) for it in items)
    counts["unreached_boundaries"] = sum(
        len((it.get("evidence") or {}).get("boundaries_unreached") or []) for it in items
    )
    counts["order_insensitive"] = sum(bool((it.get("evidence") or {}).get("order_insensitive")) for it in items)
    return counts


_OTHER_DEVICE = re.compile(r"\bruns on (cuda|host)\b[^;]*; this run is on (host|cuda)\b")


def _other_device(item: dict[str, Any]) -> tuple[str, str] | None:
    """(where the item runs, where this run is) for an item skipped only because those differ, else None."""
    m = _OTHER_DEVICE.search(item.get("reason") or "") if item["status"] == "skipped" else None
    return (m.group(1), m.group(2)) if m and m.group(1) != m.group(2) else None


def exit_code(summary: dict[str, int], strict: bool = False) -> int:
    """0 unless violated/errored; ``strict`` also fails unknown, inconclusive, skips (other than items that run only
    on the other device and named assumptions), gaps in coverage or order. An expected violation (``expect:
    violated``, reproduced) never fails the run; an expected one that held is an error."""
    bad = summary["violated"] + summary["error"]
    if strict:
        excused = sum(summary.get(k, 0) for k in ("skipped_cuda_only", "skipped_host_only", "skipped_assumed"))
        bad += summary["unknown"] + summary.get("inconclusive", 0) + summary["skipped"] - excused
        bad += sum(
            summary.get(k, 0)
            for k in ("unchecked_entry_points", "unreached_regimes", "unreached_boundaries", "order_insensitive")
        )
    return 1 if bad else 0


def _git_commit(project: Path | None = None) -> tuple[str | None, bool]:
    """The commit (and dirtiness) of the checked project: the git repository holding ``project``."""
    # KC_COMMIT, when set, names the commit of a copied tree (a GPU machine's copy may carry a stale .git).
    if os.environ.get("KC_COMMIT"):
        return os.environ["KC_COMMIT"], False
    root = project if project is not None and project.is_dir() else Path.cwd()
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, False
    return commit, dirty


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def provenance(
    device: dict[str, Any], started: float, argv: list[str] | None = None, project: Path | None = None
) -> dict[str, Any]:
    """Where and with what a result was produced; ``commit`` is the checked project's (``project``'s repo)."""
    commit, dirty = _git_commit(project)
    cupy = next((v for v in (_version(d) for d in ("cupy-cuda13x", "cupy-cuda12x", "cupy")) if v), None)
    return {
        "commit": commit,
        "dirty": dirty,
        "python": platform.python_version(),
        "packages": {
            "numpy": _version("numpy"),
            "z3-solver": _version("z3-solver"),
            "hypothesis": _version("hypothesis"),
            "sympy": _version("sympy"),
            "cupy": cupy,
        },
        "device": device,
        "started": _dt.datetime.fromtimestamp(started, _dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "seconds": round(time.time() - started, 3),
        "argv": list(argv if argv is not None else sys.argv),
    }


def check_paths(
    paths: Iterable[str | Path | Contract],
    *,
    device: str = "host",
    device_info: dict[str, Any] | None = None,
    only: Iterable[str] | None = None,
    profile: str = "quick",
    seed: int = 0,
    strict: bool = False,
    progress: ProgressFn | None = None,
    argv: list[str] | None = None,
    options: RunOptions | None = None,
) -> dict[str, Any]:
    """Check every contract in ``paths`` and return the whole JSON result (see README: JSON result).

    Loaded contracts are checked as given (``kc check`` loads and validates each once); paths are loaded and
    validated here, raising ContractError. A stop (KeyboardInterrupt, or SIGINT/SIGTERM under
    :func:`obligations.isolation.stop_on_signals`) ends the run within seconds: the result holds what was checked,
    ``"interrupted": true``, the signal and exit code 130 (SIGTERM: 143); items the workers finished ahead go to
    the results log for ``--resume``. ``options`` sets time limits, the executor (a worker
    process replaced after a fault), records to reuse (``--resume``), the results log and ``--maxfail``.
    """
    started = time.time()
    options = options or RunOptions()
    only = list(only) if only else None
    paths = list(paths)
    todo = [p for p in paths if isinstance(p, Contract)]
    named = [p for p in paths if not isinstance(p, Contract)]
    if named:
        loaded = load_contracts(named)
        if loaded.diagnostics:
            raise ContractError(list(loaded.diagnostics))
        todo.extend(loaded.contracts)
    contracts: list[dict[str, Any]] = []
    interrupted = stopped = False
    failures = [0]
    scope = contextlib.ExitStack()
    sanitizing: PlanRun | None = None
    if device == "cuda":  # the run's sanitize items share one compute-sanitizer process per tool
        scope.enter_context(run_scope())
        shared = [(c, it) for c, it in _to_run(todo, only, options.done) if item_method(it) == "sanitize"]
        plan = share([it for _, it in shared], [c.data["family"] for c, _ in shared])
        sanitizing = _start_sanitize_plan(plan, options) if plan is not None else None
        if sanitizing is not None:
            scope.callback(sanitizing.stop)
    executor = options.executor or make_executor(
        options.isolate,
        partial(item_fields, device=device, profile=profile, seed=seed),
        {"device": device, "profile": profile, "seed": seed},
    )
    prefetcher: RunsAhead | None = None
    events: list[tuple[tuple[str, str, str], str, float, float]] = []
    ran_fn = (lambda key, lane, t0, t1: events.append((key, lane, t0, t1))) if options.timeline else None
    phases = list(options.phases)
    reason: str | None = None
    try:
        with raising_on_stop():  # a stop requested before the first item (while loading) ends the run here
            if options.cluster and next(_to_run(todo, only, options.done), None) is not None:
                # every item runs on the cluster; the run takes the records in order, and the log has each as it
                # lands (an item stuck on one worker holds back no other's record), once
                options = replace(options, log=_LogOnce(options.log) if options.log else None)
                settings = {"device": device, "profile": profile, "seed": seed}
                landed = partial(_log_landed, options.log, device, seed) if isinstance(options.log, _LogOnce) else None
                prefetcher = ClusterRunner(
                    parse_cluster(options.cluster),
                    settings,
                    options.isolate,
                    item_method,
                    ran=ran_fn,
                    landed=landed,
                    opened=options.cluster_opening,
                )
                opening = options.cluster_opening
                if opening is not None and opening.ended is not None:
                    phases.append(("open cluster", opening.began, opening.ended))
                _start_cluster(
                    prefetcher, todo, only, profile, options, last_seconds(device, profile), _started(sanitizing)
                )
            elif options.jobs > 0 and _worth_workers(todo, only, options):
                # made before the measure items run, so that a stop during them still closes its workers
                prefetcher = options.prefetcher or Prefetcher(
                    options.jobs, executor.fields, {"device": device, "profile": profile, "seed": seed}
                )
                prefetcher.ran = ran_fn
                last = last_seconds(device, profile)  # the previous run's item times: the long ones go out first
                _start_prefetcher(
                    prefetcher, todo, only, profile, options, executor, progress, ran_fn, last, _started(sanitizing)
                )
            if options.prefetcher is not None and prefetcher is not options.prefetcher:
                t0 = time.perf_counter()
                options.prefetcher.close()  # started ahead, not needed: fewer than two items to run ahead
                phases.append(("close unused workers", t0, time.perf_counter()))
            for contract in todo:
                if only and not any(selected(it["id"], only) for it in contract.items):
                    continue
                entry = check_contract(
                    contract,
                    device=device,
                    only=only,
                    profile=profile,
                    seed=seed,
                    progress=progress,
                    options=options,
                    executor=executor,
                    failures=failures,
                    prefetcher=prefetcher,
                    ran=ran_fn,
                )
                contracts.append(entry)
                if "interrupted" in entry:
                    interrupted = True
                    break
                if "stopped" in entry:
                    stopped = True
                    break
    except (KeyboardInterrupt, cancel.StopRequested) as e:
        interrupted, reason = True, getattr(e, "reason", None)
    finally:
        t0 = time.perf_counter()
        for held in (prefetcher, options.prefetcher, executor):  # all signalled first: their ends overlap
            getattr(held, "signal_stop", lambda: None)()
        if prefetcher is not None:
            prefetcher.close()
        if options.prefetcher is not None and options.prefetcher is not prefetcher:  # a stop before it was decided
            options.prefetcher.close()
        executor.close()
        scope.close()
        phases.append(("close workers", t0, time.perf_counter()))
        if sanitizing is not None and sanitizing.ended is not None:
            phases.append(("sanitizer plan", sanitizing.began, sanitizing.ended))
    if interrupted:
        reason = reason or cancel.stop_requested() or "SIGINT"
        if prefetcher is not None and options.log:
            _log_finished_ahead(todo, contracts, prefetcher, options.log, device, seed)
    if options.timeline:
        workers = options.prefetcher or prefetcher
        starts = [*(workers.starts() if isinstance(workers, Prefetcher) else []), *_executor_starts(executor)]
        write_timeline(options.timeline, [*events, *_plan_lanes(sanitizing)], phases, starts)
    record_seconds(device, profile, contracts)  # for the next run's order (obligations.runorder)
    summary = summarize(contracts)
    project = Path(todo[0].path).resolve().parent if todo else Path.cwd()
    result = {
        "format": EVIDENCE_FORMAT,
        "tool": {"name": "kernel-contracts", "version": __version__},
        "provenance": {
            **provenance(device_info or {"kind": device}, started, argv, project=project),
            "profile": profile,
            "seed": seed,
        },
        "contracts": contracts,
        "summary": summary,
        "exit_code": STOP_SIGNALS.get(reason or "", EXIT_INTERRUPTED) if interrupted else exit_code(summary, strict),
    }
    if interrupted:
        result["interrupted"] = True
        result["signal"] = reason
    if stopped:
        result["stopped"] = f"--maxfail {options.maxfail} reached"
    if isinstance(prefetcher, ClusterRunner):
        result["provenance"]["cluster"] = {"spec": str(prefetcher.spec), "workers": prefetcher.workers}
    workers = options.prefetcher or prefetcher  # the one started ahead counts where it was closed unused too
    started = getattr(executor, "started", 0) + (workers.started if isinstance(workers, Prefetcher) else 0)
    if started:
        result["provenance"]["workers_started"] = started
    return result


class _LogOnce:
    """The results log of a cluster run: each item's record once, whichever thread writes it first (the one that
    heard it land, the in-order run, or the stop's)."""

    def __init__(self, log: Callable[[Contract, dict[str, Any]], None]):
        self._log = log
        self._done: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def __call__(self, contract: Contract, record: dict[str, Any]) -> None:
        key = item_key(contract, record["id"])
        with self._lock:
            if key not in self._done:
                self._log(contract, record)
                self._done.add(key)


def _log_landed(
    log: _LogOnce, device: str, seed: int, contract: Contract, item: dict[str, Any], fields: Any, seconds: float
) -> None:
    log(contract, _record(contract, item, fields, device, seed, seconds))


def _log_finished_ahead(
    todo: list[Contract],
    contracts: list[dict[str, Any]],
    prefetcher: RunsAhead,
    log: Callable[[Contract, dict[str, Any]], None],
    device: str,
    seed: int,
) -> None:
    """Log the records of items the workers finished ahead of a stopped run, so that --resume reuses them."""
    have = {(c["path"], c["sha256"], it["id"]) for c in contracts for it in c["items"]}
    for contract in todo:
        for item in contract.items:
            key = item_key(contract, item["id"])
            if key in prefetcher.finished and key not in have:
                fields, seconds = prefetcher.finished[key]
                log(contract, _record(contract, item, fields, device, seed, seconds))


def _started(sanitizing: PlanRun | None) -> frozenset[str]:
    """The shared jobs (by method) the run runs itself: their items only wait, so they all go last."""
    return frozenset({"sanitize"}) if sanitizing is not None else frozenset()


def _start_sanitize_plan(plan: dict[str, Any], options: RunOptions) -> PlanRun | None:
    """Start the run's sanitizer plan from the run itself where its GPUs are this host's (one GPU, ``-j``, a local
    cluster): from the first moment, spread over those GPUs, holding no worker thread. On a scheduler's workers
    (other hosts) the first sanitize item to start runs it on its worker's GPU, as without this; so does every run
    where the tool is not on PATH (the items then say so)."""
    if options.cluster and parse_cluster(options.cluster).kind != "local":
        return None
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        return None
    return start_plan(Path(os.environ[RUN_ENV]), plan, exe, visible_gpus())


def _to_run(
    todo: list[Contract], only: list[str] | None, done: Mapping[tuple[str, str, str], Any]
) -> Iterator[tuple[Contract, dict[str, Any]]]:
    """(contract, item) of every item this run checks: selected by ``only`` and not resumed from ``done``."""
    for c in todo:
        for it in c.items:
            if (not only or selected(it["id"], only)) and (c.id, c.sha256, it["id"]) not in done:
                yield c, it


def _worth_workers(todo: list[Contract], only: list[str] | None, options: RunOptions) -> bool:
    """Whether workers can overlap anything: at least two items to run besides the measure items (a worker's
    start costs about a second; one item is the run's own anyway)."""
    runs = (1 for _, it in _to_run(todo, only, options.done) if item_method(it) not in QUIET_METHODS)
    return next(runs, 0) + next(runs, 0) >= 2


def _witness_source(
    contract: Contract,
    item: dict[str, Any],
    position: Mapping[tuple[str, str, str], int],
    done: Mapping[tuple[str, str, str], Any],
    only: list[str] | None,
) -> tuple[str, str, str] | None:
    """The key of the regimes item whose witnesses ``item`` gets in order (checked earlier in this run), or None."""
    rid = item.get("witnesses")
    if not rid:
        return None
    dep = item_key(contract, str(rid))
    if (contract.id, contract.sha256, str(rid)) in done:
        return dep if not only or selected(str(rid), only) else None
    return dep if position.get(dep, len(position)) < position[item_key(contract, item["id"])] else None


def _submitter(
    runner: RunsAhead,
    todo: list[Contract],
    only: list[str] | None,
    profile: str,
    options: RunOptions,
    wanted: list[tuple[Contract, dict[str, Any]]],
) -> Callable[[list[tuple[Contract, dict[str, Any]]]], None]:
    """Publish the resumed records to ``runner`` (they still hand out witnesses); a function that submits items."""
    position = {item_key(c, it["id"]): n for n, (c, it) in enumerate(wanted)}
    for (cid, sha, item_id), record in options.done.items():
        for c in todo:
            if (c.id, c.sha256) == (cid, sha):
                runner.publish(item_key(c, item_id), record)

    def submit(group: list[tuple[Contract, dict[str, Any]]]) -> None:
        for contract, item in group:
            after = _witness_source(contract, item, position, options.done, only)
            runner.submit(contract, item, item_timeout(item, profile, options.item_timeout), after)

    return submit


def _work_order(
    wanted: list[tuple[Contract, dict[str, Any]]], last: Mapping[str, float], started: frozenset[str] = frozenset()
) -> tuple[list[tuple[Contract, dict[str, Any]]], list[tuple[Contract, dict[str, Any]]]]:
    """(the measure items, every other item in the order it goes out): the host-only items (whose regimes
    witnesses later items wait for) then the rest, each group longest first by ``last`` (the previous run's seconds
    by item name, obligations.runorder), a shared job's waiting items after the others (all of its items where the
    run has ``started`` the job itself)."""

    def ordered(group: list[tuple[Contract, dict[str, Any]]]) -> list[tuple[Contract, dict[str, Any]]]:
        return longest_first(group, lambda ci: item_name(ci[0].id, ci[1]["id"]), last)

    quiet = [(c, it) for c, it in wanted if item_method(it) in QUIET_METHODS]
    host = ordered([(c, it) for c, it in wanted if item_method(it) in HOST_METHODS])
    rest = ordered([(c, it) for c, it in wanted if item_method(it) not in QUIET_METHODS | HOST_METHODS])
    rest = shared_last(rest, lambda ci: item_method(ci[1]) if item_method(ci[1]) in SHARED_METHODS else None, started)
    return quiet, [*host, *rest]


def _cluster_order(
    wanted: list[tuple[Contract, dict[str, Any]]], last: Mapping[str, float], started: frozenset[str] = frozenset()
) -> tuple[list[tuple[Contract, dict[str, Any]]], list[tuple[Contract, dict[str, Any]]]]:
    """(the measure items, every other item in the order it goes to a cluster): all of them longest first by
    ``last``, a regimes item counted with its longest item that waits for its witnesses, a shared job's waiting
    items after the others. Unlike :func:`_work_order` no host-only group goes first: the cluster runner holds an
    item that waits for witnesses back without a thread, while on one GPU it would hold a worker. The host group
    first put the 22-s sanitizer batch behind 14 s of cold proofs on a 2 x H200 run (5a897d5): it ended the
    run's worker phase."""
    name = lambda ci: item_name(ci[0].id, ci[1]["id"])  # noqa: E731
    waits: dict[str, float] = {}  # regimes item name -> its longest dependent's seconds
    for c, it in wanted:
        if it.get("witnesses"):
            source = item_name(c.id, str(it["witnesses"]))
            waits[source] = max(waits.get(source, 0.0), last.get(name((c, it)), 0.0))
    seconds = {**last, **{k: last.get(k, 0.0) + v for k, v in waits.items() if k in last}}
    quiet = [(c, it) for c, it in wanted if item_method(it) in QUIET_METHODS]
    others = longest_first([ci for ci in wanted if item_method(ci[1]) not in QUIET_METHODS], name, seconds)
    others = shared_last(
        others, lambda ci: item_method(ci[1]) if item_method(ci[1]) in SHARED_METHODS else None, started
    )
    return quiet, others


def _start_cluster(
    runner: ClusterRunner,
    todo: list[Contract],
    only: list[str] | None,
    profile: str,
    options: RunOptions,
    last: Mapping[str, float] | None = None,
    started: frozenset[str] = frozenset(),
) -> None:
    """Send every item the run checks to the cluster in :func:`_cluster_order` (the runner sends the measure
    items last, each alone on its GPU); ``started``: the shared jobs the run runs itself."""
    wanted = list(_to_run(todo, only, options.done))
    quiet, others = _cluster_order(wanted, last or {}, started)
    # longest first: the GPUs share the measure phase, and a long item last on one of them would be its tail alone
    quiet = longest_first(quiet, lambda ci: item_name(ci[0].id, ci[1]["id"]), last or {})
    _submitter(runner, todo, only, profile, options, wanted)([*others, *quiet])
    runner.seal()


def _start_prefetcher(
    prefetcher: Prefetcher,
    todo: list[Contract],
    only: list[str] | None,
    profile: str,
    options: RunOptions,
    executor: Executor,
    progress: ProgressFn | None,
    ran: Callable[[tuple[str, str, str], str, float, float], None] | None,
    last: Mapping[str, float] | None = None,
    started: frozenset[str] = frozenset(),
) -> None:
    """Give the run's items to ``prefetcher``'s workers; the measure items run last, alone on a quiet machine.

    Every other item is queued first, each group longest first by ``last`` (the previous run's seconds by item
    name, obligations.runorder; the host-only items, whose regimes witnesses later items wait for, as an earlier
    group). Once the workers have finished them all, a thread of the run times the measure items one by one in the
    run's own executor, which the in-order run uses for the items no worker has started (``prefetcher.own``, in
    turn): nothing runs beside them. A proof run beside them moved a verdict: a host-bound timing (the
    thin GEMM's wrapper overhead: one Python call per ~10 us GEMM) read 1.014-1.016 of the raw call while cold
    proofs ran on the other CPUs and 1.001 with the proofs cached (H100, 2026-11-27). Last rather than first: on a
    fresh machine the workers have compiled the kernels the measure items share with the others by then (a cold
    run timed 30 s of compiling alone, first), and the workers start while the run has nothing else to do. A stop
    propagates.
    """
    wanted = list(_to_run(todo, only, options.done))
    submit = _submitter(prefetcher, todo, only, profile, options, wanted)
    quiet, others = _work_order(wanted, last or {}, started)
    if quiet:
        for contract, item in quiet:
            prefetcher.defer(contract, item)
        if progress:
            progress("note", {"text": f"{len(quiet)} measure item(s) are timed last, with nothing beside them"})
    submit(others)
    if quiet and isinstance(executor, WorkerPool):  # in process: its time limit is the main thread's signal
        prefetcher.lend(executor)
    if quiet:
        threading.Thread(
            target=_measure_last,
            args=(prefetcher, quiet, executor, profile, options, ran),
            name="kc-measure",
            daemon=True,
        ).start()


def _measure_last(
    prefetcher: Prefetcher,
    quiet: list[tuple[Contract, dict[str, Any]]],
    executor: Executor,
    profile: str,
    options: RunOptions,
    ran: Callable[[tuple[str, str, str], str, float, float], None] | None,
) -> None:
    """Once the workers are idle, time ``quiet`` one by one in ``executor`` and hand each record to the run."""
    if not prefetcher.wait_idle():
        return  # stopped: close() gives the waiting run each item's stop record
    with prefetcher.own:  # the run finishes the item it runs itself first
        _time_each(prefetcher, quiet, executor, profile, options, ran)


def _time_each(
    prefetcher: Prefetcher,
    quiet: list[tuple[Contract, dict[str, Any]]],
    executor: Executor,
    profile: str,
    options: RunOptions,
    ran: Callable[[tuple[str, str, str], str, float, float], None] | None,
) -> None:
    from falsification.measure import Shared

    shared = Shared()  # this run's measurements: an item asking for one already made reuses it (FALSIFY-CUBLAS-009)
    for contract, item in quiet:
        key = item_key(contract, item["id"])
        t0 = time.perf_counter()
        fields = shared.reuse(item)
        if fields is None:
            try:
                fields = executor.run(contract, item, item_timeout(item, profile, options.item_timeout), {})
            except BaseException as e:  # a bug in the executor: the item says so, the run goes on
                fields = error(f"{type(e).__name__}: {e}").to_json()
            shared.keep(f"{contract.id}:{item['id']}", item, fields)
        t1 = time.perf_counter()
        if cancel.stop_requested() is not None:
            return
        if ran is not None:
            ran(key, "run", t0, t1)
        prefetcher.done(key, fields, round(executor.seconds(t1 - t0), 4))


def _executor_starts(executor: Executor) -> list[tuple[str, float, float]]:
    """(lane, spawned, ready) of the run's own worker processes (an in-process executor has none)."""
    return [(RUN_WORKER_LANE, t0, t1) for t0, t1 in getattr(executor, "starts", []) if t1 is not None]


# The lane of the run's own worker process's starts (its items are on the "run" lane, its start overlaps the loading)
RUN_WORKER_LANE = "run worker"


def _plan_lanes(plan: PlanRun | None) -> list[tuple[tuple[str, str, str], str, float, float]]:
    """The timeline's events of the run's sanitizer plan: each tool process on a lane of its own, named with its GPU."""
    if plan is None:
        return []
    lanes = []
    for spec, t0, t1 in list(plan.spans):
        where = f" on GPU {spec['device']}" if spec.get("device") is not None else ""
        what = f"{spec['tool']}: {len(spec['workloads'])} workloads{where}"
        lanes.append((("", "", what), f"sanitize {spec['name']}", t0, t1))
    return lanes


def write_timeline(
    path: str | Path,
    events: list[tuple[tuple[str, str, str], str, float, float]],
    phases: Iterable[tuple[str, float, float]] = (),
    starts: Iterable[tuple[str, float, float]] = (),
) -> None:
    """Write where and when each item ran as a Chrome trace (chrome://tracing, Perfetto): one row per lane.

    ``phases`` (name, start, end) are the run's own steps (load contracts, close workers) on the "run" lane and
    ``starts`` (lane, spawned, ready) each worker process's start on its lane; all times are perf_counter seconds,
    shown from the earliest of them all."""
    from obligations.atomic import write_text_atomic

    phases, starts = list(phases), list(starts)
    events = [
        *events,
        *((("", "", name), "run", t0, t1) for name, t0, t1 in phases),
        *((("", "", "start worker"), lane, t0, t1) for lane, t0, t1 in starts),
    ]
    origin = min((e[2] for e in events), default=0.0)
    lanes = sorted({lane for _, lane, _, _ in events}, key=lambda n: (n != "run", len(n), n))
    tid = {lane: n for n, lane in enumerate(lanes)}
    trace: list[dict[str, Any]] = [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid[lane], "args": {"name": lane}} for lane in lanes
    ]
    trace += [
        {
            "name": item_id,
            "cat": Path(path_).stem if path_ else "kc",  # an item's contract, or kc's own start-up and end
            "ph": "X",
            "pid": 1,
            "tid": tid[lane],
            "ts": round((t0 - origin) * 1e6),
            "dur": round((t1 - t0) * 1e6),
        }
        for (path_, _sha, item_id), lane, t0, t1 in events
    ]
    write_text_atomic(path, json.dumps({"traceEvents": trace, "displayTimeUnit": "ms"}) + "\n")


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by the string JSON readers expect ("NaN", "Infinity")."""
    if isinstance(value, float | np.floating) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def result_json(result: dict[str, Any]) -> str:
    """The result as strict JSON text (RFC 8259: no bare NaN or Infinity; those become strings)."""
    return json.dumps(_finite(result), indent=2, allow_nan=False, default=str) + "\n"
