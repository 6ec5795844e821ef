"""Conv2d on the fusion backend: the direct kernel vs the cuDNN step vs torch's conv2d, and the step's error/bound.

Usage: python benchmarks/bench_conv.py [--n 16 --c 64 --hw 56 --k 64 --r 3] [--trials 12]
Needs a CUDA device with CuPy and torch (prints why and exits 0 otherwise). One invocation, well under 60 s on an
H100: the problem of issue 29 (fp32, N16 C64 56x56 K64 3x3, padding 1, bias) as a one-conv2d program, run by the
fusion executor planned on cuDNN (``native.cudnn``: TF32 off, deterministic, no benchmarking) and on the direct
kernel (``conv="direct"``, bitwise the IR), against ``torch.nn.functional.conv2d`` with TF32 off (torch's other
cuDNN defaults). Timing: CUDA events around blocks of back-to-back calls after warm-up, the contenders interleaved
in alternating order each trial (``falsification.measure.timed_trials``); per contender the median ms per call
with a 95% bootstrap interval, and the ratio torch / cuDNN step per trial (median and interval). Then the step's
max |error| / bound on a few inputs (the bound: gamma_{K+1} (sum |w x| + |b|) + (K+1) 2^-149 of the float64
value, CONV-CUDNN-bound's) and whether the direct kernel is bitwise the denotation, and the CUDA kernels cuDNN
ran for the step (torch.profiler: the bound models GEMM-like algorithms, not Winograd or FFT).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

__all__ = ["main"]


def _interval(values: list[float], seed: int) -> str:
    from falsification import measure

    i = measure.bootstrap_median(values, 0.95, 2000, seed)
    return f"{i.estimate:.4f} [{i.low:.4f}, {i.high:.4f}]"


def _error_over_bound(shape: tuple[int, int, int, int, int, int], seed: int, bitwise: bool) -> tuple[float, object]:
    """The cuDNN step's max |y - exact| / bound on one input, and (``bitwise``) whether the direct kernel is bitwise
    the denotation (the softfloat denotation takes seconds past small shapes: "not checked" there)."""
    import cupy

    from falsification.fusion_tests import conv_graph
    from native import fusion as nf
    from spec import conv as sc
    from spec.fusion import same_bits
    from spec.ir.denote import denote_all

    n, c, h, w, k, r = shape
    g, p = conv_graph(n, c, h, w, k, r, seed=seed)
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)
    got = nf.run_program(g, p, [x], "cuda", conv="cudnn")[1]
    e = p.get(1)
    val, mag = sc.conv_f64(x, e["weight"], e["bias"], 1, r // 2, 1)
    kk = c * r * r + 1
    bound = kk * 2.0**-24 / (1 - kk * 2.0**-24) * mag + kk * 2.0**-149
    ratio = float(np.max(np.abs(got.astype(np.float64) - val) / bound))
    if not bitwise:
        return ratio, "not checked"
    direct = nf.run_program(g, p, [x], "cuda", conv="direct")[1]
    cupy.cuda.Device().synchronize()
    return ratio, same_bits(direct, denote_all(g, p, [x]).value[1])


def _cudnn_kernels(fn: object) -> list[str]:
    """Names of the CUDA kernels one call of ``fn`` launches (torch.profiler), or the reason there are none."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()  # type: ignore[operator]
            import cupy

            cupy.cuda.Device().synchronize()
        names = [ev.name for ev in prof.events() if str(getattr(ev, "device_type", "")).endswith("CUDA")]
        cuda = [n for n in dict.fromkeys(names) if not n.startswith(("cuda", "Memcpy", "Memset"))]
        return cuda or ["(the profiler recorded no kernel)"]
    except Exception as exc:  # the profiler is diagnostics only
        return [f"(profiler unavailable: {type(exc).__name__}: {exc})"]


