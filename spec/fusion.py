"""What a fused program means: op categories, steps, and the rules a partition into steps must obey.

A compiled program (``native.fusion``) runs a graph of :mod:`spec.ir` as a sequence of :class:`Step` records;
graph ``input`` and ``const`` nodes are *bound* (arguments and parameters loaded once), every other node
belongs to exactly one step. A step means the composition of its members' IR denotations, evaluated in id
order from the values it reads: :func:`denote_steps` is that meaning, and it equals
:func:`spec.ir.denote.denote_all` on every materialised node exactly when the rules below hold (exact cover,
topological order, every value read across a step boundary materialised by an earlier step). That is why the
rules are checked on every generated graph and why a fused program is compared with the denotation.

Fusion rules (the seed's greedy elementwise algorithm, made checkable by :func:`chain_violations`): a
``fused`` step is a chain of ELEMENTWISE ops linked by the *primary* (parent 0) edge; every member but the last
has exactly one consumer, the next member, and is not a program output (so no intermediate is read outside the
kernel); all members have one shape; chains are maximal (no rule would have let the greedy walk extend one).
Multi-consumer nodes and every non-elementwise op are barriers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spec.ir.denote import bits, eval_node, floats
from spec.ir.graph import Graph, Payload

__all__ = [
    "ANCHOR_BLAS",
    "ELEMENTWISE",
    "REDUCTION",
    "SHAPE_ALIAS",
    "SPECIAL",
    "SOURCE",
    "CATEGORIES",
    "CATEGORY",
    "register_category",
    "classify_op",
    "STEP_KINDS",
    "Step",
    "Program",
    "BOUND_OPS",
    "cover_violations",
    "chain_violations",
    "pattern_violations",
    "may_extend",
    "denote_steps",
    "program_violations",
    "same_bits",
]

ANCHOR_BLAS, ELEMENTWISE, REDUCTION, SHAPE_ALIAS, SPECIAL, SOURCE = (
    "ANCHOR_BLAS",
    "ELEMENTWISE",
    "REDUCTION",
    "SHAPE_ALIAS",
    "SPECIAL",
    "SOURCE",
)
CATEGORIES: dict[str, str] = {
    ANCHOR_BLAS: "GEMM-shaped ops: cuBLAS through native.gemm's guarded GEMM (conv2d through im2col); barrier",
    ELEMENTWISE: "pointwise maps of equal-shape operands: fused into chains, one generated kernel per chain",
    REDUCTION: "folds along an axis (and ops built on them: softmax, norms, pooling); barrier",
    SHAPE_ALIAS: "data movement: zero-copy views where the layout allows (concat copies); barrier",
    SPECIAL: "pre-written or host-evaluated ops (embedding, rope, explicit randomness); barrier",
    SOURCE: "graph inputs and parameters: bound before the program runs, never a step",
}
CATEGORY: dict[str, str] = {}


def register_category(category: str, *ops: str) -> None:
    """Put ``ops`` in ``category`` (each op in exactly one category)."""
    if category not in CATEGORIES:
        raise KeyError(f"unknown category {category!r}")
    for op in ops:
        if op in CATEGORY and CATEGORY[op] != category:
            raise ValueError(f"op {op!r} is already in category {CATEGORY[op]}")
        CATEGORY[op] = category


register_category(SOURCE, "input", "const")
register_category(ANCHOR_BLAS, "linear", "matmul", "bmm", "conv2d")
register_category(
    ELEMENTWISE,
    "add",
    "sub",
    "mul_elem",
    "div",
    "maxElem",
    "minElem",
    "sqrt",
    "inv",
    "neg",
    "abs",
    "relu",
    "pow",
    "rsqrt",
    "exp",
    "log",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "silu",
    "gelu",
)
register_category(REDUCTION, "reduceSum", "reduceMean", "sum", "softmax", "pool", "layernorm", "rmsnorm")
register_category(SHAPE_ALIAS, "reshape", "flatten", "concat", "permute", "transpose", "slice", "broadcastTo", "expand")
register_category(SPECIAL, "embedding", "rope", "randUniform", "bernoulliMask")

BOUND_OPS = frozenset(op for op, c in CATEGORY.items() if c == SOURCE)


def classify_op(kind: str) -> str | None:
    """The category of op ``kind`` (None for an op no category knows)."""
    return CATEGORY.get(kind)


STEP_KINDS: dict[str, str] = {
    "cublas": "CUBLASStep: one ANCHOR_BLAS node through native.gemm (guarded cuBLAS on the device); conv2d on the "
    "direct kernel of native.conv (bitwise the denotation)",
    "cudnn": "CUDNNStep: one conv2d node on cuDNN (native.cudnn, through torch), within the im2col GEMM bound",
    "fused": "FusedKernelStep: an elementwise chain as one generated grid-stride kernel",
    "reduction": "ReductionKernelStep: one REDUCTION node through native.reductions' folds",
    "alias": "AliasStep: one SHAPE_ALIAS node as a view (or a copy for concat)",
    "special": "SpecialKernelStep: a pre-written kernel (embedding gather, RoPE)",
    "pattern": "a multi-op pattern as one pre-written kernel (masked softmax add -> softmax; RMSNorm's six ops)",
    "host": "host fallback: one node evaluated by the denotation on the host (unsupported on the device)",
}


@dataclass(frozen=True)
class Step:
    """One step: its kind, member node ids (id order), the ids it reads from outside, the ids it materialises."""

    kind: str
    nodes: tuple[int, ...]
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    kernel: Any = None  # the generated kernel of a fused step
    pattern: Any = None  # the match of a pattern step (its kind and operands)


@dataclass(frozen=True)
class Program:
    """Steps over a graph: bound node ids (inputs, parameters), the steps in run order, the output ids."""

    graph: Graph
    bound: tuple[int, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    extra: Mapping[str, Any] = field(default_factory=dict)


def cover_violations(graph: Graph, bound: Iterable[int], steps: Iterable[Step], outputs: Iterable[int]) -> list[str]:
    """Exact cover and topological order: each node bound or in exactly one step; reads materialised earlier."""
    out: list[str] = []
    seen: dict[int, str] = {}
    for b in bound:
        if graph[b].kind not in BOUND_OPS:
            out.append(f"node {b} ({graph[b].kind}) is bound but is not an input or parameter")
        seen[b] = "bound"
    available = set(seen)
    for k, s in enumerate(steps):
        where = f"step {k} ({s.kind})"
        for n in s.nodes:
            if n in seen:
                out.append(f"node {n} is in {where} and in {seen[n]}")
            seen[n] = where
        if list(s.nodes) != sorted(s.nodes):
            out.append(f"{where}: members {list(s.nodes)} are not in id order")
        members = set(s.nodes)
        for n in s.nodes:
            for p in graph[n].parents:
                if p not in members and p not in available:
                    out.append(f"{where}: node {n} reads node {p}, not materialised by a bound node or an earlier step")
                if p not in members and p not in s.reads:
                    out.append(f"{where}: node {n} reads node {p}, missing from the step's reads")
        for w in s.writes:
            if w not in members:
                out.append(f"{where} writes node {w}, which is not one of its members")
        available |= set(s.writes)
    for n in range(len(graph)):
        if n not in seen:
            out.append(f"node {n} ({graph[n].kind}) is in no step and not bound")
    for o in outputs:
        if o not in available:
            out.append(f"output node {o} is never materialised")
    return out


def _uses(graph: Graph, outputs: Iterable[int]) -> dict[int, int]:
    """Consumer edges per node, plus one for each program output (an output is read by the caller)."""
    uses = {i: len(c) for i, c in graph.consumers().items()}
    for o in outputs:
        uses[o] = uses.get(o, 0) + 1
    return uses


def may_extend(graph: Graph, tail: int, node: int, uses: Mapping[int, int], fusable: Callable[[str], bool]) -> bool:
    """The greedy rule: ``node`` joins the chain ending at ``tail`` iff it is fusable elementwise, its primary
    parent is ``tail``, ``tail`` has that one consumer edge and is no output, and the shapes match."""
    n, t = graph[node], graph[tail]
    return (
        fusable(n.kind)
        and bool(n.parents)
        and n.parents[0] == tail
        and uses.get(tail, 0) == 1
        and n.out_shape == t.out_shape
    )


def chain_violations(
    graph: Graph,
    steps: Iterable[Step],
    outputs: Iterable[int],
    fusable: Callable[[str], bool],
    same_part: Callable[[int, int], bool] = lambda a, b: True,
) -> list[str]:
    """The fusion rules on every fused step, and maximality of the chains (greedy: none could be extended)."""
    uses = _uses(graph, outputs)
    consumers = graph.consumers()
    out: list[str] = []
    steps = list(steps)
    patterned = {n for s in steps if s.kind == "pattern" for n in s.nodes}
    for k, s in enumerate(steps):
        if s.kind != "fused":
            continue
        where = f"step {k} (fused {list(s.nodes)})"
        for n in s.nodes:
            if classify_op(graph[n].kind) != ELEMENTWISE or not fusable(graph[n].kind):
                out.append(f"{where}: node {n} ({graph[n].kind}) is not a fusable elementwise op")
        for a, b in zip(s.nodes, s.nodes[1:], strict=False):
            if not graph[b].parents or graph[b].parents[0] != a:
                out.append(f"{where}: node {b} does not read node {a} as its primary input")
            if uses.get(a, 0) != 1 or consumers.get(a) != (b,):
                out.append(
                    f"{where}: node {a} has consumers {list(consumers.get(a, ()))}"
                    f"{' and is an output' if uses.get(a, 0) > len(consumers.get(a, ())) else ''}: a barrier"
                )
            if graph[a].out_shape != graph[b].out_shape:
                out.append(f"{where}: shapes {list(graph[a].out_shape)} and {list(graph[b].out_shape)} differ")
        if s.writes != (s.nodes[-1],):
            out.append(f"{where}: writes {list(s.writes)}, not just its last member {s.nodes[-1]}")
        tail = s.nodes[-1]
        for c in consumers.get(tail, ()):
            if c not in patterned and same_part(tail, c) and may_extend(graph, tail, c, uses, fusable):
                out.append(f"{where} is not maximal: node {c} ({graph[c].kind}) could extend it")
    fused_members = {n for s in steps if s.kind == "fused" for n in s.nodes}
    for s in steps:
        if s.kind not in ("fused", "pattern"):
            for n in s.nodes:
                if fusable(graph[n].kind) and classify_op(graph[n].kind) == ELEMENTWISE and n not in fused_members:
                    out.append(f"node {n} ({graph[n].kind}) is fusable but runs in a {s.kind} step")
    return out


def pattern_violations(graph: Graph, steps: Iterable[Step], outputs: Iterable[int]) -> list[str]:
    """Pattern steps keep their intermediates inside: every member but the last is read only by members and is
    no output; the step writes just its last member."""
    uses = _uses(graph, outputs)
    consumers = graph.consumers()
    out: list[str] = []
    for k, s in enumerate(steps):
        if s.kind != "pattern":
            continue
        where = f"step {k} (pattern {getattr(s.pattern, 'kind', '?')} {list(s.nodes)})"
        members = set(s.nodes)
        for n in s.nodes[:-1]:
            outside = [c for c in consumers.get(n, ()) if c not in members]
            if outside or uses.get(n, 0) > len(consumers.get(n, ())):
                out.append(f"{where}: intermediate node {n} is read outside the pattern ({outside}) or is an output")
        if s.writes != (s.nodes[-1],):
            out.append(f"{where}: writes {list(s.writes)}, not just its last member {s.nodes[-1]}")
    return out


def denote_steps(
    graph: Graph, payload: Payload | None, inputs: Mapping[int, np.ndarray], steps: Iterable[Step], bound: Iterable[int]
) -> dict[int, np.ndarray]:
    """The program's meaning: each step evaluates its members in id order by the denotation, from the values it
    reads (bound nodes and earlier steps' writes only); returns every written value (float32)."""
    payload = payload if payload is not None else Payload()
    env: dict[int, np.ndarray] = {}
    for b in bound:
        v = eval_node(graph, payload, env, graph[b], {k: np.asarray(x, np.float32) for k, x in inputs.items()})
        if not isinstance(v, np.ndarray):
            raise ValueError(str(v))
        env[b] = v
    for s in steps:
        local = {r: env[r] for r in s.reads}
        for n in s.nodes:
            v = eval_node(graph, payload, local, graph[n], {})
            if not isinstance(v, np.ndarray):
                raise ValueError(str(v))
            local[n] = v
        for w in s.writes:
            env[w] = local[w]
    return {k: floats(v) for k, v in env.items()}


def program_violations(
    program: Program, fusable: Callable[[str], bool], same_part: Callable[[int, int], bool] = lambda a, b: True
) -> list[str]:
    """Every partition/classification rule a program must satisfy (empty when it does)."""
    g = program.graph
    return (
        cover_violations(g, program.bound, program.steps, program.outputs)
        + chain_violations(g, program.steps, program.outputs, fusable, same_part)
        + pattern_violations(g, program.steps, program.outputs)
    )


def same_bits(a: Any, b: Any) -> bool:
    """Equal shapes and identical binary32 bits."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))
