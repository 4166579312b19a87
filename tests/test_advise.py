"""jaxmem advise: its candidates fit when their printed command runs; the command line of an option set."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import shlex
import types

import pytest
from click.testing import CliRunner
from rich.console import Console

from jaxmem.cli import _options, main
from jaxmem.pipeline import AnalyzeOptions, command_line
from jaxmem.plan import advise as advise_mod
from jaxmem.plan import meshes
from jaxmem.plan import runner as runner_mod
from jaxmem.present import notebook, render

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


def _run(args, env=None):
    return CliRunner().invoke(main, args, env=env)


def _run_command(command: str):
    """A printed command run as a shell would: its VAR=value words in front are its environment."""
    words = shlex.split(command)
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    assert words[:2] == ["jaxmem", "analyze"], command
    return _run([*words[1:], "--json"], env)


class FakeRunner:
    """jaxmem.plan.runner's interface over a function of the options (report, error, status): no compile."""

    def __init__(self, fn):
        self.fn, self.queue, self.compiled = fn, [], []

    def submit(self, key, options, tag=None):
        t = runner_mod.Ticket(key, options, tag)
        self.queue.append(t)
        return t

    def next(self, timeout=None):
        if not self.queue:
            return None
        t = self.queue.pop(0)
        self.compiled.append(t.options)
        rep, err, status = self.fn(t.options)
        return runner_mod.Landed(t, runner_mod.Outcome(runner_mod.Job(t.key, "m.py", t.options), rep, err, status, 1.0))

    def cancel(self, ticket):
        return False

    def progress(self):
        return runner_mod.Progress(len(self.compiled), len(self.queue), 1.0, 2)

    def close(self):
        pass


def _fake(peak, acts, step_s=1.0, usable=60, batch=8, devices=1, timings=None, memory=None, params=0):
    return types.SimpleNamespace(
        per_device_peak_bytes=peak, breakdown={"activations_and_temporaries": acts, "params": params},
        fits=peak <= usable,
        headroom_bytes=usable - peak, step_time={"available": True, "estimate_s": step_s}, options={"batch": batch},
        target=types.SimpleNamespace(usable_bytes=usable, devices=devices, memory_bytes=memory, gpu="a100-80g",
                                     description="a fake card", usable_note="a fake pool"), model="fake",
        timings=timings or {}, sequence_length=None, warnings=(), verdict=None)


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
    assert all(c["status"] == "exact" for c in advice["candidates"])   # the final list: compiled rows only
    for c in fitting:
        res = _run_command(c["command"])
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


def test_a_combination_that_differs_from_a_probe_only_in_offload_is_compiled_once():
    """The "already compiled" key is the whole option set: (bf16 + offload) is not (bf16) compiled again."""

    def fn(o: AnalyzeOptions):
        # state 60 (halved by offload), activations 40 (halved by bf16): only both together fit in 60
        state = 30 if o.offload else 60
        acts = 20 if o.precision == "bf16" else 40
        return _fake(state + acts, acts), None, "ok"

    run = FakeRunner(fn)
    base = AnalyzeOptions(gpu="a100-80g", mesh="data=1", layout="dp", precision="fp32")   # no fp8 probe on an A100
    adv = advise_mod.advise("models/llama.py", base, runner=run, changes=("precision", "offload"), progress=False)
    both = [c for c in adv.candidates if dict(c.changes) == {"precision": "bf16", "offload": "optimizer"}]
    assert len(both) == 1 and both[0].round == 2 and both[0].fits
    assert len(run.compiled) == len(set(run.compiled)) == 4   # the original, two probes, the combination


def test_the_search_stops_when_no_plan_left_can_beat_the_best_compiled_one():
    """Remat full fits and is 10% slower; dots_saveable fits and is 1% slower; bf16 is 2x slower on this fake card
    (its prior says 2x faster): once the singles landed no combination can beat the best of them."""

    def fn(o: AnalyzeOptions):
        acts = {"none": 40, "dots_saveable": 10, "full": 5}.get(o.remat, 40) * (0.5 if o.precision == "bf16" else 1)
        t = {"none": 1.0, "dots_saveable": 1.01, "full": 1.1}.get(o.remat, 1.0) * (2 if o.precision == "bf16" else 1)
        return _fake(40 + acts, acts, t), None, "ok"

    run = FakeRunner(fn)
    updates = []
    base = AnalyzeOptions(gpu="a100-80g", mesh="data=1", layout="dp", precision="fp32", remat="none")
    adv = advise_mod.advise("models/llama.py", base, runner=run, changes=("precision", "remat"), progress=False,
                            on_update=updates.append)
    assert adv.fitting[0].changes == (("remat", "dots_saveable"),)
    # bf16's probe lands 2x slower: no combination with it can beat remat alone, and none is compiled
    assert any(o.precision == "bf16" for o in run.compiled)
    assert not any(o.precision == "bf16" and o.remat != "none" for o in run.compiled)
    # while it runs: a ranked list, each row predicted or exact, with how far it is
    first = updates[0].to_json()
    assert first["done"] is False and first["candidates"]
    assert {r["status"] for r in first["candidates"]} == {"predicted"}
    assert first["progress"]["text"].startswith("0 of ") and " compiled" in first["progress"]["text"]
    assert {r["status"] for r in updates[-1].to_json()["candidates"]} <= {"exact", "predicted"}
    assert adv.to_json()["done"] is True


