"""GEMM on row-major buffers through column-major cuBLAS: the launch/buffer plan, its guard, and the call.

The plan is the arithmetic that runs: :func:`gemm_plan` is called with ints before every cuBLAS call and
with checker terms by ``kc check`` (contracts/gemm-cublas-v1.yaml), so the proof is about this code.

Layout. ``op(A)`` is m x k, ``op(B)`` is k x n, C is m x n, all row-major. A stored matrix is read as
``op(X) = X`` (``trans_x`` false, stored rows x cols = logical) or ``op(X) = X^T`` (``trans_x`` true, the
stored matrix is the transpose). Leading dimensions count elements between consecutive stored rows.
Sizes are in elements of ``elem_size`` bytes (2 for fp16, 4 for fp32); buffer lengths are in bytes.
cuBLAS dimensions and leading dimensions are C ``int`` (int32); offsets and element counts are int64.
"""

from __future__ import annotations

import atexit
import functools
import weakref
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from obligations.core.entrypoints import entry_point, note_call, recording_log
from obligations.core.symbolic import all_of, as_type, negate, select

__all__ = [
    "GemmPlan",
    "gemm_plan",
    "BufferTooSmall",
    "check_buffers",
    "ELEMENT_SIZES",
    "OP_N",
    "OP_T",
    "DATA_TYPES",
    "COMPUTE_32F",
    "COMPUTE_32F_FAST_TF32",
    "GEMM_DEFAULT",
    "CublasCall",
    "cublas_args",
    "BlasBackend",
    "HostBlas",
    "CupyBlas",
    "Instrumented",
    "GemmContext",
    "get_context",
    "close_contexts",
    "guard",
    "PreparedGemm",
    "prepare_gemm",
    "BoundGemm",
    "bind_gemm",
    "bind_matmul",
    "clear_calls",
    "GRAPHS",
    "GraphedCall",
    "matmul_path",
    "gemm_raw",
    "matmul",
    "bmm",
    "matmul_vjp",
    "linear",
    "addmm",
]

ELEMENT_SIZES = {"float16": 2, "float32": 4}


class BufferTooSmall(ValueError):
    """Raised before cuBLAS is reached when a buffer cannot hold the matrix the call would touch."""


@dataclass(frozen=True)
class GemmPlan:
    """Stored shapes and element counts of one row-major GEMM call."""

    m: Any
    n: Any
    k: Any
    lda: Any
    ldb: Any
    ldc: Any
    trans_a: Any
    trans_b: Any
    elem_size: Any
    a_rows: Any
    a_cols: Any
    b_rows: Any
    b_cols: Any
    a_elems: Any
    b_elems: Any
    c_elems: Any
    shape_ok: Any

    def accepts(self, a_bytes: Any, b_bytes: Any, c_bytes: Any) -> Any:
        """The guard: true iff the shape is valid and every buffer holds its stored matrix."""
        es = self.elem_size
        # Divide the buffer instead of multiplying the need: elems * elem_size can pass int64 at 2^31 dims.
        return all_of(
            self.shape_ok,
            a_bytes >= 0,
            b_bytes >= 0,
            c_bytes >= 0,
            self.a_elems <= a_bytes // es,
            self.b_elems <= b_bytes // es,
            self.c_elems <= c_bytes // es,
        )

    def a_offset(self, i: Any, p: Any) -> Any:
        """Element offset of op(A)[i, p] in A's buffer."""
        row, col = select(self.trans_a, p, i), select(self.trans_a, i, p)
        return as_type(row, "int64") * self.lda + col

    def b_offset(self, p: Any, j: Any) -> Any:
        """Element offset of op(B)[p, j] in B's buffer."""
        row, col = select(self.trans_b, j, p), select(self.trans_b, p, j)
        return as_type(row, "int64") * self.ldb + col

    def c_offset(self, i: Any, j: Any) -> Any:
        """Element offset of C[i, j] in C's buffer."""
        return as_type(i, "int64") * self.ldc + j

    def regimes(self) -> dict[str, Any]:
        """Layouts cuBLAS is called with: each transpose pair, with packed or padded leading dimensions."""
        packed = all_of(self.lda == self.a_cols, self.ldb == self.b_cols, self.ldc == self.n)
        out = {}
        for ta in (False, True):
            for tb in (False, True):
                layout = all_of(
                    self.trans_a if ta else negate(self.trans_a), self.trans_b if tb else negate(self.trans_b)
                )
                name = f"{'T' if ta else 'N'}{'T' if tb else 'N'}"
                out[f"{name}_packed"] = all_of(layout, packed)
                out[f"{name}_padded"] = all_of(layout, negate(packed))
        return out


def gemm_plan(
    m: Any, n: Any, k: Any, lda: Any, ldb: Any, ldc: Any, trans_a: Any, trans_b: Any, elem_size: Any
) -> GemmPlan:
    """The plan of C[m,n] = op(A)[m,k] op(B)[k,n]: stored shapes, element counts and shape validity."""
    a_rows, a_cols = select(trans_a, k, m), select(trans_a, m, k)
    b_rows, b_cols = select(trans_b, n, k), select(trans_b, k, n)
    shape_ok = all_of(m >= 1, n >= 1, k >= 1, lda >= a_cols, ldb >= b_cols, ldc >= n, elem_size >= 1)
    # Last touched element + 1 of a rows x cols matrix with leading dimension ld, in int64.
    a_elems = (as_type(a_rows, "int64") - 1) * lda + a_cols
    b_elems = (as_type(b_rows, "int64") - 1) * ldb + b_cols
    c_elems = (as_type(m, "int64") - 1) * ldc + n
    return GemmPlan(
        m,
        n,
        k,
        lda,
        ldb,
        ldc,
        trans_a,
        trans_b,
        elem_size,
        a_rows,
        a_cols,
        b_rows,
        b_cols,
        a_elems,
        b_elems,
        c_elems,
        shape_ok,
    )


def check_buffers(plan: GemmPlan, a_bytes: int, b_bytes: int, c_bytes: int) -> None:
    """Raise BufferTooSmall unless ``plan.accepts`` the buffer lengths (runs before every cuBLAS call)."""
    if not plan.accepts(a_bytes, b_bytes, c_bytes):
        es = plan.elem_size
        raise BufferTooSmall(
            f"GEMM m={plan.m} n={plan.n} k={plan.k} lda={plan.lda} ldb={plan.ldb} ldc={plan.ldc} "
            f"trans_a={plan.trans_a} trans_b={plan.trans_b}: needs A {plan.a_elems * es} B {plan.b_elems * es} "
            f"C {plan.c_elems * es} bytes (and ld >= stored cols), got A {a_bytes} B {b_bytes} C {c_bytes}"
        )


# -- cuBLAS constants (cublas_api.h / library_types.h; stable ABI values) -------------------------------

