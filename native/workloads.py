"""Small runs of each family's kernels at the sizes that reach each of their code paths, for sanitizers.

A workload launches the family's kernels on CUDA at the regime witnesses of its plans (empty, one trip,
grid-stride with a shrunken grid, several passes, the tail), so ``compute-sanitizer`` sees every path
with few elements. Workloads register by name; ``python -m native.workloads --run NAME`` runs one (the
process the sanitizer watches). With ``--marker TOKEN`` it runs several (``--run A --run B ...``) one after
another in one process, each between a ``begin`` and an ``end`` line (:data:`MARKER`, flushed, after a device
synchronise), so a sanitizer that prints its reports to the same stdout in order has every report of a workload
between that workload's two lines (obligations.sanitize_batch attributes them).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "register_workload",
    "workload_start",
    "get_workload",
    "find_workload",
    "workloads",
    "main",
    "run_marked",
    "attention_shapes",
    "MARKER",
    "ABORT_EXIT",
]

# The line that brackets each workload of a marked run: ``@@kc-workload TOKEN begin NAME``, ``... end NAME SECONDS
# ok LAUNCHES`` or ``... end NAME SECONDS raised WHAT``, and ``... abort NAME WHY`` where the process stops.
MARKER = "@@kc-workload"
# Exit status of a marked run stopped because the CUDA context was unusable after a workload.
ABORT_EXIT = 3

_WORKLOADS: dict[str, Callable[[], int]] = {}
# Workload -> the runtime whose start in a process the first of its workloads pays ("triton": its import, driver
# and launcher, ~3.8 s on an H200 host, then ~0.01 s a workload): a sanitizer plan keeps such workloads together.
_STARTS: dict[str, str] = {}


def register_workload(name: str, start: str | None = None) -> Callable[[Callable[[], int]], Callable[[], int]]:
    """Decorator: register ``fn() -> launches`` under ``name``; ``start`` names a runtime the workload starts in its
    process that other workloads of the same ``start`` then find started."""

    def deco(fn: Callable[[], int]) -> Callable[[], int]:
        if name in _WORKLOADS and _WORKLOADS[name] is not fn:
            raise ValueError(f"workload {name!r} registered twice")
        _WORKLOADS[name] = fn
        if start is not None:
            _STARTS[name] = start
        return fn

    return deco


def workload_start(name: str) -> str | None:
    """The runtime workload ``name`` starts in its process (see :func:`register_workload`), or None."""
    return _STARTS.get(name)


def get_workload(name: str) -> Callable[[], int]:
    """The workload ``name``; KeyError lists the known ones."""
    try:
        return _WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {sorted(_WORKLOADS)}") from None


def workloads() -> list[str]:
    """Registered workload names."""
    return sorted(_WORKLOADS)


def find_workload(name: str) -> Callable[[], int]:
    """The workload ``name``, importing only the module that registers it where that is ``native.<name>`` (conv,
    norm, indexing; a family's ``-`` is the module's ``_``: triton-softmax), else every native module; KeyError
    lists the known ones. Each sanitizer tool runs a workload in a process of its own, and importing the whole
    package cost ~0.3 s of each."""
    from native.builds import load_native_modules

    module = f"native.{name.replace('-', '_')}"
    if name not in _WORKLOADS and importlib.util.find_spec(module) is not None:
        importlib.import_module(module)
    if name not in _WORKLOADS:
        load_native_modules()
    return get_workload(name)


# (n, block, max_grid): empty, one element, one trip, a grid-stride loop reached by a one-block grid, a tail.
_GEOMETRIES = ((0, 256, 65536), (1, 256, 65536), (256, 256, 65536), (33, 32, 1), (1000, 32, 2))


@register_workload("elementwise")
def _elementwise() -> int:
    import cupy

    from native import elementwise as ew

    launches = 0
    rng = np.random.default_rng(0)
    for name in sorted(ew.KERNELS):
        k = ew.get_kernel(name)
        for n, block, max_grid in _GEOMETRIES:
            ins = [cupy.asarray(rng.standard_normal(n).astype(np.float32)) for _ in k.inputs]
            ew.run_flat(name, ins, tuple(1.5 for _ in k.scalars), device="cuda", n=n, block=block, max_grid=max_grid)
            launches += 1
    cupy.cuda.runtime.deviceSynchronize()
    return launches


@register_workload("reductions")
def _reductions() -> int:
    import cupy

    from native import reductions as red

    launches = 0
    # One pass, several passes, the unrolled main loop (n >= unroll * grid * block at max_grid 1), a tail.
    for n in (0, 1, 255, 256, 257, 70_000, 8 * 256 + 3):
        x = cupy.asarray(np.random.default_rng(n).standard_normal(n).astype(np.float32))
        red.tree_sum(x, device="cuda")
        red.atomic_sum(x, device="cuda")
        red.fold_sum(x, device="cuda")
        red.tree_sum(x, device="cuda", block=32, max_grid=1)  # the unrolled main loop with few elements
        red.mean(x, device="cuda", order="tree", block=32, max_grid=2)
        x2 = x[: n - n % 5].reshape(-1, 5)  # an axis of 5 (or an empty one): dot and the VJPs of sum, mean, max
        red.dot(x2, x2, axis=1, device="cuda")
        red.sum_vjp(x2[:, 0], x2.shape, axis=1, device="cuda")
        red.mean_vjp(x2[:, 0], x2.shape, axis=1, device="cuda")
        red.max_vjp(x2, x2[:, 0], axis=1, device="cuda")
        launches += 9
    cupy.cuda.runtime.deviceSynchronize()
    return launches


@register_workload("rng")
def _rng() -> int:
    import cupy

    from native import rng

    launches = 0
    x = cupy.ones(1000, dtype=cupy.float32)
    for n, block, max_grid in _GEOMETRIES:  # every mode at each loop regime's geometry
        for mode in rng.MODES:
            xs = x[:n] if mode == "dropout" else None
            rng.generate(mode, (n,), 7, 0, device="cuda", keep_prob=0.5, x=xs, block=block, max_grid=max_grid)
            launches += 1
        rng.fill(n, 1.0, device="cuda")  # the initializers at the same sizes
        rng.xavier_uniform(n, 8, 4, 7, device="cuda")
        launches += 3
    cupy.cuda.runtime.deviceSynchronize()
    return launches


@register_workload("transfer")
def _transfer() -> int:
    import cupy

    from native import transfer
    from spec.transfer import TARGETS

    launches = 0
    for n, block, max_grid in _GEOMETRIES:
        values = np.random.default_rng(n).standard_normal(n)
        for target in sorted(TARGETS):
            transfer.upload(values, target, device="cuda", block=block, max_grid=max_grid)
            launches += 1
    cupy.cuda.runtime.deviceSynchronize()
    return launches


# -- wave-2 families: small shapes at each plan regime's witness (tails, partial tiles, boundaries) -----------


def attention_shapes() -> tuple[tuple[int, int, int, int, int, int], ...]:
    """The attention workload's (B, Hq, Hkv, Lq, Lk, D): one row and one key; a partial query tile past BR rows with
    a key tail past BC (tiled VJP, D 64, GQA); GQA with D 80 (padded to 128: the row VJP kernels) over two batches;
    an empty query (D 16: a padded tiled dK/dV). Every block loops over whole padded tiles whatever the lengths, so
    a case's sanitizer time grows with its blocks (batch x heads): the row-kernel case has the fewest heads that
    keep a group of 2 (it had 4 query heads over 2 KV heads: ATT-SANITIZE's racecheck took 22.8 s, the longest item
    of the GPU run of 2026-11-27)."""
    from native import attention as att

    return ((1, 1, 1, 1, 1, 64), (1, 2, 1, att.BR + 3, att.BC + 5, 64), (2, 2, 1, 5, 7, 80), (1, 1, 1, 0, 3, 16))


@register_workload("attention")
def _attention(device: str = "cuda") -> int:
    """Forward (float32 and every float16 variant) and VJP (tiled, by dQ partials and on the partial tile by the dQ
    kernel too, and row kernels) on one row, a partial tile, GQA, masks."""
    from native import attention as att

    xp = _xp(device)
    rng = np.random.default_rng(0)
    launches = 0
    for b, hq, hkv, lq, lk, d in attention_shapes():
        q = xp.asarray(rng.standard_normal((b, hq, lq, d)).astype(np.float32))
        k, v = (xp.asarray(rng.standard_normal((b, hkv, lk, d)).astype(np.float32)) for _ in range(2))
        lens = np.minimum(np.arange(b) + lk // 2, lk)  # a length at and one below the key count
        for causal, kv_lens in ((False, None), (True, lens)):
            out, lse = att.attention(q, k, v, causal=causal, kv_lens=kv_lens, device=device)
            dout = xp.asarray(rng.standard_normal(out.shape).astype(np.float32))
            att.attention_vjp(q, k, v, out, lse, dout, causal=causal, kv_lens=kv_lens, device=device)
            if (lq, lk) == (att.BR + 3, att.BC + 5):  # the tiled VJP's other dQ path (the dQ kernel) on one shape
                kw = {"causal": causal, "kv_lens": kv_lens, "device": device}
                att.attention_vjp(q, k, v, out, lse, dout, **kw, dq_path="kernel")
                launches += 2
            for variant in sorted(att.FWD16_VARIANTS):  # every float16 kernel (the pipelined one's cp.async too)
                att.attention(
                    q.astype(np.float16),
                    k.astype(np.float16),
                    v.astype(np.float16),
                    causal=causal,
                    kv_lens=kv_lens,
                    device=device,
                    fwd16=variant,
                )
            launches += 3 + len(att.FWD16_VARIANTS)
    _sync(device)
    return launches


@register_workload("fft")
def _fft(device: str = "cuda") -> int:
    """Spectral multiply, conv and VJP: odd and even grids (the Nyquist bin), modes below and at the bin count."""
    from native import fft

    xp = _xp(device)
    rng = np.random.default_rng(0)
    launches = 0
    for batch, grid, win, wout, modes in ((1, 1, 1, 1, 1), (1, 2, 1, 1, 2), (2, 7, 3, 2, 2), (2, 8, 2, 3, 5)):
        x = xp.asarray(rng.standard_normal((batch, grid, win)).astype(np.float32))
        wr, wi = (xp.asarray(rng.standard_normal((modes, win, wout)).astype(np.float32)) for _ in range(2))
        dy = xp.asarray(rng.standard_normal((batch, grid, wout)).astype(np.float32))
        fft.spectral_conv(x, wr, wi, modes, device=device)
        fft.spectral_conv_vjp(x, wr, wi, modes, dy, device=device)
        launches += 3
    _sync(device)
    return launches


@register_workload("scan")
def _scan(device: str = "cuda") -> int:
    """Forward (sequential and chunked, float32 and float64) and VJP at SCAN-REGIMES' paths: no step, one partial
    chunk, whole chunks, a partial last chunk."""
    from native import scan

    xp = _xp(device)
    rng = np.random.default_rng(0)
    launches = 0
    for length, dd, nn, chunk in ((0, 2, 2, 4), (1, 1, 1, 2), (3, 2, 3, 4), (8, 3, 2, 4), (11, 2, 3, 4)):
        x, raw = (xp.asarray(rng.standard_normal((length, dd)).astype(np.float32)) for _ in range(2))
        A = xp.asarray(-rng.uniform(0.5, 2, (dd, nn)).astype(np.float32))
        B, C = (xp.asarray(rng.standard_normal((length, nn)).astype(np.float32)) for _ in range(2))
        Dk = xp.asarray(rng.standard_normal(dd).astype(np.float32))
        dy = xp.asarray(rng.standard_normal((length, dd)).astype(np.float32))
        for build in (scan.ScanBuild(), scan.ScanBuild(ftype="double")):
            for order in ("sequential", "chunked"):
                scan.selective_scan(x, raw, A, B, C, Dk, order=order, chunk=chunk, device=device, build=build)
                launches += 3
            scan.selective_scan_vjp(x, raw, A, B, C, Dk, dy, chunk=chunk, device=device, build=build)
            launches += 5
    _sync(device)
    return launches


@register_workload("fusion")
def _fusion() -> int:
    """The example programs (generated chains, cuBLAS steps, patterns) and every pre-written kernel at its plan's
    edges: RMSNorm rows and general (d % 4 != 0, a partial tile), masked softmax, RoPE, embedding with the last
    table row and an index equal to the table size (rejected by the guard)."""
    import cupy

    from native import fusion as nf
    from native import fusion_kernels as fk
    from native.nvrtc import compile_function

    rng = np.random.default_rng(0)
    launches = 0
    for g, p in (*nf.example_graphs().values(), *nf.fp16_example_graphs().values()):
        x = [rng.standard_normal(g[i].out_shape).astype(np.float32) for i in g.input_ids()]
        nf.run_program(g, p, x, "cuda")
        launches += len(nf.compile_subgraph(g).steps)
    fns = {k: compile_function(*fk.SOURCES[k], fk.ROUTE) for k in fk.SOURCES}

    def r(*shape: int) -> Any:
        return cupy.asarray(rng.standard_normal(shape).astype(np.float32))

    # the plans' regime witnesses: fold tails, a partial tile, a strided copy, a streamed row, a row at max_row
    for rows, d in ((1, 1), (3, 4), (3, 7), (5, 12), (2, 300), (1, 1028), (1, 4100), (1, fk.MAX_ROW)):
        x, w = r(rows, d), r(d)
        fk.rmsnorm_cuda((fns["rmsnorm"], fns["rmsnorm_rows"]), x, w, 1e-6)
        fk.rmsnorm_cuda(fns["rmsnorm"], x, w, 1e-6, max_grid=1)  # one persistent block loops over the rows
        for block in (32, fk.ROW_BLOCK):
            fk.masked_softmax_cuda(fns["masked_softmax"], x, cupy.zeros((rows, d), cupy.float32), block=block)
        launches += 4
    for t_len, dim in ((1, 2), (3, 8), (33, 2)):
        half = dim // 2
        c, s = r(t_len, half), r(t_len, half)
        fk.rope_cuda(fns["rope"], r(2, t_len, dim), c, s)
        fk.rope_cuda(fns["rope"], r(2, t_len, dim), c, s, block=32, max_grid=1)  # the grid-stride loop
        launches += 2
    table = r(5, 3)
    fk.embedding_cuda(fns["embedding"], cupy.asarray(np.array([0, 4, 2], np.float32)), table)
    fk.embedding_cuda(fns["embedding"], cupy.asarray(np.full(33, 4, np.float32)), table, block=32, max_grid=1)
    try:
        fk.embedding_cuda(fns["embedding"], cupy.asarray(np.array([5], np.float32)), table)
    except ValueError:
        pass  # the guard's rejection one past the table: the error flag, never a read
    launches += 3
    cupy.cuda.runtime.deviceSynchronize()
    return launches


@register_workload("gemm")
def _gemm() -> int:
    """cuBLAS through the guarded GEMM: every transpose pair on a one-element and a small product; an empty one,
    which the guard rejects (gemm_plan accepts m, n, k >= 1) before any launch."""
    import cupy

    from native import gemm

    rng = np.random.default_rng(0)
    launches = 0
    for m, n, k in ((1, 1, 1), (5, 3, 7), (0, 2, 3)):
        for ta in (False, True):
            for tb in (False, True):
                a = cupy.asarray(rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32))
                b = cupy.asarray(rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32))
                try:
                    gemm.matmul(a, b, trans_a=ta, trans_b=tb)
                except gemm.BufferTooSmall:
                    if m * n * k:
                        raise
                    continue  # the guard's rejection of the empty product: no cuBLAS call
                launches += 1
    cupy.cuda.runtime.deviceSynchronize()
    return launches


@register_workload("halfprec")
def _halfprec() -> int:
    """Every binary16/bfloat16 op's sweep kernel over a small operand range (the first 4096 pairs)."""
    from native import halfprec
    from spec.halfprec import FORMATS, OPS

    launches = 0
    for fmt in sorted(FORMATS):
        for op in OPS:
            halfprec.sweep_op(op, fmt, lo=0, hi=4096)
            launches += 1
    return launches


