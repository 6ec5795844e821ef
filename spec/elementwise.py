"""Reference meaning of the elementwise family: what each kernel must compute, independent of any kernel.

Correctly rounded operations (``exact``) are defined by the softfloat reference under a float
environment; they take and return uint32 bit arrays (NumPy or CuPy: the reference runs where the data
is). Transcendentals (``approx``) are defined by their real-valued function, evaluated in float64 and
rounded once to binary32; where that float64 value lies within a few float64 ulps of a binary32 rounding
boundary the rounding is ambiguous and both neighbours are accepted (:class:`Reference` ``alt``).
Backward rules (``backward``) state the derivative convention and a float64 forward function for central
finite differences.

Conventions (kernel-families.md): relu, clamp and every arithmetic result map a NaN input to the
environment's NaN (in the ``cuda`` environments that is 0x7FFFFFFF); neg/abs are sign-bit operations
(payload kept, never flushed); min/max are C ``fminf``/``fmaxf`` (a NaN operand is dropped); clamp is
``fmin(fmax(x, lo), hi)`` after the NaN rule; abs'(0) = 0; sqrt'(x) = 1/(2 sqrt x) for x > 0 else 0;
clamp passes the gradient strictly inside (lo, hi); min/max split it 0.5/0.5 on ties; gelu is the tanh
approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from spec import softfloat as sf

__all__ = [
    "RefOp",
    "Reference",
    "REFERENCES",
    "register_reference",
    "get_reference",
    "array_namespace",
    "canonical_nan",
    "round_f64_to_f32",
    "GELU_C",
    "bits_to_f64",
    "f64_to_f32_bits",
    "GELU_K",
]

GELU_C = 0.044715
GELU_K = math.sqrt(2.0 / math.pi)

# Relative distance (in float64) from a binary32 rounding midpoint under which the float64 evaluation of
# a transcendental cannot decide the rounding: float64 exp/log/tanh are within ~1 float64 ulp (2^-52)
# and the composite sigmoid/gelu formulas within ~16, so 2^-44 leaves a wide margin.
AMBIGUITY_REL = 2.0**-44


def array_namespace(a: Any) -> ModuleType:
    """numpy or cupy, whichever owns ``a``."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


@dataclass(frozen=True)
class Reference:
    """Reference bits; where rounding is ambiguous ``alt`` holds the other accepted neighbour (else None)."""

    bits: Any
    alt: Any = None


@dataclass(frozen=True)
class RefOp:
    """One reference operation: name, array arity, scalar names, kind and the function defining it.

    ``exact``: ``fn(*bits, *scalar_bits, env=...) -> bits``. ``approx``: ``fn(*float64) -> float64``
    (the real function). ``backward``: ``fn(*float64 inputs, dy) -> tuple of float64 gradients`` gives
    the convention at kinks, and ``forward`` is the float64 function differentiated by finite differences.
    """

    name: str
    arity: int
    kind: str
    fn: Callable[..., Any]
    scalars: tuple[str, ...] = ()
    forward: Callable[..., Any] | None = None
    kinks: Callable[..., Any] | None = None
    doc: str = ""
    # backward rules: where the convention is the meaning (outside the forward's real domain, e.g. sqrt of x < 0)
    outside: Callable[..., Any] | None = None

    def evaluate(self, *bits: Any, env: str = "cuda") -> Reference:
        """Reference bits for ``exact``/``approx`` ops from uint32 operand bits (arrays, then scalars)."""
        if self.kind == "exact":
            return Reference(self.fn(*bits, env=env))
        if self.kind == "approx":
            xp = array_namespace(bits[0])
            with np.errstate(all="ignore"):
                xs = [bits_to_f64(_flush(xp.asarray(b, dtype=xp.uint32), env)) for b in bits]
                r64 = self.fn(*xs)
            ref, alt = round_f64_to_f32(r64)
            ref, alt = _flush(ref, env), _flush(alt, env)
            return Reference(_canon(ref, env), _canon(alt, env))
        raise TypeError(f"{self.name} is a {self.kind} op; use its forward/fn directly")


