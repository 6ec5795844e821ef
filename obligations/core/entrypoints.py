"""Entry-point coverage: every public native entry point registers the variants it offers, and calls are
recorded while a contract item runs, so a report can say which offered variants no item ever called.

A native function declares itself with :func:`entry_point` (family, the axes it offers: order, variant,
dtype, route ... with their values, and the devices). While :func:`recording` is active (``kc check`` runs
each item inside it), every call records the values of those axes and the device it ran on: the mapping
from contract items to entry points is observed at run time, never typed by the contract's author.
Outside a recording a call costs one context-variable lookup and, for a wrapped entry point, one Python frame.
A function whose every microsecond is claimed (``native.gemm.matmul``: within 1.2x of the raw cuBLAS binding)
registers with ``records_itself=True``: it is not wrapped, and it calls :func:`note_call` itself while
:data:`recording_log` returns a log (the decorator refuses a function that never names ``note_call``).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "EntryPoint",
    "Call",
    "entry_point",
    "entry_points",
    "note_call",
    "recording",
    "recording_log",
    "paused",
    "variants",
    "unchecked",
]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class EntryPoint:
    """A public native function that launches kernels, and the variants (axis values x devices) it offers."""

    family: str
    name: str
    axes: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    devices: tuple[str, ...] = ("host", "cuda")
    module: str = ""  # where the function is defined: a contract answers for the modules its kernels name


@dataclass(frozen=True, order=True)
class Call:
    """One observed call: entry point, the device it ran on and the value of each declared axis."""

    family: str
    name: str
    device: str
    axes: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """JSON form: {"entry": "family.name", "device": ..., axis: value ...}."""
        return {"entry": f"{self.family}.{self.name}", "device": self.device, **dict(self.axes)}


_REGISTRY: dict[tuple[str, str], EntryPoint] = {}
_LOG: contextvars.ContextVar[set[Call] | None] = contextvars.ContextVar("kc_entry_log", default=None)
# The active recording's log, or None outside one: a self-recording entry point's one check per call (a bound
# C method: no Python frame).
recording_log: Callable[[], set[Call] | None] = _LOG.get


def _device_of(bound: inspect.BoundArguments) -> str:
    dev = bound.arguments.get("device")
    if isinstance(dev, str) and dev in ("host", "cuda"):
        return dev
    for value in bound.arguments.values():  # "auto" or no device argument: where the arrays live
        if _is_cupy(value):
            return "cuda"
    return "host"


def _observe_slow(ep: EntryPoint, sig: inspect.Signature, args: tuple, kwargs: dict) -> Call:
    """The observed call by binding the arguments to the signature (the definition :func:`_observer` keeps)."""
    bound = sig.bind_partial(*args, **kwargs)
    bound.apply_defaults()
    values = tuple((a, str(bound.arguments.get(a))) for a in ep.axes)
    return Call(ep.family, ep.name, _device_of(bound), values)


_MISSING = object()


def _observer(ep: EntryPoint, sig: inspect.Signature) -> Callable[[tuple, dict], Call]:
    """``observe(args, kwargs) -> Call``: :func:`_observe_slow`'s answer from argument slots resolved once.

    Recording runs on every entry-point call of ``kc check`` (timed loops included), and binding a signature
    costs ~10 us per call: each axis is read from its keyword, its position or its default instead, and the
    Call objects are memoised by (device, values). A signature with a CuPy-typed default keeps the slow path.
    """
    params = sig.parameters
    positional = [name for name, p in params.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    named = {name for name, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    keyword = {name for name in named if params[name].kind != params[name].POSITIONAL_ONLY}
    n_pos = len(positional)

    def slot(name: str) -> tuple[str, int | None, Any]:
        # (keyword name or "", position or None, default or _MISSING); a name that is no parameter reads None.
        if name not in named:
            return "", None, None
        default = params[name].default
        return (
            name if name in keyword else "",
            positional.index(name) if name in positional else None,
            _MISSING if default is inspect.Parameter.empty else default,
        )

    axes = [(a, *slot(a)) for a in ep.axes]
    device_slot = slot("device")
    defaults = [p.default for p in params.values() if p.default is not inspect.Parameter.empty]
    if any(_is_cupy(d) for d in defaults):
        return functools.partial(_observe_slow, ep, sig)
    memo: dict[tuple, Call] = {}

    def read(args: tuple, kwargs: dict, kw: str, pos: int | None, default: Any) -> Any:
        if kw and kw in kwargs:
            return kwargs[kw]
        if pos is not None and pos < len(args):
            return args[pos]
        return None if default is _MISSING else default

    def observe(args: tuple, kwargs: dict) -> Call:
        dev = read(args, kwargs, *device_slot)
        if not (isinstance(dev, str) and dev in ("host", "cuda")):
            # "auto" or no device argument: where the arrays live (named arguments only, as bound.arguments).
            given = [*args[:n_pos], *(v for k, v in kwargs.items() if k in keyword)]
            dev = "cuda" if any(_is_cupy(v) for v in given) else "host"
        values = tuple((a, str(read(args, kwargs, kw, pos, default))) for a, kw, pos, default in axes)
        call = memo.get((dev, values))
        if call is None:
            call = memo[(dev, values)] = Call(ep.family, ep.name, dev, values)
        return call

    return observe


def _is_cupy(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "cupy"


def entry_point(
    family: str,
    *,
    axes: Mapping[str, tuple[Any, ...]] | None = None,
    devices: tuple[str, ...] = ("host", "cuda"),
    name: str | None = None,
    records_itself: bool = False,
) -> Callable[[F], F]:
    """Decorator: register ``fn`` as an entry point of ``family`` offering ``axes`` (parameter -> values).

    ``records_itself``: ``fn`` is returned unwrapped and reports its own calls with :func:`note_call`.
    """

    def deco(fn: F) -> F:
        ep = EntryPoint(family, name or fn.__name__, dict(axes or {}), devices, fn.__module__)
        key = (family, ep.name)
        if key in _REGISTRY and _REGISTRY[key] != ep:
            raise ValueError(f"entry point {family}.{ep.name} registered twice")
        observe = _observer(ep, inspect.signature(fn))
        if records_itself:
            # A self-recording function that never calls note_call would leave its variants unchecked without a
            # word: refuse it where it is defined.
            if "note_call" not in fn.__code__.co_names + fn.__code__.co_freevars:
                raise ValueError(f"entry point {family}.{ep.name} records itself but never calls note_call")
            _REGISTRY[key] = ep
            fn.__kc_entry_point__ = ep  # type: ignore[attr-defined]
            fn.__kc_observe__ = observe  # type: ignore[attr-defined]
            return fn
        _REGISTRY[key] = ep

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            log = _LOG.get()
            if log is not None:
                log.add(observe(args, kwargs))
            return fn(*args, **kwargs)

        wrapper.__kc_entry_point__ = ep  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return deco


def note_call(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> None:
    """Record a call of the self-recording entry point ``fn`` (``args``/``kwargs`` as it was called) in the
    active recording; outside one, nothing."""
    log = _LOG.get()
    if log is not None:
        log.add(fn.__kc_observe__(args, kwargs))  # type: ignore[attr-defined]


def entry_points(family: str | None = None) -> list[EntryPoint]:
    """Registered entry points (of ``family``), in registration order."""
    return [ep for (f, _), ep in _REGISTRY.items() if family is None or f == family]


@contextmanager
def recording() -> Iterator[set[Call]]:
    """Record every entry-point call made inside the block (nested recordings each see their own calls)."""
    outer = _LOG.get()
    log: set[Call] = set()
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)
        if outer is not None:
            outer |= log


@contextmanager
def paused() -> Iterator[None]:
    """Record nothing inside the block: a timed loop repeats calls its warm-up recorded, and times the code
    without the checker's bookkeeping (which a caller outside ``kc check`` never pays)."""
    token = _LOG.set(None)
    try:
        yield
    finally:
        _LOG.reset(token)


def variants(ep: EntryPoint) -> list[Call]:
    """Every variant ``ep`` offers: each combination of its axis values, on each of its devices."""
    names = list(ep.axes)
    combos = itertools.product(*(ep.axes[a] for a in names)) if names else [()]
    return [
        Call(ep.family, ep.name, d, tuple(zip(names, map(str, combo), strict=True)))
        for combo in combos
        for d in ep.devices
    ]


def unchecked(
    family: str, called: set[Call], devices: tuple[str, ...] = ("host", "cuda"), modules: set[str] | None = None
) -> list[Call]:
    """Variants of ``family``'s entry points on ``devices`` that no recorded call reached.

    With ``modules``, only entry points defined in those modules count: a contract answers for the code its
    kernels name (a user's own elementwise kernel does not make the shipped elementwise module unchecked).
    """
    eps = [ep for ep in entry_points(family) if modules is None or ep.module in modules]
    return sorted(v for ep in eps for v in variants(ep) if v.device in devices and v not in called)
