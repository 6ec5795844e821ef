"""Machine integers that mean the same thing at launch time and in the checker.

Plan functions (grid sizes, buffer lengths, offsets, guards) are ordinary Python integer arithmetic.
At launch time they receive plain ints. In the checker they receive :class:`Term` values: a C machine
type (int32/int64/uint32/uint64) over one of three carriers -- a Python int (confirming a
counterexample), a NumPy int64 array (vectorised bounded enumeration) or a Z3 ``Int`` (proofs).

Why Z3 ``Int`` with range side-conditions rather than bit-vectors: every operation records the
condition under which its mathematical result fits its machine type; a claim is only proved together
with the conditions of every value it uses, so a proof about the unbounded integers is a proof about
the machine integers too, and any wrap-around is reported as a violation with its source line. Bit-blasted
64-bit multiplications made the GEMM guard proof run out of a 500M rlimit (about 120 s); the integer
encoding proves it in well under a second.

Branching on a symbolic condition with ``if`` raises: plans use :func:`select`, :func:`all_of`,
:func:`any_of` so the same code is analysable.
"""

from __future__ import annotations

import contextvars
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "MachineType",
    "TYPES",
    "machine_type",
    "Term",
    "BoolTerm",
    "SideCondition",
    "Tracker",
    "tracking",
    "cdiv",
    "smin",
    "smax",
    "select",
    "all_of",
    "any_of",
    "implies",
    "negate",
    "as_type",
    "fits",
    "is_symbolic",
]


@dataclass(frozen=True)
class MachineType:
    """A C integer type: its name, width in bits and signedness."""

    name: str
    bits: int
    signed: bool

    @property
    def lo(self) -> int:
        """Smallest representable value."""
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def hi(self) -> int:
        """Largest representable value."""
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def rank(self) -> int:
        return self.bits


TYPES: dict[str, MachineType] = {
    t.name: t
    for t in (
        MachineType("int32", 32, True),
        MachineType("int64", 64, True),
        MachineType("uint32", 32, False),
        MachineType("uint64", 64, False),
    )
}


def machine_type(name: str | MachineType) -> MachineType:
    """The machine type called ``name``; ValueError for unknown names."""
    if isinstance(name, MachineType):
        return name
    try:
        return TYPES[name]
    except KeyError:
        raise ValueError(f"unknown machine type {name!r}; expected one of {sorted(TYPES)}") from None


def _promote(a: MachineType, b: MachineType) -> MachineType:
    """C's usual arithmetic conversions restricted to our four types."""
    if a == b:
        return a
    if a.signed == b.signed:
        return a if a.rank >= b.rank else b
    signed, unsigned = (a, b) if a.signed else (b, a)
    if unsigned.rank >= signed.rank:
        return unsigned
    return signed  # the wider signed type represents every value of the narrower unsigned one


@dataclass(frozen=True)
class SideCondition:
    """A condition an operation needs to mean what the unbounded integers say (no overflow, no /0)."""

    expr: Any  # z3 BoolRef, numpy bool array or bool
    message: str
    where: str


@dataclass
class Tracker:
    """Collects the side-conditions recorded while a plan or an expression is evaluated."""

    conditions: list[SideCondition] = field(default_factory=list)
    # C conversions that changed a value (int carrier only: a counterexample's re-run names them).
    conversions: list[str] = field(default_factory=list)

    def record(self, expr: Any, message: str) -> int:
        """Store one side-condition and return its index."""
        self.conditions.append(SideCondition(expr, message, _caller()))
        return len(self.conditions) - 1


_CURRENT: contextvars.ContextVar[Tracker | None] = contextvars.ContextVar("kc_tracker", default=None)
_HERE = os.path.dirname(os.path.abspath(__file__))
_STDLIB = os.path.dirname(os.path.abspath(os.__file__))
_EXPR = os.path.join(os.path.dirname(_HERE), "expr.py")


def _caller() -> str:
    """file:line of the first frame outside the checker's own machinery: where the arithmetic is written."""
    frame = sys._getframe(2)
    while frame is not None:
        fname = os.path.abspath(frame.f_code.co_filename)
        if fname == _EXPR:
            return "contract expression"
        if os.path.dirname(fname) != _HERE and not fname.startswith(_STDLIB):
            return f"{os.path.relpath(fname)}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


