"""The ``kc`` command: validate, check, report, sweep, explain, new.

Exit codes: 0 nothing violated or errored; 1 something violated or errored (with --strict also anything
unknown or skipped); 2 invalid contract or usage (including --device cuda without a working GPU);
3 internal error; 5 no contract collected; 130 interrupted (Ctrl-C; `kc check --json` still writes the partial
result and the results log says where to --resume); 143 stopped by SIGTERM (the same).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from obligations import __version__
from obligations.argtypes import SEED, U32, bit_patterns, cluster_spec, counted, seconds
from obligations.registry import COMMANDS, command, load_plugins

__all__ = ["main", "COMMANDS", "counted", "seconds", "bit_patterns", "SEED", "probe_output", "start_phases"]

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_NO_CONTRACTS = 5  # nothing collected (as pytest's 5): checking nothing is not a pass
DEFAULT_CONTRACTS = "contracts"


def _configure(fn: Callable[[argparse.ArgumentParser], None]) -> Callable:
    def attach(run: Callable) -> Callable:
        run.configure = fn
        return run

    return attach


def _on_scheduler(requested: str, cluster: str | None) -> bool:
    """Whether ``--device cuda`` runs on a scheduler's workers: they have the GPUs, this host need not."""
    return requested == "cuda" and bool(cluster) and not str(cluster).startswith("local")


def _remote_device(cluster: str) -> dict[str, Any]:
    """The result's device on a scheduler's workers (probed there, not here)."""
    return {"kind": "cuda", "name": None, "driver": None, "cuda_runtime": None, "where": f"the workers of {cluster}"}


def _resolve_device(requested: str, cluster: str | None = None) -> str | None:
    """The device to run on, or None after printing why ``--device cuda`` cannot run (the caller exits 2)."""
    from obligations.core.device import DeviceUnavailable, resolve_device

    if _on_scheduler(requested, cluster):
        return "cuda"
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
    p.add_argument(
        "--search-path",
        metavar="DIR",
        action="append",
        default=[],
        help="contracts here (not checked themselves) may satisfy depends_on; repeatable",
    )


def _paths_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="*",
        default=None,
        metavar="PATH",
        help="contract files or directories (scanned recursively; default: [tool.kc] contracts, else ./contracts)",
    )


def _validate_options(p: argparse.ArgumentParser) -> None:
    _paths_argument(p)
    _search_path_option(p)
    p.add_argument(
        "--import",
        dest="imports",
        action="store_true",
        help="also import the modules the contracts name, resolve kernels and registered tests and "
        "run plans on symbols (runs the contract's code: only for code you trust)",
    )
    _verbosity_options(p)


def _verbosity_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="count", default=0, help="less output: only failures and the summary")
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more output: full reasons and the traceback of errored items",
    )


@command("validate", "check contracts against the schema and their semantics (imports nothing unless --import)")
@_configure(_validate_options)
def _validate(args: argparse.Namespace) -> int:
    from obligations.contract import load_contracts

    loaded = load_contracts(args.paths, search_path=args.search_path, imports=args.imports)
    diags = loaded.diagnostics
    _print_diagnostics(diags)
    n = len(loaded.files)
    if diags:
        print(f"{len(diags)} problem(s) in {n} contract file(s)", file=sys.stderr)
        return EXIT_INVALID
    if n == 0:
        print(f"kc: no contract found in {', '.join(map(str, args.paths))}", file=sys.stderr)
        return EXIT_NO_CONTRACTS
    if args.quiet < 1:
        print(f"{n} contract file(s) valid")
        if args.verbose and not args.imports:
            print("(schema and semantics; nothing imported: --import also resolves modules, plans and tests)")
    return EXIT_OK


# -- check --------------------------------------------------------------------------------------------


