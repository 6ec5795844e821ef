"""The ``kc`` command: validate, check, report, sweep, explain, new.

Exit codes: 0 nothing violated or errored; 1 something violated or errored (with --strict also anything
unknown or skipped); 2 invalid contract or usage (including --device cuda without a working GPU);
3 internal error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from obligations import __version__

__all__ = ["main", "COMMANDS"]

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_INTERNAL = 0, 1, 2, 3
DEFAULT_CONTRACTS = "contracts"

COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def command(name: str, help_text: str) -> Callable:
    """Register a subcommand: ``configure(parser)`` adds its options, the decorated function runs it."""

    def deco(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = (getattr(run, "configure", lambda p: None), run)
        run.help_text = help_text  # type: ignore[attr-defined]
        return run

    return deco


def _configure(fn: Callable[[argparse.ArgumentParser], None]) -> Callable:
    def attach(run: Callable) -> Callable:
        run.configure = fn
        return run

    return attach


_STATUS_COLOURS = {"proved": "32", "exhausted": "32", "passed": "32", "violated": "31", "error": "31",
                   "unknown": "33", "skipped": "90"}


def _paint(text: str, status: str, enabled: bool) -> str:
    return f"\x1b[{_STATUS_COLOURS.get(status, '0')}m{text}\x1b[0m" if enabled else text


class _Progress:
    """Per-contract and per-item lines; a live 'running' line on a terminal."""

    def __init__(self, stream: Any = None):
        self.stream = stream if stream is not None else sys.stdout
        self.tty = self.stream.isatty() and os.environ.get("NO_COLOR") is None

    def __call__(self, event: str, data: dict[str, Any] | None) -> None:
        if event == "contract":
            print(f"{data['id']} {data['version']}  ({data['path']})", file=self.stream, flush=True)
        elif event == "start" and self.tty:
            print(f"  running    {data['id']} ...", end="\r", file=self.stream, flush=True)
        elif event == "done":
            status = data["status"]
            line = f"  {status:<10} {data['id']:<24} {data['method']:<9} {data['seconds']:>7.2f}s"
            detail = data.get("reason") or _evidence_line(data)
            if detail:
                line += f"  {detail}"
            if self.tty:
                line = "\x1b[2K" + _paint(line, status, True)
            print(line, file=self.stream, flush=True)
            if status == "violated" and data.get("counterexample"):
                cex = data["counterexample"]
                shown = cex.get("symbols") or cex
                print(f"             counterexample: {json.dumps(shown, default=str)[:400]}", file=self.stream)
                print(f"             replay: {data['replay']}", file=self.stream)


def _evidence_line(item: dict[str, Any]) -> str:
    ev = item.get("evidence") or {}
    if item["status"] == "proved" and "rlimit_used" in ev:
        return f"z3 unsat, rlimit {ev['rlimit_used']}/{ev['rlimit']}"
    if item["status"] == "exhausted":
        return f"{ev.get('points_in_given', ev.get('points'))} points in the given of {ev.get('points')} enumerated"
    if item["status"] == "passed":
        return f"{ev.get('cases')} cases" + (f", seed {ev['seed']}" if "seed" in ev else "")
    return ""


def _print_diagnostics(diags: list[Any]) -> None:
    for d in diags:
        print(str(d), file=sys.stderr)


# -- validate -----------------------------------------------------------------------------------------


@command("validate", "check contracts against the schema and resolve every reference")
@_configure(lambda p: p.add_argument("paths", nargs="*", default=[DEFAULT_CONTRACTS]))
def _validate(args: argparse.Namespace) -> int:
    from obligations.contract import contract_files, validate_paths

    diags = validate_paths(args.paths)
    _print_diagnostics(diags)
    n = len(contract_files(args.paths))
    if diags:
        print(f"{len(diags)} problem(s) in {n} contract file(s)", file=sys.stderr)
        return EXIT_INVALID
    print(f"{n} contract file(s) valid")
    return EXIT_OK


# -- check --------------------------------------------------------------------------------------------


def _check_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", default=[DEFAULT_CONTRACTS])
    p.add_argument("--device", choices=["auto", "host", "cuda"], default="auto",
                   help="auto: cuda when a working GPU is present, else host; cuda without one exits 2")
    p.add_argument("--json", metavar="FILE", help="write the JSON result here")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML (one testcase per item)")
    p.add_argument("--sarif", metavar="FILE", help="write SARIF 2.1.0")
    p.add_argument("--strict", action="store_true", help="also fail on unknown or skipped items")
    p.add_argument("--only", nargs="+", metavar="ID", help="check only these item ids")
    p.add_argument("--profile", choices=["quick", "full"], default=None,
                   help="falsification budget (default: quick on host, full on cuda)")
    p.add_argument("--seed", type=int, default=0)


@command("check", "check contracts: proofs, enumeration, falsification; exit 1 if anything is refuted")
@_configure(_check_options)
def _check(args: argparse.Namespace) -> int:
    from native.device import DeviceUnavailable, device_info, resolve_device
    from obligations.check import check_paths
    from obligations.contract import ContractError, validate_paths

    try:
        device = resolve_device(args.device)
    except DeviceUnavailable as e:
        print(f"kc: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    diags = validate_paths(args.paths)
    if diags:
        _print_diagnostics(diags)
        return EXIT_INVALID
    profile = args.profile or ("full" if device == "cuda" else "quick")
    print(f"kc {__version__}: device {device}, profile {profile}, seed {args.seed}")
    try:
        result = check_paths(args.paths, device=device, device_info=device_info(device), only=args.only,
                             profile=profile, seed=args.seed, strict=args.strict, progress=_Progress(),
                             argv=["kc", *sys.argv[1:]])
    except ContractError as e:
        _print_diagnostics(e.diagnostics)
        return EXIT_INVALID
    if args.only and not result["contracts"]:
        print(f"kc: error: no item with id {', '.join(args.only)}", file=sys.stderr)
        return EXIT_INVALID
    _write_outputs(args, result)
    s = result["summary"]
    total = sum(s.values())
    parts = ", ".join(f"{v} {k}" for k, v in s.items() if v)
    print(f"{total} items: {parts}")
    return result["exit_code"]


def _write_outputs(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    outputs = _ci_outputs()
    if outputs is None:
        return
    if args.junit:
        outputs.write_junit(result, args.junit)
    if args.sarif:
        outputs.write_sarif(result, args.sarif)
    if os.environ.get("GITHUB_ACTIONS"):
        for line in outputs.github_annotations(result):
            print(line)
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        with open(summary_path, "a", encoding="utf-8") as fh:
            fh.write(outputs.step_summary(result))


def _ci_outputs() -> Any:
    try:
        from obligations import ci_outputs
    except ImportError:
        return None
    return ci_outputs


# -- entry point --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    _load_optional_commands()
    parser = argparse.ArgumentParser(prog="kc", description="kernel-contracts: checkable claims about GPU kernels")
    parser.add_argument("--version", action="version", version=f"kc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (configure, run) in COMMANDS.items():
        p = sub.add_parser(name, help=getattr(run, "help_text", ""))
        configure(p)
        p.set_defaults(run=run)
    return parser


def _load_optional_commands() -> None:
    # Commands that live beside their engines register themselves on import.
    for mod in ("obligations.cli_extra",):
        try:
            __import__(mod)
        except ImportError:
            pass


def main(argv: list[str] | None = None) -> int:
    """Run ``kc``; returns the exit code (see module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return EXIT_INTERNAL
    except Exception:
        traceback.print_exc()
        print("kc: internal error (a bug in kernel-contracts; please report it with the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
