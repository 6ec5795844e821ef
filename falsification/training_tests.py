"""Falsification tests of the training step (contracts/training-v1.yaml): spec.training run by native.training.

Every test trains the tasks of ``params.tasks`` ({name: size overrides}; default the MLP and the decoder block of
:data:`spec.training.TASKS`), each at ``budget.max_examples`` seeds (the run's seed, + 1, ...). Planted bugs come in
through params naming an object by ``module:attribute`` (the project's tests use them): ``rules`` (a VJP rule
table), ``parameterisers`` (a parameteriser table), ``optimizers`` (an optimizer table), ``hook`` (a function
given the executor, which may change its dispatch table) and ``compile`` (the program compiler).

* ``training.parameterise`` {} -- the parameterised forward graph (parameters as inputs) denotes the GraphSpec
  model's spec bit for bit, at the task's parameters and with every bias slot set to alternating +0/-0.
* ``training.gradients`` {} -- step 0's gradients: the fusion backend's on the run's device within
  (EXEC_SLACK + 2) err of the step graph's float64 meaning g64 and the binary32 denotation within 2 err of it (err:
  spec.ir.real's running bound), and g64, the device's and the denotation's gradients are the derivative: along a
  random direction v of each parameter tensor, <g, v> agrees with the Richardson central difference R of the loss's
  float64 meaning within T (its truncation and rounding) plus the sum of |v| times each one's bound.
* ``training.loss`` {ratio} -- ``task.steps`` steps on the device: every loss finite, the last <= ratio x the first.
* ``training.determinism`` {steps} -- two runs from the same start: every loss, the last gradients, parameters and
  optimizer state equal bit for bit.
* ``training.update`` {steps} -- each step's new parameters and state are bit for bit
  ``spec.training.update_reference`` (NumPy binary32, op by op) of that step's own parameters, state and gradients.
* ``training.mfu`` {size} (cuda, measure) -- the MLP step's GEMM FLOP rate over the raw cuBLAS throughput of the
  same GEMM shapes in the same run (per trial: raw_ms / step_ms), its interval against the floor (the tolerance).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from falsification import engine
from falsification.ir_vjp_tests import EXEC_SLACK
from falsification.registry import FalsifyContext, guarded, register_test
from native import training as nt
from obligations.core.device import to_host
from obligations.core.plans import resolve
from obligations.core.results import Outcome, error, skipped
from spec import training as st
from spec.ir import graphspec as gs
from spec.ir.denote import denote_all
from spec.ir.real import real_all

__all__ = [
    "PLANT_PARAMS",
    "task_cases",
    "step_of",
    "trainer_of",
    "gradient_failures",
    "same_bits",
    "drawn_like_task",
    "mfu_trainer",
]

PLANT_PARAMS = ("rules", "parameterisers", "optimizers", "hook", "compile")
DEFAULT_TASKS: dict[str, dict[str, Any]] = {"mlp": {}, "decoder": {}}
F64_PER_F32 = 2.0**-29  # a float64 evaluation's rounding, in units of the binary32 bound (2^-53 / 2^-24)
_CACHE: dict[tuple, Any] = {}  # tasks and step graphs, shared by the items a worker runs


def _key(d: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in d.items()))


def _plant(ctx: FalsifyContext, name: str) -> Any:
    got = ctx.params.get(name)
    return None if got is None else resolve(str(got))


def task_cases(ctx: FalsifyContext) -> Iterator[tuple[str, int, st.Task]]:
    """(task name, seed, task) for every task of the item at every seed of its budget."""
    tasks = dict(ctx.params.get("tasks") or DEFAULT_TASKS)
    for name, size in tasks.items():
        for i in range(max(1, ctx.budget.max_examples)):
            seed = ctx.seed + i
            key = ("task", name, seed, _key(size or {}))
            if key not in _CACHE:
                _CACHE[key] = st.task(name, seed=seed, **(size or {}))
            yield name, seed, _CACHE[key]


def step_of(ctx: FalsifyContext, tk: st.Task) -> st.StepGraph:
    """The task's step graph, with the item's planted tables if any."""
    plants = {k: ctx.params.get(k) for k in ("rules", "parameterisers", "optimizers")}
    key = ("step", id(tk), _key(plants))
    if key not in _CACHE:
        _CACHE[key] = st.step_graph(
            tk.model,
            tk.params,
            tk.opt,
            tk.loss,
            rules=_plant(ctx, "rules"),
            parameterisers=_plant(ctx, "parameterisers"),
            optimizers=_plant(ctx, "optimizers"),
        )
    return _CACHE[key]


def trainer_of(ctx: FalsifyContext, sg: st.StepGraph, tk: st.Task) -> nt.Trainer:
    """A fresh trainer of the task on the run's device (the item's planted compiler and hook if any)."""
    kw: dict[str, Any] = {}
    if ctx.params.get("compile"):
        kw["compile"] = _plant(ctx, "compile")
    if ctx.params.get("hook"):
        kw["hook"] = _plant(ctx, "hook")
    return nt.Trainer(sg, tk, ctx.device, **kw)


def same_bits(a: Any, b: Any) -> bool:
    """Equal shapes and equal binary32 bit patterns."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