def _check_options(p: argparse.ArgumentParser) -> None:
    _paths_argument(p)
    p.add_argument(
        "--device",
        choices=["auto", "host", "cuda"],
        default="auto",
        help="auto: cuda when a working GPU is present, else host; cuda without one exits 2",
    )
    p.add_argument("--json", metavar="FILE", help="write the JSON result here (atomically; '-' for stdout)")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML (one testcase per item)")
    p.add_argument("--sarif", metavar="FILE", help="write SARIF 2.1.0")
    p.add_argument("--strict", action="store_true", default=False, help="also fail on unknown or skipped items")
    p.add_argument(
        "--only",
        nargs="+",
        action="extend",
        metavar="ID",
        help="check only these item ids or shell globs (RED-FOLD-*); repeatable; an id that matches "
        "no item is an error",
    )
    p.add_argument(
        "--profile",
        choices=["quick", "full", "deep"],
        default=None,
        help="falsification budget and item time limit (default: quick on host, full on cuda; deep: a nightly "
        "GPU run with several times full's drawn cases)",
    )
    p.add_argument("--seed", type=SEED, default=None, help="seed of every randomised check (default 0)")
    p.add_argument(
        "--log",
        metavar="FILE",
        default=None,
        help="results log: one JSON line per finished item, flushed as it completes",
    )
    p.add_argument(
        "--resume",
        metavar="LOG",
        default=None,
        help="continue the run of this results log: its finished items are not run again",
    )
    p.add_argument(
        "--item-timeout",
        metavar="SECONDS",
        type=seconds,
        default=None,
        help="time limit of every item (overrides the item's timeout_s and the profile's; 0: none)",
    )
    p.add_argument(
        "--isolate",
        choices=["auto", "process", "none"],
        default="auto",
        help="run items in a worker process replaced after a timeout or a fault (auto: on cuda)",
    )
    p.add_argument(
        "--jobs",
        "-j",
        type=counted(0, 1025),
        metavar="N",
        default=None,
        help="worker processes that run items ahead while the run takes their records in order; measure items run "
        "last, alone, once the workers are idle (default: cores - 1, at most 15; 0: none)",
    )
    p.add_argument(
        "--cluster",
        type=cluster_spec,
        metavar="local[:N]|tcp://HOST:PORT",
        default=None,
        help="run the items on a Dask cluster: local (one worker per visible GPU on cuda, cores - 1 CPU workers on "
        "the host; local:N: N), or a running scheduler's address (docs/scale-out.md; pip install "
        "'kernel-contracts[scale]')",
    )
    p.add_argument(
        "-x",
        "--exitfirst",
        dest="maxfail",
        action="store_const",
        const=1,
        help="stop after the first violated or errored item",
    )
    p.add_argument(
        "--maxfail",
        type=counted(0),
        metavar="N",
        dest="maxfail",
        default=None,
        help="stop after N violated or errored items (0: no limit, as pytest's)",
    )
    p.add_argument("--durations", type=counted(0), metavar="N", default=None, help="print the N slowest items (0: all)")
    p.add_argument(
        "--z3-stability",
        type=counted(1),
        metavar="N",
        default=None,
        help="solve each z3 item N times (the query, then N-1 perturbations: seeds, shuffled assertions, renamed "
        "symbols, fresh processes); an item not proved in every run is unknown; the evidence holds the table",
    )
    p.add_argument(
        "--no-proof-cache",
        action="store_true",
        default=False,
        help="solve, enumerate and compile every item again (the proof cache reuses unchanged proved/exhausted "
        "results and passed audits; the contracts' parses stay cached: KC_LOAD_CACHE=0 for those)",
    )
    p.add_argument(
        "--timeline",
        metavar="FILE",
        default=None,
        help="write where (the run or worker N) and when each item ran, as a Chrome trace (Perfetto)",
    )
    _verbosity_options(p)
    _search_path_option(p)


def _split_only(args: argparse.Namespace) -> None:
    """``--only ID path``: values that name existing files or directories are paths, not ids."""
    if not args.only:
        return
    ids = []
    moved = []
    for value in args.only:
        if value.strip() and (Path(value).exists() or value.endswith((".yaml", ".yml"))):  # "" is no path (not ".")
            moved.append(value)
        else:
            ids.append(value)
    if moved:
        args.paths = (args.paths if args.paths_given else []) + moved
        args.paths_given = True
    args.only = ids


def _unknown_only(only: list[str], contracts: Any) -> list[str]:
    """One message per ``--only`` pattern that selects no item, with the closest id."""
    from obligations.check import selected
    from obligations.contract import did_you_mean

    ids = [it["id"] for c in contracts for it in c.items]
    return [
        f"--only {p}: no item with this id{did_you_mean(p, ids)}"
        for p in only
        if not any(selected(i, [p]) for i in ids)
    ]


def _check_outputs(args: argparse.Namespace) -> list[str]:
    from obligations.atomic import OutputPathError, check_writable

    problems = []
    for flag in ("json", "junit", "sarif", "log", "timeline"):
        path = getattr(args, flag, None)
        if path and path != "-":
            try:
                check_writable(path)
                probe_output(path, append=flag == "log")
            except OutputPathError as e:
                problems.append(f"--{flag} {e}")
            except OSError as e:
                problems.append(f"--{flag} {path}: {e.strerror or e}")
    return problems


def probe_output(path: str | Path, append: bool = False) -> None:
    """Create (and remove) a file where ``path``'s atomic write puts its temporary file, or open ``path`` for
    appending: an output that cannot be written fails before the run (OSError), not after it (/proc/x.json)."""
    import tempfile

    target = Path(path)
    parent = target.parent
    while not parent.exists() and parent != parent.parent:  # the writer creates missing folders here
        parent = parent.parent
    if append and target.exists():
        with open(target, "a", encoding="utf-8"):
            return
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{target.name}.", suffix=".probe")
    os.close(fd)
    os.unlink(tmp)


def _resume_settings(args: argparse.Namespace) -> tuple[Any, list[str]]:
    """The log to resume and any flag that contradicts its settings."""
    from obligations.runlog import RESUMED_SETTINGS, read_log

    resumed = read_log(args.resume)
    problems = []
    for key in RESUMED_SETTINGS:
        logged = resumed.settings.get(key)
        given = getattr(args, key, None)
        if key == "device" and given == "auto":
            given = None
        if key == "strict" and not given:
            given = None
        if given is not None and given != logged:
            problems.append(f"--resume {args.resume}: the log ran with {key} {logged!r}, not {given!r}")
        setattr(args, key, logged)
    if not args.paths_given and resumed.settings.get("paths"):
        args.paths = resumed.settings["paths"]
    return resumed, problems


@command("check", "check contracts: proofs, enumeration, falsification; exit 1 if anything is refuted")
@_configure(_check_options)
def _check(args: argparse.Namespace) -> int:
    from obligations.isolation import stop_on_signals

    with stop_on_signals(), contextlib.ExitStack() as cleanup:  # main() installed it already for `kc check ...`
        return _run_check(args, cleanup)


