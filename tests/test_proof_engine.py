"""The proof engine's machinery: deterministic queries and budgets, stability runs, the proof cache, stops,
small counterexamples (issue 24 parts 1-3). Small queries only: every test here runs in about a second."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from obligations import proofcache, z3solve
from obligations.contract import load_contract
from obligations.core import cancel
from obligations.engines import Job, get_engine
from tests.contract_helpers import interruptible, probe_contract, statement_item

ROOT = Path(__file__).resolve().parent.parent

HEADER = """\
id: proofs-v1
version: 1.0.0
family: gemm
summary: proof engine probes
kernels:
  k: {entry: "native.gemm:check_buffers"}
equations: {e: {formula: "x"}}
symbols:
  a: {type: int32, min: -3, max: 3}
  n: {type: int32, min: 1, max: 1000000}
  p: {type: int64, min: 1, max: 1000000}
  q: {type: int64, min: 1, max: 1000000}
  r: {type: int64, min: 1, max: 1000000}
falsification: []
qa_gate: {id: GATE, requires: []}
"""


def _contract(tmp_path: Path, items: str = "obligations: []\n"):
    return probe_contract(tmp_path, "proofs-v1", HEADER, items)


_item = statement_item


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv(proofcache.CACHE_DIR_ENV, str(d))
    monkeypatch.delenv(proofcache.CACHE_ENV, raising=False)
    monkeypatch.delenv(proofcache.STABILITY_ENV, raising=False)
    return d


def _z3(contract, item, **options):
    return get_engine("z3").discharge(Job(contract, item, options=options))


# -- part 1: the same item builds the same query; the verdict depends on it and the rlimit -------------------

_QUERY = """
import hashlib, sys
from obligations import engines, z3solve
from obligations.contract import load_contract
from obligations.core import plans
from obligations.statements import evaluate_statement
import z3
c = load_contract(sys.argv[1], check=False)
item = c.item("PO-GEMM-02-A-z3")
engines.fresh_z3_context()
env = plans.symbolic_env(c.symbols, set(engines._used_symbols(c, item)))
ev = evaluate_statement(c, item, env)
claim = z3.And(engines.z3_bool(ev.prove.expr), *[engines.z3_bool(x.expr) for x in ev.required()])
text = z3solve.query_text([*engines.domain_constraints(c, env), engines.z3_bool(ev.given.expr), z3.Not(claim)])
print(hashlib.sha256(text.encode()).hexdigest())
"""


def test_the_same_item_builds_the_same_smt_lib_text_in_fresh_processes_whatever_the_hash_seed():
    digests = set()
    for hashseed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", _QUERY, str(ROOT / "contracts" / "gemm-cublas-v1.yaml")],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert len(digests) == 1


def test_a_query_spends_the_same_rlimit_every_time(tmp_path):
    contract, _ = _contract(tmp_path)
    text = z3solve.query_text(_negated(contract, "p * q <= 1000000000000 and a * a >= 0"))
    runs = {(v.result, v.rlimit_used) for v in (z3solve.solve(text, rlimit=10_000_000) for _ in range(3))}
    assert len(runs) == 1 and next(iter(runs))[0] == "unsat"


def _negated(contract, prove: str):
    from obligations import engines
    from obligations.core import plans
    from obligations.statements import evaluate_statement

    item = _item(prove)
    env = plans.symbolic_env(contract.symbols, set(engines._used_symbols(contract, item)))
    ev = evaluate_statement(contract, item, env)
    import z3

    claim = z3.And(engines.z3_bool(ev.prove.expr), *[engines.z3_bool(c.expr) for c in ev.required()])
    return [*engines.domain_constraints(contract, env), z3.Not(claim)]


def test_a_wall_clock_ceiling_is_error_timeout_not_unknown(tmp_path, cache_dir):
    contract, _ = _contract(tmp_path)
    out = _z3(contract, _item("p * p * p + q * q * q != r * r * r", rlimit=4_000_000_000), z3_wall_seconds=0.2)
    assert out.status.value == "error", (out.status, out.reason)
    assert out.reason.startswith("timeout: z3 ran past its wall-clock ceiling of 0.2 s")


def test_the_items_deadline_bounds_z3_and_is_reported_by_the_run_loop(tmp_path, cache_dir):
    contract, _ = _contract(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(cancel.DeadlinePassed), cancel.item_deadline(0.3):
        _z3(contract, _item("p * p * p + q * q * q != r * r * r", rlimit=4_000_000_000))
    assert time.monotonic() - t0 < 30  # not Z3's own 120 s ceiling (a generous bound: this machine is shared)


def test_a_stop_request_interrupts_the_solver_and_is_never_a_verdict(tmp_path, cache_dir):
    import threading

    contract, _ = _contract(tmp_path)
    timer = threading.Timer(0.5, cancel.request_stop, args=("SIGINT",))
    timer.start()
    try:
        with pytest.raises(cancel.StopRequested):
            _z3(contract, _item("p * p * p + q * q * q != r * r * r", rlimit=4_000_000_000))
    finally:
        timer.cancel()
        cancel.clear_stop()


def test_ctrl_c_during_a_z3_item_ends_the_run_with_130_and_records_no_unknown(tmp_path):
    _, path = _contract(
        tmp_path,
        "obligations:\n  - {id: HARD, type: invariant, property: p, method: z3, rlimit: 4000000000, "
        'prove: "p * p * p + q * q * q != r * r * r"}\n',
    )
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KC_PROOF_CACHE": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "obligations.cli", "check", str(path), "--device", "host", "-j", "0"]
        + ["--json", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        preexec_fn=interruptible,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # the contract's heading: its only item, the z3 query, runs next
        if "proofs-v1" in line:
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert code == 130, proc.stderr.read() if proc.stderr else code
    result = json.loads(out.read_text())
    assert result.get("interrupted") is True
    assert all(it["status"] != "unknown" for c in result["contracts"] for it in c["items"])


# -- part 2: stability as evidence ------------------------------------------------------------------------


def test_stability_runs_record_their_table(tmp_path, cache_dir, monkeypatch):
    contract, _ = _contract(tmp_path)
    monkeypatch.setenv(proofcache.STABILITY_ENV, "3")
    out = _z3(contract, _item("a * a >= 0"))
    assert out.status.value == "proved", out.reason
    table = out.evidence["stability"]
    assert table["runs"] == 3 and table["proved"] == 3
    assert table["rlimit_min"] <= table["rlimit_median"] <= table["rlimit_max"]
    assert table["seconds_max"] >= 0


def test_an_item_unproved_in_one_perturbation_is_unknown_with_the_table(tmp_path, cache_dir, monkeypatch):
    """Planted instability: the second perturbed run gives up (as a seed or an order can make Z3 do)."""
    contract, _ = _contract(tmp_path)
    monkeypatch.setenv(proofcache.STABILITY_ENV, "3")
    real = z3solve.solve_in_fresh_process

    def flaky(text, *, rlimit, seed, wall_s=z3solve.WALL_CEILING_S):
        if seed == 2:
            return z3solve.Verdict("unknown", "rlimit exhausted", rlimit, 0.1)
        return real(text, rlimit=rlimit, seed=seed, wall_s=wall_s)

    monkeypatch.setattr(z3solve, "solve_in_fresh_process", flaky)
    out = _z3(contract, _item("a * a >= 0"))
    assert out.status.value == "unknown", out.reason
    assert "proved in 2 of 3" in out.reason
    table = out.evidence["stability"]
    assert (table["runs"], table["proved"]) == (3, 2)
    assert table["not_proved"] == ["run 2: unknown (rlimit exhausted)"]


@pytest.mark.parametrize(
    ("contract", "item_id"), [("gemm-cublas-v1", "PO-GEMM-02-A-z3"), ("graph-ir-v1", "IR-SHAPE-reshape-z3")]
)
def test_the_items_that_spread_most_stay_within_3x_of_their_median_over_10_perturbed_runs(contract, item_id):
    """Issue 24's bar, pinned for the two items that once missed it (rlimit max 3.3x and 37x the median, before
    plan division reached Z3 as plain ``div``). rlimit counts depend only on the query, the seed and Z3's
    version, so this is exact; the runs are solved in this process (the same verdicts as fresh processes)."""
    from obligations import engines

    c = load_contract(ROOT / "contracts" / f"{contract}.yaml", check=False)
    item = c.item(item_id)
    rlimit = item.get("rlimit", engines.DEFAULT_RLIMIT)
    engines.fresh_z3_context()
    text = engines.z3_query(c, item).text
    first = z3solve.solve(text, rlimit=rlimit)
    table = z3solve.stability_table(z3solve.stability_runs(text, first, 10, rlimit=rlimit, solve_one=z3solve.solve))
    assert table["proved"] == 10, table
    assert table["rlimit_max"] <= 3 * table["rlimit_median"], table


def test_perturbations_keep_the_meaning_and_change_the_text(tmp_path):
    contract, _ = _contract(tmp_path)
    text = z3solve.query_text(_negated(contract, "p * q <= 1000000000000"))
    other = z3solve.perturbed(text, 3)
    assert other != text and "p!p3" in other
    assert z3solve.solve(other, rlimit=10_000_000, seed=3).result == "unsat"


# -- part 3: the proof cache ------------------------------------------------------------------------------


def test_a_proof_is_reused_from_the_cache_and_a_changed_query_or_rlimit_is_not(tmp_path, cache_dir):
    contract, _ = _contract(tmp_path)
    first = _z3(contract, _item("a * a >= 0"))
    again = _z3(contract, _item("a * a >= 0"))
    assert first.status.value == again.status.value == "proved"
    assert first.evidence["cache"] == "miss" and again.evidence["cache"] == "hit"
    assert again.evidence["cache_key"] == first.evidence["cache_key"]
    assert again.evidence["rlimit_used"] == first.evidence["rlimit_used"]
    assert again.evidence["tactic"] == first.evidence["tactic"] in {st.name for st in z3solve.STRATEGIES["prove"]}
    assert list(cache_dir.rglob("*.json"))
    assert _z3(contract, _item("a * a >= 0", rlimit=1_000_000)).evidence["cache"] == "miss"  # the rlimit
    assert _z3(contract, _item("a * a + 1 >= 1")).evidence["cache"] == "miss"  # the query


def test_no_proof_cache_solves_again(tmp_path, cache_dir, monkeypatch):
    contract, _ = _contract(tmp_path)
    _z3(contract, _item("a * a >= 0"))
    monkeypatch.setenv(proofcache.CACHE_ENV, "0")
    out = _z3(contract, _item("a * a >= 0"))
    assert out.status.value == "proved" and "cache" not in out.evidence


def test_violations_are_never_served_from_the_cache(tmp_path, cache_dir):
    contract, _ = _contract(tmp_path)
    for _ in range(2):
        out = _z3(contract, _item("n * 2 > n + 5"))
        assert out.status.value == "violated" and out.evidence["cache"] == "miss"
    assert not list(cache_dir.rglob("*.json"))


PLAN = """
def plan(n):
    return {{"twice": n * 2}}  # {tag}
