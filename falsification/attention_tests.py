"""Falsification, proof and measurement tests of the attention family (contracts/attention-v1.yaml).

Registered names and their ``params``:

* ``attention.merge_identity`` {update="native.attention:online_update", max_tile=3} — sympy proves, over
  symbolic tiles of 0..max_tile scores and values, that folding two tiles with the update rule gives the
  state of their union and finalises to softmax(s) . v; fully masked tiles (-oo scores), empty tiles and
  the fully masked row (output 0) are cases; the unguarded rule's NaN at n = 0 is recorded. ``proved``
  with sympy evidence, or ``violated`` with the tile sizes, the difference and a refuting rational point.
* ``attention.forward_bound`` {impl="native.attention:attention", storage=float32|float16, tile, fwd16} — out
  within spec.attention.forward_bound of the float64 SDPA (masks, GQA/MQA, fully masked rows); float16 storage
  is judged under the bound's tensor-core model (the float16 kernel's mma products). ``fwd16`` names a variant of
  the float16 kernel (native.attention.FWD16_VARIANTS): a CUDA kernel, so on the host the item is skipped.
* ``attention.vjp_bound`` {impl="native.attention:attention_vjp"} — dQ, dK, dV within spec.attention.vjp_bound.
* ``attention.untiled_equal`` {} (host) — the tiled host path at tile = Lk is bitwise the untiled float32 spec.
* ``attention.masked_rows`` {impl, impl_vjp} — fully masked rows: out +0.0, lse +inf, gradients +0.0, bitwise.
* ``attention.perf`` {which: forward_f32|forward_f16|vjp_f32, batch, heads, seq, head_dim; forward: cases [[head_dim,
  causal], ...], backend flash_attention|efficient_attention|cudnn_attention|math} (cuda, measure) —
  ours over torch.nn.functional.scaled_dot_product_attention, CUDA events after warm-up; the item's
  tolerance is the least ratio torch_ms / ours_ms.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from hypothesis import strategies as st

from falsification import engine
from falsification.agreement import Expected
from falsification.engine import Check
from falsification.registry import FalsifyContext, Replay, guarded, register_test
from native.attention import AttentionShapeError
from obligations.core.evidence import SympyEvidence
from obligations.core.plans import regime_of, resolve
from obligations.core.results import Outcome, error, proved, skipped, violated
from spec import attention as sa

__all__ = ["SYMPY_OPS", "case_inputs", "CASE_KEYS"]

CASE_KEYS = ("seed", "batch", "heads_kv", "group", "seq_q", "seq_k", "head_dim", "causal", "lens", "mag", "tile")
_LENS = ("full", "random", "empty")  # key padding: none, random lengths, some batch with kv_len = 0
_MAGS = (0.5, 2.0, 6.0, 2.0)
_TIED = 3  # mag 3: keys repeat with period 3, so every query row has its maximum score several times in every tile
_HEAD_DIMS = (1, 4, 7, 16, 64, 96)  # the drawn head dims; each is a kernel build of its own on the device


@st.composite
def _cases(draw: Any, max_seq: int) -> dict:
    return {
        "seed": draw(st.integers(0, 2**32 - 1)),
        "batch": draw(st.integers(1, 2)),
        "heads_kv": draw(st.integers(1, 2)),
        "group": draw(st.sampled_from([1, 2, 3])),
        "seq_q": draw(st.integers(1, max_seq)),
        "seq_k": draw(st.integers(1, max_seq)),
        "head_dim": draw(st.sampled_from(_HEAD_DIMS)),
        "causal": draw(st.booleans()),
        "lens": draw(st.sampled_from(range(len(_LENS)))),
        "mag": draw(st.sampled_from(range(len(_MAGS)))),
        "tile": draw(st.sampled_from([1, 5, 32])),
    }


_EXPLICIT = (
    {
        "seed": 1,
        "batch": 2,
        "heads_kv": 1,
        "group": 2,
        "seq_q": 33,
        "seq_k": 70,
        "head_dim": 16,
        "causal": True,
        "lens": 2,
        "mag": 2,
        "tile": 32,
    },
    {
        "seed": 2,
        "batch": 1,
        "heads_kv": 2,
        "group": 1,
        "seq_q": 9,
        "seq_k": 130,
        "head_dim": 64,
        "causal": False,
        "lens": 1,
        "mag": 1,
        "tile": 32,
    },
    {
        "seed": 3,
        "batch": 1,
        "heads_kv": 2,
        "group": 2,
        "seq_q": 150,
        "seq_k": 140,
        "head_dim": 96,
        "causal": True,
        "lens": 1,
        "mag": 1,
        "tile": 32,
    },
    {
        "seed": 4,
        "batch": 1,
        "heads_kv": 1,
        "group": 2,
        "seq_q": 260,
        "seq_k": 200,
        "head_dim": 64,
        "causal": False,
        "lens": 0,
        "mag": 2,
        "tile": 32,
    },
    {  # ties: every row's maximum score recurs in every key tile (keys of period 3 over 3 tiles)
        "seed": 5,
        "batch": 1,
        "heads_kv": 1,
        "group": 1,
        "seq_q": 5,
        "seq_k": 130,
        "head_dim": 16,
        "causal": False,
        "lens": 0,
        "mag": _TIED,
        "tile": 32,
    },
)


def _encode(c: dict) -> tuple[int, ...]:
    return tuple(int(c[k]) for k in CASE_KEYS)


def _decode(rp: Replay) -> dict:
    c = dict(zip(CASE_KEYS, rp.values, strict=True))
    c["causal"] = bool(c["causal"])
    return c


def _from_witness(seed: int, w: Any) -> dict:
    """The case of a regime or guard-boundary witness of ATT-REGIMES (its heads_q kept where no group gives it)."""
    from native.attention import BC

    hq, hkv = int(w["heads_q"]), int(w["heads_kv"])
    c = {"seed": seed, "batch": int(w["batch"]), "heads_kv": hkv, "seq_q": int(w["seq_q"]), "seq_k": int(w["seq_k"])}
    c.update(head_dim=int(w["head_dim"]), causal=False, lens=0, mag=1, tile=BC)
    c["group"] = hq // hkv if hkv >= 1 and hq % hkv == 0 else 1
    if hkv * c["group"] != hq:
        c["heads_q"] = hq  # a refused witness: no whole group of query heads per KV head
    if int(w.get("kv_len", c["seq_k"])) != c["seq_k"]:
        c["kv_len"] = int(w["kv_len"])  # the key-padding guard's witness: every batch's length
    return c


def _regimes(c: dict) -> list[str]:
    from native import attention as na

    hq = c.get("heads_q", c["heads_kv"] * c["group"])
    values = {"batch": c["batch"], "heads_q": hq, "heads_kv": c["heads_kv"], "seq_q": c["seq_q"]}
    return regime_of(na.attention_plan, {**values, "seq_k": c["seq_k"], "head_dim": c["head_dim"]})


def case_inputs(c: dict, dtype: Any = np.float32) -> dict[str, Any]:
    """q, k, v, dout, kv_lens of a case (seeded; fully masked rows where lens is "empty")."""
    rng = np.random.default_rng(c["seed"])
    b, hkv, hq = c["batch"], c["heads_kv"], c.get("heads_q", c["heads_kv"] * c["group"])
    lq, lk, d, mag = c["seq_q"], c["seq_k"], c["head_dim"], _MAGS[c["mag"]]
    q = (rng.uniform(-1, 1, (b, hq, lq, d)) * mag).astype(dtype)
    k = (rng.uniform(-1, 1, (b, hkv, lk, d)) * mag).astype(dtype)
    if c["mag"] == _TIED:  # equal maxima within and across tiles: the running maximum meets its equal
        k = np.ascontiguousarray(k[:, :, np.arange(lk) % min(lk, 3)])
    v = rng.uniform(-1, 1, (b, hkv, lk, d)).astype(dtype)
    dout = rng.uniform(-1, 1, (b, hq, lq, d)).astype(np.float32)
    lens = {"full": np.full(b, lk), "random": rng.integers(0, lk + 1, b), "empty": np.array([0] + [lk] * (b - 1))}[
        _LENS[c["lens"]]
    ]
    if "kv_len" in c:  # a witness of the key-padding guard (ATT-REGIMES)
        lens = np.full(b, c["kv_len"])
    return {"q": q, "k": k, "v": v, "dout": dout, "kv_lens": lens.astype(np.int64), "case": c}


def _host(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _dev(x: np.ndarray, device: str) -> Any:
    if device == "cuda":
        import cupy

        return cupy.asarray(x)
    return x


def _tile_keys(c: dict, device: str) -> int:
    from native.attention import BC

    return c["tile"] if device == "host" else BC


def _tiles(c: dict, device: str) -> int:
    return -(-c["seq_k"] // _tile_keys(c, device))


def _worst(seen: dict) -> Callable[[engine.Judgement], None]:
    def observe(j: engine.Judgement) -> None:
        for nat, e in zip(j.native, j.expected, strict=True):
            with np.errstate(all="ignore"):
                r = np.abs(np.asarray(nat, np.float64) - e.value) / e.bound
            if r.size and not np.isnan(r).all():  # an empty or all-NaN ratio (no keys: 0/0) adds nothing
                seen["worst"] = max(seen["worst"], float(np.nanmax(r)))

    return observe


def _forward_kinds(storage: str, variant: str | None = None) -> Callable[[int], tuple[str, ...]]:
    from native import attention as na

    def kinds(hd: int) -> tuple[str, ...]:
        if storage != "float16":
            return ("fwd",)
        if variant is not None:
            return (na.FWD16_VARIANTS[variant],)
        hd_pad = int(na.attention_plan(1, 1, 1, 1, 1, hd).hd_pad)  # the default's kernels, with and without causal
        return tuple(sorted({na.FWD16_VARIANTS[na.default_fwd16(hd_pad, c)] for c in (False, True)}))

    return kinds


# The kernels of each VJP path (native.attention.vjp_path)
VJP_KINDS = {
    "partials": ("delta", "dkdvq", "dqsum"),
    "kernel": ("dq", "dkdv"),
    "rowwise": ("row_dq", "row_dv", "row_dk"),
}


def _vjp_kinds(hd: int, dq_path: str | None = None) -> tuple[str, ...]:
    from native import attention as na

    return ("fwd", *VJP_KINDS[na.vjp_path(na.attention_plan(1, 1, 1, 1, 1, hd), dq_path)])


def precompile(device: str, kinds_of: Callable[[int], tuple[str, ...]], head_dims: Iterable[int] = _HEAD_DIMS) -> int:
    """Compile the kernels an item's cases launch (every head dim it draws) side by side, into the NVRTC disk cache.

    Each (kernel, head dim) is a build of its own that costs about a second of NVRTC, which releases the GIL: a
    pool of threads builds them at once instead of one per case as the cases first reach them (the launches
    then load them from the cache). Nothing on the host, or where the disk cache is off. Returns the count.
    """
    if device != "cuda":
        return 0
    from native import attention as na
    from native import nvrtc

    if nvrtc._cache_dir() is None:
        return 0
    options = nvrtc.get_route(na.ROUTE).flags.options()
    jobs = sorted({(kind, hd) for hd in head_dims for kind in kinds_of(hd)})
    nvrtc._arch()  # the device's architecture, asked once here (CUDA initialised in this thread first)

    def build(job: tuple[str, int]) -> None:
        nvrtc._binary(na.kernel_source(job[0], job[1], na.V_LOAD)[0], options)

    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), (os.cpu_count() or 2) - 1))) as pool:
        list(pool.map(build, jobs))
    return len(jobs)


def _check(
    ctx: FalsifyContext,
    name: str,
    native: Callable,
    reference: Callable,
    outputs: tuple[str, ...],
    bound_name: str,
    dtype: Any = np.float32,
    extra: Callable[[], dict] | None = None,
) -> Outcome:
    seen = {"worst": 0.0}
    ag = engine.item_agreement(ctx, "error_bound", bound_name=bound_name)
    max_seq = int(ctx.params.get("max_seq", 48)) * ctx.budget.scale
    check = Check(
        name=name,
        inputs=lambda c: case_inputs(c, dtype),
        native=native,
        reference=reference,
        agreement=ag,
        cases=_cases(max_seq),
        explicit=_EXPLICIT,
        encode=_encode,
        decode=_decode,
        describe=lambda c: dict(c),
        observe=_worst(seen),
        output_names=outputs,
        build={"impl": name, "reference": "spec.attention (float64 SDPA)"},
        from_witness=lambda w: _from_witness(ctx.seed, w),
        regime_of=_regimes,
        refuses=(AttentionShapeError,),
        # The float64 references (NumPy einsum, GIL released) are computed ahead in threads, in order of the cases.
        reference_threads=max(0, min(8, (os.cpu_count() or 1) - 1)),
    )
    return engine.run(ctx, check, lambda: {"worst_error_over_bound": seen["worst"], **(extra() if extra else {})})


@register_test("attention.forward_bound")
@guarded()
def forward_bound(ctx: FalsifyContext) -> Outcome:
    """out within the derived bound of the float64 SDPA (masks, GQA/MQA, fully masked rows, tiles)."""
    name = ctx.params.get("impl", "native.attention:attention")
    impl = resolve(name)
    storage = ctx.params.get("storage", "float32")
    dtype = {"float32": np.float32, "float16": np.float16}[storage]
    u_out = {"float32": sa.U32, "float16": sa.U16}[storage]
    variant = ctx.params.get("fwd16")
    variant_kw = {} if variant is None else {"fwd16": str(variant)}
    if variant is not None:
        from native.attention import FWD16_VARIANTS

        if storage != "float16" or variant not in FWD16_VARIANTS:
            return error(f"params.fwd16 {variant!r} needs storage float16 and one of {sorted(FWD16_VARIANTS)}")
        if ctx.device != "cuda":  # the host path is one for every variant: ATT-FWD16-bound checks it
            return skipped(f"fwd16 variant {variant!r} is a CUDA kernel: runs on cuda; this run is on {ctx.device}")
    if ctx.replay is None:
        precompile(ctx.device, _forward_kinds(storage, variant))

    def native(x: dict) -> list:
        c = x["case"]
        out, _ = impl(
            *(_dev(x[n], ctx.device) for n in "qkv"),
            causal=c["causal"],
            kv_lens=x["kv_lens"],
            device=ctx.device,
            tile=c["tile"],
            **variant_kw,
        )
        return [_host(out).astype(np.float64)]

    def reference(x: dict) -> Expected:
        c = x["case"]
        ref, bound = sa.forward_bound(
            x["q"],
            x["k"],
            x["v"],
            causal=c["causal"],
            kv_lens=x["kv_lens"],
            tiles=_tiles(c, ctx.device),
            u_out=u_out,
            tensor_core=storage == "float16",
            tile_keys=_tile_keys(c, ctx.device),
        )
        return Expected(value=ref.reshape(-1), bound=bound.reshape(-1))

    return _check(
        ctx,
        f"{name}[{storage}{'' if variant is None else ', ' + str(variant)}]",
        native,
        reference,
        ("out",),
        "online-softmax forward bound (spec.attention.forward_bound)",
        dtype,
    )


@register_test("attention.vjp_bound")
@guarded()
def vjp_bound(ctx: FalsifyContext) -> Outcome:
    """dQ, dK, dV within the derived bound of the float64 SDPA VJP (from the float32 forward's out and lse)."""
    from native.attention import attention_plan, vjp_path

    name = ctx.params.get("impl_vjp", "native.attention:attention_vjp")
    impl = resolve(name)
    fwd = resolve(ctx.params.get("impl", "native.attention:attention"))
    dq_path = ctx.params.get("dq_path")  # the tiled VJP's dQ path (native.attention.DQ_PATHS); omitted: the plan's
    if dq_path is not None:
        from native.attention import DQ_PATHS

        if dq_path not in DQ_PATHS:
            return error(f"params.dq_path {dq_path!r} must be one of {list(DQ_PATHS)}")
        if ctx.device != "cuda":  # the host path is one for every dQ path: ATT-VJP-bound checks it
            return skipped(f"dq_path {dq_path!r} selects CUDA kernels: runs on cuda; this run is on {ctx.device}")
    if ctx.replay is None:
        precompile(ctx.device, functools.partial(_vjp_kinds, dq_path=dq_path))
    paths: dict[str, int] = {}  # the kernels each case ran (evidence: every path the item claims is reached)

    def native(x: dict) -> list:
        c = x["case"]
        kw = {"causal": c["causal"], "kv_lens": x["kv_lens"], "device": ctx.device, "tile": c["tile"]}
        q, k, v = (_dev(x[n], ctx.device) for n in "qkv")
        out, lse = fwd(q, k, v, **kw)
        grads = impl(q, k, v, out, lse, _dev(x["dout"], ctx.device), **kw, **({"dq_path": dq_path} if dq_path else {}))
        if ctx.device != "host":
            b, hq, lq, d = (int(n) for n in q.shape)
            path = vjp_path(attention_plan(b, hq, int(k.shape[1]), lq, int(k.shape[2]), d), dq_path)
            paths[path] = paths.get(path, 0) + 1
        return [np.concatenate([_host(g).astype(np.float64).reshape(-1) for g in grads])]

    def reference(x: dict) -> list:
        c = x["case"]
        refs, bounds = sa.vjp_bound(
            x["q"], x["k"], x["v"], x["dout"], causal=c["causal"], kv_lens=x["kv_lens"], tiles=_tiles(c, ctx.device)
        )
        return Expected(
            value=np.concatenate([r.reshape(-1) for r in refs]), bound=np.concatenate([b.reshape(-1) for b in bounds])
        )

    return _check(
        ctx,
        name,
        native,
        reference,
        ("dq|dk|dv",),
        "tiled VJP bound (spec.attention.vjp_bound)",
        extra=lambda: {"vjp_paths": dict(sorted(paths.items()))} if paths else {},
    )


def _bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(_host(a), dtype=np.float32).reshape(-1).view(np.uint32)


@register_test("attention.untiled_equal", devices=("host",))
@guarded()
def untiled_equal(ctx: FalsifyContext) -> Outcome:
    """At tile = Lk the host path's out and lse are bitwise the untiled float32 spec (spec.attention.untiled_f32)."""
    impl = resolve(ctx.params.get("impl", "native.attention:attention"))

    def native(x: dict) -> list:
        c = x["case"]
        out, lse = impl(
            x["q"], x["k"], x["v"], causal=c["causal"], kv_lens=x["kv_lens"], device="host", tile=c["seq_k"]
        )
        return [np.concatenate([_bits(out), _bits(lse)])]

    def reference(x: dict) -> list:
        c = x["case"]
        out, lse = sa.untiled_f32(x["q"], x["k"], x["v"], causal=c["causal"], kv_lens=x["kv_lens"])
        return Expected(bits=np.concatenate([_bits(out), _bits(lse)]))

    ag = engine.item_agreement(ctx, "bitwise", nan_policy="exact")
    check = Check(
        name="host tile=Lk vs untiled_f32",
        inputs=case_inputs,
        native=native,
        reference=reference,
        agreement=ag,
        cases=_cases(int(ctx.params.get("max_seq", 48))),
        explicit=_EXPLICIT,
        encode=_encode,
        decode=_decode,
        describe=lambda c: dict(c),
        output_names=("out|lse",),
        build={"reference": "spec.attention.untiled_f32"},
    )
    return engine.run(ctx, check)


@register_test("attention.masked_rows")
@guarded()
def masked_rows(ctx: FalsifyContext) -> Outcome:
    """Fully masked rows (kv_len = 0): out is +0.0, lse +inf, and dQ (and dK, dV of the batch) +0.0, bitwise."""
    fwd = resolve(ctx.params.get("impl", "native.attention:attention"))
    vjp = resolve(ctx.params.get("impl_vjp", "native.attention:attention_vjp"))

    def native(x: dict) -> list:
        c = x["case"]
        kw = {"causal": c["causal"], "kv_lens": x["kv_lens"], "device": ctx.device, "tile": c["tile"]}
        q, k, v = (_dev(x[n], ctx.device) for n in "qkv")
        out, lse = fwd(q, k, v, **kw)
        dq, dk, dv = vjp(q, k, v, out, lse, _dev(x["dout"], ctx.device), **kw)
        return [np.concatenate([_bits(_host(a)[0]) for a in (out, lse, dq, dk, dv)])]

    def reference(x: dict) -> list:
        q, k = x["q"], x["k"]
        inf = np.array([np.inf], np.float32).view(np.uint32)[0]
        z = np.zeros
        return Expected(
            bits=np.concatenate(
                [
                    z(q[0].size, np.uint32),
                    np.full(q[0, :, :, 0].size, inf),
                    z(q[0].size, np.uint32),
                    z(2 * k[0].size, np.uint32),
                ]
            )
        )

    ag = engine.item_agreement(ctx, "bitwise", nan_policy="exact")
    cases = _cases(32).map(lambda c: {**c, "lens": 2})
    check = Check(
        name="fully masked rows",
        inputs=case_inputs,
        native=native,
        reference=reference,
        agreement=ag,
        cases=cases,
        explicit=(_EXPLICIT[0],),
        encode=_encode,
        decode=_decode,
        describe=lambda c: dict(c),
        output_names=("out|lse|dq|dk|dv",),
        build={"documented_value": "out +0.0, lse +inf, gradients +0.0 (batch 0 has kv_len = 0)"},
    )
    return engine.run(ctx, check)


# -- the online-softmax identity, proved with sympy -------------------------------------------------------


def _sympy_ops() -> Any:
    import sympy

    from native.attention import Ops

    def where(c: Any, a: Any, b: Any) -> Any:
        if isinstance(c, tuple):
            return tuple(
                where(ci, a, bi if isinstance(b, tuple) else b)
                for ci, bi in zip(c, b if isinstance(b, tuple) else (b,) * len(c), strict=True)
            )
        return sympy.Piecewise((a, c), (b, True))

    def elementwise(f: Callable[[Any], Any]) -> Callable[[Any], Any]:
        return lambda x: tuple(f(e) for e in x) if isinstance(x, tuple) else f(x)

    return Ops(
        name="sympy",
        exp=elementwise(sympy.exp),
        maximum=sympy.Max,
        rowmax=lambda s: sympy.Max(*s),
        rowsum=lambda p: sympy.Add(*p),
        matmul=lambda p, v: sympy.Add(*[a * b for a, b in zip(p, v, strict=True)]),
        where=where,
        is_neginf=elementwise(lambda x: sympy.Eq(x, -sympy.oo)),
        positive=lambda x: sympy.StrictGreaterThan(x, 0),
        col=lambda x: x,
        sub=lambda a, b: tuple(e - b for e in a) if isinstance(a, tuple) else a - b,
        div=lambda a, b: a / b,
    )


SYMPY_OPS = _sympy_ops


def _is_zero(e: Any) -> tuple[bool, Any]:
    """(e == 0 proved, simplified form): Max terms become free reals (the identity must hold for any)."""
    import sympy

    e = sympy.piecewise_fold(e)
    if e.has(sympy.Piecewise):
        return False, e
    maxes = sorted(e.atoms(sympy.Max), key=sympy.default_sort_key)
    e = e.xreplace({mx: sympy.Symbol(f"M{i}", real=True) for i, mx in enumerate(maxes)})
    num, den = sympy.fraction(sympy.together(e))
    num = sympy.expand(sympy.powsimp(sympy.expand(num), combine="exp"))
    num = sympy.expand(sympy.powsimp(num, combine="exp"))
    return num == 0, num


def _tile(prefix: str, n: int, masked: bool) -> tuple[tuple, tuple]:
    import sympy

    s = tuple(-sympy.oo if masked else sympy.Symbol(f"{prefix}s{j}", real=True) for j in range(n))
    v = tuple(sympy.Symbol(f"{prefix}v{j}", real=True) for j in range(n))
    return s, v


@register_test("attention.merge_identity")
@guarded()
def merge_identity(ctx: FalsifyContext) -> Outcome:
    """sympy: update(update(empty, T1), T2) finalises to softmax . v of T1 u T2 (and to 0 with no allowed key)."""
    import sympy

    name = ctx.params.get("update", "native.attention:online_update")
    update = resolve(name)
    from native.attention import finalize

    ops = _sympy_ops()
    t0 = time.perf_counter()
    empty = (-sympy.oo, sympy.Integer(0), sympy.Integer(0))
    max_tile = int(ctx.params.get("max_tile", 3))
    lemmas: list[str] = []
    cases = 0
    for n1, n2, m1, m2 in itertools.product(range(max_tile + 1), range(max_tile + 1), (False, True), (False, True)):
        if (m1 and n1 == 0) or (m2 and n2 == 0):
            continue
        s1, v1 = _tile("a", n1, m1)
        s2, v2 = _tile("b", n2, m2)
        state = update(update(empty, s1, v1, ops), s2, v2, ops)
        got = finalize(state, ops)
        live = [(s, v) for s, v in zip(s1 + s2, v1 + v2, strict=True) if s != -sympy.oo]
        if live:
            want = sympy.Add(*[sympy.exp(s) * v for s, v in live]) / sympy.Add(*[sympy.exp(s) for s, _ in live])
            lw = sympy.Add(*[sympy.exp(s) for s, _ in live])
            l_claim = state[1] * sympy.exp(state[0]) - lw  # l = sum exp(s_j - m) for the final m
        else:
            want, l_claim = sympy.Integer(0), state[1]
        cases += 1
        for what, diff in (("out", got - want), ("l", l_claim)):
            ok, simplified = _is_zero(diff)
            if not ok:
                rng = np.random.default_rng(ctx.seed)
                point = {
                    sym: sympy.Rational(int(rng.integers(-20, 20)), int(rng.integers(1, 5)))
                    for sym in sympy.piecewise_fold(diff).free_symbols
                }
                val = sympy.N(diff.subs(point))
                ce = {
                    "tiles": [n1, n2],
                    "fully_masked": [m1, m2],
                    "claim": what,
                    "difference": str(simplified)[:400],
                    "point": {str(k): str(v) for k, v in point.items()},
                    "value_at_point": str(val),
                    "replay": engine.replay_command(ctx),
                }
                return violated(
                    ce,
                    f"{name}: the merge identity fails for tiles of {n1} and {n2} ({what})",
                    SympyEvidence(
                        sympy_version=sympy.__version__,
                        simplified_difference=str(simplified)[:400],
                        details={"update": name, "cases": cases},
                    ),
                )
        lemmas.append(f"{n1}{'m' if m1 else ''}+{n2}{'m' if m2 else ''}")
    naive = sympy.exp(-sympy.oo - (-sympy.oo))
    ev = SympyEvidence(
        sympy_version=sympy.__version__,
        simplified_difference="0",
        details={
            "update": name,
            "cases": cases,
            "tile_pairs": lemmas,
            "max_tile": max_tile,
            "edge_cases": "empty tiles (n = 0), fully masked tiles (scores -oo), fully masked row (finalises to 0)",
            "unguarded_alpha_at_n0": str(naive),
            "seconds": round(time.perf_counter() - t0, 3),
            "method": "Max terms replaced by free reals; numerator expanded with exponentials combined (powsimp) to 0",
        },
    )
    return proved(ev)


# -- performance on the device ---------------------------------------------------------------------------


def _perf_inputs(p: dict, dtype: str) -> tuple:
    import cupy

    b, h = int(p.get("batch", 1)), int(p.get("heads", 32))
    lq, d = int(p.get("seq", 2048)), int(p.get("head_dim", 64))
    rng = cupy.random.RandomState(0)
    return tuple(rng.standard_normal((b, h, lq, d), dtype=cupy.float32).astype(dtype) for _ in range(4))


_WHICH = ("forward_f32", "forward_f16", "vjp_f32")
# SDPA backends a peer may be pinned to (torch.nn.attention.SDPBackend member names, lower case).
_SDPA_BACKENDS = frozenset({"flash_attention", "efficient_attention", "cudnn_attention", "math"})


def _sdpa_backend(backend: str | None) -> Any:
    """A context pinning SDPA to ``backend`` (entered once around a measurement, so no call pays for it), or a
    context that changes nothing."""
    import contextlib

    if backend is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, backend.upper()))


