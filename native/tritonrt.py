"""Triton kernels as contract subjects: launched from their plan, run on a GPU or through Triton's interpreter,
compiled to PTX and SASS for the audit without a GPU.

**One source, two meanings.** :func:`launch` takes the grid (the plan's ``grid`` quantity) and every
``tl.constexpr`` parameter of the kernel (the plan's quantity of the same name) from the plan, and nothing
else: the plan that Z3 proves is the one the launch uses, and a constexpr the plan does not choose is an
error before anything runs. ``num_warps`` is the plan's where it names one.

**Where it runs.** ``device="cuda"``: the compiled kernel on the GPU (CuPy arrays, passed by pointer).
``device="host"``: Triton's interpreter (the semantics of ``TRITON_INTERPRET=1``: every program of the grid
run in turn by NumPy), on NumPy arrays passed through a small object with ``data_ptr()`` and ``dtype`` (no
torch: triton-lang/triton#5493). Each array the interpreter sees is a copy with a guard region on both
sides; a store outside the array is :class:`OutOfBounds`, a load there reads a NaN canary. Every launch
notes how it ran (:mod:`obligations.core.execution`), so a check's evidence says "interpreter".

**The audit.** The ``triton`` toolchain compiles a build (its ``function`` a ``module:attr`` of a
``@triton.jit`` kernel, its ``specialization`` the signature, constexprs and num_warps) for sm_90 with
``triton.compile``, which needs no GPU: Triton's own PTX, and its CUBIN for the SASS level (Triton's wheel
ships ptxas and nvdisasm). Routes: ``triton`` (Triton's defaults: ``enable_fp_fusion``) and
``triton-ieee`` (no fusion, libdevice without its ftz reflection).

triton is an optional extra (``pip install 'kernel-contracts[triton]'``); nothing here imports it until a
kernel is launched or compiled, and without it every Triton item is ``skipped`` with that reason.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import sysconfig
import threading
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from native.builds import Build, Toolchain, ToolchainUnavailable, register_toolchain
from native.kinds import KernelKind, register_kind
from native.nvrtc import Route
from obligations.core.execution import note
from obligations.core.plans import quantities, resolve

__all__ = [
    "MIN_VERSION",
    "TritonUnavailable",
    "OutOfBounds",
    "triton_unavailable",
    "triton_version",
    "constexpr_names",
    "launch",
    "ROUTES",
    "ROUTE_OPTIONS",
    "triton_build",
    "compiled",
    "load_kernel_module",
    "kernel_sources",
]

MIN_VERSION = (3, 2)
INSTALL = "pip install 'kernel-contracts[triton]'"


class TritonUnavailable(ToolchainUnavailable):
    """triton is not importable here (or older than MIN_VERSION); the message says what to install."""


class OutOfBounds(RuntimeError):
    """An interpreted launch wrote outside an array it was given (the guard region around it changed)."""


@functools.cache
def triton_unavailable() -> str | None:
    """Why Triton kernels cannot run here (not installed, too old), or None when they can."""
    try:
        import triton
    except Exception as exc:  # ImportError, or a broken install
        return f"triton is not importable ({type(exc).__name__}: {exc}); {INSTALL}"
    version = tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_VERSION:
        return f"triton {triton.__version__} is older than {'.'.join(map(str, MIN_VERSION))}; {INSTALL}"
    return None


def triton_version() -> str:
    """The installed triton's version; TritonUnavailable where there is none."""
    if (why := triton_unavailable()) is not None:
        raise TritonUnavailable(why)
    import triton

    return str(triton.__version__)


def _is_kernel(obj: Any) -> bool:
    return type(obj).__name__ in ("JITFunction", "InterpretedFunction") and callable(getattr(obj, "fn", None))


def constexpr_names(kernel: Any) -> list[str]:
    """The kernel's ``tl.constexpr`` parameters, in order (read from its Python signature)."""
    sig = inspect.signature(kernel.fn)
    return [n for n, p in sig.parameters.items() if "constexpr" in str(p.annotation)]


# -- the launch -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Launch:
    grid: tuple[int, ...]
    constexprs: dict[str, int]
    num_warps: int | None


