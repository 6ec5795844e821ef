"""The triton-softmax family: the tutorials' fused softmax holds its contract through Triton's interpreter (and
compiled on a GPU), planted bugs in the kernel are caught, the interpreter guards every array, the contract's
``triton:`` role is validated against the plan, and without triton every Triton item is skipped."""

from __future__ import annotations

import numpy as np
import pytest

from native import triton_softmax as tsm
from native import tritonrt
from obligations.check import check_contract
from tests.contract_helpers import CONTRACTS, check_items, contract_variant, needs_cuda

CONTRACT = CONTRACTS / "triton-softmax-v1.yaml"
WHY = tritonrt.triton_unavailable()
needs_triton = pytest.mark.skipif(WHY is not None, reason=WHY or "")
ITEMS = [line.split("id: ")[1] for line in CONTRACT.read_text().splitlines() if line.lstrip().startswith("- id: ")]
INTERPRETER = "interpreter (TRITON_INTERPRET semantics: NumPy on the host)"


def _statuses(res: dict) -> dict[str, str]:
    return {it["id"]: it["status"] for it in res["items"]}


@needs_triton
def test_contract_holds_through_the_interpreter():
    res = check_contract(CONTRACT, device="host")
    bad = {k: v for k, v in _statuses(res).items() if v not in ("proved", "passed")}
    assert bad == {"TSM-SANITIZE": "skipped"}, bad  # compute-sanitizer needs the GPU
    assert next(it for it in res["items"] if it["id"] == "TSM-SANITIZE")["reason"].startswith("runs on cuda")
    assert not res["unchecked_entry_points"], res["unchecked_entry_points"]
    ran = [it for it in res["items"] if it["method"] == "falsify"]
    assert ran and all(it["evidence"]["executed_by"]["triton"]["mode"] == INTERPRETER for it in ran)
    for bound in (it for it in ran if it["id"].endswith("-bound")):
        assert not bound["evidence"]["regimes_unreached"], bound["evidence"]["regimes_reached"]


def test_without_triton_the_triton_items_are_skipped_not_passed(monkeypatch):
    monkeypatch.setattr(tritonrt, "triton_unavailable", lambda: "triton is not importable (test); pip install it")
    res = check_contract(CONTRACT, device="host", only=[i for i in ITEMS if i != "TSM-SANITIZE"])
    st = _statuses(res)
    # the plan proofs need no triton; the kernel's agreement and its audit cannot run and say why
    assert {k for k, v in st.items() if v == "proved"} == {"TSM-ACCESS-z3", "TSM-BLOCK-z3", "TSM-REGIMES"}, st
    skipped = [it for it in res["items"] if it["status"] == "skipped"]
    assert {it["id"] for it in skipped} == {"TSM-bound", "TSM-sum", "TSM-AUDIT", "FALSIFY-TSM-001"}
    assert all("triton is not importable" in it["reason"] for it in skipped)
    with pytest.raises(tritonrt.TritonUnavailable):
        tsm.softmax(np.ones((2, 3), np.float32), device="host")


def test_the_plan_is_the_tutorials_launch():
    assert [tsm.softmax_plan(1, n).BLOCK_SIZE for n in (1, 3, 4, 1000)] == [1, 4, 4, 1024]
    assert [tsm.softmax_plan(1, n).num_warps for n in (1000, 2048, 4096, 16384)] == [4, 8, 16, 16]
    assert tsm.softmax_plan(3, 37).grid() == (3,)
    assert not tsm.softmax_plan(1, tsm.SOFTMAX_MAX_LENGTH + 1).admissible  # one block per row: no longer rows


@needs_triton
def test_planted_mask_off_by_one_is_caught(tmp_path):
    # a wrong mask (<= n_cols): reached by the plan's masked-block witness
    old, new = 'impl: "native.triton_softmax:softmax"', 'impl: "tests.planted.triton_bugs:softmax_mask_off_by_one"'
    got = check_items(contract_variant(CONTRACT, tmp_path, old, new, count=-1), ["TSM-bound"])
    assert {k: v["status"] for k, v in got.items()} == {"TSM-bound": "violated"}, got


@needs_triton
def test_the_interpreter_guards_every_array():
    from tests.planted import triton_bugs

    x = np.ones((1, 3), np.float32)  # one row shorter than its block: the off-by-one lane stores past the array
    with pytest.raises(tritonrt.OutOfBounds, match="argument 0"):
        triton_bugs.softmax_mask_off_by_one(x, device="host")


def test_the_builds_declare_exactly_the_softmax_lowering():
    from native.builds import all_builds

    builds = all_builds(tsm.FAMILY)
    # one build per launch configuration kind of the plan (a short row, the largest block); TSM-AUDIT compiles them
    assert [b.name for b in builds] == ["softmax_kernel-block128-warps4", "softmax_kernel-block16384-warps16"]
    assert all(b.toolchain == "triton" and b.declared == {"div.full.f32", "ex2.approx.f32"} for b in builds)


@needs_cuda
@needs_triton
@pytest.mark.cuda
def test_contract_holds_compiled_on_the_gpu():
    res = check_contract(CONTRACT, device="cuda")
    bad = {k: v for k, v in _statuses(res).items() if v not in ("proved", "passed")}
    assert not bad, bad
    ran = [it for it in res["items"] if it["method"] == "falsify"]
    assert all(it["evidence"]["executed_by"]["triton"]["mode"] == "compiled (GPU)" for it in ran)
    audit = next(it for it in res["items"] if it["method"] == "audit")
    assert audit["evidence"]["sass"]["findings"] == 0 and audit["evidence"]["sass"]["builds"] > 0


@needs_triton
def test_validation_checks_the_triton_role_against_the_plan(tmp_path):
    from obligations.contract import ContractError, load_contract

    not_jit = contract_variant(
        CONTRACT, tmp_path, "triton: native.tritonk.softmax:softmax_kernel", "triton: native.triton_softmax:softmax"
    )
    with pytest.raises(ContractError, match="native.triton_softmax:softmax is not a @triton.jit function"):
        load_contract(not_jit)
    # the CUDA kernels' row plan chooses no BLOCK_SIZE and no grid: the launch could not take them from it
    (tmp_path / "p").mkdir()
    other_plan = contract_variant(
        CONTRACT, tmp_path / "p", "plan: native.triton_softmax:softmax_plan", "plan: native.norm:row_plan"
    )
    with pytest.raises(ContractError) as info:
        load_contract(other_plan)
    assert "tl.constexpr 'BLOCK_SIZE' is not a quantity of the plan" in str(info.value)
    assert "the plan has no 'grid' quantity" in str(info.value)
