"""Discharge engines, registered by method name: z3, enumerate, sympy, falsify, measure, assume.

Each engine turns one contract item into an :class:`~obligations.core.results.Outcome` from evidence only:
a solver verdict, points enumerated, a registered test's run. Nothing the contract author typed is
reported as a result.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import z3

from native.kinds import unavailable as kernel_unavailable
from obligations import expr as exprlang
from obligations import z3solve
from obligations.contract import Contract, import_test_modules, shown_path
from obligations.core import cancel, plans
from obligations.core import symbolic as sym
from obligations.core.evidence import (
    EnumerateEvidence,
    Evidence,
    FalsifyEvidence,
    MeasureEvidence,
    SympyEvidence,
    Z3Evidence,
)
from obligations.core.results import (
    Outcome,
    assumed,
    error,
    exhausted,
    passed,
    proved,
    skipped,
    unknown,
    violated,
    with_evidence_kind,
)
from obligations.proofcache import cache_get, cache_key, cache_put, proof_settings, sources_digest
from obligations.statements import Evaluation, evaluate_statement, kernel_of

__all__ = [
    "Job",
    "Engine",
    "register_engine",
    "get_engine",
    "ENGINES",
    "evaluate_statement",
    "Evaluation",
    "fresh_z3_context",
    "Z3Query",
    "z3_query",
    "code_digest",
]

DEFAULT_RLIMIT = 50_000_000
MAX_RLIMIT = (1 << 32) - 1  # Z3 keeps rlimit in 32 bits: 2**32 would mean "no limit", 2**32 + 1 would mean 1
Z3_WALL_SECONDS = z3solve.WALL_CEILING_S  # a safety net far above an rlimit's normal time: hitting it is an error
MAX_ENUMERATION_POINTS = 30_000_000
# The rlimit of minimising a counterexample (at most the item's): a lexicographic optimum over nonlinear plans can
# cost many times the proof; past it the counterexample is shown as found, and labelled so.
MINIMISE_RLIMIT = 2_000_000


@dataclass(frozen=True)
class Job:
    """One item to discharge, with where and how hard to run it."""

    contract: Contract
    item: dict[str, Any]
    device: str = "host"
    profile: str = "quick"
    seed: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)


class Engine(ABC):
    """A way of discharging an item; subclasses register under their method name."""

    name: ClassVar[str]

    @abstractmethod
    def discharge(self, job: Job) -> Outcome:
        """Check the item and return an outcome backed by evidence."""


ENGINES: dict[str, Engine] = {}


def register_engine(cls: type[Engine]) -> type[Engine]:
    """Class decorator: register an engine instance under ``cls.name``."""
    if cls.name in ENGINES:
        raise ValueError(f"engine {cls.name!r} registered twice")
    ENGINES[cls.name] = cls()
    return cls


def get_engine(method: str) -> Engine:
    """The engine for ``method``; KeyError for an unknown method."""
    if method not in ENGINES:
        # the engines of their own modules (audit, regimes, sanitize) register when imported
        from obligations.registry import load_plugins

        load_plugins("engines")
    return ENGINES[method]


# -- evaluating a statement over one carrier ----------------------------------------------------------


def _used_symbols(contract: Contract, item: Mapping[str, Any]) -> list[str]:
    names: set[str] = set()
    for key in ("given", "prove"):
        if item.get(key):
            names |= exprlang.parse(item[key]).names()
    kernel = kernel_of(contract, item)
    if kernel is not None and "plan" in kernel:
        names |= set(plans.plan_parameters(plans.resolve(kernel["plan"]))) & set(contract.symbols)
    names |= set(item.get("bound") or {})
    return [s for s in contract.symbols if s in names]


def _symbol_range(decl: Mapping[str, Any]) -> tuple[int, int]:
    """The inclusive range of a non-bool symbol: its machine type narrowed by min/max."""
    t = sym.machine_type(decl["type"])
    return max(t.lo, decl.get("min", t.lo)), min(t.hi, decl.get("max", t.hi))


def _array_env(contract: Contract, grid: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """NumPy-carried values for enumerated symbols (bool symbols become bool arrays)."""
    return {
        name: (
            sym.BoolTerm(arr.astype(bool))
            if contract.symbols[name]["type"] == "bool"
            else sym.Term(arr, contract.symbols[name]["type"])
        )
        for name, arr in grid.items()
    }


def _concrete_env(contract: Contract, values: Mapping[str, int]) -> dict[str, Any]:
    env: dict[str, Any] = {}
    for name, v in values.items():
        decl = contract.symbols[name]
        env[name] = bool(v) if decl["type"] == "bool" else sym.Term(int(v), decl["type"])
    return env


def confirm(contract: Contract, item: Mapping[str, Any], values: Mapping[str, int]) -> dict[str, Any]:
    """Re-run the plan and statements with plain ints at one point: does it refute the claim?"""
    ev = evaluate_statement(contract, item, _concrete_env(contract, values))
    required = ev.required()
    failed = [f"{c.message} at {c.where}" for c in required if not c.expr]
    holds = bool(ev.prove.expr)
    plan_own = ev.quantities["no_overflow"].deps if "no_overflow" in ev.quantities else frozenset()
    shown: dict[str, Any] = {}
    for name, v in ev.quantities.items():
        if name == "no_overflow":
            continue  # the plan's own conditions only: shown below as plan_no_overflow, beside the statement's
        if isinstance(v, sym.Term):
            shown[name] = int(v.expr)
        elif isinstance(v, sym.BoolTerm | bool):
            shown[name] = bool(v.expr if isinstance(v, sym.BoolTerm) else v)
    own = [ev.tracker.conditions[i] for i in sorted(plan_own)]
    needed = ev.given.deps | ev.prove.deps
    statement = [ev.tracker.conditions[k] for k in sorted(needed - plan_own)]
    out = {
        "given": bool(ev.given.expr),
        "prove": holds,
        "failed_conditions": failed,
        "refutes": bool(ev.given.expr) and (not holds or bool(failed)),
        "quantities": shown,
        # The plan's own side-conditions (its no_overflow quantity) and those of the statement's arithmetic,
        # apart: a failed overflow of the statement is not the plan's, and vice versa.
        "plan_no_overflow": all(bool(cnd.expr) for cnd in own),
        "statement_no_overflow": all(bool(cnd.expr) for cnd in statement),
    }
    if ev.tracker.conversions:  # signed met unsigned: say what C made of the values (-1 < 0u is false)
        out["conversions"] = list(dict.fromkeys(ev.tracker.conversions))
    return out


def _reason(conf: dict[str, Any]) -> str:
    if conf["failed_conditions"]:
        return "side-condition fails: " + "; ".join(conf["failed_conditions"])
    if conf.get("conversions"):
        return "the claim is false at this point; " + "; ".join(conf["conversions"])
    return "the claim is false at this point"


# -- engines ------------------------------------------------------------------------------------------


def domain_constraints(contract: Contract, env: Mapping[str, Any]) -> list[Any]:
    """Z3 constraints of the symbols in ``env``: their machine-type range, min/max and ``values``."""
    out = []
    for name, v in env.items():
        decl = contract.symbols[name]
        if decl["type"] == "bool":
            continue
        lo, hi = _symbol_range(decl)
        x = v.expr
        out += [x >= lo, x <= hi]
        if "values" in decl:
            out.append(z3.Or(*[x == int(val) for val in decl["values"]]))
    return out


def _domain_text(contract: Contract, names: list[str]) -> list[str]:
    out = []
    for name in names:
        d = contract.symbols[name]
        if d["type"] == "bool":
            out.append(f"{name}: bool")
        elif "values" in d:
            out.append(f"{name}: {d['type']} in {d['values']}")
        else:
            lo, hi = _symbol_range(d)
            out.append(f"{name}: {d['type']} in [{lo}, {hi}]")
    return out


@dataclass(frozen=True)
class Z3Query:
    """An item's Z3 queries as SMT-LIB text: the vacuity check (domain and given) and the proof (and not claim)."""

    names: list[str]  # the contract symbols the item uses
    env: dict[str, Any]  # their checker terms
    vacuity: str
    text: str
    side_conditions: int  # how many side-conditions the claim carries


