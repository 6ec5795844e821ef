"""Indexing and training kernels: gather and its VJP, index_copy, masks, concat/slice and their VJPs, the VJP of a
broadcast, atomic scatter-add. Plans, host paths and CUDA kernels (contracts/indexing-v1.yaml).

Bit movers (gather, index_copy, where, masked_fill, the axis copy behind concat, slice and their VJPs) are one
64-bit grid-stride loop each that copies 32-bit words: no float operation, so host and CUDA agree bit for bit by
construction and the claims are about the plans (every read and write in bounds when the guard accepts; an index
equal to the table size refused). Adders reuse the reductions family's kernels in their stated orders:
``reduce_to_shape`` lays ``dy`` out as (outputs, contributions) with the broadcast axes last (a layout copy) and
folds each row from +0 with ``native.reductions.fold_sum``; ``gather_vjp`` is ``native.reductions.scatter_add`` on
the flat view (duplicates in increasing source row). ``scatter_add_atomic`` is one ``atomicAdd`` per source: no
order, and global f32 atomics flush subnormal operands and results whatever ``-ftz`` says; its host model adds
each output's sources in a fresh random order per call with that flush, so the determinism item sees the same
non-reproducibility the device shows.

Index guards run before any launch (host-side ``min``/``max`` of the indices): an index outside [0, rows) raises
IndexError and nothing is launched; index_copy also refuses duplicate indices (ValueError: which write wins would
be unspecified).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from native import reductions as nred
from native.builds import Build, register_builds
from native.elementwise import launch_plan
from native.nvrtc import compile_function, get_route
from native.workloads import register_workload
from obligations.core.device import array_module, resolve_device
from obligations.core.entrypoints import entry_point
from obligations.core.symbolic import all_of, as_type, smax

__all__ = [
    "ROUTE",
    "MAX_ELEMENTS",
    "RowsPlan",
    "rows_plan",
    "CopyPlan",
    "copy_plan",
    "KERNELS",
    "kernel_source",
    "gather",
    "index_copy",
    "where",
    "masked_fill",
    "concat",
    "concat_vjp",
    "slice_axis",
    "slice_vjp",
    "reduce_to_shape",
    "gather_vjp",
    "scatter_add_atomic",
]

ROUTE = "nvrtc-ieee"
MAX_ELEMENTS = nred.MAX_ELEMENTS
F32 = np.float32


# -- plans (ints at launch time, checker terms in kc check) -------------------------------------------------


@dataclass(frozen=True)
class RowsPlan:
    """A row lookup: ``m`` rows of width ``d`` read from (gather) or written to (index_copy) a ``rows`` x ``d``
    table at row ``index``; ``accepts``: the index guard, ``admissible``: both buffers within MAX_ELEMENTS."""

    rows: Any
    d: Any
    m: Any
    index: Any
    accepts: Any
    admissible: Any
    table_elems: Any
    out_elems: Any

    def table_offset(self, c: Any) -> Any:
        """Offset of table[index, c] (int64)."""
        return as_type(self.index, "int64") * self.d + c

    def out_offset(self, j: Any, c: Any) -> Any:
        """Offset of out[j, c] (int64)."""
        return as_type(j, "int64") * self.d + c

    def regimes(self) -> dict[str, Any]:
        """The looked-up row: the first, an inner one, the last."""
        return {
            "first_row": self.index == 0,
            "inner_row": all_of(self.index > 0, self.index < self.rows - 1),
            "last_row": all_of(self.index > 0, self.index == self.rows - 1),
        }


def rows_plan(rows: Any, d: Any, m: Any, index: Any) -> RowsPlan:
    """The row guard 0 <= index < rows and the int64 sizes (products checked by division before they are formed)."""
    per_row = MAX_ELEMENTS // smax(as_type(d, "int64"), 1)
    admissible = all_of(rows >= 0, d >= 0, m >= 0, rows <= per_row, m <= per_row)
    return RowsPlan(
        rows,
        d,
        m,
        index,
        all_of(index >= 0, index < rows),
        admissible,
        as_type(rows, "int64") * d,
        as_type(m, "int64") * d,
    )


@dataclass(frozen=True)
class CopyPlan:
    """An axis copy over the (outer, length, inner) view: ``count`` planes from ``start`` of a source of ``length``
    planes into a destination of ``count`` planes (slice; its VJP and concat swap the roles of the two views)."""

    outer: Any
    length: Any
    inner: Any
    start: Any
    count: Any
    accepts: Any
    admissible: Any
    elems: Any
    out_elems: Any

    def src_offset(self, o: Any, r: Any, q: Any) -> Any:
        """Offset of x[o, start + r, q] (int64)."""
        return (as_type(o, "int64") * self.length + self.start + r) * self.inner + q

    def dst_offset(self, o: Any, r: Any, q: Any) -> Any:
        """Offset of y[o, r, q] (int64)."""
        return (as_type(o, "int64") * self.count + r) * self.inner + q

    def regimes(self) -> dict[str, Any]:
        """Which planes are copied: none, the whole axis, a prefix, a suffix, an interior window."""
        some = self.count > 0
        return {
            "empty": self.count == 0,
            "whole": all_of(some, self.start == 0, self.count == self.length),
            "prefix": all_of(some, self.start == 0, self.count < self.length),
            "suffix": all_of(some, self.start > 0, self.start == self.length - self.count),
            "interior": all_of(some, self.start > 0, self.start < self.length - self.count),
        }


def copy_plan(outer: Any, length: Any, inner: Any, start: Any, count: Any) -> CopyPlan:
    """The window guard 0 <= start, 0 <= count, start + count <= length (no sum formed) and the int64 sizes."""
    admissible = nred.axis_admissible(outer, length, inner)  # the (outer, length, inner) view reductions take
    accepts = all_of(start >= 0, count >= 0, start <= length - count)
    rows = as_type(outer, "int64") * inner
    return CopyPlan(outer, length, inner, start, count, accepts, admissible, rows * length, rows * count)


# -- CUDA sources ---------------------------------------------------------------------------------------------

_LOOP = (
    "for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < n; "
    "p += (long long)blockDim.x * gridDim.x)"
)

KERNELS: dict[str, str] = {
    "gather_rows": f"""\
