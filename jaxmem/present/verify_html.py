"""`jaxmem verify --html`: predicted vs measured, the runtime terms, and (on a GPU) NVML's trace.

One self-contained file (inline CSS and SVG, no script, opens offline).
"""

from __future__ import annotations

import html

from jaxmem import files
from jaxmem.errors import UserError
from jaxmem.units import fmt_bytes

_CHARTS = (("utilization_pct", "GPU utilization", "%", 1.0),
           ("memory_used_bytes", "memory used", "GiB", 1 / 2**30),
           ("power_w", "power", "W", 1.0),
           ("temperature_c", "temperature", "°C", 1.0))
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def _fmt(n) -> str:
    return fmt_bytes(n)


def trace_svg(trace: list[dict], key: str, title: str, unit: str, scale: float, width=440, height=150) -> str:
    """One small line chart of a metric over time, one line per GPU."""
    pts = [(s["t"], s[key] * scale, s["gpu"]) for s in trace if s.get(key) is not None]
    e = html.escape
    if not pts:
        return f'<svg width="{width}" height="{height}"><text x="8" y="20">{e(title)}: no readings</text></svg>'
    t_max = max(p[0] for p in pts) or 1.0
    v_max = max(p[1] for p in pts) or 1.0
    v_min = min(0.0, min(p[1] for p in pts))
    x0, y0, w, h = 40, 20, width - 50, height - 40

    def xy(t, v):
        return x0 + w * t / t_max, y0 + h - h * (v - v_min) / ((v_max - v_min) or 1.0)

    lines = []
    for i, gpu in enumerate(sorted({p[2] for p in pts}, key=str)):
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(t, v) for t, v, g in pts if g == gpu))
        lines.append(f'<polyline fill="none" stroke="{_COLORS[i % len(_COLORS)]}" stroke-width="1.5" '
                     f'points="{coords}"><title>GPU {e(str(gpu))}</title></polyline>')
    return (f'<svg width="{width}" height="{height}" role="img" aria-label="{e(title)}">'
            f'<text x="{x0}" y="14" font-size="12">{e(title)} ({e(unit)}), max {v_max:.1f}</text>'
            f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="#999"/>'
            f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="#999"/>'
            f'<text x="{x0 + w}" y="{height - 4}" font-size="10" text-anchor="end">{t_max:.2f} s</text>'
            + "".join(lines) + "</svg>")


def page(result) -> str:
    """The HTML of a VerifyResult."""
    e = html.escape
    r, m = result.report, result.method
    rows = "".join(f"<tr><td>{d['device']}</td><td>{_fmt(d['predicted_peak_bytes'])}</td>"
                   f"<td>{_fmt(d['measured_peak_bytes'])}</td><td>{d['relative_error']:+.2%}</td></tr>"
                   for d in result.per_device)
    terms = "".join(f"<tr><td>{e(t['name'])}</td><td>{'in pool' if t['in_pool'] else 'outside'}</td>"
                    f"<td>{_fmt(t['bytes'])}</td><td>{e(t.get('status', ''))}</td><td>{e(t['source'])}"
                    f"{'; ' + e(t['detail']) if t.get('detail') else ''}</td></tr>"
                    for t in (r.runtime or {}).get("terms", []))
    mon = result.monitor
    if mon and mon.get("available"):
        stats = "".join(
            f"<tr><td>{e(title)}</td>" + "".join(
                f"<td>{(mon['metrics'][key][k] * scale):.1f} {e(unit)}</td>" if mon["metrics"].get(key)
                else "<td>n/a</td>"
                for k in ("min", "median", "max")) + "</tr>"
            for key, title, unit, scale in _CHARTS)
        trace = result.measurement.get("monitor_trace") or []
        charts = "".join(trace_svg(trace, key, title, unit, scale) for key, title, unit, scale in _CHARTS)
        throttle = "".join(f'<p class="warn">{e(w)}</p>' for w in result.warnings) or "<p>No throttling.</p>"
        monitor = (f"<h2>The GPU while the step ran</h2><p>NVML, {mon['samples']} samples over "
                   f"{mon['window_s']:.2f} s (every {mon['interval_s'] * 1000:.0f} ms, plus one at the start and end)."
                   f"</p><table><tr><th></th><th>min</th><th>median</th><th>max</th></tr>{stats}</table>"
                   f"{throttle}<div class='charts'>{charts}</div>")
    elif mon:
        monitor = f"<h2>The GPU while the step ran</h2><p>Monitoring unavailable: {e(mon.get('error', ''))}</p>"
    else:
        monitor = "<p>Measured on the CPU: no GPU to monitor.</p>"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>jaxmem verify: {e(r.model)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1000px}}
table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}td:first-child,td:last-child{{text-align:left}}
.warn{{color:#b00}}.charts svg{{margin:4px;border:1px solid #eee}}</style></head><body>
<h1>jaxmem verify: {e(r.model)}</h1>
<p>{m['devices']} x {e(str(m['device']))} ({e(m['backend'])}), mesh {e(', '.join(f'{k}={v}' for k, v in r.mesh))},
layout {e(r.layout)}. Predicted {_fmt(result.predicted_peak_bytes)}, measured {_fmt(result.measured_peak_bytes)},
error <b>{result.relative_error:+.2%}</b>.</p>
<table><tr><th>device</th><th>predicted</th><th>measured</th><th>error</th></tr>{rows}</table>
<p>Method: {e(m['description'])}</p>
<h2>Runtime terms in the prediction</h2>
<table><tr><th>term</th><th>where</th><th>bytes</th><th>status</th><th>source</th></tr>{terms}</table>
{monitor}
</body></html>
"""


def write(result, path: str) -> None:
    try:
        files.write_output(path, page(result).encode("utf-8"), option="--html")   # never through a link
    except OSError as e:
        raise UserError(f"--html {path}: cannot write it ({e.strerror or e})") from None