REFERENCES: dict[str, RefOp] = {}


def register_reference(op: RefOp) -> RefOp:
    """Add a reference op by name (names are unique)."""
    if op.name in REFERENCES:
        raise ValueError(f"reference {op.name!r} is registered twice")
    REFERENCES[op.name] = op
    return op


def get_reference(name: str) -> RefOp:
    """The reference op ``name``; KeyError lists the known ones."""
    try:
        return REFERENCES[name]
    except KeyError:
        raise KeyError(f"unknown elementwise reference {name!r}; known: {sorted(REFERENCES)}") from None


def canonical_nan(env: str) -> int:
    """The NaN bits that arithmetic produces in ``env`` (Inf - Inf), as computed by softfloat."""
    inf = np.array([0x7F800000], dtype=np.uint32)
    return int(sf.sub(inf, inf, env=env)[0])


def _is_nan(u: Any) -> Any:
    return ((u & 0x7F800000) == 0x7F800000) & ((u & 0x007FFFFF) != 0)


def _flush(u: Any, env: str) -> Any:
    """Subnormals to signed zero where ``env`` flushes (DAZ on inputs, FTZ on results)."""
    if u is None or not env.endswith("-ftz"):
        return u
    xp = array_namespace(u)
    sub = ((u & 0x7F800000) == 0) & ((u & 0x007FFFFF) != 0)
    return xp.where(sub, u & xp.uint32(0x80000000), u).astype(xp.uint32)


def _canon(u: Any, env: str) -> Any:
    """Every NaN to the environment's NaN: an approximate op's NaN has no payload rule of its own."""
    if u is None:
        return u
    xp = array_namespace(u)
    return xp.where(_is_nan(u), xp.uint32(canonical_nan(env)), u).astype(xp.uint32)


def bits_to_f64(u: Any) -> Any:
    """Exact float64 values of binary32 bits, subnormals included, on NumPy or CuPy.

    Not ``u.view(float32).astype(float64)``: CuPy compiles its casts with -ftz=true, which reads a
    subnormal input as zero; here subnormals are scaled in float64 arithmetic, which never flushes.
    """
    xp = array_namespace(u)
    with np.errstate(all="ignore"):
        plain = u.view(xp.float32).astype(xp.float64)
        sub = ((u & 0x7F800000) == 0) & ((u & 0x007FFFFF) != 0)
        mag = (u & xp.uint32(0x007FFFFF)).astype(xp.float64) * 2.0**-149
        return xp.where(sub, xp.where((u >> 31) == 1, -mag, mag), plain)


def f64_to_f32_bits(r: Any) -> Any:
    """binary32 bits of float64 ``r`` rounded to nearest-even, subnormal results included (no flush)."""
    xp = array_namespace(r)
    with np.errstate(all="ignore"):
        plain = r.astype(xp.float32).view(xp.uint32)
        tiny = xp.abs(r) < 2.0**-126
        # rint(|r| 2^149) is the subnormal significand; 2^23 is exactly the bits of 2^-126.
        m = xp.rint(xp.where(tiny, xp.abs(r), 0.0) * 2.0**149).astype(xp.uint32)
        sign = xp.signbit(r).astype(xp.uint32) << xp.uint32(31)
        return xp.where(tiny, sign | m, plain).astype(xp.uint32)


def round_f64_to_f32(r64: Any) -> tuple[Any, Any]:
    """(RNE binary32 bits of r64, the other neighbour's bits where the rounding is ambiguous else same)."""
    xp = array_namespace(r64)
    with np.errstate(all="ignore"):
        return _round_f64_to_f32(xp, r64)


