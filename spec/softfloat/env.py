"""Floating-point environments: subnormal handling, NaN policy, tininess and conversion policy."""

from __future__ import annotations

from dataclasses import dataclass

from .formats import Format

__all__ = ["FloatEnv", "ENVIRONMENTS", "get_env", "resolve_env", "default_nan"]

NAN_POLICIES = ("ieee", "x86", "cuda")
TININESS = ("after", "before")
CONVERT_POLICIES = ("ieee", "clamp")


@dataclass(frozen=True)
class FloatEnv:
    """A named bundle of FTZ, DAZ, NaN policy, tininess detection and out-of-range conversion policy."""

    name: str
    ftz: bool = False
    daz: bool = False
    nan_policy: str = "ieee"
    tininess: str = "after"
    convert_policy: str = "ieee"

    def __post_init__(self) -> None:
        if self.nan_policy not in NAN_POLICIES:
            raise ValueError(f"nan_policy: expected one of {NAN_POLICIES}, got {self.nan_policy!r}")
        if self.tininess not in TININESS:
            raise ValueError(f"tininess: expected one of {TININESS}, got {self.tininess!r}")
        if self.convert_policy not in CONVERT_POLICIES:
            raise ValueError(f"convert_policy: expected one of {CONVERT_POLICIES}, got {self.convert_policy!r}")


ENVIRONMENTS: dict[str, FloatEnv] = {
    # IEEE 754-2019 defaults; NaN results keep the first NaN operand's payload, quieted.
    "ieee": FloatEnv("ieee"),
    # SSE/AVX with MXCSR defaults: same as ieee except the default NaN is negative (0xFFC00000).
    "x86-sse": FloatEnv("x86-sse", nan_policy="x86"),
    # x86 with MXCSR.FTZ and MXCSR.DAZ set (what -ffast-math style startup code does).
    "x86-sse-ftz": FloatEnv("x86-sse-ftz", ftz=True, daz=True, nan_policy="x86"),
    # CUDA with IEEE subnormals (-ftz=false): every NaN result is canonical, conversions saturate.
    "cuda": FloatEnv("cuda", nan_policy="cuda", convert_policy="clamp"),
    # CuPy's stock compile route appends -ftz=true: subnormal inputs and results read/written as zero.
    "cuda-ftz": FloatEnv("cuda-ftz", ftz=True, daz=True, nan_policy="cuda", convert_policy="clamp"),
}


def get_env(name: str) -> FloatEnv:
    """Return the named environment or raise ValueError listing the known names."""
    try:
        return ENVIRONMENTS[name]
    except KeyError:
        raise ValueError(f"env: unknown environment {name!r}; known: {sorted(ENVIRONMENTS)}") from None


def resolve_env(env: str | FloatEnv) -> FloatEnv:
    """Accept an environment name or a FloatEnv and return the FloatEnv."""
    if isinstance(env, FloatEnv):
        return env
    if isinstance(env, str):
        return get_env(env)
    raise TypeError(f"env: expected a FloatEnv or an environment name, got {type(env).__name__}")


def default_nan(fmt: Format, env: FloatEnv) -> int:
    """Bit pattern of the NaN an invalid operation returns in `fmt` under `env`'s NaN policy."""
    if env.nan_policy == "cuda":
        return fmt.abs_mask  # all ones but the sign: 0x7FFFFFFF for binary32
    nan = fmt.inf_bits | fmt.quiet_bit
    return nan | fmt.sign_mask if env.nan_policy == "x86" else nan
