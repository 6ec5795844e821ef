"""Exhaustive sweeps: unary binary32 kernels on all 2^32 inputs (GPU); all pairs of small formats (CPU).

Three parts, composed by :func:`sweep`: a reference provider (:func:`reference_provider`: softfloat, float64
for the exact operations, or the spec's approx reference, in one CUDA kernel where it has one), a chunk scheduler
(:func:`chunk_inputs`: a bit-pattern range or a seeded sample, a chunk at a time) and a comparison
(:class:`SweepComparison`: one fused CUDA kernel per chunk, array ops on the host). The CUDA sources live in
``native/`` (``native.sweep_compare``, ``native.fused_reference``).

``sweep("sqrt", device="cuda")`` runs the kernel over every binary32 bit pattern in chunks on the GPU and
compares each chunk with the reference computed on the GPU as well, so no 16 GiB array ever crosses the bus.
For the exact operations (sqrt, inv, neg, abs, relu, and add/sub/mul/div/scale with a fixed ``operand``) the
reference is computed inside the comparison kernel (``native.sweep_compare.sweep_exact_chunk``): by default
by the float64 route, exact by the double-rounding theorem in the non-flushing environments (the test suite
checks it against softfloat, the definition), else by the softfloat kernels. Transcendentals compare with
float64 evaluation within their bound. On the host a 2^32
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
from native.elementwise import get_kernel, run_flat
from native.fused_reference import fused_approx_reference, has_fused_reference
from native.nvrtc import get_route
from native.sweep_compare import (
    EXACT_OPS,
    bit_patterns,
    compare_chunk_fused,
    exact_route_supports,
    sweep_exact_chunk,
)
from obligations.core.device import array_module, resolve_device
from spec import softfloat as sf
from spec.elementwise import array_namespace, bits_to_f64, canonical_nan, get_reference, round_f64_to_f32
from spec.softfloat.env import get_env

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
    "split_range",
    "merge_sweeps",
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
_UNARY_ORACLE = {"sqrt": np.sqrt, "neg": np.negative, "abs": np.abs}
_SMALL_CHUNK = 1 << 22


def _small_chunk(op: str, fmt: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """(softfloat bits, oracle bits) of one chunk of operands of a small format."""
    with np.errstate(all="ignore"):
        if b is None:
            got = sf.sqrt(a, fmt=fmt, env="ieee") if op == "sqrt" else getattr(sf, op)(a, fmt=fmt)
            return got, round_to_format(_UNARY_ORACLE[op](_to_f64(a, fmt)), fmt)
        got = getattr(sf, op)(a, b, fmt=fmt, env="ieee")
        return got, round_to_format(_ORACLE[op](_to_f64(a, fmt), _to_f64(b, fmt)), fmt)


def _small_format_sweep(op: str, fmt: Any, lo: int, hi: int | None, max_ce: int) -> dict[str, Any]:
    if op not in _ORACLE and op not in _UNARY_ORACLE:
        raise ValueError(f"small-format sweeps cover {sorted({*_ORACLE, *_UNARY_ORACLE})}, not {op!r}")
    nvals = 1 << fmt.bits
    unary = op in _UNARY_ORACLE
    total = nvals if unary else nvals * nvals
    hi = total if hi is None else min(hi, total)
    t0 = time.perf_counter()
    disagreements, ces = 0, []
    for s0 in range(lo, hi, _SMALL_CHUNK):  # bounded memory: 2^32 operand pairs never exist at once
        idx = np.arange(s0, min(hi, s0 + _SMALL_CHUNK), dtype=np.int64)
        a = (idx % nvals).astype(fmt.dtype) if unary else (idx // nvals).astype(fmt.dtype)
        b = None if unary else (idx % nvals).astype(fmt.dtype)
        got, want = _small_chunk(op, fmt, a, b)
        nan_g, nan_w = sf.is_nan(got, fmt), sf.is_nan(want, fmt)
        bad = np.where(nan_g | nan_w, nan_g != nan_w, got != want)  # NaN results compared by class
        disagreements += int(bad.sum())
        for i in np.flatnonzero(bad)[: max(0, max_ce - len(ces))]:
            ces.append(
                {
                    "a": hex(int(a[i])),
                    **({} if unary else {"b": hex(int(b[i]))}),
                    "softfloat": hex(int(got[i])),
                    "oracle": hex(int(want[i])),
                }
            )
    secs = time.perf_counter() - t0
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
        "disagreements": disagreements,
        "first_counterexamples": ces,
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
    """The reference of one sweep: ``evaluate(x)`` gives (reference bits, accepted alternative or None).

    ``fused`` (exact operations on CUDA): ``fused(nat, x)`` computes the reference inside the comparison
    kernel and returns (histogram, max ULP, disagreements, None); ``fused(nat, x, True)`` also returns the
    reference bits (used only for a chunk with disagreements, to name them).
    """

    description: str
    evaluate: Callable[[Any], tuple[Any, Any]]
    approx: bool  # float64-defined: compared within the bound, never bit-exact
    fused: Callable[..., tuple[np.ndarray, int, int, Any]] | None = None


def _float64_exact(op: str, env: str) -> Callable[[Any], tuple[Any, Any]]:
    """sqrt and 1/x evaluated in float64 and rounded once: exact for binary32 (Roux 2014)."""
    if env.endswith("-ftz"):
        raise ValueError("reference='float64' implements non-flushing environments only")
    if op not in ("sqrt", "inv"):
        raise ValueError(f"reference='float64' on the host covers sqrt and inv, not {op!r}")
    fn = {"sqrt": lambda v: array_namespace(v).sqrt(v), "inv": lambda v: 1.0 / v}[op]

    def evaluate(x: Any) -> tuple[Any, Any]:
        xp = array_namespace(x)
        with np.errstate(all="ignore"):
            ref_bits, _ = round_f64_to_f32(fn(bits_to_f64(x)))
        nan = ((ref_bits & 0x7F800000) == 0x7F800000) & ((ref_bits & 0x7FFFFF) != 0)
        return xp.where(nan, xp.uint32(canonical_nan(env)), ref_bits).astype(xp.uint32), None

    return evaluate


def _spec_reference(name: str, env: str, operand: int | None = None) -> Callable[[Any], tuple[Any, Any]]:
    ref_op = get_reference(name)

    def evaluate(x: Any) -> tuple[Any, Any]:
        xp = array_namespace(x)
        extra = () if operand is None else (xp.full(x.shape, operand, dtype=xp.uint32),)
        r = ref_op.evaluate(x, *extra, env=env)
        return r.bits, r.alt

    return evaluate


def _fused_reference(name: str, env: str) -> Callable[[Any], tuple[Any, Any]]:
    def evaluate(x: Any) -> tuple[Any, Any]:
        r = fused_approx_reference(name, x, env)
        return r.bits, r.alt

    return evaluate


_F64_TEXT = "float64 rounded once (ambiguous roundings accept both neighbours)"
# The spec reference each fused exact reference realises (a kernel's reference name -> operation code name).
_FUSED_NAMES: dict[str, str] = {**{k: k for k in EXACT_OPS}, "scale": "mul"}
_FUSED_TEXT = {
    "float64": "float64 route: operands widened exactly, one IEEE binary64 operation, one rounding to binary32 "
    "(exact by the double-rounding theorem, 53 >= 2*24 + 2; checked against softfloat by the test suite), "
    "computed inside the CUDA comparison kernel",
    "softfloat": "softfloat (the fused CUDA kernels of spec.softfloat, checked bit for bit against the array "
    "code), computed inside the CUDA comparison kernel",
}


def _fused_exact(name: str, route: str, env: str, operand: int | None) -> ReferenceProvider:
    fenv, code, c = get_env(env), _FUSED_NAMES[name], operand or 0

    def fused(nat: Any, x: Any, want_reference: bool = False) -> tuple[np.ndarray, int, int, Any]:
        return sweep_exact_chunk(nat, x, code, c, route, fenv, want_reference=want_reference)

    def evaluate(x: Any) -> tuple[Any, Any]:
        return fused(x, x, True)[3], None

    return ReferenceProvider(_FUSED_TEXT[route], evaluate, False, fused)


def reference_provider(
    op: str, env: str, device: str, reference: str = "auto", operand: int | None = None
) -> ReferenceProvider:
    """The reference a sweep of ``op`` compares with: softfloat, float64 (exact ops), or the spec's approx form.

    ``reference="auto"``: on CUDA an exact operation takes the float64 route in the non-flushing
    environments and the softfloat kernels otherwise, both inside the comparison kernel; on the host it
    takes softfloat. On the GPU an approx reference (float64-defined whatever ``reference`` says) uses its
    one-kernel CUDA form where it has one (``native.fused_reference``, cross-checked against the array form).
    ``operand``: the fixed second operand's bits (binary kernels and kernels with one scalar).
    """
    if reference not in ("auto", "softfloat", "float64"):
        raise ValueError(f"reference must be auto, softfloat or float64, not {reference!r}")
    name = get_kernel(op).reference
    kind = get_reference(name).kind
    if kind == "approx":
        if device == "cuda" and has_fused_reference(name):
            return ReferenceProvider(
                _F64_TEXT + "; one-kernel CUDA form of spec.elementwise", _fused_reference(name, env), True
            )
        return ReferenceProvider(_F64_TEXT, _spec_reference(name, env), True)
    if device == "cuda" and name in _FUSED_NAMES:
        for route in ("float64", "softfloat") if reference == "auto" else (reference,):
            if exact_route_supports(_FUSED_NAMES[name], route, get_env(env)):
                return _fused_exact(name, route, env, operand)
    if reference == "float64":
        return ReferenceProvider(_F64_TEXT, _float64_exact(op, env), True)
    return ReferenceProvider("softfloat (on the same device)", _spec_reference(name, env, operand), False)


# -- chunk scheduler -------------------------------------------------------------------------------------------


def chunk_inputs(xp: Any, *, lo: int, total: int, chunk: int, sample: int | None, seed: int) -> Iterator[Any]:
    """The sweep's inputs, ``chunk`` at a time: the range [lo, lo + total), or ``total`` seeded samples."""
    done, base = 0, None
    while done < total:
        m = min(chunk, total - done)
        if sample is not None:
            from falsification.float32_inputs import BatchSpec, generate_bits  # Hypothesis: only for samples

            yield generate_bits(BatchSpec(seed=seed + done, size=m, mix="uniform"), 1, xp)[0]
        elif xp is not np:
            yield bit_patterns(lo + done, m)  # a raw kernel: no CuPy ufunc, so no cupyx/SciPy import
        else:
            if base is None or base.size != m:
                base = xp.arange(m, dtype=xp.uint32)
            yield base + xp.uint32(lo + done)  # < 2^32: the range ends at or below 2^32
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

    def fold(self, hist: np.ndarray, chunk_max: int, disagreements: int) -> None:
        """Fold in the counts of a chunk compared elsewhere (a fused reference-and-compare kernel)."""
        self.hist += hist
        self.max_ulp = max(self.max_ulp, chunk_max)
        self.disagreements += disagreements

    def histogram(self) -> dict[str, int]:
        """The histogram as JSON."""
        keys = ("0", "1", "2", "3", ">3_or_nan")
        return {k: int(v) for k, v in zip(keys, self.hist, strict=True)}


