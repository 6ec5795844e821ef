"""Exhaustive sweeps: unary binary32 kernels on all 2^32 inputs (GPU); all pairs of small formats (CPU).

Three parts, composed by :func:`sweep`: a reference provider (:func:`reference_provider`: softfloat, float64
for sqrt/inv, or the spec's approx reference, in one CUDA kernel where it has one), a chunk scheduler
(:func:`chunk_inputs`: a bit-pattern range or a seeded sample, a chunk at a time) and a comparison
(:class:`SweepComparison`: one fused CUDA kernel per chunk, array ops on the host). The CUDA sources live in
``native/`` (``native.sweep_compare``, ``native.fused_reference``).

``sweep("sqrt", device="cuda")`` runs the kernel over every binary32 bit pattern in chunks on the GPU and
compares each chunk with the reference computed on the GPU as well (softfloat for correctly rounded ops,
float64 evaluation for transcendentals), so no 16 GiB array ever crosses the bus. On the host a 2^32
sweep is too slow: pass ``lo``/``hi`` (a bit-pattern range) or ``sample`` (that many seeded patterns).

For formats of at most 16 bits (``fmt="e4m3"``, ``"binary16"``, ...) the sweep checks the *reference*:
softfloat in that format on every operand pair against an independent oracle (the operation in float64,
exact or innocuously double-rounded for p <= 11, rounded once to the format by :func:`round_to_format`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from falsification.agreement import NAN_MISMATCH, ulp_distance
from falsification.float32_inputs import BatchSpec, generate_bits
from native.elementwise import get_kernel, run_flat
from native.fused_reference import fused_approx_reference, has_fused_reference
from native.nvrtc import get_route
from native.sweep_compare import compare_chunk_fused
from obligations.core.device import array_module, resolve_device
from spec import softfloat as sf
from spec.elementwise import array_namespace, bits_to_f64, canonical_nan, get_reference, round_f64_to_f32

__all__ = [
    "sweep",
    "compare_chunk",
    "compare_chunk_fused",
    "round_to_format",
    "resolve_format",
    "DEFAULT_ULP_BOUNDS",
    "HOST_DEFAULT_SAMPLE",
    "ReferenceProvider",
    "reference_provider",
    "chunk_inputs",
    "SweepComparison",
]

# CUDA C++ Programming Guide maxima for the transcendental kernels, and the project's derived ones.
DEFAULT_ULP_BOUNDS: dict[str, int] = {"exp": 2, "log": 1, "tanh": 2, "sigmoid": 6}
HOST_DEFAULT_SAMPLE = 1 << 22
_ALL = 1 << 32


def resolve_format(fmt: Any) -> Any:
    """A softfloat Format from a Format, "binary32"/"binary16"/"bfloat16", or "eXmY"."""
    if not isinstance(fmt, str):
        return fmt
    named = {
        "binary32": sf.BINARY32,
        "binary16": sf.BINARY16,
        "bfloat16": sf.BFLOAT16,
        "binary64": sf.BINARY64,
    }
    if fmt in named:
        return named[fmt]
    if fmt.startswith("e") and "m" in fmt:
        e, m = fmt[1:].split("m")
        return sf.Format(int(e), int(m))
    raise ValueError(f"unknown format {fmt!r}: use binary32, binary16, bfloat16 or eXmY (e.g. e4m3)")


def round_to_format(x: np.ndarray, fmt: Any) -> np.ndarray:
    """Bits of float64 ``x`` rounded to nearest-even in ``fmt`` (subnormals, overflow to Inf; NaN quiet).

    Written from the format's parameters only (frexp/rint), independently of softfloat's integer code.
    """
    p, bias, fb = fmt.frac_bits + 1, (1 << (fmt.exp_bits - 1)) - 1, fmt.frac_bits
    emin, emax = 1 - bias, bias
    sign = np.signbit(x).astype(np.uint64) << np.uint64(fmt.bits - 1)
    ax = np.abs(x)
    with np.errstate(all="ignore"):
        _, e2 = np.frexp(ax)
        q = np.maximum(e2 - 1, emin) - (p - 1)  # exponent of one unit in the last place
        r = np.rint(np.ldexp(ax, -q))  # exact scaling, then round half to even
        carry = r >= 2**p
        r = np.where(carry, r / 2, r)
        q = np.where(carry, q + 1, q)
        normal = r >= 2 ** (p - 1)
        biased = np.where(normal, q + (p - 1) + bias, 0).astype(np.int64)
        frac = np.where(normal, r - 2 ** (p - 1), r).astype(np.uint64)
    bits = (biased.astype(np.uint64) << np.uint64(fb)) | frac
    inf = np.uint64(((1 << fmt.exp_bits) - 1) << fb)
    bits = np.where(np.isinf(ax) | (biased > emax + bias), inf, bits)
    bits = np.where(ax == 0, np.uint64(0), bits)
    bits = np.where(np.isnan(x), inf | np.uint64(1 << (fb - 1)), bits | sign)
    return bits.astype(fmt.dtype)


def _to_f64(bits: np.ndarray, fmt: Any) -> np.ndarray:
    b = bits.astype(np.int64)
    fb, bias = fmt.frac_bits, (1 << (fmt.exp_bits - 1)) - 1
    e = (b >> fb) & ((1 << fmt.exp_bits) - 1)
    f = b & ((1 << fb) - 1)
    mag = np.where(
        e == 0,
        np.ldexp(f.astype(np.float64), 1 - bias - fb),
        np.ldexp((f + (1 << fb)).astype(np.float64), (e - bias - fb).astype(np.int64)),
    )
    mag = np.where(e == (1 << fmt.exp_bits) - 1, np.where(f == 0, np.inf, np.nan), mag)
    return np.where((b >> (fmt.bits - 1)) & 1 == 1, -mag, mag)


_ORACLE = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def _small_format_sweep(op: str, fmt: Any, lo: int, hi: int | None, max_ce: int) -> dict[str, Any]:
    nvals = 1 << fmt.bits
    unary = op == "sqrt"
    total = nvals if unary else nvals * nvals
    hi = total if hi is None else min(hi, total)
    t0 = time.perf_counter()
    idx = np.arange(lo, hi, dtype=np.int64)
    a = (idx % nvals).astype(fmt.dtype) if unary else (idx // nvals).astype(fmt.dtype)
    b = None if unary else (idx % nvals).astype(fmt.dtype)
    with np.errstate(all="ignore"):
        if unary:
            got = sf.sqrt(a, fmt=fmt, env="ieee")
            want = round_to_format(np.sqrt(_to_f64(a, fmt)), fmt)
        else:
            got = getattr(sf, op)(a, b, fmt=fmt, env="ieee")
            want = round_to_format(_ORACLE[op](_to_f64(a, fmt), _to_f64(b, fmt)), fmt)
    nan_g, nan_w = sf.is_nan(got, fmt), sf.is_nan(want, fmt)
    bad = np.where(nan_g | nan_w, nan_g != nan_w, got != want)  # NaN results compared by class
    secs = time.perf_counter() - t0
    where = np.flatnonzero(bad)[:max_ce]
    return {
        "op": op,
        "fmt": fmt.name,
        "subject": "softfloat reference",
        "oracle": "float64 rounded once (frexp/rint)",
        "device": "host",
        "elements": int(hi - lo),
        "exhaustive": lo == 0 and hi == total,
        "range": [lo, hi],
        "seconds": round(secs, 4),
        "disagreements": int(bad.sum()),
        "first_counterexamples": [
            {
                "a": hex(int(a[i])),
                **({} if unary else {"b": hex(int(b[i]))}),
                "softfloat": hex(int(got[i])),
                "oracle": hex(int(want[i])),
            }
            for i in where
        ],
    }


def _distance_and_bad(nat: Any, ref: Any, alt: Any, bound: int, exact: bool) -> tuple[Any, Any]:
    """Per element: ULP distance to the reference (the nearer of ref/alt) and the disagreement mask."""
    xp = array_namespace(nat)
    d = ulp_distance(nat, ref)
    if alt is not None:
        d = xp.minimum(d, ulp_distance(nat, alt))
    bad = (nat != ref) if exact else (d > bound)
    if alt is not None and bound == 0:
        bad &= nat != alt
    return d, bad


def compare_chunk(nat: Any, ref: Any, alt: Any, bound: int, *, exact: bool) -> tuple[np.ndarray, int, int]:
    """(histogram of 0/1/2/3/>3-or-NaN ULPs, max finite ULP, disagreements) of one chunk, array ops."""
    xp = array_namespace(nat)
    d, bad = _distance_and_bad(nat, ref, alt, bound, exact)
    finite = d < NAN_MISMATCH
    m = int(d.size)
    max_ulp = int(xp.where(finite, d, 0).max()) if m else 0
    h = [int(((d == v) & finite).sum()) for v in range(4)]
    return np.array(h + [m - sum(h)], dtype=np.int64), max_ulp, int(bad.sum())


# The chunk comparison per device: one fused kernel on CUDA, array ops on the host.
_COMPARE: dict[str, Callable[..., tuple[np.ndarray, int, int]]] = {"host": compare_chunk, "cuda": compare_chunk_fused}


def _counterexamples(x: Any, nat: Any, ref: Any, alt: Any, bound: int, exact: bool, limit: int) -> list[dict]:
    """The first ``limit`` disagreeing inputs of a chunk (recomputed with array ops: chunks with any are rare)."""
    xp = array_namespace(nat)
    d, bad = _distance_and_bad(nat, ref, alt, bound, exact)
    return [
        {
            "input": f"0x{int(x[i]):08X}",
            "native": f"0x{int(nat[i]):08X}",
            "reference": f"0x{int(ref[i]):08X}",
            "ulp": "nan-mismatch" if int(d[i]) >= NAN_MISMATCH else int(d[i]),
        }
        for i in xp.flatnonzero(bad)[:limit].tolist()
    ]


# -- reference provider -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReferenceProvider:
    """The reference of one sweep: ``evaluate(x)`` gives (reference bits, accepted alternative or None)."""

    description: str
    evaluate: Callable[[Any], tuple[Any, Any]]
    approx: bool  # float64-defined: compared within the bound, never bit-exact


def _float64_exact(op: str, env: str) -> Callable[[Any], tuple[Any, Any]]:
    """sqrt and 1/x evaluated in float64 and rounded once: exact for binary32 (Roux 2014)."""
    if env.endswith("-ftz"):
        raise ValueError("reference='float64' implements non-flushing environments only")
    fn = {"sqrt": lambda v: array_namespace(v).sqrt(v), "inv": lambda v: 1.0 / v}[op]

    def evaluate(x: Any) -> tuple[Any, Any]:
        xp = array_namespace(x)
        with np.errstate(all="ignore"):
            ref_bits, _ = round_f64_to_f32(fn(bits_to_f64(x)))
        nan = ((ref_bits & 0x7F800000) == 0x7F800000) & ((ref_bits & 0x7FFFFF) != 0)
        return xp.where(nan, xp.uint32(canonical_nan(env)), ref_bits).astype(xp.uint32), None

    return evaluate


def _spec_reference(name: str, env: str) -> Callable[[Any], tuple[Any, Any]]:
    ref_op = get_reference(name)

    def evaluate(x: Any) -> tuple[Any, Any]:
        r = ref_op.evaluate(x, env=env)
        return r.bits, r.alt

    return evaluate


def _fused_reference(name: str, env: str) -> Callable[[Any], tuple[Any, Any]]:
    def evaluate(x: Any) -> tuple[Any, Any]:
        r = fused_approx_reference(name, x, env)
        return r.bits, r.alt

    return evaluate


_F64_TEXT = "float64 rounded once (ambiguous roundings accept both neighbours)"


def reference_provider(op: str, env: str, device: str, reference: str = "softfloat") -> ReferenceProvider:
    """The reference a sweep of ``op`` compares with: softfloat, float64 (sqrt/inv), or the spec's approx form.

    On the GPU an approx reference (float64-defined whatever ``reference`` says) uses its one-kernel CUDA
    form where it has one (``native.fused_reference``, cross-checked against the array form).
    """
    name = get_kernel(op).reference
    kind = get_reference(name).kind
    if kind == "approx":
        if device == "cuda" and has_fused_reference(name):
            return ReferenceProvider(
                _F64_TEXT + "; one-kernel CUDA form of spec.elementwise", _fused_reference(name, env), True
            )
        return ReferenceProvider(_F64_TEXT, _spec_reference(name, env), True)
    if reference == "float64":
        return ReferenceProvider(_F64_TEXT, _float64_exact(op, env), True)
    return ReferenceProvider("softfloat (on the same device)", _spec_reference(name, env), False)


# -- chunk scheduler -------------------------------------------------------------------------------------------


def chunk_inputs(xp: Any, *, lo: int, total: int, chunk: int, sample: int | None, seed: int) -> Iterator[Any]:
    """The sweep's inputs, ``chunk`` at a time: the range [lo, lo + total), or ``total`` seeded samples."""
    done = 0
    while done < total:
        m = min(chunk, total - done)
        if sample is not None:
            yield generate_bits(BatchSpec(seed=seed + done, size=m, mix="uniform"), 1, xp)[0]
        else:
            yield (xp.arange(lo + done, lo + done + m, dtype=xp.uint64)).astype(xp.uint32)
        done += m


