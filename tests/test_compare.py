"""`jaxmem compare`: the grid, rows that split memory exactly as analyze does, saved and re-rendered rows."""
import csv
import io
import json

import pytest
from click.testing import CliRunner

from jaxmem.pipeline import AnalyzeOptions, analyze_file
from jaxmem.cli import main
from jaxmem.errors import UserError
from jaxmem.plan import compare

LLAMA = "models/llama.py"


def test_grid_is_the_cartesian_product():
    g = compare.grid({"layout": "dp,fsdp", "batch": "8,16", "mesh": "data=8;data=4,model=2", "remat": None})
    assert len(g) == 8
    assert {"layout": "fsdp", "batch": 16, "mesh": "data=4,model=2"} in g
    with pytest.raises(UserError, match="--batch"):
        compare.grid({"batch": "8,many"})


def test_rows_split_memory_as_analyze_and_saved_rows_rerender(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXMEM_CACHE", str(tmp_path / "cache"))
    saved = tmp_path / "rows.json"
    args = ["compare", LLAMA, "--arg", "preset=tiny", "--gpu", "h100", "--mesh", "data=2", "--layouts", "dp,fsdp",
            "--remats", "full", "--batches", "8,7", "--jobs", "2"]
    r = CliRunner().invoke(main, args + ["--json", "--out", str(saved)])
    assert r.exit_code == 0, r.output
    assert saved.read_text() == r.stdout                       # --out FILE.json is what --json prints
    rows = {(x["choice"]["layout"], x["choice"]["batch"]): x for x in json.loads(r.stdout)}
    # a batch the mesh cannot split is an error row; the others are kept
    assert rows[("dp", 7)]["status"] == "user_error" and "not divisible" in rows[("dp", 7)]["error"]
    dp = rows[("dp", 8)]
    assert dp["status"] == "ok" and dp["breakdown"]["activations_and_temporaries"] > 0

    # the same options through analyze, compiled afresh: the same report, explanation and all
    opts = AnalyzeOptions(gpu="h100", mesh="data=2", layout="dp", remat="full", batch=8,
                          model_args=(("preset", "tiny"),), cache=False)
    assert dp["report"] == json.loads(json.dumps(analyze_file(LLAMA, opts).to_json()))
    assert dp["report"]["top_buffers"] and dp["report"]["peak_categories"]

    # re-rendered without compiling: the same JSON byte for byte, the table, a CSV
    monkeypatch.setenv("JAXMEM_CACHE", str(tmp_path / "empty"))
    again = CliRunner().invoke(main, ["compare", "--from", str(saved), "--json"])
    assert again.exit_code == 0 and again.stdout == r.stdout
    table = CliRunner().invoke(main, ["compare", "--from", str(saved), "--out", str(tmp_path / "rows.csv")])
    assert table.exit_code == 0 and "per-device peak by choice" in table.stdout and "not divisible" in table.stdout
    assert not (tmp_path / "empty").exists()
    got = list(csv.DictReader(io.StringIO((tmp_path / "rows.csv").read_text())))
    assert len(got) == 4
    row = next(x for x in got if x["layout"] == "dp" and x["batch"] == "8")
    assert int(row["per_device_peak_bytes"]) == dp["per_device_peak_bytes"]
    assert int(row["breakdown.activations_and_temporaries"]) == dp["breakdown"]["activations_and_temporaries"]


def test_saved_rows_are_checked(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"not": "rows"}')
    r = CliRunner().invoke(main, ["compare", "--from", str(bad)])
    assert r.exit_code == 2 and "not a saved comparison" in r.output
    r = CliRunner().invoke(main, ["compare", "models/mlp.py", "--out", str(tmp_path / "rows.txt")])
    assert r.exit_code == 2 and "FILE.json" in r.output
    r = CliRunner().invoke(main, ["compare"])
    assert r.exit_code == 2 and "--from" in r.output
