"""The Report's contract (jaxmem/report.py): the breakdown keys every renderer reads, from one place."""
import csv
import dataclasses
import io
import json

import pytest
from helpers import GOLDEN, golden_report

from jaxmem.plan.compare import Cell, to_csv
from jaxmem import report
from jaxmem.compiler import steptime
from jaxmem.report import BREAKDOWN_HELP, BREAKDOWN_KEYS, Report, breakdown_in_order


def test_every_breakdown_key_has_its_help_and_fp8_state_is_one():
    assert list(BREAKDOWN_HELP) == list(BREAKDOWN_KEYS) and "fp8_state" in BREAKDOWN_KEYS


def _fp8(r: Report) -> Report:
    """r as an fp8 step reports it: part of other_state is FP8 scaling state (the peak unchanged)."""
    b = dict(r.breakdown)
    b["fp8_state"] = b["other_state"] // 2 or 1024
    b["other_state"] -= b["fp8_state"] if b["other_state"] >= b["fp8_state"] else 0
    if sum(b.values()) != r.per_device_peak_bytes:
        b["activations_and_temporaries"] -= sum(b.values()) - r.per_device_peak_bytes
    return dataclasses.replace(r, breakdown=b)


def test_the_compare_csv_breakdown_columns_sum_to_the_peak_under_fp8():
    r = _fp8(golden_report("mlp-data8-fsdp"))
    assert r.breakdown["fp8_state"] > 0
    row = next(csv.DictReader(io.StringIO(to_csv([Cell({"precision": "fp8"}, r)]))))
    parts = [int(row[f"breakdown.{k}"]) for k in BREAKDOWN_KEYS]
    assert sum(parts) == int(row["per_device_peak_bytes"]) == r.per_device_peak_bytes


def _keys(typed) -> set[str]:
    return set(typed.__required_keys__) | set(typed.__optional_keys__)


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("jax-*/*.json")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_typed_fields_name_every_key_a_golden_report_holds(path):
    r = report.Report.from_json(json.loads(path.read_text()))
    assert {k for k in r.options if not k.startswith("arg:")} <= _keys(report.Options)
    assert set(r.step_time) <= _keys(report.StepTime)
    assert not r.runtime or set(r.runtime) == _keys(report.RuntimeInfo)
    assert all(set(v) == _keys(report.MeshRole) for v in r.mesh_roles.values())
    assert set(r.pipeline) <= _keys(report.PipelineInfo)


def test_the_step_time_type_names_every_key_the_estimate_writes():
    from test_steptime import ALL_REDUCE_16

    st = steptime.estimate(ALL_REDUCE_16, mesh_axes=(("data", 16),), hosts=2, gpu="h100")
    assert st["available"] and set(st) <= _keys(report.StepTime) and "reason" in _keys(report.StepTime)


def test_the_breakdown_is_shown_in_one_order_unknown_keys_last():
    parts = breakdown_in_order({"zz_new": 1, "activations_and_temporaries": 2, "params": 3})
    assert parts == [("params", 3), ("activations_and_temporaries", 2), ("zz_new", 1)]
