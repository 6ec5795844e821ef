"""The results log of ``kc check``: JSON Lines, one line per finished item, flushed as it completes.

The first line records the run's settings; ``kc check --resume LOG`` reads the finished items back, checks
only the rest with the same settings and appends to the same log, so an interrupted or crashed run loses
nothing it finished. A torn last line (the process died mid-write) is ignored; any other line that is not a
record is skipped with a warning, and every intact record is reused.

A log belongs to one run at a time: the run holds an exclusive lock on it (``flock``) from opening to closing,
and a second run given the same log stops before it starts, naming the pid of the run that holds it.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = ["RunLog", "Resumed", "read_log", "LogError", "LogBusy", "LOG_FORMAT", "RESUMED_SETTINGS"]

LOG_FORMAT = "kc-results-log/1"
# Settings a resumed run takes from the log (a flag that disagrees is a usage error).
RESUMED_SETTINGS = ("device", "profile", "seed", "only", "strict")


class LogError(ValueError):
    """A results log that cannot be resumed (missing, not a log, or with other settings)."""


class LogBusy(LogError):
    """Another run holds the results log (its lock): two runs never write one log."""


def _holder(path: Path) -> str:
    """The pid the log's last run or resume line names (the run that holds it), as words."""
    pid = None
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                ev = json.loads(line)
                if isinstance(ev, dict) and ev.get("event") in ("run", "resume") and isinstance(ev.get("pid"), int):
                    pid = ev["pid"]
    return f"pid {pid}" if pid is not None else "another process"


@dataclass
class RunLog:
    """An open results log; ``record`` appends one finished item and flushes it to disk."""

    path: Path
    settings: dict[str, Any]
    append: bool = False
    _fh: IO[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Opened without truncating, locked, and only then emptied: a second run must not wipe the first's log.
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (held for the run)
        try:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.close()
            self._fh = None
            raise LogBusy(
                f"{self.path}: the results log is in use by another kc check ({_holder(self.path)}); "
                "give this run its own --log"
            ) from None
        if not self.append:
            self._fh.truncate(0)
            self._write({"log": LOG_FORMAT, "event": "run", "pid": os.getpid(), **self.settings})
            return
        raw = self.path.read_bytes()
        if raw and not raw.endswith(b"\n"):  # drop a torn last line before appending after it
            self._fh.truncate(raw.rfind(b"\n") + 1)
        self._write({"event": "resume", "pid": os.getpid()})

    def _write(self, obj: dict[str, Any]) -> None:
        from obligations.check import _finite

        assert self._fh is not None
        self._fh.write(json.dumps(_finite(obj), allow_nan=False, default=str, sort_keys=True) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def record(self, contract: Any, record: dict[str, Any]) -> None:
        """Append one finished item of ``contract``."""
        self._write({"event": "item", "contract": contract.id, "sha256": contract.sha256, "record": record})

    def close(self, exit_code: int | None = None) -> None:
        """Write the end line (when the run finished) and close."""
        if self._fh is None:
            return
        if exit_code is not None:
            self._write({"event": "end", "exit_code": exit_code})
        self._fh.close()
        self._fh = None


@dataclass(frozen=True)
class Resumed:
    """What a log says: the run's settings and its finished item records keyed by (contract, sha256, item)."""

    settings: dict[str, Any]
    done: dict[tuple[str, str, str], dict[str, Any]]
    finished: bool
    warnings: tuple[str, ...] = ()  # lines skipped (corrupt), each with its path:line


def read_log(path: str | Path) -> Resumed:
    """Read a results log for ``--resume``; LogError saying why it cannot be resumed."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise LogError(f"{path}: cannot read the results log: {getattr(e, 'strerror', None) or e}") from None
    events: list[tuple[int, Any]] = []
    warnings = []
    for n, line in enumerate(lines, 1):
        try:
            events.append((n, json.loads(line)))
        except (json.JSONDecodeError, RecursionError):
            if n == 1:
                raise LogError(f"{path}:1:1: not a kc results log (its first line must name {LOG_FORMAT!r})") from None
            if n == len(lines):
                break  # torn last line: the run died while writing it
            warnings.append(f"{path}:{n}:1: not a JSON line of a results log; skipped (its item runs again)")
    if not events or not isinstance(events[0][1], dict) or events[0][1].get("log") != LOG_FORMAT:
        raise LogError(f"{path}:1:1: not a kc results log (its first line must name {LOG_FORMAT!r})")
    settings = {k: v for k, v in events[0][1].items() if k not in ("log", "event", "pid")}
    done = {}
    for n, ev in events[1:]:
        if not isinstance(ev, dict) or ev.get("event") != "item":
            continue
        record = ev.get("record")
        key = (ev.get("contract"), ev.get("sha256"), record.get("id") if isinstance(record, dict) else None)
        if not all(isinstance(k, str) for k in key) or not isinstance(record.get("status"), str):
            warnings.append(f"{path}:{n}:1: an item line without its contract, sha256 or record; skipped")
            continue
        done[key] = record
    finished = any(isinstance(e, dict) and e.get("event") == "end" for _, e in events)
    return Resumed(settings, done, finished, tuple(warnings))