@contextmanager
def tracking() -> Iterator[Tracker]:
    """Make a fresh tracker current for the Terms created inside the block."""
    tracker = Tracker()
    token = _CURRENT.set(tracker)
    try:
        yield tracker
    finally:
        _CURRENT.reset(token)


def _tracker() -> Tracker:
    t = _CURRENT.get()
    if t is None:
        raise RuntimeError("symbolic arithmetic outside obligations.core.symbolic.tracking()")
    return t


def is_symbolic(x: Any) -> bool:
    """True for Terms and BoolTerms (checker values), False for plain ints and bools (launch time)."""
    return isinstance(x, Term | BoolTerm)


def _is_z3(e: Any) -> bool:
    # A Z3 expression exists only once z3 is imported: launch-time plans (ints, `kc sweep`) never import it,
    # and machines without z3 (the GPU image) run them all the same; only proofs need it.
    z3 = sys.modules.get("z3")
    return z3 is not None and isinstance(e, z3.ExprRef)


def _z3() -> Any:
    """The z3 module (imported on first symbolic use, after :func:`_is_z3` saw a Z3 value or a symbol is made)."""
    import z3

    return z3


def _and(*es: Any) -> Any:
    es = [e for e in es if e is not True]
    if not es:
        return True
    if any(_is_z3(e) for e in es):
        z3 = _z3()
        return z3.And(*[z3.BoolVal(e) if isinstance(e, bool | np.bool_) else e for e in es])
    out = es[0]
    for e in es[1:]:
        out = out & e if isinstance(out, np.ndarray) or isinstance(e, np.ndarray) else (out and e)
    return out


def _or(*es: Any) -> Any:
    if any(_is_z3(e) for e in es):
        z3 = _z3()
        return z3.Or(*[z3.BoolVal(bool(e)) if isinstance(e, bool | np.bool_) else e for e in es])
    out = es[0]
    for e in es[1:]:
        out = out | e if isinstance(out, np.ndarray) or isinstance(e, np.ndarray) else (out or e)
    return out


def _not(e: Any) -> Any:
    if _is_z3(e):
        return _z3().Not(e)
    if isinstance(e, np.ndarray):
        return ~e
    return not e


def _ite(c: Any, a: Any, b: Any) -> Any:
    if _is_z3(c) or _is_z3(a) or _is_z3(b):
        z3 = _z3()
        c = z3.BoolVal(bool(c)) if isinstance(c, bool | np.bool_) else c
        return z3.If(c, a, b)
    if isinstance(c, np.ndarray) or isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.where(c, a, b)
    return a if c else b


_I64 = np.iinfo(np.int64)


def _py(op: str, a: Any, b: Any) -> Any:
    """``a op b`` on exact carriers (Python ints, Z3 terms, object arrays of Python ints)."""
    return a + b if op == "+" else a - b if op == "-" else a * b


def _exact(op: str, a: Any, b: Any) -> Any:
    """``a op b`` for op in + - * with the mathematical result on every carrier.

    Z3 and Python ints are exact. NumPy int64 arrays wrap silently, so each operation checks for
    wrap-around exactly and redoes the operation on Python-int (object) arrays where it happened:
    enumeration never trusts a wrapped value (a wrapped product can look in range). No recursion: an
    operand already beyond int64 (any depth of nested operations near 2**63) goes straight to objects.
    """
    if not (isinstance(a, np.ndarray) or isinstance(b, np.ndarray)):
        return _py(op, a, b)
    if _is_object(a) or _is_object(b) or not (_fits_i64(a) and _fits_i64(b)):
        return _py(op, _as_object(a), _as_object(b))
    x, y = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    # The operands' largest magnitudes bound every result: within int64, no element can wrap, and the exact
    # per-element checks below (temporaries the size of the grid; the product's a division) are not needed.
    # Enumeration grids run thousands of these on millions of points (CONV-TCONV-enum: 13 M points).
    bx, by = _magnitude(x), _magnitude(y)
    if (bx * by if op == "*" else bx + by) <= _I64.max:
        return x * y if op == "*" else x + y if op == "+" else x - y
    with np.errstate(over="ignore"):
        if op == "+":
            r = x + y
            wrapped = ((x ^ r) & (y ^ r)) < 0
        elif op == "-":
            r = x - y
            wrapped = ((x ^ y) & (x ^ r)) < 0
        else:
            r = x * y
            safe_x = np.where(x == 0, 1, x)
            # r // x == y exactly when no wrap (exact division); INT64_MIN // -1 is itself a wrap.
            special = (x == -1) & (y == _I64.min)
            quotient = np.where(special, 0, r) // np.where(special, 1, safe_x)
            wrapped = special | ((x != 0) & (quotient != y))
    if np.any(wrapped):
        return _py(op, _as_object(a), _as_object(b))
    return r