extern "C" __global__ void kc_gather_rows(const unsigned* __restrict__ table, const long long* __restrict__ idx,
                                          unsigned* __restrict__ out, long long n, long long d) {{
    {_LOOP} {{
        const long long j = p / d, c = p - j * d;
        out[p] = table[idx[j] * d + c];
    }}
}}
""",
    "index_copy_rows": f"""\
extern "C" __global__ void kc_index_copy_rows(const unsigned* __restrict__ src, const long long* __restrict__ idx,
                                              unsigned* __restrict__ out, long long n, long long d) {{
    {_LOOP} {{
        const long long j = p / d, c = p - j * d;
        out[idx[j] * d + c] = src[p];
    }}
}}
""",
    "axis_copy": f"""\
extern "C" __global__ void kc_axis_copy(const unsigned* __restrict__ src, unsigned* __restrict__ dst, long long n,
        long long count, long long inner, long long src_len, long long src_off, long long dst_len, long long dst_off) {{
    {_LOOP} {{
        const long long q = p % inner, t = p / inner, r = t % count, o = t / count;
        dst[(o * dst_len + dst_off + r) * inner + q] = src[(o * src_len + src_off + r) * inner + q];
    }}
}}
""",
    "where": f"""\
extern "C" __global__ void kc_where(const unsigned char* __restrict__ mask, const unsigned* __restrict__ a,
                                    const unsigned* __restrict__ b, unsigned* __restrict__ out, long long n) {{
    {_LOOP} out[p] = mask[p] ? a[p] : b[p];
}}
""",
    "masked_fill": f"""\
extern "C" __global__ void kc_masked_fill(const unsigned char* __restrict__ mask, const unsigned* __restrict__ x,
                                          unsigned value, unsigned* __restrict__ out, long long n) {{
    {_LOOP} out[p] = mask[p] ? value : x[p];
}}
""",
    "scatter_atomic": f"""\
