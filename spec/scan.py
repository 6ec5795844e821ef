"""Reference semantics of the selective scan (Mamba, diagonal): sequential, written apart from native/scan.py.

* :func:`forward` — float64, one step at a time: delta = softplus(raw), h[t] = exp(delta A) h[t-1] +
  delta B[t] x[t], y[t] = C[t] . h[t] + Dskip x[t].
* :func:`recurrence_f32` — the float32 meaning of the sequential CUDA order from given coefficients:
  h = fl(fl(a h) + b), y = fl(fold_n fl(C h) + fl(D x)); what the sequential kernel must equal bitwise.
* :func:`vjp` — float64 gradients of <dy, y> by the reverse-time recurrence; ``magnitudes=True`` evaluates
  the same expressions on absolute values (the running-error scale a float bound multiplies).
* :func:`gamma` — Higham's gamma_k = k u / (1 - k u).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["softplus", "forward", "recurrence_f32", "vjp", "gamma", "states_f64", "state_magnitudes"]


def gamma(k: int, u: float = 2.0**-24) -> float:
    """gamma_k = k u / (1 - k u) (inf where k u >= 1)."""
    return k * u / (1 - k * u) if k * u < 1 else float("inf")


def softplus(r: np.ndarray) -> np.ndarray:
    """log(1 + e^r) in float64 (log1p/exp; exact branch-free for the moderate arguments the tests draw)."""
    return np.logaddexp(0.0, np.asarray(r, dtype=np.float64))


def states_f64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """h[t] = a[t] h[t-1] + b[t] from 0, float64, one step at a time."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    h = np.zeros_like(a)
    prev = np.zeros(a.shape[1:])
    for t in range(a.shape[0]):
        prev = a[t] * prev + b[t]
        h[t] = prev
    return h


def state_magnitudes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """H[t] = |a[t]| H[t-1] + |b[t]|: the scale of every rounding error that reaches h[t]."""
    return states_f64(np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64)))


def forward(x: Any, raw: Any, A: Any, B: Any, C: Any, Dk: Any) -> tuple[np.ndarray, np.ndarray, dict]:
    """float64 (y, h, coefficients {delta, a, b}) of the selective scan, sequentially."""
    x, raw, A, B, C, Dk = (np.asarray(v, np.float64) for v in (x, raw, A, B, C, Dk))
    delta = softplus(raw)
    a = np.exp(delta[:, :, None] * A[None, :, :])
    b = delta[:, :, None] * B[:, None, :] * x[:, :, None]
    h = states_f64(a, b)
    y = np.einsum("tn,tdn->td", C, h) + Dk[None, :] * x
    return y, h, {"delta": delta, "a": a, "b": b}


def recurrence_f32(a: Any, b: Any, C: Any, x: Any, Dk: Any) -> tuple[np.ndarray, np.ndarray]:
    """(y, h) of the sequential order in float32 from given coefficients: each product and sum rounded once."""
    f = np.float32
    a, b, C, x, Dk = (np.asarray(v, f) for v in (a, b, C, x, Dk))
    L, D, N = a.shape
    h = np.empty((L, D, N), f)
    prev = np.zeros((D, N), f)
    for t in range(L):
        prev = np.add(np.multiply(a[t], prev, dtype=f), b[t], dtype=f)
        h[t] = prev
    y = np.zeros((L, D), f)
    for n in range(N):
        y = np.add(y, np.multiply(C[:, None, n], h[:, :, n], dtype=f), dtype=f)
    return np.add(y, np.multiply(Dk[None, :], x, dtype=f), dtype=f), h


def vjp(x: Any, raw: Any, A: Any, B: Any, C: Any, Dk: Any, dy: Any, magnitudes: bool = False) -> dict[str, np.ndarray]:
    """float64 gradients of <dy, y> w.r.t. x, raw, A, B, C, D (``magnitudes``: every factor by its absolute value)."""
    m = np.abs if magnitudes else (lambda v: v)
    x, raw, A, B, C, Dk, dy = (np.asarray(v, np.float64) for v in (x, raw, A, B, C, Dk, dy))
    _, h, co = forward(x, raw, A, B, C, Dk)
    delta, a = co["delta"], co["a"]
    if magnitudes:
        h = state_magnitudes(a, co["b"])
    L, D, N = a.shape
    gx, graw = np.zeros((L, D)), np.zeros((L, D))
    gA, gB, gC = np.zeros((D, N)), np.zeros((L, N)), np.zeros((L, N))
    sig = 1.0 / (1.0 + np.exp(-raw))
    carry = np.zeros((D, N))
    for t in range(L - 1, -1, -1):
        gC[t] = (m(dy[t])[:, None] * h[t]).sum(axis=0)
        total = m(C[t])[None, :] * m(dy[t])[:, None] + carry  # dL/dh[t]
        hprev = h[t - 1] if t > 0 else np.zeros((D, N))
        ga = total * hprev  # dL/da[t]
        gb = total  # dL/db[t]
        carry = total * a[t]
        # a = exp(delta A): da/ddelta = A a, da/dA = delta a; b = delta B x
        gdelta = (ga * a[t] * m(A)).sum(axis=1) + (gb * m(B[t])[None, :]).sum(axis=1) * m(x[t])
        gA += ga * a[t] * delta[t][:, None]
        gB[t] = (gb * (delta[t] * m(x[t]))[:, None]).sum(axis=0)
        gx[t] = (gb * m(B[t])[None, :]).sum(axis=1) * delta[t] + m(dy[t]) * m(Dk)
        graw[t] = gdelta * sig[t]
    gD = (m(dy) * m(x)).sum(axis=0)
    return {"x": gx, "raw": graw, "A": gA, "B": gB, "C": gC, "D": gD}