_TRITON_ROWS = ((1, 1), (3, 100), (2, 1000), (2, 2048), (1, 16384))  # one-program, partial, many-warp, largest


@register_workload("triton-softmax", start="triton")
def _triton_softmax() -> int:
    """The Triton softmax (compiled by Triton for this GPU) at one-program, partial-block, largest-block and
    many-warp rows: every launch configuration kind its plan chooses."""
    from native import triton_softmax as tsm

    rng = np.random.default_rng(0)
    for rows, length in _TRITON_ROWS:
        tsm.softmax(rng.standard_normal((rows, length)).astype(np.float32), device="cuda")
    return len(_TRITON_ROWS)


@register_workload("triton-rmsnorm", start="triton")
def _triton_rmsnorm() -> int:
    """The Triton RMSNorm (compiled by Triton for this GPU) at one-program, partial-block, largest-block and
    many-warp rows: every launch configuration kind its plan chooses."""
    from native import triton_rmsnorm as trms

    rng = np.random.default_rng(0)
    for rows, length in _TRITON_ROWS:
        x = rng.standard_normal((rows, length)).astype(np.float32)
        trms.rmsnorm(x, rng.standard_normal(length).astype(np.float32), device="cuda")
    return len(_TRITON_ROWS)


@register_workload("libm")
def _libm() -> int:
    """The sweep and values kernels of a few libm functions under both environments on a small input range."""
    from native import libm

    launches = 0
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 1, 0x3F800000, 0xC2B00000], np.uint32)
    for name in ("expf", "logf", "sinf", "__expf"):
        for env in sorted(libm.ROUTES):
            libm.sweep_function(name, env, lo=0x3F000000, hi=0x3F000000 + 4096)
            libm.values(name, env, specials)
            launches += 2
    return launches


