"""Print fused-attention timings against torch's scaled_dot_product_attention (CUDA events, after warm-up).

Usage: python benchmarks/bench_attention.py [--seq 2048] [--heads 32] [--head-dim 64] [--iters 20] [--causal]
Needs a CUDA device with CuPy and torch. First a correctness pass (each path against torch in float64 on small
shapes with masks and GQA, and against torch on the timed shape), then one line per path with both times and the
ratio; the float16 forward is timed with each way of reading V fragments (native.attention.V_LOAD).
"""

# ruff: noqa: B023 - each lambda is timed inside its own loop iteration
from __future__ import annotations

import argparse

__all__ = ["main"]


def _check(a: argparse.Namespace) -> None:
    """Max errors of ours against torch float64 (small shapes, masks, GQA) and torch on the timed shape."""
    import cupy
    import torch
    import torch.nn.functional as F

    from native import attention as na

    def t64(x: object) -> torch.Tensor:
        return torch.as_tensor(cupy.asnumpy(x), dtype=torch.float64)

    def ref(q: object, k: object, v: object, causal: bool, lens: list[int] | None, do: object) -> tuple:
        tq, tk, tv = (t64(x).requires_grad_(True) for x in (q, k, v))
        g = tq.shape[1] // tk.shape[1]
        ke, ve = tk.repeat_interleave(g, 1), tv.repeat_interleave(g, 1)
        s = tq @ ke.transpose(-1, -2) / tq.shape[-1] ** 0.5
        lq, lk = s.shape[-2:]
        ok = torch.ones(s.shape, dtype=torch.bool)
        if lens is not None:
            ok &= (torch.arange(lk)[None, :] < torch.tensor(lens)[:, None])[:, None, None, :]
        if causal:
            ok &= torch.ones(lq, lk, dtype=torch.bool).tril()
        s = s.masked_fill(~ok, float("-inf"))
        m = s.detach().amax(-1, keepdim=True)
        e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
        p = e / e.sum(-1, keepdim=True).clamp_min(1e-300)  # fully masked rows: 0, with zero gradients
        out = p @ ve
        grads = torch.autograd.grad(out, (tq, tk, tv), t64(do))
        return out.detach(), grads

    rng = cupy.random.RandomState(1)
    shapes = [
        (2, 4, 2, 150, 140, 64, True, [140, 77]),
        (1, 2, 1, 300, 260, 64, False, None),
        (1, 2, 2, 70, 90, 96, True, [0]),
        (2, 3, 1, 129, 65, 7, False, [65, 3]),
    ]
    for b, hq, hkv, lq, lk, d, causal, lens in shapes:
        q = rng.uniform(-2, 2, (b, hq, lq, d), dtype=cupy.float32)
        k = rng.uniform(-2, 2, (b, hkv, lk, d), dtype=cupy.float32)
        v = rng.uniform(-1, 1, (b, hkv, lk, d), dtype=cupy.float32)
        do = rng.uniform(-1, 1, (b, hq, lq, d), dtype=cupy.float32)
        out64, g64 = ref(q, k, v, causal, lens, do)
        out, lse = na.attention(q, k, v, causal=causal, kv_lens=lens, device="cuda")
        grads = na.attention_vjp(q, k, v, out, lse, do, causal=causal, kv_lens=lens, device="cuda")
        errs = [float((t64(x) - r).abs().max()) for x, r in zip((out, *grads), (out64, *g64), strict=True)]
        line = f"check f32 {(b, hq, hkv, lq, lk, d, causal, lens)}: max|err| out/dq/dk/dv " + " ".join(
            f"{e:.2e}" for e in errs
        )
        for vl in ("ldmatrix", "lds"):
            na.V_LOAD = vl
            o16, _ = na.attention(
                *(x.astype(cupy.float16) for x in (q, k, v)), causal=causal, kv_lens=lens, device="cuda"
            )
            r16, _ = ref(*(x.astype(cupy.float16) for x in (q, k, v)), causal, lens, do)
            line += f"  f16[{vl}] {float((t64(o16) - r16).abs().max()):.2e}"
        na.V_LOAD = "ldmatrix"
        print(line, flush=True)
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    for dtype in ("float32", "float16"):
        q, k, v = (rng.standard_normal(shape, dtype=cupy.float32).astype(dtype) for _ in range(3))
        tq, tk, tv = (torch.as_tensor(x, device="cuda") for x in (q, k, v))
        theirs = F.scaled_dot_product_attention(tq.double(), tk.double(), tv.double(), is_causal=a.causal)
        for vl in ("ldmatrix", "lds") if dtype == "float16" else ("-",):
            na.V_LOAD = vl if vl != "-" else "ldmatrix"
            ours, _ = na.attention(q, k, v, causal=a.causal, device="cuda")
            err = float((torch.as_tensor(ours, device="cuda").double() - theirs).abs().max())
            print(f"check {dtype}[{vl}] timed shape: max|ours - torch float64| {err:.2e}", flush=True)
    na.V_LOAD = "ldmatrix"


def main() -> None:
    """Check, then time forward fp32, forward fp16 storage (each V load) and the fp32 VJP, ours and torch's."""
    import cupy
    import torch
    import torch.nn.functional as F

    from falsification.engine import time_ms
    from native import attention as na

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    a = ap.parse_args()
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    print(f"device: {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}  shape {shape} causal={a.causal}")
    if not a.no_check:
        _check(a)
    rng = cupy.random.RandomState(0)
    flops = 4 * a.batch * a.heads * a.seq * a.seq * a.head_dim / (2 if a.causal else 1)
    for dtype in ("float32", "float16"):
        q, k, v, do = (rng.standard_normal(shape, dtype=cupy.float32).astype(dtype) for _ in range(4))
        tq, tk, tv, tdo = (torch.as_tensor(x, device="cuda") for x in (q, k, v, do))
        theirs = time_ms(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=a.causal), a.iters, 5)
        for vl in ("ldmatrix", "lds") if dtype == "float16" else ("ldmatrix",):
            na.V_LOAD = vl
            ours = time_ms(lambda: na.attention(q, k, v, causal=a.causal, device="cuda"), a.iters, 5)
            print(
                f"forward {dtype}{'[' + vl + ']' if dtype == 'float16' else ''}: ours {ours:.3f} ms "
                f"({flops / ours / 1e9:.1f} TFLOP/s)  torch {theirs:.3f} ms ({flops / theirs / 1e9:.1f} TFLOP/s)  "
                f"ratio torch/ours {theirs / ours:.3f}",
                flush=True,
            )
        na.V_LOAD = "ldmatrix"
        if dtype == "float32":
            out, lse = na.attention(q, k, v, causal=a.causal, device="cuda")
            ours = time_ms(lambda: na.attention_vjp(q, k, v, out, lse, do, causal=a.causal, device="cuda"), a.iters, 5)
            rq, rk, rv = (t.clone().requires_grad_(True) for t in (tq, tk, tv))
            tout = F.scaled_dot_product_attention(rq, rk, rv, is_causal=a.causal)
            theirs = time_ms(lambda: torch.autograd.grad(tout, (rq, rk, rv), tdo, retain_graph=True), a.iters, 5)
            print(
                f"vjp {dtype}: ours {ours:.3f} ms ({2.5 * flops / ours / 1e9:.1f} TFLOP/s)  torch {theirs:.3f} ms  "
                f"ratio torch/ours {theirs / ours:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
