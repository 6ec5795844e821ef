"""GEMM throughput (wrapper vs cupy.matmul) and wrapper overhead vs raw cupy.cuda.cublas.gemmEx, same run."""

from __future__ import annotations

import json
import sys

from falsification.gemm_tests import overhead, throughput
from falsification.registry import FalsifyContext
from obligations.core.device import cuda_available

__all__ = ["main", "SHAPES"]

SHAPES: list[list] = [[4096, 1024, 4096, "float16"], [4096, 256, 1024, "float16"], [4096, 1024, 4096, "float32"]]


def main() -> int:
    """Print TFLOP/s per shape and the overhead ratios; exit 0 (figures only)."""
    ok, why = cuda_available()
    if not ok:
        print(f"bench_gemm: skipped ({why})")
        return 0
    out = {}
    for m, k, n, dtype in SHAPES:
        params = {"m": m, "k": k, "n": n, "dtype": dtype}
        o = throughput(FalsifyContext("cuda", "full", 0, {"id": "bench", "tolerance": 0.0, "params": params}))
        out[f"{m}x{k}x{n}:{dtype}"] = {key: o.evidence[key] for key in ("tflops_from_median", "cases_measured")}
    o = overhead(FalsifyContext("cuda", "full", 0, {"id": "bench", "params": {"shapes": SHAPES}}))
    out["overhead"] = {"status": o.status.value, **o.evidence}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
