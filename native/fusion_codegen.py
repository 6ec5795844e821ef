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
    "round16",
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


def _real_host(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """Host model of a libdevice function: the real function in float64 rounded once (canonical NaN)."""

    def host(*xs: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return _canon(fn(*[np.asarray(x, F32).astype(np.float64) for x in xs]).astype(F32))

    return host


# rsqrt in double rounded once is the denotation's rsqrt bit for bit (IEEE double sqrt and division, as NumPy);
# powf, sinf, cosf are libdevice's (declared approximate; the host model is the real function rounded once).
register_fused_op(
    FusedOp("rsqrt", ("x",), "r = (float)(1.0 / sqrt((double)x));", _real_host(lambda x: 1.0 / np.sqrt(x)))
)
register_fused_op(FusedOp("pow", ("a", "b"), "r = powf(a, b);", _real_host(np.power), approximate=True))
register_fused_op(FusedOp("sin", ("x",), "r = sinf(x);", _real_host(np.sin), approximate=True))
register_fused_op(FusedOp("cos", ("x",), "r = cosf(x);", _real_host(np.cos), approximate=True))


@dataclass(frozen=True)
class CodegenVariant:
    """A way to generate chains: the loop index type, and the planted bugs ``reorder`` / ``wide``."""

    name: str
    index_type: str = "long long"
    reorder: bool = False
    wide: bool = False
    skip_round: bool = False
    doc: str = ""


VARIANTS: dict[str, CodegenVariant] = {
    v.name: v
    for v in (
        CodegenVariant("default", doc="the shipped generator"),
        CodegenVariant("reorder", reorder=True, doc="PLANTED: the chain's first two ops applied in swapped order"),
        CodegenVariant("no_rounding", wide=True, doc="PLANTED: add/sub/mul/div intermediates kept in double"),
        CodegenVariant("int32_index", index_type="int", doc="PLANTED: a 32-bit grid-stride index"),
        CodegenVariant(
            "fp16_no_round",
            skip_round=True,
            doc="PLANTED: float16 storage with the intermediates kept in float (only the stored result rounded)",
        ),
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
    storage: str = "float32"

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


# float16 storage: every op computes in float (the elementwise family's body) and its result is rounded to
# binary16 at once (cvt.rn.f16.f32, NaN -> 0x7FFF), exactly as an unfused graph stores every value in binary16.
_TEMPLATE16 = """\
#define KC_GELU_C 0.044715f
#define KC_GELU_K 0.7978845608028654f
__device__ __forceinline__ float kc_h2f(unsigned short h) {{
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}}
__device__ __forceinline__ unsigned short kc_f2h(float f) {{
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return (f != f) ? (unsigned short)0x7fff : h;
}}
__device__ __forceinline__ float kc_round16(float f) {{ return kc_h2f(kc_f2h(f)); }}
extern "C" __global__ void {name}({params}unsigned short* __restrict__ out0, long long n) {{
    for ({idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += ({idx})blockDim.x * gridDim.x) {{
{loads}{body}        out0[i] = kc_f2h(v{last});
    }}
}}
"""


def round16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to binary16 (RNE, subnormals kept, overflow to Inf), every NaN 0x7FFF."""
    with np.errstate(all="ignore"):
        h = np.asarray(a, F32).astype(np.float16)
    return np.where(np.isnan(h), np.uint16(0x7FFF), h.view(np.uint16)).astype(np.uint16).view(np.float16)


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


def _line(k: int, op: str, refs: tuple[int, ...], node: int, v: CodegenVariant, half: bool = False) -> str:
    fop = FUSED_OPS[op]
    if v.wide and op in _WIDE:
        a, b = (_ref(r) for r in refs)
        return f"        double v{k} = (double){a} {_WIDE[op]} (double){b};  // node {node}: {op}\n"
    binds = " ".join(f"const float {p} = (float){_ref(r)};" for p, r in zip(fop.params, refs, strict=True))
    decl = "double" if v.wide else "float"
    res = "kc_round16(r)" if half and not v.skip_round else "r"
    return (
        f"        {decl} v{k}; {{ {binds} float r = 0.0f, r2 = 0.0f; (void)r2; {fop.body} v{k} = {res}; }}"
        f"  // node {node}: {op}\n"
    )


def generate_fused_kernel(
    graph: Graph, members: Sequence[int], name: str, variant: str = "default", storage: str = "float32"
) -> FusedKernel:
    """CUDA C for the chain ``members`` (graph ids, chain order), named ``name``, built as ``variant``, with
    values stored as ``storage`` (float32, or float16 rounded after every op)."""
    v = VARIANTS[variant]
    half = storage == "float16"
    if storage not in ("float32", "float16"):
        raise ValueError(f"unknown storage {storage!r}")
    ops = [graph[m].kind for m in members]
    wiring, inputs = _wire(graph, members)
    if v.reorder and len(ops) >= 2 and len(wiring[0]) == len(wiring[1]):
        ops[0], ops[1] = ops[1], ops[0]
    ctype, load = ("unsigned short", "kc_h2f(in{j}[i])") if half else ("float", "in{j}[i]")
    params = "".join(f"const {ctype}* __restrict__ in{j}, " for j in range(len(inputs)))
    loads = "".join(f"        const float x{j} = {load.format(j=j)};\n" for j in range(len(inputs)))
    body = "".join(_line(k, op, wiring[k], m, v, half) for k, (op, m) in enumerate(zip(ops, members, strict=True)))
    src = (_TEMPLATE16 if half else _TEMPLATE).format(
        name=name, params=params, idx=v.index_type, loads=loads, body=body, last=len(ops) - 1
    )
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
        storage,
    )


def fused_plan(n: Any, block: Any = ew.DEFAULT_BLOCK, max_grid: Any = ew.DEFAULT_MAX_GRID) -> dict:
    """The launch plan of every generated kernel: the elementwise family's 64-bit grid-stride plan."""
    return ew.launch_plan(n, block, max_grid, index_bits=64)


def kernel_plan(kernel: FusedKernel, n: int) -> dict:
    """The plan a generated kernel is launched with (index width from its variant)."""
    return ew.launch_plan(n, ew.DEFAULT_BLOCK, ew.DEFAULT_MAX_GRID, index_bits=kernel.index_bits)


def run_host(kernel: FusedKernel, ins: Sequence[np.ndarray]) -> np.ndarray:
    """The host model of a generated kernel on flat inputs of its storage type: the same ops, in the same order
    (float16 storage: inputs widened to float, every op's result rounded to binary16 unless the variant skips it)."""
    v = VARIANTS[kernel.variant]
    half = kernel.storage == "float16"
    vals: list[np.ndarray] = []
    for op, refs in zip(kernel.ops, kernel.wiring, strict=True):
        args = [vals[r] if r >= 0 else np.asarray(ins[-r - 1]).astype(F32) for r in refs]
        if v.wide and op in _WIDE:
            a, b = (np.asarray(x, np.float64) for x in args)
            with np.errstate(all="ignore"):
                vals.append({"+": a + b, "-": a - b, "*": a * b, "/": a / b}[_WIDE[op]])
        else:
            r = FUSED_OPS[op].host(*[np.asarray(x, F32) for x in args])
            vals.append(round16(r).astype(F32) if half and not v.skip_round else r)
    if half:
        return round16(np.asarray(vals[-1], F32))
    return _canon(vals[-1]) if v.wide else np.asarray(vals[-1], F32)
