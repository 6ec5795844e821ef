"""The fusion backend and contracts/fusion-v1.yaml: host evidence, golden programs, and each planted bug caught."""

from __future__ import annotations

import numpy as np
import pytest

from falsification.fusion_tests import planted_cases
from native import fusion as nf
from native import fusion_codegen as cg
from native.builds import Build
from obligations.check import check_contract
from spec import fusion as sf
from spec.ir.denote import denote_all
from spec.ir.graph import GraphBuilder
from tests.contract_helpers import CONTRACTS, check_items, contract_variant, needs_cuda

CONTRACT = CONTRACTS / "fusion-v1.yaml"


def test_host_run_evidences_every_host_item_and_says_why_for_the_rest():
    items = {it["id"]: it for it in check_contract(CONTRACT)["items"]}
    assert not [k for k, it in items.items() if it["status"] in ("violated", "error", "unknown")]
    proved = {k for k, it in items.items() if it["status"] == "proved"}
    assert {"FUSION-PLAN-coverage-z3", "FUSION-PLAN-step-z3", "FUSION-PLAN-no-overflow-z3"} <= proved
    assert items["FUSION-PLAN-coverage-enum"]["status"] == "exhausted"
    for k in (
        "FUSION-RULES-generated",
        "FUSION-RULES-small",
        "FUSION-EQ-denotation",
        "FUSION-EQ-unfused",
        "FUSION-GOLDEN",
        "FUSION-CACHE-key",
        "FUSION-RMSNORM-bitwise",
        "FUSION-GQA",
        "FUSION-FP16",
        "FUSION-PATTERNS",
        "FUSION-DECODER",
    ):
        assert items[k]["status"] == "passed", (k, items[k].get("reason"))
    assert items["FUSION-RULES-small"]["evidence"]["cases"] == 1325
    for it in items.values():
        if it["status"] == "skipped":
            assert "runs on cuda" in it["reason"], it


@pytest.mark.parametrize(
    ("item", "old", "new"),
    [
        (
            "FUSION-PLAN-step-z3",
            "plan: native.fusion_codegen:fused_plan",
            "plan: tests.planted.fusion_bugs:fused_plan_int32",
        ),
        (
            "FUSION-RMSNORM-rows-plan-z3",
            "plan: native.fusion_kernels:rmsnorm_rows_plan",
            "plan: tests.planted.fusion_bugs:rmsnorm_rows_plan_unpadded",
        ),
        (
            "FUSION-RMSNORM-rows-plan-enum",
            "plan: native.fusion_kernels:rmsnorm_rows_plan",
            "plan: tests.planted.fusion_bugs:rmsnorm_rows_plan_unpadded",
        ),
        (
            "FUSION-RMSNORM-rows-cover-z3",
            "plan: native.fusion_kernels:rmsnorm_rows_plan",
            "plan: tests.planted.fusion_bugs:rmsnorm_rows_plan_floor_grid",
        ),
        ("FUSION-EQ-denotation", "params: {max_examples: 200}", "params: {max_examples: 200, variant: reorder}"),
        ("FUSION-EQ-denotation", "params: {max_examples: 200}", "params: {max_examples: 5, variant: no_rounding}"),
        ("FUSION-EQ-denotation", "params: {max_examples: 200}", "params: {max_examples: 200, planner: first_read}"),
        (
            "FUSION-RULES-generated",
            "params: {max_examples: 150}",
            "params: {max_examples: 5, compile: 'tests.planted.fusion_bugs:compile_multi_consumer'}",
        ),
        ("FUSION-RULES-small", "params: {extra_nodes: 3}", "params: {extra_nodes: 3, planner: first_read}"),
        ("FUSION-RULES-small", "params: {extra_nodes: 3}", "params: {extra_nodes: 3, variant: reorder}"),
        ("FUSION-CACHE-key", "params: {max_examples: 100}", "params: {max_examples: 100, key: source_name}"),
        ("FUSION-GQA", "params: {max_examples: 60}", "params: {max_examples: 5, grouping: mod}"),
        ("FUSION-FP16", "params: {max_examples: 90}", "params: {max_examples: 5, variant: fp16_no_round}"),
        ("FUSION-PATTERNS", "params: {max_examples: 30}", "params: {max_examples: 5, patterns: false}"),
        ("FUSION-DECODER", "params: {max_examples: 4}", "params: {max_examples: 1, grouping: mod}"),
    ],
)
def test_planted_bug_is_violated_by_its_item(tmp_path, item, old, new):
    it = check_items(contract_variant(CONTRACT, tmp_path, old, new), [item])[item]
    assert it["status"] == "violated", (item, new, it["status"], it.get("reason"))
    assert it["counterexample"]


