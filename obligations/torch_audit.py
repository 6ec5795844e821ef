"""``kc audit-torch``: PyTorch's ops against our specs and their derived bounds (contracts/torch-ops-v1.yaml).

``kc audit-torch [--ops OP ...] [--backends B ...] [--device auto|host|cuda] [--seed N] [--inductor] [--json FILE]
[--contract PATH]`` runs, for each ``torch.audit`` item of the contract (the op table of :mod:`spec.torch`), the
op's cases under the backend's settings and prints per op and backend: cases run (and configurations the backend
refused), the worst error / derived bound and where, NaN/Inf handling against the spec, bitwise determinism
across reruns, and the verdict. ``--inductor`` adds the Inductor check of the fusion decoder block. On ``--device
host`` torch's CPU kernels are audited (the backends that exist there). Exit 0 when nothing is violated (or only
what the contract declares with ``expect: violated``), 1 on a finding or an error, 2 without torch, without a GPU
for ``--device cuda``, or on a bad argument.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["configure", "run", "audit_items", "table_rows", "inductor_rows", "DEFAULT_CONTRACT"]

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
DEFAULT_CONTRACT = "contracts/torch-ops-v1.yaml"
HEAD = ("op", "backend", "cases", "worst error/bound", "where", "NaN/Inf vs spec", "deterministic", "verdict")


def configure(p: argparse.ArgumentParser) -> None:
    """Options of ``kc audit-torch``."""
    p.add_argument("--ops", nargs="+", metavar="OP", help="ops to audit (default: every op of the contract)")
    p.add_argument("--backends", nargs="+", metavar="B", help="backends to audit (default: every one)")
    p.add_argument(
        "--device", choices=["auto", "host", "cuda"], default="auto", help="cuda (torch's GPU ops) or host (CPU)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the cases (default 0)")
    p.add_argument("--inductor", action="store_true", help="also check Inductor on the fusion decoder block")
    p.add_argument("--json", metavar="FILE", help="also write the audit as JSON here (atomically)")
    p.add_argument("--contract", default=DEFAULT_CONTRACT, help="the contract holding the audit's items")


def audit_items(contract_data: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(op, backend, item id, expected violation) of every ``torch.audit`` item, in the contract's order."""
    out = []
    for it in contract_data.get("falsification", []):
        if it.get("test") == "torch.audit":
            prm = it.get("params") or {}
            out.append((str(prm.get("op")), str(prm.get("backend")), str(it["id"]), it.get("expect") == "violated"))
    return out


def _where(a: dict[str, Any]) -> str:
    w = a.get("worst") or {}
    return f"{w['case']} {w['index']}" if w else ""


def table_rows(audits: list[dict[str, Any]]) -> list[list[str]]:
    """One row per audit: op, backend, cases, worst error/bound, where, NaN/Inf vs spec, deterministic, verdict."""
    rows = []
    for a in audits:
        w = a.get("worst") or {}
        cases = str(a.get("cases", ""))
        if a.get("unsupported"):
            cases += f" ({len(a['unsupported'])} refused)"
        if "cases" not in a:
            special = det = ""
        else:
            special = "as spec" if not a.get("class_mismatches") else f"{a['class_mismatches']} differ"
            special += f" ({a.get('special_elements', 0)} special)"
            det = "yes" if a.get("deterministic") else f"no ({len(a.get('nondeterministic', []))} cases)"
        ratio = f"{w['ratio']:.3g}" if w else ""
        if w and not a.get("bound"):
            ratio = "no bound"
        verdict = a["verdict"] + (" (expected)" if a.get("expected") and a["verdict"] == "violated" else "")
        rows.append([a["op"], a["backend"], cases, ratio, _where(a), special, det, verdict])
    return rows


def inductor_rows(r: dict[str, Any]) -> list[list[str]]:
    """One row per step of the Inductor check: step, kind, ops, agreement, generated kernels and library calls."""
    rows = []
    for s in r.get("steps", []):
        k = s.get("kernels") or {}
        rows.append(
            [
                str(s["step"]),
                s["kind"],
                " ".join(s["ops"]),
                s["agreement"],
                " ".join(k.get("generated", [])) or "-",
                " ".join(k.get("extern", [])) or "-",
            ]
        )
    return rows