def test_a_memory_fraction_and_accumulation_that_fit_only_together_are_found():
    """The issue's miss: --accum 4 alone (18.25 of 17.99 GiB) and a 0.9 fraction alone (25.48 of 21.59 GiB) do not
    fit; together they do. Here in MiB on a 24 GiB card: the combination is compiled, fits, and its command sets
    the fraction in front of `jaxmem analyze`."""
    card = 24 * 1024

    def fn(o: AnalyzeOptions):
        acts = 10000 // o.accum + (300 if o.accum > 1 else 0)
        usable = int(card * (o.mem_fraction or 0.75))
        return _fake(16000 + acts, acts, 1.0 + 0.02 * o.accum, usable=usable, batch=4, memory=card), None, "ok"

    run = FakeRunner(fn)
    base = AnalyzeOptions(gpu="rtx-4090", mesh="data=1", layout="fsdp", precision="bf16", remat="full", batch=4)
    adv = advise_mod.advise("m.py", base, runner=run, changes=("fraction", "accum"), progress=False)
    got = {tuple(c.changes): c for c in adv.fitting}
    assert any(dict(ch).get("accum") and dict(ch).get("fraction") for ch in got), [c.label for c in adv.candidates]
    assert not any(len(ch) == 1 for ch in got)   # neither alone fits
    both = next(c for ch, c in got.items() if len(ch) == 2)
    assert both.command("m.py").startswith(f"XLA_PYTHON_CLIENT_MEM_FRACTION={dict(both.changes)['fraction']} jaxmem "
                                           "analyze m.py") and "--mem-fraction" not in both.command("m.py")


