"""Sanitizer evidence: skipped off the device; on the device a planted out-of-bounds write is caught; a run's items
share one process per tool (tests/fake_sanitizer.py stands for compute-sanitizer on the host) and each gets the
verdict of its own workload."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from obligations import sanitize_batch
from obligations.check import _plan_lanes
from obligations.contract import load_contract
from obligations.engines import Job, get_engine
from obligations.sanitize_batch import TOOLS
from tests.contract_helpers import needs_cuda

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = load_contract(ROOT / "contracts" / "reductions-v1.yaml", check=False)


def _item(workload: str, tools: list[str], modules: list[str] | None = None) -> dict:
    return {
        "id": "SAN",
        "kind": "obligation",
        "method": "sanitize",
        "params": {"workload": workload, "tools": tools, "modules": modules or []},
    }


def test_sanitize_off_the_device_is_skipped_not_passed():
    out = get_engine("sanitize").discharge(Job(CONTRACT, _item("elementwise", ["memcheck"]), device="host"))
    assert out.status.value == "skipped" and "cuda" in out.reason


def test_sanitize_without_the_tool_is_skipped(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    out = get_engine("sanitize").discharge(Job(CONTRACT, _item("elementwise", ["memcheck"]), device="cuda"))
    assert out.status.value == "skipped" and "compute-sanitizer" in out.reason


@pytest.mark.cuda
@needs_cuda
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not on PATH")
def test_planted_out_of_bounds_write_is_caught_and_a_clean_workload_passes():
    bad = get_engine("sanitize").discharge(
        Job(CONTRACT, _item("planted-oob", ["memcheck"], ["tests.planted.sanitizer_bugs"]), device="cuda")
    )
    assert bad.status.value == "violated", (bad.reason, bad.counterexample)
    assert bad.counterexample["memcheck"]["errors"] > 0
    good = get_engine("sanitize").discharge(
        Job(CONTRACT, _item("reductions", ["memcheck", "racecheck"]), device="cuda")
    )
    assert good.status.value == "passed", (good.reason, good.counterexample)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not on PATH")
def test_on_the_device_a_shared_process_attributes_the_planted_write_to_its_own_workload(monkeypatch, tmp_path):
    """The planted writes between clean workloads in one memcheck process: each planted item is violated by the
    reports printed between its own markers (none re-run alone), and its neighbours pass, also after the kilobytes
    of reports of planted-oob-many (a report the tool printed late would land in rng's lines)."""
    monkeypatch.setenv(sanitize_batch.RUN_ENV, str(tmp_path))
    monkeypatch.setenv("KC_PROOF_CACHE_DIR", str(tmp_path / "cache"))
    names = ("transfer", "planted-oob-many", "rng", "planted-oob", "reductions")
    items = [_item(w, ["memcheck"], ["tests.planted.sanitizer_bugs"]) for w in names]
    assert sanitize_batch.share(items, ["-"] * len(items))["processes"] == [
        {"name": "memcheck", "tool": "memcheck", "workloads": list(names)}
    ]
    out = {it["params"]["workload"]: get_engine("sanitize").discharge(Job(CONTRACT, it, device="cuda")) for it in items}
    for name in ("planted-oob-many", "planted-oob"):
        got = out[name]
        assert got.status.value == "violated", (name, got.reason, got.counterexample)
        assert "alone" not in got.evidence.verdicts["memcheck"], ("reports came outside the markers", got.evidence)
    for name in ("transfer", "rng", "reductions"):
        assert out[name].status.value == "passed", (name, out[name].reason, out[name].counterexample)
    assert [o.evidence.shared["launched"] for o in out.values()] == [True, False, False, False, False]


# -- one process per tool for a run's workloads, on the host: tests/fake_sanitizer.py stands for the tool ---------


@pytest.fixture
def fake_sanitizer(monkeypatch, tmp_path):
    """``compute-sanitizer`` on PATH is tests/fake_sanitizer.py; returns the file each of its runs is logged to."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "compute-sanitizer"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT / "tests" / "fake_sanitizer.py"}" "$@"\n')
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    log = tmp_path / "runs.log"
    monkeypatch.setenv("KC_FAKE_SANITIZER_LOG", str(log))
    monkeypatch.setenv(sanitize_batch.RUN_ENV, str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    monkeypatch.setenv("KC_PROOF_CACHE_DIR", str(tmp_path / "cache"))  # where the workloads' seconds are kept
    return log


_FAKES = ("fake-clean", "fake-oob", "fake-raise", "fake-clean-2", "fake-crash", "fake-hang")


def test_one_process_per_tool_runs_every_workload_and_each_item_gets_its_own_verdict(fake_sanitizer):
    """Six items share one memcheck and one racecheck process (started by whichever item comes first; the others,
    running at the same time, wait and read): the planted write is its own item's violation, under memcheck only;
    a workload that raises is its item's error and the next one still runs; a crash errors its workload and
    every later one (never passed); the workloads before it keep their verdicts."""
    items = [_item(w, ["memcheck", "racecheck"], ["tests.planted.sanitizer_bugs"]) for w in _FAKES]
    plan = sanitize_batch.share(items, ["-"] * len(items))
    assert [p["name"] for p in plan["processes"]] == ["memcheck", "racecheck"]
    with ThreadPoolExecutor(len(items)) as pool:
        outs = list(pool.map(lambda it: get_engine("sanitize").discharge(Job(CONTRACT, it, device="cuda")), items))
    out = dict(zip(_FAKES, outs, strict=True))
    runs = fake_sanitizer.read_text().splitlines()
    assert sorted(runs) == sorted(f"{tool} {' '.join(_FAKES)}" for tool in ("memcheck", "racecheck")), runs
    assert sum(o.evidence.shared["launched"] for o in outs) == 1
    assert all(o.evidence.shared["workloads"] == 6 for o in outs)
    assert out["fake-clean"].status.value == out["fake-clean-2"].status.value == "passed"
    oob = out["fake-oob"]
    assert oob.status.value == "violated" and set(oob.counterexample) == {"memcheck"}, oob.counterexample
    assert oob.counterexample["memcheck"]["errors"] == 1
    assert "Invalid __global__ write" in oob.counterexample["memcheck"]["output"][0]
    assert out["fake-raise"].status.value == "error" and "planted: the launch was refused" in out["fake-raise"].reason
    crash, after = out["fake-crash"], out["fake-hang"]
    assert crash.status.value == "error" and "ended (exit 139) in this workload" in crash.reason, crash.reason
    assert after.status.value == "error" and "not run" in after.reason and "fake-crash" in after.reason


def test_the_run_starts_its_plan_over_its_gpus_and_the_items_only_read_the_verdicts(fake_sanitizer, monkeypatch):
    """kc check starts the plan itself (start_plan) before any item: its processes go to the run's GPUs, no item
    runs it (none ``launched``), each item gets its own workload's verdict, and a second start finds it started."""
    devices = fake_sanitizer.with_name("devices.log")
    monkeypatch.setenv("KC_FAKE_SANITIZER_DEVICES", str(devices))
    monkeypatch.setenv(sanitize_batch.SHARDS_ENV, "2")
    names = ("fake-clean", "fake-oob", "fake-clean-2")
    items = [_item(w, ["memcheck", "racecheck"], ["tests.planted.sanitizer_bugs"]) for w in names]
    plan = sanitize_batch.share(items, ["-"] * len(items))
    where, exe = Path(os.environ[sanitize_batch.RUN_ENV]), shutil.which("compute-sanitizer")
    running = sanitize_batch.start_plan(where, plan, exe, ["3", "5"])
    assert running is not None and sanitize_batch.start_plan(where, plan, exe, ["3", "5"]) is None
    outs = [get_engine("sanitize").discharge(Job(CONTRACT, it, device="cuda")) for it in items]
    running.stop()
    assert [o.status.value for o in outs] == ["passed", "violated", "passed"], [o.reason for o in outs]
    assert not any(o.evidence.shared["launched"] for o in outs)
    assert running.ended is not None and running.ended >= running.began
    given = sorted(line.split() for line in devices.read_text().splitlines())
    assert len(given) == 4 and {d for _, d in given} == {"3", "5"}, given  # memcheck#0/#1, racecheck#0/#1
    placed = sanitize_batch.read_plan(where)["processes"]
    assert sorted((p["tool"], p["device"]) for p in placed) == sorted((t, d) for t, d in given)
    # The run's timeline: each tool process on a lane of its own, named with its GPU, inside the plan's span.
    lanes = _plan_lanes(running)
    assert sorted(lane for _, lane, _, _ in lanes) == sorted(f"sanitize {p['name']}" for p in placed)
    assert {what.rpartition(" on GPU ")[2] for (_, _, what), _, _, _ in lanes} == {"3", "5"}
    assert all(running.began <= t0 <= t1 <= running.ended for _, _, t0, t1 in lanes)


def test_a_stop_ends_the_runs_plan_and_its_processes(fake_sanitizer, monkeypatch):
    """The run's stop (Ctrl-C, SIGTERM) ends a plan it started: its thread and every tool process it had running."""
    items = [_item(w, ["synccheck"], ["tests.planted.sanitizer_bugs"]) for w in ("fake-hang", "fake-clean")]
    plan = sanitize_batch.share(items, ["-", "-"])
    running = sanitize_batch.start_plan(
        Path(os.environ[sanitize_batch.RUN_ENV]), plan, shutil.which("compute-sanitizer")
    )
    deadline = time.monotonic() + 30
    while not running.live and time.monotonic() < deadline:  # the tool process is up (and hangs in fake-hang)
        time.sleep(0.05)
    procs = list(running.live)
    assert procs, "the plan started no process"
    running.stop()
    assert running.ended is not None and all(p.poll() is not None for p in procs)


def test_assigning_devices_puts_the_longest_process_first_on_the_least_loaded_gpu():
    plan = {
        "processes": [
            {"name": n, "tool": t, "workloads": w}
            for n, t, w in (
                ("racecheck", "racecheck", ["attention", "conv"]),
                ("memcheck", "memcheck", ["attention"]),
                ("initcheck", "initcheck", ["conv"]),
            )
        ]
    }
    seconds = {
        "racecheck": {"attention": 20.0, "conv": 7.0},
        "memcheck": {"attention": 6.0},
        "initcheck": {"conv": 5.0},
    }
    got = {p["name"]: p["device"] for p in sanitize_batch.assign_devices(plan, ["0", "1"], seconds)["processes"]}
    assert got == {"racecheck": "0", "memcheck": "1", "initcheck": "1"}  # 3 + 27 s against 3 + 6, then 3 + 5
    assert sanitize_batch.assign_devices(plan, [], seconds) == plan  # no GPUs named: as the plan was


def test_the_run_leaves_a_schedulers_plan_to_its_first_item(fake_sanitizer):
    from obligations.check import RunOptions, _start_sanitize_plan

    items = [_item(w, ["memcheck"], ["tests.planted.sanitizer_bugs"]) for w in ("fake-clean", "fake-oob")]
    plan = sanitize_batch.share(items, ["-", "-"])
    assert _start_sanitize_plan(plan, RunOptions(cluster="tcp://scheduler:8786")) is None  # its GPUs are elsewhere
    running = _start_sanitize_plan(plan, RunOptions(cluster="local:2"))
    assert running is not None
    running.stop()


def test_an_item_alone_runs_its_workload_alone(fake_sanitizer, monkeypatch):
    """Without a plan that names it (a single --only item, or KC_SANITIZE_SHARE=0), an item's workload runs in
    processes of its own."""
    monkeypatch.setenv(sanitize_batch.SHARE_ENV, "0")
    items = [_item(w, ["memcheck"], ["tests.planted.sanitizer_bugs"]) for w in ("fake-oob", "fake-clean")]
    assert sanitize_batch.share(items, ["-", "-"]) is None
    out = get_engine("sanitize").discharge(
        Job(CONTRACT, _item("fake-oob", ["memcheck", "initcheck"], ["tests.planted.sanitizer_bugs"]), device="cuda")
    )
    assert out.status.value == "violated" and out.evidence.shared is None
    assert sorted(fake_sanitizer.read_text().splitlines()) == ["initcheck fake-oob", "memcheck fake-oob"]


def test_a_process_past_its_limit_is_stopped_and_its_unfinished_workloads_have_no_verdict(tmp_path, fake_sanitizer):
    plan = sanitize_batch.make_plan(
        {w: {"tools": ["synccheck"], "modules": ["tests.planted.sanitizer_bugs"]} for w in ("fake-hang", "fake-clean")},
        timeout_s=1.0,
    )
    sanitize_batch.run_plan(tmp_path, plan, shutil.which("compute-sanitizer"))
    got = json.loads((tmp_path / plan["id"] / "synccheck.json").read_text())
    assert got["exit"] == "timeout"
    assert got["workloads"]["fake-hang"]["exit"] == "timeout" and got["workloads"]["fake-hang"]["errors"] is None
    assert got["workloads"]["fake-clean"]["exit"] == "not run"


_OUT = """\
========= COMPUTE-SANITIZER
@@kc-workload T begin a
@@kc-workload T end a 0.5 ok 3
@@kc-workload T begin b
========= Invalid __global__ write of size 4 bytes
=========     at k+0x70
=========     Address 0x7f is out of bounds
=========
========= Program hit cudaErrorLaunchFailure (error 719) on CUDA API call to cuCtxSynchronize.
@@kc-workload T end b 0.7 ok 1
@@kc-workload T begin c
========= Warning: Race reported between Write access at k+0x30
=========     and Read access at k+0x50 [2 hazards]
@@kc-workload T end c 0.1 ok 1
{after}========= {summary}
"""


@pytest.mark.parametrize(
    "after, summary, clean",
    [
        ("", "ERROR SUMMARY: 2 errors", "passed"),
        ("", "RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warnings)", "passed"),
        ("========= Invalid __shared__ read of size 4 bytes\n", "ERROR SUMMARY: 3 errors", "outside"),
        ("", "ERROR SUMMARY: 5 errors", "counts"),  # past --print-limit: counted, not printed, so not placed
        ("", "", "summary"),
    ],
)
def test_reports_are_attributed_by_the_markers_around_them_and_what_cannot_be_placed_has_no_verdict(
    after, summary, clean
):
    """Each error report between a workload's markers is its own (a warning is not an error); a report outside every
    workload's markers, a summary that counts more errors than were placed, or no summary leave the workloads
    without errors of their own unattributed (they run again alone), never passed."""
    lines = _OUT.format(after=after, summary=summary).splitlines(keepends=True)
    got = sanitize_batch.attribute(lines, "T", ["a", "b", "c"], sanitize_batch.ERROR_EXIT)
    assert got["b"]["errors"] == 2 and got["b"]["exit"] == sanitize_batch.ERROR_EXIT
    for name in ("a", "c"):
        if clean == "passed":
            assert (got[name]["errors"], got[name]["exit"]) == (0, 0), got[name]
        else:
            assert (got[name]["errors"], got[name]["exit"]) == (None, "unattributed"), got[name]
            assert {"outside": "outside any workload", "counts": "counts 5", "summary": "no error summary"}[clean] in (
                got[name]["reason"]
            )
    assert got["a"]["seconds"] == 0.5 and "Warning: Race" in got["c"]["tail"][0]
    # in a process of one workload every report is that workload's, wherever it was printed
    alone = ["@@kc-workload T begin a\n", "@@kc-workload T end a 0.1 ok 1\n", "========= Invalid write\n"]
    got = sanitize_batch.attribute([*alone, "========= ERROR SUMMARY: 1 error\n"], "T", ["a"], 86)
    assert (got["a"]["errors"], got["a"]["exit"]) == (1, 86)
    # a note of the tool's own that reads like a report, where the tool counts no error, is none
    got = sanitize_batch.attribute(
        [*alone[:2], "========= Some note\n", "========= ERROR SUMMARY: 0 errors\n"], "T", ["a"], 0
    )
    assert (got["a"]["errors"], got["a"]["exit"]) == (0, 0)


def test_the_run_queues_the_first_item_of_a_shared_job_in_its_place_and_the_others_last_unless_it_runs_it():
    from obligations.runorder import shared_last

    items = ["z3-a", "san-1", "fal-b", "san-2", "fal-c", "san-3"]
    assert shared_last(items, lambda it: "san" if it.startswith("san") else None) == [
        "z3-a",
        "san-1",
        "fal-b",
        "fal-c",
        "san-2",
        "san-3",
    ]
    # the run started the job itself (start_plan): every item of it only waits, so all of them go last
    group = lambda it: "san" if it.startswith("san") else None  # noqa: E731
    assert shared_last(items, group, started={"san"}) == ["z3-a", "fal-b", "fal-c", "san-1", "san-2", "san-3"]


def test_every_gpu_family_has_a_sanitize_item_on_a_registered_workload():
    """Every contract whose family launches kernels (builds, cuBLAS, half-precision sweeps, the IR executor) names
    a sanitize item, and its workload is registered: the device run has sanitizer evidence for every family."""
    from native import workloads
    from native.builds import families, load_native_modules

    load_native_modules()
    gpu = set(families()) | {"gemm", "halfprec", "ir"}
    seen = {}
    for path in sorted((ROOT / "contracts").glob("*.yaml")):
        c = load_contract(path, check=False)
        for it in c.data.get("obligations") or []:
            if it.get("method") == "sanitize":
                seen[c.data["family"]] = (it.get("params") or {}).get("workload", c.data["family"])
    assert gpu <= set(seen), sorted(gpu - set(seen))
    assert set(seen.values()) <= set(workloads.workloads()), sorted(set(seen.values()) - set(workloads.workloads()))


def test_the_attention_workload_launches_every_attention_kernel_with_gqa_on_both_vjp_paths():
    """The sanitizer sees every kernel (the shapes were cut for time, never below this): each kind launches, GQA
    reaches the tiled and the row VJP, a partial query tile and a key tail occur, an empty query is run."""
    from falsification.attention_tests import VJP_KINDS
    from native import attention as att
    from native.workloads import attention_shapes

    launched: set[str] = set()
    gqa_paths: set[bool] = set()
    for b, hq, hkv, lq, lk, d in attention_shapes():
        p = att.attention_plan(b, hq, hkv, lq, lk, d)
        paths = [att.vjp_path(p)] + (["kernel"] if (lq, lk) == (att.BR + 3, att.BC + 5) else [])  # as the workload
        if p.grid_q:
            launched |= {"fwd", *att.FWD16_VARIANTS.values()}
        for path in paths:  # a kernel over query rows launches where there are rows, one over key rows where keys
            over_rows = ("delta", "dqsum", "dq", "row_dq")
            launched |= {k for k in VJP_KINDS[path] if (p.grid_q if k in over_rows else p.grid_k)}
        if hq > hkv:
            gqa_paths.add(bool(p.tiled_vjp))
    shapes = attention_shapes()
    assert launched == set(att.KERNELS) and gqa_paths == {True, False}
    assert any(lq > att.BR and lq % att.BR and lk % att.BC for _, _, _, lq, lk, _ in shapes)
    assert any(lq == 0 for _, _, _, lq, _, _ in shapes) and any(b > 1 for b, *_ in shapes)


def test_a_workload_process_imports_only_the_module_that_registers_it():
    """Each sanitizer tool runs its workload in a fresh process: a family's own workload (native.norm's) imports that
    module, not the whole native package; an unknown name still lists every workload."""
    import subprocess
    import sys

    code = (
        "import sys, native.workloads as w\n"
        "w.find_workload('norm')\n"
        "print(sorted(m for m in sys.modules if m.startswith('native.')))\n"
        "try:\n    w.find_workload('no-such-workload')\nexcept KeyError as e:\n    print('conv' in str(e))\n"
    )
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True).stdout
    loaded, listed = out.splitlines()
    assert "'native.norm'" in loaded and "'native.fusion'" not in loaded and "'native.ir'" not in loaded
    assert listed == "True"


