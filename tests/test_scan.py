"""Scan family: the contract is evidenced on the host, and each planted bug is caught by its named item."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import falsification.scan_tests  # noqa: F401 - registers the scan tests
from falsification.registry import FalsifyContext, get_test
from native import scan as ns

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "contracts" / "scan-selective-v1.yaml"


def _run(test: str, **params: object) -> str:
    ctx = FalsifyContext(device="host", profile="quick", seed=0, item={"id": "T", "test": test, "params": params})
    return get_test(test).run(ctx).status.value


def test_contract_evidenced_on_host() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "obligations.cli", "check", str(CONTRACT), "--device", "host"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "violated" not in done.stdout and "error " not in done.stdout
    assert "skipped    SCAN-PERF" in done.stdout  # device-only, skipped with its reason on the host


@pytest.mark.parametrize(
    ("test", "params"),
    [
        ("scan.combine_sympy", {"combine": "reversed"}),  # combine applied in the wrong order
        ("scan.chunked_bound", {"combine": "reversed"}),
        ("scan.discretize_bound", {"softplus": "exp"}),  # softplus replaced by exp
        ("scan.vjp_spec", {"softplus": "exp"}),
    ],
)
def test_planted_bug_is_caught(test: str, params: dict) -> None:
    assert _run(test, **params) == "violated"


def test_stated_builds_pass() -> None:
    for test in ("scan.combine_sympy", "scan.chunked_bound", "scan.discretize_bound", "scan.sequential_bitwise"):
        assert _run(test) == "passed", test


def test_plan_guard_refuses_outside_the_proof() -> None:
    assert not ns.chunk_plan(1 << 30, 1 << 20).admissible
    assert ns.chunk_plan(100, 8, 7).nchunks == 15


def test_reversed_combine_is_still_associative_but_not_the_recurrence() -> None:
    """Why SCAN-COMBINE-native checks the composition order too: the reversed combine is associative."""
    import sympy

    a1, b1, a2, b2, a3, b3 = sympy.symbols("a1 b1 a2 b2 a3 b3")
    c = lambda p, q: ns.combine(p, q, "reversed")  # noqa: E731
    lhs, rhs = c(c((a1, b1), (a2, b2)), (a3, b3)), c((a1, b1), c((a2, b2), (a3, b3)))
    assert sympy.expand(lhs[1] - rhs[1]) == 0
