"""Code generation for fused elementwise chains: CUDA C on the elementwise family's launch plan, and its host model.

Each fusable op is a :class:`FusedOp` whose CUDA body and host implementation are the elementwise family's own
(``native.elementwise`` kernels; ``silu`` is added here with the same conventions), so a chain evaluated in one
kernel computes, op after op, the very float32 operations the unfused executor launches one kernel each for:
every intermediate is a ``float`` (rounded to binary32 after every op, as the unfused graph stores it), the
route is ``nvrtc-ieee`` (no contraction, subnormals kept), and the loop is the 64-bit grid-stride loop whose
geometry comes from :func:`fused_plan` -- ``native.elementwise.launch_plan``, the plan the contract proves.

Planted codegen bugs are :data:`VARIANTS` entries (never the default): ``reorder`` swaps the first two ops of a
chain, ``no_rounding`` keeps add/sub/mul/div intermediates in double (a dropped rounding), ``int32_index`` uses
an ``int`` loop index (its plan has ``index_bits`` 32).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from native import elementwise as ew
from spec.ir.graph import Graph
from spec.ir.ops import ELEMENTWISE_OP_NAMES

__all__ = [
    "ROUTE",
    "FusedOp",
    "FUSED_OPS",
    "register_fused_op",
    "fusable",
    "CodegenVariant",
    "VARIANTS",
    "FusedKernel",
    "generate_fused_kernel",
    "fused_plan",
    "kernel_plan",
    "run_host",
    "EW_NAMES",
]

ROUTE = "nvrtc-ieee"
F32 = np.float32
_CANON_NAN = np.uint32(0x7FFFFFFF)


@dataclass(frozen=True)
class FusedOp:
    """An op a chain can contain: CUDA parameter names and body (assigns ``r``), host map, approximate flag."""

    name: str
    params: tuple[str, ...]
    body: str
    host: Callable[..., np.ndarray]
    approximate: bool = False


FUSED_OPS: dict[str, FusedOp] = {}


def register_fused_op(op: FusedOp) -> FusedOp:
    """Make IR op ``op.name`` fusable (names are unique)."""
    if op.name in FUSED_OPS:
        raise ValueError(f"fused op {op.name!r} registered twice")
    FUSED_OPS[op.name] = op
    return op


def fusable(kind: str) -> bool:
    """Whether the chain codegen has a body for IR op ``kind``."""
    return kind in FUSED_OPS


# IR op -> native.elementwise kernel whose body and host path the fused chain reuses.
EW_NAMES: dict[str, str] = ELEMENTWISE_OP_NAMES


def _ew_host(kname: str) -> Callable[..., np.ndarray]:
    def host(*xs: np.ndarray) -> np.ndarray:
        return ew.run_flat(kname, [np.ascontiguousarray(x, F32) for x in xs], device="host")[0][0]

    return host


def _canon(r: np.ndarray) -> np.ndarray:
    """The cuda environment's NaN rule: every NaN result is 0x7FFFFFFF."""
    r = np.asarray(r, F32)
    return np.where(np.isnan(r), _CANON_NAN, r.view(np.uint32)).astype(np.uint32).view(F32)


