"""The contract expression language: a whitelisted parse of Python syntax, evaluated by our own walker.

Contract text is never given to eval/exec/sympify. :func:`parse` accepts integer and boolean arithmetic,
comparisons (chained), ``and``/``or``/``not``, ``implies`` (lowest precedence, right-associative),
``a if c else b``, and calls to a fixed set of functions (min, max, cdiv, select, implies, int32, int64,
uint32, uint64) or to callables the kernel's plan exposes. Everything else is rejected with its column.

One parsed expression has three meanings: :meth:`Expr.evaluate` over Z3-carried Terms (proofs), over
int/NumPy-carried Terms (enumeration, confirmation), and :meth:`Expr.to_sympy` for display.
``//`` and ``%`` are C's truncating division and remainder; machine types come from the operands.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from obligations.core import symbolic as sym
from obligations.core.symbolic import BoolTerm, Term

__all__ = ["ExprError", "Expr", "parse", "FUNCTIONS", "Opaque", "OPAQUE"]

MAX_LITERAL_BITS = 128
MAX_SOURCE = 2000
MAX_DEPTH = 64  # nesting of expressions; deeper statements are rejected, never a RecursionError


class ExprError(ValueError):
    """A rejected expression: the message and the 0-based column in the source string."""

    def __init__(self, message: str, col: int = 0):
        super().__init__(message)
        self.message = message
        self.col = col

    def __str__(self) -> str:
        return f"col {self.col + 1}: {self.message}"


class Opaque:
    """A value known only by running the kernel's plan (``kc validate`` without imports): of either kind.

    Every check that involves it is left to the run with the plan; every check that does not (a literal
    that does not fit its symbol's type, a condition ordered) is made, with the message the run would give.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "OPAQUE"


OPAQUE = Opaque()


def _opaque(*values: Any) -> bool:
    return any(v is OPAQUE for v in values)  # 'is': '==' on a Term builds a condition


def _cast(ty: str) -> Callable[[Any], Any]:
    def cast(x: Any) -> Any:
        if isinstance(x, int) and not isinstance(x, bool):
            t = sym.machine_type(ty)
            if not t.lo <= x <= t.hi:
                raise OverflowError(f"literal {x} does not fit {ty}")
            # A typed constant, not a bare literal: its arithmetic is machine arithmetic, with overflow checks.
            return Term(x, t)
        return sym.as_type(x, ty)

    return cast


def _lit_or_term(f: Callable[[Any, Any], Any], int_f: Callable[[int, int], int]) -> Callable[[Any, Any], Any]:
    def g(a: Any, b: Any) -> Any:
        if isinstance(a, int) and isinstance(b, int):
            return int_f(a, b)
        return f(a, b)

    return g


def _int_cdiv(a: int, b: int) -> int:
    return -((-a) // b)


def _sympy() -> Any:
    """The sympy module, imported on first rendering: parsing and evaluation never need it (seconds to import)."""
    import sympy

    return sympy


def _cast_renderer(ty: str) -> Callable[[Any], Any]:
    return lambda x: _sympy().Function(ty)(x)


# Whitelisted functions: name -> (arity, implementation over Terms/ints, sympy renderer).
FUNCTIONS: dict[str, tuple[int, Callable[..., Any], Callable[..., Any]]] = {
    "min": (2, _lit_or_term(sym.smin, min), lambda a, b: _sympy().Min(a, b)),
    "max": (2, _lit_or_term(sym.smax, max), lambda a, b: _sympy().Max(a, b)),
    "cdiv": (2, _lit_or_term(sym.cdiv, _int_cdiv), lambda a, b: _sympy().ceiling(a / b)),
    "select": (3, sym.select, lambda c, a, b: _sympy().Piecewise((a, _as_bool(c)), (b, True))),
    "implies": (2, sym.implies, lambda a, b: _sympy().Implies(_as_bool(a), _as_bool(b))),
    **{t: (1, _cast(t), _cast_renderer(t)) for t in sym.TYPES},
}

_CMP = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_ARITH = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Pow)


@dataclass(frozen=True)
class Expr:
    """A parsed, whitelisted expression and its source text."""

    source: str
    tree: ast.expr

    def names(self) -> set[str]:
        """Free names used as values (symbols or plan quantities)."""
        funcs = {id(n.func) for n in ast.walk(self.tree) if isinstance(n, ast.Call)}
        return {n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name) and id(n) not in funcs}

    def called(self) -> set[str]:
        """Names used as functions that are not built in (plan callables)."""
        return {
            n.func.id
            for n in ast.walk(self.tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id not in FUNCTIONS
        }

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """Evaluate over ``env`` (names -> Term/BoolTerm/int/bool/callable); carriers decide the meaning."""
        return _Evaluator(env, self.source).visit(self.tree)

    def to_sympy(self) -> Any:
        """A sympy expression for display (text/LaTeX); never used for proofs of machine arithmetic."""
        return _Sympy().visit(self.tree)

    def to_latex(self) -> str:
        """LaTeX rendering of the expression."""
        return _sympy().latex(self.to_sympy())

    def to_text(self) -> str:
        """Unicode rendering of the expression."""
        return _sympy().pretty(self.to_sympy(), use_unicode=True)


def parse(source: str) -> Expr:
    """Parse ``source`` in the contract expression language, or raise ExprError with the column."""
    if not isinstance(source, str):
        raise ExprError(f"expected a string expression, got {type(source).__name__}")
    if len(source) > MAX_SOURCE:
        raise ExprError(f"expression longer than {MAX_SOURCE} characters")
    if "\n" in source.strip() or "\r" in source:
        raise ExprError("expressions are one line", source.find("\n"))
    parts = _split_implies(source)
    trees = [(_parse_part(source, start, end), start) for start, end in parts]
    tree = trees[-1][0]
    for part, _start in reversed(trees[:-1]):  # right-associative: a implies b implies c = a -> (b -> c)
        tree = ast.Call(func=ast.Name(id="implies", ctx=ast.Load()), args=[part, tree], keywords=[])
        ast.copy_location(tree, part)
    if len(trees) > 1:
        _check_depth(tree)  # a chain of 'implies' nests its operands once more each
    return Expr(source, tree)


def _split_implies(source: str) -> list[tuple[int, int]]:
    """Spans of the top-level operands of the ``implies`` keyword (outside any brackets)."""
    spans, depth, start = [], 0, 0
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError) as e:
        raise ExprError(f"cannot tokenize: {e}") from None
    for tok in toks:
        if tok.type == tokenize.COMMENT:
            # Python would drop the rest of the line silently ('m > 0 # and m < 0' reads as 'm > 0').
            raise ExprError("'#' is not allowed in contract expressions (it would comment out the rest)", tok.start[1])
        if tok.type == tokenize.ERRORTOKEN and not tok.string.isspace():
            raise ExprError(f"unexpected character {tok.string!r}", tok.start[1])
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif tok.type == tokenize.NAME and tok.string == "implies" and depth == 0 and not _called(toks, tok):
            col = tok.start[1]
            spans.append((start, col))
            start = tok.end[1]
    spans.append((start, len(source)))
    for s, e in spans:
        if not source[s:e].strip():
            raise ExprError("'implies' needs an expression on each side", s)
    return spans


