"""Agreement kinds: how a native result is judged against its reference, registered by name.

Every family's checks use these kinds through the engine (:mod:`falsification.engine`). Each kind compares
vectorised arrays (NumPy or CuPy) element by element against an :class:`Expected` (reference bits, an
accepted alternative rounding, or a float64 value with a per-element bound) and returns a
:class:`Comparison` (a disagreement mask plus per-element distances and a JSON summary), so a batch of
millions of elements is judged in a few array operations and the engine can point at the first bad one.
Native outputs are bit arrays (uint8..uint64) or float arrays; ULP distances are binary32's.

* ``bitwise`` — identical bits under the declared float environment; ``nan_policy="class"`` accepts any
  NaN for a NaN (for contracts whose NaN policy is "a NaN", not "this NaN"); ``fmt`` names the storage
  format whose NaNs that policy recognises (binary32 by default; binary16, bfloat16, binary64).
* ``max_ulp`` — ULP distance at most ``bound`` (an int, or a callable giving a per-element bound from
  the float64 inputs); NaN must meet NaN.
* ``error_bound`` — ``|native - reference| <= bound``: the reference's own per-element ``bound`` (a float64
  value and bound computed with it, e.g. ``gamma_n |A||B|``), else ``bound(inputs, reference)`` with
  ``bound`` a callable over float64 arrays; NaN must meet NaN, infinities must match.
* ``determinism`` — the engine evaluates the native side ``runs`` times; every run must equal the first
  bit for bit (NaN payloads included).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from spec import softfloat as sf
from spec.elementwise import bits_to_f64

__all__ = [
    "Expected",
    "Comparison",
    "Agreement",
    "AGREEMENTS",
    "register_agreement",
    "make_agreement",
    "ulp_distance",
    "max_finite",
    "ULP_DISTANCE_BODY",
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


# The same distance as one CuPy elementwise kernel (one pass instead of ~35 array operations); the test suite
# compiles this body for the host and checks it against the array code on every edge pair and a dense sample.
ULP_DISTANCE_BODY = r"""
const unsigned ma = a & 0x7FFFFFFFu, mb = b & 0x7FFFFFFFu;
const bool na = ma > 0x7F800000u, nb = mb > 0x7F800000u;
const long long ka = (a & 0x80000000u) ? -(long long)ma : (long long)ma;  // +0 and -0 are one point
const long long kb = (b & 0x80000000u) ? -(long long)mb : (long long)mb;
const long long diff = ka - kb;
d = (na && nb) ? 0ll : ((na || nb) ? 4294967296ll : (diff < 0 ? -diff : diff));
"""


@functools.cache
def _ulp_kernel() -> Any:
    import cupy

    return cupy.ElementwiseKernel("uint32 a, uint32 b", "int64 d", ULP_DISTANCE_BODY, "kc_ulp_distance")


def ulp_distance(a: Any, b: Any) -> Any:
    """int64 ULP distance between binary32 bit arrays (softfloat's), NAN_MISMATCH where one side is NaN.

    Two NaNs are at distance 0 (the NaN policy is the bitwise kind's business).
    """
    xp = _ns(a)
    if xp is not np and getattr(a, "dtype", None) == np.uint32 and getattr(b, "dtype", None) == np.uint32:
        return _ulp_kernel()(a, b)
    na, nb = _is_nan(a), _is_nan(b)
    either = na | nb
    # Mask NaNs before asking softfloat, so its own NaN sentinel never leaks into a maximum.
    safe_a = xp.where(either, xp.uint32(0), a).astype(xp.uint32)
    safe_b = xp.where(either, xp.uint32(0), b).astype(xp.uint32)
    d = xp.asarray(sf.ulp_distance(safe_a, safe_b, sf.BINARY32)).astype(xp.int64)
    return xp.where(na & nb, 0, xp.where(either, NAN_MISMATCH, d))


@dataclass(frozen=True)
class Expected:
    """What a reference says about one output: exact ``bits`` (and an accepted ``alt``), or a float64
    ``value`` with an absolute per-element ``bound``. Arrays on the native output's device."""

    bits: Any = None
    alt: Any = None
    value: Any = None
    bound: Any = None


def _as_expected(expected: Any) -> Any:
    return expected if hasattr(expected, "bits") else Expected(bits=expected)


_NAN_FORMATS: dict[str, tuple[int, int]] = {  # format -> (exponent mask, fraction mask)
    "binary32": (0x7F800000, 0x007FFFFF),
    "binary16": (0x7C00, 0x03FF),
    "bfloat16": (0x7F80, 0x007F),
    "binary64": (0x7FF0000000000000, 0x000FFFFFFFFFFFFF),
}


def _is_nan_fmt(u: Any, fmt: str) -> Any:
    e, f = _NAN_FORMATS[fmt]
    t = u.dtype.type
    return ((u & t(e)) == t(e)) & ((u & t(f)) != 0)


def _distance(native: Any, reference: Any) -> Any:
    """binary32 ULP distance where both are 32-bit patterns, else None."""
    if getattr(native, "dtype", None) == np.uint32 and getattr(reference, "dtype", None) == np.uint32:
        return ulp_distance(native, reference)
    return None


@dataclass(frozen=True)
class Comparison:
    """Per-element verdict: ``bad`` mask, optional int64 ``distance`` (ULPs), and a JSON ``summary``.

    The summary is computed when read (it synchronises with the device; the engine reads the mask instead).
    """

    bad: Any
    distance: Any = None
    kind: str = ""

    @functools.cached_property
    def summary(self) -> dict[str, Any]:
        """JSON: the kind, elements, disagreements; with distances also the largest finite ULP and NaN mismatches."""
        return _summary(self.kind, self.bad, self.distance)


class Agreement(ABC):
    """A way to judge native bits against reference bits; subclasses register under ``name``."""

    name: ClassVar[str]
    runs: int = 1  # how many native evaluations the runner makes (determinism needs several)

    def compare(self, native: Any, expected: Any, inputs: list | None = None) -> Comparison:
        """Judge ``native`` against ``expected`` (an :class:`Expected`, a spec Reference or a bit array)."""
        e = _as_expected(expected)
        return self._compare(native, e, inputs)

    @abstractmethod
    def _compare(self, native: Any, e: Any, inputs: list | None) -> Comparison:
        """Judge ``native`` against the reference ``e`` (``e.alt``: a second accepted one where not None)."""

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


def max_finite(distance: Any) -> int | None:
    """The largest distance below NAN_MISMATCH, None where there is none (one reduction, no boolean indexing)."""
    if distance is None or not distance.size:
        return None
    xp = _ns(distance)
    m = int(xp.where(distance < NAN_MISMATCH, distance, -1).max())
    return None if m < 0 else m


def _summary(name: str, bad: Any, distance: Any) -> dict[str, Any]:
    n = int(bad.size)
    out: dict[str, Any] = {"kind": name, "elements": n, "disagreements": int(bad.sum()) if n else 0}
    if distance is not None and n:
        out["max_ulp"] = max_finite(distance) or 0
        out["nan_mismatches"] = int((distance >= NAN_MISMATCH).sum())
    return out


@register_agreement
class BitwiseAgreement(Agreement):
    """Identical bits; with nan_policy "class", any NaN matches any NaN."""

    name = "bitwise"

    def __init__(self, nan_policy: str = "exact", fmt: str = "binary32") -> None:
        if nan_policy not in ("exact", "class"):
            raise ValueError(f"nan_policy must be 'exact' or 'class', not {nan_policy!r}")
        if fmt not in _NAN_FORMATS:
            raise ValueError(f"fmt must be one of {sorted(_NAN_FORMATS)}, not {fmt!r}")
        self.nan_policy = nan_policy
        self.fmt = fmt

    def params(self) -> dict[str, Any]:
        """The NaN policy (and the format, where not binary32)."""
        return {"nan_policy": self.nan_policy, **({"fmt": self.fmt} if self.fmt != "binary32" else {})}

    def _compare(self, native: Any, e: Any, inputs: list | None) -> Comparison:
        """Bad where bits differ from the reference (and from ``alt``), NaN classes aside if allowed."""
        reference, alt = e.bits, getattr(e, "alt", None)
        bad = native != reference
        if alt is not None:
            bad &= native != alt
        if self.nan_policy == "class":
            bad &= ~(_is_nan_fmt(native, self.fmt) & _is_nan_fmt(reference, self.fmt))
        dist = _distance(native, reference)
        return Comparison(bad, dist, self.name)


@register_agreement
class MaxUlpAgreement(Agreement):
    """ULP distance to the reference (or ``alt``) at most ``bound``; NaN must meet NaN."""

    name = "max_ulp"

    def __init__(self, bound: int | Callable[..., Any] = 0, bound_name: str | None = None) -> None:
        self.bound = bound
        self.bound_name = bound_name or (None if isinstance(bound, int) else getattr(bound, "__name__", "callable"))

    def params(self) -> dict[str, Any]:
        """The bound (int) or its name (callable)."""
        return {"bound": self.bound if isinstance(self.bound, int) else self.bound_name}

    def _compare(self, native: Any, e: Any, inputs: list | None) -> Comparison:
        """Bad where the distance to the nearest accepted reference exceeds the bound."""
        reference, alt = e.bits, getattr(e, "alt", None)
        xp = _ns(native)
        dist = ulp_distance(native, reference)
        if alt is not None:
            dist = xp.minimum(dist, ulp_distance(native, alt))
        if isinstance(self.bound, int):
            bound = self.bound
        else:
            bound = self.bound(*[_f64(u) for u in (inputs or [])])
        bad = dist > bound
        return Comparison(bad, dist, self.name)


def _f64(u: Any) -> Any:
    return bits_to_f64(u)  # exact, subnormals too, on either device


def _values(a: Any) -> Any:
    """float64 values of a binary32 bit array or of a float array."""
    xp = _ns(a)
    if a.dtype.kind == "f":
        return a.astype(xp.float64)
    return _f64(a)


@register_agreement
class ErrorBoundAgreement(Agreement):
    """|native - reference| <= bound(*inputs_f64, reference_f64), evaluated in float64."""

    name = "error_bound"

    def __init__(self, bound: Callable[..., Any] | None = None, bound_name: str | None = None) -> None:
        self.bound = bound
        self.bound_name = bound_name or getattr(bound, "__name__", "the reference's per-element bound")

    def params(self) -> dict[str, Any]:
        """The bound's name."""
        return {"bound": self.bound_name}

    def _compare(self, native: Any, e: Any, inputs: list | None) -> Comparison:
        """Bad where the float64 difference exceeds the bound, or NaN/Inf classes differ."""
        xp = _ns(native)
        nv = _values(native)
        rv = _values(e.bits) if getattr(e, "value", None) is None else xp.asarray(e.value, dtype=xp.float64)
        with np.errstate(all="ignore"):
            if getattr(e, "bound", None) is not None:
                bound = xp.asarray(e.bound, dtype=xp.float64).reshape(-1)
            elif self.bound is not None:
                bound = xp.asarray(self.bound(*[_f64(u) for u in (inputs or [])], rv), dtype=xp.float64)
            else:
                raise ValueError("error_bound needs a bound: the reference's own or a callable")
            err = xp.abs(nv - rv.reshape(-1))
        nn, rn = xp.isnan(nv), xp.isnan(rv)
        same_inf = xp.isinf(nv) & (nv == rv)
        ok = xp.where(nn | rn, nn & rn, same_inf | (xp.isfinite(nv) & xp.isfinite(rv) & (err <= bound)))
        bad = ~ok
        dist = _distance(native, e.bits) if e.bits is not None else None
        return Comparison(bad, dist, self.name)


@register_agreement
class DeterminismAgreement(Agreement):
    """``runs`` native evaluations must agree bit for bit (NaN payloads included)."""

    name = "determinism"

    def __init__(self, runs: int = 3) -> None:
        if runs < 2:
            raise ValueError("determinism needs at least 2 runs")
        self.runs = runs

    def _compare(self, native: Any, e: Any, inputs: list | None) -> Comparison:
        """Bad where a later run's bits differ from the first run's (``e.bits``)."""
        bad = native != e.bits
        dist = _distance(native, e.bits)
        return Comparison(bad, dist, self.name)
