"""The meaning of a training step: a GraphSpec model, its loss, reverse mode over the IR and an optimizer update.

A step is one IR graph (:func:`step_graph`), built in four parts:

1. **Parameterised forward** (:func:`parameterise`): the GraphSpec model lowered to IR (``spec.ir.graphspec.lower``)
   with its trainable parameters turned from payload tensors into graph ``input`` nodes, so that one graph serves
   every step (the VJP rules of payload ops bake the payload's values into the backward graph). Each op that holds
   parameters has one rule in :data:`PARAMETERISE`, each bitwise the op it replaces (checked by the contract):

   * ``const`` -> an input of its shape;
   * ``linear`` x W^T + b -> ``matmul([x, 1], [W^T; b])``: x with a column of ones, W^T with b as its last row.
     The IR's linear is the fold over k of x_k w_k from +0, then + b; the matmul's fold over k = 0..K adds
     1 * b = b last: the same operations in the same order (and the bias's cotangent comes out of the weight GEMM,
     not a column fold);
   * ``rmsnorm`` (x r) w -> ``rmsnorm`` with unit weight, times w ((x r) 1 = x r exactly);
   * ``layernorm`` (d r) w + b -> ``layernorm`` with unit weight and a -0 bias (the exact additive identity), times
     w, plus b.

   Ops whose tensors no IR op reads as an operand (``embedding``'s table, ``conv2d``'s weights) keep them in the
   payload: those parameters are frozen, listed with the reason (:attr:`StepGraph.frozen`).
2. **Loss** (:data:`LOSSES`): ``mse`` is the mean of (y - t)^2 as a tree of means: over the last axis, then over
   equal groups of at most 64 (the largest divisor of what is left; all of it when there is none), so every fold
   on the device has many rows in flight. Equal groups make the tree the mean itself (in the reals).
3. **Backward**: ``spec.ir.vjp.vjp`` of the loss graph with respect to the parameter inputs; the loss's cotangent
   seed is the constant 1.
4. **Update** (:data:`OPTIMIZERS`): ``sgd`` p - lr g; ``adam`` m' = b1 m + (1 - b1) g, v' = b2 v + (1 - b2) g g,
   p' = p - lr (m' c1) / (sqrt(v' c2) + eps) with c1 = 1 / (1 - b1^t), c2 = 1 / (1 - b2^t) per-step inputs (float64,
   rounded once). Every update op is correctly rounded (add, sub, mul, div, sqrt), so the device's value is the
   denotation's, bit for bit.

Dead nodes (VJP rules emit both operands' cotangents; only the parameters' are read) are eliminated; inputs stay.
The step's meaning is the binary32 denotation of that graph (:func:`denote_step`); its float64 meaning and the
loss's (:func:`loss_real`) are what gradients are checked against. :data:`TASKS` are the fixed synthetic tasks
(a teacher of the same architecture gives the targets): an MLP and the decoder block of ``spec.fusion_decoder``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spec import fusion_decoder as fd
from spec.ir import graphspec as gs
from spec.ir.checks import IRError
from spec.ir.denote import denote_all
from spec.ir.graph import Graph, GraphBuilder, Node, Payload
from spec.ir.real import real_all
from spec.ir.rewrites import eliminate_dead_nodes
from spec.ir.vjp import Backward, Emitter, VjpRule, vjp

__all__ = [
    "ParamSlot",
    "param_slots",
    "Parameterised",
    "PARAMETERISE",
    "FROZEN",
    "parameterise",
    "LOSSES",
    "Optimizer",
    "OPTIMIZERS",
    "optimizer",
    "OptimizerKind",
    "Parameteriser",
    "StepGraph",
    "StepValues",
    "values_of",
    "trainable",
    "step_graph",
    "initial_state",
    "step_scalars",
    "step_inputs",
    "denote_step",
    "loss_real",
    "update_reference",
    "Task",
    "TASKS",
    "task",
    "mlp_model",
    "gemm_flops",
]

Shape = tuple[int, ...]
F32 = np.float32


# -- the model's parameters: where the lowering stores each slot of its ABI -----------------------------------


@dataclass(frozen=True)
class ParamSlot:
    """One slot of a GraphSpec model's parameter ABI and where its lowering stores it (node, tensor name)."""

    index: int
    name: str
    shape: Shape
    node: int
    tensor: str
    kind: str  # the op of that node