def _perf_forward_cases(
    ctx: FalsifyContext, which: str, dtype: str, want: float, source: str, budget: Any, backend: str | None
) -> Outcome:
    """The forward against SDPA on every (head dim, causal) case of ``params.cases``, one verdict per case."""
    import torch
    import torch.nn.functional as F

    from falsification import measure
    from native.attention import attention

    cases, shapes = {}, {}
    for head_dim, causal in ctx.params["cases"]:
        q, k, v, _ = _perf_inputs({**ctx.params, "head_dim": head_dim}, dtype)
        tq, tk, tv = (torch.as_tensor(x, device="cuda") for x in (q, k, v))
        name = f"hd{int(head_dim)}{':causal' if causal else ''}"
        peer = f"torch.sdpa[{backend or 'default'}]"
        cases[name] = measure.Comparison(
            ours=lambda q=q, k=k, v=v, causal=bool(causal): attention(q, k, v, causal=causal, device="cuda"),
            peers={
                peer: lambda tq=tq, tk=tk, tv=tv, causal=bool(causal): F.scaled_dot_product_attention(
                    tq, tk, tv, is_causal=causal
                )
            },
            configs={
                peer: f"torch {torch.__version__} F.scaled_dot_product_attention, {dtype}, is_causal={causal}, "
                f"backend {backend or 'SDPA default choice'}"
            },
        )
        shapes[name] = [int(x) for x in q.shape]
    with _sdpa_backend(backend):
        verdicts = measure.compare_cases(cases, want, ">=", budget, measure.item_seed(ctx.seed, which))
    torch.cuda.synchronize()
    return measure.outcome(
        ctx,
        verdicts,
        f"{which}: torch_ms / ours_ms >= {want:g} for every case",
        budget,
        threshold_source=source,
        shapes=shapes,
        dtype=dtype,
        torch=torch.__version__,
        backend=backend or "default",
    )


