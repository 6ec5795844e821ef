"""Deliberately wrong softmax and norms: each must be caught by the contract item meant to catch it."""

from __future__ import annotations

from typing import Any

import numpy as np

from native import norm as nn

__all__ = ["softmax_mask_after", "softmax_backward_no_diagonal", "rmsnorm_no_eps"]


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
