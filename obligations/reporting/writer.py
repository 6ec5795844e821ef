"""`kc report`: write every report for a check result into one directory."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from obligations.atomic import write_bytes_atomic, write_text_atomic
from obligations.reporting.html import render_contract_html, render_index_html
from obligations.reporting.markdown import render_contract_markdown, render_index_markdown
from obligations.reporting.model import validate_result
from obligations.reporting.plots import plots_for, render_plot

__all__ = ["write_reports", "report_paths"]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "item"


def report_paths(out_dir: str | Path, contract_id: str) -> tuple[Path, Path]:
    """Where the Markdown and HTML reports of ``contract_id`` go under ``out_dir``."""
    out = Path(out_dir)
    return out / f"{_safe(contract_id)}.md", out / f"{_safe(contract_id)}.html"


def write_reports(
    result: Mapping[str, Any],
    out_dir: str | Path,
    *,
    html: bool = True,
    plots: bool = True,
) -> list[Path]:
    """Write <id>.md (+ <id>.html) per contract, index.md (+ index.html) and plot PNGs; return the paths.

    Plots are drawn only when ``plots`` is true and matplotlib is importable; otherwise reports say why a
    plot is missing.
    """
    validate_result(result)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for contract in result["contracts"]:
        cid = str(contract["id"])
        images: dict[tuple[str, str], bytes] = {}
        files: dict[tuple[str, str], str] = {}
        if plots:
            for item in contract.get("items", []):
                for kind in plots_for(item):
                    png = render_plot(kind, item)
                    if png is None:
                        continue
                    rel = Path("plots") / _safe(cid) / f"{_safe(str(item['id']))}-{kind.name}.png"
                    (out / rel).parent.mkdir(parents=True, exist_ok=True)
                    write_bytes_atomic(out / rel, png)
                    written.append(out / rel)
                    images[(str(item["id"]), kind.name)] = png
                    files[(str(item["id"]), kind.name)] = rel.as_posix()
        md_path, html_path = report_paths(out, cid)
        write_text_atomic(md_path, render_contract_markdown(result, contract, plot_files=files))
        written.append(md_path)
        if html:
            write_text_atomic(html_path, render_contract_html(result, contract, plot_images=images))
            written.append(html_path)
    index = out / "index.md"
    write_text_atomic(index, render_index_markdown(result, html=html))
    written.append(index)
    if html:
        index_html = out / "index.html"
        write_text_atomic(index_html, render_index_html(result))
        written.append(index_html)
    return written
