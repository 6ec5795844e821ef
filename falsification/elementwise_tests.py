"""Falsification tests of the elementwise family, registered for contract items by name.

Registered names and their ``params`` (contract items pass them; every name takes ``variant`` for
planted-bug builds, used by the project's own tests only):

* ``elementwise.bitwise`` {op, route="nvrtc-ieee", env=<route's env>, nan_policy="exact",
  refute_envs=[], layouts=[...]} — bit-identical to softfloat under ``env``. Each env in ``refute_envs``
  names a claim the evidence must show false for this build (e.g. the stock CuPy route under "cuda"):
  the minimal counterexample is recorded, and a claim that holds makes the item fail.
* ``elementwise.max_ulp`` {op, bound (or the item's tolerance), bound_fn, route, env} — ULP distance
  to the correctly rounded value (float64 evaluation, ambiguous roundings accept both neighbours).
  ``bound_fn`` names a per-input bound from :data:`ULP_BOUNDS` (sigmoid, gelu).
* ``elementwise.fma_contraction`` {op, promise="separate"|"fused", route} — bitwise against the promised
  rounding; the evidence also checks the other promise and records whether it is refuted.
* ``elementwise.backward_fd`` {op, rel_tol=1e-4 (or tolerance), h_rel=1e-4} — backward rule vs central
  finite differences of the float64 forward, away from kinks; the convention exactly at kinks.
* ``elementwise.determinism`` {op, runs=3, route} — repeated runs bit-identical.
* ``elementwise.grid_coverage`` {op, sizes, block, max_grid} — the grid-stride loop, executed on the
  index arithmetic of the build (its index type and tail guard) for huge sizes, visits every index in
  [0, n) exactly once and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from hypothesis import strategies as st

from falsification import engine
from falsification.agreement import Agreement, make_agreement
from falsification.batches import batch_check
from falsification.engine import Check, NativeResult, replay_command
from falsification.float32_inputs import LAYOUTS, BatchSpec
from falsification.registry import FalsifyContext, guarded, register_test
from native.elementwise import (
    DEFAULT_BLOCK,
    DEFAULT_MAX_GRID,
    RouteUnsupported,
    get_kernel,
    host_supports,
    kernel_plan,
    kernel_source,
    launch_plan,
    prepare_operands,
    run_flat,
)
from native.nvrtc import get_route
from obligations.core.device import array_module
from obligations.core.plans import regime_of
from obligations.core.results import Outcome, error, passed, violated
from spec.elementwise import GELU_C, GELU_K, Reference, bits_to_f64, f64_to_f32_bits, get_reference

__all__ = ["POISON", "ULP_BOUNDS", "elementwise_check", "gelu_ulp_bound", "sigmoid_ulp_bound"]

# A signaling NaN that no arithmetic produces: output buffers start as this, one guard cell past the end.
POISON = 0x7FBADBAD


def sigmoid_ulp_bound(x: Any) -> Any:
    """6 ulp everywhere (docs/falsification.md): expf's 2 ulp (4u) plus one rounding each for 1+e and /."""
    xp = array_module("cuda") if type(x).__module__.startswith("cupy") else np
    return xp.full(x.shape, 6.0)


def gelu_ulp_bound(x: Any) -> Any:
    """8 + 9|t| ulp for x < 0, 8 for x >= 0, t = 2 sqrt(2/pi)(x + 0.044715 x^3) (docs/falsification.md).

    For x < 0 the result is ~x e^t and e^t amplifies the float32 relative error of t (<= 7u) by |t|.
    """
    xp = array_module("cuda") if type(x).__module__.startswith("cupy") else np
    t = 2.0 * GELU_K * (x + GELU_C * x * x * x)
    with np.errstate(all="ignore"):
        extra = xp.where(x < 0, 9.0 * xp.abs(t), 0.0)
    return xp.where(xp.isfinite(extra), 8.0 + extra, xp.inf)


ULP_BOUNDS: dict[str, Callable[..., Any]] = {"sigmoid": sigmoid_ulp_bound, "gelu": gelu_ulp_bound}


