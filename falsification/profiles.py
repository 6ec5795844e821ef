"""Profiles and budgets: how hard a falsification item tries, as one typed table.

A run names a :class:`Profile` (``quick`` for CPU CI, ``full`` for the GPU, ``deep`` for a nightly GPU run). The
engine turns it into a :class:`Budget` by looking up :data:`BUDGETS` under the test's name, then under its family
(the part of the name before the dot), then the default; an item's ``params`` may override ``max_examples``,
``max_size``, ``budget_s`` and ``bulk``. Family tests read the budget's fields, never the profile's name.

On ``full`` and ``deep`` a case count is decided by the counts alone: ``budget_s`` there is a safety net of at
least :data:`SAFETY_NET_S`, far above any item's normal time, so a verdict and its case count do not depend on
the machine's load; a stop that fires anyway is written into the evidence (``time_stop``). Only ``quick`` (CPU
CI, seconds per item) stops generation by time. ``full`` was sized from the elements per second the GPU runs of
2026-11-27 recorded (``reports/device/``) for a whole ``kc check contracts --device cuda`` of about 40 s with a
warm proof cache; ``deep`` keeps the budgets ``full`` had before (about 4-6x the drawn cases and elements).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

__all__ = ["Profile", "Budget", "BUDGETS", "SAFETY_NET_S", "budget_for"]


class Profile(StrEnum):
    """How thorough a run is: ``quick`` (CPU CI, seconds per item), ``full`` (the GPU's default, count-bound, about
    a minute for every contract) or ``deep`` (nightly on the GPU: several times full's drawn cases)."""

    QUICK = "quick"
    FULL = "full"
    DEEP = "deep"

    @classmethod
    def of(cls, value: str | Profile) -> Profile:
        """The profile named ``value``; ValueError lists the known ones."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown profile {value!r}; known: {[p.value for p in cls]}") from None


@dataclass(frozen=True)
class Budget:
    """One item's effort: Hypothesis examples, largest case, wall-clock stop, scale and bulk sizes.

    ``max_size``: the largest case (elements of a batch, operands of a call); ``budget_s``: generation stops
    evaluating after this many seconds unless a failure is being shrunk (None: no time stop); ``scale``:
    the factor a family multiplies its per-item dimensions by; ``bulk``: the size of the one large explicit
    case (or sample) a family checks besides its drawn cases; ``max_fold``: the longest sequential chain
    a reference evaluates per output (its time is linear in it).
    """

    max_examples: int
    max_size: int = 0
    budget_s: float | None = None
    scale: int = 1
    bulk: int = 0
    max_fold: int = 0
    max_explicit: int = 6
    minimise_rounds: int = 40

    def with_params(self, params: Mapping[str, Any]) -> Budget:
        """This budget with the item's ``max_examples``/``max_size``/``budget_s``/``bulk`` params applied."""
        over: dict[str, Any] = {}
        for key in ("max_examples", "max_size", "bulk"):
            if key in params:
                over[key] = int(params[key])
        if "budget_s" in params:
            over["budget_s"] = float(params["budget_s"])
        return replace(self, **over)


_Q, _F, _D = Profile.QUICK, Profile.FULL, Profile.DEEP

# The least ``budget_s`` of a full or deep budget: a safety net against a stuck device, never what decides a case
# count (a full item's drawn cases take a few seconds; tests/test_profiles.py holds every table to it).
SAFETY_NET_S = 120.0

# Keyed by test name, else family; the engine's lookup order is test, family, "default". Full's counts were cut
# from deep's (the budgets full had until 2026-11-27) by the measured cost of each family's cases: time is linear
# in drawn cases (and, for batches, in elements); explicit cases, regime, boundary and tie witnesses and refuted
# claims' searches are the same in every profile.
BUDGETS: dict[str, dict[Profile, Budget]] = {
    "default": {
        _Q: Budget(max_examples=12),
        _F: Budget(max_examples=25, scale=16),
        _D: Budget(max_examples=60, scale=16),
    },
    # Binary32 operand batches (falsification.batches), any family: CPU CI keeps each item well under ~5 s
    # on the host. On the GPU the reference ran at ~20-35M elements/s per worker with 15 workers sharing the
    # device: deep's 200 draws of batches up to 4M elements were ~280-370M elements (10-20 s) an item. Full's
    # 60 draws up to 1M elements test 1.12x the elements that 100 draws up to 512K did (~20-30M an item with the
    # explicit and witness batches; median item 1.24x) in 40% fewer batches: with 15 workers time-sliced on one GPU
    # a batch costs its host syncs more than its elements. The elementwise items' worker time in a warm H100 run
    # fell from 114 s (c65ffa3) to 90 s (7913be6); the run's wall time did not move (40.0-41.8 s, then 40.3 s), the
    # GPU's freed time going to the other items.
    "batch": {
        _Q: Budget(max_examples=30, max_size=16384, budget_s=2.0),
        _F: Budget(max_examples=60, max_size=1 << 20, budget_s=SAFETY_NET_S),
        _D: Budget(max_examples=200, max_size=1 << 22, budget_s=2 * SAFETY_NET_S),
    },
    "elementwise": {},  # filled below: the batch budgets
    "elementwise.sweep": {
        _Q: Budget(max_examples=0, bulk=1 << 18),
        _F: Budget(max_examples=0, bulk=1 << 22),
        _D: Budget(max_examples=0, bulk=1 << 22),
    },
    # Fold cases: the softfloat reference costs ~0.1 ms per folded element on one core, so max_fold bounds
    # a case's time; max_size bounds a case's elements.
    "reductions": {
        _Q: Budget(max_examples=12, max_size=1 << 14, max_fold=1 << 12, scale=1),
        _F: Budget(max_examples=25, max_size=1 << 20, max_fold=1 << 13, scale=16),
        _D: Budget(max_examples=60, max_size=1 << 20, max_fold=1 << 13, scale=16),
    },
    "gemm": {
        _Q: Budget(max_examples=12, scale=1),
        _F: Budget(max_examples=25, scale=4),
        _D: Budget(max_examples=60, scale=4),
    },
    "rng": {
        _Q: Budget(max_examples=25, max_size=512, bulk=1 << 14),
        _F: Budget(max_examples=40, max_size=4096, bulk=1 << 20),
        _D: Budget(max_examples=150, max_size=4096, bulk=1 << 20),
    },
    "rng.cross_device": {
        _Q: Budget(max_examples=0, bulk=1 << 18),
        _F: Budget(max_examples=0, bulk=1 << 20),
        _D: Budget(max_examples=0, bulk=1 << 22),
    },
    # bulk >= 2^24 is every input of the map (exhaustive): full keeps it
    "rng.uniform_map_model": {
        _Q: Budget(max_examples=0, bulk=1 << 18),
        _F: Budget(max_examples=0, bulk=1 << 24),
        _D: Budget(max_examples=0, bulk=1 << 24),
    },
    # Training tasks (spec.training.TASKS): max_examples seeds per task, each training a small model for tens of
    # steps (host: ~0.5 s for the decoder block); the seeds are the case count, never stopped by time.
    "training": {
        _Q: Budget(max_examples=1),
        _F: Budget(max_examples=3),
        _D: Budget(max_examples=6),
    },
    "transfer": {
        _Q: Budget(max_examples=60, max_size=32, bulk=1 << 16),
        _F: Budget(max_examples=60, max_size=32, bulk=1 << 20),
        _D: Budget(max_examples=300, max_size=32, bulk=1 << 22),
    },
}

BUDGETS["elementwise"] = BUDGETS["batch"]


def budget_for(test: str, profile: str | Profile, params: Mapping[str, Any] | None = None) -> Budget:
    """The budget of test ``test`` (e.g. ``reductions.fold_bitwise``) under ``profile``, params applied."""
    p = Profile.of(profile)
    family = test.split(".", 1)[0]
    table = BUDGETS.get(test) or BUDGETS.get(family) or BUDGETS["default"]
    return table[p].with_params(params or {})
