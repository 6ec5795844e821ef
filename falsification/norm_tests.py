"""Falsification tests of the norm-softmax-v1 contract, registered by name, each an engine :class:`Check`.

* ``norm.bitwise`` {op, impl} — output bits equal the softfloat spec (:mod:`spec.norm`) on any input bits with
  random masks (fully masked rows included). ops: softmax, log_softmax, softmax_bwd, log_softmax_bwd (the
  exp/log ops on the host only: the CUDA build uses libdevice expf/logf), layernorm, layernorm_bwd, rmsnorm,
  rmsnorm_bwd (both devices).
* ``norm.error_bound`` {op: softmax|log_softmax, impl} — within tolerance x the derived per-element bound of the
  float64 softmax (finite inputs, masks): subtraction rounding, exp within 2 ulp, the fold's gamma_{L-1},
  the division (log-softmax: log within 1 ulp, the subtractions).
* ``norm.sum_to_one`` {impl} — |sum_k y_k - 1| <= tolerance x (gamma_L + L 2^-149) per row with an allowed entry
  (exactly 0 for a fully masked row).
* ``norm.shift_invariance`` {impl} — softmax(x + c) is bitwise softmax(x) when every x + c is exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from falsification import engine
from falsification.agreement import Expected
from falsification.engine import Check, Judgement
from falsification.float32_inputs import MIXES, BatchSpec, generate_bits
from falsification.registry import FalsifyContext, register_test
from native import norm as native_norm
from native.norm import RowsRefused, row_plan
from obligations.core.device import array_module, to_host
from obligations.core.plans import regime_of, resolve
from obligations.core.results import Outcome, skipped
from spec import norm as ref
from spec import triton_rmsnorm as trms
from spec import triton_softmax as tsm

__all__ = ["NormCase", "MIX_NAMES", "HOST_ONLY"]

U = 2.0**-24
MIX_NAMES: tuple[str, ...] = ("moderate", "narrow", *sorted(MIXES), "ties")
# x (softmax backward: y) / dy magnitudes of the backward bound items; no product overflows binary32
BWD_MIXES: tuple[str, ...] = (
    "moderate/moderate",
    "prob/wide",
    "prob/large",
    "prob/tiny",
    "narrow/small",
    "small/moderate",
    "tiny/moderate",
    "moderate/tiny",
    "large/moderate",
    "wide/small",
)
HOST_ONLY = ("softmax", "log_softmax", "log_softmax_bwd")
_IMPL = {
    op: f"native.norm:{op.replace('_bwd', '_backward')}"
    for op in (
        "softmax",
        "log_softmax",
        "softmax_bwd",
        "log_softmax_bwd",
        "layernorm",
        "layernorm_bwd",
        "rmsnorm",
        "rmsnorm_bwd",
    )
}


@dataclass(frozen=True)
class NormCase:
    """seed, input mix, rows, length, mask density in eighths (8: no mask)."""

    seed: int
    mix: int
    rows: int
    length: int
    density: int

    def ints(self) -> tuple[int, ...]:
        """Replay integers."""
        return (self.seed, self.mix, self.rows, self.length, self.density)


def _cases(mixes: int, masks: bool = True) -> st.SearchStrategy[NormCase]:
    return st.builds(
        NormCase,
        st.integers(0, 2**32 - 1),
        st.integers(0, mixes - 1),
        st.integers(1, 6),
        st.integers(1, 40),
        st.integers(0, 8) if masks else st.just(8),
    )


def _masks(ctx: FalsifyContext) -> bool:
    """Whether the item's kernel takes masks (params ``masks: false``: a kernel without one, every case unmasked)."""
    return bool(ctx.params.get("masks", True))


def _plan(ctx: FalsifyContext) -> Callable[..., Any]:
    """The launch plan of the item's kernel (where the contract names one), else the CUDA kernels' row plan: the
    plan whose regimes a case selects."""
    kernel = (ctx.contract.get("kernels") or {}).get(ctx.item.get("kernel")) or {}
    return resolve(kernel["plan"]) if "plan" in kernel else row_plan


# magnitude mixes: value = uniform(-1, 1) * 2^e, e uniform in [lo, hi] (narrow: |x| <= 1, so every exp of a row
# counts in its sum; large/small/tiny/wide: the backward bounds' magnitude and underflow terms)
_SCALES: dict[str, tuple[int, int]] = {
    "moderate": (-6, 6),
    "narrow": (0, 0),
    "large": (40, 50),
    "small": (-50, -40),
    "tiny": (-140, -120),
    "wide": (-50, 50),
}


def _bits(seed: int, n: int, mix: str) -> np.ndarray:
    if mix == "ties":  # rows of several equal maxima (+-0, infinities, ones) or several NaNs: the row max's choice
        from falsification.reductions_tests import tie_floats

        return tie_floats(seed, n)
    if mix in _SCALES:
        lo, hi = _SCALES[mix]
        rng = np.random.default_rng(seed)
        return (rng.uniform(-1, 1, n) * np.exp2(rng.integers(lo, hi + 1, n))).astype(np.float32).view(np.uint32)
    return generate_bits(BatchSpec(seed=seed, size=n, mix=mix), 1, np)[0]


@dataclass(frozen=True)
class _In:
    case: NormCase
    x: np.ndarray
    dy: np.ndarray
    w: np.ndarray
    b: np.ndarray
    mask: np.ndarray | None


