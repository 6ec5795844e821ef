"""The compiled-code audit (method ``audit``): what each build's PTX and SASS do, against what its route promises.

Float flags are evidenced by the compiled code, not by the options we passed: every registered build
(:mod:`native.builds`) is compiled to PTX with NVRTC (on the CPU) and each rule that applies to it scans
the instructions. An offending instruction is a violation whose counterexample is the PTX lines.
Rules register by name; each says when it applies (from the route's flags and the build's declarations)
and which instructions break it.

On a device run (``--device cuda``, or ``KC_AUDIT_SASS=1``) the machine code is audited too: each build's
CUBIN for sm_90, disassembled by nvdisasm, is scanned by the SASS rules, and the evidence records both
levels (the SASS opcode mix included). SASS shows what PTX hides: an f32 atomic add is ``RED...F32.FTZ``.

A passed audit is a pure function of its inputs, so it goes into the proof cache (:mod:`obligations.proofcache`)
under the hash of them, computed without compiling: every build (source, function, route, declarations), its
route's promise and its toolchain's inputs (options, targets, the compiler library, a Triton kernel's package
text), the compilers' versions, whether SASS is audited and by which nvdisasm, the code of every rule and the
text of the modules that define the rules and toolchains, and the item's params. A finding is never stored: it
is compiled and found again on every run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from types import CodeType
from typing import Any

from native.builds import PROMISES, Build, Promise, ToolchainUnavailable, all_builds, toolchain
from native.nvrtc import Route
from native.ptx import ARCH, SASS_ARCH, SassUnavailable, disassemble, nvdisasm_identity
from obligations.core.evidence import AuditEvidence, evidence_from_json
from obligations.core.results import Outcome, error, passed, skipped, violated
from obligations.engines import Engine, Job, register_engine
from obligations.proofcache import cache_get, cache_key, cache_put, proof_settings, sources_digest

__all__ = [
    "PtxRule",
    "register_rule",
    "RULES",
    "SASS_RULES",
    "register_sass_rule",
    "instructions",
    "sass_instructions",
    "audit_build",
    "audit_sass",
    "Finding",
    "audit_cache_parts",
    "AuditEngine",
]


@dataclass(frozen=True)
class PtxRule:
    """A promise about compiled code: when it applies to a build, and which opcodes break it."""

    name: str
    promise: str
    applies: Callable[[Build, Route], bool]
    breaks: Callable[[str, Build], bool]


@dataclass(frozen=True)
class Finding:
    """One rule broken by one build: the offending PTX lines (1-based line numbers)."""

    build: str
    route: str
    rule: str
    promise: str
    lines: tuple[tuple[int, str], ...]

    def to_json(self) -> dict:
        """JSON counterexample: the build, the rule and up to 8 offending PTX lines."""
        return {
            "build": self.build,
            "route": self.route,
            "rule": self.rule,
            "promise": self.promise,
            "offending_lines": len(self.lines),
            "ptx": [f"{n}: {t}" for n, t in self.lines[:8]],
        }


RULES: dict[str, PtxRule] = {}


def _register(table: dict[str, PtxRule], rule: PtxRule, level: str) -> PtxRule:
    if rule.name in table:
        raise ValueError(f"{level} audit rule {rule.name!r} registered twice")
    table[rule.name] = rule
    return rule


def register_rule(rule: PtxRule) -> PtxRule:
    """Add a PTX rule by name (names are unique)."""
    return _register(RULES, rule, "PTX")


def _promise(route: Route) -> Promise:
    return PROMISES[route.name]


def _is_f32_atomic_add(op: str) -> bool:
    return op.startswith(("atom.", "red.")) and ".add" in op and op.endswith(".f32")


register_rule(
    PtxRule(
        "no-ftz",
        "f32 arithmetic keeps subnormals (no .ftz) where the route promises to keep them",
        lambda b, r: _promise(r).keeps_subnormals,
        # libdevice's approximate transcendentals use ex2/lg2.approx.ftz on range-reduced arguments. An f32 atomic
        # add flushes with no .ftz in its text (PTX ISA: atom/red .add.f32): only a build that declares it may.
        lambda op, b: (
            op not in b.declared
            and (
                (".ftz" in op and ".f32" in op and not (b.approximate and ".approx" in op))
                or (_is_f32_atomic_add(op) and not b.flushes_atomics)
            )
        ),
    )
)
register_rule(
    PtxRule(
        "no-contraction",
        "no fma.*.f32 where neither the route's promise nor the source asks for a fused operation",
        lambda b, r: not _promise(r).contracts and not b.fused and not b.approximate,
        lambda op, b: op.startswith("fma.") and op.endswith(".f32"),
    )
)
register_rule(
    PtxRule(
        "no-approx",
        "no approximate f32 division, square root, reciprocal or ex2/lg2/sin/cos unless the kernel is declared "
        "approximate (f64 .approx seeds inside libdevice's refined sequences are not results)",
        lambda b, r: not b.approximate and not _promise(r).approximates,
        lambda op, b: (".approx" in op or op.startswith("div.full")) and op.endswith(".f32") and op not in b.declared,
    )
)
register_rule(
    PtxRule(
        "index-64",
        "the grid-stride index is 64-bit where the launch plan proved int64 (no 32-bit index arithmetic)",
        lambda b, r: b.index_bits == 64 and b.toolchain == "nvrtc",
        # A signed 32-bit index enters 64-bit addressing by sign extension (cvt.s64.s32) and is formed with a 32-bit
        # mad (blockIdx.x * blockDim.x + threadIdx.x). mul.lo.s32 alone is not a sign: NVRTC's fast path for a
        # 64-bit / or % whose operands fit 32 bits computes the remainder with it.
        lambda op, b: op in ("cvt.s64.s32", "mad.lo.s32"),
    )
)

_SKIP = re.compile(r"^(//|\.|\{|\}|\)|\(|$|[$\w]+:)")


def instructions(ptx: str) -> list[tuple[int, str, str]]:
    """(line number, opcode, text) of each PTX instruction (predicates stripped, directives skipped)."""
    out = []
    for n, line in enumerate(ptx.splitlines(), 1):
        text = line.strip()
        if _SKIP.match(text):
            continue
        parts = text.split()
        if parts[0].startswith("@"):
            parts = parts[1:]
        if parts:
            out.append((n, parts[0].rstrip(";"), text))
    return out


def _apply_rules(
    build: Build, route: Route, insns: list[tuple[int, str, str]], rules: dict[str, PtxRule]
) -> tuple[list[str], list[Finding]]:
    """Every rule that applies to ``build``, run over its instructions: (rules applied, findings)."""
    applied, findings = [], []
    for rule in rules.values():
        if not rule.applies(build, route):
            continue
        applied.append(rule.name)
        bad = tuple((n, text) for n, op, text in insns if rule.breaks(op, build))
        if bad:
            findings.append(Finding(build.name, build.route, rule.name, rule.promise, bad))
    return applied, findings


def audit_build(build: Build, rules: dict[str, PtxRule] | None = None) -> tuple[list[str], list[Finding]]:
    """Compile one build to PTX (its toolchain's) and apply every rule that applies: (rules applied, findings)."""
    tc = toolchain(build.toolchain)
    return _apply_rules(build, tc.route(build.route), instructions(tc.ptx(build)), rules or RULES)


SASS_RULES: dict[str, PtxRule] = {}


def register_sass_rule(rule: PtxRule) -> PtxRule:
    """Add a SASS rule by name (the same shape as a PTX rule; ``breaks`` sees SASS opcodes)."""
    return _register(SASS_RULES, rule, "SASS")


register_rule(
    PtxRule(
        "no-mma",
        "no tensor-core product (mma, wmma, wgmma) unless the build declares tensor cores (its bound models them)",
        lambda b, r: True,
        lambda op, b: op.startswith(("mma.", "wmma.mma", "wgmma.mma")) and not b.tensor_cores,
    )
)
register_sass_rule(
    PtxRule(
        "sass-mma",
        "no tensor-core instruction (HMMA, IMMA, HGMMA, ...) unless the build declares tensor cores",
        lambda b, r: True,
        lambda op, b: ("MMA" in op.split(".")[0] or op.startswith("HGMMA")) and not b.tensor_cores,
    )
)
register_sass_rule(
    PtxRule(
        "sass-atomic-ftz",
        "no f32 atomic add (RED/ATOM .F32.FTZ: the hardware flushes subnormals) in a build that keeps subnormals, "
        "unless the build declares the flush and its contract models it",
        lambda b, r: _promise(r).keeps_subnormals,
        lambda op, b: op.startswith(("RED", "ATOM")) and ".F32" in op and ".FTZ" in op and not b.flushes_atomics,
    )
)

_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\b(.*?);")
# Opcode families recorded for every build (what the SASS shows beyond the rules: the compiler's own FTZ inside
# its IEEE division/square-root sequences, special-function units, tensor cores, double-precision arithmetic).
# (HFMA2.MMA is a register move on the FMA pipe, not a tensor-core instruction.)
_MIX = {"FTZ": lambda op: ".FTZ" in op, "MUFU": lambda op: op.startswith("MUFU")}
_MIX["HMMA"] = lambda op: "MMA" in op.split(".")[0]
_MIX["DFMA/DADD/DMUL"] = lambda op: op.startswith(("DFMA", "DADD", "DMUL"))


def sass_instructions(sass: str) -> list[tuple[int, str, str]]:
    """(line number, opcode, text) of each SASS instruction in nvdisasm output (predicates stripped)."""
    out = []
    for n, line in enumerate(sass.splitlines(), 1):
        m = _SASS_LINE.search(line)
        if m:
            out.append((n, m.group(1), line.strip()))
    return out


def audit_sass(build: Build, rules: dict[str, PtxRule] | None = None) -> tuple[list[str], list[Finding], Counter]:
    """Compile one build to sm_90 machine code, disassemble it and apply the SASS rules: (applied, findings, mix)."""
    tc = toolchain(build.toolchain)
    route = tc.route(build.route)
    insns = sass_instructions(disassemble(tc.cubin(build)))
    mix = Counter({k: sum(f(op) for _, op, _ in insns) for k, f in _MIX.items()})
    return (*_apply_rules(build, route, insns, rules or SASS_RULES), mix)


def _sass_wanted(job: Job) -> bool:
    return job.device == "cuda" or os.environ.get("KC_AUDIT_SASS") == "1"


def _audit_sass_all(builds: list[Build]) -> tuple[dict, list[Finding]]:
    """SASS audit of ``builds`` in parallel threads: (evidence record, findings)."""
    t0 = time.perf_counter()
    per_rule: dict[str, int] = {}
    mix: Counter = Counter()
    findings: list[Finding] = []
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        for applied, found, m in pool.map(audit_sass, builds):
            for r in applied:
                per_rule[r] = per_rule.get(r, 0) + 1
            findings += found
            mix += m
    record = {
        "arch": SASS_ARCH,
        "builds": len(builds),
        "rules_applied": per_rule,
        "findings": len(findings),
        "opcodes": {k: mix.get(k, 0) for k in _MIX},
        "seconds": round(time.perf_counter() - t0, 3),
    }
    return record, findings


def _const_text(value: Any) -> str:
    """A code constant as text that is the same in every process (frozensets sorted, nested code spelled out)."""
    if isinstance(value, CodeType):
        return _code_text(value)
    if isinstance(value, frozenset):
        return "frozenset(" + ",".join(sorted(map(_const_text, value))) + ")"
    if isinstance(value, tuple):
        return "(" + ",".join(map(_const_text, value)) + ")"
    return repr(value)


def _code_text(code: CodeType) -> str:
    # not marshal.dumps: its bytes mark objects referenced more than once, and reference counts differ per process
    parts = (code.co_code.hex(), _const_text(code.co_consts), code.co_names, code.co_varnames, code.co_freevars)
    return repr(parts)


def _code_digest(fn: Callable[..., Any]) -> str | None:
    """A function's compiled code and the values it closes over (None: not a plain function, not keyable)."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, CodeType):
        return None
    cells = [_const_text(c.cell_contents) for c in (getattr(fn, "__closure__", None) or ())]
    return hashlib.sha256((_code_text(code) + repr(cells)).encode()).hexdigest()


def _module_file(fn: Callable[..., Any]) -> Path | None:
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    where = getattr(module, "__file__", None)
    return Path(where) if where else None


def _build_digest(build: Build, inputs: Mapping[str, Any]) -> str:
    """SHA-256 of a build's fields, its route's promise and its toolchain's inputs (canonical JSON)."""
    fields = {f.name: getattr(build, f.name) for f in dataclasses.fields(build)}
    fields["declared"] = sorted(build.declared)
    data = {"build": fields, "promise": repr(PROMISES.get(build.route)), "inputs": inputs}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=repr).encode()).hexdigest()


