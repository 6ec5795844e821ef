"""Time the CUDA math-library audit per function and environment (GPU); prints one line each and a total.

Usage: python benchmarks/bench_libm.py [--functions F ...] [--envs cuda cuda-ftz] [--hi N] [--json FILE]
The documented bounds come from contracts/cuda-libm-v1.yaml (the same items ``kc check`` runs).
"""

from __future__ import annotations

import argparse
import json
import time

from falsification.libm_tests import audit_function
from obligations.contract import parse_contract
from obligations.libm_audit import DEFAULT_CONTRACT, documented_bounds
from spec.libm import ENVS, FUNCTIONS


def main() -> None:
    """Run the audits named on the command line and print their figures."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--functions", nargs="+", default=sorted(FUNCTIONS))
    ap.add_argument("--envs", nargs="+", default=list(ENVS))
    ap.add_argument("--hi", type=lambda v: int(v, 0), default=1 << 32)
    ap.add_argument("--json")
    args = ap.parse_args()
    bounds = documented_bounds(parse_contract(DEFAULT_CONTRACT).data)
    out = []
    t0 = time.perf_counter()
    for env in args.envs:
        for name in args.functions:
            a = audit_function(name, env, bounds[(name, env)][1], hi=args.hi)
            out.append(a)
            m = a["max_ulp"] or {}
            print(
                f"{name:<12} {env:<9} max_ulp {m.get('ulp')!s:<5} at {m.get('x')!s:<14}"
                f" amb {a['ambiguous']:<6} settled {a['settled_by_mpfr']:<6} viol {a['violations']:<8}"
                f" selfcheck_out {a['reference_selfcheck']['outside_window']} kernel {a['kernel_ms']:.0f} ms"
                f" compile {a['compile_s']:.2f} s settle {a['settle_s']:.2f} s"
                f" total {a['seconds']:.2f} s {a['verdict']}",
                flush=True,
            )
    total = time.perf_counter() - t0
    print(f"total {total:.1f} s for {len(out)} audits")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seconds": total, "audits": out}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
