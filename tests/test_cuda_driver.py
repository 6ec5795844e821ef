"""How a process's CUDA context waits (native.cuda_driver): a blocking wait gives its core back, a spin holds it; a
cuda run's workers wait by blocking and give up CPU priority to the run's sanitizer processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from native import cuda_driver
from obligations import isolation
from tests.contract_helpers import needs_cuda

ROOT = Path(__file__).resolve().parent.parent

# Hold the GPU for a given number of cycles: the host's synchronize waits that long in the wait under test.
_HOLD = r"""
import json, sys, time
import cupy
from native.cuda_driver import set_wait
if sys.argv[1] != "-":
    assert set_wait(sys.argv[1]) is None
k = cupy.RawKernel('extern "C" __global__ void hold(long long n)'
                   '{ long long t0 = clock64(); while (clock64() - t0 < n) {} }', "hold")
clock_khz = cupy.cuda.runtime.getDeviceProperties(0)["clockRate"]
k((1,), (1,), (cupy.int64(clock_khz * 10),))  # compiled and loaded before the timed wait
cupy.cuda.Device().synchronize()
out = {}
for wait in sys.argv[2:]:
    if wait != "-":
        assert set_wait(wait) is None
    w0, c0 = time.perf_counter(), time.process_time()
    k((1,), (1,), (cupy.int64(clock_khz * 400),))  # ~0.4 s at the base clock, less at boost
    cupy.cuda.Device().synchronize()
    out[wait] = (time.perf_counter() - w0, time.process_time() - c0)
print(json.dumps(out))
"""


def _waits(*argv: str) -> dict[str, tuple[float, float]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _HOLD, *argv], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_waits_are_the_drivers_scheduling_flags():
    assert cuda_driver.WAITS == {"auto": 0, "spin": 1, "yield": 2, "blocking": 4}
    assert cuda_driver.MEASURE_WAIT == "spin"


def test_the_environment_names_a_wait_or_is_bad_input(monkeypatch):
    monkeypatch.delenv(cuda_driver.WAIT_ENV, raising=False)
    assert cuda_driver.wait_from_env() is None
    monkeypatch.setenv(cuda_driver.WAIT_ENV, " blocking ")
    assert cuda_driver.wait_from_env() == "blocking"
    monkeypatch.setenv(cuda_driver.WAIT_ENV, "sleepy")
    with pytest.raises(ValueError, match="KC_CUDA_WAIT='sleepy': expected one of auto, spin, yield, blocking"):
        cuda_driver.wait_from_env()


def test_without_a_driver_no_wait_is_set_and_no_gpu_is_seen(monkeypatch):
    monkeypatch.setattr(cuda_driver, "_driver", lambda: None)
    assert cuda_driver.set_wait("blocking") == "no CUDA driver (libcuda.so.1)"
    assert cuda_driver.device_count() is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    from obligations.cluster import visible_gpus

    assert visible_gpus() == []  # a cluster's opening finds no GPU to give a worker, and says so
    with pytest.raises(KeyError):
        cuda_driver.set_wait("nap")


def test_a_cuda_runs_workers_block_give_up_priority_and_what_the_user_set_wins(monkeypatch):
    seen: list[dict[str, str]] = []

    class Popen:
        def __init__(self, argv, env, **kw):
            seen.append(env)

    monkeypatch.setattr(isolation.subprocess, "Popen", Popen)
    monkeypatch.delenv(cuda_driver.WAIT_ENV, raising=False)
    monkeypatch.delenv(isolation.NICE_ENV, raising=False)
    isolation.WorkerPool(None, {"device": "cuda"})._spawn()
    isolation.WorkerPool(None, {"device": "host"})._spawn()
    monkeypatch.setenv(cuda_driver.WAIT_ENV, "spin")
    monkeypatch.setenv(isolation.NICE_ENV, "0")
    isolation.WorkerPool(None, {"device": "cuda"})._spawn()
    assert [env.get(cuda_driver.WAIT_ENV) for env in seen] == [isolation.WORKER_WAIT, None, "spin"]
    assert [env.get(isolation.NICE_ENV) for env in seen] == [str(isolation.WORKER_NICE), None, "0"]
    assert isolation.WORKER_WAIT == "blocking" and isolation.WORKER_NICE > 0
    monkeypatch.setenv(cuda_driver.WAIT_ENV, "sleepy")
    with pytest.raises(ValueError, match="KC_CUDA_WAIT='sleepy'"):  # the run says so, before any worker starts
        isolation.WorkerPool(None, {"device": "cuda"})._spawn()


def test_a_worker_takes_the_priority_the_run_gives_it(monkeypatch):
    monkeypatch.setenv(isolation.NICE_ENV, "3")
    pool = isolation.WorkerPool(None, {"device": "host"})
    try:
        pool.prestart()
        proc = pool._start()  # ready: past its start, where it lowered its priority
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 3)
    finally:
        pool.close()


@pytest.mark.cuda
@needs_cuda
def test_a_blocking_wait_gives_the_core_back_and_a_spin_holds_it():
    # Set before the context exists (a worker's start), then switched on the live context (a measure item).
    got = _waits("blocking", "-", "spin", "blocking")
    (wall_b, cpu_b), (wall_s, cpu_s), (wall_b2, cpu_b2) = got["-"], got["spin"], got["blocking"]
    assert min(wall_b, wall_s, wall_b2) > 0.1, got  # the GPU held the host that long
    assert cpu_b < 0.25 * wall_b and cpu_b2 < 0.25 * wall_b2, got
    assert cpu_s > 0.75 * wall_s, got


@pytest.mark.cuda
@needs_cuda
def test_the_drivers_count_is_cupys():
    import cupy

    assert cuda_driver.device_count() == cupy.cuda.runtime.getDeviceCount() >= 1


@pytest.mark.cuda
@needs_cuda
def test_the_drivers_default_spins_in_a_one_context_process():
    # Why kc's workers set a wait at all: left alone, each one holds a core while its GPU is busy.
    (wall, cpu) = _waits("-", "-")["-"]
    assert wall > 0.1 and cpu > 0.75 * wall
