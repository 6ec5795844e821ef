"""Plan regimes (method ``regimes``): a plan names the code paths its values select; Z3 proves they cover
the domain and finds the smallest witness of each, so falsification can run every path on purpose.

A plan exposes ``regimes``: a mapping (or a method returning one) from a regime name to a condition over
its values, e.g. for a grid-stride loop ``{"one_trip": iterations <= 1, "grid_stride": iterations > 1}``.
For an item ``method: regimes`` the engine

1. proves ``domain and given -> (r1 or r2 or ...)`` together with the plan's side-conditions (coverage);
2. for each regime, asks Z3 for a witness inside the domain, the given and the item's ``bound``, minimising
   the item's ``minimize`` symbols in order (default: the plan's non-bool parameters), so the witness is
   the smallest input that reaches it (a launch knob such as ``max_grid`` may shrink to reach a loop
   with few elements: the test launches with the same plan call).

3. for each conjunct of each guard the item names under ``boundaries:`` (an expression over the symbols and
   the plan's quantities, e.g. ``admissible`` or ``accepts(a_bytes, b_bytes, c_bytes)``; or a mapping
   ``{guard: <expression>, bound: {...}}`` whose bound overrides the item's for that guard), asks Z3 for the
   smallest input on each side of the conjunct's limit: ``accept``, the guard holds with the conjunct exactly
   at its limit (``x <= y`` at ``x == y``, ``i < n`` at ``i == n - 1``; under the item's ``given`` and the
   plan's side-conditions, like a regime's witness), and ``reject``, every other conjunct of the guard holds
   and this one is one past its limit (``x == y + 1``, ``i == n``: an index equal to a table size).

The witnesses are evidence and, for the falsification items that name this item under ``witnesses:``,
explicit cases (``FalsifyContext.witnesses``; a boundary witness is named ``"<conjunct> @accept"`` or
``"<conjunct> @reject"``, see :func:`obligations.core.plans.boundary_name`): an accepted one runs and is
judged like any case, a rejected one must be refused by the entry point's guard. A regime with no witness is a
violation (the plan names a path the bounds cannot reach), and so is a conjunct with no accepted witness at its
limit, or with no rejected one where only the bounds exclude it. A conjunct that no input of the domain
violates while the others hold (implied by them) has no rejected witness, and the evidence says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import z3

from obligations import expr as exprlang
from obligations import z3solve
from obligations.core import cancel, plans
from obligations.core import symbolic as sym
from obligations.core.evidence import RegimeEvidence, evidence_from_json
from obligations.core.plans import boundary_name, plan_regimes, regime_of
from obligations.core.results import Outcome, error, proved, unknown, violated
from obligations.engines import (
    DEFAULT_RLIMIT,
    Engine,
    Job,
    code_digest,
    domain_constraints,
    fresh_z3_context,
    register_engine,
    z3_bool,
)
from obligations.proofcache import cache_get, cache_key, cache_put, proof_settings
from obligations.statements import kernel_of

__all__ = ["RegimesEngine", "guard_specs", "plan_regimes", "regime_of"]


def _bounds(contract: Any, item: Mapping[str, Any], env: Mapping[str, Any]) -> list[Any]:
    out = []
    for name, spec in (item.get("bound") or {}).items():
        lo, hi = (spec, spec) if not isinstance(spec, list) else spec
        x = env[name].expr
        out += [x >= int(lo), x <= int(hi)]
    return out


@register_engine
class RegimesEngine(Engine):
    """Coverage of the plan's regimes (proved with Z3) and the smallest witness of each."""

    name = "regimes"

    def discharge(self, job: Job) -> Outcome:
        """Prove the regimes cover the domain, find a minimal witness per regime and per guard boundary side;
        a proved result is stored in the proof cache and reused while the item, its kernel, the symbols and
        the code it runs are unchanged."""
        settings = proof_settings()
        key = None
        if settings.cache:
            c, item = job.contract, job.item
            parts = {
                "item": {k: v for k, v in item.items() if k not in ("location", "id")},
                "kernel": kernel_of(c, item),
                "symbols": c.symbols,
                "sources": code_digest(c, item, "regimes.py", "z3solve.py"),
                "z3": z3.get_version_string(),
            }
            key = cache_key("regimes", parts)
            hit = cache_get(settings, key)
            if hit is not None and hit.get("status") == "proved":
                reused = evidence_from_json(hit.get("evidence"))
                if isinstance(reused, RegimeEvidence):
                    return proved(replace(reused, cache="hit", cache_key=key))
        out = self._discharge(job)
        if key is not None and isinstance(out.evidence, RegimeEvidence):
            out = replace(out, evidence=replace(out.evidence, cache="miss", cache_key=key))
            if out.status.value == "proved":
                cache_put(settings, key, {"status": "proved", "evidence": out.evidence.to_json()})
        return out

    def _discharge(self, job: Job) -> Outcome:
        fresh_z3_context()
        c, item = job.contract, job.item
        kernel = kernel_of(c, item)
        if kernel is None or "plan" not in kernel:
            return error("method regimes needs the item's kernel to have a plan")
        fn = plans.resolve(kernel["plan"])
        params = [p for p in plans.plan_parameters(fn) if p in c.symbols]
        rlimit = int(item.get("rlimit", DEFAULT_RLIMIT))
        guards = guard_specs(item)
        named = {n for text in [item.get("given") or "", *(g for g, _ in guards)] if text for n in _names(text)}
        wanted = set(params) | set(item.get("bound") or {}) | {n for _, b in guards for n in b}
        with sym.tracking() as tracker:
            env = plans.symbolic_env(c.symbols, wanted | (named & set(c.symbols)))
            qs = plans.quantities(plans.call_plan(fn, env))
            regimes = plan_regimes(qs)
            given = sym.BoolTerm(True)
            if item.get("given"):
                given = exprlang.parse(item["given"]).evaluate({**env, **qs})
            n_plan = len(tracker.conditions)  # the coverage claim keeps the plan's and the given's own conditions
            guard_terms = [(text, bound, exprlang.parse(text).evaluate({**env, **qs})) for text, bound in guards]
        if not regimes:
            return error(f"plan {kernel['plan']} names no regimes")
        for text, _, term in guard_terms:
            if not isinstance(term, sym.BoolTerm) or not z3.is_expr(term.expr):
                return error(f"boundaries: {text!r} is not a condition over the symbols (it is {term!r})")
        all_conds = [z3_bool(x.expr) for x in tracker.conditions]
        conds = all_conds[:n_plan]
        domain = domain_constraints(c, {n: v for n, v in env.items() if n in c.symbols}) + [z3_bool(given.expr)]
        any_regime = z3.Or(*[z3_bool(sym.all_of(r).expr) for r in regimes.values()])
        s = _solver(z3.Solver, [*domain, z3.Not(z3.And(any_regime, *conds))])
        r = _answer(s, rlimit)
        evidence = RegimeEvidence(regimes=sorted(regimes), plan=kernel["plan"], rlimit=rlimit)
        if r == "timeout":  # the wall ceiling or the item's deadline: a fault of the run, not the solver's answer
            return error("timeout: the coverage proof ran past its time limit", evidence)
        if r not in ("sat", "unsat"):
            return unknown(f"coverage: solver returned unknown ({r})", evidence)
        if r == "sat":
            m = s.model()
            point = {n: _value(m, v) for n, v in env.items()}
            return violated({"symbols": point}, "no regime (or a side-condition fails) at this point", evidence)
        order = list(item.get("minimize") or [p for p in params if c.symbols[p]["type"] != "bool"])
        witnesses: dict[str, dict[str, int | bool]] = {}
        missing = []
        undecided: list[str] = []  # no answer within the rlimit (unknown) or the time limit (error): never violated
        for name, cond in regimes.items():  # lexicographic over ``order``: the first symbol matters most
            found = _smallest(
                [*domain, *_bounds(c, item, env), z3_bool(sym.all_of(cond).expr), *conds], env, order, rlimit
            )
            if isinstance(found, dict):
                witnesses[name] = found
            elif found == "unsat":
                missing.append(name)
            else:
                undecided.append(f"{name} ({found})")
        # Boundaries: every symbol is minimised (the item's order first), so a witness is one definite input.
        b_order = order + sorted(n for n in env if n not in order and c.symbols[n]["type"] != "bool")
        boundaries: dict[str, dict[str, Any]] = {}
        declared = domain_constraints(c, {n: v for n, v in env.items() if n in c.symbols})
        seen: set[str] = set()
        for text, bound, term in guard_terms:
            parts = _conjuncts(term.expr)
            bounds = _bounds(c, {"bound": {**(item.get("bound") or {}), **bound}}, env)
            # A guard's own bound replaces the declared range of its symbols (e.g. head_dim up to one past the
            # guard's 128): the rejected side of a limit the declared domain also states is searched there.
            domain_r = _domain_without(c, env, set(bound))  # the rejected side: no given
            domain_g = domain_r + [z3_bool(given.expr)]
            for k, conj in enumerate(parts):
                full = " ".join(str(conj).split())
                # the conjunct's own text where it reads (head_dim <= 128), else the guard and its position
                label = full if len(full) <= 48 else f"{text} #{k}"
                if full in seen or label in boundaries:  # a conjunct two guards share gets its witnesses once
                    continue
                seen.add(full)
                at, past = _limits(conj)
                others = parts[:k] + parts[k + 1 :]
                rejected = [*domain_r, *bounds, *others, past]
                feasible = _satisfiable(rejected, rlimit)
                reject = _smallest(rejected, env, b_order, rlimit) if feasible == "sat" else feasible
                # implied: the declared domain has no input past this limit where the others hold (no bounds); the
                # domain enforces the limit, so neither side needs a witness
                implied = reject == "unsat" and _satisfiable([*declared, *others, past], rlimit) == "unsat"
                accepted = [*domain_g, *bounds, z3_bool(term.expr), *all_conds, at]
                accept = None if implied else _smallest(accepted, env, b_order, rlimit)
                info: dict[str, Any] = {"guard": text, "accept": isinstance(accept, dict)}
                if full != label:
                    info["conjunct"] = full
                info["reject"] = isinstance(reject, dict)
                if implied:
                    info["implied"] = "the declared domain has no input past this limit while the other conjuncts hold"
                for side, found in (("accept", accept), ("reject", reject)):
                    if isinstance(found, dict):
                        witnesses[boundary_name(label, side)] = found
                    elif not implied and found == "unsat":
                        why = "; the bounds exclude it" if side == "reject" else ""
                        missing.append(f"{boundary_name(label, side)} ({found}{why})")
                    elif not implied:
                        undecided.append(f"{boundary_name(label, side)} ({found})")
                boundaries[label] = info
        evidence = RegimeEvidence(
            regimes=sorted(regimes),
            plan=kernel["plan"],
            rlimit=rlimit,
            witnesses=witnesses,
            boundaries=boundaries or None,
        )
        timed_out = [u for u in undecided if u.endswith("(timeout)")]
        if timed_out:
            return error(f"timeout: the witness search ran past its time limit for {timed_out}", evidence)
        if missing:
            return violated(
                {"unreached": missing}, f"regimes or boundaries with no witness within the bounds: {missing}", evidence
            )
        if undecided:
            return unknown(f"the witness search ran out of its rlimit ({rlimit}) for {undecided}", evidence)
        return proved(evidence)


