"""Open jaxmem's HTML report in a real headless browser and check what it renders.

Renders the report for a model (default: models/llama.py, preset=tiny, batch 16,
mesh data=8, fsdp, h100), then runs headless Chromium twice, offline-minded
(no background networking, no component updates, a throw-away profile):

* ``--dump-dom`` on a probe copy of the page that, once loaded, moves the mouse
  to the curve's peak: the DOM must hold the curve (svg + peak label), the
  breakdown table with every part, and the hover read-out the page's script wrote;
* ``--screenshot`` of the page itself at 1280x2400: the PNG must exist and not be
  blank (pixel variance > 0, more than a handful of colours).

The screenshot is kept as benchmarks/results/html-report.png.

    apt-get install -y chromium          # Debian; or pass --browser
    python benchmarks/html_browser_check.py
    python benchmarks/html_browser_check.py --model models/gpt2.py --arg preset=small --out /tmp/gpt2.png
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "html-report.png"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--window-size=1280,2400"]

# Appended to the probe copy only: hover the curve's peak the way a user would, then leave the
# read-out in the DOM for --dump-dom to show.
PROBE = """<script>
(function () {
  var svg = document.getElementById('curve'), dot = svg && svg.querySelector('.peakdot');
  if (!svg || !dot) { document.body.setAttribute('data-probe', 'no curve'); return; }
  var r = svg.getBoundingClientRect(), vb = svg.viewBox.baseVal;
  var x = r.left + r.width * (+dot.getAttribute('cx')) / vb.width;
  var y = r.top + r.height * (+dot.getAttribute('cy')) / vb.height;
  svg.dispatchEvent(new MouseEvent('mousemove', {clientX: x, clientY: y, bubbles: true}));
  var tip = document.getElementById('tip');
  document.body.setAttribute('data-probe', tip && tip.style.display === 'block' ? 'hover-ok' : 'hover-failed');
})();
</script>"""


def parse_arg(text: str):
    key, _, value = text.partition("=")
    for conv in (int, float):
        try:
            return key, conv(value)
        except ValueError:
            pass
    return key, value


def find_browser(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def run_browser(browser: str, extra: list[str], url: str, timeout: float = 120) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(prefix="jaxmem-chromium-")
    try:
        return subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *extra, url],
                              capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def screenshot_stats(path) -> tuple[float, int, tuple]:
    """(pixel variance, distinct colours, shape) of a screenshot: a blank page has 0 and a handful."""
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(str(path))
    return (float(np.var(img[..., :3])), len(np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)),
            img.shape)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/llama.py")
    ap.add_argument("--arg", action="append", default=None, metavar="KEY=VALUE",
                    help="workload() keyword (repeatable); default preset=tiny batch_size=16")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--mesh", default="data=8")
    ap.add_argument("--layout", default="fsdp")
    ap.add_argument("--browser", default=None, help="browser binary (default: chromium on PATH)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="where to keep the screenshot")
    ap.add_argument("--html", default=None, help="also keep the HTML here")
    a = ap.parse_args()

    browser = find_browser(a.browser)
    if browser is None:
        print("html browser check: SKIPPED -- no chromium on PATH (apt-get install -y chromium, or --browser)")
        return 2

    from jaxmem.program import layouts
    from jaxmem.compiler import targets

    targets.ensure_host_devices(max(layouts.parse_mesh(a.mesh).size, 1))
    from jaxmem.present import html
    from jaxmem.pipeline import AnalyzeOptions, analyze_file

    model_args = tuple(parse_arg(s) for s in (a.arg or ["preset=tiny", "batch_size=16"]))
    t0 = time.perf_counter()
    report = analyze_file(str(ROOT / a.model) if not os.path.isabs(a.model) else a.model,
                          AnalyzeOptions(gpu=a.gpu, mesh=a.mesh, layout=a.layout, model_args=model_args))
    t_analyze = time.perf_counter() - t0

    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="jaxmem-html-") as tmp:
        page = Path(tmp) / "report.html"
        html.write(report, page)
        text = page.read_text(encoding="utf-8")
        if a.html:
            shutil.copyfile(page, a.html)
        probe = Path(tmp) / "probe.html"
        probe.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")

        version = subprocess.run([browser, "--version"], capture_output=True, text=True).stdout.strip()
        t1 = time.perf_counter()
        dom_run = run_browser(browser, ["--dump-dom"], probe.as_uri())
        dom = dom_run.stdout
        shot = Path(tmp) / "shot.png"
        shot_run = run_browser(browser, [f"--screenshot={shot}"], page.as_uri())
        t_browser = time.perf_counter() - t1

        # --- the DOM, as the browser built it
        def need(cond: bool, what: str):
            if not cond:
                failures.append(what)

        need(dom_run.returncode == 0 and "<html" in dom, f"--dump-dom failed (rc {dom_run.returncode}): "
             f"{dom_run.stderr[-400:]}")
        need(bool(re.search(r'<svg[^>]*id="curve"', dom)), "no <svg id=curve> in the DOM")
        need(bool(re.search(r'<polyline[^>]*class="line"', dom)), "no curve polyline in the DOM")
        peak_label = re.search(r'id="peak-label"[^>]*>([^<]*)<', dom)
        need(bool(peak_label and peak_label.group(1).startswith("peak ")), "no peak label in the DOM")
        need('id="breakdown-table"' in dom, "no breakdown table in the DOM")
        for key in report.breakdown:
            need(f">{key}</td>" in dom, f"breakdown part {key} missing from the DOM")
        probe_state = re.search(r'data-probe="([^"]*)"', dom)
        need(bool(probe_state and probe_state.group(1) == "hover-ok"),
             f"hover read-out: {probe_state.group(1) if probe_state else 'probe did not run'}")
        tip = re.search(r'<div id="tip"[^>]*>([^<]*)</div>', dom)
        # mouse coordinates are whole pixels, so the read-out may land a point beside the peak
        need(bool(tip and re.match(r"[\d.]+ (B|KiB|MiB|GiB) live at [\d.]+% of the program", tip.group(1))),
             f"hover read-out unexpected: {tip.group(1) if tip else None!r}")

        # --- the pixels
        need(shot_run.returncode == 0 and shot.is_file(), f"--screenshot failed (rc {shot_run.returncode}): "
             f"{shot_run.stderr[-400:]}")
        variance, colours, shape = 0.0, 0, ()
        if shot.is_file():
            variance, colours, shape = screenshot_stats(shot)
            need(variance > 0, "screenshot is blank (zero variance)")
            need(colours > 50, f"screenshot has only {colours} colours")
            out = Path(a.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, out)
            need(out.stat().st_size < 1 << 20, f"screenshot is {out.stat().st_size} bytes (>= 1 MB)")

    t = report.target
    status = "OK" if not failures else "FAILED"
    print(f"html browser check: {status} -- {report.model} on {t.devices} x {t.gpu} ({a.layout}, {a.mesh}); "
          f"{version}; html {len(text.encode()) / 1024:.0f} KiB, DOM {len(dom) / 1024:.0f} KiB; "
          f"curve + {peak_label.group(1) if peak_label else 'no peak label'!r} + breakdown "
          f"({len(report.breakdown)} parts) in the DOM; hover: {tip.group(1) if tip else '-'!r}; "
          f"screenshot {shape[1] if shape else 0}x{shape[0] if shape else 0}, variance {variance:.4f}, "
          f"{colours} colours -> {os.path.relpath(a.out, os.getcwd())}; analyze {t_analyze:.1f} s, "
          f"browser {t_browser:.1f} s")
    for f in failures:
        print(f"  FAIL: {f}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
