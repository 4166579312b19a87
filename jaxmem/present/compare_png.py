"""compare's PNG (``compare --png FILE``): the rows' bars, step times and throughputs, and the fit searches'
curves below when there was a search -- jaxmem.present.compare_figs's figures drawn with matplotlib (Agg, no
pyplot), every text inside the canvas and none over another (tests/test_compare_figs.py). Importing it loads
matplotlib: compare's --png (jaxmem.present.outputs) imports it when a picture is drawn."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from jaxmem import files
from jaxmem.plan.compare import in_rank_order
from jaxmem.plan.compare import label as compare_label
from jaxmem.present.compare_figs import (
    ERROR,
    PALETTE,
    PARTS,
    RANKED,
    STEP,
    UNRANKED,
    USABLE,
    _axis_name,
    _clip,
    _scale,
    _step_scale,
    _usables,
    found,
    parts,
    rank_note,
    ranked_label,
    rates,
    searched,
    step_band,
    title,
)
from jaxmem.present.curve import scale_unit
from jaxmem.units import fmt_bytes, fmt_seconds

# the search curves' markers and dashes, row by row (the colours: compare_figs.PALETTE)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h")
DASHES: tuple[Any, ...] = ("-", "--", "-.", ":")


def write_png(cells, path, *, dpi: int = 110) -> Path:
    """The bars, and the search curves when there was a search, as one PNG."""
    with matplotlib.rc_context({"text.parse_math": False}):   # labels are the user's text: a `$` stays a `$`
        fig = figure(cells, dpi=dpi)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
    p = Path(path)
    files.write_output(p, buf.getvalue(), option="--png")
    return p


def figure(cells, *, dpi: int = 110):
    """The PNG's matplotlib Figure (Agg, no pyplot): per row its bar, step time and throughput, and the
    search curves below when there was a search (a subfigure of its own: its legend, right of the plot,
    takes no width from the panels above)."""
    cells = in_rank_order(list(cells))
    rows = searched(cells)
    bars_h = 0.42 * len(cells) + 1.4
    curves_h = 4.4 if rows else 0.0
    fig = Figure(figsize=(15, bars_h + curves_h + 1.3), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)   # a renderer to measure text with (an error row's text is cut to its panel)
    fig.suptitle(_wrap(f"jaxmem compare: {title(cells)}", 150), fontsize=12, fontweight="bold")
    subs: Any = fig.subfigures(2, 1, height_ratios=[bars_h, curves_h]) if rows else None   # an array of two
    top, bottom = (subs[0], subs[1]) if subs is not None else (fig, None)
    unit = _panels(top, cells, dpi)
    if bottom is not None:
        _curves(bottom.subplots(), rows)
    fig.supxlabel(_wrap(rank_note(unit) + ". A searched row is shown at its answer.", 190), fontsize=8,
                  color="#57606a")
    return fig


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width))


def _fit_text(ax, t, width: float) -> None:
    """Shorten the Text `t` (an ellipsis at the end) until it is at most `width` pixels wide."""
    renderer = ax.figure.canvas.get_renderer()
    text = t.get_text()
    while len(text) > 2 and t.get_window_extent(renderer).width > width:
        text = text[:-2]
        t.set_text(text.rstrip() + "…")


def _si(x: float, _pos=None) -> str:
    """An axis tick as people read a rate: 0, 500, 12k, 2.5M."""
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def _panels(sub, cells, dpi: int) -> str:
    """The rows' panels on `sub`: stacked bars against the usable memory | step time and band |
    throughput per device (green: ranked, grey: does not fit). Returns the rate unit."""
    ax, sx, rx = sub.subplots(1, 3, width_ratios=[3.0, 1, 1.1], sharey=True)
    _bars(ax, cells)
    _step_times(sx, cells)
    unit = _rates(rx, cells)
    for a in (sx, rx):
        a.tick_params(axis="x", labelsize=8)
        a.tick_params(axis="y", left=False)
    sub.canvas.draw()   # the panels' sizes are known once drawn: an error row's text is cut to its panel
    for i, c in enumerate(cells):
        if c.report is None:
            t = ax.text(0.005, i, f"{c.status}: {c.error or ''}", va="center", color=ERROR, fontsize=8.5,
                        transform=ax.get_yaxis_transform())
            _fit_text(ax, t, ax.get_window_extent().width * 0.98)
    return unit


def _bars(ax, cells) -> None:
    """Each row's stacked bar of its parts, its usable memory marked, its peak (and verdict if it fails) beside."""
    n = len(cells)
    unit_b, scale_b = scale_unit(_scale(cells))
    for i, c in enumerate(cells):
        if c.report is None:
            continue
        left = 0.0
        for _name, color, v in parts(c.report):
            ax.barh([i], [v / scale_b], left=left, color=color, edgecolor="white", linewidth=0.5)
            left += v / scale_b
        if c.report.target.usable_bytes:
            u = c.report.target.usable_bytes / scale_b
            ax.plot([u, u], [i - 0.42, i + 0.42], color=USABLE, linewidth=2.2)
        # the peak beside its bar (inside it where the bar reaches the right edge); the verdict where it fails
        xmax = _scale(cells) / scale_b * 1.02
        inside = left > 0.72 * xmax
        fails = c.report.fits is False
        ax.text(left, i, f"{fmt_bytes(c.report.per_device_peak_bytes)}{' does not fit' if fails else ''}",
                ha="right" if inside else "left", va="center", fontsize=8, color=ERROR if fails else "#1f2328",
                bbox={"boxstyle": "square,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
    ax.set_yticks(range(n), [_clip(ranked_label(c), 70) for c in cells], fontsize=8.5)
    for tick, c in zip(ax.get_yticklabels(), cells, strict=True):
        if c.report is None or c.report.fits is False:
            tick.set_color(ERROR)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlim(0, _scale(cells) / scale_b * 1.02)
    ax.set_xlabel(f"per-device peak ({unit_b})", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(handles=[Patch(color=color, label=name) for name, color, _ in PARTS]
              + [Line2D([], [], color=USABLE, linewidth=2.2, label="usable memory of the row's card")],
              loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=8, ncols=4, frameon=False, borderaxespad=0.2)


def _step_times(sx, cells) -> None:
    """Each row's estimated step time (a blue line) on its band (grey), one scale for all rows."""
    tmax = _step_scale(cells)
    for i, c in enumerate(cells):
        b = step_band(c.report)
        if b is None:
            continue
        est, lo, hi = b
        sx.barh([i], [hi - lo], left=lo, color="#d0d7de", height=0.5)
        sx.plot([est, est], [i - 0.35, i + 0.35], color=STEP, linewidth=2.2)
    sx.set_xlim(0, tmax * 1.05 if tmax else 1)
    sx.set_xlabel("step time (s)", fontsize=9)
    sx.xaxis.set_major_locator(MaxNLocator(nbins=3))
    sx.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: fmt_seconds(x) if x else "0"))
    sx.legend(handles=[Line2D([], [], color=STEP, linewidth=2.2, label="estimate"),
                       Patch(color="#d0d7de", label="band")], loc="lower left", bbox_to_anchor=(0.0, 1.0),
              fontsize=8, ncols=1, frameon=False, borderaxespad=0.2)


def _rates(rx, cells) -> str:
    """Each row's throughput per device with its band (green: ranked, grey: does not fit); the rate's unit."""
    unit, rate = rates(cells)
    rmax = max((hi for _, _, hi in rate.values()), default=0.0)
    for i, c in enumerate(cells):
        if id(c) not in rate:
            continue
        rv, rlo, rhi = rate[id(c)]
        rx.barh([i], [rv], color=RANKED if c.rank is not None else UNRANKED, height=0.5,
                xerr=[[rv - rlo], [rhi - rv]], error_kw={"ecolor": "#57606a", "elinewidth": 1, "capsize": 2})
        rx.text(rhi + 0.04 * rmax, i, _si(rv), va="center", fontsize=8)
    rx.set_xlim(0, rmax * 1.7 if rmax else 1)
    rx.set_xlabel(f"{unit}/s per device", fontsize=9)
    rx.xaxis.set_major_locator(MaxNLocator(nbins=3))
    rx.xaxis.set_major_formatter(FuncFormatter(_si))
    rx.legend(handles=[Patch(color=RANKED, label="fits: ranked (#k)"), Patch(color=UNRANKED, label="does not fit")],
              loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=8, ncols=1, frameon=False, borderaxespad=0.2)
    return unit


def _curves(bx, rows) -> None:
    """The search curves on `bx`: one line per row (colour, marker and dash differ), the usable lines
    named, each row's boundary dotted; the legend right of the plot."""
    pts = [(p.value, p.peak_bytes) for c in rows for p in c.search.probes if p.peak_bytes is not None]
    usables = _usables(rows)
    unit, scale = scale_unit(max([b for _, b in pts] + list(usables) + [1]))
    handles, labels = [], []
    for i, c in enumerate(rows):
        color, marker = PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)]
        dash = DASHES[i % len(DASHES)]
        probes = sorted((p for p in c.search.probes if p.peak_bytes is not None), key=lambda p: p.value)
        bx.plot([p.value for p in probes], [p.peak_bytes / scale for p in probes], color=color, linestyle=dash,
                linewidth=1.6)
        for fits in (True, False):
            ps = [p for p in probes if p.fits is fits]
            bx.plot([p.value for p in ps], [p.peak_bytes / scale for p in ps], linestyle="none", marker=marker,
                    markersize=6, color=color, markerfacecolor=color if fits else "white")
        for probe in (c.search.fits_at, c.search.fails_at):
            if probe is not None and probe.peak_bytes is not None:
                bx.axvline(probe.value, color=color, linestyle=":", linewidth=1)
        handles.append(Line2D([], [], color=color, linestyle=dash, marker=marker, linewidth=1.6))
        labels.append(_clip(f"{compare_label(c.choice)}: {found(c.search)}", 90))
    for k, (u, gpus) in enumerate(usables.items()):
        style: Any = ("--", "-.", (0, (4, 1, 1, 1)))[k % 3]
        bx.axhline(u / scale, color=USABLE, linestyle=style, linewidth=1.2)
        handles.append(Line2D([], [], color=USABLE, linestyle=style, linewidth=1.2))
        labels.append(f"usable memory {fmt_bytes(u)} ({gpus})")
    values = [v for v, _ in pts]
    if values and min(values) > 0 and max(values) / min(values) > 64:
        bx.set_xscale("log", base=2)   # a search spans powers of two: linear would crowd its first probes
        bx.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:,.0f}"))
        bx.xaxis.set_minor_formatter(FuncFormatter(lambda x, _pos: ""))
    bx.set_xlabel(_axis_name(rows) + (" (log scale)" if bx.get_xscale() == "log" else ""), fontsize=9)
    bx.set_ylabel(f"peak per device ({unit})", fontsize=9)
    bx.set_ylim(bottom=0)
    bx.tick_params(labelsize=8)
    handles += [Line2D([], [], color="#57606a", linestyle="none", marker="o", markerfacecolor="white"),
                Line2D([], [], color="#57606a", linestyle=":", linewidth=1)]
    labels += ["hollow marker: a value that does not fit", "dotted: a row's last fit and first failure"]
    bx.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
              borderaxespad=0.0)
