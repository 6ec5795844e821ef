"""A small decoder block written in GraphSpec: the fusion backend's end-to-end model (the seed's Qwen target).

The block maps token ids (T,) to hidden states (T, Dm):

    x   = Embedding(V, Dm)(ids)
    h   = RMSNorm(Dm)(x)                                   (the IR op rmsnorm)
    q   = rope(transpose(reshape(Linear(Dm, H Dh)(h))))    (1, H, T, Dh)
    k   = rope(transpose(reshape(Linear(Dm, KV Dh)(h))))   (1, KV, T, Dh), repeated to H heads (GQA: head h
    v   =      transpose(reshape(Linear(Dm, KV Dh)(h)))     reads KV head h // G), k transposed for QK^T
    p   = softmax(scale(q @ k^T) + causal mask)            the masked-softmax pattern (add -> softmax)
    o   = Linear(H Dh, Dm)(reshape(transpose(p @ v)))
    x2  = x + o
    h2  = RMSNormOps(Dm)(x2)                               the six IR ops pow -> mean -> add -> rsqrt -> mul -> mul
    out = x2 + Linear(F, Dm)(silu(Linear(Dm, F)(h2)) * Linear(Dm, F)(h2))

The primitives GraphSpec lacks (embedding, RMSNorm as one op and as its six ops, reshape, transpose, RoPE, SiLU,
a constant scale, a causal mask, the KV-head repeat) are registered here as GraphSpec primitive kinds, and matmul
as a DAG op. Each one's spec forward is the denotation of its own lowering (one meaning per primitive), so
``spec(block)(params, ids)`` equals ``denote(lower(block, params))`` by construction; the fusion backend is checked
against that denotation (``falsification.fusion_tests``: ``fusion.decoder``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from spec.ir import graphspec as gs
from spec.ir.denote import denote_all
from spec.ir.graph import GraphBuilder

__all__ = [
    "Embedding",
    "RMSNorm",
    "RMSNormOps",
    "Reshape",
    "Transpose",
    "Rope",
    "SiLU",
    "Scale",
    "CausalMask",
    "RepeatKV",
    "decoder_block",
    "decoder_params",
]

Shape = tuple[int, ...]
Lower = Callable[[GraphBuilder, gs.Primitive, tuple[np.ndarray, ...], int], int]


def _forward_of(lower: Lower) -> Callable[[gs.Primitive, tuple[np.ndarray, ...], np.ndarray], np.ndarray]:
    """The spec forward of a primitive: the denotation of its own lowering on a one-input graph."""

    def forward(p: gs.Primitive, ps: tuple[np.ndarray, ...], x: np.ndarray) -> np.ndarray:
        b = GraphBuilder()
        out = lower(b, p, ps, b.add("input", (), p.in_shape))
        g, payload = b.build()
        res = denote_all(g, payload, [x])
        if not hasattr(res, "value"):
            raise gs.GraphSpecShapeError(str(res))
        return res.value[out]

    return forward


def _register(name: str, at: Callable[[Shape, Mapping[str, Any]], gs.Primitive], lower: Lower, doc: str) -> None:
    if name in gs.PRIMITIVE_KINDS:
        return
    gs.register_primitive_kind(
        gs.PrimitiveKind(name, at, _forward_of(lower), lower, lambda p: f"{name}{list(p.in_shape)}", doc)
    )


def _prim(
    kind: str, attrs: Mapping[str, Any], params: tuple[gs.ParamSpec, ...], s: Shape, out: Shape, layer: bool = False
) -> gs.Primitive:
    return gs.Primitive(kind, tuple(sorted(attrs.items())), params, tuple(s), tuple(out), layer)


def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise gs.GraphSpecShapeError(msg)


# embedding ------------------------------------------------------------------------------------------------


def _embedding_at(s: Shape, a: Mapping[str, Any]) -> gs.Primitive:
    ps = (gs.ParamSpec("table", (a["vocab"], a["dim"]), "uniform", 1),)
    return _prim("fx_embedding", a, ps, s, s + (a["dim"],), layer=True)


_register(
    "fx_embedding",
    _embedding_at,
    lambda b, p, ps, x: b.add("embedding", (x,), p.out_shape, params={"table": ps[0]}, dim=p.attr["dim"]),
    "row gather of a (V, dim) table; params [table]",
)


# rmsnorm (one op) and its six ops -----------------------------------------------------------------------------


def _rms_at(kind: str) -> Callable[[Shape, Mapping[str, Any]], gs.Primitive]:
    def at(s: Shape, a: Mapping[str, Any]) -> gs.Primitive:
        _need(len(s) >= 1, f"RMSNorm needs rank >= 1, got {list(s)}")
        return _prim(kind, {"eps": float(a.get("eps", 1e-6))}, (gs.ParamSpec("weight", (s[-1],), "ones"),), s, s)

    return at


def _rms_ops_lower(b: GraphBuilder, p: gs.Primitive, ps: tuple[np.ndarray, ...], x: int) -> int:
    s = p.in_shape
    red = s[:-1] + (1,)
    two = b.add("const", (), s, params={"value": np.full(s, 2.0, np.float32)})
    pw = b.add("pow", (x, two), s)
    mean = b.add("reduceMean", (pw,), red, axis=-1, keepdim=True)
    eps = b.add("const", (), red, params={"value": np.full(red, p.attr["eps"], np.float32)})
    r = b.add("rsqrt", (b.add("add", (mean, eps), red),), red)
    y = b.add("mul_elem", (x, b.add("broadcastTo", (r,), s, shape=s)), s)
    w = b.add("const", (), (s[-1],), params={"value": ps[0]})
    return b.add("mul_elem", (y, b.add("broadcastTo", (w,), s, shape=s)), s)


_register(
    "fx_rmsnorm",
    _rms_at("fx_rmsnorm"),
    lambda b, p, ps, x: b.add("rmsnorm", (x,), p.out_shape, params={"weight": ps[0]}, eps=p.attr["eps"]),
    "RMSNorm over the last axis as the IR op rmsnorm; params [weight]",
)
_register(
    "fx_rmsnorm_ops",
    _rms_at("fx_rmsnorm_ops"),
    _rms_ops_lower,
    "RMSNorm as its six IR ops: pow(x, 2) -> reduceMean -> add eps -> rsqrt -> mul x -> mul weight",
)


# shape ops, rope, silu, scale, causal mask, KV repeat ------------------------------------------------------------


def _reshape_at(s: Shape, a: Mapping[str, Any]) -> gs.Primitive:
    shape = tuple(a["shape"])
    _need(math.prod(shape) == math.prod(s), f"reshape {list(s)} -> {list(shape)} changes the element count")
    return _prim("fx_reshape", {"shape": shape}, (), s, shape)


def _transpose_at(s: Shape, a: Mapping[str, Any]) -> gs.Primitive:
    out = list(s)
    i, j = a["dim0"] % len(s), a["dim1"] % len(s)
    out[i], out[j] = out[j], out[i]
    return _prim("fx_transpose", a, (), s, tuple(out))


def _same_at(kind: str) -> Callable[[Shape, Mapping[str, Any]], gs.Primitive]:
    return lambda s, a: _prim(kind, a, (), s, s)


def _repeat_at(s: Shape, a: Mapping[str, Any]) -> gs.Primitive:
    _need(len(s) == 4 and s[0] == 1, f"RepeatKV expects (1, KV, S, D), got {list(s)}")
    return _prim("fx_repeat_kv", a, (), s, (1, s[1] * a["groups"], s[2], s[3]))


def _repeat_lower(b: GraphBuilder, p: gs.Primitive, ps: tuple[np.ndarray, ...], x: int) -> int:
    _, kv, s, d = p.in_shape
    g = p.attr["groups"]
    u = b.add("reshape", (x,), (1, kv, 1, s, d), shape=(1, kv, 1, s, d))
    e = b.add("expand", (u,), (1, kv, g, s, d), shape=(1, kv, g, s, d))
    return b.add("reshape", (e,), p.out_shape, shape=p.out_shape)


def _scale_lower(b: GraphBuilder, p: gs.Primitive, ps: tuple[np.ndarray, ...], x: int) -> int:
    c = b.add("const", (), p.in_shape, params={"value": np.full(p.in_shape, p.attr["c"], np.float32)})
    return b.add("mul_elem", (x, c), p.in_shape)


def _mask_lower(b: GraphBuilder, p: gs.Primitive, ps: tuple[np.ndarray, ...], x: int) -> int:
    tq, tk = p.in_shape[-2:]
    causal = np.where(np.arange(tk)[None, :] > np.arange(tq)[:, None], -np.inf, 0.0).astype(np.float32)
    m = b.add("const", (), p.in_shape, params={"value": np.broadcast_to(causal, p.in_shape).copy()})
    return b.add("add", (x, m), p.in_shape)


_register(
    "fx_reshape",
    _reshape_at,
    lambda b, p, ps, x: b.add("reshape", (x,), p.out_shape, shape=p.out_shape),
    "row-major reshape",
)
_register(
    "fx_transpose",
    _transpose_at,
    lambda b, p, ps, x: b.add("transpose", (x,), p.out_shape, dim0=p.attr["dim0"], dim1=p.attr["dim1"]),
    "swap two axes",
)
_register(
    "fx_rope",
    _same_at("fx_rope"),
    lambda b, p, ps, x: b.add("rope", (x,), p.out_shape, base=p.attr["base"]),
    "rotary position embedding over the last two axes (T, D), interleaved pairs",
)
_register("fx_silu", _same_at("fx_silu"), lambda b, p, ps, x: b.add("silu", (x,), p.out_shape), "x / (1 + e^-x)")
_register("fx_scale", _same_at("fx_scale"), _scale_lower, "x * c (a constant of x's shape)")
_register("fx_causal_mask", _same_at("fx_causal_mask"), _mask_lower, "x + (0 where key <= query else -Inf)")
_register("fx_repeat_kv", _repeat_at, _repeat_lower, "(1, KV, S, D) -> (1, KV G, S, D): head h reads KV head h // G")


def _t(kind: str, **attrs: Any) -> gs.Template:
    return gs.Template(kind, tuple(sorted(attrs.items())))


def Embedding(vocab: int, dim: int) -> gs.Template:  # noqa: N802 (layer names as in GraphSpec)
    """Token ids (T,) -> rows of a (vocab, dim) table."""
    return _t("fx_embedding", vocab=int(vocab), dim=int(dim))


def RMSNorm(eps: float = 1e-6) -> gs.Template:  # noqa: N802
    """RMSNorm over the last axis, lowered to the IR op ``rmsnorm``."""
    return _t("fx_rmsnorm", eps=float(eps))


def RMSNormOps(eps: float = 1e-6) -> gs.Template:  # noqa: N802
    """RMSNorm over the last axis, lowered to its six IR ops (the fusion backend's pattern)."""
    return _t("fx_rmsnorm_ops", eps=float(eps))


def Reshape(shape: Sequence[int]) -> gs.Template:  # noqa: N802
    """Row-major reshape to ``shape``."""
    return _t("fx_reshape", shape=tuple(int(d) for d in shape))


def Transpose(dim0: int, dim1: int) -> gs.Template:  # noqa: N802
    """Swap axes ``dim0`` and ``dim1``."""
    return _t("fx_transpose", dim0=int(dim0), dim1=int(dim1))


def Rope(base: float = 10000.0) -> gs.Template:  # noqa: N802
    """Rotary position embedding of (..., T, D)."""
    return _t("fx_rope", base=float(base))


def SiLU() -> gs.Template:  # noqa: N802
    """x / (1 + e^-x), elementwise."""
    return _t("fx_silu")


def Scale(c: float) -> gs.Template:  # noqa: N802
    """Multiply by the constant ``c``."""
    return _t("fx_scale", c=float(c))


def CausalMask() -> gs.Template:  # noqa: N802
    """Add 0 where the key position is <= the query position, -Inf elsewhere (last two axes)."""
    return _t("fx_causal_mask")


def RepeatKV(groups: int) -> gs.Template:  # noqa: N802
    """(1, KV, S, D) -> (1, KV groups, S, D) by reshape -> expand -> reshape (the GQA form)."""
    return _t("fx_repeat_kv", groups=int(groups))


def _matmul_shape(shapes: tuple[Shape, ...], attrs: Mapping[str, Any]) -> Shape:
    a, b = shapes
    if len(a) < 2 or len(a) != len(b) or a[:-2] != b[:-2] or a[-1] != b[-2]:
        raise gs.GraphSpecShapeError(f"matmul needs (..., m, k) @ (..., k, n): {list(a)} @ {list(b)}")
    return a[:-1] + (b[-1],)


def _matmul_forward(xs: tuple[np.ndarray, ...], attrs: Mapping[str, Any]) -> np.ndarray:
    b = GraphBuilder()
    i, j = b.add("input", (), xs[0].shape), b.add("input", (), xs[1].shape)
    out = b.add("matmul", (i, j), _matmul_shape((xs[0].shape, xs[1].shape), attrs))
    g, p = b.build()
    return denote_all(g, p, list(xs)).value[out]


if "matmul" not in gs.DAG_OPS:
    gs.DAG_OPS["matmul"] = gs.DagOp(
        "matmul", _matmul_shape, _matmul_forward, lambda b, ids, shape, a: b.add("matmul", ids, shape)
    )


def decoder_block(
    t: int = 4, dm: int = 16, heads: int = 4, kv: int = 2, dh: int = 4, ff: int = 32, vocab: int = 11
) -> gs.Dag:
    """The decoder block as a GraphSpec DAG over token ids (t,) (see the module docstring)."""
    if heads % kv:
        raise gs.GraphSpecShapeError(f"{heads} query heads are not a multiple of {kv} KV heads")
    g = heads // kv
    db = gs.DagBuilder((t,))
    x = db.apply(Embedding(vocab, dm), db.input)
    h = db.apply(RMSNorm(), x)
    q = db.apply(_chain((t, dm), gs.Linear(dm, heads * dh), Reshape((1, t, heads, dh)), Transpose(1, 2), Rope()), h)
    k = db.apply(
        _chain(
            (t, dm),
            gs.Linear(dm, kv * dh),
            Reshape((1, t, kv, dh)),
            Transpose(1, 2),
            Rope(),
            RepeatKV(g),
            Transpose(2, 3),
        ),
        h,
    )
    v = db.apply(_chain((t, dm), gs.Linear(dm, kv * dh), Reshape((1, t, kv, dh)), Transpose(1, 2), RepeatKV(g)), h)
    s = db.node("matmul", q, k)
    p = db.apply(_chain((1, heads, t, t), Scale(1.0 / math.sqrt(dh)), CausalMask(), gs.Softmax()), s)
    o = db.node("matmul", p, v)
    o = db.apply(_chain((1, heads, t, dh), Transpose(1, 2), Reshape((t, heads * dh)), gs.Linear(heads * dh, dm)), o)
    x2 = db.add(x, o)
    h2 = db.apply(RMSNormOps(), x2)
    gate = db.apply(_chain((t, dm), gs.Linear(dm, ff), SiLU()), h2)
    up = db.apply(_chain((t, dm), gs.Linear(dm, ff)), h2)
    down = db.apply(_chain((t, ff), gs.Linear(ff, dm)), db.mul(gate, up))
    return db.build(db.add(x2, down))


def _chain(in_shape: Shape, *parts: Any) -> gs.Graph:
    """The templates composed in order, the first instantiated at ``in_shape``."""
    g = gs.prim(parts[0], in_shape)
    for part in parts[1:]:
        g = gs.seq(g, part)
    return g


def decoder_params(block: gs.Dag, seed: int = 0) -> list[np.ndarray]:
    """Random parameters for the block's ABI: weights N(0, 1/fan_in), biases and tables N(0, 1/4), norm scales
    1 + N(0, 1/16)."""
    rng = np.random.default_rng(seed)
    out = []
    for slot in block.params:
        if slot.init == "ones":
            a = 1.0 + 0.25 * rng.standard_normal(slot.shape)
        elif slot.name == "weight":
            a = rng.standard_normal(slot.shape) / math.sqrt(slot.shape[-1])
        else:
            a = 0.5 * rng.standard_normal(slot.shape)
        out.append(a.astype(np.float32))
    return out
