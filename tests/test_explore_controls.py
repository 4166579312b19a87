"""jaxmem explore's controls come from the model (issue 53): /api/controls for a config.json and a model file (every
argument with its type and range, the context, the report's vocabulary), a text argument moving within its own list,
the model picker (the shipped configs, the models under the starting folder, a path outside it refused, a switch
without a restart), the longest sequence that fits (compare's search on the explorer's pool), and the report's
past_context warning. No compile but the one marked slow: the pool is a stand-in that answers at once."""

import dataclasses
import json
import os
import time

import pytest
from click.testing import CliRunner
from conftest import MODELS, ROOT

from jaxmem import hf, report
from jaxmem.errors import UserError
from jaxmem.explore import modelargs, models, query, server
from jaxmem.explore.points import Explorer
from jaxmem.plan import sweep
from jaxmem.present import html
from jaxmem.program.options import AnalyzeOptions
from jaxmem.report import Report

CONFIG = "tests/fixtures/hf/llama"          # a tiny Llama config.json (max_position_embeddings 512)
LLAMA = "models/llama.py"
START = AnalyzeOptions(gpu="h100", model_args=(("preset", "tiny"),))
GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "jax-0.10.2" / "llama-data8-dp.json"


class _Pool:
    """A pool that answers each job at once with `answer(job)` (an Outcome), or holds it when that is None."""

    def __init__(self, answer=lambda job: None):
        self.answer, self.started, self.done = answer, [], []

    def submit(self, job):
        self.started.append(job)
        out = self.answer(job)
        if out is not None:
            self.done.append(out)

    def next(self, timeout=None):
        time.sleep(0.01)
        return self.done.pop(0) if self.done else None

    def close(self):
        pass


@pytest.fixture
def app(monkeypatch):
    monkeypatch.chdir(ROOT)
    ex = Explorer(LLAMA, START, jobs=1, seq_arg="seq_len", make_pool=lambda n, executor, address: _Pool())
    a = server.App(ex)
    try:
        yield a
    finally:
        ex.close()


def get(app, target: str):
    status, body, _, _ = server.respond(app, target)
    return status, json.loads(body)


def test_a_config_json_offers_every_argument_with_its_type_range_and_the_context():
    info = modelargs.of(ROOT / CONFIG)
    args = {a["name"]: a for a in info["args"]}
    assert info["context"] == 512 and info["context_field"] == "max_position_embeddings"
    assert args["seq_len"]["kind"] == "int" and args["seq_len"]["min"] == 1 and args["seq_len"]["context"] == 512
    assert args["seq_len"]["default"] == 512             # min(2048, the context): build_workload's default
    assert args["attention"] == {**args["attention"], "kind": "choice", "choices": list(hf.ATTENTION)}
    assert args["vocab_tiles"]["kind"] == "int" and args["vocab_tiles"]["divides"] == "seq_len"
    assert args["scan"]["kind"] == "bool" and args["scan"]["default"] is True
    assert args["batch_size"]["via"] == "batch" and args["remat"]["via"] == "remat"   # the page's own controls
    assert "capacity_factor" not in args                   # a dense decoder takes no MoE argument
    moe = {a["name"] for a in modelargs.of(ROOT / "benchmarks" / "hf_configs" / "Qwen3-30B-A3B.json")["args"]}
    assert {"capacity_factor", "group_size", "aux_loss_coef"} <= moe


def test_a_model_file_offers_its_workload_arguments_and_config_fields_by_preset():
    info = modelargs.of(MODELS / "llama.py")
    args = {a["name"]: a for a in info["args"]}
    assert args["preset"]["kind"] == "choice" and {"tiny", "8b", "70b"} <= set(args["preset"]["choices"])
    assert args["seq_len"]["min"] == 1 and args["batch_size"]["via"] == "batch"
    # a Config field is the preset's: tiny sets d_model 64, Config's own default is 4096
    assert args["d_model"]["config_field"] and args["d_model"]["by_preset"]["tiny"] == 64
    assert args["d_model"]["default"] == 4096 and args["d_model"]["kind"] == "int"
    assert args["attention"]["choices"] == ["xla", "cudnn"]   # its comment quotes its values
    assert args["tie_embeddings"]["kind"] == "bool" and args["rope_theta"]["kind"] == "float"
    assert args["remat_save"]["kind"] == "text"               # free text: fixed for the explorer
    assert modelargs.of(MODELS / "mlp.py")["context"] is None


