"""Fine-tuning: frozen parameters, LoRA / QLoRA adapters (qwix), optimizer state in pinned host memory."""
import json
import math
import re
from pathlib import Path

import jax.numpy as jnp
import jaxlib
import pytest
from click.testing import CliRunner

from conftest import build_step
from jaxmem.pipeline import AnalyzeOptions, analyze_file, command_line
from jaxmem.cli import main
from jaxmem.compiler import compiled, versions
from jaxmem.errors import UserError
from jaxmem.plan import compare
from jaxmem.program import finetune, train_state
from jaxmem.program.finetune import FineTune
from jaxmem.program.workload import load_workload
from jaxmem.report import Report

FIX = Path(__file__).parent / "fixtures"
MLP = FIX / "finetune_mlp.py"          # Dense a: 37->53, b: 53->29, head: 29->11
NNX = FIX / "finetune_nnx.py"          # Linear a: 37->53, head: 53->11
BF16 = FIX / "lora_bf16.py"            # linen, layers computing in bf16: scanned, or unrolled (scan=False)
BF16_NNX = FIX / "lora_bf16_nnx.py"    # NNX, blocks computing in bf16
LLAMA = Path(__file__).resolve().parent.parent / "models" / "llama.py"
ADAMW_COUNT = 4                        # optax.adamw's step counter: one int32


def build(path, mesh="data=1", layout="fsdp", precision="fp32", donate=True, model_args=None, **ft):
    return build_step(path, mesh=mesh, layout=layout, precision=precision, optimizer="adamw", donate=donate,
                      model_args=model_args, **ft)[1]


def compile_(built):
    return compiled.compile_step(built, explain=False, cache=False)


def analyze(path=MLP, **kw):
    kw.setdefault("gpu", "h100")
    kw.setdefault("explain", False)
    kw.setdefault("optimizer", "adamw")
    return analyze_file(str(path), AnalyzeOptions(**kw))


def computed_shapes(hlo: str, dtype: str, shape: tuple[int, ...]) -> list[str]:
    """Instructions (not parameters) whose result is exactly dtype[shape], in any layout. Not a
    fusion of one parameter alone either: jaxlib 0.9's Triton GEMM fusions read each operand through
    one (``block_fusion = f32[37,53] fusion(%parameter_1), kind=kCustom``), which computes nothing."""
    dims = ",".join(map(str, shape))
    pat = re.compile(rf"= {dtype}\[{dims}\]\{{[\d,]*\}} (?!parameter\()(?!fusion\(%parameter[\w.]*\), kind=kCustom)")
    return [line.strip()[:160] for line in hlo.splitlines() if pat.search(line)]


# ---------------------------------------------------------------- --freeze


def test_one_trainable_layer_has_exactly_its_gradients_and_adamw_state():
    r = analyze(freeze="^(a|head)/", explain=True)
    layer = (53 * 29 + 29) * 4                     # Dense b: kernel + bias, fp32
    assert r.trainable_param_count == 53 * 29 + 29
    assert r.frozen_param_count == (37 * 53 + 53) + (29 * 11 + 11)
    assert r.trainable_bytes == layer and r.trainable_bytes + r.frozen_bytes == r.breakdown["params"]
    # AdamW over the trainable part only: two moments of that layer and the counter
    assert r.breakdown["optimizer_state"] == 2 * layer + ADAMW_COUNT
    # every gradient the step has is that layer's; at the peak XLA holds its kernel's (the bias's is gone)
    assert train_state.summarize(build(MLP, freeze="^(a|head)/").leaves).gradients == layer
    assert 53 * 29 * 4 <= r.breakdown["gradients"] <= layer
    full = analyze(explain=True)
    assert full.breakdown["optimizer_state"] == 2 * full.breakdown["params"] + ADAMW_COUNT
    assert full.breakdown["gradients"] > layer
    assert full.frozen_param_count == 0 and full.trainable_param_count == full.param_count