def test_a_device_run_shares_one_process_per_tool_among_its_sanitize_items(fake_sanitizer, monkeypatch, tmp_path):
    """kc check on cuda writes the plan of the items it runs: two contracts' sanitize items get one process per tool
    between them, and the run's directory is gone afterwards. (On the host their workloads raise: no CuPy.)"""
    from obligations import check

    monkeypatch.setattr(check, "use_plain_reductions", lambda: None)  # a CuPy setting: no CuPy here
    monkeypatch.delenv(sanitize_batch.RUN_ENV)
    paths = [ROOT / "contracts" / f for f in ("reductions-v1.yaml", "transfer-float32-v1.yaml")]
    result = check.check_paths(paths, device="cuda", only=["RED-SANITIZE", "XFER-SANITIZE"])
    items = [it for c in result["contracts"] for it in c["items"]]
    assert [it["evidence"]["shared"]["workloads"] for it in items] == [2, 2], items
    assert sorted(fake_sanitizer.read_text().splitlines()) == [f"{t} reductions transfer" for t in sorted(TOOLS)]
    assert sanitize_batch.RUN_ENV not in os.environ


@pytest.fixture(autouse=True)
def _one_process_per_tool(monkeypatch):
    """These tests place workloads in one process per tool unless they set the split themselves."""
    monkeypatch.setenv(sanitize_batch.SHARDS_ENV, "1")


