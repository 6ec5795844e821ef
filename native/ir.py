"""Reference executor of the graph IR: a graph run op by op with the project's kernels, unfused.

``run_graph(graph, payload, inputs, device)`` checks well-formedness first, then evaluates node after node
in id order. Each op is one entry of :data:`EXECUTORS`: elementwise ops are the kernels of
:mod:`native.elementwise` (CUDA through NVRTC on ``"cuda"``, their NumPy host paths on ``"host"``),
reductions are :mod:`native.reductions`, softmax, layernorm and rmsnorm :mod:`native.norm`'s kernels, linear and
matmul are :mod:`native.gemm` (cuBLAS on ``"cuda"``, its host model on ``"host"``), conv2d and pool are
:mod:`native.conv`'s kernels, attention is :mod:`native.attention`'s (its CUDA kernels on ``"cuda"``, its
host path on ``"host"``); data movement is array indexing on the device. Devices resolve through
:func:`obligations.core.device.resolve_device` (``"cuda"`` without a GPU raises, never a silent host run).

This is the baseline a fusion backend is later checked against. How each op's result relates to the
denotation of :mod:`spec.ir.denote` (bitwise, or within which bound) is :data:`AGREEMENT`, used by
``falsification.graphspec_tests`` (``graphspec.executor_agreement``): per node, on the denotation's
parent values, so one op's error is measured alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from native import attention as attn
from native import conv, gemm, norm
from native import elementwise as ew
from native import reductions as red
from obligations.core.device import array_module, resolve_device, to_host
from spec import attention as sattn
from spec.fusion import SPECIAL, register_category
from spec.gemm import error_bound as gemm_error_bound
from spec.ir.checks import check_well_formed, node_attrs
from spec.ir.denote import EvalError, attention_operands, erf64, kv_lens_of, normalise_inputs
from spec.ir.graph import Graph, Node, Payload
from spec.ir.ops import ELEMENTWISE_OP_NAMES, get_op

# erf and where have no generated fused kernel: in a fused program they are host-fallback steps (as attention is),
# while this unfused executor runs them (CuPy on the device).
register_category(SPECIAL, "erf", "where")

__all__ = [
    "ExecError",
    "Executed",
    "Agreement",
    "EXECUTORS",
    "AGREEMENT",
    "register_executor",
    "run_node",
    "run_graph",
    "supported_ops",
    "agree",
    "ULP_BOUNDS",
    "U",
]

U = 2.0**-24
# Approx elementwise kernels: the ulp bounds the elementwise contract (elementwise-float32-v1) states.
ULP_BOUNDS: dict[str, int] = {"exp": 2, "log": 1, "tanh": 2, "sigmoid": 6}


class ExecError(ValueError):
    """The executor cannot run a node (unsupported op, missing payload, malformed graph), naming it."""


Executor = Callable[[Node, dict[str, Any], list[Any], Mapping[str, Any] | None, str], Any]
EXECUTORS: dict[str, Executor] = {}


def register_executor(*names: str) -> Callable[[Executor], Executor]:
    """Decorator: the executor of the ops ``names``: ``fn(node, attrs, parent arrays, payload entry, device)``."""

    def deco(fn: Executor) -> Executor:
        for name in names:
            if name in EXECUTORS:
                raise ValueError(f"executor for {name!r} registered twice")
            EXECUTORS[name] = fn
        return fn

    return deco


def supported_ops() -> tuple[str, ...]:
    """The op tags the executor runs."""
    return tuple(sorted(EXECUTORS))


def _xp(device: str) -> Any:
    return array_module(device)


def _dev(entry_value: Any, device: str) -> Any:
    return _xp(device).asarray(np.ascontiguousarray(entry_value, dtype=np.float32))


# -- leaves and data movement (bit copies) ----------------------------------------------------------------


@register_executor("const")
def _const(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    return _dev(entry["value"], device).reshape(node.out_shape)


@register_executor("reshape", "flatten")
def _reshape(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    return _xp(device).ascontiguousarray(args[0]).reshape(node.out_shape)


@register_executor("concat")
def _concat(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    return _xp(device).ascontiguousarray(_xp(device).concatenate(args, axis=a["axis"]))


@register_executor("permute")
def _permute(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    return _xp(device).ascontiguousarray(_xp(device).transpose(args[0], a["perm"]))


@register_executor("transpose")
def _transpose(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    return _xp(device).ascontiguousarray(_xp(device).swapaxes(args[0], a["dim0"], a["dim1"]))


@register_executor("slice")
def _slice(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    idx = [slice(None)] * args[0].ndim
    idx[a["axis"]] = slice(a["start"], a["stop"], a["step"])
    return _xp(device).ascontiguousarray(args[0][tuple(idx)])


@register_executor("where")
def _where(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    xp = _xp(device)
    cond, x, y = args
    # NaN != 0: a NaN condition picks x, as the denotation; the reshape keeps a rank-0 result rank 0
    return xp.ascontiguousarray(xp.where(cond != 0, x, y)).reshape(node.out_shape)


@register_executor("erf")
def _erf(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    # host: the denotation's real erf rounded once (bitwise); CUDA: CuPy's erf on float32, i.e. libdevice erff
    # (CUDA Math API: at most 2 ulp), hence AGREEMENT["erf"].
    if device == "host":
        with np.errstate(all="ignore"):
            y = erf64(np.asarray(args[0], np.float64)).astype(np.float32)
        return np.where(np.isnan(y), np.float32(np.nan), y)
    from cupyx.scipy import special

    return special.erf(args[0]).astype(_xp(device).float32)


@register_executor("broadcastTo", "expand")
def _broadcast(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    return _xp(device).ascontiguousarray(_xp(device).broadcast_to(args[0], node.out_shape)).reshape(node.out_shape)


# -- elementwise: native.elementwise kernels --------------------------------------------------------------

_KERNEL_NAMES: dict[str, str] = ELEMENTWISE_OP_NAMES


def _kernel(name: str, *arrays: Any, device: str) -> Any:
    return ew.apply(name, *arrays, device=device)


def _elementwise(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    return _kernel(_KERNEL_NAMES[node.kind], *args, device=device)


for _name in _KERNEL_NAMES:
    register_executor(_name)(_elementwise)


# -- reductions: native.reductions folds -------------------------------------------------------------------


@register_executor("reduceSum", "reduceMean")
def _reduce(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    fn = red.fold_sum if node.kind == "reduceSum" else red.mean
    return fn(args[0], axis=a["axis"] % args[0].ndim, device=device).reshape(node.out_shape)


@register_executor("sum")
def _sum(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    return red.fold_sum(args[0], axis=None, device=device).reshape(())


# -- contractions: native.gemm ---------------------------------------------------------------------------


@register_executor("linear")
def _linear(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    x = args[0]
    w, b = _dev(entry["weight"], device), _dev(entry["bias"], device)
    x2 = _xp(device).ascontiguousarray(x.reshape(-1, x.shape[-1]))
    y = gemm.matmul(x2, w, trans_b=True, device=device)
    return _kernel("add", y, b.reshape(1, -1), device=device).reshape(node.out_shape)


@register_executor("matmul", "bmm")
def _matmul(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    xp = _xp(device)
    x, y = args
    if x.ndim == 2:
        return gemm.matmul(xp.ascontiguousarray(x), xp.ascontiguousarray(y), device=device)
    lead = x.shape[:-2]
    x3 = xp.ascontiguousarray(x.reshape((-1,) + x.shape[-2:]))
    y3 = xp.ascontiguousarray(y.reshape((-1,) + y.shape[-2:]))
    return gemm.matmul(x3, y3, device=device).reshape(lead + node.out_shape[-2:])


def _pair(v: Any) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (v[0], v[1])


def _taps(
    x: Any,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    pad_value: float,
    out_hw: tuple[int, int],
    device: str,
) -> list[Any]:
    """Every window tap (..., Ho, Wo) of the padded input, in row-major (ki, kj) order (data movement)."""
    xp = _xp(device)
    ph, pw = padding
    padded = xp.full(x.shape[:-2] + (x.shape[-2] + 2 * ph, x.shape[-1] + 2 * pw), pad_value, dtype=xp.float32)
    padded[..., ph : ph + x.shape[-2], pw : pw + x.shape[-1]] = x
    out = []
    for ki in range(kernel[0]):
        for kj in range(kernel[1]):
            r0, c0 = ki * dilation[0], kj * dilation[1]
            out.append(
                padded[
                    ...,
                    r0 : r0 + stride[0] * (out_hw[0] - 1) + 1 : stride[0],
                    c0 : c0 + stride[1] * (out_hw[1] - 1) + 1 : stride[1],
                ]
            )
    return out


def _im2col(node: Node, a: dict, x: Any, device: str) -> Any:
    """(..., Cin * kh * kw, Ho * Wo) columns in (ci, ki, kj) order, the order of the weight's last three axes."""
    xp = _xp(device)
    k = _pair(a["kernel"])
    hw = node.out_shape[-2:]
    taps = _taps(x, k, _pair(a["stride"]), _pair(a["padding"]), _pair(a["dilation"]), 0.0, hw, device)
    cols = xp.stack(taps, axis=-3)  # (..., Cin, kh*kw, Ho, Wo)
    return xp.ascontiguousarray(cols.reshape(x.shape[:-3] + (x.shape[-3] * k[0] * k[1], hw[0] * hw[1])))


