"""Print fusion-backend timings against peers, measured in one run (CUDA events, after warm-up).

Usage: python benchmarks/bench_fusion.py [--n 67108864] [--t 4096 --d 2048 --f 8192] [--rows 8192 --width 4096]
Needs a CUDA device with CuPy and torch. Prints, per workload, our time, the peers' times and the ratios:
a 4-op elementwise chain vs cupy.fuse and vs the unfused executor; the SiLU-gated MLP vs its three GEMMs alone and
vs torch; the fused RMSNorm vs a device copy of the same bytes and vs torch eager. Also the N ops -> M steps
(kernels) count of each example program (that part runs on the host too).
"""

from __future__ import annotations

import argparse

__all__ = ["main"]


def main() -> None:
    """Print the step counts of the example programs, then the device figures."""
    from falsification.fusion_tests import perf_chain, perf_mlp, perf_rmsnorm
    from native import fusion as nf

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 26)
    ap.add_argument("--t", type=int, default=4096)
    ap.add_argument("--d", type=int, default=2048)
    ap.add_argument("--f", type=int, default=8192)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--width", type=int, default=4096)
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
    print(f"device: {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    ch = perf_chain(a.n)
    print(
        f"chain4 n={a.n}: ours {ch['ours_ms']:.4f} ms  cupy.fuse {ch['cupy_fuse_ms']:.4f} ms  unfused "
        f"{ch['unfused_ms']:.4f} ms  -> {ch['vs_cupy_fuse']:.3f}x fuse, {ch['vs_unfused']:.3f}x unfused, "
        f"bitwise vs unfused {ch['bitwise_vs_unfused']}"
    )
    ml = perf_mlp(a.t, a.d, a.f)
    print(
        f"mlp T={a.t} D={a.d} F={a.f} ({ml['steps']} steps): ours {ml['ours_ms']:.4f} ms  3 GEMMs "
        f"{ml['three_gemms_ms']:.4f} ms  torch {ml['torch_ms']:.4f} ms  -> {ml['time_over_gemms']:.3f}x the GEMMs' "
        f"time, {ml['vs_torch']:.3f}x torch"
    )
    rn = perf_rmsnorm(a.rows, a.width)
    print(
        f"rmsnorm {a.rows}x{a.width}: ours {rn['ours_ms']:.4f} ms ({rn['ours_GBps']:.0f} GB/s)  copy "
        f"{rn['copy_ms']:.4f} ms ({rn['copy_GBps']:.0f} GB/s)  torch eager {rn['torch_eager_ms']:.4f} ms  -> "
        f"{rn['vs_copy_bandwidth']:.3f}x copy bandwidth, {rn['vs_torch']:.3f}x torch; kernel alone "
        f"{rn['kernel_only_ms']:.4f} ms, chosen {rn['rmsnorm_kernel']}"
    )


if __name__ == "__main__":
    main()
