"""Test-session settings: the proof cache lives in a temporary directory, never the user's cache."""

from __future__ import annotations

import os
import shutil
import tempfile

_OWN: list[str] = []


def pytest_configure(config) -> None:
    if "KC_PROOF_CACHE_DIR" not in os.environ:  # subprocesses (kc check, workers) inherit it
        _OWN.append(tempfile.mkdtemp(prefix="kc-proof-cache-"))
        os.environ["KC_PROOF_CACHE_DIR"] = _OWN[-1]


def pytest_unconfigure(config) -> None:
    for d in _OWN:
        shutil.rmtree(d, ignore_errors=True)