def _swept_kernel(op: str, operand: int | None) -> Any:
    """The kernel of a sweep: unary, or binary / one-scalar with the second operand fixed to ``operand``."""
    k = get_kernel(op)
    arity = len(k.inputs) + len(k.scalars)
    if operand is None and (len(k.inputs) != 1 or k.scalars):
        raise ValueError(
            f"sweep covers unary kernels, or binary ones with --operand; {op} has inputs {k.inputs} scalars {k.scalars}"
        )
    if operand is not None and (arity != 2 or len(k.outputs) != 1):
        raise ValueError(f"operand fixes the second operand of a two-operand kernel; {op} has {arity}")
    if operand is not None and not 0 <= operand < 1 << 32:
        raise ValueError(f"operand must be binary32 bits (0 .. 0xFFFFFFFF), not {operand}")
    return k


def _native_args(k: Any, xp: Any, x: Any, operand: int | None, fixed: dict[int, Any]) -> tuple[list, tuple]:
    """The kernel's arrays and scalars for one chunk ``x`` (the fixed operand as a buffer or a scalar)."""
    if operand is None:
        return [x.view(xp.float32)], ()
    c = np.array([operand], dtype=np.uint32).view(np.float32)[0]
    if k.scalars:
        return [x.view(xp.float32)], (c,)
    if x.size not in fixed:
        fixed.clear()
        fixed[x.size] = xp.full(x.size, operand, dtype=xp.uint32).view(xp.float32)
    return [x.view(xp.float32), fixed[x.size]], ()


