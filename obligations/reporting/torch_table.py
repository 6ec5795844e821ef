"""The PyTorch audit sections of a contract page: one row per ``torch.audit`` item, one per Inductor step.

Audit columns: op, backend, cases run (and configurations the backend refused), the worst error / derived bound
and where, NaN/Inf handling against the spec, bitwise reruns, the item's verdict. Items whose evidence lacks the
audit's fields (host runs, torch absent) show the reason. The Inductor section (a ``torch.inductor`` item) lists
each step of the fused program with Inductor's generated kernels and library calls and how they agree with the
denotation (bitwise, within bound, beyond), then the whole block's end-to-end error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from html import escape
from typing import Any

__all__ = ["HEAD", "INDUCTOR_HEAD", "audit_rows", "inductor_rows", "markdown_lines", "html_lines"]

HEAD = ("Op", "Backend", "Cases", "Worst error / bound", "Where", "NaN/Inf vs spec", "Bitwise reruns", "Verdict")
INDUCTOR_HEAD = ("Step", "Kind", "Ops", "Inductor's kernels", "Library calls", "Agreement with the IR")


def _special(ev: Mapping[str, Any]) -> str:
    n = int(ev.get("class_mismatches") or 0)
    out = "as spec" if not n else f"{n} differ ({'; '.join(ev.get('class_mismatch_kinds', [])[:2])})"
    return out + f"; {ev.get('special_elements', 0)} special"


def audit_rows(contract: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The audit table's rows (empty when the contract has no ``torch.audit`` items)."""
    rows = []
    for item in contract.get("items", []):
        if item.get("test") != "torch.audit":
            continue
        ev = item.get("evidence") or {}
        status = str(item.get("status", "?"))
        op, backend = str(ev.get("op") or item.get("id")), str(ev.get("backend") or "")
        if "judged_elements" not in ev:
            rows.append((op, backend, "", "", "", "", "", f"{status}: {item.get('reason', '')}"))
            continue
        w = ev.get("worst") or {}
        cases = str(ev.get("cases", ""))
        if ev.get("unsupported"):
            cases += f" ({len(ev['unsupported'])} refused by the backend)"
        ratio = f"{float(w['ratio']):.3g}" if w and ev.get("bound") else ("no derived bound" if w else "")
        where = f"{w.get('case', '')} at {w.get('index', '')}" if w else ""
        det = "yes" if ev.get("deterministic") else f"no: {', '.join(ev.get('nondeterministic', [])[:3])}"
        verdict = status if status in ("passed",) else f"{status}: {item.get('reason', '')}"
        rows.append((op, backend, cases, ratio, where, _special(ev), det, verdict))
    return rows


def inductor_rows(contract: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The Inductor section's rows (empty without a ``torch.inductor`` item carrying steps)."""
    rows = []
    for item in contract.get("items", []):
        if item.get("test") != "torch.inductor":
            continue
        ev = item.get("evidence") or {}
        for s in ev.get("steps") or []:
            k = s.get("kernels") or {}
            rows.append(
                (
                    str(s.get("step")),
                    str(s.get("kind")),
                    " ".join(s.get("ops", [])),
                    " ".join(k.get("generated", [])) or "-",
                    " ".join(k.get("extern", [])) or "-",
                    str(s.get("agreement")),
                )
            )
        blk = ev.get("block") or {}
        if blk:
            kernels = " ".join((blk.get("kernels") or {}).get("generated", []))
            err = blk.get("end_to_end_max_rel_error")
            rows.append(("block", "whole", "every op", kernels, "", f"end-to-end max relative error {err}"))
    return rows


_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")


def _md_table(title: str, head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    out = [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    # cells carry contract and evidence text: no raw HTML (Markdown passes it through), as the HTML escapes it
    out += ["| " + " | ".join(_TAG_OPEN.sub("&lt;", c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return [*out, ""]


def _html_table(title: str, head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    out = [f"<h2>{escape(title)}</h2>", '<table class="torch"><thead><tr>']
    out += [f"<th>{escape(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    out += ["<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows]
    return [*out, "</tbody></table>"]


def markdown_lines(contract: Mapping[str, Any]) -> list[str]:
    """The sections in Markdown (no lines when the contract has neither kind of item)."""
    out: list[str] = []
    if rows := audit_rows(contract):
        out += _md_table("PyTorch op audit", HEAD, rows)
    if rows := inductor_rows(contract):
        out += _md_table("Inductor against the IR", INDUCTOR_HEAD, rows)
    return out


def html_lines(contract: Mapping[str, Any]) -> list[str]:
    """The sections in HTML (no lines when the contract has neither kind of item)."""
    out: list[str] = []
    if rows := audit_rows(contract):
        out += _html_table("PyTorch op audit", HEAD, rows)
    if rows := inductor_rows(contract):
        out += _html_table("Inductor against the IR", INDUCTOR_HEAD, rows)
    return out
