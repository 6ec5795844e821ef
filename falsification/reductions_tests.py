"""Falsification tests of the reduction family, registered for contract items by name.

Registered names and their ``params`` (``impl`` is a dotted ``module:function`` the project's tests swap
for planted bugs; every impl takes ``(x, device=...)``):

* ``reductions.fold_bitwise`` {op: sum|max|mean, max_dim, max_elements, max_fold} — fold kernels over the
  whole buffer, rows, columns and each axis of 3-d tensors, bitwise against the softfloat fold (any input
  bits). A case has at most ``max_elements`` elements and folds at most ``max_fold`` of them per output
  (the softfloat fold is sequential in its length); the full profile scales all three.
* ``reductions.tree_bitwise`` {impl=native.reductions:tree_sum, max_n} — bitwise against the softfloat
  evaluation of the stated tree (:func:`native.reductions.pass_grids`).
* ``reductions.determinism`` {impl, runs=5, n} — ``runs`` evaluations of one input bit-identical.
* ``reductions.nonreproducible`` {impl=native.reductions:atomic_sum, runs=20, n} — measures how many
  distinct results ``runs`` evaluations give; the documented non-reproducibility must show (>= 2).
* ``reductions.error_bound`` {impl, order: fold|tree|atomic} — |s - sum x| <= gamma_h sum|x| (+ the
  atomic flush term) against an exactly rounded float64 sum (math.fsum) with its 2^-53 margin.
* ``reductions.scatter_bitwise`` {max_src, max_out} — deterministic scatter-add against the reference.
* ``reductions.empty`` {} — sum +0 (every order), mean NaN, max -Inf, also along a zero-length axis.
* ``reductions.bandwidth`` {n=2^28, reps=20} (cuda, measure) — tree sum read bandwidth vs cupy.sum;
  tolerance: the least accepted ratio.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, example, given, settings
from hypothesis import seed as hseed
from hypothesis import strategies as st

from falsification.registry import FalsifyContext, register_test
from falsification.runner import replay_command
from falsification.strategies import MIXES, BatchSpec, generate_bits
from native import reductions as red
from obligations.core.device import array_module, to_host
from obligations.core.plans import resolve
from obligations.core.results import Outcome, passed, skipped, violated
from spec import reductions as ref

__all__ = ["moderate_floats", "run_hypothesis", "PROFILE_EXAMPLES"]

PROFILE_EXAMPLES: dict[str, int] = {"quick": 12, "full": 60}
_SCALE: dict[str, int] = {"quick": 1, "full": 16}
# Fold cases: (max_elements, max_fold) per profile. The reference costs ~0.1 ms per folded element
# on one core whatever the width, so max_fold bounds a case's time; the full run stays within minutes.
_FOLD_BUDGET: dict[str, tuple[int, int]] = {"quick": (1 << 14, 1 << 12), "full": (1 << 20, 1 << 13)}


def _bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(to_host(a)).astype(np.float32).view(np.uint32)


def _impl(ctx: FalsifyContext, default: str) -> tuple[str, Callable[..., Any]]:
    name = ctx.params.get("impl", default)
    return name, resolve(name)


def moderate_floats(seed: int, n: int, xp: Any = np) -> Any:
    """Finite float32 values of mixed sign over a few binades (sums that mean something), as an array."""
    rng = np.random.default_rng(seed)
    v = rng.uniform(-1, 1, n) * np.exp2(rng.integers(-8, 9, n))
    return xp.asarray(v.astype(np.float32))


_MIX_NAMES = ("moderate", *sorted(MIXES))


def _input_bits(seed: int, size: int, mix: str, xp: Any, arity: int = 1) -> list:
    """Input bit arrays: the project's TestFloat-style mixes, or "moderate" values whose sums round often."""
    if mix == "moderate":
        return [moderate_floats(seed + j, size, xp).view(xp.uint32) for j in range(arity)]
    return generate_bits(BatchSpec(seed=seed, size=size, mix=mix), arity, xp)


