"""The compiled-code audit: shipped builds are clean, and each rule catches a planted build on the CPU."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from native import elementwise as ew
from native import nvrtc as routes
from native import tritonrt
from native.builds import PROMISES, Build, all_builds, families
from obligations.contract import load_contract
from obligations.engines import Job, get_engine

ptx = pytest.importorskip("native.ptx")
try:
    ptx.nvrtc_version()
except ptx.PtxUnavailable as exc:  # pragma: no cover - CI installs the audit extra
    pytest.skip(str(exc), allow_module_level=True)

from obligations.audit import RULES, audit_build, instructions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _elementwise(name: str, variant: str | None = None, **changes) -> Build:
    src, fn = ew.kernel_source(name, variant)
    return dataclasses.replace(Build("elementwise", f"{name}-planted", src, fn, "nvrtc-ieee", index_bits=64), **changes)


def _rules_broken(build: Build) -> set[str]:
    return {f.rule for f in audit_build(build)[1]}


def test_every_shipped_build_keeps_its_routes_promise():
    builds = all_builds()
    assert {b.family for b in builds} == set(families()) >= {"elementwise", "reductions", "rng", "transfer"}
    # Triton's builds where triton is installed (test_triton audits them with their contracts; skipped without it)
    builds = [b for b in builds if b.toolchain == "nvrtc" or tritonrt.triton_unavailable() is None]
    findings = [f for b in builds for f in audit_build(b)[1]]
    assert not findings, [f.to_json() for f in findings[:3]]


def test_every_route_states_its_promise():
    assert set(routes.ROUTES) <= set(PROMISES)


def test_planted_int32_index_under_an_int64_plan_is_caught():
    # The source's index type came from the template default, not from the plan that Z3 proved.
    assert _rules_broken(_elementwise("add", "wrap32", index_bits=64)) == {"index-64"}
    assert _rules_broken(_elementwise("add", "wrap32", index_bits=32)) == set()


def test_planted_approximate_division_in_an_exact_kernel_is_caught():
    src, fn = ew.kernel_source("div")
    planted = _elementwise("div", source=src.replace("r = a / b;", "r = __fdividef(a, b);"))
    assert "__fdividef" in planted.source
    assert "no-approx" in _rules_broken(planted)


def test_planted_route_drift_to_contraction_is_caught(monkeypatch):
    """The nvrtc-ieee route compiled with -fmad=true: the elementwise contract's audit item fails."""
    drifted = dataclasses.replace(routes.ROUTES["nvrtc-ieee"], flags=routes.CompileFlags(ftz=False, fmad=True))
    monkeypatch.setitem(routes.ROUTES, "nvrtc-ieee", drifted)
    broken = {f.build: f.rule for b in all_builds("elementwise") for f in audit_build(b)[1]}
    # muladd is a*b+c in plain source (axpy pins its product with __fmul_rn and stays clean).
    assert broken == {"muladd@nvrtc-ieee": "no-contraction"}, broken


def test_planted_route_drift_to_flushing_is_caught(monkeypatch):
    drifted = dataclasses.replace(routes.ROUTES["nvrtc-ieee"], flags=routes.CompileFlags(ftz=True, fmad=False))
    monkeypatch.setitem(routes.ROUTES, "nvrtc-ieee", drifted)
    assert "no-ftz" in _rules_broken(_elementwise("add"))


def test_each_rule_is_caught_by_some_planted_build():
    div_src = ew.kernel_source("div")[0]
    planted = {
        "index-64": _elementwise("add", "wrap32"),
        "no-approx": _elementwise("div", source=div_src.replace("r = a / b;", "r = __fdividef(a, b);")),
        # Compiled by the fmad/ftz routes (their options) but claimed as nvrtc-ieee builds (its promise).
        "no-contraction": _elementwise("muladd", route="nvrtc-fmad"),
        "no-ftz": _elementwise("add", route="nvrtc-ftz"),
        # The float16 attention forward (mma.sync) without its tensor-core declaration.
        "no-mma": dataclasses.replace(
            next(b for b in all_builds("attention") if b.name == "fwd16-hd64"), tensor_cores=False
        ),
    }
    assert set(planted) == set(RULES)
    for rule, build in planted.items():
        options = routes.get_route(build.route).flags.options()
        insns = instructions(ptx.compile_ptx(build.source, options))
        claimed = dataclasses.replace(build, route="nvrtc-ieee")
        rule_obj = RULES[rule]
        assert rule_obj.applies(claimed, routes.get_route("nvrtc-ieee")), rule
        assert any(rule_obj.breaks(op, claimed) for _, op, _ in insns), rule


