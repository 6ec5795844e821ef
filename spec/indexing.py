"""Reference meaning of the indexing family (training kernels), on binary32 bit patterns.

Most of the family moves bits and never rounds: gather (``out[j, :] = table[idx[j], :]``), index_copy
(``out[idx[j], :] = src[j, :]``, distinct indices), mask application (``where(mask, a, b)`` and
``masked_fill(x, mask, v)``), concatenation and slicing along an axis and their VJPs (the VJP of a concatenation
is the slices of ``dy``; the VJP of a slice is ``dy`` zero-padded back to the input's shape, +0 elsewhere). Their
reference is a bit copy, so agreement is bitwise on any input bits, NaN payloads included.

Three entries add, each in a stated order through :mod:`spec.reductions` (softfloat, env cuda, or the
float32-numpy route that module proves exact):

* ``reduce_to_shape`` (the VJP of a broadcast): each output is the left fold from +0 of the ``dy`` elements
  broadcast from it, in increasing flat index of ``dy``.
* ``gather_vjp`` (the VJP of a row gather): the deterministic scatter-add ``out[idx[j], c] += dy[j, c]`` into
  zeros, duplicates in increasing ``j`` (spec.reductions.scatter_add on the flat view: source ``j d + c``
  targets ``idx[j] d + c``, so source order among duplicates is increasing ``j``).
* ``scatter_add_atomic``: no order at all (atomicAdd); only a bound is claimed (:func:`atomic_bound`): each
  output with ``k`` contributions (plus its initial value) is within ``gamma_k (|out0| + sum |src|)`` of the
  exact sum, plus ``k 2^-126`` for the subnormal results the global f32 atomic flushes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from spec import reductions as red

__all__ = [
    "gather",
    "index_copy",
    "where",
    "masked_fill",
    "concat",
    "concat_vjp",
    "slice_axis",
    "slice_vjp",
    "reduce_to_shape",
    "broadcast_axes",
    "gather_vjp",
    "atomic_bound",
]

U32 = np.uint32


def _u(a: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.uint32))


def gather(table: Any, idx: Any) -> np.ndarray:
    """Rows ``table[idx[j], :]`` (bits; ``table`` is (rows, d), ``idx`` int in [0, rows))."""
    t = _u(table)
    return t[np.asarray(idx, dtype=np.int64).reshape(-1)].reshape(np.shape(idx) + t.shape[1:])


def index_copy(out: Any, idx: Any, src: Any) -> np.ndarray:
    """A copy of ``out`` with rows ``out[idx[j], :] = src[j, :]`` (distinct indices: the order is then immaterial)."""
    res = _u(out).copy()
    res[np.asarray(idx, dtype=np.int64).reshape(-1)] = _u(src)
    return res


def where(mask: Any, a: Any, b: Any) -> np.ndarray:
    """``a`` where ``mask`` is true, else ``b`` (bits, broadcast to one shape)."""
    return np.where(np.asarray(mask, dtype=bool), _u(a), _u(b)).astype(np.uint32)


def masked_fill(x: Any, mask: Any, value: int) -> np.ndarray:
    """``x`` with the bits ``value`` where ``mask`` is true."""
    return np.where(np.asarray(mask, dtype=bool), U32(value), _u(x)).astype(np.uint32)


def concat(xs: list[Any], axis: int) -> np.ndarray:
    """The inputs' bits side by side along ``axis``."""
    return np.concatenate([_u(x) for x in xs], axis=axis)


def concat_vjp(dy: Any, sizes: list[int], axis: int) -> list[np.ndarray]:
    """The slices of ``dy`` along ``axis`` of the inputs' lengths ``sizes`` (each input's gradient)."""
    cuts = np.cumsum([0, *sizes])
    d = _u(dy)
    return [np.ascontiguousarray(np.take(d, np.arange(cuts[i], cuts[i + 1]), axis=axis)) for i in range(len(sizes))]


def slice_axis(x: Any, axis: int, start: int, stop: int) -> np.ndarray:
    """Elements ``start .. stop - 1`` along ``axis`` (0 <= start <= stop <= length)."""
    return np.ascontiguousarray(np.take(_u(x), np.arange(start, stop), axis=axis))


