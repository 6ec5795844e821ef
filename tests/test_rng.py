"""RNG family: spec vectors, the contract on the host, planted bugs caught by their items, CUDA."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from falsification.rng_tests import chi_square_sf, uniformity_statistics
from native import rng
from obligations.check import check_contract
from spec import rng as spec
from spec import softfloat as sf
from tests.contract_helpers import check_items, contract_variant, needs_cuda

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "contracts" / "rng-splitmix64-v1.yaml"


def _variant(tmp_path: Path, old: str, new: str) -> Path:
    return contract_variant(CONTRACT, tmp_path, old, new, 1)


def _items(path: Path, ids: list[str], device: str = "host") -> dict[str, dict]:
    return check_items(path, ids, device)


# -- spec -----------------------------------------------------------------------------------------------


def test_splitmix64_matches_the_published_first_outputs():
    # Vigna's splitmix64.c from state 0: next() returns splitmix64(0), splitmix64(golden), ...
    assert spec.splitmix64(0) == 0xE220A8397B1DCDAF
    assert spec.splitmix64(spec.GOLDEN) == 0x6E789E6AA1B965F4
    assert rng.stream_key(0, 0) == spec.splitmix64(0)


def test_key_depends_on_seed_plus_counter_only():
    # Documented property of the design (docs/rng.md): adjacent (seed, counter) pairs alias.
    assert spec.key(5, 8) == spec.key(6, 7) == spec.key(13, 0)
    assert spec.key(2**64 - 1, 1) == spec.key(0, 0)  # seed + counter wraps modulo 2^64


def test_uniform_map_is_exact_and_below_one():
    assert spec.uniform_bits(0) == 0 and spec.uniform_bits(255) == 0
    assert spec.uniform_bits(256) == 0x33800000  # 2^-24
    assert spec.uniform_bits(2**32 - 1) == 0x3F7FFFFF  # 1 - 2^-24
    u = np.arange(2**32 - 2**16, 2**32, dtype=np.uint64).astype(np.uint32)
    f = rng.uniform_map(u, device="host").view(np.float32)
    assert f.max() == np.float32(1 - 2**-24) and (f < 1).all()


def test_design_uniform_returns_exactly_one_from_4294967168():
    assert spec.design_uniform_bits(spec.DESIGN_ONE_THRESHOLD - 1) == 0x3F7FFFFF
    assert spec.design_uniform_bits(spec.DESIGN_ONE_THRESHOLD) == spec.ONE_BITS  # the tie rounds to even: 1.0
    u = np.array([spec.DESIGN_ONE_THRESHOLD - 1, spec.DESIGN_ONE_THRESHOLD, 2**32 - 1], dtype=np.uint32)
    got = rng.uniform_map(u, device="host", variant="uniform_design")
    assert [int(v) for v in got] == [0x3F7FFFFF, spec.ONE_BITS, spec.ONE_BITS]
    # ...so keep_prob = 1 > uniform fails there: the design's mask drops an element the pure spec keeps.
    assert not (np.float32(1.0) > got.view(np.float32)[1])


def test_host_paths_equal_the_spec_on_a_wrapping_stream():
    seed, counter, n = 2**64 - 3, 1, 300  # seed + counter wraps; key + i wraps for some seeds
    words = spec.draw_words(seed, counter, n, 1)  # one word per element: offsets i
    assert (rng.generate("bits", (3, 100), seed, counter) == words[:, 0].reshape(3, 100)).all()
    np.testing.assert_array_equal(rng.generate("uniform", n, seed, counter), spec.uniform_reference(words[:, 0]))
    ref = spec.normal_reference(*spec.draw_words(seed, counter, n, 2).T)  # offsets 2i, 2i + 1
    if ref is not None:
        d = np.asarray(sf.ulp_distance(rng.generate("normal", n, seed, counter), ref.bits, sf.BINARY32))
        assert d.max() <= 1


def test_mask_keep_prob_one_keeps_everything_and_dropout_scales():
    assert rng.bernoulli_mask((64, 64), 1.0, seed=7, device="host").all()
    x = np.ones(4096, np.float32)
    y = rng.dropout(x, 0.5, seed=7, device="host")
    assert set(np.unique(y).tolist()) <= {0.0, 2.0}
    with pytest.raises(ValueError):
        rng.bernoulli_mask(4, 0.0, seed=0, device="host")


def test_normal_reference_bound_holds_at_the_extremes_of_r1_and_r2():
    r = np.array([0, 1, 2**31, 2**32 - 2, 2**32 - 1], dtype=np.uint32)
    r1, r2 = np.repeat(r, r.size), np.tile(r, r.size)
    ref = spec.normal_reference(r1, r2)
    if ref is None:
        pytest.skip("no extended-precision long double on this host")
    u1 = (r1.astype(np.float64) + 1.0) / spec.DIVISOR_U1
    t = spec.TWO_PI * (r2.astype(np.float64) * 2.0**-32)
    host = (np.sqrt(-2.0 * np.log(u1)) * np.cos(t)).astype(np.float32).view(np.uint32)
    assert np.asarray(sf.ulp_distance(host, ref.bits, sf.BINARY32)).max() <= 1


# -- statistics helpers can fail ---------------------------------------------------------------------------


def test_chi_square_survival_function():
    for x in (0.5, 2.0, 10.0):
        assert math.isclose(chi_square_sf(x, 2), math.exp(-x / 2), rel_tol=1e-12)
    assert math.isclose(chi_square_sf(255.0, 255), 0.4880, abs_tol=2e-3)


def test_statistics_reject_biased_and_correlated_streams():
    g = np.random.default_rng(0)
    u = g.random(1 << 18).astype(np.float32)
    z = g.standard_normal(1 << 18).astype(np.float32)
    w = g.integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    good = uniformity_statistics(u, g.random(1 << 18).astype(np.float32), w, z)
    assert min(r["p"] for r in good.values()) > 1e-7
    bad = uniformity_statistics(u**1.1, u, w & np.uint32(0xFFFFFFFE), z * 1.02)
    for name in ("uniform_256_bins", "adjacent_counter_pairs_16x16", "raw_low_byte", "normal_58_bins"):
        assert bad[name]["p"] < 1e-7, (name, bad[name])


# -- the contract on the host ------------------------------------------------------------------------------


def test_shipped_contract_on_the_host():
    entry = check_contract(CONTRACT, device="host")
    items = {it["id"]: it for it in entry["items"]}
    want = {"z3": "proved", "enumerate": "exhausted", "falsify": "passed", "regimes": "proved", "audit": "passed"}
    for iid, it in items.items():
        if iid == "FALSIFY-RNG-008" or it["method"] == "sanitize":
            assert it["status"] == "skipped" and "cuda" in it["reason"]
        else:
            assert it["status"] == want[it["method"]], (iid, it["reason"])
    assert items["RNG-UNIFORM-LT1-enum"]["evidence"]["points_in_given"] == 2**20
    stats = items["FALSIFY-RNG-007"]["evidence"]
    assert stats["alpha"] == 1e-6 and stats["statistics"] == 10 and stats["per_test_threshold"] == 1e-7


def test_index_off_by_one_in_the_kernel_is_caught_with_the_smallest_call(tmp_path):
    path = _variant(tmp_path, "params: {output: bits}", "params: {output: bits, variant: index_off_by_one}")
    it = _items(path, ["FALSIFY-RNG-001"])["FALSIFY-RNG-001"]
    assert it["status"] == "violated", it["reason"]
    cex = it["counterexample"]
    assert cex["case"]["shape"] == [1] and cex["case"]["seed"] == 0 and cex["case"]["counter"] == 0
    assert cex["element"]["index"] == 0
    out = cex["element"]["outputs"]["r"]
    assert int(out["reference"], 16) == spec.splitmix64(spec.key(0, 0)) & 0xFFFFFFFF
    assert int(out["native"], 16) == spec.splitmix64(spec.key(0, 0) + 1) & 0xFFFFFFFF
    assert cex["replay"].startswith(f"kc replay {path} FALSIFY-RNG-001 --bits ")


def test_index_off_by_one_in_the_plan_is_caught_by_z3(tmp_path):
    path = _variant(tmp_path, "plan: native.rng:rng_plan", "plan: tests.planted.rng_bugs:plan_index_off_by_one")
    it = _items(path, ["RNG-INDEX-z3"])["RNG-INDEX-z3"]
    assert it["status"] == "violated" and it["counterexample"]["refutes"]
    s = it["counterexample"]["symbols"]
    assert s["i"] == s["n_elems"] - 1 and s["j"] == s["draws"] - 1  # the last word reads one past the call


def test_int32_offset_plan_overflows_below_2_to_the_40(tmp_path):
    path = _variant(tmp_path, "plan: native.rng:rng_plan", "plan: tests.planted.rng_bugs:plan_int32_offset")
    it = _items(path, ["RNG-INDEX-z3"])["RNG-INDEX-z3"]
    assert it["status"] == "violated"
    assert any("int32" in c and "rng_bugs.py" in c for c in it["counterexample"]["failed_conditions"])


def test_design_uniform_is_refuted_at_the_smallest_word(tmp_path):
    path = _variant(tmp_path, "plan: native.rng:uniform_map_plan", "plan: native.rng:design_uniform_map_plan")
    items = _items(path, ["RNG-UNIFORM-LT1-enum", "RNG-UNIFORM-LT1-z3"])
    enum = items["RNG-UNIFORM-LT1-enum"]
    assert enum["status"] == "violated"
    assert enum["counterexample"]["symbols"] == {"u": spec.DESIGN_ONE_THRESHOLD}  # enumeration runs upwards
    assert enum["counterexample"]["quantities"]["uniform_bits"] == spec.ONE_BITS
    assert enum["evidence"]["failing_points"] == 128
    z = items["RNG-UNIFORM-LT1-z3"]
    assert z["status"] == "violated" and z["counterexample"]["symbols"]["u"] >= spec.DESIGN_ONE_THRESHOLD


def test_design_kernel_is_caught_by_the_uniform_map_model_item(tmp_path):
    path = _variant(
        tmp_path, "test: rng.uniform_map_model", "test: rng.uniform_map_model\n    params: {variant: uniform_design}"
    )
    it = _items(path, ["FALSIFY-RNG-006"])["FALSIFY-RNG-006"]
    assert it["status"] == "violated", it["reason"]
    # The design model describes the design kernel exactly: that pair agrees.
    path = _variant(
        tmp_path,
        "test: rng.uniform_map_model",
        "test: rng.uniform_map_model\n    params: {variant: uniform_design, model: design}",
    )
    assert _items(path, ["FALSIFY-RNG-006"])["FALSIFY-RNG-006"]["status"] == "passed"


# -- CUDA ------------------------------------------------------------------------------------------------


@pytest.mark.cuda
@needs_cuda
def test_cuda_contract_passes_and_prints_figures():
    entry = check_contract(CONTRACT, device="cuda", profile="full")
    items = {it["id"]: it for it in entry["items"]}
    bad = {i: it["reason"] for i, it in items.items() if it["status"] not in ("proved", "exhausted", "passed")}
    assert not bad, bad
    print("\nRNG cross-device:", items["FALSIFY-RNG-008"]["evidence"]["per_output"])
    print("RNG smallest p:", items["FALSIFY-RNG-007"]["evidence"]["smallest_p"])


@pytest.mark.cuda
@needs_cuda
def test_cuda_planted_bugs_are_caught(tmp_path):
    path = _variant(tmp_path, "params: {output: bits}", "params: {output: bits, variant: index_off_by_one}")
    assert _items(path, ["FALSIFY-RNG-001"], "cuda")["FALSIFY-RNG-001"]["status"] == "violated"
    path = _variant(
        tmp_path, "test: rng.uniform_map_model", "test: rng.uniform_map_model\n    params: {variant: uniform_design}"
    )
    assert _items(path, ["FALSIFY-RNG-006"], "cuda")["FALSIFY-RNG-006"]["status"] == "violated"
    import cupy

    u = cupy.asarray(np.array([spec.DESIGN_ONE_THRESHOLD], dtype=np.uint32))
    assert int(rng.uniform_map(u, device="cuda", variant="uniform_design").get()[0]) == spec.ONE_BITS
    assert int(rng.uniform_map(u, device="cuda").get()[0]) == 0x3F7FFFFF


def test_initializers_on_host():
    w = rng.xavier_uniform((64, 32), 64, 32, seed=3, device="host")
    b = rng.xavier_bound(64, 32)
    assert b == np.float32(0.25) and float(np.abs(w).max()) <= b  # one rounding of b s, |s| <= 1: inside [-b, b]
    assert rng.fill(3, 0.0, device="host").view(np.uint32).tolist() == [0, 0, 0]
    nan = np.array([0xFFC12345, 0x00000001], np.uint32).view(np.float32)
    assert rng.payload(nan, device="host").view(np.uint32).tolist() == [0xFFC12345, 0x00000001]
    with pytest.raises(TypeError):
        rng.payload(np.zeros(2), device="host")


def test_kaiming_without_its_relu_gain_is_caught(monkeypatch):
    """Planted: gain 1 instead of sqrt(2): the variance is half the formula's, refuted by RNG-INIT-moments."""
    monkeypatch.setattr(rng, "kaiming_bound", lambda fan_in, gain=1.0: np.float32(gain * np.sqrt(3.0 / fan_in)))
    it = _items(CONTRACT, ["RNG-INIT-moments"])["RNG-INIT-moments"]
    assert it["status"] == "violated", it["reason"]


