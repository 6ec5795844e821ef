"""The denotation of a graph on the host, in IEEE binary32, bit for bit.

``denote_all(graph, payload, inputs)`` runs :func:`spec.ir.checks.check_well_formed` first (an ill-formed
graph yields its first error and computes nothing), then is a left fold of :func:`eval_node` over ids
0..n-1: node i reads only the values of its parents (all earlier). ``denote(..., out_id)`` is entry
``out_id`` of that table. Both return :class:`Ok` or an :class:`~spec.ir.checks.IRError` naming the node;
they never raise for a bad graph, payload or input.

Values are float32 NumPy arrays of the node's shape. Every arithmetic result is defined by the project's
references under the ``cuda`` float environment (subnormals kept, NaN results 0x7FFFFFFF): correctly
rounded ops by the integer softfloat (:mod:`spec.softfloat`, :mod:`spec.elementwise`), transcendentals by
the real function in float64 rounded once to binary32 (the ``approx`` references of
:mod:`spec.elementwise`; where that rounding is ambiguous the nearest-even float64 rounding is taken),
folds in the orders of :mod:`spec.reductions`, randomness by :mod:`spec.rng` (SplitMix64). The meaning of
each op is its ``meaning`` line in :mod:`spec.ir.ops`; the evaluators below are registered per op name.

Inputs: one array per ``input`` node, in id order (a single array where there is one input node), or a
mapping from input node id to array; each must have its node's declared shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spec import attention as sattn
from spec import conv as sconv
from spec import norm as snorm
from spec import rng as srng
from spec import softfloat as sf
from spec.elementwise import RefOp, bits_to_f64, f64_to_f32_bits, get_reference
from spec.ir.checks import IRError, check_well_formed, node_attrs
from spec.ir.graph import Graph, Node, Payload, format_shape
from spec.ir.ops import ELEMENTWISE_OP_NAMES, get_op
from spec.reductions import fold_left, mean_of

__all__ = [
    "Ok",
    "EVALUATORS",
    "register_evaluator",
    "denote_all",
    "denote",
    "eval_node",
    "EvalError",
    "bits",
    "floats",
    "normalise_inputs",
    "rope_tables",
    "attention_operands",
    "kv_lens_of",
    "erf64",
]

ENV = "cuda"


@dataclass(frozen=True)
class Ok:
    """A successful evaluation: ``value`` is one float32 array or a tuple of them (one per node)."""

    value: Any


class EvalError(ValueError):
    """Raised inside an evaluator for a value the op cannot evaluate; turned into an IRError at the node."""


def bits(a: np.ndarray) -> np.ndarray:
    """The uint32 bit patterns of a float32 array (a contiguous copy)."""
    return _c(a, dtype=np.float32).view(np.uint32).copy()


def floats(u: np.ndarray) -> np.ndarray:
    """The float32 array of uint32 bit patterns."""
    return _c(u, dtype=np.uint32).view(np.float32)


def _c(a: Any, dtype: Any = None) -> np.ndarray:
    """A C-contiguous copy that keeps 0-d arrays 0-d (np.ascontiguousarray makes them 1-d)."""
    return np.array(a, dtype=dtype, order="C", copy=True)


Evaluator = Callable[[Node, dict[str, Any], list[np.ndarray], Mapping[str, np.ndarray] | None], np.ndarray]
EVALUATORS: dict[str, Evaluator] = {}


def register_evaluator(*names: str) -> Callable[[Evaluator], Evaluator]:
    """Decorator: the evaluator of the ops ``names`` (bits in, bits out)."""

    def deco(fn: Evaluator) -> Evaluator:
        for name in names:
            if name in EVALUATORS:
                raise ValueError(f"evaluator for {name!r} registered twice")
            EVALUATORS[name] = fn
        return fn

    return deco


def _bc(u: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return _c(np.broadcast_to(u, shape))


def _full(shape: tuple[int, ...], b: int) -> np.ndarray:
    return np.full(shape, b, dtype=np.uint32)


def _f32_bits(x: float) -> int:
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def _approx(fn: Callable[..., Any], *us: np.ndarray) -> np.ndarray:
    """Real function in float64, rounded once to binary32, NaN -> env NaN (the nearest-even choice)."""
    return RefOp("ir", len(us), "approx", fn).evaluate(*us, env=ENV).bits.astype(np.uint32)


# -- leaves ---------------------------------------------------------------------------------------------


@register_evaluator("const")
def _const(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    return bits(entry["value"]).reshape(node.out_shape)


@register_evaluator("randUniform", "bernoulliMask")
def _random(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    n = math.prod(node.out_shape)
    u = srng.uniform_reference(srng.draw_words(a["seed"], a["counter"], n)[:, 0]).reshape(node.out_shape)
    if node.kind == "randUniform":
        return u
    mask = srng.mask_reference(u.reshape(-1), _f32_bits(a["keep_prob"]))
    return np.where(mask != 0, np.uint32(srng.ONE_BITS), np.uint32(0)).astype(np.uint32).reshape(node.out_shape)


# -- elementwise ----------------------------------------------------------------------------------------

_REF_NAMES: dict[str, str] = ELEMENTWISE_OP_NAMES


def _reference_op(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    ref = get_reference(_REF_NAMES[node.kind])
    flat = [x.reshape(-1) for x in args]
    return ref.evaluate(*flat, env=ENV).bits.astype(np.uint32).reshape(args[0].shape)


for _name in _REF_NAMES:
    register_evaluator(_name)(_reference_op)


def _silu64(x: Any) -> Any:
    e = np.exp(-np.abs(x))
    return x * np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


_ERF = np.frompyfunc(math.erf, 1, 1)


def erf64(x: Any) -> Any:
    """The real erf of float64 values (math.erf elementwise), as the erf op's denotation rounds it once."""
    return np.asarray(_ERF(np.asarray(x, np.float64)), dtype=np.float64)


