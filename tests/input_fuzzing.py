"""Fuzzed inputs of the ``kc`` commands besides contracts: graph JSON, result JSON, command lines (#31).

Used by ``tests/test_faults.py`` (a seeded sample in CI) and ``benchmarks/fuzz_loader.py`` (10,000 of each).
Each input runs through ``obligations.cli.main`` in this process; the verdict is good when nothing escapes
``main``, the exit code is not 3 (internal error) and nothing printed a traceback. Heavy work a valid command
line would start (a binary32 sweep, a small-format sweep) is cut to one small chunk: the arguments' handling
is what is fuzzed, and it runs in full.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "GRAPH",
    "RESULT",
    "Verdict",
    "json_mutant",
    "cli_mutant",
    "run_kc",
    "graph_verdict",
    "result_verdict",
    "cli_verdict",
    "cheap_sweeps",
    "quick_contract",
]

ROOT = Path(__file__).resolve().parent.parent
GRAPH = ROOT / "examples" / "mlp.graph.json"
RESULT = ROOT / "tests" / "fixtures" / "result_sample.json"
FAULTS = ROOT / "tests" / "fixtures" / "faults" / "faults-v1.yaml"
ELEMENTWISE = ROOT / "contracts" / "elementwise-float32-v1.yaml"

HOSTILE_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    1 << 70,
    -(1 << 63),
    1e308,
    -0.0,
    0.5,
    "",
    "x",
    "NaN",
    "<script>alert(1)</script>",
    "```\n<b>x</b>",
    "\u202e\x00\x1b[31m",
    "a" * 5000,
    [],
    [None],
    [[[[]]]],
    [1] * 300,
    {},
    {"a": None},
    {"status": "passed"},
]


@dataclass(frozen=True)
class Verdict:
    """What ``kc`` did with one input: its exit code and any traceback (the problem) it printed or raised."""

    exit_code: int
    problem: str | None


def _paths(doc: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield here
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*here, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:8]):
            yield from _paths(v, (*here, i))


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _mutate_data(doc: Any, rng: random.Random) -> Any:
    doc = copy.deepcopy(doc)
    paths = [p for p in _paths(doc) if p]
    if not paths:
        return rng.choice(HOSTILE_VALUES)
    path = rng.choice(paths)
    parent, key = _get(doc, path[:-1]), path[-1]
    value = parent[key]
    how = rng.randrange(7)
    if how == 0:  # delete
        del parent[key]
    elif how == 1:  # a hostile value
        parent[key] = copy.deepcopy(rng.choice(HOSTILE_VALUES))
    elif how == 2:  # another type of the same content
        parent[key] = [value] if not isinstance(value, list) else {"0": value}
    elif how == 3 and isinstance(value, list) and value:  # duplicate or shuffle a list
        if rng.random() < 0.5:
            value.append(copy.deepcopy(rng.choice(value)))
        else:
            rng.shuffle(value)
    elif how == 4 and isinstance(value, dict):  # an unknown key
        value[rng.choice(["extra", "__proto__", "", "id"])] = rng.choice(HOSTILE_VALUES)
    elif how == 5:  # nested deep (spliced into the text: json.dumps itself recurses)
        parent[key] = f"__deep_{rng.choice([10, 70, 3000])}__"
    else:  # a number moved
        if isinstance(value, int | float) and not isinstance(value, bool):
            parent[key] = rng.choice([value + 1, -value, value * 1_000_003, value - (1 << 40)])
        else:
            parent[key] = copy.deepcopy(rng.choice(HOSTILE_VALUES))
    return doc


def _mutate_text(text: str, rng: random.Random) -> str:
    how = rng.randrange(6)
    if how == 0:
        return text[: rng.randrange(len(text) + 1)]
    if how == 1:
        at = rng.randrange(len(text) + 1)
        return text[:at] + rng.choice(["{", "]", '"', "\\", "\x00", ",", "NaN", "Infinity", "1e999999"]) + text[at:]
    if how == 2:
        return "[" * 100_000 + "]" * 100_000
    if how == 3:
        return "9" * 6000  # past Python's int-conversion limit
    if how == 4:
        return "\ufeff" + text
    return json.dumps(rng.choice(HOSTILE_VALUES))


def json_mutant(source: Path, rng: random.Random) -> bytes:
    """A mutant of the JSON file ``source``: one to three structure-aware edits, sometimes a text edit after."""
    doc = json.loads(source.read_text())
    for _ in range(rng.randint(1, 3)):
        doc = _mutate_data(doc, rng)
    text = re.sub(r'"__deep_(\d+)__"', lambda m: "[" * int(m.group(1)) + "0" + "]" * int(m.group(1)), json.dumps(doc))
    if rng.random() < 0.15:
        text = _mutate_text(text, rng)
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.02:
        data = data[: len(data) // 2] + b"\xff\xfe" + data[len(data) // 2 :]  # not UTF-8
    return data


def run_kc(argv: list[str]) -> Verdict:
    """``kc argv`` in this process with its output captured; a traceback (printed or escaping) is the problem."""
    from obligations.cli import main

    out, err = io.StringIO(), io.StringIO()
    problem = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except BaseException as e:  # noqa: BLE001 - anything escaping main is the finding
        return Verdict(-1, f"{type(e).__name__}: {e}"[:300])
    text = err.getvalue()
    if code == 3 or "Traceback" in text:
        problem = text[-600:]
    return Verdict(code, problem)


def graph_verdict(data: bytes, tmp: Path) -> Verdict:
    """``kc graph check`` and ``kc graph show`` of one graph file."""
    path = tmp / "g.json"
    path.write_bytes(data)
    first = run_kc(["graph", "check", str(path)])
    return first if first.problem else run_kc(["graph", "show", str(path)])


def result_verdict(data: bytes, tmp: Path) -> Verdict:
    """``kc report --from`` of one result file (Markdown and HTML, no plots)."""
    path = tmp / "r.json"
    path.write_bytes(data)
    return run_kc(["report", "--from", str(path), "--out", str(tmp / "out"), "--no-plots", "--force"])


# -- command lines ----------------------------------------------------------------------------------------

_NUMBERS = ["0", "1", "-1", "7", "0x10", "1e3", "nan", "inf", "-inf", "", " ", "2.5", "abc", "9" * 20, "٣"]


def _outputs(tmp: Path) -> list[str]:
    # never a device file or a path outside the scratch folder: a valid output is written (and renamed over)
    return [str(tmp / "o.json"), str(tmp / "deep" / "er" / "o.json"), "/proc/x.json", "-", str(tmp), ""]


def quick_contract(tmp: Path) -> Path:
    """The faults fixture without the items that hang or end their process (a valid command line runs it)."""
    path = tmp / "quick-v1.yaml"
    if not path.exists():
        head, *items = FAULTS.read_text().split("\n  - id: ")
        keep = [it for it in items if "faults.ok" in it or "faults.raises" in it]
        path.write_text("\n  - id: ".join([head, *keep]))
    return path


def _inputs(tmp: Path) -> list[str]:
    # no "" (the current folder: every contract of the checkout) and no device file that never ends
    return [str(quick_contract(tmp)), str(tmp / "missing.yaml"), str(tmp), "/dev/null", "/proc/self/status", "-"]


def cli_mutant(rng: random.Random, tmp: Path) -> list[str]:
    """A command line of some ``kc`` command whose flags take values from hostile pools (numbers, paths, names)."""
    num = lambda: rng.choice(_NUMBERS)  # noqa: E731
    out = lambda: rng.choice(_outputs(tmp))  # noqa: E731
    command = rng.choice(["check", "check", "sweep", "sweep", "replay", "graph", "report", "explain", "validate"])
    flags: list[tuple[str, Callable[[], str]]]
    if command == "check":
        quick = str(quick_contract(tmp))
        argv = ["check", rng.choice([quick, *_inputs(tmp)]), "--device", "host", "-q"]
        argv += ["--only", rng.choice(["FT-OK-1", "FT-OK-*", "FT-NOPE", "", "*", "[", quick])]
        flags = [
            ("-j", num),
            ("--jobs", num),
            ("--item-timeout", num),
            ("--maxfail", num),
            ("--durations", num),
            ("--seed", num),
            ("--profile", lambda: rng.choice(["quick", "huge", ""])),
            ("--isolate", lambda: rng.choice(["none", "auto", "vm"])),
            ("--device", lambda: rng.choice(["host", "cuda", "tpu"])),
            ("--json", out),
            ("--junit", out),
            ("--sarif", out),
            ("--log", out),
            ("--timeline", out),
            ("--resume", lambda: rng.choice([*_inputs(tmp), str(tmp / "o.json")])),
            ("--strict", lambda: ""),
        ]
    elif command == "sweep":
        argv = ["sweep", rng.choice(["relu", "neg", "add", "sqrt", "nope", ""]), "--device", "host"]
        flags = [
            ("--lo", num),
            ("--hi", num),
            ("--sample", num),
            ("--bound", num),
            ("--operand", num),
            ("--fmt", lambda: rng.choice(["binary32", "binary16", "e4m3", "e5m2", "binary8", ""])),
            ("--env", lambda: rng.choice(["cuda", "nope", ""])),
            ("--route", lambda: rng.choice(["nvrtc-ieee", "nope"])),
            ("--reference", lambda: rng.choice(["auto", "softfloat", "float64", "oracle"])),
            ("--json", out),
        ]
    elif command == "replay":
        argv = ["replay", rng.choice([str(ELEMENTWISE), *_inputs(tmp)])]
        argv += [rng.choice(["FALSIFY-EW-ADD-bitwise", "FALSIFY-EW-NOPE", ""]), "--device", "host"]
        bits = lambda: ",".join(rng.choice(_NUMBERS + ["0x3F800000"]) for _ in range(rng.randint(0, 3)))  # noqa: E731
        flags = [("--bits", bits), ("--scalars", bits), ("--seed", num)]
    elif command == "graph":
        argv = ["graph", rng.choice(["check", "show"]), rng.choice([str(GRAPH), *_inputs(tmp)])]
        flags = [("--output", num)] if argv[1] == "check" else [("--bits", lambda: "")]
    elif command == "report":
        # always an --out: the default is ./reports, the checkout's own
        out_dir = rng.choice([str(tmp / "rep"), "/proc/rep", str(quick_contract(tmp))])
        argv = ["report", "--from", rng.choice([str(RESULT), *_inputs(tmp)]), "--no-plots", "--no-html"]
        argv += ["--out", out_dir, "--force"]
        flags = [("--seed", num), ("--device", lambda: rng.choice(["host", "tpu"]))]
    elif command == "explain":
        argv = ["explain", rng.choice(["FT-OK-1", "NOPE", ""]), str(quick_contract(tmp))]
        flags = [("--from", lambda: rng.choice([str(RESULT), *_inputs(tmp)]))]
    else:
        argv = ["validate", rng.choice(_inputs(tmp))]
        flags = [("--search-path", lambda: rng.choice(_inputs(tmp)))]
    for flag, value in rng.sample(flags, rng.randint(0, min(4, len(flags)))):
        v = value()
        argv += [flag] if v == "" and flag in ("--strict", "--bits") else [flag, v]
    if rng.random() < 0.05:
        argv.append(rng.choice(["--unknown", "-", "--", "-j"]))
    return argv


@contextlib.contextmanager
def cheap_sweeps() -> Iterator[None]:
    """Within the block a sweep checks its arguments in full, then one 256-input chunk (not 2^22 or 2^32)."""
    import falsification.sweep as sweep_module

    real_chunks, real_small = sweep_module.chunk_inputs, sweep_module._small_format_sweep

    def one_chunk(xp: Any, *, lo: int, total: int, chunk: int, sample: int | None, seed: int) -> Iterator[Any]:
        few = min(sample, 256) if sample else None
        yield from real_chunks(xp, lo=lo, total=min(total, 256), chunk=256, sample=few, seed=seed)

    def small(op: str, fmt: Any, lo: int, hi: int | None, max_ce: int) -> dict[str, Any]:
        return real_small(op, fmt, lo, min(hi if hi is not None else lo + 256, lo + 256), max_ce)

    sweep_module.chunk_inputs, sweep_module._small_format_sweep = one_chunk, small
    try:
        yield
    finally:
        sweep_module.chunk_inputs, sweep_module._small_format_sweep = real_chunks, real_small


def cli_verdict(argv: list[str], cwd: Path) -> Verdict:
    """``kc argv`` with cheap sweeps, run in ``cwd`` (a scratch folder: ``--log -`` is a file named ``-``)."""
    with cheap_sweeps(), contextlib.chdir(cwd):
        return run_kc(argv)
