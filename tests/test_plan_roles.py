"""compare and advise with mesh roles: meshes as a grid axis, the fit searches on every role, advise's
HSDP / context / expert changes on the same GPUs, ranked before plans that need more GPUs."""

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from conftest import MODELS

import jaxmem
from jaxmem import cli
from jaxmem.pipeline import AnalyzeOptions
from jaxmem.plan import advise, meshes

LLAMA, MOE = MODELS / "llama.py", MODELS.parent / "tests" / "fixtures" / "moe_tiny.py"


def test_mesh_rewrites_keep_the_gpus_or_grow_the_first_batch_axis():
    assert meshes.hsdp("data=32", 4) == "data=4,fsdp=8"          # FSDP over data, renamed and split
    assert meshes.hsdp("data=2,fsdp=16", 2) == "data=4,fsdp=8"
    assert meshes.hsdp("fsdp=8", 1) is None                       # one host: nothing to keep off the network
    assert meshes.carve("data=8", "context", 2) == "data=4,context=2"
    assert meshes.carve("fsdp=8", "expert", 4) == "fsdp=2,expert=4"
    assert meshes.carve("fsdp=4,context=2", "context", 2) is None
    assert meshes.scale_data("fsdp=4,context=2", 2) == "fsdp=8,context=2"
    assert meshes.with_data_size("fsdp=4,context=2", 16) == "fsdp=16,context=2"
    assert meshes.other_batch("data=2,fsdp=4,context=2") == 4


def _report(**kw):
    base = {"step_time": {"available": False}, "target": SimpleNamespace(hosts=1, devices=8),
            "sequence_length": None, "breakdown": {"activations_and_temporaries": 0}, "per_device_peak_bytes": 1,
            "logical_names": ()}
    return SimpleNamespace(**{**base, **kw})


def test_hsdp_is_proposed_when_fsdps_collectives_over_the_network_dominate():
    opts = AnalyzeOptions(mesh="fsdp=32", hosts=4, layout="fsdp")
    coll = [{"kind": "all-gather", "link": "network", "time_s": 3.0}, {"kind": "reduce-scatter", "link": "network",
                                                                       "time_s": 2.0}]
    slow = _report(step_time={"available": True, "compute_s": 4.0, "memory_s": 1.0, "collectives": coll},
                   target=SimpleNamespace(hosts=4, devices=32))
    assert advise.mesh_changes(opts, slow)["hsdp"] == ["data=4,fsdp=8"]
    fast = _report(step_time={"available": True, "compute_s": 6.0, "memory_s": 1.0, "collectives": coll},
                   target=SimpleNamespace(hosts=4, devices=32))
    assert advise.mesh_changes(opts, fast)["hsdp"] == []   # 5 s of network < 6 s of compute: not dominant


def test_context_is_proposed_when_activations_dominate_at_a_long_sequence():
    opts = AnalyzeOptions(mesh="data=2,fsdp=4")
    long = _report(sequence_length=4096, breakdown={"activations_and_temporaries": 60}, per_device_peak_bytes=100)
    assert advise.mesh_changes(opts, long)["context"] == ["data=1,fsdp=4,context=2", "data=2,fsdp=1,context=4"]
    short = _report(sequence_length=512, breakdown={"activations_and_temporaries": 60}, per_device_peak_bytes=100)
    assert advise.mesh_changes(opts, short)["context"] == []
    state_bound = _report(sequence_length=4096, breakdown={"activations_and_temporaries": 40},
                          per_device_peak_bytes=100)
    assert advise.mesh_changes(opts, state_bound)["context"] == []


def test_expert_parallelism_is_proposed_for_a_model_with_experts():
    opts = AnalyzeOptions(mesh="fsdp=8")
    assert advise.mesh_changes(opts, _report(logical_names=("embed", "exp", "mlp")))["expert"] == [
        "fsdp=4,expert=2", "fsdp=2,expert=4", "fsdp=1,expert=8"]
    assert advise.mesh_changes(opts, _report(logical_names=("embed", "mlp")))["expert"] == []


def test_pipeline_meshes_take_the_stages_from_the_replicas_or_add_gpus():
    assert meshes.pipelined("data=8", 2) == ["stage=2,data=4", "stage=2,data=8"]
    assert meshes.pipelined("data=4", 4) == ["stage=4", "stage=4,data=4"]      # the replicas all become stages
    assert meshes.pipelined("fsdp=8", 4) == ["stage=4,fsdp=8"]                 # FSDP keeps its devices: 4x the GPUs
    assert meshes.pipelined("stage=2,fsdp=4", 2) == []


