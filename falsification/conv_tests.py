"""Falsification tests of the conv-pool-v1 contract, registered by name, each an engine :class:`Check`.

Registered names and their ``params`` (``impl`` is a ``module:function`` the project's tests swap for
planted bugs; it has the signature of the default):

* ``conv.bitwise`` {op: fwd|tconv|wgrad|bgrad, max_rank, impl} — the kernel's output bits equal the softfloat
  spec of :mod:`spec.conv` on any input bits (finite mixes and TestFloat-style specials), random windows
  (rank 1..max_rank, stride, padding, dilation, groups, bias, output_padding).
* ``conv.pool_bitwise`` {op: max|max_bwd|avg|avg_bwd, impl} — pooling and its backward bitwise to the spec;
  ``max`` compares the argmax too, on inputs drawn from a few values so that ties are frequent.
* ``conv.error_bound`` {impl} — forward conv within tolerance * (gamma_{K+1} sum|w x| + |b| terms + (K+1)
  2^-149) of the float64 value, K = cin_g * taps: the recursive-summation bound of the stated fold.
* ``conv.cudnn_bound`` {impl} (cuda, torch) -- the cuDNN convolution of the fusion backend's ``cudnn`` step
  (:mod:`native.cudnn`) within ``conv.error_bound``'s bound, on the CONV-AXIS-REGIMES witnesses and Hypothesis
  draws (rank 1..3, groups, bias); skipped with the reason 'needs cuda and torch: ...' where it cannot run.
* ``conv.adjoint`` {} — <conv(x), y> and <x, conv_T(y)> (kernel outputs, inner products in float64) differ by
  at most tolerance * (gamma_K sum|y| (|w| * |x|) + gamma_K sum|x| (|w|^T * |y|) + 2^-49 (...)).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from falsification import engine
from falsification.agreement import Expected
from falsification.engine import Check
from falsification.float32_inputs import MIXES, BatchSpec, generate_bits
from falsification.registry import FalsifyContext, register_test
from native.conv import ConvRefused, conv_axis_plan, pool2d_plan, tconv_axis_plan
from obligations.core.device import array_module, to_host
from obligations.core.plans import regime_of, resolve
from obligations.core.results import Outcome
from spec import conv as ref

__all__ = ["ConvCase", "conv_cases", "MIX_NAMES", "U32", "TIE_MIX", "tie_windows", "fusion_step_conv"]

U32 = 2.0**-24
MIX_NAMES: tuple[str, ...] = ("moderate", *sorted(MIXES))
_DEFAULT_IMPL = {
    "fwd": "native.conv:conv",
    "tconv": "native.conv:conv_transpose",
    "wgrad": "native.conv:conv_weight_grad",
    "bgrad": "native.conv:bias_grad",
    "max": "native.conv:max_pool2d",
    "max_bwd": "native.conv:max_pool2d_backward",
    "avg": "native.conv:avg_pool2d",
    "avg_bwd": "native.conv:avg_pool2d_backward",
}


def _gamma(k: int) -> float:
    return k * U32 / (1 - k * U32)


@dataclass(frozen=True)
class ConvCase:
    """One drawn call: seed, input mix, batch, groups, channels per group, bias, and per-axis windows."""

    seed: int
    mix: int
    batch: int
    groups: int
    cin_g: int
    cout_g: int
    bias: int
    axes: tuple[tuple[int, int, int, int, int, int], ...]  # (size, kernel, stride, padding, dilation, out_pad)

    def ints(self) -> tuple[int, ...]:
        """The case as integers (its replay encoding)."""
        flat = [v for a in self.axes for v in a]
        return (self.seed, self.mix, self.batch, self.groups, self.cin_g, self.cout_g, self.bias, len(self.axes), *flat)

    @classmethod
    def of(cls, v: tuple[int, ...]) -> ConvCase:
        """Decode :meth:`ints`."""
        r = v[7]
        axes = tuple(tuple(v[8 + 6 * i : 14 + 6 * i]) for i in range(r))
        return cls(v[0], v[1], v[2], v[3], v[4], v[5], v[6], axes)  # type: ignore[arg-type]

    def window(self) -> dict[str, Any]:
        """stride, padding, dilation tuples."""
        return {
            "stride": tuple(a[2] for a in self.axes),
            "padding": tuple(a[3] for a in self.axes),
            "dilation": tuple(a[4] for a in self.axes),
            "groups": self.groups,
        }

    def describe(self) -> dict[str, Any]:
        """JSON of the case."""
        return {
            "seed": self.seed,
            "mix": MIX_NAMES[self.mix],
            "batch": self.batch,
            "groups": self.groups,
            "cin_g": self.cin_g,
            "cout_g": self.cout_g,
            "bias": bool(self.bias),
            "axes": [
                dict(zip(("size", "kernel", "stride", "padding", "dilation", "out_pad"), a, strict=True))
                for a in self.axes
            ],
        }


@st.composite
def _axis(draw: Any, transposed: bool) -> tuple[int, int, int, int, int, int]:
    k, s, d = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    span = d * (k - 1) + 1
    if transposed:  # out = (size - 1) s - 2p + span + op >= 1
        size, op = draw(st.integers(1, 6)), draw(st.integers(0, s - 1))
        return size, k, s, draw(st.integers(0, min(2, ((size - 1) * s + span - 1 + op) // 2))), d, op
    p = draw(st.integers(0, 2))
    return draw(st.integers(max(1, span - 2 * p), span + 5)), k, s, p, d, 0


@st.composite
def conv_cases(draw: Any, max_rank: int = 3, transposed: bool = False, mixes: int = len(MIX_NAMES)) -> ConvCase:
    """Random convolution calls small enough for the softfloat spec."""
    rank = draw(st.integers(1, max_rank))
    return ConvCase(
        draw(st.integers(0, 2**32 - 1)),
        draw(st.integers(0, mixes - 1)),
        draw(st.integers(1, 2)),
        draw(st.integers(1, 2)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
        draw(st.integers(0, 1)),
        tuple(draw(_axis(transposed)) for _ in range(rank)),
    )


def _bits(seed: int, n: int, mix: str) -> np.ndarray:
    if mix == "moderate":
        rng = np.random.default_rng(seed)
        v = rng.uniform(-1, 1, n) * np.exp2(rng.integers(-6, 7, n))
        return v.astype(np.float32).view(np.uint32)
    return generate_bits(BatchSpec(seed=seed, size=n, mix=mix), 1, np)[0]


@dataclass(frozen=True)
class _Operands:
    """Host bit arrays of one case and their device float views."""

    case: ConvCase
    bits: dict[str, np.ndarray]
    dev: dict[str, Any]


def _operands(case: ConvCase, xp: Any, op: str) -> _Operands:
    """x, w, b and dy bits of the case (shapes by the op: conv's or the transposed conv's)."""
    c_in, c_out = case.groups * case.cin_g, case.groups * case.cout_g
    sizes = tuple(a[0] for a in case.axes)
    kernel = tuple(a[1] for a in case.axes)
    mix = MIX_NAMES[case.mix]
    if op == "tconv":
        x_shape, w_shape = (case.batch, c_in) + sizes, (c_in, case.cout_g) + kernel
        outs = tuple(max(0, ref.tconv_out_size(*a)) for a in case.axes)  # a refused window: no outputs
        y_shape = (case.batch, c_out) + outs
    else:
        x_shape, w_shape = (case.batch, c_in) + sizes, (c_out, case.cin_g) + kernel
        outs = tuple(max(0, ref.out_size(*a[:5])) for a in case.axes)
        y_shape = (case.batch, c_out) + outs
    shapes = {"x": x_shape, "w": w_shape, "b": (c_out,), "dy": y_shape}
    bits = {k: _bits(case.seed + j, int(np.prod(s)), mix).reshape(s) for j, (k, s) in enumerate(shapes.items())}
    dev = {k: xp.asarray(v.view(np.float32)) for k, v in bits.items()}
    return _Operands(case, bits, dev)


def _host_bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(to_host(a)).astype(np.float32).view(np.uint32)


def _conv_native(op: str, impl: Callable[..., Any], device: str) -> Callable[[_Operands], Any]:
    shape_of = {"fwd": "dy", "tconv": "dy", "wgrad": "w", "bgrad": "b"}

    def run(o: _Operands) -> Any:
        out = _call(o)
        want = o.bits[shape_of[op]].shape
        if tuple(out.shape) != tuple(want):  # a wrong output shape refutes the claim (the engine judges same sizes)
            raise ValueError(f"output shape {tuple(out.shape)}, the spec's is {tuple(want)}")
        return out

    def _call(o: _Operands) -> Any:
        c, d, win = o.case, o.dev, o.case.window()
        b = d["b"] if c.bias else None
        if op == "fwd":
            return _host_bits(impl(d["x"], d["w"], b, device=device, **win))
        if op == "tconv":
            return _host_bits(impl(d["x"], d["w"], b, output_padding=tuple(a[5] for a in c.axes), device=device, **win))
        if op == "wgrad":
            return _host_bits(impl(d["x"], d["dy"], tuple(a[1] for a in c.axes), device=device, **win))
        return _host_bits(impl(d["dy"], device=device))

    return run


def _conv_reference(op: str) -> Callable[[_Operands], Expected]:
    def run(o: _Operands) -> Expected:
        c, b, win = o.case, o.bits, o.case.window()
        bias = b["b"] if c.bias else None
        if op == "fwd":
            return Expected(bits=ref.conv(b["x"], b["w"], bias, **win))
        if op == "tconv":
            return Expected(
                bits=ref.conv_transpose(b["x"], b["w"], bias, output_padding=tuple(a[5] for a in c.axes), **win)
            )
        if op == "wgrad":
            return Expected(bits=ref.conv_weight_grad(b["x"], b["dy"], tuple(a[1] for a in c.axes), **win))
        return Expected(bits=ref.bias_grad(b["dy"]))

    return run


def _round_once(v: np.ndarray) -> np.ndarray:
    """float64 values rounded once to binary32 bits (NaN canonical)."""
    with np.errstate(all="ignore"):
        f = np.asarray(v, np.float64).astype(np.float32)
    return np.where(np.isnan(f), np.uint32(0x7FFFFFFF), f.view(np.uint32)).astype(np.uint32)


def _conv_alternative(op: str) -> Callable[[_Operands], Expected]:
    """The same sums accumulated exactly (float64, products exact) and rounded once: another order's bits."""

    def run(o: _Operands) -> Expected:
        c, b, win = o.case, o.bits, o.case.window()
        f = {k: v.view(np.float32) for k, v in b.items()}
        with np.errstate(all="ignore"):
            bias = f["b"].astype(np.float64) if c.bias else None
            if op == "fwd":
                return Expected(bits=_round_once(ref.conv_f64(f["x"], f["w"], bias, **win)[0]))
            if op == "tconv":
                pad = tuple(a[5] for a in c.axes)
                val = ref.conv_transpose_f64(f["x"], f["w"], output_padding=pad, **win)[0]
                if bias is not None:
                    val = val + bias.reshape((1, -1) + (1,) * len(c.axes))
                return Expected(bits=_round_once(val))
            if op == "wgrad":
                kernel = tuple(a[1] for a in c.axes)
                return Expected(bits=_round_once(ref.conv_weight_grad_f64(f["x"], f["dy"], kernel, **win)))
            axes = (0, *range(2, f["dy"].ndim))
            return Expected(bits=_round_once(f["dy"].astype(np.float64).sum(axis=axes)))

    return run


