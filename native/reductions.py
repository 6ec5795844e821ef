"""Reductions (sum, mean, max over a buffer or along an axis; scatter-add): plans, host and CUDA kernels.

Three accumulation orders, each its own claim (contracts/reductions-v1.yaml):

* ``fold`` — one thread per output folds its axis from +0 in index order: bitwise the reference's
  reduce-sum-left. Whole buffer, rows, columns and an axis of an N-d tensor are one kernel over the
  (outer, length, inner) view; ``max`` and ``mean`` use the same kernel with another combine/final step.
* ``tree`` — fixed, reproducible, not the fold: :func:`tree_plan` (256-thread blocks, grid-stride partial
  sums per thread, a shared-memory tree ``sh[t] += sh[t + s]``, repeated over the block partials). The grid
  depends on ``n`` only (never on the device), so the bits are a function of the input alone.
* ``atomic`` — pass 1 of the tree, then one ``atomicAdd`` per block into the result: no fixed order, and
  ``atomicAdd(float*)`` on global memory flushes subnormals whatever ``-ftz`` says (float-facts.md). Only
  an error bound is claimed. The host model adds the block partials in a fresh random order per run, with
  the flush, so the same determinism item refutes a reproducibility claim on the host too.

Kernels compile through :mod:`native.nvrtc` (route ``nvrtc-ieee``: subnormals kept, no contraction, IEEE
division), never CuPy's stock route (it forces ``-ftz=true``). Host paths are NumPy float32 in the same
order; NaN results are written as the CUDA canonical NaN 0x7FFFFFFF, like the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from native.elementwise import launch_plan
from native.nvrtc import compile_function, get_route
from obligations.core.device import array_module, resolve_device
from obligations.core.entrypoints import entry_point
from obligations.core.symbolic import all_of, as_type, cdiv, smax, smin

__all__ = [
    "BLOCK",
    "MAX_GRID",
    "UNROLL",
    "MAX_ELEMENTS",
    "ROUTE",
    "TreePlan",
    "tree_plan",
    "pass_grids",
    "AxisPlan",
    "axis_plan",
    "axis_admissible",
    "ScatterPlan",
    "scatter_plan",
    "MAX_SCATTER_KEYS",
    "TreeOrder",
    "TREE_ORDERS",
    "register_tree_order",
    "STANDARD",
    "fold_sum",
    "fold_max",
    "mean",
    "tree_sum",
    "atomic_sum",
    "scatter_add",
    "SUMS",
    "tree_source",
    "MainLoop",
    "MAIN_LOOPS",
    "IN_ORDER",
    "register_main_loop",
    "dot",
    "sum_vjp",
    "mean_vjp",
    "max_vjp",
    "VJP_SOURCE",
]

BLOCK = 256
# Fixed (not per-device) so the tree, hence the bits, depend on n alone; 2048 x 256 threads fill an H100.
MAX_GRID = 2048
# Loads issued ahead of the (still sequential) adds: memory-level parallelism without reordering.
UNROLL = 8
# Largest input the kernels accept (2^40 elements = 4 TiB of float32): every int64 index stays far from 2^63.
MAX_ELEMENTS = 1 << 40
ROUTE = "nvrtc-ieee"
CANONICAL_NAN = np.uint32(0x7FFFFFFF)
F32 = np.float32


# -- plans (ints at launch time, checker terms in kc check) -------------------------------------------


@dataclass(frozen=True)
class TreePlan:
    """One pass of the tree: ``grid`` blocks of ``block`` threads; thread t reads t, t + stride, ..."""

    n: Any
    block: Any
    grid: Any
    stride: Any
    trips: Any
    unroll: Any
    max_grid: Any = MAX_GRID

    def index(self, t: Any, k: Any) -> Any:
        """Element read by thread ``t`` on trip ``k`` (int64)."""
        return as_type(t, "int64") + as_type(k, "int64") * self.stride

    def owner(self, i: Any) -> Any:
        """The thread that reads element ``i``."""
        return i % self.stride

    def trip(self, i: Any) -> Any:
        """The trip on which element ``i`` is read."""
        return i // self.stride

    def unrolled_probe(self, i: Any) -> Any:
        """The furthest index the unrolled loop computes from position ``i`` (its guard and step)."""
        return as_type(i, "int64") + self.unroll * self.stride

    def regimes(self) -> dict[str, Any]:
        """Code paths of one pass: empty, tail loop only, the unrolled main loop, several passes, grid at its cap."""
        main = self.n > (self.unroll - 1) * self.stride  # thread 0 runs the unrolled loop at least once
        return {
            "empty": self.n == 0,
            "tail_only": (self.n > 0) & (self.n <= (self.unroll - 1) * self.stride),
            "main_loop": main,
            "multi_pass": self.grid > 1,
            "grid_capped": cdiv(self.n, self.block) > self.max_grid,
        }


def tree_plan(n: Any, block: Any = BLOCK, max_grid: Any = MAX_GRID, unroll: Any = UNROLL) -> TreePlan:
    """Grid of one tree pass over ``n`` elements: grid = min(max(cdiv(n, block), 1), max_grid)."""
    grid = smin(smax(cdiv(n, block), 1), max_grid)
    stride = as_type(grid, "int64") * block
    return TreePlan(n, block, grid, stride, cdiv(n, stride), unroll, max_grid)


def pass_grids(n: int, block: int = BLOCK, max_grid: int = MAX_GRID) -> list[int]:
    """Grids of the successive passes for n elements; the last pass has one block (one result)."""
    grids = [int(tree_plan(n, block, max_grid).grid)]
    while grids[-1] > 1:
        grids.append(int(tree_plan(grids[-1], block, max_grid).grid))
    return grids


@dataclass(frozen=True)
class AxisPlan:
    """An axis reduction over the row-major (outer, length, inner) view: one output per (o, i)."""

    outer: Any
    length: Any
    inner: Any
    outputs: Any
    total: Any
    admissible: Any

    def offset(self, o: Any, k: Any, i: Any) -> Any:
        """Element offset of x[o, k, i] (int64)."""
        return (as_type(o, "int64") * self.length + k) * self.inner + i

    def out_offset(self, o: Any, i: Any) -> Any:
        """Offset of out[o, i]."""
        return as_type(o, "int64") * self.inner + i


def axis_admissible(outer: Any, length: Any, inner: Any) -> Any:
    """outer, length, inner >= 0 and outer * length * inner <= MAX_ELEMENTS (an (outer, length, inner) view)."""
    # Checked by division (never by the product, which is what could overflow): outer*length*inner <= limit.
    per_outer = MAX_ELEMENTS // smax(as_type(outer, "int64"), 1)
    return all_of(
        outer >= 0,
        length >= 0,
        inner >= 0,
        length <= per_outer,
        inner <= per_outer // smax(as_type(length, "int64"), 1),
    )


def axis_plan(outer: Any, length: Any, inner: Any) -> AxisPlan:
    """Sizes of an axis reduction; element counts are int64; ``admissible``: at most MAX_ELEMENTS elements."""
    admissible = axis_admissible(outer, length, inner)
    outputs = as_type(outer, "int64") * inner
    return AxisPlan(outer, length, inner, outputs, outputs * length, admissible)


# Sort keys of scatter-add are (target, source position) packed as target * m + j in int64; the guard admits
# calls whose keys stay below 2^62.
MAX_SCATTER_KEYS = 1 << 62


@dataclass(frozen=True)
class ScatterPlan:
    """Deterministic scatter-add of ``m`` sources into ``n_out`` outputs: the int64 sort key of each source."""

    m: Any
    n_out: Any
    keys: Any
    admissible: Any

    def key(self, i: Any, j: Any) -> Any:
        """Sort key of source ``j`` targeting output ``i``: unique, ordered by (i, j) (int64)."""
        return as_type(i, "int64") * self.m + j


def scatter_plan(m: Any, n_out: Any) -> ScatterPlan:
    """Key space of a scatter-add; ``admissible``: n_out * m <= MAX_SCATTER_KEYS (checked by division)."""
    admissible = all_of(m >= 0, n_out >= 0, n_out <= MAX_SCATTER_KEYS // smax(as_type(m, "int64"), 1))
    return ScatterPlan(m, n_out, as_type(n_out, "int64") * m, admissible)


# -- tree combine orders (a registry: planted bugs register another order) ------------------------------


@dataclass(frozen=True)
class TreeOrder:
    """How a block combines its threads' partials: CUDA loop and the NumPy model of the same loop."""

    name: str
    cuda: str
    host: Callable[[np.ndarray], np.ndarray]
    doc: str = ""