OP_N, OP_T = 0, 1
DATA_TYPES: dict[str, int] = {"float32": 0, "float16": 2}  # CUDA_R_32F, CUDA_R_16F
COMPUTE_32F = 68  # CUBLAS_COMPUTE_32F: fp32 accumulation, no TF32
COMPUTE_32F_FAST_TF32 = 77  # CUBLAS_COMPUTE_32F_FAST_TF32: inputs rounded to TF32 (what CUPY_TF32=1 selects)
GEMM_DEFAULT = -1  # CUBLAS_GEMM_DEFAULT


@dataclass(frozen=True)
class CublasCall:
    """The column-major cuBLAS call that computes a row-major C = op(A) op(B): operands swapped."""

    transa: int
    transb: int
    m: int
    n: int
    k: int
    first: str  # which row-major operand cuBLAS reads as its "A"
    lda: int
    ldb: int
    ldc: int


@functools.lru_cache(maxsize=4096)
def cublas_args(m: int, n: int, k: int, lda: int, ldb: int, ldc: int, trans_a: bool, trans_b: bool) -> CublasCall:
    """Row-major C[m,n] = op(A) op(B) as column-major C^T[n,m] = op(B)^T op(A)^T (kernel-families.md).

    A row-major stored matrix read column-major is its transpose, so op(B)^T is stored B read as is (OP_N)
    when trans_b is false and read transposed (OP_T) when it is true; likewise A. cuBLAS's m, n are ours
    swapped, its first operand is B.
    """
    return CublasCall(OP_T if trans_b else OP_N, OP_T if trans_a else OP_N, n, m, k, "B", ldb, lda, ldc)


@functools.lru_cache(maxsize=4096)
def guard(
    m: int,
    n: int,
    k: int,
    lda: int,
    ldb: int,
    ldc: int,
    trans_a: bool,
    trans_b: bool,
    elem_size: int,
    a_bytes: int,
    b_bytes: int,
    c_bytes: int,
) -> bool:
    """check_buffers over gemm_plan with ints; memoised because it is a pure function of its ints.

    Exceptions are never cached: a rejected call re-runs the guard and raises every time.
    """
    check_buffers(gemm_plan(m, n, k, lda, ldb, ldc, trans_a, trans_b, elem_size), a_bytes, b_bytes, c_bytes)
    return True


# -- BLAS backends: the real cuBLAS through CuPy, and a NumPy model of column-major gemmEx ------------------


def _tf32(x: np.ndarray) -> np.ndarray:
    """Round float32 values to TF32 (10 explicit mantissa bits, RNE), as the tensor cores read them."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0xFFF + ((u >> 13) & 1)) & ~np.uint64(0x1FFF)).astype(np.uint32)
    return np.where(np.isfinite(x), r.view(np.float32), x)


def _colmajor(buf: np.ndarray, rows: int, cols: int, ld: int, offset: int = 0) -> np.ndarray:
    """The rows x cols column-major matrix at ``offset`` with leading dimension ``ld`` (bounds-checked)."""
    last = offset + (cols - 1) * ld + rows
    if rows < 1 or cols < 1 or ld < rows or offset < 0 or last > buf.size:
        # Where cuBLAS would read or write out of bounds the model stops: it is never silent memory.
        raise RuntimeError(f"host BLAS: {rows}x{cols} ld={ld} at {offset} needs {last} elements of {buf.size}")
    return np.lib.stride_tricks.as_strided(
        buf[offset:], shape=(rows, cols), strides=(buf.itemsize, ld * buf.itemsize), writeable=False
    )


class BlasBackend(ABC):
    """A BLAS backend a GemmContext drives: a handle lifecycle and prepared column-major gemmEx calls.

    ``prepare(handle, transa, transb, m, n, k, alpha, lda, sa, ldb, sb, beta, ldc, sc, batch, compute,
    in_dtype, out_dtype)`` returns ``run(A, B, C)``; ``bind`` takes the same arguments followed by A, B, C
    and returns ``run()``. Every run must execute on the caller's current stream.
    """

    name: ClassVar[str]
    binds_current_stream: ClassVar[bool]

    @abstractmethod
    def create(self) -> int:
        """A new handle."""

    @abstractmethod
    def destroy(self, handle: int) -> None:
        """Free ``handle``."""

    @abstractmethod
    def setStream(self, handle: int, stream: Any) -> None:  # noqa: N802 - cuBLAS's name
        """Bind ``stream`` to ``handle``."""

    @abstractmethod
    def prepare(self, *args: Any) -> Callable[[Any, Any, Any], None]:
        """``run(A, B, C)`` with every int resolved."""

    @abstractmethod
    def bind(self, *args: Any) -> Callable[[], None]:
        """``run()`` with the buffers bound too."""

    def bind_unowned(self, *args: Any) -> Callable[[], None] | None:
        """:meth:`bind`'s call holding no reference to its buffers (the caller checks they are alive before every
        call), or None where the backend's bound call must hold them (the default)."""
        return None


class HostBlas(BlasBackend):
    """NumPy model of cublasGemmEx / cublasGemmStridedBatchedEx on flat host buffers (column-major).

    Products and sums in float64, then one rounding to C's type: the "float64 accumulate then round" host
    path. COMPUTE_32F_FAST_TF32 rounds fp32 inputs to TF32 first, as the tensor cores do.
    """

    name = "host"
    binds_current_stream = True  # no streams: nothing to rebind

    def __init__(self) -> None:
        self._next = 1

    def create(self) -> int:
        """A new handle id."""
        self._next += 1
        return self._next

    def destroy(self, handle: int) -> None:
        """Nothing to free on the host."""

    def setStream(self, handle: int, stream: Any) -> None:  # noqa: N802 - cuBLAS's name
        """The host has no streams."""

    def prepare(
        self,
        handle: int,
        transa: int,
        transb: int,
        m: int,
        n: int,
        k: int,
        alpha: float,
        lda: int,
        sa: int,
        ldb: int,
        sb: int,
        beta: float,
        ldc: int,
        sc: int,
        batch: int,
        compute: int,
        in_dtype: Any,
        out_dtype: Any,
    ) -> Callable[[Any, Any, Any], None]:
        """The call with every int fixed: ``run(A, B, C)`` (see :class:`CupyBlas`)."""
        return lambda A, B, C: self.gemmStridedBatchedEx(
            handle,
            transa,
            transb,
            m,
            n,
            k,
            alpha,
            A,
            lda,
            sa,  # noqa: N803
            B,
            ldb,
            sb,
            beta,
            C,
            ldc,
            sc,
            batch,
            compute,
        )

    def bind(self, *args: Any) -> Callable[[], None]:
        """``prepare``'s arguments followed by the three buffers: ``run()`` on them."""
        run, operands = self.prepare(*args[:18]), args[18:]
        return lambda: run(*operands)

    def gemmStridedBatchedEx(
        self,
        handle: int,
        transa: int,
        transb: int,
        m: int,
        n: int,
        k: int,  # noqa: N802
        alpha: float,
        A: np.ndarray,
        lda: int,
        sa: int,
        B: np.ndarray,
        ldb: int,
        sb: int,  # noqa: N803
        beta: float,
        C: np.ndarray,
        ldc: int,
        sc: int,
        batch: int,
        compute: int,
    ) -> None:
        """C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch, column-major."""
        A, B, C = A.reshape(-1), B.reshape(-1), C.reshape(-1)  # noqa: N806 - cuBLAS's names; views of the buffers
        for i in range(batch):
            a = _colmajor(A, *((m, k) if transa == OP_N else (k, m)), lda, i * sa)
            b = _colmajor(B, *((k, n) if transb == OP_N else (n, k)), ldb, i * sb)
            c = _colmajor(C, m, n, ldc, i * sc)
            a = a if transa == OP_N else a.T
            b = b if transb == OP_N else b.T
            if compute == COMPUTE_32F_FAST_TF32 and A.dtype == np.float32:
                a, b = _tf32(np.asarray(a)), _tf32(np.asarray(b))
            with np.errstate(all="ignore"):
                r = float(np.float32(alpha)) * (a.astype(np.float64) @ b.astype(np.float64))
                if beta != 0:
                    r = r + float(np.float32(beta)) * c.astype(np.float64)
            cols = [C[i * sc + j * ldc : i * sc + j * ldc + m] for j in range(n)]
            for j, col in enumerate(cols):
                col[:] = r[:, j].astype(C.dtype)


