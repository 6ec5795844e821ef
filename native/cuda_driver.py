"""The CUDA driver API where CuPy is not the door: how this process's contexts wait for the GPU, and how many GPUs
it sees, without importing CuPy.

A context spins on a core, yields it, or blocks until the GPU signals. The driver's default (``auto``) spins
whenever a process has fewer contexts than the machine has CPUs, which is every kc worker: a worker waiting for its
turn on a GPU time-sliced between fifteen processes holds a core that the other items' Python wanted. ``blocking``
gives the core back while it waits. The wait is set on each visible device's primary context (the one CuPy, PyTorch
and Triton share): before the context exists through ``cuDevicePrimaryCtxSetFlags``, afterwards through
``cuCtxSetFlags`` (CUDA 12.1).
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["WAITS", "WAIT_ENV", "MEASURE_WAIT", "set_wait", "wait_from_env", "device_count"]

# The driver's CU_CTX_SCHED_* values.
WAITS: dict[str, int] = {"auto": 0x0, "spin": 0x1, "yield": 0x2, "blocking": 0x4}
_SCHED_MASK = 0x7
_SYNC_MEMOPS = 0x80
# The wait of a run's worker processes (kc check sets "blocking" for its workers; a value the user set wins).
WAIT_ENV = "KC_CUDA_WAIT"
# A measure item times its kernel alone on the GPU with the CPUs to spare: the wait that adds no wake-up latency.
MEASURE_WAIT = "spin"

_lib: ctypes.CDLL | None = None


def _driver() -> ctypes.CDLL | None:
    global _lib
    if _lib is None:
        try:
            _lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return None
    return _lib


def _visible() -> tuple[ctypes.CDLL, list[ctypes.c_int]] | str:
    """(the driver, this process's visible devices), else why there are none to use."""
    lib = _driver()
    if lib is None:
        return "no CUDA driver (libcuda.so.1)"
    if lib.cuInit(0) != 0:
        return "cuInit failed (no usable GPU)"
    count = ctypes.c_int()
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return "cuDeviceGetCount failed"
    devices = []
    for ordinal in range(count.value):
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            return f"cuDeviceGet({ordinal}) failed"
        devices.append(dev)
    return lib, devices


def _set_active(lib: ctypes.CDLL, dev: ctypes.c_int, sched: int) -> int:
    """Set the wait of ``dev``'s active primary context (current on this thread for the call)."""
    ctx = ctypes.c_void_p()
    rc = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    if rc != 0:
        return rc
    try:
        rc = lib.cuCtxPushCurrent_v2(ctx)
        if rc != 0:
            return rc
        try:
            flags = ctypes.c_uint()
            rc = lib.cuCtxGetFlags(ctypes.byref(flags))
            if rc == 0:
                rc = lib.cuCtxSetFlags((flags.value & _SYNC_MEMOPS) | sched)  # the only other flag it takes
        finally:
            lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    finally:
        lib.cuDevicePrimaryCtxRelease_v2(dev)
    return rc


def set_wait(mode: str) -> str | None:
    """Make every visible device's primary context wait by ``mode`` (a key of WAITS); None when set, else why not."""
    sched = WAITS[mode]  # a mode not there is a caller's bug
    visible = _visible()
    if isinstance(visible, str):
        return visible
    lib, devices = visible
    for dev in devices:
        flags, active = ctypes.c_uint(), ctypes.c_int()
        if lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) != 0:
            return "cuDevicePrimaryCtxGetState failed"
        if active.value:
            rc = _set_active(lib, dev, sched)
        else:
            rc = lib.cuDevicePrimaryCtxSetFlags_v2(dev, (flags.value & ~_SCHED_MASK) | sched)
        if rc != 0:
            return f"the driver refused the wait {mode!r} (CUresult {rc})"
    return None


def device_count() -> int | None:
    """How many GPUs this process sees (its CUDA_VISIBLE_DEVICES applied); None without a driver or a usable GPU.
    Cheaper than CuPy's count for a thread that must not wait for CuPy's import (a cluster's opening)."""
    visible = _visible()
    return None if isinstance(visible, str) else len(visible[1])


def wait_from_env() -> str | None:
    """The wait :data:`WAIT_ENV` names (None when unset or empty); a name not in WAITS is bad input."""
    mode = os.environ.get(WAIT_ENV, "").strip()
    if not mode:
        return None
    if mode not in WAITS:
        raise ValueError(f"{WAIT_ENV}={mode!r}: expected one of {', '.join(WAITS)}")
    return mode