def _profile(args: argparse.Namespace, device: str) -> str:
    """The run's profile: --profile, else full on cuda (count-bound: falsification.profiles) and quick on the host."""
    return args.profile or ("full" if device == "cuda" else "quick")


def _early_executor(args: argparse.Namespace, device: str, seed: int, cleanup: contextlib.ExitStack) -> Any:
    """The run's own executor with its worker process already starting (its imports take seconds: they overlap the
    loading of the contracts), where the run will use one (``--isolate process``, the default on cuda; no
    cluster); None otherwise. ``cleanup`` closes it if the run ends before it is handed over."""
    from functools import partial

    from obligations.check import item_fields
    from obligations.isolation import make_executor

    if args.cluster:
        return None
    settings = {"device": device, "profile": _profile(args, device), "seed": seed}
    executor = make_executor(args.isolate, partial(item_fields, **settings), settings)
    cleanup.callback(executor.close)
    if device == "cuda":  # it times the measure items: their peers' libraries load while the contracts do
        from falsification.measure import PEER_LIBRARIES

        executor.prestart(preload=PEER_LIBRARIES)
    else:
        executor.prestart()
    return executor


def _early_prefetcher(
    args: argparse.Namespace, device: str, seed: int, cleanup: contextlib.ExitStack, executor: Any
) -> Any:
    """The run's prefetch workers, already starting (their imports overlap the loading of the contracts), on cuda
    with --jobs > 0 and no cluster; None otherwise. Speculative: the run closes them if it has fewer than two items
    to run ahead (obligations.check._worth_workers), so none start for one ``--only ID``; ``cleanup`` closes them
    if the run ends before it starts (bad contracts, an unknown --only, a stop)."""
    from obligations.isolation import Prefetcher, default_jobs

    jobs = default_jobs() if args.jobs is None else args.jobs
    one_id = len(args.only or []) == 1 and not any(ch in args.only[0] for ch in "*?[")
    if executor is None or args.cluster or device != "cuda" or jobs <= 0 or one_id:
        return None
    settings = {"device": device, "profile": _profile(args, device), "seed": seed}
    prefetcher = Prefetcher(jobs, executor.fields, settings)
    cleanup.callback(prefetcher.close)
    prefetcher.prestart()
    return prefetcher


def _early_cluster(args: argparse.Namespace, device: str, cleanup: contextlib.ExitStack) -> Any:
    """The --cluster, already opening in the background (a local cluster's workers start while the contracts load);
    None without one. ``cleanup`` closes it if the run ends before it takes it."""
    if not args.cluster:
        return None
    from obligations.cluster import CHECK_LAYOUT, OpeningCluster, parse_cluster

    opening = OpeningCluster(parse_cluster(args.cluster), device, layout=CHECK_LAYOUT)  # kc worker processes
    cleanup.callback(opening.close)
    return opening


def _start_workers(
    args: argparse.Namespace, device: str, seed: int, cleanup: contextlib.ExitStack, phases: list
) -> tuple[Any, Any]:
    """The run's own executor and its prefetch workers, started ahead (see :func:`_early_executor`,
    :func:`_early_prefetcher`); ``cleanup`` closes them if the run ends before it takes them."""
    if device == "cuda":  # before any worker starts: they inherit where the run's sanitize items meet
        from obligations.sanitize_batch import run_scope

        cleanup.enter_context(run_scope())
    with _phase(phases, "start workers"):  # their imports overlap the probe and the loading
        early = _early_executor(args, device, seed, cleanup)
        return early, _early_prefetcher(args, device, seed, cleanup, early)


# perf_counter times of this process's start (Linux, where kc runs as a command) and of main(): the timeline's
_STARTED: dict[str, float] = {}


def _process_started() -> float | None:
    """The perf_counter time this process started (its start time in /proc/self/stat), or None where unknown."""
    try:
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        return None
    return time.perf_counter() - age if 0 <= age < 3600 else None


@contextlib.contextmanager
def _phase(phases: list[tuple[str, float, float]], name: str) -> Any:
    """Record the block's (name, start, end) in ``phases`` (perf_counter seconds: the timeline's run lane)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        phases.append((name, t0, time.perf_counter()))


def start_phases() -> list[tuple[str, float, float]]:
    """The phases before the check's own: Python's start and kc's imports, where this process is the command."""
    now = time.perf_counter()
    main_at = _STARTED.get("main", now)
    phases = [("import kc", main_at, now)]
    if "process" in _STARTED:
        phases.insert(0, ("start Python", _STARTED["process"], main_at))
    return phases


