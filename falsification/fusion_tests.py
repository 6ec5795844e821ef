"""Falsification tests of the fusion backend (contracts/fusion-v1.yaml), on the engine.

Registered names and their ``params`` (``compile``, ``variant``, ``planner``, ``key`` plant bugs; the tests use
them):

* ``fusion.partition_rules`` {compile, planner, templates} -- on Hypothesis graphs of
  :func:`falsification.ir_strategies.graph_cases`: every node bound or in exactly one step, steps in
  topological order, every value read across steps materialised, the chain rules (primary edge, single
  consumer, one shape, maximal), planner safety, and the step semantics of :mod:`spec.fusion` equal the
  denotation on every output. The native side is the number of rule violations; the reference is 0.
* ``fusion.small_graphs`` {compile, planner, variant} -- the same rules and fused == denotation bitwise on every
  graph of one input [2] and up to 3 more nodes over {neg, relu, reshape, slice, add} (exhaustive).
* ``fusion.equals_denotation`` {compile, planner, variant, templates} -- the program's outputs on the run's
  device equal the IR denotation bit for bit on graphs of exact elementwise, data-movement and fold ops.
* ``fusion.equals_unfused`` {templates} -- outputs equal the unfused reference executor's
  (``native.ir.run_graph``) bit for bit, on graphs with transcendentals, GEMMs, softmax, layer norm, conv/pool.
* ``fusion.cache_key`` {key} -- a kernel cache (recording compiler) returns, for every request, the artefact
  compiled from exactly that source, name, options and architecture, compiling each distinct key once.
* ``fusion.cache_shared`` {} (cuda) -- two executors of the example programs share one cache: NVRTC runs once
  per distinct kernel.
* ``fusion.golden`` {} -- the seed's MLP is exactly [cublas, cublas, fused(silu, mul), cublas] and runs
  bitwise as its unfused (one kernel per op) program; a 4-op chain is one kernel (N -> M counts in evidence).
* ``fusion.rmsnorm_bitwise`` {max_d} -- the pre-written RMSNorm step equals the denotation bit for bit.
* ``fusion.gqa_rewrite`` {grouping} -- GQA graphs (QK^T and scores x V, KV 1..3, G 1..3): the rewrite matches
  exactly (near misses with a second consumer are left alone), removes the expand, batches the GEMM per KV head,
  keeps the denotation bit for bit, and the program's device value is within the GEMM contract's bound.
* ``fusion.perf`` {which} (cuda, measure) -- timings after warm-up with CUDA events, ratios in one run.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from hypothesis import strategies as st

from falsification import engine
from falsification.agreement import Expected
from falsification.engine import Check
from falsification.ir_strategies import DEFAULT_TEMPLATES, GraphCase, f32_arrays, graph_cases
from falsification.registry import FalsifyContext, guarded, register_test
from native import fusion as nf
from native import fusion_codegen as cg
from native import fusion_kernels as fk
from obligations.core.plans import regime_of, resolve
from obligations.core.results import Outcome, error, skipped
from spec import fusion as sf
from spec.ir.denote import bits, denote_all
from spec.ir.graph import Graph, GraphBuilder, Payload

__all__ = [
    "EXACT_TEMPLATES",
    "UNFUSED_TEMPLATES",
    "rule_violations",
    "small_graphs",
    "planted_cases",
    "perf_chain",
    "perf_mlp",
    "perf_rmsnorm",
    "perf_conv",
    "conv_graph",
    "golden_failures",
    "gqa_graph",
    "gqa_flags",
    "FP16_TEMPLATES",
    "fp16_reference",
    "pattern_graph",
    "pattern_flags",
    "FUSED_REL_U",
    "fused_step_agrees",
    "step_agrees",
    "DECODER_SHAPES",
    "decoder_flags",
]

EXACT_TEMPLATES: tuple[str, ...] = (
    "relu",
    "add",
    "const",
    "reshape",
    "neg",
    "sub",
    "mul_elem",
    "div",
    "maxElem",
    "minElem",
    "sqrt",
    "inv",
    "abs",
    "flatten",
    "reduceSum",
    "reduceMean",
    "sum",
    "transpose",
    "concat",
    "slice",
    "broadcastTo",
)
UNFUSED_TEMPLATES: tuple[str, ...] = EXACT_TEMPLATES + (
    "tanh",
    "sigmoid",
    "exp",
    "gelu",
    "softmax",
    "linear",
    "matmul",
    "layernorm",
    "conv_pool",
)


def _compile_fn(ctx: FalsifyContext, conv: str = "direct") -> Callable[[Graph], nf.CUDAProgram]:
    """The item's compiler; conv2d on the direct kernel by default: the bitwise items compare values bit for bit,
    and the cuDNN step's agreement is a bound (FUSION-CUDNN-bound)."""
    fn = resolve(str(ctx.params.get("compile", "native.fusion:compile_subgraph")))
    kw = {
        "variant": str(ctx.params.get("variant", "default")),
        "planner": str(ctx.params.get("planner", "liveness")),
        "conv": str(ctx.params.get("conv", conv)),
    }
    return lambda g: fn(g, **kw)


def _inputs_of(case: GraphCase) -> dict[int, np.ndarray]:
    return dict(zip(case.graph.input_ids(), case.inputs, strict=True))


def rule_violations(prog: nf.CUDAProgram, payload: Payload, inputs: dict[int, np.ndarray]) -> list[str]:
    """Every partition, chain, planner and step-semantics rule the program breaks (empty: none)."""
    part = prog.partition.part_of()
    out = sf.program_violations(prog.spec(), cg.fusable, lambda a, b: part[a] == part[b])
    out += nf.planner_violations(prog.requests, prog.buffers)
    if out:
        return out
    want = denote_all(prog.graph, payload, inputs)
    got = sf.denote_steps(prog.graph, payload, inputs, prog.steps, prog.bound)
    for o in prog.outputs:
        if not sf.same_bits(got[o], want.value[o]):
            out.append(f"the step semantics of output {o} differ from its denotation")
    return out


