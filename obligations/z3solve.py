"""Solving one Z3 query so that its verdict depends only on the query: SMT-LIB text in, verdict out.

Why each piece is here:

- **The query is its SMT-LIB text.** The engines build their assertions, print them (``to_smt2``) and solve
  the parsed text in a new Z3 context, so the solve cannot depend on what else the process created (term ids,
  learned state), and the text is the proof cache's key.
- **Deterministic strategies.** Z3's default solver picks a tactic by the query's logic, and for nonlinear
  integer arithmetic (most of our plans) that tactic switches strategies on wall-clock timers (``try_for``):
  the same query spent 3M or 24M rlimit, proved or not, with the machine's load. :data:`STRATEGIES` are
  tried in turn, each under its own share of the rlimit (a cap in resource units, not seconds), with the
  random seed fixed (:data:`SEED`): the verdict and the rlimit spent depend only on the text, the rlimit and
  the seed.
- **Budgets.** The rlimit is the budget; running out of it is ``unknown``. The wall clock is only a safety
  net far above any rlimit's normal time (:data:`WALL_CEILING_S`), and the item's own deadline
  (:func:`obligations.core.cancel.remaining`); hitting either is a timeout, never ``unknown``.
- **Stops.** Z3's own Ctrl-C handler is off (``ctrl_c``): the check runs in a helper thread while the calling
  thread waits, so a signal handler (KeyboardInterrupt, the run's StopRequested, an item timer) runs at once,
  interrupts the context and propagates; a stop requested from elsewhere interrupts it through
  :func:`obligations.core.cancel.on_stop`. An interrupt is never an item's verdict.
- **Stability** (``kc check --z3-stability N``): :func:`perturbed` renames the symbols and shuffles the
  assertions, :func:`solve_in_fresh_process` solves that with another seed in a new process.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import z3

from obligations.core import cancel

__all__ = [
    "TACTIC",
    "STRATEGIES",
    "Strategy",
    "SEED",
    "WALL_CEILING_S",
    "Verdict",
    "query_text",
    "solver_params",
    "solve",
    "check",
    "minimise",
    "perturbed",
    "solve_in_fresh_process",
    "stability_runs",
    "stability_table",
]

# Z3's own QF_NIA preamble (simplify, solve-eqs, contextual simplification, unconstrained-term elimination),
# then sums of monomials and the smt core: the path Z3's default takes for our queries, without its timers.
SEED = 0
WALL_CEILING_S = 120.0


def _t(ctx: z3.Context, name: str, **params: Any) -> z3.Tactic:
    tac = z3.Tactic(name, ctx=ctx)
    return z3.With(tac, **params) if params else tac


def _preamble(ctx: z3.Context) -> list[z3.Tactic]:
    """Z3's own QF_NIA preamble: simplification, equation solving, contextual simplification, unconstrained
    terms eliminated, then sums of monomials."""
    return [
        _t(ctx, "simplify"),
        _t(ctx, "propagate-values"),
        _t(ctx, "solve-eqs"),
        _t(ctx, "ctx-simplify", max_depth=30, max_steps=5_000_000),
        _t(ctx, "simplify", pull_cheap_ite=True, local_ctx=True, local_ctx_limit=10_000_000),
        _t(ctx, "elim-uncnstr"),
        _t(ctx, "lia2card"),
        _t(ctx, "card2bv"),
        _t(ctx, "simplify", som=True),
    ]


@dataclass(frozen=True)
class Strategy:
    """One deterministic way to solve a query, and the share of the rlimit it may spend (None: what is left)."""

    name: str
    build: Callable[[z3.Context, int], z3.Tactic]
    cap: int | None


_NLSAT = Strategy(
    "nlsat",
    lambda ctx, seed: z3.Then(*_preamble(ctx), _t(ctx, "qfnra-nlsat", seed=seed), _t(ctx, "fail-if-undecided")),
    1_000_000,
)
_PREAMBLE_SMT = Strategy(
    "qfnia-preamble+smt",
    lambda ctx, seed: z3.Then(*_preamble(ctx), _t(ctx, "smt", random_seed=seed)),
    2_000_000,
)
_SMT = Strategy("smt", lambda ctx, seed: _t(ctx, "smt", random_seed=seed), None)

# Tried in order, each under its own deterministic cap (the last: what is left of the rlimit), until one
# decides. Proving (an unsat claim): the preamble + smt core proves most plans (up to 1.8M units on the
# shipped contracts); the plain smt core proves the few the preamble makes hard (ATT-PLAN-smem, CONV-GROUP-z3:
# 0.1M units where the preamble + smt spends 50M). Finding a model (the vacuity check, pinned minimisation):
# nlsat first, which decides satisfiable nonlinear queries at once (IM2COL-rows' assumptions: 0.04 s where
# the smt core ran 60 s). Each stage's verdict depends only on the text, its cap and the seed, so the
# portfolio's does too.
STRATEGIES: dict[str, tuple[Strategy, ...]] = {
    "prove": (_PREAMBLE_SMT, _SMT),
    "find": (_NLSAT, _PREAMBLE_SMT, _SMT),
}
TACTIC = "; ".join(
    f"{goal}: " + " > ".join(st.name + (f" ({st.cap})" if st.cap else "") for st in order)
    for goal, order in STRATEGIES.items()
)


@dataclass(frozen=True)
class Verdict:
    """One solve: ``result`` is unsat, sat, unknown (the rlimit ran out, or the solver gave up) or timeout."""

    result: str
    reason: str | None = None
    rlimit_used: int | None = None
    seconds: float = 0.0
    model: dict[str, int | bool] | None = None
    deadline: bool = False  # a timeout caused by the item's deadline (not the wall ceiling)
    strategy: str | None = None  # the strategy of STRATEGIES that decided (or was tried last)


def query_text(assertions: Sequence[Any]) -> str:
    """The SMT-LIB text of ``assertions``, in their order (the query the solvers parse and the cache keys)."""
    s = z3.Solver(ctx=assertions[0].ctx) if assertions else z3.Solver()
    s.add(*assertions)
    return s.to_smt2()


def solver_params(rlimit: int, seed: int = SEED) -> dict[str, Any]:
    """Everything besides the text that the verdict depends on (part of the cache key)."""
    return {"tactic": TACTIC, "random_seed": seed, "rlimit": rlimit, "z3": z3.get_version_string()}


def _timeout_s(wall_s: float) -> tuple[float, bool]:
    """(seconds the solver may run, whether the item's deadline is what binds)."""
    left = cancel.remaining()
    if left is not None and left < wall_s:
        return left, True
    return wall_s, False


def _checked(ctx: z3.Context, run: Any) -> Any:
    """``run()`` (a Z3 check) in a helper thread; a signal or stop request meanwhile interrupts ``ctx``."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["r"] = run()
        except BaseException as e:  # handed to the calling thread
            box["e"] = e

    t = threading.Thread(target=target, name="kc-z3", daemon=True)
    with cancel.on_stop(ctx.interrupt):
        t.start()
        try:
            while t.is_alive():
                t.join(0.05)
        except BaseException:  # KeyboardInterrupt, StopRequested, an item timer: stop the solver, then go on
            ctx.interrupt()
            t.join()
            raise
    if "e" in box:
        raise box["e"]
    return box["r"]


def _stopped() -> None:
    reason = cancel.stop_requested()
    if reason is not None:
        raise cancel.StopRequested(reason)


def check(s: z3.Solver | z3.Optimize) -> Any:
    """``s.check()`` that a Ctrl-C or a stop request interrupts at once and that raises, never returning their
    ``unknown`` (Z3's own Ctrl-C handler off; the check in a helper thread, as in :func:`solve`)."""
    s.set("ctrl_c", False)
    r = _checked(s.ctx, s.check)
    if r == z3.unknown:
        _stopped()
        if s.reason_unknown() in ("interrupted from keyboard", "interrupted"):
            raise KeyboardInterrupt
    return r


def _rlimit_used(stats: z3.Statistics) -> int | None:
    for k in stats.keys():
        if k == "rlimit count":
            return int(stats.get_key_value(k))
    return None


def _value(model: z3.ModelRef, const: Any) -> int | bool:
    v = model.evaluate(const, model_completion=True)
    return bool(z3.is_true(v)) if z3.is_bool(const) else v.as_long()


def _consts(ctx: z3.Context, names: Mapping[str, str]) -> dict[str, Any]:
    return {n: (z3.Bool(n, ctx) if sort == "bool" else z3.Int(n, ctx)) for n, sort in names.items()}


def solve(
    text: str,
    *,
    rlimit: int,
    seed: int = SEED,
    wall_s: float = WALL_CEILING_S,
    model_of: Mapping[str, str] | None = None,
    goal: str = "prove",
) -> Verdict:
    """Solve the SMT-LIB ``text`` with the :data:`STRATEGIES` of ``goal`` ("prove": unsat expected, "find": a
    model expected) in turn within ``rlimit`` in all; ``model_of`` ({name: "int" | "bool"}): read these symbols'
    values from a model. Raises StopRequested/KeyboardInterrupt on a stop, never a verdict. The verdict's
    ``strategy`` is the one that decided."""
    t0 = time.perf_counter()
    spent = 0
    last = Verdict("unknown", "rlimit exhausted", 0)
    order = STRATEGIES[goal]
    for k, strategy in enumerate(order):
        left = rlimit - spent
        if left <= 0:
            break
        cap = left if strategy.cap is None or k == len(order) - 1 else min(strategy.cap, left)
        v = _solve_one(text, strategy, cap, seed, max(0.0, wall_s - (time.perf_counter() - t0)), model_of)
        spent += cap if v.result == "unknown" else (v.rlimit_used or 0)  # a stage that gave up spent its cap
        last = replace(v, rlimit_used=spent, seconds=round(time.perf_counter() - t0, 3), strategy=strategy.name)
        if v.result != "unknown":
            return last
    return last


def _solve_one(
    text: str, strategy: Strategy, rlimit: int, seed: int, wall_s: float, model_of: Mapping[str, str] | None
) -> Verdict:
    seconds, deadline = _timeout_s(wall_s)
    ctx = z3.Context()
    s = strategy.build(ctx, seed).solver()
    s.set("rlimit", rlimit)
    s.set("timeout", max(1, int(seconds * 1000)))
    s.set("ctrl_c", False)
    s.from_string(text)
    t0 = time.perf_counter()
    r = _checked(ctx, s.check)
    took = round(time.perf_counter() - t0, 3)
    used = _rlimit_used(s.statistics())
    if r == z3.unsat:
        return Verdict("unsat", None, used, took)
    if r == z3.sat:
        model = s.model()
        values = {n: _value(model, c) for n, c in _consts(ctx, model_of or {}).items()}
        return Verdict("sat", None, used, took, values)
    why = s.reason_unknown()
    _stopped()
    if why == "timeout":
        return Verdict("timeout", why, used, took, deadline=deadline)
    if why in ("interrupted from keyboard", "interrupted"):  # not ours: someone else's Ctrl-C reached Z3
        raise KeyboardInterrupt
    if why == "canceled" and (used is None or used < rlimit) and took >= seconds:
        return Verdict("timeout", why, used, took, deadline=deadline)
    return Verdict("unknown", "rlimit exhausted" if why == "canceled" else why, used, took)


def _smt_int(v: int) -> str:
    return str(v) if v >= 0 else f"(- {-v})"


def minimise(
    text: str,
    order: Sequence[tuple[str, int]],
    found: Mapping[str, int | bool],
    *,
    rlimit: int,
    wall_s: float = WALL_CEILING_S,
    model_of: Mapping[str, str],
) -> tuple[dict[str, int | bool], str]:
    """A smaller model of ``text``, greedily in ``order`` ((symbol, lower bound)): each symbol in turn is pinned to
    its target (0 if its range holds 0, else its lower bound), else to the smallest of a few values between
    target and its current value that Z3 still satisfies, else to its current value; ``rlimit`` bounds the
    whole search. Returns (model, "minimal" when every symbol reached its target, else "reduced" or
    "as found") - cheap where a lexicographic Optimize over nonlinear plans costs many times the proof."""
    current = dict(found)
    pins: list[str] = []
    spent = 0
    reached = True
    changed = False
    for name, lo in order:
        cur = int(current[name])
        target = 0 if lo <= 0 else lo
        tries = sorted({target + ((cur - target) >> shift) for shift in (62, 24, 12, 6, 3, 1)} | {target})
        tries = [t for t in tries if abs(t) < abs(cur) or (lo > 0 and t < cur)]
        pinned = False
        for value in tries:
            if spent >= rlimit:
                break
            pin = f"(assert (= {name} {_smt_int(value)}))"
            query = text + "\n".join([*pins, pin])
            v = solve(query, rlimit=rlimit - spent, wall_s=wall_s, model_of=model_of, goal="find")
            spent += v.rlimit_used or 0
            if v.result == "sat" and v.model is not None:
                current, pinned, changed = dict(v.model), True, True
                pins.append(pin)
                reached = reached and value == target
                break
        if not pinned:
            reached = reached and cur == target
            pins.append(f"(assert (= {name} {_smt_int(int(current[name]))}))")
    if reached:
        return current, "minimal"
    return current, ("reduced" if changed else "as found")


def perturbed(text: str, k: int) -> str:
    """``text`` with its symbols renamed and its assertions shuffled (run ``k``): the same query in meaning."""
    ctx = z3.Context()
    assertions = list(z3.parse_smt2_string(text, ctx=ctx))
    consts: dict[str, Any] = {}
    todo = list(assertions)
    seen: set[int] = set()
    while todo:  # every uninterpreted constant, by name (the declared symbols)
        e = todo.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            consts[e.decl().name()] = e
        todo.extend(e.children())
    pairs = [(c, z3.Const(f"{name}!p{k}", c.sort())) for name, c in sorted(consts.items())]
    renamed = [z3.substitute(a, *pairs) if pairs else a for a in assertions]
    random.Random(k).shuffle(renamed)
    return query_text(renamed) if renamed else text


def solve_in_fresh_process(text: str, *, rlimit: int, seed: int, wall_s: float = WALL_CEILING_S) -> Verdict:
    """:func:`solve` in a new Python process (nothing of this one carries over); a stop kills it."""
    seconds, deadline = _timeout_s(wall_s)
    request = json.dumps({"text": text, "rlimit": rlimit, "seed": seed, "wall_s": seconds})
    proc = subprocess.Popen(
        [sys.executable, "-m", "obligations.z3solve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C at the terminal is the run's to handle, then it kills this
    )
    try:
        with cancel.on_stop(proc.kill):
            out, err = proc.communicate(request.encode(), timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return Verdict("timeout", "the solver process did not answer", None, seconds, deadline=deadline)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    _stopped()
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return Verdict("unknown", f"the solver process failed: {tail[0]}")
    data = json.loads(out)
    return Verdict(**{**data, "deadline": deadline and data["result"] == "timeout"})


def stability_runs(
    text: str,
    first: Verdict,
    runs: int,
    *,
    rlimit: int,
    wall_s: float = WALL_CEILING_S,
    solve_one: Callable[..., Verdict] | None = None,
) -> list[Verdict]:
    """The ``runs`` verdicts of ``--z3-stability``: ``first`` (the query as built, seed :data:`SEED`), then run k
    of 1..runs-1: :func:`perturbed` text k solved with seed k, by ``solve_one`` (default
    :func:`solve_in_fresh_process`; :func:`solve` gives the same verdicts and rlimits in this process)."""
    one = solve_one or solve_in_fresh_process
    return [first] + [one(perturbed(text, k), rlimit=rlimit, seed=k, wall_s=wall_s) for k in range(1, runs)]


def stability_table(verdicts: Sequence[Verdict]) -> dict[str, Any]:
    """``{runs, proved, rlimit_min, rlimit_median, rlimit_max, seconds_max}`` of the runs (and what the unproved
    ones said); seconds_max, the longest run's solving time, is the one entry that depends on the machine."""
    used = [v.rlimit_used for v in verdicts if v.rlimit_used is not None]
    table: dict[str, Any] = {
        "runs": len(verdicts),
        "proved": sum(v.result == "unsat" for v in verdicts),
        "rlimit_min": min(used) if used else None,
        "rlimit_median": int(statistics.median(used)) if used else None,
        "rlimit_max": max(used) if used else None,
        "seconds_max": max((v.seconds for v in verdicts), default=None),
    }
    failed = [f"run {k}: {v.result}" + (f" ({v.reason})" if v.reason else "") for k, v in enumerate(verdicts)]
    failed = [f for f, v in zip(failed, verdicts, strict=True) if v.result != "unsat"]
    if failed:
        table["not_proved"] = failed
    return table


def _main() -> int:
    """Serve one :func:`solve` request (JSON on stdin, the verdict as JSON on stdout)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops this process by killing it
    req = json.loads(sys.stdin.read())
    v = solve(req["text"], rlimit=int(req["rlimit"]), seed=int(req["seed"]), wall_s=float(req["wall_s"]))
    data = asdict(v)
    data.pop("deadline")
    sys.stdout.write(json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
