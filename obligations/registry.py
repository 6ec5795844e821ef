"""What both sides import: kc's subcommand registry and the modules that register plug-ins.

The CLI and the engine table discover subcommands and engines by registration: a plug-in module imports this
module (or ``obligations.engines``) to register itself, and :func:`load_plugins` imports the plug-in modules
named here, so no module imports the CLI (or the engine table imports its engines) to be registered.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

__all__ = ["COMMANDS", "command", "PLUGINS", "load_plugins"]

COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}

# Modules that register themselves when imported, by what they register.
PLUGINS: dict[str, tuple[str, ...]] = {
    "commands": ("obligations.graph_cli", "obligations.libm_audit", "obligations.torch_audit"),
    "engines": ("obligations.audit", "obligations.regimes", "obligations.sanitize"),
}


def command(name: str, help_text: str) -> Callable:
    """Register a subcommand: ``configure(parser)`` adds its options, the decorated function runs it."""

    def deco(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = (getattr(run, "configure", lambda p: None), run)
        run.help_text = help_text  # type: ignore[attr-defined]
        return run

    return deco


def load_plugins(kind: str) -> None:
    """Import every module registered under ``kind`` (``commands`` or ``engines``); a module is imported once."""
    for module in PLUGINS[kind]:
        importlib.import_module(module)
