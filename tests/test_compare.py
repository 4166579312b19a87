"""`jaxmem compare`: the grid, rows that split memory exactly as analyze does, saved and re-rendered rows."""
import csv
import io
import json

import pytest
from click.testing import CliRunner

from jaxmem.cli import main
from jaxmem.errors import UserError
from jaxmem.pipeline import AnalyzeOptions, analyze_file
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


# -- compare --from re-judges every saved verdict from the bytes ---------------------------------

from helpers import MLP_SMALL as MLP  # noqa: E402


@pytest.fixture(scope="module")
def saved_rows():
    """One fitting h100 row, as `compare --json` writes it."""
    opts = AnalyzeOptions(gpu="h100", mesh="data=2", layout="fsdp", model_args=(("width", 32),), explain=False)
    r = analyze_file(MLP, opts)
    assert r.fits is True
    return json.loads(json.dumps(compare.to_json([compare.Cell({"layout": "fsdp"}, r)])))


def _from(tmp_path, rows):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows, indent=2) + "\n")
    return CliRunner().invoke(main, ["compare", "--from", str(path), "--json"])


def test_an_unedited_file_rerenders_as_saved_and_says_it_was_rejudged(tmp_path, saved_rows):
    r = _from(tmp_path, saved_rows)
    assert r.exit_code == 0 and json.loads(r.stdout) == saved_rows
    assert "fits and headroom re-judged from each row's saved bytes" in r.stderr
    assert "the file said" not in r.stderr


def test_absurd_bytes_edited_consistently_do_not_fit(tmp_path, saved_rows):
    """The peak (and its breakdown), fits, headroom, usable and card size all edited to agree:
    the card's size comes from the catalogue, so the verdict follows from the bytes."""
    rows = json.loads(json.dumps(saved_rows))
    rep = rows[0]["report"]
    extra = 10 ** 15
    rep["breakdown"]["activations_and_temporaries"] += extra
    rep["per_device_peak_bytes"] += extra
    rep["target"]["memory_bytes"] = rep["target"]["usable_bytes"] = 2 * 10 ** 15
    rep["headroom_bytes"] = rep["target"]["usable_bytes"] - rep["per_device_peak_bytes"]
    rep["fits"] = True
    rows[0].update(per_device_peak_bytes=rep["per_device_peak_bytes"], fits=True, headroom_bytes=rep["headroom_bytes"])
    r = _from(tmp_path, rows)
    out = json.loads(r.stdout)[0]
    from jaxmem.compiler.targets import CATALOGUE

    assert rep["target"]["usable_note"].startswith("JAX default: 75% of the card")
    usable = int(CATALOGUE["h100"].memory_bytes * 0.75)
    assert r.exit_code == 3 and out["fits"] is False
    assert out["report"]["target"]["usable_bytes"] == usable == saved_rows[0]["report"]["target"]["usable_bytes"]
    assert out["headroom_bytes"] == usable - rep["per_device_peak_bytes"]
    assert "row layout=fsdp: the file said fits" in r.stderr and "says does not fit" in r.stderr


def test_a_flipped_verdict_alone_is_rejudged(tmp_path, saved_rows):
    rows = json.loads(json.dumps(saved_rows))
    rows[0]["report"]["target"]["usable_bytes"] = 1000
    rows[0]["report"]["fits"] = False
    rows[0]["report"]["headroom_bytes"] = 1000 - rows[0]["report"]["per_device_peak_bytes"]
    r = _from(tmp_path, rows)
    assert r.exit_code == 0 and json.loads(r.stdout) == saved_rows   # back to what its bytes say


def test_bytes_that_are_not_bytes_are_refused(tmp_path, saved_rows):
    for edit in (lambda rep: rep.update(per_device_peak_bytes=-5, breakdown={"params": -5}),
                 lambda rep: rep["runtime"].update(out_of_pool_bytes="lots"),
                 lambda rep: rep["target"].update(gpu="v100"),
                 lambda rep: rep["target"].update(usable_note="--mem-fraction 7")):
        rows = json.loads(json.dumps(saved_rows))
        edit(rows[0]["report"])
        r = _from(tmp_path, rows)
        assert r.exit_code == 2 and "--from" in r.stderr and "Traceback" not in r.output, r.output


