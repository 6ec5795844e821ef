"""Falsification tests of the reduction family, registered for contract items by name.

Registered names and their ``params`` (``impl`` is a dotted ``module:function`` the project's tests swap
for planted bugs; every impl takes ``(x, device=...)``):

* ``reductions.fold_bitwise`` {op: sum|max|mean, max_dim, max_elements, max_fold} — fold kernels over the
  whole buffer, rows, columns and each axis of 3-d tensors, bitwise against the softfloat fold (any input
  bits), evaluated by the route ``spec.reductions`` proves exact (float32-numpy under env cuda). A case has
  at most ``max_elements`` elements and folds at most ``max_fold`` of them per output; the full profile scales
  all three.
* ``reductions.tree_bitwise`` {impl=native.reductions:tree_sum, max_n} — bitwise against the softfloat
  evaluation of the stated tree (:func:`native.reductions.pass_grids`).
* ``reductions.determinism`` {impl, runs=5, n} — ``runs`` evaluations of one input bit-identical.
* ``reductions.nonreproducible`` {impl=native.reductions:atomic_sum, runs=20, n} — measures how many
  distinct results ``runs`` evaluations give; the documented non-reproducibility must show (>= 2).
* ``reductions.error_bound`` {impl, order: fold|tree|atomic} — |s - sum x| <= gamma_h sum|x| (+ the
  atomic flush term) against an exactly rounded float64 sum (``spec.reductions.exact_sum``, what math.fsum
  returns) with its 2^-53 margin.
* ``reductions.scatter_bitwise`` {max_src, max_out} — deterministic scatter-add against the reference.
* ``reductions.empty`` {} — sum +0 (every order), mean NaN, max -Inf, also along a zero-length axis.
* ``reductions.bandwidth`` {n=2^28, reps=20} (cuda, measure) — tree sum read bandwidth vs cupy.sum;
  tolerance: the least accepted ratio.

Every agreement item is an engine :class:`~falsification.engine.Check`: the item's ``agreement:`` field
must name the kind the check applies (bitwise, error_bound, determinism), and the engine records it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from falsification import engine
from falsification.agreement import Expected
from falsification.engine import Check, Judgement
from falsification.float32_inputs import MIXES, BatchSpec, generate_bits
from falsification.registry import FalsifyContext, Replay, register_test
from native import reductions as red
from obligations.core.device import array_module, to_host
from obligations.core.plans import regime_of, resolve
from obligations.core.results import Outcome
from spec import reductions as ref

__all__ = ["moderate_floats", "absorbing_floats", "tie_floats", "tie_windows", "MIX_NAMES", "ROUTE"]

# The references' route: the float32-numpy route where spec.reductions proves it exact (env cuda, a host whose
# binary32 unit passes the edge-class check), else the softfloat; the evidence names the route taken.
ROUTE = "auto"


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


MIX_NAMES: tuple[str, ...] = ("moderate", *sorted(MIXES), "absorb", "ties")

# Candidates that tie under a maximum, three pools: zeros over smaller values (the maximum is +0 or -0, and
# max(-0, +0) must be +0 in any order), NaNs of several payloads and signs (the result is the canonical NaN,
# whichever came first), repeated infinities and ones.
TIE_POOLS: tuple[np.ndarray, ...] = tuple(
    np.array(p, np.uint32)
    for p in (
        [0x00000000, 0x80000000, 0x80000000, 0xBF800000, 0xFF800000],
        [0x7FC00000, 0xFFC00001, 0x7F800001, 0x7FFFFFFF, 0x00000000, 0x80000000, 0x3F800000],
        [0x7F800000, 0x7F800000, 0x3F800000, 0x3F800000, 0x80000000, 0x00000000],
    )
)


def tie_floats(seed: int, n: int, xp: Any = np) -> Any:
    """Bits drawn from a few candidates only (pool ``seed % 3``), so a window holds several equal maxima or several
    NaNs: the inputs on which a maximum's choice among equals shows."""
    return xp.asarray(np.random.default_rng(seed).choice(TIE_POOLS[seed % 3], n))