@register_executor("conv2d")
def _conv2d(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    # The conv family's direct kernel: bitwise to spec.conv, which is the IR's meaning of conv2d.
    x = args[0]
    w, b = _dev(entry["weight"], device), _dev(entry["bias"], device)
    x4 = _xp(device).ascontiguousarray(x.reshape((-1,) + tuple(x.shape[-3:])))
    y = conv.conv2d(x4, w, b, _pair(a["stride"]), _pair(a["padding"]), _pair(a["dilation"]), device=device)
    return y.reshape(node.out_shape)


@register_executor("pool")
def _pool(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    # The pool family's kernels (bitwise to spec.conv's max/avg pooling, the IR's meaning of pool).
    k, st, p = _pair(a["kernel"]), _pair(a["stride"]), _pair(a["padding"])
    x = _xp(device).ascontiguousarray(args[0])
    if a["mode"] == "max":
        return conv.max_pool2d(x, k, st, p, device=device)[0]
    return conv.avg_pool2d(x, k, st, p, device=device)


def _last(x: Any, ax: int, device: str) -> Any:
    return _xp(device).ascontiguousarray(_xp(device).moveaxis(x, ax, -1))


@register_executor("softmax")
def _softmax(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    # The norm family's kernel (native.norm.softmax: IEEE max fold, exp(x - m), fold sum, e / s in index order: the
    # ops of spec.norm.softmax, the IR's meaning; libdevice expf on the GPU, hence AGREEMENT["softmax"]'s bound).
    xp = _xp(device)
    ax = a["axis"] % args[0].ndim
    return xp.ascontiguousarray(xp.moveaxis(norm.softmax(_last(args[0], ax, device), device=device), -1, ax))


@register_executor("layernorm")
def _layernorm(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    # The norm family's kernel (native.norm.layernorm: bitwise spec.norm.layernorm on host and CUDA, the IR's meaning).
    w, b = _dev(entry["weight"], device), _dev(entry["bias"], device)
    return norm.layernorm(args[0], w, b, a["eps"], device=device).reshape(args[0].shape)


@register_executor("rmsnorm")
def _rmsnorm(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    # The norm family's kernel (native.norm.rmsnorm: bitwise spec.norm.rmsnorm on host and CUDA, the IR's meaning).
    return norm.rmsnorm(args[0], _dev(entry["weight"], device), a["eps"], device=device).reshape(args[0].shape)


# -- attention: native.attention's kernels ------------------------------------------------------------------


def _kv_lens(node: Node, lens: Any, seq_k: int) -> np.ndarray:
    """The 4th operand as int64 key lengths (checked as the denotation checks them; ExecError names the node)."""
    try:
        return kv_lens_of(np.asarray(to_host(lens), np.float32), seq_k)
    except EvalError as e:
        raise ExecError(f"node {node.id} ({node.kind}): {e}") from None


@register_executor("attention")
def _attention(node: Node, a: dict, args: list, entry: Any, device: str) -> Any:
    # The attention family's kernels (tiled online softmax, key tiles of native.attention.BC): within
    # spec.attention.forward_bound of the float64 SDPA that the IR's attention means (AGREEMENT["attention"]).
    q, k, v = (_xp(device).ascontiguousarray(x) for x in args[:3])
    lens = _kv_lens(node, args[3], int(k.shape[2])) if len(args) == 4 else None
    out, _ = attn.attention(q, k, v, causal=bool(a["causal"]), kv_lens=lens, scale=a["scale"], device=device)
    return out


# -- running ----------------------------------------------------------------------------------------------


def run_node(node: Node, args: Sequence[Any], entry: Mapping[str, Any] | None, device: str = "auto") -> Any:
    """One node on ``device`` from its parents' values (arrays of that device); ExecError names the node."""
    dev = resolve_device(device)
    op = get_op(node.kind)
    fn = EXECUTORS.get(node.kind)
    if op is None or fn is None:
        raise ExecError(
            f"node {node.id} ({node.kind}): the reference executor does not run op {node.kind!r} "
            f"(supported: {', '.join(supported_ops())})"
        )
    if op.payload and entry is None:
        raise ExecError(f"node {node.id} ({node.kind}): no payload entry for this {op.payload} node")
    xp = _xp(dev)
    ins = [_c_order(xp.asarray(v, dtype=xp.float32), xp) for v in args]
    with np.errstate(all="ignore"):
        out = fn(node, node_attrs(node, op), ins, entry, dev)
    if tuple(out.shape) != node.out_shape:
        raise ExecError(
            f"node {node.id} ({node.kind}): result shape {tuple(out.shape)} differs from the declared {node.out_shape}"
        )
    return out


def _c_order(a: Any, xp: Any) -> Any:
    # ascontiguousarray returns ndim >= 1: a rank-0 value would come back with shape (1,)
    return a if a.flags.c_contiguous else xp.ascontiguousarray(a)


@dataclass(frozen=True)
class Executed:
    """Every node's value (arrays of ``device``, by id) and the device that ran them."""

    values: tuple[Any, ...]
    device: str

    def host(self, node_id: int) -> np.ndarray:
        """Node ``node_id``'s value as a host float32 array."""
        return np.asarray(to_host(self.values[node_id]), dtype=np.float32)


def run_graph(graph: Graph, payload: Payload | None, inputs: Any, device: str = "auto") -> Executed:
    """Run every node in id order on ``device`` (well-formedness checked first; ExecError at the first bad node)."""
    errs = check_well_formed(graph)
    if errs:
        raise ExecError(f"ill-formed graph: {errs[0]}")
    ins = normalise_inputs(graph, inputs)
    if not isinstance(ins, dict):
        raise ExecError(str(ins))
    dev = resolve_device(device)
    payload = payload if payload is not None else Payload()
    xp = _xp(dev)
    values: list[Any] = []
    for node in graph.nodes:
        if node.kind == "input":
            values.append(xp.asarray(ins[node.id]))
            continue
        values.append(run_node(node, [values[p] for p in node.parents], payload.get(node.id), dev))
    return Executed(tuple(values), dev)


# -- agreement with the denotation, per op -----------------------------------------------------------------


@dataclass(frozen=True)
class Agreement:
    """How an op's executor result must relate to the denotation: ``kind`` and its per-element check.

    ``check(node, attrs, parents, entry, got, want) -> bool array`` (True where the element agrees), all
    host float32 arrays; ``parents`` are the denotation's parent values (the executor ran on the same).
    """

    kind: str
    statement: str
    check: Callable[[Node, dict, list[np.ndarray], Any, np.ndarray, np.ndarray], np.ndarray]


def _u32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _bitwise(node: Node, a: dict, parents: list, entry: Any, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return _u32(got) == _u32(want)


def _ulp_key(a: np.ndarray) -> np.ndarray:
    """Monotone integer key of binary32 values (ulp distance = key difference; -0 and +0 one apart)."""
    u = _u32(a).astype(np.int64)
    return np.where(u & 0x80000000, -(u & 0x7FFFFFFF) - 1, u)


def _ulps(node: Node, a: dict, parents: list, entry: Any, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    bound = ULP_BOUNDS[node.kind]
    both_nan = np.isnan(got) & np.isnan(want)
    return both_nan | (np.abs(_ulp_key(got) - _ulp_key(want)) <= bound)


def _erf_ulps(node: Node, a: dict, parents: list, entry: Any, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    both_nan = np.isnan(got) & np.isnan(want)
    return both_nan | (np.abs(_ulp_key(got) - _ulp_key(want)) <= 2)


def _gemm_ok(exact: np.ndarray, bound: np.ndarray, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Both the executor and the denotation within the GEMM contract's bound of the float64 value."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(all="ignore"):
        return (np.abs(g - exact) <= bound) & (np.abs(w - exact) <= bound)


def _linear_agree(node: Node, a: dict, parents: list, entry: Any, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    x = parents[0].reshape(-1, parents[0].shape[-1])
    w, b = np.asarray(entry["weight"], np.float32), np.asarray(entry["bias"], np.float32)
    c0 = np.broadcast_to(b, (x.shape[0], b.shape[0]))
    exact = x.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)
    bound = gemm_error_bound(x, w, False, True, 1.0, 1.0, c0, exact, "float32")
    return _gemm_ok(exact, bound, got.reshape(exact.shape), want.reshape(exact.shape)).reshape(got.shape)


def _matmul_agree(node: Node, a: dict, parents: list, entry: Any, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    x, y = parents
    exact = x.astype(np.float64) @ y.astype(np.float64)
    bound = gemm_error_bound(x, y, False, False, 1.0, 0.0, None, exact, "float32")
    return _gemm_ok(exact, bound, got, want)


def _conv_agree(node: Node, a: dict, parents: list, entry: Any, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    cols = _im2col(node, a, parents[0], "host")
    w = np.asarray(entry["weight"], np.float32)
    b = np.asarray(entry["bias"], np.float32)
    w2 = w.reshape(w.shape[0], -1)
    exact = (w2.astype(np.float64) @ cols.astype(np.float64)).reshape(node.out_shape) + b.reshape(-1, 1, 1)
    c0 = np.broadcast_to(b.reshape(-1, 1), (w2.shape[0], cols.shape[-1]))
    if cols.ndim == 2:
        bound = gemm_error_bound(w2, cols, False, False, 1.0, 1.0, c0, exact.reshape(c0.shape), "float32")
    else:
        bound = np.stack(
            [
                gemm_error_bound(w2, c, False, False, 1.0, 1.0, c0, e.reshape(c0.shape), "float32")
                for c, e in zip(cols, exact, strict=True)
            ]
        )
    return _gemm_ok(exact, bound.reshape(exact.shape), got, want)


def _gamma(h: int) -> float:
    return h * U / (1 - h * U)


def _softmax_agree(node: Node, a: dict, parents: list, entry: Any, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    n = parents[0].shape[a["axis"] % parents[0].ndim]
    rel = 12 * U + 2.5 * _gamma(max(n - 1, 0))
    g, w = got.astype(np.float64), want.astype(np.float64)
    return (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= rel * np.abs(w) + 2.0**-146)


def _attention_agree(node: Node, a: dict, parents: list, entry: Any, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Both within attention-v1's forward bound (ATT-FWD-bound: spec.attention.forward_bound, u_out = 2^-24) of the
    float64 SDPA, with the executor's key tiles (native.attention.BC): the denotation is that SDPA rounded once."""
    lens = parents[3] if len(parents) == 4 else None
    q, k, v, kv = attention_operands(parents[0], parents[1], parents[2], lens)
    tiles = -(-int(parents[1].shape[2]) // attn.BC)
    exact, bound = sattn.forward_bound(
        q, k, v, causal=bool(a["causal"]), kv_lens=kv, scale=a["scale"], tiles=tiles, tile_keys=attn.BC
    )
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(all="ignore"):
        ok = (np.abs(g - exact) <= bound) & (np.abs(w - exact) <= bound)
    return (np.isnan(g) & np.isnan(w)) | ok


_BITWISE = Agreement("bitwise", "bit for bit", _bitwise)
AGREEMENT: dict[str, Agreement] = {
    **{
        k: _BITWISE
        for k in (
            "const",
            "reshape",
            "flatten",
            "concat",
            "permute",
            "transpose",
            "slice",
            "broadcastTo",
            "expand",
            "where",
            "reduceSum",
            "reduceMean",
            "sum",
            "pool",
            "layernorm",  # native.norm's kernels are bitwise spec.norm (norm-softmax-v1 LAYERNORM-bitwise)
            "rmsnorm",  # (RMSNORM-bitwise)
        )
    },
    **{k: _BITWISE for k, v in _KERNEL_NAMES.items() if v not in ULP_BOUNDS and k != "gelu"},
    **{k: Agreement("ulp", f"within {ULP_BOUNDS[k]} ulp (elementwise-float32-v1)", _ulps) for k in ULP_BOUNDS},
    "erf": Agreement("ulp", "within 2 ulp (libdevice erff, CUDA Math API; bitwise on the host)", _erf_ulps),
    "linear": Agreement(
        "gemm-bound", "both within spec.gemm.error_bound (beta = 1, C0 = bias) of the float64 value", _linear_agree
    ),
    "matmul": Agreement("gemm-bound", "both within spec.gemm.error_bound of the float64 value", _matmul_agree),
    "bmm": Agreement("gemm-bound", "both within spec.gemm.error_bound of the float64 value", _matmul_agree),
    "conv2d": Agreement(
        "gemm-bound", "both within spec.gemm.error_bound of the float64 im2col product + bias", _conv_agree
    ),
    "softmax": Agreement(
        "relative", "|got - want| <= (12 u + 2.5 gamma_(n-1)) |want| + 2^-146 (exp 2 ulp)", _softmax_agree
    ),
    "attention": Agreement(
        "error-bound",
        "both within spec.attention.forward_bound (attention-v1 ATT-FWD-bound, u_out = 2^-24, tiles of "
        "native.attention.BC keys) of the float64 SDPA",
        _attention_agree,
    ),
}


def agree(node: Node, parents: list[np.ndarray], entry: Any, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per-element agreement of an executor result with the denotation, by the op's :data:`AGREEMENT`."""
    op = get_op(node.kind)
    rule = AGREEMENT[node.kind]
    return rule.check(node, node_attrs(node, op), parents, entry, got, want)