_REAL: dict[str, Callable[..., Any]] = {
    "erf": erf64,
    "pow": np.power,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "sin": np.sin,
    "cos": np.cos,
    "silu": _silu64,
}


def _real_op(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    flat = [x.reshape(-1) for x in args]
    return _approx(_REAL[node.kind], *flat).reshape(args[0].shape)


for _name in _REAL:
    register_evaluator(_name)(_real_op)


# -- data movement (bit copies) -------------------------------------------------------------------------


@register_evaluator("input")
def _input(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:  # pragma: no cover - handled by the fold
    raise EvalError("input nodes take their value from the inputs")


@register_evaluator("reshape", "flatten")
def _reshape(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    return _c(args[0]).reshape(node.out_shape)


@register_evaluator("concat")
def _concat(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    return _c(np.concatenate(args, axis=a["axis"]))


@register_evaluator("permute")
def _permute(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    return _c(np.transpose(args[0], a["perm"]))


@register_evaluator("transpose")
def _transpose(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    return _c(np.swapaxes(args[0], a["dim0"], a["dim1"]))


@register_evaluator("slice")
def _slice(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    x = args[0]
    idx = [slice(None)] * x.ndim
    idx[a["axis"]] = slice(a["start"], a["stop"], a["step"])
    return _c(x[tuple(idx)])


@register_evaluator("where")
def _where(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    cond, x, y = args
    return _c(np.where(floats(cond) != 0, x, y))


@register_evaluator("broadcastTo", "expand")
def _broadcast(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    return _bc(args[0], node.out_shape)


# -- reductions -----------------------------------------------------------------------------------------


def _axis_fold(fn: Callable[..., Any], x: np.ndarray) -> np.ndarray:
    """A spec.reductions fold along the last axis, shaped x.shape[:-1] (the folds return 1-d for 0-d)."""
    return np.asarray(fn(x, env=ENV), dtype=np.uint32).reshape(x.shape[:-1])


def _to_last(x: np.ndarray, axis: int) -> np.ndarray:
    return _c(np.moveaxis(x, axis, -1))


@register_evaluator("reduceSum", "reduceMean")
def _reduce(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    x = args[0]
    ax = a["axis"] % x.ndim
    acc = _axis_fold(fold_left, _to_last(x, ax))
    if node.kind == "reduceMean":
        acc = np.asarray(mean_of(acc, x.shape[ax], env=ENV)).reshape(acc.shape)
    acc = np.asarray(acc, dtype=np.uint32)
    return acc.reshape(node.out_shape)


@register_evaluator("sum")
def _sum(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    return np.asarray(fold_left(args[0].reshape(1, -1), env=ENV), dtype=np.uint32).reshape(())


# -- contractions ---------------------------------------------------------------------------------------


def _dot_fold(
    lhs: Callable[[int], np.ndarray], rhs: Callable[[int], np.ndarray], k: int, shape: tuple[int, ...]
) -> np.ndarray:
    """fold_k(+0, lhs(k) * rhs(k)) with the product and the sum each rounded, k ascending."""
    acc = _full(shape, 0)
    for kk in range(k):
        acc = sf.add(acc, sf.mul(_bc(lhs(kk), shape), _bc(rhs(kk), shape), env=ENV), env=ENV)
    return acc


@register_evaluator("linear")
def _linear(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    x, w, b = args[0], bits(entry["weight"]), bits(entry["bias"])
    shape = node.out_shape
    acc = _dot_fold(lambda k: x[..., k : k + 1], lambda k: w[:, k], x.shape[-1], shape)
    return sf.add(acc, _bc(b, shape), env=ENV).reshape(shape)


@register_evaluator("matmul", "bmm")
def _matmul(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    x, y = args
    return _dot_fold(
        lambda k: x[..., :, k : k + 1], lambda k: y[..., k : k + 1, :], x.shape[-1], node.out_shape
    ).reshape(node.out_shape)


def _pair(v: Any) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (v[0], v[1])


@register_evaluator("conv2d")
def _conv2d(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    # One meaning per op: the IR's conv2d is the conv family's spec (spec.conv.conv, rank 2, groups 1), which
    # native.conv's direct kernel matches bit for bit (contracts/conv-pool-v1.yaml).
    x = args[0]
    lead = x.shape[:-3]
    y = sconv.conv(
        # the batch count spelled out: a zero-width input (padding makes its windows) has no -1 to infer
        x.reshape((int(np.prod(lead, dtype=np.int64)),) + x.shape[-3:]),
        bits(entry["weight"]),
        bits(entry["bias"]),
        stride=_pair(a["stride"]),
        padding=_pair(a["padding"]),
        dilation=_pair(a["dilation"]),
    )
    return _c(y.reshape(lead + y.shape[1:]))


@register_evaluator("pool")
def _pool(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    # The pool family's spec: IEEE maximum fold from -Inf, or fold from +0 then one division by kh * kw.
    k, st, p = _pair(a["kernel"]), _pair(a["stride"]), _pair(a["padding"])
    if a["mode"] == "max":
        return _c(sconv.max_pool2d(args[0], k, st, p)[0])
    return _c(sconv.avg_pool2d(args[0], k, st, p))


# -- normalisations -------------------------------------------------------------------------------------


# The normalisations are the norm family's spec (spec.norm: the same folds, the same once-rounded exp and
# rsqrt), which native.norm's host path matches bit for bit (contracts/norm-softmax-v1.yaml).


@register_evaluator("softmax")
def _softmax(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    ax = a["axis"] % args[0].ndim
    x = _to_last(args[0], ax)
    return _c(np.moveaxis(snorm.softmax(x).reshape(x.shape), -1, ax))


@register_evaluator("layernorm")
def _layernorm(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    x = args[0]
    return _c(snorm.layernorm(x, bits(entry["weight"]), bits(entry["bias"]), a["eps"]).reshape(x.shape))


@register_evaluator("rmsnorm")
def _rmsnorm(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    return _c(snorm.rmsnorm(args[0], bits(entry["weight"]), a["eps"]).reshape(args[0].shape))


# -- attention ------------------------------------------------------------------------------------------


def kv_lens_of(lens: Any, seq_k: int, where: str = "attention") -> np.ndarray:
    """An attention node's kv_lens operand (float32 values) as int64 key lengths; EvalError unless each is an
    integer in [0, seq_k]."""
    f = np.asarray(lens, np.float64).reshape(-1)
    ok = np.isfinite(f) & (f == np.floor(f)) & (f >= 0) & (f <= seq_k)
    if not ok.all():
        bad = float(f[int(np.argmin(ok))])
        raise EvalError(f"{where}: kv_lens value {bad!r} is not an integer in [0, {seq_k}]")
    return f.astype(np.int64)


def attention_operands(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, lens: np.ndarray | None, where: str = "attention"
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """q, k, v (float64) and kv_lens (int64 or None) of an attention node, as spec.attention's functions take them.

    kv_lens (the optional 4th operand, float32) must hold integers in [0, Lk] (EvalError otherwise). With no key at
    all (Lk = 0) every row is fully masked: one blocked key is appended (blocked keys weigh exactly 0 in the
    family's meaning), because spec.attention's row max needs a non-empty key axis.
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, lk = k.shape[0], k.shape[2]
    kv = None if lens is None else kv_lens_of(lens, lk, where)
    if lk == 0:
        pad = np.zeros(k.shape[:2] + (1,) + k.shape[3:], np.float64)
        k, v, kv = pad, pad, np.zeros(b, np.int64)
    return q, k, v, kv


@register_evaluator("attention")
def _attention(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    # One meaning per op: the attention family's spec, spec.attention.sdpa (float64; the family has no binary32
    # spec), called here and rounded once to binary32. native.attention's kernels agree with it within
    # spec.attention.forward_bound (contracts/attention-v1.yaml, ATT-FWD-bound), the IR executor's rule too.
    q, k, v = (bits_to_f64(np.asarray(x, np.uint32)) for x in args[:3])
    q, k, v, lens = attention_operands(q, k, v, floats(args[3]) if len(args) == 4 else None)
    y = sattn.sdpa(q, k, v, causal=bool(a["causal"]), kv_lens=lens, scale=a["scale"])
    u = f64_to_f32_bits(np.asarray(y, np.float64))
    return _c(np.where(np.isnan(y), np.uint32(0x7FFFFFFF), u).astype(np.uint32))


@register_evaluator("embedding")
def _embedding(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    idx = floats(args[0]).astype(np.float64)
    table = bits(entry["table"])
    ok = np.isfinite(idx) & (idx == np.floor(idx)) & (idx >= 0) & (idx < table.shape[0])
    if not ok.all():
        bad = float(idx.reshape(-1)[int(np.argmin(ok.reshape(-1)))])
        raise EvalError(f"embedding index {bad!r} is not an integer in [0, {table.shape[0]})")
    return _c(table[idx.astype(np.int64)])


def rope_tables(t_len: int, dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """RoPE's (T, D/2) cos and sin tables as binary32 bits: theta = t * base^(-2i/D) in float64, each rounded once."""
    theta = (
        np.arange(t_len, dtype=np.float64)[:, None]
        * np.power(float(base), -(2.0 * np.arange(dim // 2, dtype=np.float64)) / dim)[None, :]
    )
    # theta is float64, not binary32 bits: the tables are cos/sin of it rounded once (nearest even), not _approx's
    # evaluation of bit patterns (which read theta = 1.0 as the subnormal 1e-45 and gave cos 1, sin ~0)
    with np.errstate(all="ignore"):
        return f64_to_f32_bits(np.cos(theta)).astype(np.uint32), f64_to_f32_bits(np.sin(theta)).astype(np.uint32)


@register_evaluator("rope")
def _rope(node: Node, a: dict, args: list, entry: Any) -> np.ndarray:
    x = args[0]
    dim = x.shape[-1]
    c, s = rope_tables(x.shape[-2], dim, a["base"])
    half = x.shape[:-1] + (dim // 2,)
    x0, x1 = _c(x[..., 0::2]), _c(x[..., 1::2])
    cb, sb = _bc(c, half), _bc(s, half)
    y0 = sf.sub(sf.mul(x0, cb, env=ENV), sf.mul(x1, sb, env=ENV), env=ENV)
    y1 = sf.add(sf.mul(x0, sb, env=ENV), sf.mul(x1, cb, env=ENV), env=ENV)
    out = np.empty(x.shape, dtype=np.uint32)
    out[..., 0::2], out[..., 1::2] = y0, y1
    return out


# -- the fold -------------------------------------------------------------------------------------------


def normalise_inputs(graph: Graph, inputs: Any) -> dict[int, np.ndarray] | IRError:
    """Inputs as {input node id: float32 array}, each of its node's declared shape, or the first error."""
    ids = graph.input_ids()
    if isinstance(inputs, Mapping):
        given = {int(k): v for k, v in inputs.items()}
    elif isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
        given = {ids[0]: inputs} if len(ids) == 1 and inputs is not None else {}
    else:
        given = dict(zip(ids, inputs, strict=False))
    out: dict[int, np.ndarray] = {}
    for i in ids:
        node = graph.nodes[i]
        if i not in given:
            return IRError("input", i, "input", f"no input array for input node {i}", declared=node.out_shape)
        arr = np.asarray(given[i])
        arr = arr.view(np.float32) if arr.dtype == np.uint32 else arr.astype(np.float32)
        if tuple(arr.shape) != node.out_shape:
            return IRError(
                "input",
                i,
                "input",
                f"input array has shape {format_shape(arr.shape)}",
                declared=node.out_shape,
                inferred=tuple(arr.shape),
            )
        out[i] = _c(arr)
    return out


def eval_node(
    graph: Graph, payload: Payload, values: list[np.ndarray], node: Node, inputs: Mapping[int, np.ndarray]
) -> np.ndarray | IRError:
    """The value of one node from its parents' values (bits), or an error at that node."""
    op = get_op(node.kind)
    if node.kind == "input":
        return bits(inputs[node.id])
    fn = EVALUATORS.get(node.kind)
    if op is None or fn is None:
        return IRError("unknown-op", node.id, node.kind, f"unsupported operator {node.kind!r} in the denotation")
    entry = payload.get(node.id) if op.payload else None
    if op.payload and entry is None:
        return IRError("missing-payload", node.id, node.kind, f"no payload entry for {op.payload} node {node.id}")
    args = [values[p] for p in node.parents]
    try:
        with np.errstate(all="ignore"):
            out = np.asarray(fn(node, node_attrs(node, op), args, entry), dtype=np.uint32)
    except EvalError as e:
        return IRError("value", node.id, node.kind, str(e))
    except (KeyError, ValueError, IndexError, TypeError) as e:
        return IRError(
            "value",
            node.id,
            node.kind,
            f"cannot evaluate: {type(e).__name__}: {e}",
            declared=node.out_shape,
            parent_shapes=tuple(v.shape for v in args),
        )
    if tuple(out.shape) != node.out_shape:
        return IRError(
            "shape-mismatch",
            node.id,
            node.kind,
            "value shape differs from the declared shape",
            declared=node.out_shape,
            inferred=tuple(out.shape),
        )
    return out


def denote_all(graph: Graph, payload: Payload | None, inputs: Any) -> Ok | IRError:
    """Every node's value (float32 arrays, by id) or the first error; checks well-formedness first."""
    return _fold(graph, payload, inputs, len(graph.nodes))


def _fold(graph: Graph, payload: Payload | None, inputs: Any, stop: int) -> Ok | IRError:
    """Values of nodes 0..stop-1 as a left fold of eval_node over ids (the whole graph must be well formed)."""
    wf = check_well_formed(graph)
    if wf:
        return wf[0]
    payload = payload if payload is not None else Payload()
    ins = normalise_inputs(graph, inputs)
    if isinstance(ins, IRError):
        return ins
    values: list[np.ndarray] = []
    for node in graph.nodes[:stop]:
        v = eval_node(graph, payload, values, node, ins)
        if isinstance(v, IRError):
            return v
        values.append(v)
    return Ok(tuple(floats(v) for v in values))


def denote(graph: Graph, payload: Payload | None, inputs: Any, out_id: int | None = None) -> Ok | IRError:
    """The value of node ``out_id`` (default: the last node), or the first error."""
    target = len(graph.nodes) - 1 if out_id is None else out_id
    if not 0 <= target < len(graph.nodes):
        return IRError("output", None, None, f"output id {out_id} is not a node (0..{len(graph.nodes) - 1})")
    res = _fold(graph, payload, inputs, target + 1)
    return res if isinstance(res, IRError) else Ok(res.value[target])