def absorbing_floats(n: int, xp: Any = np) -> Any:
    """2^24 then ones: adding a one to 2^24 is absorbed (ties to even), so every reordering of the adds that puts
    ones before the large value gives other bits: the inputs of a regime witness, which must tell orders apart."""
    v = np.ones(n, dtype=np.float32)
    v[:1] = np.float32(2.0**24)
    return xp.asarray(v)


def _input_bits(seed: int, size: int, mix: str, xp: Any, arity: int = 1) -> list:
    """Input bit arrays: the project's TestFloat-style mixes, or "moderate" values whose sums round often."""
    if mix == "moderate":
        return [moderate_floats(seed + j, size, xp).view(xp.uint32) for j in range(arity)]
    if mix == "absorb":
        return [absorbing_floats(size, xp).view(xp.uint32) for _ in range(arity)]
    if mix == "ties":
        return [tie_floats(seed + j, size, xp) for j in range(arity)]
    return generate_bits(BatchSpec(seed=seed, size=size, mix=mix), arity, xp)


def _mix(i: int) -> str:
    return MIX_NAMES[i]


def _case_json(names: tuple[str, ...]) -> Callable[[tuple], dict[str, Any]]:
    return lambda case: {k: (list(v) if isinstance(v, tuple) else v) for k, v in zip(names, case, strict=True)}


# -- fold: whole buffer, rows, columns, N-d axes ---------------------------------------------------------

_FOLD_NATIVE: dict[str, Callable[..., Any]] = {"sum": red.fold_sum, "max": red.fold_max, "mean": red.mean}


def _fold_reference(op: str, x3: np.ndarray) -> np.ndarray:
    """Reference over an (outer, length, inner) bit array on the host: outputs (outer, inner).

    The fold is sequential in its length, and NumPy steps are cheaper than kernel-launch steps for the
    narrow folds the cases draw, so the reference runs on the host whatever the kernel's device.
    """
    last = np.ascontiguousarray(np.moveaxis(x3, 1, 2))
    if op == "max":
        return ref.fold_max(last, route=ROUTE)
    s = ref.fold_left(last, route=ROUTE)
    return ref.mean_of(s, x3.shape[1], route=ROUTE) if op == "mean" else s


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
    return draw(st.integers(0, 2**32 - 1)), tuple(shape), axis, draw(st.sampled_from(MIX_NAMES))


def _fold_encode(case: tuple) -> tuple[int, ...]:
    seed, shape, axis, mix = case
    return (seed, len(shape), *shape, 0 if axis is None else axis + 1, MIX_NAMES.index(mix))


def _fold_decode(rp: Replay) -> tuple:
    v = rp.values
    nd = v[1]
    axis = v[2 + nd]
    return v[0], tuple(v[2 : 2 + nd]), None if axis == 0 else axis - 1, _mix(v[3 + nd])


def _fold_alternative(op: str) -> dict[str, Any]:
    """The fold's other order (the axis reversed) for sum and mean; max claims no order."""
    if op == "max":
        return {}
    return {
        "alternative": lambda f: Expected(bits=_fold_reference(op, to_host(f.bits).reshape(f.dims)[:, ::-1, :])),
        "alternative_name": "the same fold over the reversed axis",
    }


@dataclass(frozen=True)
class _Fold:
    bits: Any
    axis: int | None
    dims: tuple[int, int, int]


# A maximum's choice among equal candidates: rows, columns and a whole buffer of each tie pool (zeros, NaNs, equal
# maxima).
_TIE_WINDOWS = (((5, 9), 1), ((9, 5), 0), ((40,), None))
_TIE_CASES = tuple((s, shape, axis, "ties") for s in (0, 1, 2) for shape, axis in _TIE_WINDOWS)