extern "C" __global__ void kc_scatter_atomic(const long long* __restrict__ idx, const float* __restrict__ src,
                                             float* __restrict__ out, long long n) {{
    {_LOOP} atomicAdd(out + idx[p], src[p]);
}}
""",
}


def kernel_source(kind: str) -> tuple[str, str]:
    """(CUDA source, function name) of one of :data:`KERNELS`."""
    return KERNELS[kind], f"kc_{kind}"


@register_builds("indexing")
def _builds() -> Iterator[Build]:
    for kind in KERNELS:
        src, fn = kernel_source(kind)
        yield Build("indexing", kind, src, fn, ROUTE, index_bits=64, flushes_atomics=kind == "scatter_atomic")


def _launch(kind: str, n: int, args: tuple) -> None:
    if n == 0:
        return
    plan = launch_plan(n)
    compile_function(*kernel_source(kind), ROUTE)((int(plan["grid"]),), (int(plan["block"]),), (*args,))


# -- guards ---------------------------------------------------------------------------------------------------


def _check_indices(idx: Any, rows: int, what: str) -> None:
    """IndexError unless every index is in [0, rows) (the plan's ``accepts`` at the extreme indices)."""
    if idx.size == 0:
        return
    lo, hi = int(idx.min()), int(idx.max())
    for i in (lo, hi):
        if not rows_plan(rows, 1, 1, i).accepts:
            raise IndexError(f"{what}: index {i} out of range [0, {rows})")


def _check_rows(rows: int, d: int, m: int, what: str) -> None:
    if not rows_plan(rows, d, m, 0).admissible:
        raise ValueError(f"{what}: {rows} or {m} rows of {d} exceed {MAX_ELEMENTS} elements")


def _bits(xp: Any, a: Any) -> Any:
    return xp.ascontiguousarray(xp.asarray(a, dtype=xp.float32)).view(xp.uint32)


def _rows_view(a: Any) -> tuple[int, int]:
    rows = int(a.shape[0]) if a.ndim else 1
    return rows, int(np.prod(a.shape[1:], dtype=np.int64)) if a.ndim > 1 else 1


# -- bit movers -----------------------------------------------------------------------------------------------


@entry_point("indexing")
def gather(table: Any, idx: Any, device: str = "auto") -> Any:
    """Rows ``table[idx[j], ...]`` as a bit copy; IndexError for an index outside [0, rows) (nothing launched)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    t = _bits(xp, table)
    ix = xp.ascontiguousarray(xp.asarray(idx, dtype=xp.int64))
    rows, d = _rows_view(t)
    _check_rows(rows, d, int(ix.size), "gather")
    _check_indices(ix, rows, "gather")
    shape = tuple(ix.shape) + tuple(t.shape[1:])
    if dev == "host":
        return t.reshape(rows, d)[ix.reshape(-1)].reshape(shape).view(F32)
    out = xp.empty(shape, dtype=xp.uint32)
    _launch("gather_rows", int(out.size), (t, ix, out, np.int64(out.size), np.int64(d)))
    return out.view(xp.float32)


@entry_point("indexing")
def index_copy(out: Any, idx: Any, src: Any, device: str = "auto") -> Any:
    """A copy of ``out`` with rows ``idx[j]`` replaced by ``src[j]`` (IndexError, ValueError on duplicates)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    res = xp.array(_bits(xp, out), copy=True)
    ix = xp.ascontiguousarray(xp.asarray(idx, dtype=xp.int64)).reshape(-1)
    s = _bits(xp, src)
    rows, d = _rows_view(res)
    if s.shape != (ix.size, *res.shape[1:]):
        raise ValueError(f"index_copy: src shape {tuple(s.shape)} is not ({ix.size}, *{tuple(res.shape[1:])})")
    _check_rows(rows, d, int(ix.size), "index_copy")
    _check_indices(ix, rows, "index_copy")
    if ix.size and int(xp.unique(ix).size) != int(ix.size):
        raise ValueError("index_copy: duplicate indices (which write wins would be unspecified)")
    if dev == "host":
        res.reshape(rows, d)[ix] = s.reshape(int(ix.size), d)
        return res.view(F32)
    _launch("index_copy_rows", int(s.size), (s, ix, res, np.int64(s.size), np.int64(d)))
    return res.view(xp.float32)


def _common(xp: Any, *arrays: Any) -> list[Any]:
    shape = np.broadcast_shapes(*(tuple(a.shape) for a in arrays))
    return [xp.ascontiguousarray(xp.broadcast_to(a, shape)) for a in arrays]


@entry_point("indexing")
def where(mask: Any, a: Any, b: Any, device: str = "auto") -> Any:
    """``a`` where ``mask`` else ``b`` (bits, NumPy broadcasting)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    m, x, y = _common(xp, xp.asarray(mask, dtype=xp.bool_), _bits(xp, a), _bits(xp, b))
    if dev == "host":
        return np.where(m, x, y).astype(np.uint32).view(F32)
    out = xp.empty(x.shape, dtype=xp.uint32)
    _launch("where", int(out.size), (m.view(xp.uint8), x, y, out, np.int64(out.size)))
    return out.view(xp.float32)


@entry_point("indexing")
def masked_fill(x: Any, mask: Any, value: float, device: str = "auto") -> Any:
    """``x`` with float32(``value``)'s bits where ``mask`` (broadcast to x's shape)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    xb = _bits(xp, x)
    m = xp.ascontiguousarray(xp.broadcast_to(xp.asarray(mask, dtype=xp.bool_), xb.shape))
    v = np.asarray(value, dtype=F32).reshape(()).view(np.uint32)
    if dev == "host":
        return np.where(m, v, xb).astype(np.uint32).view(F32)
    out = xp.empty(xb.shape, dtype=xp.uint32)
    _launch("masked_fill", int(out.size), (m.view(xp.uint8), xb, np.uint32(v), out, np.int64(out.size)))
    return out.view(xp.float32)