def _markers(abi: Sequence[gs.ParamSpec]) -> list[np.ndarray]:
    # distinct random values per slot: a slot is found where its values are, bit for bit (drawn in binary32: the
    # float64 draws and their rounding were 0.13 s of the MFU model's 16.8M parameters on an H100's host)
    return [1 + np.random.default_rng(0x7A11 + 7919 * i).random(s.shape, dtype=F32) for i, s in enumerate(abi)]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit equal float32 arrays of one shape (a few leading words first: most candidates differ there)."""
    x, y = np.ascontiguousarray(a, F32).view(np.uint32).ravel(), np.ascontiguousarray(b, F32).view(np.uint32).ravel()
    return bool(np.array_equal(x[:16], y[:16]) and np.array_equal(x, y))


def param_slots(model: gs.Graph | gs.Dag) -> tuple[ParamSlot, ...]:
    """Where the lowering of ``model`` stores each parameter slot: found by lowering distinct marker values; a slot
    stored anywhere but once, verbatim, is a ValueError (its values would be transformed: not trainable here)."""
    d = model if isinstance(model, gs.Dag) else gs.to_dag(model)
    abi = d.params
    marks = _markers(abi)
    # markers by shape, compared bit for bit where needed (hashing each tensor's bytes copied 67 MB twice for TRAIN-MFU)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, m in enumerate(marks):
        if any(_same_bits(m, marks[j]) for j in by_shape.get(m.shape, [])):
            raise ValueError("two parameter slots drew the same marker values")
        by_shape.setdefault(m.shape, []).append(i)
    low = gs.lower_dag(d, marks)
    found: dict[int, list[tuple[int, str, str]]] = {}
    for nid, entry in sorted(low.payload.entries.items()):
        for name, arr in entry.items():
            i = next((j for j in by_shape.get(arr.shape, []) if _same_bits(arr, marks[j])), None)
            if i is not None:
                found.setdefault(i, []).append((nid, name, low.graph[nid].kind))
    out = []
    for i, s in enumerate(abi):
        where = found.get(i, [])
        if len(where) != 1:
            raise ValueError(
                f"parameter slot {i} ({s.name} {list(s.shape)}) is stored {len(where)} times verbatim in the "
                "lowered payload (expected once)"
            )
        nid, name, kind = where[0]
        out.append(ParamSlot(i, s.name, tuple(s.shape), nid, name, kind))
    return tuple(out)


# -- parameterising: payload tensors become inputs --------------------------------------------------------------

# kind -> fn(emitter, node, payload entry, new parent ids, {tensor name: input id}) -> the new id of the node's value
Parameteriser = Callable[[Emitter, Node, Mapping[str, np.ndarray], tuple[int, ...], Mapping[str, int]], int]
PARAMETERISE: dict[str, Parameteriser] = {}
# kind -> why its parameters stay in the payload (frozen)
FROZEN: dict[str, str] = {
    "embedding": "no IR op reads an embedding table as an operand: the table stays in the payload (frozen)",
    "conv2d": "no IR op reads conv2d weights as an operand: they stay in the payload (frozen)",
}


def _parameteriser(*kinds: str) -> Callable[[Parameteriser], Parameteriser]:
    def deco(fn: Parameteriser) -> Parameteriser:
        for k in kinds:
            if k in PARAMETERISE:
                raise ValueError(f"parameteriser for {k!r} registered twice")
            PARAMETERISE[k] = fn
        return fn

    return deco


@_parameteriser("const")
def _p_const(
    e: Emitter, node: Node, entry: Mapping[str, np.ndarray], ps: tuple[int, ...], ins: Mapping[str, int]
) -> int:
    return ins["value"]


@_parameteriser("linear")
def _p_linear(
    e: Emitter, node: Node, entry: Mapping[str, np.ndarray], ps: tuple[int, ...], ins: Mapping[str, int]
) -> int:
    # x W^T + b == [x, 1] @ [W^T; b]: the same fold over k, then + 1 * b = b (see the module docstring)
    x = ps[0]
    s = e.shape(x)
    fan_in, out = s[-1], e.shape(ins["weight"])[0]
    rows = math.prod(s[:-1])
    x2 = x if len(s) == 2 else e.op("reshape", x, shape=(rows, fan_in))
    xa = e.op("concat", x2, e.full((rows, 1), 1.0), axis=1)
    wt = e.op("transpose", ins["weight"], dim0=0, dim1=1)
    wa = e.op("concat", wt, e.op("reshape", ins["bias"], shape=(1, out)), axis=0)
    y = e.op("matmul", xa, wa)
    return y if len(s) == 2 else e.op("reshape", y, shape=s[:-1] + (out,))


@_parameteriser("rmsnorm")
def _p_rmsnorm(
    e: Emitter, node: Node, entry: Mapping[str, np.ndarray], ps: tuple[int, ...], ins: Mapping[str, int]
) -> int:
    s = e.shape(ps[0])
    unit = e.op("rmsnorm", ps[0], params={"weight": np.ones(s[-1], F32)}, **dict(node.attrs))
    return e.mul(unit, e.broadcast(ins["weight"], s))


@_parameteriser("layernorm")
def _p_layernorm(
    e: Emitter, node: Node, entry: Mapping[str, np.ndarray], ps: tuple[int, ...], ins: Mapping[str, int]
) -> int:
    s = e.shape(ps[0])
    unit = {"weight": np.ones(s[-1], F32), "bias": np.full(s[-1], -0.0, F32)}  # (d r) 1 + -0 == d r exactly
    n = e.op("layernorm", ps[0], params=unit, **dict(node.attrs))
    return e.add(e.mul(n, e.broadcast(ins["weight"], s)), e.broadcast(ins["bias"], s))


def _input(e: Emitter, shape: Sequence[int]) -> int:
    """Append an ``input`` node of ``shape``; its id."""
    nid = e.b.add("input", (), tuple(shape))
    e.shapes.append(tuple(int(d) for d in shape))
    return nid


def _copy(e: Emitter, node: Node, parents: tuple[int, ...], entry: Any) -> int:
    """Append a copy of ``node`` reading ``parents`` (its declared shape: the lowered graph is shape-checked)."""
    nid = e.b.add(node.kind, parents, node.out_shape, params=entry, **dict(node.attrs))
    e.shapes.append(node.out_shape)
    return nid


@dataclass(frozen=True)
class Parameterised:
    """A lowered model whose trainable parameters are inputs: graph, payload (frozen tensors and constants), the
    model input and output ids, the trainable slots with their input ids, and the frozen slots with the reason."""

    graph: Graph
    payload: Payload
    x: int
    output: int
    slots: tuple[ParamSlot, ...]  # trainable, in ABI order
    inputs: tuple[int, ...]  # the input node of each trainable slot
    frozen: tuple[tuple[ParamSlot, str], ...]
    emitter: Emitter = field(repr=False, compare=False)


def parameterise(
    model: gs.Graph | gs.Dag, params: Sequence[Any], rules: Mapping[str, Parameteriser] | None = None
) -> Parameterised:
    """``model`` lowered with ``params`` (its ABI list), every slot of a :data:`PARAMETERISE` op an input node (in ABI
    order, right after the model input), the others frozen in the payload. ``rules`` replaces the table (planted
    bugs only)."""
    rules = PARAMETERISE if rules is None else rules
    slots = param_slots(model)
    low = gs.lower(model, params)
    g, payload = low.graph, low.payload
    if [n.id for n in g.nodes if n.kind == "input"] != [0]:
        raise ValueError("a GraphSpec model has one input, node 0")
    by_node: dict[int, dict[str, ParamSlot]] = {}
    for s in slots:
        by_node.setdefault(s.node, {})[s.tensor] = s
    b = GraphBuilder()
    e = Emitter(b, [])
    x = _input(e, g[0].out_shape)
    trainable = [s for s in slots if s.kind in rules]
    inputs = tuple(_input(e, s.shape) for s in trainable)
    at = {(s.node, s.tensor): i for s, i in zip(trainable, inputs, strict=True)}
    frozen = tuple(
        (s, FROZEN.get(s.kind, f"{s.kind} has no parameteriser: its tensors stay in the payload"))
        for s in slots
        if s.kind not in rules
    )
    new: dict[int, int] = {0: x}
    for node in g.nodes[1:]:
        ps = tuple(new[p] for p in node.parents)
        entry = payload.get(node.id)
        held = by_node.get(node.id, {})
        if held and node.kind in rules:
            if set(held) != set(entry or {}):
                raise ValueError(f"node {node.id} ({node.kind}): only {sorted(held)} of its tensors are parameters")
            new[node.id] = rules[node.kind](e, node, entry, ps, {name: at[(node.id, name)] for name in held})
        else:
            new[node.id] = _copy(e, node, ps, entry)
        if e.shape(new[node.id]) != node.out_shape:
            raise ValueError(
                f"node {node.id} ({node.kind}): parameterised shape {e.shape(new[node.id])} != {node.out_shape}"
            )
    pg, pp = b.build()
    return Parameterised(pg, pp, x, new[low.output], tuple(trainable), inputs, frozen, e)


# -- losses ------------------------------------------------------------------------------------------------------

Loss = Callable[[Emitter, int], tuple[int, int]]  # (emitter, output id) -> (target input id, loss id)
LOSSES: dict[str, Loss] = {}


def _mean_groups(n: int) -> list[int]:
    """The group sizes of the tree of means over n values: the largest divisor <= 64 each time (all when none)."""
    out = []
    while n > 1:
        g = max(d for d in range(1, min(n, 64) + 1) if n % d == 0)
        g = n if g == 1 else g
        out.append(g)
        n //= g
    return out


def _mse(e: Emitter, y: int) -> tuple[int, int]:
    shape = e.shape(y)
    t = _input(e, shape)
    d = e.sub(y, t)
    sq = e.mul(d, d)
    cols = shape[-1] if shape else 1
    rows = math.prod(shape[:-1]) if shape else 1
    v = e.op("reduceMean", e.op("reshape", sq, shape=(rows, cols)), axis=-1, keepdim=False)  # (rows,)
    n = rows
    for g in _mean_groups(rows):
        v = e.op("reduceMean", e.op("reshape", v, shape=(n // g, g)), axis=-1, keepdim=False)
        n //= g
    return t, e.op("reshape", v, shape=())


LOSSES["mse"] = _mse


# -- optimizers ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Optimizer:
    """An optimizer by name with its hyperparameters (binary32 constants of the update)."""

    name: str
    lr: float
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    @property
    def state(self) -> tuple[str, ...]:
        """The names of its per-parameter state tensors (zeros at step 0)."""
        return OPTIMIZERS[self.name].state

    @property
    def scalars(self) -> tuple[str, ...]:
        """The names of its per-step scalar inputs."""
        return OPTIMIZERS[self.name].scalars


# (emitter, optimizer, param id, grad id, state ids, scalar ids) -> (new param id, new state ids)
Emit = Callable[[Emitter, Optimizer, int, int, tuple[int, ...], Mapping[str, int]], tuple[int, tuple[int, ...]]]


@dataclass(frozen=True)
class OptimizerKind:
    """How one optimizer updates a parameter: its state names, per-step scalars (name -> value at step t, float64),
    the IR nodes of its update, and the same update in NumPy binary32 (the reference the contract compares with)."""

    name: str
    state: tuple[str, ...]
    scalars: tuple[str, ...]
    scalar_values: Callable[[Optimizer, int], dict[str, float]]
    emit: Emit
    reference: Callable[[Optimizer, np.ndarray, np.ndarray, tuple[np.ndarray, ...], Mapping[str, float]], tuple]


OPTIMIZERS: dict[str, OptimizerKind] = {}


def _sgd_emit(
    e: Emitter, o: Optimizer, p: int, g: int, st: tuple[int, ...], sc: Mapping[str, int]
) -> tuple[int, tuple[int, ...]]:
    return e.sub(p, e.mul(g, e.full(e.shape(p), o.lr))), ()


def _sgd_ref(o: Optimizer, p: np.ndarray, g: np.ndarray, st: tuple, sc: Mapping[str, float]) -> tuple:
    return p - g * F32(o.lr), ()


def _adam_scalars(o: Optimizer, t: int) -> dict[str, float]:
    return {"c1": 1.0 / (1.0 - o.b1 ** (t + 1)), "c2": 1.0 / (1.0 - o.b2 ** (t + 1))}


def _adam_emit(
    e: Emitter, o: Optimizer, p: int, g: int, st: tuple[int, ...], sc: Mapping[str, int]
) -> tuple[int, tuple[int, ...]]:
    s = e.shape(p)
    m, v = st
    m2 = e.add(e.mul(m, e.full(s, o.b1)), e.mul(g, e.full(s, 1.0 - o.b1)))
    v2 = e.add(e.mul(v, e.full(s, o.b2)), e.mul(e.mul(g, g), e.full(s, 1.0 - o.b2)))
    mh = e.mul(m2, e.broadcast(sc["c1"], s))
    vh = e.mul(v2, e.broadcast(sc["c2"], s))
    step = e.div(e.mul(mh, e.full(s, o.lr)), e.add(e.op("sqrt", vh), e.full(s, o.eps)))
    return e.sub(p, step), (m2, v2)


def _adam_ref(o: Optimizer, p: np.ndarray, g: np.ndarray, st: tuple, sc: Mapping[str, float]) -> tuple:
    m, v = st
    m2 = m * F32(o.b1) + g * F32(1.0 - o.b1)
    v2 = v * F32(o.b2) + (g * g) * F32(1.0 - o.b2)
    mh, vh = m2 * F32(sc["c1"]), v2 * F32(sc["c2"])
    return p - (mh * F32(o.lr)) / (np.sqrt(vh) + F32(o.eps)), (m2, v2)


OPTIMIZERS["sgd"] = OptimizerKind("sgd", (), (), lambda o, t: {}, _sgd_emit, _sgd_ref)
OPTIMIZERS["adam"] = OptimizerKind("adam", ("m", "v"), ("c1", "c2"), _adam_scalars, _adam_emit, _adam_ref)


def optimizer(name: str, **hyper: float) -> Optimizer:
    """The optimizer ``name`` (``sgd`` or ``adam``) with its hyperparameters; ValueError names the known ones."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; known: {sorted(OPTIMIZERS)}")
    return Optimizer(name, **{k: float(v) for k, v in hyper.items()})