def test_unset_the_tools_split_by_default_racecheck_most(monkeypatch):
    # the H200 run of 2026-11-27: racecheck's one process over 16 workloads (32.9 s) was the run's longest item
    monkeypatch.delenv(sanitize_batch.SHARDS_ENV)
    units = {w: {"tools": list(sanitize_batch.TOOLS)} for w in "abcdef"}
    names = [p["name"] for p in sanitize_batch.make_plan(units)["processes"]]
    assert {t: sum(n.split("#")[0] == t for n in names) for t in sanitize_batch.TOOLS} == (
        sanitize_batch.DEFAULT_SHARDS
    )
    assert sanitize_batch.DEFAULT_SHARDS["racecheck"] == max(sanitize_batch.DEFAULT_SHARDS.values())


def test_shards_split_a_tools_workloads_over_processes(monkeypatch):
    units = {w: {"tools": ["memcheck", "racecheck"]} for w in ("a", "b", "c")}
    monkeypatch.setenv(sanitize_batch.SHARDS_ENV, "racecheck=2")
    plan = sanitize_batch.make_plan(units)
    assert [(p["name"], p["workloads"]) for p in plan["processes"]] == [
        ("memcheck", ["a", "b", "c"]),
        ("racecheck#0", ["a", "c"]),
        ("racecheck#1", ["b"]),
    ]
    seconds = {"racecheck": {"a": 10.0, "b": 1.0}}  # the last run's: c untimed counts as their mean
    assert [p["workloads"] for p in sanitize_batch.make_plan(units, seconds=seconds)["processes"][1:]] == [
        ["a"],
        ["b", "c"],
    ]
    monkeypatch.setenv(sanitize_batch.SHARDS_ENV, "5")
    assert len(sanitize_batch.make_plan(units)["processes"]) == 6  # never more processes than workloads


