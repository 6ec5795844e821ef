"""Test-session settings: the proof cache lives in a temporary directory, never the user's cache."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_OWN: list[str] = []


def pytest_configure(config) -> None:
    if "KC_PROOF_CACHE_DIR" not in os.environ:  # subprocesses (kc check, workers) inherit it
        _OWN.append(tempfile.mkdtemp(prefix="kc-proof-cache-"))
        os.environ["KC_PROOF_CACHE_DIR"] = _OWN[-1]


def pytest_unconfigure(config) -> None:
    for d in _OWN:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def _kc_environment_restored():
    """Every test leaves kc's settings in the environment (KC_*) as it found them: an in-process ``main([...,
    "--no-proof-cache"])`` or a cluster task's ``run_on_worker`` sets them for the process (and its children),
    and a later test's ``kc check`` subprocess then ran with them (a stray KC_Z3_STABILITY added stability tables
    to a determinism test's records, a failure that depended on which tests an xdist worker ran first)."""
    before = {k: v for k, v in os.environ.items() if k.startswith("KC_")}
    yield
    for k in [k for k in os.environ if k.startswith("KC_") and k not in before]:
        del os.environ[k]
    os.environ.update(before)


@pytest.fixture(autouse=True)
def _gpu_turn(request):
    """Tests marked ``cuda`` share the GPU; a test marked ``quiet_gpu`` (it decides on a timing) has it alone.

    Under ``pytest -n N`` other workers' kernels slice the GPU's time: a host-bound timing then reads as GPU-bound
    (a planted per-call revalidation measured 'passed' on an H100 beside seven busy workers). Readers hold a
    shared flock, a quiet test an exclusive one; everyone passes a turnstile first, so a waiting quiet test is not
    starved by a stream of new readers.
    """
    marks = {m.name for m in request.node.iter_markers()}
    if not marks & {"cuda", "quiet_gpu"}:
        yield
        return
    import fcntl

    base = os.path.join(tempfile.gettempdir(), f"kc-pytest-gpu-{os.getuid()}")
    with open(base + ".turnstile", "a") as turnstile, open(base + ".lock", "a") as gpu:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(gpu, fcntl.LOCK_EX if "quiet_gpu" in marks else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(gpu, fcntl.LOCK_UN)
