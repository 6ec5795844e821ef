"""Evidence as labelled facts: a registry of renderers keyed by the evidence's ``kind``.

Every item's evidence carries the ``kind`` of the typed class an engine wrote
(:mod:`obligations.core.evidence`). Each renderer names the kinds it renders (and, for a test's own
details, the shape it recognises), turns keys into facts and claims them. Renderers run in registration
order; whatever no renderer claimed is shown by the generic fallback, so every piece of evidence appears
exactly once and nothing is rendered that the evidence does not hold.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "timing_series",
    "histogram_bin",
    "Fact",
    "EvidenceRenderer",
    "register_evidence_renderer",
    "evidence_renderers",
    "evidence_facts",
]


@dataclass(frozen=True)
class Fact:
    """One labelled piece of evidence, already formatted as text (``block``: multi-line, shown as code)."""

    label: str
    value: str
    block: bool = False


@dataclass(frozen=True)
class EvidenceRenderer:
    """Recognises an evidence shape (``applies``) and renders it to facts, claiming the keys it used."""

    name: str
    kinds: tuple[str, ...]
    applies: Callable[[Mapping[str, Any]], bool]
    render: Callable[[Mapping[str, Any]], tuple[list[Fact], set[str]]]


_RENDERERS: dict[str, EvidenceRenderer] = {}


def register_evidence_renderer(renderer: EvidenceRenderer) -> EvidenceRenderer:
    """Add ``renderer`` (replacing one of the same name in place); returns it."""
    _RENDERERS[renderer.name] = renderer
    return renderer


def evidence_renderers() -> tuple[EvidenceRenderer, ...]:
    """The registered renderers in the order they run."""
    return tuple(_RENDERERS.values())


def _num(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{int(value):,}" if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"
    return str(value)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _solver(ev: Mapping[str, Any]) -> tuple[list[Fact], set[str]]:
    name = ev.get("solver") or ev.get("prover")
    version = ev.get("z3_version") or ev.get("sympy_version")
    facts = [Fact("Solver", " ".join(str(v) for v in (name, version) if v))]
    if "rlimit_used" in ev or "rlimit" in ev:
        used, limit = ev.get("rlimit_used"), ev.get("rlimit")
        text = _num(used) if used is not None else "?"
        facts.append(Fact("Solver resource use", f"{text} of rlimit {_num(limit)}" if limit is not None else text))
    if "wall_limit_s" in ev:
        facts.append(Fact("Wall-clock ceiling", f"{_num(ev['wall_limit_s'])} s"))
    if "assumptions" in ev:
        assumptions = ev["assumptions"] or []
        facts.append(Fact("Assumptions", "; ".join(map(str, assumptions)) if assumptions else "none"))
    if "simplified_difference" in ev:
        facts.append(Fact("Simplified difference (lhs - rhs)", str(ev["simplified_difference"])))
    if "side_conditions" in ev:
        facts.append(Fact("Side conditions proved with it", _num(ev["side_conditions"])))
    if "confirmed_concretely" in ev:
        facts.append(Fact("Solver model confirmed through the plan", _num(ev["confirmed_concretely"])))
    keys = {
        "solver",
        "prover",
        "z3_version",
        "sympy_version",
        "rlimit",
        "rlimit_used",
        "wall_limit_s",
        "assumptions",
        "simplified_difference",
        "side_conditions",
        "confirmed_concretely",
    }
    return facts, keys


def _domain_text(domain: Mapping[str, Any]) -> str:
    parts = []
    for name, rng in domain.items():
        if isinstance(rng, list | tuple) and len(rng) == 2:
            parts.append(f"{name} ∈ [{_num(rng[0])}, {_num(rng[1])}]")
        else:
            parts.append(f"{name} = {_num(rng) if isinstance(rng, int | float | str) else _json(rng)}")
    return ", ".join(parts)


def _enumeration(ev: Mapping[str, Any]) -> tuple[list[Fact], set[str]]:
    facts = [Fact("Points enumerated", f"{_num(ev['points'])} (every point of the domain)")]
    keys = {"points"}
    if "points_in_given" in ev:
        facts.append(Fact("Points satisfying the assumptions", _num(ev["points_in_given"])))
        keys.add("points_in_given")
    if "failing_points" in ev:
        facts.append(Fact("Points refuting the claim", _num(ev["failing_points"])))
        keys.add("failing_points")
    for key in ("bound", "domain"):
        value = ev.get(key)
        if isinstance(value, Mapping):
            facts.append(Fact("Domain", _domain_text(value)))
            keys.add(key)
        elif key == "bound" and value is not None and not isinstance(value, list):
            facts.append(Fact("Bound", _num(value)))
            keys.add(key)
    if "enumeration_seconds" in ev:
        facts.append(Fact("Enumeration time", f"{float(ev['enumeration_seconds']):.3g} s"))
        keys.add("enumeration_seconds")
    return facts, keys


def _sampling(ev: Mapping[str, Any]) -> tuple[list[Fact], set[str]]:
    text = _num(ev["cases"])
    if "elements" in ev:
        text += f" ({_num(ev['elements'])} elements)"
    facts = [Fact("Cases", text)]
    keys = {"cases", "elements"}
    for key, label in (("seed", "Seed"), ("profile", "Profile"), ("shrunk", "Counterexample shrunk")):
        if key in ev:
            facts.append(Fact(label, _num(ev[key])))
            keys.add(key)
    return facts, keys


def _ulp(ev: Mapping[str, Any]) -> tuple[list[Fact], set[str]]:
    hist = ev["ulp_histogram"] or {}
    ordered = sorted(hist.items(), key=lambda kv: histogram_bin(kv[0]))
    facts = [Fact("ULP histogram", ", ".join(f"{k} ULP: {_num(v)}" for k, v in ordered) or "empty")]
    if "max_ulp" in ev:
        facts.insert(0, Fact("Max ULP error", _num(ev["max_ulp"])))
    return facts, {"ulp_histogram", "max_ulp"}


ERROR_AXIS_KEYS: tuple[str, ...] = ("k", "n", "size", "sizes", "shape")


def error_axis(ev: Mapping[str, Any]) -> tuple[str, list[Any]] | None:
    """The (name, values) of the size axis that ``observed_error``/``bound`` are indexed by, if stated."""
    n = len(ev.get("observed_error") or [])
    for key in ERROR_AXIS_KEYS:
        values = ev.get(key)
        if isinstance(values, list) and len(values) == n:
            return key, values
    return None


def _error_bound(ev: Mapping[str, Any]) -> tuple[list[Fact], set[str]]:
    observed, bound = list(ev["observed_error"]), list(ev["bound"])
    keys = {"observed_error", "bound"}
    axis = error_axis(ev)
    if axis:
        keys.add(axis[0])
    pairs = [(o / b if b else float("inf"), i) for i, (o, b) in enumerate(zip(observed, bound, strict=False))]
    facts = [Fact("Observed error vs bound", f"{len(pairs)} sizes")]
    if pairs:
        worst, at = max(pairs)
        where = f" at {axis[0]} = {_num(axis[1][at])}" if axis else f" at point {at}"
        facts.append(Fact("Worst observed/bound ratio", f"{worst:.3g}{where}"))
        within = sum(1 for r, _ in pairs if r <= 1)
        facts.append(Fact("Within bound", f"{within} of {len(pairs)}"))
    return facts, keys


def histogram_bin(key: Any) -> float:
    """Sort key of a histogram bin: its number, or +inf for open bins such as ">3_or_nan"."""
    try:
        return float(key)
    except ValueError:
        return float("inf")


def timing_series(timings: Any) -> dict[str, list[float]]:
    """Name -> samples (ms) from the shapes tests report: a number, a list, or per-case dicts of ``*_ms``."""
    out: dict[str, list[float]] = {}
    if not isinstance(timings, Mapping):
        return out
    for name, v in timings.items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[str(name)] = [float(v)]
        elif isinstance(v, list) and v and all(isinstance(x, int | float) for x in v):
            out[str(name)] = [float(x) for x in v]
        elif isinstance(v, Mapping):
            for sub, x in v.items():
                if str(sub).endswith("_ms") and isinstance(x, int | float):
                    out[f"{name}\n{str(sub)[:-3]}"] = [float(x)]
    return out


def _timings(ev: Mapping[str, Any]) -> tuple[list[Fact], set[str]]:
    facts = []
    for name, samples in timing_series(ev["timings_ms"]).items():
        name = name.replace("\n", " ")
        if samples:
            med = statistics.median(samples)
            facts.append(Fact(f"Time ({name})", f"median {med:.4g} ms, min {min(samples):.4g} ms, n = {len(samples)}"))
    keys = {"timings_ms"}
    if "ratio" in ev:
        text = _num(ev["ratio"])
        if "limit" in ev:
            text += f" (limit {_num(ev['limit'])})"
            keys.add("limit")
        facts.append(Fact("Ratio ours/peer", text))
        keys.add("ratio")
    return facts, keys


def _audit(ev: Mapping[str, Any]) -> tuple[list[Fact], set[str]]:
    facts = [
        Fact(
            "Builds compiled to PTX",
            f"{_num(ev['cases'])} ({ev.get('family')}, NVRTC {ev.get('nvrtc')}, {ev.get('arch')})",
        )
    ]
    rules = ev.get("rules_applied") or {}
    facts.append(Fact("Rules applied (builds each)", ", ".join(f"{k}: {_num(v)}" for k, v in sorted(rules.items()))))
    facts.append(Fact("Findings", _num(ev.get("findings", 0))))
    if "audit_seconds" in ev:
        facts.append(Fact("Audit time", f"{float(ev['audit_seconds']):.3g} s"))
    sass = ev.get("sass") or {}
    if "not_run" in sass:
        facts.append(Fact("Machine code (SASS)", f"not audited: {sass['not_run']}"))
    elif sass:
        rules = ", ".join(f"{k}: {_num(v)}" for k, v in sorted((sass.get("rules_applied") or {}).items()))
        mix = ", ".join(f"{k} {_num(v)}" for k, v in (sass.get("opcodes") or {}).items())
        facts.append(
            Fact(
                "Machine code (SASS)",
                f"{_num(sass.get('builds'))} builds for {sass.get('arch')}; rules {rules or 'none'}; "
                f"{_num(sass.get('findings', 0))} finding(s); opcode mix {mix}",
            )
        )
    return facts, {"cases", "family", "nvrtc", "arch", "rules_applied", "findings", "audit_seconds", "sass"}


def _traceback(ev: Mapping[str, Any]) -> tuple[list[Fact], set[str]]:
    return [Fact("Traceback", str(ev["traceback"]).rstrip(), block=True)], {"traceback"}


def _assumption(ev: Mapping[str, Any]) -> tuple[list[Fact], set[str]]:
    return [Fact("Named assumption", str(ev["assumption"]))], {"assumption"}


_TESTS = ("falsify", "measure", "sweep")
for _r in (
    EvidenceRenderer("assumption", ("assume",), lambda ev: "assumption" in ev, _assumption),
    EvidenceRenderer("solver", ("z3", "sympy"), lambda ev: True, _solver),
    EvidenceRenderer("enumeration", ("enumerate",), lambda ev: "points" in ev, _enumeration),
    EvidenceRenderer("sampling", _TESTS, lambda ev: "cases" in ev, _sampling),
    EvidenceRenderer("ulp", _TESTS, lambda ev: isinstance(ev.get("ulp_histogram"), Mapping), _ulp),
    EvidenceRenderer(
        "error_bound",
        _TESTS,
        lambda ev: isinstance(ev.get("observed_error"), list) and isinstance(ev.get("bound"), list),
        _error_bound,
    ),
    EvidenceRenderer("timings", _TESTS, lambda ev: isinstance(ev.get("timings_ms"), Mapping), _timings),
    EvidenceRenderer("audit", ("audit",), lambda ev: "cases" in ev, _audit),
    EvidenceRenderer("traceback", (), lambda ev: isinstance(ev.get("traceback"), str), _traceback),
):
    register_evidence_renderer(_r)


def evidence_facts(evidence: Mapping[str, Any] | None) -> list[Fact]:
    """All facts for one item's evidence: the renderers of its kind first, then every unclaimed key verbatim."""
    ev = dict(evidence or {})
    kind = ev.pop("kind", None)
    facts: list[Fact] = []
    claimed: set[str] = set()
    for renderer in _RENDERERS.values():
        if renderer.kinds and kind not in renderer.kinds:
            continue
        remaining = {k: v for k, v in ev.items() if k not in claimed}
        if remaining and renderer.applies(remaining):
            new, keys = renderer.render(remaining)
            facts.extend(new)
            claimed |= keys
    for key in ev:
        if key not in claimed:
            value = ev[key]
            facts.append(Fact(key, _num(value) if isinstance(value, int | float | str | bool) else _json(value)))
    return facts