def _called(toks: list[tokenize.TokenInfo], tok: tokenize.TokenInfo) -> bool:
    """True when ``tok`` is followed by '(' (``implies(a, b)``, the function form), not the infix keyword."""
    i = toks.index(tok)
    return i + 1 < len(toks) and toks[i + 1].type == tokenize.OP and toks[i + 1].string == "("


def _parse_part(source: str, start: int, end: int) -> ast.expr:
    text = source[start:end]
    lead = len(text) - len(text.lstrip())
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"syntax error: {e.msg}", start + lead + max((e.offset or 1) - 1, 0)) from None
    except (RecursionError, MemoryError):
        raise ExprError(f"expression nested too deeply (limit {MAX_DEPTH})", start + lead) from None
    _check_depth(tree, start + lead)
    for node in ast.walk(tree):
        if hasattr(node, "col_offset"):
            node.col_offset += start + lead
    _Whitelist().visit(tree)
    return tree.body


def _check_depth(tree: ast.AST, col: int = 0) -> None:
    """Reject expressions nested deeper than MAX_DEPTH, walking with an explicit stack (no recursion).

    The depth is the nesting of expressions (operations, calls, operands): operator and context nodes
    and brackets add none, so ``(m + (m + ... m))`` with 63 additions is within the limit.
    """
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, ast.expr):
            depth += 1
            if depth > MAX_DEPTH:
                raise ExprError(f"expression nested too deeply (limit {MAX_DEPTH})", _col(node) + col)
        stack.extend((child, depth) for child in ast.iter_child_nodes(node))


