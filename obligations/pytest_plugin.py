"""pytest plugin: ``pytest --kc contracts/`` runs every contract item as a pytest item, through the same engines.

Registered as the ``pytest11`` entry point ``kc``. Importing it is cheap (pytest only) and it does nothing
unless ``--kc`` is given. proved/exhausted/passed items pass; violated/error items fail with the
counterexample and the replay command; unknown/skipped items are skipped with their reason (they fail
under ``--kc-strict``, as under ``kc check --strict``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_collect_file",
    "pytest_sessionstart",
    "KcContract",
    "KcItem",
    "KcInvalidContract",
    "KcItemFailed",
]

PASSING = frozenset({"proved", "exhausted", "passed"})
NOT_CHECKED = frozenset({"unknown", "skipped", "inconclusive"})


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add --kc PATH (repeatable), --kc-device and --kc-strict."""
    group = parser.getgroup("kc", "kernel-contracts")
    group.addoption(
        "--kc",
        action="append",
        default=[],
        metavar="PATH",
        help="run the items of the contracts in PATH (a .yaml file or a directory) as tests",
    )
    group.addoption(
        "--kc-device",
        default="host",
        choices=["host", "cuda"],
        help="device the contract items run on (default: host)",
    )
    group.addoption("--kc-strict", action="store_true", help="fail unknown and skipped items instead of skipping")


def pytest_configure(config: pytest.Config) -> None:
    """Declare the ``kc`` marker every contract item carries (so -m kc selects them)."""
    config.addinivalue_line("markers", "kc: a kernel-contracts item run through its engine (pytest --kc)")


class KcItemFailed(Exception):
    """A contract item that was violated or could not be checked."""

    def __init__(self, record: dict[str, Any]):
        super().__init__(f"{record['id']} {record['status']}: {record.get('reason') or ''}")
        self.record = record


def _contract_files(paths: list[str]) -> list[Path]:
    from obligations.contract import contract_files

    return [Path(p) for p in contract_files(paths)]


def _display_path(config: pytest.Config, path: Path) -> str:
    """``path`` relative to where pytest was invoked when it lies below it (so replay commands are short)."""
    try:
        return str(path.relative_to(config.invocation_params.dir))
    except ValueError:
        return str(path)


class KcInvalidContract(pytest.Item):
    """A contract file that does not load: one failing item carrying its diagnostics."""

    def __init__(self, *, problem: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.problem = problem
        self.add_marker(pytest.mark.kc)

    def runtest(self) -> None:
        raise KcItemFailed({"id": self.name, "status": "error", "reason": self.problem})

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        """The contract's diagnostics, one per line."""
        return f"invalid contract {self.path}:\n{self.problem}"

    def reportinfo(self) -> tuple[Path, int | None, str]:
        """Point pytest's report at the contract file."""
        return self.path, None, f"{self.path.name} (invalid contract)"


class KcContract(pytest.File):
    """One contract file: yields one KcItem per obligation or falsification test."""

    def collect(self) -> Iterator[pytest.Item]:
        from obligations.contract import ContractError, load_contract

        try:
            contract = load_contract(self.path)
        except ContractError as e:
            yield KcInvalidContract.from_parent(self, name="invalid-contract", problem=str(e))
            return
        for item in contract.items:
            yield KcItem.from_parent(
                self,
                name=str(item["id"]),
                item_id=str(item["id"]),
                method=str(item.get("method") or ""),
                line=(item.get("location") or {}).get("line"),
            )


class KcItem(pytest.Item):
    """One contract item, discharged by ``obligations.check.check_contract(path, only=[id])``."""

    def __init__(self, *, item_id: str, method: str, line: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.item_id = item_id
        self.line = line
        self.method = method
        self.add_marker(pytest.mark.kc)
        self.record: dict[str, Any] | None = None

    def runtest(self) -> None:
        from obligations.check import check_contract

        device = self.config.getoption("kc_device")
        entry = check_contract(_display_path(self.config, self.path), device=device, only=[self.item_id])
        records = [r for r in entry["items"] if r["id"] == self.item_id]
        if not records:
            raise KcItemFailed({"id": self.item_id, "status": "error", "reason": "the check returned no record"})
        self.record = record = records[0]
        self.user_properties.append(("kc_status", record["status"]))
        self.user_properties.append(("kc_claim", record.get("claim")))
        status = record["status"]
        if status in PASSING:
            return
        if status == "violated_expected":  # a declared finding reproduced: pytest's xfail, never a failure
            pytest.xfail(record.get("reason") or "expected violation")
        if status in NOT_CHECKED and not self.config.getoption("kc_strict"):
            # Reported at the item's YAML line (reportinfo), not at this line of the plugin.
            raise pytest.skip.Exception(
                f"{status}: {record.get('reason') or 'no reason given'}", _use_item_location=True
            )
        raise KcItemFailed(record)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        """A failure shows the status, reason, counterexample and the command that replays it."""
        if isinstance(excinfo.value, KcItemFailed):
            r = excinfo.value.record
            lines = [f"{r['id']}: {r['status']}" + (f": {r['reason']}" if r.get("reason") else "")]
            if r.get("counterexample") is not None:
                lines.append("counterexample: " + json.dumps(r["counterexample"], sort_keys=True, default=str))
            if r.get("replay"):
                lines.append(f"replay: {r['replay']}")
            return "\n".join(lines)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        """Point pytest's report at the contract file."""
        return self.path, (self.line - 1 if self.line else None), f"{self.path.name}::{self.item_id}"


def _kc_roots(config: pytest.Config) -> list[Path]:
    return [Path(p).resolve() for p in config.getoption("kc", default=[]) or []]


def _named_on_command_line(config: pytest.Config, file_path: Path) -> bool:
    for arg in config.invocation_params.args:
        head = str(arg).split("::", 1)[0]
        if head and (config.invocation_params.dir / head).resolve() == file_path.resolve():
            return True
    return False


def _is_contract(file_path: Path) -> bool:
    from obligations.contract import _CONTRACT_KEY

    if file_path.suffix not in (".yaml", ".yml"):
        return False
    try:
        with open(file_path, "rb") as fh:
            return bool(_CONTRACT_KEY.search(fh.read(1 << 22)))
    except OSError:
        return False


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> KcContract | None:
    """A contract under a ``--kc`` path (or named on the command line, ``FILE.yaml::ITEM``) is a test file.

    Collected by pytest itself, so ``collected N items`` counts its items and node ids
    (``contracts/x.yaml::ITEM-ID``) can be passed back to pytest.
    """
    config = parent.config
    roots = _kc_roots(config)
    path = file_path.resolve()
    under = any(path == r or r in path.parents for r in roots)
    if (under or _named_on_command_line(config, path)) and _is_contract(path):
        return KcContract.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Nothing to add: contract items are collected by pytest_collect_file (kept for API compatibility)."""


def pytest_sessionstart(session: pytest.Session) -> None:
    """With --kc, collect those paths besides the given ones (so the contracts' items are collected, not added)."""
    config = session.config
    for path in config.getoption("kc", default=[]) or []:
        if str(path) not in config.args:
            config.args.append(str(path))
