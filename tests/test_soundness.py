"""Soundness: the checker never proves a false claim.

Regression tests for each false proof found by fuzzing (issue 18), and a property test: random statements
over declared symbols, checked by the Z3 and enumeration engines, must agree with a brute-force oracle
written here independently of ``obligations.expr`` (Python ints, the language's typing rules restated).
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest
import z3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from obligations.check import run_item
from obligations.contract import ContractError, load_contract
from obligations.core import symbolic as sym
from obligations.engines import Job, get_engine
from obligations.expr import MAX_DEPTH, ExprError, parse
from tests.contract_helpers import probe_contract, statement_item

HEADER = """\
id: soundness-v1
version: 1.0.0
family: gemm
summary: soundness probes
kernels:
  k: {entry: "native.gemm:check_buffers"}
equations: {e: {formula: "x"}}
symbols:
  t: {type: bool}
  u: {type: bool}
  a: {type: int32, min: -3, max: 3}
  b: {type: uint32, min: 0, max: 3}
  c: {type: int64, min: -2, max: 2}
  d: {type: uint64, min: 18446744073709551614}
  e: {type: int64, max: -9223372036854775807}
  f: {type: uint64, min: 0, max: 2}
  g: {type: uint32, min: 4294967294}
  h: {type: int64, min: 9223372036854775806}
  x: {type: int64, min: 0}
falsification: []
qa_gate: {id: GATE, requires: []}
"""


def _contract(tmp_path: Path, items: str = "obligations: []\n"):
    return probe_contract(tmp_path, "soundness-v1", HEADER, items)


_item = statement_item


# -- the cases of issue 18, each a regression test ------------------------------------------------------


@pytest.mark.parametrize("method", ["z3", "enumerate"])
def test_ordering_between_conditions_is_rejected_at_validation(tmp_path, method):
    bound = ", bound: {t: [0, 1], u: [0, 1]}" if method == "enumerate" else ""
    _, path = _contract(
        tmp_path,
        "obligations:\n  - {id: B, type: invariant, property: p, method: "
        f'{method}, prove: "t < u and u < t"{bound}}}\n',
    )
    with pytest.raises(ContractError) as info:
        load_contract(path)
    (diag,) = info.value.diagnostics
    line = path.read_text().splitlines()[diag.line - 1]
    assert "orders integers only" in diag.message and line[diag.col - 1 :].startswith("t < u"), diag


def test_ordering_between_conditions_never_reaches_a_combinator(tmp_path):
    contract, _ = _contract(tmp_path)
    for method in ("z3", "enumerate"):
        extra = {"bound": {"t": [0, 1], "u": [0, 1]}} if method == "enumerate" else {}
        out = run_item(contract, _item("t < u and u < t", method, **extra))
        assert out.status.value == "error", (method, out)
    with pytest.raises(TypeError):
        sym.all_of(NotImplemented)
    with pytest.raises(TypeError):
        sym.BoolTerm(True) < sym.BoolTerm(False)  # noqa: B015 - the comparison itself must raise


def test_enumeration_detects_int64_overflow_exactly(tmp_path):
    contract, _ = _contract(tmp_path)
    item = _item("x * x < 2**40", "enumerate", bound={"x": ["2**32", "2**32+4"]})
    out = run_item(contract, item)
    assert out.status.value == "violated", out
    assert out.counterexample["symbols"] == {"x": 2**32}
    z3_out = run_item(contract, _item("x * x < 2**40", given="x >= 2**32 and x <= 2**32+4"))
    assert z3_out.status.value == "violated"


@pytest.mark.parametrize("a, b", [(2**32, 2**32), (-(2**63), -1), (2**62, 2), (-(2**62), 2), (3037000500, 3037000500)])
def test_array_carrier_products_are_exact(a, b):
    with sym.tracking() as tracker:
        x = sym.Term(np.array([a, 1]), "int64") * sym.Term(np.array([b, 1]), "int64")
    assert int(x.expr[0]) == a * b
    fits = bool(np.asarray(tracker.conditions[-1].expr)[0])
    assert fits == (-(2**63) <= a * b < 2**63)


def test_array_carrier_division_of_int64_min_by_minus_one_overflows():
    with sym.tracking() as tracker:
        q = sym.Term(np.array([-(2**63), 7]), "int64").c_div(sym.Term(np.array([-1, -2]), "int64"))
    assert [int(v) for v in q.expr] == [2**63, -3]
    assert list(np.asarray(tracker.conditions[-1].expr)) == [False, True]


@pytest.mark.parametrize(
    "prove",
    [
        "int32(2147483647) + int32(1) > 2147483647",
        "int32(-2147483648) // int32(-1) > 0",
        "uint32(0) - uint32(1) > 0",
        "-int32(-2147483648) > 0",
    ],
)
def test_literal_casts_are_machine_arithmetic(tmp_path, prove):
    contract, _ = _contract(tmp_path)
    out = run_item(contract, _item(prove))
    assert out.status.value == "violated", out
    assert "overflow" in out.reason


def test_comment_in_a_statement_is_rejected():
    with pytest.raises(ExprError) as info:
        parse("m > 0 # and m < 0")
    assert info.value.col == 6


@pytest.mark.parametrize("source", ["-" * 400 + "m", "not " * 300 + "t", "m" + " + m" * 480])
def test_deep_nesting_is_an_expression_error_not_a_recursion_error(source):
    with pytest.raises(ExprError) as info:
        parse(source)
    assert "nested too deeply" in info.value.message or "syntax" in info.value.message


def test_nesting_up_to_the_limit_still_parses():
    parse("-" * (MAX_DEPTH - 4) + "m")
    parse("(" * 150 + "m" + ")" * 150)  # brackets alone add no depth to the tree


@pytest.mark.parametrize("rlimit", [0, 2**32, 2**32 + 1, True, "5"])
def test_rlimit_outside_z3s_range_is_an_error_not_a_silent_wrap(tmp_path, rlimit):
    contract, _ = _contract(tmp_path)
    out = get_engine("z3").discharge(Job(contract, _item("a >= -3", rlimit=rlimit)))
    assert out.status.value == "error" and "rlimit" in out.reason


def test_wall_clock_ceiling_is_a_timeout_error_never_unknown(tmp_path):
    contract, _ = _contract(tmp_path)
    item = _item("x * x * x != 2 * 1000000007 * 1000000009 * 3", given="x <= 4000000000")
    out = get_engine("z3").discharge(Job(contract, item, options={"z3_wall_seconds": 0.001}))
    assert out.status.value in ("error", "violated", "proved")  # a 1 ms ceiling may or may not bind
    if out.status.value == "error":
        assert out.reason.startswith("timeout: z3 ran past its wall-clock ceiling"), out.reason
    assert out.evidence["wall_limit_s"] == 0.001


# -- issue 25: mixed signed/unsigned operands follow C; enumeration never recurses; exact domain sizes --------

MIXED = """\
id: mixed-v1
version: 1.0.0
family: gemm
summary: mixed-sign probes
kernels:
  k: {entry: "native.gemm:check_buffers"}
