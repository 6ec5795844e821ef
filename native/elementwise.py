"""Elementwise kernels: one CUDA source template and one NumPy implementation per kernel, both checked.

Every kernel is a grid-stride loop over flat float32 buffers with a 64-bit index; its launch geometry
comes from :func:`launch_plan` alone, which is written in plain integer arithmetic with the helpers of
:mod:`obligations.core.symbolic` so that the checker proves coverage/bounds/overflow of exactly the code the
launcher runs. The host backend is a NumPy implementation of the same kernel under the same float
environment (IEEE binary32 with subnormals, then the environment's NaN rule), so one contract item checks
both backends. Transcendentals on the host evaluate expf/logf/tanhf in float64 and round once to float32
(a correctly rounded model of the CUDA functions); composite kernels (sigmoid, gelu and the backward
rules) repeat the CUDA formula step by step in float32 around those.

Planted-bug variants (fast math, tail off-by-one, NaN returned as a number, contraction, a 32-bit index
that wraps) are registry entries selected with ``variant=``; they exist so tests can show that the
contract items catch them, and are never used by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from native.nvrtc import INDEX_TYPES, compile_function, get_route
from obligations.core.device import array_module, resolve_device
from obligations.core.entrypoints import entry_point
from obligations.core.symbolic import as_type, cdiv, smax, smin

__all__ = [
    "DEFAULT_BLOCK",
    "DEFAULT_MAX_GRID",
    "launch_plan",
    "Variant",
    "Kernel",
    "KERNELS",
    "register_kernel",
    "get_kernel",
    "kernel_source",
    "kernel_plan",
    "INDEX_TYPES",
    "RouteUnsupported",
    "host_supports",
    "HOST_ENVS",
    "run_flat",
    "apply",
    "prepare_operands",
    "flush_subnormals",
]

DEFAULT_BLOCK = 256
# 65,536 blocks of 256 threads saturate an H100/H200 many times over; larger inputs loop (grid-stride).
DEFAULT_MAX_GRID = 65536


def launch_plan(n: Any, block: Any = DEFAULT_BLOCK, max_grid: Any = DEFAULT_MAX_GRID, index_bits: int = 64) -> dict:
    """Launch geometry for ``n`` elements: grid/block/stride and the per-thread trip count.

    Plain integer arithmetic plus cdiv/smin/smax only, so the checker can run it on symbolic terms.
    ``grid >= 1`` even for n == 0 (a launch of zero blocks is an error; the guard makes it a no-op).
    """
    grid = smin(smax(cdiv(n, block), 1), max_grid)
    stride = grid * block
    index_type = "int64" if index_bits == 64 else "int32"

    def thread_index(block_id: Any, thread_id: Any) -> Any:
        """First index of a thread, computed in the kernel's index type (blockIdx.x * blockDim.x + threadIdx.x)."""
        return as_type(block_id, index_type) * as_type(block, index_type) + as_type(thread_id, index_type)

    def step(i: Any) -> Any:
        """The grid-stride increment ``i += stride`` in the kernel's index type."""
        return as_type(i, index_type) + as_type(stride, index_type)

    return {
        "thread_index": thread_index,
        "step": step,
        "n": n,
        "block": block,
        "grid": grid,
        "stride": stride,
        "iterations": cdiv(n, stride),
        "max_grid": max_grid,
        "index_bits": index_bits,
        # The loop's paths: no element, every thread at most one trip, a grid-stride loop, the grid at its cap.
        "regimes": {
            "empty": n == 0,
            "one_trip": (n > 0) & (cdiv(n, stride) <= 1),
            "grid_stride": cdiv(n, stride) > 1,
            "grid_capped": (n > 0) & (cdiv(n, block) >= max_grid),
        },
    }


class RouteUnsupported(ValueError):
    """The host backend cannot realise this compile route (e.g. compiler-chosen contraction)."""


@dataclass(frozen=True)
class Variant:
    """A planted-bug (or alternative) build of a kernel; any field left None keeps the kernel's own."""

    name: str
    body: str | None = None
    route: str | None = None
    guard: str | None = None
    index_type: str | None = None
    host: Callable[..., tuple] | None = None
    host_env: str | None = None
    host_tail: str | None = None  # "short": last element unwritten; "over": writes element n too
    doc: str = ""


