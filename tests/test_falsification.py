"""The falsification engine: strategies, agreement kinds (conformance), runner shrinking/replay, sweeps."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings

from falsification import float32_inputs as fs
from falsification import sweep as sweep_module
from falsification.agreement import AGREEMENTS, NAN_MISMATCH, Expected, make_agreement, ulp_distance
from falsification.registry import FalsifyContext, registered_tests
from falsification.runner import NativeResult, Subject, falsify, find_item, replay
from falsification.sweep import resolve_format, round_to_format, sweep
from obligations.core.device import cuda_available
from spec import softfloat as sf
from spec.elementwise import Reference

U32 = np.uint32


def _u(*vals: int) -> np.ndarray:
    return np.array(vals, dtype=U32)


def _ctx(item: dict, seed: int = 3, profile: str = "quick") -> FalsifyContext:
    return FalsifyContext(
        device="host", profile=profile, seed=seed, item={"id": "t", **item}, contract_path="contracts/x.yaml"
    )


# -- strategies -----------------------------------------------------------------------------------


def test_special_table_has_every_required_encoding():
    s = set(fs.SPECIAL_BITS)
    is_nan = lambda b: (b & 0x7F800000) == 0x7F800000 and b & 0x7FFFFF  # noqa: E731
    assert {0x0, 0x80000000, 0x7F800000, 0xFF800000} <= s
    assert any(is_nan(b) and not b & 0x400000 for b in s), "a signaling NaN"
    assert any(is_nan(b) and b & 0x3FFFFF for b in s), "a NaN with a payload"
    assert any(is_nan(b) and b >> 31 for b in s), "a negative NaN"
    assert {0x00000001, 0x007FFFFF, 0x80000001, 0x807FFFFF} <= s, "subnormals at both ends, both signs"
    assert {0x00800000, 0x00800001, 0x007FFFFF} <= s, "neighbours of 2^-126"
    assert {0x7F7FFFFF, 0x7F7FFFFE, 0xFF7FFFFF} <= s, "near overflow"
    assert {0x3F800000, 0x33800000} <= s, "1 and 2^-24: an exact addition tie"


@settings(max_examples=300, database=None)
@given(fs.float32_bits())
def test_float32_bits_are_32_bit_patterns(b):
    assert 0 <= b <= 0xFFFFFFFF


def test_float32_bits_reach_subnormals_and_signaling_nans_often():
    seen = []

    @settings(max_examples=400, database=None, derandomize=True)
    @given(fs.float32_bits())
    def draw(b):
        seen.append(b)

    draw()
    a = np.array(seen, dtype=np.uint64)
    sub = ((a & 0x7F800000) == 0) & ((a & 0x7FFFFF) != 0)
    snan = ((a & 0x7FC00000) == 0x7F800000) & ((a & 0x3FFFFF) != 0)
    assert sub.mean() > 0.05 and snan.sum() >= 3


def test_generate_bits_is_deterministic_and_rich():
    spec = fs.BatchSpec(seed=11, size=1 << 16)
    a = fs.generate_bits(spec, 3)
    b = fs.generate_bits(spec, 3)
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    c = fs.generate_bits(fs.BatchSpec(seed=12, size=1 << 16), 3)
    assert not (a[0] == c[0]).all()
    x = a[0]
    sub = ((x & 0x7F800000) == 0) & ((x & 0x7FFFFF) != 0)
    assert 0.05 < sub.mean() < 0.5
    assert (((x & 0x7FC00000) == 0x7F800000) & ((x & 0x3FFFFF) != 0)).any(), "signaling NaNs"


def test_correlated_mix_makes_exact_addition_ties():
    a, b = fs.generate_bits(fs.BatchSpec(seed=5, size=1 << 14, mix="correlated"), 2)
    with np.errstate(all="ignore"):
        fa, fb = a.view(np.float32).astype(np.float64), b.view(np.float32).astype(np.float64)
        exact = fa + fb
        r = exact.astype(np.float32).astype(np.float64)
        other = np.nextafter(exact.astype(np.float32), np.where(r < exact, np.inf, -np.inf).astype(np.float32))
        tie = np.isfinite(exact) & (r != exact) & (np.abs(exact - r) == np.abs(other.astype(np.float64) - exact))
    assert tie.sum() > 100


def test_explicit_elements_land_at_their_positions():
    spec = fs.BatchSpec(seed=1, size=10, explicit=((3, (0x7F800001, 0x1)), (17, (0x80000000, 0x2))))
    a, b = fs.generate_bits(spec, 2)
    assert (a[3], b[3], a[7], b[7]) == (0x7F800001, 0x1, 0x80000000, 0x2)


@pytest.mark.parametrize("layout", fs.LAYOUTS)
def test_layouts_keep_logical_values(layout):
    ops = fs.generate_bits(fs.BatchSpec(seed=2, size=30), 2)
    views = fs.layout_arrays(ops, layout)
    flat = [np.ascontiguousarray(v).reshape(-1) for v in np.broadcast_arrays(*views)]
    if layout == "broadcast":
        assert views[1].shape[0] == 1 and flat[0].size == 30
        assert (flat[1].reshape(views[0].shape) == np.broadcast_to(views[1], views[0].shape)).all()
    else:
        assert (flat[0] == ops[0]).all() and (flat[1] == ops[1]).all()
    if layout in ("strided", "transposed"):
        assert not views[0].flags.c_contiguous


@settings(max_examples=50, database=None)
@given(fs.shapes(max_size=4096))
def test_shapes_respect_the_size_bound(shape):
    assert int(np.prod(shape)) <= 4096 or len(shape) > 1


# -- agreement kinds: one conformance case per registered kind ------------------------------------

_CASES = {
    "bitwise": ({}, _u(1, 2, 3), _u(1, 2, 3), _u(1, 5, 3)),
    "max_ulp": (
        {"bound": 1},
        _u(0x3F800000, 0x3F800001),
        _u(0x3F800001, 0x3F800000),
        _u(0x3F800003, 0x3F800000),
    ),
    "error_bound": (
        {"bound": lambda x, ref: np.abs(ref) * 1e-3},
        _u(0x3F800000, 0x40000000),
        _u(0x3F800001, 0x40000000),
        _u(0x3F900000, 0x40000000),
    ),
    "determinism": ({"runs": 2}, _u(7, 0x7FC12345), _u(7, 0x7FC12345), _u(7, 0x7FC00000)),
}


def test_every_agreement_kind_has_a_conformance_case():
    assert set(AGREEMENTS) == set(_CASES)


@pytest.mark.parametrize("kind", sorted(_CASES))
def test_agreement_conformance(kind):
    params, ref, good, bad = _CASES[kind]
    ag = make_agreement(kind, **params)
    ok = ag.compare(good, ref, [ref])
    assert not ok.bad.any(), kind
    nok = ag.compare(bad, ref, [ref])
    assert list(np.flatnonzero(nok.bad)) == [int(np.flatnonzero(bad != good)[0])], kind
    assert nok.summary["kind"] == kind and nok.summary["disagreements"] == 1
    assert ag.describe()["kind"] == kind


def test_unknown_agreement_kind_lists_known():
    with pytest.raises(KeyError, match="bitwise"):
        make_agreement("nope")


def test_bitwise_nan_policy():
    ref, nat = _u(0x7FC00000), _u(0x7FFFFFFF)
    assert make_agreement("bitwise").compare(nat, ref).bad.all()
    assert not make_agreement("bitwise", nan_policy="class").compare(nat, ref).bad.any()
    assert make_agreement("bitwise", nan_policy="class").compare(_u(0), ref).bad.all()


def test_max_ulp_alt_reference_and_nan():
    ag = make_agreement("max_ulp", bound=0)
    assert not ag.compare(_u(0x3F800001), Expected(bits=_u(0x3F800000), alt=_u(0x3F800001))).bad.any()
    c = ag.compare(_u(0x3F800000), _u(0x7FFFFFFF))
    assert c.bad.all() and int(c.distance[0]) == NAN_MISMATCH
    assert int(ulp_distance(_u(0x80000000), _u(0x00000000))[0]) == 0
    assert int(ulp_distance(_u(0x00000001), _u(0x80000001))[0]) == 2


# -- runner ---------------------------------------------------------------------------------------


def _add_subject(bug: bool) -> Subject:
    """sf.add as 'native'; with ``bug``, any subnormal first operand is flushed first (an FTZ bug)."""

    def native(views, scalars):
        flat = [np.ascontiguousarray(v).reshape(-1) for v in np.broadcast_arrays(*views)]
        a = flat[0]
        if bug:
            sub = ((a & 0x7F800000) == 0) & ((a & 0x7FFFFF) != 0)
            a = np.where(sub, a & U32(0x80000000), a).astype(U32)
        return NativeResult([sf.add(a, flat[1], env="cuda")])

    def reference(flat, scalars):
        return [Reference(sf.add(flat[0], flat[1], env="cuda"))]

    return Subject("toy-add", 2, native, reference, operand_names=("a", "b"), layouts=fs.LAYOUTS)


def test_runner_passes_a_correct_subject_and_records_seed():
    out = falsify(_ctx({"test": "x"}, seed=9), _add_subject(False), make_agreement("bitwise"))
    assert out.status.value == "passed", out.reason
    assert out.evidence["seed"] == 9 and out.evidence["elements"] > 10_000 and out.evidence["cases"] > 10_000


def test_runner_shrinks_to_one_minimal_element():
    out = falsify(_ctx({"test": "x"}), _add_subject(True), make_agreement("bitwise"))
    assert out.status.value == "violated"
    ce = out.counterexample
    assert ce["kind"] == "element" and ce["size"] == 1
    a = int(ce["element"]["operands"]["a"], 16)
    b = int(ce["element"]["operands"]["b"], 16)
    assert a == 0x00000001, ce  # the simplest subnormal
    assert bin(b & 0x7FFFFFFF).count("1") <= 1, ce
    assert ce["replay"].startswith("kc replay contracts/x.yaml t --bits 0x00000001,")
    assert ce["element"]["outputs"]["r"]["ulp_distance"] != 0


def test_runner_is_deterministic_for_a_seed():
    a = falsify(_ctx({"test": "x"}, seed=4), _add_subject(True), make_agreement("bitwise"))
    b = falsify(_ctx({"test": "x"}, seed=4), _add_subject(True), make_agreement("bitwise"))
    assert a.counterexample == b.counterexample


def test_find_item_and_replay_through_the_registry():
    contract = {
        "falsification": [
            {
                "id": "relu-nan",
                "test": "elementwise.bitwise",
                "params": {"op": "relu", "variant": "nan_as_number"},
            }
        ]
    }
    item = find_item(contract, "relu-nan")
    assert item is not None and find_item(contract, "nope") is None
    bad = replay(item, bits=["0x7FC00000"], device="host", contract_path="c.yaml")
    assert bad.status.value == "violated" and bad.counterexample["element"]["outputs"]["r"]["native"] == "0x00000000"
    good = replay(item, bits=["0x3F800000"], device="host")
    assert good.status.value == "passed"


def test_registered_test_names():
    names = set(registered_tests())
    assert {
        "elementwise.bitwise",
        "elementwise.max_ulp",
        "elementwise.fma_contraction",
        "elementwise.backward_fd",
        "elementwise.determinism",
        "elementwise.grid_coverage",
    } <= names


# -- sweeps ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "sqrt"])
def test_small_format_sweep_is_exhaustive_and_clean(op):
    r = sweep(op, fmt="e4m3")
    assert r["exhaustive"] and r["disagreements"] == 0 and r["elements"] in (1 << 8, 1 << 16)


def test_round_to_format_matches_numpy_float16():
    x = np.random.default_rng(0).standard_normal(100_000) * np.exp2(np.random.default_rng(1).integers(-30, 20, 100_000))
    mine = round_to_format(x, resolve_format("binary16"))
    with np.errstate(over="ignore"):
        assert (mine == x.astype(np.float16).view(np.uint16)).all()


def test_host_sweep_finds_a_planted_bug_and_reports_counterexamples():
    r = sweep("relu", device="host", lo=0x7F800000, hi=0x7F800000 + 4096, variant="nan_as_number")
    assert r["disagreements"] == 4095 and r["first_counterexamples"][0]["input"] == "0x7F800001"
    clean = sweep("sqrt", device="host", lo=0, hi=1 << 18)
    assert clean["disagreements"] == 0 and clean["max_ulp"] == 0


def _compare_cases(xp, rng):
    special = np.array(
        [
            0,
            0x80000000,
            1,
            0x80000001,
            0x007FFFFF,
            0x00800000,
            0x7F7FFFFF,
            0xFF7FFFFF,
            0x7F800000,
            0xFF800000,
            0x7F800001,
            0x7FC00000,
            0xFFFFFFFF,
            0x3F800000,
            0x3F800001,
            0x3F800003,
            0x3F800004,
            0xBF800002,
        ],
        dtype=np.uint32,
    )
    a, b = np.meshgrid(special, special)
    rand = rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    near = (rand.astype(np.int64) + rng.integers(-5, 6, rand.size)).astype(np.uint32)  # wraps: far pairs too
    nat, ref = np.concatenate([a.ravel(), rand]), np.concatenate([b.ravel(), near])
    alt = np.roll(ref, 1)
    return xp.asarray(nat), xp.asarray(ref), xp.asarray(alt)


def test_chunk_comparison_counts_histogram_max_and_disagreements():
    nat = np.array([0x3F800000, 0x3F800001, 0x3F800003, 0x7FC00000, 0x7FC00000, 0x80000000, 0x3F800010], np.uint32)
    ref = np.array([0x3F800000, 0x3F800000, 0x3F800000, 0x7FC00001, 0x3F800000, 0x00000000, 0x3F800000], np.uint32)
    hist, max_ulp, bad = sweep_module.compare_chunk(nat, ref, None, 0, exact=True)
    # distances 0, 1, 3, 0 (two NaNs), NaN-vs-number, 0 (-0 vs +0), 16; bitwise, only row 0 agrees
    assert hist.tolist() == [3, 1, 0, 1, 2] and max_ulp == 16 and bad == 6
    assert sweep_module.compare_chunk(nat, ref, None, 3, exact=False)[2] == 2  # the NaN mismatch and 16 ulp
    alt = nat.copy()
    assert sweep_module.compare_chunk(nat, ref, alt, 0, exact=True)[2] == 0  # every native matches its alt


@pytest.mark.cuda
def test_fused_cuda_comparison_agrees_with_the_array_ops():
    ok, why = cuda_available()
    if not ok:
        pytest.skip(why)
    import cupy

    rng = np.random.default_rng(5)
    nat, ref, alt = _compare_cases(cupy, rng)
    for a, bound, exact in [
        (None, 0, True),
        (None, 0, False),
        (None, 2, False),
        (alt, 0, True),
        (alt, 0, False),
        (alt, 3, False),
    ]:
        want = sweep_module.compare_chunk(nat, ref, a, bound, exact=exact)
        got = sweep_module.compare_chunk_fused(nat, ref, a, bound, exact=exact)
        assert got[0].tolist() == want[0].tolist() and got[1:] == want[1:], (bound, exact, a is None, got, want)
        assert want[2] > 0
    r = sweep("relu", device="cuda", lo=0x7F800000, hi=0x7F800000 + 4096, variant="nan_as_number")
    # The sweep agrees whichever comparison route the provider took on this GPU (an H100 took the fused
    # comparison kernel, an H200 the reference-and-comparison kernel); the message says which.
    route = r["comparison"]
    assert route in ("one fused CUDA kernel per chunk", "reference and comparison in one CUDA kernel per chunk"), route
    assert r["disagreements"] == 4095 and r["first_counterexamples"][0]["input"] == "0x7F800001", route
    for reference in ("softfloat", "float64"):  # an approx op is float64-defined either way: one kernel
        r = sweep("exp", device="cuda", lo=0x3F000000, hi=0x3F100000, reference=reference, bound=2)
        assert "one-kernel CUDA form" in r["reference"] and r["disagreements"] == 0, r


def _approx_patterns():
    rng = np.random.default_rng(11)
    special = [
        0,
        0x80000000,
        1,
        0x80000001,
        0x007FFFFF,
        0x807FFFFF,
        0x00800000,
        0x7F7FFFFF,
        0xFF7FFFFF,
        0x7F800000,
        0xFF800000,
        0x7F800001,
        0x7FC00000,
        0xFFFFFFFF,
        0x3F800000,
        0xBF800000,
    ]
    dense = [
        np.arange(c - (1 << 20), c + (1 << 20), dtype=np.int64)
        for c in (0x3F800000, 0x42B00000, 0xC2B00000, 0x00800000, 0x80800000, 0x3D000000)
    ]
    return np.concatenate([np.array(special, np.int64), *dense, rng.integers(0, 2**32, 1 << 22)]).astype(np.uint32)


def _fused_mismatches(name, bits, env):
    import cupy

    from native.fused_reference import fused_approx_reference
    from spec.elementwise import get_reference

    x = cupy.asarray(bits)
    want, got = get_reference(name).evaluate(x, env=env), fused_approx_reference(name, x, env)
    return {
        kind: [hex(int(bits[int(i)])) for i in cupy.flatnonzero(g != w)[:5].get()]
        for kind, g, w in (("ref", got.bits, want.bits), ("alt", got.alt, want.alt))
    }


@pytest.mark.cuda
@pytest.mark.parametrize("env", ["cuda", "cuda-ftz"])
def test_fused_approx_references_equal_the_array_form_bit_for_bit(env):
    ok, why = cuda_available()
    if not ok:
        pytest.skip(why)
    from native.fused_reference import APPROX_FORMULAS

    bits = _approx_patterns()
    for name in APPROX_FORMULAS:
        assert _fused_mismatches(name, bits, env) == {"ref": [], "alt": []}, (name, env)


@pytest.mark.cuda
def test_a_fused_reference_with_a_planted_formula_change_is_caught(monkeypatch):
    ok, why = cuda_available()
    if not ok:
        pytest.skip(why)
    from native import fused_reference

    monkeypatch.setitem(fused_reference.APPROX_FORMULAS, "exp", "exp(x) * (1.0 + 1e-12)")  # a few ulp of double
    fused_reference._kernel.cache_clear()
    try:
        found = _fused_mismatches("exp", _approx_patterns(), "cuda")
        assert found["ref"] or found["alt"], found  # roundings near midpoints move
    finally:
        fused_reference._kernel.cache_clear()


def test_host_sweep_defaults_to_a_sample():
    r = sweep("neg", device="host", sample=1 << 16)
    assert not r["exhaustive"] and r["elements"] == 1 << 16 and r["disagreements"] == 0


def test_nan_bits_strategy_kinds():
    @settings(max_examples=60, database=None)
    @given(fs.nan_bits(signaling=True), fs.nan_bits(signaling=False))
    def check(s, q):
        assert (s & 0x7FC00000) == 0x7F800000 and s & 0x3FFFFF
        assert (q & 0x7FC00000) == 0x7FC00000

    check()


def test_flush_free_conversions_match_numpy_everywhere():
    from spec.elementwise import bits_to_f64, f64_to_f32_bits, round_f64_to_f32

    u = fs.generate_bits(fs.BatchSpec(seed=8, size=1 << 16, mix="subnormal"), 1)[0]
    with np.errstate(all="ignore"):
        want = u.view(np.float32).astype(np.float64)
        got = bits_to_f64(u)
        assert ((got == want) | (np.isnan(got) & np.isnan(want))).all()
        r = want * 1.000000123 + 1e-46
        ok = f64_to_f32_bits(r) == r.astype(np.float32).view(np.uint32)
        assert (ok | np.isnan(r)).all()
    ref, alt = round_f64_to_f32(np.array([1 + 2.0**-24, 1 + 2.0**-24 + 2.0**-60, 1.5]))
    assert ref.tolist() == [0x3F800000, 0x3F800000, 0x3FC00000]
    # float64 lands on or next to a binary32 midpoint: the true value may lie on either side
    assert alt.tolist() == [0x3F800001, 0x3F800001, 0x3FC00000]


def test_guarded_maps_expected_non_findings_to_outcomes():
    from falsification.registry import guarded
    from obligations.core.device import DeviceUnavailable
    from obligations.core.results import passed

    class Unsupported(Exception):
        pass

    def raising(exc):
        @guarded(skip=(Unsupported,))
        def test(ctx):
            """Doc kept."""
            if exc is None:
                return passed(cases=1)
            raise exc

        return test

    ctx = FalsifyContext("host", "quick", 0, {"id": "X", "test": "demo.test", "params": {}})
    assert raising(None)(ctx).status.value == "passed" and raising(None).__doc__ == "Doc kept."
    assert raising(Unsupported("route absent"))(ctx).status.value == "skipped"
    out = raising(DeviceUnavailable("no GPU"))(ctx)
    assert out.status.value == "error" and "device unavailable" in out.reason
    out = raising(KeyError("op"))(ctx)
    assert out.status.value == "error" and "bad params for demo.test" in out.reason
    with pytest.raises(ZeroDivisionError):  # a bug stays a bug
        raising(ZeroDivisionError())(ctx)


def test_a_write_past_the_end_stops_every_further_launch():
    """Memory safety first: after a kernel writes its guard cell, the engine launches it no more (GPU faults)."""
    calls = []

    def native(views, scalars):
        a = np.ascontiguousarray(views[0]).reshape(-1)
        calls.append(a.size)
        return NativeResult([a.copy()], guard_ok=a.size < 2)

    subject = Subject("oob", 1, native, lambda flat, scalars: [Reference(flat[0].copy())])
    out = falsify(_ctx({"test": "x"}), subject, make_agreement("bitwise"))
    assert out.status.value == "violated" and out.counterexample["kind"] == "out_of_bounds_write"
    assert len(calls) == 1, calls


def test_seeded_find_draws_do_not_depend_on_the_modules_the_process_imported(tmp_path, monkeypatch):
    """Hypothesis mixes literals of every loaded local module into its draws; ``seeded_find`` (the IR items'
    search) must not: a worker that ran other items first would draw other cases (a verdict that depends on
    the run's order)."""
    import importlib

    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import strategies as st
    from hypothesis.errors import NoSuchExample

    from falsification.engine import seeded_find

    quick = settings(max_examples=200, phases=[Phase.generate], database=None, suppress_health_check=list(HealthCheck))

    def draws() -> list[int]:
        seen: list[int] = []
        with pytest.raises(NoSuchExample):
            seeded_find(st.integers(), lambda x: seen.append(x) or False, quick, 0)
        return seen

    before = draws()
    (tmp_path / "kc_mined_constants.py").write_text("A = 987654321\nB = -424242\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("kc_mined_constants")
    try:
        assert draws() == before and 987654321 not in before
    finally:
        sys.modules.pop("kc_mined_constants", None)
