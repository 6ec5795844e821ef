"""Terminal output of ``kc``: colour only on a TTY (``NO_COLOR`` honoured), verbosity, progress bars.

On a terminal, long work shows a ``rich`` progress bar (when rich is installed); otherwise plain lines,
one per finished item, so logs and pipes stay readable.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

__all__ = ["colour_enabled", "paint", "Reporter", "readable_counterexample", "readable_element", "progress_bar"]

_STATUS_COLOURS = {
    "proved": "32",
    "exhausted": "32",
    "passed": "32",
    "violated": "31",
    "error": "31",
    "violated_expected": "35",
    "unknown": "33",
    "inconclusive": "33",
    "skipped": "90",
}


def colour_enabled(stream: TextIO) -> bool:
    """True when ``stream`` is a terminal and ``NO_COLOR`` is unset (https://no-color.org)."""
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def paint(text: str, status: str, enabled: bool) -> str:
    """``text`` in the colour of ``status`` when ``enabled``."""
    return f"\x1b[{_STATUS_COLOURS.get(status, '0')}m{text}\x1b[0m" if enabled else text


def _scalar(v: Any) -> str:
    if isinstance(v, list) and len(v) > 8:
        return "[" + ", ".join(map(_scalar, v[:8])) + f", ... ({len(v)} values)]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_scalar(x)}" for k, x in v.items()) + "}"
    return json.dumps(v, default=str) if not isinstance(v, str) else v


def _bits(v: Any) -> str:
    """``0x7FC00001 (2143289345)``: a hex bit pattern with its unsigned decimal; anything else as it is."""
    if isinstance(v, str) and v.lower().startswith("0x"):
        try:
            return f"{v} ({int(v, 16)})"
        except ValueError:
            pass
    return _scalar(v)


def readable_element(el: dict[str, Any]) -> list[str]:
    """An element of a counterexample: its operands, then per output the native and reference bits."""
    head = f"index {el.get('index', '?')}"
    operands = el.get("operands") if isinstance(el.get("operands"), dict) else {}
    values = el.get("operand_values") if isinstance(el.get("operand_values"), dict) else {}
    if operands:
        head += ": " + ", ".join(
            f"{k} = {_scalar(v)}" + (f" ({_scalar(values[k])})" if k in values else "") for k, v in operands.items()
        )
    lines = [head]
    for name, out in (el.get("outputs") or {}).items():
        if not isinstance(out, dict):
            lines.append(f"  {name}: {_scalar(out)}")
            continue
        parts = []
        for side in ("native", "reference", "reference_alt"):
            if side in out:
                value = out.get(f"{side}_value")
                parts.append(f"{side} {_bits(out[side])}" + (f" = {_scalar(value)}" if value is not None else ""))
            elif side == "reference" and out.get("reference_value") is not None:
                parts.append(f"reference = {_scalar(out['reference_value'])}")
        parts += [f"{k} {_scalar(v)}" for k, v in out.items() if k not in _SHOWN_OUTPUT_KEYS]
        lines.append(f"  {name}: " + ", ".join(parts))
    rest = {k: v for k, v in el.items() if k not in ("index", "operands", "operand_values", "outputs")}
    lines += [f"  {k}: {_scalar(v)}" for k, v in rest.items()]
    return lines


_SHOWN_OUTPUT_KEYS = frozenset(
    {"native", "native_value", "reference", "reference_value", "reference_alt", "reference_alt_value"}
)


def _is_element(v: Any) -> bool:
    return isinstance(v, dict) and isinstance(v.get("outputs"), dict)


def readable_counterexample(cex: dict[str, Any], width: int | None = 100) -> list[str]:
    """A counterexample as ``name = value`` lines (symbols first), never cut JSON.

    Elements print their native and reference bits in hex and decimal; the replay command prints whole;
    other long values are shortened to ``width`` characters (None: never).
    """
    symbols = cex.get("symbols") if isinstance(cex.get("symbols"), dict) else None
    lines = []
    if symbols:
        lines.append(", ".join(f"{k} = {_scalar(v)}" for k, v in symbols.items()))
    for k, v in cex.items():
        if (k == "symbols" and symbols) or k == "minimality":  # the heading says how minimal it is
            continue
        if _is_element(v):
            first, *more = readable_element(v)
            lines += [f"{k}: {first}", *more]
            continue
        text = _scalar(v)
        cut = width is not None and k != "replay" and len(text) > width
        lines.append(f"{k}: {text[: width - 3] + '...' if cut else text}")
    return lines


