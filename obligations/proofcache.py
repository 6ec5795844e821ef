"""The proof cache and the proof settings of a run (``--z3-stability``, ``--no-proof-cache``).

A proved or exhausted result is stored under the hash of exactly what its verdict depends on (for Z3: the
SMT-LIB text of its queries, the rlimit, the solver's parameters and version; for enumeration: the statement,
the bound, the symbol declarations and the source of the plan's package and of the evaluating code), as Dafny
and F* cache verification results; so is a passed compiled-code audit (:mod:`obligations.audit`: its builds,
options, compilers and rules). A rerun of an unchanged item reuses the entry and says so in its evidence
(``cache: hit`` and the key). Only proved/exhausted results are stored: a violation is always found again
(and its counterexample confirmed through the plan), an unknown is always retried.

The settings travel in environment variables, so worker processes (``kc check -j``) see what the run was
asked for: ``KC_Z3_STABILITY`` (runs per Z3 item, 0 or unset: off), ``KC_PROOF_CACHE`` (``0``: off) and
``KC_PROOF_CACHE_DIR`` (default: ``$XDG_CACHE_HOME/kernel-contracts/proofs``, else ``~/.cache/...``).
Entries are written atomically (a temporary file renamed over the entry), so parallel workers are safe: a
reader sees no entry or a whole one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "STABILITY_ENV",
    "CACHE_ENV",
    "CACHE_DIR_ENV",
    "LOAD_CACHE_ENV",
    "CACHE_FORMAT",
    "ProofSettings",
    "proof_settings",
    "default_cache_dir",
    "cache_key",
    "cache_get",
    "cache_put",
    "sources_digest",
]

STABILITY_ENV = "KC_Z3_STABILITY"
CACHE_ENV = "KC_PROOF_CACHE"
CACHE_DIR_ENV = "KC_PROOF_CACHE_DIR"
# The load cache (contract parses, obligations.contract) shares the directory, not the switch: --no-proof-cache
# (KC_PROOF_CACHE=0) solves every proof again but a file's parse is a function of its bytes and kc, not a result.
LOAD_CACHE_ENV = "KC_LOAD_CACHE"
# Bumped whenever what an entry means changes (the engines' query construction or the entry's fields).
CACHE_FORMAT = 1


@dataclass(frozen=True)
class ProofSettings:
    """How this process runs proofs: stability runs per Z3 item, and whether (and where) results are cached."""

    stability: int = 0
    cache: bool = True
    cache_dir: Path | None = None


def default_cache_dir() -> Path:
    """The user cache directory of proof results (XDG: ``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernel-contracts" / "proofs"


def proof_settings(switch: str = CACHE_ENV) -> ProofSettings:
    """The settings of this run, read from the environment (set by ``kc check`` for itself and its workers);
    ``switch``: the variable that turns the cache off (the load cache's is :data:`LOAD_CACHE_ENV`)."""
    raw = os.environ.get(STABILITY_ENV, "").strip() or "0"
    try:
        stability = max(0, int(raw))
    except ValueError:
        raise ValueError(f"{STABILITY_ENV}={raw!r} is not a number of runs") from None
    cache = os.environ.get(switch, "1").strip() not in ("0", "no", "off", "false")
    where = os.environ.get(CACHE_DIR_ENV)
    return ProofSettings(stability, cache, Path(where) if where else default_cache_dir())


def cache_key(engine: str, parts: Mapping[str, Any]) -> str:
    """The hex SHA-256 of the engine's name, the cache format and ``parts`` (canonical JSON: sorted keys)."""
    text = json.dumps({"engine": engine, "format": CACHE_FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _entry(settings: ProofSettings, key: str) -> Path | None:
    if not settings.cache or settings.cache_dir is None:
        return None
    return settings.cache_dir / key[:2] / f"{key}.json"


def cache_get(settings: ProofSettings, key: str) -> dict[str, Any] | None:
    """The stored entry of ``key``, or None (no entry, cache off, or an unreadable entry: a miss, not an error)."""
    path = _entry(settings, key)
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("key") == key else None


def cache_put(settings: ProofSettings, key: str, entry: Mapping[str, Any]) -> bool:
    """Store ``entry`` under ``key`` atomically; False if the cache is off or not writable (never an error)."""
    from obligations.atomic import write_text_atomic

    path = _entry(settings, key)
    if path is None:
        return False
    with contextlib.suppress(OSError):
        write_text_atomic(path, json.dumps({**entry, "key": key}, sort_keys=True, default=str) + "\n")
        return True
    return False


_DIGESTS: dict[tuple[str, ...], str] = {}


def sources_digest(roots: Iterable[Path]) -> str:
    """SHA-256 over every ``.py`` file under ``roots`` (path and text, in sorted order); memoised per process."""
    key = tuple(sorted(str(Path(r).resolve()) for r in roots))
    if key not in _DIGESTS:
        h = hashlib.sha256()
        for root in key:
            p = Path(root)
            files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
            for f in files:
                if "__pycache__" in f.parts:
                    continue
                h.update(str(f.relative_to(p.parent)).encode() + b"\0")
                with contextlib.suppress(OSError):
                    h.update(f.read_bytes())
                h.update(b"\0")
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]
