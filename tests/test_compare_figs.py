"""compare's pictures (jaxmem/present/compare_figs.py): a stacked bar per row against its usable
memory, its step time and throughput, the fit searches' curves with their boundary, in --html, --png
and the notebook; and the pictures read at first sight: in every PNG (compare's, with and without a
fit search, and analyze's) each text lies inside the canvas and none overlaps another."""

from __future__ import annotations

import dataclasses
import re

import pytest
from click.testing import CliRunner
from helpers import golden_report

import jaxmem
from jaxmem import cli
from jaxmem.plan.compare import Cell
from jaxmem.plan.search import Probe, SearchResult
from jaxmem.present import compare_figs, compare_png, html, notebook, png


@pytest.fixture(scope="module")
def report():
    return jaxmem.analyze("models/llama.py", gpu="h100", args={"preset": "tiny"}, explain=False)


def _search(usable):
    probes = tuple(Probe(v, 1000 * v, usable, 1000 * v <= usable) for v in (8, 64, 96, 97))
    return SearchResult("batch", None, 96, 1, False, 0.05, probes[2], probes[3], probes, 4)


def test_each_row_is_one_stacked_bar_of_its_parts_against_its_usable_memory(report):
    half = dataclasses.replace(report, target=dataclasses.replace(report.target,
                                                                  usable_bytes=report.target.usable_bytes // 2))
    cells = [Cell({"remat": "none"}, report), Cell({"remat": "full"}, half),
             Cell({"remat": "x"}, None, "no such policy", "user_error")]
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
    assert svg.count("<path") == 1 and svg.count('<circle class="probe"') == 4
    assert re.findall(r'<title>(\d+) (fits|does not fit)</title></line>', svg) == [("96", "fits"),
                                                                                   ("97", "does not fit")]
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
    # one time scale for all rows: the slower row's mark twice as far from the strip's origin
    origin = float(re.search(r'class="step-axis" x="([\d.]+)"', svg).group(1))
    assert marks[1] - origin == pytest.approx(2 * (marks[0] - origin), rel=1e-2)
    assert "step time (est., band)" in svg


# -- pictures that read at first sight ---------------------------------------------------------------

def drawn_texts(fig) -> list[tuple[str, object]]:
    """Every text the renderer draws (tick labels, legend entries, titles, axis labels, annotations):
    (its text, its window extent in pixels). Recorded at draw time, so a tick label outside the view,
    which matplotlib keeps but does not draw, is not counted."""
    renderer = fig.canvas.get_renderer()
    drawn = []
    plain = renderer.draw_text

    def record(gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if mtext is not None and s.strip():
            drawn.append(mtext)
        return plain(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

    renderer.draw_text = record
    try:
        fig.canvas.draw()
    finally:
        del renderer.draw_text
    unique = list(dict.fromkeys(drawn))
    return [(t.get_text(), t.get_window_extent(renderer)) for t in unique]


def assert_reads_at_first_sight(fig) -> int:
    """Every text inside the canvas, no two overlapping; returns how many were checked."""
    texts = drawn_texts(fig)
    w, h = fig.canvas.get_width_height()
    outside = [t for t, b in texts if b.x0 < 0 or b.y0 < 0 or b.x1 > w or b.y1 > h]
    assert not outside, f"texts past the canvas ({w} x {h}): {outside}"
    clashes = [(a, b) for i, (a, ba) in enumerate(texts) for b, bb in texts[i + 1:]
               if min(ba.x1, bb.x1) > max(ba.x0, bb.x0) and min(ba.y1, bb.y1) > max(ba.y0, bb.y0)]
    assert not clashes, f"overlapping texts: {clashes}"
    return len(texts)


def _rows(tokens: bool = True):
    """Rows as a real comparison holds them (golden reports, no compile): two that fit, found by a batch
    search at different batches, one that does not fit, one that failed with a long error."""
    base = golden_report("llama-data8-fsdp")
    st = base.step_time

    def at(batch, step_s, **kw):
        r = dataclasses.replace(base, options={**base.options, "batch": batch},
                                tokens_per_step=batch * 128 if tokens else None,
                                step_time={**st, "estimate_s": step_s, "low_s": 0.95 * step_s, "high_s": 1.05 * step_s})
        return dataclasses.replace(r, **kw)

    usable = base.target.usable_bytes
    long = "remat=dots_with_no_batch_dims_saveable precision=bf16 optimizer=adafactor layout=fsdp_tp"

    def search(answer, peak_per):
        probes = tuple(Probe(v, peak_per * v, usable, peak_per * v <= usable * 0.95)
                       for v in (8, 64, answer, answer + 8))
        return SearchResult("batch", None, answer, 8, False, 0.05, probes[2], probes[3], probes, 4)

    fast = Cell({"remat": "full", "layout": "fsdp"}, at(448, 0.40), search=search(448, usable // 500))
    slow = Cell({"remat": "none", "layout": "fsdp"}, at(160, 0.30), search=search(160, usable // 180))
    big = Cell({"remat": "none", "layout": "dp", "gpu": "rtx-4090"},
               at(16, 0.1, fits=False, verdict="does_not_fit",
                  target=dataclasses.replace(base.target, usable_bytes=base.per_device_peak_bytes // 3)))
    failed = Cell({"remat": long, "layout": "tp"}, None,
                  "XLA could not compile the step: RESOURCE_EXHAUSTED: " + "x" * 300, "failed")
    return [fast, slow, big, failed]


def test_every_compare_png_text_lies_inside_the_canvas_and_none_overlaps():
    rows = _rows()
    with_search = compare_png.figure(rows)
    assert assert_reads_at_first_sight(with_search) > 40
    without = compare_png.figure([dataclasses.replace(c, search=None) for c in rows])
    assert assert_reads_at_first_sight(without) > 20
    # a single row, and rows without a step-time estimate (no step, no rate panel to fill)
    no_estimate = dataclasses.replace(rows[1].report, step_time={})
    alone = compare_png.figure([dataclasses.replace(rows[1], report=no_estimate)])
    assert_reads_at_first_sight(alone)


def test_the_analyze_png_text_lies_inside_the_canvas_and_none_overlaps_and_names_its_phases():
    r = golden_report("llama-data8-fsdp")
    curve = tuple(r.per_device_peak_bytes * (i + 1) // 400 for i in range(300)) + (r.per_device_peak_bytes // 2,) * 99
    r = dataclasses.replace(r, timeline=curve, timeline_peak_index=299, timeline_phases=(120, 380))
    fig = png.figure(r)
    assert_reads_at_first_sight(fig)
    spans = png.phase_spans(r, [100 * i / 398 for i in range(399)])
    assert [(name, round(x0), round(x1)) for name, _, x0, x1 in spans] == [
        ("forward", 0, 30), ("backward", 30, 95), ("optimizer update", 95, 100)]
    legend = [t for t, _ in drawn_texts(fig)]
    assert "forward 0-30%" in legend and "backward 30-95%" in legend and "optimizer update 95-100%" in legend
    # the HTML page's curve: the same three bands, each named above the plot
    svg, _ = html.curve_svg(r)
    assert svg.count('<rect class="phase"') == 3
    assert re.findall(r'class="xlab phaselab"[^>]*>([^<]+)<', svg) == ["forward", "backward", "optimizer update"]
    # a program without a backward pass has no phases to mark
    assert png.phase_spans(dataclasses.replace(r, timeline_phases=()), [0.0, 100.0]) == []
    assert 'class="phase"' not in html.curve_svg(dataclasses.replace(r, timeline_phases=()))[0]


def test_bars_name_each_row_at_its_own_batch_with_its_rank_and_the_card_of_every_row():
    from jaxmem.plan.compare import ranked

    rows = ranked(_rows())
    texts = [t for t, _ in drawn_texts(compare_png.figure(rows))]
    # ranked by tokens/s per device: 448 x 128 tokens in 0.40 s beat 160 x 128 in 0.30 s
    assert "#1 remat=full layout=fsdp at batch=448" in texts and "#2 remat=none layout=fsdp at batch=160" in texts
    assert "remat=none layout=dp gpu=rtx-4090" in texts                          # does not fit: no rank
    assert any("does not fit" in t for t in texts)
    assert "tokens/s per device" in texts
    title = next(t for t in texts if t.startswith("jaxmem compare:"))
    assert "8 x NVIDIA H100" in title
    page = compare_figs.render_html(rows)
    assert "<title>jaxmem compare: llama-tiny, 4 rows on 8 x NVIDIA H100 80GB HBM3</title>" in page
    assert "None" not in page
    # the notebook's table: the same order, rate and rank
    nb = notebook.rows_html(rows)
    assert "tokens/s per device" in nb and "None" not in nb
    assert nb.index("at batch=448") < nb.index("at batch=160") < nb.index("rtx-4090")
    assert re.search(r'<td class="num">17,920</td><td class="num">1</td>', nb)   # 448 x 128 / 0.40 s / 8 devices


def test_fit_search_curves_differ_from_row_to_row_and_their_limits_are_named():
    rows = _rows()
    fig = compare_png.figure(rows)
    bx = fig.subfigs[1].axes[0]
    legend = bx.get_legend()
    names = [t.get_text() for t in legend.get_texts()]
    assert names[:2] == ["remat=full layout=fsdp: max batch 448", "remat=none layout=fsdp: max batch 160"]
    assert any(n.startswith("usable memory ") and n.endswith("(h100)") for n in names)
    assert "hollow marker: a value that does not fit" in names and "dotted: a row's last fit and first failure" in names
    styles = [(h.get_color(), h.get_marker(), h.get_linestyle()) for h in legend.legend_handles[:2]]
    assert len({s[0] for s in styles}) == len({s[1] for s in styles}) == len({s[2] for s in styles}) == 2
    svg = compare_figs.curves_svg(rows)
    assert "remat=full layout=fsdp: max batch 448" in svg and "(h100)" in svg and "last fit and first failure" in svg
