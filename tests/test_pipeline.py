"""The pipeline end to end on tiny workloads."""
import json

import pytest

from jaxmem.errors import UserError
from jaxmem.pipeline import AnalyzeOptions, analyze_file
from jaxmem.report import BREAKDOWN_KEYS

FIX = __import__("pathlib").Path(__file__).parent / "fixtures"
from helpers import MLP_SMALL as MLP  # noqa: E402


def run(path=MLP, **kw):
    kw.setdefault("gpu", "h100")
    kw.setdefault("explain", False)
    return analyze_file(str(path), AnalyzeOptions(**kw))


def test_breakdown_sums_to_the_peak_and_matches_xla():
    r = run(mesh="data=8", layout="fsdp")
    # not an fp8 step, and no constant XLA keeps
    assert tuple(r.breakdown) == tuple(k for k in BREAKDOWN_KEYS if k not in ("fp8_state", "constants"))
    assert sum(r.breakdown.values()) == r.per_device_peak_bytes
    assert r.per_device_peak_bytes == r.xla["lower_bound"] + r.breakdown["runtime_overhead"]
    assert r.target.gpu == "h100" and r.target.devices == 8 and r.fits is True
    json.dumps(r.to_json())


def test_target_memory_changes_the_verdict():
    # 2 x 45056^2 = 4.1 G params of AdamW training (16 B/param: ~61 GiB): the same step, the same default
    # memory fraction (0.75), only the card differs -- an RTX A6000 (47.5 GiB) cannot hold it, an H200 (141 GiB) can
    kw = dict(model_args=(("width", 45056),), layout="dp")
    a6000, h200 = run(gpu="rtx-a6000", **kw), run(gpu="h200", **kw)
    assert a6000.target.memory_bytes < a6000.per_device_peak_bytes < h200.target.memory_bytes
    assert a6000.fits is False and a6000.headroom_bytes < 0
    assert h200.fits is True and h200.headroom_bytes > 0
    assert a6000.target.usable_note == h200.target.usable_note   # the same allocator settings on both


def test_mem_fraction_changes_the_verdict():
    small = run(gpu="rtx-a6000", model_args=(("width", 8192),), layout="dp")
    assert small.fits is True and small.headroom_bytes > 0
    big = run(gpu="rtx-a6000", model_args=(("width", 8192),), layout="dp", mem_fraction=0.001)
    assert big.fits is False and big.headroom_bytes < 0


def test_every_cpu_report_says_it_predicts_the_program_with_ynnpack_fusions_off():
    r = run(gpu="cpu", layout="dp")
    (w,) = [w for w in r.warnings if w.kind == "cpu_fusions_off"]
    # which program, and how to run that program in one's own training
    assert "YNNPACK fusions off" in w.message and "compiler_options" in w.message
    assert "XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=" in w.message
    assert w.kind in json.dumps(r.to_json())
    assert not [w for w in run(gpu="h100").warnings if w.kind == "cpu_fusions_off"]


def test_not_donating_costs_a_copy_of_the_state_and_warns():
    donated = run(layout="dp")
    copied = run(layout="dp", donate=False)
    cost = copied.breakdown["outputs_not_aliased"]
    state = donated.breakdown["params"] + donated.breakdown["optimizer_state"]
    assert cost >= state
    assert copied.per_device_peak_bytes > donated.per_device_peak_bytes
    (w,) = [w for w in copied.warnings if w.kind == "not_donated"]
    assert w.bytes == cost


def test_unsharded_leaf_warning_names_the_leaf():
    r = run(FIX / "annotated.py", mesh="data=8", layout="fsdp")
    (w,) = [w for w in r.warnings if w.kind == "unsharded_leaf"]
    assert "odd" in w.message and "(129, 131)" in w.message and w.bytes > 0


