"""Self-contained HTML report of one contract: inline CSS, base64 PNG plots, MathML; no script or network."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from html import escape
from typing import Any

from obligations.reporting import libm_table, torch_table
from obligations.reporting.evidence import Fact
from obligations.reporting.model import GATE_EXPECTED, STATUSES, contract_summary, gate_verdict, status_style
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

__all__ = ["render_contract_html", "render_index_html", "gate_verdict_html"]

# The QA gate verdict's colour: green passed, red not passed, grey not evaluated, and the colour of
# violated_expected for a gate whose only shortfall is documented deviations.
_GATE_COLOURS = {
    "passed": "#1a7f37",
    "not passed": "#cf222e",
    "not evaluated": "#57606a",
    GATE_EXPECTED: status_style("violated_expected").colour,
}

_GATE_TITLES = {
    GATE_EXPECTED: "every required item has evidence or is a deviation the contract documents (violated_expected)"
}

PlotImages = Mapping[tuple[str, str], bytes]

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;max-width:64rem;
 padding:0 1rem;color:#1f2328;line-height:1.45}
h1{margin-bottom:.2rem} .meta{color:#57606a;margin-top:0}
table{border-collapse:collapse;margin:.6rem 0 1rem} th,td{border:1px solid #d0d7de;padding:.25rem .6rem;
 text-align:left;vertical-align:top} th{background:#f6f8fa}
.status{font-weight:600;white-space:nowrap} section.item{border-top:1px solid #d0d7de;padding-top:.4rem}
.badges span{display:inline-block;margin-right:.8rem} code,pre{background:#f6f8fa;border-radius:4px}
code{padding:0 .25rem} pre{padding:.6rem;overflow-x:auto} figure{margin:.6rem 0}
figcaption{color:#57606a;font-size:.9rem} img.plot{max-width:100%;height:auto;border:1px solid #d0d7de}
math{font-size:1.1rem} .clause{margin:.3rem 0;overflow-wrap:anywhere} .note{color:#57606a;font-style:italic}
.clause math{display:inline-block;max-width:100%;overflow-x:auto;vertical-align:middle}
code{overflow-wrap:anywhere;word-break:break-word} pre{white-space:pre-wrap;overflow-wrap:anywhere}
td{overflow-wrap:anywhere} .gate{font-weight:700;padding:.1rem .5rem;border-radius:4px;color:#fff}
th{overflow-wrap:normal;word-break:normal;hyphens:none} thead th{white-space:nowrap}
table.contracts td,table.items td,table.summary td{overflow-wrap:normal;word-break:normal}
table.contracts td:first-child,table.items td:first-child{white-space:nowrap}
.wide{overflow-x:auto;max-width:100%} .gate{display:inline-block;white-space:nowrap}
body.index{max-width:none} table.contracts thead th{white-space:normal}
table.contracts th,table.contracts td{padding:.25rem .45rem}
""".strip()


def gate_verdict_html(status: str | None) -> str:
    """The QA gate verdict as a coloured badge."""
    text = status or "not evaluated"
    colour = _GATE_COLOURS.get(text, _GATE_COLOURS["not evaluated"])
    title = f' title="{escape(_GATE_TITLES[text])}"' if text in _GATE_TITLES else ""
    return f'<span class="gate" data-gate="{escape(text)}"{title} style="background:{colour}">{escape(text)}</span>'


def _status(status: str) -> str:
    style = status_style(status)
    return f'<span class="status" style="color:{style.colour}">{escape(style.mark)} {escape(status)}</span>'


def _facts_table(facts: list[Fact] | tuple[Fact, ...], css: str, head: tuple[str, str]) -> list[str]:
    rows = [f'<table class="{css}"><thead><tr><th>{escape(head[0])}</th><th>{escape(head[1])}</th></tr></thead><tbody>']
    rows += [f"<tr><th>{escape(f.label)}</th><td>{escape(f.value)}</td></tr>" for f in facts if not f.block]
    rows.append("</tbody></table>")
    for f in facts:
        if f.block:
            rows.append(f"<p><strong>{escape(f.label)}</strong></p><pre>{escape(f.value)}</pre>")
    return rows