def _print_table(head: tuple[str, ...] | list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [list(head), *rows]) for i in range(len(head))]
    for r in [list(head), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _device(name: str) -> tuple[str | None, str | None]:
    """(device, None) or (None, the error): cuda needs torch with a CUDA device; auto takes cuda when it has one."""
    from native.torch import cuda_missing, torch_missing

    missing = torch_missing()
    if missing:
        return None, missing
    why = cuda_missing()
    if name == "cuda" and why:
        return None, f"--device cuda: {why}"
    if name == "auto":
        return ("host" if why else "cuda"), None
    return name, None


def _provenance(device: str, started: float) -> dict[str, Any]:
    """Where and with what the audit ran: kc's provenance (commit, device, packages, date) and torch's versions."""
    import torch

    from obligations.check import provenance
    from obligations.core.device import device_info

    try:
        where = device_info(device)
    except Exception as e:  # torch sees the device, CuPy (which device_info asks) may not: say so, keep the audit
        where = {"kind": device, "name": None, "why": f"{type(e).__name__}: {e}"}
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {**provenance(where, started), "torch": torch.__version__, "torch_cuda": torch.version.cuda, "cudnn": cudnn}


def run(args: argparse.Namespace) -> int:
    """Run the audit; print the table (and write the JSON)."""
    from falsification.torch_tests import audit_backend, inductor_check
    from obligations.contract import ContractError, parse_contract
    from spec.torch import get_backend

    device, why = _device(args.device)
    if device is None:
        print(f"kc: error: {why}", file=sys.stderr)
        return EXIT_INVALID
    try:
        contract = parse_contract(Path(args.contract))
    except ContractError as e:
        print(f"kc: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    items = audit_items(contract.data)
    for op, backend, item, _ in items:
        try:
            get_backend(op, backend)
        except KeyError as e:
            print(f"kc: error: {args.contract}: item {item}: {e.args[0]}", file=sys.stderr)
            return EXIT_INVALID
    for flag, known, chosen in (
        ("--ops", {i[0] for i in items}, args.ops),
        ("--backends", {i[1] for i in items}, args.backends),
    ):
        unknown = sorted(set(chosen or ()) - known)
        if unknown:
            known_s = ", ".join(sorted(known))
            print(f"kc: error: {flag} {unknown[0]!r} is not in {args.contract} (known: {known_s})", file=sys.stderr)
            return EXIT_INVALID
    chosen = [i for i in items if (not args.ops or i[0] in args.ops) and (not args.backends or i[1] in args.backends)]
    t0 = time.perf_counter()
    prov = _provenance(device, time.time())
    name = (prov["device"] or {}).get("name") or device
    print(f"kc audit-torch: {name} ({device}), torch {prov['torch']}, cuDNN {prov['cudnn']}, {prov['started']}")
    audits = []
    for op, backend, item, expected in chosen:
        a = audit_backend(op, backend, device, args.seed)
        a.update(item=item, expected=expected)
        print(f"{op:<12} {backend:<15} {a['verdict']:<9} {a.get('seconds', 0.0):.2f} s", file=sys.stderr, flush=True)
        audits.append(a)
    report: dict[str, Any] = {"contract": args.contract, "device": device, "seed": args.seed, "audits": audits}
    _print_table(HEAD, table_rows(audits))
    for a in audits:
        if a["verdict"] in ("violated", "error", "skipped"):
            print(f"  {a['op']}/{a['backend']}: {a['verdict']}: {a.get('reason', '')}")
    if args.inductor:
        r = inductor_check(device, seed=args.seed)
        report["inductor"] = r
        print()
        _print_table(("step", "kind", "ops", "agreement", "generated kernels", "library calls"), inductor_rows(r))
        print(f"  whole block: end-to-end max relative error {r['block']['end_to_end_max_rel_error']:.3g}")
    report["seconds"] = round(time.perf_counter() - t0, 3)
    report["provenance"] = {**prov, "seconds": report["seconds"]}
    if args.json:
        from obligations.atomic import write_text_atomic

        write_text_atomic(args.json, json.dumps(report, indent=2, default=str) + "\n")
    failed = any(a["verdict"] == "error" or (a["verdict"] == "violated" and not a["expected"]) for a in audits)
    failed = failed or any(s["agreement"] == "beyond bound" for s in report.get("inductor", {}).get("steps", []))
    return EXIT_FAILED if failed else EXIT_OK


def _register() -> None:
    from obligations.registry import COMMANDS

    run.help_text = "audit PyTorch's GPU ops against the specs and their derived bounds"  # type: ignore[attr-defined]
    COMMANDS["audit-torch"] = (configure, run)


_register()