# -- comparison ----------------------------------------------------------------------------------------------


@dataclass
class SweepComparison:
    """Accumulates per-chunk comparisons: the 0/1/2/3/>3 ULP histogram, max ULP, disagreements, counterexamples."""

    device: str
    bound: int
    exact: bool
    max_counterexamples: int = 8
    hist: np.ndarray = field(default_factory=lambda: np.zeros(5, dtype=np.int64))
    max_ulp: int = 0
    disagreements: int = 0
    counterexamples: list[dict] = field(default_factory=list)

    def add(self, x: Any, nat: Any, ref: Any, alt: Any) -> None:
        """Compare one chunk (``x`` its inputs) and fold it in."""
        h, chunk_max, nb = _COMPARE[self.device](nat, ref, alt, self.bound, exact=self.exact)
        self.hist += h
        self.max_ulp = max(self.max_ulp, chunk_max)
        self.disagreements += nb
        room = self.max_counterexamples - len(self.counterexamples)
        if nb and room > 0:
            self.counterexamples += _counterexamples(x, nat, ref, alt, self.bound, self.exact, room)

    def histogram(self) -> dict[str, int]:
        """The histogram as JSON."""
        keys = ("0", "1", "2", "3", ">3_or_nan")
        return {k: int(v) for k, v in zip(keys, self.hist, strict=True)}


