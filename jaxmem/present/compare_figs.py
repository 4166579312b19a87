"""compare's pictures: ``compare --html FILE`` / ``--png FILE`` and the notebook's rendering of rows.

* **One stacked bar per row**: the per-device peak split into parameters, optimizer state,
  gradients, activations and temporaries, the runtime's own memory and the rest (batch, other
  state, outputs not aliased), each row's usable memory marked on its bar; beside it the row's
  estimated step time with its band, and its throughput per device (tokens/s, or samples/s for a
  batch without a sequence) with its rank among the rows that fit. Rows that failed say why.
  The rows are listed as the table lists them: ranked rows first (jaxmem.plan.compare.in_rank_order).
* **The fit searches' curves** (``--find-batch``, ``--find-seq``, ``--find-devices``): each row's
  compiled peak against the value tried, each usable memory line named, the boundary (the last
  value that fits and the first that does not) marked.

A searched row is shown at the value its report was compiled at (its answer): every label says it
(``remat=full at batch=448``). The HTML is one self-contained file (inline CSS and SVG, no script,
opens offline); the PNG is the same figures drawn with matplotlib (Agg; jaxmem.present.compare_png), colours
shared with the single-report pages, every text inside the canvas and none over another (tests/test_compare_figs.py).
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from pathlib import Path

from jaxmem import files
from jaxmem.compiler.steptime import band
from jaxmem.plan import throughput
from jaxmem.plan.compare import in_rank_order, row_label
from jaxmem.plan.compare import label as compare_label
from jaxmem.present.curve import scale_unit
from jaxmem.present.html import COLORS, e
from jaxmem.units import fmt_bytes, fmt_seconds

# the parts of a bar, in order: (label, colour, breakdown keys); "other" takes every key not named
PARTS = (("params", COLORS["params"], ("params",)),
         ("optimizer", COLORS["optimizer_state"], ("optimizer_state",)),
         ("gradients", COLORS["gradients"], ("gradients",)),
         ("activations", COLORS["activations_and_temporaries"], ("activations_and_temporaries",)),
         ("runtime", COLORS["runtime_overhead"], ("runtime_overhead",)),
         ("other", "#6e7781", ()))
_NAMED = {k for _, _, keys in PARTS for k in keys}
USABLE, STEP, RANKED, UNRANKED, ERROR = "#cf222e", "#0969da", "#1a7f37", "#afb8c1", "#cf222e"
# the search curves: colour (and in the PNG marker and dash, compare_png) differ from row to row, so equal
# curves stay apart
PALETTE = ("#0969da", "#8250df", "#bf3989", "#1a7f37", "#9a6700", "#57606a", "#e16f24", "#0a3069")


def label(cell) -> str:
    """The row's label (jaxmem.plan.compare.row_label): its choices, and a searched row's answer."""
    return row_label(cell)


def ranked_label(cell) -> str:
    """`#2 remat=full at batch=448`: the rank among the rows that fit, where the row has one."""
    return f"#{cell.rank} {label(cell)}" if cell.rank is not None else label(cell)


def parts(report) -> list[tuple[str, str, int]]:
    """(label, colour, bytes) of each part of a row's peak; they sum to the peak."""
    b = report.breakdown
    out = [(name, color, sum(b.get(k, 0) for k in keys)) for name, color, keys in PARTS[:-1]]
    out.append((PARTS[-1][0], PARTS[-1][1], sum(v for k, v in b.items() if k not in _NAMED)))
    return out


def cards(cells) -> str:
    """Every card of the rows, as `1 x NVIDIA H100 80GB HBM3, 1 x NVIDIA GeForce RTX 4090`."""
    seen = dict.fromkeys(f"{c.report.target.devices} x {c.report.target.description}"
                         for c in cells if c.report is not None)
    return ", ".join(seen)


def title(cells) -> str:
    """`llama-tiny, 4 rows on 1 x NVIDIA H100 80GB HBM3, 1 x NVIDIA GeForce RTX 4090`."""
    cells = list(cells)
    models = ", ".join(dict.fromkeys(c.report.model for c in cells if c.report is not None)) or "compare"
    where = cards(cells)
    return f"{models}, {len(cells)} row{'s' if len(cells) != 1 else ''}" + (f" on {where}" if where else "")


