"""Print fused-attention timings against torch's scaled_dot_product_attention (CUDA events, after warm-up).

Usage: python benchmarks/bench_attention.py [--seq 2048] [--heads 32] [--head-dim 64] [--iters 20]
Needs a CUDA device with CuPy and torch; prints one line per (path, dtype) with both times and the ratio.
"""

# ruff: noqa: B023 - each lambda is timed inside its own loop iteration
from __future__ import annotations

import argparse

__all__ = ["main"]


def main() -> None:
    """Time forward fp32, forward fp16 storage and the fp32 VJP, ours and torch's, and print the figures."""
    import cupy
    import torch
    import torch.nn.functional as F

    from falsification.engine import time_ms
    from native.attention import attention, attention_vjp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--causal", action="store_true")
    a = ap.parse_args()
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    rng = cupy.random.RandomState(0)
    print(f"device: {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}  shape {shape} causal={a.causal}")
    for dtype in ("float32", "float16"):
        q, k, v, do = (rng.standard_normal(shape, dtype=cupy.float32).astype(dtype) for _ in range(4))
        tq, tk, tv, tdo = (torch.as_tensor(x, device="cuda") for x in (q, k, v, do))
        ours = time_ms(lambda: attention(q, k, v, causal=a.causal, device="cuda"), a.iters, 5)
        theirs = time_ms(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=a.causal), a.iters, 5)
        flops = 4 * a.batch * a.heads * a.seq * a.seq * a.head_dim / (2 if a.causal else 1)
        print(
            f"forward {dtype}: ours {ours:.3f} ms ({flops / ours / 1e9:.1f} TFLOP/s)  torch {theirs:.3f} ms  "
            f"ratio torch/ours {theirs / ours:.3f}"
        )
        if dtype == "float32":
            out, lse = attention(q, k, v, causal=a.causal, device="cuda")
            ours = time_ms(lambda: attention_vjp(q, k, v, out, lse, do, causal=a.causal, device="cuda"), a.iters, 5)
            rq, rk, rv = (t.clone().requires_grad_(True) for t in (tq, tk, tv))
            tout = F.scaled_dot_product_attention(rq, rk, rv, is_causal=a.causal)
            theirs = time_ms(lambda: torch.autograd.grad(tout, (rq, rk, rv), tdo, retain_graph=True), a.iters, 5)
            print(f"vjp {dtype}: ours {ours:.3f} ms  torch {theirs:.3f} ms  ratio torch/ours {theirs / ours:.3f}")


if __name__ == "__main__":
    main()
