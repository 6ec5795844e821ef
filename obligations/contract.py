"""The contract model: YAML with positions, JSON Schema validation, and semantic checks.

Every problem is a :class:`Diagnostic` with file, line and column, printed by ``kc validate`` as
``path:line:col: error: message``.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import inspect
import json
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedOrderedMap, CommentedSeq
from ruamel.yaml.composer import Composer, ComposerError, MaxDepthExceededError, ReusedAnchorWarning
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent
from ruamel.yaml.nodes import MappingNode, SequenceNode
from ruamel.yaml.reader import ReaderError

from obligations import expr as exprlang
from obligations import statements
from obligations.core import plans
from obligations.core import symbolic as sym

if TYPE_CHECKING:
    import jsonschema

    from native import kinds as native_kinds

__all__ = [
    "Diagnostic",
    "Contract",
    "ContractError",
    "import_test_modules",
    "Loaded",
    "load_contract",
    "load_contracts",
    "parse_contract",
    "validate_paths",
    "contract_files",
    "shown_path",
    "SCHEMA_PATH",
    "CODE_ROLES",
    "resolve_code",
    "semantic_check",
    "did_you_mean",
    "add_project_root",
]

# Quantities every plan offers the checker besides its own: the conjunction of its side-conditions.
BUILTIN_QUANTITIES = frozenset({"no_overflow"})

# Inside the package, so an installed wheel validates; contracts/schema/ holds an equal copy for editors.
SCHEMA_PATH = Path(__file__).resolve().parent / "schema" / "contract.schema.json"


@dataclass(frozen=True)
class Diagnostic:
    """One problem in a contract file, located at 1-based line and column."""

    path: str
    line: int
    col: int
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        message = " ".join(self.message.split("\n"))  # one problem, one line
        return f"{self.path}:{self.line}:{self.col}: {self.severity}: {message}"


class ContractError(Exception):
    """A contract that cannot be used: carries its diagnostics."""

    def __init__(self, diagnostics: list[Diagnostic]):
        super().__init__("\n".join(map(str, diagnostics)))
        self.diagnostics = diagnostics


@dataclass(frozen=True)
class Contract:
    """A loaded contract: plain data, the file it came from, and the positions of its nodes."""

    path: str
    data: dict[str, Any]
    sha256: str
    text: str
    _root: Any = field(repr=False, compare=False)

    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def symbols(self) -> dict[str, dict[str, Any]]:
        return self.data.get("symbols") or {}

    @property
    def items(self) -> list[dict[str, Any]]:
        """Obligations then falsification tests, each with ``kind`` and its YAML ``location``."""
        out = []
        for kind, key in (("obligation", "obligations"), ("falsification", "falsification")):
            for idx, item in enumerate(self.data.get(key) or []):
                line, col = self.position((key, idx))
                out.append({**item, "kind": kind, "location": {"line": line, "column": col}})
        return out

    def item(self, item_id: str) -> dict[str, Any]:
        """The item with this id; KeyError if none."""
        for it in self.items:
            if it["id"] == item_id:
                return it
        raise KeyError(item_id)

    def position(self, path: Iterable[Any], value: bool = False) -> tuple[int, int]:
        """1-based (line, col) of the node at ``path`` (its key, or its value with ``value=True``)."""
        if isinstance(self._root, _Positions):  # read from the load cache
            return self._root.position(path, value)
        node, line, col = self._root, 1, 1
        for part in path:
            if isinstance(node, CommentedMap) and part in node:
                ln, cl = node.lc.value(part) if value else node.lc.key(part)
                line, col, node = ln + 1, cl + 1, node[part]
            elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
                ln, cl = node.lc.item(part)
                line, col, node = ln + 1, cl + 1, node[part]
            else:
                break
        return line, col

    def expression_position(self, path: tuple[Any, ...], col_in_expr: int, source: str = "") -> tuple[int, int]:
        """File position of column ``col_in_expr`` of the expression at ``path``.

        The text at that column is searched for in the file from the value's start, so folded and quoted
        YAML scalars map back to the right line and column.
        """
        line, col = self.position(path, value=True)
        lines = self.text.splitlines(keepends=True)
        start = sum(len(x) for x in lines[: line - 1]) + col - 1
        needle = source[col_in_expr:].split(" ")[0][:20] if source else ""
        found = self.text.find(needle, start) if needle else -1
        if found < 0:
            return line, col
        before = self.text[:found]
        return before.count("\n") + 1, found - (before.rfind("\n") + 1) + 1

    def kernel(self, name: str | None) -> dict[str, Any]:
        """The kernel entry named ``name``, or the only one when ``name`` is None."""
        kernels = self.data["kernels"]
        if name is None:
            if len(kernels) != 1:
                raise KeyError("this contract has several kernels: the item must name one")
            return next(iter(kernels.values()))
        return kernels[name]


# -- loading -----------------------------------------------------------------------------------------

MAX_FILE_BYTES = 4 * 1024 * 1024  # a contract is a few KiB; a bigger file is not one
MAX_DEPTH = 40  # nesting of mappings and sequences; the shipped contracts need 6
MAX_ALIASES = 64  # YAML aliases (``*name``) per file
MAX_EXPANDED_NODES = 200_000  # nodes after every alias is expanded (the shipped contracts have < 5,000)

_SCALARS: tuple[tuple[type, type], ...] = ((bool, bool), (str, str), (int, int), (float, float))


class _BoundedComposer(Composer):
    """ruamel's composer with a bound on aliases: their count, their expanded size, and no recursion."""

    def __init__(self, loader: Any = None) -> None:
        super().__init__(loader)
        self.aliases = 0
        self.expanded = 0
        self.sizes: dict[int, int] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        if not self.parser.check_event(AliasEvent):
            return super().compose_node(parent, index)
        event = self.parser.peek_event()
        target = self.anchors.get(event.anchor)
        self.aliases += 1
        if self.aliases > MAX_ALIASES:
            raise ComposerError(None, None, f"more than {MAX_ALIASES} aliases (a contract needs few)", event.start_mark)
        if target is not None and getattr(target, "end_mark", None) is None:
            raise ComposerError(
                None, None, f"alias *{event.anchor} refers to a node that contains it", event.start_mark
            )
        if target is not None:
            self.expanded += self._size(target)
            if self.expanded > MAX_EXPANDED_NODES:
                raise ComposerError(
                    None, None, f"aliases expand to more than {MAX_EXPANDED_NODES} nodes", event.start_mark
                )
        return super().compose_node(parent, index)

    def _size(self, node: Any) -> int:
        """Nodes in ``node`` with every alias expanded (memoised: aliased nodes are shared)."""
        if id(node) not in self.sizes:
            value = node.value
            if isinstance(node, MappingNode):
                self.sizes[id(node)] = 1 + sum(self._size(k) + self._size(v) for k, v in value)
            elif isinstance(node, SequenceNode):
                self.sizes[id(node)] = 1 + sum(self._size(v) for v in value)
            else:
                self.sizes[id(node)] = 1
        return self.sizes[id(node)]


