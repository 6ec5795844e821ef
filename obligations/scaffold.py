"""`kc new NAME --family F`: a contract and its falsification-test module, every item skipped until written.

Scaffolded items are visible and never passing: the obligation is ``pending: not implemented`` and the
falsification test is registered but returns ``skipped("not implemented")``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = [
    "scaffold_contract",
    "ScaffoldError",
    "module_name_for",
    "default_tests_dir",
    "in_kc_checkout",
    "KC_PACKAGES",
]

_IDENT = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)*$")  # the schema's ident: a safe file name

CONTRACT_TEMPLATE = """\
# yaml-language-server: $schema={schema}
# Scaffolded by `kc new {name} --family {family}`. Every item is reported skipped until you write it:
# replace each TODO, remove `pending` once an obligation has its statement, and fill in the test in
# {module_path}.
id: {name}
version: 0.1.0
family: {family}
summary: "TODO: one sentence saying what the kernel computes and what this contract claims about it."
references: []
test_modules: [{module}]
kernels:
  main:
    entry: {module}:kernel
    plan: {module}:plan
symbols:
  n: {{type: int32, min: 1, max: 2147483647, doc: number of elements}}
equations:
  {snake}:
    formula: "TODO: y[i] = f(x[i]) for 0 <= i < n"
    domain: "n >= 1"
obligations:
  - id: PO-{tag}-001
    type: invariant
    property: "TODO: every element the kernel reads or writes lies inside its buffers"
    equation: {snake}
    method: z3
    pending: not implemented
falsification:
  - id: FT-{tag}-001
    rule: "TODO: the kernel is bitwise equal to its reference"
    prediction: "every output element has the reference's bits"
    if_fails: "the kernel rounds or orders operations differently from the reference"
    test: {test_name}
    agreement: bitwise
qa_gate:
  id: F-{tag}-001
  description: "TODO: what passing this gate allows"
  requires: [FT-{tag}-001]
"""

MODULE_TEMPLATE = '''\
"""Falsification tests for the {name} contract (scaffolded by `kc new`).

``plan`` and ``kernel`` are placeholders the contract names until the real kernel exists: point the
contract's ``kernels.main`` at your kernel's entry point and launch plan, then write the test below.
"""

from __future__ import annotations

from typing import Any

from falsification.registry import FalsifyContext, register_test
from obligations.core.results import Outcome, skipped


def plan(n: Any) -> dict[str, Any]:
    """Launch/buffer plan placeholder: the quantities the contract's statements may name."""
    return {{"elements": n}}


def kernel(*args: Any, **kwargs: Any) -> None:
    """Kernel entry point placeholder."""
    raise NotImplementedError("scaffolded by kc new: point contracts/{name}.yaml at the real kernel")


@register_test("{test_name}")
def {func}(ctx: FalsifyContext) -> Outcome:
    """{name}: the kernel is bitwise equal to its reference (not written yet)."""
    return skipped("not implemented")
'''


class ScaffoldError(ValueError):
    """The name or family cannot make a contract, or a file it would write already exists."""


def module_name_for(path: Path) -> str:
    """The importable dotted name of the module at ``path`` (its package chain up to the first non-package)."""
    path = path.resolve()
    parts = [path.stem]
    parent = path.parent
    while (parent / "__init__.py").is_file():
        parts.append(parent.name)
        parent = parent.parent
    return ".".join(reversed(parts))


def _schema_ref(contracts_dir: Path) -> str:
    """The installed schema as seen from ``contracts_dir``: a relative path, or a file URI across drives."""
    from obligations.contract import SCHEMA_PATH

    try:
        return Path(os.path.relpath(SCHEMA_PATH, contracts_dir.resolve())).as_posix()
    except ValueError:
        return SCHEMA_PATH.as_uri()


# kc's own top-level packages: a user's test package must not share a name with one (it would shadow it).
KC_PACKAGES = frozenset({"obligations", "falsification", "spec", "native"})
USER_TESTS_DIR = "contract_tests"  # outside kc's checkout: a package of the user's project, importable from its root


def in_kc_checkout(where: str | Path = ".") -> bool:
    """True when ``where`` is the root of kc's own source checkout (where falsification/ is kc's package)."""
    here = Path(where).resolve()
    return (here / "obligations" / "cli.py").resolve() == (Path(__file__).resolve().parent / "cli.py")


def default_tests_dir() -> str:
    """``falsification`` inside kc's checkout (registered automatically), else ``contract_tests``."""
    return "falsification" if in_kc_checkout() else USER_TESTS_DIR


def scaffold_contract(
    name: str, family: str, contracts_dir: str | Path, tests_dir: str | Path | None = None
) -> list[Path]:
    """Write ``contracts_dir/NAME.yaml`` and ``tests_dir/<name>_tests.py``; return both; never overwrite.

    Outside kc's checkout the test module goes into a package (``contract_tests/`` by default, with an
    ``__init__.py``) that kc imports from the project root it puts on ``sys.path``, as pytest's rootdir.
    """
    tests_dir = Path(tests_dir if tests_dir is not None else default_tests_dir())
    user_project = not in_kc_checkout()
    if user_project and tests_dir.resolve().name in KC_PACKAGES:
        raise ScaffoldError(
            f"--tests-dir {tests_dir}: a package named {tests_dir.resolve().name!r} would shadow "
            f"kc's own; use another name (default: {USER_TESTS_DIR})"
        )
    if not _IDENT.match(name):
        raise ScaffoldError(f"contract name {name!r} must match {_IDENT.pattern} (letters, digits, _ . -)")
    if not family.strip() or "\n" in family or ":" in family:
        raise ScaffoldError(f"family {family!r} must be a short single-line word, e.g. gemm or reduction")
    snake = re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_").lower()
    tag = re.sub(r"[^0-9a-zA-Z]+", "-", name).strip("-").upper()
    contract_path = Path(contracts_dir) / f"{name}.yaml"
    module_path = Path(tests_dir) / f"{snake}_tests.py"
    for path in (contract_path, module_path):
        if path.exists():
            raise ScaffoldError(f"{path} already exists; kc new never overwrites")
    module_path.parent.mkdir(parents=True, exist_ok=True)
    contract_path.parent.mkdir(parents=True, exist_ok=True)
    init = module_path.parent / "__init__.py"
    if user_project and not init.exists():
        init.write_text(
            '"""Falsification tests of this project\'s kernel contracts (kc imports them)."""\n', encoding="utf-8"
        )
    module = module_name_for(module_path)
    fields = {
        "name": name,
        "family": family.strip(),
        "snake": snake,
        "tag": tag,
        "module": module,
        "module_path": module_path.as_posix(),
        "test_name": f"{snake}.bitwise_vs_reference",
        "func": "bitwise_vs_reference",
        "schema": _schema_ref(contract_path.parent),
    }
    module_path.write_text(MODULE_TEMPLATE.format(**fields), encoding="utf-8")
    contract_path.write_text(CONTRACT_TEMPLATE.format(**fields), encoding="utf-8")
    return [contract_path, module_path]
