"""Loading the code a contract names (dotted ``module:attr`` paths) and reading a plan's quantities."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from obligations.core import symbolic as sym

__all__ = [
    "resolve",
    "ResolveError",
    "plan_parameters",
    "call_plan",
    "quantities",
    "symbolic_env",
    "plan_regimes",
    "regime_of",
    "BOUNDARY_SIDES",
    "boundary_name",
    "boundary_side",
    "split_witnesses",
]


class ResolveError(LookupError):
    """A dotted path that does not name an importable attribute."""


def resolve(dotted: str) -> Any:
    """Import ``module.path:attr`` and return the attribute, or raise ResolveError saying why."""
    module_name, _, attr = dotted.partition(":")
    if not module_name or not attr:
        raise ResolveError(f"{dotted!r} is not of the form module.path:attribute")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ResolveError(f"cannot import module {module_name!r}: {e}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ResolveError(f"module {module_name!r} has no attribute {attr!r}") from None


def plan_parameters(fn: Callable[..., Any], *, required_only: bool = False) -> list[str]:
    """Names of the plan function's parameters; those without a default must be contract symbols."""
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and not (required_only and p.default is not p.empty)
    ]


def call_plan(fn: Callable[..., Any], env: Mapping[str, Any]) -> Any:
    """Call the plan with the symbols its signature names; parameters with defaults may be left out."""
    required = set(plan_parameters(fn, required_only=True))
    return fn(**{name: env[name] for name in plan_parameters(fn) if name in env or name in required})


def quantities(plan: Any) -> dict[str, Any]:
    """Named quantities of a plan result: mapping items, or dataclass fields plus its public methods."""
    if isinstance(plan, Mapping):
        return dict(plan)
    if dataclasses.is_dataclass(plan):
        out = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if not f.name.startswith("_")}
        for name, _ in inspect.getmembers(type(plan), inspect.isfunction):
            if not name.startswith("_"):
                out[name] = getattr(plan, name)
        return out
    raise TypeError(f"a plan must return a mapping or a dataclass, not {type(plan).__name__}")


def symbolic_env(symbols: Mapping[str, Mapping[str, Any]], names: set[str] | None = None) -> dict[str, Any]:
    """Fresh Z3-carried values for the contract's symbols (bool symbols become Z3 Bools)."""
    import z3

    env: dict[str, Any] = {}
    for name, decl in symbols.items():
        if names is not None and name not in names:
            continue
        if decl["type"] == "bool":
            env[name] = sym.BoolTerm(z3.Bool(name))
        else:
            env[name] = sym.Term.symbol(name, decl["type"])
    return env


def plan_regimes(plan_quantities: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's regimes (name -> condition) from its quantities; {} if it names none."""
    regimes = plan_quantities.get("regimes")
    if callable(regimes):
        regimes = regimes()
    return dict(regimes or {})


def regime_of(plan_fn: Callable[..., Any], values: Mapping[str, Any]) -> list[str]:
    """Names of the regimes the plan selects for concrete ``values`` (launch-time ints)."""
    qs = quantities(call_plan(plan_fn, values))
    return [name for name, cond in plan_regimes(qs).items() if bool(cond)]


# A boundary witness of a regimes item sits on one side of one guard conjunct's limit: "accept" (the guard accepts,
# the conjunct exactly at its limit) or "reject" (every other conjunct holds, this one is one past its limit). Its
# name in the item's ``witnesses`` is the conjunct's text and the side, so the witnesses travel as one mapping.
BOUNDARY_SIDES: tuple[str, ...] = ("accept", "reject")
_SIDE_MARK = " @"


def boundary_name(conjunct: str, side: str) -> str:
    """The witness name of ``conjunct``'s boundary on ``side`` ("accept" or "reject")."""
    if side not in BOUNDARY_SIDES:
        raise ValueError(f"boundary side {side!r} is not one of {BOUNDARY_SIDES}")
    return f"{conjunct}{_SIDE_MARK}{side}"


def boundary_side(name: str) -> str | None:
    """The side of a boundary witness name ("accept" or "reject"), or None for a regime's witness."""
    head, mark, side = name.rpartition(_SIDE_MARK)
    return side if mark and head and side in BOUNDARY_SIDES else None


def split_witnesses(witnesses: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(regime witnesses, accepted boundary witnesses, rejected boundary witnesses) of a regimes item's witnesses."""
    parts: dict[str | None, dict[str, Any]] = {None: {}, "accept": {}, "reject": {}}
    for name, values in witnesses.items():
        parts[boundary_side(name)][name] = values
    return parts[None], parts["accept"], parts["reject"]
