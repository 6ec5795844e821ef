"""Falsification tests of GraphSpec (its lowering and build-time checks), ONNX import and the IR executor.

Registered names and their ``params``:

* ``graphspec.lowering_meaning`` {lower=spec.ir.graphspec:lower, max_examples} — on Hypothesis-drawn
  GraphSpec models (MLP chains, conv chains, residual blocks, DAGs with sharing and multi-input nodes,
  self-attention DAGs with GQA heads and masks),
  drawn parameters and inputs (special values included): the lowered graph passes ``check_well_formed``,
  ``check_inferred_shapes`` and ``check_payload``, its output node has the model's output shape, and
  ``denote(lower(g, p), x) == spec(g)(p, x)`` bit for bit. ``lower`` names the lowering under test (the
  project's tests swap in planted ones).
* ``graphspec.shape_errors`` {max_examples} — a chain joined at a drawn position with a stage of a
  different input size is refused at build time, and the message names both shapes and that position.
* ``graphspec.onnx_meaning`` {max_examples} — drawn models exported to ONNX with ``onnx.helper`` (no
  downloads) and imported back: the import is well formed and shape-checked and its denotation equals
  ``spec(g)`` bit for bit; a drawn unsupported op in the model fails at its node index. Skipped (with the
  reason) where the ``onnx`` package is absent.
* ``graphspec.executor_agreement`` {max_examples, families} (devices: cuda) — every node of drawn lowered models
  run by :mod:`native.ir` on the device from the denotation's parent values agrees with the denotation
  by the op's rule in ``native.ir.AGREEMENT`` (bitwise for exact elementwise ops, data movement and
  folds; the elementwise contract's ulp bounds for exp/tanh/sigmoid; the GEMM contract's bound for
  linear/conv2d; the stated relative bounds for softmax and layer norm; the attention contract's
  spec.attention.forward_bound for attention), and the whole graph runs. ``families`` narrows the drawn model
  families (default: all).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hseed
from hypothesis import strategies as st

from falsification.engine import no_mined_constants
from falsification.registry import FalsifyContext, register_test
from obligations.core.plans import resolve
from obligations.core.results import Outcome, passed, skipped, violated
from spec.ir import graphspec as gs
from spec.ir.checks import check_inferred_shapes, check_payload, check_well_formed
from spec.ir.denote import denote, denote_all

__all__ = ["ModelCase", "graphspec_models", "model_arrays", "run_cases", "PROFILE_EXAMPLES"]

PROFILE_EXAMPLES: dict[str, int] = {"quick": 60, "full": 100, "deep": 300}
_SPECIALS = (0.0, -0.0, 1.0, -1.0, 0.5, 1e-40, -1e-45, 3e38, np.inf, -np.inf, np.nan)


@dataclass(frozen=True)
class ModelCase:
    """A drawn model: the GraphSpec graph, its parameters and an input (all float32)."""

    graph: gs.Graph
    params: tuple[np.ndarray, ...]
    x: np.ndarray
    family: str

    def __str__(self) -> str:
        return f"{self.family}: {self.graph.describe()} on input {list(self.x.shape)}"


def model_arrays(seed: int, shapes: list[tuple[int, ...]], specials: float) -> list[np.ndarray]:
    """float32 arrays of ``shapes`` from ``seed``: moderate normals, a ``specials`` fraction of special values."""
    rng = np.random.default_rng(seed)
    out = []
    for s in shapes:
        a = (rng.standard_normal(s) * np.exp2(rng.integers(-2, 2, s))).astype(np.float32)
        mask = rng.random(s) < specials
        a[mask] = np.asarray(_SPECIALS, dtype=np.float32)[rng.integers(0, len(_SPECIALS), s)][mask]
        out.append(a)
    return out


_ACTS = (gs.ReLU, gs.Tanh, gs.Sigmoid)


@st.composite
def _mlp(draw: Any) -> gs.Graph:
    batch = draw(st.sampled_from([(), (2,)]))
    d = draw(st.integers(1, 6))
    g: Any = gs.identity(batch + (d,))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["linear", "act", "layernorm", "softmax"]))
        if kind == "linear":
            d2 = draw(st.integers(1, 6))
            g, d = g >> gs.Linear(d, d2), d2
        elif kind == "act":
            g = g >> draw(st.sampled_from(_ACTS))()
        elif kind == "layernorm":
            g = g >> gs.LayerNorm()
        else:
            g = g >> gs.Softmax()
    return g


@st.composite
def _cnn(draw: Any) -> gs.Graph:
    c, h, w = draw(st.integers(1, 2)), draw(st.integers(3, 6)), draw(st.integers(3, 6))
    co = draw(st.integers(1, 3))
    k = draw(st.integers(1, 3))
    g: Any = gs.identity((c, h, w)) >> gs.Conv2d(
        c, co, k, stride=draw(st.integers(1, 2)), padding=draw(st.integers(0, 1))
    )
    if draw(st.booleans()):
        g = g >> gs.ReLU()
    ho, wo = g.out_shape[-2:]
    if min(ho, wo) >= 2 and draw(st.booleans()):
        g = g >> gs.Pool(2, stride=draw(st.integers(1, 2)), mode=draw(st.sampled_from(["max", "avg"])))
    g = g >> gs.Flatten()
    return g >> gs.Linear(g.out_shape[-1], draw(st.integers(1, 4)))


@st.composite
def _residual(draw: Any) -> gs.Graph:
    d0, d = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    body = gs.identity((d,)) >> gs.Linear(d, d) >> draw(st.sampled_from(_ACTS))()
    if draw(st.booleans()):
        body = body >> gs.Linear(d, d)
    g = gs.Linear(d0, d) >> gs.residual(body)
    if draw(st.booleans()):
        g = g >> gs.LayerNorm()
    return g >> gs.Linear(d, draw(st.integers(1, 4)))


@st.composite
def _dag(draw: Any) -> gs.Graph:
    d = draw(st.integers(1, 5))
    b = gs.DagBuilder((d,))
    vals = [b.input, b.apply(gs.Linear(d, d), b.input)]  # two values of one shape: multi-input nodes can differ
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["sub", "concat", "add", "mul", "linear", "act"]))
        v = vals[draw(st.integers(0, len(vals) - 1))]
        if kind in ("linear", "act"):
            vals.append(b.apply(gs.Linear(v.shape[-1], d) if kind == "linear" else draw(st.sampled_from(_ACTS))(), v))
            continue
        same = [u for u in vals if u.shape == v.shape and u != v] or [v]  # a distinct operand where there is one
        u = same[draw(st.integers(0, len(same) - 1))]
        vals.append(b.concat(v, u) if kind == "concat" else b.node(kind, v, u))
    out = vals[-1]
    last = b.apply(gs.Linear(out.shape[-1], draw(st.integers(1, 3))), out)
    return b.build(last).as_block("dag")


@st.composite
def _attention(draw: Any) -> gs.Graph:
    # Self-attention over x (B, H, L, D): q, k, v are Linear projections of x; a group of query heads per KV head is
    # made by concatenating projections along the head axis (GQA/MQA); masks and the scale are drawn.
    bsz, heads = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    seq, d = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    b = gs.DagBuilder((bsz, heads, seq, d))
    qs = [b.apply(gs.Linear(d, d), b.input) for _ in range(draw(st.integers(1, 2)))]
    q = qs[0] if len(qs) == 1 else b.concat(*qs, axis=1)
    k, v = (b.apply(gs.Linear(d, d), b.input) for _ in range(2))
    lens = draw(st.one_of(st.none(), st.lists(st.integers(0, seq), min_size=bsz, max_size=bsz)))
    scale = draw(st.sampled_from([None, None, 0.25, 2.0]))
    out = b.attention(q, k, v, causal=draw(st.booleans()), scale=scale, kv_lens=lens)
    if draw(st.booleans()):
        out = b.apply(gs.Linear(d, draw(st.integers(1, 3))), out)
    return b.build(out).as_block("attention")


_FAMILIES: dict[str, Callable[[], st.SearchStrategy[gs.Graph]]] = {
    "mlp": _mlp,
    "residual": _residual,
    "dag": _dag,
    "cnn": _cnn,
    "attention": _attention,
}


@st.composite
def graphspec_models(draw: Any, families: tuple[str, ...] = tuple(_FAMILIES), specials: bool = True) -> ModelCase:
    """A drawn GraphSpec model with parameters and an input (simplest family first, for shrinking)."""
    family = draw(st.sampled_from(families))
    g = draw(_FAMILIES[family]())
    seed = draw(st.integers(0, 2**32 - 1))
    frac = draw(st.sampled_from([0.0, 0.0, 0.1])) if specials else 0.0
    arrays = model_arrays(seed, [*g.param_shapes, g.in_shape], frac)
    return ModelCase(g, tuple(arrays[:-1]), arrays[-1], family)


def run_cases(ctx: FalsifyContext, strategy: Any, check: Callable[[Any], dict | None]) -> tuple[dict | None, int]:
    """Run ``check`` on seeded Hypothesis draws; (the shrunk failure or None, cases run)."""
    failure: dict[str, Any] = {}
    count = [0]
    n = int(ctx.params.get("max_examples", PROFILE_EXAMPLES.get(str(ctx.profile), 25)))

    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.generate, Phase.shrink),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        print_blob=False,
    )
    @hseed(ctx.seed)
    @given(strategy)
    def prop(case: Any) -> None:
        count[0] += 1
        bad = check(case)
        if bad is not None:
            failure.clear()
            failure.update(bad)
            raise AssertionError(bad.get("detail", "disagreement"))

    try:
        with no_mined_constants():  # the seed's draws, whatever modules this worker imported before
            prop()
    except AssertionError:
        return dict(failure), count[0]
    return None, count[0]


def _replay(ctx: FalsifyContext) -> str:
    item = ctx.item.get("id", "<item>")
    return (
        f"kc check {ctx.contract_path or '<contract>'} --only {item} --seed {ctx.seed} "
        f"--profile {ctx.profile} --device {ctx.device}"
    )


def _first_diff(got: np.ndarray, want: np.ndarray) -> dict | None:
    g, w = np.ascontiguousarray(got, np.float32).view(np.uint32), np.ascontiguousarray(want, np.float32).view(np.uint32)
    if g.shape != w.shape:
        return {"shapes": [list(g.shape), list(w.shape)]}
    bad = np.flatnonzero(g.reshape(-1) != w.reshape(-1))
    if bad.size == 0:
        return None
    i = int(bad[0])
    return {
        "first_bad_output": i,
        "lowered": f"0x{int(g.reshape(-1)[i]):08X}",
        "spec": f"0x{int(w.reshape(-1)[i]):08X}",
        "disagreeing_outputs": int(bad.size),
    }


def _structure_errors(low: gs.Lowered, g: gs.Graph) -> list[str]:
    errs = [str(e) for e in check_well_formed(low.graph)]
    errs += [str(e) for e in check_inferred_shapes(low.graph)] if not errs else []
    errs += [str(e) for e in check_payload(low.graph, low.payload)] if not errs else []
    if not errs and low.graph.nodes[low.output].out_shape != g.out_shape:
        errs.append(
            f"output node {low.output} declares {list(low.graph.nodes[low.output].out_shape)}, the model "
            f"produces {list(g.out_shape)}"
        )
    return errs


def _case_json(case: ModelCase, low: Any = None) -> dict[str, Any]:
    out = {"model": str(case), "input": case.x.reshape(-1).tolist()[:32]}
    if low is not None:
        out["graph"] = low.graph.text()
    return out


@register_test("graphspec.lowering_meaning")
def lowering_meaning(ctx: FalsifyContext) -> Outcome:
    """denote(lower(g)) == spec(g) bit for bit, and every lowered graph is well formed and shape-checked."""
    name = ctx.params.get("lower", "spec.ir.graphspec:lower")
    lower_fn = resolve(name)
    stats: dict[str, Any] = {"families": {}, "nodes": 0, "ops": set()}

    def check(case: ModelCase) -> dict | None:
        fam = stats["families"]
        fam[case.family] = fam.get(case.family, 0) + 1
        want = gs.spec(case.graph)(case.params, case.x)
        low = lower_fn(case.graph, case.params)
        stats["nodes"] += len(low.graph)
        stats["ops"].update(n.kind for n in low.graph.nodes)
        errs = _structure_errors(low, case.graph)
        if errs:
            return {**_case_json(case, low), "errors": errs[:3], "detail": f"lowered graph rejected: {errs[0]}"}
        got = denote(low.graph, low.payload, case.x, low.output)
        if not hasattr(got, "value"):
            return {**_case_json(case, low), "detail": f"denotation failed: {got}"}
        diff = _first_diff(got.value, want)
        return (
            None
            if diff is None
            else {**_case_json(case, low), **diff, "detail": f"denote(lower(g)) differs from spec(g): {diff}"}
        )

    t0 = time.perf_counter()
    bad, cases = run_cases(ctx, graphspec_models(), check)
    ev = {
        "lower": name,
        "families": stats["families"],
        "lowered_nodes": stats["nodes"],
        "ops": sorted(stats["ops"]),
        "seed": ctx.seed,
        "seconds": round(time.perf_counter() - t0, 3),
        "comparison": "bitwise (uint32), every output element",
        "denotation": "spec.ir.denote (binary32, env cuda)",
    }
    if bad:
        return violated({**bad, "replay": _replay(ctx)}, f"{name}: {bad['detail']}", **ev)
    return passed(cases=cases, **ev)


@st.composite
def _mismatches(draw: Any) -> tuple[gs.Graph, int, int, int]:
    """(a chain of Linear layers, its length, the wrong input size, the size it produces)."""
    dims = draw(st.lists(st.integers(1, 9), min_size=2, max_size=6))
    g: Any = gs.prim(gs.Linear(dims[0], dims[1]))
    for a, b in zip(dims[1:], dims[2:], strict=False):
        g = g >> draw(st.sampled_from(_ACTS))() >> gs.Linear(a, b) if draw(st.booleans()) else g >> gs.Linear(a, b)
    wrong = draw(st.integers(1, 9).filter(lambda v: v != dims[-1]))
    return g, len(g.stages()), wrong, dims[-1]


@register_test("graphspec.shape_errors")
def shape_errors(ctx: FalsifyContext) -> Outcome:
    """A shape mismatch is refused when the graph is built, naming both shapes and the position."""

    def check(case: tuple) -> dict | None:
        g, pos, wrong, have = case
        try:
            g >> gs.Linear(wrong, 2)
        except gs.GraphSpecShapeError as exc:
            msg = str(exc)
            need = [f"position {pos}", f"[..., {wrong}]", f"[{have}]"]
            missing = [s for s in need if s not in msg]
            return (
                None
                if not missing
                else {"message": msg, "missing": missing, "detail": f"message lacks {missing}: {msg}"}
            )
        return {"chain": g.describe(), "wrong": wrong, "detail": "mismatched chain was accepted"}

    bad, cases = run_cases(ctx, _mismatches(), check)
    ev = {"seed": ctx.seed, "claim": "GraphSpecShapeError names the position and both shapes"}
    if bad:
        return violated({**bad, "replay": _replay(ctx)}, bad["detail"], **ev)
    return passed(cases=cases, **ev)


@register_test("graphspec.onnx_meaning")
def onnx_meaning(ctx: FalsifyContext) -> Outcome:
    """Models exported to ONNX and imported back denote what spec(g) computes; unsupported ops fail at their node."""
    try:
        from falsification import graphspec_onnx as gx
    except ImportError as exc:
        return skipped(f"the onnx package is not installed ({exc})")
    from spec.ir.onnx import OnnxImportError, import_onnx

    stats: dict[str, Any] = {"nodes": 0, "refusals": 0, "ops": set()}

    def check(case: tuple) -> dict | None:
        mc, bad_at, bad_op = case
        model = gx.export(mc.graph, mc.params, unsupported_at=bad_at, unsupported_op=bad_op)
        stats["ops"].update(n.op_type for n in model.graph.node)
        if bad_at is not None:
            at = [n.name for n in model.graph.node].index("planted")
            try:
                import_onnx(model)
            except OnnxImportError as exc:
                stats["refusals"] += 1
                return (
                    None
                    if (exc.index, exc.op_type) == (at, bad_op)
                    else {"detail": f"refused at node {exc.index} ({exc.op_type}), planted {bad_op} at {at}: {exc}"}
                )
            return {**_case_json(mc), "detail": f"unsupported {bad_op} at node {at} was imported"}
        imp = import_onnx(model)
        stats["nodes"] += len(imp.graph)
        errs = _structure_errors(gs.Lowered(imp.graph, imp.payload, imp.output), mc.graph)
        if errs:
            return {**_case_json(mc), "errors": errs[:3], "detail": f"imported graph rejected: {errs[0]}"}
        got = denote(imp.graph, imp.payload, mc.x, imp.output)
        if not hasattr(got, "value"):
            return {**_case_json(mc), "detail": f"denotation failed: {got}"}
        diff = _first_diff(got.value, gs.spec(mc.graph)(mc.params, mc.x))
        return None if diff is None else {**_case_json(mc), **diff, "detail": f"import differs from spec: {diff}"}

    @st.composite
    def cases(draw: Any) -> tuple:
        mc = draw(graphspec_models(families=("mlp", "cnn", "residual")))
        bad_at = draw(st.one_of(st.none(), st.integers(0, 2)))
        return mc, bad_at, draw(st.sampled_from(["Celu", "Elu", "Selu"]))

    bad, n = run_cases(ctx, cases(), check)
    ev = {
        "seed": ctx.seed,
        "imported_nodes": stats["nodes"],
        "refusals_checked": stats["refusals"],
        "onnx_ops": sorted(stats["ops"]),
        "comparison": "bitwise against spec(g)",
    }
    if bad:
        return violated({**bad, "replay": _replay(ctx)}, bad["detail"], **ev)
    return passed(cases=n, **ev)


@register_test("graphspec.executor_agreement", devices=("cuda",))
def executor_agreement(ctx: FalsifyContext) -> Outcome:
    """The reference executor (native kernels, op by op) agrees with the denotation per node, by the op's rule."""
    from native import ir as nir
    from obligations.core.device import to_host

    stats: dict[str, Any] = {"nodes": 0, "by_rule": {}, "non_bitwise": 0}

    def check(case: ModelCase) -> dict | None:
        low = gs.lower(case.graph, case.params)
        table = denote_all(low.graph, low.payload, case.x)
        if not hasattr(table, "value"):
            return {**_case_json(case, low), "detail": f"denotation failed: {table}"}
        want = table.value
        for node in low.graph.nodes:
            if node.kind == "input":
                continue
            parents = [want[p] for p in node.parents]
            entry = low.payload.get(node.id)
            try:
                got = np.asarray(to_host(nir.run_node(node, parents, entry, ctx.device)), dtype=np.float32)
            except nir.ExecError as exc:
                return {**_case_json(case, low), "node": node.id, "detail": str(exc)}
            ok = nir.agree(node, parents, entry, got, want[node.id])
            rule = nir.AGREEMENT[node.kind].kind
            stats["nodes"] += 1
            stats["by_rule"][rule] = stats["by_rule"].get(rule, 0) + 1
            stats["non_bitwise"] += int((got.view(np.uint32) != want[node.id].view(np.uint32)).sum())
            if not ok.all():
                i = int(np.flatnonzero(~ok.reshape(-1))[0])
                return {
                    **_case_json(case, low),
                    "node": node.id,
                    "op": node.kind,
                    "rule": rule,
                    "element": i,
                    "executor": f"0x{int(got.reshape(-1).view(np.uint32)[i]):08X}",
                    "denotation": f"0x{int(want[node.id].reshape(-1).view(np.uint32)[i]):08X}",
                    "detail": f"node {node.id} ({node.kind}) element {i} breaks its {rule} rule",
                }
        nir.run_graph(low.graph, low.payload, case.x, ctx.device)
        return None

    families = tuple(ctx.params.get("families", tuple(_FAMILIES)))
    bad, cases = run_cases(ctx, graphspec_models(families=families, specials=False), check)
    ev = {
        "device": ctx.device,
        "families": list(families),
        "seed": ctx.seed,
        "nodes_checked": stats["nodes"],
        "by_rule": stats["by_rule"],
        "non_bitwise_elements": stats["non_bitwise"],
        "rules": {k: v.statement for k, v in sorted(nir.AGREEMENT.items())},
    }
    if bad:
        return violated({**bad, "replay": _replay(ctx)}, bad["detail"], **ev)
    return passed(cases=cases, **ev)
