"""Falsification tests of the deterministic RNG family (contracts/rng-splitmix64-v1.yaml).

Registered names and their ``params`` (``variant`` selects a planted-bug build; the project's tests only):

* ``rng.agreement`` {output: bits|uniform|mask|dropout|normal} -- the kernel on the run's device against
  :mod:`spec.rng`: bitwise, except ``normal`` within the item's tolerance in binary32 ULPs of the
  extended-precision reference. Hypothesis draws (seed, counter, shape, keep_prob, x) and shrinks a
  disagreement to the smallest call; the counterexample names the first disagreeing element.
* ``rng.cross_device`` {outputs, seeds, size} (CUDA only) -- CUDA against the host path on large tensors:
  bitwise for bits/uniform/mask/dropout, ``normal`` within the tolerance (ULPs).
* ``rng.uniform_map_model`` {} -- the kernel's uniform map against the integer model the enumerated
  "uniform < 1" obligation checks (:func:`native.rng.uniform_map_plan`), on all 2^24 inputs (profile
  full) or the top 2^20 plus a random sample (profile quick).
* ``rng.statistics`` {seeds, log2_n} -- chi-square uniformity (256 bins), serial pairs, adjacent-counter
  pairs, low bits of the raw words and a normal histogram; the item's tolerance is the family-wise
  false-alarm rate alpha, split evenly (Bonferroni) over every statistic computed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from falsification import engine
from falsification.agreement import Expected
from falsification.engine import Check
from falsification.registry import FalsifyContext, Replay, guarded, register_test
from native import rng as native
from obligations.core.device import array_module, to_host
from obligations.core.plans import regime_of
from obligations.core.results import Outcome, error
from obligations.core.symbolic import Term, tracking
from spec import rng as spec
from spec import softfloat as sf

__all__ = ["RngCase", "rng_cases", "compare_case", "chi_square_sf", "uniformity_statistics"]


@dataclass(frozen=True)
class RngCase:
    """One RNG call: its seed, counter, shape, keep_prob (binary32 bits) and the seed of the dropout input."""

    seed: int
    counter: int
    shape: tuple[int, ...]
    keep_prob_bits: int = spec.ONE_BITS
    x_seed: int = 0
    block: int = native.DEFAULT_BLOCK  # launch knobs: a regime witness shrinks the grid
    max_grid: int = native.DEFAULT_MAX_GRID

    def to_json(self) -> dict[str, Any]:
        """JSON form with the keep_prob as hex bits and value."""
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["keep_prob"] = float(np.array([self.keep_prob_bits], np.uint32).view(np.float32)[0])
        d["keep_prob_bits"] = f"0x{self.keep_prob_bits:08X}"
        return d


_U64_EDGES = (0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 2**20, 2**64 - 1)
# keep_prob values in (0, 1]: 1 (keeps all), 1 - 2^-24, 0.5, 2^-24 and the smallest subnormal.
_KEEP_EDGES = (0x3F800000, 0x3F7FFFFF, 0x3F000000, 0x33800000, 0x00000001)


def rng_cases(max_size: int) -> st.SearchStrategy[RngCase]:
    """Calls with boundary-biased seeds and counters (wrap-around), shapes up to max_size elements."""
    u64 = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from(_U64_EDGES))
    shapes = st.lists(st.integers(1, 64), min_size=1, max_size=3).filter(lambda s: math.prod(s) <= max_size)
    keep = st.one_of(st.sampled_from(_KEEP_EDGES), st.integers(1, 0x3F800000))
    return st.builds(RngCase, u64, u64, shapes.map(tuple), keep, st.integers(0, 2**32 - 1))


def _dropout_input(case: RngCase, n: int) -> np.ndarray:
    """float32 bits for dropout: random patterns with zeros, infinities, NaNs and subnormals mixed in."""
    g = np.random.default_rng(case.x_seed)
    x = g.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    specials = np.array(
        [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFBADBAD, 0x00000001, 0x3F800000, 0x7F7FFFFF],
        dtype=np.uint32,
    )
    pick = g.integers(0, 4, n) == 0
    x[pick] = specials[g.integers(0, specials.size, int(pick.sum()))]
    return x


def _reference(output: str, case: RngCase) -> tuple[np.ndarray, np.ndarray | None]:
    """(reference uint32 bits, dropout input bits or None) of one case, flat."""
    n = math.prod(case.shape)
    words = spec.draw_words(case.seed, case.counter, n, 2 if output == "normal" else 1)
    if output == "bits":
        return words[:, 0], None
    if output == "normal":
        ref = spec.normal_reference(words[:, 0], words[:, 1])
        if ref is None:
            raise _NoReference("no extended-precision float type on this host for the normal reference")
        return ref.bits, None
    uni = spec.uniform_reference(words[:, 0])
    if output == "uniform":
        return uni, None
    mask = spec.mask_reference(uni, case.keep_prob_bits)
    if output == "mask":
        return mask.astype(np.uint32), None
    x = _dropout_input(case, n)
    return spec.dropout_reference(x, mask, case.keep_prob_bits), x


class _NoReference(RuntimeError):
    pass


def _native(output: str, case: RngCase, device: str, variant: str | None, x: np.ndarray | None) -> np.ndarray:
    kp = float(np.array([case.keep_prob_bits], np.uint32).view(np.float32)[0])
    xp = array_module(device)
    xs = None if x is None else xp.asarray(x.view(np.float32).reshape(case.shape))
    out = native.generate(
        output,
        case.shape,
        case.seed,
        case.counter,
        device=device,
        keep_prob=kp,
        x=xs,
        variant=variant,
        block=case.block,
        max_grid=case.max_grid,
    )
    return np.ascontiguousarray(to_host(out)).reshape(-1).astype(np.uint32)


def compare_case(output: str, case: RngCase, device: str, variant: str | None, ulp_bound: int) -> dict | None:
    """None when the kernel agrees with the spec on this call, else the first disagreeing element."""
    ref, x = _reference(output, case)
    got = _native(output, case, device, variant, x)
    if output == "normal":
        dist = np.asarray(sf.ulp_distance(got, ref, sf.BINARY32)).astype(np.float64)
        bad = np.flatnonzero(dist > ulp_bound)
    else:
        dist = None
        bad = np.flatnonzero(got != ref)
    if bad.size == 0:
        return None
    i = int(bad[0])
    el = {
        "index": i,
        "multi_index": [int(k) for k in np.unravel_index(i, case.shape)],
        "native": f"0x{int(got[i]):08X}",
        "reference": f"0x{int(ref[i]):08X}",
        "disagreements": int(bad.size),
    }
    if dist is not None:
        el["ulp_distance"] = float(dist[i])
    if x is not None:
        el["x"] = f"0x{int(x[i]):08X}"
    return el


def _encode(case: RngCase) -> tuple[int, ...]:
    return (case.seed, case.counter, case.keep_prob_bits, case.x_seed, case.block, case.max_grid, *case.shape)


def _decode(rp: Replay) -> RngCase:
    v = rp.values
    if len(v) < 7:
        raise ValueError("an RNG case is seed, counter, keep_prob bits, x seed, block, max grid, then the shape")
    return RngCase(v[0], v[1], tuple(v[6:]), v[2], v[3], v[4], v[5])


def _draws(output: str) -> int:
    return native.MODES[output][1]


def _from_witness(ctx: FalsifyContext, w: Any) -> RngCase:
    """The call at a rng_plan regime witness: its element count, launched with its knobs (keep_prob 0.5)."""
    return RngCase(ctx.seed, 0, (int(w["n_elems"]),), 0x3F000000, ctx.seed, int(w["block"]), int(w["max_grid"]))


def _regimes(output: str, case: RngCase) -> list[str]:
    return regime_of(
        native.rng_plan,
        {"n_elems": math.prod(case.shape), "draws": _draws(output), "block": case.block, "max_grid": case.max_grid},
    )


def _build(ctx: FalsifyContext, **more: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"variant": ctx.params.get("variant", "default")}
    if ctx.device == "cuda":
        ev["compile"] = native.route_evidence()
    ev.update(more)
    return ev


@register_test("rng.agreement")
@guarded(skip=(_NoReference,))
def agreement(ctx: FalsifyContext) -> Outcome:
    """Kernel output equals spec.rng bit for bit (normal: within the tolerance in binary32 ULPs)."""
    output = str(ctx.params["output"])
    if output not in native.MODES:
        return error(f"params.output must be one of {sorted(native.MODES)}")
    bound = int(ctx.tolerance or 0) if output == "normal" else 0
    variant = ctx.params.get("variant")
    b = ctx.budget
    big = RngCase(ctx.seed, 0, (b.bulk,), 0x3F800000, ctx.seed)
    ag = (
        engine.item_agreement(ctx, "max_ulp", bound=bound)
        if output == "normal"
        else engine.item_agreement(ctx, "bitwise")
    )

    def inputs(case: RngCase) -> tuple[RngCase, np.ndarray, np.ndarray | None]:
        ref, x = _reference(output, case)
        return case, ref, x

    build = _build(ctx, output=output, big_case_elements=b.bulk, max_size=b.max_size)
    if output == "normal":
        build["reference"] = "binary64 pinned u1 and t; log/sqrt/cos in numpy longdouble; rounded once to binary32"
    check = Check(
        name=f"rng {output}",
        inputs=inputs,
        native=lambda a: _native(output, a[0], ctx.device, variant, a[2]),
        reference=lambda a: Expected(bits=a[1]),
        agreement=ag,
        cases=rng_cases(b.max_size),
        explicit=(big,),
        encode=_encode,
        decode=_decode,
        describe=lambda case: case.to_json(),
        build=build,
        from_witness=lambda w: _from_witness(ctx, w),
        regime_of=lambda case: _regimes(output, case),
    )
    return engine.run(ctx, check)


@register_test("rng.cross_device", devices=("cuda",))
@guarded(skip=(_NoReference,))
def cross_device(ctx: FalsifyContext) -> Outcome:
    """CUDA equals the host path: bitwise for bits/uniform/mask/dropout, normal within the tolerance (ULPs)."""
    p = ctx.params
    outputs = list(p.get("outputs", ["bits", "uniform", "mask", "dropout", "normal"]))
    size = int(p.get("size", ctx.budget.bulk))
    seeds = [int(s) for s in p.get("seeds", [ctx.seed, 2**64 - 1])]
    bound = int(ctx.tolerance or 0)
    stats: dict[str, Any] = {}
    for out in outputs:
        worst, nonzero = 0.0, 0
        for s in seeds:
            case = RngCase(s, 2**64 - 7, (size // 64, 64), 0x3F666666, s)
            x = _dropout_input(case, size) if out == "dropout" else None
            h = _native(out, case, "host", p.get("variant"), x)
            c = _native(out, case, "cuda", p.get("variant"), x)
            if out == "normal":
                d = np.asarray(sf.ulp_distance(c, h, sf.BINARY32)).astype(np.float64)
            else:
                d = (c != h).astype(np.float64)
            worst, nonzero = max(worst, float(d.max())), nonzero + int((d > 0).sum())
            limit = bound if out == "normal" else 0
            if d.max() > limit:
                i = int(np.argmax(d))
                cex = {
                    "output": out,
                    "call": case.to_json(),
                    "index": i,
                    "cuda": f"0x{int(c[i]):08X}",
                    "host": f"0x{int(h[i]):08X}",
                    "distance": float(d[i]),
                }
                return engine.outcome_violated(ctx, cex, f"{out}: CUDA and host differ at element {i}", **_build(ctx))
        stats[out] = {"max_distance": worst, "elements_differing": nonzero, "elements": size * len(seeds)}
    return engine.outcome_passed(
        ctx,
        len(outputs) * len(seeds),
        elements=size * len(seeds) * len(outputs),
        per_output=stats,
        normal_ulp_bound=bound,
        **_build(ctx),
    )


def _digest32(a: np.ndarray) -> str:
    """SHA-256 of an array of values in [0, 2^32) as little-endian uint32 (equal digests: equal arrays)."""
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(a, dtype="<u4").tobytes()).hexdigest()


@register_test("rng.uniform_map_model")
@guarded(skip=(_NoReference,))
def uniform_map_model(ctx: FalsifyContext) -> Outcome:
    """The kernel's uniform map equals the integer model uniform_map_plan (all 2^24 distinct inputs on full)."""
    variant = ctx.params.get("variant")
    plan_fn = native.design_uniform_map_plan if ctx.params.get("model") == "design" else native.uniform_map_plan
    exhaustive = ctx.budget.bulk >= 1 << 24
    if exhaustive:
        u24 = np.arange(1 << 24, dtype=np.int64)
    else:
        g = np.random.default_rng(ctx.seed)
        u24 = np.unique(
            np.concatenate(
                [
                    np.arange((1 << 24) - (1 << 20), 1 << 24, dtype=np.int64),
                    np.arange(0, 4096, dtype=np.int64),
                    g.integers(0, 1 << 24, ctx.budget.bulk, dtype=np.int64),
                ]
            )
        )
    # The low 8 bits vary too: the map must ignore them (255 for the top region, random elsewhere).
    low = np.random.default_rng(ctx.seed + 1).integers(0, 256, u24.size, dtype=np.int64)
    words = (u24 << 8) | low
    got = to_host(
        native.uniform_map(
            array_module(ctx.device).asarray(words.astype(np.uint32)), device=ctx.device, variant=variant
        )
    ).astype(np.int64)
    # The model's bits are a pure function of the plan's host code and these words (seed, coverage): where the run's
    # store holds their digest from an earlier evaluation and the kernel's bits have the same digest, the kernel equals
    # the model on every input (SHA-256); otherwise the model is evaluated here (and its digest stored).
    store = ctx.draws if ctx.replay is None else None
    key = None
    if store is not None:
        parts = {"model": f"{plan_fn.__module__}.{plan_fn.__name__}", "seed": ctx.seed, "bulk": ctx.budget.bulk}
        key = store.key({**parts, "exhaustive": exhaustive, "inputs": int(words.size)})
    stored = store.get(key) if store is not None and key is not None else None
    if stored is not None and stored == [_digest32(got)]:
        bad = np.zeros(0, dtype=np.int64)
    else:
        with tracking():
            model = np.asarray(plan_fn(Term(words, "uint32"))["uniform_bits"].expr, dtype=np.int64)
        if store is not None and key is not None and ((model >= 0) & (model < 1 << 32)).all():
            store.put(key, [_digest32(model)])
        bad = np.flatnonzero(got != model)
    ev = _build(
        ctx,
        inputs=int(words.size),
        coverage="all 2^24 values of u >> 8"
        if exhaustive
        else f"top 2^20 values of u >> 8, 0..4095 and {ctx.budget.bulk} random",
        max_bits=f"0x{int(got.max()):08X}",
    )
    if bad.size:
        i = int(bad[0])
        cex = {
            "u": f"0x{int(words[i]):08X}",
            "kernel": f"0x{int(got[i]):08X}",
            "model": f"0x{int(model[i]):08X}",
            "disagreements": int(bad.size),
        }
        return engine.outcome_violated(
            ctx, cex, "the kernel's uniform map differs from the model the enumeration checks", **ev
        )
    return engine.outcome_passed(ctx, int(words.size), **ev)


