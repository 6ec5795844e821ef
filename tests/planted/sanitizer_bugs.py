"""Planted workloads for the sanitizer engine: a kernel that writes one element past its buffer, the same kernel
writing 256 elements past it (many reports: kilobytes of output, so a report printed late would show in a later
workload's lines), and host stand-ins for tests/fake_sanitizer.py."""

from __future__ import annotations

from native.workloads import register_workload

_OOB = r"""
extern "C" __global__ void kc_planted_oob(float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;   // planted: <= writes out[n]
}
"""


@register_workload("planted-oob")
def planted_oob() -> int:
    """Launch the off-by-one kernel once on a buffer of 256 floats (the write to out[256] is out of bounds)."""
    import cupy
    import numpy as np

    from native.nvrtc import compile_function

    out = cupy.empty(256, dtype=cupy.float32)
    compile_function(_OOB, "kc_planted_oob", "nvrtc-ieee")((2,), (256,), (out, np.int64(256)))
    cupy.cuda.runtime.deviceSynchronize()
    return 1


@register_workload("planted-oob-many")
def planted_oob_many() -> int:
    """The off-by-one kernel told its 256-float buffer holds 512: every thread of the second block writes past it."""
    import cupy
    import numpy as np

    from native.nvrtc import compile_function

    out = cupy.empty(256, dtype=cupy.float32)
    compile_function(_OOB, "kc_planted_oob", "nvrtc-ieee")((2,), (256,), (out, np.int64(511)))
    cupy.cuda.runtime.deviceSynchronize()
    return 1


# -- host stand-ins (tests/fake_sanitizer.py reads KC-FAKE-REPORT lines as the errors a tool finds there) ---------


@register_workload("fake-clean")
def fake_clean() -> int:
    """A workload no tool finds an error in."""
    return 1


@register_workload("fake-clean-2")
def fake_clean_2() -> int:
    """Another workload no tool finds an error in."""
    return 1


@register_workload("fake-oob")
def fake_oob() -> int:
    """Stands for planted-oob: memcheck finds one out-of-bounds write here, the other tools nothing."""
    print("KC-FAKE-REPORT memcheck 1", flush=True)
    return 1


@register_workload("fake-raise")
def fake_raise() -> int:
    """A workload that raises (a launch refused): reported for it, the next one still runs."""
    raise RuntimeError("planted: the launch was refused")


@register_workload("fake-crash")
def fake_crash() -> int:
    """A workload that kills its process (a segfault in a library): it and every later workload have no verdict."""
    import os
    import signal
    import sys

    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGSEGV)
    return 1


@register_workload("fake-hang")
def fake_hang() -> int:
    """A workload that never ends (a kernel that spins): its process is stopped at the plan's limit."""
    import time

    time.sleep(600)
    return 1
