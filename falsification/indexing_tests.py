"""Falsification tests of the indexing family (contracts/indexing-v1.yaml), registered by name.

* ``indexing.bitwise`` {op} — one entry point of :mod:`native.indexing` bitwise against :mod:`spec.indexing` on
  any input bits (the project's float32 mixes: NaN payloads, subnormals, signed zeros). ``op``: gather,
  gather_vjp, index_copy (cases from the rows plan: witnesses of an item's ``witnesses:`` build a table of the
  witness's rows with its index first; a rejected index must raise IndexError), slice (the copy plan's windows,
  the same way), slice_vjp, concat, concat_vjp, where, masked_fill, reduce_to_shape. The adders (gather_vjp,
  reduce_to_shape) state an order and name the reversed one as the alternative.
* ``indexing.atomic_bound`` {} — scatter_add_atomic within :func:`spec.indexing.atomic_bound` per output.
* ``indexing.determinism`` {op: gather_vjp|scatter_add_atomic, runs} — ``runs`` calls on one input with many
  duplicate indices bit-identical (the atomic one is expected not to be: its item says ``expect: violated``).
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
from falsification.reductions_tests import MIX_NAMES, moderate_floats
from falsification.reductions_tests import _input_bits as input_bits
from falsification.registry import FalsifyContext, register_test
from native import indexing as ni
from obligations.core.device import array_module, to_host
from obligations.core.plans import regime_of
from obligations.core.results import Outcome
from spec import indexing as si

__all__ = ["OPS", "Op"]

SEED = st.integers(0, 2**32 - 1)
MIX = st.integers(0, len(MIX_NAMES) - 1)


def _bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(to_host(a)).astype(np.float32).view(np.uint32).reshape(-1)


@dataclass(frozen=True)
class Op:
    """One entry point under test: its case fields, strategy, native call, reference, and the plan it follows."""

    fields: tuple[str, ...]
    cases: Callable[[int], st.SearchStrategy]
    inputs: Callable[[tuple, Any], Any]
    native: Callable[[Any, str], Any]
    reference: Callable[[Any], np.ndarray]
    alternative: Callable[[Any], np.ndarray] | None = None
    alternative_name: str = ""
    from_witness: Callable[[Any], tuple | None] | None = None
    regime_of: Callable[[tuple], list[str]] | None = None


# -- rows ops: gather, gather_vjp, index_copy ------------------------------------------------------------------

_ROWS = ("seed", "rows", "d", "m", "forced", "index", "mix")


def _rows_cases(scale: int) -> st.SearchStrategy:
    return st.tuples(SEED, st.integers(1, 12 * scale), st.integers(0, 4), st.integers(0, 24 * scale)).map(
        lambda c: (*c, 0, 0, c[0] % len(MIX_NAMES))
    )


def _rows_indices(case: tuple, distinct: bool) -> np.ndarray:
    seed, rows, _, m, forced, index, _ = case
    rng = np.random.default_rng(seed)
    if distinct:
        m = min(m, rows)
        idx = rng.permutation(rows)[:m]
    else:
        idx = rng.integers(0, max(rows, 1), m) if rows else np.zeros(m, np.int64)
    if forced:
        rest = [int(i) for i in idx if int(i) != index] if distinct else idx.tolist()
        idx = np.array([index, *rest][: max(m, 1)], dtype=np.int64)
    return idx.astype(np.int64)


def _rows_witness(w: Any) -> tuple:
    return (0, int(w["rows"]), int(w["d"]), int(w["m"]), 1, int(w["index"]), 0)


def _rows_regimes(distinct: bool) -> Callable[[tuple], list[str]]:
    def of(case: tuple) -> list[str]:
        idx = _rows_indices(case, distinct)
        if idx.size == 0:
            return []
        return regime_of(ni.rows_plan, {"rows": case[1], "d": case[2], "m": case[3], "index": int(idx[0])})

    return of


def _gather_inputs(case: tuple, xp: Any) -> tuple:
    seed, rows, d, *_ = case
    table = input_bits(seed, rows * d, MIX_NAMES[case[6]], xp)[0].reshape(rows, d)
    return table, xp.asarray(_rows_indices(case, False))


def _vjp_inputs(case: tuple, xp: Any) -> tuple:
    idx = _rows_indices(case, False)
    dy = input_bits(case[0], idx.size * case[2], MIX_NAMES[case[6]], xp)[0].reshape(idx.size, case[2])
    return dy, xp.asarray(idx), case[1]


def _copy_rows_inputs(case: tuple, xp: Any) -> tuple:
    seed, rows, d, *_ = case
    idx = _rows_indices(case, True)
    out, src = input_bits(seed, max(rows, idx.size) * d, MIX_NAMES[case[6]], xp, 2)
    return out[: rows * d].reshape(rows, d), xp.asarray(idx), src[: idx.size * d].reshape(idx.size, d)


# -- axis copies: slice, slice_vjp, concat, concat_vjp -----------------------------------------------------------

_COPY = ("seed", "outer", "length", "inner", "start", "count", "mix")


def _copy_cases(scale: int) -> st.SearchStrategy:
    def build(c: tuple) -> tuple:
        seed, outer, length, inner, a, b = c
        start, stop = sorted((a % (length + 1), b % (length + 1)))
        return (seed, outer, length, inner, start, stop - start, seed % len(MIX_NAMES))

    dims = st.integers(0, 5 * scale)
    return st.tuples(SEED, dims, st.integers(0, 9 * scale), dims, st.integers(0, 99), st.integers(0, 99)).map(build)


def _copy_witness(w: Any) -> tuple:
    return (0, int(w["outer"]), int(w["length"]), int(w["inner"]), int(w["start"]), int(w["count"]), 0)


def _copy_regimes(case: tuple) -> list[str]:
    return regime_of(ni.copy_plan, dict(zip(_COPY[1:6], case[1:6], strict=True)))


def _x3(case: tuple, xp: Any, length: int | None = None) -> Any:
    seed, outer, n, inner, *_ = case
    n = n if length is None else length
    return input_bits(seed, outer * n * inner, MIX_NAMES[case[6]], xp)[0].reshape(outer, n, inner)


def _concat_inputs(case: tuple, xp: Any) -> list:
    x = _x3(case, xp)
    return [x, _x3((case[0] + 1, *case[1:]), xp, case[5])]


# -- shape ops: where, masked_fill, reduce_to_shape ----------------------------------------------------------------

_SHAPE = ("seed", "d0", "d1", "d2", "keep", "mix")


def _shape_cases(scale: int) -> st.SearchStrategy:
    dim = st.integers(0, 6 * scale)
    return st.tuples(SEED, dim, dim, dim, st.integers(0, 15), MIX)


def _shape_inputs(case: tuple, xp: Any) -> tuple:
    seed, d0, d1, d2, keep, mix = case
    a, b = input_bits(seed, d0 * d1 * d2, MIX_NAMES[mix], xp, 2)
    mask = np.random.default_rng(seed).random((d0, d1, d2)) < 0.5
    return a.reshape(d0, d1, d2), b.reshape(d0, d1, d2), xp.asarray(mask)


def _target_shape(case: tuple) -> tuple[int, ...]:
    """The operand shape a broadcast to (d0, d1, d2) came from: axis i kept where bit i of ``keep``, else 1; bit 3
    drops the leading size-1 axes (a broadcast that also added axes)."""
    dims, keep = case[1:4], case[4]
    shape = [d if keep >> i & 1 else 1 for i, d in enumerate(dims)]
    while keep & 8 and shape and shape[0] == 1:
        shape.pop(0)
    return tuple(shape)


def _reduce_inputs(case: tuple, xp: Any) -> tuple:
    return _shape_inputs(case, xp)[0], _target_shape(case)


def _f(xp: Any, a: Any) -> Any:
    return a.view(xp.float32)


def _h(a: Any) -> np.ndarray:
    return np.asarray(to_host(a))


def _cat(parts: list) -> np.ndarray:
    return np.concatenate([_bits(p) for p in parts]) if parts else np.zeros(0, np.uint32)


OPS: dict[str, Callable[[Any], Op]] = {
    "gather": lambda xp: Op(
        _ROWS,
        _rows_cases,
        _gather_inputs,
        lambda a, dev: ni.gather(_f(xp, a[0]), a[1], device=dev),
        lambda a: si.gather(_h(a[0]), _h(a[1])),
        from_witness=_rows_witness,
        regime_of=_rows_regimes(False),
    ),
    "gather_vjp": lambda xp: Op(
        _ROWS,
        _rows_cases,
        _vjp_inputs,
        lambda a, dev: ni.gather_vjp(_f(xp, a[0]), a[1], a[2], device=dev),
        lambda a: si.gather_vjp(_h(a[0]), _h(a[1]), a[2]),
        alternative=lambda a: si.gather_vjp(_h(a[0])[::-1], _h(a[1])[::-1], a[2]),
        alternative_name="duplicates added in decreasing j",
        from_witness=_rows_witness,
        regime_of=_rows_regimes(False),
    ),
    "index_copy": lambda xp: Op(
        _ROWS,
        _rows_cases,
        _copy_rows_inputs,
        lambda a, dev: ni.index_copy(_f(xp, a[0]), a[1], _f(xp, a[2]), device=dev),
        lambda a: si.index_copy(*(_h(v) for v in a)),
        from_witness=_rows_witness,
        regime_of=_rows_regimes(True),
    ),
    "slice": lambda xp: Op(
        _COPY,
        _copy_cases,
        lambda case, xp_: (_x3(case, xp_), case[4], case[5]),
        lambda a, dev: ni.slice_axis(_f(xp, a[0]), 1, a[1], a[1] + a[2], device=dev),
        lambda a: si.slice_axis(_h(a[0]), 1, a[1], a[1] + a[2]),
        from_witness=_copy_witness,
        regime_of=_copy_regimes,
    ),
    "slice_vjp": lambda xp: Op(
        _COPY,
        _copy_cases,
        lambda case, xp_: (_x3(case, xp_, case[5]), (case[1], case[2], case[3]), case[4]),
        lambda a, dev: ni.slice_vjp(_f(xp, a[0]), a[1], 1, a[2], device=dev),
        lambda a: si.slice_vjp(_h(a[0]), a[1], 1, a[2]),
        regime_of=_copy_regimes,
    ),
    "concat": lambda xp: Op(
        _COPY,
        _copy_cases,
        _concat_inputs,
        lambda a, dev: ni.concat([_f(xp, v) for v in a], 1, device=dev),
        lambda a: si.concat([_h(v) for v in a], 1),
    ),
    "concat_vjp": lambda xp: Op(
        _COPY,
        _copy_cases,
        lambda case, xp_: (_x3(case, xp_), [case[4], case[5], case[2] - case[4] - case[5]]),
        lambda a, dev: _cat(ni.concat_vjp(_f(xp, a[0]), a[1], 1, device=dev)),
        lambda a: _cat(si.concat_vjp(_h(a[0]), a[1], 1)),
    ),
    "where": lambda xp: Op(
        _SHAPE,
        _shape_cases,
        _shape_inputs,
        lambda a, dev: ni.where(a[2], _f(xp, a[0]), _f(xp, a[1]), device=dev),
        lambda a: si.where(_h(a[2]), _h(a[0]), _h(a[1])),
    ),
    "masked_fill": lambda xp: Op(
        _SHAPE,
        _shape_cases,
        _shape_inputs,
        lambda a, dev: ni.masked_fill(_f(xp, a[0]), a[2], -np.inf, device=dev),
        lambda a: si.masked_fill(_h(a[0]), _h(a[2]), 0xFF800000),
    ),
    "reduce_to_shape": lambda xp: Op(
        _SHAPE,
        _shape_cases,
        _reduce_inputs,
        lambda a, dev: ni.reduce_to_shape(_f(xp, a[0]), a[1], device=dev),
        lambda a: si.reduce_to_shape(_h(a[0]), a[1]),
        alternative=lambda a: np.flip(si.reduce_to_shape(np.flip(_h(a[0])), a[1])),
        alternative_name="each output's fold in decreasing dy flat index",
    ),
}


def _describe(fields: tuple[str, ...]) -> Callable[[tuple], dict[str, Any]]:
    return lambda case: dict(zip(fields, case, strict=True))


@register_test("indexing.bitwise")
def bitwise(ctx: FalsifyContext) -> Outcome:
    """One indexing entry point bitwise equal to spec.indexing on any input bits (and its guard at its witnesses)."""
    name = str(ctx.params.get("op", "gather"))
    xp = array_module(ctx.device)
    op = OPS[name](xp)
    stats = {"elements": 0}

    def observe(j: Judgement) -> None:
        stats["elements"] += j.n

    alt: dict[str, Any] = {}
    if op.alternative is not None:
        alt = {
            "alternative": lambda a: Expected(bits=op.alternative(a).reshape(-1)),
            "alternative_name": op.alternative_name,
        }
    check = Check(
        name=f"indexing {name}",
        inputs=lambda case: op.inputs(case, xp),
        native=lambda a: _bits(op.native(a, ctx.device)),
        reference=lambda a: Expected(bits=np.asarray(op.reference(a), np.uint32).reshape(-1)),
        agreement=engine.item_agreement(ctx, "bitwise"),
        cases=op.cases(ctx.budget.scale),
        encode=lambda c: tuple(int(v) for v in c),
        decode=lambda rp: tuple(rp.values[: len(op.fields)]),
        describe=_describe(op.fields),
        observe=observe,
        from_witness=op.from_witness,
        regime_of=op.regime_of,
        refuses=(IndexError,),
        **alt,
        build={"op": name, "reference": "spec.indexing (bit copies; adders through spec.reductions, env cuda)"},
    )
    return engine.run(ctx, check, lambda: dict(stats))


def _scatter_inputs(case: tuple, xp: Any) -> tuple:
    seed, n_out, m = case
    idx = np.random.default_rng(seed).integers(0, n_out, m)
    return xp.asarray(moderate_floats(seed, n_out)), xp.asarray(idx), xp.asarray(moderate_floats(seed + 1, m))


@register_test("indexing.atomic_bound")
def atomic_bound(ctx: FalsifyContext) -> Outcome:
    """Atomic scatter-add within gamma_k (|out0| + sum|src|) + 3k 2^-126 of each output's exact sum."""
    xp = array_module(ctx.device)
    worst = {"ratio": 0.0}

    def reference(a: tuple) -> Expected:
        value, bound = si.atomic_bound(*(to_host(v) for v in a))
        return Expected(value=value, bound=bound)

    def observe(j: Judgement) -> None:
        err = np.abs(np.asarray(j.native[0], np.float64) - j.expected[0].value)
        b = j.expected[0].bound
        worst["ratio"] = max(worst["ratio"], float(np.max(err / np.where(b > 0, b, 1.0), initial=0.0)))

    check = Check(
        name="scatter_add_atomic",
        inputs=lambda case: _scatter_inputs(case, xp),
        native=lambda a: np.asarray(to_host(ni.scatter_add_atomic(*a, device=ctx.device)), np.float32),
        reference=reference,
        agreement=engine.item_agreement(
            ctx, "error_bound", bound_name="gamma_k (|out0| + sum|src|) + 3k 2^-126 + 2^-53 |exact|, k sources"
        ),
        cases=st.tuples(SEED, st.integers(1, 16), st.integers(0, 200 * ctx.budget.scale)),
        encode=lambda c: c,
        decode=lambda rp: tuple(rp.values[:3]),
        describe=_describe(("seed", "n_out", "m")),
        observe=observe,
        build={"reference": "spec.indexing.atomic_bound (math.fsum per output)"},
    )
    return engine.run(ctx, check, lambda: {"worst_error_over_bound": worst["ratio"]})