def _host_halving(sh: np.ndarray) -> np.ndarray:
    """sh[:, t] = sh[:, t] + sh[:, t + s] for s = block/2 .. 1; result sh[:, 0]."""
    sh = sh.copy()
    s = sh.shape[1] // 2
    while s >= 1:
        sh[:, :s] = sh[:, :s] + sh[:, s : 2 * s]
        s //= 2
    return sh[:, 0]


TREE_ORDERS: dict[str, TreeOrder] = {}


def register_tree_order(order: TreeOrder) -> TreeOrder:
    """Add a combine order by name (names are unique)."""
    if order.name in TREE_ORDERS and TREE_ORDERS[order.name] != order:
        raise ValueError(f"tree order {order.name!r} is registered twice")
    TREE_ORDERS[order.name] = order
    return order


STANDARD = register_tree_order(
    TreeOrder(
        "halving",
        "for (int s = {block} / 2; s > 0; s >>= 1) {{ if (t < s) sh[t] = sh[t] + sh[t + s]; __syncthreads(); }}",
        _host_halving,
        "the stated tree: sh[t] += sh[t + s], s = block/2 .. 1",
    )
)


@dataclass(frozen=True)
class MainLoop:
    """The adds of the unrolled main loop: CUDA statement over ``v[0..unroll)`` and the order of ``u`` it adds."""

    name: str
    cuda: str
    host: Callable[[int], list[int]]
    doc: str = ""