def _unary_kernel(op: str) -> Any:
    k = get_kernel(op)
    if len(k.inputs) != 1 or k.scalars:
        raise ValueError(f"sweep covers unary kernels without scalars; {op} has inputs {k.inputs} scalars {k.scalars}")
    return k


def sweep(
    op: str,
    env: str | None = None,
    device: str = "auto",
    fmt: Any = "binary32",
    *,
    lo: int = 0,
    hi: int | None = None,
    sample: int | None = None,
    route: str = "nvrtc-ieee",
    bound: int | None = None,
    reference: str = "softfloat",
    chunk: int | None = None,
    max_counterexamples: int = 8,
    seed: int = 0,
    variant: str | None = None,
) -> dict[str, Any]:
    """Check a unary kernel on every binary32 pattern in [lo, hi) (default: all 2^32) or ``sample`` ones.

    Returns a JSON-ready dict: elements, seconds, elements_per_s, max_ulp, disagreements (beyond
    ``bound``: 0 for correctly rounded ops, the guide's bound for transcendentals), a distance histogram
    and the first counterexamples. ``fmt`` other than binary32 sweeps the softfloat reference itself.
    ``reference="float64"`` uses float64 evaluation for correctly rounded ops (exact for sqrt/inv).
    """
    f = resolve_format(fmt)
    if f.bits <= 16:
        return _small_format_sweep(op, f, lo, hi, max_counterexamples)
    if f != sf.BINARY32:
        raise ValueError(f"kernel sweeps are binary32 only, not {f.name}")
    dev = resolve_device(device)
    xp = array_module(dev)
    _unary_kernel(op)
    env = env or get_route(route).env
    provider = reference_provider(op, env, dev, reference)
    is_approx_op = get_reference(get_kernel(op).reference).kind == "approx"
    bound = bound if bound is not None else (DEFAULT_ULP_BOUNDS.get(op, 0) if is_approx_op else 0)
    if hi is None and sample is None and dev == "host":
        sample = HOST_DEFAULT_SAMPLE  # 2^32 on one CPU core would take hours
    hi = _ALL if hi is None else hi
    total = sample if sample is not None else hi - lo
    cmp = SweepComparison(dev, bound, bound == 0 and not provider.approx, max_counterexamples)
    sync = (lambda: xp.cuda.Device().synchronize()) if dev == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    t_native = t_ref = t_cmp = 0.0
    for x in chunk_inputs(
        xp, lo=lo, total=total, chunk=chunk or (1 << 27 if dev == "cuda" else 1 << 20), sample=sample, seed=seed
    ):
        ta = time.perf_counter()
        (out,), _ = run_flat(op, [x.view(xp.float32)], (), device=dev, route=route, variant=variant)
        sync()
        tb = time.perf_counter()
        ref_bits, alt = provider.evaluate(x)
        sync()
        tc = time.perf_counter()
        cmp.add(x, out.view(xp.uint32), ref_bits, alt)
        t_native, t_ref, t_cmp = t_native + tb - ta, t_ref + tc - tb, t_cmp + time.perf_counter() - tc
    sync()
    secs = time.perf_counter() - t0
    return {
        "op": op,
        "fmt": "binary32",
        "env": env,
        "device": dev,
        "route": route,
        "variant": variant or "default",
        "reference": provider.description,
        "range": None if sample is not None else [lo, hi],
        "sample": sample,
        "seed": seed if sample else None,
        "elements": int(total),
        "exhaustive": sample is None and lo == 0 and hi == _ALL,
        "seconds": round(secs, 4),
        "native_seconds": round(t_native, 4),
        "reference_seconds": round(t_ref, 4),
        "compare_seconds": round(t_cmp, 4),
        "comparison": "one fused CUDA kernel per chunk" if dev == "cuda" else "array ops",
        "elements_per_s": round(total / secs, 1) if secs else None,
        "bound": bound,
        "max_ulp": cmp.max_ulp,
        "disagreements": cmp.disagreements,
        "histogram": cmp.histogram(),
        "first_counterexamples": cmp.counterexamples,
    }
