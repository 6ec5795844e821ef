"""The ``kc`` command: validate, check, report, sweep, explain, new.

Exit codes: 0 nothing violated or errored; 1 something violated or errored (with --strict also anything
unknown or skipped); 2 invalid contract or usage (including --device cuda without a working GPU);
3 internal error; 130 interrupted (Ctrl-C; `kc check --json` still writes the partial result).
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

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
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


def _resolve_device(requested: str) -> str | None:
    """The device to run on, or None after printing why ``--device cuda`` cannot run (the caller exits 2)."""
    from obligations.core.device import DeviceUnavailable, resolve_device

    try:
        return resolve_device(requested)
    except DeviceUnavailable as e:
        print(f"kc: error: {e}", file=sys.stderr)
        return None


def _print_diagnostics(diags: list[Any]) -> None:
    for d in diags:
        print(str(d), file=sys.stderr)


# -- validate -----------------------------------------------------------------------------------------


def _search_path_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--search-path", metavar="DIR", action="append", default=[],
                   help="contracts here (not checked themselves) may satisfy depends_on; repeatable")


def _validate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", default=[DEFAULT_CONTRACTS])
    _search_path_option(p)


@command("validate", "check contracts against the schema and resolve every reference")
@_configure(_validate_options)
def _validate(args: argparse.Namespace) -> int:
    from obligations.contract import load_contracts

    loaded = load_contracts(args.paths, search_path=args.search_path)
    diags = loaded.diagnostics
    _print_diagnostics(diags)
    n = len(loaded.files)
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
    p.add_argument("--only", nargs="+", action="extend", metavar="ID",
                   help="check only these item ids or shell globs (RED-FOLD-*); repeatable")
    p.add_argument("--profile", choices=["quick", "full"], default=None,
                   help="falsification budget (default: quick on host, full on cuda)")
    p.add_argument("--seed", type=int, default=0)
    _search_path_option(p)


@command("check", "check contracts: proofs, enumeration, falsification; exit 1 if anything is refuted")
@_configure(_check_options)
def _check(args: argparse.Namespace) -> int:
    from obligations.check import check_paths
    from obligations.contract import load_contracts
    from obligations.core.device import device_info

    device = _resolve_device(args.device)
    if device is None:
        return EXIT_INVALID
    loaded = load_contracts(args.paths, search_path=args.search_path)  # each file parsed and validated once
    if loaded.diagnostics:
        _print_diagnostics(loaded.diagnostics)
        return EXIT_INVALID
    profile = args.profile or ("full" if device == "cuda" else "quick")
    print(f"kc {__version__}: device {device}, profile {profile}, seed {args.seed}")
    result = check_paths(loaded.contracts, device=device, device_info=device_info(device), only=args.only,
                         profile=profile, seed=args.seed, strict=args.strict, progress=_Progress(),
                         argv=["kc", *sys.argv[1:]])
    if result.get("interrupted"):
        _write_outputs(args, result)
        print("kc: interrupted; the result holds the items checked so far" +
              (f" ({args.json})" if args.json else ""), file=sys.stderr)
        return result["exit_code"]
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
    from obligations.check import result_json

    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(result_json(result), encoding="utf-8")
    from obligations import ci_outputs

    if args.junit:
        ci_outputs.write_junit(result, args.junit, strict=args.strict)
    if args.sarif:
        ci_outputs.write_sarif(result, args.sarif, strict=args.strict)
    # Annotations when GITHUB_ACTIONS is set; a Markdown summary appended to GITHUB_STEP_SUMMARY.
    ci_outputs.emit_github(result, strict=args.strict)


# -- report -------------------------------------------------------------------------------------------


def _report_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", default=[DEFAULT_CONTRACTS], help="contracts (when no --from is given)")
    p.add_argument("--from", dest="source", metavar="RESULT.json", action="append",
                   help="report this result instead of checking; repeat to merge runs (e.g. per-contract runs)")
    p.add_argument("--out", default="reports", help="output directory (default: reports)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if committed reports no longer match their contracts or this tool version")
    p.add_argument("--device", choices=["auto", "host", "cuda"], default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-html", action="store_true")
    p.add_argument("--no-plots", action="store_true")


@command("report", "write Markdown/HTML compliance reports from a check result (or check first)")
@_configure(_report_options)
def _report(args: argparse.Namespace) -> int:
    from obligations import reporting

    if args.check:
        contracts_dir = args.paths[0] if args.paths else DEFAULT_CONTRACTS
        problems = reporting.check_reports(args.out, contracts_dir)
        for msg in problems:
            print(f"kc report --check: {msg}", file=sys.stderr)
        if not problems:
            print(f"reports in {args.out} match their contracts and this tool version")
        return EXIT_FAILED if problems else EXIT_OK
    if args.source:
        try:
            result = merge_results([reporting.load_result(src) for src in args.source])
        except (OSError, ValueError) as e:
            print(f"kc: error: {e}", file=sys.stderr)
            return EXIT_INVALID
    else:
        out_json = Path(args.out) / "result.json"
        code = main(["check", *args.paths, "--device", args.device, "--seed", str(args.seed), "--json",
                     str(out_json)])
        if code not in (EXIT_OK, EXIT_FAILED):
            return code
        result = reporting.load_result(out_json)
    if args.source:  # keep the evidence beside the reports: `kc explain` reads reports/result.json
        Path(args.out).mkdir(parents=True, exist_ok=True)
        from obligations.check import result_json

        (Path(args.out) / "result.json").write_text(result_json(result), encoding="utf-8")
    written = reporting.write_reports(result, args.out, html=not args.no_html, plots=not args.no_plots)
    for path in written:
        print(f"wrote {path}")
    return EXIT_OK


def merge_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from several runs: contracts concatenated (a contract may appear once), summary recomputed."""
    from obligations.check import summarize

    if len(results) == 1:
        return results[0]
    seen: set[str] = set()
    contracts = []
    for r in results:
        for c in r["contracts"]:
            if c["id"] in seen:
                raise ValueError(f"contract {c['id']!r} appears in more than one result")
            seen.add(c["id"])
            contracts.append(c)
    merged = dict(results[0])
    merged["provenance"] = {**results[0]["provenance"], "merged_runs": [r["provenance"] for r in results]}
    merged["contracts"] = contracts
    merged["summary"] = summarize(contracts)
    merged["exit_code"] = max(r["exit_code"] for r in results)
    return merged


