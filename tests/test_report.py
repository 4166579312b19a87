"""The Report's contract (jaxmem/report.py): the breakdown keys every renderer reads, from one place."""
import csv
import dataclasses
import io

from helpers import golden_report

from jaxmem.plan.compare import Cell, to_csv
from jaxmem.report import BREAKDOWN_HELP, BREAKDOWN_KEYS, Report


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
