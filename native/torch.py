"""PyTorch as a kernel provider: run one audited op under one backend, and an IR graph's steps through Inductor.

Nothing here runs at import: torch is imported inside the functions (``torch`` is an optional extra; without it
:func:`torch_missing` gives the reason and the audit's items are skipped). Inputs and outputs are NumPy arrays:
inputs hold values already representable in the backend's storage format (float32 arrays of binary16 or
bfloat16 values are converted exactly), outputs come back as float32 (every binary16/bfloat16 value is exact
in it). The settings of a backend (``spec.torch.Backend.settings``: ``torch.backends`` flags and the SDPA
backend) hold only while its op runs: :func:`backend_settings` restores the previous values.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Unsupported",
    "torch_missing",
    "cuda_missing",
    "versions",
    "backend_settings",
    "run_op",
    "step_function",
    "compile_and_run",
    "run_eager",
    "kernel_names",
    "STEP_KINDS",
]


class Unsupported(Exception):
    """The backend cannot run this configuration (torch says so): a configuration skipped, not a failure."""


def torch_missing() -> str | None:
    """Why torch cannot be used here, or None."""
    try:
        import torch  # noqa: F401
    except Exception as exc:  # an ImportError, or a broken install raising on import
        return f"torch is not installed (pip install 'kernel-contracts[torch]'): {type(exc).__name__}: {exc}"
    return None


def cuda_missing() -> str | None:
    """Why torch has no CUDA device here (torch missing included), or None."""
    why = torch_missing()
    if why:
        return why
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def versions(device: str) -> dict[str, Any]:
    """torch, CUDA, cuDNN versions and the device name (evidence of every audit)."""
    import torch

    out: dict[str, Any] = {"torch": torch.__version__}
    if device == "cuda":
        out["cuda"] = torch.version.cuda
        out["cudnn"] = torch.backends.cudnn.version()
        out["gpu"] = torch.cuda.get_device_name()
        out["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    return out


def _dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _flag_owner(path: str) -> tuple[Any, str]:
    import torch.backends

    obj: Any = torch.backends
    *parents, attr = path.split(".")
    for p in parents:
        obj = getattr(obj, p)
    return obj, attr


@contextlib.contextmanager
def backend_settings(settings: Sequence[tuple[str, object]]) -> Iterator[None]:
    """Apply a backend's ``torch.backends`` flags (and SDPA backend) for the duration; restore them after."""
    saved: list[tuple[Any, str, Any]] = []
    with contextlib.ExitStack() as stack:
        for path, value in settings:
            if path == "sdpa":
                from torch.nn.attention import SDPBackend, sdpa_kernel

                stack.enter_context(sdpa_kernel([getattr(SDPBackend, str(value))]))
                continue
            owner, attr = _flag_owner(path)
            saved.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, value)
        try:
            yield
        finally:
            for owner, attr, old in reversed(saved):
                setattr(owner, attr, old)


def _to(a: np.ndarray | None, dtype: str, device: str) -> Any:
    import torch

    if a is None:
        return None
    t = torch.from_numpy(np.ascontiguousarray(a))
    if t.dtype == torch.bool:
        return t.to(device)
    return t.to(device=device, dtype=_dtype(dtype))


