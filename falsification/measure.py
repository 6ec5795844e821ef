"""Performance verdicts decided with statistics: interleaved trials, a bootstrap interval, sequential extension.

A ``measure`` item compares our code with peers measured in the same run on the same device. One **trial**
times every contender once, in alternating order (ours first on even trials, last on odd ones), each as a block
of ``iters`` back-to-back calls between two CUDA events; its value is the ratio of our time to the strongest
peer's (the peer of the least median time). The verdict is taken from a percentile-bootstrap interval of the
**median of the per-trial ratios** (resamples drawn from a generator seeded by the run's seed and the item, so
the decision is reproducible given the timings):

* ``passed`` when the whole interval clears the threshold, ``violated`` when the whole interval misses it;
* otherwise more trials are run (``step`` at a time) up to ``max_trials`` or ``seconds`` of trials, and an
  interval that still straddles the threshold is ``inconclusive`` (a status of its own, not a pass).

Each look at the data spends part of the error rate: with ``L`` looks possible the interval of one look has
confidence ``1 - (1 - confidence) / L`` (Bonferroni), so extending never buys a verdict the data do not carry.
The statistics run on the host (:func:`bootstrap_median`, :func:`decide`, :func:`sequential`, unit-tested with
synthetic timings); :func:`compare` and :func:`compare_cases` drive them with CUDA-event trials.
"""

from __future__ import annotations

import copy
import json
import math
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from obligations.core.entrypoints import paused

__all__ = [
    "PEER_LIBRARIES",
    "Budget",
    "Interval",
    "Verdict",
    "Comparison",
    "looks",
    "bootstrap_median",
    "decide",
    "sequential",
    "item_seed",
    "calibrate",
    "timed_trials",
    "compare",
    "compare_cases",
    "combined_status",
    "device_name",
    "threshold",
    "verdict_evidence",
    "outcome",
    "SHAREABLE_TESTS",
    "share_key",
    "Shared",
]

DIRECTIONS = (">=", "<=")
# The libraries the measure items' peers run on (torch: SDPA, eager MLP and RMSNorm, the scan, training) and cupyx
# (CuPy's random module and ufuncs import it, with SciPy's sparse module: 0.17 s of PO-GEMM-05-floor on an H100):
# on cuda kc check's own worker, which times the measure items, imports them while the contracts load.
PEER_LIBRARIES: tuple[str, ...] = ("torch", "cupyx")
STATUSES = ("passed", "violated", "inconclusive")


@dataclass(frozen=True)
class Budget:
    """How much measuring one item may do: trials, extension steps, seconds, interval confidence, block size."""

    min_trials: int = 8
    step: int = 8
    max_trials: int = 40
    seconds: float = 2.5  # wall seconds of trials (warm-up and calibration not counted); extension stops past it
    confidence: float = 0.95
    resamples: int = 2000
    block_ms: float = 4.0  # target GPU time of one timed block (iters chosen by calibration)
    max_iters: int = 1000
    warmup: int = 3

    def __post_init__(self) -> None:
        if not (1 <= self.min_trials <= self.max_trials) or self.step < 1:
            raise ValueError(f"bad trial budget: {self}")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0.5, 1): {self.confidence}")

    @classmethod
    def of(cls, params: Mapping[str, Any] | None) -> Budget:
        """The default budget with an item's ``params.measure`` overrides (e.g. ``{max_trials: 60}``)."""
        over = dict((params or {}).get("measure") or {})
        unknown = set(over) - set(cls.__dataclass_fields__)
        if unknown:
            raise KeyError(f"params.measure: unknown key(s) {sorted(unknown)}")
        return cls(**over)

    def to_json(self) -> dict[str, Any]:
        """The budget as recorded in the evidence."""
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True)
class Interval:
    """A bootstrap interval of the median of per-trial values."""

    estimate: float
    low: float
    high: float
    confidence: float
    trials: int

    def to_json(self) -> dict[str, Any]:
        """The interval as recorded in the evidence."""
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "confidence": round(self.confidence, 6),
            "trials": self.trials,
            "statistic": "median of per-trial ratios, percentile bootstrap",
        }


@dataclass(frozen=True)
class Verdict:
    """The decision on one comparison: status, the last interval, the threshold and what it cost."""

    status: str
    interval: Interval
    threshold: float
    direction: str
    looks: int
    seconds: float
    values: tuple[float, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)  # what the driver recorded (timings, peers)


def looks(budget: Budget) -> int:
    """How many times :func:`sequential` may look at the data under ``budget`` (the Bonferroni divisor)."""
    return 1 + math.ceil((budget.max_trials - budget.min_trials) / budget.step)