def test_the_compiled_step_has_no_gradient_of_a_frozen_weight():
    frozen = compile_(build(MLP, freeze="^a/"))
    assert not computed_shapes(frozen.hlo_text, "f32", (37, 53))
    # the same step with `a` trained computes dL/dW_a, an f32[37,53]: the check can see a gradient
    trained = compile_(build(MLP))
    assert computed_shapes(trained.hlo_text, "f32", (37, 53))
    assert frozen.stats.argument == train_state.summarize(build(MLP, freeze="^a/").leaves).arguments


def test_freeze_errors_name_the_culprit():
    with pytest.raises(UserError, match="matches no parameter path"):
        build(MLP, freeze="nothing_here")
    with pytest.raises(UserError, match="nothing left to train"):
        build(MLP, freeze=".")
    with pytest.raises(UserError, match="not a valid regular expression"):
        build(MLP, freeze="(")


# ---------------------------------------------------------------- LoRA (qwix)


@pytest.mark.parametrize("rank", [1, 4])
def test_lora_adds_r_times_din_plus_dout_per_target_and_adamw_follows(rank):
    r = analyze(lora_rank=rank, lora_targets="^(a|b)$")
    adapters = rank * (37 + 53) + rank * (53 + 29)
    assert r.trainable_param_count == adapters
    assert r.frozen_param_count == (37 * 53 + 53) + (53 * 29 + 29) + (29 * 11 + 11)   # the whole base
    assert r.breakdown["optimizer_state"] == 2 * adapters * 4 + ADAMW_COUNT


def test_lora_leaves_a_head_applied_with_its_own_params_dict_unadapted_and_names_it():
    # GPT-2's tied head: lm_head.apply({"params": {"kernel": wte.T}}, h) can hold no adapter (qwix raised
    # ScopeParamNotFoundError): the default --lora adapts every other Dense and warns naming the head
    built = build(FIX / "tied_head_apply.py", lora_rank=4)
    assert list(built.lora_skipped) == ["lm_head"] and "a tied head" in built.lora_skipped["lm_head"]
    trainable = [leaf for leaf in built.leaves if leaf.category == "params" and "lora" in leaf.path]
    # the two blocks' fc and proj (64 -> 64): rank 4 x (64 + 64) each; none on the head (64 -> 256)
    assert sum(math.prod(leaf.shape) for leaf in trainable) == 4 * 4 * (64 + 64)
    [w] = finetune.check_lora_skipped(built.lora_skipped)
    assert w.kind == "lora_skipped" and w.message.startswith("--lora: no adapter on lm_head: Dense applied with")
    assert build(MLP, lora_rank=4).lora_skipped == {}   # a model whose layers own their weights: nothing skipped


def test_lora_on_scanned_layers_counts_every_layer():
    # llama tiny: 2 scanned layers, d_model 64, ffn 128; up_proj is an einsum 64 -> 128
    r = analyze(LLAMA, model_args=(("preset", "tiny"),), lora_rank=4, lora_targets="mlp/up_proj")
    assert r.trainable_param_count == 2 * 4 * (64 + 128)
    assert r.breakdown["optimizer_state"] == 2 * r.trainable_bytes + ADAMW_COUNT


def test_lora_on_an_nnx_model():
    r = analyze(NNX, lora_rank=4)
    assert r.trainable_param_count == 4 * (37 + 53) + 4 * (53 + 11)
    assert r.frozen_param_count == 37 * 53 + 53 + 53 * 11 + 11
    assert r.breakdown["optimizer_state"] == 2 * r.trainable_bytes + ADAMW_COUNT


def test_lora_applies_adapters_to_activations_never_materializing_w_plus_ab():
    art = compile_(build(MLP, lora_rank=4))
    # W + A @ B (and any gradient of W) would be an f32[37,53]; x @ A @ B never makes one
    assert not computed_shapes(art.hlo_text, "f32", (37, 53))
    assert not computed_shapes(art.hlo_text, "f32", (53, 29))
    assert computed_shapes(art.hlo_text, "f32", (8, 4))       # x @ A: (batch, rank)