def _run_check(args: argparse.Namespace, cleanup: contextlib.ExitStack) -> int:
    from obligations.check import RunOptions, check_paths
    from obligations.cluster import ClusterError
    from obligations.console import Reporter
    from obligations.contract import load_contracts
    from obligations.core.cancel import StopRequested
    from obligations.core.device import device_info
    from obligations.isolation import default_jobs, raising_on_stop
    from obligations.runlog import LogError, RunLog

    phases = start_phases()
    _split_only(args)
    resumed = None
    problems = _check_outputs(args)
    if args.resume:
        try:
            resumed, more = _resume_settings(args)
        except LogError as e:
            problems.append(str(e))
        else:
            problems.extend(more)
            for msg in resumed.warnings:
                print(f"kc: warning: {msg}", file=sys.stderr)
    if args.cluster:
        from obligations.cluster import dask_missing

        if dask_missing():
            problems.append(f"--cluster {args.cluster}: {dask_missing()}")
    if problems:
        for msg in problems:
            print(f"kc: error: {msg}", file=sys.stderr)
        return EXIT_INVALID
    seed = args.seed if args.seed is not None else 0
    _proof_environment(args)
    try:
        with raising_on_stop():  # a stop while the device is probed and contracts load (imports) ends here, at once
            # --device cuda: the workers start before the probe too (it imports CuPy and wakes the driver; a
            # failed one exits 2 and closes them); auto waits for the probe (a host without a GPU starts none)
            told = "cuda" if args.device == "cuda" and not args.cluster else None
            if told:
                early, ahead = _start_workers(args, told, seed, cleanup, phases)
            # A cluster on a named device opens before the probe too (Dask's import and its workers' start are the
            # longest part of a cluster run's start); with auto, after the probe has named the device
            opening = _early_cluster(args, args.device, cleanup) if args.device in ("cuda", "host") else None
            with _phase(phases, "probe device"):
                device = _resolve_device(args.device, args.cluster)
            if device is None:
                return EXIT_INVALID
            if not told:
                early, ahead = _start_workers(args, device, seed, cleanup, phases)
            if opening is None:
                opening = _early_cluster(args, device, cleanup)  # its own start is on the timeline ("open cluster")
            with _phase(phases, "load contracts"):  # each file parsed and validated once
                loaded = load_contracts(args.paths, search_path=args.search_path, cache=True)
    except StopRequested as e:
        return _stopped_before_items(args, e.reason, seed)
    if loaded.diagnostics:
        _print_diagnostics(loaded.diagnostics)
        return EXIT_INVALID
    if not loaded.contracts:
        print(
            f"kc: no contract collected from {', '.join(map(str, args.paths))} (exit {EXIT_NO_CONTRACTS})",
            file=sys.stderr,
        )
        return EXIT_NO_CONTRACTS
    unknown = _unknown_only(args.only or [], loaded.contracts)
    if unknown:
        for msg in unknown:
            print(f"kc: error: {msg}", file=sys.stderr)
        return EXIT_INVALID
    profile = _profile(args, device)
    out = sys.stderr if args.json == "-" else sys.stdout
    verbosity = args.verbose - args.quiet
    if verbosity >= 0:
        print(f"kc {__version__}: device {device}, profile {profile}, seed {seed}", file=out)
    settings = {
        "device": device,
        "profile": profile,
        "seed": seed,
        "only": args.only or None,
        "strict": bool(args.strict),
        "paths": [str(p) for p in args.paths],
    }
    log_path = args.resume or args.log
    try:
        log = RunLog(Path(log_path), settings, append=bool(args.resume)) if log_path else None
    except LogError as e:  # another run holds it
        print(f"kc: error: {'--resume' if args.resume else '--log'} {e}", file=sys.stderr)
        return EXIT_INVALID
    options = RunOptions(
        item_timeout=args.item_timeout,
        isolate=args.isolate,
        maxfail=args.maxfail or None,  # 0: no limit, as pytest's --maxfail 0 (never a green exit for a failing run)
        jobs=default_jobs() if args.jobs is None else args.jobs,
        timeline=args.timeline,
        cluster=args.cluster,
        cluster_opening=opening,
        done=resumed.done if resumed else {},
        log=log.record if log else None,
        executor=early,
        prefetcher=ahead,
    )
    total = sum(1 for c in loaded.contracts for it in c.items if not args.only or _selected(it["id"], args.only))
    reporter = Reporter(out, verbosity, total)
    result = None
    try:
        with _phase(phases, "device info"):
            info = _remote_device(args.cluster) if _on_scheduler(args.device, args.cluster) else device_info(device)
        result = check_paths(
            loaded.contracts,
            device=device,
            device_info=info,
            only=args.only,
            profile=profile,
            seed=seed,
            strict=args.strict,
            progress=reporter,
            argv=["kc", *sys.argv[1:]],
            options=dataclasses.replace(options, phases=tuple(phases)),
        )
    except ClusterError as e:  # a scheduler that does not answer, no GPU for a local cuda cluster: bad input
        print(f"kc: error: --cluster {e}", file=sys.stderr)
        return EXIT_INVALID
    finally:
        reporter.close()
        if log:  # the end line only for a run that ended; the lock goes with the close
            log.close(None if result is None or result.get("interrupted") else result["exit_code"])
    if result.get("interrupted"):
        _write_outputs(args, result)
        _print_summary(result, out, " (interrupted)")
        how = "stopped by SIGTERM" if result.get("signal") == "SIGTERM" else "interrupted"
        print(
            f"kc: {how}; the result holds the items checked so far"
            + (f" ({args.json})" if args.json else "")
            + (f"; resume with kc check --resume {log_path}" if log_path else ""),
            file=sys.stderr,
        )
        return result["exit_code"]
    _write_outputs(args, result)
    if args.durations is not None:
        _print_durations(result, args.durations, out)
    _print_summary(result, out, f" ({result['stopped']})" if result.get("stopped") else "")
    return result["exit_code"]


