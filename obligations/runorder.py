"""The order a run hands its items to the workers: the longest first, as the previous run on this machine timed them.

A run of many items on ``-j`` workers ends when its last item ends; handing the long items out first (the LPT rule)
keeps one long item from starting last and running alone. Item times come from the previous run with the same
device and profile: after each run its items' seconds are stored in ``durations.json`` in the proof cache's
directory (``KC_PROOF_CACHE_DIR``, default ``~/.cache/kernel-contracts/proofs``), written atomically (parallel
runs: the last one wins). Only the order changes: records, witnesses and the output's order are those of an
in-order run. An item this machine has not timed yet takes its seconds from ``runorder_seconds.json`` (shipped:
the items of a GPU run of the whole tree, so a first run on a fresh machine hands out Inductor and the sanitizer
batch first too, instead of last; ``python -m obligations.runorder RESULT.json`` rewrites it from a result); an
item neither knows keeps its place ahead of the timed ones.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "durations_path",
    "last_seconds",
    "record_seconds",
    "longest_first",
    "shared_last",
    "item_name",
    "SHIPPED",
    "shipped_seconds",
    "seconds_of",
]

T = TypeVar("T")
_FORMAT = 1


def durations_path() -> Path | None:
    """Where the item durations of past runs are kept (beside the proof cache's entries), or None."""
    from obligations.proofcache import proof_settings

    where = proof_settings().cache_dir
    return where / "durations.json" if where is not None else None


def item_name(contract_id: str, item_id: str) -> str:
    """The key of one item in the durations file."""
    return f"{contract_id}::{item_id}"


def _read(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: a run in the contracts' order, never an error
    return data if isinstance(data, dict) and data.get("format") == _FORMAT else {}


SHIPPED = Path(__file__).with_name("runorder_seconds.json")


def _seconds(data: dict[str, Any], device: str, profile: str) -> dict[str, float]:
    got = (data.get("runs") or {}).get(f"{device}/{profile}") or {}
    return {str(k): float(v) for k, v in got.items() if isinstance(v, int | float)}


def shipped_seconds(device: str, profile: str) -> dict[str, float]:
    """Item name -> seconds in the shipped table (a reference run of this tree) for ``device`` and ``profile``."""
    return _seconds(_read(SHIPPED), device, profile)


def shipped_sanitize_seconds() -> dict[str, dict[str, float]]:
    """Tool -> sanitize workload -> seconds in the shipped table's reference run (a fresh machine's plan splits
    each tool's workloads over its processes by them, as by a run of its own: by count, one 2 x H100 cluster's
    racecheck process took 26.9 s, the batch the run's longest item, while a split by seconds gives ~20)."""
    got = _read(SHIPPED).get("sanitize") or {}
    return {
        str(tool): {str(w): float(v) for w, v in per.items() if isinstance(v, int | float)}
        for tool, per in got.items()
        if isinstance(per, dict)
    }


def sanitize_seconds_of(result: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Tool -> workload -> seconds of the sanitize items' verdicts in a check's result."""
    out: dict[str, dict[str, float]] = {}
    for c in result.get("contracts") or []:
        for it in c.get("items") or []:
            ev = it.get("evidence") or {}
            if ev.get("kind") != "sanitize" or not ev.get("workload"):
                continue
            for tool, v in (ev.get("verdicts") or {}).items():
                if isinstance(v, dict) and isinstance(v.get("seconds"), int | float):
                    out.setdefault(tool, {})[ev["workload"]] = round(float(v["seconds"]), 3)
    return out


def last_seconds(device: str, profile: str, path: Path | None = None) -> dict[str, float]:
    """Item name -> seconds of the last run on ``device`` with ``profile`` that ran the item; the shipped table's
    seconds for the items no run here has timed."""
    mine = _seconds(_read(path if path is not None else durations_path()), device, profile)
    return {**shipped_seconds(device, profile), **mine}


def _computed(item: Mapping[str, Any]) -> bool:
    """Whether the record's seconds are what the item costs: it ran (not skipped) and no cache served it."""
    return item.get("status") != "skipped" and (item.get("evidence") or {}).get("cache") != "hit"


def seconds_of(result: Mapping[str, Any]) -> dict[str, float]:
    """Item name -> seconds of every item a result (``kc check --json``) computed: skipped ones and those the proof
    cache served left out (a hit's hundredth of a second would order a 17-s enumeration last in the next run whose
    cache misses: a source change, --no-proof-cache, a fresh machine)."""
    return {
        item_name(str(c["id"]), str(it["id"])): round(float(it["seconds"]), 3)
        for c in result.get("contracts") or []
        for it in c.get("items") or []
        if isinstance(it.get("seconds"), int | float) and _computed(it)
    }


def record_seconds(device: str, profile: str, contracts: Iterable[Mapping[str, Any]], path: Path | None = None) -> bool:
    """Store the seconds of every item of ``contracts`` (result entries) that ran; False if it could not be written."""
    from obligations.atomic import write_text_atomic

    path = path if path is not None else durations_path()
    if path is None:
        return False
    data = _read(path)
    runs = data.get("runs") if isinstance(data.get("runs"), dict) else {}
    mine = {**(runs.get(f"{device}/{profile}") or {}), **seconds_of({"contracts": list(contracts)})}
    runs[f"{device}/{profile}"] = mine
    with contextlib.suppress(OSError):
        write_text_atomic(path, json.dumps({"format": _FORMAT, "runs": runs}, sort_keys=True) + "\n")
        return True
    return False


def longest_first(items: Sequence[T], name: Any, seconds: Mapping[str, float]) -> list[T]:
    """``items`` ordered by the seconds ``seconds`` gives their ``name(item)``, longest first; the untimed ones first,
    in their order (a stable sort)."""
    return sorted(items, key=lambda it: -seconds.get(name(it), float("inf")))


def shared_last(
    items: Sequence[T], group: Callable[[T], Hashable | None], started: Collection[Hashable] = ()
) -> list[T]:
    """``items`` with every item of a shared job (``group(item)`` names the job; None: none) but the job's first moved
    to the end, in their order: the first starts the job, the others wait for it, and at the end they find it done
    instead of holding, while it runs, workers that other items could use. A job in ``started`` runs already (the
    run started it): all of its items go to the end."""
    seen: set[Hashable] = set(started)
    head, tail = [], []
    for it in items:
        g = group(it)
        (tail if g is not None and g in seen else head).append(it)
        if g is not None:
            seen.add(g)
    return head + tail


def _main(argv: list[str]) -> int:
    """``python -m obligations.runorder RESULT.json``: rewrite the shipped table from a result's device/profile (and
    the sanitize workloads' seconds, from a cuda result)."""
    if len(argv) != 1:
        print("usage: python -m obligations.runorder RESULT.json", file=sys.stderr)
        return 2
    from obligations.atomic import write_text_atomic

    result = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    prov = result.get("provenance") or {}
    device = prov.get("device")
    device = device.get("kind") if isinstance(device, dict) else device
    data = _read(SHIPPED) or {"format": _FORMAT, "runs": {}}
    data.setdefault("runs", {})[f"{device}/{prov.get('profile')}"] = seconds_of(result)
    sanitize = sanitize_seconds_of(result)
    if sanitize:
        data["sanitize"] = sanitize
    write_text_atomic(SHIPPED, json.dumps(data, sort_keys=True, indent=0) + "\n")
    print(f"{SHIPPED}: {device}/{prov.get('profile')}, {len(seconds_of(result))} items")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
