"""The PyTorch op audit (contracts/torch-ops-v1.yaml, ``kc audit-torch``): torch's kernels against our specs.

For every (op, backend) of :data:`spec.torch.OPS` the audit runs a fixed, seeded set of cases -- regime witnesses
(shapes at tile and split edges, masks, GQA, long reductions) under the magnitude mixes of the engine's norm
tests, plus special values from the engine's table (:data:`falsification.float32_inputs.SPECIALS`: NaN, +-Inf,
subnormals; masked rows and -inf scores for attention) -- and judges each output element twice:

* **NaN/Inf handling**: its class (finite, NaN, +Inf, -Inf) against the class of the spec's value
  (``spec.norm``/``spec.reductions`` softfloat where the spec is binary32, the float64 reference elsewhere);
* **error / bound**: where both are finite, ``|got - ref| / bound`` with ``bound`` the existing derived bound of
  the op's family (:data:`spec.torch.BOUND_SOURCES`); above 1 is a finding.

Each case runs three times: bitwise equal reruns or not is the determinism column. :func:`verdict` turns the
summary into the item's status: passed (every judged element within its bound, classes as the spec, bitwise
reruns), violated (a finding, each named), skipped with claim ``assumed`` (no derived bound: measured only,
never a pass), skipped (torch or the backend absent), error (the audit itself failed).

Registered tests: ``torch.audit`` {op, backend} (cuda), ``torch.table`` (host: the contract's items are the table),
``torch.inductor`` (cuda: the fusion decoder block's steps compiled by Inductor against the IR denotation).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from falsification import engine
from falsification.float32_inputs import SPECIALS
from falsification.registry import FalsifyContext, guarded, register_test
from obligations.core.results import Outcome, error, passed, skipped, violated
from spec import torch as sto

__all__ = [
    "Case",
    "cases_for",
    "judge_case",
    "summarise",
    "verdict",
    "audit_backend",
    "classes",
    "CLASS_NAMES",
    "inductor_check",
    "INDUCTOR_SHAPE",
]

U32 = 2.0**-24
U64 = 2.0**-53
CLASS_NAMES = ("finite", "NaN", "+Inf", "-Inf")


@dataclass(frozen=True)
class Case:
    """One audited call: a regime name, the op's arguments (NumPy arrays in storage values, scalars), the
    reference value (float64, NaN/Inf as the spec says) and the per-element bound (NaN where none is derived)."""

    name: str
    args: Mapping[str, Any]
    describe: Mapping[str, Any]
    reference: Callable[[], tuple[np.ndarray, np.ndarray]] = field(compare=False, repr=False)


# -- values ---------------------------------------------------------------------------------------------------

# magnitudes as falsification.norm_tests' mixes: uniform(-1, 1) * 2^e, e uniform in [lo, hi]
_SCALES32: dict[str, tuple[int, int]] = {
    "narrow": (0, 0),
    "moderate": (-6, 6),
    "wide": (-30, 30),
    "tiny": (-140, -120),
}
_SCALES16: dict[str, tuple[int, int]] = {"narrow": (0, 0), "moderate": (-4, 4), "wide": (-10, 6), "tiny": (-24, -16)}


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (RNE), as float32."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & ~np.uint64(0xFFFF)).astype(np.uint32)
    return np.where(np.isfinite(x), r.view(np.float32), x).astype(np.float32)


def storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 array of ``x`` rounded to the storage format."""
    x = np.asarray(x, np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return _round_bf16(x)
    return x


def values(seed: int, shape: tuple[int, ...], mix: str, dtype: str) -> np.ndarray:
    """Seeded values of a magnitude mix (or ``cancel``: pairs x, -x plus small noise) in the storage format."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64))
    scales = _SCALES32 if dtype == "float32" else _SCALES16
    if mix == "cancel":
        half = rng.uniform(-1, 1, (n + 1) // 2)
        x = np.concatenate([half, -half])[:n] + rng.uniform(-1, 1, n) * 2.0**-12
        x = x[rng.permutation(n)]
    else:
        lo, hi = scales[mix]
        x = rng.uniform(-1, 1, n) * np.exp2(rng.integers(lo, hi + 1, n))
    return storage(x.reshape(shape).astype(np.float32), dtype)


_SPECIAL_NAMES = ("qnan", "+inf", "-inf", "min_subnormal", "-max_subnormal", "-0")


def with_specials(x: np.ndarray, seed: int, count: int = 6) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """``x`` with the engine's special values (:data:`SPECIALS`) written at seeded positions, and where."""
    rng = np.random.default_rng(seed ^ 0x5BEC)
    y = np.array(x, np.float32).reshape(-1)
    placed = []
    for k, pos in enumerate(rng.choice(y.size, size=min(count, y.size), replace=False)):
        name = _SPECIAL_NAMES[k % len(_SPECIAL_NAMES)]
        y[pos] = np.uint32(SPECIALS[name]).view(np.float32)
        placed.append({"index": int(pos), "value": name})
    return y.reshape(np.shape(x)), placed


def classes(a: np.ndarray) -> np.ndarray:
    """0 finite, 1 NaN, 2 +Inf, 3 -Inf, per element."""
    a = np.asarray(a, np.float64)
    return np.where(np.isnan(a), 1, np.where(a == np.inf, 2, np.where(a == -np.inf, 3, 0))).astype(np.int8)


def _bits_f(u: np.ndarray) -> np.ndarray:
    return np.asarray(u, np.uint32).view(np.float32).astype(np.float64)


# -- references and bounds per op ------------------------------------------------------------------------------


def _gemm_ref(a: np.ndarray, b: np.ndarray, out: str, tf32: bool) -> tuple[np.ndarray, np.ndarray]:
    from spec import gemm as sg

    value = sg.reference(a, b, False, False)
    with np.errstate(all="ignore"):
        bound = sg.error_bound(a, b, False, False, 1.0, 0.0, None, value, out)
        if tf32:
            bound = _tf32_allowed(bound, np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    return value, bound


# One operand's relative error when it is read as TF32 (10 explicit mantissa bits): 2^-11 rounded to nearest,
# 2^-10 truncated; a kernel that keeps float32 has none.
U_TF32_READ = 2.0**-10


def _tf32_allowed(bound: np.ndarray, mag: np.ndarray) -> np.ndarray:
    """The float32 bound about the exact product widened for TF32 reads (allow_tf32 permits, never requires them).

    Each product a_i b_i read as TF32 is a_i b_i (1 + d1)(1 + d2) with |d| <= U_TF32_READ: it moves by at most
    (2u + u^2)|a_i||b_i|, and the accumulation bound grows by (1 + u)^2 with the magnitudes. A float32 kernel,
    TF32 rounded to nearest and TF32 truncated all lie within it (cuBLAS picks a float32 kernel for some shapes:
    a 1x1x1 product under allow_tf32 was 1.7e3 x the bound of the rounded-to-nearest model on an H200).
    """
    u = U_TF32_READ
    return bound * (1 + u) ** 2 + (2 * u + u * u) * mag


def _conv_ref(args: Mapping[str, Any], tf32: bool) -> tuple[np.ndarray, np.ndarray]:
    from spec import conv as sc
    from spec import gemm as sg

    x, w, b = args["x"], args["w"], args["bias"]
    st, pd, dl, groups = args["stride"], args["padding"], args["dilation"], args["groups"]
    value, _ = sc.conv_f64(x, w, b, st, pd, dl, groups)
    cols = sc.im2col(np.ascontiguousarray(x).view(np.uint32), w.shape[2:], st, pd, dl, groups).view(np.float32)
    co, cout_g = w.shape[0], w.shape[0] // groups
    n, p = x.shape[0], int(np.prod(value.shape[2:]))
    bound = np.empty((n, co, p))
    ex = value.reshape(n, co, p)
    for g in range(groups):
        w2 = w[g * cout_g : (g + 1) * cout_g].reshape(cout_g, -1)
        bg = b[g * cout_g : (g + 1) * cout_g]
        c0 = np.broadcast_to(bg.reshape(-1, 1), (cout_g, n * p))
        e = ex[:, g * cout_g : (g + 1) * cout_g].transpose(1, 0, 2).reshape(cout_g, n * p)
        with np.errstate(all="ignore"):
            bd = sg.error_bound(w2, cols[g], False, False, 1.0, 1.0, c0, e, "float32")
            if tf32:  # the im2col product's operands may be read as TF32; the bias is added in float32
                bd = _tf32_allowed(bd, np.abs(w2.astype(np.float64)) @ np.abs(cols[g].astype(np.float64)))
        bound[:, g * cout_g : (g + 1) * cout_g] = bd.reshape(cout_g, n, p).transpose(1, 0, 2)
    return value, bound.reshape(value.shape)


def _sdpa_ref(args: Mapping[str, Any], dtype: str) -> tuple[np.ndarray, np.ndarray]:
    from spec import attention as sa

    q, k, v = args["q"], args["k"], args["v"]
    lk = k.shape[2]
    tc = dtype == "float16"
    with np.errstate(all="ignore"):
        value, bound = sa.forward_bound(
            q,
            k,
            v,
            causal=bool(args.get("causal")),
            kv_lens=args.get("kv_lens"),
            scale=args.get("scale"),
            tiles=max(-(-lk // 16), 1),
            tile_keys=16,
            u_out=sa.U16 if tc else sa.U32,
            tensor_core=tc,
        )
    return value, bound


def _norm_ref(op: str, args: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    from falsification.norm_tests import norm_bound, softmax_bound
    from spec import norm as sn

    x = args["x"]
    xb = np.ascontiguousarray(x).view(np.uint32)
    finite = np.broadcast_to(np.isfinite(x).all(-1, keepdims=True), x.shape)
    xs = np.where(finite, x, 0).astype(np.float32)  # rows with a special value: judged by class only, no bound
    with np.errstate(all="ignore"):
        if op in ("softmax", "log_softmax"):
            value, bound = softmax_bound(xs, None, op == "log_softmax")
            spec_bits = (sn.softmax if op == "softmax" else sn.log_softmax)(xb)
        elif op == "layer_norm":
            value, bound = norm_bound(xs, args["w"], args["b"], args["eps"])
            wb, bb = (np.ascontiguousarray(args[k]).view(np.uint32) for k in ("w", "b"))
            spec_bits = sn.layernorm(xb, wb, bb, args["eps"])
        else:
            value, bound = norm_bound(xs, args["w"], None, args["eps"])
            spec_bits = sn.rmsnorm(xb, np.ascontiguousarray(args["w"]).view(np.uint32), args["eps"])
    # the real value where the row is finite; elsewhere the spec's own (softfloat) value, whose class is judged
    return np.where(finite, value, _bits_f(spec_bits)), np.where(finite, bound, np.nan)


def _log_softmax64(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    m = x64.max(-1, keepdims=True)
    return x64 - m - np.log(np.exp(x64 - m).sum(-1, keepdims=True))


def _sum_ref(op: str, args: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    from spec import reductions as sr

    x = args["x"]
    x64 = x.astype(np.float64)
    n = x.shape[-1]
    finite = np.isfinite(x).all(-1, keepdims=True)
    xs = np.where(finite, x64, 0.0)
    with np.errstate(all="ignore"):
        if op == "sum":
            exact = np.array([math.fsum(r) for r in xs.reshape(-1, n)]).reshape(x.shape[:-1])
            bound = sr.gamma(max(n - 1, 0)) * np.abs(xs).sum(-1) + U64 * np.abs(exact)
            cls = _bits_f(sr.fold_left(np.ascontiguousarray(x).view(np.uint32), route="auto"))
            fin = finite[..., 0]
        else:
            exact = np.cumsum(xs, -1)
            idx = np.arange(n, dtype=np.float64)
            mag = np.cumsum(np.abs(xs), -1)
            g = idx * U32 / (1 - idx * U32)
            bound = g * mag + (idx + 1) * U64 / (1 - (idx + 1) * U64) * mag
            cls = np.cumsum(x64, -1)  # IEEE float64 prefixes: the classes of any order of binary32 prefixes
            fin = np.broadcast_to(finite, x.shape)
    return np.where(fin, exact, cls), np.where(fin, bound, np.nan)


# -- cases ---------------------------------------------------------------------------------------------------


def _case(name: str, args: dict[str, Any], describe: dict[str, Any], ref: Callable[[], tuple]) -> Case:
    return Case(name, args, describe, ref)


def _matmul_cases(b: sto.Backend, seed: int) -> list[Case]:
    shapes = [(1, 1, 1), (7, 13, 5), (64, 64, 64), (33, 257, 65), (96, 2048, 80)]
    mixes = ["moderate", "narrow", "cancel", "wide", "tiny"]
    out = []
    tf32 = b.bound == "gemm-tf32"
    for i, (m, k, n) in enumerate(shapes):
        for mix in (mixes[i], "moderate") if mixes[i] != "moderate" else ("moderate",):
            s = seed * 1000 + i * 10 + len(out)
            a, bb = values(s, (m, k), mix, b.dtype), values(s + 1, (k, n), "moderate", b.dtype)
            out.append(_matmul_case(f"{m}x{k}x{n} {mix}", a, bb, b.dtype, tf32, {"m": m, "k": k, "n": n, "mix": mix}))
    a = values(seed + 77, (16, 64), "moderate", b.dtype)
    a, placed = with_specials(a, seed)
    if b.dtype != "float32":
        a = np.where(np.isfinite(a) & (np.abs(a) < 2.0**-24), 0.0, a).astype(np.float32)  # no float32-only specials
    bb = values(seed + 78, (64, 24), "moderate", b.dtype)
    out.append(_matmul_case("16x64x24 specials", a, bb, b.dtype, tf32, {"specials_in_a": placed}))
    return out


def _matmul_case(name: str, a: np.ndarray, b: np.ndarray, dtype: str, tf32: bool, d: dict) -> Case:
    return _case(name, {"a": a, "b": b}, d, lambda: _gemm_ref(a, b, dtype, tf32))


def _conv_cases(b: sto.Backend, seed: int) -> list[Case]:
    # (N, C, H, W, Co, kh, kw, stride, padding, dilation, groups): 1x1, 3x3 (Winograd's shape), strided 5x5,
    # dilated, grouped, depthwise, many channels (k = 576)
    cfgs = [
        (2, 8, 9, 9, 16, 1, 1, 1, 0, 1, 1),
        (2, 16, 16, 16, 16, 3, 3, 1, 1, 1, 1),
        (1, 4, 17, 13, 8, 5, 5, 2, 2, 1, 1),
        (1, 8, 15, 15, 8, 3, 3, 1, 2, 2, 1),
        (2, 8, 10, 10, 8, 3, 3, 1, 1, 1, 2),
        (1, 16, 12, 12, 16, 3, 3, 1, 1, 1, 16),
        (1, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1),
    ]
    mixes = ["moderate", "cancel", "moderate", "wide", "narrow", "moderate", "moderate"]
    tf32 = b.bound == "conv-gemm-tf32"
    out = []
    for i, (n, c, h, w_, co, kh, kw, st, pd, dl, g) in enumerate(cfgs):
        s = seed * 1000 + i * 10
        x = values(s, (n, c, h, w_), mixes[i], "float32")
        w = values(s + 1, (co, c // g, kh, kw), "moderate", "float32")
        bias = values(s + 2, (co,), "moderate", "float32")
        d = {"x": [n, c, h, w_], "w": [co, c // g, kh, kw], "stride": st, "padding": pd, "dilation": dl, "groups": g}
        out.append(_conv_case(f"{kh}x{kw} s{st} p{pd} d{dl} g{g} {mixes[i]}", x, w, bias, (st, pd, dl, g), tf32, d))
    x = values(seed + 91, (1, 4, 8, 8), "moderate", "float32")
    x, placed = with_specials(x, seed)
    w = values(seed + 92, (4, 4, 3, 3), "moderate", "float32")
    bias = values(seed + 93, (4,), "moderate", "float32")
    out.append(_conv_case("3x3 specials", x, w, bias, (1, 1, 1, 1), tf32, {"specials_in_x": placed}))
    return out


def _conv_case(name: str, x, w, bias, geo: tuple, tf32: bool, d: dict) -> Case:  # noqa: ANN001
    st, pd, dl, g = geo
    args = {"x": x, "w": w, "bias": bias, "stride": st, "padding": pd, "dilation": dl, "groups": g}
    return _case(name, args, d, lambda: _conv_ref(args, tf32))


def _sdpa_cases(b: sto.Backend, seed: int) -> list[Case]:
    # (B, Hq, Hkv, Lq, Lk, D, causal, kv_lens, mask form, q scale): plain, tile edges, decode (Lq 1), causal
    # (square and Lq < Lk: torch's top-left alignment), key padding (bool and -inf float masks), fully masked
    # rows (a batch with kv_len 0), GQA, head dim 128, peaky scores
    cfgs = [
        ("plain", 1, 2, 2, 64, 64, 64, False, None, None, 1.0),
        ("tile edges", 1, 2, 2, 33, 77, 64, False, None, None, 1.0),
        ("decode", 2, 4, 4, 1, 130, 64, False, None, None, 1.0),
        ("causal", 1, 2, 2, 64, 64, 64, True, None, None, 1.0),
        ("causal Lq<Lk", 1, 2, 2, 17, 80, 32, True, None, None, 1.0),
        ("key padding", 2, 2, 2, 40, 64, 64, False, [37, 64], "bool", 1.0),
        ("-inf scores", 2, 2, 2, 40, 64, 64, False, [19, 50], "float", 1.0),
        ("fully masked rows", 2, 2, 2, 24, 48, 64, False, [0, 30], "bool", 1.0),
        ("fully masked, -inf", 2, 2, 2, 24, 48, 64, False, [30, 0], "float", 1.0),
        ("gqa", 1, 8, 2, 48, 48, 64, False, None, None, 1.0),
        ("gqa causal", 1, 6, 2, 32, 32, 64, True, None, None, 1.0),
        ("head dim 128", 1, 2, 2, 48, 96, 128, False, None, None, 1.0),
        ("peaky", 1, 2, 2, 64, 64, 64, False, None, None, 4.0),
    ]
    out = []
    for i, (name, bsz, hq, hkv, lq, lk, d, causal, lens, form, qs) in enumerate(cfgs):
        s = seed * 1000 + i * 10
        q = storage(values(s, (bsz, hq, lq, d), "narrow", "float32") * qs, b.dtype)
        k = values(s + 1, (bsz, hkv, lk, d), "narrow", b.dtype)
        v = values(s + 2, (bsz, hkv, lk, d), "moderate", b.dtype)
        args: dict[str, Any] = {"q": q, "k": k, "v": v, "causal": causal, "gqa": hq != hkv}
        if lens is not None:
            ok = np.arange(lk)[None, None, None, :] < np.asarray(lens)[:, None, None, None]
            ok = np.broadcast_to(ok, (bsz, 1, lq, lk))
            args["mask"] = ok.copy() if form == "bool" else np.where(ok, 0.0, -np.inf).astype(np.float32)
            args["kv_lens"] = np.asarray(lens)
        desc = {"B": bsz, "Hq": hq, "Hkv": hkv, "Lq": lq, "Lk": lk, "D": d, "causal": causal}
        if lens is not None:
            desc.update(kv_lens=list(lens), mask=form)
        out.append(_sdpa_case(name, args, b.dtype, desc))
    return out


def _sdpa_case(name: str, args: dict, dtype: str, d: dict) -> Case:
    return _case(name, args, d, lambda: _sdpa_ref(args, dtype))


def _row_cases(op: str, b: sto.Backend, seed: int) -> list[Case]:
    # (rows, length, mix): one element, odd lengths, a warp, a block's worth, long rows (multi-block reductions)
    cfgs = [(3, 1, "moderate"), (4, 7, "moderate"), (8, 32, "narrow"), (6, 1000, "moderate"), (4, 4096, "wide")]
    cfgs += [(5, 333, "cancel"), (4, 256, "tiny")]
    if op in ("softmax", "log_softmax"):
        cfgs += [(4, 64, "large")]
    out = []
    for i, (rows, n, mix) in enumerate(cfgs):
        s = seed * 1000 + i * 10
        x = values(s, (rows, n), mix, "float32") if mix != "large" else _large(s, rows, n)
        out.append(_row_case(op, f"{rows}x{n} {mix}", x, s, {"rows": rows, "length": n, "mix": mix}))
    x = values(seed + 55, (8, 24), "moderate", "float32")
    x, placed = with_specials(x, seed, count=8)
    if op in ("softmax", "log_softmax"):
        x[5] = -np.inf  # a row of -inf scores only (spec: NaN, as 0/0)
        x[6, :12] = -np.inf  # half -inf
        placed.append({"rows": [5, 6], "value": "-inf rows"})
    out.append(_row_case(op, "specials", x, seed + 55, {"specials": placed}))
    return out


def _large(seed: int, rows: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (rows, n)) * 2.0**20).astype(np.float32)


def _row_case(op: str, name: str, x: np.ndarray, s: int, d: dict) -> Case:
    args: dict[str, Any] = {"x": x}
    if op in ("layer_norm", "rms_norm"):
        n = x.shape[-1]
        args["w"] = values(s + 1, (n,), "moderate", "float32")
        args["eps"] = 1e-5 if op == "layer_norm" else 1e-6
        if op == "layer_norm":
            args["b"] = values(s + 2, (n,), "moderate", "float32")
        return _case(name, args, d, lambda: _norm_ref(op, args))
    if op in ("softmax", "log_softmax"):
        return _case(name, args, d, lambda: _norm_ref(op, args))
    return _case(name, args, d, lambda: _sum_ref(op, args))


def cases_for(op: str, backend: sto.Backend, seed: int = 0) -> list[Case]:
    """The audit's cases of one (op, backend), deterministic in ``seed``."""
    if op == "matmul":
        return _matmul_cases(backend, seed)
    if op == "conv2d":
        return _conv_cases(backend, seed)
    if op == "sdpa":
        return _sdpa_cases(backend, seed)
    return _row_cases(op, backend, seed)


# -- judging ---------------------------------------------------------------------------------------------------


def judge_case(got: np.ndarray, value: np.ndarray, bound: np.ndarray) -> dict[str, Any]:
    """Classes against the spec's, and the worst |got - ref| / bound over elements both finite with a bound."""
    got = np.asarray(got, np.float64).reshape(np.shape(value))
    value = np.asarray(value, np.float64)
    bound = np.asarray(bound, np.float64)
    cg, cv = classes(got), classes(value)
    mism = np.flatnonzero((cg != cv).reshape(-1))
    out: dict[str, Any] = {"elements": int(value.size), "class_mismatches": int(mism.size)}
    if mism.size:
        i = int(mism[0])
        out["first_mismatch"] = {
            "index": [int(j) for j in np.unravel_index(i, value.shape)],
            "got": CLASS_NAMES[int(cg.reshape(-1)[i])],
            "spec": CLASS_NAMES[int(cv.reshape(-1)[i])],
        }
        pairs = sorted(
            {
                f"{CLASS_NAMES[int(a)]} where the spec has {CLASS_NAMES[int(b)]}"
                for a, b in zip(cg.reshape(-1)[mism], cv.reshape(-1)[mism], strict=True)
            }
        )
        out["mismatch_kinds"] = pairs
    judged = (cg == 0) & (cv == 0) & np.isfinite(bound)
    out["judged"] = int(judged.sum())
    out["specials"] = int((cv != 0).sum())
    if out["judged"]:
        with np.errstate(all="ignore"):
            err = np.abs(got - value)
            ratio = np.where(judged, np.where(bound > 0, err / bound, np.where(err > 0, np.inf, 0.0)), -1.0)
        i = int(np.argmax(ratio))
        out["worst"] = {
            "ratio": float(ratio.reshape(-1)[i]),
            "index": [int(j) for j in np.unravel_index(i, value.shape)],
            "got": float(got.reshape(-1)[i]),
            "ref": float(value.reshape(-1)[i]),
            "bound": float(bound.reshape(-1)[i]),
        }
        out["beyond"] = int((ratio > 1).sum())
        with np.errstate(all="ignore"):
            rel = np.where(judged & (value != 0), np.abs(got - value) / np.abs(value), 0.0)
        out["max_rel_error"] = float(rel.max())
    return out


def summarise(per_case: list[dict[str, Any]]) -> dict[str, Any]:
    """The backend's summary from its cases' judgements: counts, the worst case, specials and determinism."""
    ran = [c for c in per_case if "unsupported" not in c and "error" not in c]
    s: dict[str, Any] = {
        "cases": len(ran),
        "unsupported": [{"case": c["case"], "reason": c["unsupported"]} for c in per_case if "unsupported" in c],
        "errors": [{"case": c["case"], "error": c["error"]} for c in per_case if "error" in c],
        "judged_elements": sum(c.get("judged", 0) for c in ran),
        "special_elements": sum(c.get("specials", 0) for c in ran),
        "class_mismatches": sum(c.get("class_mismatches", 0) for c in ran),
        "beyond_elements": sum(c.get("beyond", 0) for c in ran),
        "nondeterministic": [c["case"] for c in ran if not c.get("deterministic", True)],
    }
    worst = [c for c in ran if "worst" in c]
    if worst:
        w = max(worst, key=lambda c: c["worst"]["ratio"])
        s["worst"] = {**w["worst"], "case": w["case"], "input": w.get("describe", {})}
    bad = [c for c in ran if c.get("class_mismatches")]
    if bad:
        s["first_class_mismatch"] = {"case": bad[0]["case"], **bad[0]["first_mismatch"]}
        s["class_mismatch_kinds"] = sorted({k for c in bad for k in c.get("mismatch_kinds", [])})
        s["class_mismatch_cases"] = [c["case"] for c in bad]
    s["deterministic"] = not s["nondeterministic"]
    return s


def verdict(summary: Mapping[str, Any], has_bound: bool) -> tuple[str, str]:
    """(status, reason) of one (op, backend) from its summary: findings are violations, each named; without a
    derived bound, a measurement only (skipped); no case run is skipped; an audit failure is an error."""
    if summary.get("errors"):
        e = summary["errors"][0]
        return "error", f"case {e['case']!r} failed: {e['error']}"
    if not summary.get("cases"):
        why = "; ".join(f"{u['case']}: {u['reason']}" for u in summary.get("unsupported", [])[:2])
        return "skipped", f"the backend ran no case ({why or 'no cases'})"
    findings = []
    w = summary.get("worst") or {}
    if has_bound and w.get("ratio", 0.0) > 1.0:
        findings.append(
            f"beyond the derived bound: {summary['beyond_elements']} element(s), worst error/bound "
            f"{w['ratio']:.3g} in case {w['case']!r} at {w['index']}"
        )
    if summary.get("class_mismatches"):
        kinds = "; ".join(summary.get("class_mismatch_kinds", [])[:3])
        findings.append(
            f"NaN/Inf handling differs from the spec at {summary['class_mismatches']} element(s) "
            f"(cases {summary['class_mismatch_cases'][:3]}: {kinds})"
        )
    if summary.get("nondeterministic"):
        findings.append(f"not bitwise reproducible across reruns (cases {summary['nondeterministic'][:3]})")
    if findings:
        return "violated", "; ".join(findings)
    if not has_bound:
        return "skipped", f"named gap: no derived bound; measured worst max relative error {_max_rel(summary)}"
    return "passed", f"{summary['cases']} cases, worst error/bound {w.get('ratio', 0.0):.3g}"


def _max_rel(summary: Mapping[str, Any]) -> str:
    v = summary.get("max_rel_error")
    return "n/a" if v is None else f"{v:.3g}"


def audit_backend(
    op: str,
    backend: str,
    device: str,
    seed: int = 0,
    reruns: int = 2,
    perturb: Callable[[np.ndarray], np.ndarray] | None = None,
) -> dict[str, Any]:
    """Run and judge every case of one (op, backend) on ``device`` ("cuda" or "host": torch's CPU kernels).

    ``perturb`` (planted bugs only) changes torch's output before it is judged."""
    from native import torch as nt

    top, b = sto.get_backend(op, backend)
    base = {
        "op": op,
        "backend": backend,
        "call": top.call,
        "spec": top.spec,
        "dtype": b.dtype,
        "settings": {k: str(v) for k, v in b.settings},
        "bound": b.bound or None,
        "bound_source": sto.BOUND_SOURCES.get(b.bound, "none"),
        "bound_note": b.bound_note,
        "device": device,
        "seed": seed,
        "reruns": reruns,
    }
    t0 = time.perf_counter()
    missing = nt.cuda_missing() if device == "cuda" else nt.torch_missing()
    if missing:
        return {**base, "verdict": "skipped", "reason": missing}
    where = "cuda" if device == "cuda" else "cpu"
    if where not in b.devices:
        why = f"backend {backend} of {op} is audited on {', '.join(b.devices)}; this run is on {where}"
        return {**base, "verdict": "skipped", "reason": why}
    per_case = []
    for c in cases_for(op, b, seed):
        rec: dict[str, Any] = {"case": c.name, "describe": dict(c.describe)}
        try:
            outs = nt.run_op(op, c.args, b.dtype, b.settings, device, reruns)
        except nt.Unsupported as exc:
            per_case.append({**rec, "unsupported": str(exc)})
            continue
        except Exception as exc:  # torch raising on a configuration it should run: the audit reports it
            per_case.append({**rec, "error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"})
            continue
        got = outs[0] if perturb is None else perturb(outs[0])
        try:
            value, bound = c.reference()
        except Exception as exc:  # a reference that cannot be evaluated is the audit's failure, reported as such
            per_case.append({**rec, "error": f"reference: {type(exc).__name__}: {str(exc).strip()[:300]}"})
            continue
        rec.update(judge_case(got, value, bound))
        rec["deterministic"] = all(np.array_equal(outs[0].view(np.uint32), o.view(np.uint32)) for o in outs[1:])
        per_case.append(rec)
    summary = summarise(per_case)
    rels = [c["max_rel_error"] for c in per_case if "max_rel_error" in c]
    summary["max_rel_error"] = max(rels) if rels else None
    status, reason = verdict(summary, bool(b.bound))
    return {
        **base,
        **summary,
        "versions": nt.versions(device if device == "cuda" else "host"),
        "per_case": [_brief(c) for c in per_case],
        "seconds": round(time.perf_counter() - t0, 3),
        "verdict": status,
        "reason": reason,
    }


def _brief(c: Mapping[str, Any]) -> dict[str, Any]:
    """One case's line of evidence: its name, worst ratio, mismatches, determinism (or why it did not run)."""
    out: dict[str, Any] = {"case": c["case"]}
    for k in ("unsupported", "error", "class_mismatches", "judged", "deterministic"):
        if k in c:
            out[k] = c[k]
    if "worst" in c:
        out["worst_ratio"] = c["worst"]["ratio"]
    return out


# -- registered tests -----------------------------------------------------------------------------------------

_PLANTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    # a kernel off by 2^-10 relative: beyond every fp32 bound of the table
    "scaled": lambda y: (y.astype(np.float64) * (1 + 2.0**-10)).astype(np.float32),
    # a kernel that turns NaN into 0 (a silent clamp): NaN handling differs from the spec
    "nan_to_zero": lambda y: np.nan_to_num(y, nan=0.0, posinf=np.inf, neginf=-np.inf).astype(np.float32),
}


def outcome_of(ctx: FalsifyContext | None, audit: Mapping[str, Any]) -> Outcome:
    """The item's outcome from one backend's audit (its verdict and evidence)."""
    ev = {k: v for k, v in audit.items() if k not in ("verdict", "reason")}
    status, reason = audit["verdict"], audit.get("reason", "")
    if ctx is not None:
        ev = engine.evidence(ctx, None, **ev)
    if status == "passed":
        return passed(**ev)
    if status == "violated":
        ce = {"worst": audit.get("worst"), "first_class_mismatch": audit.get("first_class_mismatch")}
        ce["nondeterministic"] = audit.get("nondeterministic")
        if ctx is not None:
            ce["replay"] = engine.replay_command(ctx)
        return violated(ce, reason, **ev)
    if status == "error":
        return error(reason, **ev)
    out = skipped(reason, **ev)
    if reason.startswith("named gap"):
        from dataclasses import replace

        out = replace(out, claim="assumed")
    return out


@register_test("torch.audit", devices=("cuda",))
@guarded()
def torch_audit(ctx: FalsifyContext) -> Outcome:
    """One PyTorch op under one backend on the GPU against its spec and derived bound (cases, classes, reruns)."""
    p = ctx.params
    try:
        sto.get_backend(str(p["op"]), str(p["backend"]))
    except KeyError as exc:
        return error(f"bad params: {exc.args[0]}")
    plant = p.get("plant")
    if plant is not None and plant not in _PLANTS:
        return error(f"unknown plant {plant!r} (known: {', '.join(_PLANTS)})")
    audit = audit_backend(
        str(p["op"]), str(p["backend"]), ctx.device, ctx.seed, perturb=_PLANTS.get(plant) if plant else None
    )
    return outcome_of(ctx, audit)


@register_test("torch.table")
def torch_table(ctx: FalsifyContext) -> Outcome:
    """The contract's audit items are spec.torch's table: one item per (op, backend), every bound source named."""
    items = [i for i in ctx.contract.get("falsification", []) if i.get("test") == "torch.audit"]
    problems = table_problems(items)
    ev = {"items": len(items), "table": len(sto.table_keys()), "bounds": sorted({b for b in sto.BOUNDS})}
    if problems:
        return engine.outcome_violated(
            ctx, {"problems": problems[:10]}, f"{len(problems)} table problem(s): {problems[0]}", None, **ev
        )
    return engine.outcome_passed(ctx, len(items), None, **ev)


def table_problems(items: list[Mapping[str, Any]]) -> list[str]:
    """What makes a list of ``torch.audit`` items differ from the table (unknown, duplicate, missing pairs)."""
    problems: list[str] = []
    seen: dict[tuple[str, str], str] = {}
    for it in items:
        prm = it.get("params") or {}
        key = (str(prm.get("op")), str(prm.get("backend")))
        try:
            _, b = sto.get_backend(*key)
        except KeyError as exc:
            problems.append(f"{it.get('id')}: {exc.args[0]}")
            continue
        if key in seen:
            problems.append(f"{it.get('id')}: duplicates {seen[key]}")
        seen[key] = str(it.get("id"))
        if b.bound and b.bound not in sto.BOUND_SOURCES:
            problems.append(f"{it.get('id')}: bound {b.bound!r} has no source")
        if not b.bound and not b.bound_note:
            problems.append(f"{it.get('id')}: no derived bound and no note saying why")
    missing = [f"{o}/{b}" for o, b in sto.table_keys() if (o, b) not in seen]
    if missing:
        problems.append(f"no item for {missing[:6]}{' ...' if len(missing) > 6 else ''}")
    return problems


# -- Inductor against the IR (issue 27 part 4) -----------------------------------------------------------------

INDUCTOR_SHAPE = "small"


def inductor_check(device: str, shape: str = INDUCTOR_SHAPE, seed: int = 0, grouping: str = "div") -> dict[str, Any]:
    """The fusion decoder block's program, each step's meaning compiled by torch.compile (Inductor) from the
    denotation's values of what it reads, against the denotation: bitwise, within the step's derived bound, or
    beyond; plus the whole block compiled at once, end to end (no derived bound for the composition)."""
    from falsification.fusion_tests import DECODER_SHAPES, step_agrees
    from falsification.norm_tests import norm_bound
    from native import fusion as nf
    from native import torch as nt
    from native.fusion_gqa import rewrite_gqa
    from spec.fusion import same_bits
    from spec.fusion_decoder import decoder_block, decoder_params
    from spec.ir import graphspec as gs
    from spec.ir.denote import denote_all

    t0 = time.perf_counter()
    sh = DECODER_SHAPES[shape]
    blk = decoder_block(**sh)
    low = gs.lower_dag(blk, decoder_params(blk, seed))
    rw, _ = rewrite_gqa(low.graph, low.payload, [low.output], grouping)
    g, p, out = rw.graph, rw.payload, rw.mapping[low.output]
    ids = np.random.default_rng(seed).integers(0, sh["vocab"], sh["t"]).astype(np.float32)
    den = denote_all(g, p, [ids]).value
    prog = nf.compile_subgraph(g, [out], payload=p)
    nodes = {n.id: n for n in g.nodes}
    params = {n.id: dict(p.get(n.id) or {}) for n in g.nodes}
    steps = []
    for k, st in enumerate(prog.steps):
        rec: dict[str, Any] = {"step": k, "kind": st.kind, "ops": [g[n].kind for n in st.nodes]}
        fn = nt.step_function(nodes, params, st.nodes, st.reads, st.writes, device)
        if st.kind == "alias":  # a view: Inductor generates no kernel for it; torch's view is checked as is
            got, rec["kernels"] = (
                nt.run_eager(fn, [den[r] for r in st.reads], device)[0],
                {"generated": [], "extern": []},
            )
        else:
            outs, codes = nt.compile_and_run(fn, [den[r] for r in st.reads], device)
            got, rec["kernels"] = outs[0], nt.kernel_names(codes)
        w = st.writes[0]
        if same_bits(got, den[w]):
            rec["agreement"] = "bitwise"
        elif (
            st.kind == "pattern" and st.pattern.kind == "rmsnorm" or (st.kind == "reduction" and g[w].kind == "rmsnorm")
        ):
            rec.update(_rms_step(st, g, p, den, got, norm_bound))
        elif st.kind in ("cublas", "fused") or (st.kind == "pattern" and st.pattern.kind == "masked_softmax"):
            ok = step_agrees(g, p, st, den, got)
            rec["agreement"] = "within bound" if ok else "beyond bound"
            rec["bound"] = _STEP_BOUND[st.kind if st.kind != "pattern" else "masked_softmax"]
        else:
            rec["agreement"] = "differs (no derived bound: the step's rule is bitwise)"
        with np.errstate(all="ignore"):
            rec["max_abs_error"] = float(np.nanmax(np.abs(got.astype(np.float64) - den[w])))
        steps.append(rec)
    # the whole block at once: Inductor fuses across our steps; only the output is observable
    fn = nt.step_function(
        nodes,
        params,
        [n.id for n in g.nodes if g[n.id].kind != "input" and g[n.id].kind != "const"],
        [n.id for n in g.nodes if g[n.id].kind in ("input", "const")],
        [out],
        device,
    )
    reads = [n.id for n in g.nodes if g[n.id].kind in ("input", "const")]
    (y,), codes = nt.compile_and_run(fn, [den[r] for r in reads], device)
    with np.errstate(all="ignore"):
        rel = float(np.max(np.abs(y.astype(np.float64) - den[out]) / np.maximum(np.abs(den[out]), 1e-30)))
    counts = {a: sum(s["agreement"] == a for s in steps) for a in sorted({s["agreement"] for s in steps})}
    return {
        "shape": sh,
        "seed": seed,
        "device": device,
        "versions": nt.versions(device if device == "cuda" else "host"),
        "steps": steps,
        "step_agreement": counts,
        "block": {
            "kernels": nt.kernel_names(codes),
            "end_to_end_max_rel_error": rel,
            "bitwise": bool(same_bits(y, den[out])),
            "bound": "none: no derived bound for the composed block (each step is judged above)",
        },
        "seconds": round(time.perf_counter() - t0, 3),
    }


_STEP_BOUND = {
    "cublas": "spec.gemm.error_bound (native.ir AGREEMENT)",
    "fused": "fused chain rule (falsification.fusion_tests.fused_step_agrees: bitwise if exact, op budgets else)",
    "masked_softmax": "softmax relative bound (native.ir AGREEMENT['softmax'])",
}


def _rms_step(st: Any, g: Any, p: Any, den: Any, got: np.ndarray, norm_bound: Callable) -> dict[str, Any]:
    """An RMSNorm step (the op or the six-op pattern) against norm-softmax-v1's RMSNORM bound of the real value."""
    w = st.writes[0]
    if st.kind == "pattern":
        mt = st.pattern
        x = den[mt.operand("x")]
        weight = np.asarray(den[mt.operand("weight")], np.float32).reshape(-1, x.shape[-1])[0]
        eps = float(np.asarray(den[mt.operand("eps")]).reshape(-1)[0])
    else:
        x, weight, eps = den[g[w].parents[0]], np.asarray(p.get(w)["weight"], np.float32), g[w].attrs["eps"]
    value, bound = norm_bound(np.asarray(x, np.float32), weight, None, eps)
    with np.errstate(all="ignore"):
        ok = np.abs(got.astype(np.float64) - value) <= bound
    return {
        "agreement": "within bound" if bool(np.all(ok)) else "beyond bound",
        "bound": "falsification.norm_tests.norm_bound (norm-softmax-v1 RMSNORM-bound)",
    }


@register_test("torch.inductor", devices=("cuda",))
@guarded()
def torch_inductor(ctx: FalsifyContext) -> Outcome:
    """The decoder block's steps compiled by Inductor: bitwise, within the derived bound, or beyond (a finding)."""
    from native import torch as nt

    why = nt.cuda_missing() if ctx.device == "cuda" else nt.torch_missing()
    if why:
        return skipped(why)
    r = inductor_check(ctx.device, str(ctx.params.get("shape", INDUCTOR_SHAPE)), ctx.seed)
    beyond = [s for s in r["steps"] if s["agreement"] == "beyond bound"]
    ev = engine.evidence(ctx, None, cases=len(r["steps"]), **r)
    if beyond:
        return violated(
            {"steps": beyond[:4], "replay": engine.replay_command(ctx)},
            f"{len(beyond)} Inductor step(s) beyond their derived bound: "
            + ", ".join(f"step {s['step']} {s['ops']}" for s in beyond[:4]),
            **ev,
        )
    return passed(**ev)