@register_test("reductions.fold_bitwise")
def fold_bitwise(ctx: FalsifyContext) -> Outcome:
    """Fold reductions (whole, row, column, N-d axis) bitwise equal to the softfloat left fold."""
    op = ctx.params.get("op", "sum")
    native_fn = _FOLD_NATIVE[op]
    xp = array_module(ctx.device)
    b = ctx.budget
    max_dim = int(ctx.params.get("max_dim", 24)) * b.scale
    max_elements = int(ctx.params.get("max_elements", b.max_size))
    max_fold = int(ctx.params.get("max_fold", b.max_fold))
    stats: dict[str, Any] = {"outputs": 0, "elements": 0, "kinds": set(), "longest_fold": 0, "tie_windows": 0}

    def inputs(case: tuple) -> _Fold:
        seed, shape, axis, mix = case
        size = int(np.prod(shape, dtype=np.int64))
        bits = _input_bits(seed, size, mix, xp)[0].reshape(shape)
        _, _, dims = red._axis_view(bits, axis)
        if op == "max":
            stats["tie_windows"] += tie_windows(to_host(bits).reshape(dims))
        stats["longest_fold"] = max(stats["longest_fold"], int(dims[1]))
        stats["elements"] += size
        stats["kinds"].add("whole" if axis is None else f"axis {axis} of {len(shape)}-d")
        return _Fold(bits, axis, dims)

    def observe(j: Judgement) -> None:
        stats["outputs"] += j.n

    check = Check(
        name=f"fold {op}",
        inputs=inputs,
        native=lambda f: _bits(native_fn(f.bits.view(xp.float32), axis=f.axis, device=ctx.device)),
        reference=lambda f: Expected(bits=_fold_reference(op, to_host(f.bits).reshape(f.dims))),
        agreement=engine.item_agreement(ctx, "bitwise"),
        cases=_fold_cases(max_dim, max_elements, max_fold),
        explicit=_TIE_CASES if op == "max" else (),
        encode=_fold_encode,
        decode=_fold_decode,
        describe=_case_json(("seed", "shape", "axis", "mix")),
        observe=observe,
        **_fold_alternative(op),
        build={
            "op": op,
            "reference": f"spec.reductions fold on the host, env cuda: {ref.route_name('cuda', ROUTE)}",
            "max_elements": max_elements,
            "max_fold": max_fold,
            "route": red.ROUTE if ctx.device == "cuda" else "host float32 in fold order",
        },
    )
    return engine.run(
        ctx,
        check,
        lambda: {
            "longest_fold": stats["longest_fold"],
            "outputs": stats["outputs"],
            "elements": stats["elements"],
            "layouts": sorted(stats["kinds"]),
            **({"tie_windows": stats["tie_windows"]} if op == "max" else {}),
        },
    )


def tie_windows(x3: np.ndarray) -> int:
    """Outputs of an (outer, length, inner) bit array whose window holds several candidates for the maximum: two or
    more NaNs, or (no NaN) the maximum more than once (+0 and -0 count as equal)."""
    if x3.size == 0:
        return 0
    f = np.asarray(x3, np.uint32).view(np.float32)
    nans = np.isnan(f).sum(axis=1)
    with np.errstate(invalid="ignore"):
        m = np.fmax.reduce(f, axis=1)
        equal = (f == m[:, None, :]).sum(axis=1)
    return int(np.sum((nans >= 2) | ((nans == 0) & (equal >= 2))))


# -- dot product and the VJPs of sum, mean and max (MK-12, MK-13) ------------------------------------------------


def _last(a: np.ndarray, dims: tuple[int, int, int]) -> np.ndarray:
    """(outer, length, inner) bits with the reduced axis last: the spec's layout."""
    return np.ascontiguousarray(np.moveaxis(np.asarray(a, np.uint32).reshape(dims), 1, 2))


def _back(a: np.ndarray) -> np.ndarray:
    """(outer, inner, length) bits back to the flat (outer, length, inner) order the kernels write."""
    return np.ascontiguousarray(np.moveaxis(a, 2, 1)).reshape(-1)