def _flat_bits(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(
        [bits(np.ascontiguousarray(a, np.float32)).reshape(-1) for a in arrays] or [np.zeros(0, np.uint32)]
    )


def _templates(ctx: FalsifyContext, default: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(ctx.params.get("templates", default))


def _graph_strategy(ctx: FalsifyContext, default: tuple[str, ...], rank1: bool = False) -> st.SearchStrategy[GraphCase]:
    s = graph_cases(max_nodes=int(ctx.params.get("max_nodes", 6)), templates=_templates(ctx, default))
    # rank1: no rank-0 values (native.ir.run_graph's elementwise ops return shape (1,) for a scalar)
    return s.filter(lambda c: all(n.out_shape for n in c.graph.nodes)) if rank1 else s


def _describe(compile_fn: Callable[[Graph], nf.CUDAProgram]) -> Callable[[GraphCase], dict[str, Any]]:
    def describe(case: GraphCase) -> dict[str, Any]:
        try:
            prog = compile_fn(case.graph)
            return {
                "graph": str(case),
                "program": str(prog),
                "violations": rule_violations(prog, case.payload, _inputs_of(case))[:5],
            }
        except Exception as exc:  # the description of a failing case must not raise
            return {"graph": str(case), "compile_error": f"{type(exc).__name__}: {exc}"}

    return describe


# -- explicit cases: the planted bugs' witnesses ------------------------------------------------------------


def _case(build: Callable[[GraphBuilder], None], *inputs: list[float]) -> GraphCase:
    b = GraphBuilder()
    build(b)
    g, p = b.build()
    return GraphCase(g, p, tuple(np.array(v, np.float32) for v in inputs))


def _reorder(b: GraphBuilder) -> None:  # neg(relu(x)): relu and neg do not commute
    x = b.add("input", (), (2,))
    b.add("neg", (b.add("relu", (x,), (2,)),), (2,))


def _rounding(b: GraphBuilder) -> None:  # (x + 1e8) - 1e8 is 0 in binary32, 1 with the rounding dropped
    x = b.add("input", (), (2,))
    c = b.add("const", (), (2,), params={"value": [1e8, 1e8]})
    b.add("sub", (b.add("add", (x, c), (2,)), c), (2,))


def _live(b: GraphBuilder) -> None:  # a = neg(x) is read at steps 1 and 6; chain relu(.) is written at step 3
    x = b.add("input", (), (4,))
    a = b.add("neg", (x,), (4,))

    def barrier(v: int) -> int:  # an exact fold and a broadcast view: two non-fused steps
        return b.add("broadcastTo", (b.add("reduceSum", (v,), (1,), axis=0, keepdim=True),), (4,), shape=(4,))

    t = barrier(b.add("relu", (barrier(a),), (4,)))
    b.add("add", (t, a), (4,))


def _multi(b: GraphBuilder) -> None:  # e = exp(x) feeds relu (primary) and the final add: a barrier
    x = b.add("input", (), (2,))
    e = b.add("exp", (x,), (2,))
    b.add("add", (b.add("relu", (e,), (2,)), e), (2,))


def planted_cases() -> tuple[GraphCase, ...]:
    """Witness graphs for the planted reorder, dropped rounding, live-buffer reuse and multi-consumer bugs."""
    return (
        _case(_reorder, [-1.0, 2.0]),
        _case(_rounding, [1.0, 3.0]),
        _case(_live, [0.5, -1.0, 2.0, 0.25]),
        _case(_multi, [0.5, -1.0]),
    )


# -- rules on generated graphs -----------------------------------------------------------------------------


def _rules_check(
    ctx: FalsifyContext, name: str, cases: Any, explicit: tuple[GraphCase, ...], with_values: bool
) -> Check:
    # the rules alone (no values): conv2d planned as cuDNN steps, whatever this machine has
    compile_fn = _compile_fn(ctx, "direct" if with_values else "cudnn")

    def native(case: GraphCase) -> list:
        prog = compile_fn(case.graph)
        ins = _inputs_of(case)
        n_bad = np.array([len(rule_violations(prog, case.payload, ins))], np.uint32)
        if not with_values:
            return [n_bad]
        res = nf.CUDAExecutor(prog, case.payload, ctx.device).run(ins)
        return [np.concatenate([n_bad, _flat_bits([_host(res[o]) for o in prog.outputs])])]

    def reference(case: GraphCase) -> Expected:
        zero = np.zeros(1, np.uint32)
        if not with_values:
            return Expected(bits=zero)
        vals = denote_all(case.graph, case.payload, _inputs_of(case)).value
        return Expected(bits=np.concatenate([zero, _flat_bits([vals[o] for o in nf.program_outputs(case.graph)])]))

    return Check(
        name=name,
        inputs=lambda c: c,
        native=native,
        reference=reference,
        agreement=engine.item_agreement(ctx, "bitwise", nan_policy="exact"),
        cases=cases,
        explicit=explicit,
        describe=_describe(compile_fn),
        output_names=("violations|outputs",),
        build={
            "compile": str(ctx.params.get("compile", "native.fusion:compile_subgraph")),
            "variant": str(ctx.params.get("variant", "default")),
            "planner": str(ctx.params.get("planner", "liveness")),
        },
    )


def _host(a: Any) -> np.ndarray:
    from obligations.core.device import to_host

    return np.ascontiguousarray(to_host(a), np.float32)


@register_test("fusion.partition_rules")
@guarded()
def partition_rules(ctx: FalsifyContext) -> Outcome:
    """Exact cover, topological order, chain rules, planner safety and step semantics on generated graphs."""
    check = _rules_check(ctx, "partition rules", _graph_strategy(ctx, DEFAULT_TEMPLATES), planted_cases(), False)
    return engine.run(ctx, check)


_SMALL_OPS: tuple[tuple[str, int, dict[str, Any]], ...] = (
    ("neg", 1, {}),
    ("relu", 1, {}),
    ("reshape", 1, {"shape": (2,)}),
    ("slice", 1, {"axis": -1, "start": 0, "stop": 2, "step": 1}),
    ("add", 2, {}),
)


def small_graphs(extra: int = 3) -> Iterator[GraphCase]:
    """Every graph of one input [2] followed by 1..extra nodes over _SMALL_OPS with earlier parents."""
    x = np.array([1.5, -0.75], np.float32)
    for k in range(1, extra + 1):
        per_node = [
            [(op, ps, a) for op, arity, a in _SMALL_OPS for ps in itertools.product(range(i + 1), repeat=arity)]
            for i in range(k)
        ]
        for combo in itertools.product(*per_node):
            b = GraphBuilder()
            b.add("input", (), (2,))
            for op, ps, a in combo:
                b.add(op, ps, (2,), **a)
            g, p = b.build()
            yield GraphCase(g, p, (x,))


@register_test("fusion.small_graphs")
@guarded()
def small_graphs_exhaustive(ctx: FalsifyContext) -> Outcome:
    """Exhaustive over small graphs: every rule holds and the fused program equals the denotation bitwise."""
    cases = tuple(small_graphs(int(ctx.params.get("extra_nodes", 3))))
    check = _rules_check(ctx, "small graphs (exhaustive)", None, cases, True)
    return engine.run(ctx, check, lambda: {"graphs": len(cases), "ops": [o for o, _, _ in _SMALL_OPS]})


# -- agreement of values -----------------------------------------------------------------------------------


def _values_check(
    ctx: FalsifyContext,
    name: str,
    reference_of: Callable[[GraphCase, tuple[int, ...]], list],
    templates: tuple[str, ...],
    explicit: tuple[GraphCase, ...],
    what: str,
    rank1: bool = False,
) -> Check:
    compile_fn = _compile_fn(ctx)

    def native(case: GraphCase) -> list:
        prog = compile_fn(case.graph)
        res = nf.CUDAExecutor(prog, case.payload, ctx.device).run(_inputs_of(case))
        return [_flat_bits([_host(res[o]) for o in prog.outputs])]

    def reference(case: GraphCase) -> Expected:
        return Expected(bits=_flat_bits(reference_of(case, nf.program_outputs(case.graph))))

    return Check(
        name=name,
        inputs=lambda c: c,
        native=native,
        reference=reference,
        agreement=engine.item_agreement(ctx, "bitwise", nan_policy="exact"),
        cases=_graph_strategy(ctx, templates, rank1),
        explicit=explicit,
        describe=_describe(compile_fn),
        output_names=("outputs",),
        build={
            "reference": what,
            "templates": list(templates),
            "variant": str(ctx.params.get("variant", "default")),
            "planner": str(ctx.params.get("planner", "liveness")),
        },
    )


@register_test("fusion.equals_denotation")
@guarded()
def equals_denotation(ctx: FalsifyContext) -> Outcome:
    """Fused program outputs == IR denotation, bit for bit, on exact elementwise / data-movement / fold graphs."""

    def ref(case: GraphCase, outs: tuple[int, ...]) -> list:
        vals = denote_all(case.graph, case.payload, _inputs_of(case)).value
        return [vals[o] for o in outs]

    check = _values_check(
        ctx,
        "fused vs denotation",
        ref,
        _templates(ctx, EXACT_TEMPLATES),
        planted_cases()[:3],
        "spec.ir.denote.denote_all",
    )
    return engine.run(ctx, check)


@register_test("fusion.equals_unfused")
@guarded()
def equals_unfused(ctx: FalsifyContext) -> Outcome:
    """Fused program outputs == the unfused reference executor's (native.ir.run_graph), bit for bit."""
    from native.ir import run_graph

    def ref(case: GraphCase, outs: tuple[int, ...]) -> list:
        ex = run_graph(case.graph, case.payload, list(case.inputs), ctx.device)
        return [ex.host(o) for o in outs]

    check = _values_check(
        ctx,
        "fused vs unfused executor",
        ref,
        _templates(ctx, UNFUSED_TEMPLATES),
        (planted_cases()[3],),
        "native.ir.run_graph (one kernel per op)",
        rank1=True,
    )
    return engine.run(ctx, check)


# -- pre-written RMSNorm ------------------------------------------------------------------------------------


@st.composite
def _rmsnorm_cases(draw: Any, max_d: int) -> GraphCase:
    rows, d = draw(st.integers(1, 3)), draw(st.integers(1, max_d))
    scale = np.float32(draw(st.sampled_from((1.0, 1e-20, 1e18, 3e-39))))
    with np.errstate(all="ignore"):
        x = draw(f32_arrays((rows, d), specials=draw(st.booleans()))) * scale
    w = draw(f32_arrays((d,), specials=False))
    eps = draw(st.sampled_from((1e-6, 1e-5, 0.0, 1e-30)))
    b = GraphBuilder()
    b.add("rmsnorm", (b.add("input", (), (rows, d)),), (rows, d), params={"weight": w}, eps=eps)
    g, p = b.build()
    return GraphCase(g, p, (x.astype(np.float32),))


@register_test("fusion.rmsnorm_bitwise")
@guarded()
def rmsnorm_bitwise(ctx: FalsifyContext) -> Outcome:
    """The pre-written RMSNorm step equals the IR denotation of rmsnorm bit for bit (rows of 1..max_d)."""

    def ref(case: GraphCase, outs: tuple[int, ...]) -> list:
        vals = denote_all(case.graph, case.payload, _inputs_of(case)).value
        return [vals[o] for o in outs]

    check = _values_check(ctx, "fused rmsnorm vs denotation", ref, (), (), "spec.ir.denote rmsnorm")
    check = dataclasses.replace(check, cases=_rmsnorm_cases(int(ctx.params.get("max_d", 600))))
    return engine.run(ctx, check)


# -- the pre-written and generated kernels at their plans' regime and boundary witnesses ---------------------


@dataclasses.dataclass(frozen=True)
class _KernelWitness:
    """One kernel's witness check: its plan, the case a witness launches, inputs, native call and reference."""

    plan: Callable[..., Any]
    case: Callable[[Any], tuple]  # witness values -> the case (plan values, in the plan's parameter order)
    names: tuple[str, ...]  # the case's fields (its plan values)
    run: Callable[[FalsifyContext, tuple], tuple]  # ctx, case -> (native output, reference output)


def _prewritten(kind: str) -> Any:
    from native.nvrtc import compile_function

    return compile_function(*fk.SOURCES[kind], fk.ROUTE)


def _chain_graph(n: int) -> tuple[Graph, Payload]:
    b = GraphBuilder()
    x = b.add("input", (), (n,))
    b.add("neg", (b.add("relu", (b.add("add", (b.add("mul_elem", (x, x), (n,)), x), (n,)),), (n,)),), (n,))
    return b.build()


def _values(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Moderate values of both signs with a few specials (a NaN, +-0, an infinity) where the shape has room."""
    v = np.random.default_rng(seed).uniform(-3, 3, shape).astype(np.float32).reshape(-1)
    v[: min(v.size, 4)] = np.array([np.nan, -0.0, np.inf, 0.0], np.float32)[: min(v.size, 4)]
    return v.reshape(shape)


def _run_chain(ctx: FalsifyContext, c: tuple) -> tuple:
    n, block, max_grid = c
    x = _values(n, (n,))
    g, p = _chain_graph(max(n, 1))
    out = g.nodes[-1].id
    want = denote_all(g, p, {0: np.resize(x, max(n, 1))}).value[out][:n]
    kernel = next(s.kernel for s in nf.compile_subgraph(g).steps if s.kind == "fused")
    if ctx.device == "host":
        return cg.run_host(kernel, [x]), want
    import cupy

    from native.elementwise import launch_plan
    from native.nvrtc import compile_function

    fn = compile_function(kernel.source, kernel.name, cg.ROUTE)
    plan = launch_plan(n, block, max_grid, index_bits=kernel.index_bits)
    y = cupy.full(n, np.nan, dtype=cupy.float32)  # written wholly by the kernel
    fn((int(plan["grid"]),), (int(block),), (cupy.asarray(x), y, np.int64(n)))
    return _host(y), want


def _special_graph(kind: str, shape: tuple[int, ...], **kw: Any) -> tuple[Graph, Payload]:
    b = GraphBuilder()
    x = b.add("input", (), shape)
    if kind == "rope":
        b.add("rope", (x,), shape, base=10000.0)
    else:
        table = kw["table"]
        b.add("embedding", (x,), shape + (table.shape[1],), params={"table": table}, dim=table.shape[1])
    return b.build()


def _run_rope(ctx: FalsifyContext, c: tuple) -> tuple:
    n, block, max_grid = c
    x = _values(n + 1, (n, 2))  # pairs = T * D / 2 = n
    if n == 0:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    g, p = _special_graph("rope", (n, 2))
    want = denote_all(g, p, {0: x}).value[g.nodes[-1].id]
    if ctx.device == "host":
        return nf.run_program(g, p, {0: x}, "host")[g.nodes[-1].id], want
    import cupy

    from spec.ir.denote import floats, rope_tables

    cs, sn = (cupy.asarray(floats(t)) for t in rope_tables(n, 2, 10000.0))  # the tables are binary32 bits
    y = fk.rope_cuda(_prewritten("rope"), cupy.asarray(x), cs, sn, block=block, max_grid=max_grid)
    return _host(y), want


def _run_embedding(ctx: FalsifyContext, c: tuple) -> tuple:
    vocab, index = c
    ids = np.array([0.0, float(index), float(max(vocab - 1, 0))], np.float32)  # the witness's id between two others
    table = np.arange(max(vocab, 0) * 3, dtype=np.float32).reshape(-1, 3) - 1.5
    g, p = _special_graph("embedding", ids.shape, table=table)
    out = g.nodes[-1].id
    if ctx.device == "host":  # the executor's host path: the denotation, which raises on a bad index
        got = nf.run_program(g, p, {0: ids}, "host")[out]
    else:
        import cupy

        y = fk.embedding_cuda(_prewritten("embedding"), cupy.asarray(ids), cupy.asarray(table))
        got = _host(y)
    return got, denote_all(g, p, {0: ids}).value[out]


def _run_softmax(ctx: FalsifyContext, c: tuple) -> tuple:
    from native.ir import run_node

    rows, d, block, _ = c
    x = _values(rows * 7 + d, (rows, d))
    if rows >= 3:  # rows 0..2: several +-0 maxima, several NaNs, repeated infinities (reductions' tie pools)
        from falsification.reductions_tests import tie_floats

        x[:3] = np.stack([tie_floats(r, d) for r in range(3)]).view(np.float32)
    mask = np.where(np.arange(d)[None, :] > np.arange(rows)[:, None] % max(d, 1), -np.inf, 0.0).astype(np.float32)
    g, p = pattern_graph("masked_softmax", rows, d, 0)
    add, soft = (nd for nd in g.nodes if nd.kind in ("add", "softmax"))
    xs, ms = _dev(ctx, x), _dev(ctx, mask)
    want = run_node(soft, [run_node(add, [xs, ms], None, ctx.device)], None, ctx.device)  # the unfused program
    if ctx.device == "host":
        return _host(want), _host(want)
    return _host(fk.masked_softmax_cuda(_prewritten("masked_softmax"), xs, ms, block=block)), _host(want)


def _run_rmsnorm(rows_kernel: bool) -> Callable[[FalsifyContext, tuple], tuple]:
    def run(ctx: FalsifyContext, c: tuple) -> tuple:
        rows, d = c[0], c[1]
        x = _values(rows * 5 + d, (rows, d))
        w = np.random.default_rng(d).uniform(-2, 2, d).astype(np.float32)
        # The kernels' host model (their order and guard; bitwise the denotation by FUSION-RMSNORM-bitwise): the
        # softfloat denotation of a 12268-float row takes seconds, too long for every host run.
        want = fk.rmsnorm_host(x, w, 1e-6)
        if ctx.device == "host":
            return want, want
        fn = (_prewritten("rmsnorm"), _prewritten("rmsnorm_rows")) if rows_kernel else _prewritten("rmsnorm")
        got = fk.rmsnorm_cuda(fn, _dev(ctx, x), _dev(ctx, w), 1e-6, max_grid=None if rows_kernel else c[3])
        return _host(got), want

    return run


def _dev(ctx: FalsifyContext, a: np.ndarray) -> Any:
    if ctx.device == "host":
        return a
    import cupy

    return cupy.asarray(a)


_ELEMENTWISE_PLAN = ("n", "block", "max_grid")


def _grid_case(v: Any) -> tuple:
    return (v["n"], v["block"], v["max_grid"])


KERNEL_WITNESSES: dict[str, _KernelWitness] = {
    "chain": _KernelWitness(cg.fused_plan, _grid_case, _ELEMENTWISE_PLAN, _run_chain),
    "rope": _KernelWitness(cg.fused_plan, _grid_case, _ELEMENTWISE_PLAN, _run_rope),
    "embedding": _KernelWitness(
        fk.embedding_plan, lambda v: (v["vocab"], v["index"]), ("vocab", "index"), _run_embedding
    ),
    "masked_softmax": _KernelWitness(
        fk.row_plan,
        lambda v: (v["rows"], v["d"], v["block"], v["max_grid"]),
        ("rows", "d", "block", "max_grid"),
        _run_softmax,
    ),
    "rmsnorm": _KernelWitness(
        fk.rmsnorm_plan,
        lambda v: (v["rows"], v["d"], fk.RMSNORM_BLOCK, v["max_grid"]),
        ("rows", "d", "block", "max_grid"),
        _run_rmsnorm(False),
    ),
    "rmsnorm_rows": _KernelWitness(
        fk.rmsnorm_rows_plan, lambda v: (v["rows"], v["d"]), ("rows", "d"), _run_rmsnorm(True)
    ),
}


@register_test("fusion.kernel_witnesses")
@guarded()
def kernel_witnesses(ctx: FalsifyContext) -> Outcome:
    """One fusion kernel ({kernel}: chain, rope, embedding, masked_softmax, rmsnorm, rmsnorm_rows) at each regime and
    boundary witness of its plan (the item's ``witnesses:``), launched on CUDA at the witness's geometry; on the
    host the executor's host path (or the kernel's host model) takes the same cases. Bitwise against the IR
    denotation (masked softmax: the unfused program on the same device; RMSNorm: the kernels' host model, bitwise
    the denotation by FUSION-RMSNORM-bitwise); a rejected boundary must raise ValueError."""
    kw = KERNEL_WITNESSES[str(ctx.params.get("kernel", "chain"))]
    results: dict[tuple, tuple] = {}

    def inputs(case: tuple) -> tuple:
        results[case] = kw.run(ctx, case)
        return case

    def native(case: tuple) -> np.ndarray:
        got = np.ascontiguousarray(results[case][0], np.float32).reshape(-1)
        return _canon_bits(got)

    def reference(case: tuple) -> Expected:
        return Expected(bits=_canon_bits(np.ascontiguousarray(results.pop(case)[1], np.float32).reshape(-1)))

    check = Check(
        name=f"{ctx.params.get('kernel', 'chain')} at its plan's witnesses@{ctx.device}",
        inputs=inputs,
        native=native,
        reference=reference,
        agreement=engine.item_agreement(ctx, "bitwise"),
        from_witness=kw.case,
        # masked softmax: rows of several equal or NaN candidates for the row maximum (one-pass and block-strided)
        explicit=((3, 5, 32, 65536), (3, 40, 32, 65536)) if ctx.params.get("kernel") == "masked_softmax" else (),
        regime_of=lambda case: regime_of(kw.plan, dict(zip(kw.names, case, strict=True))),
        refuses=(ValueError,),
        describe=lambda case: dict(zip(kw.names, case, strict=True)),
        build={"kernel": ctx.params.get("kernel", "chain")},
    )
    return engine.run(ctx, check)


def _canon_bits(a: np.ndarray) -> np.ndarray:
    """float32 bits with every NaN written 0x7FFFFFFF (the cuda env's NaN)."""
    bits = a.view(np.uint32).copy()
    bits[np.isnan(a)] = 0x7FFFFFFF
    return bits


# -- GQA rewrite ------------------------------------------------------------------------------------------


def gqa_graph(variant: str, kv: int, g: int, tq: int, s: int, d: int, near_miss: bool = False) -> tuple[Graph, Payload]:
    """Q/scores and K/V inputs, K/V expanded to H = kv g heads, then the matmul (QK^T or scores x V).

    ``near_miss``: the expanded K/V is also a graph output (a second consumer), so nothing may be rewritten."""
    b = GraphBuilder()
    h = kv * g
    q = b.add("input", (), (1, h, tq, d if variant == "qk" else s))
    k = b.add("input", (), (1, kv, s, d))
    u = b.add("reshape", (k,), (1, kv, 1, s, d), shape=(1, kv, 1, s, d))
    e = b.add("expand", (u,), (1, kv, g, s, d), shape=(1, kv, g, s, d))
    r = b.add("reshape", (e,), (1, h, s, d), shape=(1, h, s, d))
    if variant == "qk":
        r = b.add("transpose", (r,), (1, h, d, s), dim0=-2, dim1=-1)
    out = b.add("matmul", (q, r), (1, h, tq, s if variant == "qk" else d))
    if near_miss:
        b.add("add", (b.add("neg", (e,), (1, kv, g, s, d)),) * 2, (1, kv, g, s, d))
        b.add("relu", (out,), (1, h, tq, s if variant == "qk" else d))
    return b.build()


@st.composite
def _gqa_cases(draw: Any) -> tuple:
    shape = (
        draw(st.sampled_from(("qk", "sv"))),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 2)),
        draw(st.integers(1, 4)),
        draw(st.integers(1, 4)),
    )
    g, _ = gqa_graph(*shape)
    ins = tuple(
        np.array(
            draw(
                st.lists(
                    st.floats(-8, 8, width=32),
                    min_size=int(np.prod(g[i].out_shape)),
                    max_size=int(np.prod(g[i].out_shape)),
                )
            ),
            np.float32,
        ).reshape(g[i].out_shape)
        for i in g.input_ids()
    )  # bounded: the GEMM bound is stated for finite products
    return shape, draw(st.booleans()) and shape[1] * shape[2] > 1, ins


def gqa_flags(case: tuple, device: str, grouping: str = "div") -> np.ndarray:
    """[rewritten as expected, expand gone, GEMM batch == KV heads, denotation bitwise, device within GEMM bound]."""
    from native.fusion_gqa import rewrite_gqa
    from native.ir import agree

    shape, near, ins = case
    g, p = gqa_graph(*shape, near_miss=near)
    outs = program_outputs_of(g)
    rw, matches = rewrite_gqa(g, p, outs, grouping)
    want_matches = 0 if near else 1
    mm = [n for n in rw.graph.nodes if n.kind == "matmul"]
    expand_gone = near or not any(n.kind == "expand" for n in rw.graph.nodes)
    batch_ok = near or (len(mm) == 1 and mm[0].out_shape[:-2] == (shape[1],))
    den = denote_all(g, p, list(ins)).value
    den2 = denote_all(rw.graph, rw.payload, list(ins)).value
    bitwise = all(sf.same_bits(den[o], den2[rw.mapping[o]]) for o in outs)
    m = next(n for n in g.nodes if n.kind == "matmul")
    res = nf.run_program(
        rw.graph, rw.payload, list(ins), device, dict.fromkeys([rw.mapping[m.id]] + [rw.mapping[o] for o in outs])
    )
    within = bool(np.all(agree(m, [den[q] for q in m.parents], None, res[rw.mapping[m.id]], den[m.id])))
    return np.array([len(matches) == want_matches, expand_gone, batch_ok, bitwise, within], np.uint32)


def program_outputs_of(g: Graph) -> tuple[int, ...]:
    """The graph's sinks (what the rewrite must keep)."""
    return nf.program_outputs(g)


@register_test("fusion.gqa_rewrite")
@guarded()
def gqa_rewrite(ctx: FalsifyContext) -> Outcome:
    """The GQA rewrite: matched exactly (near misses untouched), no expand, batch KV, denotation kept bitwise."""
    grouping = str(ctx.params.get("grouping", "div"))
    explicit = (
        (("qk", 2, 3, 1, 4, 5), False, None),
        (("sv", 2, 2, 2, 3, 2), False, None),
        (("qk", 2, 2, 1, 3, 2), True, None),
    )
    rng = np.random.default_rng(0)
    explicit = tuple(
        (sh, near, tuple(rng.standard_normal(gqa_graph(*sh)[0][i].out_shape).astype(np.float32) for i in (0, 1)))
        for sh, near, _ in explicit
    )
    check = Check(
        name="GQA rewrite",
        inputs=lambda c: c,
        native=lambda c: [gqa_flags(c, ctx.device, grouping)],
        reference=lambda c: Expected(bits=np.ones(5, np.uint32)),
        agreement=engine.item_agreement(ctx, "bitwise", nan_policy="exact"),
        cases=_gqa_cases(),
        explicit=explicit,
        describe=lambda c: {"shape (variant, kv, g, tq, s, d)": list(c[0]), "near_miss": c[1]},
        output_names=("matched|no expand|batch kv|denotation bitwise|device within gemm bound",),
        build={"grouping": grouping, "device_agreement": "native.ir.AGREEMENT['matmul'] (gemm-bound)"},
    )
    return engine.run(ctx, check)


# -- float16 storage ------------------------------------------------------------------------------------------

FP16_TEMPLATES: tuple[str, ...] = tuple(t for t in EXACT_TEMPLATES if t not in ("reduceSum", "reduceMean", "sum"))
_NP16: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul_elem": np.multiply,
    "div": np.divide,
    "sqrt": np.sqrt,
    "inv": lambda a: np.divide(np.float16(1), a),
    "neg": np.negative,
    "abs": np.abs,
}
_MOVE16: dict[str, Callable[[Any, list], np.ndarray]] = {
    "reshape": lambda n, a: a[0].reshape(n.out_shape),
    "flatten": lambda n, a: a[0].reshape(n.out_shape),
    "transpose": lambda n, a: np.swapaxes(a[0], n.attrs["dim0"], n.attrs["dim1"]),
    "permute": lambda n, a: np.transpose(a[0], n.attrs["perm"]),
    "concat": lambda n, a: np.concatenate(a, axis=n.attrs["axis"]),
    "broadcastTo": lambda n, a: np.broadcast_to(a[0], n.out_shape),
    "expand": lambda n, a: np.broadcast_to(a[0], n.out_shape),
}


def _slice16(n: Any, a: list) -> np.ndarray:
    idx = [slice(None)] * a[0].ndim
    idx[n.attrs["axis"]] = slice(n.attrs["start"], n.attrs["stop"], n.attrs.get("step", 1))
    return a[0][tuple(idx)]


_MOVE16["slice"] = _slice16


def fp16_reference(graph: Graph, payload: Payload, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """The unfused float16 evaluation, op by op in NumPy float16 (add sub mul div sqrt inv neg abs: NumPy's half
    loops, the float op rounded to half, which is the correctly rounded half op since 24 >= 2 * 11 + 2; max, min,
    relu: the project's float32 op (fmaxf/fminf, relu's NaN rule) rounded to half); every value binary16."""
    vals: dict[int, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for n in graph.nodes:
            args = [vals[q] for q in n.parents]
            if n.kind == "input":
                v = cg.round16(np.asarray(inputs[n.id], np.float32))
            elif n.kind == "const":
                v = cg.round16(np.asarray(payload.get(n.id)["value"], np.float32).reshape(n.out_shape))
            elif n.kind in _NP16:
                v = np.asarray(_NP16[n.kind](*args), np.float16)
            elif n.kind in _MOVE16:
                v = np.ascontiguousarray(_MOVE16[n.kind](n, args))
            else:
                f32 = cg.FUSED_OPS[n.kind].host(*[np.asarray(a, np.float32).reshape(-1) for a in args])
                v = cg.round16(np.asarray(f32).reshape(n.out_shape))
            vals[n.id] = np.asarray(v, np.float16).reshape(n.out_shape)
    return vals


def _bits16(arrays: list[np.ndarray]) -> np.ndarray:
    """uint32 holding each binary16 pattern, every NaN as 0x7FFF."""
    out = []
    for a in arrays:
        h = np.ascontiguousarray(a, np.float16).reshape(-1)
        out.append(np.where(np.isnan(h), np.uint16(0x7FFF), h.view(np.uint16)).astype(np.uint32))
    return np.concatenate(out or [np.zeros(0, np.uint32)])


def _rounding16(b: GraphBuilder) -> None:  # (x + 2048) - 2048 is 0 for x = 1 in binary16, 1 if the sum is not rounded
    x = b.add("input", (), (2,))
    c = b.add("const", (), (2,), params={"value": [2048.0, 2048.0]})
    b.add("sub", (b.add("add", (x, c), (2,)), c), (2,))


@register_test("fusion.fp16_chains")
@guarded()
def fp16_chains(ctx: FalsifyContext) -> Outcome:
    """float16-storage programs equal NumPy float16 op by op, bit for bit, fused and unfused (one kernel per op)."""
    variant = str(ctx.params.get("variant", "default"))

    def native(case: GraphCase) -> list:
        ins = _inputs_of(case)
        got = []
        for fuse in (True, False):
            prog = nf.compile_subgraph(case.graph, storage="float16", fuse=fuse, variant=variant)
            res = nf.CUDAExecutor(prog, case.payload, ctx.device).run(ins)
            got += [np.asarray(_host16(res[o])) for o in prog.outputs]
        return [_bits16(got)]

    def reference(case: GraphCase) -> Expected:
        vals = fp16_reference(case.graph, case.payload, _inputs_of(case))
        outs = [vals[o] for o in nf.program_outputs(case.graph)]
        return Expected(bits=_bits16(outs + outs))

    explicit = (_case(_rounding16, [1.0, 3.0]), _case(_reorder, [-1.0, 2.0]))
    check = Check(
        name="float16 storage vs NumPy float16",
        inputs=lambda c: c,
        native=native,
        reference=reference,
        agreement=engine.item_agreement(ctx, "bitwise", nan_policy="exact"),
        cases=_graph_strategy(ctx, _templates(ctx, FP16_TEMPLATES)),
        explicit=explicit,
        describe=lambda c: {"graph": str(c)},
        output_names=("fused outputs|unfused outputs (binary16 bits, NaN 0x7FFF)",),
        build={"variant": variant, "templates": list(_templates(ctx, FP16_TEMPLATES)), "storage": "float16"},
    )
    return engine.run(ctx, check)


def _host16(a: Any) -> np.ndarray:
    from obligations.core.device import to_host

    return np.ascontiguousarray(to_host(a), np.float16)


# -- multi-op patterns ----------------------------------------------------------------------------------------


def pattern_graph(kind: str, rows: int, d: int, seed: int, operand_order: int = 0) -> tuple[Graph, Payload]:
    """A graph holding one pattern: masked softmax (scores * c, + a causal mask, softmax over the last axis) or
    RMSNorm's six ops (weight and eps broadcast from consts; ``operand_order`` swaps the muls' and add's operands)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.add("input", (), (rows, d))
    sh, red = (rows, d), (rows, 1)
    if kind == "masked_softmax":
        c = b.add("const", (), sh, params={"value": np.full(sh, 0.5)})
        s = b.add("mul_elem", (x, c), sh)
        mask = np.where(np.arange(d)[None, :] > np.arange(rows)[:, None] % d, -np.inf, 0.0)
        m = b.add("const", (), sh, params={"value": mask})
        a = b.add("add", (s, m) if operand_order == 0 else (s, m), sh)
        b.add("softmax", (a,), sh, axis=-1)
        return b.build()
    two = b.add("const", (), sh, params={"value": np.full(sh, 2.0)})
    mean = b.add("reduceMean", (b.add("pow", (x, two), sh),), red, axis=-1, keepdim=True)
    e0 = b.add("const", (), (1, 1), params={"value": np.full((1, 1), 1e-6)})
    e = b.add("broadcastTo", (e0,), red, shape=red)
    a = b.add("add", (mean, e) if operand_order == 0 else (e, mean), red)
    rb = b.add("broadcastTo", (b.add("rsqrt", (a,), red),), sh, shape=sh)
    y = b.add("mul_elem", (x, rb) if operand_order == 0 else (rb, x), sh)
    w = b.add("broadcastTo", (b.add("const", (), (d,), params={"value": rng.standard_normal(d)}),), sh, shape=sh)
    b.add("mul_elem", (y, w) if operand_order == 0 else (w, y), sh)
    return b.build()


def pattern_flags(case: tuple, device: str, patterns: bool = True) -> np.ndarray:
    """[one pattern step of the kind, one kernel for it, rules hold, value agrees (RMSNorm: bitwise the
    denotation; masked softmax: bitwise the unfused program on the device and within the softmax bound)]."""
    from native.ir import agree

    kind, rows, d, seed, order, x = case
    g, p = pattern_graph(kind, rows, d, seed, order)
    prog = nf.compile_subgraph(g, payload=p, patterns=patterns)
    steps = [s for s in prog.steps if s.kind == "pattern"]
    one = len(steps) == 1 and steps[0].pattern.kind == kind
    members = len(steps[0].nodes) if one else 0
    rules = not rule_violations(prog, p, {0: x})
    res = nf.CUDAExecutor(prog, p, device).run({0: x})
    out = prog.outputs[0]
    got = _host(res[out])
    den = denote_all(g, p, {0: x}).value
    if kind == "rmsnorm":
        ok = sf.same_bits(got, den[out])
    else:
        unfused = nf.run_program(g, p, {0: x}, device, fuse=False)[out]
        node = g[out]
        ok = sf.same_bits(got, unfused) and bool(np.all(agree(node, [den[node.parents[0]]], None, got, den[out])))
    return np.array([one, members == (2 if kind == "masked_softmax" else 7), rules, ok], np.uint32)


@st.composite
def _pattern_cases(draw: Any) -> tuple:
    kind = draw(st.sampled_from(("masked_softmax", "rmsnorm")))
    rows, d = draw(st.integers(1, 4)), draw(st.integers(1, 160))
    scale = np.float32(draw(st.sampled_from((1.0, 1e-20, 1e18)))) if kind == "rmsnorm" else np.float32(1)
    with np.errstate(all="ignore"):
        x = (draw(f32_arrays((rows, d), specials=draw(st.booleans()))) * scale).astype(np.float32)
    return kind, rows, d, draw(st.integers(0, 3)), draw(st.integers(0, 1)), x


@register_test("fusion.patterns")
@guarded()
def patterns(ctx: FalsifyContext) -> Outcome:
    """Masked softmax and RMSNorm's six ops are each one pattern step (one kernel) and agree with their meaning."""
    on = bool(ctx.params.get("patterns", True))
    rng = np.random.default_rng(1)
    explicit = tuple(
        (k, r, d, 0, o, rng.standard_normal((r, d)).astype(np.float32))
        for k, r, d, o in (("masked_softmax", 3, 7, 0), ("rmsnorm", 2, 4096, 0), ("rmsnorm", 3, 5, 1))
    )
    check = Check(
        name="multi-op patterns",
        inputs=lambda c: c,
        native=lambda c: [pattern_flags(c, ctx.device, on)],
        reference=lambda c: Expected(bits=np.ones(4, np.uint32)),
        agreement=engine.item_agreement(ctx, "bitwise", nan_policy="exact"),
        cases=_pattern_cases(),
        explicit=explicit,
        describe=lambda c: {"pattern": c[0], "rows": c[1], "d": c[2], "seed": c[3], "operand_order": c[4]},
        output_names=("one pattern step|all members|rules|value agrees",),
        build={"patterns": on},
    )
    return engine.run(ctx, check)


# -- the decoder block ------------------------------------------------------------------------------------------

# Relative budget (in units u = 2^-24) of a fused approximate op against the denotation's value rounded once:
# libdevice expf is within 2 ulp; silu x / (1 + expf(-x)) adds two roundings (<= 6.5 ulp, taken as 14 u).
FUSED_REL_U: dict[str, int] = {"silu": 14, "exp": 4, "tanh": 4, "sigmoid": 12, "log": 2}
_MULTIPLICATIVE = frozenset({"mul_elem", "div", "neg", "abs", "relu", "inv"})


def fused_step_agrees(ops: tuple[str, ...], got: np.ndarray, want: np.ndarray) -> bool:
    """A fused chain's value from the denotation's inputs: bitwise when every op is exact; with approximate ops,
    only as the first op(s) followed by multiplicative ops (no cancellation), |got - want| <= (sum of the ops'
    budgets + 2 per later op) u |want| + 2^-140 (NaN where both are NaN)."""
    approx = [k for k, op in enumerate(ops) if op in FUSED_REL_U]
    if not approx:
        return sf.same_bits(got, want)
    if any(op not in FUSED_REL_U and op not in _MULTIPLICATIVE for op in ops[approx[0] :]):
        return False
    rel = (sum(FUSED_REL_U.get(op, 2) for op in ops[approx[0] :])) * 2.0**-24
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(all="ignore"):
        ok = (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= rel * np.abs(w) + 2.0**-140)
    return bool(np.all(ok))


def step_agrees(graph: Graph, payload: Payload, step: sf.Step, den: Any, got: np.ndarray) -> bool:
    """One step's value (from the denotation's values of what it reads) against the denotation, by the step's
    rule: GEMMs within the GEMM bound, masked softmax within the softmax bound, fused chains by
    :func:`fused_step_agrees`, every other step (data movement, RMSNorm, RoPE, embedding) bit for bit."""
    from native.ir import agree

    w = step.writes[0]
    node, want = graph[w], den[w]
    if step.kind == "cublas":
        return bool(np.all(agree(node, [den[q] for q in node.parents], payload.get(w), got, want)))
    if step.kind == "pattern" and step.pattern.kind == "masked_softmax":
        return bool(np.all(agree(node, [den[step.nodes[0]]], None, got, want)))
    if step.kind == "fused":
        return fused_step_agrees(step.kernel.ops, got, want)
    return sf.same_bits(got, want)


DECODER_SHAPES: dict[str, dict[str, int]] = {
    "small": {"t": 4, "dm": 16, "heads": 4, "kv": 2, "dh": 4, "ff": 32, "vocab": 11},
    "wide": {"t": 8, "dm": 32, "heads": 6, "kv": 2, "dh": 8, "ff": 48, "vocab": 17},
}


def decoder_flags(case: tuple, device: str, grouping: str = "div") -> tuple[np.ndarray, dict[str, Any]]:
    """[rules and planner hold, GQA rewritten (2 matches) keeping the denotation bit for bit, masked softmax and
    six-op RMSNorm recognised, RoPE x2 and embedding on the device with no host step, every step agrees with the
    denotation by its rule] and the end-to-end evidence."""
    from native.fusion_gqa import rewrite_gqa
    from spec.fusion_decoder import decoder_block, decoder_params
    from spec.ir import graphspec as gs

    shape_name, seed, ids = case
    blk = decoder_block(**DECODER_SHAPES[shape_name])
    low = gs.lower_dag(blk, decoder_params(blk, seed))
    g, p, out = low.graph, low.payload, low.output
    den0 = denote_all(g, p, [ids]).value
    rw, matches = rewrite_gqa(g, p, [out], grouping)
    g2, p2, out2 = rw.graph, rw.payload, rw.mapping[out]
    den = denote_all(g2, p2, [ids]).value
    gqa_ok = sorted(m.variant for m in matches) == ["qk", "sv"] and sf.same_bits(den[out2], den0[out])
    prog = nf.compile_subgraph(g2, [out2], payload=p2)
    rules = not (sf.program_violations(prog.spec(), cg.fusable) + nf.planner_violations(prog.requests, prog.buffers))
    kinds = [s.kind for s in prog.steps]
    pats = sorted(s.pattern.kind for s in prog.steps if s.kind == "pattern")
    specials = sorted(g2[s.nodes[0]].kind for s in prog.steps if s.kind == "special")
    devices_ok = specials == ["embedding", "rope", "rope"] and "host" not in kinds
    ex = nf.CUDAExecutor(prog, p2, device)
    bad_steps = []
    for k, st_ in enumerate(prog.steps):
        got = ex.run_step(st_, {r: den[r] for r in st_.reads})
        if not step_agrees(g2, p2, st_, den, _host(got[st_.writes[0]])):
            bad_steps.append(f"step {k} ({st_.kind} {[g2[n].kind for n in st_.nodes]})")
    y = _host(ex.run([ids])[out2])
    with np.errstate(all="ignore"):
        rel = float(np.max(np.abs(y.astype(np.float64) - den[out2]) / np.maximum(np.abs(den[out2]), 1e-30)))
    ev = {
        "shape": DECODER_SHAPES[shape_name],
        "ops": prog.counts()["ops"],
        "steps": len(prog.steps),
        "step_kinds": {k: kinds.count(k) for k in sorted(set(kinds))},
        "patterns": pats,
        "special": specials,
        "gqa": [m.variant for m in matches],
        "steps_outside_rule": bad_steps[:4],
        "end_to_end_max_rel_error": rel,
    }
    flags = np.array([rules, gqa_ok, pats == ["masked_softmax", "rmsnorm"], devices_ok, not bad_steps], np.uint32)
    return flags, ev


@register_test("fusion.decoder")
@guarded()
def decoder(ctx: FalsifyContext) -> Outcome:
    """The GraphSpec decoder block, lowered, GQA-rewritten, compiled and run: every step agrees with the
    denotation by its family's rule."""
    grouping = str(ctx.params.get("grouping", "div"))
    evidence: list[dict[str, Any]] = []

    def native(case: tuple) -> list:
        flags, ev = decoder_flags(case, ctx.device, grouping)
        evidence.append(ev)
        return [flags]

    def ids_for(shape: str, seed: int) -> np.ndarray:
        sh = DECODER_SHAPES[shape]
        return np.random.default_rng(seed).integers(0, sh["vocab"], sh["t"]).astype(np.float32)

    cases = st.builds(
        lambda shape, seed: (shape, seed, ids_for(shape, seed)),
        st.sampled_from(sorted(DECODER_SHAPES)),
        st.integers(0, 1000),
    )
    check = Check(
        name="decoder block",
        inputs=lambda c: c,
        native=native,
        reference=lambda c: Expected(bits=np.ones(5, np.uint32)),
        agreement=engine.item_agreement(ctx, "bitwise", nan_policy="exact"),
        cases=cases,
        explicit=tuple((s, 0, ids_for(s, 0)) for s in sorted(DECODER_SHAPES)),
        describe=lambda c: {"shape": c[0], "seed": c[1], "ids": [int(v) for v in c[2]]},
        output_names=("rules|gqa|patterns|device steps|every step within its rule",),
        build={"grouping": grouping, "model": "spec.fusion_decoder.decoder_block (GraphSpec)"},
    )
    return engine.run(ctx, check, lambda: {"programs": evidence[:2]})


# -- kernel cache --------------------------------------------------------------------------------------------

_SOURCES = (
    'extern "C" __global__ void k(float* o) { o[0] = 1.0f; }',
    'extern "C" __global__ void k(float* o) { o[0] = 2.0f; }',
    'extern "C" __global__ void j(float* o) { o[0] = 1.0f / 3.0f; }',
)
_ROUTES = ("nvrtc-ieee", "nvrtc-fmad", "nvrtc-ftz", "nvrtc-fast-math")
_ARCHS = ("80", "90")
_NAMES = ("k", "j")
_cache_requests = st.lists(
    st.tuples(
        st.integers(0, len(_SOURCES) - 1), st.sampled_from(_NAMES), st.sampled_from(_ROUTES), st.sampled_from(_ARCHS)
    ),
    min_size=1,
    max_size=12,
)


@register_test("fusion.cache_key")
@guarded()
def cache_key(ctx: FalsifyContext) -> Outcome:
    """Every cache hit is the artefact of exactly its (source, name, options, arch); one compile per key."""
    key = str(ctx.params.get("key", "full"))

    def native(reqs: list) -> list:
        cache = nf.KernelCache(compiler=lambda s, n, r, a: (s, n, nf.full_key(s, n, r, a).options, a), key=key)
        bad = []
        for si, name, route, arch in reqs:
            got = cache.get(_SOURCES[si], name, route, arch)
            bad.append(int(got != (_SOURCES[si], name, nf.full_key("", "", route, "").options, arch)))
        distinct = {(si, name, nf.full_key("", "", r, "").options, a) for si, name, r, a in reqs}
        bad.append(int(cache.compiles != len(distinct)))
        return [np.array(bad, np.uint32)]

    def reference(reqs: list) -> Expected:
        return Expected(bits=np.zeros(len(reqs) + 1, np.uint32))

    explicit = (
        [(0, "k", "nvrtc-ieee", "90"), (0, "k", "nvrtc-ftz", "90")],
        [(0, "k", "nvrtc-ieee", "80"), (0, "k", "nvrtc-ieee", "90")],
        [(0, "k", "nvrtc-ieee", "90"), (0, "k", "nvrtc-ieee", "90"), (1, "k", "nvrtc-ieee", "90")],
    )
    check = Check(
        name="kernel cache key",
        inputs=lambda c: c,
        native=native,
        reference=reference,
        agreement=engine.item_agreement(ctx, "bitwise", nan_policy="exact"),
        cases=_cache_requests,
        explicit=explicit,
        describe=lambda c: {"requests": [list(r) for r in c]},
        output_names=("mismatch per request|compile count",),
        build={"key": key},
    )
    return engine.run(ctx, check)


@register_test("fusion.cache_shared", devices=("cuda",))
@guarded()
def cache_shared(ctx: FalsifyContext) -> Outcome:
    """Two executors of every example program share one cache: NVRTC compiles once per distinct kernel."""
    cache = nf.KernelCache()
    progs = {name: (nf.compile_subgraph(g), p) for name, (g, p) in nf.example_graphs().items()}
    distinct = {(k.source, k.name) for prog, _ in progs.values() for k in prog.kernels()}
    for _ in range(2):
        for prog, p in progs.values():
            nf.CUDAExecutor(prog, p, "cuda", cache=cache)
    ev = {"programs": len(progs), "distinct_kernels": len(distinct), "compiles": cache.compiles, "executors": 2}
    if cache.compiles != len(distinct):
        return engine.outcome_violated(ctx, ev, f"{cache.compiles} compiles for {len(distinct)} kernels", **ev)
    return engine.outcome_passed(ctx, 2 * len(progs), **ev)


# -- the seed's golden programs ------------------------------------------------------------------------------


def golden_failures(device: str) -> tuple[list[str], dict[str, Any]]:
    """The golden step lists and counts of the example graphs; the MLP fused vs unfused, bitwise."""
    bad: list[str] = []
    counts: dict[str, Any] = {}
    ex = nf.example_graphs()
    for name, (g, _p) in ex.items():
        counts[name] = nf.compile_subgraph(g).counts()
    for name in ("mlp", "mlp_matmul"):
        g, p = ex[name]
        prog = nf.compile_subgraph(g)
        kinds = [s.kind for s in prog.steps]
        if kinds != ["cublas", "cublas", "fused", "cublas"] or prog.steps[2].kernel.ops != ("silu", "mul_elem"):
            bad.append(f"{name}: steps {kinds}, not [cublas, cublas, fused(silu, mul_elem), cublas]")
        x = np.linspace(-3, 3, int(np.prod(g[0].out_shape)), dtype=np.float32).reshape(g[0].out_shape)
        fused = nf.run_program(g, p, [x], device)
        unfused = nf.run_program(g, p, [x], device, fuse=False)
        if any(not sf.same_bits(fused[o], unfused[o]) for o in fused):
            bad.append(f"{name}: fused output differs from the one-kernel-per-op program")
    if counts["chain4"] != {"ops": 4, "steps": 1, "fused_kernels": 1}:
        bad.append(f"chain4: {counts['chain4']}, not 4 ops -> 1 kernel")
    return bad, counts


@register_test("fusion.golden")
@guarded()
def golden(ctx: FalsifyContext) -> Outcome:
    """The seed's MLP is [cublas, cublas, fused(silu, mul), cublas], bitwise its unfused run; 4-op chain -> 1."""
    bad, counts = golden_failures(ctx.device)
    if bad:
        return engine.outcome_violated(ctx, {"failures": bad}, bad[0], counts=counts)
    return engine.outcome_passed(ctx, len(counts), counts=counts)


# -- performance (device) -------------------------------------------------------------------------------------


Contenders = tuple[dict[str, Callable[[], Any]], dict[str, str], dict[str, Any]]


def perf_chain(n: int) -> Contenders:
    """The 4-op chain: ours (one fused kernel), cupy.fuse, the unfused executor; configs; side evidence."""
    import cupy

    from native.ir import run_node

    g, p = nf.chain4_graph(n)
    x = cupy.random.RandomState(0).standard_normal(n, dtype=cupy.float32)
    ex = nf.CUDAExecutor(nf.compile_subgraph(g), p, "cuda")

    def chain4(v: Any) -> Any:  # cupy.fuse needs a named function (a lambda's name is no CUDA identifier)
        return -cupy.maximum(v * v + v, 0)

    fused_fn = cupy.fuse(chain4)

    def unfused() -> Any:  # native.ir.run_graph's loop over run_node, on device arrays (no host input conversion)
        vals = [x]
        for node in g.nodes[1:]:
            vals.append(run_node(node, [vals[q] for q in node.parents], None, "cuda"))
        return vals[-1]

    same = bool(cupy.array_equal(ex.run([x])[4].view(cupy.uint32), unfused().view(cupy.uint32)))
    return (
        {"ours": lambda: ex.run([x]), "cupy.fuse": lambda: fused_fn(x), "unfused": unfused},
        {
            "cupy.fuse": f"cupy {cupy.__version__} cupy.fuse of the same chain, defaults",
            "unfused": "native.ir.run_node per node (run_graph's loop, device inputs), four kernels",
        },
        {"bitwise_vs_unfused": same, "elements": n},
    )


def perf_mlp(t: int, d: int, f: int) -> Contenders:
    """The SiLU-gated MLP: ours (4 steps), its three GEMMs alone, torch fp32; configs; side evidence."""
    import cupy
    import torch

    from native import gemm

    b = GraphBuilder()
    x = b.add("input", (), (t, d))
    # N(0, 1/fan_in) weights drawn on the device (the timing does not depend on them): 50M float64 draws on the
    # host, their astype and upload were ~1 s of the measure phase (H100, 2026-11-27)
    rs = cupy.random.RandomState(1)  # not the input's stream (RandomState(0), below)
    dev = {
        k: rs.standard_normal(s, dtype=cupy.float32) * (1 / s[0] ** 0.5)
        for k, s in (("g", (d, f)), ("u", (d, f)), ("d", (f, d)))
    }
    w = {k: cupy.asnumpy(v) for k, v in dev.items()}  # the program's constants (its payload is host arrays)
    wg, wu, wd = (b.add("const", (), w[k].shape, params={"value": w[k]}) for k in "gud")
    gate, up = b.add("matmul", (x, wg), (t, f)), b.add("matmul", (x, wu), (t, f))
    h = b.add("mul_elem", (b.add("silu", (gate,), (t, f)), up), (t, f))
    b.add("matmul", (h, wd), (t, d))
    g, p = b.build()
    prog = nf.compile_subgraph(g)
    ex = nf.CUDAExecutor(prog, p, "cuda")
    xs = cupy.random.RandomState(0).standard_normal((t, d), dtype=cupy.float32)
    dg, du, dd = (dev[k] for k in "gud")  # the same values as the program's
    hh = cupy.empty((t, f), cupy.float32)

    def gemms() -> Any:
        return (
            gemm.matmul(xs, dg, device="cuda"),
            gemm.matmul(xs, du, device="cuda"),
            gemm.matmul(hh, dd, device="cuda"),
        )

    tx, tg, tu, td = (torch.as_tensor(a, device="cuda") for a in (xs, dg, du, dd))
    tf32 = torch.backends.cuda.matmul.allow_tf32  # torch's default (False): fp32 GEMMs, as ours
    return (
        {
            "ours": lambda: ex.run([xs]),
            "three_gemms": gemms,
            "torch": lambda: (torch.nn.functional.silu(tx @ tg) * (tx @ tu)) @ td,
        },
        {
            "three_gemms": "native.gemm.matmul x3 (the program's GEMMs alone, fp32, CUBLAS_COMPUTE_32F)",
            "torch": f"torch {torch.__version__} eager fp32, allow_tf32={tf32} (torch's default)",
        },
        {
            "steps": len(prog.steps),
            "shape": [t, d, f],
            "weights": "N(0, 1/fan_in), float32, drawn by cupy RandomState(1)",
        },
    )


def perf_rmsnorm(t: int, d: int) -> Contenders:
    """Fused RMSNorm: ours (the executor's step), a device copy of the same array, torch eager; side evidence."""
    import cupy
    import torch

    b = GraphBuilder()
    w = np.random.default_rng(0).standard_normal(d).astype(np.float32)
    b.add("rmsnorm", (b.add("input", (), (t, d)),), (t, d), params={"weight": w}, eps=1e-6)
    g, p = b.build()
    from native import fusion_kernels as fk

    prog = nf.compile_subgraph(g)
    ex = nf.CUDAExecutor(prog, p, "cuda")
    x = cupy.random.RandomState(0).standard_normal((t, d), dtype=cupy.float32)
    y = cupy.empty_like(x)
    y2 = cupy.empty_like(x)
    wd, ed = cupy.asarray(w), cupy.full((1,), np.float32(1e-6), cupy.float32)
    fk.rmsnorm_cuda(ex.rmsnorm_kernels(), x, wd, ed, out=y2)
    same = bool(cupy.array_equal(ex.run([x])[1].view(cupy.uint32), y2.view(cupy.uint32)))
    tx, tw = torch.as_tensor(x, device="cuda"), torch.as_tensor(w, device="cuda")
    return (
        {
            "ours": lambda: ex.run([x]),
            "copy": lambda: cupy.copyto(y, x),
            "torch_eager": lambda: tx * torch.rsqrt(tx.pow(2).mean(-1, keepdim=True) + 1e-6) * tw,
        },
        {
            "copy": "cupy.copyto(y, x): the same (T, D) float32 array read once and written once",
            "torch_eager": f"torch {torch.__version__} eager fp32: x * rsqrt(mean(x^2) + eps) * w",
        },
        {
            "steps": [s.kind for s in prog.steps],
            "kernel_equals_step": same,
            "rmsnorm_kernel": fk.rmsnorm_choice(t, d),
            "bytes_read_and_written": 2 * int(x.nbytes),
            "shape": [t, d],
        },
    )


def conv_graph(n: int, c: int, h: int, w: int, k: int, r: int, seed: int = 0) -> tuple[Graph, Payload]:
    """One conv2d node (N, C, H, W) -> (N, K, H, W): an r x r filter, stride 1, padding r // 2, a bias."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.add("input", (), (n, c, h, w))
    wt = (rng.standard_normal((k, c, r, r)) / (c * r * r) ** 0.5).astype(np.float32)
    bias = rng.standard_normal(k).astype(np.float32)
    ho = h + 2 * (r // 2) - r + 1
    b.add(
        "conv2d",
        (x,),
        (n, k, ho, w + 2 * (r // 2) - r + 1),
        params={"weight": wt, "bias": bias},
        out_channels=k,
        kernel=r,
        stride=1,
        padding=r // 2,
        dilation=1,
    )
    return b.build()


def perf_conv(n: int, c: int, h: int, w: int, k: int, r: int) -> Contenders:
    """The fusion backend's conv step (a one-conv2d program, planned on cuDNN) against torch's conv2d, TF32 off
    for both (torch's other cuDNN flags its defaults); side evidence: the steps and the route."""
    import cupy
    import torch

    from native import cudnn

    g, p = conv_graph(n, c, h, w, k, r)
    prog = nf.compile_subgraph(g, payload=p)
    ex = nf.CUDAExecutor(prog, p, "cuda")
    x = cupy.random.RandomState(0).standard_normal((n, c, h, w), dtype=cupy.float32)
    e = p.get(1)
    tx = torch.from_dlpack(x)
    tw, tb = (torch.as_tensor(np.asarray(e[key], np.float32), device="cuda") for key in ("weight", "bias"))
    flags = {"enabled": True, "benchmark": False, "deterministic": False, "allow_tf32": False}
    return (
        {
            "ours": lambda: ex.run([x]),
            "torch": lambda: torch.nn.functional.conv2d(tx, tw, tb, 1, r // 2),
        },
        {
            "torch": f"torch {torch.__version__} torch.nn.functional.conv2d fp32, cudnn flags {flags} (TF32 off; "
            "benchmark and deterministic torch's defaults)",
        },
        {
            "steps": [s.kind for s in prog.steps],
            "conv_route": prog.conv_reason,
            "step_settings": dict(cudnn.SETTINGS),
            "cudnn": torch.backends.cudnn.version(),
            "shape": {"n": n, "c": c, "h": h, "w": w, "k": k, "r": r},
            "contexts": {"torch": lambda: torch.backends.cudnn.flags(**flags)},
        },
    )


@functools.lru_cache(maxsize=1)
def _built(setup: Callable[..., Contenders], *args: int) -> Contenders:
    """``setup(*args)``, built once for consecutive items that time the same contenders against different peers
    (FUSION-PERF-mlp-gemms and -mlp-torch: the MLP's weights, program and peers took ~1.5 s of the measure phase
    each time; rmsnorm and chain likewise); only the last one is kept (its device arrays stay allocated)."""
    return setup(*args)


def _rms(p: dict) -> Contenders:
    return _built(perf_rmsnorm, int(p.get("t", 8192)), int(p.get("d", 4096)))


def _mlp(p: dict) -> Contenders:
    return _built(perf_mlp, int(p.get("t", 4096)), int(p.get("d", 2048)), int(p.get("f", 8192)))


def _chain(p: dict) -> Contenders:
    return _built(perf_chain, int(p.get("n", 1 << 26)))


def _conv(p: dict) -> Contenders:
    return _built(perf_conv, *(int(p.get(k, v)) for k, v in (("n", 16), ("c", 64), ("h", 56), ("w", 56), ("k", 64))), 3)


# which -> (contenders, the peer, ratio ("speed": peer_ms / ours_ms, "time": ours_ms / peer_ms), direction)
_PERF: dict[str, tuple[Callable[[dict], Contenders], str, str, str]] = {
    "rmsnorm_vs_copy": (_rms, "copy", "speed", ">="),
    "rmsnorm_vs_torch": (_rms, "torch_eager", "speed", ">="),
    "chain_vs_fuse": (_chain, "cupy.fuse", "speed", ">="),
    "chain_vs_unfused": (_chain, "unfused", "speed", ">="),
    "mlp_vs_gemms": (_mlp, "three_gemms", "time", "<="),
    "mlp_vs_torch": (_mlp, "torch", "speed", ">="),
    "conv_vs_torch": (_conv, "torch", "speed", ">="),
}


@register_test("fusion.perf", devices=("cuda",))
@guarded()
def perf(ctx: FalsifyContext) -> Outcome:
    """Fused programs against a peer in the same run: interleaved CUDA-event trials, an interval of the ratio."""
    from falsification import measure

    which = str(ctx.params["which"])
    if which not in _PERF:
        return error(f"params.which must be one of {sorted(_PERF)}")
    if ctx.tolerance is None:
        return error("fusion.perf needs the item's tolerance")
    setup, peer, ratio, direction = _PERF[which]
    if which == "conv_vs_torch":
        from native.cudnn import cudnn_missing

        why = cudnn_missing()
        if why:
            return skipped(why)
    want, source = measure.threshold(ctx)
    budget = measure.Budget.of(ctx.params)
    fns, configs, side = setup(ctx.params)
    side = dict(side)
    contexts = side.pop("contexts", {})
    comp = measure.Comparison(
        ours=fns["ours"], peers={peer: fns[peer]}, configs={peer: configs[peer]}, context=contexts
    )
    verdicts = {which: measure.compare(comp, want, direction, budget, measure.item_seed(ctx.seed, which), ratio=ratio)}
    figure = f"{peer}_ms / ours_ms" if ratio == "speed" else f"ours_ms / {peer}_ms"
    claim = f"{which}: {figure} {direction} {want:g}"
    return measure.outcome(ctx, verdicts, claim, budget, threshold_source=source, **side)
