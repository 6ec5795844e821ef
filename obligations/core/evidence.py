"""Typed evidence: one frozen class per kind of check, serialised with its ``kind`` to the result JSON.

Every engine writes one of these; reports pick their renderer by ``kind`` and render only the fields the
class declares (plus a test's own ``details``), so nothing shows a key that no engine wrote. A new kind
of check registers its class with :func:`register_evidence`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "FORMAT",
    "Evidence",
    "register_evidence",
    "evidence_kinds",
    "evidence_from_json",
    "json_safe",
    "NoEvidence",
    "Z3Evidence",
    "EnumerateEvidence",
    "SympyEvidence",
    "FalsifyEvidence",
    "MeasureEvidence",
    "SweepEvidence",
    "AssumeEvidence",
    "AuditEvidence",
    "RegimeEvidence",
    "SanitizeEvidence",
]

# Version of the result JSON: 2 adds ``kind`` to every item's evidence.
FORMAT = 2

_KINDS: dict[str, type[Evidence]] = {}


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats as strings ("NaN", "Infinity", "-Infinity"): strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        return json_safe(value.item())  # NumPy scalars
    return value


@dataclass(frozen=True)
class Evidence:
    """Base of every evidence kind: ``details`` holds what a registered test measured, verbatim."""

    kind: ClassVar[str] = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The item's ``evidence`` object: ``kind``, the declared fields that are set, then ``details``."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            if f.name != "details" and getattr(self, f.name) is not None:
                out[f.name] = getattr(self, f.name)
        out.update(self.details)
        return json_safe(out)

    def get(self, key: str, default: Any = None) -> Any:
        """Read a field or a detail by name (what the JSON would hold under ``key``)."""
        return self.to_json().get(key, default)

    def __getitem__(self, key: str) -> Any:
        data = self.to_json()
        return data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.to_json()

    def keys(self) -> list[str]:
        """The JSON keys, so ``{**evidence, ...}`` reads like the JSON object (``kind`` included)."""
        return list(self.to_json())


def register_evidence(cls: type[Evidence]) -> type[Evidence]:
    """Class decorator: register an evidence class under its ``kind``."""
    if not cls.kind or cls.kind in _KINDS:
        raise ValueError(f"evidence kind {cls.kind!r} is empty or registered twice")
    _KINDS[cls.kind] = cls
    return cls


def evidence_kinds() -> dict[str, type[Evidence]]:
    """Registered evidence classes by kind."""
    return dict(_KINDS)


def evidence_from_json(data: Mapping[str, Any] | None) -> Evidence:
    """Rebuild typed evidence from a result's JSON (unknown keys go to ``details``)."""
    data = dict(data or {})
    cls = _KINDS.get(str(data.pop("kind", "none")), NoEvidence)
    names = {f.name for f in dataclasses.fields(cls)} - {"details"}
    fields = {k: data.pop(k) for k in list(data) if k in names}
    return cls(details=data, **fields)


@register_evidence
@dataclass(frozen=True)
class NoEvidence(Evidence):
    """Nothing was checked (skipped, malformed): at most the details of why."""

    kind: ClassVar[str] = "none"


@register_evidence
@dataclass(frozen=True)
class Z3Evidence(Evidence):
    """A Z3 check of ``domain and given and not (prove and side-conditions)``."""

    kind: ClassVar[str] = "z3"
    solver: str = "z3"
    z3_version: str | None = None
    rlimit: int | None = None
    wall_limit_s: float | None = None
    assumptions: list[str] | None = None
    side_conditions: int | None = None
    rlimit_used: int | None = None
    confirmed_concretely: bool | None = None
    tactic: str | None = None  # the deterministic strategy that solved the query (obligations.z3solve)
    random_seed: int | None = None
    query_sha256: str | None = None  # of the SMT-LIB text of the claim's query
    # --z3-stability N: {runs, proved, rlimit_min, rlimit_median, rlimit_max, seconds_max} over N perturbed runs
    stability: Mapping[str, Any] | None = None
    cache: str | None = None  # "hit": reused from the proof cache; "miss": solved here (and stored if proved)
    cache_key: str | None = None


