"""Markdown reports: one page per contract and an index across contracts (GitHub-flavoured).

Every text that comes from a contract or a result is escaped for HTML (``_text``, ``_cell``) or put in a code
span or fence that it cannot close (``_code``, ``_fence``): Markdown passes raw HTML through, and a contract's
``<script>`` must reach a reader as text, as it does in the HTML reports.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from obligations.reporting import libm_table, torch_table
from obligations.reporting.evidence import Fact
from obligations.reporting.model import STATUSES, contract_summary, gate_verdict
from obligations.reporting.plots import MISSING_MATPLOTLIB, plots_available
from obligations.reporting.provenance import stamp_line
from obligations.reporting.views import (
    ItemView,
    coverage_facts,
    item_view,
    not_adopted_facts,
    provenance_facts,
    qa_gate_facts,
    report_stamp,
)

__all__ = ["render_contract_markdown", "render_index_markdown"]

PlotFiles = Mapping[tuple[str, str], str]

_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")


def _text(text: Any) -> str:
    """``text`` that Markdown cannot read as raw HTML: a ``<`` that could open a tag, a comment or a processing
    instruction (CommonMark: ``<`` before a letter, ``/``, ``!`` or ``?``) becomes ``&lt;``; ``1 <= m`` stays."""
    return _TAG_OPEN.sub("&lt;", str(text))


def _cell(text: Any) -> str:
    return _text(str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " "))


def _link(target: str) -> str:
    """A link target that stays one (no spaces, parentheses or angle brackets)."""
    return urllib.parse.quote(str(target), safe="/#.-_~")


def _fence(lang: str, body: Any) -> list[str]:
    """A fenced block that ``body`` cannot close (its fence is longer than any run of backticks in it)."""
    body = str(body)
    ticks = 3
    while "`" * ticks in body:
        ticks += 1
    return ["`" * ticks + lang, body, "`" * ticks]


def _code(text: Any) -> str:
    text = str(text).replace("\n", " ")
    ticks = 1
    while "`" * ticks in text:
        ticks += 1
    fence = "`" * ticks
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _anchor(item_id: str) -> str:
    return "".join(ch for ch in item_id.lower().replace(" ", "-") if ch.isalnum() or ch in "-_")


def _facts_table(facts: list[Fact] | tuple[Fact, ...], head: tuple[str, str] = ("Evidence", "Value")) -> list[str]:
    lines = [f"| {head[0]} | {head[1]} |", "| --- | --- |"]
    lines += [f"| {_cell(f.label)} | {_cell(f.value)} |" for f in facts if not f.block]
    for f in facts:
        if f.block:
            lines += ["", f"**{_text(f.label)}:**", "", *_fence("text", f.value)]
    return lines


def _statement_lines(view: ItemView) -> list[str]:
    if not view.statement:
        return []
    lines = ["**Formal statement:**", ""]
    for clause, rendered in view.statement:
        if rendered.parsed:
            lines += [
                f"*{_text(clause)}*",
                "",
                *_fence("math", rendered.latex or ""),
                "",
                f"<sub>source: {_code(rendered.text)}</sub>",
                "",
            ]
        else:
            lines += [f"*{_text(clause)}*: {_code(rendered.text)}", ""]
    return lines


def _plot_lines(view: ItemView, plot_files: PlotFiles | None) -> list[str]:
    lines: list[str] = []
    for kind in view.plots:
        path = (plot_files or {}).get((view.id, kind.name))
        if path:
            lines += [
                f"![{_cell(kind.title)} for {_cell(view.id)}]({_link(path)})",
                "",
                f"*{_cell(kind.caption(view.raw))}*",
                "",
            ]
        else:
            why = MISSING_MATPLOTLIB if not plots_available() else "plots were not requested"
            lines += [f"*{kind.title} left out: {why}.*", ""]
    return lines


def _item_section(view: ItemView, plot_files: PlotFiles | None) -> list[str]:
    lines = [
        f"### {_text(view.id)}",
        "",
        f"{view.style.mark} **{_text(view.status)}** · claim: **{_text(view.claim_label)}** · "
        f"{_text(view.kind)} · type {_code(view.type)} · method {_code(view.method)}",
        "",
    ]
    if view.property:
        lines += [f"**Property:** {_text(view.property)}", ""]
    if view.prediction:
        lines += [f"**Prediction:** {_text(view.prediction)}", ""]
    lines += _statement_lines(view)
    lines += [f"**What the evidence supports:** {_text(view.claim_text)}", ""]
    if view.reason and view.status != "violated":
        lines += [f"**Reason:** {_text(view.reason)}", ""]
    if view.facts:
        lines += _facts_table(view.facts) + [""]
    if view.counterexample is not None:
        lines += ["**Counterexample:**", "", *_fence("json", view.counterexample), ""]
    if view.replay:
        lines += ["**Replay:**", "", *_fence("sh", view.replay), ""]
    lines += _plot_lines(view, plot_files)
    return lines


def _summary_table(counts: Mapping[str, int]) -> list[str]:
    keys = [s for s in STATUSES] + [s for s in counts if s not in STATUSES]
    return [
        "| " + " | ".join(_cell(k) for k in keys) + " |",
        "|" + " --- |" * len(keys),
        "| " + " | ".join(str(counts.get(k, 0)) for k in keys) + " |",
    ]


def render_contract_markdown(
    result: Mapping[str, Any],
    contract: Mapping[str, Any],
    *,
    plot_files: PlotFiles | None = None,
) -> str:
    """The Markdown report of one contract of ``result``; ``plot_files``: (item id, plot name) -> path."""
    prov = result.get("provenance") or {}
    views = [item_view(item, contract, prov) for item in contract.get("items", [])]
    lines = [stamp_line(report_stamp(result, [contract])), ""]
    lines += [f"# {_text(contract['id'])}", ""]
    if contract.get("summary"):
        lines += [_text(contract["summary"]), ""]
    device = prov.get("device") if isinstance(prov.get("device"), Mapping) else {}
    lines += [
        f"Version {_text(contract.get('version', '?'))} · family {_code(contract.get('family', '?'))} · "
        f"source {_code(contract['path'])} · checked {_text(prov.get('started', '?'))} on "
        f"{_text(device.get('name') or device.get('kind', '?'))}",
        "",
    ]
    lines += ["## Summary", ""] + _summary_table(contract_summary(contract)) + [""]
    lines += ["| Item | Type | Method | Status | Claim |", "| --- | --- | --- | --- | --- |"]
    for v in views:
        lines.append(
            f"| [{_cell(v.id)}](#{_anchor(v.id)}) | {_cell(v.type)} | {_cell(v.method)} | "
            f"{v.style.mark} {_cell(v.status)} | {_cell(v.claim_label)} |"
        )
    lines.append("")
    gate = qa_gate_facts(contract)
    if gate:
        lines += ["## QA gate", ""] + _facts_table(gate, ("QA gate", "Value")) + [""]
    coverage = coverage_facts(contract)
    if coverage:
        lines += ["## Coverage", ""] + _facts_table(coverage, ("Coverage", "Evidence")) + [""]
    scope = not_adopted_facts(contract)
    if scope:
        lines += [
            "## Seed claims not adopted",
            "",
            "Declared by the contract with a reason; not checked and given no status.",
            "",
        ]
        lines += _facts_table(scope, ("Claim", "Declared")) + [""]
    lines += libm_table.markdown_lines(contract)
    lines += torch_table.markdown_lines(contract)
    lines += ["## Items", ""]
    for v in views:
        lines += _item_section(v, plot_files)
    lines += ["## Provenance", ""] + _facts_table(provenance_facts(result, contract), ("Provenance", "Value"))
    return "\n".join(lines).rstrip() + "\n"


def render_index_markdown(result: Mapping[str, Any], *, html: bool = True) -> str:
    """The Markdown index across every contract of ``result``, linking each contract's report."""
    contracts = list(result.get("contracts", []))
    lines = [stamp_line(report_stamp(result, contracts)), "", "# Kernel contract reports", ""]
    totals = dict.fromkeys(STATUSES, 0)
    for c in contracts:
        for k, n in contract_summary(c).items():
            totals[k] = totals.get(k, 0) + n
    lines += ["## Totals", ""] + _summary_table(totals) + [""]
    head = "| Contract | Family | Version | " + " | ".join(STATUSES) + " | QA gate | Pages |"
    lines += ["## Contracts", "", head, "|" + " --- |" * (len(STATUSES) + 5)]
    for c in contracts:
        counts = contract_summary(c)
        pages = f"[md]({_link(c['id'] + '.md')})" + (f" · [html]({_link(c['id'] + '.html')})" if html else "")
        lines.append(
            f"| [{_cell(c['id'])}]({_link(c['id'] + '.md')}) | {_cell(c.get('family', ''))} | "
            f"{_cell(c.get('version', ''))} | "
            + " | ".join(str(counts[s]) for s in STATUSES)
            + f" | {_cell(gate_verdict(c))} | {pages} |"
        )
    attention = [
        (c, i) for c in contracts for i in c.get("items", []) if i["status"] in ("violated", "error", "inconclusive")
    ]
    expected = [(c, i) for c in contracts for i in c.get("items", []) if i["status"] == "violated_expected"]
    if attention:
        lines += [
            "",
            "## Needs attention",
            "",
            "| Contract | Item | Status | Reason |",
            "| --- | --- | --- | --- |",
        ]
        for c, i in attention:
            lines.append(
                f"| {_cell(c['id'])} | [{_cell(i['id'])}]({_link(c['id'] + '.md')}#{_anchor(str(i['id']))}) | "
                f"{_cell(i['status'])} | {_cell(i.get('reason') or '')} |"
            )
    if expected:  # declared findings (``expect: violated``), reproduced: shown as such, not as failures
        lines += ["", "## Expected deviations", "", "| Contract | Item | Reason |", "| --- | --- | --- |"]
        for c, i in expected:
            lines.append(
                f"| {_cell(c['id'])} | [{_cell(i['id'])}]({_link(c['id'] + '.md')}#{_anchor(str(i['id']))}) | "
                f"{_cell(i.get('reason') or '')} |"
            )
    lines += ["", "## Provenance", ""] + _facts_table(provenance_facts(result), ("Provenance", "Value"))
    return "\n".join(lines).rstrip() + "\n"
