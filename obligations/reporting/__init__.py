"""Reports of a `kc check --json` result: Markdown, self-contained HTML, plots, and the staleness check.

The CLI needs only ``load_result``, ``write_reports`` and ``check_reports``; the registries
(``register_evidence_renderer``, ``register_plot``, ``register_claim``) extend what reports show.
"""

from __future__ import annotations

from obligations.reporting.evidence import EvidenceRenderer, Fact, evidence_facts, register_evidence_renderer
from obligations.reporting.html import render_contract_html
from obligations.reporting.markdown import render_contract_markdown, render_index_markdown
from obligations.reporting.model import ClaimDescriber, describe_claim, load_result, register_claim
from obligations.reporting.plots import PlotKind, plots_available, register_plot, render_plot
from obligations.reporting.provenance import ReportStamp, check_reports, current_tool_version, read_stamp
from obligations.reporting.statement import RenderedStatement, render_statement
from obligations.reporting.writer import report_paths, write_reports

__all__ = [
    "load_result",
    "write_reports",
    "check_reports",
    "report_paths",
    "render_contract_markdown",
    "render_index_markdown",
    "render_contract_html",
    "render_statement",
    "RenderedStatement",
    "describe_claim",
    "evidence_facts",
    "Fact",
    "EvidenceRenderer",
    "register_evidence_renderer",
    "PlotKind",
    "register_plot",
    "render_plot",
    "plots_available",
    "ClaimDescriber",
    "register_claim",
    "ReportStamp",
    "read_stamp",
    "current_tool_version",
]