def test_batch_override_scales_activations():
    a = run(batch=64, layout="dp")
    b = run(batch=512, layout="dp")
    assert b.options["batch"] == 512
    assert b.breakdown["batch"] == 8 * a.breakdown["batch"]
    # the added samples' activations are at least their inputs (how much more is each XLA's fusion:
    # 4.5x the activations under jax 0.10.2, 3.05x under 0.9.0)
    grown = b.breakdown["activations_and_temporaries"] - a.breakdown["activations_and_temporaries"]
    assert grown >= b.breakdown["batch"] - a.breakdown["batch"] > 0


def test_accumulation_cuts_activations():
    one = run(batch=512, layout="dp")
    four = run(batch=512, layout="dp", accum=4)
    assert four.breakdown["activations_and_temporaries"] < one.breakdown["activations_and_temporaries"]


def test_custom_step_escape_hatch():
    r = run(FIX / "custom_step.py", mesh="data=8", layout="fsdp")
    assert r.breakdown["params"] == 512 * 512 * 4 // 8
    assert r.state_check["analytic_argument_bytes"] == r.state_check["compiled_argument_bytes"]
    with pytest.raises(UserError, match="its own `step`"):
        run(FIX / "custom_step.py", optimizer="sgd")


def test_user_errors_name_the_culprit():
    with pytest.raises(UserError, match="not found"):
        run(FIX / "nope.py")
    with pytest.raises(UserError, match=r"SyntaxError.*line 1"):
        run(FIX / "broken_syntax.py")
    with pytest.raises(UserError, match="no `workload\\(\\)`"):
        run(FIX / "no_workload.py")
    with pytest.raises(UserError, match=r"KeyError.*raises.py, line 2"):
        run(FIX / "raises.py")
    with pytest.raises(UserError, match="unknown optimizer 'adamax'.*lion"):
        run(optimizer="adamax")
    with pytest.raises(UserError, match="no argument 'preset'"):
        run(model_args=(("preset", "8b"),))
    with pytest.raises(UserError, match="takes no `remat`"):
        run(remat="full")


MODELS = FIX.parent.parent / "models"


@pytest.mark.parametrize("model", ["vit", "mlp_nnx"])
def test_nnx_models_with_mutable_state(model):
    r = run(MODELS / f"{model}.py", mesh="data=4", layout="fsdp", model_args=(("preset", "tiny"),), batch=8)
    assert r.state_check["analytic_argument_bytes"] == r.state_check["compiled_argument_bytes"]
    assert r.breakdown["other_state"] > 8   # RNG stream state / BatchStats travel with the step


def test_linen_batch_stats_are_carried():
    r = run(MODELS / "resnet.py", mesh="data=2", layout="dp", model_args=(("preset", "tiny"),))
    assert r.breakdown["other_state"] > 1000   # batch_stats means and variances


@pytest.mark.holds_for("0.9.0", "0.10.2")   # jaxlib 0.12's XLA:GPU finds a tiling: nothing to fall back from
def test_triton_tiling_failure_falls_back_and_says_so():
    # XLA:GPU without autotuning finds no Triton tiling for a 1088-row dot (1088 = 64 x 17 tokens)
    r = run(MODELS / "gpt2.py", model_args=(("preset", "tiny"), ("seq_len", 17)), batch=64)
    assert [w for w in r.warnings if w.kind == "compile_fallback"]
    assert r.per_device_peak_bytes > 0


def test_xla_rematerialization_failure_becomes_a_warning():
    # ~100 GB of activations on a 48 GB card: XLA:GPU tries to rematerialize and says it cannot
    r = run(gpu="rtx-a6000", layout="dp", model_args=(("width", 32768), ("batch_size", 131072)))
    assert r.fits is False
    (w,) = [w for w in r.warnings if w.kind == "xla_remat_failed"]
    assert "Can't reduce memory use" in w.message


def test_256_devices_on_32_hosts():
    r = run(mesh="data=32,model=8", layout="fsdp_tp", batch=64, model_args=(("width", 1024),))
    assert r.target.devices == 256 and r.target.hosts == 32
    assert r.state_check["analytic_argument_bytes"] == r.state_check["compiled_argument_bytes"]