def test_instructions_strip_predicates_and_skip_directives():
    text = ".version 9.0\n//c\n$L__BB0_1:\n\t@%p1 bra $L__BB0_2;\n\tadd.rn.f32 \t%f3, %f2, %f1;\n}"
    assert [op for _, op, _ in instructions(text)] == ["bra", "add.rn.f32"]


def test_audit_engine_reports_findings_as_a_violation_with_ptx_lines(monkeypatch, tmp_path):
    contract = load_contract(ROOT / "contracts" / "reductions-v1.yaml", check=False)
    item = {"id": "AUDIT", "kind": "obligation", "method": "audit", "params": {"family": "elementwise"}}
    clean = get_engine("audit").discharge(Job(contract, item))
    assert clean.status.value == "passed" and clean.evidence.cases == len(all_builds("elementwise"))
    assert clean.evidence.rules_applied["index-64"] > 0
    drifted = dataclasses.replace(routes.ROUTES["nvrtc-ieee"], flags=routes.CompileFlags(ftz=False, fmad=True))
    monkeypatch.setitem(routes.ROUTES, "nvrtc-ieee", drifted)
    out = get_engine("audit").discharge(Job(contract, item))
    assert out.status.value == "violated"
    first = out.counterexample["findings"][0]
    assert first["rule"] == "no-contraction" and any("fma.rn.f32" in line for line in first["ptx"])


def test_audit_without_nvrtc_is_skipped_not_passed(monkeypatch):
    # the NVRTC toolchain asks native.ptx for its version at each audit: patched there, every audit sees it
    monkeypatch.setattr(ptx, "nvrtc_version", lambda: (_ for _ in ()).throw(ptx.PtxUnavailable("no NVRTC")))
    contract = load_contract(ROOT / "contracts" / "reductions-v1.yaml", check=False)
    out = get_engine("audit").discharge(Job(contract, {"id": "A", "method": "audit"}))
    assert out.status.value == "skipped" and "NVRTC" in out.reason


@pytest.mark.parametrize("family", ["rng", "transfer"])
def test_rng_and_transfer_sources_read_their_index_type_from_the_plan(family):
    import dataclasses as dc

    from native import rng, transfer

    if family == "rng":
        plan = rng.rng_plan(1, 1)
        src64, fn = rng.kernel_source(plan=plan)
        src32, _ = rng.kernel_source(plan=dc.replace(plan, index_bits=32))
    else:
        plan = transfer.transfer_plan(1, 8, 4)
        src64, fn = transfer.kernel_source("binary32", plan=plan)
        src32, _ = transfer.kernel_source("binary32", plan=dc.replace(plan, index_bits=32))
    assert "for (long long i = (long long)blockIdx.x" in src64 and "for (int i = (int)blockIdx.x" in src32
    clean = Build(family, "x", src64, fn, "nvrtc-ieee", index_bits=plan.index_bits)
    assert "index-64" in audit_build(clean)[0] and _rules_broken(clean) == set()
    # a source whose index type is not the one the plan proved is caught by the audit
    assert "index-64" in _rules_broken(dataclasses.replace(clean, source=src32))


def _atomic_build(**changes) -> Build:
    from native import reductions as red

    src, fn = red.tree_source("atomic", red.TREE_ORDERS[sorted(red.TREE_ORDERS)[0]])
    return Build("reductions", "atomic-planted", src, fn, red.ROUTE, **changes)


