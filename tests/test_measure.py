"""Measurement statistics (falsification.measure) on synthetic timings, and the statuses they and ``expect:`` add:
inconclusive (not a pass; --strict fails it) and violated_expected (a declared finding, never a failure)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from falsification import measure
from falsification.registry import FalsifyContext
from obligations.check import exit_code, summarize
from obligations.ci_outputs import policy
from obligations.contract import ContractError, load_contract
from obligations.core.results import Status, apply_expectation, passed, skipped, violated
from tests.contract_helpers import CONTRACTS, check_items, contract_variant

FAST = measure.Budget(min_trials=8, step=8, max_trials=40, seconds=60.0, resamples=1000)


def _draws(mean: float, sd: float, seed: int = 1):
    """draw(k): k per-trial ratios from a normal distribution (a synthetic GPU)."""
    rng = np.random.default_rng(seed)
    return lambda k: list(rng.normal(mean, sd, k))


def test_clear_pass_and_clear_fail_decide_on_the_first_look():
    up = measure.sequential(_draws(1.20, 0.01), 1.0, ">=", FAST, seed=0)
    assert up.status == "passed" and up.looks == 1 and up.interval.trials == 8 and up.interval.low > 1.0
    down = measure.sequential(_draws(0.80, 0.01), 1.0, ">=", FAST, seed=0)
    assert down.status == "violated" and down.looks == 1 and down.interval.high < 1.0
    # "<=": a time ratio that must stay under its limit
    assert measure.sequential(_draws(1.00, 0.002), 1.02, "<=", FAST, seed=0).status == "passed"
    assert measure.sequential(_draws(1.10, 0.002), 1.02, "<=", FAST, seed=0).status == "violated"


def test_straddling_is_inconclusive_after_the_whole_budget_never_passed():
    v = measure.sequential(_draws(1.0, 0.05), 1.0, ">=", FAST, seed=0)
    assert v.status == "inconclusive" and v.interval.trials == FAST.max_trials
    assert v.looks == measure.looks(FAST) == 5 and v.interval.low < 1.0 < v.interval.high


def test_extension_narrows_the_interval_until_it_clears():
    v = measure.sequential(_draws(1.03, 0.04, seed=3), 1.0, ">=", FAST, seed=0)
    first = measure.bootstrap_median(v.values[:8], v.interval.confidence, FAST.resamples, 0)
    assert first.low < 1.0, "the first look straddles (else this test shows nothing)"
    assert v.status == "passed" and v.looks > 1 and v.interval.trials > 8
    assert v.interval.high - v.interval.low < first.high - first.low


def test_the_seconds_budget_stops_the_extension():
    ticks = iter(range(1000))
    v = measure.sequential(
        _draws(1.0, 0.05), 1.0, ">=", measure.Budget(seconds=1.5, resamples=500), seed=0, clock=lambda: next(ticks)
    )
    assert v.status == "inconclusive" and v.interval.trials == 16  # a look at 8, one more step, then time is up


def test_interval_is_reproducible_given_the_timings_and_bonferroni_over_looks():
    values = list(np.random.default_rng(7).normal(1.0, 0.1, 20))
    a = measure.bootstrap_median(values, 0.99, 2000, seed=5)
    assert a == measure.bootstrap_median(values, 0.99, 2000, seed=5)
    assert a.low <= a.estimate <= a.high
    v = measure.sequential(lambda k: values[:k], 2.0, ">=", measure.Budget(min_trials=20, max_trials=20), seed=5)
    assert v.looks == 1 and v.interval.confidence == pytest.approx(0.95)
    assert measure.sequential(_draws(1.2, 0.01), 1.0, ">=", FAST, seed=0).interval.confidence == pytest.approx(0.99)
    assert measure.item_seed(0, "a") == measure.item_seed(0, "a") != measure.item_seed(0, "b")


def test_budget_params_and_device_thresholds():
    assert measure.Budget.of({"measure": {"max_trials": 60}}).max_trials == 60
    with pytest.raises(KeyError, match="unknown"):
        measure.Budget.of({"measure": {"trials": 3}})
    with pytest.raises(ValueError):
        measure.Budget(min_trials=10, max_trials=5)
    item = {"id": "X", "tolerance": 0.8, "params": {"tolerance_by_device": {"H200": 0.6}}}
    ctx = FalsifyContext("cuda", "quick", 0, item)
    assert measure.threshold(ctx, "NVIDIA H200")[0] == 0.6
    assert measure.threshold(ctx, "NVIDIA H100 80GB HBM3") == (0.8, "tolerance (device NVIDIA H100 80GB HBM3)")


def test_outcomes_carry_the_interval_and_inconclusive_is_its_own_status():
    ctx = FalsifyContext("cuda", "quick", 0, {"id": "X", "tolerance": 1.0})
    ok = measure.sequential(_draws(1.2, 0.01), 1.0, ">=", FAST, seed=0)
    mid = measure.sequential(_draws(1.0, 0.05), 1.0, ">=", FAST, seed=0)
    out = measure.outcome(ctx, {"a": ok}, "claim", FAST)
    assert out.status is Status.PASSED and out.evidence["cases_measured"]["a"]["interval"]["low"] > 1.0
    out = measure.outcome(ctx, {"a": ok, "b": mid}, "claim", FAST)
    assert out.status is Status.INCONCLUSIVE and "[" in out.reason and out.evidence["cases_measured"]["b"]["trials"]
    bad = measure.sequential(_draws(0.5, 0.01), 1.0, ">=", FAST, seed=0)
    out = measure.outcome(ctx, {"a": ok, "b": mid, "c": bad}, "claim", FAST)
    assert out.status is Status.VIOLATED and list(out.counterexample["intervals"]) == ["c"]


def test_expectation_turns_a_reproduced_violation_into_violated_expected_and_a_hold_into_an_error():
    item = {"id": "X", "expect": "violated", "expect_reason": "vendor bug"}
    v = apply_expectation(violated({"x": 1}, "too far"), item)
    assert v.status is Status.VIOLATED_EXPECTED and v.counterexample == {"x": 1} and "vendor bug" in v.reason
    held = apply_expectation(passed(cases=3), item)
    assert held.status is Status.ERROR and "stale" in held.reason
    assert apply_expectation(skipped("no GPU"), item).status is Status.SKIPPED
    assert apply_expectation(violated({}, "r"), {"id": "Y"}).status is Status.VIOLATED


def test_summary_exit_codes_and_ci_policy_of_the_new_statuses():
    items = [{"id": "a", "status": "violated_expected"}, {"id": "b", "status": "passed"}]
    s = summarize([{"items": items}])
    assert s["violated_expected"] == 1 and exit_code(s) == 0 and exit_code(s, strict=True) == 0
    s = summarize([{"items": [{"id": "c", "status": "inconclusive"}]}])
    assert exit_code(s) == 0 and exit_code(s, strict=True) == 1
    assert policy("violated_expected").junit == "skipped" and policy("violated_expected", True).junit == "skipped"
    assert policy("inconclusive").junit == "skipped" and policy("inconclusive", True).junit == "failure"


def test_expect_end_to_end_and_its_reason_is_required(tmp_path: Path):
    gemm = CONTRACTS / "gemm-cublas-v1.yaml"
    anchor = '    prove: "a_offset(i, p) >= 0 and int64(a_offset(i, p)) * elem_size + elem_size <= a_bytes"\n'
    expect = '    expect: violated\n    expect_reason: "planted"\n'
    held = contract_variant(gemm, tmp_path, anchor, anchor + expect)
    rec = check_items(held, ["PO-GEMM-02-A-z3"])["PO-GEMM-02-A-z3"]
    assert rec["status"] == "error" and "stale" in rec["reason"]  # the claim holds: the expectation is stale
    (tmp_path / "v").mkdir()
    planted = anchor.replace(">= 0 and", "< 0 and")
    refuted = contract_variant(gemm, tmp_path / "v", anchor, planted + expect)
    rec = check_items(refuted, ["PO-GEMM-02-A-z3"])["PO-GEMM-02-A-z3"]
    assert rec["status"] == "violated_expected" and rec["counterexample"]
    (tmp_path / "r").mkdir()
    bare = contract_variant(gemm, tmp_path / "r", anchor, anchor + "    expect: violated\n")
    with pytest.raises(ContractError, match="expect_reason"):
        load_contract(bare)


def test_calibration_records_each_contenders_warm_up_seconds(monkeypatch):
    """What an item spends outside its trials shows in the evidence: warm-up seconds per contender (a first call's
    compile or a library's start-up), beside the calls per block calibration picks."""
    import time

    monkeypatch.setattr(measure, "_block_ms", lambda fn, iters: {"ours": 0.5, "peer": 2.0}[fn()])
    slow_first = iter([0.05])

    def peer() -> str:
        time.sleep(next(slow_first, 0.0))
        return "peer"

    comp = measure.Comparison(ours=lambda: "ours", peers={"peer": peer})
    iters, first, warm = measure.calibrate(comp, measure.Budget(block_ms=4.0))
    assert iters == 2 and first == {"ours": 0.5, "peer": 2.0}
    assert set(warm) == {"ours", "peer"} and warm["peer"] >= 0.05 > warm["ours"]


# -- one measurement for items that ask for the same one (issue #24) -----------------------------------------------


@functools.cache
def _measure_items() -> dict[str, dict]:
    gemm, training = (load_contract(CONTRACTS / f"{n}.yaml") for n in ("gemm-cublas-v1", "training-v1"))
    return {**{it["id"]: it for it in gemm.items}, "TRAIN-MFU": training.item("TRAIN-MFU")}


def test_items_of_the_same_terms_share_a_key_and_any_difference_in_what_is_measured_splits_it():
    items = _measure_items()
    key = measure.share_key
    # FALSIFY-CUBLAS-009 and TRAIN-MFU: one test, one tolerance, no params; worded and placed differently
    assert key(items["FALSIFY-CUBLAS-009"]) == key(items["TRAIN-MFU"]) is not None
    assert key(items["PO-GEMM-04"]) == key(items["FALSIFY-CUBLAS-008"]) is not None
    assert key(items["PO-GEMM-04"]) != key(items["PO-GEMM-04-matmul"])  # another call: another measurement
    tighter = {**items["FALSIFY-CUBLAS-008"], "tolerance": 1.01}
    assert key(tighter) != key(items["PO-GEMM-04"])
    assert key({**items["PO-GEMM-04"], "expect": "violated", "expect_reason": "r"}) != key(items["PO-GEMM-04"])
    assert key(items["FALSIFY-CUBLAS-001"]) is None  # not a measure item
    assert key({**items["PO-GEMM-04"], "test": "attention.perf"}) is None  # a test not known to read only its terms


def test_a_shared_measurement_names_its_source_keeps_its_status_and_is_never_an_error():
    items = _measure_items()
    shared = measure.Shared()
    assert shared.reuse(items["TRAIN-MFU"]) is None  # nothing measured yet: the item runs its own
    shared.keep("gemm-cublas-v1:FALSIFY-CUBLAS-009", items["FALSIFY-CUBLAS-009"], {"status": "error", "reason": "x"})
    assert shared.reuse(items["TRAIN-MFU"]) is None  # the source errored: no measurement to reuse
    made = {"status": "inconclusive", "reason": "r", "evidence": {"cases_measured": {"m": {"trials": 40}}}}
    shared.keep("gemm-cublas-v1:FALSIFY-CUBLAS-009", items["FALSIFY-CUBLAS-009"], {**made, "cpu_seconds": 2.0})
    got = shared.reuse(items["TRAIN-MFU"])
    assert got is not None and got["status"] == "inconclusive" and got["reason"] == "r" and got["cpu_seconds"] == 0
    assert got["evidence"] == {**made["evidence"], "shared_with": "gemm-cublas-v1:FALSIFY-CUBLAS-009"}
    got["evidence"]["cases_measured"]["m"]["trials"] = 0  # a reuse is a copy: the next one sees the measurement
    assert shared.reuse(items["TRAIN-MFU"])["evidence"]["cases_measured"]["m"]["trials"] == 40
    assert shared.reuse(items["PO-GEMM-04"]) is None  # another measurement


def test_a_run_measures_once_per_measurement_and_a_new_run_measures_again(monkeypatch):
    """kc check's quiet phase: FALSIFY-CUBLAS-008 takes PO-GEMM-04's measurement of the same run (a fake executor
    stands for the GPU), PO-GEMM-04-matmul measures its own; an item after an errored source measures its own."""
    from obligations.check import RunOptions, check_paths
    from obligations.core.results import error
    from obligations.isolation import InProcess

    measured: list[str] = []
    real_run = InProcess.run
    verdict = {"PO-GEMM-04": "violated", "PO-GEMM-04-matmul": "passed"}

    def run(self, contract, item, *a):
        if item.get("method") != "measure":
            return real_run(self, contract, item, *a)
        measured.append(item["id"])
        if item["id"] not in verdict:
            return error("the fake GPU broke").to_json()
        return {"status": verdict[item["id"]], "reason": "fake", "evidence": {"run": len(measured)}, "entry_points": []}

    monkeypatch.setattr(InProcess, "run", run)
    gemm = CONTRACTS / "gemm-cublas-v1.yaml"
    ids = ["PO-GEMM-02-A-z3", "PO-GEMM-02-B-z3", "PO-GEMM-04", "PO-GEMM-04-matmul", "FALSIFY-CUBLAS-008"]
    items = {it["id"]: it for it in check_paths([gemm], only=ids, options=RunOptions(jobs=1))["contracts"][0]["items"]}
    assert measured == ["PO-GEMM-04", "PO-GEMM-04-matmul"]
    assert items["FALSIFY-CUBLAS-008"]["status"] == items["PO-GEMM-04"]["status"] == "violated"
    assert items["FALSIFY-CUBLAS-008"]["evidence"] == {"run": 1, "shared_with": "gemm-cublas-v1:PO-GEMM-04"}
    assert "shared_with" not in items["PO-GEMM-04"]["evidence"]
    verdict.pop("PO-GEMM-04")  # a new run measures again; its source errs, so FALSIFY-CUBLAS-008 measures its own
    items = {it["id"]: it for it in check_paths([gemm], only=ids, options=RunOptions(jobs=1))["contracts"][0]["items"]}
    assert measured[2:] == ["PO-GEMM-04", "PO-GEMM-04-matmul", "FALSIFY-CUBLAS-008"]
    assert items["FALSIFY-CUBLAS-008"]["status"] == "error"
    assert "shared_with" not in (items["FALSIFY-CUBLAS-008"].get("evidence") or {})
