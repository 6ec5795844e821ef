"""Transfer family: conversions vs softfloat, bit-exact download, the contract on the host, planted bugs, CUDA."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from falsification.transfer_tests import edge_inputs
from native import transfer
from obligations.check import check_contract
from spec.transfer import TARGETS, convert_reference, overflow_threshold_bits
from tests.contract_helpers import check_items, contract_variant, needs_cuda

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "contracts" / "transfer-float32-v1.yaml"


def _variant(tmp_path: Path, old: str, new: str) -> Path:
    return contract_variant(CONTRACT, tmp_path, old, new, 1)


def _items(path: Path, ids: list[str], device: str = "host") -> dict[str, dict]:
    return check_items(path, ids, device)


def _f64(bits: int) -> float:
    return float(np.array([bits], np.uint64).view(np.float64)[0])


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_overflow_threshold_is_the_tie_that_rounds_to_infinity(target):
    t = TARGETS[target]
    thr = overflow_threshold_bits(target)
    inf = ((1 << t.exp_bits) - 1) << t.man_bits
    got = transfer.upload(np.array([_f64(thr), _f64(thr - 1), -_f64(thr)]), target, device="host")
    assert [int(v) for v in got] == [inf, inf - 1, inf | (1 << (t.width - 1))]


def test_binary32_subnormal_results_and_ties():
    x = np.array([2.0**-149, 2.0**-150, 2.0**-150 * 3, 2.0**-150 * 1.0000001, 1 + 2.0**-24, 1 + 3 * 2.0**-24])
    got = [int(v) for v in transfer.upload(x, "binary32", device="host")]
    assert got == [1, 0, 2, 1, 0x3F800000, 0x3F800002]  # ties to even, subnormals kept
    trunc = [int(v) for v in transfer.upload(x, "binary32", device="host", variant="truncate")]
    assert trunc == [1, 0, 1, 0, 0x3F800000, 0x3F800001]


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_integer_conversion_equals_softfloat_on_the_edges(target):
    x = edge_inputs(target)
    t = TARGETS[target]
    ref = convert_reference(x, target)
    np.testing.assert_array_equal(transfer.narrow_bits(x, t.exp_bits, t.man_bits).astype(t.dtype), ref)


def test_numpy_keeps_a_binary16_nan_signaling_which_the_contract_does_not_promise_against():
    # Recorded behaviour: float64 sNaN -> float16 keeps the signaling bit pattern 0x7C01; softfloat quiets it.
    got = int(transfer.upload(np.array([_f64(0x7FF0000000000001)]), "binary16", device="host")[0])
    assert got == 0x7C01 and int(convert_reference(np.array([0x7FF0000000000001], np.uint64), "binary16")[0]) == 0x7E00


def test_download_keeps_nan_payloads_and_negative_zero_and_the_float64_route_does_not():
    pat = np.array([0x7F800001, 0xFFC12345, 0x80000000, 0x00000001], np.uint32)
    back = transfer.download(pat.view(np.float32))
    np.testing.assert_array_equal(back.view(np.uint32), pat)
    bad = transfer.download(pat.view(np.float32), variant="via_float64").view(np.uint32)
    assert int(bad[0]) == 0x7FC00001  # the sNaN came back quieted


def test_shipped_contract_on_the_host():
    entry = check_contract(CONTRACT, device="host")
    for it in entry["items"]:
        if it["method"] == "sanitize":  # compute-sanitizer runs on the device only
            assert it["status"] == "skipped" and "cuda" in it["reason"], (it["id"], it["reason"])
            continue
        want = "proved" if it["method"] in ("z3", "regimes") else "passed"
        assert it["status"] == want, (it["id"], it["reason"])


@pytest.mark.parametrize(
    ("item", "fmt"),
    [("FALSIFY-XFER-001", "binary32"), ("FALSIFY-XFER-002", "binary16"), ("FALSIFY-XFER-003", "bfloat16")],
)
def test_truncating_conversion_is_caught_with_one_input(tmp_path, item, fmt):
    path = _variant(tmp_path, f"params: {{format: {fmt}}}", f"params: {{format: {fmt}, variant: truncate}}")
    it = _items(path, [item])[item]
    assert it["status"] == "violated", it["reason"]
    assert it["counterexample"]["kind"] == "element"
    el = it["counterexample"]["element"]
    x = int(el["input_bits"], 16)
    t = TARGETS[fmt]
    out = el["outputs"]["r"]
    # The one input really separates the modes: truncation is one unit below round-to-nearest in magnitude.
    assert int(out["native"], 16) + 1 == int(out["reference"], 16)
    assert int(out["reference"], 16) == int(convert_reference(np.array([x], np.uint64), fmt)[0])
    assert int(out["native"], 16) == int(
        transfer.narrow_bits(np.array([x], np.uint64), t.exp_bits, t.man_bits, truncate=True)[0]
    )


def test_download_through_float64_is_caught(tmp_path):
    path = _variant(
        tmp_path,
        "params: {formats: [binary32, binary16, bfloat16, binary64]}",
        "params: {formats: [binary32, binary16, bfloat16, binary64], variant: via_float64}",
    )
    it = _items(path, ["FALSIFY-XFER-004"])["FALSIFY-XFER-004"]
    assert it["status"] == "violated"
    ce = it["counterexample"]
    assert ce["case"]["format"] == "binary32" and ce["element"]["outputs"]["r"]["reference"] == "0x7F800001"


def test_int32_byte_count_is_caught_by_z3(tmp_path):
    path = _variant(
        tmp_path, "plan: native.transfer:transfer_plan", "plan: tests.planted.transfer_bugs:plan_int32_bytes"
    )
    it = _items(path, ["XFER-LAUNCH-z3"])["XFER-LAUNCH-z3"]
    assert it["status"] == "violated"
    assert any("int32" in c for c in it["counterexample"]["failed_conditions"])


# -- CUDA ------------------------------------------------------------------------------------------------


@pytest.mark.cuda
@needs_cuda
def test_cuda_contract_passes_and_prints_figures():
    entry = check_contract(CONTRACT, device="cuda", profile="full")
    items = {it["id"]: it for it in entry["items"]}
    bad = {i: it["reason"] for i, it in items.items() if it["status"] not in ("proved", "passed")}
    assert not bad, bad
    for i in ("FALSIFY-XFER-001", "FALSIFY-XFER-002"):
        ev = items[i]["evidence"]
        print(
            f"\n{i}: cases {ev['cases']}, NaN payload equal {ev['nan_payload_equal']}/{ev['nan_inputs']}, "
            f"stock CuPy astype: {ev['stock_cupy_astype']}"
        )


@pytest.mark.cuda
@needs_cuda
def test_cuda_truncation_is_caught(tmp_path):
    path = _variant(tmp_path, "params: {format: binary32}", "params: {format: binary32, variant: truncate}")
    assert _items(path, ["FALSIFY-XFER-001"], "cuda")["FALSIFY-XFER-001"]["status"] == "violated"


def test_bulk_nan_statistics_come_from_the_judged_bulk_case():
    """The evidence's NaN counts (taken from the bulk case's judgement) equal a separate upload of the bulk."""
    from falsification.profiles import budget_for
    from falsification.transfer_tests import bulk_inputs, h2d_disagreements

    it = _items(CONTRACT, ["FALSIFY-XFER-002"])["FALSIFY-XFER-002"]
    assert it["status"] == "passed"
    x = np.concatenate(
        [edge_inputs("binary16"), bulk_inputs("binary16", budget_for("transfer.h2d_rounding", "quick").bulk, 0)]
    )
    res = h2d_disagreements(x, "binary16", "host", None)
    ev = it["evidence"]
    assert (ev["nan_inputs"], ev["nan_payload_equal"]) == (res["nan_inputs"], res["nan_payload_equal"])
    assert ev["bulk_inputs"] + ev["edge_inputs"] == x.size and ev["nan_inputs"] > 0
