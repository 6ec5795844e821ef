"""Deliberately wrong attention paths: each must be caught by the contract item meant to catch it."""

from __future__ import annotations

from typing import Any

import numpy as np

from native import attention as na

__all__ = [
    "update_no_rescale",
    "attention_no_rescale",
    "attention_mask_after_softmax",
    "vjp_no_diagonal",
    "attention_head_dim_off_by_one",
]


def update_no_rescale(state: tuple, s: Any, v: Any, ops: na.Ops = na.NUMPY_OPS) -> tuple:
    """BUG: the running output is not rescaled by alpha = exp(m - m') when the max grows."""
    m, lsum, o = state
    m_new = ops.maximum(m, ops.rowmax(s))
    alpha = ops.where(ops.is_neginf(m_new), 1, ops.exp(ops.sub(m, m_new)))
    p = ops.where(ops.is_neginf(s), 0, ops.exp(ops.sub(s, ops.col(m_new))))
    return m_new, alpha * lsum + ops.rowsum(p), o + ops.matmul(p, v)


def attention_no_rescale(q: Any, k: Any, v: Any, *, device: str = "host", **kw: Any) -> tuple:
    """The host path with the missing-rescale merge."""
    return na.host_forward(q, k, v, update=update_no_rescale, **kw)


def attention_mask_after_softmax(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    kv_lens: Any = None,
    scale: float | None = None,
    device: str = "host",
    tile: int = na.BC,
) -> tuple:
    """BUG: softmax over every score, then blocked probabilities zeroed (no renormalisation)."""
    q, k, v = (np.asarray(a, dtype=np.float32) for a in (q, k, v))
    b, hq, lq, d = q.shape
    lk = k.shape[2]
    ke, ve = (np.repeat(a, hq // a.shape[1], axis=1) for a in (k, v))
    sc = np.float32(scale if scale is not None else 1 / np.sqrt(d))
    s = (np.matmul(q, ke.swapaxes(-1, -2)) * sc).astype(np.float32)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)
    lens = np.full(b, lk) if kv_lens is None else np.asarray(kv_lens)
    p = np.where(na.allowed_mask(lq, lk, causal, lens), p, 0).astype(np.float32)
    return np.matmul(p, ve).astype(np.float32), np.zeros((b, hq, lq), np.float32)


def _ds_no_diagonal(p: np.ndarray, dp: np.ndarray, delta: np.ndarray) -> np.ndarray:
    # BUG: dS = -P o rowsum(P o dP): the diag(P) term P o dP of the softmax Jacobian is missing.
    return (-p * delta[..., None]).astype(np.float32)


def vjp_no_diagonal(q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, *, device: str = "host", **kw: Any) -> tuple:
    """The host VJP with the softmax Jacobian's diagonal term dropped."""
    return na.host_vjp(q, k, v, out, lse, dout, ds_rule=_ds_no_diagonal, **kw)


def attention_head_dim_off_by_one(q: Any, k: Any, v: Any, **kw: Any) -> tuple:
    """BUG: the guard's head-dim limit is off by one: head_dim 129 runs (on its first 128 features) instead of
    being refused; every accepted call is the shipped one, so only a call one past the limit can tell."""
    if q.shape[-1] == na.HEAD_DIM_MAX + 1:
        out, lse = na.attention(q[..., :-1], k[..., :-1], v[..., :-1], **kw)
        return np.concatenate([np.asarray(out), np.zeros_like(np.asarray(out)[..., :1])], -1), lse
    return na.attention(q, k, v, **kw)
