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
TIMING = {"wall_s", "cases_per_s", "elements_per_s", "seconds", "compare_seconds", "draw_cache"}


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


class _MemoryDraws:
    """An in-memory draw store (the run's is the proof cache): JSON cases by key."""

    def __init__(self) -> None:
        self.entries: dict[str, list] = {}

    def key(self, parts):
        import json

        return json.dumps(parts, sort_keys=True)

    def get(self, key):
        return self.entries.get(key)

    def put(self, key, cases):
        self.entries[key] = list(cases)


@pytest.mark.parametrize("bad_from", [10**9, 9000, 1])
def test_stored_draws_are_the_cases_hypothesis_draws(bad_from):
    # a check with a draw codec: a whole draw is stored; a later run takes the same cases from the store (not drawn
    # again) and judges them in the same order with the same verdict, shrinking included. The recording body never
    # fails, so a whole draw is the same whatever the judging found; one stopped early (a failure judged before the
    # thread recorded every example) is not stored
    from dataclasses import replace

    from falsification.registry import FalsifyContext

    store, runs, stored = _MemoryDraws(), [], []
    for _ in range(2):
        calls: list[int] = []
        check = replace(_synthetic(calls, bad_from), draw_codec=engine.DrawCodec({"s": "ints"}, int, int))
        ctx = FalsifyContext(device="host", profile="quick", seed=11, item={"id": "t", "test": "x"}, draws=store)
        out = engine.run(ctx, check)
        runs.append((out.status.value, _strip(out.counterexample), engine.evidence_dict(out), calls))
        stored.append(bool(store.entries))
    (s1, ce1, ev1, calls1), (s2, ce2, ev2, calls2) = runs
    assert s1 == s2 and ce1 == ce2 and calls1 == calls2
    if bad_from > 10_000:
        assert (ev1["draw_cache"]["status"], ev2["draw_cache"]["status"]) == ("miss", "hit")
        assert len(next(iter(store.entries.values()))) == ev2["draw_cache"]["cases"] == ev2["draws"] - 3
    else:  # the first run stored its draw only where its thread recorded all of it before the judging stopped it
        assert ev2["draw_cache"]["status"] == ("hit" if stored[0] else "miss")
    assert _strip(ev1) == _strip(ev2)


def test_batch_specs_round_trip_through_their_json():
    from hypothesis import find, settings

    from falsification.float32_inputs import BatchSpec, batch_specs

    seen: list[BatchSpec] = []

    def keep(spec: BatchSpec) -> bool:
        seen.append(spec)
        return False

    with pytest.raises(Exception):  # noqa: B017 - find raises NoSuchExample after its examples
        find(batch_specs(3, 2, 1 << 16, 6, layouts=("contiguous", "strided")), keep, settings=settings(max_examples=60))
    assert seen and all(BatchSpec.from_json(s.to_json()) == s for s in seen)
    assert any(s.explicit for s in seen) and any(s.scalars for s in seen)