class CupyBlas(BlasBackend):
    """cuBLAS through CuPy's bindings (cupy.cuda.cublas), on device arrays."""

    name = "cublas"
    # CuPy's gemmEx / gemmStridedBatchedEx bindings issue cublasSetStream(handle, current stream) before
    # every call (cupy_backends/cuda/libs/cublas.pyx), so a prepared call needs no stream check of its own.
    binds_current_stream = True

    def __init__(self) -> None:
        from cupy.cuda import cublas

        self._cublas = cublas
        self._scalars: dict[int, tuple[np.ndarray, int]] = {}

    def _host_ptr(self, v: float) -> int:
        # Host-pointer mode: the scalar must outlive every call that uses it; keep one float32 per value,
        # keyed by its bits (0.0 == -0.0 as floats, but alpha = -0.0 flips the sign of every zero product).
        arr = np.array(v, dtype=np.float32)
        bits = int(arr.view(np.uint32))
        got = self._scalars.get(bits)
        if got is None:
            got = self._scalars[bits] = (arr, arr.ctypes.data)
        return got[1]

    def create(self) -> int:
        """cublasCreate_v2."""
        return self._cublas.create()

    def destroy(self, handle: int) -> None:
        """cublasDestroy_v2."""
        self._cublas.destroy(handle)

    def setStream(self, handle: int, stream: Any) -> None:  # noqa: N802
        """cublasSetStream_v2."""
        self._cublas.setStream(handle, stream.ptr)

    def prepare(
        self,
        handle: int,
        transa: int,
        transb: int,
        m: int,
        n: int,
        k: int,
        alpha: float,
        lda: int,
        sa: int,
        ldb: int,
        sb: int,
        beta: float,
        ldc: int,
        sc: int,
        batch: int,
        compute: int,
        in_dtype: Any,
        out_dtype: Any,
    ) -> Callable[[Any, Any, Any], None]:
        """``run(A, B, C)``: cublasGemmEx (batch 1) or cublasGemmStridedBatchedEx with every int fixed.

        Everything but the three device pointers is resolved here, once, so a call costs what the raw
        binding costs plus one Python frame (PO-GEMM-04: the wrapper must stay within 2% of raw cuBLAS).
        """
        at, ct = DATA_TYPES[str(in_dtype)], DATA_TYPES[str(out_dtype)]
        pa, pb = self._host_ptr(alpha), self._host_ptr(beta)
        if batch == 1:
            gemm = self._cublas.gemmEx

            def run(A: Any, B: Any, C: Any) -> None:  # noqa: N803
                gemm(
                    handle,
                    transa,
                    transb,
                    m,
                    n,
                    k,
                    pa,
                    A.data.ptr,
                    at,
                    lda,
                    B.data.ptr,
                    at,
                    ldb,
                    pb,
                    C.data.ptr,
                    ct,
                    ldc,
                    compute,
                    GEMM_DEFAULT,
                )
        else:
            gemm = self._cublas.gemmStridedBatchedEx

            def run(A: Any, B: Any, C: Any) -> None:  # noqa: N803
                gemm(
                    handle,
                    transa,
                    transb,
                    m,
                    n,
                    k,
                    pa,
                    A.data.ptr,
                    at,
                    lda,
                    sa,
                    B.data.ptr,
                    at,
                    ldb,
                    sb,
                    pb,
                    C.data.ptr,
                    ct,
                    ldc,
                    sc,
                    batch,
                    compute,
                    GEMM_DEFAULT,
                )

        return run

    def bind(
        self,
        handle: int,
        transa: int,
        transb: int,
        m: int,
        n: int,
        k: int,
        alpha: float,
        lda: int,
        sa: int,
        ldb: int,
        sb: int,
        beta: float,
        ldc: int,
        sc: int,
        batch: int,
        compute: int,
        in_dtype: Any,
        out_dtype: Any,
        A: Any,
        B: Any,
        C: Any,
    ) -> Callable[[], None]:  # noqa: N803
        """``run()``: the call with its device pointers resolved too (a C-level partial, no Python frame)."""
        at, ct = DATA_TYPES[str(in_dtype)], DATA_TYPES[str(out_dtype)]
        pa, pb = self._host_ptr(alpha), self._host_ptr(beta)
        if batch == 1:
            run = functools.partial(
                self._cublas.gemmEx,
                handle,
                transa,
                transb,
                m,
                n,
                k,
                pa,
                A.data.ptr,
                at,
                lda,
                B.data.ptr,
                at,
                ldb,
                pb,
                C.data.ptr,
                ct,
                ldc,
                compute,
                GEMM_DEFAULT,
            )
        else:
            run = functools.partial(
                self._cublas.gemmStridedBatchedEx,
                handle,
                transa,
                transb,
                m,
                n,
                k,
                pa,
                A.data.ptr,
                at,
                lda,
                sa,
                B.data.ptr,
                at,
                ldb,
                sb,
                pb,
                C.data.ptr,
                ct,
                ldc,
                sc,
                batch,
                compute,
                GEMM_DEFAULT,
            )
        run.operands = (A, B, C)  # the pointers stay valid while the call holds their arrays
        return run

    def bind_unowned(self, *args: Any) -> Callable[[], None]:
        """:meth:`bind`'s C-level partial without the arrays it keeps: pointers and ints only."""
        run = self.bind(*args)
        return functools.partial(run.func, *run.args)

    def graph(self, bound: Callable[[], None]) -> tuple[Any, Any]:
        """(graph, stream): ``bound`` (a :meth:`bind_unowned` call) captured into a CUDA graph on a stream of its
        own. CuPy's bindings refuse cuBLAS calls during a capture, so the capture calls the same cuBLAS entry with
        the same arguments through the very library CuPy loaded (ctypes); the handle is bound back to the current
        stream afterwards. Raises where the capture is refused."""
        import cupy

        lib = _cublas_library()
        name = {self._cublas.gemmEx: "cublasGemmEx", self._cublas.gemmStridedBatchedEx: "cublasGemmStridedBatchedEx"}
        entry = getattr(lib, name[bound.func])
        handle = bound.args[0]
        stream = cupy.cuda.Stream(non_blocking=True)
        stream.begin_capture()
        try:
            status = (lib.cublasSetStream_v2(handle, stream.ptr), entry(*bound.args))
        finally:
            graph = stream.end_capture()
            lib.cublasSetStream_v2(handle, cupy.cuda.get_current_stream().ptr)
        if any(status):
            raise RuntimeError(f"cuBLAS refused the captured call: status {status}")
        return graph, stream


