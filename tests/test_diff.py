"""`jaxmem diff OLD.json NEW.json` (jaxmem/plan/diff.py): the peak and each part side by side, the
modules and buffers that changed, what differs in how the two were made, and the --max-growth gate."""
import json
import os
import pathlib

import pytest
from click.testing import CliRunner

from jaxmem.cli import main
from jaxmem.plan import diff

GOLDEN = pathlib.Path(__file__).resolve().parent / "fixtures" / "golden"
OLD = GOLDEN / "jax-0.10.2" / "gpt2-data8-fsdp.json"     # real reports of one step under two jax versions
NEW = GOLDEN / "jax-0.12.0.1" / "gpt2-data8-fsdp.json"


def _run(*args):
    return CliRunner().invoke(main, ["diff", *map(str, args)])


def _grown(tmp_path, share: float) -> pathlib.Path:
    """OLD with its temporaries (and so its peak) grown by `share` of the peak."""
    d = json.loads(OLD.read_text())
    extra = int(d["per_device_peak_bytes"] * share)
    d["per_device_peak_bytes"] += extra
    d["breakdown"]["activations_and_temporaries"] += extra
    d["modules"].append({"module_path": "GPT/new_block", "bytes": extra, "buffers": 1})
    out = tmp_path / f"grown-{share}.json"
    out.write_text(json.dumps(d))
    return out


def test_a_report_against_itself_changes_nothing_and_passes_a_zero_gate():
    r = _run(OLD, OLD, "--max-growth", "0", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["peak"] == {"old": d["peak"]["new"], "new": d["peak"]["old"], "delta": 0, "growth": 0.0}
    assert d["modules"] == [] and d["buffers"] == [] and d["settings"] == {}
    assert [row["change"] for row in d["breakdown"]] == ["same"] * 9


def test_two_versions_of_one_step_give_each_part_its_change_and_name_the_versions(tmp_path):
    old, new = json.loads(OLD.read_text()), json.loads(NEW.read_text())
    new["versions"] = {**old["versions"], "jax": "0.12.0.1"}   # the goldens of later versions leave it out
    new_path = tmp_path / "new.json"
    new_path.write_text(json.dumps(new))
    d = diff.diff(str(OLD), str(new_path))
    assert (d.old_peak, d.new_peak) == (old["per_device_peak_bytes"], new["per_device_peak_bytes"])
    assert [c.name for c in d.breakdown][:3] == ["params", "optimizer_state", "gradients"]
    assert sum(c.delta for c in d.breakdown) == d.new_peak - d.old_peak
    assert {c.name: c.delta for c in d.breakdown}["params"] == 0      # the train state is the same bytes
    assert d.settings == {"versions.jax": ("0.10.2", "0.12.0.1")}
    assert all(abs(a.delta) >= abs(b.delta) for a, b in zip(d.modules, d.modules[1:], strict=False))


def test_the_gate_is_exit_4_past_the_share_and_0_within_it(tmp_path):
    grown = _grown(tmp_path, 0.10)
    r = _run(OLD, grown, "--max-growth", "0.05")
    assert r.exit_code == 4, r.output
    assert "GREW" in r.output and "GPT/new_block" in r.output
    assert _run(OLD, grown, "--max-growth", "0.2").exit_code == 0
    assert _run(OLD, grown).exit_code == 0                           # no gate, no verdict
    assert _run(grown, OLD, "--max-growth", "0").exit_code == 0      # shrinking never trips it


def test_modules_are_classified_added_removed_grown_shrunk(tmp_path):
    d = json.loads(OLD.read_text())
    first, second = d["modules"][0], d["modules"][1]
    d2 = dict(d, modules=[{**first, "bytes": first["bytes"] * 2}, {"module_path": "X/new", "bytes": 5, "buffers": 1}])
    p = tmp_path / "m.json"
    p.write_text(json.dumps(d2))
    kinds = {row["name"]: row["change"] for row in json.loads(_run(OLD, p, "--json").output)["modules"]}
    assert kinds[first["module_path"]] == "grown" and kinds["X/new"] == "added"
    assert kinds[second["module_path"]] == "removed"


@pytest.mark.parametrize("content,expect", [
    (None, "NEW {}: cannot read it"),
    ("not json", "not JSON"),
    ("[]", "a list (a `compare` plan?)"),
    ('{"schema": "jaxmem.report/1", "model": "x"}', "not an analysis report"),
    ('{"per_device_peak_bytes": "big", "breakdown": {}}', "not a byte count"),
])
def test_a_file_that_is_not_an_analysis_is_exit_2_naming_it(tmp_path, content, expect):
    p = tmp_path / "new.json"
    if content is not None:
        p.write_text(content)
    r = _run(OLD, p)
    assert r.exit_code == 2 and expect.format(p) in r.output and "Traceback" not in r.output


def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = _run(fifo, OLD)
    assert r.exit_code == 2 and "OLD" in r.output and "FIFO" in r.output


@pytest.mark.parametrize("value", ["-0.1", "nan", "x"])
def test_a_bad_max_growth_is_a_usage_error(value):
    r = _run(OLD, OLD, "--max-growth", value)
    assert r.exit_code == 2 and "--max-growth" in r.output


def test_the_json_text_is_json_dumps_of_to_json_byte_for_byte(tmp_path):
    """diff --json writes its rows from a template (Python 3.12's indented json.dumps is a loop in
    Python): the text must stay what json.dumps(to_json(), indent=2) writes, for any name."""
    d = json.loads(OLD.read_text())
    names = ['quote " and \\ back', "tab\there", "üñí ✓", "[/bold]", "\x00\x1f", "a" * 300]
    d["modules"] += [{"module_path": n, "bytes": 7 + i, "buffers": 1} for i, n in enumerate(names)]
    d["breakdown"]["ünknown part"] = 3
    d["top_buffers"].append({"module_path": names[0], "shape": [2, 3], "dtype": "f32", "category": "temp",
                             "size": 24})
    p = tmp_path / "odd.json"
    p.write_text(json.dumps(d))
    for a, b in ((OLD, p), (p, OLD), (OLD, OLD), (OLD, NEW)):
        r = diff.diff(str(a), str(b), max_growth=0.01)
        assert r.json_text() == json.dumps(r.to_json(), indent=2, allow_nan=False)
    assert {m["name"] for m in json.loads(_run(OLD, p, "--json").output)["modules"]} >= set(names)