@pytest.mark.cuda
@needs_cuda
def test_initializer_kernels_are_bitwise_the_host_path():
    vals = np.array([0xFFC12345, 0x00000001, 0x80000000, 0x7F800000], np.uint32).view(np.float32)
    calls = {
        "zeros": lambda d: rng.fill((5, 7), 0.0, device=d),
        "ones": lambda d: rng.fill(1000, 1.0, device=d),
        "payload": lambda d: rng.payload(vals, device=d),
        "xavier": lambda d: rng.xavier_uniform((300, 7), 300, 7, 11, device=d),
        "kaiming": lambda d: rng.kaiming_uniform(70_000, 5, 11, 2, device=d),
    }
    for name, call in calls.items():
        host = np.asarray(call("host"), np.float32).view(np.uint32)
        dev = np.asarray(call("cuda").get(), np.float32).view(np.uint32)
        np.testing.assert_array_equal(dev, host, err_msg=name)


def test_array_splitmix_and_uniform_equal_the_scalar_definitions():
    # spec.draw_words / uniform_reference run on 32-bit limbs over arrays: the same words as the Python-int
    # splitmix64 and uniform_bits, key + offset wrapping past 2^64 included
    base = 2**64 - 37
    offs = np.arange(0, 90, dtype=np.uint64)
    want = [spec.splitmix64((base + int(o)) & spec.MASK64) & 0xFFFFFFFF for o in offs]
    assert spec.splitmix64_words(base, offs).tolist() == want
    g = np.random.default_rng(3)
    for seed, counter, n, draws in [
        (0, 0, 70, 1),
        (2**64 - 3, 1, 40, 2),
        *[(int(a), int(b), 33, 2) for a, b in g.integers(0, 2**63, (6, 2))],
    ]:
        k = spec.key(seed, counter)
        want = [
            [spec.splitmix64((k + draws * i + j) & spec.MASK64) & 0xFFFFFFFF for j in range(draws)] for i in range(n)
        ]
        assert spec.draw_words(seed, counter, n, draws).tolist() == want
    edges = [0, 1, 255, 256, 257, 511, 512, 2**24, 2**24 - 1, 2**31, 2**32 - 256, 2**32 - 255, 2**32 - 1]
    words = np.concatenate([np.array(edges, np.uint32), g.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)])
    words = np.concatenate([words, (np.arange(24, dtype=np.uint64) << np.uint64(8)).astype(np.uint32)])
    words = np.concatenate(
        [words, ((np.uint64(1) << np.arange(24, dtype=np.uint64)) << np.uint64(8)).astype(np.uint32)]
    )
    assert spec.uniform_reference(words).tolist() == [spec.uniform_bits(int(u)) for u in words]


