"""Format-neutral views of a result: what every report shows, computed once for Markdown and HTML."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from obligations.reporting.evidence import Fact, evidence_facts
from obligations.reporting.model import StatusStyle, claim_label, describe_claim, gate_verdict, status_style
from obligations.reporting.plots import PlotKind, plots_for
from obligations.reporting.provenance import ContractRef, ReportStamp, current_tool_version, evidence_level
from obligations.reporting.statement import RenderedStatement, render_statement

__all__ = [
    "coverage_facts",
    "qa_gate_facts",
    "not_adopted_facts",
    "ItemView",
    "item_view",
    "provenance_facts",
    "report_stamp",
    "RUNS_ON_DEVICE",
]

# Methods whose evidence depends on where they ran (proofs do not).
RUNS_ON_DEVICE: frozenset[str] = frozenset({"falsify", "measure"})


@dataclass(frozen=True)
class ItemView:
    """Everything a report shows for one item."""

    id: str
    kind: str
    type: str
    property: str
    prediction: str | None
    method: str
    status: str
    style: StatusStyle
    claim: str
    claim_label: str
    claim_text: str
    reason: str | None
    statement: tuple[tuple[str, RenderedStatement], ...]
    facts: tuple[Fact, ...]
    counterexample: str | None
    replay: str | None
    plots: tuple[PlotKind, ...]
    raw: Mapping[str, Any]


def _device_text(provenance: Mapping[str, Any]) -> str:
    device = provenance.get("device") or {}
    kind = device.get("kind") or "unknown"
    if device.get("name"):
        return f"{device['name']} ({kind})"
    return kind


def item_view(
    item: Mapping[str, Any],
    contract: Mapping[str, Any],
    provenance: Mapping[str, Any],
) -> ItemView:
    """The view of one result item, with its statement rendered and its evidence turned into facts."""
    statement = item.get("statement") or {}
    clauses = tuple(
        (clause, render_statement(str(statement[clause])))
        for clause in ("given", "prove")
        if isinstance(statement, Mapping) and statement.get(clause)
    )
    facts: list[Fact] = []
    for key, label in (("equation", "Equation"), ("test", "Registered test")):
        if item.get(key):
            facts.append(Fact(label, str(item[key])))
    if item.get("agreement"):
        tol = item.get("tolerance")
        facts.append(Fact("Agreement", str(item["agreement"]) + (f", tolerance {tol}" if tol is not None else "")))
    facts.extend(evidence_facts(item.get("evidence")))
    runs = provenance.get("merged_runs") or []
    run = runs[item["from_run"]] if isinstance(item.get("from_run"), int) and item["from_run"] < len(runs) else None
    if item.get("method") in RUNS_ON_DEVICE and item.get("status") != "skipped":
        facts.append(Fact("Device", _device_text(run or provenance)))
    if run is not None:  # a merged result: which of its runs this record comes from
        commit = str(run.get("commit") or "?")[:10]
        facts.append(Fact("Run", f"{_device_text(run)}, profile {run.get('profile')}, commit {commit}"))
    if item.get("seconds") is not None:
        facts.append(Fact("Time", f"{float(item['seconds']):.3g} s"))
    loc = item.get("location") or {}
    if loc.get("line"):
        facts.append(Fact("Location", f"{contract.get('path', '?')}:{loc['line']}:{loc.get('column', 1)}"))
    cex = item.get("counterexample")
    return ItemView(
        id=str(item["id"]),
        kind=str(item.get("kind") or ""),
        type=str(item.get("type") or ""),
        property=str(item.get("property") or ""),
        prediction=item.get("prediction"),
        method=str(item.get("method") or ""),
        status=str(item["status"]),
        style=status_style(str(item["status"])),
        claim=str(item.get("claim") or "none"),
        claim_label=claim_label(item),
        claim_text=describe_claim(item),
        reason=item.get("reason"),
        statement=clauses,
        facts=tuple(facts),
        counterexample=json.dumps(cex, indent=2, sort_keys=True) if cex is not None else None,
        replay=item.get("replay"),
        plots=tuple(plots_for(item)),
        raw=item,
    )


def provenance_facts(result: Mapping[str, Any], contract: Mapping[str, Any] | None = None) -> list[Fact]:
    """Provenance rows: commit, contract sha256, tool and package versions, device, driver, CUDA, date."""
    prov = result.get("provenance") or {}
    tool = result.get("tool") or {}
    device = prov.get("device") or {}
    packages = prov.get("packages") or {}
    commit = str(prov.get("commit") or "unknown") + (" (dirty working tree)" if prov.get("dirty") else "")
    rows = [Fact("Project commit", commit)]
    if contract is not None:
        rows.append(Fact("Contract", f"{contract.get('path', '?')} (version {contract.get('version', '?')})"))
        rows.append(Fact("Contract sha256", str(contract.get("sha256", "?"))))
    rows.append(Fact("Checked by", f"{tool.get('name', 'kernel-contracts')} {tool.get('version', '?')}"))
    rows.append(Fact("Report generated by", f"kernel-contracts {current_tool_version()}"))
    rows.append(Fact("Python", str(prov.get("python") or "unknown")))
    for name in ("numpy", "cupy", "z3-solver", "hypothesis", "sympy"):
        rows.append(Fact(name, str(packages.get(name) or "not installed")))
    for name in sorted(set(packages) - {"numpy", "cupy", "z3-solver", "hypothesis", "sympy"}):
        rows.append(Fact(name, str(packages[name] or "not installed")))
    rows.append(Fact("Device", _device_text(prov)))
    rows.append(Fact("Driver", str(device.get("driver") or "n/a")))
    rows.append(Fact("CUDA runtime", str(device.get("cuda_runtime") or "n/a")))
    rows.append(Fact("Checked at", str(prov.get("started") or "unknown")))
    if prov.get("seconds") is not None:
        rows.append(Fact("Check duration", f"{float(prov['seconds']):.3g} s"))
    if prov.get("argv"):
        rows.append(Fact("Command", " ".join(map(str, prov["argv"]))))
    return rows


def report_stamp(result: Mapping[str, Any], contracts: list[Mapping[str, Any]]) -> ReportStamp:
    """The provenance stamp of a report describing ``contracts`` of ``result``."""
    refs = tuple(ContractRef(str(c["id"]), str(c["path"]), str(c["sha256"])) for c in contracts)
    return ReportStamp(
        current_tool_version(), refs, (result.get("provenance") or {}).get("commit"), evidence=evidence_level(result)
    )


def qa_gate_facts(contract: Mapping[str, Any]) -> list[Fact]:
    """The contract's QA gate: its id, what it requires, and whether this run passed it."""
    gate = contract.get("qa_gate") or {}
    if not gate:
        return []
    statuses = {str(i["id"]): str(i["status"]) for i in contract.get("items", [])}
    required = [f"{r} ({statuses.get(str(r), 'not run')})" for r in gate.get("requires", [])]
    rows = [Fact("Gate", str(gate.get("id", "?")))]
    if gate.get("description"):
        rows.append(Fact("Description", str(gate["description"])))
    rows.append(Fact("Requires", ", ".join(required) or "nothing"))
    rows.append(Fact("Status", gate_verdict(contract)))
    return rows


