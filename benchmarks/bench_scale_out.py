"""#28's acceptance on a multi-GPU machine: each command on one GPU, then on a local Dask cluster of every GPU.

Usage: python benchmarks/bench_scale_out.py [--what check audit sweep] [--out DIR] [--repeat N]
[--cache cold|warm|fresh]
``check``: ``kc check contracts --device cuda`` (one GPU: CUDA_VISIBLE_DEVICES=first, default -j) against the same
with ``--cluster local``; statuses compared item by item, wall ratio (target >= 1.6x on 2 GPUs). ``audit``:
``kc audit-libm`` against ``--cluster local``; every cell's verdict, max ULP (and where) and MPFR-settled count
compared, wall ratio (target >= 1.8x). ``sweep``: ``kc sweep exp --device cuda`` against ``--cluster local``;
the evidence compared (2^32 inputs take ~0.2 s: a check of the merge, not of speed). Every command's JSON goes
to DIR, a summary to DIR/scale-out.json; the exit code is 1 when any evidence differs. ``--repeat N`` runs each
pair N times, the order reversed every other time. ``audit`` also runs ``--cluster local`` on the first GPU alone
(``cluster-1``, untimed against the target): how much of the ratio is the cells overlapping on a GPU (four at once
on a cluster's GPU, one at a time without one) rather than the second GPU. First, untimed, every package the
commands import is compiled to bytecode, as a pip install does (a ``--no-compile`` install left the cluster's
first run compiling Dask's modules in every process). ``--cache`` says what the timed runs find: ``cold`` (the
default) solves every proof again (``--no-proof-cache`` on both sides) while the contracts' parses and the
compilers' caches (NVRTC, CuPy, Triton, Inductor) are filled by untimed runs first (a load, then one check on one
GPU): both sides find the same caches (until 2026-11-28 the one-GPU run, timed first, compiled every kernel the
cluster then found); ``warm`` times ``check`` with the proof cache warm too (as a CI runner that keeps its cache
directory); ``fresh`` gives each timed run empty caches of its own (``FRESH``: a fresh machine, everything compiled
and solved on both sides). ``--no-proof-cache`` leaves the load cache on: filled first, as the first timed run
alone would parse otherwise. docs/scale-out.md: the wheels and the device command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KC = [sys.executable, "-m", "obligations.cli"]
TARGETS = {"check": 1.6, "audit": 1.8}


def _run(argv: list[str], env: dict[str, str], log: Path) -> float:
    """Run one kc command (output to ``log``); its wall seconds."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        subprocess.run([*KC, *argv], env=env, stdout=f, stderr=subprocess.STDOUT, check=False)
    return time.perf_counter() - t0


def _check_evidence(path: Path) -> dict[str, Any]:
    items = [(c["id"], it) for c in json.loads(path.read_text())["contracts"] for it in c["items"]]
    return {f"{cid}::{it['id']}": it["status"] for cid, it in items}


def _audit_evidence(path: Path) -> dict[str, Any]:
    return {
        f"{a['function']}/{a['env']}": [a["verdict"], a.get("max_ulp"), a.get("settled_by_mpfr")]
        for a in json.loads(path.read_text())["audits"]
    }


def _sweep_evidence(path: Path) -> dict[str, Any]:
    r = json.loads(path.read_text())
    keys = ("range", "elements", "exhaustive", "max_ulp", "disagreements", "histogram", "first_counterexamples")
    return {k: r.get(k) for k in keys}


def _compile_bytecode() -> float:
    """Compile the packages the commands import (this checkout's and Dask's) to bytecode; the seconds it took."""
    import importlib.util

    t0 = time.perf_counter()
    repo = Path(__file__).resolve().parent.parent
    roots = [str(repo / d) for d in ("spec", "native", "falsification", "obligations")]
    for name in ("dask", "distributed", "tornado", "msgpack", "cloudpickle", "zict", "tblib", "partd", "toolz"):
        found = importlib.util.find_spec(name)
        if found is not None and found.submodule_search_locations:
            roots.extend(found.submodule_search_locations)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *roots], check=False)
    return time.perf_counter() - t0


# --cache fresh: each timed run's caches, under its own directory
FRESH = {
    "XDG_CACHE_HOME": "xdg",  # kc's: proofs, contract loads, item durations, NVRTC kernels, bytecode
    "CUPY_CACHE_DIR": "cupy",
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
}


STEPS: dict[str, tuple[list[str], Any]] = {
    # --no-proof-cache: the second run of a pair must not reuse the first one's proofs from disk
    "check": (["check", "contracts", "--device", "cuda", "--no-proof-cache", "-q"], _check_evidence),
    "audit": (["audit-libm"], _audit_evidence),
    "sweep": (["sweep", "exp", "--device", "cuda"], _sweep_evidence),
}


