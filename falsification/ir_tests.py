"""Falsification tests of the graph IR (contracts/graph-ir-v1.yaml).

Registered names and their ``params`` (``variant`` plants a bug; the project's tests use it):

* ``ir.rewrite_preserves`` {rewrite, templates} -- Hypothesis draws graphs
  (:func:`falsification.ir_strategies.graph_cases` over ``REWRITE_TEMPLATES`` unless given);
  the rewrite's output must be well formed, shape-checked, payload-checked, and denote every mapped node
  bit for bit as the input graph does. A failure is shrunk to a minimal graph, printed in its text form.
* ``ir.generated_graphs`` {} -- every drawn graph passes the three checks, denotes without error, round-trips
  through its JSON form, and its denotation is a fold over ids: a worklist evaluator running the nodes in
  another topological order gives the identical table, and node i's value does not change when the nodes
  after i are dropped (prefix property).
* ``ir.checker_enum`` {max_nodes, ssa_nodes} -- bounded exhaustive checker soundness: every graph of up to
  ``max_nodes`` nodes over {input, const, add, relu, sum, reshape}, parents drawn from {-1, ..., max_nodes}
  (so forward, self and out-of-bounds parents), parent counts 0..2 and declared shapes from {[], [2], [1, 2]},
  every graph of exactly ``ssa_nodes`` nodes whose 0..2 parents are earlier ids, and every graph of 1..2
  nodes with earlier parents and one node's id shifted by -1, +1 or +2:
  the checks accept it iff an independent oracle (a NumPy evaluator with its own shape rules, written here)
  finds no defect, and every accepted graph denotes without error with values of the declared shapes.
  Pure (no device, no draws): a pass is reused from the proof cache while the project's source is unchanged.
* ``ir.planted_defects`` {max_nodes} -- into every accepted SSA graph of ``max_nodes`` nodes plant, at every
  node, each defect (a forward parent, an out-of-bounds parent, a wrong declared shape, a wrong arity, an
  id/index mismatch): the first error must be of the planted kind, at the planted node. Pure, like checker_enum.
* ``ir.attention_domain`` {} -- bounded exhaustive, one domain per op: every attention node over q, k, v (and
  kv_lens) shapes of a small space (ranks 3..4, batch 0..2, heads 0..4 over 0..3, sequences 0..2, head dims
  0, 1, 128, 129, each dimension of k/v/kv_lens also off by one, and batch * heads_q at the grid limit) is
  accepted by ``check_inferred_shapes`` iff ``native.attention.attention`` (host path: its plan's guard) accepts
  the same shapes, and an accepted node denotes to its declared shape.
* ``ir.shape_witnesses`` {rule: slice|conv|pool} -- the rule's plan's regime and guard-boundary witnesses (the item's
  ``witnesses:``): an accepted one's output length, from the shape rule and from the denotation of a node on an
  input of that size, equals an independent count (a Python slice; windows whose last tap fits the padded input),
  and a slice's values are NumPy's; a rejected one (one past a limit) is refused with ShapeRuleError.
* ``ir.worked_examples`` {} -- the seed's golden examples: input + const + add denotes to bits
  [0x3F59999A, 0x3D4CCCCC]; the tiny Linear-ReLU-Linear network denotes as its fold definition.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.errors import NoSuchExample

from falsification.engine import seeded_find
from falsification.ir_strategies import GraphCase, graph_cases
from falsification.registry import FalsifyContext, guarded, register_test
from obligations.core.results import Outcome, error, passed, violated
from spec.ir import rewrites as rw
from spec.ir.checks import check_inferred_shapes, check_payload, check_shapes, check_well_formed
from spec.ir.denote import Ok, denote_all, eval_node, normalise_inputs
from spec.ir.graph import Graph, GraphBuilder, Node, Payload
from spec.ir.jsonform import from_json, to_json
from spec.ir.ops import ShapeRuleError, conv_plan, get_op, pool_plan, slice_plan

__all__ = ["enumerate_graphs", "oracle_defect", "rewrite_failure", "generated_failure", "PLANTS"]

_BUDGET = {"quick": 100, "full": 150, "deep": 500}  # graphs per item (pure Python on one CPU: ~9 ms a graph)


def _settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        phases=(Phase.generate, Phase.shrink),
        report_multiple_bugs=False,
    )


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def rewrite_failure(name: str, case: GraphCase) -> str | None:
    """Why rewrite ``name`` fails on ``case`` (None if it preserves checks and denotation bit for bit)."""
    before = denote_all(case.graph, case.payload, case.inputs)
    if not isinstance(before, Ok):
        return f"the input graph does not denote: {before}"
    try:
        out = rw.REWRITES[name](case.graph, case.payload)
    except Exception as e:  # a crashing rewrite fails the claim, with its message
        return f"the rewrite raised {type(e).__name__}: {e}"
    errs = check_inferred_shapes(out.graph) or check_payload(out.graph, out.payload)
    if errs:
        return f"rewritten graph fails its checks: {errs[0]}\n{out.graph}"
    after = denote_all(out.graph, out.payload, case.inputs)
    if not isinstance(after, Ok):
        return f"rewritten graph does not denote: {after}\n{out.graph}"
    if len(case.graph.nodes) and len(case.graph.nodes) - 1 not in out.mapping:
        return "the output node is not mapped"
    for old, new in sorted(out.mapping.items()):
        if not _same_bits(before.value[old], after.value[new]):
            return (
                f"node {old} (now {new}) changes value: {before.value[old].reshape(-1)[:8].tolist()} -> "
                f"{after.value[new].reshape(-1)[:8].tolist()}\nrewritten:\n{out.graph}"
            )
    return None


def _worklist_table(case: GraphCase, rng: random.Random) -> list[np.ndarray] | None:
    """Evaluate the nodes in a random topological order (not id order) with the same node evaluator."""
    g = case.graph
    ins = normalise_inputs(g, case.inputs)
    assert isinstance(ins, dict)
    values: dict[int, np.ndarray] = {}
    pending = list(range(len(g.nodes)))
    while pending:
        ready = [i for i in pending if all(p in values for p in g.nodes[i].parents)]
        i = rng.choice(ready)
        table = [values.get(j, np.zeros(0, np.uint32)) for j in range(i)]
        v = eval_node(g, case.payload, table, g.nodes[i], ins)
        if not isinstance(v, np.ndarray):
            return None
        values[i] = v
        pending.remove(i)
    return [values[i].view(np.float32) for i in range(len(g.nodes))]


def generated_failure(case: GraphCase, seed: int = 0) -> str | None:
    """Why a drawn graph is not a good citizen (checks, denotation, JSON round trip, fold/prefix properties)."""
    g, p = case.graph, case.payload
    for name, errs in (
        ("well-formed", check_well_formed(g)),
        ("shapes", check_shapes(g)),
        ("payload", check_payload(g, p)),
    ):
        if errs:
            return f"{name}: {errs[0]}"
    if check_shapes(g) != check_inferred_shapes(g):
        return "check_shapes and check_inferred_shapes disagree"
    res = denote_all(g, p, case.inputs)
    if not isinstance(res, Ok):
        return f"denotation error: {res}"
    for n, v in zip(g.nodes, res.value, strict=True):
        if tuple(v.shape) != n.out_shape:
            return f"node {n.id}: value shape {list(v.shape)} != declared {list(n.out_shape)}"
    back = from_json(to_json(g, p))
    if back.errors or back.graph != g or back.payload != p:
        return f"JSON round trip changes the graph: {back.errors}"
    other = _worklist_table(case, random.Random(seed))
    if other is None or not all(_same_bits(a, b) for a, b in zip(res.value, other, strict=True)):
        return "a worklist evaluation in another topological order differs from the id-order fold"
    for i in range(len(g.nodes)):
        prefix = Graph(g.nodes[: i + 1])
        keep = {k: v for k, v in p.entries.items() if k <= i}
        ins = tuple(a for j, a in zip(g.input_ids(), case.inputs, strict=True) if j <= i)
        pre = denote_all(prefix, Payload(keep), ins)
        if not isinstance(pre, Ok) or not _same_bits(pre.value[i], res.value[i]):
            return f"node {i}'s value changes when the nodes after it are dropped"
    return None


# The templates the rewrite tests draw from: the structural ops the rewrites look at, plus a few others.
REWRITE_TEMPLATES: tuple[str, ...] = (
    "relu",
    "add",
    "const",
    "reshape",
    "flatten",
    "transpose",
    "slice",
    "broadcastTo",
    "sum",
    "linear",
    "reduceSum",
    "concat",
    "neg",
    "mul_elem",
    "random",
    "softmax",
)


def _hypothesis(
    ctx: FalsifyContext,
    why: Callable[[GraphCase], str | None],
    max_nodes: int,
    templates: tuple[str, ...] | None = None,
) -> tuple[Any, int]:
    calls = [0]
    strategy = (
        graph_cases(max_nodes=max_nodes) if templates is None else graph_cases(max_nodes=max_nodes, templates=templates)
    )

    def bad(case: GraphCase) -> bool:
        calls[0] += 1
        return why(case) is not None

    try:
        case = seeded_find(strategy, bad, _settings(_BUDGET[ctx.profile]), ctx.seed)
    except NoSuchExample:
        case = None
    return case, calls[0]


def _replay(ctx: FalsifyContext) -> str:
    return f"kc check {ctx.contract_path} --only {ctx.item.get('id')} --seed {ctx.seed}"


@register_test("ir.rewrite_preserves", devices=("host", "cuda"))
@guarded()
def rewrite_preserves(ctx: FalsifyContext) -> Outcome:
    """A rewrite keeps generated graphs well formed and shape-checked and preserves their denotation bitwise."""
    name = str(ctx.params["rewrite"])
    if name not in rw.REWRITES:
        return error(f"params.rewrite must be one of {sorted(rw.REWRITES)}")
    t0 = time.perf_counter()
    templates = tuple(ctx.params.get("templates", REWRITE_TEMPLATES))
    case, calls = _hypothesis(ctx, lambda c: rewrite_failure(name, c), int(ctx.params.get("max_nodes", 6)), templates)
    ev = {"rewrite": name, "seed": ctx.seed, "profile": ctx.profile, "seconds": round(time.perf_counter() - t0, 3)}
    if case is None:
        return passed(cases=calls, **ev)
    reason = rewrite_failure(name, case)
    return violated(
        {"graph": str(case), "why": reason, "replay": _replay(ctx)},
        f"{name} changes a graph of {len(case.graph.nodes)} nodes: {reason}",
        **ev,
    )


@register_test("ir.generated_graphs", devices=("host", "cuda"))
@guarded()
def generated_graphs(ctx: FalsifyContext) -> Outcome:
    """Generated graphs pass the checks, denote, round-trip through JSON, and denote as a fold over ids."""
    t0 = time.perf_counter()
    case, calls = _hypothesis(ctx, lambda c: generated_failure(c, ctx.seed), int(ctx.params.get("max_nodes", 6)))
    ev = {"seed": ctx.seed, "profile": ctx.profile, "seconds": round(time.perf_counter() - t0, 3)}
    if case is None:
        return passed(cases=calls, **ev)
    reason = generated_failure(case, ctx.seed)
    return violated({"graph": str(case), "why": reason, "replay": _replay(ctx)}, str(reason), **ev)


# -- bounded exhaustive checker soundness ---------------------------------------------------------------

ENUM_OPS: tuple[str, ...] = ("input", "const", "add", "relu", "sum", "reshape")
ENUM_SHAPES: tuple[tuple[int, ...], ...] = ((), (2,), (1, 2))


def _parent_lists(vals: range) -> Iterator[tuple[int, ...]]:
    yield ()
    for a in vals:
        yield (a,)
    for a, b in itertools.product(vals, vals):
        yield (a, b)


def _node(i: int, op: str, parents: tuple[int, ...], shape: tuple[int, ...]) -> Node:
    attrs = {"shape": shape} if op == "reshape" else {}
    return Node(i, parents, op, shape, attrs)


def _choices(parents: range) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    return [(op, ps, s) for op in ENUM_OPS for ps in _parent_lists(parents) for s in ENUM_SHAPES]


def enumerate_graphs(max_nodes: int, ssa_nodes: int = 0) -> Iterator[Graph]:
    """(a) every graph of 1..max_nodes nodes over ENUM_OPS and ENUM_SHAPES with 0-2 parents from
    {-1..max_nodes}; (b) every graph of exactly ssa_nodes nodes with 0-2 parents among the earlier ids;
    (c) every graph of 1..2 nodes with earlier parents and one id shifted by -1, +1 or +2."""

    # Nodes are immutable: each position's are built once and shared by every graph that has them (building one per
    # graph was a third of IR-CHECK-enum's 8 s)
    def nodes_at(i: int, parents: range) -> list[Node]:
        return [_node(i, op, ps, s) for op, ps, s in _choices(parents)]

    anywhere = [nodes_at(i, range(-1, max_nodes + 1)) for i in range(max_nodes)]
    for n in range(1, max_nodes + 1):
        for nodes in itertools.product(*anywhere[:n]):
            yield Graph(nodes)
    earlier = [nodes_at(i, range(i)) for i in range(max(ssa_nodes, 2))]
    if ssa_nodes > max_nodes:
        for nodes in itertools.product(*earlier[:ssa_nodes]):
            yield Graph(nodes)
    # (c) id/index mismatches: every SSA graph of 1..2 nodes with one node's id shifted by -1, +1 or +2
    for n in (1, 2):
        for base in itertools.product(*earlier[:n]):
            for k, shift in itertools.product(range(n), (-1, 1, 2)):
                yield Graph(tuple(nd.replace(id=nd.id + shift) if i == k else nd for i, nd in enumerate(base)))


_ORACLE_ARITY = {"input": 0, "const": 0, "add": 2, "relu": 1, "sum": 1, "reshape": 1}
_ORACLE_EVAL: dict[str, Callable[[list[np.ndarray], Node], np.ndarray]] = {
    "input": lambda a, n: np.zeros(n.out_shape, np.float32),
    "const": lambda a, n: np.ones(n.out_shape, np.float32),
    "add": lambda a, n: a[0] + a[1] if a[0].shape == a[1].shape else _raise("add of different shapes"),
    "relu": lambda a, n: np.maximum(a[0], 0),
    "sum": lambda a, n: np.float32(a[0].sum()).reshape(()),
    "reshape": lambda a, n: np.reshape(a[0], n.attrs["shape"]),
}


def _raise(msg: str) -> np.ndarray:
    raise ValueError(msg)


def oracle_defect(g: Graph) -> str | None:
    """An independent defect finder for the enumerated op set: plain NumPy evaluation (no broadcasting)."""
    vals: list[np.ndarray] = []
    for i, n in enumerate(g.nodes):
        if n.id != i:
            return f"id {n.id} at index {i}"
        if len(n.parents) != _ORACLE_ARITY[n.kind]:
            return f"node {i}: {len(n.parents)} parents"
        if any(not 0 <= p < i for p in n.parents):
            return f"node {i}: parent not earlier"
        try:
            v = _ORACLE_EVAL[n.kind]([vals[p] for p in n.parents], n)
        except ValueError as e:
            return f"node {i}: {e}"
        if v.shape != n.out_shape:
            return f"node {i}: value {v.shape} vs declared {n.out_shape}"
        vals.append(v)
    return None


def _enum_payload(g: Graph) -> tuple[Payload, tuple[np.ndarray, ...]]:
    p = Payload({n.id: {"value": np.ones(n.out_shape, np.float32)} for n in g.nodes if n.kind == "const"})
    ins = tuple(np.zeros(g.nodes[i].out_shape, np.float32) for i in g.input_ids())
    return p, ins


def checker_disagreement(g: Graph, accepts: Callable[[Graph], bool]) -> str | None:
    """Why the checks and the oracle disagree on g, or why an accepted g fails to denote (None: agree)."""
    ok = accepts(g)
    defect = oracle_defect(g)
    if ok and defect is not None:
        return f"accepted, but the oracle finds a defect: {defect}"
    if not ok and defect is None:
        return f"rejected ({(check_inferred_shapes(g) or ['?'])[0]}), but the oracle finds no defect"
    if ok:
        p, ins = _enum_payload(g)
        res = denote_all(g, p, ins)
        if not isinstance(res, Ok):
            return f"accepted, but the denotation fails: {res}"
        if any(tuple(v.shape) != n.out_shape for v, n in zip(res.value, g.nodes, strict=True)):
            return "accepted, but a value has a shape other than its declared one"
    return None


def _default_accepts(g: Graph) -> bool:
    return not check_inferred_shapes(g)


def checker_enum_run(
    max_nodes: int, ssa_nodes: int = 0, accepts: Callable[[Graph], bool] = _default_accepts
) -> tuple[dict, Any]:
    """Run the enumeration; (counts, first counterexample or None)."""
    counts = {"graphs": 0, "accepted": 0, "rejected": 0, "denoted": 0}
    for g in enumerate_graphs(max_nodes, ssa_nodes):
        counts["graphs"] += 1
        why = checker_disagreement(g, accepts)
        if why is not None:
            return counts, {"graph": str(g), "why": why}
        key = "accepted" if oracle_defect(g) is None else "rejected"
        counts[key] += 1
        counts["denoted"] += key == "accepted"
    return counts, None


@register_test("ir.checker_enum", devices=("host", "cuda"), pure=True)
@guarded()
def checker_enum(ctx: FalsifyContext) -> Outcome:
    """Bounded exhaustive: the checks accept exactly the defect-free graphs, and accepted graphs denote."""
    max_nodes = int(ctx.params.get("max_nodes", 2))
    ssa_nodes = int(ctx.params.get("ssa_nodes", 3))
    t0 = time.perf_counter()
    counts, cex = checker_enum_run(max_nodes, ssa_nodes)
    ev = {
        "max_nodes": max_nodes,
        "ssa_nodes": ssa_nodes,
        "ops": list(ENUM_OPS),
        "shapes": [list(s) for s in ENUM_SHAPES],
        "parents": f"<= {max_nodes} nodes: 0..2 parents from -1..{max_nodes}; {ssa_nodes} nodes: 0..2 earlier ids",
        **counts,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if cex is not None:
        return violated({**cex, "replay": _replay(ctx)}, cex["why"], **ev)
    return passed(cases=counts["graphs"], **ev)


def _plant_forward(g: Graph, i: int) -> Graph | None:
    n = g.nodes[i]
    return None if not n.parents else _with(g, i, n.replace(parents=(i,) + n.parents[1:]))


def _plant_oob(g: Graph, i: int) -> Graph | None:
    n = g.nodes[i]
    return None if not n.parents else _with(g, i, n.replace(parents=(len(g.nodes),) + n.parents[1:]))


def _plant_shape(g: Graph, i: int) -> Graph | None:
    n = g.nodes[i]
    if n.kind in ("input", "const"):
        return None  # a leaf's declared shape is its shape (inputs and payloads are checked against it)
    wrong = next(s for s in ENUM_SHAPES + ((3,),) if s != n.out_shape)
    return _with(g, i, n.replace(out_shape=wrong))


def _plant_arity(g: Graph, i: int) -> Graph | None:
    n = g.nodes[i]
    return _with(g, i, n.replace(parents=n.parents[:-1] if n.parents else (0,) if i else ()))


def _plant_id(g: Graph, i: int) -> Graph | None:
    return _with(g, i, g.nodes[i].replace(id=g.nodes[i].id + 1))


def _with(g: Graph, i: int, n: Node) -> Graph:
    return Graph(g.nodes[:i] + (n,) + g.nodes[i + 1 :])


# defect -> (planting function, the error kinds that report it)
PLANTS: dict[str, tuple[Callable[[Graph, int], Graph | None], tuple[str, ...]]] = {
    "forward-parent": (_plant_forward, ("forward-parent",)),
    "out-of-bounds-parent": (_plant_oob, ("parent-out-of-bounds",)),
    "wrong-declared-shape": (_plant_shape, ("shape-mismatch", "shape-rule")),
    "wrong-arity": (_plant_arity, ("arity",)),
    "id-mismatch": (_plant_id, ("id-mismatch",)),
}


def planted_run(max_nodes: int, check: Callable[[Graph], list] = check_inferred_shapes) -> tuple[dict, Any]:
    """Plant every defect at every node of every accepted SSA graph of max_nodes nodes; (counts, first miss)."""
    counts = {name: 0 for name in PLANTS}
    for g in enumerate_graphs(0, max_nodes):
        if check_inferred_shapes(g):
            continue
        for i in range(len(g.nodes)):
            for name, (plant, kinds) in PLANTS.items():
                bad = plant(g, i)
                if bad is None or oracle_defect(bad) is None:
                    continue
                errs = check(bad)
                if not errs or errs[0].node != i or errs[0].kind not in kinds:
                    got = str(errs[0]) if errs else "accepted"
                    return counts, {"defect": name, "node": i, "graph": str(bad), "got": got}
                counts[name] += 1
    return counts, None


@register_test("ir.planted_defects", devices=("host", "cuda"), pure=True)
@guarded()
def planted_defects(ctx: FalsifyContext) -> Outcome:
    """Every planted defect in every accepted enumerated graph is reported first, at its node, by its kind."""
    max_nodes = int(ctx.params.get("max_nodes", 3))
    t0 = time.perf_counter()
    counts, cex = planted_run(max_nodes)
    ev = {"max_nodes": max_nodes, "planted": counts, "seconds": round(time.perf_counter() - t0, 3)}
    if cex is not None:
        return violated(
            {**cex, "replay": _replay(ctx)},
            f"planted {cex['defect']} at node {cex['node']} not reported there: {cex['got']}",
            **ev,
        )
    return passed(cases=sum(counts.values()), **ev)


# -- attention: the IR's shape rule and the family's guard accept the same shapes --------------------------


def attention_shape_cases() -> Iterator[tuple[tuple[int, ...], ...]]:
    """(q, k, v[, kv_lens]) shapes: a small grid of dimensions, each k/v/kv_lens dimension also off by one."""
    grid = itertools.product(range(3), range(5), range(4), (0, 2), (0, 1), (0, 1, 128, 129))
    for b, hq, hkv, lq, lk, d in grid:
        q, k = (b, hq, lq, d), (b, hkv, lk, d)
        yield q, k, k
        yield q, k, k, (b,)
        if b and hq and hkv and d == 1:  # the admissible corner: perturb one dimension at a time
            yield q[1:], k, k
            yield q, k, k, (b + 1,)
            for i in range(4):
                bent = tuple(x + (j == i) for j, x in enumerate(k))
                yield q, bent, k
                yield q, k, bent
    yield (1, 65535, 0, 1), (1, 1, 0, 1), (1, 1, 0, 1)  # batch * heads_q at the kernels' grid-y limit
    yield (1, 65536, 0, 1), (1, 1, 0, 1), (1, 1, 0, 1)
    yield (3, 21846, 0, 1), (3, 2, 0, 1), (3, 2, 0, 1)


def _ir_accepts(shapes: tuple[tuple[int, ...], ...]) -> tuple[bool, Graph]:
    nodes = [Node(i, (), "input", s) for i, s in enumerate(shapes)]
    nodes.append(Node(len(shapes), tuple(range(len(shapes))), "attention", shapes[0]))
    g = Graph(tuple(nodes))
    return not check_inferred_shapes(g), g


def _family_accepts(shapes: tuple[tuple[int, ...], ...], crashes: list) -> bool:
    from native.attention import AttentionShapeError, attention

    q, k, v = (np.zeros(s, np.float32) for s in shapes[:3])
    lens = np.zeros(shapes[3], np.int64) if len(shapes) == 4 else None
    try:
        out, _ = attention(q, k, v, kv_lens=lens, device="host")
    except AttentionShapeError:
        return False
    except ZeroDivisionError:
        # native.attention's plan divides by heads_kv before its guard looks at it: a refusal, kept in the evidence.
        crashes.append([list(s) for s in shapes])
        return False
    return tuple(out.shape) == shapes[0]


def attention_domain_run(
    ir_accepts: Callable[[tuple[tuple[int, ...], ...]], tuple[bool, Graph]] = _ir_accepts,
) -> tuple[dict, dict | None]:
    """Every case of :func:`attention_shape_cases`: (counts, the first disagreement or None)."""
    counts: dict[str, Any] = {"cases": 0, "accepted": 0}
    crashes: list = []
    for shapes in attention_shape_cases():
        counts["cases"] += 1
        counts["family_zero_division"] = len(crashes)
        ir_ok, g = ir_accepts(shapes)
        fam_ok = _family_accepts(shapes, crashes)
        if ir_ok != fam_ok:
            return counts, {
                "shapes": [list(s) for s in shapes],
                "ir": ir_ok,
                "family": fam_ok,
                "why": f"the IR {'accepts' if ir_ok else 'refuses'} and native.attention "
                f"{'accepts' if fam_ok else 'refuses'} q, k, v{', kv_lens' * (len(shapes) == 4)} "
                f"{[list(s) for s in shapes]}",
            }
        if ir_ok:
            counts["accepted"] += 1
            ins = tuple(np.zeros(s, np.float32) for s in shapes)
            res = denote_all(g, Payload(), ins)
            if not isinstance(res, Ok) or res.value[-1].shape != shapes[0]:
                return counts, {"shapes": [list(s) for s in shapes], "why": f"accepted but does not denote: {res}"}
    counts["family_zero_division"] = len(crashes)
    return counts, None


@register_test("ir.attention_domain", devices=("host", "cuda"))
@guarded()
def attention_domain(ctx: FalsifyContext) -> Outcome:
    """The IR's attention shape rule accepts exactly the shapes the attention family's guard accepts."""
    t0 = time.perf_counter()
    counts, cex = attention_domain_run()
    ev = {
        "accepted": counts["accepted"],
        "family_zero_division": counts.get("family_zero_division", 0),
        "family": "native.attention.attention (host path)",
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if cex is not None:
        return violated({**cex, "replay": _replay(ctx)}, cex["why"], cases_run=counts["cases"], **ev)
    return passed(cases=counts["cases"], **ev)


def _slice_lengths(c: tuple) -> tuple[np.ndarray, np.ndarray]:
    dim, start, stop, step = c
    attrs = {"axis": 0, "start": start, "stop": stop, "step": step}
    out = get_op("slice").shape_rule(((dim,),), attrs, ())[0]  # ShapeRuleError past a limit
    g = GraphBuilder()
    g.add("slice", (g.add("input", (), (dim,)),), (out,), **attrs)
    graph, payload = g.build()
    x = np.arange(dim, dtype=np.float32) + np.float32(0.5)
    got = denote_all(graph, payload, {0: x}).value[1]
    want = x[start:stop:step]
    return np.array([out, got.size, *got.view(np.uint32)], np.uint32), np.array(
        [want.size, want.size, *want.view(np.uint32)], np.uint32
    )


def _window_count(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """Windows j >= 0 whose last tap j stride + dilation (kernel - 1) lies inside the padded input (counted)."""
    j = 0
    while j * stride + dilation * (kernel - 1) <= size + 2 * padding - 1:
        j += 1
    return j


def _window_lengths(op: str) -> Callable[[tuple], tuple[np.ndarray, np.ndarray]]:
    def run(c: tuple) -> tuple[np.ndarray, np.ndarray]:
        size, kernel, stride, padding, dilation = c if op == "conv2d" else (*c, 1)
        attrs: dict[str, Any] = {"kernel": (1, kernel), "stride": (1, stride), "padding": (0, padding)}
        attrs.update({"out_channels": 1, "dilation": (1, dilation)} if op == "conv2d" else {"mode": "max"})
        out = get_op(op).shape_rule(((1, 1, 1, size),), attrs, ())[-1]  # ShapeRuleError past a limit
        g = GraphBuilder()
        params = {"params": {"weight": np.ones((1, 1, 1, kernel)), "bias": np.zeros(1)}} if op == "conv2d" else {}
        g.add(op, (g.add("input", (), (1, 1, 1, size)),), (1, 1, 1, out), **params, **attrs)
        graph, payload = g.build()
        x = np.arange(size, dtype=np.float32).reshape(1, 1, 1, size)
        got = denote_all(graph, payload, {0: x}).value[1]
        n = _window_count(size, kernel, stride, padding, dilation)
        return np.array([out, got.shape[-1]], np.uint32), np.array([n, n], np.uint32)

    return run


# rule -> (plan, the case's fields (plan parameters), run: case -> (native, reference) uint32 arrays)
_SHAPE_WITNESS: dict[str, tuple[Callable[..., Any], tuple[str, ...], Callable[[tuple], tuple]]] = {
    "slice": (slice_plan, ("dim", "start", "stop", "step"), _slice_lengths),
    "conv": (conv_plan, ("size", "kernel", "stride", "padding", "dilation"), _window_lengths("conv2d")),
    "pool": (pool_plan, ("size", "kernel", "stride", "padding"), _window_lengths("pool")),
}


@register_test("ir.shape_witnesses", devices=("host", "cuda"))
@guarded()
def shape_witnesses(ctx: FalsifyContext) -> Outcome:
    """A shape rule at its plan's regime and boundary witnesses: lengths (and a slice's values) bitwise an
    independent count; one past a limit refused (the same code on either device: the rules are the spec's)."""
    from falsification import engine
    from falsification.agreement import Expected
    from obligations.core.plans import regime_of

    plan, names, run = _SHAPE_WITNESS[str(ctx.params.get("rule", "slice"))]
    done: dict[tuple, tuple] = {}

    def inputs(c: tuple) -> tuple:
        done[c] = run(c)
        return c

    check = engine.Check(
        name=f"{ctx.params.get('rule', 'slice')} shape rule at its witnesses",
        inputs=inputs,
        native=lambda c: done[c][0],
        reference=lambda c: Expected(bits=done.pop(c)[1]),
        agreement=engine.item_agreement(ctx, "bitwise"),
        from_witness=lambda v: tuple(int(v[n]) for n in names),
        regime_of=lambda c: regime_of(plan, dict(zip(names, c, strict=True))),
        refuses=(ShapeRuleError,),
        describe=lambda c: dict(zip(names, c, strict=True)),
    )
    return engine.run(ctx, check)


@register_test("ir.worked_examples", devices=("host", "cuda"))
@guarded()
def worked_examples(ctx: FalsifyContext) -> Outcome:
    """The seed's golden examples denote to the stated bits."""
    from spec.ir.graph import GraphBuilder

    b = GraphBuilder()
    x = b.add("input", (), (2,))
    c = b.add("const", (), (2,), params={"value": [0.25, 0.25]})
    b.add("add", (x, c), (2,))
    g, p = b.build()
    res = denote_all(g, p, np.array([0.6, -0.2], dtype=np.float32))
    got = [] if not isinstance(res, Ok) else [int(v) for v in res.value[2].view(np.uint32)]
    if got != [0x3F59999A, 0x3D4CCCCC] or check_shapes(g):
        return violated(
            {"got": [hex(v) for v in got], "want": ["0x3f59999a", "0x3d4ccccc"]},
            "input + const + add does not denote to the golden bits",
        )
    rng = np.random.default_rng(ctx.seed)
    w1, b1 = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    w2, b2 = rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
    b = GraphBuilder()
    h = b.add("input", (), (3,))
    h = b.add("linear", (h,), (4,), params={"weight": w1, "bias": b1}, out_features=4)
    h = b.add("relu", (h,), (4,))
    b.add("linear", (h,), (2,), params={"weight": w2, "bias": b2}, out_features=2)
    g, p = b.build()
    xin = rng.standard_normal(3).astype(np.float32)
    res = denote_all(g, p, xin)
    want = _fold_linear(w2, b2, np.maximum(_fold_linear(w1, b1, xin), np.float32(0)))
    if not isinstance(res, Ok) or not _same_bits(res.value[3], want):
        return violated({"got": str(res), "want": want.tolist()}, "the tiny network differs from its fold definition")
    return passed(cases=2, seed=ctx.seed)


def _fold_linear(w: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """y[o] = ((+0 + w[o,0] x[0]) + w[o,1] x[1]) + ... + b[o] in float32 (each op rounded): an independent model."""
    y = np.zeros(w.shape[0], np.float32)
    for k in range(w.shape[1]):
        y = (y + (w[:, k] * x[k]).astype(np.float32)).astype(np.float32)
    return (y + b).astype(np.float32)