def _scale(cells) -> int:
    tops = [max(c.report.per_device_peak_bytes, c.report.target.usable_bytes or 0)
            for c in cells if c.report is not None]
    return max(tops, default=1) or 1


def step_band(report) -> tuple[float, float, float] | None:
    """(estimate, low, high) seconds of a row's estimated step time, or None."""

    return band(report.step_time if report is not None else None)


def _step_scale(cells) -> float:
    return max((b[2] for c in cells if (b := step_band(c.report)) is not None), default=0.0)


def rates(cells) -> tuple[str, dict[int, tuple[float, float, float]]]:
    """(unit, id(cell) -> (rate, low, high) per second per device) for the rows with a throughput,
    in the unit the rows are ranked in (jaxmem.plan.throughput.unit_of)."""
    tps = {id(c): c.throughput for c in cells}
    unit = throughput.unit_of(list(tps.values()))
    out = {}
    for i, t in tps.items():
        if t is not None:
            out[i] = t.band if unit == "tokens" else throughput.samples_band(t)
    return unit, out


def rank_note(unit: str) -> str:
    what = "tokens (batch x sequence)" if unit == "tokens" else "samples (the global batch)"
    return (f"{unit}/s per device: the {what} a step trains on over its estimated step time, per device; "
            f"#k: its rank among the rows that fit, highest first; rows whose bands overlap are tied and "
            f"share a rank; grey: does not fit, not ranked")


def found(search) -> str:
    """`max batch 448`, `max seq_len >= 1048576 (the search's limit)`, `no batch fits`, `min data size 4`."""
    what = {"batch": "batch", "seq": search.arg or "value", "devices": "data size"}[search.kind]
    if search.answer is None or (search.answer == 0 and search.kind != "devices"):
        return f"no {what} fits"
    if search.kind == "devices":
        return f"min {what} {search.answer}"
    return f"max {what} " + (f">= {search.answer} (the search's limit)" if search.capped else str(search.answer))


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:max(chars - 1, 1)] + "…"


@dataclasses.dataclass(frozen=True)
class _Columns:
    """The bars' columns, left to right (px): the row labels | the stacked bar | its peak and verdict | the step
    time and band | the throughput per device; and the rows' height and top."""
    pad_l: int
    plot_w: int = 420
    verdict_w: int = 160
    step_w: int = 120
    step_text: int = 74
    rate_w: int = 110
    rate_text: int = 96
    row_h: int = 34
    top: int = 52

    @property
    def step_x(self) -> int:
        return self.pad_l + self.plot_w + self.verdict_w

    @property
    def rate_x(self) -> int:
        return self.step_x + self.step_w + self.step_text

    @property
    def width(self) -> int:
        return self.rate_x + self.rate_w + self.rate_text + 16


_CHAR = 6.6   # px per character of the 12px sans-serif (a little over its average advance)


def _bars_legend(col: _Columns, tmax: float, rate: dict, unit: str) -> list[str]:
    """The parts' colours and the usable line above the bars; the step time's and throughput's headings."""
    out = []
    x = col.pad_l
    for name, color, _ in PARTS:
        out.append(f'<rect x="{x}" y="8" width="12" height="12" fill="{color}"/>'
                   f'<text x="{x + 16}" y="18" font-size="12">{e(name)}</text>')
        x += 24 + int(_CHAR * len(name))
    out.append(f'<line x1="{x + 4}" x2="{x + 4}" y1="6" y2="22" stroke="{USABLE}" stroke-width="2.5"/>'
               f'<text x="{x + 10}" y="18" font-size="12">usable memory</text>')
    if tmax > 0:
        out.append(f'<text class="step-axis" x="{col.step_x}" y="40" font-size="12">step time (est., band)</text>')
    if rate:
        out.append(f'<text x="{col.rate_x}" y="40" font-size="12">{e(unit)}/s per device</text>')
    return out


