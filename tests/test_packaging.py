"""The wheel is enough (issue 10, item 5): built, installed into a fresh venv, it validates and checks a contract.

Offline: the wheel is built without build isolation and installed with ``--no-deps`` into a venv that sees
the running environment's site-packages (z3, numpy, ruamel.yaml, ... are not downloaded again). "The running
environment" is the one pytest runs in: a venv as the README says, or the system Python as CI's does. A venv
made with ``--system-site-packages`` from a venv's interpreter sees the *base* Python's packages, not the venv's,
so the new venv gets a ``.pth`` file naming the running interpreter's site directories instead.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "obligations", "spec", "native", "falsification")


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(map(str, argv))}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _site_dirs() -> list[str]:
    """The running interpreter's site directories (a venv's own, or the system Python's), user site included."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir()]


def _see_running_site_packages(python: Path) -> None:
    """Append the running environment's site directories to ``python``'s sys.path (after its own site-packages).

    Plain path lines: the directories' own .pth files (the checkout's editable install among them) stay unread,
    so ``obligations`` can only come from the wheel installed into the new venv.
    """
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib).mkdir(parents=True, exist_ok=True)
    (Path(purelib) / "_kc_test_running_env.pth").write_text("\n".join(_site_dirs()) + "\n")


def test_a_venv_made_by_the_test_sees_the_running_environments_packages(tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    _see_running_site_packages(python)
    out = _run([str(python), "-c", "import ruamel.yaml, z3, numpy; print(numpy.__file__)"], tmp_path).stdout
    assert not Path(out.strip()).is_relative_to(venv)


def test_an_installed_wheel_validates_and_checks_a_scaffolded_contract(tmp_path):
    missing = [m for m in ("setuptools", "wheel") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"building the wheel offline needs {', '.join(missing)} (pip install -e '.[test]')")
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info beside its sources
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
        tmp_path,
    )
    (wheel,) = dist.glob("kernel_contracts-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    _see_running_site_packages(python)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--ignore-installed",
            "--no-index",
            str(wheel),
        ],
        tmp_path,
    )

    work = tmp_path / "elsewhere"  # outside the repository, as a user's project would be
    (work / "mykernels").mkdir(parents=True)
    (work / "mykernels" / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(work)  # the user's test module, as in docs/tutorial.md
    where = _run(
        [str(python), "-c", "import obligations.contract as c; print(c.__file__); print(c.SCHEMA_PATH)"], work, env
    ).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), where  # the installed copy, not the checkout
    assert Path(where[1]).is_file()
    kc = str(venv / "bin" / "kc")
    _run(
        [kc, "new", "demo-v1", "--family", "demo", "--contracts-dir", "contracts", "--tests-dir", "mykernels"],
        work,
        env,
    )
    out = _run([kc, "validate", "contracts/demo-v1.yaml"], work, env).stdout
    assert "1 contract file(s) valid" in out
    out = _run([kc, "check", "contracts/demo-v1.yaml", "--device", "host", "--json", "r.json"], work, env).stdout
    assert "skipped" in out and (work / "r.json").is_file()


def test_a_fresh_venv_installs_as_the_readme_says_and_runs_part_of_the_suite(tmp_path):
    """#30: the README's install (pip install -e '.[test]' into a fresh venv) works and the suite runs there.

    Offline: the venv sees the running environment's site directories (the dependencies), and pip is told
    --no-index, so a dependency the extra names that is not installed fails the install instead of downloading.
    """
    missing = [m for m in ("setuptools", "wheel") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"an offline editable install needs {', '.join(missing)} (pip install -e '.[test]')")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    _see_running_site_packages(python)
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index"]
    _run([*pip, "--no-build-isolation", "-e", f"{ROOT}[test]"], tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    assert "kernel-contracts" in _run([str(venv / "bin" / "kc"), "--help"], ROOT, env).stdout
    out = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_expr.py"], ROOT, env).stdout
    assert " passed" in out and "failed" not in out
