"""Open `jaxmem compare --html`'s page in a real headless browser and check what it renders.

Runs a compare of the tiny Llama (--remats none,full --find-batch, a budget of a few hundred MiB so
the search has a boundary), writes the page, then runs headless Chromium as
benchmarks/html_browser_check.py does: ``--dump-dom`` (the browser's DOM must hold one stacked bar
per row, each with its usable line, and one search curve per row with its boundary marked) and
``--screenshot`` (not blank), kept as benchmarks/results/compare-report.png.

    apt-get install -y chromium
    python benchmarks/compare_browser_check.py
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("html_browser_check", ROOT / "html_browser_check.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)
DEFAULT_OUT = ROOT / "results" / "compare-report.png"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--browser", default=None)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    a = ap.parse_args()
    browser = check.find_browser(a.browser)
    if browser is None:
        print("compare browser check: SKIPPED -- no chromium on PATH (apt-get install -y chromium, or --browser)")
        return 2
    from jaxmem.pipeline import AnalyzeOptions
    from jaxmem.plan import compare
    from jaxmem.present import compare_figs

    t0 = time.perf_counter()
    base = AnalyzeOptions(gpu="h100", mem_fraction=0.002, model_args=(("preset", "tiny"),))
    cells = compare.compare(str(ROOT.parent / "models" / "llama.py"), base, {"remat": "none,full"},
                            find=compare.Find("batch"), progress=False)
    t_compare = time.perf_counter() - t0
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="jaxmem-compare-") as tmp:
        page = Path(tmp) / "rows.html"
        compare_figs.write_html(cells, page)
        version = check.subprocess.run([browser, "--version"], capture_output=True, text=True).stdout.strip()
        dom_run = check.run_browser(browser, ["--dump-dom"], page.as_uri())
        dom = dom_run.stdout
        shot = Path(tmp) / "shot.png"
        shot_run = check.run_browser(browser, [f"--screenshot={shot}"], page.as_uri())

        def need(cond: bool, what: str):
            if not cond:
                failures.append(what)

        need(dom_run.returncode == 0 and "<html" in dom, f"--dump-dom failed: {dom_run.stderr[-300:]}")
        bars = re.search(r'<svg class="bars".*?</svg>', dom, re.S)
        curves = re.search(r'<svg class="curves".*?</svg>', dom, re.S)
        need(bars is not None, "no bars <svg> in the DOM")
        need(curves is not None, "no search-curves <svg> in the DOM")
        n_usable = len(re.findall(r'class="usable"', bars.group(0))) if bars else 0
        n_parts = len(re.findall(r'class="part"', bars.group(0))) if bars else 0
        n_paths = len(re.findall(r"<path", curves.group(0))) if curves else 0
        n_bound = len(re.findall(r'class="boundary"', curves.group(0))) if curves else 0
        need(n_usable == len(cells), f"{n_usable} usable lines for {len(cells)} rows")
        need(n_parts >= 3 * len(cells), f"only {n_parts} bar parts")
        need(n_paths == len(cells), f"{n_paths} search curves for {len(cells)} rows")
        need(n_bound == 2 * len(cells), f"{n_bound} boundary marks (a fit and a fail per row)")
        need(shot_run.returncode == 0 and shot.is_file(), f"--screenshot failed: {shot_run.stderr[-300:]}")
        variance, colours = 0.0, 0
        if shot.is_file():
            variance, colours, _ = check.screenshot_stats(shot)
            need(variance > 0 and colours > 20, f"screenshot looks blank ({colours} colours)")
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            check.shutil.copyfile(shot, a.out)
    answers = ", ".join(f"{compare_figs.label(c)}: batch {c.search.answer}" for c in cells if c.search)
    print(f"compare browser check: {'OK' if not failures else 'FAILED'} -- {len(cells)} rows ({answers}); {version}; "
          f"DOM: {n_parts} bar parts, {n_usable} usable lines, {n_paths} curves, {n_bound} boundary marks; "
          f"screenshot variance {variance:.4f}, {colours} colours -> {a.out}; compare {t_compare:.1f} s")
    for f in failures:
        print(f"  FAIL: {f}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
