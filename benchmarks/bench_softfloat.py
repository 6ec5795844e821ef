"""Throughput of spec.softfloat binary32 add/mul/fma/div/sqrt, next to Berkeley SoftFloat and MPFR.

CPU (one core, NumPy):   python benchmarks/bench_softfloat.py
GPU (CuPy, same code):   python benchmarks/bench_softfloat.py --device cuda --n 2^28

Columns: the vectorised reference in operations per second (on CUDA: the fused kernels of
spec.softfloat.device, next to the array code on the same device, timed in the same run); Berkeley
SoftFloat 3e through the `softfloatpy` binding, one call at a time; MPFR through gmpy2 (precision 24,
subnormalize), one call at a time. Per-call oracles are timed on --oracle-n elements in the same run.
On CUDA the script also checks the GPU results bit for bit against the NumPy run of the same code on a
slice.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from spec import softfloat as sf  # noqa: E402
from spec.softfloat import core  # noqa: E402
from spec.softfloat import device as sf_device  # noqa: E402

OPS = ("add", "mul", "fma", "div", "sqrt")
GOALS_CPU = {"add": 30e6, "mul": 30e6, "fma": 10e6, "div": 10e6, "sqrt": 10e6}
GOALS_GPU = {"add": 5e9}
NARGS = {"add": 2, "mul": 2, "fma": 3, "div": 2, "sqrt": 1}


def parse_n(s: str) -> int:
    """Accept 4194304, 2^22, 2**22 or 1<<22."""
    s = s.replace("**", "^").replace(" ", "")
    if "^" in s:
        b, e = s.split("^")
        return int(b) ** int(e)
    if "<<" in s:
        b, e = s.split("<<")
        return int(b) << int(e)
    return int(s)


def make_operands(xp, n: int, seed: int):
    """Three arrays of binary32 bit patterns: normal-range values of mixed sign and magnitude."""
    rng = np.random.default_rng(seed)
    chunk = 1 << 22
    outs = []
    for k in range(3):
        parts = []
        for s in range(0, n, chunk):
            m = min(chunk, n - s)
            # random significand and sign, exponent within +-20 of 1: no overflow, realistic spread
            sig = rng.integers(0, 1 << 23, m, dtype=np.uint32)
            sign = rng.integers(0, 2, m, dtype=np.uint32) << np.uint32(31)
            exp = rng.integers(107, 148, m, dtype=np.uint32) << np.uint32(23)
            x = sign | exp | sig
            if k == 0:
                x[::4] &= np.uint32(0x7FFFFFFF)
            parts.append(xp.asarray(x))
        outs.append(parts[0] if len(parts) == 1 else xp.concatenate(parts))
    return outs


def call(op, ops):
    if op == "sqrt":
        return sf.sqrt(ops[0] & np.uint32(0x7FFFFFFF))
    return getattr(sf, op)(*ops[: NARGS[op]])


def time_vectorised(op, ops, repeat, sync):
    call(op, [o[: min(o.size, 1 << 16)] for o in ops])  # warm up (kernel compilation on CUDA)
    best = float("inf")
    for _ in range(repeat):
        sync()
        t = time.perf_counter()
        call(op, ops)
        sync()
        best = min(best, time.perf_counter() - t)
    return ops[0].size / best


def time_array_code(op, ops, repeat, sync):
    """The array code on the same device (fused kernels off): the figure the kernels replace."""
    sf_device.set_enabled(False)
    try:
        return time_vectorised(op, ops, repeat, sync)
    finally:
        sf_device.set_enabled(True)


def time_softfloatpy(op, ops, n):
    try:
        import softfloatpy as s
    except ImportError:
        return None, "softfloatpy not installed (pip install softfloatpy): SoftFloat column skipped"
    fn = {"add": s.f32_add, "mul": s.f32_mul, "fma": s.f32_mul_add, "div": s.f32_div, "sqrt": s.f32_sqrt}[op]
    lists = [np.asarray(o[:n]).tolist() for o in ops[: NARGS[op]]]
    if op == "sqrt":
        lists = [[x & 0x7FFFFFFF for x in lists[0]]]
    args = [[s.Float32.from_bytes(v.to_bytes(4, "big")) for v in lst] for lst in lists]
    s.set_rounding_mode(s.RoundingMode.NEAR_EVEN)
    t = time.perf_counter()
    if len(args) == 1:
        for x in args[0]:
            fn(x)
    elif len(args) == 2:
        for x, y in zip(*args, strict=True):
            fn(x, y)
    else:
        for x, y, z in zip(*args, strict=True):
            fn(x, y, z)
    return n / (time.perf_counter() - t), None


def time_mpfr(op, ops, n):
    try:
        import gmpy2
    except ImportError:
        return None, "gmpy2 not installed: MPFR column skipped"
    lists = [np.asarray(o[:n]).view(np.float32).astype(np.float64).tolist() for o in ops[: NARGS[op]]]
    ctx = gmpy2.ieee(32)
    with gmpy2.context(ctx):
        args = [[gmpy2.mpfr(v) for v in lst] for lst in lists]
        if op == "sqrt":
            args = [[abs(v) for v in args[0]]]
        t = time.perf_counter()
        if op == "add":
            for x, y in zip(*args, strict=True):
                x + y
        elif op == "mul":
            for x, y in zip(*args, strict=True):
                x * y
        elif op == "div":
            for x, y in zip(*args, strict=True):
                x / y
        elif op == "fma":
            f = gmpy2.fma
            for x, y, z in zip(*args, strict=True):
                f(x, y, z)
        else:
            f = gmpy2.sqrt
            for x in args[0]:
                f(x)
        return n / (time.perf_counter() - t), None


def check_gpu(op, ops, n_check):
    """Bit-exact comparison of the GPU result with the NumPy run of the same code on a slice."""
    sl = [o[:n_check] for o in ops]
    gpu = call(op, sl).get()
    cpu = call(op, [o.get() for o in sl])
    return int((gpu != cpu).sum())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--n", default=None, help="elements per array (default 2^22 on cpu, 2^28 on cuda)")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--repeat", type=int, default=5, help="best of this many timed runs")
    ap.add_argument("--oracle-n", type=int, default=200_000, help="elements timed for per-call oracles")
    ap.add_argument("--chunk", default=None, help="elements per chunk (default 2^17 cpu, 2^24 cuda)")
    ap.add_argument("--no-check", action="store_true", help="skip the GPU-vs-CPU bit comparison")
    ap.add_argument("--no-array-code", action="store_true", help="on CUDA, skip timing the array code")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    a = ap.parse_args(argv)
    ops_wanted = [o for o in a.ops.split(",") if o]
    if a.device == "cuda":
        import cupy as xp

        def sync():
            xp.cuda.Device().synchronize()

        n = parse_n(a.n or "2^28")
        if a.chunk:
            sf.set_chunk_size(parse_n(a.chunk), "cupy")
        dev = xp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        goals = GOALS_GPU
    else:
        xp = np

        def sync():
            return None

        n = parse_n(a.n or "2^22")
        if a.chunk:
            sf.set_chunk_size(parse_n(a.chunk), "numpy")
        dev = "cpu, one core (NumPy)"
        goals = GOALS_CPU
    print(f"spec.softfloat binary32 throughput  device={dev}  n={n}  chunk={core.CHUNK}")
    print(f"numpy {np.__version__}  bitwise_count={'yes' if hasattr(xp, 'bitwise_count') else 'no (fallback)'}")
    ops = make_operands(xp, n, 1234)
    rows = []
    notes = set()
    for op in ops_wanted:
        r = {"op": op, "softfloat_ops_per_s": time_vectorised(op, ops, a.repeat, sync)}
        if a.device == "cuda" and not a.no_array_code:
            r["array_code_ops_per_s"] = time_array_code(op, ops, min(a.repeat, 2), sync)
            r["fused_over_array_code"] = round(r["softfloat_ops_per_s"] / r["array_code_ops_per_s"], 1)
        sfp, note = time_softfloatpy(
            op,
            [np.asarray(o[: a.oracle_n].get() if a.device == "cuda" else o[: a.oracle_n]) for o in ops],
            a.oracle_n,
        )
        r["berkeley_softfloat_per_call_ops_per_s"] = sfp
        notes.add(note)
        mp, note = time_mpfr(
            op,
            [np.asarray(o[: a.oracle_n].get() if a.device == "cuda" else o[: a.oracle_n]) for o in ops],
            a.oracle_n,
        )
        r["mpfr_per_call_ops_per_s"] = mp
        notes.add(note)
        r["goal_ops_per_s"] = goals.get(op)
        r["goal_met"] = None if r["goal_ops_per_s"] is None else r["softfloat_ops_per_s"] >= r["goal_ops_per_s"]
        if a.device == "cuda" and not a.no_check:
            r["gpu_vs_cpu_mismatches"] = check_gpu(op, ops, 1 << 20)
        rows.append(r)

    def fmt(v):
        return "-" if v is None else f"{v / 1e6:10.2f}M"

    print(f"{'op':6} {'softfloat':>12} {'SoftFloat/call':>15} {'MPFR/call':>12} {'goal':>12}  met")
    for r in rows:
        extra = f"  gpu-vs-cpu mismatches={r['gpu_vs_cpu_mismatches']}" if "gpu_vs_cpu_mismatches" in r else ""
        if "array_code_ops_per_s" in r:
            extra += f"  array code {fmt(r['array_code_ops_per_s'])} (x{r['fused_over_array_code']})"
        sfp = fmt(r["berkeley_softfloat_per_call_ops_per_s"])
        print(
            f"{r['op']:6} {fmt(r['softfloat_ops_per_s']):>12} {sfp:>15}"
            f" {fmt(r['mpfr_per_call_ops_per_s']):>12} {fmt(r['goal_ops_per_s']):>12}  {r['goal_met']}{extra}"
        )
    for note in sorted(x for x in notes if x):
        print("note:", note)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev, "n": n, "rows": rows}, f, indent=2)
    bad = [r for r in rows if r.get("gpu_vs_cpu_mismatches")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
