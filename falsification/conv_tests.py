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
* ``conv.adjoint`` {} — <conv(x), y> and <x, conv_T(y)> (kernel outputs, inner products in float64) differ by
  at most tolerance * (gamma_K sum|y| (|w| * |x|) + gamma_K sum|x| (|w|^T * |y|) + 2^-49 (...)).
"""

from __future__ import annotations

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
from obligations.core.device import array_module, to_host
from obligations.core.plans import resolve
from obligations.core.results import Outcome
from spec import conv as ref

__all__ = ["ConvCase", "conv_cases", "MIX_NAMES", "U32"]

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
        outs = tuple(ref.tconv_out_size(*a) for a in case.axes)
        y_shape = (case.batch, c_out) + outs
    else:
        x_shape, w_shape = (case.batch, c_in) + sizes, (c_out, case.cin_g) + kernel
        outs = tuple(ref.out_size(*a[:5]) for a in case.axes)
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
    mix: int  # 0: few distinct values (ties, signed zeros, a NaN sometimes); else a MIX_NAMES index
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
        draw(st.integers(0, len(MIX_NAMES))),
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


def _pool_bits(c: PoolCase, n: int, salt: int) -> np.ndarray:
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
    op = ctx.params.get("op", "max")
    name = ctx.params.get("impl", _DEFAULT_IMPL[op])
    impl = resolve(name)
    xp = array_module(ctx.device)

    def inputs(c: PoolCase) -> dict[str, Any]:
        x = _pool_bits(c, c.planes * c.h * c.w, 0).reshape(c.planes, c.h, c.w)
        oh, ow = ref.out_size(c.h, c.kh, c.sh, c.ph), ref.out_size(c.w, c.kw, c.sw, c.pw)
        dy = _bits(c.seed + 7, c.planes * oh * ow, "moderate").reshape(c.planes, oh, ow)
        return {"case": c, "x": x, "dy": dy, "arg": ref.max_pool2d(x, **c.window())[1]}

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

    s = ctx.seed
    explicit = (
        PoolCase(s, 0, 2, 5, 5, 3, 3, 1, 1, 1, 1),
        PoolCase(s + 1, 0, 1, 4, 7, 2, 3, 2, 1, 1, 0),
        PoolCase(s + 2, 3, 2, 6, 6, 4, 2, 3, 2, 2, 1),
    )
    fields = tuple(PoolCase.__dataclass_fields__)
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
        build={
            "impl": name,
            "op": op,
            "reference": "spec.conv (softfloat, env cuda)",
            "ties": "first real tap in row-major order (NaN above all, +0 above -0)",
        },
    )
    return engine.run(ctx, check)


# -- error bound and adjoint -------------------------------------------------------------------------------


def _finite_case(c: ConvCase) -> ConvCase:
    return ConvCase(c.seed, 0, c.batch, c.groups, c.cin_g, c.cout_g, c.bias, c.axes)


@register_test("conv.error_bound")
def error_bound(ctx: FalsifyContext) -> Outcome:
    """|conv - exact| <= tol * (gamma_{K+1} (sum|w x| + |b|) + (K + 1) 2^-149), K = cin_g * taps."""
    name = ctx.params.get("impl", _DEFAULT_IMPL["fwd"])
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
        cases=conv_cases(3),
        encode=lambda c: c.ints(),
        decode=lambda rp: ConvCase.of(rp.values),
        describe=lambda c: c.describe(),
        observe=observe,
        build={
            "impl": name,
            "tolerance": tol,
            "u": "2^-24",
            "reference": "spec.conv.conv_f64 (float64, exact products)",
        },
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
