"""Plan regimes: Z3 proves they cover the domain and finds the smallest witness of each; planted gaps caught."""

from __future__ import annotations

from pathlib import Path

from obligations.check import check_contract
from obligations.core.plans import regime_of
from tests.planted import regime_plans

CONTRACT = """\
id: regimes-probe-v1
version: 1.0.0
family: elementwise
summary: regimes probe
kernels:
  loop: {{entry: "tests.planted.regime_plans:loop_plan", plan: "tests.planted.regime_plans:{plan}"}}
equations: {{e: {{formula: "x"}}}}
symbols:
  n: {{type: int64, min: 0, max: 4294967296}}
  block: {{type: int32, values: [32, 256]}}
  max_grid: {{type: int32, min: 1, max: 65536}}
obligations:
  - {{id: R, type: invariant, property: p, method: regimes, minimize: [n, max_grid, block]{bound}}}
falsification: []
qa_gate: {{id: GATE, requires: [R]}}
"""


def _check(tmp_path: Path, plan: str, bound: str = "") -> dict:
    path = tmp_path / "regimes-probe-v1.yaml"
    path.write_text(CONTRACT.format(plan=plan, bound=bound))
    return check_contract(path)["items"][0]


def test_regimes_cover_the_domain_and_each_has_its_smallest_witness(tmp_path):
    item = _check(tmp_path, "loop_plan")
    assert item["status"] == "proved", item["reason"]
    w = item["evidence"]["witnesses"]
    assert w["empty"]["n"] == 0 and w["one_trip"]["n"] == 1
    # The grid-stride loop is reached with 33 elements by shrinking the launch knobs, not with 2^24.
    assert w["grid_stride"] == {"n": 33, "block": 32, "max_grid": 1}
    for name, values in w.items():  # each witness selects its regime when the plan runs with ints
        assert name in regime_of(regime_plans.loop_plan, values)


def test_planted_coverage_gap_is_violated_at_the_uncovered_point(tmp_path):
    item = _check(tmp_path, "gap_plan")
    assert item["status"] == "violated"
    assert item["counterexample"]["symbols"]["n"] == 0


def test_planted_unreachable_regime_is_violated(tmp_path):
    item = _check(tmp_path, "unreachable_plan", ", bound: {max_grid: [65536, 65536], n: [0, 1000]}")
    assert item["status"] == "violated"
    # n <= 1000 under a 65536-block cap reaches neither the cap nor a second trip.
    assert item["counterexample"]["unreached"] == ["grid_stride", "grid_capped"]
