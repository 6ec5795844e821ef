"""Where a ``kc check --device cuda`` run's measure phase went: each measure item's seconds, its timed part and the
rest (setup, side timings), from the run's JSON result and, if given, its ``--timeline`` (the phase's span).

    python benchmarks/measure_phase.py RESULT.json [TIMELINE.json]

Timed: the sum of the item's cases' ``wall_s`` (calibration and trials, falsification.measure.compare), or their
``trial_seconds`` where a driver records no wall time (gemm.mfu_floor); untimed: the rest of the item's seconds. An
item that took another's measurement of the run (``shared_with``) measured nothing itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def rows(result: dict[str, Any]) -> list[tuple[str, float, float, str]]:
    """(contract:item, seconds, timed seconds, shared_with or "") of every measure item, in the run's order."""
    out = []
    for c in result["contracts"]:
        for it in c["items"]:
            if it.get("method") != "measure":
                continue
            ev = it.get("evidence") or {}
            cases = (ev.get("cases_measured") or {}).values()
            timed = 0.0 if ev.get("shared_with") else sum(v.get("wall_s") or v.get("trial_seconds") or 0 for v in cases)
            out.append((f"{c['id']}:{it['id']}", float(it.get("seconds") or 0), timed, ev.get("shared_with", "")))
    return out


def span(timeline: dict[str, Any], items: set[str]) -> float | None:
    """Seconds from the first measure item's start to the last one's end on the timeline (None: none there)."""
    ev = [e for e in timeline.get("traceEvents", []) if e.get("ph") == "X" and e.get("name") in items]
    if not ev:
        return None
    return (max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) / 1e6


def main(argv: list[str]) -> None:
    """Print one row per measure item, the totals and the phase's span."""
    result = json.loads(Path(argv[0]).read_text())
    table = rows(result)
    print(f"{'item':<45} {'seconds':>8} {'timed':>7} {'untimed':>8}  shared_with")
    for name, s, t, shared in table:
        print(f"{name:<45} {s:>8.2f} {t:>7.2f} {s - t:>8.2f}  {shared}")
    total, timed = sum(r[1] for r in table), sum(r[2] for r in table)
    print(f"{'total':<45} {total:>8.2f} {timed:>7.2f} {total - timed:>8.2f}")
    if len(argv) > 1:
        phase = span(json.loads(Path(argv[1]).read_text()), {n.split(":", 1)[1] for n, *_ in table})
        if phase is not None:
            print(f"measure phase {phase:.2f} s on the timeline: {phase - timed:.2f} s of it untimed")


if __name__ == "__main__":
    main(sys.argv[1:])
