"""The HTML and PNG reports: self-contained, complete, escaped, bounded; and the CLI flags that write them."""
import dataclasses
import re

import pytest
from click.testing import CliRunner

from jaxmem import cli
from jaxmem.present import html, png
from jaxmem.report import BREAKDOWN_KEYS, BufferRow, ModuleRow, ReportWarning
from jaxmem.units import fmt_bytes

FIX = __import__("pathlib").Path(__file__).parent / "fixtures"
from helpers import MLP_SMALL as MLP  # noqa: E402
from helpers import golden_report  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NASTY = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def report():
    # a real report, loaded (no compile): the golden of mlp data=8 fsdp on h100 has its top buffers, modules
    # and categories; a golden keeps no memory curve, so the page draws one rising to the peak
    r = golden_report("mlp-data8-fsdp")
    curve = tuple(r.per_device_peak_bytes * (i + 1) // 40 for i in range(40)) + (r.per_device_peak_bytes // 2,)
    r = dataclasses.replace(r, timeline=curve, timeline_peak_index=39)
    assert r.top_buffers and r.timeline and r.modules and r.peak_categories
    return r


def page(r, tmp_path, name="r.html") -> str:
    path = html.write(r, tmp_path / name)
    return path.read_text(encoding="utf-8")


def test_html_is_self_contained(report, tmp_path):
    text = page(report, tmp_path)
    assert text.startswith("<!DOCTYPE html>")
    low = text.lower()
    for needle in ('src="http', "src='http", 'href="http', "href='http", "@import", "url(http", "url(//",
                   "<link", "<iframe", "http://", "https://"):
        assert needle not in low, needle
    # every <script> is inline: no src attribute at all
    assert not re.search(r"<script[^>]*\ssrc=", low)


def test_html_shows_the_peak_breakdown_curve_and_buffers(report, tmp_path):
    text = page(report, tmp_path)
    peak = report.per_device_peak_bytes
    assert fmt_bytes(peak) in text and f"{peak:,}" in text
    assert set(report.breakdown) <= set(BREAKDOWN_KEYS)
    for key in report.breakdown:   # fp8_state only under --precision fp8
        assert f">{key}</td>" in text, key
        assert fmt_bytes(report.breakdown[key]) in text
    assert 'id="breakdown-table"' in text
    # the curve: an inline svg, the polyline has one point per timeline entry, the peak labelled
    assert re.search(r'<svg id="curve"', text)
    points = re.search(r'<polyline class="line" points="([^"]*)"', text).group(1).split()
    assert len(points) == len(report.timeline)
    assert f'peak {fmt_bytes(max(report.timeline))}</text>' in text
    assert report.target.description in text and "FITS" in text
    assert fmt_bytes(report.target.usable_bytes) in text and fmt_bytes(report.headroom_bytes) in text
    assert html.e(report.target.usable_note) in text
    assert html.e(report.runtime_overhead_source) in text
    for b in report.top_buffers:
        assert html.e(b.instruction) in text
        if b.op_name:
            assert f'title="{html.e(b.op_name)}"' in text
    for m in report.modules:
        assert html.e(m.module_path or "(no module)") in text
    for k, v in report.peak_categories.items():
        if v:
            assert f">{k}</td>" in text
    assert f"jax {report.versions['jax']}" in text


def test_every_report_string_is_escaped(report, tmp_path):
    evil = "\"'><img src=x onerror=alert(2)>"
    row = BufferRow(size=12345, shape="(1, 2)", dtype="f32", module_path=NASTY, category="temporaries",
                    instruction=f"fusion<{evil}>", op_name=f"jit(step)/{NASTY}/dot[{evil}]")
    r = dataclasses.replace(
        report, model=f"<b>{NASTY}</b>", top_buffers=(row, *report.top_buffers),
        modules=(ModuleRow(NASTY, 99, 1), *report.modules),
        warnings=(ReportWarning("unsharded_leaf", f"leaf {NASTY} {evil}", 4096),),
        options={**report.options, "arg:<x>": NASTY})
    text = page(r, tmp_path)
    assert NASTY not in text and "<img" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "&lt;b&gt;&lt;script&gt;" in text  # the model name, in the heading and the <title>
    assert html.e(row.op_name) in text  # the op name lands, escaped, in a title attribute
    # only our own two script elements (the curve's data and the hover read-out)
    assert text.count("<script") == 2
    assert "costs 4.00 KiB per device" in text


def test_the_page_says_when_it_does_not_fit(report, tmp_path):
    r = dataclasses.replace(report, fits=False, headroom_bytes=-(3 << 30))
    text = page(r, tmp_path)
    assert "DOES NOT FIT" in text and fmt_bytes(-(3 << 30)) in text


def test_a_cpu_target_and_no_explanation_still_render(report, tmp_path):
    target = dataclasses.replace(report.target, memory_bytes=None, usable_bytes=None, usable_note="CPU: no limit")
    r = dataclasses.replace(report, target=target, fits=None, headroom_bytes=None, timeline=(),
                            timeline_peak_index=-1, top_buffers=(), modules=(), peak_categories={}, warnings=())
    text = page(r, tmp_path)
    assert "NO FIXED LIMIT" in text and "CPU: no limit" in text and "No curve" in text
    assert "<svg" not in text and "<script" not in text
    written = png.write_png(r, tmp_path / "cpu.png")
    assert written.read_bytes()[:8] == PNG_MAGIC


def test_the_page_stays_small_for_huge_reports(report, tmp_path):
    rows = tuple(BufferRow(1 << 20, "(512, 512)", "f32", f"m/{i}", "temporaries", f"fusion.{i}", f"op/{i}")
                 for i in range(20_000))
    mods = tuple(ModuleRow(f"layers_{i}/attn", 1 << 20, 3) for i in range(20_000))
    r = dataclasses.replace(report, top_buffers=rows, modules=mods, timeline=tuple(range(2000)),
                            timeline_peak_index=1999)
    text = page(r, tmp_path)
    assert len(text.encode()) < 1 << 20
    assert text.count("fusion.") <= html.MAX_BUFFER_ROWS
    assert f"{20_000 - html.MAX_BUFFER_ROWS} more not shown" in text
    assert f"{20_000 - html.MAX_MODULE_ROWS} more modules" in text


def test_png_is_a_valid_png_of_reasonable_size(report, tmp_path):
    path = png.write_png(report, tmp_path / "sub" / "curve.png")
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert 10_000 < len(data) < 1 << 20
    import matplotlib.image as mpimg

    img = mpimg.imread(str(path))
    assert img.shape[0] > 300 and img.shape[1] > 600 and img[..., :3].var() > 0


def test_cli_writes_html_and_png(tmp_path):
    out_html, out_png = tmp_path / "report.html", tmp_path / "curve.png"
    r = CliRunner().invoke(cli.main, ["analyze", MLP, "--gpu", "h100", "--mesh", "data=8", "--layout", "fsdp",
                                      "--html", str(out_html), "--png", str(out_png)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    text = out_html.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and '<svg id="curve"' in text and "FITS" in text
    assert out_png.read_bytes()[:8] == PNG_MAGIC
