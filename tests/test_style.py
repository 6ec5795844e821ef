"""The tree is ruff-clean and ruff-formatted (CI runs this like any test; `ruff format .` fixes the second)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "ruff", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [("check", "."), ("format", "--check", ".")], ids=["check", "format"])
def test_ruff(args):
    done = _ruff(*args)
    assert done.returncode == 0, done.stdout + done.stderr