def _inputs(c: NormCase, mixes: tuple[str, ...] = MIX_NAMES) -> _In:
    shape = (c.rows, c.length)
    n = c.rows * c.length
    mask = None
    if c.density < 8:
        rng = np.random.default_rng(c.seed ^ 0x5EED)
        mask = rng.random(shape) < c.density / 8
        mask[0] = mask[0] & (c.rows == 1)  # the first row of a multi-row case is fully masked
    x_mix, _, dy_mix = mixes[c.mix].partition("/")  # "x/dy" names both magnitudes (dy moderate by default)
    if x_mix == "prob":  # probabilities: the masked softmax of moderate values, rounded to float32
        x = ref.softmax_f64(_bits(c.seed, n, "moderate").view(np.float32).reshape(shape), mask)
        x_bits = x.astype(np.float32).view(np.uint32)
    else:
        x_bits = _bits(c.seed, n, x_mix).reshape(shape)
    return _In(
        c,
        x_bits,
        _bits(c.seed + 1, n, dy_mix or "moderate").reshape(shape),
        _bits(c.seed + 2, c.length, "moderate"),
        _bits(c.seed + 3, c.length, "moderate"),
        mask,
    )


def _f(xp: Any, u: np.ndarray) -> Any:
    return xp.asarray(u.view(np.float32))


def _hb(a: Any) -> np.ndarray:
    return np.ascontiguousarray(to_host(a)).astype(np.float32).view(np.uint32)


def _run(op: str, impl: Any, i: _In, xp: Any, device: str) -> list[np.ndarray]:
    m = None if i.mask is None else xp.asarray(i.mask)
    x, dy, w, b = (_f(xp, a) for a in (i.x, i.dy, i.w, i.b))
    if op in ("softmax", "log_softmax"):
        return [_hb(impl(x, m, device=device))]
    if op in ("softmax_bwd", "log_softmax_bwd"):
        return [_hb(impl(x, dy, m, device=device))]
    if op == "layernorm":
        return [_hb(impl(x, w, b, device=device))]
    if op == "rmsnorm":
        return [_hb(impl(x, w, device=device))]
    return [np.concatenate([_hb(o).reshape(-1) for o in impl(x, w, dy, device=device)])]  # dx, dw(, db)


def _spec(op: str, i: _In) -> list[np.ndarray]:
    fn = {
        "softmax": lambda: ref.softmax(i.x, i.mask),
        "log_softmax": lambda: ref.log_softmax(i.x, i.mask),
        "softmax_bwd": lambda: ref.softmax_backward(i.x, i.dy, i.mask),
        "log_softmax_bwd": lambda: ref.log_softmax_backward(i.x, i.dy, i.mask),
        "layernorm": lambda: ref.layernorm(i.x, i.w, i.b),
        "rmsnorm": lambda: ref.rmsnorm(i.x, i.w),
        "layernorm_bwd": lambda: list(ref.layernorm_backward(i.x, i.w, i.dy)),
        "rmsnorm_bwd": lambda: list(ref.rmsnorm_backward(i.x, i.w, i.dy)),
    }[op]()
    return [np.concatenate([o.reshape(-1) for o in fn])] if isinstance(fn, list) else [fn]


def _reversed(i: _In) -> _In:
    """The case with its last axis reversed (x, dy, w, b, mask)."""
    return _In(
        i.case,
        np.ascontiguousarray(i.x[..., ::-1]),
        np.ascontiguousarray(i.dy[..., ::-1]),
        np.ascontiguousarray(i.w[::-1]),
        np.ascontiguousarray(i.b[::-1]),
        None if i.mask is None else np.ascontiguousarray(i.mask[..., ::-1]),
    )