def progress_bar(total: int, description: str, stream: TextIO | None = None) -> Any:
    """A rich progress bar on a terminal, else None (the caller prints plain lines)."""
    stream = stream if stream is not None else sys.stdout
    if not getattr(stream, "isatty", lambda: False)():
        return None
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        return None
    console = Console(file=stream, no_color=bool(os.environ.get("NO_COLOR")), highlight=False)
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[current]}"),
        console=console,
        transient=True,
    )
    bar.add_task(description, total=total, current="")
    return bar


class Reporter:
    """Progress of ``kc check``: per-contract and per-item lines (``-q`` fewer, ``-v`` more), a bar on a TTY."""

    def __init__(self, stream: TextIO | None = None, verbosity: int = 0, total: int = 0):
        self.stream = stream if stream is not None else sys.stdout
        self.colour = colour_enabled(self.stream)
        self.verbosity = verbosity
        self.bar = progress_bar(total, "checking", self.stream) if total and verbosity >= 0 else None
        if self.bar is not None:
            self.bar.start()

    def print(self, line: str = "") -> None:
        """One line of output, above the bar when there is one."""
        if self.bar is not None:
            self.bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        """Remove the bar."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def __call__(self, event: str, data: dict[str, Any] | None) -> None:
        assert data is not None
        if event == "contract":
            if self.verbosity >= 0:
                self.print(f"{data['id']} {data['version']}  ({data['path']})")
        elif event == "note":
            if self.verbosity >= 0:
                self.print(str(data["text"]))
        elif event == "start":
            if self.bar is not None:
                self.bar.update(self.bar.task_ids[0], current=data["id"])
        elif event == "done":
            if self.bar is not None:
                self.bar.advance(self.bar.task_ids[0])
            self._done(data)

    def _done(self, data: dict[str, Any]) -> None:
        status = data["status"]
        failing = status in ("violated", "error")
        if self.verbosity < 0 and not failing:
            return
        word = "violated (expected)" if status == "violated_expected" else status
        line = f"  {word:<10} {data['id']:<24} {data['method']:<9} {data['seconds']:>7.2f}s"
        detail = data.get("reason") or _evidence_line(data)
        if detail:
            line += f"  {detail if self.verbosity > 0 or len(detail) <= 300 else detail[:297] + '...'}"
        if data.get("resumed"):
            line += "  (from the results log)"
        self.print(paint(line, status, self.colour))
        if status == "violated" and data.get("counterexample"):
            how = data["counterexample"].get("minimality") or "as found"
            self.print(f"             counterexample ({how}):")
            width = None if self.verbosity > 0 else 100
            for text in readable_counterexample(data["counterexample"], width):
                self.print(f"               {text}")
            if data.get("replay"):
                self.print(f"             replay: {data['replay']}")
        if self.verbosity > 0 and status == "error" and (data.get("evidence") or {}).get("traceback"):
            for text in str(data["evidence"]["traceback"]).rstrip().splitlines():
                self.print(f"             {text}")


def _evidence_line(item: dict[str, Any]) -> str:
    ev = item.get("evidence") or {}
    reused = " (proof cache)" if ev.get("cache") == "hit" else ""
    stab = ev.get("stability")
    if isinstance(stab, dict) and stab.get("runs"):
        reused += f", stable {stab['proved']}/{stab['runs']} (rlimit max {stab.get('rlimit_max')})"
    if item["status"] == "proved" and "rlimit_used" in ev:
        return f"z3 unsat, rlimit {ev['rlimit_used']}/{ev['rlimit']}{reused}"
    if item["status"] == "exhausted":
        seen = f"{ev.get('points_in_given', ev.get('points'))} points in the given of {ev.get('points')} enumerated"
        return seen + reused
    if item["status"] == "proved" and reused:
        return reused.strip(" ,")
    if item["status"] == "passed" and isinstance(ev.get("cases_measured"), dict):
        return "; ".join(
            f"{k}: {m['interval']['estimate']:.4g} in [{m['interval']['low']:.4g}, {m['interval']['high']:.4g}] "
            f"{m['direction']} {m['threshold']:g} ({m['trials']} trials)"
            for k, m in ev["cases_measured"].items()
        )
    if item["status"] == "passed":
        return f"{ev.get('cases')} cases" + (f", seed {ev['seed']}" if "seed" in ev else "") + reused
    return ""
