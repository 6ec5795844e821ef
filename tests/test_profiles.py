"""Profiles and budgets: full (the GPU's default) and deep are count-bound; a time stop shows in the evidence."""

from __future__ import annotations

import pytest

from falsification import graphspec_tests, ir_tests, ir_vjp_tests
from falsification.profiles import BUDGETS, SAFETY_NET_S, Budget, Profile, budget_for
from falsification.registry import FalsifyContext, get_test
from obligations.isolation import PROFILE_TIMEOUT_S
from obligations.reporting.provenance import EVIDENCE_RANKS

COUNT_BOUND = (Profile.FULL, Profile.DEEP)


def test_every_budget_table_has_every_profile():
    for name, table in BUDGETS.items():
        assert set(table) == set(Profile), name
    for table in (
        ir_tests._BUDGET,
        ir_vjp_tests._BUDGET,
        ir_vjp_tests._MIN_CHECKED,
        ir_vjp_tests._PARAM_BUDGET,
        ir_vjp_tests._PARAM_MIN,
        ir_vjp_tests._SPEC_BUDGET,
        ir_vjp_tests._EXEC_BUDGET,
        graphspec_tests.PROFILE_EXAMPLES,
        PROFILE_TIMEOUT_S,
        EVIDENCE_RANKS["profile"],
    ):
        assert set(table) == {p.value for p in Profile}, table


@pytest.mark.parametrize("profile", COUNT_BOUND)
def test_full_and_deep_are_count_bound(profile):
    """No time stop decides a case count on the GPU's profiles: budget_s is None or the safety net."""
    for name, table in BUDGETS.items():
        b = table[profile]
        assert b.budget_s is None or b.budget_s >= SAFETY_NET_S, (name, profile, b)
    # and an item's own params cannot smuggle a small one in unnoticed: the override is visible in its budget
    assert budget_for("elementwise.bitwise", profile, {"budget_s": 1}).budget_s == 1.0


def test_deep_draws_at_least_what_full_draws():
    """deep is full's nightly: never fewer drawn cases, elements or bulk; the quick profile is CI's, unchanged."""
    for name, table in BUDGETS.items():
        f, d = table[Profile.FULL], table[Profile.DEEP]
        assert d.max_examples >= f.max_examples and d.max_size >= f.max_size and d.bulk >= f.bulk, name
    assert BUDGETS["batch"][Profile.QUICK] == Budget(max_examples=30, max_size=16384, budget_s=2.0)
    assert EVIDENCE_RANKS["profile"]["deep"] > EVIDENCE_RANKS["profile"]["full"] > EVIDENCE_RANKS["profile"]["quick"]


def _bitwise(budget_s: float) -> dict:
    ctx = FalsifyContext(
        device="host",
        profile="full",
        seed=3,
        item={
            "id": "it",
            "test": "elementwise.bitwise",
            "params": {"op": "add", "max_examples": 12, "max_size": 64, "budget_s": budget_s},
        },
        contract_path="c.yaml",
    )
    out = get_test("elementwise.bitwise").run(ctx)
    assert out.status.value == "passed", out.reason
    return dict(out.evidence)


def test_the_case_count_is_the_counts_and_a_fired_time_stop_is_in_the_evidence():
    net = _bitwise(SAFETY_NET_S)
    assert net["time_stop"] == {"budget_s": SAFETY_NET_S, "fired": False, "draws_not_judged": 0}
    again = _bitwise(SAFETY_NET_S)
    assert (net["draws"], net["elements"]) == (again["draws"], again["elements"])  # the counts decide, not the clock
    assert net["draws"] >= 12  # every drawn batch judged (explicit batches besides)
    cut = _bitwise(0.0)  # the clock starts after the first case: every later draw is past the stop
    assert cut["time_stop"]["fired"] and cut["time_stop"]["draws_not_judged"] > 0
    assert cut["draws"] < net["draws"]
