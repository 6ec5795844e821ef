"""Machine-readable provenance stamps in reports, and `kc report --check` against the contracts on disk.

Every generated report starts with one line
``<!-- kc-report {"format": 1, "tool_version": ..., "commit": ...,
"contracts": [{"contract": id, "path": ..., "sha256": ...}]} -->`` (on one line)
so that a committed report can be compared with the contract file it describes and with the tool that
would regenerate it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "STAMP_FORMAT",
    "ContractRef",
    "ReportStamp",
    "stamp_line",
    "read_stamp",
    "current_tool_version",
    "check_reports",
]

STAMP_FORMAT = 1
_STAMP_RE = re.compile(r"<!--\s*kc-report\s+(\{.*?\})\s*-->")
_ID_RE = re.compile(r"^id:\s*['\"]?([^'\"#\s]+)", re.MULTILINE)


@dataclass(frozen=True)
class ContractRef:
    """The contract a report describes, as it was when the report was generated."""

    contract: str
    path: str
    sha256: str


@dataclass(frozen=True)
class ReportStamp:
    """What a report was generated from: its contracts and the generating tool's version."""

    tool_version: str
    contracts: tuple[ContractRef, ...]
    commit: str | None = None
    format: int = STAMP_FORMAT

    def to_json(self) -> dict[str, Any]:
        """The stamp as a JSON object (the payload of the comment line)."""
        return {
            "format": self.format,
            "tool_version": self.tool_version,
            "commit": self.commit,
            "contracts": [
                {"contract": c.contract, "path": c.path, "sha256": c.sha256} for c in self.contracts
            ],
        }


def stamp_line(stamp: ReportStamp) -> str:
    """The one-line HTML comment that carries ``stamp`` (valid in Markdown and HTML alike)."""
    return f"<!-- kc-report {json.dumps(stamp.to_json(), sort_keys=True)} -->"


def read_stamp(text: str) -> ReportStamp | None:
    """The first stamp in a report's text, or None if it has none or it is malformed."""
    match = _STAMP_RE.search(text)
    if not match:
        return None
    try:
        data = json.loads(match.group(1))
        refs = tuple(
            ContractRef(str(c["contract"]), str(c["path"]), str(c["sha256"])) for c in data["contracts"]
        )
        return ReportStamp(str(data["tool_version"]), refs, data.get("commit"), int(data.get("format", 0)))
    except (ValueError, KeyError, TypeError):
        return None


def current_tool_version() -> str:
    """The installed kernel-contracts version, else the source tree's pyproject version, else "0"."""
    from importlib import metadata

    try:
        return metadata.version("kernel-contracts")
    except metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        import tomllib

        return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"])
    except (OSError, KeyError, ValueError):
        return "0"


def _older(a: str, b: str) -> bool:
    """True when version ``a`` is older than ``b`` (PEP 440 where both parse, else numeric parts)."""
    try:
        from packaging.version import InvalidVersion, Version

        try:
            return Version(a) < Version(b)
        except InvalidVersion:
            pass
    except ImportError:
        pass
    return tuple(int(n) for n in re.findall(r"\d+", a)) < tuple(int(n) for n in re.findall(r"\d+", b))


def _contract_files(contracts_dir: Path) -> Iterable[Path]:
    for path in sorted(contracts_dir.rglob("*")):
        rel = path.relative_to(contracts_dir).parts
        if (
            path.suffix in (".yaml", ".yml")
            and path.is_file()
            and not any(p.startswith((".", "_")) or p == "schema" for p in rel[:-1])
        ):
            yield path


def _contract_ids(contracts_dir: Path) -> dict[str, Path]:
    ids: dict[str, Path] = {}
    for path in _contract_files(contracts_dir):
        match = _ID_RE.search(path.read_text(encoding="utf-8", errors="replace"))
        if match:
            ids.setdefault(match.group(1), path)
    return ids


def _locate(ref: ContractRef, contracts_dir: Path, ids: Mapping[str, Path]) -> Path | None:
    by_name = contracts_dir / Path(ref.path).name
    if by_name.is_file():
        match = _ID_RE.search(by_name.read_text(encoding="utf-8", errors="replace"))
        if match and match.group(1) == ref.contract:
            return by_name
    return ids.get(ref.contract)


def check_reports(
    reports_dir: str | Path,
    contracts_dir: str | Path,
    *,
    tool_version: str | None = None,
    require_every_contract: bool = True,
) -> list[str]:
    """Problems that make committed reports stale (empty: up to date); `kc report --check` exits 1 on any.

    A report is stale when a contract it describes changed (sha256 of the file's bytes), is gone, or the
    report was generated by an older tool than ``tool_version`` (default: the installed one). With
    ``require_every_contract`` a contract that no report describes is a problem too.
    """
    reports, contracts = Path(reports_dir), Path(contracts_dir)
    current = tool_version or current_tool_version()
    if not reports.is_dir():
        return [f"{reports}: no reports directory; run `kc report` to generate reports"]
    if not contracts.is_dir():
        return [f"{contracts}: no contracts directory"]
    ids = _contract_ids(contracts)
    problems: list[str] = []
    described: set[str] = set()
    for report in sorted(p for p in reports.iterdir() if p.suffix in (".md", ".html") and p.is_file()):
        text = report.read_text(encoding="utf-8", errors="replace")
        stamp = read_stamp(text)
        if stamp is None:
            if report.stem in ids or "kc-report" in text:
                problems.append(
                    f"{report}: no readable kc-report provenance line; regenerate with `kc report`"
                )
            continue
        if stamp.format != STAMP_FORMAT:
            problems.append(
                f"{report}: stamp format {stamp.format}, this tool writes {STAMP_FORMAT}; regenerate"
            )
        if _older(stamp.tool_version, current):
            problems.append(
                f"{report}: generated by kernel-contracts {stamp.tool_version}, "
                f"older than the current {current}; "
                "regenerate with `kc report`"
            )
        for ref in stamp.contracts:
            described.add(ref.contract)
            path = _locate(ref, contracts, ids)
            if path is None:
                problems.append(
                    f"{report}: contract {ref.contract!r} ({ref.path}) is no longer in {contracts}"
                )
                continue
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if digest != ref.sha256:
                problems.append(
                    f"{report}: contract {ref.contract!r} changed since the report was generated "
                    f"({path}: sha256 {digest[:12]}…, report has {ref.sha256[:12]}…); "
                    "re-run `kc check` and `kc report`"
                )
    if require_every_contract:
        for cid, path in sorted(ids.items()):
            if cid not in described:
                problems.append(f"{path}: contract {cid!r} has no report in {reports}; run `kc report`")
    return problems
