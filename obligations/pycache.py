"""Bytecode caching for kc and the processes it starts, where Python would otherwise compile every module anew.

A check starts a dozen worker processes, each importing NumPy, CuPy, Hypothesis and often torch (about 3,000
modules with Inductor). Container images commonly set ``PYTHONDONTWRITEBYTECODE`` and install packages without
``.pyc`` files, or keep ``site-packages`` read-only: then every process compiles every module from source, which
measured 2-5 s of CPU per worker and 12 s of TORCH-INDUCTOR's 26 s (H100, 2026-11-27). There kc writes the
bytecode under its own cache directory (``sys.pycache_prefix``), never beside any source, so the image and the
project tree stay as they are; the processes it starts inherit the setting. A user's own
``PYTHONPYCACHEPREFIX`` wins, and ``KC_PYCACHE=0`` turns this off.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

__all__ = ["PYCACHE_ENV", "pycache_dir", "needs_cache", "enable_bytecode_cache"]

PYCACHE_ENV = "KC_PYCACHE"


def pycache_dir() -> Path:
    """Where kc keeps bytecode (XDG: ``$XDG_CACHE_HOME/kernel-contracts/pycache``, else under ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernel-contracts" / "pycache"


def needs_cache(dont_write: bool, site_packages: str | None) -> bool:
    """Whether Python caches no bytecode here: writing is off, or the installed packages' directory is read-only."""
    if dont_write:
        return True
    return bool(site_packages) and os.path.isdir(site_packages) and not os.access(site_packages, os.W_OK)


def enable_bytecode_cache() -> Path | None:
    """Cache this process's (and its children's) bytecode under :func:`pycache_dir` where Python would not;
    the directory used, or None when Python caches as usual, the user chose a prefix, or it is switched off."""
    if os.environ.get(PYCACHE_ENV, "1").strip().lower() in ("0", "no", "off", "false"):
        return None
    if os.environ.get("PYTHONPYCACHEPREFIX") or sys.pycache_prefix:
        return None
    if not needs_cache(sys.dont_write_bytecode, sysconfig.get_paths().get("purelib")):
        return None
    where = pycache_dir()
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # nowhere to write: compiling from source is slower, never wrong
    sys.pycache_prefix = str(where)
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = str(where)  # the workers, sanitizer runs and audits this run starts
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return where
