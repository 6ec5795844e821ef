"""Atomic file output: write to a temporary file beside the target, then rename it over the target."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_text_atomic", "write_bytes_atomic", "check_writable", "OutputPathError"]


class OutputPathError(ValueError):
    """An output path that cannot be written (a user mistake: exit 2, found before the run)."""


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (temporary file + rename)."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def check_writable(path: str | Path) -> None:
    """Raise OutputPathError unless ``path`` can be created or replaced (checked before a long run starts)."""
    path = Path(path)
    if str(path) == "-":
        return
    if path.is_dir():
        raise OutputPathError(f"{path}: is a directory, not a file")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputPathError(f"{path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise OutputPathError(f"{path}: not writable")
