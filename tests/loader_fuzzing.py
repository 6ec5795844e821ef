"""Structure-aware mutations of the shipped contracts, and the verdict of ``kc validate`` on each.

Used by ``tests/test_loader_fuzz.py`` (a seeded sample in CI) and ``benchmarks/fuzz_loader.py`` (N files).
A verdict is good when ``kc validate`` exits 0 or 2, prints no traceback, and every problem line is
``path:line:col: error: message``.
"""

from __future__ import annotations

import contextlib
import copy
import io
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

__all__ = [
    "SHIPPED",
    "Mutant",
    "Verdict",
    "mutant",
    "verdict",
    "dump_yaml",
    "shipped_data",
    "DATA_MUTATIONS",
    "TEXT_MUTATIONS",
    "HOSTILE_EXPRESSIONS",
    "expression_mutant",
    "expression_verdict",
    "ExprVerdict",
    "shipped_statements",
]

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "contracts").glob("*.yaml"))

Data = Any
Path_ = tuple[Any, ...]

_WRONG_VALUES: tuple[Any, ...] = ("", "x", 0, -1, 1.5, True, None, [], {}, ["a", 1], {"k": "v"})
_NUMBERS: tuple[Any, ...] = (
    0,
    -1,
    -(2**63) - 1,
    2**31,
    2**32,
    2**64,
    10**100,
    -(10**100),
    1e308,
    float("inf"),
    float("-inf"),
    float("nan"),
    2**32 + 1,
)


