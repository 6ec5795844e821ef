"""Selective-scan states on the GPU: chunked kernel vs sequential kernel vs a torch GPU scan.

Prints milliseconds per call for L = 2^10 .. 2^16 (D = 16, N = 16: 256 lanes) and the speedups.

    python benchmarks/bench_scan.py
"""

from __future__ import annotations

from falsification.scan_tests import time_scan


def main() -> None:
    """Print one row per length."""
    print(f"{'L':>7} {'chunked ms':>11} {'sequential ms':>14} {'torch scan ms':>13} {'vs seq':>7} {'vs torch':>8}")
    for p in range(10, 17, 2):
        r = time_scan(1 << p)
        print(
            f"{1 << p:>7} {r['chunked']:>11.3f} {r['sequential']:>14.3f} {r['torch_scan']:>13.3f} "
            f"{r['sequential'] / r['chunked']:>7.1f} {r['torch_scan'] / r['chunked']:>8.2f}"
        )


if __name__ == "__main__":
    main()
