"""Jupyter's rendering of a Report (``Report._repr_html_``), of compare's rows and of advise's plans.

A report shows what a cell has room for -- the header, the verdict (FITS / DOES NOT FIT, peak,
usable, headroom), the breakdown table and the memory curve as an inline SVG, warnings folded
away -- made of the ``--html`` page's own sections (jaxmem.present.html), so the two never
disagree. The page's stylesheet is reused with every rule scoped to the output's own element:
a notebook is one page, and the report must not restyle the notebook around it. No script: a
notebook's outputs may not run one, and the SVG needs none.
"""

from __future__ import annotations

import hashlib
import json
import re

from jaxmem import display
from jaxmem.plan.compare import in_rank_order, shown
from jaxmem.plan.throughput import fmt_rate
from jaxmem.present import compare_figs, html
from jaxmem.present.html import e
from jaxmem.present.render import _step_estimate
from jaxmem.report import verdict_of
from jaxmem.units import fmt_bytes, fmt_seconds

CURVE_SIZE = (860, 250)   # the curve's viewBox in a cell: lower than the page's 1000 x 340
# After the page's rules, so these win: the page's `main` (here the output's element) fits a cell.
_EXTRA_CSS = """
main { max-width: none; margin: 0; padding: 2px 12px; border-radius: 10px; }
.card { padding: 12px 16px; margin: 10px 0; }
h1 { font-size: 19px; }
.big { font-size: 28px; }
details.warnings > summary { margin: 0 0 4px; }
td.cmd { word-break: break-all; }
"""


def scoped_css(css: str, scope: str) -> str:
    """`css` with every selector under `scope` (`:root`, `body` and `main` become it)."""
    out = []
    for m in re.finditer(r"(@media[^{]*)\{|([^{}]+)\{([^{}]*)\}|\}", css):
        media, selectors, body = m.group(1), m.group(2), m.group(3)
        if media:
            out.append(media.strip() + " {")
        elif selectors is not None:
            scoped = []
            for sel in selectors.split(","):
                sel = sel.strip()
                scoped.append(scope if sel in (":root", "body", "main") else f"{scope} {sel}")
            out.append(f"{', '.join(scoped)} {{{body.strip()}}}")
        else:
            out.append("}")
    return "\n".join(out)


def _uid(payload) -> str:
    """A stable element id per content: the same report renders the same, two reports never share
    ids (a curve's clip path is looked up by id over the whole notebook)."""
    digest = hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"jaxmem-{digest}"


def _wrap(uid: str, body: str) -> str:
    css = scoped_css(html._CSS + _EXTRA_CSS, f"#{uid}")
    return f'<div id="{uid}" class="jaxmem"><style>{css}</style>{body}</div>'


def report_html(r) -> str:
    """A Report for a notebook cell: header, verdict, breakdown table, memory curve (SVG), warnings."""
    uid = _uid(r.to_json(timeline=True))
    w, h = CURVE_SIZE
    warnings = ""
    if r.warnings:
        warnings = (f'<details class="warnings"><summary>{len(r.warnings)} warning(s) and audits</summary>'
                    f'{html._warnings(r)}</details>')
    foot = ('<p class="note">report.to_json(): these numbers as <code>jaxmem analyze --json</code> prints them; '
            'jaxmem.present.html.write(report, "report.html"): the full page (largest buffers, modules).</p>')
    body = "".join((html._header(r), html._verdict(r), html._breakdown(r),
                    html._curve(r, clip_id=f"{uid}-over", hover=False, width=w, height=h), warnings, foot))
    return _wrap(uid, body)


def _verdict_cell(r) -> str:
    if r is None:
        return ""
    if r.fits is None:
        return '<span class="badge na">NO LIMIT</span>'
    if verdict_of(r) == "tight":
        return '<span class="badge warn">TIGHT</span>'
    return '<span class="badge ok">FITS</span>' if r.fits else '<span class="badge bad">DOES NOT FIT</span>'


def _step(r) -> str:
    """The estimated step time with its band, `412 ms (398-431 ms)`."""

    return _step_estimate(r)


