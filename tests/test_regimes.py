"""Plan regimes: Z3 proves they cover the domain and finds the smallest witness of each; planted gaps caught."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from falsification import engine
from falsification.registry import FalsifyContext
from obligations.check import check_contract, exit_code, summarize
from obligations.core.plans import boundary_side, regime_of, split_witnesses
from tests.planted import regime_plans

ROOT = Path(__file__).resolve().parent.parent

CONTRACT = """\
id: regimes-probe-v1
version: 1.0.0
family: elementwise
summary: regimes probe
kernels:
  loop: {{entry: "tests.planted.regime_plans:loop_plan", plan: "tests.planted.regime_plans:{plan}"}}
equations: {{e: {{formula: "x"}}}}
symbols:
  n: {{type: int64, min: 0, max: 4294967296}}
  block: {{type: int32, values: [32, 256]}}
  max_grid: {{type: int32, min: 1, max: 65536}}
  size: {{type: int64, min: 0}}
obligations:
  - {{id: R, type: invariant, property: p, method: regimes, minimize: [n, max_grid, block]{bound}}}
falsification: []
qa_gate: {{id: GATE, requires: [R]}}
"""


def _check(tmp_path: Path, plan: str, bound: str = "") -> dict:
    path = tmp_path / "regimes-probe-v1.yaml"
    path.write_text(CONTRACT.format(plan=plan, bound=bound))
    return check_contract(path)["items"][0]


def test_regimes_cover_the_domain_and_each_has_its_smallest_witness(tmp_path):
    item = _check(tmp_path, "loop_plan")
    assert item["status"] == "proved", item["reason"]
    w = item["evidence"]["witnesses"]
    assert w["empty"]["n"] == 0 and w["one_trip"]["n"] == 1
    # The grid-stride loop is reached with 33 elements by shrinking the launch knobs, not with 2^24.
    assert w["grid_stride"] == {"n": 33, "block": 32, "max_grid": 1}
    for name, values in w.items():  # each witness selects its regime when the plan runs with ints
        assert name in regime_of(regime_plans.loop_plan, values)


def test_planted_coverage_gap_is_violated_at_the_uncovered_point(tmp_path):
    item = _check(tmp_path, "gap_plan")
    assert item["status"] == "violated"
    assert item["counterexample"]["symbols"]["n"] == 0


def test_planted_unreachable_regime_is_violated(tmp_path):
    item = _check(tmp_path, "unreachable_plan", ", bound: {max_grid: [65536, 65536], n: [0, 1000]}")
    assert item["status"] == "violated"
    # n <= 1000 under a 65536-block cap reaches neither the cap nor a second trip.
    assert item["counterexample"]["unreached"] == ["grid_stride", "grid_capped"]


# The regimes are stated where the guard accepts (given), so every regime witness is a valid call too; the
# rejected side of a boundary ignores the given.
GUARDED = ', given: "fits(size)", boundaries: ["fits(size)", "n <= size and n <= size + 1"]'


def test_boundaries_give_the_smallest_input_at_each_limit_and_one_past_it(tmp_path):
    item = _check(tmp_path, "guarded_plan", GUARDED)
    assert item["status"] == "proved", item["reason"]
    w = item["evidence"]["witnesses"]
    small = {"block": 32, "max_grid": 1}
    assert w["n <= size @accept"] == {"n": 0, "size": 0, **small}  # accepted exactly at the limit
    assert w["n <= size @reject"] == {"n": 1, "size": 0, **small}  # one past it, the other conjunct holding
    # an index equal to the table size is the rejected side of a strict bound
    assert w["n < 1048576 @accept"]["n"] == 1048575 and w["n < 1048576 @reject"]["n"] == 1048576
    b = item["evidence"]["boundaries"]
    assert b["n <= size"] == {"guard": "fits(size)", "accept": True, "reject": True}
    # n <= size + 1 cannot fail while n <= size holds: implied, no rejected witness needed, not a violation
    assert b["n <= size + 1"]["reject"] is False and "implied" in b["n <= size + 1"]
    assert "n <= size + 1 @reject" not in w and "n <= size + 1 @accept" not in w  # at its limit n <= size fails
    regimes, accept, reject = split_witnesses(w)
    assert set(regimes) == {"empty", "one_trip", "grid_stride"} and boundary_side("one_trip") is None
    assert all(boundary_side(n) == "reject" for n in reject) and len(accept) == 2


def test_planted_dead_limit_has_no_accepted_witness_and_is_violated(tmp_path):
    item = _check(tmp_path, "dead_limit_plan", ', boundaries: ["fits(size)"]')
    assert item["status"] == "violated"
    assert item["counterexample"]["unreached"] == ["n <= size @accept (unsat)"]


class GuardRefused(ValueError):
    """The guard of the toy entry point below."""


def _copy_check(slack: int, build_all: bool = True) -> engine.Check:
    """A toy entry point copying the first n elements of a buffer of ``size``; its guard accepts n <= size + slack."""

    def native(inputs: tuple[np.ndarray, int]) -> np.ndarray:
        buf, n = inputs
        if not (n <= buf.size + slack and n < 1 << 20):
            raise GuardRefused(f"n={n} size={buf.size}")
        return np.resize(buf, n) if n > buf.size else buf[:n].copy()  # past the end: reads what is not there

    return engine.Check(
        name="toy copy",
        inputs=lambda case: (np.arange(case[1], dtype=np.float32), case[0]),
        native=native,
        reference=lambda inputs: inputs[0][: inputs[1]].copy(),
        agreement=engine.make_agreement("bitwise"),
        from_witness=lambda w: (w["n"], w["size"]) if build_all or w["n"] < 1000 else None,
        refuses=(GuardRefused,),
    )


def test_falsify_runs_boundary_witnesses_and_catches_an_off_by_one_guard(tmp_path):
    w = _check(tmp_path, "guarded_plan", GUARDED)["evidence"]["witnesses"]
    ctx = FalsifyContext(device="host", profile="quick", seed=0, item={"id": "TOY", "test": "x"}, witnesses=w)
    out = engine.run(ctx, _copy_check(0))
    assert out.status.value == "passed", out.reason
    assert out.evidence["boundaries_unreached"] == [] and out.evidence["boundaries_reached"]["n <= size @reject"] == 1
    assert out.evidence["regimes_reached"] == {"empty": 0, "one_trip": 0, "grid_stride": 0}  # no regime_of here
    # planted: the guard accepts one past the end; the rejected witness (n = size + 1) runs and is caught
    bad = engine.run(ctx, _copy_check(1))
    assert bad.status.value == "violated" and bad.counterexample["kind"] == "guard"
    assert bad.counterexample["detail"].startswith("n <= size @reject: the entry point ran it")
    # a witness the check cannot build stays unreached, and --strict fails on it
    part = engine.run(ctx, _copy_check(0, build_all=False))
    assert part.status.value == "passed"
    assert part.evidence["boundaries_unreached"] == ["n < 1048576 @accept", "n < 1048576 @reject"]
    record = {"status": "passed", "evidence": engine.evidence_dict(part)}
    s = summarize([{"items": [record], "unchecked_entry_points": []}])
    assert s["unreached_boundaries"] == 2 and exit_code(s) == 0 and exit_code(s, strict=True) == 1


def test_the_coverage_table_lists_each_boundary_and_which_witnesses_ran():
    from obligations.reporting.views import coverage_facts

    regimes = {
        "id": "R",
        "status": "proved",
        "evidence": {
            "kind": "regimes",
            "regimes": ["empty"],
            "witnesses": {"empty": {"n": 0}, "n <= size @accept": {"n": 0, "size": 0}},
            "boundaries": {"n <= size": {"guard": "fits(size)", "accept": True, "reject": False, "implied": "why"}},
        },
    }
    ran = {"id": "F", "status": "passed", "evidence": {"boundaries_reached": {"n <= size @accept": 0}}}
    facts = {f.label: f.value for f in coverage_facts({"items": [regimes, ran]})}
    assert facts["Boundary n <= size of fits(size) (R)"] == 'accept: {"n": 0, "size": 0}; reject: why'
    assert facts["Boundary witnesses (F)"] == "n <= size @accept: NOT RUN"


def test_a_test_that_ignores_the_witnesses_it_was_given_counts_them_unreached():
    from obligations.core.results import passed
    from obligations.engines import _unreported_witnesses

    w = {"empty": {"n": 0}, "n <= size @reject": {"n": 1, "size": 0}}
    ev = engine.evidence_dict(_unreported_witnesses(passed(cases=3), w))
    assert ev["regimes_unreached"] == ["empty"] and ev["boundaries_unreached"] == ["n <= size @reject"]
    assert ev["cases"] == 3
    s = summarize([{"items": [{"status": "passed", "evidence": ev}], "unchecked_entry_points": []}])
    assert s["unreached_regimes"] == 1 and s["unreached_boundaries"] == 1 and exit_code(s, strict=True) == 1
    reported = passed(cases=3, regimes_reached={"empty": 1}, boundaries_reached={"n <= size @reject": 1})
    assert _unreported_witnesses(reported, w) is reported  # a test that reports them is left as it is


def test_a_regimes_search_out_of_its_rlimit_is_unknown_never_violated(tmp_path):
    # The budget is Z3's deterministic rlimit, not a wall-clock timer: a search it cuts short is `unknown` (the same
    # on every run and machine load), and only an unsat search - no such input exists - is a violation.
    item = _check(tmp_path, "loop_plan", ", rlimit: 2000")
    assert item["status"] == "unknown", item
    assert "rlimit" in item["reason"]
    assert item["evidence"]["rlimit"] == 2000


_QUERY_TEXTS = """
import hashlib, sys, z3
from obligations import regimes
from obligations.contract import load_contract
from obligations.engines import Job
texts = []
real = regimes._answer
def spy(solver, rlimit):
    texts.append(solver.sexpr())
    return real(solver, rlimit)
