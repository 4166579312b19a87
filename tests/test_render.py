"""The text report's hints: what to change so it fits, only for the parts that make the peak."""
import dataclasses

import pytest
from helpers import golden_report

from jaxmem.present.render import hints
from jaxmem.report import BREAKDOWN_KEYS


@pytest.fixture(scope="module")
def report():
    return golden_report("mlp-data8-fsdp")   # a real report, loaded: the hints read only its fields


def _with(r, layout="fsdp", remat="none", **parts):
    """r with its breakdown made of `parts` (bytes; the other parts zero) and its peak their sum."""
    breakdown = {k: parts.get(k, 0) for k in BREAKDOWN_KEYS}
    return dataclasses.replace(r, breakdown=breakdown, per_device_peak_bytes=sum(breakdown.values()), layout=layout,
                               options={**r.options, "remat": remat})


def test_activations_suggest_the_remat_the_step_does_not_already_have(report):
    none = hints(_with(report, activations_and_temporaries=80, params=20))
    assert none[0] == ("activations_and_temporaries 80% of the peak: --remat full (or dots_saveable) with --remat-at "
                       "BLOCK if the model file takes no remat, a smaller --batch, or --accum N")
    placed = _with(report, remat="dots_saveable", activations_and_temporaries=80, params=20)
    placed = dataclasses.replace(placed, options={**placed.options, "remat_at": "^Block$"})   # it takes --remat-at
    assert hints(placed)[0] == ("activations_and_temporaries 80% of the peak: --remat full, a smaller --batch, "
                                "or --accum N")
    for remat in ("full", "nothing_saveable"):   # already saves nothing: remat is not the fix
        h = hints(_with(report, remat=remat, activations_and_temporaries=80, params=20))
        assert h[0] == "activations_and_temporaries 80% of the peak: a smaller --batch, or --accum N"


def test_a_part_under_a_tenth_of_the_peak_gets_no_hint(report):
    h = hints(_with(report, activations_and_temporaries=75, optimizer_state=16, params=9))
    assert [x.split(" ", 1)[0] for x in h] == ["activations_and_temporaries", "optimizer_state"]
    assert h[1] == "optimizer_state 16% of the peak: --optimizer adafactor or lion, or --precision bf16-pure"


def test_replicated_state_under_dp_points_at_fsdp(report):
    h = hints(_with(report, layout="dp", params=50, optimizer_state=50))
    assert all(x.endswith("replicated under dp: --layout fsdp shards params, gradients and optimizer state") for x in h)
    assert len(h) == 2


# ---------------------------------------------------------------- the verdict line: FITS / TIGHT / DOES NOT FIT


def _saved_report():
    """A report as a file holds it (the golden of mlp data=8 fsdp on h100): no compile."""
    import json
    import pathlib

    from jaxmem.report import Report

    golden = pathlib.Path(__file__).parent / "fixtures" / "golden" / "jax-0.10.2" / "mlp-data8-fsdp.json"
    return Report.from_json(json.loads(golden.read_text()))


TIGHT_TERMS = ({"name": "nccl_communicators", "low_bytes": 327548928, "bytes": 1379926016,
                "high_bytes": 2722103296},)


def _text(r, width=160):
    from rich.console import Console

    from jaxmem.present.render import render

    console = Console(record=True, width=width, color_system=None)
    render(r, console)
    return console.export_text()


def test_a_tight_verdict_shows_tight_with_the_term_and_its_range():
    r = dataclasses.replace(_saved_report(), verdict="tight", margin_bytes=1 << 30, verdict_terms=TIGHT_TERMS)
    text = _text(r)
    line = next(ln for ln in text.splitlines() if "TIGHT" in ln)
    assert "hangs on nccl_communicators 312.38 MiB-2.54 GiB" in line and "margin at the estimate 1.00 GiB" in line
    assert "DOES NOT FIT" not in text and " FITS " not in text
    fits = _text(dataclasses.replace(r, verdict="fits", verdict_terms=()))
    assert " FITS " in fits and "TIGHT" not in fits
    over = _text(dataclasses.replace(r, fits=False, verdict="does_not_fit", verdict_terms=()))
    assert "DOES NOT FIT" in over and "TIGHT" not in over


def test_verdict_of_reads_reports_saved_before_margins_from_fits():
    from jaxmem.report import Report, verdict_of

    r = _saved_report()
    assert r.verdict is None and verdict_of(r) == "fits"          # the golden predates verdicts
    assert verdict_of(dataclasses.replace(r, fits=False)) == "does_not_fit"
    assert verdict_of(dataclasses.replace(r, fits=None)) is None
    tight = dataclasses.replace(r, verdict="tight", margin_bytes=5, verdict_terms=TIGHT_TERMS)
    back = Report.from_json(tight.to_json())
    assert back == tight and verdict_of(back) == "tight" and back.fits is True


def test_compare_and_advise_show_tight_rows_as_fitting():
    from rich.console import Console

    from jaxmem.plan.compare import Cell, row_line
    from jaxmem.present.render import render_comparison

    r = _saved_report()
    tight = dataclasses.replace(r, verdict="tight", verdict_terms=TIGHT_TERMS)
    cells = [Cell({"layout": "fsdp"}, r), Cell({"layout": "dp"}, tight)]
    console = Console(record=True, width=200, color_system=None)
    render_comparison(cells, console)
    rows = {ln.split("│")[1].strip(): ln for ln in console.export_text().splitlines() if ln.count("│") > 3}
    assert "tight" in rows["dp"] and "yes" in rows["fsdp"]
    assert row_line(cells[1]).endswith("tight") and "fits" in row_line(cells[0])


def test_advise_says_when_the_step_as_given_is_timed_under_xlas_scheduler_memory_limit():
    from rich.console import Console

    from jaxmem.plan.advise import Advice, Candidate
    from jaxmem.present.render import render_advice
    from jaxmem.program.options import AnalyzeOptions
    from jaxmem.report import ReportWarning

    r = _saved_report()
    held = dataclasses.replace(r, fits=False, warnings=(ReportWarning("schedule_memory_limited", "over the limit"),))

    def text(original_report) -> str:
        original = Candidate((), AnalyzeOptions(), original_report)
        change = Candidate((("remat", "full"),), AnalyzeOptions(remat="full"), r)
        console = Console(record=True, width=300, color_system=None)
        render_advice(Advice("m.py", original, (change,), 2, 0, 1.0, searched=True), console)
        return console.export_text()

    assert "over XLA's scheduler memory limit" in text(held)
    assert "over XLA's scheduler memory limit" not in text(dataclasses.replace(r, fits=False))
