"""Per-call time of small GEMMs: the raw cuBLAS binding, native.gemm.matmul (uncached and cached), the bound call,
cupy.matmul and torch.matmul, and the ratios issue #29 names.

For each shape every contender runs in interleaved trials (the order rotated each trial, 20 warm-up calls
first), and each trial measures three things per call: CUDA events over a block of back-to-back calls, the wall
clock over the same block up to its last event, and the host's enqueue cost alone (the block issued while a
spin kernel holds the GPU, so no call waits for another). Printed: medians with a 95% bootstrap interval of
the median, and the per-trial ratios' medians and intervals:

* ``matmul_cached / raw`` and ``bound / raw`` (the goal: <= 1.2), ``matmul_uncached / raw`` (the first call
  of a key: validation, guard and preparation);
* ``best_peer / matmul_cached`` and ``best_peer / bound``: the faster of cupy.matmul and torch.matmul per trial
  over ours (FALSIFY-CUBLAS-010's figure; the goal: >= 0.9).

One invocation takes ~20-40 s on an H100 or H200; needs CuPy (and torch for its peer; without torch it is left
out). Exit 0: figures only, no verdict.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from falsification.measure import bootstrap_median
from native import gemm as ng
from obligations.core.device import cuda_available

__all__ = ["main"]

SHAPES = ((4096, 256, 1024), (256, 256, 256), (512, 512, 512))  # (m, k, n): the thin shape, two small squares

_SPIN = r"""
extern "C" __global__ void kc_bench_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def _interval(values: list[float], seed: int) -> dict[str, float]:
    iv = bootstrap_median(values, 0.95, 2000, seed)
    return {"median": round(iv.estimate, 4), "low": round(iv.low, 4), "high": round(iv.high, 4)}


def _contenders(m: int, k: int, n: int, dtype: str) -> dict[str, Callable[[], Any]]:
    """Every timed call of one shape, on the same operands; C-level partials where the call allows one."""
    import cupy
    from cupy.cuda import cublas

    rng = cupy.random.RandomState(0)
    a = rng.standard_normal((m, k), dtype=cupy.float32).astype(dtype)
    b = rng.standard_normal((k, n), dtype=cupy.float32).astype(dtype)
    c = cupy.zeros((m, n), dtype)
    ng.matmul(a, b, c=c, device="cuda")  # the context exists and its stream is bound
    gc = ng.get_context("cuda")
    scalars = np.array([1.0, 0.0], np.float32)  # host-pointer alpha and beta, alive for the whole run
    t = ng.DATA_TYPES[dtype]
    # Row-major C = A B is column-major C^T = B^T A^T: cuBLAS (m, n, k) = (n, m, k), B first.
    raw = functools.partial(
        cublas.gemmEx,
        gc.handle,
        ng.OP_N,
        ng.OP_N,
        n,
        m,
        k,
        scalars.ctypes.data,
        b.data.ptr,
        t,
        n,
        a.data.ptr,
        t,
        k,
        scalars.ctypes.data + 4,
        c.data.ptr,
        t,
        n,
        ng.COMPUTE_32F,
        ng.GEMM_DEFAULT,
    )
    raw.keep = (a, b, c, scalars)  # type: ignore[attr-defined]
    cached = functools.partial(ng.matmul, a, b, c=c, device="cuda")

    def uncached() -> Any:
        ng.clear_calls()  # every call is the first of its key
        return ng.matmul(a, b, c=c, device="cuda")

    out = {
        "raw": raw,
        "matmul_uncached": uncached,
        "matmul_cached": cached,
        "bound": ng.bind_matmul(a, b, c, device="cuda"),
        "cupy.matmul": functools.partial(cupy.matmul, a, b),
    }
    try:
        import torch
    except ImportError:
        return out
    ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
    out["torch.matmul"] = functools.partial(torch.matmul, ta, tb)
    return out


