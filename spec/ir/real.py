"""The real (float64) meaning of a graph, with a first-order running bound on its binary32 denotation's error.

``real_all(graph, payload, inputs)`` evaluates every node in float64 (each op's real function, no rounding: the
meaning the denotation rounds op by op) and, beside each value ``v``, a bound ``err`` with
``|denotation - v| <= err`` to first order in u = 2^-24 (running error analysis): each op's bound is its
operands' bounds carried through the op's derivative magnitudes (|f'(x)| e for a unary f; |b| ea + |a| eb for a
product; the sum of the bounds for a sum) plus its own rounding, u |v| + 2^-149 for one rounding (exact and
once-rounded ops alike), gamma_n = n u / (1 - n u) of the absolute sum for an n-term fold, the norm family's
stated internal roundings for softmax/layernorm/rmsnorm. Inputs and constants are exact (err 0). The bound is
first order: the reverse-mode check (``falsification.ir_vjp_tests``) allows twice it.

Ops: every IR op.
Used to check :mod:`spec.ir.vjp` (central differences of the forward meaning; the backward graph's meaning).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np

from spec import attention as sattn
from spec.elementwise import GELU_C, GELU_K
from spec.ir.checks import node_attrs
from spec.ir.denote import EVALUATORS, attention_operands, erf64, floats
from spec.ir.graph import Graph, Node, Payload
from spec.ir.ops import get_op

__all__ = ["RealError", "REAL", "real_all", "U", "TINY"]

U = 2.0**-24
TINY = 2.0**-149  # one rounding's absolute floor (subnormal results)


class RealError(ValueError):
    """The graph has an op without a float64 meaning here."""


Pair = tuple[np.ndarray, np.ndarray]
RealFn = Callable[[Node, dict[str, Any], list[Pair], Mapping[str, np.ndarray] | None, float], Pair]
REAL: dict[str, RealFn] = {}


def _reg(*names: str) -> Callable[[RealFn], RealFn]:
    def deco(fn: RealFn) -> RealFn:
        for name in names:
            REAL[name] = fn
        return fn

    return deco


def _round(v: np.ndarray, u: float) -> np.ndarray:
    """One rounding's error bound at value v (unit roundoff u; u = 0: no rounding); an infinite value rounds to
    itself (x + -Inf with a constant -Inf, as an additive causal mask: its u |v| = Inf made a masked softmax's
    bound Inf and NaN, 0 * Inf, everywhere after it)."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(v), 0.0, u * np.abs(v) + (TINY if u else 0.0))


def _gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


# -- leaves and data movement (exact copies: errors move with the values) --------------------------------


