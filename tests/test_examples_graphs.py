"""examples/README.md's graph section: the example files are what make_graph_examples.py writes, and every
``kc graph`` command of the README runs (exit 0) from the examples folder."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnx")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def test_example_files_are_what_the_script_writes(tmp_path: Path) -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        import make_graph_examples as mk
    finally:
        sys.path.pop(0)
    for p in mk.write(tmp_path):
        assert p.read_bytes() == (EXAMPLES / p.name).read_bytes(), f"examples/{p.name} is stale: rerun the script"


def _commands() -> list[list[str]]:
    text = (EXAMPLES / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [shlex.split(line) for b in blocks for line in b.splitlines() if line.startswith("kc graph")]


@pytest.mark.parametrize("cmd", _commands(), ids=lambda c: " ".join(c[2:]))
def test_readme_graph_commands_run(cmd: list[str]) -> None:
    from obligations.cli import main as kc

    if any(a.startswith("models/") for a in cmd) and not (EXAMPLES / cmd[3]).exists():
        pytest.skip(f"examples/{cmd[3]} is not exported yet")
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(EXAMPLES)
    try:
        with contextlib.redirect_stdout(out):
            code = kc(cmd[1:])
    finally:
        os.chdir(cwd)
    assert code == 0, out.getvalue()
    if cmd[-1] == "--bits":
        assert "[0xbfaa6f26, 0x3ff38e00, 0x4075ccdc]" in out.getvalue()


def test_a_refused_onnx_model_does_not_load_and_names_the_node(tmp_path: Path) -> None:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save

    from obligations.cli import main as kc

    inits = [numpy_helper.from_array(np.ones(2, np.float32), n) for n in ("s", "b", "m", "v")]
    g = helper.make_graph(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn", training_mode=1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3])],
        inits,
    )
    path = tmp_path / "bn.onnx"
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)]), str(path))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = kc(["graph", "check", str(path)])
    want = "ONNX node 0 'bn' (BatchNormalization): attribute training_mode=1 is not supported"
    assert code == 2 and want in err.getvalue(), err.getvalue()


def test_trace_of_an_onnx_model_without_input_says_what_to_give() -> None:
    from obligations.cli import main as kc

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = kc(["graph", "show", str(EXAMPLES / "tiny_cnn.onnx"), "--trace"])
    assert code == 1 and "give them, --trace INPUT" in out.getvalue(), out.getvalue()
