"""Attention: the shipped contract on the host, planted bugs caught by their items, edge cases, graph IR."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from falsification import attention_tests as at
from falsification.registry import FalsifyContext, get_test
from native import attention as na
from obligations.check import check_contract
from obligations.core.symbolic import as_type, cdiv, select, smin
from spec import attention as sa

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "contracts" / "attention-v1.yaml"


def _run(test: str, **params: object) -> object:
    return get_test(test).run(FalsifyContext("host", "quick", 0, {"id": "X", "test": test, "params": params}))


def _items(path: Path, ids: list[str]) -> dict[str, dict]:
    return {it["id"]: it for it in check_contract(path, only=ids, device="host")["items"]}


def test_shipped_contract_holds_on_host():
    by = {it["id"]: it for it in check_contract(CONTRACT, device="host")["items"]}
    bad = {k: (v["status"], v["reason"]) for k, v in by.items() if v["status"] in ("violated", "error", "unknown")}
    assert not bad, bad
    for iid in (
        "ATT-PLAN-launch",
        "ATT-PLAN-q-inbounds",
        "ATT-PLAN-kv-inbounds",
        "ATT-PLAN-gqa",
        "ATT-PLAN-keys",
        "ATT-PLAN-smem",
        "ATT-PLAN-dq-partials",
        "ATT-PLAN-dq-layers",
        "ATT-PLAN-vjp-grids",
        "ATT-MERGE-identity",
    ):
        assert by[iid]["status"] == "proved", iid
    assert by["ATT-PLAN-enum"]["status"] == "exhausted"
    assert by["ATT-MERGE-identity"]["evidence"]["kind"] == "sympy"
    assert by["ATT-MERGE-identity"]["evidence"]["unguarded_alpha_at_n0"] == "nan"
    for iid in ("ATT-FWD-bound", "ATT-VJP-bound", "ATT-UNTILED", "ATT-MASKED-ROW", "ATT-AUDIT"):
        assert by[iid]["status"] == "passed", iid
    w = by["ATT-REGIMES"]["evidence"]["witnesses"]  # the guard's limits: at and one past, each run by the items
    assert w["head_dim <= 128 @accept"]["head_dim"] == 128 and w["head_dim <= 128 @reject"]["head_dim"] == 129
    assert w["batch*heads_q <= 65535 @reject"]["batch"] * w["batch*heads_q <= 65535 @reject"]["heads_q"] == 65536
    for iid in ("ATT-FWD-bound", "ATT-FWD16-bound", "ATT-VJP-bound"):
        ev = by[iid]["evidence"]
        assert ev["regimes_unreached"] == [] and ev["boundaries_unreached"] == [], iid
        assert ev["boundaries_reached"]["head_dim <= 128 @reject"] == 1, iid
    for iid in ("ATT-PERF-fwd32", "ATT-PERF-fwd16", "ATT-PERF-vjp32", "ATT-VJP-dqkernel-bound"):
        assert by[iid]["status"] == "skipped" and "cuda" in by[iid]["reason"]


def test_planted_missing_rescale_is_caught_by_the_merge_identity_and_the_forward_bound():
    o = _run("attention.merge_identity", update="tests.planted.attention_bugs:update_no_rescale")
    assert o.status.value == "violated" and "merge identity fails" in o.reason
    o = _run("attention.forward_bound", impl="tests.planted.attention_bugs:attention_no_rescale")
    assert o.status.value == "violated" and o.evidence["worst_error_over_bound"] > 1


def test_planted_mask_after_softmax_is_caught_by_the_forward_bound():
    o = _run("attention.forward_bound", impl="tests.planted.attention_bugs:attention_mask_after_softmax")
    assert o.status.value == "violated"


def test_planted_vjp_without_jacobian_diagonal_is_caught_by_the_vjp_bound():
    o = _run("attention.vjp_bound", impl_vjp="tests.planted.attention_bugs:vjp_no_diagonal")
    assert o.status.value == "violated"


def test_planted_bug_through_the_contract_item(tmp_path):
    old = 'params: {update: "native.attention:online_update", max_tile: 3}'
    text = CONTRACT.read_text().replace(
        old, old.replace("native.attention:online_update", "tests.planted.attention_bugs:update_no_rescale")
    )
    path = tmp_path / "attention-v1.yaml"
    path.write_text(text)
    assert _items(path, ["ATT-MERGE-identity"])["ATT-MERGE-identity"]["status"] == "violated"


def test_planted_off_by_one_head_dim_guard_is_caught_by_the_rejected_boundary_witness():
    # ATT-REGIMES' witnesses at and one past the head-dim limit (test_shipped_contract_holds_on_host: Z3 finds them)
    shape = {"batch": 1, "heads_q": 1, "heads_kv": 1, "seq_q": 1, "seq_k": 1}
    w = {"head_dim <= 128 @reject": {**shape, "head_dim": 129}, "head_dim <= 128 @accept": {**shape, "head_dim": 128}}
    item = {"id": "X", "test": "attention.forward_bound"}
    for impl, status in (("native.attention:attention", "passed"), (PLANTED_HD, "violated")):
        ctx = FalsifyContext("host", "quick", 0, {**item, "params": {"impl": impl, "max_examples": 1}}, witnesses=w)
        o = get_test("attention.forward_bound").run(ctx)
        assert o.status.value == status, o.reason
    assert o.counterexample["kind"] == "guard" and o.counterexample["detail"].startswith("head_dim <= 128 @reject")


PLANTED_HD = "tests.planted.attention_bugs:attention_head_dim_off_by_one"


def test_int32_offsets_would_be_a_violation(tmp_path, monkeypatch):
    real = na.AttentionPlan.q_offset

    def narrow(self: na.AttentionPlan, bh: object, i: object, d: object) -> object:
        from obligations.core.symbolic import as_type

        return (as_type(bh, "int32") * self.seq_q + i) * self.head_dim + d

    monkeypatch.setattr(na.AttentionPlan, "q_offset", narrow)
    it = _items(CONTRACT, ["ATT-PLAN-q-inbounds"])["ATT-PLAN-q-inbounds"]
    monkeypatch.setattr(na.AttentionPlan, "q_offset", real)
    assert it["status"] == "violated", it["reason"]


@pytest.mark.parametrize(
    "planted, why",
    [
        (lambda self, i, causal, kv_len: cdiv(as_type(kv_len, "int64"), self.block_rows), "reads layers above"),
        (
            lambda self, i, causal, kv_len: select(
                causal, as_type(i, "int64") // self.block_rows, cdiv(as_type(kv_len, "int64"), self.block_rows)
            ),
            "misses the row's own block",
        ),
    ],
)
def test_planted_dq_layer_ends_are_refuted(monkeypatch, planted, why):
    """The dQ sum's layer end is proved exact: one that reads the causal layers no block wrote for the row, or one
    that stops before the row's own key block, is violated by ATT-PLAN-dq-layers."""
    monkeypatch.setattr(na.AttentionPlan, "dq_layer_end", planted)
    it = _items(CONTRACT, ["ATT-PLAN-dq-layers"])["ATT-PLAN-dq-layers"]
    assert it["status"] == "violated", (why, it["reason"])


