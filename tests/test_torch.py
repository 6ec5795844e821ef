"""The PyTorch audit (contracts/torch-ops-v1.yaml, ``kc audit-torch``) and the Inductor check (fusion-v1).

Without torch (CI does not install it) these run: the op table against the contract, the verdict logic and the
judge on synthetic results, the report sections and the CLI's refusal. With torch (``pip install
'kernel-contracts[torch]'``) torch's CPU kernels are audited too, and planted kernels (a scaled output, NaN
turned into 0) are caught; on a CUDA device the contract's items run on the GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from falsification import torch_tests as tt
from native import torch as nt
from obligations.reporting import torch_table
from spec import torch as sto
from tests.contract_helpers import CONTRACTS, CUDA_OK, check_items, contract_variant, needs_cuda

CONTRACT = CONTRACTS / "torch-ops-v1.yaml"
FUSION = CONTRACTS / "fusion-v1.yaml"
TORCH_WHY = nt.torch_missing()
needs_torch = pytest.mark.skipif(TORCH_WHY is not None, reason=f"{TORCH_WHY} (CI does not install torch)")


def _items() -> list[dict]:
    from obligations.contract import parse_contract

    return [i for i in parse_contract(CONTRACT).data["falsification"] if i.get("test") == "torch.audit"]


# -- the table ------------------------------------------------------------------------------------------------


def test_the_contract_items_are_the_op_table():
    item = check_items(CONTRACT, ["TORCH-TABLE"])["TORCH-TABLE"]
    assert item["status"] == "passed", item["reason"]
    assert tt.table_problems(_items()) == []
    ops = {o for o, _ in sto.table_keys()}
    want = {"matmul", "conv2d", "sdpa", "layer_norm", "rms_norm", "softmax", "log_softmax", "cumsum", "sum"}
    assert ops == want
    sdpa = {b for o, b in sto.table_keys() if o == "sdpa"}
    assert {"flash-fp16", "efficient-fp16", "math-fp32", "cudnn-fp16"} <= sdpa


def test_a_planted_table_gap_is_caught(tmp_path):
    items = _items()
    assert any(
        "no item for ['matmul/tf32']" in p
        for p in tt.table_problems([i for i in items if i["id"] != "TORCH-MATMUL-tf32"])
    )
    assert any("duplicates" in p for p in tt.table_problems([*items, items[0]]))
    bad = {**items[0], "params": {"op": "matmul", "backend": "tf64"}}
    assert any("no backend 'tf64'" in p for p in tt.table_problems([*items, bad]))
    path = contract_variant(CONTRACT, tmp_path, "params: {op: sum, backend: fp32}", "params: {op: sum, backend: fp64}")
    assert check_items(path, ["TORCH-TABLE"])["TORCH-TABLE"]["status"] == "violated"


def test_every_backend_names_its_bound_or_why_none():
    for op in sto.OPS:
        for b in op.backends:
            assert b.bound in sto.BOUND_SOURCES or (not b.bound and b.bound_note.startswith("no derived bound")), b
            assert b.dtype in ("float32", "float16", "bfloat16")


def test_the_inductor_item_is_the_fusion_contracts_and_skips_on_the_host_with_the_reason():
    """Inductor compiles the decoder block fusion-v1 builds: its item is there (the fusion report shows its table)."""
    from obligations.contract import parse_contract

    def inductor_items(path):
        return [i["id"] for i in parse_contract(path).data["falsification"] if i.get("test") == "torch.inductor"]

    assert inductor_items(FUSION) == ["TORCH-INDUCTOR"] and inductor_items(CONTRACT) == []
    item = check_items(FUSION, ["TORCH-INDUCTOR"])["TORCH-INDUCTOR"]
    assert item["status"] == "skipped" and "runs on cuda" in item["reason"]


def test_the_audit_items_skip_on_the_host_with_the_reason():
    items = check_items(CONTRACT, ["TORCH-SUM-fp32", "TORCH-SDPA-flash-fp16"])
    for it in items.values():
        assert it["status"] == "skipped" and "runs on cuda" in it["reason"]


# -- judging and the verdict on synthetic results -------------------------------------------------------------


def test_judge_case_classes_and_ratio():
    value = np.array([1.0, np.nan, np.inf, 2.0, 0.0])
    bound = np.array([0.5, np.nan, np.nan, 0.25, 0.0])
    j = tt.judge_case(np.array([1.25, np.nan, np.inf, 2.5, 0.0], np.float32), value, bound)
    assert j["class_mismatches"] == 0 and j["judged"] == 3 and j["specials"] == 2
    assert j["worst"]["ratio"] == 2.0 and j["worst"]["index"] == [3] and j["beyond"] == 1
    j = tt.judge_case(np.array([1.0, 0.0, np.inf, 2.0, 1e-30], np.float32), value, bound)
    assert j["class_mismatches"] == 1 and j["first_mismatch"] == {"index": [1], "got": "finite", "spec": "NaN"}
    assert j["worst"]["ratio"] == np.inf  # an error where the bound is 0


def test_tf32_allowed_bound_holds_a_float32_kernel_and_both_tf32_roundings():
    # allow_tf32 permits TF32 reads, never requires them: cuBLAS ran a 1x1x1 product in float32 on an H200,
    # 1.7e3 x the bound of a model centred on the rounded-to-nearest operands. The bound about the exact product
    # holds float32, TF32 rounded to nearest and TF32 truncated; a product off by 2^-8 is beyond it.
    from native.gemm import _tf32

    rng = np.random.default_rng(0)
    a = rng.standard_normal((7, 33)).astype(np.float32)
    b = rng.standard_normal((33, 5)).astype(np.float32)
    value, bound = tt._gemm_ref(a, b, "float32", True)

    def trunc(x):
        return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)

    for got in (a @ b, _tf32(a) @ _tf32(b), trunc(a) @ trunc(b)):
        assert tt.judge_case(got.astype(np.float32), value, bound)["beyond"] == 0
    off = (value * (1 + 2.0**-8)).astype(np.float32)
    assert tt.judge_case(off, value, bound)["beyond"] > 0


def _summary(**kw):
    base = {
        "cases": 3,
        "unsupported": [],
        "errors": [],
        "judged_elements": 10,
        "special_elements": 2,
        "class_mismatches": 0,
        "beyond_elements": 0,
        "nondeterministic": [],
        "worst": {"ratio": 0.5, "case": "c", "index": [0]},
        "deterministic": True,
        "max_rel_error": 1e-7,
    }
    return {**base, **kw}


def test_verdict_names_every_finding_and_never_passes_without_a_bound():
    assert tt.verdict(_summary(), True)[0] == "passed"
    s, why = tt.verdict(_summary(worst={"ratio": 3.0, "case": "big", "index": [1, 2]}, beyond_elements=4), True)
    assert s == "violated" and "beyond the derived bound" in why and "'big'" in why
    mism = {
        "class_mismatches": 2,
        "class_mismatch_cases": ["masked"],
        "class_mismatch_kinds": ["NaN where the spec has finite"],
    }
    s, why = tt.verdict(_summary(**mism, nondeterministic=["x"]), True)
    assert s == "violated" and "NaN/Inf handling" in why and "not bitwise reproducible" in why
    assert tt.verdict(_summary(), False) == (
        "skipped",
        "named gap: no derived bound; measured worst max relative error 1e-07",
    )
    assert tt.verdict(_summary(worst={"ratio": 9.0, "case": "c", "index": [0]}), False)[0] == "skipped"
    assert tt.verdict(_summary(**mism), False)[0] == "violated"  # NaN handling is judged without a bound too
    refused = {"cases": 0, "unsupported": [{"case": "plain", "reason": "No available kernel"}]}
    assert tt.verdict(_summary(**refused), True) == ("skipped", "the backend ran no case (plain: No available kernel)")
    assert tt.verdict(_summary(errors=[{"case": "c", "error": "boom"}]), True)[0] == "error"


def test_summarise_and_the_outcome_of_an_audit():
    per_case = [
        {"case": "a", "judged": 4, "specials": 1, "class_mismatches": 0, "worst": {"ratio": 0.2, "index": [0]}},
        {"case": "b", "judged": 4, "specials": 0, "class_mismatches": 0, "worst": {"ratio": 0.7, "index": [3]}},
        {"case": "c", "unsupported": "No available kernel"},
        {
            "case": "d",
            "judged": 1,
            "class_mismatches": 1,
            "first_mismatch": {"index": [0], "got": "NaN", "spec": "finite"},
            "deterministic": False,
        },
    ]
    s = tt.summarise(per_case)
    assert s["cases"] == 3 and s["worst"]["case"] == "b" and s["unsupported"][0]["case"] == "c"
    assert s["nondeterministic"] == ["d"] and s["first_class_mismatch"]["case"] == "d" and not s["deterministic"]
    audit = {"op": "sum", "backend": "fp32", "verdict": "skipped", "reason": "named gap: no derived bound; x"}
    out = tt.outcome_of(None, audit)
    assert out.status.value == "skipped" and out.claim == "assumed"
    assert tt.outcome_of(None, {**audit, "verdict": "violated", "reason": "r"}).status.value == "violated"


def test_the_cases_are_seeded_and_their_references_have_bounds():
    _, b = sto.get_backend("matmul", "fp16")
    one, two = tt.cases_for("matmul", b, 3), tt.cases_for("matmul", b, 3)
    assert [c.name for c in one] == [c.name for c in two]
    assert all(
        np.array_equal(x.args["a"].view(np.uint32), y.args["a"].view(np.uint32)) for x, y in zip(one, two, strict=True)
    )
    assert np.array_equal(one[2].args["a"], one[2].args["a"].astype(np.float16).astype(np.float32))  # fp16 values
    value, bound = one[0].reference()
    assert np.all(np.isfinite(bound)) and value.shape == (1, 1)
    _, b = sto.get_backend("softmax", "fp32")
    special = tt.cases_for("softmax", b)[-1]
    value, bound = special.reference()
    assert np.isnan(value[5]).all() and np.isnan(bound[5]).all()  # a row of -inf: NaN (0/0), judged by class


def test_bfloat16_output_bound_has_its_unit_roundoff():
    from spec import gemm as sg

    a, b = np.ones((1, 4), np.float32), np.ones((4, 1), np.float32)
    ref = sg.reference(a, b, False, False)
    b32 = sg.error_bound(a, b, False, False, 1.0, 0.0, None, ref, "float32")
    b16 = sg.error_bound(a, b, False, False, 1.0, 0.0, None, ref, "bfloat16")
    assert float((b16 - b32)[0, 0]) == pytest.approx(2.0**-8 * (4 + float(b32[0, 0])) + 2.0**-134, rel=1e-6)


# -- report and CLI ---------------------------------------------------------------------------------------------


def test_report_sections_show_each_backend_and_each_inductor_step():
    ev = {
        "op": "sdpa",
        "backend": "math-fp16",
        "cases": 12,
        "unsupported": [{"case": "x", "reason": "r"}],
        "judged_elements": 100,
        "worst": {"ratio": 4.2, "case": "peaky", "index": [0, 1, 2, 3]},
        "bound": "attention-tc",
        "class_mismatches": 24,
        "class_mismatch_kinds": ["NaN where the spec has finite"],
        "special_elements": 0,
        "deterministic": True,
    }
    steps = [
        {
            "step": 0,
            "kind": "cublas",
            "ops": ["linear"],
            "agreement": "within bound",
            "kernels": {"generated": [], "extern": ["addmm"]},
        }
    ]
    contract = {
        "items": [
            {"test": "torch.audit", "id": "A", "status": "violated", "reason": "beyond <b>", "evidence": ev},
            {
                "test": "torch.audit",
                "id": "TORCH-SUM-fp32",
                "status": "skipped",
                "reason": "runs on cuda",
                "evidence": {},
            },
            {
                "test": "torch.inductor",
                "id": "I",
                "status": "passed",
                "evidence": {"steps": steps, "block": {"end_to_end_max_rel_error": 1e-5}},
            },
        ]
    }
    md = "\n".join(torch_table.markdown_lines(contract))
    assert (
        "## PyTorch op audit" in md
        and "| sdpa | math-fp16 | 12 (1 refused by the backend) | 4.2 | peaky at [0, 1, 2, 3] |" in md
    )
    assert "24 differ (NaN where the spec has finite)" in md and "&lt;b>" in md and "skipped: runs on cuda" in md
    assert "## Inductor against the IR" in md and "| 0 | cublas | linear | - | addmm | within bound |" in md
    html = "\n".join(torch_table.html_lines(contract))
    assert "<h2>Inductor against the IR</h2>" in html and "&lt;b&gt;" in html
    assert torch_table.markdown_lines({"items": []}) == []


def test_cli_refuses_without_torch_or_gpu_and_documents_its_options(capsys):
    from obligations.cli import main
    from obligations.torch_audit import table_rows

    if TORCH_WHY or not CUDA_OK:
        assert main(["audit-torch", "--device", "cuda"]) == 2
        err = capsys.readouterr().err
        assert "torch" in err
    assert main(["audit-torch", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--ops" in out and "--backends" in out and "--inductor" in out and "--device" in out
    audit = {"op": "sum", "backend": "fp32", "verdict": "violated", "expected": True, "bound": "sum", **_summary()}
    row = table_rows([audit])[0]
    assert row == ["sum", "fp32", "3", "0.5", "c [0]", "as spec (2 special)", "yes", "violated (expected)"]


def test_audit_without_torch_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(nt, "torch_missing", lambda: "torch is not installed (planted)")
    monkeypatch.setattr(nt, "cuda_missing", lambda: "torch is not installed (planted)")
    a = tt.audit_backend("sum", "fp32", "cuda")
    assert a["verdict"] == "skipped" and "not installed" in a["reason"]


# -- with torch: its CPU kernels ---------------------------------------------------------------------------------


@needs_torch
def test_torch_cpu_kernels_within_their_bounds_and_planted_kernels_caught():
    for op in ("sum", "softmax"):
        a = tt.audit_backend(op, "fp32", "host")
        assert a["verdict"] == "passed", a["reason"]
        assert a["deterministic"] and a["special_elements"] > 0 and a["judged_elements"] > 0
        scaled = tt.audit_backend(op, "fp32", "host", perturb=tt._PLANTS["scaled"])
        assert scaled["verdict"] == "violated" and "beyond the derived bound" in scaled["reason"]
        nan0 = tt.audit_backend(op, "fp32", "host", perturb=tt._PLANTS["nan_to_zero"])
        assert nan0["verdict"] == "violated" and "finite where the spec has NaN" in nan0["reason"]


@needs_torch
def test_cli_audits_torch_cpu_ops(capsys, tmp_path):
    import json

    from obligations.cli import main

    out = tmp_path / "audit.json"
    assert main(["audit-torch", "--device", "host", "--ops", "cumsum", "rms_norm", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "cumsum" in text and "rms_norm" in text and "passed" in text
    audits = json.loads(out.read_text())["audits"]
    assert [a["op"] for a in audits] == ["rms_norm", "cumsum"] and all(a["verdict"] == "passed" for a in audits)
    import torch

    prov = json.loads(out.read_text())["provenance"]  # the committed report says where and with what it ran
    assert prov["torch"] == torch.__version__ and prov["device"]["kind"] == "host" and prov["started"]
    assert f"torch {torch.__version__}" in text.splitlines()[0]


@needs_torch
def test_step_functions_mean_the_ir_ops():
    """The decoder's graph, translated node by node into torch ops and run eagerly, stays near the denotation."""
    from falsification.fusion_tests import DECODER_SHAPES
    from native.fusion_gqa import rewrite_gqa
    from spec.fusion_decoder import decoder_block, decoder_params
    from spec.ir import graphspec as gs
    from spec.ir.denote import denote_all

    blk = decoder_block(**DECODER_SHAPES["small"])
    low = gs.lower_dag(blk, decoder_params(blk, 0))
    rw, _ = rewrite_gqa(low.graph, low.payload, [low.output])
    g, p, out = rw.graph, rw.payload, rw.mapping[low.output]
    ids = np.array([3, 0, 10, 5], np.float32)
    den = denote_all(g, p, [ids]).value
    nodes = {n.id: n for n in g.nodes}
    reads = [n.id for n in g.nodes if n.kind in ("input", "const")]
    fn = nt.step_function(
        nodes,
        {n.id: dict(p.get(n.id) or {}) for n in g.nodes},
        [n for n in nodes if n not in reads],
        reads,
        [out],
        "host",
    )
    (y,) = nt.run_eager(fn, [den[r] for r in reads], "host")
    assert np.max(np.abs(y - den[out])) < 1e-4 * np.max(np.abs(den[out]))


