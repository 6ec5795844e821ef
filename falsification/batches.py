"""Batches of binary32 operands as engine cases: one Hypothesis draw checks up to millions of elements.

A case is a :class:`~falsification.float32_inputs.BatchSpec` (seed, size, mix, explicit elements, scalars,
layout); :func:`batch_check` builds the engine :class:`~falsification.engine.Check` that expands it on the
run's device, runs the native callable on the batch's views (contiguous, strided, transposed or
broadcast) and the reference on the flat operands, and lets the engine minimise a failure to one element
(its operand bits, replayed with ``kc replay ... --bits``). Used by the elementwise family and by any
test of a kernel over binary32 operand arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
from hypothesis import strategies as st

from falsification.agreement import Agreement
from falsification.engine import Check, DrawCodec, Elements, NativeResult
from falsification.float32_inputs import MIXES, BatchSpec, batch_specs, generate_bits, layout_arrays
from falsification.profiles import Budget
from falsification.registry import Replay

__all__ = ["Batch", "batch_check", "DEFAULT_MIXES"]

DEFAULT_MIXES: tuple[str, ...] = ("balanced", "subnormal", "special", "correlated", "uniform")


@dataclass(frozen=True)
class Batch:
    """A materialised batch: its spec, the operand views the kernel sees and the flat C-order operands."""

    spec: BatchSpec
    views: list
    flat: list
    launch: Mapping[str, int] = field(default_factory=dict)  # launch knobs of a regime witness (block, max_grid)


def _hex(v: Any) -> str:
    return f"0x{int(v) & 0xFFFFFFFF:08X}"


def _f32(v: int) -> str:
    return repr(float(np.array([v], dtype=np.uint32).view(np.float32)[0]))


def batch_check(
    name: str,
    *,
    arity: int,
    native: Callable[[list, tuple], NativeResult],
    reference: Callable[[list, tuple], list],
    agreement: Agreement,
    budget: Budget,
    seed: int,
    xp: ModuleType = np,
    n_scalars: int = 0,
    operand_names: tuple[str, ...] = (),
    scalar_names: tuple[str, ...] = (),
    output_names: tuple[str, ...] = ("r",),
    layouts: tuple[str, ...] = ("contiguous",),
    mixes: tuple[str, ...] | None = None,
    prepare: Callable[[list], list] | None = None,
    scalar_strategy: st.SearchStrategy[int] | None = None,
    scalar_key: Any = None,
    build: dict[str, Any] | None = None,
    plan: Callable[..., Any] | None = None,
    knobs: tuple[str, ...] = (),
) -> Check[BatchSpec]:
    """The engine check of a binary32 kernel: ``native(views, scalars)`` against ``reference(flat, scalars)``.

    The first cases are full-size batches, balanced then one per mix (scalars 1.0); Hypothesis then draws
    batch specs.
    ``prepare`` maps operand views before both sides see them (e.g. into a function's domain).
    ``scalar_key``: a JSON description of ``scalar_strategy`` naming everything its draws depend on; with it (or
    without a scalar strategy) the check's draws may be stored and reused (:class:`~falsification.engine.DrawCodec`).
    ``plan`` (the kernel's launch plan, taking ``n`` and ``knobs``): a regime witness becomes a batch of its
    ``n`` elements launched with its knobs (``native(views, scalars, **knobs)``), and each batch's regimes are
    counted.
    """
    launches: dict[BatchSpec, dict[str, int]] = {}
    names = operand_names or tuple(f"x{k}" for k in range(arity))
    for m in mixes or ():
        if m not in MIXES:
            raise KeyError(f"unknown mix {m!r}")

    def inputs(spec: BatchSpec) -> Batch:
        views = layout_arrays(generate_bits(spec, arity, xp), spec.layout, xp)
        if prepare is not None:
            views = prepare(views)
        flat = [xp.ascontiguousarray(v).reshape(-1) for v in xp.broadcast_arrays(*views)] if views else []
        return Batch(spec, views, flat, launches.get(spec, {}))

    def from_witness(values: Mapping[str, int]) -> BatchSpec:
        spec = BatchSpec(
            seed=seed, size=int(values["n"]), mix="balanced", scalars=tuple(0x3F800000 for _ in range(n_scalars))
        )
        launches[spec] = {k: int(values[k]) for k in knobs if k in values}
        return spec

    def regimes(spec: BatchSpec) -> list[str]:
        from obligations.core.plans import regime_of

        return regime_of(plan, {"n": spec.size, **launches.get(spec, {})})

    def one_batch(tuples: list[tuple[int, ...]], spec: BatchSpec) -> BatchSpec:
        return BatchSpec(seed=0, size=len(tuples), explicit=tuple(enumerate(tuples)), scalars=spec.scalars)

    def describe_element(b: Batch, i: int) -> dict[str, Any]:
        ops = [int(f[i]) for f in b.flat]
        return {
            "operands": {nm: _hex(v) for nm, v in zip(names, ops, strict=True)},
            "operand_values": {nm: _f32(v) for nm, v in zip(names, ops, strict=True)},
        }

    def encode(spec: BatchSpec) -> tuple[int, ...]:
        if spec.size != 1 or not spec.explicit:
            raise ValueError("only a one-element batch replays by its bits")
        return tuple(spec.explicit[0][1])

    def decode(rp: Replay) -> BatchSpec:
        if len(rp.values) != arity or len(rp.scalars) != n_scalars:
            raise ValueError(f"replay needs {arity} operand bits and {n_scalars} scalars")
        return BatchSpec(seed=0, size=1, explicit=((0, rp.values),), scalars=rp.scalars)

    strategy = batch_specs(
        arity,
        n_scalars,
        budget.max_size,
        budget.max_explicit,
        mixes=mixes or DEFAULT_MIXES,
        layouts=layouts,
        scalar_bits=scalar_strategy,
    )
    # Everything the strategy depends on (with the project's source, which the store adds): its draws may be reused.
    # A check drawing its scalars from a strategy of its own needs that strategy described (scalar_key), else its
    # draws are never stored.
    codec = (
        DrawCodec(
            key={
                "strategy": "falsification.float32_inputs.batch_specs",
                "arity": arity,
                "n_scalars": n_scalars,
                "max_size": budget.max_size,
                "max_explicit": budget.max_explicit,
                "mixes": list(mixes or DEFAULT_MIXES),
                "layouts": list(layouts),
                "scalar_strategy": scalar_key,
            },
            encode=lambda spec: spec.to_json(),
            decode=BatchSpec.from_json,
        )
        if scalar_strategy is None or scalar_key is not None
        else None
    )
    # Explicit first cases: one full-size batch per mix (scalars 1.0), whatever Hypothesis draws after them.
    ones = tuple(0x3F800000 for _ in range(n_scalars))
    firsts = tuple(
        BatchSpec(seed=seed + k, size=budget.max_size, mix=m, scalars=ones)
        for k, m in enumerate(dict.fromkeys(("balanced", *(mixes or DEFAULT_MIXES))))
    )
    return Check(
        name=name,
        inputs=inputs,
        native=lambda b: native(b.views, b.spec.scalars, **b.launch),
        reference=lambda b: reference(b.flat, b.spec.scalars),
        agreement=agreement,
        cases=strategy,
        explicit=firsts,
        operands=lambda b: b.flat,
        count=lambda j: j.n,
        encode=encode,
        decode=decode,
        describe=lambda spec: {"batch": spec.to_json()},
        elements=Elements(
            operands=lambda b, i: tuple(int(f[i]) for f in b.flat),
            batch=one_batch,
            describe=describe_element,
            scalars=lambda spec: tuple(spec.scalars),
            scalar_names=scalar_names or tuple(f"s{k}" for k in range(n_scalars)),
        ),
        output_names=output_names,
        build=dict(build or {}),
        budget_stop=True,
        unit="elements",
        from_witness=from_witness if plan is not None else None,
        regime_of=regimes if plan is not None else None,
        draw_codec=codec,
    )