def test_precision_bf16_on_a_model_that_fixes_float32_layers_warns_with_the_dots_dtypes(tmp_path):
    f = tmp_path / "f32.py"
    f.write_text("import jax, jax.numpy as jnp, flax.linen as nn, jaxmem\n"
                 "class Net(nn.Module):\n"
                 "    @nn.compact\n"
                 "    def __call__(self, x):\n"
                 "        return nn.Dense(256, dtype=jnp.float32)(nn.relu(nn.Dense(1024, dtype=jnp.float32)(x)))\n"
                 "def workload():\n"
                 "    return jaxmem.Workload(model=Net(), batch={'x': jax.ShapeDtypeStruct((64, 256), jnp.float32)},\n"
                 "                           loss=lambda m, b: m(b['x']).mean())\n")
    import jaxmem

    r = jaxmem.analyze(str(f), gpu="h100", precision="bf16", explain=False, cache=False)
    (w,) = [w for w in r.warnings if w.kind == "precision_no_effect"]
    assert "100% of the matmul FLOPs in 32-bit" in w.message and "tf32 100%" in w.message
    # a model whose dots follow the parameters: bf16 changes them, no warning
    ok = jaxmem.analyze("models/mlp.py", gpu="h100", precision="bf16", explain=False, cache=False,
                        args={"preset": "tiny"})
    assert not [w for w in ok.warnings if w.kind == "precision_no_effect"]


def test_the_report_says_xla_compiled_against_the_runs_pool_and_slop_factor(monkeypatch):
    """XLA budgets a run's step from its allocator's pool (benchmarks/results/xla-budget.md): the compile is given
    it, and the report says which limit XLA held the temporaries to. No compile: the step's topology is read."""
    import jaxmem
    from jaxmem.analysis import stages
    from jaxmem.compiler import targets

    for name in ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(name, raising=False)
    card = targets.CATALOGUE["rtx-a6000"].memory_bytes
    base = lambda **kw: targets.compile_base(stages.make_target(AnalyzeOptions(gpu="rtx-a6000", **kw), 1))  # noqa: E731
    assert base() == int(card * 0.75)                                 # JAX's default pool: BFC at 0.75
    assert base(mem_fraction=0.9) == int(card * 0.9)                  # a fraction over XLA's own 80% too
    assert base(allocator="cuda_async", mem_fraction=0.5) == int(card * 0.5)   # its release threshold
    assert base(allocator="platform") == card * 80 // 100             # no pool limit: XLA's 80% of the card
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")
    assert base() == int(card * 0.6)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION")
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_memory_limit_slop_factor=88")
    r = jaxmem.analyze("models/mlp.py", gpu="rtx-a6000", explain=False, args={"preset": "tiny"})
    t = r.target
    assert (t.xla_memory_base_bytes, t.xla_slop_factor) == (int(card * 0.75), 88)
    io = r.xla["argument"] + r.xla["output"] - r.xla["alias"]
    assert t.xla_memory_limit_bytes == int((t.xla_memory_base_bytes - io) * 88 / 100)
    assert t.xla_budget_note.startswith("XLA held this step's temporaries to ") and "the run's pool, 0.75" in \
        t.xla_budget_note and "x 88%" in t.xla_budget_note
    cpu = jaxmem.analyze("models/mlp.py", gpu="cpu", explain=False, args={"preset": "tiny"}).target
    assert (cpu.xla_budget_note, cpu.xla_memory_limit_bytes) == ("", None)


def test_xla_rematerialized_instructions_are_counted_by_the_names_xla_gives_them():
    from jaxmem.compiler import compiled

    hlo = ("%fusion.3 = f32[8]{0} fusion(%p)\n%fusion.3.remat = f32[8]{0} fusion(%p)\n"
           "%bitcast.remat2 = f32[8]{0} bitcast(%fusion.3.remat)\n%remat_like = f32[8]{0} copy(%p)\n")
    assert compiled.xla_rematerialized(hlo) == 2
    assert compiled.xla_rematerialized(None) == 0


