"""The triton-rmsnorm family: what the Triton RMSNorm (forward) of ``native/tritonk/rmsnorm.py`` (in the style of
the tutorials' "Layer Normalization") means.

Its reference semantics is :func:`spec.norm.rmsnorm`: the real (float64) ``x / sqrt(mean(x^2) + eps) * w``
along the last axis. Its arithmetic is Triton's fp32 lowering (:mod:`spec.triton`) of the operations it uses:
the mean's ``/ N`` is ``div.full.f32`` (DIV_REL), ``rstd = 1 / tl.sqrt(v)`` is ``sqrt.approx`` then
``div.full`` (RSQRT_REL), ``x * x + acc`` is fused, and the square sum is a ``tl.sum`` tree of any order. The
contract's bound (``falsification.norm_tests``, ``rmsnorm@triton``) is spec.norm's RMSNorm derivation with these
errors, and its audit lets exactly :func:`declared_opcodes` through.
"""

from __future__ import annotations

from spec.norm import rmsnorm
from spec.triton import DIV_REL, SQRT_REL, declared

__all__ = ["rmsnorm", "OPS", "DIV_REL", "RSQRT_REL", "declared_opcodes"]

OPS = ("div", "sqrt")  # the approximate Triton operations of the kernel (keys of spec.triton.LOWERING)
# rstd = 1 / tl.sqrt(v): the square root within SQRT_REL, then the division within DIV_REL, relative
RSQRT_REL = (1 + DIV_REL) / (1 - SQRT_REL) - 1


def declared_opcodes(route: str = "triton") -> frozenset[str]:
    """The PTX opcodes of Triton's lowering the RMSNorm kernel uses under ``route`` (its builds' ``declared``)."""
    return declared(*OPS, route=route)
