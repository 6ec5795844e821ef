"""The results log of ``kc check``: JSON Lines, one line per finished item, flushed as it completes.

The first line records the run's settings; ``kc check --resume LOG`` reads the finished items back, checks
only the rest with the same settings and appends to the same log, so an interrupted or crashed run loses
nothing it finished. A torn last line (the process died mid-write) is ignored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = ["RunLog", "Resumed", "read_log", "LogError", "LOG_FORMAT", "RESUMED_SETTINGS"]

LOG_FORMAT = "kc-results-log/1"
# Settings a resumed run takes from the log (a flag that disagrees is a usage error).
RESUMED_SETTINGS = ("device", "profile", "seed", "only", "strict")


class LogError(ValueError):
    """A results log that cannot be resumed (missing, not a log, or with other settings)."""


@dataclass
class RunLog:
    """An open results log; ``record`` appends one finished item and flushes it to disk."""

    path: Path
    settings: dict[str, Any]
    append: bool = False
    _fh: IO[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.append and self.path.exists():  # drop a torn last line before appending after it
            raw = self.path.read_bytes()
            if raw and not raw.endswith(b"\n"):
                with open(self.path, "r+b") as fh:
                    fh.truncate(raw.rfind(b"\n") + 1)
        self._fh = open(self.path, "a" if self.append else "w", encoding="utf-8")  # noqa: SIM115 (held for the run)
        if not self.append:
            self._write({"log": LOG_FORMAT, "event": "run", **self.settings})

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


def read_log(path: str | Path) -> Resumed:
    """Read a results log for ``--resume``; LogError saying why it cannot be resumed."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise LogError(f"{path}: cannot read the results log: {getattr(e, 'strerror', None) or e}") from None
    events = []
    for n, line in enumerate(lines, 1):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if n == 1:
                raise LogError(f"{path}:1:1: not a kc results log (its first line must name {LOG_FORMAT!r})") from None
            if n == len(lines):
                break  # torn last line: the run died while writing it
            raise LogError(f"{path}:{n}:1: not a JSON line of a results log") from None
    if not events or not isinstance(events[0], dict) or events[0].get("log") != LOG_FORMAT:
        raise LogError(f"{path}:1:1: not a kc results log (its first line must name {LOG_FORMAT!r})")
    settings = {k: v for k, v in events[0].items() if k not in ("log", "event")}
    done = {}
    for ev in events[1:]:
        if isinstance(ev, dict) and ev.get("event") == "item":
            done[(ev["contract"], ev["sha256"], ev["record"]["id"])] = ev["record"]
    return Resumed(settings, done, any(isinstance(e, dict) and e.get("event") == "end" for e in events))
