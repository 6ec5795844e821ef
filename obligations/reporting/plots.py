"""Plots a reader would rather look at than read, registered by name and drawn with matplotlib (Agg).

matplotlib is optional (the ``report`` extra): without it ``plots_available()`` is False,
``render_plot`` returns None and reports say the plot was left out and why.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from obligations.reporting.evidence import error_axis, histogram_bin, timing_series

__all__ = [
    "PlotKind",
    "register_plot",
    "plot_kinds",
    "plots_for",
    "plots_available",
    "render_plot",
    "MISSING_MATPLOTLIB",
]

MISSING_MATPLOTLIB = "matplotlib is not installed (pip install 'kernel-contracts[report]')"

# Colours the tests look for in screenshots; keep them distinct from the page's text colours.
OURS_COLOUR = "#1f77b4"
PEER_COLOUR = "#ff7f0e"
BOUND_COLOUR = "#d62728"


@dataclass(frozen=True)
class PlotKind:
    """A named plot: when it applies to an item, its caption, and how to draw it on one Axes."""

    name: str
    title: str
    applies: Callable[[Mapping[str, Any]], bool]
    draw: Callable[[Mapping[str, Any], Any], None]
    caption: Callable[[Mapping[str, Any]], str]


_PLOTS: dict[str, PlotKind] = {}


def register_plot(kind: PlotKind) -> PlotKind:
    """Add ``kind`` (replacing one of the same name); returns it."""
    _PLOTS[kind.name] = kind
    return kind


def plot_kinds() -> dict[str, PlotKind]:
    """Registered plot kinds by name."""
    return dict(_PLOTS)


def plots_for(item: Mapping[str, Any]) -> list[PlotKind]:
    """The plot kinds that apply to ``item``, in registration order."""
    return [k for k in _PLOTS.values() if k.applies(item)]


def plots_available() -> bool:
    """True when matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _ev(item: Mapping[str, Any]) -> Mapping[str, Any]:
    return item.get("evidence") or {}


# --- ULP histogram --------------------------------------------------------------------------------


def _ulp_applies(item: Mapping[str, Any]) -> bool:
    return isinstance(_ev(item).get("ulp_histogram"), Mapping) and bool(_ev(item)["ulp_histogram"])


def _ulp_draw(item: Mapping[str, Any], ax: Any) -> None:
    # Numeric bins in order; open bins such as ">3_or_nan" go last, labelled as given.
    hist = sorted(((histogram_bin(k), v) for k, v in _ev(item)["ulp_histogram"].items()), key=lambda kv: kv[0])
    labels = [
        f"{k:g}" if k != float("inf") else str(raw)
        for (k, _), raw in zip(hist, sorted(_ev(item)["ulp_histogram"], key=histogram_bin), strict=True)
    ]
    ax.bar(labels, [v for _, v in hist], color=OURS_COLOUR)
    ax.set_yscale("log")
    ax.set_xlabel("ULP distance from reference")
    ax.set_ylabel("elements (log scale)")
    tol = item.get("tolerance")
    if tol is not None and item.get("agreement") == "max_ulp":
        ax.axvline(
            x=sum(1 for k, _ in hist if k <= float(tol)) - 0.5,
            color=BOUND_COLOUR,
            linestyle="--",
            label=f"tolerance {tol} ULP",
        )
        ax.legend()


def _ulp_caption(item: Mapping[str, Any]) -> str:
    ev = _ev(item)
    total = sum(ev["ulp_histogram"].values())
    return f"ULP error of {total:,} compared elements (max {ev.get('max_ulp', '?')} ULP)"


# --- observed error against bound ---------------------------------------------------------------


def _bound_applies(item: Mapping[str, Any]) -> bool:
    ev = _ev(item)
    return (
        isinstance(ev.get("observed_error"), list) and isinstance(ev.get("bound"), list) and bool(ev["observed_error"])
    )


def _bound_draw(item: Mapping[str, Any], ax: Any) -> None:
    ev = _ev(item)
    axis = error_axis(ev)
    xs = axis[1] if axis else list(range(len(ev["observed_error"])))
    ax.plot(xs, ev["observed_error"], marker="o", color=OURS_COLOUR, label="observed error")
    ax.plot(xs[: len(ev["bound"])], ev["bound"], marker="s", linestyle="--", color=BOUND_COLOUR, label="bound")
    ax.set_yscale("log")
    if axis and all(isinstance(x, int | float) and x > 0 for x in xs):
        ax.set_xscale("log", base=2)
    ax.set_xlabel(axis[0] if axis else "case")
    ax.set_ylabel("error")
    ax.legend()


def _bound_caption(item: Mapping[str, Any]) -> str:
    return "Observed error (solid) against the contract's bound (dashed); below the dashed line holds"


# --- timings -------------------------------------------------------------------------------------


def _timing_applies(item: Mapping[str, Any]) -> bool:
    return bool(timing_series(_ev(item).get("timings_ms")))


def _timing_draw(item: Mapping[str, Any], ax: Any) -> None:
    timings = timing_series(_ev(item)["timings_ms"])
    names = list(timings)
    medians = [statistics.median(v) for v in timings.values()]
    lows = [m - min(v) for m, v in zip(medians, timings.values(), strict=True)]
    highs = [max(v) - m for m, v in zip(medians, timings.values(), strict=True)]
    colours = [OURS_COLOUR if i == 0 else PEER_COLOUR for i in range(len(names))]
    ax.bar(names, medians, yerr=[lows, highs], capsize=6, color=colours)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_ylabel("median time (ms), whiskers min..max")


def _timing_caption(item: Mapping[str, Any]) -> str:
    ev = _ev(item)
    ratio = f"; ratio {ev['ratio']}" if "ratio" in ev else ""
    return f"Median run time per implementation{ratio}"


for _k in (
    PlotKind("ulp_histogram", "ULP error histogram", _ulp_applies, _ulp_draw, _ulp_caption),
    PlotKind("error_vs_bound", "Observed error against bound", _bound_applies, _bound_draw, _bound_caption),
    PlotKind("timings", "Timings", _timing_applies, _timing_draw, _timing_caption),
):
    register_plot(_k)


def render_plot(kind: PlotKind, item: Mapping[str, Any]) -> bytes | None:
    """PNG bytes of ``kind`` drawn for ``item`` (deterministic for one matplotlib), or None without it."""
    if not plots_available():
        return None
    from matplotlib.figure import Figure  # no pyplot: no global backend state, no display needed

    fig = Figure(figsize=(6.0, 3.2), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    kind.draw(item, ax)
    ax.set_title(f"{item.get('id', '')}: {kind.title}", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()
