"""Convolution on cuDNN, called through PyTorch: the fusion backend's ``cudnn`` conv step (issue 29).

CuPy 14 dropped its cuDNN bindings (its upgrade guide: "CuPy v14 no longer supports cuDNN"), so cuDNN is reached
through ``torch.ops.aten.cudnn_convolution`` (always cuDNN, never another torch backend, with its algorithm
flags passed explicitly instead of set globally): the CuPy operands are viewed as torch tensors by DLPack (zero
copy), the call runs on CuPy's current stream (wrapped as a torch external stream when the two differ), and the
result comes back to CuPy by DLPack. The flags are :data:`SETTINGS`: TF32 off (every product of fp32 operands),
deterministic, no benchmarking (cuDNN's heuristic picks the algorithm: a rerun is bitwise equal).

What the step claims is a derived bound, not bits: each output is an inner product of ``K = C_in/groups * taps``
products plus the bias (added by a separate elementwise add), summed in an order cuDNN does not state, so
``|y - y_exact| <= gamma_{K+1}(2^-24) (sum |w x| + |b|) + (K + 1) 2^-149`` (conv-pool-v1's ``conv.error_bound``,
the GEMM bound of the im2col product). The bound assumes an algorithm that sums the exact products (implicit
GEMM, GEMM, precomputed-index GEMM); Winograd and FFT algorithms transform the operands first and are not
modelled, which is why the step never asks cuDNN to benchmark (timing would pick them where they win) and why
the evidence records the cuDNN kernels that ran. The direct kernel of :mod:`native.conv` stays the bitwise
reference (``compile_subgraph(conv="direct")``).

Nothing here imports torch at module import: :func:`cudnn_missing` says why the step cannot run (no CUDA device,
torch absent, torch without CUDA or cuDNN), and the planner keeps the direct kernel then.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from native.conv import _guard, _tuple
from obligations.core.device import cuda_available

__all__ = [
    "SETTINGS",
    "Call",
    "cudnn_missing",
    "plan_call",
    "weights",
    "run",
    "conv",
    "conv2d",
    "torch_conv2d",
    "versions",
]

# cudnn_convolution's algorithm flags: no benchmarking, deterministic algorithms, TF32 off.
SETTINGS: dict[str, bool] = {"benchmark": False, "deterministic": True, "allow_tf32": False}


@functools.cache
def cudnn_missing() -> str | None:
    """Why the cuDNN step cannot run here ('needs cuda and torch: ...'), or None; the GPU is asked first, so a
    machine without one never imports torch."""
    ok, why = cuda_available()
    if not ok:
        return f"needs cuda and torch: {why}"
    from native.torch import cuda_missing

    why = cuda_missing()
    if why:
        return f"needs cuda and torch: {why}"
    import torch

    if not torch.backends.cudnn.is_available():
        return f"needs cuda and torch: torch {torch.__version__} has no cuDNN"
    return None


def versions() -> dict[str, Any]:
    """torch and cuDNN versions and the settings of the step (evidence)."""
    import torch

    return {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "settings": dict(SETTINGS)}


@functools.cache
def _external(ptr: int) -> Any:
    import torch

    return torch.cuda.ExternalStream(ptr)


def _tensor(a: Any) -> Any:
    import torch

    return torch.from_dlpack(a)


def torch_conv2d(
    x: Any,
    w: Any,
    b: Any,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    settings: dict[str, bool] = SETTINGS,
) -> Any:
    """cudnn_convolution of torch tensors (spatial rank 2 or 3), then ``+ b`` rounded once: a torch tensor (``b``
    of K elements, or already shaped to broadcast over the output as :func:`weights` gives it)."""
    import torch

    y = torch.ops.aten.cudnn_convolution(
        x,
        w,
        list(padding),
        list(stride),
        list(dilation),
        int(groups),
        settings["benchmark"],
        settings["deterministic"],
        settings["allow_tf32"],
    )
    if b is not None:
        y.add_(b if b.dim() == y.dim() else b.reshape((1, -1) + (1,) * (y.dim() - 2)))
    return y


@dataclass(frozen=True)
class Call:
    """A guarded cuDNN convolution: the output shape and what cuDNN is given (a rank-1 call gains a unit axis in
    front; an empty spatial input is padded explicitly, since cuDNN refuses an empty axis)."""

    y_shape: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    unit_axis: bool
    explicit_pad: tuple[int, ...] | None


@functools.lru_cache(maxsize=1024)
def plan_call(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    b_len: int,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
) -> Call:
    """:mod:`native.conv`'s guard (the direct kernel's refusals, ConvRefused) and the call cuDNN gets; kept per
    signature (the guard's integer plan costs hundreds of microseconds in Python, the convolution ~0.1 ms)."""
    x_len, w_len = math.prod(x_shape), math.prod(w_shape)
    plan = _guard(x_shape, w_shape, b_len, w_shape[0], stride, padding, dilation, groups, x_len, w_len)
    y_shape = (x_shape[0], w_shape[0]) + tuple(int(a.out) for a in plan.axes)
    explicit = None
    if 0 in x_shape[2:]:  # every tap reads padding: pad explicitly (+0), as the spec does
        explicit, padding = padding, (0,) * len(padding)
    unit = len(x_shape) == 3
    if unit:  # cuDNN takes 4-d and 5-d tensors: a unit axis in front (kernel 1, stride 1, no padding)
        stride, padding, dilation = (1, *stride), (0, *padding), (1, *dilation)
    return Call(y_shape, stride, padding, dilation, groups, unit, explicit)


def weights(call: Call, w: Any, b: Any) -> tuple[Any, Any]:
    """The weight (and bias, or None) as the torch tensors :func:`run` takes (zero copy; kept by a caller that
    runs the same weights again); the bias shaped (1, K, 1, ...) to broadcast over the output as it is."""
    import cupy

    w = _contiguous(cupy, w)
    if call.unit_axis:
        w = w[:, :, None, :]
    rank = len(call.y_shape) + int(call.unit_axis)  # the output's rank as cuDNN makes it
    if b is not None:
        b = _contiguous(cupy, b).reshape(-1)[: call.y_shape[1]].reshape((1, -1) + (1,) * (rank - 2))
    return _tensor(w), None if b is None else _tensor(b)


def run(call: Call, x: Any, wt: Any, bt: Any) -> Any:
    """The planned convolution of CuPy array ``x`` on CuPy's current stream: a CuPy array of ``call.y_shape``."""
    import cupy
    import torch

    if 0 in call.y_shape:
        return cupy.empty(call.y_shape, cupy.float32)
    x = _contiguous(cupy, x)
    if call.explicit_pad is not None:
        x = cupy.pad(x, ((0, 0), (0, 0)) + tuple((p, p) for p in call.explicit_pad))
    if call.unit_axis:
        x = x[:, :, None, :]
    cur = cupy.cuda.get_current_stream().ptr
    device = cupy.cuda.runtime.getDevice()
    window = (call.stride, call.padding, call.dilation, call.groups, SETTINGS)
    if _torch_stream(device) == cur:
        # torch already launches on CuPy's stream: no stream switch, and the DLPack exchange needs no stream
        # negotiation. torch's Python side of both (current_stream, the stream context, __dlpack__'s checks) took
        # 192 us of host time a call against F.conv2d's 46 (H200, 2026-11-27): more than the convolution's 140 us on
        # the GPU, so the step ran host-bound (0.65x torch on an H100).
        tx = torch.utils.dlpack.from_dlpack(x.__dlpack__(stream=cur or 1))  # DLPack: 1 is the legacy default stream
        y = torch_conv2d(tx, wt, bt, *window).contiguous()  # (already so: contiguous input and weight)
        # CuPy's view of torch's buffer, which y (its owner) keeps alive: no DLPack round trip.
        mem = cupy.cuda.UnownedMemory(y.data_ptr(), 4 * y.numel(), y, device)
        out = cupy.ndarray(tuple(y.shape), cupy.float32, cupy.cuda.MemoryPointer(mem, 0))
    else:
        with torch.cuda.stream(_external(cur)):
            y = torch_conv2d(_tensor(x), wt, bt, *window)
        out = cupy.from_dlpack(y)
    return out.reshape(call.y_shape) if call.unit_axis else out


@functools.cache
def _raw_stream_of() -> Any:
    import torch

    # The accessor torch's own generated code (Inductor) calls for the raw stream; else the public Stream object.
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw if raw is not None else (lambda device: torch.cuda.current_stream(device).cuda_stream)


def _torch_stream(device: int) -> int:
    """torch's current stream on ``device`` as a raw pointer (0: the legacy default stream, as CuPy's null)."""
    return int(_raw_stream_of()(device))


def _contiguous(cupy: Any, a: Any) -> Any:
    if isinstance(a, cupy.ndarray) and a.dtype == cupy.float32 and a.flags.c_contiguous:
        return a
    return cupy.ascontiguousarray(cupy.asarray(a, dtype=cupy.float32))


def conv(
    x: Any,
    w: Any,
    b: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str = "cuda",
) -> Any:
    """Rank 1..3 convolution on cuDNN, x (N, C, *in), w (CO, C/groups, *k), bias (CO) or None: a CuPy array
    (N, CO, *out). The call passes :mod:`native.conv`'s guard first (the same refusals as the direct kernel)."""
    if device == "host":
        raise ValueError("the cuDNN convolution runs on cuda only (the host path is native.conv.conv)")
    why = cudnn_missing()
    if why:
        raise RuntimeError(f"the cuDNN convolution cannot run: {why}")
    rank = len(x.shape) - 2
    if rank < 1 or len(w.shape) != rank + 2:
        raise ValueError(f"x {tuple(x.shape)} and w {tuple(w.shape)} are not a rank-{max(rank, 1)} convolution")
    call = plan_call(
        tuple(int(d) for d in x.shape),
        tuple(int(d) for d in w.shape),
        0 if b is None else int(math.prod(b.shape)),
        *(_tuple(v, rank) for v in (stride, padding, dilation)),
        int(groups),
    )
    wt, bt = weights(call, w, b)
    return run(call, x, wt, bt)


def conv2d(
    x: Any,
    w: Any,
    b: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    device: str = "cuda",
) -> Any:
    """NCHW convolution on cuDNN: :func:`conv` of spatial rank 2."""
    if len(x.shape) != 4:
        raise ValueError("conv2d takes x of shape (N, C, H, W)")
    return conv(x, w, b, stride, padding, dilation, groups, device)
