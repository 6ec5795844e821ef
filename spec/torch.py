"""The PyTorch ops that ``kc audit-torch`` audits: which spec each one means and which derived bound judges it.

One row per (op, backend): the torch call, the settings that select the backend (``torch.backends`` flags, the SDPA
backend), the storage format, the spec function whose value it must have (float64 or softfloat references in
:mod:`spec`) and the derived bound that judges it -- an existing derivation of this project, never a tolerance
made up here. Where no derivation covers a backend the row says so (``bound`` empty, ``bound_note`` the reason):
its errors are measured and reported, not judged. The table is data: nothing here imports torch
(:mod:`native.torch` runs the ops, :mod:`falsification.torch_tests` judges them).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Backend", "TorchOp", "OPS", "get_backend", "table_keys", "BOUNDS", "BOUND_SOURCES"]

# A derived bound by name -> where its derivation lives (the contract equation or spec function it evaluates).
BOUND_SOURCES: dict[str, str] = {
    "gemm": "spec.gemm.error_bound (Higham 3.5: gamma_(k+2)(2^-24) |A||B| + u_out |C| + tiny; gemm-cublas-v1)",
    "gemm-tf32": "spec.gemm.error_bound about the exact product, widened for operands read as TF32 (each within "
    "2^-10 relative, rounded or truncated; a float32 kernel is within it too)",
    "conv-gemm": "spec.gemm.error_bound of the im2col product + bias (native.ir AGREEMENT['conv2d'])",
    "conv-gemm-tf32": "spec.gemm.error_bound of the im2col product + bias, widened for the product's operands read as "
    "TF32 (as gemm-tf32)",
    "attention": "spec.attention.forward_bound (attention-v1 ATT-FWD-bound: tiled online softmax, float32)",
    "attention-tc": "spec.attention.forward_bound(tensor_core=True) (attention-v1: binary16 mma, P in binary16)",
    "layernorm": "falsification.norm_tests.norm_bound (norm-softmax-v1 LAYERNORM-bound, equation norm_bounds)",
    "rmsnorm": "falsification.norm_tests.norm_bound without bias (norm-softmax-v1 RMSNORM-bound)",
    "softmax": "falsification.norm_tests.softmax_bound (norm-softmax-v1 SOFTMAX-bound, equation bounds)",
    "log_softmax": "falsification.norm_tests.softmax_bound(log=True) (norm-softmax-v1 LOGSOFTMAX-bound)",
    "sum": "reductions-v1 error_bounds: gamma_h sum|x| with h = n - 1 (any order of n - 1 additions)",
    "cumsum": "reductions-v1 error_bounds per prefix: gamma_i sum_(j <= i)|x_j| (any order of i additions)",
}
BOUNDS = tuple(BOUND_SOURCES)


@dataclass(frozen=True)
class Backend:
    """One way torch runs an op: settings that select it, storage format, devices it exists on, its bound."""

    name: str
    dtype: str  # storage of inputs and outputs: float32, float16 or bfloat16
    settings: tuple[tuple[str, object], ...] = ()  # torch.backends flags (dotted under torch.backends) or sdpa
    devices: tuple[str, ...] = ("cuda",)  # "cuda" and/or "cpu" (torch's CPU kernels, for host development)
    bound: str = ""  # a key of BOUND_SOURCES, or "" where no derivation covers this backend
    bound_note: str = ""  # the derivation's parameters here, or why none applies

    def settings_dict(self) -> dict[str, object]:
        """The settings as a dict (for evidence)."""
        return dict(self.settings)


@dataclass(frozen=True)
class TorchOp:
    """An audited op: the torch call, the spec it means, its backends."""

    name: str
    call: str
    spec: str
    backends: tuple[Backend, ...]


_NO_TF32 = (("cuda.matmul.allow_tf32", False), ("cudnn.allow_tf32", False))
_SDPA_TC = (
    "tensor-core model: binary16 mma m16n8k16 with float32 accumulation, P rounded to binary16; key tiles of 16 "
    "(the mma k-step: a bound for every coarser tiling)"
)
_SDPA_32 = "float32 tiled online softmax, key tiles of 16 (a bound for every coarser tiling)"
_NO_BF16_ATT = "no derived bound: spec.attention models binary16 (tensor cores) and binary32 storage, not bfloat16"

OPS: tuple[TorchOp, ...] = (
    TorchOp(
        "matmul",
        "torch.matmul",
        "spec.gemm.reference (float64)",
        (
            Backend("fp32", "float32", _NO_TF32, ("cuda", "cpu"), "gemm", "fp32 accumulation, fp32 output"),
            Backend(
                "tf32",
                "float32",
                (("cuda.matmul.allow_tf32", True),),
                bound="gemm-tf32",
                bound_note="inputs read as TF32 (rounded or truncated) or kept float32; fp32 accumulation, output",
            ),
            Backend("fp16", "float16", (), bound="gemm", bound_note="fp32 accumulation, binary16 output (u_out 2^-11)"),
            Backend("bf16", "bfloat16", (), bound="gemm", bound_note="fp32 accumulation, bfloat16 output (u_out 2^-8)"),
        ),
    ),
    TorchOp(
        "conv2d",
        "torch.nn.functional.conv2d",
        "spec.conv.conv_f64 (float64)",
        (
            Backend(
                "deterministic",
                "float32",
                (*_NO_TF32, ("cudnn.deterministic", True), ("cudnn.benchmark", False)),
                ("cuda", "cpu"),
                "conv-gemm",
                "fp32 accumulation over k = C_in/groups * kh * kw terms (any algorithm that sums exact products)",
            ),
            Backend(
                "benchmark",
                "float32",
                (*_NO_TF32, ("cudnn.deterministic", False), ("cudnn.benchmark", True)),
                bound="conv-gemm",
                bound_note="as deterministic; cuDNN times its algorithms and keeps the fastest (Winograd and FFT "
                "algorithms do not sum exact products: the bound does not model them)",
            ),
            Backend(
                "tf32",
                "float32",
                (("cudnn.allow_tf32", True), ("cudnn.deterministic", True), ("cudnn.benchmark", False)),
                bound="conv-gemm-tf32",
                bound_note="torch's default for cuDNN convolutions (allow_tf32 True): operands may be read as TF32",
            ),
        ),
    ),
    TorchOp(
        "sdpa",
        "torch.nn.functional.scaled_dot_product_attention",
        "spec.attention.sdpa (float64; blocked entries contribute 0, fully masked rows are 0)",
        (
            Backend("flash-fp16", "float16", (("sdpa", "FLASH_ATTENTION"),), bound="attention-tc", bound_note=_SDPA_TC),
            Backend("flash-bf16", "bfloat16", (("sdpa", "FLASH_ATTENTION"),), bound_note=_NO_BF16_ATT),
            Backend(
                "efficient-fp16",
                "float16",
                (("sdpa", "EFFICIENT_ATTENTION"),),
                bound="attention-tc",
                bound_note=_SDPA_TC,
            ),
            Backend(
                "efficient-fp32", "float32", (("sdpa", "EFFICIENT_ATTENTION"),), bound="attention", bound_note=_SDPA_32
            ),
            Backend("cudnn-fp16", "float16", (("sdpa", "CUDNN_ATTENTION"),), bound="attention-tc", bound_note=_SDPA_TC),
            Backend(
                "math-fp32",
                "float32",
                (("sdpa", "MATH"), *_NO_TF32),
                ("cuda", "cpu"),
                "attention",
                _SDPA_32,
            ),
            Backend("math-fp16", "float16", (("sdpa", "MATH"),), bound="attention-tc", bound_note=_SDPA_TC),
        ),
    ),
    TorchOp(
        "layer_norm",
        "torch.nn.functional.layer_norm",
        "spec.norm.layernorm (softfloat, the stated order)",
        (Backend("fp32", "float32", (), ("cuda", "cpu"), "layernorm", "against the real layernorm of the inputs"),),
    ),
    TorchOp(
        "rms_norm",
        "torch.nn.functional.rms_norm",
        "spec.norm.rmsnorm (softfloat, the stated order)",
        (Backend("fp32", "float32", (), ("cuda", "cpu"), "rmsnorm", "against the real RMSNorm of the inputs"),),
    ),
    TorchOp(
        "softmax",
        "torch.softmax",
        "spec.norm.softmax (softfloat)",
        (Backend("fp32", "float32", (), ("cuda", "cpu"), "softmax", "per element, against the float64 softmax"),),
    ),
    TorchOp(
        "log_softmax",
        "torch.log_softmax",
        "spec.norm.log_softmax (softfloat)",
        (Backend("fp32", "float32", (), ("cuda", "cpu"), "log_softmax", "per element, against the float64 value"),),
    ),
    TorchOp(
        "cumsum",
        "torch.cumsum",
        "prefix sums (float64 with its own gamma_i(2^-53) margin; NaN/Inf classes from the IEEE float64 prefix)",
        (Backend("fp32", "float32", (), ("cuda", "cpu"), "cumsum", "h = i for prefix i: any order"),),
    ),
    TorchOp(
        "sum",
        "torch.sum",
        "spec.reductions.exact_sum (exact) and spec.reductions.fold_left (softfloat, NaN/Inf classes)",
        (Backend("fp32", "float32", (), ("cuda", "cpu"), "sum", "h = n - 1: any order"),),
    ),
)


def get_backend(op: str, backend: str) -> tuple[TorchOp, Backend]:
    """(op, backend) by names; KeyError naming the known ones."""
    for o in OPS:
        if o.name == op:
            for b in o.backends:
                if b.name == backend:
                    return o, b
            raise KeyError(f"op {op!r} has no backend {backend!r} (known: {', '.join(b.name for b in o.backends)})")
    raise KeyError(f"unknown op {op!r} (known: {', '.join(o.name for o in OPS)})")


def table_keys() -> list[tuple[str, str]]:
    """Every (op, backend) of the table, in its order."""
    return [(o.name, b.name) for o in OPS for b in o.backends]
