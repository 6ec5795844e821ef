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
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from falsification import engine
from falsification.agreement import Expected
from falsification.engine import Check, Judgement
from falsification.float32_inputs import MIXES, BatchSpec, generate_bits
from falsification.registry import FalsifyContext, register_test
from obligations.core.device import array_module, to_host
from obligations.core.plans import resolve
from obligations.core.results import Outcome, skipped
from spec import norm as ref

__all__ = ["NormCase", "MIX_NAMES", "HOST_ONLY"]

U = 2.0**-24
MIX_NAMES: tuple[str, ...] = ("moderate", "narrow", *sorted(MIXES))
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


def _cases(mixes: int) -> st.SearchStrategy[NormCase]:
    return st.builds(
        NormCase,
        st.integers(0, 2**32 - 1),
        st.integers(0, mixes - 1),
        st.integers(1, 6),
        st.integers(1, 40),
        st.integers(0, 8),
    )


def _bits(seed: int, n: int, mix: str, scale: int = 6) -> np.ndarray:
    if mix in ("moderate", "narrow"):  # narrow: |x| <= 1, so every exp of a row counts in its sum
        scale = 0 if mix == "narrow" else scale
        rng = np.random.default_rng(seed)
        return (rng.uniform(-1, 1, n) * np.exp2(rng.integers(-scale, scale + 1, n))).astype(np.float32).view(np.uint32)
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
    mix = mixes[c.mix]
    return _In(
        c,
        _bits(c.seed, n, mix).reshape(shape),
        _bits(c.seed + 1, n, "moderate").reshape(shape),
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
    **kw: Any,
) -> Check:
    return Check(
        name=name,
        inputs=lambda c: _inputs(c, mixes),
        native=native,
        reference=reference,
        agreement=agreement,
        cases=cases,
        explicit=(
            NormCase(ctx.seed, 0, 3, 17, 5),
            NormCase(ctx.seed + 1, 0, 1, 1, 8),
            NormCase(ctx.seed + 2, min(1, len(mixes) - 1), 2, 40, 8),
            NormCase(ctx.seed + 3, min(1, len(mixes) - 1), 3, 23, 6),
        ),
        encode=lambda c: c.ints(),
        decode=lambda rp: NormCase(*rp.values[:5]),
        describe=lambda c: {
            "seed": c.seed,
            "mix": mixes[c.mix],
            "rows": c.rows,
            "length": c.length,
            "mask_density_eighths": c.density,
        },
        **kw,
    )


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


def _gamma(k: int) -> float:
    return k * U / (1 - k * U) if k > 0 else 0.0