def _at(path: Path, text: str, index: int, message: str) -> Diagnostic:
    """A diagnostic at character ``index`` of ``text``."""
    line = text.count("\n", 0, index) + 1
    return Diagnostic(str(path), line, index - (text.rfind("\n", 0, index) + 1) + 1, message)


def _decode(path: Path, raw: bytes) -> str:
    """The file's text (UTF-8, an optional BOM dropped); ContractError at the first byte that is not UTF-8."""
    if len(raw) > MAX_FILE_BYTES:
        raise ContractError(
            [Diagnostic(str(path), 1, 1, f"file is {len(raw)} bytes; a contract is at most {MAX_FILE_BYTES}")]
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        good = raw[: e.start].decode("utf-8", errors="replace")
        raise ContractError(
            [_at(path, good, len(good), f"not UTF-8: byte 0x{raw[e.start]:02x} ({e.reason})")]
        ) from None


def _parse(path: Path, raw: bytes) -> tuple[Any, str]:
    """Parse the file's bytes into ruamel's round-trip nodes (positions kept); ContractError on bad YAML."""
    text = _decode(path, raw)
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    yaml.max_depth = MAX_DEPTH
    yaml.Composer = _BoundedComposer
    try:
        with warnings.catch_warnings():  # a reused anchor is legal YAML (the later one wins): no stderr noise
            warnings.simplefilter("ignore", ReusedAnchorWarning)
            return yaml.load(text), text
    except MaxDepthExceededError as e:
        mark = e.problem_mark
        raise ContractError(
            [Diagnostic(str(path), mark.line + 1, mark.column + 1, f"YAML: nested more than {MAX_DEPTH} levels deep")]
        ) from None
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        msg = " ".join(str(x) for x in (e.context, e.problem) if x).replace("\n", " ")
        raise ContractError([Diagnostic(str(path), line, col, f"YAML: {msg}")]) from None
    except ReaderError as e:
        index = e.position if isinstance(e.position, int) else 0
        char = e.character if isinstance(e.character, int) else 0
        raise ContractError(
            [_at(path, text, index, f"YAML: character U+{char:04X} is not allowed ({e.reason})")]
        ) from None
    except (YAMLError, ValueError, TypeError, OverflowError, RecursionError) as e:  # ruamel's unmarked errors
        raise ContractError([Diagnostic(str(path), 1, 1, f"YAML: {type(e).__name__}: {e}")]) from None


def _position(node: Any, key: Any, value: bool = True) -> tuple[int, int]:
    """1-based position of ``node[key]`` (of its key with ``value=False``), (1, 1) where ruamel has none."""
    try:
        if isinstance(node, CommentedMap):
            ln, cl = node.lc.value(key) if value else node.lc.key(key)
        else:
            ln, cl = node.lc.item(key)
        return ln + 1, cl + 1
    except (AttributeError, KeyError, TypeError, IndexError):
        return 1, 1


def _plain(node: Any, path: str, where: tuple[int, int], problems: list[Diagnostic]) -> Any:
    """JSON data from ruamel's nodes: str keys, plain scalars; every other YAML type is a located problem."""
    if isinstance(node, CommentedMap | CommentedSeq) and not isinstance(node, CommentedOrderedMap):
        if isinstance(node, CommentedSeq):
            return [_plain(v, path, _position(node, i), problems) for i, v in enumerate(node)]
        out: dict[str, Any] = {}
        for k, v in node.items():
            if not isinstance(k, str):
                problems.append(
                    Diagnostic(path, *_position(node, k, value=False), f"mapping key {k!r} is not a string (quote it)")
                )
                continue
            out[str(k)] = _plain(v, path, _position(node, k), problems)
        return out
    if node is None:
        return None
    for yaml_type, plain in _SCALARS:
        if isinstance(node, yaml_type):
            return plain(node)
    problems.append(
        Diagnostic(
            path,
            *where,
            f"a YAML {_yaml_kind(node)} is not allowed in a contract "
            "(only strings, numbers, booleans, lists and mappings)",
        )
    )
    return None


_YAML_KINDS = {
    "bytes": "binary value (!!binary)",
    "date": "date (quote it to make it a string)",
    "datetime": "timestamp (quote it)",
    "TimeStamp": "timestamp (quote it)",
    "CommentedSet": "set (!!set)",
    "CommentedOrderedMap": "ordered map (!!omap)",
}


def _yaml_kind(node: Any) -> str:
    tag = getattr(getattr(node, "tag", None), "value", None)
    return f"value tagged {tag}" if isinstance(tag, str) else _YAML_KINDS.get(type(node).__name__, type(node).__name__)


def load_contract(
    path: str | Path, *, check: bool = True, known_ids: set[str] | None = None, imports: bool = True
) -> Contract:
    """Load one contract; with ``check`` raise ContractError listing every problem found."""
    contract = parse_contract(path)
    if check:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            problems = list(_diagnose(contract, known_ids, imports))
        if problems:
            raise ContractError(problems)
    return contract


def parse_contract(path: str | Path, *, cache: bool = False) -> Contract:
    """Read and parse one contract file (no schema or semantic checks); ContractError if it is not one.

    ``cache``: take the parse of the same bytes from the load cache, and keep a new one there (kc check and its
    workers; ``KC_LOAD_CACHE=0`` turns it off)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ContractError([Diagnostic(str(path), 1, 1, f"cannot read: {e.strerror or e}")]) from None
    sha256 = hashlib.sha256(raw).hexdigest()  # of the file's bytes, so CRLF files hash as stored
    cached = _cached_parse(path, raw, sha256) if cache else None
    if cached is not None:
        return cached
    root, text = _parse(path, raw)
    if not isinstance(root, CommentedMap):
        raise ContractError([Diagnostic(str(path), 1, 1, "a contract is a YAML mapping")])
    problems: list[Diagnostic] = []
    data = _plain(root, str(path), (1, 1), problems)
    if problems:
        raise ContractError(problems)
    if cache:
        _store_parse(sha256, data, root)
    return Contract(path=str(path), data=data, sha256=sha256, text=text, _root=root)


# A YAML file found by a directory scan is a contract when it has one of these top-level keys.
_CONTRACT_KEY = re.compile(rb"^(qa_gate|kernels)[ \t]*:", re.M)
_SKIPPED_DIRS = frozenset({"node_modules", "__pycache__", "site-packages", "build", "dist"})


def _scan(directory: Path) -> list[Path]:
    """Contracts under ``directory``, recursively (hidden and build directories and virtualenvs skipped)."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".") and d not in _SKIPPED_DIRS and not (Path(root) / d / "pyvenv.cfg").exists()
        )
        for name in sorted(files):
            q = Path(root) / name
            if q.suffix in (".yaml", ".yml") and not name.startswith("."):
                try:
                    with open(q, "rb") as fh:
                        head = fh.read(MAX_FILE_BYTES)
                except OSError:
                    head = b"kernels:"  # unreadable: let parse_contract report it at its path
                if _CONTRACT_KEY.search(head):
                    found.append(q)
    return sorted(found)