def _axis_dims(shape: tuple[int, ...], axis: int) -> tuple[int, int, int, int]:
    ax = axis % len(shape)
    outer = int(np.prod(shape[:ax], dtype=np.int64))
    inner = int(np.prod(shape[ax + 1 :], dtype=np.int64))
    return ax, outer, int(shape[ax]), inner


def _copy(dev: str, src: Any, dst: Any, dims: tuple[int, int, int, int], window: tuple[int, int, int]) -> None:
    """dst[o, dst_off + r, q] = src[o, start + r, q] for r < count over the (outer, len, inner) views.

    ``dims`` = (outer, src_len, dst_len, inner), ``window`` = (start, count, dst_off); both windows are guarded by
    :func:`copy_plan` before anything is read or written.
    """
    outer, src_len, dst_len, inner = dims
    start, count, dst_off = window
    plan = copy_plan(outer, src_len, inner, start, count)
    if not (plan.admissible and plan.accepts and copy_plan(outer, dst_len, inner, dst_off, count).accepts):
        raise IndexError(f"axis copy: window [{start}, {start + count}) of {src_len} into {dst_off} of {dst_len}")
    if dev == "host":
        s3 = src.reshape(outer, src_len, inner)
        dst.reshape(outer, dst_len, inner)[:, dst_off : dst_off + count, :] = s3[:, start : start + count, :]
        return
    n = outer * count * inner
    args = (src, dst, np.int64(n), np.int64(count), np.int64(inner), np.int64(src_len), np.int64(start))
    _launch("axis_copy", n, (*args, np.int64(dst_len), np.int64(dst_off)))


