"""Scale-out on Dask (#28): a check on a 2-worker local cluster gives the in-process records; a lost worker costs
its item one retry; --resume works across executors; the run leaves no worker behind."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from obligations.cli import main
from obligations.cluster import ClusterSpec, dask_missing, parse_cluster
from obligations.contract import load_contract
from obligations.isolation import worker_request
from tests.contract_helpers import surviving_processes

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "fixtures" / "faults" / "faults-v1.yaml"
SCALE = ROOT / "tests" / "fixtures" / "faults" / "scale-v1.yaml"
TRANSFER = ROOT / "contracts" / "transfer-float32-v1.yaml"
# A regimes item and one that takes its witnesses, then quick items (one that raises) of another contract
SAME = ["XFER-REGIMES", "FALSIFY-XFER-001", "FT-OK-1", "FT-RAISES", "FT-OK-2"]
# measurements of the process, not outcomes (cache: whether the proof cache had the item)
VOLATILE = ("seconds", "rlimit_used", "wall_s", "cases_per_s", "cache")

needs_dask = pytest.mark.skipif(dask_missing() is not None, reason=f"{dask_missing()}")


def _items(path: Path) -> list[dict]:
    return [it for c in json.loads(path.read_text())["contracts"] for it in c["items"]]


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if not k.endswith(VOLATILE)}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def test_cluster_values_are_checked_where_they_are_parsed(tmp_path, capsys):
    assert parse_cluster("local") == ClusterSpec("local")
    assert parse_cluster("local:3") == ClusterSpec("local", workers=3)
    assert parse_cluster("tcp://10.0.0.5:8786") == ClusterSpec("scheduler", address="tcp://10.0.0.5:8786")
    for bad in ("local:0", "local:x", "10.0.0.5:8786", "tcp://", "cluster"):
        with pytest.raises(ValueError):
            parse_cluster(bad)
    assert main(["check", str(FAULTS), "--cluster", "local:0"]) == 2
    assert "--cluster" in capsys.readouterr().err
    (tmp_path / "pyproject.toml").write_text('[tool.kc]\ncluster = "remote"\n')
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["check", str(FAULTS)]) == 2
    finally:
        os.chdir(cwd)
    assert "cluster" in capsys.readouterr().err


@pytest.fixture(scope="module")
def _two_workers(tmp_path_factory):
    """One 2-worker local cluster (processes, 1 thread each) for the module: its scheduler's address."""
    if dask_missing():
        pytest.skip(dask_missing())
    from obligations.cluster import open_cluster

    died = tmp_path_factory.mktemp("died")
    env = {"KC_FAULTS_ALLOW_EXIT": "1", "KC_FAULTS_DIE_ONCE": str(died)}  # the workers inherit them
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    client, cluster = open_cluster(ClusterSpec("local", workers=2), "host")
    try:
        yield cluster.scheduler_address
    finally:
        client.close()
        cluster.close()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def scheduler(_two_workers):
    """The module's cluster with both its workers up: a test that killed one leaves its nanny restarting it, and a
    test that counts the workers (run_tasks sizes its requests by them) saw one of two under ``pytest -n 2``."""
    from distributed import Client

    with Client(_two_workers, timeout=30) as client:
        client.wait_for_workers(2, timeout=60)
    return _two_workers


@needs_dask
def test_a_two_worker_cluster_gives_the_in_process_records(scheduler, tmp_path):
    own, dist = tmp_path / "own.json", tmp_path / "dist.json"
    argv = ["check", str(TRANSFER), str(FAULTS), "--device", "host", "--only", *SAME, "-q"]
    assert main([*argv, "-j", "0", "--isolate", "none", "--json", str(own)]) == 1  # FT-RAISES is an error
    assert main([*argv, "--cluster", scheduler, "--json", str(dist)]) == 1
    a, b = _items(own), _items(dist)
    assert [(i["id"], i["status"]) for i in a] == [(i["id"], i["status"]) for i in b]
    assert [i["id"] for i in b] == SAME  # the contracts' order, whatever finished first
    assert _stable(a) == _stable(b)  # case counts, witnesses reached, reasons: every outcome field
    assert b[1]["evidence"]["regimes_reached"]  # the regimes item's witnesses reached the item that names them
    result = json.loads(dist.read_text())
    assert result["provenance"]["cluster"]["spec"] == scheduler and len(result["provenance"]["cluster"]["workers"]) == 2