def update_reference(
    o: Optimizer, p: np.ndarray, g: np.ndarray, state: tuple[np.ndarray, ...], t: int
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The update of step t in NumPy binary32, op by op as the IR nodes (each op correctly rounded)."""
    kind = OPTIMIZERS[o.name]
    sc = {k: float(F32(v)) for k, v in kind.scalar_values(o, t).items()}
    with np.errstate(all="ignore"):
        newp, newst = kind.reference(
            o, np.asarray(p, F32), np.asarray(g, F32), tuple(np.asarray(s, F32) for s in state), sc
        )
    return np.asarray(newp, F32), tuple(np.asarray(s, F32) for s in newst)


# -- the step graph ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepGraph:
    """One training step as an IR graph, and the loss graph it differentiates (for the float64 checks)."""

    graph: Graph
    payload: Payload
    x: int
    target: int
    params: tuple[int, ...]  # input id of each trainable parameter (ABI order)
    state: tuple[tuple[int, ...], ...]  # per parameter, its optimizer state inputs
    scalars: tuple[tuple[str, int], ...]  # per-step scalar inputs (name, id)
    loss: int
    grads: tuple[int, ...]  # per parameter, its cotangent
    new_params: tuple[int, ...]
    new_state: tuple[tuple[int, ...], ...]
    slots: tuple[ParamSlot, ...]
    frozen: tuple[tuple[ParamSlot, str], ...]
    optimizer: Optimizer
    loss_graph: Graph
    loss_payload: Payload
    loss_ids: tuple[int, int, tuple[int, ...], int]  # (x, target, params, loss) in the loss graph
    rounded: tuple[int, ...] = ()  # consts of the VJP rules holding a real constant rounded to binary32

    @property
    def outputs(self) -> tuple[int, ...]:
        """What a run of the step returns: the loss, the gradients, the new parameters and the new state."""
        return (self.loss, *self.grads, *self.new_params, *(i for s in self.new_state for i in s))


def step_graph(
    model: gs.Graph | gs.Dag,
    params: Sequence[Any],
    opt: Optimizer,
    loss: str = "mse",
    *,
    rules: Mapping[str, VjpRule] | None = None,
    parameterisers: Mapping[str, Parameteriser] | None = None,
    optimizers: Mapping[str, OptimizerKind] | None = None,
) -> StepGraph:
    """The training step of ``model`` (initial ``params`` fix the frozen tensors and the shapes) under ``opt`` and
    ``loss``. ``rules``, ``parameterisers`` and ``optimizers`` replace the VJP rule, parameteriser and optimizer
    tables (planted bugs only). ValueError if reverse mode refuses."""
    pz = parameterise(model, params, parameterisers)
    e = pz.emitter
    target, loss_id = LOSSES[loss](e, pz.output)
    lg, lp = e.b.build()
    back = vjp(lg, lp, outputs=(loss_id,), wrt=pz.inputs, rules=rules)
    if isinstance(back, IRError):
        raise ValueError(f"reverse mode refused the loss graph: {back}")
    assert isinstance(back, Backward)
    b = GraphBuilder()
    b.nodes = list(back.graph.nodes)
    b.payload = {k: dict(v) for k, v in back.payload.entries.items()}
    seed = back.cotangents[0]  # the loss's cotangent: the constant 1
    b.nodes[seed] = b.nodes[seed].replace(kind="const")
    b.payload[seed] = {"value": np.float32(1.0)}
    u = Emitter(b, [n.out_shape for n in b.nodes])
    kind = (OPTIMIZERS if optimizers is None else optimizers)[opt.name]
    scalars = tuple((name, _input(u, ())) for name in kind.scalars)
    state = tuple(tuple(_input(u, u.shape(p)) for _ in kind.state) for p in pz.inputs)
    new_p, new_s = [], []
    for p, gid, st in zip(pz.inputs, back.grads, state, strict=True):
        np_, ns = kind.emit(u, opt, p, gid, st, dict(scalars))
        new_p.append(np_)
        new_s.append(ns)
    g, pl = b.build()
    keep = (loss_id, *back.grads, *new_p, *(i for s in new_s for i in s))
    rw = eliminate_dead_nodes(g, pl, keep)
    m = rw.mapping
    return StepGraph(
        rw.graph,
        rw.payload,
        m[pz.x],
        m[target],
        tuple(m[i] for i in pz.inputs),
        tuple(tuple(m[i] for i in s) for s in state),
        tuple((name, m[i]) for name, i in scalars),
        m[loss_id],
        tuple(m[i] for i in back.grads),
        tuple(m[i] for i in new_p),
        tuple(tuple(m[i] for i in s) for s in new_s),
        pz.slots,
        pz.frozen,
        opt,
        lg,
        lp,
        (pz.x, target, pz.inputs, loss_id),
        tuple(m[i] for i in back.rounded if i in m),
    )


def initial_state(sg: StepGraph, params: Sequence[np.ndarray]) -> list[tuple[np.ndarray, ...]]:
    """The optimizer state at step 0: zeros of each parameter's shape."""
    return [tuple(np.zeros(np.shape(p), F32) for _ in ids) for p, ids in zip(params, sg.state, strict=True)]


def step_scalars(sg: StepGraph, t: int) -> dict[str, np.float32]:
    """The per-step scalars of step ``t`` (from 0), rounded once to binary32."""
    vals = OPTIMIZERS[sg.optimizer.name].scalar_values(sg.optimizer, t)
    return {name: F32(vals[name]) for name, _ in sg.scalars}


def trainable(sg: StepGraph, params: Sequence[Any]) -> list[np.ndarray]:
    """The trainable parameters among a full ABI list."""
    return [np.asarray(params[s.index], F32) for s in sg.slots]


def step_inputs(
    sg: StepGraph, x: Any, target: Any, params: Sequence[Any], state: Sequence[Sequence[Any]], t: int
) -> dict[int, Any]:
    """The step graph's inputs by id: x, the target, the trainable parameters, their state, step t's scalars."""
    ins: dict[int, Any] = {sg.x: x, sg.target: target}
    ins.update(zip(sg.params, params, strict=True))
    for ids, vals in zip(sg.state, state, strict=True):
        ins.update(zip(ids, vals, strict=True))
    sc = step_scalars(sg, t)
    ins.update({i: np.asarray(sc[name], F32) for name, i in sg.scalars})
    return ins


@dataclass(frozen=True)
class StepValues:
    """One step's values: the loss, the gradients, the new parameters and state (host float32 arrays)."""

    loss: np.ndarray
    grads: tuple[np.ndarray, ...]
    params: tuple[np.ndarray, ...]
    state: tuple[tuple[np.ndarray, ...], ...]


def values_of(sg: StepGraph, out: Mapping[int, Any]) -> StepValues:
    """A step run's outputs (by node id, host arrays) as :class:`StepValues`."""

    def f(i: int) -> np.ndarray:
        return np.asarray(out[i], F32)

    return StepValues(
        f(sg.loss),
        tuple(f(i) for i in sg.grads),
        tuple(f(i) for i in sg.new_params),
        tuple(tuple(f(i) for i in s) for s in sg.new_state),
    )


def denote_step(sg: StepGraph, inputs: Mapping[int, Any]) -> StepValues:
    """The step's binary32 meaning: the denotation of its graph (ValueError if it does not denote)."""
    res = denote_all(sg.graph, sg.payload, dict(inputs))
    if isinstance(res, IRError):
        raise ValueError(f"the step graph does not denote: {res}")
    return values_of(sg, dict(enumerate(res.value)))


def loss_real(sg: StepGraph, x: Any, target: Any, params: Sequence[Any]) -> float:
    """The loss's float64 meaning (every op's real function) at float64 ``params`` (off the binary32 grid allowed)."""
    gx, gt, gp, gl = sg.loss_ids
    ins = {gx: np.asarray(x, np.float64), gt: np.asarray(target, np.float64)}
    ins.update({i: np.asarray(p, np.float64) for i, p in zip(gp, params, strict=True)})
    vals, _ = real_all(sg.loss_graph, sg.loss_payload, ins)
    return float(vals[gl])


def gemm_flops(graph: Graph) -> int:
    """2 m n k summed over the graph's matmul nodes (batch axes included): the step's GEMM FLOPs."""
    total = 0
    for n in graph.nodes:
        if n.kind in ("matmul", "bmm"):
            k = graph[n.parents[0]].out_shape[-1]
            total += 2 * math.prod(n.out_shape) * k
    return total


# -- tasks: fixed synthetic problems ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """A fixed synthetic problem: the model, its initial parameters (ABI list), the batch, the targets and the
    optimizer; ``steps`` is how many steps the contract trains it for."""

    name: str
    model: Any
    params: tuple[np.ndarray, ...]
    x: np.ndarray
    target: np.ndarray
    opt: Optimizer
    steps: int
    loss: str = "mse"


def mlp_model(batch: int, d_in: int, hidden: int, d_out: int) -> gs.Graph:
    """Linear -> Tanh -> Linear on a batch of rows (batch, d_in)."""
    return gs.identity((batch, d_in)) >> gs.Linear(d_in, hidden) >> gs.Tanh() >> gs.Linear(hidden, d_out)


def _teacher_target(model: Any, params: Sequence[np.ndarray], x: np.ndarray) -> np.ndarray:
    """The teacher's output: the model's float64 meaning at ``params``, rounded once to binary32."""
    low = gs.lower(model, params)
    vals, _ = real_all(low.graph, low.payload, [np.asarray(x, np.float64)])
    return vals[low.output].astype(F32)


def _scaled(rng: np.random.Generator, abi: Sequence[gs.ParamSpec]) -> list[np.ndarray]:
    """Weights N(0, 1/fan_in) (fan_in: the last axis), biases N(0, 1/16), unit-init slots 1 + N(0, 1/16)."""
    out = []
    for s in abi:
        if s.init == "ones":
            a = 1.0 + 0.25 * rng.standard_normal(s.shape)
        elif s.name == "weight":
            a = rng.standard_normal(s.shape) / math.sqrt(s.shape[-1])
        else:
            a = 0.25 * rng.standard_normal(s.shape)
        out.append(a.astype(F32))
    return out


def _mlp_task(
    batch: int = 16,
    d_in: int = 8,
    hidden: int = 16,
    d_out: int = 4,
    seed: int = 0,
    lr: float = 0.5,
    steps: int = 30,
    teacher: bool = True,
) -> Task:
    model = mlp_model(batch, d_in, hidden, d_out)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, d_in)).astype(F32)
    params = _scaled(rng, model.params)
    if teacher:
        target = _teacher_target(model, _scaled(np.random.default_rng(seed + 1000), model.params), x)
    else:  # large shapes: a fixed random target (its float64 teacher would cost seconds on the host)
        target = rng.standard_normal((batch, d_out)).astype(F32)
    return Task("mlp", model, tuple(params), x, target, optimizer("sgd", lr=lr), steps)


def _decoder_task(
    t: int = 4,
    dm: int = 8,
    heads: int = 2,
    kv: int = 1,
    dh: int = 4,
    ff: int = 16,
    vocab: int = 11,
    seed: int = 0,
    lr: float = 0.02,
    steps: int = 30,
) -> Task:
    block = fd.decoder_block(t=t, dm=dm, heads=heads, kv=kv, dh=dh, ff=ff, vocab=vocab)
    params = fd.decoder_params(block, seed)
    ids = np.random.default_rng(seed).integers(0, vocab, t).astype(F32)
    slots = param_slots(block)
    teacher = list(fd.decoder_params(block, seed + 1000))
    for s in slots:  # the frozen tensors (the embedding table) are the student's: the task is learnable
        if s.kind not in PARAMETERISE:
            teacher[s.index] = params[s.index]
    return Task(
        "decoder", block, tuple(params), ids, _teacher_target(block, teacher, ids), optimizer("adam", lr=lr), steps
    )


TASKS: dict[str, Callable[..., Task]] = {"mlp": _mlp_task, "decoder": _decoder_task}


def task(name: str, **size: Any) -> Task:
    """The task ``name`` (``mlp`` or ``decoder``) at the given sizes; ValueError names the known ones."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    return TASKS[name](**size)