def contract_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand directories recursively to their contracts (YAML with a top-level ``qa_gate:`` or ``kernels:``,
    sorted); keep files as given; no repeats."""
    out: list[Path] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        found = _scan(p) if p.is_dir() else [p]
        for q in found:
            if q.resolve() not in seen:
                seen.add(q.resolve())
                out.append(q)
    return out


@dataclass(frozen=True)
class Loaded:
    """The contracts named on a command line, each parsed and validated once, and every problem found."""

    contracts: tuple[Contract, ...]
    diagnostics: tuple[Diagnostic, ...]
    files: tuple[Path, ...]


def load_contracts(
    paths: Iterable[str | Path], *, search_path: Iterable[str | Path] = (), imports: bool = True, cache: bool = False
) -> Loaded:
    """Parse and validate every named contract once (directories expanded).

    ``depends_on`` resolves among the named contracts and those in ``search_path`` (directories or files,
    parsed for their ids only, never validated); nothing else is read. Contract ids must be unique among the
    named files, and ``depends_on`` must not form a cycle. ``cache`` (kc check): each file's parse, and its
    validation where it found no problem, come from the load cache where kc, the bytes, the ids it may depend on,
    the code it names and the installed packages are the same (see the load cache, below).
    """
    files = contract_files(paths)
    problems: list[Diagnostic] = []
    parsed: list[Contract] = []
    for f in files:
        try:
            parsed.append(parse_contract(f, cache=cache))
        except ContractError as e:
            problems.extend(e.diagnostics)
    problems.extend(_duplicate_contract_ids(parsed))
    named = {Path(c.path).resolve() for c in parsed}
    others = []
    for f in contract_files(search_path):
        if f.resolve() not in named:
            try:
                others.append(parse_contract(f, cache=cache))
            except ContractError:
                pass  # a file on the search path only offers its id; its own problems are its own
    known = {c.data["id"] for c in (*parsed, *others) if isinstance(c.data.get("id"), str)}
    valid = []
    for c in parsed:
        key = _valid_key(c, known, imports) if cache else None
        if key is not None and _is_cached_valid(key):  # diagnosed without a problem before: the same verdict
            valid.append(c)
            continue
        with warnings.catch_warnings():  # ast's SyntaxWarnings on bad statements: the diagnostic says it
            warnings.simplefilter("ignore", SyntaxWarning)
            found = list(_diagnose(c, known, imports))
        problems.extend(found)
        if not found:
            valid.append(c)
            if key is not None:
                _store_valid(key)
    problems.extend(_depends_on_cycles(valid, others))
    return Loaded(tuple(parsed), tuple(problems), tuple(files))


# -- the load cache ------------------------------------------------------------------------------------
# A contract's parse (its data and node positions) is a function of the file's bytes and of kc (this parser,
# ruamel, Python); its diagnosis also of the ids it may depend on, the code it names and what is installed. Both
# are kept in the proof cache's directory (obligations.proofcache: the same atomic entries, their own switch
# KC_LOAD_CACHE), keyed on all of that; only a diagnosis without a problem is kept, so a problem is always found
# again. JSON, never pickle.


@dataclass(frozen=True)
class _Positions:
    """A contract's node positions read from the load cache: ruamel's ``lc`` of every mapping and sequence, as
    ``{"m": {key: [key line, key col, value line, value col, child]}}`` and ``{"s": [[line, col, child], ...]}``
    (0-based, as ruamel's; a scalar's child is None)."""

    tree: Any

    def position(self, path: Iterable[Any], value: bool) -> tuple[int, int]:
        """1-based (line, col) of the node at ``path``, as :meth:`Contract.position` finds it in ruamel's nodes."""
        node, line, col = self.tree, 1, 1
        for part in path:
            if (
                isinstance(node, dict)
                and isinstance(node.get("m"), dict)
                and isinstance(part, str)
                and part in node["m"]
            ):
                kl, kc, vl, vc, child = node["m"][part]
                ln, cl = (vl, vc) if value else (kl, kc)
            elif isinstance(node, dict) and isinstance(node.get("s"), list) and isinstance(part, int):
                if not 0 <= part < len(node["s"]):
                    break
                ln, cl, child = node["s"][part]
            else:
                break
            if ln is None or cl is None:
                break
            line, col, node = ln + 1, cl + 1, child
        return line, col


def _capture(node: Any) -> Any:
    """The positions of ``node`` and every node below it (see :class:`_Positions`)."""
    if isinstance(node, CommentedMap):
        out = {}
        for k, v in node.items():
            try:
                (kl, kc), (vl, vc) = node.lc.key(k), node.lc.value(k)
            except (AttributeError, KeyError, TypeError, IndexError, ValueError):  # none recorded (a merged key)
                kl = kc = vl = vc = None
            out[str(k)] = [kl, kc, vl, vc, _capture(v)]
        return {"m": out}
    if isinstance(node, CommentedSeq):
        items = []
        for i, v in enumerate(node):
            try:
                ln, cl = node.lc.item(i)
            except (AttributeError, KeyError, TypeError, IndexError, ValueError):
                ln = cl = None
            items.append([ln, cl, _capture(v)])
        return {"s": items}
    return None