def _first_diff(a: Any, b: Any) -> dict[str, Any]:
    a, b = np.asarray(a, np.float32).reshape(-1), np.asarray(b, np.float32).reshape(-1)
    k = int(np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))[0]) if a.shape == b.shape else 0
    return {"element": k, "got": float(a[k]) if a.size else None, "want": float(b[k]) if b.size else None}


def _run(ctx: FalsifyContext, check: Callable[[str, int, st.Task], str | None], **ev: Any) -> Outcome:
    """Run ``check`` on every task case: the first failure violates the item, else it passes."""
    t0 = time.perf_counter()
    cases = []
    for name, seed, tk in task_cases(ctx):
        why = check(name, seed, tk)
        cases.append(f"{name}@{seed}")
        if why is not None:
            return engine.outcome_violated(
                ctx, {"task": name, "task_seed": seed, "why": why}, f"{name} (seed {seed}): {why}", tasks=cases, **ev
            )
    return engine.outcome_passed(ctx, len(cases), tasks=cases, seconds=round(time.perf_counter() - t0, 3), **ev)


# -- the parameterised graph means the model -------------------------------------------------------------------


def _signed_zero_biases(model: Any, params: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    out = []
    for slot, p in zip(model.params, params, strict=True):
        if slot.name == "bias":
            p = np.where(np.arange(p.size).reshape(p.shape) % 2 == 0, np.float32(0.0), np.float32(-0.0))
        out.append(np.asarray(p, np.float32))
    return out


@register_test("training.parameterise")
@guarded()
def parameterise(ctx: FalsifyContext) -> Outcome:
    """The parameterised forward graph denotes the GraphSpec model's spec bit for bit."""
    rules = _plant(ctx, "parameterisers")

    def check(name: str, seed: int, tk: st.Task) -> str | None:
        for label, params in (
            ("task parameters", list(tk.params)),
            ("+-0 biases", _signed_zero_biases(tk.model, tk.params)),
        ):
            pz = st.parameterise(tk.model, params, rules)
            ins = {pz.x: tk.x, **{i: params[s.index] for s, i in zip(pz.slots, pz.inputs, strict=True)}}
            res = denote_all(pz.graph, pz.payload, ins)
            if not hasattr(res, "value"):
                return f"{label}: the parameterised graph does not denote: {res}"
            want = gs.spec(tk.model)(params, tk.x)
            if not same_bits(res.value[pz.output], want):
                return (
                    f"{label}: parameterised output differs from spec(model): {_first_diff(res.value[pz.output], want)}"
                )
        return None

    return _run(ctx, check)


# -- gradients at step 0 -------------------------------------------------------------------------------------------


def _slot(sg: st.StepGraph, j: int) -> str:
    s = sg.slots[j]
    return f"{s.name} {list(s.shape)} (slot {s.index})"


def _element_failure(label: str, got: np.ndarray, g64: np.ndarray, bound: np.ndarray) -> tuple[str | None, float]:
    """Why ``got`` is not within ``bound`` of the float64 meaning element by element (None), and the worst ratio."""
    gap = np.abs(np.asarray(got, np.float64) - g64)
    with np.errstate(divide="ignore", invalid="ignore"):
        worst = float(np.nanmax(np.where(bound > 0, gap / bound, 0.0), initial=0.0))
    if np.all(gap <= bound):
        return None, worst
    i = int(np.argmax(gap - bound))
    at = float(np.asarray(got).reshape(-1)[i])
    return (
        f"{label} element {i}: {at!r} is {gap.reshape(-1)[i]:.3g} from its float64 meaning, "
        f"beyond {bound.reshape(-1)[i]:.3g}",
        worst,
    )


def _central_difference(
    sg: st.StepGraph, tk: st.Task, ps: list[np.ndarray], j: int, v: np.ndarray
) -> tuple[float, float]:
    """(R, T): the Richardson central difference of the loss's float64 meaning along v in parameter j, and its
    truncation (|D(h) - D(h/2)|) plus the float64 rounding of the loss over h, h = 2^-12 max(1, max |p_j|)."""
    h = 2.0**-12 * max(1.0, float(np.max(np.abs(ps[j]), initial=0.0)))

    def loss_at(step: float) -> float:
        moved = [np.asarray(p, np.float64) for p in ps]
        moved[j] = moved[j] + step * v
        return st.loss_real(sg, tk.x, tk.target, moved)

    d = [(loss_at(s) - loss_at(-s)) / (2 * s) for s in (h, h / 2)]
    l0 = abs(loss_at(0.0))
    return (4 * d[1] - d[0]) / 3, abs(d[0] - d[1]) + 64 * 2.0**-53 * max(1.0, l0) / (h / 2)


def gradient_failures(ctx: FalsifyContext, tk: st.Task, sg: st.StepGraph, seed: int) -> tuple[str | None, dict]:
    """Why step 0's gradients fail the item on the run's device (None: they pass), and what was checked."""
    ps = st.trainable(sg, tk.params)
    ins = st.step_inputs(sg, tk.x, tk.target, ps, st.initial_state(sg, ps), 0)
    den = st.denote_step(sg, ins)
    vals, errs = real_all(sg.graph, sg.payload, ins, inexact=sg.rounded)
    tr = trainer_of(ctx, sg, tk)
    tr.step()
    ex = tr.values()
    stats = {"elements": 0, "directions": 0, "worst_device_over_bound": 0.0, "worst_direction_over_tol": 0.0}
    rng = np.random.default_rng(seed)
    for j, gid in enumerate(sg.grads):
        g64, err = vals[gid], errs[gid]
        for label, got, k in (("denotation", den.grads[j], 2.0), (ctx.device, ex.grads[j], EXEC_SLACK + 2.0)):
            why, worst = _element_failure(f"the {label} gradient of {_slot(sg, j)}", got, g64, k * err)
            if why is not None:
                return why, stats
            if label == ctx.device:
                stats["worst_device_over_bound"] = max(stats["worst_device_over_bound"], worst)
        stats["elements"] += int(g64.size)
        v = rng.standard_normal(ps[j].shape)
        r, trunc = _central_difference(sg, tk, ps, j, v)
        spread = float(np.sum(np.abs(v) * err))  # sum |v| err: the running bound carried into <g, v>
        tol64 = trunc + 2 * F64_PER_F32 * spread
        for label, g, tol in (
            ("float64 meaning", g64, tol64),
            ("denotation", den.grads[j], tol64 + 2 * spread),
            (ctx.device, ex.grads[j], tol64 + (EXEC_SLACK + 2) * spread),
        ):
            got = float(np.sum(np.asarray(g, np.float64) * v))
            stats["worst_direction_over_tol"] = max(stats["worst_direction_over_tol"], abs(got - r) / tol)
            if not abs(got - r) <= tol:
                return (
                    f"the {label} gradient of {_slot(sg, j)} is not the derivative: <g, v> = {got!r}, the central "
                    f"difference {r!r}, |gap| {abs(got - r):.3g} > {tol:.3g}",
                    stats,
                )
        stats["directions"] += 1
    return None, stats


@register_test("training.gradients")
@guarded()
def gradients(ctx: FalsifyContext) -> Outcome:
    """Step 0's gradients (device and denotation) within bounds of the float64 meaning and its derivative."""
    seen: dict[str, Any] = {}

    def check(name: str, seed: int, tk: st.Task) -> str | None:
        why, stats = gradient_failures(ctx, tk, step_of(ctx, tk), seed)
        seen[f"{name}@{seed}"] = stats
        return why

    return _run(ctx, check, checked=seen, exec_slack=EXEC_SLACK)


# -- training runs -------------------------------------------------------------------------------------------------


@register_test("training.loss")
@guarded()
def loss(ctx: FalsifyContext) -> Outcome:
    """``task.steps`` steps by the fusion backend: every loss finite and the last <= ratio x the first."""
    ratio = float(ctx.params.get("ratio", 0.1))
    curves: dict[str, Any] = {}

    def check(name: str, seed: int, tk: st.Task) -> str | None:
        sg = step_of(ctx, tk)
        losses, _ = nt.train(sg, tk, tk.steps, ctx.device, **_trainer_kw(ctx))
        ls = [float(v) for v in losses]
        curves[f"{name}@{seed}"] = {"first": ls[0], "last": ls[-1], "steps": len(ls), "every_5": ls[::5]}
        if not all(math.isfinite(v) for v in ls):
            return f"a loss is not finite: {ls}"
        if not ls[-1] <= ratio * ls[0]:
            return f"the loss went from {ls[0]:.6g} to {ls[-1]:.6g} in {len(ls)} steps, above {ratio:g} x the first"
        return None

    return _run(ctx, check, ratio=ratio, curves=curves)


def _trainer_kw(ctx: FalsifyContext) -> dict[str, Any]:
    return {k: _plant(ctx, k) for k in ("compile", "hook") if ctx.params.get(k)}


@register_test("training.determinism")
@guarded()
def determinism(ctx: FalsifyContext) -> Outcome:
    """Two runs from the same start give the same losses, gradients, parameters and state, bit for bit."""
    steps = int(ctx.params.get("steps", 8))

    def check(name: str, seed: int, tk: st.Task) -> str | None:
        sg = step_of(ctx, tk)
        runs = [nt.train(sg, tk, steps, ctx.device, **_trainer_kw(ctx)) for _ in range(2)]
        (la, ta), (lb, tb) = runs
        for t, (a, b) in enumerate(zip(la, lb, strict=True)):
            if not same_bits(a, b):
                return f"step {t}'s loss differs between two runs: {float(a)!r} vs {float(b)!r}"
        va, vb = ta.values(), tb.values()
        parts = [("gradient", va.grads, vb.grads), ("parameter", va.params, vb.params)]
        parts += [("state", tuple(x for s in va.state for x in s), tuple(x for s in vb.state for x in s))]
        for what, xs, ys in parts:
            for j, (a, b) in enumerate(zip(xs, ys, strict=True)):
                if not same_bits(a, b):
                    return f"after {steps} steps, {what} {j} differs between two runs: {_first_diff(a, b)}"
        return None

    return _run(ctx, check, steps=steps)


@register_test("training.update")
@guarded()
def update(ctx: FalsifyContext) -> Outcome:
    """Each step's new parameters and state are the NumPy binary32 update of its own parameters and gradients."""
    steps = int(ctx.params.get("steps", 3))

    def check(name: str, seed: int, tk: st.Task) -> str | None:
        sg = step_of(ctx, tk)
        tr = trainer_of(ctx, sg, tk)
        for t in range(steps):
            before = tr.host_params()
            state = [tuple(np.asarray(to_host(s), np.float32) for s in ss) for ss in tr.state]
            tr.step()
            v = tr.values()
            for j, p in enumerate(before):
                want_p, want_s = st.update_reference(sg.optimizer, p, v.grads[j], state[j], t)
                if not same_bits(v.params[j], want_p):
                    return (
                        f"step {t}: parameter {j} is not the update of its gradient: {_first_diff(v.params[j], want_p)}"
                    )
                for k, (a, b) in enumerate(zip(v.state[j], want_s, strict=True)):
                    if not same_bits(a, b):
                        return f"step {t}: state {k} of parameter {j} is not the update's: {_first_diff(a, b)}"
        return None

    return _run(ctx, check, steps=steps, optimizers={n: tk.opt.name for n, _, tk in task_cases(ctx)})


# -- MFU: the step's GEMM FLOP rate against its GEMMs alone ----------------------------------------------------------

# GEMMs of 2 x 4096 x 2048 x 4096 = 68.7 GFLOP each (K + 1 with the bias row), five a step: ~7 ms of fp32 cuBLAS on an
# H100, well above the step's Python dispatch (~55 program steps), which the GPU's queue hides.
MFU_SIZE = {"batch": 4096, "d_in": 2048, "hidden": 4096, "d_out": 2048}


def _raw_gemms(shapes: list[tuple[int, int, int, int]]) -> tuple[Callable[[], None], list[list[int]]]:
    """One call running cublasGemmEx (fp32, CUBLAS_COMPUTE_32F, default algorithm, the wrapper's handle) on every
    (m, k, n) of ``shapes`` on fresh contiguous operands, row-major as native.gemm calls it (operands swapped)."""
    import cupy
    from cupy.cuda import cublas

    from native import gemm as ng

    gc = ng.get_context("cuda")
    gc._ensure_bound()
    alpha, beta = np.array(1.0, np.float32), np.array(0.0, np.float32)
    rng = cupy.random.RandomState(0)
    calls, kept, dims = [], [], []
    for batch, m, k, n in shapes:
        if batch != 1:
            raise ValueError(f"training.mfu measures 2-d GEMMs; the step has a batch of {batch}")
        a = rng.standard_normal((m, k), dtype=cupy.float32)
        b = rng.standard_normal((k, n), dtype=cupy.float32)
        c = cupy.zeros((m, n), cupy.float32)
        kept += [a, b, c]
        t = ng.DATA_TYPES["float32"]
        calls.append((n, m, k, b.data.ptr, a.data.ptr, c.data.ptr, t))
        dims.append([m, k, n])
    handle, pa, pb, op_n, c32, algo = (
        gc.handle,
        alpha.ctypes.data,
        beta.ctypes.data,
        ng.OP_N,
        ng.COMPUTE_32F,
        ng.GEMM_DEFAULT,
    )

    def run() -> None:
        for n, m, k, bp, ap, cp, t in calls:
            cublas.gemmEx(handle, op_n, op_n, n, m, k, pa, bp, t, n, ap, t, k, pb, cp, t, n, c32, algo)

    run.kept = (kept, alpha, beta)  # type: ignore[attr-defined]  # the operands live as long as the call
    return run, dims


def drawn_like_task(rng: Any, abi: Any, batch: int, d_in: int, d_out: int) -> tuple[list[Any], Any, Any]:
    """(parameters, x, target) of the shapes ``spec.training``'s MLP task has, from the distributions it draws them
    from (weights N(0, 1/fan_in), biases N(0, 1/16), unit-init slots 1 + N(0, 1/16); x, target N(0, 1)), in float32
    by ``rng``: a NumPy Generator or a CuPy RandomState (both take ``standard_normal(shape, dtype=)``)."""

    def normal(shape: Any) -> Any:
        return rng.standard_normal(tuple(shape), dtype=np.float32)

    params = []
    for s in abi:
        a = normal(s.shape)  # scaled by Python floats: float32 stays float32 (NumPy and CuPy alike)
        if s.init == "ones":
            a = a * 0.25 + 1.0
        elif s.name == "weight":
            a = a * (1 / math.sqrt(s.shape[-1]))
        else:
            a = a * 0.25
        params.append(a)
    return params, normal((batch, d_in)), normal((batch, d_out))


def mfu_trainer(size: dict[str, int], seed: int, device: str = "cuda") -> tuple[st.StepGraph, nt.Trainer]:
    """The MFU's step graph (``spec.training``'s MLP task at ``size``: SGD, lr 1e-5, MSE) and its trainer on
    ``device``, the task's values drawn there (:func:`drawn_like_task`, seeded): the step's time does not depend
    on them, and the task's 34M float64 draws on the host took ~0.7 s of the quiet phase (H100, 2026-11-27)."""
    if device == "cuda":
        import cupy

        rng: Any = cupy.random.RandomState(seed)
    else:
        rng = np.random.default_rng(seed)
    model = st.mlp_model(size["batch"], size["d_in"], size["hidden"], size["d_out"])
    zeros = tuple(np.zeros(s.shape, np.float32) for s in model.params)  # the shapes the step graph is built for
    x, target = (np.zeros((size["batch"], size[k]), np.float32) for k in ("d_in", "d_out"))
    tk = st.Task("mlp", model, zeros, x, target, st.optimizer("sgd", lr=1e-5), 1)
    sg = st.step_graph(model, zeros, tk.opt, tk.loss)
    if sg.frozen:  # a frozen slot's values are in the program: zeros would be another step
        raise ValueError(f"the MFU's model has frozen slots {[s.name for s, _ in sg.frozen]}")
    tr = nt.Trainer(sg, tk, device)
    params, tr.x, tr.target = drawn_like_task(rng, model.params, size["batch"], size["d_in"], size["d_out"])
    tr.params = [params[s.index] for s in sg.slots]
    return sg, tr


@register_test("training.mfu")
@guarded()
def mfu(ctx: FalsifyContext) -> Outcome:
    """The MLP step's GEMM FLOP rate at least ``tolerance`` x the raw cuBLAS throughput of its own GEMM shapes."""
    if ctx.device != "cuda":
        return skipped(f"runs on cuda; this run is on {ctx.device}", **engine.evidence(ctx))
    import cupy

    from falsification import measure

    floor, source = measure.threshold(ctx)
    budget = measure.Budget.of(ctx.params)
    size = {**MFU_SIZE, **dict(ctx.params.get("size") or {})}
    t0 = time.perf_counter()
    sg, tr = mfu_trainer(size, ctx.seed)
    built_s = time.perf_counter() - t0
    shapes = nt.gemm_shapes(tr.program)
    raw, dims = _raw_gemms(shapes)
    flops = st.gemm_flops(sg.graph)
    if flops != sum(2 * m * k * n for _, m, k, n in shapes):
        return error(f"the step graph's GEMM FLOPs {flops} are not its program's cuBLAS steps' {shapes}")
    comp = measure.Comparison(
        ours=tr.step,
        peers={"raw_gemms": raw},
        configs={
            "raw_gemms": f"cupy.cuda.cublas.gemmEx on {len(dims)} shapes (fp32, CUBLAS_COMPUTE_32F, default algo)"
        },
        ours_name="step",
    )
    v = measure.compare(comp, floor, ">=", budget, measure.item_seed(ctx.seed, "mfu"), ratio="speed")
    med = v.extra["median_ms"]
    rates = {name: flops / (ms * 1e-3) / 1e12 for name, ms in med.items()}
    cupy.cuda.get_current_stream().synchronize()
    return measure.outcome(
        ctx,
        {"mfu_vs_gemms": v},
        f"step GEMM FLOP rate / raw cuBLAS throughput on the step's GEMM shapes >= {floor:g}",
        budget,
        threshold_source=source,
        gemm_flops_per_step=flops,
        gemm_shapes_mkn=dims,
        tflops_from_median=rates,
        program_steps=len(tr.program.steps),
        model=f"MLP {size['d_in']}-{size['hidden']}-{size['d_out']} (tanh), batch {size['batch']}, fp32, SGD, MSE",
        values="the MLP task's distributions drawn on the device (cupy RandomState(seed), float32)",
        build_seconds=round(built_s, 3),
    )
