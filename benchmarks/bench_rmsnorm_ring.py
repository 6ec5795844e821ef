"""An experimental fused RMSNorm kernel (issue 29 item 2), the "ring", against copy bandwidth and the shipped one.

Not the product's kernel: fusion-v1 proves and checks ``native.fusion_kernels``' two RMSNorm kernels only. This
script says whether the ring is worth making one (then it needs its plan, proofs and regimes there).

Why: the shipped rows kernel runs (8192, 4096) float32 in about 100-110 us on an H100 and on an H200 alike (5a897d5:
0.83x copy on the H100, 0.65x on the H200, whose copy is faster). It is bound by the fold, not by bandwidth: each
row is one dependent chain of 4096 adds (about 8 us), six blocks of two rows share an SM (its shared memory), and
the blocks that start together load, fold and write together, so an SM's loads and stores wait for its folds.

The ring:
* a persistent block per shared-memory slot (one row: q float4 and the 4 the fold reads ahead; about 13 per SM
  for d = 4096 at 128 threads), rows b, b + grid, ...;
* lane 0 folds the row in the slot (the shipped kernel's fold, the same order: the same bits); once r is known the
  slot is free, since the block writes y = (x * r) * w from x re-read through L2 (each SM holds about 13 rows in
  flight, about 27 MB over 132 SMs, inside the 50 MB L2), and the next row's cp.async into the slot flies while
  the block writes this one;
* the blocks that share an SM start ``stagger`` clock cycles apart (block b waits (b / SMs) * stagger), so that at
  any moment some fold while others load and store.

Prints copy's time, the launcher's (its timed choice) and every ring configuration's (threads, blocks per SM,
stagger): median ms over 20 single launches after warm-up, copy/ours, and whether the output is bitwise the
launcher's (it must be); then back-to-back launches of the best configurations (the contract item's timer).
The host emulator runs the ring's source bit for bit against the host model (tests/test_fusion_emulated.py).

    python benchmarks/bench_rmsnorm_ring.py [--rows 8192] [--d 4096]
"""

from __future__ import annotations

import argparse

import numpy as np

from native.fusion_kernels import COPY16_MACROS, FOLD4_MACRO, ROW_FOLD

__all__ = ["RING_NAME", "RING_SOURCE", "main", "ring_launch"]

RING_NAME = "kc_rmsnorm_ring"
RING_SOURCE = (
    r"""
#ifndef KC_T
#define KC_T 128
#endif
"""
    + COPY16_MACROS
    + "#ifndef KC_FOLD4\n"
    + FOLD4_MACRO
    + "#endif\n"
    + r"""extern "C" __global__ void __launch_bounds__(KC_T)
kc_rmsnorm_ring(const float* __restrict__ x, const float* __restrict__ w, long long w_stride,
                const float* __restrict__ eps, long long eps_stride, float* __restrict__ y, long long rows,
                long long d, long long sms, long long stagger) {
    extern __shared__ float4 slot[];  // one row: q float4, and the 4 the fold reads ahead
    __shared__ float rsh;
    const long long q = d >> 2;
    const long long step = (long long)gridDim.x;
    long long row = (long long)blockIdx.x;
    if (stagger > 0) {  // the blocks sharing an SM (b, b + sms, ...) start apart: their folds and copies interleave
        const long long wait = (row / sms) * stagger;
        const long long t0 = clock64();
        while (clock64() - t0 < wait) { }
    }
    if (row < rows) {
        const float4* x4 = (const float4*)(x + row * d);
        for (long long j = threadIdx.x; j < q; j += KC_T) KC_COPY16(slot + j, x4 + j);
    }
    for (; row < rows; row += step) {
        KC_COPY_WAIT();
        __syncthreads();
        if (threadIdx.x == 0) {  // the left fold from +0, four float4 of shared loads ahead of the add chain
            float acc = 0.0f;
            const float4* rr = slot;
"""
    + ROW_FOLD
    + r"""            rsh = (float)(1.0 / sqrt((double)v));
        }
        __syncthreads();
        const float rr = rsh;
        const long long next = row + step;
        if (next < rows) {  // the slot is free (r is known): the next row's copy flies while this one is written
            const float4* n4 = (const float4*)(x + next * d);
            for (long long j = threadIdx.x; j < q; j += KC_T) KC_COPY16(slot + j, n4 + j);
        }
        const float4* x4 = (const float4*)(x + row * d);  // re-read through L2, where the copy left it
        const float4* w4 = (const float4*)(w + row * w_stride);
        float4* y4 = (float4*)(y + row * d);
        for (long long j = threadIdx.x; j < q; j += KC_T) {
            const float4 a = x4[j], g = w4[j];
            float4 o;
            o.x = __fmul_rn(__fmul_rn(a.x, rr), g.x);
            o.y = __fmul_rn(__fmul_rn(a.y, rr), g.y);
            o.z = __fmul_rn(__fmul_rn(a.z, rr), g.z);
            o.w = __fmul_rn(__fmul_rn(a.w, rr), g.w);
            y4[j] = o;
        }
    }
}
"""
)


