"""The triton-softmax family: what the Triton softmax of ``native/tritonk/softmax.py`` (the tutorials' "Fused
Softmax") means.

Its reference semantics is :func:`spec.norm.softmax`: the real (float64) softmax along the last axis. Its
arithmetic is Triton's fp32 lowering (:mod:`spec.triton`) of the two operations it uses: ``tl.exp(t)`` is
``ex2.approx.f32`` of ``fl(t * fl(log2 e))`` (the argument ``fl(x - m)`` rounded EXP_ARG_ROUNDS times, the
approximation within EXP_REL) and ``/`` is ``div.full.f32`` (DIV_REL); the row sum is a ``tl.sum`` tree of any
order. The contract's bound (``falsification.norm_tests``, ``softmax@triton``) is spec.norm's softmax derivation
with these errors in place of correctly rounded ones, and its audit lets exactly :func:`declared_opcodes` through.
"""

from __future__ import annotations

from spec.norm import softmax
from spec.triton import DIV_REL, EXP_ARG_ROUNDS, EXP_REL, declared

__all__ = ["softmax", "OPS", "DIV_REL", "EXP_REL", "EXP_ARG_ROUNDS", "declared_opcodes"]

OPS = ("div", "exp")  # the approximate Triton operations of the kernel (keys of spec.triton.LOWERING)


def declared_opcodes(route: str = "triton") -> frozenset[str]:
    """The PTX opcodes of Triton's lowering the softmax kernel uses under ``route`` (its builds' ``declared``)."""
    return declared(*OPS, route=route)
