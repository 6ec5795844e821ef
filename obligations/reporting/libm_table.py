"""The math-library audit table of a contract page: one row per ``libm.audit`` item.

Columns: function, environment, max ULP over the inputs a documented ULP bound covers (and over every
input where that differs), where (the input of the overall maximum; the largest absolute error where a
documented bound is absolute), NVIDIA's documented bound, how many inputs MPFR
settled, and the item's verdict. Items whose evidence lacks the audit's fields (host runs) show the reason.
The per-function ULP histogram is the item's ``ulp_histogram`` plot (:mod:`obligations.reporting.plots`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from html import escape
from typing import Any

__all__ = ["HEAD", "libm_rows", "markdown_lines", "html_lines"]

HEAD = ("Function", "Env", "Max ulp (documented range)", "Where", "Documented bound", "Settled by MPFR", "Verdict")


def _where(ev: Mapping[str, Any]) -> str:
    m = ev.get("max_ulp") or {}
    out = f"{m.get('input', '')} (x = {m.get('x', '?')})" if m else ""
    a = ev.get("max_abs_error")
    if isinstance(a, Mapping):
        out += f"; abs error {float(a.get('error', 0.0)):.3g} at {a.get('input', '?')}"
    return out


def libm_rows(contract: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The table's rows for the contract's audit items (empty when it has none)."""
    rows = []
    for item in contract.get("items", []):
        if item.get("test") != "libm.audit":
            continue
        ev = item.get("evidence") or {}
        fn = str(ev.get("function") or item.get("id"))
        env = str(ev.get("env") or "")
        if "settled_by_mpfr" not in ev:
            rows.append((fn, env, "", "", "", "", f"{item.get('status', '?')}: {item.get('reason', '')}"))
            continue
        m = ev.get("max_ulp") or {}
        mj = ev.get("max_ulp_in_documented_range") or {}
        top = str(mj.get("ulp", "-"))
        if m and m.get("ulp") != mj.get("ulp"):
            top += f" (all inputs: {m.get('ulp')})"
        verdict = str(item.get("status", "?"))
        if ev.get("violations"):
            w = ev.get("worst_violation") or {}
            verdict += f" ({ev['violations']} inputs; worst {w.get('input', '?')})"
        rows.append(
            (
                fn,
                env,
                top,
                _where(ev),
                str(ev.get("documented_bound", "")),
                str(ev.get("settled_by_mpfr", "")),
                verdict,
            )
        )
    return rows


_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")


def markdown_lines(contract: Mapping[str, Any]) -> list[str]:
    """The section in Markdown (no lines when the contract has no audit items)."""
    rows = libm_rows(contract)
    if not rows:
        return []
    out = ["## Math-library audit", "", "| " + " | ".join(HEAD) + " |", "|" + " --- |" * len(HEAD)]
    # cells carry contract text: no raw HTML (Markdown passes it through), as html_lines escapes it
    out += ["| " + " | ".join(_TAG_OPEN.sub("&lt;", c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return [*out, ""]


def html_lines(contract: Mapping[str, Any]) -> list[str]:
    """The section in HTML (no lines when the contract has no audit items)."""
    rows = libm_rows(contract)
    if not rows:
        return []
    out = ["<h2>Math-library audit</h2>", '<table class="libm"><thead><tr>']
    out += [f"<th>{escape(h)}</th>" for h in HEAD]
    out.append("</tr></thead><tbody>")
    out += ["<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows]
    return [*out, "</tbody></table>"]
