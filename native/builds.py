"""Every CUDA build the shipped entry points can launch: source, compile route and what it promises.

A :class:`Build` is one (source, function, route) the runtime compiles, with the facts the compiled code
must honour: whether the kernel is declared approximate (libdevice transcendentals), whether its source
asks for a fused multiply-add, and the index width its launch plan proved. Each family registers an
enumerator of its builds; :func:`all_builds` lists them for the compiled-code audit, which runs on a CPU
(PTX from NVRTC) and reads the promises from here, never from the options we think we passed.

The wave-1 families register below; a new family registers in its own ``native/<family>.py`` with
``@register_builds("<family>")`` (every ``native`` module is imported before builds are listed).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Build",
    "Promise",
    "PROMISES",
    "register_builds",
    "all_builds",
    "families",
    "load_native_modules",
    "Toolchain",
    "ToolchainUnavailable",
    "register_toolchain",
    "toolchain",
]


@dataclass(frozen=True)
class Promise:
    """What a compile route promises about the compiled code, stated apart from the flags that realise it.

    The audit reads these, and compiles with the route's actual options: a route whose flags drift from
    its promise (``-fmad=true`` under a route that promises no contraction) is caught in its PTX.
    """

    keeps_subnormals: bool
    contracts: bool
    approximates: bool


PROMISES: dict[str, Promise] = {
    "nvrtc-ieee": Promise(keeps_subnormals=True, contracts=False, approximates=False),
    "nvrtc-fmad": Promise(keeps_subnormals=True, contracts=True, approximates=False),
    "nvrtc-ftz": Promise(keeps_subnormals=False, contracts=False, approximates=False),
    "nvrtc-fast-math": Promise(keeps_subnormals=False, contracts=True, approximates=True),
    "cupy-stock": Promise(keeps_subnormals=False, contracts=True, approximates=False),
    # Triton (native.tritonrt): its defaults contract a*b+c (enable_fp_fusion); "triton-ieee" turns fusion off. Both
    # keep subnormals in f32 arithmetic; the approximate operations of Triton's own lowering (fp32 `/` is div.full.f32,
    # tl.exp ex2.approx.f32, tl.sqrt sqrt.approx.ftz.f32) are not the route's: each build declares the ones it uses.
    "triton": Promise(keeps_subnormals=True, contracts=True, approximates=False),
    "triton-ieee": Promise(keeps_subnormals=True, contracts=False, approximates=False),
}


@dataclass(frozen=True)
class Build:
    """One compiled kernel: its family, a unique name, CUDA source, function, route and promises."""

    family: str
    name: str
    source: str
    function: str
    route: str
    approximate: bool = False  # declared approximate: libdevice ex2/lg2.approx and internal fma allowed
    fused: bool = False  # the source itself asks for a fused multiply-add (fmaf, __fmaf_rn)
    index_bits: int | None = None  # the index width the launch plan proved (None: no grid-stride index)
    # f32 atomic adds flush subnormal inputs and results whatever -ftz says (PTX ISA: atom/red .add.f32); a build
    # that uses them declares it, and its contract models the flush (the reductions family's cuda-atomic-flush).
    flushes_atomics: bool = False
    # Tensor-core products (mma/wmma/wgmma) do not round like f32 FMAs (products exact, sums aligned and truncated);
    # a build that uses them declares it, and its contract bounds them with a stated tensor-core model.
    tensor_cores: bool = False
    # Which compiler reads ``source`` (a registered :class:`Toolchain`): NVRTC, or Triton for a @triton.jit kernel
    # (``function`` its module:attr, ``specialization`` the signature, tl.constexpr values and num_warps).
    toolchain: str = "nvrtc"
    specialization: tuple[tuple[str, Any], ...] = ()
    # Opcodes the build declares and its contract's bound models (e.g. Triton's div.full.f32 for an fp32 `/`):
    # the audit's rules let exactly these through, where ``approximate`` lets every approximate opcode through.
    declared: frozenset[str] = frozenset()


class ToolchainUnavailable(RuntimeError):
    """A build's compiler cannot run here; the message says what to install."""


@dataclass(frozen=True)
class Toolchain:
    """How the audit reads a build's compiled code: the compiler's version, the route object the rules read, the
    build's PTX and its machine code for the SASS level (``ToolchainUnavailable`` where the compiler is absent).

    ``inputs`` names, without compiling, everything the compiled code depends on beyond the build's own fields
    and the compiler's version (the options a route compiles with, the kernel's source where ``source`` only
    names it, the compiler library's identity): the audit's proof-cache key. None: the audit is never cached."""

    name: str
    version: Callable[[], str]
    route: Callable[[str], Any]
    ptx: Callable[[Build], str]
    cubin: Callable[[Build], bytes]
    inputs: Callable[[Build], Mapping[str, Any]] | None = None


_TOOLCHAINS: dict[str, Toolchain] = {}


