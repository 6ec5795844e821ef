"""`kc` starts fast: the sweep and help paths import none of the heavy libraries they do not use (#16.2).

Each command runs in a fresh interpreter and reports which heavy modules ended up in ``sys.modules``.
sympy alone took 3.85 s to import on a fresh GPU machine; z3 loads a 30 MB shared library; hypothesis,
jsonschema and ruamel are for proofs, falsification and contract loading, none of which ``kc sweep`` does.
A planted regression (a module-level ``import sympy`` in a module on the sweep path) must be caught.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from obligations.core.device import cuda_available

ROOT = Path(__file__).resolve().parent.parent

# The heavy imports and who may pay for them: sympy (the sympy engine, statement rendering), z3 (proofs),
# hypothesis (falsification, sampled sweeps), jsonschema/ruamel (contract loading), cupy (cuda runs only).
HEAVY = ("sympy", "z3", "hypothesis", "jsonschema", "ruamel.yaml", "matplotlib", "cupy", "scipy", "numpy")

# Runs `kc ARGV` in-process in a fresh interpreter and writes {"rc", "heavy"} to OUT. PLANT "module:heavy"
# makes ``module`` import ``heavy`` first thing when it is executed, as a module-level import would.
_PROBE = """
import importlib.machinery, json, sys
plant, out, argv, heavy = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
if plant:
    target, extra = plant.split(":")

    class Plant:
        def find_spec(self, name, path=None, target_=None):
            if name != target:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module

            def exec_module(module):
                __import__(extra)
                run(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Plant())
from obligations.cli import main
try:
    rc = main(argv)
except SystemExit as e:
    rc = e.code
with open(out, "w") as f:
    json.dump({"rc": rc, "heavy": sorted(m for m in heavy if m in sys.modules)}, f)
"""


def _heavy_after(argv: list[str], tmp_path: Path, plant: str = "") -> tuple[int, list[str]]:
    """(exit code, heavy modules imported) of ``kc ARGV`` run in a fresh interpreter."""
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, plant, str(out), json.dumps(argv), json.dumps(HEAVY)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.is_file(), proc.stderr[-3000:]
    res = json.loads(out.read_text())
    return res["rc"], res["heavy"]


HOST_SWEEPS = [
    ["sweep", "neg", "--device", "host", "--hi", "0x1000"],
    ["sweep", "sqrt", "--device", "host", "--hi", "0x1000"],
    ["sweep", "exp", "--device", "host", "--hi", "0x1000"],
    ["sweep", "add", "--operand", "0x3F800000", "--device", "host", "--hi", "0x1000"],
    ["sweep", "neg", "--fmt", "binary16", "--device", "host"],
]


@pytest.mark.parametrize("argv", [["--help"], ["sweep", "--help"], ["check", "--help"], *HOST_SWEEPS], ids=" ".join)
def test_help_and_host_sweeps_import_no_heavy_library(argv, tmp_path):
    rc, heavy = _heavy_after(argv, tmp_path)
    assert rc == 0
    assert heavy == ([] if "--help" in argv else ["numpy"])  # help needs no arrays; a host sweep needs NumPy only


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_available()[0], reason="no CUDA device")
@pytest.mark.parametrize("op", [["neg"], ["sqrt"], ["exp"], ["div", "--operand", "0x40400000"]], ids=" ".join)
def test_cuda_sweeps_import_no_proof_or_falsification_library(op, tmp_path):
    rc, heavy = _heavy_after(["sweep", *op, "--device", "cuda", "--hi", "0x100000"], tmp_path)
    assert rc == 0
    assert heavy == ["cupy", "numpy"]  # not scipy: cupyx.scipy pulls in scipy.sparse, ~0.5 s on a fresh machine


@pytest.mark.parametrize(
    ("plant", "heavy"),
    [
        ("native.sweep_compare:sympy", "sympy"),
        ("falsification.sweep:z3", "z3"),
        ("spec.elementwise:hypothesis", "hypothesis"),
    ],
)
def test_a_planted_module_level_import_on_the_sweep_path_is_caught(plant, heavy, tmp_path):
    rc, found = _heavy_after(HOST_SWEEPS[0], tmp_path, plant=plant)
    assert rc == 0
    assert heavy in found


def test_loading_contracts_and_engines_does_not_import_sympy(tmp_path):
    # kc check's worker processes import these and parse their contract before their first item: sympy is
    # for the sympy engine only, jsonschema for validating (which the parent process did).
    code = (
        "import sys, obligations.contract as c, obligations.engines, obligations.expr, obligations.statements\n"
        "c.parse_contract('contracts/rng-splitmix64-v1.yaml')\n"
        "print(sorted(m for m in ('sympy', 'jsonschema') if m in sys.modules))\n"
        "c.load_contract('contracts/rng-splitmix64-v1.yaml')\n"
        "print(sorted(m for m in ('sympy', 'jsonschema') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["[]", "['jsonschema']"]


def test_rendering_an_expression_still_imports_sympy_when_asked():
    from obligations.expr import parse

    e = parse("int64(cdiv(n, 4)) * 2 <= max(n, 8) implies select(n > 0, 1, 0) == 1")
    assert "ceiling" in str(e.to_sympy())
    assert e.to_text() and e.to_latex()
