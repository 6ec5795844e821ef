"""Exhaustive sweeps as contract items: every binary32 input of a unary kernel on the GPU, sampled on the host."""

from __future__ import annotations

from typing import Any

from falsification.registry import FalsifyContext, register_test
from falsification.sweep import sweep
from obligations.core.results import Outcome, passed, violated

__all__ = ["exhaustive_sweep", "HOST_SAMPLE"]

# The host cannot visit 2^32 inputs inside CI's budget: it checks a seeded sample and says so.
HOST_SAMPLE = {"quick": 1 << 18, "full": 1 << 22}


@register_test("elementwise.sweep")
def exhaustive_sweep(ctx: FalsifyContext) -> Outcome:
    """A unary kernel against its reference on all 2^32 inputs (cuda) or a seeded sample (host), max-ULP bounded."""
    p = ctx.params
    bound = p.get("bound", ctx.tolerance)
    kwargs: dict[str, Any] = {"route": p.get("route", "nvrtc-ieee"), "bound": bound, "seed": ctx.seed,
                              "reference": p.get("reference", "softfloat" if bound in (None, 0) else "float64")}
    if p.get("variant"):
        kwargs["variant"] = p["variant"]
    if ctx.device != "cuda":
        kwargs["sample"] = HOST_SAMPLE[ctx.profile]
    r = sweep(p["op"], p.get("env"), device=ctx.device, **kwargs)
    hist = r.get("histogram") or {}
    evidence = {
        "cases": r["elements"],
        "exhaustive": r["exhaustive"],
        "domain": "all 2^32 binary32 bit patterns" if r["exhaustive"] else f"{r['elements']} sampled patterns",
        "agreement": "bitwise" if not bound else f"max_ulp <= {bound}",
        "reference": r.get("reference"),
        "max_ulp": r.get("max_ulp"),
        "ulp_histogram": hist,
        "seconds": r["seconds"],
        "native_seconds": r.get("native_seconds"),
        "reference_seconds": r.get("reference_seconds"),
        "compare_seconds": r.get("compare_seconds"),
        "comparison": r.get("comparison"),
        "elements_per_s": r.get("elements_per_s"),
        "seed": r.get("seed"),
        "route": r.get("route"),
    }
    if r["disagreements"]:
        first = (r.get("first_counterexamples") or [{}])[0]
        return violated(first, f"{r['disagreements']} of {r['elements']} inputs disagree", **evidence)
    return passed(**evidence)