MAIN_LOOPS: dict[str, MainLoop] = {}


def register_main_loop(loop: MainLoop) -> MainLoop:
    """Add a main-loop body by name (names are unique)."""
    if loop.name in MAIN_LOOPS and MAIN_LOOPS[loop.name] != loop:
        raise ValueError(f"main loop {loop.name!r} is registered twice")
    MAIN_LOOPS[loop.name] = loop
    return loop


IN_ORDER = register_main_loop(
    MainLoop(
        "in_order",
        "for (int u = 0; u < {unroll}; ++u) acc = acc + v[u];",
        lambda unroll: list(range(unroll)),
        "the loads of a group are added in trip order (no reassociation)",
    )
)


# -- CUDA sources ---------------------------------------------------------------------------------------

_MAXIMUM = """\
__device__ __forceinline__ float kc_maximum(float a, float b) {
    if (a != a || b != b) return __int_as_float(0x7fffffff);
    if (a == b) return __int_as_float(__float_as_int(a) & __float_as_int(b));  // max(-0, +0) = +0
    return a > b ? a : b;
}
"""

_AXIS = """\
extern "C" __global__ void kc_axis_{name}(const float* __restrict__ x, float* __restrict__ out,
                                          long long outer, long long len, long long inner) {{
    const long long total = outer * inner;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < total;
         j += (long long)blockDim.x * gridDim.x) {{
        const long long o = j / inner, i = j - o * inner;
        const float* p = x + o * len * inner + i;
        float acc = {init};
        for (long long k = 0; k < len; ++k) {{ const float v = p[k * inner]; acc = {combine}; }}
        out[j] = {final};
    }}
}}
"""

_AXIS_OPS: dict[str, tuple[str, str, str]] = {
    "sum": ("0.0f", "acc + v", "acc"),
    "max": ("__int_as_float(0xff800000)", "kc_maximum(acc, v)", "acc"),
    "mean": ("0.0f", "acc + v", "acc / (float)len"),
}

_TREE = """\
extern "C" __global__ void kc_tree_{name}(const float* __restrict__ x, float* __restrict__ out, long long n) {{
    __shared__ float sh[{block}];
    const int t = threadIdx.x;
    const long long S = (long long)gridDim.x * {block};
    long long i = (long long)blockIdx.x * {block} + t;
    float acc = 0.0f;
    // Loads are issued {unroll} at a time; the adds stay in trip order (no reassociation without fast-math).
    for (; i + ({unroll} - 1) * S < n; i += {unroll} * S) {{
        float v[{unroll}];
        #pragma unroll
        for (int u = 0; u < {unroll}; ++u) v[u] = x[i + u * S];
        #pragma unroll
        {main}
    }}
    for (; i < n; i += S) acc = acc + x[i];
    sh[t] = acc;
    __syncthreads();
    {combine}
    if (t == 0) {{ {store} }}
}}
"""

