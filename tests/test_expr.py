"""The expression language: hostile input rejected with positions; one parse, three meanings that agree."""

from __future__ import annotations

import numpy as np
import pytest
import z3
from hypothesis import given
from hypothesis import strategies as st

from obligations.core import symbolic as sym
from obligations.expr import ExprError, parse

HOSTILE = [
    ("__import__('os').system('true')", 0),
    ("().__class__.__bases__[0].__subclasses__()", 0),
    ("m.__class__", 0),
    ("(lambda: 1)()", 0),
    ("[x for x in range(3)]", 0),
    ("{x: 1 for x in y}", 0),
    ("9**9**9", 0),
    ("m and open('/etc/passwd')", 11),
    ("m > 0 and open(m)", 10),
    ("m + 1.5", 4),
    ("'text'", 0),
    ("m if m else __builtins__", 12),
    ("min(m, k, key=abs)", 0),
    ("f(*args)", 2),
    ("m[0]", 0),
    ("m := 3", 2),
]


@pytest.mark.parametrize(("source", "col"), HOSTILE)
def test_hostile_strings_are_rejected_with_their_position(source, col):
    """Rejected by the parser, or (calls to names that are not plan functions) when evaluated."""
    with pytest.raises(ExprError) as info, sym.tracking():
        parse(source).evaluate({"m": sym.Term(1, "int32")})
    assert info.value.col == col, (source, info.value)


def test_rejection_column_inside_an_implies_operand():
    with pytest.raises(ExprError) as info:
        parse("m > 0 implies m.real > 0")
    assert info.value.col == 14


def test_literal_powers_are_bounded():
    assert parse("2**31 - 1").evaluate({}) == 2**31 - 1
    with pytest.raises(ExprError):
        parse("2**4096")


def test_implies_is_lowest_precedence_and_right_associative():
    e = parse("a implies b implies c")
    env = {"a": True, "b": True, "c": False}
    assert e.evaluate(env) is False
    assert parse("1 < 2 implies 3 < 2").evaluate({}) is False
    assert parse("2 < 1 implies 3 < 2").evaluate({}) is True


def _z3_value(source: str, values: dict[str, int], ty: str = "int32") -> tuple[int, bool]:
    """Evaluate with Z3 carriers under an assignment; return (value, side conditions hold)."""
    with sym.tracking() as t:
        env = {n: sym.Term.symbol(n, ty) for n in values}
        v = parse(source).evaluate(env)
    s = z3.Solver()
    s.add(*[env[n].expr == val for n, val in values.items()])
    assert s.check() == z3.sat
    m = s.model()
    ok = all(z3.is_true(m.eval(c.expr, model_completion=True)) for c in t.conditions)
    return m.eval(v.expr, model_completion=True).as_long(), ok


def _int_value(source: str, values: dict[str, int], ty: str = "int32") -> tuple[int, bool]:
    with sym.tracking() as t:
        v = parse(source).evaluate({n: sym.Term(val, ty) for n, val in values.items()})
    return int(v.expr), all(bool(c.expr) for c in t.conditions)


def _numpy_value(source: str, values: dict[str, int], ty: str = "int32") -> tuple[int, bool]:
    with sym.tracking() as t:
        v = parse(source).evaluate({n: sym.Term(np.array([val], dtype=np.int64), ty) for n, val in values.items()})
    return int(np.asarray(v.expr)[0]), all(bool(np.asarray(c.expr).all()) for c in t.conditions)


CASES = [
    ("a // b", {"a": -7, "b": 2}, -3, True),  # C truncates toward zero (Python would give -4)
    ("a % b", {"a": -7, "b": 2}, -1, True),  # sign of the dividend (Python would give 1)
    ("a // b", {"a": 7, "b": -2}, -3, True),
    ("a % b", {"a": 7, "b": -2}, 1, True),
    ("a * b", {"a": 65536, "b": 32768}, 2**31, False),  # int32 overflow detected
    ("int64(a) * b", {"a": 65536, "b": 32768}, 2**31, True),
    ("cdiv(a, b)", {"a": 2**31 - 1, "b": 256}, 2**23, True),  # no a + b - 1 overflow
    ("min(a, b) + max(a, b)", {"a": 3, "b": -9}, -6, True),
    ("a if a > b else b", {"a": 3, "b": 9}, 9, True),
    ("a // b", {"a": 1, "b": 0}, 0, False),  # division by zero is a failed side-condition
]


@pytest.mark.parametrize(("source", "values", "want", "ok"), CASES)
def test_three_carriers_agree_on_c_semantics(source, values, want, ok):
    for run in (_z3_value, _int_value, _numpy_value):
        value, conds = run(source, values)
        assert conds == ok, (run.__name__, source)
        if ok:
            assert value == want, (run.__name__, source, value)


