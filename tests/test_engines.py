"""Each engine on the real GEMM contract, and on planted bugs it must catch."""

from __future__ import annotations

from pathlib import Path

import pytest

from obligations.check import check_contract, run_item
from obligations.contract import load_contract

ROOT = Path(__file__).resolve().parent.parent
GEMM = ROOT / "contracts" / "gemm-cublas-v1.yaml"


def _variant(tmp_path: Path, old: str, new: str, count: int = -1) -> Path:
    text = GEMM.read_text()
    assert old in text, old
    out = tmp_path / "gemm-cublas-v1.yaml"
    out.write_text(text.replace(old, new, count))
    return out


def _statuses(path: Path, ids: list[str]) -> dict[str, dict]:
    entry = check_contract(path, only=ids)
    return {it["id"]: it for it in entry["items"]}


SHAPE_IDS = [
    "PO-GEMM-02-A-z3",
    "PO-GEMM-02-B-z3",
    "PO-GEMM-02-C-z3",
    "PO-GEMM-02-complete-z3",
    "PO-GEMM-02-overflow-z3",
    "KANI-CUBLAS-001-A",
    "KANI-CUBLAS-001-B",
    "KANI-CUBLAS-001-C",
    "KANI-CUBLAS-001-complete",
]


def test_shipped_gemm_shape_obligations_hold():
    items = _statuses(GEMM, SHAPE_IDS)
    for iid in SHAPE_IDS:
        want = "proved" if iid.endswith("z3") else "exhausted"
        assert items[iid]["status"] == want, (iid, items[iid]["reason"])
    assert items["KANI-CUBLAS-001-A"]["evidence"]["points_in_given"] > 100_000
    assert items["PO-GEMM-02-A-z3"]["evidence"]["rlimit_used"] > 0


def test_guard_missing_element_size_is_violated_by_z3_and_enumeration(tmp_path):
    path = _variant(tmp_path, "native.gemm:gemm_plan", "tests.planted.gemm_bugs:plan_missing_elem_size")
    items = _statuses(path, ["PO-GEMM-02-A-z3", "KANI-CUBLAS-001-A", "PO-GEMM-02-complete-z3"])
    for iid in ("PO-GEMM-02-A-z3", "KANI-CUBLAS-001-A"):
        it = items[iid]
        assert it["status"] == "violated", (iid, it["reason"])
        cex = it["counterexample"]
        assert cex["refutes"] and cex["given"] and not cex["prove"]
        assert cex["symbols"]["elem_size"] in (2, 4)
    # Accepting too much never rejects a correct call: (b) still holds for this bug.
    assert items["PO-GEMM-02-complete-z3"]["status"] == "proved"


def test_int32_offset_overflow_is_caught_by_z3_with_its_source_line(tmp_path):
    path = _variant(tmp_path, "native.gemm:gemm_plan", "tests.planted.gemm_bugs:plan_int32_offset")
    items = _statuses(path, ["PO-GEMM-02-A-z3", "KANI-CUBLAS-001-A"])
    z = items["PO-GEMM-02-A-z3"]
    assert z["status"] == "violated"
    failed = " ".join(z["counterexample"]["failed_conditions"])
    assert "int32 overflow" in failed and "gemm_bugs.py" in failed
    syms = z["counterexample"]["symbols"]
    row = syms["p"] if syms["trans_a"] else syms["i"]
    assert row * syms["lda"] > 2**31 - 1  # the counterexample really is a large shape
    # Dimensions up to 8 cannot reach the overflow: the bounded harness passes, which is why both exist.
    assert items["KANI-CUBLAS-001-A"]["status"] == "exhausted"


def test_leading_dimension_wrong_for_transposed_layout_is_violated(tmp_path):
    path = _variant(tmp_path, "native.gemm:gemm_plan", "tests.planted.gemm_bugs:plan_ld_ignores_transpose")
    items = _statuses(path, ["PO-GEMM-02-A-z3", "KANI-CUBLAS-001-A"])
    for it in items.values():
        assert it["status"] == "violated", it["reason"]
        assert it["counterexample"]["symbols"]["trans_a"] is True


def test_contradictory_assumptions_are_an_error_not_a_proof(tmp_path):
    path = _variant(
        tmp_path,
        'given: "accepts(a_bytes, b_bytes, c_bytes) and i < m and p < k"',
        'given: "accepts(a_bytes, b_bytes, c_bytes) and i < m and p < k and m < 1"',
        1,
    )
    it = _statuses(path, ["PO-GEMM-02-A-z3"])["PO-GEMM-02-A-z3"]
    assert it["status"] == "error" and "vacuous" in it["reason"]


def test_vacuous_enumeration_is_an_error(tmp_path):
    path = _variant(
        tmp_path,
        'given: "accepts(a_bytes, b_bytes, c_bytes)"\n    prove: "a_offset',
        'given: "accepts(a_bytes, b_bytes, c_bytes) and m > 8"\n    prove: "a_offset',
        1,
    )
    it = _statuses(path, ["KANI-CUBLAS-001-A"])["KANI-CUBLAS-001-A"]
    assert it["status"] == "error" and "vacuous" in it["reason"]


def test_solver_budget_too_small_is_unknown_not_proved(tmp_path):
    text = GEMM.read_text().replace("  - id: PO-GEMM-02-A-z3\n", "  - id: PO-GEMM-02-A-z3\n    rlimit: 50\n", 1)
    path = tmp_path / "c.yaml"
    path.write_text(text)
    it = _statuses(path, ["PO-GEMM-02-A-z3"])["PO-GEMM-02-A-z3"]
    assert it["status"] == "unknown", it["status"]
    assert "unknown" in it["reason"]


