"""PTX and SASS from NVRTC without a GPU: the compiled code of a build, for the audit to read.

NVRTC ships as pip wheels (``cuda-bindings`` and ``nvidia-cuda-nvrtc`` of the CUDA major in use), so the
PTX of every kernel is available on a CPU-only CI machine. Options are the route's own
(:mod:`native.nvrtc`), the target a virtual architecture (``compute_90``: Hopper). The machine code (SASS)
is NVRTC's CUBIN for a real architecture (``sm_90``) disassembled by ``nvdisasm``, where one is found (the
CUDA toolkit on a device machine, or the ``nvidia-cuda-nvdisasm`` wheel). Both are kept in the kernel cache
(:func:`native.nvrtc.cached_build`) under the NVRTC library's build-id, the source, options and target.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from native.builds import Build, Toolchain, ToolchainUnavailable, register_toolchain
from native.nvrtc import cached_build, get_route

__all__ = [
    "PtxUnavailable",
    "SassUnavailable",
    "ARCH",
    "SASS_ARCH",
    "compile_ptx",
    "compile_cubin",
    "nvdisasm_path",
    "disassemble",
    "nvrtc_version",
    "nvrtc_library",
    "nvdisasm_identity",
    "build_options",
]

ARCH = "compute_90"
SASS_ARCH = "sm_90"


class PtxUnavailable(RuntimeError):
    """NVRTC cannot be loaded here; the message says what to install."""


class SassUnavailable(RuntimeError):
    """No ``nvdisasm`` here: SASS cannot be read (the message says where one was looked for)."""


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


def _elf_build_id(path: str) -> str | None:
    """The GNU build-id note of an ELF64 little-endian shared library (read from its program headers), or None."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:6] != b"\x7fELF\x02\x01":
            return None
        phoff, phentsize, phnum = (
            int.from_bytes(head[32:40], "little"),
            int.from_bytes(head[54:56], "little"),
            int.from_bytes(head[56:58], "little"),
        )
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        for i in range(phnum):
            ph = table[i * phentsize : (i + 1) * phentsize]
            if int.from_bytes(ph[0:4], "little") != 4:  # PT_NOTE
                continue
            f.seek(int.from_bytes(ph[8:16], "little"))
            notes, at = f.read(min(int.from_bytes(ph[32:40], "little"), 1 << 16)), 0
            while at + 12 <= len(notes):
                namesz, descsz, kind = (int.from_bytes(notes[at + k : at + k + 4], "little") for k in (0, 4, 8))
                name_end = at + 12 + ((namesz + 3) & ~3)
                if kind == 3 and notes[at + 12 : at + 12 + namesz].rstrip(b"\0") == b"GNU":  # NT_GNU_BUILD_ID
                    return notes[name_end : name_end + descsz].hex()
                at = name_end + ((descsz + 3) & ~3)
    return None


@functools.cache
def nvrtc_library() -> str | None:
    """The NVRTC library ``cuda.bindings`` calls, by its ELF build-id (the same binary wherever it is installed;
    a patched one of the same major.minor differs), else its path, size and modification time; None where it
    cannot be named."""
    nvrtc_version()  # loads it
    try:  # cuda.bindings loads NVRTC through cuda.pathfinder, whose answer is memoised: the same library
        from cuda.pathfinder import load_nvidia_dynamic_lib

        path = load_nvidia_dynamic_lib("nvrtc").abs_path
        build_id = _elf_build_id(path)
        st = os.stat(path)
    except Exception:  # an older binding without pathfinder, or a library that moved: the version alone
        return None
    return f"build-id {build_id}" if build_id else f"{path} {st.st_size} {st.st_mtime_ns}"


@functools.cache
def compile_ptx(source: str, options: tuple[str, ...], arch: str = ARCH) -> str:
    """PTX text of ``source`` compiled with NVRTC ``options`` for ``arch``; RuntimeError with the log."""
    return _compile(source, options, arch, "PTX").rstrip(b"\0 ").decode()


def _compile(source: str, options: tuple[str, ...], arch: str, what: str) -> bytes:
    """NVRTC's ``what`` (PTX or CUBIN) of ``source``: from the kernel cache where the NVRTC library can be named (the
    same library, source, options and target give the same output: the audit's 140 EW builds took 3.4 s to compile
    on every run), else compiled."""
    library = nvrtc_library()
    if library is None:
        return _compile_now(source, options, arch, what)
    key = hashlib.sha256(repr(("ptx.py", what, source, options, arch, library)).encode()).hexdigest()
    out = cached_build(key, lambda: _compile_now(source, options, arch, what))
    return out if isinstance(out, bytes) else out.encode()