@register_workload("ir")
def _ir() -> int:
    """The unfused executor (one kernel per op) on the fusion family's example graphs it runs and a softmax graph."""
    from native import fusion as nf
    from native.ir import run_graph, supported_ops
    from spec.ir.graph import GraphBuilder

    b = GraphBuilder()
    x = b.add("input", (), (3, 5))
    s = b.add("softmax", (b.add("mul_elem", (x, x), (3, 5)),), (3, 5), axis=-1)
    b.add("reduceSum", (b.add("transpose", (s,), (5, 3), dim0=0, dim1=1),), (5, 1), axis=-1, keepdim=True)
    graphs = [*nf.example_graphs().values(), b.build()]
    ops = {*supported_ops(), "input"}
    rng = np.random.default_rng(0)
    launches = 0
    for g, p in graphs:
        if {n.kind for n in g.nodes} <= ops:
            ins = [rng.standard_normal(g[i].out_shape).astype(np.float32) for i in g.input_ids()]
            run_graph(g, p, ins, "cuda")
            launches += len(g.nodes)
    return launches


def _xp(device: str) -> Any:
    if device == "host":
        return np
    import cupy

    return cupy


def _sync(device: str) -> None:
    if device != "host":
        import cupy

        cupy.cuda.runtime.deviceSynchronize()


