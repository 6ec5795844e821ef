"""Host<->device float transfer: float64 host values to binary32/binary16/bfloat16 on the device, and back.

Host -> device (:func:`upload`): the float64 buffer is copied as is (a byte copy) and converted on the
device by an NVRTC kernel (route ``nvrtc-ieee``): binary32 with ``__double2float_rn`` (PTX cvt.rn.f32.f64,
no ftz), binary16 and bfloat16 by an integer round-to-nearest-even on the float64 bit pattern (no header
or hardware conversion involved). The host path converts with NumPy (``astype`` float32/float16, which
round to nearest even from float64 on x86) and bfloat16 with the same integer algorithm in NumPy uint64.
The launch geometry comes from :func:`transfer_plan`, proved free of overflow for 2^40 elements.

Device -> host (:func:`download`): a byte copy (``cupy.ndarray.get``); no float conversion touches the
data, so NaN payloads, signaling NaNs and -0 survive. Planted-bug variants (``variant=``, tests only):
``truncate`` rounds toward zero instead of to nearest; ``via_float64`` downloads through a float64
conversion (which quiets signaling NaNs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from native.nvrtc import INDEX_TYPES, compile_function, get_route
from obligations.core.device import array_module, resolve_device
from obligations.core.entrypoints import entry_point
from obligations.core.symbolic import as_type, cdiv, smax, smin
from spec.transfer import TARGETS, TargetFormat, get_target

__all__ = [
    "DEFAULT_BLOCK",
    "DEFAULT_MAX_GRID",
    "ROUTE",
    "TransferPlan",
    "transfer_plan",
    "TransferVariant",
    "VARIANTS",
    "get_variant",
    "narrow_bits",
    "kernel_source",
    "upload",
    "download",
    "route_evidence",
]

DEFAULT_BLOCK = 256
DEFAULT_MAX_GRID = 65536
ROUTE = "nvrtc-ieee"  # -ftz=false: cvt.rn.f32.f64 must keep subnormal results (the stock route flushes them)


@dataclass(frozen=True)
class TransferPlan:
    """Launch geometry and byte counts of one conversion kernel over ``n_elems`` elements."""

    n_elems: Any
    src_bytes: Any
    dst_bytes: Any
    src_nbytes: Any
    dst_nbytes: Any
    block: Any
    grid: Any
    stride: Any
    iterations: Any
    max_grid: Any
    index_bits: int = 64  # the kernel's grid-stride index type (the source reads it from here)

    def next_index(self, i: Any) -> Any:
        """The grid-stride loop's next index after ``i``, in the kernel's index type."""
        index_type = "int64" if self.index_bits == 64 else "int32"
        return as_type(i, index_type) + as_type(self.stride, index_type)

    def src_end(self, i: Any) -> Any:
        """One past the last source byte element ``i`` reads."""
        return i * self.src_bytes + self.src_bytes

    def dst_end(self, i: Any) -> Any:
        """One past the last destination byte element ``i`` writes."""
        return i * self.dst_bytes + self.dst_bytes

    def regimes(self) -> dict[str, Any]:
        """The conversion loop's paths: no element, one trip per thread, a grid-stride loop."""
        n, trips = self.n_elems, self.iterations
        return {"empty": n == 0, "one_trip": (n > 0) & (trips <= 1), "grid_stride": trips > 1}


def transfer_plan(
    n_elems: Any, src_bytes: Any, dst_bytes: Any, block: Any = DEFAULT_BLOCK, max_grid: Any = DEFAULT_MAX_GRID
) -> TransferPlan:
    """The plan of one conversion: buffer sizes in bytes and a grid-stride launch over n_elems."""
    grid = smin(smax(cdiv(n_elems, block), 1), max_grid)
    stride = grid * block
    return TransferPlan(
        n_elems,
        src_bytes,
        dst_bytes,
        n_elems * src_bytes,
        n_elems * dst_bytes,
        block,
        grid,
        stride,
        cdiv(n_elems, stride),
        max_grid,
    )


# -- the integer conversion (host NumPy version; the CUDA version below is the same algorithm) ------------

_U = np.uint64