def item_seed(seed: int, name: str) -> int:
    """The bootstrap's seed for one comparison: the run's seed and a stable hash of the item and case."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % 2**63


def bootstrap_median(values: Sequence[float], confidence: float, resamples: int, seed: int) -> Interval:
    """Percentile-bootstrap interval of the median of ``values`` (seeded: the same values give the same interval)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise ValueError(f"bootstrap needs finite values, got {list(values)[:8]}")
    rng = np.random.default_rng(seed)
    meds = np.median(v[rng.integers(0, v.size, (resamples, v.size))], axis=1)
    alpha = 1 - confidence
    lo, hi = np.quantile(meds, [alpha / 2, 1 - alpha / 2])
    return Interval(float(np.median(v)), float(lo), float(hi), confidence, int(v.size))


def decide(interval: Interval, threshold: float, direction: str) -> str:
    """passed when the whole interval satisfies ``value direction threshold``, violated when none of it does."""
    if direction == ">=":
        return "passed" if interval.low >= threshold else "violated" if interval.high < threshold else "inconclusive"
    if direction == "<=":
        return "passed" if interval.high <= threshold else "violated" if interval.low > threshold else "inconclusive"
    raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


def sequential(
    draw: Callable[[int], Sequence[Any]],
    threshold: float,
    direction: str,
    budget: Budget,
    seed: int,
    *,
    values_of: Callable[[Sequence[Any]], Sequence[float]] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Verdict:
    """Draw ``min_trials`` trials, then ``step`` more while the interval straddles ``threshold``, within budget.

    ``draw(k)`` returns k new trial records; ``values_of(records)`` maps all records so far to per-trial values
    (default: the records are the values), recomputed at every look (the strongest peer may change).
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    values_of = values_of or (lambda rs: [float(r) for r in rs])
    per_look = 1 - (1 - budget.confidence) / looks(budget)
    t0 = clock()
    records: list[Any] = list(draw(budget.min_trials))
    n_looks = 0
    while True:
        n_looks += 1
        values = [float(x) for x in values_of(records)]
        interval = bootstrap_median(values, per_look, budget.resamples, seed)
        status = decide(interval, threshold, direction)
        spent = clock() - t0
        if status != "inconclusive" or len(records) >= budget.max_trials or spent >= budget.seconds:
            break
        records.extend(draw(min(budget.step, budget.max_trials - len(records))))
    return Verdict(status, interval, float(threshold), direction, n_looks, round(spent, 4), tuple(values))


# -- CUDA-event trials --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """Ours against one or more peers; ``setup`` runs before each contender's block (e.g. a library's defaults).

    ``peers`` maps a peer's name to its call; ``configs`` says how each peer runs (recorded in the evidence);
    ``context`` maps a contender's name to a context manager factory entered around its timed block.
    """

    ours: Callable[[], Any]
    peers: Mapping[str, Callable[[], Any]]
    configs: Mapping[str, str] = field(default_factory=dict)
    context: Mapping[str, Callable[[], Any]] = field(default_factory=dict)
    ours_name: str = "ours"

    def contenders(self) -> dict[str, Callable[[], Any]]:
        """Every timed call by name, ours first."""
        if not self.peers:
            raise ValueError("a comparison needs at least one peer")
        return {self.ours_name: self.ours, **self.peers}


def _block_ms(fn: Callable[[], Any], iters: int) -> float:
    """Mean milliseconds per call of one timed block (the trials interleave their own warm-up).

    Entry-point recording is paused: the warm-up (calibrate) recorded these calls, and a timed block measures
    the code, not ``kc check``'s bookkeeping around it."""
    from falsification import engine

    with paused():
        return engine.time_ms(fn, iters, warmup=0)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def calibrate(comparison: Comparison, budget: Budget) -> tuple[int, dict[str, float], dict[str, float]]:
    """Warm every contender up (compiles, caches), then the calls per block that make the slowest ~block_ms.

    Returns (calls per block, each contender's ms per call over 10 calls, each contender's warm-up seconds on the
    host: its compiles, first loads and library start-up, which the item pays outside its trials)."""
    first: dict[str, float] = {}
    warm: dict[str, float] = {}
    for name, fn in comparison.contenders().items():
        with comparison.context.get(name, _Null)():
            t0 = time.perf_counter()
            for _ in range(budget.warmup):
                fn()
            warm[name] = round(time.perf_counter() - t0, 4)
            first[name] = _block_ms(fn, 10)
    slowest = max(first.values())
    iters = max(1, min(budget.max_iters, int(budget.block_ms / slowest) if slowest > 0 else budget.max_iters))
    return iters, first, warm