def register_toolchain(tc: Toolchain) -> Toolchain:
    """Add a toolchain by name (names are unique)."""
    if tc.name in _TOOLCHAINS and _TOOLCHAINS[tc.name] != tc:
        raise ValueError(f"toolchain {tc.name!r} registered twice")
    _TOOLCHAINS[tc.name] = tc
    return tc


def toolchain(name: str) -> Toolchain:
    """The registered toolchain ``name`` (every ``native`` module is imported first); KeyError lists the known."""
    load_native_modules()
    try:
        return _TOOLCHAINS[name]
    except KeyError:
        raise KeyError(f"unknown toolchain {name!r}; known: {sorted(_TOOLCHAINS)}") from None


_ENUMERATORS: dict[str, Callable[[], Iterator[Build]]] = {}


def register_builds(family: str) -> Callable[[Callable[[], Iterator[Build]]], Callable[[], Iterator[Build]]]:
    """Decorator: register the enumerator of ``family``'s builds."""

    def deco(fn: Callable[[], Iterator[Build]]) -> Callable[[], Iterator[Build]]:
        if family in _ENUMERATORS:
            raise ValueError(f"builds of family {family!r} registered twice")
        _ENUMERATORS[family] = fn
        return fn

    return deco


def load_native_modules() -> None:
    """Import every module of the ``native`` package: family modules register their builds on import."""
    import native

    for info in pkgutil.iter_modules(native.__path__):
        importlib.import_module(f"native.{info.name}")


def families() -> list[str]:
    """Families with registered builds."""
    load_native_modules()
    return sorted(_ENUMERATORS)


def all_builds(family: str | None = None) -> list[Build]:
    """The builds of ``family`` (or of every family), in a stable order; KeyError for an unknown family."""
    load_native_modules()
    names = [family] if family is not None else families()
    return [b for f in names for b in _ENUMERATORS[f]()]


def _asks_fused(source: str) -> bool:
    return any(f in source for f in ("fmaf(", "__fmaf_r", "__fma_r", "fma("))


_LIBM = re.compile(r"\b(expf|logf|tanhf|sinf|cosf|powf|exp2f|log2f|erff)\(")


def _elementwise_approximate(kind: str, source: str) -> bool:
    """Declared approximate: an "approx" kernel, or a tolerance-checked backward rule built on libm calls."""
    return kind == "approx" or (kind == "backward" and bool(_LIBM.search(source)))


# Routes an entry point offers for elementwise kernels (native.elementwise.apply's ``route``); the stock
# CuPy route has no NVRTC options of ours to audit and is covered by its own contract item.
ELEMENTWISE_ROUTES = ("nvrtc-ieee", "nvrtc-fmad", "nvrtc-ftz", "nvrtc-fast-math")


@register_builds("elementwise")
def _elementwise() -> Iterator[Build]:
    from native import elementwise as ew

    for name in sorted(ew.KERNELS):
        k = ew.get_kernel(name)
        src, fn = ew.kernel_source(name)
        bits = ew.kernel_plan(name, 1)["index_bits"]
        for route in ELEMENTWISE_ROUTES:
            yield Build(
                "elementwise",
                f"{name}@{route}",
                src,
                fn,
                route,
                approximate=_elementwise_approximate(k.kind, src),
                fused=_asks_fused(src),
                index_bits=bits,
            )


@register_builds("reductions")
def _reductions() -> Iterator[Build]:
    from native import reductions as red

    for order in sorted(red.TREE_ORDERS):
        for kind in ("tree", "atomic"):
            src, fn = red.tree_source(kind, red.TREE_ORDERS[order])
            yield Build(
                "reductions",
                f"{kind}-{order}",
                src,
                fn,
                red.ROUTE,
                fused=_asks_fused(src),
                flushes_atomics=kind == "atomic",
            )
    # The dot product and the VJPs of sum, mean and max: one source, three functions (64-bit grid-stride indices).
    for fn in ("kc_axis_dot", "kc_axis_spread", "kc_axis_max_vjp"):
        yield Build("reductions", fn.removeprefix("kc_axis_"), red.VJP_SOURCE, fn, red.ROUTE, index_bits=64)


@register_builds("rng")
def _rng() -> Iterator[Build]:
    from native import rng

    src, fn = rng.kernel_source()
    yield Build("rng", "default", src, fn, rng.ROUTE, fused=_asks_fused(src), index_bits=rng.rng_plan(1, 1).index_bits)
    for name in ("kc_init_fill", "kc_init_symmetric"):  # the device-side initializers (64-bit grid-stride index)
        yield Build("rng", name.removeprefix("kc_"), rng.INIT_SOURCE, name, rng.ROUTE, index_bits=64)


@register_builds("transfer")
def _transfer() -> Iterator[Build]:
    from native import transfer
    from spec.transfer import TARGETS

    for target in sorted(TARGETS):
        src, fn = transfer.kernel_source(target)
        bits = transfer.transfer_plan(1, 8, TARGETS[target].width // 8).index_bits
        yield Build("transfer", target, src, fn, transfer.ROUTE, fused=_asks_fused(src), index_bits=bits)