_STORES: dict[str, str] = {"tree": "out[blockIdx.x] = sh[0];", "atomic": "atomicAdd(out, sh[0]);"}

_SCATTER = """\
extern "C" __global__ void kc_scatter_segments(const float* __restrict__ src_sorted,
        const long long* __restrict__ starts, const long long* __restrict__ ends, float* __restrict__ out,
        long long n_out) {
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n_out;
         j += (long long)blockDim.x * gridDim.x) {
        float acc = out[j];
        for (long long p = starts[j]; p < ends[j]; ++p) acc = acc + src_sorted[p];
        out[j] = acc;
    }
}
"""

_DIV = """\
extern "C" __global__ void kc_div_count(float* v, long long count) { v[0] = v[0] / (float)count; }
"""


def tree_source(
    kind: str, order: TreeOrder = STANDARD, plan: TreePlan | None = None, loop: MainLoop = IN_ORDER
) -> tuple[str, str]:
    """(CUDA source, function name) of a tree pass ("tree") or the atomic pass ("atomic").

    Block size and unroll factor are the plan's (default: the shipped plan), never written a second time.
    """
    plan = plan or tree_plan(0)
    block, unroll = int(plan.block), int(plan.unroll)
    suffix = "" if (block, unroll) == (BLOCK, UNROLL) else f"_b{block}_u{unroll}"
    name = f"{kind}_{order.name}" + ("" if loop is IN_ORDER else f"_{loop.name}") + suffix
    src = _TREE.format(
        name=name,
        block=block,
        unroll=unroll,
        combine=order.cuda.format(block=block),
        main=loop.cuda.format(unroll=unroll),
        store=_STORES[kind],
    )
    return src, f"kc_tree_{name}"


def _fn(src: str, name: str) -> Any:
    return compile_function(src, name, ROUTE)


# -- host models (NumPy float32, same order) -------------------------------------------------------------


def _canon(a: np.ndarray) -> np.ndarray:
    """NaNs as the CUDA canonical NaN (x86 would keep payloads and signs)."""
    a = np.asarray(a, dtype=F32)
    return np.where(np.isnan(a), CANONICAL_NAN, a.view(np.uint32)).astype(np.uint32).view(F32)


def _ieee_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    nan = np.isnan(a) | np.isnan(b)
    tie = a == b
    tied = (a.view(np.uint32) & b.view(np.uint32)).view(F32)
    return np.where(nan, np.float32(np.nan), np.where(tie, tied, np.where(a > b, a, b))).astype(F32)