@entry_point("indexing")
def slice_axis(x: Any, axis: int, start: int, stop: int, device: str = "auto") -> Any:
    """Planes ``start .. stop - 1`` of ``axis``; IndexError unless 0 <= start <= stop <= length (no clamping)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    xb = _bits(xp, x)
    ax, outer, length, inner = _axis_dims(tuple(xb.shape), axis)
    count = stop - start
    if not copy_plan(outer, length, inner, start, count).accepts:
        raise IndexError(f"slice_axis: [{start}, {stop}) is not a window of an axis of length {length}")
    shape = tuple(xb.shape[:ax]) + (count,) + tuple(xb.shape[ax + 1 :])
    out = xp.empty(shape, dtype=xp.uint32)
    _copy(dev, xb, out, (outer, length, count, inner), (start, count, 0))
    return out.view(xp.float32)


@entry_point("indexing")
def slice_vjp(dy: Any, shape: tuple[int, ...], axis: int, start: int, device: str = "auto") -> Any:
    """The VJP of :func:`slice_axis`: ``dy`` at ``start`` along ``axis`` of +0s of the input's ``shape``."""
    dev = resolve_device(device)
    xp = array_module(dev)
    d = _bits(xp, dy)
    ax, outer, length, inner = _axis_dims(tuple(shape), axis)
    if tuple(d.shape[:ax]) + tuple(d.shape[ax + 1 :]) != tuple(shape[:ax]) + tuple(shape[ax + 1 :]):
        raise ValueError(f"slice_vjp: dy {tuple(d.shape)} is not a window of {tuple(shape)} along axis {ax}")
    out = xp.zeros(tuple(shape), dtype=xp.uint32)
    _copy(dev, d, out, (outer, int(d.shape[ax]), length, inner), (0, int(d.shape[ax]), start))
    return out.view(xp.float32)


@entry_point("indexing")
def concat(xs: list[Any], axis: int, device: str = "auto") -> Any:
    """The inputs side by side along ``axis`` (other dimensions equal)."""
    dev = resolve_device(device)
    xp = array_module(dev)
    bs = [_bits(xp, x) for x in xs]
    ax = axis % bs[0].ndim
    rest = [tuple(b.shape[:ax]) + tuple(b.shape[ax + 1 :]) for b in bs]
    if len(set(rest)) != 1:
        raise ValueError(f"concat: shapes {[tuple(b.shape) for b in bs]} differ off axis {ax}")
    shape = tuple(bs[0].shape[:ax]) + (sum(int(b.shape[ax]) for b in bs),) + tuple(bs[0].shape[ax + 1 :])
    _, outer, total, inner = _axis_dims(shape, ax)
    out = xp.empty(shape, dtype=xp.uint32)
    off = 0
    for b in bs:
        _copy(dev, b, out, (outer, int(b.shape[ax]), total, inner), (0, int(b.shape[ax]), off))
        off += int(b.shape[ax])
    return out.view(xp.float32)


@entry_point("indexing")
def concat_vjp(dy: Any, sizes: list[int], axis: int, device: str = "auto") -> list[Any]:
    """The VJP of :func:`concat`: the slices of ``dy`` of lengths ``sizes`` along ``axis``."""
    out, off = [], 0
    for s in sizes:
        out.append(slice_axis(dy, axis, off, off + int(s), device=device))
        off += int(s)
    if off != int(np.shape(dy)[axis]):
        raise ValueError(f"concat_vjp: sizes {sizes} do not add up to {np.shape(dy)[axis]}")
    return out


# -- adders ---------------------------------------------------------------------------------------------------


@entry_point("indexing")
def reduce_to_shape(dy: Any, shape: tuple[int, ...], device: str = "auto") -> Any:
    """The VJP of a broadcast to ``dy``'s shape: each output the left fold from +0 of its dy elements in flat order."""
    from spec.indexing import broadcast_axes

    dev = resolve_device(device)
    xp = array_module(dev)
    d = xp.asarray(dy, dtype=xp.float32)
    red_axes = broadcast_axes(tuple(shape), tuple(d.shape))
    keep = tuple(i for i in range(d.ndim) if i not in red_axes)
    n_out = int(np.prod([d.shape[i] for i in keep], dtype=np.int64))
    n_red = int(np.prod([d.shape[i] for i in red_axes], dtype=np.int64))
    rows = xp.ascontiguousarray(xp.transpose(d, keep + red_axes)).reshape(n_out, n_red)
    return nred.fold_sum(rows, axis=1, device=dev).reshape(tuple(shape))


