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
aliases as views, and host-fallback nodes by the denotation.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
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
from spec.ir.denote import bits, eval_node, floats, normalise_inputs
from spec.ir.graph import Graph, GraphBuilder, Payload
from spec.ir.ops import get_op

__all__ = [
    "Part",
    "PartitionPlan",
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
    "program_outputs",
]

_STEP_OF_CATEGORY = {
    sf.ANCHOR_BLAS: "cublas",
    sf.REDUCTION: "reduction",
    sf.SHAPE_ALIAS: "alias",
    sf.SPECIAL: "special",
}


PREWRITTEN: dict[str, tuple[str, str]] = {"rmsnorm": fk.rmsnorm_source()}  # op -> (source, function)


def default_supported(kind: str) -> bool:
    """Device-supported ops: bound sources, fusable elementwise ops and ops the unfused executor runs."""
    return (
        kind in sf.BOUND_OPS or cg.fusable(kind) or kind in PREWRITTEN or (kind in EXECUTORS and kind not in ("const",))
    )


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
    graph: Graph, part: Part, outputs: Iterable[int], fuse: bool = True, extend: Extend = sf.may_extend
) -> list[sf.Step]:
    """Steps of one part in run order (a chain runs at its last member); bound sources make no step."""
    uses = sf._uses(graph, outputs)
    members = set(part.nodes)
    chains: dict[int, list[int]] = {}  # chain tail -> members
    singles: dict[int, sf.Step] = {}
    for nid in part.nodes:
        node = graph[nid]
        if node.kind in sf.BOUND_OPS:
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


def buffer_requests(graph: Graph, steps: Sequence[sf.Step], outputs: Iterable[int]) -> list[Request]:
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
            out.append((n, 4 * math.prod(graph[n].out_shape), k, tuple(sorted(readers.get(n, ())))))
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
        ]
        for k, s in enumerate(self.steps):
            what = (
                s.kernel.describe() if s.kernel is not None else ", ".join(f"{self.graph[n].kind} {n}" for n in s.nodes)
            )
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
) -> CUDAProgram:
    """Partition, analyse every part into steps, generate one kernel per chain and plan the buffers."""
    outs = tuple(outputs) if outputs is not None else program_outputs(graph)
    plan = partition(graph, is_supported)
    steps: list[sf.Step] = []
    for part in plan.parts:
        steps += analyze_subgraph(graph, part, outs, fuse, extend)
    steps.sort(key=lambda s: s.nodes[-1])
    k = 0
    for i, s in enumerate(steps):
        if s.kind == "fused":
            steps[i] = sf.Step(
                s.kind, s.nodes, s.reads, s.writes, cg.generate_fused_kernel(graph, s.nodes, f"fused_ew_{k}", variant)
            )
            k += 1
    bound = tuple(n.id for n in graph.nodes if n.kind in sf.BOUND_OPS)
    reqs = buffer_requests(graph, steps, outs)
    return CUDAProgram(graph, plan, bound, tuple(steps), outs, plan_buffers(reqs, planner), tuple(reqs))


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


@dataclass
class _State:
    values: dict[int, Any] = field(default_factory=dict)


def _upload(xp: Any, a: np.ndarray) -> Any:
    """A host float32 array on the device through a 1-D copy (CuPy may fill a 0-d array from a zero by memset,
    turning -0.0 into +0.0; seen on the H100 run)."""
    a = np.ascontiguousarray(a, np.float32)
    return xp.asarray(a.reshape(-1)).reshape(a.shape)