def _cache_settings() -> Any:
    """The load cache's settings where it is on (``KC_LOAD_CACHE=0``: off; ``--no-proof-cache`` leaves it on: a
    parse is no proof), else None."""
    from obligations.proofcache import LOAD_CACHE_ENV, proof_settings

    try:
        settings = proof_settings(LOAD_CACHE_ENV)
    except ValueError:  # a bad KC_Z3_STABILITY: the run reports it; loading goes on without the cache
        return None
    return settings if settings.cache and settings.cache_dir is not None else None


def _kc_roots() -> list[Path]:
    """kc's own code that loading runs: the packages obligations, spec, native, falsification and the schema."""
    here = Path(__file__).resolve().parent
    return [here, *(here.parent / d for d in ("spec", "native", "falsification")), SCHEMA_PATH]


@functools.cache
def _environment() -> str:
    """SHA-256 of Python's version and the distributions installed on sys.path (a ruamel, jsonschema, triton or
    dependency installed, removed or upgraded changes it), computed once per process."""
    import platform

    names = set()
    for entry in dict.fromkeys(sys.path):
        try:
            names.update(n for n in os.listdir(entry or ".") if n.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
    text = json.dumps([platform.python_implementation(), platform.python_version(), sorted(names)])
    return hashlib.sha256(text.encode()).hexdigest()


def _load_key(what: str, sha256: str, **parts: Any) -> str:
    from obligations import __version__
    from obligations.proofcache import cache_key, sources_digest

    return cache_key(
        what,
        {
            "sha256": sha256,
            "kc": __version__,
            "sources": sources_digest(_kc_roots()),
            "environment": _environment(),
            **parts,
        },
    )


def _parse_key(sha256: str) -> str:
    # the loader's limits too: a file within them parses, the same bytes past a lowered one do not
    limits = [MAX_FILE_BYTES, MAX_DEPTH, MAX_ALIASES, MAX_EXPANDED_NODES]
    return _load_key("contract-parse", sha256, limits=limits)


def _cached_parse(path: Path, raw: bytes, sha256: str) -> Contract | None:
    """The contract parsed from these bytes before (the load cache), or None."""
    from obligations.proofcache import cache_get

    settings = _cache_settings()
    if settings is None:
        return None
    entry = cache_get(settings, _parse_key(sha256))
    try:
        body = json.loads(entry["contract"]) if entry is not None else None
        if body is None or not isinstance(body["data"], dict) or not isinstance(body["positions"], dict):
            return None
        text = _decode(path, raw)
    except (KeyError, TypeError, ValueError, ContractError):  # an entry of another shape: a miss
        return None
    return Contract(path=str(path), data=body["data"], sha256=sha256, text=text, _root=_Positions(body["positions"]))


def _store_parse(sha256: str, data: dict[str, Any], root: Any) -> None:
    from obligations.proofcache import cache_put

    settings = _cache_settings()
    if settings is not None:
        # the data as JSON text inside the entry: the entry's keys are sorted, the contract's order is kept
        body = json.dumps({"data": data, "positions": _capture(root)})
        cache_put(settings, _parse_key(sha256), {"contract": body})


def _named_code(c: Contract, imports: bool) -> str | None:
    """SHA-256 of the code outside kc's packages that the contract names (its kernels' modules and test modules:
    each one's whole top-level package); "" where it names none; None where one is not found (not cached)."""
    if not imports:
        return ""  # nothing is imported: the names alone are checked, and they are in the file's bytes
    import importlib.util

    from obligations.proofcache import sources_digest

    names = {str(m) for m in c.data.get("test_modules") or []}
    for k in (c.data.get("kernels") or {}).values():
        if isinstance(k, dict):
            names.update(v.partition(":")[0] for v in k.values() if isinstance(v, str) and ":" in v)
    own = {p.resolve() for p in _kc_roots()}
    roots: set[Path] = set()
    for top in sorted({n.split(".")[0] for n in names if n}):
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        found = [Path(p) for p in spec.submodule_search_locations or []] or (
            [Path(spec.origin)] if spec.origin and spec.origin not in ("built-in", "frozen") else []
        )
        roots.update(p.resolve() for p in found)
    # installed packages are the environment's (their versions are in the key): only the project's own code
    extra = sorted(r for r in roots - own if not {"site-packages", "dist-packages"} & set(r.parts))
    return sources_digest(extra) if extra else ""


def _valid_key(c: Contract, known: set[str], imports: bool) -> str | None:
    """The load cache's key of ``c``'s diagnosis, or None where it is not cached (the cache off, code not found)."""
    if _cache_settings() is None or not isinstance(c.data.get("id"), str):
        return None
    if imports:
        add_project_root(c.path)  # as _diagnose does: the named modules are found from the project's root
    code = _named_code(c, imports)
    if code is None:
        return None
    checks = [f"{f.__module__}.{f.__qualname__}" for f in _CHECKS]  # a plug-in's semantic check too
    return _load_key("contract-valid", c.sha256, imports=imports, known=sorted(known), code=code, checks=checks)


def _is_cached_valid(key: str) -> bool:
    from obligations.proofcache import cache_get

    settings = _cache_settings()
    entry = cache_get(settings, key) if settings is not None else None
    return entry is not None and entry.get("valid") is True


def _store_valid(key: str) -> None:
    from obligations.proofcache import cache_put

    settings = _cache_settings()
    if settings is not None:
        cache_put(settings, key, {"valid": True})


def validate_paths(
    paths: Iterable[str | Path], *, search_path: Iterable[str | Path] = (), imports: bool = True
) -> list[Diagnostic]:
    """Every problem in the named contracts (see :func:`load_contracts`)."""
    return list(load_contracts(paths, search_path=search_path, imports=imports).diagnostics)


def _duplicate_contract_ids(contracts: list[Contract]) -> Iterator[Diagnostic]:
    first: dict[str, Contract] = {}
    for c in contracts:
        cid = c.data.get("id")
        if not isinstance(cid, str):
            continue
        if cid in first:
            other = first[cid]
            line, col = other.position(("id",), value=True)
            yield _d(c, ("id",), f"duplicate contract id {cid!r} (also in {other.path}:{line}:{col})", True)
        else:
            first[cid] = c


def _depends_on_cycles(valid: list[Contract], others: list[Contract]) -> Iterator[Diagnostic]:
    """One diagnostic per named contract on a ``depends_on`` cycle, at the entry that closes it."""
    graph: dict[str, list[str]] = {}
    for c in (*others, *valid):  # the named contracts win over search-path copies of the same id
        deps = c.data.get("depends_on")
        if isinstance(c.data.get("id"), str) and isinstance(deps, list):
            graph[c.data["id"]] = [d for d in deps if isinstance(d, str)]
    for c in valid:
        for idx, dep in enumerate(c.data.get("depends_on") or []):
            cycle = _path_to(graph, dep, c.id)
            if cycle is not None:
                yield _d(c, ("depends_on", idx), "depends_on cycle: " + " -> ".join([c.id, *cycle]))
                break


def _path_to(graph: dict[str, list[str]], start: str, goal: str) -> list[str] | None:
    """Ids from ``start`` to ``goal`` along ``depends_on`` (iterative DFS), or None if ``goal`` is not reached."""
    stack, seen = [(start, [start])], {start}
    while stack:
        node, trail = stack.pop()
        if node == goal:
            return trail
        for nxt in graph.get(node, ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*trail, nxt]))
    return None


