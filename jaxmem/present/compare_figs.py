"""compare's pictures: ``compare --html FILE`` / ``--png FILE`` and the notebook's rendering of rows.

* **One stacked bar per row**: the per-device peak split into parameters, optimizer state,
  gradients, activations and temporaries, the runtime's own memory and the rest (batch, other
  state, outputs not aliased), each row's usable memory marked on its bar. Rows that failed say why.
* **The fit searches' curves** (``--find-batch``, ``--find-seq``, ``--find-devices``): each row's
  compiled peak against the value tried, the usable line, the boundary (the last value that fits
  and the first that does not) marked.

The HTML is one self-contained file (inline CSS and SVG, no script, opens offline); the PNG is the
same two figures drawn with matplotlib (Agg), colours shared with the single-report pages.
"""

from __future__ import annotations

import io
from pathlib import Path

from jaxmem import files
from jaxmem.compiler.steptime import band
from jaxmem.present.html import COLORS, e
from jaxmem.units import fmt_bytes, fmt_seconds

# the parts of a bar, in order: (label, colour, breakdown keys); "other" takes every key not named
PARTS = (("params", COLORS["params"], ("params",)),
         ("optimizer", COLORS["optimizer_state"], ("optimizer_state",)),
         ("gradients", COLORS["gradients"], ("gradients",)),
         ("activations", COLORS["activations_and_temporaries"], ("activations_and_temporaries",)),
         ("runtime", COLORS["runtime_overhead"], ("runtime_overhead",)),
         ("other", "#8c959f", ()))
_NAMED = {k for _, _, keys in PARTS for k in keys}


def label(cell) -> str:
    return " ".join(f"{k}={v}" for k, v in cell.choice.items()) or "row"


def parts(report) -> list[tuple[str, str, int]]:
    """(label, colour, bytes) of each part of a row's peak; they sum to the peak."""
    b = report.breakdown
    out = [(name, color, sum(b.get(k, 0) for k in keys)) for name, color, keys in PARTS[:-1]]
    out.append((PARTS[-1][0], PARTS[-1][1], sum(v for k, v in b.items() if k not in _NAMED)))
    return out


def _scale(cells) -> int:
    tops = [max(c.report.per_device_peak_bytes, c.report.target.usable_bytes or 0)
            for c in cells if c.report is not None]
    return max(tops, default=1) or 1


def step_band(report) -> tuple[float, float, float] | None:
    """(estimate, low, high) seconds of a row's estimated step time, or None."""

    return band(report.step_time if report is not None else None)


def _step_scale(cells) -> float:
    return max((b[2] for c in cells if (b := step_band(c.report)) is not None), default=0.0)