def test_planted_undeclared_f32_atomic_add_is_caught_in_ptx():
    # PTX writes the flushing atomic add without .ftz (red/atom .add.f32): only the declaration excuses it.
    assert _rules_broken(_atomic_build()) == {"no-ftz"}
    assert _rules_broken(_atomic_build(flushes_atomics=True)) == set()


_SASS = ptx.nvdisasm_path() is not None


@pytest.mark.skipif(not _SASS, reason="no nvdisasm here (the nvidia-cuda-nvdisasm wheel of the audit extra)")
def test_planted_undeclared_f32_atomic_add_is_caught_in_sass_and_the_mix_is_recorded():
    from obligations.audit import SASS_RULES, audit_sass

    applied, found, mix = audit_sass(_atomic_build())
    assert set(applied) == set(SASS_RULES) and [f.rule for f in found] == ["sass-atomic-ftz"]
    assert any("RED" in text and ".FTZ" in text for _, text in found[0].lines)
    _, found, mix = audit_sass(_atomic_build(flushes_atomics=True))
    assert found == [] and mix["FTZ"] >= 1  # the flush is still recorded in the opcode mix


def test_sass_instructions_strip_predicates():
    from obligations.audit import sass_instructions

    text = "  /*0040*/   @!P0 BRA `(.L_x_0) ;\n  /*00a0*/   RED.E.ADD.F32.FTZ.RN.STRONG.GPU [R2], R5 ;"
    assert [op for _, op, _ in sass_instructions(text)] == ["BRA", "RED.E.ADD.F32.FTZ.RN.STRONG.GPU"]


def test_audit_engine_records_sass_on_a_device_run_or_says_why_not(monkeypatch):
    contract = load_contract(ROOT / "contracts" / "reductions-v1.yaml", check=False)
    item = {"id": "AUDIT", "kind": "obligation", "method": "audit", "params": {"family": "reductions"}}
    monkeypatch.delenv("KC_AUDIT_SASS", raising=False)
    host = get_engine("audit").discharge(Job(contract, item))
    assert host.status.value == "passed" and "device run" in host.evidence.sass["not_run"]
    if _SASS:
        monkeypatch.setenv("KC_AUDIT_SASS", "1")
        both = get_engine("audit").discharge(Job(contract, item))
        assert both.status.value == "passed" and both.evidence.sass["builds"] == len(all_builds("reductions"))
        assert both.evidence.sass["rules_applied"]["sass-atomic-ftz"] == len(all_builds("reductions"))


def test_the_opcode_mix_counts_tensor_core_instructions_not_register_moves():
    from obligations.audit import _MIX

    assert _MIX["HMMA"]("HMMA.16816.F32") and _MIX["HMMA"]("HGMMA.64x128x16.F32")
    assert not _MIX["HMMA"]("HFMA2.MMA")  # a register move on the FMA pipe


# -- the proof cache: a passed audit is reused while everything it depends on is unchanged ----------------------