def slice_vjp(dy: Any, shape: tuple[int, ...], axis: int, start: int) -> np.ndarray:
    """``dy`` placed at ``start`` along ``axis`` of zeros (+0 bits) of the input's ``shape``."""
    out = np.zeros(shape, dtype=np.uint32)
    d = _u(dy)
    sl = [slice(None)] * len(shape)
    sl[axis] = slice(start, start + d.shape[axis])
    out[tuple(sl)] = d
    return out


def broadcast_axes(shape: tuple[int, ...], dy_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The axes of ``dy_shape`` that a broadcast from ``shape`` (right-aligned, NumPy's rule) made: to reduce."""
    if len(shape) > len(dy_shape):
        raise ValueError(f"shape {shape} has more axes than dy {dy_shape}")
    full = (1,) * (len(dy_shape) - len(shape)) + tuple(shape)
    for s, t in zip(full, dy_shape, strict=True):
        if s not in (1, t):
            raise ValueError(f"shape {shape} does not broadcast to {dy_shape}")
    return tuple(i for i, (s, t) in enumerate(zip(full, dy_shape, strict=True)) if s == 1 and t != 1)


def reduce_to_shape(dy: Any, shape: tuple[int, ...], route: str = "auto") -> np.ndarray:
    """The VJP of a broadcast to ``dy``'s shape: per output, the left fold from +0 in increasing dy flat index."""
    d = _u(dy)
    red_axes = broadcast_axes(tuple(shape), d.shape)
    keep = tuple(i for i in range(d.ndim) if i not in red_axes)
    n_out = int(np.prod([d.shape[i] for i in keep], dtype=np.int64))
    n_red = int(np.prod([d.shape[i] for i in red_axes], dtype=np.int64))
    # Kept axes first, reduced axes last, both in their order: a reduced row is its dy elements in flat-index order.
    rows = np.ascontiguousarray(np.transpose(d, keep + red_axes)).reshape(n_out, n_red)
    return np.asarray(red.fold_left(rows, route=route), dtype=np.uint32).reshape(tuple(shape))


def gather_vjp(dy: Any, idx: Any, rows: int, route: str = "auto") -> np.ndarray:
    """``out = zeros(rows, d)``; ``out[idx[j], c] += dy[j, c]`` with duplicates in increasing ``j``."""
    d = _u(dy)
    ix = np.asarray(idx, dtype=np.int64).reshape(-1)
    width = int(np.prod(d.shape[1:], dtype=np.int64)) if d.ndim > 1 else 1
    targets = (ix[:, None] * width + np.arange(width, dtype=np.int64)[None, :]).reshape(-1)
    zero = np.zeros(rows * width, dtype=np.uint32)
    flat = red.scatter_add(zero, targets, d.reshape(-1), route=route)
    return np.asarray(flat, dtype=np.uint32).reshape((rows, *d.shape[1:]))


def atomic_bound(out0: Any, idx: Any, src: Any) -> tuple[np.ndarray, np.ndarray]:
    """(exact value rounded to float64, bound) per output of an unordered scatter-add (float64 arrays).

    Output ``i`` with ``k`` sources is a chain of ``k`` binary32 adds in some order from ``out0[i]``: Higham's
    ``gamma_k (|out0[i]| + sum |src|)``, plus ``k 2^-126`` for results the f32 atomic flushes to zero, plus the
    float64 reference's own rounding (``2^-53`` of the exact value).
    """
    o = np.asarray(out0, dtype=np.float32).reshape(-1).astype(np.float64)
    ix = np.asarray(idx, dtype=np.int64).reshape(-1)
    s = np.asarray(src, dtype=np.float32).reshape(-1).astype(np.float64)
    value = np.empty(o.size)
    bound = np.empty(o.size)
    groups: dict[int, list[float]] = {}
    for j, i in enumerate(ix.tolist()):
        groups.setdefault(i, []).append(float(s[j]))
    for i in range(o.size):
        terms = [float(o[i]), *groups.get(i, [])]
        k = len(terms) - 1
        value[i] = math.fsum(terms)
        bound[i] = red.gamma(k) * math.fsum(abs(t) for t in terms) + k * 2.0**-126 + 2.0**-53 * abs(value[i])
    return value, bound