def main() -> int:
    """Print the three timings with intervals, the ratio, and the step's error/bound; exit 0 (figures only)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--c", type=int, default=64)
    ap.add_argument("--hw", type=int, default=56)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--r", type=int, default=3)
    ap.add_argument("--trials", type=int, default=12)
    a = ap.parse_args()
    from native.cudnn import cudnn_missing

    why = cudnn_missing()
    if why:
        print(f"bench_conv: skipped ({why})")
        return 0
    t_start = time.perf_counter()
    import cupy
    import torch

    from falsification import measure
    from falsification.fusion_tests import conv_graph, perf_conv
    from native import fusion as nf
    from native.cudnn import versions

    print(f"device: {measure.device_name()}; {versions()}")
    fns, configs, side = perf_conv(a.n, a.c, a.hw, a.hw, a.k, a.r)
    print(f"problem {side['shape']} fp32; steps {side['steps']}; {side['conv_route']}")
    print(f"torch peer: {configs['torch']}")
    g, p = conv_graph(a.n, a.c, a.hw, a.hw, a.k, a.r)
    ex_direct = nf.CUDAExecutor(nf.compile_subgraph(g, payload=p, conv="direct"), p, "cuda")
    x = cupy.random.RandomState(0).standard_normal((a.n, a.c, a.hw, a.hw), dtype=cupy.float32)
    fast = measure.Comparison(
        ours=fns["ours"],
        peers={"torch": fns["torch"]},
        configs=configs,
        context=side["contexts"],
        ours_name="cudnn_step",
    )
    budget = measure.Budget()
    iters, first, warm = measure.calibrate(fast, budget)
    trials = measure.timed_trials(fast, iters, a.trials)
    slow = measure.Comparison(ours=lambda: ex_direct.run([x]), peers={"cudnn_step": fns["ours"]}, ours_name="direct")
    s_iters, s_first, _ = measure.calibrate(slow, budget)
    s_trials = measure.timed_trials(slow, max(1, s_iters), max(4, a.trials // 3))
    flops = 2.0 * a.n * a.k * a.hw * a.hw * a.c * a.r * a.r
    print(f"timing: CUDA events, {iters} calls per block (direct: {max(1, s_iters)}), {a.trials} interleaved trials")
    for name, recs in (("direct", s_trials), ("cudnn_step", trials), ("torch", trials)):
        ms = [r[name] for r in recs]
        med = float(np.median(ms))
        print(f"  {name:<11} {_interval(ms, 1):>32} ms per call  ({flops / med / 1e9:.1f} TFLOP/s)")
    ratio = [r["torch"] / r["cudnn_step"] for r in trials]
    print(f"  ratio torch / cudnn_step: {_interval(ratio, 2)} (target >= 0.95)")
    dr = [r["direct"] / r["cudnn_step"] for r in s_trials]
    print(f"  ratio direct / cudnn_step: {_interval(dr, 3)} (the direct kernel's time over the step's)")
    print("  cuDNN kernels of the step:", "; ".join(_cudnn_kernels(fns["ours"])))
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=False, allow_tf32=False):
        print("  cuDNN kernels of torch  :", "; ".join(_cudnn_kernels(fns["torch"])))
    print("error of the cuDNN step / its bound (and the direct kernel bitwise the denotation):")
    for seed, shape in enumerate(
        ((2, 3, 9, 11, 4, 3), (1, 16, 14, 14, 8, 1), (1, 8, 12, 12, 5, 5), (1, a.c, a.hw, a.hw, a.k, a.r))
    ):
        ratio_e, bitwise = _error_over_bound(shape, seed, shape[0] == 2 or shape[1] < 32)
        print(
            f"  N{shape[0]} C{shape[1]} {shape[2]}x{shape[3]} K{shape[4]} {shape[5]}x{shape[5]}: "
            f"max err/bound {ratio_e:.3g}  direct bitwise {bitwise}"
        )
    print(f"wall {time.perf_counter() - t_start:.1f} s (warm-up s: {warm}; calibration ms: {first}, {s_first})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
