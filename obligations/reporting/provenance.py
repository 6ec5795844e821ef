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
    "evidence_level",
    "poorer",
    "report_evidence",
]

# How rich a result's evidence is, per dimension: a GPU run beats a host run, the full profile the quick one (and
# deep, full's nightly with more drawn cases, the full one).
EVIDENCE_RANKS: dict[str, dict[str, int]] = {
    "device": {"host": 0, "cuda": 1},
    "profile": {"quick": 0, "full": 1, "deep": 2},
}


def evidence_level(result: Mapping[str, Any]) -> dict[str, str | None]:
    """The evidence level of a check result: the device kind it ran on and its profile."""
    prov = result.get("provenance") or {}
    device = (prov.get("device") or {}).get("kind")
    profile = prov.get("profile") or ({"cuda": "full", "host": "quick"}.get(device) if device else None)
    return {"device": device, "profile": profile}


def poorer(new: Mapping[str, Any] | None, old: Mapping[str, Any] | None) -> list[str]:
    """The dimensions in which evidence ``new`` is poorer than ``old`` (e.g. ``["device host < cuda"]``)."""
    out = []
    for dim, ranks in EVIDENCE_RANKS.items():
        a, b = (new or {}).get(dim), (old or {}).get(dim)
        if a in ranks and b in ranks and ranks[a] < ranks[b]:
            out.append(f"{dim} {a} < {b}")
    return out


def report_evidence(reports_dir: str | Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Contract id -> (report, evidence level) of every stamped report in ``reports_dir``."""
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    d = Path(reports_dir)
    if not d.is_dir():
        return found
    for report in sorted(p for p in d.iterdir() if p.suffix in (".md", ".html") and p.is_file()):
        stamp = read_stamp(report.read_text(encoding="utf-8", errors="replace"))
        if stamp is not None and stamp.evidence and len(stamp.contracts) == 1:
            found.setdefault(stamp.contracts[0].contract, (report, dict(stamp.evidence)))
    return found


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
    evidence: Mapping[str, Any] | None = None  # {"device": "cuda", "profile": "full"}: what the report rests on

    def to_json(self) -> dict[str, Any]:
        """The stamp as a JSON object (the payload of the comment line)."""
        out = {
            "format": self.format,
            "tool_version": self.tool_version,
            "commit": self.commit,
            "contracts": [{"contract": c.contract, "path": c.path, "sha256": c.sha256} for c in self.contracts],
        }
        if self.evidence is not None:
            out["evidence"] = dict(self.evidence)
        return out


def stamp_line(stamp: ReportStamp) -> str:
    """The one-line HTML comment that carries ``stamp`` (valid in Markdown and HTML alike)."""
    # "<" and ">" as JSON escapes: a path or id holding "-->" cannot end the comment early
    text = json.dumps(stamp.to_json(), sort_keys=True).replace("<", "\\u003c").replace(">", "\\u003e")
    return f"<!-- kc-report {text} -->"


def read_stamp(text: str) -> ReportStamp | None:
    """The first stamp in a report's text, or None if it has none or it is malformed."""
    match = _STAMP_RE.search(text)
    if not match:
        return None
    try:
        data = json.loads(match.group(1))
        refs = tuple(ContractRef(str(c["contract"]), str(c["path"]), str(c["sha256"])) for c in data["contracts"])
        evidence = data.get("evidence") if isinstance(data.get("evidence"), dict) else None
        return ReportStamp(str(data["tool_version"]), refs, data.get("commit"), int(data.get("format", 0)), evidence)
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


def _evidence_problems(reports: Path) -> list[str]:
    """Reports resting on poorer evidence than the result kept beside them (reports/result.json)."""
    source = reports / "result.json"
    if not source.is_file():
        return []
    try:
        level = evidence_level(json.loads(source.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return [f"{source}: not a readable check result"]
    problems = []
    for report, ev in report_evidence(reports).values():
        if ev != level:
            problems.append(
                f"{report}: rests on evidence {_level_text(ev)}, but {source} holds "
                f"{_level_text(level)}; regenerate with `kc report --from {source}`"
            )
    return problems


def _level_text(ev: Mapping[str, Any]) -> str:
    return f"device {ev.get('device')}, profile {ev.get('profile')}"


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
    problems.extend(_evidence_problems(reports))
    described: set[str] = set()
    for report in sorted(p for p in reports.iterdir() if p.suffix in (".md", ".html") and p.is_file()):
        text = report.read_text(encoding="utf-8", errors="replace")
        stamp = read_stamp(text)
        if stamp is None:
            if report.stem in ids or "kc-report" in text:
                problems.append(f"{report}: no readable kc-report provenance line; regenerate with `kc report`")
            continue
        if stamp.format != STAMP_FORMAT:
            problems.append(f"{report}: stamp format {stamp.format}, this tool writes {STAMP_FORMAT}; regenerate")
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
                problems.append(f"{report}: contract {ref.contract!r} ({ref.path}) is no longer in {contracts}")
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