def _round_f64_to_f32(xp: ModuleType, r64: Any) -> tuple[Any, Any]:
    u = f64_to_f32_bits(r64)
    back = bits_to_f64(u)
    finite = xp.isfinite(r64) & xp.isfinite(back)
    # The neighbour on the other side of r64, by stepping the bit pattern (no float op that could flush).
    up_mag = (r64 > back) == (back > 0)
    zero = (u & xp.uint32(0x7FFFFFFF)) == 0
    other = xp.where(
        zero,
        (xp.signbit(r64).astype(xp.uint32) << xp.uint32(31)) | xp.uint32(1),
        xp.where(up_mag, u + xp.uint32(1), u - xp.uint32(1)),
    ).astype(xp.uint32)
    mid = (back + bits_to_f64(other)) * 0.5  # exact: 25 significant bits
    amb = finite & (back != r64) & (xp.abs(r64 - mid) <= AMBIGUITY_REL * xp.abs(r64))
    alt = xp.where(amb, other, u).astype(xp.uint32)
    return u, alt


# -- exact (softfloat-defined) operations ---------------------------------------------------------


def _nan_to_env(x: Any, y: Any, env: str) -> Any:
    """``y`` but the environment's NaN where ``x`` is NaN (kernels compute x + x there)."""
    xp = array_namespace(x)
    return xp.where(_is_nan(x), sf.add(x, x, env=env), y).astype(xp.uint32)


def _relu(x: Any, *, env: str) -> Any:
    xp = array_namespace(x)
    zero = xp.zeros_like(x)
    pos = xp.asarray(sf.lt(zero, x, env=env))
    return _nan_to_env(x, xp.where(pos, _flush(x, env), zero), env)


def _clamp(x: Any, lo: Any, hi: Any, *, env: str) -> Any:
    return _nan_to_env(x, sf.fmin(sf.fmax(x, lo, env=env), hi, env=env), env)


def _sf2(name: str) -> Callable[..., Any]:
    def fn(a: Any, b: Any, *, env: str) -> Any:
        return getattr(sf, name)(a, b, env=env)

    return fn


for _name, _sfname in (
    ("add", "add"),
    ("sub", "sub"),
    ("mul", "mul"),
    ("div", "div"),
    ("min", "fmin"),
    ("max", "fmax"),
):
    register_reference(RefOp(_name, 2, "exact", _sf2(_sfname), doc=f"softfloat {_sfname}"))
register_reference(
    RefOp("fma", 3, "exact", lambda a, b, c, *, env: sf.fma(a, b, c, env=env), doc="fused a*b+c, one rounding")
)
register_reference(RefOp("sqrt", 1, "exact", lambda a, *, env: sf.sqrt(a, env=env), doc="softfloat sqrt"))
register_reference(
    RefOp(
        "inv",
        1,
        "exact",
        lambda a, *, env: sf.div(array_namespace(a).full_like(a, 0x3F800000), a, env=env),
        doc="1/x, one rounding",
    )
)
register_reference(RefOp("neg", 1, "exact", lambda a, *, env: sf.neg(a), doc="sign-bit flip"))
register_reference(RefOp("abs", 1, "exact", lambda a, *, env: sf.abs(a), doc="sign-bit clear"))
register_reference(RefOp("relu", 1, "exact", _relu, doc="x if x > 0 else +0; NaN -> env NaN"))
register_reference(
    RefOp(
        "scale",
        1,
        "exact",
        lambda x, c, *, env: sf.mul(x, c, env=env),
        scalars=("c",),
        doc="x*c, one rounding",
    )
)
register_reference(
    RefOp(
        "axpy",
        2,
        "exact",
        lambda a, b, c, *, env: sf.add(a, sf.mul(c, b, env=env), env=env),
        scalars=("c",),
        doc="a + c*b with the product and the sum each rounded (no contraction)",
    )
)
register_reference(
    RefOp(
        "axpy_fused",
        2,
        "exact",
        lambda a, b, c, *, env: sf.fma(c, b, a, env=env),
        scalars=("c",),
        doc="a + c*b as one fused multiply-add",
    )
)
register_reference(
    RefOp(
        "muladd",
        3,
        "exact",
        lambda x, y, z, *, env: sf.add(sf.mul(x, y, env=env), z, env=env),
        doc="x*y + z with the product and the sum each rounded",
    )
)
register_reference(
    RefOp("clamp", 1, "exact", _clamp, scalars=("lo", "hi"), doc="fmin(fmax(x, lo), hi); NaN x -> env NaN")
)


