"""One family name per family in every layer: contract files start with it, and spec/native use it."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parent.parent
# Contract paths an issue fixed by name (issue 12: contracts/graph-ir-v1.yaml; issue 16: contracts/cuda-libm-v1.yaml).
FIXED_PATHS = {"graph-ir-v1.yaml": "ir", "cuda-libm-v1.yaml": "libm"}


@functools.cache
def _family(path: Path) -> str:
    return YAML(typ="safe").load(path.read_text())["family"]


CONTRACTS = sorted((ROOT / "contracts").glob("*.yaml"))


@pytest.mark.parametrize("path", CONTRACTS, ids=[p.name for p in CONTRACTS])
def test_contract_file_names_start_with_their_family(path):
    family = _family(path)
    assert path.name.startswith(f"{family}-") or FIXED_PATHS.get(path.name) == family, (path.name, family)


@pytest.mark.parametrize("path", CONTRACTS, ids=[p.name for p in CONTRACTS])
def test_each_family_has_its_spec_and_native_module_by_the_same_name(path):
    family = _family(path)
    module = family.replace("-", "_")  # a family of two words (triton-softmax) is spelt as Python spells a module
    for layer in ("spec", "native"):
        assert (ROOT / layer / f"{module}.py").exists() or (ROOT / layer / module).is_dir(), (layer, family)
    assert (ROOT / "tests" / f"test_{module}.py").exists(), family


def test_one_contract_per_family():
    families = [_family(p) for p in CONTRACTS]
    assert sorted(f for f in set(families) if families.count(f) > 1) == []


@pytest.mark.parametrize("path", CONTRACTS, ids=[p.name for p in CONTRACTS])
def test_contract_id_equals_its_file_stem(path):
    # A file name can be used wherever an id is asked, and reports are named as the files (issue 30).
    assert YAML(typ="safe").load(path.read_text())["id"] == path.stem


def test_committed_reports_are_named_by_contract_files():
    reports = ROOT / "reports"
    stems = {p.stem for p in CONTRACTS}
    pages = {p.stem for p in reports.glob("*.md")} - {"index"}
    assert pages <= stems, sorted(pages - stems)
    assert {p.name for p in (reports / "plots").iterdir()} <= stems
    import json

    ids = {c["id"] for c in json.loads((reports / "result.json").read_text())["contracts"]}
    assert ids <= stems, sorted(ids - stems)