def run_hypothesis(ctx: FalsifyContext, strategy: Any, check: Callable[[Any], dict | None],
                   explicit: tuple = ()) -> dict | None:
    """Run ``check`` on ``explicit`` cases then Hypothesis draws (seeded); the shrunk failure, or None."""
    failure: dict[str, Any] = {}

    def with_examples(fn: Callable[..., Any]) -> Callable[..., Any]:
        for case in reversed(explicit):
            fn = example(case)(fn)
        return fn

    @settings(max_examples=int(ctx.params.get("max_examples", PROFILE_EXAMPLES.get(ctx.profile, 12))),
              deadline=None, database=None, suppress_health_check=list(HealthCheck),
              phases=(Phase.explicit, Phase.generate, Phase.shrink), verbosity=Verbosity.quiet,
              report_multiple_bugs=False, print_blob=False)
    @hseed(ctx.seed)
    @with_examples
    @given(strategy)
    def prop(case: Any) -> None:
        bad = check(case)
        if bad is not None:
            failure.clear()
            failure.update(bad)
            raise AssertionError(bad.get("detail", "disagreement"))

    try:
        prop()
    except AssertionError:
        return dict(failure)
    return None


def _cuda_only(ctx: FalsifyContext) -> Outcome | None:
    return None if ctx.device == "cuda" else skipped("needs a CUDA device")


def _first_diff(native: np.ndarray, want: np.ndarray) -> dict | None:
    bad = np.flatnonzero(native.reshape(-1) != want.reshape(-1))
    if bad.size == 0:
        return None
    i = int(bad[0])
    return {"first_bad_output": i, "native": f"0x{int(native.reshape(-1)[i]):08X}",
            "reference": f"0x{int(want.reshape(-1)[i]):08X}", "disagreeing_outputs": int(bad.size)}


# -- fold: whole buffer, rows, columns, N-d axes ---------------------------------------------------------

_FOLD_NATIVE: dict[str, Callable[..., Any]] = {"sum": red.fold_sum, "max": red.fold_max, "mean": red.mean}


def _fold_reference(op: str, x3: np.ndarray) -> np.ndarray:
    """Reference over an (outer, length, inner) bit array on the host: outputs (outer, inner).

    The fold is sequential in its length, and NumPy steps are cheaper than kernel-launch steps for the
    narrow folds the cases draw, so the reference runs on the host whatever the kernel's device.
    """
    last = np.ascontiguousarray(np.moveaxis(x3, 1, 2))
    if op == "max":
        return ref.fold_max(last)
    s = ref.fold_left(last)
    return ref.mean_of(s, x3.shape[1]) if op == "mean" else s


@st.composite
def _fold_cases(draw: Any, max_dim: int, max_elements: int, max_fold: int) -> tuple:
    """(seed, shape, axis, mix) with at most ``max_elements`` elements and ``max_fold`` per output."""
    ndim = draw(st.integers(1, 3))
    axis = draw(st.one_of(st.none(), st.integers(0, ndim - 1)))
    shape, budget = [], max_fold if axis is None else max_elements
    for d in range(ndim):
        cap = min(max_dim, budget, max_fold if d == axis else max_dim)
        shape.append(draw(st.integers(0, cap)))
        budget //= max(shape[-1], 1)
    return draw(st.integers(0, 2**32 - 1)), tuple(shape), axis, draw(st.sampled_from(_MIX_NAMES))


@register_test("reductions.fold_bitwise")
def fold_bitwise(ctx: FalsifyContext) -> Outcome:
    """Fold reductions (whole, row, column, N-d axis) bitwise equal to the softfloat left fold."""
    op = ctx.params.get("op", "sum")
    native_fn = _FOLD_NATIVE[op]
    xp = array_module(ctx.device)
    scale = _SCALE.get(ctx.profile, 1)
    max_dim = int(ctx.params.get("max_dim", 24)) * scale
    budget = _FOLD_BUDGET.get(ctx.profile, _FOLD_BUDGET["quick"])
    max_elements = int(ctx.params.get("max_elements", budget[0]))
    max_fold = int(ctx.params.get("max_fold", budget[1]))
    stats = {"cases": 0, "outputs": 0, "elements": 0, "kinds": set(), "longest_fold": 0}

    def check(case: tuple) -> dict | None:
        seed, shape, axis, mix = case
        size = int(np.prod(shape, dtype=np.int64))
        bits = _input_bits(seed, size, mix, xp)[0].reshape(shape)
        got = _bits(native_fn(bits.view(xp.float32), axis=axis, device=ctx.device))
        _, _, (outer, length, inner) = red._axis_view(bits, axis)
        want = _fold_reference(op, to_host(bits).reshape(outer, length, inner))
        stats["cases"] += 1
        stats["longest_fold"] = max(stats["longest_fold"], int(length))
        stats["outputs"] += int(want.size)
        stats["elements"] += size
        stats["kinds"].add("whole" if axis is None else f"axis {axis} of {len(shape)}-d")
        diff = _first_diff(got, want)
        if diff is None:
            return None
        return {"shape": list(shape), "axis": axis, "mix": mix, "seed": seed, **diff,
                "detail": f"{op} over axis {axis} of {shape}: output {diff['first_bad_output']} differs"}

    bad = run_hypothesis(ctx, _fold_cases(max_dim, max_elements, max_fold), check)
    ev = {"op": op, "reference": "spec.reductions fold (softfloat on the host, env cuda)", "device": ctx.device,
          "max_elements": max_elements, "max_fold": max_fold, "longest_fold": stats["longest_fold"],
          "route": red.ROUTE if ctx.device == "cuda" else "host float32 in fold order",
          "outputs": stats["outputs"], "elements": stats["elements"], "layouts": sorted(stats["kinds"]),
          "seed": ctx.seed}
    if bad:
        return violated({**bad, "replay": replay_command(ctx, None)}, f"fold {op}: {bad['detail']}", **ev)
    return passed(cases=stats["cases"], **ev)