@needs_dask
def test_measure_items_go_to_the_cluster_last_once_every_other_item_has_landed(scheduler, tmp_path, monkeypatch):
    # as on one machine: the workers' processes have started and compiled by then (sent first on 2 H100s, each
    # measure item paid a fresh process's start-up while the GPU-share items waited)
    from obligations.cluster import ClusterRunner

    gemm = ROOT / "contracts" / "gemm-cublas-v1.yaml"
    ids = ["PO-GEMM-04", "PO-GEMM-02-A-z3", "FALSIFY-CUBLAS-001", "FALSIFY-CUBLAS-010"]
    events: list[tuple[str, str]] = []
    real_dispatch, real_land = ClusterRunner._dispatch, ClusterRunner._land

    def dispatch(self, key, address):
        events.append(("sent", key[2]))
        return real_dispatch(self, key, address)

    def land(self, key, future):
        events.append(("landed", key[2]))
        return real_land(self, key, future)

    monkeypatch.setattr(ClusterRunner, "_dispatch", dispatch)
    monkeypatch.setattr(ClusterRunner, "_land", land)
    out = tmp_path / "r.json"
    assert (
        main(["check", str(gemm), "--device", "host", "--only", *ids, "--cluster", scheduler, "-q", "--json", str(out)])
        == 0
    )
    measure = {"PO-GEMM-04", "FALSIFY-CUBLAS-010"}
    first_measure = min(n for n, (what, item) in enumerate(events) if what == "sent" and item in measure)
    assert {item for what, item in events[:first_measure] if what == "landed"} == set(ids) - measure
    assert sorted(i["id"] for i in _items(out)) == sorted(ids)


@needs_dask
def test_each_item_goes_to_a_worker_with_a_free_thread_never_behind_a_long_item(scheduler, tmp_path, monkeypatch):
    # Dask's own placement (by its occupancy estimates) sent every item to one GPU's worker for 5 s of a 2 x H200
    # run while the other's threads idled beside one long item: the runner pins each item to a free thread
    from obligations.cluster import ClusterRunner

    text = SCALE.read_text().split("falsification:\n")[0] + "falsification:\n"
    for name, seconds in [("SC-LONG", 3.0)] + [(f"SC-SHORT-{n}", 0.2) for n in range(6)]:
        text += (
            f"  - id: {name}\n    rule: planted scheduling item\n    prediction: runs on a free thread\n"
            f"    if_fails: queued behind another\n    test: faults.sleep\n    params: {{seconds: {seconds}}}\n"
        )
    text += "qa_gate: {id: GATE, requires: [SC-LONG]}\n"
    contract = tmp_path / "scale-v1.yaml"
    contract.write_text(text)
    sent: list[tuple[str, str, dict]] = []
    ran_on: dict[str, str] = {}
    real_dispatch, real_land = ClusterRunner._dispatch, ClusterRunner._land

    def dispatch(self, key, address):
        sent.append((key[2], address, dict(self._busy)))
        return real_dispatch(self, key, address)

    def land(self, key, future):
        if future.status == "finished":
            ran_on[key[2]] = future.result()["worker"]
        return real_land(self, key, future)

    monkeypatch.setattr(ClusterRunner, "_dispatch", dispatch)
    monkeypatch.setattr(ClusterRunner, "_land", land)
    argv = ["check", str(contract), "--device", "host", "--cluster", scheduler, "--isolate", "none", "-q"]
    assert main([*argv, "--json", str(tmp_path / "r.json")]) == 0
    assert all(busy[address] == 1 for _, address, busy in sent)  # one thread each: each alone on its worker
    long_at = next(address for item, address, _ in sent if item == "SC-LONG")
    assert sent[0][0] == "SC-LONG"  # the longest goes first (the contract's order here)
    assert all(address != long_at for item, address, _ in sent if item.startswith("SC-SHORT"))
    assert all(address in ran_on[item] for item, address, _ in sent)  # where it was sent is where it ran