def _mix_in_order(sass: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A stored SASS record with its opcode mix in the order a fresh audit gives it (entries are stored sorted)."""
    if not sass or not isinstance(sass.get("opcodes"), Mapping):
        return sass
    return {**sass, "opcodes": {k: sass["opcodes"][k] for k in _MIX if k in sass["opcodes"]}}


def audit_cache_parts(
    item: Mapping[str, Any], family: str, builds: list[Build], version: str, sass: bool
) -> dict[str, Any] | None:
    """What an audit's verdict depends on, computed without compiling (the proof-cache key's parts), or None
    where something cannot be named (a toolchain without ``inputs``, a rule that is not a plain function)."""
    functions: list[Callable[..., Any]] = []
    per_build = []
    for b in builds:
        tc = toolchain(b.toolchain)
        if tc.inputs is None:
            return None
        functions += [tc.version, tc.route, tc.ptx, tc.cubin, tc.inputs]
        per_build.append(_build_digest(b, tc.inputs(b)))
    rules = {}
    for level, table in (("ptx", RULES), ("sass", SASS_RULES if sass else {})):
        for name, rule in sorted(table.items()):
            codes = [_code_digest(rule.applies), _code_digest(rule.breaks)]
            if None in codes:
                return None
            rules[f"{level}:{name}"] = [rule.promise, *codes]
            functions += [rule.applies, rule.breaks]
    # the modules that define the rules, the toolchains and this audit (helpers the rules call, the parsers)
    modules = {p for p in map(_module_file, functions) if p is not None} | {Path(__file__)}
    return {
        "item": {k: v for k, v in item.items() if k not in ("id", "location")},
        "family": family,
        "compilers": version,
        "builds": per_build,
        "rules": rules,
        "sources": sources_digest(sorted(modules)),
        "sass": {"arch": SASS_ARCH, "nvdisasm": nvdisasm_identity()} if sass else None,
    }


@register_engine
class AuditEngine(Engine):
    """Audit every build of the item's family (``params.family``, default the contract's)."""

    name = "audit"

    def discharge(self, job: Job) -> Outcome:
        """Compile and audit the family's builds; violated with the offending PTX lines on any finding."""
        family = (job.item.get("params") or {}).get("family") or job.contract.data["family"]
        t0 = time.perf_counter()
        try:
            builds = all_builds(family)
        except KeyError:
            return error(f"no builds registered for family {family!r}")
        try:  # every compiler the family's builds name must run here, else nothing about their code can be said
            version = ", ".join(
                f"{name} {toolchain(name).version()}" if name != "nvrtc" else toolchain(name).version()
                for name in dict.fromkeys(b.toolchain for b in builds)
            )
        except ToolchainUnavailable as exc:
            return skipped(str(exc))
        settings = proof_settings()
        key = None
        if settings.cache:
            parts = audit_cache_parts(job.item, family, builds, version, _sass_wanted(job))
            key = cache_key("audit", parts) if parts is not None else None
            hit = cache_get(settings, key) if key else None
            if hit is not None and hit.get("status") == "passed":
                reused = evidence_from_json(hit.get("evidence"))
                if isinstance(reused, AuditEvidence):
                    return passed(replace(reused, sass=_mix_in_order(reused.sass), cache="hit", cache_key=key))
        out = self._audit(job, family, builds, version, t0)
        if key is not None and isinstance(out.evidence, AuditEvidence):
            out = replace(out, evidence=replace(out.evidence, cache="miss", cache_key=key))
            if out.status.value == "passed":  # a finding is never stored: it is compiled and found again
                cache_put(settings, key, {"status": "passed", "evidence": out.evidence.to_json()})
        return out

    def _audit(self, job: Job, family: str, builds: list[Build], version: str, t0: float) -> Outcome:
        """Compile every build and apply the rules (PTX, and SASS where wanted)."""
        per_rule: dict[str, int] = {}
        findings: list[Finding] = []
        for b in builds:
            try:
                applied, found = audit_build(b)
            except RuntimeError as exc:  # the build does not compile: nothing about its code can be said
                return error(f"build {b.name} does not compile: {exc}")
            for r in applied:
                per_rule[r] = per_rule.get(r, 0) + 1
            findings += found
        if _sass_wanted(job):
            try:
                sass, sass_findings = _audit_sass_all(builds)
                findings += sass_findings
            except SassUnavailable as exc:
                sass = {"not_run": str(exc)}
            except RuntimeError as exc:
                return error(f"SASS audit failed: {exc}")
        else:
            sass = {"not_run": "the SASS audit runs on a device run (--device cuda) or with KC_AUDIT_SASS=1"}
        evidence = AuditEvidence(
            cases=len(builds),
            family=family,
            nvrtc=version,
            arch=ARCH,
            rules_applied=per_rule,
            findings=len(findings),
            audit_seconds=round(time.perf_counter() - t0, 3),
            sass=sass,
        )
        if findings:
            first = findings[0]
            return violated(
                {"findings": [f.to_json() for f in findings[:10]]},
                f"{len(findings)} finding(s); first: {first.build} breaks {first.rule} ({first.lines[0][1]})",
                evidence,
            )
        return passed(evidence)