@functools.cache
def _cublas_library() -> Any:
    """The libcublas this process has loaded (CuPy's): ctypes entries typed as cuBLAS declares them."""
    import ctypes

    with open("/proc/self/maps") as maps:  # the loaded file, so that dlopen returns the same instance
        paths = {line.split()[-1] for line in maps if "/libcublas.so" in line}
    if len(paths) != 1:
        raise RuntimeError(f"expected one loaded libcublas, found {sorted(paths)}")
    lib = ctypes.CDLL(paths.pop())
    p, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    lib.cublasSetStream_v2.argtypes = [p, p]
    lib.cublasGemmEx.argtypes = [p, i, i, i, i, i, p, p, i, i, p, i, i, p, p, i, i, i, i]
    lib.cublasGemmStridedBatchedEx.argtypes = [p, i, i, i, i, i, p, p, i, i, ll, p, i, i, ll, p, p, i, i, ll, i, i, i]
    return lib


class Instrumented:
    """Counts every call into a BLAS backend and records the compute type of every GEMM (evidence).

    A GEMM's count lives in a one-element list per compute type, bumped by the prepared call itself:
    the count costs one increment, which the wrapper-overhead budget (PO-GEMM-04) has room for.
    """

    def __init__(self, api: Any) -> None:
        self.api = api
        self._lifecycle: Counter = Counter()
        self._gemms: dict[int, list[int]] = {}
        self.streams: list = []

    @property
    def name(self) -> str:
        """The backend's name."""
        return self.api.name

    @property
    def binds_current_stream(self) -> bool:
        """Whether the backend's GEMM binding itself runs on the caller's current stream."""
        return bool(getattr(self.api, "binds_current_stream", False))

    @property
    def calls(self) -> Counter:
        """Calls so far by kind: create, setStream, gemm, destroy (a snapshot)."""
        out = Counter(self._lifecycle)
        gemms = sum(cell[0] for cell in self._gemms.values())
        if gemms:
            out["gemm"] = gemms
        return out

    @property
    def compute_types(self) -> Counter:
        """GEMMs so far by requested compute type (a snapshot)."""
        return Counter({ct: cell[0] for ct, cell in self._gemms.items() if cell[0]})

    def create(self) -> int:
        """Counted create."""
        self._lifecycle["create"] += 1
        return self.api.create()

    def destroy(self, handle: int) -> None:
        """Counted destroy."""
        self._lifecycle["destroy"] += 1
        self.api.destroy(handle)

    def setStream(self, handle: int, stream: Any) -> None:  # noqa: N802
        """Counted setStream."""
        self._lifecycle["setStream"] += 1
        self.streams.append(getattr(stream, "ptr", stream))
        self.api.setStream(handle, stream)

    def bind(self, *args: Any) -> tuple[Callable[[], None], list[int]]:
        """The backend's bound call and the counter cell its caller bumps on every run (under its compute type):
        the caller folds the count into its own frame, so a bound call costs one Python frame, as a raw call."""
        return self.api.bind(*args), self._gemms.setdefault(args[15], [0])

    def prepare(self, *args: Any) -> tuple[Callable[[Any, Any, Any], None], list[int]]:
        """The backend's prepared call and the counter cell its caller bumps on every run (as :meth:`bind`)."""
        return self.api.prepare(*args), self._gemms.setdefault(args[15], [0])

    def bind_unowned(self, *args: Any) -> Callable[[], None] | None:
        """The backend's bound call holding no buffers, or None (its caller bumps the count, as for ``bind``)."""
        return self.api.bind_unowned(*args)

    def graph(self, bound: Callable[[], None]) -> tuple[Any, Any] | None:
        """The backend's CUDA graph of a bound call (:meth:`CupyBlas.graph`), or None where it has none."""
        graph_of = getattr(self.api, "graph", None)
        return None if graph_of is None else graph_of(bound)


class _HandleOwner:
    """A token the context and its bound calls hold: the handle is destroyed when it is collected after close."""