@needs_dask
def test_a_worker_lost_mid_item_costs_one_retry_and_the_run_completes(scheduler, tmp_path):
    out, log = tmp_path / "r.json", tmp_path / "log.jsonl"
    code = main(
        ["check", str(SCALE), "--device", "host", "--cluster", scheduler, "--isolate", "none", "--json", str(out)]
        + ["--log", str(log), "-q"]
    )
    assert code == 1
    items = {i["id"]: i for i in _items(out)}
    assert list(items) == ["SC-OK-1", "SC-DIES-ONCE", "SC-OK-2", "SC-EXIT", "SC-OK-3"]
    assert [items[i]["status"] for i in ("SC-OK-1", "SC-OK-2", "SC-OK-3")] == ["passed"] * 3
    once = items["SC-DIES-ONCE"]
    assert once["status"] == "passed" and len(once["evidence"]["workers_lost"]) == 1
    lost = items["SC-EXIT"]
    assert lost["status"] == "error" and lost["reason"].startswith("worker lost")
    assert len(lost["evidence"]["workers_lost"]) == 2 and all("tcp://" in w for w in lost["evidence"]["workers_lost"])
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    # each record once, logged as it landed (not held back by an earlier item still running)
    assert sorted(e["record"]["id"] for e in lines[1:-1]) == sorted(items) and lines[-1]["event"] == "end"


@needs_dask
def test_resume_takes_a_log_of_another_executor_and_runs_only_the_rest_on_the_cluster(scheduler, tmp_path):
    log, full, resumed, timeline = (tmp_path / n for n in ("log.jsonl", "full.json", "resumed.json", "t.json"))
    only = ["FT-OK-1", "FT-RAISES", "FT-OK-2", "FT-OK-3"]
    argv = ["check", str(FAULTS), "--device", "host", "--only", *only, "-q"]
    assert main([*argv, "-j", "0", "--isolate", "none", "--log", str(log), "--json", str(full)]) == 1
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:3]) + "\n")  # header + two records: as a run stopped after its second item
    argv = ["check", "--resume", str(log), "--cluster", scheduler, "--json", str(resumed), "--timeline", str(timeline)]
    assert main([*argv, "-q"]) == 1
    assert _stable(_items(resumed)) == _stable(_items(full))
    ran = [e for e in json.loads(timeline.read_text())["traceEvents"] if e["ph"] == "X" and e["cat"] != "kc"]
    assert sorted(e["name"] for e in ran) == only[2:]  # on the cluster's workers, named in the lanes
    lanes = {e["args"]["name"] for e in json.loads(timeline.read_text())["traceEvents"] if e["ph"] == "M"}
    assert lanes - {"run"} and all("tcp://" in lane for lane in lanes - {"run"})  # "run": kc's own phases
    records = [json.loads(line)["record"]["id"] for line in log.read_text().splitlines() if '"record"' in line]
    assert sorted(records) == sorted(only)  # the cluster ran the two missing items; nothing ran twice


@needs_dask
def test_a_local_cluster_run_leaves_no_worker_behind(tmp_path):
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    out = tmp_path / "r.json"
    argv = ["check", str(FAULTS), "--device", "host", "--only", "FT-OK-1", "FT-OK-2", "--json", str(out), "-q"]
    assert main([*argv, "--cluster", "local:1", "--isolate", "none"]) == 0
    assert json.loads(out.read_text())["provenance"]["cluster"]["spec"] == "local:1"
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()]
    left = [p.cmdline() for p in left if p.status() != psutil.STATUS_ZOMBIE]
    # multiprocessing's resource tracker serves this interpreter (started with the first spawned process)
    assert not [c for c in left if not any("multiprocessing.resource_tracker" in w for w in c)]


def test_a_sweep_in_parts_merges_to_the_single_runs_evidence_bit_for_bit():
    from falsification.sweep import merge_sweeps, split_range, sweep

    # relu's planted nan_as_number: every NaN input disagrees; the range starts in the finite numbers, so the
    # first part has none, and the first counterexamples of the single run come from several parts
    lo, hi = 0x7F800000 - 5, 0x7F800000 + 40
    one = sweep("relu", device="host", lo=lo, hi=hi, variant="nan_as_number")
    ranges = split_range(lo, hi, 9, align=1)
    assert len(ranges) == 9 and ranges[0][0] == lo and ranges[-1][1] == hi
    parts = [sweep("relu", device="host", lo=a, hi=b, variant="nan_as_number") for a, b in ranges]
    merged = merge_sweeps(parts)
    evidence = ("range", "elements", "exhaustive", "max_ulp", "disagreements", "histogram", "first_counterexamples")
    assert one["disagreements"] == 39 and len(one["first_counterexamples"]) == 8
    assert {k: merged[k] for k in evidence} == {k: one[k] for k in evidence}
    assert merged["parts"] == 9 and merged["op"] == one["op"] and merged["reference"] == one["reference"]
    # max ulp from the part that has it (inv's fast-math build flushes subnormal results: far beyond 3 ulp)
    lo, hi = 0x7E7F0000, 0x7E810000
    inv = [sweep("inv", device="host", lo=a, hi=b, variant="fast_math") for a, b in split_range(lo, hi, 3)]
    single = sweep("inv", device="host", lo=lo, hi=hi, variant="fast_math")
    assert single["max_ulp"] > 3 and merge_sweeps(inv)["max_ulp"] == single["max_ulp"]
    assert merge_sweeps(inv)["histogram"] == single["histogram"]
    with pytest.raises(ValueError, match="contiguous"):
        merge_sweeps([parts[0], parts[2]])
    with pytest.raises(ValueError, match="differ in variant"):
        merge_sweeps([parts[0], sweep("relu", device="host", lo=ranges[1][0], hi=ranges[1][1])])