def test_workloads_that_start_the_same_runtime_share_a_process(monkeypatch):
    """Split by seconds alone, t1 and t2 would go to two processes and each would start their runtime (Triton's
    import and launcher: ~3.8 s a process on an H200 host); as one group they share one start."""
    from native.workloads import workload_start

    assert workload_start("triton-softmax") == workload_start("triton-rmsnorm") == "triton"
    assert workload_start("attention") is None
    units = {w: {"tools": ["memcheck"]} for w in ("a", "b", "t1", "t2")}
    seconds = {"memcheck": {"t1": 5.0, "a": 4.0, "t2": 3.0, "b": 1.0}}
    monkeypatch.setenv(sanitize_batch.SHARDS_ENV, "memcheck=2")
    monkeypatch.setattr(sanitize_batch, "workload_start", lambda w: None)
    apart = [p["workloads"] for p in sanitize_batch.make_plan(units, seconds=seconds)["processes"]]
    assert not any({"t1", "t2"} <= set(part) for part in apart)
    monkeypatch.setattr(sanitize_batch, "workload_start", {"t1": "rt", "t2": "rt"}.get)
    together = [p["workloads"] for p in sanitize_batch.make_plan(units, seconds=seconds)["processes"]]
    assert sorted(together) == [["a", "b"], ["t1", "t2"]]


