"""The fast RMSNorm kernel's candidate configurations against the device's copy bandwidth, in one run (issue #29).

For (T, D) = (8192, 4096) float32 by default, on the current GPU: the device's properties and the configuration the
property-based chooser (``native.fusion_kernels.choose_rows_config``) picks; then for the general kernel and every
candidate in ``ROWS_CANDIDATES`` (rows per block R, threads T, column ranges C, fold mode F): GB/s, the ratio
copy_ms / ours_ms with a 95% bootstrap interval of the median over interleaved trials (each trial: one block of
back-to-back launches of the candidate and one of ``cupy.copyto`` of the same array, CUDA events, after warm-up,
order alternating), the model's ratio, and whether its output is bit-identical to the host model of the spec
(``rmsnorm_host``, bitwise the IR denotation by FUSION-RMSNORM-bitwise) on a 67 x D slice with a NaN, a subnormal
square and an overflowing one, and on the whole array. Under 90 s on an H100.

    python benchmarks/bench_rmsnorm_variants.py [--rows 8192] [--d 4096] [--trials 15] [--iters 20]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _interval(values: list[float], seed: int = 0) -> tuple[float, float, float]:
    """(median, 2.5th, 97.5th percentile of the bootstrap medians)."""
    rng = np.random.default_rng(seed)
    v = np.asarray(values)
    meds = np.median(rng.choice(v, size=(2000, v.size)), axis=1)
    return float(np.median(v)), float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def main() -> None:
    """Print the device, the chooser's pick and, for each candidate, GB/s, copy ratio with interval, bitwise."""
    import cupy

    from native import fusion_kernels as fk
    from native.nvrtc import compile_function

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    t0 = time.time()
    rows, d = a.rows, a.d
    props = fk.device_props()
    general = compile_function(*fk.SOURCES["rmsnorm"], fk.ROUTE)
    fast = compile_function(*fk.SOURCES["rmsnorm_rows"], fk.ROUTE)
    from cupy.cuda import driver

    regs = int(driver.funcGetAttribute(4, fast.ptr))  # CU_FUNC_ATTRIBUTE_NUM_REGS
    pick = fk.choose_rows_config(props, rows, d, regs)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"device {name}; rows {rows} d {d}; fast kernel {regs} registers/thread")
    print(f"properties {props}; DRAM {props.bandwidth / 1e9:.0f} GB/s (memory clock x bus width)")
    print(f"chooser picks {pick.label()} (rows_config on this device: {fk.rows_config(fast, rows, d).label()})")

    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((rows, d), dtype=np.float32))
    w = cupy.asarray(rng.standard_normal((d,), dtype=np.float32))
    y, yc = cupy.empty_like(x), cupy.empty_like(x)
    small = rng.standard_normal((67, d)).astype(np.float32)
    small[0, :3] = (np.nan, 1e-40, 3e38)
    want_small = fk.rmsnorm_host(small, cupy.asnumpy(w), 1e-6).view(np.uint32)
    ref_full = cupy.asarray(fk.rmsnorm_host(cupy.asnumpy(x), cupy.asnumpy(w), 1e-6).view(np.uint32))  # the spec
    nbytes = 2 * x.nbytes
    eps = cupy.full((1,), np.float32(1e-6), dtype=cupy.float32)
    args = (x, w, np.int64(0), eps, np.int64(0), y, np.int64(rows), np.int64(d))

    def copy() -> None:
        cupy.copyto(yc, x)

    def block(fn, iters: int) -> float:  # noqa: ANN001
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        e.synchronize()
        return cupy.cuda.get_elapsed_time(s, e) / iters

    def measure(fn) -> tuple[float, tuple[float, float, float]]:  # noqa: ANN001
        for _ in range(3):
            fn(), copy()
        ratios, ours = [], []
        for k in range(a.trials):
            if k % 2:
                c_ms, o_ms = block(copy, a.iters), block(fn, a.iters)
            else:
                o_ms, c_ms = block(fn, a.iters), block(copy, a.iters)
            ratios.append(c_ms / o_ms)
            ours.append(o_ms)
        return float(np.median(ours)), _interval(ratios)

    copy_ms = float(np.median([block(copy, a.iters) for _ in range(a.trials)]))
    bw_copy = nbytes / copy_ms / 1e6
    print(f"copy {copy_ms:.4f} ms {bw_copy:.0f} GB/s ({bw_copy / (props.bandwidth / 1e9):.2f} of DRAM)")
    dram_ms = 1e3 * -(-rows // props.sm_count) * 8 * d / (props.bandwidth / props.sm_count)  # the model's floor
    header = f"{'config':<16} {'ms':>8} {'GB/s':>6} {'copy/ours':>9} {'[95% interval]':>16} {'model':>6} bitwise"
    print(header)
    ms, (r, lo, hi) = measure(lambda: fk.rmsnorm_cuda(general, x, w, 1e-6, out=y))
    same = bool(cupy.array_equal(y.view(cupy.uint32), ref_full))
    print(f"{'general':<16} {ms:8.4f} {nbytes / ms / 1e6:6.0f} {r:9.3f} [{lo:6.3f}, {hi:6.3f}] {'':>6} {same}")
    results = []
    for cfg in fk.ROWS_CANDIDATES:
        plan = fk.rmsnorm_rows_plan(rows, d, cfg.tile_rows, cfg.block)
        if not plan["accepts"] or plan["shared_bytes"] > props.smem_per_block:
            print(f"{cfg.label():<16} does not fit this device")
            continue

        run = fk.rmsnorm_rows_launch(fast, args, rows, d, cfg)  # the launch alone: no host work timed
        if run is None:
            print(f"{cfg.label():<16} refused by the driver")
            continue

        got = fk.rmsnorm_cuda((general, fast), cupy.asarray(small), w, 1e-6, config=cfg)
        same_small = bool(np.array_equal(fk._canon(cupy.asnumpy(got)).view(np.uint32), want_small))
        y.fill(0)
        run()
        same_full = bool(cupy.array_equal(y.view(cupy.uint32), ref_full))
        ms, (r, lo, hi) = measure(run)
        model = dram_ms / fk.rows_model_ms(props, rows, d, cfg, regs)  # the model's ratio to a copy at DRAM speed
        mark = " <- chooser" if cfg == pick else ""
        bits = "yes" if same_small and same_full else "NO"
        print(
            f"{cfg.label():<16} {ms:8.4f} {nbytes / ms / 1e6:6.0f} {r:9.3f} [{lo:6.3f}, {hi:6.3f}] {model:6.2f} "
            f"{bits}{mark}",
            flush=True,
        )
        results.append((r, lo, cfg.label(), bits))
    best = max(results)
    picked = next(z for z in results if z[2] == pick.label()) if any(z[2] == pick.label() for z in results) else None
    print(f"fastest {best[2]} copy/ours {best[0]:.3f} (low {best[1]:.3f})")
    if picked:
        print(f"chooser's {picked[2]} copy/ours {picked[0]:.3f} (low {picked[1]:.3f}); bitwise {picked[3]}")
    print(f"all bitwise: {all(z[3] == 'yes' for z in results)}; {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