def _contig_flat(xp: Any, a: Any) -> Any:
    return xp.ascontiguousarray(a).reshape(-1)


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
        g = program.graph
        self.params = {
            b: _upload(self.xp, np.asarray(self.payload.get(b)["value"], np.float32).reshape(g[b].out_shape))
            for b in program.bound
            if g[b].kind == "const"
        }
        self.arena = self.xp.empty(max(program.buffers.arena_bytes // 4, 1), dtype=self.xp.float32)
        self.slots = {
            b.node: self.arena[b.offset // 4 : b.offset // 4 + b.nbytes // 4] for b in program.buffers.buffers
        }
        self.weights = {
            n.id: self.xp.asarray(np.asarray(self.payload.get(n.id)["weight"], np.float32))
            for n in g.nodes
            if n.kind in PREWRITTEN and self.payload.get(n.id) is not None
        }
        self.prewritten = (
            {}
            if self.device == "host"
            else {
                k: cache.get(src, name, fk.ROUTE, device_arch())
                for k, (src, name) in PREWRITTEN.items()
                if any(g[s.nodes[0]].kind == k for s in program.steps)
            }
        )
        self.table = [(_DISPATCH[s.kind], s) for s in program.steps]
        self.launchers = {s.writes[0]: self._launcher(s) for s in program.steps if s.kind == "fused"}

    def _launcher(self, step: sf.Step) -> Callable[[list[Any], Any], None]:
        kernel = step.kernel
        if self.device == "host":

            def host(ins: list[Any], out: Any) -> None:
                out[...] = cg.run_host(kernel, ins)

            return host
        import cupy

        fn = self.cache.get(kernel.source, kernel.name, cg.ROUTE, device_arch())
        n = math.prod(self.program.graph[kernel.output].out_shape)
        plan = cg.kernel_plan(kernel, n)
        grid, block = (int(plan["grid"]),), (int(plan["block"]),)

        def launch(ins: list[Any], out: Any) -> None:
            fn(grid, block, (*ins, out, np.int64(n)))

        _ = cupy
        return launch

    def _bind(self, inputs: Any) -> dict[int, Any]:
        """Inputs by input node id as float32 arrays of the device (host arrays are uploaded; shapes checked)."""
        g = self.program.graph
        if self.device == "host":
            ins = normalise_inputs(g, inputs)
            if not isinstance(ins, dict):
                raise ValueError(str(ins))
            return ins
        ids = g.input_ids()
        given = dict(inputs) if isinstance(inputs, Mapping) else dict(zip(ids, inputs, strict=True))
        out = {}
        for i in ids:
            a = given[i]
            if isinstance(a, self.xp.ndarray):
                a = a.view(self.xp.float32) if a.dtype == self.xp.uint32 else a.astype(self.xp.float32, copy=False)
            else:
                h = np.asarray(a)
                a = _upload(self.xp, h.view(np.float32) if h.dtype == np.uint32 else h.astype(np.float32))
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


def _fused(ex: CUDAExecutor, step: sf.Step, values: dict[int, Any]) -> None:
    k = step.kernel
    n = k.output
    out = ex.slots.get(n)
    if out is None:
        out = ex.xp.empty(math.prod(ex.program.graph[n].out_shape), dtype=ex.xp.float32)
    ex.launchers[n]([_contig_flat(ex.xp, values[i]) for i in k.inputs], out)
    values[n] = out.reshape(ex.program.graph[n].out_shape)


def _reference_node(ex: CUDAExecutor, step: sf.Step, values: dict[int, Any]) -> None:
    node = ex.program.graph[step.nodes[0]]
    values[node.id] = run_node(node, [values[p] for p in node.parents], ex.payload.get(node.id), ex.device)


def _reduction(ex: CUDAExecutor, step: sf.Step, values: dict[int, Any]) -> None:
    node = ex.program.graph[step.nodes[0]]
    if node.kind not in PREWRITTEN:
        _reference_node(ex, step, values)
        return
    eps = float(node_attrs(node, get_op(node.kind))["eps"])
    x, w = values[node.parents[0]], ex.weights[node.id]
    values[node.id] = (
        fk.rmsnorm_host(to_host(x), w, eps)
        if ex.device == "host"
        else fk.rmsnorm_cuda(ex.prewritten[node.kind], x, w, eps)
    )


def _alias(ex: CUDAExecutor, step: sf.Step, values: dict[int, Any]) -> None:
    node = ex.program.graph[step.nodes[0]]
    values[node.id] = _VIEWS[node.kind](ex.xp, node, [values[p] for p in node.parents])


def _host_node(ex: CUDAExecutor, step: sf.Step, values: dict[int, Any]) -> None:
    g = ex.program.graph
    node = g[step.nodes[0]]
    env = {p: bits(np.ascontiguousarray(to_host(values[p]), np.float32)) for p in node.parents}
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
    "reduction": _reduction,
    "special": _host_node,
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
    """Compile and run once; the outputs as host float32 arrays by node id."""
    prog = compile_subgraph(graph, outputs, **compile_kw)
    res = CUDAExecutor(prog, payload, device).run(inputs)
    return {k: np.ascontiguousarray(to_host(v), dtype=np.float32) for k, v in res.items()}


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


def _chain4(n: int = 8) -> tuple[Graph, Payload]:
    """A 4-op elementwise chain: neg(relu(x * x + x))."""
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


def example_graphs() -> dict[str, tuple[Graph, Payload]]:
    """Representative graphs: the seed's MLP (linear and matmul forms), a 4-op chain, a mixed graph."""
    return {"mlp": _mlp(), "mlp_matmul": _mlp(linear=False), "chain4": _chain4(), "mixed": _mixed()}


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
    for op, (src, name) in sorted(PREWRITTEN.items()):
        yield Build("fusion", f"prewritten:{op}", src, name, fk.ROUTE, fused=_uses_fma(src), index_bits=64)
