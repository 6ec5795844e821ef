"""A seeded sample of loader fuzzing: no mutant of a shipped contract crashes `kc validate` (issue 18).

The full run is ``benchmarks/fuzz_loader.py`` (10,000 files by default); this sample keeps CI under 20 s.
"""

from __future__ import annotations

import collections
import copy
import random

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