def test_api_controls_carry_the_models_arguments_and_the_reports_vocabulary(app):
    status, c = get(app, "/api/controls")
    assert status == 200 and c["model"] == LLAMA and c["seq_arg"] == "seq_len"
    assert {a["name"] for a in c["model_args"]["args"]} >= {"preset", "seq_len", "d_model", "attention"}
    sc = c["schema"]
    assert [b["key"] for b in sc["breakdown"]] == list(report.BREAKDOWN_KEYS)   # constants included
    colours = {b["key"]: b["color"] for b in sc["breakdown"]}
    assert colours["constants"] == html.COLORS["constants"] and colours["params"] == html.COLORS["params"]
    assert sc["colors"] == html.COLORS and sc["verdicts"] == report.VERDICT_TEXT
    assert sc["warning_kinds"]["past_context"] == report.WARNING_KINDS["past_context"]
    assert c["params"] is None   # (the start has not compiled: the counts come with its report)


def test_a_text_argument_moves_within_its_own_list_only():
    o = query.parse({"arg.attention": ["cudnn"], "arg.preset": ["8b"]}, START, str(MODELS / "llama.py"))
    assert dict(o.model_args) == {"attention": "cudnn", "preset": "8b"}
    for bad in ({"arg.attention": ["/etc/passwd"]}, {"arg.preset": ["../x"]}, {"arg.remat_save": ["a,b"]}):
        with pytest.raises(query.BadQuery, match="fixed for this explorer"):
            query.parse(bad, START, str(MODELS / "llama.py"))
    cfg = str(ROOT / CONFIG)
    assert dict(query.parse({"arg.remat_save": ["context,out_proj"]}, AnalyzeOptions(), cfg).model_args) == \
        {"remat_save": "context,out_proj"}   # a list of the decoder's checkpoint names


def test_the_picker_lists_shipped_configs_and_models_under_the_start_and_refuses_outside(app, tmp_path):
    status, m = get(app, "/api/models")
    assert status == 200 and m["current"] == LLAMA and m["root"] == os.path.realpath(ROOT)
    assert {s["label"] for s in m["shipped"]} >= {"Llama-3.1-8B", "Qwen2.5-7B"}
    found = {f["path"]: f["kind"] for f in m["found"]}
    assert found.get("models/llama.py") == "model file"
    outside = tmp_path / "model.py"
    outside.write_text("def workload():\n    pass\n")
    for path in (str(outside), "../x.py", "/etc/passwd"):
        status, body = get(app, f"/api/model?path={path}")
        assert status == 400 and "outside the folder jaxmem explore started in" in body["error"], body
    status, body = get(app, "/api/model?path=README.md")
    assert status == 400 and "neither a model file" in body["error"]
    assert get(app, "/api/controls")[1]["model"] == LLAMA   # a refusal changes nothing


def test_switching_models_keeps_the_server_and_the_options_the_new_model_takes(app):
    get(app, "/api/answer?batch=16")
    assert [p["query"]["batch"] for p in get(app, "/api/points")[1]] == ["16"]
    status, c = get(app, f"/api/model?path={CONFIG}")
    assert status == 200 and c["model"] == CONFIG and c["generation"] == 1
    assert c["context"] == {"tokens": 512, "field": "max_position_embeddings", "arg": "seq_len"}
    assert "arg.preset" not in c["start"] and c["start"]["gpu"] == "h100"   # a config takes no preset; the card stays
    (row,) = get(app, "/api/points")[1]          # the new model's start only: the old points were the old model's
    assert row["command"].startswith(f"jaxmem analyze {CONFIG} ")
    shipped = os.path.relpath(models.shipped()[0], ROOT)   # (named as the listing names it: under the start)
    assert shipped in [s["path"] for s in get(app, "/api/models")[1]["shipped"]]
    status, c = get(app, f"/api/model?path={shipped}")
    assert status == 200 and c["model"] == shipped and c["generation"] == 2
    status, c = get(app, "/api/model?path=models/llama.py")
    assert status == 200 and c["model"] == LLAMA