def _items(node: Any) -> Iterator[dict[str, Any]]:
    """Every item (a mapping with a ``test``) of a loaded contract."""
    if isinstance(node, dict):
        if "test" in node:
            yield node
        for v in node.values():
            yield from _items(v)
    elif isinstance(node, list):
        for v in node:
            yield from _items(v)


_BUILT: set[tuple[str, tuple[str, ...]]] = set()


def precompile(ctx: FalsifyContext) -> int:
    """On cuda, build every (kernel, route) the contract's elementwise items launch, side by side, into the NVRTC
    disk cache (NVRTC releases the GIL): the first elementwise item pays them all at once instead of each item
    paying its own. Returns how many were built here (0 on the host, with the cache off, or once done)."""
    if ctx.device != "cuda" or ctx.replay is not None:
        return 0
    from native import nvrtc

    if nvrtc._cache_dir() is None:
        return 0
    jobs: set[tuple[str, tuple[str, ...]]] = set()
    for item in _items(ctx.contract):
        p = item.get("params") or {}
        if not str(item.get("test", "")).startswith("elementwise.") or "op" not in p:
            continue
        try:
            k = get_kernel(str(p["op"]))
            v = k.variant(p.get("variant"))
            route = get_route(v.route or p.get("route", "nvrtc-ieee"))
        except (KeyError, ValueError):
            continue  # the item itself reports what is wrong with its params
        if route.flags is not None:
            src, _ = kernel_source(k.name, p.get("variant"), kernel_plan(k.name, 1, p.get("variant")))
            jobs.add((src, route.flags.options()))
    jobs -= _BUILT
    if not jobs:
        return 0
    nvrtc._arch()  # asked once here, where CUDA is initialised in this thread first
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), (os.cpu_count() or 2) - 1))) as pool:
        list(pool.map(lambda job: nvrtc._binary(*job), sorted(jobs)))
    _BUILT.update(jobs)
    return len(jobs)


