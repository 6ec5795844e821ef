"""``kc audit-libm``: the exhaustive CUDA math-library audit as a command (contracts/cuda-libm-v1.yaml).

``kc audit-libm [--functions F ...] [--env cuda|cuda-ftz] [--intrinsics] [--json FILE] [--contract PATH]``
sweeps every binary32 input of each selected function on the GPU under each selected environment against
the correctly rounded reference (float64 on the device, ambiguous inputs settled with MPFR), and prints per
function: max ULP and where, the documented bound (read from the contract's item tolerance: the bounds are
the contract's table, not code), how many inputs MPFR settled, and the verdict. Exit 0 when nothing exceeds
its documented bound, 1 on any violation or error, 2 without a GPU or on a bad argument.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from obligations.argtypes import cluster_spec

__all__ = ["configure", "run", "documented_bounds", "table_rows", "audit_cells", "DEFAULT_CONTRACT"]

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
DEFAULT_CONTRACT = "contracts/cuda-libm-v1.yaml"
# The cells' seconds are kept with kc check's item durations (obligations.runorder) under this profile
AUDIT_PROFILE = "audit-libm"


def configure(p: argparse.ArgumentParser) -> None:
    """Options of ``kc audit-libm``."""
    p.add_argument("--functions", nargs="+", metavar="F", help="functions to audit (default: every standard one)")
    p.add_argument("--env", choices=["cuda", "cuda-ftz"], default=None, help="one environment (default: both)")
    p.add_argument("--intrinsics", action="store_true", help="also audit the intrinsics (__expf, __sinf, ...)")
    p.add_argument("--json", metavar="FILE", help="also write the audit as JSON here (atomically)")
    p.add_argument("--contract", default=DEFAULT_CONTRACT, help="the contract holding the documented bounds")
    p.add_argument(
        "--cluster",
        type=cluster_spec,
        metavar="local[:N]|tcp://HOST:PORT",
        default=None,
        help="audit the function x environment matrix as tasks on a Dask cluster (docs/scale-out.md)",
    )
    p.add_argument(
        "--timeline",
        metavar="FILE",
        help="write where and when each cell ran as a Chrome trace (chrome://tracing, Perfetto), as kc check does",
    )


def documented_bounds(contract_data: dict[str, Any]) -> dict[tuple[str, str], tuple[str, Any]]:
    """(function, env) -> (item id, tolerance) from the contract's libm.audit items."""
    out: dict[tuple[str, str], tuple[str, Any]] = {}
    for it in contract_data.get("falsification", []):
        if it.get("test") == "libm.audit":
            prm = it.get("params") or {}
            out[(str(prm["function"]), str(prm.get("env", "cuda")))] = (it["id"], it.get("tolerance"))
    return out


def table_rows(audits: list[dict[str, Any]]) -> list[list[str]]:
    """One row per audit: function, env, max ulp, where, documented bound, settled, verdict."""
    rows = []
    for a in audits:
        m = a.get("max_ulp") or {}
        mab = a.get("max_abs_error")
        where = m.get("input", "")
        if mab:
            where += f" (abs {float(mab['error']):.3g} at {mab['input']})"
        rows.append(
            [
                a["function"],
                a["env"],
                str(m.get("ulp", "")),
                where,
                a["documented_bound"],
                str(a["settled_by_mpfr"]),
                a["verdict"],
            ]
        )
    return rows