def main() -> int:
    """Run the pairs named on the command line; print and write the figures."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", nargs="+", choices=list(STEPS), default=["check", "audit", "sweep"])
    ap.add_argument("--out", default=os.environ.get("OUT", "scale-out"))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--cache", choices=("cold", "warm", "fresh"), default="cold")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpus is None:
        import cupy

        gpus = ",".join(str(n) for n in range(cupy.cuda.runtime.getDeviceCount()))
    one = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus.split(",")[0]}
    every = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus}
    summary: dict[str, Any] = {"gpus": gpus, "steps": {}}
    same = True
    summary["cache"] = args.cache
    print(f"bytecode (untimed):               {_compile_bytecode():6.1f} s", flush=True)
    for step in args.what:
        argv, evidence = STEPS[step]
        if step == "check" and args.cache == "cold":  # the load cache, not the proofs: the same on both sides
            fill = ["check", "contracts", "--device", "host", "--only", "NO-SUCH-ITEM", "-q"]  # loads, then exits 2
            wall = _run(fill, one, out / f"{step}-load.log")
            print(f"{step:<6} load     (untimed, the load cache): {wall:6.1f} s", flush=True)
            # and the compilers' caches (NVRTC's, CuPy's, Triton's, Inductor's): else the first timed run compiles
            # every kernel and the second finds them (the cluster, before 2026-11-28: a ratio in its favour)
            wall = _run(argv, one, out / f"{step}-compile.log")
            print(f"{step:<6} warm-up  (untimed, the compiler caches): {wall:6.1f} s", flush=True)
        if step == "audit" and args.cache != "fresh":  # CuPy's kernel cache, which both sides then find
            wall = _run([*argv, "--cluster", "local"], every, out / f"{step}-warm-up.log")
            print(f"{step:<6} warm-up  (untimed, the kernel cache): {wall:6.1f} s", flush=True)
        if step == "check" and args.cache == "warm":
            argv = [a for a in argv if a != "--no-proof-cache"]
            wall = _run(argv, one, out / f"{step}-warm-up.log")  # fills the proof and load caches both sides use
            print(f"{step:<6} warm-up  (one GPU, untimed): {wall:6.1f} s", flush=True)
        walls: dict[str, list[float]] = {"one": [], "cluster": []}
        for r in range(args.repeat):
            order = ["one", "cluster"] if r % 2 == 0 else ["cluster", "one"]
            for mode in order:
                env = one if mode == "one" else every
                if args.cache == "fresh":  # a fresh machine: every cache empty, kc's, CuPy's, Triton's, Inductor's
                    base = out / f"fresh-{step}-{mode}-{r}"
                    env = {**env, **{var: str(base / sub) for var, sub in FRESH.items()}}
                json_path = out / f"{step}-{mode}-{r}.json"
                flags = ["--json", str(json_path)] + (["--cluster", "local"] if mode == "cluster" else [])
                if step in ("check", "audit"):  # where each item ran and when: what bounds the cluster's wall time
                    flags += ["--timeline", str(out / f"{step}-{mode}-{r}-timeline.json")]
                wall = _run([*argv, *flags], env, out / f"{step}-{mode}-{r}.log")
                walls[mode].append(round(wall, 2))
                print(f"{step:<6} {mode:<8} run {r}: {wall:8.1f} s", flush=True)
        if step == "audit":  # the same cluster on one GPU: the part of the ratio that is not the second GPU
            json_path = out / f"{step}-cluster-1gpu.json"
            argv1 = [*argv, "--json", str(json_path), "--cluster", "local"]
            wall = _run(argv1, one, out / f"{step}-cluster-1gpu.log")
            walls["cluster-1"] = [round(wall, 2)]
            print(f"{step:<6} cluster on one GPU: {wall:6.1f} s (not the target's)", flush=True)
        a, b = evidence(out / f"{step}-one-0.json"), evidence(out / f"{step}-cluster-0.json")
        differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        ratio = min(walls["one"]) / min(walls["cluster"])
        target = TARGETS.get(step)
        verdict = "" if target is None else ("met" if ratio >= target else "NOT met")
        print(f"{step:<6} ratio {ratio:.2f}x (target {target or '-'}: {verdict or '-'}); evidence differs in {differ}")
        summary["steps"][step] = {"walls": walls, "ratio": round(ratio, 3), "target": target, "differ": differ}
        same = same and not differ
    (out / "scale-out.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
