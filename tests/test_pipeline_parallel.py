"""Pipeline parallelism (jaxmem/program/pipeline_stages.py): a stage axis in --mesh runs the model's
layer scan as a pipeline jaxmem builds itself. The pipelined loss computes what the model computes;
the stacked layers are split over the stages; the report says the schedule, the stages and what is
in flight; what cannot be pipelined is exit 2 naming what is needed."""
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from jax.sharding import Mesh

from jaxmem.cli import main
from jaxmem.program import pipeline_stages as ps
from jaxmem.program.workload import load_workload

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
LLAMA = ["--arg", "preset=tiny", "--arg", "n_layers=8", "--precision", "bf16", "--remat", "full"]


def _analyze(model, *args):
    r = CliRunner().invoke(main, ["analyze", str(model), "--gpu", "h100", *map(str, args), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def _exit_2(*args) -> str:
    r = CliRunner().invoke(main, ["analyze", *map(str, args), "--gpu", "h100"])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    return " ".join(r.output.split())


# ------------------------------------------------------------------ the pipelined loss is the model's


def _linen(model: str, n_layers: int, **args):
    wl = load_workload(ROOT / "models" / model, preset="tiny", n_layers=n_layers, batch_size=16, **args)
    tokens = jax.random.randint(jax.random.key(1), (16, 32), 0, 256)
    batch = {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1)}
    params = wl.model.init(jax.random.key(0), tokens[:2])

    def loss(p, mut, b, key):
        return wl.loss(wl.model.bind(p), b), {}

    return loss, params, batch


def _run(loss, params, batch, kind, m, r=None, stages=4):
    sched, _ = ps.resolve(kind, stages, m, r, 16, 2, "stage")
    mesh = Mesh(np.array(jax.devices()[:2 * stages]).reshape(stages, 2), ("stage", "fsdp"))
    f = ps.pipelined(loss, sched, mesh, batch_argnum=2)
    with jax.set_mesh(mesh):
        value, grads = jax.jit(jax.value_and_grad(lambda p: f(p, {}, batch, None)[0]))(params)
    return value, grads


def _close(a, b):
    return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.allclose(x, y, rtol=1e-4, atol=1e-6)), a, b)))


@pytest.mark.parametrize("m", [2, 4, 8])
def test_gpipe_loss_and_gradients_equal_the_unpipelined_step(m):
    loss, params, batch = _linen("llama.py", 8)
    want, want_g = jax.value_and_grad(lambda p: loss(p, {}, batch, None)[0])(params)
    got, got_g = _run(loss, params, batch, "gpipe", m)
    assert abs(float(got) - float(want)) <= 1e-5 * abs(float(want))
    assert _close(got_g, want_g)


def test_circular_runs_each_stage_its_own_rows_repeat_by_repeat():
    """Stage s runs storage rows [s L/N, (s+1) L/N) as R chunks of k: storage row s L/N + r k + j is the
    model's layer (r N + s) k + j. The model with its layers put in that order computes the same loss."""
    loss, params, batch = _linen("llama.py", 8)
    n, r, k = 4, 2, 1
    order = [(rr * n + s) * k + j for s in range(n) for rr in range(r) for j in range(k)]   # storage -> layer
    inverse = np.argsort(order)
    layered = jax.tree.map(lambda x: x[inverse], params["params"]["layers"])
    reordered = {"params": {**params["params"], "layers": layered}}
    got, _ = _run(loss, reordered, batch, "circular", 4, r)
    want = loss(params, {}, batch, None)[0]
    assert abs(float(got) - float(want)) <= 1e-5 * abs(float(want))


def test_circular_with_one_repeat_is_gpipe():
    loss, params, batch = _linen("llama.py", 8)
    a, _ = _run(loss, params, batch, "circular", 4, 1)
    b, _ = _run(loss, params, batch, "gpipe", 4)
    assert float(a) == float(b)


def test_per_layer_outputs_of_the_scan_reach_the_loss_in_layer_order():
    """The MoE's layers return their load-balancing loss as the scan's ys: the pipelined loss adds the
    same aux loss as the model's."""
    loss, params, batch = _linen("moe.py", 4)
    want = loss(params, {}, batch, None)[0]
    got, _ = _run(loss, params, batch, "gpipe", 4, stages=2)
    assert abs(float(got) - float(want)) <= 1e-5 * abs(float(want))


# ------------------------------------------------------------------ the report