def _from_plan(kernel: Any, plan: Any) -> _Launch:
    qs = quantities(plan)
    if "grid" not in qs:
        raise ValueError(f"plan {type(plan).__name__} has no 'grid' quantity: a Triton launch takes its grid from it")
    grid = qs["grid"]() if callable(qs["grid"]) else qs["grid"]
    names = constexpr_names(kernel)
    missing = [n for n in names if n not in qs]
    if missing:
        raise ValueError(
            f"kernel {kernel.fn.__name__}'s tl.constexpr {missing} are not quantities of plan {type(plan).__name__}:"
            " every constexpr comes from the plan"
        )
    warps = qs.get("num_warps")
    return _Launch(tuple(int(g) for g in grid), {n: int(qs[n]) for n in names}, None if warps is None else int(warps))


def launch(kernel: Any, plan: Any, *args: Any, device: str) -> None:
    """Launch ``kernel`` over the plan's grid with its constexprs from the plan: on the GPU (``cuda``: CuPy
    arrays) or through Triton's interpreter (``host``: NumPy arrays, guarded). Nothing runs on an empty grid."""
    if (why := triton_unavailable()) is not None:
        raise TritonUnavailable(why)
    plan_launch = _from_plan(kernel, plan)
    if 0 in plan_launch.grid:
        return
    if device == "host":
        _interpret(kernel, plan_launch, args)
        note("triton", mode="interpreter (TRITON_INTERPRET semantics: NumPy on the host)", version=triton_version())
        return
    extra = {} if plan_launch.num_warps is None else {"num_warps": plan_launch.num_warps}
    kernel[plan_launch.grid](
        *(_CudaArg(a) if hasattr(a, "data") else a for a in args), **plan_launch.constexprs, **extra
    )
    note("triton", mode="compiled (GPU)", version=triton_version())


class _CudaArg:
    """A CuPy array as Triton's launcher takes a tensor: ``data_ptr()`` and ``dtype``."""

    def __init__(self, a: Any) -> None:
        self.a = a
        self.dtype = a.dtype

    def data_ptr(self) -> int:
        """The device pointer."""
        return int(self.a.data.ptr)


# -- the interpreter ------------------------------------------------------------------------------------------------

# The guard words: a signalling NaN of its own per argument (0x7F80A0nn, nn the argument's index): a load past an
# array reads a NaN the result shows, arithmetic quiets it, and a value carried from one array's guard into
# another's differs from that one's words, so a store past an array changes its guard even then.
CANARY = 0x7F80A000
_GUARD_BYTES = 256


