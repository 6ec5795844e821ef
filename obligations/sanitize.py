"""Sanitizer evidence (method ``sanitize``): the family's workload under ``compute-sanitizer`` on the device.

For each tool the item names (default memcheck, racecheck, initcheck, synccheck) the engine runs
``compute-sanitizer --tool TOOL python -m native.workloads --run WORKLOAD`` in a fresh process and
records the tool's verdict: its error count from the ``ERROR SUMMARY`` line and the exit status. Any
error is a violation. The tools run side by side (one process each, at most :func:`parallel_tools` at a
time): each is its own process and CUDA context, so no tool sees another's launches, and an item takes
about its slowest tool's time rather than the sum. Off the device the item is ``skipped (no CUDA
device)``; where the tool is absent, ``skipped`` saying so — never passed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from obligations.core.evidence import SanitizeEvidence
from obligations.core.results import Outcome, error, passed, skipped, violated
from obligations.engines import Engine, Job, register_engine

__all__ = ["SanitizeEngine", "TOOLS", "run_tool", "run_tools", "parallel_tools"]

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
# memcheck/initcheck/synccheck: "ERROR SUMMARY: 0 errors"; racecheck: "RACECHECK SUMMARY: 0 hazards displayed
# (0 errors, 0 warnings)".
_SUMMARY = re.compile(r"ERROR SUMMARY:\s+(\d+)\s+error|RACECHECK SUMMARY:[^(]*\((\d+)\s+error")
_ERROR_EXIT = 86


def run_tool(tool: str, workload: str, modules: tuple[str, ...] = (), timeout_s: float = 600.0) -> dict:
    """Run one sanitizer tool over a workload in a fresh process: errors, exit status, seconds, output tail."""
    exe = shutil.which("compute-sanitizer")
    cmd = [
        exe or "compute-sanitizer",
        "--tool",
        tool,
        "--error-exitcode",
        str(_ERROR_EXIT),
        "--print-limit",
        "20",
        sys.executable,
        "-m",
        "native.workloads",
        "--run",
        workload,
    ]
    cmd += [arg for m in modules for arg in ("--module", m)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=os.environ.copy())
    out = proc.stdout + proc.stderr
    m = _SUMMARY.search(out)
    return {
        "errors": int(m.group(1) or m.group(2)) if m else None,
        "exit": proc.returncode,
        "seconds": round(time.perf_counter() - t0, 2),
        "tail": out.strip().splitlines()[-12:],
    }


def parallel_tools(n_tools: int) -> int:
    """How many tools run at once: all of them where the machine has a core for each, else fewer (at least 1)."""
    return max(1, min(n_tools, (os.cpu_count() or 1) - 1))


def run_tools(tools: tuple[str, ...], workload: str, modules: tuple[str, ...] = ()) -> dict[str, dict]:
    """Each tool's verdict (as :func:`run_tool`, a timeout as exit "timeout"), the tools run side by side."""

    def one(tool: str) -> dict:
        try:
            return run_tool(tool, workload, modules)
        except subprocess.TimeoutExpired:
            return {"errors": None, "exit": "timeout"}

    with ThreadPoolExecutor(max_workers=parallel_tools(len(tools)), thread_name_prefix="kc-sanitize") as pool:
        results = list(pool.map(one, tools))
    return dict(zip(tools, results, strict=True))


@register_engine
class SanitizeEngine(Engine):
    """Run the item's workload under each sanitizer tool; any reported error refutes the item."""

    name = "sanitize"

    def discharge(self, job: Job) -> Outcome:
        """Skipped off the device or without the tool; violated on any sanitizer error."""
        params = job.item.get("params") or {}
        workload = params.get("workload") or job.contract.data["family"]
        tools = tuple(params.get("tools") or TOOLS)
        if job.device != "cuda":
            return skipped(f"runs on cuda (compute-sanitizer); this run is on {job.device}")
        if shutil.which("compute-sanitizer") is None:
            return skipped("compute-sanitizer is not on PATH on this machine")
        verdicts = run_tools(tools, workload, tuple(params.get("modules") or ()))
        evidence = SanitizeEvidence(
            cases=len(tools),
            workload=workload,
            verdicts={t: {k: v for k, v in r.items() if k != "tail"} for t, r in verdicts.items()},
        )
        bad = {t: r for t, r in verdicts.items() if r["errors"] != 0 or r["exit"] != 0}
        if not bad:
            return passed(evidence)
        if all(r["errors"] is None for r in bad.values()):
            return error(
                f"the sanitizer did not report a verdict for {sorted(bad)}",
                evidence,
                output={t: r.get("tail") for t, r in bad.items()},
            )
        return violated(
            {t: {"errors": r["errors"], "exit": r["exit"], "output": r.get("tail")} for t, r in bad.items()},
            f"sanitizer errors: {sorted(bad)}",
            evidence,
        )
