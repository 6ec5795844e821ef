"""The fusion backend: graph -> partition -> steps (cuBLAS, fused chains, reductions, aliases) -> program -> run.

``partition(graph, is_supported)`` splits the nodes (id order is topological) into maximal runs of device-
supported and host-fallback nodes; ``analyze_subgraph`` turns a device part into steps by the greedy chain rule
of :mod:`spec.fusion` (walk ids in order; an elementwise op joins the chain of its primary parent when that
parent has one consumer, is no output and has its shape; everything else is a barrier); ``compile_subgraph``
generates one kernel per chain (:mod:`native.fusion_codegen`), plans the intermediates' buffers by liveness and
returns a printable :class:`CUDAProgram`. :class:`CUDAExecutor` binds inputs and parameters, pre-builds the
dispatch table once and runs the steps in order: fused chains through the shared :class:`KernelCache`
(NVRTC, route ``nvrtc-ieee``) or their host model, GEMM-shaped and reduction nodes through the unfused
reference executor's kernels (``native.ir.run_node``: ``native.gemm``'s guarded GEMM, ``native.reductions``),
aliases as views, and host-fallback nodes by the denotation. conv2d nodes are ``cudnn`` steps (cuDNN through
:mod:`native.cudnn`, within the im2col GEMM bound) where cuDNN can run, else ``cublas`` steps on the direct
kernel (bitwise): ``compile_subgraph(conv=...)``, :func:`conv_route`. Before the chains, :data:`PATTERNS`
(masked softmax, RMSNorm's six ops) become ``pattern`` steps, and rmsnorm, RoPE and embedding run the
pre-written kernels of :mod:`native.fusion_kernels`. ``storage="float16"`` stores every value as binary16, each
op rounding to it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from native import fusion_codegen as cg
from native import fusion_kernels as fk
from native.builds import Build, register_builds
from native.ir import EXECUTORS, run_node
from native.nvrtc import compile_function, get_route
from obligations.core.device import array_module, resolve_device, to_host
from spec import fusion as sf
from spec.ir.checks import node_attrs
from spec.ir.denote import bits, eval_node, floats, normalise_inputs, rope_tables
from spec.ir.graph import Graph, GraphBuilder, Payload
from spec.ir.ops import get_op

__all__ = [
    "Part",
    "PartitionPlan",
    "chain4_graph",
    "default_supported",
    "partition",
    "analyze_subgraph",
    "Buffer",
    "BufferPlan",
    "buffer_requests",
    "plan_buffers",
    "PLANNERS",
    "planner_violations",
    "CUDAProgram",
    "compile_subgraph",
    "CONV_ROUTES",
    "conv_route",
    "PREWRITTEN",
    "CacheKey",
    "full_key",
    "KEYS",
    "KernelCache",
    "KERNEL_CACHE",
    "device_arch",
    "CUDAExecutor",
    "run_program",
    "example_graphs",
    "fp16_example_graphs",
    "PatternMatch",
    "PATTERNS",
    "match_patterns",
    "SPECIAL_OPS",
    "STORAGES",
    "program_outputs",
]

_STEP_OF_CATEGORY = {
    sf.ANCHOR_BLAS: "cublas",
    sf.REDUCTION: "reduction",
    sf.SHAPE_ALIAS: "alias",
    sf.SPECIAL: "special",
}


# attention: one SPECIAL node, a barrier; in a fused program it is evaluated by the denotation (host fallback, as every
# special op outside SPECIAL_OPS), while the unfused executor (native.ir) runs it on native.attention's kernels.
sf.register_category(sf.SPECIAL, "attention")

# pre-written kernel -> (source, function): the IR ops rmsnorm, rope, embedding and the masked-softmax pattern
PREWRITTEN: dict[str, tuple[str, str]] = dict(fk.SOURCES)
SPECIAL_OPS = ("rope", "embedding")  # SpecialKernelSteps on the device
STORAGES: dict[str, Any] = {"float32": np.float32, "float16": np.float16}


def default_supported(kind: str) -> bool:
    """Device-supported ops: bound sources, fusable elementwise ops, pre-written kernels and ops the unfused
    executor runs."""
    return (
        kind in sf.BOUND_OPS
        or cg.fusable(kind)
        or kind in PREWRITTEN
        or kind in SPECIAL_OPS
        or (kind in EXECUTORS and kind not in ("const",))
    )


# -- multi-op patterns -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PatternMatch:
    """A multi-op pattern found in a graph: its kind, members (id order), the values it reads and its operands."""

    kind: str
    nodes: tuple[int, ...]
    reads: tuple[int, ...]
    operands: tuple[tuple[str, int], ...]

    def operand(self, name: str) -> int:
        """The node id of operand ``name``."""
        return dict(self.operands)[name]


def _one_use(uses: Mapping[int, int], cons: Mapping[int, tuple[int, ...]], n: int, c: int) -> bool:
    return uses.get(n, 0) == 1 and cons.get(n) == (c,)


def _last_axis(graph: Graph, nid: int) -> bool:
    node = graph[nid]
    a = node_attrs(node, get_op(node.kind))
    rank = len(graph[node.parents[0]].out_shape)
    return rank >= 1 and int(a["axis"]) % rank == rank - 1


def _match_masked_softmax(
    graph: Graph, uses: Mapping[int, int], cons: Mapping[int, tuple[int, ...]], sid: int, payload: Payload | None
) -> PatternMatch | None:
    """softmax(add(x, mask)) over the last axis, the add read only by the softmax."""
    s = graph[sid]
    if s.kind != "softmax" or not _last_axis(graph, sid) or not 1 <= s.out_shape[-1] <= fk.MAX_ROW:
        return None
    a = graph[s.parents[0]]
    if a.kind != "add" or not _one_use(uses, cons, a.id, sid) or a.out_shape != s.out_shape:
        return None
    x, m = a.parents
    return PatternMatch("masked_softmax", (a.id, sid), (x, m), (("x", x), ("mask", m)))


def _const_value(graph: Graph, payload: Payload | None, nid: int) -> np.ndarray | None:
    """The value of a const node, or of broadcastTo/expand of one (None otherwise or without a payload)."""
    node = graph[nid]
    if node.kind in ("broadcastTo", "expand"):
        v = _const_value(graph, payload, node.parents[0])
        return None if v is None else np.broadcast_to(v, node.out_shape)
    if node.kind != "const" or payload is None or payload.get(nid) is None:
        return None
    return np.asarray(payload.get(nid)["value"], np.float32).reshape(node.out_shape)


def _match_rmsnorm(
    graph: Graph, uses: Mapping[int, int], cons: Mapping[int, tuple[int, ...]], mid: int, payload: Payload | None
) -> PatternMatch | None:
    """The six ops of RMSNorm: mul(mul(x, broadcastTo(rsqrt(add(reduceMean(pow(x, 2)), eps)))), w) (either
    operand order of each mul and of the add; the mean over the last axis with keepdim; exponent a const 2)."""
    m2 = graph[mid]
    if m2.kind != "mul_elem":
        return None
    for y_id, wb in (m2.parents, m2.parents[::-1]):
        y = graph[y_id]
        if y.kind != "mul_elem" or not _one_use(uses, cons, y_id, mid):
            continue
        for x, rb_id in (y.parents, y.parents[::-1]):
            rb = graph[rb_id]
            if rb.kind != "broadcastTo" or not _one_use(uses, cons, rb_id, y_id):
                continue
            r = graph[rb.parents[0]]
            if r.kind != "rsqrt" or not _one_use(uses, cons, r.id, rb_id):
                continue
            a = graph[r.parents[0]]
            if a.kind != "add" or not _one_use(uses, cons, a.id, r.id):
                continue
            for mean_id, eps in (a.parents, a.parents[::-1]):
                mean = graph[mean_id]
                if (
                    mean.kind != "reduceMean"
                    or not _one_use(uses, cons, mean_id, a.id)
                    or not _last_axis(graph, mean_id)
                ):
                    continue
                pw = graph[mean.parents[0]]
                if pw.kind != "pow" or pw.parents[0] != x or not _one_use(uses, cons, pw.id, mean_id):
                    continue
                shape = graph[x].out_shape
                if not shape or mean.out_shape != shape[:-1] + (1,) or m2.out_shape != shape:
                    continue
                if not 1 <= shape[-1] <= fk.MAX_ROW:
                    continue
                two = _const_value(graph, payload, pw.parents[1])
                if two is None or not np.all(two == np.float32(2.0)):
                    continue
                nodes = tuple(sorted((pw.id, mean_id, a.id, r.id, rb_id, y_id, mid)))
                if nodes[-1] != mid:
                    continue
                reads = tuple(dict.fromkeys((x, pw.parents[1], eps, wb)))
                return PatternMatch(
                    "rmsnorm", nodes, reads, (("x", x), ("exponent", pw.parents[1]), ("eps", eps), ("weight", wb))
                )
    return None


Matcher = Callable[
    [Graph, Mapping[int, int], Mapping[int, tuple[int, ...]], int, "Payload | None"], "PatternMatch | None"
]
PATTERNS: dict[str, Matcher] = {"masked_softmax": _match_masked_softmax, "rmsnorm": _match_rmsnorm}


def match_patterns(
    graph: Graph, part: Part, outputs: Iterable[int], payload: Payload | None = None
) -> dict[int, PatternMatch]:
    """Every pattern of :data:`PATTERNS` rooted at a node of a device part, all members inside the part and
    no member in two matches; by root (last member) id."""
    if not part.device:
        return {}
    uses = sf._uses(graph, outputs)
    cons = graph.consumers()
    members = set(part.nodes)
    taken: set[int] = set()
    found: dict[int, PatternMatch] = {}
    for nid in reversed(part.nodes):
        for matcher in PATTERNS.values():
            mt = matcher(graph, uses, cons, nid, payload)
            if mt is not None and set(mt.nodes) <= members and not set(mt.nodes) & taken:
                found[nid] = mt
                taken |= set(mt.nodes)
                break
    return found


@dataclass(frozen=True)
class Part:
    """A maximal run of consecutive node ids, all on the device or all in the host fallback."""

    device: bool
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class PartitionPlan:
    """The parts in id order, and which part each node is in."""

    parts: tuple[Part, ...]

    def part_of(self) -> dict[int, int]:
        """node id -> index of its part."""
        return {n: k for k, p in enumerate(self.parts) for n in p.nodes}


def partition(graph: Graph, is_supported: Callable[[str], bool] = default_supported) -> PartitionPlan:
    """Split the ids into maximal runs of supported (device) and unsupported (host fallback) nodes."""
    parts: list[Part] = []
    for n in graph.nodes:
        dev = bool(is_supported(n.kind))
        if parts and parts[-1].device == dev:
            parts[-1] = Part(dev, parts[-1].nodes + (n.id,))
        else:
            parts.append(Part(dev, (n.id,)))
    return PartitionPlan(tuple(parts))


Extend = Callable[[Graph, int, int, dict[int, int], Callable[[str], bool]], bool]


def analyze_subgraph(
    graph: Graph,
    part: Part,
    outputs: Iterable[int],
    fuse: bool = True,
    extend: Extend = sf.may_extend,
    patterns: Mapping[int, PatternMatch] | None = None,
) -> list[sf.Step]:
    """Steps of one part in run order (a chain runs at its last member); bound sources make no step; pattern
    matches (by root) become one pattern step each, their members out of every chain."""
    outputs = tuple(outputs)
    uses = sf._uses(graph, outputs)
    members = set(part.nodes)
    chains: dict[int, list[int]] = {}  # chain tail -> members
    singles: dict[int, sf.Step] = {}
    patterns = patterns or {}
    in_pattern = {n for mt in patterns.values() for n in mt.nodes}
    for root, mt in patterns.items():
        singles[root] = sf.Step("pattern", mt.nodes, mt.reads, (root,), pattern=mt)
    for nid in part.nodes:
        node = graph[nid]
        if node.kind in sf.BOUND_OPS or nid in in_pattern:
            continue
        if not part.device:
            singles[nid] = _single(graph, "host", nid)
            continue
        cat = sf.classify_op(node.kind)
        if cat == sf.ELEMENTWISE and cg.fusable(node.kind):
            p = node.parents[0] if node.parents else None
            if fuse and p in chains and p in members and extend(graph, p, nid, uses, cg.fusable):
                chains[nid] = chains.pop(p) + [nid]
            else:
                chains[nid] = [nid]
            continue
        singles[nid] = _single(graph, _STEP_OF_CATEGORY.get(cat, "host"), nid)
    for tail, chain in chains.items():
        reads = tuple(dict.fromkeys(p for m in chain for p in graph[m].parents if p not in chain))
        singles[tail] = sf.Step("fused", tuple(chain), reads, (tail,))
    return [singles[k] for k in sorted(singles)]


def _single(graph: Graph, kind: str, nid: int) -> sf.Step:
    return sf.Step(kind, (nid,), tuple(dict.fromkeys(graph[nid].parents)), (nid,))


# -- buffer planner ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Buffer:
    """An intermediate written by a generated kernel: node, byte offset in the arena, bytes, live steps."""

    node: int
    offset: int
    nbytes: int
    start: int
    end: int


@dataclass(frozen=True)
class BufferPlan:
    """Arena size and one buffer per generated-kernel output."""

    arena_bytes: int
    buffers: tuple[Buffer, ...]

    def of(self, node: int) -> Buffer | None:
        """The buffer of ``node``, or None."""
        return next((b for b in self.buffers if b.node == node), None)


Request = tuple[int, int, int, tuple[int, ...]]  # (node, nbytes, writing step, reading steps)


def buffer_requests(graph: Graph, steps: Sequence[sf.Step], outputs: Iterable[int], itemsize: int = 4) -> list[Request]:
    """Each fused step's output with its size and every step that reads it (through alias views too);
    a program output is read by step len(steps) (the caller)."""
    readers: dict[int, set[int]] = {}
    root: dict[int, int] = {}
    for k, s in enumerate(steps):
        for r in s.reads:
            base = root.get(r, r)
            readers.setdefault(base, set()).add(k)
        if s.kind == "alias" and graph[s.nodes[0]].kind != "concat":
            root[s.writes[0]] = root.get(s.reads[0], s.reads[0])
    for o in outputs:
        readers.setdefault(root.get(o, o), set()).add(len(steps))
    out = []
    for k, s in enumerate(steps):
        if s.kind == "fused":
            n = s.writes[0]
            out.append((n, itemsize * math.prod(graph[n].out_shape), k, tuple(sorted(readers.get(n, ())))))
    return out


def _first_fit(reqs: Sequence[tuple[int, int, int, int]]) -> BufferPlan:
    """Greedy first fit in start order over live intervals [start, end]: (node, nbytes, start, end)."""
    placed: list[Buffer] = []
    for node, nbytes, start, end in sorted(reqs, key=lambda r: (r[2], r[0])):
        live = sorted((b.offset, b.offset + b.nbytes) for b in placed if b.start <= end and start <= b.end)
        off = 0
        for lo, hi in live:
            if off + nbytes <= lo:
                break
            off = max(off, _align(hi))
        placed.append(Buffer(node, off, nbytes, start, end))
    arena = max((b.offset + b.nbytes for b in placed), default=0)
    return BufferPlan(arena, tuple(sorted(placed, key=lambda b: b.start)))


def _align(x: int, a: int = 256) -> int:
    return -(-x // a) * a


def plan_liveness(reqs: Sequence[Request]) -> BufferPlan:
    """Liveness-based reuse: a buffer lives from its writing step to its last reading step."""
    return _first_fit([(n, b, w, max(rs, default=w)) for n, b, w, rs in reqs])


def plan_first_read(reqs: Sequence[Request]) -> BufferPlan:
    """PLANTED: a buffer is freed after its first reader (later readers see a reused buffer)."""
    return _first_fit([(n, b, w, min(rs, default=w)) for n, b, w, rs in reqs])


PLANNERS: dict[str, Callable[[Sequence[Request]], BufferPlan]] = {
    "liveness": plan_liveness,
    "first_read": plan_first_read,
}


def plan_buffers(reqs: Sequence[Request], planner: str = "liveness") -> BufferPlan:
    """The buffer plan of ``planner`` for the requests."""
    return PLANNERS[planner](reqs)


def planner_violations(reqs: Sequence[Request], plan: BufferPlan) -> list[str]:
    """Planner safety: every request has a buffer of >= its bytes inside the arena, written before every read,
    and no two buffers whose [write, last read] intervals meet share a byte."""
    out: list[str] = []
    by_node = {b.node: b for b in plan.buffers}
    for n, nbytes, w, rs in reqs:
        b = by_node.get(n)
        if b is None:
            out.append(f"node {n} has no buffer")
            continue
        if b.nbytes < nbytes or b.offset < 0 or b.offset + nbytes > plan.arena_bytes:
            out.append(f"node {n}: buffer [{b.offset}, {b.offset + b.nbytes}) cannot hold {nbytes} bytes")
        if any(r <= w for r in rs):
            out.append(f"node {n}: read at step {min(rs)} not after its write at step {w}")
        last = max(rs, default=w)
        for m, mbytes, mw, mrs in reqs:
            c = by_node.get(m)
            if m <= n or c is None:
                continue
            mlast = max(mrs, default=mw)
            if w <= mlast and mw <= last and b.offset < c.offset + mbytes and c.offset < b.offset + nbytes:
                out.append(
                    f"nodes {n} (steps {w}..{last}) and {m} (steps {mw}..{mlast}) are live together and "
                    f"overlap in the arena"
                )
    return out


# -- program ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CUDAProgram:
    """A compiled graph: the partition, bound ids, steps (fused ones carry their kernel), buffers, outputs."""

    graph: Graph
    partition: PartitionPlan
    bound: tuple[int, ...]
    steps: tuple[sf.Step, ...]
    outputs: tuple[int, ...]
    buffers: BufferPlan
    requests: tuple[Request, ...] = ()
    storage: str = "float32"
    conv_route: str = ""  # conv2d nodes' route ("cudnn" or "direct"; "" without conv2d) and why it was taken
    conv_reason: str = ""

    def spec(self) -> sf.Program:
        """The program as :mod:`spec.fusion` states it."""
        return sf.Program(self.graph, self.bound, self.steps, self.outputs)

    def kernels(self) -> list[cg.FusedKernel]:
        """The generated kernels, in step order."""
        return [s.kernel for s in self.steps if s.kernel is not None]

    def counts(self) -> dict[str, int]:
        """Nodes, steps and kernels: N ops (non-bound nodes) -> M steps, of which K generated kernels."""
        return {
            "ops": len(self.graph) - len(self.bound),
            "steps": len(self.steps),
            "fused_kernels": len(self.kernels()),
        }

    def __str__(self) -> str:
        c = self.counts()
        lines = [
            f"program: {c['ops']} ops -> {c['steps']} steps ({c['fused_kernels']} generated kernels); "
            f"bound {list(self.bound)}; outputs {list(self.outputs)}"
            + ("" if self.storage == "float32" else f"; storage {self.storage}")
            + (f"; conv2d: {self.conv_reason}" if self.conv_route else "")
        ]
        for k, s in enumerate(self.steps):
            what = (
                s.kernel.describe() if s.kernel is not None else ", ".join(f"{self.graph[n].kind} {n}" for n in s.nodes)
            )
            if s.pattern is not None:
                what = f"{s.pattern.kind} [{what}]"
            lines.append(f"  step {k}: {s.kind:<9} {what}  reads {list(s.reads)}")
        lines.append(
            f"  arena {self.buffers.arena_bytes} B: "
            + (
                "; ".join(
                    f"n{b.node} [{b.offset}, {b.offset + b.nbytes}) steps {b.start}..{b.end}"
                    for b in self.buffers.buffers
                )
                or "no intermediates"
            )
        )
        return "\n".join(lines)


# conv= of compile_subgraph: "auto" takes cuDNN where it can run (else the direct kernel, saying why), "cudnn"
# plans cuDNN steps whatever this machine has (a CUDA executor refuses them without it), "direct" the bitwise kernel.
CONV_ROUTES: tuple[str, ...] = ("auto", "cudnn", "direct")


def conv_route(conv: str = "auto") -> tuple[str, str]:
    """The conv2d route the planner takes for ``conv`` ("cudnn" or "direct") and why."""
    if conv not in CONV_ROUTES:
        raise ValueError(f"conv must be one of {CONV_ROUTES}, not {conv!r}")
    if conv == "direct":
        return "direct", "asked: the direct kernel (native.conv, bitwise the denotation)"
    if conv == "cudnn":
        return "cudnn", "asked: cuDNN through torch (native.cudnn)"
    from native.cudnn import cudnn_missing

    why = cudnn_missing()
    if why:
        return "direct", f"the direct kernel: cuDNN cannot run here ({why})"
    return "cudnn", "cuDNN through torch (native.cudnn): CUDA, torch and cuDNN present"


def program_outputs(graph: Graph) -> tuple[int, ...]:
    """Default outputs: the nodes nobody reads (bound sources excluded), else the last node."""
    cons = graph.consumers()
    return tuple(n.id for n in graph.nodes if not cons[n.id] and n.kind not in sf.BOUND_OPS) or (len(graph) - 1,)


def compile_subgraph(
    graph: Graph,
    outputs: Iterable[int] | None = None,
    *,
    is_supported: Callable[[str], bool] = default_supported,
    fuse: bool = True,
    variant: str = "default",
    planner: str = "liveness",
    extend: Extend = sf.may_extend,
    payload: Payload | None = None,
    patterns: bool = True,
    storage: str = "float32",
    conv: str = "auto",
) -> CUDAProgram:
    """Partition, match the multi-op patterns (the RMSNorm one needs ``payload`` to see its exponent 2), analyse
    every part into steps, generate one kernel per chain and plan the buffers. ``storage`` float16: every value
    is stored as binary16 (only elementwise chains and data movement; each op rounds to binary16). ``conv``: the
    conv2d route (:data:`CONV_ROUTES`, :func:`conv_route`; asked only when the graph has a conv2d node)."""
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {sorted(STORAGES)}")
    if conv not in CONV_ROUTES:
        raise ValueError(f"conv must be one of {CONV_ROUTES}, not {conv!r}")
    outs = tuple(outputs) if outputs is not None else program_outputs(graph)
    plan = partition(graph, is_supported)
    steps: list[sf.Step] = []
    for part in plan.parts:
        found = match_patterns(graph, part, outs, payload) if patterns and fuse and storage == "float32" else {}
        steps += analyze_subgraph(graph, part, outs, fuse, extend, found)
    steps.sort(key=lambda s: s.nodes[-1])
    route: tuple[str, str] = ("", "")
    if any(graph[s.nodes[0]].kind == "conv2d" for s in steps if s.kind == "cublas"):
        route = conv_route(conv)
        if route[0] == "cudnn":
            steps = [
                sf.Step("cudnn", s.nodes, s.reads, s.writes)
                if s.kind == "cublas" and graph[s.nodes[0]].kind == "conv2d"
                else s
                for s in steps
            ]
    if storage != "float32":
        bad = [s for s in steps if s.kind not in ("fused", "alias")]
        if bad:
            raise ValueError(
                f"{storage} storage runs elementwise chains and data movement only; node {bad[0].nodes[0]} "
                f"({graph[bad[0].nodes[0]].kind}) would be a {bad[0].kind} step"
            )
    k = 0
    for i, s in enumerate(steps):
        if s.kind == "fused":
            kern = cg.generate_fused_kernel(graph, s.nodes, f"fused_ew_{k}", variant, storage)
            steps[i] = sf.Step(s.kind, s.nodes, s.reads, s.writes, kern)
            k += 1
    bound = tuple(n.id for n in graph.nodes if n.kind in sf.BOUND_OPS)
    reqs = buffer_requests(graph, steps, outs, np.dtype(STORAGES[storage]).itemsize)
    return CUDAProgram(
        graph, plan, bound, tuple(steps), outs, plan_buffers(reqs, planner), tuple(reqs), storage, route[0], route[1]
    )


# -- kernel cache ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheKey:
    """What identifies a compiled kernel: source hash, function name, compile options, GPU architecture."""

    source_sha256: str
    name: str
    options: tuple[str, ...]
    arch: str


def _options(route: str) -> tuple[str, ...]:
    r = get_route(route)
    return r.flags.options() if r.flags is not None else ("cupy-stock", "-ftz=true")


def full_key(source: str, name: str, route: str, arch: str) -> CacheKey:
    """The key: sha256(source), name, the route's NVRTC options and the architecture."""
    return CacheKey(hashlib.sha256(source.encode()).hexdigest(), name, _options(route), arch)


