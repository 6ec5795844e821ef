"""``[tool.kc]`` in pyproject.toml: defaults for ``kc`` flags (a flag given on the command line wins)."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CONFIG_KEYS", "ConfigError", "KcConfig", "find_config", "defaults_for"]


class ConfigError(ValueError):
    """A ``[tool.kc]`` table with an unknown key or a value of the wrong type (exit 2)."""


def _paths(v: Any) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    raise TypeError("a path or a list of paths")


def _choice(*allowed: str) -> Callable[[Any], str]:
    def conv(v: Any) -> str:
        if v not in allowed:
            raise TypeError(f"one of {', '.join(allowed)}")
        return v

    return conv


def _of(t: type) -> Callable[[Any], Any]:
    def conv(v: Any) -> Any:
        if not isinstance(v, t) or (t is int and isinstance(v, bool)):
            raise TypeError(f"a {t.__name__}")
        return v

    return conv


def _number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
        raise TypeError("a positive number of seconds")
    return float(v)


def _cluster(v: Any) -> str:
    from obligations.cluster import parse_cluster

    if not isinstance(v, str):
        raise TypeError("local, local:N or tcp://HOST:PORT")
    try:
        return str(parse_cluster(v))
    except ValueError:
        raise TypeError("local, local:N or tcp://HOST:PORT") from None


# key in [tool.kc] -> (argparse dest, converter, the subcommands it applies to)
CONFIG_KEYS: dict[str, tuple[str, Callable[[Any], Any], tuple[str, ...]]] = {
    "contracts": ("paths", _paths, ("check", "validate", "report")),
    "profile": ("profile", _choice("quick", "full", "deep"), ("check",)),
    "device": ("device", _choice("auto", "host", "cuda"), ("check", "report", "sweep")),
    "strict": ("strict", _of(bool), ("check",)),
    "seed": ("seed", _of(int), ("check", "report")),
    "report_dir": ("out", _of(str), ("report",)),
    "item_timeout": ("item_timeout", _number, ("check",)),
    "log": ("log", _of(str), ("check",)),
    "cluster": ("cluster", _cluster, ("check",)),
}


@dataclass(frozen=True)
class KcConfig:
    """The ``[tool.kc]`` table found, and the file it came from."""

    path: Path | None
    values: dict[str, Any]


def find_config(start: str | Path | None = None) -> KcConfig:
    """The nearest pyproject.toml at or above ``start`` (default: the working directory) with ``[tool.kc]``."""
    here = Path(start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        f = d / "pyproject.toml"
        if f.is_file():
            try:
                data = tomllib.loads(f.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
                raise ConfigError(f"{f}: cannot read: {e}") from None
            table = data.get("tool", {}).get("kc")
            if table is not None:
                return KcConfig(f, _convert(f, table))
    return KcConfig(None, {})


def _convert(path: Path, table: Any) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.kc] must be a table")
    out = {}
    for key, value in table.items():
        if key not in CONFIG_KEYS:
            from obligations.contract import did_you_mean  # only for the message: sympy & co. load in ~0.5 s

            raise ConfigError(f"{path}: [tool.kc]: unknown key {key!r}{did_you_mean(key, CONFIG_KEYS)}")
        try:
            out[key] = CONFIG_KEYS[key][1](value)
        except TypeError as e:
            raise ConfigError(f"{path}: [tool.kc] {key} must be {e}") from None
    if "contracts" in out:  # relative to the pyproject.toml, like pytest's testpaths
        out["contracts"] = [str(_rel(path.parent / p)) for p in out["contracts"]]
    if "report_dir" in out:
        out["report_dir"] = str(_rel(path.parent / out["report_dir"]))
    if "log" in out:
        out["log"] = str(_rel(path.parent / out["log"]))
    return out


def _rel(p: Path) -> Path:
    try:
        return p.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return p


def defaults_for(command: str, config: KcConfig) -> dict[str, Any]:
    """argparse defaults for ``command`` from ``config``."""
    return {
        dest: config.values[key]
        for key, (dest, _conv, commands) in CONFIG_KEYS.items()
        if key in config.values and command in commands
    }
