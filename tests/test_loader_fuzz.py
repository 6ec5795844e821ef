"""A seeded sample of loader fuzzing: no mutant of a shipped contract crashes `kc validate` (issue 18).

The full run is ``benchmarks/fuzz_loader.py`` (10,000 files by default); this sample keeps CI under 20 s.
"""

from __future__ import annotations

import collections
import copy
import random

import pytest

from tests.loader_fuzzing import DATA_MUTATIONS, SHIPPED, TEXT_MUTATIONS, dump_yaml, mutant, shipped_data, verdict

SAMPLE = 100
SEED = 18


def test_fuzzed_contracts_give_exit_0_or_2_with_located_diagnostics(tmp_path):
    rng = random.Random(SEED)
    codes: collections.Counter[int] = collections.Counter()
    applied: collections.Counter[str] = collections.Counter()
    bad = []
    for i in range(SAMPLE):
        m = mutant(rng)
        path = tmp_path / f"fuzz-{i}.yaml"
        path.write_bytes(m.data)
        v = verdict(path)
        codes[v.exit_code] += 1
        applied.update(m.mutations)
        if v.exit_code not in (0, 2) or v.bad_lines:
            bad.append((i, m.source, m.mutations, v.exit_code, v.bad_lines[:3]))
    assert not bad, bad
    assert codes[3] == 0 and codes[2] > SAMPLE // 2, codes
    assert len(applied) >= len(DATA_MUTATIONS) + len(TEXT_MUTATIONS) - 3, applied  # the sample is varied


def test_every_mutation_kind_yields_a_verdict(tmp_path):
    """Each mutation alone, on each shipped contract once: exit 0 or 2, no malformed line."""
    rng = random.Random(SEED)
    bad = []
    for name, mutate in TEXT_MUTATIONS.items():
        source = SHIPPED[len(name) % len(SHIPPED)]
        path = tmp_path / f"{name}.yaml"
        path.write_bytes(mutate(rng, source.read_bytes()))
        v = verdict(path)
        if v.exit_code not in (0, 2) or v.bad_lines:
            bad.append((name, v))
    for name, mutate in DATA_MUTATIONS.items():
        data = copy.deepcopy(shipped_data(SHIPPED[len(name) % len(SHIPPED)]))
        mutate(rng, data)
        path = tmp_path / f"{name}.yaml"
        path.write_bytes(dump_yaml(data))
        v = verdict(path)
        if v.exit_code not in (0, 2) or v.bad_lines:
            bad.append((name, v))
    assert not bad, bad


# --- the expression language (#17.4) ----------------------------------------------------------------------

EXPR_SAMPLE = 2000
HOSTILE_SAMPLE = 24  # of HOSTILE_EXPRESSIONS, seeded (benchmarks/fuzz_loader.py --expressions runs them all)


def test_hostile_expressions_in_a_contract_are_located_diagnostics_quickly(tmp_path):
    """Hostile expressions as a contract's statement: kc validate --import exits 2 at its line, each in < 5 s."""
    import time

    from tests.loader_fuzzing import HOSTILE_EXPRESSIONS

    must = [e for e in HOSTILE_EXPRESSIONS if e.startswith(("9**9**9", "1 << 9", "(((", "1111", "(lambda", "f'"))]
    chosen = must + random.Random(SEED).sample(
        [e for e in HOSTILE_EXPRESSIONS if e not in must], HOSTILE_SAMPLE - len(must)
    )

    source = next(p for p in SHIPPED if "gemm" in p.name)
    data = shipped_data(source)
    first = next(i for i, o in enumerate(data["obligations"]) if "prove" in o)
    bad, codes = [], collections.Counter()
    for n, text in enumerate(chosen):
        mutated = copy.deepcopy(data)
        mutated["obligations"][first]["prove"] = text
        path = tmp_path / f"expr-{n}.yaml"
        path.write_bytes(dump_yaml(mutated))
        t0 = time.perf_counter()
        v = verdict(path)
        seconds = time.perf_counter() - t0
        codes[v.exit_code] += 1
        if v.exit_code not in (0, 2) or v.bad_lines or seconds > 5:
            bad.append((text[:60], v, round(seconds, 2)))
    assert not bad, bad
    assert codes[3] == 0 and codes[2] >= len(chosen) - 2, codes


@pytest.mark.filterwarnings("ignore::SyntaxWarning")
def test_fuzzed_expressions_parse_or_fail_located_in_bounded_time_and_memory():
    from tests.loader_fuzzing import expression_mutant, expression_verdict

    rng = random.Random(SEED)
    bad, slowest, peak = [], 0.0, 0
    for i in range(EXPR_SAMPLE):
        text = expression_mutant(rng)
        v = expression_verdict(text, measure_memory=i % 20 == 0)
        slowest, peak = max(slowest, v.seconds), max(peak, v.peak_bytes)
        if not v.ok:
            bad.append((i, text[:80], v.problem))
    assert not bad, bad[:5]
    assert slowest < 1.0 and peak < 64 * 2**20, (slowest, peak)