# -- tree --------------------------------------------------------------------------------------------------


@register_test("reductions.tree_bitwise")
def tree_bitwise(ctx: FalsifyContext) -> Outcome:
    """Tree sum bitwise equal to the softfloat evaluation of the stated tree."""
    name, impl = _impl(ctx, "native.reductions:tree_sum")
    xp = array_module(ctx.device)
    max_n = int(ctx.params.get("max_n", 1 << 15)) * _SCALE.get(ctx.profile, 1) ** 2
    sizes = st.one_of(st.integers(0, 600), st.integers(0, max_n), st.sampled_from([1, 255, 256, 257, 65537]))
    stats = {"cases": 0, "elements": 0, "max_passes": 0}

    def check(case: tuple) -> dict | None:
        seed, n, mix = case
        bits = _input_bits(seed, n, mix, xp)[0]
        got = _bits(impl(bits.view(xp.float32), device=ctx.device))
        grids = red.pass_grids(n)
        want = _bits(ref.tree_sum(bits, grids, red.BLOCK).view(xp.float32))
        stats["cases"] += 1
        stats["elements"] += n
        stats["max_passes"] = max(stats["max_passes"], len(grids))
        diff = _first_diff(got, want)
        return None if diff is None else {"n": n, "mix": mix, "seed": seed, "grids": grids, **diff,
                                          "detail": f"n={n}: tree sum differs"}

    # Sizes a pass of the tree treats differently: one thread per element, one trip more, several passes.
    explicit = tuple((ctx.seed, n, "moderate") for n in (200, 1000, 257 * 256 + 3, min(max_n, 600_000)))
    bad = run_hypothesis(ctx, st.tuples(st.integers(0, 2**32 - 1), sizes, st.sampled_from(_MIX_NAMES)), check,
                         explicit)
    ev = {"impl": name, "tree": {"block": red.BLOCK, "max_grid": red.MAX_GRID, "unroll_loads": red.UNROLL,
                                 "combine": "sh[t] = sh[t] + sh[t + s], s = block/2 .. 1, then repeated"},
          "elements": stats["elements"], "max_passes": stats["max_passes"], "device": ctx.device, "seed": ctx.seed}
    if bad:
        return violated({**bad, "replay": replay_command(ctx, None)}, f"{name}: {bad['detail']}", **ev)
    return passed(cases=stats["cases"], **ev)


def _repeat(ctx: FalsifyContext, impl: Callable[..., Any], n: int, runs: int) -> tuple[list[str], Any]:
    xp = array_module(ctx.device)
    x = moderate_floats(ctx.seed, n, xp)
    return [f"0x{int(_bits(impl(x, device=ctx.device)).reshape(-1)[0]):08X}" for _ in range(runs)], x


@register_test("reductions.determinism")
def determinism(ctx: FalsifyContext) -> Outcome:
    """Repeated runs on one input give identical bits."""
    name, impl = _impl(ctx, "native.reductions:tree_sum")
    runs, n = int(ctx.params.get("runs", 5)), int(ctx.params.get("n", 1 << 18))
    results, _ = _repeat(ctx, impl, n, runs)
    distinct = sorted(set(results))
    ev = {"impl": name, "runs": runs, "n": n, "distinct_results": len(distinct), "device": ctx.device}
    if len(distinct) > 1:
        return violated({"results": results, "replay": replay_command(ctx, None)},
                        f"{name}: {len(distinct)} distinct results in {runs} runs", **ev)
    return passed(cases=runs, result=results[0], **ev)


