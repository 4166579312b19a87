"""Constants a step captures: in the peak and its breakdown when XLA keeps them in device memory,
named in the report with the module that read them, and cheap for jaxmem to analyze."""
import json

import jax
import pytest
from conftest import ROOT

from jaxmem.compiler import versions
from jaxmem.pipeline import AnalyzeOptions, analyze_file
from jaxmem.program import constants
from jaxmem.report import Report

MODEL = str(ROOT / "tests" / "fixtures" / "constant_table.py")
ROWS = 65536
TABLE = ROWS * 64 * 4   # float32 (65536, 64): 16 MiB, read at positions the batch gives


@pytest.mark.parametrize("gpu", ["h100", "cpu"])
def test_the_peak_holds_every_byte_live_at_xlas_peak_a_kept_constant_included(gpu):
    r = analyze_file(MODEL, AnalyzeOptions(gpu=gpu, mesh="data=1", cache=False))
    live = sum(r.peak_categories.values())   # the buffers live at the peak of XLA's memory curve
    if gpu == "h100":   # XLA:CPU's peak_memory_in_bytes is its static memory alone (jaxmem.xla.timeline)
        assert live == r.xla["peak_memory"]
    assert r.per_device_peak_bytes - r.breakdown["runtime_overhead"] >= live   # was 16 MiB short
    # the table is in one part of the breakdown and one category of what is live, whole
    assert r.peak_categories["constants"] >= TABLE and r.breakdown["constants"] == r.peak_categories["constants"]
    assert r.top_buffers[0].category == "constants" and r.top_buffers[0].size == TABLE
    if versions.parse(jax.__version__)[:2] < (0, 10):   # known gap: jax 0.9's traced step names no captured
        return                                          # constant (the peak holds it all the same, above)
    assert r.constants == ({"shape": [ROWS, 64], "dtype": "float32", "count": 1, "bytes": TABLE,
                            "device_bytes": TABLE, "modules": ["TableNet"], "on_device": True},)
    assert Report.from_json(json.loads(json.dumps(r.to_json()))).constants == r.constants   # `constants` in the JSON


def test_a_table_xla_slices_away_is_named_and_not_on_the_device():
    # read at rows 0..7 only (the batch's positions are iota, made in the step): XLA keeps 8 rows, not the table
    found = (constants.Captured("Net/rotary", (ROWS, 64), "float32", TABLE),) * 2
    rows = constants.rows(found, kept=[8 * 64 * 4])
    assert rows == ({"shape": [ROWS, 64], "dtype": "float32", "count": 2, "bytes": 2 * TABLE, "device_bytes": 0,
                     "modules": ["Net/rotary"], "on_device": False},)
    assert constants.rows(found[:1], kept=None)[0]["on_device"] is None   # no buffer assignment read: unknown
