"""Deliberately wrong pieces of the training step: each must be caught by the training-v1 item meant to catch it."""

from __future__ import annotations

from typing import Any

import numpy as np

from native import fusion as nf
from native.ir import run_node
from spec import training as st
from spec.ir.vjp import VJP_RULES

__all__ = [
    "drop_bias_parameterisers",
    "tanh_sign_rules",
    "softmax_uncentred_rules",
    "sgd_ascent_optimizers",
    "unordered_reductions",
    "compile_no_rounding",
]


def _linear_without_bias(e: Any, node: Any, entry: Any, ps: tuple[int, ...], ins: Any) -> int:
    """BUG: the augmented GEMM's column of ones is zeros: x W^T + 0 b (the bias is dropped)."""
    x = ps[0]
    s = e.shape(x)
    rows, out = int(np.prod(s[:-1])), e.shape(ins["weight"])[0]
    x2 = x if len(s) == 2 else e.op("reshape", x, shape=(rows, s[-1]))
    xa = e.op("concat", x2, e.full((rows, 1), 0.0), axis=1)
    wa = e.op(
        "concat",
        e.op("transpose", ins["weight"], dim0=0, dim1=1),
        e.op("reshape", ins["bias"], shape=(1, out)),
        axis=0,
    )
    y = e.op("matmul", xa, wa)
    return y if len(s) == 2 else e.op("reshape", y, shape=s[:-1] + (out,))


drop_bias_parameterisers = {**st.PARAMETERISE, "linear": _linear_without_bias}


def _tanh_sign(e: Any, n: Any, a: dict, entry: Any, xs: tuple, y: int, dy: int) -> tuple:
    """BUG: d tanh = y^2 - 1 (the sign of 1 - y^2 flipped)."""
    return (e.mul(dy, e.sub(e.mul(y, y), e.full(e.shape(y), 1.0))),)


def _softmax_uncentred(e: Any, n: Any, a: dict, entry: Any, xs: tuple, y: int, dy: int) -> tuple:
    """BUG: dx = y dy (the sum(dy y) term missing)."""
    return (e.mul(y, dy),)


tanh_sign_rules = {**VJP_RULES, "tanh": _tanh_sign}
softmax_uncentred_rules = {**VJP_RULES, "softmax": _softmax_uncentred}


def _ascent(e: Any, o: st.Optimizer, p: int, g: int, s: tuple, sc: Any) -> tuple[int, tuple[int, ...]]:
    """BUG: p + g lr (the update climbs the loss)."""
    return e.add(p, e.mul(g, e.full(e.shape(p), o.lr))), ()


sgd_ascent_optimizers = {
    **st.OPTIMIZERS,
    "sgd": st.OptimizerKind("sgd", (), (), lambda o, t: {}, _ascent, st.OPTIMIZERS["sgd"].reference),
}


def _unordered(ex: nf.CUDAExecutor, step: Any, values: dict[int, Any]) -> None:
    """BUG: a fold over its axis in a fresh order every call (as atomics would add), unseeded."""
    node = ex.program.graph[step.nodes[0]]
    x = values[node.parents[0]]
    ax = node.attrs["axis"] % x.ndim if node.kind != "sum" else None
    if ax is not None and x.shape[ax] > 1:
        perm = np.random.default_rng().permutation(x.shape[ax])
        x = ex.xp.take(x, ex.xp.asarray(perm), axis=ax)
    values[node.id] = run_node(node, [x], None, ex.device)


def unordered_reductions(ex: nf.CUDAExecutor) -> None:
    """Hook: every reduceSum/reduceMean step of the executor folds in a random order."""
    g = ex.program.graph
    ex.table = [
        (_unordered if s.kind == "reduction" and g[s.nodes[0]].kind in ("reduceSum", "reduceMean") else fn, s)
        for fn, s in ex.table
    ]


def compile_no_rounding(graph: Any, outputs: Any = None, **kw: Any) -> nf.CUDAProgram:
    """BUG: the fused chains keep their intermediates unrounded (native.fusion_codegen's planted variant)."""
    return nf.compile_subgraph(graph, outputs, variant="no_rounding", **kw)
