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
    # ranked by tokens/s per device among the rows that fit: the tokens are the batch's token ids
    rep = dp["report"]
    assert rep["tokens_per_step"] == 8 * rep["sequence_length"] and rep["sequence_length"] > 1
    assert dp["tokens_per_s"] == 8 * rep["sequence_length"] / rep["step_time"]["estimate_s"] / 2
    ranks = sorted(x["rank"] for x in rows.values() if x["status"] == "ok")   # every row that ran fits on an h100
    assert ranks[0] == 1 and all(isinstance(k, int) for k in ranks)
    assert rows[("dp", 7)]["rank"] is None and rows[("dp", 7)]["tokens_per_s"] is None

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
    assert table.exit_code == 0 and "per-device peak and throughput by choice" in table.stdout
    assert "not divisible" in table.stdout
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


def _ranked_row(choice, step_s, band, *, batch=16, tokens=True, fits=True, devices=8):
    """A row of a real report (the llama golden: no compile) at `batch`, estimated at `step_s` with a
    band of +-`band` seconds."""
    import dataclasses

    from helpers import golden_report

    base = golden_report("llama-data8-fsdp")
    r = dataclasses.replace(base, options={**base.options, "batch": batch}, fits=fits,
                            verdict="fits" if fits else "does_not_fit",
                            target=dataclasses.replace(base.target, devices=devices),
                            tokens_per_step=batch * 512 if tokens else None,
                            step_time={**base.step_time, "estimate_s": step_s, "low_s": step_s - band,
                                       "high_s": step_s + band})
    return compare.Cell(choice, r)


def test_tokens_per_s_is_the_steps_tokens_over_its_estimated_time_per_device():
    row = _ranked_row({"batch": 16}, 0.5, 0.1, batch=16, devices=8)
    d = row.to_json()
    assert d["tokens_per_s"] == 16 * 512 / 0.5 / 8 == 2048.0      # batch x sequence / step seconds / devices
    assert d["samples_per_s"] == 16 / 0.5 / 8 == 4.0
    samples = _ranked_row({"batch": 16}, 0.5, 0.1, tokens=False).to_json()   # a batch without a sequence
    assert samples["tokens_per_s"] is None and samples["samples_per_s"] == 4.0
    assert row.throughput.band == (2048.0, 16 * 512 / 0.6 / 8, 16 * 512 / 0.4 / 8)   # the slow end is the low one


def test_only_rows_that_fit_are_ranked_by_tokens_per_s_per_device_and_overlapping_bands_tie():
    rows = [
        _ranked_row({"r": "small-batch"}, 0.20, 0.01, batch=8),     # 8 x 512 / 0.2 / 8: 2,560 tokens/s
        _ranked_row({"r": "big-batch"}, 0.50, 0.01, batch=32),      # 4,096 tokens/s: faster per token
        _ranked_row({"r": "does-not-fit"}, 0.10, 0.01, batch=32, fits=False),   # fastest, but cannot run
        _ranked_row({"r": "near"}, 0.52, 0.02, batch=32),           # 3,938: its band overlaps big-batch's
        compare.Cell({"r": "failed"}, None, "boom", "failed"),
        _ranked_row({"r": "no-estimate"}, 0.5, 0.0, batch=8),
    ]
    import dataclasses
    rows[5] = dataclasses.replace(rows[5], report=dataclasses.replace(rows[5].report, step_time={"available": False}))
    ranks = {c.choice["r"]: c.rank for c in compare.ranked(rows)}
    assert ranks == {"big-batch": 1, "near": 1, "small-batch": 3, "does-not-fit": None, "failed": None,
                     "no-estimate": None}
    saved = compare.to_json(rows)
    assert [d["rank"] for d in saved] == [3, 1, None, 1, None, None]
    assert saved[2]["tokens_per_s"] == 32 * 512 / 0.10 / 8           # a row that cannot run still has its rate
    got = list(csv.DictReader(io.StringIO(compare.to_csv(rows))))
    assert [g["rank"] for g in got] == ["3", "1", "", "1", "", ""] and float(got[0]["tokens_per_s"]) == 2560.0
    # the table lists the ranked rows first, highest rate first, a tied row marked =k
    from rich.console import Console

    from jaxmem.present.render import render_comparison

    console = Console(record=True, width=250)
    render_comparison(rows, console)
    text = console.export_text()
    lines = [ln for ln in text.splitlines() if "│" in ln]
    order = [next(w for w in ("small-batch", "big-batch", "does-not-fit", "near", "failed", "no-estimate") if w in ln)
             for ln in lines]
    assert order == ["big-batch", "near", "small-batch", "no-estimate", "does-not-fit", "failed"]
    assert lines[1].rstrip(" │").endswith("=1") and "tokens/s/device" in text


def test_labels_never_print_none():
    assert compare.label({"lora_rank": 0, "base_dtype": None}) == "lora_rank=0"          # a full fine-tune has no base
    assert compare.label({"lora_rank": 16, "base_dtype": None}) == "lora_rank=16 base_dtype=default"
    assert compare.label({"microbatches": None, "layout": "dp"}) == "microbatches=default layout=dp"
    rows = compare.grid({"lora_rank": "0,16", "base_dtype": "none,nf4"})
    assert "None" not in " ".join(compare.label(r) for r in rows)


def test_pairs_give_each_row_its_layout_and_mesh_instead_of_the_cross_product():
    rows = compare.grid({"pair": "dp:data=8;fsdp_tp:data=4,model=2", "remat": "none,full"})
    assert rows == [{"layout": "dp", "mesh": "data=8", "remat": "none"},
                    {"layout": "dp", "mesh": "data=8", "remat": "full"},
                    {"layout": "fsdp_tp", "mesh": "data=4,model=2", "remat": "none"},
                    {"layout": "fsdp_tp", "mesh": "data=4,model=2", "remat": "full"}]
    with pytest.raises(UserError, match="--pair gives each row its layout and mesh: drop --layouts"):
        compare.grid({"layout": "dp", "pair": "dp:data=8"})
    # the CLI: repeated --pair, each checked as --layouts and --meshes are, before any compile
    for bad, why in (("dp", "expected LAYOUT:MESH"), ("dq:data=8", "unknown layout"), ("dp:data=x", "AXIS=N")):
        r = CliRunner().invoke(main, ["compare", "models/mlp.py", "--pair", "dp:data=2", "--pair", bad])
        assert r.exit_code == 2 and "--pair" in r.output and why in r.output, r.output
    r = CliRunner().invoke(main, ["compare", "models/mlp.py", "--pair", "dp:data=2", "--meshes", "data=2"])
    assert r.exit_code == 2 and "drop --meshes" in r.output
    # the API: pairs as tuples or LAYOUT:MESH text, the CLI's text
    from jaxmem import api

    assert api._grid_text("pairs", [("dp", "data=8"), "fsdp_tp:data=4,model=2"]) == "dp:data=8;fsdp_tp:data=4,model=2"