def _vjp_reference(op: str, f: _Vjp, reverse: bool = False) -> np.ndarray:
    x, y = (to_host(v).reshape(f.dims) for v in (f.x, f.y))
    if reverse:
        x, y = x[:, ::-1, :], y[:, ::-1, :]
    dims, dy = f.dims, to_host(f.dy).reshape(f.dims[0], f.dims[2])
    if op == "dot":
        return np.asarray(ref.dot(_last(x, dims), _last(y, dims), route=ROUTE), np.uint32).reshape(-1)
    if op == "sum_vjp":
        return _back(ref.sum_vjp(dy, dims[1]))
    if op == "mean_vjp":
        return _back(ref.mean_vjp(dy, dims[1], route=ROUTE))
    out = ref.max_vjp(_last(x, dims), dy)
    return _back(out[:, :, ::-1] if reverse else out)


@dataclass(frozen=True)
class _Vjp:
    x: Any
    y: Any
    dy: Any
    shape: tuple[int, ...]
    axis: int | None
    dims: tuple[int, int, int]


_VJP_NATIVE: dict[str, Callable[[_Vjp, Any, str], Any]] = {
    "dot": lambda f, xp, d: red.dot(
        f.x.view(xp.float32).reshape(f.shape), f.y.view(xp.float32).reshape(f.shape), axis=f.axis, device=d
    ),
    "sum_vjp": lambda f, xp, d: red.sum_vjp(f.dy.view(xp.float32), f.shape, axis=f.axis, device=d),
    "mean_vjp": lambda f, xp, d: red.mean_vjp(f.dy.view(xp.float32), f.shape, axis=f.axis, device=d),
    "max_vjp": lambda f, xp, d: red.max_vjp(
        f.x.view(xp.float32).reshape(f.shape), f.dy.view(xp.float32), axis=f.axis, device=d
    ),
}


@register_test("reductions.vjp_bitwise")
def vjp_bitwise(ctx: FalsifyContext) -> Outcome:
    """Dot product (op dot) or a reduction's VJP (sum_vjp, mean_vjp, max_vjp) bitwise equal to spec.reductions."""
    op = str(ctx.params.get("op", "dot"))
    native_fn = _VJP_NATIVE[op]
    xp = array_module(ctx.device)
    b = ctx.budget
    max_dim = int(ctx.params.get("max_dim", 24)) * b.scale
    max_elements = int(ctx.params.get("max_elements", b.max_size))
    max_fold = int(ctx.params.get("max_fold", b.max_fold))
    stats = {"elements": 0, "tie_windows": 0}

    def inputs(case: tuple) -> _Vjp:
        seed, shape, axis, mix = case
        size = int(np.prod(shape, dtype=np.int64))
        x, y = _input_bits(seed, size, mix, xp, 2)
        _, _, dims = red._axis_view(x.reshape(shape), axis)
        dy = _input_bits(seed + 7, dims[0] * dims[2], mix, xp)[0]
        stats["elements"] += size
        if op == "max_vjp":
            stats["tie_windows"] += tie_windows(to_host(x).reshape(dims))
        return _Vjp(x, y, dy, tuple(shape), axis, dims)

    reversed_name = {"dot": "the fold over the reversed axis", "max_vjp": "dy routed to the last argmax"}
    alt: dict[str, Any] = {}
    if op in reversed_name:
        alt = {
            "alternative": lambda f: Expected(bits=_vjp_reference(op, f, reverse=True)),
            "alternative_name": reversed_name[op],
        }
    check = Check(
        name=f"reductions {op}",
        inputs=inputs,
        native=lambda f: _bits(native_fn(f, xp, ctx.device)).reshape(-1),
        reference=lambda f: Expected(bits=_vjp_reference(op, f)),
        agreement=engine.item_agreement(ctx, "bitwise"),
        cases=_fold_cases(max_dim, max_elements, max_fold),
        explicit=_TIE_CASES if op == "max_vjp" else (),
        encode=_fold_encode,
        decode=_fold_decode,
        describe=_case_json(("seed", "shape", "axis", "mix")),
        **alt,
        build={"op": op, "reference": f"spec.reductions {op} on the host, env cuda: {ref.route_name('cuda', ROUTE)}"},
    )
    return engine.run(ctx, check, lambda: dict(stats))


