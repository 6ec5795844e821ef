"""kc check's start-up (#24): on cuda the prefetch workers start while the contracts load (closed where the run
needs none, or ends before its first item), and the timeline shows the run's own phases beside the items."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from functools import partial
from pathlib import Path

import pytest

from obligations.cli import main
from obligations.contract import load_contract
from tests.contract_helpers import surviving_processes

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "fixtures" / "faults" / "faults-v1.yaml"
SETTINGS = {"device": "host", "profile": "quick", "seed": 0}


def _on_cuda(monkeypatch) -> list[str]:
    """Make kc check believe it runs on cuda (no GPU here: nothing the tests run touches one) and log the order of
    the prefetcher's start and the loading of the contracts."""
    import obligations.cli as cli
    import obligations.contract as contract
    from obligations.isolation import Prefetcher

    order: list[str] = []
    monkeypatch.setattr(cli, "_resolve_device", lambda requested, cluster=None: "cuda")
    monkeypatch.setattr("falsification.measure.PEER_LIBRARIES", ())
    real_start, real_load = Prefetcher.prestart, contract.load_contracts
    monkeypatch.setattr(Prefetcher, "prestart", lambda self, *a: (order.append("workers"), real_start(self, *a))[1])
    monkeypatch.setattr(contract, "load_contracts", lambda *a, **k: (order.append("load"), real_load(*a, **k))[1])
    return order


def test_on_cuda_the_workers_start_before_the_contracts_load_and_go_with_a_run_that_ends_before_its_items(
    tmp_path, monkeypatch
):
    mark = f"startup-{os.getpid()}"
    monkeypatch.setenv("KC_TEST_MARK", mark)
    order = _on_cuda(monkeypatch)
    bad = tmp_path / "bad-v1.yaml"
    bad.write_text(FAULTS.read_text().replace("family:", "famly:", 1))
    assert main(["check", str(bad), "-j", "2", "-q"]) == 2  # a diagnostic: exit 2
    assert order == ["workers", "load"]
    assert surviving_processes(mark) == []  # the run's worker and both prefetch workers are gone
    assert main(["check", str(FAULTS), "-j", "2", "--only", "NO-SUCH-*", "-q"]) == 2  # an --only that selects nothing
    assert order == ["workers", "load"] * 2 and surviving_processes(mark) == []


def test_workers_start_ahead_only_on_cuda_with_jobs_and_more_than_one_item_id(monkeypatch):
    from obligations.cli import _early_prefetcher
    from obligations.isolation import InProcess, Prefetcher

    monkeypatch.setattr(Prefetcher, "prestart", lambda self, *a: None)  # no processes: only the decision is tested

    def early(device: str, jobs: int | None = 2, only: list[str] | None = None, cluster: str | None = None):
        args = argparse.Namespace(jobs=jobs, only=only, cluster=cluster, profile=None)
        with contextlib.ExitStack() as cleanup:
            return _early_prefetcher(args, device, 0, cleanup, InProcess(None))

    assert isinstance(early("cuda"), Prefetcher) and isinstance(early("cuda", only=["RED-*"]), Prefetcher)
    assert isinstance(early("cuda", only=["A", "B"]), Prefetcher)
    assert early("host") is None and early("cuda", jobs=0) is None and early("cuda", only=["RED-EMPTY"]) is None
    assert early("cuda", cluster="local") is None


def test_a_run_given_workers_started_ahead_closes_them_where_it_has_one_item_to_run(monkeypatch):
    from obligations.check import RunOptions, check_paths, item_fields
    from obligations.isolation import Prefetcher

    mark = f"startup-one-{os.getpid()}"
    monkeypatch.setenv("KC_TEST_MARK", mark)
    ahead = Prefetcher(2, item_fields, SETTINGS)
    ahead.prestart()
    contract = load_contract(FAULTS)
    result = check_paths([contract], only=["FT-OK-1"], options=RunOptions(jobs=2, prefetcher=ahead))
    assert result["contracts"][0]["items"][0]["status"] == "passed"
    assert result["provenance"]["workers_started"] == 2  # started, and counted, though the run needed none
    assert all(w.proc is None for w in ahead._workers) and surviving_processes(mark) == []