def layer_outputs(path, model_args=None, **ft):
    """{module path: dtype} of the output of every module call in loss(model, batch), qwix's
    adapters on (linen: capture_intermediates; NNX: nnx.capture of every method's output)."""
    import jax
    from flax import nnx

    from jaxmem.program import finetune

    wl = load_workload(path, **(model_args or {}))
    ft = FineTune(**ft)
    if isinstance(wl.model, nnx.Module) or not hasattr(wl.model, "init"):
        model = finetune.wrap_nnx(lambda: wl.model(nnx.Rngs(0)), ft, wl.loss, wl.batch)
        graphdef, state = nnx.split(model)
        run = nnx.capture(lambda m, b: wl.loss(m, b), nnx.Intermediate, method_outputs=nnx.Intermediate)
        out = jax.eval_shape(lambda st, b: run(nnx.merge(graphdef, st), b)[1], state, wl.batch)
    else:
        model = finetune.wrap_linen(wl.model, ft)
        loss = lambda m, b: wl.loss(m, b)  # noqa: E731
        variables = jax.eval_shape(lambda b: model.init(jax.random.key(0), b, method=loss), wl.batch)
        out = jax.eval_shape(lambda v, b: model.apply(v, b, method=loss, capture_intermediates=True,
                                                      mutable=["intermediates"])[1], variables, wl.batch)
    flat = jax.tree_util.tree_flatten_with_path(out)[0]
    return {jax.tree_util.keystr(p, simple=True, separator="/").split("/__call__")[0]: x.dtype for p, x in flat}


# every layer of the bf16 fixtures takes an adapter: (d_in + d_out) * rank each
BF16_ADAPTED = {"heads": 16 + 16, "merge": 16 + 16, "conv": 3 * 16 + 16, "up": 16 + 48, "down": 48 + 16}
BF16_NNX_ADAPTED = {"conv": 3 * 16 + 16, "up": 16 + 48, "down": 48 + 16}


@pytest.mark.parametrize("base_dtype", [None, "nf4"])
@pytest.mark.parametrize("scan", [True, False], ids=["scanned", "unrolled"])
def test_lora_keeps_the_bf16_compute_of_linen_layers(scan, base_dtype):
    # qwix's adapter output is fp32: without the cast, the scan's carry changed dtype (a TypeError)
    args = (("scan", scan),)
    r = analyze(BF16, gpu="cpu", model_args=args, lora_rank=4, base_dtype=base_dtype)
    assert r.trainable_param_count == 2 * 4 * sum(BF16_ADAPTED.values())
    outs = layer_outputs(BF16, dict(args), lora_rank=4, base_dtype=base_dtype)
    layers = {p.rsplit("/", 1)[-1] for p in outs}
    assert set(BF16_ADAPTED) <= layers
    assert set(outs.values()) == {jnp.dtype("bfloat16")}, outs


@pytest.mark.parametrize("base_dtype", [None, "nf4"])
def test_lora_keeps_the_bf16_compute_of_nnx_layers(base_dtype):
    from flax import nnx

    r = analyze(BF16_NNX, gpu="cpu", lora_rank=4, base_dtype=base_dtype)
    assert r.trainable_param_count == 2 * 4 * sum(BF16_NNX_ADAPTED.values())
    if not hasattr(nnx, "capture"):   # what reads the layers' outputs (layer_outputs)
        import flax

        pytest.skip(f"flax {flax.__version__} has no nnx.capture (flax 0.12.6 on): the layers' output dtypes "
                    "are not read")
    outs = layer_outputs(BF16_NNX, lora_rank=4, base_dtype=base_dtype)
    assert set(BF16_NNX_ADAPTED) <= {p.rsplit("/", 1)[-1] for p in outs}
    assert set(outs.values()) == {jnp.dtype("bfloat16")}, outs