def bars_svg(cells, width: int = 1160) -> str:
    """The rows' stacked bars against their usable memory, and beside each its estimated step time with
    its band (the rows are chosen by time), as one SVG."""

    cells = list(cells)
    row_h, pad_l, pad_r, top = 34, 300, 330, 34
    step_x, step_w = width - 170, 120   # the step-time strip, right of the verdicts
    tmax = _step_scale(cells)
    height = top + row_h * len(cells) + 30
    plot_w = width - pad_l - pad_r
    scale = _scale(cells)
    out = [(f'<svg class="bars" viewBox="0 0 {width} {height}" width="100%" role="img" '
           f'xmlns="http://www.w3.org/2000/svg"><title>per-device peak by part, each row against its usable memory'
           f'</title>')]
    x = pad_l
    for name, color, _ in PARTS:   # the legend
        out.append(f'<rect x="{x}" y="8" width="12" height="12" fill="{color}"/>'
                   f'<text x="{x + 16}" y="18" font-size="12">{e(name)}</text>')
        x += 22 + 8 * len(name)
    for i, c in enumerate(cells):
        y = top + i * row_h
        out.append(f'<text x="{pad_l - 8}" y="{y + 18}" font-size="12" text-anchor="end">{e(label(c))}</text>')
        r = c.report
        if r is None:
            out.append(f'<text x="{pad_l}" y="{y + 18}" font-size="12" fill="#cf222e">{e(c.status)}: '
                       f'{e((c.error or "")[:110])}</text>')
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
                       f'stroke="#cf222e" stroke-width="2.5"><title>usable {e(fmt_bytes(usable))}</title></line>')
        b = step_band(r)
        if b is not None and tmax > 0:
            est, lo, hi = b
            x0, x1, xe = (step_x + step_w * v / tmax for v in (lo, hi, est))
            out.append(f'<rect class="step-band" x="{x0:.1f}" y="{y + 8}" width="{max(x1 - x0, 1):.1f}" '
                       f'height="{row_h - 18}" fill="#d0d7de"><title>step time band {e(fmt_seconds(lo))}-'
                       f'{e(fmt_seconds(hi))}</title></rect>'
                       f'<line class="step" x1="{xe:.1f}" x2="{xe:.1f}" y1="{y + 4}" y2="{y + row_h - 6}" '
                       f'stroke="#0969da" stroke-width="2.5"><title>step time (estimate) {e(fmt_seconds(est))}'
                       f'</title></line>'
                       f'<text x="{step_x + step_w + 4}" y="{y + 18}" font-size="11">{e(fmt_seconds(est))}</text>')
        verdict = "" if r.fits is None else (" fits" if r.fits else " does not fit")
        out.append(f'<text x="{pad_l + plot_w + 8}" y="{y + 18}" font-size="12" '
                   f'fill="{"#1a7f37" if r.fits else "#cf222e" if r.fits is False else "#1f2328"}">'
                   f'{e(fmt_bytes(r.per_device_peak_bytes))}{verdict}</text>')
    if tmax > 0:
        out.append(f'<text x="{step_x}" y="18" font-size="12">step time (estimate, band)</text>')
    out.append(f'<text x="{pad_l}" y="{height - 8}" font-size="11" fill="#57606a">per-device bytes at the peak; '
               f'the red line on each bar: the memory JAX may use on that row\'s card; right: the estimated step '
               f'time (blue) and its band (grey), one scale for all rows</text></svg>')
    return "".join(out)


def searched(cells) -> list:
    return [c for c in cells if c.search is not None and c.search.probes]


def curves_svg(cells, width: int = 980, height: int = 320) -> str:
    """The fit searches: peak against the value tried, one line per row, the boundary marked."""
    rows = searched(cells)
    if not rows:
        return ""
    pts = [(p.value, p.peak_bytes) for c in rows for p in c.search.probes if p.peak_bytes is not None]
    usables = [p.usable_bytes for c in rows for p in c.search.probes if p.usable_bytes]
    x_max = max((v for v, _ in pts), default=1) or 1
    y_max = max([b for _, b in pts] + usables + [1])
    x0, y0, w, h = 70, 20, width - 230, height - 60

    def xy(v, b):
        return x0 + w * v / x_max, y0 + h - h * b / y_max

    palette = ("#0969da", "#8250df", "#bf3989", "#1a7f37", "#9a6700", "#cf222e", "#57606a")
    kind = rows[0].search.kind if len({c.search.kind for c in rows}) == 1 else "value"
    name = {"batch": "global batch", "seq": rows[0].search.arg or "sequence", "devices": "data-parallel devices"}
    out = [(f'<svg class="curves" viewBox="0 0 {width} {height}" width="100%" role="img" '
           f'xmlns="http://www.w3.org/2000/svg"><title>fit search: per-device peak against the value tried</title>'),
           f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="#57606a"/>',
           f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="#57606a"/>',
           (f'<text x="{x0 + w / 2}" y="{height - 12}" font-size="12" text-anchor="middle">'
           f'{e(name.get(kind, "value"))}</text>'),
           f'<text x="{x0}" y="{y0 - 6}" font-size="12">peak per device (max {e(fmt_bytes(y_max))})</text>']
    ticks = {0, x_max} | {c.search.answer for c in rows if c.search.answer}
    for t in sorted(ticks):
        tx, _ = xy(t, 0)
        out.append(f'<text x="{tx:.1f}" y="{y0 + h + 14}" font-size="10" text-anchor="middle" '
                   f'fill="#57606a">{e(t)}</text>')
    if usables and len(set(usables)) == 1:
        _, uy = xy(0, usables[0])
        out.append(f'<line class="usable" x1="{x0}" x2="{x0 + w}" y1="{uy:.1f}" y2="{uy:.1f}" stroke="#cf222e" '
                   f'stroke-dasharray="6 4" stroke-width="1.5"/><text x="{x0 + w + 6}" y="{uy + 4:.1f}" '
                   f'font-size="11" fill="#cf222e">usable {e(fmt_bytes(usables[0]))}</text>')
    for i, c in enumerate(rows):
        color = palette[i % len(palette)]
        probes = sorted((p for p in c.search.probes if p.peak_bytes is not None), key=lambda p: p.value)
        path = " ".join(f"{'M' if j == 0 else 'L'}{xy(p.value, p.peak_bytes)[0]:.1f},"
                        f"{xy(p.value, p.peak_bytes)[1]:.1f}" for j, p in enumerate(probes))
        out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for p in probes:
            px, py = xy(p.value, p.peak_bytes)
            out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="{color if p.fits else "white"}" '
                       f'stroke="{color}"><title>{e(p.value)}: {e(fmt_bytes(p.peak_bytes))}'
                       f'{" fits" if p.fits else " does not fit"}</title></circle>')
        for probe, mark in ((c.search.fits_at, "fits"), (c.search.fails_at, "does not fit")):
            if probe is not None and probe.peak_bytes is not None:
                px, py = xy(probe.value, probe.peak_bytes)
                out.append(f'<line class="boundary" x1="{px:.1f}" x2="{px:.1f}" y1="{y0}" y2="{y0 + h}" '
                           f'stroke="{color}" stroke-dasharray="2 3"><title>{e(probe.value)} {mark}</title></line>')
        answer = c.search.answer
        out.append(f'<text x="{x0 + w + 6}" y="{y0 + h - 8 - 16 * (len(rows) - 1 - i)}" font-size="11" fill="{color}">'
                   f'{e(label(c))}: {e(answer)}{"+" if c.search.capped else ""}</text>')
    out.append("</svg>")
    return "".join(out)


_CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2328; background: #f6f8fa;
       margin: 0; }
main { max-width: 1040px; margin: 24px auto; padding: 0 16px; }
.card { background: white; border: 1px solid #d0d7de; border-radius: 10px; padding: 16px 20px; margin: 14px 0; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 0 0 8px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid #eaeef2; padding: 4px 8px; text-align: left; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: #57606a; font-size: 12px; }
"""


def render_html(cells) -> str:
    """The whole page: the bars, the search curves when there was a search, the rows as a table."""
    cells = list(cells)
    model = next((c.report.model for c in cells if c.report is not None), "compare")
    target = next((c.report.target for c in cells if c.report is not None), None)
    where = f" on {target.devices} x {target.description}" if target is not None else ""
    rows = []
    for c in cells:
        r = c.report
        cols = (f'<td class="num">{e(fmt_bytes(r.per_device_peak_bytes))}</td>'
                f'<td class="num">{e(fmt_bytes(r.target.usable_bytes))}</td>'
                f'<td>{"fits" if r.fits else "does not fit" if r.fits is False else "-"}</td>'
                f'<td class="num">{e(c.search.answer if c.search else "")}</td>') if r else (
                f'<td colspan="4">{e(c.status)}: {e(c.error)}</td>')
        rows.append(f"<tr><td>{e(label(c))}</td>{cols}</tr>")
    curves = curves_svg(cells)
    body = (f'<h1>jaxmem compare: {e(model)}{e(where)}</h1><p class="note">{len(cells)} row(s); every number '
            'from a compile of that row (the bars: the per-device peak, split as jaxmem analyze splits it)</p>'
            f'<section class="card"><h2>per-device peak by part</h2>{bars_svg(cells)}</section>'
            + (f'<section class="card"><h2>fit search</h2>{curves}</section>' if curves else "")
            + '<section class="card"><h2>rows</h2><table><thead><tr><th>row</th><th class="num">peak</th>'
            '<th class="num">usable</th><th>verdict</th><th class="num">found</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></section>')
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="generator" content="jaxmem">'
            f'<title>jaxmem compare: {e(model)}</title><style>{_CSS}</style></head><body><main>{body}</main>'
            '</body></html>\n')


def write_html(cells, path) -> Path:
    p = Path(path)
    files.write_output(p, render_html(cells).encode("utf-8"), option="--html")   # never through a link
    return p


def write_png(cells, path, *, dpi: int = 110) -> Path:
    """The bars, and the search curves when there was a search, as one PNG."""

    import matplotlib  # noqa: PLC0415 - matplotlib loads only when a picture is drawn
    from matplotlib.figure import Figure  # noqa: PLC0415 - matplotlib loads only when a picture is drawn

    cells = list(cells)
    rows = searched(cells)
    with matplotlib.rc_context({"text.parse_math": False}):   # labels are the user's text: a `$` stays a `$`
        fig = Figure(figsize=(13, 1.2 + 0.45 * len(cells) + (3.6 if rows else 0)), dpi=dpi, layout="constrained")
        mosaic = [["bars", "step"], ["curves", "curves"]] if rows else [["bars", "step"]]
        named = fig.subplot_mosaic(mosaic, width_ratios=[3.2, 1],  # type: ignore[arg-type]
                                   height_ratios=[0.45 * len(cells) + 0.6, 3.4] if rows else None)
        axes = [named["bars"], named["curves"]] if rows else [named["bars"]]
        ax = axes[0]
        sx = named["step"]
        tmax = _step_scale(cells)
        for i, c in enumerate(cells):
            b = step_band(c.report)
            if b is None:
                continue
            est, lo, hi = b
            sx.barh([i], [hi - lo], left=lo, color="#d0d7de", height=0.5)
            sx.plot([est, est], [i - 0.35, i + 0.35], color="#0969da", linewidth=2.2)
        sx.set_ylim(len(cells) - 0.5, -0.5)
        sx.set_yticks([])
        sx.set_xlim(0, tmax * 1.05 if tmax else 1)
        sx.set_xlabel("step time, estimate (s): blue; band: grey")
        scale = _scale(cells) / 2**30
        labelled: set[str] = set()
        for i, c in enumerate(cells):
            if c.report is None:
                ax.text(0, i, f"  {c.status}: {(c.error or '')[:90]}", va="center", color="#cf222e", fontsize=8.5)
                continue
            left = 0.0
            for _j, (name, color, v) in enumerate(parts(c.report)):
                ax.barh([i], [v / 2**30], left=left, color=color, edgecolor="white", linewidth=0.5,
                        label=None if name in labelled else name)
                labelled.add(name)
                left += v / 2**30
            if c.report.target.usable_bytes:
                u = c.report.target.usable_bytes / 2**30
                ax.plot([u, u], [i - 0.42, i + 0.42], color="#cf222e", linewidth=2.2)
        ax.set_yticks(range(len(cells)), [label(c) for c in cells], fontsize=8.5)
        ax.invert_yaxis()
        ax.set_xlim(0, scale * 1.02)
        ax.set_xlabel("per-device peak (GiB); red: usable memory of the row's card")
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, ncols=len(PARTS), frameon=False)
        if rows:
            bx = axes[1]
            for c in rows:
                probes = sorted((p for p in c.search.probes if p.peak_bytes is not None), key=lambda p: p.value)
                line, = bx.plot([p.value for p in probes], [p.peak_bytes / 2**30 for p in probes], marker="o",
                                label=f"{label(c)}: {c.search.answer}{'+' if c.search.capped else ''}")
                for probe in (c.search.fits_at, c.search.fails_at):
                    if probe is not None and probe.peak_bytes is not None:
                        bx.axvline(probe.value, color=line.get_color(), linestyle=":", linewidth=1)
            usables = {p.usable_bytes for c in rows for p in c.search.probes if p.usable_bytes}
            for u in usables:
                bx.axhline(u / 2**30, color="#cf222e", linestyle="--", linewidth=1.2)
            bx.set_xlabel({"batch": "global batch", "devices": "data-parallel devices"}.get(
                rows[0].search.kind, rows[0].search.arg or "value"))
            bx.set_ylabel("peak per device (GiB)")
            bx.legend(fontsize=8)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
    p = Path(path)
    files.write_output(p, buf.getvalue(), option="--png")
    return p