def _scalar_f32(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def elementwise_check(
    op: str,
    ctx: FalsifyContext,
    agreement: Agreement,
    *,
    route: str = "nvrtc-ieee",
    variant: str | None = None,
    env: str | None = None,
    reference: str | None = None,
    layouts: tuple[str, ...] = ("contiguous",),
    mixes: tuple[str, ...] | None = None,
    custom_reference: Callable[[list, tuple], list] | None = None,
    prepare: Callable[[list], list] | None = None,
    scalar_strategy: Any = None,
    scalar_key: Any = None,
    build: dict[str, Any] | None = None,
) -> Check[BatchSpec]:
    """The engine check of kernel ``op`` (as ``variant``) on the run's device against its reference."""
    device = ctx.device
    precompile(ctx)
    k = get_kernel(op)
    xp = array_module(device)
    r = get_route(route)
    v = k.variant(variant)
    # The claim's environment is the item's route's: a variant's own route is the planted bug, not the claim.
    env = env or get_route(route).env
    ref_op = get_reference(reference or k.reference)
    if device == "host" and v.host is None and not host_supports(route):
        raise RouteUnsupported(
            f"route {route!r} runs on cuda; this run is on host (the host backend realises only "
            f"routes without contraction or approximation)"
        )

    def native(
        views: list, scalars: tuple, block: int = DEFAULT_BLOCK, max_grid: int = DEFAULT_MAX_GRID
    ) -> NativeResult:
        flat, _ = prepare_operands(xp, [u.view(xp.float32) for u in views])
        n = int(flat[0].size)
        bufs = [xp.full(n + 1, POISON, dtype=xp.uint32) for _ in k.outputs]
        run_flat(
            op,
            flat,
            tuple(_scalar_f32(s) for s in scalars),
            device=device,
            route=route,
            variant=variant,
            outs=[b.view(xp.float32) for b in bufs],
            n=n,
            block=block,
            max_grid=max_grid,
        )
        guard_ok = all(int(b[n]) == POISON for b in bufs)
        return NativeResult([b[:n] for b in bufs], guard_ok)

    def ref(flat: list, scalars: tuple) -> list:
        n = int(flat[0].size)
        sc = [xp.full(n, s, dtype=xp.uint32) for s in scalars]
        return [ref_op.evaluate(*flat, *sc, env=env)]

    evidence = {
        "kernel": op,
        "variant": v.name,
        "reference": ref_op.name,
        "env": env,
        "route": (v.route or route)
        if device == "cuda"
        else (f"host-model:{v.name}" if v.host else f"host ({route} semantics)"),
        "compile": get_route(v.route or route).to_json() if device == "cuda" else None,
        "host_transcendentals": "float64 evaluation rounded once to float32" if k.kind != "exact" else None,
    }
    del r
    return batch_check(
        f"{op}[{v.name}]@{device}",
        arity=len(k.inputs),
        native=native,
        reference=custom_reference or ref,
        agreement=agreement,
        budget=ctx.budget,
        seed=ctx.seed,
        xp=xp,
        n_scalars=len(k.scalars),
        operand_names=k.inputs,
        scalar_names=k.scalars,
        output_names=k.outputs,
        layouts=layouts,
        mixes=mixes,
        prepare=prepare,
        scalar_strategy=scalar_strategy,
        scalar_key=scalar_key,
        build={**evidence, **(build or {})},
        plan=launch_plan,
        knobs=("block", "max_grid"),
    )


def _op(ctx: FalsifyContext) -> str:
    try:
        return str(ctx.params["op"])
    except KeyError:
        raise KeyError("params.op is required") from None


@register_test("elementwise.bitwise")
@guarded(skip=(RouteUnsupported,))
def bitwise(ctx: FalsifyContext) -> Outcome:
    """Kernel bits equal softfloat under the route's environment; listed other claims are refuted."""
    p = ctx.params
    op, route = _op(ctx), p.get("route", "nvrtc-ieee")
    layouts = tuple(p.get("layouts", LAYOUTS))
    agreement = engine.item_agreement(ctx, "bitwise", nan_policy=p.get("nan_policy", "exact"))
    check = elementwise_check(
        op, ctx, agreement, route=route, variant=p.get("variant"), env=p.get("env"), layouts=layouts
    )
    out = engine.run(ctx, check)
    refuted = []
    for env in p.get("refute_envs", []) if ctx.replay is None else []:
        other = elementwise_check(op, ctx, agreement, route=route, variant=p.get("variant"), env=env)
        o = engine.run(ctx, other)
        refuted.append(
            {
                "claim": f"bitwise under {env}",
                "refuted": o.status.value == "violated",
                "counterexample": o.counterexample,
                "elements": o.evidence.get("elements"),
            }
        )
    if not refuted:
        return out
    ev = {**engine.evidence_dict(out), "refuted_claims": refuted}
    if out.status.value == "violated":
        return violated(out.counterexample or {}, out.reason or "", **ev)
    held = [r["claim"] for r in refuted if not r["refuted"]]
    if held:
        return violated(
            {"claims_not_refuted": held, "replay": replay_command(ctx, None)},
            f"{op} via {route}: expected refutation of {held} but no counterexample was found",
            **ev,
        )
    return engine.with_evidence(out, ev)


@register_test("elementwise.max_ulp")
@guarded(skip=(RouteUnsupported,))
def max_ulp(ctx: FalsifyContext) -> Outcome:
    """Kernel within a max-ULP bound of the correctly rounded result (float64 evaluation, ties flagged)."""
    p = ctx.params
    op = _op(ctx)
    if "bound_fn" in p:
        bound: Any = ULP_BOUNDS[p["bound_fn"]]
        agreement = make_agreement("max_ulp", bound=bound, bound_name=p["bound_fn"])
    else:
        b = p.get("bound", ctx.tolerance)
        if b is None:
            return error("elementwise.max_ulp needs params.bound, params.bound_fn or a tolerance")
        agreement = make_agreement("max_ulp", bound=int(b))
    check = elementwise_check(
        op, ctx, agreement, route=p.get("route", "nvrtc-ieee"), variant=p.get("variant"), env=p.get("env")
    )
    return engine.run(ctx, check)


_PROMISES: dict[tuple[str, str], str] = {
    ("muladd", "separate"): "muladd",
    ("muladd", "fused"): "fma",
    ("muladd_rn", "separate"): "muladd",
    ("muladd_rn", "fused"): "fma",
    ("fma", "separate"): "muladd",
    ("fma", "fused"): "fma",
    ("axpy", "separate"): "axpy",
    ("axpy", "fused"): "axpy_fused",
}


@register_test("elementwise.fma_contraction")
@guarded(skip=(RouteUnsupported,))
def fma_contraction(ctx: FalsifyContext) -> Outcome:
    """Kernel bits equal the promised rounding of a*b+c (separate or fused); the other promise is probed."""
    p = ctx.params
    op, promise, route = _op(ctx), p.get("promise", "separate"), p.get("route", "nvrtc-ieee")
    other = {"separate": "fused", "fused": "separate"}[promise]
    agreement = engine.item_agreement(ctx, "bitwise", nan_policy=p.get("nan_policy", "exact"))
    check = elementwise_check(
        op,
        ctx,
        agreement,
        route=route,
        variant=p.get("variant"),
        reference=_PROMISES[(op, promise)],
        mixes=("correlated", "balanced"),
    )
    out = engine.run(ctx, check)
    if ctx.replay is not None:
        return out
    alt = elementwise_check(
        op,
        ctx,
        agreement,
        route=route,
        variant=p.get("variant"),
        reference=_PROMISES[(op, other)],
        mixes=("correlated",),
    )
    o = engine.run(ctx, alt)
    ev = {
        **engine.evidence_dict(out),
        "promise": promise,
        "other_promise": {
            "promise": other,
            "refuted": o.status.value == "violated",
            "counterexample": o.counterexample,
        },
    }
    return engine.with_evidence(out, ev)


@register_test("elementwise.determinism")
@guarded(skip=(RouteUnsupported,))
def determinism(ctx: FalsifyContext) -> Outcome:
    """Repeated runs of the kernel on the same inputs give identical bits."""
    p = ctx.params
    agreement = engine.item_agreement(ctx, "determinism", runs=int(p.get("runs", 3)))
    check = elementwise_check(_op(ctx), ctx, agreement, route=p.get("route", "nvrtc-ieee"), variant=p.get("variant"))
    return engine.run(ctx, check)


# -- backward rules vs finite differences ----------------------------------------------------------

_FD_EXP = (121, 134)  # operands are moved to |x| in [2^-6, 2^7): FD truncation error stays ~1e-9
# The scalar operands (clamp's bounds) the backward checks draw from: -1, 1, 0, -2, 2, 0.5.
_FD_SCALARS = (0xBF800000, 0x3F800000, 0x00000000, 0xC0000000, 0x40000000, 0x3F000000)


def _moderate(xp: Any, u: Any) -> Any:
    """Map any bits to a moderate finite value (zero stays zero: it is a kink); idempotent in range."""
    e = (u >> 23) & 0xFF
    mapped = xp.where((e >= _FD_EXP[0]) & (e < _FD_EXP[1]), e, _FD_EXP[0] + e % (_FD_EXP[1] - _FD_EXP[0]))
    out = (u & xp.uint32(0x807FFFFF)) | (mapped.astype(xp.uint32) << xp.uint32(23))
    return xp.where((u & xp.uint32(0x7FFFFFFF)) == 0, u, out).astype(xp.uint32)


def _bits(xp: Any, f64: Any) -> Any:
    return f64_to_f32_bits(f64)


def _f64(xp: Any, u: Any) -> Any:
    return bits_to_f64(u)


def _backward_check(ctx: FalsifyContext) -> Check[BatchSpec]:
    p = ctx.params
    op = _op(ctx)
    spec = get_reference(op)
    if spec.kind != "backward":
        raise KeyError(f"{op} is not a backward rule")
    xp = array_module(ctx.device)
    n_in = len(get_kernel(op).inputs) - 1  # the last input is dy
    h_rel = float(p.get("h_rel", 1e-4))
    rel = float(p.get("rel_tol", ctx.tolerance if ctx.tolerance is not None else 1e-4))
    scal = lambda s: float(_scalar_f32(s))  # noqa: E731

    def prepare(views: list) -> list:
        flat = [xp.ascontiguousarray(v).reshape(-1) for v in xp.broadcast_arrays(*views)]
        xs = [_moderate(xp, u) for u in flat]
        if n_in == 2:  # min/max: snap near-ties to exact ties (the 0.5/0.5 convention)
            a, b = _f64(xp, xs[0]), _f64(xp, xs[1])
            near = xp.abs(a - b) <= 8 * h_rel * xp.maximum(xp.abs(a), 2.0**-6)
            tie = ((xs[2] >> 8) & 7) == 0  # and make an eighth of them ties outright
            xs[1] = xp.where(near | tie, xs[0], xs[1]).astype(xp.uint32)
        else:  # single input: snap values within a few h of 0 to exactly 0 (the kink)
            x = _f64(xp, xs[0])
            xs[0] = xp.where(xp.abs(x) <= 8 * h_rel * 2.0**-6, xp.uint32(0), xs[0]).astype(xp.uint32)
        return xs

    def reference(flat: list, scalars: tuple) -> list:
        xs = [_f64(xp, u) for u in flat[:n_in]]
        dy = _f64(xp, flat[n_in])
        sc = [scal(s) for s in scalars]
        with np.errstate(all="ignore"):
            conv = spec.fn(*xs, dy, *sc)
        kinks = spec.kinks(*xs, *sc) if spec.kinks else ()
        refs = []
        for j in range(n_in):
            h = h_rel * xp.maximum(xp.abs(xs[j]), 2.0**-6)
            up = [x + h if i == j else x for i, x in enumerate(xs)]
            dn = [x - h if i == j else x for i, x in enumerate(xs)]
            with np.errstate(all="ignore"):
                fd = (spec.forward(*up, *sc) - spec.forward(*dn, *sc)) / (2 * h)
            at_kink = xp.zeros(xs[0].shape, dtype=bool)
            near = xp.zeros(xs[0].shape, dtype=bool)
            for kv in kinks:
                at_kink |= kv == 0
                near |= xp.abs(kv) <= 2 * h
            if spec.outside is not None:
                at_kink |= spec.outside(*xs, *sc)  # outside the forward's domain the convention is the meaning
            with np.errstate(all="ignore"):  # dy * fd where the FD overflows: the convention decides there
                val = xp.where(at_kink, conv[j], dy * fd)
            # strictly near a kink (not at it) the FD straddles it: the convention decides there too
            val = xp.where(near & ~at_kink, conv[j], val)
            refs.append(Reference(_bits(xp, val)))
        return refs

    def fd_bound(*args: Any) -> Any:
        *_, dy, ref = args
        return rel * (xp.abs(ref) + xp.abs(dy))

    fd_bound.__name__ = f"{rel:g} * (|reference| + |dy|)"
    agreement = engine.item_agreement(ctx, "error_bound", bound=fd_bound)
    scalar_strategy = st.sampled_from(list(_FD_SCALARS))
    return elementwise_check(
        op,
        ctx,
        agreement,
        route=p.get("route", "nvrtc-ieee"),
        variant=p.get("variant"),
        custom_reference=reference,
        prepare=prepare,
        scalar_strategy=scalar_strategy,
        scalar_key={"sampled_from": list(_FD_SCALARS)},
        build={"h_rel": h_rel, "domain": "|x| in [2^-6, 2^7) or 0"},
    )


@register_test("elementwise.backward_fd")
@guarded(skip=(RouteUnsupported,))
def backward_fd(ctx: FalsifyContext) -> Outcome:
    """Backward rule agrees with central finite differences where smooth and with the convention at kinks."""
    return engine.run(ctx, _backward_check(ctx))


# -- grid-stride coverage, executed on the build's index arithmetic --------------------------------

_GUARDS: dict[str, Callable[[Any, int], Any]] = {
    "i < n": lambda i, n: i < n,
    "i < n - 1": lambda i, n: i < n - 1,
    "i <= n": lambda i, n: i <= n,
}
DEFAULT_SIZES = (0, 1, 255, 256, 257, (1 << 20) + 1, (1 << 31) - 1, (1 << 31) + 7, (1 << 32) + 5)


def _wrap(i: np.ndarray, bits: int) -> np.ndarray:
    """Two's-complement wrap of int64 values to a ``bits``-bit signed index type."""
    if bits >= 64:
        return i
    half = 1 << (bits - 1)
    return ((i + half) & ((1 << bits) - 1)) - half


@register_test("elementwise.grid_coverage")
@guarded(skip=(RouteUnsupported,))
def grid_coverage(ctx: FalsifyContext) -> Outcome:
    """The build's grid-stride loop visits each index of [0, n) exactly once, for sizes up to past 2^32."""
    p = ctx.params
    op = _op(ctx)
    k = get_kernel(op)
    v = k.variant(p.get("variant"))
    guard = _GUARDS[v.guard or "i < n"]
    sizes = [int(s) for s in p.get("sizes", DEFAULT_SIZES)]
    knobs = (int(p.get("block", 256)), int(p.get("max_grid", 65536)))
    # Regime witnesses first (n with the launch knobs that reach each path), then the item's sizes.
    runs = [(int(w["n"]), int(w["block"]), int(w["max_grid"])) for w in ctx.witnesses.values()]
    runs += [(n, *knobs) for n in sizes]
    selected = [regime_of(launch_plan, {"n": n, "block": b, "max_grid": g}) for n, b, g in runs]
    threads_checked = 0
    for n, block, max_grid in runs:
        plan = kernel_plan(op, n, p.get("variant"), block, max_grid)
        stride, bits = int(plan["stride"]), int(plan["index_bits"])
        # Threads whose trips are extreme: the first and last 1024 of the grid and the 1024 around the one
        # whose last in-range index is n-1 (its next step is the largest index the loop computes).
        last = (n - 1) % stride if n else 0
        t = np.unique(
            np.concatenate(
                [
                    np.arange(min(stride, 1024)),
                    np.arange(max(0, stride - 1024), stride),
                    (last + np.arange(-512, 512)) % stride,
                ]
            )
        ).astype(np.int64)
        threads_checked += int(t.size)
        expected = np.where(t < n, (n - t + stride - 1) // stride, 0)
        i = _wrap(t.copy(), bits)
        count = np.zeros_like(t)
        active = np.ones(t.shape, dtype=bool)
        problem = None
        for k in range(int(plan["iterations"]) + 2):
            active &= guard(i, n)
            if not active.any():
                break
            wrong = active & ((i != t + k * stride) | (i < 0) | (i >= n))
            if wrong.any():
                w = int(np.flatnonzero(wrong)[0])
                problem = (
                    int(t[w]),
                    int(i[w]),
                    f"trip {k} of thread {int(t[w])} computes index {int(i[w])}"
                    f" (expected {int(t[w]) + k * stride}, valid range [0, {n}))",
                )
                break
            count += active
            i = _wrap(i + stride, bits)
        if problem is None and (count != expected).any():
            w = int(np.flatnonzero(count != expected)[0])
            problem = (
                int(t[w]),
                None,
                f"thread {int(t[w])} visits {int(count[w])} indices, expected {int(expected[w])}",
            )
        if problem is not None:
            ce = {
                "n": n,
                "thread": problem[0],
                "index": problem[1],
                "plan": {a: int(b) for a, b in plan.items() if not callable(b) and a != "regimes"},
                "index_type": v.index_type or "long long",
                "guard": v.guard or "i < n",
                "replay": replay_command(ctx, None),
            }
            return violated(
                ce,
                f"{op}[{v.name}] grid-stride loop at n={n}: {problem[2]}",
                sizes=sizes,
                threads_checked=threads_checked,
            )
    return passed(
        cases=threads_checked,
        sizes=sizes,
        **engine.regime_counts(ctx, selected),
        threads_checked=threads_checked,
        kernel=op,
        variant=v.name,
        index_type=v.index_type or "long long",
        method="loop executed in the build's index arithmetic "
        "for the first/last 1024 threads and the 1024 around the one ending at n-1",
    )
