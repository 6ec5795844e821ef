"""The pipelined engine (Hypothesis drawing in a thread beside the judging) gives the serial engine's records.

Items of several families are checked on the host twice, serial and pipelined: passing items must carry the
same evidence (cases, draws, regimes, maxima; timing aside), and items that find a failure (a planted
bug, the elementwise item whose "bitwise under ieee" claim must be refuted) the same status, reason and
shrunk counterexample, with the failing case judged once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from falsification import engine
from obligations.check import check_contract

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"wall_s", "cases_per_s", "elements_per_s", "seconds", "compare_seconds"}


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in TIMING}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def _both(path: Path, ids: list[str]) -> tuple[dict, dict]:
    out = []
    for on in (False, True):
        engine.set_pipelined(on)
        try:
            items = check_contract(path, only=ids, device="host")["items"]
        finally:
            engine.set_pipelined(True)
        out.append({it["id"]: it for it in items})
    return out[0], out[1]


CASES = [
    ("elementwise-float32-v1.yaml", ["FALSIFY-EW-ADD-bitwise", "FALSIFY-EW-MUL-bitwise", "FALSIFY-EW-EXP-ulp"]),
    ("elementwise-float32-v1.yaml", ["FALSIFY-EW-MIN-backward", "FALSIFY-EW-FMA-bitwise"]),
    ("reductions-v1.yaml", ["RED-FOLD-sum", "RED-TREE-bitwise", "RED-TREE-bound"]),
    ("transfer-float32-v1.yaml", ["FALSIFY-XFER-001"]),
    ("attention-v1.yaml", ["ATT-FWD-bound"]),
]


@pytest.mark.parametrize("contract,ids", CASES)
def test_pipelined_records_equal_the_serial_ones(contract, ids, monkeypatch):
    from dataclasses import replace

    from falsification.profiles import BUDGETS, Profile

    # No wall-clock stop: a budget in seconds judges as many cases as fit, which differs between two runs.
    monkeypatch.setitem(BUDGETS["batch"], Profile.QUICK, replace(BUDGETS["batch"][Profile.QUICK], budget_s=None))
    serial, piped = _both(ROOT / "contracts" / contract, ids)
    for iid in ids:
        a, b = serial[iid], piped[iid]
        assert a["status"] == b["status"], (iid, a["reason"], b["reason"])
        assert _strip(a["evidence"]) == _strip(b["evidence"]), iid
        assert _strip(a["counterexample"]) == _strip(b["counterexample"]), iid
    add = piped["FALSIFY-EW-ADD-bitwise"] if "FALSIFY-EW-ADD-bitwise" in piped else None
    if add is not None:  # the refuted ieee claim went through the failure path: same shrunk counterexample
        claims = add["evidence"]["refuted_claims"]
        assert claims and all(c["refuted"] for c in claims)


def test_a_planted_bug_is_found_and_shrunk_the_same(tmp_path):
    text = (ROOT / "contracts" / "reductions-v1.yaml").read_text()
    old = 'params: {impl: "native.reductions:tree_sum"}\n  - id: RED-TREE-mean'
    new = 'params: {impl: "tests.planted.reduction_bugs:tree_sum_interleaved"}\n  - id: RED-TREE-mean'
    assert old in text
    path = tmp_path / "reductions-v1.yaml"
    path.write_text(text.replace(old, new, 1))
    serial, piped = _both(path, ["RED-TREE-bitwise"])
    a, b = serial["RED-TREE-bitwise"], piped["RED-TREE-bitwise"]
    assert a["status"] == b["status"] == "violated"
    assert a["reason"] == b["reason"] and _strip(a["counterexample"]) == _strip(b["counterexample"])
    assert _strip(a["evidence"]) == _strip(b["evidence"])  # the failing case judged once: the same counts


def _synthetic(calls: list, bad_from: int, threads: int = 0) -> engine.Check:
    """A check of ints: the 'kernel' is wrong (+1) for values >= bad_from; every judged case is recorded."""
    import numpy as np
    from hypothesis import strategies as st

    from falsification.agreement import make_agreement

    def native(x: int) -> np.ndarray:
        calls.append(x)
        return np.array([x + (x >= bad_from)], dtype=np.uint32)

    return engine.Check(
        name="synthetic",
        inputs=lambda case: int(case),
        native=native,
        reference=lambda x: np.array([x], dtype=np.uint32),
        agreement=make_agreement("bitwise"),
        cases=st.integers(0, 10_000),
        explicit=(0, 1, 2),
        encode=lambda case: (case,),
        decode=lambda rp: rp.values[0],
        reference_threads=threads,
    )


@pytest.mark.parametrize("threads", [0, 3])
@pytest.mark.parametrize("bad_from", [10**9, 9000, 50, 1])
def test_a_drawn_failure_is_judged_once_and_shrunk_as_in_the_serial_search(bad_from, threads):
    from falsification.registry import FalsifyContext

    results = []
    for on in (False, True):
        calls: list[int] = []
        engine.set_pipelined(on)
        try:
            ctx = FalsifyContext(device="host", profile="quick", seed=11, item={"id": "t", "test": "x"})
            out = engine.run(ctx, _synthetic(calls, bad_from, threads))
        finally:
            engine.set_pipelined(True)
        results.append((out.status.value, _strip(out.counterexample), _strip(engine.evidence_dict(out)), calls))
    (s_status, s_ce, s_ev, s_calls), (p_status, p_ce, p_ev, p_calls) = results
    assert s_status == p_status == ("passed" if bad_from > 10_000 else "violated")
    assert s_ce == p_ce and s_ev == p_ev
    assert s_calls == p_calls  # the same cases judged, in the same order, each once (shrinking included)
    if bad_from <= 10_000:
        assert p_ce["element"]["outputs"]["r"]["reference"] == f"0x{bad_from:08X}"  # shrunk to the boundary