equations: {e: {formula: "x"}}
symbols:
  x: {type: int32}
  u: {type: uint32}
  w: {type: int64}
  y: {type: int64}
  v: {type: uint64}
falsification: []
qa_gate: {id: GATE, requires: []}
obligations: []
"""


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    path = tmp_path_factory.mktemp("mixed") / "mixed-v1.yaml"
    path.write_text(MIXED)
    return load_contract(path)


def _pinned(given: str) -> dict:
    """The enumeration bound that pins each symbol of ``given`` (``x == -1 and u == 0``) to its value."""
    out = {}
    for part in given.split(" and "):
        name, value = part.split(" == ")
        out[name] = [int(value), int(value)]
    return out


@pytest.mark.parametrize(
    "given, prove, holds",
    [
        ("x == -1 and u == 0", "x < u", False),  # C: -1 < 0u is false (the int converts to unsigned)
        ("w == -1 and v == 0", "w < v", False),
        ("x == -1 and v == 0", "max(x, v) == 0", False),  # C: max(-1, 0ull) is 2**64 - 1
        ("x == -1 and u == 0", "x > u and x != u and not (x <= u)", True),
        ("x == -1 and v == 0", "max(x, v) == 18446744073709551615 and min(x, v) == 0", True),
        ("w == -1 and u == 7", "(w if w < u else u) == -1", True),  # int64 holds every uint32: no conversion
        ("x == -1 and u == 0", "(x if x < 0 else u) == 4294967295", True),  # ?: converts both branches
        ("x == -7 and u == 2", "x // u == 2147483644 and x % u == 1", True),  # C divides converted operands
        ("x == -1 and u == 2", "x + u == 1", True),  # + - * : the exact result fits uint32, equal to C's
    ],
)
@pytest.mark.parametrize("method", ["z3", "enumerate"])
def test_mixed_sign_operands_follow_cs_usual_arithmetic_conversions(mixed, method, given, prove, holds):
    extra = {"given": given} if method == "z3" else {"bound": _pinned(given)}
    out = run_item(mixed, _item(prove, method, **extra))
    assert out.status.value == (("proved" if method == "z3" else "exhausted") if holds else "violated"), out
    if not holds:  # the reason names the rule and what it made of the value
        assert out.counterexample["refutes"] and not out.counterexample["prove"], out
        assert "converts to uint" in out.reason and "(C's usual arithmetic conversions)" in out.reason, out


@pytest.mark.parametrize("method", ["z3", "enumerate"])
def test_a_wrapping_mixed_sign_sum_is_an_overflow(mixed, method):
    extra = {"given": "x == -1 and u == 0"} if method == "z3" else {"bound": {"x": [-1, -1], "u": [0, 0]}}
    out = run_item(mixed, _item("x + u >= 0", method, **extra))  # C: 4294967295u; the wrap is reported
    assert out.status.value == "violated" and "uint32 overflow in '+'" in out.reason, out


def test_a_negative_literal_against_an_unsigned_operand_is_refused(mixed):
    out = run_item(mixed, _item("u > -1"))  # C would compare with UINT_MAX: always false
    assert out.status.value == "error" and "literal -1 does not fit uint32" in out.reason, out


@pytest.mark.parametrize(
    "a, b",
    [
        (np.array([-1, 5, -(2**31)]), np.array([0, 3, 2**32 - 1])),
        (np.array([-1, 2**62]), np.array([2**64 - 1, 0], dtype=object)),
    ],
)
def test_conversion_agrees_on_the_three_carriers(a, b):
    ty_b = "uint32" if b.dtype != object else "uint64"
    ty_a = "int32" if ty_b == "uint32" else "int64"
    for i in range(len(a)):
        with sym.tracking():
            x, y = sym.Term(int(a[i]), ty_a), sym.Term(int(b[i]), ty_b)
            want = [bool((x < y).expr), int(sym.smax(x, y).expr), int(sym.smin(x, y).expr)]
            xa, ya = sym.Term(a, ty_a), sym.Term(b, ty_b)
            got = [bool(np.asarray((xa < ya).expr)[i]), int(sym.smax(xa, ya).expr[i]), int(sym.smin(xa, ya).expr[i])]
            xz, yz = sym.Term.symbol("x", ty_a), sym.Term.symbol("y", ty_b)
            s = z3.Solver()
            s.add(xz.expr == int(a[i]), yz.expr == int(b[i]))
            assert s.check() == z3.sat
            m = s.model()
            zval = [
                z3.is_true(m.eval((xz < yz).expr)),
                m.eval(sym.smax(xz, yz).expr).as_long(),
                m.eval(sym.smin(xz, yz).expr).as_long(),
            ]
        bits = 32 if ty_b == "uint32" else 64
        ca = int(a[i]) % (1 << bits)  # C's conversion of the signed operand
        assert want == got == zval == [ca < int(b[i]), max(ca, int(b[i])), min(ca, int(b[i]))]


@pytest.mark.parametrize("depth", [1, 3, 12])
def test_enumeration_redoes_nested_wrapped_operations_without_recursion(mixed, depth):
    prove = "w" + " * 4" * depth + " > w"
    bound = {"w": [2305843009213693950, 2305843009213693954]}
    out = run_item(mixed, _item(prove, "enumerate", bound=bound))
    assert out.status.value == "violated" and "int64 overflow in '*'" in out.reason, out
    with sym.tracking():
        t = sym.Term(np.array([2**62, 3]), "int64")
        for _ in range(200):  # far past any recursion limit's worth of nesting, all on object arrays
            t = t * 2 + 1 - 1
    assert int(t.expr[0]) == 2**262 and int(t.expr[1]) == 3 * 2**200


@pytest.mark.parametrize(
    "bound, text",
    [
        ({"w": [0, 3], "y": [-4611686018427387904, -1]}, "2^64 points"),
        ({"w": [0, 3], "y": [-(2**62), 0]}, "18446744073709551620 (~1.84e+19) points"),
        ({"y": [-(2**63), 2**63 - 1]}, "2^64 points"),
        ({"w": [0, 10**12 - 1], "y": [0, 10**12 - 1]}, "10^24 points"),
        ({"w": [0, 1000], "y": ["-w", "w * 2**60"]}, "points (limit"),
        ({"w": [0, 10**12 - 1], "y": [0, 10**12 - 1], "v": [0, 9]}, "10^25 points"),
        ({"w": [0, 10**12 - 1], "y": ["w", "w + 1"]}, "at least 10^12 points"),
    ],
)
def test_enumeration_domain_sizes_are_exact_and_never_reach_numpy_unchecked(mixed, bound, text):
    out = run_item(mixed, _item("y >= 0", "enumerate", bound=bound))
    assert out.status.value == "error" and text in out.reason and "limit 30000000" in out.reason, out


def test_a_huge_row_count_before_an_empty_bound_is_vacuous_not_too_large(mixed):
    out = run_item(mixed, _item("y >= 0", "enumerate", bound={"w": [0, 10**12], "y": [5, 3]}))
    assert out.status.value == "error" and out.reason.startswith("vacuous"), out


def test_enumeration_stops_between_symbols_when_the_run_stops(mixed):
    from obligations.core import cancel

    cancel.request_stop("test")
    try:
        with pytest.raises(cancel.StopRequested):
            get_engine("enumerate").discharge(Job(mixed, _item("w >= 0", "enumerate", bound={"w": [0, 3]})))
    finally:
        cancel.clear_stop()


def test_bounds_outside_the_machine_type_are_clipped_not_an_overflow_error(mixed):
    out = run_item(mixed, _item("y < -(2**62)", "enumerate", bound={"y": [-(2**63) - 1, -(2**63) + 3]}))
    assert out.status.value == "exhausted" and out.evidence["points"] == 4, out
    out = run_item(mixed, _item("v > 2**63", "enumerate", bound={"v": [2**64 - 5, 2**64 + 5]}))
    assert out.status.value == "exhausted" and out.evidence["points"] == 5, out


def test_a_declared_value_past_int64_stays_in_the_enumerated_domain(tmp_path):
    values = "values: [0, 9223372036854775808, 18446744073709551615]"
    text = MIXED.replace("  v: {type: uint64}\n", f"  v: {{type: uint64, {values}}}\n")
    path = tmp_path / "mixed-v1.yaml"
    path.write_text(text)
    contract = load_contract(path)
    out = run_item(contract, _item("v + 1 > v", "enumerate"))  # 2**64 - 1 was once left out of the domain
    assert out.status.value == "violated" and out.counterexample["symbols"] == {"v": 2**64 - 1}, out
    assert run_item(contract, _item("v // 2 <= 9223372036854775807", "enumerate")).status.value == "exhausted"


def test_sixty_nested_operations_are_within_the_depth_limit():
    parse("(m + " * 60 + "m" + ")" * 60)
    parse("min(m, " * (MAX_DEPTH - 1) + "m" + ")" * (MAX_DEPTH - 1))
    with pytest.raises(ExprError, match="nested too deeply"):
        parse("(m + " * MAX_DEPTH + "m" + ")" * MAX_DEPTH)
    with pytest.raises(ExprError, match="nested too deeply"):
        parse("t implies " * MAX_DEPTH + "t")  # the chain nests once per 'implies'


# -- issue 25: kc validate checks everything that needs no import, with kc check's diagnostics ----------------

BAD_NO_PLAN = """\
id: bad-v1
version: 1.0.0
family: gemm
summary: bad texts that need no import to find
kernels:
  k: {entry: "native.gemm:check_buffers"}
