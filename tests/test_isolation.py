"""Run isolation (#17.2): per-item time limits and a worker process replaced after a fault; one fault costs one item."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from obligations.cli import main

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "fixtures" / "faults" / "faults-v1.yaml"
OK = ["FT-OK-1", "FT-OK-2", "FT-OK-3", "FT-OK-4"]


def _items(path: Path) -> dict[str, dict]:
    return {it["id"]: it for c in json.loads(path.read_text())["contracts"] for it in c["items"]}


def test_a_hanging_item_is_error_timeout_and_the_run_goes_on(tmp_path):
    out = tmp_path / "r.json"
    code = main(
        ["check", str(FAULTS), "--device", "host", "--item-timeout", "1", "--isolate", "none", "--json", str(out), "-q"]
    )
    assert code == 1
    items = _items(out)
    assert items["FT-HANG"]["status"] == "error" and items["FT-HANG"]["reason"].startswith("timeout")
    assert 0.9 < items["FT-HANG"]["seconds"] < 10
    assert all(items[i]["status"] == "passed" for i in OK)  # before and after the hang


def test_the_contract_sets_an_item_limit_and_the_flag_overrides_it(tmp_path):
    path = tmp_path / "faults-v1.yaml"
    path.write_text(FAULTS.read_text().replace("test: faults.hang", "test: faults.hang\n    timeout_s: 0.5"))
    out = tmp_path / "r.json"
    assert main(["check", str(path), "--device", "host", "--only", "FT-HANG", "--json", str(out), "-q"]) == 1
    assert "limit of 0.5 s" in _items(out)["FT-HANG"]["reason"]
    assert (
        main(
            [
                "check",
                str(path),
                "--device",
                "host",
                "--only",
                "FT-HANG",
                "--item-timeout",
                "1.5",
                "--json",
                str(out),
                "-q",
            ]
        )
        == 1
    )
    assert "limit of 1.5 s" in _items(out)["FT-HANG"]["reason"]


def test_worker_process_is_replaced_after_a_hang_and_a_dying_process(tmp_path, monkeypatch):
    monkeypatch.setenv("KC_FAULTS_ALLOW_EXIT", "1")  # FT-EXIT ends its process: only in a worker
    out = tmp_path / "r.json"
    code = main(
        [
            "check",
            str(FAULTS),
            "--device",
            "host",
            "--item-timeout",
            "6",  # a replaced worker's start counts in its item's limit: room for a loaded machine
            "--isolate",
            "process",
            "--json",
            str(out),
            "-q",
        ]
    )
    assert code == 1
    items = _items(out)
    assert items["FT-HANG"]["reason"].startswith("timeout") and "replaced" in items["FT-HANG"]["reason"]
    assert items["FT-EXIT"]["status"] == "error" and "exit code 7" in items["FT-EXIT"]["reason"]
    assert all(items[i]["status"] == "passed" for i in OK)
    assert json.loads(out.read_text())["provenance"]["workers_started"] == 3


def test_an_exception_inside_a_test_names_its_file_and_line(tmp_path, capsys):
    assert main(["check", str(FAULTS), "--device", "host", "--only", "FT-RAISES"]) == 1
    assert "KeyError: 'b' (raised at tests/planted/fault_tests.py:" in capsys.readouterr().out


@pytest.mark.cuda
def test_on_the_device_an_oob_write_and_a_never_returning_kernel_cost_one_item_each(tmp_path):
    from obligations.core.device import cuda_available

    if not cuda_available()[0]:
        pytest.skip("no CUDA device")
    out, log = tmp_path / "r.json", tmp_path / "log.jsonl"
    env_before = os.environ.pop("KC_FAULTS_ALLOW_EXIT", None)
    try:
        code = main(
            ["check", str(FAULTS), "--device", "cuda", "--item-timeout", "20", "--json", str(out), "--log", str(log)]
        )
    finally:
        if env_before is not None:
            os.environ["KC_FAULTS_ALLOW_EXIT"] = env_before
    assert code == 1
    items = _items(out)
    assert items["FT-CUDA-OOB"]["status"] == "error", items["FT-CUDA-OOB"]
    assert items["FT-CUDA-HANG"]["status"] == "error" and items["FT-CUDA-HANG"]["reason"].startswith("timeout")
    assert all(items[i]["status"] == "passed" for i in OK), {i: items[i]["reason"] for i in OK}
    assert len(log.read_text().splitlines()) == 1 + len(items) + 1  # header, one line per item, end


def test_host_only_items_run_ahead_in_workers_with_the_same_records_in_the_same_order(tmp_path):
    gemm = ROOT / "contracts" / "gemm-cublas-v1.yaml"
    out = {}
    for jobs in ("0", "2"):
        out[jobs] = tmp_path / f"r{jobs}.json"
        assert main(["check", str(gemm), "--device", "host", "-j", jobs, "--json", str(out[jobs]), "-q"]) == 0
    seq, ahead = (json.loads(out[j].read_text())["contracts"][0]["items"] for j in ("0", "2"))
    assert [(i["id"], i["status"], i["method"]) for i in seq] == [(i["id"], i["status"], i["method"]) for i in ahead]
    assert {i["method"] for i in ahead} >= {"z3", "enumerate", "falsify"}
    # an item run ahead keeps the seconds it ran in its worker, not the time the run waited for it
    assert all(0 < i["seconds"] < 60 for i in ahead)


def test_a_prefetched_item_past_its_limit_is_error_timeout_and_close_stops_every_worker(monkeypatch):
    from obligations.contract import load_contract
    from obligations.isolation import Prefetcher

    contract = load_contract(FAULTS)
    pre = Prefetcher(2, None, {"device": "host", "profile": "quick", "seed": 0})
    try:
        pre.submit(contract, contract.item("FT-HANG"), 1.0)
        pre.submit(contract, contract.item("FT-OK-1"), 30.0)
        pre.drain()  # returns once both have finished; their records are still there to take
        assert len(pre._futures) == 2 and all(f.done() for f in pre._futures.values())
        fields, seconds = pre.take(contract, contract.item("FT-HANG"))
        assert fields["status"] == "error" and fields["reason"].startswith("timeout") and 0.9 < seconds < 20
        assert pre.take(contract, contract.item("FT-OK-1"))[0]["status"] == "passed"
        assert pre.take(contract, contract.item("FT-OK-2")) is None  # never submitted: the run does it itself
    finally:
        pre.close()
    assert all(w.proc is None for w in pre._workers)


def test_a_measure_item_waits_for_the_prefetch_workers_to_be_idle(monkeypatch):
    from obligations.check import RunOptions, check_paths
    from obligations.isolation import Prefetcher

    order = []
    real_quiet, real_take = Prefetcher.quiet, Prefetcher.take
    monkeypatch.setattr(Prefetcher, "quiet", lambda self: (order.append("quiet"), real_quiet(self))[1])
    monkeypatch.setattr(Prefetcher, "take", lambda self, c, i: (order.append(i["id"]), real_take(self, c, i))[1])
    gemm = ROOT / "contracts" / "gemm-cublas-v1.yaml"
    result = check_paths([gemm], only=["PO-GEMM-02-A-z3", "PO-GEMM-04"], options=RunOptions(jobs=1))
    assert [it["id"] for it in result["contracts"][0]["items"]] == ["PO-GEMM-02-A-z3", "PO-GEMM-04"]
    assert order == ["PO-GEMM-02-A-z3", "quiet"]


def test_quiet_waits_for_the_running_items_only_and_holds_back_the_queued_ones():
    """Inside quiet(): nothing runs (the in-flight item finished first); queued items start after the block."""
    import threading
    import time

    from obligations.isolation import Prefetcher

    log, lock = [], threading.Lock()

    def fields(contract, item):  # not used: the pool's workers are replaced by the stand-in below
        raise AssertionError

    pre = Prefetcher(1, fields, {"device": "host", "profile": "quick", "seed": 0})

    class Stand:
        def run(self, contract, item, limit):
            with lock:
                log.append(("start", item["id"]))
            time.sleep(0.2)
            with lock:
                log.append(("end", item["id"]))
            return {"status": "passed"}

        def close(self):
            pass

    pre._workers = [Stand()]
    pre._free.get()
    pre._free.put(pre._workers[0])

    class C:
        path, sha256 = "c.yaml", "0"

    try:
        for k in range(3):
            pre.submit(C, {"id": f"i{k}"}, None)
        time.sleep(0.05)  # i0 is running
        with pre.quiet():
            with lock:
                inside = list(log)
            time.sleep(0.3)
            with lock:
                assert log == inside  # nothing started or ended while quiet
        assert inside == [("start", "i0"), ("end", "i0")]
        for k in range(3):
            assert pre.take(C, {"id": f"i{k}"})[0]["status"] == "passed"
    finally:
        pre.close()


def test_a_regimes_items_witnesses_reach_the_items_that_name_it_without_a_second_solve(monkeypatch):
    """A regimes item's record (proved, with witnesses) seeds the falsify items' witnesses: one solve, same evidence."""
    from obligations import engines
    from obligations.check import check_contract as check

    contract = ROOT / "contracts" / "reductions-v1.yaml"
    ids = ["RED-TREE-regimes", "RED-TREE-bitwise"]
    solves = []
    regimes = engines.get_engine("regimes")
    real = type(regimes).discharge

    def counting(self, job):
        solves.append(job.item["id"])
        return real(self, job)

    monkeypatch.setattr(type(regimes), "discharge", counting)
    engines._WITNESSES.clear()
    seeded = {it["id"]: it for it in check(contract, only=ids, device="host")["items"]}
    assert solves == ["RED-TREE-regimes"]
    engines._WITNESSES.clear()
    solves.clear()
    alone = check(contract, only=["RED-TREE-bitwise"], device="host")["items"][0]
    assert solves == ["RED-TREE-regimes"]  # without the regimes item's record the falsify item solves it itself
    a, b = seeded["RED-TREE-bitwise"]["evidence"], alone["evidence"]
    assert a["regimes_reached"] == b["regimes_reached"] and a["cases"] == b["cases"]
    engines._WITNESSES.clear()
