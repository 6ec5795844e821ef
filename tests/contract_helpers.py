"""Helpers the family test modules share: contract variants with a planted change, items by id, CUDA marks."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from obligations.check import check_contract
from obligations.core.device import cuda_available

__all__ = ["CONTRACTS", "CUDA_OK", "needs_cuda", "contract_variant", "check_items"]

CONTRACTS = Path(__file__).resolve().parent.parent / "contracts"
CUDA_OK, _WHY = cuda_available()
needs_cuda = pytest.mark.skipif(not CUDA_OK, reason=_WHY or "no CUDA device")


def contract_variant(contract: Path, tmp_path: Path, old: str, new: str, count: int = 1) -> Path:
    """A copy of ``contract`` under ``tmp_path`` (same file name) with ``old`` replaced (``count`` times; -1 all)."""
    text = contract.read_text()
    assert old in text, old
    out = tmp_path / contract.name
    out.write_text(text.replace(old, new, count))
    return out


def check_items(path: Path, ids: list[str], device: str = "host") -> dict[str, dict]:
    """Check only ``ids`` of the contract at ``path``; their result records by id."""
    return {it["id"]: it for it in check_contract(path, only=ids, device=device)["items"]}


def probe_contract(tmp_path: Path, name: str, header: str, items: str = "obligations: []\n") -> tuple[Any, Path]:
    """A contract ``tmp_path/<name>.yaml`` of ``header`` and ``items``, loaded unchecked, and its path."""
    from obligations.contract import load_contract

    path = tmp_path / f"{name}.yaml"
    path.write_text(header + items)
    return load_contract(path, check=False), path


def statement_item(prove: str, method: str = "z3", **extra: Any) -> dict:
    """One obligation item proving ``prove`` by ``method`` (a test's hand-made item: id P, line 1)."""
    return {
        "id": "P",
        "kind": "obligation",
        "type": "invariant",
        "property": "p",
        "method": method,
        "prove": prove,
        "location": {"line": 1, "column": 1},
        **extra,
    }


def interruptible() -> None:
    """``preexec_fn`` of a run a test stops with SIGINT: the default disposition, as at a terminal. A shell starts a
    background job (``cmd &``) with SIGINT ignored and kc keeps an inherited ignore (nohup's choice), so a suite
    launched that way would otherwise send its Ctrl-C into the void and wait out the hanging item's limit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def marked_processes(mark: str) -> list[int]:
    """Pids of live processes whose environment holds KC_TEST_MARK=mark (a run and its workers)."""
    import os

    pids = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if f"KC_TEST_MARK={mark}".encode() in env and state != "Z":
            pids.append(int(pid))
    return pids


def surviving_processes(mark: str, grace: float = 10.0) -> list[int]:
    """Pids of marked processes still alive ``grace`` seconds from now (or the moment none is left).

    A run SIGKILLs its workers and reaps them in the background: a killed process that held a CUDA context or a
    big heap takes a moment to exit, so a check right after the run ends may still see it on a loaded machine."""
    import time

    deadline = time.monotonic() + grace
    while (pids := marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def count_loads(monkeypatch) -> dict[str, int]:
    """Count, in the returned dict, the contract parses and validations (obligations.contract's _parse and
    _diagnose) made while the test runs."""
    import obligations.contract as contract_mod

    counts = {"parse": 0, "diagnose": 0}
    for name, fn in (("parse", contract_mod._parse), ("diagnose", contract_mod._diagnose)):

        def counted(*args, _name=name, _fn=fn):
            counts[_name] += 1
            return _fn(*args)

        monkeypatch.setattr(contract_mod, f"_{name}", counted)
    return counts