def _conv_witness(seed: int, w: Any) -> ConvCase:
    """The rank-1 call of a CONV-AXIS-REGIMES or CONV-TCONV-REGIMES witness (one axis; two output channels, bias)."""
    axis = (int(w["size"]), int(w["kernel"]), int(w["stride"]), int(w["padding"]), int(w["dilation"]))
    return ConvCase(seed, 0, 1, 1, 1, 2, 1, ((*axis, int(w.get("out_pad", 0))),))


def _conv_regimes(transposed: bool) -> Callable[[ConvCase], list[str]]:
    """The axis regimes a case selects (every axis' together)."""

    def regimes(c: ConvCase) -> list[str]:
        out: list[str] = []
        keys = ("size", "kernel", "stride", "padding", "dilation", "out_pad")
        for a in c.axes:
            values = dict(zip(keys, a, strict=True))
            if not transposed:
                values.pop("out_pad")
            names = regime_of(tconv_axis_plan if transposed else conv_axis_plan, values)
            out += [n for n in names if n not in out]
        return out

    return regimes


def _explicit(ctx: FalsifyContext, transposed: bool) -> tuple[ConvCase, ...]:
    """Boundary windows: the padding is the whole margin, stride on one axis only, dilation past the input."""
    s = ctx.seed
    return (
        ConvCase(s, 0, 1, 1, 2, 2, 1, ((5, 3, 2, 1, 1, 1 if transposed else 0), (4, 2, 1, 0, 2, 0))),
        ConvCase(s + 1, 0, 2, 2, 1, 2, 1, ((3, 3, 1, 2, 1, 0), (6, 1, 3, 0, 1, 2 if transposed else 0))),
        ConvCase(s + 2, 4, 1, 1, 1, 1, 0, ((7, 2, 3, 1, 2, 0),)),
    )