class GemmContext:
    """One cuBLAS handle for one device context: created once, stream bound once per step, destroyed once."""

    def __init__(self, api: Any, device: str) -> None:
        self.api = api if isinstance(api, Instrumented) else Instrumented(api)
        if not self.api.binds_current_stream:
            # Prepared calls check no stream per call: that is the backend binding's job.
            raise TypeError(f"GEMM backend {self.api.name!r} must run every call on the caller's current stream")
        self.device = device
        self.handle: int | None = self.api.create()
        self._owner: _HandleOwner | None = _HandleOwner()  # held by bound calls: the handle outlives them
        self._stream: Any = None
        self._bound_ptr: int | None = None  # the bound stream's pointer (cuda)
        self._current_stream: Callable[[], Any] | None = None
        self._current_ptr: Callable[[], int] | None = None
        if device == "cuda":
            import cupy

            self._current_stream = cupy.cuda.get_current_stream
            try:
                from cupy_backends.cuda.stream import get_current_stream_ptr as current_ptr
            except ImportError:  # older layouts: the same pointer through the public API

                def current_ptr() -> int:
                    return cupy.cuda.get_current_stream().ptr

            self._current_ptr = current_ptr

    def bind(self, stream: Any = None) -> None:
        """Start a step: bind ``stream`` (default: the current one) once; GEMMs of the step reuse it."""
        if self.handle is None:
            raise RuntimeError("GEMM context is closed")
        if stream is None and self._current_stream is not None:
            stream = self._current_stream()
        self.api.setStream(self.handle, stream if stream is not None else 0)
        self._stream = stream if stream is not None else 0
        self._bound_ptr = getattr(stream, "ptr", None)

    def _ensure_bound(self) -> None:
        if self.handle is None:
            raise RuntimeError("GEMM context is closed")
        if self._stream is None or (self._current_ptr is not None and self._current_ptr() != self._bound_ptr):
            self.bind()  # the first call, or a new step on another stream: bind once

    def step_call(
        self,
        prepared: tuple[Callable[[Any, Any, Any], None], list[int]],
        swap: bool,
        new_c: Callable[[], Any] | None = None,
        args: tuple = (),
    ) -> PreparedGemm:
        """``call(a, b, c=None) -> c``: the backend's run in cuBLAS operand order, counted in the call's own frame
        (``prepared``: :meth:`Instrumented.prepare`'s pair, made of ``args``); binds the stream on the first call."""
        ctx = self
        run, cell = prepared

        def call(a: Any, b: Any, c: Any = None) -> Any:
            if ctx.handle is None or ctx._stream is None:
                ctx._ensure_bound()  # closed: raises; first call: binds the current stream once
            if c is None:
                c = new_c()
            cell[0] += 1
            run(b, a, c) if swap else run(a, b, c)
            return c

        call.context = self
        call.parts = (self, run, cell, swap, args)  # what matmul's same-arrays path binds (``args``: prepare's)
        return call

    def bound_call(self, bound: tuple[Callable[[], None], list[int]], c: Any) -> BoundGemm:
        """``call() -> c`` for a backend call with its buffers bound (``bound``: :meth:`Instrumented.bind`'s pair).

        The stream is bound now, once, and the call checks nothing: one Python frame that counts the GEMM and
        runs the backend's C-level partial (PO-GEMM-04 holds this frame to within 2% of a raw cuBLAS call).
        The call keeps the handle alive: :meth:`close` defers destroying it until the last bound call is gone.
        """
        self._ensure_bound()
        run, cell = bound

        def call(run: Callable[[], None] = run, cell: list[int] = cell, c: Any = c) -> Any:
            cell[0] += 1
            run()
            return c

        call.context = self
        call.handle_owner = self._owner  # type: ignore[attr-defined]  # the handle lives while this call does
        return call

    def close(self) -> None:
        """Destroy the handle exactly once (later calls are no-ops); its prepared calls are dropped.

        A bound call (:meth:`bound_call`) holds the handle in its C-level partial and checks nothing per call, so
        the handle is destroyed when the last bound call is gone (at once when there is none): no call ever runs
        on a destroyed handle.
        """
        if self.handle is not None:
            handle, self.handle = self.handle, None
            for key in [key for key, call in _PREPARED.items() if call.context is self]:
                del _PREPARED[key]
            weakref.finalize(self._owner, self.api.destroy, handle)
            self._owner = None  # the bound calls hold the last references, if any


_CONTEXTS: dict[tuple[str, int], GemmContext] = {}


def get_context(device: str) -> GemmContext:
    """The one context of the current device (created on first use)."""
    if device == "cuda":
        import cupy

        key = ("cuda", cupy.cuda.runtime.getDevice())
    else:
        key = ("host", 0)
    ctx = _CONTEXTS.get(key)
    if ctx is None or ctx.handle is None:
        ctx = _CONTEXTS[key] = GemmContext(CupyBlas() if device == "cuda" else HostBlas(), device)
    return ctx


@atexit.register
def close_contexts() -> None:
    """Destroy every context's handle (once each)."""
    for ctx in _CONTEXTS.values():
        ctx.close()


def _nbytes(x: Any) -> int:
    return int(x.size) * int(x.dtype.itemsize)


PreparedGemm = Callable[..., Any]
BoundGemm = Callable[[], Any]
"""``call(a, b, c=None) -> c``: a guarded GEMM with every int resolved (made by :func:`prepare_gemm`).

It rebinds the context's stream when the step's stream changed, counts the call and runs cuBLAS; its
``context`` attribute is the context it was prepared on. Whoever caches one must key it by everything
the guard's ints derive from (:func:`matmul` keys by shape, layout and dtype).
"""
# BoundGemm: ``call() -> c`` on buffers bound at preparation (made by :func:`bind_gemm`); ``context`` as above.