def _nodes(data: Data, path: Path_ = ()) -> list[Path_]:
    """Every path into ``data`` (mapping keys and list indexes)."""
    out = [path]
    if isinstance(data, dict):
        for k, v in data.items():
            out.extend(_nodes(v, (*path, k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.extend(_nodes(v, (*path, i)))
    return out


def _get(data: Data, path: Path_) -> Data:
    for p in path:
        data = data[p]
    return data


def _set(data: Data, path: Path_, value: Any) -> None:
    _get(data, path[:-1])[path[-1]] = value


def _pick(rng: random.Random, data: Data, want: Callable[[Any], bool]) -> Path_ | None:
    paths = [p for p in _nodes(data) if p and want(_get(data, p))]
    return rng.choice(paths) if paths else None


def _drop_key(rng: random.Random, data: Data) -> None:
    path = _pick(rng, data, lambda v: True)
    if path is not None:
        parent = _get(data, path[:-1])
        parent.pop(path[-1]) if isinstance(parent, dict) else parent.pop(path[-1])


def _rename_key(rng: random.Random, data: Data) -> None:
    path = _pick(rng, data, lambda v: True)
    if path is not None and isinstance(_get(data, path[:-1]), dict):
        parent = _get(data, path[:-1])
        new = rng.choice([path[-1] + "_x", path[-1].upper(), "id", "type", "min", "", "__proto__", "a" * 300])
        parent[new] = parent.pop(path[-1])


def _wrong_type(rng: random.Random, data: Data) -> None:
    path = _pick(rng, data, lambda v: True)
    if path is not None:
        _set(data, path, copy.deepcopy(rng.choice(_WRONG_VALUES)))


def _extreme_number(rng: random.Random, data: Data) -> None:
    path = _pick(rng, data, lambda v: isinstance(v, int | float) and not isinstance(v, bool))
    path = path or _pick(rng, data, lambda v: isinstance(v, str))
    if path is not None:
        _set(data, path, rng.choice(_NUMBERS))


def _duplicate_item(rng: random.Random, data: Data) -> None:
    path = _pick(rng, data, lambda v: isinstance(v, list) and v)
    if path is not None:
        seq = _get(data, path)
        seq.insert(rng.randrange(len(seq) + 1), copy.deepcopy(rng.choice(seq)))


def _swap_values(rng: random.Random, data: Data) -> None:
    a, b = _pick(rng, data, lambda v: True), _pick(rng, data, lambda v: not isinstance(v, dict | list))
    if a is not None and b is not None and a[: len(b)] != b and b[: len(a)] != a:
        va = copy.deepcopy(_get(data, a))
        _set(data, a, copy.deepcopy(_get(data, b)))
        _set(data, b, va)


def _self_dependency(rng: random.Random, data: Data) -> None:
    if isinstance(data, dict):
        data["depends_on"] = [data.get("id", "x")] * rng.randint(1, 2)


DATA_MUTATIONS: dict[str, Callable[[random.Random, Data], None]] = {
    "drop-key": _drop_key,
    "rename-key": _rename_key,
    "wrong-type": _wrong_type,
    "extreme-number": _extreme_number,
    "duplicate-item": _duplicate_item,
    "swap-values": _swap_values,
    "cyclic-depends-on": _self_dependency,
}


# The expression language under attack: escapes to Python objects, code forms, and inputs that would take
# unbounded time or memory if evaluated. Each must be a located diagnostic (or a valid statement), quickly.
HOSTILE_EXPRESSIONS: tuple[str, ...] = (
    "().__class__.__bases__[0].__subclasses__()",
    "m.__class__ == 0",
    "m.__dict__",
    "(lambda: 1)() > 0",
    "(lambda m: m)(m) > 0",
    "[x for x in range(10)] == 0",
    "{x for x in m}",
    "sum(x for x in m) > 0",
    "(y := 3) > 0",
    "f'{m}' == 'x'",
    "f'{m.__class__}'",
    "1" * 10000 + " > m",
    "1" * 1990 + " > m",
    "9**9**9 > m",
    "9**9**9**9",
    "2 ** 200 > m",
    "m << 10**9 > 0",
    "1 << 99999999999 > 0",
    "m >> -1 > 0",
    "(" * 10000 + "m" + ")" * 10000 + " > 0",
    "(" * 900 + "m" + ")" * 900 + " > 0",
    "-" * 1990 + "m > 0",
    "not " * 490 + "True",
    "__import__('os').system('echo pwned') == 0",
    "getattr(m, '__class__') == 0",
    "eval('1') == 1",
    "exec('x=1')",
    "open('/etc/passwd')",
    "m[0] > 0",
    "m.real > 0",
    "{m: 1} == 0",
    "*m",
    "m if m else",
    "'a' * 10**9 == m",
    "m @ m",
    "yield m",
    "await m",
    "m; m",
    "import os",
    "m\x00 > 0",
    "0x" + "f" * 1990,
    "1e999 > m",
    "m >= 1 # c",
    "\\\n m",
    "m == 1 and " * 180 + "m == 1",
    "max(" * 300 + "m" + ", 1)" * 300 + " > 0",
    "int64(" * 500 + "m" + ")" * 500 + " > 0",
    "__builtins__",
    "globals()",
    "m.__class__.__mro__[1].__subclasses__()",
    "type(m)(1)",
    "breakpoint()",
    "m // 0 == 0",
    "m % 0 == 0",
    "10**38 * 10**38 > m",
    "-(2**127) - 1 < m",
    "\u202e m > 0",
    "m ＞ 0",
)


def _hostile_expression(rng: random.Random, data: Data) -> None:
    """A statement replaced by a hostile expression, or a hostile fragment spliced into it."""
    stmts = [p for p in _nodes(data) if p and p[-1] in ("given", "prove") and isinstance(_get(data, p), str)]
    path = rng.choice(stmts) if stmts else _pick(rng, data, lambda v: isinstance(v, str))
    if path is None:
        return
    hostile = rng.choice(HOSTILE_EXPRESSIONS)
    old = _get(data, path)
    if rng.random() < 0.5 or not isinstance(old, str):
        _set(data, path, hostile)
    else:
        k = rng.randrange(len(old) + 1)
        _set(data, path, old[:k] + rng.choice((" and ", " + ", " ", "(", "")) + hostile + old[k:])


def _lines(text: bytes) -> list[bytes]:
    return text.splitlines(keepends=True) or [b""]


def _duplicate_line(rng: random.Random, text: bytes) -> bytes:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    return b"".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])


def _tab(rng: random.Random, text: bytes) -> bytes:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    lines[i] = re.sub(rb"^ +", b"\t", lines[i]) if lines[i].startswith(b" ") else b"\t" + lines[i]
    return b"".join(lines)


def _insert(rng: random.Random, text: bytes, junk: bytes) -> bytes:
    at = rng.randrange(len(text) + 1)
    return text[:at] + junk + text[at:]


def _invalid_utf8(rng: random.Random, text: bytes) -> bytes:
    return _insert(rng, text, bytes([rng.choice([0x80, 0xC0, 0xC3, 0xE2, 0xF0, 0xFF, 0xFE, 0xED])]))


def _control(rng: random.Random, text: bytes) -> bytes:
    return _insert(rng, text, bytes([rng.choice([0, 1, 7, 8, 0x0B, 0x0C, 0x1B, 0x7F])]))


def _truncate(rng: random.Random, text: bytes) -> bytes:
    return text[: rng.randrange(len(text) + 1)]


def _bom(rng: random.Random, text: bytes) -> bytes:
    return b"\xef\xbb\xbf" + text if rng.random() < 0.7 else _insert(rng, text, b"\xef\xbb\xbf")


def _alias_bomb(rng: random.Random, text: bytes) -> bytes:
    levels, fan = rng.randint(2, 12), rng.randint(2, 12)
    lines = [b"b0: &b0 [" + b",".join([b"lol"] * fan) + b"]\n"]
    lines += [b"b%d: &b%d [" % (i, i) + b",".join([b"*b%d" % (i - 1)] * fan) + b"]\n" for i in range(1, levels)]
    if rng.random() < 0.3:
        lines.append(b"r: &r [*r]\n")
    return b"".join(lines) + text


def _deep(rng: random.Random, text: bytes) -> bytes:
    depth = rng.choice([30, 41, 100, 1000, 20000])
    opener, closer = (b"[", b"]") if rng.random() < 0.5 else (b"{a: ", b"}")
    return text + b"deep: " + opener * depth + b"1" + closer * depth + b"\n"


def _byte_flip(rng: random.Random, text: bytes) -> bytes:
    if not text:
        return text
    at = rng.randrange(len(text))
    return text[:at] + bytes([rng.randrange(256)]) + text[at + 1 :]


def _crlf(rng: random.Random, text: bytes) -> bytes:
    return text.replace(b"\n", b"\r\n")


def _yaml_oddity(rng: random.Random, text: bytes) -> bytes:
    odd = rng.choice(
        [
            b"!!set {a, b}",
            b"2020-01-01",
            b"2020-01-01T00:00:00Z",
            b"!!binary aGk=",
            b"!foo bar",
            b"!!python/object:os.system {}",
            b"!!omap [{a: 1}]",
            b"&a x",
            b"*nowhere",
            b"? [a, b]",
            b"0x_ff",
            b"0o777",
            b".nan",
            b"-.inf",
            b"~",
            b"!!int 12x",
            b"!!float abc",
            b'"\\x"',
            b"'",
            b"|\n  x",
            b"1_000",
            b"!!str",
            b"{",
            b"[",
            b"- - -",
        ]
    )
    lines = _lines(text)
    i = rng.randrange(len(lines))
    if b":" in lines[i] and not lines[i].lstrip().startswith(b"#"):
        key, _, _ = lines[i].partition(b":")
        lines[i] = key + b": " + odd + b"\n"
    else:
        lines.insert(i, b"odd: " + odd + b"\n")
    return b"".join(lines)


DATA_MUTATIONS["hostile-expression"] = _hostile_expression

TEXT_MUTATIONS: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "duplicate-line": _duplicate_line,
    "tab": _tab,
    "invalid-utf8": _invalid_utf8,
    "control-character": _control,
    "truncate": _truncate,
    "bom": _bom,
    "alias-bomb": _alias_bomb,
    "deep-nesting": _deep,
    "byte-flip": _byte_flip,
    "crlf": _crlf,
    "yaml-oddity": _yaml_oddity,
}