@register_test("conv.bitwise")
def conv_bitwise(ctx: FalsifyContext) -> Outcome:
    """Convolution forward / transposed / weight and bias gradients bitwise equal to the softfloat spec."""
    op = ctx.params.get("op", "fwd")
    name = ctx.params.get("impl", _DEFAULT_IMPL[op])
    impl = resolve(name)
    xp = array_module(ctx.device)
    transposed = op == "tconv"
    check = Check(
        name=f"conv {op}",
        inputs=lambda c: _operands(c, xp, op),
        native=_conv_native(op, impl, ctx.device),
        reference=_conv_reference(op),
        agreement=engine.item_agreement(ctx, "bitwise"),
        cases=conv_cases(int(ctx.params.get("max_rank", 3)), transposed),
        explicit=_explicit(ctx, transposed),
        encode=lambda c: c.ints(),
        decode=lambda rp: ConvCase.of(rp.values),
        describe=lambda c: c.describe(),
        alternative=_conv_alternative(op),
        alternative_name="the same sums accumulated exactly in float64 and rounded once",
        from_witness=lambda w: _conv_witness(ctx.seed, w),
        regime_of=_conv_regimes(transposed),
        refuses=(ConvRefused,),
        build={
            "impl": name,
            "op": op,
            "reference": "spec.conv (softfloat, env cuda)",
            "order": "fold over (ci, k) row-major from +0, then + b"
            if op in ("fwd", "tconv")
            else "fold over (n, o) row-major from +0",
        },
    )
    return engine.run(ctx, check)


# -- pooling ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolCase:
    """A pooling call: seed, tie-heavy values or a mix, planes, H, W and the window per axis."""

    seed: int
    mix: int  # 0: few distinct values (ties, signed zeros, a NaN sometimes); TIE_MIX: several maxima per window
    planes: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int

    def window(self) -> dict[str, Any]:
        """kernel, stride, padding tuples."""
        return {"kernel": (self.kh, self.kw), "stride": (self.sh, self.sw), "padding": (self.ph, self.pw)}


@st.composite
def _pool_cases(draw: Any) -> PoolCase:
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    ph, pw = draw(st.integers(0, kh // 2)), draw(st.integers(0, kw // 2))
    h = draw(st.integers(max(1, kh - 2 * ph), kh + 6))
    w = draw(st.integers(max(1, kw - 2 * pw), kw + 6))
    return PoolCase(
        draw(st.integers(0, 2**32 - 1)),
        draw(st.integers(0, TIE_MIX)),
        draw(st.integers(1, 3)),
        h,
        w,
        kh,
        kw,
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
        ph,
        pw,
    )


_TIE_VALUES = np.array([0.0, -0.0, 1.0, 1.0, 2.0, -1.0, 2.0, 0.5], dtype=np.float32)
TIE_MIX = len(MIX_NAMES) + 1  # the pooling mix whose windows hold several maxima: equal values, NaNs, both zeros
# Per plane (in turn): the maximum 3 repeated (1 beside it), NaNs of several payloads among 3s, and +0 / -0 only.
_TIE_PLANES: tuple[np.ndarray, ...] = (
    np.array([0x40400000, 0x40400000, 0x40400000, 0x3F800000], dtype=np.uint32),
    np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x40400000, 0x40400000], dtype=np.uint32),
    np.array([0x00000000, 0x80000000], dtype=np.uint32),
)