# -- explain / new ------------------------------------------------------------------------------------


def _explain_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("item_id", metavar="ID")
    p.add_argument("paths", nargs="*", default=[DEFAULT_CONTRACTS])
    p.add_argument("--from", dest="source", metavar="RESULT.json", default=None,
                   help="evidence from this result (default: reports/result.json when present)")


@command("explain", "print an item, its formal statement, its last evidence and how to reproduce it")
@_configure(_explain_options)
def _explain(args: argparse.Namespace) -> int:
    from obligations.contract import contract_files
    from obligations.explain import ItemNotFound, explain
    from obligations.reporting import load_result

    source = args.source or ("reports/result.json" if Path("reports/result.json").exists() else None)
    result = load_result(source) if source else None
    try:
        print(explain(args.item_id, contract_files(args.paths), result))
    except ItemNotFound as e:
        print(f"kc: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK


def _new_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="contract id, e.g. softmax-v1 (written to CONTRACTS_DIR/NAME.yaml)")
    p.add_argument("--family", required=True)
    p.add_argument("--contracts-dir", default=DEFAULT_CONTRACTS)
    p.add_argument("--tests-dir", default="falsification",
                   help="where the test module goes (falsification/*_tests.py are registered automatically)")


@command("new", "scaffold a contract and a test module whose items start skipped: not implemented")
@_configure(_new_options)
def _new(args: argparse.Namespace) -> int:
    from obligations.scaffold import ScaffoldError, scaffold_contract

    try:
        paths = scaffold_contract(args.name, args.family, args.contracts_dir, args.tests_dir)
    except ScaffoldError as e:
        print(f"kc: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    for path in paths:
        print(f"created {path}")
    return EXIT_OK


# -- sweep / replay -----------------------------------------------------------------------------------


def _sweep_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("op", help="a registered unary elementwise kernel (sqrt, inv, neg, relu, exp, log, tanh, ...)")
    p.add_argument("--env", default=None, help="float environment of the reference (default: the route's)")
    p.add_argument("--device", choices=["auto", "host", "cuda"], default="auto")
    p.add_argument("--fmt", default="binary32", help="binary32 (kernel vs reference) or a small format (e.g. "
                   "binary16, e4m3): every operand pair of softfloat against an exact oracle, on the CPU")
    p.add_argument("--lo", type=lambda v: int(v, 0), default=0)
    p.add_argument("--hi", type=lambda v: int(v, 0), default=None)
    p.add_argument("--sample", type=int, default=None, help="check this many seeded random inputs instead")
    p.add_argument("--route", default="nvrtc-ieee")
    p.add_argument("--bound", type=int, default=None, help="max ULP allowed (default: bitwise)")
    p.add_argument("--reference", choices=["softfloat", "float64"], default=None)
    p.add_argument("--json", metavar="FILE")


@command("sweep", "check a unary op on every binary32 input (GPU) or every operand pair of a small format (CPU)")
@_configure(_sweep_options)
def _sweep(args: argparse.Namespace) -> int:
    from falsification.sweep import sweep

    device = _resolve_device(args.device)
    if device is None:
        return EXIT_INVALID
    kwargs: dict[str, Any] = {"lo": args.lo, "hi": args.hi, "sample": args.sample, "route": args.route,
                              "bound": args.bound}
    if args.reference:
        kwargs["reference"] = args.reference
    if device == "host" and args.fmt == "binary32" and args.sample is None and args.hi is None:
        print("kc sweep: all 2^32 inputs on the host would take hours; checking a 2^22 sample "
              "(use --device cuda for the exhaustive sweep, or --lo/--hi/--sample)", file=sys.stderr)
    try:
        report = sweep(args.op, args.env, device=device, fmt=args.fmt, **kwargs)
    except (KeyError, ValueError) as e:
        print(f"kc: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    text = json.dumps(report, indent=2, default=str)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    print(text)
    return EXIT_FAILED if report.get("disagreements") else EXIT_OK


def _replay_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="the contract")
    p.add_argument("item_id", metavar="ID")
    p.add_argument("--bits", required=True, help="operand bit patterns, comma separated (0x... or ints)")
    p.add_argument("--scalars", default="", help="scalar operand bit patterns, comma separated")
    p.add_argument("--device", choices=["auto", "host", "cuda"], default="auto")
    p.add_argument("--seed", type=int, default=0)


@command("replay", "re-check exactly one counterexample of a falsification item")
@_configure(_replay_options)
def _replay(args: argparse.Namespace) -> int:
    from falsification.runner import find_item, replay
    from obligations.contract import ContractError, load_contract

    device = _resolve_device(args.device)
    if device is None:
        return EXIT_INVALID
    try:
        contract = load_contract(args.path)
    except ContractError as e:
        _print_diagnostics(e.diagnostics)
        return EXIT_INVALID
    item = find_item(contract.data, args.item_id)
    if item is None:
        print(f"kc: error: no falsification item {args.item_id!r} in {args.path}", file=sys.stderr)
        return EXIT_INVALID
    split = [s for s in args.scalars.split(",") if s]
    outcome = replay(item, bits=args.bits.split(","), scalars=split, device=device, contract=contract.data,
                     contract_path=args.path, seed=args.seed)
    print(json.dumps(outcome.to_json(), indent=2, default=str))
    return EXIT_FAILED if outcome.status.is_failure else EXIT_OK


import obligations.graph_cli  # noqa: E402,F401  (registers `kc graph`)

# -- entry point --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="kc", description="kernel-contracts: checkable claims about GPU kernels")
    parser.add_argument("--version", action="version", version=f"kc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (configure, run) in COMMANDS.items():
        p = sub.add_parser(name, help=getattr(run, "help_text", ""))
        configure(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``kc``; returns the exit code (see module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    try:
        return args.run(args)
    except KeyboardInterrupt:  # outside `kc check`'s items (which write a partial result): stop, not a bug
        print("kc: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:
        traceback.print_exc()
        print("kc: internal error (a bug in kernel-contracts; please report it with the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
