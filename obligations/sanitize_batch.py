"""One ``compute-sanitizer`` process per tool for all of a run's sanitize workloads, each report attributed to the
workload it came from.

A tool process runs ``python -m native.workloads --marker TOKEN --run A --run B ...``: the workloads one after
another, each between a ``begin`` and an ``end`` line printed (flushed, after a device synchronise) to the stdout
the sanitizer prints its reports to, so a report between a workload's two lines is that workload's
(:func:`attribute`). Every report must be placed: one outside any workload's lines, a summary that counts more
errors than were attributed, a missing summary or an unexpected exit leave every workload without an error of its
own ``error`` (no verdict), never passed. A workload that raises is reported for that workload and the next one
runs; where the process ends early (a crash, the time limit, a destroyed CUDA context) the workloads it had not
finished are ``error`` with the reason.

A **plan** (``plan.json`` in a directory) names the workloads, the tools each needs and the processes that run them.
``kc check --device cuda`` makes a run-scoped directory (:func:`run_scope`, named by :data:`RUN_ENV` in the
environment its worker processes inherit) and writes the run's plan there (:func:`share`). The first sanitize item
that starts takes the plan's lock (``fcntl.flock``) and runs every process of the plan (:func:`run_plan`), writing
each process's per-workload verdicts as it ends; the other items wait for the processes that cover their workload
and read their verdicts (:func:`verdicts_for`). An item whose workload is in no plan (``--only X-SANITIZE``, tests)
runs a plan of its own workload alone, as it always did.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from native.workloads import MARKER, workload_start
from obligations.core import cancel

__all__ = [
    "TOOLS",
    "RUN_ENV",
    "SHARDS_ENV",
    "DEFAULT_SHARDS",
    "SHARE_ENV",
    "ERROR_EXIT",
    "make_plan",
    "write_plan",
    "read_plan",
    "run_scope",
    "share",
    "run_plan",
    "assign_devices",
    "start_plan",
    "PlanRun",
    "PROCESS_START_S",
    "attribute",
    "verdicts_for",
    "parallel_processes",
    "tool_command",
    "last_seconds",
    "plan_seconds",
]

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
# The run-scoped directory of ``kc check``: its plan and the verdicts of the plan's processes.
RUN_ENV = "KC_SANITIZE_RUN"
# Processes per tool (default 1): the workloads of a tool split over this many processes, for a tool whose one
# process would take longer than the run's other items.
SHARDS_ENV = "KC_SANITIZE_SHARDS"
# "0": no shared plan, every sanitize item runs its workload in processes of its own (as before the plans).
SHARE_ENV = "KC_SANITIZE_SHARE"
ERROR_EXIT = 86
PRINT_LIMIT = 1000  # reports printed per process: past it a report is counted, not printed, so none is placed
TIMEOUT_S = 600.0  # seconds one tool process may take
_POLL_S = 0.2

# memcheck/initcheck/synccheck: "ERROR SUMMARY: 0 errors"; racecheck: "RACECHECK SUMMARY: 0 hazards displayed
# (0 errors, 0 warnings)".
_SUMMARY = re.compile(r"ERROR SUMMARY:\s+(\d+)\s+error|RACECHECK SUMMARY:[^(]*\((\d+)\s+error")
# A sanitizer line: its prefix (nine '=' by default; eight in some copies of the manual), a space, the text; a
# report's first line starts at once, its further lines are indented, an empty text separates reports.
_LINE = re.compile(r"^={8,}(?: (.*))?$")
# Lines of the tool's own that report no error: its banner, the summaries, the exit-code note.
_BENIGN = re.compile(
    r"^(COMPUTE-SANITIZER\b|ERROR SUMMARY:|RACECHECK SUMMARY:|LEAK SUMMARY:|Target application returned)"
)
# Reports of a lower severity than error (racecheck's analysis "WARNING: Race reported ...", INFO hazards).
_NOT_ERROR = re.compile(r"^(warning|info)\b", re.IGNORECASE)
# Tools whose device errors end the CUDA context unless told to end only the kernel (the manual's error actions).
_KERNEL_ONLY = ("memcheck", "synccheck")


def parallel_processes(n: int) -> int:
    """How many tool processes run at once: all where the machine has a core for each, else fewer (at least 1)."""
    return max(1, min(n, (os.cpu_count() or 1) - 1))


# Processes per tool when SHARDS_ENV does not say: on an H200 (2026-11-27, 16 workloads) one process per tool took
# memcheck 19.8 s, racecheck 32.9 s (attention alone 9.3 s), initcheck 22.1 s, synccheck 19.4 s, the batch the
# run's longest item; split by last run's seconds, each part is near the 3.5-5 s floor of a process plus its share.
DEFAULT_SHARDS: dict[str, int] = {"memcheck": 2, "racecheck": 3, "initcheck": 2, "synccheck": 2}


def _shards(tool: str) -> int:
    """Processes for ``tool`` from :data:`SHARDS_ENV`: ``N`` (every tool) or ``racecheck=3,memcheck=2`` (1 for a tool
    it does not name); unset, :data:`DEFAULT_SHARDS` (1 for a tool not there)."""
    raw = os.environ.get(SHARDS_ENV, "").strip()
    if not raw:
        return DEFAULT_SHARDS.get(tool, 1)
    for part in filter(None, (x.strip() for x in raw.split(","))):
        name, _, n = part.rpartition("=")
        if name in ("", tool) and n.isdigit():
            return max(1, int(n))
    return 1


def _split(names: list[str], n: int, weight: Mapping[str, float]) -> list[list[str]]:
    """``names`` in ``n`` parts of about equal weight (longest first, each to the lightest part; an unknown weight
    counts as the mean of the known ones), each part in the given order. Workloads that start the same runtime
    (native.workloads.workload_start) go to one part together: its start is paid once a tool, not once a part."""
    known = [weight[w] for w in names if w in weight]
    guess = sum(known) / len(known) if known else 1.0
    groups: dict[str, list[str]] = {}
    for w in names:
        groups.setdefault(workload_start(w) or f"workload:{w}", []).append(w)
    loads = [0.0] * min(n, len(groups))
    part_of: dict[str, int] = {}
    for group in sorted(groups.values(), key=lambda g: -sum(weight.get(w, guess) for w in g)):
        k = loads.index(min(loads))
        loads[k] += sum(weight.get(w, guess) for w in group)
        part_of.update(dict.fromkeys(group, k))
    return [[w for w in names if part_of[w] == k] for k in range(len(loads))]


def make_plan(
    units: Mapping[str, Mapping[str, Sequence[str]]],
    shards: int | None = None,
    timeout_s: float = TIMEOUT_S,
    seconds: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, Any]:
    """A plan for ``units`` (workload -> {"tools": [...], "modules": [...]}): per tool, its workloads in ``shards``
    processes (default :data:`SHARDS_ENV`, else one) of about equal time by ``seconds`` (tool -> workload -> the
    seconds it took last time, :func:`last_seconds`)."""
    processes = []
    for tool in TOOLS + tuple(sorted({t for u in units.values() for t in u["tools"]} - set(TOOLS))):
        names = [w for w, u in units.items() if tool in u["tools"]]
        parts = _split(names, shards or _shards(tool), (seconds or {}).get(tool) or {})
        for k, part in enumerate(parts):
            processes.append({"name": tool if len(parts) == 1 else f"{tool}#{k}", "tool": tool, "workloads": part})
    return {
        "id": secrets.token_hex(6),
        "units": {w: {"tools": list(u["tools"]), "modules": list(u.get("modules") or ())} for w, u in units.items()},
        "processes": processes,
        "timeout_s": timeout_s,
    }


def _seconds_path() -> Path | None:
    from obligations.runorder import durations_path

    path = durations_path()
    return path.with_name("sanitize-seconds.json") if path is not None else None


def last_seconds() -> dict[str, dict[str, float]]:
    """tool -> workload -> the seconds it took in the last run that ran it (beside the run order's durations)."""
    path = _seconds_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path is not None else {}
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: the workloads are split by count
    return data if isinstance(data, dict) else {}


def plan_seconds() -> dict[str, dict[str, float]]:
    """What a plan splits by: tool -> workload -> this machine's last seconds, else the shipped reference run's."""
    from obligations.runorder import shipped_sanitize_seconds

    mine, shipped = last_seconds(), shipped_sanitize_seconds()
    return {tool: {**shipped.get(tool, {}), **mine.get(tool, {})} for tool in {*mine, *shipped}}


def _record_seconds(results: Iterable[Mapping[str, Any]]) -> None:
    """Keep each workload's seconds under each tool of these process results, for the next plan's split."""
    from obligations.atomic import write_text_atomic

    path = _seconds_path()
    if path is None:
        return
    data = last_seconds()
    for r in results:
        for w, v in r["workloads"].items():
            if isinstance(v.get("seconds"), int | float):
                data.setdefault(r["tool"], {})[w] = v["seconds"]
    with contextlib.suppress(OSError):
        write_text_atomic(path, json.dumps(data, sort_keys=True) + "\n")


def write_plan(where: Path, plan: Mapping[str, Any]) -> None:
    """Write ``plan`` to ``where/plan.json`` (atomically: items may read it while it is replaced)."""
    tmp = where / f".plan.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(plan, sort_keys=True), encoding="utf-8")
    os.replace(tmp, where / "plan.json")


def read_plan(where: Path | None) -> dict[str, Any] | None:
    """The plan in ``where`` (None: none, or unreadable: the item runs its workload alone)."""
    if where is None:
        return None
    try:
        return json.loads((where / "plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def run_scope() -> Iterator[Path]:
    """A run-scoped directory named by :data:`RUN_ENV` for this process and the workers it starts; removed (and the
    variable restored) at the end. Nested, the outer one is kept."""
    if os.environ.get(RUN_ENV):
        yield Path(os.environ[RUN_ENV])
        return
    where = Path(tempfile.mkdtemp(prefix="kc-sanitize-"))
    os.environ[RUN_ENV] = str(where)
    try:
        yield where
    finally:
        os.environ.pop(RUN_ENV, None)
        shutil.rmtree(where, ignore_errors=True)


def share(items: Iterable[Mapping[str, Any]], default_workload: Iterable[str]) -> dict[str, Any] | None:
    """Write the plan of a run's sanitize ``items`` (their params) to the run's directory where there are two or
    more (one runs alone, as without a plan); ``default_workload`` gives each item's family (the workload an item
    names no other). Returns the plan, or None where there is none."""
    where = os.environ.get(RUN_ENV)
    units: dict[str, dict[str, list[str]]] = {}
    count = 0
    for item, family in zip(items, default_workload, strict=True):
        params = item.get("params") or {}
        unit = units.setdefault(params.get("workload") or family, {"tools": [], "modules": []})
        unit["tools"] += [t for t in params.get("tools") or TOOLS if t not in unit["tools"]]
        unit["modules"] += [m for m in params.get("modules") or () if m not in unit["modules"]]
        count += 1
    if where is None or count < 2 or os.environ.get(SHARE_ENV, "").strip() == "0":
        return None
    plan = make_plan(units, seconds=plan_seconds())
    write_plan(Path(where), plan)
    return plan


def tool_command(exe: str, tool: str, workloads: Sequence[str], modules: Sequence[str], token: str) -> list[str]:
    """The command of one tool process over ``workloads`` (in order, bracketed by lines with ``token``)."""
    # Line-buffered where stdbuf exists: a tool that buffered its stdout into the pipe would print a report after
    # the marker lines that follow it (a report outside every workload's lines, or in a later one's).
    stdbuf = shutil.which("stdbuf")
    cmd = [stdbuf, "-oL", "-eL"] if stdbuf else []
    cmd += [exe, "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", str(PRINT_LIMIT)]
    if tool in _KERNEL_ONLY:  # a workload's device error ends its kernel, not the context the next workloads use
        cmd += ["--destroy-on-device-error", "kernel"]
    cmd += [sys.executable, "-m", "native.workloads", "--marker", token]
    cmd += [arg for w in workloads for arg in ("--run", w)]
    return cmd + [arg for m in modules for arg in ("--module", m)]


def _verdict(errors: int | None, exit: Any, seconds: float | None, lines: list[str], reason: str = "") -> dict:
    # the first report whole (its kind, kernel, thread, address) and the end (an exception's message)
    tail = lines if len(lines) <= 20 else [*lines[:14], f"... ({len(lines) - 20} lines)", *lines[-6:]]
    out: dict[str, Any] = {"errors": errors, "exit": exit, "seconds": seconds, "tail": tail}
    if reason:
        out["reason"] = reason
    return out


def attribute(
    lines: Sequence[str], token: str, workloads: Sequence[str], exit: int | str, seconds: float = 0.0
) -> dict[str, dict[str, Any]]:
    """Each workload's verdict from one tool process's output ``lines`` (its stdout and stderr in order), run over
    ``workloads`` with marker ``token``, that ended with ``exit`` (its status, or "timeout" after ``seconds``).

    A verdict is ``errors`` (the error reports between the workload's marker lines; None where none can be trusted),
    ``exit`` (0; :data:`ERROR_EXIT` with errors; or why there is no verdict: "raised", "died", "timeout", "not run",
    "unattributed"), ``seconds`` (the workload's own), ``tail`` (its lines) and ``reason``. A workload with no
    report of its own passes only where every error the summary counts was placed in some workload's lines."""
    marker = re.compile(rf"{re.escape(MARKER)} {re.escape(token)} (begin|end|abort) (\S+)(?: (.*))?$")
    sections: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    outside = 0  # error reports between workloads, before the first or after the last
    counted: int | None = None  # the error count of the tool's summary line
    abort = last_ended = ""
    for raw in lines:
        line = raw.rstrip("\n")
        m = marker.search(line)
        if m:
            what, name, rest = m.group(1), m.group(2), m.group(3) or ""
            if what == "begin":
                current = sections.setdefault(name, {"errors": 0, "lines": [], "end": None})
            elif what == "end" and current is not None:
                current["end"], last_ended, current = rest, name, None
            elif what == "abort":
                abort, current = f"workload {name}: {rest}", None
            continue
        s = _LINE.match(line)
        text = s.group(1) or "" if s else ""
        if s and (summary := _SUMMARY.search(text)):
            counted = (counted or 0) + int(summary.group(1) or summary.group(2))
            continue
        if current is not None and line.strip() and not (s and _BENIGN.match(text)):
            current["lines"].append(line)  # its reports and its own output (a traceback) make its tail
        # a report's first line starts at once after the prefix; its further lines are indented
        if s and text.strip() and not text[0].isspace() and not _BENIGN.match(text) and not _NOT_ERROR.match(text):
            if current is not None:
                current["errors"] += 1
            else:
                outside += 1
    if len(workloads) == 1 and workloads[0] in sections:  # a process of one workload: every report is its own
        sections[workloads[0]]["errors"] += outside
        outside = 0
    if counted == 0:  # the tool counts no error: a line taken for a report's first line was none (a note of its own)
        outside = 0
        for sec in sections.values():
            sec["errors"] = 0
    attributed = outside + sum(sec["errors"] for sec in sections.values())
    finished = all(sec["end"] is not None for sec in sections.values()) and len(sections) == len(workloads)
    # Why a workload without a report of its own has no verdict either: the process could not vouch for it.
    doubt = ""
    if outside:
        doubt = f"{outside} error report(s) outside any workload's lines"
    elif counted is not None and counted > attributed:
        doubt = f"the summary counts {counted} error(s), {attributed} were placed in workloads' lines"
    elif finished and counted is None:
        doubt = f"the sanitizer printed no error summary (exit {exit})"
    elif finished and (exit not in (0, ERROR_EXIT) or (exit == ERROR_EXIT and not attributed)):
        doubt = f"the sanitizer process exited with {exit} after its last workload"
    out: dict[str, dict[str, Any]] = {}
    stopped = (
        f"not run: the process stopped after {abort}"
        if abort
        else f"not run: the sanitizer process passed its limit of {seconds:g} s before this workload"
        if exit == "timeout"
        else f"not run: the sanitizer process ended (exit {exit}) "
        + (f"after workload {last_ended}" if last_ended else "before its first workload")
    )
    for name in workloads:
        sec = sections.get(name)
        if sec is None:
            out[name] = _verdict(None, "not run", None, [], stopped)
            continue
        tail, errors = sec["lines"], sec["errors"] or None
        if sec["end"] is None:  # the process ended inside this workload
            how = "timeout" if exit == "timeout" else "died"
            why = (
                f"the sanitizer process passed its limit of {seconds:g} s in this workload"
                if how == "timeout"
                else f"the sanitizer process ended (exit {exit}) in this workload"
            )
            out[name] = _verdict(errors, how, None, tail, why)
            stopped = "not run: " + why.replace("this workload", f"workload {name}")
            continue
        took, _, status = sec["end"].partition(" ")
        took_s = float(took) if re.fullmatch(r"[0-9.]+", took) else None
        if status.startswith("raised"):
            out[name] = _verdict(errors, "raised", took_s, tail, f"the workload {status}")
        elif errors:
            out[name] = _verdict(errors, ERROR_EXIT, took_s, tail)
        elif doubt:
            out[name] = _verdict(None, "unattributed", took_s, tail, doubt)
        else:
            out[name] = _verdict(0, 0, took_s, tail)
    return out


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = entry.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill_tree(proc: subprocess.Popen[str]) -> None:
    for pid in [*_descendants(proc.pid), proc.pid]:  # the sanitizer's front end and the workload process it runs
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _run_process(
    exe: str,
    spec: Mapping[str, Any],
    modules: Sequence[str],
    timeout_s: float,
    log: Path,
    live: set[subprocess.Popen[str]] | None = None,
) -> dict:
    """Run one tool process of a plan; its per-workload verdicts (:func:`attribute`), exit and wall seconds. While it
    runs it is in ``live`` (for whoever must stop it)."""
    live = live if live is not None else set()
    token = secrets.token_hex(8)
    cmd = tool_command(exe, spec["tool"], spec["workloads"], modules, token)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the workloads import what this process does
    if spec.get("device") is not None:  # the GPU the run gave this process (assign_devices)
        env["CUDA_VISIBLE_DEVICES"] = str(spec["device"])
    t0 = time.monotonic()
    lines: list[str] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=env)
    live.add(proc)
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        try:
            code: int | str = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            proc.wait()
            code = "timeout"
        reader.join(timeout=10)
    finally:
        live.discard(proc)
        if proc.poll() is None:  # the item stopped (its limit, a stop): its processes go with it
            _kill_tree(proc)
            proc.wait()
    seconds = round(time.monotonic() - t0, 2)
    with contextlib.suppress(OSError):
        log.write_text("".join(lines), encoding="utf-8")
    return {
        "name": spec["name"],
        "tool": spec["tool"],
        "exit": code,
        "seconds": seconds,
        "workloads": attribute(lines, token, spec["workloads"], code, timeout_s if code == "timeout" else seconds),
        "tail": [ln.rstrip("\n") for ln in lines[-12:]],
    }


def _done_path(where: Path, plan: Mapping[str, Any], name: str, suffix: str = ".json") -> Path:
    return where / plan["id"] / f"{name.replace('#', '.')}{suffix}"


def run_plan(
    where: Path,
    plan: Mapping[str, Any],
    exe: str,
    live: set[subprocess.Popen[str]] | None = None,
    stopping: threading.Event | None = None,
    spans: list[tuple[dict[str, Any], float, float]] | None = None,
) -> None:
    """Run every process of ``plan`` (at most :func:`parallel_processes` at a time), writing each one's verdicts to
    ``where`` as it ends. Interrupted (the item's limit, a stop), it stops the processes it started; ``live`` holds
    them while they run and ``stopping``, once set, starts no more (a caller in another thread stops the rest).
    ``spans`` gets (process spec, start, end) in perf_counter seconds for each process run (a run's timeline)."""
    (where / plan["id"]).mkdir(parents=True, exist_ok=True)
    modules = sorted({m for u in plan["units"].values() for m in u.get("modules") or ()})
    timeout_s = float(plan["timeout_s"])
    live = live if live is not None else set()

    def one(spec: Mapping[str, Any]) -> None:
        if stopping is not None and stopping.is_set():
            return  # no verdicts: the items waiting for them say the plan's run ended before they came
        log = _done_path(where, plan, spec["name"], ".log")  # the process's whole output, for a look afterwards
        t0 = time.perf_counter()
        result = _run_process(exe, spec, modules, timeout_s, log, live)
        if spans is not None:
            spans.append((dict(spec), t0, time.perf_counter()))
        # A workload whose verdict the shared process could not give (a report it could not place) runs again in a
        # process of its own, where every report is its own: a cost only where some workload has errors.
        for name, verdict in list(result["workloads"].items()):
            if verdict["exit"] == "unattributed":
                alone = {"name": f"{spec['name']}:{name}", "tool": spec["tool"], "workloads": [name]}
                alone |= {"device": spec["device"]} if spec.get("device") is not None else {}
                log = _done_path(where, plan, alone["name"], ".log")
                again = _run_process(exe, alone, modules, timeout_s, log, live)["workloads"][name]
                result["workloads"][name] = again | {"alone": verdict.get("reason", "")}
        target = _done_path(where, plan, spec["name"])
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(result), encoding="utf-8")
        os.replace(tmp, target)

    procs = plan["processes"]
    pool = ThreadPoolExecutor(max_workers=parallel_processes(len(procs)), thread_name_prefix="kc-sanitize")
    try:
        for fut in [pool.submit(one, p) for p in procs]:
            fut.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in list(live):
            _kill_tree(proc)
        raise
    pool.shutdown()
    _record_seconds((_read_done(where, plan, procs) or {}).values())


# Seconds a tool process takes before its first workload (Python, CUDA, the tool's own start): a process's weight
# beyond its workloads' when the run spreads the plan over its GPUs.
PROCESS_START_S = 3.0


def assign_devices(
    plan: Mapping[str, Any], devices: Sequence[str], seconds: Mapping[str, Mapping[str, float]] | None = None
) -> dict[str, Any]:
    """``plan`` with each process given one of ``devices`` (CUDA_VISIBLE_DEVICES entries): longest first (by
    ``seconds``, tool -> workload -> last seconds) to the GPU with the least work so far. No devices: unchanged."""
    if not devices:
        return dict(plan)
    seconds = seconds or {}

    def weight(spec: Mapping[str, Any]) -> float:
        known = seconds.get(spec["tool"]) or {}
        guess = sum(known.values()) / len(known) if known else 1.0
        return PROCESS_START_S + sum(known.get(w, guess) for w in spec["workloads"])

    load = dict.fromkeys(devices, 0.0)
    placed: dict[str, str] = {}
    for spec in sorted(plan["processes"], key=lambda p: -weight(p)):
        device = min(devices, key=lambda d: load[d])  # ties: the first listed
        load[device] += weight(spec)
        placed[spec["name"]] = device
    return {**plan, "processes": [{**p, "device": placed[p["name"]]} for p in plan["processes"]]}


class PlanRun:
    """A plan that the run itself runs in the background (:func:`start_plan`): the sanitize items only wait for
    its verdicts. ``began``/``ended`` (perf_counter) are for the run's timeline."""

    def __init__(self, where: Path, plan: Mapping[str, Any], exe: str, lock: Any) -> None:
        self.where, self.plan, self.exe = where, plan, exe
        self.live: set[subprocess.Popen[str]] = set()
        self.stopping = threading.Event()
        self.began = time.perf_counter()
        self.ended: float | None = None
        self.spans: list[tuple[dict[str, Any], float, float]] = []  # each tool process run: (spec, start, end)
        self._lock = lock
        self._thread = threading.Thread(target=self._run, name="kc-sanitize-plan", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            run_plan(self.where, self.plan, self.exe, self.live, self.stopping, self.spans)
        except Exception:  # noqa: BLE001 (the items waiting for verdicts that never came say the run ended first)
            pass
        finally:
            self.ended = time.perf_counter()
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()

    def stop(self) -> None:
        """End the plan's processes now (a stop, the run's end) and wait for its thread."""
        self.stopping.set()
        deadline = time.monotonic() + 30
        while self._thread.is_alive() and time.monotonic() < deadline:
            for proc in list(self.live):  # again each time: one may have started as the stop came
                _kill_tree(proc)
            self._thread.join(timeout=_POLL_S)


def _mark_started(run_dir: Path) -> bool:
    """Mark the plan of ``run_dir`` started by this process (whose caller holds its lock); False where a run of it
    started before (and ended, or the lock would be held)."""
    if (run_dir / "started").exists():
        return False
    (run_dir / "started").write_text(str(os.getpid()), encoding="utf-8")
    return True


def start_plan(where: Path, plan: Mapping[str, Any], exe: str, devices: Sequence[str] = ()) -> PlanRun | None:
    """Run ``plan`` from the run itself, in the background, as soon as it is written: its processes start beside
    the first items instead of inside one (which held a worker thread for the plan's whole run), spread over
    ``devices``, each process on one (:func:`assign_devices`; the plan file says where each ran). None where an item
    has started it already."""
    run_dir = where / plan["id"]
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = open(run_dir / "lock", "a+")  # noqa: SIM115 (held until the plan's thread ends)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    if not _mark_started(run_dir):
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
        return None
    placed = assign_devices(plan, devices, plan_seconds())
    write_plan(where, placed)
    return PlanRun(where, placed, exe, lock)


def _covering(
    plan: Mapping[str, Any], workload: str, tools: Sequence[str], modules: Sequence[str] = ()
) -> dict[str, dict[str, Any]] | None:
    """tool -> the plan's process that runs ``workload`` under it; None where a tool does not run it (or the plan
    does not import a module the item names)."""
    unit = plan["units"].get(workload)
    if unit is None or not set(modules) <= set(unit.get("modules") or ()):
        return None
    out = {}
    for tool in tools:
        spec = next((p for p in plan["processes"] if p["tool"] == tool and workload in p["workloads"]), None)
        if spec is None:
            return None
        out[tool] = spec
    return out


def _read_done(where: Path, plan: Mapping[str, Any], specs: Iterable[Mapping[str, Any]]) -> dict[str, dict] | None:
    got = {}
    for spec in specs:
        try:
            got[spec["name"]] = json.loads(_done_path(where, plan, spec["name"]).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    return got


def _wait_for(
    where: Path, plan: Mapping[str, Any], covering: Mapping[str, Mapping[str, Any]], exe: str
) -> tuple[dict[str, dict] | None, bool, str]:
    """The results of the processes in ``covering``: run the plan here if no item has started it (the lock is free
    and no start is recorded), else wait for them. (results or None, whether this call ran the plan, why none)."""
    run_dir = where / plan["id"]
    run_dir.mkdir(parents=True, exist_ok=True)
    specs = list(covering.values())
    with open(run_dir / "lock", "a+") as lock:
        while True:
            done = _read_done(where, plan, specs)
            if done is not None:
                return done, False, ""
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another item runs the plan: wait for its processes
                cancel.checkpoint()
                time.sleep(_POLL_S)
                continue
            try:
                done = _read_done(where, plan, specs)
                if done is not None:
                    return done, False, ""
                if not _mark_started(run_dir):  # a run that ended (killed at its limit) without these verdicts
                    return None, False, "the item that ran the run's sanitizer processes ended before they did"
                run_plan(where, plan, exe)
                return _read_done(where, plan, specs), True, ""
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def verdicts_for(
    workload: str, tools: Sequence[str], modules: Sequence[str], exe: str
) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """Each tool's verdict on ``workload`` (as :func:`attribute`) and, where the run's plan ran it with other
    workloads, what was shared: how many workloads, and per tool its process's name, exit and wall seconds."""
    env = os.environ.get(RUN_ENV)
    where = Path(env) if env else None
    plan = read_plan(where)
    covering = _covering(plan, workload, tools, modules) if plan is not None else None
    launched = False
    if where is not None and plan is not None and covering is not None:
        results, launched, why = _wait_for(where, plan, covering, exe)
    else:  # no plan names this workload (a single item, a test): a plan of its own, run here
        with tempfile.TemporaryDirectory(prefix="kc-sanitize-") as tmp:
            where = Path(tmp)
            plan = make_plan({workload: {"tools": list(tools), "modules": list(modules)}}, shards=1)
            covering = _covering(plan, workload, tools, modules) or {}
            run_plan(where, plan, exe)
            results, why = _read_done(where, plan, covering.values()), ""
    if results is None:
        return {t: _verdict(None, "not run", None, [], why) for t in tools}, None
    verdicts = {tool: results[spec["name"]]["workloads"][workload] for tool, spec in covering.items()}
    if len(plan["units"]) < 2:
        return verdicts, None
    shared = {
        "workloads": len(plan["units"]),
        "launched": launched,
        "processes": {
            tool: {k: results[spec["name"]][k] for k in ("name", "exit", "seconds")}
            | {"workloads": len(spec["workloads"])}
            for tool, spec in covering.items()
        },
    }
    return verdicts, shared
