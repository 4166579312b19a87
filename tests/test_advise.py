"""jaxmem advise: its candidates fit when their printed command runs; the command line of an option set."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shlex

import pytest
from click.testing import CliRunner

from jaxmem.cli import _options, main
from jaxmem.pipeline import AnalyzeOptions, command_line
from jaxmem.plan import advise as advise_mod
from jaxmem.plan import meshes

# The tiny Llama with activations large enough to matter: on one H100 XLA's bytes are 77-86 MiB as given
# (dp, fp32, no remat; jax 0.9-0.12), 12-55 MiB with 8 microbatches, bf16 or full remat; a budget of 70 MiB
# separates them even at the low end of the runtime's ranges (the as-given step does not fit, not tight).
TINY = ["models/llama.py", "--arg", "preset=tiny", "--arg", "seq_len=256", "--batch", "8", "--gpu", "h100",
        "--mesh", "data=1", "--layout", "dp"]
FRACTION = "0.000864"
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    import os

    old = os.environ.get("JAXMEM_CACHE")
    os.environ["JAXMEM_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("JAXMEM_CACHE")
    else:
        os.environ["JAXMEM_CACHE"] = old


def _run(args):
    return CliRunner().invoke(main, args)


@pytest.fixture(scope="module")
def advice(cache):
    res = _run(["advise", *TINY, "--mem-fraction", FRACTION, "--changes", "precision,remat,accum", "--jobs", "1",
                "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_every_candidate_advise_prints_as_fitting_fits_when_its_command_runs(advice):
    assert advice["original"]["fits"] is False
    fitting = [c for c in advice["candidates"] if c["fits"]]
    assert len(fitting) >= 1 and advice["fitting"] == len(fitting)
    for c in fitting:
        args = shlex.split(c["command"])
        assert args[:2] == ["jaxmem", "analyze"]
        res = _run([*args[1:], "--json"])
        assert res.exit_code == 0, (c["command"], res.output)  # exit 0: it fits
        rep = json.loads(res.stdout)
        assert rep["fits"] is True
        assert rep["per_device_peak_bytes"] == c["per_device_peak_bytes"]
        assert rep["step_time"]["estimate_s"] == c["step_time_estimate_s"]


def test_fitting_candidates_are_ranked_by_estimated_step_time_relative_to_the_original(advice):
    fitting = [c for c in advice["candidates"] if c["fits"]]
    times = [c["step_time_estimate_s"] for c in fitting]
    assert times == sorted(times)
    base = advice["original"]["step_time_estimate_s"]
    for c in fitting:
        assert c["relative_step_time"] == pytest.approx(c["step_time_estimate_s"] / base, rel=1e-12)
        # a fitting change has headroom at the estimate, or is tight: it fits at the low end of the runtime's ranges
        assert c["headroom_bytes"] >= 0 or c["verdict"] == "tight"
        assert c["verdict"] in ("fits", "tight")
    # the candidates that fit all come before those that do not
    flags = [c["fits"] for c in advice["candidates"]]
    assert flags == sorted(flags, reverse=True)


def test_none_fits_exits_3_and_names_the_closest(cache):
    res = _run(["advise", *TINY, "--mem-fraction", "0.0006", "--changes", "precision", "--jobs", "1", "--json"])
    assert res.exit_code == 3, res.output
    out = json.loads(res.stdout)
    assert out["fitting"] == 0 and out["closest"] is not None
    done = [c for c in out["candidates"] if c["per_device_peak_bytes"] is not None]
    assert out["closest"]["per_device_peak_bytes"] == min(c["per_device_peak_bytes"] for c in done)


def test_analyze_that_does_not_fit_points_to_advise_with_the_same_options(cache):
    res = _run(["analyze", *TINY, "--mem-fraction", FRACTION, "--no-explain"])
    assert res.exit_code == 3, res.output
    want = command_line("models/llama.py", _options_from(["analyze", *TINY, "--mem-fraction", FRACTION]), "advise")
    lines = [line for line in res.output.splitlines() if "jaxmem advise" in line]
    assert len(lines) == 1 and want in lines[0]


def _options_from(argv: list[str]) -> AnalyzeOptions:
    """The AnalyzeOptions the CLI builds from an `analyze` command line."""
    cmd = main.commands["analyze"]
    return _options(dict(cmd.make_context("analyze", list(argv[1:])).params))


def test_axes_of_change_keep_the_global_batch():
    base = AnalyzeOptions(mesh="data=8", layout="dp", precision="fp32", remat="none")
    ax = advise_mod.axes(base, 64)
    assert ax["layout"] == [("fsdp", "data=8"), ("fsdp_tp", "data=4,model=2")]
    assert ax["precision"] == ["bf16"]
    assert ax["remat"] == ["dots_saveable", "dots_with_no_batch_dims_saveable", "full"]
    assert ax["accum"] == [2, 4, 8]          # 64 = 8 devices x 8 samples: at most 8 microbatches of one
    assert ax["devices"] == ["data=16"]
    assert ax["offload"] == ["optimizer"]
    assert ax["lora"] == [(16, None), (16, "nf4")]   # LoRA, then QLoRA on an nf4 base
    # already the most sharded, bf16 and fully rematerialized: only microbatches and devices remain
    done = advise_mod.axes(dataclasses.replace(base, layout="fsdp_tp", mesh="data=4,model=2", precision="bf16",
                                               remat="full"), 64)
    assert done["layout"] == [] and done["precision"] == [] and done["remat"] == []
    assert done["accum"] == [2, 4, 8, 16]
    # a LoRA fine-tune as given is not offered LoRA again
    assert advise_mod.axes(dataclasses.replace(base, lora_rank=8), 64)["lora"] == []
    opts = advise_mod._apply(base, (("layout", ("fsdp_tp", "data=4,model=2")), ("devices", "data=16")))
    assert (opts.layout, opts.mesh) == ("fsdp_tp", "data=8,model=2")


def test_activation_offload_is_a_candidate_when_activations_dominate_and_the_host_has_room():
    import types

    base = AnalyzeOptions(mesh="data=8", layout="fsdp", precision="bf16", remat="none", gpu="h100")

    def report(acts, peak, host=None, gpu="h100"):
        return types.SimpleNamespace(target=types.SimpleNamespace(gpu=gpu, hosts=1), host=host or {},
                                     breakdown={"activations_and_temporaries": acts}, per_device_peak_bytes=peak,
                                     step_time={}, sequence_length=None, logical_names=())

    ladder = ["dots_saveable", "dots_with_no_batch_dims_saveable", "offload_dots", "full"]
    assert advise_mod.axes(base, 64, report(60, 100))["remat"] == ladder
    # activations are not most of the peak; the host is full; a card without a reference host; already full remat
    assert "offload_dots" not in advise_mod.axes(base, 64, report(40, 100))["remat"]
    assert "offload_dots" not in advise_mod.axes(base, 64, report(60, 100, {"optimizer_state": 2**40}))["remat"]
    assert "offload_dots" not in advise_mod.axes(base, 64, report(60, 100, gpu="rtx-a6000"))["remat"]
    assert advise_mod.axes(dataclasses.replace(base, remat="full"), 64, report(60, 100))["remat"] == []


def test_fp8_is_a_precision_candidate_only_on_cards_with_fp8_tensor_cores_and_never_beside_lora():
    base = AnalyzeOptions(mesh="data=8", layout="fsdp", precision="fp32", remat="none")
    on = {g: advise_mod.axes(dataclasses.replace(base, gpu=g), 64)["precision"] for g in ("h100", "gb200", "a100-80g")}
    assert on == {"h100": ["bf16", "fp8"], "gb200": ["bf16", "fp8"], "a100-80g": ["bf16"]}
    assert advise_mod.axes(dataclasses.replace(base, gpu="h100", precision="bf16"), 64)["precision"] == ["fp8"]
    assert advise_mod.axes(dataclasses.replace(base, gpu="h100", lora_rank=8), 64)["precision"] == ["bf16"]
    # a combination of LoRA and fp8 is never compiled (analyze refuses it)
    assert advise_mod._apply(base, (("precision", "fp8"), ("lora", (16, None)))) is None
    assert advise_mod._apply(base, (("precision", "fp8"),)).precision == "fp8"


def test_round_two_compiles_a_combination_that_differs_from_a_probe_only_in_offload():
    """The "already compiled" key is the whole option set: (bf16 + offload) is not (bf16) compiled again."""
    import types

    compiled = []

    def fake_report(o: AnalyzeOptions):
        # state 60 (halved by offload), activations 40 (halved by bf16): only both together fit in 60
        state = 30 if o.offload else 60
        acts = 20 if o.precision == "bf16" else 40
        peak = state + acts
        return types.SimpleNamespace(
            per_device_peak_bytes=peak, breakdown={"activations_and_temporaries": acts}, fits=peak <= 60,
            headroom_bytes=60 - peak, step_time={"available": True, "estimate_s": 1.0}, options={"batch": 8},
            target=types.SimpleNamespace(usable_bytes=60))

    def runner(jobs):
        compiled.extend(o for _, o in jobs)
        return [(fake_report(o), None, "ok", False) for _, o in jobs]

    base = AnalyzeOptions(gpu="a100-80g", mesh="data=1", layout="dp", precision="fp32")   # no fp8 probe on an A100
    adv = advise_mod.advise("models/llama.py", base, runner=runner, changes=("precision", "offload"),
                            progress=False)
    both = [c for c in adv.candidates if dict(c.changes) == {"precision": "bf16", "offload": "optimizer"}]
    assert len(both) == 1 and both[0].round == 2 and both[0].fits
    assert any(o.precision == "bf16" and o.offload == "optimizer" for o in compiled)
    # and nothing is compiled twice
    assert len(compiled) == len(set(compiled)) == 4   # the original, two probes, the combination


def test_a_row_is_labelled_with_the_mesh_its_command_compiles():
    """A context-parallel change combined with more devices runs the combined mesh: the label says so
    (it once named the context probe's mesh and the devices' mesh, neither of which the command ran)."""
    base = AnalyzeOptions(mesh="fsdp=4", layout="fsdp", precision="bf16", remat="none")
    changes = (("context", "fsdp=2,context=2"), ("devices", "fsdp=8"))
    opts = advise_mod._apply(base, changes)
    label = advise_mod.Candidate(changes, opts).label
    assert opts.mesh == "fsdp=4,context=2"
    assert label.count(f"(mesh {opts.mesh})") == 2 and "fsdp=2,context=2" not in label and "mesh fsdp=8)" not in label
    assert f"--mesh {opts.mesh}" in command_line("m.py", opts)


def test_rows_whose_step_time_bands_overlap_are_tied():
    from jaxmem.compiler.steptime import tied_with

    bands = [(1.0, 0.95, 1.05), (1.04, 1.0, 1.1), (1.5, 1.4, 1.6), None, (1.55, 1.45, 1.65)]
    assert tied_with(bands) == [None, 0, None, None, 2]


def test_advise_searches_meshes_in_the_models_own_axis_names_with_their_roles():
    """--axis-roles (API axis_roles=): the candidates' meshes keep the model's axis names, a role's axis the
    mesh has at size 1 (tunix's tp=1, EasyDeL's sp=1) is grown in its own name, and each candidate's
    options carry the roles its command needs."""
    base = AnalyzeOptions(mesh="rows=8,cols=1,seq=1", axis_roles="rows=fsdp,cols=tensor,seq=context",
                          layout="fsdp", precision="fp32", remat="none")
    ax = advise_mod.axes(base, 64)
    assert ax["devices"] == ["rows=16,cols=1,seq=1"]
    assert ax["layout"] == [("fsdp_tp", "rows=4,cols=2,seq=1")]   # the model's tensor axis, not a new model=2
    assert meshes.carve(base.mesh, "context", 2, base.axis_roles) == "rows=4,cols=1,seq=2"
    assert meshes.carve(base.mesh, "expert", 2, base.axis_roles) == "rows=4,cols=1,seq=1,expert=2"
    opts = advise_mod._apply(base, (("layout", ("fsdp_tp", "rows=4,cols=2,seq=1")),
                                    ("devices", "rows=16,cols=1,seq=1")))
    assert (opts.mesh, opts.axis_roles) == ("rows=8,cols=2,seq=1", "rows=fsdp,cols=tensor,seq=context")
    assert "--axis-roles rows=fsdp,cols=tensor,seq=context" in command_line("m.py", opts)
    hsdp = meshes.hsdp("rows=16,cols=1", 2, "rows=fsdp,cols=tensor")
    assert hsdp == "data=2,rows=8,cols=1" and meshes.roles_for("rows=fsdp,cols=tensor", hsdp) == "rows=fsdp,cols=tensor"


def test_advise_cli_takes_axis_roles_and_its_candidates_compile_in_the_models_axes(cache):
    model = str(FIXTURES / "trainers" / "own_axes.py")
    res = _run(["advise", model, "--gpu", "h100", "--mesh", "rows=2,cols=1", "--axis-roles", "rows=fsdp,cols=tensor",
                "--all", "--changes", "devices,layout", "--jobs", "1", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    cands = {c["label"]: c for c in d["candidates"]}
    assert {c["status"] for c in cands.values()} == {"ok"}, cands
    meshes_run = {shlex.split(c["command"])[shlex.split(c["command"]).index("--mesh") + 1] for c in cands.values()}
    assert {"rows=4,cols=1", "rows=1,cols=2"} <= meshes_run   # twice the devices; the model's tensor axis grown
    assert all({a.split("=")[0] for a in m.split(",")} == {"rows", "cols"} for m in meshes_run), meshes_run
    assert all("--axis-roles rows=fsdp,cols=tensor" in c["command"] for c in cands.values())
