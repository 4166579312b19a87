"""The memory curve of a Report: bytes live over program order, drawn as an inline SVG for the HTML
page and the notebook, and the scales the PNG draws it with too (its unit, its peak, the budget
line, the step's phases)."""

from __future__ import annotations

import dataclasses
import math
from html import escape

from jaxmem.report import Report
from jaxmem.units import fmt_bytes

# the step's phases on the memory curve, each with its band's colour (the PNG draws the same)
PHASES = (("forward", "#ddf4ff"), ("backward", "#fbefff"), ("optimizer update", "#fff8c5"))


def _nice_step(span: float, target_ticks: int = 5) -> float:
    raw = span / max(target_ticks, 1)
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def scale_unit(n: int) -> tuple[str, int]:
    """The binary unit a byte count `n` reads best in, and its size in bytes."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return unit, scale
    return "B", 1


def _fmt_tick(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".") if v != int(v) else f"{int(v)}"


def peak_index(r: Report) -> int:
    tl = r.timeline
    if not tl:
        return -1
    if 0 <= r.timeline_peak_index < len(tl):
        return r.timeline_peak_index
    return max(range(len(tl)), key=tl.__getitem__)


def buffer_budget(r: Report) -> int | None:
    """The usable memory less what the curve does not show (runtime overhead), so the two compare."""
    if r.target.usable_bytes is None:
        return None
    return r.target.usable_bytes - r.breakdown.get("runtime_overhead", 0)


@dataclasses.dataclass(frozen=True)
class _Plot:
    """The plot's place in the SVG (margins: room for axis labels) and its scales."""
    width: int
    height: int
    n: int                 # points on the curve
    ymax: float            # bytes at the plot's top
    ml: int = 78
    mr: int = 24
    mt: int = 30
    mb: int = 44

    @property
    def pw(self) -> int:
        return self.width - self.ml - self.mr

    @property
    def ph(self) -> int:
        return self.height - self.mt - self.mb

    def x(self, i: float) -> float:
        return self.ml + (self.pw * i / (self.n - 1) if self.n > 1 else self.pw / 2)

    def y(self, v: float) -> float:
        return self.mt + self.ph - self.ph * v / self.ymax


def _axes(p: _Plot, unit: str, scale: int, step: float) -> list[str]:
    """The grid with its y labels, and the x axis's ticks as shares of the program."""
    out = []
    t = 0.0
    while t <= p.ymax / scale + 1e-9:
        yy = p.y(t * scale)
        out.append(f'<line class="grid" x1="{p.ml}" x2="{p.ml + p.pw}" y1="{yy:.1f}" y2="{yy:.1f}"/>')
        out.append(f'<text class="ylab" x="{p.ml - 8}" y="{yy + 4:.1f}" text-anchor="end">{_fmt_tick(t)} {unit}</text>')
        t += step
    for frac in (0, 0.25, 0.5, 0.75, 1):
        xx = p.ml + p.pw * frac
        out.append(f'<line class="xtick" x1="{xx:.1f}" x2="{xx:.1f}" y1="{p.mt + p.ph}" y2="{p.mt + p.ph + 5}"/>')
        out.append(f'<text class="xlab" x="{xx:.1f}" y="{p.mt + p.ph + 19}" text-anchor="middle">{int(frac * 100)}%'
                   '</text>')
    out.append(f'<text class="xlab axis" x="{p.ml + p.pw / 2:.1f}" y="{p.height - 6}" text-anchor="middle">'
               f'program order (HLO instruction sequence; {p.n} points, max per bucket)</text>')
    return out


def _phase_bands(r: Report, p: _Plot) -> list[str]:
    """The step's phases (Report.timeline_phases): a light band each, named above the plot at its start."""
    n = p.n
    edges = (0, *(min(max(i, 0), n - 1) for i in r.timeline_phases), n - 1) if len(r.timeline_phases) == 2 else ()
    free = 0.0   # where the top margin is free again, right of the last phase's name
    bands: list[str] = []
    for k, (name, color) in enumerate(PHASES if edges else ()):
        x0, x1 = p.x(edges[k]), p.x(edges[k + 1])
        if x1 <= x0:
            continue
        bands.append(f'<rect class="phase" x="{x0:.1f}" y="{p.mt}" width="{x1 - x0:.1f}" height="{p.ph}" '
                     f'fill="{color}"><title>{name}</title></rect>')
        room = 7 * len(name)   # about 7 px a character at the labels' 12 px
        # named at its start; a narrow band (the optimizer update) ends its name at the plot's right edge
        # when the margin there is free; its tooltip names it always
        lx, anchor = (x0 + 4, "start") if x1 - x0 >= room else (p.ml + p.pw, "end")
        start = lx if anchor == "start" else lx - room
        if start >= free:
            bands.append(f'<text class="xlab phaselab" x="{lx:.1f}" y="{p.mt - 8}" text-anchor="{anchor}">{name}'
                         '</text>')
            free = start + room + 8
    return bands


