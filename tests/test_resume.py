"""Nothing lost (#17.1) and determinism (#17.5): results log, --resume, atomic writes, same seed same result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from obligations import atomic, check
from obligations.cli import main

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "fixtures" / "faults" / "faults-v1.yaml"
GEMM = next((ROOT / "contracts").glob("*gemm-v1.yaml"), None) or next((ROOT / "contracts").glob("*cublas*.yaml"))
QUICK = ["PO-GEMM-02-A-z3", "KANI-CUBLAS-001-A", "PO-GEMM-03", "PO-GEMM-04"]  # in contract order
VOLATILE = frozenset({"seconds", "started", "argv"})


def _differences(a, b, path: str = "") -> list[str]:
    """Where two JSON values differ: ``path: a != b`` lines (at most 20)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only in {'a' if k in a else 'b'}" for k in sorted(set(a) ^ set(b), key=str)]
        for k in sorted(set(a) & set(b), key=str):
            out += _differences(a[k], b[k], f"{path}/{k}")
        return out[:20]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for n, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{n}]")][:20]
    return [] if a == b else [f"{path}: {str(a)[:200]} != {str(b)[:200]}"]


def _stable(value, volatile=VOLATILE):
    """The result without timings (``*seconds``), timestamps and the command line."""
    if isinstance(value, dict):
        return {k: _stable(v, volatile) for k, v in value.items() if k not in volatile and "seconds" not in k}
    if isinstance(value, list):
        return [_stable(v, volatile) for v in value]
    return value


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_results_log_has_one_flushed_line_per_finished_item(tmp_path, monkeypatch):
    log = tmp_path / "log.jsonl"
    seen: list[int] = []
    real = check.item_fields

    def spy(*args, **kwargs):  # when an item starts, every earlier item is already on disk
        seen.append(len(log.read_text().splitlines()))
        return real(*args, **kwargs)

    monkeypatch.setattr(check, "item_fields", spy)
    # -j 0: every item in this process, where the spy sees it (with -j the proofs run in worker processes)
    assert main(["check", str(GEMM), "--device", "host", "-j", "0", "--only", *QUICK, "--log", str(log), "-q"]) == 0
    assert seen == [1, 2, 3, 4]  # header, then one line per finished item
    events = _lines(log)
    assert events[0]["log"] == "kc-results-log/1" and events[0]["seed"] == 0
    assert [e["record"]["id"] for e in events[1:-1]] == QUICK and events[-1] == {"event": "end", "exit_code": 0}


def test_ctrl_c_writes_the_partial_result_and_resume_finishes_it_without_redoing(tmp_path, monkeypatch, capsys):
    log, partial, resumed, full = (tmp_path / n for n in ("log.jsonl", "partial.json", "resumed.json", "full.json"))
    argv = ["check", str(GEMM), "--device", "host", "-j", "0", "--only", *QUICK, "-q"]  # in process: spied on
    assert main([*argv, "--json", str(full)]) == 0
    real = check.item_fields
    calls: list[str] = []

    def interrupt_third(contract, item, **kwargs):
        calls.append(item["id"])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(contract, item, **kwargs)

    monkeypatch.setattr(check, "item_fields", interrupt_third)
    assert main([*argv, "--json", str(partial), "--log", str(log)]) == 130
    part = json.loads(partial.read_text())
    assert part["interrupted"] is True and len(part["contracts"][0]["items"]) == 2
    captured = capsys.readouterr()
    assert "2 items:" in captured.out and "(interrupted)" in captured.out  # the partial summary
    assert f"resume with kc check --resume {log}" in captured.err
    assert len(_lines(log)) == 3  # header + the two finished items
    calls.clear()
    monkeypatch.setattr(
        check, "item_fields", lambda contract, item, **kw: (calls.append(item["id"]), real(contract, item, **kw))[1]
    )
    assert main(["check", "--resume", str(log), "-j", "0", "--json", str(resumed), "-q"]) == 0
    assert calls == QUICK[2:]  # the finished items were not run again
    # z3's rlimit_used depends on what ran before in the same process (its global context): a measurement
    volatile = VOLATILE | {"rlimit_used"}
    assert _stable(json.loads(resumed.read_text())["contracts"], volatile) == _stable(
        json.loads(full.read_text())["contracts"], volatile
    )
    assert _lines(log)[-1]["event"] == "end"


def test_resume_refuses_other_settings_and_a_file_that_is_no_log(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    assert main(["check", str(GEMM), "--device", "host", "--only", "PO-GEMM-03", "--log", str(log), "-q"]) == 0
    assert main(["check", "--resume", str(log), "--seed", "7"]) == 2
    assert "the log ran with seed 0, not 7" in capsys.readouterr().err
    assert main(["check", "--resume", str(GEMM)]) == 2
    assert "not a kc results log" in capsys.readouterr().err


def test_json_is_written_atomically_and_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    target.write_text("old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic.write_text_atomic(target, "new")
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]  # no temporary left behind


def test_same_seed_gives_the_same_result_json(tmp_path):
    """Determinism: two host runs with one seed differ only in timings, timestamps and the command line."""
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    items = [*QUICK, "PO-GEMM-02-*"]
    for out in outs:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "obligations.cli",
                "check",
                str(GEMM),
                str(FAULTS),
                "--device",
                "host",
                "--seed",
                "3",
                "--only",
                *items,
                "FT-OK-*",
                "FT-RAISES",
                "--json",
                str(out),
                "-q",
                "--no-proof-cache",  # both runs compute their proofs: a reused proof says so (cache: hit)
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 1, proc.stderr
    a, b = (_stable(json.loads(o.read_text())) for o in outs)
    assert a == b, _differences(a, b)  # the paths that differ: a failure says where
    assert a["provenance"]["seed"] == 3
