"""Reference meaning of GEMM/BMM: C = alpha op(A) op(B) + beta C, and the error bound a backend must meet.

The reference is float64 on the host: products of fp16 or fp32 inputs are exact in float64 (at most 48
significant bits), the k-term sums carry at most gamma_k(2^-53) relative error, which the bound adds as a
stated margin. The bound (Higham 2002, section 3.5; float-facts.md) for fp32 accumulation in any order,
with the alpha/beta update and the output rounding:

    |C - C_ref| <= gamma_(k+2)(2^-24) (|alpha| |op(A)| |op(B)| + |beta| |C0|) + u_out |C_ref| + tiny
                   + gamma_k(2^-53) |alpha| |op(A)| |op(B)|   (the reference's own margin)

with u_out = 2^-11 for fp16 output, 2^-8 for bfloat16 (0 for fp32: its rounding is one of the k+2) and ``tiny``
the absolute underflow allowance: k 2^-149 for the fp32 sums, plus half the output format's subnormal spacing
(2^-25 for fp16, 2^-134 for bfloat16).
"""

from __future__ import annotations

import numpy as np

__all__ = ["U", "gamma", "reference", "error_bound", "op"]

U: dict[str, float] = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}
# Half the subnormal spacing of a narrow output format: its rounding there is absolute, not relative.
_OUT_TINY: dict[str, float] = {"float16": 2.0**-25, "bfloat16": 2.0**-134}


def gamma(h: int, u: float) -> float:
    """gamma_h = h u / (1 - h u)."""
    return h * u / (1 - h * u) if h * u < 1 else np.inf


def op(x: np.ndarray, trans: bool) -> np.ndarray:
    """op(X) on the last two axes."""
    return np.swapaxes(x, -1, -2) if trans else x


def reference(
    a: np.ndarray,
    b: np.ndarray,
    trans_a: bool,
    trans_b: bool,
    alpha: float = 1.0,
    beta: float = 0.0,
    c0: np.ndarray | None = None,
) -> np.ndarray:
    """alpha op(A) op(B) + beta C0 in float64 (batched over leading axes)."""
    r = float(alpha) * (op(a.astype(np.float64), trans_a) @ op(b.astype(np.float64), trans_b))
    if c0 is not None and beta != 0:
        r = r + float(beta) * c0.astype(np.float64)
    return r


def error_bound(
    a: np.ndarray,
    b: np.ndarray,
    trans_a: bool,
    trans_b: bool,
    alpha: float,
    beta: float,
    c0: np.ndarray | None,
    c_ref: np.ndarray,
    out_dtype: str,
) -> np.ndarray:
    """Per-element bound on |C - C_ref| for fp32 accumulation and an ``out_dtype`` result."""
    k = op(a, trans_a).shape[-1]
    mag = abs(float(alpha)) * (np.abs(op(a.astype(np.float64), trans_a)) @ np.abs(op(b.astype(np.float64), trans_b)))
    if c0 is not None and beta != 0:
        mag_c = abs(float(beta)) * np.abs(c0.astype(np.float64))
    else:
        mag_c = 0.0
    u_out = U[out_dtype] if out_dtype in _OUT_TINY else 0.0
    tiny = _OUT_TINY.get(out_dtype, 0.0) + k * 2.0**-149  # the output's rounding and the fp32 sums' underflow
    acc = gamma(k + 2, U["float32"]) * (mag + mag_c) + gamma(k, U["float64"]) * mag
    # The output rounding is relative to the accumulated value, which may exceed |C_ref| by acc.
    return acc + u_out * (np.abs(c_ref) + acc) + tiny
