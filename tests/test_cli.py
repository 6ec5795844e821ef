"""`kc` end to end: exit codes, the JSON result, loud failure without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from obligations.cli import main

ROOT = Path(__file__).resolve().parent.parent
GEMM = ROOT / "contracts" / "gemm-cublas-v1.yaml"
SHAPE = ["PO-GEMM-02-A-z3", "KANI-CUBLAS-001-A", "PO-GEMM-04"]


def test_check_writes_the_json_result_and_exits_0(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["check", str(GEMM), "--device", "host", "--only", *SHAPE, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result) >= {"tool", "provenance", "contracts", "summary", "exit_code"}
    assert set(result["provenance"]) >= {"commit", "python", "packages", "device", "started", "seconds"}
    (contract,) = result["contracts"]
    assert set(contract) >= {"id", "version", "path", "sha256", "items"}
    items = {it["id"]: it for it in contract["items"]}
    assert items["PO-GEMM-02-A-z3"]["status"] == "proved"
    assert items["KANI-CUBLAS-001-A"]["status"] == "exhausted"
    assert items["PO-GEMM-04"]["status"] == "skipped"
    for it in items.values():
        assert set(it) >= {"id", "kind", "method", "status", "claim", "evidence", "counterexample", "seconds"}
    text = capsys.readouterr().out
    assert "proved     PO-GEMM-02-A-z3" in text and "3 items: 1 proved, 1 exhausted, 1 skipped" in text


def test_only_takes_globs_and_accumulates_when_repeated(tmp_path):
    out = tmp_path / "r.json"
    argv = ["check", str(GEMM), "--device", "host", "--only", "PO-GEMM-02-*-z3", "--only", "PO-GEMM-03"]
    assert main([*argv, "--json", str(out)]) == 0
    ids = [it["id"] for it in json.loads(out.read_text())["contracts"][0]["items"]]
    assert ids == [
        "PO-GEMM-02-A-z3",
        "PO-GEMM-02-B-z3",
        "PO-GEMM-02-C-z3",
        "PO-GEMM-02-complete-z3",
        "PO-GEMM-02-overflow-z3",
        "PO-GEMM-03",
    ]


def test_strict_fails_on_skipped_items():
    faults = ROOT / "tests" / "fixtures" / "faults" / "faults-v1.yaml"
    assert main(["check", str(faults), "--device", "host", "--only", "FT-EXIT"]) == 0
    assert main(["check", str(faults), "--device", "host", "--only", "FT-EXIT", "--strict"]) == 1


def test_a_violated_item_exits_1_and_prints_the_counterexample(tmp_path, capsys):
    path = tmp_path / "g.yaml"
    path.write_text(GEMM.read_text().replace("native.gemm:gemm_plan", "tests.planted.gemm_bugs:plan_missing_elem_size"))
    assert main(["check", str(path), "--device", "host", "--only", "PO-GEMM-02-A-z3"]) == 1
    out = capsys.readouterr().out
    assert "violated" in out and "counterexample" in out and "replay: kc check" in out
    assert "{" not in out.split("counterexample", 1)[1].splitlines()[1]  # name = value lines, not cut JSON


def test_invalid_contract_and_usage_exit_2(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(GEMM.read_text().replace("method: z3", "method: z4", 1))
    assert main(["check", str(path), "--device", "host"]) == 2
    assert main(["check", "--device", "gpu"]) == 2
    assert main(["check", str(GEMM), "--device", "host", "--only", "NO-SUCH-ID"]) == 2


def test_device_cuda_without_a_gpu_is_an_error_not_a_host_run(capsys):
    from obligations.core.device import cuda_available

    if cuda_available()[0]:
        pytest.skip("a CUDA device is present: this test is about machines without one")
    assert main(["check", str(GEMM), "--device", "cuda", "--only", "PO-GEMM-02-A-z3"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "unavailable" in err


def test_kc_console_script_runs_the_main_job():
    """The installed `kc` entry point (README's first command) prints per-item statuses."""
    proc = subprocess.run(
        [sys.executable, "-m", "obligations.cli", "check", str(GEMM), "--device", "host"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "proved     PO-GEMM-02-overflow-z3" in proc.stdout
    assert "skipped    FALSIFY-CUBLAS-003" in proc.stdout


def test_kc_sweep_small_format_and_sampled_binary32(capsys):
    assert main(["sweep", "sqrt", "--device", "host", "--sample", "4096"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["elements"] == 4096 and out["disagreements"] == 0 and not out["exhaustive"]


def test_kc_sweep_of_a_planted_bug_exits_1(capsys):
    from falsification.sweep import sweep

    # The same sweep machinery on a fast-math build of inv flags disagreements (subnormals flushed).
    report = sweep("inv", None, device="host", sample=1 << 14, variant="fast_math")
    assert report["disagreements"] > 0


def test_kc_replay_rechecks_one_element(capsys):
    ew = ROOT / "contracts" / "elementwise-float32-v1.yaml"
    assert (
        main(
            [
                "replay",
                str(ew),
                "FALSIFY-EW-ADD-bitwise",
                "--bits",
                "0x00000001,0x00000000",
                "--device",
                "host",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "passed" and out["evidence"]["cases"] == 1


def test_kc_commit_names_the_commit_of_a_copied_tree(monkeypatch):
    from obligations.check import provenance

    monkeypatch.setenv("KC_COMMIT", "0123abc")
    prov = provenance({"kind": "host"}, 0.0)
    assert prov["commit"] == "0123abc" and prov["dirty"] is False