def timed_trials(comparison: Comparison, iters: int, k: int, start: int = 0) -> list[dict[str, float]]:
    """k trials: every contender's ms per call over one block of ``iters`` calls, the order reversed every trial."""
    names = list(comparison.contenders())
    fns = comparison.contenders()
    out = []
    for t in range(start, start + k):
        trial = {}
        for name in names if t % 2 == 0 else reversed(names):
            with comparison.context.get(name, _Null)():
                trial[name] = _block_ms(fns[name], iters)
        out.append(trial)
    return out


def _strongest(records: Sequence[Mapping[str, float]], peers: Sequence[str]) -> str:
    return min(peers, key=lambda p: float(np.median([r[p] for r in records])))


def compare(
    comparison: Comparison, threshold: float, direction: str, budget: Budget, seed: int, *, ratio: str = "speed"
) -> Verdict:
    """Decide ``ratio direction threshold`` against the strongest peer with interleaved CUDA-event trials.

    ``ratio="speed"``: per-trial peer_ms / ours_ms (ours at least ``threshold`` x the peer's speed, ``>=``);
    ``ratio="time"``: ours_ms / peer_ms (ours takes at most ``threshold`` x the peer's time, ``<=``).
    """
    if ratio not in ("speed", "time"):
        raise ValueError(f"ratio must be 'speed' or 'time', got {ratio!r}")
    t0 = time.perf_counter()
    iters, first, warm = calibrate(comparison, budget)
    ours, peers = comparison.ours_name, list(comparison.peers)
    done: list[dict[str, float]] = []

    def draw(k: int) -> list[dict[str, float]]:
        got = timed_trials(comparison, iters, k, start=len(done))
        done.extend(got)
        return got

    def values_of(records: Sequence[Mapping[str, float]]) -> list[float]:
        p = _strongest(records, peers)
        return [r[p] / r[ours] if ratio == "speed" else r[ours] / r[p] for r in records]

    v = sequential(draw, threshold, direction, budget, seed, values_of=values_of)
    peer = _strongest(done, peers)
    medians = {n: float(np.median([r[n] for r in done])) for n in comparison.contenders()}
    extra = {
        "ratio": f"{peer}_ms / {ours}_ms" if ratio == "speed" else f"{ours}_ms / {peer}_ms",
        "quoted_peer": peer,
        "median_ms": medians,
        "peers": {p: comparison.configs.get(p, "library defaults") for p in peers},
        "calls_per_block": iters,
        "calibration_ms_per_call": first,
        "warmup_s": warm,
        "wall_s": round(time.perf_counter() - t0, 4),
    }
    return replace(v, extra=extra)


def compare_cases(
    cases: Mapping[str, Comparison] | Mapping[str, Callable[[], Comparison]],
    threshold: float,
    direction: str,
    budget: Budget,
    seed: int,
    *,
    ratio: str = "speed",
) -> dict[str, Verdict]:
    """:func:`compare` for every case (shapes, lengths), the trial seconds split evenly; a factory is built lazily."""
    share = replace(budget, seconds=budget.seconds / max(1, len(cases)))
    out = {}
    for name, c in cases.items():
        comp = c if isinstance(c, Comparison) else c()
        out[name] = compare(comp, threshold, direction, share, item_seed(seed, name), ratio=ratio)
    return out


def device_name() -> str:
    """The current CUDA device's name (e.g. "NVIDIA H200"), as thresholds keyed by device read it."""
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def threshold(ctx: Any, name: str | None = None) -> tuple[float, str]:
    """The item's threshold on this device and where it came from.

    ``params.tolerance_by_device: {substring: value}`` overrides ``tolerance`` on a device whose name contains the
    substring (first match in the contract's order): a threshold that must differ by GPU says so in the contract.
    """
    if ctx.tolerance is None:
        raise KeyError("the item's tolerance (the threshold a measure item decides against)")
    by = dict(ctx.params.get("tolerance_by_device") or {})
    if by:
        name = name if name is not None else device_name()
        for key, value in by.items():
            if str(key) in name:
                return float(value), f"tolerance_by_device[{key!r}] (device {name})"
    return float(ctx.tolerance), "tolerance" + (f" (device {name})" if name else "")


def combined_status(verdicts: Mapping[str, Verdict]) -> str:
    """violated if any case is, passed if every case is, else inconclusive."""
    statuses = {v.status for v in verdicts.values()}
    return "violated" if "violated" in statuses else "passed" if statuses == {"passed"} else "inconclusive"


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def verdict_evidence(v: Verdict) -> dict[str, Any]:
    """One verdict as evidence: interval, trials, threshold, looks and the driver's record."""
    return {
        "status": v.status,
        "interval": {k: _round(x) if isinstance(x, float) else x for k, x in v.interval.to_json().items()},
        "threshold": v.threshold,
        "direction": v.direction,
        "trials": v.interval.trials,
        "looks": v.looks,
        "trial_seconds": v.seconds,
        "per_trial": [_round(x) for x in v.values],
        **v.extra,
    }