# -- tree --------------------------------------------------------------------------------------------------


_TREE_CASE = ("seed", "n", "mix", "block", "max_grid")


def _tree_decode(rp: Replay) -> tuple:
    v = rp.values
    knobs = tuple(v[3:5]) if len(v) >= 5 else (red.BLOCK, red.MAX_GRID)
    return (v[0], v[1], _mix(v[2]), *knobs)


def _tree_encode(case: tuple) -> tuple[int, ...]:
    return case[0], case[1], MIX_NAMES.index(case[2]), case[3], case[4]


def _tree_values(case: tuple) -> dict[str, int]:
    return {"n": case[1], "block": case[3], "max_grid": case[4]}


def _tree_bits(bits: Any, block: int, max_grid: int, op: str) -> np.ndarray:
    """The softfloat evaluation of the stated tree (then the one division of the mean) over input bits."""
    n = int(bits.size)
    total = ref.tree_sum(to_host(bits), red.pass_grids(n, block, max_grid), block, route=ROUTE)
    return np.asarray(ref.mean_of(total, n, route=ROUTE) if op == "mean" else total, dtype=np.uint32).reshape(-1)


def _other_tree_bits(bits: Any, block: int, max_grid: int, op: str) -> np.ndarray:
    """The same sum reassociated: the stated tree evaluated with half the block (the order the kernel is not)."""
    return _tree_bits(bits, max(block // 2, 1), max_grid, op)


@register_test("reductions.tree_bitwise")
def tree_bitwise(ctx: FalsifyContext) -> Outcome:
    """Tree sum (or tree mean: op mean) bitwise equal to the softfloat evaluation of the stated tree."""
    op = ctx.params.get("op", "sum")
    name, impl = _impl(ctx, "native.reductions:tree_sum" if op == "sum" else "native.reductions:mean")
    call = (lambda x, **kw: impl(x, order="tree", **kw)) if op == "mean" else impl
    xp = array_module(ctx.device)
    max_n = int(ctx.params.get("max_n", 1 << 15)) * ctx.budget.scale**2
    sizes = st.one_of(st.integers(0, 600), st.integers(0, max_n), st.sampled_from([1, 255, 256, 257, 65537]))
    stats = {"elements": 0, "max_passes": 0}
    knobs = st.just((red.BLOCK, red.MAX_GRID))

    def inputs(case: tuple) -> Any:
        seed, n, mix, block, max_grid = case
        stats["elements"] += n
        stats["max_passes"] = max(stats["max_passes"], len(red.pass_grids(n, block, max_grid)))
        return case, _input_bits(seed, n, mix, xp)[0]

    def native(a: tuple) -> np.ndarray:
        (_, _, _, block, max_grid), bits = a
        return _bits(call(bits.view(xp.float32), device=ctx.device, block=block, max_grid=max_grid))

    # Sizes a pass of the tree treats differently: one thread per element, one trip more, several passes.
    explicit = tuple(
        (ctx.seed, n, "moderate", red.BLOCK, red.MAX_GRID) for n in (200, 1000, 257 * 256 + 3, min(max_n, 600_000))
    )
    check = Check(
        name=name,
        inputs=inputs,
        native=native,
        reference=lambda a: Expected(bits=_tree_bits(a[1], a[0][3], a[0][4], op)),
        agreement=engine.item_agreement(ctx, "bitwise"),
        cases=st.builds(
            lambda c, k: (*c, *k), st.tuples(st.integers(0, 2**32 - 1), sizes, st.sampled_from(MIX_NAMES)), knobs
        ),
        explicit=explicit,
        encode=_tree_encode,
        decode=_tree_decode,
        describe=_case_json(_TREE_CASE),
        from_witness=lambda w: (ctx.seed, int(w["n"]), "absorb", int(w["block"]), int(w["max_grid"])),
        regime_of=lambda case: regime_of(red.tree_plan, _tree_values(case)),
        alternative=lambda a: Expected(bits=_other_tree_bits(a[1], a[0][3], a[0][4], op)),
        alternative_name="the tree with half the block (another reassociation)",
        build={
            "impl": name,
            "op": op,
            "reference": f"spec.reductions tree_sum on the host, env cuda: {ref.route_name('cuda', ROUTE)}",
            "tree": {
                "block": red.BLOCK,
                "max_grid": red.MAX_GRID,
                "unroll_loads": red.UNROLL,
                "combine": "sh[t] = sh[t] + sh[t + s], s = block/2 .. 1, then repeated",
            },
        },
    )
    return engine.run(ctx, check, lambda: dict(stats))


@register_test("reductions.determinism")
def determinism(ctx: FalsifyContext) -> Outcome:
    """Repeated runs on one input give identical bits."""
    name, impl = _impl(ctx, "native.reductions:tree_sum")
    runs, n = int(ctx.params.get("runs", 5)), int(ctx.params.get("n", 1 << 18))
    xp = array_module(ctx.device)
    agreement = engine.item_agreement(ctx, "determinism", runs=runs)
    check = Check(
        name=name,
        inputs=lambda case: moderate_floats(case[0], case[1], xp),
        native=lambda x: _bits(impl(x, device=ctx.device)),
        reference=lambda x: None,
        agreement=agreement,
        explicit=((ctx.seed, n),),
        count=lambda j: runs,
        encode=lambda c: c,
        decode=lambda rp: tuple(rp.values[:2]),
        describe=_case_json(("seed", "n")),
        build={"impl": name, "runs": runs, "n": n},
    )
    return engine.run(ctx, check)


@register_test("reductions.nonreproducible")
def nonreproducible(ctx: FalsifyContext) -> Outcome:
    """The atomic path's results vary run to run (measured and kept as evidence)."""
    name, impl = _impl(ctx, "native.reductions:atomic_sum")
    runs, n = int(ctx.params.get("runs", 20)), int(ctx.params.get("n", 1 << 18))
    x = moderate_floats(ctx.seed, n, array_module(ctx.device))
    results = [f"0x{int(_bits(impl(x, device=ctx.device)).reshape(-1)[0]):08X}" for _ in range(runs)]
    distinct = sorted(set(results))
    ev = {
        "impl": name,
        "runs": runs,
        "n": n,
        "distinct_results": len(distinct),
        "results": results,
        "blocks_adding_atomically": red.pass_grids(n)[0],
    }
    if len(distinct) < 2:
        return engine.outcome_violated(
            ctx,
            {"results": results},
            f"{name}: {runs} runs agreed; the documented "
            "non-reproducibility was not observed (is the path really atomic?)",
            **ev,
        )
    return engine.outcome_passed(ctx, runs, **ev)


# -- error bounds ------------------------------------------------------------------------------------------


EXACT_SUM = (
    "spec.reductions.exact_sum: the exactly rounded float64 sum (what math.fsum returns), in integers "
    "(per-exponent bins summed exactly by np.bincount, combined as Python ints, one correctly rounded division)"
)


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
    max_n = int(ctx.params.get("max_n", 1 << 16)) * ctx.budget.scale**2
    worst = {"ratio": 0.0}

    def reference(x: Any) -> Expected:
        xs = to_host(x)
        n = int(xs.size)
        exact, total_abs = ref.exact_sum(xs)
        flush = red.pass_grids(n)[0] * 2.0**-126 if order == "atomic" else 0.0
        bound = ref.gamma(_depth(order, n)) * total_abs + 2.0**-53 * abs(exact) + flush
        return Expected(value=np.array([exact]), bound=np.array([bound]))

    def observe(j: Judgement) -> None:
        err = abs(float(j.native[0][0]) - float(j.expected[0].value[0]))
        bound = float(j.expected[0].bound[0])
        worst["ratio"] = max(worst["ratio"], err / bound if bound else 0.0)

    agreement = engine.item_agreement(
        ctx,
        "error_bound",
        bound_name="gamma_h * sum|x| + 2^-53 |exact| "
        "(+ grid * 2^-126 for atomic flushes); h = additions on the longest path "
        "of the order's tree",
    )
    check = Check(
        name=name,
        inputs=lambda case: moderate_floats(case[0], case[1], xp),
        native=lambda x: np.asarray(to_host(impl(x, device=ctx.device)), dtype=np.float32).reshape(1),
        reference=reference,
        agreement=agreement,
        cases=st.tuples(st.integers(0, 2**32 - 1), st.integers(0, max_n)),
        encode=lambda c: c,
        decode=lambda rp: tuple(rp.values[:2]),
        describe=_case_json(("seed", "n")),
        observe=observe,
        build={"impl": name, "order": order, "u": "2^-24", "reference": EXACT_SUM},
    )
    return engine.run(ctx, check, lambda: {"worst_error_over_bound": worst["ratio"]})


# -- scatter-add, empty inputs, bandwidth --------------------------------------------------------------------


@register_test("reductions.scatter_bitwise")
def scatter_bitwise(ctx: FalsifyContext) -> Outcome:
    """Deterministic scatter-add bitwise equal to adding duplicates in increasing source order."""
    name, impl = _impl(ctx, "native.reductions:scatter_add")
    xp = array_module(ctx.device)
    max_src = int(ctx.params.get("max_src", 400)) * ctx.budget.scale
    stats = {"duplicates": 0}

    def inputs(case: tuple) -> tuple:
        seed, n_out, m, mix = case
        idx = xp.asarray(np.random.default_rng(seed).integers(0, n_out, m))
        src, init = _input_bits(seed, m, mix, xp, 2)
        out0 = init[:n_out] if m >= n_out else xp.zeros(n_out, dtype=xp.uint32)
        stats["duplicates"] += m - len(set(to_host(idx).tolist()))
        return out0, idx, src

    check = Check(
        name=name,
        inputs=inputs,
        native=lambda a: _bits(impl(a[0].view(xp.float32), a[1], a[2].view(xp.float32), device=ctx.device)),
        reference=lambda a: Expected(bits=ref.scatter_add(*(to_host(v) for v in a), route=ROUTE)),
        agreement=engine.item_agreement(ctx, "bitwise"),
        cases=st.tuples(
            st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(0, max_src), st.sampled_from(MIX_NAMES)
        ),
        encode=lambda c: (c[0], c[1], c[2], MIX_NAMES.index(c[3])),
        decode=lambda rp: (rp.values[0], rp.values[1], rp.values[2], _mix(rp.values[3])),
        describe=_case_json(("seed", "n_out", "m", "mix")),
        alternative=lambda a: Expected(
            bits=ref.scatter_add(to_host(a[0]), to_host(a[1])[::-1], to_host(a[2])[::-1], route=ROUTE)
        ),
        alternative_name="duplicates in decreasing source index",
        build={
            "impl": name,
            "order": "duplicates in increasing source index",
            "reference": f"spec.reductions scatter_add on the host, env cuda: {ref.route_name('cuda', ROUTE)}",
        },
    )
    return engine.run(ctx, check, lambda: {"duplicates_added": stats["duplicates"]})


# label -> (kind, call on an empty float32 array, number of outputs)
_EMPTY_CASES: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "sum/fold": ("sum", lambda x, d: red.fold_sum(x, device=d)),
    "sum/tree": ("sum", lambda x, d: red.tree_sum(x, device=d)),
    "sum/atomic": ("sum", lambda x, d: red.atomic_sum(x, device=d)),
    "mean/fold": ("mean", lambda x, d: red.mean(x, device=d)),
    "mean/tree": ("mean", lambda x, d: red.mean(x, device=d, order="tree")),
    "max/fold": ("max", lambda x, d: red.fold_max(x, device=d)),
    "sum/axis": ("sum", lambda x, d: red.fold_sum(x.reshape(3, 0), axis=1, device=d)),
    "max/axis": ("max", lambda x, d: red.fold_max(x.reshape(3, 0), axis=1, device=d)),
    "mean/axis": ("mean", lambda x, d: red.mean(x.reshape(3, 0), axis=1, device=d)),
}
_EMPTY_BITS: dict[str, int] = {"sum": 0x00000000, "mean": 0x7FFFFFFF, "max": 0xFF800000}
_EMPTY_LABELS = tuple(_EMPTY_CASES)


@register_test("reductions.empty")
def empty(ctx: FalsifyContext) -> Outcome:
    """Empty reductions: sum +0 (fold, tree, atomic), mean NaN, max -Inf, also along a zero-length axis."""
    xp = array_module(ctx.device)
    got: dict[str, list[str]] = {}

    def native(label: str) -> np.ndarray:
        b = _bits(_EMPTY_CASES[label][1](xp.zeros(0, dtype=xp.float32), ctx.device)).reshape(-1)
        got[label] = [f"0x{int(v):08X}" for v in b]
        return b

    def reference(label: str) -> Expected:
        n = 3 if label.endswith("/axis") else 1
        return Expected(bits=np.full(n, _EMPTY_BITS[_EMPTY_CASES[label][0]], dtype=np.uint32))

    check = Check(
        name="empty reductions",
        inputs=lambda label: label,
        native=native,
        reference=reference,
        agreement=engine.item_agreement(ctx, "bitwise"),
        explicit=_EMPTY_LABELS,
        encode=lambda label: (_EMPTY_LABELS.index(label),),
        decode=lambda rp: _EMPTY_LABELS[rp.values[0]],
        describe=lambda label: {"case": label},
        build={"documented": {"sum": "+0", "mean": "NaN (0x7FFFFFFF)", "max": "-Inf (the identity of maximum)"}},
    )
    return engine.run(ctx, check, lambda: {"results": dict(got)})


@register_test("reductions.bandwidth", devices=("cuda",))
def bandwidth(ctx: FalsifyContext) -> Outcome:
    """The tree sum of n float32 reads at >= tolerance x the throughput of the strongest library sum (same run).

    Peers run with their libraries' defaults: cupy.sum with CuPy's own accelerators (CUB; kc's switch to plain
    reductions is for kc's kernels only) and torch.sum; the faster is quoted.
    """
    import cupy
    import torch

    from falsification import measure
    from obligations.core.device import library_defaults

    n = int(ctx.params.get("n", 1 << 28))
    want, source = measure.threshold(ctx) if ctx.tolerance is not None else (0.8, "default")
    budget = measure.Budget.of(ctx.params)
    x = cupy.asarray(moderate_floats(ctx.seed, 1 << 20)).repeat(max(n >> 20, 1))[:n]
    tx = torch.as_tensor(x, device="cuda")
    with library_defaults() as acc:
        accelerators = {k: [str(a) for a in v] for k, v in acc.items()}
    comp = measure.Comparison(
        ours=lambda: red.tree_sum(x, device="cuda"),
        peers={"cupy.sum": lambda: cupy.sum(x), "torch.sum": lambda: torch.sum(tx)},
        configs={
            "cupy.sum": f"cupy {cupy.__version__} cupy.sum with CuPy's defaults (accelerators {accelerators})",
            "torch.sum": f"torch {torch.__version__} torch.sum, defaults",
        },
        context={"cupy.sum": library_defaults},
        ours_name="tree_sum",
    )
    verdicts = {"sum": measure.compare(comp, want, ">=", budget, measure.item_seed(ctx.seed, "sum"))}
    gbs = {name: n * 4 / ms / 1e6 for name, ms in verdicts["sum"].extra["median_ms"].items()}
    return measure.outcome(
        ctx,
        verdicts,
        f"tree sum of {n} float32: peer_ms / tree_sum_ms >= {want:g}",
        budget,
        threshold_source=source,
        GB_per_s_from_median=gbs,
        n=n,
    )
