"""Triton kernels as contract subjects: the tutorial softmax and RMSNorm contracts hold through Triton's interpreter,
planted bugs in the kernels, plans and builds are caught, and without triton every Triton item is skipped."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from native import triton as tn
from native import tritonrt
from obligations.check import check_contract
from tests.contract_helpers import CONTRACTS, check_items, contract_variant, needs_cuda

CONTRACT = CONTRACTS / "triton-norm-v1.yaml"
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
    assert bad == {"TRITON-SANITIZE": "skipped"}, bad  # compute-sanitizer needs the GPU
    assert next(it for it in res["items"] if it["id"] == "TRITON-SANITIZE")["reason"].startswith("runs on cuda")
    assert not res["unchecked_entry_points"], res["unchecked_entry_points"]
    ran = [it for it in res["items"] if it["method"] == "falsify"]
    assert ran and all(it["evidence"]["executed_by"]["triton"]["mode"] == INTERPRETER for it in ran)
    for bound in (it for it in ran if it["id"].endswith("-bound")):
        assert not bound["evidence"]["regimes_unreached"], bound["evidence"]["regimes_reached"]


def test_without_triton_the_triton_items_are_skipped_not_passed(monkeypatch):
    monkeypatch.setattr(tritonrt, "triton_unavailable", lambda: "triton is not importable (test); pip install it")
    res = check_contract(
        CONTRACT, device="host", only=[i for i in ITEMS if i.startswith(("TSM", "FALSIFY-TSM", "TRITON-AUDIT"))]
    )
    st = _statuses(res)
    # the plan proofs need no triton; the kernel's agreement and its audit cannot run and say why
    assert {k for k, v in st.items() if v == "proved"} == {"TSM-ACCESS-z3", "TSM-BLOCK-z3", "TSM-REGIMES"}, st
    skipped = [it for it in res["items"] if it["status"] == "skipped"]
    assert {it["id"] for it in skipped} == {"TSM-bound", "TSM-sum", "TRITON-AUDIT", "FALSIFY-TSM-001"}
    assert all("triton is not importable" in it["reason"] for it in skipped)
    with pytest.raises(tritonrt.TritonUnavailable):
        tn.softmax(np.ones((2, 3), np.float32), device="host")


def test_the_launch_reads_grid_and_every_constexpr_from_the_plan():
    plan = tn.rmsnorm_plan(3, 20000)
    assert (plan.grid(), plan.BLOCK_SIZE, plan.num_warps, plan.blocks()) == ((3,), 16384, 8, 2)
    assert [tn.softmax_plan(1, n).BLOCK_SIZE for n in (1, 3, 4, 1000)] == [1, 4, 4, 1024]

    class Kernel:  # a stand-in with a jit function's .fn: one constexpr the plan does not choose
        @staticmethod
        def fn(x, BLOCK_SIZE: tl.constexpr, EXTRA: tl.constexpr):  # noqa: F821, N803
            return None

    assert tritonrt.constexpr_names(Kernel) == ["BLOCK_SIZE", "EXTRA"]
    with pytest.raises(ValueError, match="EXTRA"):
        tritonrt._from_plan(Kernel, plan)


@needs_triton
@pytest.mark.parametrize(
    ("contract", "items", "old", "new"),
    [
        # a wrong grid: the last row has no program
        (
            CONTRACT,
            ["TRMS-COVER-z3"],
            "plan: native.triton:rmsnorm_plan",
            "plan: tests.planted.triton_bugs:rmsnorm_plan_short_grid",
        ),
        # the CUDA kernels' 2^40-element guard over the tutorial's int32 offsets: row * stride wraps
        (
            CONTRACT,
            ["TRMS-ACCESS-z3"],
            "plan: native.triton:rmsnorm_plan",
            "plan: tests.planted.triton_bugs:rmsnorm_plan_wide_guard",
        ),
        # a wrong mask (<= n_cols): reached by the plan's masked-block witness
        (
            CONTRACT,
            ["TSM-bound"],
            'impl: "native.triton:softmax"',
            'impl: "tests.planted.triton_bugs:softmax_mask_off_by_one"',
        ),
        # a wrong reduction: the mean of squares over BLOCK_SIZE lanes instead of the row's N
        (
            CONTRACT,
            ["TRMS-bound"],
            'impl: "native.triton:rmsnorm"',
            'impl: "tests.planted.triton_bugs:rmsnorm_mean_over_block"',
        ),
    ],
    ids=["short-grid", "int32-wrap", "mask-off-by-one", "mean-over-block"],
)
def test_planted_bug_is_caught(tmp_path, contract, items, old, new):
    path = contract_variant(contract, tmp_path, old, new, count=-1)
    got = check_items(path, items)
    assert {k: v["status"] for k, v in got.items()} == dict.fromkeys(items, "violated"), got


@needs_triton
def test_the_interpreter_guards_every_array():
    from tests.planted import triton_bugs

    x = np.ones((1, 3), np.float32)  # one row shorter than its block: the off-by-one lane stores past the array
    with pytest.raises(tritonrt.OutOfBounds, match="argument 0"):
        triton_bugs.softmax_mask_off_by_one(x, device="host")


@needs_triton
def test_the_audit_reads_tritons_ptx_and_catches_undeclared_opcodes(monkeypatch):
    from native.builds import all_builds
    from obligations.audit import audit_build

    builds = [b for b in all_builds("triton") if b.name.startswith("rms_norm_fwd")]
    assert builds and all(b.toolchain == "triton" for b in all_builds("triton"))
    applied, found = audit_build(builds[0])
    assert {"no-ftz", "no-approx", "no-mma"} <= set(applied) and not found
    # the same kernel without its declarations: Triton's `/` and tl.sqrt are approximate, tl.sqrt flushes subnormals
    _, found = audit_build(dataclasses.replace(builds[0], declared=frozenset()))
    assert {(f.rule, f.lines[0][1].split()[0]) for f in found} >= {
        ("no-approx", "div.full.f32"),
        ("no-ftz", "sqrt.approx.ftz.f32"),
    }
    # a route whose options drift from its promise (fusion on under triton-ieee) is caught in its PTX
    # without libdevice's ftz reflection tl.sqrt is sqrt.approx.f32: a declaration names the exact opcode
    ieee = dataclasses.replace(builds[0], route="triton-ieee")
    assert {f.lines[0][1].split()[0] for f in audit_build(ieee)[1]} == {"sqrt.approx.f32"}
    ieee = dataclasses.replace(ieee, declared=ieee.declared | {"sqrt.approx.f32"})
    assert not audit_build(ieee)[1]
    monkeypatch.setitem(tritonrt.ROUTE_OPTIONS, "triton-ieee", {"enable_fp_fusion": True, "enable_reflect_ftz": False})
    drifted = dataclasses.replace(ieee, name="drifted")  # a new build: not the cached compile
    assert "no-contraction" in {f.rule for f in audit_build(drifted)[1]}


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
        CONTRACT, tmp_path, "triton: native.tritonk.norm:softmax_kernel", "triton: native.triton:softmax"
    )
    with pytest.raises(ContractError, match="native.triton:softmax is not a @triton.jit function"):
        load_contract(not_jit)
    # the CUDA kernels' row plan chooses no BLOCK_SIZE and no grid: the launch could not take them from it
    (tmp_path / "p").mkdir()
    other_plan = contract_variant(
        CONTRACT, tmp_path / "p", "plan: native.triton:softmax_plan", "plan: native.norm:row_plan"
    )
    with pytest.raises(ContractError) as info:
        load_contract(other_plan)
    assert "tl.constexpr 'BLOCK_SIZE' is not a quantity of the plan" in str(info.value)
    assert "the plan has no 'grid' quantity" in str(info.value)
