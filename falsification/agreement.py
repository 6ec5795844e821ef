"""Agreement kinds: how a native result is judged against its reference, registered by name.

Each kind compares vectorised uint32 bit arrays (NumPy or CuPy) element by element and returns a
:class:`Comparison` (a disagreement mask plus per-element distances and a JSON summary), so a batch of
millions of elements is judged in a few array operations and the runner can point at the first bad one.

* ``bitwise`` — identical bits under the declared float environment; ``nan_policy="class"`` accepts any
  NaN for a NaN (for contracts whose NaN policy is "a NaN", not "this NaN").
* ``max_ulp`` — ULP distance at most ``bound`` (an int, or a callable giving a per-element bound from
  the float64 inputs); NaN must meet NaN.
* ``error_bound`` — ``|native - reference| <= bound(inputs, reference)`` with ``bound`` a callable over
  float64 arrays (e.g. ``gamma_n * |A||B|``); NaN must meet NaN, infinities must match.
* ``determinism`` — the runner evaluates the native side ``runs`` times; every run must equal the first
  bit for bit (NaN payloads included).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from spec import softfloat as sf
from spec.elementwise import bits_to_f64

__all__ = [
    "Comparison",
    "Agreement",
    "AGREEMENTS",
    "register_agreement",
    "make_agreement",
    "ulp_distance",
    "NAN_MISMATCH",
    "BitwiseAgreement",
    "MaxUlpAgreement",
    "ErrorBoundAgreement",
    "DeterminismAgreement",
]

# Distance reported where exactly one side is NaN: larger than any distance between two binary32 values.
NAN_MISMATCH = 1 << 32


def _ns(a: Any) -> ModuleType:
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def _is_nan(u: Any) -> Any:
    return ((u & 0x7F800000) == 0x7F800000) & ((u & 0x007FFFFF) != 0)


def ulp_distance(a: Any, b: Any) -> Any:
    """int64 ULP distance between binary32 bit arrays (softfloat's), NAN_MISMATCH where one side is NaN.

    Two NaNs are at distance 0 (the NaN policy is the bitwise kind's business).
    """
    xp = _ns(a)
    na, nb = _is_nan(a), _is_nan(b)
    either = na | nb
    # Mask NaNs before asking softfloat, so its own NaN sentinel never leaks into a maximum.
    safe_a = xp.where(either, xp.uint32(0), a).astype(xp.uint32)
    safe_b = xp.where(either, xp.uint32(0), b).astype(xp.uint32)
    d = xp.asarray(sf.ulp_distance(safe_a, safe_b, sf.BINARY32)).astype(xp.int64)
    return xp.where(na & nb, 0, xp.where(either, NAN_MISMATCH, d))


@dataclass(frozen=True)
class Comparison:
    """Per-element verdict: ``bad`` mask, optional int64 ``distance`` (ULPs), and a JSON ``summary``."""

    bad: Any
    distance: Any = None
    summary: dict[str, Any] = field(default_factory=dict)


class Agreement(ABC):
    """A way to judge native bits against reference bits; subclasses register under ``name``."""

    name: ClassVar[str]
    runs: int = 1  # how many native evaluations the runner makes (determinism needs several)

    @abstractmethod
    def compare(self, native: Any, reference: Any, alt: Any = None, inputs: list | None = None) -> Comparison:
        """Judge ``native`` against ``reference`` (``alt``: a second accepted reference where not None)."""

    def params(self) -> dict[str, Any]:
        """JSON description of this agreement's parameters (for evidence)."""
        return {k: v for k, v in vars(self).items() if not callable(v)}

    def describe(self) -> dict[str, Any]:
        """JSON evidence: the kind and its parameters."""
        return {"kind": self.name, **self.params()}


AGREEMENTS: dict[str, type[Agreement]] = {}


def register_agreement(cls: type[Agreement]) -> type[Agreement]:
    """Class decorator: register an Agreement subclass under its ``name``."""
    if cls.name in AGREEMENTS and AGREEMENTS[cls.name] is not cls:
        raise ValueError(f"agreement kind {cls.name!r} is registered twice")
    AGREEMENTS[cls.name] = cls
    return cls


def make_agreement(name: str, **params: Any) -> Agreement:
    """An instance of the agreement kind ``name`` with ``params``; KeyError lists the known kinds."""
    try:
        cls = AGREEMENTS[name]
    except KeyError:
        raise KeyError(f"unknown agreement kind {name!r}; known: {sorted(AGREEMENTS)}") from None
    return cls(**params)


def _summary(name: str, bad: Any, distance: Any) -> dict[str, Any]:
    n = int(bad.size)
    out: dict[str, Any] = {"kind": name, "elements": n, "disagreements": int(bad.sum()) if n else 0}
    if distance is not None and n:
        finite = distance[distance < NAN_MISMATCH]
        out["max_ulp"] = int(finite.max()) if finite.size else 0
        out["nan_mismatches"] = int((distance >= NAN_MISMATCH).sum())
    return out


@register_agreement
class BitwiseAgreement(Agreement):
    """Identical bits; with nan_policy "class", any NaN matches any NaN."""

    name = "bitwise"

    def __init__(self, nan_policy: str = "exact") -> None:
        if nan_policy not in ("exact", "class"):
            raise ValueError(f"nan_policy must be 'exact' or 'class', not {nan_policy!r}")
        self.nan_policy = nan_policy

    def compare(self, native: Any, reference: Any, alt: Any = None, inputs: list | None = None) -> Comparison:
        """Bad where bits differ from the reference (and from ``alt``), NaN classes aside if allowed."""
        bad = native != reference
        if alt is not None:
            bad &= native != alt
        if self.nan_policy == "class":
            bad &= ~(_is_nan(native) & _is_nan(reference))
        dist = ulp_distance(native, reference)
        return Comparison(bad, dist, _summary(self.name, bad, dist))


@register_agreement
class MaxUlpAgreement(Agreement):
    """ULP distance to the reference (or ``alt``) at most ``bound``; NaN must meet NaN."""

    name = "max_ulp"

    def __init__(self, bound: int | Callable[..., Any] = 0, bound_name: str | None = None) -> None:
        self.bound = bound
        self.bound_name = bound_name or (
            None if isinstance(bound, int) else getattr(bound, "__name__", "callable")
        )

    def params(self) -> dict[str, Any]:
        """The bound (int) or its name (callable)."""
        return {"bound": self.bound if isinstance(self.bound, int) else self.bound_name}

    def compare(self, native: Any, reference: Any, alt: Any = None, inputs: list | None = None) -> Comparison:
        """Bad where the distance to the nearest accepted reference exceeds the bound."""
        xp = _ns(native)
        dist = ulp_distance(native, reference)
        if alt is not None:
            dist = xp.minimum(dist, ulp_distance(native, alt))
        if isinstance(self.bound, int):
            bound = self.bound
        else:
            bound = self.bound(*[_f64(u) for u in (inputs or [])])
        bad = dist > bound
        return Comparison(bad, dist, _summary(self.name, bad, dist))


def _f64(u: Any) -> Any:
    return bits_to_f64(u)  # exact, subnormals too, on either device


@register_agreement
class ErrorBoundAgreement(Agreement):
    """|native - reference| <= bound(*inputs_f64, reference_f64), evaluated in float64."""

    name = "error_bound"

    def __init__(self, bound: Callable[..., Any], bound_name: str | None = None) -> None:
        self.bound = bound
        self.bound_name = bound_name or getattr(bound, "__name__", "callable")

    def params(self) -> dict[str, Any]:
        """The bound's name."""
        return {"bound": self.bound_name}

    def compare(self, native: Any, reference: Any, alt: Any = None, inputs: list | None = None) -> Comparison:
        """Bad where the float64 difference exceeds the bound, or NaN/Inf classes differ."""
        xp = _ns(native)
        nv, rv = _f64(native), _f64(reference)
        with np.errstate(all="ignore"):
            bound = xp.asarray(self.bound(*[_f64(u) for u in (inputs or [])], rv), dtype=xp.float64)
            err = xp.abs(nv - rv)
        nn, rn = xp.isnan(nv), xp.isnan(rv)
        same_inf = xp.isinf(nv) & (nv == rv)
        ok = xp.where(nn | rn, nn & rn, same_inf | (xp.isfinite(nv) & xp.isfinite(rv) & (err <= bound)))
        bad = ~ok
        dist = ulp_distance(native, reference)
        return Comparison(bad, dist, _summary(self.name, bad, dist))


@register_agreement
class DeterminismAgreement(Agreement):
    """``runs`` native evaluations must agree bit for bit (NaN payloads included)."""

    name = "determinism"

    def __init__(self, runs: int = 3) -> None:
        if runs < 2:
            raise ValueError("determinism needs at least 2 runs")
        self.runs = runs

    def compare(self, native: Any, reference: Any, alt: Any = None, inputs: list | None = None) -> Comparison:
        """Bad where a later run's bits differ from the first run's (``reference``)."""
        bad = native != reference
        dist = ulp_distance(native, reference)
        return Comparison(bad, dist, _summary(self.name, bad, dist))
