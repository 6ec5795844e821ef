"""Fuzz the contract loader: N structure-aware mutants of the shipped contracts through ``kc validate``.

    python benchmarks/fuzz_loader.py [-n 10000] [--expressions 10000] [--seed 0] [--jobs CPUS] [--keep DIR]
                                     [--graphs N] [--results N] [--cli N]

Prints the count of files per exit code (0 valid, 2 located diagnostics; 3 would be a crash), the files
whose output broke the ``path:line:col: error:`` form, and the time taken. File ``i`` of seed ``s`` is the
same whatever ``--jobs`` is, so a finding replays with ``--seed s`` and its index. ``--expressions N`` also
parses N fuzzed expressions (hostile forms and spliced shipped statements) and runs every hostile expression
as a contract statement through ``kc validate --import``: counts by verdict, slowest input, peak memory.
``--graphs N``, ``--results N`` and ``--cli N`` fuzz the other inputs (tests/input_fuzzing.py): N mutants of a
graph file through ``kc graph check``/``show``, N of a result through ``kc report --from``, N command lines of
every command but ``new`` with hostile flag values; each prints its exit codes and the inputs that ended in a
traceback (none is the bar). ``-n 0`` skips the contract files.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import multiprocessing
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.loader_fuzzing import (  # noqa: E402
    HOSTILE_EXPRESSIONS,
    SHIPPED,
    dump_yaml,
    expression_mutant,
    expression_verdict,
    mutant,
    shipped_data,
    verdict,
)


def fuzz_expressions(n: int, seed: int) -> int:
    """Parse ``n`` fuzzed expressions and validate every hostile one in a contract; print figures; count bad."""
    import copy
    import warnings

    warnings.simplefilter("ignore", SyntaxWarning)
    rng = random.Random(seed)
    t0 = time.perf_counter()
    bad, slowest, peak = [], 0.0, 0
    for i in range(n):
        text = expression_mutant(rng)
        v = expression_verdict(text, measure_memory=i % 10 == 0)
        slowest, peak = max(slowest, v.seconds), max(peak, v.peak_bytes)
        if not v.ok:
            bad.append((i, text[:80], v.problem))
    parse_s = time.perf_counter() - t0
    source = next(p for p in SHIPPED if "gemm" in p.name)
    data = shipped_data(source)
    first = next(i for i, o in enumerate(data["obligations"]) if "prove" in o)
    codes: collections.Counter[int] = collections.Counter()
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for k, text in enumerate(HOSTILE_EXPRESSIONS):
            mutated = copy.deepcopy(data)
            mutated["obligations"][first]["prove"] = text
            path = Path(tmp) / f"expr-{k}.yaml"
            path.write_bytes(dump_yaml(mutated))
            t1 = time.perf_counter()
            v = verdict(path)
            worst = max(worst, time.perf_counter() - t1)
            codes[v.exit_code] += 1
            if v.exit_code not in (0, 2) or v.bad_lines:
                bad.append((k, text[:80], f"exit {v.exit_code}: {v.bad_lines[:2]}"))
    print(
        f"fuzz_expressions: {n} fuzzed expressions parsed in {parse_s:.1f} s (slowest {1000 * slowest:.1f} ms, "
        f"peak {peak / 2**20:.1f} MiB traced), {len(bad)} without a located verdict"
    )
    print(
        f"hostile expressions as contract statements (kc validate --import): {len(HOSTILE_EXPRESSIONS)}; exit codes "
        + ", ".join(f"{c}: {k}" for c, k in sorted(codes.items()))
        + f"; slowest {worst:.2f} s"
    )
    for item in bad[:20]:
        print(f"  {item}")
    return len(bad)


def _input_slice(args: tuple[str, int, int, int, int]) -> list[tuple[int, int, str | None, str]]:
    """Fuzz inputs of ``kind`` ``start, start + step, ...`` below ``n``: (index, exit code, problem, input) each."""
    from tests import input_fuzzing as fz

    kind, start, step, n, seed = args
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for i in range(start, n, step):
            rng = rng_for(seed, i)
            if kind == "graphs":
                data = fz.json_mutant(fz.GRAPH, rng)
                v, shown = fz.graph_verdict(data, scratch), data[:200].decode("utf-8", "replace")
            elif kind == "results":
                data = fz.json_mutant(fz.RESULT, rng)
                v, shown = fz.result_verdict(data, scratch), data[:200].decode("utf-8", "replace")
            else:
                argv = fz.cli_mutant(rng, scratch)
                v, shown = fz.cli_verdict(argv, scratch), " ".join(argv)
            out.append((i, v.exit_code, v.problem, shown))
    return out


def fuzz_inputs(kind: str, n: int, seed: int, jobs: int) -> int:
    """Fuzz ``n`` inputs of ``kind`` (graphs, results, cli) through ``kc``; print figures; count tracebacks."""
    t0 = time.perf_counter()
    slices = [(kind, j, jobs, n, seed) for j in range(jobs)]
    if jobs == 1:
        rows = _input_slice(slices[0])
    else:
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            rows = [r for part in pool.map(_input_slice, slices) for r in part]
    rows.sort()
    seconds = time.perf_counter() - t0
    codes = collections.Counter(code for _, code, _, _ in rows)
    bad = [r for r in rows if r[2]]
    print(
        f"fuzz {kind}: {len(rows)} inputs, seed {seed}, {jobs} jobs, {seconds:.1f} s; exit codes "
        + ", ".join(f"{c}: {k}" for c, k in sorted(codes.items()))
        + f"; {len(bad)} with a traceback"
    )
    for index, code, problem, shown in bad[:10]:
        print(f"  #{index} exit {code}: {shown[:160]!r}\n    {(problem or '').strip().splitlines()[-3:]}")
    return len(bad)


def rng_for(seed: int, index: int) -> random.Random:
    """The generator of file ``index`` under ``seed``."""
    return random.Random(seed * 1_000_003 + index)


def run_slice(args: tuple[int, int, int, int, str | None]) -> list[tuple[int, int, tuple[str, ...], tuple[str, ...]]]:
    """Fuzz files ``start, start + step, ...`` below ``n``: (index, exit code, mutations, bad lines) each."""
    start, step, n, seed, keep = args
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(start, n, step):
            m = mutant(rng_for(seed, i))
            path = Path(tmp) / f"fuzz-{seed}-{i}.yaml"
            path.write_bytes(m.data)
            v = verdict(path)
            if keep and (v.exit_code not in (0, 2) or v.bad_lines):
                Path(keep).mkdir(parents=True, exist_ok=True)
                (Path(keep) / path.name).write_bytes(m.data)
            out.append((i, v.exit_code, m.mutations, v.bad_lines))
            path.unlink()
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the fuzzer and print its figures; exit 1 if any file crashed or broke the diagnostic form."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=10_000, help="number of fuzzed files (default 10,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--keep", metavar="DIR", help="save the files that crashed or printed a malformed line")
    p.add_argument(
        "--expressions",
        type=int,
        default=0,
        metavar="N",
        help="also fuzz N expressions and every hostile expression as a statement (default 0)",
    )
    for kind in ("graphs", "results", "cli"):
        p.add_argument(f"--{kind}", type=int, default=0, metavar="N", help=f"also fuzz N {kind} (default 0)")
    args = p.parse_args(argv)
    inputs_bad = sum(
        fuzz_inputs(k, getattr(args, k), args.seed, args.jobs) for k in ("graphs", "results", "cli") if getattr(args, k)
    )
    if args.n == 0:
        return 1 if inputs_bad else 0
    t0 = time.perf_counter()
    slices = [(j, args.jobs, args.n, args.seed, args.keep) for j in range(args.jobs)]
    if args.jobs == 1:
        results = [run_slice(slices[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            results = pool.map(run_slice, slices)
    seconds = time.perf_counter() - t0
    rows = sorted(r for part in results for r in part)
    codes = collections.Counter(code for _, code, _, _ in rows)
    bad = [r for r in rows if r[1] not in (0, 2) or r[3]]
    by_mutation = collections.Counter(name for _, _, names, _ in rows for name in set(names))
    print(
        f"fuzz_loader: {len(rows)} files, seed {args.seed}, {args.jobs} jobs, {seconds:.1f} s "
        f"({1000 * seconds / max(len(rows), 1):.1f} ms/file wall), {platform.node()} "
        f"({os.cpu_count()} CPUs, Python {platform.python_version()}), {dt.date.today().isoformat()}"
    )
    print("exit codes: " + ", ".join(f"{code}: {count}" for code, count in sorted(codes.items())))
    print("mutations applied: " + ", ".join(f"{k} {v}" for k, v in sorted(by_mutation.items())))
    print(f"files with a crash or a malformed line: {len(bad)}")
    for index, code, names, lines in bad[:20]:
        print(f"  #{index} exit {code} {'+'.join(names)}: {lines[:2]}")
    bad_expressions = fuzz_expressions(args.expressions, args.seed) if args.expressions else 0
    return 1 if bad or bad_expressions or inputs_bad else 0


if __name__ == "__main__":
    sys.exit(main())