class _Store:
    """An in-memory store of the run's deterministic host results (the proof cache in a run)."""

    def __init__(self) -> None:
        self.entries: dict[str, list] = {}

    def key(self, parts):  # type: ignore[no-untyped-def]
        return repr(sorted(parts.items()))

    def get(self, key):  # type: ignore[no-untyped-def]
        return self.entries.get(key)

    def put(self, key, values):  # type: ignore[no-untyped-def]
        self.entries[key] = list(values)


def test_uniform_map_model_reuses_the_models_digest_and_still_catches_the_design_kernel(monkeypatch):
    # the model's bits are stored as their digest; a later run whose kernel bits have that digest skips evaluating
    # the model (same evidence), and a kernel whose bits differ evaluates it and is caught as before
    from falsification.registry import FalsifyContext, get_test
    from falsification.rng_tests import uniform_map_model

    store, calls = _Store(), []
    real = rng.uniform_map_plan
    monkeypatch.setattr(rng, "uniform_map_plan", lambda u: calls.append(1) or real(u))
    item = {"id": "FALSIFY-RNG-006", "test": "rng.uniform_map_model"}
    run = lambda params: uniform_map_model(  # noqa: E731
        FalsifyContext("host", "quick", 0, {**item, "params": params}, draws=store)
    )
    first, second = run({}), run({})
    assert first.status.value == second.status.value == "passed" and len(calls) == 1 and len(store.entries) == 1
    assert first.evidence.to_json() == second.evidence.to_json()
    bad = run({"variant": "uniform_design"})
    assert bad.status.value == "violated" and len(calls) == 2
    assert get_test("rng.uniform_map_model") is not None