@register_test("reductions.nonreproducible")
def nonreproducible(ctx: FalsifyContext) -> Outcome:
    """The atomic path's results vary run to run (measured and kept as evidence)."""
    name, impl = _impl(ctx, "native.reductions:atomic_sum")
    runs, n = int(ctx.params.get("runs", 20)), int(ctx.params.get("n", 1 << 18))
    results, _ = _repeat(ctx, impl, n, runs)
    distinct = sorted(set(results))
    ev = {"impl": name, "runs": runs, "n": n, "distinct_results": len(distinct), "results": results,
          "device": ctx.device, "blocks_adding_atomically": red.pass_grids(n)[0]}
    if len(distinct) < 2:
        return violated({"results": results}, f"{name}: {runs} runs agreed; the documented non-reproducibility "
                        "was not observed (is the path really atomic?)", **ev)
    return passed(cases=runs, **ev)


# -- error bounds ------------------------------------------------------------------------------------------


def _depth(order: str, n: int) -> int:
    grids = red.pass_grids(n)
    if order == "fold":
        return max(n, 1)
    if order == "tree":
        return ref.tree_depth(n, grids, red.BLOCK)
    return ref.tree_depth(n, grids[:1], red.BLOCK) + grids[0]  # pass 1, then a chain of atomic adds


@register_test("reductions.error_bound")
def error_bound(ctx: FalsifyContext) -> Outcome:
    """|sum - exact| <= gamma_h sum|x| for the order's tree depth h (atomic: plus the subnormal flushes)."""
    order = ctx.params.get("order", "atomic")
    name, impl = _impl(ctx, f"native.reductions:{red.SUMS[order].__name__}")
    xp = array_module(ctx.device)
    max_n = int(ctx.params.get("max_n", 1 << 16)) * _SCALE.get(ctx.profile, 1) ** 2
    worst = {"ratio": 0.0}

    def check(case: tuple) -> dict | None:
        seed, n = case
        x = moderate_floats(seed, n, xp)
        got = float(to_host(impl(x, device=ctx.device)))
        xs = to_host(x).astype(np.float64)
        exact = math.fsum(xs)
        abs_sum = math.fsum(np.abs(xs))
        h = _depth(order, n)
        flush = red.pass_grids(n)[0] * 2.0**-126 if order == "atomic" else 0.0
        bound = ref.gamma(h) * abs_sum + 2.0**-53 * abs(exact) + flush
        err = abs(got - exact)
        worst["ratio"] = max(worst["ratio"], err / bound if bound else 0.0)
        if err <= bound:
            return None
        return {"n": n, "seed": seed, "native": got, "exact": exact, "error": err, "bound": bound, "depth": h,
                "detail": f"n={n}: error {err:.3e} > bound {bound:.3e}"}

    bad = run_hypothesis(ctx, st.tuples(st.integers(0, 2**32 - 1), st.integers(0, max_n)), check)
    ev = {"impl": name, "order": order, "u": "2^-24", "bound": "gamma_h * sum|x| + 2^-53 |exact| (+ grid * 2^-126 "
          "for atomic flushes); h = additions on the longest path of the order's tree",
          "reference": "math.fsum (exactly rounded float64)", "worst_error_over_bound": worst["ratio"],
          "device": ctx.device}
    if bad:
        return violated({**bad, "replay": replay_command(ctx, None)}, f"{name}: {bad['detail']}", **ev)
    return passed(cases=int(ctx.params.get("max_examples", PROFILE_EXAMPLES.get(ctx.profile, 12))), **ev)


# -- scatter-add, empty inputs, bandwidth --------------------------------------------------------------------


@register_test("reductions.scatter_bitwise")
def scatter_bitwise(ctx: FalsifyContext) -> Outcome:
    """Deterministic scatter-add bitwise equal to adding duplicates in increasing source order."""
    name, impl = _impl(ctx, "native.reductions:scatter_add")
    xp = array_module(ctx.device)
    max_src = int(ctx.params.get("max_src", 400)) * _SCALE.get(ctx.profile, 1)
    stats = {"cases": 0, "duplicates": 0}

    def check(case: tuple) -> dict | None:
        seed, n_out, m, mix = case
        rng = np.random.default_rng(seed)
        idx = xp.asarray(rng.integers(0, n_out, m))
        src, init = _input_bits(seed, m, mix, xp, 2)
        out0 = init[:n_out] if m >= n_out else xp.zeros(n_out, dtype=xp.uint32)
        got = _bits(impl(out0.view(xp.float32), idx, src.view(xp.float32), device=ctx.device))
        want = _bits(ref.scatter_add(out0, idx, src).view(xp.float32))
        stats["cases"] += 1
        stats["duplicates"] += m - len(set(to_host(idx).tolist()))
        diff = _first_diff(got, want)
        return None if diff is None else {"n_out": n_out, "m": m, "seed": seed, "mix": mix, **diff,
                                          "detail": f"{m} sources into {n_out} outputs differ"}

    strat = st.tuples(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(0, max_src),
                      st.sampled_from(_MIX_NAMES))
    bad = run_hypothesis(ctx, strat, check)
    ev = {"impl": name, "duplicates_added": stats["duplicates"], "device": ctx.device,
          "order": "duplicates in increasing source index"}
    if bad:
        return violated({**bad, "replay": replay_command(ctx, None)}, f"{name}: {bad['detail']}", **ev)
    return passed(cases=stats["cases"], **ev)


