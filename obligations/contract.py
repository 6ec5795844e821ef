"""The contract model: YAML with positions, JSON Schema validation, and semantic checks.

Every problem is a :class:`Diagnostic` with file, line and column, printed by ``kc validate`` as
``path:line:col: error: message``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from obligations import expr as exprlang
from obligations import statements
from obligations.core import plans
from obligations.core import symbolic as sym

__all__ = [
    "Diagnostic",
    "Contract",
    "ContractError",
    "import_test_modules",
    "load_contract",
    "validate_paths",
    "contract_files",
    "SCHEMA_PATH",
    "semantic_check",
]

# Quantities every plan offers the checker besides its own: the conjunction of its side-conditions.
BUILTIN_QUANTITIES = frozenset({"no_overflow"})

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "contracts" / "schema" / "contract.schema.json"


@dataclass(frozen=True)
class Diagnostic:
    """One problem in a contract file, located at 1-based line and column."""

    path: str
    line: int
    col: int
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.severity}: {self.message}"


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


def _plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _load_yaml(path: Path) -> tuple[Any, str, bytes]:
    raw = path.read_bytes()
    text = raw.decode("utf-8")
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    try:
        return yaml.load(text), text, raw
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        msg = " ".join(str(x) for x in (e.context, e.problem) if x).replace("\n", " ")
        raise ContractError([Diagnostic(str(path), line, col, f"YAML: {msg}")]) from None


def load_contract(path: str | Path, *, check: bool = True, known_ids: set[str] | None = None) -> Contract:
    """Load one contract; with ``check`` raise ContractError listing every problem found."""
    path = Path(path)
    root, text, raw = _load_yaml(path)
    if not isinstance(root, CommentedMap):
        raise ContractError([Diagnostic(str(path), 1, 1, "a contract is a YAML mapping")])
    contract = Contract(
        path=str(path),
        data=_plain(root),
        sha256=hashlib.sha256(raw).hexdigest(),  # of the file's bytes, so CRLF files hash as stored
        text=text,
        _root=root,
    )
    if check:
        problems = list(_diagnose(contract, known_ids))
        if problems:
            raise ContractError(problems)
    return contract


def contract_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand directories to their ``*.yaml``/``*.yml`` contracts (sorted); keep files as given."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.iterdir() if q.suffix in (".yaml", ".yml") and q.is_file()))
        else:
            out.append(p)
    return out


def validate_paths(paths: Iterable[str | Path]) -> list[Diagnostic]:
    """Every problem in the named contracts (directories expanded); depends_on resolves among them."""
    files = contract_files(paths)
    problems: list[Diagnostic] = []
    ids: set[str] = set()
    for f in files:
        if not f.exists():
            problems.append(Diagnostic(str(f), 1, 1, "no such file"))
            continue
        try:
            c = load_contract(f, check=False)
            if isinstance(c.data.get("id"), str):
                ids.add(c.data["id"])
        except ContractError:
            pass
    # Contracts beside the named ones also satisfy depends_on.
    for d in {f.parent for f in files}:
        for q in contract_files([d]):
            try:
                ids.add(load_contract(q, check=False).data.get("id"))
            except ContractError:
                pass
    for f in files:
        if not f.exists():
            continue
        try:
            load_contract(f, known_ids=ids)
        except ContractError as e:
            problems.extend(e.diagnostics)
    return problems


# -- checks ------------------------------------------------------------------------------------------

_SCHEMA: dict[str, Any] | None = None
_CHECKS: list[Callable[[Contract, set[str] | None], Iterator[Diagnostic]]] = []


def semantic_check(fn: Callable[[Contract, set[str] | None], Iterator[Diagnostic]]) -> Callable:
    """Register a semantic check run on every schema-valid contract."""
    _CHECKS.append(fn)
    return fn


def _schema() -> dict[str, Any]:
    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return _SCHEMA


def _diagnose(c: Contract, known_ids: set[str] | None) -> Iterator[Diagnostic]:
    validator = jsonschema.Draft7Validator(_schema())
    schema_errors = sorted(validator.iter_errors(c.data), key=lambda e: list(map(str, e.absolute_path)))
    for err in schema_errors:
        yield _schema_diagnostic(c, err)
    if schema_errors:
        return
    for check in _CHECKS:
        yield from check(c, known_ids)


def _schema_diagnostic(c: Contract, err: jsonschema.ValidationError) -> Diagnostic:
    path = list(err.absolute_path)
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        where = c.position(path + [extra[0]]) if extra else c.position(path)
        return Diagnostic(c.path, *where, f"unknown key {extra[0]!r}" if extra else err.message)
    if err.validator == "oneOf":
        msg = f"{'.'.join(map(str, path))}: {_short(err.instance)} matches none of the allowed forms"
        return Diagnostic(c.path, *c.position(path, value=True), msg)
    label = ".".join(map(str, path)) or "contract"
    return Diagnostic(c.path, *c.position(path, value=bool(path)), f"{label}: {err.message}")


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
    for idx, rid in enumerate(c.data["qa_gate"]["requires"]):
        if rid not in item_ids:
            yield _d(c, ("qa_gate", "requires", idx), f"qa_gate requires unknown item {rid!r}")


@semantic_check
def _dotted_paths(c: Contract, _known: set[str] | None) -> Iterator[Diagnostic]:
    for name, k in c.data["kernels"].items():
        for role in ("entry", "plan", "spec"):
            if role in k:
                try:
                    obj = plans.resolve(k[role])
                except plans.ResolveError as e:
                    yield _d(c, ("kernels", name, role), str(e), True)
                    continue
                if not callable(obj):
                    yield _d(c, ("kernels", name, role), f"{k[role]} is not callable", True)


def import_test_modules(c: Contract) -> list[tuple[int, str]]:
    """Import the contract's ``test_modules`` (their imports register its tests); (index, error) per failure."""
    failures = []
    for idx, name in enumerate(c.data.get("test_modules") or []):
        try:
            importlib.import_module(name)
        except ImportError as e:
            failures.append((idx, f"cannot import test module {name!r}: {e}"))
    return failures