def _silu_host(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        e = np.exp(-x.astype(np.float64)).astype(F32)  # expf modelled as exp rounded once (as native.elementwise)
        return _canon(x / (F32(1) + e))


for _ir, _k in EW_NAMES.items():
    _kern = ew.get_kernel(_k)
    register_fused_op(FusedOp(_ir, _kern.inputs, _kern.body, _ew_host(_k), _kern.kind == "approx"))
register_fused_op(FusedOp("silu", ("x",), "r = x / (1.0f + expf(-x));", _silu_host, approximate=True))


@dataclass(frozen=True)
class CodegenVariant:
    """A way to generate chains: the loop index type, and the planted bugs ``reorder`` / ``wide``."""

    name: str
    index_type: str = "long long"
    reorder: bool = False
    wide: bool = False
    doc: str = ""


VARIANTS: dict[str, CodegenVariant] = {
    v.name: v
    for v in (
        CodegenVariant("default", doc="the shipped generator"),
        CodegenVariant("reorder", reorder=True, doc="PLANTED: the chain's first two ops applied in swapped order"),
        CodegenVariant("no_rounding", wide=True, doc="PLANTED: add/sub/mul/div intermediates kept in double"),
        CodegenVariant("int32_index", index_type="int", doc="PLANTED: a 32-bit grid-stride index"),
    )
}
_WIDE = {"add": "+", "sub": "-", "mul_elem": "*", "div": "/"}


@dataclass(frozen=True)
class FusedKernel:
    """A generated kernel: name, CUDA source, graph members, the ops it applies (in order) with their operand
    wiring (``k >= 0``: member k's value, ``k < 0``: kernel input ``-k - 1``), input node ids, output node id."""

    name: str
    source: str
    members: tuple[int, ...]
    ops: tuple[str, ...]
    wiring: tuple[tuple[int, ...], ...]
    inputs: tuple[int, ...]
    output: int
    variant: str = "default"
    index_bits: int = 64
    approximate: bool = False

    def describe(self) -> str:
        """One line: name, the ops with their node ids, inputs and output."""
        ops = ", ".join(f"{op} {m}" for op, m in zip(self.ops, self.members, strict=True))
        ins = ", ".join(f"in{j}=n{n}" for j, n in enumerate(self.inputs))
        return f"{self.name} [{ops}] ({ins}) -> out0=n{self.output}"


_TEMPLATE = """\
#define KC_GELU_C 0.044715f
#define KC_GELU_K 0.7978845608028654f
extern "C" __global__ void {name}({params}float* __restrict__ out0, long long n) {{
    for ({idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += ({idx})blockDim.x * gridDim.x) {{
{loads}{body}        out0[i] = (float)v{last};
    }}
}}
"""


def _wire(graph: Graph, members: Sequence[int]) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    index = {m: k for k, m in enumerate(members)}
    inputs: list[int] = []
    wiring = []
    for m in members:
        refs = []
        for p in graph[m].parents:
            if p in index:
                refs.append(index[p])
            else:
                if p not in inputs:
                    inputs.append(p)
                refs.append(-inputs.index(p) - 1)
        wiring.append(tuple(refs))
    return tuple(wiring), tuple(inputs)


def _ref(r: int) -> str:
    return f"v{r}" if r >= 0 else f"x{-r - 1}"


def _line(k: int, op: str, refs: tuple[int, ...], node: int, v: CodegenVariant) -> str:
    fop = FUSED_OPS[op]
    if v.wide and op in _WIDE:
        a, b = (_ref(r) for r in refs)
        return f"        double v{k} = (double){a} {_WIDE[op]} (double){b};  // node {node}: {op}\n"
    binds = " ".join(f"const float {p} = (float){_ref(r)};" for p, r in zip(fop.params, refs, strict=True))
    decl = "double" if v.wide else "float"
    return (
        f"        {decl} v{k}; {{ {binds} float r = 0.0f, r2 = 0.0f; (void)r2; {fop.body} v{k} = r; }}"
        f"  // node {node}: {op}\n"
    )


def generate_fused_kernel(graph: Graph, members: Sequence[int], name: str, variant: str = "default") -> FusedKernel:
    """CUDA C for the chain ``members`` (graph ids, chain order), named ``name``, built as ``variant``."""
    v = VARIANTS[variant]
    ops = [graph[m].kind for m in members]
    wiring, inputs = _wire(graph, members)
    if v.reorder and len(ops) >= 2 and len(wiring[0]) == len(wiring[1]):
        ops[0], ops[1] = ops[1], ops[0]
    params = "".join(f"const float* __restrict__ in{j}, " for j in range(len(inputs)))
    loads = "".join(f"        const float x{j} = in{j}[i];\n" for j in range(len(inputs)))
    body = "".join(_line(k, op, wiring[k], m, v) for k, (op, m) in enumerate(zip(ops, members, strict=True)))
    src = _TEMPLATE.format(name=name, params=params, idx=v.index_type, loads=loads, body=body, last=len(ops) - 1)
    return FusedKernel(
        name,
        src,
        tuple(members),
        tuple(ops),
        wiring,
        inputs,
        members[-1],
        v.name,
        32 if v.index_type == "int" else 64,
        any(FUSED_OPS[o].approximate for o in ops),
    )


def fused_plan(n: Any, block: Any = ew.DEFAULT_BLOCK, max_grid: Any = ew.DEFAULT_MAX_GRID) -> dict:
    """The launch plan of every generated kernel: the elementwise family's 64-bit grid-stride plan."""
    return ew.launch_plan(n, block, max_grid, index_bits=64)


def kernel_plan(kernel: FusedKernel, n: int) -> dict:
    """The plan a generated kernel is launched with (index width from its variant)."""
    return ew.launch_plan(n, ew.DEFAULT_BLOCK, ew.DEFAULT_MAX_GRID, index_bits=kernel.index_bits)


def run_host(kernel: FusedKernel, ins: Sequence[np.ndarray]) -> np.ndarray:
    """The host model of a generated kernel on flat float32 inputs: the same ops, in the same order."""
    wide = VARIANTS[kernel.variant].wide
    vals: list[np.ndarray] = []
    for op, refs in zip(kernel.ops, kernel.wiring, strict=True):
        args = [vals[r] if r >= 0 else ins[-r - 1] for r in refs]
        if wide and op in _WIDE:
            a, b = (np.asarray(x, np.float64) for x in args)
            with np.errstate(all="ignore"):
                vals.append({"+": a + b, "-": a - b, "*": a * b, "/": a / b}[_WIDE[op]])
        else:
            vals.append(FUSED_OPS[op].host(*[np.asarray(x, F32) for x in args]))
    return _canon(vals[-1]) if wide else np.asarray(vals[-1], F32)