def _magnitude(x: np.ndarray) -> int:
    """The largest |element| of an int64 array as a Python int (exact for INT64_MIN too); 0 when empty."""
    if x.size == 0:
        return 0
    return max(-int(x.min()), int(x.max()), 0)


def _convert(value: Any, src: MachineType, dst: MachineType, what: str) -> Any:
    """``value`` of type ``src`` as C converts it to ``dst``, the common type of a usual arithmetic conversion.

    The common type represents every value of ``src`` except where a signed type meets an unsigned one
    of at least its width: C then takes the value modulo 2**bits (``-1`` becomes ``2**32 - 1``).
    """
    if not src.signed or dst.signed or (src.lo >= dst.lo and src.hi <= dst.hi):
        return value
    if isinstance(value, np.integer):
        value = int(value)  # a NumPy scalar cannot hold value + 2**64
    if isinstance(value, int) and value < 0 and (t := _CURRENT.get()) is not None:
        t.conversions.append(
            f"{src.name} {value} converts to {dst.name} {value + (1 << dst.bits)} in {what} "
            "(C's usual arithmetic conversions)"
        )
    return _ite(value < 0, _exact("+", value, 1 << dst.bits), value)


def _is_object(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype == object


def _fits_i64(x: Any) -> bool:
    if isinstance(x, np.ndarray):
        return x.dtype != object
    return _I64.min <= int(x) <= _I64.max


def _as_object(x: Any) -> Any:
    """Python-int carrier array (exact, slower) for values the int64 carrier cannot hold."""
    if isinstance(x, np.ndarray):
        return x if x.dtype == object else x.astype(object)  # int64 elements become Python ints
    return int(x)


class BoolTerm:
    """A condition over machine integers: carrier bool / bool array / Z3 BoolRef, plus its side-conditions."""

    __slots__ = ("expr", "deps")

    def __init__(self, expr: Any, deps: frozenset[int] = frozenset()):
        self.expr = expr
        self.deps = deps

    def __bool__(self) -> bool:
        if isinstance(self.expr, bool | np.bool_):
            return bool(self.expr)
        raise TypeError(
            "a symbolic condition was used in Python control flow (if/and/or/not); "
            "write the plan with select(), all_of(), any_of(), negate() so it can be checked"
        )

    def __and__(self, other: Any) -> BoolTerm:
        return all_of(self, other)

    def __or__(self, other: Any) -> BoolTerm:
        return any_of(self, other)

    def __invert__(self) -> BoolTerm:
        return negate(self)

    def _unordered(self, other: Any) -> BoolTerm:
        raise TypeError("conditions are not ordered: '<', '<=', '>', '>=' compare integers only")

    __lt__ = __le__ = __gt__ = __ge__ = _unordered

    def __repr__(self) -> str:
        return f"BoolTerm({self.expr})"


def _lift_bool(x: Any) -> BoolTerm:
    if isinstance(x, BoolTerm):
        return x
    if (
        isinstance(x, bool | np.bool_)
        or (_is_z3(x) and _z3().is_bool(x))
        or (isinstance(x, np.ndarray) and x.dtype in (np.bool_, object))
    ):
        return BoolTerm(x)
    raise TypeError(f"expected a condition, got {type(x).__name__}")


class Term:
    """A machine integer of type ``ty`` whose carrier is an int, an int64 array or a Z3 Int."""

    __slots__ = ("expr", "ty", "deps")

    def __init__(self, expr: Any, ty: MachineType | str, deps: frozenset[int] = frozenset()):
        self.expr = expr
        self.ty = machine_type(ty)
        self.deps = deps

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def symbol(cls, name: str, ty: MachineType | str) -> Term:
        """A fresh Z3 symbol of machine type ``ty`` (its range is a domain constraint, added by the engine)."""
        return cls(_z3().Int(name), ty)

    def _coerce(self, other: Any) -> Term:
        if isinstance(other, Term):
            return other
        if isinstance(other, bool) or not isinstance(other, int | np.integer):
            raise TypeError(f"cannot combine a {self.ty.name} with {type(other).__name__}")
        other = int(other)
        if not self.ty.lo <= other <= self.ty.hi:
            raise OverflowError(f"literal {other} does not fit {self.ty.name}")
        return Term(other, self.ty)

    def _checked(self, value: Any, ty: MachineType, deps: frozenset[int], what: str) -> Term:
        cond = _and(value >= ty.lo, value <= ty.hi)
        idx = _tracker().record(cond, f"{ty.name} overflow in {what}")
        return Term(value, ty, deps | {idx})

    def _arith(self, other: Any, op: str, reflected: bool = False) -> Term:
        o = self._coerce(other)
        a, b = (o, self) if reflected else (self, o)
        ty = _promote(a.ty, b.ty)
        deps = a.deps | b.deps
        return self._checked(_exact(op, a.expr, b.expr), ty, deps, f"'{op}'")

    def __add__(self, o: Any) -> Term:
        return self._arith(o, "+")

    def __radd__(self, o: Any) -> Term:
        return self._arith(o, "+", True)

    def __sub__(self, o: Any) -> Term:
        return self._arith(o, "-")

    def __rsub__(self, o: Any) -> Term:
        return self._arith(o, "-", True)

    def __mul__(self, o: Any) -> Term:
        return self._arith(o, "*")

    def __rmul__(self, o: Any) -> Term:
        return self._arith(o, "*", True)

    def __neg__(self) -> Term:
        return Term(0, self.ty) - self

    def _division(self, other: Any, reflected: bool, want: str, c_semantics: bool) -> Term:
        o = self._coerce(other)
        a, b = (o, self) if reflected else (self, o)
        ty = _promote(a.ty, b.ty)
        deps = a.deps | b.deps
        t = _tracker()
        if c_semantics:
            deps |= {t.record(_not(b.expr == 0) if not _is_z3(b.expr) else b.expr != 0, "division by zero")}
        else:
            # Python's floor division and C's truncation agree only for a >= 0, b > 0; plans divide sizes.
            ok = _and(a.expr >= 0, b.expr > 0)
            deps |= {t.record(ok, "plan division needs a non-negative dividend and a positive divisor")}
        # C divides the converted operands: -1 / 2u is 2147483647u (identity where plan division's check holds).
        what = "'/'" if want == "div" else "'%'"
        x, y = _convert(a.expr, a.ty, ty, what), _convert(b.expr, b.ty, ty, what)
        q = _tdiv(x, y) if c_semantics else _plan_div(x, y)
        value = q if want == "div" else _exact("-", x, _exact("*", y, q))
        return self._checked(value, ty, deps, "'/'" if want == "div" else "'%'")

    def __floordiv__(self, o: Any) -> Term:
        return self._division(o, False, "div", False)

    def __rfloordiv__(self, o: Any) -> Term:
        return self._division(o, True, "div", False)

    def __mod__(self, o: Any) -> Term:
        return self._division(o, False, "rem", False)

    def __rmod__(self, o: Any) -> Term:
        return self._division(o, True, "rem", False)

    def c_div(self, o: Any) -> Term:
        """C's truncating division (the expression language's ``//``)."""
        return self._division(o, False, "div", True)

    def c_rem(self, o: Any) -> Term:
        """C's remainder, sign of the dividend (the expression language's ``%``)."""
        return self._division(o, False, "rem", True)

    # -- comparisons --------------------------------------------------------------------------
    def _cmp(self, other: Any, op: str) -> BoolTerm:
        o = self._coerce(other)
        # C compares in the common type: -1 < 0u is false (the int converts to unsigned).
        ty = _promote(self.ty, o.ty)
        a, b = _convert(self.expr, self.ty, ty, f"'{op}'"), _convert(o.expr, o.ty, ty, f"'{op}'")
        if op == "<":
            e = a < b
        elif op == "<=":
            e = a <= b
        elif op == ">":
            e = a > b
        elif op == ">=":
            e = a >= b
        elif op == "==":
            e = a == b
        else:
            e = _not(a == b)
        return BoolTerm(e, self.deps | o.deps)

    def __lt__(self, o: Any) -> BoolTerm:
        return self._cmp(o, "<")

    def __le__(self, o: Any) -> BoolTerm:
        return self._cmp(o, "<=")

    def __gt__(self, o: Any) -> BoolTerm:
        return self._cmp(o, ">")

    def __ge__(self, o: Any) -> BoolTerm:
        return self._cmp(o, ">=")

    def __eq__(self, o: Any) -> BoolTerm:  # type: ignore[override]
        return self._cmp(o, "==")

    def __ne__(self, o: Any) -> BoolTerm:  # type: ignore[override]
        return self._cmp(o, "!=")

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        raise TypeError("a machine integer Term has no truth value; compare it explicitly")

    def __index__(self) -> int:
        if isinstance(self.expr, int):
            return self.expr
        raise TypeError("a symbolic Term cannot be used as a Python index")

    def __repr__(self) -> str:
        return f"Term({self.expr}: {self.ty.name})"


def _plan_div(a: Any, b: Any) -> Any:
    """A plan's ``a // b``: C truncating division, as Z3's ``div`` where a term is Z3 (the side-condition holds).

    Plan division records ``a >= 0 and b > 0`` as a side-condition that every claim using the quotient must
    prove; where it holds, Z3's Euclidean ``div`` is the truncation C computes and the floor Python computes at
    launch time, so the proof is about the same values. Where it fails, the claim fails with it, and no
    encoding is the launch-time value anyway (Python floors, C truncates). Z3 gets ``div`` alone, not
    :func:`_tdiv`'s sign cases around it: those cost the solver case splits over values the side-condition
    excludes (the reshape plan's saturating ``MAX_NUMEL // max(d, 1)`` spent 32K to 1.4M rlimit by seed with
    them, 32K to 57K without: issue 24).
    """
    if _is_z3(a) or _is_z3(b):
        z3 = _z3()
        return (z3.IntVal(a) if isinstance(a, int) else a) / (z3.IntVal(b) if isinstance(b, int) else b)
    return _tdiv(a, b)


def _tdiv(a: Any, b: Any) -> Any:
    """C truncating division on any carrier (undefined divisor 0 is guarded by a side-condition)."""
    if _is_z3(a) and isinstance(b, int) and b > 0:
        return _z3().If(a >= 0, a / b, -((-a) / b))
    if _is_z3(a) or _is_z3(b):
        z3 = _z3()
        a = z3.IntVal(a) if isinstance(a, int) else a
        b = z3.IntVal(b) if isinstance(b, int) else b
        abs_a = z3.If(a >= 0, a, -a)
        abs_b = z3.If(b >= 0, b, -b)
        q = abs_a / abs_b  # Z3's Int division is Euclidean; on non-negative operands it is truncation
        return z3.If((a >= 0) == (b >= 0), q, -q)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (_is_object(a) or _is_object(b)) and _fits_i64(a) and _fits_i64(b):
            x, y = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
            if x.size and y.size and int(x.min()) >= 0 and int(y.min()) > 0:
                return x // y  # non-negative over positive (sizes, the usual case): truncation is floor division
        if (
            _is_object(a)
            or _is_object(b)
            or not (_fits_i64(a) and _fits_i64(b))
            or np.any(np.asarray(a) == _I64.min)
            or np.any(np.asarray(b) == _I64.min)
        ):
            a, b = _as_object(np.asarray(a)), _as_object(np.asarray(b))  # |INT64_MIN| is not an int64
        else:
            a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        safe_b = np.where(b == 0, 1, b)
        q = np.abs(a) // np.abs(safe_b)
        return np.where((a >= 0) == (safe_b >= 0), q, -q)
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


# -- helpers that work on ints at launch time and on Terms in the checker -----------------------------


def select(cond: Any, a: Any, b: Any) -> Any:
    """``a if cond else b`` for ints/bools at launch time and for Terms/BoolTerms in the checker."""
    if not (is_symbolic(cond) or is_symbolic(a) or is_symbolic(b)):
        return a if cond else b
    c = _lift_bool(cond)
    if isinstance(a, BoolTerm | bool) and isinstance(b, BoolTerm | bool):
        la, lb = _lift_bool(a), _lift_bool(b)
        return BoolTerm(_ite(c.expr, la.expr, lb.expr), c.deps | la.deps | lb.deps)
    ta = a if isinstance(a, Term) else None
    tb = b if isinstance(b, Term) else None
    if ta is None and tb is None:
        # Two literal branches take C's type for integer literals: int, or the narrowest wider type.
        lo, hi = min(a, b), max(a, b)
        fitting = [t for t in (TYPES["int32"], TYPES["int64"], TYPES["uint64"]) if t.lo <= lo and hi <= t.hi]
        if not fitting:
            raise OverflowError(f"literal branches {a} and {b} fit no one integer type")
        ta = Term(int(a), fitting[0])
    ta = ta if ta is not None else tb._coerce(a)
    tb = tb if tb is not None else ta._coerce(b)
    ty = _promote(ta.ty, tb.ty)  # C's ?: converts both branches: max(-1, 0ull) is 2**64 - 1
    value = _ite(c.expr, _convert(ta.expr, ta.ty, ty, "a select"), _convert(tb.expr, tb.ty, ty, "a select"))
    return Term(value, ty, c.deps | ta.deps | tb.deps)


def smin(a: Any, b: Any) -> Any:
    """Minimum of two machine integers."""
    return select(a <= b, a, b)


def smax(a: Any, b: Any) -> Any:
    """Maximum of two machine integers."""
    return select(a >= b, a, b)


def cdiv(a: Any, b: Any) -> Any:
    """Ceiling division for a >= 0, b > 0, computed without the ``a + b - 1`` that can overflow."""
    q = a // b
    return q + select(q * b < a, 1, 0)


def _plain_bool(c: Any) -> bool:
    """A launch-time condition: only real booleans (a stray NotImplemented or int must never read as true)."""
    if isinstance(c, bool | np.bool_):
        return bool(c)
    raise TypeError(f"expected a condition, got {type(c).__name__}")


def all_of(*conds: Any) -> Any:
    """Conjunction of conditions (bools at launch time, BoolTerms in the checker)."""
    if not any(is_symbolic(c) for c in conds):
        return all(_plain_bool(c) for c in conds)
    lifted = [_lift_bool(c) for c in conds]
    deps = frozenset().union(*(c.deps for c in lifted))
    return BoolTerm(_and(*(c.expr for c in lifted)), deps)


def any_of(*conds: Any) -> Any:
    """Disjunction of conditions."""
    if not any(is_symbolic(c) for c in conds):
        return any(_plain_bool(c) for c in conds)
    lifted = [_lift_bool(c) for c in conds]
    deps = frozenset().union(*(c.deps for c in lifted))
    return BoolTerm(_or(*(c.expr for c in lifted)), deps)


def negate(cond: Any) -> Any:
    """Logical not."""
    if not is_symbolic(cond):
        return not _plain_bool(cond)
    c = _lift_bool(cond)
    return BoolTerm(_not(c.expr), c.deps)


def implies(a: Any, b: Any) -> Any:
    """Material implication ``a -> b``."""
    return any_of(negate(a), b)


def as_type(x: Any, ty: str | MachineType) -> Any:
    """Convert to machine type ``ty`` (C cast); narrowing records a range side-condition."""
    if not isinstance(x, Term):
        return x
    t = machine_type(ty)
    if t.lo <= x.ty.lo and x.ty.hi <= t.hi:
        return Term(x.expr, t, x.deps)
    return x._checked(x.expr, t, x.deps, f"conversion to {t.name}")


def fits(x: Any, ty: str | MachineType) -> Any:
    """Condition: ``x`` is representable in machine type ``ty`` (for guards that reject oversize shapes)."""
    t = machine_type(ty)
    if isinstance(x, Term):
        return BoolTerm(_and(x.expr >= t.lo, x.expr <= t.hi), x.deps)
    return t.lo <= x <= t.hi
