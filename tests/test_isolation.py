"""Run isolation (#17.2): per-item time limits and a worker process replaced after a fault; one fault costs one item."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from obligations.cli import main
from obligations.contract import load_contract
from tests.contract_helpers import interruptible, marked_processes, surviving_processes

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
            "6",
            "--isolate",
            "process",
            "-j",
            "0",  # one worker process: started once, replaced twice
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


def test_items_run_ahead_in_workers_with_the_same_records_in_the_same_order(tmp_path):
    gemm = ROOT / "contracts" / "gemm-cublas-v1.yaml"
    out = {}
    for jobs in ("0", "2"):
        out[jobs] = tmp_path / f"r{jobs}.json"
        assert main(["check", str(gemm), "--device", "host", "-j", jobs, "--json", str(out[jobs]), "-q"]) == 0
    seq, ahead = (json.loads(out[j].read_text())["contracts"][0]["items"] for j in ("0", "2"))
    assert [(i["id"], i["status"], i["method"]) for i in seq] == [(i["id"], i["status"], i["method"]) for i in ahead]
    assert {i["method"] for i in ahead} >= {"z3", "enumerate", "falsify"}
    falsify = [i["id"] for i in seq if i["method"] == "falsify"]
    assert [_cases(seq, i) for i in falsify] == [_cases(ahead, i) for i in falsify]
    # an item run ahead keeps the seconds it ran in its worker, not the time the run waited for it
    assert all(0 <= i["seconds"] < 60 for i in ahead) and any(i["seconds"] > 0 for i in ahead)


def _cases(items: list[dict], item_id: str):
    return next((i["evidence"] or {}).get("cases") for i in items if i["id"] == item_id)


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


def _submits_and_runs(monkeypatch):
    """(events in order: ("submit", id) to the workers, ("ended", id) there, ("run", id) by the run itself) of a
    gemm run with -j 1."""
    from obligations.check import RunOptions, check_paths
    from obligations.isolation import InProcess, Prefetcher, item_key

    order = []
    real_submit, real_run, real_worker_run, real_take = (
        Prefetcher.submit,
        InProcess.run,
        Prefetcher._run,
        Prefetcher.take,
    )

    def submit(self, contract, item, *a, **k):
        order.append(("submit", item["id"]))
        real_submit(self, contract, item, *a, **k)

    def worker_run(self, contract, item, *a, **k):
        got = real_worker_run(self, contract, item, *a, **k)
        order.append(("ended", item["id"]))
        return got

    def take(self, contract, item):
        # the run reaches an item only once its worker has begun it: on a loaded host the run, which takes an item
        # no worker has started, ran the first one itself before the worker process was up
        future = self._futures.get(item_key(contract, item["id"]))
        deadline = time.monotonic() + 120
        while future is not None and not (future.running() or future.done()) and time.monotonic() < deadline:
            time.sleep(0.01)
        return real_take(self, contract, item)

    monkeypatch.setattr(Prefetcher, "submit", submit)
    monkeypatch.setattr(Prefetcher, "_run", worker_run)
    monkeypatch.setattr(Prefetcher, "take", take)
    monkeypatch.setattr(
        InProcess, "run", lambda self, c, i, *a: (order.append(("run", i["id"])), real_run(self, c, i, *a))[1]
    )
    gemm = ROOT / "contracts" / "gemm-cublas-v1.yaml"
    ids = ["PO-GEMM-02-A-z3", "PO-GEMM-04", "FALSIFY-CUBLAS-001"]
    result = check_paths([gemm], only=ids, options=RunOptions(jobs=1))
    assert [it["id"] for it in result["contracts"][0]["items"]] == ids  # the output keeps the contract's order
    return order, result


def test_measure_items_run_last_with_nothing_beside_them(monkeypatch):
    # a proof run beside them moved a host-bound timing (the thin GEMM's wrapper ratio 1.014-1.016 beside cold
    # proofs, 1.001 with them cached, H100 2026-11-27): the measure items are timed once every worker item ended,
    # by the run's own executor (which the run lends to no other item meanwhile)
    order, result = _submits_and_runs(monkeypatch)
    assert order[:2] == [("submit", "PO-GEMM-02-A-z3"), ("submit", "FALSIFY-CUBLAS-001")]
    assert sorted(order[2:4]) == [("ended", "FALSIFY-CUBLAS-001"), ("ended", "PO-GEMM-02-A-z3")]
    assert order[4:] == [("run", "PO-GEMM-04")]
    assert result["contracts"][0]["items"][1]["status"] == "skipped"  # a measure item on the host


def test_the_workers_get_the_items_the_last_run_timed_longest_first(monkeypatch, tmp_path):
    """LPT: each group (the host-only items, then the rest) goes out longest first by the previous run's
    seconds, untimed items first in the contract's order; the run stores its items' seconds for the next one."""
    from obligations import runorder
    from obligations.check import RunOptions, check_paths
    from obligations.isolation import Prefetcher

    monkeypatch.setenv("KC_PROOF_CACHE_DIR", str(tmp_path))
    path = runorder.durations_path()
    assert path == tmp_path / "durations.json" and runorder.last_seconds("host", "quick") == {}
    name = lambda i: runorder.item_name("gemm-cublas-v1", i)  # noqa: E731
    last = {"PO-GEMM-02-A-z3": 1.0, "PO-GEMM-02-B-z3": 5.0, "PO-GEMM-03": 2.0, "PO-GEMM-06": 9.0}
    runorder.record_seconds("host", "quick", [{"id": "gemm-cublas-v1", "items": []}])
    runorder.record_seconds(
        "host",
        "quick",
        [{"id": "gemm-cublas-v1", "items": [{"id": i, "seconds": s, "status": "passed"} for i, s in last.items()]}],
    )
    assert runorder.last_seconds("host", "quick") == {name(i): s for i, s in last.items()}
    # per device and profile; what this machine has not timed comes from the shipped table (a reference GPU run)
    shipped = runorder.shipped_seconds("cuda", "full")
    assert runorder.last_seconds("cuda", "full") == shipped and shipped[name("PO-GEMM-04")] > 0
    runorder.record_seconds("cuda", "full", [{"id": "gemm-cublas-v1", "items": [{"id": "PO-GEMM-04", "seconds": 42}]}])
    assert runorder.last_seconds("cuda", "full") == {**shipped, name("PO-GEMM-04"): 42.0}  # this machine's time wins
    order: list[str] = []
    real_submit = Prefetcher.submit
    monkeypatch.setattr(
        Prefetcher, "submit", lambda self, c, it, *a, **k: (order.append(it["id"]), real_submit(self, c, it, *a, **k))
    )
    ids = ["PO-GEMM-02-A-z3", "PO-GEMM-02-B-z3", "PO-GEMM-02-C-z3", "PO-GEMM-03", "PO-GEMM-04", "PO-GEMM-06"]
    result = check_paths([ROOT / "contracts" / "gemm-cublas-v1.yaml"], only=ids, options=RunOptions(jobs=1))
    assert [it["id"] for it in result["contracts"][0]["items"]] == ids  # the output keeps the contract's order
    assert order == ["PO-GEMM-02-C-z3", "PO-GEMM-02-B-z3", "PO-GEMM-02-A-z3", "PO-GEMM-06", "PO-GEMM-03"]
    stored = runorder.last_seconds("host", "quick")
    ran = {it["id"]: it for it in result["contracts"][0]["items"]}
    assert stored[name("PO-GEMM-02-C-z3")] == round(ran["PO-GEMM-02-C-z3"]["seconds"], 3)
    assert name("PO-GEMM-04") not in stored  # skipped on the host (a measure item): no time of its own
    assert runorder.longest_first(["a", "b", "c"], str, {"a": 1.0, "c": 2.0}) == ["b", "c", "a"]
    path.write_text("not json")
    assert runorder.last_seconds("host", "quick") == {}  # an unreadable file is a run in the contracts' order


def test_a_cluster_gets_every_item_longest_first_a_regimes_item_with_its_longest_dependent():
    """No host-only group first on a cluster (its runner holds a waiting item back without a thread): a long
    GPU item goes out before shorter proofs, and a regimes item counts the item that waits for its witnesses."""
    from obligations.check import _cluster_order, _work_order
    from obligations.runorder import item_name

    contract = load_contract(ROOT / "contracts" / "reductions-v1.yaml")
    wanted = [(contract, it) for it in contract.items]
    name = lambda i: item_name("reductions-v1", i)  # noqa: E731
    last = {name(it["id"]): 0.5 for it in contract.items}
    last |= {name("RED-FOLD-sum"): 20.0, name("RED-TREE-grid-z3"): 5.0, name("RED-TREE-regimes"): 1.0}
    last |= {name("RED-TREE-bitwise"): 9.0}  # waits for RED-TREE-regimes' witnesses
    quiet, others = _cluster_order(wanted, last)
    ids = [it["id"] for _, it in others]
    assert ids[:4] == ["RED-FOLD-sum", "RED-TREE-regimes", "RED-TREE-bitwise", "RED-TREE-grid-z3"]
    assert sorted(ids + [it["id"] for _, it in quiet]) == sorted(it["id"] for it in contract.items)
    assert {it["id"] for _, it in quiet} == {it["id"] for it in contract.items if it.get("method") == "measure"}
    one_gpu = [it["id"] for _, it in _work_order(wanted, last)[1]]
    assert one_gpu[0] == "RED-TREE-grid-z3"  # on one GPU the host-only items still go first
    # a sanitizer plan the run runs itself: its items only wait for verdicts, after every other item
    for order in (_work_order, _cluster_order):
        assert [it["id"] for _, it in order(wanted, last, frozenset({"sanitize"}))[1]][-1] == "RED-SANITIZE"


def test_a_prestarted_worker_imports_its_preload_and_an_absent_module_does_not_stop_it():
    from obligations.check import item_fields
    from obligations.isolation import PRELOAD_ENV, WorkerPool

    contract = load_contract(FAULTS)
    w = WorkerPool(item_fields, {"device": "host", "profile": "quick", "seed": 0})
    try:
        w.prestart(preload=("colorsys", "no_such_module_for_kc"))
        env = Path(f"/proc/{w.proc.pid}/environ").read_bytes().split(b"\0")
        assert f"{PRELOAD_ENV}=colorsys,no_such_module_for_kc".encode() in env
        assert w.run(contract, contract.item("FT-OK-1"), 60)["status"] == "passed" and w.started == 1
    finally:
        w.close()


def test_the_timeline_says_where_and_when_each_item_ran(tmp_path):
    tl = tmp_path / "t.json"
    gemm = ROOT / "contracts" / "gemm-cublas-v1.yaml"
    assert main(["check", str(gemm), "--device", "host", "-j", "2", "--timeline", str(tl), "-q"]) == 0
    events = json.loads(tl.read_text())["traceEvents"]
    lanes = {e["args"]["name"] for e in events if e["ph"] == "M"}
    ran = [e for e in events if e["ph"] == "X" and e["cat"] != "kc"]  # the items (kc's own phases: test_startup)
    assert lanes <= {"run", "worker 1", "worker 2"} and "worker 1" in lanes
    n_items = len(load_contract(gemm).items)
    assert len({e["name"] for e in ran}) == len(ran) == n_items  # each of gemm's items ran once, somewhere
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in ran)


class _Stand:
    """A worker stand-in: logs what it runs (and the witnesses it is given), each item taking ``delay`` seconds."""

    def __init__(self, delay: float):
        import threading

        self.delay, self.log, self.lock = delay, [], threading.Lock()

    def run(self, contract, item, limit, witnesses=None):
        import time

        with self.lock:
            self.log.append(("start", item["id"], witnesses))
        time.sleep(self.delay)
        return {"status": "passed", "evidence": {"kind": "test"}}

    def seconds(self, wall):
        return wall

    def close(self):
        pass


def _prefetcher_with(stand):
    from obligations.isolation import Prefetcher

    pre = Prefetcher(1, None, {"device": "host", "profile": "quick", "seed": 0})
    pre._workers = [stand]
    pre._free.get()
    pre._free.put(stand)
    return pre


class _C:
    path, sha256 = "c.yaml", "0"


def test_an_item_no_worker_has_started_is_the_runs_own_and_a_started_one_is_waited_for():
    import time

    stand = _Stand(0.3)
    pre = _prefetcher_with(stand)
    try:
        for k in range(3):
            pre.submit(_C, {"id": f"i{k}"}, None)
        time.sleep(0.05)  # i0 is running in the one worker; i1 and i2 are queued
        assert pre.take(_C, {"id": "i1"}) is None  # withdrawn: the run does it itself, never waits on a queue
        assert pre.take(_C, {"id": "i0"})[0]["status"] == "passed"  # running: waited for
        assert pre.take(_C, {"id": "i2"})[0]["status"] == "passed"
        assert [e[1] for e in stand.log] == ["i0", "i2"]
    finally:
        pre.close()


def test_the_runs_executor_takes_queued_items_while_the_run_waits_for_the_measure_phase():
    """Once the run waits on a record it makes itself later (the first measure item), its own executor works the
    queue beside the workers, one item at a time under ``own``; the measure phase takes ``own`` after them."""
    import threading
    import time

    worker, own = _Stand(0.2), _Stand(0.2)
    pre = _prefetcher_with(worker)
    pre.lend(own)
    try:
        pre.defer(_C, {"id": "m"})
        for k in range(6):
            pre.submit(_C, {"id": f"i{k}"}, None)
        time.sleep(0.1)
        assert own.log == []  # lent only once the run waits: until then it runs the items it reaches itself
        got: list = []
        waiting = threading.Thread(target=lambda: got.append(pre.take(_C, {"id": "m"})))
        waiting.start()
        assert pre.wait_idle()  # the queue drained on two lanes
        ran = [e[1] for e in worker.log] + [e[1] for e in own.log]
        assert sorted(ran) == [f"i{k}" for k in range(6)] and own.log and len(worker.log) < 6
        with pre.own:  # free: the measure phase gets the run's executor to itself
            pre.done(("c.yaml", "0", "m"), {"status": "passed"}, 0.1)
        waiting.join(5)
        assert got == [({"status": "passed"}, 0.1)]
        assert all(pre.take(_C, {"id": f"i{k}"})[0]["status"] == "passed" for k in range(6))
    finally:
        pre.close()


def test_a_stop_while_the_runs_executor_is_lent_signals_it_and_records_no_outcome_for_its_item():
    """A stop (close) while the lent executor runs a queued item: it is signalled like the workers, the item has
    the stop's record (no outcome), the run waiting on the measure item gets the stop's record too."""
    import threading
    import time

    class Signalled(_Stand):
        def __init__(self, delay):
            super().__init__(delay)
            self.stopped = threading.Event()

        def signal_stop(self):
            self.stopped.set()

    worker, own = _Stand(0.05), Signalled(1.0)
    pre = _prefetcher_with(worker)
    pre.lend(own)
    pre.defer(_C, {"id": "m"})
    for k in range(4):
        pre.submit(_C, {"id": f"i{k}"}, None)
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(pre.take(_C, {"id": "m"})))
    waiting.start()
    deadline = time.monotonic() + 10
    while not own.log and time.monotonic() < deadline:  # the lent executor has taken an item
        time.sleep(0.01)
    taken = own.log[0][1]
    t0 = time.monotonic()
    pre.close()
    waiting.join(5)
    assert own.stopped.is_set() and time.monotonic() - t0 < 5
    assert got and got[0][0]["status"] == "error" and "stopped" in got[0][0]["reason"]
    time.sleep(1.2)  # the stand-in ends its sleep: cut by the stop, its item keeps no outcome
    assert not any(k[2] == taken for k in pre.finished)


def test_an_item_that_takes_witnesses_waits_for_its_regimes_items_record_and_gets_them():
    import time

    from obligations.isolation import item_key

    stand = _Stand(0.0)
    pre = _prefetcher_with(stand)
    try:
        pre.submit(_C, {"id": "uses", "witnesses": "R"}, None, after=item_key(_C, "R"))
        time.sleep(0.2)
        assert stand.log == []  # still waiting for R's record (the run is checking R itself)
        pre.publish(item_key(_C, "R"), {"status": "proved", "evidence": {"witnesses": {"small": {"x": 1}}}})
        assert pre.take(_C, {"id": "uses"})[0]["status"] == "passed"
        assert stand.log == [("start", "uses", {"R": {"small": {"x": 1}}})]
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


def test_items_run_ahead_get_the_witnesses_of_a_regimes_item_checked_earlier_in_the_run():
    from obligations.check import RunOptions, check_paths

    contract = ROOT / "contracts" / "reductions-v1.yaml"
    ids = ["RED-TREE-regimes", "RED-TREE-bitwise"]
    runs = [check_paths([contract], only=ids, options=RunOptions(jobs=j))["contracts"][0]["items"] for j in (0, 2)]
    seq, ahead = ({i["id"]: i for i in items} for items in runs)
    assert seq["RED-TREE-regimes"]["status"] == ahead["RED-TREE-regimes"]["status"] == "proved"
    a, b = seq["RED-TREE-bitwise"]["evidence"], ahead["RED-TREE-bitwise"]["evidence"]
    assert a["regimes_reached"] == b["regimes_reached"] and a["cases"] == b["cases"]


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads a process's environment from /proc")
def test_workers_share_the_cpus_in_their_thread_pools_and_a_users_setting_wins(monkeypatch):
    from obligations.check import item_fields
    from obligations.contract import load_contract
    from obligations.isolation import THREAD_POOL_VARS, WorkerPool

    contract = load_contract(FAULTS)
    monkeypatch.setenv("MKL_NUM_THREADS", "7")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    w = WorkerPool(item_fields, {"device": "host", "profile": "quick", "seed": 0})
    w.threads = 3
    try:
        assert w.run(contract, contract.item("FT-OK-1"), 60)["status"] == "passed"
        env = dict(kv.split("=", 1) for kv in open(f"/proc/{w.proc.pid}/environ").read().split("\0") if "=" in kv)
        assert env["OPENBLAS_NUM_THREADS"] == "3" and env["MKL_NUM_THREADS"] == "7"
        assert set(THREAD_POOL_VARS) <= set(env)
    finally:
        w.close()


def test_a_workers_start_and_contract_loading_are_not_the_items_time(tmp_path):
    out = tmp_path / "r.json"
    argv = ["check", str(FAULTS), "--device", "host", "--only", "FT-OK-*", "--item-timeout", "0.2", "-j", "2"]
    assert main([*argv, "--isolate", "process", "--json", str(out), "-q"]) == 0
    items = _items(out)
    assert all(items[i]["status"] == "passed" and items[i]["seconds"] < 0.2 for i in OK)  # workers start in ~0.3 s


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the workers through /proc")
def test_ctrl_c_stops_a_run_with_workers_writes_the_partial_result_and_leaves_no_worker(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    import uuid

    out, mark = tmp_path / "r.json", uuid.uuid4().hex
    env = {**os.environ, "KC_TEST_MARK": mark}
    argv = [
        "check",
        str(FAULTS),
        "--device",
        "host",
        "--only",
        "FT-OK-1",
        "--only",
        "FT-HANG",
        "--only",
        "FT-OK-2",
        "-j",
        "2",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "obligations.cli", *argv, "--item-timeout", "120", "--json", str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=interruptible,
    )
    time.sleep(1.0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(_marked(mark)) < 3:  # the run and its two workers are up
        time.sleep(0.2)
    time.sleep(1.0)  # FT-HANG is hanging in a worker
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    result = json.loads(out.read_text())
    assert result["interrupted"] is True and result["exit_code"] == 130
    time.sleep(0.5)
    assert surviving_processes(mark) == []  # no worker outlives the run


_marked = marked_processes


def test_a_run_of_one_item_starts_no_worker(tmp_path):
    out = tmp_path / "r.json"
    gemm = ROOT / "contracts" / "gemm-cublas-v1.yaml"
    assert (
        main(["check", str(gemm), "--device", "host", "--only", "PO-GEMM-02-A-z3", "-j", "4", "--json", str(out)]) == 0
    )
    assert "workers_started" not in json.loads(out.read_text())["provenance"]  # nothing to overlap: run in place


def test_the_runs_own_worker_starts_while_the_contracts_load_and_goes_with_a_run_that_ends_early(tmp_path, monkeypatch):
    """kc check spawns its own worker (--isolate process) before loading the contracts; the run uses that one worker,
    and a run that ends before its first item (here: an unknown --only id) leaves no worker behind."""
    from obligations.isolation import WorkerPool

    out, gemm, mark = tmp_path / "r.json", ROOT / "contracts" / "gemm-cublas-v1.yaml", f"early-{os.getpid()}"
    monkeypatch.setenv("KC_TEST_MARK", mark)
    spawned: list[str] = []
    real = WorkerPool.prestart
    monkeypatch.setattr(WorkerPool, "prestart", lambda self: (spawned.append("early"), real(self))[1])
    args = ["check", str(gemm), "--device", "host", "--isolate", "process", "-j", "0", "--json", str(out)]
    assert main([*args, "--only", "PO-GEMM-02-A-z3"]) == 0
    result = json.loads(out.read_text())
    assert spawned == ["early"] and result["provenance"]["workers_started"] == 1  # the early worker ran the item
    assert result["contracts"][0]["items"][0]["status"] == "proved"
    assert main([*args, "--only", "NO-SUCH-ITEM"]) == 2
    assert spawned == ["early", "early"] and surviving_processes(mark) == []  # closed although no run took it


def test_an_item_the_proof_cache_served_keeps_the_seconds_it_took_to_compute(monkeypatch, tmp_path):
    # a hit's 0.01 s would hand a 17-s enumeration out last in the next run whose cache misses
    from obligations import runorder

    monkeypatch.setenv("KC_PROOF_CACHE_DIR", str(tmp_path))
    name = runorder.item_name("c-v1", "E")
    computed = {"id": "E", "seconds": 17.0, "status": "exhausted", "evidence": {"cache": "miss"}}
    served = {"id": "E", "seconds": 0.01, "status": "exhausted", "evidence": {"cache": "hit"}}
    runorder.record_seconds("cuda", "full", [{"id": "c-v1", "items": [computed]}])
    runorder.record_seconds("cuda", "full", [{"id": "c-v1", "items": [served]}])
    assert runorder.last_seconds("cuda", "full")[name] == 17.0
    assert runorder.seconds_of({"contracts": [{"id": "c-v1", "items": [served]}]}) == {}
