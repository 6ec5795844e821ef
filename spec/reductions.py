"""Reference meaning of the reduction family, on binary32 bit patterns through the integer softfloat.

Every function takes uint32 bit arrays (NumPy or CuPy) and returns bits; only softfloat operations touch
values, so the reference never borrows the floating-point unit it judges. Orders (kernel-families.md):

* ``fold_left`` — reduce-sum-left: ``((+0 + x0) + x1) + ...`` along the last axis (vectorised across the
  leading axes, so row/column/N-d axis reductions are one call).
* ``tree_sum`` — the deterministic tree of :func:`native.reductions.tree_plan`: thread ``t`` of a grid of
  ``grid`` blocks of ``block`` threads folds ``x[t], x[t + S], x[t + 2S], ...`` from +0 (``S = grid *
  block``); each block combines its threads' partials in shared memory as ``sh[t] = sh[t] + sh[t + s]`` for
  ``s = block/2, ..., 1``; the block partials are reduced again by the same rule until one value remains.
* ``maximum`` — IEEE 754-2019 maximum fold from -Inf (NaN if any NaN, -0 < +0), so it is order-free;
  the maximum of an empty input is -Inf (the identity).
* ``mean`` — the fold (or tree) sum divided once, correctly rounded, by ``float32(L)``; empty: 0/0 = NaN.
* ``scatter_add`` — ``out[idx[j]] += src[j]`` with duplicates added in increasing source index ``j``.

The float environment is the contract's (``cuda``: IEEE subnormals, canonical NaN 0x7FFFFFFF). Error
bounds (Higham 2002, u = 2^-24): a summation tree of depth ``h`` (additions on the longest leaf-to-root
path) has ``|s - sum x| <= gamma_h sum |x|``; recursive summation has ``h = n - 1``, pairwise
``ceil(log2 n)``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from spec import softfloat as sf
from spec.elementwise import array_namespace

__all__ = [
    "POS_ZERO",
    "NEG_INF",
    "U32",
    "fold_left",
    "fold_max",
    "tree_sum",
    "mean_of",
    "scatter_add",
    "gamma",
    "tree_depth",
]

POS_ZERO = 0x00000000
NEG_INF = 0xFF800000
U32 = 2.0**-24


def fold_left(x: Any, env: str = "cuda", init: Any = None) -> Any:
    """Left fold of binary32 addition along the last axis, from +0 (or ``init`` bits, shape x.shape[:-1])."""
    xp = array_namespace(x)
    acc = xp.full(x.shape[:-1], POS_ZERO, dtype=xp.uint32) if init is None else xp.asarray(init, dtype=xp.uint32)
    for k in range(x.shape[-1]):
        acc = sf.add(acc, xp.ascontiguousarray(x[..., k]), env=env)
    return acc


def fold_max(x: Any, env: str = "cuda") -> Any:
    """IEEE maximum fold along the last axis from -Inf (empty axis: -Inf)."""
    xp = array_namespace(x)
    acc = xp.full(x.shape[:-1], NEG_INF, dtype=xp.uint32)
    for k in range(x.shape[-1]):
        acc = sf.maximum(acc, xp.ascontiguousarray(x[..., k]), env=env)
    return acc


def _one_pass(x: Any, grid: int, block: int, env: str) -> Any:
    """One pass of the tree: per-thread strided folds from +0, then the shared-memory tree per block."""
    xp = array_namespace(x)
    n = int(x.shape[0])
    stride = grid * block
    trips = max(-(-n // stride), 0)
    acc = xp.full(stride, POS_ZERO, dtype=xp.uint32)
    for k in range(trips):
        lo, hi = k * stride, min((k + 1) * stride, n)
        chunk = x[lo:hi]
        # Threads past the end of the last row do not add (the loop guard), so they keep their value.
        acc[: hi - lo] = sf.add(acc[: hi - lo], chunk, env=env)
    sh = acc.reshape(grid, block)
    s = block // 2
    while s >= 1:
        sh[:, :s] = sf.add(sh[:, :s], xp.ascontiguousarray(sh[:, s : 2 * s]), env=env)
        s //= 2
    return xp.ascontiguousarray(sh[:, 0])


def tree_sum(x: Any, grids: list[int], block: int, env: str = "cuda") -> Any:
    """The fixed tree over a flat input: one pass per entry of ``grids`` (the plan's per-pass grids)."""
    for g in grids:
        x = _one_pass(x, g, block, env)
    return x[0]


def mean_of(total: Any, count: int, env: str = "cuda") -> Any:
    """``total / float32(count)`` correctly rounded (count 0: 0/0 = NaN)."""
    xp = array_namespace(total)
    denom = sf.from_int(xp.full(np.shape(total), count, dtype=xp.int64), env=env)
    return sf.div(xp.asarray(total, dtype=xp.uint32), denom, env=env)


def scatter_add(out: Any, idx: Any, src: Any, env: str = "cuda") -> Any:
    """``out[idx[j]] += src[j]`` for j = 0, 1, ... in increasing order (duplicates in source order).

    Round r adds, for every output, its r-th contribution in source order; outputs are independent, so
    this is the sequential loop over j regrouped by output.
    """
    xp = array_namespace(out)
    res = xp.array(out, dtype=xp.uint32, copy=True)
    idx = xp.asarray(idx, dtype=xp.int64)
    if idx.size == 0:
        return res
    order = xp.argsort(idx, kind="stable") if xp is np else xp.argsort(idx * idx.size + xp.arange(idx.size))
    sidx = idx[order]
    ssrc = xp.asarray(src, dtype=xp.uint32)[order]
    starts = xp.searchsorted(sidx, sidx, side="left")
    rank = xp.arange(sidx.size) - starts
    for r in range(int(rank.max()) + 1):
        sel = rank == r
        tgt = sidx[sel]
        res[tgt] = sf.add(res[tgt], ssrc[sel], env=env)
    return res


def gamma(h: int, u: float = U32) -> float:
    """Higham's gamma_h = h u / (1 - h u) (inf once h u >= 1)."""
    return h * u / (1 - h * u) if h * u < 1 else math.inf


def tree_depth(n: int, grids: list[int], block: int) -> int:
    """Additions on the longest leaf-to-root path of the tree (the h of its gamma_h bound)."""
    depth, m = 0, n
    for g in grids:
        stride = g * block
        depth += max(-(-m // stride), 1) + int(math.log2(block))
        m = g
    return depth
