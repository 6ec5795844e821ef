"""The project's own compile route: NVRTC with explicit float flags, recorded as the float environment.

CuPy's stock compile path appends ``-ftz=true`` to every kernel and the last flag wins, so a kernel built
through ``cupy.RawKernel`` cannot keep subnormals (cupy/cupy#8382). This module compiles through
``cupy.cuda.compiler.compile_using_nvrtc`` (which does not append the flag) and loads the binary with
``cupy.cuda.function.Module``. Each :class:`Route` names its flags and the softfloat environment that
those flags promise, so a contract can check a kernel against exactly what its compilation implies. The
stock route stays available as a named route whose environment is ``cuda-ftz``.

Compiled binaries are kept on disk, on by default: ``KC_KERNEL_CACHE`` (``0`` turns it off), else
``$XDG_CACHE_HOME/kernel-contracts/nvrtc`` (``~/.cache/kernel-contracts/nvrtc``). Entries are keyed by the
source, the options, the architecture and the CuPy and NVRTC versions, so a process does not pay NVRTC again
for a kernel an earlier one built (CuPy's own kernels have CuPy's cache, ``CUPY_CACHE_DIR``); processes that miss
the same entry at once build it once (a lock per entry). The audit's PTX and CUBINs (:mod:`native.ptx`) are kept
there too (:func:`cached_build`), keyed by the NVRTC library's build-id.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CompileFlags",
    "Route",
    "ROUTES",
    "INDEX_TYPES",
    "register_route",
    "get_route",
    "compile_function",
    "cached_build",
]


# The C type of a grid-stride index of a plan's ``index_bits``: kernel sources read it from their plan.
INDEX_TYPES: dict[int, str] = {64: "long long", 32: "int"}


@dataclass(frozen=True)
class CompileFlags:
    """NVRTC float flags; ``fast_math`` implies ftz, approximate div/sqrt, contraction and intrinsics."""

    ftz: bool = False
    fmad: bool = False
    prec_div: bool = True
    prec_sqrt: bool = True
    fast_math: bool = False

    def options(self) -> tuple[str, ...]:
        """The NVRTC command-line options that realise these flags (every flag explicit)."""
        if self.fast_math:
            return ("--use_fast_math",)
        b = {True: "true", False: "false"}
        return (
            f"-ftz={b[self.ftz]}",
            f"-fmad={b[self.fmad]}",
            f"-prec-div={b[self.prec_div]}",
            f"-prec-sqrt={b[self.prec_sqrt]}",
        )

    def to_json(self) -> dict[str, Any]:
        """JSON evidence: the flags and the exact options passed."""
        return {
            "ftz": self.ftz,
            "fmad": self.fmad,
            "prec_div": self.prec_div,
            "prec_sqrt": self.prec_sqrt,
            "fast_math": self.fast_math,
            "options": list(self.options()),
        }


@dataclass(frozen=True)
class Route:
    """A named way to compile a kernel: own NVRTC flags, or CuPy's stock path (``flags`` None).

    ``env`` is the softfloat environment the route promises for correctly rounded operations.
    """

    name: str
    env: str
    flags: CompileFlags | None
    doc: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON evidence describing the route."""
        flags = self.flags.to_json() if self.flags else {"stock": True, "appended_by_cupy": ["-ftz=true"]}
        return {"route": self.name, "env": self.env, "flags": flags}


ROUTES: dict[str, Route] = {}


def register_route(route: Route) -> Route:
    """Add a route by name (names are unique)."""
    if route.name in ROUTES and ROUTES[route.name] != route:
        raise ValueError(f"compile route {route.name!r} is registered twice")
    ROUTES[route.name] = route
    return route


def get_route(name: str) -> Route:
    """The registered route ``name``; KeyError lists the known ones."""
    try:
        return ROUTES[name]
    except KeyError:
        raise KeyError(f"unknown compile route {name!r}; known: {sorted(ROUTES)}") from None


register_route(
    Route(
        "nvrtc-ieee",
        "cuda",
        CompileFlags(ftz=False, fmad=False),
        "subnormals kept, no contraction, IEEE div/sqrt: the project's default",
    )
)
register_route(
    Route(
        "nvrtc-fmad",
        "cuda",
        CompileFlags(ftz=False, fmad=True),
        "as nvrtc-ieee but a*b+c may be contracted to fma (NVRTC's default)",
    )
)
register_route(
    Route(
        "nvrtc-ftz",
        "cuda-ftz",
        CompileFlags(ftz=True, fmad=False),
        "subnormal inputs and results flushed to signed zero",
    )
)
register_route(
    Route(
        "nvrtc-fast-math",
        "cuda-ftz",
        CompileFlags(fast_math=True),
        "--use_fast_math: ftz, approximate div/sqrt, contraction, __expf etc.",
    )
)
register_route(
    Route(
        "cupy-stock",
        "cuda-ftz",
        None,
        "cupy.RawKernel with default options: CuPy appends -ftz=true; fmad defaults to true",
    )
)