def source_name_key(source: str, name: str, route: str, arch: str) -> CacheKey:
    """PLANTED (the seed's key): source hash and name only -- collides across flags and devices."""
    return CacheKey(hashlib.md5(source.encode()).hexdigest(), name, (), "")


KEYS: dict[str, Callable[[str, str, str, str], CacheKey]] = {"full": full_key, "source_name": source_name_key}


def _nvrtc(source: str, name: str, route: str, arch: str) -> Any:
    return compile_function(source, name, route)


class KernelCache:
    """Compiled kernels by :class:`CacheKey`, shared across executors; ``compiles`` counts compiler calls."""

    def __init__(self, compiler: Callable[[str, str, str, str], Any] = _nvrtc, key: str = "full") -> None:
        self.compiler = compiler
        self.key = KEYS[key]
        self.entries: dict[CacheKey, Any] = {}
        self.compiles = 0

    def get(self, source: str, name: str, route: str, arch: str) -> Any:
        """The kernel for (source, name, route, arch), compiled on first request."""
        k = self.key(source, name, route, arch)
        fn = self.entries.get(k)
        if fn is None:
            self.compiles += 1
            fn = self.entries[k] = self.compiler(source, name, route, arch)
        return fn


KERNEL_CACHE = KernelCache()


def device_arch() -> str:
    """The current CUDA device's compute capability (e.g. '90')."""
    import cupy

    return str(cupy.cuda.Device().compute_capability)