def test_the_audit_catches_a_32_bit_index_in_a_generated_kernel():
    from native.ptx import PtxUnavailable
    from obligations.audit import audit_build

    g, _ = nf.example_graphs()["chain4"]
    k = cg.generate_fused_kernel(g, (1, 2, 3, 4), "fused_ew_0", "int32_index")
    build = Build("fusion", "planted", k.source, k.name, cg.ROUTE, index_bits=64)  # claims the proved plan
    try:
        _, findings = audit_build(build)
    except PtxUnavailable as exc:
        pytest.skip(str(exc))
    assert any(f.rule == "index-64" for f in findings)


def test_mlp_program_is_the_seeds_four_steps_and_prints():
    g, p = nf.example_graphs()["mlp"]
    prog = nf.compile_subgraph(g)
    text = str(prog)
    assert [s.kind for s in prog.steps] == ["cublas", "cublas", "fused", "cublas"]
    assert "fused_ew_0 [silu 3, mul_elem 4] (in0=n1, in1=n2) -> out0=n4" in text
    assert prog.counts() == {"ops": 5, "steps": 4, "fused_kernels": 1}
    src = prog.steps[2].kernel.source
    assert "for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;" in src
    assert "expf(-x)" in src and "out0[i] = (float)v1;" in src


def test_fused_chain_equals_denotation_and_unfused_on_the_host():
    for case in planted_cases()[:3]:
        prog = nf.compile_subgraph(case.graph)
        ins = dict(zip(case.graph.input_ids(), case.inputs, strict=True))
        got = nf.CUDAExecutor(prog, case.payload, "host").run(ins)
        want = denote_all(case.graph, case.payload, ins).value
        assert all(sf.same_bits(got[o], want[o]) for o in prog.outputs), str(prog)


def test_unsupported_ops_fall_back_to_the_host_never_dropped():
    b = GraphBuilder()
    x = b.add("input", (), (1, 2, 4))
    r = b.add("randUniform", (), (1, 2, 4), seed=7)
    b.add("relu", (b.add("add", (x, r), (1, 2, 4)),), (1, 2, 4))
    g, p = b.build()
    prog = nf.compile_subgraph(g)
    assert [pt.device for pt in prog.partition.parts] == [True, False, True]
    assert [s.kind for s in prog.steps] == ["host", "fused"]
    assert sf.program_violations(prog.spec(), cg.fusable) == []
    xin = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 2, 4)
    out = nf.run_program(g, p, [xin], "host")
    assert sf.same_bits(out[3], denote_all(g, p, [xin]).value[3])


def _rope_embedding_graph():
    b = GraphBuilder()
    ids = b.add("input", (), (3,))
    e = b.add("embedding", (ids,), (3, 4), dim=4, params={"table": np.arange(20, dtype=np.float32).reshape(5, 4)})
    b.add("rope", (b.add("reshape", (e,), (1, 3, 4), shape=(1, 3, 4)),), (1, 3, 4))
    return b.build()


def test_rope_and_embedding_are_device_special_steps():
    g, p = _rope_embedding_graph()
    prog = nf.compile_subgraph(g)
    assert [s.kind for s in prog.steps] == ["special", "alias", "special"]
    assert all(pt.device for pt in prog.partition.parts)
    ids = np.array([4, 0, 2], np.float32)
    out = nf.run_program(g, p, [ids], "host")
    assert sf.same_bits(out[3], denote_all(g, p, [ids]).value[3])


def test_masked_softmax_and_six_op_rmsnorm_are_one_pattern_step_each():
    from falsification.fusion_tests import pattern_graph

    for kind, n in (("masked_softmax", 2), ("rmsnorm", 7)):
        g, p = pattern_graph(kind, 3, 8, 0)
        steps = [s for s in nf.compile_subgraph(g, payload=p).steps if s.kind == "pattern"]
        assert len(steps) == 1 and steps[0].pattern.kind == kind and len(steps[0].nodes) == n
    g, p = pattern_graph("rmsnorm", 3, 8, 0)
    assert not [s for s in nf.compile_subgraph(g).steps if s.kind == "pattern"]  # no payload: exponent unknown


