"""CI outputs validate against their published schemas and say what failed, where, and how to replay it."""

from __future__ import annotations

import copy
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from obligations.ci_outputs import (
    emit_github,
    github_annotations,
    junit_xml,
    sarif_log,
    step_summary,
    write_junit,
    write_sarif,
)

ROOT = Path(__file__).parents[1]
SCHEMAS = ROOT / "obligations" / "schemas"
RESULT = Path(__file__).parent / "fixtures" / "result_sample.json"


@pytest.fixture()
def result() -> dict:
    return json.loads(RESULT.read_text())


def _items(result: dict) -> list[tuple[dict, dict]]:
    return [(c, i) for c in result["contracts"] for i in c["items"]]


# --- JUnit -------------------------------------------------------------------------------------------


def _validate_junit(xml: str) -> None:
    """Validate against the vendored Ant JUnit XSD (xmlschema), else check the XSD's required parts by hand."""
    try:
        import xmlschema
    except ImportError:
        xmlschema = None
    if xmlschema is not None:
        xmlschema.XMLSchema(str(SCHEMAS / "junit-windyroad.xsd")).validate(xml)
        return
    root = ET.fromstring(xml)
    assert root.tag == "testsuites" and not root.attrib
    for n, suite in enumerate(root):
        assert suite.tag == "testsuite"
        for attr in ("name", "timestamp", "hostname", "tests", "failures", "errors", "time", "package", "id"):
            assert suite.get(attr), attr
        assert suite.get("id") == str(n)
        assert [c.tag for c in suite][0] == "properties" and [c.tag for c in suite][-2:] == ["system-out", "system-err"]
        for case in suite.iter("testcase"):
            assert case.get("name") and case.get("classname") and case.get("time")
            assert len(case) <= 1 and all(c.tag in ("skipped", "error", "failure") for c in case)
            for c in case:
                if c.tag != "skipped":
                    assert c.get("type")


def test_junit_validates_against_the_ant_schema(result: dict) -> None:
    _validate_junit(junit_xml(result))
    _validate_junit(junit_xml(result, strict=True))


def test_junit_schema_is_really_checked(result: dict) -> None:
    xml = junit_xml(result).replace(' hostname="', ' hostnam="', 1)
    with pytest.raises(Exception):  # noqa: B017 - xmlschema's or our own assertion, either must reject it
        _validate_junit(xml)


def test_junit_one_testcase_per_item_with_skips_and_failures(result: dict) -> None:
    root = ET.fromstring(junit_xml(result, hostname="ci"))
    cases = {(s.get("name"), c.get("name")): c for s in root for c in s.iter("testcase")}
    assert set(cases) == {(c["id"], i["id"]) for c, i in _items(result)}
    gemm = "gemm-cublas-v1"
    assert [e.tag for e in cases[(gemm, "PO-GEMM-001")]] == []
    skipped = cases[(gemm, "FT-GEMM-005")].find("skipped")
    assert skipped is not None and "not implemented" in skipped.get("message", "")
    failure = cases[(gemm, "FT-GEMM-004")].find("failure")
    assert failure is not None and failure.get("type") == "violated"
    assert '"expected": "0x3f800001"' in (failure.text or "")
    replay = "replay: kc check contracts/gemm-cublas-v1.yaml --only FT-GEMM-004 --device cuda --seed 0"
    assert replay in (failure.text or "")
    assert cases[(gemm, "PO-GEMM-005")].find("error") is not None
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "12",
        "1",
        "1",
        "3",
    )
    assert suite.get("timestamp") == "2026-11-21T10:00:00"


def test_junit_strict_fails_unknown_and_skipped(result: dict) -> None:
    root = ET.fromstring(junit_xml(result, strict=True))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("failures") == "4" and suite.get("skipped") == "0"


