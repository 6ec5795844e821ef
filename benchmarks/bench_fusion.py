"""Print fusion-backend timings against peers, measured in one run (CUDA events, after warm-up).

Usage: python benchmarks/bench_fusion.py [--n 67108864] [--t 4096 --d 2048 --f 8192] [--rows 8192 --width 4096]
[--trials 15]. Needs a CUDA device with CuPy and torch. Per workload it times the contenders of the contract's
``fusion.perf`` items (falsification.fusion_tests: the same setups) in interleaved trials (falsification.measure:
calibrated blocks, the order reversed every trial) and prints each contender's median ms per call and each peer's
time over ours with a 95% bootstrap interval: a 4-op elementwise chain vs cupy.fuse and the unfused executor; the
SiLU-gated MLP vs its three GEMMs alone and torch; the fused RMSNorm vs a device copy of the same bytes and torch
eager; the cuDNN conv step vs torch's conv2d. Also the N ops -> M steps (kernels) count of each example program
(that part runs on the host too).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["main"]


def _table(name: str, built: Any, trials: int) -> None:
    """Time one workload's contenders (ours first) and print medians and peer/ours ratios with intervals."""
    from falsification import measure

    fns, configs, side = built
    contexts = dict(side).get("contexts", {})
    peers = {k: f for k, f in fns.items() if k != "ours"}
    comp = measure.Comparison(ours=fns["ours"], peers=peers, configs=configs, context=contexts)
    budget = measure.Budget()
    iters, _, _ = measure.calibrate(comp, budget)
    records = measure.timed_trials(comp, iters, trials)
    print(f"{name}  ({trials} trials x {iters} calls)")
    for who in comp.contenders():
        ms = measure.bootstrap_median([r[who] for r in records], 0.95, 2000, 0)
        line = f"  {who:<14} {ms.estimate:9.4f} ms [{ms.low:.4f}, {ms.high:.4f}]"
        if who != "ours":
            ratio = measure.bootstrap_median([r[who] / r["ours"] for r in records], 0.95, 2000, 0)
            line += f"   {who}/ours {ratio.estimate:.3f} [{ratio.low:.3f}, {ratio.high:.3f}]"
        print(line)


def main() -> None:
    """Print the step counts of the example programs, then the device figures."""
    from native import fusion as nf

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 26)
    ap.add_argument("--t", type=int, default=4096)
    ap.add_argument("--d", type=int, default=2048)
    ap.add_argument("--f", type=int, default=8192)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--trials", type=int, default=15)
    a = ap.parse_args()
    for name, (g, _) in sorted(nf.example_graphs().items()):
        c = nf.compile_subgraph(g).counts()
        print(f"program {name:<11} {c['ops']} ops -> {c['steps']} steps ({c['fused_kernels']} generated kernels)")
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no device: the step counts above are all this script can print
        print(f"no CUDA device ({type(exc).__name__}: {exc}); device figures skipped")
        return
    from falsification.fusion_tests import perf_chain, perf_conv, perf_mlp, perf_rmsnorm

    print(f"device: {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    _table(f"chain4 n={a.n}", perf_chain(a.n), a.trials)
    _table(f"mlp T={a.t} D={a.d} F={a.f}", perf_mlp(a.t, a.d, a.f), a.trials)
    _table(f"rmsnorm {a.rows}x{a.width}", perf_rmsnorm(a.rows, a.width), a.trials)
    _table("conv2d N16 C64 56x56 K64 3x3", perf_conv(16, 64, 56, 56, 64, 3), a.trials)


if __name__ == "__main__":
    main()