def _check_range(lo: int, hi: int | None, sample: int | None, total: int, fmt: str, small: bool = False) -> None:
    """ValueError naming the flag unless [lo, hi) is a non-empty range of the format's inputs and ``sample`` a
    positive count of them (checked before anything runs: a bad range is never a quick pass or an endless run)."""
    what = "operand pairs" if small and total > 1 << 16 else "inputs"
    if small and sample is not None:
        raise ValueError(f"--sample {sample}: {fmt} sweeps check every operand; give --lo/--hi instead")
    if not 0 <= lo < total:
        raise ValueError(f"--lo {lo}: must be in [0, {total}) (the {total} {what} of {fmt})")
    if hi is not None and not lo < hi <= total:
        raise ValueError(f"--hi {hi}: must be in ({lo}, {total}] (above --lo; the {total} {what} of {fmt})")
    if sample is not None and not 0 < sample <= total:
        raise ValueError(f"--sample {sample}: must be in [1, {total}] (the {total} {what} of {fmt})")


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
    reference: str = "auto",
    chunk: int | None = None,
    max_counterexamples: int = 8,
    seed: int = 0,
    variant: str | None = None,
    operand: int | None = None,
) -> dict[str, Any]:
    """Check a unary kernel on every binary32 pattern in [lo, hi) (default: all 2^32) or ``sample`` ones.

    Returns a JSON-ready dict: elements, seconds, elements_per_s, max_ulp, disagreements (beyond
    ``bound``: 0 for correctly rounded ops, the guide's bound for transcendentals), a distance histogram
    and the first counterexamples. ``fmt`` other than binary32 sweeps the softfloat reference itself.
    ``reference``: "auto" (float64 route for exact ops on CUDA where exact, else softfloat), "softfloat"
    or "float64". ``operand``: bits of the fixed second operand of a binary kernel (add, mul, div, scale ...).
    ``seconds`` excludes compiling and warming the kernels (``compile_seconds``).
    """
    f = resolve_format(fmt)
    if f.bits <= 16:
        nvals = 1 << f.bits
        _check_range(lo, hi, sample, nvals if op in _UNARY_ORACLE else nvals * nvals, f.name, small=True)
        return _small_format_sweep(op, f, lo, hi, max_counterexamples)
    _check_range(lo, hi, sample, _ALL, "binary32")
    if f != sf.BINARY32:
        raise ValueError(f"kernel sweeps are binary32 only, not {f.name}")
    dev = resolve_device(device)
    xp = array_module(dev)
    k = _swept_kernel(op, operand)
    env = env or get_route(route).env
    provider = reference_provider(op, env, dev, reference, operand)
    is_approx_op = get_reference(k.reference).kind == "approx"
    bound = bound if bound is not None else (DEFAULT_ULP_BOUNDS.get(op, 0) if is_approx_op else 0)
    if hi is None and sample is None and dev == "host":
        sample = HOST_DEFAULT_SAMPLE  # 2^32 on one CPU core would take hours
    hi = _ALL if hi is None else hi
    total = sample if sample is not None else hi - lo
    exact = bound == 0 and not provider.approx
    fused = provider.fused if exact else None
    cmp = SweepComparison(dev, bound, exact, max_counterexamples)
    sync = (lambda: xp.cuda.Device().synchronize()) if dev == "cuda" else (lambda: None)
    fixed: dict[int, Any] = {}
    # Compile and warm every kernel of the loop on a few inputs, outside the timed sweep.
    tw = time.perf_counter()
    if dev == "cuda":
        probe = xp.arange(256, dtype=xp.uint32)
        ins, scal = _native_args(k, xp, probe, operand, {})
        (pout,), _ = run_flat(op, ins, scal, device=dev, route=route, variant=variant)
        if fused is not None:
            fused(pout.view(xp.uint32), probe)
        else:
            r, a = provider.evaluate(probe)
            _COMPARE[dev](pout.view(xp.uint32), r, a, bound, exact=exact)
    sync()
    t_compile = time.perf_counter() - tw
    t0 = time.perf_counter()
    t_native = t_ref = t_cmp = 0.0
    for x in chunk_inputs(
        xp, lo=lo, total=total, chunk=chunk or (1 << 27 if dev == "cuda" else 1 << 20), sample=sample, seed=seed
    ):
        ta = time.perf_counter()
        ins, scal = _native_args(k, xp, x, operand, fixed)
        (out,), _ = run_flat(op, ins, scal, device=dev, route=route, variant=variant)
        nat = out.view(xp.uint32)
        sync()
        tb = time.perf_counter()
        if fused is not None:
            h, chunk_max, nb, _ = fused(nat, x)  # reference and comparison in one kernel
            cmp.fold(h, chunk_max, nb)
            room = cmp.max_counterexamples - len(cmp.counterexamples)
            if nb and room > 0:
                ref_bits = fused(nat, x, True)[3]
                cmp.counterexamples += _counterexamples(x, nat, ref_bits, None, 0, True, room)
            tc = time.perf_counter()
        else:
            ref_bits, alt = provider.evaluate(x)
            sync()
            tc = time.perf_counter()
            cmp.add(x, nat, ref_bits, alt)
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
        "compile_seconds": round(t_compile, 4),
        "comparison": (
            "reference and comparison in one CUDA kernel per chunk"
            if fused is not None
            else ("one fused CUDA kernel per chunk" if dev == "cuda" else "array ops")
        ),
        "operand": None if operand is None else f"0x{operand:08X}",
        "elements_per_s": round(total / secs, 1) if secs else None,
        "bound": bound,
        "max_ulp": cmp.max_ulp,
        "disagreements": cmp.disagreements,
        "histogram": cmp.histogram(),
        "first_counterexamples": cmp.counterexamples,
    }