def test_a_plan_on_more_gpus_says_how_many_it_needs_and_is_listed_apart():
    base = AnalyzeOptions(gpu="rtx-4090", mesh="data=1", layout="fsdp", precision="bf16", remat="full")
    opts = advise_mod._apply(base, (("pipeline", "stage=2,data=1"),))
    c = advise_mod.Candidate((("pipeline", "stage=2,data=1"),), opts, adds_gpus=1)
    assert c.label.startswith("needs 2 GPUs (+1): pipeline parallelism over 2 stages")

    def fn(o: AnalyzeOptions):
        n = meshes.layouts.mesh_size(o.mesh)
        return _fake(100 // n + 10, 10, 1.0 / n * 1.2, devices=n, params=100 // n), None, "ok"

    adv = advise_mod.advise("m.py", dataclasses.replace(base, batch=8), runner=FakeRunner(fn),
                            changes=("devices",), progress=False)
    assert adv.fitting_more and not adv.fitting_here
    row = adv.to_json()["candidates"][0]
    assert row["section"] == "more_gpus" and row["adds_gpus"] == 1 and row["label"].startswith("needs 2 GPUs (+1)")
    console = Console(record=True, width=300)
    render.render_advice(adv, console)
    text = console.export_text()
    assert "plans that fit only with more GPUs" in text and "plans that fit on the 1 GPU as given" not in text


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
    assert {c["status"] for c in cands.values()} == {"exact"}, cands
    meshes_run = {shlex.split(c["command"])[shlex.split(c["command"]).index("--mesh") + 1] for c in cands.values()}
    assert {"rows=4,cols=1", "rows=1,cols=2"} <= meshes_run   # twice the devices; the model's tensor axis grown
    assert all({a.split("=")[0] for a in m.split(",")} == {"rows", "cols"} for m in meshes_run), meshes_run
    assert all("--axis-roles rows=fsdp,cols=tensor" in c["command"] for c in cands.values())


# ---------------------------------------------------------------- the free fixes first (issue 46)

WIDE = str(FIXTURES / "wide_lora.py")   # wide dense layers: a LoRA step whose frozen base is most of the memory


def test_advise_tries_the_free_fixes_and_the_lora_base_ladder_in_order(monkeypatch):
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    base = AnalyzeOptions(mesh="data=1", layout="fsdp", precision="fp32", remat="none", lora_rank=16, gpu="rtx-4090")
    ax = advise_mod.axes(base, 8, takes=lambda name: name == "attention")
    assert list(ax) == list(advise_mod.CHANGES)                 # free fixes first, more devices last
    assert next(iter(ax)) == "fraction" and list(ax)[-1] == "devices"
    assert ax["fraction"] == [0.9, 0.95]                         # above JAX's default 75%
    assert ax["attention"] == ["cudnn"] and ax["loss"] == []    # only what the model takes
    # a config.json decoder at its default attention (auto: cuDNN wherever it takes the step at bf16), or a step
    # whose compiled attention is cuDNN already, is not compiled again with --arg attention=cudnn
    seen = {"target": types.SimpleNamespace(gpu="rtx-4090"), "breakdown": {}, "per_device_peak_bytes": 1, "options": {},
            "step_time": {}}
    config = types.SimpleNamespace(hf_config={"model_type": "llama"}, choices={"attention": "xla"}, **seen)
    compiled_cudnn = types.SimpleNamespace(hf_config={}, choices={"attention": "cudnn"}, **seen)
    for report in (config, compiled_cudnn):
        assert advise_mod.axes(base, 8, report, takes=lambda name: name == "attention")["attention"] == []
    assert ax["base"] == ["bf16", "int8", "nf4"]                # the LoRA base, largest to smallest
    assert advise_mod.axes(dataclasses.replace(base, base_dtype="int8"), 8)["base"] == ["nf4"]
    assert advise_mod.axes(dataclasses.replace(base, lora_rank=0), 8)["base"] == []
    # a share the user states is theirs; an environment fraction above both leaves nothing to raise
    assert advise_mod.axes(dataclasses.replace(base, mem_fraction=0.5), 8)["fraction"] == []
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    assert advise_mod.axes(base, 8)["fraction"] == [0.95]


def test_bf16_moments_are_tried_only_for_an_optimizer_jaxmem_builds_with_moments():
    base = AnalyzeOptions(mesh="data=1", layout="fsdp", precision="bf16", gpu="rtx-4090")
    assert advise_mod.axes(dataclasses.replace(base, optimizer="adamw"), 8)["moments"] == ["bf16"]
    assert advise_mod.axes(dataclasses.replace(base, optimizer="sgd"), 8)["moments"] == []
    assert advise_mod.axes(dataclasses.replace(base, optimizer="adamw", moment_dtype="bf16"), 8)["moments"] == []
    def report(optimizer):   # what the step as given names its optimizer
        return types.SimpleNamespace(options={"optimizer": optimizer}, step_time={}, breakdown={},
                                     per_device_peak_bytes=1, target=types.SimpleNamespace(gpu="rtx-4090", hosts=1))

    assert advise_mod.axes(base, 8, report("workload's own"))["moments"] == []
    assert advise_mod.axes(base, 8, report("adamw"))["moments"] == ["bf16"]


def test_changes_that_need_bf16_compute_bring_it_and_say_so():
    base = AnalyzeOptions(mesh="data=1", layout="fsdp", precision="fp32", lora_rank=16, model_args=(("width", 8),))
    cudnn = advise_mod._apply(base, (("attention", "cudnn"),))
    assert cudnn.precision == "bf16" and dict(cudnn.model_args) == {"width": 8, "attention": "cudnn"}
    assert advise_mod._apply(base, (("base", "bf16"),)).precision == "bf16"
    assert advise_mod._apply(base, (("base", "nf4"),)).precision == "fp32"      # QLoRA computes in fp32 as asked
    assert dict(advise_mod._apply(base, (("loss", 8),)).model_args)["vocab_tiles"] == 8


    def fn(o: AnalyzeOptions):   # the step as given compiles; the model refuses the loss change
        if dict(o.model_args).get("vocab_tiles"):
            return None, "workload() has no argument 'vocab_tiles'", "user_error"
        return _fake(100, 40, 2.0 if o.precision == "fp32" else 1.0), None, "ok"

    adv = advise_mod.advise(str(FIXTURES / "hf" / "llama"), dataclasses.replace(base, gpu="a100-80g"),
                            runner=FakeRunner(fn), changes=("attention", "loss"), progress=False)
    by = {c.changes[0][0]: c for c in adv.candidates}
    assert by["attention"].label == "cuDNN flash attention (--arg attention=cudnn), with the bf16 compute it needs"
    # a change the model refuses is not applicable, with the reason; never a user error
    assert by["loss"].status == "not_applicable"
    assert by["loss"].error == "not applicable: workload() has no argument 'vocab_tiles'"


def test_model_arguments_are_read_from_the_workload_signature_without_importing_it(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("raise SystemExit('imported')\ndef workload(width=1, attention='xla'):\n    pass\n")
    takes = advise_mod.model_takes(str(f))
    assert takes("attention") and not takes("vocab_tiles")
    f.write_text("def workload(preset='tiny', **overrides):\n    pass\n")
    assert advise_mod.model_takes(str(f))("vocab_tiles")          # **kwargs: the probe decides
    assert advise_mod.model_takes(str(FIXTURES / "hf" / "llama"))("attention")   # the config.json decoder's


def _advise_wide(changes, **kw):
    base = AnalyzeOptions(mesh="data=1", layout="fsdp", precision="fp32", remat="none", lora_rank=16, gpu="rtx-4090",
                          **kw)
    return advise_mod.advise(WIDE, base, n_jobs=1, progress=False, changes=changes)


def _seq_len_just_missing(lo: int, hi: int, **model_args) -> int:
    """The shortest sequence length, in steps of 64 between `lo` (fits) and `hi` (does not), at which the wide LoRA
    step (batch 1, _advise_wide's options) misses the 4090's usable memory at JAX's default fraction. Bisected:
    near the pool's limit XLA rematerializes to stay under it (the run's program: XLA budgets from the pool), so
    the peak is not affine in the sequence length there."""
    from jaxmem.pipeline import analyze_file

    def fits(seq: int) -> bool:
        opts = AnalyzeOptions(mesh="data=1", layout="fsdp", precision="fp32", remat="none", lora_rank=16,
                              gpu="rtx-4090", batch=1, model_args=(*model_args.items(), ("seq_len", seq)))
        return bool(analyze_file(WIDE, opts).fits)

    assert fits(lo) and not fits(hi)
    while hi - lo > 64:
        mid = (lo + hi) // 128 * 64
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return hi


def test_a_lora_step_missing_by_a_hundred_mib_at_jaxs_default_fraction_is_told_the_fraction(cache, monkeypatch):
    """The report: a LoRA step that missed by 95 MiB at JAX's 75% was told to shrink its batch of 1. Here:
    4 x 32768^2 frozen fp32 weights (16 GiB) on a 4090 just miss at 0.75, XLA rematerializing to stay under the
    pool (the run's program); a larger fraction alone runs the step, XLA compiling it against the larger pool (no
    slower: it recomputes no more), with the variable to set in front of its command. Every plan that fits
    carries a fraction: the remat policy alone does not fit."""
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    seq = _seq_len_just_missing(1024, 4096, width=32768, depth=4)   # XLA's temporaries differ between jax versions
    adv = _advise_wide(("fraction", "remat"), model_args=(("width", 32768), ("depth", 4), ("seq_len", seq)),
                       batch=1)
    o = adv.original
    assert not o.fits and -2 * 2**30 < o.headroom < 0
    assert adv.fitting and all(dict(c.changes).get("fraction") for c in adv.fitting)
    first = next(c for c in adv.fitting if len(c.changes) == 1)
    (axis, f), = first.changes   # a fraction that holds the peak (from the fraction band's floor, issue 52)
    assert axis == "fraction" and 0.75 < f <= 0.9 and first.step_s <= o.step_s
    assert first.report.target.xla_memory_base_bytes > o.report.target.xla_memory_base_bytes   # XLA's larger pool
    assert first.options.mem_fraction == f
    # the command pastes as it is: the variable in front of it, as the training's environment sets it
    assert first.command(WIDE).startswith(f"XLA_PYTHON_CLIENT_MEM_FRACTION={f} jaxmem analyze ")
    res = _run_command(first.command(WIDE))
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["per_device_peak_bytes"] == first.peak
    (row,) = [r for r in adv.to_json()["candidates"] if r["environment"] == {"XLA_PYTHON_CLIENT_MEM_FRACTION": str(f)}
              and r["rank"] is not None and len(r["changes"]) == 1]
    assert row["tokens_per_s"] == pytest.approx(1 * seq / first.step_s, rel=1e-12)
    # one fraction alone is offered: not a larger one beside it (no plan carries a fraction it does not need)
    assert [c for c in adv.candidates if len(c.changes) == 1 and dict(c.changes).get("fraction")] == [first]
    console = Console(record=True, width=400)
    render.render_advice(adv, console)
    assert f"XLA_PYTHON_CLIENT_MEM_FRACTION={f} jaxmem analyze" in console.export_text()
    assert f"XLA_PYTHON_CLIENT_MEM_FRACTION={f} jaxmem analyze" in notebook.advice_html(adv)   # the notebook's too


def test_a_lora_step_no_single_change_fits_is_fitted_by_a_combination_with_a_smaller_base(cache, monkeypatch):
    """The report: --lora 16 on one 4090, advise said NONE FITS while bf16 + remat + accumulation + an nf4
    base fit; it never changed a LoRA step's base dtype. Here: 25 GiB of frozen fp32 weights and 15 GiB of
    activations; no single change fits, a combination with an int8/nf4 base does, ranked by tokens/s."""
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    adv = _advise_wide(("precision", "accum", "base"),
                       model_args=(("width", 40960), ("depth", 4), ("seq_len", 2048)), batch=8)
    assert not adv.original.fits
    probes = [c for c in adv.candidates if c.round == 1]
    assert probes and not any(c.fits for c in probes)
    assert adv.fits and adv.fitting
    assert all(len(c.changes) >= 2 for c in adv.fitting)
    assert any(dict(c.changes).get("base") in ("int8", "nf4") for c in adv.fitting)
    rows = [r for r in adv.to_json()["candidates"] if r["fits"]]
    tps = [r["tokens_per_s"] for r in rows]
    assert tps == sorted(tps, reverse=True) and rows[0]["rank"] == 1
    assert all(r["rank"] is not None for r in rows)
    assert {c.status for c in adv.candidates} <= {"ok", "not_applicable", "failed"}
    assert {r["status"] for r in adv.to_json()["candidates"]} <= {"exact", "not_applicable", "failed"}


def test_the_explorers_advise_answers_while_it_runs_with_ranked_rows_and_progress():
    """The page's advise panel polls /api/advise: while the search runs its answer carries the latest snapshot
    (rows predicted or exact, "N of M compiled"), then the final advice with every row exact."""
    import threading
    import time

    from jaxmem.explore import server

    gate = threading.Event()

    def fn(o: AnalyzeOptions):
        acts = {"none": 40, "dots_saveable": 10, "full": 5}.get(o.remat, 40)
        return _fake(40 + acts, acts, {"none": 1.0, "dots_saveable": 1.01}.get(o.remat, 1.1)), None, "ok"

    class Held(FakeRunner):   # compiles land only once the test has seen the running answer
        def next(self, timeout=None):
            gate.wait(30)
            return super().next(timeout)

    base = AnalyzeOptions(gpu="a100-80g", mesh="data=1", layout="dp", precision="fp32", remat="none")
    p = types.SimpleNamespace(key="k", command="jaxmem analyze m.py", opts=base, report=fn(base)[0])
    run = Held(fn)
    ex = types.SimpleNamespace(model="models/llama.py", ask=lambda o: p, wait=lambda q: q, runner=lambda: run)
    app = server.App(ex)
    for _ in range(200):
        d = app._background("advice", p, app._advise, False)
        if "advice" in d:
            break
        time.sleep(0.05)
    assert d["status"] == "running" and d["advice"]["done"] is False
    assert {r["status"] for r in d["advice"]["candidates"]} == {"predicted"}
    assert d["advice"]["progress"]["text"].startswith("0 of ")
    gate.set()
    d = app._background("advice", p, app._advise, True)
    assert d["status"] == "done" and d["advice"]["done"] is True
    assert {r["status"] for r in d["advice"]["candidates"]} == {"exact"}


def test_a_fraction_plans_command_runs_as_printed_with_the_variable_in_front(cache, monkeypatch):
    """The tiny Llama under a pool of 0.09% of an H100 (set as a training sets it, in the environment) does not
    fit; advise's fraction plan prints `XLA_PYTHON_CLIENT_MEM_FRACTION=f jaxmem analyze ...`, and that command,
    run with its variable, fits with the peak advise printed."""
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.0009")
    res = _run(["advise", *TINY, "--changes", "fraction", "--jobs", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["original"]["fits"] is False
    fitting = [c for c in out["candidates"] if c["fits"]]
    assert fitting and all(list(c["changes"]) == ["fraction"] for c in fitting)
    for c in fitting:
        f = c["changes"]["fraction"]["mem_fraction"]
        assert c["command"].startswith(f"XLA_PYTHON_CLIENT_MEM_FRACTION={f} jaxmem analyze ")
        assert "--mem-fraction" not in c["command"]
        ran = _run_command(c["command"])
        assert ran.exit_code == 0, (c["command"], ran.output)
        assert json.loads(ran.stdout)["per_device_peak_bytes"] == c["per_device_peak_bytes"]