def _statement(view: ItemView) -> list[str]:
    if not view.statement:
        return []
    out = ['<div class="statement"><strong>Formal statement</strong>']
    for clause, rendered in view.statement:
        if rendered.parsed and rendered.mathml:
            out.append(
                f'<div class="clause"><em>{escape(clause)}</em>: '
                f'<math display="inline">{rendered.mathml}</math> '
                f'<small class="source">source: <code>{escape(rendered.text)}</code></small></div>'
            )
        else:
            out.append(f'<div class="clause"><em>{escape(clause)}</em>: <code>{escape(rendered.text)}</code></div>')
    out.append("</div>")
    return out


def _plots(view: ItemView, plot_images: PlotImages | None) -> list[str]:
    out = []
    for kind in view.plots:
        png = (plot_images or {}).get((view.id, kind.name))
        if png:
            data = base64.b64encode(png).decode("ascii")
            out.append(
                f'<figure><img class="plot" data-plot="{escape(kind.name)}" '
                f'alt="{escape(kind.title)} for {escape(view.id)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{escape(kind.caption(view.raw))}</figcaption></figure>"
            )
        else:
            why = MISSING_MATPLOTLIB if not plots_available() else "plots were not requested"
            out.append(f'<p class="note">{escape(kind.title)} left out: {escape(why)}.</p>')
    return out


def _item(view: ItemView, plot_images: PlotImages | None) -> list[str]:
    out = [
        f'<section class="item" id="{escape(view.id)}" data-status="{escape(view.status)}">',
        f"<h3>{escape(view.id)}</h3>",
        f'<p class="badges">{_status(view.status)}'
        f"<span>claim: <strong>{escape(view.claim_label)}</strong></span>"
        f"<span>{escape(view.kind)}</span><span>type <code>{escape(view.type)}</code></span>"
        f"<span>method <code>{escape(view.method)}</code></span></p>",
    ]
    if view.property:
        out.append(f"<p><strong>Property:</strong> {escape(view.property)}</p>")
    if view.prediction:
        out.append(f"<p><strong>Prediction:</strong> {escape(view.prediction)}</p>")
    out += _statement(view)
    out.append(f"<p><strong>What the evidence supports:</strong> {escape(view.claim_text)}</p>")
    if view.reason and view.status != "violated":
        out.append(f"<p><strong>Reason:</strong> {escape(view.reason)}</p>")
    if view.facts:
        out += _facts_table(view.facts, "evidence", ("Evidence", "Value"))
    if view.counterexample is not None:
        out.append(
            f'<p><strong>Counterexample</strong></p><pre class="counterexample">{escape(view.counterexample)}</pre>'
        )
    if view.replay:
        out.append(f'<p><strong>Replay</strong></p><pre class="replay">{escape(view.replay)}</pre>')
    out += _plots(view, plot_images)
    out.append("</section>")
    return out


