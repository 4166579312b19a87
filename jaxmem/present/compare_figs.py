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
opens offline); the PNG is the same figures drawn with matplotlib (Agg), colours shared with the
single-report pages, every text inside the canvas and none over another (tests/test_compare_figs.py).
"""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path
from typing import Any

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
# the search curves: colour, marker and dash differ from row to row, so equal curves stay apart
PALETTE = ("#0969da", "#8250df", "#bf3989", "#1a7f37", "#9a6700", "#57606a", "#e16f24", "#0a3069")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h")
DASHES: tuple[Any, ...] = ("-", "--", "-.", ":")


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


def bars_svg(cells, width: int | None = None) -> str:
    """The rows' stacked bars against their usable memory, beside each its estimated step time with its
    band and its throughput per device with its rank, as one SVG. Every text is clipped to its column."""

    cells = in_rank_order(list(cells))
    char = 6.6   # px per character of the 12px sans-serif (a little over its average advance)
    labels = [ranked_label(c) for c in cells]
    pad_l = int(min(max((len(s) for s in labels), default=4) * char + 24, 440))
    plot_w, verdict_w, step_w, step_text, rate_w, rate_text = 420, 160, 120, 74, 110, 96
    width = width or pad_l + plot_w + verdict_w + step_w + step_text + rate_w + rate_text + 16
    row_h, top = 34, 52
    step_x = pad_l + plot_w + verdict_w
    rate_x = step_x + step_w + step_text
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
    x = pad_l
    for name, color, _ in PARTS:   # the legend
        out.append(f'<rect x="{x}" y="8" width="12" height="12" fill="{color}"/>'
                   f'<text x="{x + 16}" y="18" font-size="12">{e(name)}</text>')
        x += 24 + int(char * len(name))
    out.append(f'<line x1="{x + 4}" x2="{x + 4}" y1="6" y2="22" stroke="{USABLE}" stroke-width="2.5"/>'
               f'<text x="{x + 10}" y="18" font-size="12">usable memory</text>')
    if tmax > 0:
        out.append(f'<text class="step-axis" x="{step_x}" y="40" font-size="12">step time (est., band)</text>')
    if rate:
        out.append(f'<text x="{rate_x}" y="40" font-size="12">{e(unit)}/s per device</text>')
    for i, c in enumerate(cells):
        y = top + i * row_h
        out.append(f'<text x="{pad_l - 8}" y="{y + 18}" font-size="12" text-anchor="end">'
                   f'<title>{e(labels[i])}</title>{e(_clip(labels[i], int((pad_l - 16) / char)))}</text>')
        r = c.report
        if r is None:
            why = f"{c.status}: {c.error or ''}"
            out.append(f'<text x="{pad_l}" y="{y + 18}" font-size="12" fill="{ERROR}"><title>{e(why)}</title>'
                       f'{e(_clip(why, int((width - pad_l - 8) / char)))}</text>')
            continue
        left = float(pad_l)
        for name, color, v in parts(r):
            w = plot_w * v / scale
            if w > 0:
                out.append(f'<rect class="part" data-part="{name}" x="{left:.1f}" y="{y + 4}" width="{w:.1f}" '
                           f'height="{row_h - 10}" fill="{color}"><title>{e(name)} {e(fmt_bytes(v))}</title></rect>')
            left += w
        usable = r.target.usable_bytes
        if usable:
            ux = pad_l + plot_w * usable / scale
            out.append(f'<line class="usable" x1="{ux:.1f}" x2="{ux:.1f}" y1="{y}" y2="{y + row_h - 2}" '
                       f'stroke="{USABLE}" stroke-width="2.5"><title>usable {e(fmt_bytes(usable))}</title></line>')
        verdict = "" if r.fits is None else (" fits" if r.fits else " does not fit")
        out.append(f'<text x="{pad_l + plot_w + 8}" y="{y + 18}" font-size="12" '
                   f'fill="{"#1a7f37" if r.fits else "#cf222e" if r.fits is False else "#1f2328"}">'
                   f'{e(fmt_bytes(r.per_device_peak_bytes))}{verdict}</text>')
        b = step_band(r)
        if b is not None and tmax > 0:
            est, lo, hi = b
            x0, x1, xe = (step_x + step_w * v / tmax for v in (lo, hi, est))
            out.append(f'<rect class="step-band" x="{x0:.1f}" y="{y + 8}" width="{max(x1 - x0, 1):.1f}" '
                       f'height="{row_h - 18}" fill="#d0d7de"><title>step time band {e(fmt_seconds(lo))}-'
                       f'{e(fmt_seconds(hi))}</title></rect>'
                       f'<line class="step" x1="{xe:.1f}" x2="{xe:.1f}" y1="{y + 4}" y2="{y + row_h - 6}" '
                       f'stroke="{STEP}" stroke-width="2.5"><title>step time (estimate) {e(fmt_seconds(est))}'
                       f'</title></line>'
                       f'<text x="{step_x + step_w + 4}" y="{y + 18}" font-size="11">{e(fmt_seconds(est))}</text>')
        if id(c) in rate and rmax > 0:
            rv, rlo, rhi = rate[id(c)]
            color = RANKED if c.rank is not None else UNRANKED
            what = f"rank {c.rank}" if c.rank is not None else "not ranked: does not fit"
            out.append(f'<rect class="rate" x="{rate_x}" y="{y + 8}" width="{max(rate_w * rv / rmax, 1):.1f}" '
                       f'height="{row_h - 18}" fill="{color}"><title>{e(throughput.fmt_rate(rv))} {e(unit)}/s per '
                       f'device (band {e(throughput.fmt_rate(rlo))}-{e(throughput.fmt_rate(rhi))}); {what}</title>'
                       f'</rect><text x="{rate_x + rate_w + 4}" y="{y + 18}" font-size="11">'
                       f'{e(throughput.fmt_rate(rv))}</text>')
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
    x0, y0, w, h = 70, 24, width - 70 - legend_w - 20, height - 64
    log = x_max / x_min > 64   # a search spans powers of two: linear would crowd its first probes (the PNG's rule)

    def xy(v, b):
        span = math.log2(x_max / x_min) if log else 1.0
        fx = math.log2(max(v, x_min) / x_min) / span if log else v / x_max
        return x0 + w * fx, y0 + h - h * b / y_max

    out = [(f'<svg class="curves" viewBox="0 0 {width} {height}" width="100%" role="img" '
           f'xmlns="http://www.w3.org/2000/svg"><title>fit search: per-device peak against the value tried</title>'),
           f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="#57606a"/>',
           f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="#57606a"/>',
           (f'<text x="{x0 + w / 2}" y="{height - 10}" font-size="12" text-anchor="middle">'
           f'{e(_axis_name(rows))}{" (log scale)" if log else ""}</text>'),
           f'<text x="{x0}" y="{y0 - 8}" font-size="12">peak per device ({e(unit)})</text>']
    for frac in (0, 0.5, 1):
        _, ty = xy(0, y_max * frac)
        out.append(f'<text x="{x0 - 6}" y="{ty + 4:.1f}" font-size="10" text-anchor="end" fill="#57606a">'
                   f'{y_max * frac / yscale:.3g}</text>')
    ticks = {x_max} | {c.search.answer for c in rows if c.search.answer}
    ticks |= {4 ** k for k in range(int(math.log(x_max, 4)) + 1) if 4 ** k >= x_min} if log else {0}
    last_x, last_w = math.inf, 0.0
    for t in sorted(ticks, reverse=True):   # from the right: a tick too close to the one drawn is left out
        tx, _ = xy(t, 0)
        tw = 6.2 * len(f"{t:,}")   # px at 10 px, with room to spare
        if last_x - tx < (tw + last_w) / 2 + 6:
            continue
        last_x, last_w = tx, tw
        out.append(f'<text x="{tx:.1f}" y="{y0 + h + 14}" font-size="10" text-anchor="middle" '
                   f'fill="#57606a">{e(f"{t:,}")}</text>')
    lx, ly = x0 + w + 20, y0

    def entry(text: str, color: str, *, dash: str = "", marker: str = "") -> None:
        """One legend line right of the plot: a swatch (a short line and/or a marker) and its text."""
        nonlocal ly
        if dash != "none":
            out.append(f'<line x1="{lx}" x2="{lx + 22}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"'
                       + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        if marker:
            out.append(f'<circle cx="{lx + 11}" cy="{ly}" r="3.5" fill="{marker}" stroke="{color}"/>')
        out.append(f'<text x="{lx + 30}" y="{ly + 4}" font-size="11" fill="{color}"><title>{e(text)}</title>'
                   f'{e(_clip(text, int((legend_w - 34) / 6.2)))}</text>')
        ly += 16

    for u, gpus in usables.items():
        _, uy = xy(0, u)
        out.append(f'<line class="usable" x1="{x0}" x2="{x0 + w}" y1="{uy:.1f}" y2="{uy:.1f}" stroke="{USABLE}" '
                   f'stroke-dasharray="6 4" stroke-width="1.5"><title>usable {e(fmt_bytes(u))}</title></line>')
        entry(f"usable {fmt_bytes(u)} ({gpus})", USABLE, dash="6 4")
    for i, c in enumerate(rows):
        color, dash = PALETTE[i % len(PALETTE)], ("", "6 3", "8 3 2 3", "2 3")[i % 4]   # as the PNG's DASHES
        probes = sorted((p for p in c.search.probes if p.peak_bytes is not None), key=lambda p: p.value)
        path = " ".join(f"{'M' if j == 0 else 'L'}{xy(p.value, p.peak_bytes)[0]:.1f},"
                        f"{xy(p.value, p.peak_bytes)[1]:.1f}" for j, p in enumerate(probes))
        out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        for p in probes:
            px, py = xy(p.value, p.peak_bytes)
            out.append(f'<circle class="probe" cx="{px:.1f}" cy="{py:.1f}" r="3.5" '
                       f'fill="{color if p.fits else "white"}" '
                       f'stroke="{color}"><title>{e(p.value)}: {e(fmt_bytes(p.peak_bytes))}'
                       f'{" fits" if p.fits else " does not fit"}</title></circle>')
        for probe, mark in ((c.search.fits_at, "fits"), (c.search.fails_at, "does not fit")):
            if probe is not None and probe.peak_bytes is not None:
                px, py = xy(probe.value, probe.peak_bytes)
                out.append(f'<line class="boundary" x1="{px:.1f}" x2="{px:.1f}" y1="{y0}" y2="{y0 + h}" '
                           f'stroke="{color}" stroke-dasharray="2 3"><title>{e(probe.value)} {mark}</title></line>')
        entry(f"{compare_label(c.choice)}: {found(c.search)}", color, dash=dash, marker=color)
    entry("hollow: a value that does not fit", "#57606a", dash="none", marker="white")
    entry("dotted: a row's last fit and first failure", "#57606a", dash="2 3")
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


def write_png(cells, path, *, dpi: int = 110) -> Path:
    """The bars, and the search curves when there was a search, as one PNG."""

    import matplotlib  # noqa: PLC0415 - matplotlib loads only when a picture is drawn

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
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415 - loaded only to draw
    from matplotlib.figure import Figure  # noqa: PLC0415

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
    from matplotlib.lines import Line2D  # noqa: PLC0415 - matplotlib loads only when a picture is drawn
    from matplotlib.patches import Patch  # noqa: PLC0415
    from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: PLC0415

    n = len(cells)
    ax, sx, rx = sub.subplots(1, 3, width_ratios=[3.0, 1, 1.1], sharey=True)
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


def _curves(bx, rows) -> None:
    """The search curves on `bx`: one line per row (colour, marker and dash differ), the usable lines
    named, each row's boundary dotted; the legend right of the plot."""
    from matplotlib.lines import Line2D  # noqa: PLC0415 - matplotlib loads only when a picture is drawn
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

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