equations: {e: {formula: "x"}}
symbols:
  x: {type: int32, min: 0, max: 100}
  u: {type: uint32}
  t: {type: bool}
  f: {type: int32, values: [1, 2]}
  z: {type: int32, values: [1, 4294967296]}
  z2: {type: int32, min: 0, max: 5, values: [7]}
obligations:
  - {id: LIT, type: invariant, property: p, method: z3, prove: "x * 4294967296 > 0"}
  - {id: NEG, type: invariant, property: p, method: z3, prove: "u > -1"}
  - {id: ORD, type: invariant, property: p, method: z3, prove: "t < t"}
  - {id: NOTINT, type: invariant, property: p, method: z3, given: "not x", prove: "x >= 0"}
  - {id: INTSTMT, type: invariant, property: p, method: z3, prove: "x + 1"}
  - {id: BRANCH, type: invariant, property: p, method: z3, prove: "(x if t else t) == 1"}
  - {id: NAME, type: invariant, property: p, method: z3, prove: "zz > 0"}
  - {id: NOBOUND, type: invariant, property: p, method: enumerate, prove: "x >= 0"}
  - {id: NOPROVE, type: invariant, property: p, method: z3}
  - {id: B1, type: invariant, property: p, method: enumerate, prove: "x >= 0", bound: {x: [5, 3]}}
  - {id: B2, type: invariant, property: p, method: enumerate, prove: "x >= 0", bound: {x: [200, 300]}}
  - {id: B3, type: invariant, property: p, method: enumerate, prove: "x >= 0", bound: {x: [0, "t and t"]}}
  - {id: B4, type: invariant, property: p, method: enumerate, prove: "x >= 0", bound: {x: [0, "u"], u: [0, 3]}}
  - {id: B5, type: invariant, property: p, method: enumerate, prove: "x >= 0", bound: {q: [0, 3]}}
  - {id: B6, type: invariant, property: p, method: enumerate, prove: "x >= 0", bound: {x: [0, "f * 4294967296"]}}