def z3_query(c: Contract, item: Mapping[str, Any]) -> Z3Query:
    """The queries the z3 engine solves for ``item`` (in the current Z3 context: see :func:`fresh_z3_context`)."""
    names = _used_symbols(c, item)
    env = plans.symbolic_env(c.symbols, set(names))
    ev = evaluate_statement(c, item, env)
    domain = domain_constraints(c, env)
    required = ev.required()
    given = z3_bool(ev.given.expr)
    claim = z3.And(z3_bool(ev.prove.expr), *[z3_bool(cnd.expr) for cnd in required])
    vacuity = z3solve.query_text([*domain, given])
    return Z3Query(names, env, vacuity, z3solve.query_text([*domain, given, z3.Not(claim)]), len(required))


@register_engine
class Z3Engine(Engine):
    """Prove ``domain and given -> prove and side-conditions`` by refuting its negation under an rlimit.

    The query is solved as SMT-LIB text in a new context with one deterministic strategy and a fixed seed
    (:mod:`obligations.z3solve`): the verdict depends only on the text and the rlimit. The wall-clock ceiling
    and the item's deadline are safety nets: hitting one is ``error (timeout)``, never ``unknown``.
    """

    name = "z3"

    def discharge(self, job: Job) -> Outcome:
        fresh_z3_context()
        c, item = job.contract, job.item
        rlimit = item.get("rlimit", DEFAULT_RLIMIT)
        if isinstance(rlimit, bool) or not isinstance(rlimit, int) or not 1 <= rlimit <= MAX_RLIMIT:
            return error(f"rlimit must be an integer in [1, {MAX_RLIMIT}], not {rlimit!r}")
        q = z3_query(c, item)
        names, env, vac_text, text = q.names, q.env, q.vacuity, q.text
        wall = float(job.options.get("z3_wall_seconds", Z3_WALL_SECONDS))
        settings = proof_settings()
        key = cache_key(
            "z3",
            {"vacuity": vac_text, "query": text, "stability": settings.stability, **z3solve.solver_params(rlimit)},
        )
        evidence = Z3Evidence(
            z3_version=z3.get_version_string(),
            rlimit=rlimit,
            wall_limit_s=wall,
            assumptions=_domain_text(c, names) + ([item["given"]] if item.get("given") else []),
            side_conditions=q.side_conditions,
            tactic=z3solve.TACTIC,  # the portfolio; once solved, the strategy that decided
            random_seed=z3solve.SEED,
            query_sha256=hashlib.sha256(text.encode()).hexdigest(),
            cache="miss" if settings.cache else None,
            cache_key=key if settings.cache else None,
        )
        hit = cache_get(settings, key)
        if hit is not None and hit.get("status") == "proved":
            reused = replace(evidence, rlimit_used=hit.get("rlimit_used"), stability=hit.get("stability"), cache="hit")
            reused = replace(reused, tactic=hit.get("tactic") or reused.tactic)
            return proved(reused)
        vac = z3solve.solve(vac_text, rlimit=rlimit, wall_s=wall, goal="find")
        if vac.result == "unsat":
            return error("vacuous: the assumptions (domain and given) are contradictory", evidence)
        if vac.result == "timeout":
            return _timed_out(vac, wall, rlimit, evidence, " in the vacuity check")
        if vac.result == "unknown":
            return unknown(f"vacuity check: solver returned unknown ({vac.reason})", evidence)
        sorts = {n: ("bool" if isinstance(v, sym.BoolTerm) else "int") for n, v in env.items()}
        v = z3solve.solve(text, rlimit=rlimit, wall_s=wall, model_of=sorts)
        evidence = replace(evidence, rlimit_used=v.rlimit_used, tactic=v.strategy or evidence.tactic)
        if v.result == "timeout":
            return _timed_out(v, wall, rlimit, evidence, "")
        if v.result == "unknown":
            return unknown(f"solver returned unknown ({v.reason})", evidence)
        if v.result == "unsat":
            table = None
            if settings.stability > 1:
                runs = z3solve.stability_runs(text, v, settings.stability, rlimit=rlimit, wall_s=wall)
                if any(r.result == "timeout" and r.deadline for r in runs):
                    raise cancel.DeadlinePassed()
                table = z3solve.stability_table(runs)
                evidence = replace(evidence, stability=table)
                if table["proved"] < table["runs"]:
                    return unknown(
                        f"not proved in every run of --z3-stability {settings.stability}: proved in "
                        f"{table['proved']} of {table['runs']} (seeds, shuffled assertions, renamed symbols, "
                        "fresh processes)",
                        evidence,
                    )
            entry = {"status": "proved", "rlimit_used": v.rlimit_used, "stability": table, "tactic": v.strategy}
            cache_put(settings, key, entry)
            return proved(evidence)
        return self._counterexample(c, item, names, v.model or {}, text, rlimit, wall, sorts, evidence)

    def _counterexample(
        self,
        c: Contract,
        item: Mapping[str, Any],
        names: list[str],
        found: dict[str, int | bool],
        text: str,
        rlimit: int,
        wall: float,
        sorts: dict[str, str],
        evidence: Z3Evidence,
    ) -> Outcome:
        """The violation, its counterexample made small (greedily in the item's ``minimize`` order, else the
        symbols' order, toward 0 or the lower bound, within :data:`MINIMISE_RLIMIT`), else as found, and
        labelled so (``minimality``); either is confirmed through the plan."""
        wanted = [n for n in (item.get("minimize") or names) if sorts.get(n) == "int"]
        order = [(n, _lower_bound(c.symbols[n])) for n in wanted]
        budget = min(rlimit, MINIMISE_RLIMIT)
        values, minimality = found, "as found"
        if order:
            small, how = z3solve.minimise(text, order, found, rlimit=budget, wall_s=wall, model_of=sorts)
            if how != "as found":
                conf = confirm(c, item, small)
                if conf["refutes"]:
                    values, minimality = small, how
        if values is found:
            conf = confirm(c, item, values)
        evidence = replace(evidence, confirmed_concretely=conf["refutes"])
        cex = {"symbols": values, "minimality": minimality, **conf}
        if not conf["refutes"]:
            return error("solver model did not refute the claim when re-run through the plan", evidence, cex=cex)
        return violated(cex, _reason(conf), evidence)