def rows_html(cells) -> str:
    """compare's rows as one table, as the terminal lists them (the rows that fit first, by throughput
    per device): the choice, the verdict, peak, usable, headroom, step time, rate and rank."""
    cells = in_rank_order(list(cells))
    uid = _uid([c.to_json() for c in cells])
    axes = list(dict.fromkeys(k for c in cells for k in c.choice))
    unit, rate = compare_figs.rates(cells)
    head = "".join(f"<th>{e(a)}</th>" for a in axes) + (
        '<th>verdict</th><th class="num">peak</th><th class="num">usable</th><th class="num">headroom</th>'
        f'<th class="num">step (est.)</th><th class="num">{e(unit)}/s per device</th><th class="num">rank</th>'
        '<th>error</th>')
    rows = []
    for c in cells:
        r = c.report
        values = shown(c.choice)
        tds = "".join(f"<td>{e(values.get(a, '-'))}</td>" for a in axes)
        if r is None:
            tds += '<td></td>' * 7 + f'<td>{e(c.status)}: {e(c.error)}</td>'
        else:
            tds += (f'<td>{_verdict_cell(r)}</td><td class="num">{e(fmt_bytes(r.per_device_peak_bytes))}</td>'
                    f'<td class="num">{e(fmt_bytes(r.target.usable_bytes))}</td>'
                    f'<td class="num">{e(fmt_bytes(r.headroom_bytes))}</td><td class="num">{e(_step(r))}</td>'
                    f'<td class="num">{e(fmt_rate(rate[id(c)][0]) if id(c) in rate else "-")}</td>'
                    f'<td class="num">{e(c.rank if c.rank is not None else "-")}</td><td></td>')
        rows.append(f"<tr>{tds}</tr>")
    body = (f'<section class="card"><h2>{e(compare_figs.title(cells))}</h2>{compare_figs.bars_svg(cells)}'
            f'{compare_figs.curves_svg(cells)}'
            f'<table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            f'<p class="note">{e(compare_figs.rank_note(unit))}. rows.to_json(): what <code>jaxmem compare --json'
            '</code> prints; each row\'s .report is the full Report.</p></section>')
    return _wrap(uid, body)


def advice_html(a) -> str:
    """advise's plans as `jaxmem advise` lists them: the step as given, then the plans that fit on the GPUs as
    given, those that fit only with more GPUs, and the compiled plans that do not fit -- each list titled, each
    fitting plan's command as it runs (a memory fraction set in front of it, as the training's environment does)."""
    uid = _uid(a.to_json())
    ranks = a.ranks()
    head = ('<tr><th class="num">rank</th><th>plan</th><th>verdict</th><th class="num">peak</th>'
            '<th class="num">headroom</th><th class="num">per device</th><th class="num">step (est.)</th>'
            '<th class="num">vs as given</th><th>command</th></tr>')

    def row(c) -> str:
        rel, tp, rank = a.relative(c), c.throughput, ranks.get(id(c))
        return (f'<tr><td class="num">{"-" if rank is None else rank}</td><td>{e(c.label)}</td>'
                f'<td>{_verdict_cell(c.report) if c.report else e(c.status)}</td>'
                f'<td class="num">{e(fmt_bytes(c.peak))}</td><td class="num">{e(fmt_bytes(c.headroom))}</td>'
                f'<td class="num">{"-" if tp is None else e(f"{tp[0]:,.0f} {tp[1]}")}</td>'
                f'<td class="num">{e(fmt_seconds(c.step_s))}</td>'
                f'<td class="num">{"-" if rel is None else f"{rel:.2f}x"}</td>'
                f'<td class="mono cmd">{e(c.command(a.path)) if c.report else e(c.error)}</td></tr>')

    t = a.original.report.target
    gpus = f"{t.devices} GPU" + ("s" if t.devices != 1 else "")
    more = "plans that fit only with more GPUs (each names the GPUs it needs), highest throughput per device first"
    lists = (([a.original], "the step as given"),
             (a.fitting_here, f"plans that fit on the {gpus} as given, highest throughput per device first"),
             (a.fitting_more, more),
             (sorted(a.not_fitting, key=lambda c: c.peak or 0), "compiled plans that do not fit (smallest peak first)"))
    tables = "".join(f'<h3>{e(title)}</h3><table><thead>{head}</thead><tbody>{"".join(map(row, rows))}</tbody>'
                     "</table>" for rows, title in lists if rows)
    verdict = (f"{len(a.fitting)} plan(s) fit" if a.searched and (a.fitting or not a.original.fits) else
               f"fits as given; {len(a.compiled)} change(s) compiled, none fits" if a.searched else
               "fits as given (all=True searches anyway)")
    body = (f'<section class="card"><h2>{e(a.path)}: {e(verdict)}</h2>{tables}'
            f'<p class="note">{a.compiles} compile(s), {a.cached} from the cache; {e(a.progress)}. advice.to_json(): '
            'what <code>jaxmem advise --json</code> prints.</p></section>')
    return _wrap(uid, body)


display.register("report", report_html)
display.register("rows", rows_html)
display.register("advice", advice_html)