def not_adopted_facts(contract: Mapping[str, Any]) -> list[Fact]:
    """Seed claims the contract declares it does not adopt: claim and reason, as declared (no status)."""
    return [Fact(str(c["id"]), f"{c['claim']} — not adopted: {c['reason']}") for c in contract.get("not_adopted") or []]


def _entry(call: Mapping[str, Any]) -> str:
    axes = ", ".join(f"{k}={v}" for k, v in call.items() if k not in ("entry", "device"))
    return f"{call.get('entry')} on {call.get('device')}" + (f" ({axes})" if axes else "")


def coverage_facts(contract: Mapping[str, Any]) -> list[Fact]:
    """The coverage table of a contract: regimes and their witnesses, entry points checked and unchecked,
    compiled-code audit findings and sanitizer verdicts, each from what the engines recorded."""
    items = list(contract.get("items") or [])
    facts: list[Fact] = []
    for it in items:
        ev = it.get("evidence") or {}
        if ev.get("kind") == "regimes":
            wit = ev.get("witnesses") or {}
            names = ev.get("regimes") or []
            reached = ", ".join(
                f"{n}: {json.dumps(wit[n], sort_keys=True)}" if n in wit else f"{n}: no witness" for n in names
            )
            facts.append(Fact(f"Regimes ({it['id']}, {it['status']})", reached or "none"))
            for label, b in (ev.get("boundaries") or {}).items():
                sides = [
                    f"{side}: {json.dumps(wit[f'{label} @{side}'], sort_keys=True)}"
                    if f"{label} @{side}" in wit
                    else f"{side}: {b.get('implied') or 'no witness'}"
                    for side in ("accept", "reject")
                ]
                facts.append(Fact(f"Boundary {label} of {b.get('guard')} ({it['id']})", "; ".join(sides)))
        regimes_run = ev.get("regimes_reached")
        if isinstance(regimes_run, Mapping):
            text = ", ".join(f"{k}: {v}" for k, v in sorted(regimes_run.items()))
            facts.append(Fact(f"Cases per regime ({it['id']})", text or "none"))
        bounds_run = ev.get("boundaries_reached")
        if isinstance(bounds_run, Mapping):
            text = ", ".join(f"{k}: {'run' if v else 'NOT RUN'}" for k, v in bounds_run.items())
            facts.append(Fact(f"Boundary witnesses ({it['id']})", text or "none"))
        if "order_sensitive_cases" in ev:
            n = ev["order_sensitive_cases"]
            text = (
                f"{n} case(s) where {ev.get('order_alternative') or 'another order'} gives other bits"
                if n
                else "no case tells the claimed order from another: the inputs cannot show the order"
            )
            facts.append(Fact(f"Order-sensitive inputs ({it['id']})", text))
        if ev.get("kind") == "audit":
            text = f"{ev.get('cases')} builds, {ev.get('findings', 0)} finding(s) ({it['status']})"
            sass = ev.get("sass") or {}
            if sass and "not_run" not in sass:
                text += f"; SASS audited ({sass.get('builds')} builds for {sass.get('arch')})"
            facts.append(Fact(f"Compiled-code audit ({it['id']})", text))
        if ev.get("kind") == "sanitize":
            facts.append(Fact(f"Sanitizer ({it['id']})", f"{it['status']}: {ev.get('verdicts')}"))
    called = sorted({_entry(c) for it in items for c in it.get("entry_points") or []})
    if called:
        facts.append(Fact("Entry points checked", "; ".join(called)))
    if "unchecked_entry_points" in contract:
        unchecked = [_entry(c) for c in contract["unchecked_entry_points"]]
        facts.append(Fact("Entry points no item called (unchecked)", "; ".join(unchecked) if unchecked else "none"))
    return facts
