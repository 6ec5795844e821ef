"""`kc explain ID`: one item's claim, formal statement, last evidence, and the command that reproduces it."""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from obligations.reporting.evidence import evidence_facts
from obligations.reporting.model import claim_label, describe_claim
from obligations.reporting.statement import render_statement

__all__ = ["explain", "ItemNotFound"]


class ItemNotFound(LookupError):
    """No contract defines the requested item id (the message suggests close ids)."""


def _find(item_id: str, contracts: Sequence[Path]) -> tuple[Any, dict[str, Any]]:
    from obligations.contract import load_contract

    seen: list[str] = []
    for path in contracts:
        contract = load_contract(path, check=False)
        for item in contract.items:
            if item["id"] == item_id:
                return contract, item
            seen.append(item["id"])
    close = difflib.get_close_matches(item_id, seen, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ItemNotFound(f"no item {item_id!r} in {len(contracts)} contract file(s){hint}")


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line if line.strip() else line for line in text.splitlines())


def _statement_lines(item: Mapping[str, Any]) -> list[str]:
    lines = []
    for clause in ("given", "prove"):
        if not item.get(clause):
            continue
        text = " ".join(str(item[clause]).split())
        lines.append(f"  {clause}: {text}")
        rendered = render_statement(text)
        if rendered.parsed and rendered.unicode and rendered.unicode != text:
            lines.append(_indent(rendered.unicode, "      "))
        elif not rendered.parsed:
            lines.append(f"      (not parsed: {rendered.error})")
    return lines


def _result_entry(result: Mapping[str, Any], contract_id: str, item_id: str) -> tuple[dict, dict] | None:
    for contract in result.get("contracts", []):
        if contract.get("id") != contract_id:
            continue
        for item in contract.get("items", []):
            if item.get("id") == item_id:
                return contract, item
    return None


def _evidence_lines(contract: Any, entry: tuple[dict, dict] | None, result: Mapping[str, Any]) -> list[str]:
    if entry is None:
        return ["Last evidence: none in the given result (run the command below with --json to record some)."]
    c_entry, rec = entry
    prov = result.get("provenance") or {}
    device = prov.get("device") or {}
    where = device.get("name") or device.get("kind") or "unknown device"
    lines = [
        f"Last evidence ({prov.get('started', 'unknown time')}, commit {prov.get('commit') or 'unknown'}, {where}):"
    ]
    current = hashlib.sha256(Path(contract.path).read_bytes()).hexdigest()
    if c_entry.get("sha256") and c_entry["sha256"] != current:
        lines.append("  STALE: the contract file changed since this evidence was recorded; re-run it.")
    lines.append(f"  status: {rec.get('status')}   claim: {claim_label(rec)}")
    lines.append(f"  {describe_claim(rec)}")
    if rec.get("reason") and rec.get("status") != "violated":
        lines.append(f"  reason: {rec['reason']}")
    for fact in evidence_facts(rec.get("evidence")):
        if fact.block:
            lines.append(f"  {fact.label}:")
            lines.append(_indent(fact.value, "    "))
        else:
            lines.append(f"  {fact.label}: {fact.value}")
    if rec.get("seconds") is not None:
        lines.append(f"  time: {float(rec['seconds']):.3g} s")
    if rec.get("counterexample") is not None:
        lines.append("  counterexample:")
        lines.append(_indent(json.dumps(rec["counterexample"], indent=2, sort_keys=True, default=str), "    "))
    return lines


def explain(item_id: str, contracts: Sequence[str | Path], result: Mapping[str, Any] | None = None) -> str:
    """Text describing ``item_id`` (found in ``contracts``), its last evidence in ``result``, and its replay.

    Raises ItemNotFound when no contract defines the id.
    """
    contract, item = _find(item_id, [Path(p) for p in contracts])
    loc = item.get("location") or {}
    kind = item.get("kind", "item")
    head = f"{item_id}  ({kind}"
    if item.get("type"):
        head += f", {item['type']}"
    head += f")  {contract.path}:{loc.get('line', '?')}:{loc.get('column', '?')}"
    data = contract.data
    lines = [
        head,
        f"  contract: {data.get('id')} {data.get('version', '')}  family {data.get('family', '?')}",
    ]
    for key, label in (
        ("property", "property"),
        ("rule", "rule"),
        ("prediction", "prediction"),
        ("if_fails", "if it fails"),
        ("equation", "equation"),
        ("method", "method"),
        ("test", "test"),
        ("agreement", "agreement"),
        ("tolerance", "tolerance"),
        ("assumption", "assumption"),
        ("pending", "pending"),
    ):
        if item.get(key) is not None:
            lines.append(f"  {label}: {item[key]}")
    equation = (data.get("equations") or {}).get(item.get("equation") or "")
    if equation:
        lines.append(f"    formula: {equation.get('formula')}")
    if item.get("bound"):
        lines.append(f"  bound: {json.dumps(item['bound'])}")
    statement = _statement_lines(item)
    if statement:
        lines += ["", "Formal statement:", *statement]
    lines.append("")
    entry = _result_entry(result, contract.id, item_id) if result is not None else None
    if result is not None:
        lines += _evidence_lines(contract, entry, result)
    else:
        lines.append("Last evidence: no result given (pass --from RESULT.json to show it).")
    replay = (entry[1].get("replay") if entry else None) or f"kc check {contract.path} --only {item_id}"
    lines += ["", "Reproduce:", f"  {replay}"]
    return "\n".join(lines) + "\n"
