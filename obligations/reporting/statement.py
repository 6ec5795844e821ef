"""Rendering a formal statement through the project's own parser, with the raw text as the fallback.

Contract text is never evaluated here: it goes to ``obligations.expr.parse(text)`` and only the
resulting AST's ``to_sympy()`` is printed. When the parser is missing, rejects the text or the printer
fails, the statement is shown verbatim (in a code block) and ``RenderedStatement.parsed`` is False.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

__all__ = ["RenderedStatement", "render_statement"]


@dataclass(frozen=True)
class RenderedStatement:
    """One clause of a statement: its raw text and, when it parsed, LaTeX, Unicode and MathML forms."""

    text: str
    latex: str | None = None
    unicode: str | None = None
    mathml: str | None = None
    error: str | None = None

    @property
    def parsed(self) -> bool:
        """True when the project's parser accepted the text and it was printed symbolically."""
        return self.latex is not None


def _parser() -> Any:
    return importlib.import_module("obligations.expr").parse


def _long_names(expr: Any) -> dict[Any, str]:
    """Multi-letter symbols as one italic name (``lda``, not l·d·a) in LaTeX."""
    names = {}
    for sym in getattr(expr, "free_symbols", ()):
        if len(sym.name) > 1:
            names[sym] = r"\mathit{" + sym.name.replace("_", r"\_") + "}"
    return names


def _keep_underscores(expr: Any) -> Any:
    """Symbols named like ``a_bytes`` printed whole in MathML (sympy would make ``bytes`` a subscript)."""
    import sympy

    swap = {
        sym: sympy.Symbol(sym.name.replace("_", "\u02cd"), **sym.assumptions0)
        for sym in getattr(expr, "free_symbols", ())
        if "_" in sym.name
    }
    return expr.xreplace(swap) if swap else expr


# The parser's helper functions, printed as readers know them (C's truncating division and remainder).
_READABLE: dict[str, Any] = {
    "tdiv": lambda sympy, a, b: sympy.Function("trunc")(sympy.Mul(a, sympy.Pow(b, -1, evaluate=False), evaluate=False)),
    "trem": lambda sympy, a, b: sympy.Function("rem")(a, b),
    "tmod": lambda sympy, a, b: sympy.Function("rem")(a, b),
}
# Printer output that would show sympy's internals rather than mathematics: such a form is dropped.
_INTERNALS = ("piecewise", "tdiv", "trem", "tmod")


def _readable(expr: Any) -> Any:
    import sympy

    def swap(e: Any) -> Any:
        name = getattr(getattr(e, "func", None), "__name__", "")
        return _READABLE[name](sympy, *e.args) if name in _READABLE and len(e.args) == 2 else e

    return expr.replace(lambda e: getattr(getattr(e, "func", None), "__name__", "") in _READABLE, swap)


def _clean(form: str | None) -> str | None:
    return None if form is None or any(w in form.lower() for w in _INTERNALS) else form


def render_statement(text: str) -> RenderedStatement:
    """Parse ``text`` with ``obligations.expr.parse`` and print it; never raises, never evaluates text."""
    try:
        expr = _parser()(text).to_sympy()
    except Exception as exc:  # the parser may be absent or reject the text: show it raw
        return RenderedStatement(text=text, error=f"{type(exc).__name__}: {exc}")
    try:
        import sympy
        from sympy.printing.mathml import mathml

        expr = _readable(expr)
        return RenderedStatement(
            text=text,
            latex=sympy.latex(expr, mul_symbol="dot", symbol_names=_long_names(expr)),
            unicode=_clean(sympy.pretty(expr, use_unicode=True)),
            mathml=_clean(mathml(_keep_underscores(expr), printer="presentation", mul_symbol="dot")),
        )
    except Exception as exc:  # a printer failure is a reporting problem, not the contract's
        return RenderedStatement(text=text, error=f"{type(exc).__name__}: {exc}")