@pytest.fixture
def audit_cache(tmp_path, monkeypatch):
    """An empty proof cache of the test's own, and a count of the builds compiled (audit_build calls)."""
    from obligations import audit, proofcache

    monkeypatch.setenv(proofcache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(proofcache.CACHE_ENV, raising=False)
    monkeypatch.delenv("KC_AUDIT_SASS", raising=False)
    compiled = []
    real = audit.audit_build
    monkeypatch.setattr(audit, "audit_build", lambda b, rules=None: compiled.append(b.name) or real(b, rules))
    return compiled


def _audit_rng():
    contract = load_contract(ROOT / "contracts" / "rng-splitmix64-v1.yaml", check=False)
    item = {"id": "AUDIT", "kind": "obligation", "method": "audit", "params": {"family": "rng"}}
    return get_engine("audit").discharge(Job(contract, item))


def _without_cache_fields(ev) -> dict:
    return {k: v for k, v in ev.to_json().items() if k not in ("cache", "cache_key")}


@pytest.mark.parametrize(
    "sass", [False, pytest.param(True, marks=pytest.mark.skipif(not _SASS, reason="no nvdisasm here"))]
)
def test_a_passed_audit_is_reused_from_the_proof_cache_with_the_same_evidence(audit_cache, monkeypatch, sass):
    from obligations.console import _evidence_line
    from obligations.reporting.evidence import evidence_facts
    from obligations.reporting.model import describe_claim

    if sass:
        monkeypatch.setenv("KC_AUDIT_SASS", "1")
    first = _audit_rng()
    assert first.status.value == "passed" and first.evidence.cache == "miss" and audit_cache
    audit_cache.clear()
    again = _audit_rng()
    assert again.status.value == "passed" and again.evidence.cache == "hit" and not audit_cache  # nothing compiled
    assert again.evidence.cache_key == first.evidence.cache_key
    assert _without_cache_fields(again.evidence) == _without_cache_fields(first.evidence)
    assert ("not_run" in first.evidence.sass) != sass
    # the same facts in the same order (a stored entry's keys are sorted; the report reads the opcode mix in order)
    facts = [evidence_facts(_without_cache_fields(e)) for e in (first.evidence, again.evidence)]
    assert facts[0] == facts[1]
    # the reports tell the reused audit from a fresh one, as they do a reused proof
    shown = {"status": "passed", "claim": "tested", "evidence": again.evidence.to_json()}
    assert "reused from the proof cache" in describe_claim(shown) and "(proof cache)" in _evidence_line(shown)
    fresh = {"status": "passed", "claim": "tested", "evidence": first.evidence.to_json()}
    assert "proof cache" not in describe_claim(fresh) + _evidence_line(fresh)


def _changed_source(monkeypatch):
    from native import builds

    planted = [dataclasses.replace(b, source=b.source + "\n// changed\n") for b in all_builds("rng")]
    monkeypatch.setitem(builds._ENUMERATORS, "rng", lambda: iter(planted))


def _changed_option(monkeypatch):
    drifted = dataclasses.replace(routes.ROUTES["nvrtc-ieee"], flags=routes.CompileFlags(prec_sqrt=False))
    monkeypatch.setitem(routes.ROUTES, "nvrtc-ieee", drifted)


def _changed_rule(monkeypatch):
    rule = RULES["no-mma"]
    monkeypatch.setitem(RULES, "no-mma", dataclasses.replace(rule, breaks=lambda op, b: op.startswith("mma.")))


def _changed_compiler(monkeypatch):
    monkeypatch.setattr(ptx, "nvrtc_version", lambda: "99.9")


@pytest.mark.parametrize("change", [_changed_source, _changed_option, _changed_rule, _changed_compiler])
def test_a_changed_source_option_rule_or_compiler_version_compiles_again(audit_cache, monkeypatch, change):
    first = _audit_rng()
    change(monkeypatch)
    audit_cache.clear()
    out = _audit_rng()
    assert out.evidence.cache == "miss" and out.evidence.cache_key != first.evidence.cache_key and audit_cache


def test_no_proof_cache_compiles_every_audit_again(audit_cache, monkeypatch):
    from obligations import proofcache

    _audit_rng()
    monkeypatch.setenv(proofcache.CACHE_ENV, "0")
    audit_cache.clear()
    out = _audit_rng()
    assert out.status.value == "passed" and "cache" not in out.evidence.to_json() and audit_cache


def test_a_planted_audit_finding_is_never_cached(audit_cache, monkeypatch, tmp_path):
    drifted = dataclasses.replace(routes.ROUTES["nvrtc-ieee"], flags=routes.CompileFlags(ftz=True))
    monkeypatch.setitem(routes.ROUTES, "nvrtc-ieee", drifted)
    for _ in range(2):
        audit_cache.clear()
        out = _audit_rng()
        assert out.status.value == "violated" and out.evidence.cache == "miss" and audit_cache
    assert not list((tmp_path / "cache").rglob("*.json"))


def test_the_key_names_the_sass_level_and_its_disassembler(monkeypatch):
    from obligations import audit

    builds = all_builds("rng")
    host = audit.audit_cache_parts({"method": "audit"}, "rng", builds, "13.0", sass=False)
    monkeypatch.setattr(audit, "nvdisasm_identity", lambda: "nvdisasm A")
    device = audit.audit_cache_parts({"method": "audit"}, "rng", builds, "13.0", sass=True)
    assert host["sass"] is None and device["sass"]["nvdisasm"] == "nvdisasm A"
    assert set(device["rules"]) - set(host["rules"]) == {f"sass:{r}" for r in audit.SASS_RULES}
    monkeypatch.setattr(audit, "nvdisasm_identity", lambda: "nvdisasm B")
    other = audit.audit_cache_parts({"method": "audit"}, "rng", builds, "13.0", sass=True)
    assert other["sass"] != device["sass"]


def test_a_triton_builds_key_reads_its_kernels_sources_without_importing_triton(tmp_path, monkeypatch):
    # a kernel module beside another, reading a constant from a helper module of another package
    for pkg in ("kc_planted_kernels", "kc_planted_helpers"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "kc_planted_kernels" / "k.py").write_text("from kc_planted_helpers.consts import X\nimport triton\n")
    (tmp_path / "kc_planted_kernels" / "other.py").write_text("Y = 1\n")
    (tmp_path / "kc_planted_helpers" / "consts.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    build = tritonrt.triton_build("t", "k", "kc_planted_kernels.k:kernel", {"x": "*fp32"}, {"BLOCK_SIZE": 64})

    def key_after(path: str, text: str) -> dict:
        (tmp_path / path).write_text(text)
        tritonrt._sources_digest.cache_clear()
        return tritonrt._inputs(build)

    before = tritonrt._inputs(build)
    assert key_after("kc_planted_kernels/other.py", "Y = 2\n") == before  # a kernel beside it: not its source
    imported = key_after("kc_planted_helpers/consts.py", "X = 2\n")
    assert imported["kernel_sources"] != before["kernel_sources"] and imported["options"] == before["options"]
    assert key_after("kc_planted_kernels/k.py", "from kc_planted_helpers.consts import X  # \n") != imported
    ieee = tritonrt._inputs(dataclasses.replace(build, route="triton-ieee"))
    assert ieee["options"] != before["options"]


def test_each_triton_contracts_audit_key_covers_its_own_kernel_only():
    # the two shipped kernels share a package: each audit key reads its own kernel (and the packages above it)
    for family, kernel in (("triton-softmax", "softmax"), ("triton-rmsnorm", "rmsnorm")):
        (build,) = {b.function for b in all_builds(family)}
        assert list(tritonrt.kernel_sources(build.partition(":")[0])) == [
            "native",
            "native.tritonk",
            f"native.tritonk.{kernel}",
        ]


def test_the_key_does_not_depend_on_what_the_process_ran_before(monkeypatch):
    # a worker audits after other items: NVRTC has compiled (and loaded its builtins), Triton's interpreter knob has
    # written TRITON_INTERPRET into the environment; the key of the same audit must not move
    from obligations import audit

    builds = all_builds("rng") + all_builds("triton-softmax") + all_builds("triton-rmsnorm")
    before = audit.audit_cache_parts({"method": "audit"}, "mixed", builds, "v", sass=False)
    ptx.compile_ptx(builds[0].source + "\n// another program\n", ("-ftz=false",))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert audit.audit_cache_parts({"method": "audit"}, "mixed", builds, "v", sass=False) == before
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/elsewhere/ptxas")  # a variable that changes Triton's code does
    assert audit.audit_cache_parts({"method": "audit"}, "mixed", builds, "v", sass=False) != before


def test_nvrtc_is_named_by_the_build_id_of_the_library_the_bindings_call(tmp_path):
    (tmp_path / "not-elf.so").write_bytes(b"MZ" + bytes(100))
    assert ptx._elf_build_id(str(tmp_path / "not-elf.so")) is None
    name = ptx.nvrtc_library()
    assert name is None or (name.startswith("build-id ") and len(name.split()[1]) >= 32) or "libnvrtc" in name


def test_the_audits_ptx_and_cubins_are_kept_by_everything_they_depend_on(monkeypatch, tmp_path):
    """NVRTC's output is a function of its library, the source, the options, the target and what is asked (PTX or
    CUBIN): kept on disk under all of them, so a later run reads what an earlier one compiled (EW-AUDIT's 140 builds
    took 3.5 s to compile on every run); another library recompiles; a library that cannot be named is never kept."""
    from native import ptx

    built: list[tuple] = []

    def fake_compile(source, options, arch, what):
        built.append((source, options, arch, what))
        return f"{what} of {source}\0".encode()

    monkeypatch.setattr(ptx, "_compile_now", fake_compile)
    monkeypatch.setenv("KC_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(ptx, "nvrtc_library", lambda: "build-id aa")
    first = ptx._compile("k", ("-fmad=false",), "compute_90", "PTX")
    assert ptx._compile("k", ("-fmad=false",), "compute_90", "PTX") == first == b"PTX of k\0" and len(built) == 1
    ptx._compile("k", ("-fmad=false",), "compute_90", "CUBIN")  # what is asked
    ptx._compile("k", ("-fmad=true",), "compute_90", "PTX")  # the options
    ptx._compile("k", ("-fmad=false",), "compute_80", "PTX")  # the target
    ptx._compile("k2", ("-fmad=false",), "compute_90", "PTX")  # the source
    assert len(built) == 5
    monkeypatch.setattr(ptx, "nvrtc_library", lambda: "build-id bb")  # another NVRTC: compiled again
    ptx._compile("k", ("-fmad=false",), "compute_90", "PTX")
    assert len(built) == 6
    monkeypatch.setattr(ptx, "nvrtc_library", lambda: None)  # unnamed: never read from the cache
    ptx._compile("k", ("-fmad=false",), "compute_90", "PTX")
    ptx._compile("k", ("-fmad=false",), "compute_90", "PTX")
    assert len(built) == 8


def test_the_sass_of_a_cubin_is_kept_by_the_nvdisasm_release_that_wrote_it(monkeypatch, tmp_path):
    """One nvdisasm process per build on every run (EW-AUDIT's 140) becomes one per build and release: a later run
    reads the text; another release disassembles again; a release that cannot be named is never kept."""
    import os
    import stat

    from native import ptx

    calls, version = tmp_path / "calls", tmp_path / "version"
    tool = tmp_path / "nvdisasm"
    tool.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then cat {version} || exit 3; exit 0; fi\n'
        f'echo "$2" >> {calls}\n'
        'echo "SASS of $(wc -c < "$2") bytes"\n'
    )
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("KC_NVDISASM", str(tool))
    monkeypatch.setenv("KC_KERNEL_CACHE", str(tmp_path / "cache"))

    def fresh_process():
        for fn in (ptx.nvdisasm_path, ptx._nvdisasm_version, ptx.disassemble):
            fn.cache_clear()

    def runs():
        return len(calls.read_text().splitlines()) if calls.exists() else 0

    version.write_text("nvdisasm release 13.0\n")
    fresh_process()
    first = ptx.disassemble(b"\x7fELF cubin")
    fresh_process()
    assert ptx.disassemble(b"\x7fELF cubin") == first == "SASS of 10 bytes\n" and runs() == 1
    ptx.disassemble(b"\x7fELF other")  # another cubin
    assert runs() == 2
    version.write_text("nvdisasm release 13.1\n")  # another release
    fresh_process()
    ptx.disassemble(b"\x7fELF cubin")
    assert runs() == 3
    os.remove(version)  # --version fails: nothing is kept
    fresh_process()
    ptx.disassemble(b"\x7fELF cubin")
    fresh_process()
    ptx.disassemble(b"\x7fELF cubin")
    assert runs() == 5
    fresh_process()