def test_a_search_whose_probes_do_not_support_its_answer_is_an_error_row(tmp_path, saved_rows):
    rows = json.loads(json.dumps(saved_rows))
    rep = rows[0]["report"]
    usable, peak = rep["target"]["usable_bytes"], rep["per_device_peak_bytes"]
    fits_at = {"value": 8, "peak_bytes": peak, "usable_bytes": usable, "fits": True, "cached": False, "error": None}
    fails_at = {**fits_at, "value": 16, "peak_bytes": 10 * usable, "fits": False}
    search = {"kind": "batch", "arg": None, "answer": 8, "granule": 8, "capped": False, "margin": 0.05,
              "fits_at": fits_at, "fails_at": fails_at, "probes": [fits_at, fails_at], "compiles": 2}
    ok = [{**rows[0], "search": search}, {**rows[0], "choice": {"layout": "dp"}, "search": search}]
    r = _from(tmp_path, ok)
    assert r.exit_code == 0 and [x["status"] for x in json.loads(r.stdout)] == ["ok", "ok"]
    # the second row's failing probe edited to "fits" with a larger usable than its GPU has
    edited = {**fails_at, "usable_bytes": 100 * usable, "fits": True}
    bad = {**search, "answer": 16, "fits_at": edited, "fails_at": None, "probes": [fits_at, edited]}
    r = _from(tmp_path, [ok[0], {**ok[1], "search": bad}])
    out = json.loads(r.stdout)
    assert r.exit_code == 0 and [x["status"] for x in out] == ["ok", "user_error"]
    assert "do not support its answer" in out[1]["error"] and "row layout=dp" in r.stderr


def test_a_plan_without_rows_is_exit_2(tmp_path):
    r = _from(tmp_path, [])
    assert r.exit_code == 2 and "holds no rows" in r.stderr


def test_from_a_fifo_or_a_device_is_exit_2_at_once(tmp_path):
    import os

    os.mkfifo(tmp_path / "rows.json")
    for path, kind in ((tmp_path / "rows.json", "a FIFO"), ("/dev/zero", "a device")):
        r = CliRunner().invoke(main, ["compare", "--from", str(path)])
        assert r.exit_code == 2 and f"--from {path}: is {kind}" in r.stderr, r.output
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    r = CliRunner().invoke(main, ["compare", "--from", str(tmp_path / "deep.json")])
    assert r.exit_code == 2 and "nested more than" in r.stderr


def test_out_through_a_symlink_replaces_the_link_not_its_target(tmp_path, saved_rows):
    important = tmp_path / "important.txt"
    important.write_text("keep me")
    (tmp_path / "link.json").symlink_to(important)
    compare.save(compare.from_json(saved_rows), str(tmp_path / "link.json"))
    assert important.read_text() == "keep me" and json.loads((tmp_path / "link.json").read_text()) == saved_rows


def test_rows_are_time_ranked_by_estimate_and_overlapping_bands_marked_tied():
    from types import SimpleNamespace

    from jaxmem.present.render import _step_estimate, _time_ranks

    def rep(e, lo, hi):
        return SimpleNamespace(step_time={"available": True, "estimate_s": e, "low_s": lo, "high_s": hi})

    slow, fast, near = rep(2.0, 1.9, 2.1), rep(1.0, 0.9, 1.1), rep(1.05, 1.0, 1.2)
    none = SimpleNamespace(step_time={"available": False})
    ranks = _time_ranks([slow, fast, near, none, None])
    assert ranks == {id(fast): "1", id(near): "=1", id(slow): "3"}
    assert _step_estimate(fast) == "1.00 s (900.0 ms-1.10 s)"