# -- statistics ----------------------------------------------------------------------------------------


def _gammaincc(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x) (series below a + 1, continued fraction above)."""
    if x <= 0:
        return 1.0
    lg = math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        k = a
        for _ in range(10_000):
            k += 1
            term *= x / k
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - lg))
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-16:
            break
    return math.exp(-x + a * math.log(x) - lg) * h


def chi_square_sf(stat: float, df: int) -> float:
    """P(X >= stat) for a chi-square variable with df degrees of freedom."""
    return _gammaincc(df / 2.0, stat / 2.0)


def _chi2(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int, float]:
    exp = probs * counts.sum()
    stat = float(((counts - exp) ** 2 / exp).sum())
    df = counts.size - 1
    return stat, df, chi_square_sf(stat, df)


def _normal_bins() -> tuple[np.ndarray, np.ndarray]:
    edges = np.concatenate([[-np.inf], np.linspace(-3.5, 3.5, 57), [np.inf]])
    cdf = np.array([0.5 * (1 + math.erf(e / math.sqrt(2))) if np.isfinite(e) else float(e > 0) for e in edges])
    return edges, np.diff(cdf)


def uniformity_statistics(
    u: np.ndarray, u_next_counter: np.ndarray, words: np.ndarray, z: np.ndarray
) -> dict[str, dict[str, float]]:
    """Chi-square statistics and p-values of one seed: histogram, serial pairs, adjacent counters, low bits, normal."""
    out = {}
    out["uniform_256_bins"] = np.bincount((u * 256).astype(np.int64), minlength=256)
    a, b = (u[0::2] * 16).astype(np.int64), (u[1::2] * 16).astype(np.int64)
    out["serial_pairs_16x16"] = np.bincount(a * 16 + b, minlength=256)
    c, d = (u * 16).astype(np.int64), (u_next_counter * 16).astype(np.int64)
    out["adjacent_counter_pairs_16x16"] = np.bincount(c * 16 + d, minlength=256)
    out["raw_low_byte"] = np.bincount((words & 0xFF).astype(np.int64), minlength=256)
    res = {}
    for name, counts in out.items():
        stat, df, p = _chi2(counts.astype(np.float64), np.full(256, 1 / 256))
        res[name] = {"chi2": round(stat, 3), "df": df, "p": p}
    edges, probs = _normal_bins()
    counts = np.histogram(z.astype(np.float64), bins=edges)[0].astype(np.float64)
    stat, df, p = _chi2(counts, probs)
    res["normal_58_bins"] = {"chi2": round(stat, 3), "df": df, "p": p}
    return res


@register_test("rng.statistics")
@guarded(skip=(_NoReference,))
def statistics(ctx: FalsifyContext) -> Outcome:
    """Chi-square uniformity/independence at fixed seeds; rejects only below alpha / (number of statistics)."""
    alpha = ctx.tolerance
    if not isinstance(alpha, int | float) or not 0 < alpha < 1:
        return error("rng.statistics needs the family-wise false-alarm rate alpha as the item's tolerance")
    p = ctx.params
    seeds = [int(s) for s in p.get("seeds", [0, 1])]
    n = 1 << int(p.get("log2_n", 20))
    variant = p.get("variant")
    per_seed: dict[str, Any] = {}
    for s in seeds:

        def gen(mode: str, counter: int, s: int = s) -> np.ndarray:
            return np.ascontiguousarray(
                to_host(native.generate(mode, n, s, counter, device=ctx.device, variant=variant))
            ).reshape(-1)

        u = gen("uniform", 0).view(np.float32)
        res = uniformity_statistics(
            u, gen("uniform", 1).view(np.float32), gen("bits", 0), gen("normal", 0).view(np.float32)
        )
        per_seed[str(s)] = res
    tests = sum(len(r) for r in per_seed.values())
    threshold = alpha / tests
    worst = min((r["p"], s, name) for s, rs in per_seed.items() for name, r in rs.items())
    ev = _build(
        ctx,
        alpha=alpha,
        statistics=tests,
        per_test_threshold=threshold,
        elements_per_stream=n,
        results=per_seed,
        smallest_p={"p": worst[0], "seed": worst[1], "statistic": worst[2]},
    )
    if worst[0] < threshold:
        return engine.outcome_violated(
            ctx,
            {"seed": int(worst[1]), "statistic": worst[2], "p": worst[0], "threshold": threshold},
            f"{worst[2]} at seed {worst[1]}: p = {worst[0]:.3g} < alpha / {tests}",
            **ev,
        )
    return engine.outcome_passed(ctx, tests, **ev)


# -- device-side initializers (MK-41..MK-46) --------------------------------------------------------------------

_PAYLOAD_BITS = np.array(
    [0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC12345, 0x7F800001],
    dtype=np.uint32,
)
# (fan_in, fan_out) pairs of the initializer cases: a bound exact in binary32 (6 / 96 = 1/16) and inexact ones.
_FANS = ((64, 32), (3, 7), (1000, 1), (1, 1))


def _init_case(op: str, seed: int, n: int, fans: int, xp: Any, device: str) -> tuple[Any, np.ndarray]:
    """(native result, reference bits) of one initializer call."""
    fan_in, fan_out = _FANS[fans % len(_FANS)]
    if op == "zeros":
        return native.fill(n, 0.0, device=device), np.zeros(n, np.uint32)
    if op == "ones":
        return native.fill(n, 1.0, device=device), np.full(n, spec.ONE_BITS, np.uint32)
    if op == "payload":
        bits = np.random.default_rng(seed).choice(_PAYLOAD_BITS, n).astype(np.uint32)
        bits[: min(n, 4)] ^= np.uint32(seed & 0x7FFFFF)  # and a few drawn mantissas: any pattern is a payload
        return native.payload(bits.view(np.float32), device=device), bits
    if op == "xavier":
        b = native.xavier_bound(fan_in, fan_out)
        got = native.xavier_uniform(n, fan_in, fan_out, seed, device=device)
    else:
        b = native.kaiming_bound(fan_in)
        got = native.kaiming_uniform(n, fan_in, seed, device=device)
    u = spec.uniform_reference(spec.draw_words(seed, 0, n)[:, 0])
    return got, spec.symmetric_reference(u, int(np.float32(b).view(np.uint32)))


@register_test("rng.init_bitwise")
def init_bitwise(ctx: FalsifyContext) -> Outcome:
    """A device-side initializer (op: zeros, ones, payload, xavier, kaiming) bitwise equal to spec.rng."""
    op = str(ctx.params.get("op", "zeros"))
    xp = array_module(ctx.device)
    results: dict[tuple, np.ndarray] = {}

    def inputs(case: tuple) -> tuple:
        got, ref = _init_case(op, case[0], case[1], case[2], xp, ctx.device)
        results[case] = ref
        return case, got

    check = Check(
        name=f"rng init {op}",
        inputs=inputs,
        native=lambda a: np.ascontiguousarray(to_host(a[1]), np.float32).view(np.uint32).reshape(-1),
        reference=lambda a: Expected(bits=results.pop(a[0])),
        agreement=engine.item_agreement(ctx, "bitwise"),
        cases=st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 64 * ctx.budget.scale), st.integers(0, 3)),
        explicit=((ctx.seed, 4096, 0), (ctx.seed + 1, 1, 1), (ctx.seed, 0, 2)),
        encode=lambda c: c,
        decode=lambda rp: tuple(rp.values[:3]),
        describe=lambda c: {"seed": c[0], "n": c[1], "fans": list(_FANS[c[2] % len(_FANS)])},
        build={
            "op": op,
            "reference": "spec.rng: fill bits, the payload's bits, or symmetric_reference (softfloat b (2u - 1))",
            "route": native.ROUTE if ctx.device == "cuda" else "host NumPy binary32 in the kernel's order",
        },
    )
    return engine.run(ctx, check)


# Relative allowance on the variance: the bound's binary64 evaluation and binary32 rounding (u each, squared: 2u +
# 2u), w's one rounding (2u), the lattice's (1 - 2^-2p) / 3 and the binary64 sums (2^-40).
_VAR_REL = 6 * 2.0**-24 + 2.0**-38


@register_test("rng.init_moments")
def init_moments(ctx: FalsifyContext) -> Outcome:
    """Xavier and Kaiming uniform: mean exactly -b 2^-L and variance within 6u of the formula, over every uniform."""
    log2_points = 24 if ctx.profile.value != "quick" else int(ctx.params.get("log2_points", 20))
    rows, worst = [], 0.0
    for fan_in, fan_out in _FANS:
        for name, b, target in (
            ("xavier", native.xavier_bound(fan_in, fan_out), 2.0 / (fan_in + fan_out)),
            ("kaiming", native.kaiming_bound(fan_in), 2.0 / fan_in),
        ):
            mean, var = spec.symmetric_moments(int(np.float32(b).view(np.uint32)), log2_points)
            rel = abs(var / target - 1.0)
            worst = max(worst, rel / _VAR_REL)
            rows.append(
                {
                    "init": name,
                    "fan_in": fan_in,
                    "fan_out": fan_out,
                    "bound": float(b),
                    "mean": mean,
                    "variance": var,
                    "formula": target,
                    "relative_error": rel,
                }
            )
            if rel > _VAR_REL:
                return engine.outcome_violated(
                    ctx, rows[-1], f"{name} variance {var!r} is not within {_VAR_REL:.3g} of {target!r}", moments=rows
                )
    ev = {
        "moments": rows,
        "points": 1 << log2_points,
        "worst_over_allowance": worst,
        "formulas": {"xavier": "2 gain^2 / (fan_in + fan_out), gain 1", "kaiming": "gain^2 / fan_in, gain sqrt(2)"},
    }
    return engine.outcome_passed(ctx, len(rows), **ev)