def _plan_quotients(a: int, b: int, carrier) -> tuple[list[int], bool]:
    """A plan's ``a // b`` and ``a % b`` (Python operators on int64 Terms) on one carrier; whether the
    side-conditions hold."""
    with sym.tracking() as t:
        if carrier == "z3":
            x, y = sym.Term.symbol("x", "int64"), sym.Term.symbol("y", "int64")
        elif carrier == "numpy":
            x, y = (sym.Term(np.array([v], dtype=np.int64), "int64") for v in (a, b))
        else:
            x, y = sym.Term(a, "int64"), sym.Term(b, "int64")
        q, r = x // y, x % y
    if carrier != "z3":
        return [int(np.asarray(q.expr).ravel()[0]), int(np.asarray(r.expr).ravel()[0])], all(
            bool(np.asarray(c.expr).all()) for c in t.conditions
        )
    s = z3.Solver()
    s.add(x.expr == a, y.expr == b)
    assert s.check() == z3.sat
    m = s.model()
    ok = all(z3.is_true(m.eval(c.expr, model_completion=True)) for c in t.conditions)
    return [m.eval(v.expr, model_completion=True).as_long() for v in (q, r)], ok


@pytest.mark.parametrize(("a", "b"), [(7, 2), (0, 5), (2**62, 3), (-7, 2), (7, -2), (-7, -2), (7, 0)])
def test_plan_division_means_launch_time_division_where_its_side_condition_holds(a, b):
    """A plan's // and % (Z3 gets plain ``div``; issue 24) equal Python's at launch on every carrier wherever
    the dividend is non-negative and the divisor positive; elsewhere the side-condition fails (a violation)."""
    for carrier in ("z3", "int", "numpy"):
        values, ok = _plan_quotients(a, b, carrier)
        assert ok == (a >= 0 and b > 0), (carrier, a, b)
        if ok:
            assert values == [a // b, a % b], (carrier, a, b)


def test_unsigned_types_detect_wraparound():
    _, ok = _int_value("a - b", {"a": 1, "b": 2}, "uint32")
    assert not ok


def test_to_sympy_renders_text_and_latex():
    e = parse("accepts(a, b) implies cdiv(m, 256) * 256 >= m")
    assert "ceiling" in e.to_latex() or "lceil" in e.to_latex()
    assert "→" in e.to_text()


def test_symbolic_condition_in_python_control_flow_raises():
    with sym.tracking():
        m = sym.Term.symbol("m", "int32")
        with pytest.raises(TypeError, match="select"):
            if m > 3:
                pass


def test_implies_has_a_function_form_beside_the_infix_keyword():
    import ast

    assert ast.unparse(parse("implies(m > 0, m >= 0)").tree) == "implies(m > 0, m >= 0)"
    assert ast.unparse(parse("m > 0 implies implies(m > 1, m > 0)").tree) == "implies(m > 0, implies(m > 1, m > 0))"


def test_opaque_plan_values_defer_only_the_checks_that_involve_them():
    """kc validate without imports: a plan's value is opaque; every check that needs no plan value is made."""
    from obligations.expr import OPAQUE

    with sym.tracking():
        env = {"q": OPAQUE, "f": OPAQUE, "t": sym.BoolTerm(z3.Bool("t")), "m": sym.Term.symbol("m", "int32")}
        for deferred in ["q < t", "q + 1 > 0", "f(t, m) and not q", "(q if t else m) == 1", "max(q, m) > 0"]:
            assert parse(deferred).evaluate(env) is OPAQUE, deferred
        for source, message in [
            ("q + (t < 1)", "orders integers only"),
            ("f(m * 4294967296)", "literal 4294967296 does not fit int32"),
            ("q and (m if t else t)", "the branches are an integer and a condition"),
            ("max(q, t) > 0", "expected an integer, got a condition"),
        ]:
            with pytest.raises(ExprError, match=message):
                parse(source).evaluate(env)


# int64 values with the boundaries drawn often: the fast paths of symbolic._exact and _tdiv (magnitude bounds, sizes
# over positive divisors) and their exact fallbacks must give the mathematical results on every carrier.
_I64_VALUES = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**31), 2**31),
    st.sampled_from([0, 1, -1, 3037000499, 3037000500, 2**62, -(2**62), 2**63 - 1, -(2**63)]),
)
_PAIRS = st.lists(st.tuples(_I64_VALUES, _I64_VALUES), min_size=1, max_size=6)


@given(_PAIRS, st.sampled_from(["+", "-", "*"]))
def test_exact_arithmetic_on_int64_arrays_is_the_mathematical_result(pairs, op):
    x, y = (np.array([p[i] for p in pairs], dtype=np.int64) for i in (0, 1))
    want = [a + b if op == "+" else a - b if op == "-" else a * b for a, b in pairs]
    assert [int(v) for v in sym._exact(op, x, y)] == want
    b0 = pairs[0][1]  # an array with a Python int (the plans' constants)
    want0 = [a + b0 if op == "+" else a - b0 if op == "-" else a * b0 for a, _ in pairs]
    assert [int(v) for v in sym._exact(op, x, b0)] == want0


@given(_PAIRS)
def test_truncating_division_on_int64_arrays_is_cs(pairs):
    pairs = [(a, b) for a, b in pairs if b != 0]
    if not pairs:
        return
    x, y = (np.array([p[i] for p in pairs], dtype=np.int64) for i in (0, 1))
    want = [(abs(a) // abs(b)) * (1 if (a >= 0) == (b >= 0) else -1) for a, b in pairs]
    assert [int(v) for v in sym._tdiv(x, y)] == want