def test_pattern_near_misses_are_left_alone():
    b = GraphBuilder()
    x = b.add("input", (), (2, 3))
    m = b.add("input", (), (2, 3))
    a = b.add("add", (x, m), (2, 3))
    s = b.add("softmax", (a,), (2, 3), axis=-1)
    b.add("add", (s, a), (2, 3))  # the add is read outside the softmax: no masked-softmax pattern
    b.add("softmax", (b.add("add", (x, m), (2, 3)),), (2, 3), axis=0)  # not the last axis
    g, p = b.build()
    prog = nf.compile_subgraph(g, payload=p)
    assert not [st for st in prog.steps if st.kind == "pattern"]
    assert sf.program_violations(prog.spec(), cg.fusable) == []


def test_fp16_chain_rounds_after_every_op():
    from falsification.fusion_tests import _bits16, fp16_reference

    b = GraphBuilder()
    x = b.add("input", (), (2,))
    c = b.add("const", (), (2,), params={"value": [2048.0, 2048.0]})
    b.add("sub", (b.add("add", (x, c), (2,)), c), (2,))
    g, p = b.build()
    xin = np.array([1.0, 3.0], np.float32)
    ref = fp16_reference(g, p, {0: xin})[3]
    assert list(ref) == [0.0, 4.0]
    for variant, want in (("default", True), ("fp16_no_round", False)):
        got = nf.run_program(g, p, [xin], "host", storage="float16", variant=variant)[3]
        assert (_bits16([got]) == _bits16([ref])).all() == want
    prog = nf.compile_subgraph(g, storage="float16")
    assert "kc_round16(r)" in prog.steps[0].kernel.source and "unsigned short" in prog.steps[0].kernel.source
    with pytest.raises(ValueError, match="float16 storage"):
        nf.compile_subgraph(nf.example_graphs()["mlp"][0], storage="float16")


def test_decoder_block_compiles_to_device_steps_and_agrees_on_the_host():
    from falsification.fusion_tests import decoder_flags

    flags, ev = decoder_flags(("small", 0, np.array([3, 0, 10, 5], np.float32)), "host")
    assert flags.tolist() == [1, 1, 1, 1, 1], ev
    assert ev["patterns"] == ["masked_softmax", "rmsnorm"] and ev["gqa"] == ["qk", "sv"]


@needs_cuda
@pytest.mark.cuda
def test_prewritten_kernels_on_cuda_equal_their_host_paths():
    import cupy

    g, p = _rope_embedding_graph()
    ids = np.array([4, 0, 2], np.float32)
    assert sf.same_bits(nf.run_program(g, p, [ids], "cuda")[3], nf.run_program(g, p, [ids], "host")[3])
    with pytest.raises(ValueError, match="embedding index"):
        nf.run_program(g, p, [np.array([5, 0, 1], np.float32)], "cuda")
    from native import fusion_kernels as fk
    from native.nvrtc import compile_function

    general = compile_function(*fk.SOURCES["rmsnorm"], fk.ROUTE)
    rows_k = compile_function(*fk.SOURCES["rmsnorm_rows"], fk.ROUTE)
    rng = np.random.default_rng(0)
    # (2, 12268), (2, 8000), (2, 12268): a larger shared-memory opt-in, a smaller one, the larger again (the
    # attribute only grows: lowering it once made the third launch invalid)
    for rows, d in ((64, 4096), (23, 1000), (3, 4100), (5, 4097), (1, 4), (11, 3), (2, 12268), (2, 8000), (2, 12268)):
        x = rng.standard_normal((rows, d)).astype(np.float32)
        w = rng.standard_normal(d).astype(np.float32)
        want = fk.rmsnorm_host(x, w, 1e-6)
        for fn in (general, (general, rows_k)):
            got = cupy.asnumpy(fk.rmsnorm_cuda(fn, cupy.asarray(x), cupy.asarray(w), 1e-6))
            assert sf.same_bits(got, want), (rows, d, fn)
    b = GraphBuilder()
    w = rng.standard_normal(4096).astype(np.float32)
    b.add("rmsnorm", (b.add("input", (), (64, 4096)),), (64, 4096), params={"weight": w}, eps=1e-6)
    g2, p2 = b.build()
    x = rng.standard_normal((64, 4096)).astype(np.float32)
    assert sf.same_bits(nf.run_program(g2, p2, [x], "cuda")[1], denote_all(g2, p2, [x]).value[1])