class _Whitelist(ast.NodeVisitor):
    """Reject every syntax form outside the language, naming it and its column."""

    def generic_visit(self, node: ast.AST) -> None:
        allowed = (
            ast.Expression,
            ast.BoolOp,
            ast.And,
            ast.Or,
            ast.UnaryOp,
            ast.Not,
            ast.USub,
            ast.UAdd,
            ast.BinOp,
            *_ARITH,
            ast.Compare,
            *_CMP,
            ast.IfExp,
            ast.Name,
            ast.Load,
            ast.Constant,
            ast.Call,
        )
        if not isinstance(node, allowed):
            raise ExprError(f"{type(node).__name__} is not allowed in contract expressions", _col(node))
        super().generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id.startswith("_"):
            raise ExprError(f"name {node.id!r} is not allowed (leading underscore)", node.col_offset)

    def visit_Constant(self, node: ast.Constant) -> None:
        if not isinstance(node.value, bool | int):
            raise ExprError(f"only integer and boolean literals are allowed, not {node.value!r}", node.col_offset)

    def visit_Call(self, node: ast.Call) -> None:
        if not isinstance(node.func, ast.Name):
            raise ExprError("only named functions may be called", node.col_offset)
        if node.keywords:
            raise ExprError("keyword arguments are not allowed", node.col_offset)
        if node.func.id.startswith("_"):
            raise ExprError(f"function {node.func.id!r} is not allowed", node.col_offset)
        if node.func.id in FUNCTIONS and len(node.args) != FUNCTIONS[node.func.id][0]:
            raise ExprError(f"{node.func.id}() takes {FUNCTIONS[node.func.id][0]} arguments", node.col_offset)
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise ExprError("starred arguments are not allowed", a.col_offset)
            self.visit(a)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Pow):
            base, exp = _const_int(node.left), _const_int(node.right)
            if base is None or exp is None:
                raise ExprError("'**' needs integer literal operands", node.col_offset)
            if (
                exp < 0
                or exp > MAX_LITERAL_BITS
                or abs(base) > 1 << 16
                or (abs(base) > 1 and exp * abs(base).bit_length() > MAX_LITERAL_BITS + 16)
            ):
                raise ExprError(
                    f"literal power too large (results are limited to {MAX_LITERAL_BITS} bits)", node.col_offset
                )
        self.generic_visit(node)


def _const_int(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _const_int(node.operand)
        return None if v is None else -v
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return None  # nested powers (9**9**9) are never literal-folded
    return None


def _col(node: ast.AST) -> int:
    return getattr(node, "col_offset", 0)


def _check_literal(v: int, node: ast.AST) -> int:
    if v.bit_length() > MAX_LITERAL_BITS:
        raise ExprError(f"literal arithmetic exceeds {MAX_LITERAL_BITS} bits", _col(node))
    return v


def _is_cond(v: Any) -> bool:
    return isinstance(v, bool | np.bool_ | BoolTerm)


def _is_int(v: Any) -> bool:
    return isinstance(v, Term) or (isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_))


def _kind(v: Any) -> str:
    return "a condition" if _is_cond(v) else "an integer" if _is_int(v) else f"a {type(v).__name__}"


