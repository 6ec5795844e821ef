"""Reports from a `kc check --json` result: Markdown, self-contained HTML, plots and the staleness check."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from obligations.reporting import (
    check_reports,
    current_tool_version,
    evidence_facts,
    load_result,
    plots_available,
    read_stamp,
    render_contract_html,
    render_contract_markdown,
    render_statement,
    write_reports,
)
from obligations.reporting.model import describe_claim

FIXTURES = Path(__file__).parent / "fixtures"
RESULT = FIXTURES / "result_sample.json"
CONTRACT_FILES = {"gemm-cublas-v1": "contract_sample.yaml", "cub-reduce-sum-v1": "contract_sample_reduce.yaml"}

needs_matplotlib = pytest.mark.skipif(not plots_available(), reason="matplotlib not installed (report extra)")


@pytest.fixture()
def result() -> dict:
    return load_result(RESULT)


@pytest.fixture()
def contracts_dir(tmp_path: Path, result: dict) -> Path:
    """The fixture contracts laid out as the result's paths name them (contracts/<id>.yaml)."""
    d = tmp_path / "contracts"
    d.mkdir()
    for contract in result["contracts"]:
        shutil.copy(FIXTURES / CONTRACT_FILES[contract["id"]], d / Path(contract["path"]).name)
    return d


def _gemm(result: dict) -> dict:
    return next(c for c in result["contracts"] if c["id"] == "gemm-cublas-v1")


# --- fixture integrity ---------------------------------------------------------------------------------


def test_fixture_covers_every_status_and_records_contract_hashes(result: dict, contracts_dir: Path) -> None:
    import hashlib

    statuses = {i["status"] for c in result["contracts"] for i in c["items"]}
    assert statuses == {"proved", "exhausted", "passed", "violated", "unknown", "skipped", "error"}
    assert {i["claim"] for c in result["contracts"] for i in c["items"]} >= {
        "proved",
        "exhausted",
        "tested",
        "assumed",
        "violated",
        "none",
    }
    for contract in result["contracts"]:
        digest = hashlib.sha256((contracts_dir / Path(contract["path"]).name).read_bytes()).hexdigest()
        assert digest == contract["sha256"], f"{contract['id']}: fixture sha256 out of date"
    counted = {s: 0 for s in result["summary"]}
    for c in result["contracts"]:
        for i in c["items"]:
            counted[i["status"]] += 1
    assert counted == result["summary"]