# -- checks ------------------------------------------------------------------------------------------

_SCHEMA: dict[str, Any] | None = None
_CHECKS: list[Callable[[Contract, set[str] | None], Iterator[Diagnostic]]] = []
_IMPORTING: set[str] = set()  # names of checks that import or call project code (skipped without imports)


def semantic_check(
    fn: Callable[[Contract, set[str] | None], Iterator[Diagnostic]] | None = None, *, imports: bool = False
) -> Callable:
    """Register a semantic check run on every schema-valid contract (``imports``: it imports project code)."""

    def register(f: Callable[[Contract, set[str] | None], Iterator[Diagnostic]]) -> Callable:
        _CHECKS.append(f)
        if imports:
            _IMPORTING.add(f.__name__)
        return f

    return register(fn) if fn is not None else register


def _schema() -> dict[str, Any]:
    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return _SCHEMA


@functools.cache
def _validator_class() -> Any:
    """The schema validator, built on first use: only validation needs jsonschema (workers only parse)."""
    import jsonschema

    # JSON Schema's "integer" admits 1.0 and 1e300; a contract's integers are YAML integers.
    return jsonschema.validators.extend(
        jsonschema.Draft7Validator,
        type_checker=jsonschema.Draft7Validator.TYPE_CHECKER.redefine(
            "integer", lambda _checker, v: isinstance(v, int) and not isinstance(v, bool)
        ),
    )


def _diagnose(c: Contract, known_ids: set[str] | None, imports: bool = True) -> Iterator[Diagnostic]:
    validator = _validator_class()(_schema())
    schema_errors = sorted(validator.iter_errors(c.data), key=lambda e: list(map(str, e.absolute_path)))
    for err in schema_errors:
        yield _schema_diagnostic(c, err)
    if schema_errors:
        return
    if imports:
        add_project_root(c.path)
    for check in _CHECKS:
        if imports and check.__name__ == "_code_names":
            continue  # _dotted_paths and _test_modules say the same after resolving
        if imports or check.__name__ not in _IMPORTING:
            yield from check(c, known_ids)
        elif check.__name__ == "_expressions":
            yield from _expression_diagnostics(c, imports=False)


def _schema_diagnostic(c: Contract, err: jsonschema.ValidationError) -> Diagnostic:
    path = list(err.absolute_path)
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        where = c.position(path + [extra[0]]) if extra else c.position(path)
        hint = did_you_mean(extra[0], err.schema.get("properties", {})) if extra else ""
        return Diagnostic(c.path, *where, f"unknown key {extra[0]!r}{hint}" if extra else err.message)
    if err.validator == "oneOf":
        msg = f"{'.'.join(map(str, path))}: {_short(err.instance)} matches none of the allowed forms"
        return Diagnostic(c.path, *c.position(path, value=True), msg)
    label = ".".join(map(str, path)) or "contract"
    message = err.message if len(err.message) <= 200 else err.message[:197] + "..."
    return Diagnostic(c.path, *c.position(path, value=bool(path)), f"{label}: {message}")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices`` to ``word``, or ``""``."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def shown_path(path: str | Path) -> str:
    """``path`` as commands quote it: relative to the working directory when it lies below it, else as given."""
    text = str(path)
    if not os.path.isabs(text):
        return text
    try:
        return str(Path(text).relative_to(Path.cwd()))
    except ValueError:  # outside the working directory: only the absolute path finds it
        return text


def add_project_root(contract_path: str | Path) -> Path | None:
    """Put the checked project's root on ``sys.path`` (as pytest's rootdir), so its test modules import.

    The root is the nearest directory above the contract holding ``pyproject.toml``, ``setup.cfg`` or
    ``.git``; without one, the contract's parent directory when it is a ``contracts`` folder, else its own.
    """
    here = Path(contract_path).resolve().parent
    root = next(
        (d for d in (here, *here.parents) if any((d / m).exists() for m in ("pyproject.toml", "setup.cfg", ".git"))),
        None,
    )
    if root is None:
        root = here.parent if here.name == "contracts" else here
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return root


def _short(v: Any) -> str:
    s = json.dumps(v)
    return s if len(s) < 60 else s[:57] + "..."


def _d(c: Contract, path: tuple[Any, ...], msg: str, value: bool = False) -> Diagnostic:
    return Diagnostic(c.path, *c.position(path, value=value), msg)


def _sections(c: Contract) -> Iterator[tuple[str, int, dict[str, Any]]]:
    for key in ("obligations", "falsification"):
        for idx, item in enumerate(c.data.get(key) or []):
            yield key, idx, item