_DETERMINISM: dict[str, Callable[[tuple, str, Any], Any]] = {
    "gather_vjp": lambda a, dev, xp: ni.gather_vjp(a[2].reshape(-1, 1), a[1], int(a[0].size), device=dev),
    "scatter_add_atomic": lambda a, dev, xp: ni.scatter_add_atomic(xp.zeros_like(a[0]), a[1], a[2], device=dev),
}


@register_test("indexing.determinism")
def determinism(ctx: FalsifyContext) -> Outcome:
    """``runs`` calls on one input with many duplicate indices (4 outputs, n sources) give identical bits."""
    name = str(ctx.params.get("op", "gather_vjp"))
    runs, n = int(ctx.params.get("runs", 5)), int(ctx.params.get("n", 1 << 12))
    xp = array_module(ctx.device)
    call = _DETERMINISM[name]
    check = Check(
        name=name,
        inputs=lambda case: _scatter_inputs(case, xp),
        native=lambda a: _bits(call(a, ctx.device, xp)),
        reference=lambda a: None,
        agreement=engine.item_agreement(ctx, "determinism", runs=runs),
        explicit=((ctx.seed, 4, n),),
        count=lambda j: runs,
        encode=lambda c: c,
        decode=lambda rp: tuple(rp.values[:3]),
        describe=_describe(("seed", "n_out", "m")),
        build={"op": name, "runs": runs, "n": n},
    )
    return engine.run(ctx, check)
