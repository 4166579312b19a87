"""A self-contained HTML report (and a static PNG) of a Report.

``write(report, path)`` writes one HTML file with everything inline: CSS, the
memory curve as an SVG (jaxmem.present.curve), and a few lines of JavaScript for hover
read-outs on the curve. No network resource is referenced, so the file opens
offline in any browser and can be mailed or attached to an issue as it is.
(The static PNG of the same curve: jaxmem.present.png.)

Like every renderer, these read only the frozen ``Report``. Every string that
comes from it (module paths, op names, messages) is HTML-escaped.
"""

from __future__ import annotations

import html as _html
import json
from collections.abc import Iterable
from pathlib import Path
from typing import cast

from jaxmem import __version__, files
from jaxmem.present import levers
from jaxmem.present.curve import curve_svg, peak_index
from jaxmem.present.render import hints
from jaxmem.report import BREAKDOWN_HELP, VERDICT_TEXT, Report, breakdown_in_order, tight_text, verdict_of
from jaxmem.units import fmt_bytes

# Tables are bounded so the file stays small whatever the model.
MAX_BUFFER_ROWS = 100
MAX_MODULE_ROWS = 60
MAX_WARNINGS = 100

# One colour per breakdown part; the categories of what is live at the peak reuse them.
COLORS = {
    "params": "#4c78a8",
    "optimizer_state": "#72b7b2",
    "gradients": "#54a24b",
    "batch": "#eeca3b",
    "other_state": "#b279a2",
    "activations_and_temporaries": "#f58518",
    "outputs_not_aliased": "#e45756",
    "constants": "#8c6d31",
    "generated_code": "#9d755d",
    "runtime_overhead": "#bab0ac",
    # categories of buffers live at the peak (explain.py)
    "activations": "#f58518",
    "param_copies": "#9ecae9",
    "temporaries": "#ffbf79",
    "collectives": "#ff9da6",
    "outputs": "#e45756",
}
_FALLBACK = ("#8cd17d", "#d4a6c8", "#79706e", "#b6992d", "#499894", "#86bcb6", "#d37295", "#fabfd2")

CATEGORY_HELP = {
    "params": "parameter shards (entry arguments)",
    "optimizer_state": "optimizer state shards (entry arguments)",
    "gradients": "gradients being accumulated / applied",
    "batch": "the input batch shard",
    "other_state": "mutable collections, RNG keys",
    "activations": "forward values saved for the backward pass",
    "param_copies": "bf16 compute copies of fp32 parameters (mixed precision)",
    "temporaries": "fusion outputs, workspaces, intermediates",
    "collectives": "all-gather / reduce-scatter / all-reduce buffers",
    "outputs": "step outputs not aliased to a donated input",
}


def e(x) -> str:
    """HTML-escape anything from the report (quotes too: values land in attributes)."""
    return _html.escape("" if x is None else str(x), quote=True)


def _color(key: str, i: int = 0) -> str:
    return COLORS.get(key) or _FALLBACK[i % len(_FALLBACK)]