@needs_dask
def test_kc_sweep_on_a_cluster_gives_the_single_runs_report(scheduler, tmp_path, capsys):
    one, dist = tmp_path / "one.json", tmp_path / "dist.json"
    argv = ["sweep", "sqrt", "--device", "host", "--lo", "0x3F800000", "--hi", "0x3F900000"]
    assert main([*argv, "--json", str(one)]) == 0
    assert main([*argv, "--cluster", scheduler, "--parts", "3", "--json", str(dist)]) == 0
    a, b = json.loads(one.read_text()), json.loads(dist.read_text())
    assert b["parts"] == 3 and b["cluster"] == scheduler
    assert {k: v for k, v in a.items() if "second" not in k and k != "elements_per_s"} == {
        k: v for k, v in b.items() if "second" not in k and k not in ("elements_per_s", "parts", "cluster")
    }
    assert main([*argv[:3], "--sample", "64", "--cluster", scheduler]) == 2  # a sample is not split
    assert "--sample" in capsys.readouterr().err


def test_the_libm_audit_matrix_is_split_in_the_single_runs_order():
    from obligations.libm_audit import audit_cells

    bounds = {("expf", "cuda"): ("A", 2), ("sinf", "cuda"): ("B", 2), ("expf", "cuda-ftz"): ("C", 2)}
    cells = audit_cells(["expf", "sinf"], ["cuda", "cuda-ftz"], bounds)
    assert cells == [
        ("expf", "cuda", "A", 2),
        ("sinf", "cuda", "B", 2),
        ("expf", "cuda-ftz", "C", 2),
        ("sinf", "cuda-ftz", None, None),  # no item: the audit refuses before anything runs
    ]


@needs_dask
def test_tasks_on_the_cluster_come_back_in_the_requests_order(scheduler):
    from obligations.cluster import run_tasks

    spec = parse_cluster(scheduler)
    assert run_tasks(spec, "host", "math.sqrt", lambda workers: [float(n * n) for n in range(8 * workers)]) == [
        float(n) for n in range(16)
    ]


@needs_dask
def test_tasks_take_a_cluster_the_caller_began_opening_their_share_of_a_gpu_and_their_order(scheduler, monkeypatch):
    # kc audit-libm opens its cluster while it parses, and runs four cells at once on a GPU (AUDIT_SHARE)
    from obligations import cluster as oc

    opening = oc.OpeningCluster(parse_cluster(scheduler), "host")
    assert oc.run_tasks(opening, "host", "math.sqrt", [4.0, 9.0]) == [2.0, 3.0]
    opening.close()  # taken: the run closed it, nothing is closed twice
    sent: list[dict | None] = []
    real_open = oc.open_cluster

    def recording_open(spec, device, *args, **kwargs):
        client, cluster = real_open(spec, "host", *args, **kwargs)
        real_submit = client.submit

        def submit(*a, **kw):
            sent.append((kw.get("resources"), kw.get("priority")))
            kw["resources"] = None  # the host workers declare no GPU: run them anyway
            return real_submit(*a, **kw)

        client.submit = submit
        return client, cluster

    monkeypatch.setattr(oc, "open_cluster", recording_open)
    monkeypatch.setattr(oc, "_needs_gpus", lambda *a: None)
    spec = parse_cluster(scheduler)
    assert oc.run_tasks(spec, "cuda", "math.sqrt", [1.0, 16.0], share=oc.AUDIT_SHARE, order=[1, 0]) == [1.0, 4.0]
    assert sent == [({"GPU": 0.25}, 0), ({"GPU": 0.25}, -1)]  # the second request first: its results stay in place


