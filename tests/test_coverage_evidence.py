"""Coverage evidence (issue 11): regime witnesses as explicit cases, entry-point coverage, the index type read
from the plan, order-sensitive inputs and ``--strict``; each planted bug is caught by the mechanism it targets."""

from __future__ import annotations

import numpy as np
import pytest

from falsification import engine
from falsification.agreement import Expected
from falsification.registry import FalsifyContext, get_test
from native import elementwise as ew
from native import reductions as red
from obligations.check import check_contract, exit_code, summarize
from obligations.contract import load_contract
from obligations.core import entrypoints
from obligations.core.plans import regime_of
from obligations.engines import _regime_witnesses
from spec import reductions as ref
from tests.planted import coverage_bugs

REDUCTIONS = "contracts/reductions-v1.yaml"
PLANTED_TREE = "tests.planted.coverage_bugs:tree_sum_reversed_loop"


def _tree_item(contract, impl: str) -> dict:
    item = dict(next(it for it in contract.items if it["id"] == "RED-TREE-bitwise"))
    return {**item, "params": {"impl": impl}}


def _run_tree(device: str, impl: str, witnesses: bool):
    c = load_contract(REDUCTIONS)
    w = _regime_witnesses(c, "RED-TREE-regimes") if witnesses else {}
    ctx = FalsifyContext(
        device=device,
        profile="quick",
        seed=0,
        item=_tree_item(c, impl),
        contract=c.data,
        contract_path=c.path,
        witnesses=w,
    )
    return get_test("reductions.tree_bitwise").run(ctx)


def test_tree_witnesses_reach_every_regime_and_the_main_loop_with_few_elements():
    w = _regime_witnesses(load_contract(REDUCTIONS), "RED-TREE-regimes")
    assert w["main_loop"] == {"n": 225, "block": 32, "max_grid": 1}  # 7 * 32 + 1: the loop with a one-block grid
    out = _run_tree("host", "native.reductions:tree_sum", True)
    assert out.status.value == "passed"
    assert out.evidence.get("regimes_unreached") == [] and out.evidence.get("regimes_reached")["main_loop"] >= 1