def _lower_bound(decl: Mapping[str, Any]) -> int:
    """The smallest value of a non-bool symbol (its ``values`` or its range)."""
    if "values" in decl:
        return min(int(v) for v in decl["values"])
    return _symbol_range(decl)[0]


def _timed_out(v: z3solve.Verdict, wall: float, rlimit: int, evidence: Evidence, where: str) -> Outcome:
    """A solve stopped by the clock: the item's deadline (the run loop records the timeout) or the ceiling."""
    if v.deadline:
        raise cancel.DeadlinePassed()
    return error(
        f"timeout: z3 ran past its wall-clock ceiling of {wall:g} s{where} before its rlimit of {rlimit} ran out "
        "(the rlimit is the budget; the ceiling only a safety net)",
        evidence,
    )


def z3_bool(e: Any) -> Any:
    """A Z3 boolean for ``e`` (plain Python/NumPy booleans become BoolVal)."""
    return z3.BoolVal(bool(e)) if isinstance(e, bool | np.bool_) else e


def fresh_z3_context() -> None:
    """Give the item a new main Z3 context, so that its solving (and rlimit use) does not depend on what
    earlier items left in the process (term ids, learned state): the same item spends the same rlimit."""
    z3.z3._main_ctx = None  # z3.main_ctx() makes a new Context at its next use; the old one is freed with its terms


