"""Backend selection: ``host`` (NumPy) or ``cuda`` (CuPy); asking for cuda without a GPU fails loudly."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "DEVICES",
    "DeviceUnavailable",
    "cuda_available",
    "resolve_device",
    "device_info",
    "device_identity",
    "array_module",
    "to_host",
    "to_device",
    "use_plain_reductions",
    "library_defaults",
]

DEVICES: tuple[str, ...] = ("host", "cuda")


class DeviceUnavailable(RuntimeError):
    """Raised when a device is requested explicitly but cannot be used; the message says why."""


@functools.cache
def cuda_available() -> tuple[bool, str]:
    """(True, "") when CuPy imports and a CUDA device answers; else (False, the reason)."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a CuPy built against a missing CUDA library
        return False, f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device, or a driver too old for the runtime
        return False, f"no CUDA device ({type(exc).__name__}: {exc})"
    if count < 1:
        return False, "no CUDA device (getDeviceCount() == 0)"
    return True, ""


def resolve_device(requested: str = "auto") -> str:
    """Map "auto"/"host"/"cuda" to "host" or "cuda"; raise DeviceUnavailable if "cuda" cannot run."""
    if requested not in ("auto", *DEVICES):
        raise ValueError(f"unknown device {requested!r}; expected one of auto, host, cuda")
    if requested == "host":
        return "host"
    ok, reason = cuda_available()
    if requested == "cuda" and not ok:
        # Never fall back silently: a GPU claim checked on the host would be a different claim.
        raise DeviceUnavailable(f"--device cuda requested but unavailable: {reason}")
    return "cuda" if ok else "host"


def device_info(device: str = "auto") -> dict[str, Any]:
    """JSON-ready description of the resolved device: kind, name, driver, cuda_runtime."""
    kind = resolve_device(device)
    if kind == "host":
        import platform

        return {
            "kind": "host",
            "name": platform.processor() or platform.machine(),
            "driver": None,
            "cuda_runtime": None,
            "numpy": np.__version__,
        }
    import cupy

    rt = cupy.cuda.runtime
    dev = cupy.cuda.Device()
    props = rt.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {
        "kind": "cuda",
        "name": name,
        "driver": int(rt.driverGetVersion()),
        "cuda_runtime": int(rt.runtimeGetVersion()),
        "compute_capability": str(dev.compute_capability),
        "sm_count": int(props["multiProcessorCount"]),
        "cupy": cupy.__version__,
    }


@functools.cache
def device_identity(device: str) -> dict[str, Any]:
    """Everything a deterministic computation's bits on ``device`` may depend on beyond the code and its inputs.

    On cuda: the GPU's name and compute capability, the kernel driver's full version (its JIT compiles PTX), the
    driver API, CUDA runtime and NVRTC versions (NVRTC and its headers hold CUDA's math library) and CuPy's. On
    the host: the machine, the NumPy version. The proof cache keys a device test's reused verdict by it
    (obligations.engines), so a verdict found on an H100 is never reused on an H200 or after a driver update.
    """
    info = device_info(device)
    if info["kind"] != "cuda":
        return {k: info[k] for k in ("kind", "name", "numpy")}
    import cupy

    try:
        nvrtc = ".".join(str(v) for v in cupy.cuda.nvrtc.getVersion())
    except Exception as exc:  # no NVRTC: say so in the identity rather than guess
        nvrtc = f"unavailable ({type(exc).__name__})"
    kernel_driver = None
    with contextlib.suppress(OSError):
        with open("/proc/driver/nvidia/version", encoding="utf-8") as fh:  # Linux: "NVRM version: ... 580.159.04 ..."
            kernel_driver = fh.readline().strip()
    keep = ("kind", "name", "compute_capability", "driver", "cuda_runtime", "cupy")
    return {**{k: info[k] for k in keep}, "nvrtc": nvrtc, "kernel_driver": kernel_driver}


def array_module(device: str) -> ModuleType:
    """numpy for "host", cupy for "cuda" (raising DeviceUnavailable when CuPy cannot run)."""
    if resolve_device(device) == "host":
        return np
    import cupy

    return cupy


def use_plain_reductions() -> None:
    """For kc's own runs on cuda (check items, sweeps): CuPy's reduction kernels instead of CUB's.

    A process-wide CuPy setting, so the library never sets it on import or use: only the ``kc`` commands
    that run on the device opt in (a user's program that imports ``native`` keeps CuPy's defaults).
    """
    import cupy

    _plain_reductions(cupy)


@functools.cache
def _plain_reductions(cupy: ModuleType) -> None:
    """CuPy's own reduction kernels instead of CUB's unless CUPY_ACCELERATORS says otherwise.

    On a machine whose kernel cache is empty every CUB reduction (sum, max ... per dtype) costs NVRTC
    seconds to build (measured: 9 sums, 20 s of one item's 29 s on an H100); CuPy's reduction kernels build
    in a fraction of that and the check's reductions are small. An explicit CUPY_ACCELERATORS is respected.
    """
    if "CUPY_ACCELERATORS" in os.environ:
        return
    _CUPY_DEFAULTS.update(_accelerators(cupy))
    try:
        cupy._core.set_routine_accelerators([])
        cupy._core.set_reduction_accelerators([])
    except (AttributeError, TypeError, ValueError):  # a CuPy without the switch: keep its defaults
        _CUPY_DEFAULTS.clear()


# CuPy's own accelerators as the process started (before use_plain_reductions): what a peer runs with.
_CUPY_DEFAULTS: dict[str, list[Any]] = {}


def _accelerators(cupy: ModuleType) -> dict[str, list[Any]]:
    """CuPy's accelerators now ({"routine": [...], "reduction": [...]}); CUB (CuPy's default) where unreadable."""
    acc = getattr(cupy._core, "_accelerator", None)
    out = {}
    for kind in ("routine", "reduction"):
        get = getattr(acc, f"get_{kind}_accelerators", None) or getattr(cupy._core, f"get_{kind}_accelerators", None)
        out[kind] = list(get()) if callable(get) else ["cub"]
    return out


@contextlib.contextmanager
def library_defaults() -> Iterator[dict[str, list[Any]]]:
    """CuPy with its own defaults (CUB reductions where CuPy enables them) for a peer's calls, then kc's again.

    kc's switch to plain reductions (:func:`use_plain_reductions`) is for kc's own kernels; a peer a
    measurement compares with runs as a user of that library would run it. Yields the accelerators in effect.
    """
    import cupy

    if not _CUPY_DEFAULTS:  # kc's switch is off (or CUPY_ACCELERATORS set): CuPy runs as configured already
        yield _accelerators(cupy)
        return
    now = _accelerators(cupy)
    cupy._core.set_routine_accelerators(_CUPY_DEFAULTS["routine"])
    cupy._core.set_reduction_accelerators(_CUPY_DEFAULTS["reduction"])
    try:
        yield _accelerators(cupy)
    finally:
        cupy._core.set_routine_accelerators(now["routine"])
        cupy._core.set_reduction_accelerators(now["reduction"])


def to_host(a: Any) -> np.ndarray:
    """A NumPy copy/view of a NumPy or CuPy array."""
    get = getattr(a, "get", None)
    return get() if callable(get) and not isinstance(a, np.ndarray) else np.asarray(a)


def to_device(a: Any, device: str) -> Any:
    """The array on ``device`` (a no-op when already there)."""
    return array_module(device).asarray(a)
