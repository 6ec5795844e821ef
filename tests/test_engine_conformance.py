"""Every family test that judges outputs does it through the engine, and the engine's common checks hold for it.

For each registered test of the five families, the test runs on a contract item with its native outputs
corrupted (one high bit of output element 0 flipped; for determinism, on every other call): the engine
must report it violated with a counterexample, and replaying that counterexample (its ``kc replay`` integers,
through a typed Replay) must reproduce the violation. Tests that judge no outputs (measurements,
instrumented call counts, statistics) are listed with the reason, and the list is checked to be exact.
"""

from __future__ import annotations

import itertools
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ruamel.yaml import YAML

from falsification import engine
from falsification.engine import Check, NativeResult
from falsification.registry import FalsifyContext, Replay, registered_tests

ROOT = Path(__file__).resolve().parent.parent
FAMILY_CONTRACTS = (
    "elementwise-float32-v1",
    "reductions-v1",
    "gemm-cublas-v1",
    "rng-splitmix64-v1",
    "transfer-float32-v1",
)
FAMILIES = ("elementwise", "reductions", "gemm", "rng", "transfer")

# Registered family tests that judge no native output against a reference, and why.
NOT_AGREEMENT: dict[str, str] = {
    "elementwise.grid_coverage": "executes the plan's loop index arithmetic (no kernel output)",
    "elementwise.sweep": "exhaustive sweep driver (falsification/sweep.py), its own comparison",
    "reductions.nonreproducible": "measures that results vary (the claim is non-determinism)",
    "reductions.bandwidth": "measurement",
    "gemm.handle_lifecycle": "instrumented call counts",
    "gemm.compute_type": "instrumented compute types and a numeric TF32 probe",
    "gemm.guard": "instrumented: the guard raises before cuBLAS",
    "gemm.single_step": "one training step: finiteness and nonzero gradients",
    "gemm.training": "training curve against a float64 run",
    "gemm.throughput": "measurement",
    "gemm.overhead": "measurement",
    "gemm.mfu_floor": "measurement",
    "rng.cross_device": "CUDA against the host path (cuda only)",
    "rng.uniform_map_model": "kernel map against the enumerated integer model on all inputs",
    "rng.statistics": "chi-square statistics",
    "rng.init_moments": "exact moments of the Xavier/Kaiming maps over every uniform (no kernel output)",
}


def _items() -> dict[str, dict[str, Any]]:
    """The first item of the family contracts naming each test."""
    out: dict[str, dict[str, Any]] = {}
    for name in FAMILY_CONTRACTS:
        data = YAML(typ="safe").load((ROOT / "contracts" / f"{name}.yaml").read_text())
        for it in itertools.chain(data.get("obligations", []), data.get("falsification", [])):
            params = it.get("params") or {}
            host_route = params.get("route", "nvrtc-ieee") == "nvrtc-ieee"
            if "test" in it and it["test"] not in out and "variant" not in params and host_route:
                out[it["test"]] = {**it, "_contract": f"contracts/{name}.yaml"}
    return out


ITEMS = _items()
FAMILY_TESTS = sorted(n for n in registered_tests() if n.split(".")[0] in FAMILIES)
AGREEMENT_TESTS = [n for n in FAMILY_TESTS if n not in NOT_AGREEMENT]


def _flip(a: Any) -> Any:
    """A copy of ``a`` with the second-highest bit of element 0 flipped (its magnitude changes by far)."""
    flat = np.array(a, copy=True).reshape(-1) if isinstance(a, np.ndarray) else a.copy().reshape(-1)
    if flat.size == 0:
        return flat
    width = flat.dtype.itemsize * 8
    u = flat.view(f"u{flat.dtype.itemsize}")
    u[0] ^= u.dtype.type(1 << (width - 2))
    return flat


def _planted(check: Check) -> Check:
    calls = itertools.count()
    every_other = check.agreement.runs > 1

    def native(inputs: Any) -> Any:
        out = check.native(inputs)
        if every_other and next(calls) % 2 == 0:
            return out
        if isinstance(out, NativeResult):
            return NativeResult([_flip(o) for o in out.outputs], out.guard_ok)
        if isinstance(out, list | tuple):
            return [_flip(o) for o in out]
        return _flip(out)

    return replace(check, native=native)