def _guarded_args(
    ctx: GemmContext,
    a: Any,
    b: Any,
    c: Any,
    m: int,
    n: int,
    k: int,
    lda: int,
    ldb: int,
    ldc: int,
    trans_a: bool,
    trans_b: bool,
    alpha: float,
    beta: float,
    batch: int,
    strides: tuple[int, int, int],
    compute: int,
    args: Callable[..., CublasCall],
) -> tuple[bool, tuple]:
    """Run the guard and resolve the column-major call: (swap operands?, the backend's prepare arguments)."""
    es_in, es_out = int(a.dtype.itemsize), int(c.dtype.itemsize)
    if str(a.dtype) != str(b.dtype) or str(a.dtype) not in DATA_TYPES or str(c.dtype) not in DATA_TYPES:
        raise TypeError(f"unsupported GEMM types {a.dtype} x {b.dtype} -> {c.dtype}")
    sa, sb, sc = strides
    # The last batch's window must fit; earlier windows lie below it (non-negative strides).
    tail = batch - 1
    guard(
        m,
        n,
        k,
        lda,
        ldb,
        ldc,
        trans_a,
        trans_b,
        es_in,
        _nbytes(a) - tail * sa * es_in,
        _nbytes(b) - tail * sb * es_in,
        ((_nbytes(c) - tail * sc * es_out) // es_out) * es_in,
    )
    if min(strides) < 0 or batch < 1:
        raise BufferTooSmall(f"batch {batch} with strides {strides}")
    if ctx.handle is None:
        raise RuntimeError("GEMM context is closed")
    call = args(m, n, k, lda, ldb, ldc, trans_a, trans_b)
    swap = call.first == "B"
    s1, s2 = (sb, sa) if swap else (sa, sb)
    return swap, (
        ctx.handle,
        call.transa,
        call.transb,
        call.m,
        call.n,
        call.k,
        alpha,
        call.lda,
        s1,
        call.ldb,
        s2,
        beta,
        call.ldc,
        sc,
        batch,
        compute,
        a.dtype,
        c.dtype,
    )


def prepare_gemm(
    ctx: GemmContext,
    a: Any,
    b: Any,
    c: Any,
    m: int,
    n: int,
    k: int,
    lda: int,
    ldb: int,
    ldc: int,
    trans_a: bool,
    trans_b: bool,
    alpha: float = 1.0,
    beta: float = 0.0,
    batch: int = 1,
    strides: tuple[int, int, int] = (0, 0, 0),
    compute: int = COMPUTE_32F,
    args: Callable[..., CublasCall] = cublas_args,
    new_c: Callable[[], Any] | None = None,
) -> PreparedGemm:
    """Run the guard on C-contiguous buffers (their bytes are the buffer lengths) and resolve the cuBLAS call.

    Raises BufferTooSmall (nothing reaches cuBLAS) when the guard refuses, TypeError on unsupported types.
    ``new_c`` makes the output when a call passes ``c=None``.
    """
    swap, cargs = _guarded_args(
        ctx, a, b, c, m, n, k, lda, ldb, ldc, trans_a, trans_b, alpha, beta, batch, strides, compute, args
    )
    return ctx.step_call(ctx.api.prepare(*cargs), swap, new_c, cargs)


def bind_gemm(
    ctx: GemmContext,
    a: Any,
    b: Any,
    c: Any,
    m: int,
    n: int,
    k: int,
    lda: int,
    ldb: int,
    ldc: int,
    trans_a: bool,
    trans_b: bool,
    alpha: float = 1.0,
    beta: float = 0.0,
    batch: int = 1,
    strides: tuple[int, int, int] = (0, 0, 0),
    compute: int = COMPUTE_32F,
    args: Callable[..., CublasCall] = cublas_args,
) -> BoundGemm:
    """:func:`prepare_gemm` with the three buffers bound too: ``call() -> c`` on exactly these buffers.

    The guard runs here, on these buffers; an allocation's size never changes and the call holds its
    buffers, so the guard's verdict covers every later call.
    """
    swap, cargs = _guarded_args(
        ctx, a, b, c, m, n, k, lda, ldb, ldc, trans_a, trans_b, alpha, beta, batch, strides, compute, args
    )
    first, second = (b, a) if swap else (a, b)
    return ctx.bound_call(ctx.api.bind(*cargs, first, second, c), c)


@entry_point("gemm")
def gemm_raw(
    ctx: GemmContext,
    a: Any,
    b: Any,
    c: Any,
    m: int,
    n: int,
    k: int,
    lda: int,
    ldb: int,
    ldc: int,
    trans_a: bool,
    trans_b: bool,
    alpha: float = 1.0,
    beta: float = 0.0,
    batch: int = 1,
    strides: tuple[int, int, int] = (0, 0, 0),
    compute: int = COMPUTE_32F,
    args: Callable[..., CublasCall] = cublas_args,
) -> Any:
    """Row-major C = alpha op(A) op(B) + beta C on C-contiguous buffers (their bytes are the buffer lengths).

    The guard runs before cuBLAS is reached.
    """
    return prepare_gemm(
        ctx, a, b, c, m, n, k, lda, ldb, ldc, trans_a, trans_b, alpha, beta, batch, strides, compute, args
    )(a, b, c)


# The call cache: one prepared call (handle, transposes, leading dimensions, alpha/beta host pointers, compute
# type all resolved) per call key. A key is everything the prepared call depends on: the operands' shapes,
# dtypes and layout (strides: a cached call is only ever made for C-contiguous operands, whose strides follow
# from shape and dtype, so the key holds the contiguity flag for CuPy's arrays and the strides for NumPy's),
# the current device (its context's handle), and every keyword of matmul. The stream is not in the key: the
# prepared call holds nothing of the stream (CuPy's binding sets the caller's current stream on every call,
# cupy_backends cublas.pyx _setStream), so one call serves every stream (test_gemm: the CUDA stream test).
# The guard is a pure function of ints that the key fixes (a C-contiguous buffer's bytes are its shape times
# its itemsize), so a key it accepted stays accepted.
_PREPARED: dict[tuple, PreparedGemm] = {}
_PREPARED_MAX = 4096


def _numpy_key(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None,
    trans_a: bool,
    trans_b: bool,
    alpha: float,
    beta: float,
    out_dtype: str | None,
    device: str,
    compute: int,
    args: Callable[..., CublasCall],
) -> tuple:
    if c is None:
        return (a.shape, a.strides, a.dtype, type(b), b.shape, b.strides, b.dtype, None, trans_a, trans_b, alpha,
                beta, out_dtype, device, compute, args)  # fmt: skip
    return (a.shape, a.strides, a.dtype, type(b), b.shape, b.strides, b.dtype, type(c), c.shape, c.strides,
            c.dtype, trans_a, trans_b, alpha, beta, out_dtype, device, compute, args)  # fmt: skip


def _cupy_key(
    a: Any,
    b: Any,
    c: Any,
    trans_a: bool,
    trans_b: bool,
    alpha: float,
    beta: float,
    out_dtype: str | None,
    device: str,
    compute: int,
    args: Callable[..., CublasCall],
) -> tuple:
    # One flat tuple (one hash, no nested tuples), attribute reads only: _c_contiguous is CuPy's cached flag
    # (.strides builds a tuple). The hot path is budgeted in hundreds of nanoseconds. A NumPy b or c has no
    # such attribute: AttributeError, the slow path (which converts it).
    if c is None:
        return (_device_id(), a.shape, a.dtype, b.shape, b.dtype, a._c_contiguous and b._c_contiguous, trans_a,
                trans_b, alpha, beta, out_dtype, device, compute, args)  # fmt: skip
    return (_device_id(), a.shape, a.dtype, b.shape, b.dtype, c.shape, c.dtype,
            a._c_contiguous and b._c_contiguous and c._c_contiguous, trans_a, trans_b, alpha, beta, out_dtype,
            device, compute, args)  # fmt: skip


# Call key per array class of A (registered when the class's module is first used).
_CALL_KEYS: dict[type, Callable[..., tuple]] = {np.ndarray: _numpy_key}
# The same-arrays path (matmul): id(c) of a call on the very arrays of the previous one -> the three arrays' weak
# references, the shapes and dtypes the call key read, the options, the device (and how to ask for the current one),
# the context, the GEMM counter and the call bound to the buffers. A hit checks identities and shapes instead of
# hashing the call key (the key and its lookup took 1.6 us of a 10.2 us raw call on an H200, 2026-11-27; the hit path
# takes ~1.2 us of host time with the GEMM itself bound as bind_matmul's C-level partial). Only classes whose arrays
# cannot be re-pointed or re-strided in place are admitted (CuPy's: the data pointer and strides are read-only; the
# shape, settable in place, is checked on every hit).
_SAME: dict[int, tuple] = {}
_SAME_MAX = 256
_SAME_ARRAYS: dict[type, Callable[[], int]] = {}  # admitted class -> its current device's id
_LAST_IDS: list[tuple[int, int, int] | None] = [None]


def _device_id() -> int:
    import cupy

    global _device_id
    _device_id = cupy.cuda.runtime.getDevice  # rebinding: later calls skip the import
    return _device_id()


def _keyable(alpha: float, beta: float) -> bool:
    """Whether a key identifies these scalars: -0.0 == 0.0 and NaN != NaN as floats, so neither is cached."""
    return alpha == alpha and beta == beta and alpha != 0  # a zero beta's sign changes nothing (C is not read)


def clear_calls() -> None:
    """Drop every cached matmul call (the next call of each key prepares anew)."""
    _PREPARED.clear()
    _SAME.clear()


@entry_point("gemm", axes={"trans_a": (False, True), "trans_b": (False, True)}, records_itself=True)
def matmul(
    a: Any,
    b: Any,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    c: Any = None,
    out_dtype: str | None = None,
    device: str = "auto",
    compute: int = COMPUTE_32F,
    args: Callable[..., CublasCall] = cublas_args,
) -> Any:
    """C = alpha op(A) op(B) + beta C for C-contiguous row-major stored 2-D (or 3-D batched) arrays.

    The first call with a call key validates the shapes, runs the guard and prepares the cuBLAS call; later
    calls with the same key reuse it: a dict lookup, then the prepared call (the raw binding plus one frame).
    Calls on the very arrays of the previous call (a step's loop) skip the key: identity and shape checks, then
    the call bound to their pointers.
    """
    # Not wrapped (records_itself): #29 holds a call to 1.2x the raw binding's 10-14 us, and the generic wrapper's
    # frame and argument forwarding cost about a microsecond of it.
    if recording_log() is not None:  # kc check records the entry point's coverage
        given = {"trans_a": trans_a, "trans_b": trans_b, "c": c, "device": device}  # the axes, and where it runs
        note_call(matmul, (a, b), given)
    if c is not None:
        same = _SAME.get(id(c))
        if same is not None:
            ra, rb, rc, sa, sb, sc, da, db, dc, opts, device_of, dev, ctx, cell, call = same
            # The very arrays of an earlier call (alive: their weak references), still of the shapes and dtypes
            # its call key read (a CuPy array's shape can be set in place), the same options and device, and
            # the context still open: the call bound to these buffers' pointers (``_remember``).
            if (
                ra() is a
                and rb() is b
                and rc() is c
                and a.shape == sa
                and b.shape == sb
                and c.shape == sc
                and a.dtype is da
                and b.dtype is db
                and c.dtype is dc
                and opts == (trans_a, trans_b, alpha, beta, out_dtype, device, compute, args)
                and ctx.handle is not None
                and device_of() == dev
            ):
                cell[0] += 1
                call()
                return c
            del _SAME[id(c)]
    key_of = _CALL_KEYS.get(type(a))
    key = None
    if key_of is not None:
        try:
            key = key_of(a, b, c, trans_a, trans_b, alpha, beta, out_dtype, device, compute, args)
        except AttributeError:
            key = None
        else:
            prepared = _PREPARED.get(key)
            if prepared is not None:
                if c is not None and type(a) in _SAME_ARRAYS:
                    _remember(a, b, c, (trans_a, trans_b, alpha, beta, out_dtype, device, compute, args), prepared)
                return prepared(a, b, c)
    return _matmul_first(key, a, b, trans_a, trans_b, alpha, beta, c, out_dtype, device, compute, args)


def _remember(a: Any, b: Any, c: Any, opts: tuple, prepared: PreparedGemm) -> None:
    """Keep a cached call's arrays for the same-arrays path once the same three arrays come twice in a row (a
    step's loop); arrays that change every call (activations) cost one tuple comparison here and nothing more."""
    ids = (id(a), id(b), id(c))
    if _LAST_IDS[0] != ids:
        _LAST_IDS[0] = ids
        return
    if len(_SAME) >= _SAME_MAX:
        _SAME.clear()
    refs = (weakref.ref(a), weakref.ref(b), weakref.ref(c))
    device_of = _SAME_ARRAYS[type(a)]
    shapes, dtypes = (a.shape, b.shape, c.shape), (a.dtype, b.dtype, c.dtype)
    ctx, run, cell, swap, args = prepared.parts
    operands = (b, a, c) if swap else (a, b, c)
    # The backend's call bound to these buffers' pointers (CuPy: a C-level partial of gemmEx, as bind_matmul's call,
    # holding ints only: valid while the arrays live, which every hit checks first), else the prepared run called
    # on them through weak references (a partial would keep them alive).
    call = ctx.api.bind_unowned(*args, *operands)
    if call is None:
        weak = tuple(weakref.ref(x) for x in operands)

        def call(run: Callable[[Any, Any, Any], None] = run, weak: tuple = weak) -> None:
            run(weak[0](), weak[1](), weak[2]())

    elif GRAPHS and ctx.device == "cuda":
        call = _graphed(ctx.api, call) or call
    _SAME[id(c)] = (*refs, *shapes, *dtypes, opts, device_of, device_of(), ctx, cell, call)


# Whether the same-arrays path replays its GEMM as a CUDA graph (cuda): cuBLAS's host work per call (~9-15 us of
# cublasGemmEx on an H100, as much as a thin GEMM's GPU time) becomes one graph launch (#29: matmul within 1.2x of
# the raw binding). The graph holds the very pointers the bound call holds; a hit checks the arrays as before.
GRAPHS = True


class GraphedCall:
    """A bound GEMM captured once into a CUDA graph: each call launches the graph on the current stream, or, while
    that stream is being captured (a graph cannot be launched into a capture), runs the bound call itself."""

    __slots__ = ("bound", "graph", "stream", "launch", "capturing", "current", "launches")

    def __init__(self, bound: Callable[[], None], graph: Any, stream: Any) -> None:
        import cupy
        from cupy_backends.cuda.api import runtime

        # The capture stream is kept with its graph (nothing refers to it after the capture; it costs nothing).
        self.bound, self.graph, self.stream, self.launch = bound, graph, stream, graph.launch
        self.capturing, self.current = runtime.streamIsCapturing, cupy.cuda.get_current_stream
        self.launches = 0

    def __call__(self) -> None:
        if self.capturing(self.current().ptr):
            self.bound()
        else:
            self.launch()
            self.launches += 1


def matmul_path(c: Any) -> str:
    """How a matmul into ``c`` runs now: "graph" (the same-arrays path's CUDA graph), "bound" (its bound call) or
    "keyed" (the call-key cache; the same-arrays path holds nothing for ``c``): evidence for the per-call timings."""
    same = _SAME.get(id(c))
    if same is None or same[2]() is not c:
        return "keyed"
    return "graph" if isinstance(same[-1], GraphedCall) else "bound"


def _graphed(api: Any, bound: Callable[[], None]) -> GraphedCall | None:
    """``bound`` as a :class:`GraphedCall`, or None where the backend has no graphs or refuses the capture (the
    caller keeps the bound call). Capturing runs nothing: the GEMM runs when the graph is launched."""
    try:
        import cupy
        from cupy_backends.cuda.api import runtime

        if runtime.streamIsCapturing(cupy.cuda.get_current_stream().ptr):
            return None  # inside a caller's capture: no capture of our own
        made = api.graph(bound)
    except Exception:  # noqa: BLE001 (a refused capture is not an error: the bound call stays)
        return None
    return None if made is None else GraphedCall(bound, *made)


def _matmul_operands(a: Any, b: Any, trans_a: bool, trans_b: bool, c: Any, out_dtype: str | None, device: str) -> tuple:
    """Validate and resolve matmul's operands: (device, a, b, c, ints for the guard, new_c, cacheable)."""
    from obligations.core.device import array_module, resolve_device

    dev = resolve_device(device)
    xp = array_module(dev)
    _CALL_KEYS.setdefault(xp.ndarray, _cupy_key if dev == "cuda" else _numpy_key)
    if dev == "cuda":
        _SAME_ARRAYS.setdefault(xp.ndarray, xp.cuda.runtime.getDevice)  # the C function itself: no import per call
    # Converted operands are new arrays: their signature says nothing about the next call's.
    cacheable = (
        isinstance(a, xp.ndarray)
        and isinstance(b, xp.ndarray)
        and a.flags.c_contiguous
        and b.flags.c_contiguous
        and (c is None or isinstance(c, xp.ndarray))
    )
    a, b = xp.ascontiguousarray(xp.asarray(a)), xp.ascontiguousarray(xp.asarray(b))
    batched = a.ndim == 3
    batch = int(a.shape[0]) if batched else 1
    if a.ndim not in (2, 3) or b.ndim != a.ndim:
        raise ValueError(f"GEMM takes 2-D or 3-D operands of equal rank, got {a.shape} and {b.shape}")
    (ar, ac), (br, bc) = a.shape[-2:], b.shape[-2:]
    m, k = (ac, ar) if trans_a else (ar, ac)
    k2, n = (bc, br) if trans_b else (br, bc)
    if k != k2 or (batched and b.shape[0] != batch):
        raise ValueError(f"GEMM shapes {a.shape} (trans {trans_a}) and {b.shape} (trans {trans_b}) do not match")
    out_dtype = out_dtype or str(a.dtype)
    shape = (batch, m, n) if batched else (m, n)
    new_c = functools.partial(xp.zeros, shape, dtype=out_dtype)
    if c is None:
        c = new_c()
    elif not isinstance(c, xp.ndarray) or tuple(c.shape) != shape or not c.flags.c_contiguous:
        raise ValueError(f"C must be a C-contiguous {xp.__name__} array of shape {shape}")
    ints = (int(m), int(n), int(k), int(ac), int(bc), int(n))
    return dev, a, b, c, ints, batch, (ar * ac, br * bc, m * n), new_c, cacheable


def _matmul_first(
    key: tuple | None,
    a: Any,
    b: Any,
    trans_a: bool,
    trans_b: bool,
    alpha: float,
    beta: float,
    c: Any,
    out_dtype: str | None,
    device: str,
    compute: int,
    args: Callable[..., CublasCall],
) -> Any:
    c_given = c
    dev, a, b, c, ints, batch, strides, new_c, cacheable = _matmul_operands(
        a, b, trans_a, trans_b, c, out_dtype, device
    )
    if not cacheable or not _keyable(alpha, beta):
        key = None
    elif key is None:  # the array class was registered just now
        key = _CALL_KEYS[type(a)](a, b, c_given, trans_a, trans_b, alpha, beta, out_dtype, device, compute, args)
    prepared = prepare_gemm(
        get_context(dev), a, b, c, *ints, trans_a, trans_b, alpha, beta, batch, strides, compute, args, new_c
    )
    if key is not None:
        if len(_PREPARED) >= _PREPARED_MAX:
            _PREPARED.clear()
        _PREPARED[key] = prepared
    return prepared(a, b, c)


def bind_matmul(
    a: Any,
    b: Any,
    c: Any = None,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    out_dtype: str | None = None,
    device: str = "auto",
    compute: int = COMPUTE_32F,
    args: Callable[..., CublasCall] = cublas_args,
) -> BoundGemm:
    """:func:`matmul` bound to these buffers for a step's hot loop: ``call()`` computes into ``call.c``.

    Operands are used as given (C-contiguous arrays of the device; nothing is converted), so later writes
    into ``a`` and ``b`` are seen by later calls. The guard runs once, here, on these buffers.
    """
    dev, a2, b2, c, ints, batch, strides, _, cacheable = _matmul_operands(a, b, trans_a, trans_b, c, out_dtype, device)
    if not cacheable:
        raise ValueError("bind_matmul binds C-contiguous arrays of the device as they are; convert them first")
    call = bind_gemm(get_context(dev), a2, b2, c, *ints, trans_a, trans_b, alpha, beta, batch, strides, compute, args)
    call.c = c
    return call


def bmm(a: Any, b: Any, **kw: Any) -> Any:
    """Batched matmul over the leading axis (cublasGemmStridedBatchedEx)."""
    if a.ndim != 3 or b.ndim != 3:
        raise ValueError("bmm takes 3-D arrays")
    return matmul(a, b, **kw)


# -- training entry points on cuBLAS (MK-14, MK-62, MK-63) ------------------------------------------------------


@entry_point("gemm", axes={"trans_a": (False, True), "trans_b": (False, True)})
def matmul_vjp(
    a: Any, b: Any, dc: Any, *, trans_a: bool = False, trans_b: bool = False, device: str = "auto"
) -> tuple[Any, Any]:
    """(dA, dB) of C = op(A) op(B) for the cotangent dC: dA = dC op(B)^T, dB = op(A)^T dC, stored like A and B.

    Each is one cuBLAS GEMM through :func:`matmul` (so the buffer guard and CUBLAS_COMPUTE_32F hold): with A stored
    transposed, dA = (dC op(B)^T)^T = op(B) dC^T is computed directly in A's layout (likewise dB).
    """
    da = (
        matmul(b, dc, trans_a=trans_b, trans_b=True, device=device)
        if trans_a
        else matmul(dc, b, trans_b=not trans_b, device=device)
    )
    db = (
        matmul(dc, a, trans_a=True, trans_b=trans_a, device=device)
        if trans_b
        else matmul(a, dc, trans_a=not trans_a, device=device)
    )
    return da, db


@entry_point("gemm")
def linear(x: Any, weight: Any, bias: Any = None, *, device: str = "auto") -> Any:
    """y = x W^T + bias (W of shape (out, in)): one GEMM, the bias broadcast into C with beta = 1 (MK-62)."""
    from obligations.core.device import array_module, resolve_device

    dev = resolve_device(device)
    xp = array_module(dev)
    if bias is None:
        return matmul(x, weight, trans_b=True, device=dev)
    shape = (int(x.shape[0]), int(weight.shape[0]))
    c = xp.empty(shape, dtype=xp.float32)  # a writable C (a broadcast view may be read-only even when contiguous)
    c[...] = xp.asarray(bias, dtype=xp.float32)
    return matmul(x, weight, trans_b=True, beta=1.0, c=c, out_dtype="float32", device=dev)


@entry_point("gemm")
def addmm(c: Any, a: Any, b: Any, *, beta: float = 1.0, alpha: float = 1.0, device: str = "auto") -> Any:
    """beta C + alpha A B as one GEMM into a copy of C (C is not modified; MK-63)."""
    from obligations.core.device import array_module, resolve_device

    dev = resolve_device(device)
    xp = array_module(dev)
    c2 = xp.array(xp.asarray(c, dtype=xp.float32), copy=True)
    return matmul(a, b, alpha=alpha, beta=beta, c=c2, out_dtype="float32", device=dev)