def _peak_at(seq: int) -> int:
    return 2_000_000 * seq + 3_000 * seq * seq   # memory quadratic in the sequence


def test_the_longest_sequence_search_runs_compares_search_on_the_explorers_pool(monkeypatch):
    monkeypatch.chdir(ROOT)
    base = Report.from_json(json.loads(GOLDEN.read_text()))

    def answer(job):
        seq = dict(job.options.model_args)["seq_len"]
        peak = _peak_at(seq)
        return sweep.Outcome(job, dataclasses.replace(base, per_device_peak_bytes=peak, breakdown={"params": peak}),
                             None, "ok")

    pool = _Pool(answer)
    ex = Explorer(LLAMA, START, jobs=1, seq_arg="seq_len", make_pool=lambda n, executor, address: pool)
    try:
        p = ex.point(dataclasses.replace(START, batch=8, model_args=(("preset", "tiny"), ("seq_len", 256),
                                                                      ("vocab_tiles", 3))))
        out = ex.fit_seq(p)
    finally:
        ex.close()
    budget = base.target.usable_bytes * 0.95
    granule = 384   # lcm(128, vocab_tiles 3): every length tried is one the chunked loss can cut
    want = max(t for t in range(granule, 1 << 20, granule) if _peak_at(t) <= budget)
    assert out["max_seq"] == want and out["arg"] == "seq_len" and out["error"] is None
    assert out["search"]["granule"] == granule and out["search"]["fails_at"]["value"] == want + granule
    tried = [dict(j.options.model_args) for j in pool.started]
    assert all(a["seq_len"] % granule == 0 and a["vocab_tiles"] == 3 and a["preset"] == "tiny" for a in tried)
    assert all(j.options.batch == 8 for j in pool.started)   # at the point's batch


def test_a_sequence_past_the_context_is_a_warning_only_for_a_config_decoder():
    arch = hf.load_arch(ROOT / CONFIG / "config.json")
    model = hf.model.Decoder(arch, hf.model.Opts())
    assert hf.check_context(model, 512) == [] and hf.check_context(model, None) == []
    (w,) = hf.check_context(model, 1024)
    assert w.kind == "past_context" and "max_position_embeddings is 512" in w.message and "1,024" in w.message
    assert hf.check_context(object(), 10**6) == []   # a model file's module: no context to be past


def test_analyze_of_a_config_past_its_context_warns_in_the_report(monkeypatch):
    from jaxmem import cli

    monkeypatch.chdir(ROOT)
    out = CliRunner().invoke(cli.main, ["analyze", CONFIG, "--gpu", "h100", "--arg", "seq_len=1024", "--batch", "2",
                                        "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    kinds = [w["kind"] for w in json.loads(out.output)["warnings"]]
    assert "past_context" in kinds


class _BrokenPool(_Pool):
    """A pool whose outcomes cannot be read: the scheduler's pool raises."""

    def next(self, timeout=None):
        raise OSError("the worker's pipe closed")


def test_a_scheduler_that_fails_answers_every_waiter_with_why_and_never_hangs(monkeypatch):
    monkeypatch.chdir(ROOT)
    ex = Explorer(LLAMA, START, jobs=1, seq_arg="seq_len", make_pool=lambda n, executor, address: _BrokenPool())
    try:
        p = ex.wait(ex.ask(START), timeout=60)
        assert p.status == "error" and "scheduler stopped: OSError: the worker's pipe closed" in p.error
        assert ex.crashed == p.error
        side = ex.runner()
        with pytest.raises((RuntimeError, UserError), match=r"scheduler stopped|moved to another model"):
            side.submit("x", START)
            side.next(timeout=60)
    finally:
        ex.close()
