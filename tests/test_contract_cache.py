"""The load cache (#24): kc check takes each contract's parse, and its validation where it found no problem, from
the proof cache's directory when the bytes, kc's source and the environment are the same; anything else misses."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import obligations.contract as contract_mod
from obligations import proofcache
from obligations.cli import main
from obligations.contract import load_contracts, parse_contract
from tests.contract_helpers import count_loads

ROOT = Path(__file__).resolve().parent.parent
GEMM = ROOT / "contracts" / "gemm-cublas-v1.yaml"
FAULTS = ROOT / "tests" / "fixtures" / "faults" / "faults-v1.yaml"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty cache directory for this test; calls of _parse and _diagnose are counted."""
    where = tmp_path / "cache"
    monkeypatch.setenv(proofcache.CACHE_DIR_ENV, str(where))
    monkeypatch.setenv(proofcache.CACHE_ENV, "1")  # restored after the test (--no-proof-cache sets it to 0)
    monkeypatch.delenv(proofcache.LOAD_CACHE_ENV, raising=False)
    return where, count_loads(monkeypatch)


def _entries(where: Path) -> list[Path]:
    return sorted(where.rglob("*.json")) if where.exists() else []


def _every_path(data, path=()):
    yield path
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _every_path(v, (*path, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _every_path(v, (*path, i))


def test_a_hit_returns_an_equal_contract_with_every_position(tmp_path, cache):
    where, counts = cache
    path = tmp_path / "gemm-cublas-v1.yaml"
    path.write_bytes(GEMM.read_bytes())
    fresh = parse_contract(path, cache=True)
    again = parse_contract(path, cache=True)
    assert counts["parse"] == 1 and len(_entries(where)) == 1  # the second came from the cache
    assert again == fresh and list(again.data) == list(fresh.data) and again.items == fresh.items
    assert list(again.symbols) == list(fresh.symbols)  # the mappings' order too (enumeration follows it)
    for p in _every_path(fresh.data):
        assert again.position(p) == fresh.position(p) and again.position(p, value=True) == fresh.position(p, True)
    assert again.position(("obligations", 10_000)) == fresh.position(("obligations", 10_000))
    item = ("obligations", 5, "prove")
    assert again.expression_position(item, 3, fresh.data["obligations"][5]["prove"]) == fresh.expression_position(
        item, 3, fresh.data["obligations"][5]["prove"]
    )
    assert parse_contract(path) == fresh and counts["parse"] == 2  # without cache=True: parsed, as ever


def test_load_contracts_reuses_a_clean_validation_and_an_edit_or_new_source_misses(tmp_path, cache, monkeypatch):
    where, counts = cache
    path = tmp_path / "faults-v1.yaml"
    path.write_bytes(FAULTS.read_bytes())
    first = load_contracts([path], cache=True)
    assert first.diagnostics == () and counts == {"parse": 1, "diagnose": 1}
    second = load_contracts([path], cache=True)
    assert second.diagnostics == () and counts == {"parse": 1, "diagnose": 1}  # both from the cache
    assert second.contracts == first.contracts
    path.write_bytes(FAULTS.read_bytes().replace(b"version: 0.1.0", b"version: 0.1.1"))  # an edit
    assert load_contracts([path], cache=True).contracts[0].data["version"] == "0.1.1"
    assert counts == {"parse": 2, "diagnose": 2}
    real = proofcache.sources_digest
    monkeypatch.setattr(proofcache, "sources_digest", lambda roots: "changed" + real(roots))  # kc's source changed
    assert load_contracts([path], cache=True).diagnostics == () and counts == {"parse": 3, "diagnose": 3}
    monkeypatch.setattr(contract_mod, "_environment", lambda: "another Python or packages")
    assert load_contracts([path], cache=True).diagnostics == () and counts == {"parse": 4, "diagnose": 4}


def test_a_contract_with_problems_is_diagnosed_every_time(tmp_path, cache):
    where, counts = cache
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(FAULTS.read_bytes().replace(b"test: faults.ok\n", b"test: faults.no_such_test\n", 1))
    for n in (1, 2):
        problems = load_contracts([bad], cache=True).diagnostics
        assert any("no registered falsification test named 'faults.no_such_test'" in d.message for d in problems)
        assert counts["diagnose"] == n
    assert len(_entries(where)) == 1  # its parse only: a problem is always found again
    broken = tmp_path / "broken.yaml"
    broken.write_bytes(b"id: [unclosed\n")
    for _ in (1, 2):
        assert load_contracts([broken], cache=True).diagnostics
    assert len(_entries(where)) == 1  # nothing of a file that does not parse


def test_the_validation_is_keyed_on_the_ids_a_contract_may_depend_on(tmp_path, cache):
    deps = tmp_path / "deps"
    deps.mkdir()
    (deps / "base.yaml").write_bytes(FAULTS.read_bytes().replace(b"id: faults-v1", b"id: base-v1"))
    user = tmp_path / "user.yaml"
    user.write_bytes(FAULTS.read_bytes().replace(b"equations: {}", b"depends_on: [base-v1]\nequations: {}"))
    assert load_contracts([user], search_path=[deps], cache=True).diagnostics == ()
    problems = load_contracts([user], cache=True).diagnostics  # base-v1 is not there now
    assert any("no contract with id 'base-v1'" in d.message for d in problems)


def test_its_own_switch_turns_it_off_and_the_proof_caches_does_not(tmp_path, cache, monkeypatch):
    where, counts = cache
    monkeypatch.setenv(proofcache.LOAD_CACHE_ENV, "0")
    path = tmp_path / "faults-v1.yaml"
    path.write_bytes(FAULTS.read_bytes())
    load_contracts([path], cache=True)
    load_contracts([path], cache=True)
    assert counts == {"parse": 2, "diagnose": 2} and _entries(where) == []
    # --no-proof-cache (KC_PROOF_CACHE=0): the proofs are solved again; a parse is no proof, it is kept
    monkeypatch.setenv(proofcache.LOAD_CACHE_ENV, "1")
    monkeypatch.setenv(proofcache.CACHE_ENV, "0")
    load_contracts([path], cache=True)
    load_contracts([path], cache=True)
    assert counts == {"parse": 3, "diagnose": 3} and len(_entries(where)) == 2


def test_concurrent_writers_leave_one_readable_entry(tmp_path, cache):
    where, counts = cache
    path = tmp_path / "gemm-cublas-v1.yaml"
    path.write_bytes(GEMM.read_bytes())
    start = threading.Barrier(6)
    got: list = []

    def parse() -> None:
        start.wait()
        got.append(parse_contract(path, cache=True))

    threads = [threading.Thread(target=parse) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 6 and all(c == got[0] for c in got)
    files = [p for p in where.rglob("*") if p.is_file()]
    assert len(files) == 1 and files[0].suffix == ".json"  # no temporary file left beside it
    before = counts["parse"]
    assert parse_contract(path, cache=True) == got[0] and counts["parse"] == before  # the entry reads back


def test_kc_check_loads_from_the_cache_on_its_second_run(cache, monkeypatch):
    where, counts = cache
    args = ["check", str(FAULTS), "--device", "host", "--only", "FT-OK-1", "-j", "0", "-q"]
    assert main(args) == 0 and counts == {"parse": 1, "diagnose": 1}
    assert main(args) == 0 and counts == {"parse": 1, "diagnose": 1}
    # --no-proof-cache solves the proofs again, not the parse; KC_LOAD_CACHE=0 parses and validates again
    assert main([*args, "--no-proof-cache"]) == 0 and counts == {"parse": 1, "diagnose": 1}
    monkeypatch.setenv(proofcache.LOAD_CACHE_ENV, "0")
    assert main(args) == 0 and counts == {"parse": 2, "diagnose": 2}


_UNCHECKED = """
import json, sys
from obligations.check import check_contract
from obligations.contract import load_contracts
from obligations.isolation import Executor, error_fields


class NotRun(Executor):
    def run(self, contract, item, limit, witnesses=None):
        return error_fields("not run")


loaded = load_contracts([sys.argv[1]], cache=True)
entry = check_contract(loaded.contracts[0], executor=NotRun(None))
print(json.dumps({"unchecked": entry["unchecked_entry_points"], "native.gemm": "native.gemm" in sys.modules}))
"""


def test_a_contract_from_the_cache_still_names_its_unchecked_entry_points(tmp_path, cache):
    """Validation imports the kernels' modules, which register the entry points a run reports as unchecked; a run
    whose validation came from the cache (and whose items all ran in workers) imports them itself."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run() -> dict:
        cmd = [sys.executable, "-c", _UNCHECKED, str(GEMM)]
        return json.loads(subprocess.run(cmd, env=env, capture_output=True, check=True, text=True).stdout)

    cold, warm = run(), run()
    assert cold["unchecked"] and warm == cold  # no item ran: every entry point is unchecked, in both runs
