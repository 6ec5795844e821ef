"""CI integrations (#17.6): the composite action's inputs map to real `kc check` flags; the pre-commit hook runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ruamel.yaml import YAML

from obligations.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
# Inputs that configure the action itself, not a kc flag.
ACTION_ONLY = {"paths", "upload-sarif", "python-version"}


def _options(command: str) -> set[str]:
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    return {s for a in sub._actions for s in a.option_strings}


def test_action_inputs_map_to_real_kc_check_flags():
    action = YAML(typ="safe", pure=True).load((ROOT / "action.yml").read_text())
    check_step = next(s for s in action["runs"]["steps"] if s.get("id") == "check")
    script, env = check_step["run"], check_step["env"]
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", script))
    assert flags and flags <= _options("check"), flags - _options("check")
    for name, spec in action["inputs"].items():
        assert spec.get("description"), name
        if name in ACTION_ONLY:
            continue
        flag = f"--{name}"
        assert flag in _options("check"), f"input {name!r} names no kc check flag"
        var = next(k for k, v in env.items() if v == f"${{{{ inputs.{name} }}}}")
        assert flag in script and f"${var}" in script, f"input {name!r} is not passed as {flag}"
    steps = " ".join(str(s.get("uses", "")) for s in action["runs"]["steps"])
    assert "upload-sarif" in steps


def test_pre_commit_hook_runs_kc_validate_on_the_files_it_is_given(capsys):
    hooks = YAML(typ="safe", pure=True).load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "kc-validate")
    argv = shlex.split(hook["entry"])
    assert argv[:2] == ["kc", "validate"] and re.search(hook["files"], "contracts/x.yaml")
    contract = ROOT / "tests" / "fixtures" / "faults" / "faults-v1.yaml"
    assert main([*argv[1:], str(contract)]) == 0  # pre-commit appends the changed files
    assert "1 contract file(s) valid" in capsys.readouterr().out
    assert all(set(shlex.split(h["entry"])[2:]) <= _options("validate") for h in hooks)