@functools.cache
def _arch() -> str:
    import cupy

    # Private but stable helper (float-facts.md); fall back to the device's compute capability.
    get = getattr(cupy.cuda.compiler, "_get_arch", None)
    return str(get()) if get else str(cupy.cuda.Device().compute_capability)


@functools.cache
def _compile_cached(source: str, name: str, route_name: str) -> Callable[..., Any]:
    import cupy

    route = get_route(route_name)
    if route.flags is None:
        return cupy.RawKernel(source, name)  # the stock path, -ftz=true appended by CuPy
    binary = _binary(source, route.flags.options())
    module = cupy.cuda.function.Module()
    module.load(binary)
    return module.get_function(name)


def _cache_dir() -> Path | None:
    """The on-disk NVRTC cache: ``KC_KERNEL_CACHE`` (``0``: off), else the per-user cache directory."""
    where = os.environ.get("KC_KERNEL_CACHE", "")
    if where == "0":
        return None
    if where:
        return Path(where)
    # On by default so every `kc sweep` / `kc check` after the first loads its kernels instead of compiling them.
    base = os.environ.get("XDG_CACHE_HOME", "")
    try:
        root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    except RuntimeError:  # no home directory (a bare container user): compile every time, never fail
        return None
    return root / "kernel-contracts" / "nvrtc"


def _read_entry(path: Path | None) -> Any:
    """The binary stored at ``path`` ("s" + PTX text or "b" + cubin bytes), or None (none, or unreadable)."""
    if path is None or not path.is_file():
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if data[:1] not in (b"s", b"b") or len(data) < 2:
        return None  # an unreadable entry is rebuilt
    try:
        return data[1:].decode() if data[:1] == b"s" else data[1:]
    except UnicodeDecodeError:
        return None


# How long a process waits for another that is compiling the same kernel before it compiles it too (a compile
# takes seconds; a holder that died released its lock with its last descriptor)
LOCK_WAIT_S = 300.0


@contextlib.contextmanager
def _compiling(path: Path | None) -> Iterator[None]:
    """Hold ``path``'s compile lock (``fcntl.flock`` on a ``.lock`` beside it): of the processes that miss the same
    entry at once (30 kc worker processes of a fresh 2-GPU cluster), one compiles and the others read its entry."""
    fd = None
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # a read-only cache: compile without the lock
            fd = None
    if fd is None:
        yield
        return
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break  # compile anyway: a stuck holder only costs this process its own compile
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the lock


def cached_build(key: str, build: Callable[[], str | bytes]) -> str | bytes:
    """``build()`` (PTX text or binary bytes) kept on disk under ``key`` (a digest of everything the output depends
    on): read back where an earlier process stored it, else built and stored by one of the processes that need it
    at once (:func:`_compiling`); built every time where the cache is off (``KC_KERNEL_CACHE=0``)."""
    cache = _cache_dir()
    path = cache / f"{key}.bin" if cache is not None else None
    found = _read_entry(path)
    if found is not None:
        return found
    with _compiling(path):
        found = _read_entry(path)  # another process built it while this one waited
        if found is not None:
            return found
        output = build()
        if path is not None:
            try:
                tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
                tmp.write_bytes(b"s" + output.encode() if isinstance(output, str) else b"b" + bytes(output))
                os.replace(tmp, path)
            except OSError:
                pass  # a read-only or full disk only costs the next process a build
    return output


def _binary(source: str, options: tuple[str, ...]) -> Any:
    """The NVRTC binary of ``source`` under ``options``: from the disk cache, else compiled (and stored)."""
    import cupy

    arch = _arch()
    nvrtc_version = cupy.cuda.nvrtc.getVersion()
    key = hashlib.sha256(repr((source, options, arch, cupy.__version__, nvrtc_version)).encode()).hexdigest()

    def compiled() -> Any:
        out = cupy.cuda.compiler.compile_using_nvrtc(source, options=options, arch=arch)
        return out[0] if isinstance(out, tuple) else out

    return cached_build(key, compiled)


def compile_function(source: str, name: str, route: str) -> Callable[..., Any]:
    """Compile ``source`` via ``route`` and return the launchable ``extern "C"`` function ``name``.

    The result is called as ``fn((grid,), (block,), args)``; compiled functions are cached per
    (source, name, route).
    """
    get_route(route)
    return _compile_cached(source, name, route)
