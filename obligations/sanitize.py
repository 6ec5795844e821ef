"""Sanitizer evidence (method ``sanitize``): the family's workload under ``compute-sanitizer`` on the device.

For each tool the item names (default memcheck, racecheck, initcheck, synccheck) the workload runs under
``compute-sanitizer --tool TOOL`` and the engine records the tool's verdict on it: the error reports printed between
the workload's marker lines, and whether it ran to its end. Any error is a violation. A run's sanitize items share
one process per tool that runs all of the run's workloads one after another (obligations.sanitize_batch: the first
item to start runs them, the others read their workload's verdicts; the evidence's ``shared`` says so); an item
alone runs its workload alone. Off the device the item is ``skipped (no CUDA device)``; where the tool is absent,
``skipped`` saying so; a workload that raised, a process that died or passed its limit, or a report that could not be
placed leave the item ``error`` — never passed.
"""

from __future__ import annotations

import shutil
from typing import Any

from obligations.core.evidence import SanitizeEvidence
from obligations.core.results import Outcome, error, passed, skipped, violated
from obligations.engines import Engine, Job, register_engine
from obligations.sanitize_batch import TOOLS, parallel_processes, verdicts_for

__all__ = ["SanitizeEngine", "TOOLS", "parallel_tools"]


def parallel_tools(n_tools: int) -> int:
    """How many tool processes run at once: all where the machine has a core for each, else fewer (at least 1)."""
    return parallel_processes(n_tools)


def _recorded(verdict: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in verdict.items() if k not in ("tail", "reason")}


@register_engine
class SanitizeEngine(Engine):
    """Run the item's workload under each sanitizer tool; any reported error refutes the item."""

    name = "sanitize"

    def discharge(self, job: Job) -> Outcome:
        """Skipped off the device or without the tool; violated on any sanitizer error; error with no verdict."""
        params = job.item.get("params") or {}
        workload = params.get("workload") or job.contract.data["family"]
        tools = tuple(params.get("tools") or TOOLS)
        if job.device != "cuda":
            return skipped(f"runs on cuda (compute-sanitizer); this run is on {job.device}")
        exe = shutil.which("compute-sanitizer")
        if exe is None:
            return skipped("compute-sanitizer is not on PATH on this machine")
        verdicts, shared = verdicts_for(workload, tools, tuple(params.get("modules") or ()), exe)
        evidence = SanitizeEvidence(
            cases=len(tools),
            workload=workload,
            verdicts={t: _recorded(r) for t, r in verdicts.items()},
            shared=shared,
        )
        bad = {t: r for t, r in verdicts.items() if r["errors"] != 0 or r["exit"] != 0}
        if not bad:
            return passed(evidence)
        if all(r["errors"] is None for r in bad.values()):
            return error(
                "no sanitizer verdict: " + "; ".join(f"{t}: {r.get('reason') or r['exit']}" for t, r in bad.items()),
                evidence,
                output={t: r.get("tail") for t, r in bad.items()},
            )
        return violated(
            {
                t: {"errors": r["errors"], "exit": r["exit"], "output": r.get("tail")}
                | ({"reason": r["reason"]} if r.get("reason") else {})
                for t, r in bad.items()
            },
            f"sanitizer errors: {sorted(t for t, r in bad.items() if r['errors'])}",
            evidence,
        )