@semantic_check
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


@semantic_check
def _methods(c: Contract, _known: set[str] | None) -> Iterator[Diagnostic]:
    from falsification.registry import get_test

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
        if "test" in item and get_test(item["test"]) is None:
            yield _d(c, (key, idx, "test"), f"no registered falsification test named {item['test']!r}", True)
        if method in ("z3", "enumerate") and item.get("kernel") is None and len(c.data["kernels"]) != 1:
            yield _d(c, (key, idx), "this contract has several kernels: name the item's 'kernel'")


@semantic_check
def _expressions(c: Contract, _known: set[str] | None) -> Iterator[Diagnostic]:
    for key, idx, item in _sections(c):
        names = set(c.symbols)
        quantities: set[str] = set()
        callables: set[str] = set()
        kernel = c.data["kernels"].get(item.get("kernel")) if item.get("kernel") else (
            next(iter(c.data["kernels"].values())) if len(c.data["kernels"]) == 1 else None)
        if kernel and "plan" in kernel:
            try:
                qs = plan_quantity_names(c, kernel["plan"])
            except Exception as e:  # a plan that cannot run symbolically is a contract problem
                yield _d(c, ("kernels",), f"plan {kernel['plan']} failed on symbolic inputs: {e}")
                return
            quantities = {n for n, v in qs.items() if not v} | BUILTIN_QUANTITIES
            callables = {n for n, v in qs.items() if v}
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
            clean = clean and not (e.names() - names - quantities - {"True", "False"}) and not (
                e.called() - callables)
            for n in sorted(e.names() - names - quantities - {"True", "False"}):
                yield Diagnostic(c.path, *c.expression_position(path, _find_name(item[field_name], n),
                                                                item[field_name]),
                                 f"unknown name {n!r} (not a symbol or plan quantity)")
            for n in sorted(e.called() - callables):
                yield Diagnostic(c.path, *c.expression_position(path, _find_name(item[field_name], n),
                                                                item[field_name]),
                                 f"unknown function {n!r} (not a builtin or plan function)")
        if clean:
            # Kinds (integer vs condition) are known only with the plan's values: evaluate once over Z3 symbols.
            for err in statements.statement_errors(c, item):
                source = item[err.field]
                yield Diagnostic(c.path, *c.expression_position((key, idx, err.field), err.col, source), err.message)
        for sname, spec in (item.get("bound") or {}).items():
            if sname not in names:
                yield _d(c, (key, idx, "bound", sname), f"bound names unknown symbol {sname!r}")
            for j, part in enumerate(spec if isinstance(spec, list) else [spec]):
                if isinstance(part, str):
                    path = (key, idx, "bound", sname, j) if isinstance(spec, list) else (key, idx, "bound", sname)
                    try:
                        exprlang.parse(part)
                    except exprlang.ExprError as err:
                        yield Diagnostic(c.path, *c.expression_position(path, err.col, part), err.message)


def _find_name(source: str, name: str) -> int:
    import re

    m = re.search(rf"\b{re.escape(name)}\b", source)
    return m.start() if m else 0


def plan_quantity_names(c: Contract, dotted: str) -> dict[str, bool]:
    """Quantity names the plan exposes when run on fresh symbols: name -> is it a function."""
    fn = plans.resolve(dotted)
    params = [p for p in plans.plan_parameters(fn) if p in c.symbols]
    missing = [p for p in plans.plan_parameters(fn, required_only=True) if p not in c.symbols]
    if missing:
        raise ValueError(f"plan parameters {missing} are not declared symbols")
    with sym.tracking():
        env = plans.symbolic_env(c.symbols, set(params))
        qs = plans.quantities(plans.call_plan(fn, env))
    return {name: callable(v) for name, v in qs.items()}
