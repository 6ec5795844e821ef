"""Fused attention (FlashAttention-style): tiled online-softmax forward and fused VJP, CUDA and host paths.

``softmax(Q K^T * scale + mask) V`` over (batch, heads, seq, head_dim) row-major buffers with a causal mask
(key j allowed for query i iff j <= i, torch's top-left alignment), a key-padding mask (key j of batch b
allowed iff j < kv_len[b]) and GQA/MQA grouping (query head h reads KV head h // (heads_q // heads_kv)).
A row with no allowed key outputs zeros (its log-sum-exp is +inf and its gradients are zero).

One online-softmax rule, :func:`online_update`, is written once over an :class:`Ops` namespace: NumPy float32
ops run it in the host path, sympy ops prove it (falsification/attention_tests.py). The CUDA kernels
implement the same rule per thread (one query row per thread, key tiles of ``BC`` rows in shared memory).
The launch geometry, shared-memory size and every index are :func:`attention_plan`, run with ints at launch
and with Z3 terms by ``kc check``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from native.builds import Build, register_builds
from obligations.core.symbolic import all_of, as_type, cdiv, negate, select, smax, smin

__all__ = [
    "BR",
    "BC",
    "HEAD_DIM_MAX",
    "STAGES",
    "DQ_PATHS",
    "DQ_PARTIALS_MAX",
    "default_fwd16",
    "FWD16_VARIANTS",
    "ROUTE",
    "AttentionPlan",
    "attention_plan",
    "launch_blocks",
    "Ops",
    "NUMPY_OPS",
    "online_update",
    "finalize",
    "allowed_mask",
    "attention",
    "prepare_forward",
    "attention_vjp",
    "vjp_path",
    "host_forward",
    "host_vjp",
    "kernel_source",
    "AttentionShapeError",
]

BR = 128  # query rows per block (key rows in the dK/dV kernel)
BC = 64  # key (or query) rows per tile
NT = 256  # threads per block of the tiled kernels: 16 x 16 threads of 8 x 4 micro-tiles, or 8 warps of 16 rows
HEAD_DIM_MAX = 128
ROUTE = "nvrtc-ieee"
MAX_GRID_Y = 65535
SMEM_MAX = 232448  # opt-in dynamic shared memory per block on sm_90 (227 KiB)
V_LOAD = "ldmatrix"  # how the float16 kernel reads V fragments: ldmatrix.trans, or "lds" (16-bit loads)
STAGES = 2  # shared K/V buffers of the pipelined float16 forward (cp.async STAGES - 1 tiles ahead)
# The float16 forward's variants (the ``fwd16`` argument of :func:`attention`) and the kernel each launches: the
# same arithmetic and values; "pipelined" double-buffers K/V with cp.async (0.76-0.77x torch SDPA flash at head dim
# 64, sync 0.43-0.52x: H100, 2026-11-27); "wide" is the pipelined kernel on warps of 32 rows. The default
# (fwd16=None) is :func:`default_fwd16`'s.
FWD16_VARIANTS: dict[str, str] = {"sync": "fwd16", "pipelined": "fwd16p", "wide": "fwd16w"}
# How the tiled VJP (hd_pad 64) forms dQ. "partials": the dK/dV kernel also multiplies its dS by its own keys and
# writes that block's share of dQ (one layer per key block), which a sum kernel adds in layer order: five products
# per (query, key) pair instead of seven, at the price of a layers x dQ float32 buffer. "kernel": a dQ kernel of its
# own recomputes S, P and dP over every key. Partials where that buffer is at most DQ_PARTIALS_MAX bytes (fixed, so
# the path never depends on the free memory of the moment), else the dQ kernel. H100 (1, 32, 2048, 64) float32,
# 2026-11-28: partials 3.22 ms, the dQ kernel's path 4.28 ms, torch's backward 2.66 ms.
DQ_PATHS = ("partials", "kernel")
DQ_PARTIALS_MAX = 1 << 30


class AttentionShapeError(ValueError):
    """Raised before any launch when shapes, masks or buffers are not admissible for the plan."""


# -- the plan: geometry, shared memory, every index ----------------------------------------------------


@dataclass(frozen=True)
class AttentionPlan:
    """Launch geometry, shared-memory layout and index maps of the forward, dQ and dK/dV kernels for one call."""

    batch: Any
    heads_q: Any
    heads_kv: Any
    seq_q: Any
    seq_k: Any
    head_dim: Any
    block_rows: Any
    block_cols: Any
    elem_size: Any
    threads: Any
    group: Any
    hd_pad: Any  # the head dim padded to a multiple of 64 (zero features)
    grid_y_q: Any  # batch * heads_q (grid y of forward/dQ)
    grid_y_kv: Any  # batch * heads_kv (grid y of dK/dV)
    grid_q: Any  # cdiv(seq_q, block_rows)
    grid_k: Any  # cdiv(seq_k, block_rows)
    tiles_k: Any  # key tiles of a forward/dQ block without masks
    tiles_q: Any  # query tiles of a dK/dV block without masks
    ld_rows: Any  # row stride (floats) of a shared tile indexed [feature or column][row]
    ld_cols: Any  # row stride of a shared tile indexed [feature][column]
    ld_dim: Any  # row stride of a shared tile indexed [column][feature]
    ld_half: Any  # row stride (halves) of the float16 kernel's K and V tiles
    row_tile: Any  # floats of one [hd_pad][ld_rows] tile (also holds a [block_cols][ld_rows] tile)
    col_tile: Any  # floats of one [hd_pad][ld_cols] tile (also holds a [block_cols][ld_dim] tile)
    smem_fwd32: Any  # bytes: Q^T, P^T (row tiles), K^T, V (column tiles)
    smem_fwd16: Any  # bytes: K and V tiles of halves
    stages: Any  # K/V buffers of the pipelined float16 forward
    smem_fwd16p: Any  # bytes: its [stages][K, V][block_cols][ld_half] tiles of halves (dynamic shared memory)
    smem_dq: Any  # bytes: Q^T, dO^T, dS^T, K^T, V^T, K, and lse, Delta of the block's rows
    smem_dkdv: Any  # bytes: K^T, V^T, P/dS, Q^T, dO^T, Q, dO, and lse, Delta of the query tile
    smem_dkdvq: Any  # bytes: the same with the keys row-major and P/dS room for dS key-major ([block_rows][ld_cols])
    smem_rowwise: Any  # bytes: the one-row-per-thread VJP kernels (head dims above 64): two tiles
    smem_max: Any
    tiled_vjp: Any  # the tiled dQ and dK/dV kernels run (hd_pad == 64); else the one-row-per-thread ones
    q_elems: Any
    kv_elems: Any
    lse_elems: Any
    dq_partial_elems: Any  # floats of the dQ partials: a layer (q_elems) per dK/dV block
    partial_dq: Any  # the tiled VJP forms dQ from partials (a buffer of at most DQ_PARTIALS_MAX bytes)
    dq_vec: Any  # elements a thread of the dQ sum adds (4 where head_dim % 4 == 0, else 1)
    f16_rows: Any  # query rows per block of the float16 forwards: warps of 16 rows (4 warps at hd_pad 128)
    f16_threads: Any  # their threads: 32 per 16 rows
    grid_f16: Any  # their grid x: cdiv(seq_q, f16_rows)
    f16w_rows: Any  # query rows per block of the wide float16 forward: warps of 32 rows (two m16 tiles)
    f16w_threads: Any  # its threads: 32 per 32 rows
    grid_f16w: Any  # its grid x: cdiv(seq_q, f16w_rows)
    smem_fwd16w: Any  # bytes: the pipelined kernel's K/V stages, then its [f16w_rows][ld_half] Q tile
    grid_delta: Any  # blocks of the Delta kernel (one thread a query row)
    grid_dqsum: Any  # blocks of the dQ sum (dq_vec elements a thread)
    admissible: Any
    index_bits: int = 64

    def accepts(self, q_bytes: Any, k_bytes: Any, v_bytes: Any, o_bytes: Any) -> Any:
        """The guard: admissible shape and every buffer holds its tensor (buffers divided, never multiplied)."""
        es = self.elem_size
        return all_of(
            self.admissible,
            q_bytes >= 0,
            k_bytes >= 0,
            v_bytes >= 0,
            o_bytes >= 0,
            self.q_elems <= q_bytes // es,
            self.kv_elems <= k_bytes // es,
            self.kv_elems <= v_bytes // es,
            self.q_elems <= o_bytes // es,
        )

    def regimes(self) -> dict[str, Any]:
        """Code paths a call selects: no query rows, no keys (every row fully masked), one block of rows and one
        key tile or several, each with the tiled VJP (hd_pad 64) or the one-row-per-thread one; and GQA."""
        rows = all_of(self.seq_q >= 1, self.seq_k >= 1)
        one = all_of(rows, self.grid_q == 1, self.tiles_k == 1, self.tiles_q == 1)
        many = all_of(rows, negate(all_of(self.grid_q == 1, self.tiles_k == 1, self.tiles_q == 1)))
        return {
            "empty_queries": self.seq_q == 0,
            "no_keys": all_of(self.seq_q >= 1, self.seq_k == 0),
            "one_tile_tiled": all_of(one, self.tiled_vjp),
            "one_tile_rowwise": all_of(one, negate(self.tiled_vjp)),
            "multi_tile_tiled": all_of(many, self.tiled_vjp),
            "multi_tile_rowwise": all_of(many, negate(self.tiled_vjp)),
            "grouped_heads": all_of(rows, self.group > 1),
        }

    def row(self, bx: Any, t: Any) -> Any:
        """Query (or, in dK/dV, key) row ``t`` of block bx, in the kernel's long long."""
        return as_type(bx, "int64") * self.block_rows + t

    def key(self, tile: Any, c: Any) -> Any:
        """Key (or query) row of column c of shared tile number ``tile`` (from 0)."""
        return as_type(tile, "int64") * self.block_cols + c

    def kv_head(self, h: Any) -> Any:
        """The KV head query head h reads (GQA/MQA grouping)."""
        return h // self.group

    def q_offset(self, bh: Any, i: Any, d: Any) -> Any:
        """Element offset of Q/O/dO/dQ[b, h, i, d], bh = b * heads_q + h."""
        return (as_type(bh, "int64") * self.seq_q + i) * self.head_dim + d

    def kv_row(self, b: Any, h: Any) -> Any:
        """blockIdx.y of the dK/dV kernels (and the K/V head row) that query head h of batch b reads."""
        return as_type(b, "int64") * self.heads_kv + self.kv_head(h)

    def kv_offset(self, r: Any, j: Any, d: Any) -> Any:
        """Element offset of K/V/dK/dV[r // heads_kv, r % heads_kv, j, d]."""
        return (as_type(r, "int64") * self.seq_k + j) * self.head_dim + d

    def k_offset(self, b: Any, h: Any, j: Any, d: Any) -> Any:
        """Element offset of K/V/dK/dV[b, kv_head(h), j, d] read for query head h."""
        return self.kv_offset(self.kv_row(b, h), j, d)

    def lse_offset(self, bh: Any, i: Any) -> Any:
        """Offset of the saved log-sum-exp (and Delta) of row i of head bh."""
        return as_type(bh, "int64") * self.seq_q + i

    def smem_rows(self, d: Any, i: Any) -> Any:
        """Float offset of [feature or column d][row i] in a row tile (Q^T, dO^T, P^T, dS^T, K^T/V^T of dK/dV)."""
        return d * self.ld_rows + i

    def smem_cols(self, d: Any, j: Any) -> Any:
        """Float offset of [feature d][column j] in a column tile (K^T, V^T; Q^T, dO^T of dK/dV)."""
        return d * self.ld_cols + j

    def smem_dim(self, j: Any, d: Any) -> Any:
        """Float offset of [column j][feature d] in a column tile holding a row-major tile (V, K, Q, dO)."""
        return j * self.ld_dim + d

    def smem_half(self, j: Any, d: Any) -> Any:
        """Half offset of [key j][feature d] in the float16 kernel's K and V tiles."""
        return j * self.ld_half + d

    def smem_stage(self, s: Any, w: Any, j: Any, d: Any) -> Any:
        """Half offset of [stage s][K (w 0) or V (w 1)][key j][feature d] in the pipelined float16 forward's tiles."""
        return ((s * 2 + w) * self.block_cols + j) * self.ld_half + d

    def dq_partial_offset(self, layer: Any, bh: Any, i: Any, d: Any) -> Any:
        """Float offset of dK/dV block ``layer``'s share of dQ[b, h, i, d] in the partials, bh = b * heads_q + h."""
        return (as_type(layer, "int64") * self.grid_y_q + bh) * self.seq_q * self.head_dim + self.q_offset(0, i, d)

    def dq_layer_end(self, i: Any, causal: Any, kv_len: Any) -> Any:
        """How many layers the sum adds for query row i: the key blocks below kv_len, under causal those up to i's."""
        live = cdiv(as_type(kv_len, "int64"), self.block_rows)
        return select(causal, smin(live, as_type(i, "int64") // self.block_rows + 1), live)

    def dq_meet(self, half: Any, r: Any, c: Any) -> Any:
        """Float offset of row r (< block_cols / 2), feature c of a half's slot where the dK/dV kernel's two key halves
        meet (lo + hi) in its Q^T tile."""
        return (half * (self.block_cols // 2) + r) * self.hd_pad + c

    def q_block(self, x: Any, causal: Any) -> Any:
        """The block of query rows that blockIdx.x ``x`` computes in the pipelined float16 forward: under causal
        reversed (the blocks with the most key tiles first), else x."""
        return select(causal, as_type(self.grid_f16, "int64") - 1 - x, as_type(x, "int64"))

    def micro_row(self, tid: Any, i: Any) -> Any:
        """Row i (< 8) of thread tid's micro-tile in the tiled float32 kernels (16 threads share a row)."""
        return tid // 16 * 8 + i

    def micro_col(self, tid: Any, j: Any, width: Any) -> Any:
        """Column j (< width) of thread tid's micro-tile: width 4 over a tile's columns, hd_pad // 16 over features."""
        return tid % 16 * width + j

    def warp_row(self, tid: Any, e: Any) -> Any:
        """Row of accumulator half e (< 2) of thread tid in the float16 kernel (16 rows per warp, mma m16n8k16)."""
        return tid // 32 * 16 + tid % 32 // 4 + 8 * e

    def f16_row(self, bx: Any, t: Any) -> Any:
        """Query row ``t`` of block bx of the float16 forwards (blocks of f16_rows)."""
        return as_type(bx, "int64") * self.f16_rows + t

    def f16_key_end(self, bx: Any, causal: Any, kv_len: Any) -> Any:
        """One past the last key a float16 forward block visits: kv_len, and under causal its last row + 1."""
        return select(causal, smin(as_type(kv_len, "int64"), self.f16_row(bx + 1, 0)), as_type(kv_len, "int64"))

    def f16w_row(self, bx: Any, t: Any) -> Any:
        """Query row ``t`` of block bx of the wide float16 forward (blocks of f16w_rows)."""
        return as_type(bx, "int64") * self.f16w_rows + t

    def f16w_key_end(self, bx: Any, causal: Any, kv_len: Any) -> Any:
        """One past the last key a wide float16 forward block visits: kv_len, and under causal its last row + 1."""
        return select(causal, smin(as_type(kv_len, "int64"), self.f16w_row(bx + 1, 0)), as_type(kv_len, "int64"))

    def f16w_block(self, x: Any, causal: Any) -> Any:
        """The block of query rows blockIdx.x ``x`` computes in the wide float16 forward (reversed under causal)."""
        return select(causal, as_type(self.grid_f16w, "int64") - 1 - x, as_type(x, "int64"))

    def wide_row(self, tid: Any, m: Any, e: Any) -> Any:
        """Row of accumulator half e (< 2) of m-tile m (< 2) of thread tid in the wide float16 forward (32 rows a
        warp)."""
        return tid // 32 * 32 + 16 * m + tid % 32 // 4 + 8 * e

    def smem_query(self, r: Any, d: Any) -> Any:
        """Halves offset of Q[r][d] in the wide float16 forward's shared memory (after the K/V stages)."""
        return 2 * self.stages * self.block_cols * self.ld_half + r * self.ld_half + d

    def key_end(self, bx: Any, causal: Any, kv_len: Any) -> Any:
        """One past the last key a forward/dQ block visits: kv_len, and under causal its last row + 1."""
        return select(causal, smin(as_type(kv_len, "int64"), self.row(bx + 1, 0)), as_type(kv_len, "int64"))

    def query_start(self, bx: Any, causal: Any) -> Any:
        """First query row a dK/dV block visits: 0, or under causal its first key's tile start."""
        return select(causal, self.row(bx, 0) // self.block_cols * self.block_cols, as_type(0, "int64"))


def launch_blocks(elems: Any, per_block: Any) -> Any:
    """Blocks of ``per_block`` elements that cover ``elems`` (the grids of the Delta kernel and the dQ sum)."""
    return cdiv(elems, per_block)


def attention_plan(
    batch: Any,
    heads_q: Any,
    heads_kv: Any,
    seq_q: Any,
    seq_k: Any,
    head_dim: Any,
    block_rows: Any = BR,
    block_cols: Any = BC,
    elem_size: Any = 4,
) -> AttentionPlan:
    """The plan of one attention call; plain integer code run with ints at launch and with Z3 terms."""
    group = heads_q // heads_kv
    hd_pad = cdiv(head_dim, 64) * 64
    bh = as_type(batch, "int64") * heads_q
    bkv = as_type(batch, "int64") * heads_kv
    admissible = all_of(
        batch >= 1,
        heads_kv >= 1,
        heads_q >= heads_kv,
        heads_q % heads_kv == 0,
        head_dim >= 1,
        head_dim <= HEAD_DIM_MAX,
        seq_q >= 0,
        seq_k >= 0,
        bh <= MAX_GRID_Y,
    )
    ld_rows, ld_cols, ld_dim, ld_half = block_rows + 4, block_cols + 4, hd_pad + 4, hd_pad + 8
    dq_vec = select(head_dim % 4 == 0, 4, 1)
    # The float16 forward at hd_pad 128 holds 232 registers a thread: blocks of 4 warps let two blocks share an SM
    # (their barriers and loads interleave) where one block of 8 warps filled it (flash/ours 0.65 -> 0.71 at head
    # dim 128 on an H200, 2026-11-28, the same bits); at 64 the 8-warp block is the faster (0.78 against 0.66).
    f16_rows = select(hd_pad <= 64, block_rows, block_rows // 2)
    row_tile, col_tile = hd_pad * ld_rows, hd_pad * ld_cols
    return AttentionPlan(
        batch,
        heads_q,
        heads_kv,
        seq_q,
        seq_k,
        head_dim,
        block_rows,
        block_cols,
        elem_size,
        NT,
        group,
        hd_pad,
        bh,
        bkv,
        cdiv(seq_q, block_rows),
        cdiv(seq_k, block_rows),
        cdiv(seq_k, block_cols),
        cdiv(seq_q, block_cols),
        ld_rows,
        ld_cols,
        ld_dim,
        ld_half,
        row_tile,
        col_tile,
        4 * (2 * row_tile + 2 * col_tile),
        2 * 2 * block_cols * ld_half,
        STAGES,
        2 * STAGES * 2 * block_cols * ld_half,
        4 * (3 * row_tile + 3 * col_tile + 2 * block_rows),
        4 * (3 * row_tile + 4 * col_tile + 2 * block_cols),
        4 * (2 * row_tile + block_rows * ld_cols + 4 * col_tile + block_rows * ld_dim + 2 * block_cols),
        4 * 2 * block_cols * hd_pad,
        SMEM_MAX,
        hd_pad <= 64,
        bh * seq_q * head_dim,
        bkv * seq_k * head_dim,
        bh * seq_q,
        # q_elems capped only so that the product cannot overflow: where partial_dq holds it is below the cap
        cdiv(seq_k, block_rows) * smin(bh * seq_q * head_dim, DQ_PARTIALS_MAX // 4),
        all_of(hd_pad <= 64, bh * seq_q * head_dim <= DQ_PARTIALS_MAX // 4 // smax(cdiv(seq_k, block_rows), 1)),
        dq_vec,
        f16_rows,
        32 * (f16_rows // 16),
        cdiv(seq_q, f16_rows),
        block_rows,
        32 * (block_rows // 32),
        cdiv(seq_q, block_rows),
        2 * (2 * STAGES * block_cols + block_rows) * ld_half,
        launch_blocks(bh * seq_q, NT),
        launch_blocks(bh * seq_q * head_dim, NT * dq_vec),
        admissible,
    )


# -- the online-softmax rule, written once ------------------------------------------------------------


@dataclass(frozen=True)
class Ops:
    """The operations :func:`online_update` needs: NumPy float32 at run time, sympy in the proof."""

    name: str
    exp: Callable[[Any], Any]
    maximum: Callable[[Any, Any], Any]
    rowmax: Callable[[Any], Any]
    rowsum: Callable[[Any], Any]
    matmul: Callable[[Any, Any], Any]  # sum_j p_j v_j
    where: Callable[[Any, Any, Any], Any]
    is_neginf: Callable[[Any], Any]
    positive: Callable[[Any], Any]
    col: Callable[[Any], Any]  # a per-row value broadcast against a row's entries
    sub: Callable[[Any, Any], Any]  # entries minus a per-row value
    div: Callable[[Any, Any], Any]


def _np_exp(x: Any) -> Any:
    with np.errstate(all="ignore"):
        return np.exp(np.asarray(x, dtype=np.float64)).astype(np.float32)


def _np_where(c: Any, a: Any, b: Any) -> Any:
    return np.where(c, a, b).astype(np.float32)


def _np_div(a: Any, b: Any) -> Any:
    with np.errstate(all="ignore"):
        return (a / b).astype(np.float32)


def _np_sub(a: Any, b: Any) -> Any:
    with np.errstate(all="ignore"):
        return (a - b).astype(np.float32)


NUMPY_OPS = Ops(
    name="numpy-float32",
    exp=_np_exp,
    maximum=np.maximum,
    rowmax=lambda s: s.max(axis=-1),
    rowsum=lambda p: p.sum(axis=-1, dtype=np.float32),
    matmul=lambda p, v: np.matmul(p, v).astype(np.float32),
    where=_np_where,
    is_neginf=np.isneginf,
    positive=lambda x: x > 0,
    col=lambda x: x[..., None],
    sub=_np_sub,
    div=_np_div,
)


def online_update(state: tuple[Any, Any, Any], s: Any, v: Any, ops: Ops = NUMPY_OPS) -> tuple[Any, Any, Any]:
    """One key tile into the running (m, lsum, o): blocked scores are -inf and contribute exactly 0.

    m' = max(m, max_j s_j); alpha = 1 if m' = -inf else exp(m - m'); p_j = 0 if s_j = -inf else exp(s_j - m');
    l' = alpha l + sum_j p_j; o' = alpha o + sum_j p_j v_j. The guard on alpha is the n = 0 case: with both
    m and m' = -inf (no allowed key yet) the unguarded exp(-inf - (-inf)) is NaN.
    """
    m, lsum, o = state
    m_new = ops.maximum(m, ops.rowmax(s))
    alpha = ops.where(ops.is_neginf(m_new), 1, ops.exp(ops.sub(m, m_new)))
    p = ops.where(ops.is_neginf(s), 0, ops.exp(ops.sub(s, ops.col(m_new))))
    return m_new, alpha * lsum + ops.rowsum(p), ops.col(alpha) * o + ops.matmul(p, v)


def finalize(state: tuple[Any, Any, Any], ops: Ops = NUMPY_OPS) -> Any:
    """o / lsum, and 0 where no key was allowed (lsum = 0): the documented value of a fully masked row."""
    _, lsum, o = state
    pos = ops.positive(lsum)
    return ops.where(ops.col(pos), ops.div(o, ops.col(ops.where(pos, lsum, 1))), 0)


# -- host path (NumPy float32, the same key tiling) ----------------------------------------------------


def allowed_mask(seq_q: int, seq_k: int, causal: bool, kv_lens: np.ndarray) -> np.ndarray:
    """(batch, 1, seq_q, seq_k) bool: key j allowed for query i of batch b (j < kv_len[b], causal j <= i)."""
    j = np.arange(seq_k)
    ok = j[None, None, None, :] < np.asarray(kv_lens)[:, None, None, None]
    if causal:
        ok = ok & (j[None, :] <= np.arange(seq_q)[:, None])[None, None]
    return ok


def _scale(head_dim: int, scale: float | None) -> np.float32:
    return np.float32(scale if scale is not None else (1.0 / np.sqrt(head_dim) if head_dim else 1.0))


def _expand(x: np.ndarray, heads_q: int) -> np.ndarray:
    return np.repeat(x, heads_q // x.shape[1], axis=1)


def _lens(kv_lens: Any, batch: int, seq_k: int) -> np.ndarray:
    lens = np.full(batch, seq_k, dtype=np.int64) if kv_lens is None else np.asarray(kv_lens, dtype=np.int64)
    if lens.shape != (batch,) or (lens < 0).any() or (lens > seq_k).any():
        raise AttentionShapeError(f"kv_lens must be {batch} lengths in [0, {seq_k}], got {lens.tolist()}")
    return lens


def host_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    kv_lens: Any = None,
    scale: float | None = None,
    tile: int = BC,
    update: Callable[..., Any] = online_update,
) -> tuple[np.ndarray, np.ndarray]:
    """(out, lse) in float32: key tiles of ``tile`` rows folded into the running state by ``update``."""
    q, k, v = (np.asarray(a, dtype=np.float32) for a in (q, k, v))
    b, hq, lq, d = q.shape
    lk = k.shape[2]
    sc = _scale(d, scale)
    lens = _lens(kv_lens, b, lk)
    ke, ve = _expand(k, hq), _expand(v, hq)
    ok = allowed_mask(lq, lk, causal, lens)
    state = (
        np.full((b, hq, lq), -np.inf, np.float32),
        np.zeros((b, hq, lq), np.float32),
        np.zeros((b, hq, lq, d), np.float32),
    )
    for t0 in range(0, lk, max(int(tile), 1)):
        sl = slice(t0, t0 + tile)
        s = (np.matmul(q, ke[:, :, sl].swapaxes(-1, -2)) * sc).astype(np.float32)
        s = np.where(ok[..., sl], s, np.float32(-np.inf)).astype(np.float32)
        state = update(state, s, ve[:, :, sl])
    m, lsum, _ = state
    with np.errstate(all="ignore"):
        lse = np.where(lsum > 0, m + np.log(np.where(lsum > 0, lsum, 1)), np.inf).astype(np.float32)
    return finalize(state), lse


def softmax_jacobian_ds(p: np.ndarray, dp: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """dS = P o (dP - Delta), Delta = rowsum(dO o O) = rowsum(P o dP): both terms of the softmax Jacobian."""
    return (p * (dp - delta[..., None])).astype(np.float32)


def host_vjp(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    dout: np.ndarray,
    *,
    causal: bool = False,
    kv_lens: Any = None,
    scale: float | None = None,
    tile: int = BC,
    ds_rule: Callable[..., Any] = softmax_jacobian_ds,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) in float32 from the saved out and lse, key tile by key tile (scores never stored whole)."""
    q, k, v, out, dout = (np.asarray(a, dtype=np.float32) for a in (q, k, v, out, dout))
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    sc = _scale(d, scale)
    lens = _lens(kv_lens, b, lk)
    ke, ve = _expand(k, hq), _expand(v, hq)
    ok = allowed_mask(lq, lk, causal, lens)
    delta = (dout * out).sum(axis=-1, dtype=np.float32)
    dq = np.zeros_like(q)
    dke, dve = np.zeros_like(ke), np.zeros_like(ve)
    for t0 in range(0, lk, max(int(tile), 1)):
        sl = slice(t0, t0 + tile)
        s = (np.matmul(q, ke[:, :, sl].swapaxes(-1, -2)) * sc).astype(np.float32)
        with np.errstate(all="ignore"):
            p = np.where(ok[..., sl], _np_exp(s - lse[..., None]), 0).astype(np.float32)
        dve[:, :, sl] = np.matmul(p.swapaxes(-1, -2), dout)
        dp = np.matmul(dout, ve[:, :, sl].swapaxes(-1, -2)).astype(np.float32)
        ds = ds_rule(p, dp, delta)
        dq += np.matmul(ds, ke[:, :, sl])
        dke[:, :, sl] = np.matmul(ds.swapaxes(-1, -2), q)
    g = hq // hkv
    dk = (dke * sc).reshape(b, hkv, g, lk, d).sum(axis=2, dtype=np.float32)
    dv = dve.reshape(b, hkv, g, lk, d).sum(axis=2, dtype=np.float32)
    return (dq * sc).astype(np.float32), dk.astype(np.float32), dv.astype(np.float32)


# -- CUDA sources ----------------------------------------------------------------------------------------
# Small indices (threads, shared-memory offsets) are unsigned and global offsets long long: the audit's index-64
# rule rejects signed 32-bit index arithmetic (cvt.s64.s32, mad.lo.s32).

_MACROS = r"""
#define HD {hd}
#define HDP {hdp}
#define BR {br}
#define BC {bc}
#define NT {nt}
#define LDR {ldr}
#define LDC {ldc}
#define LDD {ldd}
#define LDH {ldh}
#define DN (HDP / 16)
#define INFINITY __int_as_float(0x7f800000)
// A shared-memory offset a * b + c as one unsigned 32-bit mad (the shared window is 32-bit; the plan proves every
// shared offset < 2^24, ATT-PLAN-smem). Global offsets are long long throughout.
__device__ __forceinline__ unsigned IX(unsigned a, unsigned b, unsigned c) {{
    unsigned r; asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c)); return r; }}
"""

_SIMT = r"""
typedef float T;
// acc[i][j] += sum_k At[k * lda + i] * B[k * ldb + j] (i < 8, j < N), k ascending, one fmaf (one rounding) per step.
template <unsigned K, unsigned N>
__device__ __forceinline__ void mm(float (&acc)[8][N], const float* At, unsigned lda, const float* B, unsigned ldb) {
    #pragma unroll 4
    for (unsigned k = 0; k < K; ++k, At += lda, B += ldb) {
        const float4 a0 = *reinterpret_cast<const float4*>(At);
        const float4 a1 = *reinterpret_cast<const float4*>(At + 4);
        const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        float b[N];
        #pragma unroll
        for (unsigned j = 0; j < N; j += 4) {
            const float4 x = *reinterpret_cast<const float4*>(B + j);
            b[j] = x.x; b[j + 1] = x.y; b[j + 2] = x.z; b[j + 3] = x.w;
        }
        #pragma unroll
        for (unsigned i = 0; i < 8; ++i) {
            #pragma unroll
            for (unsigned j = 0; j < N; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
    }
}
template <unsigned N>
__device__ __forceinline__ void zero(float (&acc)[8][N]) {
    #pragma unroll
    for (unsigned i = 0; i < 8; ++i) {
        #pragma unroll
        for (unsigned j = 0; j < N; ++j) acc[i][j] = 0.0f;
    }
}
// Rows [r0, r0 + ROWS) of a (rows, HD) tensor transposed into shared memory: dst[d * ld + r] (zero outside);
// float4 global loads where HD is a multiple of 4 (every row then starts 16-byte aligned).
template <unsigned ROWS>
__device__ __forceinline__ void load_t(float* dst, unsigned ld, const T* __restrict__ src, long long base,
                                       long long r0, long long end) {
    if (HD % 4 == 0) {
        for (unsigned e = threadIdx.x; e < ROWS * (HDP / 4); e += NT) {
            const unsigned r = e % ROWS, d = e / ROWS * 4;
            const long long j = r0 + r;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (j < end && d < HD) x = *reinterpret_cast<const float4*>(src + (base + j) * HD + d);
            float* p = dst + IX(d, ld, r);
            p[0] = x.x; p[ld] = x.y; p[2 * ld] = x.z; p[3 * ld] = x.w;
        }
    } else {
        for (unsigned e = threadIdx.x; e < ROWS * HDP; e += NT) {
            const unsigned r = e % ROWS, d = e / ROWS;
            const long long j = r0 + r;
            dst[IX(d, ld, r)] = (j < end && d < HD) ? src[(base + j) * HD + d] : 0.0f;
        }
    }
}
// The same rows row-major: dst[r * ld + d].
template <unsigned ROWS>
__device__ __forceinline__ void load_r(float* dst, unsigned ld, const T* __restrict__ src, long long base,
                                       long long r0, long long end) {
    if (HD % 4 == 0) {
        for (unsigned e = threadIdx.x; e < ROWS * (HDP / 4); e += NT) {
            const unsigned r = e / (HDP / 4), d = e % (HDP / 4) * 4;
            const long long j = r0 + r;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (j < end && d < HD) x = *reinterpret_cast<const float4*>(src + (base + j) * HD + d);
            *reinterpret_cast<float4*>(dst + IX(r, ld, d)) = x;
        }
    } else {
        for (unsigned e = threadIdx.x; e < ROWS * HDP; e += NT) {
            const unsigned r = e / HDP, d = e % HDP;
            const long long j = r0 + r;
            dst[IX(r, ld, d)] = (j < end && d < HD) ? src[(base + j) * HD + d] : 0.0f;
        }
    }
}
// Max and sum over the 16 threads that share a row (xor butterfly: every lane gets the same value).
__device__ __forceinline__ float max16(float x) {
    #pragma unroll
    for (unsigned o = 8; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float sum16(float x) {
    #pragma unroll
    for (unsigned o = 8; o > 0; o >>= 1) x = x + __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
// Thread (ty, tx) writes its 8 x 4 micro-tile transposed: dst[(tx * 4 + j) * LDR + ty * 8 + i] = x[i][j].
__device__ __forceinline__ void store_t(float* dst, const float (&x)[8][4], unsigned tx, unsigned ty) {
    float* p0 = dst + IX(tx * 4, LDR, ty * 8);
    #pragma unroll
    for (unsigned j = 0; j < 4; ++j) {
        float* p = p0 + j * LDR;
        *reinterpret_cast<float4*>(p) = make_float4(x[0][j], x[1][j], x[2][j], x[3][j]);
        *reinterpret_cast<float4*>(p + 4) = make_float4(x[4][j], x[5][j], x[6][j], x[7][j]);
    }
}
"""

_FORWARD = r"""
// One block: BR query rows of one head; key tiles of BC rows. Thread (ty, tx) owns rows ty*8..+8, keys tx*4..+4 of
// the score tile and features tx*DN..+DN of the output. S = Q K^T (d ascending), online softmax per row over the
// 16 threads of the row, P^T through shared memory, O += P V (keys ascending).
extern "C" __global__ void __launch_bounds__(NT) attn_fwd(
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
        float* __restrict__ lse, const long long* __restrict__ kv_len, long long Hq, long long Hkv,
        long long Lq, long long Lk, float scale, int causal) {
    extern __shared__ __align__(16) float sm[];
    float* qt = sm;                  // [HDP][LDR] Q^T
    float* pt = qt + HDP * LDR;      // [BC][LDR] P^T
    float* kt = pt + HDP * LDR;      // [HDP][LDC] K^T
    float* vs = kt + HDP * LDC;      // [BC][LDD] V
    const unsigned tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const long long bh = blockIdx.y, b = bh / Hq, h = bh - b * Hq, hk = h / (Hq / Hkv);
    const long long r0 = (long long)blockIdx.x * BR;
    const long long klen = kv_len[b];
    const long long kend = causal ? min(klen, r0 + BR) : klen;
    const long long kbase = (b * Hkv + hk) * Lk;
    load_t<BR>(qt, LDR, q, bh * Lq, r0, Lq);
    float acc[8][DN], m[8], l[8];
    zero(acc);
    #pragma unroll
    for (unsigned i = 0; i < 8; ++i) { m[i] = -INFINITY; l[i] = 0.0f; }
    for (long long t0 = 0; t0 < kend; t0 += BC) {
        __syncthreads();
        load_t<BC>(kt, LDC, k, kbase, t0, kend);
        load_r<BC>(vs, LDD, v, kbase, t0, kend);
        __syncthreads();
        float s[8][4];
        zero(s);
        mm<HDP, 4>(s, qt + ty * 8, LDR, kt + tx * 4, LDC);
        const bool full = t0 + BC <= kend && (!causal || t0 + BC - 1 <= r0 + ty * 8);  // no key of the tile masked
        #pragma unroll
        for (unsigned i = 0; i < 8; ++i) {
            const long long row = r0 + ty * 8 + i;
            float tmax = -INFINITY;
            #pragma unroll
            for (unsigned j = 0; j < 4; ++j) {
                const long long key = t0 + tx * 4 + j;
                const bool ok = key < kend && (!causal || key <= row);
                s[i][j] = ok ? s[i][j] * scale : -INFINITY;
                tmax = fmaxf(tmax, s[i][j]);
            }
            const float mnew = fmaxf(m[i], max16(tmax));
            const float alpha = (mnew == -INFINITY) ? 1.0f : expf(m[i] - mnew);
            float ps = 0.0f;
            if (full) {  // every score finite: exp needs no guard
                #pragma unroll
                for (unsigned j = 0; j < 4; ++j) {
                    s[i][j] = expf(s[i][j] - mnew);
                    ps = ps + s[i][j];
                }
            } else {
                #pragma unroll
                for (unsigned j = 0; j < 4; ++j) {
                    s[i][j] = (s[i][j] == -INFINITY) ? 0.0f : expf(s[i][j] - mnew);
                    ps = ps + s[i][j];
                }
            }
            l[i] = l[i] * alpha + sum16(ps);
            m[i] = mnew;
            #pragma unroll
            for (unsigned c = 0; c < DN; ++c) acc[i][c] = acc[i][c] * alpha;
        }
        store_t(pt, s, tx, ty);
        __syncthreads();
        mm<BC, DN>(acc, pt + ty * 8, LDR, vs + tx * DN, LDD);
    }
    #pragma unroll
    for (unsigned i = 0; i < 8; ++i) {
        const long long row = r0 + ty * 8 + i;
        if (row < Lq) {
            #pragma unroll
            for (unsigned c = 0; c < DN; ++c) {
                const unsigned d = tx * DN + c;
                if (d < HD) o[(bh * Lq + row) * HD + d] = l[i] > 0.0f ? acc[i][c] / l[i] : 0.0f;
            }
            if (tx == 0) lse[bh * Lq + row] = l[i] > 0.0f ? m[i] + logf(l[i]) : INFINITY;
        }
    }
}
"""

_F16_HEAD = r"""
typedef unsigned short T;
// (lo, hi) rounded to float16 and packed, lo in the low half (cvt's first source goes to the upper half).
__device__ __forceinline__ unsigned pack_f16(float lo, float hi) {
    unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }
__device__ __forceinline__ unsigned short to_f16(float x) {
    unsigned short h; asm("{.reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t;}" : "=h"(h) : "f"(x)); return h; }
// P's A operand for k-step kk of P V (keys 16 kk .. 16 kk + 15) from a warp's m16 tile of scores, rounded to
// float16: the score fragment of S = Q K^T is the A fragment of P V.
__device__ __forceinline__ void p_fragment(unsigned (&p)[4], const float (&s)[BC / 8][4], unsigned kk) {
    p[0] = pack_f16(s[2 * kk][0], s[2 * kk][1]);
    p[1] = pack_f16(s[2 * kk][2], s[2 * kk][3]);
    p[2] = pack_f16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    p[3] = pack_f16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}
// D = A B + C on tensor cores: A 16x16 (row), B 16x8 (col) float16, C and D 16x8 float32.
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a; asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p)); return a; }
__device__ __forceinline__ unsigned qpair(const T* __restrict__ q, long long base, long long row, long long Lq,
                                          unsigned d) {
    const unsigned lo = (row < Lq && d < HD) ? q[(base + row) * HD + d] : 0u;
    const unsigned hi = (row < Lq && d + 1 < HD) ? q[(base + row) * HD + d + 1] : 0u;
    return lo | (hi << 16);
}
// Rows [t0, t0 + BC) of K or V (half bits) into dst[c * LDH + d], zero outside.
__device__ __forceinline__ void load_h(T* dst, const T* __restrict__ src, long long base, long long t0,
                                       long long end) {
    if (HD % 8 == 0) {
        for (unsigned e = threadIdx.x; e < BC * (HDP / 8); e += NT) {
            const unsigned c = e / (HDP / 8), d = e % (HDP / 8) * 8;
            const long long j = t0 + c;
            uint4 x = make_uint4(0u, 0u, 0u, 0u);
            if (j < end && d < HD) x = *reinterpret_cast<const uint4*>(src + (base + j) * HD + d);
            *reinterpret_cast<uint4*>(dst + IX(c, LDH, d)) = x;
        }
    } else {
        for (unsigned e = threadIdx.x; e < BC * HDP; e += NT) {
            const unsigned c = e / HDP, d = e % HDP;
            const long long j = t0 + c;
            dst[IX(c, LDH, d)] = (j < end && d < HD) ? src[(base + j) * HD + d] : (T)0;
        }
    }
}
"""

# The online softmax step both float16 kernels take after a tile's scores: scale and mask, the tile's row maxima,
# the rescale of l and O (one text: the two kernels' sources hold it byte for byte).
_F16_SOFTMAX_STEP = r"""
        const bool full = t0 + BC <= kend && (!causal || t0 + BC - 1 <= r0 + warp * 16);
        if (full) {
            #pragma unroll
            for (unsigned n = 0; n < BC / 8; ++n) {
                #pragma unroll
                for (unsigned e = 0; e < 2; ++e) {
                    sc[n][e] = sc[n][e] * sl;
                    sc[n][2 + e] = sc[n][2 + e] * sl;
                    tmax0 = fmaxf(tmax0, sc[n][e]);
                    tmax1 = fmaxf(tmax1, sc[n][2 + e]);
                }
            }
        } else {
            #pragma unroll
            for (unsigned n = 0; n < BC / 8; ++n) {
                #pragma unroll
                for (unsigned e = 0; e < 2; ++e) {
                    const long long key = t0 + n * 8 + 2 * t + e;
                    const bool ok0 = key < kend && (!causal || key <= row0);
                    const bool ok1 = key < kend && (!causal || key <= row1);
                    sc[n][e] = ok0 ? sc[n][e] * sl : -INFINITY;
                    sc[n][2 + e] = ok1 ? sc[n][2 + e] * sl : -INFINITY;
                    tmax0 = fmaxf(tmax0, sc[n][e]);
                    tmax1 = fmaxf(tmax1, sc[n][2 + e]);
                }
            }
        }
        tmax0 = fmaxf(tmax0, __shfl_xor_sync(0xffffffffu, tmax0, 1));
        tmax0 = fmaxf(tmax0, __shfl_xor_sync(0xffffffffu, tmax0, 2));
        tmax1 = fmaxf(tmax1, __shfl_xor_sync(0xffffffffu, tmax1, 1));
        tmax1 = fmaxf(tmax1, __shfl_xor_sync(0xffffffffu, tmax1, 2));
        const float mnew0 = fmaxf(m0, tmax0), mnew1 = fmaxf(m1, tmax1);
        const float alpha0 = (mnew0 == -INFINITY) ? 1.0f : exp2f(m0 - mnew0);
        const float alpha1 = (mnew1 == -INFINITY) ? 1.0f : exp2f(m1 - mnew1);
        float ps0 = 0.0f, ps1 = 0.0f;
        if (full) {
            #pragma unroll
            for (unsigned n = 0; n < BC / 8; ++n) {
                #pragma unroll
                for (unsigned e = 0; e < 2; ++e) {
                    sc[n][e] = exp2f(sc[n][e] - mnew0);
                    sc[n][2 + e] = exp2f(sc[n][2 + e] - mnew1);
                    ps0 = ps0 + sc[n][e];
                    ps1 = ps1 + sc[n][2 + e];
                }
            }
        } else {
            #pragma unroll
            for (unsigned n = 0; n < BC / 8; ++n) {
                #pragma unroll
                for (unsigned e = 0; e < 2; ++e) {
                    sc[n][e] = (sc[n][e] == -INFINITY) ? 0.0f : exp2f(sc[n][e] - mnew0);
                    sc[n][2 + e] = (sc[n][2 + e] == -INFINITY) ? 0.0f : exp2f(sc[n][2 + e] - mnew1);
                    ps0 = ps0 + sc[n][e];
                    ps1 = ps1 + sc[n][2 + e];
                }
            }
        }
        l0 = l0 * alpha0 + ps0;
        l1 = l1 * alpha1 + ps1;
        m0 = mnew0;
        m1 = mnew1;
        #pragma unroll
        for (unsigned n = 0; n < HDP / 8; ++n) {
            oacc[n][0] = oacc[n][0] * alpha0; oacc[n][1] = oacc[n][1] * alpha0;
            oacc[n][2] = oacc[n][2] * alpha1; oacc[n][3] = oacc[n][3] * alpha1;
        }
"""[1:]

# _F16_HEAD + _F16_KERNEL is the float16 kernel's source as it stood in one piece ([1:]: no leading newline).
# The float16 kernels' start of a row block, one text: the log2 scale, this warp's Q fragments as mma A operands
# (read by ``load``: the plain kernel's qpair, the pipelined one's qpair2) and the zeroed accumulators and state.
_F16_QUERY_FRAGMENTS = r"""    const float sl = scale * 1.44269504088896341f;
    unsigned qa[HDP / 16][4];
    #pragma unroll
    for (unsigned kk = 0; kk < HDP / 16; ++kk) {
        const unsigned d = kk * 16 + 2 * t;
        qa[kk][0] = QPAIR(q, bh * Lq, row0, Lq, d);
        qa[kk][1] = QPAIR(q, bh * Lq, row1, Lq, d);
        qa[kk][2] = QPAIR(q, bh * Lq, row0, Lq, d + 8);
        qa[kk][3] = QPAIR(q, bh * Lq, row1, Lq, d + 8);
    }
    float oacc[HDP / 8][4];
    #pragma unroll
    for (unsigned n = 0; n < HDP / 8; ++n) {
        oacc[n][0] = 0.0f; oacc[n][1] = 0.0f; oacc[n][2] = 0.0f; oacc[n][3] = 0.0f;
    }
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
"""


def _f16_query_fragments(load: str) -> str:
    """:data:`_F16_QUERY_FRAGMENTS` with its Q pairs read by the device function ``load``."""
    return _F16_QUERY_FRAGMENTS.replace("QPAIR(", f"{load}(")


_F16_KERNEL = (
    r"""
// Float16 storage on tensor cores (FlashAttention-2 layout): warps of 16 query rows (BR / 16 of them: the plan's
// f16_rows), key tiles of BC rows.
// S = Q K^T and O += P V are mma.sync m16n8k16 with float32 accumulators; the scale, mask, online softmax (exp2f
// of scores in log2 units) and the row sums run in float32; P is rounded to float16 for P V; O / l rounded once.
extern "C" __global__ void __launch_bounds__(NT) attn_fwd16(
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
        float* __restrict__ lse, const long long* __restrict__ kv_len, long long Hq, long long Hkv,
        long long Lq, long long Lk, float scale, int causal) {
    __shared__ __align__(16) T ks[BC * LDH];
    __shared__ __align__(16) T vs[BC * LDH];
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long long bh = blockIdx.y, b = bh / Hq, h = bh - b * Hq, hk = h / (Hq / Hkv);
    const long long r0 = (long long)blockIdx.x * BR;
    const long long row0 = r0 + warp * 16 + g, row1 = row0 + 8;
    const long long klen = kv_len[b];
    const long long kend = causal ? min(klen, r0 + BR) : klen;
    const long long kbase = (b * Hkv + hk) * Lk;
    // Scores in log2 units: t = fl(S sl), sl = fl(scale log2(e)); P = exp2f(t - m) (2 ulp, as expf).
"""
    + _f16_query_fragments("qpair")
    + r"""    for (long long t0 = 0; t0 < kend; t0 += BC) {
        __syncthreads();
        load_h(ks, k, kbase, t0, kend);
        load_h(vs, v, kbase, t0, kend);
        __syncthreads();
        float sc[BC / 8][4];
        const T* kfrag = ks + IX(g, LDH, 2 * t);
        #pragma unroll
        for (unsigned n = 0; n < BC / 8; ++n) {
            sc[n][0] = 0.0f; sc[n][1] = 0.0f; sc[n][2] = 0.0f; sc[n][3] = 0.0f;
            #pragma unroll
            for (unsigned kk = 0; kk < HDP / 16; ++kk) {
                const T* kr = kfrag + n * 8 * LDH + kk * 16;  // B fragment: K[n*8 + g][kk*16 + 2t .. +1], +8
                mma16816(sc[n], qa[kk], *reinterpret_cast<const unsigned*>(kr),
                         *reinterpret_cast<const unsigned*>(kr + 8));
            }
        }
        float tmax0 = -INFINITY, tmax1 = -INFINITY;
        // Every key of the tile allowed for every row of the warp (warp-uniform): no per-entry mask, and every
        // score finite, so exp needs no guard (the guarded form gives the same values there).
"""
    + _F16_SOFTMAX_STEP
    + r"""#if V_LDMATRIX
        const T* vfrag = vs + IX(lane % 8 + (lane / 8 & 1) * 8, LDH, (lane / 16) * 8);
#else
        const T* vfrag = vs + IX(2 * t, LDH, g);
#endif
        #pragma unroll
        for (unsigned kk = 0; kk < BC / 16; ++kk) {
            unsigned pa[4];
            p_fragment(pa, sc, kk);
            #pragma unroll
            for (unsigned np = 0; np < HDP / 16; ++np) {
                unsigned b0, b1, b2, b3;
#if V_LDMATRIX
                const T* src = vfrag + kk * 16 * LDH + np * 16;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(smem_addr(src)));
#else
                const T* c0 = vfrag + kk * 16 * LDH + np * 16;
                b0 = c0[0] | ((unsigned)c0[LDH] << 16);
                b1 = c0[8 * LDH] | ((unsigned)c0[9 * LDH] << 16);
                b2 = c0[8] | ((unsigned)c0[LDH + 8] << 16);
                b3 = c0[8 * LDH + 8] | ((unsigned)c0[9 * LDH + 8] << 16);
#endif
                mma16816(oacc[2 * np], pa, b0, b1);
                mma16816(oacc[2 * np + 1], pa, b2, b3);
            }
        }
    }
    l0 = l0 + __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 = l0 + __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 = l1 + __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 = l1 + __shfl_xor_sync(0xffffffffu, l1, 2);
    #pragma unroll
    for (unsigned n = 0; n < HDP / 8; ++n) {
        #pragma unroll
        for (unsigned e = 0; e < 2; ++e) {
            const unsigned d = n * 8 + 2 * t + e;
            if (row0 < Lq && d < HD) o[(bh * Lq + row0) * HD + d] = to_f16(l0 > 0.0f ? oacc[n][e] / l0 : 0.0f);
            if (row1 < Lq && d < HD) o[(bh * Lq + row1) * HD + d] = to_f16(l1 > 0.0f ? oacc[n][2 + e] / l1 : 0.0f);
        }
    }
    const float ln2 = 0.693147180559945309f;  // m is in log2 units
    if (t == 0 && row0 < Lq) lse[bh * Lq + row0] = l0 > 0.0f ? m0 * ln2 + logf(l0) : INFINITY;
    if (t == 0 && row1 < Lq) lse[bh * Lq + row1] = l1 > 0.0f ? m1 * ln2 + logf(l1) : INFINITY;
}
"""
)[1:]

# The pipelined float16 forwards' end of a 16-row m-tile, one text: the row sums across the quad, O / l rounded to
# float16 (one 32-bit store where HD is even), lse in natural-log units.
_F16_STORE = r"""    l0 = l0 + __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 = l0 + __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 = l1 + __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 = l1 + __shfl_xor_sync(0xffffffffu, l1, 2);
    #pragma unroll
    for (unsigned n = 0; n < HDP / 8; ++n) {
        const unsigned d = n * 8 + 2 * t;
        const float a0 = l0 > 0.0f ? oacc[n][0] / l0 : 0.0f, a1 = l0 > 0.0f ? oacc[n][1] / l0 : 0.0f;
        const float c0 = l1 > 0.0f ? oacc[n][2] / l1 : 0.0f, c1 = l1 > 0.0f ? oacc[n][3] / l1 : 0.0f;
        if (HD % 2 == 0) {  // d is even: both halves in the row or neither, one 32-bit store
            if (row0 < Lq && d < HD) *reinterpret_cast<unsigned*>(o + (bh * Lq + row0) * HD + d) = pack_f16(a0, a1);
            if (row1 < Lq && d < HD) *reinterpret_cast<unsigned*>(o + (bh * Lq + row1) * HD + d) = pack_f16(c0, c1);
        } else {
            if (row0 < Lq && d < HD) o[(bh * Lq + row0) * HD + d] = to_f16(a0);
            if (row0 < Lq && d + 1 < HD) o[(bh * Lq + row0) * HD + d + 1] = to_f16(a1);
            if (row1 < Lq && d < HD) o[(bh * Lq + row1) * HD + d] = to_f16(c0);
            if (row1 < Lq && d + 1 < HD) o[(bh * Lq + row1) * HD + d + 1] = to_f16(c1);
        }
    }
    const float ln2 = 0.693147180559945309f;  // m is in log2 units
    if (t == 0 && row0 < Lq) lse[bh * Lq + row0] = l0 > 0.0f ? m0 * ln2 + logf(l0) : INFINITY;
    if (t == 0 && row1 < Lq) lse[bh * Lq + row1] = l1 > 0.0f ? m1 * ln2 + logf(l1) : INFINITY;
"""

# The pipelined float16 forwards' helpers: cp.async, Q pairs, the K/V tile loads.
_F16_PIPE = r"""
// cp.async of 16 bytes, global to shared; src_bytes 0 reads nothing and zero-fills the 16 bytes.
__device__ __forceinline__ void cp_async16(T* dst, const T* src, unsigned src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Wait until at most STAGES - 2 of this thread's groups are in flight (the tile about to be read has landed).
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2) : "memory"); }
// qpair's bits, one 32-bit load where HD is even (d is even: both halves in the row or neither; rows 4-byte aligned).
__device__ __forceinline__ unsigned qpair2(const T* __restrict__ q, long long base, long long row, long long Lq,
                                           unsigned d) {
    if (HD % 2 == 0) return (row < Lq && d < HD) ? *reinterpret_cast<const unsigned*>(q + (base + row) * HD + d) : 0u;
    return qpair(q, base, row, Lq, d);
}
// Rows [t0, t0 + BC) of K and V (half bits) into kdst/vdst[c * LDH + d], zero outside: cp.async (no wait) where HD
// is a multiple of 8 (every 16-byte chunk then lies wholly inside or outside a row), else plain loads and stores.
__device__ __forceinline__ void load_kv(T* kdst, T* vdst, const T* __restrict__ k, const T* __restrict__ v,
                                        long long base, long long t0, long long end) {
    if (HD % 8 == 0) {
        static_assert(BC * (HDP / 8) % NT == 0, "whole 16-byte chunks per thread");
        #pragma unroll
        for (unsigned r = 0; r < BC * (HDP / 8) / NT; ++r) {
            const unsigned e = r * NT + threadIdx.x;
            const unsigned c = e / (HDP / 8), d = e % (HDP / 8) * 8;
            const long long j = t0 + c;
            const bool in = j < end && d < HD;
            const long long off = in ? (base + j) * HD + d : 0;  // nothing is read where out: any valid address
            cp_async16(kdst + IX(c, LDH, d), k + off, in ? 16u : 0u);
            cp_async16(vdst + IX(c, LDH, d), v + off, in ? 16u : 0u);
        }
    } else {
        load_h(kdst, k, base, t0, end);
        load_h(vdst, v, base, t0, end);
    }
}
"""

_F16P = (
    r"""
// The float16 forward pipelined: the same arithmetic as attn_fwd16 (the same values, bit for bit), with K and V tiles
// in STAGES shared buffers filled by cp.async STAGES - 1 tiles ahead, so the loads of the next tiles overlap this
// tile's tensor-core work and one __syncthreads per tile suffices; K fragments by ldmatrix (x4: two k-steps); under
// causal the blocks with the most tiles run first (q_block), and a warp skips a tile that masks all its rows.
extern "C" __global__ void __launch_bounds__(NT, MINB) attn_fwd16p(
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
        float* __restrict__ lse, const long long* __restrict__ kv_len, long long Hq, long long Hkv,
        long long Lq, long long Lk, float scale, int causal) {
    extern __shared__ __align__(16) T smh[];  // [STAGES][K, V][BC][LDH]
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long long bh = blockIdx.y, b = bh / Hq, h = bh - b * Hq, hk = h / (Hq / Hkv);
    const long long bx = causal ? (long long)(gridDim.x - 1u - blockIdx.x) : (long long)blockIdx.x;
    const long long r0 = bx * BR;
    const long long row0 = r0 + warp * 16 + g, row1 = row0 + 8;
    const long long klen = kv_len[b];
    const long long kend = causal ? min(klen, r0 + BR) : klen;
    const long long kbase = (b * Hkv + hk) * Lk;
    const long long ntiles = (kend + BC - 1) / BC;
    #pragma unroll
    for (unsigned s = 0; s + 1 < STAGES; ++s) {  // the prologue: tiles 0 .. STAGES - 2, one group each
        if (s < ntiles)
            load_kv(smh + IX(2 * s, BC * LDH, 0), smh + IX(2 * s + 1, BC * LDH, 0), k, v, kbase, s * BC, kend);
        cp_async_commit();
    }
"""[1:]
    + _f16_query_fragments("qpair2")
    + "    const unsigned kfrag = IX(lane % 8, LDH, lane / 8 * 8);"
    + r"""  // ldmatrix rows: key lane % 8, features + lane / 8 * 8
    const unsigned vfrag = IX(lane % 8 + (lane / 8 & 1) * 8, LDH, (lane / 16) * 8);
    for (long long it = 0; it < ntiles; ++it) {
        const long long t0 = it * BC;
        const unsigned st = (unsigned)(it % STAGES);
        cp_async_wait();
        // Tile it is in every thread's view, and every warp is done with tile it - 1, whose stage is refilled now.
        __syncthreads();
        {
            const long long nx = it + STAGES - 1;
            const unsigned sn = (unsigned)(nx % STAGES);
            if (nx < ntiles) load_kv(smh + IX(2 * sn, BC * LDH, 0), smh + IX(2 * sn + 1, BC * LDH, 0), k, v, kbase,
                                     nx * BC, kend);
            cp_async_commit();  // an empty group past the last tile keeps the count the wait relies on
        }
        if (causal && t0 > r0 + warp * 16 + 15) continue;  // every key after every row of the warp: no change
        const T* ks = smh + IX(2 * st, BC * LDH, 0);
        const T* vs = smh + IX(2 * st + 1, BC * LDH, 0);
        const unsigned kaddr = smem_addr(ks + kfrag), vaddr = smem_addr(vs + vfrag);
        float sc[BC / 8][4];
        #pragma unroll
        for (unsigned n = 0; n < BC / 8; ++n) {
            sc[n][0] = 0.0f; sc[n][1] = 0.0f; sc[n][2] = 0.0f; sc[n][3] = 0.0f;
            #pragma unroll
            for (unsigned kk = 0; kk < HDP / 16; kk += 2) {
                // B fragments of k-steps kk and kk + 1: K[n*8 + g][kk*16 + 2t .. +1], +8, +16, +24
                unsigned b0, b1, b2, b3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(kaddr + 2 * (n * 8 * LDH + kk * 16)));
                mma16816(sc[n], qa[kk], b0, b1);
                mma16816(sc[n], qa[kk + 1], b2, b3);
            }
        }
        float tmax0 = -INFINITY, tmax1 = -INFINITY;
"""
    + _F16_SOFTMAX_STEP
    + r"""        #pragma unroll
        for (unsigned kk = 0; kk < BC / 16; ++kk) {
            unsigned pa[4];
            p_fragment(pa, sc, kk);
            #pragma unroll
            for (unsigned np = 0; np < HDP / 16; ++np) {
                unsigned b0, b1, b2, b3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(vaddr + 2 * (kk * 16 * LDH + np * 16)));
                mma16816(oacc[2 * np], pa, b0, b1);
                mma16816(oacc[2 * np + 1], pa, b2, b3);
            }
        }
    }
    cp_async_wait_all();  // no copy may land in shared memory after the block exits
"""
    + _F16_STORE
    + "}\n"
)

# The wide float16 forward: warps of 32 query rows, two m16 tiles a warp (FlashAttention-2's layout at head dim 128),
# so every K and V fragment read from shared memory feeds two mma's where the 16-row warps' fed one (the pipelined
# kernel's shared-memory pipe was its bound: Nsight Compute, H100, short-scoreboard stalls 0.92 an issue against
# flash's 0.32). Q is staged in shared memory (254 registers, no spills, at hd_pad 128: no room for it in registers).
# Every m-tile runs the pipelined kernel's text (softmax step and store, instantiated per m-tile by _m_tile) in
# the same order, so each output element sees the same operations as there: the same bits.
_F16W = (
    r"""
// Rows [r0, r0 + BR) of Q (half bits) into qs[r * LDH + d], zero outside: cp.async where HD % 8 == 0 (no commit:
// the copies join the caller's next group), else plain loads and stores.
__device__ __forceinline__ void load_q(T* qs, const T* __restrict__ q, long long base, long long r0, long long Lq) {
    if (HD % 8 == 0) {
        for (unsigned e = threadIdx.x; e < BR * (HDP / 8); e += NT) {
            const unsigned r = e / (HDP / 8), d = e % (HDP / 8) * 8;
            const bool in = r0 + r < Lq && d < HD;
            const long long off = in ? (base + r0 + r) * HD + d : 0;  // nothing is read where out: any valid address
            cp_async16(qs + IX(r, LDH, d), q + off, in ? 16u : 0u);
        }
    } else {
        for (unsigned e = threadIdx.x; e < BR * HDP; e += NT) {
            const unsigned r = e / HDP, d = e % HDP;
            qs[IX(r, LDH, d)] = (r0 + r < Lq && d < HD) ? q[(base + r0 + r) * HD + d] : (T)0;
        }
    }
}
// The float16 forward on warps of 32 rows: m-tile a (rows wr .. wr + 15) and b (wr + 16 .. wr + 31) of warp rows
// wr = r0 + 32 warp; each K fragment (ldmatrix x4: two key groups at one k-step) and V fragment serves both.
extern "C" __global__ void __launch_bounds__(NT, MINB) attn_fwd16w(
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
        float* __restrict__ lse, const long long* __restrict__ kv_len, long long Hq, long long Hkv,
        long long Lq, long long Lk, float scale, int causal) {
    extern __shared__ __align__(16) T smh[];  // [STAGES][K, V][BC][LDH], then Q [BR][LDH]
    T* qs = smh + IX(2 * STAGES, BC * LDH, 0);
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long long bh = blockIdx.y, b = bh / Hq, h = bh - b * Hq, hk = h / (Hq / Hkv);
    const long long bx = causal ? (long long)(gridDim.x - 1u - blockIdx.x) : (long long)blockIdx.x;
    const long long r0 = bx * BR;
    const long long wr = r0 + warp * 32;
    const long long row0 = wr + g, row1 = row0 + 8, row2 = row0 + 16, row3 = row0 + 24;
    const long long klen = kv_len[b];
    const long long kend = causal ? min(klen, r0 + BR) : klen;
    const long long kbase = (b * Hkv + hk) * Lk;
    const long long ntiles = (kend + BC - 1) / BC;
    load_q(qs, q, bh * Lq, r0, Lq);  // with the first K/V tile's group
    #pragma unroll
    for (unsigned s = 0; s + 1 < STAGES; ++s) {
        if (s < ntiles)
            load_kv(smh + IX(2 * s, BC * LDH, 0), smh + IX(2 * s + 1, BC * LDH, 0), k, v, kbase, s * BC, kend);
        cp_async_commit();
    }
    const float sl = scale * 1.44269504088896341f;
    float oa[HDP / 8][4], ob[HDP / 8][4];
    #pragma unroll
    for (unsigned n = 0; n < HDP / 8; ++n) {
        oa[n][0] = 0.0f; oa[n][1] = 0.0f; oa[n][2] = 0.0f; oa[n][3] = 0.0f;
        ob[n][0] = 0.0f; ob[n][1] = 0.0f; ob[n][2] = 0.0f; ob[n][3] = 0.0f;
    }
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float m2 = -INFINITY, m3 = -INFINITY, l2 = 0.0f, l3 = 0.0f;
    // ldmatrix rows: K x4 of two key groups at one k-step (key lane % 8 + (lane / 16) * 8, features
    // (lane / 8 & 1) * 8); V x4.trans as the pipelined kernel; Q x4 as an A operand (row lane % 8 + (lane / 8 & 1) * 8)
    const unsigned kfrag = IX(lane % 8 + (lane / 16) * 8, LDH, (lane / 8 & 1) * 8);
    const unsigned vfrag = IX(lane % 8 + (lane / 8 & 1) * 8, LDH, (lane / 16) * 8);
    const unsigned qaddr = smem_addr(qs + IX(warp * 32 + lane % 8 + (lane / 8 & 1) * 8, LDH, (lane / 16) * 8));
    for (long long it = 0; it < ntiles; ++it) {
        const long long t0 = it * BC;
        const unsigned st = (unsigned)(it % STAGES);
        cp_async_wait();
        __syncthreads();
        {
            const long long nx = it + STAGES - 1;
            const unsigned sn = (unsigned)(nx % STAGES);
            if (nx < ntiles) load_kv(smh + IX(2 * sn, BC * LDH, 0), smh + IX(2 * sn + 1, BC * LDH, 0), k, v, kbase,
                                     nx * BC, kend);
            cp_async_commit();
        }
        if (causal && t0 > wr + 31) continue;  // every key after every row of the warp: no change
        const bool live_a = !(causal && t0 > wr + 15);  // m-tile a skips the tile a 16-row warp of its rows skips
        const unsigned kaddr = smem_addr(smh + IX(2 * st, BC * LDH, 0) + kfrag);
        const unsigned vaddr = smem_addr(smh + IX(2 * st + 1, BC * LDH, 0) + vfrag);
        float sa[BC / 8][4], sb[BC / 8][4];
        #pragma unroll
        for (unsigned n = 0; n < BC / 8; ++n) {
            sa[n][0] = 0.0f; sa[n][1] = 0.0f; sa[n][2] = 0.0f; sa[n][3] = 0.0f;
            sb[n][0] = 0.0f; sb[n][1] = 0.0f; sb[n][2] = 0.0f; sb[n][3] = 0.0f;
        }
        #pragma unroll
        for (unsigned kk = 0; kk < HDP / 16; ++kk) {  // k-steps ascending into every score, as the 16-row kernels
            unsigned qa[4], qb[4];
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(qa[0]), "=r"(qa[1]), "=r"(qa[2]), "=r"(qa[3]) : "r"(qaddr + 2 * (kk * 16)));
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(qb[0]), "=r"(qb[1]), "=r"(qb[2]), "=r"(qb[3])
                         : "r"(qaddr + 2 * (16 * LDH + kk * 16)));
            #pragma unroll
            for (unsigned n = 0; n < BC / 8; n += 2) {
                unsigned b0, b1, b2, b3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(kaddr + 2 * (n * 8 * LDH + kk * 16)));
                mma16816(sa[n], qa, b0, b1);
                mma16816(sb[n], qb, b0, b1);
                mma16816(sa[n + 1], qa, b2, b3);
                mma16816(sb[n + 1], qb, b2, b3);
            }
        }
        if (live_a) {
            float tmax0 = -INFINITY, tmax1 = -INFINITY;
"""[1:]
    + "STEP_A"
    + r"""        }
        {
            float tmax0 = -INFINITY, tmax1 = -INFINITY;
"""
    + "STEP_B"
    + r"""        }
        #pragma unroll
        for (unsigned kk = 0; kk < BC / 16; ++kk) {
            unsigned pa[4], pb[4];
            p_fragment(pa, sa, kk);
            p_fragment(pb, sb, kk);
            #pragma unroll
            for (unsigned np = 0; np < HDP / 16; ++np) {
                unsigned b0, b1, b2, b3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(vaddr + 2 * (kk * 16 * LDH + np * 16)));
                if (live_a) {
                    mma16816(oa[2 * np], pa, b0, b1);
                    mma16816(oa[2 * np + 1], pa, b2, b3);
                }
                mma16816(ob[2 * np], pb, b0, b1);
                mma16816(ob[2 * np + 1], pb, b2, b3);
            }
        }
    }
    cp_async_wait_all();  // no copy may land in shared memory after the block exits
    {
"""
    + "STORE_A"
    + r"""    }
    {
"""
    + "STORE_B"
    + "    }\n}\n"
)


def _m_tile(text: str, tile: str) -> str:
    """A 16-row kernel's text for m-tile ``tile`` of a 32-row warp: 'a' (rows row0/row1, state m0/m1, l0/l1) or 'b'
    (rows row2/row3, m2/m3, l2/l3); scores sc -> sa/sb, accumulators oacc -> oa/ob, the warp's first row its own."""
    names = {"sc": "s" + tile, "oacc": "o" + tile}
    if tile == "b":
        names |= {"m0": "m2", "m1": "m3", "l0": "l2", "l1": "l3", "row0": "row2", "row1": "row3"}
    out = re.sub(r"\b(" + "|".join(names) + r")\b", lambda m: names[m.group(1)], text)
    return out.replace("r0 + warp * 16", "wr" + (" + 16" if tile == "b" else ""))


def _indent(text: str, spaces: int) -> str:
    return "".join(" " * spaces + line if line.strip() else line for line in text.splitlines(keepends=True))


_F16W = (
    _F16W.replace("STEP_A", _indent(_m_tile(_F16_SOFTMAX_STEP, "a"), 4))
    .replace("STEP_B", _indent(_m_tile(_F16_SOFTMAX_STEP, "b"), 4))
    .replace("STORE_A", _indent(_m_tile(_F16_STORE, "a"), 4))
    .replace("STORE_B", _indent(_m_tile(_F16_STORE, "b"), 4))
)

_DQ = r"""
// dQ of BR query rows (and Delta = rowsum(dO o O), d ascending): per key tile S = Q K^T, dP = dO V^T (d ascending),
// P = exp(S scale - lse), dS = P o (dP - Delta), dQ += dS K (keys ascending); dQ = scale dQ at the end.
extern "C" __global__ void __launch_bounds__(NT) attn_bwd_dq(
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ o,
        const T* __restrict__ dout, const float* __restrict__ lse, float* __restrict__ delta,
        T* __restrict__ dq, const long long* __restrict__ kv_len, long long Hq, long long Hkv,
        long long Lq, long long Lk, float scale, int causal) {
    extern __shared__ __align__(16) float sm[];
    float* qt = sm;                  // [HDP][LDR] Q^T
    float* dot = qt + HDP * LDR;     // [HDP][LDR] dO^T
    float* dst = dot + HDP * LDR;    // [BC][LDR] dS^T
    float* kt = dst + HDP * LDR;     // [HDP][LDC] K^T
    float* vt = kt + HDP * LDC;      // [HDP][LDC] V^T
    float* ks = vt + HDP * LDC;      // [BC][LDD] K
    float* ls = ks + HDP * LDC;      // [BR] lse
    float* dls = ls + BR;            // [BR] Delta
    const unsigned tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const long long bh = blockIdx.y, b = bh / Hq, h = bh - b * Hq, hk = h / (Hq / Hkv);
    const long long r0 = (long long)blockIdx.x * BR;
    const long long klen = kv_len[b];
    const long long kend = causal ? min(klen, r0 + BR) : klen;
    const long long kbase = (b * Hkv + hk) * Lk;
    load_t<BR>(qt, LDR, q, bh * Lq, r0, Lq);
    load_t<BR>(dot, LDR, dout, bh * Lq, r0, Lq);
    if (threadIdx.x < BR) {
        const long long row = r0 + threadIdx.x;
        float dl = 0.0f;
        if (row < Lq) {
            const long long rb = (bh * Lq + row) * HD;
            for (unsigned d = 0; d < HD; ++d) dl = fmaf(dout[rb + d], o[rb + d], dl);
            delta[bh * Lq + row] = dl;
        }
        ls[threadIdx.x] = row < Lq ? lse[bh * Lq + row] : INFINITY;
        dls[threadIdx.x] = dl;
    }
    float acc[8][DN];
    zero(acc);
    for (long long t0 = 0; t0 < kend; t0 += BC) {
        __syncthreads();
        load_t<BC>(kt, LDC, k, kbase, t0, kend);
        load_t<BC>(vt, LDC, v, kbase, t0, kend);
        load_r<BC>(ks, LDD, k, kbase, t0, kend);
        __syncthreads();
        float s[8][4], dp[8][4];
        zero(s);
        zero(dp);
        mm<HDP, 4>(s, qt + ty * 8, LDR, kt + tx * 4, LDC);
        mm<HDP, 4>(dp, dot + ty * 8, LDR, vt + tx * 4, LDC);
        #pragma unroll
        for (unsigned i = 0; i < 8; ++i) {
            const long long row = r0 + ty * 8 + i;
            const float L = ls[ty * 8 + i], D = dls[ty * 8 + i];
            #pragma unroll
            for (unsigned j = 0; j < 4; ++j) {
                const long long key = t0 + tx * 4 + j;
                const bool ok = key < kend && (!causal || key <= row);
                const float p = ok ? expf(s[i][j] * scale - L) : 0.0f;
                s[i][j] = p * (dp[i][j] - D);
            }
        }
        store_t(dst, s, tx, ty);
        __syncthreads();
        mm<BC, DN>(acc, dst + ty * 8, LDR, ks + tx * DN, LDD);
    }
    #pragma unroll
    for (unsigned i = 0; i < 8; ++i) {
        const long long row = r0 + ty * 8 + i;
        #pragma unroll
        for (unsigned c = 0; c < DN; ++c) {
            const unsigned d = tx * DN + c;
            if (row < Lq && d < HD) dq[(bh * Lq + row) * HD + d] = acc[i][c] * scale;
        }
    }
}
"""

# The dK/dV kernels' tile step (P, dS from the tile's scores; dV += P^T dO, dK += dS^T Q) and their store of dK and
# dV: one text, held byte for byte by attn_bwd_dkdv and attn_bwd_dkdvq (hence the same gradients, bitwise). A step
# computes on the query tile the last one staged and stages the next (head, tile) meanwhile: the tile loads do not
# stall the block (one block an SM: shared memory), and the values in shared memory are those the loads gave.
_DKDV_STEP = r"""            cp_async_wait_all();
            __syncthreads();  // this step's Q and dO have landed, and every thread is done with the last step
            float* qs = cur ? qbuf1 : qbuf0;   // Q row-major
            float* qt = cur ? qbuf0 : qbuf1;   // Q^T; once the scores are formed, the next step's Q lands here
            float* dos = cur ? dbuf1 : dbuf0;  // dO row-major
            float* dot = cur ? dbuf0 : dbuf1;  // dO^T; then the next step's dO
            transpose_q(qt, qs);
            transpose_q(dot, dos);
            // The next step's (head, query tile): its lse and Delta read now into registers (stored at the step's
            // end), its Q and dO staged by cp.async once the scores no longer read Q^T and dO^T.
            long long nh = hq, nt = t0 + BC;
            if (nt >= Lq) {
                nh = hq + 1;
                nt = qstart;
            }
            const long long nbase = (b * Hq + nh) * Lq;
            float nl = INFINITY, nd = 0.0f;
            if (nh < hend && threadIdx.x < BC && nt + threadIdx.x < Lq) {
                nl = lse[nbase + nt + threadIdx.x];
                nd = delta[nbase + nt + threadIdx.x];
            }
            __syncthreads();
            float s[8][4], dp[8][4];
            zero(s);
            zero(dp);
            mm<HDP, 4>(s, kt + ty * 8, LDR, qt + tx * 4, LDC);
            mm<HDP, 4>(dp, vt + ty * 8, LDR, dot + tx * 4, LDC);
            #pragma unroll
            for (unsigned i = 0; i < 8; ++i) {
                const long long key = r0 + ty * 8 + i;
                #pragma unroll
                for (unsigned j = 0; j < 4; ++j) {
                    const unsigned c = tx * 4 + j;
                    const long long qi = t0 + c;
                    const bool ok = key < klen && qi < Lq && (!causal || key <= qi);
                    const float p = ok ? expf(s[i][j] * scale - ls[c]) : 0.0f;
                    s[i][j] = p;
                    dp[i][j] = p * (dp[i][j] - dls[c]);
                }
            }
            store_t(pt, s, tx, ty);
            __syncthreads();
            if (nh < hend) stage_q(qt, dot, q, dout, nbase, nt, Lq);
            mm<BC, DN>(dva, pt + ty * 8, LDR, dos + tx * DN, LDD);
            __syncthreads();
            store_t(pt, dp, tx, ty);
            __syncthreads();
            mm<BC, DN>(dka, pt + ty * 8, LDR, qs + tx * DN, LDD);
            if (threadIdx.x < BC) {  // the next step's lse and Delta: every thread is past this step's reads
                ls[threadIdx.x] = nl;
                dls[threadIdx.x] = nd;
            }
            cur ^= 1u;
"""
# The dK/dV kernels' query-tile staging: Q and dO of a tile row-major in one of two buffers (cp.async where HD is a
# multiple of 4: every row starts 16-byte aligned; else plain loads), transposed into Q^T / dO^T in shared memory.
_DKDV_STAGING = r"""
// cp.async of 16 bytes, global to shared; src_bytes 0 reads nothing and zero-fills the 16 bytes.
__device__ __forceinline__ void cp_async16(float* dst, const float* src, unsigned src_bytes) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(a), "l"(src), "r"(src_bytes) : "memory");
}
// Every copy this thread issued has landed (wait_all commits the pending ones first).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Rows [t0, t0 + BC) of Q and dO (row base qbase) into qd / dd [r * LDD + d], zero outside (no wait).
__device__ __forceinline__ void stage_q(float* qd, float* dd, const T* __restrict__ q, const T* __restrict__ dout,
                                        long long qbase, long long t0, long long Lq) {
    if (HD % 4 == 0) {
        for (unsigned e = threadIdx.x; e < BC * (HDP / 4); e += NT) {
            const unsigned r = e / (HDP / 4), d = e % (HDP / 4) * 4;
            const long long j = t0 + r;
            const bool in = j < Lq && d < HD;
            const long long off = in ? (qbase + j) * HD + d : 0;  // nothing is read where out: any valid address
            cp_async16(qd + IX(r, LDD, d), q + off, in ? 16u : 0u);
            cp_async16(dd + IX(r, LDD, d), dout + off, in ? 16u : 0u);
        }
    } else {
        load_r<BC>(qd, LDD, q, qbase, t0, Lq);
        load_r<BC>(dd, LDD, dout, qbase, t0, Lq);
    }
}
// dst[d * LDC + r] = src[r * LDD + d]: a staged tile transposed (its zeros with it).
__device__ __forceinline__ void transpose_q(float* dst, const float* src) {
    for (unsigned e = threadIdx.x; e < BC * (HDP / 4); e += NT) {
        const unsigned r = e % BC, d = e / BC * 4;
        const float4 x = *reinterpret_cast<const float4*>(src + IX(r, LDD, d));
        float* p = dst + IX(d, LDC, r);
        p[0] = x.x; p[LDC] = x.y; p[2 * LDC] = x.z; p[3 * LDC] = x.w;
    }
}
"""
# The dK/dV kernels' start of their loops: the causal query start, the zeroed gradients, and the first step's tile
# staged (buffer 0).
_DKDV_PROLOGUE = r"""    const long long qstart = causal ? r0 / BC * BC : 0;
    const bool live = r0 < klen;
    float dka[8][DN], dva[8][DN];
    zero(dka);
    zero(dva);
    const long long hend = (hk + 1) * g;
    unsigned cur = 0u;
    if (live && qstart < Lq) {
        const long long fbase = (b * Hq + hk * g) * Lq;
        stage_q(qbuf0, dbuf0, q, dout, fbase, qstart, Lq);
        if (threadIdx.x < BC) {
            const long long i = qstart + threadIdx.x;
            ls[threadIdx.x] = i < Lq ? lse[fbase + i] : INFINITY;
            dls[threadIdx.x] = i < Lq ? delta[fbase + i] : 0.0f;
        }
    }
"""
_DKDV_STORE = r"""    cp_async_wait_all();  // no copy may land in shared memory after the block exits
    #pragma unroll
    for (unsigned i = 0; i < 8; ++i) {
        const long long key = r0 + ty * 8 + i;
        #pragma unroll
        for (unsigned c = 0; c < DN; ++c) {
            const unsigned d = tx * DN + c;
            if (key < Lk && d < HD) {
                dk[(kb + key) * HD + d] = dka[i][c] * scale;
                dv[(kb + key) * HD + d] = dva[i][c];
            }
        }
    }
}
"""

_DKDV = (
    r"""
// dK and dV of BR key rows over every query head of the group and every query tile from the causal start:
// S^T = K Q^T, dP^T = V dO^T (d ascending), P = exp(S scale - lse), dS = P o (dP - Delta); dV += P^T dO and
// dK += dS^T Q (queries ascending, heads ascending); dK = scale dK at the end.
extern "C" __global__ void __launch_bounds__(NT) attn_bwd_dkdv(
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
        const float* __restrict__ lse, const float* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv,
        const long long* __restrict__ kv_len, long long Hq, long long Hkv, long long Lq, long long Lk,
        float scale, int causal) {
    extern __shared__ __align__(16) float sm[];
    float* kt = sm;                  // [HDP][LDR] K^T of the block's keys
    float* vt = kt + HDP * LDR;      // [HDP][LDR] V^T
    float* pt = vt + HDP * LDR;      // [BC][LDR] P, then dS, query-major
    // The query tile's Q and dO, each in two buffers whose roles alternate by step: [BC][LDD] row-major (this
    // step's, staged by the last) and [HDP][LDC] transposed (then the next step's, row-major).
    float* qbuf0 = pt + HDP * LDR;
    float* qbuf1 = qbuf0 + HDP * LDC;
    float* dbuf0 = qbuf1 + HDP * LDC;
    float* dbuf1 = dbuf0 + HDP * LDC;
    float* ls = dbuf1 + HDP * LDC;   // [BC] lse
    float* dls = ls + BC;            // [BC] Delta
    const unsigned tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const long long bkv = blockIdx.y, b = bkv / Hkv, hk = bkv - b * Hkv, g = Hq / Hkv;
    const long long r0 = (long long)blockIdx.x * BR;
    const long long klen = kv_len[b];
    const long long kb = bkv * Lk;
    load_t<BR>(kt, LDR, k, kb, r0, klen);
    load_t<BR>(vt, LDR, v, kb, r0, klen);
"""
    + _DKDV_PROLOGUE
    + r"""    for (long long hq = hk * g; hq < hend && live; ++hq) {
        for (long long t0 = qstart; t0 < Lq; t0 += BC) {
"""
    + _DKDV_STEP
    + r"""        }
    }
"""
    + _DKDV_STORE
)

_DELTA = r"""
// Delta = rowsum(dO o O) of each query row (d ascending, as the dQ kernel forms it): one thread a row.
extern "C" __global__ void __launch_bounds__(NT) attn_bwd_delta(
        const T* __restrict__ o, const T* __restrict__ dout, float* __restrict__ delta, long long rows) {
    const long long r = (long long)blockIdx.x * NT + threadIdx.x;
    if (r >= rows) return;
    float dl = 0.0f;
    for (unsigned d = 0; d < HD; ++d) dl = fmaf(dout[r * HD + d], o[r * HD + d], dl);
    delta[r] = dl;
}
"""

_DKDVQ = (
    r"""
// attn_bwd_dkdv's dK and dV (the same arithmetic, bitwise), and the block's share of dQ: per query tile, dQ_L = dS K
// over the block's BR keys, written to layer L = blockIdx.x of the partials (attn_bwd_dqsum adds the layers). The
// keys split in two halves of BR / 2, each an 8 x 4 micro-tile chain (keys ascending, fmaf from 0); the halves meet
// in the step's row-major Q buffer (read by then), lo + hi. Five products per (query, key) pair instead of the two
// kernels' seven.
extern "C" __global__ void __launch_bounds__(NT) attn_bwd_dkdvq(
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
        const float* __restrict__ lse, const float* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv,
        float* __restrict__ dqp, const long long* __restrict__ kv_len, long long Hq, long long Hkv, long long Lq,
        long long Lk, float scale, int causal) {
    extern __shared__ __align__(16) float sm[];
    float* kt = sm;                  // [HDP][LDR] K^T of the block's keys
    float* vt = kt + HDP * LDR;      // [HDP][LDR] V^T
    float* pt = vt + HDP * LDR;      // [BC][LDR] P, then dS, query-major; then dS key-major [BR][LDC]
    // Q and dO as in attn_bwd_dkdv; the step's row-major Q, once read, is where the key halves meet.
    float* qbuf0 = pt + BR * LDC;
    float* qbuf1 = qbuf0 + HDP * LDC;
    float* dbuf0 = qbuf1 + HDP * LDC;
    float* dbuf1 = dbuf0 + HDP * LDC;
    float* kr = dbuf1 + HDP * LDC;   // [BR][LDD] K
    float* ls = kr + BR * LDD;       // [BC] lse
    float* dls = ls + BC;            // [BC] Delta
    const unsigned tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const unsigned half = threadIdx.x / (NT / 2), qy = threadIdx.x % (NT / 2) / 16;
    const long long bkv = blockIdx.y, b = bkv / Hkv, hk = bkv - b * Hkv, g = Hq / Hkv;
    const long long r0 = (long long)blockIdx.x * BR;
    const long long klen = kv_len[b];
    const long long kb = bkv * Lk;
    const long long layer = (long long)blockIdx.x * gridDim.y * g;  // layer x (batch x heads_q) rows of heads
    load_t<BR>(kt, LDR, k, kb, r0, klen);
    load_t<BR>(vt, LDR, v, kb, r0, klen);
    load_r<BR>(kr, LDD, k, kb, r0, klen);
"""
    + _DKDV_PROLOGUE
    + r"""    for (long long hq = hk * g; hq < hend && live; ++hq) {
        const long long pbase = (layer + b * Hq + hq) * Lq;
        for (long long t0 = qstart; t0 < Lq; t0 += BC) {
"""
    + _DKDV_STEP
    + r"""            __syncthreads();
            #pragma unroll
            for (unsigned i = 0; i < 8; ++i)
                *reinterpret_cast<float4*>(pt + IX(ty * 8 + i, LDC, tx * 4)) =
                    make_float4(dp[i][0], dp[i][1], dp[i][2], dp[i][3]);
            __syncthreads();
            float qa[8][4];
            zero(qa);
            mm<BR / 2, 4>(qa, pt + IX(half * (BR / 2), LDC, qy * 8), LDC, kr + IX(half * (BR / 2), LDD, tx * 4), LDD);
            #pragma unroll
            for (unsigned i = 0; i < 4; ++i) {  // the lower half hands over its rows 4..7, the upper its rows 0..3
                const unsigned r = half ? i : 4 + i;
                *reinterpret_cast<float4*>(qs + IX(IX(half, BC / 2, qy * 4 + i), HDP, tx * 4)) =
                    make_float4(qa[r][0], qa[r][1], qa[r][2], qa[r][3]);
            }
            __syncthreads();
            #pragma unroll
            for (unsigned i = 0; i < 4; ++i) {  // and each finishes the other four: lo + hi
                const unsigned r = half ? 4 + i : i;
                const float* o = qs + IX(IX(1 - half, BC / 2, qy * 4 + i), HDP, tx * 4);
                const long long qi = t0 + qy * 8 + r;
                float x[4];
                #pragma unroll
                for (unsigned c = 0; c < 4; ++c) x[c] = half ? o[c] + qa[r][c] : qa[r][c] + o[c];
                float* dst = dqp + (pbase + qi) * HD + tx * 4;
                if (qi < Lq && HD % 4 == 0 && tx * 4 < HD) {
                    *reinterpret_cast<float4*>(dst) = make_float4(x[0], x[1], x[2], x[3]);
                } else if (qi < Lq) {
                    #pragma unroll
                    for (unsigned c = 0; c < 4; ++c) {
                        if (tx * 4 + c < HD) dst[c] = x[c];
                    }
                }
            }
        }
    }
"""
    + _DKDV_STORE
)

_DQSUM = r"""
// dQ = scale * (layer 0 + layer 1 + ...) of the partials, layers ascending: those of the key blocks below kv_len,
// under causal only up to the row's own (no other block wrote the row). VEC elements a thread (the plan's dq_vec: 4
// where HD allows).
extern "C" __global__ void __launch_bounds__(NT) attn_bwd_dqsum(
        const float* __restrict__ dqp, T* __restrict__ dq, const long long* __restrict__ kv_len, long long Hq,
        long long Lq, long long BHq, float scale, int causal) {
    const long long e = ((long long)blockIdx.x * NT + threadIdx.x) * VEC;
    const long long n = BHq * Lq * HD;
    if (e >= n) return;
    const long long row = e / HD, bh = row / Lq, qi = row - bh * Lq;
    const long long live = (kv_len[bh / Hq] + BR - 1) / BR;
    const long long layers = causal && qi / BR + 1 < live ? qi / BR + 1 : live;
    float acc[VEC];
    #pragma unroll
    for (unsigned c = 0; c < VEC; ++c) acc[c] = 0.0f;
    for (long long L = 0; L < layers; ++L) {
        const float* src = dqp + L * n + e;
        if (VEC == 4) {
            const float4 x = *reinterpret_cast<const float4*>(src);
            acc[0] += x.x; acc[1 % VEC] += x.y; acc[2 % VEC] += x.z; acc[3 % VEC] += x.w;  // VEC 4 here
        } else {
            acc[0] += src[0];
        }
    }
    #pragma unroll
    for (unsigned c = 0; c < VEC; ++c) dq[e + c] = acc[c] * scale;
}
"""

_ROW_HEADER = r"""
typedef float T;
__device__ __forceinline__ float ld(const T* p, long long i) { return p[i]; }
__device__ __forceinline__ void st(T* p, long long i, float x) { p[i] = x; }
// Dot of a register row with a shared row, d ascending (fmaf: one rounding per step).
__device__ __forceinline__ float dotrow(const float* r, const float* s) {
    const float4* s4 = reinterpret_cast<const float4*>(s);
    float acc = 0.0f;
    #pragma unroll
    for (int d4 = 0; d4 < HDP / 4; ++d4) {
        const float4 x = s4[d4];
        acc = fmaf(r[4 * d4], x.x, acc); acc = fmaf(r[4 * d4 + 1], x.y, acc);
        acc = fmaf(r[4 * d4 + 2], x.z, acc); acc = fmaf(r[4 * d4 + 3], x.w, acc);
    }
    return acc;
}
// acc += p * shared row.
__device__ __forceinline__ void axpyrow(float* acc, float p, const float* s) {
    const float4* s4 = reinterpret_cast<const float4*>(s);
    #pragma unroll
    for (int d4 = 0; d4 < HDP / 4; ++d4) {
        const float4 x = s4[d4];
        acc[4 * d4] = fmaf(p, x.x, acc[4 * d4]); acc[4 * d4 + 1] = fmaf(p, x.y, acc[4 * d4 + 1]);
        acc[4 * d4 + 2] = fmaf(p, x.z, acc[4 * d4 + 2]); acc[4 * d4 + 3] = fmaf(p, x.w, acc[4 * d4 + 3]);
    }
}
// Two BC x HDP tiles of rows [t0, t0 + BC) (rows >= end and features >= HD are zero).
__device__ __forceinline__ void load_tiles(float* a, float* b, const T* ga, const T* gb, long long base,
                                           long long t0, long long end) {
    for (unsigned e = threadIdx.x; e < BC * HDP; e += BR) {
        const unsigned c = e / HDP, d = e % HDP;
        const long long j = t0 + c;
        const bool in = j < end && d < HD;
        a[e] = in ? ld(ga, (base + j) * HD + d) : 0.0f;
        b[e] = in ? ld(gb, (base + j) * HD + d) : 0.0f;
    }
}
"""

_ROW_DQ = r"""
// Head dims above 64 (hd_pad 128): one query row per thread, BR threads.
extern "C" __global__ void __launch_bounds__(BR) attn_row_dq(
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ o,
        const T* __restrict__ dout, const float* __restrict__ lse, float* __restrict__ delta,
        T* __restrict__ dq, const long long* __restrict__ kv_len, long long Hq, long long Hkv,
        long long Lq, long long Lk, float scale, int causal) {
    extern __shared__ __align__(16) float sm[];
    float* ks = sm;
    float* vs = sm + BC * HDP;
    const long long bh = blockIdx.y, b = bh / Hq, h = bh - b * Hq, hk = h / (Hq / Hkv);
    const long long row = (long long)blockIdx.x * BR + threadIdx.x;
    const bool active = row < Lq;
    const long long klen = kv_len[b];
    const long long kend = causal ? min(klen, ((long long)blockIdx.x + 1) * BR) : klen;
    const long long kbase = (b * Hkv + hk) * Lk;
    const long long qb = (bh * Lq + row) * HD;
    float qr[HDP], dor[HDP], acc[HDP];
    float dl = 0.0f;
    #pragma unroll
    for (int d = 0; d < HDP; ++d) {
        const bool in = active && d < HD;
        qr[d] = in ? ld(q, qb + d) : 0.0f;
        dor[d] = in ? ld(dout, qb + d) : 0.0f;
        dl = fmaf(dor[d], in ? ld(o, qb + d) : 0.0f, dl);
        acc[d] = 0.0f;
    }
    const float L = active ? lse[bh * Lq + row] : INFINITY;
    for (long long t0 = 0; t0 < kend; t0 += BC) {
        __syncthreads();
        load_tiles(ks, vs, k, v, kbase, t0, kend);
        __syncthreads();
        if (!active) continue;
        #pragma unroll 4
        for (int c = 0; c < BC; ++c) {
            const long long j = t0 + c;
            const bool ok = j < kend && (!causal || j <= row);
            const float p = ok ? expf(dotrow(qr, ks + c * HDP) * scale - L) : 0.0f;
            const float ds = p * (dotrow(dor, vs + c * HDP) - dl);
            axpyrow(acc, ds, ks + c * HDP);
        }
    }
    if (active) {
        #pragma unroll
        for (int d = 0; d < HD; ++d) st(dq, qb + d, acc[d] * scale);
        delta[bh * Lq + row] = dl;
    }
}
"""

_ROW_DKV = r"""
// WHICH 0: dV = sum_i p_ij dO_i; WHICH 1: dK = scale sum_i p_ij (dP_ij - Delta_i) q_i; over every query head
// of the group and every query row i allowed to see key j.
extern "C" __global__ void __launch_bounds__(BR) attn_row_{name}(
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
        const float* __restrict__ lse, const float* __restrict__ delta, T* __restrict__ grad,
        const long long* __restrict__ kv_len, long long Hq, long long Hkv, long long Lq, long long Lk,
        float scale, int causal) {{
    extern __shared__ __align__(16) float sm[];
    float* qs = sm;
    float* ds_ = sm + BC * HDP;
    __shared__ float ls[BC], dls[BC];
    const long long bkv = blockIdx.y, b = bkv / Hkv, hk = bkv - b * Hkv, g = Hq / Hkv;
    const long long key = (long long)blockIdx.x * BR + threadIdx.x;
    const long long klen = kv_len[b];
    const bool active = key < klen;
    const long long kb = (bkv * Lk + key) * HD;
    const long long qstart = causal ? ((long long)blockIdx.x * BR) / BC * BC : 0;
    float kr[HDP], vr[HDP], acc[HDP];
    #pragma unroll
    for (int d = 0; d < HDP; ++d) {{
        const bool in = active && d < HD;
        kr[d] = in ? ld(k, kb + d) : 0.0f;
        vr[d] = ({which} == 1 && in) ? ld(v, kb + d) : 0.0f;
        acc[d] = 0.0f;
    }}
    const bool live = (long long)blockIdx.x * BR < klen;
    for (long long hq = hk * g; hq < (hk + 1) * g && live; ++hq) {{
        const long long qbase = (b * Hq + hq) * Lq;
        for (long long t0 = qstart; t0 < Lq; t0 += BC) {{
            __syncthreads();
            load_tiles(qs, ds_, q, dout, qbase, t0, Lq);
            if (threadIdx.x < BC) {{
                const long long i = t0 + threadIdx.x;
                ls[threadIdx.x] = i < Lq ? lse[qbase + i] : INFINITY;
                dls[threadIdx.x] = i < Lq ? delta[qbase + i] : 0.0f;
            }}
            __syncthreads();
            if (!active) continue;
            #pragma unroll 4
            for (int c = 0; c < BC; ++c) {{
                const long long i = t0 + c;
                const bool ok = i < Lq && (!causal || key <= i);
                const float p = ok ? expf(dotrow(kr, qs + c * HDP) * scale - ls[c]) : 0.0f;
                if ({which} == 0) {{
                    axpyrow(acc, p, ds_ + c * HDP);
                }} else {{
                    const float dsv = p * (dotrow(vr, ds_ + c * HDP) - dls[c]);
                    axpyrow(acc, dsv, qs + c * HDP);
                }}
            }}
        }}
    }}
    if (key < Lk) {{
        #pragma unroll
        for (int d = 0; d < HD; ++d) st(grad, kb + d, {which} == 1 ? acc[d] * scale : acc[d]);
    }}
}}
"""


# kind -> (source parts, function, storage)
KERNELS: dict[str, tuple[tuple[str, ...], str]] = {
    "fwd": ((_SIMT, _FORWARD), "attn_fwd"),
    "fwd16": ((_F16_HEAD, _F16_KERNEL), "attn_fwd16"),
    "fwd16p": ((_F16_HEAD, _F16_PIPE, _F16P), "attn_fwd16p"),
    "fwd16w": ((_F16_HEAD, _F16_PIPE, _F16W), "attn_fwd16w"),
    "dq": ((_SIMT, _DQ), "attn_bwd_dq"),
    "dkdv": ((_SIMT, _DKDV_STAGING, _DKDV), "attn_bwd_dkdv"),
    "delta": ((_SIMT, _DELTA), "attn_bwd_delta"),
    "dkdvq": ((_SIMT, _DKDV_STAGING, _DKDVQ), "attn_bwd_dkdvq"),
    "dqsum": ((_SIMT, _DQSUM), "attn_bwd_dqsum"),
    "row_dq": ((_ROW_HEADER, _ROW_DQ), "attn_row_dq"),
    "row_dv": ((_ROW_HEADER, _ROW_DKV.format(name="dv", which=0)), "attn_row_dv"),
    "row_dk": ((_ROW_HEADER, _ROW_DKV.format(name="dk", which=1)), "attn_row_dk"),
}
TENSOR_CORE_KERNELS = frozenset({"fwd16", "fwd16p", "fwd16w"})


def _block(plan: AttentionPlan, kind: str) -> tuple[Any, Any]:
    """(rows, threads) of one block of kernel ``kind``."""
    if kind == "fwd16w":
        return plan.f16w_rows, plan.f16w_threads
    if kind in TENSOR_CORE_KERNELS:
        return plan.f16_rows, plan.f16_threads
    return plan.block_rows, plan.threads


def kernel_source(kind: str, head_dim: int, v_load: str | None = None) -> tuple[str, str]:
    """(CUDA source, function name) of kernel ``kind`` for a compile-time head dim; constants from the plan."""
    parts, fn = KERNELS[kind]
    p = attention_plan(1, 1, 1, 1, 1, head_dim)
    # the float16 forwards' own blocks (f16_rows in warps of 16 rows; the wide one's f16w_rows in warps of 32)
    rows, threads = _block(p, kind)
    macros = _MACROS.format(
        hd=head_dim,
        hdp=p.hd_pad,
        br=rows,
        bc=p.block_cols,
        nt=threads,
        ldr=p.ld_rows,
        ldc=p.ld_cols,
        ldd=p.ld_dim,
        ldh=p.ld_half,
    )
    if kind == "fwd16":
        macros += f"#define V_LDMATRIX {int((v_load or V_LOAD) == 'ldmatrix')}\n"
    if kind in ("fwd16p", "fwd16w"):  # two blocks an SM
        macros += f"#define STAGES {p.stages}\n#define MINB 2\n"
    if kind == "dqsum":  # the elements a thread adds, as the plan's grid_dqsum counts them
        macros += f"#define VEC {p.dq_vec}\n"
    return macros + "".join(parts), fn


@register_builds("attention")
def _builds() -> Iterator[Build]:
    """The audited builds: every kernel at head dim 64, and the kernels head dims above 64 run, at 128.

    Other head dims are the same templates with other ``HD``/``HDP`` constants; compiling each to PTX costs about
    a second on a CPU, so the audit keeps to the dims of the two paddings (64 and 128).
    """
    bits = attention_plan(1, 1, 1, 1, 1, 64).index_bits
    for hd, kinds in (
        (64, ("fwd", "fwd16", "fwd16p", "fwd16w", "dq", "dkdv", "delta", "dkdvq", "dqsum")),
        (128, ("fwd", "fwd16", "fwd16p", "fwd16w", "row_dq", "row_dv", "row_dk")),
    ):
        for kind in kinds:
            src, fn = kernel_source(kind, hd)
            yield Build(
                "attention",
                f"{kind}-hd{hd}",
                src,
                fn,
                ROUTE,
                approximate=True,
                fused=True,
                index_bits=bits,
                tensor_cores=kind in TENSOR_CORE_KERNELS,
            )


# -- entry points ----------------------------------------------------------------------------------------


def _checked_plan(q: Any, k: Any, v: Any, kv_lens: Any) -> AttentionPlan:
    """The checked plan of a call on arrays ``q``, ``k``, ``v`` (AttentionShapeError where it refuses them)."""
    plan = _shape_plan(
        tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype.itemsize, k.dtype.itemsize, v.dtype.itemsize
    )
    if kv_lens is not None:
        _lens(kv_lens, int(plan.batch), int(plan.seq_k))
    return plan


@functools.lru_cache(maxsize=512)
def _shape_plan(
    qs: tuple[int, ...], ks: tuple[int, ...], vs: tuple[int, ...], q_item: int, k_item: int, v_item: int
) -> AttentionPlan:
    """The checked plan of one call's shapes and element sizes, computed once per distinct call: a pure function of
    them, and the plan's arithmetic (written to run on Z3 terms too) cost ~40 us of host time per call on an H100's
    host, as much as a short kernel."""
    if len(qs) != 4 or len(ks) != 4 or vs != ks or qs[0] != ks[0] or qs[3] != ks[3]:
        raise AttentionShapeError(f"q {qs}, k {ks}, v {vs}: need (B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)")
    b, hq, lq, d = (int(x) for x in qs)
    hkv, lk = int(ks[1]), int(ks[2])
    if hkv < 1:  # the plan divides by Hkv (its own guard says Hkv >= 1): refuse before it runs on ints
        raise AttentionShapeError(f"attention plan rejects B={b} Hq={hq} Hkv={hkv} Lq={lq} Lk={lk} D={d}: Hkv < 1")
    plan = attention_plan(b, hq, hkv, lq, lk, d, elem_size=q_item)
    nb = [math.prod(shape) * item for shape, item in ((qs, q_item), (ks, k_item), (vs, v_item), (qs, q_item))]
    if not plan.accepts(*nb):
        raise AttentionShapeError(f"attention plan rejects B={b} Hq={hq} Hkv={hkv} Lq={lq} Lk={lk} D={d}")
    return plan


@functools.cache
def _full_lens(batch: int, seq_k: int, device: int) -> Any:
    """A device array of ``batch`` lengths ``seq_k`` (no mask), made once: no host copy, no sync, per call."""
    import cupy

    return cupy.full(batch, seq_k, dtype=cupy.int64)


def _contiguous(a: Any, dtype: Any) -> Any:
    """``a`` itself where it is a C-contiguous device array of ``dtype`` (no copy call on the hot path), else a
    contiguous device copy."""
    import cupy

    if isinstance(a, cupy.ndarray) and a.dtype == dtype and a.flags.c_contiguous:
        return a
    return cupy.ascontiguousarray(a, dtype=dtype)


def _launch_args(plan: AttentionPlan, kv_lens: Any, scale: float | None, causal: bool) -> tuple:
    import cupy

    if kv_lens is None:
        lens = _full_lens(int(plan.batch), int(plan.seq_k), cupy.cuda.runtime.getDevice())
    else:
        lens = cupy.asarray(_lens(np.asarray(kv_lens), plan.batch, plan.seq_k))
    return lens, _launch_tail(plan, None if scale is None else float(scale), bool(causal))


@functools.lru_cache(maxsize=512)
def _launch_tail(plan: AttentionPlan, scale: float | None, causal: bool) -> tuple:
    """The kernels' scalar arguments after the lengths (made once per plan, scale and mask)."""
    return (
        np.int64(plan.heads_q),
        np.int64(plan.heads_kv),
        np.int64(plan.seq_q),
        np.int64(plan.seq_k),
        _scale(plan.head_dim, scale),
        np.int32(causal),
    )


@functools.cache
def _kernel(kind: str, head_dim: int, v_load: str, smem: int, device: int) -> Any:
    """The compiled kernel, its dynamic shared-memory limit raised to ``smem`` where above the 48 KiB default."""
    from cupy.cuda import driver

    from native.nvrtc import compile_function

    fn = compile_function(*kernel_source(kind, head_dim, v_load), ROUTE)
    if smem > 48 * 1024:
        attr = getattr(driver, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)  # CUfunction_attribute 8
        driver.funcSetAttribute(fn.ptr, attr, smem)
    return fn


def _launch(kind: str, plan: AttentionPlan, grid: tuple[int, int], smem: int, args: tuple) -> None:
    import cupy

    fn = _kernel(kind, int(plan.head_dim), V_LOAD, int(smem), cupy.cuda.runtime.getDevice())
    threads = BR if kind.startswith("row_") else int(_block(plan, kind)[1])
    fn((int(grid[0]), int(grid[1])), (threads,), args, shared_mem=int(smem))


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    kv_lens: Any = None,
    scale: float | None = None,
    device: str = "host",
    tile: int = BC,
    fwd16: str | None = None,
) -> tuple[Any, Any]:
    """(out, lse) of fused attention on the host (NumPy) or the GPU (float32 SIMT, or float16 on tensor cores).

    ``fwd16`` names the float16 kernel (FWD16_VARIANTS; None: :func:`default_fwd16`'s); the host path has one
    meaning for all."""
    _check_variant(fwd16)
    if device == "host":
        _checked_plan(np.asarray(q, np.float32), np.asarray(k, np.float32), np.asarray(v, np.float32), kv_lens)
        out, lse = host_forward(q, k, v, causal=causal, kv_lens=kv_lens, scale=scale, tile=tile)
        return out.astype(np.asarray(q).dtype), lse  # float16 storage: the float32 result rounded once
    run, out, lse = _forward_launch(q, k, v, causal, kv_lens, scale, fwd16)
    run()
    return out, lse


def default_fwd16(hd_pad: int, causal: bool) -> str:
    """The float16 forward a call runs where it names none: "wide" at hd_pad 128 without a causal mask, else
    "pipelined".

    Kernel alone, flash/ours on an H100 (2026-11-28, the same bits): at head dim 128 wide 0.80 against pipelined 0.74,
    causal 0.79 against 0.89 (its 128-row blocks leave more of a diagonal block's warps waiting); at 64 0.71 against
    0.78, causal 0.66 against 0.77."""
    return "wide" if hd_pad > 64 and not causal else "pipelined"


def _check_variant(fwd16: str | None) -> None:
    if fwd16 is not None and fwd16 not in FWD16_VARIANTS:
        raise AttentionShapeError(f"fwd16 variant {fwd16!r} is not one of {sorted(FWD16_VARIANTS)} (or None)")


def _forward_launch(
    q: Any, k: Any, v: Any, causal: bool, kv_lens: Any, scale: float | None, variant: str | None
) -> tuple[Callable[[], None], Any, Any]:
    """(launch, out, lse): the checked plan, buffers and arguments of one device forward, launched by ``launch``."""
    import cupy

    q = _contiguous(q, q.dtype)
    k, v = _contiguous(k, q.dtype), _contiguous(v, q.dtype)
    plan = _checked_plan(q, k, v, kv_lens)
    half = np.dtype(q.dtype) == np.dtype(np.float16)
    if not half and np.dtype(q.dtype) != np.dtype(np.float32):
        raise AttentionShapeError(f"storage {q.dtype} is not float32 or float16")
    out = cupy.empty(q.shape, dtype=q.dtype)  # every row < seq_q is written by the kernel
    lse = cupy.empty(q.shape[:3], dtype=cupy.float32)
    if plan.grid_q == 0:
        return (lambda: None), out, lse
    lens, tail = _launch_args(plan, kv_lens, scale, causal)
    if half:
        kind = FWD16_VARIANTS[variant or default_fwd16(int(plan.hd_pad), bool(causal))]
    else:
        kind = "fwd"
    smem = {"fwd": plan.smem_fwd32, "fwd16": 0, "fwd16p": plan.smem_fwd16p, "fwd16w": plan.smem_fwd16w}[kind]
    if kind in ("fwd16p", "fwd16w") and any(int(a.data.ptr) % 16 for a in (q, k, v)):
        q, k, v = (cupy.array(a, copy=True) for a in (q, k, v))  # cp.async moves 16-byte chunks: aligned rows
    args = (q, k, v, out, lse, lens, *tail)
    grid_x = {"fwd": plan.grid_q, "fwd16": plan.grid_f16, "fwd16p": plan.grid_f16, "fwd16w": plan.grid_f16w}[kind]
    grid = (grid_x, plan.grid_y_q)
    return (lambda: _launch(kind, plan, grid, smem, args)), out, lse


def prepare_forward(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    kv_lens: Any = None,
    scale: float | None = None,
    fwd16: str | None = None,
) -> Callable[[], tuple[Any, Any]]:
    """A device forward checked, compiled and bound once: each call launches the kernel alone into the same (out,
    lse) and returns them (benchmarks time the kernel without the entry point's per-call host work)."""
    _check_variant(fwd16)
    run, out, lse = _forward_launch(q, k, v, causal, kv_lens, scale, fwd16)
    run()  # compiles (or loads) the kernel now, not in the first timed call

    def launch() -> tuple[Any, Any]:
        run()
        return out, lse

    return launch


def vjp_path(plan: AttentionPlan, dq_path: str | None = None) -> str:
    """Which kernels the VJP of ``plan`` runs: "partials" or "kernel" (the tiled VJP's dQ, see DQ_PATHS; ``dq_path``
    chooses, None: partials where the plan allows them), or "rowwise" (head dims above 64)."""
    if dq_path is not None and dq_path not in DQ_PATHS:
        raise ValueError(f"dq_path must be one of {DQ_PATHS} or None, not {dq_path!r}")
    if not plan.tiled_vjp:
        return "rowwise"
    if dq_path == "partials" and not plan.partial_dq:  # every launch of the partials is one the proofs cover
        raise AttentionShapeError(f"the dQ partials of this call exceed DQ_PARTIALS_MAX ({DQ_PARTIALS_MAX} bytes)")
    return dq_path or ("partials" if plan.partial_dq else "kernel")


def attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    dout: Any,
    *,
    causal: bool = False,
    kv_lens: Any = None,
    scale: float | None = None,
    device: str = "host",
    tile: int = BC,
    dq_path: str | None = None,
) -> tuple[Any, Any, Any]:
    """(dQ, dK, dV) from the forward's saved out and lse, float32: Delta, dK/dV with dQ's partials, their sum (or a
    dQ kernel with Delta, then dK and dV: ``dq_path``, :func:`vjp_path`)."""
    if device == "host":
        plan = _checked_plan(np.asarray(q, np.float32), np.asarray(k, np.float32), np.asarray(v, np.float32), kv_lens)
        vjp_path(plan, dq_path)  # a bad name is refused on every device
        return host_vjp(q, k, v, out, lse, dout, causal=causal, kv_lens=kv_lens, scale=scale, tile=tile)
    import cupy

    q, k, v, out, dout = (cupy.ascontiguousarray(a, dtype=cupy.float32) for a in (q, k, v, out, dout))
    lse = cupy.ascontiguousarray(lse, dtype=cupy.float32)
    plan = _checked_plan(q, k, v, kv_lens)
    path = vjp_path(plan, dq_path)
    dq, dk, dv = cupy.empty_like(q), cupy.empty_like(k), cupy.empty_like(v)  # the kernels write every element
    delta = cupy.empty(q.shape[:3], dtype=cupy.float32)
    lens, tail = _launch_args(plan, kv_lens, scale, causal)
    gq, gk = (plan.grid_q, plan.grid_y_q), (plan.grid_k, plan.grid_y_kv)
    if path == "partials":
        rows = int(plan.lse_elems)
        parts = cupy.empty(int(plan.dq_partial_elems), dtype=cupy.float32)
        if rows:
            _launch("delta", plan, (int(plan.grid_delta), 1), 0, (out, dout, delta, np.int64(rows)))
        if plan.grid_k:
            args = (q, k, v, dout, lse, delta, dk, dv, parts, lens, *tail)
            _launch("dkdvq", plan, gk, plan.smem_dkdvq, args)
        if rows:
            grid = (int(plan.grid_dqsum), 1)
            _launch("dqsum", plan, grid, 0, (parts, dq, lens, tail[0], tail[2], np.int64(plan.grid_y_q), *tail[4:]))
        return dq, dk, dv
    if path == "kernel":
        if plan.grid_q:
            _launch("dq", plan, gq, plan.smem_dq, (q, k, v, out, dout, lse, delta, dq, lens, *tail))
        if plan.grid_k:
            _launch("dkdv", plan, gk, plan.smem_dkdv, (q, k, v, dout, lse, delta, dk, dv, lens, *tail))
        return dq, dk, dv
    if plan.grid_q:
        _launch("row_dq", plan, gq, plan.smem_rowwise, (q, k, v, out, dout, lse, delta, dq, lens, *tail))
    if plan.grid_k:
        for kind, grad in (("row_dv", dv), ("row_dk", dk)):
            _launch(kind, plan, gk, plan.smem_rowwise, (q, k, v, dout, lse, delta, grad, lens, *tail))
    return dq, dk, dv