def _domain_without(c: Any, env: Mapping[str, Any], widened: set[str]) -> list[Any]:
    """The symbols' declared domain, where the ``widened`` ones keep only their machine type's range."""
    out = domain_constraints(c, {n: v for n, v in env.items() if n not in widened})
    for n in [n for n in env if n in widened]:  # env order: a set's order follows the hash seed, and Z3 the order
        if c.symbols[n]["type"] != "bool":
            t = sym.machine_type(c.symbols[n]["type"])
            out += [env[n].expr >= t.lo, env[n].expr <= t.hi]
    return out


def guard_specs(item: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The item's ``boundaries:`` as (guard expression, bound override) pairs."""
    out = []
    for entry in item.get("boundaries") or []:
        if isinstance(entry, Mapping):
            out.append((str(entry["guard"]), dict(entry.get("bound") or {})))
        else:
            out.append((str(entry), {}))
    return out


def _names(text: str) -> set[str]:
    e = exprlang.parse(text)
    return e.names()


def _conjuncts(e: Any) -> list[Any]:
    """The conjuncts of a Z3 condition (nested ``And`` flattened, constant true parts dropped)."""
    if z3.is_and(e):
        return [x for ch in e.children() for x in _conjuncts(ch)]
    return [] if z3.is_true(e) or z3.is_true(z3.simplify(e)) else [e]  # constant parts (dilation 1 >= 1) have no limit


def _limits(e: Any) -> tuple[Any, Any]:
    """(the conjunct exactly at its limit, the conjunct one past it) for an integer comparison; else (e, not e)."""
    kids = e.children()
    if len(kids) == 2 and all(z3.is_arith(k) for k in kids):
        d = kids[0] - kids[1]
        for op, at, past in (
            (z3.Z3_OP_LE, 0, 1),
            (z3.Z3_OP_LT, -1, 0),
            (z3.Z3_OP_GE, 0, -1),
            (z3.Z3_OP_GT, 1, 0),
        ):
            if z3.is_app_of(e, op):
                return d == at, d == past
        if z3.is_eq(e):
            return e, z3.Or(d == 1, d == -1)
    if z3.is_distinct(e) and len(kids) == 2 and all(z3.is_arith(k) for k in kids):
        d = kids[0] - kids[1]
        return z3.Or(d == 1, d == -1), kids[0] == kids[1]
    if z3.is_not(e) and z3.is_eq(kids[0]) and all(z3.is_arith(k) for k in kids[0].children()):
        a, b = kids[0].children()
        return z3.Or(a - b == 1, a - b == -1), kids[0]
    return e, z3.Not(e)


def _answer(solver: Any, rlimit: int) -> str:
    """Check ``solver`` (a Solver or an Optimize) under ``rlimit``, the budget its answer may depend on; the wall
    ceiling or the item's deadline is only a safety net. Returns "sat", "unsat", "timeout" (the net fired: a fault
    of the run, never an answer), "rlimit exhausted" or "unknown: <Z3's reason>"."""
    left = cancel.remaining()
    wall = z3solve.WALL_CEILING_S if left is None else min(left, z3solve.WALL_CEILING_S)
    solver.set("rlimit", rlimit)
    solver.set("timeout", max(1, int(wall * 1000)))
    t0 = time.perf_counter()
    r = z3solve.check(solver)
    if r != z3.unknown:
        return str(r)
    why = solver.reason_unknown()
    if why == "timeout" or (why == "canceled" and time.perf_counter() - t0 >= wall):
        return "timeout"
    # Z3 names a spent rlimit "canceled" or "max. resource limit exceeded" depending on where it stopped
    return "rlimit exhausted" if why in ("canceled", "max. resource limit exceeded") else f"unknown: {why}"


def _solver(kind: Callable[..., Any], constraints: list[Any]) -> Any:
    """A Solver or Optimize (``kind``) over ``constraints`` copied into a new Z3 context, its seed fixed: its
    answer and rlimit use depend only on the constraints, never on what the process solved before (a pytest
    worker's earlier tests moved one boundary search of ATT-REGIMES past its 50M rlimit on an H200)."""
    ctx = z3.Context()
    s = kind(ctx=ctx)
    s.set("random_seed", z3solve.SEED)
    s.add(*[c.translate(ctx) for c in constraints])
    return s


def _satisfiable(constraints: list[Any], rlimit: int) -> str:
    """The solver's answer on ``constraints``: "sat", "unsat", or why it has none (as :func:`_answer`)."""
    return _answer(_solver(z3.Solver, constraints), rlimit)


def _smallest(
    constraints: list[Any], env: Mapping[str, Any], order: list[str], rlimit: int
) -> dict[str, int | bool] | str:
    """The lexicographically smallest point (over ``order``) satisfying ``constraints``, else "unsat" or why the
    solver gave none (as :func:`_answer`)."""
    opt = _solver(z3.Optimize, constraints)
    for sname in order:
        opt.minimize(env[sname].expr.translate(opt.ctx))
    res = _answer(opt, rlimit)
    if res != "sat":
        return res
    m = opt.model()
    return {n: _value(m, v) for n, v in env.items()}


def _value(model: z3.ModelRef, term: Any) -> int | bool:
    v = model.evaluate(term.expr.translate(model.ctx), model_completion=True)
    return bool(z3.is_true(v)) if isinstance(term, sym.BoolTerm) else v.as_long()