class _HostTensor:
    """A NumPy array as Triton's interpreter takes a tensor: the few torch methods it calls on its arguments
    (``data_ptr``, ``dtype``, ``untyped_storage``, ``new_empty``/``set_``, ``copy_``): the memory is already
    the host's, so every "copy to the host" is the array itself."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.dtype = a.dtype

    def data_ptr(self) -> int:
        """The array's address."""
        return int(self.a.ctypes.data)

    def untyped_storage(self) -> _HostTensor:
        """Its storage: itself."""
        return self

    def cpu(self) -> _HostTensor:
        """On the host already."""
        return self

    def copy_(self, other: Any) -> _HostTensor:
        """Nothing to copy: the interpreter ran on this very memory."""
        return self

    def new_empty(self, *shape: Any, **kw: Any) -> _HostTensor:
        """The tensor the interpreter re-points at the storage: itself."""
        return self

    def set_(self, *a: Any) -> _HostTensor:
        """Re-pointed at its own storage: itself."""
        return self

    def storage_offset(self) -> int:
        """No offset into its storage."""
        return 0

    def size(self) -> tuple[int, ...]:
        """Its shape."""
        return tuple(self.a.shape)

    def stride(self) -> tuple[int, ...]:
        """Its element strides."""
        return tuple(s // self.a.itemsize for s in self.a.strides)


class _Guarded:
    """A copy of ``a`` between two guard regions of NaN canaries; :meth:`finish` checks them and copies back."""

    def __init__(self, a: np.ndarray, index: int) -> None:
        self.a, self.index = a, index
        data = np.ascontiguousarray(a)
        self.guard = max(_GUARD_BYTES, -(-data.nbytes // 64) * 64)  # at least the array's own size each side
        words = (2 * self.guard + data.nbytes + 3) // 4
        self.raw = np.full(words, CANARY + index % 256, dtype=np.uint32)
        self.pristine = self.raw.view(np.uint8).copy()
        self.end = self.guard + data.nbytes
        self.body = self.raw.view(np.uint8)[self.guard : self.end].view(data.dtype).reshape(data.shape)
        self.body[...] = data

    def finish(self) -> None:
        """Raise OutOfBounds if a guard byte changed; else copy the body back into the caller's array."""
        now, was = self.raw.view(np.uint8), self.pristine
        hit = int(np.count_nonzero(now[: self.guard] != was[: self.guard]))
        hit += int(np.count_nonzero(now[self.end :] != was[self.end :]))
        if hit:
            raise OutOfBounds(f"the kernel stored outside argument {self.index} ({hit} guard bytes changed)")
        if self.a.flags.writeable:
            self.a[...] = self.body


_INTERPRETER_LOCK = threading.Lock()
_MISSING = object()
_INTERPRETED: dict[int, Any] = {}


@contextmanager
def _interpreted_scope(fn: Any) -> Iterator[None]:
    """Inside the block, every ``@triton.jit`` function the kernel can call (triton.language's own, e.g.
    ``tl.max``, and those in the kernel's module) is its interpreted form, as ``TRITON_INTERPRET=1`` would
    have made it at import: so one process runs the same kernel on the GPU and through the interpreter."""
    import triton.experimental.gluon  # noqa: F401 - its import asserts triton.language's functions are JITFunctions
    import triton.language as tl
    import triton.runtime.interpreter as interpreter
    from triton import knobs
    from triton.runtime.jit import JITFunction

    spaces = [vars(m) for m in (tl, tl.standard, tl.math, tl.core)] + [fn.__globals__]
    swapped = [(d, name, v) for d in spaces for name, v in list(d.items()) if isinstance(v, JITFunction)]
    was, patch_tensor = knobs.runtime.interpret, interpreter._patch_lang_tensor
    # An interpreted call of a jit helper (tl.sum, tl.max) patches triton.language's builtins and tensor methods and
    # never restores them (Triton 3.6: InterpretedFunction.__call__): restored here, or a later compile breaks.
    patched = (tl, tl.core, tl.math, tl.tensor, tl.core.tensor, tl.core.tensor_descriptor_base)
    saved = [(obj, dict(vars(obj))) for obj in dict.fromkeys(patched)]

    def scalar_index(tensor: Any, scope: Any) -> None:
        patch_tensor(tensor, scope)
        # Triton 3.6's interpreter reads a scalar (a loop bound) as int() of a one-element array, which NumPy 2.4
        # refuses; later Triton squeezes it first, as here
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    try:
        for d, name, v in swapped:
            d[name] = _INTERPRETED.setdefault(id(v), interpreter.InterpretedFunction(v.fn))
        knobs.runtime.interpret = True
        interpreter._patch_lang_tensor = scalar_index
        yield
    finally:
        interpreter._patch_lang_tensor = patch_tensor
        knobs.runtime.interpret = was
        for d, name, v in swapped:
            d[name] = v
        for obj, attrs in saved:
            for name in [n for n, v in vars(obj).items() if n not in attrs and not inspect.ismodule(v)]:
                delattr(obj, name)  # added by a patch (a submodule imported meanwhile stays)
            for name, value in attrs.items():
                if vars(obj).get(name, _MISSING) is not value:
                    setattr(obj, name, value)


def _interpret(kernel: Any, plan_launch: _Launch, args: tuple[Any, ...]) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    guarded = [_Guarded(a, i) if isinstance(a, np.ndarray) else None for i, a in enumerate(args)]
    passed = [_HostTensor(g.body) if g is not None else a for g, a in zip(guarded, args, strict=True)]
    # IEEE overflow, invalid operations and all-NaN reductions are the kernel's float semantics, not errors: NumPy's
    # floating-point errors and RuntimeWarnings stay quiet
    with _INTERPRETER_LOCK, _interpreted_scope(kernel.fn), np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fn = _INTERPRETED.setdefault(id(kernel), InterpretedFunction(kernel.fn))
        fn[plan_launch.grid](*passed, **plan_launch.constexprs)
    for g in guarded:
        if g is not None:
            g.finish()


# -- the audit's toolchain ------------------------------------------------------------------------------------------

ROUTES: dict[str, Route] = {
    "triton": Route(
        "triton", "cuda", None, "Triton's defaults: a*b+c fused (enable_fp_fusion), libdevice ftz-reflected"
    ),
    "triton-ieee": Route("triton-ieee", "cuda", None, "Triton without fusion, libdevice without its ftz reflection"),
}
ROUTE_OPTIONS: dict[str, dict[str, Any]] = {
    "triton": {"enable_fp_fusion": True, "enable_reflect_ftz": True},
    "triton-ieee": {"enable_fp_fusion": False, "enable_reflect_ftz": False},
}
ARCH = 90  # sm_90 (Hopper), the audit's target for NVRTC builds too


def _route(name: str) -> Route:
    try:
        return ROUTES[name]
    except KeyError:
        raise KeyError(f"unknown Triton route {name!r}; known: {sorted(ROUTES)}") from None


def triton_build(
    family: str,
    name: str,
    kernel: str,
    signature: Mapping[str, str],
    constexprs: Mapping[str, int],
    *,
    num_warps: int = 4,
    route: str = "triton",
    declared: frozenset[str] = frozenset(),
    index_bits: int | None = None,
) -> Build:
    """The audit's build of the ``@triton.jit`` kernel at ``kernel`` (module:attr) under ``signature`` (parameter
    -> Triton type, e.g. "*fp32", "i32") and ``constexprs`` (the plan's values), ``declared`` its approximate
    opcodes (modelled by its contract's bound). Made without importing triton (the source is read at audit)."""
    _route(route)
    spec = (
        ("signature", tuple(signature.items())),
        ("constexprs", tuple(sorted(constexprs.items()))),
        ("num_warps", num_warps),
    )
    return Build(
        family,
        name,
        f"triton:{kernel}",
        kernel,
        route,
        declared=declared,
        index_bits=index_bits,
        toolchain="triton",
        specialization=spec,
    )


@functools.cache
def compiled(build: Build) -> Any:
    """``triton.compile`` of a Triton build for sm_90 (no GPU needed): its ``asm`` holds "ptx" and "cubin"."""
    version = triton_version()
    del version
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    spec = dict(build.specialization)
    kernel = resolve(build.function)
    if not _is_kernel(kernel):
        raise RuntimeError(f"{build.function} is not a @triton.jit function")
    signature = dict(spec["signature"])
    constexprs = dict(spec["constexprs"])
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    options = {**ROUTE_OPTIONS[build.route], "num_warps": int(spec["num_warps"])}
    try:
        return compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", ARCH, 32), options=options)
    except Exception as exc:  # a compile error is the build's finding, told with Triton's message
        raise RuntimeError(f"triton.compile failed: {type(exc).__name__}: {exc}") from None


# TRITON_* variables that do not change the compiled code: where Triton keeps its files, whether it prints, and
# TRITON_INTERPRET, which Triton's knobs write into the environment whenever the interpreter's knob is set (every
# interpreted launch does): the key would otherwise depend on what the process ran before the audit.
_NOT_CODE_ENV = frozenset(
    f"TRITON_{k}"
    for k in ("INTERPRET", "CACHE_DIR", "HOME", "DUMP_DIR", "CACHE_MANAGER", "PRINT_AUTOTUNING", "ALWAYS_COMPILE")
)


def _outside_project(path: str | None) -> bool:
    """Whether a module file is the interpreter's or an installed package's (their versions name them), not code of
    the project whose kernels are audited."""
    if not path or not path.endswith(".py"):
        return True  # built-in, frozen, an extension module
    where = Path(path).resolve()
    installed = {"site-packages", "dist-packages"} & set(where.parts)
    return bool(installed) or any(where.is_relative_to(root) for root in _stdlib_roots())


@functools.cache
def _stdlib_roots() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    return tuple({Path(paths[k]).resolve() for k in ("stdlib", "platstdlib") if k in paths})


def _module_file(name: str, within: str | None = None) -> Path | None:
    """The file of module ``name`` (a package's ``__init__.py``), located without importing it or its parents; None
    where there is none, or where it is the interpreter's or an installed package's (triton, numpy) and not of the
    top-level package ``within``."""
    top, _, rest = name.partition(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: located, nothing imported
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or (top != within and _outside_project(spec.origin)):
        return None
    if not rest:
        return Path(spec.origin)
    if not spec.submodule_search_locations:
        return None
    stem = Path(spec.origin).parent.joinpath(*rest.split("."))
    for f in (stem.with_suffix(".py"), stem / "__init__.py"):
        if f.is_file():
            return f
    return None


def _imports(path: Path, name: str) -> set[str]:
    """The modules that module ``name`` (at ``path``) imports, absolute (``from x import y`` names x and x.y)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError):
        return set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join([*parts, *([node.module] if node.module else [])])
            if base:
                out.add(base)
                out.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
    return out


def kernel_sources(module: str) -> dict[str, Path]:
    """The project's source files (module name -> path) a Triton kernel module is built from, found without
    importing any of them: the module, the packages above it, and, transitively, every module of the project they
    import (a @triton.jit helper or a constant the kernel reads is a global of its module: defined there or
    imported, wherever it lives), so two kernels in one package have keys of their own. Modules of the
    interpreter and of installed packages are named by their versions instead (Triton's is the toolchain's),
    except those of the kernel's own top-level package."""
    top = module.partition(".")[0]  # the kernel's own package counts wherever it is installed
    files: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop().removesuffix(".__init__")
        if name in files:
            continue
        path = _module_file(name, top)
        if path is None:
            continue
        files[name] = path
        parts = name.split(".")
        todo += [".".join(parts[:k]) for k in range(1, len(parts))]
        todo += sorted(_imports(path, name))
    return dict(sorted(files.items()))


@functools.cache
def _sources_digest(module: str) -> str:
    """SHA-256 over the names and text of :func:`kernel_sources` of ``module``, in name order (memoised per process)."""
    h = hashlib.sha256()
    for name, path in kernel_sources(module).items():
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _inputs(build: Build) -> dict[str, Any]:
    """What Triton's code of ``build`` depends on beyond its fields and Triton's version, read without importing
    triton: the text of the project's sources the kernel is built from (:func:`_sources_digest`), the route's
    options, the target, and the TRITON_* environment (a ptxas or libdevice path, a knob's default)."""
    module = build.function.partition(":")[0]
    if _module_file(module, module.partition(".")[0]) is None:
        raise RuntimeError(f"the module of {build.function} is not found")
    return {
        "kernel_sources": _sources_digest(module),
        "options": ROUTE_OPTIONS[build.route],
        "arch": ARCH,
        "environment": {
            k: v for k, v in sorted(os.environ.items()) if k.startswith("TRITON_") and k not in _NOT_CODE_ENV
        },
    }


register_toolchain(
    Toolchain(
        "triton",
        triton_version,
        _route,
        lambda b: compiled(b).asm["ptx"],
        lambda b: compiled(b).asm["cubin"],
        _inputs,
    )
)


# -- the contract's kernel kind -------------------------------------------------------------------------------------


def _problems(kernel: Any, plan_quantities: set[str] | None) -> list[str]:
    """A kernel's constexprs the plan does not choose (the launch takes every one from the plan)."""
    if plan_quantities is None:
        return []
    out = [f"tl.constexpr {n!r} is not a quantity of the plan" for n in constexpr_names(kernel)]
    out = [p for p, n in zip(out, constexpr_names(kernel), strict=True) if n not in plan_quantities]
    if "grid" not in plan_quantities:
        out.append("the plan has no 'grid' quantity (the launch's grid)")
    return out


# (the lambda reads triton_unavailable at each call: a test that patches it sees the kind follow)
register_kind(KernelKind("triton", "a @triton.jit function", _is_kernel, lambda: triton_unavailable(), _problems))


def load_kernel_module(name: str) -> Any:
    """Import a module of Triton kernels (it imports triton): TritonUnavailable where triton is not installed."""
    if (why := triton_unavailable()) is not None:
        raise TritonUnavailable(why)
    return importlib.import_module(name)