@pytest.fixture(scope="module")
def gpipe():
    return _analyze(ROOT / "models" / "llama.py", *LLAMA, "--mesh", "stage=4,fsdp=2", "--batch", 16)


def test_layer_weights_per_device_are_their_total_over_stage_times_fsdp(gpipe):
    rows = [s for s in gpipe["shardings"] if "layers/" in s["path"] and s["path"].split(":")[0] in
            ("params", "optimizer_state")]
    assert rows
    for s in rows:
        total = int(np.prod(s["shape"])) * 4
        assert s["spec"][0] == "stage", s
        assert s["device_bytes"] == total // 8, s
    # the embedding and head are not on the stage axis: sharded over fsdp as the fsdp layout says
    for s in gpipe["shardings"]:
        if s["path"].startswith("params:") and "layers/" not in s["path"] and s["device_bytes"] > 1024:
            assert "stage" not in json.dumps(s["spec"]) and "fsdp" in json.dumps(s["spec"]), s


def test_the_report_names_the_schedule_stages_and_what_is_in_flight(gpipe):
    p = gpipe["pipeline"]
    assert (p["schedule"], p["stages"], p["microbatches"], p["repeats"], p["layers"]) == ("gpipe", 4, 4, 1, 8)
    assert p["iterations"] == 7 and p["bubble"] == pytest.approx(3 / 7)
    assert p["chosen"] and "smallest number that keeps all 4 stages busy" in p["chosen"][0]
    assert [s["layers"] for s in gpipe["stages"]] == [[0, 2], [2, 4], [4, 6], [6, 8]]
    assert all(s["peak_bytes"] == gpipe["per_device_peak_bytes"] for s in gpipe["stages"])
    assert 0 < p["activations_in_flight"] < gpipe["breakdown"]["activations_and_temporaries"]


def test_the_step_estimate_has_the_bubble_and_the_sends_over_the_stage_axis(gpipe):
    st = gpipe["step_time"]
    assert st["pipeline"]["bubble_share"] == pytest.approx(3 / 7)
    assert 0.5 < st["pipeline"]["stage_loop_dot_share"] <= 1
    assert 0 < st["pipeline"]["bubble_s"] < st["estimate_s"]
    sends = [c for c in st["collectives"] if c["kind"] == "collective-permute" and "stage" in c["axes"]]
    assert sends and all(c["link"].startswith("NVLink") for c in sends)


def test_activations_in_flight_grow_with_the_microbatches_in_flight():
    """The same microbatch (2 per fsdp device) at M = 4 and M = 8: the stage loop saves one set of
    activations per iteration, M + N - 1 of them."""
    a = _analyze(ROOT / "models" / "llama.py", *LLAMA, "--mesh", "stage=4,fsdp=2", "--batch", 16,
                 "--microbatches", 4)["pipeline"]
    b = _analyze(ROOT / "models" / "llama.py", *LLAMA, "--mesh", "stage=4,fsdp=2", "--batch", 32,
                 "--microbatches", 8)["pipeline"]
    assert (a["iterations"], b["iterations"]) == (7, 11)
    assert a["activations_in_flight"] * 11 == b["activations_in_flight"] * 7


def test_stage_remat_keeps_one_activation_per_microbatch_instead_of_every_layers():
    """--stage-remat checkpoints each stage pass at its input: with --remat full the 2 layers of a stage
    each saved their input per iteration; now the stage keeps the one that entered it."""
    args = (*LLAMA, "--mesh", "stage=4,fsdp=2", "--batch", 16)
    layers = _analyze(ROOT / "models" / "llama.py", *args)["pipeline"]
    stage = _analyze(ROOT / "models" / "llama.py", *args, "--stage-remat")["pipeline"]
    assert stage["stage_remat"] and not layers["stage_remat"]
    assert 0 < stage["activations_in_flight"] * 2 == layers["activations_in_flight"]   # 1 input kept of 2


def test_stage_remat_leaves_the_loss_and_gradients_as_they_were():
    loss, params, batch = _linen("llama.py", 8)
    sched, _ = ps.resolve("gpipe", 4, 4, None, 16, 2, "stage", stage_remat=True)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("stage", "fsdp"))
    f = ps.pipelined(loss, sched, mesh, batch_argnum=2)
    with jax.set_mesh(mesh):
        got, got_g = jax.jit(jax.value_and_grad(lambda p: f(p, {}, batch, None)[0]))(params)
    want, want_g = jax.value_and_grad(lambda p: loss(p, {}, batch, None)[0])(params)
    assert abs(float(got) - float(want)) <= 1e-5 * abs(float(want))
    assert _close(got_g, want_g)