@needs_dask
def test_the_run_takes_requests_too_from_the_end_of_the_order_from_before_its_cluster_is_open(scheduler):
    # kc audit-libm on a local cluster: this process audits cells while the workers start, then beside them
    from obligations import cluster as oc

    opening = oc.OpeningCluster(parse_cluster(scheduler), "host")
    order = list(range(40))[::-1]  # the last request starts first: the run takes the first ones
    got = oc.run_tasks(opening, "host", "tests.cluster_tasks.pid_after", [0.05] * 40, order=order, here=True)
    here = [n for n, pid in enumerate(got) if pid == os.getpid()]
    assert 0 < len(here) < 40 and None not in got, got  # both the run and its workers ran some, every one landed
    # the cluster held two requests a worker thread, not all: the run kept taking after the cluster opened (a lane
    # beside two workers takes about a third; with every request sent at once it had only those of the opening)
    assert len(here) >= 6, len(here)
    assert here == list(range(len(here)))  # the end of the order, where the shortest are
    with pytest.raises(oc.ClusterError, match="planted: this part fails"):
        oc.run_tasks(parse_cluster(scheduler), "host", "tests.cluster_tasks.planted_failure", ["a", "fail"], here=True)


def test_the_runs_own_lane_starts_no_request_after_a_stop():
    # Ctrl-C during kc audit-libm: the run's lane ends with the cell in hand, the rest is not started
    import threading
    from collections import deque

    from obligations import cluster as oc
    from obligations.core import cancel

    pending, got = deque(range(200)), {}
    lane = oc._HereLane("tests.cluster_tasks.pid_after", [0.01] * 200, pending, threading.Lock(), got.__setitem__)
    try:
        while len(got) < 3:
            time.sleep(0.01)
        cancel.request_stop("SIGINT")
        lane.thread.join(timeout=5)
    finally:
        cancel.clear_stop()
    assert not lane.thread.is_alive() and lane.error is None
    assert 3 <= len(got) < 20 and len(got) + len(pending) == 200, (len(got), len(pending))
    assert set(got) == set(range(200 - len(got), 200))  # from the end of the order


@needs_dask
def test_a_local_cuda_cluster_has_one_worker_per_visible_gpu_holding_it(monkeypatch):
    from obligations.cluster import AUDIT_LAYOUT, AUDIT_SHARE, CHECK_LAYOUT, WorkerLayout, _worker_specs, gpu_slots

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert "preload" not in _worker_specs(ClusterSpec("local"), "cuda")["gpu0"]["options"]  # a sweep's, an audit's
    specs = _worker_specs(ClusterSpec("local"), "cuda", CHECK_LAYOUT)  # kc check's
    assert sorted(specs) == ["gpu0", "gpu1"]
    for g in ("0", "1"):
        options = specs[f"gpu{g}"]["options"]
        assert options["env"] == {"CUDA_VISIBLE_DEVICES": g} and options["resources"] == {"GPU": 1}
        assert options["nthreads"] == gpu_slots(2) and options["preload"] == ["obligations.cluster_worker"]
    assert _worker_specs(ClusterSpec("local", workers=3), "cuda")["gpu1"]["options"]["nthreads"] == 3
    assert gpu_slots(2, cpus=32) == 15 and gpu_slots(2, cpus=16) == 7 and gpu_slots(8, cpus=4) == 1
    assert len(_worker_specs(ClusterSpec("local", workers=3), "host")) == 3
    # an audit's workers: four processes per GPU, each a quarter of it, importing the audit's modules as they start
    audit = _worker_specs(ClusterSpec("local"), "cuda", WorkerLayout(preload=("native.libm",), per_gpu=4))
    assert sorted(audit) == [f"gpu{g}.{k}" for g in "01" for k in range(4)]
    for name, w in audit.items():
        options = w["options"]
        assert options["preload"] == ["native.libm"] and options["resources"] == {"GPU": 0.25}
        assert options["nthreads"] == 1 and options["env"] == {"CUDA_VISIBLE_DEVICES": name[3]}
    assert AUDIT_SHARE == 1 / AUDIT_LAYOUT.per_gpu  # a cell fits one of its processes exactly
    both = _worker_specs(ClusterSpec("local"), "cuda", WorkerLayout(spares=True, preload=("native.libm",)))
    assert both["gpu0"]["options"]["preload"] == ["obligations.cluster_worker", "native.libm"]
    host = _worker_specs(ClusterSpec("local", workers=2), "host", WorkerLayout(preload=("math",)))
    assert host["cpu1"]["options"]["preload"] == ["math"]
    for bad in (0, 3, 6):
        with pytest.raises(ValueError):
            WorkerLayout(per_gpu=bad)