def test_junit_survives_hostile_text(result: dict, tmp_path: Path) -> None:
    hostile = copy.deepcopy(result)
    item = hostile["contracts"][0]["items"][9]
    item["reason"] = 'bad \x00\x1b]]> <tag attr="x"> & done'
    item["counterexample"] = {"s": "\x07bell"}
    path = write_junit(hostile, tmp_path / "out" / "junit.xml")
    _validate_junit(path.read_text())
    assert "]]&gt;" in path.read_text()


# --- SARIF -------------------------------------------------------------------------------------------


def _sarif_validator() -> jsonschema.Validator:
    schema = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def test_sarif_validates_against_sarif_2_1_0(result: dict, tmp_path: Path) -> None:
    validator = _sarif_validator()
    log = json.loads(write_sarif(result, tmp_path / "kc.sarif").read_text())
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    assert list(validator.iter_errors(sarif_log(result, strict=True))) == []


def test_sarif_schema_is_really_checked(result: dict) -> None:
    log = sarif_log(result)
    log["runs"][0]["results"][0]["level"] = "catastrophic"
    assert list(_sarif_validator().iter_errors(log)), "the schema must reject an invalid level"


def test_sarif_one_rule_per_item_located_at_its_yaml_line(result: dict) -> None:
    run = sarif_log(result)["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [i["id"] for _, i in _items(result)]
    assert len(run["results"]) == len(rules)
    by_id = {r["ruleId"]: r for r in run["results"]}
    for contract, item in _items(result):
        res = by_id[item["id"]]
        assert rules[res["ruleIndex"]]["id"] == item["id"]
        loc = res["locations"][0]["physicalLocation"]
        assert loc["artifactLocation"]["uri"] == contract["path"]
        assert loc["region"] == {"startLine": item["location"]["line"], "startColumn": item["location"]["column"]}
    assert by_id["FT-GEMM-004"]["level"] == "error" and by_id["FT-GEMM-004"]["kind"] == "fail"
    assert by_id["FT-GEMM-004"]["properties"]["counterexample"]["k"] == 4097
    assert by_id["PO-GEMM-001"]["kind"] == "pass"
    assert by_id["PO-GEMM-004"]["level"] == "warning"
    assert run["artifacts"][0]["hashes"]["sha-256"] == result["contracts"][0]["sha256"]
    assert run["invocations"][0]["exitCode"] == 1


# --- GitHub ------------------------------------------------------------------------------------------


def test_annotations_point_at_the_item_and_escape_newlines(result: dict) -> None:
    lines = github_annotations(result)
    violated = next(line for line in lines if "FT-GEMM-004" in line)
    assert violated.startswith("::error file=contracts/gemm-cublas-v1.yaml,line=84,col=5,title=FT-GEMM-004 violated::")
    assert "\n" not in violated and "%0Areplay: kc check" in violated
    assert any(line.startswith("::warning ") and "PO-GEMM-004" in line for line in lines)
    assert not any("PO-GEMM-001" in line for line in lines)
    assert all(line.startswith("::error ") for line in github_annotations(result, strict=True))


def test_emit_github_only_under_actions(result: dict, tmp_path: Path) -> None:
    out = io.StringIO()
    emit_github(result, env={}, stream=out)
    assert out.getvalue() == ""
    summary = tmp_path / "summary.md"
    summary.write_text("previous step\n")
    emit_github(result, env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}, stream=out)
    assert out.getvalue().count("::error ") == 2
    text = summary.read_text()
    assert text.startswith("previous step\n"), "the summary must be appended, not overwritten"
    assert "| 3 | 1 | 5 | 1 | 0 | 1 | 0 | 2 | 1 |" in text  # violated_expected and inconclusive: 0
    assert "`kc check contracts/gemm-cublas-v1.yaml --only FT-GEMM-004 --device cuda --seed 0`" in text


def test_step_summary_with_nothing_to_report(result: dict) -> None:
    clean = copy.deepcopy(result)
    for contract in clean["contracts"]:
        contract["items"] = [i for i in contract["items"] if i["status"] in ("proved", "passed", "exhausted")]
    assert "Nothing needs attention." in step_summary(clean)
    assert github_annotations(clean) == []