falsification: []
qa_gate: {id: GATE, requires: []}
"""

BAD_WITH_PLAN = """\
id: bad-plan-v1
version: 1.0.0
family: gemm
summary: bad texts beside plan quantities
kernels:
  gemm: {entry: "native.gemm:check_buffers", plan: "native.gemm:gemm_plan"}
equations: {e: {formula: "x"}}
symbols:
  m: {type: int32, min: 1}
  n: {type: int32, min: 1}
  k: {type: int32, min: 1}
  lda: {type: int32, min: 1}
  ldb: {type: int32, min: 1}
  ldc: {type: int32, min: 1}
  trans_a: {type: bool}
  trans_b: {type: bool}
  elem_size: {type: int32, values: [2, 4]}
  a_bytes: {type: int64, min: 0}
  b_bytes: {type: int64, min: 0}
  c_bytes: {type: int64, min: 0}
obligations:
  - {id: P1, type: invariant, property: p, method: z3, given: "accepts(a_bytes, b_bytes, c_bytes)",
     prove: "k * 4294967296 > 0"}
  - {id: P2, type: invariant, property: p, method: z3, prove: "a_elems >= 0 and trans_a < trans_b"}
  - {id: P3, type: invariant, property: p, method: z3, prove: "no_overflow and not (lda + 1)"}
  - {id: P4, type: invariant, property: p, method: enumerate, prove: "a_elems >= 0",
     bound: {m: [1, 3], n: [1, 3], k: [1, "n + m"], lda: [4, 2], ldb: [1, 4], ldc: [1, 3], a_bytes: 0, b_bytes: 0,
             c_bytes: 0}}