def test_a_gpu_workers_threads_take_the_kc_processes_it_started_with_it(monkeypatch):
    """dask_setup (the preload of a local cluster's GPU workers) starts a kc worker process per thread; a thread's
    first item takes one started in its request's kc environment instead of starting its own, another
    environment starts its own, and stop_items ends them all."""
    import types

    from obligations import cluster_worker as cw
    from obligations.isolation import WorkerPool

    mark = f"spares-{os.getpid()}"
    monkeypatch.setenv("KC_TEST_MARK", mark)
    monkeypatch.setattr(cw, "_spares", [])
    monkeypatch.setattr(cw, "_idle", {})
    monkeypatch.setattr(cw, "_busy", [])
    worker = types.SimpleNamespace(state=types.SimpleNamespace(nthreads=2, total_resources={}))
    cw.dask_setup(worker)
    try:
        spares = [executor for _, executor in cw._spares]
        assert len(spares) == 2 and all(isinstance(e, WorkerPool) and e.proc is not None for e in spares)
        contract = load_contract(FAULTS)
        request = {
            **worker_request({"device": "host", "profile": "quick", "seed": 0}, contract, contract.item("FT-OK-1"), {}),
            "isolate": "process",
            "env": cw._kc_environment(),
        }
        assert cw.run_on_worker(request)["fields"]["status"] == "passed"
        ((taken,),) = cw._idle.values()  # given back once the item ended
        assert taken in spares and taken.started == 1 and len(cw._spares) == 1  # no process of its own
        assert cw.run_on_worker(request)["fields"]["status"] == "passed"
        assert [len(v) for v in cw._idle.values()] == [1] and taken.started == 1  # the next item took it again
        assert taken.settings == {"device": "host", "profile": "quick", "seed": 0}
        other = {**request, "env": {**request["env"], "KC_Z3_STABILITY": "3"}}
        threading.Thread(target=lambda: cw.run_on_worker(other)).start()  # another thread, another kc setting
        deadline = time.monotonic() + 60
        while len(cw._busy) + sum(map(len, cw._idle.values())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(cw._spares) == 1  # the spare's environment is not the request's: it started its own
    finally:
        cw.stop_items()
    assert cw._spares == [] and surviving_processes(mark) == []


def test_a_measure_item_takes_the_warmest_process_that_imported_the_peers(monkeypatch):
    # a fresh process pays its CUDA context, handles and kernel loads inside the item (ATT-PERF-fwd32 1.9 s against
    # 0.1 s on a 2 x H100 cluster); one without torch pays its import (FALSIFY-CUBLAS-010 2.5 s against 0.16 s)
    import types

    from falsification.measure import PEER_LIBRARIES
    from obligations import cluster_worker as cw

    def ex(imported, items):
        return types.SimpleNamespace(imported=frozenset(imported), items=items)

    assert cw._has_peers(ex(PEER_LIBRARIES, 0)) and not cw._has_peers(ex(PEER_LIBRARIES[:1], 9))
    assert not cw._has_peers(object())  # an in-process executor: the Dask worker's own imports decide
    fresh, warm_plain, warm_peers, warmer_peers = (
        ex(PEER_LIBRARIES, 0),
        ex((), 30),
        ex(PEER_LIBRARIES, 5),
        ex(PEER_LIBRARIES, 12),
    )
    pool = [fresh, warm_plain, warm_peers, warmer_peers]
    assert cw._pick(pool, measure=True) == 3
    assert cw._pick([fresh, warm_plain], measure=True) == 0  # the peers first: an import costs more than a context
    assert cw._pick([warm_plain], measure=True) == 0  # the other kind where none is
    assert cw._pick(pool, measure=False) == 0 and cw._pick([], measure=True) is None
    monkeypatch.setattr(cw, "_idle", {("k",): list(pool)})
    monkeypatch.setattr(cw, "_busy", [])
    monkeypatch.setattr(cw, "_spares", [])
    settings = {"device": "cuda", "profile": "quick", "seed": 0}
    assert cw._take(("k",), settings, "process", {}, measure=True) is warmer_peers
    assert cw._busy == [warmer_peers] and warmer_peers not in cw._idle[("k",)]
    cw._give_back(("k",), warmer_peers)
    assert cw._busy == [] and cw._idle[("k",)][-1] is warmer_peers
    assert cw._take(("k",), settings, "process", {}, measure=False) is fresh


def test_a_kc_process_reports_the_peers_it_has_imported_and_how_many_items_it_answered():
    import importlib.util
    from functools import partial

    from obligations.check import item_fields
    from obligations.isolation import WorkerPool

    settings = {"device": "host", "profile": "quick", "seed": 0}
    contract = load_contract(FAULTS)
    plain, torched = WorkerPool(partial(item_fields, **settings), settings), None
    try:
        assert plain.run(contract, contract.item("FT-OK-1"), 60)["status"] == "passed"
        assert plain.items == 1 and plain.imported == frozenset()  # a host item of the fixture imports no peer
        assert plain.run(contract, contract.item("FT-OK-2"), 60)["status"] == "passed" and plain.items == 2
        if importlib.util.find_spec("torch") is not None:
            torched = WorkerPool(partial(item_fields, **settings), settings)
            torched.prestart(preload=("torch",))
            assert torched.run(contract, contract.item("FT-OK-1"), 60)["status"] == "passed"
            assert "torch" in torched.imported and torched.items == 1
    finally:
        plain.close()
        if torched is not None:
            torched.close()


@needs_dask
def test_sigterm_cancels_the_clusters_items_logs_what_finished_and_leaves_no_process(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    import psutil

    log, out = tmp_path / "log.jsonl", tmp_path / "r.json"
    argv = ["check", str(FAULTS), "--device", "host", "--cluster", "local:2", "--item-timeout", "120"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "obligations.cli", *argv, "--log", str(log), "--json", str(out), "-q"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not log.exists() or "FT-OK-4" not in log.read_text()):
        time.sleep(0.2)  # the other worker runs every item after FT-HANG while it hangs: logged as they land
    family = psutil.Process(proc.pid).children(recursive=True)
    assert any("obligations.worker" in " ".join(p.cmdline()) for p in family)  # a kc process runs FT-HANG
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    gone, alive = psutil.wait_procs(family, timeout=10)
    assert not [p for p in alive if "resource_tracker" not in " ".join(p.cmdline())]
    result = json.loads(out.read_text())
    assert result["interrupted"] is True and result["signal"] == "SIGTERM"
    logged = [json.loads(line)["record"]["id"] for line in log.read_text().splitlines() if '"record"' in line]
    assert "FT-HANG" not in logged and "FT-OK-4" in logged  # cut: no record (--resume reruns it); ahead: logged


@needs_dask
def test_a_cuda_run_on_a_schedulers_workers_needs_no_local_gpu_but_a_worker_that_declares_one(
    scheduler, tmp_path, capsys
):
    argv = ["check", str(FAULTS), "--device", "cuda", "--only", "FT-OK-1", "--cluster", scheduler, "-q"]
    # the device is not probed here (this host may have no GPU): the cluster's workers are asked, and these
    # two CPU workers declare none, so the run refuses at once instead of waiting for one for ever
    assert main(argv) == 2
    assert "no worker declares a GPU" in capsys.readouterr().err


@needs_dask
def test_measure_items_of_one_measurement_are_measured_once_on_the_cluster(scheduler, tmp_path, monkeypatch):
    # as on one GPU (falsification.measure.Shared): the second item takes the first one's record, naming it
    import falsification.measure as fm
    from obligations.cluster import ClusterRunner

    monkeypatch.setattr(fm, "SHAREABLE_TESTS", fm.SHAREABLE_TESTS | {"faults.ok"})
    text = SCALE.read_text().split("falsification:\n")[0] + "falsification:\n"
    for n in (1, 2):  # the same measurement, said in other words
        text += (
            f"  - id: SC-MEASURE-{n}\n    rule: planted measurement {n}\n    prediction: measured once\n"
            "    if_fails: measured twice\n    method: measure\n    test: faults.ok\n    tolerance: 1.0\n"
        )
    text += "qa_gate: {id: GATE, requires: [SC-MEASURE-1]}\n"
    contract = tmp_path / "scale-v1.yaml"
    contract.write_text(text)
    sent: list[str] = []
    real_dispatch = ClusterRunner._dispatch

    def dispatch(self, key, address):
        sent.append(key[2])
        return real_dispatch(self, key, address)

    monkeypatch.setattr(ClusterRunner, "_dispatch", dispatch)
    out = tmp_path / "r.json"
    argv = ["check", str(contract), "--device", "host", "--cluster", scheduler, "-q", "--json", str(out)]
    assert main(argv) == 0
    items = {i["id"]: i for i in _items(out)}
    assert sent == ["SC-MEASURE-1"]
    assert items["SC-MEASURE-2"]["status"] == items["SC-MEASURE-1"]["status"] == "passed"
    assert items["SC-MEASURE-2"]["evidence"] == {
        **items["SC-MEASURE-1"]["evidence"],
        "shared_with": "scale-v1:SC-MEASURE-1",
    }


@needs_dask
def test_the_cluster_opens_while_the_contracts_load_once_and_is_closed_when_the_run_ends_first(tmp_path, monkeypatch):
    import obligations.cluster as oc

    opened: list[object] = []
    real_open, real_close = oc.open_cluster, oc.OpeningCluster.close

    def counted_open(spec, device, timeout=30.0, layout=None):
        opened.append(spec)
        assert layout == oc.CHECK_LAYOUT  # a check's cluster: its GPU workers start the kc worker processes
        return real_open(spec, device, timeout, layout)

    closed: list[bool] = []

    def close(self):
        closed.append(self._taken)
        return real_close(self)

    monkeypatch.setattr(oc, "open_cluster", counted_open)
    monkeypatch.setattr(oc.OpeningCluster, "close", close)
    out = tmp_path / "r.json"
    timeline = tmp_path / "t.json"
    argv = ["check", str(TRANSFER), "--device", "host", "--cluster", "local:1", "-q", "--json", str(out)]
    assert main([*argv, "--timeline", str(timeline)]) == 0
    phases = [e["name"] for e in json.loads(timeline.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert "open cluster" in phases and "load contracts" in phases
    assert len(opened) == 1 and closed == [True]  # the run took the one opened early: it closed it itself
    assert main(["check", str(TRANSFER), "--device", "host", "--cluster", "local:1", "--only", "NO-SUCH-ID"]) == 2
    assert len(opened) == 2 and closed[1:] == [False]  # opened ahead, not taken: closed by the run's cleanup


def test_an_items_wait_for_its_kc_process_to_start_is_not_the_items_time():
    # the timeline showed a cluster's first items starting seconds late: their spans held their processes' starts
    import types

    from obligations.cluster_worker import _ready_since

    assert _ready_since(types.SimpleNamespace(starts=[(1.0, 5.0)]), 2.0) == 5.0  # became ready during the item
    assert _ready_since(types.SimpleNamespace(starts=[(1.0, 1.5)]), 2.0) is None  # ready before it began
    assert _ready_since(types.SimpleNamespace(starts=[(1.0, None)]), 2.0) is None  # never heard from
    assert _ready_since(types.SimpleNamespace(), 2.0) is None  # an in-process executor


def test_a_dask_worker_that_hands_items_to_kc_processes_does_not_import_their_test_modules(monkeypatch):
    # its threads share one GIL: importing every contract's test modules there held a cluster's first items
    import obligations.contract as oc
    from obligations import isolation

    imported: list[str] = []
    monkeypatch.setattr(oc, "import_test_modules", lambda c: imported.append(c.data["id"]) or [])
    monkeypatch.setattr(isolation, "_TESTS_IMPORTED", set())
    cache: dict = {}
    request = {"path": str(FAULTS)}
    isolation.worker_contract(cache, request, tests=False)
    assert imported == [] and len(cache) == 1
    isolation.worker_contract(cache, request)  # an in-process executor's item: now they are
    isolation.worker_contract(cache, request)
    assert imported == ["faults-v1"]


def test_the_fork_server_imports_dask_ours_and_the_layouts_modules_but_no_cuda_library(monkeypatch):
    """A local cluster's workers fork from a server that imported their modules once; CUDA's libraries stay out (a
    worker sets its CUDA_VISIBLE_DEVICES after the fork, before any of them may read it)."""
    import multiprocessing
    from multiprocessing import context, forkserver

    from obligations import cluster

    got: list[list[str]] = []
    monkeypatch.setattr(context.BaseContext, "set_forkserver_preload", lambda self, mods: got.append(list(mods)))
    monkeypatch.setattr(forkserver, "ensure_running", lambda: got.append(["running"]))
    assert multiprocessing.get_context("forkserver") is not None
    cluster._start_forkserver(cluster.AUDIT_LAYOUT.preload + ("torch.cuda",))
    assert got == [[*cluster.FORKSERVER_PRELOAD, "falsification.libm_tests", "native.libm"], ["running"]]