@register_evidence
@dataclass(frozen=True)
class EnumerateEvidence(Evidence):
    """Every point of a bounded domain evaluated through the plan."""

    kind: ClassVar[str] = "enumerate"
    points: int | None = None
    points_in_given: int | None = None
    bound: Mapping[str, Any] | None = None
    enumeration_seconds: float | None = None
    failing_points: int | None = None
    cache: str | None = None  # "hit": reused from the proof cache; "miss": enumerated here
    cache_key: str | None = None


@register_evidence
@dataclass(frozen=True)
class SympyEvidence(Evidence):
    """A symbolic identity simplified by sympy."""

    kind: ClassVar[str] = "sympy"
    prover: str = "sympy"
    sympy_version: str | None = None
    simplified_difference: str | None = None
    cache: str | None = None  # "hit": reused from the proof cache; "miss": simplified here
    cache_key: str | None = None


@register_evidence
@dataclass(frozen=True)
class FalsifyEvidence(Evidence):
    """A registered falsification test's run: cases, seed, and the agreement the engine applied."""

    kind: ClassVar[str] = "falsify"
    cases: int | None = None
    seed: int | None = None


@register_evidence
@dataclass(frozen=True)
class MeasureEvidence(Evidence):
    """A registered measurement (timings, ratios, error against a bound)."""

    kind: ClassVar[str] = "measure"
    cases: int | None = None
    seed: int | None = None


@register_evidence
@dataclass(frozen=True)
class SweepEvidence(Evidence):
    """An exhaustive sweep of an operation over a whole input format."""

    kind: ClassVar[str] = "sweep"
    cases: int | None = None


@register_evidence
@dataclass(frozen=True)
class AssumeEvidence(Evidence):
    """A named assumption: not checked."""

    kind: ClassVar[str] = "assume"
    assumption: str | None = None


@register_evidence
@dataclass(frozen=True)
class AuditEvidence(Evidence):
    """A compiled-code audit: builds compiled to PTX, rules applied per build, findings."""

    kind: ClassVar[str] = "audit"
    cases: int | None = None
    family: str | None = None
    nvrtc: str | None = None
    arch: str | None = None
    rules_applied: Mapping[str, int] | None = None
    findings: int | None = None
    audit_seconds: float | None = None
    # the machine-code level: arch, builds, rules applied, findings, opcode mix, seconds; or {"not_run": why}
    sass: Mapping[str, Any] | None = None
    cache: str | None = None  # "hit": reused from the proof cache; "miss": compiled here (stored if passed)
    cache_key: str | None = None


@register_evidence
@dataclass(frozen=True)
class RegimeEvidence(Evidence):
    """A plan's regimes: coverage proved by Z3 and the smallest witness of each regime."""

    kind: ClassVar[str] = "regimes"
    regimes: list[str] | None = None
    plan: str | None = None
    rlimit: int | None = None
    witnesses: Mapping[str, Mapping[str, Any]] | None = None
    # guard conjunct -> {guard, accept: witness found, reject: witness found, implied: why none is needed}
    boundaries: Mapping[str, Mapping[str, Any]] | None = None
    cache: str | None = None  # "hit": reused from the proof cache; "miss": solved here (stored if proved)
    cache_key: str | None = None


@register_evidence
@dataclass(frozen=True)
class SanitizeEvidence(Evidence):
    """compute-sanitizer verdicts per tool over a family's workload; ``shared``: the run's tool processes that ran it
    with the run's other workloads (how many, whether this item started them, each one's name, exit, seconds)."""

    kind: ClassVar[str] = "sanitize"
    cases: int | None = None
    workload: str | None = None
    verdicts: Mapping[str, Mapping[str, Any]] | None = None
    shared: Mapping[str, Any] | None = None