def render_contract_html(
    result: Mapping[str, Any],
    contract: Mapping[str, Any],
    *,
    plot_images: PlotImages | None = None,
) -> str:
    """A self-contained HTML page for one contract; ``plot_images`` maps (item id, plot name) to PNG bytes."""
    prov = result.get("provenance") or {}
    views = [item_view(item, contract, prov) for item in contract.get("items", [])]
    cid = escape(str(contract["id"]))
    device = prov.get("device") or {}
    counts = contract_summary(contract)
    keys = list(STATUSES) + [s for s in counts if s not in STATUSES]
    out = [
        "<!DOCTYPE html>",
        stamp_line(report_stamp(result, [contract])),
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        # No script, no remote anything: images are data: URIs, styles inline.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
        "style-src 'unsafe-inline'\">",
        f"<title>{cid}: kernel contract report</title><style>{_CSS}</style></head><body>",
        f"<h1>{cid}</h1>",
        f"<p>{escape(str(contract.get('summary') or ''))}</p>",
        f'<p class="meta">Version {escape(str(contract.get("version", "?")))} · family '
        f"<code>{escape(str(contract.get('family', '?')))}</code> · "
        f"source <code>{escape(str(contract['path']))}</code>"
        f" · checked {escape(str(prov.get('started', '?')))} on "
        f"{escape(str(device.get('name') or device.get('kind') or '?'))}</p>",
        "<h2>Summary</h2>",
        '<div class="wide"><table class="summary"><thead><tr>'
        + "".join(f"<th>{escape(_header(k))}</th>" for k in keys)
        + "</tr></thead>"
        "<tbody><tr>" + "".join(f"<td>{counts.get(k, 0)}</td>" for k in keys) + "</tr></tbody></table></div>",
        '<div class="wide"><table class="items"><thead><tr><th>Item</th><th>Type</th><th>Method</th><th>Status</th>'
        "<th>Claim</th>"
        "</tr></thead><tbody>",
    ]
    for v in views:
        out.append(
            f'<tr data-item="{escape(v.id)}"><td><a href="#{escape(v.id)}">{escape(v.id)}</a></td>'
            f"<td>{escape(v.type)}</td><td>{escape(v.method)}</td><td>{_status(v.status)}</td>"
            f"<td>{escape(v.claim_label)}</td></tr>"
        )
    out.append("</tbody></table></div>")
    gate = qa_gate_facts(contract)
    if gate:
        out += [
            "<h2>QA gate</h2>",
            f"<p>Verdict: {gate_verdict_html(gate_verdict(contract))}</p>",
            *_facts_table(gate, "qa-gate", ("QA gate", "Value")),
        ]
    coverage = coverage_facts(contract)
    if coverage:
        out += ["<h2>Coverage</h2>", *_facts_table(coverage, "coverage", ("Coverage", "Evidence"))]
    out += libm_table.html_lines(contract)
    out += torch_table.html_lines(contract)
    scope = not_adopted_facts(contract)
    if scope:
        out += [
            "<h2>Seed claims not adopted</h2>",
            "<p>Declared by the contract with a reason; not checked and given no status.</p>",
            *_facts_table(scope, "not-adopted", ("Claim", "Declared")),
        ]
    out.append("<h2>Items</h2>")
    for v in views:
        out += _item(v, plot_images)
    out += ["<h2>Provenance</h2>"]
    out += _facts_table(provenance_facts(result, contract), "provenance", ("Provenance", "Value"))
    out += ["</body></html>"]
    return "\n".join(out) + "\n"


def _header(status: str) -> str:
    """A status as a column header: ``violated_expected`` may break between its words, never inside one."""
    return status.replace("_", " ")


def render_index_html(result: Mapping[str, Any], *, html_pages: bool = True) -> str:
    """index.html: every contract of ``result`` with its counts, its coloured QA gate verdict and a link."""
    prov = result.get("provenance") or {}
    device = prov.get("device") or {}
    contracts = list(result.get("contracts", []))
    out = [
        "<!DOCTYPE html>",
        stamp_line(report_stamp(result, contracts)),
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f'<title>Kernel contract reports</title><style>{_CSS}</style></head><body class="index">',
        "<h1>Kernel contract reports</h1>",
        f'<p class="meta">checked {escape(str(prov.get("started", "?")))} on '
        f"{escape(str(device.get('name') or device.get('kind') or '?'))}"
        f" · profile {escape(str(prov.get('profile') or '?'))}</p>",
        # the verdict next to the name: on a narrow window the counts scroll, the verdict stays in view
        '<div class="wide"><table class="contracts"><thead><tr><th>Contract</th><th>QA gate</th><th>Family</th>'
        "<th>Version</th>" + "".join(f"<th>{escape(_header(k))}</th>" for k in STATUSES) + "</tr></thead><tbody>",
    ]
    for c in contracts:
        counts = contract_summary(c)
        cid = escape(str(c["id"]))
        name = f'<a href="{escape(report_file(str(c["id"])))}.html">{cid}</a>' if html_pages else cid
        out.append(
            f"<tr><td>{name}</td><td>{gate_verdict_html(gate_verdict(c))}</td>"
            f"<td>{escape(str(c.get('family', '')))}</td><td>{escape(str(c.get('version', '')))}</td>"
            + "".join(f"<td>{counts.get(k, 0)}</td>" for k in STATUSES)
            + "</tr>"
        )
    out += ["</tbody></table></div>", "</body></html>"]
    return "\n".join(out) + "\n"


def report_file(contract_id: str) -> str:
    """The file stem of a contract's report (the same rule as the writer's)."""
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "_", contract_id).strip("._") or "item"
