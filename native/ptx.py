"""PTX from NVRTC without a GPU: the compiled code of a build, for the audit to read.

NVRTC ships as pip wheels (``cuda-bindings`` and ``nvidia-cuda-nvrtc`` of the CUDA major in use), so the
PTX of every kernel is available on a CPU-only CI machine. Options are the route's own
(:mod:`native.nvrtc`), the target a virtual architecture (``compute_90``: Hopper).
"""

from __future__ import annotations

import functools

__all__ = ["PtxUnavailable", "ARCH", "compile_ptx", "nvrtc_version"]

ARCH = "compute_90"


class PtxUnavailable(RuntimeError):
    """NVRTC cannot be loaded here; the message says what to install."""


def _nvrtc():  # noqa: ANN202 - a module
    try:
        from cuda.bindings import nvrtc
    except Exception as exc:  # ImportError, or a binding without its NVRTC library
        raise PtxUnavailable(
            f"NVRTC is not importable ({type(exc).__name__}: {exc}); "
            "pip install 'kernel-contracts[audit]' (cuda-bindings and nvidia-cuda-nvrtc)"
        ) from None
    return nvrtc


def _check(result: tuple, what: str, prog: object = None) -> tuple:
    nvrtc = _nvrtc()
    if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        log = ""
        if prog is not None:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            buf = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, buf)
            log = buf.decode(errors="replace").strip()
        raise RuntimeError(f"NVRTC {what} failed ({result[0].name}): {log}")
    return result


@functools.cache
def nvrtc_version() -> str:
    """NVRTC's version, e.g. "13.0"; PtxUnavailable where NVRTC is missing."""
    _, major, minor = _check(_nvrtc().nvrtcVersion(), "version")
    return f"{major}.{minor}"


@functools.cache
def compile_ptx(source: str, options: tuple[str, ...], arch: str = ARCH) -> str:
    """PTX text of ``source`` compiled with NVRTC ``options`` for ``arch``; RuntimeError with the log."""
    nvrtc = _nvrtc()
    _, prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], []), "create")
    try:
        opts = [o.encode() for o in (*options, f"--gpu-architecture={arch}")]
        _check(nvrtc.nvrtcCompileProgram(prog, len(opts), opts), "compile", prog)
        _, size = _check(nvrtc.nvrtcGetPTXSize(prog), "PTX size")
        buf = b" " * size
        _check(nvrtc.nvrtcGetPTX(prog, buf), "PTX")
        return buf.rstrip(b"\0 ").decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