falsification: []
qa_gate: {id: GATE, requires: []}
"""


@pytest.mark.parametrize("text", [BAD_NO_PLAN, BAD_WITH_PLAN], ids=["no-plan", "plan"])
def test_validate_and_check_give_the_same_diagnostics(tmp_path, capsys, text):
    from obligations.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    offline = capsys.readouterr().err.splitlines()[:-1]  # the last line counts the problems
    assert main(["validate", "--import", str(path)]) == 2
    imported = capsys.readouterr().err.splitlines()[:-1]
    assert main(["check", str(path), "--device", "host", "-j", "0"]) == 2
    checked = capsys.readouterr().err.splitlines()
    assert offline == imported == checked and offline


def _diagnostics(tmp_path, text: str) -> list[str]:
    from obligations.contract import validate_paths

    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return [f"{d.line}:{d.col}: {d.message}" for d in validate_paths([path], imports=False)]


def test_validate_without_imports_finds_each_bad_text(tmp_path):
    diags = _diagnostics(tmp_path, BAD_NO_PLAN)
    text = "\n".join(diags)
    for expected in [
        "literal 4294967296 does not fit int32",
        "literal -1 does not fit uint32",
        "'<' orders integers only",
        "expected a condition, got an integer: 'x'",
        "the 'prove' statement is an integer, not a condition",
        "the branches are an integer and a condition",
        "unknown name 'zz'",
        "method enumerate needs a 'bound'",
        "method z3 needs a 'prove' statement",
        "bound [5, 3] of 'x' is empty (lo > hi)",
        "bound [200, 300] of 'x' lies outside its domain [0, 100]",
        "bound of 'x' is a condition, not an integer",
        "bound of 'x' uses 'u', which is not enumerated before it",
        "bound names unknown symbol 'q'",
        "literal 4294967296 does not fit int32",
        "value 4294967296 does not fit int32",
        "value 7 does not fit [0, 5]",
    ]:
        assert expected in text, (expected, diags)
    assert len(diags) == 17, diags
    plan = "\n".join(_diagnostics(tmp_path, BAD_WITH_PLAN))
    for expected in [
        "literal 4294967296 does not fit int32",
        "'<' orders integers only",
        "expected a condition, got an integer: 'lda + 1'",
        "bound [4, 2] of 'lda' is empty (lo > hi)",
    ]:
        assert expected in plan, (expected, plan)


# -- the property: every verdict agrees with brute force --------------------------------------------------

# Symbols of the property: small signed and unsigned ranges, and the ends of the int64/uint64/uint32 ranges.
# (Intervals, not ``values``: Z3 takes seconds over a disjunction of 64-bit constants, milliseconds over bounds.)
INTERVALS = {
    "a": ("int32", -3, 3),
    "b": ("uint32", 0, 3),
    "c": ("int64", -2, 2),
    "d": ("uint64", 2**64 - 2, 2**64 - 1),
    "e": ("int64", -(2**63), -(2**63) + 1),
    "f": ("uint64", 0, 2),
    "g": ("uint32", 2**32 - 2, 2**32 - 1),
    "h": ("int64", 2**63 - 2, 2**63 - 1),
}
DOMAIN = {name: (ty, list(range(lo, hi + 1))) for name, (ty, lo, hi) in INTERVALS.items()}
TYPES = {"int32": (32, True), "int64": (64, True), "uint32": (32, False), "uint64": (64, False)}


class IllTyped(Exception):
    """The statement is rejected by the language (wrong kind, literal that does not fit its type)."""


def _range(ty: str) -> tuple[int, int]:
    bits, signed = TYPES[ty]
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def _promote(x: str, y: str) -> str:
    """C's usual arithmetic conversions over the four types (C11 6.3.1.8)."""
    (bx, sx), (by, sy) = TYPES[x], TYPES[y]
    if x == y:
        return x
    if sx == sy:
        return x if bx >= by else y
    (s_ty, bs), (u_ty, bu) = ((x, bx), (y, by)) if sx else ((y, by), (x, bx))
    return u_ty if bu >= bs else s_ty