def test_pipeline_is_proposed_when_the_state_is_most_of_the_peak():
    opts = AnalyzeOptions(mesh="data=8", layout="dp")
    heavy = _report(breakdown={"params": 30, "optimizer_state": 40, "gradients": 0, "activations_and_temporaries": 20,
                               "runtime_overhead": 10}, per_device_peak_bytes=100)
    assert advise.mesh_changes(opts, heavy)["pipeline"] == ["stage=2,data=4", "stage=2,data=8", "stage=4,data=2",
                                                             "stage=4,data=8"]
    light = _report(breakdown={"params": 10, "optimizer_state": 20, "gradients": 0, "activations_and_temporaries": 60,
                               "runtime_overhead": 10}, per_device_peak_bytes=100)
    assert advise.mesh_changes(opts, light)["pipeline"] == []


def test_advise_proposes_pipeline_stages_that_compile_and_fit():
    """Replicas hold the whole state: stages from them split the stacked layers' state (the compiled number)."""
    r = CliRunner().invoke(cli.main, ["advise", str(MODELS / "llama.py"), "--arg", "preset=tiny", "--arg",
                                      "n_layers=8", "--arg", "d_model=256", "--arg", "ffn_dim=1024", "--mesh",
                                      "data=8", "--layout", "dp", "--batch", "16", "--gpu", "rtx-a6000",
                                      "--mem-fraction", "0.0029", "--changes", "pipeline", "--jobs", "1", "--json"])
    d = json.loads(r.output)
    fits = [c for c in d["candidates"] if c["fits"]]
    assert fits and all(list(c["changes"]) == ["pipeline"] for c in fits), r.output
    assert any("stage=4,data=2" in c["command"] for c in fits)
    assert fits[0]["per_device_peak_bytes"] < d["original"]["per_device_peak_bytes"]


def test_two_mesh_changes_contradict():
    base = AnalyzeOptions(mesh="data=8")
    assert advise._apply(base, (("context", "data=4,context=2"), ("expert", "data=4,expert=2"))) is None
    opts = advise._apply(base, (("context", "data=4,context=2"), ("devices", "data=16")))
    assert opts.mesh == "data=8,context=2"


def _cand(devices, step_s):
    rep = SimpleNamespace(fits=True, headroom_bytes=0, per_device_peak_bytes=1, target=SimpleNamespace(devices=devices),
                          step_time={"available": True, "estimate_s": step_s})
    return advise.Candidate((("x", devices, step_s),), AnalyzeOptions(), rep, adds_gpus=max(devices - 8, 0))


def test_plans_on_the_gpus_as_given_rank_before_faster_plans_on_more():
    ranked = advise._rank([_cand(16, 1.0), _cand(8, 3.0), _cand(8, 2.0)], devices=8)
    assert [(c.report.target.devices, c.step_s) for c in ranked] == [(8, 2.0), (8, 3.0), (16, 1.0)]
    assert [c.gpu_seconds for c in ranked] == [16.0, 24.0, 16.0]


def test_compare_takes_meshes_with_roles():
    rows = jaxmem.compare(LLAMA, args={"preset": "tiny"}, gpu="h100", batch=16, explain=False, jobs=1,
                          meshes=["fsdp=8", "data=2,fsdp=4", "fsdp=4,context=2"])
    params = {c.choice["mesh"]: c.report.breakdown["params"] for c in rows}
    assert params["fsdp=8"] * 8 == params["data=2,fsdp=4"] * 4 == params["fsdp=4,context=2"] * 4


def test_advise_tries_expert_parallelism_on_a_moe_and_prints_gpu_seconds():
    r = CliRunner().invoke(cli.main, ["advise", str(MOE), "--gpu", "h100", "--mesh", "fsdp=8", "--all",
                                      "--changes", "expert", "--jobs", "1", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    got = {c["changes"]["expert"]["mesh"]: c for c in d["candidates"]}
    assert set(got) == {"fsdp=4,expert=2", "fsdp=2,expert=4", "fsdp=1,expert=8"}
    for c in got.values():
        assert c["status"] == "exact" and c["devices"] == 8
        assert c["gpu_seconds_per_step"] == pytest.approx(8 * c["step_time_estimate_s"], rel=1e-12)