def _call(op: str, args: Mapping[str, Any], dtype: str, device: str) -> Any:
    import torch
    import torch.nn.functional as F  # noqa: N812 (torch's own spelling)

    t = {k: _to(v, dtype, device) if isinstance(v, np.ndarray) else v for k, v in args.items()}
    if op == "matmul":
        return torch.matmul(t["a"], t["b"])
    if op == "conv2d":
        return F.conv2d(t["x"], t["w"], t["bias"], t["stride"], t["padding"], t["dilation"], t["groups"])
    if op == "sdpa":
        kw = {"attn_mask": t.get("mask"), "is_causal": bool(t.get("causal", False)), "scale": t.get("scale")}
        if t.get("gqa"):
            kw["enable_gqa"] = True
        with warnings.catch_warnings():  # a pinned backend's reasons for refusing a case print once per call
            warnings.simplefilter("ignore", UserWarning)
            return F.scaled_dot_product_attention(t["q"], t["k"], t["v"], **kw)
    if op == "layer_norm":
        return F.layer_norm(t["x"], (t["x"].shape[-1],), t["w"], t["b"], t["eps"])
    if op == "rms_norm":
        return F.rms_norm(t["x"], (t["x"].shape[-1],), t["w"], t["eps"])
    if op == "softmax":
        return torch.softmax(t["x"], -1)
    if op == "log_softmax":
        return torch.log_softmax(t["x"], -1)
    if op == "cumsum":
        return torch.cumsum(t["x"], -1)
    if op == "sum":
        return torch.sum(t["x"], -1)
    raise KeyError(f"native.torch has no runner for op {op!r}")


_UNSUPPORTED = re.compile(r"No available kernel|not supported|Unsupported|does not support|expected .*dtype", re.I)


def run_op(
    op: str,
    args: Mapping[str, Any],
    dtype: str,
    settings: Sequence[tuple[str, object]],
    device: str,
    reruns: int = 1,
) -> list[np.ndarray]:
    """The op's output (float32 NumPy) ``1 + reruns`` times under the backend's settings; Unsupported if the
    backend refuses the configuration."""
    import torch

    dev = "cuda" if device == "cuda" else "cpu"
    outs = []
    with backend_settings(settings):
        for _ in range(1 + reruns):
            try:
                y = _call(op, args, dtype, dev)
            except RuntimeError as exc:
                if _UNSUPPORTED.search(str(exc)):
                    raise Unsupported(str(exc).strip().splitlines()[0][:300]) from None
                raise
            if dev == "cuda":
                torch.cuda.synchronize()
            outs.append(y.detach().to("cpu", torch.float32).numpy())
    return outs


# -- an IR graph's steps as torch functions (the Inductor check) --------------------------------------------

# The IR kinds a step function translates: each the torch op of the same meaning (spec.ir.denote).
STEP_KINDS = (
    "embedding",
    "rmsnorm",
    "linear",
    "reshape",
    "transpose",
    "broadcastTo",
    "expand",
    "rope",
    "matmul",
    "mul_elem",
    "add",
    "pow",
    "reduceMean",
    "rsqrt",
    "softmax",
    "silu",
    "const",
)


@dataclass(frozen=True)
class _Node:
    kind: str
    parents: tuple[int, ...]
    out_shape: tuple[int, ...]
    attrs: Mapping[str, Any]
    params: Mapping[str, Any]