def _device_sync() -> None:
    """Wait for the device and give the memory pools' blocks back, where a workload used CuPy (the host tests'
    fake workloads do not): the next workload's allocations are fresh ones, so initcheck sees its reads of memory
    it never wrote as it would in a process of its own, not bytes the previous workload left in a pooled block."""
    if "cupy" in sys.modules:
        import cupy

        cupy.cuda.runtime.deviceSynchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()


def _device_usable() -> str | None:
    """None where the device still takes work after a workload raised; else why not (a destroyed context)."""
    try:
        _device_sync()
        if "cupy" in sys.modules:
            import cupy

            cupy.zeros(1, dtype=cupy.float32).sum().get()
    except Exception as e:  # any failure here: the context is gone for this process
        return f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
    return None


def _exit_with_parent() -> None:
    """End this process if its parent (the sanitizer's front end) is gone: a killed batch leaves no workload behind."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="kc-parent-watch", daemon=True).start()


def run_marked(names: list[str], token: str, out: Any = None) -> int:
    """Run the workloads ``names`` in order, each between its :data:`MARKER` lines on ``out`` (default stdout); a
    workload that raises is reported as raised and the next one runs; where the device is unusable afterwards the
    run stops with an ``abort`` line and :data:`ABORT_EXIT`. The workloads' own output goes to stderr."""
    out = out or sys.stdout
    registry = importlib.import_module("native.workloads")

    def mark(text: str) -> None:
        out.write(f"\n{MARKER} {token} {text}\n")  # on a line of its own even after a partial line
        out.flush()

    for name in names:
        mark(f"begin {name}")
        t0 = time.perf_counter()
        broken = None
        try:
            with contextlib.redirect_stdout(sys.stderr):
                launches = registry.find_workload(name)()
            _device_sync()  # the kernels' reports come before the end line
            status = f"ok {launches}"
        except Exception as e:
            traceback.print_exc()
            sys.stderr.flush()
            status = "raised " + f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
            broken = _device_usable()
        mark(f"end {name} {time.perf_counter() - t0:.3f} {status}")
        if broken is not None:
            mark(f"abort {name} the CUDA context is unusable after this workload ({broken})")
            return ABORT_EXIT
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m native.workloads --run NAME [--module M]``: run one registered workload; with ``--marker TOKEN``
    run every ``--run`` in order between marker lines (:func:`run_marked`)."""
    p = argparse.ArgumentParser(prog="python -m native.workloads")
    p.add_argument("--run", required=True, action="append", help="registered workload name (repeat with --marker)")
    p.add_argument("--module", action="append", default=[], help="extra module that registers workloads")
    p.add_argument("--marker", default=None, help="run every --run in order, bracketed by lines with this token")
    args = p.parse_args(argv)
    for mod in args.module:
        importlib.import_module(mod)
    if args.marker is not None:
        _exit_with_parent()
        return run_marked(args.run, args.marker)
    if len(args.run) != 1:
        p.error("several --run need --marker")
    # Run as __main__ this file is a second module object: the registry is the imported native.workloads.
    registry = importlib.import_module("native.workloads")
    launches = registry.find_workload(args.run[0])()
    print(f"workload {args.run[0]}: {launches} launches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