_HOST_AXIS: dict[str, tuple[float, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "sum": (0.0, lambda acc, v: (acc + v).astype(F32)),
    "max": (-np.inf, _ieee_max),
    "mean": (0.0, lambda acc, v: (acc + v).astype(F32)),
}


def _host_axis(op: str, x3: np.ndarray) -> np.ndarray:
    init, combine = _HOST_AXIS[op]
    acc = np.full((x3.shape[0], x3.shape[2]), init, dtype=F32)
    with np.errstate(all="ignore"):
        for k in range(x3.shape[1]):
            acc = combine(acc, x3[:, k, :])
        if op == "mean":
            acc = (acc / F32(x3.shape[1])).astype(F32)
    return _canon(acc)


def _host_pass_partials(x: np.ndarray, plan: TreePlan, order: TreeOrder, loop: MainLoop = IN_ORDER) -> np.ndarray:
    """One pass as the kernel runs it: thread t's unrolled groups (in ``loop``'s order), its tail, the block tree."""
    n, stride, unroll, grid = x.shape[0], int(plan.stride), int(plan.unroll), int(plan.grid)
    acc = np.zeros(stride, dtype=F32)
    trips = -(-n // stride)
    # Thread t runs group q of the main loop iff t + (q * unroll + unroll - 1) * stride < n: a prefix of threads.
    main = [max(0, min(stride, n - (q * unroll + unroll - 1) * stride)) for q in range(trips // unroll + 1)]
    with np.errstate(all="ignore"):
        for q, live in enumerate(main):
            for u in loop.host(unroll) if live else ():
                k = q * unroll + u
                acc[:live] = acc[:live] + x[k * stride : k * stride + live]
        for k in range(trips):  # the tail: trips after a thread's last full group, in trip order
            lo, hi = main[k // unroll], max(0, min(stride, n - k * stride))
            if hi > lo:
                acc[lo:hi] = acc[lo:hi] + x[k * stride + lo : k * stride + hi]
        return order.host(acc.reshape(grid, int(plan.block))).astype(F32)


def _flush(a: np.ndarray) -> np.ndarray:
    return np.where(np.abs(a) < np.finfo(F32).tiny, np.copysign(F32(0), a), a).astype(F32)


# -- the shared front end --------------------------------------------------------------------------------


def _axis_view(x: Any, axis: int | None) -> tuple[Any, tuple[int, ...], tuple[int, int, int]]:
    """(contiguous flat x, output shape, (outer, length, inner)) for a reduction over ``axis``."""
    shape = tuple(int(s) for s in x.shape)
    if axis is None:
        return x.reshape(-1), (), (1, int(np.prod(shape, dtype=np.int64)), 1)
    ax = axis % len(shape)
    outer = int(np.prod(shape[:ax], dtype=np.int64))
    inner = int(np.prod(shape[ax + 1 :], dtype=np.int64))
    return x.reshape(-1), shape[:ax] + shape[ax + 1 :], (outer, shape[ax], inner)


def _axis_reduce(op: str, x: Any, axis: int | None, device: str) -> Any:
    dev = resolve_device(device)
    xp = array_module(dev)
    x = xp.ascontiguousarray(xp.asarray(x, dtype=xp.float32))
    flat, out_shape, (outer, length, inner) = _axis_view(x, axis)
    if not axis_plan(outer, length, inner).admissible:
        raise ValueError(f"reduction over {outer} x {length} x {inner} elements exceeds {MAX_ELEMENTS}")
    if dev == "host":
        return _host_axis(op, flat.reshape(outer, length, inner)).reshape(out_shape)
    out = xp.empty(outer * inner, dtype=xp.float32)
    if outer * inner:
        init, combine, final = _AXIS_OPS[op]
        # _MAXIMUM is prepended after formatting: its braces are C, not format fields.
        fn = _fn(_MAXIMUM + _AXIS.format(name=op, init=init, combine=combine, final=final), f"kc_axis_{op}")
        plan = launch_plan(outer * inner)
        fn((int(plan["grid"]),), (int(plan["block"]),), (flat, out, np.int64(outer), np.int64(length), np.int64(inner)))
    return out.reshape(out_shape)


@entry_point("reductions")
def fold_sum(x: Any, axis: int | None = None, device: str = "auto") -> Any:
    """Sum by left fold from +0 along ``axis`` (None: the whole buffer; empty: +0)."""
    return _axis_reduce("sum", x, axis, device)


@entry_point("reductions")
def fold_max(x: Any, axis: int | None = None, device: str = "auto") -> Any:
    """IEEE maximum (NaN if any NaN, -0 < +0) along ``axis``; an empty reduction gives -Inf."""
    return _axis_reduce("max", x, axis, device)


@entry_point("reductions", axes={"order": ("fold", "tree")})
def mean(
    x: Any,
    axis: int | None = None,
    device: str = "auto",
    order: str = "fold",
    block: int = BLOCK,
    max_grid: int = MAX_GRID,
    unroll: int = UNROLL,
) -> Any:
    """Fold (or whole-buffer tree, launched with the given knobs) sum divided once by float32(length); empty: NaN."""
    if order == "fold":
        return _axis_reduce("mean", x, axis, device)
    if axis is not None:
        raise ValueError("the tree order reduces the whole buffer only")
    dev = resolve_device(device)
    xp = array_module(dev)
    total = _run_tree(x, dev, "tree", STANDARD, block, max_grid, unroll)
    n = int(xp.asarray(x).size)
    if dev == "host":
        with np.errstate(all="ignore"):
            return _canon(np.asarray(total / F32(n), dtype=F32))
    buf = total.reshape(1).copy()
    _fn(_DIV, "kc_div_count")((1,), (1,), (buf, np.int64(n)))
    return buf.reshape(())


def _run_tree(
    x: Any,
    device: str,
    kind: str,
    order: TreeOrder,
    block: int = BLOCK,
    max_grid: int = MAX_GRID,
    unroll: int = UNROLL,
    loop: MainLoop = IN_ORDER,
) -> Any:
    dev = resolve_device(device)
    xp = array_module(dev)
    flat = xp.ascontiguousarray(xp.asarray(x, dtype=xp.float32)).reshape(-1)
    n = int(flat.size)
    if n > MAX_ELEMENTS:
        raise ValueError(f"reduction over {n} elements exceeds {MAX_ELEMENTS}")
    grids = pass_grids(n, block, max_grid)
    if dev == "host":
        part = _host_pass_partials(flat, tree_plan(n, block, max_grid, unroll), order, loop)
        if kind == "atomic":
            acc = F32(0)
            with np.errstate(all="ignore"):
                # A fresh order per run, deliberately unseeded: the hardware's atomics promise none either.
                for p in part[np.random.default_rng().permutation(part.shape[0])]:
                    acc = _flush(np.asarray(acc + p, dtype=F32))[()]
            return _canon(np.asarray(acc, dtype=F32))
        for _ in grids[1:]:
            part = _host_pass_partials(part, tree_plan(part.shape[0], block, max_grid, unroll), order, loop)
        return _canon(part[0])
    plan = tree_plan(n, block, max_grid, unroll)
    if kind == "atomic":
        out = xp.zeros(1, dtype=xp.float32)
        src, name = tree_source("atomic", order, plan, loop)
        _fn(src, name)((int(plan.grid),), (int(plan.block),), (flat, out, np.int64(n)))
        return out.reshape(())
    src, name = tree_source("tree", order, plan, loop)
    fn = _fn(src, name)
    cur, m = flat, n
    for g in grids:
        p = tree_plan(m, block, max_grid, unroll)  # the launch geometry of each pass is its plan's
        nxt = xp.empty(int(p.grid), dtype=xp.float32)
        fn((int(p.grid),), (int(p.block),), (cur, nxt, np.int64(m)))
        cur, m = nxt, g
    return cur.reshape(())


@entry_point("reductions")
def tree_sum(
    x: Any,
    device: str = "auto",
    order: TreeOrder = STANDARD,
    block: int = BLOCK,
    max_grid: int = MAX_GRID,
    unroll: int = UNROLL,
    loop: MainLoop = IN_ORDER,
) -> Any:
    """Deterministic fixed-tree sum of the whole buffer (empty: +0), launched with the plan's knobs."""
    return _run_tree(x, device, "tree", order, block, max_grid, unroll, loop)


@entry_point("reductions")
def atomic_sum(x: Any, device: str = "auto") -> Any:
    """Fast sum: block trees then one atomicAdd per block (no fixed order; subnormal results flushed)."""
    return _run_tree(x, device, "atomic", STANDARD)


@entry_point("reductions")
def scatter_add(out: Any, idx: Any, src: Any, device: str = "auto") -> Any:
    """out[idx[j]] += src[j], duplicates in increasing j; returns a new array (``out`` is not modified)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    res = xp.array(out, dtype=xp.float32, copy=True).reshape(-1)
    idx = xp.asarray(idx, dtype=xp.int64).reshape(-1)
    src = xp.asarray(src, dtype=xp.float32).reshape(-1)
    if idx.shape != src.shape:
        raise ValueError(f"scatter_add: {idx.size} indices for {src.size} sources")
    if idx.size == 0:
        return res
    if int(idx.min()) < 0 or int(idx.max()) >= res.size:
        raise IndexError(f"scatter_add: index out of range [0, {res.size})")
    plan = scatter_plan(int(idx.size), int(res.size))
    if not plan.admissible:
        raise ValueError(
            f"scatter_add: {idx.size} sources into {res.size} outputs exceed the int64 key space (n_out * m <= 2^62)"
        )
    # Unique keys (index, source position): any sort gives the same order, so the order is the source's.
    keys = plan.key(idx, xp.arange(idx.size, dtype=xp.int64))
    perm = xp.argsort(keys)
    sidx, ssrc = idx[perm], src[perm]
    targets = xp.arange(res.size, dtype=xp.int64)
    starts = xp.searchsorted(sidx, targets, side="left").astype(xp.int64)
    ends = xp.searchsorted(sidx, targets, side="right").astype(xp.int64)
    if dev == "host":
        with np.errstate(all="ignore"):
            for r in range(int((ends - starts).max())):
                live = starts + r < ends
                res[live] = res[live] + ssrc[(starts + r)[live]]
        # NaN sums come out canonical, as the GPU's adds give them; an output no source reaches keeps its bits
        return np.where(ends > starts, _canon(res), res)
    launch = launch_plan(int(res.size))
    _fn(_SCATTER, "kc_scatter_segments")(
        (int(launch["grid"]),),
        (int(launch["block"]),),
        (xp.ascontiguousarray(ssrc), starts, ends, res, np.int64(res.size)),
    )
    return res


# -- dot product and the VJPs of sum, mean and max (MK-12, MK-13) ------------------------------------------

VJP_SOURCE = """\
__device__ __forceinline__ int kc_max_key(float v) {
    const int s = __float_as_int(v);
    if (v != v) return 0x7fffffff;  // every NaN above every number; the first NaN wins (later ones are not greater)
    return s < 0 ? (s ^ 0x7fffffff) : s;  // -0 < +0
}
extern "C" __global__ void kc_axis_dot(const float* __restrict__ x, const float* __restrict__ y,
                                       float* __restrict__ out, long long outer, long long len, long long inner) {
    const long long total = outer * inner;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < total;
         j += (long long)blockDim.x * gridDim.x) {
        const long long o = j / inner, i = j - o * inner, base = o * len * inner + i;
        float acc = 0.0f;
        for (long long k = 0; k < len; ++k) acc = acc + __fmul_rn(x[base + k * inner], y[base + k * inner]);
        out[j] = acc;
    }
}
extern "C" __global__ void kc_axis_spread(const float* __restrict__ dy, float* __restrict__ dx, long long outer,
                                          long long len, long long inner, int divide) {
    const long long total = outer * len * inner;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < total;
         p += (long long)blockDim.x * gridDim.x) {
        const long long i = p % inner, o = p / (len * inner);
        const float g = dy[o * inner + i];
        dx[p] = divide ? g / (float)len : g;
    }
}
extern "C" __global__ void kc_axis_max_vjp(const float* __restrict__ x, const float* __restrict__ dy,
                                           float* __restrict__ dx, long long outer, long long len, long long inner) {
    const long long total = outer * inner;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < total;
         j += (long long)blockDim.x * gridDim.x) {
        const long long o = j / inner, i = j - o * inner, base = o * len * inner + i;
        long long best = 0;
        int key = len > 0 ? kc_max_key(x[base]) : 0;
        for (long long k = 1; k < len; ++k) {
            const int kk = kc_max_key(x[base + k * inner]);
            if (kk > key) { key = kk; best = k; }
        }
        for (long long k = 0; k < len; ++k) dx[base + k * inner] = (k == best) ? dy[j] : 0.0f;
    }
}
"""


def _axis_args(x: Any, axis: int | None, device: str) -> tuple[str, Any, Any, tuple[int, ...], tuple[int, int, int]]:
    dev = resolve_device(device)
    xp = array_module(dev)
    x = xp.ascontiguousarray(xp.asarray(x, dtype=xp.float32))
    flat, out_shape, dims = _axis_view(x, axis)
    if not axis_plan(*dims).admissible:
        raise ValueError(f"reduction over {dims[0]} x {dims[1]} x {dims[2]} elements exceeds {MAX_ELEMENTS}")
    return dev, xp, flat, out_shape, dims


def _vjp_launch(name: str, count: int, args: tuple) -> None:
    if count:
        plan = launch_plan(count)
        _fn(VJP_SOURCE, name)((int(plan["grid"]),), (int(plan["block"]),), args)


@entry_point("reductions")
def dot(x: Any, y: Any, axis: int | None = None, device: str = "auto") -> Any:
    """Dot product along ``axis`` (None: whole buffers): the left fold from +0 of fl(x * y), no fused multiply-add."""
    dev, xp, fx, out_shape, (outer, length, inner) = _axis_args(x, axis, device)
    fy = xp.ascontiguousarray(xp.asarray(y, dtype=xp.float32)).reshape(-1)
    if fy.shape != fx.shape:
        raise ValueError(f"dot: {fx.size} and {fy.size} elements")
    if dev == "host":
        with np.errstate(all="ignore"):
            prods = (fx * fy).astype(F32)
        return _host_axis("sum", prods.reshape(outer, length, inner)).reshape(out_shape)
    out = xp.empty(outer * inner, dtype=xp.float32)
    _vjp_launch("kc_axis_dot", outer * inner, (fx, fy, out, np.int64(outer), np.int64(length), np.int64(inner)))
    return out.reshape(out_shape)


def _spread(dy: Any, x_shape: tuple[int, ...], axis: int | None, device: str, divide: bool) -> Any:
    dev = resolve_device(device)
    xp = array_module(dev)
    if axis is None:
        out_shape, (outer, length, inner) = (), (1, int(np.prod(x_shape, dtype=np.int64)), 1)
    else:
        ax = axis % len(x_shape)
        outer, inner = int(np.prod(x_shape[:ax], dtype=np.int64)), int(np.prod(x_shape[ax + 1 :], dtype=np.int64))
        out_shape, length = x_shape[:ax] + x_shape[ax + 1 :], int(x_shape[ax])
    d = xp.ascontiguousarray(xp.asarray(dy, dtype=xp.float32)).reshape(-1)
    if d.size != outer * inner or not axis_plan(outer, length, inner).admissible:
        raise ValueError(f"vjp: dy of {d.size} elements for outputs of shape {out_shape}")
    if dev == "host":
        g = d.reshape(outer, 1, inner)
        if divide:
            with np.errstate(all="ignore"):
                g = _canon((g / F32(length)).astype(F32))
        return np.ascontiguousarray(np.broadcast_to(g, (outer, length, inner))).reshape(x_shape)
    dx = xp.empty(outer * length * inner, dtype=xp.float32)
    args = (d, dx, np.int64(outer), np.int64(length), np.int64(inner), np.int32(divide))
    _vjp_launch("kc_axis_spread", outer * length * inner, args)
    return dx.reshape(x_shape)


@entry_point("reductions")
def sum_vjp(dy: Any, x_shape: tuple[int, ...], axis: int | None = None, device: str = "auto") -> Any:
    """The VJP of a sum over ``axis`` of an ``x_shape`` input: ``dy`` broadcast back along the reduced axis."""
    return _spread(dy, tuple(x_shape), axis, device, False)


@entry_point("reductions")
def mean_vjp(dy: Any, x_shape: tuple[int, ...], axis: int | None = None, device: str = "auto") -> Any:
    """The VJP of a mean: fl(dy / fl(length)) broadcast back along the reduced axis."""
    return _spread(dy, tuple(x_shape), axis, device, True)


@entry_point("reductions")
def max_vjp(x: Any, dy: Any, axis: int | None = None, device: str = "auto") -> Any:
    """The VJP of a max: ``dy`` routed to the first argmax along ``axis`` (first NaN; +0 above -0), +0 elsewhere."""
    dev, xp, fx, out_shape, (outer, length, inner) = _axis_args(x, axis, device)
    d = xp.ascontiguousarray(xp.asarray(dy, dtype=xp.float32)).reshape(-1)
    if d.size != outer * inner:
        raise ValueError(f"max_vjp: dy of {d.size} elements for outputs of shape {out_shape}")
    shape = tuple(int(v) for v in xp.asarray(x).shape)
    if dev == "host":
        u = fx.view(np.uint32).reshape(outer, length, inner).astype(np.int64)
        s = np.where(u >= 1 << 31, u - (1 << 32), u)
        keys = np.where(s < 0, s ^ 0x7FFFFFFF, s)
        keys = np.where((u & 0x7FFFFFFF) > 0x7F800000, 0x7FFFFFFF, keys)
        dx = np.zeros((outer, length, inner), dtype=F32)
        if length:
            best = np.argmax(keys, axis=1)  # the first maximal key, as the kernel's strict > scan keeps it
            np.put_along_axis(dx, best[:, None, :], d.reshape(outer, 1, inner), axis=1)
        return dx.reshape(shape)
    dx = xp.empty(outer * length * inner, dtype=xp.float32)
    _vjp_launch("kc_axis_max_vjp", outer * inner, (fx, d, dx, np.int64(outer), np.int64(length), np.int64(inner)))
    return dx.reshape(shape)


SUMS: dict[str, Callable[..., Any]] = {"fold": fold_sum, "tree": tree_sum, "atomic": atomic_sum}
get_route(ROUTE)  # fail at import if the route this module promises is not registered
