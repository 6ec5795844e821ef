"""Documentation that is code runs: every ```python block of the pages below, on the host."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    "docs/gemm.md",
    "docs/reductions.md",
    "docs/indexing.md",
    "docs/graphs.md",
    "docs/scan.md",
    "docs/fft.md",
    "docs/fusion.md",
    "docs/training.md",
    "docs/coverage.md",
    "docs/torch-audit.md",
    "docs/triton.md",
]


def _python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.S)


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_run(page: str, tmp_path: Path) -> None:
    blocks = _python_blocks(page)
    assert blocks, f"{page} has no python block to run"
    for i, code in enumerate(blocks):
        script = tmp_path / f"block{i}.py"
        script.write_text(code)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{page} block {i}:\n{done.stdout}\n{done.stderr}"