@pytest.fixture
def planted_engine(monkeypatch: pytest.MonkeyPatch) -> list[Check]:
    """engine.run drives the planted form of whatever check a test hands it; the checks are recorded."""
    seen: list[Check] = []
    real = engine.run

    def run(ctx: FalsifyContext, check: Check, extra: Any = None) -> Any:
        seen.append(check)
        return real(ctx, _planted(check), extra)

    monkeypatch.setattr(engine, "run", run)
    return seen


def _ctx(name: str, replay: Replay | None = None) -> FalsifyContext:
    it = ITEMS[name]
    params = {**(it.get("params") or {}), "max_examples": 4}
    item = {k: v for k, v in it.items() if k != "_contract"} | {"params": params}
    return FalsifyContext("host", "quick", 0, item, contract_path=it["_contract"], replay=replay)


def test_every_family_test_is_an_engine_check_or_listed_with_its_reason():
    assert set(NOT_AGREEMENT) <= set(FAMILY_TESTS), set(NOT_AGREEMENT) - set(FAMILY_TESTS)
    assert set(AGREEMENT_TESTS) <= set(ITEMS), "every agreement test is used by a family contract item"


@pytest.mark.parametrize("name", AGREEMENT_TESTS)
def test_planted_disagreement_is_caught_and_replay_reproduces_it(name, planted_engine):
    test = registered_tests()[name]
    out = test.run(_ctx(name))
    assert planted_engine, f"{name} did not run through falsification.engine.run"
    assert out.status.value == "violated", (name, out.status, out.reason)
    ev = engine.evidence_dict(out)
    assert ev["agreement"]["kind"] == planted_engine[0].agreement.name  # recorded by the engine
    assert {"seed", "profile", "device", "cases"} <= set(ev)
    cmd = out.counterexample["replay"]
    assert cmd.startswith(f"kc replay {ITEMS[name]['_contract']} {ITEMS[name]['id']} --bits "), cmd
    args = shlex.split(cmd)
    bits = args[args.index("--bits") + 1].split(",")
    scalars = args[args.index("--scalars") + 1].split(",") if "--scalars" in args else []
    again = test.run(_ctx(name, Replay.parse(bits, scalars)))
    assert again.status.value == "violated", (name, again.reason)
    assert engine.evidence_dict(again)["replayed"] is True


@pytest.mark.parametrize("name", AGREEMENT_TESTS)
def test_replay_of_an_agreeing_case_passes(name):
    """Without the planted bug, a replayed case (the first explicit or drawn one) agrees."""
    seen: list[Check] = []
    real = engine.run

    def recording(ctx: FalsifyContext, check: Check, extra: Any = None) -> Any:
        seen.append(check)
        return real(ctx, check, extra)

    mp = pytest.MonkeyPatch()
    mp.setattr(engine, "run", recording)
    try:
        test = registered_tests()[name]
        first = test.run(_ctx(name))
        assert first.status.value == "passed", (name, first.reason)
        check = seen[0]
        case = check.explicit[0] if check.explicit else None
        if case is None or check.encode is None:
            pytest.skip(f"{name}: no explicit case to replay")
        try:
            values = tuple(check.encode(case))
        except ValueError:
            if check.elements is None:
                raise
            inputs = check.inputs(case)
            case = check.elements.batch([check.elements.operands(inputs, 0)], case)
            values = tuple(check.encode(case))
        scalars = check.elements.scalars(case) if check.elements is not None else ()
        again = test.run(_ctx(name, Replay(values, tuple(scalars))))
        assert again.status.value == "passed", (name, again.reason)
    finally:
        mp.undo()


def test_an_item_stating_another_agreement_is_an_error():
    ctx = _ctx("reductions.fold_bitwise")
    ctx = replace(ctx, item={**ctx.item, "agreement": "max_ulp"})
    out = registered_tests()["reductions.fold_bitwise"].run(ctx)
    assert out.status.value == "error" and "applies 'bitwise'" in out.reason
