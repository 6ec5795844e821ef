"""Scaled dot-product attention: the float64 reference, its VJP, and error bounds derived from the algorithm.

Meaning (shared/reference/kernel-families.md, "Fused attention"): scores = Q K^T * scale (scale 1/sqrt(d),
1 when d = 0); mask true = allowed; blocked entries contribute exactly 0, the row max and the denominator run
over allowed entries only; a row with every entry blocked outputs zeros. out = softmax(scores) V.
Backward: dV = A^T dO; dA = dO V^T; dS = A o (dA - rowsum(dA o A)) * scale; dQ = dS K; dK = dS^T Q
(GQA: dK, dV summed over the query heads of a KV head).

The bounds (docs/attention.md derives them) are per output element, evaluated in float64 from the inputs:
gamma_n = n u / (1 - n u), u = 2^-24; score errors gamma_D; the online softmax's weights are perturbed by a
factor within exp(+-A) (score errors, the subtraction and expf's 2 ulp, one rescale per tile), its sums
by gamma_(Lk + T + 1).

The float16 kernel runs both products on tensor cores (mma m16n8k16, float32 accumulators); its bound uses a stated
model of that hardware (``tensor_core=True``): products of float16 values are exact in float32; each k-step of 16
products and the accumulator is added with every term aligned to the largest and truncated, so one step errs by at
most (16 + 2) 2^-23 times the sum of the magnitudes it adds (TC_STEP below), and a dot of n steps by gamma_(36 n)
(u = 2^-24). Its scores are in log2 units (t = fl(S fl(scale log2 e)), one rounding more than S scale) and its
weights exp2f(t - m), 2 ulp like expf (CUDA Math API), so A keeps its form. P is rounded to float16 for the P V
product (relative 2^-11, absolute 2^-25 below 2^-14) while the row sums use the float32 P.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "U32",
    "U16",
    "gamma",
    "scale_of",
    "mask",
    "probs",
    "sdpa",
    "sdpa_vjp",
    "forward_bound",
    "vjp_bound",
    "untiled_f32",
    "UNDERFLOW",
    "OUT_TINY",
    "TC_STEP",
    "TC_K",
    "tc_gamma",
]

U32 = 2.0**-24
U16 = 2.0**-11
EXP_ULP = 4 * U32  # expf: 2 ulp (CUDA Programming Guide, Table 13): relative error <= 2 * 2^-23
OUT_TINY = {U32: 2.0**-150, U16: 2.0**-25}  # half the subnormal spacing of float32 / float16 outputs
UNDERFLOW = 2.0**-147  # absolute allowance per term for weights and products in the subnormal range
TC_K = 16  # products per tensor-core k-step (mma m16n8k16)
TC_STEP = 2 * (TC_K + 2)  # one k-step errs by at most (TC_K + 2) 2^-23 = TC_STEP u of the magnitudes it adds
P16_TINY = 2.0**-25  # half the float16 subnormal spacing: P below 2^-14 rounds with this absolute error


def gamma(n: Any, u: float = U32) -> Any:
    """Higham's gamma_n = n u / (1 - n u)."""
    n = np.asarray(n, dtype=np.float64)
    return n * u / (1 - n * u)