@_reg("randUniform", "bernoulliMask")
def _exact_leaf(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    # the denotation's own value: exact binary32 data
    v = floats(np.asarray(EVALUATORS[node.kind](node, a, [], entry), np.uint32)).astype(np.float64)
    return v, np.zeros_like(v)


@_reg("const")
def _const(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    # float64, not through the binary32 denotation: central differences move a constant off the binary32 grid
    v = np.asarray(entry["value"], np.float64).reshape(node.out_shape)
    return v, np.zeros_like(v)


@_reg("embedding")
def _embedding(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    table = np.asarray(entry["table"], np.float64)
    idx = np.asarray(args[0][0], np.float64)
    if not np.all((idx == np.floor(idx)) & (idx >= 0) & (idx < table.shape[0])):
        raise RealError(f"node {node.id}: embedding indices are not integers in [0, {table.shape[0]})")
    v = table[idx.astype(np.int64)]
    return v, np.zeros_like(v)  # a row copy


def _move(fn: Callable[[np.ndarray], np.ndarray]) -> RealFn:
    def f(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
        return fn(args[0][0], a, node), fn(args[0][1], a, node)

    return f


REAL["reshape"] = REAL["flatten"] = _move(lambda x, a, n: np.reshape(x, n.out_shape))
REAL["permute"] = _move(lambda x, a, n: np.transpose(x, a["perm"]))
REAL["transpose"] = _move(lambda x, a, n: np.swapaxes(x, a["dim0"], a["dim1"]))
REAL["broadcastTo"] = REAL["expand"] = _move(lambda x, a, n: np.broadcast_to(x, n.out_shape).copy())


def _slice_of(x: np.ndarray, a: dict, n: Node) -> np.ndarray:
    idx = [slice(None)] * x.ndim
    idx[a["axis"]] = slice(a["start"], a["stop"], a["step"])
    return x[tuple(idx)]


REAL["slice"] = _move(_slice_of)


@_reg("concat")
def _concat(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    return np.concatenate([v for v, _ in args], a["axis"]), np.concatenate([e for _, e in args], a["axis"])


@_reg("where")
def _where(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    (c, _), (x, ex), (y, ey) = args
    return np.where(c != 0, x, y), np.where(c != 0, ex, ey)


# -- elementwise ----------------------------------------------------------------------------------------


def _binary(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    (x, ex), (y, ey) = args
    k = node.kind
    if k == "add":
        v, e = x + y, ex + ey
    elif k == "sub":
        v, e = x - y, ex + ey
    elif k == "mul_elem":
        v, e = x * y, np.abs(y) * ex + np.abs(x) * ey + ex * ey
    elif k == "div":
        v, e = x / y, ex / np.abs(y) + np.abs(x / (y * y)) * ey
    elif k == "maxElem":
        v, e = np.fmax(x, y), np.where(x > y, ex, ey)
    elif k == "minElem":
        v, e = np.fmin(x, y), np.where(x < y, ex, ey)
    else:  # pow
        v = np.power(x, y)
        e = np.abs(y * np.power(x, y - 1)) * ex + np.abs(v * np.log(np.abs(x))) * ey
    return v, e + _round(v, u)


for _k in ("add", "sub", "mul_elem", "div", "maxElem", "minElem", "pow"):
    REAL[_k] = _binary


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(GELU_K * (x + GELU_C * x**3)))


def _gelu_d(x: np.ndarray) -> np.ndarray:
    t = np.tanh(GELU_K * (x + GELU_C * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x)


# op -> (real function, its derivative): the error carried through is |f'(x)| e
_UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]] = {
    "neg": (np.negative, lambda x: np.ones_like(x)),
    "abs": (np.abs, lambda x: np.ones_like(x)),
    "relu": (lambda x: np.maximum(x, 0.0), lambda x: (x > 0).astype(np.float64)),
    "sqrt": (np.sqrt, lambda x: 0.5 / np.sqrt(x)),
    "inv": (lambda x: 1.0 / x, lambda x: 1.0 / (x * x)),
    "rsqrt": (lambda x: 1.0 / np.sqrt(x), lambda x: 0.5 / (x * np.sqrt(x))),
    "exp": (np.exp, np.exp),
    "log": (np.log, lambda x: 1.0 / x),
    "sin": (np.sin, np.cos),
    "cos": (np.cos, np.sin),
    "tanh": (np.tanh, lambda x: 1.0 - np.tanh(x) ** 2),
    "sigmoid": (_sigmoid, lambda x: _sigmoid(x) * (1.0 - _sigmoid(x))),
    "silu": (lambda x: x * _sigmoid(x), lambda x: _sigmoid(x) * (1.0 + x * (1.0 - _sigmoid(x)))),
    "gelu": (_gelu, _gelu_d),
    "erf": (erf64, lambda x: 2.0 / math.sqrt(math.pi) * np.exp(-x * x)),
}


def _unary(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    x, ex = args[0]
    f, df = _UNARY[node.kind]
    v = f(x)
    exact_copy = node.kind in ("neg", "abs")  # a sign-bit operation does not round
    return v, np.abs(df(x)) * ex + (0.0 if exact_copy else _round(v, u))


for _k in _UNARY:
    REAL[_k] = _unary


# -- reductions and contractions ------------------------------------------------------------------------


@_reg("reduceSum", "reduceMean", "sum")
def _reduce(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    x, ex = args[0]
    if node.kind == "sum":
        x, ex, ax = x.reshape(-1), ex.reshape(-1), 0
    else:
        ax = a["axis"] % x.ndim
    n = x.shape[ax] if x.ndim else 1
    v, e = x.sum(ax), ex.sum(ax) + _gamma(max(n - 1, 0), u) * np.abs(x).sum(ax)
    if node.kind == "reduceMean":
        v, e = v / n, e / n + _round(v / n, u)
    return v.reshape(node.out_shape), e.reshape(node.out_shape)


@_reg("linear")
def _linear(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    x, ex = args[0]
    w, b = np.asarray(entry["weight"], np.float64), np.asarray(entry["bias"], np.float64)
    v = x @ w.T + b
    k = w.shape[1]
    e = ex @ np.abs(w).T + _gamma(k + 1, u) * (np.abs(x) @ np.abs(w).T + np.abs(b))
    return v, e + _round(0.0 * v, u)


@_reg("matmul", "bmm")
def _matmul(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    (x, ex), (y, ey) = args
    k = x.shape[-1]
    ax, ay = np.abs(x), np.abs(y)
    return x @ y, ex @ ay + ax @ ey + ex @ ey + _gamma(k, u) * (ax @ ay) + _round(0.0 * ax @ ay, u)


# -- normalisations -------------------------------------------------------------------------------------


def _rowmax(e: np.ndarray) -> np.ndarray:
    return e.max(-1, keepdims=True) if e.shape[-1] else np.zeros(e.shape[:-1] + (1,))


@_reg("softmax")
def _softmax(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    # dy_i = y_i (dx_i - sum_j y_j dx_j): at most 2 y_i max|dx|; own roundings: sub, exp, the fold, the division
    ax = a["axis"] % args[0][0].ndim
    x, ex = (np.moveaxis(t, ax, -1) for t in args[0])
    n = x.shape[-1]
    z = np.exp(x - _rowmax(x))  # a softmax over an empty axis is empty (x.max has no identity there)
    y = z / z.sum(-1, keepdims=True)
    e = 2.0 * y * _rowmax(ex) + _gamma(n + 4, u) * y + _round(0.0 * y, u)
    return np.moveaxis(y, -1, ax), np.moveaxis(e, -1, ax)


def _norm(
    x: np.ndarray, ex: np.ndarray, w: np.ndarray, eps: float, centred: bool, u: float
) -> tuple[np.ndarray, np.ndarray]:
    n = x.shape[-1]
    d = x - x.mean(-1, keepdims=True) if centred else x
    r = 1.0 / np.sqrt((d * d).mean(-1, keepdims=True) + eps)
    xh = d * r
    # dxh = r (dx - mean dx - xh mean(xh dx)): at most r (2 + |xh| sqrt n) max|dx|; the mean's own fold error
    # (gamma_n max|x|) enters like an input error, the rest (var fold, rsqrt, the products) relative to xh
    sens = np.abs(w) * r * (2.0 + np.abs(xh) * math.sqrt(n))
    e = sens * (_rowmax(ex) + _gamma(n + 2, u) * _rowmax(np.abs(x))) + _gamma(n + 8, u) * np.abs(xh * w)
    return xh, e


@_reg("layernorm")
def _layernorm(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    x, ex = args[0]
    w, b = np.asarray(entry["weight"], np.float64), np.asarray(entry["bias"], np.float64)
    xh, e = _norm(x, ex, w, float(np.float32(a["eps"])), True, u)
    v = xh * w + b
    return v, e + _round(v, u)


@_reg("rmsnorm")
def _rmsnorm(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    x, ex = args[0]
    w = np.asarray(entry["weight"], np.float64)
    xh, e = _norm(x, ex, w, float(np.float32(a["eps"])), False, u)
    v = xh * w
    return v, e + _round(v, u)


@_reg("rope")
def _rope(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    x, ex = args[0]
    t_len, dim = x.shape[-2], x.shape[-1]
    theta = np.arange(t_len, dtype=np.float64)[:, None] * np.power(
        float(a["base"]), -(2.0 * np.arange(dim // 2, dtype=np.float64)) / dim
    )
    c, s = np.cos(theta), np.sin(theta)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    v = np.empty_like(x)
    v[..., 0::2], v[..., 1::2] = x0 * c - x1 * s, x0 * s + x1 * c
    # the rotation carries max(e0, e1) * sqrt 2 at most; own: the c/s tables (1 rounding each), 2 products, 1 sum
    pair = np.maximum(ex[..., 0::2], ex[..., 1::2]) * math.sqrt(2.0) + _round(4 * (np.abs(x0) + np.abs(x1)), u)
    e = np.empty_like(x)
    e[..., 0::2], e[..., 1::2] = pair, pair
    return v, e


def _pair(v: Any) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _taps(x: np.ndarray, k: tuple, st: tuple, p: tuple, d: tuple, fill: float) -> tuple[list, tuple[int, int]]:
    """The window taps of x (..., H, W) padded with ``fill``: (tap (a, b), the strided view of every window's tap)."""
    xp = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(p[0], p[0]), (p[1], p[1])], constant_values=fill)
    outs = tuple((x.shape[-2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // st[i] + 1 for i in range(2))
    taps = []
    for a in range(k[0]):
        for b in range(k[1]):
            r, c = a * d[0], b * d[1]
            taps.append(
                ((a, b), xp[..., r : r + (outs[0] - 1) * st[0] + 1 : st[0], c : c + (outs[1] - 1) * st[1] + 1 : st[1]])
            )
    return taps, outs


def _conv64(x: np.ndarray, w: np.ndarray, k: tuple, st: tuple, p: tuple, d: tuple) -> np.ndarray:
    taps, outs = _taps(x, k, st, p, d, 0.0)
    y = np.zeros(x.shape[:-3] + (w.shape[0],) + outs)
    for (a, b), t in taps:
        y += np.einsum("oc,...chw->...ohw", w[:, :, a, b], t)
    return y


@_reg("conv2d")
def _conv2d(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    x, ex = args[0]
    w, b = np.asarray(entry["weight"], np.float64), np.asarray(entry["bias"], np.float64)
    k, st, p, d = (_pair(a[n]) for n in ("kernel", "stride", "padding", "dilation"))
    v = _conv64(x, w, k, st, p, d) + b[:, None, None]
    terms = w.shape[1] * k[0] * k[1]
    mag = _conv64(np.abs(x), np.abs(w), k, st, p, d) + np.abs(b)[:, None, None]
    e = _conv64(ex, np.abs(w), k, st, p, d) + _gamma(terms + 1, u) * mag + _round(0.0 * v, u)
    return v, e


@_reg("pool")
def _pool(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    x, ex = args[0]
    k, st, p = (_pair(a[n]) for n in ("kernel", "stride", "padding"))
    if a["mode"] == "max":
        taps, _ = _taps(x, k, st, p, (1, 1), -np.inf)
        etaps, _ = _taps(ex, k, st, p, (1, 1), 0.0)
        return np.max([t for _, t in taps], axis=0), np.max([t for _, t in etaps], axis=0)  # a max does not round
    taps, _ = _taps(x, k, st, p, (1, 1), 0.0)
    etaps, _ = _taps(ex, k, st, p, (1, 1), 0.0)
    n = k[0] * k[1]
    v = np.sum([t for _, t in taps], axis=0) / n
    mag = np.sum([np.abs(t) for _, t in taps], axis=0) / n
    e = np.sum([t for _, t in etaps], axis=0) / n + _gamma(n, u) * mag + _round(v, u)
    return v, e


@_reg("attention")
def _attention(node: Node, a: dict, args: list[Pair], entry: Any, u: float) -> Pair:
    vals = [np.asarray(v, np.float64) for v, _ in args]  # float64: central differences step off the binary32 grid
    q, k, v, lens = attention_operands(*vals[:3], vals[3] if len(vals) == 4 else None)
    y = sattn.sdpa(q, k, v, causal=bool(a["causal"]), kv_lens=lens, scale=a["scale"])
    (_, eq), (_, ek), (_, ev) = args[:3]
    if min(y.size, eq.size, ek.size) == 0:
        return y, _round(y, u)
    # an output is a P-weighted mean of V rows (carries max e_v) and P moves by at most 2 max|v| per unit of
    # score error; a score q.k s errs by at most s D (max|k| max e_q + max|q| max e_k + max e_q max e_k)
    sc = sattn.scale_of(q.shape[-1], a["scale"])
    mq, mk, mv = (float(np.max(np.abs(t), initial=0.0)) for t in (q, k, v))  # empty operands: no magnitude
    xq, xk, xv = (float(np.max(t, initial=0.0)) for t in (eq, ek, ev))
    ds = abs(sc) * q.shape[-1] * (mk * xq + mq * xk + xq * xk)
    return y, xv + 2.0 * mv * ds + _round(y, u)


def real_all(
    graph: Graph, payload: Payload | None, inputs: Any, *, u: float = U, inexact: Collection[int] = ()
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every node's float64 value and its first-order binary32 error bound, by id (inputs in id order, float64
    allowed: central differences perturb them off the binary32 grid); RealError for an op without a meaning.

    ``u`` is the unit roundoff of the ops (0: the bound carries only the ``inexact`` consts' errors, u32 |value|
    each: a rule's constant rounded from a real number, spec.ir.vjp's ``Backward.rounded``)."""
    payload = payload if payload is not None else Payload()
    ids = graph.input_ids()
    given = dict(inputs) if isinstance(inputs, Mapping) else dict(zip(ids, inputs, strict=True))
    vals: list[np.ndarray] = []
    errs: list[np.ndarray] = []
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the mean of an empty row: NaN, as the value says
        for node in graph.nodes:
            if node.kind == "input":
                v = np.asarray(given[node.id], np.float64).reshape(node.out_shape)
                vals.append(v)
                errs.append(np.zeros_like(v))
                continue
            if node.id in inexact:
                v = _const(node, {}, [], payload.get(node.id), u)[0]
                vals.append(v)
                errs.append(_round(v, U))
                continue
            fn = REAL.get(node.kind)
            op = get_op(node.kind)
            if fn is None or op is None:
                raise RealError(f"node {node.id}: op {node.kind!r} has no float64 meaning in spec.ir.real")
            entry = payload.get(node.id) if op.payload else None
            v, e = fn(node, node_attrs(node, op), [(vals[p], errs[p]) for p in node.parents], entry, u)
            vals.append(np.asarray(v, np.float64).reshape(node.out_shape))
            errs.append(np.asarray(e, np.float64).reshape(node.out_shape))
    return vals, errs