def _compile_now(source: str, options: tuple[str, ...], arch: str, what: str) -> bytes:
    nvrtc = _nvrtc()
    _, prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], []), "create")
    try:
        opts = [o.encode() for o in (*options, f"--gpu-architecture={arch}")]
        _check(nvrtc.nvrtcCompileProgram(prog, len(opts), opts), "compile", prog)
        size_fn, get_fn = (
            (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
            if what == "PTX"
            else (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
        )
        _, size = _check(size_fn(prog), f"{what} size")
        buf = b" " * size
        _check(get_fn(prog, buf), what)
        return buf
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@functools.cache
def compile_cubin(source: str, options: tuple[str, ...], arch: str = SASS_ARCH) -> bytes:
    """CUBIN (machine code) of ``source`` compiled with NVRTC ``options`` for the real ``arch``."""
    return _compile(source, options, arch, "CUBIN")


@functools.cache
def nvdisasm_path() -> str | None:
    """The ``nvdisasm`` to use: $KC_NVDISASM, then PATH, the CUDA toolkit, the nvidia-cuda-nvdisasm wheel, the one
    Triton's wheel bundles."""
    candidates = [os.environ.get("KC_NVDISASM"), shutil.which("nvdisasm"), "/usr/local/cuda/bin/nvdisasm"]
    try:
        import nvidia

        candidates += [str(Path(p) / sub / "bin" / "nvdisasm") for p in nvidia.__path__ for sub in ("cu13", "cu12")]
    except ImportError:
        pass
    spec = importlib.util.find_spec("triton")  # located, not imported: importing triton costs a third of a second
    if spec is not None and spec.origin:
        candidates.append(str(Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "nvdisasm"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@functools.cache
def _nvdisasm_version(tool: str) -> tuple[str | None, str]:
    """(``tool --version``'s text, or None where it cannot be read; why not)."""
    try:
        proc = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"version unreadable: {type(exc).__name__}"
    if proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.strip(), ""
    return None, f"exit {proc.returncode}"


@functools.cache
def nvdisasm_identity() -> str | None:
    """The nvdisasm the SASS audit runs, by its ``--version`` text (the same release wherever it is installed; its
    path where that text cannot be read); None: there is none."""
    tool = nvdisasm_path()
    if tool is None:
        return None
    text, why = _nvdisasm_version(tool)
    return text if text is not None else f"{tool} ({why})"


@functools.cache
def disassemble(cubin: bytes) -> str:
    """SASS text of a CUBIN (``nvdisasm -c``: code sections only); SassUnavailable without nvdisasm. Kept in the
    kernel cache under the nvdisasm release and the CUBIN's digest (one nvdisasm process per build, every run)."""
    tool = nvdisasm_path()
    if tool is None:
        raise SassUnavailable("no nvdisasm (PATH, /usr/local/cuda/bin, the nvidia-cuda-nvdisasm wheel, $KC_NVDISASM)")
    release, _ = _nvdisasm_version(tool)
    if release is None:  # a release it cannot name: not kept
        return _disassemble_now(tool, cubin)
    key = hashlib.sha256(repr(("nvdisasm -c", release, hashlib.sha256(cubin).hexdigest())).encode()).hexdigest()
    out = cached_build(key, lambda: _disassemble_now(tool, cubin))
    return out if isinstance(out, str) else out.decode()


def _disassemble_now(tool: str, cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        proc = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"nvdisasm failed ({proc.returncode}): {proc.stderr.strip()[:500]}")
    return proc.stdout


def build_options(build: Build) -> tuple[str, ...]:
    """The NVRTC options of a build: its route's own (CuPy's stock route: the -ftz=true CuPy appends)."""
    route = get_route(build.route)
    return route.flags.options() if route.flags else ("-ftz=true",)


def _nvrtc_version() -> str:
    try:
        return nvrtc_version()
    except PtxUnavailable as exc:
        raise ToolchainUnavailable(str(exc)) from None


def _inputs(build: Build) -> dict[str, object]:
    """What NVRTC's code of ``build`` depends on beyond its source and NVRTC's version: the options, both
    targets, and the loaded library."""
    return {"options": build_options(build), "arch": ARCH, "sass_arch": SASS_ARCH, "library": nvrtc_library()}


register_toolchain(
    Toolchain(
        "nvrtc",
        _nvrtc_version,
        get_route,
        lambda b: compile_ptx(b.source, build_options(b)),
        lambda b: compile_cubin(b.source, build_options(b)),
        _inputs,
    )
)
