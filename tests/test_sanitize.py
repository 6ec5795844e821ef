"""Sanitizer evidence: skipped off the device, and on the device a planted out-of-bounds write is caught."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from obligations.contract import load_contract
from obligations.engines import Job, get_engine
from tests.contract_helpers import needs_cuda

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = load_contract(ROOT / "contracts" / "reductions-v1.yaml", check=False)


def _item(workload: str, tools: list[str], modules: list[str] | None = None) -> dict:
    return {
        "id": "SAN",
        "kind": "obligation",
        "method": "sanitize",
        "params": {"workload": workload, "tools": tools, "modules": modules or []},
    }


def test_sanitize_off_the_device_is_skipped_not_passed():
    out = get_engine("sanitize").discharge(Job(CONTRACT, _item("elementwise", ["memcheck"]), device="host"))
    assert out.status.value == "skipped" and "cuda" in out.reason


def test_sanitize_without_the_tool_is_skipped(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    out = get_engine("sanitize").discharge(Job(CONTRACT, _item("elementwise", ["memcheck"]), device="cuda"))
    assert out.status.value == "skipped" and "compute-sanitizer" in out.reason


@pytest.mark.cuda
@needs_cuda
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not on PATH")
def test_planted_out_of_bounds_write_is_caught_and_a_clean_workload_passes():
    bad = get_engine("sanitize").discharge(
        Job(CONTRACT, _item("planted-oob", ["memcheck"], ["tests.planted.sanitizer_bugs"]), device="cuda")
    )
    assert bad.status.value == "violated", (bad.reason, bad.counterexample)
    assert bad.counterexample["memcheck"]["errors"] > 0
    good = get_engine("sanitize").discharge(
        Job(CONTRACT, _item("reductions", ["memcheck", "racecheck"]), device="cuda")
    )
    assert good.status.value == "passed", (good.reason, good.counterexample)