def _proof_environment(args: argparse.Namespace) -> None:
    """Hand --z3-stability and --no-proof-cache to the engines of this process and of its workers (environment)."""
    from obligations.proofcache import CACHE_ENV, STABILITY_ENV

    if args.z3_stability is not None:
        os.environ[STABILITY_ENV] = str(max(0, args.z3_stability))
    if args.no_proof_cache:
        os.environ[CACHE_ENV] = "0"


def _stopped_before_items(args: argparse.Namespace, reason: str, seed: int) -> int:
    """Write the result of a run stopped before its first item (no contract checked) and return its exit code."""
    from obligations.check import check_paths

    device = args.device if args.device in ("host", "cuda") else "host"
    result = check_paths([], device=device, seed=seed, argv=["kc", *sys.argv[1:]])  # the stop is still requested
    result["signal"] = result.get("signal") or reason
    _write_outputs(args, result)
    how = "stopped by SIGTERM" if reason == "SIGTERM" else "interrupted"
    where = f"; the result is in {args.json}" if args.json else ""
    print(f"kc: {how} before the first item{where}", file=sys.stderr)
    return result["exit_code"]


def _print_summary(result: dict[str, Any], out: Any, tail: str = "") -> None:
    s = result["summary"]
    from obligations.core.results import Status

    total = sum(s.get(k.value, 0) for k in Status)  # items by status; the other counts are coverage flags
    # skipped_cuda_only is a part of skipped (items a host run cannot check), not another status
    words = {"skipped_cuda_only": "of the skipped need cuda", "violated_expected": "violated (expected)"}
    parts = ", ".join(f"{v} {words.get(k, k.replace('_', ' '))}" for k, v in s.items() if v)
    print(f"{total} items" + (f": {parts}" if parts else "") + tail, file=out)


def _selected(item_id: str, only: list[str]) -> bool:
    from obligations.check import selected

    return selected(item_id, only)


def _print_durations(result: dict[str, Any], n: int, out: Any) -> None:
    items = sorted(((it["seconds"], c["id"], it["id"]) for c in result["contracts"] for it in c["items"]), reverse=True)
    shown = items if n == 0 else items[:n]
    print(f"slowest {len(shown)} item(s):", file=out)
    for took, cid, iid in shown:
        print(f"  {took:8.2f}s  {cid}::{iid}", file=out)


def _write_outputs(args: argparse.Namespace, result: dict[str, Any]) -> None:
    from obligations.atomic import write_text_atomic
    from obligations.check import result_json

    if args.json == "-":
        sys.stdout.write(result_json(result))
        sys.stdout.flush()
    elif args.json:
        write_text_atomic(args.json, result_json(result))
    from obligations import ci_outputs

    if args.junit:
        ci_outputs.write_junit(result, args.junit, strict=args.strict)
    if args.sarif:
        ci_outputs.write_sarif(result, args.sarif, strict=args.strict)
    # Annotations when GITHUB_ACTIONS is set; a Markdown summary appended to GITHUB_STEP_SUMMARY.
    ci_outputs.emit_github(result, strict=args.strict)


# -- report -------------------------------------------------------------------------------------------


def _report_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="*",
        default=None,
        metavar="PATH",
        help="contracts to check when no --from is given (default: [tool.kc] contracts, else ./contracts)",
    )
    p.add_argument(
        "--from",
        dest="source",
        metavar="RESULT.json",
        action="append",
        help="report this result instead of checking; repeat to merge runs (e.g. per-contract runs)",
    )
    p.add_argument("--out", default="reports", help="output directory (default: [tool.kc] report_dir, else reports)")
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if committed reports no longer match their contracts, this tool version or the "
        "evidence (device, profile) of the result kept beside them",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace reports that rest on richer evidence (a GPU or full-profile run) with poorer",
    )
    p.add_argument("--device", choices=["auto", "host", "cuda"], default="auto", help="device of the check run")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the check run")
    p.add_argument("--no-html", action="store_true", help="write Markdown only")
    p.add_argument("--no-plots", action="store_true", help="draw no plots")


def _poorer_than_existing(out: str, result: dict[str, Any]) -> list[str]:
    """Reports in ``out`` that ``result`` (a poorer run) would replace."""
    from obligations.reporting.provenance import evidence_level, poorer, report_evidence

    level = evidence_level(result)
    existing = report_evidence(out)
    problems = []
    for c in result["contracts"]:
        if c["id"] in existing:
            report, old = existing[c["id"]]
            worse = poorer(level, old)
            if worse:
                problems.append(
                    f"{report} rests on richer evidence than this run ({', '.join(worse)}); kept (--force replaces it)"
                )
    return problems


def _unreadable_records(result: dict[str, Any], html: bool) -> str | None:
    """Why a result given with --from cannot be rendered (a record whose fields are not what a kc check writes,
    met by the renderers), or None: found before any report is written, as a usage error."""
    from functools import partial

    from obligations.check import raised_at
    from obligations.reporting import html as html_reports
    from obligations.reporting import markdown

    renders: list[tuple[str, Callable[[], Any]]] = [
        (f"contract {c['id']!r}", partial(markdown.render_contract_markdown, result, c)) for c in result["contracts"]
    ]
    if html:
        renders += [
            (f"contract {c['id']!r}", partial(html_reports.render_contract_html, result, c))
            for c in result["contracts"]
        ]
        renders.append(("its provenance", partial(html_reports.render_index_html, result)))
    renders.append(("its provenance", partial(markdown.render_index_markdown, result, html=html)))
    for what, render in renders:
        try:
            render()
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as e:
            return (
                f"{what}: a record cannot be read ({type(e).__name__}: {e}; met at {raised_at(e)}); "
                "is it a kc check result, unedited?"
            )
    return None