@dataclass(frozen=True)
class Kernel:
    """An elementwise kernel: array inputs, float scalars, outputs, CUDA body and NumPy implementation.

    ``kind``: "exact" (bitwise vs softfloat), "approx" (max-ULP vs correctly rounded), "backward".
    ``bitop``: the result is a sign-bit/select operation (no flushing, NaN payload kept).
    ``reference``: the spec.elementwise op this kernel promises by default.
    """

    name: str
    inputs: tuple[str, ...]
    body: str
    host: Callable[..., tuple]
    kind: str = "exact"
    scalars: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ("r",)
    bitop: bool = False
    reference: str = ""
    variants: dict[str, Variant] = field(default_factory=dict)
    doc: str = ""

    def variant(self, name: str | None) -> Variant:
        """The named variant (None or "default": the kernel itself)."""
        if name in (None, "default"):
            return Variant("default")
        try:
            return self.variants[name]
        except KeyError:
            raise KeyError(f"kernel {self.name!r} has no variant {name!r}; has {sorted(self.variants)}") from None


KERNELS: dict[str, Kernel] = {}


def register_kernel(k: Kernel) -> Kernel:
    """Add a kernel by name (names are unique)."""
    if k.name in KERNELS:
        raise ValueError(f"kernel {k.name!r} is registered twice")
    KERNELS[k.name] = k
    return k


def get_kernel(name: str) -> Kernel:
    """The kernel ``name``; KeyError lists the known ones."""
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"unknown elementwise kernel {name!r}; known: {sorted(KERNELS)}") from None


# -- CUDA source ----------------------------------------------------------------------------------

_TEMPLATE = """\
#define KC_GELU_C 0.044715f
#define KC_GELU_K 0.7978845608028654f
extern "C" __global__ void {fname}({params}long long n) {{
    for ({idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x; {guard};
         i += ({idx})blockDim.x * gridDim.x) {{
{loads}        float r = 0.0f, r2 = 0.0f;
        {body}
{stores}    }}
}}
"""


# The C index type of each index width a launch plan proves (the source reads it from the plan).


def kernel_source(name: str, variant: str | None = None, plan: dict | None = None) -> tuple[str, str]:
    """(CUDA source, function name) of kernel ``name`` built as ``variant``; its index type is ``plan``'s."""
    k = get_kernel(name)
    v = k.variant(variant)
    plan = plan if plan is not None else kernel_plan(name, 1, variant)
    fname = f"kc_{k.name}" + (f"_{v.name}" if v.name != "default" else "")
    params = "".join(f"const float* __restrict__ in_{a}, " for a in k.inputs)
    params += "".join(f"float* __restrict__ out_{o}, " for o in k.outputs)
    params += "".join(f"const float {s}, " for s in k.scalars)
    loads = "".join(f"        const float {a} = in_{a}[i];\n" for a in k.inputs)
    stores = "".join(f"        out_{o}[i] = {o};\n" for o in k.outputs)
    src = _TEMPLATE.format(
        fname=fname,
        params=params,
        idx=INDEX_TYPES[int(plan["index_bits"])],
        guard=v.guard or "i < n",
        loads=loads,
        body=v.body or k.body,
        stores=stores,
    )
    return src, fname


def kernel_plan(
    name: str,
    n: int,
    variant: str | None = None,
    block: int = DEFAULT_BLOCK,
    max_grid: int = DEFAULT_MAX_GRID,
) -> dict:
    """The launch plan a kernel build uses for ``n`` elements (index_bits from its index type)."""
    v = get_kernel(name).variant(variant)
    return launch_plan(n, block, max_grid, index_bits=32 if v.index_type == "int" else 64)


# -- host implementations -------------------------------------------------------------------------

F32 = np.float32


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """Subnormal float32 values to zero of the same sign (DAZ/FTZ)."""
    u = x.view(np.uint32)
    sub = ((u & 0x7F800000) == 0) & ((u & 0x007FFFFF) != 0)
    return np.where(sub, u & np.uint32(0x80000000), u).astype(np.uint32).view(F32)


