"""The triton-rmsnorm family: the RMSNorm in the layer-norm tutorial's style holds its contract through Triton's
interpreter (and compiled on a GPU), planted bugs in the kernel, the plan and the builds are caught, and without
triton every Triton item is skipped."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from native import triton_rmsnorm as trms
from native import tritonrt
from obligations.check import check_contract
from tests.contract_helpers import CONTRACTS, check_items, contract_variant, needs_cuda

CONTRACT = CONTRACTS / "triton-rmsnorm-v1.yaml"
WHY = tritonrt.triton_unavailable()
needs_triton = pytest.mark.skipif(WHY is not None, reason=WHY or "")
INTERPRETER = "interpreter (TRITON_INTERPRET semantics: NumPy on the host)"


def _statuses(res: dict) -> dict[str, str]:
    return {it["id"]: it["status"] for it in res["items"]}


@needs_triton
def test_contract_holds_through_the_interpreter():
    res = check_contract(CONTRACT, device="host")
    bad = {k: v for k, v in _statuses(res).items() if v not in ("proved", "passed")}
    assert bad == {"TRMS-SANITIZE": "skipped"}, bad  # compute-sanitizer needs the GPU
    assert next(it for it in res["items"] if it["id"] == "TRMS-SANITIZE")["reason"].startswith("runs on cuda")
    assert not res["unchecked_entry_points"], res["unchecked_entry_points"]
    ran = [it for it in res["items"] if it["method"] == "falsify"]
    assert ran and all(it["evidence"]["executed_by"]["triton"]["mode"] == INTERPRETER for it in ran)
    for bound in (it for it in ran if it["id"].endswith("-bound")):
        assert not bound["evidence"]["regimes_unreached"], bound["evidence"]["regimes_reached"]


def test_without_triton_the_triton_items_are_skipped_not_passed(monkeypatch):
    monkeypatch.setattr(tritonrt, "triton_unavailable", lambda: "triton is not importable (test); pip install it")
    res = check_contract(CONTRACT, device="host", only=["TRMS-ACCESS-z3", "TRMS-bound", "TRMS-AUDIT"])
    st = _statuses(res)
    # the plan proofs need no triton; the kernel's agreement and its audit cannot run and say why
    assert st == {"TRMS-ACCESS-z3": "proved", "TRMS-bound": "skipped", "TRMS-AUDIT": "skipped"}, st
    assert all("triton is not importable" in it["reason"] for it in res["items"] if it["status"] == "skipped")
    with pytest.raises(tritonrt.TritonUnavailable):
        trms.rmsnorm(np.ones((2, 3), np.float32), np.ones(3, np.float32), device="host")


def test_the_launch_reads_grid_and_every_constexpr_from_the_plan():
    plan = trms.rmsnorm_plan(3, 20000)
    assert (plan.grid(), plan.BLOCK_SIZE, plan.num_warps, plan.blocks()) == ((3,), 16384, 8, 2)

    class Kernel:  # a stand-in with a jit function's .fn: one constexpr the plan does not choose
        @staticmethod
        def fn(x, BLOCK_SIZE: tl.constexpr, EXTRA: tl.constexpr):  # noqa: F821, N803
            return None

    assert tritonrt.constexpr_names(Kernel) == ["BLOCK_SIZE", "EXTRA"]
    with pytest.raises(ValueError, match="EXTRA"):
        tritonrt._from_plan(Kernel, plan)


@needs_triton
@pytest.mark.parametrize(
    ("items", "old", "new"),
    [
        # a wrong grid: the last row has no program
        (
            ["TRMS-COVER-z3"],
            "plan: native.triton_rmsnorm:rmsnorm_plan",
            "plan: tests.planted.triton_bugs:rmsnorm_plan_short_grid",
        ),
        # the CUDA kernels' 2^40-element guard over the tutorial's int32 offsets: row * stride wraps
        (
            ["TRMS-ACCESS-z3"],
            "plan: native.triton_rmsnorm:rmsnorm_plan",
            "plan: tests.planted.triton_bugs:rmsnorm_plan_wide_guard",
        ),
        # a wrong reduction: the mean of squares over BLOCK_SIZE lanes instead of the row's N
        (
            ["TRMS-bound"],
            'impl: "native.triton_rmsnorm:rmsnorm"',
            'impl: "tests.planted.triton_bugs:rmsnorm_mean_over_block"',
        ),
    ],
    ids=["short-grid", "int32-wrap", "mean-over-block"],
)
def test_planted_bug_is_caught(tmp_path, items, old, new):
    path = contract_variant(CONTRACT, tmp_path, old, new, count=-1)
    got = check_items(path, items)
    assert {k: v["status"] for k, v in got.items()} == dict.fromkeys(items, "violated"), got


@needs_triton
def test_the_audit_reads_tritons_ptx_and_catches_undeclared_opcodes(monkeypatch):
    from native.builds import all_builds
    from obligations.audit import audit_build

    builds = all_builds(trms.FAMILY)
    assert builds and all(b.toolchain == "triton" and b.declared == trms.DECLARED for b in builds)
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