def test_planted_overlapping_dq_layers_are_refuted(monkeypatch):
    """Layers a row apart instead of q_elems apart overlap: ATT-PLAN-dq-partials refutes the offset."""

    def overlapping(self: na.AttentionPlan, layer: object, bh: object, i: object, d: object) -> object:
        return as_type(layer, "int64") * self.head_dim + self.q_offset(bh, i, d)

    monkeypatch.setattr(na.AttentionPlan, "dq_partial_offset", overlapping)
    it = _items(CONTRACT, ["ATT-PLAN-dq-partials"])["ATT-PLAN-dq-partials"]
    assert it["status"] == "violated", it["reason"]


def test_planted_short_vjp_grids_are_refuted(monkeypatch):
    """Grids by floor division (a tail of rows or dQ elements no block covers) are violated by ATT-PLAN-vjp-grids;
    the launches take the plan's grids, so the proof is about the numbers that run."""
    monkeypatch.setattr(na, "launch_blocks", lambda elems, per_block: elems // per_block)
    it = _items(CONTRACT, ["ATT-PLAN-vjp-grids"])["ATT-PLAN-vjp-grids"]
    assert it["status"] == "violated", it["reason"]


@pytest.mark.parametrize(("key_end", "row"), [("f16_key_end", "f16_row"), ("f16w_key_end", "f16w_row")])
def test_planted_float16_key_end_at_the_block_start_is_refuted(monkeypatch, key_end, row):
    """A float16 forward block (the 16-row warps' blocks of f16_rows, the wide kernel's of f16w_rows) that stops its
    causal keys at its first row instead of past its last misses allowed keys: ATT-PLAN-keys refutes it (the
    float16 blocks are proved, not only the float32 kernels' block_rows)."""

    def short(self: na.AttentionPlan, bx: object, causal: object, kv_len: object) -> object:
        first = getattr(self, row)(bx, 0)
        return select(causal, smin(as_type(kv_len, "int64"), first), as_type(kv_len, "int64"))

    monkeypatch.setattr(na.AttentionPlan, key_end, short)
    it = _items(CONTRACT, ["ATT-PLAN-keys"])["ATT-PLAN-keys"]
    assert it["status"] == "violated", it["reason"]


def test_planted_wide_query_tile_over_the_stages_is_refuted(monkeypatch):
    """A wide forward whose Q tile starts at offset 0 would overwrite the first K/V stage: ATT-PLAN-smem refutes it."""
    monkeypatch.setattr(na.AttentionPlan, "smem_query", lambda self, r, d: r * self.ld_half + d)
    it = _items(CONTRACT, ["ATT-PLAN-smem"])["ATT-PLAN-smem"]
    assert it["status"] == "violated", it["reason"]


def test_float16_forward_blocks_follow_the_plan():
    """Blocks of 8 warps at hd_pad 64, of 4 at 128 (16 rows a warp); the wide kernel's 4 warps of 32 rows: the
    kernels' BR and NT are the plan's f16_rows and f16_threads (f16w_rows and f16w_threads)."""
    for hd, rows in ((64, 128), (7, 128), (80, 64), (128, 64)):
        p = na.attention_plan(1, 2, 2, 300, 300, hd)
        assert (p.f16_rows, p.f16_threads, p.grid_f16) == (rows, 2 * rows, -(-300 // rows)), hd
        assert (p.f16w_rows, p.f16w_threads, p.grid_f16w) == (128, 128, 3), hd
        for kind in na.TENSOR_CORE_KERNELS:
            br, nt = (128, 128) if kind == "fwd16w" else (rows, 2 * rows)
            src, _ = na.kernel_source(kind, hd)
            assert f"#define BR {br}\n" in src and f"#define NT {nt}\n" in src, (kind, hd)


def test_default_fwd16_is_wide_only_at_head_dims_above_64_without_a_causal_mask():
    """The measured choice (native.attention.default_fwd16), and every variant a kernel of its own."""
    assert na.default_fwd16(128, False) == "wide"
    assert {na.default_fwd16(128, True), na.default_fwd16(64, False), na.default_fwd16(64, True)} == {"pipelined"}
    assert set(na.FWD16_VARIANTS.values()) == set(na.TENSOR_CORE_KERNELS)
    kinds = at._forward_kinds("float16")
    assert kinds(128) == ("fwd16p", "fwd16w") and kinds(64) == ("fwd16p",) and kinds(7) == ("fwd16p",)
    assert at._forward_kinds("float16", "sync")(128) == ("fwd16",) and at._forward_kinds("float32")(128) == ("fwd",)


def test_vjp_paths_follow_the_plan_and_refuse_what_it_does_not_cover():
    """Partials where the plan allows them (a fixed cap, not the free memory), the dQ kernel above, row kernels
    above head dim 64; a forced partials path past the cap and an unknown name are refused."""
    assert na.vjp_path(na.attention_plan(1, 32, 32, 2048, 2048, 64)) == "partials"
    assert na.vjp_path(na.attention_plan(1, 32, 32, 2048, 2048, 64), "kernel") == "kernel"
    big = na.attention_plan(8, 32, 32, 8192, 8192, 64)
    assert not big.partial_dq and na.vjp_path(big) == "kernel"
    assert na.vjp_path(na.attention_plan(1, 2, 1, 5, 7, 80), "partials") == "rowwise"
    with pytest.raises(na.AttentionShapeError, match="DQ_PARTIALS_MAX"):
        na.vjp_path(big, "partials")
    with pytest.raises(ValueError, match="dq_path"):
        na.vjp_path(big, "atomics")
    p = na.attention_plan(1, 1, 1, 300, 200, 64)
    assert p.dq_partial_elems == p.grid_k * p.q_elems and 4 * p.dq_partial_elems <= na.DQ_PARTIALS_MAX


def test_unguarded_merge_is_nan_at_n0_and_guarded_is_zero():
    state = (np.full(1, -np.inf, np.float32), np.zeros(1, np.float32), np.zeros((1, 2), np.float32))
    s = np.full((1, 3), -np.inf, np.float32)
    m, lsum, o = na.online_update(state, s, np.ones((1, 3, 2), np.float32)[0])
    assert lsum[0] == 0 and not np.isnan(o).any()
    out = na.finalize((m, lsum, o))
    assert (out.view(np.uint32) == 0).all()
    with np.errstate(all="ignore"):
        assert np.isnan(np.exp(np.float32(-np.inf) - np.float32(-np.inf)))


def test_guard_rejects_bad_shapes_and_lengths():
    q = np.zeros((1, 3, 4, 8), np.float32)
    k = np.zeros((1, 2, 5, 8), np.float32)
    with pytest.raises(na.AttentionShapeError):
        na.attention(q, k, k)  # 3 query heads over 2 KV heads
    with pytest.raises(na.AttentionShapeError):
        na.attention(q[:, :2], k, k, kv_lens=[6])
    with pytest.raises(na.AttentionShapeError):
        na.attention(q, k[:, :0], k[:, :0])  # no KV heads: refused, not a ZeroDivisionError
    assert na.attention_plan(1, 4, 2, 10, 10, 64).accepts(10**6, 10**6, 10**6, 10**6)
    assert not na.attention_plan(1, 4, 2, 10, 10, 64).accepts(10, 10**6, 10**6, 10**6)


def test_spec_with_no_keys_is_rows_of_zeros_with_a_finite_bound():
    q = np.ones((1, 2, 3, 4))
    k = np.zeros((1, 1, 0, 4))
    assert np.array_equal(sa.sdpa(q, k, k), np.zeros((1, 2, 3, 4)))
    exact, bound = sa.forward_bound(q, k, k)
    assert np.array_equal(exact, np.zeros((1, 2, 3, 4))) and np.all(np.isfinite(bound))


def test_spec_gradients_match_finite_differences():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s) for s in ((1, 2, 3, 4), (1, 1, 5, 4), (1, 1, 5, 4)))
    do = rng.standard_normal((1, 2, 3, 4))
    kw = {"causal": True, "kv_lens": [4]}
    dq, dk, dv = sa.sdpa_vjp(q, k, v, do, **kw)
    h = 1e-6
    for x, g in ((q, dq), (k, dk), (v, dv)):
        e = np.zeros_like(x)
        e.flat[1] = h
        args = {"q": q, "k": k, "v": v}
        name = next(n for n, a in args.items() if a is x)
        plus = sa.sdpa(**{**args, name: x + e}, **kw)
        minus = sa.sdpa(**{**args, name: x - e}, **kw)
        assert abs(((plus - minus) * do).sum() / (2 * h) - g.flat[1]) < 1e-6


def test_ir_composition_denotes_the_spec_within_the_bound():
    """spec/ir has no attention op: its transpose/matmul/mul_elem/softmax composition agrees with spec.attention."""
    from spec.ir.denote import Ok, denote
    from spec.ir.graph import GraphBuilder

    rng = np.random.default_rng(5)
    lq, lk, d = 5, 7, 8
    q = rng.uniform(-1, 1, (lq, d)).astype(np.float32)
    k = rng.uniform(-1, 1, (lk, d)).astype(np.float32)
    v = rng.uniform(-1, 1, (lk, d)).astype(np.float32)
    g = GraphBuilder()
    nq, nk, nv = g.add("input", (), (lq, d)), g.add("input", (), (lk, d)), g.add("input", (), (lk, d))
    kt = g.add("transpose", (nk,), (d, lk), dim0=0, dim1=1)
    s = g.add("matmul", (nq, kt), (lq, lk))
    c = g.add("const", (), (lq, lk), params={"value": np.full((lq, lk), 1 / np.sqrt(d), np.float32)})
    a = g.add("softmax", (g.add("mul_elem", (s, c), (lq, lk)),), (lq, lk), axis=-1)
    g.add("matmul", (a, nv), (lq, d))
    graph, payload = g.build()
    res = denote(graph, payload, [q, k, v])
    assert isinstance(res, Ok), res
    got = np.asarray(res.value).view(np.float32) if np.asarray(res.value).dtype == np.uint32 else res.value
    ref, bound = sa.forward_bound(q[None, None], k[None, None], v[None, None], tiles=1)
    assert (np.abs(got.astype(np.float64) - ref[0, 0]) <= bound[0, 0]).all()


@pytest.mark.cuda
def test_contract_holds_on_cuda_and_the_figures_are_measured():
    """On a GPU every item holds except the measured figures, which are passed or violated with their ratio."""
    from tests.contract_helpers import CUDA_OK

    if not CUDA_OK:
        pytest.skip("no CUDA device")
    by = {it["id"]: it for it in check_contract(CONTRACT, device="cuda")["items"]}
    perf = {k for k in by if k.startswith("ATT-PERF")}
    bad = {
        k: (v["status"], v["reason"])
        for k, v in by.items()
        if k not in perf and v["status"] in ("violated", "error", "unknown")
    }
    assert not bad, bad
    # each VJP path is reached by cases and the evidence says which (H100 2026-11-28: partials 37 and rowwise 6,
    # kernel 37 and rowwise 6)
    assert {"partials", "rowwise"} <= set(by["ATT-VJP-bound"]["evidence"]["vjp_paths"])
    assert {"kernel", "rowwise"} <= set(by["ATT-VJP-dqkernel-bound"]["evidence"]["vjp_paths"])
    for k in perf:  # measured with an interval (falsification.measure), whichever way it is decided
        assert by[k]["status"] in ("passed", "violated", "inconclusive"), (k, by[k]["status"], by[k]["reason"])
        for case in by[k]["evidence"]["cases_measured"].values():
            assert case["interval"]["low"] <= case["interval"]["estimate"] <= case["interval"]["high"]
            assert case["trials"] >= 8 and case["median_ms"]["ours"] > 0


def test_undeclared_tensor_cores_are_caught_by_the_audit():
    """The float16 forward declares tensor cores; undeclared, the same build breaks no-mma (and sass-mma)."""
    from dataclasses import replace

    from native.builds import all_builds
    from native.ptx import PtxUnavailable, SassUnavailable
    from obligations.audit import audit_build, audit_sass

    build = next(b for b in all_builds("attention") if b.name == "fwd16-hd64")
    assert build.tensor_cores and not any(b.tensor_cores for b in all_builds("attention") if "fwd16" not in b.name)
    try:
        _, found = audit_build(replace(build, tensor_cores=False))
    except PtxUnavailable as exc:
        pytest.skip(str(exc))
    assert any(f.rule == "no-mma" for f in found)
    assert not audit_build(build)[1]
    try:
        _, found, mix = audit_sass(replace(build, tensor_cores=False))
    except (SassUnavailable, RuntimeError) as exc:
        pytest.skip(f"no SASS here: {exc}")
    assert any(f.rule == "sass-mma" for f in found) and mix["HMMA"] > 0
    assert not audit_sass(build)[1]


def test_precompile_builds_every_kernel_the_cases_launch_side_by_side(monkeypatch, tmp_path):
    """On cuda the attention items build each (kernel, head dim) the cases can launch, at once, into the cache."""
    import threading
    import time

    from native import attention as na
    from native import nvrtc

    assert at.precompile("host", at._vjp_kinds) == 0
    built, live, peak = [], [0], [0]
    lock = threading.Lock()

    def fake_binary(source: str, options: tuple) -> bytes:
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            built.append(source)
        time.sleep(0.05)
        with lock:
            live[0] -= 1
        return b""

    monkeypatch.setattr(nvrtc, "_binary", fake_binary)
    monkeypatch.setattr(nvrtc, "_arch", lambda: "90")
    monkeypatch.setattr(nvrtc, "_cache_dir", lambda: tmp_path)
    monkeypatch.setattr(at.os, "cpu_count", lambda: 16)
    n = at.precompile("cuda", at._vjp_kinds)
    want = set()
    for hd in at._HEAD_DIMS:
        tiled = bool(na.attention_plan(1, 1, 1, 1, 1, hd).tiled_vjp)
        for kind in ("fwd", "delta", "dkdvq", "dqsum") if tiled else ("fwd", "row_dq", "row_dv", "row_dk"):
            want.add(na.kernel_source(kind, hd, na.V_LOAD)[0])
    assert n == len(want) == len(built) and set(built) == want and peak[0] > 1
    assert {hd for hd in at._HEAD_DIMS if not na.attention_plan(1, 1, 1, 1, 1, hd).tiled_vjp} == {96}
    built.clear()
    # the default's kernels: the pipelined one at every head dim, the wide one too where hd_pad is 128 (96)
    assert at.precompile("cuda", at._forward_kinds("float16")) == len(at._HEAD_DIMS) + 1 == len(built)
    monkeypatch.setattr(nvrtc, "_cache_dir", lambda: None)
    assert at.precompile("cuda", at._vjp_kinds) == 0


def _fwd16_case(hd: int, causal: bool, seed: int) -> tuple:
    """(B, Hq, Hkv, Lq, Lk) = (2, 4, 2, 300, 260), float16 inputs of magnitude 2, key lengths 260 and 131."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(-2, 2, (2, 4, 300, hd)).astype(np.float16)
    k = rng.uniform(-2, 2, (2, 2, 260, hd)).astype(np.float16)
    v = rng.uniform(-1, 1, (2, 2, 260, hd)).astype(np.float16)
    return q, k, v, np.array([260, 131], np.int64)


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("hd", [64, 128, 80, 7])
def test_pipelined_fwd16_is_within_the_derived_bound_and_equals_the_sync_kernel(hd, causal):
    """The pipelined float16 forward (cp.async double buffers) within spec.attention.forward_bound's tensor-core
    bound, and equal in value to the sync kernel (the same arithmetic in the same order), as the wide kernel (warps
    of 32 rows) and the default are; head dim 7 takes the plain-load paths, 80 pads to 128."""
    from tests.contract_helpers import CUDA_OK

    if not CUDA_OK:
        pytest.skip("no CUDA device")
    import cupy

    q, k, v, lens = _fwd16_case(hd, causal, hd + causal)
    ref, bound = sa.forward_bound(
        q, k, v, causal=causal, kv_lens=lens, tiles=-(-260 // na.BC), u_out=sa.U16, tensor_core=True, tile_keys=na.BC
    )
    outs = {}
    for variant in ("sync", "pipelined", "wide", None):
        out, lse = na.attention(
            *(cupy.asarray(x) for x in (q, k, v)), causal=causal, kv_lens=lens, device="cuda", fwd16=variant
        )
        outs[variant] = (cupy.asnumpy(out), cupy.asnumpy(lse))
    got = outs["pipelined"][0].astype(np.float64)
    assert np.isfinite(got).all()
    ratio = float((np.abs(got - ref) / bound).max())
    assert ratio <= 1, f"max |err| / bound = {ratio}"
    for variant in ("pipelined", "wide", None):
        for a, b in zip(outs[variant], outs["sync"], strict=True):
            assert np.array_equal(a, b), (variant, float(np.abs(a.astype(np.float64) - b).max()))


@pytest.mark.cuda
def test_pipelined_fwd16_copies_unaligned_views_and_refuses_unknown_variants():
    """A view 2 bytes off a 16-byte boundary gives the same values (copied for cp.async); an unknown variant is a
    shape error before any launch."""
    from tests.contract_helpers import CUDA_OK

    if not CUDA_OK:
        pytest.skip("no CUDA device")
    import cupy

    q, k, v, lens = _fwd16_case(64, False, 1)
    base = cupy.asarray(np.concatenate([np.zeros(1, np.float16), q.reshape(-1)]))
    qv = base[1:].reshape(q.shape)
    assert qv.data.ptr % 16 != 0
    kd, vd = cupy.asarray(k), cupy.asarray(v)
    a, _ = na.attention(qv, kd, vd, kv_lens=lens, device="cuda", fwd16="pipelined")
    w, _ = na.attention(qv, kd, vd, kv_lens=lens, device="cuda", fwd16="wide")
    b, _ = na.attention(cupy.asarray(q), kd, vd, kv_lens=lens, device="cuda", fwd16="sync")
    assert np.array_equal(cupy.asnumpy(a), cupy.asnumpy(b)) and np.array_equal(cupy.asnumpy(w), cupy.asnumpy(b))
    with pytest.raises(na.AttentionShapeError):
        na.attention(cupy.asarray(q), kd, vd, device="cuda", fwd16="no-such-variant")


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True])
def test_dq_partials_give_the_dq_kernel_paths_dk_dv_and_the_same_dq_on_every_run(causal):
    """The partials path's dK and dV are bitwise the dQ kernel path's (the same arithmetic); its dQ is within a few
    float32 ulps of that path's (another order) and bitwise the same on a second run; fully masked rows give +0."""
    from tests.contract_helpers import CUDA_OK

    if not CUDA_OK:
        pytest.skip("no CUDA device")
    import cupy

    rng = np.random.default_rng(7)
    q = cupy.asarray(rng.standard_normal((2, 4, 333, 64)).astype(np.float32))
    k, v = (cupy.asarray(rng.standard_normal((2, 2, 300, 64)).astype(np.float32)) for _ in range(2))
    do = cupy.asarray(rng.standard_normal(q.shape).astype(np.float32))
    lens = np.array([300, 0])  # the second batch: every row fully masked
    out, lse = na.attention(q, k, v, causal=causal, kv_lens=lens, device="cuda")
    runs = [na.attention_vjp(q, k, v, out, lse, do, causal=causal, kv_lens=lens, device="cuda") for _ in range(2)]
    ref = na.attention_vjp(q, k, v, out, lse, do, causal=causal, kv_lens=lens, device="cuda", dq_path="kernel")
    a, b, r = ([cupy.asnumpy(x) for x in g] for g in (*runs, ref))
    assert all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a, b, strict=True))
    assert np.array_equal(a[1], r[1]) and np.array_equal(a[2], r[2])
    assert np.allclose(a[0], r[0], rtol=1e-5, atol=1e-6 * float(np.abs(r[0]).max()))
    assert not np.array_equal(a[0], r[0]) or causal  # another order: some dQ bits differ (non-causal, 3 layers)
    assert not a[0][1].view(np.uint32).any()  # +0.0 everywhere in the masked batch