@pytest.mark.slow
@needs_torch
def test_inductor_check_on_the_cpu():
    r = tt.inductor_check("host")
    assert r["step_agreement"].get("beyond bound", 0) == 0
    assert any(s["kernels"]["generated"] for s in r["steps"]) and r["block"]["kernels"]["generated"]


# -- CUDA ----------------------------------------------------------------------------------------------------


@needs_cuda
@needs_torch
@pytest.mark.cuda
def test_inductor_on_the_gpu_in_the_fusion_report():
    from obligations.check import check_contract

    res = check_contract(FUSION, device="cuda", only=["TORCH-INDUCTOR"])
    (item,) = res["items"]
    assert item["status"] == "passed", item.get("reason")
    steps = item["evidence"]["steps"]
    assert steps and {s["agreement"] for s in steps} <= {
        "bitwise",
        "within bound",
        "differs (no derived bound: the step's rule is bitwise)",
    }
    assert any(s["kernels"]["generated"] for s in steps)  # Inductor's Triton kernels, named per step
    assert "## Inductor against the IR" in "\n".join(torch_table.markdown_lines(res))  # the fusion page's section


@needs_cuda
@needs_torch
def test_device_audit_item_and_a_planted_kernel(tmp_path):
    item = check_items(CONTRACT, ["TORCH-SUM-fp32"], device="cuda")["TORCH-SUM-fp32"]
    assert item["status"] in ("passed", "violated"), item["reason"]
    path = contract_variant(
        CONTRACT, tmp_path, "params: {op: sum, backend: fp32}", "params: {op: sum, backend: fp32, plant: scaled}"
    )
    assert check_items(path, ["TORCH-SUM-fp32"], device="cuda")["TORCH-SUM-fp32"]["status"] == "violated"
