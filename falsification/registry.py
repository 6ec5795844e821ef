"""Registry of falsification tests: a contract item names a test registered here by string."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from falsification.profiles import Budget, Profile, budget_for
from obligations.core.results import Outcome

__all__ = [
    "DrawStore",
    "FalsifyContext",
    "Replay",
    "FalsificationTest",
    "register_test",
    "guarded",
    "get_test",
    "registered_tests",
    "load_builtin_tests",
]


@dataclass(frozen=True)
class Replay:
    """One concrete case to re-check instead of a search: its integer encoding and scalar operand bits.

    Every engine check encodes its cases as integers (operand bits for an element, or a call's seed,
    sizes and choices); ``kc replay CONTRACT ID --bits V,V,... [--scalars S,...]`` passes them back.
    """

    values: tuple[int, ...]
    scalars: tuple[int, ...] = ()

    @classmethod
    def parse(cls, values: Any, scalars: Any = ()) -> Replay:
        """From hex/decimal strings or ints."""
        return cls(tuple(int(str(v), 0) for v in values), tuple(int(str(s), 0) for s in scalars))


class DrawStore(Protocol):
    """Where a run keeps deterministic host-side results a test may reuse (``obligations.engines`` backs it with the
    proof cache): the Hypothesis draws of checks that declare a draw codec, a model's digest (rng.uniform_map_model).
    ``key`` names a result (it adds the project's source and the library versions to ``parts``), ``get`` gives the
    stored JSON list or None, ``put`` stores one."""

    def key(self, parts: Mapping[str, Any]) -> str:
        """The store's key of the draws ``parts`` describes."""
        ...

    def get(self, key: str) -> list[Any] | None:
        """The JSON cases stored under ``key``, or None."""
        ...

    def put(self, key: str, cases: list[Any]) -> None:
        """Store the JSON cases under ``key``."""
        ...


@dataclass(frozen=True)
class FalsifyContext:
    """Everything a falsification test may read: where to run, how hard to try, and the item's own terms.

    ``item`` is the contract's falsification entry (id, rule, prediction, agreement, tolerance, params);
    ``tolerance`` is the single tolerance the contract states for it (None where none applies).
    """

    device: str  # "host" or "cuda"
    profile: Profile  # quick (CPU CI) or full (GPU); a str is converted
    seed: int
    item: dict[str, Any]
    contract: dict[str, Any] = field(default_factory=dict)
    contract_path: str = ""
    replay: Replay | None = None  # re-check this one case instead of searching
    # regime -> the smallest plan values reaching it (the item's ``witnesses:`` regimes item), run as explicit cases
    witnesses: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # where Hypothesis' draws (checks with a draw codec) and other deterministic host results are kept and reused
    # (None: every run computes its own)
    draws: DrawStore | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "profile", Profile.of(self.profile))

    @property
    def budget(self) -> Budget:
        """The budget of this item's test under the run's profile, with the item's overrides."""
        return budget_for(str(self.item.get("test", "default")), self.profile, self.params)

    @property
    def params(self) -> dict[str, Any]:
        """Free-form parameters the contract passes to the test."""
        return dict(self.item.get("params") or {})

    @property
    def tolerance(self) -> Any:
        """The one tolerance the contract states for this item, or None."""
        return self.item.get("tolerance")

    @property
    def agreement(self) -> str | None:
        """The registered agreement kind the item asks for, or None."""
        return self.item.get("agreement")


@dataclass(frozen=True)
class FalsificationTest:
    """A registered test: its name, the function that runs it, which devices it supports."""

    name: str
    run: Callable[[FalsifyContext], Outcome]
    devices: tuple[str, ...] = ("host", "cuda")
    doc: str = ""
    # The verdict is a pure function of the project's host code, the item's params, seed and profile: no device, no
    # clock, no unseeded randomness, no draws that vary with the process (e.g. a bounded exhaustive enumeration).
    # Only such a test's passed result may be reused from the proof cache (obligations.engines, like enumerations).
    pure: bool = False
    # The verdict is a pure function of the above and of the device's identity (obligations.core.device.
    # device_identity: GPU model, drivers, CUDA runtime, NVRTC): a bounded exhaustive sweep of compiled code, e.g.
    # all 2^32 inputs of a CUDA math function. Its passed result is reused only on a device of the same identity.
    device_pure: bool = False


_REGISTRY: dict[str, FalsificationTest] = {}

# Modules whose import registers the project's own tests; users add theirs with register_test.
BUILTIN_TEST_MODULES: tuple[str, ...] = (
    "falsification.elementwise_tests",
    "falsification.reductions_tests",
    "falsification.gemm_tests",
    "falsification.rng_tests",
    "falsification.transfer_tests",
)


def register_test(
    name: str, *, devices: tuple[str, ...] = ("host", "cuda"), pure: bool = False, device_pure: bool = False
) -> Callable:
    """Decorator: register ``fn(ctx) -> Outcome`` under ``name``; duplicate names are a bug.

    ``pure``: the test's verdict depends only on host code and the item (see :attr:`FalsificationTest.pure`);
    ``device_pure``: only on those and the device's identity (:attr:`FalsificationTest.device_pure`).
    """

    def deco(fn: Callable[[FalsifyContext], Outcome]) -> Callable[[FalsifyContext], Outcome]:
        if name in _REGISTRY and _REGISTRY[name].run is not fn:
            raise ValueError(f"falsification test {name!r} is registered twice")
        summary = (fn.__doc__ or "").strip().split("\n")[0]
        _REGISTRY[name] = FalsificationTest(name, fn, devices, summary, pure, device_pure)
        return fn

    return deco


TestFn = Callable[["FalsifyContext"], Outcome]


def guarded(*, skip: tuple[type[Exception], ...] = ()) -> Callable[[TestFn], TestFn]:
    """Decorator: a test's expected non-findings become outcomes instead of tracebacks.

    No device for a run that asked for one (``obligations.core.device.DeviceUnavailable``) -> error; a missing
    param (KeyError) -> error naming the test; an exception in ``skip`` -> skipped with its message.
    """
    from obligations.core.device import DeviceUnavailable
    from obligations.core.results import error, skipped

    def deco(fn: TestFn) -> TestFn:
        @functools.wraps(fn)
        def run(ctx: FalsifyContext) -> Outcome:
            try:
                return fn(ctx)
            except skip as exc:
                return skipped(str(exc))
            except DeviceUnavailable as exc:
                return error(f"device unavailable: {exc}")
            except KeyError as exc:
                return error(f"bad params for {ctx.item.get('test')}: {exc}")

        return run

    return deco


def load_builtin_tests() -> None:
    """Import every module that registers the project's own tests: ``falsification/*_tests.py`` (idempotent)."""
    here = Path(__file__).resolve().parent
    found = tuple(f"falsification.{p.stem}" for p in sorted(here.glob("*_tests.py")))
    for mod in dict.fromkeys(BUILTIN_TEST_MODULES + found):
        importlib.import_module(mod)


def get_test(name: str) -> FalsificationTest | None:
    """The registered test called ``name``, or None."""
    load_builtin_tests()
    return _REGISTRY.get(name)


def registered_tests() -> dict[str, FalsificationTest]:
    """All registered tests by name."""
    load_builtin_tests()
    return dict(_REGISTRY)
