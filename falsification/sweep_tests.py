"""Exhaustive sweeps as contract items: every binary32 input of a unary kernel on the GPU, sampled on the host."""

from __future__ import annotations

from typing import Any

from falsification import engine
from falsification.registry import FalsifyContext, register_test
from falsification.sweep import sweep
from obligations.core.results import Outcome

__all__ = ["exhaustive_sweep"]


@register_test("elementwise.sweep", device_pure=True)
def exhaustive_sweep(ctx: FalsifyContext) -> Outcome:
    """A unary kernel against its reference on all 2^32 inputs (cuda) or a seeded sample (host), max-ULP bounded."""
    p = ctx.params
    bound = p.get("bound", ctx.tolerance)
    agreement = (
        engine.item_agreement(ctx, "bitwise") if not bound else engine.item_agreement(ctx, "max_ulp", bound=int(bound))
    )
    if (bad := engine.check_stated_agreement(ctx, agreement)) is not None:
        return bad
    kwargs: dict[str, Any] = {
        "route": p.get("route", "nvrtc-ieee"),
        "bound": bound,
        "seed": ctx.seed,
        "reference": p.get("reference", "auto"),
    }
    if p.get("variant"):
        kwargs["variant"] = p["variant"]
    if p.get("operand") is not None:
        kwargs["operand"] = int(str(p["operand"]), 0)
    if ctx.device != "cuda":
        kwargs["sample"] = ctx.budget.bulk  # the host cannot visit 2^32 inputs inside CI's budget
    r = sweep(p["op"], p.get("env"), device=ctx.device, **kwargs)
    ev = {
        "exhaustive": r["exhaustive"],
        "domain": "all 2^32 binary32 bit patterns" if r["exhaustive"] else f"{r['elements']} sampled patterns",
        "reference": r.get("reference"),
        "max_ulp": r.get("max_ulp"),
        "ulp_histogram": r.get("histogram") or {},
        **{
            k: r.get(k)
            for k in (
                "seconds",
                "native_seconds",
                "reference_seconds",
                "compare_seconds",
                "compile_seconds",
                "comparison",
                "operand",
                "elements_per_s",
                "route",
            )
        },
        "sample_seed": r.get("seed"),
    }
    if r["disagreements"]:
        first = (r.get("first_counterexamples") or [{}])[0]
        return engine.outcome_violated(
            ctx, first, f"{r['disagreements']} of {r['elements']} inputs disagree", agreement, cases=r["elements"], **ev
        )
    return engine.outcome_passed(ctx, r["elements"], agreement, **ev)
