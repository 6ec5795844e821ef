"""The README is tested: its commands are what CI runs, and its contract example checks as it says."""

from __future__ import annotations

import re
from pathlib import Path

from obligations.check import check_contract

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def test_ci_runs_exactly_the_readme_commands():
    install, tests = (b.strip() for b in _blocks("bash")[:2])
    ci = (ROOT / ".ci" / "run").read_text()
    assert install in ci and tests in ci
    assert "kc check contracts" in install and "pytest" in tests
    assert '"$rc" -eq 5' in ci  # pytest's "no tests collected" is a failure


def test_readme_contract_example_is_valid_and_proves(tmp_path):
    (example,) = _blocks("yaml")
    path = tmp_path / "tiny-gemm-v1.yaml"
    path.write_text(example)
    entry = check_contract(path)
    (item,) = entry["items"]
    assert item["id"] == "A-in-bounds" and item["status"] == "proved"


def test_readme_documents_every_status_and_exit_code():
    from obligations.core.results import Status

    for s in Status:
        assert f"| `{s.value}` |" in README
    for code in range(4):
        assert f"| {code} |" in README


def test_readme_names_every_docs_page_and_only_pages_that_exist():
    root = Path(__file__).resolve().parent.parent
    named = set(re.findall(r"docs/[\w.-]+\.md", (root / "README.md").read_text()))
    present = {f"docs/{p.name}" for p in (root / "docs").glob("*.md")}
    assert named == present, (sorted(named - present), sorted(present - named))
