"""Typed evidence: each kind round-trips through JSON, engines write their kind, reports read only real keys."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from obligations.core.evidence import (
    FORMAT,
    EnumerateEvidence,
    FalsifyEvidence,
    SympyEvidence,
    Z3Evidence,
    evidence_from_json,
    evidence_kinds,
)
from obligations.core.results import passed, proved, with_evidence_kind
from obligations.reporting.evidence import _enumeration, _solver, evidence_renderers


@pytest.mark.parametrize("kind", sorted(evidence_kinds()))
def test_every_kind_round_trips_through_strict_json(kind):
    cls = evidence_kinds()[kind]
    ev = cls(details={"observed": float("nan"), "peak": float("inf")})
    text = json.dumps(ev.to_json(), allow_nan=False)  # strict JSON: no bare NaN/Infinity
    back = evidence_from_json(json.loads(text))
    assert type(back) is cls and back.to_json()["kind"] == kind
    assert back.details == {"observed": "NaN", "peak": "Infinity"}


def test_keyword_evidence_from_a_test_is_typed_by_the_engine_that_ran_it():
    out = passed(cases=7, seed=3, agreement="bitwise")
    assert isinstance(out.evidence, FalsifyEvidence) and out.evidence.cases == 7
    measured = with_evidence_kind(out, evidence_kinds()["measure"])
    assert measured.to_json()["evidence"] == {"kind": "measure", "cases": 7, "seed": 3, "agreement": "bitwise"}
    with pytest.raises(ValueError):
        passed(seed=1)  # a pass without a case count is not evidence


def test_outcomes_serialise_non_finite_floats_as_strings():
    out = proved(Z3Evidence(rlimit=5), ratio=math.nan)
    assert json.dumps(out.to_json(), allow_nan=False)
    assert FORMAT == 2


@pytest.mark.parametrize(
    "renderer, classes", [(_solver, (Z3Evidence, SympyEvidence)), (_enumeration, (EnumerateEvidence,))]
)
def test_renderers_claim_only_keys_their_evidence_classes_declare(renderer, classes):
    declared = {"kind"} | {f.name for cls in classes for f in dataclasses.fields(cls)}
    full = {name: 1 for name in declared - {"details", "bound", "assumptions"}}
    _, claimed = renderer({**full, "points": 1, "assumptions": []})
    assert claimed <= declared, claimed - declared


def test_every_renderer_names_registered_kinds():
    kinds = set(evidence_kinds())
    for r in evidence_renderers():
        assert set(r.kinds) <= kinds, (r.name, r.kinds)