def test_load_result_rejects_what_is_not_a_result(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tool": {}, "contracts": []}))
    with pytest.raises(ValueError, match="provenance"):
        load_result(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        load_result(bad)


# --- content -----------------------------------------------------------------------------------------


def test_markdown_shows_each_item_with_claim_evidence_and_provenance(result: dict) -> None:
    md = render_contract_markdown(result, _gemm(result))
    for item in _gemm(result)["items"]:
        assert f"### {item['id']}" in md
        assert f"[{item['id']}](#{item['id'].lower()})" in md
    # claim levels in words, with their evidence
    assert "Proved by z3 under 4 assumption(s) (listed under Assumptions)" in md
    assert md.count("1 <= m <= 65536; 1 <= k <= 65536") == 1  # assumptions printed once
    assert "Checked at every point of the stated domain: 512 points, 512 of them inside the assumptions" in md
    assert "Parity tested on 1,000 cases (seed 0), max_ulp agreement (tolerance 2)" in md
    assert "Assumed, not checked: vendor-library behaviour (cuBLAS 13.0 documentation)" in md
    assert "| Solver resource use | 18,234 of rlimit 2,000,000 |" in md
    assert "| ULP histogram | 0 ULP: 995, 1 ULP: 5 |" in md
    assert "| Worst observed/bound ratio | 0.116 at k = 16 |" in md
    assert "| Ratio ours/peer | 1.01 (limit 1.1) |" in md
    # the violated item: counterexample and replay command
    section = md.split("### FT-GEMM-004", 1)[1].split("### ", 1)[0]
    assert '"expected": "0x3f800001"' in section
    assert "kc check contracts/gemm-cublas-v1.yaml --only FT-GEMM-004 --device cuda --seed 0" in section
    # provenance
    for needle in (
        "3f9c2a1d5be0",
        _gemm(result)["sha256"],
        "| numpy | 2.4.6 |",
        "| cupy | 14.0.1 |",
        "| z3-solver | 4.15.4 |",
        "| hypothesis | 6.155.2 |",
        "| Driver | 580.95.05 |",
        "| CUDA runtime | 13.0 |",
        "| Checked at | 2026-11-21T10:00:00Z |",
        "NVIDIA H200",
    ):
        assert needle in md, needle


def test_claims_never_overstate_the_evidence(result: dict) -> None:
    items = {i["id"]: i for i in _gemm(result)["items"]}
    assert "not a proof" in describe_claim(items["FT-GEMM-001"])
    assert describe_claim(items["PO-GEMM-004"]).startswith("Nothing")
    assert describe_claim(items["FT-GEMM-005"]).startswith("Nothing")
    assert "Refuted" in describe_claim(items["FT-GEMM-004"])
    forged = dict(items["FT-GEMM-001"], claim="unheard-of-claim")
    assert describe_claim(forged).startswith("Nothing")


def test_statement_rendered_through_the_project_parser_or_shown_raw(result: dict) -> None:
    ok = render_statement("accepts implies lda >= max(1, m)")
    assert ok.parsed and r"\Rightarrow" in (ok.latex or "") and "<mi>lda</mi>" in (ok.mathml or "")
    raw = render_statement("sum(owned(t) for t in threads) == n")
    assert not raw.parsed and raw.error and raw.text == "sum(owned(t) for t in threads) == n"
    evil = render_statement("__import__('os').system('false')")
    assert not evil.parsed
    reduce_md = render_contract_markdown(result, result["contracts"][1])
    assert "*prove*: `sum(owned(t) for t in threads) == n`" in reduce_md
    assert "```math" in reduce_md  # the given clause parses
    html = render_contract_html(result, result["contracts"][1])
    assert "<code>sum(owned(t) for t in threads) == n</code>" in html


def test_statement_falls_back_when_the_parser_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import obligations.reporting.statement as statement

    def missing() -> None:
        raise ModuleNotFoundError("No module named 'obligations.expr'")

    monkeypatch.setattr(statement, "_parser", missing)
    r = render_statement("1 <= m")
    assert not r.parsed and "ModuleNotFoundError" in (r.error or "")


def test_unknown_evidence_keys_are_shown_verbatim() -> None:
    facts = {
        f.label: f.value for f in evidence_facts({"kind": "falsify", "cases": 3, "weird": {"a": [1, 2]}, "points": 9})
    }
    assert facts["weird"] == '{"a": [1, 2]}'
    # Renderers go by the evidence's kind: a test's "points" is its own detail, not an enumeration.
    assert facts["Cases"] == "3" and facts["points"] == "9" and "Points enumerated" not in facts
    enum = {f.label: f.value for f in evidence_facts({"kind": "enumerate", "points": 9})}
    assert enum["Points enumerated"].startswith("9")


def test_html_is_self_contained_and_escaped(result: dict) -> None:
    evil = copy.deepcopy(result)
    gemm = _gemm(evil)
    gemm["items"][0]["property"] = '<script>alert("x")</script>'
    html = render_contract_html(evil, gemm)
    assert "<script" not in html
    assert "&lt;script&gt;" in html
    assert not re.search(r"""(src|href)=["'](https?:)?//""", html), "HTML must not load anything remote"
    assert "<link" not in html and "@import" not in html
    assert read_stamp(html) is not None


@needs_matplotlib
def test_write_reports_writes_pages_plots_and_index(tmp_path: Path, result: dict) -> None:
    paths = write_reports(result, tmp_path / "reports")
    names = {p.relative_to(tmp_path / "reports").as_posix() for p in paths}
    assert {"gemm-cublas-v1.md", "gemm-cublas-v1.html", "cub-reduce-sum-v1.md", "index.md"} <= names
    expected_plots = {
        "plots/gemm-cublas-v1/FT-GEMM-002-ulp_histogram.png",
        "plots/gemm-cublas-v1/FT-GEMM-003-error_vs_bound.png",
        "plots/gemm-cublas-v1/PERF-GEMM-001-timings.png",
        "plots/cub-reduce-sum-v1/FT-RED-001-error_vs_bound.png",
    }
    assert expected_plots <= names
    for rel in expected_plots:
        assert (tmp_path / "reports" / rel).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "reports" / "gemm-cublas-v1.md").read_text()
    assert "![ULP error histogram for FT-GEMM-002](plots/gemm-cublas-v1/FT-GEMM-002-ulp_histogram.png)" in md
    html = (tmp_path / "reports" / "gemm-cublas-v1.html").read_text()
    assert html.count('src="data:image/png;base64,') == 5
    index = (tmp_path / "reports" / "index.md").read_text()
    assert "[gemm-cublas-v1](gemm-cublas-v1.md)" in index and "[html](cub-reduce-sum-v1.html)" in index
    assert "[FT-GEMM-004](gemm-cublas-v1.md#ft-gemm-004)" in index


@needs_matplotlib
def test_reports_are_deterministic(tmp_path: Path, result: dict) -> None:
    a = {p.name: p.read_bytes() for p in write_reports(result, tmp_path / "a")}
    b = {p.name: p.read_bytes() for p in write_reports(result, tmp_path / "b")}
    assert a == b


def test_reports_without_plots_say_why(tmp_path: Path, result: dict) -> None:
    write_reports(result, tmp_path, plots=False)
    md = (tmp_path / "gemm-cublas-v1.md").read_text()
    assert "ULP error histogram left out:" in md
    assert not (tmp_path / "plots").exists()


# --- kc report --check -------------------------------------------------------------------------------


def test_check_reports_passes_on_fresh_reports(tmp_path: Path, result: dict, contracts_dir: Path) -> None:
    write_reports(result, tmp_path / "reports", plots=False)
    assert check_reports(tmp_path / "reports", contracts_dir) == []


def test_check_reports_catches_a_changed_contract(tmp_path: Path, result: dict, contracts_dir: Path) -> None:
    write_reports(result, tmp_path / "reports", plots=False)
    contract = contracts_dir / "gemm-cublas-v1.yaml"
    contract.write_text(contract.read_text().replace("tolerance: 2", "tolerance: 4"))
    problems = check_reports(tmp_path / "reports", contracts_dir)
    assert problems, "a stale report must be reported"
    assert all("gemm-cublas-v1" in p for p in problems)
    assert any("gemm-cublas-v1.md" in p and "changed since the report was generated" in p for p in problems)
    assert any("index.md" in p for p in problems)


def test_check_reports_catches_an_older_tool(tmp_path: Path, result: dict, contracts_dir: Path) -> None:
    write_reports(result, tmp_path / "reports", plots=False)
    assert check_reports(tmp_path / "reports", contracts_dir, tool_version="0.1.0") == []
    problems = check_reports(tmp_path / "reports", contracts_dir, tool_version="99.0")
    assert any("older than the current 99.0" in p for p in problems)
    assert current_tool_version() != "0"


def test_check_reports_catches_missing_and_unreported_contracts(
    tmp_path: Path, result: dict, contracts_dir: Path
) -> None:
    write_reports(result, tmp_path / "reports", plots=False)
    (contracts_dir / "cub-reduce-sum-v1.yaml").unlink()
    (contracts_dir / "new-kernel-v1.yaml").write_text("id: new-kernel-v1\nversion: 0.1.0\n")
    problems = check_reports(tmp_path / "reports", contracts_dir)
    assert any("'cub-reduce-sum-v1'" in p and "no longer" in p for p in problems)
    assert any("'new-kernel-v1' has no report" in p for p in problems)
    assert not any(
        "'new-kernel-v1'" in p for p in check_reports(tmp_path / "reports", contracts_dir, require_every_contract=False)
    )


def test_check_reports_flags_a_tampered_stamp(tmp_path: Path, result: dict, contracts_dir: Path) -> None:
    write_reports(result, tmp_path / "reports", plots=False)
    md = tmp_path / "reports" / "gemm-cublas-v1.md"
    md.write_text(md.read_text().replace("<!-- kc-report {", "<!-- kc-report {{", 1))
    problems = check_reports(tmp_path / "reports", contracts_dir)
    assert any("gemm-cublas-v1.md" in p and "provenance line" in p for p in problems)


# --- rendering in a real browser ----------------------------------------------------------------------


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run_chromium(binary: str, *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


class _DomSummary(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.item_rows: list[str] = []
        self.plots: list[dict[str, str]] = []
        self.maths = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "tr" and "data-item" in a:
            self.item_rows.append(a["data-item"])
        if tag == "img" and "plot" in a.get("class", ""):
            self.plots.append(a)
        if tag == "math":
            self.maths += 1


@needs_matplotlib
def test_html_renders_in_headless_chromium(tmp_path: Path, result: dict) -> None:
    binary = _chromium()
    if binary is None:
        pytest.skip("chromium not installed (apt-get install -y chromium); .ci/run installs it")
    write_reports(result, tmp_path)
    page = (tmp_path / "gemm-cublas-v1.html").resolve()
    dumped = _run_chromium(binary, "--dump-dom", page.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = _DomSummary()
    dom.feed(dumped.stdout)
    assert dom.item_rows == [i["id"] for i in _gemm(result)["items"]], "items table missing from the DOM"
    assert {p["data-plot"] for p in dom.plots} == {"ulp_histogram", "error_vs_bound", "timings"}
    assert all(p["src"].startswith("data:image/png;base64,") for p in dom.plots)
    assert dom.maths >= 8, "parsed statements should render as MathML"

    # A screenshot proves the PNGs decode and paint: look for the plots' bar/line colour.
    shot = tmp_path / "shot.png"
    taken = _run_chromium(binary, "--window-size=1000,9000", "--hide-scrollbars", f"--screenshot={shot}", page.as_uri())
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    import matplotlib.image
    import numpy as np

    pixels = (matplotlib.image.imread(str(shot))[..., :3] * 255).round().astype(int)
    plot_blue = np.all(np.abs(pixels - np.array([0x1F, 0x77, 0xB4])) <= 6, axis=-1)
    assert plot_blue.sum() > 2000, "no plot pixels in the screenshot: embedded PNGs did not render"


def test_report_modules_import_without_matplotlib() -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from obligations.reporting import plots_available, write_reports, load_result\n"
        "import tempfile, pathlib\n"
        "assert not plots_available()\n"
        f"r = load_result({str(RESULT)!r})\n"
        "d = pathlib.Path(tempfile.mkdtemp())\n"
        "write_reports(r, d)\n"
        "text = (d / 'gemm-cublas-v1.md').read_text()\n"
        "assert 'matplotlib is not installed' in text, text\n"
        "assert not (d / 'plots').exists()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=Path(__file__).parents[1]
    )
    assert proc.returncode == 0, proc.stderr


def test_committed_repository_reports_match_their_contracts():
    """reports/ is generated from a GPU run; editing a contract without regenerating them fails here."""
    from pathlib import Path

    from obligations.reporting import check_reports

    root = Path(__file__).resolve().parent.parent
    assert check_reports(root / "reports", root / "contracts") == []


def test_contract_page_has_a_coverage_table_from_recorded_evidence() -> None:
    from obligations.reporting.markdown import render_contract_markdown

    contract = {
        "id": "cov-v1",
        "version": "1.0.0",
        "family": "probe",
        "path": "contracts/cov-v1.yaml",
        "sha256": "0" * 64,
        "qa_gate": {"id": "G", "requires": []},
        "items": [
            {
                "id": "R",
                "kind": "obligation",
                "method": "regimes",
                "status": "proved",
                "claim": "proved",
                "evidence": {
                    "kind": "regimes",
                    "regimes": ["one_trip", "grid_stride"],
                    "witnesses": {"one_trip": {"n": 1}},
                },
            },
            {
                "id": "A",
                "kind": "obligation",
                "method": "audit",
                "status": "passed",
                "claim": "tested",
                "evidence": {"kind": "audit", "cases": 4, "findings": 0},
                "entry_points": [{"entry": "probe.sum", "device": "host", "order": "fold"}],
            },
            {
                "id": "F",
                "kind": "falsification",
                "method": "falsify",
                "status": "passed",
                "claim": "tested",
                "evidence": {
                    "kind": "falsify",
                    "cases": 3,
                    "order_alternative": "the tree",
                    "order_sensitive_cases": 0,
                    "order_insensitive": True,
                },
            },
        ],
        "unchecked_entry_points": [{"entry": "probe.divide", "device": "host"}],
    }
    md = render_contract_markdown({"provenance": {}}, contract)
    assert "## Coverage" in md
    assert "grid_stride: no witness" in md and 'one_trip: {"n": 1}' in md
    assert "4 builds, 0 finding(s)" in md
    assert "probe.sum on host (order=fold)" in md
    assert "| Entry points no item called (unchecked) | probe.divide on host |" in md
    assert "Order-sensitive inputs (F)" in md and "the inputs cannot show the order" in md


def test_not_adopted_seed_claims_are_listed_with_their_reason_and_never_get_a_status() -> None:
    contract = {
        "id": "na-v1",
        "version": "1.0.0",
        "family": "probe",
        "path": "contracts/na-v1.yaml",
        "sha256": "0" * 64,
        "qa_gate": {"id": "G", "requires": []},
        "not_adopted": [{"id": "SEED-9", "claim": "faster than PTX", "reason": "no PTX backend here"}],
        "items": [],
    }
    md = render_contract_markdown({"provenance": {}}, contract)
    html = render_contract_html({"provenance": {}}, contract)
    assert (
        "## Seed claims not adopted" in md and "| SEED-9 | faster than PTX — not adopted: no PTX backend here |" in md
    )
    assert "Seed claims not adopted" in html and "no PTX backend here" in html
    # the claim is declared scope, not an item: no status word is attached to it
    line = next(ln for ln in md.splitlines() if "SEED-9" in ln)
    assert not any(s in line for s in ("passed", "skipped", "proved", "violated"))


def _run(device: str, items: list[dict], sha: str = "a" * 64) -> dict:
    contract = {
        "id": "m-v1",
        "version": "1.0.0",
        "family": "probe",
        "path": "contracts/m-v1.yaml",
        "sha256": sha,
        "qa_gate": {"id": "G", "requires": ["H", "D"]},
        "items": items,
        "unchecked_entry_points": [],
    }
    return {"provenance": {"device": {"kind": device}, "profile": "full"}, "contracts": [contract], "exit_code": 0}


def test_a_host_and_a_device_run_of_one_contract_merge_item_by_item():
    from obligations.check import merge_results

    host = _run(
        "host",
        [
            {"id": "H", "status": "passed", "reason": None},
            {"id": "D", "status": "skipped", "reason": "test 'p.d' runs on cuda; this run is on host"},
            {"id": "Z", "status": "proved", "reason": "host z3"},
        ],
    )
    cuda = _run(
        "cuda",
        [
            {"id": "H", "status": "skipped", "reason": "test 'p.h' runs on host; this run is on cuda"},
            {"id": "D", "status": "passed", "reason": None},
            {"id": "Z", "status": "proved", "reason": "device z3"},
        ],
    )
    for runs in ([host, cuda], [cuda, host]):  # the cuda run is the primary one whatever the order
        merged = merge_results(runs)
        c = merged["contracts"][0]
        items = {it["id"]: it for it in c["items"]}
        assert [it["id"] for it in c["items"]] == ["H", "D", "Z"]
        assert items["H"]["status"] == items["D"]["status"] == "passed"  # each from the run that ran it
        assert items["Z"]["reason"] == "device z3" and runs[items["Z"]["from_run"]] is cuda
        assert c["qa_gate_status"] == "passed" and merged["summary"]["skipped"] == 0
        assert merged["provenance"]["device"]["kind"] == "cuda" and len(merged["provenance"]["merged_runs"]) == 2
    with pytest.raises(ValueError, match="differs between the runs"):
        merge_results([host, _run("cuda", [], sha="b" * 64)])


def test_a_merged_items_page_names_the_run_it_came_from():
    from obligations.check import merge_results
    from obligations.reporting.markdown import render_contract_markdown

    host = _run("host", [{"id": "H", "status": "passed", "method": "falsify", "reason": None}])
    cuda = _run(
        "cuda", [{"id": "H", "status": "skipped", "method": "falsify", "reason": "runs on host; this run is on cuda"}]
    )
    host["provenance"]["commit"], cuda["provenance"]["commit"] = "1" * 40, "2" * 40
    merged = merge_results([host, cuda])
    md = render_contract_markdown(merged, merged["contracts"][0])
    assert "| Device | host |" in md and "| Run | host, profile full, commit 1111111111 |" in md


# --- layout for reading (issue 30) ---------------------------------------------------------------------

# Appended to a copy of a page (its Content-Security-Policy removed): every word of a header or label that
# the layout broke over two lines (pieces between spaces and hyphens: a break after a hyphen is fine).
_BROKEN_WORDS_JS = r"""
<script>
(function () {
  const broken = [];
  const labels = document.querySelectorAll("th, h1, h2, h3, .status, .gate, .badges span, td:first-child a");
  for (const el of labels) {
    const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
      for (const m of node.data.matchAll(/[^\s-]+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top)));
        if (tops.size > 1) broken.push(el.tagName.toLowerCase() + ": " + m[0]);
      }
    }
  }
  const out = document.createElement("pre");
  out.id = "kc-broken-words";
  out.textContent = JSON.stringify(broken);
  document.body.appendChild(out);
})();
</script>
"""


# A control the probe must flag: a header squeezed into a narrow column and allowed to break anywhere.
_SQUEEZED = '<table style="width:10px"><tr><th style="overflow-wrap:anywhere">Description</th><td>x</td></tr></table>'


def _broken_words(binary: str, pages: list[Path], widths: tuple[int, ...]) -> dict[int, list[str]]:
    """Words broken mid-word in the pages' bodies laid out one after another, in a frame of each width.

    One browser run: the frames are srcdoc iframes (same origin as the top page), read once it has loaded.
    """
    from html import escape

    first = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", pages[0].read_text(encoding="utf-8"))
    bodies = [re.search(r"<body>(.*)</body>", p.read_text(encoding="utf-8"), re.S).group(1) for p in pages[1:]]
    framed = escape(first.replace("</body>", "".join(bodies) + _SQUEEZED + _BROKEN_WORDS_JS + "</body>"))
    frames = "".join(f'<iframe width="{w}" height="1000" srcdoc="{framed}"></iframe>' for w in widths)
    collect = (
        '<script>window.addEventListener("load", () => { const out = document.createElement("pre");'
        ' out.id = "kc-frames"; out.textContent = JSON.stringify([...document.querySelectorAll("iframe")].map('
        '(f) => JSON.parse(f.contentDocument.getElementById("kc-broken-words").textContent)));'
        " document.body.appendChild(out); });</script>"
    )
    probe = pages[0].with_name("probe.html")
    probe.write_text(f"<!DOCTYPE html><html><body>{frames}{collect}</body></html>", encoding="utf-8")
    dumped = _run_chromium(binary, f"--window-size={max(widths) + 100},1000", "--dump-dom", probe.resolve().as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    found = re.search(r'<pre id="kc-frames">(.*?)</pre>', dumped.stdout, re.S)
    assert found, f"the probe did not run:\n{dumped.stdout[-2000:]}"
    from html import unescape

    return dict(zip(widths, json.loads(unescape(found.group(1))), strict=True))


def _with_expected_deviations(result: dict) -> dict:
    """The committed result with cuda-libm-v1's intrinsic findings declared (as the contract now declares them)."""
    out = copy.deepcopy(result)
    for c in out["contracts"]:
        for item in c["items"]:
            if c["family"] == "libm" and item["status"] == "violated":
                item["status"] = "violated_expected"
    return out


def test_headers_and_labels_are_never_broken_mid_word_at_1400_or_800_px(tmp_path: Path) -> None:
    binary = _chromium()
    if binary is None:
        pytest.skip("chromium not installed (apt-get install -y chromium); .ci/run installs it")
    from obligations.reporting.html import render_contract_html, render_index_html

    result = _with_expected_deviations(load_result(Path(__file__).parents[1] / "reports" / "result.json"))
    pages = [tmp_path / "index.html"]
    pages[0].write_text(render_index_html(result), encoding="utf-8")
    # a contract page with a QA gate whose description and requirements are long
    gated = max(result["contracts"], key=lambda c: len(str((c.get("qa_gate") or {}).get("description", ""))))
    pages.append(tmp_path / "contract.html")
    pages[1].write_text(render_contract_html(result, gated), encoding="utf-8")
    # the control (a squeezed "Description") is the one word broken: the probe ran and sees breaks
    broken = _broken_words(binary, pages, (1400, 800))
    assert broken == {1400: ["th: Description"], 800: ["th: Description"]}, broken


def test_documented_deviations_read_as_expected_not_as_failures() -> None:
    from obligations.reporting.html import render_index_html
    from obligations.reporting.markdown import render_index_markdown
    from obligations.reporting.model import GATE_EXPECTED, gate_verdict

    def contract(*statuses: str) -> dict:
        items = [{"id": f"I{k}", "status": s} for k, s in enumerate(statuses)]
        return {
            "id": "c-v1",
            "path": "contracts/c-v1.yaml",
            "sha256": "0",
            "items": items,
            "qa_gate": {"id": "G", "requires": [i["id"] for i in items]},
            "qa_gate_status": "passed" if set(statuses) <= {"proved", "passed", "exhausted"} else "not passed",
        }

    assert gate_verdict(contract("proved", "violated_expected")) == GATE_EXPECTED
    assert gate_verdict(contract("violated_expected", "violated")) == "not passed"
    assert gate_verdict(contract("violated_expected", "skipped")) == "not passed"
    assert gate_verdict(contract("proved", "passed")) == "passed"
    result = _with_expected_deviations(load_result(Path(__file__).parents[1] / "reports" / "result.json"))
    libm = next(c for c in result["contracts"] if c["family"] == "libm")
    assert libm["qa_gate_status"] == "not passed" and gate_verdict(libm) == GATE_EXPECTED
    page = render_index_html(result)
    row = next(line for line in page.splitlines() if f">{libm['id']}<" in line)
    assert f'data-gate="{GATE_EXPECTED}"' in row and "not passed" not in row
    assert f"| {GATE_EXPECTED} |" in render_index_markdown(result)
