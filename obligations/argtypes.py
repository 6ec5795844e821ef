"""Argument types of ``kc``'s flags: every number is checked where it is parsed (argparse names the flag, exit 2)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["U32", "U64", "MAX_SECONDS", "counted", "seconds", "bit_patterns", "SEED", "cluster_spec"]


U32 = 1 << 32
U64 = 1 << 64


def _integer(text: str, base: int = 10) -> int:
    try:
        return int(text.strip(), base)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def counted(lo: int = 0, hi: int | None = None, base: int = 10) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi) (``base`` 0: also 0x..., 0b...)."""

    def parse(text: str) -> int:
        value = _integer(text, base)
        if value < lo or (hi is not None and value >= hi):
            where = f"at least {lo}" if hi is None else f"from {lo} to {hi - 1}"
            raise argparse.ArgumentTypeError(f"{text} must be {where}")
        return value

    parse.__name__ = "integer"
    return parse


MAX_SECONDS = 1e6  # eleven days: past it a time limit is no limit (and overflows the timer: setitimer's time_t)


def seconds(text: str) -> float:
    """An argparse type: a number of seconds from 0 to MAX_SECONDS."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= MAX_SECONDS:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text} must be a number of seconds from 0 to {MAX_SECONDS:g}")
    return value


def bit_patterns(text: str) -> list[str]:
    """An argparse type: comma-separated bit patterns (0x... or ints), each in [0, 2^64)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    for part in parts:
        counted(0, U64, base=0)(part)
    return parts


SEED = counted(0, U64)  # seeds: what numpy and Hypothesis accept


def cluster_spec(text: str) -> str:
    """An argparse type: a ``--cluster`` value (local, local:N, tcp://HOST:PORT), checked here, kept as text."""
    from obligations.cluster import parse_cluster

    try:
        return str(parse_cluster(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
