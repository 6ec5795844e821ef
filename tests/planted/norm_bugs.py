"""Deliberately wrong softmax and norms: each must be caught by the contract item meant to catch it."""

from __future__ import annotations

from typing import Any

import numpy as np

from native import norm as nn

__all__ = [
    "softmax_empty_rows",
    "softmax_mask_after",
    "softmax_backward_no_diagonal",
    "rmsnorm_no_eps",
    "layernorm_unbiased_variance",
    "log_softmax_backward_no_exp",
    "layernorm_backward_no_mean",
    "rmsnorm_backward_no_rsqrt_term",
]


def softmax_mask_after(x: Any, mask: Any = None, device: str = "auto") -> Any:
    """BUG: softmax over every entry, then the masked entries are zeroed (the mask applied after softmax)."""
    y = nn.softmax(x, None, device="host")
    return y if mask is None else np.where(np.asarray(mask, bool), y, np.float32(0)).astype(np.float32)


def softmax_backward_no_diagonal(y: Any, dy: Any, mask: Any = None, device: str = "auto") -> Any:
    """BUG: the Jacobian's diagonal term y_k dy_k is missing: dx_k = -y_k * fold(dy * y)."""
    y, dy = np.asarray(y, np.float32), np.asarray(dy, np.float32)
    full = nn.softmax_backward(y, dy, mask, device="host")
    with np.errstate(all="ignore"):
        return (full - (y * dy).astype(np.float32)).astype(np.float32)


def rmsnorm_no_eps(x: Any, weight: Any, eps: float = 1e-6, device: str = "auto") -> Any:
    """BUG: eps is dropped."""
    return nn.rmsnorm(x, weight, eps=0.0, device=device)


def layernorm_unbiased_variance(x: Any, weight: Any, bias: Any, eps: float = 1e-5, device: str = "auto") -> Any:
    """BUG: the variance is divided by n - 1 (torch.var's default) instead of n."""
    x = np.asarray(x, np.float32)
    n = x.shape[-1]
    if n < 2:
        return nn.layernorm(x, weight, bias, eps, device="host")
    mu = x.astype(np.float64).mean(-1, keepdims=True)
    var = ((x - mu) ** 2).sum(-1, keepdims=True) / (n - 1)
    y = (x - mu) / np.sqrt(var + np.float32(eps)) * np.asarray(weight, np.float64) + np.asarray(bias, np.float64)
    return y.astype(np.float32)


def log_softmax_backward_no_exp(y: Any, dy: Any, mask: Any = None, device: str = "auto") -> Any:
    """BUG: dx = dy - y * fold(dy) (the log-probabilities used where the probabilities exp(y) belong)."""
    y, dy = np.asarray(y, np.float32), np.asarray(dy, np.float32)
    ok = np.ones(y.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), y.shape)
    t = np.where(ok, dy, 0).sum(-1, keepdims=True, dtype=np.float32)
    return np.where(ok, dy - y * t, 0).astype(np.float32)


def layernorm_backward_no_mean(
    x: Any, weight: Any, dy: Any, eps: float = 1e-5, device: str = "auto"
) -> tuple[Any, Any, Any]:
    """BUG: dx = r (g - xh mean(g xh)): the mean-of-gradient term mean(g) is missing (dw, db right)."""
    x, w, g = (np.asarray(a, np.float32) for a in (x, weight, dy))
    d = x - x.mean(-1, keepdims=True)
    r = (1 / np.sqrt((d * d).mean(-1, keepdims=True) + np.float32(eps))).astype(np.float32)
    xh, gw = d * r, g * w
    dx = (r * (gw - xh * (gw * xh).mean(-1, keepdims=True))).astype(np.float32)
    _, dw, db = nn.layernorm_backward(x, w, g, eps, device="host")
    return dx, dw, db


def rmsnorm_backward_no_rsqrt_term(
    x: Any, weight: Any, dy: Any, eps: float = 1e-6, device: str = "auto"
) -> tuple[Any, Any]:
    """BUG: dx = r g: the term through the rsqrt's derivative, -r xh mean(g xh), is missing (dw right)."""
    x, w, g = (np.asarray(a, np.float32) for a in (x, weight, dy))
    r = (1 / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(eps))).astype(np.float32)
    _, dw = nn.rmsnorm_backward(x, w, g, eps, device="host")
    return (r * (g * w)).astype(np.float32), dw


def softmax_empty_rows(x: Any, mask: Any = None, device: str = "auto") -> Any:
    """BUG: the row guard's length >= 1 is dropped: a last axis of length 0 returns an empty result, not refused."""
    if np.asarray(x).shape[-1] == 0:
        return np.zeros(np.asarray(x).shape, np.float32)
    return nn.softmax(x, mask, device=device)
