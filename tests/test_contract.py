"""Contract validation: every problem located as file:line:col; `kc validate` exits 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from obligations.cli import main
from obligations.contract import ContractError, load_contract, validate_paths

ROOT = Path(__file__).resolve().parent.parent
GEMM = ROOT / "contracts" / "gemm-cublas-v1.yaml"


def _broken(tmp_path: Path, old: str, new: str) -> Path:
    text = GEMM.read_text()
    assert old in text, old
    p = tmp_path / "broken.yaml"
    p.write_text(text.replace(old, new, 1))
    return p


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_shipped_contracts_are_valid():
    assert validate_paths([ROOT / "contracts"]) == []


@pytest.mark.parametrize(
    ("old", "new", "needle", "message"),
    [
        ("  - id: PO-GEMM-03\n", "  - id: PO-GEMM-03\n    colour: red\n", "colour: red", "unknown key 'colour'"),
        ("equation: handle_lifecycle", "equation: handle_lifecycel", "handle_lifecycel", "unknown equation"),
        ("  - id: PO-GEMM-04\n", "  - id: PO-GEMM-03 \n", "id: PO-GEMM-03 ", "duplicate id 'PO-GEMM-03'"),
        ("plan: native.gemm:gemm_plan", "plan: native.gemm:no_such_plan", "no_such_plan", "no attribute"),
        ("version: 1.0.0", "version: one", "version: one", "does not match"),
        (
            'prove: "accepts(a_bytes, b_bytes, c_bytes)"',
            'prove: "accepts(a_bytes, b_bytes, c_bytes).real"',
            ".real",
            "Attribute is not allowed",
        ),
        (
            'given: "accepts(a_bytes, b_bytes, c_bytes) and i < m and p < k"',
            'given: "accepts(a_bytes, b_bytes, c_bytes) and q < m and p < k"',
            "and q < m",
            "unknown name 'q'",
        ),
        (
            "    minimize: [m, n, k, lda, ldb, ldc]\n",
            '    minimize: [m, n, k, lda, ldb, ldc]\n    boundaries: ["accepts(a_bytes, b_bytes, q_bytes)"]\n',
            "boundaries:",
            "unknown name 'q_bytes' in a boundaries guard",
        ),
        ("depends_on: []", "depends_on: [training-gpu-kernel-v1]", "depends_on:", "no contract with id"),
        ("FALSIFY-CUBLAS-011]", "FALSIFY-CUBLAS-012]", "FALSIFY-CUBLAS-012]", "unknown item 'FALSIFY-CUBLAS-012'"),
        (
            "FALSIFY-CUBLAS-011]",
            "FALSIFY-CUBLAS-011, FALSIFY-CUBLAS-004]",
            "FALSIFY-CUBLAS-004]",
            "a claim this contract does not adopt",
        ),
        (
            "  - id: FALSIFY-CUBLAS-004\n    claim:",
            "  - id:  FALSIFY-CUBLAS-003\n    claim:",
            "id:  FALSIFY-CUBLAS-003",
            "duplicate id 'FALSIFY-CUBLAS-003'",
        ),
        (
            '    test: gemm.agreement\n    witnesses: PO-GEMM-regimes\n    params: {impl: "native.gemm:matmul", '
            "dtypes: [float32]}\nnot_adopted",
            "    test: no.such.test\nnot_adopted",
            "no.such.test",
            "no registered falsification test",
        ),
    ],
)
def test_each_problem_is_reported_at_its_line(tmp_path, old, new, needle, message):
    path = _broken(tmp_path, old, new)
    diags = validate_paths([path])
    assert diags, "expected a problem"
    hit = [d for d in diags if message in d.message]
    assert hit, [str(d) for d in diags]
    assert hit[0].line == _line_of(path, needle), str(hit[0])
    assert str(hit[0]).startswith(f"{path}:{hit[0].line}:{hit[0].col}: error: ")


def test_expression_error_column_points_into_the_file(tmp_path):
    path = _broken(
        tmp_path, 'prove: "accepts(a_bytes, b_bytes, c_bytes)"', 'prove: "accepts(a_bytes, b_bytes, c_bytes).real"'
    )
    d = next(d for d in validate_paths([path]) if "Attribute" in d.message)
    line = path.read_text().splitlines()[d.line - 1]
    assert line[d.col - 1 :].startswith("accepts(")


def test_duplicate_yaml_keys_are_rejected_with_position(tmp_path):
    path = _broken(tmp_path, "family: gemm\n", "family: gemm\nfamily: blas\n")
    with pytest.raises(ContractError) as info:
        load_contract(path)
    d = info.value.diagnostics[0]
    assert "duplicate" in d.message and d.line == _line_of(path, "family: blas")


def test_yaml_no_is_a_string_not_false(tmp_path):
    path = _broken(tmp_path, "family: gemm", "family: no")
    assert load_contract(path).data["family"] == "no"


def test_kc_validate_exit_codes(tmp_path, capsys):
    assert main(["validate", str(GEMM)]) == 0
    path = _broken(tmp_path, "equation: handle_lifecycle", "equation: nope")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{_line_of(path, 'equation: nope')}:" in err


def test_items_carry_their_yaml_location():
    c = load_contract(GEMM)
    it = c.item("PO-GEMM-02-A-z3")
    assert it["location"]["line"] == _line_of(GEMM, "- id: PO-GEMM-02-A-z3")


def test_test_modules_are_imported_so_their_tests_exist(tmp_path, monkeypatch):
    import uuid

    from obligations.check import check_contract

    pkg = f"kc_user_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{pkg}.py").write_text(
        "from falsification.registry import register_test\n"
        "from obligations.core.results import passed\n\n\n"
        f"@register_test('{pkg}.holds')\n"
        "def holds(ctx):\n"
        "    '''Always holds (a user test outside falsification/).'''\n"
        "    return passed(cases=1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    text = GEMM.read_text().replace("test: gemm.overhead", f"test: {pkg}.holds", 1)
    without = tmp_path / "without.yaml"
    without.write_text(text)
    with pytest.raises(ContractError, match=f"no registered falsification test named '{pkg}.holds'"):
        load_contract(without)
    with_modules = tmp_path / "with.yaml"
    with_modules.write_text(text.replace("depends_on: []", f"depends_on: []\ntest_modules: [{pkg}]", 1))
    entry = check_contract(with_modules, only=["PO-GEMM-04"])
    assert [(it["id"], it["status"]) for it in entry["items"]] == [("PO-GEMM-04", "passed")]


def test_a_test_module_that_does_not_import_is_reported_at_its_line(tmp_path):
    path = _broken(tmp_path, "depends_on: []", "depends_on: []\ntest_modules: [no_such_kc_module_xyz]")
    with pytest.raises(ContractError) as e:
        load_contract(path)
    (d,) = [d for d in e.value.diagnostics if "no_such_kc_module_xyz" in d.message]
    assert d.line == _line_of(path, "test_modules:") and "cannot import test module" in d.message


def test_the_editor_schema_copy_equals_the_packaged_schema():
    from obligations.contract import SCHEMA_PATH

    assert SCHEMA_PATH == ROOT / "obligations" / "schema" / "contract.schema.json"
    copy = ROOT / "contracts" / "schema" / "contract.schema.json"
    assert copy.read_bytes() == SCHEMA_PATH.read_bytes(), "cp obligations/schema/contract.schema.json contracts/schema/"
