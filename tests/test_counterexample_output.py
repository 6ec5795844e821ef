"""Counterexamples print whole (issue 30): replay commands as the user named the contract, never cut, also when
a worker process ran the item; elements show native and reference bits in hex and decimal; ``kc replay``
prints in ``kc check``'s style (``--json`` for the raw record)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from obligations.cli import main
from obligations.console import readable_counterexample

ROOT = Path(__file__).resolve().parent.parent

# An element as falsification.engine._element_json writes it.
ELEMENT = {
    "index": 0,
    "operands": {"x": "0x7F800001"},
    "operand_values": {"x": "nan"},
    "outputs": {
        "r": {
            "native": "0x7FC00001",
            "native_value": "nan",
            "reference": "0x7FFFFFFF",
            "reference_value": "nan",
            "ulp_distance": 0,
        }
    },
}


def test_an_element_prints_native_and_reference_bits_in_hex_and_decimal():
    lines = readable_counterexample({"kind": "element", "element": ELEMENT}, width=40)
    assert "element: index 0: x = 0x7F800001 (nan)" in lines
    (out,) = [line for line in lines if line.strip().startswith("r:")]
    assert "native 0x7FC00001 (2143289345) = nan" in out and "reference 0x7FFFFFFF (2147483647) = nan" in out
    assert "..." not in "\n".join(lines)


def test_the_replay_command_is_never_cut_and_other_values_only_without_verbose():
    long_path = "contracts/" + "d" * 150 + "/toycopy-v1.yaml"
    replay = f"kc replay {long_path} TC-bitwise --bits 0xA8FFC000 --device host --seed 0"
    cex = {"detail": "y" * 300, "replay": replay}
    lines = readable_counterexample(cex)
    assert f"replay: {replay}" in lines
    assert lines[0].endswith("...") and len(lines[0]) == len("detail: ") + 100
    assert not readable_counterexample(cex, width=None)[0].endswith("...")


CONTRACT = """\
id: replayed-v1
version: 0.1.0
family: elementwise
summary: "a test that is violated and names its replay command"
references: []
test_modules: [replayed_tests]
kernels:
  main: {entry: "replayed_tests:kernel"}
symbols: {}
equations:
  e: {formula: "out = x"}
obligations: []
falsification:
  - id: FT-A
    rule: "r"
    prediction: "p"
    if_fails: "f"
    test: replayed.violated
    agreement: bitwise
  - id: FT-B
    rule: "r"
    prediction: "p"
    if_fails: "f"
    test: replayed.violated
    agreement: bitwise
qa_gate: {id: GATE, requires: [FT-A]}
"""

TESTS = '''\
"""A registered test that is violated with a one-case replay command."""

from falsification.engine import Replay, outcome_violated
from falsification.registry import register_test


def kernel(x):
    """The identity."""
    return x


@register_test("replayed.violated")
def violated(ctx):
    """Violated at the element 0xA8FFC000."""
    return outcome_violated(ctx, {"kind": "element"}, "planted", replay=Replay((0xA8FFC000,), ()))
'''


def _project(tmp_path: Path, monkeypatch, cwd: str = ".") -> Path:
    """A project with the contract; the working directory is ``cwd`` in it; returns the contract's path from there."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'replayed'\n")
    (tmp_path / "contracts").mkdir()
    (tmp_path / "contracts" / "replayed-v1.yaml").write_text(CONTRACT)
    (tmp_path / "replayed_tests.py").write_text(TESTS)
    (tmp_path / cwd).mkdir(exist_ok=True)
    monkeypatch.chdir(tmp_path / cwd)
    monkeypatch.syspath_prepend(str(tmp_path))
    return Path(os.path.relpath(tmp_path / "contracts" / "replayed-v1.yaml"))


def test_a_worker_names_the_contract_as_the_run_does(tmp_path, monkeypatch):
    # The worker read the contract by its absolute path and quoted that path in the replay command; the
    # request and the worker's loading are run here in process (a worker process costs seconds of start-up).
    # The contract lies outside the working directory, so only the name the run was given is relative.
    from obligations.check import item_fields
    from obligations.contract import load_contract
    from obligations.isolation import worker_contract, worker_request

    path = _project(tmp_path, monkeypatch, cwd="work")
    assert str(path).startswith("..")
    contract = load_contract(path)
    request = json.loads(json.dumps(worker_request({}, contract, contract.item("FT-A"), None)))
    assert Path(request["path"]).is_absolute()
    loaded = worker_contract({}, request)
    fields = item_fields(loaded, loaded.item("FT-A"), device="host", profile="quick", seed=0)
    assert fields["status"] == "violated", fields
    assert fields["counterexample"]["replay"] == f"kc replay {path} FT-A --bits 0xA8FFC000 --device host --seed 0"


def test_kc_replay_prints_like_kc_check_and_json_on_request(tmp_path, monkeypatch, capsys):
    _project(tmp_path, monkeypatch)
    argv = ["replay", "contracts/replayed-v1.yaml", "FT-A", "--bits", "0xA8FFC000", "--device", "host"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "replayed-v1 0.1.0  (contracts/replayed-v1.yaml)"
    assert "  violated   FT-A" in out and "planted" in out and out.rstrip().endswith("1 items: 1 violated")
    assert "replay: kc replay contracts/replayed-v1.yaml FT-A --bits 0xA8FFC000 --device host --seed 0" in out
    assert main([*argv, "--json"]) == 1
    record = json.loads(capsys.readouterr().out)
    assert record["id"] == "FT-A" and record["status"] == "violated" and record["reason"] == "planted"


def test_an_absolute_contract_path_below_the_working_directory_is_quoted_relative(tmp_path, monkeypatch, capsys):
    _project(tmp_path, monkeypatch)
    absolute = str(tmp_path / "contracts" / "replayed-v1.yaml")
    assert main(["check", absolute, "--device", "host", "--only", "FT-A", "-j", "0", "-q"]) == 1
    out = capsys.readouterr().out
    assert "replay: kc replay contracts/replayed-v1.yaml FT-A --bits 0xA8FFC000 --device host --seed 0" in out
    assert "replay: kc check contracts/replayed-v1.yaml --only FT-A --device host --seed 0" in out
    assert main(["replay", absolute, "FT-A", "--bits", "0xA8FFC000", "--device", "host"]) == 1
    assert "replay: kc replay contracts/replayed-v1.yaml FT-A" in capsys.readouterr().out


def test_kc_replay_of_an_agreeing_element_passes(capsys):
    ew = "contracts/elementwise-float32-v1.yaml"
    argv = ["replay", str(ROOT / ew), "FALSIFY-EW-ADD-bitwise", "--bits", "0x00000001,0x00000000", "--device", "host"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "  passed     FALSIFY-EW-ADD-bitwise" in out and "1 cases" in out and out.endswith("1 items: 1 passed\n")