def _pct(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


_SCRIPT = """
(function () {
  var data = JSON.parse(document.getElementById('timeline-data').textContent);
  var g = data.geom, tl = data.timeline, n = tl.length;
  var svg = document.getElementById('curve'), hov = document.getElementById('hover');
  var line = document.getElementById('hover-line'), dot = document.getElementById('hover-dot');
  var tip = document.getElementById('tip');
  if (!svg || !n) return;
  function fmt(b) {
    var u = [['GiB', 1073741824], ['MiB', 1048576], ['KiB', 1024]];
    for (var i = 0; i < u.length; i++) if (b >= u[i][1]) return (b / u[i][1]).toFixed(2) + ' ' + u[i][0];
    return b + ' B';
  }
  svg.addEventListener('mousemove', function (ev) {
    var pt = svg.createSVGPoint(); pt.x = ev.clientX; pt.y = ev.clientY;
    var p = pt.matrixTransform(svg.getScreenCTM().inverse());
    var i = n > 1 ? Math.round((p.x - g.ml) / g.pw * (n - 1)) : 0;
    if (i < 0 || i >= n) { hov.setAttribute('visibility', 'hidden'); tip.style.display = 'none'; return; }
    var x = g.ml + (n > 1 ? g.pw * i / (n - 1) : g.pw / 2), y = g.mt + g.ph - g.ph * tl[i] / g.ymax;
    line.setAttribute('x1', x); line.setAttribute('x2', x); dot.setAttribute('cx', x); dot.setAttribute('cy', y);
    hov.setAttribute('visibility', 'visible');
    tip.textContent = fmt(tl[i]) + ' live at ' + (100 * i / Math.max(n - 1, 1)).toFixed(1) + '% of the program'
      + (i === data.peak ? ' (the peak)' : '');
    var box = svg.getBoundingClientRect(), wrap = tip.parentNode.getBoundingClientRect();
    var sx = box.width / g.w;
    tip.style.left = Math.min(box.left - wrap.left + x * sx + 12, wrap.width - 260) + 'px';
    tip.style.top = (box.top - wrap.top + y * (box.height / g.h) - 34) + 'px';
    tip.style.display = 'block';
  });
  svg.addEventListener('mouseleave', function () {
    hov.setAttribute('visibility', 'hidden'); tip.style.display = 'none';
  });
})();
"""

_CSS = """
:root { --fg:#1f2328; --muted:#656d76; --line:#d8dee4; --bg:#f6f8fa; --card:#fff; --accent:#4c78a8;
  --ok:#1a7f37; --bad:#cf222e; --warn:#9a6700; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font: 14px/1.5 -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, "Helvetica Neue", "Liberation Sans",
  "DejaVu Sans", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 24px 40px; }
code, .mono, td.mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono",
  "DejaVu Sans Mono", monospace; font-size: 12.5px; }
h1 { font-size: 24px; margin: 0 0 2px; font-weight: 650; }
h1 .brand { color: var(--muted); font-weight: 500; }
h2 { font-size: 17px; margin: 0 0 4px; font-weight: 620; }
.sub { color: var(--muted); margin: 0 0 12px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 18px 20px;
  margin: 16px 0; }
.choices { margin: 10px 0 0; }
.choices .source { color: var(--muted); }
.choices .source.default { color: #b45309; font-weight: 600; }
.choices-why { margin: 4px 0 0; padding-left: 18px; color: var(--muted); font-size: 13px; }
.chips { display:flex; flex-wrap:wrap; gap:6px; margin-top:10px; }
.chip { border:1px solid var(--line); border-radius: 999px; padding: 1px 10px; font-size: 12.5px; background:#fff; }
.chip b { font-weight: 600; }
.verdict { display:grid; grid-template-columns: auto 1fr; gap: 8px 28px; align-items:center; }
.big { font-size: 34px; font-weight: 700; letter-spacing: -0.5px; line-height: 1.1; }
.big small { display:block; font-size: 12.5px; font-weight: 500; color: var(--muted); letter-spacing: 0; }
.badge { display:inline-block; padding: 3px 12px; border-radius: 6px; font-weight: 700; font-size: 15px;
  color:#fff; letter-spacing: .3px; }
.badge.ok { background: var(--ok); } .badge.bad { background: var(--bad); } .badge.na { background:#6e7781; }
.badge.warn { background:#9a6700; }
.facts { margin: 6px 0 0; color: var(--fg); }
.facts span { white-space: nowrap; margin-right: 18px; }
.facts .neg { color: var(--bad); font-weight: 600; } .facts .pos { color: var(--ok); font-weight: 600; }
.gauge { position:relative; height: 14px; border-radius: 7px; background: #eaeef2; margin-top: 10px;
  overflow: visible; }
.gauge .fill { position:absolute; left:0; top:0; bottom:0; border-radius: 7px; }
.gauge .mark { position:absolute; top:-5px; bottom:-5px; width:2px; background: var(--fg); }
.gauge-l { display:flex; justify-content:space-between; color: var(--muted); font-size: 12px; margin-top: 4px; }
.hints { margin: 10px 0 0; padding-left: 18px; color: var(--fg); }
.hints li { margin: 2px 0; }
.note { color: var(--muted); font-size: 12.5px; }
.stack { display:flex; height: 30px; border-radius: 6px; overflow:hidden; margin: 10px 0 4px; background:#eaeef2; }
.stack div { height:100%; color:#fff; font-size: 12px; font-weight: 600; white-space: nowrap; overflow:hidden;
  text-overflow: ellipsis; padding: 0 4px 0 6px; line-height: 30px; text-shadow: 0 0 2px rgba(0,0,0,.45);
  min-width: 0; }
.stack div.thin { padding: 0; }
table { border-collapse: collapse; width: 100%; margin-top: 8px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #eaeef2; vertical-align: top; }
th { font-size: 12px; color: var(--muted); font-weight: 600; text-transform: uppercase; letter-spacing: .4px;
  border-bottom: 1px solid var(--line); }
td.num, th.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
tfoot td { font-weight: 700; border-top: 1px solid var(--line); border-bottom: 0; }
td.help { color: var(--muted); }
.sw { display:inline-block; width: 11px; height: 11px; border-radius: 3px; margin-right: 7px; vertical-align: -1px; }
.minibar { height: 8px; border-radius: 4px; background: var(--accent); }
td.barcell { width: 18%; padding-top: 10px; }
.path { word-break: break-all; }
.cat { display:inline-block; padding: 0 7px; border-radius: 4px; font-size: 12px; white-space: nowrap; }
.plot { position: relative; }
#curve { width: 100%; height: auto; display:block; }
#curve .grid { stroke: #eaeef2; stroke-width: 1; }
#curve .axisline { stroke: #8c959f; stroke-width: 1; }
#curve .xtick { stroke: #8c959f; }
#curve text { font-size: 12px; fill: #57606a; font-family: inherit; }
#curve .axis { fill: #656d76; }
#curve .area { fill: #4c78a8; fill-opacity: .18; }
#curve .area.over { fill: #cf222e; fill-opacity: .28; }
#curve .line { fill: none; stroke: #4c78a8; stroke-width: 1.6; stroke-linejoin: round; }
#curve .budget { stroke: #cf222e; stroke-width: 1.4; stroke-dasharray: 6 4; }
#curve .budgetlab { fill: #cf222e; font-weight: 600; paint-order: stroke; stroke: #fff; stroke-width: 3px; }
#curve .peakline { stroke: #1f2328; stroke-width: 1; stroke-dasharray: 3 3; }
#curve .peakdot { fill: #cf222e; stroke: #fff; stroke-width: 2; }
#curve .peaklab { font-size: 14px; font-weight: 700; fill: #1f2328; paint-order: stroke; stroke: #fff;
  stroke-width: 4px; stroke-linejoin: round; }
#curve .hoverline { stroke: #57606a; stroke-width: 1; }
#curve .hoverdot { fill: #4c78a8; stroke: #fff; stroke-width: 1.5; }
#tip { position:absolute; display:none; pointer-events:none; background: #1f2328; color:#fff; font-size: 12.5px;
  padding: 4px 9px; border-radius: 5px; white-space: nowrap; }
.legend { display:flex; flex-wrap:wrap; gap: 4px 18px; margin-top: 6px; font-size: 13px; }
.warn { border-left: 4px solid #d4a72c; background: #fff8c5; padding: 8px 12px; border-radius: 6px; margin: 8px 0; }
.warn .kind { font-weight: 700; margin-right: 6px; }
.warn .cost { font-weight: 600; color: var(--bad); white-space: nowrap; }
.ok-line { color: var(--ok); }
details summary { cursor: pointer; color: var(--muted); margin-top: 6px; }
.grid2 { display:grid; grid-template-columns: 1fr 1fr; gap: 0 28px; }
@media (max-width: 820px) { .grid2 { grid-template-columns: 1fr; } .verdict { grid-template-columns: 1fr; } }
footer { color: var(--muted); font-size: 12.5px; margin-top: 18px; }
footer p { margin: 4px 0; }
.more { color: var(--muted); font-style: italic; }
"""


# ----------------------------------------------------------------------------------------------- sections

def _header(r: Report) -> str:
    t = r.target
    where = f"{t.devices} × {t.description} ({t.gpu}{', deviceless compile' if t.deviceless else ''})"
    if t.hosts > 1:
        where += f", {t.hosts} hosts"
    mesh = ",".join(f"{n}={s}" for n, s in r.mesh) or "-"
    chips = [("mesh", mesh), ("layout", r.layout)]
    chips += [(str(k), "-" if v is None else v) for k, v in r.options.items()]  # type: ignore[misc]  # any option value
    n = r.param_count
    chips.append(("params", f"{n / 1e6:,.1f} M" if n < 1e9 else f"{n / 1e9:,.2f} B"))
    chip_html = "".join(f'<span class="chip">{e(k)} <b>{e(v)}</b></span>' for k, v in chips)
    return (f'<header><h1><span class="brand">jaxmem ·</span> {e(r.model)}</h1>'
            f'<p class="sub">{e(r.source)} — per-device memory of one training step on {e(where)}</p>'
            f'<div class="chips">{chip_html}</div>{_choices(r)}</header>')


def _choices(r: Report) -> str:
    """Every choice that decides the answer (levers.choices_line), and why where it says more than its flag."""
    if levers.choices_line(r) is None:
        return ""
    # each choice with its source; a default that changes the answer stands out (the user did not choose it)
    stated = ", ".join(e(text) + (f' <span class="source{" default" if loud else ""}">({e(source)})</span>'
                                  if source else "") for text, source, loud in levers.choice_parts(r))
    notes = "".join(f"<li>{e(n)}</li>" for n in levers.choice_notes(r))
    return (f'<p class="choices" id="choices">choices: {stated}</p>'
            + (f'<ul class="choices-why">{notes}</ul>' if notes else ""))



def _verdict(r: Report) -> str:
    t = r.target
    peak = r.per_device_peak_bytes
    big = f'<div class="big">{e(fmt_bytes(peak))}<small>per-device peak ({peak:,} bytes)</small></div>'
    if t.usable_bytes is None or r.fits is None:
        badge = '<span class="badge na">NO FIXED LIMIT</span>'
        facts = f'<p class="facts">{e(t.usable_note)}</p>'
        gauge = ""
    else:
        badge = ('<span id="verdict" class="badge bad">DOES NOT FIT</span>' if not r.fits else
                 '<span id="verdict" class="badge ok">FITS</span>' if verdict_of(r) != "tight" else
                 f'<span id="verdict" class="badge warn" title="hangs on {e(tight_text(r))}">TIGHT</span>')
        head = r.headroom_bytes or 0
        facts = (f'<p class="facts"><span>usable <b>{e(fmt_bytes(t.usable_bytes))}</b> of '
                 f'{e(fmt_bytes(t.memory_bytes))}</span>'
                 f'<span>headroom <b class="{"pos" if head >= 0 else "neg"}">{e(fmt_bytes(head))}</b></span></p>'
                 f'<p class="note">allocator: {e(t.usable_note)}</p>')
        card = t.memory_bytes or t.usable_bytes
        scale = max(card, peak, 1)
        color = "var(--ok)" if r.fits else "var(--bad)"
        gauge = (f'<div class="gauge" title="peak {e(fmt_bytes(peak))} against the card\'s {e(fmt_bytes(card))}">'
                 f'<div class="fill" style="width:{_pct(min(peak, scale), scale):.2f}%;background:{color}"></div>'
                 f'<div class="mark" style="left:{_pct(t.usable_bytes, scale):.2f}%" title="usable '
                 f'{e(fmt_bytes(t.usable_bytes))}"></div>'
                 f'<div class="mark" style="left:calc({_pct(card, scale):.2f}% - 2px);background:#8c959f" title="card '
                 f'{e(fmt_bytes(card))}"></div></div>'
                 f'<div class="gauge-l"><span>0</span><span>▲ usable {e(fmt_bytes(t.usable_bytes))} · card '
                 f'{e(fmt_bytes(card))}{" · peak " + e(fmt_bytes(peak)) if peak > card else ""}</span></div>')
    hint_html = ""
    if r.fits is False:
        hs = hints(r)
        if hs:
            hint_html = '<ul class="hints">' + "".join(f"<li>{e(h)}</li>" for h in hs) + "</ul>"
    return (f'<section class="card verdict">{big}<div>{badge}{facts}{gauge}</div>'
            f'<div style="grid-column:1/-1">{hint_html}</div></section>')


def _minibar(value: int, whole: int, color: str | None = None) -> str:
    if value <= 0:
        return ""
    bg = f";background:{color}" if color else ""
    return f'<div class="minibar" style="width:max(2px, {_pct(value, whole):.2f}%){bg}"></div>'


def _stack(items: Iterable[tuple[str, int]], total: int, label_min_pct: float = 7.0) -> str:
    parts = []
    for i, (key, value) in enumerate(items):
        if value <= 0:
            continue
        pct = _pct(value, total)
        label = e(key) if pct >= label_min_pct else ""
        thin = "" if label else ' class="thin"'  # no padding: a 0.1% part must stay 0.1% wide
        parts.append(f'<div{thin} style="flex:0 0 {pct:.4f}%;background:{_color(key, i)}" '
                     f'title="{e(key)}: {e(fmt_bytes(value))} ({pct:.1f}%)">{label}</div>')
    return f'<div class="stack">{"".join(parts)}</div>'


def _breakdown(r: Report) -> str:
    peak = max(r.per_device_peak_bytes, 1)
    keys = [k for k, _ in breakdown_in_order(r.breakdown)]
    rows = []
    for i, k in enumerate(keys):
        v = r.breakdown[k]
        rows.append(f'<tr><td><span class="sw" style="background:{_color(k, i)}"></span>{e(k)}</td>'
                    f'<td class="num">{e(fmt_bytes(v))}</td><td class="num">{_pct(v, peak):.1f}%</td>'
                    f'<td class="barcell">{_minibar(v, peak, _color(k, i))}</td>'
                    f'<td class="help">{e(BREAKDOWN_HELP.get(k, ""))}</td></tr>')
    ordered = sorted(((k, r.breakdown[k]) for k in keys), key=lambda kv: keys.index(kv[0]))
    return (f'<section class="card" id="breakdown"><h2>Where the peak goes</h2>'
            f'<p class="sub">The parts sum to the per-device peak; bytes per device.</p>'
            f'{_stack(ordered, peak)}'
            f'<table id="breakdown-table"><thead><tr><th>part</th><th class="num">bytes</th><th class="num">share</th>'
            f'<th></th><th>what it is</th></tr></thead><tbody>{"".join(rows)}</tbody>'
            f'<tfoot><tr><td>per-device peak</td><td class="num">{e(fmt_bytes(r.per_device_peak_bytes))}</td>'
            f'<td class="num">100%</td><td></td><td class="help">{r.per_device_peak_bytes:,} bytes</td></tr>'
            f'</tfoot></table></section>')


def _curve(r: Report, *, clip_id: str = "over", hover: bool = True, width: int = 1000, height: int = 340) -> str:
    """The curve's section; hover=False: no script (a notebook's output), the svg alone."""
    if not r.timeline:
        return ('<section class="card" id="timeline"><h2>Memory over the step</h2>'
                '<p class="note">No curve: the buffer assignment was not decoded (run without --no-explain).</p>'
                '</section>')
    svg, geom = curve_svg(r, width, height, clip_id=clip_id, hover=hover)
    top = max(r.timeline)
    data = {"timeline": [int(v) for v in r.timeline], "peak": peak_index(r), "geom": geom}
    ovh = r.breakdown.get("runtime_overhead", 0)
    extra = r.per_device_peak_bytes - top - ovh
    sub = (f"Bytes in XLA's buffers over the program, in execution order. The curve's peak is {fmt_bytes(top)}; "
           f"the per-device peak adds the runtime overhead ({fmt_bytes(ovh)})"
           + (f" and {fmt_bytes(extra)} XLA counts outside the curve (generated code, lower-bound slack)."
              if extra > 0 else "."))
    head = f'<section class="card" id="timeline"><h2>Memory over the step</h2><p class="sub">{e(sub)}</p>'
    if not hover:
        return f'{head}<div class="plot">{svg}</div></section>'
    return (f'{head}<div class="plot">{svg}<div id="tip"></div></div>'
            f'<script type="application/json" id="timeline-data">{json.dumps(data, separators=(",", ":"))}</script>'
            f'<script>{_SCRIPT}</script></section>')


def _categories(r: Report) -> str:
    cats = sorted(((k, v) for k, v in r.peak_categories.items() if v > 0), key=lambda kv: -kv[1])
    if not cats:
        return ""
    total = max(sum(v for _, v in cats), 1)
    rows = "".join(f'<tr><td><span class="sw" style="background:{_color(k, i)}"></span>{e(k)}</td>'
                   f'<td class="num">{e(fmt_bytes(v))}</td><td class="num">{_pct(v, total):.1f}%</td>'
                   f'<td class="help">{e(CATEGORY_HELP.get(k, ""))}</td></tr>' for i, (k, v) in enumerate(cats))
    return (f'<section class="card" id="peak-categories"><h2>Live at the peak, by category</h2>'
            f'<p class="sub">The {e(fmt_bytes(total))} of buffers live at the curve\'s peak.</p>'
            f'{_stack(cats, total)}<table><thead><tr><th>category</th><th class="num">bytes</th>'
            f'<th class="num">share</th><th>what it is</th></tr></thead><tbody>{rows}</tbody></table></section>')


def _cat_chip(cat: str) -> str:
    c = _color(cat)
    return f'<span class="cat" style="background:{c}33;border:1px solid {c}">{e(cat)}</span>'


def _buffers(r: Report) -> str:
    if not r.top_buffers:
        return ""
    shown = r.top_buffers[:MAX_BUFFER_ROWS]
    total = max(sum(r.peak_categories.values()) or max(b.size for b in shown), 1)
    biggest = max(max(b.size for b in shown), 1)
    rows = []
    for b in shown:
        tip = f' title="{e(b.op_name)}"' if b.op_name else ""
        rows.append(f'<tr{tip}><td class="num">{e(fmt_bytes(b.size))}</td>'
                    f'<td class="num">{_pct(b.size, total):.1f}%</td>'
                    f'<td class="barcell">{_minibar(b.size, biggest, _color(b.category))}</td>'
                    f'<td class="mono">{e(b.dtype)}{e(b.shape)}</td><td>{_cat_chip(b.category)}</td>'
                    f'<td class="mono path">{e(b.module_path or "-")}</td>'
                    f'<td class="mono path">{e(b.instruction)}</td></tr>')
    more = ""
    if len(r.top_buffers) > len(shown):
        more = f'<tr><td colspan="7" class="more">… {len(r.top_buffers) - len(shown)} more not shown</td></tr>'
    return (f'<section class="card" id="top-buffers"><h2>Largest buffers live at the peak</h2>'
            f'<p class="sub">Share of the {e(fmt_bytes(total))} live there; hover a row for the op name.</p>'
            f'<table><thead><tr><th class="num">bytes</th><th class="num">share</th><th></th><th>dtype · shape</th>'
            f'<th>category</th><th>module</th><th>instruction</th></tr></thead><tbody>{"".join(rows)}{more}</tbody>'
            f'</table></section>')


def _modules(r: Report) -> str:
    if not r.modules:
        return ""
    shown = r.modules[:MAX_MODULE_ROWS]
    total = max(sum(m.bytes for m in r.modules), 1)
    biggest = max(max(m.bytes for m in shown), 1)
    rows = "".join(f'<tr><td class="mono path">{e(m.module_path or "(no module)")}</td>'
                   f'<td class="num">{e(fmt_bytes(m.bytes))}</td><td class="num">{_pct(m.bytes, total):.1f}%</td>'
                   f'<td class="barcell">{_minibar(m.bytes, biggest)}</td>'
                   f'<td class="num">{m.buffers:,}</td></tr>' for m in shown)
    if len(r.modules) > len(shown):
        rest = r.modules[len(shown):]
        rows += (f'<tr><td class="more">… {len(rest)} more modules</td><td class="num">'
                 f'{e(fmt_bytes(sum(m.bytes for m in rest)))}</td><td></td><td></td>'
                 f'<td class="num">{sum(m.buffers for m in rest):,}</td></tr>')
    return (f'<section class="card" id="modules"><h2>Live at the peak, by module</h2>'
            f'<p class="sub">Buffers rolled up by Flax module path; state arguments under their category in '
            f'brackets.</p><table><thead><tr><th>module</th><th class="num">bytes</th><th class="num">share</th>'
            f'<th></th><th class="num">buffers</th></tr></thead><tbody>{rows}</tbody></table></section>')


def _warnings(r: Report) -> str:
    if not r.warnings:
        return ('<section class="card" id="warnings"><h2>Warnings and audits</h2>'
                '<p class="ok-line">No warnings: nothing left undonated or unsharded' +
                (', and no audit of the peak fired.' if r.timeline else '.') + '</p>'
                '</section>')
    items = []
    for w in r.warnings[:MAX_WARNINGS]:
        cost = f' <span class="cost">costs {e(fmt_bytes(w.bytes))} per device</span>' if w.bytes else ""
        items.append(f'<div class="warn"><span class="kind">{e(w.kind)}</span>{e(w.message)}{cost}</div>')
    if len(r.warnings) > MAX_WARNINGS:
        items.append(f'<p class="more">… {len(r.warnings) - MAX_WARNINGS} more warnings</p>')
    return f'<section class="card" id="warnings"><h2>Warnings and audits</h2>{"".join(items)}</section>'


def _runtime_terms(r: Report) -> str:
    """The runtime model's terms (Report.runtime): in JAX's pool and outside it, each with its source."""
    terms = (r.runtime or {}).get("terms") or []
    if not terms:
        return ""
    rows = "".join(f'<tr><td>{e(t["name"])}</td><td>{"in pool" if t["in_pool"] else "outside"}</td>'
                   f'<td class="num">{e(fmt_bytes(t["bytes"]))}</td><td>{e(t.get("status", ""))}</td>'
                   f'<td>{e(t["source"])}{"; " + e(t["detail"]) if t.get("detail") else ""}</td></tr>' for t in terms)
    return ('<table><thead><tr><th>runtime term</th><th>where</th><th class="num">bytes</th><th>status</th>'
            f'<th>source</th></tr></thead><tbody>{rows}</tbody></table>')


def _details(r: Report) -> str:
    xla = "".join(f'<tr><td>{e(k)}</td><td class="num">{e(fmt_bytes(v))}</td><td class="num mono">{v:,}</td></tr>'
                  for k, v in cast("dict[str, int]", r.xla).items())
    check = "".join(f'<tr><td>{e(k)}</td><td class="num">{e(fmt_bytes(v))}</td><td class="num mono">{v:,}</td></tr>'
                    for k, v in cast("dict[str, int]", r.state_check).items())
    return (f'<section class="card" id="details"><h2>Runtime overhead and XLA\'s numbers</h2>'
            f'<p><b>runtime_overhead</b> ({e(fmt_bytes(r.breakdown.get("runtime_overhead", 0)))}): '
            f'{e(r.runtime_overhead_source)}</p>' + _runtime_terms(r) +
            f'<details><summary>XLA\'s raw per-device numbers and the state check</summary><div class="grid2">'
            f'<table><thead><tr><th>xla</th><th class="num">bytes</th><th class="num">exact</th></tr></thead>'
            f'<tbody>{xla}</tbody></table>'
            f'<table><thead><tr><th>state check</th><th class="num">bytes</th><th class="num">exact</th></tr></thead>'
            f'<tbody>{check}</tbody></table></div></details></section>')


def _footer(r: Report) -> str:
    tim = ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in r.timings.items())
    ver = ", ".join(f"{k} {v}" for k, v in r.versions.items())
    jv = __version__
    return (f'<footer><p>timings: {e(tim or "-")}</p><p>versions: {e(ver or "-")}</p>'
            f'<p>generated by jaxmem {e(jv)} from XLA\'s compiled program; this file is self-contained '
            f'and references nothing outside itself.</p></footer>')


def render_html(r: Report) -> str:
    """The whole page as one string."""
    verdict = VERDICT_TEXT.get(verdict_of(r) or "", "no fixed limit")
    title = (f"jaxmem · {r.model} on {r.target.devices}× {r.target.gpu}: "
             f"{fmt_bytes(r.per_device_peak_bytes)} ({verdict})")
    body = "".join((_header(r), _verdict(r), _breakdown(r), _curve(r), _categories(r), _buffers(r), _modules(r),
                    _warnings(r), _details(r), _footer(r)))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta name="generator" content="jaxmem"><title>{e(title)}</title>'
            f'<style>{_CSS}</style></head><body><main>{body}</main></body></html>\n')


def write(report: Report, path) -> Path:
    """Write the self-contained HTML report to ``path``; returns the path."""

    p = Path(path)
    files.write_output(p, render_html(report).encode("utf-8"), option="--html")   # never through a link
    return p