@pytest.mark.parametrize("device", ["host", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_planted_main_loop_reorder_is_caught_only_by_the_main_loop_witness(device):
    if device == "cuda":
        from obligations.core.device import cuda_available

        if not cuda_available()[0]:
            pytest.skip("no CUDA device")
    without = _run_tree(device, PLANTED_TREE, False)
    assert without.status.value == "passed"  # no random or explicit case reaches the unrolled loop
    assert without.evidence.get("regimes_reached", {}).get("main_loop", 0) == 0
    found = _run_tree(device, PLANTED_TREE, True)
    assert found.status.value == "violated", found.reason
    case = found.counterexample["case"]
    # The property, not one machine's values: the refuting case is in the main-loop regime (the host finds the
    # witness (225, 32, 1); an H200 run reported (512, 32, 2), also a main-loop case).
    args = {k: int(case[k]) for k in ("n", "block", "max_grid")}
    assert "main_loop" in regime_of(red.tree_plan, args), (args, regime_of(red.tree_plan, args))


def test_index_type_is_read_from_the_plan_and_the_audit_index_rule_passes_on_it():
    src32, _ = ew.kernel_source("add", plan=ew.launch_plan(1, index_bits=32))
    src64, _ = ew.kernel_source("add", plan=ew.launch_plan(1, index_bits=64))
    assert "for (int i = (int)blockIdx.x" in src32 and "for (long long i = (long long)blockIdx.x" in src64
    assert ew.kernel_source("add")[0] == src64  # the shipped plan proves int64
    from native.ptx import PtxUnavailable, nvrtc_version

    try:
        nvrtc_version()
    except PtxUnavailable as exc:
        pytest.skip(str(exc))
    from native.builds import Build
    from obligations.audit import RULES, audit_build

    rules = {"index-64": RULES["index-64"]}
    applied, found = audit_build(Build("elementwise", "add", src64, "kc_add", "nvrtc-ieee", index_bits=64), rules)
    assert applied == ["index-64"] and found == []
    _, wrapped = audit_build(Build("elementwise", "add32", src32, "kc_add", "nvrtc-ieee", index_bits=64), rules)
    assert wrapped and wrapped[0].rule == "index-64"  # a source the plan did not produce is caught


def test_planted_reciprocal_mean_on_an_entry_point_with_no_item_is_unchecked_and_strict_fails():
    coverage_bugs.mean_reciprocal()
    try:
        entry = check_contract(REDUCTIONS, only=None)
        names = [c["entry"] for c in entry["unchecked_entry_points"]]
        assert names == ["reductions.mean_reciprocal"]
        summary = summarize([entry])
        assert summary["unchecked_entry_points"] == 1 and exit_code(summary, strict=True) == 1
    finally:
        entrypoints._REGISTRY.pop(coverage_bugs.MEAN_RECIPROCAL)
    # with the planted entry point gone, nothing of the family is unchecked on the host
    assert check_contract(REDUCTIONS)["unchecked_entry_points"] == []


def _fold_claim(values: np.ndarray) -> engine.Check:
    """Planted: a fold is claimed (reference: left fold) but the tree is evaluated (native)."""

    def fold(x: np.ndarray) -> Expected:
        return Expected(bits=np.asarray(ref.fold_left(x.view(np.uint32).reshape(1, -1))[0], np.uint32).reshape(-1))

    def tree(x: np.ndarray) -> Expected:
        grids = red.pass_grids(x.size, 32, 4)
        return Expected(bits=np.asarray(ref.tree_sum(x.view(np.uint32), grids, 32), np.uint32).reshape(-1))

    return engine.Check(
        name="fold claimed",
        inputs=lambda n: values[:n],
        native=lambda x: np.asarray(red.tree_sum(x, device="host", block=32, max_grid=4)).reshape(1).view(np.uint32),
        reference=fold,
        agreement=engine.make_agreement("bitwise"),
        explicit=(1000, 777, 300),
        alternative=tree,
        alternative_name="the tree",
    )


def test_planted_fold_claim_on_equal_small_integers_is_flagged_order_insensitive():
    ctx = FalsifyContext(device="host", profile="quick", seed=0, item={"id": "PLANTED-FOLD", "test": "x"})
    ones = np.full(1000, 3.0, dtype=np.float32)  # every order gives the same bits: the inputs cannot tell
    out = engine.run(ctx, _fold_claim(ones))
    assert out.status.value == "passed" and out.evidence.get("order_sensitive_cases") == 0
    assert out.evidence.get("order_insensitive") is True
    record = {"id": "PLANTED-FOLD", "status": "passed", "evidence": engine.evidence_dict(out)}
    summary = summarize([{"items": [record]}])
    assert summary["order_insensitive"] == 1 and exit_code(summary) == 0 and exit_code(summary, strict=True) == 1
    # inputs whose sums round tell the orders apart: the wrong claim is refuted
    mixed = np.random.default_rng(0).uniform(-1, 1, 1000).astype(np.float32) * np.float32(1e3)
    assert engine.run(ctx, _fold_claim(mixed)).status.value == "violated"


def _summary(*items: dict) -> dict:
    return summarize([{"items": list(items), "unchecked_entry_points": []}])


def test_strict_does_not_count_cuda_only_skips_on_the_host_but_counts_every_other_skip_and_unreached_regime():
    cuda_only = {"status": "skipped", "reason": "test 'x.perf' runs on cuda; this run is on host"}
    sanit = {"status": "skipped", "reason": "runs on cuda (compute-sanitizer); this run is on host"}
    other = {"status": "skipped", "reason": "not applicable: no PTX backend"}
    assert exit_code(_summary(cuda_only, sanit), strict=True) == 0
    assert exit_code(_summary(cuda_only, other), strict=True) == 1
    # symmetric on a device run: an item that runs on the host only is skipped there, and excused the same way
    host_only = {"status": "skipped", "reason": "runs on host (the host path's claim); this run is on cuda"}
    assert _summary(host_only)["skipped_host_only"] == 1 and exit_code(_summary(host_only), strict=True) == 0
    same = {"status": "skipped", "reason": "runs on cuda; this run is on cuda"}  # not a device mismatch
    assert exit_code(_summary(same), strict=True) == 1
    # a named assumption is a declared premise (reported as assumed): strict does not fail on it...
    assumption = {"status": "skipped", "claim": "assumed", "reason": "assumed, not checked: cuFFT accuracy"}
    assert _summary(assumption)["skipped_assumed"] == 1 and exit_code(_summary(assumption), strict=True) == 0
    # ...but a skip that merely says "assumed" in its reason, without the assume engine's claim, still fails
    lookalike = {"status": "skipped", "reason": "assumed, not checked: cuFFT accuracy"}
    assert exit_code(_summary(assumption, lookalike), strict=True) == 1
    unreached = {"status": "passed", "evidence": {"regimes_unreached": ["main_loop"]}}
    s = _summary(unreached)
    assert s["unreached_regimes"] == 1 and exit_code(s) == 0 and exit_code(s, strict=True) == 1