def softmax_bound(x: np.ndarray, mask: np.ndarray | None, log: bool, tol: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(float64 value, per-element bound) of (log-)softmax for float32 inputs: the contract's derived bound."""
    x64 = x.astype(np.float64)
    ok = np.ones(x.shape, bool) if mask is None else mask
    y = ref.softmax_f64(x64, ok)
    length = x.shape[-1]
    m = np.max(np.where(ok, x64, -np.inf), axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        t = np.where(ok, np.abs(x64 - np.where(np.isfinite(m), m, 0.0)), 0.0)
    a = np.expm1(U * t * (1 + 2 * U)) * (1 + 4 * U) + 4 * U  # relative error of each exp(fl(x - m))
    amax = np.max(np.where(ok, a, 0.0), axis=-1, keepdims=True)
    g = _gamma(length - 1)
    ssub = length * 2.0**-148  # subnormal exp results: 2 ulp absolute each, against s >= 1
    hi = (1 + amax) * (1 + g) + ssub
    lo = (1 - amax) * (1 - g) - ssub
    if not log:
        up = (1 + a) * (1 + U) / lo - 1
        down = 1 - (1 - a) * (1 - U) / hi
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
    value = g - e * t
    bound = p_err + U * (np.abs(value) + p_err) + F64_SLACK * (np.abs(g) + e * np.abs(t))
    return np.where(ok, value, 0.0), np.where(ok, tol * bound * (1 + 2.0**-30), 0.0)


def norm_bound(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float, tol: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """(float64 value, per-element bound) of layernorm (b given) or RMSNorm (b None), the contract's derivation."""
    x64, w64 = x.astype(np.float64), np.abs(w.astype(np.float64))
    n = x.shape[-1]
    eps32 = float(np.float32(eps))
    tiny = 2.0**-150
    if b is not None:
        big_s = x64.sum(-1, keepdims=True)
        e_s = _gamma(n - 1) * np.abs(x64).sum(-1, keepdims=True) + n * tiny
        e_mu = e_s / n + U * (np.abs(big_s) + e_s) / n + tiny
        d = x64 - big_s / n
        e_d = e_mu + U * (np.abs(d) + e_mu)
    else:
        d, e_d = x64, np.zeros_like(x64)
    ad = np.abs(d)
    sq_hi = (ad + e_d) ** 2
    e_sq = e_d * (2 * ad + e_d) + U * sq_hi + tiny
    e_q = e_sq.sum(-1, keepdims=True) + _gamma(n - 1) * (sq_hi * (1 + U) + tiny).sum(-1, keepdims=True)
    var = (d * d).sum(-1, keepdims=True) / n
    e_v = e_q / n + U * (var + e_q / n) + tiny
    e_w = e_v + U * (var + eps32 + e_v)
    r = 1 / np.sqrt(var + eps32)
    rho = e_w / (var + eps32)
    with np.errstate(all="ignore"):
        e_r = np.where(rho < 1, r * ((1 - np.minimum(rho, 1 - 2.0**-30)) ** -0.5 * (1 + U + 2.0**-50) - 1), np.inf)
    e_xh = e_d * (r + e_r) + ad * e_r + U * (ad + e_d) * (r + e_r) + tiny
    e_p = w64 * e_xh + U * w64 * (ad * r + e_xh) + tiny
    value = d * r * w.astype(np.float64)
    if b is not None:
        value = value + b.astype(np.float64)
        e_y = e_p + U * (np.abs(value) + e_p)
    else:
        e_y = e_p
    slack = F64_SLACK * (w64 * r * (np.abs(x64) + np.abs(x64).max(-1, keepdims=True)) + np.abs(value))
    return value, tol * (e_y * (1 + 2.0**-30) + slack)


_BOUND_NAMES = {
    "softmax": "tol x derived (log-)softmax bound: fl(x - m), exp 2 ulp, gamma_{L-1} fold, division (log: 1 ulp logf)",
    "log_softmax_bwd": "tol x (fold gamma_{L-1} sum|dy|, expf 2 ulp, fl(e t), fl(dy - p))",
    "layernorm": "tol x derived layernorm bound: mean, centring, gamma_{n-1} variance fold, rsqrt once, scale, shift",
    "rmsnorm": "tol x derived RMSNorm bound: gamma_{n-1} square fold, rsqrt rounded once, scale",
}


@register_test("norm.error_bound")
def error_bound(ctx: FalsifyContext) -> Outcome:
    """(Log-)softmax, the log-softmax backward, layernorm or RMSNorm within tolerance x its derived float64 bound."""
    op = ctx.params.get("op", "softmax")
    name = ctx.params.get("impl", _IMPL[op])
    impl = resolve(name)
    xp = array_module(ctx.device)
    tol = float(ctx.tolerance if ctx.tolerance is not None else 1.0)
    worst = {"ratio": 0.0}

    def reference(i: _In) -> Expected:
        x = i.x.view(np.float32)
        if op == "log_softmax_bwd":
            v, b = log_softmax_backward_bound(x, i.dy.view(np.float32), i.mask, tol)
        elif op == "layernorm":
            v, b = norm_bound(x, i.w.view(np.float32), i.b.view(np.float32), 1e-5, tol)
        elif op == "rmsnorm":
            v, b = norm_bound(x, i.w.view(np.float32), None, 1e-6, tol)
        else:
            v, b = softmax_bound(x, i.mask, op == "log_softmax", tol)
        return Expected(value=v, bound=np.where(np.isinf(b), 0.0, b))

    def observe(j: Judgement) -> None:
        e = j.expected[0]
        nat = np.asarray(j.native[0]).view(np.float32).astype(np.float64)
        with np.errstate(all="ignore"):
            r = np.where(np.isfinite(nat) & (e.bound > 0), np.abs(nat - e.value) / e.bound, 0.0)
        worst["ratio"] = max(worst["ratio"], float(np.max(r, initial=0.0)))

    agreement = engine.item_agreement(ctx, "error_bound", bound_name=_BOUND_NAMES.get(op, _BOUND_NAMES["softmax"]))
    check = _check(
        ctx,
        name,
        lambda i: _run(op, impl, i, xp, ctx.device),
        reference,
        agreement,
        _cases(1),
        mixes=("moderate",),
        observe=observe,
        build={"impl": name, "op": op, "tolerance": tol, "exp_ulp": 2, "log_ulp": 1, "u": "2^-24"},
    )
    return engine.run(ctx, check, lambda: {"worst_error_over_bound": worst["ratio"]})


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
        _cases(1),
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
