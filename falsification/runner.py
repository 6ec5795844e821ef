"""Running a falsification item: Hypothesis picks batches, arrays check them, failures shrink to one element.

Phase 1: Hypothesis draws a :class:`~falsification.strategies.BatchSpec` (seed, size, mix, a few explicit
special elements, scalars, layout); the batch is expanded on the device and evaluated vectorised (the
kernel once, the reference once, the agreement once), so each example checks up to millions of elements.
A disagreement fails the example and Hypothesis shrinks the spec (smaller size, fewer and simpler explicit
elements, simpler scalars). Phase 2 takes the first disagreeing element of the shrunk batch and, when it
also fails on its own (a batch of one), minimises its operand bits directly: each round evaluates every
simpler candidate (bits cleared, sign dropped, common values) as one vectorised batch and keeps the
simplest that still fails. The counterexample names that element, its input bits, native and reference
bits, the ULP distance and a ``replay`` command that re-checks exactly that case.

Runs are deterministic for a given seed (Hypothesis ``seed``, no example database).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, example, given, settings
from hypothesis import seed as hseed
from hypothesis.errors import HypothesisException

from falsification.agreement import NAN_MISMATCH, Agreement
from falsification.registry import FalsifyContext, get_test
from falsification.strategies import BatchSpec, batch_specs, generate_bits, layout_arrays
from obligations.core.results import Outcome, error, passed, violated
from spec.elementwise import Reference

__all__ = [
    "Budget",
    "PROFILES",
    "NativeResult",
    "Subject",
    "Verdict",
    "budget_for",
    "evaluate",
    "falsify",
    "minimise_element",
    "replay",
    "replay_command",
    "find_item",
]


@dataclass(frozen=True)
class Budget:
    """How hard one item tries: Hypothesis examples, largest batch, wall-clock budget for generation."""

    max_examples: int
    max_size: int
    budget_s: float
    max_explicit: int = 6
    minimise_rounds: int = 40


PROFILES: dict[str, Budget] = {
    # CPU CI: each item well under ~5 s on the host.
    "quick": Budget(max_examples=30, max_size=8192, budget_s=2.0),
    # GPU: batches of up to 4M elements, a few hundred examples.
    "full": Budget(max_examples=200, max_size=1 << 22, budget_s=30.0),
}


def budget_for(ctx: FalsifyContext) -> Budget:
    """The profile's budget with the item's ``max_examples``/``max_size``/``budget_s`` params applied."""
    b = PROFILES.get(ctx.profile, PROFILES["quick"])
    p = ctx.params
    return replace(
        b, **{k: type(getattr(b, k))(p[k]) for k in ("max_examples", "max_size", "budget_s") if k in p}
    )


@dataclass(frozen=True)
class NativeResult:
    """Native outputs (flat uint32 bit arrays) and whether the guard cell past the end is untouched."""

    outputs: list
    guard_ok: bool = True


@dataclass(frozen=True)
class Subject:
    """What an item checks: a native evaluation and a reference, both over operand bit arrays.

    ``native(views, scalars) -> NativeResult`` receives operands in the batch's layout (possibly strided
    or broadcast views); ``reference(flat, scalars) -> list[Reference]`` receives the flat C-order
    broadcast operands. ``scalars`` are uint32 bit patterns. ``evidence`` describes the build.
    """

    name: str
    arity: int
    native: Callable[[list, tuple], NativeResult]
    reference: Callable[[list, tuple], list]
    xp: ModuleType = np
    n_scalars: int = 0
    operand_names: tuple[str, ...] = ()
    scalar_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ("r",)
    evidence: dict[str, Any] = field(default_factory=dict)
    layouts: tuple[str, ...] = ("contiguous",)
    mixes: tuple[str, ...] | None = None
    prepare: Callable[[list], list] | None = None
    scalar_strategy: Any = None


@dataclass(frozen=True)
class Verdict:
    """One batch judged: size, first bad element (or None), count, largest ULP distance, details."""

    n: int
    first_bad: int | None
    bad_count: int
    max_ulp: int | None
    guard_ok: bool
    bad: Any
    native: list
    refs: list
    flat: list
    distances: list

    @property
    def failed(self) -> bool:
        """True when any element disagrees or the kernel wrote past the end."""
        return self.first_bad is not None or not self.guard_ok


class _Disagreement(AssertionError):
    def __init__(self, spec: BatchSpec, verdict: Verdict) -> None:
        super().__init__(f"{verdict.bad_count} disagreement(s) in a batch of {verdict.n}")
        self.spec, self.verdict = spec, verdict


def _flat(xp: ModuleType, views: list) -> list:
    return [xp.ascontiguousarray(v).reshape(-1) for v in xp.broadcast_arrays(*views)] if views else []


def evaluate(subject: Subject, agreement: Agreement, views: list, scalars: tuple) -> Verdict:
    """Run native and reference once on a batch and judge every element with ``agreement``."""
    xp = subject.xp
    if subject.prepare is not None:
        views = subject.prepare(views)
    flat = _flat(xp, views)
    first = subject.native(views, scalars)
    if agreement.runs > 1:
        refs = [Reference(b) for b in first.outputs]
        natives = [subject.native(views, scalars).outputs for _ in range(agreement.runs - 1)]
    else:
        refs = subject.reference(flat, scalars)
        natives = [first.outputs]
    n = int(flat[0].size) if flat else 0
    bad = xp.zeros(n, dtype=bool)
    dists, max_ulp = [], None
    for outs in natives:
        for nat, ref in zip(outs, refs, strict=True):
            c = agreement.compare(nat[:n], ref.bits, ref.alt, flat)
            bad |= c.bad
            dists.append(c.distance)
            if c.distance is not None and n:
                finite = c.distance[c.distance < NAN_MISMATCH]
                if finite.size:
                    max_ulp = max(max_ulp or 0, int(finite.max()))
    count = int(bad.sum()) if n else 0
    first_bad = int(xp.argmax(bad)) if count else None
    return Verdict(n, first_bad, count, max_ulp, first.guard_ok, bad, natives[-1], refs, flat, dists)


def _hex(v: Any) -> str:
    return f"0x{int(v) & 0xFFFFFFFF:08X}"


def _f32(v: int) -> str:
    return repr(float(np.array([v], dtype=np.uint32).view(np.float32)[0]))


def _element(subject: Subject, verdict: Verdict, i: int) -> dict[str, Any]:
    """JSON description of element ``i`` of a judged batch."""
    names = subject.operand_names or tuple(f"x{k}" for k in range(subject.arity))
    ops = [int(f[i]) for f in verdict.flat]
    out: dict[str, Any] = {
        "index": i,
        "operands": {nm: _hex(b) for nm, b in zip(names, ops, strict=True)},
        "operand_values": {nm: _f32(b) for nm, b in zip(names, ops, strict=True)},
        "outputs": {},
    }
    per = len(subject.output_names)
    for j, name in enumerate(subject.output_names):
        nat, ref = int(verdict.native[j][i]), int(verdict.refs[j].bits[i])
        d = verdict.distances[len(verdict.distances) - per + j]
        entry = {
            "native": _hex(nat),
            "reference": _hex(ref),
            "native_value": _f32(nat),
            "reference_value": _f32(ref),
        }
        if verdict.refs[j].alt is not None and int(verdict.refs[j].alt[i]) != ref:
            entry["reference_alt"] = _hex(verdict.refs[j].alt[i])
        if d is not None:
            dv = int(d[i])
            entry["ulp_distance"] = "nan-mismatch" if dv >= NAN_MISMATCH else dv
        out["outputs"][name] = entry
    return out


def _simplicity(bits: tuple[int, ...]) -> tuple:
    """Order for minimisation: fewer set magnitude bits, then smaller magnitudes, then positive."""
    mags = [b & 0x7FFFFFFF for b in bits]
    return (sum(bin(m).count("1") for m in mags), tuple(mags), tuple(b >> 31 for b in bits))


_COMMON = (
    0x00000000,
    0x80000000,
    0x3F800000,
    0x00000001,
    0x00800000,
    0x7F800000,
    0x7F800001,
    0x7FC00000,
    0x40000000,
)


def _candidates(bits: tuple[int, ...]) -> list[tuple[int, ...]]:
    out = set()
    for k, b in enumerate(bits):
        alts = set(_COMMON) | {b & 0x7FFFFFFF}
        alts |= {b & ~(1 << j) for j in range(32) if b >> j & 1}
        alts |= {b & ~((1 << j) - 1) for j in (4, 8, 12, 16, 20, 23)}
        for a in alts:
            cand = bits[:k] + (a & 0xFFFFFFFF,) + bits[k + 1 :]
            if _simplicity(cand) < _simplicity(bits):
                out.add(cand)
    return sorted(out, key=_simplicity)


def _batch(xp: ModuleType, tuples: list[tuple[int, ...]], arity: int) -> list:
    return [xp.asarray(np.array([t[k] for t in tuples], dtype=np.uint32)) for k in range(arity)]


def minimise_element(
    subject: Subject, agreement: Agreement, bits: tuple[int, ...], scalars: tuple, rounds: int = 40
) -> tuple[tuple[int, ...], Verdict] | None:
    """Shrink a failing operand tuple to a simpler one failing on its own; None if it passes alone."""
    alone = evaluate(subject, agreement, _batch(subject.xp, [bits], subject.arity), scalars)
    if alone.first_bad is None:
        return None
    best, best_v = bits, alone
    for _ in range(rounds):
        cands = _candidates(best)
        if not cands:
            break
        v = evaluate(subject, agreement, _batch(subject.xp, cands, subject.arity), scalars)
        if v.first_bad is None:
            break
        bad_idx = [int(i) for i in np.flatnonzero(_to_np(v.bad))]
        moved = False
        # Candidates are sorted simplest first; confirm on its own, since a batch may fail by position.
        order = bad_idx[:4]
        if (
            len(bad_idx) == 1
        ):  # a lone failure may be positional (e.g. the last element): try the simplest too
            order = sorted(set(order) | set(range(min(2, len(cands)))))
        for i in order:
            single = evaluate(subject, agreement, _batch(subject.xp, [cands[i]], subject.arity), scalars)
            if single.first_bad is not None:
                best, best_v, moved = cands[i], single, True
                break
        if not moved:
            break
    return best, best_v


def _to_np(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def replay_command(ctx: FalsifyContext, bits: tuple[int, ...] | None, scalars: tuple = ()) -> str:
    """Shell command that re-checks exactly this case (one element by bits, else the seeded run)."""
    path = ctx.contract_path or "<contract>"
    item = ctx.item.get("id", "<item>")
    if bits is not None:
        cmd = f"kc replay {path} {item} --bits {','.join(_hex(b) for b in bits)}"
        if scalars:
            cmd += f" --scalars {','.join(_hex(s) for s in scalars)}"
        return cmd + f" --device {ctx.device}"
    return f"kc check {path} --only {item} --seed {ctx.seed} --profile {ctx.profile} --device {ctx.device}"


def _counterexample(
    ctx: FalsifyContext,
    subject: Subject,
    agreement: Agreement,
    spec: BatchSpec,
    verdict: Verdict,
    rounds: int,
) -> dict[str, Any]:
    scalars = spec.scalars
    names = subject.scalar_names or tuple(f"s{k}" for k in range(subject.n_scalars))
    base: dict[str, Any] = {
        "batch": spec.to_json(),
        "seed": ctx.seed,
        "scalars": {nm: _hex(s) for nm, s in zip(names, scalars, strict=True)},
    }
    if verdict.first_bad is None:  # only the guard cell was written
        base.update(
            kind="out_of_bounds_write",
            size=verdict.n,
            detail=f"the kernel wrote element {verdict.n} of a {verdict.n}-element output",
            replay=replay_command(ctx, None),
        )
        return base
    i = verdict.first_bad
    bits = tuple(int(f[i]) for f in verdict.flat)
    shrunk = minimise_element(subject, agreement, bits, scalars, rounds)
    if shrunk is None:
        base.update(
            kind="position_dependent",
            size=verdict.n,
            disagreements=verdict.bad_count,
            element=_element(subject, verdict, i),
            replay=replay_command(ctx, None),
            detail="the element agrees on its own: the failure depends on its batch (size/position)",
        )
        return base
    sbits, sv = shrunk
    base.update(
        kind="element",
        first_in_batch=_element(subject, verdict, i),
        size=1,
        element=_element(subject, sv, 0),
        replay=replay_command(ctx, sbits, scalars),
        batch_disagreements=verdict.bad_count,
        batch_size=verdict.n,
    )
    return base


def _replay(ctx: FalsifyContext, subject: Subject, agreement: Agreement) -> Outcome:
    rp = ctx.item["replay"]
    bits = tuple(int(str(b), 0) for b in rp["bits"])
    scalars = tuple(int(str(s), 0) for s in rp.get("scalars", ()))
    if len(bits) != subject.arity or len(scalars) != subject.n_scalars:
        return error(f"replay needs {subject.arity} operand bits and {subject.n_scalars} scalars")
    v = evaluate(subject, agreement, _batch(subject.xp, [bits], subject.arity), scalars)
    ev = {"replayed": True, "agreement": agreement.describe(), **subject.evidence}
    if v.failed:
        ce = {
            "kind": "element",
            "element": _element(subject, v, 0),
            "size": 1,
            "replay": replay_command(ctx, bits, scalars),
        }
        return violated(ce, f"{subject.name}: the replayed element disagrees", **ev)
    return passed(cases=1, **ev)


def falsify(ctx: FalsifyContext, subject: Subject, agreement: Agreement) -> Outcome:
    """Check ``subject`` under ``agreement`` with the context's budget and seed: pass, or a shrunk case."""
    if "replay" in ctx.item:
        return _replay(ctx, subject, agreement)
    budget = budget_for(ctx)
    xp = subject.xp
    stats = {"cases": 0, "batches": 0, "skipped": 0, "max_ulp": None, "eval_s": 0.0}
    failing: dict[str, Any] = {}
    t0 = time.perf_counter()
    strategy = batch_specs(
        subject.arity,
        subject.n_scalars,
        budget.max_size,
        budget.max_explicit,
        mixes=subject.mixes or ("balanced", "subnormal", "special", "correlated", "uniform"),
        layouts=subject.layouts,
        scalar_bits=subject.scalar_strategy,
    )
    first_spec = BatchSpec(
        seed=ctx.seed, size=budget.max_size, scalars=tuple(0x3F800000 for _ in range(subject.n_scalars))
    )

    @settings(
        max_examples=budget.max_examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        print_blob=False,
    )
    @hseed(ctx.seed)
    @example(first_spec)
    @given(strategy)
    def check(spec: BatchSpec) -> None:
        if not failing and time.perf_counter() - t0 > budget.budget_s:
            stats["skipped"] += 1  # budget spent before any failure: stop evaluating, let Hypothesis finish
            return
        ops = generate_bits(spec, subject.arity, xp)
        views = layout_arrays(ops, spec.layout, xp)
        ts = time.perf_counter()
        v = evaluate(subject, agreement, views, spec.scalars)
        stats["eval_s"] += time.perf_counter() - ts
        stats["cases"] += v.n
        stats["batches"] += 1
        if v.max_ulp is not None:
            stats["max_ulp"] = max(stats["max_ulp"] or 0, v.max_ulp)
        if v.failed:
            failing["spec"], failing["verdict"] = spec, v
            raise _Disagreement(spec, v)

    found: _Disagreement | None = None
    try:
        check()
    except _Disagreement as exc:
        found = exc
    except HypothesisException as exc:  # e.g. Flaky: a failure that did not reproduce
        return error(
            f"{subject.name}: Hypothesis could not settle a failure ({type(exc).__name__}: {exc})",
            seed=ctx.seed,
            **subject.evidence,
        )
    wall = time.perf_counter() - t0
    evidence = {
        "seed": ctx.seed,
        "profile": ctx.profile,
        "device": ctx.device,
        "agreement": agreement.describe(),
        "batches": stats["batches"],
        "elements": stats["cases"],
        "max_ulp_observed": stats["max_ulp"],
        "wall_s": round(wall, 4),
        "elements_per_s": round(stats["cases"] / stats["eval_s"], 1) if stats["eval_s"] else None,
        "budget": {
            "max_examples": budget.max_examples,
            "max_size": budget.max_size,
            "budget_s": budget.budget_s,
        },
        **subject.evidence,
    }
    if found is None:
        return passed(cases=stats["cases"], **evidence)
    ce = _counterexample(ctx, subject, agreement, found.spec, found.verdict, budget.minimise_rounds)
    what = {
        "element": "an element disagrees",
        "position_dependent": "a batch disagrees (position-dependent)",
        "out_of_bounds_write": "the kernel wrote past the end of its output",
    }[ce["kind"]]
    return violated(ce, f"{subject.name}: {what} under {agreement.name}", cases=stats["cases"], **evidence)


def find_item(contract: dict[str, Any], item_id: str) -> dict[str, Any] | None:
    """The falsification entry with ``id == item_id`` anywhere in a loaded contract, or None."""
    stack: list[Any] = [contract]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("id") == item_id and "test" in node:
                return node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def replay(
    item: dict[str, Any],
    *,
    bits: list,
    scalars: list | tuple = (),
    device: str = "host",
    contract: dict[str, Any] | None = None,
    contract_path: str = "",
    seed: int = 0,
) -> Outcome:
    """Re-check one element (operand ``bits``, hex strings or ints) of a contract item on ``device``.

    ``device`` must already be resolved ("host" or "cuda"); the CLI resolves it and fails loudly first.
    """
    test = get_test(item["test"])
    if test is None:
        return error(f"unknown falsification test {item['test']!r}")
    if device not in test.devices:
        from obligations.core.results import skipped

        return skipped(f"test {test.name} does not support device {device!r}")
    rp_item = {**item, "replay": {"bits": [str(b) for b in bits], "scalars": [str(s) for s in scalars]}}
    ctx = FalsifyContext(
        device=device,
        profile="quick",
        seed=seed,
        item=rp_item,
        contract=contract or {},
        contract_path=contract_path,
    )
    return test.run(ctx)