def _bar(r, y: int, col: _Columns, scale: int) -> list[str]:
    """A row's stacked bar of its parts, its usable memory marked on it, and its peak and verdict beside it."""
    out = []
    left = float(col.pad_l)
    for name, color, v in parts(r):
        w = col.plot_w * v / scale
        if w > 0:
            out.append(f'<rect class="part" data-part="{name}" x="{left:.1f}" y="{y + 4}" width="{w:.1f}" '
                       f'height="{col.row_h - 10}" fill="{color}"><title>{e(name)} {e(fmt_bytes(v))}</title></rect>')
        left += w
    usable = r.target.usable_bytes
    if usable:
        ux = col.pad_l + col.plot_w * usable / scale
        out.append(f'<line class="usable" x1="{ux:.1f}" x2="{ux:.1f}" y1="{y}" y2="{y + col.row_h - 2}" '
                   f'stroke="{USABLE}" stroke-width="2.5"><title>usable {e(fmt_bytes(usable))}</title></line>')
    verdict = "" if r.fits is None else (" fits" if r.fits else " does not fit")
    out.append(f'<text x="{col.pad_l + col.plot_w + 8}" y="{y + 18}" font-size="12" '
               f'fill="{"#1a7f37" if r.fits else "#cf222e" if r.fits is False else "#1f2328"}">'
               f'{e(fmt_bytes(r.per_device_peak_bytes))}{verdict}</text>')
    return out


def _step_mark(b: tuple[float, float, float], y: int, col: _Columns, tmax: float) -> str:
    """A row's estimated step time (a blue line) on its band (grey), the estimate written beside."""
    est, lo, hi = b
    x0, x1, xe = (col.step_x + col.step_w * v / tmax for v in (lo, hi, est))
    return (f'<rect class="step-band" x="{x0:.1f}" y="{y + 8}" width="{max(x1 - x0, 1):.1f}" '
            f'height="{col.row_h - 18}" fill="#d0d7de"><title>step time band {e(fmt_seconds(lo))}-'
            f'{e(fmt_seconds(hi))}</title></rect>'
            f'<line class="step" x1="{xe:.1f}" x2="{xe:.1f}" y1="{y + 4}" y2="{y + col.row_h - 6}" '
            f'stroke="{STEP}" stroke-width="2.5"><title>step time (estimate) {e(fmt_seconds(est))}'
            f'</title></line>'
            f'<text x="{col.step_x + col.step_w + 4}" y="{y + 18}" font-size="11">{e(fmt_seconds(est))}</text>')


def _rate_mark(c, rv_band: tuple[float, float, float], y: int, col: _Columns, rmax: float, unit: str) -> str:
    """A row's throughput per device as a bar (green: ranked, grey: does not fit), its rank in the tooltip."""
    rv, rlo, rhi = rv_band
    color = RANKED if c.rank is not None else UNRANKED
    what = f"rank {c.rank}" if c.rank is not None else "not ranked: does not fit"
    return (f'<rect class="rate" x="{col.rate_x}" y="{y + 8}" width="{max(col.rate_w * rv / rmax, 1):.1f}" '
            f'height="{col.row_h - 18}" fill="{color}"><title>{e(throughput.fmt_rate(rv))} {e(unit)}/s per '
            f'device (band {e(throughput.fmt_rate(rlo))}-{e(throughput.fmt_rate(rhi))}); {what}</title>'
            f'</rect><text x="{col.rate_x + col.rate_w + 4}" y="{y + 18}" font-size="11">'
            f'{e(throughput.fmt_rate(rv))}</text>')