def tc_gamma(terms: Any, extra: Any = 0) -> Any:
    """Tensor-core model: gamma of a dot of ``terms`` products (ceil(terms / 16) k-steps) and ``extra`` roundings."""
    steps = -(-np.asarray(terms, dtype=np.int64) // TC_K)
    return gamma(TC_STEP * steps + np.asarray(extra))


def scale_of(head_dim: int, scale: float | None = None) -> float:
    """The score scale: ``scale`` if given, else 1/sqrt(head_dim) (1 when head_dim = 0)."""
    return float(scale) if scale is not None else (1.0 / np.sqrt(head_dim) if head_dim else 1.0)


def mask(batch: int, seq_q: int, seq_k: int, causal: bool, kv_lens: Any) -> np.ndarray:
    """(batch, 1, seq_q, seq_k) bool, true = allowed: j < kv_len[b], and j <= i under causal."""
    lens = np.full(batch, seq_k) if kv_lens is None else np.asarray(kv_lens)
    j = np.arange(seq_k)
    ok = np.broadcast_to(j[None, None, None, :] < lens[:, None, None, None], (batch, 1, seq_q, seq_k))
    if causal:
        ok = ok & (j[None, :] <= np.arange(seq_q)[:, None])[None, None]
    return np.asarray(ok)


def _expand(x: np.ndarray, heads_q: int) -> np.ndarray:
    return np.repeat(np.asarray(x, dtype=np.float64), heads_q // x.shape[1], axis=1)


def _scores(q: np.ndarray, k: np.ndarray, scale: float | None) -> np.ndarray:
    q = np.asarray(q, dtype=np.float64)
    return np.einsum("bhid,bhjd->bhij", q, _expand(k, q.shape[1])) * scale_of(q.shape[-1], scale)


def probs(q: Any, k: Any, *, causal: bool = False, kv_lens: Any = None, scale: float | None = None) -> np.ndarray:
    """A = softmax over allowed entries, rows with none allowed all zero (float64)."""
    s = _scores(q, k, scale)
    ok = mask(s.shape[0], s.shape[2], s.shape[3], causal, kv_lens)
    m = np.where(ok, s, -np.inf).max(axis=-1, keepdims=True, initial=-np.inf)  # Lk = 0: no keys, rows of zeros
    with np.errstate(all="ignore"):
        w = np.where(ok, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    lsum = w.sum(axis=-1, keepdims=True)
    return np.where(lsum > 0, w / np.where(lsum > 0, lsum, 1), 0.0)


def sdpa(
    q: Any, k: Any, v: Any, *, causal: bool = False, kv_lens: Any = None, scale: float | None = None
) -> np.ndarray:
    """softmax(Q K^T * scale + mask) V in float64; fully masked rows are zeros."""
    a = probs(q, k, causal=causal, kv_lens=kv_lens, scale=scale)
    return np.einsum("bhij,bhjd->bhid", a, _expand(v, a.shape[1]))


def _group_sum(x: np.ndarray, heads_kv: int) -> np.ndarray:
    b, hq = x.shape[:2]
    return x.reshape(b, heads_kv, hq // heads_kv, *x.shape[2:]).sum(axis=2)


def sdpa_vjp(
    q: Any, k: Any, v: Any, dout: Any, *, causal: bool = False, kv_lens: Any = None, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) of sdpa in float64 (the formulas of the module docstring)."""
    q, dout = np.asarray(q, np.float64), np.asarray(dout, np.float64)
    hkv = k.shape[1]
    sc = scale_of(q.shape[-1], scale)
    a = probs(q, k, causal=causal, kv_lens=kv_lens, scale=scale)
    ke, ve = _expand(k, q.shape[1]), _expand(v, q.shape[1])
    dv = np.einsum("bhij,bhid->bhjd", a, dout)
    da = np.einsum("bhid,bhjd->bhij", dout, ve)
    ds = a * (da - (da * a).sum(axis=-1, keepdims=True)) * sc
    return (
        np.einsum("bhij,bhjd->bhid", ds, ke),
        _group_sum(np.einsum("bhij,bhid->bhjd", ds, q), hkv),
        _group_sum(dv, hkv),
    )


def _weight_log_error(
    q: np.ndarray, k: np.ndarray, ok: np.ndarray, scale: float | None, tiles: int, tensor_core: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A per row, score error bound per entry, exact scores): |log w~_j/w_j| <= A (common factors cancel)."""
    d = q.shape[-1]
    sc = scale_of(d, scale)
    s = _scores(q, k, scale)
    a = np.einsum("bhid,bhjd->bhij", np.abs(q), np.abs(_expand(k, q.shape[1]))) * sc
    g_dot = tc_gamma(-(-d // 64) * 64) if tensor_core else gamma(d)  # the kernel's padded head dim on tensor cores
    # Roundings between the dot and the exponent: fp32(scale) and fl(dot scale); on tensor cores the scores are in
    # log2 units, fl(dot sl) with sl = fl(fp32(scale) log2(e)): one more.
    r = (1 + U32) ** (3 if tensor_core else 2)
    ds = a * g_dot * r + np.abs(s) * (r - 1)
    hi = np.where(ok, s, -np.inf).max(axis=-1, initial=-np.inf)  # Lk = 0: no keys, nothing to bound
    lo = np.where(ok, s, np.inf).min(axis=-1, initial=np.inf)
    with np.errstate(all="ignore"):
        rng = np.where(np.isfinite(hi), hi - lo, 0.0) + 2 * np.where(ok, ds, 0).max(axis=-1, initial=0.0)
    big = np.where(ok, ds, 0).max(axis=-1, initial=0.0)
    return big + 2 * U32 * rng + EXP_ULP + (EXP_ULP + 2 * U32) * tiles, ds, s


def forward_bound(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    kv_lens: Any = None,
    scale: float | None = None,
    tiles: int = 1,
    u_out: float = U32,
    tensor_core: bool = False,
    tile_keys: int = 64,
) -> tuple[np.ndarray, np.ndarray]:
    """(float64 reference, per-element bound) of the tiled online-softmax forward with ``tiles`` key tiles.

    |out~ - out| <= (expm1(2A) + e^(2A) ((g_o + g_l) / (1 - g_l) + (1 + g_o) u_p)) (1 + u_out) S + u_out |out| + tiny
    + Lk (2^-147 + p_tiny) max|v|, S = sum_j A_ij |v_j|, g_o = gamma_(Lk + T + 1), g_l = gamma_(Lk + T); ``u_out``
    is the output format's unit roundoff (2^-11 for float16 storage). With ``tensor_core`` (the float16 kernel):
    scores use tc_gamma over the padded head dim, g_o = tc_gamma(T tile_keys, T + 1) (T tiles of ``tile_keys``
    keys), and P rounded to float16 adds u_p = 2^-11 relative and p_tiny = 2 * 2^-25 absolute per key (l >= 1/2).
    """
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, hq, lq, _ = q.shape
    lk = k.shape[2]
    ok = mask(b, lq, lk, causal, kv_lens)
    big_a, _, _ = _weight_log_error(q, k, ok, scale, tiles, tensor_core)
    p = probs(q, k, causal=causal, kv_lens=kv_lens, scale=scale)
    out = np.einsum("bhij,bhjd->bhid", p, _expand(v, hq))
    s1 = np.einsum("bhij,bhjd->bhid", p, np.abs(_expand(v, hq)))
    gl = gamma(lk + tiles)
    go = tc_gamma(tiles * tile_keys, tiles + 1) if tensor_core else gamma(lk + tiles + 1)
    u_p, p_tiny = (U16, 2 * P16_TINY) if tensor_core else (0.0, 0.0)
    e2a = np.exp(2 * big_a)[..., None]
    rel = np.expm1(2 * big_a)[..., None] + e2a * ((go + gl) / (1 - gl) + (1 + go) * u_p)
    vmax = float(np.abs(v).max()) if v.size else 0.0
    tiny = OUT_TINY[u_out]  # half the output format's subnormal spacing: rounding there is absolute, not relative
    bound = rel * (1 + u_out) * s1 + u_out * np.abs(out) + tiny + lk * (UNDERFLOW + p_tiny) * vmax + 2.0**-45 * s1
    return out, bound


def vjp_bound(
    q: Any,
    k: Any,
    v: Any,
    dout: Any,
    *,
    causal: bool = False,
    kv_lens: Any = None,
    scale: float | None = None,
    tiles: int = 1,
) -> tuple[tuple, tuple]:
    """((dQ, dK, dV) float64, (bound dQ, bound dK, bound dV)) of the tiled VJP from a float32 forward.

    p~ = exp(s~ - lse~) is within expm1(B) p (B: score error, lse error from the forward's sums and logf,
    the subtraction, expf); dP and Delta are D-term dot products (Delta reads the forward's out, with its
    bound); dS, then dQ (Lk + T + 1 roundings per term), dK and dV (g (Lq + 1) + 1) and two scale roundings.
    """
    q, k, v, dout = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = hq // hkv
    sc = scale_of(d, scale)
    ok = mask(b, lq, lk, causal, kv_lens)
    big_a, ds_err, s = _weight_log_error(q, k, ok, scale, tiles)
    p = probs(q, k, causal=causal, kv_lens=kv_lens, scale=scale)
    ke, ve = _expand(k, hq), _expand(v, hq)
    out, out_b = forward_bound(q, k, v, causal=causal, kv_lens=kv_lens, scale=scale, tiles=tiles)
    with np.errstate(all="ignore"):
        top = np.where(ok, s, -np.inf).max(-1, keepdims=True, initial=-np.inf)  # Lk = 0: no keys (ATT-REGIMES)
        lse = np.log(np.where(ok, np.exp(s - top), 0).sum(-1)) + top[..., 0]
    lse = np.where(np.isfinite(lse), lse, 0.0)
    gl = gamma(lk + tiles)
    dlse = big_a + 2 * gl + 2 * U32 * (np.log(lk + 1) + 1) + 2 * U32 * np.abs(lse)
    bexp = ds_err + dlse[..., None] + U32 * (np.abs(s - lse[..., None]) + ds_err + dlse[..., None]) + EXP_ULP
    ep = np.where(ok, np.expm1(bexp) * p, 0.0) + np.where(ok, UNDERFLOW, 0.0)
    dpv = np.einsum("bhid,bhjd->bhij", dout, ve)
    delta = (dout * out).sum(-1)
    e_dp = gamma(d) * np.einsum("bhid,bhjd->bhij", np.abs(dout), np.abs(ve))
    e_delta = gamma(d) * (np.abs(dout) * (np.abs(out) + out_b)).sum(-1) + (np.abs(dout) * out_b).sum(-1)
    c = np.abs(dpv - delta[..., None]) + e_dp + e_delta[..., None]
    ds = p * (dpv - delta[..., None])
    e_ds = ep * c + p * (e_dp + e_delta[..., None]) + (p + ep) * c * (2 * U32 + U32**2)
    ads = np.abs(ds) + e_ds
    nq, nk = lk + tiles + 1, g * (lq + 1) + 1
    dq = sc * np.einsum("bhij,bhjd->bhid", ds, ke)
    bq = (
        sc
        * (1 + 3 * U32)
        * (np.einsum("bhij,bhjd->bhid", e_ds, np.abs(ke)) + gamma(nq) * np.einsum("bhij,bhjd->bhid", ads, np.abs(ke)))
    )
    bq += 2 * U32 * sc * np.einsum("bhij,bhjd->bhid", ads, np.abs(ke))
    dk = _group_sum(sc * np.einsum("bhij,bhid->bhjd", ds, q), hkv)
    tk = np.einsum("bhij,bhid->bhjd", ads, np.abs(q))
    bk = _group_sum(
        sc * (1 + 3 * U32) * (np.einsum("bhij,bhid->bhjd", e_ds, np.abs(q)) + gamma(nk) * tk) + 2 * U32 * sc * tk, hkv
    )
    dv = _group_sum(np.einsum("bhij,bhid->bhjd", p, dout), hkv)
    tv = np.einsum("bhij,bhid->bhjd", p + ep, np.abs(dout))
    bv = _group_sum(np.einsum("bhij,bhid->bhjd", ep, np.abs(dout)) + gamma(nk) * tv, hkv)
    slack = (
        lq
        * lk
        * g
        * UNDERFLOW
        * (1 + float(np.abs(q).max(initial=0)) + float(np.abs(k).max(initial=0)) + float(np.abs(dout).max(initial=0)))
    )
    return (dq, dk, dv), (bq + slack, bk + slack, bv + slack)


def untiled_f32(
    q: Any, k: Any, v: Any, *, causal: bool = False, kv_lens: Any = None, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The untiled float32 softmax attention with the host path's primitives: (out, lse) in float32.

    s = fl(Q K^T) * fl(scale), blocked -inf; m = row max; p = exp(s - m) rounded once (0 where blocked);
    lsum = row sum; o = p V; out = o / l (0 where lsum = 0); lse = m + log l (+inf where lsum = 0).
    """
    q, k, v = (np.asarray(x, np.float32) for x in (q, k, v))
    b, hq, lq, d = q.shape
    lk = k.shape[2]
    sc = np.float32(scale_of(d, scale))
    ke, ve = (np.repeat(x, hq // x.shape[1], axis=1) for x in (k, v))
    ok = mask(b, lq, lk, causal, kv_lens)
    s = np.where(ok, (np.matmul(q, ke.swapaxes(-1, -2)) * sc).astype(np.float32), np.float32(-np.inf))
    m = s.max(axis=-1)
    with np.errstate(all="ignore"):
        p = np.where(np.isneginf(s), 0, np.exp((s - m[..., None]).astype(np.float64)).astype(np.float32))
        p = p.astype(np.float32)
        lsum = p.sum(axis=-1, dtype=np.float32)
        o = np.matmul(p, ve).astype(np.float32)
        out = np.where((lsum > 0)[..., None], (o / np.where(lsum > 0, lsum, 1)[..., None]).astype(np.float32), 0)
        lse = np.where(lsum > 0, m + np.log(np.where(lsum > 0, lsum, 1)), np.inf).astype(np.float32)
    return out.astype(np.float32), lse
