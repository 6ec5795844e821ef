"""The CLI as pytest/ruff users expect it (#17.3, #17.6, #17.7): each defect a new user met, with its test."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from obligations.cli import EXIT_NO_CONTRACTS, build_parser, main

ROOT = Path(__file__).resolve().parent.parent
GEMM = next((ROOT / "contracts").glob("*gemm-v1.yaml"), None) or next((ROOT / "contracts").glob("*cublas*.yaml"))
FAULTS = ROOT / "tests" / "fixtures" / "faults" / "faults-v1.yaml"
SAMPLE = ROOT / "tests" / "fixtures" / "result_sample.json"


def _kc(*args: str, cwd: Path = ROOT, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "obligations.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        **kw,
    )


# --- collecting ----------------------------------------------------------------------------------------


def test_checking_nothing_is_its_own_exit_code(tmp_path, capsys):
    assert main(["check", str(tmp_path)]) == EXIT_NO_CONTRACTS == 5
    assert "no contract collected" in capsys.readouterr().err
    assert main(["validate", str(tmp_path)]) == 5


def test_directory_scans_are_recursive_and_skip_non_contract_yaml(tmp_path):
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    shutil.copy(FAULTS, nested / "faults-v1.yaml")
    (tmp_path / "a" / "ci.yml").write_text("on: push\njobs: {}\n")  # YAML that is no contract
    (tmp_path / ".hidden").mkdir()
    shutil.copy(FAULTS, tmp_path / ".hidden" / "copy.yaml")
    from obligations.contract import contract_files

    assert contract_files([tmp_path]) == [nested / "faults-v1.yaml"]
    assert main(["check", str(tmp_path), "--device", "host", "--only", "FT-OK-1", "-q"]) == 0


def test_only_unknown_id_is_an_error_with_a_suggestion_and_does_not_swallow_the_path(capsys):
    assert main(["check", str(FAULTS), "--device", "host", "--only", "FT-OK-9"]) == 2
    assert "--only FT-OK-9: no item with this id; did you mean 'FT-OK-" in capsys.readouterr().err
    # --only ID PATH: the path is a path (here the only one), not an id
    assert main(["check", "--device", "host", "--only", "FT-OK-1", str(FAULTS), "-q"]) == 0
    assert "1 items: 1 passed" in capsys.readouterr().out


# --- trust model ---------------------------------------------------------------------------------------


def test_validate_imports_nothing_unless_asked(tmp_path):
    pkg = tmp_path / "evil_tests"
    pkg.mkdir()
    marker = tmp_path / "imported"
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    text = FAULTS.read_text().replace(
        "test_modules: [tests.planted.fault_tests]", "test_modules: [tests.planted.fault_tests, evil_tests]"
    )
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "c.yaml").write_text(text)
    assert _kc("validate", "c.yaml", cwd=tmp_path).returncode == 0
    assert not marker.exists(), "kc validate ran the contract's code"
    assert _kc("validate", "--import", "c.yaml", cwd=tmp_path).returncode == 0
    assert marker.exists()  # --import (and kc check) import what the contract names, from the project root


def test_ids_that_become_file_names_are_safe(tmp_path, capsys):
    for bad in ("../evil", "a/b", "a..b", "x" * 200):
        path = tmp_path / "c.yaml"
        path.write_text(FAULTS.read_text().replace("id: faults-v1", f"id: {json.dumps(bad)}"))
        assert main(["validate", str(path)]) == 2, bad
        assert f"{path}:" in capsys.readouterr().err


def test_unknown_keys_get_a_did_you_mean(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(FAULTS.read_text().replace("test: faults.raises", "test: faults.raises\n    timout_s: 3"))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'timout_s'; did you mean 'timeout_s'?" in err and f"{path}:" in err


# --- user mistakes are exit 2, not 3 ---------------------------------------------------------------------


def test_an_unwritable_output_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    from obligations import check

    monkeypatch.setattr(check, "check_paths", lambda *a, **k: pytest.fail("the run started"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["check", str(FAULTS), "--device", "host", "--json", str(blocker / "r.json")]) == 2
    assert "--json" in capsys.readouterr().err
    assert main(["check", str(FAULTS), "--device", "host", "--sarif", str(tmp_path)]) == 2  # a directory


def test_json_dash_is_stdout(capsys):
    assert main(["check", str(FAULTS), "--device", "host", "--only", "FT-OK-1", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["summary"]["passed"] == 1 and "1 items" in captured.err


def test_explain_from_a_missing_file_is_a_usage_error(tmp_path, capsys):
    assert main(["explain", "FT-OK-1", str(FAULTS), "--from", str(tmp_path / "none.json")]) == 2
    assert "--from" in capsys.readouterr().err


def test_a_user_test_module_raising_on_import_is_a_located_diagnostic(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "broken_tests.py").write_text("raise RuntimeError('half-written module')\n")
    (tmp_path / "c.yaml").write_text(
        FAULTS.read_text().replace("[tests.planted.fault_tests]", "[tests.planted.fault_tests, broken_tests]")
    )
    proc = _kc("check", "c.yaml", "--device", "host", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "c.yaml:" in proc.stderr and "half-written module" in proc.stderr and "Traceback" not in proc.stderr


def test_a_closed_pipe_is_not_an_internal_error():
    proc = subprocess.Popen(
        [sys.executable, "-m", "obligations.cli", "check", str(FAULTS), "--device", "host", "--item-timeout", "0.2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    proc.stdout.readline()
    proc.stdout.close()  # `kc check | head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) != 3 and "internal error" not in err


# --- CLI habits ------------------------------------------------------------------------------------------


def test_every_argument_has_help():
    missing = []
    for name, sub in build_parser()._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            # kc graph's own sub-commands (obligations/graph_cli.py) carry their help in their subparsers
            if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction) and not action.help:
                missing.append(f"kc {name} {action.dest}")
    assert not missing, missing


def test_quiet_verbose_maxfail_durations(capsys):
    assert main(["check", str(FAULTS), "--device", "host", "--item-timeout", "0.2", "-q"]) == 1
    out = capsys.readouterr().out
    assert "FT-OK-1" not in out and "FT-RAISES" in out and "kc 0.1.0" not in out  # -q: failures and summary
    assert main(["check", str(FAULTS), "--device", "host", "-x", "--durations", "2"]) == 1
    out = capsys.readouterr().out
    assert "FT-HANG" not in out and "(--maxfail 1 reached)" in out  # -x stops after FT-RAISES
    assert "slowest 2 item(s):" in out and "faults-v1::" in out
    assert main(["check", str(FAULTS), "--device", "host", "--only", "FT-RAISES", "-v"]) == 1
    assert "Traceback" in capsys.readouterr().out  # -v: the traceback of errored items


def test_colour_only_on_a_tty_and_never_with_no_color(monkeypatch):
    from obligations.console import colour_enabled

    class Tty:
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert colour_enabled(Tty()) and not colour_enabled(open(os.devnull, "w"))  # noqa: SIM115
    monkeypatch.setenv("NO_COLOR", "1")
    assert not colour_enabled(Tty())
    proc = _kc("check", str(FAULTS), "--device", "host", "--only", "FT-OK-1")
    assert "\x1b[" not in proc.stdout  # a pipe is no terminal


def test_progress_bar_on_a_tty_plain_lines_otherwise():
    from obligations.console import progress_bar

    class Tty:
        def isatty(self):
            return True

        def write(self, s):
            return len(s)

        def flush(self):
            pass

    assert progress_bar(3, "checking", open(os.devnull, "w")) is None  # noqa: SIM115
    pytest.importorskip("rich")
    assert progress_bar(3, "checking", Tty()) is not None


def test_tool_kc_in_pyproject_sets_defaults_and_flags_override(tmp_path, monkeypatch, capsys):
    (tmp_path / "specs").mkdir()
    shutil.copy(FAULTS, tmp_path / "specs" / "faults-v1.yaml")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.kc]\ncontracts = ["specs"]\ndevice = "host"\nseed = 11\nitem_timeout = 0.3\n'
    )
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r.json"
    assert main(["check", "--only", "FT-OK-1", "FT-HANG", "--json", str(out), "-q"]) == 1
    result = json.loads(out.read_text())
    assert result["provenance"]["seed"] == 11 and result["provenance"]["device"]["kind"] == "host"
    assert "limit of 0.3 s" in result["contracts"][0]["items"][1]["reason"]
    assert main(["check", "--only", "FT-OK-1", "--seed", "2", "--json", str(out), "-q"]) == 0
    assert json.loads(out.read_text())["provenance"]["seed"] == 2  # the flag wins
    (tmp_path / "pyproject.toml").write_text("[tool.kc]\nsed = 1\n")
    assert main(["check"]) == 2
    assert "unknown key 'sed'; did you mean 'seed'?" in capsys.readouterr().err


def test_kc_new_outside_the_checkout_validates_and_checks(tmp_path):
    assert _kc("new", "softmax-v1", "--family", "softmax", cwd=tmp_path).returncode == 0
    assert (tmp_path / "contract_tests" / "__init__.py").exists()  # a package that cannot shadow kc's own
    for args in (["validate"], ["validate", "--import"], ["check", "--device", "host"]):
        proc = _kc(*args, cwd=tmp_path, env={"PYTHONPATH": ""})
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    assert _kc("new", "x-v1", "--family", "x", "--tests-dir", "falsification", cwd=tmp_path).returncode == 2


def test_provenance_names_the_checked_projects_commit(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "KC_COMMIT": "",
    }
    shutil.copy(FAULTS, tmp_path / "faults-v1.yaml")
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"]):
        subprocess.run(["git", *cmd], cwd=tmp_path, check=True, env={**os.environ, **env})
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    out = tmp_path / "r.json"
    proc = _kc(
        "check", str(tmp_path / "faults-v1.yaml"), "--device", "host", "--only", "FT-OK-1", "--json", str(out), env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["provenance"]["commit"] == head


# --- reports ---------------------------------------------------------------------------------------------


def test_report_refuses_to_replace_richer_evidence_and_check_compares_it(tmp_path, capsys):
    out = tmp_path / "reports"
    assert main(["report", "--from", str(SAMPLE), "--out", str(out), "--no-plots"]) == 0  # a GPU result
    host = json.loads(SAMPLE.read_text())
    host["provenance"]["device"] = {"kind": "host", "name": "x86_64"}
    poorer = tmp_path / "host.json"
    poorer.write_text(json.dumps(host))
    before = (out / "result.json").read_text()
    assert main(["report", "--from", str(poorer), "--out", str(out), "--no-plots"]) == 2
    assert "richer evidence" in capsys.readouterr().err and (out / "result.json").read_text() == before
    # a host result.json beside GPU reports (as an unguarded run left them): --check says so
    (out / "result.json").write_text(poorer.read_text())
    from obligations.reporting.provenance import _evidence_problems

    assert any("rests on evidence device cuda" in p for p in _evidence_problems(out))
    assert main(["report", "--from", str(poorer), "--out", str(out), "--no-plots", "--force"]) == 0
    assert _evidence_problems(out) == []


def test_html_reports_have_an_index_a_coloured_gate_and_no_sympy_internals(tmp_path):
    from obligations.reporting.statement import render_statement

    out = tmp_path / "reports"
    assert main(["report", "--from", str(SAMPLE), "--out", str(out), "--no-plots"]) == 0
    index = (out / "index.html").read_text()
    assert 'data-gate="passed" style="background:#1a7f37"' in index and '.html">' in index
    page = next(p for p in out.glob("*.html") if p.name != "index.html").read_text()
    assert "overflow-wrap:anywhere" in page and "data-gate=" in page
    for text in ("a // b >= 0", "x % 4 == 0", "a if c else b"):
        r = render_statement(text)
        shown = " ".join(filter(None, (r.latex, r.unicode, r.mathml))).lower()
        assert not any(w in shown for w in ("tdiv", "trem", "piecewise")), (text, shown)


def test_python_m_obligations_cli_has_every_command_kc_has():
    # run as __main__ the module is a second copy: commands registered by other modules must still be there
    for cmd in ("graph", "audit-libm"):
        proc = _kc(cmd, "--help")
        assert proc.returncode == 0 and f"usage: kc {cmd}" in proc.stdout, proc.stderr[-2000:]
