"""Reading a `kc check --json` result and describing its statuses and claim levels in words."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "STATUSES",
    "StatusStyle",
    "status_style",
    "load_result",
    "validate_result",
    "iter_items",
    "contract_summary",
    "ClaimDescriber",
    "register_claim",
    "describe_claim",
    "claim_label",
    "GATE_EXPECTED",
    "gate_verdict",
]

STATUSES: tuple[str, ...] = (
    "proved",
    "exhausted",
    "passed",
    "violated",
    "violated_expected",
    "unknown",
    "inconclusive",
    "skipped",
    "error",
)


@dataclass(frozen=True)
class StatusStyle:
    """How a status is shown: a word, a short mark for tables and a CSS colour."""

    status: str
    mark: str
    colour: str
    ok: bool


_STATUS_STYLES: dict[str, StatusStyle] = {
    s.status: s
    for s in (
        StatusStyle("proved", "✔", "#1a7f37", True),
        StatusStyle("exhausted", "✔", "#1a7f37", True),
        StatusStyle("passed", "✔", "#2f8f46", True),
        StatusStyle("violated", "✘", "#cf222e", False),
        # A declared, reproduced finding (``expect: violated``): shown as such, not as a failure and not as a pass.
        StatusStyle("violated_expected", "✘", "#8250df", False),
        StatusStyle("unknown", "?", "#9a6700", False),
        StatusStyle("inconclusive", "≈", "#9a6700", False),
        StatusStyle("skipped", "–", "#57606a", False),
        StatusStyle("error", "!", "#cf222e", False),
    )
}


def status_style(status: str) -> StatusStyle:
    """The display style of ``status``; an unregistered status is shown neutrally, never as passing."""
    return _STATUS_STYLES.get(status, StatusStyle(status, "?", "#57606a", False))


# The gate verdict when every required item has evidence or is a declared, reproduced deviation (and one is).
GATE_EXPECTED = "expected deviations"
_EVIDENCED = frozenset({"proved", "exhausted", "passed"})


def gate_verdict(contract: Mapping[str, Any]) -> str:
    """The QA gate verdict a report shows: the run's, except that required items whose only shortfall is a
    documented deviation (``violated_expected``) read as expected deviations, not as a broken kernel."""
    status = str(contract.get("qa_gate_status") or "not evaluated")
    if status != "not passed":
        return status
    statuses = {str(i.get("id")): str(i.get("status")) for i in contract.get("items", [])}
    required = [statuses.get(str(r)) for r in (contract.get("qa_gate") or {}).get("requires", [])]
    short = [s for s in required if s not in _EVIDENCED]
    return GATE_EXPECTED if short and all(s == "violated_expected" for s in short) else status


_REQUIRED_TOP: dict[str, type | tuple[type, ...]] = {
    "tool": dict,
    "provenance": dict,
    "contracts": list,
    "summary": dict,
}
_REQUIRED_CONTRACT: dict[str, type | tuple[type, ...]] = {"id": str, "path": str, "sha256": str, "items": list}
_REQUIRED_ITEM: dict[str, type | tuple[type, ...]] = {"id": str, "status": str}
# Fields the reports read, where present: a value of another type is refused here, not met as a crash later.
_OPTIONAL_CONTRACT: dict[str, type | tuple[type, ...]] = {
    "version": (str, int, float),
    "family": str,
    "summary": str,
    "qa_gate": (dict, type(None)),
    "not_adopted": list,
    "unchecked_entry_points": list,
}
_OPTIONAL_ITEM: dict[str, type | tuple[type, ...]] = {
    "kind": str,
    "type": (str, type(None)),
    "method": (str, type(None)),
    "reason": (str, type(None)),
    "claim": (str, type(None)),
    "evidence": (dict, type(None)),
    "seconds": (int, float, type(None)),
    "entry_points": (list, type(None)),
    "statement": (dict, type(None)),
    "location": (dict, type(None)),
    "replay": (str, type(None)),
    "property": (str, type(None)),
    "prediction": (str, type(None)),
    "equation": (str, type(None)),
    "test": (str, type(None)),
    "agreement": (str, type(None)),
    "from_run": (int, type(None)),
}
_JSON_TYPE = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}


def _expect(value: Any, types: type | tuple[type, ...], what: str) -> None:
    ok = isinstance(value, types) and not (
        isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,))
    )
    if not ok:
        names = " or ".join(
            dict.fromkeys(_JSON_TYPE.get(t, "null") for t in (types if isinstance(types, tuple) else (types,)))
        )
        raise ValueError(f"not a kc check result: {what} must be {names}, not {type(value).__name__}")


def validate_result(result: Any) -> None:
    """Raise ValueError naming the first bad piece when ``result`` is not a kc check result (missing keys, values
    of the wrong type, a status kc does not know)."""
    if not isinstance(result, Mapping):
        raise ValueError("a kc check result is a JSON object")
    for key, types in _REQUIRED_TOP.items():
        if key not in result:
            raise ValueError(f"not a kc check result: missing top-level key {key!r}")
        _expect(result[key], types, f"{key!r}")
    for n, contract in enumerate(result["contracts"]):
        _expect(contract, dict, f"contract #{n}")
        for key, types in _REQUIRED_CONTRACT.items():
            if key not in contract:
                raise ValueError(f"not a kc check result: contract #{n} lacks {key!r}")
            _expect(contract[key], types, f"contract #{n} {key!r}")
        for key, types in _OPTIONAL_CONTRACT.items():
            if key in contract:
                _expect(contract[key], types, f"contract {contract['id']!r} {key!r}")
        for m, item in enumerate(contract["items"]):
            where = f"contract {contract['id']!r} item #{m}"
            _expect(item, dict, where)
            for key, types in _REQUIRED_ITEM.items():
                if key not in item:
                    raise ValueError(f"not a kc check result: {where} lacks {key!r}")
                _expect(item[key], types, f"{where} {key!r}")
            if item["status"] not in STATUSES:
                raise ValueError(
                    f"not a kc check result: {where} ({item['id']}) has status {item['status']!r}, "
                    f"not one of {', '.join(STATUSES)}"
                )
            for key, types in _OPTIONAL_ITEM.items():
                if key in item:
                    _expect(item[key], types, f"{where} ({item['id']}) {key!r}")


def load_result(path: str | Path) -> dict[str, Any]:
    """Read and validate a `kc check --json` file; ValueError (with the path, and line:col for bad JSON)."""
    from obligations.jsonsafe import load as load_json

    p = Path(path)
    result = load_json(p)  # JsonInputError is a ValueError: not JSON, too deep, not readable
    try:
        validate_result(result)
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from exc
    return result


def iter_items(result: Mapping[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Every (contract, item) pair of a result, in file order."""
    for contract in result.get("contracts", []):
        for item in contract.get("items", []):
            yield contract, item