@command("report", "write Markdown/HTML compliance reports from a check result (or check first)")
@_configure(_report_options)
def _report(args: argparse.Namespace) -> int:
    import tempfile

    from obligations import reporting
    from obligations.atomic import write_text_atomic
    from obligations.check import result_json

    if args.check:
        contracts_dir = args.paths[0] if args.paths else DEFAULT_CONTRACTS
        problems = reporting.check_reports(args.out, contracts_dir)
        for msg in problems:
            print(f"kc report --check: {msg}", file=sys.stderr)
        if not problems:
            print(f"reports in {args.out} match their contracts, their evidence and this tool version")
        return EXIT_FAILED if problems else EXIT_OK
    if args.source:
        try:
            from obligations.check import merge_results

            result = merge_results([reporting.load_result(src) for src in args.source])
        except (OSError, ValueError) as e:
            print(f"kc: error: {e}", file=sys.stderr)
            return EXIT_INVALID
    else:
        with tempfile.TemporaryDirectory() as tmp:  # reports/result.json is replaced only once the run is kept
            out_json = Path(tmp) / "result.json"
            code = main(
                ["check", *args.paths, "--device", args.device, "--seed", str(args.seed), "--json", str(out_json)]
            )
            if code not in (EXIT_OK, EXIT_FAILED):
                return code
            result = reporting.load_result(out_json)
    if args.source:
        unreadable = _unreadable_records(result, html=not args.no_html)
        if unreadable:
            print(f"kc: error: {', '.join(args.source)}: {unreadable}", file=sys.stderr)
            return EXIT_INVALID
    refused = [] if args.force else _poorer_than_existing(args.out, result)
    if refused:
        for msg in refused:
            print(f"kc: error: {msg}", file=sys.stderr)
        return EXIT_INVALID
    # keep the evidence beside the reports: `kc explain` and `kc report --check` read reports/result.json
    write_text_atomic(Path(args.out) / "result.json", result_json(result))
    written = reporting.write_reports(result, args.out, html=not args.no_html, plots=not args.no_plots)
    for path in written:
        print(f"wrote {path}")
    return EXIT_OK


# -- explain / new ------------------------------------------------------------------------------------


def _explain_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("item_id", metavar="ID", help="the item to explain")
    p.add_argument(
        "paths",
        nargs="*",
        default=None,
        metavar="PATH",
        help="contracts to look in (default: [tool.kc] contracts, else ./contracts)",
    )
    p.add_argument(
        "--from",
        dest="source",
        metavar="RESULT.json",
        default=None,
        help="evidence from this result (default: reports/result.json when present)",
    )