def _c_convert(v: int, ty: str) -> int:
    """C's conversion of an in-range value to ``ty``: unsigned types take it modulo 2**bits (C11 6.3.1.3)."""
    bits, signed = TYPES[ty]
    return v if signed else v % (1 << bits)


def _trunc_div(p: int, q: int) -> int:
    r = abs(p) // abs(q)
    return r if (p >= 0) == (q >= 0) else -r


class Oracle:
    """Evaluates a statement at one point in C, with Python ints; ``ok`` is False once an operation wraps.

    Values are ("int", v, type or None for a bare literal) and ("bool", v, depends on a symbol). C's
    semantics: comparisons, min/max, ?: and / % work on the operands converted to their common type. The
    language's one rule beyond C: ``+ - *``, unary minus and casts must give the exact result of their
    operands' values (C's result equals it then); a wrap, a division by zero or a signed overflow makes
    the point a counterexample.
    """

    def __init__(self, point: dict[str, int | bool]):
        self.point, self.ok = point, True

    def fit(self, v: tuple, ty: str) -> tuple:
        if v[2] is not None:
            return v
        lo, hi = _range(ty)
        if not lo <= v[1] <= hi:
            raise IllTyped(f"literal {v[1]} does not fit {ty}")
        return ("int", v[1], ty)

    def both(self, x: tuple, y: tuple) -> tuple[tuple, tuple, str | None]:
        if x[0] != "int" or y[0] != "int":
            raise IllTyped("arithmetic on a condition")
        if x[2] is None and y[2] is None:
            return x, y, None
        x = self.fit(x, y[2]) if x[2] is None else x
        y = self.fit(y, x[2]) if y[2] is None else y
        return x, y, _promote(x[2], y[2])

    def exact(self, value: int, ty: str | None) -> tuple:
        """The result of + - * or a negation: bare literals stay exact (128 bits), typed ones must fit."""
        if ty is None:
            if value.bit_length() > 128:
                raise IllTyped("literal arithmetic past 128 bits")
            return ("int", value, None)
        lo, hi = _range(ty)
        self.ok &= lo <= value <= hi
        return ("int", value, ty)

    def cond(self, node: ast.AST) -> tuple:
        v = self.ev(node)
        if v[0] != "bool":
            raise IllTyped("expected a condition")
        return v

    def ev(self, node: ast.AST) -> tuple:
        if isinstance(node, ast.Constant):
            return ("bool", node.value, False) if isinstance(node.value, bool) else ("int", node.value, None)
        if isinstance(node, ast.Name):
            v = self.point[node.id]
            return ("bool", v, True) if isinstance(v, bool) else ("int", v, DOMAIN[node.id][0])
        if isinstance(node, ast.BoolOp):
            vals = [self.cond(v) for v in node.values]
            value = all(v[1] for v in vals) if isinstance(node.op, ast.And) else any(v[1] for v in vals)
            return ("bool", value, any(v[2] for v in vals))
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                v = self.cond(node.operand)
                return ("bool", not v[1], v[2])
            v = self.ev(node.operand)
            if v[0] != "int":
                raise IllTyped("minus on a condition")
            return self.exact(-v[1], v[2])
        if isinstance(node, ast.BinOp):
            x, y, ty = self.both(self.ev(node.left), self.ev(node.right))
            if isinstance(node.op, ast.FloorDiv | ast.Mod):
                if ty is None:
                    if y[1] == 0:
                        raise IllTyped("literal division by zero")
                    d = _trunc_div(x[1], y[1])
                    return self.exact(d if isinstance(node.op, ast.FloorDiv) else x[1] - y[1] * d, None)
                p, q = _c_convert(x[1], ty), _c_convert(y[1], ty)  # C divides the converted operands
                if q == 0:
                    self.ok = False
                    return ("int", 0, ty)
                d = _trunc_div(p, q)
                r = d if isinstance(node.op, ast.FloorDiv) else p - q * d
                lo, hi = _range(ty)
                self.ok &= lo <= r <= hi  # INT_MIN / -1
                return ("int", r, ty)
            p, q = x[1], y[1]
            r = {ast.Add: p + q, ast.Sub: p - q, ast.Mult: p * q}[type(node.op)]
            return self.exact(r, ty)
        if isinstance(node, ast.Compare):
            (op,), (rhs,) = node.ops, node.comparators
            x, y = self.ev(node.left), self.ev(rhs)
            if x[0] != y[0] or (x[0] == "bool" and not isinstance(op, ast.Eq | ast.NotEq)):
                raise IllTyped("comparison of mixed or unordered kinds")
            symbolic = x[0] == "bool" and (x[2] or y[2])
            p, q = x[1], y[1]
            if x[0] == "int":
                x, y, ty = self.both(x, y)
                symbolic = ty is not None
                if ty is not None:
                    p, q = _c_convert(x[1], ty), _c_convert(y[1], ty)  # -1 < 0u is false
            ops = {ast.Lt: p < q, ast.LtE: p <= q, ast.Gt: p > q, ast.GtE: p >= q, ast.Eq: p == q, ast.NotEq: p != q}
            return ("bool", ops[type(op)], symbolic)
        if isinstance(node, ast.IfExp):
            return self.select(self.cond(node.test), self.ev(node.body), self.ev(node.orelse))
        if isinstance(node, ast.Call):
            name, args = node.func.id, [self.ev(a) for a in node.args]
            if name in TYPES:
                (v,) = args
                if v[0] != "int":
                    raise IllTyped("cast of a condition")
                if v[2] is None:
                    return self.fit(v, name)
                lo, hi = _range(name)
                self.ok &= lo <= v[1] <= hi  # a cast that would change the value is a recorded overflow
                return ("int", v[1], name)
            x, y = args
            if x[0] != "int" or y[0] != "int":
                raise IllTyped("min/max of a condition")
            if x[2] is None and y[2] is None:
                return ("int", (min if name == "min" else max)(x[1], y[1]), None)
            x, y, ty = self.both(x, y)
            p, q = _c_convert(x[1], ty), _c_convert(y[1], ty)
            return ("int", (min if name == "min" else max)(p, q), ty)
        raise AssertionError(f"oracle cannot evaluate {ast.dump(node)}")

    def select(self, test: tuple, x: tuple, y: tuple) -> tuple:
        if x[0] != y[0]:
            raise IllTyped("branches of different kinds")
        if x[0] == "bool":
            return ("bool", x[1] if test[1] else y[1], test[2] or x[2] or y[2])
        if x[2] is None and y[2] is None:
            if not test[2]:
                return x if test[1] else y  # a constant test picks a bare literal
            lo_v, hi_v = min(x[1], y[1]), max(x[1], y[1])
            tys = [t for t in ("int32", "int64", "uint64") if _range(t)[0] <= lo_v and hi_v <= _range(t)[1]]
            if not tys:
                raise IllTyped("literal branches that fit no type")
            return ("int", x[1] if test[1] else y[1], tys[0])
        x, y, ty = self.both(x, y)
        return ("int", _c_convert(x[1] if test[1] else y[1], ty), ty)  # ?: converts both branches