regimes._answer = spy
c = load_contract("contracts/attention-v1.yaml")
item = next(i for i in c.items if i["id"] == "ATT-REGIMES")
out = regimes.RegimesEngine().discharge(Job(c, item, options={}))
print(out.status.value, len(texts), hashlib.sha256("".join(texts).encode()).hexdigest())
"""


def test_regimes_queries_do_not_depend_on_the_hash_seed(tmp_path):
    # ATT-REGIMES was proved on an H200 and unknown (rlimit spent) on an H100 from the same tree: the widened
    # symbols of a boundary's bound were iterated as a set, whose order follows PYTHONHASHSEED, and Z3's search
    # (and rlimit use) follows the order of the declarations and assertions. Every query is now the same text.
    import os
    import subprocess
    import sys

    seen = set()
    for seed in ("1", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "KC_PROOF_CACHE_DIR": str(tmp_path / seed)}
        proc = subprocess.run(
            [sys.executable, "-c", _QUERY_TEXTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        seen.add(proc.stdout.strip())
    (line,) = seen
    assert line.startswith("proved ")


def test_regimes_rlimit_does_not_depend_on_what_the_process_solved_before(monkeypatch):
    # An H200's `pytest -m cuda -n 8` had ATT-REGIMES unknown (a boundary search past its 50M rlimit) where the
    # same tree's `kc check` proved it: the searches ran in the process's main Z3 context, and what a pytest worker
    # had built and solved before moved the search (20.16M, 20.14M, 21.46M rlimit in all after three different
    # contracts here). Each search now runs in a context of its own: the same rlimit whatever came first.
    import z3

    from obligations import proofcache, regimes, z3solve
    from obligations.contract import load_contract
    from obligations.engines import Job

    used: list[int] = []
    real = regimes._answer

    def spy(solver, rlimit):
        answer = real(solver, rlimit)
        used.append(z3solve._rlimit_used(solver.statistics()) or 0)
        return answer

    monkeypatch.setattr(regimes, "_answer", spy)
    monkeypatch.setenv(proofcache.CACHE_ENV, "0")  # solve both times
    c = load_contract(ROOT / "contracts" / "attention-v1.yaml")
    item = next(i for i in c.items if i["id"] == "ATT-REGIMES")

    def spent() -> int:
        used.clear()
        out = regimes.RegimesEngine().discharge(Job(c, item, options={}))
        assert out.status.value == "proved", out
        return sum(used)

    first = spent()
    xs = [z3.Int(f"noise{i}") for i in range(40)]  # unrelated work in the main context between the two searches
    s = z3.Solver()
    s.add(*[x * x + 3 * x > i for i, x in enumerate(xs)])
    s.check()
    assert spent() == first
