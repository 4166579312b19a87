"""compare's pictures (jaxmem/present/compare_figs.py): a stacked bar per row against its usable
memory, the fit searches' curves with their boundary, in --html, --png and the notebook."""

from __future__ import annotations

import dataclasses
import re

import pytest
from click.testing import CliRunner

import jaxmem
from jaxmem import cli
from jaxmem.plan.compare import Cell
from jaxmem.plan.search import Probe, SearchResult
from jaxmem.present import compare_figs, notebook


@pytest.fixture(scope="module")
def report():
    return jaxmem.analyze("models/llama.py", gpu="h100", args={"preset": "tiny"}, explain=False)


def _search(usable):
    probes = tuple(Probe(v, 1000 * v, usable, 1000 * v <= usable) for v in (8, 64, 96, 97))
    return SearchResult("batch", None, 96, 1, False, 0.05, probes[2], probes[3], probes, 4)


def test_each_row_is_one_stacked_bar_of_its_parts_against_its_usable_memory(report):
    half = dataclasses.replace(report, target=dataclasses.replace(report.target, usable_bytes=report.target.usable_bytes // 2))
    cells = [Cell({"remat": "none"}, report), Cell({"remat": "full"}, half), Cell({"remat": "x"}, None, "no such policy",
                                                                               "user_error")]
    svg = compare_figs.bars_svg(cells)
    widths = [[float(w) for w in re.findall(r'data-part="\w+" x="[\d.]+" y="[\d.]+" width="([\d.]+)"', part)]
              for part in svg.split('text-anchor="end">')[1:]]
    parts = [v for _, _, v in compare_figs.parts(report) if v]
    assert sum(v for _, _, v in compare_figs.parts(report)) == report.per_device_peak_bytes   # the parts are the peak
    assert len(widths[0]) == len(parts) and widths[0] == widths[1]          # the same step, the same bar
    scale = sum(widths[0]) / report.per_device_peak_bytes
    assert all(abs(w - v * scale) < 0.11 for w, v in zip(widths[0], parts, strict=True))   # widths follow the bytes
    usable = [float(x) for x in re.findall(r'class="usable" x1="([\d.]+)"', svg)]
    assert len(usable) == 2 and usable[1] < usable[0]                        # each row's own usable line
    assert "user_error: no such policy" in svg                              # a failed row says why


def test_a_fit_search_draws_peak_against_the_value_with_its_boundary(report):
    usable = 96_500
    cells = [Cell({"remat": "none"}, report, search=_search(usable))]
    svg = compare_figs.curves_svg(cells)
    assert svg.count("<path") == 1 and svg.count("<circle") == 4
    assert re.findall(r'<title>(\d+) (fits|does not fit)</title></line>', svg) == [("96", "fits"), ("97", "does not fit")]
    assert 'class="usable"' in svg and "global batch" in svg
    assert compare_figs.curves_svg([Cell({}, report)]) == ""                # no search, no curves


def test_compare_writes_html_and_png_and_the_notebook_shows_the_bars(tmp_path, report):
    html_path, png_path = tmp_path / "rows.html", tmp_path / "rows.png"
    res = CliRunner().invoke(cli.main, ["compare", "models/llama.py", "--arg", "preset=tiny", "--gpu", "h100",
                                        "--remats", "none,full", "--html", str(html_path), "--png", str(png_path)])
    assert res.exit_code == 0, res.output
    page = html_path.read_text()
    assert page.count('class="usable"') == 2 and "remat=none" in page and "remat=full" in page
    from matplotlib import image

    pixels = image.imread(png_path)
    assert pixels.shape[0] > 200 and pixels.std() > 0.05                    # drawn, not blank
    assert "<svg" in notebook.rows_html([Cell({"remat": "none"}, report)])
    # a side output that cannot be written is refused before any compile
    res = CliRunner().invoke(cli.main, ["compare", "models/llama.py", "--arg", "preset=tiny", "--remats", "none",
                                        "--png", str(tmp_path)])
    assert res.exit_code == 2 and "--png" in res.output and "is a directory" in res.output


def test_each_row_shows_its_step_time_and_band_beside_its_memory_bar(report):
    st = report.step_time
    slower = dataclasses.replace(report, step_time={**st, "estimate_s": 2 * st["estimate_s"], "low_s": 2 * st["low_s"],
                                                    "high_s": 2 * st["high_s"]})
    cells = [Cell({"remat": "none"}, report), Cell({"remat": "full"}, slower)]
    svg = compare_figs.bars_svg(cells)
    bands = [(float(x), float(w)) for x, w in re.findall(r'class="step-band" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"',
                                                         svg)]
    marks = [float(x) for x in re.findall(r'class="step" x1="([\d.]+)"', svg)]
    assert len(bands) == len(marks) == 2
    for (x, w), m in zip(bands, marks, strict=True):
        assert x <= m <= x + w                                               # the estimate inside its band
    origin = 1160 - 170   # one time scale for all rows: the slower row's mark twice as far from the origin
    assert marks[1] - origin == pytest.approx(2 * (marks[0] - origin), rel=1e-2)
    assert "step time (estimate, band)" in svg