def bars_svg(cells, width: int | None = None) -> str:
    """The rows' stacked bars against their usable memory, beside each its estimated step time with its
    band and its throughput per device with its rank, as one SVG. Every text is clipped to its column."""

    cells = in_rank_order(list(cells))
    labels = [ranked_label(c) for c in cells]
    col = _Columns(pad_l=int(min(max((len(s) for s in labels), default=4) * _CHAR + 24, 440)))
    width = width or col.width
    row_h, top = col.row_h, col.top
    tmax = _step_scale(cells)
    unit, rate = rates(cells)
    rmax = max((hi for _, _, hi in rate.values()), default=0.0)
    note = textwrap.wrap(rank_note(unit) + ". Bars: per-device bytes at the peak; red line: the memory JAX may use "
                         "on that row's card; step time: the estimate (blue) and its band (grey), one scale for "
                         "all rows.", int((width - 16) / 6.0))
    height = top + row_h * len(cells) + 10 + 15 * len(note)
    scale = _scale(cells)
    out = [(f'<svg class="bars" viewBox="0 0 {width} {height}" width="100%" role="img" '
           f'xmlns="http://www.w3.org/2000/svg"><title>per-device peak by part, each row against its usable memory; '
           f'estimated step time; {e(unit)}/s per device and rank</title>')]
    out += _bars_legend(col, tmax, rate, unit)
    for i, c in enumerate(cells):
        y = top + i * row_h
        out.append(f'<text x="{col.pad_l - 8}" y="{y + 18}" font-size="12" text-anchor="end">'
                   f'<title>{e(labels[i])}</title>{e(_clip(labels[i], int((col.pad_l - 16) / _CHAR)))}</text>')
        r = c.report
        if r is None:
            why = f"{c.status}: {c.error or ''}"
            out.append(f'<text x="{col.pad_l}" y="{y + 18}" font-size="12" fill="{ERROR}"><title>{e(why)}</title>'
                       f'{e(_clip(why, int((width - col.pad_l - 8) / _CHAR)))}</text>')
            continue
        out += _bar(r, y, col, scale)
        b = step_band(r)
        if b is not None and tmax > 0:
            out.append(_step_mark(b, y, col, tmax))
        if id(c) in rate and rmax > 0:
            out.append(_rate_mark(c, rate[id(c)], y, col, rmax, unit))
    for j, line in enumerate(note):
        out.append(f'<text x="8" y="{top + row_h * len(cells) + 18 + 15 * j}" font-size="11" fill="#57606a">'
                   f'{e(line)}</text>')
    out.append("</svg>")
    return "".join(out)


def searched(cells) -> list:
    return [c for c in cells if c.search is not None and c.search.probes]


def _usables(rows) -> dict[int, str]:
    """Each usable memory the searched rows were judged against -> the cards that have it."""
    out: dict[int, list[str]] = {}
    for c in rows:
        for p in c.search.probes:
            if p.usable_bytes:
                names = out.setdefault(p.usable_bytes, [])
                if c.report is not None and c.report.target.gpu not in names:
                    names.append(c.report.target.gpu)
    return {u: ", ".join(n) for u, n in out.items()}


def _axis_name(rows) -> str:
    kind = rows[0].search.kind if len({c.search.kind for c in rows}) == 1 else "value"
    return {"batch": "global batch", "seq": rows[0].search.arg or "sequence",
            "devices": "data-parallel devices"}.get(kind, "value")


@dataclasses.dataclass
class _Axes:
    """The search curves' plot (px) and its scales: the value tried on x (log when the search spans more
    than 64x), bytes on y."""
    x0: int
    y0: int
    w: int
    h: int
    x_min: int
    x_max: int
    y_max: int
    log: bool

    def xy(self, v, b) -> tuple[float, float]:
        span = math.log2(self.x_max / self.x_min) if self.log else 1.0
        fx = math.log2(max(v, self.x_min) / self.x_min) / span if self.log else v / self.x_max
        return self.x0 + self.w * fx, self.y0 + self.h - self.h * b / self.y_max


