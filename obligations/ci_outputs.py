"""CI outputs of a `kc check` result: JUnit XML, SARIF 2.1.0, GitHub annotations and step summary.

Every output reads the same JSON result and one status policy (``STATUS_POLICY``): what each status
becomes in JUnit, SARIF and annotations, normally and under ``--strict`` (where unknown and skipped
items fail, as they do for the exit code).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from obligations.core.results import Status

__all__ = [
    "CiOutcome",
    "STATUS_POLICY",
    "policy",
    "junit_xml",
    "write_junit",
    "sarif_log",
    "write_sarif",
    "github_annotations",
    "step_summary",
    "emit_github",
    "SARIF_SCHEMA_URI",
]

SARIF_SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"


@dataclass(frozen=True)
class CiOutcome:
    """What one status becomes in CI: JUnit element, SARIF level and kind, GitHub annotation command."""

    junit: str | None  # None (testcase passes), "skipped", "failure" or "error"
    sarif_level: str  # "none", "note", "warning" or "error"
    sarif_kind: str  # "pass", "fail", "review", "notApplicable", ...
    annotation: str | None  # None, "notice", "warning" or "error"


_FAIL = CiOutcome("failure", "error", "fail", "error")
STATUS_POLICY: dict[str, tuple[CiOutcome, CiOutcome]] = {
    # status: (normal, --strict)
    "proved": (CiOutcome(None, "none", "pass", None),) * 2,
    "exhausted": (CiOutcome(None, "none", "pass", None),) * 2,
    "passed": (CiOutcome(None, "none", "pass", None),) * 2,
    "violated": (_FAIL, _FAIL),
    "error": (CiOutcome("error", "error", "fail", "error"),) * 2,
    "unknown": (CiOutcome("skipped", "warning", "review", "warning"), _FAIL),
    # a measurement whose interval straddles its threshold: not a pass; --strict fails it
    "inconclusive": (CiOutcome("skipped", "warning", "review", "warning"), _FAIL),
    # a declared finding reproduced (``expect: violated``, pytest's xfail): reported, never a failure
    "violated_expected": (CiOutcome("skipped", "note", "informational", "notice"),) * 2,
    "skipped": (CiOutcome("skipped", "note", "notApplicable", "notice"), _FAIL),
}


def policy(status: str, strict: bool = False) -> CiOutcome:
    """The CI outcome of ``status``; a status this module does not know is treated as an error."""
    pair = STATUS_POLICY.get(status, (CiOutcome("error", "error", "fail", "error"),) * 2)
    return pair[1 if strict else 0]


def _items(result: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    return [(c, i) for c in result.get("contracts", []) for i in c.get("items", [])]


def _clean(text: str) -> str:
    """Text safe for XML 1.0 (control characters other than tab/newline/CR dropped)."""
    return "".join(ch for ch in text if ch in "\t\n\r" or ord(ch) >= 0x20)


def _headline(item: Mapping[str, Any]) -> str:
    text = f"{item['id']} {item['status']}"
    if item.get("reason"):
        text += f": {item['reason']}"
    elif item.get("property"):
        text += f": {item['property']}"
    return text


def _details(item: Mapping[str, Any]) -> str:
    lines = []
    if item.get("property"):
        lines.append(f"property: {item['property']}")
    statement = item.get("statement") or {}
    for clause in ("given", "prove"):
        if statement.get(clause):
            lines.append(f"{clause}: {statement[clause]}")
    if item.get("reason"):
        lines.append(f"reason: {item['reason']}")
    if item.get("counterexample") is not None:
        lines.append("counterexample: " + json.dumps(item["counterexample"], sort_keys=True))
    if item.get("replay"):
        lines.append(f"replay: {item['replay']}")
    if item.get("evidence"):
        lines.append("evidence: " + json.dumps(item["evidence"], sort_keys=True, default=str))
    return "\n".join(lines)


# --- JUnit ------------------------------------------------------------------------------------------


def _junit_timestamp(started: str | None) -> str:
    """ISO 8601 without a time zone (the JUnit schema forbids one), in UTC."""
    when = None
    if started:
        try:
            when = datetime.fromisoformat(started)
        except ValueError:
            when = None
    when = when or datetime.now(UTC)
    if when.tzinfo is not None:
        when = when.astimezone(UTC).replace(tzinfo=None)
    return when.isoformat(timespec="seconds")


def junit_xml(result: Mapping[str, Any], *, strict: bool = False, hostname: str | None = None) -> str:
    """JUnit XML (Ant schema): testsuite per contract, testcase per item; failures give counterexamples."""
    prov = result.get("provenance") or {}
    device = prov.get("device") or {}
    stamp = _junit_timestamp(prov.get("started"))
    host = hostname or socket.gethostname() or "localhost"
    root = ET.Element("testsuites")
    for n, contract in enumerate(result.get("contracts", [])):
        items = contract.get("items", [])
        outcomes = [policy(i["status"], strict).junit for i in items]
        suite = ET.SubElement(
            root,
            "testsuite",
            {
                "name": str(contract["id"]),
                "package": str(contract.get("family") or "kernel-contracts"),
                "id": str(n),
                "timestamp": stamp,
                "hostname": host,
                "tests": str(len(items)),
                "failures": str(outcomes.count("failure")),
                "errors": str(outcomes.count("error")),
                "skipped": str(outcomes.count("skipped")),
                "time": f"{sum(float(i.get('seconds') or 0) for i in items):.3f}",
            },
        )
        props = ET.SubElement(suite, "properties")
        for name, value in (
            ("contract.path", contract.get("path")),
            ("contract.sha256", contract.get("sha256")),
            ("contract.version", contract.get("version")),
            ("commit", prov.get("commit")),
            ("device", device.get("name") or device.get("kind")),
            ("tool.version", (result.get("tool") or {}).get("version")),
        ):
            if value:
                ET.SubElement(props, "property", {"name": name, "value": _clean(str(value))})
        for item, outcome in zip(items, outcomes, strict=True):
            case = ET.SubElement(
                suite,
                "testcase",
                {
                    "name": str(item["id"]),
                    "classname": str(contract["id"]),
                    "time": f"{float(item.get('seconds') or 0):.3f}",
                },
            )
            if outcome == "skipped":
                reason = item.get("reason") or item["status"]
                ET.SubElement(case, "skipped", {"message": _clean(f"{item['status']}: {reason}")})
            elif outcome in ("failure", "error"):
                el = ET.SubElement(case, outcome, {"message": _clean(_headline(item)), "type": str(item["status"])})
                el.text = _clean(_details(item))
        ET.SubElement(suite, "system-out").text = ""
        ET.SubElement(suite, "system-err").text = ""
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(result: Mapping[str, Any], path: str | Path, *, strict: bool = False) -> Path:
    """Write ``junit_xml(result)`` to ``path`` atomically (parents created); returns the path."""
    from obligations.atomic import write_text_atomic

    return write_text_atomic(path, junit_xml(result, strict=strict))


# --- SARIF ------------------------------------------------------------------------------------------


def _region(item: Mapping[str, Any]) -> dict[str, int]:
    loc = item.get("location") or {}
    region = {"startLine": max(1, int(loc.get("line") or 1))}
    if loc.get("column"):
        region["startColumn"] = max(1, int(loc["column"]))
    return region


def _tags(item: Mapping[str, Any]) -> list[str]:
    """Kind, type and method as SARIF tags (unique, as the schema requires)."""
    return list(dict.fromkeys(str(t) for t in (item.get("kind"), item.get("type"), item.get("method")) if t))


def sarif_log(result: Mapping[str, Any], *, strict: bool = False) -> dict[str, Any]:
    """A SARIF 2.1.0 log: one rule per item id, one result per item at its YAML line and column."""
    tool = result.get("tool") or {}
    prov = result.get("provenance") or {}
    contracts = list(result.get("contracts", []))
    artifacts = [
        {
            "location": {"uri": str(c["path"])},
            "hashes": {"sha-256": str(c["sha256"])},
            "roles": ["analysisTarget"],
        }
        for c in contracts
    ]
    rules: list[dict[str, Any]] = []
    rule_index: dict[str, int] = {}
    results: list[dict[str, Any]] = []
    for a_index, contract in enumerate(contracts):
        for item in contract.get("items", []):
            rid = str(item["id"])
            if rid not in rule_index:
                rule_index[rid] = len(rules)
                rule: dict[str, Any] = {
                    "id": rid,
                    "shortDescription": {"text": str(item.get("property") or rid)},
                    "defaultConfiguration": {"level": "error"},
                    "properties": {
                        "contract": str(contract["id"]),
                        "tags": _tags(item),
                    },
                }
                statement = item.get("statement") or {}
                if statement.get("prove"):
                    given = f"given {statement['given']}: " if statement.get("given") else ""
                    rule["fullDescription"] = {"text": f"{given}prove {statement['prove']}"}
                rules.append(rule)
            outcome = policy(item["status"], strict)
            props: dict[str, Any] = {"status": item["status"], "claim": item.get("claim") or "none"}
            for key in ("counterexample", "replay", "evidence"):
                if item.get(key) is not None:
                    props[key] = item[key]
            results.append(
                {
                    "ruleId": rid,
                    "ruleIndex": rule_index[rid],
                    "kind": outcome.sarif_kind,
                    "level": outcome.sarif_level,
                    "message": {"text": _headline(item)},
                    "locations": [
                        {
                            "physicalLocation": {
                                "artifactLocation": {"uri": str(contract["path"]), "index": a_index},
                                "region": _region(item),
                            }
                        }
                    ],
                    "properties": props,
                }
            )
    invocation: dict[str, Any] = {
        "executionSuccessful": int(result.get("exit_code", 0)) in (0, 1),
        "exitCode": int(result.get("exit_code", 0)),
    }
    if prov.get("argv"):
        invocation["commandLine"] = " ".join(map(str, prov["argv"]))
    if prov.get("started"):
        invocation["startTimeUtc"] = str(prov["started"])
    return {
        "$schema": SARIF_SCHEMA_URI,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": str(tool.get("name") or "kernel-contracts"),
                        "version": str(tool.get("version") or "0"),
                        "rules": rules,
                    }
                },
                "invocations": [invocation],
                "artifacts": artifacts,
                "results": results,
                "columnKind": "unicodeCodePoints",
                "properties": {"provenance": prov, "summary": result.get("summary") or {}},
            }
        ],
    }


def write_sarif(result: Mapping[str, Any], path: str | Path, *, strict: bool = False) -> Path:
    """Write ``sarif_log(result)`` as strict JSON to ``path`` atomically (parents created); returns the path."""
    from obligations.atomic import write_text_atomic
    from obligations.check import _finite

    text = json.dumps(_finite(sarif_log(result, strict=strict)), indent=2, allow_nan=False, default=str) + "\n"
    return write_text_atomic(path, text)


# --- GitHub Actions ---------------------------------------------------------------------------------


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(result: Mapping[str, Any], *, strict: bool = False) -> list[str]:
    """Workflow commands (``::error file=...,line=...::msg``) for every item that is not a plain pass."""
    lines = []
    for contract, item in _items(result):
        level = policy(item["status"], strict).annotation
        if level is None:
            continue
        loc = item.get("location") or {}
        props = [f"file={_escape_property(str(contract['path']))}"]
        if loc.get("line"):
            props.append(f"line={int(loc['line'])}")
        if loc.get("column"):
            props.append(f"col={int(loc['column'])}")
        title = f"{item['id']} {item['status']}"
        props.append(f"title={_escape_property(title)}")
        message = _headline(item)
        if item.get("counterexample") is not None:
            message += "\ncounterexample: " + json.dumps(item["counterexample"], sort_keys=True)
        if item.get("replay"):
            message += f"\nreplay: {item['replay']}"
        lines.append(f"::{level} {','.join(props)}::{_escape_data(message)}")
    return lines


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def step_summary(result: Mapping[str, Any], *, strict: bool = False) -> str:
    """A Markdown summary for GITHUB_STEP_SUMMARY: status counts and every item that needs a look."""
    summary = result.get("summary") or {}
    tool = result.get("tool") or {}
    device = (result.get("provenance") or {}).get("device") or {}
    order = [s.value for s in Status]
    keys = order + [k for k in summary if k not in order]
    lines = [
        f"## kernel-contracts {tool.get('version', '')}: `kc check` exit {result.get('exit_code', '?')}",
        "",
        f"Device: {device.get('name') or device.get('kind') or 'unknown'}" + (" · strict" if strict else ""),
        "",
        "| " + " | ".join(keys) + " |",
        "|" + " ---: |" * len(keys),
        "| " + " | ".join(str(summary.get(k, 0)) for k in keys) + " |",
        "",
    ]
    flagged = [(c, i) for c, i in _items(result) if policy(i["status"], strict).annotation in ("error", "warning")]
    if flagged:
        lines += ["| Contract | Item | Status | Reason | Replay |", "| --- | --- | --- | --- | --- |"]
        for c, i in flagged:
            loc = i.get("location") or {}
            where = f"{c['path']}:{loc['line']}" if loc.get("line") else str(c["path"])
            replay = f"`{i['replay']}`" if i.get("replay") else ""
            lines.append(
                f"| {_md(c['id'])} | {_md(i['id'])} ({_md(where)}) | {_md(i['status'])} | "
                f"{_md(i.get('reason') or '')} | {_md(replay)} |"
            )
        lines.append("")
    else:
        lines += ["Nothing needs attention.", ""]
    return "\n".join(lines)


def emit_github(
    result: Mapping[str, Any],
    *,
    strict: bool = False,
    env: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
) -> None:
    """Under GitHub Actions, print annotations to ``stream`` and append the summary to GITHUB_STEP_SUMMARY.

    Does nothing when GITHUB_ACTIONS is not "true"; the summary is written wherever GITHUB_STEP_SUMMARY
    points, independently.
    """
    env = os.environ if env is None else env
    out = stream if stream is not None else sys.stdout
    if env.get("GITHUB_ACTIONS") == "true":
        for line in github_annotations(result, strict=strict):
            print(line, file=out)
    summary_path = env.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        with open(summary_path, "a", encoding="utf-8") as fh:
            fh.write(step_summary(result, strict=strict) + "\n")
