"""Outcomes of checking one contract item: a status backed by evidence, never by contract text."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "Status",
    "Outcome",
    "proved",
    "exhausted",
    "passed",
    "violated",
    "unknown",
    "skipped",
    "error",
    "assumed",
]


class Status(StrEnum):
    """What the evidence supports for one item."""

    PROVED = "proved"
    EXHAUSTED = "exhausted"
    PASSED = "passed"
    VIOLATED = "violated"
    UNKNOWN = "unknown"
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
    "violated" or "none". ``evidence`` is JSON-serialisable.
    """

    status: Status
    claim: str
    evidence: dict[str, Any] = field(default_factory=dict)
    counterexample: dict[str, Any] | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON fields this outcome contributes to an item of the check result."""
        return {
            "status": self.status.value,
            "claim": self.claim,
            "reason": self.reason,
            "evidence": self.evidence,
            "counterexample": self.counterexample,
        }


def proved(**evidence: Any) -> Outcome:
    """A claim discharged by a solver or symbolic proof."""
    return Outcome(Status.PROVED, "proved", evidence)


def exhausted(**evidence: Any) -> Outcome:
    """A claim checked at every point of a stated bounded domain."""
    return Outcome(Status.EXHAUSTED, "exhausted", evidence)


def passed(**evidence: Any) -> Outcome:
    """A claim tested on the cases named in ``evidence`` (must include ``cases``) without refutation."""
    if "cases" not in evidence:
        raise ValueError("passed() needs a 'cases' count in its evidence")
    return Outcome(Status.PASSED, "tested", evidence)


def violated(counterexample: dict[str, Any], reason: str, **evidence: Any) -> Outcome:
    """A claim refuted by a concrete counterexample."""
    return Outcome(Status.VIOLATED, "violated", evidence, counterexample, reason)


def unknown(reason: str, **evidence: Any) -> Outcome:
    """Neither proved nor refuted (e.g. solver budget exhausted)."""
    return Outcome(Status.UNKNOWN, "none", evidence, None, reason)


def skipped(reason: str, **evidence: Any) -> Outcome:
    """Not checked, with the reason; never counted as passing."""
    return Outcome(Status.SKIPPED, "none", evidence, None, reason)


def error(reason: str, **evidence: Any) -> Outcome:
    """The item could not be checked because it is malformed (e.g. vacuous assumptions)."""
    return Outcome(Status.ERROR, "none", evidence, None, reason)


def assumed(name: str, reason: str, **evidence: Any) -> Outcome:
    """A named assumption: reported as such, never counted as proved."""
    return Outcome(Status.SKIPPED, "assumed", {"assumption": name, **evidence}, None, reason)