class _Legend:
    """The legend right of the plot, one line per entry, written into `out`."""

    def __init__(self, out: list[str], lx: float, ly: float, width: int):
        self.out, self.lx, self.ly, self.width = out, lx, ly, width

    def entry(self, text: str, color: str, *, dash: str = "", marker: str = "") -> None:
        """One legend line: a swatch (a short line and/or a marker) and its text."""
        lx, ly, out = self.lx, self.ly, self.out
        if dash != "none":
            out.append(f'<line x1="{lx}" x2="{lx + 22}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"'
                       + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        if marker:
            out.append(f'<circle cx="{lx + 11}" cy="{ly}" r="3.5" fill="{marker}" stroke="{color}"/>')
        out.append(f'<text x="{lx + 30}" y="{ly + 4}" font-size="11" fill="{color}"><title>{e(text)}</title>'
                   f'{e(_clip(text, int((self.width - 34) / 6.2)))}</text>')
        self.ly += 16


def _ticks(ax: _Axes, rows, yscale: int) -> list[str]:
    """The y axis's labels (0, half, top) and the x axis's: the largest value, each row's answer and, on a log
    scale, the powers of 4; from the right, a tick too close to the one drawn is left out."""
    out = []
    for frac in (0, 0.5, 1):
        _, ty = ax.xy(0, ax.y_max * frac)
        out.append(f'<text x="{ax.x0 - 6}" y="{ty + 4:.1f}" font-size="10" text-anchor="end" fill="#57606a">'
                   f'{ax.y_max * frac / yscale:.3g}</text>')
    ticks = {ax.x_max} | {c.search.answer for c in rows if c.search.answer}
    ticks |= {4 ** k for k in range(int(math.log(ax.x_max, 4)) + 1) if 4 ** k >= ax.x_min} if ax.log else {0}
    last_x, last_w = math.inf, 0.0
    for t in sorted(ticks, reverse=True):
        tx, _ = ax.xy(t, 0)
        tw = 6.2 * len(f"{t:,}")   # px at 10 px, with room to spare
        if last_x - tx < (tw + last_w) / 2 + 6:
            continue
        last_x, last_w = tx, tw
        out.append(f'<text x="{tx:.1f}" y="{ax.y0 + ax.h + 14}" font-size="10" text-anchor="middle" '
                   f'fill="#57606a">{e(f"{t:,}")}</text>')
    return out


def _row_curve(c, ax: _Axes, color: str, dash: str) -> list[str]:
    """A row's search: its probes joined (hollow where one does not fit), its boundary dotted."""
    probes = sorted((p for p in c.search.probes if p.peak_bytes is not None), key=lambda p: p.value)
    path = " ".join(f"{'M' if j == 0 else 'L'}{ax.xy(p.value, p.peak_bytes)[0]:.1f},"
                    f"{ax.xy(p.value, p.peak_bytes)[1]:.1f}" for j, p in enumerate(probes))
    out = [f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"'
           + (f' stroke-dasharray="{dash}"' if dash else "") + "/>"]
    for p in probes:
        px, py = ax.xy(p.value, p.peak_bytes)
        out.append(f'<circle class="probe" cx="{px:.1f}" cy="{py:.1f}" r="3.5" '
                   f'fill="{color if p.fits else "white"}" '
                   f'stroke="{color}"><title>{e(p.value)}: {e(fmt_bytes(p.peak_bytes))}'
                   f'{" fits" if p.fits else " does not fit"}</title></circle>')
    for probe, mark in ((c.search.fits_at, "fits"), (c.search.fails_at, "does not fit")):
        if probe is not None and probe.peak_bytes is not None:
            px, py = ax.xy(probe.value, probe.peak_bytes)
            out.append(f'<line class="boundary" x1="{px:.1f}" x2="{px:.1f}" y1="{ax.y0}" y2="{ax.y0 + ax.h}" '
                       f'stroke="{color}" stroke-dasharray="2 3"><title>{e(probe.value)} {mark}</title></line>')
    return out


def curves_svg(cells, width: int = 1180, height: int = 340) -> str:
    """The fit searches: peak against the value tried, one line per row (colour and dash differ), each
    usable memory named, the boundary marked; the legend right of the plot."""
    rows = searched(in_rank_order(list(cells)))
    if not rows:
        return ""
    pts = [(p.value, p.peak_bytes) for c in rows for p in c.search.probes if p.peak_bytes is not None]
    usables = _usables(rows)
    height = max(height, 24 + 16 * (len(usables) + len(rows) + 2) + 8)   # the legend's lines fit
    x_max = max((v for v, _ in pts), default=1) or 1
    x_min = min((v for v, _ in pts if v > 0), default=1)
    y_max = max([b for _, b in pts] + list(usables) + [1])
    unit, yscale = scale_unit(y_max)
    legend_w = 420
    # a search spans powers of two: linear would crowd its first probes (the PNG's rule)
    ax = _Axes(70, 24, width - 70 - legend_w - 20, height - 64, x_min, x_max, y_max, log=x_max / x_min > 64)
    x0, y0, w, h = ax.x0, ax.y0, ax.w, ax.h
    out = [(f'<svg class="curves" viewBox="0 0 {width} {height}" width="100%" role="img" '
           f'xmlns="http://www.w3.org/2000/svg"><title>fit search: per-device peak against the value tried</title>'),
           f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="#57606a"/>',
           f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="#57606a"/>',
           (f'<text x="{x0 + w / 2}" y="{height - 10}" font-size="12" text-anchor="middle">'
           f'{e(_axis_name(rows))}{" (log scale)" if ax.log else ""}</text>'),
           f'<text x="{x0}" y="{y0 - 8}" font-size="12">peak per device ({e(unit)})</text>',
           *_ticks(ax, rows, yscale)]
    legend = _Legend(out, x0 + w + 20, y0, legend_w)
    for u, gpus in usables.items():
        _, uy = ax.xy(0, u)
        out.append(f'<line class="usable" x1="{x0}" x2="{x0 + w}" y1="{uy:.1f}" y2="{uy:.1f}" stroke="{USABLE}" '
                   f'stroke-dasharray="6 4" stroke-width="1.5"><title>usable {e(fmt_bytes(u))}</title></line>')
        legend.entry(f"usable {fmt_bytes(u)} ({gpus})", USABLE, dash="6 4")
    for i, c in enumerate(rows):
        color, dash = PALETTE[i % len(PALETTE)], ("", "6 3", "8 3 2 3", "2 3")[i % 4]   # as compare_png's DASHES
        out += _row_curve(c, ax, color, dash)
        legend.entry(f"{compare_label(c.choice)}: {found(c.search)}", color, dash=dash, marker=color)
    legend.entry("hollow: a value that does not fit", "#57606a", dash="none", marker="white")
    legend.entry("dotted: a row's last fit and first failure", "#57606a", dash="2 3")
    out.append("</svg>")
    return "".join(out)


_CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2328; background: #f6f8fa;
       margin: 0; }