# -- executor --------------------------------------------------------------------------------------------


def _upload(xp: Any, a: np.ndarray, dtype: Any = np.float32) -> Any:
    """A host array on the device through a 1-D copy (CuPy may fill a 0-d array from a zero by memset, turning
    -0.0 into +0.0; seen on the H100 run)."""
    # keeps a 0-d array 0-d (ascontiguousarray makes it 1-d); a host copy only where no upload copies it (host runs):
    # a training step's 67 MB of weights were copied three times on their way to the device
    a = np.array(a, dtype=dtype, order="C", copy=True) if xp is np else np.asarray(a, dtype=dtype, order="C")
    return xp.asarray(a.reshape(-1)).reshape(a.shape)


def _contig_flat(xp: Any, a: Any) -> Any:
    return xp.ascontiguousarray(a).reshape(-1)


def _to_storage(a: np.ndarray, storage: str) -> np.ndarray:
    """Host values in the storage type: float32 (uint32 bits viewed), or float16 rounded (NaN -> 0x7FFF)."""
    h = np.asarray(a)
    if storage == "float16":
        if h.dtype == np.float16:
            return h
        if h.dtype == np.uint16:
            return h.view(np.float16)
        return cg.round16(h.view(np.float32) if h.dtype == np.uint32 else h.astype(np.float32))
    return h.view(np.float32) if h.dtype == np.uint32 else h.astype(np.float32, copy=False)  # _upload copies