def _tie_bits(c: PoolCase, n: int, salt: int) -> np.ndarray:
    """Values where most windows have several candidates for the maximum (the argmax must take the first)."""
    rng = np.random.default_rng(c.seed + salt)
    plane = (np.arange(n) // max(c.h * c.w, 1) + c.seed) % len(_TIE_PLANES)
    out = np.empty(n, dtype=np.uint32)
    for k, values in enumerate(_TIE_PLANES):
        at = plane == k
        out[at] = values[rng.integers(0, len(values), int(at.sum()))]
    return out


def tie_windows(x_bits: np.ndarray, c: PoolCase) -> tuple[int, int]:
    """(windows whose maximum several real taps share, windows with several NaN taps) of a max pooling."""
    x = np.asarray(x_bits, dtype=np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaNs widen to float64 quietly
        taps, real, _ = ref.pool_windows_f64(x, **c.window())
    y = np.asarray(ref.max_pool2d(x_bits, **c.window())[0]).view(np.float32).astype(np.float64)
    y = y.reshape(taps.shape[:-1])[..., None]
    nan = np.isnan(taps) & real[None]
    top = real[None] & ~np.isnan(taps) & (taps == y) & (np.signbit(taps) == np.signbit(y))
    return int(np.count_nonzero(top.sum(-1) >= 2)), int(np.count_nonzero(nan.sum(-1) >= 2))


def _pool_bits(c: PoolCase, n: int, salt: int) -> np.ndarray:
    if c.mix == TIE_MIX:
        return _tie_bits(c, n, salt)
    if c.mix == 0:
        rng = np.random.default_rng(c.seed + salt)
        v = _TIE_VALUES[rng.integers(0, len(_TIE_VALUES), n)]
        if rng.random() < 0.3:
            v[rng.integers(0, n)] = np.nan
        return v.view(np.uint32)
    return _bits(c.seed + salt, n, MIX_NAMES[c.mix - 1])


@register_test("conv.pool_bitwise")
def pool_bitwise(ctx: FalsifyContext) -> Outcome:
    """Max / average pooling and their backward bitwise to the spec (max: value and first argmax)."""
    fields = tuple(PoolCase.__dataclass_fields__)
    op = ctx.params.get("op", "max")
    name = ctx.params.get("impl", _DEFAULT_IMPL[op])
    impl = resolve(name)
    xp = array_module(ctx.device)

    def inputs(c: PoolCase) -> dict[str, Any]:
        x = _pool_bits(c, c.planes * c.h * c.w, 0).reshape(c.planes, c.h, c.w)
        oh, ow = max(0, ref.out_size(c.h, c.kh, c.sh, c.ph)), max(0, ref.out_size(c.w, c.kw, c.sw, c.pw))
        dy = _bits(c.seed + 7, c.planes * oh * ow, "moderate").reshape(c.planes, oh, ow)
        plan = pool2d_plan(c.planes, c.h, c.w, c.kh, c.kw, c.sh, c.sw, c.ph, c.pw)
        # a refused witness (POOL-REGIMES' rejected side) has no spec argmax: the guard must refuse it first
        arg = ref.max_pool2d(x, **c.window())[1] if plan.windows_ok() else np.zeros(dy.shape, np.int64)
        return {"case": c, "x": x, "dy": dy, "arg": arg}

    def native(d: dict[str, Any]) -> Any:
        c, win = d["case"], d["case"].window()
        x, dy = xp.asarray(d["x"].view(np.float32)), xp.asarray(d["dy"].view(np.float32))
        if op == "max":
            y, arg = impl(x, device=ctx.device, **win)
            return [_host_bits(y), np.asarray(to_host(arg), dtype=np.int64)]
        if op == "avg":
            return _host_bits(impl(x, device=ctx.device, **win))
        if op == "max_bwd":
            return _host_bits(impl(dy, xp.asarray(d["arg"]), (c.planes, c.h, c.w), device=ctx.device, **win))
        return _host_bits(impl(dy, (c.planes, c.h, c.w), device=ctx.device, **win))

    def reference(d: dict[str, Any]) -> Any:
        c, win = d["case"], d["case"].window()
        if op == "max":
            y, arg = ref.max_pool2d(d["x"], **win)
            return [Expected(bits=y), Expected(bits=arg)]
        if op == "avg":
            return Expected(bits=ref.avg_pool2d(d["x"], **win))
        if op == "max_bwd":
            return Expected(bits=ref.max_pool2d_backward(d["dy"], d["arg"], (c.planes, c.h, c.w)))
        return Expected(bits=ref.avg_pool2d_backward(d["dy"], (c.planes, c.h, c.w), **win))

    def alternative(d: dict[str, Any]) -> Any:
        c, win = d["case"], d["case"].window()
        x = d["x"].view(np.float32)
        with np.errstate(all="ignore"):
            if op == "max":  # ties to the last real tap in row-major order
                y, arg = ref.max_pool2d(d["x"], **win)
                taps, real, idx = ref.pool_windows_f64(x, **win)
                yv = y.view(np.float32).reshape(taps.shape[:-1]).astype(np.float64)
                same = real[None] & ((taps == yv[..., None]) | (np.isnan(taps) & np.isnan(yv[..., None])))
                same &= ~((taps == 0) & (np.signbit(taps) != np.signbit(yv[..., None])))
                last = taps.shape[-1] - 1 - np.argmax(same[..., ::-1], axis=-1)
                at = np.take_along_axis(np.broadcast_to(idx[None], taps.shape), last[..., None], axis=-1)[..., 0]
                return [Expected(bits=y), Expected(bits=np.where(same.any(-1), at, -1).reshape(arg.shape))]
            if op == "max_bwd":  # contributions in reverse row-major output order
                dy = d["dy"]
                back = ref.max_pool2d_backward(dy[..., ::-1, ::-1], d["arg"][..., ::-1, ::-1], (c.planes, c.h, c.w))
                return Expected(bits=back)
            if op == "avg":
                taps, _, _ = ref.pool_windows_f64(x, **win)
                v = (taps.sum(-1) / (c.kh * c.kw)).reshape(c.planes, taps.shape[1] * taps.shape[2])
                return Expected(bits=_round_once(v).reshape(c.planes, *taps.shape[1:3]))
            dy = d["dy"].view(np.float32).astype(np.float64)
            taps, real, idx = ref.pool_windows_f64(x, **win)
            acc = np.zeros((c.planes, c.h * c.w + 1))
            flat = np.where(real, idx, c.h * c.w)
            contrib = np.broadcast_to(dy[..., None], (c.planes, *flat.shape))
            np.add.at(acc, (slice(None), flat.reshape(-1)), contrib.reshape(c.planes, flat.size))
            return Expected(bits=_round_once(acc[:, :-1] / (c.kh * c.kw)).reshape(c.planes, c.h, c.w))

    s = ctx.seed
    explicit = (
        PoolCase(s, 0, 2, 5, 5, 3, 3, 1, 1, 1, 1),
        PoolCase(s + 1, 0, 1, 4, 7, 2, 3, 2, 1, 1, 0),
        PoolCase(s + 2, 3, 2, 6, 6, 4, 2, 3, 2, 2, 1),
        # several maxima per window (equal values, NaNs of several payloads, +0 beside -0): the first one wins
        PoolCase(s + 3, TIE_MIX, 3, 6, 6, 3, 3, 1, 1, 1, 1),
        PoolCase(s + 4, TIE_MIX, 3, 5, 7, 2, 3, 2, 2, 0, 1),
    )
    ties = {"windows_with_equal_maxima": 0, "windows_with_several_nans": 0}

    def observe(j: engine.Judgement) -> None:
        if op == "max":
            equal, nans = tie_windows(j.inputs["x"], j.inputs["case"])
            ties["windows_with_equal_maxima"] += equal
            ties["windows_with_several_nans"] += nans

    def witness(w: Any) -> PoolCase:
        dims = (int(w[k]) for k in ("planes", "height", "width", "kh", "kw", "sh", "sw", "ph", "pw"))
        return PoolCase(s, TIE_MIX, *dims)

    def regimes(c: PoolCase) -> list[str]:
        keys = ("planes", "height", "width", "kh", "kw", "sh", "sw", "ph", "pw")
        return regime_of(pool2d_plan, dict(zip(keys, (getattr(c, f) for f in fields[2:]), strict=True)))

    check = Check(
        name=f"pool {op}",
        inputs=inputs,
        native=native,
        reference=reference,
        agreement=engine.item_agreement(ctx, "bitwise"),
        cases=_pool_cases(),
        explicit=explicit,
        encode=lambda c: tuple(getattr(c, f) for f in fields),
        decode=lambda rp: PoolCase(*rp.values[: len(fields)]),
        describe=lambda c: {f: getattr(c, f) for f in fields},
        output_names=("y", "argmax") if op == "max" else ("r",),
        alternative=alternative,
        alternative_name={
            "max": "ties broken to the last real tap",
            "max_bwd": "contributions added in reverse row-major output order",
        }.get(op, "the window sums accumulated exactly in float64, rounded once"),
        build={
            "impl": name,
            "op": op,
            "reference": "spec.conv (softfloat, env cuda)",
            "ties": "first real tap in row-major order (NaN above all, +0 above -0)",
        },
        observe=observe,
        from_witness=witness,
        regime_of=regimes,
        refuses=(ConvRefused,),
    )
    return engine.run(ctx, check, (lambda: dict(ties)) if op == "max" else None)


# -- error bound and adjoint -------------------------------------------------------------------------------


def _finite_case(c: ConvCase) -> ConvCase:
    return ConvCase(c.seed, 0, c.batch, c.groups, c.cin_g, c.cout_g, c.bias, c.axes)


@register_test("conv.error_bound")
def error_bound(ctx: FalsifyContext) -> Outcome:
    """|conv - exact| <= tol * (gamma_{K+1} (sum|w x| + |b|) + (K + 1) 2^-149), K = cin_g * taps."""
    return _bound_check(ctx, ctx.params.get("impl", _DEFAULT_IMPL["fwd"]))


@register_test("conv.cudnn_bound")
def cudnn_bound(ctx: FalsifyContext) -> Outcome:
    """The cuDNN step's convolution within conv.error_bound's bound, on the axis regimes' witnesses and draws."""
    from native.cudnn import cudnn_missing, versions
    from obligations.core.results import skipped

    if ctx.device != "cuda":
        return skipped(
            f"needs cuda and torch: runs on cuda (the fusion backend's cuDNN step); this run is on {ctx.device}"
        )
    why = cudnn_missing()
    if why:
        return skipped(why)
    more = {
        **versions(),
        "assumes": "an algorithm that sums the exact products (implicit GEMM / GEMM); benchmark off, so cuDNN's "
        "heuristic picks it; Winograd and FFT are not modelled by the bound",
    }
    kernel = _bound_check(ctx, ctx.params.get("impl", "native.cudnn:conv"), more=more)
    if kernel.status.value != "passed" or not ctx.params.get("through_step", True):
        return kernel
    # the same claim through the fusion executor's cudnn step (IR conv2d: spatial rank 2, groups 1, a bias)
    step = _bound_check(
        ctx,
        "falsification.conv_tests:fusion_step_conv",
        cases=conv_cases(2).map(lambda c: dataclasses.replace(c, groups=1)),
        more=more,
    )
    ev = engine.evidence_dict(step)
    k = engine.evidence_dict(kernel)
    keys = ("cases", "worst_error_over_bound", "regimes_reached", "boundaries_reached", "boundaries_unreached")
    ev["kernel_function"] = {"impl": ctx.params.get("impl", "native.cudnn:conv"), **{x: k.get(x) for x in keys}}
    return engine.with_evidence(step, ev)


def fusion_step_conv(
    x: Any,
    w: Any,
    b: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str = "cuda",
) -> Any:
    """The call as the fusion executor's ``cudnn`` step runs it: a one-conv2d IR graph compiled with
    conv="cudnn" (a rank-1 call as a unit H axis; no bias as a zero bias; groups 1) on ``device``."""
    from native import cudnn
    from native import fusion as nf
    from spec.ir.graph import GraphBuilder

    if groups != 1:
        raise ValueError("the IR's conv2d has groups 1")
    rank = len(x.shape) - 2
    st, pd, dl = (
        tuple(int(e) for e in ((v,) * rank if isinstance(v, int) else v)) for v in (stride, padding, dilation)
    )
    cudnn.plan_call(tuple(x.shape), tuple(w.shape), 0 if b is None else int(b.size), st, pd, dl, 1)  # the guard
    wh = np.ascontiguousarray(to_host(w), np.float32)
    bh = np.zeros(wh.shape[0], np.float32) if b is None else np.ascontiguousarray(to_host(b), np.float32)
    if rank == 1:
        x, wh = x.reshape(x.shape[:2] + (1,) + x.shape[2:]), wh.reshape(wh.shape[:2] + (1,) + wh.shape[2:])
        st, pd, dl = (1, *st), (0, *pd), (1, *dl)
    outs = tuple(ref.out_size(*a) for a in zip(x.shape[2:], wh.shape[2:], st, pd, dl, strict=True))
    gb = GraphBuilder()
    xi = gb.add("input", (), tuple(x.shape))
    y_shape = (x.shape[0], wh.shape[0]) + outs
    gb.add(
        "conv2d",
        (xi,),
        y_shape,
        params={"weight": wh, "bias": bh},
        out_channels=int(wh.shape[0]),
        kernel=tuple(wh.shape[2:]),
        stride=st,
        padding=pd,
        dilation=dl,
    )
    g, p = gb.build()
    prog = nf.compile_subgraph(g, payload=p, conv="cudnn")
    if [s.kind for s in prog.steps] != ["cudnn"]:
        raise AssertionError(f"the planner did not make one cudnn step: {prog}")
    y = nf.CUDAExecutor(prog, p, device).run([x])[xi + 1]
    return y.reshape(y_shape[:2] + y_shape[3:]) if rank == 1 else y


def _bound_check(ctx: FalsifyContext, name: str, cases: Any = None, more: dict[str, Any] | None = None) -> Outcome:
    """conv.error_bound's check of ``impl``; an item naming CONV-AXIS-REGIMES' witnesses runs them first."""
    impl = resolve(name)
    xp = array_module(ctx.device)
    tol = float(ctx.tolerance if ctx.tolerance is not None else 1.0)
    worst = {"ratio": 0.0}

    def reference(o: _Operands) -> Expected:
        c, b = o.case, o.bits
        val, mag = ref.conv_f64(
            b["x"].view(np.float32), b["w"].view(np.float32), b["b"].view(np.float32) if c.bias else None, **c.window()
        )
        k = c.cin_g * math.prod(a[1] for a in c.axes) + 1
        return Expected(value=val, bound=tol * (_gamma(k) * mag + k * 2.0**-149))

    def observe(j: engine.Judgement) -> None:
        e = j.expected[0]
        err = np.abs(np.asarray(j.native[0]).view(np.float32).astype(np.float64) - e.value)
        worst["ratio"] = max(worst["ratio"], float(np.max(err / np.maximum(e.bound, 1e-300), initial=0.0)))

    agreement = engine.item_agreement(
        ctx, "error_bound", bound_name="tol * (gamma_{K+1} (sum|w x| + |b|) + (K+1) 2^-149), K = cin_g * taps"
    )
    check = Check(
        name=name,
        inputs=lambda c: _operands(_finite_case(c), xp, "fwd"),
        native=_conv_native("fwd", impl, ctx.device),
        reference=reference,
        agreement=agreement,
        cases=conv_cases(3) if cases is None else cases,
        encode=lambda c: c.ints(),
        decode=lambda rp: ConvCase.of(rp.values),
        describe=lambda c: c.describe(),
        observe=observe,
        build={
            "impl": name,
            "tolerance": tol,
            "u": "2^-24",
            "reference": "spec.conv.conv_f64 (float64, exact products)",
            **(more or {}),
        },
        from_witness=lambda w: _finite_case(_conv_witness(ctx.seed, w)),
        regime_of=_conv_regimes(False),
        refuses=(ConvRefused,),
    )
    return engine.run(ctx, check, lambda: {"worst_error_over_bound": worst["ratio"]})


@register_test("conv.adjoint")
def adjoint(ctx: FalsifyContext) -> Outcome:
    """<conv(x), y> = <x, conv_T(y)> within tol * the two inner products' derived error bounds."""
    from native import conv as nc

    xp = array_module(ctx.device)
    tol = float(ctx.tolerance if ctx.tolerance is not None else 1.0)
    worst = {"ratio": 0.0}

    def inputs(c: ConvCase) -> _Operands:
        return _operands(_finite_case(c), xp, "fwd")

    def op_pad(c: ConvCase) -> tuple[int, ...]:
        return tuple(
            a[0] - ((o - 1) * a[2] - 2 * a[3] + a[4] * (a[1] - 1) + 1)
            for a, o in zip(c.axes, (ref.out_size(*a[:5]) for a in c.axes), strict=True)
        )

    def native(o: _Operands) -> np.ndarray:
        c, d, win = o.case, o.dev, o.case.window()
        fx = np.asarray(to_host(nc.conv(d["x"], d["w"], None, device=ctx.device, **win)), np.float64)
        ty = np.asarray(
            to_host(nc.conv_transpose(d["dy"], d["w"], None, output_padding=op_pad(c), device=ctx.device, **win)),
            np.float64,
        )
        x64, y64 = o.bits["x"].view(np.float32).astype(np.float64), o.bits["dy"].view(np.float32).astype(np.float64)
        return np.array([math.fsum((fx * y64).ravel()) - math.fsum((x64 * ty).ravel())])

    def reference(o: _Operands) -> Expected:
        c, b, win = o.case, o.bits, o.case.window()
        x, w, y = (b[k].view(np.float32) for k in ("x", "w", "dy"))
        _, mag_f = ref.conv_f64(x, w, None, **win)
        _, mag_t = ref.conv_transpose_f64(y, w, output_padding=op_pad(c), **win)
        k = c.cin_g * math.prod(a[1] for a in c.axes)
        kt = c.cout_g * math.prod(a[1] for a in c.axes)
        ya, xa = np.abs(y.astype(np.float64)), np.abs(x.astype(np.float64))
        lhs, rhs = float(np.sum(ya * mag_f)), float(np.sum(xa * mag_t))
        n = ya.size + xa.size
        bound = (
            _gamma(k) * lhs
            + _gamma(kt) * rhs
            + (k + kt) * 2.0**-149 * float(ya.sum() + xa.sum())
            + 2.0**-49 * n * (lhs + rhs)
        )
        return Expected(value=np.array([0.0]), bound=np.array([tol * bound]))

    def observe(j: engine.Judgement) -> None:
        b = float(j.expected[0].bound[0])
        worst["ratio"] = max(worst["ratio"], abs(float(j.native[0][0])) / b if b else 0.0)

    agreement = engine.item_agreement(
        ctx,
        "error_bound",
        bound_name="tol * (gamma_K sum|y|(|w|*|x|) + gamma_K' sum|x|(|w|^T*|y|) + underflow + float64 dot terms)",
    )
    check = Check(
        name="conv adjoint",
        inputs=inputs,
        native=native,
        reference=reference,
        agreement=agreement,
        cases=conv_cases(3),
        encode=lambda c: c.ints(),
        decode=lambda rp: ConvCase.of(rp.values),
        describe=lambda c: c.describe(),
        observe=observe,
        build={
            "identity": "<conv(x), y> - <x, conv_T(y)> = 0",
            "kernels": ["native.conv:conv", "native.conv:conv_transpose"],
        },
    )
    return engine.run(ctx, check, lambda: {"worst_gap_over_bound": worst["ratio"]})


# -- im2col ------------------------------------------------------------------------------------------------------


@register_test("conv.im2col_bitwise")
def im2col_bitwise(ctx: FalsifyContext) -> Outcome:
    """The im2col kernel's column matrix is bitwise the spec's (a copy of the padded windows, +0 in the padding)."""
    name = ctx.params.get("impl", "native.conv:im2col")
    impl = resolve(name)
    xp = array_module(ctx.device)

    def native(o: _Operands) -> Any:
        c, win = o.case, o.case.window()
        kernel = tuple(a[1] for a in c.axes)
        return _host_bits(impl(o.dev["x"], kernel, device=ctx.device, **win))

    def reference(o: _Operands) -> Expected:
        c, win = o.case, o.case.window()
        return Expected(bits=ref.im2col(o.bits["x"], tuple(a[1] for a in c.axes), **win))

    check = Check(
        name="im2col",
        inputs=lambda c: _operands(c, xp, "fwd"),
        native=native,
        reference=reference,
        agreement=engine.item_agreement(ctx, "bitwise"),
        cases=conv_cases(3),
        explicit=_explicit(ctx, False),
        encode=lambda c: c.ints(),
        decode=lambda rp: ConvCase.of(rp.values),
        describe=lambda c: c.describe(),
        build={
            "impl": name,
            "reference": "spec.conv.im2col",
            "layout": "(groups, (ci, k) row-major, (n, o) row-major)",
        },
    )
    return engine.run(ctx, check)


# -- smooth max pooling -----------------------------------------------------------------------------------------

EXP_REL = 2.0**-22  # libdevice expf: 2 ulp <= 2^-22 relative (normal results); subnormal: 2^-148 absolute
LOG_REL = 2.0**-23  # libdevice logf: 1 ulp <= 2^-23 relative
_SLACK = 1 + 2.0**-30  # the bound's own float64 evaluation


@dataclass(frozen=True)
class SmoothCase:
    """A smooth max pooling call: seed, input scale, planes, H, W, window, and beta = (8 + frac) / 8 * 2^exp."""

    seed: int
    scale: int
    planes: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    beta_exp: int
    beta_frac: int

    @property
    def beta(self) -> float:
        """The temperature, a binary32 value."""
        return float(np.float32((8 + self.beta_frac) / 8 * 2.0**self.beta_exp))

    def window(self) -> dict[str, Any]:
        """kernel, stride, padding tuples."""
        return {"kernel": (self.kh, self.kw), "stride": (self.sh, self.sw), "padding": (self.ph, self.pw)}


_SMOOTH_FIELDS = tuple(SmoothCase.__dataclass_fields__)
_POOL_KEYS = ("planes", "height", "width", "kh", "kw", "sh", "sw", "ph", "pw")  # pool2d_plan's parameters


@st.composite
def _smooth_cases(draw: Any, exps: tuple[int, int] = (-3, 6)) -> SmoothCase:
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    ph, pw = draw(st.integers(0, kh // 2)), draw(st.integers(0, kw // 2))
    return SmoothCase(
        draw(st.integers(0, 2**32 - 1)),
        draw(st.integers(-4, 4)),
        draw(st.integers(1, 3)),
        draw(st.integers(max(1, kh - 2 * ph), kh + 6)),
        draw(st.integers(max(1, kw - 2 * pw), kw + 6)),
        kh,
        kw,
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
        ph,
        pw,
        draw(st.integers(*exps)),
        draw(st.integers(0, 7)),
    )


def _smooth_inputs(c: SmoothCase) -> dict[str, Any]:
    rng = np.random.default_rng(c.seed)
    x = (rng.uniform(-1, 1, (c.planes, c.h, c.w)) * 2.0**c.scale).astype(np.float32)
    if c.seed % 3 == 0:  # ties and repeated maxima
        x = np.round(x).astype(np.float32)
    oh, ow = max(0, ref.out_size(c.h, c.kh, c.sh, c.ph)), max(0, ref.out_size(c.w, c.kw, c.sw, c.pw))
    dy = rng.uniform(-1, 1, (c.planes, oh, ow)).astype(np.float32)
    v = rng.uniform(-1, 1, x.shape).astype(np.float32)
    return {"case": c, "x": x, "dy": dy, "v": v}


def _gamma0(k: Any) -> Any:
    k = np.maximum(np.asarray(k, np.float64), 0)
    return k * U32 / (1 - k * U32)


def smooth_terms(x: np.ndarray, c: SmoothCase) -> dict[str, np.ndarray]:
    """Per window (planes, OH, OW): m, log S, S, the bound e_S on |s_hat - S|, per tap E and its error, taps."""
    taps, real, idx = ref.pool_windows_f64(x, **c.window())
    b = c.beta
    m = np.max(np.where(real[None], taps, -np.inf), axis=-1)
    d = np.where(real[None], taps - m[..., None], 0.0)  # <= 0
    with np.errstate(all="ignore"):
        big_e = np.where(real[None], np.exp(b * d), 0.0)
        # t = fl(x - m), u = fl(beta t): u = beta d (1 + e), |e| <= 2u + u^2; expf within 2^-22 relative
        a = np.expm1(np.abs(b * d) * (2 * U32 + U32 * U32)) * (1 + EXP_REL) + EXP_REL
        e_hi = np.exp(b * d * (1 - 2 * U32 - U32 * U32)) * (1 + EXP_REL)
        err = np.fmin(a * big_e, np.maximum(e_hi, big_e)) + 2.0**-148
    err = np.where(real[None], err, 0.0)
    k = real.sum(-1)[None]
    big_s = big_e.sum(-1)
    e_s = err.sum(-1) + _gamma0(k - 1) * (big_s + err.sum(-1))
    return {"m": m, "S": big_s, "logS": np.log(big_s), "e_S": e_s, "E": big_e, "err": err, "real": real, "idx": idx}


def smooth_forward_bound(t: dict[str, np.ndarray], beta: float) -> np.ndarray:
    """|y_hat - y| per window: log of the sum, logf (1 ulp), the division by beta and the final addition."""
    sigma = t["e_S"] / t["S"]  # S >= 1 (the maximum's term is 1)
    with np.errstate(all="ignore"):
        delta = np.where(sigma < 1, -np.log1p(-np.minimum(sigma, 1.0)), np.inf)  # |log s_hat - log S|
    lhat = (t["logS"] + delta) * (1 + LOG_REL)  # |logf(s_hat)|
    v_err = (U32 * lhat + LOG_REL * (t["logS"] + delta) + delta) / beta + 2.0**-150
    y_abs = np.abs(t["m"]) + lhat * (1 + U32) / beta
    return (v_err + U32 * (y_abs + v_err) + 2.0**-45 * (np.abs(t["m"]) + t["logS"] / beta)) * _SLACK


def smooth_backward_bound(t: dict[str, np.ndarray], dy: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """|dx_hat - dx| per input cell: p_hat = fl(e_hat / s_hat), fl(dy p_hat), then the fold over the windows."""
    p = t["E"] / t["S"][..., None]
    s_lo = np.maximum(t["S"] - t["e_S"], 1.0)[..., None]  # s_hat >= 1
    e_p = (t["err"] + p * t["e_S"][..., None]) / s_lo
    e_pp = e_p + U32 * (p + e_p) + 2.0**-150
    g = np.abs(dy.astype(np.float64))[..., None]
    e_q = g * e_pp + U32 * g * (p + e_pp) + 2.0**-150
    q_abs = g * (p + e_pp) * (1 + U32) + 2.0**-150
    planes, h, w = shape[0], shape[-2], shape[-1]
    flat = np.where(t["real"], t["idx"], h * w).reshape(-1)
    tot = np.zeros((planes, h * w + 1))
    mag = np.zeros((planes, h * w + 1))
    cnt = np.zeros(h * w + 1)
    real = t["real"]
    np.add.at(tot, (slice(None), flat), np.where(real[None], e_q, 0.0).reshape(planes, flat.size))
    np.add.at(mag, (slice(None), flat), np.where(real[None], q_abs, 0.0).reshape(planes, flat.size))
    np.add.at(cnt, flat, 1.0)
    bound = tot[:, :-1] + _gamma0(cnt[:-1] - 1)[None] * mag[:, :-1]
    return bound * _SLACK + 2.0**-45 * mag[:, :-1]


def _smooth_check(ctx: FalsifyContext, name: str, **kw: Any) -> Check:
    s = ctx.seed
    return Check(
        name=name,
        inputs=_smooth_inputs,
        encode=lambda c: tuple(getattr(c, f) for f in _SMOOTH_FIELDS),
        decode=lambda rp: SmoothCase(*rp.values[: len(_SMOOTH_FIELDS)]),
        describe=lambda c: {**{f: getattr(c, f) for f in _SMOOTH_FIELDS}, "beta": c.beta},
        explicit=(
            SmoothCase(s, 0, 2, 5, 5, 3, 3, 1, 1, 1, 1, 0, 0),
            SmoothCase(s + 1, 3, 1, 4, 7, 2, 3, 2, 1, 1, 0, 4, 5),
            SmoothCase(s + 2, -2, 2, 6, 6, 4, 2, 3, 2, 2, 1, -3, 3),
        ),
        # POOL-REGIMES' witnesses (the same plan): beta 1, values in [-1, 1] (seed 0 mod 3: rounded, ties)
        from_witness=lambda w: SmoothCase(
            s, 0, *(int(w[k]) for k in ("planes", "height", "width", "kh", "kw", "sh", "sw", "ph", "pw")), 0, 0
        ),
        regime_of=lambda c: regime_of(
            pool2d_plan, dict(zip(_POOL_KEYS, (getattr(c, f) for f in _SMOOTH_FIELDS[2:11]), strict=True))
        ),
        refuses=(ConvRefused,),
        **kw,
    )


@register_test("conv.smooth_bound")
def smooth_bound(ctx: FalsifyContext) -> Outcome:
    """Smooth max pooling (op fwd) or its backward (op bwd) within tolerance x the derived float64 bound."""
    op = ctx.params.get("op", "fwd")
    name = ctx.params.get(
        "impl", "native.conv:smooth_max_pool2d" if op == "fwd" else "native.conv:smooth_max_pool2d_backward"
    )
    impl = resolve(name)
    xp = array_module(ctx.device)
    tol = float(ctx.tolerance if ctx.tolerance is not None else 1.0)
    worst = {"ratio": 0.0}

    def native(d: dict[str, Any]) -> Any:
        c = d["case"]
        x = xp.asarray(d["x"])
        if op == "fwd":
            return _host_bits(impl(x, beta=c.beta, device=ctx.device, **c.window()))
        return _host_bits(impl(xp.asarray(d["dy"]), x, beta=c.beta, device=ctx.device, **c.window()))

    def reference(d: dict[str, Any]) -> Expected:
        c = d["case"]
        t = smooth_terms(d["x"], c)
        if op == "fwd":
            y = ref.smooth_max_pool2d_f64(d["x"], beta=c.beta, **c.window())[0]
            return Expected(value=y, bound=tol * smooth_forward_bound(t, c.beta).reshape(y.shape))
        dx = ref.smooth_max_pool2d_backward_f64(d["x"], d["dy"], beta=c.beta, **c.window())
        return Expected(value=dx, bound=tol * smooth_backward_bound(t, d["dy"], d["x"].shape).reshape(dx.shape))

    def observe(j: engine.Judgement) -> None:
        e = j.expected[0]
        err = np.abs(np.asarray(j.native[0]).view(np.float32).astype(np.float64) - e.value)
        worst["ratio"] = max(worst["ratio"], float(np.max(err / np.maximum(e.bound, 1e-300), initial=0.0)))

    agreement = engine.item_agreement(
        ctx,
        "error_bound",
        bound_name="tol x derived bound: fl(x - m), fl(beta t), expf 2 ulp, gamma_{k-1} fold, logf 1 ulp, / beta, + m"
        + ("" if op == "fwd" else "; fl(e / s), fl(dy p), gamma_{W-1} fold over the windows"),
    )
    check = _smooth_check(
        ctx,
        name,
        native=native,
        reference=reference,
        agreement=agreement,
        cases=_smooth_cases(),
        observe=observe,
        build={"impl": name, "op": op, "tolerance": tol, "exp_ulp": 2, "log_ulp": 1, "u": "2^-24"},
    )
    return engine.run(ctx, check, lambda: {"worst_error_over_bound": worst["ratio"]})


@register_test("conv.smooth_limits")
def smooth_limits(ctx: FalsifyContext) -> Outcome:
    """max <= smoothmax <= max + log(k)/beta (k real taps), for the float64 spec exactly and the kernel within bound."""
    name = ctx.params.get("impl", "native.conv:smooth_max_pool2d")
    impl = resolve(name)
    xp = array_module(ctx.device)
    tol = float(ctx.tolerance if ctx.tolerance is not None else 1.0)

    def native(d: dict[str, Any]) -> Any:
        c = d["case"]
        y = impl(xp.asarray(d["x"]), beta=c.beta, device=ctx.device, **c.window())
        spec_y = ref.smooth_max_pool2d_f64(d["x"], beta=c.beta, **c.window())[0]
        return [_host_bits(y), spec_y]

    def reference(d: dict[str, Any]) -> list[Expected]:
        c = d["case"]
        t = smooth_terms(d["x"], c)
        half = np.log(t["real"].sum(-1))[None] / (2 * c.beta)  # the interval [m, m + log k / beta]
        mid = t["m"] + half
        shape = (c.planes,) + t["m"].shape[1:]
        f64 = 2.0**-50 * (np.abs(t["m"]) + 2 * half + 1)  # the float64 spec's own rounding
        return [
            Expected(value=mid.reshape(shape), bound=(half + tol * smooth_forward_bound(t, c.beta)).reshape(shape)),
            Expected(value=mid.reshape(shape), bound=(half + f64).reshape(shape)),
        ]

    check = _smooth_check(
        ctx,
        name,
        native=native,
        reference=reference,
        agreement=engine.item_agreement(
            ctx, "error_bound", bound_name="m <= y <= m + log(k)/beta (+ tol x the forward bound for the kernel)"
        ),
        cases=_smooth_cases((-3, 20)),
        output_names=("kernel", "spec"),
        build={"impl": name, "tolerance": tol, "beta": "(1 + j/8) 2^e, e in [-3, 20]: y -> max as beta grows"},
    )
    return engine.run(ctx, check)


@register_test("conv.smooth_fd")
def smooth_fd(ctx: FalsifyContext) -> Outcome:
    """<dx_kernel, v> vs the central difference of the float64 forward along v, within the derived bounds."""
    name = ctx.params.get("impl", "native.conv:smooth_max_pool2d_backward")
    impl = resolve(name)
    xp = array_module(ctx.device)
    tol = float(ctx.tolerance if ctx.tolerance is not None else 1.0)

    def step(c: SmoothCase) -> float:
        return 2.0 ** (-12 - max(0, math.ceil(math.log2(c.beta))) + min(0, c.scale))

    def native(d: dict[str, Any]) -> np.ndarray:
        c = d["case"]
        dx = impl(xp.asarray(d["dy"]), xp.asarray(d["x"]), beta=c.beta, device=ctx.device, **c.window())
        dx64 = np.asarray(to_host(dx), np.float64)
        return np.array([math.fsum((dx64 * d["v"].astype(np.float64)).ravel())])

    def reference(d: dict[str, Any]) -> Expected:
        c = d["case"]
        h = step(c)
        x64, v64, dy64 = (d[k].astype(np.float64) for k in ("x", "v", "dy"))
        fp = ref.smooth_max_pool2d_f64(x64 + h * v64, beta=c.beta, **c.window())[0]
        fm = ref.smooth_max_pool2d_f64(x64 - h * v64, beta=c.beta, **c.window())[0]
        fd = math.fsum((dy64 * (fp - fm) / (2 * h)).ravel())
        t = smooth_terms(d["x"], c)
        taps_v, _, _ = ref.pool_windows_f64(np.abs(v64), **c.window())
        vmax = taps_v.max(-1)  # V per window
        b = c.beta
        trunc = h * h * b * b * vmax**3 / 3  # |F'''| <= 2 beta^2 V^3 (third central moment), / 6
        taps_x, _, _ = ref.pool_windows_f64(np.abs(x64) + h * np.abs(v64), **c.window())
        span = 2 * b * taps_x.max(-1)  # |beta (x - m)| at most
        k = t["real"].sum(-1)[None]
        rho = 2.0**-52 * (np.abs(t["m"]) + taps_x.max(-1) + (t["logS"] + 1 + (k + 2) * (1 + span)) / b) * 4
        fd_err = float(np.sum(np.abs(dy64) * (trunc + rho / h))) * 2  # two evaluations' rounding, and the sum
        bwd = smooth_backward_bound(t, d["dy"], d["x"].shape).reshape(d["x"].shape)
        dx_ref = ref.smooth_max_pool2d_backward_f64(d["x"], d["dy"], beta=b, **c.window())
        kern = float(np.sum(np.abs(v64) * bwd)) + 2.0**-50 * float(np.sum(np.abs(v64) * (np.abs(dx_ref) + bwd)))
        return Expected(value=np.array([fd]), bound=np.array([tol * (kern + fd_err)]))

    check = _smooth_check(
        ctx,
        name,
        native=native,
        reference=reference,
        agreement=engine.item_agreement(
            ctx,
            "error_bound",
            bound_name="tol x (sum |v| x the backward bound + sum |dy| (h^2 beta^2 V^3 / 3 + float64 rounding / h))",
        ),
        cases=_smooth_cases((-3, 4)),
        build={"impl": name, "tolerance": tol, "difference": "central, h = 2^-(12 + ceil log2 beta) (scaled)"},
    )
    return engine.run(ctx, check)