# -- transcendentals: the real function, evaluated in float64 -------------------------------------


def _xp64(x: Any) -> ModuleType:
    return array_namespace(x)


def _sigmoid64(x: Any) -> Any:
    xp = _xp64(x)
    e = xp.exp(-xp.abs(x))  # never overflows; e in (0, 1]
    return xp.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gelu64(x: Any) -> Any:
    # 0.5 x (1 + tanh z) == x * sigmoid(2 z): the same real function without float64 cancellation.
    z = GELU_K * (x + GELU_C * x * x * x)
    return x * _sigmoid64(2.0 * z)


register_reference(RefOp("exp", 1, "approx", lambda x: _xp64(x).exp(x), doc="e^x"))
register_reference(RefOp("log", 1, "approx", lambda x: _xp64(x).log(x), doc="natural log"))
register_reference(RefOp("tanh", 1, "approx", lambda x: _xp64(x).tanh(x), doc="tanh"))
register_reference(RefOp("sigmoid", 1, "approx", _sigmoid64, doc="1 / (1 + e^-x)"))
register_reference(RefOp("gelu", 1, "approx", _gelu64, doc="tanh-approximation GELU"))


# -- backward rules: conventions at kinks, float64 forward for finite differences ------------------


def _where(c: Any, a: Any, b: Any) -> Any:
    return _xp64(c).where(c, a, b)


def _gelu_grad64(x: Any) -> Any:
    xp = _xp64(x)
    z = GELU_K * (x + GELU_C * x**3)
    s = _sigmoid64(2.0 * z)
    dz = GELU_K * (1.0 + 3.0 * GELU_C * x * x)
    return s + x * 2.0 * s * (1.0 - s) * dz + 0.0 * xp.zeros_like(x)