def _area_and_budget(tl, p: _Plot, budget: int | None, clip_id: str) -> list[str]:
    """The area under the curve (red above the budget), its line, and the budget's line with its label."""
    pts = " ".join(f"{p.x(i):.1f},{p.y(v):.1f}" for i, v in enumerate(tl))
    area = f"M{p.x(0):.1f},{p.y(0):.1f} L{pts.replace(' ', ' L')} L{p.x(p.n - 1):.1f},{p.y(0):.1f} Z"
    out = [f'<path class="area" d="{area}"/>']
    if budget is not None:
        # the part of the area above the budget, in red
        yb = p.y(budget)
        out.append(f'<clipPath id="{escape(clip_id)}"><rect x="{p.ml}" y="{p.mt}" width="{p.pw}" '
                   f'height="{max(yb - p.mt, 0):.1f}"/></clipPath>')
        out.append(f'<path class="area over" d="{area}" clip-path="url(#{escape(clip_id)})"/>')
    out.append(f'<polyline class="line" points="{pts}"/>')
    if budget is not None:
        yb = p.y(budget)
        out.append(f'<line class="budget" x1="{p.ml}" x2="{p.ml + p.pw}" y1="{yb:.1f}" y2="{yb:.1f}"/>')
        out.append(f'<text class="budgetlab" x="{p.ml + 6}" y="{yb - 6:.1f}">usable for buffers '
                   f'{escape(fmt_bytes(budget))} (usable less runtime overhead)</text>')
    return out


def _peak_mark(r: Report, p: _Plot) -> list[str]:
    """The peak: a line down to the axis, a dot, and its size beside it (left of it past 60% of the plot)."""
    tl = r.timeline
    pi = peak_index(r)
    px, py = p.x(pi), p.y(tl[pi])
    anchor, dx = ("end", -10) if px > p.ml + p.pw * 0.6 else ("start", 10)
    ly = max(py + 4, p.mt + 12)
    return [f'<line class="peakline" x1="{px:.1f}" x2="{px:.1f}" y1="{py:.1f}" y2="{p.mt + p.ph}"/>',
            f'<circle class="peakdot" cx="{px:.1f}" cy="{py:.1f}" r="5"/>',
            (f'<text id="peak-label" class="peaklab" x="{px + dx:.1f}" y="{ly:.1f}" text-anchor="{anchor}">'
             f'peak {escape(fmt_bytes(tl[pi]))}</text>')]


def _hover(p: _Plot) -> list[str]:
    """The hover read-out's elements (driven by the page's script)."""
    return [('<g id="hover" visibility="hidden"><line id="hover-line" class="hoverline" '
             f'x1="0" x2="0" y1="{p.mt}" y2="{p.mt + p.ph}"/>'
             '<circle id="hover-dot" class="hoverdot" r="4" cx="0" cy="0"/></g>'),
            f'<rect id="hover-area" x="{p.ml}" y="{p.mt}" width="{p.pw}" height="{p.ph}" fill="transparent"/>']


def curve_svg(r: Report, width: int = 1000, height: int = 340, *, clip_id: str = "over",
              hover: bool = True) -> tuple[str, dict]:
    """The bytes live over program order, peak marked.

    Returns an inline <svg> (no xmlns needed inside HTML) and its geometry, for the hover script.
    clip_id: unique per page (a notebook shows many curves, and url(#id) takes the first);
    hover=False leaves out the hover read-out's elements (no script to drive them).
    """
    tl = r.timeline
    top = max(tl)
    budget = buffer_budget(r)
    if budget is not None and not 0 < budget <= 1.6 * top:
        budget = None                        # off the curve's scale: not drawn
    ymax_raw = max(top, budget or 0) * 1.06 or 1
    unit, scale = scale_unit(int(ymax_raw))
    step = _nice_step(ymax_raw / scale)
    p = _Plot(width, height, len(tl), math.ceil(ymax_raw / scale / step - 1e-9) * step * scale)
    out = [(f'<svg id="curve" viewBox="0 0 {width} {height}" role="img" preserveAspectRatio="xMidYMid meet" '
            f'aria-label="bytes live over program order, peak {escape(fmt_bytes(top))}">'),
           "<title>bytes live over program order (hover for values)</title>",
           *_phase_bands(r, p),              # drawn first, under the grid
           *_axes(p, unit, scale, step),
           *_area_and_budget(tl, p, budget, clip_id),
           *_peak_mark(r, p),
           f'<line class="axisline" x1="{p.ml}" x2="{p.ml + p.pw}" y1="{p.mt + p.ph}" y2="{p.mt + p.ph}"/>',
           *(_hover(p) if hover else ()),
           "</svg>"]
    geom = {"ml": p.ml, "mt": p.mt, "pw": p.pw, "ph": p.ph, "ymax": p.ymax, "w": width, "h": height}
    return "".join(out), geom
