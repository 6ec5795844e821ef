"""Planted faults for run isolation: a test that hangs, one that kills its process, one that raises, and on
the GPU a kernel that writes far outside its buffer and one that never returns (tests/fixtures/faults/)."""

from __future__ import annotations

import os
import time
from typing import Any

from falsification.registry import FalsifyContext, register_test
from obligations.core.results import Outcome, passed, skipped

__all__ = ["plan", "kernel"]

_OOB = r"""
extern "C" __global__ void oob_write(float* out, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) out[i + (1LL << 40)] = 1.0f;  /* a terabyte past the end: an illegal address */
}
"""
_HANG = r"""
extern "C" __global__ void never_returns(volatile int* flag) {
    while (flag[0] == 0) { }  /* the host never sets it */
}
"""


def plan(n: Any) -> dict[str, Any]:
    """Placeholder plan: the quantities the contract may name."""
    return {"elements": n}


def kernel(*args: Any, **kwargs: Any) -> None:
    """Placeholder entry point."""


@register_test("faults.ok")
def ok(ctx: FalsifyContext) -> Outcome:
    """A test that passes at once (on any device, after the faults too)."""
    if ctx.device == "cuda":
        import cupy

        x = cupy.arange(1024, dtype=cupy.float32)
        if float((x * 2).sum()) != 1047552.0:
            raise AssertionError("the device computed a wrong sum")
    return passed(cases=1, seed=ctx.seed)


@register_test("faults.sleep")
def sleep(ctx: FalsifyContext) -> Outcome:
    """A test that takes ``params.seconds`` (default 1) and passes: a long or short item of a scheduling test."""
    time.sleep(float(ctx.params.get("seconds", 1.0)))
    return passed(cases=1, seed=ctx.seed)


@register_test("faults.hang")
def hang(ctx: FalsifyContext) -> Outcome:
    """A host test that never returns."""
    while True:
        time.sleep(0.05)


@register_test("faults.exit_process")
def exit_process(ctx: FalsifyContext) -> Outcome:
    """A test that ends its process (as a segfault in an extension would): only safe in a worker."""
    if os.environ.get("KC_FAULTS_ALLOW_EXIT") != "1":
        return skipped("set KC_FAULTS_ALLOW_EXIT=1 to run (it ends its process)")
    os._exit(7)


@register_test("faults.dies_once")
def dies_once(ctx: FalsifyContext) -> Outcome:
    """A test whose first run ends its process (a worker lost mid-item) and whose second run passes."""
    where = os.environ.get("KC_FAULTS_DIE_ONCE")
    if not where:
        return skipped("set KC_FAULTS_DIE_ONCE=DIR to run (its first run ends its process)")
    mark = os.path.join(where, "died")
    if not os.path.exists(mark):
        with open(mark, "w") as f:
            f.write(str(os.getpid()))
        os._exit(9)
    return passed(cases=1, seed=ctx.seed)


@register_test("faults.raises")
def raises(ctx: FalsifyContext) -> Outcome:
    """A test with a bug: the error item must name this file and line."""
    return {"a": 1}["b"]  # KeyError


@register_test("faults.cuda_oob_write")
def cuda_oob_write(ctx: FalsifyContext) -> Outcome:
    """A kernel that writes a terabyte past its output: the context is lost for this process."""
    if ctx.device != "cuda":
        return skipped("no GPU: the planted out-of-bounds kernel runs on the device only")
    import cupy

    out = cupy.zeros(256, dtype=cupy.float32)
    cupy.RawKernel(_OOB, "oob_write")((1,), (256,), (out, cupy.int64(256)))
    cupy.cuda.runtime.deviceSynchronize()
    return passed(cases=1)


@register_test("faults.cuda_never_returns")
def cuda_never_returns(ctx: FalsifyContext) -> Outcome:
    """A kernel that spins forever: only the item's time limit ends it."""
    if ctx.device != "cuda":
        return skipped("no GPU: the planted never-returning kernel runs on the device only")
    import cupy

    flag = cupy.zeros(1, dtype=cupy.int32)
    cupy.RawKernel(_HANG, "never_returns")((1,), (1,), (flag,))
    cupy.cuda.runtime.deviceSynchronize()
    return passed(cases=1)
