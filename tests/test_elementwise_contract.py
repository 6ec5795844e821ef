"""contracts/elementwise-float32-v1.yaml through `kc check`: each planted bug caught by the item meant for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from obligations.check import check_contract

ROOT = Path(__file__).resolve().parent.parent
EW = ROOT / "contracts" / "elementwise-float32-v1.yaml"


def _run(tmp_path: Path, ids: list[str], old: str = "", new: str = "") -> dict[str, dict]:
    text = EW.read_text()
    if old:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / "elementwise-float32-v1.yaml"
    path.write_text(text)
    return {it["id"]: it for it in check_contract(path, only=ids)["items"]}


def test_host_run_has_no_refuted_item_and_cuda_only_items_say_why(tmp_path):
    items = check_contract(EW)["items"]
    assert not [it["id"] for it in items if it["status"] in ("violated", "error", "unknown")]
    for it in items:
        if it["status"] == "skipped":
            assert "cuda" in it["reason"].lower(), it
    proved = {it["id"] for it in items if it["status"] == "proved"}
    assert {"EW-PLAN-coverage-z3", "EW-PLAN-step-z3", "EW-PLAN-no-overflow-z3"} <= proved


def test_grid_stride_loop_with_a_32_bit_index_is_caught_by_z3(tmp_path):
    items = _run(
        tmp_path,
        ["EW-PLAN-step-z3"],
        "native.elementwise:launch_plan",
        "tests.planted.elementwise_bugs:launch_plan_wrap32",
    )
    it = items["EW-PLAN-step-z3"]
    assert it["status"] == "violated"
    assert any("int32 overflow" in f for f in it["counterexample"]["failed_conditions"])
    assert it["counterexample"]["symbols"]["i"] + it["counterexample"]["quantities"]["stride"] > 2**31 - 1


def test_an_unbounded_grid_cap_overflows_the_int32_stride(tmp_path):
    """grid * block passes 2^31 - 1 when n is near 2^31 and the cap allows 2^21 blocks of 1024."""
    items = _run(
        tmp_path,
        ["EW-PLAN-no-overflow-z3"],
        "max_grid: {type: int32, min: 1, max: 65536",
        "max_grid: {type: int32, min: 1, max: 2147483647",
    )
    assert items["EW-PLAN-no-overflow-z3"]["status"] == "violated"


@pytest.mark.parametrize(
    ("item", "params_old", "params_new"),
    [
        (
            "FALSIFY-EW-DIV-bitwise",
            "{op: div, route: nvrtc-ieee, env: cuda}",
            "{op: div, route: nvrtc-ieee, env: cuda, variant: fast_math}",
        ),
        (
            "FALSIFY-EW-ADD-bitwise",
            "{op: add, route: nvrtc-ieee, env: cuda, refute_envs: [ieee]}",
            "{op: add, route: nvrtc-ieee, env: cuda, refute_envs: [ieee], variant: tail_short}",
        ),
        (
            "FALSIFY-EW-MUL-bitwise",
            "{op: mul, route: nvrtc-ieee, env: cuda, refute_envs: [ieee]}",
            "{op: mul, route: nvrtc-ieee, env: cuda, refute_envs: [ieee], variant: tail_over}",
        ),
        (
            "FALSIFY-EW-RELU-bitwise",
            "{op: relu, route: nvrtc-ieee, env: cuda}",
            "{op: relu, route: nvrtc-ieee, env: cuda, variant: nan_as_number}",
        ),
        (
            "FALSIFY-EW-AXPY-separate",
            "{op: axpy, route: nvrtc-ieee, promise: separate}",
            "{op: axpy, route: nvrtc-ieee, promise: separate, variant: contracted}",
        ),
        ("FALSIFY-EW-grid-coverage", "{op: add}\n", "{op: add, variant: wrap32}\n"),
    ],
)
def test_planted_kernel_bugs_are_violated_by_their_item(tmp_path, item, params_old, params_new):
    it = _run(tmp_path, [item], params_old, params_new)[item]
    assert it["status"] == "violated", (item, it["status"], it["reason"])
    assert it["counterexample"]


def test_the_literal_ieee_claim_is_refuted_by_a_nan_payload(tmp_path):
    """Bits equal the reference only under env cuda: IEEE 754's NaN payload propagation is refuted, with a NaN."""
    it = _run(tmp_path, ["FALSIFY-EW-ADD-bitwise"])["FALSIFY-EW-ADD-bitwise"]
    (claim,) = it["evidence"]["refuted_claims"]
    assert it["status"] == "passed" and claim["claim"] == "bitwise under ieee" and claim["refuted"]
    out = claim["counterexample"]["element"]["outputs"]["r"]
    assert out["native"] == "0x7FFFFFFF" and out["reference"] != out["native"] and out["reference_value"] == "nan"