def narrow_bits(x_bits: np.ndarray, exp_bits: int, man_bits: int, truncate: bool = False) -> np.ndarray:
    """Target bits of float64 bit patterns: round to nearest even (or toward zero), Inf on overflow, NaN quieted."""
    b = np.asarray(x_bits, dtype=np.uint64)
    sign = (b >> _U(63)) << _U(exp_bits + man_bits)
    e = ((b >> _U(52)) & _U(0x7FF)).astype(np.int64)
    f = b & _U((1 << 52) - 1)
    emax_field = (1 << exp_bits) - 1
    inf = _U(emax_field << man_bits)
    bias = (1 << (exp_bits - 1)) - 1
    te = e - 1023 + bias  # target biased exponent before rounding
    # Normal targets drop 52 - man_bits bits; subnormal targets 1 - te more. Beyond 63 everything rounds to 0.
    shift = np.clip(52 - man_bits + np.maximum(1 - te, 0), 0, 63).astype(np.uint64)
    sig = np.where(e == 0, f, f | _U(1 << 52))  # float64 subnormals are far below every target's range
    q = sig >> shift
    rem = sig & ((_U(1) << shift) - _U(1))
    half = _U(1) << (shift - _U(1))
    up = (rem > half) | ((rem == half) & ((q & _U(1)) == _U(1)))
    if not truncate:
        q = q + up.astype(np.uint64)
    # Normal: ((te - 1) << man_bits) + q carries a rounded-up significand into the exponent by itself.
    te_c = np.clip(te - 1, 0, emax_field).astype(np.uint64)
    enc = np.where(te >= 1, (te_c << _U(man_bits)) + q, q)
    big = (te >= emax_field) | (enc >= inf)
    enc = np.where(big, inf - _U(1) if truncate else inf, enc)
    nan = sign | inf | _U(1 << (man_bits - 1)) | (f >> _U(52 - man_bits))
    out = np.where(e == 0x7FF, np.where(f != 0, nan, sign | inf), sign | enc)
    return out


_NARROW_C = """\
__device__ __forceinline__ unsigned long long kc_narrow(unsigned long long b, int exp_bits, int man_bits,
                                                        bool truncate) {
    const unsigned long long sign = (b >> 63) << (exp_bits + man_bits);
    const long long e = (long long)((b >> 52) & 0x7FFULL);
    const unsigned long long f = b & ((1ULL << 52) - 1);
    const long long emax_field = (1LL << exp_bits) - 1;
    const unsigned long long inf = (unsigned long long)emax_field << man_bits;
    const long long te = e - 1023 + ((1LL << (exp_bits - 1)) - 1);
    if (e == 0x7FF) {
        return f != 0 ? (sign | inf | (1ULL << (man_bits - 1)) | (f >> (52 - man_bits))) : (sign | inf);
    }
    long long s = 52 - man_bits + (te < 1 ? 1 - te : 0);
    const unsigned long long shift = (unsigned long long)(s > 63 ? 63 : s);
    const unsigned long long sig = e == 0 ? f : (f | (1ULL << 52));
    unsigned long long q = sig >> shift;
    const unsigned long long rem = sig & ((1ULL << shift) - 1);
    const unsigned long long half = 1ULL << (shift - 1);
    if (!truncate && (rem > half || (rem == half && (q & 1ULL)))) q += 1;
    unsigned long long enc = q;
    if (te >= 1) {
        const long long tc = te - 1 > emax_field ? emax_field : te - 1;
        enc = ((unsigned long long)tc << man_bits) + q;
    }
    if (te >= emax_field || enc >= inf) enc = truncate ? inf - 1 : inf;
    return sign | enc;
}
"""

_KERNEL_C = """\
extern "C" __global__ void {fname}(const double* __restrict__ in, {out_t}* __restrict__ out, long long n) {{
    for ({idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += ({idx})blockDim.x * gridDim.x) {{
        const double x = in[i];
        out[i] = ({out_t})({expr});
    }}
}}
"""


@dataclass(frozen=True)
class TransferVariant:
    """A build of the transfer path: how it rounds on upload and how it downloads."""

    name: str
    truncate: bool = False
    download_via_float64: bool = False
    doc: str = ""


VARIANTS: dict[str, TransferVariant] = {
    v.name: v
    for v in (
        TransferVariant("default", doc="the shipped path"),
        TransferVariant("truncate", truncate=True, doc="planted: rounds toward zero instead of to nearest even"),
        TransferVariant(
            "via_float64",
            download_via_float64=True,
            doc="planted: downloads through a float64 conversion (quiets signaling NaNs)",
        ),
    )
}