def brute_force(source: str) -> bool:
    """True iff the statement holds, with no wrap anywhere, at every point of the domain of its symbols."""
    tree = ast.parse(source, mode="eval").body
    used = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} & (set(DOMAIN) | {"t", "u"}))
    axes = [[False, True] if n in ("t", "u") else DOMAIN[n][1] for n in used]
    for values in itertools.product(*axes):
        o = Oracle(dict(zip(used, values, strict=True)))
        holds = o.cond(tree)[1]
        if not (holds and o.ok):
            return False
    return True


LITERALS = st.sampled_from(
    [0, 1, 2, 3, -1, -2, 2147483647, -2147483648, 4294967295, 2**62, 2**63 - 1, -(2**63), 2**64 - 1]
)
INT_ATOMS = st.one_of(st.sampled_from(sorted(DOMAIN)), LITERALS.map(str))
BOOL_ATOMS = st.sampled_from(["t", "u", "True", "False"])


def _extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    pair = st.tuples(children, children)
    return st.one_of(
        st.tuples(children, st.sampled_from(["+", "-", "*", "//", "%"]), children).map(
            lambda p: f"({p[0]} {p[1]} {p[2]})"
        ),
        st.tuples(children, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), children).map(
            lambda p: f"({p[0]} {p[1]} {p[2]})"
        ),
        st.tuples(pair, st.sampled_from(["and", "or"])).map(lambda p: f"({p[0][0]} {p[1]} {p[0][1]})"),
        children.map(lambda s: f"(not {s})"),
        children.map(lambda s: f"(-{s})"),
        st.tuples(children, children, children).map(lambda p: f"({p[1]} if {p[0]} else {p[2]})"),
        st.tuples(st.sampled_from(["min", "max"]), pair).map(lambda p: f"{p[0]}({p[1][0]}, {p[1][1]})"),
        st.tuples(st.sampled_from(sorted(TYPES)), children).map(lambda p: f"{p[0]}({p[1]})"),
    )