def ring_shared_bytes(d: int) -> int:
    """Dynamic shared memory of one ring block: the row's q float4 and the 4 the fold reads ahead."""
    return 16 * (d // 4 + 4)


def ring_launch(fn, threads: int, grid: int, x, w, eps, y, sms: int, stagger: int) -> None:  # noqa: ANN001
    """One launch of a compiled ring kernel on 16-byte aligned (rows, d) float32 rows, d % 4 == 0; ``w`` one row
    (broadcast) and ``eps`` one scalar."""
    rows, d = int(x.shape[0]), int(x.shape[1])
    args = (x, w, np.int64(0), eps, np.int64(0), y, np.int64(rows), np.int64(d), np.int64(sms), np.int64(stagger))
    fn((min(grid, rows),), (threads,), args, shared_mem=ring_shared_bytes(d))


def main() -> None:
    """Time copy, the shipped launcher and the ring's configurations; print copy/ours and bitwise agreement."""
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no CuPy or no device: say so, exit 0 (a benchmark, not a test)
        print(f"bench_rmsnorm_ring: needs a CUDA device with CuPy ({type(e).__name__}: {e})")
        return
    from bench_rmsnorm_variants import _time  # this directory: run as a script

    from falsification.engine import time_ms
    from native import fusion_kernels as fk
    from native.nvrtc import compile_function

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--d", type=int, default=4096)
    a = ap.parse_args()
    rows, d = a.rows, a.d
    props = cupy.cuda.runtime.getDeviceProperties(0)
    sms = int(props["multiProcessorCount"])
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((rows, d), dtype=np.float32))
    w = cupy.asarray(rng.standard_normal((d,), dtype=np.float32))
    eps = cupy.full((1,), np.float32(1e-6), dtype=cupy.float32)
    y = cupy.empty_like(x)
    general = compile_function(*fk.rmsnorm_source(), fk.ROUTE)
    source, name = fk.SOURCES["rmsnorm_rows"]
    shipped = (general, compile_function(source, name, fk.ROUTE))
    ref = fk.rmsnorm_cuda(shipped, x, w, eps)
    cupy.cuda.Device().synchronize()
    copy_ms = _time(cupy, lambda: cupy.copyto(y, x))
    ms = _time(cupy, lambda: fk.rmsnorm_cuda(shipped, x, w, eps, out=y))
    print(f"device {props['name'].decode()} ({sms} SMs) rows {rows} d {d}")
    print(f"copy {copy_ms:.4f} ms ({2 * x.nbytes / copy_ms / 1e6:.0f} GB/s)")
    print(f"shipped {ms:.4f} ms, copy/ours {copy_ms / ms:.3f}")
    results = []
    for threads in (128, 256):
        fn = compile_function(f"#define KC_T {threads}\n" + RING_SOURCE, RING_NAME, fk.ROUTE)
        if not fk._prefer_shared(fn, ring_shared_bytes(d)):
            print(f"ring T={threads}: {ring_shared_bytes(d)} bytes of shared memory do not fit")
            continue
        for per_sm in (6, 8, 10, 12, 13, 14):
            for stagger in (0, 1024, 2048, 4096):
                y.fill(0)

                def launch(fn=fn, threads=threads, per_sm=per_sm, stagger=stagger) -> None:  # noqa: ANN001
                    ring_launch(fn, threads, sms * per_sm, x, w, eps, y, sms, stagger)

                launch()
                same = bool(cupy.array_equal(y.view(cupy.uint32), ref.view(cupy.uint32)))
                ms = _time(cupy, launch)
                results.append((round(copy_ms / ms, 3), threads, per_sm, stagger, same))
                print(
                    f"ring T={threads} blocks/SM={per_sm:2d} stagger={stagger:4d}: {ms:.4f} ms "
                    f"copy/ours {copy_ms / ms:.3f} bitwise={same}",
                    flush=True,
                )
    best = sorted(results, reverse=True)[:4]
    print("best single-launch (copy/ours, threads, blocks/SM, stagger, bitwise):", best)
    copy_b = time_ms(lambda: cupy.copyto(y, x), iters=50, warmup=5)
    shipped_b = time_ms(lambda: fk.rmsnorm_cuda(shipped, x, w, eps, out=y), iters=50, warmup=5)
    print(f"back-to-back: copy {copy_b:.4f} ms, shipped {shipped_b:.4f} ms (copy/ours {copy_b / shipped_b:.3f})")
    for _, threads, per_sm, stagger, _same in best:
        fn = compile_function(f"#define KC_T {threads}\n" + RING_SOURCE, RING_NAME, fk.ROUTE)
        ms = time_ms(
            lambda fn=fn, threads=threads, per_sm=per_sm, stagger=stagger: ring_launch(
                fn, threads, sms * per_sm, x, w, eps, y, sms, stagger
            ),
            iters=50,
            warmup=5,
        )
        config = f"T={threads} blocks/SM={per_sm} stagger={stagger}"
        print(f"back-to-back ring {config}: {ms:.4f} ms copy/ours {copy_b / ms:.3f}")


if __name__ == "__main__":
    main()
