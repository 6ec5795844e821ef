"""Falsification tests of the selective-scan family (contracts/scan-selective-v1.yaml), on the engine.

Registered names and their ``params`` (``softplus``/``combine`` pick registry entries of native/scan.py; the
project's tests name planted ones):

* ``scan.combine_sympy`` {combine} — with sympy: the native combine is associative and (a1,b1) o (a2,b2)
  applied to h is step 2 after step 1 (the recurrence's order).
* ``scan.discretize_bound`` {softplus, max_len} — delta, a, b within their derived float32 bounds.
* ``scan.sequential_bitwise`` {max_len} — the sequential order's h and y bitwise the float32 spec.
* ``scan.chunked_bound`` {combine, chunk, max_len} — chunked h, y within gamma_K of the float64 sequential
  states, K from the chunk depth; a regimes item's witnesses (length, lanes, chunk) run first with their own
  chunk (cases (seed, L, D, N, chunk)), a rejected guard boundary (chunk 0, no lane) must raise ValueError.
* ``scan.vjp_spec`` {softplus, max_len} — the float64 build's VJP against the spec's gradients.
* ``scan.vjp_fd`` {max_len} — native float64 VJP against central finite differences of the float64 spec.
* ``scan.performance`` {lengths, lanes} (cuda, measure) — chunked vs sequential kernel vs a CuPy loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from falsification import engine
from falsification.agreement import Expected
from falsification.engine import Check, Judgement
from falsification.registry import FalsifyContext, register_test
from native import scan as ns
from obligations.core.device import to_host
from obligations.core.plans import regime_of
from obligations.core.results import Outcome
from spec import scan as ss

__all__ = ["draw_inputs", "chunk_depth", "time_scan", "torch_scan"]

U32 = 2.0**-24
U64 = 2.0**-53


def draw_inputs(seed: int, L: int, D: int, N: int, dtype: Any = np.float32) -> tuple[np.ndarray, ...]:
    """(x, raw, A, B, C, Dskip): raw in [-4, 4] (softplus's curved range), A in [-2, -0.05] (decaying states)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((L, D))
    raw = rng.uniform(-4, 4, (L, D))
    A = -rng.uniform(0.05, 2, (D, N))
    B, C = rng.standard_normal((L, N)), rng.standard_normal((L, N))
    return tuple(v.astype(dtype) for v in (x, raw, A, B, C, rng.standard_normal(D)))


def _cases(max_len: int) -> st.SearchStrategy:
    return st.tuples(st.integers(0, 2**32 - 1), st.integers(1, max_len), st.integers(1, 5), st.integers(1, 6))


def _describe(c: tuple) -> dict[str, Any]:
    return dict(zip(("seed", "L", "D", "N"), c, strict=True))


def _explicit(max_len: int) -> tuple:
    return ((0, 1, 1, 1), (1, max_len, 3, 4), (2, ns.CHUNK + 1, 2, 2))


def _common(max_len: int) -> dict[str, Any]:
    return {
        "cases": _cases(max_len),
        "explicit": _explicit(max_len),
        "encode": lambda c: c,
        "decode": lambda rp: tuple(rp.values[:4]),
        "describe": _describe,
    }


def _cat(parts: list) -> np.ndarray:
    """One flat float64 vector of several outputs (the engine judges one element array per output)."""
    return np.concatenate([np.asarray(p, np.float64).reshape(-1) for p in parts])


def _cat_expected(parts: list[Expected]) -> Expected:
    """One Expected of several value/bound pairs, in the order of :func:`_cat`."""
    return Expected(
        value=_cat([e.value for e in parts]), bound=_cat([np.broadcast_to(e.bound, np.shape(e.value)) for e in parts])
    )


def _dev(ctx: FalsifyContext, arrays: tuple) -> tuple:
    if ctx.device == "host":
        return arrays
    import cupy

    return tuple(cupy.asarray(a) for a in arrays)


@register_test("scan.combine_sympy")
def combine_sympy(ctx: FalsifyContext) -> Outcome:
    """sympy: the native combine is associative and composes the recurrence's steps in order."""
    import sympy

    name = ctx.params.get("combine", "stated")
    a1, b1, a2, b2, a3, b3, h = sympy.symbols("a1 b1 a2 b2 a3 b3 h", real=True)
    comb = lambda p, q: ns.combine(p, q, name)  # noqa: E731
    left, right = comb(comb((a1, b1), (a2, b2)), (a3, b3)), comb((a1, b1), comb((a2, b2), (a3, b3)))
    assoc = [sympy.simplify(left[i] - right[i]) for i in range(2)]
    A, B = comb((a1, b1), (a2, b2))
    order = sympy.simplify((A * h + B) - (a2 * (a1 * h + b1) + b2))
    ev = {
        "combine": name,
        "sympy_version": sympy.__version__,
        "associativity_difference": [str(d) for d in assoc],
        "composition_difference": str(order),
        "claim": "(a1,b1) o (a2,b2) = (a1 a2, a2 b1 + b2): associative, and maps h to a2 (a1 h + b1) + b2",
    }
    if any(d != 0 for d in assoc):
        return engine.outcome_violated(
            ctx, {"associativity": [str(d) for d in assoc]}, f"combine {name!r} is not associative", **ev
        )
    if order != 0:
        return engine.outcome_violated(
            ctx, {"composition_difference": str(order)}, f"combine {name!r} does not apply step 1 before step 2", **ev
        )
    return engine.outcome_passed(ctx, 2, **ev)


@register_test("scan.discretize_bound")
def discretize_bound(ctx: FalsifyContext) -> Outcome:
    """delta, a, b of the float32 build within 10u|delta|, (4 + 12|delta A|)u a, 13u|b| of float64."""
    build = ns.ScanBuild(softplus=ctx.params.get("softplus", "softplus"))
    max_len = int(ctx.params.get("max_len", 64)) * ctx.budget.scale

    def native(inp: tuple) -> list:
        d, a, b = ns.discretize(*_dev(ctx, inp[:4]), device=ctx.device, build=build)
        return _cat([to_host(v) for v in (d, a, b)])

    def reference(inp: tuple) -> list:
        _, _, co = ss.forward(*inp)
        d, a, b = co["delta"], co["a"], co["b"]
        da = np.abs(d[:, :, None] * inp[2].astype(np.float64)[None])
        return _cat_expected(
            [
                Expected(value=d, bound=10 * U32 * np.abs(d)),
                Expected(value=a, bound=(4 + 12 * da) * U32 * a),
                Expected(value=b, bound=13 * U32 * np.abs(b)),
            ]
        )

    check = Check(
        name=f"discretize[{build.softplus}]@{ctx.device}",
        inputs=lambda c: draw_inputs(*c),
        native=native,
        reference=reference,
        output_names=("delta|a|b",),
        agreement=engine.item_agreement(
            ctx,
            "error_bound",
            bound_name="10u|delta|; (4 + 12|delta A|)u a; 13u|b| (expf 2 ulp, log1pf 1 ulp, one rounding per product)",
        ),
        build={"softplus": build.softplus, "u": "2^-24"},
        **_common(max_len),
    )
    return engine.run(ctx, check)


@register_test("scan.sequential_bitwise")
def sequential_bitwise(ctx: FalsifyContext) -> Outcome:
    """The sequential order's h and y equal spec.scan.recurrence_f32 bit for bit (same coefficients)."""
    max_len = int(ctx.params.get("max_len", 64)) * ctx.budget.scale

    def inputs(c: tuple) -> tuple:
        x, raw, A, B, C, Dk = draw_inputs(*c)
        _, a, b = ns.discretize(*_dev(ctx, (x, raw, A, B)), device=ctx.device)
        return to_host(a), to_host(b), C, x, Dk

    def native(inp: tuple) -> list:
        a, b, C, x, Dk = _dev(ctx, inp)
        h = ns.states(a, b, order="sequential", device=ctx.device)
        y = ns.output(C, h, x, Dk, device=ctx.device)
        return np.concatenate([to_host(h).reshape(-1), to_host(y).reshape(-1)]).view(np.uint32)

    def reference(inp: tuple) -> list:
        y, h = ss.recurrence_f32(*inp)
        return Expected(bits=np.concatenate([h.reshape(-1), y.reshape(-1)]).view(np.uint32))

    check = Check(
        name=f"sequential@{ctx.device}",
        inputs=inputs,
        native=native,
        reference=reference,
        output_names=("h|y",),
        agreement=engine.item_agreement(ctx, "bitwise"),
        build={"route": ns.ROUTE if ctx.device == "cuda" else "host float32, same order"},
        **_common(max_len),
    )
    return engine.run(ctx, check)


def chunk_depth(L: int, chunk: int) -> int:
    """Roundings on the longest path to a chunked state: fold (A: chunk, B: 2 chunk), carry 2 nchunks, apply 2 chunk."""
    return 5 * chunk + 2 * (-(-L // chunk)) + 2


@register_test("scan.chunked_bound")
def chunked_bound(ctx: FalsifyContext) -> Outcome:
    """Chunked h, y within gamma_K H and gamma_{K+N+2} (|C| H + |D x|) of the float64 sequential scan."""
    build = ns.ScanBuild(combine=ctx.params.get("combine", "stated"))
    chunk = int(ctx.params.get("chunk", 8))
    max_len = int(ctx.params.get("max_len", 96)) * ctx.budget.scale
    worst = {"ratio": 0.0}

    def inputs(c: tuple) -> tuple:
        x, raw, A, B, C, Dk = draw_inputs(*c[:4])
        _, a, b = ns.discretize(*_dev(ctx, (x, raw, A, B)), device=ctx.device)
        return to_host(a), to_host(b), C, x, Dk, _chunk_of(c, chunk)

    def native(inp: tuple) -> list:
        a, b, C, x, Dk = _dev(ctx, inp[:5])
        h = ns.states(a, b, order="chunked", chunk=inp[5], device=ctx.device, build=build)
        y = ns.output(C, h, x, Dk, device=ctx.device)
        return _cat([to_host(h), to_host(y)])

    def reference(inp: tuple) -> list:
        a, b, C, x, Dk = (v.astype(np.float64) for v in inp[:5])
        L, _, N = a.shape
        K = chunk_depth(L, max(inp[5], 1))
        h, H = ss.states_f64(a, b), ss.state_magnitudes(a, b)
        y = np.einsum("tn,tdn->td", C, h) + Dk[None] * x
        Y = np.einsum("tn,tdn->td", np.abs(C), H) + np.abs(Dk[None] * x)
        return _cat_expected(
            [Expected(value=h, bound=ss.gamma(K) * H), Expected(value=y, bound=ss.gamma(K + N + 2) * Y)]
        )

    def observe(j: Judgement) -> None:
        e = j.expected[0]
        r = np.abs(np.asarray(j.native[0]) - e.value) / np.maximum(e.bound, 1e-300)  # flat h|y
        worst["ratio"] = max(worst["ratio"], float(r.max()) if r.size else 0.0)

    check = Check(
        name=f"chunked[{build.combine}, chunk {chunk}]@{ctx.device}",
        inputs=inputs,
        native=native,
        reference=reference,
        output_names=("h|y",),
        observe=observe,
        agreement=engine.item_agreement(
            ctx,
            "error_bound",
            bound_name="gamma_K H, K = 5 chunk + 2 cdiv(L, chunk) + 2; y: gamma_{K+N+2}(|C| H + |D x|)",
        ),
        build={"combine": build.combine, "chunk": chunk},
        from_witness=_from_witness,
        regime_of=lambda c: regime_of(
            ns.chunk_plan, {"length": c[1], "lanes": c[2] * c[3], "chunk": _chunk_of(c, chunk)}
        ),
        refuses=(ValueError,),
        **{**_common(max_len), "decode": lambda rp: tuple(rp.values)},
    )
    return engine.run(ctx, check, lambda: {"worst_error_over_bound": worst["ratio"]})


def _chunk_of(c: tuple, default: int) -> int:
    """A case's chunk: a witness case carries its own (5th element), a drawn case runs the item's."""
    return int(c[4]) if len(c) > 4 else default


def _from_witness(values: Any) -> tuple:
    """A regime or boundary witness (length, lanes, chunk) as the case (seed 0, L, D = lanes, N = 1, chunk)."""
    return (0, int(values["length"]), int(values["lanes"]), 1, int(values["chunk"]))


_GRADS = ("x", "raw", "A", "B", "C", "D")


@register_test("scan.vjp_spec")
def vjp_spec(ctx: FalsifyContext) -> Outcome:
    """The float64 build's VJP within gamma_K (u = 2^-53) of the magnitudes of the spec's float64 gradients."""
    build = ns.ScanBuild("double", softplus=ctx.params.get("softplus", "softplus"))
    max_len = int(ctx.params.get("max_len", 24)) * ctx.budget.scale

    def inputs(c: tuple) -> tuple:
        inp = draw_inputs(*c, dtype=np.float64)
        return (*inp, np.random.default_rng(c[0] + 1).standard_normal(inp[0].shape))

    def native(inp: tuple) -> list:
        g = ns.selective_scan_vjp(*_dev(ctx, inp), device=ctx.device, chunk=4, build=build)
        return _cat([to_host(getattr(g, k)) for k in _GRADS])

    def reference(inp: tuple) -> list:
        g, m = ss.vjp(*inp), ss.vjp(*inp, magnitudes=True)
        L, D = inp[0].shape
        N = inp[2].shape[1]
        dA = float(np.abs(ss.softplus(inp[1])[:, :, None] * inp[2][None]).max())
        K = int((4 + 12 * dA) * L) + 2 * (5 * 4 + 2 * L) + N + D + L + 64
        return _cat_expected([Expected(value=g[k], bound=ss.gamma(K, U64) * m[k] + 1e-300) for k in _GRADS])

    check = Check(
        name=f"vjp[{build.softplus}]@{ctx.device}",
        inputs=inputs,
        native=native,
        reference=reference,
        output_names=("|".join(_GRADS),),
        agreement=engine.item_agreement(
            ctx,
            "error_bound",
            bound_name="gamma_K(2^-53) x the gradient "
            "evaluated on magnitudes, K = (4 + 12 max|delta A|) L + 2 (20 + "
            "2L) + N + D + L + 64",
        ),
        build={"softplus": build.softplus, "ftype": "double"},
        **_common(max_len),
    )
    return engine.run(ctx, check)


@register_test("scan.vjp_fd")
def vjp_fd(ctx: FalsifyContext) -> Outcome:
    """<grad, v> of the float64 build within tolerance x (|grad| . |v|) of central differences of the spec."""
    tol = float(ctx.tolerance if ctx.tolerance is not None else 1e-6)
    max_len = int(ctx.params.get("max_len", 16)) * ctx.budget.scale
    hstep = 1e-5

    def inputs(c: tuple) -> tuple:
        inp = draw_inputs(*c, dtype=np.float64)
        rng = np.random.default_rng(c[0] + 7)
        return inp, rng.standard_normal(inp[0].shape), tuple(rng.standard_normal(v.shape) for v in inp)

    def native(case: tuple) -> np.ndarray:
        inp, dy, dirs = case
        g = ns.selective_scan_vjp(*_dev(ctx, (*inp, dy)), device=ctx.device, chunk=4, build=ns.ScanBuild("double"))
        return np.array([float((to_host(getattr(g, k)) * v).sum()) for k, v in zip(_GRADS, dirs, strict=True)])

    def reference(case: tuple) -> Expected:
        inp, dy, dirs = case
        fd, scale = [], []
        m = ss.vjp(*inp, dy, magnitudes=True)
        for i, (k, v) in enumerate(zip(_GRADS, dirs, strict=True)):
            up = [p + hstep * v if j == i else p for j, p in enumerate(inp)]
            dn = [p - hstep * v if j == i else p for j, p in enumerate(inp)]
            fd.append(float(((ss.forward(*up)[0] - ss.forward(*dn)[0]) * dy).sum() / (2 * hstep)))
            scale.append(float((m[k] * np.abs(v)).sum()))
        return Expected(value=np.array(fd), bound=tol * np.array(scale))

    check = Check(
        name=f"vjp-fd@{ctx.device}",
        inputs=inputs,
        native=native,
        reference=reference,
        output_names=("dir_x_raw_A_B_C_D",),
        agreement=engine.item_agreement(
            ctx, "error_bound", bound_name=f"{tol:g} x <|grad|, |v|> (central differences, h = 1e-5, float64)"
        ),
        build={"h": hstep, "ftype": "double"},
        **_common(max_len),
    )
    return engine.run(ctx, check)


def _doubling_scan(a: Any, b: Any) -> Any:
    """h_t = a_t h_{t-1} + b_t along dim 0 by log2(n) doubling steps (Hillis-Steele; no division: stable)."""
    import torch

    a, b = a.clone(), b.clone()
    d, n = 1, a.shape[0]
    while d < n:
        nb = torch.addcmul(b[d:], a[d:], b[:-d])
        na = a[d:] * a[:-d]
        b[d:], a[d:] = nb, na
        d *= 2
    return b


def torch_scan(a: Any, b: Any, chunk: int = 64) -> Any:
    """h_t = a_t h_{t-1} + b_t along dim 0 (h_{-1} = 0) in torch: a GPU scan, not a loop over t.

    Within chunks of ``chunk`` steps cumprod/cumsum give the chunk's scan from a zero state (h = P cumsum(b / P),
    P = cumprod(a): exact enough while a stays away from 0 over one chunk, as on the timed inputs, a in
    [0.9, 1]); the states carried across chunks (L / chunk of them) by a doubling scan, then added back.
    """
    import torch

    L = a.shape[0]
    pad = (-L) % chunk
    if pad:
        a = torch.cat([a, a.new_ones((pad, *a.shape[1:]))])
        b = torch.cat([b, b.new_zeros((pad, *b.shape[1:]))])
    A, B = a.reshape(-1, chunk, *a.shape[1:]), b.reshape(-1, chunk, *b.shape[1:])
    P = torch.cumprod(A, dim=1)
    H = P * torch.cumsum(B / P, dim=1)
    if A.shape[0] > 1:
        carry = _doubling_scan(P[:, -1], H[:, -1])  # the state at each chunk's end
        H[1:] += P[1:] * carry[:-1].unsqueeze(1)
    return H.reshape(-1, *a.shape[1:])[:L]


def _scan_operands(L: int, D: int = 16, N: int = 16) -> tuple[Any, Any]:
    """a in [0.9, 1], b ~ N(0, 1), float32, drawn on the device (seeded): drawn on the host, astype'd and uploaded
    they took ~0.5 s of SCAN-PERF's 1.3 s (H100, 2026-11-27); the timing does not depend on the values."""
    import cupy

    rs = cupy.random.RandomState(0)
    return rs.uniform(0.9, 1.0, (L, D, N), dtype=cupy.float32), rs.standard_normal((L, D, N), dtype=cupy.float32)


def time_scan(L: int, D: int = 16, N: int = 16, reps: int = 5) -> dict[str, float]:
    """Milliseconds per states() call on the device: chunked kernel, sequential kernel, the torch scan."""
    import torch

    a, b = _scan_operands(L, D, N)
    ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
    fns = {
        "chunked": lambda: ns.states(a, b, order="chunked", device="cuda"),
        "sequential": lambda: ns.states(a, b, order="sequential", device="cuda"),
        "torch_scan": lambda: torch_scan(ta, tb),
    }
    return {name: engine.time_ms(fn, iters=reps, warmup=1) for name, fn in fns.items()}


@register_test("scan.performance", devices=("cuda",))
def performance(ctx: FalsifyContext) -> Outcome:
    """At each length the chunked kernel is at least ``tolerance`` x as fast as a torch GPU scan (interval of the
    ratio); the sequential kernel's time is recorded beside it."""
    import cupy
    import torch

    from falsification import measure

    want, source = measure.threshold(ctx) if ctx.tolerance is not None else (1.0, "default")
    budget = measure.Budget.of(ctx.params)
    lengths = [int(v) for v in ctx.params.get("lengths", [1 << 10, 1 << 12, 1 << 14, 1 << 16])]
    # each length's operands drawn once (2^16 x 16 x 16 draws cost ~0.4 s on the host; they were drawn three times)
    operands = {L: _scan_operands(L) for L in lengths}
    peer_error = 0.0
    for L in (min(lengths), max(lengths)):
        a0, b0 = operands[L]
        ours0 = ns.states(a0, b0, order="chunked", device="cuda")
        peer0 = cupy.asarray(torch_scan(torch.as_tensor(a0, device="cuda"), torch.as_tensor(b0, device="cuda")))
        # on the device (the same float32 differences and maxima as on the host, without 2 x 67 MB of copies)
        scale = float(cupy.abs(ours0).max()) or 1.0
        peer_error = max(peer_error, float(cupy.abs(peer0 - ours0).max()) / scale)
    if not peer_error < 1e-3:  # a peer that computes something else is no peer: fail loud
        return engine.outcome_violated(
            ctx, {"peer_error": peer_error}, f"the torch scan disagrees with the chunked kernel ({peer_error:.3g})"
        )

    def case(L: int) -> Callable[[], measure.Comparison]:
        def build() -> measure.Comparison:
            a, b = operands[L]
            ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
            return measure.Comparison(
                ours=lambda: ns.states(a, b, order="chunked", device="cuda"),
                peers={"torch_scan": lambda: torch_scan(ta, tb)},
                configs={
                    "torch_scan": f"torch {torch.__version__}: cumprod/cumsum scan in chunks of 64, a doubling scan "
                    "of the chunk carries (falsification.scan_tests.torch_scan), eager, defaults"
                },
                ours_name="chunked",
            )

        return build

    verdicts = measure.compare_cases({str(L): case(L) for L in lengths}, want, ">=", budget, ctx.seed)
    sequential_ms = {}
    for L in lengths:
        a, b = operands[L]
        sequential_ms[str(L)] = engine.time_ms(
            lambda a=a, b=b: ns.states(a, b, order="sequential", device="cuda"), iters=3, warmup=1
        )
    return measure.outcome(
        ctx,
        verdicts,
        f"chunked scan: torch_scan_ms / chunked_ms >= {want:g} at every length",
        budget,
        threshold_source=source,
        sequential_kernel_ms=sequential_ms,
        peer_max_rel_error=peer_error,
        lanes=256,
        chunk=ns.CHUNK,
        operands="a ~ U[0.9, 1], b ~ N(0, 1), float32, drawn by cupy RandomState(0)",
    )