STATEMENTS = st.recursive(st.one_of(INT_ATOMS, BOOL_ATOMS), _extend, max_leaves=8)
UNKNOWN: list[str] = []  # statements Z3 gave up on (sound, but each one is a statement the property did not test)


def _agrees(contract, source: str) -> None:
    try:
        truth: bool | None = brute_force(source)
    except IllTyped:
        truth = None  # the language must reject it: no engine may prove or exhaust it
    used = {n.id for n in ast.walk(ast.parse(source, mode="eval")) if isinstance(n, ast.Name)}
    bound = {k: [lo, hi] for k, (_, lo, hi) in INTERVALS.items() if k in used}
    # A small rlimit: nonlinear 64-bit products may be 'unknown', which is never a proof (and never wrong).
    for method, extra in (("z3", {"rlimit": 3_000_000}), ("enumerate", {"bound": bound})):
        out = run_item(contract, _item(source, method, **extra))
        status = out.status.value
        if truth is None:  # refused at its column, never an internal error
            assert status == "error" and "Error: col " in out.reason, (method, source, out)
        elif status == "unknown" and method == "z3":
            UNKNOWN.append(source)
        elif truth:
            assert status in ("proved", "exhausted"), (method, source, out)
        else:
            assert status == "violated", (method, source, out)


@pytest.fixture(scope="module")
def prop_contract(tmp_path_factory):
    contract, _ = _contract(tmp_path_factory.mktemp("prop"))
    return contract


@settings(max_examples=250, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(STATEMENTS)
def test_every_verdict_agrees_with_brute_force(prop_contract, source):
    _agrees(prop_contract, source)


@pytest.mark.parametrize(
    "source",
    [
        "a < b",  # int32 meets uint32: a converts
        "(e < d)",
        "(max(e, d) == 18446744073709551615)",
        "(min(a, g) >= 0)",
        "((a if t else b) > 2)",
        "((a // g) >= 0)",
        "((e % g) == 0)",
        "(((h * 2) * 2) > h)",
        "((((e + 1) - 1) * (c * c)) != 0)",
        "(c < f)",
        "(max(c, f) >= c)",
        "(((h // c) * c) == h)",
        "(uint64(e) > 0)",
        "(int32(d) == 0)",
        "(int64(d) >= 0)",
        "(uint32(a) >= 0)",
        "((-d) == 0)",
        "((a + b) >= 0)",
        "((d - 18446744073709551615) <= 0)",
        "((4611686018427387904 * 4) > 0)",
        "((-1 if t else 18446744073709551615) == 0)",
        "((1 if True else 2) + 4294967295 > 0)",
        "(b > -1)",
    ],
)
def test_mixed_sign_and_limit_cases_agree_with_brute_force(prop_contract, source):
    _agrees(prop_contract, source)
