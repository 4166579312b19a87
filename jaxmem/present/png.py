"""A static PNG of a Report (matplotlib, Agg): the memory curve with its peak and the step's phases
marked (forward, backward, optimizer update), and the breakdown as one stacked bar; colours and
scales shared with the HTML report. Importing it loads matplotlib: its users (analyze --png,
jaxmem.present.outputs; the explore page's PNG download) import it when a picture is drawn."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from jaxmem import files
from jaxmem.present.curve import PHASES, buffer_budget, peak_index, scale_unit
from jaxmem.present.html import COLORS, _color
from jaxmem.report import VERDICT_TEXT, Report, breakdown_in_order, verdict_of
from jaxmem.units import fmt_bytes


def write_png(report: Report, path, *, dpi: int = 110) -> Path:
    """A static figure: the curve with its peak and phases marked, and the breakdown as one stacked bar."""
    # Model names and module paths are the user's text: a `$` prints as a `$` instead of starting mathtext.
    with matplotlib.rc_context({"text.parse_math": False}):
        fig = figure(report, dpi=dpi)
        buf = io.BytesIO()   # rendered in memory, then written beside and renamed: never through a link
        fig.savefig(buf, format="png", dpi=dpi)
    p = Path(path)
    files.write_output(p, buf.getvalue(), option="--png")
    return p


def phase_spans(r: Report, xs: list[float]) -> list[tuple[str, str, float, float]]:
    """(name, colour, start, end) on the curve's x axis (% of the program) of the forward pass, the
    backward pass and the optimizer update that follows it; [] where the program shows no backward."""
    if len(r.timeline_phases) != 2 or not xs:
        return []
    b, o = (min(max(i, 0), len(xs) - 1) for i in r.timeline_phases)
    edges = (0.0, xs[b], xs[o], 100.0)
    return [(name, color, edges[k], edges[k + 1]) for k, (name, color) in enumerate(PHASES) if edges[k + 1] > edges[k]]


def figure(report: Report, *, dpi: int = 110):
    """The PNG's matplotlib Figure (no pyplot: no global state, no display; drawn with Agg)."""
    r = report
    has_curve = bool(r.timeline)
    fig = Figure(figsize=(11, 6.2 if has_curve else 2.8), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    if has_curve:
        ax, bx = fig.subplots(2, 1, height_ratios=[3.2, 1])
    else:
        ax, bx = None, fig.subplots(1, 1)
    verdict = VERDICT_TEXT.get(verdict_of(r) or "", "no fixed limit").upper()
    fig.suptitle(f"{r.model} on {r.target.devices} × {r.target.description} ({r.target.gpu}), "
                 f"mesh {','.join(f'{n}={s}' for n, s in r.mesh)}, {r.layout}: "
                 f"{fmt_bytes(r.per_device_peak_bytes)} per device — {verdict}", fontsize=11.5, fontweight="bold")
    if ax is not None:
        _curve(ax, r)
    _breakdown_bar(bx, r)
    return fig


def _curve(ax, r: Report) -> None:
    """The memory curve on `ax`: the step's phases as bands, the usable line, the peak marked."""
    tl = r.timeline
    unit, scale = scale_unit(max(tl))
    xs = [100 * i / max(len(tl) - 1, 1) for i in range(len(tl))]
    ys = [v / scale for v in tl]
    spans = phase_spans(r, xs)
    for _name, color, x0, x1 in spans:
        ax.axvspan(x0, x1, color=color, linewidth=0, zorder=0)
    if spans:
        ax.legend(handles=[Patch(color=color, label=f"{name} {x0:.0f}-{x1:.0f}%")
                           for name, color, x0, x1 in spans],
                  loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=len(spans), fontsize=8.5, frameon=False,
                  borderaxespad=0.2, title=None)
    ax.fill_between(xs, ys, color=COLORS["params"], alpha=0.18, linewidth=0)
    ax.plot(xs, ys, color=COLORS["params"], linewidth=1.3)
    budget = buffer_budget(r)
    if budget is not None and 0 < budget <= 1.6 * max(tl):
        ax.axhline(budget / scale, color="#cf222e", linestyle="--", linewidth=1.2)
        ax.text(0.5, budget / scale, f" usable for buffers {fmt_bytes(budget)}", color="#cf222e",
                va="bottom", fontsize=9, fontweight="bold")
    pi = peak_index(r)
    ax.plot([xs[pi]], [ys[pi]], "o", color="#cf222e", markeredgecolor="white", markersize=8, zorder=5)
    ax.axvline(xs[pi], color="#1f2328", linestyle=":", linewidth=1)
    right = xs[pi] > 60
    ax.annotate(f"peak {fmt_bytes(tl[pi])}", (xs[pi], ys[pi]), xytext=(-10 if right else 10, -4),
                textcoords="offset points", ha="right" if right else "left", va="top", fontsize=11,
                fontweight="bold")
    ax.set_xlim(0, 100)
    ax.set_ylim(0, max(max(ys), (budget or 0) / scale if budget and budget <= 1.6 * max(tl) else 0) * 1.12)
    ax.set_ylabel(f"live in XLA buffers ({unit})")
    ax.set_xlabel("program order (% of the HLO instruction sequence)")
    ax.grid(axis="y", color="#eaeef2")
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)


def _breakdown_bar(bx, r: Report) -> None:
    """The per-device peak's breakdown on `bx` as one stacked bar, the usable memory marked (or named off scale)."""
    peak = max(r.per_device_peak_bytes, 1)
    unit, scale = scale_unit(peak)
    left = 0.0
    for i, (k, v) in enumerate(breakdown_in_order(r.breakdown)):
        if v <= 0:
            continue
        w = v / scale
        bx.barh([0], [w], left=left, color=_color(k, i), edgecolor="white", linewidth=0.6,
                label=f"{k} {fmt_bytes(v)}")
        if v / peak > 0.08:
            bx.text(left + w / 2, 0, k, ha="center", va="center", fontsize=8.5, color="white", fontweight="bold")
        left += w
    usable = r.target.usable_bytes
    on_scale = usable if usable is not None and usable <= 1.6 * peak else None  # else the bar would shrink to nothing
    if on_scale is not None:
        bx.axvline(on_scale / scale, color="#1f2328", linewidth=1.5)
        bx.text(on_scale / scale, 0.45, f" usable {fmt_bytes(on_scale)}", fontsize=8.5, va="bottom", ha="left")
    elif usable is not None:
        bx.text(1.0, 0.62, f"usable {fmt_bytes(usable)} (off scale) →", transform=bx.get_yaxis_transform(),
                fontsize=8.5, va="bottom", ha="right")
    bx.set_yticks([])
    bx.set_ylim(-0.5, 0.8)
    bx.set_xlim(0, max(peak, on_scale or 0) / scale * 1.02)
    bx.set_xlabel(f"per-device peak breakdown ({unit})")
    for s in ("top", "right", "left"):
        bx.spines[s].set_visible(False)
    bx.legend(loc="upper center", bbox_to_anchor=(0.5, -0.55), ncol=4, fontsize=8, frameon=False)