# -- a sweep in parts (kc sweep --cluster: one part per task, on every GPU) ---------------------------------

# What every part of one sweep must share (else they are not parts of one sweep).
_SHARED = ("op", "fmt", "env", "device", "route", "variant", "reference", "comparison", "operand", "bound")
# Seconds of work: summed over the parts (``seconds`` is the longest part's: the parts ran side by side).
_WORK_SECONDS = ("native_seconds", "reference_seconds", "compare_seconds", "compile_seconds")


def split_range(lo: int, hi: int, parts: int, align: int = 1 << 20) -> list[tuple[int, int]]:
    """[lo, hi) in at most ``parts`` contiguous non-empty ranges, inner boundaries on multiples of ``align``
    (whole chunks of the device loop) where the range holds ``parts`` of them, else anywhere."""
    if not lo < hi or parts < 1:
        raise ValueError(f"split_range: need lo < hi and parts >= 1, not [{lo}, {hi}) in {parts}")
    align = align if hi - lo >= parts * align else 1
    cuts = sorted({min(hi, max(lo, (lo + (hi - lo) * k // parts) // align * align)) for k in range(1, parts)})
    bounds = [lo, *(c for c in cuts if lo < c < hi), hi]
    return list(zip(bounds, bounds[1:], strict=False))


def merge_sweeps(parts: list[dict[str, Any]], max_counterexamples: int = 8) -> dict[str, Any]:
    """The report of one sweep over the union of ``parts`` (reports of contiguous ranges, in order).

    The evidence is the single run's, bit for bit: elements, disagreements and the histogram summed, max_ulp the
    largest, first_counterexamples the first ``max_counterexamples`` in input order (each part's first ones,
    in range order: a part has at least as many of its own as the single run takes from it). ``seconds`` is the
    longest part's (they run side by side), the other seconds are summed work; ``parts`` says how many.
    """
    if not parts:
        raise ValueError("merge_sweeps: no parts")
    first = parts[0]
    for p in parts:
        if p.get("sample") is not None or p.get("range") is None:
            raise ValueError("merge_sweeps: a sampled sweep is not a part of a range")
        differ = [k for k in _SHARED if p.get(k) != first.get(k)]
        if differ:
            raise ValueError(f"merge_sweeps: the parts differ in {', '.join(differ)}")
    for a, b in zip(parts, parts[1:], strict=False):
        if a["range"][1] != b["range"][0]:
            raise ValueError(f"merge_sweeps: {a['range']} and {b['range']} are not contiguous")
    lo, hi = first["range"][0], parts[-1]["range"][1]
    elements = sum(int(p["elements"]) for p in parts)
    seconds = max(float(p["seconds"]) for p in parts)
    hist: dict[str, int] = {}
    for p in parts:
        for k, v in p["histogram"].items():
            hist[k] = hist.get(k, 0) + int(v)
    merged = {k: v for k, v in first.items() if k not in ("first_counterexamples",)}
    merged.update(
        {
            "range": [lo, hi],
            "elements": elements,
            "exhaustive": lo == 0 and hi == _ALL,
            "seconds": round(seconds, 4),
            **{k: round(sum(float(p.get(k) or 0) for p in parts), 4) for k in _WORK_SECONDS},
            "elements_per_s": round(elements / seconds, 1) if seconds else None,
            "max_ulp": max(int(p["max_ulp"]) for p in parts),
            "disagreements": sum(int(p["disagreements"]) for p in parts),
            "histogram": hist,
            "first_counterexamples": [c for p in parts for c in p["first_counterexamples"]][:max_counterexamples],
            "parts": len(parts),
        }
    )
    return merged
