"""The falsification engine: one driver for every family's agreement checks.

A family test declares a :class:`Check`: how a case becomes inputs (``inputs``), the native callable
(``native``), the reference (``reference``), the input strategy (``cases``), the :class:`Agreement` that
judges native against reference, and its explicit cases (regime witnesses and boundary sizes plug in
there). :func:`run` does the rest, the same way for every family:

1. Budget and seed: :attr:`FalsifyContext.budget` (typed, from :mod:`falsification.profiles`) and the item's
   seed; Hypothesis runs with no example database, explicit cases first, then draws, shrinking a failure.
2. Agreement: the item's ``agreement:`` field, where stated, must be the kind the check applies; the
   engine judges every output element with it and records ``agreement`` (kind and parameters) itself.
3. A failure is minimised: where the check has :class:`Elements`, the first disagreeing element is
   re-checked alone and its operand bits are shrunk (bits cleared, sign dropped, common values);
   otherwise Hypothesis' shrunk case is the counterexample. A native call that raises refutes too.
4. Replay: a typed :class:`~falsification.registry.Replay` in the context re-checks exactly one case;
   :func:`replay_command` is the one place the command text is built.
5. Evidence comes from :func:`evidence` (seed, profile, device, agreement, cases, timing and the check's
   own description), so every family writes the same keys.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hseed
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException

from falsification.agreement import NAN_MISMATCH, Agreement, Expected, make_agreement, max_finite
from falsification.profiles import Budget
from falsification.registry import FalsifyContext, Replay, get_test
from obligations.core.device import DeviceUnavailable
from obligations.core.execution import noting
from obligations.core.plans import split_witnesses
from obligations.core.results import Outcome, error, passed, skipped, violated

__all__ = [
    "Check",
    "DrawCodec",
    "Elements",
    "Judgement",
    "NativeResult",
    "run",
    "judge",
    "evidence",
    "outcome_passed",
    "outcome_violated",
    "item_agreement",
    "check_stated_agreement",
    "replay_command",
    "minimise_element",
    "find_item",
    "replay",
    "evidence_dict",
    "with_evidence",
    "BINARY32_COMMON",
    "WARMUP",
    "time_ms",
    "witness_cases",
    "rejected_cases",
    "regime_counts",
    "boundary_counts",
    "set_pipelined",
    "seeded_find",
    "no_mined_constants",
]

C = TypeVar("C")

# Values a minimised operand is tried at first: zeros, one, the smallest subnormal and normal, Inf, NaNs, 2.
BINARY32_COMMON: tuple[int, ...] = (
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


@dataclass(frozen=True)
class NativeResult:
    """Native outputs and whether the guard cell past the end of each output is untouched."""

    outputs: list
    guard_ok: bool = True


@dataclass(frozen=True)
class Elements(Generic[C]):
    """How a check's cases split into elements whose operand bits the engine minimises one by one.

    ``operands(inputs, i)``: the operand bit tuple of element ``i``; ``batch(tuples, case)``: a case of
    exactly those elements (in order), keeping ``case``'s scalars; ``describe(inputs, i)``: JSON of the
    element's operands; ``scalars(case)``: the case's scalar bits (replayed with ``--scalars``).
    """

    operands: Callable[[Any, int], tuple[int, ...]]
    batch: Callable[[list[tuple[int, ...]], C], C]
    describe: Callable[[Any, int], dict[str, Any]]
    scalars: Callable[[C], tuple[int, ...]] = lambda case: ()
    scalar_names: tuple[str, ...] = ()
    common: tuple[int, ...] = BINARY32_COMMON
    width: int = 32


@dataclass(frozen=True)
class DrawCodec(Generic[C]):
    """How a check's Hypothesis draws may be stored and reused by the run's :class:`~falsification.registry.DrawStore`.

    While every example passes, the cases Hypothesis draws depend only on the strategy, the seed, ``max_examples`` and
    the Hypothesis version (:func:`_explore` relies on it to draw in a thread): ``key`` names everything the check's
    strategy depends on besides the project's source (the store adds that and the versions), and ``encode``/``decode``
    map a case to JSON and back exactly (a draw list that does not round-trip is never stored).
    """

    key: Mapping[str, Any]
    encode: Callable[[C], Any]
    decode: Callable[[Any], C]


@dataclass(frozen=True)
class Check(Generic[C]):
    """What a family test declares; :func:`run` drives it.

    ``inputs(case)`` materialises a case once (arrays on the run's device); ``native(inputs)`` returns the
    outputs (an array, a list of arrays or a :class:`NativeResult`); ``reference(inputs)`` returns an
    :class:`~falsification.agreement.Expected` per output (a single one for one output). ``operands``
    gives the flat float operands a bound callable of the agreement reads. ``count(judgement)`` is what one
    case adds to the evidence's ``cases`` (default 1; elementwise counts elements). ``encode``/``decode``
    map a case to and from the integers of a replay; ``describe`` is a case's JSON in a counterexample.
    ``budget_stop``: stop evaluating new draws once the budget's seconds are spent (no failure pending).
    ``from_witness(values)``: the case a plan regime's witness (plan values) launches, run before the explicit
    cases (None: a witness this check cannot build, left unreached); ``regime_of(case)``: the regimes a case
    selects (counted in ``regimes_reached``). A guard's boundary witnesses (``"<conjunct> @accept"`` and
    ``"@reject"``) become cases the same way: an accepted one is judged like any case, a rejected one must make
    the native call raise one of ``refuses`` (the entry point's guard exception) and fails if it runs or raises
    anything else; each is counted in ``boundaries_reached``.
    ``alternative(inputs)``: the reference under another evaluation order; the engine counts the cases whose
    bits it changes (``order_sensitive_cases``), and flags ``order_insensitive`` where none did.
    """

    name: str
    inputs: Callable[[C], Any]
    native: Callable[[Any], Any]
    reference: Callable[[Any], Any]
    agreement: Agreement
    cases: st.SearchStrategy[C] | None = None
    explicit: tuple[C, ...] = ()
    operands: Callable[[Any], list] | None = None
    count: Callable[[Judgement], int] = lambda j: 1
    encode: Callable[[C], tuple[int, ...]] | None = None
    decode: Callable[[Replay], C] | None = None
    describe: Callable[[C], dict[str, Any]] = lambda case: {"case": repr(case)}
    elements: Elements[C] | None = None
    output_names: tuple[str, ...] = ("r",)
    build: dict[str, Any] = field(default_factory=dict)
    budget_stop: bool = False
    observe: Callable[[Judgement], None] | None = None  # sees every judged case (family statistics)
    unit: str = "cases"  # "elements": the evidence also says elements, batches and elements_per_s
    from_witness: Callable[[Mapping[str, int]], C] | None = None  # a plan regime's witness values -> a case
    regime_of: Callable[[C], list[str]] | None = None  # the plan regimes a case selects
    refuses: tuple[type[BaseException], ...] = ()  # what the entry point's guard raises on a rejected input
    alternative: Callable[[Any], Any] | None = None  # the reference under another order (order-sensitive inputs)
    alternative_name: str = ""  # what that other order is, for the evidence
    # Threads that materialise cases and evaluate the reference ahead of the judging (pipelined runs; 0: none).
    # Only for checks whose inputs and reference are pure host code that releases the GIL (NumPy float64).
    reference_threads: int = 0
    # Hypothesis' draws of this check may be stored and reused (the same cases, not drawn again; see DrawCodec)
    draw_codec: DrawCodec[C] | None = None


@dataclass(frozen=True)
class Judgement:
    """One case judged: output elements per output, the disagreement mask, first bad index and details."""

    n: int
    bad: Any
    first_bad: int | None
    bad_count: int
    max_ulp: int | None
    guard_ok: bool
    native: list
    expected: list
    distances: list
    inputs: Any
    raised: str | None = None
    refused: str | None = None  # a rejected boundary witness the guard did not refuse: the boundary and what happened

    @property
    def failed(self) -> bool:
        """True when an element disagrees, the kernel wrote past the end, the native call raised, or a rejected
        boundary witness was not refused."""
        return self.first_bad is not None or not self.guard_ok or self.raised is not None or self.refused is not None


def _flat(a: Any) -> Any:
    return a.reshape(-1) if hasattr(a, "reshape") else np.asarray(a).reshape(-1)


def _native_outputs(out: Any) -> NativeResult:
    if isinstance(out, NativeResult):
        return NativeResult([_flat(o) for o in out.outputs], out.guard_ok)
    if isinstance(out, list | tuple):
        return NativeResult([_flat(o) for o in out])
    return NativeResult([_flat(out)])


def _flat_expected(e: Any) -> Expected:
    if not hasattr(e, "bits"):
        e = Expected(bits=e)
    parts = {k: getattr(e, k, None) for k in ("bits", "alt", "value", "bound")}
    return Expected(**{k: None if v is None else _flat(v) for k, v in parts.items()})


def _expected(ref: Any) -> list:
    return [_flat_expected(e) for e in (ref if isinstance(ref, list | tuple) else [ref])]


def with_evidence(outcome: Outcome, ev: dict[str, Any]) -> Outcome:
    """The same outcome (status, counterexample, reason) carrying the evidence ``ev``."""
    status = outcome.status.value
    if status == "passed":
        return passed(**ev)
    if status == "violated":
        return violated(outcome.counterexample or {}, outcome.reason or "", **ev)
    return {"skipped": skipped, "error": error}.get(status, error)(outcome.reason or status, **ev)


def evidence_dict(outcome: Outcome) -> dict[str, Any]:
    """An outcome's evidence as a plain dict (typed evidence serialised, a mapping copied)."""
    ev = outcome.evidence
    return dict(ev.to_json()) if hasattr(ev, "to_json") else dict(ev)


def judge(check: Check, inputs: Any, reference: Callable[[], Any] | None = None) -> Judgement:
    """Run native (``runs`` times for determinism) and reference once and judge every output element.

    ``reference``: the reference's result, already being computed (called where ``check.reference`` would be).
    """
    ag = check.agreement
    try:
        first = _native_outputs(check.native(inputs))
        later = [_native_outputs(check.native(inputs)).outputs for _ in range(ag.runs - 1)]
    except DeviceUnavailable:
        raise
    except Exception as exc:  # a call refused or failing on a valid case refutes the claim as a wrong value does
        return Judgement(0, None, None, 0, None, True, [], [], [], inputs, f"{type(exc).__name__}: {exc}")
    if ag.runs > 1:
        expected, natives = [Expected(bits=b) for b in first.outputs], later
    else:
        ref = reference() if reference is not None else check.reference(inputs)
        expected, natives = _expected(ref), [first.outputs]
    operands = check.operands(inputs) if check.operands is not None else None
    n = int(first.outputs[0].size) if first.outputs else 0
    xp = _ns(first.outputs[0]) if first.outputs else np
    bad = xp.zeros(n, dtype=bool)
    dists, max_ulp = [], None
    for outs in natives:
        for nat, exp in zip(outs, expected, strict=True):
            c = ag.compare(_flat(nat)[:n], exp, operands)
            bad |= c.bad
            dists.append(c.distance)
            if c.distance is not None and n:
                m = max_finite(c.distance)
                if m is not None:
                    max_ulp = max(max_ulp or 0, m)
    count = int(bad.sum()) if n else 0
    first_bad = int(xp.argmax(bad)) if count else None
    return Judgement(n, bad, first_bad, count, max_ulp, first.guard_ok, natives[-1], expected, dists, inputs)


def _ns(a: Any) -> Any:
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def _to_np(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def _hex(v: int, width: int) -> str:
    return f"0x{int(v) & ((1 << width) - 1):0{width // 4}X}"


def _value_json(a: Any, i: int) -> tuple[str, str | float]:
    """(hex bits, value) of element ``i`` of a bit or float array."""
    v = _to_np(a[i : i + 1])
    if v.dtype.kind == "u":
        width = v.dtype.itemsize * 8
        val = repr(float(v.view(np.float32)[0])) if width == 32 else int(v[0])
        return _hex(int(v[0]), width), val
    if v.dtype.kind == "f":
        return _hex(int(v.view(f"u{v.dtype.itemsize}")[0]), v.dtype.itemsize * 8), float(v[0])
    return str(v[0]), str(v[0])


def _element_json(check: Check, j: Judgement, i: int) -> dict[str, Any]:
    """JSON of output element ``i``: native and reference bits/values per output, ULP distance."""
    out: dict[str, Any] = {"index": i}
    if check.elements is not None:
        out.update(check.elements.describe(j.inputs, i))
    out["outputs"] = {}
    per = len(j.native)
    for k, name in enumerate(check.output_names[:per]):
        nat_hex, nat_val = _value_json(j.native[k], i)
        exp = j.expected[k]
        entry: dict[str, Any] = {"native": nat_hex, "native_value": nat_val}
        if getattr(exp, "bits", None) is not None:
            entry["reference"], entry["reference_value"] = _value_json(_flat(exp.bits), i)
            alt = getattr(exp, "alt", None)
            if alt is not None and _value_json(_flat(alt), i)[0] != entry["reference"]:
                entry["reference_alt"] = _value_json(_flat(alt), i)[0]
        if getattr(exp, "value", None) is not None:
            entry["reference_value"] = float(_to_np(_flat(exp.value)[i : i + 1])[0])
        if getattr(exp, "bound", None) is not None:
            entry["bound"] = float(_to_np(_flat(exp.bound)[i : i + 1])[0])
        d = j.distances[len(j.distances) - per + k] if j.distances else None
        if d is not None:
            dv = int(_to_np(d[i : i + 1])[0])
            entry["ulp_distance"] = "nan-mismatch" if dv >= NAN_MISMATCH else dv
        out["outputs"][name] = entry
    return out


# -- timing ------------------------------------------------------------------------------------------------

WARMUP = 50


def time_ms(fn: Callable[[], Any], iters: int = 100, warmup: int = WARMUP) -> float:
    """Mean milliseconds per call over ``iters`` calls between two CUDA events, after ``warmup`` calls."""
    import cupy

    for _ in range(warmup):
        fn()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / iters


# -- element minimiser ---------------------------------------------------------------------------------


def _simplicity(bits: tuple[int, ...], width: int) -> tuple:
    """Order for minimisation: fewer set magnitude bits, then smaller magnitudes, then positive."""
    mask = (1 << (width - 1)) - 1
    mags = [b & mask for b in bits]
    return (sum(bin(m).count("1") for m in mags), tuple(mags), tuple(b >> (width - 1) for b in bits))


def _candidates(bits: tuple[int, ...], common: tuple[int, ...], width: int) -> list[tuple[int, ...]]:
    out = set()
    full, mask = (1 << width) - 1, (1 << (width - 1)) - 1
    for k, b in enumerate(bits):
        alts = set(common) | {b & mask}
        alts |= {b & ~(1 << j) for j in range(width) if b >> j & 1}
        alts |= {b & ~((1 << j) - 1) for j in range(4, width - 8, 4)}
        for a in alts:
            cand = bits[:k] + (a & full,) + bits[k + 1 :]
            if _simplicity(cand, width) < _simplicity(bits, width):
                out.add(cand)
    return sorted(out, key=lambda c: _simplicity(c, width))


def minimise_element(check: Check[C], case: C, bits: tuple[int, ...], rounds: int = 40) -> tuple[C, Judgement] | None:
    """Shrink a failing operand tuple to a simpler one failing on its own; None if it passes alone."""
    el = check.elements
    assert el is not None
    alone_case = el.batch([bits], case)
    alone = judge(check, check.inputs(alone_case))
    if not alone.failed:
        return None
    best, best_case, best_j = bits, alone_case, alone
    for _ in range(rounds):
        cands = _candidates(best, el.common, el.width)
        if not cands:
            break
        j = judge(check, check.inputs(el.batch(cands, case)))
        if j.first_bad is None:
            break
        bad_idx = [int(i) for i in np.flatnonzero(_to_np(j.bad))]
        order = bad_idx[:4]
        if len(bad_idx) == 1:  # a lone failure may be positional (e.g. the last element): try the simplest too
            order = sorted(set(order) | set(range(min(2, len(cands)))))
        moved = False
        for i in order:  # candidates are sorted simplest first; confirm each on its own
            single_case = el.batch([cands[i]], case)
            single = judge(check, check.inputs(single_case))
            if single.failed:
                best, best_case, best_j, moved = cands[i], single_case, single, True
                break
        if not moved:
            break
    return best_case, best_j


# -- evidence, outcomes, replay -----------------------------------------------------------------------------


def item_agreement(ctx: FalsifyContext, kind: str, **params: Any) -> Agreement:
    """The agreement kind ``kind`` a test applies, built with ``params``.

    The item's ``agreement:`` field is not a choice: :func:`run` (and :func:`check_stated_agreement`)
    refuse an item whose stated kind is not the one applied.
    """
    del ctx
    return make_agreement(kind, **params)


def check_stated_agreement(ctx: FalsifyContext, agreement: Agreement) -> Outcome | None:
    """An error outcome when the item states an agreement kind other than ``agreement``'s, else None."""
    stated = ctx.agreement
    if stated and stated != agreement.name:
        return error(
            f"the item states agreement {stated!r} but test {ctx.item.get('test')!r} applies {agreement.name!r}"
        )
    return None


def evidence(ctx: FalsifyContext, agreement: Agreement | None = None, **more: Any) -> dict[str, Any]:
    """The evidence every falsification outcome carries: seed, profile, device, agreement, then ``more``."""
    ev: dict[str, Any] = {"seed": ctx.seed, "profile": ctx.profile.value, "device": ctx.device}
    if agreement is not None:
        ev["agreement"] = agreement.describe()
    ev.update(more)
    return ev


def outcome_passed(ctx: FalsifyContext, cases: int, agreement: Agreement | None = None, **more: Any) -> Outcome:
    """A passed outcome with the engine's evidence keys."""
    return passed(**evidence(ctx, agreement, cases=cases, **more))


def outcome_violated(
    ctx: FalsifyContext,
    counterexample: dict[str, Any],
    reason: str,
    agreement: Agreement | None = None,
    replay: Replay | None = None,
    **more: Any,
) -> Outcome:
    """A violated outcome with the engine's evidence keys and the one replay command."""
    ce = {**counterexample, "replay": replay_command(ctx, replay)}
    return violated(ce, reason, **evidence(ctx, agreement, **more))


def replay_command(ctx: FalsifyContext, case: Replay | None = None) -> str:
    """The command that re-checks this failure: one case by its integers, else the seeded run."""
    path = ctx.contract_path or "<contract>"
    item = ctx.item.get("id", "<item>")
    if case is not None:
        values = ",".join(_hex(v, 32) if 0 <= v < 1 << 32 else str(v) for v in case.values)
        cmd = f"kc replay {path} {item} --bits {values}"
        if case.scalars:
            cmd += f" --scalars {','.join(_hex(s, 32) for s in case.scalars)}"
        return cmd + f" --device {ctx.device} --seed {ctx.seed}"
    return f"kc check {path} --only {item} --device {ctx.device} --seed {ctx.seed} --profile {ctx.profile.value}"


class _Disagreement(AssertionError):
    def __init__(self, case: Any, j: Judgement) -> None:
        super().__init__(f"{j.bad_count} disagreement(s) in a case of {j.n}")
        self.case, self.judgement = case, j


def _encode(check: Check[C], case: C) -> Replay | None:
    if check.encode is None:
        return None
    try:
        values = tuple(int(v) for v in check.encode(case))
    except ValueError:  # this case has no integer form (e.g. a whole batch): replay the seeded run
        return None
    scalars = check.elements.scalars(case) if check.elements is not None else ()
    return Replay(values, tuple(scalars))


def _counterexample(ctx: FalsifyContext, check: Check[C], case: C, j: Judgement) -> tuple[dict, Replay | None, str]:
    """(counterexample, replay case, kind) of a failing case, element-minimised where the check allows."""
    base: dict[str, Any] = {"case": check.describe(case), "seed": ctx.seed}
    if j.refused is not None:
        return {**base, "kind": "guard", "detail": j.refused}, None, "guard"
    if j.raised is not None:
        ce = {**base, "kind": "raised", "detail": f"the native call raised {j.raised}"}
        return ce, _encode(check, case), "raised"
    if j.first_bad is None or not j.guard_ok:  # the guard cell was written: no further launches of this kernel
        detail = f"the kernel wrote element {j.n} of a {j.n}-element output"
        return {**base, "kind": "out_of_bounds_write", "size": j.n, "detail": detail}, None, "out_of_bounds_write"
    i = j.first_bad
    el = check.elements
    if el is None:
        ce = {**base, "kind": "case", "size": j.n, "disagreements": j.bad_count, "element": _element_json(check, j, i)}
        return ce, _encode(check, case), "case"
    bits = el.operands(j.inputs, i)
    shrunk = minimise_element(check, case, bits, ctx.budget.minimise_rounds)
    if shrunk is None:
        ce = {
            **base,
            "kind": "position_dependent",
            "size": j.n,
            "disagreements": j.bad_count,
            "element": _element_json(check, j, i),
            "detail": "the element agrees on its own: the failure depends on its batch (size/position)",
        }
        return ce, None, "position_dependent"
    s_case, sj = shrunk
    names = el.scalar_names or tuple(f"s{k}" for k in range(len(el.scalars(case))))
    ce = {
        **base,
        "kind": "element",
        "first_in_batch": _element_json(check, j, i),
        "size": 1,
        "element": _element_json(check, sj, 0),
        "batch_disagreements": j.bad_count,
        "batch_size": j.n,
        "scalars": {nm: _hex(s, 32) for nm, s in zip(names, el.scalars(case), strict=True)},
    }
    return ce, _encode(check, s_case), "element"


_WHAT = {
    "element": "an element disagrees",
    "case": "a case disagrees",
    "position_dependent": "a batch disagrees (position-dependent)",
    "out_of_bounds_write": "the kernel wrote past the end of its output",
    "raised": "the native call raised",
    "guard": "an input past a guard's limit was not refused",
}


def _replay_case(ctx: FalsifyContext, check: Check[C], rp: Replay) -> Outcome:
    if check.decode is None:
        return error(f"{check.name}: this check has no case replay; re-run the item with its seed")
    try:
        case = check.decode(rp)
    except (ValueError, IndexError) as exc:
        return error(f"{check.name}: cannot replay {rp.values}: {exc}")
    with noting() as ran:
        j = judge(check, check.inputs(case))
    ev = evidence(ctx, check.agreement, replayed=True, **check.build, **({"executed_by": ran} if ran else {}))
    if j.failed:
        ce: dict[str, Any] = {
            "kind": "element" if check.elements else "case",
            "case": check.describe(case),
            "size": j.n,
        }
        if j.raised is not None:
            ce.update(kind="raised", detail=j.raised)
        elif j.first_bad is not None:
            ce["element"] = _element_json(check, j, j.first_bad)
        return violated({**ce, "replay": replay_command(ctx, rp)}, f"{check.name}: the replayed case disagrees", **ev)
    return passed(cases=check.count(j), **ev)


@dataclass
class _Search(Generic[C]):
    """One search's state: the cases judged, timing, the budget stop and the first failure."""

    check: Check[C]
    budget: Budget
    t0: float = field(default_factory=time.perf_counter)
    cases: int = 0
    draws: int = 0
    skipped: int = 0
    max_ulp: int | None = None
    eval_s: float = 0.0
    failing: bool = False
    clock: float | None = None
    unsafe: _Disagreement | None = None  # a case whose kernel wrote past its output
    regimes: dict[str, int] = field(default_factory=dict)  # plan regime -> cases judged in it
    boundaries: dict[str, int] = field(default_factory=dict)  # boundary witness -> 1 once run (refused, if rejected)
    order_sensitive: int = 0  # cases whose bits the check's alternative order changes
    draw_cache: dict[str, Any] | None = None  # the drawn cases reused from the run's draw store ("hit") or stored

    def one(self, case: C, prepared: Future[tuple[Any, Any]] | None = None) -> None:
        """Judge one case; raise _Disagreement on a failure (Hypothesis then shrinks it).

        ``prepared``: the case's (inputs, reference result) being computed ahead (see :func:`_prepare`).
        """
        check, b = self.check, self.budget
        if self.unsafe is not None:  # never launch again after a write past the end: report that case
            raise self.unsafe
        if (
            check.budget_stop
            and b.budget_s is not None
            and not self.failing
            and self.clock is not None
            and time.perf_counter() - self.clock > b.budget_s
        ):
            self.skipped += 1  # budget spent before any failure: stop evaluating, let Hypothesis finish
            return
        ts = time.perf_counter()
        if prepared is None:
            j = judge(check, check.inputs(case))
        else:
            j = judge(check, prepared.result()[0], lambda: prepared.result()[1])
        self.eval_s += time.perf_counter() - ts
        if self.clock is None:  # the budget's clock starts after the first case (compiles and warm-up excluded)
            self.clock = time.perf_counter()
        self.cases += check.count(j)
        self.draws += 1
        if check.regime_of is not None:
            for name in check.regime_of(case):
                self.regimes[name] = self.regimes.get(name, 0) + 1
        if check.alternative is not None and j.raised is None and _order_sensitive(check, j):
            self.order_sensitive += 1
        if check.observe is not None and j.raised is None:
            check.observe(j)
        if j.max_ulp is not None:
            self.max_ulp = max(self.max_ulp or 0, j.max_ulp)
        if j.failed:
            self.failing = True
            exc = _Disagreement(case, j)
            if not j.guard_ok:
                self.unsafe = exc
            raise exc

    def boundary(self, name: str, case: C) -> None:
        """Judge an accepted boundary witness like any case, and count its boundary reached."""
        self.boundaries[name] = self.boundaries.get(name, 0) + 1
        self.one(case)

    def refuse(self, name: str, case: C) -> None:
        """Run a rejected boundary witness: the native call must raise the check's guard exception (counted
        reached); raise _Disagreement if it runs, or raises anything else (no further launches then)."""
        check = self.check
        try:
            check.native(check.inputs(case))
        except DeviceUnavailable:
            raise
        except check.refuses:
            self.boundaries[name] = self.boundaries.get(name, 0) + 1
            return
        except Exception as exc:
            what = f"the call raised {type(exc).__name__}: {exc}, not the guard's {_names(check.refuses)}"
        else:
            what = f"the entry point ran it instead of raising {_names(check.refuses)}"
        self.failing = True
        j = Judgement(0, None, None, 0, None, True, [], [], [], None, refused=f"{name}: {what}")
        self.unsafe = _Disagreement(case, j)  # an input past the guard ran: launch nothing more
        raise self.unsafe

    def evidence(self, ctx: FalsifyContext, extra: Mapping[str, Any]) -> dict[str, Any]:
        """The run's evidence: the engine's keys, the check's build description, then ``extra``."""
        b, rate = self.budget, round(self.cases / self.eval_s, 1) if self.eval_s else None
        ev = evidence(
            ctx,
            self.check.agreement,
            draws=self.draws,
            max_ulp_observed=self.max_ulp,
            wall_s=round(time.perf_counter() - self.t0, 4),
            cases_per_s=rate,
            budget={
                "max_examples": b.max_examples,
                "max_size": b.max_size,
                "budget_s": b.budget_s,
                "scale": b.scale,
                "bulk": b.bulk,
            },
            **self.check.build,
            **extra,
        )
        if self.check.unit == "elements":
            ev.update(elements=self.cases, batches=self.draws, elements_per_s=rate)
        if self.check.budget_stop and b.budget_s is not None:
            # whether the seconds decided the case count: on full and deep budget_s is a safety net that should not
            # fire (falsification.profiles.SAFETY_NET_S); when it does, the draws it left unjudged are counted here
            ev["time_stop"] = {"budget_s": b.budget_s, "fired": self.skipped > 0, "draws_not_judged": self.skipped}
        regime_w, accept, reject = split_witnesses(ctx.witnesses)
        if regime_w or self.check.regime_of is not None:
            names = list(dict.fromkeys([*regime_w, *self.regimes]))
            ev["regimes_reached"] = {r: self.regimes.get(r, 0) for r in names}
            ev["regimes_unreached"] = [r for r in names if not self.regimes.get(r)]
        if accept or reject:
            ev.update(_boundary_evidence([*accept, *reject], self.boundaries))
        if self.check.alternative is not None:
            ev.update(
                order_alternative=self.check.alternative_name,
                order_sensitive_cases=self.order_sensitive,
                order_insensitive=self.order_sensitive == 0,
            )
        if self.draw_cache is not None:
            ev["draw_cache"] = self.draw_cache
        return ev


def _host_bits(a: Any) -> np.ndarray:
    a = a.get() if hasattr(a, "get") else np.asarray(a)
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _order_sensitive(check: Check, j: Judgement) -> bool:
    """True when the check's alternative evaluation order gives other bits than the reference on this case."""
    alt = _expected(check.alternative(j.inputs))
    for a, e in zip(alt, j.expected, strict=True):
        if a.bits is None or e.bits is None:
            continue
        x, y = _host_bits(a.bits), _host_bits(e.bits)
        if x.shape != y.shape or not np.array_equal(x, y):
            return True
    return False


def _names(types: tuple[type[BaseException], ...]) -> str:
    return " or ".join(t.__name__ for t in types) or "(no exception declared)"


def _boundary_evidence(names: Iterable[str], reached: Mapping[str, int]) -> dict[str, Any]:
    counts = {n: int(reached.get(n, 0)) for n in names}
    return {"boundaries_reached": counts, "boundaries_unreached": [n for n, k in counts.items() if not k]}


def _built(check: Check[C], witnesses: Mapping[str, Mapping[str, int]]) -> list[tuple[str, C]]:
    """(witness name, case) for each witness the check can build (``from_witness`` None: it cannot)."""
    if not witnesses:
        return []
    if check.from_witness is None:
        raise ValueError(f"{check.name}: the item names regime witnesses but the check has no from_witness")
    return [(name, case) for name, values in witnesses.items() if (case := check.from_witness(values)) is not None]


def witness_cases(ctx: FalsifyContext, check: Check[C]) -> tuple[C, ...]:
    """The check's cases for the context's regime witnesses (plan values per regime), in regime order; a guard's
    accepted boundary witnesses are not among them (they run first, see :func:`rejected_cases` for the others)."""
    return tuple(case for _, case in _built(check, split_witnesses(ctx.witnesses)[0]))


def rejected_cases(ctx: FalsifyContext, check: Check[C]) -> tuple[list[tuple[str, C]], list[tuple[str, C]]]:
    """(accepted, rejected) boundary witnesses of the context as (name, case); rejected ones need ``refuses``."""
    _, accept, reject = split_witnesses(ctx.witnesses)
    if reject and not check.refuses:
        raise ValueError(f"{check.name}: the item names rejected boundary witnesses but the check declares no refuses")
    return _built(check, accept), _built(check, reject)


_PIPELINE = {"on": True}


def set_pipelined(on: bool) -> None:
    """Draw Hypothesis' cases in a thread beside the judging (True, the default), or inside it (False)."""
    _PIPELINE["on"] = bool(on)


class _Drawn:
    """Hypothesis' cases drawn in a thread by a body that only records them (see :func:`_explore`), or the same cases
    reused from the run's draw store where the check has a draw codec and this draw was stored before."""

    def __init__(self, ctx: FalsifyContext, check: Check[C], max_examples: int) -> None:
        self._cases: queue.Queue[Any] = queue.Queue()
        self._end, self._stop = object(), threading.Event()
        self.failed = False
        self._thread: threading.Thread | None = None
        self._recorded: list[Any] = []
        codec, store = check.draw_codec, ctx.draws
        self._key = None
        if codec is not None and store is not None and ctx.replay is None:
            parts = {"check": codec.key, "seed": ctx.seed, "max_examples": max_examples, "hypothesis": _hyp_version()}
            self._key = store.key(parts)
            stored = store.get(self._key)
            if stored is not None:
                self.cache: dict[str, Any] | None = {"status": "hit", "key": self._key, "cases": len(stored)}
                for value in stored:
                    self._cases.put(codec.decode(value))
                self._cases.put(self._end)
                return
        self.cache = {"status": "miss", "key": self._key} if self._key is not None else None
        self._thread = threading.Thread(
            target=self._produce, args=(ctx, check, max_examples), name="kc-hypothesis", daemon=True
        )
        self._thread.start()

    def _produce(self, ctx: FalsifyContext, check: Check[C], max_examples: int) -> None:
        def record(case: C) -> None:
            if not self._stop.is_set():
                self._cases.put(case)
                self._recorded.append(case)

        try:
            with no_mined_constants():
                _hypothesis(ctx, check, max_examples, record)()
        except BaseException:  # e.g. a strategy error: the serial search meets it again and reports it
            self.failed = True
        try:  # stored before the end is announced, so the judging's close() waits for it
            if not self.failed and self._key is not None and not self._stop.is_set():  # a whole draw
                _store_draws(ctx, check, self._key, self._recorded)
        finally:
            self._cases.put(self._end)

    def __iter__(self) -> Iterator[Any]:
        while (case := self._cases.get()) is not self._end:
            yield case

    def close(self) -> None:
        """Stop recording and wait for the thread (Hypothesis' state is shared with a serial run after it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def _hyp_version() -> str:
    import hypothesis

    return str(hypothesis.__version__)


def _store_draws(ctx: FalsifyContext, check: Check[C], key: str, cases: list[Any]) -> None:
    """Store a whole draw (every example recorded: the recording body never fails, so it is the same whatever the
    judging finds), only where every case round-trips through JSON."""
    codec, store = check.draw_codec, ctx.draws
    if codec is None or store is None:
        return
    encoded = [codec.encode(c) for c in cases]
    if all(codec.decode(e) == c for e, c in zip(encoded, cases, strict=True)):
        store.put(key, encoded)


def _prepare(check: Check[C], case: C) -> tuple[Any, Any]:
    """(inputs, reference result) of a case, computed in a reference thread."""
    inputs = check.inputs(case)
    return inputs, check.reference(inputs)


def _judge_in_order(
    search: _Search[C], cases: Iterable[C], pool: ThreadPoolExecutor | None, judged: list[int] | None = None
) -> None:
    """Judge ``cases`` in order, raising at the first failure; ``judged[0]`` counts the cases that passed. With
    ``pool``, up to twice its threads' worth of cases are materialised and referenced ahead."""
    count = judged if judged is not None else [0]
    if pool is None:
        for case in cases:
            search.one(case)
            count[0] += 1
        return
    window = 2 * search.check.reference_threads
    ahead: deque[tuple[C, Future[tuple[Any, Any]]]] = deque()
    source = iter(cases)
    while True:
        while len(ahead) < window and (case := next(source, _NONE)) is not _NONE:
            ahead.append((case, pool.submit(_prepare, search.check, case)))
        if not ahead:
            return
        case, fut = ahead.popleft()
        search.one(case, fut)
        count[0] += 1


_NONE: Any = object()


def _resuming(one: Callable[[C], None], passed_draws: int, pending: _Disagreement | None) -> Callable[[C], None]:
    """The serial body after a pipelined start: the first ``passed_draws`` draws were judged (and passed), the next
    is the judged failure ``pending`` (raised again, not judged twice); every later call is judged."""
    calls = [0]

    def body(case: C) -> None:
        calls[0] += 1
        if calls[0] <= passed_draws:
            return
        if calls[0] == passed_draws + 1 and pending is not None:
            try:
                same = bool(case == pending.case)
            except Exception:  # a case type without a boolean equality: judge it
                same = False
            if same:
                raise pending
        one(case)

    return body


def _explore(ctx: FalsifyContext, search: _Search[C]) -> _Disagreement | None:
    """Explicit cases, then the seeded Hypothesis search; its shrunk failure, else an explicit one, else None.

    Pipelined (the default): a thread draws Hypothesis' cases with a body that only records them while this
    thread judges the explicit cases, then the drawn ones in order. While every example passes, Hypothesis'
    draws depend only on the seed and the strategy (every outcome is "valid"), so the recorded cases are exactly
    those the judging body would be given, in the same order, and a passing run judges the same cases. At a
    failure the serial search runs as before with a body that skips the draws already judged and raises the
    judged failure again on its draw, so Hypothesis shrinks it exactly as in a serial run: each case is judged
    once and the outcome and evidence are the serial search's.
    """
    check = search.check
    pipelined = _PIPELINE["on"]
    drawn = _Drawn(ctx, check, search.budget.max_examples) if pipelined and check.cases is not None else None
    if drawn is not None:
        search.draw_cache = drawn.cache
    pool = (
        ThreadPoolExecutor(max_workers=check.reference_threads, thread_name_prefix="kc-reference")
        if pipelined and check.reference_threads > 0
        else None
    )
    explicit_failure: _Disagreement | None = None
    passed_draws, pending = 0, None
    try:
        try:
            # rejected boundary witnesses (the guard must refuse them), accepted ones, regime witnesses, then the
            # explicit cases; a failure here still lets the search shrink one (not after an input past a guard ran)
            accepted, rejected = rejected_cases(ctx, check)
            for name, case in rejected:
                search.refuse(name, case)
            for name, case in accepted:
                search.boundary(name, case)
            _judge_in_order(search, (*witness_cases(ctx, check), *check.explicit), pool)
        except _Disagreement as exc:
            explicit_failure = exc
        if check.cases is None or search.unsafe is not None:
            return explicit_failure  # a write past the end is reported as found: no further launches
        if drawn is not None:
            judged = [0]
            try:
                if explicit_failure is None:
                    _judge_in_order(search, drawn, pool, judged)
                    if not drawn.failed:
                        return None
            except _Disagreement as exc:
                pending = exc
            passed_draws = judged[0]
            drawn.close()
            if search.unsafe is not None:
                return search.unsafe  # no further launches after a write past the end: report that case
    finally:
        if drawn is not None:
            drawn.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    try:
        with no_mined_constants():
            _hypothesis(ctx, check, search.budget.max_examples, _resuming(search.one, passed_draws, pending))()
    except _Disagreement as exc:
        return search.unsafe or exc
    return explicit_failure


def run(ctx: FalsifyContext, check: Check[C], extra: Callable[[], Mapping[str, Any]] | None = None) -> Outcome:
    """Drive ``check`` under the context's budget and seed (or replay one case): pass, or a minimised case."""
    if (bad := check_stated_agreement(ctx, check.agreement)) is not None:
        return bad
    if ctx.replay is not None:
        return _replay_case(ctx, check, ctx.replay)
    search = _Search(check, ctx.budget)
    try:
        witness_cases(ctx, check)
        rejected_cases(ctx, check)
    except ValueError as exc:
        return error(str(exc), **evidence(ctx, check.agreement, **check.build))
    try:
        with noting() as ran:  # how the native code ran (e.g. Triton's interpreter) belongs in the evidence
            found = _explore(ctx, search)
    except HypothesisException as exc:  # e.g. Flaky: a failure that did not reproduce
        return error(
            f"{check.name}: Hypothesis could not settle a failure ({type(exc).__name__}: {exc})",
            **evidence(ctx, check.agreement, **check.build),
        )
    ev = search.evidence(ctx, extra() if extra else {})
    if ran:
        ev["executed_by"] = ran
    if found is None:
        return passed(cases=search.cases, **ev)
    ce, rp, kind = _counterexample(ctx, check, found.case, found.judgement)
    ce["replay"] = replay_command(ctx, rp)
    reason = f"{check.name}: {_WHAT[kind]} under {check.agreement.name}"
    if kind == "raised":
        reason += f" ({found.judgement.raised})"
    return violated(ce, reason, cases=search.cases, **ev)


@contextlib.contextmanager
def no_mined_constants() -> Iterator[None]:
    """Hypothesis without the literals it mines from every loaded project module.

    Hypothesis (>= 6.131) mixes constants found in the source of loaded local modules into its draws, so a
    seed's cases would change whenever any project file (or the set of imported modules) changes. The
    engine's draws depend on the seed, the strategy and the Hypothesis version only; a no-op where the
    Hypothesis in use has no such mining.
    """
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover
        yield
        return
    getter = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if getter is None or cache is None or not hasattr(providers, "Constants"):
        yield
        return
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    cache.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = getter
        cache.cache.clear()


def seeded_find(strategy: Any, condition: Callable[[Any], bool], settings: Any, seed: int) -> Any:
    """``hypothesis.find`` whose draws depend on the seed, the strategy and the Hypothesis version only (not on
    which project modules the process happens to have imported: :func:`no_mined_constants`); raises
    ``NoSuchExample`` as ``find`` does."""
    import random

    from hypothesis import find

    with no_mined_constants():
        return find(strategy, condition, settings=settings, random=random.Random(seed))


def _hypothesis(
    ctx: FalsifyContext, check: Check[C], max_examples: int, one: Callable[[C], None]
) -> Callable[[], None]:
    """The seeded Hypothesis test over ``check.cases`` (the explicit cases ran before it)."""

    def body(case: C) -> None:
        one(case)

    fn: Callable[..., None] = hseed(ctx.seed)(given(check.cases)(body))
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        print_blob=False,
    )(fn)


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
    bits: Iterable[Any],
    scalars: Iterable[Any] = (),
    device: str = "host",
    contract: dict[str, Any] | None = None,
    contract_path: str = "",
    seed: int = 0,
) -> Outcome:
    """Re-check one case of a contract item on ``device`` (already resolved): ``bits`` are its integers."""
    test = get_test(item["test"])
    if test is None:
        return error(f"unknown falsification test {item['test']!r}")
    if device not in test.devices:
        return skipped(f"test {test.name} does not support device {device!r}")
    ctx = FalsifyContext(
        device=device,
        profile="quick",
        seed=seed,
        item=dict(item),
        contract=contract or {},
        contract_path=contract_path,
        replay=Replay.parse(list(bits), list(scalars)),
    )
    return test.run(ctx)


def boundary_counts(ctx: FalsifyContext, reached: Iterable[str]) -> dict[str, Any]:
    """``boundaries_reached``/``boundaries_unreached`` evidence of a test that runs its boundary witnesses itself
    (``reached``: the names of those that ran, the rejected ones refused by the guard); {} where there are none."""
    _, accept, reject = split_witnesses(ctx.witnesses)
    if not accept and not reject:
        return {}
    done: dict[str, int] = {}
    for name in reached:
        done[name] = done.get(name, 0) + 1
    return _boundary_evidence([*accept, *reject], done)


def regime_counts(ctx: FalsifyContext, selected: Iterable[Iterable[str]]) -> dict[str, Any]:
    """``regimes_reached``/``regimes_unreached`` evidence of a test that runs its cases itself (one list per case)."""
    counts: dict[str, int] = {r: 0 for r in split_witnesses(ctx.witnesses)[0]}
    for names in selected:
        for r in names:
            counts[r] = counts.get(r, 0) + 1
    return {"regimes_reached": counts, "regimes_unreached": [r for r, n in counts.items() if not n]}