def _cr(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """Host model of a CUDA float function: evaluate in float64, round once to float32."""
    return lambda x: fn(x.astype(np.float64)).astype(F32)


_expf, _logf, _tanhf = _cr(np.exp), _cr(np.log), _cr(np.tanh)
_ONE, _TWO, _HALF, _ZERO = F32(1), F32(2), F32(0.5), F32(0)
_GC, _GK = F32(0.044715), F32(0.7978845608028654)


def _sigmoid_host(x: np.ndarray) -> np.ndarray:
    e = _expf(-np.abs(x))
    return np.where(x >= 0, _ONE / (_ONE + e), e / (_ONE + e)).astype(F32)


def _gelu_t(x: np.ndarray) -> np.ndarray:
    return _TWO * (_GK * (x + _GC * (x * x * x)))


def _gelu_host(x: np.ndarray) -> np.ndarray:
    return (x * _sigmoid_host(_gelu_t(x))).astype(F32)


def _gelu_bwd_host(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    s = _sigmoid_host(_gelu_t(x))
    dz = _GK * (_ONE + (F32(3) * _GC) * (x * x))
    g = _TWO * s * (_ONE - s)
    return (dy * np.where(g == 0, s, s + x * g * dz)).astype(F32)


def _minmax_host(a: np.ndarray, b: np.ndarray, want_min: bool) -> np.ndarray:
    """C fminf/fmaxf: a NaN operand is dropped, -0 < +0 (IEEE 754-2019 minimumNumber/maximumNumber).

    Written with comparisons, not np.fmin/np.fmax: those return a signaling NaN operand (quieted) instead
    of the number, and leave the sign of a zero tie to operand order.
    """
    a, b = np.broadcast_arrays(a, b)
    pick = np.where(a < b, a, b) if want_min else np.where(a > b, a, b)
    zeros = (a == 0) & (b == 0)
    neg = (np.signbit(a) | np.signbit(b)) if want_min else (np.signbit(a) & np.signbit(b))
    pick = np.where(zeros, np.where(neg, F32(-0.0), F32(0.0)), pick)
    return np.where(np.isnan(a), b, np.where(np.isnan(b), a, pick)).astype(F32)


def _sign_op(mask_xor: int, mask_and: int) -> Callable[[np.ndarray], tuple]:
    def fn(x: np.ndarray) -> tuple:
        u = (x.view(np.uint32) ^ np.uint32(mask_xor)) & np.uint32(mask_and)
        return (u.astype(np.uint32).view(F32),)

    return fn


def _fused_host(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Correctly rounded a*b+c in float32 (fmaf) from float64 arithmetic, via round-to-odd.

    The float64 product of two float32 is exact. The float64 sum is rounded to odd using its exact error
    (TwoSum): with 53 >= 24 + 2 bits, rounding that once more to float32 is correct (Boldo-Melquiond).
    """
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)  # exact: s + err == p + c
    u = s.view(np.uint64)
    inexact_even = np.isfinite(s) & np.isfinite(err) & (err != 0) & ((u & np.uint64(1)) == 0)
    # Move one float64 ulp toward the exact value: the odd neighbour on that side.
    toward = np.where((err > 0) == (s > 0), u + np.uint64(1), u - np.uint64(1))
    s = np.where(inexact_even & (s != 0), toward.view(np.float64), s)
    return s.astype(F32)


def _host_fast_math(op: Callable[..., tuple]) -> Callable[..., tuple]:
    """Host model of --use_fast_math: flush subnormals in and out, division via reciprocal."""

    def fn(*args: Any) -> tuple:
        args = tuple(flush_subnormals(np.asarray(a, dtype=F32)) for a in args)
        return tuple(flush_subnormals(np.asarray(r, dtype=F32)) for r in op(*args))

    return fn


def _tup(f: Callable[..., Any]) -> Callable[..., tuple]:
    return lambda *a: (f(*a),)


# -- planted-bug variants shared by several kernels ------------------------------------------------

_TAIL_SHORT = Variant("tail_short", guard="i < n - 1", host_tail="short", doc="tail guard off by one (drops last)")
_TAIL_OVER = Variant("tail_over", guard="i <= n", host_tail="over", doc="tail guard off by one (writes out[n])")
_WRAP32 = Variant("wrap32", index_type="int", doc="32-bit grid-stride index that wraps for n near 2^31")
_COMMON = {v.name: v for v in (_TAIL_SHORT, _TAIL_OVER, _WRAP32)}


def _with(common: dict[str, Variant], *extra: Variant) -> dict[str, Variant]:
    return {**common, **{v.name: v for v in extra}}


def _fast(host: Callable[..., tuple]) -> Variant:
    return Variant(
        "fast_math",
        route="nvrtc-fast-math",
        host=_host_fast_math(host),
        host_env="cuda-ftz",
        doc="compiled with --use_fast_math",
    )


# -- the registry -----------------------------------------------------------------------------------


def _reg(name: str, inputs: tuple[str, ...], body: str, host: Callable[..., tuple], *extra: Variant, **kw: Any) -> None:
    kw.setdefault("reference", name)
    register_kernel(Kernel(name, inputs, body, host, variants=_with(_COMMON, _fast(host), *extra), **kw))


def _div_fast(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * (_ONE / b)).astype(F32)


_reg("add", ("a", "b"), "r = a + b;", _tup(np.add))
_reg("sub", ("a", "b"), "r = a - b;", _tup(np.subtract))
_reg("mul", ("a", "b"), "r = a * b;", _tup(np.multiply))
_reg(
    "div",
    ("a", "b"),
    "r = a / b;",
    _tup(np.divide),
    Variant(
        "fast_math",
        route="nvrtc-fast-math",
        host=_host_fast_math(_tup(_div_fast)),
        host_env="cuda-ftz",
        doc="compiled with --use_fast_math (approximate division)",
    ),
)
_reg("inv", ("a",), "r = 1.0f / a;", _tup(lambda a: _ONE / a))
_reg("fma", ("a", "b", "c"), "r = fmaf(a, b, c);", _tup(_fused_host))
_reg("sqrt", ("a",), "r = sqrtf(a);", _tup(np.sqrt))
_reg(
    "neg",
    ("a",),
    "r = __int_as_float(__float_as_int(a) ^ 0x80000000);",
    _sign_op(0x80000000, 0xFFFFFFFF),
    bitop=True,
)
_reg("abs", ("a",), "r = __int_as_float(__float_as_int(a) & 0x7fffffff);", _sign_op(0, 0x7FFFFFFF), bitop=True)
_reg("min", ("a", "b"), "r = fminf(a, b);", _tup(lambda a, b: _minmax_host(a, b, True)))
_reg("max", ("a", "b"), "r = fmaxf(a, b);", _tup(lambda a, b: _minmax_host(a, b, False)))
_reg(
    "relu",
    ("a",),
    "r = (a > 0.0f) ? a : ((a != a) ? a + a : 0.0f);",
    _tup(lambda a: np.where(a > 0, a, np.where(np.isnan(a), a + a, _ZERO)).astype(F32)),
    Variant(
        "nan_as_number",
        body="r = (a > 0.0f) ? a : 0.0f;",
        host=_tup(lambda a: np.where(a > 0, a, _ZERO).astype(F32)),
        doc="relu without the NaN rule: a NaN input returns 0",
    ),
)
_reg("scale", ("x",), "r = x * c;", _tup(np.multiply), scalars=("c",))
_reg("axpy", ("a", "b"), "r = __fadd_rn(a, __fmul_rn(c, b));", _tup(lambda a, b, c: a + c * b), scalars=("c",))
_reg(
    "muladd",
    ("x", "y", "z"),
    "r = x * y + z;",
    _tup(lambda x, y, z: x * y + z),
    doc="plain source: the compiler may contract it (fmad)",
)
_reg(
    "muladd_rn",
    ("x", "y", "z"),
    "r = __fadd_rn(__fmul_rn(x, y), z);",
    _tup(lambda x, y, z: x * y + z),
    reference="muladd",
    doc="_rn intrinsics: never contracted",
)
_reg(
    "clamp",
    ("x",),
    "r = (x != x) ? x + x : fminf(fmaxf(x, lo), hi);",
    _tup(
        lambda x, lo, hi: np.where(
            np.isnan(x),
            x + x,
            _minmax_host(_minmax_host(x, np.broadcast_to(lo, x.shape), False), np.broadcast_to(hi, x.shape), True),
        ).astype(F32)
    ),
    Variant(
        "nan_as_number",
        body="r = fminf(fmaxf(x, lo), hi);",
        host=_tup(lambda x, lo, hi: _minmax_host(_minmax_host(x, lo, False), hi, True)),
        doc="clamp without the NaN rule: a NaN input returns lo",
    ),
    scalars=("lo", "hi"),
)
_reg("exp", ("x",), "r = expf(x);", _tup(_expf), kind="approx")
_reg("log", ("x",), "r = logf(x);", _tup(_logf), kind="approx")
_reg("tanh", ("x",), "r = tanhf(x);", _tup(_tanhf), kind="approx")
_reg(
    "sigmoid",
    ("x",),
    "const float e = expf(-fabsf(x)); r = (x >= 0.0f) ? 1.0f / (1.0f + e) : e / (1.0f + e);",
    _tup(_sigmoid_host),
    kind="approx",
)
_GELU_S = (
    "const float t = 2.0f * (KC_GELU_K * (x + KC_GELU_C * (x * x * x))); const float e = expf(-fabsf(t)); "
    "const float s = (t >= 0.0f) ? 1.0f / (1.0f + e) : e / (1.0f + e);"
)
_reg(
    "gelu",
    ("x",),
    _GELU_S + " r = x * s;",
    _tup(_gelu_host),
    kind="approx",
    doc="x * sigmoid(2t): the tanh-approximation GELU without the 1 + tanh cancellation",
)

# Backward rules: gradient conventions from kernel-families.md.
_reg(
    "relu_bwd",
    ("x", "dy"),
    "r = (x > 0.0f) ? dy : 0.0f;",
    _tup(lambda x, dy: np.where(x > 0, dy, _ZERO).astype(F32)),
    kind="backward",
)
_reg(
    "abs_bwd",
    ("x", "dy"),
    "r = (x > 0.0f) ? dy : ((x < 0.0f) ? -dy : 0.0f);",
    _tup(lambda x, dy: np.where(x > 0, dy, np.where(x < 0, -dy, _ZERO)).astype(F32)),
    kind="backward",
)
_reg(
    "sqrt_bwd",
    ("x", "dy"),
    "r = (x > 0.0f) ? dy / (2.0f * sqrtf(x)) : 0.0f;",
    _tup(lambda x, dy: np.where(x > 0, dy / (_TWO * np.sqrt(np.abs(x))), _ZERO).astype(F32)),
    kind="backward",
)
_reg(
    "clamp_bwd",
    ("x", "dy"),
    "r = (x > lo && x < hi) ? dy : 0.0f;",
    _tup(lambda x, dy, lo, hi: np.where((x > lo) & (x < hi), dy, _ZERO).astype(F32)),
    kind="backward",
    scalars=("lo", "hi"),
)
_SPLIT = "r = (a {op} b) ? dy : ((a == b) ? 0.5f * dy : 0.0f); r2 = (b {op} a) ? dy : ((a == b) ? 0.5f * dy : 0.0f);"


def _split_host(op: Callable) -> Callable[..., tuple]:
    def fn(a: np.ndarray, b: np.ndarray, dy: np.ndarray) -> tuple:
        half = _HALF * dy
        return (
            np.where(op(a, b), dy, np.where(a == b, half, _ZERO)).astype(F32),
            np.where(op(b, a), dy, np.where(a == b, half, _ZERO)).astype(F32),
        )

    return fn


_reg(
    "min_bwd",
    ("a", "b", "dy"),
    _SPLIT.format(op="<"),
    _split_host(np.less),
    kind="backward",
    outputs=("r", "r2"),
)
_reg(
    "max_bwd",
    ("a", "b", "dy"),
    _SPLIT.format(op=">"),
    _split_host(np.greater),
    kind="backward",
    outputs=("r", "r2"),
)
_reg(
    "gelu_bwd",
    ("x", "dy"),
    _GELU_S + " const float dz = KC_GELU_K * (1.0f + (3.0f * KC_GELU_C) * (x * x));"
    " const float g = 2.0f * s * (1.0f - s); r = dy * ((g == 0.0f) ? s : s + x * g * dz);",
    _tup(_gelu_bwd_host),
    kind="backward",
)
_reg(
    "tanh_bwd",
    ("x", "dy"),
    "const float t = tanhf(x); r = dy * (1.0f - t * t);",
    _tup(lambda x, dy: (dy * (_ONE - _tanhf(x) * _tanhf(x))).astype(F32)),
    kind="backward",
    doc="dy (1 - tanh(x)^2), tanh recomputed from x (MK-11e)",
)
_reg(
    "sigmoid_bwd",
    ("x", "dy"),
    "const float e = expf(-fabsf(x)); const float s = (x >= 0.0f) ? 1.0f / (1.0f + e) : e / (1.0f + e);"
    " r = dy * (s * (1.0f - s));",
    _tup(lambda x, dy: (dy * (_sigmoid_host(x) * (_ONE - _sigmoid_host(x)))).astype(F32)),
    kind="backward",
    doc="dy s (1 - s) with the forward's stable sigmoid (MK-11f)",
)
_reg(
    "exp_bwd",
    ("x", "dy"),
    "r = dy * expf(x);",
    _tup(lambda x, dy: (dy * _expf(x)).astype(F32)),
    kind="backward",
    doc="dy exp(x), exp recomputed from x (MK-11a)",
)
_reg("log_bwd", ("x", "dy"), "r = dy / x;", _tup(lambda x, dy: (dy / x).astype(F32)), kind="backward", doc="MK-11b")
_reg(
    "inv_bwd",
    ("x", "dy"),
    "r = -(dy / (x * x));",
    _tup(lambda x, dy: (-(dy / (x * x))).astype(F32)),
    kind="backward",
    doc="-dy / x^2 (MK-11d)",
)
_reg(
    "div_bwd",
    ("a", "b", "dy"),
    "r = dy / b; r2 = -((dy * a) / (b * b));",
    lambda a, b, dy: ((dy / b).astype(F32), (-((dy * a) / (b * b))).astype(F32)),
    kind="backward",
    outputs=("r", "r2"),
    doc="(dy / b, -(dy a) / b^2) (MK-11c)",
)

# The contraction bug: a + c*b written plainly and compiled with fmad on; on the host, a fused evaluation.
KERNELS["axpy"].variants["contracted"] = Variant(
    "contracted",
    body="r = a + c * b;",
    route="nvrtc-fmad",
    host=_tup(lambda a, b, c: _fused_host(np.broadcast_to(c, a.shape), b, a)),
    doc="a + c*b in plain source under fmad=true: contracted to fma",
)


# -- running ----------------------------------------------------------------------------------------


# Float environments the NumPy backend realises, with the NaN every arithmetic result becomes (None: x86
# SSE propagation as NumPy does it). The NaN is written here, not taken from softfloat: the host kernel is
# an implementation checked against softfloat, so it must not borrow the reference's answer.
HOST_ENVS: dict[str, int | None] = {"cuda": 0x7FFFFFFF, "cuda-ftz": 0x7FFFFFFF, "x86-sse": None}


def host_supports(route: str) -> bool:
    """Whether the NumPy backend realises ``route`` (no compiler-chosen contraction or approximations)."""
    r = get_route(route)
    return r.flags is not None and not r.flags.fmad and not r.flags.fast_math


def _run_host(k: Kernel, v: Variant, route: str, ins: list, scalars: tuple, outs: list, n: int) -> str:
    env = v.host_env or get_route(route).env
    if env not in HOST_ENVS:
        raise RouteUnsupported(f"the host backend does not implement float environment {env!r}")
    if v.host is None and not host_supports(route):
        raise RouteUnsupported(f"route {route!r} is a CUDA compile route; the host backend has no equivalent")
    fn = v.host or k.host
    xs = [np.asarray(a, dtype=F32)[:n] for a in ins]
    ss = [F32(s) for s in scalars]
    ftz = env.endswith("-ftz") and not k.bitop
    if ftz:
        xs, ss = [flush_subnormals(a) for a in xs], [flush_subnormals(np.asarray([s], F32))[0] for s in ss]
    with np.errstate(all="ignore"):
        results = [np.asarray(r, dtype=F32) for r in fn(*xs, *ss)]
    if not k.bitop:
        if ftz:
            results = [flush_subnormals(r) for r in results]
        nan = HOST_ENVS[env]
        if nan is not None:
            results = [
                np.where(np.isnan(r), np.uint32(nan), r.view(np.uint32)).astype(np.uint32).view(F32) for r in results
            ]
    for out, r in zip(outs, results, strict=True):
        m = max(n - 1, 0) if v.host_tail == "short" else n
        out[:m] = r[:m]
        if v.host_tail == "over" and n > 0 and out.shape[0] > n:
            out[n] = r[n - 1]  # the write one past the end that a `i <= n` guard makes
    return env


def _run_cuda(
    k: Kernel,
    v: Variant,
    variant: str | None,
    route: str,
    ins: list,
    scalars: tuple,
    outs: list,
    n: int,
    block: int,
    max_grid: int,
) -> str:
    import cupy

    r = get_route(v.route or route)
    plan = kernel_plan(k.name, n, variant, block, max_grid)
    src, fname = kernel_source(k.name, variant, plan)
    fn = compile_function(src, fname, r.name)
    args = [cupy.ascontiguousarray(a, dtype=cupy.float32) for a in ins]
    fn(
        (int(plan["grid"]),),
        (int(plan["block"]),),
        (*args, *outs, *[np.float32(s) for s in scalars], np.int64(n)),
    )
    return r.env


# Every registered kernel, shipped (variant None) through the default route; planted variants are not offered.
@entry_point("elementwise", axes={"name": tuple(sorted(KERNELS)), "route": ("nvrtc-ieee",), "variant": (None,)})
def run_flat(
    name: str,
    inputs: list,
    scalars: tuple = (),
    *,
    device: str = "host",
    route: str = "nvrtc-ieee",
    variant: str | None = None,
    outs: list | None = None,
    n: int | None = None,
    block: int = DEFAULT_BLOCK,
    max_grid: int = DEFAULT_MAX_GRID,
) -> tuple[list, dict]:
    """Run kernel ``name`` on flat contiguous float32 buffers; returns (outputs, evidence).

    ``outs`` (optional) are caller-owned flat buffers of length >= n (tests pass guarded, poisoned ones);
    evidence names the device, route, variant and the float environment actually in force.
    """
    k = get_kernel(name)
    v = k.variant(variant)
    dev = resolve_device(device)
    xp = array_module(dev)
    n = int(inputs[0].shape[0]) if n is None else n
    if outs is None:
        outs = [xp.empty(n, dtype=xp.float32) for _ in k.outputs]
    if len(inputs) != len(k.inputs) or len(scalars) != len(k.scalars):
        raise TypeError(f"{name} takes {len(k.inputs)} arrays and {len(k.scalars)} scalars")
    if dev == "host":
        env = _run_host(k, v, route, list(inputs), scalars, outs, n)
        eff_route = route if v.host is None else f"host-model:{v.name}"
    else:
        env = _run_cuda(k, v, variant, route, list(inputs), scalars, outs, n, block, max_grid)
        eff_route = v.route or route
    return outs, {"kernel": name, "variant": v.name, "device": dev, "route": eff_route, "env": env}


def prepare_operands(xp: Any, arrays: Any) -> tuple[list, tuple[int, ...]]:
    """Broadcast float32 operands and lay them out as flat C-order contiguous buffers; (flat, shape)."""
    arrs = xp.broadcast_arrays(*[xp.asarray(a, dtype=xp.float32) for a in arrays])
    # Kernels read flat contiguous buffers: strided views and broadcasts are materialised first.
    return [xp.ascontiguousarray(a).reshape(-1) for a in arrs], arrs[0].shape


def apply(
    name: str,
    *arrays: Any,
    scalars: tuple = (),
    device: str = "auto",
    route: str = "nvrtc-ieee",
    variant: str | None = None,
) -> Any:
    """Kernel ``name`` on broadcastable arrays of any layout; returns the output(s) in the broadcast shape."""
    dev = resolve_device(device)
    flat, shape = prepare_operands(array_module(dev), arrays)
    outs, _ = run_flat(name, flat, scalars, device=dev, route=route, variant=variant)
    res = [o.reshape(shape) for o in outs]
    return res[0] if len(res) == 1 else tuple(res)