def test_the_timeline_shows_the_runs_phases_and_each_workers_start_before_its_first_item(tmp_path):
    from obligations.check import RunOptions, check_paths, item_fields
    from obligations.isolation import InProcess, Prefetcher

    tl = tmp_path / "t.json"
    ahead = Prefetcher(2, item_fields, SETTINGS)
    t = time.perf_counter()
    ahead.prestart()
    phases = (("load contracts", t, t + 0.5),)  # as kc check on cuda: the workers start as the loading begins
    ids = ["FT-OK-1", "FT-OK-2", "FT-OK-3", "FT-OK-4"]

    class Unhurried(InProcess):
        def run(self, *args, **kwargs):
            time.sleep(0.5)  # the workers take the items the run has not reached (a loaded CI host ran all four itself)
            return super().run(*args, **kwargs)

    own = Unhurried(partial(item_fields, **SETTINGS))
    options = RunOptions(jobs=2, prefetcher=ahead, timeline=str(tl), phases=phases, executor=own)
    result = check_paths([load_contract(FAULTS)], only=ids, options=options)
    assert [it["status"] for it in result["contracts"][0]["items"]] == ["passed"] * 4
    events = json.loads(tl.read_text())["traceEvents"]
    lane = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    spans = [
        (lane[e["tid"]], e["name"], e["cat"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in events[len(lane) :]
    ]
    assert sorted(name for _, name, cat, _, _ in spans if cat != "kc") == ids  # each item once
    run = [(name, t0, t1) for where, name, cat, t0, t1 in spans if where == "run" and cat == "kc"]
    assert run[0][:2] == ("load contracts", 0.0) and abs(run[0][2] - 0.5) < 1e-3  # the earliest event is the origin
    assert [name for name, _, _ in run] == ["load contracts", "close workers"]
    starts = {where: (t0, t1) for where, name, _, t0, t1 in spans if name == "start worker"}
    items = [(where, t0) for where, name, cat, t0, _ in spans if cat != "kc" and where.startswith("worker")]
    assert items and all(where in starts and t0 >= starts[where][1] - 1e-3 for where, t0 in items)
    assert len(starts) == 2 and all(0 <= t0 < t1 for t0, t1 in starts.values())  # spawned as the loading began


def test_kc_checks_timeline_holds_its_start_up_phases(tmp_path):
    tl = tmp_path / "t.json"
    assert main(["check", str(FAULTS), "--device", "host", "-j", "0", "--only", "FT-OK-1", "--timeline", str(tl)]) == 0
    events = json.loads(tl.read_text())["traceEvents"]
    names = [e["name"] for e in events if e["ph"] == "X" and e.get("cat") == "kc"]
    assert names == ["import kc", "probe device", "start workers", "load contracts", "device info", "close workers"]


def test_device_cuda_starts_the_workers_before_the_probe_and_a_failed_probe_closes_them(monkeypatch):
    """--device cuda: the workers' imports overlap the probe too; where there is no GPU (here) it exits 2 and leaves
    no worker behind."""
    import obligations.cli as cli
    from obligations.core.device import cuda_available
    from obligations.isolation import Prefetcher

    if cuda_available()[0]:
        pytest.skip("a GPU is here: the probe succeeds")
    mark = f"startup-probe-{os.getpid()}"
    monkeypatch.setenv("KC_TEST_MARK", mark)
    monkeypatch.setattr("falsification.measure.PEER_LIBRARIES", ())
    order: list[str] = []
    real_start, real_probe = Prefetcher.prestart, cli._resolve_device
    monkeypatch.setattr(Prefetcher, "prestart", lambda self, *a: (order.append("workers"), real_start(self, *a))[1])
    monkeypatch.setattr(cli, "_resolve_device", lambda *a: (order.append("probe"), real_probe(*a))[1])
    assert main(["check", str(FAULTS), "--device", "cuda", "-j", "2", "-q"]) == 2
    assert order == ["workers", "probe"] and surviving_processes(mark) == []
    order.clear()
    assert main(["check", str(FAULTS), "--device", "auto", "-j", "2", "--only", "FT-OK-1", "-q"]) == 0
    assert order == ["probe"]  # auto on a host without a GPU: no worker started ahead


def test_closing_the_workers_signals_them_all_before_waiting_for_any(monkeypatch):
    """A worker's end waits for its CUDA context's teardown: ending 15 of them one after the other added up."""
    import subprocess

    from obligations.check import item_fields
    from obligations.isolation import Prefetcher

    pre = Prefetcher(3, item_fields, SETTINGS)
    pre.prestart()
    log: list[str] = []
    real_kill, real_wait = os.killpg, subprocess.Popen.wait
    monkeypatch.setattr(os, "killpg", lambda pid, sig: (log.append("kill"), real_kill(pid, sig))[1])
    monkeypatch.setattr(
        subprocess.Popen, "wait", lambda self, *a, **k: (log.append("wait"), real_wait(self, *a, **k))[1]
    )
    pre.close()
    # three signals, then each worker's close (its kill again, a no-op, and its wait)
    assert log[:5] == ["kill"] * 4 + ["wait"] and all(w.proc is None for w in pre._workers)