CUSTOM_ADAM = '''
import jax, jax.numpy as jnp, optax, jaxmem
tx = optax.adam(1e-3)
def step(state, batch):
    g = jax.grad(lambda w: jnp.mean((batch["x"] @ w["w"]) ** 2))(state["params"])
    updates, opt = tx.update(g, state["opt_state"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt, "step": state["step"] + 1}, None
def workload():
    params = {"w": jax.ShapeDtypeStruct((256, 128), jnp.float32)}
    return jaxmem.Workload(step=step, batch={"x": jax.ShapeDtypeStruct((32, 256), jnp.float32)},
                           state={"params": params, "opt_state": jax.eval_shape(tx.init, params),
                                  "step": jax.ShapeDtypeStruct((), jnp.int32)})
'''


def test_a_custom_step_is_labelled_by_the_optimizer_state_it_carries_and_counts_what_it_trains(tmp_path):
    import jaxmem

    f = tmp_path / "adam_step.py"
    f.write_text(CUSTOM_ADAM)
    r = jaxmem.analyze(str(f), gpu="h100", explain=False, cache=False)
    assert r.options["optimizer"] == "step's own (ScaleByAdamState)"   # not "adamw"
    assert (r.trainable_param_count, r.frozen_param_count) == (256 * 128, 0)
    sgd = jaxmem.analyze("tests/fixtures/custom_step.py", gpu="h100", explain=False, cache=False)
    assert sgd.options["optimizer"] == "step's own (no optimizer state: sgd-like)"


def test_an_unsharded_parameters_cost_counts_its_replicated_adam_moments():
    r = run(FIX / "annotated.py", mesh="data=8", layout="fsdp")
    (w,) = [w for w in r.warnings if w.kind == "unsharded_leaf"]
    one = 129 * 131 * 4 - 129 * 131 * 4 // 8   # fp32 (129, 131) kept whole instead of split 8 ways
    assert "so do its 2 optimizer-state copies" in w.message
    assert abs(w.bytes - 3 * one) <= 3 * 8, (w.bytes, 3 * one)   # the param, Adam's mu and nu


@pytest.mark.holds_for("0.10.2")   # where XLA's rematerialization kicks in is XLA's own
def test_a_step_xla_rematerialized_to_meet_its_budget_says_so_with_the_step_as_written():
    """Llama 1B, dp over 8 H100s, 29 sequences of 256 per device, at JAX's default pool (0.75): XLA rematerializes
    to stay under the pool's limit (benchmarks/results/xla-budget.md); the report counts what it recomputes, and
    gives the step compiled again at a limit where XLA recomputes nothing (its peak and step time)."""
    import jaxmem

    kw = dict(gpu="h100", mesh="data=8", layout="dp", explain=False, cache=False, args={"preset": "1b", "seq_len": 256})
    r = jaxmem.analyze("models/llama.py", batch=232, **kw)
    (w,) = [w for w in r.warnings if w.kind == "xla_rematerialized"]
    assert w.bytes > 0 and "The step without it" in w.message and "the run's pool" in w.message
    x = r.xla_remat
    assert x["instructions"] > 0 and x["unconstrained_instructions"] == 0
    assert x["unconstrained_peak_bytes"] == r.per_device_peak_bytes + w.bytes
    assert x["unconstrained_xla_memory_base_bytes"] > 3 * r.target.memory_bytes
    # the recomputed kernels, by XLA's suffix, in the step estimate
    assert x["launches"] == r.step_time["xla_remat"]["launches"] > 0 and 0 < x["seconds"] < r.step_time["estimate_s"]
    assert x["unconstrained_step_s"] > 0
    # a step well under the budget: XLA changes nothing, nothing is said nor compiled again
    small = jaxmem.analyze("models/llama.py", batch=64, **kw)
    assert not [w for w in small.warnings if w.kind == "xla_rematerialized"]
    assert small.xla_remat == {} and small.step_time["xla_remat"]["launches"] == 0