register_reference(
    RefOp(
        "relu_bwd",
        1,
        "backward",
        lambda x, dy: (_where(x > 0, dy, 0.0 * dy),),
        forward=lambda x: _xp64(x).maximum(x, 0.0),
        kinks=lambda x: (x,),
        doc="dx = dy where x > 0 else 0 (relu'(0) = 0)",
    )
)
register_reference(
    RefOp(
        "abs_bwd",
        1,
        "backward",
        lambda x, dy: (_where(x > 0, dy, _where(x < 0, -dy, 0.0 * dy)),),
        forward=lambda x: _xp64(x).abs(x),
        kinks=lambda x: (x,),
        doc="dx = sign(x) dy, abs'(0) = 0",
    )
)
register_reference(
    RefOp(
        "sqrt_bwd",
        1,
        "backward",
        lambda x, dy: (_where(x > 0, dy / (2.0 * _xp64(x).sqrt(_xp64(x).abs(x))), 0.0 * dy),),
        forward=lambda x: _xp64(x).sqrt(x),
        kinks=lambda x: (x,),
        doc="dx = dy / (2 sqrt x) for x > 0 else 0",
        outside=lambda x: x <= 0,
    )
)
register_reference(
    RefOp(
        "clamp_bwd",
        1,
        "backward",
        lambda x, dy, lo, hi: (_where((x > lo) & (x < hi), dy, 0.0 * dy),),
        scalars=("lo", "hi"),
        forward=lambda x, lo, hi: _xp64(x).minimum(_xp64(x).maximum(x, lo), hi),
        kinks=lambda x, lo, hi: (x - lo, x - hi),
        doc="gradient passes strictly inside (lo, hi)",
    )
)
register_reference(
    RefOp(
        "min_bwd",
        2,
        "backward",
        lambda a, b, dy: (
            _where(a < b, dy, _where(a == b, 0.5 * dy, 0.0 * dy)),
            _where(b < a, dy, _where(a == b, 0.5 * dy, 0.0 * dy)),
        ),
        forward=lambda a, b: _xp64(a).minimum(a, b),
        kinks=lambda a, b: (a - b,),
        doc="gradient to the smaller operand; 0.5/0.5 on ties",
    )
)
register_reference(
    RefOp(
        "max_bwd",
        2,
        "backward",
        lambda a, b, dy: (
            _where(a > b, dy, _where(a == b, 0.5 * dy, 0.0 * dy)),
            _where(b > a, dy, _where(a == b, 0.5 * dy, 0.0 * dy)),
        ),
        forward=lambda a, b: _xp64(a).maximum(a, b),
        kinks=lambda a, b: (a - b,),
        doc="gradient to the larger operand; 0.5/0.5 on ties",
    )
)
register_reference(
    RefOp(
        "gelu_bwd",
        1,
        "backward",
        lambda x, dy: (dy * _gelu_grad64(x),),
        forward=_gelu64,
        kinks=None,
        doc="analytic derivative of the tanh-approximation GELU",
    )
)
register_reference(
    RefOp(
        "tanh_bwd",
        1,
        "backward",
        lambda x, dy: (dy * (1.0 - _xp64(x).tanh(x) ** 2),),
        forward=lambda x: _xp64(x).tanh(x),
        kinks=None,
        doc="dx = dy (1 - tanh(x)^2) (MK-11e)",
    )
)
register_reference(
    RefOp(
        "sigmoid_bwd",
        1,
        "backward",
        lambda x, dy: (dy * _sigmoid64(x) * (1.0 - _sigmoid64(x)),),
        forward=_sigmoid64,
        kinks=None,
        doc="dx = dy s (1 - s), s = sigmoid(x) (MK-11f)",
    )
)
# The smallest binary64 value that rounds to +Inf in binary32 (FLT_MAX plus half an ulp).
_F32_OVERFLOW = 2.0**128 - 2.0**103


def _exp32(x: Any) -> Any:
    """exp(x) as the binary32 intermediate the kernel holds: +Inf once it rounds past FLT_MAX."""
    xp = _xp64(x)
    with np.errstate(over="ignore"):
        e = xp.exp(x)
    return xp.where(e >= _F32_OVERFLOW, xp.inf, e)


register_reference(
    RefOp(
        "exp_bwd",
        1,
        "backward",
        lambda x, dy: (dy * _exp32(x),),
        forward=lambda x: _xp64(x).exp(x),
        kinks=None,
        doc="dx = dy exp(x) (MK-11a); exp(x) is a binary32 value: +Inf past the overflow threshold (dy 0 gives NaN)",
        outside=lambda x: _exp32(x) == _xp64(x).inf,
    )
)
register_reference(
    RefOp(
        "log_bwd",
        1,
        "backward",
        lambda x, dy: (dy / x,),
        forward=lambda x: _xp64(x).log(x),
        kinks=lambda x: (x,),
        doc="dx = dy / x (MK-11b); for x <= 0, outside log's domain, the same formula is the convention (autograd's)",
        outside=lambda x: x <= 0,
    )
)
register_reference(
    RefOp(
        "inv_bwd",
        1,
        "backward",
        lambda x, dy: (-(dy / (x * x)),),
        forward=lambda x: 1.0 / x,
        kinks=lambda x: (x,),
        doc="dx = -dy / x^2 (MK-11d); at x = 0 the formula's infinity is the convention",
    )
)
register_reference(
    RefOp(
        "div_bwd",
        2,
        "backward",
        lambda a, b, dy: (dy / b, -((dy * a) / (b * b))),
        forward=lambda a, b: a / b,
        kinks=lambda a, b: (b,),
        doc="da = dy / b, db = -(dy a) / b^2 (MK-11c); at b = 0 the formulas' infinities are the convention",
    )
)