@entry_point("indexing")
def gather_vjp(dy: Any, idx: Any, rows: int, device: str = "auto") -> Any:
    """The VJP of :func:`gather`: zeros(rows, ...) with ``dy[j]`` added into row ``idx[j]``, in increasing j."""
    dev = resolve_device(device)
    xp = array_module(dev)
    d = xp.ascontiguousarray(xp.asarray(dy, dtype=xp.float32))
    ix = xp.ascontiguousarray(xp.asarray(idx, dtype=xp.int64)).reshape(-1)
    width = int(np.prod(d.shape[1:], dtype=np.int64)) if d.ndim > 1 else 1
    _check_rows(rows, width, int(ix.size), "gather_vjp")
    _check_indices(ix, rows, "gather_vjp")
    targets = (ix[:, None] * width + xp.arange(width, dtype=xp.int64)[None, :]).reshape(-1)
    flat = nred.scatter_add(xp.zeros(rows * width, dtype=xp.float32), targets, d.reshape(-1), device=dev)
    return flat.reshape((rows, *d.shape[1:]))


def _flush(a: np.ndarray) -> np.ndarray:
    return np.where(np.abs(a) < np.finfo(F32).tiny, np.copysign(F32(0), a), a).astype(F32)


@entry_point("indexing")
def scatter_add_atomic(out: Any, idx: Any, src: Any, device: str = "auto") -> Any:
    """``out[idx[j]] += src[j]`` by one atomicAdd per source: no order (not reproducible), subnormals flushed."""
    dev = resolve_device(device)
    xp = array_module(dev)
    res = xp.array(xp.asarray(out, dtype=xp.float32), copy=True).reshape(-1)
    ix = xp.ascontiguousarray(xp.asarray(idx, dtype=xp.int64)).reshape(-1)
    s = xp.ascontiguousarray(xp.asarray(src, dtype=xp.float32)).reshape(-1)
    if ix.shape != s.shape:
        raise ValueError(f"scatter_add_atomic: {ix.size} indices for {s.size} sources")
    _check_rows(int(res.size), 1, int(ix.size), "scatter_add_atomic")
    _check_indices(ix, int(res.size), "scatter_add_atomic")
    if dev == "host":
        # A fresh order per call, deliberately unseeded: the hardware's atomics promise none either. Round r adds
        # every output's r-th source of that order (outputs are independent), each add flushing as the atomic does.
        order = np.random.default_rng().permutation(ix.size)
        by_target = order[np.argsort(ix[order], kind="stable")]
        tgt = ix[by_target]
        rank = np.arange(tgt.size) - np.searchsorted(tgt, tgt, side="left")
        with np.errstate(all="ignore"):
            for r in range(int(rank.max(initial=-1)) + 1):
                sel = rank == r
                t, v = tgt[sel], s[by_target[sel]]
                res[t] = _flush((_flush(res[t]) + _flush(v)).astype(F32))
        return nred._canon(res)
    _launch("scatter_atomic", int(ix.size), (ix, s, res, np.int64(ix.size)))
    return res


@register_workload("indexing")
def _workload() -> int:
    """Every indexing CUDA build at its plans' regimes (first/inner/last row, empty/prefix/suffix/interior windows)."""
    import cupy

    rng = np.random.default_rng(0)
    launches = 0
    table = cupy.asarray(rng.standard_normal((5, 3)).astype(np.float32))
    for idx in ([0], [2], [4], [4, 0, 4], []):
        ix = cupy.asarray(np.array(idx, dtype=np.int64))
        y = gather(table, ix, device="cuda")
        gather_vjp(y, ix, 5, device="cuda")
        index_copy(table, ix[:1], y[:1], device="cuda")
        scatter_add_atomic(cupy.zeros(5, dtype=cupy.float32), ix, y[:, 0], device="cuda")
        launches += 4
    x = cupy.asarray(rng.standard_normal((2, 6, 3)).astype(np.float32))
    for start, stop in ((0, 0), (0, 6), (0, 2), (4, 6), (1, 4)):
        s = slice_axis(x, 1, start, stop, device="cuda")
        slice_vjp(s, x.shape, 1, start, device="cuda")
        concat([x, s], 1, device="cuda")
        launches += 4
    m = cupy.asarray(rng.random((2, 6, 3)) < 0.5)
    where(m, x, -x, device="cuda")
    masked_fill(x, m, -1.0, device="cuda")
    reduce_to_shape(x, (1, 6, 1), device="cuda")
    cupy.cuda.runtime.deviceSynchronize()
    return launches + 3


get_route(ROUTE)  # fail at import if the route this module promises is not registered