@semantic_check
def _unique_ids(c: Contract, _known: set[str] | None) -> Iterator[Diagnostic]:
    seen: dict[str, tuple[Any, ...]] = {}
    for name in c.data.get("equations") or {}:
        seen[name] = ("equations", name)
    for key, idx, item in _sections(c):
        if item["id"] in seen:
            first = c.position(seen[item["id"]])
            yield _d(c, (key, idx, "id"), f"duplicate id {item['id']!r} (first at line {first[0]})", True)
        seen.setdefault(item["id"], (key, idx))
    for idx, claim in enumerate(c.data.get("not_adopted") or []):
        if claim["id"] in seen:
            first = c.position(seen[claim["id"]])
            yield _d(c, ("not_adopted", idx, "id"), f"duplicate id {claim['id']!r} (first at line {first[0]})", True)
        seen.setdefault(claim["id"], ("not_adopted", idx))
    gate = c.data["qa_gate"]["id"]
    if gate in seen:
        yield _d(c, ("qa_gate", "id"), f"duplicate id {gate!r}", True)


@semantic_check
def _references(c: Contract, known: set[str] | None) -> Iterator[Diagnostic]:
    equations = set(c.data.get("equations") or {})
    item_ids = {item["id"] for _, _, item in _sections(c)}
    for idx, dep in enumerate(c.data.get("depends_on") or []):
        if known is not None and dep not in known:
            yield _d(c, ("depends_on", idx), f"depends_on: no contract with id {dep!r}")
    for key, idx, item in _sections(c):
        eq = item.get("equation")
        if eq is not None and eq not in equations:
            yield _d(c, (key, idx, "equation"), f"unknown equation {eq!r}", True)
        kernel = item.get("kernel")
        if kernel is not None and kernel not in c.data["kernels"]:
            yield _d(c, (key, idx, "kernel"), f"unknown kernel {kernel!r}", True)
    not_adopted = {claim["id"] for claim in c.data.get("not_adopted") or []}
    for idx, rid in enumerate(c.data["qa_gate"]["requires"]):
        if rid in not_adopted:
            yield _d(c, ("qa_gate", "requires", idx), f"qa_gate requires {rid!r}, a claim this contract does not adopt")
        elif rid not in item_ids:
            yield _d(c, ("qa_gate", "requires", idx), f"qa_gate requires unknown item {rid!r}")


def _function(obj: Any) -> bool:
    return inspect.isfunction(obj)


def _function_or_class(obj: Any) -> bool:
    return inspect.isfunction(obj) or inspect.isclass(obj)


# What each kernel role must name: plans are called during validation, so only plain Python functions.
CODE_ROLES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "plan": ("a Python function", _function),
    "entry": ("a Python function or class", _function_or_class),
    "spec": ("a Python function or class", _function_or_class),
}


def _standard_library(module_name: str) -> bool:
    top = module_name.partition(".")[0]
    return top in sys.stdlib_module_names or top in sys.builtin_module_names


def resolve_code(dotted: str, role: str = "plan") -> Any:
    """Resolve a kernel's ``module:attr`` for ``role``, refusing what validation must never import or call.

    The module must not be part of Python's standard library, importing it must not fail or exit, and the
    object must be a function (or, for entry/spec, a class) written in Python outside the standard library:
    no builtins such as ``sys.exit`` or ``os.abort``. Raises ``plans.ResolveError`` saying why.
    """
    module_name = dotted.partition(":")[0]
    if _standard_library(module_name):
        raise plans.ResolveError(
            f"{dotted}: module {module_name!r} is Python's standard library; a kernel's {role} must be project code"
        )
    try:
        obj = plans.resolve(dotted)
    except plans.ResolveError:
        raise
    except SystemExit as e:
        raise plans.ResolveError(f"importing module {module_name!r} called sys.exit({e.code!r})") from None
    except Exception as e:  # a module that raises on import is the contract's problem, not a crash
        raise plans.ResolveError(f"importing module {module_name!r} failed: {type(e).__name__}: {e}") from None
    what, accepts = CODE_ROLES[role]
    if not accepts(obj) or _standard_library(getattr(obj, "__module__", None) or "builtins"):
        raise plans.ResolveError(f"{dotted} is not {what} outside the standard library (it is a {type(obj).__name__})")
    return obj


@semantic_check(imports=True)
def _dotted_paths(c: Contract, _known: set[str] | None) -> Iterator[Diagnostic]:
    for name, k in c.data["kernels"].items():
        for role in CODE_ROLES:
            if role in k:
                try:
                    resolve_code(k[role], role)
                except plans.ResolveError as e:
                    yield _d(c, ("kernels", name, role), str(e), True)
        from native.kinds import kinds  # kc's own registry (imports no toolchain): only when code is resolved

        for kind in kinds().values():
            if kind.name in k:
                yield from (_d(c, ("kernels", name, kind.name), p, True) for p in _kind_problems(c, k, kind))


def _kind_problems(c: Contract, k: Mapping[str, Any], kind: native_kinds.KernelKind) -> list[str]:
    """What is wrong with a kernel's ``kind`` role (e.g. ``triton``): not what the kind takes, or a plan that does
    not supply what the kind reads from it. Where the kind cannot run here (its toolchain absent) the role's
    module is not imported (it imports the toolchain): its items are skipped with that reason at check time."""
    if kind.unavailable() is not None:
        return []
    module_name = k[kind.name].partition(":")[0]
    if _standard_library(module_name):
        return [f"{k[kind.name]}: module {module_name!r} is Python's standard library; a kernel must be project code"]
    try:
        obj = plans.resolve(k[kind.name])
    except plans.ResolveError as e:
        return [str(e)]
    except Exception as e:  # a module that raises on import is the contract's problem, not a crash
        return [f"importing module {module_name!r} failed: {type(e).__name__}: {e}"]
    if not kind.accepts(obj):
        return [f"{k[kind.name]} is not {kind.what} (it is a {type(obj).__name__})"]
    try:
        names = set(plan_quantity_names(c, k["plan"])) if "plan" in k else None
    except Exception:  # the plan's own problem, reported at its line by the checks above
        return []
    return [f"{k[kind.name]}: {p}" for p in kind.problems(obj, names)]


@semantic_check
def _code_names(c: Contract, _known: set[str] | None) -> Iterator[Diagnostic]:
    """Without imports: standard-library modules are refused by name (with imports, _dotted_paths says so)."""
    for name, k in c.data["kernels"].items():
        for role in CODE_ROLES:
            module = str(k.get(role, "")).partition(":")[0]
            if role in k and _standard_library(module):
                yield _d(
                    c,
                    ("kernels", name, role),
                    f"{k[role]}: module {module!r} is Python's standard library; "
                    f"a kernel's {role} must be project code",
                    True,
                )
    for idx, name in enumerate(c.data.get("test_modules") or []):
        if _standard_library(name):
            yield _d(
                c, ("test_modules", idx), f"test module {name!r} is Python's standard library, not a test module", True
            )


