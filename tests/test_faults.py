"""Every fault ends cleanly (#31): real signals to real runs, shared logs, bad input and unwritable outputs.

A stop (SIGINT, SIGTERM) ends the run promptly, with or without workers, writes the partial result and the
log, exits 130/143 and leaves no process behind; an item the stop cut is never recorded. Bad input and OS
errors are exit 2 with a located message, never a traceback (exit 3).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from obligations import check
from obligations.cli import main
from obligations.core import cancel
from obligations.isolation import InProcess
from obligations.runlog import RunLog, read_log
from tests.contract_helpers import interruptible, surviving_processes

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "fixtures" / "faults" / "faults-v1.yaml"
OK = ["FT-OK-1", "FT-OK-2", "FT-OK-3", "FT-OK-4"]  # in contract order
HAS_PROC = Path("/proc/self/environ").exists()


# -- signals to real runs ---------------------------------------------------------------------------------


class Run:
    """``kc check`` in a subprocess whose output lines are watched (unbuffered) and whose processes are marked."""

    def __init__(self, tmp_path: Path, *argv: str):
        self.mark = uuid.uuid4().hex
        self.out = tmp_path / "r.json"
        self.log = tmp_path / "log.jsonl"
        env = {**os.environ, "KC_TEST_MARK": self.mark, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        cmd = [sys.executable, "-m", "obligations.cli", "check", str(FAULTS), "--device", "host", *argv]
        cmd += ["--json", str(self.out), "--log", str(self.log)]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible
        )
        self.lines: list[str] = []

    def wait_for(self, text: str, timeout: float = 120) -> None:
        """Read stdout until a line holds ``text`` (the run got that far)."""
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if text in line:
                return
        raise AssertionError(f"never printed {text!r}: {self.lines}")

    def stop(self, sig: int, expect: int) -> tuple[dict, str, float]:
        """Send ``sig``; the exit code must be ``expect``; (result, stderr, seconds to exit)."""
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        _, err = self.proc.communicate(timeout=60)  # the hanging item's limit is 120 s: a prompt stop is far below
        took = time.monotonic() - t0
        assert self.proc.returncode == expect, err
        assert "Traceback" not in err, err
        time.sleep(0.3)
        assert surviving_processes(self.mark) == []  # no worker outlives the run
        return json.loads(self.out.read_text()), err, took


def _ids(result: dict) -> list[str]:
    return [it["id"] for c in result["contracts"] for it in c["items"]]


@pytest.mark.skipif(not HAS_PROC, reason="finds the run's processes through /proc")
def test_sigterm_with_workers_writes_the_result_and_the_log_exits_143_and_leaves_no_process(tmp_path):
    run = Run(tmp_path, "--only", "FT-OK-1", "FT-HANG", "FT-OK-2", "-j", "2", "--item-timeout", "120")
    run.wait_for("FT-OK-1")  # the first item is in; FT-HANG hangs in a worker
    time.sleep(0.5)
    result, err, _ = run.stop(signal.SIGTERM, 143)
    assert result["interrupted"] is True and result["signal"] == "SIGTERM" and result["exit_code"] == 143
    assert _ids(result) == ["FT-OK-1"] and "stopped by SIGTERM" in err
    done = read_log(run.log).done
    assert "FT-HANG" not in {k[2] for k in done}  # cut by the stop: never recorded, --resume runs it again
    assert "FT-OK-1" in {k[2] for k in done}


@pytest.mark.skipif(not HAS_PROC, reason="finds the run's processes through /proc")
def test_sigint_in_process_stops_a_hanging_item_which_is_not_recorded(tmp_path):
    run = Run(tmp_path, "--only", "FT-OK-1", "FT-HANG", "FT-OK-2", "-j", "0", "--item-timeout", "120")
    run.wait_for("FT-OK-1")
    time.sleep(0.5)  # FT-HANG is hanging in the run's own process
    result, err, _ = run.stop(signal.SIGINT, 130)
    assert result["interrupted"] is True and result["signal"] == "SIGINT"
    assert _ids(result) == ["FT-OK-1"] and f"--resume {run.log}" in err
    lines = [json.loads(line) for line in run.log.read_text().splitlines()]
    assert [e["record"]["id"] for e in lines if e.get("event") == "item"] == ["FT-OK-1"]
    assert lines[-1]["event"] == "item"  # no end line: the run did not end


@pytest.mark.skipif(not HAS_PROC, reason="finds the run's processes through /proc")
def test_a_stop_before_any_item_ends_still_writes_a_result_marked_interrupted(tmp_path):
    run = Run(tmp_path, "--only", "FT-HANG", "-j", "0", "--item-timeout", "120")
    run.wait_for("kc ")  # the banner: contracts loaded, no item finished
    result, _, _ = run.stop(signal.SIGINT, 130)
    assert result["interrupted"] is True and _ids(result) == []


# -- the run loop's side, in process ----------------------------------------------------------------------


def test_in_process_items_run_under_the_item_deadline_and_passing_it_is_a_timeout():
    seen = []

    def fields(contract, item):
        seen.append(cancel.remaining())
        while True:  # an engine loop that checks the deadline (as Z3's timeout is sized from it)
            cancel.checkpoint()
            time.sleep(0.01)

    rec = InProcess(fields).run(None, {"id": "X"}, 0.3)
    assert 0 < seen[0] <= 0.3
    assert rec["status"] == "error" and rec["reason"].startswith("timeout") and rec["evidence"]["timeout_s"] == 0.3
    assert cancel.remaining() is None  # the deadline ends with the item


def test_an_item_that_returns_while_a_stop_is_requested_is_not_recorded(tmp_path, monkeypatch):
    real = check.item_fields

    def stopped_mid_item(contract, item, **kw):  # e.g. Z3 interrupted by the stop's callback: it returns unknown
        if item["id"] == "FT-OK-3":
            cancel.request_stop("SIGTERM")
        return real(contract, item, **kw)

    monkeypatch.setattr(check, "item_fields", stopped_mid_item)
    out, log = tmp_path / "r.json", tmp_path / "log.jsonl"
    argv = ["check", str(FAULTS), "--device", "host", "-j", "0", "--only", *OK, "-q"]
    assert main([*argv, "--json", str(out), "--log", str(log)]) == 143
    result = json.loads(out.read_text())
    assert _ids(result) == OK[:2] and result["signal"] == "SIGTERM"
    assert [k[2] for k in read_log(log).done] == OK[:2]
    assert cancel.stop_requested() is None  # the next run in this process starts afresh


# -- one run per log; resume past a corrupt line ----------------------------------------------------------


def test_a_second_run_on_a_log_in_use_stops_before_it_starts_and_names_the_holder(tmp_path, capsys, monkeypatch):
    log = tmp_path / "log.jsonl"
    held = RunLog(log, {"device": "host"})
    monkeypatch.setattr(check, "item_fields", lambda *a, **k: pytest.fail("ran an item with a log in use"))
    try:
        assert main(["check", str(FAULTS), "--device", "host", "--only", "FT-OK-1", "--log", str(log)]) == 2
    finally:
        held.close()
    err = capsys.readouterr().err
    assert f"{log}: the results log is in use by another kc check (pid {os.getpid()})" in err
    assert len(log.read_text().splitlines()) == 1  # the holder's log is untouched (not truncated)


def test_resume_skips_a_corrupt_line_with_a_warning_and_reuses_every_intact_record(tmp_path, capsys, monkeypatch):
    log = tmp_path / "log.jsonl"
    argv = ["check", str(FAULTS), "--device", "host", "-j", "0", "--only", *OK, "-q"]
    assert main([*argv, "--log", str(log)]) == 0
    lines = log.read_text().splitlines()
    lines[2] = lines[2][:40] + '{"spliced": ' + lines[2][40:]  # two runs' writes mixed in one line
    log.write_text("\n".join(lines[:-1]) + "\n")  # and no end line: the run was cut
    calls: list[str] = []
    real = check.item_fields
    monkeypatch.setattr(check, "item_fields", lambda c, it, **kw: (calls.append(it["id"]), real(c, it, **kw))[1])
    assert main(["check", "--resume", str(log), "-j", "0", "-q"]) == 0
    assert calls == [OK[1]]  # only the item of the corrupt line runs again
    assert f"{log}:3:1: not a JSON line of a results log; skipped" in capsys.readouterr().err


# -- every flag validated at parse time -------------------------------------------------------------------

BAD_FLAGS = [
    (["check", "-j", "-1"], "--jobs/-j"),
    (["check", "-j", "two"], "--jobs/-j"),
    (["check", "--item-timeout", "-5"], "--item-timeout"),
    (["check", "--item-timeout", "nan"], "--item-timeout"),
    (["check", "--item-timeout", "1e20"], "--item-timeout"),
    (["check", "--item-timeout", "inf"], "--item-timeout"),
    (["check", "--maxfail", "-1"], "--maxfail"),
    (["check", "--durations", "-2"], "--durations"),
    (["check", "--seed", "-3"], "--seed"),
    (["check", "--seed", str(1 << 64)], "--seed"),
    (["check", "--device", "tpu"], "--device"),
    (["check", "--profile", "huge"], "--profile"),
    (["check", "--isolate", "vm"], "--isolate"),
    (["check", "--z3-stability", "0"], "--z3-stability"),
    (["report", "--seed", "x"], "--seed"),
    (["report", "--device", "tpu"], "--device"),
    (["sweep", "relu", "--lo", "-5"], "--lo"),
    (["sweep", "relu", "--hi", str((1 << 32) + 1)], "--hi"),
    (["sweep", "relu", "--sample", "-1"], "--sample"),
    (["sweep", "relu", "--sample", str(10**11)], "--sample"),
    (["sweep", "relu", "--bound", "-1"], "--bound"),
    (["sweep", "add", "--operand", "0x1FFFFFFFF"], "--operand"),
    (["sweep", "relu", "--reference", "oracle"], "--reference"),
    (["replay", str(FAULTS), "FT-OK-1", "--bits", "zz"], "--bits"),
    (["replay", str(FAULTS), "FT-OK-1", "--bits", "1", "--scalars", "0x1,-2"], "--scalars"),
    (["replay", str(FAULTS), "FT-OK-1", "--bits", "1", "--seed", "-1"], "--seed"),
    (["graph", "check", "g.json", "--output", "-1"], "--output"),
    (["audit-libm", "--env", "x86"], "--env"),
]


@pytest.mark.parametrize(("argv", "flag"), BAD_FLAGS, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD_FLAGS])
def test_every_flag_with_a_bad_value_is_a_usage_error_naming_it(argv, flag, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sweep", "relu", "--lo", "100", "--hi", "5"], "--hi 5: must be in (100, "),
        (["sweep", "add", "--fmt", "binary16", "--lo", "5", "--hi", "5"], "--hi 5"),
        (["sweep", "add", "--fmt", "binary16", "--sample", "8"], "--sample 8"),
        (["sweep", "neg", "--fmt", "e4m3", "--hi", "300"], "--hi 300: must be in (0, 256]"),
    ],
)
def test_sweep_ranges_and_samples_are_checked_before_anything_runs(argv, message, capsys):
    assert main([*argv, "--device", "host"]) == 2
    assert message in capsys.readouterr().err


def test_maxfail_0_is_no_limit_and_never_a_green_exit(tmp_path, capsys):
    argv = ["check", str(FAULTS), "--device", "host", "-j", "0", "--only", "FT-RAISES", "FT-OK-1", "--maxfail", "0"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "2 items: 1 passed, 1 error" in out and "reached" not in out


def test_unwritable_outputs_fail_before_any_item_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(check, "item_fields", lambda *a, **k: pytest.fail("ran an item with an unwritable output"))
    base = ["check", str(FAULTS), "--device", "host", "--only", "FT-OK-1"]
    for flag in ("--json", "--junit", "--sarif", "--log", "--timeline"):
        assert main([*base, flag, "/proc/x.json"]) == 2
        assert f"{flag} /proc/x.json: " in capsys.readouterr().err


@pytest.mark.parametrize(("code", "name"), [(errno.EROFS, "read-only"), (errno.EFBIG, "too large")])
def test_os_errors_on_outputs_are_exit_2_with_the_path_and_the_reason(tmp_path, monkeypatch, capsys, code, name):
    from obligations import atomic

    def refuse(path, data):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(atomic, "write_bytes_atomic", refuse)
    sample = ROOT / "tests" / "fixtures" / "result_sample.json"
    assert main(["report", "--from", str(sample), "--out", str(tmp_path / "out"), "--no-plots", "--force"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'out'}" in err and name in err.lower() and "Traceback" not in err


# -- bad JSON in, raw HTML out ----------------------------------------------------------------------------


def _deep_graph(tmp_path: Path, depth: int) -> Path:
    path = tmp_path / "deep.json"
    attrs = "{" + '"a": {' * depth + "}" * depth + "}"
    path.write_text('{"nodes": [{"id": 0, "kind": "input", "parents": [], "out_shape": [2], "attrs": ' + attrs + "}]}")
    return path


@pytest.mark.parametrize("command", [["graph", "check"], ["graph", "show"], ["report", "--from"]])
def test_deeply_nested_json_is_a_located_error(tmp_path, capsys, command):
    deep = tmp_path / "deeper.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for path in (deep, _deep_graph(tmp_path, 5000)):
        assert main([*command, str(path), *(["--out", str(tmp_path / "o")] if command[0] == "report" else [])]) == 2
        err = capsys.readouterr().err
        assert f"{path}:1:" in err and "nested more than 64 levels deep" in err


def test_a_result_with_an_unknown_status_is_refused(tmp_path, capsys):
    result = json.loads((ROOT / "tests" / "fixtures" / "result_sample.json").read_text())
    result["contracts"][0]["items"][0]["status"] = "fine"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    assert main(["report", "--from", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "has status 'fine', not one of proved" in capsys.readouterr().err


def test_markdown_reports_carry_no_raw_html_from_contracts_or_results():
    from obligations.reporting.markdown import render_contract_markdown, render_index_markdown

    result = json.loads((ROOT / "tests" / "fixtures" / "result_sample.json").read_text())
    contract = result["contracts"][0]
    contract["summary"] = "<script>alert(1)</script>"
    item = contract["items"][0]
    item.update(property="<img src=x onerror=alert(1)>", reason="<!-- x --> ``` <b>", status="error")
    item["counterexample"] = {"note": "```\n<script>x</script>"}
    md = render_contract_markdown(result, contract) + render_index_markdown(result)
    outside_fences = []
    fence = None
    for line in md.splitlines():
        ticks = line[: len(line) - len(line.lstrip("`"))]
        if len(ticks) >= 3 and (fence is None or ticks == fence):
            fence = None if fence else ticks
        elif fence is None:
            outside_fences.append(line)
    text = "\n".join(outside_fences)
    for raw in ("<script", "<img", "<!-- x", "<b>"):
        assert raw not in text
    assert "&lt;script>alert(1)&lt;/script>" in text


# -- a seeded sample of the input fuzzing (benchmarks/fuzz_loader.py --graphs/--results/--cli runs 10,000) --


def test_fuzzed_graphs_results_and_command_lines_end_without_a_traceback(tmp_path):
    import random

    from tests import input_fuzzing as fz

    bad = []
    for i in range(16):
        v = fz.graph_verdict(fz.json_mutant(fz.GRAPH, random.Random(i)), tmp_path)
        bad += [("graph", i, v.problem)] if v.problem else []
    for i in range(3):
        v = fz.result_verdict(fz.json_mutant(fz.RESULT, random.Random(i)), tmp_path)
        bad += [("result", i, v.problem)] if v.problem else []
    for i in range(8):
        argv = fz.cli_mutant(random.Random(i), tmp_path)
        v = fz.cli_verdict(argv, tmp_path)
        bad += [("cli", argv, v.problem)] if v.problem else []
    assert bad == []