@register_engine
class EnumerateEngine(Engine):
    """Evaluate the claim at every point of the item's bounded domain through the real plan (vectorised)."""

    name = "enumerate"

    def discharge(self, job: Job) -> Outcome:
        c, item = job.contract, job.item
        settings = proof_settings()
        key = cache_key("enumerate", _enumeration_key(c, item)) if settings.cache else None
        hit = cache_get(settings, key) if key else None
        if hit is not None and hit.get("status") == "exhausted":
            fields = {k: hit.get(k) for k in ("points", "points_in_given", "enumeration_seconds")}
            return exhausted(EnumerateEvidence(bound=item.get("bound"), cache="hit", cache_key=key, **fields))
        t0 = time.perf_counter()
        try:
            rows, last, n = self._grid(c, item)
        except _TooLarge as e:
            return error(str(e))
        in_given, failing, first = 0, 0, None
        for grid, m in _chunks(rows, last, n):
            cancel.checkpoint()  # a chunk of a long enumeration: stop here when the run stops or the item is late
            ev = evaluate_statement(c, item, _array_env(c, grid))
            given = np.broadcast_to(np.asarray(ev.given.expr, dtype=bool), (m,)) & _in_domain(c, grid, m)
            ok = np.broadcast_to(np.asarray(ev.prove.expr, dtype=bool), (m,)).copy()
            for cnd in ev.required():
                ok &= np.broadcast_to(np.asarray(cnd.expr, dtype=bool), (m,))
            in_given += int(given.sum())
            bad = np.flatnonzero(given & ~ok)
            failing += int(bad.size)
            if first is None and bad.size:
                first = {name: arr[int(bad[0])] for name, arr in grid.items()}
        evidence = EnumerateEvidence(
            points=int(n),
            points_in_given=in_given,
            bound=item.get("bound"),
            enumeration_seconds=round(time.perf_counter() - t0, 3),
            cache="miss" if key else None,
            cache_key=key,
        )
        if not in_given:
            return error("vacuous: no enumerated point satisfies the assumptions", evidence)
        if first is None:
            if key:
                fields = {k: evidence.get(k) for k in ("points", "points_in_given", "enumeration_seconds")}
                cache_put(settings, key, {"status": "exhausted", **fields})
            return exhausted(evidence)
        values = {name: (bool(v) if c.symbols[name]["type"] == "bool" else int(v)) for name, v in first.items()}
        conf = confirm(c, item, values)
        evidence = replace(evidence, failing_points=failing)
        cex = {"symbols": values, "minimality": "first in enumeration order", **conf}
        return violated(cex, _reason(conf), evidence)

    def _grid(self, c: Contract, item: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], _Expansion | None, int]:
        """(rows, last, n): every bound symbol but the last expanded into ``rows`` (one array each, a row per
        combination so far), the last one's expansion over them (expanded chunk by chunk by :func:`_chunks`) and
        the number of points; no symbol: the one point of an empty grid."""
        given_bound = dict(item.get("bound") or {})
        bound: dict[str, Any] = {}
        for name in _used_symbols(c, item):  # finite domains enumerate themselves, first
            if name not in given_bound:
                d = c.symbols[name]
                if d["type"] == "bool":
                    bound[name] = [0, 1]
                elif "values" in d:
                    bound[name] = {"values": d["values"]}
                else:
                    raise _TooLarge(f"enumerate needs a bound for symbol {name!r}")
        bound.update(given_bound)
        kernel = kernel_of(c, item)
        plan_fn = plans.resolve(kernel["plan"]) if kernel and "plan" in kernel else None
        params = set(plans.plan_parameters(plan_fn)) & set(c.symbols) if plan_fn else set()
        grid: dict[str, np.ndarray] = {}
        n = 1
        for pos, (name, spec) in enumerate(bound.items()):
            cancel.checkpoint()  # a step over millions of rows: stop here when the run stops or the item is late
            if name not in c.symbols:
                raise _TooLarge(f"bound names unknown symbol {name!r}")
            env = _array_env(c, grid)
            decl = c.symbols[name]
            ty_lo, ty_hi = (0, 1) if decl["type"] == "bool" else _type_range(decl["type"])
            with sym.tracking():
                if plan_fn is not None and params <= set(grid):
                    env.update(plans.quantities(plans.call_plan(plan_fn, env)))
                if isinstance(spec, dict):
                    values = _narrow(np.array([int(v) for v in spec["values"]], dtype=object))
                    lo = None
                    counts, total = np.full(n, values.size, dtype=np.int64), n * values.size
                else:
                    lo_s, hi_s = (spec, spec) if not isinstance(spec, list) else spec
                    # Values outside the symbol's machine type are no points of its domain: clipped away.
                    lo = _clipped(_bound_value(lo_s, env, name), n, ty_lo, ty_hi)
                    hi = _clipped(_bound_value(hi_s, env, name), n, ty_lo, ty_hi)
                    counts, total = _counts(lo, hi)
            if counts is None or total > MAX_ENUMERATION_POINTS:
                whole, exact = _whole_size(c, total, list(bound.items())[pos + 1 :])
                if whole == 0:
                    raise _TooLarge("vacuous: the enumeration domain is empty (a later symbol's bound is empty)")
                size = _count_text(whole) if exact else f"at least {_count_text(whole)}"
                raise _TooLarge(f"enumeration domain has {size} points (limit {_count_text(MAX_ENUMERATION_POINTS)})")
            step = _Expansion(name, lo, None if lo is not None else values, counts, np.cumsum(counts))
            if pos == len(bound) - 1:
                return grid, step, total
            grid = dict(_expand(grid, step, 0, total))
            n = total
        return grid, None, n


