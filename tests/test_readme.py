"""The README is tested: its commands are what CI runs, and its contract example checks as it says."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

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


def _console_blocks() -> list[list[tuple[str, list[str]]]]:
    """Each ```console block of the README as (command, expected output lines) pairs."""
    blocks = []
    for text in _blocks("console"):
        pairs: list[tuple[str, list[str]]] = []
        for line in text.splitlines():
            if line.startswith("$ "):
                pairs.append((line[2:], []))
            elif pairs:
                pairs[-1][1].append(line.rstrip())
        blocks.append(pairs)
    return blocks


def _matches(pattern: str, line: str) -> bool:
    """``pattern`` with ``...`` standing for any text (and the run of spaces around it), against one line."""
    parts = [re.escape(" ".join(p.split())) for p in pattern.split("...")]
    return re.fullmatch(r"\s*.*?\s*".join(parts), " ".join(line.split())) is not None


def _expect_in_order(expected: list[str], got: list[str]) -> None:
    """Every expected line matches an output line, in order; a line of just ``...`` skips any number of lines."""
    at = 0
    for want in expected:
        if want.strip() == "...":
            continue
        while at < len(got) and not _matches(want, got[at]):
            at += 1
        assert at < len(got), f"README line {want!r} not in the output (in order):\n" + "\n".join(got)
        at += 1


def test_readme_console_blocks_run_as_written(tmp_path):
    """The README's ```console blocks run (each in a scratch directory holding the shipped contracts, as a user's
    checkout would) and print what the README says, up to its ``...``."""
    import shutil
    import subprocess
    import sys

    blocks = _console_blocks()
    assert len(blocks) >= 2 and all(blocks)
    for k, pairs in enumerate(blocks):
        work = tmp_path / f"block{k}"
        work.mkdir()
        if k:  # the shipped-contracts examples run where the contracts are; the scaffold runs in an empty folder
            shutil.copytree(ROOT / "contracts", work / "contracts")
            (work / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
        for command, expected in pairs:
            argv = command.split()
            assert argv[0] == "kc", command
            env = {**os.environ, "KC_PROOF_CACHE_DIR": str(tmp_path / "cache"), "NO_COLOR": "1"}
            proc = subprocess.run(
                [sys.executable, "-m", "obligations.cli", *[a.strip("'") for a in argv[1:]]],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
            _expect_in_order(expected, (proc.stdout + proc.stderr).splitlines())


def test_readme_lists_every_shipped_contract_once():
    table = re.search(r"## The shipped contracts\n.*?\n\| contract \|[^\n]*\n((?:\|[^\n]*\n)+)", README, re.S)
    assert table, "the README has a table of the shipped contracts"
    listed = re.findall(r"^\| `([\w.-]+)` \|", table.group(1), re.M)
    shipped = sorted(p.stem for p in (ROOT / "contracts").glob("*.yaml"))
    assert sorted(listed) == shipped and len(listed) == len(set(listed))


def test_the_console_matcher_refutes_a_wrong_line():
    got = ["  proved     PO-GEMM-02-A-z3          z3           0.66s  z3 unsat, rlimit 109786/50000000"]
    _expect_in_order(["  proved     PO-GEMM-02-A-z3  ... rlimit ..."], got)
    with pytest.raises(AssertionError):
        _expect_in_order(["  violated   PO-GEMM-02-A-z3  ..."], got)