def test_lora_output_of_a_bf16_layer_reaches_cudnn_attention_in_bf16():
    # cuDNN attention refuses fp32 queries while tracing (NotImplementedError: Q must be fp16/bf16/...)
    built = build(BF16, mesh="data=2", model_args={"cudnn": True}, lora_rank=4)
    lowered, _ = compiled.lower(built)   # a UserError naming the NotImplementedError if Q were fp32
    # the attention is in the program: jax lowers cuDNN attention under a mesh as a custom partitioning call
    assert "@CustomSPMDPartitioning" in lowered.as_text()


def test_lora_targets_that_match_nothing_are_refused():
    with pytest.raises(UserError, match="no dense/einsum/conv weight took an adapter"):
        build(MLP, lora_rank=4, lora_targets="attn")


# ---------------------------------------------------------------- quantized bases


def test_int4_base_is_half_of_int8_plus_the_same_scales():
    leaves = {d: build(MLP, lora_rank=4, base_dtype=d).leaves for d in ("int8", "int4", "nf4")}
    q = {d: [leaf for leaf in ls if leaf.path.endswith("/qvalue")] for d, ls in leaves.items()}
    scales = {d: [leaf for leaf in ls if leaf.path.endswith("/array/scale")] for d, ls in leaves.items()}
    n = 37 * 53 + 53 * 29 + 29 * 11
    assert sum(leaf.size for leaf in q["int8"]) == n
    assert sum(leaf.global_bytes for leaf in q["int8"]) == n
    assert sum(leaf.global_bytes for leaf in q["int4"]) == (n + 1) // 2 + 1   # 3 odd-sized weights round up
    assert sum(leaf.global_bytes for leaf in q["nf4"]) == sum(leaf.global_bytes for leaf in q["int4"])
    # qwix's per-output-channel scales, fp32: the same for every base dtype
    for d in ("int8", "int4", "nf4"):
        assert sum(leaf.global_bytes for leaf in scales[d]) == (53 + 29 + 11) * 4
    # XLA stores 4-bit values two to a byte: its argument bytes equal these
    for d in ("int8", "int4"):
        built = build(MLP, lora_rank=4, base_dtype=d)
        assert compile_(built).stats.argument == train_state.summarize(built.leaves).arguments


def test_a_quantized_base_still_shards_under_fsdp_and_tp():
    built = build(LLAMA, mesh="data=2,model=2", layout="fsdp_tp", model_args={"preset": "tiny", "batch_size": 8},
                  lora_rank=4, base_dtype="nf4")
    q = [leaf for leaf in built.leaves if leaf.path.endswith("/qvalue") and "layers/mlp/up_proj" in leaf.path]
    assert q and q[0].shards == 4
    assert compile_(built).stats.argument == train_state.summarize(built.leaves).arguments


def test_base_dtype_needs_lora_and_bf16_needs_bf16_compute():
    with pytest.raises(UserError, match="add --lora RANK"):
        build(MLP, base_dtype="nf4")
    with pytest.raises(UserError, match="--precision bf16"):
        build(MLP, lora_rank=4, base_dtype="bf16")
    built = build(MLP, precision="bf16", lora_rank=4, base_dtype="bf16")
    assert {leaf.dtype for leaf in built.leaves if leaf.category == "params" and leaf.trainable is False} == {"bfloat16"}


# ---------------------------------------------------------------- offload


def test_offloaded_optimizer_state_is_in_host_memory_not_on_the_device():
    if versions.parse(jaxlib.__version__) < (0, 10):   # jaxlib 0.9's XLA refuses it (E1200): exit 2, the fix named
        with pytest.raises(UserError, match="jaxlib 0.9.*drop --offload optimizer"):
            analyze(offload="optimizer")
        return
    on_device = analyze()
    r = analyze(offload="optimizer")
    opt = on_device.breakdown["optimizer_state"]
    assert r.breakdown["optimizer_state"] == 0
    assert r.host["optimizer_state"] == opt
    assert r.xla["argument"] == on_device.xla["argument"] - opt   # XLA's device arguments lost exactly it
    assert r.state_check["analytic_argument_bytes"] == r.state_check["compiled_argument_bytes"]
    assert not [w for w in r.warnings if w.kind == "offload_not_placed"]
    assert r.options["offload"] == "optimizer"
    assert Report.from_json(r.to_json()).to_json() == r.to_json()   # cache and compare --from keep it