def import_test_modules(c: Contract) -> list[tuple[int, str]]:
    """Import the contract's ``test_modules`` (their imports register its tests); (index, error) per failure."""
    failures = []
    for idx, name in enumerate(c.data.get("test_modules") or []):
        if _standard_library(name):
            failures.append((idx, f"test module {name!r} is Python's standard library, not a test module"))
            continue
        try:
            importlib.import_module(name)
        except ImportError as e:
            failures.append((idx, f"cannot import test module {name!r}: {e}"))
        except SystemExit as e:
            failures.append((idx, f"importing test module {name!r} called sys.exit({e.code!r})"))
        except Exception as e:  # a test module that raises on import is reported, not a crash
            failures.append((idx, f"importing test module {name!r} failed: {type(e).__name__}: {e}"))
    return failures


@semantic_check(imports=True)
def _test_modules(c: Contract, _known: set[str] | None) -> Iterator[Diagnostic]:
    # Registered before _methods: the tests an item names exist once these modules are imported.
    for idx, msg in import_test_modules(c):
        yield _d(c, ("test_modules", idx), msg, True)


@semantic_check
def _symbols(c: Contract, _known: set[str] | None) -> Iterator[Diagnostic]:
    for name, decl in c.symbols.items():
        if name.startswith("_") or not name.isidentifier() or name in exprlang.FUNCTIONS:
            yield _d(c, ("symbols", name), f"symbol name {name!r} is not allowed")
        if decl["type"] == "bool":
            if any(k in decl for k in ("min", "max", "values")):
                yield _d(c, ("symbols", name), "bool symbols take no min/max/values")
            continue
        t = sym.machine_type(decl["type"])
        for key in ("min", "max"):
            if key in decl and not t.lo <= decl[key] <= t.hi:
                yield _d(c, ("symbols", name, key), f"{key} {decl[key]} does not fit {t.name}", True)
        if "min" in decl and "max" in decl and decl["min"] > decl["max"]:
            yield _d(c, ("symbols", name), "min is greater than max")
        lo, hi = _declared_range(decl)
        for j, v in enumerate(decl.get("values") or []):
            if isinstance(v, int) and not lo <= v <= hi:  # never a point of the domain: Z3 and enumerate drop it
                what = f"{t.name}" if not t.lo <= v <= t.hi else f"[{lo}, {hi}]"
                yield _d(c, ("symbols", name, "values", j), f"value {v} does not fit {what}", True)


@semantic_check
def _methods(c: Contract, _known: set[str] | None) -> Iterator[Diagnostic]:
    for key, idx, item in _sections(c):
        method = item.get("method", "falsify" if key == "falsification" else None)
        pending = "pending" in item
        if method in ("z3", "enumerate", "sympy") and "prove" not in item and not pending:
            yield _d(c, (key, idx), f"method {method} needs a 'prove' statement")
        if method == "enumerate" and "bound" not in item and not pending:
            yield _d(c, (key, idx), "method enumerate needs a 'bound'")
        if method in ("falsify", "measure") and "test" not in item and not pending:
            yield _d(c, (key, idx), f"method {method} needs a registered 'test' (or 'pending' with the reason)")
        if method == "assume" and "assumption" not in item:
            yield _d(c, (key, idx), "method assume needs the name of the 'assumption'")
        if method in ("z3", "enumerate") and item.get("kernel") is None and len(c.data["kernels"]) != 1:
            yield _d(c, (key, idx), "this contract has several kernels: name the item's 'kernel'")


@semantic_check(imports=True)
def _registered_tests(c: Contract, _known: set[str] | None) -> Iterator[Diagnostic]:
    from falsification.registry import get_test

    for key, idx, item in _sections(c):
        if "test" in item and get_test(item["test"]) is None:
            yield _d(c, (key, idx, "test"), f"no registered falsification test named {item['test']!r}", True)


@semantic_check(imports=True)
def _expressions(c: Contract, _known: set[str] | None) -> Iterator[Diagnostic]:
    yield from _expression_diagnostics(c, imports=True)


def _expression_diagnostics(c: Contract, imports: bool) -> Iterator[Diagnostic]:
    """Statements and bounds: syntax, names, kinds, literals that do not fit, bounds that cannot enumerate.

    Without ``imports`` the plan is not run: its quantities' names and kinds are left to the run with the
    plan, and everything else is checked with the same messages (``kc validate`` and ``kc check`` agree).
    """
    plan_names: dict[str, dict[str, bool]] = {}  # per plan: its symbolic run's names (items share the few plans)
    for key, idx, item in _sections(c):
        names = set(c.symbols)
        quantities: set[str] = set()
        callables: set[str] = set()
        kernel = (
            c.data["kernels"].get(item.get("kernel"))
            if item.get("kernel")
            else (next(iter(c.data["kernels"].values())) if len(c.data["kernels"]) == 1 else None)
        )
        known_names = not (kernel and "plan" in kernel)  # without a plan, a name is a symbol or unknown
        if kernel and "plan" in kernel and imports:
            if kernel["plan"] not in plan_names:
                try:
                    plan_names[kernel["plan"]] = plan_quantity_names(c, kernel["plan"])
                except plans.ResolveError:
                    return  # reported at the plan's line by _dotted_paths
                except Exception as e:  # a plan that cannot run symbolically is a contract problem
                    yield _d(c, ("kernels",), f"plan {kernel['plan']} failed on symbolic inputs: {e}")
                    return
            qs = plan_names[kernel["plan"]]
            quantities = {n for n, v in qs.items() if not v} | BUILTIN_QUANTITIES
            callables = {n for n, v in qs.items() if v}
            known_names = True
        clean = True
        for field_name in ("given", "prove"):
            if field_name not in item:
                continue
            path = (key, idx, field_name)
            try:
                e = exprlang.parse(item[field_name])
            except exprlang.ExprError as err:
                clean = False
                yield Diagnostic(c.path, *c.expression_position(path, err.col, item[field_name]), err.message)
                continue
            if not known_names:
                continue
            clean = clean and not (e.names() - names - quantities - {"True", "False"}) and not (e.called() - callables)
            for n in sorted(e.names() - names - quantities - {"True", "False"}):
                yield Diagnostic(
                    c.path,
                    *c.expression_position(path, _find_name(item[field_name], n), item[field_name]),
                    f"unknown name {n!r} (not a symbol or plan quantity)",
                )
            for n in sorted(e.called() - callables):
                yield Diagnostic(
                    c.path,
                    *c.expression_position(path, _find_name(item[field_name], n), item[field_name]),
                    f"unknown function {n!r} (not a builtin or plan function)",
                )
        if clean:
            # Kinds (integer vs condition) and literal fit: evaluate once over Z3 symbols (the plan's values
            # with imports; opaque without, where every check that needs no plan value is still made).
            for err in statements.statement_errors(c, item, run_plan=imports):
                source = item[err.field]
                yield Diagnostic(c.path, *c.expression_position((key, idx, err.field), err.col, source), err.message)
        yield from _bound_diagnostics(c, key, idx, item, kernel is not None and "plan" in kernel)
        for j, entry in enumerate(item.get("boundaries") or []):  # regimes: guards whose limits get witnesses
            text = entry.get("guard") if isinstance(entry, dict) else entry
            path = (key, idx, "boundaries", j, "guard") if isinstance(entry, dict) else (key, idx, "boundaries", j)
            try:
                e = exprlang.parse(str(text))
            except exprlang.ExprError as err:
                yield Diagnostic(c.path, *c.expression_position(path, err.col, str(text)), err.message)
                continue
            if not known_names:
                continue  # without imports the plan's names are unknown: checked with --import and by kc check
            for n in sorted(e.names() - names - quantities - {"True", "False"}):
                msg = f"unknown name {n!r} in a boundaries guard (not a symbol or plan quantity)"
                yield Diagnostic(c.path, *c.expression_position(path, _find_name(str(text), n), str(text)), msg)
            for n in sorted(e.called() - callables - set(exprlang.FUNCTIONS)):
                msg = f"unknown function {n!r} in a boundaries guard (not a builtin or plan function)"
                yield Diagnostic(c.path, *c.expression_position(path, _find_name(str(text), n), str(text)), msg)