class CUDAExecutor:
    """Runs a :class:`CUDAProgram` on ``device``: parameters bound once, a dispatch table built once."""

    def __init__(
        self,
        program: CUDAProgram,
        payload: Payload | None = None,
        device: str = "auto",
        cache: KernelCache = KERNEL_CACHE,
    ) -> None:
        self.program = program
        self.payload = payload if payload is not None else Payload()
        self.device = resolve_device(device)
        self.xp = array_module(self.device)
        self.cache = cache
        self.storage = program.storage
        self.dtype = STORAGES[self.storage]
        item = np.dtype(self.dtype).itemsize
        g = program.graph
        self.params = {
            b: _upload(
                self.xp,
                _to_storage(np.asarray(self.payload.get(b)["value"], np.float32).reshape(g[b].out_shape), self.storage),
                self.dtype,
            )
            for b in program.bound
            if g[b].kind == "const"
        }
        self.arena = self.xp.empty(max(program.buffers.arena_bytes // item, 1), dtype=self.dtype)
        self.slots = {
            b.node: self.arena[b.offset // item : b.offset // item + b.nbytes // item] for b in program.buffers.buffers
        }
        kinds = {_kernel_kind(g, s) for s in program.steps} - {None}
        self.weights = {
            n.id: self.xp.asarray(np.asarray(self.payload.get(n.id)[key], np.float32))
            for n in g.nodes
            for key in (_WEIGHT_KEYS.get(n.kind),)
            if key is not None and self.payload.get(n.id) is not None
        }
        self.prewritten = (
            {}
            if self.device == "host"
            else {
                k: cache.get(*PREWRITTEN[k], fk.ROUTE, device_arch())
                for k in sorted(kinds | ({"rmsnorm_rows"} if "rmsnorm" in kinds else set()))
            }
        )
        self.rope_tables: dict[tuple[int, int, float], tuple[Any, Any]] = {}
        self.eps: dict[int, Any] = {}  # rmsnorm node -> its eps as a one-element device array
        if self.device != "host" and any(s.kind == "cudnn" for s in program.steps):
            from native.cudnn import cudnn_missing

            why = cudnn_missing()
            if why:
                raise ValueError(f"the program has cuDNN conv steps but {why} (compile with conv='direct')")
        # conv2d node -> its planned cuDNN call, weight and bias tensors (and the CuPy arrays they view)
        self.conv_calls: dict[int, tuple[Any, ...]] = {}
        self.table = [(_DISPATCH[s.kind], s) for s in program.steps]
        self.launchers = {s.writes[0]: self._launcher(s) for s in program.steps if s.kind == "fused"}

    def _launcher(self, step: sf.Step) -> Callable[[list[Any], Any], None]:
        kernel = step.kernel
        if self.device == "host":

            def host(ins: list[Any], out: Any) -> None:
                out[...] = cg.run_host(kernel, ins)

            return host
        fn = self.cache.get(kernel.source, kernel.name, cg.ROUTE, device_arch())
        n = math.prod(self.program.graph[kernel.output].out_shape)
        plan = cg.kernel_plan(kernel, n)
        grid, block = (int(plan["grid"]),), (int(plan["block"]),)

        def launch(ins: list[Any], out: Any) -> None:
            fn(grid, block, (*ins, out, np.int64(n)))

        return launch

    def rmsnorm_kernels(self) -> tuple[Any, Any]:
        """The RMSNorm kernels (general, rows) this executor launches."""
        return self.prewritten["rmsnorm"], self.prewritten["rmsnorm_rows"]

    def rope_table(self, t_len: int, dim: int, base: float) -> tuple[Any, Any]:
        """RoPE's (T, D/2) cos and sin tables on the device (the denotation's, computed once per shape)."""
        key = (t_len, dim, float(base))
        if key not in self.rope_tables:
            c, s = rope_tables(t_len, dim, base)
            self.rope_tables[key] = (_upload(self.xp, floats(c)), _upload(self.xp, floats(s)))
        return self.rope_tables[key]

    def _bind(self, inputs: Any) -> dict[int, Any]:
        """Inputs by input node id as arrays of the device in the storage type (host arrays are uploaded, float32
        inputs rounded to float16 storage; shapes checked)."""
        g = self.program.graph
        if self.device == "host" and self.storage == "float32":
            ins = normalise_inputs(g, inputs)
            if not isinstance(ins, dict):
                raise ValueError(str(ins))
            return ins
        ids = g.input_ids()
        given = dict(inputs) if isinstance(inputs, Mapping) else dict(zip(ids, inputs, strict=True))
        out = {}
        for i in ids:
            a = given[i]
            if self.device != "host" and isinstance(a, self.xp.ndarray):
                if a.dtype == self.xp.uint32:
                    a = a.view(self.xp.float32)
                a = a.astype(self.dtype, copy=False)
            else:
                a = _upload(self.xp, _to_storage(np.asarray(to_host(a)), self.storage), self.dtype)
            if tuple(a.shape) != g[i].out_shape:
                raise ValueError(f"input {i} has shape {tuple(a.shape)}, declared {g[i].out_shape}")
            out[i] = a
        return out

    def run(self, inputs: Any) -> dict[int, Any]:
        """Every output's value (arrays of the device, by node id)."""
        values: dict[int, Any] = dict(self.params)
        values.update(self._bind(inputs))
        for fn, step in self.table:
            fn(self, step, values)
        return {o: values[o] for o in self.program.outputs}

    def run_step(self, step: sf.Step, reads: Mapping[int, Any]) -> dict[int, Any]:
        """One step alone from given values of what it reads (host arrays are uploaded): its written values."""
        values = {
            r: (v if self.device != "host" and isinstance(v, self.xp.ndarray) else _upload(self.xp, np.asarray(v)))
            for r, v in reads.items()
        }
        _DISPATCH[step.kind](self, step, values)
        return {w: values[w] for w in step.writes}


_WEIGHT_KEYS = {"rmsnorm": "weight", "embedding": "table"}


def _kernel_kind(graph: Graph, step: sf.Step) -> str | None:
    """The pre-written kernel a step launches (None: none)."""
    if step.kind == "pattern":
        return step.pattern.kind
    kind = graph[step.nodes[0]].kind
    return kind if step.kind in ("reduction", "special") and kind in PREWRITTEN else None


def _fused(ex: CUDAExecutor, step: sf.Step, values: dict[int, Any]) -> None:
    k = step.kernel
    n = k.output
    out = ex.slots.get(n)
    if out is None:
        out = ex.xp.empty(math.prod(ex.program.graph[n].out_shape), dtype=ex.dtype)
    ex.launchers[n]([_contig_flat(ex.xp, values[i]) for i in k.inputs], out)
    values[n] = out.reshape(ex.program.graph[n].out_shape)


def _reference_node(ex: CUDAExecutor, step: sf.Step, values: dict[int, Any]) -> None:
    node = ex.program.graph[step.nodes[0]]
    values[node.id] = run_node(node, [values[p] for p in node.parents], ex.payload.get(node.id), ex.device)


def _pair(v: Any) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (v[0], v[1])


def _cudnn(ex: CUDAExecutor, step: sf.Step, values: dict[int, Any]) -> None:
    node = ex.program.graph[step.nodes[0]]
    if ex.device == "host":  # planned where cuDNN runs, executed here: the direct kernel's host path (the denotation)
        _reference_node(ex, step, values)
        return
    from native import cudnn

    x = values[node.parents[0]]
    # (N, C, H, W) as is; else flattened to it (not -1: an empty input has no size to infer). Each reshape costs
    # microseconds of a step whose host time counts (FUSION-PERF-conv-torch).
    x4 = x if x.ndim == 4 else x.reshape((math.prod(x.shape[:-3]),) + tuple(x.shape[-3:]))
    planned = ex.conv_calls.get(node.id)
    if planned is None:  # once per node: the guard, the weights on the device as torch tensors (zero copy)
        e, a = ex.payload.get(node.id), node_attrs(node, get_op(node.kind))
        w, b = _upload(ex.xp, e["weight"]), _upload(ex.xp, e["bias"])
        win = (tuple(int(v) for v in _pair(a[k])) for k in ("stride", "padding", "dilation"))
        call = cudnn.plan_call(tuple(x4.shape), tuple(w.shape), int(b.size), *win, 1)
        planned = ex.conv_calls[node.id] = (call, *cudnn.weights(call, w, b), w, b)
    y = cudnn.run(planned[0], x4, planned[1], planned[2])
    values[node.id] = y if y.shape == node.out_shape else y.reshape(node.out_shape)


def _reduction(ex: CUDAExecutor, step: sf.Step, values: dict[int, Any]) -> None:
    node = ex.program.graph[step.nodes[0]]
    if node.kind != "rmsnorm":
        _reference_node(ex, step, values)
        return
    x, w = values[node.parents[0]], ex.weights[node.id]
    if ex.device == "host":
        values[node.id] = fk.rmsnorm_host(to_host(x), to_host(w), float(node_attrs(node, get_op(node.kind))["eps"]))
        return
    eps = ex.eps.get(node.id)
    if eps is None:
        eps = ex.eps[node.id] = ex.xp.full((1,), np.float32(node_attrs(node, get_op(node.kind))["eps"]), ex.xp.float32)
    values[node.id] = fk.rmsnorm_cuda(ex.rmsnorm_kernels(), x, w, eps)


def _pattern(ex: CUDAExecutor, step: sf.Step, values: dict[int, Any]) -> None:
    mt: PatternMatch = step.pattern
    g = ex.program.graph
    root = step.writes[0]
    if mt.kind == "masked_softmax":
        x, m = values[mt.operand("x")], values[mt.operand("mask")]
        if ex.device == "host":
            a = run_node(g[step.nodes[0]], [x, m], None, "host")
            values[root] = run_node(g[root], [a], None, "host")
        else:
            values[root] = fk.masked_softmax_cuda(ex.prewritten[mt.kind], x, m)
        return
    x, w, eps = (values[mt.operand(k)] for k in ("x", "weight", "eps"))
    values[root] = (
        fk.rmsnorm_host(to_host(x), to_host(w), to_host(eps))
        if ex.device == "host"
        else fk.rmsnorm_cuda(ex.rmsnorm_kernels(), x, w, eps)
    )


def _special(ex: CUDAExecutor, step: sf.Step, values: dict[int, Any]) -> None:
    node = ex.program.graph[step.nodes[0]]
    if ex.device == "host" or node.kind not in SPECIAL_OPS:
        _host_node(ex, step, values)
        return
    x = values[node.parents[0]]
    if node.kind == "rope":
        c, s = ex.rope_table(node.out_shape[-2], node.out_shape[-1], node_attrs(node, get_op("rope"))["base"])
        values[node.id] = fk.rope_cuda(ex.prewritten["rope"], x, c, s)
    else:
        values[node.id] = fk.embedding_cuda(ex.prewritten["embedding"], x, ex.weights[node.id])


def _alias(ex: CUDAExecutor, step: sf.Step, values: dict[int, Any]) -> None:
    node = ex.program.graph[step.nodes[0]]
    values[node.id] = _VIEWS[node.kind](ex.xp, node, [values[p] for p in node.parents])


def _host_node(ex: CUDAExecutor, step: sf.Step, values: dict[int, Any]) -> None:
    g = ex.program.graph
    node = g[step.nodes[0]]
    # reshaped: ascontiguousarray makes a rank-0 value rank 1
    env = {p: bits(np.ascontiguousarray(to_host(values[p]), np.float32)).reshape(g[p].out_shape) for p in node.parents}
    v = eval_node(g, ex.payload, env, node, {})
    if not isinstance(v, np.ndarray):
        raise ValueError(str(v))
    values[node.id] = _upload(ex.xp, floats(v))


def _slice_view(xp: Any, node: Any, args: list) -> Any:
    a = node.attrs
    idx = [slice(None)] * args[0].ndim
    idx[a["axis"]] = slice(a["start"], a["stop"], a.get("step", 1))
    return args[0][tuple(idx)]


def _reshape_view(xp: Any, node: Any, args: list) -> Any:
    return xp.reshape(args[0], node.out_shape)  # a view when the layout allows, else a copy


_VIEWS: dict[str, Callable[[Any, Any, list], Any]] = {
    "reshape": _reshape_view,
    "flatten": _reshape_view,
    "transpose": lambda xp, n, a: xp.swapaxes(a[0], n.attrs["dim0"], n.attrs["dim1"]),
    "permute": lambda xp, n, a: xp.transpose(a[0], n.attrs["perm"]),
    "slice": _slice_view,
    "broadcastTo": lambda xp, n, a: xp.broadcast_to(a[0], n.out_shape),
    "expand": lambda xp, n, a: xp.broadcast_to(a[0], n.out_shape),
    "concat": lambda xp, n, a: xp.concatenate(a, axis=n.attrs["axis"]),
}
_DISPATCH: dict[str, Callable[[CUDAExecutor, sf.Step, dict[int, Any]], None]] = {
    "fused": _fused,
    "cublas": _reference_node,
    "cudnn": _cudnn,
    "reduction": _reduction,
    "pattern": _pattern,
    "special": _special,
    "alias": _alias,
    "host": _host_node,
}


def run_program(
    graph: Graph,
    payload: Payload | None,
    inputs: Any,
    device: str = "auto",
    outputs: Iterable[int] | None = None,
    **compile_kw: Any,
) -> dict[int, np.ndarray]:
    """Compile (the payload lets the RMSNorm pattern see its exponent) and run once; the outputs as host arrays
    of the storage type by node id."""
    compile_kw.setdefault("payload", payload)
    prog = compile_subgraph(graph, outputs, **compile_kw)
    res = CUDAExecutor(prog, payload, device).run(inputs)
    return {k: np.ascontiguousarray(to_host(v), dtype=STORAGES[prog.storage]) for k, v in res.items()}


# -- representative graphs and their builds ----------------------------------------------------------------


def _mlp(t: int = 4, d: int = 8, f: int = 16, linear: bool = True) -> tuple[Graph, Payload]:
    """The seed's Qwen MLP: gate/up projections, silu(gate) * up, down projection."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.add("input", (), (t, d))

    def proj(src: int, fi: int, fo: int) -> int:
        if linear:
            return b.add(
                "linear",
                (src,),
                (t, fo),
                params={"weight": rng.standard_normal((fo, fi)) / fi**0.5, "bias": np.zeros(fo)},
                out_features=fo,
            )
        w = b.add("const", (), (fi, fo), params={"value": rng.standard_normal((fi, fo)) / fi**0.5})
        return b.add("matmul", (src, w), (t, fo))

    gate, up = proj(x, d, f), proj(x, d, f)
    s = b.add("silu", (gate,), (t, f))
    h = b.add("mul_elem", (s, up), (t, f))
    proj(h, f, d)
    return b.build()


def chain4_graph(n: int = 8) -> tuple[Graph, Payload]:
    """A 4-op elementwise chain of length ``n``: neg(relu(x * x + x)) (the golden programs' and FUSION-PERF-chain's)."""
    b = GraphBuilder()
    x = b.add("input", (), (n,))
    v = b.add("mul_elem", (x, x), (n,))
    v = b.add("add", (v, x), (n,))
    v = b.add("relu", (v,), (n,))
    b.add("neg", (v,), (n,))
    return b.build()


def _mixed() -> tuple[Graph, Payload]:
    """Chains around barriers: exp/tanh/sigmoid/gelu chain, a multi-consumer node, softmax, reshape."""
    b = GraphBuilder()
    x = b.add("input", (), (2, 4))
    y = b.add("input", (), (2, 4))
    e = b.add("exp", (x,), (2, 4))
    t = b.add("tanh", (e,), (2, 4))
    s = b.add("sigmoid", (t,), (2, 4))
    d = b.add("div", (s, y), (2, 4))
    m = b.add("softmax", (d,), (2, 4), axis=-1)
    r = b.add("reshape", (m,), (8,), shape=(8,))
    g = b.add("gelu", (r,), (8,))
    q = b.add("sqrt", (g,), (8,))
    b.add("maxElem", (q, g), (8,))
    return b.build()


def _chain_fp16(n: int = 8) -> tuple[Graph, Payload]:
    """A float16-storage chain of every exact op kind: sqrt(abs(min(max((x + c) - c, x) * x / c, x))) ..."""
    b = GraphBuilder()
    x = b.add("input", (), (n,))
    c = b.add("const", (), (n,), params={"value": np.full(n, 3.0)})
    v = b.add("sub", (b.add("add", (x, c), (n,)), c), (n,))
    v = b.add("div", (b.add("mul_elem", (b.add("maxElem", (v, x), (n,)), x), (n,)), c), (n,))
    v = b.add("inv", (b.add("sqrt", (b.add("abs", (b.add("minElem", (v, x), (n,)),), (n,)),), (n,)),), (n,))
    b.add("relu", (b.add("neg", (v,), (n,)),), (n,))
    return b.build()


def fp16_example_graphs() -> dict[str, tuple[Graph, Payload]]:
    """Graphs compiled with float16 storage for the audit: the 4-op chain and a chain of every exact op."""
    return {"chain4_fp16": chain4_graph(), "exact_fp16": _chain_fp16()}


def example_graphs() -> dict[str, tuple[Graph, Payload]]:
    """Representative graphs: the seed's MLP (linear and matmul forms), a 4-op chain, a mixed graph."""
    return {"mlp": _mlp(), "mlp_matmul": _mlp(linear=False), "chain4": chain4_graph(), "mixed": _mixed()}


def _uses_fma(source: str) -> bool:
    return any(f in source for f in ("fmaf(", "__fmaf_r", "__fma_r", "fma("))


@register_builds("fusion")
def _builds() -> Iterator[Build]:
    for gname, (graph, _) in sorted(example_graphs().items()):
        for k in compile_subgraph(graph).kernels():
            yield Build(
                "fusion",
                f"{gname}:{k.name}",
                k.source,
                k.name,
                cg.ROUTE,
                approximate=k.approximate,
                fused=_uses_fma(k.source),
                index_bits=k.index_bits,
            )
    for gname, (graph, _) in sorted(fp16_example_graphs().items()):
        for k in compile_subgraph(graph, storage="float16").kernels():
            yield Build(
                "fusion",
                f"{gname}:{k.name}",
                k.source,
                k.name,
                cg.ROUTE,
                approximate=k.approximate,
                fused=_uses_fma(k.source),
                index_bits=k.index_bits,
            )
    for op, (src, name) in sorted(PREWRITTEN.items()):
        yield Build(
            "fusion",
            f"prewritten:{op}",
            src,
            name,
            fk.ROUTE,
            approximate=op in fk.APPROXIMATE,
            fused=_uses_fma(src),
            index_bits=64,
        )
