"""obligations.pycache: kc caches bytecode under its cache dir only where Python would not cache it itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from obligations import pycache


@pytest.fixture
def clean(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.delenv(pycache.PYCACHE_ENV, raising=False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    return tmp_path


def test_needs_cache_when_writing_is_off_or_site_packages_is_read_only(tmp_path):
    assert pycache.needs_cache(True, None)
    assert not pycache.needs_cache(False, str(tmp_path))
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert pycache.needs_cache(False, str(ro)) == (not os.access(ro, os.W_OK))  # root may write anyway
    finally:
        ro.chmod(0o755)


def test_enable_sets_the_prefix_for_this_process_and_its_children(clean, monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    where = pycache.enable_bytecode_cache()
    assert where == clean / "kernel-contracts" / "pycache" and where.is_dir()
    assert sys.pycache_prefix == str(where) and sys.dont_write_bytecode is False
    assert os.environ["PYTHONPYCACHEPREFIX"] == str(where) and "PYTHONDONTWRITEBYTECODE" not in os.environ
    # a child compiles into the prefix, not beside the source
    src = clean / "mod_under_test.py"
    src.write_text("X = 1\n")
    subprocess.run([sys.executable, "-c", "import mod_under_test"], cwd=clean, check=True, env=dict(os.environ))
    assert not (clean / "__pycache__").exists()
    assert list(where.rglob("mod_under_test*.pyc"))


@pytest.mark.parametrize("how", ["off", "user prefix", "python caches"])
def test_enable_leaves_python_alone(clean, monkeypatch, how):
    if how == "off":
        monkeypatch.setenv(pycache.PYCACHE_ENV, "0")
    elif how == "user prefix":
        monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(clean / "mine"))
    else:
        monkeypatch.setattr(sys, "dont_write_bytecode", False)
        monkeypatch.setattr(pycache, "needs_cache", lambda dont_write, site: False)
    assert pycache.enable_bytecode_cache() is None
    assert sys.pycache_prefix is None