# Points evaluated at once: the statement's temporaries (a few dozen int64 arrays) stay within the caches' reach
# instead of spanning the whole grid (CONV-TCONV-enum: 13 M points, 100 MB an array).
ENUMERATION_CHUNK = 1 << 18


@dataclass(frozen=True)
class _Expansion:
    """A symbol's expansion over the rows so far: row i gets ``counts[i]`` points (the first at point
    ``ends[i] - counts[i]``), the values ``lo[i]``, ``lo[i] + 1``, ... (a range bound) or ``values`` (a listed
    domain, the same for every row)."""

    name: str
    lo: np.ndarray | None
    values: np.ndarray | None
    counts: np.ndarray
    ends: np.ndarray  # cumsum(counts), computed once for every chunk


def _expand(rows: dict[str, np.ndarray], step: _Expansion, p0: int, p1: int) -> Iterator[tuple[str, np.ndarray]]:
    """Points p0 .. p1 - 1 of ``rows`` expanded by ``step``, in enumeration order (each row's points together)."""
    points = np.arange(p0, p1, dtype=np.int64)
    row = np.searchsorted(step.ends, points, side="right")
    within = points - (step.ends[row] - step.counts[row])
    for k, v in rows.items():
        yield k, v[row]
    yield step.name, step.values[within] if step.lo is None else _narrow(step.lo[row] + within)


def _chunks(
    rows: dict[str, np.ndarray], last: _Expansion | None, n: int
) -> Iterator[tuple[dict[str, np.ndarray], int]]:
    """The grid in chunks of at most ENUMERATION_CHUNK points, in enumeration order: (chunk, points in it)."""
    if last is None:
        yield rows, n
        return
    for p0 in range(0, n, ENUMERATION_CHUNK):
        p1 = min(n, p0 + ENUMERATION_CHUNK)
        yield dict(_expand(rows, last, p0, p1)), p1 - p0


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def _type_range(type_name: str) -> tuple[int, int]:
    t = sym.machine_type(type_name)
    return t.lo, t.hi


def _clipped(v: Any, n: int, lo: int, hi: int) -> np.ndarray:
    """A bound's values (an int or one per row) clipped to [lo, hi], exact: int64 where they fit, else objects."""
    if isinstance(v, int | np.integer):
        c = min(max(int(v), lo), hi)
        return np.full(n, c, dtype=np.int64 if _I64_MIN <= c <= _I64_MAX else object)
    arr = np.broadcast_to(np.asarray(v), (n,))
    if arr.dtype == np.int64:
        return np.clip(arr, max(lo, _I64_MIN), min(hi, _I64_MAX))
    if arr.dtype != object:
        raise _TooLarge(f"a bound is not an integer (it is {arr.dtype})")
    return _narrow(np.minimum(np.maximum(arr, lo), hi))