class _Evaluator(ast.NodeVisitor):
    """Evaluate a whitelisted tree; every operand's kind (integer or condition) is checked where it is used.

    A value of the wrong kind, or an operation that raises, becomes an ExprError at its column: nothing
    that is not a Term, BoolTerm, int or bool ever reaches a combinator (a stray ``NotImplemented`` once
    read as "true").
    """

    def __init__(self, env: Mapping[str, Any], source: str):
        self.env = env
        self.source = source

    def visit(self, node: ast.AST) -> Any:
        try:
            value = super().visit(node)
        except ExprError:
            raise
        except (TypeError, OverflowError, ValueError, ZeroDivisionError) as e:
            raise ExprError(str(e), _col(node)) from None
        if not (_is_cond(value) or _is_int(value) or value is OPAQUE):
            raise ExprError(f"{ast.unparse(node)!r} is {_kind(value)}, not an integer or a condition", _col(node))
        return value

    def cond(self, node: ast.AST) -> Any:
        v = self.visit(node)
        if not (_is_cond(v) or v is OPAQUE):
            raise ExprError(f"expected a condition, got {_kind(v)}: {ast.unparse(node)!r}", _col(node))
        return v

    def integer(self, node: ast.AST) -> Any:
        v = self.visit(node)
        if not (_is_int(v) or v is OPAQUE):
            raise ExprError(f"expected an integer, got {_kind(v)}: {ast.unparse(node)!r}", _col(node))
        return v

    def generic_visit(self, node: ast.AST) -> Any:  # pragma: no cover - the whitelist forbids it
        raise ExprError(f"cannot evaluate {type(node).__name__}", _col(node))

    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_Name(self, node: ast.Name) -> Any:
        if node.id in ("True", "False"):
            return node.id == "True"
        try:
            return self.env[node.id]
        except KeyError:
            raise ExprError(f"unknown name {node.id!r}", node.col_offset) from None

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        vals = [self.cond(v) for v in node.values]
        if _opaque(*vals):
            return OPAQUE
        return sym.all_of(*vals) if isinstance(node.op, ast.And) else sym.any_of(*vals)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        v = self.cond(node.operand) if isinstance(node.op, ast.Not) else self.integer(node.operand)
        if v is OPAQUE:
            return OPAQUE
        if isinstance(node.op, ast.Not):
            return sym.negate(v)
        return -v if isinstance(node.op, ast.USub) else v

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        a, b = self.integer(node.left), self.integer(node.right)
        if _opaque(a, b):
            return OPAQUE
        op = node.op
        if not isinstance(a, Term) and not isinstance(b, Term):
            return _check_literal(_int_binop(op, int(a), int(b), node), node)
        if isinstance(op, ast.Add):
            return a + b
        if isinstance(op, ast.Sub):
            return a - b
        if isinstance(op, ast.Mult):
            return a * b
        lhs = a if isinstance(a, Term) else b._coerce(a)
        if isinstance(op, ast.FloorDiv):
            return lhs.c_div(b)
        if isinstance(op, ast.Mod):
            return lhs.c_rem(b)
        raise ExprError("'**' needs integer literal operands", node.col_offset)

    def visit_Compare(self, node: ast.Compare) -> Any:
        left = self.visit(node.left)
        parts = []
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = self.visit(comp)
            name = _CMP[type(op)]
            if _opaque(left, right):
                parts.append(OPAQUE)
                left = right
                continue
            if name in ("==", "!=") and _is_cond(left) != _is_cond(right):
                raise ExprError(f"'{name}' compares {_kind(left)} with {_kind(right)}", _col(node))
            if name not in ("==", "!=") and not (_is_int(left) and _is_int(right)):
                raise ExprError(f"'{name}' orders integers only, not {_kind(left)} and {_kind(right)}", _col(node))
            parts.append(_compare(name, left, right))
            left = right
        if _opaque(*parts):
            return OPAQUE
        return parts[0] if len(parts) == 1 else sym.all_of(*parts)

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        test, body, orelse = self.cond(node.test), self.visit(node.body), self.visit(node.orelse)
        if _opaque(test, body, orelse):
            return OPAQUE
        if _is_cond(body) != _is_cond(orelse):
            raise ExprError(f"the branches are {_kind(body)} and {_kind(orelse)}", _col(node))
        return sym.select(test, body, orelse)

    def visit_Call(self, node: ast.Call) -> Any:
        name = node.func.id
        if name in _SIGNATURES:
            kinds = _SIGNATURES[name]
            args = [
                self.cond(a) if k == "cond" else self.integer(a) if k == "int" else self.visit(a)
                for a, k in zip(node.args, kinds, strict=True)
            ]
            if _opaque(*args):
                return OPAQUE
            if name == "select" and _is_cond(args[1]) != _is_cond(args[2]):
                raise ExprError(f"select() branches are {_kind(args[1])} and {_kind(args[2])}", _col(node))
            return FUNCTIONS[name][1](*args)
        fn = self.env.get(name)
        if fn is OPAQUE:
            for a in node.args:
                self.visit(a)
            return OPAQUE
        if not callable(fn):
            raise ExprError(f"unknown function {name!r}", node.col_offset)
        return fn(*[self.visit(a) for a in node.args])