@dataclass(frozen=True)
class Mutant:
    """A fuzzed contract file's bytes and the mutations that made it."""

    data: bytes
    mutations: tuple[str, ...]
    source: str


def dump_yaml(data: Data) -> bytes:
    """``data`` as block-style YAML bytes."""
    out = io.StringIO()
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.width = 120
    yaml.dump(data, out)
    return out.getvalue().encode("utf-8")


_PARSED: dict[Path, Data] = {}


def shipped_data(path: Path) -> Data:
    """The plain data of a shipped contract (parsed once)."""
    if path not in _PARSED:
        _PARSED[path] = YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))
    return _PARSED[path]


def mutant(rng: random.Random) -> Mutant:
    """One fuzzed contract: a shipped contract with 1-3 mutations, structural (re-dumped) or textual."""
    source = rng.choice(SHIPPED)
    names: list[str] = []
    if rng.random() < 0.55:
        data = copy.deepcopy(shipped_data(source))
        for _ in range(rng.randint(1, 3)):
            name = rng.choice(sorted(DATA_MUTATIONS))
            DATA_MUTATIONS[name](rng, data)
            names.append(name)
        try:
            text = dump_yaml(data)
        except Exception:  # a mutation ruamel cannot dump (e.g. a key it refuses): fall back to the source
            text, names = source.read_bytes(), []
    else:
        text = source.read_bytes()
    for _ in range(rng.randint(0 if names else 1, 2)):
        name = rng.choice(sorted(TEXT_MUTATIONS))
        text = TEXT_MUTATIONS[name](rng, text)
        names.append(name)
    return Mutant(text, tuple(names), source.name)