def test_cache_compiles_once_per_key_and_keeps_flags_apart():
    calls = []
    cache = nf.KernelCache(compiler=lambda s, n, r, a: calls.append((n, r, a)) or (n, r, a))
    src = 'extern "C" __global__ void k() {}'
    assert cache.get(src, "k", "nvrtc-ieee", "90") == ("k", "nvrtc-ieee", "90")
    assert cache.get(src, "k", "nvrtc-ieee", "90") == ("k", "nvrtc-ieee", "90")
    assert cache.get(src, "k", "nvrtc-ftz", "90") == ("k", "nvrtc-ftz", "90")
    assert cache.compiles == 2 == len(calls)
    seed = nf.KernelCache(compiler=lambda s, n, r, a: (n, r, a), key="source_name")
    seed.get(src, "k", "nvrtc-ieee", "90")
    assert seed.get(src, "k", "nvrtc-ftz", "90") == ("k", "nvrtc-ieee", "90")  # the seed's collision


def test_planner_reuses_dead_buffers_only():
    case = planted_cases()[2]
    prog = nf.compile_subgraph(case.graph)
    assert nf.planner_violations(prog.requests, prog.buffers) == []
    bad = nf.compile_subgraph(case.graph, planner="first_read")
    assert any("overlap" in v for v in nf.planner_violations(bad.requests, bad.buffers))


def test_every_op_has_one_category_and_every_fusable_op_is_elementwise():
    from spec.ir.ops import OPS

    assert set(OPS) == set(sf.CATEGORY)
    assert all(sf.classify_op(op) == sf.ELEMENTWISE for op in cg.FUSED_OPS)


@needs_cuda
@pytest.mark.cuda
def test_contract_holds_on_cuda():
    # The timings are kc check's to decide (its measure items run first, alone on the GPU); here the suite may
    # share the GPU between pytest-xdist workers, so a measure item must only have measured, with its interval.
    res = check_contract(CONTRACT, device="cuda")
    timed = {it["id"] for it in res["items"] if it.get("method") == "measure"}
    bad = {
        it["id"]: (it["status"], it.get("reason"))
        for it in res["items"]
        if it["id"] not in timed and it["status"] in ("violated", "error", "unknown")
    }
    assert not bad, bad
    for it in res["items"]:
        if it["id"] in timed:
            assert it["status"] in ("passed", "violated", "inconclusive"), (it["id"], it["status"], it.get("reason"))
            for case in it["evidence"]["cases_measured"].values():
                assert case["interval"]["low"] <= case["interval"]["estimate"] <= case["interval"]["high"]


def test_perf_contenders_are_built_once_for_consecutive_items():
    """FUSION-PERF-mlp-gemms and -mlp-torch time the same program against two peers: one build serves both."""
    from falsification import fusion_tests as ft

    calls: list[tuple[int, ...]] = []

    def setup(*args: int):
        calls.append(args)
        return {}, {}, {"args": args}

    assert ft._built(setup, 1, 2) is ft._built(setup, 1, 2)
    assert ft._built(setup, 3, 2)[2] == {"args": (3, 2)} and calls == [(1, 2), (3, 2)]
    ft._built.cache_clear()


def test_planner_sends_conv2d_to_cudnn_where_it_can_run_and_says_why_not():
    from falsification.fusion_tests import conv_graph
    from native.cudnn import cudnn_missing

    g, p = conv_graph(1, 2, 5, 5, 3, 3)
    asked = nf.compile_subgraph(g, payload=p, conv="cudnn")
    assert [s.kind for s in asked.steps] == ["cudnn"] and asked.conv_route == "cudnn"
    assert "cudnn" in str(asked) and sf.STEP_KINDS["cudnn"]
    direct = nf.compile_subgraph(g, payload=p, conv="direct")
    assert [s.kind for s in direct.steps] == ["cublas"] and direct.conv_route == "direct"
    auto = nf.compile_subgraph(g, payload=p)
    why = cudnn_missing()
    assert auto.conv_route == ("direct" if why else "cudnn")
    if why:  # this machine: no GPU or no torch; the program says why it kept the direct kernel
        assert why.startswith("needs cuda and torch: ") and why in auto.conv_reason
    with pytest.raises(ValueError, match="conv must be one of"):
        nf.compile_subgraph(g, conv="winograd")
    # no conv2d node: the route is never asked (no torch import), and nothing is recorded
    assert nf.compile_subgraph(nf.chain4_graph()[0]).conv_route == ""
    # a cuDNN step run by a host executor is the direct kernel's host path: the denotation, bit for bit
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 5)).astype(np.float32)
    got = nf.CUDAExecutor(asked, p, "host").run([x])[1]
    assert sf.same_bits(got, denote_all(g, p, [x]).value[1])
    assert sf.program_violations(asked.spec(), cg.fusable) == []