def test_pending_items_are_skipped_with_their_reason_never_passed(tmp_path):
    path = _variant(tmp_path, "  - id: PO-GEMM-04\n", '  - id: PO-GEMM-04\n    pending: "not wired in this test"\n', 1)
    entry = check_contract(path, only=["PO-GEMM-04"])
    (it,) = entry["items"]
    assert it["status"] == "skipped"
    assert it["reason"] == "no check wired yet: not wired in this test"
    assert it["claim"] == "none"


def test_assume_engine_reports_an_assumption_not_a_proof(tmp_path):
    old = "    method: falsify\n    test: gemm.handle_lifecycle\n"
    new = (
        "    method: assume\n    assumption: cuBLAS handles are thread-safe within one context (vendor documentation)\n"
    )
    path = _variant(tmp_path, old, new, 1)
    c = load_contract(path)
    out = run_item(c, c.item("PO-GEMM-03"))
    assert out.status.value == "skipped" and out.claim == "assumed"
    assert "thread-safe" in out.evidence["assumption"]


def test_sympy_engine_proves_identities_and_refutes_false_ones(tmp_path):
    text = GEMM.read_text().replace(
        """  - id: PO-GEMM-08""",
        """  - id: SYM-TRUE
    type: identity
    property: "algebra"
    method: sympy
    prove: "(m + n) * (m + n) == m*m + 2*m*n + n*n"
  - id: SYM-FALSE
    type: identity
    property: "wrong algebra"
    method: sympy
    prove: "(m + n) * (m + n) == m*m + n*n"
  - id: PO-GEMM-08""",
        1,
    )
    path = tmp_path / "c.yaml"
    path.write_text(text)
    items = _statuses(path, ["SYM-TRUE", "SYM-FALSE"])
    assert items["SYM-TRUE"]["status"] == "proved"
    assert items["SYM-FALSE"]["status"] == "violated"


@pytest.mark.parametrize("bug", ["plan_missing_elem_size", "plan_ld_ignores_transpose"])
def test_counterexamples_replay_concretely_through_the_runtime_guard(tmp_path, bug):
    """The z3 counterexample, fed to the real runtime guard with ints, shows the out-of-bounds access."""
    from tests.planted import gemm_bugs

    path = _variant(tmp_path, "native.gemm:gemm_plan", f"tests.planted.gemm_bugs:{bug}")
    cex = _statuses(path, ["PO-GEMM-02-A-z3"])["PO-GEMM-02-A-z3"]["counterexample"]["symbols"]
    plan_args = {k: cex[k] for k in ("m", "n", "k", "lda", "ldb", "ldc", "trans_a", "trans_b", "elem_size")}
    buggy = getattr(gemm_bugs, bug)(**plan_args)
    assert buggy.accepts(cex["a_bytes"], cex["b_bytes"], cex["c_bytes"])
    assert buggy.a_offset(cex["i"], cex["p"]) * cex["elem_size"] + cex["elem_size"] > cex["a_bytes"]


def test_each_z3_item_runs_in_its_own_context_and_reports_that_contexts_rlimit_use(monkeypatch):
    import z3

    import obligations.engines as engines

    contexts = []
    real = engines.fresh_z3_context

    def spy() -> None:
        real()
        contexts.append(z3.main_ctx())

    monkeypatch.setattr(engines, "fresh_z3_context", spy)
    entry = check_contract(GEMM, only=["PO-GEMM-02-A-z3", "PO-GEMM-02-B-z3"])
    assert [it["status"] for it in entry["items"]] == ["proved", "proved"]
    assert len(contexts) == 2 and contexts[0] is not contexts[1]
    # the count is the item's own context's: a later item does not inherit the earlier one's units
    used = [it["evidence"]["rlimit_used"] for it in entry["items"]]
    assert all(0 < u < it["evidence"]["rlimit"] for u, it in zip(used, entry["items"], strict=True))


def test_enumeration_in_chunks_gives_the_whole_grids_evidence(tmp_path, monkeypatch):
    # The grid is evaluated a chunk at a time (obligations.engines.ENUMERATION_CHUNK points): counts, the number of
    # failing points and the first counterexample in enumeration order must not depend on where chunks end.
    from obligations import engines

    path = _variant(tmp_path, "native.gemm:gemm_plan", "tests.planted.gemm_bugs:plan_missing_elem_size")
    monkeypatch.setattr(engines, "ENUMERATION_CHUNK", 1 << 30)  # the whole grid at once, as before chunks
    whole = _statuses(path, ["KANI-CUBLAS-001-A"])["KANI-CUBLAS-001-A"]
    monkeypatch.setattr(engines, "ENUMERATION_CHUNK", 4099)  # a prime: chunks end mid-row, everywhere
    chunked = _statuses(path, ["KANI-CUBLAS-001-A"])["KANI-CUBLAS-001-A"]
    assert chunked["status"] == whole["status"] == "violated"
    for field in ("points", "points_in_given", "failing_points"):
        assert chunked["evidence"][field] == whole["evidence"][field], field
    assert whole["evidence"]["failing_points"] > 1 and whole["evidence"]["points"] > 4099 * 100
    assert chunked["counterexample"] == whole["counterexample"]