def _alternative(op: str, i: _In) -> list[Expected]:
    """The spec folding each row in reverse index order (the same op on the reversed axis, reversed back)."""
    out = _spec(op, _reversed(i))[0]
    rows, length = i.x.shape
    if op.endswith("norm_bwd"):
        parts = [out[: rows * length].reshape(rows, length)[:, ::-1].reshape(-1)]
        rest = out[rows * length :]
        parts += [rest[j * length : (j + 1) * length][::-1] for j in range(len(rest) // length)]
        return [Expected(bits=np.concatenate(parts))]
    return [Expected(bits=np.ascontiguousarray(out.reshape(rows, length)[:, ::-1]))]


def _check(
    ctx: FalsifyContext,
    name: str,
    native: Any,
    reference: Any,
    agreement: Any,
    cases: Any,
    mixes: tuple[str, ...] = MIX_NAMES,
    more: tuple[NormCase, ...] = (),
    **kw: Any,
) -> Check:
    masks, plan = _masks(ctx), _plan(ctx)

    def unmasked(cases: tuple[NormCase, ...]) -> tuple[NormCase, ...]:
        return cases if masks else tuple(replace(c, density=8) for c in cases)

    return Check(
        name=name,
        inputs=lambda c: _inputs(c, mixes),
        native=native,
        reference=reference,
        agreement=agreement,
        cases=cases,
        explicit=unmasked(
            (
                NormCase(ctx.seed, 0, 3, 17, 5),
                NormCase(ctx.seed + 1, 0, 1, 1, 8),
                NormCase(ctx.seed + 2, min(1, len(mixes) - 1), 2, 40, 8),
                NormCase(ctx.seed + 3, min(1, len(mixes) - 1), 3, 23, 6),
                *_tie_cases(mixes),
                *more,
            )
        ),
        encode=lambda c: c.ints(),
        decode=lambda rp: NormCase(*rp.values[:5]),
        # the regimes item's witnesses: rows and length from the plan, masked (5/8) where there are elements
        from_witness=lambda w: NormCase(
            ctx.seed, 0, int(w["rows"]), int(w["length"]), 5 if masks and w["rows"] and w["length"] else 8
        ),
        regime_of=lambda c: regime_of(plan, {"rows": c.rows, "length": c.length}),
        refuses=(RowsRefused,),
        describe=lambda c: {
            "seed": c.seed,
            "mix": mixes[c.mix],
            "rows": c.rows,
            "length": c.length,
            "mask_density_eighths": c.density,
        },
        **kw,
    )


def _tie_cases(mixes: tuple[str, ...]) -> tuple[NormCase, ...]:
    """Ties for the row maximum: three rows of each tie pool (seed % 3: zeros, NaNs, equal maxima), unmasked and
    masked; none where the item's mixes have no "ties"."""
    if "ties" not in mixes:
        return ()
    return tuple(NormCase(seed, mixes.index("ties"), 3, 11, density) for seed in (0, 1, 2) for density in (8, 5))


@register_test("norm.bitwise")
def bitwise(ctx: FalsifyContext) -> Outcome:
    """Softmax / norms forward and backward bitwise equal to the softfloat spec."""
    op = ctx.params.get("op", "softmax")
    name = ctx.params.get("impl", _IMPL[op])
    if ctx.device != "host" and op in HOST_ONLY:
        return skipped(
            f"runs on host (on CUDA {op} uses libdevice expf/logf: claimed within its bound by norm.error_bound, "
            f"not bitwise); this run is on {ctx.device}",
            **engine.evidence(ctx),
        )
    impl = resolve(name)
    xp = array_module(ctx.device)
    check = _check(
        ctx,
        f"norm {op}",
        lambda i: _run(op, impl, i, xp, ctx.device),
        lambda i: [Expected(bits=b) for b in _spec(op, i)],
        engine.item_agreement(ctx, "bitwise"),
        _cases(len(MIX_NAMES)),
        output_names=("dx|dw|db" if op.endswith("norm_bwd") else "y",),
        alternative=lambda i: _alternative(op, i),
        alternative_name="each row folded in reverse index order",
        build={
            "impl": name,
            "op": op,
            "reference": "spec.norm (softfloat, env cuda; exp/log/rsqrt float64 rounded once)",
        },
    )
    return engine.run(ctx, check)


def _gamma(k: Any, u: float = U) -> Any:
    """gamma_k = k u / (1 - k u), 0 for k <= 0 (k an int or an array of them)."""
    k = np.maximum(np.asarray(k, np.float64), 0.0)
    g = k * u / (1 - k * u)
    return float(g) if g.ndim == 0 else g


def softmax_bound(
    x: np.ndarray,
    mask: np.ndarray | None,
    log: bool,
    tol: float = 1.0,
    *,
    arg_rounds: int = 1,
    exp_rel: float = 4 * U,
    div_rel: float = U,
) -> tuple[np.ndarray, np.ndarray]:
    """(float64 value, per-element bound) of (log-)softmax for float32 inputs: the contract's derived bound.

    ``arg_rounds``: roundings in exp's argument (1: fl(x - m); Triton's tl.exp: 3, fl(fl(x - m) fl(log2 e)));
    ``exp_rel``: exp's relative error (2 ulp); ``div_rel``: the division's (correctly rounded: u)."""
    x64 = x.astype(np.float64)
    ok = np.ones(x.shape, bool) if mask is None else mask
    y = ref.softmax_f64(x64, ok)
    length = x.shape[-1]
    m = np.max(np.where(ok, x64, -np.inf), axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        t = np.where(ok, np.abs(x64 - np.where(np.isfinite(m), m, 0.0)), 0.0)
    a = np.expm1(arg_rounds * U * t * (1 + 2 * U)) * (1 + exp_rel) + exp_rel  # relative error of each exp
    amax = np.max(np.where(ok, a, 0.0), axis=-1, keepdims=True)
    g = _gamma(length - 1)
    ssub = length * 2.0**-148  # subnormal exp results: 2 ulp absolute each, against s >= 1
    hi = (1 + amax) * (1 + g) + ssub
    lo = (1 - amax) * (1 - g) - ssub
    if not log:
        up = (1 + a) * (1 + div_rel) / lo - 1
        down = 1 - (1 - a) * (1 - div_rel) / hi
        bound = y * np.maximum(up, down) + 2.0**-147
        return np.where(ok, y, 0.0), np.where(ok, tol * bound * (1 + 2.0**-40), 0.0)
    with np.errstate(all="ignore"):
        s = np.sum(np.where(ok, np.exp(x64 - np.where(np.isfinite(m), m, 0.0)), 0.0), axis=-1, keepdims=True)
        logs = np.log(np.where(s > 0, s, 1.0))
        value = np.where(ok, x64 - m - logs, -np.inf)
    dlog = np.maximum(np.log(hi), -np.log(lo))
    e2 = dlog + 2 * U * (logs + dlog)  # log(s_hat) vs log(s), then logf within 1 ulp (2u relative)
    bound = (U * t + e2) * (1 + U) + U * (np.abs(np.where(ok, value, 0.0)) + U * t + e2) + 2.0**-149
    return value, np.where(ok, tol * bound * (1 + 2.0**-40), np.inf)


EXP_REL = 2.0**-22  # libdevice expf: 2 ulp <= 2^-22 relative; subnormal results 2^-148 absolute
F64_SLACK = 2.0**-40  # the float64 reference's own rounding (rows of at most 2^12 elements)


def log_softmax_backward_bound(
    y: np.ndarray, dy: np.ndarray, mask: np.ndarray | None, tol: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """(float64 value, per-element bound) of dx = dy - exp(y) sum(dy): gamma_{L-1} fold, expf, fl(e t), fl(dy - p)."""
    y64, g = y.astype(np.float64), dy.astype(np.float64)
    ok = np.ones(y.shape, bool) if mask is None else mask
    length = y.shape[-1]
    gz = np.where(ok, g, 0.0)
    t = gz.sum(-1, keepdims=True)
    e_t = _gamma(length - 1) * np.abs(gz).sum(-1, keepdims=True) + length * 2.0**-150
    with np.errstate(all="ignore"):
        e = np.exp(y64)
    e_e = EXP_REL * e + 2.0**-148
    p_err = e_e * (np.abs(t) + e_t) + e * e_t
    p_err = p_err + U * (e + e_e) * (np.abs(t) + e_t) + 2.0**-150
    value = ref.log_softmax_backward_f64(y, dy, ok)
    bound = p_err + U * (np.abs(value) + p_err) + F64_SLACK * (np.abs(g) + e * np.abs(t))
    return np.where(ok, value, 0.0), np.where(ok, tol * bound * (1 + 2.0**-30), 0.0)


@dataclass(frozen=True)
class Rounding:
    """One arithmetic's error model: unit roundoff u, underflow unit tiny (the absolute error of a product or
    quotient whose result is subnormal), and rsqrt_rel, the relative error the rsqrt adds beyond its input's."""

    u: float
    tiny: float
    rsqrt_rel: float
    div: float | None = None  # the division by n's relative error (None: u, exact where n is a power of two)


# the kernels: binary32 ops, rsqrt = (float)(1.0 / sqrt((double)v)): two double roundings, then one to binary32
KERNEL = Rounding(U, 2.0**-150, U + 2.0**-50)
# the float64 references of spec.norm in the kernels' order: their own error is the same derivation at u = 2^-53
# (sums pairwise or sequential: both within gamma_{n-1}); rsqrt = 1 / sqrt(v): (1 + u)/(1 - u) - 1 <= 2u + 2^-103
REFERENCE = Rounding(2.0**-53, 2.0**-1075, 2.0**-52 + 2.0**-103)
# Triton's fp32 lowering of the RMSNorm kernel (spec.triton_rmsnorm): rsqrt = 1 / tl.sqrt(v), the mean's / N div.full
TRITON = Rounding(U, 2.0**-150, trms.RSQRT_REL, div=trms.DIV_REL)
BOUND_EVAL = 1 + 2.0**-30  # the float64 evaluation of a bound (and of its exact quantities), relative


@dataclass(frozen=True)
class _NormTerms:
    """Exact (float64) D = x - mu (RMSNorm: x), R = (V + eps)^-1/2, XH = D R and the kernel's error bounds
    e_d, e_r, e_xh on d_hat, r_hat, xh_hat = fl(d_hat r_hat) (equation norm_bounds)."""

    d: np.ndarray
    e_d: np.ndarray
    r: np.ndarray
    e_r: np.ndarray
    xh: np.ndarray
    e_xh: np.ndarray


def _div_u(n: int, u: float) -> float:
    """The rounding of a division by n: 0 where n is a power of two (exact but for underflow, the tiny term)."""
    return 0.0 if n & (n - 1) == 0 else u


def _norm_terms(x64: np.ndarray, eps32: float, centred: bool, rd: Rounding) -> _NormTerms:
    """The forward statistics' errors of the stated order under ``rd`` (mean, centring, variance fold, rsqrt)."""
    u, tiny, n = rd.u, rd.tiny, x64.shape[-1]
    u_n = _div_u(n, u) if rd.div is None else rd.div
    if centred:
        big_s = x64.sum(-1, keepdims=True)
        e_s = _gamma(n - 1, u) * np.abs(x64).sum(-1, keepdims=True) + n * tiny
        e_mu = e_s / n + u_n * (np.abs(big_s) + e_s) / n + tiny
        d = x64 - big_s / n
        e_d = e_mu + u * (np.abs(d) + e_mu)
    else:
        d, e_d = x64, np.zeros_like(x64)
    ad = np.abs(d)
    sq_hi = (ad + e_d) ** 2
    e_sq = e_d * (2 * ad + e_d) + u * sq_hi + tiny
    e_q = e_sq.sum(-1, keepdims=True) + _gamma(n - 1, u) * (sq_hi * (1 + u) + tiny).sum(-1, keepdims=True)
    var = (d * d).sum(-1, keepdims=True) / n
    e_v = e_q / n + u_n * (var + e_q / n) + tiny
    e_w = e_v + u * (var + eps32 + e_v)
    r = 1 / np.sqrt(var + eps32)
    rho = e_w / (var + eps32)
    with np.errstate(all="ignore"):
        # R ((1 - rho)^-1/2 (1 + rsqrt_rel) - 1), as expm1/log1p: no cancellation at u = 2^-53
        grow = np.expm1(-0.5 * np.log1p(-np.minimum(rho, 1 - 2.0**-30)) + np.log1p(rd.rsqrt_rel))
        e_r = np.where(rho < 1, r * grow, np.inf)
    e_xh = e_d * (r + e_r) + ad * e_r + u * (ad + e_d) * (r + e_r) + tiny
    return _NormTerms(d, e_d, r, e_r, d * r, e_xh)


def norm_bound(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float, tol: float = 1.0, rd: Rounding = KERNEL
) -> tuple[np.ndarray, np.ndarray]:
    """(float64 value, per-element bound) of layernorm (b given) or RMSNorm (b None), the contract's derivation
    under the kernel's arithmetic ``rd``."""
    x64, w64 = x.astype(np.float64), np.abs(w.astype(np.float64))
    t = _norm_terms(x64, float(np.float32(eps)), b is not None, rd)
    ad, r, tiny = np.abs(t.d), t.r, KERNEL.tiny
    e_p = w64 * t.e_xh + U * w64 * (ad * r + t.e_xh) + tiny
    value = t.d * r * w.astype(np.float64)
    if b is not None:
        value = value + b.astype(np.float64)
        e_y = e_p + U * (np.abs(value) + e_p)
    else:
        e_y = e_p
    slack = F64_SLACK * (w64 * r * (np.abs(x64) + np.abs(x64).max(-1, keepdims=True)) + np.abs(value))
    return value, tol * (e_y * BOUND_EVAL + slack)


def softmax_backward_error(y: np.ndarray, dy: np.ndarray, mask: np.ndarray | None, rd: Rounding) -> np.ndarray:
    """Per-element bound on |dx_hat - dx| of dx_k = fl(y_k fl(dy_k - dot_hat)), dot_hat the fold of fl(dy y).

    With P = dy y, Q = dy - D, D = sum P over the c allowed entries of the row (equation
    softmax_backward_bound): e_D = sum (u |P| + tiny) + gamma_{c-1} sum (|P| (1 + u) + tiny) (each product
    rounded, then the fold); e_q = e_D + u (|Q| + e_D) (the subtraction); e_dx = |y| e_q + u |y| (|Q| + e_q)
    + tiny (the product). Masked entries are exactly +0 (bound 0).
    """
    y64, g64 = y.astype(np.float64), dy.astype(np.float64)
    ok = np.ones(y.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), y.shape)
    u, tiny = rd.u, rd.tiny
    p = np.where(ok, np.abs(g64 * y64), 0.0)
    e_p = np.where(ok, u * p + tiny, 0.0)
    count = ok.sum(-1, keepdims=True)
    e_dot = e_p.sum(-1, keepdims=True) + _gamma(count - 1, u) * (p + e_p).sum(-1, keepdims=True)
    q = np.abs(g64 - np.where(ok, g64 * y64, 0.0).sum(-1, keepdims=True))
    e_q = e_dot + u * (q + e_dot)
    ay = np.abs(y64)
    return np.where(ok, ay * e_q + u * ay * (q + e_q) + tiny, 0.0)


def norm_backward_error(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, eps: float, centred: bool, rd: Rounding
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-element bounds on |dx_hat - dx|, |dw_hat - dw|, |db_hat - db| of the layernorm (centred) or RMSNorm
    backward in the kernels' order, against the exact gradient of the float32 inputs (equation
    norm_backward_bounds).

    From the forward's e_d, e_r, e_xh (xh_hat = fl(d_hat r_hat), as in the forward) with G = dy w,
    P = G XH, A = sum G / n, C = sum P / n, Z = (G - A) - XH C (RMSNorm: G - XH C), dx = R Z:
    e_g = u |G| + tiny; e_gx = |G| e_xh + e_g |XH| + e_g e_xh; e_p = e_gx + u (|P| + e_gx) + tiny;
    e_C = (sum e_p + gamma_{n-1} sum (|P| + e_p)) / n, plus u_n (|C| + that) + tiny for the division (u_n = 0
    where n is a power of two, else u; e_A the same from e_g and |G|);
    e_t1 = e_g + e_A + u (|G - A| + e_g + e_A) (RMSNorm: e_g);
    e_xc = |XH| e_C + e_xh |C| + e_xh e_C; e_t2 = e_xc + u (|XH C| + e_xc) + tiny;
    e_z = e_t1 + e_t2 + u (|Z| + e_t1 + e_t2); e_rz = R e_z + e_r |Z| + e_r e_z;
    e_dx = e_rz + u (R |Z| + e_rz) + tiny. Columns over the m rows: e_h = |dy| e_xh + u |dy| (|XH| + e_xh)
    + tiny, e_dw = sum e_h + gamma_{m-1} sum (|dy XH| + e_h), e_db = gamma_{m-1} sum |dy|. Where the forward's
    rho >= 1 (the rsqrt unbounded) the bounds are +Inf.
    """
    x64, w64, g64 = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    u, tiny, n = rd.u, rd.tiny, x64.shape[-1]
    t = _norm_terms(x64, float(np.float32(eps)), centred, rd)
    xh, axh = t.xh, np.abs(t.xh)
    big_g = g64 * w64
    ag = np.abs(big_g)
    e_g = u * ag + tiny
    p = big_g * xh
    e_gx = ag * t.e_xh + e_g * axh + e_g * t.e_xh
    e_p = e_gx + u * (np.abs(p) + e_gx) + tiny

    def mean_err(a: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(exact mean of a row, error of fl(fold(a_hat) / n)) for a_hat within e of a."""
        e_sum = (e.sum(-1, keepdims=True) + _gamma(n - 1, u) * (np.abs(a) + e).sum(-1, keepdims=True)) / n
        mean = a.sum(-1, keepdims=True) / n
        return mean, e_sum + _div_u(n, u) * (np.abs(mean) + e_sum) + tiny

    c, e_c = mean_err(p, e_p)
    if centred:
        a, e_a = mean_err(big_g, e_g)
        t1 = big_g - a
        e_t1 = e_g + e_a + u * (np.abs(t1) + e_g + e_a)
    else:
        t1, e_t1 = big_g, e_g
    e_xc = axh * e_c + t.e_xh * np.abs(c) + t.e_xh * e_c
    e_t2 = e_xc + u * (np.abs(xh * c) + e_xc) + tiny
    z = np.abs(t1 - xh * c)
    e_z = e_t1 + e_t2 + u * (z + e_t1 + e_t2)
    e_rz = t.r * e_z + t.e_r * z + t.e_r * e_z
    e_dx = e_rz + u * (t.r * z + e_rz) + tiny
    g2, h2, eh2 = (np.abs(a.reshape(-1, n)) for a in (g64, xh, np.broadcast_to(t.e_xh, x64.shape)))
    rows = g2.shape[0]
    e_h = g2 * eh2 + u * g2 * (h2 + eh2) + tiny
    e_dw = e_h.sum(0) + _gamma(rows - 1, u) * (g2 * h2 + e_h).sum(0)
    e_db = _gamma(rows - 1, u) * g2.sum(0)
    # where the forward's rsqrt has no finite bound (rho >= 1) the derivation is vacuous: +Inf, never NaN (Inf x 0)
    e_dx, e_dw, e_db = (np.where(np.isnan(e), np.inf, e) for e in (e_dx, e_dw, e_db))
    return e_dx, e_dw, e_db


def softmax_backward_bound(
    y: np.ndarray, dy: np.ndarray, mask: np.ndarray | None, tol: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """(float64 dx, per-element bound): tol x (the kernel's derived error + the float64 reference's, at u = 2^-53)."""
    value = ref.softmax_backward_f64(y, dy, mask)
    err = softmax_backward_error(y, dy, mask, KERNEL) + softmax_backward_error(y, dy, mask, REFERENCE)
    return value, tol * err * BOUND_EVAL


def norm_backward_bound(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, eps: float, centred: bool, tol: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """(float64 dx|dw(|db), per-element bound) of the layernorm (centred) or RMSNorm backward, outputs
    concatenated as the kernels return them: tol x (the kernel's derived error + the float64 reference's)."""
    if centred:
        value = ref.layernorm_backward_f64(x, w, dy, eps)
    else:
        value = ref.rmsnorm_backward_f64(x, w, dy, eps)
    errs = [
        k + f
        for k, f in zip(
            norm_backward_error(x, w, dy, eps, centred, KERNEL),
            norm_backward_error(x, w, dy, eps, centred, REFERENCE),
            strict=True,
        )
    ]
    if not centred:
        errs = errs[:2]
    flat = [np.concatenate([a.reshape(-1) for a in parts]) for parts in (value, errs)]
    return flat[0], tol * flat[1] * BOUND_EVAL


# outputs of each backward op, in the order _run concatenates them
_OUTPUTS = {"softmax_bwd": ("dx",), "layernorm_bwd": ("dx", "dw", "db"), "rmsnorm_bwd": ("dx", "dw")}


def _v(u: np.ndarray) -> np.ndarray:
    return u.view(np.float32)


@dataclass(frozen=True)
class _Bound:
    """An op's derived bound: fn(inputs, tol) -> (float64 value, per-element bound), its name, its input mixes."""

    fn: Callable[[_In, float], tuple[np.ndarray, np.ndarray]]
    name: str
    mixes: tuple[str, ...] = ("moderate",)


_SOFTMAX_NAME = "tol x derived (log-)softmax bound: fl(x - m), exp 2 ulp, gamma_{L-1} fold, division (log: 1 ulp logf)"
_BOUNDS: dict[str, _Bound] = {
    "softmax": _Bound(lambda i, tol: softmax_bound(_v(i.x), i.mask, False, tol), _SOFTMAX_NAME),
    "log_softmax": _Bound(lambda i, tol: softmax_bound(_v(i.x), i.mask, True, tol), _SOFTMAX_NAME),
    "log_softmax_bwd": _Bound(
        lambda i, tol: log_softmax_backward_bound(_v(i.x), _v(i.dy), i.mask, tol),
        "tol x (fold gamma_{L-1} sum|dy|, expf 2 ulp, fl(e t), fl(dy - p))",
    ),
    "layernorm": _Bound(
        lambda i, tol: norm_bound(_v(i.x), _v(i.w), _v(i.b), 1e-5, tol),
        "tol x derived layernorm bound: mean, centring, gamma_{n-1} variance fold, rsqrt once, scale, shift",
    ),
    "rmsnorm": _Bound(
        lambda i, tol: norm_bound(_v(i.x), _v(i.w), None, 1e-6, tol),
        "tol x derived RMSNorm bound: gamma_{n-1} square fold, rsqrt rounded once, scale",
    ),
    "softmax_bwd": _Bound(
        lambda i, tol: softmax_backward_bound(_v(i.x), _v(i.dy), i.mask, tol),
        "tol x derived softmax-backward bound (kernel at u = 2^-24 + float64 reference at u = 2^-53): "
        "fl(dy y), gamma_{c-1} fold, fl(dy - dot), fl(y q)",
        BWD_MIXES,
    ),
    "layernorm_bwd": _Bound(
        lambda i, tol: norm_backward_bound(_v(i.x), _v(i.w), _v(i.dy), 1e-5, True, tol),
        "tol x derived layernorm-backward bound (kernel + float64 reference): forward e_d, e_r, e_xh; fl(dy w), "
        "gamma_{n-1} folds of g and g xh, the two means, fl(g - a), fl(xh c), fl(. - .), fl(r z); "
        "dw, db: gamma_{m-1} folds over rows",
        BWD_MIXES,
    ),
    "softmax@triton": _Bound(
        lambda i, tol: softmax_bound(
            _v(i.x), i.mask, False, tol, arg_rounds=tsm.EXP_ARG_ROUNDS, exp_rel=tsm.EXP_REL, div_rel=tsm.DIV_REL
        ),
        "tol x derived softmax bound under Triton's fp32 lowering: exp's argument rounded 3 times, ex2.approx 2^-21, "
        "gamma_{L-1} (any summation order), div.full 2^-22",
    ),
    "rmsnorm@triton": _Bound(
        lambda i, tol: norm_bound(_v(i.x), _v(i.w), None, 1e-6, tol, TRITON),
        "tol x derived RMSNorm bound under Triton's fp32 lowering: gamma_{n-1} square sum (any order, fused or not), "
        "div.full 2^-22 mean, sqrt.approx 2^-22 and div.full rsqrt, scale",
    ),
    "rmsnorm_bwd": _Bound(
        lambda i, tol: norm_backward_bound(_v(i.x), _v(i.w), _v(i.dy), 1e-6, False, tol),
        "tol x derived RMSNorm-backward bound (kernel + float64 reference): forward e_r, e_xh; fl(dy w), "
        "gamma_{n-1} fold of g xh, its mean, fl(xh c), fl(g - .), fl(r z); dw: gamma_{m-1} fold over rows",
        BWD_MIXES,
    ),
}


def _mix_cases(seed: int, mixes: tuple[str, ...]) -> tuple[NormCase, ...]:
    """One explicit case per input mix beyond the first: rows of length 1, masked rows, longer rows in turn."""
    return tuple(NormCase(seed + 16 + k, k, 1 + k % 4, (1, 9, 33)[k % 3], (8, 3)[k % 2]) for k in range(1, len(mixes)))


def _ratio(native_bits: np.ndarray, value: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """|native - value| / bound per element (0 where the bound is 0 or the native value is not finite)."""
    nat = np.asarray(native_bits).reshape(-1).view(np.float32).astype(np.float64)
    value, bound = np.asarray(value, np.float64).reshape(-1), np.asarray(bound, np.float64).reshape(-1)
    ok = np.isfinite(nat) & np.isfinite(bound) & (bound > 0)
    with np.errstate(all="ignore"):
        return np.where(ok, np.abs(nat - value) / np.where(ok, bound, 1), 0.0)


@register_test("norm.error_bound")
def error_bound(ctx: FalsifyContext) -> Outcome:
    """An op forward or backward within tolerance x its derived bound of the float64 (real) value."""
    op = ctx.params.get("op", "softmax")
    name = ctx.params.get("impl", _IMPL[op])
    impl = resolve(name)
    xp = array_module(ctx.device)
    tol = float(ctx.tolerance if ctx.tolerance is not None else 1.0)
    model = ctx.params.get("model")  # the kernel's arithmetic where it is not the CUDA kernels' (e.g. "triton")
    spec = _BOUNDS[f"{op}@{model}" if model else op]
    outputs = _OUTPUTS.get(op, ("y",))
    worst = dict.fromkeys(outputs, 0.0)
    unbounded = [0]

    def reference(i: _In) -> Expected:
        # an infinite bound (masked log-softmax: value -Inf) asks for the same infinity; on a finite value it means
        # the derivation gives no guarantee there: the element need only be finite, and is counted in the evidence
        v, b = spec.fn(i, tol)
        return Expected(value=v, bound=b)

    def observe(j: Judgement) -> None:
        e = j.expected[0]
        unbounded[0] += int(np.count_nonzero(np.isinf(e.bound) & np.isfinite(e.value)))
        r = _ratio(j.native[0], e.value, e.bound)
        for name_k, part in zip(outputs, _split(op, j.inputs, r) if op in _OUTPUTS else [r], strict=True):
            worst[name_k] = max(worst[name_k], float(np.max(part, initial=0.0)))

    def extra() -> dict[str, Any]:
        out: dict[str, Any] = {"worst_error_over_bound": max(worst.values()), "elements_without_bound": unbounded[0]}
        if len(outputs) > 1:
            out["worst_error_over_bound_by_output"] = {k: round(v, 4) for k, v in worst.items()}
        return out

    agreement = engine.item_agreement(ctx, "error_bound", bound_name=spec.name)
    check = _check(
        ctx,
        name,
        lambda i: _run(op, impl, i, xp, ctx.device),
        reference,
        agreement,
        _cases(len(spec.mixes), _masks(ctx)),
        mixes=spec.mixes,
        more=_mix_cases(ctx.seed, spec.mixes),
        observe=observe,
        build={
            "impl": name,
            "op": op,
            "tolerance": tol,
            "exp_ulp": 2,
            "log_ulp": 1,
            "u": "2^-24",
            **({"model": model} if model else {}),
        },
    )
    return engine.run(ctx, check, extra)


TIGHT_PROBLEMS = 64  # short problems per case: each output's worst ratio over them is what the item bounds below


def _tight_problems(seed: int, count: int) -> list[_In]:
    """``count`` short problems (2 or 3 rows of 1..16, moderate magnitudes; softmax y: probabilities every
    other problem): few roundings per element, so the error can come close to the derived bound."""
    rng = np.random.default_rng(seed)
    out = []
    for j in range(count):
        rows, length = 2 + j % 2, int(rng.integers(1, 17))
        c = NormCase(int(rng.integers(0, 2**32 - 1)), 0, rows, length, 8)
        out.append(_inputs(c, ("prob/moderate" if j % 2 else "moderate/moderate",)))
    return out


def _split(op: str, i: _In, flat: np.ndarray) -> list[np.ndarray]:
    rows, length = i.x.shape
    sizes = [rows * length] + [length] * (len(_OUTPUTS[op]) - 1)
    return np.split(np.asarray(flat).reshape(-1), np.cumsum(sizes)[:-1])


@register_test("norm.bound_tight")
def bound_tight(ctx: FalsifyContext) -> Outcome:
    """A backward op's derived bound is tight: every output's worst error over a case's short problems reaches
    at least tolerance x its bound (so a bound loose by more than 1/tolerance is refuted)."""
    op = ctx.params.get("op", "softmax_bwd")
    name = ctx.params.get("impl", _IMPL[op])
    impl = resolve(name)
    xp = array_module(ctx.device)
    tol = float(ctx.tolerance if ctx.tolerance is not None else 0.0)
    count = int(ctx.params.get("problems", TIGHT_PROBLEMS))
    outputs = _OUTPUTS[op]
    seen = {"lowest": [math.inf] * len(outputs), "highest": [0.0] * len(outputs)}

    def native(problems: list[_In]) -> np.ndarray:
        worst = np.zeros(len(outputs))
        for i in problems:
            v, b = _BOUNDS[op].fn(i, 1.0)
            got = _split(op, i, _run(op, impl, i, xp, ctx.device)[0])
            for k, (g, vv, bb) in enumerate(zip(got, _split(op, i, v), _split(op, i, b), strict=True)):
                worst[k] = max(worst[k], float(np.max(_ratio(g, vv, bb), initial=0.0)))
        seen["lowest"] = [min(a, w) for a, w in zip(seen["lowest"], worst, strict=True)]
        seen["highest"] = [max(a, w) for a, w in zip(seen["highest"], worst, strict=True)]
        return worst

    def reference(problems: list[_In]) -> Expected:
        # worst in [tol, 2 - tol] <=> worst >= tol while the bound holds (worst <= 1, the bound item's claim)
        return Expected(value=np.ones(len(outputs)), bound=np.full(len(outputs), 1.0 - tol))

    check = Check(
        name=name,
        inputs=lambda seed: _tight_problems(seed, count),
        native=native,
        reference=reference,
        agreement=engine.item_agreement(
            ctx,
            "error_bound",
            bound_name="tightness: each output's worst |error| / bound >= tol, as |worst - 1| <= 1 - tol",
        ),
        cases=st.integers(0, 2**32 - 1),
        explicit=(ctx.seed,),
        encode=lambda seed: (seed,),
        decode=lambda rp: rp.values[0],
        describe=lambda seed: {"seed": seed, "problems": count, "rows": "2 or 3", "length": "1..16"},
        output_names=(f"worst error/bound of {'|'.join(outputs)}",),
        build={"impl": name, "op": op, "tolerance": tol, "problems_per_case": count, "bound": _BOUNDS[op].name},
    )
    return engine.run(
        ctx,
        check,
        lambda: {
            "outputs": list(outputs),
            "lowest_worst_ratio": [round(a, 4) for a in seen["lowest"]],
            "worst_error_over_bound": [round(a, 4) for a in seen["highest"]],
        },
    )


@register_test("norm.sum_to_one")
def sum_to_one(ctx: FalsifyContext) -> Outcome:
    """Each softmax row with an allowed entry sums to 1 within tolerance x (gamma_L + L 2^-149); empty rows to 0."""
    name = ctx.params.get("impl", _IMPL["softmax"])
    impl = resolve(name)
    xp = array_module(ctx.device)
    tol = float(ctx.tolerance if ctx.tolerance is not None else 1.0)

    def native(i: _In) -> np.ndarray:
        y = np.asarray(
            to_host(impl(_f(xp, i.x), None if i.mask is None else xp.asarray(i.mask), device=ctx.device)), np.float64
        )
        return np.array([math.fsum(r) for r in y])

    def reference(i: _In) -> Expected:
        length = i.x.shape[-1]
        has = np.ones(i.x.shape[0], bool) if i.mask is None else i.mask.any(axis=-1)
        return Expected(
            value=has.astype(np.float64), bound=np.where(has, tol * (_gamma(length) + length * 2.0**-149), 0.0)
        )

    agreement = engine.item_agreement(ctx, "error_bound", bound_name="tol x (gamma_L + L 2^-149)")
    check = _check(
        ctx,
        name,
        native,
        reference,
        agreement,
        _cases(1, _masks(ctx)),
        mixes=("moderate",),
        build={"impl": name, "tolerance": tol, "sum": "math.fsum of the float32 outputs"},
    )
    return engine.run(ctx, check)


@register_test("norm.shift_invariance")
def shift_invariance(ctx: FalsifyContext) -> Outcome:
    """softmax(x + c) has the bits of softmax(x) when x + c is exact for every element."""
    name = ctx.params.get("impl", _IMPL["softmax"])
    impl = resolve(name)
    xp = array_module(ctx.device)

    def inputs(case: tuple[int, int, int, int]) -> tuple[np.ndarray, np.ndarray]:
        seed, rows, length, shift = case
        rng = np.random.default_rng(seed)
        x = (rng.integers(-2048, 2049, (rows, length)) * 2.0**-8).astype(np.float32)  # 21 significant bits at most
        c = np.float32(shift * 2.0**-8)
        xs = (x + c).astype(np.float32)
        assert np.array_equal(xs.astype(np.float64), x.astype(np.float64) + float(c))  # the shift is exact
        return x, xs

    def native(p: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        return _hb(impl(xp.asarray(p[1]), None, device=ctx.device))

    def reference(p: tuple[np.ndarray, np.ndarray]) -> Expected:
        return Expected(bits=_hb(impl(xp.asarray(p[0]), None, device=ctx.device)))

    check = Check(
        name=name,
        inputs=inputs,
        native=native,
        reference=reference,
        agreement=engine.item_agreement(ctx, "bitwise"),
        cases=st.tuples(
            st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(1, 40), st.integers(-(1 << 20), 1 << 20)
        ),
        explicit=((ctx.seed, 2, 16, 1 << 20), (ctx.seed + 1, 1, 1, -3)),
        encode=lambda c: c,
        decode=lambda rp: tuple(rp.values[:4]),
        describe=lambda c: dict(zip(("seed", "rows", "length", "shift_256ths"), c, strict=True)),
        build={"impl": name, "inputs": "k / 256, |k| <= 2048; shift j / 256, |j| <= 2^20 (exact)"},
    )
    return engine.run(ctx, check)


# -- batchnorm (eval), MK-64 -------------------------------------------------------------------------------------

_BN_FIELDS = ("seed", "mix", "n", "c", "hw")


def _bn_inputs(case: tuple) -> tuple[np.ndarray, ...]:
    seed, mix, n, c, hw = case
    x = _bits(seed, n * c * hw, MIX_NAMES[mix]).reshape(n, c, hw)
    mean, w, b = (_bits(seed + k, c, "moderate") for k in (1, 2, 3))
    var = (np.abs(_bits(seed + 4, c, "moderate").view(np.float32))).astype(np.float32).view(np.uint32)
    if c > 1:  # one channel of variance -0 (rsqrt(eps)) and, under the NaN-bearing mixes, the input's own bits
        var[0] = 0x80000000
    return x, mean, var, w, b


@register_test("norm.batchnorm_eval_bitwise")
def batchnorm_eval_bitwise(ctx: FalsifyContext) -> Outcome:
    """Eval-mode batchnorm (N, C, H*W) bitwise equal to spec.norm.batchnorm_eval on any input bits."""
    xp = array_module(ctx.device)
    check = Check(
        name="batchnorm_eval",
        inputs=_bn_inputs,
        native=lambda a: _hb(native_norm.batchnorm_eval(*(_f(xp, v) for v in a), device=ctx.device)).reshape(-1),
        reference=lambda a: Expected(bits=np.asarray(ref.batchnorm_eval(*a), np.uint32).reshape(-1)),
        agreement=engine.item_agreement(ctx, "bitwise"),
        cases=st.tuples(
            st.integers(0, 2**32 - 1),
            st.integers(0, len(MIX_NAMES) - 1),
            st.integers(0, 3),
            st.integers(1, 6),
            st.integers(0, 9 * ctx.budget.scale),
        ),
        encode=lambda c: c,
        decode=lambda rp: tuple(rp.values[:5]),
        describe=lambda c: dict(zip(_BN_FIELDS, c, strict=True)),
        build={"reference": "spec.norm.batchnorm_eval (softfloat, env cuda; rsqrt float64 rounded once)"},
    )
    return engine.run(ctx, check)