def _counts(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray | None, int]:
    """Points per row, max(hi - lo + 1, 0), and their exact total; no count is formed past the point limit."""
    if lo.dtype == object or hi.dtype == object:
        exact = np.maximum(hi.astype(object) - lo.astype(object) + 1, 0)
        total = int(exact.sum()) if exact.size else 0
        if total > MAX_ENUMERATION_POINTS:
            return None, total
        return exact.astype(np.int64), total
    nonempty = hi >= lo
    # hi - lo is exact modulo 2**64 and lies in [0, 2**64) where hi >= lo: an int64 subtraction could wrap.
    span = np.where(nonempty, hi.view(np.uint64) - lo.view(np.uint64), np.uint64(0))
    if span.size and int(span.max()) >= MAX_ENUMERATION_POINTS:
        return None, sum(int(d) + 1 for d in span[nonempty].tolist())
    counts = np.where(nonempty, span.astype(np.int64) + 1, 0)
    return counts, int(counts.sum())  # n rows <= the limit, each count < the limit: the sum fits int64


def _narrow(arr: np.ndarray) -> np.ndarray:
    """An exact object array as int64 where every value fits (only uint64 values past 2**63 stay objects)."""
    if arr.dtype != object:
        return arr
    if arr.size == 0 or (arr.min() >= _I64_MIN and arr.max() <= _I64_MAX):
        return arr.astype(np.int64)
    return arr


def _whole_size(c: Contract, so_far: int, rest: list[tuple[str, Any]]) -> tuple[int, bool]:
    """The domain's exact size from the points so far and the bounds not expanded yet (sizes only, nothing
    allocated); ``exact`` is False where a bound is an expression over the rows (then a lower bound)."""
    size = so_far
    for name, spec in rest:
        decl = c.symbols.get(name)
        if decl is None:
            continue
        lo_t, hi_t = (0, 1) if decl["type"] == "bool" else _type_range(decl["type"])
        if isinstance(spec, dict):
            size *= len(spec["values"])
            continue
        lo, hi = (spec, spec) if not isinstance(spec, list) else spec
        if not (isinstance(lo, int) and isinstance(hi, int)):
            return so_far, False  # an expression bound's size depends on the rows: the points so far, at least
        size *= max(min(hi, hi_t) - max(lo, lo_t) + 1, 0)
    return size, True


def _count_text(n: int) -> str:
    """A point count, exact: digits below 10^9, else a power of ten or two, or the digits and a rounded figure."""
    if n < 10**9:
        return str(n)
    for base in (10, 2):
        k = round(math.log(n, base))
        if base**k == n:
            return f"{base}^{k}"
    return f"{n} (~{float(n):.3g})"


class _TooLarge(ValueError):
    pass


def code_digest(c: Contract, item: Mapping[str, Any], *modules: str) -> str:
    """SHA-256 of the code an item's verdict runs: every ``.py`` file of its plan's top-level package (and
    ``spec/`` beside it), of ``obligations/core/`` and the evaluating modules (``obligations/<name>.py``)."""
    here = Path(__file__).parent
    roots = [here / "core", *(here / f for f in (*_EVALUATING, *modules))]
    plan = (kernel_of(c, item) or {}).get("plan")
    if plan:
        top = importlib.import_module(str(plan).partition(":")[0].split(".")[0])
        for d in {Path(p) for p in getattr(top, "__path__", [])} or {Path(str(top.__file__))}:
            roots.append(d)
            if (d.parent / "spec").is_dir():
                roots.append(d.parent / "spec")
    return sources_digest(roots)


def _enumeration_key(c: Contract, item: Mapping[str, Any]) -> dict[str, Any]:
    """What an enumeration's verdict depends on: the statement, the bound, the used symbols' declarations, the
    plan's name and the code it runs (:func:`code_digest`), NumPy's version."""
    names = _used_symbols(c, item)
    return {
        "given": item.get("given"),
        "prove": item.get("prove"),
        "bound": item.get("bound"),
        "symbols": {n: c.symbols[n] for n in names},
        "plan": (kernel_of(c, item) or {}).get("plan"),
        "sources": code_digest(c, item),
        "numpy": np.__version__,
    }


_EVALUATING = ("expr.py", "statements.py", "engines.py")


