"""The pre-engine names (``Subject``, ``falsify``, ``find_item``, ``replay``), kept as thin adapters.

No driver lives here: ``falsify`` turns a :class:`Subject` into the engine check of a binary32 batch
(:func:`falsification.batches.batch_check`) and runs it with :func:`falsification.engine.run`. The CLI's
``kc replay`` and the tutorial's test module import these names; new code uses the engine directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from falsification import engine
from falsification.agreement import Agreement
from falsification.batches import batch_check
from falsification.engine import NativeResult, find_item, replay
from falsification.profiles import budget_for
from falsification.registry import FalsifyContext
from obligations.core.results import Outcome

__all__ = ["NativeResult", "Subject", "falsify", "find_item", "replay"]


@dataclass(frozen=True)
class Subject:
    """A binary32 kernel and its reference over operand bit arrays (see :func:`batch_check`)."""

    name: str
    arity: int
    native: Callable[[list, tuple], NativeResult]
    reference: Callable[[list, tuple], list]
    xp: ModuleType = np
    n_scalars: int = 0
    operand_names: tuple[str, ...] = ()
    scalar_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ("r",)
    evidence: dict[str, Any] = field(default_factory=dict)
    layouts: tuple[str, ...] = ("contiguous",)
    mixes: tuple[str, ...] | None = None
    prepare: Callable[[list], list] | None = None
    scalar_strategy: Any = None


def falsify(ctx: FalsifyContext, subject: Subject, agreement: Agreement) -> Outcome:
    """Run ``subject`` under ``agreement`` through the engine."""
    check = batch_check(
        subject.name,
        arity=subject.arity,
        native=subject.native,
        reference=subject.reference,
        agreement=agreement,
        budget=budget_for("batch", ctx.profile, ctx.params),
        seed=ctx.seed,
        xp=subject.xp,
        n_scalars=subject.n_scalars,
        operand_names=subject.operand_names,
        scalar_names=subject.scalar_names,
        output_names=subject.output_names,
        layouts=subject.layouts,
        mixes=subject.mixes,
        prepare=subject.prepare,
        scalar_strategy=subject.scalar_strategy,
        build=subject.evidence,
    )
    return engine.run(ctx, check)
