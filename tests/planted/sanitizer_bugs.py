"""A planted workload for the sanitizer engine: a kernel that writes one element past its buffer."""

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
