"""The compiled-code audit (method ``audit``): what each build's PTX does, against what its route promises.

Float flags are evidenced by the compiled code, not by the options we passed: every registered build
(:mod:`native.builds`) is compiled to PTX with NVRTC (on the CPU) and each rule that applies to it scans
the instructions. An offending instruction is a violation whose counterexample is the PTX lines.
Rules register by name; each says when it applies (from the route's flags and the build's declarations)
and which instructions break it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from native.builds import PROMISES, Build, Promise, all_builds
from native.nvrtc import Route, get_route
from native.ptx import ARCH, PtxUnavailable, compile_ptx, nvrtc_version
from obligations.core.evidence import AuditEvidence
from obligations.core.results import Outcome, error, passed, skipped, violated
from obligations.engines import Engine, Job, register_engine

__all__ = ["PtxRule", "register_rule", "RULES", "instructions", "audit_build", "Finding", "AuditEngine"]


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


def register_rule(rule: PtxRule) -> PtxRule:
    """Add a rule by name (names are unique)."""
    if rule.name in RULES:
        raise ValueError(f"audit rule {rule.name!r} registered twice")
    RULES[rule.name] = rule
    return rule


def _promise(route: Route) -> Promise:
    return PROMISES[route.name]


register_rule(
    PtxRule(
        "no-ftz",
        "f32 arithmetic keeps subnormals (no .ftz) where the route promises to keep them",
        lambda b, r: _promise(r).keeps_subnormals,
        # libdevice's approximate transcendentals use ex2/lg2.approx.ftz on range-reduced arguments.
        lambda op, b: ".ftz" in op and ".f32" in op and not (b.approximate and ".approx" in op),
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
        lambda op, b: (".approx" in op or op.startswith("div.full")) and op.endswith(".f32"),
    )
)
register_rule(
    PtxRule(
        "index-64",
        "the grid-stride index is 64-bit where the launch plan proved int64 (no 32-bit index arithmetic)",
        lambda b, r: b.index_bits == 64,
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


def audit_build(build: Build, rules: dict[str, PtxRule] | None = None) -> tuple[list[str], list[Finding]]:
    """Compile one build to PTX and apply every rule that applies: (rules applied, findings)."""
    route = get_route(build.route)
    options = route.flags.options() if route.flags else ("-ftz=true",)
    insns = instructions(compile_ptx(build.source, options))
    applied, findings = [], []
    for rule in (rules or RULES).values():
        if not rule.applies(build, route):
            continue
        applied.append(rule.name)
        bad = tuple((n, text) for n, op, text in insns if rule.breaks(op, build))
        if bad:
            findings.append(Finding(build.name, build.route, rule.name, rule.promise, bad))
    return applied, findings


@register_engine
class AuditEngine(Engine):
    """Audit every build of the item's family (``params.family``, default the contract's)."""

    name = "audit"

    def discharge(self, job: Job) -> Outcome:
        """Compile and audit the family's builds; violated with the offending PTX lines on any finding."""
        family = (job.item.get("params") or {}).get("family") or job.contract.data["family"]
        t0 = time.perf_counter()
        try:
            version = nvrtc_version()
        except PtxUnavailable as exc:
            return skipped(str(exc))
        try:
            builds = all_builds(family)
        except KeyError:
            return error(f"no builds registered for family {family!r}")
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
        evidence = AuditEvidence(
            cases=len(builds),
            family=family,
            nvrtc=version,
            arch=ARCH,
            rules_applied=per_rule,
            findings=len(findings),
            audit_seconds=round(time.perf_counter() - t0, 3),
        )
        if findings:
            first = findings[0]
            return violated(
                {"findings": [f.to_json() for f in findings[:10]]},
                f"{len(findings)} finding(s); first: {first.build} breaks {first.rule} ({first.lines[0][1]})",
                evidence,
            )
        return passed(evidence)