def _in_domain(c: Contract, grid: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """Points whose every symbol lies in its declared type and domain (bounds may reach outside)."""
    mask = np.ones(n, dtype=bool)
    for name, arr in grid.items():
        d = c.symbols[name]
        if d["type"] == "bool":
            continue
        lo, hi = _symbol_range(d)
        mask &= (arr >= lo) & (arr <= hi)
        if "values" in d:
            # Exact on both sides: NumPy would compare 2**64 - 1 in a list with an int64 array as a float.
            values = _narrow(np.array([int(v) for v in d["values"]], dtype=object))
            if arr.dtype == object or values.dtype == object:
                arr, values = arr.astype(object), values.astype(object)
            mask &= np.isin(arr, values)
    return mask


def _bound_value(spec: Any, env: Mapping[str, Any], name: str = "") -> Any:
    """A bound's exact integer value(s): an int, or an array with one value per row of the grid so far."""
    if isinstance(spec, bool):
        raise _TooLarge(f"the bound of {name!r} is a condition, not an integer")
    if isinstance(spec, int):
        return spec
    v = exprlang.parse(spec).evaluate(env)
    if isinstance(v, sym.Term):
        return v.expr
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    raise _TooLarge(f"the bound {spec!r} of {name!r} is a condition, not an integer")


@register_engine
class SympyEngine(Engine):
    """Prove an identity ``lhs == rhs`` over the reals by symbolic simplification."""

    name = "sympy"

    def discharge(self, job: Job) -> Outcome:
        import sympy

        settings = proof_settings()
        key = None
        if settings.cache:
            roots = [Path(__file__).parent / f for f in _EVALUATING]
            parts = {"prove": job.item["prove"], "sympy": sympy.__version__, "sources": sources_digest(roots)}
            key = cache_key("sympy", parts)
            hit = cache_get(settings, key)
            if hit is not None and hit.get("status") == "proved":
                reused = SympyEvidence(sympy_version=sympy.__version__, simplified_difference="0", cache="hit")
                return proved(replace(reused, cache_key=key))
        e = exprlang.parse(job.item["prove"]).to_sympy()
        if not isinstance(e, sympy.Equality):
            return error("a sympy obligation proves one identity 'lhs == rhs'")
        real = {s: sympy.Symbol(s.name, real=True) for s in e.free_symbols}
        lhs, rhs = e.lhs.xreplace(real), e.rhs.xreplace(real)
        diff = sympy.simplify(lhs - rhs)
        evidence = SympyEvidence(
            sympy_version=sympy.__version__,
            simplified_difference=str(diff),
            cache="miss" if key else None,
            cache_key=key,
        )
        if diff == 0:
            if key:
                cache_put(settings, key, {"status": "proved"})
            return proved(evidence)
        rng = np.random.default_rng(job.seed)
        for _ in range(20):
            point = {s: sympy.Rational(int(rng.integers(-50, 50)), int(rng.integers(1, 9))) for s in real.values()}
            val = diff.subs(point)
            if val.is_number and abs(float(val)) > 1e-9:
                return violated(
                    {"point": {str(k): str(v) for k, v in point.items()}, "difference": str(val)},
                    "the identity differs at this point",
                    evidence,
                )
        return unknown("sympy could not simplify the difference to 0 and found no refuting point", evidence)


class _RegisteredTestEngine(Engine):
    """Run the registered falsification test the item names; its evidence is typed as this engine's kind."""

    evidence_class: ClassVar[type[Evidence]] = FalsifyEvidence

    def discharge(self, job: Job) -> Outcome:
        from falsification.registry import FalsifyContext, get_test

        item = job.item
        if "test" not in item:
            return skipped(f"no check wired yet: {item.get('pending', 'no registered test named')}")
        failed = import_test_modules(job.contract)  # a contract loaded unchecked has not imported them yet
        if failed:
            return error(failed[0][1])
        test = get_test(item["test"])
        if test is None:
            return error(f"no registered test named {item['test']!r}")
        if job.device not in test.devices:
            return skipped(f"test {test.name!r} runs on {', '.join(test.devices)}; this run is on {job.device}")
        if item.get("kernel") and (why := kernel_unavailable(job.contract.data["kernels"].get(item["kernel"]))):
            return skipped(why)  # e.g. a Triton kernel where triton is not installed: nothing ran, nothing passed
        witnesses: Mapping[str, Mapping[str, int]] = {}
        if item.get("witnesses"):
            found = _regime_witnesses(job.contract, str(item["witnesses"]))
            if isinstance(found, str):
                return error(found)
            witnesses = found
        ctx = FalsifyContext(
            device=job.device,
            profile=job.profile,
            seed=job.seed,
            item=dict(item),
            contract=job.contract.data,
            contract_path=shown_path(job.contract.path),
            witnesses=witnesses,
            draws=_draw_store(),
        )
        if test.pure or test.device_pure:
            return with_evidence_kind(_unreported_witnesses(_pure_run(test, ctx), witnesses), self.evidence_class)
        return with_evidence_kind(_unreported_witnesses(test.run(ctx), witnesses), self.evidence_class)


def _code_identity() -> dict[str, str]:
    """What a falsification result computed here depends on besides its item: the digest of the project packages a
    test runs (spec, native, falsification, obligations/core) and the Python and NumPy versions."""
    import platform

    here = Path(__file__).parent
    sources = sources_digest([here / "core", *(here.parent / d for d in ("spec", "native", "falsification"))])
    return {"sources": sources, "python": platform.python_version(), "numpy": np.__version__}


@dataclass(frozen=True)
class _ProofCacheDraws:
    """The run's falsification draw store (:class:`falsification.registry.DrawStore`) in the proof cache: a check's
    Hypothesis cases stored under its strategy's description, seed, example count, the Hypothesis, Python and NumPy
    versions and the project's source, reused by a later run instead of being drawn again."""

    settings: Any

    def key(self, parts: Mapping[str, Any]) -> str:
        """The proof-cache key of the draws ``parts`` describes, with the project's source and versions."""
        return cache_key("draws", {**parts, **_code_identity()})

    def get(self, key: str) -> list[Any] | None:
        """The stored JSON cases of ``key``, or None."""
        hit = cache_get(self.settings, key)
        cases = hit.get("cases") if hit is not None and hit.get("status") == "drawn" else None
        return cases if isinstance(cases, list) else None

    def put(self, key: str, cases: list[Any]) -> None:
        """Store the JSON cases under ``key``."""
        cache_put(self.settings, key, {"status": "drawn", "cases": cases})


def _draw_store() -> _ProofCacheDraws | None:
    settings = proof_settings()
    return _ProofCacheDraws(settings) if settings.cache else None


def _pure_key(test: Any, ctx: Any) -> str:
    """The proof-cache key of a pure test's verdict: the test, the item's terms, seed, profile and device, the source
    of every project package it may run (spec, native, falsification, obligations/core) and the Python and NumPy
    versions; for a device-pure test also the device's identity (GPU model, drivers, CUDA runtime, NVRTC)."""
    from obligations.core.device import device_identity

    identity = {"device_identity": device_identity(ctx.device)} if test.device_pure else {}
    parts = {
        **identity,
        "test": test.name,
        "params": ctx.params,
        "tolerance": ctx.tolerance,
        "agreement": ctx.agreement,
        "seed": ctx.seed,
        "profile": str(ctx.profile),
        "device": ctx.device,
        "witnesses": ctx.witnesses,
        **_code_identity(),
    }
    return cache_key("falsify", parts)


def _pure_run(test: Any, ctx: Any) -> Outcome:
    """Run a pure or device-pure test (:class:`falsification.registry.FalsificationTest`), reusing its passed verdict
    from the proof cache where the same code already passed the same item (on a device of the same identity, for a
    device-pure test), with evidence ``cache: hit`` and the key, as enumerations are; anything but a pass is always
    found again."""
    from falsification.engine import evidence_dict

    settings = proof_settings()
    key = _pure_key(test, ctx) if settings.cache and ctx.replay is None else None
    hit = cache_get(settings, key) if key else None
    if hit is not None and hit.get("status") == "passed" and isinstance(hit.get("evidence"), dict):
        ev = {k: v for k, v in hit["evidence"].items() if k != "kind"}
        return passed(**ev, cache="hit", cache_key=key)
    out = test.run(ctx)
    if key is None or not isinstance(out, Outcome) or out.status.value != "passed":
        return out
    ev = evidence_dict(out)
    cache_put(settings, key, {"status": "passed", "evidence": ev})
    ev.pop("kind", None)
    return passed(**ev, cache="miss", cache_key=key)


def _unreported_witnesses(out: Any, witnesses: Mapping[str, Mapping[str, int]]) -> Any:
    """``out`` where its test took witnesses but reported none of a kind: each of that kind counted unreached, so
    ``--strict`` fails on a test that ignores the witnesses it was given (the engine's checks report them)."""
    from falsification.engine import evidence_dict, with_evidence

    if not witnesses or not isinstance(out, Outcome) or out.status.value not in ("passed", "violated"):
        return out
    regime_w, accept, reject = plans.split_witnesses(witnesses)
    ev = evidence_dict(out)
    added: dict[str, Any] = {}
    if regime_w and "regimes_reached" not in ev:
        added.update(regimes_reached=dict.fromkeys(regime_w, 0), regimes_unreached=list(regime_w))
    if (accept or reject) and "boundaries_reached" not in ev:
        names = [*accept, *reject]
        added.update(boundaries_reached=dict.fromkeys(names, 0), boundaries_unreached=names)
    if not added:
        return out
    ev.pop("kind", None)
    return with_evidence(out, {**ev, **added})


_WITNESSES: dict[tuple[str, str, str], Mapping[str, Mapping[str, int]] | str] = {}


def _regime_witnesses(contract: Contract, regimes_id: str) -> Mapping[str, Mapping[str, int]] | str:
    """The witnesses the regimes item ``regimes_id`` of ``contract`` finds (cached), or why there are none."""
    key = (contract.path, contract.sha256, regimes_id)
    if key not in _WITNESSES:
        target = next((it for it in contract.items if it["id"] == regimes_id), None)
        if target is None or target.get("method") != "regimes":
            _WITNESSES[key] = f"witnesses: {regimes_id!r} is not a regimes item of this contract"
        else:
            out = get_engine("regimes").discharge(Job(contract, target))
            w = out.evidence.get("witnesses")
            _WITNESSES[key] = dict(w) if w else f"regimes item {regimes_id} found no witnesses ({out.reason})"
    return _WITNESSES[key]


@register_engine
class FalsifyEngine(_RegisteredTestEngine):
    name = "falsify"


@register_engine
class MeasureEngine(_RegisteredTestEngine):
    name = "measure"
    evidence_class = MeasureEvidence


@register_engine
class AssumeEngine(Engine):
    """A named assumption: reported as assumed, never as proved."""

    name = "assume"

    def discharge(self, job: Job) -> Outcome:
        name = job.item["assumption"]
        return assumed(name, f"assumed, not checked: {name}")