def _bound_diagnostics(c: Contract, key: str, idx: int, item: dict[str, Any], has_plan: bool) -> Iterator[Diagnostic]:
    """An enumeration bound names symbols, each [lo, hi] is integers over symbols expanded before it, and a
    literal range is non-empty and meets the symbol's domain (else the item could only be vacuous)."""
    bound = item.get("bound") or {}
    symbols = c.symbols
    method = item.get("method")
    # Enumeration expands the finite domains the bound leaves out first, then the bound's symbols in its
    # order; a bound of another method (regimes: Z3 constraints) may use any symbol.
    ordered = method == "enumerate"
    expanded = (
        {n for n, d in symbols.items() if n not in bound and (d["type"] == "bool" or "values" in d)}
        if ordered
        else set(symbols)
    )
    for sname, spec in bound.items():
        if sname not in symbols:
            yield _d(c, (key, idx, "bound", sname), f"bound names unknown symbol {sname!r}")
            continue
        parts = spec if isinstance(spec, list) else [spec]
        literal = all(isinstance(p, int) for p in parts)
        for j, part in enumerate(parts):
            if not isinstance(part, str):
                continue
            path = (key, idx, "bound", sname, j) if isinstance(spec, list) else (key, idx, "bound", sname)
            problem = _bound_expression_problem(c, part, sname, expanded, has_plan)
            if problem is not None:
                col, message = problem
                yield Diagnostic(c.path, *c.expression_position(path, col, part), message)
        if literal and method in ("enumerate", "regimes"):
            lo, hi = parts[0], parts[-1]
            d = symbols[sname]
            dom_lo, dom_hi = (0, 1) if d["type"] == "bool" else _declared_range(d)
            where = (key, idx, "bound", sname)
            if lo > hi:
                yield _d(c, where, f"bound [{lo}, {hi}] of {sname!r} is empty (lo > hi)", True)
            elif hi < dom_lo or lo > dom_hi:
                yield _d(
                    c, where, f"bound [{lo}, {hi}] of {sname!r} lies outside its domain [{dom_lo}, {dom_hi}]", True
                )
        expanded.add(sname)


def _declared_range(decl: dict[str, Any]) -> tuple[int, int]:
    t = sym.machine_type(decl["type"])
    return max(t.lo, decl.get("min", t.lo)), min(t.hi, decl.get("max", t.hi))


def _bound_expression_problem(
    c: Contract, source: str, sname: str, expanded: set[str], has_plan: bool
) -> tuple[int, str] | None:
    """(column, message) of the first problem of one bound expression, or None."""
    try:
        e = exprlang.parse(source)
    except exprlang.ExprError as err:
        return err.col, err.message
    for n in sorted(e.names() & set(c.symbols)):
        if n not in expanded:
            return _find_name(source, n), f"bound of {sname!r} uses {n!r}, which is not enumerated before it"
    values: dict[str, Any] = {n: v for n, v in plans.symbolic_env(c.symbols).items() if n in expanded}
    if has_plan:
        values.update({n: exprlang.OPAQUE for n in (e.names() - set(c.symbols)) | e.called()})
    try:
        with sym.tracking():
            v = e.evaluate(values)
    except exprlang.ExprError as err:
        return err.col, err.message
    if isinstance(v, sym.BoolTerm | bool):
        return 0, f"bound of {sname!r} is a condition, not an integer"
    return None


def _find_name(source: str, name: str) -> int:
    import re

    m = re.search(rf"\b{re.escape(name)}\b", source)
    return m.start() if m else 0


def plan_quantity_names(c: Contract, dotted: str) -> dict[str, bool]:
    """Quantity names the plan exposes when run on fresh symbols: name -> is it a function."""
    fn = resolve_code(dotted, "plan")
    params = [p for p in plans.plan_parameters(fn) if p in c.symbols]
    missing = [p for p in plans.plan_parameters(fn, required_only=True) if p not in c.symbols]
    if missing:
        raise ValueError(f"plan parameters {missing} are not declared symbols")
    with sym.tracking():
        env = plans.symbolic_env(c.symbols, set(params))
        try:
            qs = plans.quantities(plans.call_plan(fn, env))
        except SystemExit as e:  # a plan must return its quantities, never end the process
            raise ValueError(f"the plan called sys.exit({e.code!r})") from None
    return {name: callable(v) for name, v in qs.items()}
