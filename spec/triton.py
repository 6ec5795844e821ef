"""Triton's fp32 arithmetic, as its compiler lowers it for NVIDIA GPUs: what a Triton kernel's results mean.

The shipped Triton kernels (``native/tritonk/``) compute softmax and RMSNorm (families triton-softmax and
triton-rmsnorm: :mod:`spec.triton_softmax`, :mod:`spec.triton_rmsnorm`); their reference semantics are
:mod:`spec.norm`'s real (float64) values, and their error bounds are spec.norm's derivations with the
operations below in place of correctly rounded ones. Each entry: the Triton operation, the PTX opcode
Triton 3.x emits for it on fp32 (read from its PTX by the audit, which lets exactly the declared ones
through), and the relative error the bounds take for it (the PTX ISA's stated maxima, rounded up).

* ``/`` is ``div.full.f32``: 2 ulp over the full range, so 2^-22 relative.
* ``tl.sqrt`` is ``sqrt.approx.ftz.f32`` (``sqrt.approx.f32`` without libdevice's ftz reflection): taken 2^-22.
* ``tl.exp(t)`` is ``ex2.approx.f32`` of ``fl(t * fl(log2 e))``: the argument rounded twice more than
  exp(t)'s, the approximation taken 2^-21 relative (which also holds NumPy's float32 exp, the interpreter's:
  3.6 u measured on [-100, 0]).
* ``a * b + c`` is fused to ``fma.rn.f32`` under Triton's default ``enable_fp_fusion``: one rounding where the
  unfused model has two, so every bound derived unfused holds fused.
* ``tl.sum`` reduces in a tree fixed by the layout (lanes, warps): every order of n terms is within the
  sequential fold's gamma_{n-1}, and padded lanes add exact zeros.

Under Triton's interpreter (``TRITON_INTERPRET=1``) the same operations are NumPy's float32 ones: ``/`` and
sqrt correctly rounded, exp within the bound above; the bounds hold for both.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Lowering", "LOWERING", "DIV_REL", "SQRT_REL", "EXP_REL", "EXP_ARG_ROUNDS", "declared"]


@dataclass(frozen=True)
class Lowering:
    """One Triton fp32 operation: the PTX opcode Triton emits (per route) and the relative error taken for it."""

    op: str
    opcodes: tuple[str, ...]
    rel: float


DIV_REL = 2.0**-22
SQRT_REL = 2.0**-22
EXP_REL = 2.0**-21
EXP_ARG_ROUNDS = 3  # fl(x - m), fl(log2 e) and their product

LOWERING: dict[str, Lowering] = {
    "div": Lowering("/", ("div.full.f32",), DIV_REL),
    "sqrt": Lowering("tl.sqrt", ("sqrt.approx.ftz.f32", "sqrt.approx.f32"), SQRT_REL),
    "exp": Lowering("tl.exp", ("ex2.approx.f32",), EXP_REL),
}


def declared(*ops: str, route: str = "triton") -> frozenset[str]:
    """The PTX opcodes a kernel using Triton operations ``ops`` declares under ``route`` (its builds' ``declared``):
    Triton's default route reflects libdevice to ftz (sqrt.approx.ftz.f32), "triton-ieee" does not."""
    ftz = route == "triton"
    return frozenset(code for op in ops for code in LOWERING[op].opcodes if op != "sqrt" or (".ftz" in code) == ftz)