def test_an_nnx_scan_model_pipelines_its_vmapped_blocks():
    d = _analyze(FIXTURES / "nnx_scan.py", "--mesh", "stage=4,fsdp=2")
    blocks = [s for s in d["shardings"] if s["path"].startswith("params:blocks/") and len(s["shape"]) == 3]
    assert blocks and all(s["spec"][0] == "stage" for s in blocks)
    assert d["pipeline"]["layers"] == 4 and d["pipeline"]["layers_per_stage"] == 1


def test_circular_report_and_text():
    r = CliRunner().invoke(main, ["analyze", str(ROOT / "models" / "llama.py"), *LLAMA, "--gpu", "h100", "--mesh",
                                  "stage=2,fsdp=2,tensor=2", "--layout", "fsdp_tp", "--batch", 16, "--pipeline",
                                  "circular", "--repeats", "2"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "pipeline circular over stage: 2 stages x 4 of 8 layers, 2 repeats of 2 layers, 2 microbatches" in text
    assert "stage 0: layers 0-3; stage 1: layers 4-7" in text


# ------------------------------------------------------------------ what cannot be pipelined: exit 2


def test_a_model_without_a_layer_scan_is_exit_2_saying_what_is_needed():
    out = _exit_2(ROOT / "models" / "mlp.py", "--mesh", "stage=2,fsdp=4")
    assert "no scan over stacked layer weights" in out and "nn.scan or nnx.scan" in out


def test_a_model_whose_trace_fails_while_stages_are_found_is_exit_2_explained():
    """The layer scan is looked for by tracing the loss before the step is built: a model written for explicit
    sharding, under auto axes, gets the message lowering gives it, not a jaxmem bug."""
    out = _exit_2(FIXTURES / "explicit_nnx.py", "--arg", "explicit=false", "--mesh", "stage=2,fsdp=4")
    assert "--axis-types explicit" in out


@pytest.mark.parametrize("args, says", [
    (["--mesh", "stage=4,fsdp=2", "--batch", 16, "--pipeline", "circular", "--microbatches", 2],
     "needs at least one microbatch per stage"),
    (["--mesh", "stage=4,fsdp=2", "--batch", 16, "--repeats", 2], "add --pipeline circular"),
    (["--mesh", "fsdp=8", "--batch", 16, "--microbatches", 2], "need a stage axis in --mesh"),
    (["--mesh", "stage=4,fsdp=2", "--batch", 16, "--microbatches", 3], "must split into 3 microbatches"),
    (["--mesh", "stage=4,fsdp=2", "--batch", 4], "use a --batch that is a multiple of 8"),
    (["--mesh", "stage=3,fsdp=2", "--batch", 12], "3 stages cannot split evenly"),
    (["--mesh", "stage=2,fsdp=4", "--batch", 16, "--pipeline", "circular", "--repeats", 3],
     "3 repeats cannot split evenly"),
    (["--mesh", "stage=2,fsdp=4", "--batch", 16, "--precision", "fp8"], "not pipelined yet"),
])
def test_what_a_pipeline_cannot_take_is_exit_2(args, says):
    assert says in _exit_2(ROOT / "models" / "llama.py", "--arg", "preset=tiny", "--arg", "n_layers=8", *args)


def test_a_loop_that_reduces_gradients_every_iteration_is_told_and_one_layer_per_stage_is_not():
    """XLA sinks a stage's gradient all-reduce over `data` out of the pipeline loop only when the stage runs
    one layer; with two, each of the M + N - 1 iterations all-reduces (the GPT-3 175B row's 34 s)."""
    def warned(n_layers):
        r = _analyze(ROOT / "models" / "llama.py", "--arg", "preset=tiny", "--arg", f"n_layers={n_layers}",
                     "--mesh", "data=2,stage=2,tensor=2", "--layout", "tp", "--batch", 16, "--microbatches", 4)
        return r, [w["message"] for w in r["warnings"] if w["kind"] == "gradient_reduced_per_iteration"]

    two, msgs = warned(4)
    assert len(msgs) == 1 and "over data on each of its 5 iterations" in msgs[0], msgs
    per_loop = [c for c in two["step_time"]["collectives"] if c["kind"] == "all-reduce" and c["axes"] == ["data"]]
    assert per_loop and per_loop[0]["count"] >= 5
    _, none = warned(2)
    assert none == []
