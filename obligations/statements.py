"""A contract item's statement (given, prove) evaluated through its kernel's plan on one carrier.

The Z3 engine, the enumeration engine, counterexample confirmation and ``kc validate``'s type check all
evaluate statements here, so a statement that validates is the statement the engines check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from obligations import expr as exprlang
from obligations.core import plans
from obligations.core import symbolic as sym


class Contract(Protocol):
    """What a statement needs of a contract (``obligations.contract.Contract`` has it; the contract model
    imports this module to validate statements, so this module names the shape, not the class)."""

    @property
    def data(self) -> dict[str, Any]: ...

    @property
    def symbols(self) -> dict[str, dict[str, Any]]: ...


__all__ = ["Evaluation", "StatementError", "evaluate_statement", "kernel_of", "statement_errors"]

FIELDS = ("given", "prove")


class StatementError(exprlang.ExprError):
    """An expression error in one field of an item (``given`` or ``prove``)."""

    def __init__(self, field: str, err: exprlang.ExprError):
        super().__init__(err.message, err.col)
        self.field = field


@dataclass
class Evaluation:
    """A statement evaluated over one carrier: given, prove, the side-conditions and plan quantities."""

    given: sym.BoolTerm
    prove: sym.BoolTerm
    tracker: sym.Tracker
    quantities: dict[str, Any]

    def required(self) -> list[sym.SideCondition]:
        """Side-conditions the claim depends on (those of given and prove)."""
        return [self.tracker.conditions[i] for i in sorted(self.given.deps | self.prove.deps)]


def kernel_of(contract: Contract, item: Mapping[str, Any]) -> dict[str, Any] | None:
    """The kernel an item refers to: the one it names, or the contract's only kernel."""
    kernels = contract.data["kernels"]
    if item.get("kernel"):
        return kernels[item["kernel"]]
    return next(iter(kernels.values())) if len(kernels) == 1 else None


def _condition(field: str, value: Any) -> sym.BoolTerm:
    if isinstance(value, sym.BoolTerm):
        return value
    if isinstance(value, bool | np.bool_):
        return sym.BoolTerm(bool(value))
    raise StatementError(field, exprlang.ExprError(f"the '{field}' statement is an integer, not a condition"))


def evaluate_statement(contract: Contract, item: Mapping[str, Any], env: dict[str, Any]) -> Evaluation:
    """Run the item's kernel plan on ``env`` and evaluate its given/prove statements over the result.

    Raises StatementError (field and column) for an ill-kinded statement.
    """
    with sym.tracking() as tracker:
        values = dict(env)
        quantities: dict[str, Any] = {}
        kernel = kernel_of(contract, item)
        if kernel is not None and "plan" in kernel:
            fn = plans.resolve(kernel["plan"])
            quantities = plans.quantities(plans.call_plan(fn, values))
            plan_conds = frozenset(range(len(tracker.conditions)))
            exprs = [tracker.conditions[i].expr for i in sorted(plan_conds)]
            quantities["no_overflow"] = sym.BoolTerm(sym._and(*exprs) if exprs else True, plan_conds)
        values.update(quantities)
        result = {}
        for field in FIELDS:
            if not item.get(field):
                result[field] = sym.BoolTerm(True)
                continue
            try:
                result[field] = _condition(field, exprlang.parse(item[field]).evaluate(values))
            except StatementError:
                raise
            except exprlang.ExprError as e:
                raise StatementError(field, e) from None
    return Evaluation(result["given"], result["prove"], tracker, quantities)


def statement_errors(contract: Contract, item: Mapping[str, Any], *, run_plan: bool = True) -> list[StatementError]:
    """Kind errors of the item's statements, found by evaluating them once over fresh Z3 symbols.

    Without ``run_plan`` nothing is imported: the plan's quantities are opaque (of either kind), so the
    errors found are those the run with the plan finds too, with the same message and column.
    """
    if not any(item.get(f) for f in FIELDS):
        return []
    env = plans.symbolic_env(contract.symbols)
    try:
        if run_plan:
            evaluate_statement(contract, item, env)
        else:
            _evaluate_offline(contract, item, env)
    except StatementError as e:
        return [e]
    return []


def _evaluate_offline(contract: Contract, item: Mapping[str, Any], env: dict[str, Any]) -> None:
    """Evaluate the statements with every name that is not a symbol opaque (the plan's, known when it runs)."""
    kernel = kernel_of(contract, item)
    has_plan = kernel is not None and "plan" in kernel
    with sym.tracking():
        for field in FIELDS:
            if not item.get(field):
                continue
            try:
                e = exprlang.parse(item[field])
                values = dict(env)
                if has_plan:  # a called name is the plan's even where a symbol has it too (plan values win)
                    values.update({n: exprlang.OPAQUE for n in (e.names() - set(env)) | e.called()})
                value = e.evaluate(values)
                if value is not exprlang.OPAQUE:  # a plan's value: its kind is checked where the plan runs
                    _condition(field, value)
            except StatementError:
                raise
            except exprlang.ExprError as err:
                raise StatementError(field, err) from None
