"""Sanitizer evidence: skipped off the device, and on the device a planted out-of-bounds write is caught."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from obligations.contract import load_contract
from obligations.engines import Job, get_engine
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


def test_tools_run_side_by_side_and_each_keeps_its_verdict(monkeypatch):
    """Four tools of 0.3 s each take about 0.3 s together; a planted error in one tool is that tool's violation."""
    import os
    import subprocess
    import threading
    import time

    from obligations import sanitize

    live, peak = [0], [0]
    lock = threading.Lock()

    def fake(tool: str, workload: str, modules: tuple = (), timeout_s: float = 600.0) -> dict:
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.3)
        with lock:
            live[0] -= 1
        if tool == "initcheck":
            raise subprocess.TimeoutExpired("compute-sanitizer", timeout_s)
        bad = tool == "racecheck"
        return {"errors": 3 if bad else 0, "exit": 86 if bad else 0, "seconds": 0.3, "tail": []}

    monkeypatch.setattr(sanitize, "run_tool", fake)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)
    t0 = time.perf_counter()
    out = get_engine("sanitize").discharge(Job(CONTRACT, _item("reductions", list(sanitize.TOOLS)), device="cuda"))
    assert time.perf_counter() - t0 < 0.9 and peak[0] == 4
    assert out.status.value == "violated"
    assert set(out.counterexample) == {"racecheck", "initcheck"}
    assert out.counterexample["racecheck"]["errors"] == 3 and out.counterexample["initcheck"]["exit"] == "timeout"
    assert list(out.evidence.verdicts) == list(sanitize.TOOLS)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert sanitize.parallel_tools(4) == 1


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
    from native import attention as att
    from native.workloads import attention_shapes

    launched: set[str] = set()
    gqa_paths: set[bool] = set()
    for b, hq, hkv, lq, lk, d in attention_shapes():
        p = att.attention_plan(b, hq, hkv, lq, lk, d)
        if p.grid_q:
            launched |= {"fwd", "fwd16", "dq" if p.tiled_vjp else "row_dq"}
        if p.grid_k:
            launched |= {"dkdv"} if p.tiled_vjp else {"row_dv", "row_dk"}
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
