"""One-kernel CUDA forms of ``spec.elementwise``'s approx references, for exhaustive sweeps.

An approx reference (exp, log, tanh, sigmoid, gelu) is the real function evaluated in float64, then
rounded to binary32. Where the float64 value lies too close to a rounding boundary to decide, the other
neighbour is accepted too. The array form (``RefOp.evaluate``) spends about 50 bandwidth-bound array ops
per chunk on float64 temporaries. Here the same steps run in one kernel, compiled through the project's
``nvrtc-ieee`` route (no flush, no contraction):

- the same float64 formula (``APPROX_FORMULAS``, one line each, in the spec's operation order);
- the same exact bits-to-float64 and float64-to-bits conversions;
- the same ambiguity test, flush and canonical NaN.

``tests/test_falsification.py`` checks the two forms bit for bit, ``ref`` and ``alt``, on edge patterns,
on dense ranges and on random patterns. The array form stays the definition.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from spec.elementwise import AMBIGUITY_REL, GELU_C, GELU_K, Reference, canonical_nan

__all__ = ["APPROX_FORMULAS", "fused_approx_reference", "has_fused_reference"]

# float64 formula of each approx reference over double ``x``, written as spec.elementwise computes it.
APPROX_FORMULAS: dict[str, str] = {
    "exp": "exp(x)",
    "log": "log(x)",
    "tanh": "tanh(x)",
    "sigmoid": "kc_sigmoid(x)",
    "gelu": f"x * kc_sigmoid(2.0 * ({GELU_K!r} * (x + {GELU_C!r} * x * x * x)))",
}

_SOURCE = r"""
__device__ __forceinline__ double kc_f64(unsigned u) {  // exact, subnormals included
    unsigned f = u & 0x007FFFFFu;
    if ((u & 0x7F800000u) == 0u && f != 0u) {
        double mag = ldexp((double)f, -149);
        return (u >> 31) ? -mag : mag;
    }
    return (double)__uint_as_float(u);
}
__device__ __forceinline__ unsigned kc_f32_bits(double r) {  // RNE, subnormal results included
    unsigned plain = __float_as_uint(__double2float_rn(r));
    double ar = fabs(r);
    if (ar < ldexp(1.0, -126)) {
        unsigned m = (unsigned)rint(ar * ldexp(1.0, 149));
        return (signbit(r) ? 0x80000000u : 0u) | m;
    }
    return plain;
}
__device__ __forceinline__ double kc_sigmoid(double x) {
    double e = exp(-fabs(x));
    return x >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}
__device__ __forceinline__ unsigned kc_flush(unsigned u, int ftz) {
    return (ftz && (u & 0x7F800000u) == 0u && (u & 0x007FFFFFu) != 0u) ? (u & 0x80000000u) : u;
}
__device__ __forceinline__ unsigned kc_canon(unsigned u, unsigned nan_bits) {
    return ((u & 0x7FFFFFFFu) > 0x7F800000u) ? nan_bits : u;
}
extern "C" __global__ void kc_approx_ref(const unsigned* in, unsigned* ref, unsigned* alt, long long n, int ftz,
                                         unsigned nan_bits, double ambiguity_rel) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double x = kc_f64(kc_flush(in[i], ftz));
        double r = FORMULA;
        unsigned u = kc_f32_bits(r);
        double back = kc_f64(u);
        bool finite = isfinite(r) && isfinite(back);
        bool up_mag = (r > back) == (back > 0.0);
        bool zero = (u & 0x7FFFFFFFu) == 0u;
        unsigned other = zero ? ((signbit(r) ? 0x80000000u : 0u) | 1u) : (up_mag ? u + 1u : u - 1u);
        double mid = (back + kc_f64(other)) * 0.5;
        bool amb = finite && back != r && fabs(r - mid) <= ambiguity_rel * fabs(r);
        ref[i] = kc_canon(kc_flush(u, ftz), nan_bits);
        alt[i] = kc_canon(kc_flush(amb ? other : u, ftz), nan_bits);
    }
}
"""


def has_fused_reference(name: str) -> bool:
    """Whether the approx reference ``name`` has a one-kernel CUDA form."""
    return name in APPROX_FORMULAS


@functools.cache
def _kernel(name: str) -> Any:
    from native.nvrtc import compile_function

    return compile_function(_SOURCE.replace("FORMULA", APPROX_FORMULAS[name]), "kc_approx_ref", "nvrtc-ieee")


def fused_approx_reference(name: str, bits: Any, env: str = "cuda") -> Reference:
    """``get_reference(name).evaluate(bits, env=env)`` for a CuPy uint32 array, in one kernel."""
    import cupy

    x = cupy.ascontiguousarray(bits).astype(cupy.uint32, copy=False)
    ref, alt = cupy.empty_like(x), cupy.empty_like(x)
    n = int(x.size)
    if n:
        blocks = min((n + 255) // 256, 65536)
        _kernel(name)(
            (blocks,),
            (256,),
            (
                x,
                ref,
                alt,
                np.int64(n),
                np.int32(env.endswith("-ftz")),
                np.uint32(canonical_nan(env)),
                np.float64(AMBIGUITY_REL),
            ),
        )
    return Reference(ref, alt)