@command("explain", "print an item, its formal statement, its last evidence and how to reproduce it")
@_configure(_explain_options)
def _explain(args: argparse.Namespace) -> int:
    from obligations.contract import contract_files
    from obligations.explain import ItemNotFound, explain
    from obligations.reporting import load_result

    source = args.source or ("reports/result.json" if Path("reports/result.json").exists() else None)
    try:
        result = load_result(source) if source else None
    except (OSError, ValueError) as e:
        print(f"kc: error: --from {source}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        return EXIT_INVALID
    try:
        print(explain(args.item_id, contract_files(args.paths), result))
    except ItemNotFound as e:
        print(f"kc: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK


def _new_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="contract id, e.g. softmax-v1 (written to CONTRACTS_DIR/NAME.yaml)")
    p.add_argument("--family", required=True, help="kernel family, e.g. gemm or softmax")
    p.add_argument("--contracts-dir", default=DEFAULT_CONTRACTS, help="where the contract goes (default: contracts)")
    p.add_argument(
        "--tests-dir",
        default=None,
        help="where the test module goes (default: falsification/ in kc's checkout, where it is "
        "registered automatically; contract_tests/ elsewhere, a package kc imports)",
    )


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
    p.add_argument(
        "--device",
        choices=["auto", "host", "cuda"],
        default="auto",
        help="auto: cuda when a working GPU is present, else host",
    )
    p.add_argument(
        "--fmt",
        default="binary32",
        help="binary32 (kernel vs reference) or a small format (e.g. "
        "binary16, e4m3): every operand pair of softfloat against an exact oracle, on the CPU",
    )
    p.add_argument("--lo", type=counted(0, U32 + 1, base=0), default=0, help="first input bit pattern (0x... or int)")
    p.add_argument(
        "--hi",
        type=counted(0, U32 + 1, base=0),
        default=None,
        help="end of the input range, exclusive (default: all)",
    )
    p.add_argument(
        "--sample", type=counted(1, U32 + 1), default=None, help="check this many seeded random inputs instead"
    )
    p.add_argument("--route", default="nvrtc-ieee", help="compilation route of the kernel (default nvrtc-ieee)")
    p.add_argument("--bound", type=counted(0), default=None, help="max ULP allowed (default: bitwise)")
    p.add_argument(
        "--reference",
        choices=["auto", "softfloat", "float64"],
        default=None,
        help="reference the kernel is compared with (default auto: the float64 route for exact ops on cuda "
        "where it is exact, else softfloat)",
    )
    p.add_argument(
        "--operand",
        type=counted(0, U32, base=0),
        default=None,
        help="bits of the fixed second operand of a binary kernel (e.g. add --operand 0x3F800000)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the sweep report here (atomically)")
    p.add_argument(
        "--cluster",
        type=cluster_spec,
        metavar="local[:N]|tcp://HOST:PORT",
        default=None,
        help="split the range into parts run as tasks on a Dask cluster (every GPU; docs/scale-out.md) and merge "
        "them into the single run's evidence",
    )
    p.add_argument(
        "--parts", type=counted(1, 1 << 16), default=None, help="parts of a --cluster sweep (default: 4 per worker)"
    )


@command("sweep", "check a unary op on every binary32 input (GPU) or every operand pair of a small format (CPU)")
@_configure(_sweep_options)
def _sweep(args: argparse.Namespace) -> int:
    from falsification.sweep import sweep

    device = _resolve_device(args.device, args.cluster)
    if device is None:
        return EXIT_INVALID
    kwargs: dict[str, Any] = {
        "lo": args.lo,
        "hi": args.hi,
        "sample": args.sample,
        "route": args.route,
        "bound": args.bound,
    }
    if args.reference:
        kwargs["reference"] = args.reference
    if args.operand is not None:
        kwargs["operand"] = args.operand
    if device == "host" and args.fmt == "binary32" and args.sample is None and args.hi is None:
        print(
            "kc sweep: all 2^32 inputs on the host would take hours; checking a 2^22 sample "
            "(use --device cuda for the exhaustive sweep, or --lo/--hi/--sample)",
            file=sys.stderr,
        )
    try:
        if args.cluster:
            report = _cluster_sweep(args, device, kwargs)
            if isinstance(report, int):  # why it printed
                return report
        else:
            if device == "cuda":
                from obligations.core.device import use_plain_reductions

                use_plain_reductions()
            with _working(f"kc sweep {args.op} ({args.fmt}, {device})"):
                report = sweep(args.op, args.env, device=device, fmt=args.fmt, **kwargs)
    except (KeyError, ValueError) as e:
        print(f"kc: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    text = json.dumps(report, indent=2, default=str)
    if args.json:
        from obligations.atomic import write_text_atomic

        write_text_atomic(args.json, text + "\n")
    print(text)
    return EXIT_FAILED if report.get("disagreements") else EXIT_OK


def _cluster_sweep(args: argparse.Namespace, device: str, kwargs: dict[str, Any]) -> dict[str, Any] | int:
    """``kc sweep --cluster``: the range in parts, one task each, merged into the single run's report (or the
    exit code: 2 for a sweep that is not split, 1 when the cluster could not run every part)."""
    from falsification.sweep import merge_sweeps, split_range
    from obligations.cluster import SWEEP_PART, ClusterError, dask_missing, parse_cluster, run_tasks

    problem = dask_missing()
    if args.fmt != "binary32" or args.sample is not None:
        problem = "--cluster splits a binary32 range (--lo/--hi); a --sample or small-format sweep runs on one device"
    elif device == "host" and args.hi is None:
        problem = "--cluster on the host needs --hi (all 2^32 inputs on CPUs would take hours)"
    if problem:
        print(f"kc: error: --cluster {args.cluster}: {problem}", file=sys.stderr)
        return EXIT_INVALID
    spec = parse_cluster(args.cluster)
    lo, hi = kwargs.pop("lo"), kwargs.pop("hi")
    hi = U32 if hi is None else hi
    if not lo < hi:
        raise ValueError(f"--hi {hi}: must be above --lo {lo}")

    def requests(workers: int) -> list[dict[str, Any]]:
        ranges = split_range(lo, hi, args.parts or 4 * workers)
        print(f"kc sweep {args.op}: {len(ranges)} part(s) on {workers} worker(s) of {spec}", file=sys.stderr)
        return [{**kwargs, "op": args.op, "env": args.env, "device": device, "lo": a, "hi": b} for a, b in ranges]

    t0 = time.perf_counter()
    try:
        parts = run_tasks(spec, device, SWEEP_PART, requests)
    except ClusterError as e:  # a part whose worker died twice: an exhaustive claim has no partial verdict
        print(f"kc: error: --cluster {e}", file=sys.stderr)
        return EXIT_FAILED
    report = merge_sweeps(parts)
    report["wall_seconds"] = round(time.perf_counter() - t0, 4)  # the cluster's start included
    report["cluster"] = str(spec)
    return report


@contextlib.contextmanager
def _working(what: str) -> Any:
    """A live status line (rich) on a terminal for work without item counts; one plain line otherwise."""
    from obligations.console import colour_enabled

    if sys.stderr.isatty():
        try:
            from rich.console import Console

            with Console(stderr=True, no_color=not colour_enabled(sys.stderr)).status(what):
                yield
            return
        except ImportError:
            pass
    print(f"{what} ...", file=sys.stderr, flush=True)
    yield


def _replay_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="the contract")
    p.add_argument("item_id", metavar="ID", help="the falsification item whose case is replayed")
    p.add_argument(
        "--bits", type=bit_patterns, required=True, help="operand bit patterns, comma separated (0x... or ints)"
    )
    p.add_argument("--scalars", type=bit_patterns, default=[], help="scalar operand bit patterns, comma separated")
    p.add_argument(
        "--device",
        choices=["auto", "host", "cuda"],
        default="auto",
        help="auto: cuda when a working GPU is present, else host",
    )
    p.add_argument("--seed", type=SEED, default=0, help="seed of the replayed check")
    p.add_argument("--json", action="store_true", help="print the replayed item's raw JSON record instead")
    _verbosity_options(p)


@command("replay", "re-check exactly one counterexample of a falsification item")
@_configure(_replay_options)
def _replay(args: argparse.Namespace) -> int:
    from falsification.runner import find_item, replay
    from obligations.contract import ContractError, load_contract, shown_path

    device = _resolve_device(args.device)
    if device is None:
        return EXIT_INVALID
    try:
        contract = load_contract(args.path)
    except ContractError as e:
        _print_diagnostics(e.diagnostics)
        return EXIT_INVALID
    if not args.bits:
        print("kc replay: error: argument --bits: no bit pattern given", file=sys.stderr)
        return EXIT_INVALID
    item = find_item(contract.data, args.item_id)
    if item is None:
        print(f"kc: error: no falsification item {args.item_id!r} in {args.path}", file=sys.stderr)
        return EXIT_INVALID
    t0 = time.perf_counter()
    outcome = replay(
        item,
        bits=args.bits,
        scalars=args.scalars,
        device=device,
        contract=contract.data,
        contract_path=shown_path(args.path),
        seed=args.seed,
    )
    record = {"id": args.item_id, "method": "falsify", "seconds": time.perf_counter() - t0, **outcome.to_json()}
    if args.json:
        print(json.dumps(record, indent=2, default=str))
    else:
        _print_replayed(contract, record, args.verbose - args.quiet)
    return EXIT_FAILED if outcome.status.is_failure else EXIT_OK


def _print_replayed(contract: Any, record: dict[str, Any], verbosity: int) -> None:
    """One replayed item in ``kc check``'s style: contract line, item line, counterexample, summary."""
    from obligations.console import Reporter

    reporter = Reporter(sys.stdout, verbosity)
    reporter("contract", {"id": contract.id, "version": contract.data.get("version", ""), "path": contract.path})
    reporter("done", record)
    word = "violated (expected)" if record["status"] == "violated_expected" else record["status"]
    print(f"1 items: 1 {word.replace('_', ' ')}")


# -- entry point --------------------------------------------------------------------------------------


def build_parser(config: Any = None) -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand (defaults from ``[tool.kc]`` when given)."""
    from obligations.config import defaults_for

    parser = argparse.ArgumentParser(
        prog="kc",
        description="kernel-contracts: checkable claims about GPU kernels",
        epilog="exit codes: 0 ok, 1 violated/errored, 2 invalid contract or usage, "
        "3 internal error, 5 no contract collected, 130 interrupted, 143 terminated (SIGTERM)",
    )
    parser.add_argument("--version", action="version", version=f"kc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    load_plugins("commands")  # subcommands that live in their own modules register themselves
    for name, (configure, run) in COMMANDS.items():
        p = sub.add_parser(name, help=getattr(run, "help_text", ""), description=getattr(run, "help_text", ""))
        configure(p)
        p.set_defaults(run=run)
        if config is not None:
            p.set_defaults(**{k: v for k, v in defaults_for(name, config).items() if k != "paths"})
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``kc``; returns the exit code (see module docstring)."""
    _STARTED["main"] = time.perf_counter()
    if argv is None and (started := _process_started()) is not None:  # the command itself, not a test's call
        _STARTED["process"] = started
    words = sys.argv[1:] if argv is None else argv
    from obligations.pycache import enable_bytecode_cache

    enable_bytecode_cache()  # before the heavy imports: the run's workers would each compile torch from source
    if words[:1] == ["check"]:
        from obligations.isolation import stop_on_signals

        # From the start on, SIGINT and SIGTERM stop a check cleanly: even one before the first item (while
        # modules import and contracts load) ends in a result marked interrupted.
        with stop_on_signals():
            return _main(argv)
    return _main(argv)


def _main(argv: list[str] | None) -> int:
    from obligations.config import ConfigError, find_config

    try:
        config = find_config()
    except ConfigError as e:
        print(f"kc: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    parser = build_parser(config)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    if hasattr(args, "paths") and isinstance(getattr(args, "paths", None), list | type(None)):
        args.paths_given = bool(args.paths)
        if not args.paths:
            args.paths = list(config.values.get("contracts") or [DEFAULT_CONTRACTS])
    try:
        return args.run(args)
    except KeyboardInterrupt:  # outside `kc check`'s items (which write a partial result): stop, not a bug
        print("kc: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `kc check | head`: the reader went away; a user's choice, not a kc bug
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_INVALID
    except OSError as e:  # an output (or input) the OS refused: read-only mount, file-size limit, full disk
        if e.filename is None:
            return _internal_error()
        print(f"kc: error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        return EXIT_INVALID
    except Exception:
        return _internal_error()


def _internal_error() -> int:
    traceback.print_exc()
    print("kc: internal error (a bug in kernel-contracts; please report it with the traceback)", file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    # `python -m obligations.cli` runs this file as __main__, a second module object: the commands that
    # graph_cli and libm_audit register go to obligations.cli, so run that module's main.
    from obligations.cli import main as _registered_main

    sys.exit(_registered_main())
