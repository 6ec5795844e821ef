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

The witnesses are evidence and, for the falsification items that name this item under ``witnesses:``,
explicit cases (``FalsifyContext.witnesses``). A regime with no witness is a violation: the plan names a
path the bounds cannot reach.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import z3

from obligations import expr as exprlang
from obligations.core import plans
from obligations.core import symbolic as sym
from obligations.core.evidence import RegimeEvidence
from obligations.core.plans import plan_regimes, regime_of
from obligations.core.results import Outcome, error, proved, unknown, violated
from obligations.engines import (
    DEFAULT_RLIMIT,
    Engine,
    Job,
    domain_constraints,
    fresh_z3_context,
    register_engine,
    z3_bool,
)
from obligations.statements import kernel_of

__all__ = ["RegimesEngine", "plan_regimes", "regime_of"]


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
        """Prove the regimes cover the domain and find a minimal witness per regime."""
        fresh_z3_context()
        c, item = job.contract, job.item
        kernel = kernel_of(c, item)
        if kernel is None or "plan" not in kernel:
            return error("method regimes needs the item's kernel to have a plan")
        fn = plans.resolve(kernel["plan"])
        params = [p for p in plans.plan_parameters(fn) if p in c.symbols]
        rlimit = int(item.get("rlimit", DEFAULT_RLIMIT))
        with sym.tracking() as tracker:
            env = plans.symbolic_env(c.symbols, set(params) | set(item.get("bound") or {}))
            regimes = plan_regimes(plans.quantities(plans.call_plan(fn, env)))
            given = sym.BoolTerm(True)
            if item.get("given"):
                given = exprlang.parse(item["given"]).evaluate(env)
        if not regimes:
            return error(f"plan {kernel['plan']} names no regimes")
        conds = [z3_bool(tracker.conditions[i].expr) for i in range(len(tracker.conditions))]
        domain = domain_constraints(c, {n: v for n, v in env.items() if n in c.symbols}) + [z3_bool(given.expr)]
        any_regime = z3.Or(*[z3_bool(sym.all_of(r).expr) for r in regimes.values()])
        s = z3.Solver()
        s.set("rlimit", rlimit)
        s.add(*domain, z3.Not(z3.And(any_regime, *conds)))
        r = s.check()
        evidence = RegimeEvidence(regimes=sorted(regimes), plan=kernel["plan"], rlimit=rlimit)
        if r == z3.unknown:
            return unknown(f"coverage: solver returned unknown ({s.reason_unknown()})", evidence)
        if r == z3.sat:
            m = s.model()
            point = {n: _value(m, v) for n, v in env.items()}
            return violated({"symbols": point}, "no regime (or a side-condition fails) at this point", evidence)
        order = list(item.get("minimize") or [p for p in params if c.symbols[p]["type"] != "bool"])
        witnesses: dict[str, dict[str, int | bool]] = {}
        missing = []
        for name, cond in regimes.items():
            opt = z3.Optimize()
            opt.set("timeout", 60_000)
            opt.add(*domain, *_bounds(c, item, env), z3_bool(sym.all_of(cond).expr), *conds)
            for sname in order:  # lexicographic: the first symbol matters most
                opt.minimize(env[sname].expr)
            res = opt.check()
            if res != z3.sat:
                missing.append(name if res == z3.unsat else f"{name} (solver: {res})")
                continue
            m = opt.model()
            witnesses[name] = {n: _value(m, v) for n, v in env.items()}
        evidence = RegimeEvidence(regimes=sorted(regimes), plan=kernel["plan"], rlimit=rlimit, witnesses=witnesses)
        if missing:
            return violated({"unreached": missing}, f"regimes with no witness within the bounds: {missing}", evidence)
        return proved(evidence)


def _value(model: z3.ModelRef, term: Any) -> int | bool:
    v = model.evaluate(term.expr, model_completion=True)
    return bool(z3.is_true(v)) if isinstance(term, sym.BoolTerm) else v.as_long()