_EMPTY_EXPECT: dict[str, Callable[[np.ndarray], bool]] = {
    "sum": lambda b: bool((b == 0x00000000).all()),
    "mean": lambda b: bool((b == 0x7FFFFFFF).all()),
    "max": lambda b: bool((b == 0xFF800000).all()),
}


@register_test("reductions.empty")
def empty(ctx: FalsifyContext) -> Outcome:
    """Empty reductions: sum +0 (fold, tree, atomic), mean NaN, max -Inf, also along a zero-length axis."""
    xp = array_module(ctx.device)
    cases = {
        "sum/fold": ("sum", lambda x: red.fold_sum(x, device=ctx.device)),
        "sum/tree": ("sum", lambda x: red.tree_sum(x, device=ctx.device)),
        "sum/atomic": ("sum", lambda x: red.atomic_sum(x, device=ctx.device)),
        "mean/fold": ("mean", lambda x: red.mean(x, device=ctx.device)),
        "mean/tree": ("mean", lambda x: red.mean(x, device=ctx.device, order="tree")),
        "max/fold": ("max", lambda x: red.fold_max(x, device=ctx.device)),
        "sum/axis": ("sum", lambda x: red.fold_sum(x.reshape(3, 0), axis=1, device=ctx.device)),
        "max/axis": ("max", lambda x: red.fold_max(x.reshape(3, 0), axis=1, device=ctx.device)),
        "mean/axis": ("mean", lambda x: red.mean(x.reshape(3, 0), axis=1, device=ctx.device)),
    }
    got = {}
    for label, (kind, fn) in cases.items():
        b = _bits(fn(xp.zeros(0, dtype=xp.float32)))
        got[label] = [f"0x{int(v):08X}" for v in b.reshape(-1)]
        if not _EMPTY_EXPECT[kind](b):
            return violated({"case": label, "bits": got[label]}, f"empty {label} gave {got[label]}", results=got)
    return passed(cases=len(cases), results=got, documented={"sum": "+0", "mean": "NaN (0x7FFFFFFF)",
                                                            "max": "-Inf (the identity of maximum)"})


def _time_ms(fn: Callable[[], Any], reps: int) -> float:
    import cupy

    for _ in range(3):
        fn()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / reps


@register_test("reductions.bandwidth", devices=("host", "cuda"))
def bandwidth(ctx: FalsifyContext) -> Outcome:
    """Deterministic tree sum of n float32 reads at >= tolerance x the throughput of cupy.sum (same run)."""
    if (skip := _cuda_only(ctx)) is not None:
        return skip
    import cupy

    n, reps = int(ctx.params.get("n", 1 << 28)), int(ctx.params.get("reps", 20))
    x = cupy.asarray(moderate_floats(ctx.seed, 1 << 20)).repeat(max(n >> 20, 1))[:n]
    t0 = time.perf_counter()
    ours = _time_ms(lambda: red.tree_sum(x, device="cuda"), reps)
    peer = _time_ms(lambda: cupy.sum(x), reps)
    gbs = {"tree_sum": n * 4 / ours / 1e6, "cupy.sum": n * 4 / peer / 1e6}
    ratio = gbs["tree_sum"] / gbs["cupy.sum"]
    want = float(ctx.tolerance if ctx.tolerance is not None else 0.8)
    ev = {"timings_ms": {"tree_sum": ours, "cupy.sum": peer}, "GB_per_s": gbs, "ratio": ratio, "n": n,
          "reps": reps, "wall_s": time.perf_counter() - t0, "goal_ratio": want}
    if ratio < want:
        return violated({"ratio": ratio}, f"tree sum reads at {ratio:.2f}x cupy.sum (< {want})", **ev)
    return passed(cases=reps, **ev)