def _print_table(rows: list[list[str]]) -> None:
    head = ["function", "env", "max ulp", "where", "documented bound", "MPFR-settled", "verdict"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def audit_cells(
    names: list[str], envs: list[str], bounds: dict[tuple[str, str], tuple[str, Any]]
) -> list[tuple[str, str, str | None, Any]]:
    """The audit's (function, env, item id, tolerance) cells in the report's order: every function per env."""
    return [(name, env, *bounds.get((name, env), (None, None))) for env in envs for name in names]


def _audited(a: dict[str, Any], item: str | None) -> dict[str, Any]:
    """One cell's audit with its contract item, printed as it is taken (the report's order)."""
    a["item"] = item
    print(
        f"{a['function']:<12} {a['env']:<9} max ulp {(a['max_ulp'] or {}).get('ulp')!s:<6} "
        f"settled {a['settled_by_mpfr']:<6} {a['verdict']} ({a['seconds']:.2f} s)",
        file=sys.stderr,
        flush=True,
    )
    return a


def run(args: argparse.Namespace) -> int:
    """Run the audit; print the table (and write the JSON)."""
    from obligations.cli import start_phases

    phases = start_phases()  # the timeline's run lane: Python's start and kc's imports
    opening = None
    if args.cluster:
        from obligations.cluster import AUDIT_LAYOUT, OpeningCluster, dask_missing, parse_cluster

        if dask_missing():
            print(f"kc: error: --cluster {args.cluster}: {dask_missing()}", file=sys.stderr)
            return EXIT_INVALID
        # The cluster's workers start (and import the audit) while this process checks and parses
        opening = OpeningCluster(parse_cluster(args.cluster), "cuda", layout=AUDIT_LAYOUT)
    try:
        return _audit(args, opening, phases)
    finally:
        if opening is not None:
            opening.close()  # unless the audit took it (and closed it)


def _audit(args: argparse.Namespace, opening: Any, phases: list[tuple[str, float, float]]) -> int:
    from falsification.libm_tests import audit_function
    from obligations.contract import ContractError, parse_contract
    from obligations.core.device import DeviceUnavailable, resolve_device
    from obligations.runorder import item_name, last_seconds, longest_first, record_seconds
    from spec.libm import ENVS, INTRINSICS, STANDARD, get_function

    spec = None if opening is None else opening.spec
    try:
        if spec is None or spec.kind == "local":  # a scheduler's workers have the GPUs, not necessarily this host
            resolve_device("cuda")
    except DeviceUnavailable as e:
        print(f"kc: error: {e} (the audit sweeps 2^32 inputs per function on the GPU)", file=sys.stderr)
        return EXIT_INVALID
    try:
        contract = parse_contract(Path(args.contract))
    except ContractError as e:
        print(f"kc: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    bounds = documented_bounds(contract.data)
    try:
        names = (
            [get_function(f).name for f in args.functions]
            if args.functions
            else [f.name for f in STANDARD] + ([f.name for f in INTRINSICS] if args.intrinsics else [])
        )
    except KeyError as e:
        print(f"kc: error: {e.args[0]}", file=sys.stderr)
        return EXIT_INVALID
    envs = [args.env] if args.env else list(ENVS)
    cells = audit_cells(names, envs, bounds)
    missing = [(name, env) for name, env, item, _ in cells if item is None]
    if missing:
        name, env = missing[0]
        print(f"kc: error: {args.contract} has no libm.audit item for {name} under {env}", file=sys.stderr)
        return EXIT_INVALID
    t0 = time.perf_counter()
    events: list[tuple[tuple[str, str, str], str, float, float]] = []  # the timeline's: (cell, lane, start, end)
    if spec is None:
        audits = []
        for name, env, item, tol in cells:
            begin = time.perf_counter()
            audits.append(_audited(audit_function(name, env, tol), item))
            events.append((("", "", f"{name}/{env}"), "run", begin, time.perf_counter()))
    else:
        from obligations.cluster import AUDIT_PART, AUDIT_SHARE, ClusterError, run_tasks

        requests = [{"function": name, "env": env, "tolerance": tol} for name, env, _, tol in cells]
        print(f"kc audit-libm: {len(cells)} function x environment cell(s) on cluster {spec}", file=sys.stderr)
        last = last_seconds("cuda", AUDIT_PROFILE)  # longest first: no 0.9-s cell is left for the end
        order = longest_first(range(len(cells)), lambda n: item_name(contract.id, str(cells[n][2])), last)
        try:
            # on a local cluster this process audits cells too, from before the cluster is open (its GPU is the host's)
            here = spec.kind == "local"
            done = run_tasks(opening, "cuda", AUDIT_PART, requests, share=AUDIT_SHARE, order=order, here=here)
        except ClusterError as e:
            print(f"kc: error: --cluster {e}", file=sys.stderr)
            return EXIT_FAILED
        clock = time.perf_counter() - time.time()  # the workers' wall times on this process's clock
        first: dict[str, tuple[float, float]] = {}  # worker -> (its process's start, its first cell's)
        for a, (name, env, _, _) in zip(done, cells, strict=True):
            ran = a.pop("ran", None)
            if ran:
                events.append((("", "", f"{name}/{env}"), ran["worker"], ran["start"] + clock, ran["end"] + clock))
                if ran.get("process") is not None and ran["start"] < first.get(ran["worker"], (0.0, float("inf")))[1]:
                    first[ran["worker"]] = (ran["process"], ran["start"])
        events += [(("", "", "start worker"), w, began + clock, cell + clock) for w, (began, cell) in first.items()]
        audits = [_audited(a, item) for a, (_, _, item, _) in zip(done, cells, strict=True)]
    timed = [{"id": item, "seconds": a["seconds"]} for a, (_, _, item, _) in zip(audits, cells, strict=True)]
    record_seconds("cuda", AUDIT_PROFILE, [{"id": contract.id, "items": timed}])  # the next cluster run's order
    report = {
        "contract": args.contract,
        **({"cluster": str(spec)} if spec is not None else {}),
        "source_of_bounds": "CUDA C++ Programming Guide, Mathematical Functions (see the contract's references)",
        "seconds": round(time.perf_counter() - t0, 3),
        "audits": audits,
    }
    _print_table(table_rows(audits))
    if args.timeline:
        from obligations.check import write_timeline

        phases = [*phases, ("audit", t0, time.perf_counter())]
        if opening is not None and opening.ended is not None:
            phases.append(("open cluster", opening.began, opening.ended))
        write_timeline(args.timeline, events, phases)
    if args.json:
        from obligations.atomic import write_text_atomic

        write_text_atomic(args.json, json.dumps(report, indent=2, default=str) + "\n")
    return EXIT_FAILED if any(a["verdict"] in ("violated", "error") for a in audits) else EXIT_OK


def _register() -> None:
    from obligations.registry import COMMANDS

    run.help_text = "audit CUDA math functions on every binary32 input against a correctly rounded reference"  # type: ignore[attr-defined]
    COMMANDS["audit-libm"] = (configure, run)


_register()