def outcome(ctx: Any, verdicts: Mapping[str, Verdict], claim: str, budget: Budget, **more: Any) -> Any:
    """The item's outcome from its verdicts: passed, violated (the cases that missed) or inconclusive."""
    from falsification import engine
    from obligations.core.results import inconclusive

    status = combined_status(verdicts)
    ev = {
        "claim": claim,
        "cases_measured": {k: verdict_evidence(v) for k, v in verdicts.items()},
        "measure_budget": budget.to_json(),
        "looks_allowed": looks(budget),
        "method": "falsification.measure: interleaved CUDA-event trials, bootstrap interval of the median "
        "per-trial ratio (Bonferroni over the looks), sequential extension within the budget",
        **more,
    }
    trials = sum(v.interval.trials for v in verdicts.values())

    def fmt(k: str, v: Verdict) -> str:
        i = v.interval
        return f"{k}: median {i.estimate:.4g} in [{i.low:.4g}, {i.high:.4g}] ({i.trials} trials)"

    if status == "passed":
        return engine.outcome_passed(ctx, trials, **ev)
    bad = {k: v for k, v in verdicts.items() if v.status == status}
    text = "; ".join(fmt(k, v) for k, v in bad.items())
    if status == "violated":
        ce = {k: verdict_evidence(v)["interval"] for k, v in bad.items()}
        return engine.outcome_violated(ctx, {"intervals": ce}, f"{claim} does not hold: {text}", **ev)
    return inconclusive(
        f"{claim}: the interval straddles the threshold after the measuring budget: {text}",
        **engine.evidence(ctx, cases=trials, **ev),
    )


# -- one measurement for items that ask for the same one ---------------------------------------------------------

# Measure tests whose measurement depends on nothing but the item's own terms (test, params, tolerance, expect) and
# the run's seed, profile and device (none reads the contract, the item's id or words, witnesses or a replay):
# two of their items with the same terms in one run make the same measurement. FALSIFY-CUBLAS-009 and TRAIN-MFU
# (training.mfu), PO-GEMM-04 and FALSIFY-CUBLAS-008 (gemm.overhead) were each measured twice per run (~3.6 s of an
# H100 run's 15 s measure phase, 2026-11-27).
SHAREABLE_TESTS: frozenset[str] = frozenset(
    {"training.mfu", "gemm.overhead", "gemm.throughput", "gemm.mfu_floor", "fusion.perf", "scan.performance"}
)
# Item fields that state or place a claim in words: they change nothing its measurement does or decides.
_WORDS = frozenset({"id", "kind", "location", "type", "property", "equation", "rule", "prediction", "if_fails"})
# The statuses of a measurement made (with ``expect: violated``, a reproduced violation): what a second item reuses.
_MADE = (*STATUSES, "violated_expected")


def share_key(item: Mapping[str, Any]) -> str | None:
    """What a measure item measures, as a key two items of one run share when they make the same measurement.

    None where the item shares nothing: not a measure item, or its test is not in :data:`SHAREABLE_TESTS`.
    """
    if item.get("method") != "measure" or item.get("test") not in SHAREABLE_TESTS:
        return None
    return json.dumps({k: v for k, v in item.items() if k not in _WORDS}, sort_keys=True, default=repr)


class Shared:
    """One run's measurements by :func:`share_key`: a later item of the run that makes the same measurement reuses
    the first one's record fields, its evidence naming the source (``shared_with``). Made per run (never across
    runs); only a measurement made is kept: after an error or a skip the next item measures for itself."""

    def __init__(self) -> None:
        self._made: dict[str, tuple[str, dict[str, Any]]] = {}

    def keep(self, source: str, item: Mapping[str, Any], fields: Mapping[str, Any]) -> None:
        """Keep ``fields``, the record fields ``source`` ("contract:item") got, for the items measuring the same."""
        key = share_key(item)
        if key is not None and key not in self._made and fields.get("status") in _MADE:
            self._made[key] = (source, copy.deepcopy(dict(fields)))

    def reuse(self, item: Mapping[str, Any]) -> dict[str, Any] | None:
        """The record fields of the run's measurement ``item`` asks for, its evidence naming the source; None when
        this run has made none (the item runs its own)."""
        key = share_key(item)
        if key is None or key not in self._made:
            return None
        source, fields = self._made[key]
        out = copy.deepcopy(fields)
        out["evidence"] = {**(out.get("evidence") or {}), "shared_with": source}
        out["cpu_seconds"] = 0.0  # this item computed nothing: its evidence is the source's measurement
        return out