def test_offload_refusals():
    with pytest.raises(UserError, match="needs the state donated"):
        analyze(offload="optimizer", donate=False)
    with pytest.raises(UserError, match="--offload activations is not supported"):
        analyze(offload="activations")


# ---------------------------------------------------------------- CLI, JSON, compare


def test_cli_json_carries_the_fine_tuning_fields():
    res = CliRunner().invoke(main, ["analyze", str(MLP), "--gpu", "h100", "--no-explain", "--json", "--lora", "2",
                                    "--lora-targets", "^a$", "--base-dtype", "int8"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["trainable_param_count"] == 2 * (37 + 53)
    assert d["frozen_param_count"] + d["trainable_param_count"] == d["param_count"]
    assert d["options"]["lora_rank"] == 2 and d["options"]["base_dtype"] == "int8"
    assert d["host"] == {}


def test_cli_refuses_bad_fine_tuning_flags_with_exit_2():
    res = CliRunner().invoke(main, ["analyze", str(MLP), "--gpu", "h100", "--freeze", "("])
    assert res.exit_code == 2 and "--freeze" in res.output


def test_command_line_renders_the_fine_tuning_flags():
    opts = AnalyzeOptions(freeze="embed", lora_rank=16, lora_targets="attn|mlp", lora_alpha=32.0, base_dtype="nf4",
                          offload="optimizer", precision="bf16")
    text = command_line("m.py", opts)
    for part in ("--freeze embed", "--lora 16", "--lora-targets 'attn|mlp'", "--lora-alpha 32.0",
                 "--base-dtype nf4", "--offload optimizer"):
        assert part in text


def test_compare_grid_has_one_full_fine_tune_row_per_base_dtype_axis():
    rows = compare.grid({"lora_rank": "0,16", "base_dtype": "bf16,nf4"})
    assert rows == [{"lora_rank": 0, "base_dtype": None}, {"lora_rank": 16, "base_dtype": "bf16"},
                    {"lora_rank": 16, "base_dtype": "nf4"}]


def test_a_quantized_base_leaves_conv_weights_in_their_dtype():
    # qwix 0.1.8 quantizes a conv's weight only with its activations: convs stay unquantized, dense layers do not
    resnet = Path(__file__).resolve().parent.parent / "models" / "resnet.py"
    plain = build(resnet, model_args={"preset": "tiny"}, lora_rank=4)
    q = build(resnet, model_args={"preset": "tiny"}, lora_rank=4, base_dtype="int8")
    quantized = [leaf.path for leaf in q.leaves if leaf.path.endswith("/qvalue")]
    assert quantized == ["params:head/kernel/array/qvalue"]
    s_plain, s_q = train_state.summarize(plain.leaves), train_state.summarize(q.leaves)
    # scales are the weight's storage, not parameters: the counts are the model's
    assert (s_q.trainable_count, s_q.frozen_count) == (s_plain.trainable_count, s_plain.frozen_count)


def test_fine_tuning_a_custom_step_is_refused_before_compiling():
    with pytest.raises(UserError, match="own `step`"):
        analyze(FIX / "custom_step.py", lora_rank=4, optimizer=None)


def test_lora_on_an_nnx_model_whose_loss_passes_its_own_rngs():
    """Flax's Gemma train step calls model(x, rngs=...): qwix takes its adapters' RNGs as that same
    keyword and calls the model without it. Both adapters (r=4) are added and the base is frozen."""
    r = analyze_file(str(FIX / "lora_nnx_rngs.py"), AnalyzeOptions(gpu="h100", lora_rank=4))
    assert r.trainable_param_count == (64 * 4 + 4 * 256) + (256 * 4 + 4 * 64)
    assert r.frozen_param_count == 64 * 256 + 256 + 256 * 64 + 64


@pytest.mark.parametrize("base", ["int8", "int4", "nf4"])
def test_a_tied_embedding_stays_unquantized_under_qlora_its_lookup_and_attend_both_work(base):
    import jaxmem

    # NNX: nnx.Embed used for the lookup and, tied, for the logits (embed.attend), as Gemma does
    r = jaxmem.analyze("tests/fixtures/nnx_decoder_noscope.py", gpu="h100", lora_rank=8, base_dtype=base,
                       explain=False, cache=False)
    dtypes = {s["path"]: s["dtype"] for s in r.shardings}
    assert dtypes["params:embed/embedding/value"] == "float32"
    assert any("qvalue" in p and d != "float32" for p, d in dtypes.items())   # the dense weights are quantized
    assert not any(p.startswith("params:embed") and "lora" in p for p in dtypes)   # and the table takes no adapter


# ---------------------------------------------------------------- the model's own trainable set

USER_LORA = FIX / "nnx_user_lora.py"   # qwix LoRA rank 4 on up/down of 2 blocks (D 32, F 64), applied by the user
USER_ADAPTERS = 2 * (4 * (32 + 64) + 4 * (64 + 32))   # per block: up A 32x4, B 4x64; down A 64x4, B 4x32


def test_a_model_carrying_nnx_lora_params_trains_only_its_adapters_as_tunix_does():
    r = analyze(USER_LORA)
    assert r.trainable == {"leaves": 8, "parameters": USER_ADAPTERS, "source": "nnx.LoRAParam"}
    assert r.trainable_param_count == USER_ADAPTERS and r.frozen_param_count == r.param_count - USER_ADAPTERS
    # AdamW's state is the adapters' (m and v in fp32) and the step count: nothing of the base
    assert r.breakdown["optimizer_state"] == 2 * 4 * USER_ADAPTERS + ADAMW_COUNT


def test_train_all_and_freeze_override_the_models_own_trainable_set():
    every = analyze(USER_LORA, train_all=True)
    assert every.trainable["source"] == "--train-all" and every.trainable["parameters"] == every.param_count
    assert every.breakdown["optimizer_state"] == 2 * 4 * every.param_count + ADAMW_COUNT
    frozen = analyze(USER_LORA, freeze="^(embed|head)/")
    assert frozen.trainable["source"] == "--freeze"
    assert frozen.trainable["parameters"] == frozen.param_count - (64 * 32) - (32 * 64 + 64)   # embed, head


def test_a_model_without_marked_leaves_trains_every_parameter_and_says_so():
    r = analyze(MLP)
    assert r.trainable == {"leaves": 6, "parameters": r.param_count, "source": "every parameter"}
    lora = analyze(MLP, lora_rank=2)
    assert lora.trainable["source"] == "--lora" and lora.trainable["parameters"] == lora.trainable_param_count


def test_train_all_with_lora_or_freeze_is_exit_2():
    for extra in (["--lora", "4"], ["--freeze", "head"]):
        res = CliRunner().invoke(main, ["analyze", str(MLP), "--gpu", "h100", "--train-all", *extra])
        assert res.exit_code == 2 and "--train-all" in res.output, res.output


def test_lora_on_nnx_blocks_stacked_by_vmap_and_run_by_scan():
    # adapters made inside nnx.scan come out stacked like the blocks' weights (was: IndexError in the scan)
    r = analyze(FIX / "nnx_scan_vmap.py", lora_rank=4)
    per_block = 4 * (32 * 4 + 4 * 32) + (32 * 4 + 4 * 128) + (128 * 4 + 4 * 32)   # q k v out, up, down
    assert r.trainable == {"leaves": 14, "parameters": 2 * per_block + (32 * 4 + 4 * 64), "source": "--lora"}
    q = analyze(FIX / "nnx_scan_vmap.py", lora_rank=4, base_dtype="nf4", precision="bf16")
    assert q.trainable == r.trainable and q.breakdown["params"] < r.breakdown["params"]