@dataclass(frozen=True)
class Verdict:
    """What ``kc validate`` did with one file: its exit code and any line that breaks the output contract."""

    exit_code: int
    bad_lines: tuple[str, ...]


def verdict(path: Path, imports: bool = True) -> Verdict:
    """Run ``kc validate [--import] PATH`` in this process; check its exit code and the form of every line printed.

    With ``imports`` (the default) the plans run on symbols and every statement is evaluated, as ``kc check``
    does, so hostile statements meet the whole pipeline, not only the parser.
    """
    from obligations.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["validate", *(["--import"] if imports else []), str(path)])
    located = re.compile(rf"^{re.escape(str(path))}:\d+:\d+: error: \S")
    lines = err.getvalue().splitlines()
    bad = [ln for ln in lines if not located.match(ln) and not re.match(r"^\d+ problem\(s\) in \d+ contract", ln)]
    if "Traceback" in err.getvalue():
        bad.append("a traceback was printed")
    if code == 2 and not any(located.match(ln) for ln in lines):
        bad.append("exit 2 without a located diagnostic")
    return Verdict(code, tuple(bad))


# -- the expression language alone ---------------------------------------------------------------------------

_STATEMENTS: list[str] = []


def shipped_statements() -> list[str]:
    """Every given/prove statement of the shipped contracts."""
    if not _STATEMENTS:
        for path in SHIPPED:
            data = shipped_data(path)
            for p in _nodes(data):
                if p and p[-1] in ("given", "prove") and isinstance(_get(data, p), str):
                    _STATEMENTS.append(_get(data, p))
    return _STATEMENTS


def expression_mutant(rng: random.Random) -> str:
    """A hostile expression, or a shipped statement with a hostile fragment or random characters spliced in."""
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(HOSTILE_EXPRESSIONS)
    base = rng.choice(shipped_statements())
    k = rng.randrange(len(base) + 1)
    if roll < 0.7:
        return base[:k] + rng.choice((" and ", " + ", " ", "(", ")", "")) + rng.choice(HOSTILE_EXPRESSIONS) + base[k:]
    junk = "".join(rng.choice("()[]{}.:=*/%<>!~^|&@'\"#\\_ ax019") for _ in range(rng.randint(1, 8)))
    return base[:k] + junk + base[k + rng.randint(0, 3) :]


@dataclass(frozen=True)
class ExprVerdict:
    """What the parser did with one expression: accepted, or a located ExprError; its time and peak memory."""

    ok: bool
    problem: str | None
    seconds: float
    peak_bytes: int


def expression_verdict(text: str, measure_memory: bool = False) -> ExprVerdict:
    """Parse ``text``: good when it parses or raises ExprError with a column inside the text, nothing else."""
    import time
    import tracemalloc

    from obligations import expr

    if measure_memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    problem = None
    try:
        expr.parse(text)
    except expr.ExprError as e:
        if not isinstance(e.col, int) or not 0 <= e.col <= max(len(text), 1) or not e.message:
            problem = f"ExprError without a usable column: col={e.col!r} {e.message!r}"
    except BaseException as e:  # noqa: BLE001 (any other exception is the finding)
        problem = f"{type(e).__name__}: {str(e)[:200]}"
    seconds = time.perf_counter() - t0
    peak = 0
    if measure_memory:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return ExprVerdict(problem is None, problem, seconds, peak)