def test_cudnn_missing_says_needs_cuda_and_torch_without_a_gpu(monkeypatch):
    from native import cudnn

    monkeypatch.setattr(cudnn, "cuda_available", lambda: (False, "no CUDA device (test)"))
    cudnn.cudnn_missing.cache_clear()
    try:
        assert cudnn.cudnn_missing() == "needs cuda and torch: no CUDA device (test)"
        assert nf.conv_route("auto")[0] == "direct"
        with pytest.raises(ValueError, match="runs on cuda only"):
            cudnn.conv(np.zeros((1, 1, 3, 3), np.float32), np.zeros((1, 1, 1, 1), np.float32), device="host")
        with pytest.raises(RuntimeError, match="needs cuda and torch"):
            cudnn.conv(np.zeros((1, 1, 3, 3), np.float32), np.zeros((1, 1, 1, 1), np.float32))
    finally:
        cudnn.cudnn_missing.cache_clear()


@needs_cuda
@pytest.mark.cuda
def test_cudnn_step_agrees_with_the_denotation_within_the_gemm_bound():
    from falsification.fusion_tests import conv_graph
    from native.cudnn import cudnn_missing
    from native.ir import agree

    if cudnn_missing():
        pytest.skip(cudnn_missing())
    for n, c, h, k, r in ((2, 3, 7, 4, 3), (1, 16, 9, 8, 1), (3, 8, 12, 5, 5)):
        g, p = conv_graph(n, c, h, h + 1, k, r, seed=n + c)
        x = np.random.default_rng(r).standard_normal((n, c, h, h + 1)).astype(np.float32)
        prog = nf.compile_subgraph(g, payload=p)
        assert [s.kind for s in prog.steps] == ["cudnn"], prog
        got = nf.run_program(g, p, [x], "cuda")[1]
        want = denote_all(g, p, [x]).value[1]
        assert np.all(agree(g[1], [x], p.get(1), got, want)), (n, c, h, k, r)
        direct = nf.run_program(g, p, [x], "cuda", conv="direct")[1]
        assert sf.same_bits(direct, want)  # the bitwise reference, when asked


@needs_cuda
@pytest.mark.cuda
def test_cudnn_step_gives_the_same_bits_on_torchs_stream_and_on_another_cupy_stream():
    # On CuPy's null stream torch already launches there (the direct path: no stream switch, DLPack as is); on
    # another CuPy stream torch is switched to it. Deterministic cuDNN (SETTINGS): the same bits either way.
    import cupy

    from falsification.fusion_tests import conv_graph
    from native import cudnn

    if cudnn.cudnn_missing():
        pytest.skip(cudnn.cudnn_missing())
    g, p = conv_graph(2, 8, 12, 13, 5, 3, seed=4)
    x = cupy.asarray(np.random.default_rng(4).standard_normal((2, 8, 12, 13)).astype(np.float32))
    ex = nf.CUDAExecutor(nf.compile_subgraph(g, payload=p), p, "cuda")
    dev = cupy.cuda.runtime.getDevice()
    assert cudnn._torch_stream(dev) == cupy.cuda.get_current_stream().ptr  # the direct path
    on_null = cupy.asnumpy(ex.run([x])[1])
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        assert cudnn._torch_stream(dev) != side.ptr  # the switched path
        on_side = ex.run([x])[1]
        side.synchronize()
    assert sf.same_bits(on_null, cupy.asnumpy(on_side))
    want = denote_all(g, p, [cupy.asnumpy(x)]).value[1]
    from native.ir import agree

    assert np.all(agree(g[1], [cupy.asnumpy(x)], p.get(1), on_null, want))
