"""Print fused-attention timings against torch's scaled_dot_product_attention (CUDA events, after warm-up).

Usage: python benchmarks/bench_attention.py [--seq 2048] [--heads 32] [--head-dim 64] [--iters 20] [--causal]
Needs a CUDA device with CuPy and torch. First a correctness pass (each path against torch in float64 on small
shapes with masks and GQA, and against torch on the timed shape), then one line per path with both times and the
ratio; the float16 forward is timed with each way of reading V fragments (native.attention.V_LOAD), the VJP on its
default path and, at head dims up to 64, on each dQ path (native.attention.DQ_PATHS).

``--fwd16-table`` instead prints one line per float16 forward variant (native.attention.FWD16_VARIANTS) x head dim
{64, 128} x causal {no, yes} at (batch, heads, seq) = (1, 32, 2048) (``--heads``, ``--seq`` change it): the kernel's
time (CUDA events after warm-up, trials interleaved with torch SDPA's flash backend and its default, median and a
~95% order-statistic interval), TFLOP/s, the ratio flash / ours (median of the paired trials, interval), the time
through the entry point ``attention()``, and agreement: max |err| / derived bound (spec.attention.forward_bound,
tensor-core model) on head 0's first ``--bound-rows`` rows, max |err| against torch's float32 SDPA on every head,
and whether the variant equals the sync kernel. A variant that fails to compile or to agree prints its error and the
table goes on (the sync kernel's lines first, so a sticky CUDA error of a new variant loses only its own).
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


def _median_ci(xs: list[float]) -> tuple[float, float, float]:
    """(median, low, high): the order-statistic interval of the median with coverage >= 95% (binomial ranks)."""
    from math import comb

    xs = sorted(xs)
    n, c, k = len(xs), 0.0, 0
    while k < n // 2:
        p = comb(n, k) / 2**n
        if c + p > 0.025:
            break
        c, k = c + p, k + 1
    mid = xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
    return mid, xs[max(k - 1, 0)], xs[min(n - k, n - 1)]


def _events_ms(fn: object, iters: int) -> float:
    import cupy

    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / iters


def _fwd16_table(a: argparse.Namespace) -> None:
    """One line per float16 variant x head dim x causal: time, TFLOP/s, ratio to torch SDPA flash, agreement."""
    import contextlib
    import time

    import cupy
    import numpy as np
    import torch
    import torch.nn.functional as F

    from native import attention as na
    from spec import attention as sa

    peer = {"name": "flash"}
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def flash_ctx() -> object:
            if peer["name"] != "flash":
                return contextlib.nullcontext()
            return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:  # an older torch: the default backend stands in, and the lines say so
        peer["name"] = "sdpa-default(no sdpa_kernel)"

        def flash_ctx() -> object:
            return contextlib.nullcontext()

    t_start = time.perf_counter()
    b, h, s = a.batch, a.heads, a.seq
    props = cupy.cuda.runtime.getDeviceProperties(0)
    print(
        f"device: {props['name'].decode()}  torch {torch.__version__}  cupy {cupy.__version__}  shape (B, H, L) = "
        f"({b}, {h}, {s}) float16  trials {a.trials} x {a.iters} calls  bound on head 0 rows < {a.bound_rows}",
        flush=True,
    )
    inputs: dict[int, tuple] = {}
    bounds: dict[tuple[int, bool], tuple] = {}
    sync_out: dict[tuple[int, bool], object] = {}
    rows = min(a.bound_rows, s)
    for variant in sorted(na.FWD16_VARIANTS, key=lambda x: x != "sync"):
        for hd in (64, 128):
            if hd not in inputs:
                rng = cupy.random.RandomState(hd)
                inputs[hd] = tuple(
                    rng.standard_normal((b, h, s, hd), dtype=cupy.float32).astype(cupy.float16) for _ in range(3)
                )
            q, k, v = inputs[hd]
            tq, tk, tv = (torch.as_tensor(x, device="cuda") for x in (q, k, v))
            for causal in (False, True):
                tag = f"{variant:<10} hd {hd:<3} causal {'yes' if causal else 'no ':<3}"
                try:
                    run = na.prepare_forward(q, k, v, causal=causal, fwd16=variant)
                    out, _ = run()
                    cupy.cuda.Device().synchronize()
                    out = out.copy()
                except Exception as exc:  # a variant that does not compile or launch: say so, go on
                    print(f"{tag}  ERROR {type(exc).__name__}: {str(exc)[:1500]}", flush=True)
                    continue
                try:
                    if (hd, causal) not in bounds:
                        qh, kh, vh = (cupy.asnumpy(x[:1, :1]) for x in (q, k, v))
                        bounds[(hd, causal)] = sa.forward_bound(
                            qh[:, :, :rows],
                            kh,
                            vh,
                            causal=causal,
                            tiles=-(-s // na.BC),
                            u_out=sa.U16,
                            tensor_core=True,
                            tile_keys=na.BC,
                        )
                    ref, bound = bounds[(hd, causal)]
                    got = cupy.asnumpy(out[:1, :1, :rows]).astype(np.float64)
                    with np.errstate(all="ignore"):
                        ratio = float(np.nanmax(np.where(np.isfinite(got), np.abs(got - ref) / bound, np.inf)))
                    ref32 = F.scaled_dot_product_attention(tq.float(), tk.float(), tv.float(), is_causal=causal)
                    err32 = float((torch.as_tensor(out, device="cuda").float() - ref32).abs().max())
                    if variant == "sync":
                        sync_out[(hd, causal)] = out
                        same = "-"
                    elif (hd, causal) in sync_out:
                        same = "yes" if bool(cupy.array_equal(out, sync_out[(hd, causal)])) else "NO"
                    else:
                        same = "?"
                    agree = "yes" if ratio <= 1 else "NO"
                    check = f"err/bound {ratio:.3g} agree {agree}  max|err| vs fp32 {err32:.2e}  == sync {same}"
                except Exception as exc:
                    check = f"agreement check ERROR {type(exc).__name__}: {str(exc)[:500]}"
                try:
                    flops = 4 * b * h * s * s * hd / (2 if causal else 1)

                    def flash() -> object:
                        return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

                    try:
                        with flash_ctx():
                            flash()
                    except RuntimeError as exc:  # no flash kernel for this case: the default backend stands in
                        peer["name"] = f"sdpa-default(flash failed: {str(exc)[:80]})"
                    for _ in range(3):  # warm-up: every path once compiled, clocks up
                        run()
                        with flash_ctx():
                            flash()
                        flash()
                    ours_t, flash_t, dflt_t = [], [], []
                    for _ in range(a.trials):  # interleaved: ours, flash, torch's default, each over the same calls
                        ours_t.append(_events_ms(run, a.iters))
                        with flash_ctx():
                            flash_t.append(_events_ms(flash, a.iters))
                        dflt_t.append(_events_ms(flash, a.iters))
                    entry = _events_ms(
                        lambda: na.attention(q, k, v, causal=causal, device="cuda", fwd16=variant), a.iters
                    )
                    om, olo, ohi = _median_ci(ours_t)
                    fm, _, _ = _median_ci(flash_t)
                    dm, _, _ = _median_ci(dflt_t)
                    rm, rlo, rhi = _median_ci([f / o for f, o in zip(flash_t, ours_t, strict=True)])
                    print(
                        f"{tag}  ours {om:.4f} ms [{olo:.4f}, {ohi:.4f}] {flops / om / 1e9:6.1f} TFLOP/s  "
                        f"{peer['name']} {fm:.4f} ms {flops / fm / 1e9:6.1f} TFLOP/s  "
                        f"ratio peer/ours {rm:.3f} [{rlo:.3f}, {rhi:.3f}]  "
                        f"(sdpa default {dm:.4f} ms, ratio {dm / om:.3f}; via attention() {entry:.4f} ms)  {check}",
                        flush=True,
                    )
                except Exception as exc:
                    print(f"{tag}  timing ERROR {type(exc).__name__}: {str(exc)[:1500]}  {check}", flush=True)
    print(f"table done in {time.perf_counter() - t_start:.1f} s", flush=True)


def main() -> None:
    """Check, then time forward fp32, forward fp16 storage (each V load) and the fp32 VJP, ours and torch's."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--fwd16-table", action="store_true", help="the float16 variants table only (see the docstring)")
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--bound-rows", type=int, default=1024)
    a = ap.parse_args()
    if a.fwd16_table:  # needs only CuPy, torch and NumPy (no hypothesis, no z3)
        _fwd16_table(a)
        return
    import cupy
    import torch
    import torch.nn.functional as F

    from falsification.engine import time_ms
    from native import attention as na

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
            rq, rk, rv = (t.clone().requires_grad_(True) for t in (tq, tk, tv))
            tout = F.scaled_dot_product_attention(rq, rk, rv, is_causal=a.causal)
            theirs = time_ms(lambda: torch.autograd.grad(tout, (rq, rk, rv), tdo, retain_graph=True), a.iters, 5)
            plan = na.attention_plan(*shape[:2], shape[1], shape[2], shape[2], shape[3])
            for path in (None, *(na.DQ_PATHS if plan.tiled_vjp else ())):  # the default, then each tiled dQ path
                ours = time_ms(
                    lambda: na.attention_vjp(q, k, v, out, lse, do, causal=a.causal, device="cuda", dq_path=path),
                    a.iters,
                    5,
                )
                print(
                    f"vjp {dtype} [{path or 'default: ' + na.vjp_path(plan)}]: ours {ours:.3f} ms "
                    f"({2.5 * flops / ours / 1e9:.1f} TFLOP/s)  torch {theirs:.3f} ms  "
                    f"ratio torch/ours {theirs / ours:.3f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