def get_variant(name: str | None) -> TransferVariant:
    """The named variant (None means "default"); KeyError lists the known ones."""
    try:
        return VARIANTS[name or "default"]
    except KeyError:
        raise KeyError(f"unknown transfer variant {name!r}; known: {sorted(VARIANTS)}") from None


def _host_binary32(x: np.ndarray, truncate: bool) -> np.ndarray:
    if truncate:
        return narrow_bits(x.view(np.uint64), 8, 23, truncate=True).astype(np.uint32)
    with np.errstate(all="ignore"):
        return x.astype(np.float32).view(np.uint32)  # cvtsd2ss: round to nearest even, overflow to Inf


def _host_binary16(x: np.ndarray, truncate: bool) -> np.ndarray:
    if truncate:
        return narrow_bits(x.view(np.uint64), 5, 10, truncate=True).astype(np.uint16)
    with np.errstate(all="ignore"):
        return x.astype(np.float16).view(np.uint16)  # NumPy's direct double -> half, nearest even


def _host_bfloat16(x: np.ndarray, truncate: bool) -> np.ndarray:
    return narrow_bits(x.view(np.uint64), 8, 7, truncate=truncate).astype(np.uint16)


_HOST: dict[str, Callable[[np.ndarray, bool], np.ndarray]] = {
    "binary32": _host_binary32,
    "binary16": _host_binary16,
    "bfloat16": _host_bfloat16,
}


def _cuda_expr(t: TargetFormat, v: TransferVariant) -> str:
    if t.name == "binary32":
        return "__float_as_uint(" + ("__double2float_rz(x)" if v.truncate else "__double2float_rn(x)") + ")"
    trunc = "true" if v.truncate else "false"
    return f"kc_narrow((unsigned long long)__double_as_longlong(x), {t.exp_bits}, {t.man_bits}, {trunc})"


def kernel_source(target: str, variant: str | None = None, plan: TransferPlan | None = None) -> tuple[str, str]:
    """(CUDA source, kernel name) converting float64 to ``target`` bits as ``variant``; index type from ``plan``."""
    t, v = get_target(target), get_variant(variant)
    plan = plan if plan is not None else transfer_plan(1, 8, t.width // 8)
    fname = f"kc_h2d_{t.name}" + ("" if v.name == "default" else f"_{v.name}")
    out_t = "unsigned int" if t.width == 32 else "unsigned short"
    code = _KERNEL_C.format(fname=fname, out_t=out_t, expr=_cuda_expr(t, v), idx=INDEX_TYPES[int(plan.index_bits)])
    return _NARROW_C + code, fname


@entry_point("transfer", axes={"target": tuple(sorted(TARGETS)), "variant": (None,)})
def upload(
    x: Any,
    target: str,
    *,
    device: str = "host",
    variant: str | None = None,
    block: int = DEFAULT_BLOCK,
    max_grid: int = DEFAULT_MAX_GRID,
) -> Any:
    """float64 host values -> ``target`` bits (uint32/uint16) on ``device``, same shape, round to nearest even."""
    t, v = get_target(target), get_variant(variant)
    host = np.ascontiguousarray(np.asarray(x, dtype=np.float64))
    if resolve_device(device) == "host":
        return _HOST[t.name](host.reshape(-1), v.truncate).reshape(host.shape)
    import cupy

    src = cupy.asarray(host).reshape(-1)  # a byte copy: the float64 bits arrive unchanged
    out = cupy.empty(src.size, dtype=t.dtype)
    plan = transfer_plan(int(src.size), 8, t.width // 8, block, max_grid)
    code, fname = kernel_source(target, variant)
    fn = compile_function(code, fname, ROUTE)
    fn((int(plan.grid),), (int(plan.block),), (src, out, np.int64(src.size)))
    return out.reshape(host.shape)


def download(a: Any, *, variant: str | None = None) -> np.ndarray:
    """The device array as a NumPy array with the same dtype and every bit kept (a byte copy)."""
    v = get_variant(variant)
    xp = array_module("cuda") if type(a).__module__.startswith("cupy") else np
    dtype = a.dtype
    if v.download_via_float64 and np.dtype(dtype).kind == "f":
        with np.errstate(all="ignore"):
            a = a.astype(xp.float64)
    out = a.get() if xp is not np else np.array(a, copy=True)
    if out.dtype != dtype:
        with np.errstate(all="ignore"):
            out = out.astype(dtype)
    return out


def route_evidence() -> dict:
    """The compile route of the conversion kernels, as JSON evidence."""
    return get_route(ROUTE).to_json()