main { max-width: 1240px; margin: 24px auto; padding: 0 16px; }
.card { background: white; border: 1px solid #d0d7de; border-radius: 10px; padding: 16px 20px; margin: 14px 0; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 0 0 8px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid #eaeef2; padding: 4px 8px; text-align: left; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: #57606a; font-size: 12px; }
"""


def render_html(cells) -> str:
    """The whole page: the bars, the search curves when there was a search, the rows as a table (in
    the table's order: ranked rows first)."""
    cells = in_rank_order(list(cells))
    unit, rate = rates(cells)
    rows = []
    for c in cells:
        r = c.report
        cols = (f'<td class="num">{e(c.rank if c.rank is not None else "-")}</td>'
                f'<td class="num">{e(throughput.fmt_rate(rate[id(c)][0]) if id(c) in rate else "-")}</td>'
                f'<td class="num">{e(fmt_bytes(r.per_device_peak_bytes))}</td>'
                f'<td class="num">{e(fmt_bytes(r.target.usable_bytes))}</td>'
                f'<td>{"fits" if r.fits else "does not fit" if r.fits is False else "-"}</td>'
                f'<td>{e(found(c.search) if c.search else "")}</td>') if r else (
                f'<td colspan="6">{e(c.status)}: {e(c.error)}</td>')
        rows.append(f"<tr><td>{e(label(c))}</td>{cols}</tr>")
    curves = curves_svg(cells)
    name = title(cells)
    body = (f'<h1>jaxmem compare: {e(name)}</h1><p class="note">every number from a compile of that row (the bars: '
            'the per-device peak, split as jaxmem analyze splits it); a searched row at its answer</p>'
            f'<section class="card"><h2>per-device peak, step time and {e(unit)}/s per device</h2>{bars_svg(cells)}'
            '</section>'
            + (f'<section class="card"><h2>fit search</h2>{curves}</section>' if curves else "")
            + '<section class="card"><h2>rows</h2><table><thead><tr><th>row</th><th class="num">rank</th>'
            f'<th class="num">{e(unit)}/s per device</th><th class="num">peak</th>'
            '<th class="num">usable</th><th>verdict</th><th>found</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table><p class="note">{e(rank_note(unit))}</p></section>')
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="generator" content="jaxmem">'
            f'<title>jaxmem compare: {e(name)}</title><style>{_CSS}</style></head><body><main>{body}</main>'
            '</body></html>\n')


def write_html(cells, path) -> Path:
    p = Path(path)
    files.write_output(p, render_html(cells).encode("utf-8"), option="--html")   # never through a link
    return p