def _node_op(n: _Node, device: str) -> Callable[..., Any]:
    """The torch function of one IR node of the given parents' tensors (parameters captured as constants)."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    def const(name: str) -> Any:
        return torch.as_tensor(np.array(n.params[name], np.float32), device=device)  # a writable copy

    k, a = n.kind, n.attrs
    if k == "embedding":
        table = const("table")
        return lambda i: F.embedding(i.long(), table)
    if k == "rmsnorm":
        w = const("weight")
        return lambda x: F.rms_norm(x, (x.shape[-1],), w, float(np.float32(a["eps"])))
    if k == "linear":
        w, b = const("weight"), const("bias")
        return lambda x: F.linear(x, w, b)
    if k == "reshape":
        return lambda x: x.reshape(n.out_shape)
    if k == "transpose":
        return lambda x: x.transpose(a["dim0"], a["dim1"])
    if k in ("broadcastTo", "expand"):
        return lambda x: x.expand(n.out_shape)
    if k == "rope":
        from spec.ir.denote import rope_tables

        c_bits, s_bits = rope_tables(n.out_shape[-2], n.out_shape[-1], a["base"])
        c = torch.as_tensor(np.asarray(c_bits, np.uint32).view(np.float32), device=device)
        s = torch.as_tensor(np.asarray(s_bits, np.uint32).view(np.float32), device=device)

        def rope(x: Any) -> Any:
            x0, x1 = x[..., 0::2], x[..., 1::2]
            return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)

        return rope
    if k == "matmul":
        return torch.matmul
    if k == "mul_elem":
        return torch.mul
    if k == "add":
        return torch.add
    if k == "pow":
        return torch.pow
    if k == "reduceMean":
        return lambda x: x.mean(dim=a["axis"], keepdim=bool(a.get("keepdim", False)))
    if k == "rsqrt":
        return torch.rsqrt
    if k == "softmax":
        return lambda x: torch.softmax(x, a["axis"])
    if k == "silu":
        return F.silu
    raise KeyError(f"native.torch.step_function cannot translate IR op {k!r} (known: {', '.join(STEP_KINDS)})")


def step_function(
    nodes: Mapping[int, Any],
    params: Mapping[int, Mapping[str, Any]],
    members: Sequence[int],
    reads: Sequence[int],
    writes: Sequence[int],
    device: str,
) -> Callable[..., tuple]:
    """A torch function of the step's read tensors (in ``reads`` order) returning its writes: each member node
    (id order, an IR node with kind, parents, out_shape, attrs) as the torch op of the same meaning."""
    dev = "cuda" if device == "cuda" else "cpu"
    ops = {}
    for m in members:
        nd = nodes[m]
        ops[m] = (
            _node_op(_Node(nd.kind, tuple(nd.parents), tuple(nd.out_shape), dict(nd.attrs), params.get(m) or {}), dev),
            tuple(nd.parents),
        )

    def fn(*args: Any) -> tuple:
        env = dict(zip(reads, args, strict=True))
        for m in members:
            op, parents = ops[m]
            env[m] = op(*(env[p] for p in parents))
        return tuple(env[w] for w in writes)

    return fn


_KERNEL = re.compile(r"\b((?:triton|cpp)_\w+?)\s*=\s*async_compile\.|\bdef ((?:triton|cpp)_\w+)\(")
_EXTERN = re.compile(r"\bextern_kernels\.(\w+)\(")


def kernel_names(codes: Sequence[str]) -> dict[str, list[str]]:
    """The kernels Inductor generated (Triton or C++) and the library calls it emitted, from its output code."""
    gen: list[str] = []
    ext: list[str] = []
    for code in codes:
        for m in _KERNEL.finditer(code):
            name = m.group(1) or m.group(2)
            if name not in gen:
                gen.append(name)
        for m in _EXTERN.finditer(code):
            if m.group(1) not in ext:
                ext.append(m.group(1))
    return {"generated": gen, "extern": ext}


def compile_and_run(fn: Callable[..., tuple], inputs: Sequence[np.ndarray], device: str) -> tuple[list, list[str]]:
    """``fn`` compiled by torch.compile (Inductor, whole graph, static shapes) on the inputs: (outputs as float32
    NumPy, the generated code). Dynamo is reset first, so each step is compiled afresh (no recompile limit)."""
    import torch
    from torch._inductor.utils import run_and_get_code

    dev = "cuda" if device == "cuda" else "cpu"
    torch._dynamo.reset()
    ts = [torch.as_tensor(np.array(x, np.float32), device=dev) for x in inputs]
    compiled = torch.compile(fn, backend="inductor", fullgraph=True, dynamic=False)
    out, codes = run_and_get_code(compiled, *ts)
    if dev == "cuda":
        torch.cuda.synchronize()
    return [o.detach().to("cpu", torch.float32).numpy() for o in out], list(codes)


def run_eager(fn: Callable[..., tuple], inputs: Sequence[np.ndarray], device: str) -> list[np.ndarray]:
    """``fn`` run eagerly (no compilation) on the inputs: its outputs as float32 NumPy."""
    import torch

    dev = "cuda" if device == "cuda" else "cpu"
    out = fn(*(torch.as_tensor(np.array(x, np.float32), device=dev) for x in inputs))
    return [o.detach().to("cpu", torch.float32).numpy() for o in out]