def test_a_plan_splits_by_the_seconds_the_last_run_recorded(fake_sanitizer):
    plan = sanitize_batch.make_plan(
        {"fake-clean": {"tools": ["memcheck"], "modules": ["tests.planted.sanitizer_bugs"]}}
    )
    sanitize_batch.run_plan(Path(os.environ[sanitize_batch.RUN_ENV]), plan, shutil.which("compute-sanitizer"))
    assert set(sanitize_batch.last_seconds()["memcheck"]) == {"fake-clean"}


def test_a_fresh_machines_plan_splits_by_the_shipped_seconds_and_its_own_win(monkeypatch):
    # without a run of its own (a CI runner, a device machine) a plan split by count: one racecheck process of a
    # 2 x H100 cluster took 26.9 s against 22.3 for another; the shipped reference run balances them
    from obligations import runorder

    shipped = runorder.shipped_sanitize_seconds()
    named = set()  # the sanitize items' workloads: what a device run's plan names
    for path in sorted((ROOT / "contracts").glob("*.yaml")):
        c = load_contract(path, check=False)
        for it in c.data.get("obligations") or []:
            if it.get("method") == "sanitize":
                named.add((it.get("params") or {}).get("workload", c.data["family"]))
    assert set(shipped) == set(TOOLS) and all(set(shipped[t]) == named for t in TOOLS), sorted(named)
    monkeypatch.setattr(sanitize_batch, "last_seconds", lambda: {"racecheck": {"attention": 99.0}})
    merged = sanitize_batch.plan_seconds()
    assert merged["racecheck"]["attention"] == 99.0 and merged["racecheck"]["conv"] == shipped["racecheck"]["conv"]
    result = {
        "contracts": [
            {
                "items": [
                    {"evidence": {"kind": "sanitize", "workload": "w", "verdicts": {"memcheck": {"seconds": 1.5}}}},
                    {"evidence": {"kind": "z3"}},
                ]
            }
        ]
    }
    assert runorder.sanitize_seconds_of(result) == {"memcheck": {"w": 1.5}}