# The kind each builtin's arguments must have: "int", "cond", or "any" (a select branch).
_SIGNATURES: dict[str, tuple[str, ...]] = {
    "min": ("int", "int"),
    "max": ("int", "int"),
    "cdiv": ("int", "int"),
    "select": ("cond", "any", "any"),
    "implies": ("cond", "cond"),
    **{t: ("int",) for t in sym.TYPES},
}


def _int_binop(op: ast.operator, a: int, b: int, node: ast.AST) -> int:
    if isinstance(op, ast.Add):
        return a + b
    if isinstance(op, ast.Sub):
        return a - b
    if isinstance(op, ast.Mult):
        return a * b
    if isinstance(op, ast.Pow):
        return a**b
    if b == 0:
        raise ExprError("division by zero in literal arithmetic", _col(node))
    q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
    return q if isinstance(op, ast.FloorDiv) else a - b * q


def _compare(op: str, a: Any, b: Any) -> Any:
    """``a op b`` for two integers (any op) or two conditions (== and != only); kinds checked by the caller."""
    if _is_cond(a):
        eq = sym.any_of(sym.all_of(a, b), sym.all_of(sym.negate(a), sym.negate(b)))
        return eq if op == "==" else sym.negate(eq)
    if not isinstance(a, Term) and not isinstance(b, Term):
        a, b = int(a), int(b)
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[op]
    if not isinstance(a, Term):
        a, b, op = b, a, {"<": ">", "<=": ">=", ">": "<", ">=": "<="}.get(op, op)
    return {"<": a.__lt__, "<=": a.__le__, ">": a.__gt__, ">=": a.__ge__, "==": a.__eq__, "!=": a.__ne__}[op](b)


def _as_bool(e: Any) -> Any:
    """A plan call used as a condition becomes a boolean-valued sympy function (sympy's And rejects others)."""
    from sympy.core.function import AppliedUndef
    from sympy.logic.boolalg import Boolean

    if isinstance(e, AppliedUndef) and not isinstance(e, Boolean):
        return type(e.func.__name__, (_sympy().Function, Boolean), {})(*e.args)
    return e


class _Sympy(ast.NodeVisitor):
    def __init__(self) -> None:
        self.sp = _sympy()

    def visit_Constant(self, node: ast.Constant) -> Any:
        return (
            self.sp.true
            if node.value is True
            else self.sp.false
            if node.value is False
            else self.sp.Integer(node.value)
        )

    def visit_Name(self, node: ast.Name) -> Any:
        return self.sp.Symbol(node.id, integer=True)

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        vals = [_as_bool(self.visit(v)) for v in node.values]
        return self.sp.And(*vals) if isinstance(node.op, ast.And) else self.sp.Or(*vals)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        v = self.visit(node.operand)
        return (
            self.sp.Not(_as_bool(v)) if isinstance(node.op, ast.Not) else (-v if isinstance(node.op, ast.USub) else v)
        )

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        a, b = self.visit(node.left), self.visit(node.right)
        op = node.op
        if isinstance(op, ast.Add):
            return self.sp.Add(a, b, evaluate=False)
        if isinstance(op, ast.Sub):
            return self.sp.Add(a, self.sp.Mul(-1, b, evaluate=False), evaluate=False)
        if isinstance(op, ast.Mult):
            return self.sp.Mul(a, b, evaluate=False)
        if isinstance(op, ast.Pow):
            return self.sp.Pow(a, b, evaluate=False)
        if isinstance(op, ast.FloorDiv):
            return self.sp.Function("tdiv")(a, b)
        return self.sp.Function("trem")(a, b)

    def visit_Compare(self, node: ast.Compare) -> Any:
        rel = {"<": self.sp.Lt, "<=": self.sp.Le, ">": self.sp.Gt, ">=": self.sp.Ge, "==": self.sp.Eq, "!=": self.sp.Ne}
        left = self.visit(node.left)
        parts = []
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = self.visit(comp)
            parts.append(rel[_CMP[type(op)]](left, right, evaluate=False))
            left = right
        return parts[0] if len(parts) == 1 else self.sp.And(*parts, evaluate=False)

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        test = _as_bool(self.visit(node.test))
        return self.sp.Piecewise((self.visit(node.body), test), (self.visit(node.orelse), True))

    def visit_Call(self, node: ast.Call) -> Any:
        args = [self.visit(a) for a in node.args]
        name = node.func.id
        if name in FUNCTIONS:
            return FUNCTIONS[name][2](*args)
        return self.sp.Function(name)(*args)