def _trial(fn: Callable[[], Any], iters: int, spin: Any, spin_cycles: int) -> tuple[float, float, float]:
    """(event us, wall us, enqueue us) per call of one block of ``iters`` calls each."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    stream.synchronize()
    t0 = time.perf_counter()
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    wall = time.perf_counter() - t0
    event = cupy.cuda.get_elapsed_time(start, stop) * 1e3
    spin((1,), (1,), (np.int64(spin_cycles),))
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    enqueue = time.perf_counter() - t0
    stream.synchronize()
    return event / iters, wall * 1e6 / iters, enqueue * 1e6 / iters


def _ratios(trials: list[dict[str, float]], names: list[str], seed: int) -> dict[str, dict[str, float]]:
    """Per-trial ratios (each trial's contenders measured back to back), their medians and intervals."""
    peers = [p for p in ("cupy.matmul", "torch.matmul") if p in names]
    pairs: dict[str, Callable[[dict[str, float]], float]] = {
        "matmul_cached / raw": lambda r: r["matmul_cached"] / r["raw"],
        "bound / raw": lambda r: r["bound"] / r["raw"],
        "matmul_uncached / raw": lambda r: r["matmul_uncached"] / r["raw"],
    }
    for ours in ("matmul_cached", "bound"):
        pairs[f"best_peer / {ours}"] = lambda r, ours=ours: min(r[p] for p in peers) / r[ours]
    return {name: _interval([f(r) for r in trials], seed + i) for i, (name, f) in enumerate(pairs.items())}


def bench_shape(
    m: int, k: int, n: int, dtype: str, trials: int, iters: int, spin: Any, spin_cycles: int
) -> dict[str, Any]:
    """Every contender of one shape over ``trials`` interleaved trials: per-call figures and ratios."""
    fns = _contenders(m, k, n, dtype)
    names = list(fns)
    for fn in fns.values():
        for _ in range(20):
            fn()
    rows: dict[str, list[dict[str, float]]] = {"event": [], "wall": [], "enqueue": []}
    for t in range(trials):
        order = names[t % len(names) :] + names[: t % len(names)]
        if t % 2:
            order.reverse()
        got = {name: _trial(fns[name], iters, spin, spin_cycles) for name in order}
        for i, metric in enumerate(rows):
            rows[metric].append({name: got[name][i] for name in names})
    seed = m * 7919 + k * 31 + n
    return {
        "shape_mkn": [m, k, n],
        "dtype": dtype,
        "calls_per_block": iters,
        "trials": trials,
        "us_per_call": {
            metric: {name: _interval([r[name] for r in recs], seed) for name in names} for metric, recs in rows.items()
        },
        "ratios": {metric: _ratios(recs, names, seed) for metric, recs in rows.items()},
        "tflops_event_median": {
            name: round(2.0 * m * n * k / (statistics.median(r[name] for r in rows["event"]) * 1e-6) / 1e12, 2)
            for name in names
        },
    }


def _table(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        m, k, n = r["shape_mkn"]
        lines.append(f"\n{m}x{k}x{n} {r['dtype']}  (us per call: median [95% interval])")
        names = list(r["us_per_call"]["event"])
        lines.append(f"  {'call':<16}" + "".join(f"{metric:>28}" for metric in r["us_per_call"]))
        for name in names:
            cells = "".join(
                f"{v['median']:>10.2f} [{v['low']:.2f}, {v['high']:.2f}]".rjust(28)
                for v in (r["us_per_call"][metric][name] for metric in r["us_per_call"])
            )
            lines.append(f"  {name:<16}{cells}")
        lines.append(f"  {'ratio':<24}" + "".join(f"{metric:>28}" for metric in r["ratios"]))
        for ratio in r["ratios"]["event"]:
            cells = "".join(
                f"{v['median']:>10.3f} [{v['low']:.3f}, {v['high']:.3f}]".rjust(28)
                for v in (r["ratios"][metric][ratio] for metric in r["ratios"])
            )
            lines.append(f"  {ratio:<24}{cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table and the figures as JSON; exit 0 (figures only)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="float16")
    p.add_argument("--trials", type=int, default=15)
    p.add_argument("--iters", type=int, default=200, help="calls per timed block")
    p.add_argument("--spin-cycles", type=int, default=150_000_000, help="GPU cycles the enqueue block runs under")
    p.add_argument("--shape", type=int, nargs=3, action="append", metavar=("M", "K", "N"), help="default: 3 shapes")
    args = p.parse_args(argv)
    ok, why = cuda_available()
    if not ok:
        print(f"bench_gemm_host: skipped ({why})")
        return 0
    import cupy

    spin = cupy.RawKernel(_SPIN, "kc_bench_spin")
    t0 = time.perf_counter()
    results = [
        bench_shape(m, k, n, args.dtype, args.trials, args.iters, spin, args.spin_cycles)
        for m, k, n in (args.shape or SHAPES)
    ]
    dev = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    name = dev["name"].decode() if isinstance(dev["name"], bytes) else str(dev["name"])
    print(f"bench_gemm_host: {name}, cupy {cupy.__version__}, {time.perf_counter() - t0:.1f} s")
    print(_table(results))
    print(json.dumps({"device": name, "cupy": cupy.__version__, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