"""


def test_an_enumeration_is_reused_until_its_plan_source_changes(tmp_path, cache_dir, monkeypatch):
    pkg = tmp_path / "kc_cached_plans"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "plans.py").write_text(PLAN.format(tag="one"))
    monkeypatch.syspath_prepend(str(tmp_path))
    contract, _ = _contract(tmp_path)
    contract.data["kernels"]["k"]["plan"] = "kc_cached_plans.plans:plan"
    item = _item("twice >= n", method="enumerate", bound={"n": [1, 50]})
    run = lambda: get_engine("enumerate").discharge(Job(contract, item))  # noqa: E731
    assert run().evidence["cache"] == "miss"
    hit = run()
    assert hit.status.value == "exhausted" and hit.evidence["cache"] == "hit" and hit.evidence["points"] == 50
    (pkg / "plans.py").write_text(PLAN.format(tag="two"))
    proofcache._DIGESTS.clear()  # a new run (sources are read once per process)
    assert run().evidence["cache"] == "miss"


def test_parallel_writers_leave_a_whole_entry(tmp_path):
    settings = proofcache.ProofSettings(cache=True, cache_dir=tmp_path)
    key = proofcache.cache_key("z3", {"query": "x"})
    import threading

    threads = [
        threading.Thread(target=proofcache.cache_put, args=(settings, key, {"status": "proved", "n": k}))
        for k in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entry = proofcache.cache_get(settings, key)
    assert entry is not None and entry["status"] == "proved"
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [f"{key}.json"]  # no temporary file left


# -- counterexamples: small, labelled, and the plan's conditions apart from the statement's ------------------


def test_a_z3_counterexample_is_minimised_and_labelled(tmp_path, cache_dir):
    contract, _ = _contract(tmp_path)
    out = _z3(contract, _item("n * 2 > n + 5"))
    assert out.status.value == "violated"
    cex = out.counterexample
    assert cex["symbols"]["n"] == 1 and cex["minimality"] == "minimal"
    assert cex["statement_no_overflow"] is True and cex["plan_no_overflow"] is True


def test_the_statements_overflow_is_not_reported_as_the_plans(tmp_path, cache_dir):
    contract, _ = _contract(tmp_path)
    out = _z3(contract, _item("n * 3000 >= n"))  # int32 arithmetic of the statement overflows for large n
    assert out.status.value == "violated"
    cex = out.counterexample
    assert cex["failed_conditions"] and cex["statement_no_overflow"] is False and cex["plan_no_overflow"] is True


def test_reports_and_the_console_tell_a_reused_proof_from_a_fresh_one():
    from obligations.console import _evidence_line
    from obligations.reporting.model import describe_claim

    fresh = {
        "status": "proved",
        "claim": "proved",
        "method": "z3",
        "evidence": {
            "kind": "z3",
            "solver": "z3",
            "rlimit": 10,
            "rlimit_used": 5,
            "cache": "miss",
            "cache_key": "ab" * 32,
        },
    }
    reused = {**fresh, "evidence": {**fresh["evidence"], "cache": "hit"}}
    assert "proof cache" not in describe_claim(fresh) and "proof cache" not in _evidence_line(fresh)
    assert "reused from the proof cache (key abababababababab)" in describe_claim(reused)
    assert _evidence_line(reused).endswith("(proof cache)")
    stable = {
        **fresh,
        "evidence": {
            **fresh["evidence"],
            "stability": {"runs": 10, "proved": 10, "rlimit_min": 1, "rlimit_median": 2, "rlimit_max": 3},
        },
    }
    assert "proved in 10 of 10 perturbed runs" in describe_claim(stable)


def test_a_regimes_item_is_reused_from_the_cache(cache_dir):
    contract = load_contract(ROOT / "contracts" / "norm-softmax-v1.yaml", check=False)
    item = next(it for it in contract.items if it.get("method") == "regimes")
    first = get_engine("regimes").discharge(Job(contract, item))
    again = get_engine("regimes").discharge(Job(contract, item))
    assert first.status.value == again.status.value == "proved", first.reason
    assert (first.evidence["cache"], again.evidence["cache"]) == ("miss", "hit")
    assert again.evidence["witnesses"] == first.evidence["witnesses"]


def _pure_test(results: list, pure: bool = True):
    from falsification.registry import FalsificationTest

    def run(ctx):
        from obligations.core.results import passed, violated

        results.append(ctx.seed)
        if ctx.params.get("fail"):
            return violated({"at": 1}, "planted", cases=1)
        return passed(cases=7, graphs=7, seconds=0.5)

    return FalsificationTest("probe.pure", run, pure=pure)


def _ctx(seed: int = 0, **params):
    from falsification.registry import FalsifyContext

    return FalsifyContext(
        device="host", profile="full", seed=seed, item={"id": "X", "test": "probe.pure", "params": params}
    )


def test_a_pure_tests_pass_is_reused_and_its_key_follows_the_item(cache_dir, monkeypatch):
    # ir.checker_enum and ir.planted_defects (pure: a bounded enumeration of host code) are served from the proof
    # cache like enumerations; another seed or params, a failure, a non-pure test or --no-proof-cache run again
    from obligations.engines import _pure_run

    ran: list = []
    first = _pure_run(_pure_test(ran), _ctx())
    again = _pure_run(_pure_test(ran), _ctx())
    assert ran == [0] and first.status.value == again.status.value == "passed"
    one, two = first.evidence.to_json(), again.evidence.to_json()
    assert (one.pop("cache"), two.pop("cache")) == ("miss", "hit") and one == two and one["cases"] == 7
    _pure_run(_pure_test(ran), _ctx(seed=1))
    _pure_run(_pure_test(ran), _ctx(graphs=3))
    assert ran == [0, 1, 0]
    for _ in range(2):
        assert _pure_run(_pure_test(ran), _ctx(fail=True)).status.value == "violated"
    assert ran == [0, 1, 0, 0, 0]
    monkeypatch.setenv(proofcache.CACHE_ENV, "0")
    assert "cache" not in _pure_run(_pure_test(ran), _ctx()).evidence.to_json() and ran[-1] == 0 and len(ran) == 6
    from falsification.registry import get_test, load_builtin_tests

    load_builtin_tests()
    import falsification.ir_tests  # noqa: F401

    assert get_test("ir.checker_enum").pure and get_test("ir.planted_defects").pure
    assert not get_test("ir.rewrite_preserves").pure  # Hypothesis' draws: not declared pure


def test_a_device_pure_tests_pass_is_reused_only_on_a_device_of_the_same_identity(cache_dir, monkeypatch):
    # An exhaustive sweep of compiled code (all 2^32 inputs of a CUDA math function) gives the same bits on the same
    # GPU model, drivers and compilers: its pass is reused there, and run again where any of them differs
    from dataclasses import replace

    from obligations.core import device
    from obligations.engines import _pure_run

    h100 = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "driver": 13000, "nvrtc": "13.0", "kernel_driver": "580"}
    identity = {"now": h100}
    monkeypatch.setattr(device, "device_identity", lambda kind: identity["now"])
    ran: list = []
    sweep = replace(_pure_test(ran, pure=False), device_pure=True)
    first, again = _pure_run(sweep, _ctx()), _pure_run(sweep, _ctx())
    assert ran == [0] and (first.evidence.to_json()["cache"], again.evidence.to_json()["cache"]) == ("miss", "hit")
    identity["now"] = {**h100, "name": "NVIDIA H200"}
    assert _pure_run(sweep, _ctx()).evidence.to_json()["cache"] == "miss" and ran == [0, 0]
    identity["now"] = {**h100, "kernel_driver": "581"}
    assert _pure_run(sweep, _ctx()).evidence.to_json()["cache"] == "miss" and ran == [0, 0, 0]
    for _ in range(2):  # a violation is always found again
        assert _pure_run(sweep, _ctx(fail=True)).status.value == "violated"
    assert ran == [0, 0, 0, 0, 0]
    from falsification.registry import get_test, registered_tests

    declared = sorted(name for name, t in registered_tests().items() if t.device_pure)
    assert declared == ["elementwise.sweep", "halfprec.exhaustive", "libm.audit"]
    assert not get_test("elementwise.bitwise").device_pure  # Hypothesis' draws: reused never


def test_the_device_identity_names_the_machine_the_bits_came_from():
    import numpy as np

    from obligations.core.device import device_identity

    host = device_identity("host")
    assert host["kind"] == "host" and host["numpy"] == np.__version__ and "name" in host
