"""Authoring tools: `kc new` scaffolds, `kc explain`, and the `pytest --kc` plugin."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import jsonschema
import pytest
from ruamel.yaml import YAML

from obligations.contract import SCHEMA_PATH
from obligations.explain import ItemNotFound, explain
from obligations.scaffold import ScaffoldError, scaffold_contract

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
SCHEMA = json.loads((ROOT / "contracts" / "schema" / "contract.schema.json").read_text())

EXTRA_OBLIGATIONS = """\
  - id: PO-DEMO-TRUE
    type: invariant
    property: the plan covers at least one element
    method: z3
    prove: "elements >= 1"
  - id: PO-DEMO-FALSE
    type: invariant
    property: a deliberately false claim
    method: z3
    prove: "elements < 100"
falsification:
"""


def _scaffold(root: Path, name: str) -> tuple[Path, Path, str]:
    """Scaffold ``name`` into a fresh package under ``root``; returns (contract, module file, module name)."""
    package = f"kcnew_{uuid.uuid4().hex[:10]}"
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    contract, module = scaffold_contract(name, "elementwise", root / "contracts", root / package)
    return contract, module, f"{package}.{module.stem}"


# --- kc new --------------------------------------------------------------------------------------------


def test_scaffold_is_valid_visible_and_never_passing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from obligations.check import check_contract
    from obligations.contract import load_contract

    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"demo-{uuid.uuid4().hex[:6]}"
    contract, module, module_name = _scaffold(tmp_path, name)
    assert contract == tmp_path / "contracts" / f"{name}.yaml" and module.is_file()
    schema_ref = contract.read_text().splitlines()[0].split("$schema=", 1)[1]
    assert (contract.parent / schema_ref).resolve() == SCHEMA_PATH.resolve()  # editors find the real schema
    jsonschema.Draft7Validator(SCHEMA).validate(YAML(typ="safe").load(contract.read_text()))
    importlib.import_module(module_name)  # registers the scaffold's falsification test
    loaded = load_contract(contract)  # schema and semantic checks: entry, plan and test all resolve
    assert {i["kind"] for i in loaded.items} == {"obligation", "falsification"}
    entry = check_contract(contract)
    assert entry["items"], "a scaffold must have items"
    for record in entry["items"]:
        assert record["status"] == "skipped", record
        assert "not implemented" in record["reason"], record
    assert entry["qa_gate_status"] == "not passed"


def test_scaffold_refuses_to_overwrite_and_bad_names(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    scaffold_contract("twice", "gemm", tmp_path / "contracts", package)
    before = (tmp_path / "contracts" / "twice.yaml").read_text()
    with pytest.raises(ScaffoldError, match="already exists"):
        scaffold_contract("twice", "gemm", tmp_path / "contracts", package)
    assert (tmp_path / "contracts" / "twice.yaml").read_text() == before
    for bad in ("1gemm", "has space", "semi;colon", ""):
        with pytest.raises(ScaffoldError):
            scaffold_contract(bad, "gemm", tmp_path / "contracts", package)
    with pytest.raises(ScaffoldError):
        scaffold_contract("okname", "two\nlines", tmp_path / "contracts", package)


# --- kc explain ----------------------------------------------------------------------------------------


def test_explain_shows_statement_evidence_and_replay() -> None:
    result = json.loads((FIXTURES / "result_sample.json").read_text())
    text = explain("FT-GEMM-004", [FIXTURES / "contract_sample.yaml"], result)
    assert text.startswith("FT-GEMM-004  (falsification)")
    assert "contract_sample.yaml:84:5" in text
    assert "status: violated" in text and '"expected": "0x3f800001"' in text
    assert "ULP histogram: 0 ULP: 36,963, 1 ULP: 37" in text
    assert text.rstrip().endswith("kc check contracts/gemm-cublas-v1.yaml --only FT-GEMM-004 --device cuda --seed 0")
    proved = explain("PO-GEMM-002a", [FIXTURES / "contract_sample.yaml"], result)
    assert "prove: cdiv(m, tile) * tile >= m" in proved
    assert "⎡ m  ⎤" in proved, "the parsed statement should be pretty-printed"
    assert "Points satisfying the assumptions: 512" in proved
    assert "STALE" not in proved


def test_explain_without_result_and_for_unknown_ids() -> None:
    text = explain("PO-GEMM-001", [FIXTURES / "contract_sample.yaml"], None)
    assert "no result given" in text
    assert text.rstrip().endswith(f"kc check {FIXTURES / 'contract_sample.yaml'} --only PO-GEMM-001")
    with pytest.raises(ItemNotFound, match="did you mean PO-GEMM-001"):
        explain("PO-GEMM-01", [FIXTURES / "contract_sample.yaml"], None)


def test_explain_flags_stale_evidence(tmp_path: Path) -> None:
    result = json.loads((FIXTURES / "result_sample.json").read_text())
    changed = tmp_path / "gemm-cublas-v1.yaml"
    changed.write_text((FIXTURES / "contract_sample.yaml").read_text().replace("tolerance: 2", "tolerance: 3"))
    assert "STALE" in explain("FT-GEMM-002", [changed], result)


# --- pytest --kc ---------------------------------------------------------------------------------------


def test_plugin_import_is_cheap_and_inert() -> None:
    code = (
        "import sys, obligations.pytest_plugin\n"
        "heavy = [m for m in ('obligations.check', 'obligations.contract', 'z3', 'sympy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr


def _plugin_args(request: pytest.FixtureRequest) -> list[str]:
    # Installed packages load the plugin through its pytest11 entry point; a source checkout needs -p.
    return [] if request.config.pluginmanager.has_plugin("kc") else ["-p", "obligations.pytest_plugin"]


@pytest.fixture()
def kc_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with one scaffolded contract plus a proved and a violated z3 obligation."""
    root = pytester.path
    contract, _module, module_name = _scaffold(root, "demo-scale")
    text = contract.read_text().replace("falsification:\n", EXTRA_OBLIGATIONS, 1)
    contract.write_text(text)
    # The scaffold's test module must be imported for its test to be registered (as a project would do
    # in conftest.py until the registry discovers modules itself).
    pytester.makeconftest(f"import {module_name}\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(root)]))
    pytester.makepyfile(test_plain="def test_plain():\n    assert sum([1, 1]) == 2\n")
    return root / "contracts"


def test_plugin_runs_contract_items_as_pytest_items(
    pytester: pytest.Pytester, kc_project: Path, request: pytest.FixtureRequest
) -> None:
    res = pytester.runpytest_subprocess(
        *_plugin_args(request), "--kc", str(kc_project), "-rA", "-p", "no:cacheprovider"
    )
    res.assert_outcomes(passed=2, failed=1, skipped=2)
    out = res.stdout.str()
    assert "PASSED contracts/demo-scale.yaml::PO-DEMO-TRUE" in out
    assert "PO-DEMO-FALSE: violated" in out
    assert '"n": 100' in out, "the failure must show the counterexample"
    assert "replay: kc check contracts/demo-scale.yaml --only PO-DEMO-FALSE" in out
    assert "not implemented" in out


def test_plugin_strict_fails_skipped_items(
    pytester: pytest.Pytester, kc_project: Path, request: pytest.FixtureRequest
) -> None:
    res = pytester.runpytest_subprocess(
        *_plugin_args(request),
        "--kc",
        str(kc_project),
        "--kc-strict",
        "-k",
        "not TRUE and not FALSE",
        "-p",
        "no:cacheprovider",
    )
    res.assert_outcomes(failed=2, passed=1, deselected=2)


def test_plugin_does_nothing_without_kc(
    pytester: pytest.Pytester, kc_project: Path, request: pytest.FixtureRequest
) -> None:
    res = pytester.runpytest_subprocess(*_plugin_args(request), "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)


def test_plugin_reports_an_invalid_contract(
    pytester: pytest.Pytester, kc_project: Path, request: pytest.FixtureRequest
) -> None:
    bad = kc_project / "broken.yaml"
    shutil.copy(kc_project / "demo-scale.yaml", bad)
    bad.write_text(bad.read_text().replace("id: demo-scale", "id: broken\nnot_a_field: 1"))
    res = pytester.runpytest_subprocess(*_plugin_args(request), "--kc", str(bad), "-p", "no:cacheprovider")
    res.assert_outcomes(failed=1, passed=1)  # test_plain passes; the broken contract fails, visibly
    assert "invalid contract" in res.stdout.str() and "not_a_field" in res.stdout.str()


def test_plugin_collection_counts_contract_items_and_node_ids_go_back_to_pytest(
    pytester: pytest.Pytester, kc_project: Path, request: pytest.FixtureRequest
) -> None:
    res = pytester.runpytest_subprocess(
        *_plugin_args(request), "--kc", str(kc_project), "--collect-only", "-q", "-p", "no:cacheprovider"
    )
    out = res.stdout.str()
    node_ids = [line for line in out.splitlines() if "::" in line]
    assert len(node_ids) == 5 and "5 tests collected" in out, out  # 4 contract items + test_plain, counted
    node = next(n for n in node_ids if n.endswith("::PO-DEMO-TRUE"))
    again = pytester.runpytest_subprocess(*_plugin_args(request), node, "-p", "no:cacheprovider")
    again.assert_outcomes(passed=1)