def contract_summary(contract: Mapping[str, Any]) -> dict[str, int]:
    """Count of the contract's items per status, every known status present (zero where none)."""
    counts = dict.fromkeys(STATUSES, 0)
    for item in contract.get("items", []):
        counts[item["status"]] = counts.get(item["status"], 0) + 1
    return counts


# --- claim levels -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimDescriber:
    """How one claim level is named and explained for an item (the explanation reads its evidence)."""

    claim: str
    label: Callable[[Mapping[str, Any]], str]
    explain: Callable[[Mapping[str, Any]], str]


_CLAIMS: dict[str, ClaimDescriber] = {}


def register_claim(describer: ClaimDescriber) -> ClaimDescriber:
    """Add or replace the describer for ``describer.claim``; returns it."""
    _CLAIMS[describer.claim] = describer
    return describer


def _ev(item: Mapping[str, Any]) -> Mapping[str, Any]:
    return item.get("evidence") or {}


def _fmt_int(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and not value.is_integer():
        return f"{value:g}"
    return f"{int(value):,}"


def _agreement_phrase(item: Mapping[str, Any]) -> str:
    agreement = item.get("agreement")
    if not agreement:
        return ""
    tol = item.get("tolerance")
    return f", {agreement} agreement" + (f" (tolerance {tol})" if tol is not None else "")


def _reuse(ev: Mapping[str, Any]) -> str:
    """How fresh the proof is: reused from the proof cache (with its key) or found by this run; its stability."""
    text = ""
    stab = ev.get("stability")
    if isinstance(stab, Mapping) and stab.get("runs"):
        text += (
            f"; stable: proved in {stab.get('proved')} of {stab.get('runs')} perturbed runs (rlimit "
            f"{stab.get('rlimit_min')}/{stab.get('rlimit_median')}/{stab.get('rlimit_max')} min/median/max)"
        )
    if ev.get("cache") == "hit":
        text += f"; reused from the proof cache (key {str(ev.get('cache_key'))[:16]}), not found again by this run"
    return text


def _proved(item: Mapping[str, Any]) -> str:
    ev = _ev(item)
    solver = str(ev.get("solver") or ev.get("prover") or item.get("method") or "a solver")
    assumptions = ev.get("assumptions") or []
    if assumptions:
        # The assumptions themselves are listed once, in the evidence table.
        return f"Proved by {solver} under {len(assumptions)} assumption(s) (listed under Assumptions)" + _reuse(ev)
    return f"Proved by {solver} with no assumptions beyond the contract's domain" + _reuse(ev)


def _exhausted(item: Mapping[str, Any]) -> str:
    ev = _ev(item)
    points = ev.get("points")
    text = "Checked at every point of the stated domain"
    if points is not None:
        text += f": {_fmt_int(points)} points"
        if ev.get("points_in_given") is not None:
            text += f", {_fmt_int(ev['points_in_given'])} of them inside the assumptions"
    if isinstance(ev.get("bound"), int | float) and not isinstance(ev.get("bound"), bool):
        text += f" (bound {ev['bound']})"
    return text + _agreement_phrase(item) + _reuse(ev)


def _tested_label(item: Mapping[str, Any]) -> str:
    return "parity tested" if item.get("agreement") else "ran"


def _measured(cases: Mapping[str, Any]) -> str:
    """The intervals of a measure item's cases (falsification.measure), one phrase each."""
    parts = []
    for name, m in cases.items():
        i = m.get("interval") or {}
        parts.append(
            f"{name}: median ratio {i.get('estimate')} in [{i.get('low')}, {i.get('high')}] "
            f"({m.get('trials')} trials, {i.get('confidence')} confidence) {m.get('direction')} {m.get('threshold')}"
        )
    return "; ".join(parts)


def _tested(item: Mapping[str, Any]) -> str:
    ev = _ev(item)
    if isinstance(ev.get("cases_measured"), Mapping):
        intervals = _measured(ev["cases_measured"])
        return f"Measured against peers of the same run, decided on bootstrap intervals: {intervals}"
    cases = ev.get("cases")
    n = f"{_fmt_int(cases)} cases" if cases is not None else "an unstated number of cases"
    seed = f" (seed {ev['seed']})" if "seed" in ev else ""
    if item.get("agreement"):
        return f"Parity tested on {n}{seed}{_agreement_phrase(item)}; no disagreement found (not a proof)" + _reuse(ev)
    return f"Ran on {n}{seed} without refutation (not a proof)" + _reuse(ev)


def _assumed(item: Mapping[str, Any]) -> str:
    name = _ev(item).get("assumption") or item.get("reason") or "an unnamed assumption"
    return f"Assumed, not checked: {name}"


def _violated(item: Mapping[str, Any]) -> str:
    text = "Refuted by a counterexample"
    if item.get("reason"):
        text += f": {item['reason']}"
    if item.get("replay"):
        text += f"; replay with `{item['replay']}`"
    return text


def _none(item: Mapping[str, Any]) -> str:
    status = item.get("status", "unknown")
    return f"Nothing: the item ended {status}, so it is neither proved, tested nor assumed"


for _d in (
    ClaimDescriber("proved", lambda i: "proved", _proved),
    ClaimDescriber("exhausted", lambda i: "exhaustive", _exhausted),
    ClaimDescriber("tested", _tested_label, _tested),
    ClaimDescriber("assumed", lambda i: "assumed", _assumed),
    ClaimDescriber("violated", lambda i: "violated", _violated),
    ClaimDescriber("none", lambda i: "none", _none),
):
    register_claim(_d)


def _describer(item: Mapping[str, Any]) -> ClaimDescriber:
    return _CLAIMS.get(str(item.get("claim") or "none"), _CLAIMS["none"])


def claim_label(item: Mapping[str, Any]) -> str:
    """Short name of the claim level the item's evidence supports (e.g. "parity tested")."""
    return _describer(item).label(item)


def describe_claim(item: Mapping[str, Any]) -> str:
    """One sentence saying what the evidence supports, with its counts, agreement and assumptions."""
    return _describer(item).explain(item)