@register_test("attention.perf", devices=("cuda",))
@guarded()
def perf(ctx: FalsifyContext) -> Outcome:
    """Our kernel's speed against torch's scaled_dot_product_attention: interleaved trials, an interval of the ratio."""
    import torch
    import torch.nn.functional as F

    from falsification import measure
    from native.attention import attention, attention_vjp

    which = ctx.params["which"]
    if which not in _WHICH:
        return error(f"params.which must be one of {_WHICH}")
    if ctx.tolerance is None:
        return error("attention.perf needs the item's tolerance (least ratio torch_ms / ours_ms)")
    want, source = measure.threshold(ctx)
    budget = measure.Budget.of(ctx.params)
    dtype = "float16" if which == "forward_f16" else "float32"
    backend = ctx.params.get("backend")
    if backend is not None and backend not in _SDPA_BACKENDS:
        return error(f"params.backend must be one of {sorted(_SDPA_BACKENDS)} (omitted: SDPA's own choice)")
    if "cases" in ctx.params:
        if not which.startswith("forward"):
            return error("params.cases (head dim, causal) are for the forward")
        return _perf_forward_cases(ctx, which, dtype, want, source, budget, backend)
    q, k, v, do = _perf_inputs(ctx.params, dtype)
    tq, tk, tv, tdo = (torch.as_tensor(x, device="cuda") for x in (q, k, v, do))
    if which.startswith("forward"):
        comp = measure.Comparison(
            ours=lambda: attention(q, k, v, device="cuda"),
            peers={"torch.sdpa": lambda: F.scaled_dot_product_attention(tq, tk, tv)},
            configs={"torch.sdpa": f"torch {torch.__version__} F.scaled_dot_product_attention, {dtype}, defaults"},
        )
    else:
        out, lse = attention(q, k, v, device="cuda")
        rq, rk, rv = (t.clone().requires_grad_(True) for t in (tq, tk, tv))
        tout = F.scaled_dot_product_attention(rq, rk, rv)
        comp = measure.Comparison(
            ours=lambda: attention_vjp(q, k, v, out, lse, do, device="cuda"),
            peers={"torch.sdpa backward": lambda: torch.autograd.grad(tout, (rq, rk, rv), tdo, retain_graph=True)},
            configs={"torch.sdpa backward": f"torch {torch.__version__} autograd of F.scaled_dot_product_attention"},
        )
    verdicts = {which: measure.compare(comp, want, ">=", budget, measure.item_seed(ctx.seed, which))}
    torch.cuda.synchronize()
    return measure.outcome(
        ctx,
        verdicts,
        f"{which}: torch_ms / ours_ms >= {want:g}",
        budget,
        threshold_source=source,
        shape=[int(x) for x in q.shape],
        dtype=dtype,
        torch=torch.__version__,
    )
