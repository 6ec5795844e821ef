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

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from native.builds import Build, register_builds
from obligations.core.symbolic import all_of, as_type, cdiv, select, smin

__all__ = [
    "BR",
    "BC",
    "HEAD_DIM_MAX",
    "ROUTE",
    "AttentionPlan",
    "attention_plan",
    "Ops",
    "NUMPY_OPS",
    "online_update",
    "finalize",
    "allowed_mask",
    "attention",
    "attention_vjp",
    "host_forward",
    "host_vjp",
    "kernel_source",
    "AttentionShapeError",
]

BR = 128  # query rows per block (one thread per row); also key rows per block in the dK/dV kernels
BC = 32  # key (or query) rows per shared-memory tile
HEAD_DIM_MAX = 128
ROUTE = "nvrtc-ieee"
MAX_GRID_Y = 65535


class AttentionShapeError(ValueError):
    """Raised before any launch when shapes, masks or buffers are not admissible for the plan."""


# -- the plan: geometry, shared memory, every index ----------------------------------------------------


@dataclass(frozen=True)
class AttentionPlan:
    """Launch geometry and index maps of the forward, dQ and dK/dV kernels for one call."""

    batch: Any
    heads_q: Any
    heads_kv: Any
    seq_q: Any
    seq_k: Any
    head_dim: Any
    block_rows: Any
    block_cols: Any
    elem_size: Any
    group: Any
    hd_pad: Any
    grid_y_q: Any  # batch * heads_q (grid y of forward/dQ)
    grid_y_kv: Any  # batch * heads_kv (grid y of dK/dV)
    grid_q: Any  # cdiv(seq_q, block_rows)
    grid_k: Any  # cdiv(seq_k, block_rows)
    tiles_k: Any  # key tiles of a forward/dQ block without masks
    tiles_q: Any  # query tiles of a dK/dV block without masks
    smem_floats: Any  # per shared tile (K or V; Q or dO)
    smem_bytes: Any  # two float tiles
    q_elems: Any
    kv_elems: Any
    lse_elems: Any
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

    def row(self, bx: Any, t: Any) -> Any:
        """Query (or, in dK/dV, key) row of thread t of block bx, in the kernel's long long."""
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

    def smem_offset(self, c: Any, d: Any) -> Any:
        """Float offset of column c, feature d in a shared tile."""
        return c * self.hd_pad + d

    def key_end(self, bx: Any, causal: Any, kv_len: Any) -> Any:
        """One past the last key a forward/dQ block visits: kv_len, and under causal its last row + 1."""
        return select(causal, smin(as_type(kv_len, "int64"), self.row(bx + 1, 0)), as_type(kv_len, "int64"))

    def query_start(self, bx: Any, causal: Any) -> Any:
        """First query row a dK/dV block visits: 0, or under causal its first key's tile start."""
        return select(causal, self.row(bx, 0) // self.block_cols * self.block_cols, as_type(0, "int64"))


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
    hd_pad = cdiv(head_dim, 4) * 4
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
    smem_floats = block_cols * hd_pad
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
        group,
        hd_pad,
        bh,
        bkv,
        cdiv(seq_q, block_rows),
        cdiv(seq_k, block_rows),
        cdiv(seq_k, block_cols),
        cdiv(seq_q, block_cols),
        smem_floats,
        smem_floats * 8,
        bh * seq_q * head_dim,
        bkv * seq_k * head_dim,
        bh * seq_q,
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

_STORAGE: dict[str, str] = {
    "float32": r"""
typedef float T;
__device__ __forceinline__ float ld(const T* p, long long i) { return p[i]; }
__device__ __forceinline__ void st(T* p, long long i, float x) { p[i] = x; }
""",
    "float16": r"""
typedef unsigned short T;
__device__ __forceinline__ float ld(const T* p, long long i) {
    float f; unsigned short h = p[i];
    asm("{.reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t;}" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ void st(T* p, long long i, float x) {
    unsigned short h; asm("{.reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t;}" : "=h"(h) : "f"(x)); p[i] = h; }
""",
}

_HEADER = r"""
#define HD {hd}
#define HDP {hdp}
#define BC {bc}
#define BR {br}
#define INFINITY __int_as_float(0x7f800000)
{storage}
// Dot of a register row with a shared row, d ascending (fmaf: one rounding per step).
__device__ __forceinline__ float dotrow(const float* r, const float* s) {{
    const float4* s4 = reinterpret_cast<const float4*>(s);
    float acc = 0.0f;
    #pragma unroll
    for (int d4 = 0; d4 < HDP / 4; ++d4) {{
        const float4 x = s4[d4];
        acc = fmaf(r[4 * d4], x.x, acc); acc = fmaf(r[4 * d4 + 1], x.y, acc);
        acc = fmaf(r[4 * d4 + 2], x.z, acc); acc = fmaf(r[4 * d4 + 3], x.w, acc);
    }}
    return acc;
}}
// acc += p * shared row.
__device__ __forceinline__ void axpyrow(float* acc, float p, const float* s) {{
    const float4* s4 = reinterpret_cast<const float4*>(s);
    #pragma unroll
    for (int d4 = 0; d4 < HDP / 4; ++d4) {{
        const float4 x = s4[d4];
        acc[4 * d4] = fmaf(p, x.x, acc[4 * d4]); acc[4 * d4 + 1] = fmaf(p, x.y, acc[4 * d4 + 1]);
        acc[4 * d4 + 2] = fmaf(p, x.z, acc[4 * d4 + 2]); acc[4 * d4 + 3] = fmaf(p, x.w, acc[4 * d4 + 3]);
    }}
}}
// Two BC x HDP tiles of rows [t0, t0 + BC) (rows >= end and features >= HD are zero).
__device__ __forceinline__ void load_tiles(float* a, float* b, const T* ga, const T* gb, long long base,
                                           long long t0, long long end) {{
    for (unsigned e = threadIdx.x; e < BC * HDP; e += BR) {{
        const unsigned c = e / HDP, d = e % HDP;
        const long long j = t0 + c;
        const bool in = j < end && d < HD;
        a[e] = in ? ld(ga, (base + j) * HD + d) : 0.0f;
        b[e] = in ? ld(gb, (base + j) * HD + d) : 0.0f;
    }}
}}
"""

_FORWARD = r"""
extern "C" __global__ void __launch_bounds__(BR) attn_fwd(
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
        float* __restrict__ lse, const long long* __restrict__ kv_len, long long Hq, long long Hkv,
        long long Lq, long long Lk, float scale, int causal) {
    __shared__ __align__(16) float ks[BC * HDP];
    __shared__ __align__(16) float vs[BC * HDP];
    const long long bh = blockIdx.y, b = bh / Hq, h = bh - b * Hq, hk = h / (Hq / Hkv);
    const long long row = (long long)blockIdx.x * BR + threadIdx.x;
    const bool active = row < Lq;
    const long long klen = kv_len[b];
    const long long kend = causal ? min(klen, ((long long)blockIdx.x + 1) * BR) : klen;
    const long long kbase = (b * Hkv + hk) * Lk;
    float qr[HDP], acc[HDP];
    #pragma unroll
    for (int d = 0; d < HDP; ++d) {
        qr[d] = (active && d < HD) ? ld(q, (bh * Lq + row) * HD + d) : 0.0f;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, lsum = 0.0f;
    for (long long t0 = 0; t0 < kend; t0 += BC) {
        __syncthreads();
        load_tiles(ks, vs, k, v, kbase, t0, kend);
        __syncthreads();
        if (!active) continue;
        float s[BC];
        float tmax = -INFINITY;
        #pragma unroll
        for (int c = 0; c < BC; ++c) {
            const long long j = t0 + c;
            const bool ok = j < kend && (!causal || j <= row);
            s[c] = ok ? dotrow(qr, ks + c * HDP) * scale : -INFINITY;
            tmax = fmaxf(tmax, s[c]);
        }
        const float mnew = fmaxf(m, tmax);
        const float alpha = (mnew == -INFINITY) ? 1.0f : expf(m - mnew);
        lsum = lsum * alpha;
        #pragma unroll
        for (int d = 0; d < HDP; ++d) acc[d] = acc[d] * alpha;
        #pragma unroll
        for (int c = 0; c < BC; ++c) {
            const float p = (s[c] == -INFINITY) ? 0.0f : expf(s[c] - mnew);
            lsum = lsum + p;
            axpyrow(acc, p, vs + c * HDP);
        }
        m = mnew;
    }
    if (active) {
        const long long ob = (bh * Lq + row) * HD;
        #pragma unroll
        for (int d = 0; d < HD; ++d) st(o, ob + d, lsum > 0.0f ? acc[d] / lsum : 0.0f);
        lse[bh * Lq + row] = lsum > 0.0f ? m + logf(lsum) : INFINITY;
    }
}
"""

_DQ = r"""
extern "C" __global__ void __launch_bounds__(BR) attn_bwd_dq(
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ o,
        const T* __restrict__ dout, const float* __restrict__ lse, float* __restrict__ delta,
        T* __restrict__ dq, const long long* __restrict__ kv_len, long long Hq, long long Hkv,
        long long Lq, long long Lk, float scale, int causal) {
    __shared__ __align__(16) float ks[BC * HDP];
    __shared__ __align__(16) float vs[BC * HDP];
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

_DKV = r"""
// WHICH 0: dV = sum_i p_ij dO_i; WHICH 1: dK = scale sum_i p_ij (dP_ij - Delta_i) q_i; over every query head
// of the group and every query row i allowed to see key j.
extern "C" __global__ void __launch_bounds__(BR) attn_bwd_{name}(
        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
        const float* __restrict__ lse, const float* __restrict__ delta, T* __restrict__ grad,
        const long long* __restrict__ kv_len, long long Hq, long long Hkv, long long Lq, long long Lk,
        float scale, int causal) {{
    __shared__ __align__(16) float qs[BC * HDP];
    __shared__ __align__(16) float ds_[BC * HDP];
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

KERNELS: dict[str, tuple[str, str]] = {
    "fwd": (_FORWARD, "attn_fwd"),
    "dq": (_DQ, "attn_bwd_dq"),
    "dv": (_DKV.format(name="dv", which=0), "attn_bwd_dv"),
    "dk": (_DKV.format(name="dk", which=1), "attn_bwd_dk"),
}


def kernel_source(kind: str, head_dim: int, storage: str = "float32") -> tuple[str, str]:
    """(CUDA source, function name) of kernel ``kind`` for a compile-time head dim and storage type."""
    body, fn = KERNELS[kind]
    hdp = -(-head_dim // 4) * 4
    header = _HEADER.format(hd=head_dim, hdp=hdp, bc=BC, br=BR, storage=_STORAGE[storage])
    return header + body, fn


@register_builds("attention")
def _builds() -> Iterator[Build]:
    """The audited builds: each kernel at head dim 64 (float32 storage, and the float16 forward).

    Other head dims are the same template with other ``HD``/``HDP`` constants; compiling each to PTX costs about
    a second on a CPU, so the audit keeps to the dim the performance items measure.
    """
    bits = attention_plan(1, 1, 1, 1, 1, 64).index_bits
    for hd in (64,):
        for kind in KERNELS:
            for storage in ("float32", "float16") if kind == "fwd" else ("float32",):
                src, fn = kernel_source(kind, hd, storage)
                yield Build(
                    "attention",
                    f"{kind}-hd{hd}-{storage}",
                    src,
                    fn,
                    ROUTE,
                    approximate=True,
                    fused=True,
                    index_bits=bits,
                )


# -- entry points ----------------------------------------------------------------------------------------


def _checked_plan(q: Any, k: Any, v: Any, kv_lens: Any) -> AttentionPlan:
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise AttentionShapeError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: need "
            "(B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)"
        )
    b, hq, lq, d = (int(x) for x in q.shape)
    hkv, lk = int(k.shape[1]), int(k.shape[2])
    plan = attention_plan(b, hq, hkv, lq, lk, d, elem_size=q.dtype.itemsize)
    nb = [int(a.size) * a.dtype.itemsize for a in (q, k, v, q)]
    if not plan.accepts(*nb):
        raise AttentionShapeError(f"attention plan rejects B={b} Hq={hq} Hkv={hkv} Lq={lq} Lk={lk} D={d}")
    _lens(kv_lens, b, lk)
    return plan


def _launch_args(plan: AttentionPlan, kv_lens: Any, scale: float | None, causal: bool) -> tuple:
    import cupy

    lens = cupy.asarray(_lens(None if kv_lens is None else np.asarray(kv_lens), plan.batch, plan.seq_k))
    return lens, (
        np.int64(plan.heads_q),
        np.int64(plan.heads_kv),
        np.int64(plan.seq_q),
        np.int64(plan.seq_k),
        _scale(plan.head_dim, scale),
        np.int32(bool(causal)),
    )


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
) -> tuple[Any, Any]:
    """(out, lse) of fused attention on the host (NumPy) or the GPU (NVRTC kernel; float32 or float16 storage)."""
    if device == "host":
        _checked_plan(np.asarray(q, np.float32), np.asarray(k, np.float32), np.asarray(v, np.float32), kv_lens)
        out, lse = host_forward(q, k, v, causal=causal, kv_lens=kv_lens, scale=scale, tile=tile)
        return out.astype(np.asarray(q).dtype), lse  # float16 storage: the float32 result rounded once
    import cupy

    from native.nvrtc import compile_function

    q, k, v = (cupy.ascontiguousarray(a) for a in (q, k, v))
    plan = _checked_plan(q, k, v, kv_lens)
    storage = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}[np.dtype(q.dtype)]
    out = cupy.zeros(q.shape, dtype=q.dtype)
    lse = cupy.full(q.shape[:3], np.inf, dtype=cupy.float32)
    if plan.grid_q == 0:
        return out, lse
    lens, tail = _launch_args(plan, kv_lens, scale, causal)
    fn = compile_function(*kernel_source("fwd", plan.head_dim, storage), ROUTE)
    fn((int(plan.grid_q), int(plan.grid_y_q)), (BR,), (q, k.astype(q.dtype), v.astype(q.dtype), out, lse, lens, *tail))
    return out, lse


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
) -> tuple[Any, Any, Any]:
    """(dQ, dK, dV) from the forward's saved out and lse: three kernels (dQ with Delta, dV, dK), float32."""
    if device == "host":
        _checked_plan(np.asarray(q, np.float32), np.asarray(k, np.float32), np.asarray(v, np.float32), kv_lens)
        return host_vjp(q, k, v, out, lse, dout, causal=causal, kv_lens=kv_lens, scale=scale, tile=tile)
    import cupy

    from native.nvrtc import compile_function

    q, k, v, out, dout = (cupy.ascontiguousarray(a, dtype=cupy.float32) for a in (q, k, v, out, dout))
    lse = cupy.ascontiguousarray(lse, dtype=cupy.float32)
    plan = _checked_plan(q, k, v, kv_lens)
    dq, dk, dv = cupy.zeros_like(q), cupy.zeros_like(k), cupy.zeros_like(v)
    delta = cupy.zeros(q.shape[:3], dtype=cupy.float32)
    lens, tail = _launch_args(plan, kv_lens, scale, causal)
    if plan.grid_q:
        fn = compile_function(*kernel_source("dq", plan.head_dim), ROUTE)
        fn((int(plan.grid_q), int(plan.grid_y_q)), (BR,), (q, k, v, out, dout, lse, delta, dq, lens, *tail))
    if plan.grid_k:
        for kind, grad in (("dv", dv), ("dk", dk)):
            fn = compile_function(*kernel_source(kind, plan.head_dim), ROUTE)
            fn((int(plan.grid_k), int(plan.grid_y_kv)), (BR,), (q, k, v, dout, lse, delta, grad, lens, *tail))
    return dq, dk, dv
