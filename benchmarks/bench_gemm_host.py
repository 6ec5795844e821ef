"""Host cost per GEMM call (enqueue only) of the raw binding, the layers of the wrapper and cupy.matmul.

Explains PO-GEMM-04's margin: when a GEMM is short, T_wrapper / T_raw is host cost over GPU time. Prints
microseconds per call (median and min of 7 rounds of 800 calls while a spin kernel holds the GPU) and
the GPU time per call of back-to-back raw calls (CUDA events after 50 warm-ups).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import numpy as np

from falsification.engine import time_ms
from falsification.gemm_tests import host_us
from native import gemm as ng
from obligations.core.device import cuda_available

__all__ = ["main"]


def _cells(fn: Any) -> dict[str, Any]:
    return dict(zip(fn.__code__.co_freevars, [cell.cell_contents for cell in fn.__closure__], strict=True))


def main(argv: list[str] | None = None) -> int:
    """Print the figures as JSON; exit 0 (figures only)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=int, nargs=3, default=[4096, 256, 1024], metavar=("M", "K", "N"))
    p.add_argument("--dtype", default="float16")
    args = p.parse_args(argv)
    ok, why = cuda_available()
    if not ok:
        print(f"bench_gemm_host: skipped ({why})")
        return 0
    import cupy
    from cupy.cuda import cublas

    m, k, n = args.shape
    a = cupy.ones((m, k), args.dtype)
    b = cupy.ones((k, n), args.dtype)
    c = cupy.zeros((m, n), args.dtype)
    prepared = (
        ng.matmul(a, b, c=c, device="cuda") is c
        and ng._PREPARED[
            (ng._cupy_signature(a, b, c), False, False, 1.0, 0.0, None, "cuda", ng.COMPUTE_32F, ng.cublas_args)
        ]
    )
    counted = _cells(prepared)["run"]
    backend = _cells(counted)["inner"]
    gc = ng.get_context("cuda")
    alpha, beta = np.array(1.0, np.float32), np.array(0.0, np.float32)
    handle, pa, pb, t = gc.handle, alpha.ctypes.data, beta.ctypes.data, ng.DATA_TYPES[args.dtype]

    def raw() -> None:
        cublas.gemmEx(handle, 0, 0, n, m, k, pa, b.data.ptr, t, n, a.data.ptr, t, k, pb, c.data.ptr, t, n, 68, -1)

    pta, ptb, ptc = a.data.ptr, b.data.ptr, c.data.ptr

    def raw_resolved() -> None:
        cublas.gemmEx(handle, 0, 0, n, m, k, pa, ptb, t, n, pta, t, k, pb, ptc, t, n, 68, -1)

    bound = ng.bind_matmul(a, b, c, device="cuda")
    variants = {
        "raw cupy.cuda.cublas.gemmEx": raw,
        "raw, pointers resolved once": raw_resolved,
        "bound call (bind_matmul)": bound,
        "backend closure": lambda: backend(b, a, c),
        "counted closure": lambda: counted(b, a, c),
        "prepared call": lambda: prepared(a, b, c),
        "native.gemm.matmul": lambda: ng.matmul(a, b, c=c, device="cuda"),
        "cupy.matmul": lambda: cupy.matmul(a, b, out=c),
    }
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(7):
        for name, fn in variants.items():
            rounds[name].append(host_us(fn, 800))
    out = {
        "shape": [m, k, n],
        "dtype": args.dtype,
        "host_us_per_call": {name: {"median": statistics.median(v), "min": min(v)} for name, v in rounds.items()},
        "gpu_us_per_call_raw": time_ms(raw, iters=400) * 1e3,
        "gpu_us_per_call_bound": time_ms(bound, iters=400) * 1e3,
        "gpu_us_per_call_matmul": time_ms(variants["native.gemm.matmul"], iters=400) * 1e3,
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
