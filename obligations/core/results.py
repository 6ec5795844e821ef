"""Outcomes of checking one contract item: a status backed by evidence, never by contract text."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from obligations.core.evidence import AssumeEvidence, Evidence, FalsifyEvidence, NoEvidence, json_safe

__all__ = [
    "Status",
    "Outcome",
    "proved",
    "exhausted",
    "passed",
    "violated",
    "unknown",
    "inconclusive",
    "skipped",
    "error",
    "assumed",
    "with_evidence_kind",
    "apply_expectation",
]


class Status(StrEnum):
    """What the evidence supports for one item."""

    PROVED = "proved"
    EXHAUSTED = "exhausted"
    PASSED = "passed"
    VIOLATED = "violated"
    # A violation the contract declares (``expect: violated``, with its reason): counted apart, not a failure.
    VIOLATED_EXPECTED = "violated_expected"
    UNKNOWN = "unknown"
    # A measurement whose interval still straddles its threshold after the measuring budget: not a pass.
    INCONCLUSIVE = "inconclusive"
    SKIPPED = "skipped"
    ERROR = "error"

    @property
    def is_failure(self) -> bool:
        """True for statuses that fail `kc check` without --strict."""
        return self in (Status.VIOLATED, Status.ERROR)


@dataclass(frozen=True)
class Outcome:
    """The result of one engine or test run: status, claim level, evidence and an optional counterexample.

    ``claim`` is the level the evidence supports: "proved", "exhausted", "tested", "assumed",
    "violated" or "none". ``evidence`` is typed (:mod:`obligations.core.evidence`).
    """

    status: Status
    claim: str
    evidence: Evidence = field(default_factory=NoEvidence)
    counterexample: dict[str, Any] | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON fields this outcome contributes to an item of the check result (strict JSON)."""
        return {
            "status": self.status.value,
            "claim": self.claim,
            "reason": self.reason,
            "evidence": self.evidence.to_json(),
            "counterexample": json_safe(self.counterexample),
        }


def _evidence(evidence: Evidence | None, legacy: dict[str, Any]) -> Evidence:
    """Typed evidence, or keyword evidence from a registered test (a test's run when it counts cases)."""
    legacy.pop("kind", None)  # spread from another evidence object: the kind is this outcome's to decide
    if evidence is not None:
        if legacy:
            return replace(evidence, details={**evidence.details, **legacy})
        return evidence
    if "cases" in legacy:
        cases, seed = legacy.pop("cases"), legacy.pop("seed", None)
        return FalsifyEvidence(cases=cases, seed=seed, details=legacy)
    return NoEvidence(details=legacy)


def with_evidence_kind(outcome: Outcome, cls: type[Evidence]) -> Outcome:
    """``outcome`` with generic test evidence re-typed as ``cls`` (the engine that ran it knows its kind).

    Anything that is not an Outcome is returned unchanged: the caller reports it as the test's error.
    """
    if not isinstance(outcome, Outcome):
        return outcome
    ev = outcome.evidence
    if type(ev) not in (FalsifyEvidence, NoEvidence) or cls is type(ev):
        return outcome
    data = ev.to_json()
    data.pop("kind")
    names = {f for f in cls.__dataclass_fields__} - {"details"}
    fields = {k: data.pop(k) for k in list(data) if k in names}
    return replace(outcome, evidence=cls(details=data, **fields))


def proved(evidence: Evidence | None = None, /, **details: Any) -> Outcome:
    """A claim discharged by a solver or symbolic proof."""
    return Outcome(Status.PROVED, "proved", _evidence(evidence, details))


def exhausted(evidence: Evidence | None = None, /, **details: Any) -> Outcome:
    """A claim checked at every point of a stated bounded domain."""
    return Outcome(Status.EXHAUSTED, "exhausted", _evidence(evidence, details))


def passed(evidence: Evidence | None = None, /, **details: Any) -> Outcome:
    """A claim tested on the cases its evidence counts (``cases`` is required) without refutation."""
    ev = _evidence(evidence, details)
    if ev.get("cases") is None:
        raise ValueError("passed() needs a 'cases' count in its evidence")
    return Outcome(Status.PASSED, "tested", ev)


def violated(
    counterexample: dict[str, Any], reason: str, evidence: Evidence | None = None, /, **details: Any
) -> Outcome:
    """A claim refuted by a concrete counterexample."""
    return Outcome(Status.VIOLATED, "violated", _evidence(evidence, details), counterexample, reason)


def unknown(reason: str, evidence: Evidence | None = None, /, **details: Any) -> Outcome:
    """Neither proved nor refuted (e.g. solver budget exhausted)."""
    return Outcome(Status.UNKNOWN, "none", _evidence(evidence, details), None, reason)


def inconclusive(reason: str, evidence: Evidence | None = None, /, **details: Any) -> Outcome:
    """A measurement that neither cleared nor missed its threshold within its budget (the interval in evidence)."""
    return Outcome(Status.INCONCLUSIVE, "none", _evidence(evidence, details), None, reason)


def skipped(reason: str, evidence: Evidence | None = None, /, **details: Any) -> Outcome:
    """Not checked, with the reason; never counted as passing."""
    return Outcome(Status.SKIPPED, "none", _evidence(evidence, details), None, reason)


def error(reason: str, evidence: Evidence | None = None, /, **details: Any) -> Outcome:
    """The item could not be checked because it is malformed (e.g. vacuous assumptions)."""
    return Outcome(Status.ERROR, "none", _evidence(evidence, details), None, reason)


def assumed(name: str, reason: str) -> Outcome:
    """A named assumption: reported as such, never counted as proved."""
    return Outcome(Status.SKIPPED, "assumed", AssumeEvidence(assumption=name), None, reason)


def apply_expectation(outcome: Outcome, item: dict[str, Any]) -> Outcome:
    """``outcome`` under the item's ``expect: violated`` (pytest's strict xfail); unchanged without one.

    A reproduced violation becomes ``violated_expected`` (its counterexample and evidence kept); an item that
    holds (proved, exhausted, passed) is an ``error``: the expectation is stale (the vendor fixed something), and
    the contract must be updated. Other statuses (skipped, unknown, inconclusive, error) pass through.
    """
    if item.get("expect") != "violated":
        return outcome
    why = str(item.get("expect_reason") or "")
    if outcome.status is Status.VIOLATED:
        return replace(
            outcome,
            status=Status.VIOLATED_EXPECTED,
            reason=f"expected violation ({why}): {outcome.reason}",
        )
    if outcome.status in (Status.PROVED, Status.EXHAUSTED, Status.PASSED):
        return replace(
            outcome,
            status=Status.ERROR,
            claim="none",
            reason=f"expected to be violated ({why}) but it {outcome.status.value}: the expectation is stale, "
            "update the contract (drop 'expect' or restate the claim)",
        )
    return outcome
