"""Every choice that decides the answer is stated (Report.choices: JSON, text, HTML), a config.json
model compiles flash attention where the target has it, and its vocabulary-tiled loss (issue 46)."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

import jaxmem
from jaxmem.present import levers
from jaxmem.present.html import render_html
from jaxmem.present.render import hints, render
from jaxmem.report import BufferRow, Report

ROOT = pathlib.Path(__file__).resolve().parent.parent
LLAMA = ROOT / "tests" / "fixtures" / "hf" / "llama"
SMALL = {"seq_len": 128, "batch_size": 2}


def _text(r: Report) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115 -- closed with the console
    render(r, console)
    console.file.close()
    return console.export_text()


@pytest.fixture(scope="module")
def config_bf16() -> Report:
    return jaxmem.analyze(LLAMA, gpu="h100", precision="bf16", args=SMALL)


@pytest.fixture(scope="module")
def config_fp32() -> Report:
    return jaxmem.analyze(LLAMA, gpu="h100", args=SMALL)


def test_a_config_model_states_its_choices_in_json_text_and_html(config_bf16):
    c = config_bf16.choices
    assert (c["precision"], c["attention"], c["loss"], c["remat"]) == ("bf16", "cudnn", "cross_entropy", "none")
    assert (c["lora_rank"], c["lora_targets"], c["mem_fraction"]) == (None, None, 0.75)
    assert c["attention_why"].startswith("--arg attention=auto (the default): cuDNN flash attention: compute "
                                         "capability 9.0, bfloat16 compute, head_dim 16")
    assert c["mem_fraction_why"].startswith("JAX default")
    d = json.loads(json.dumps(config_bf16.to_json()))
    assert d["choices"] == dict(c)
    assert Report.from_json(d).choices == c
    line = ("choices: precision bf16 (user), attention cudnn (default), loss cross_entropy (default), layers scan "
            "(default), remat none (default), no LoRA, memory fraction 0.75 (default)")
    assert line in _text(config_bf16)
    html = render_html(config_bf16)
    assert ('<p class="choices" id="choices">choices: precision bf16 <span class="source">(user)</span>, attention '
            'cudnn <span class="source default">(default)</span>') in html   # a default that decides stands out
    assert 'memory fraction 0.75 <span class="source default">(default)</span>' in html


def test_every_choice_stated_names_its_source(config_bf16, config_fp32):
    src = config_bf16.choices["sources"]
    assert {k: src[k] for k in ("precision", "attention", "loss", "layers", "remat", "lora_rank", "mem_fraction")} \
        == {"precision": "user", "attention": "default", "loss": "default", "layers": "default", "remat": "default",
            "lora_rank": "default", "mem_fraction": "default"}
    assert config_fp32.choices["sources"]["precision"] == "default"   # nobody gave --precision fp32
    mine = ("precision", "attention", "loss", "layers", "remat", "lora_rank", "lora_targets", "base_dtype",
            "mem_fraction")   # jaxmem.analysis.choices' own: each stated one has its source
    assert {k for k in mine if config_bf16.choices.get(k) is not None} <= set(src)
    given = jaxmem.analyze(LLAMA, gpu="h100", precision="bf16", mem_fraction=0.9, remat="full",
                           args={**SMALL, "attention": "xla", "vocab_tiles": 4, "scan": False})
    src = given.choices["sources"]
    assert [src[k] for k in ("precision", "attention", "loss", "layers", "remat", "mem_fraction")] == ["user"] * 6
    assert "precision bf16 (user), attention xla (user)" in _text(given)


def test_a_custom_step_states_its_own_precision_not_the_flags_default():
    r = jaxmem.analyze(ROOT / "tests" / "fixtures" / "custom_step.py", gpu="h100")
    c = r.choices
    assert (c["precision"], c["sources"]["precision"]) == ("the step's own", "model")
    text = _text(r)
    assert "precision fp32" not in text
    assert "choices: precision the step's own (model)" in text
    assert r.options["precision"] == "fp32"   # the options as before: the goldens' custom step is unchanged


def test_a_config_models_fp32_default_is_stated_with_the_bf16_its_trainers_use(config_fp32):
    c = config_fp32.choices
    assert (c["precision"], c["attention"]) == ("fp32", "xla")
    assert "trainers compute in bf16 (--precision bf16)" in c["precision_why"]
    assert c["attention_why"] == ("--arg attention=auto (the default): float32 compute: cuDNN flash attention has "
                                  "bf16/fp16 kernels only (--precision bf16 selects it)")
    text = _text(config_fp32)
    assert "precision: jaxmem's default: fp32 compute" in text
    assert "attention: --arg attention=auto (the default): float32 compute" in text


def test_lora_targets_and_rank_are_stated():
    r = jaxmem.analyze(LLAMA, gpu="h100", precision="bf16", lora=8, args={**SMALL, "attention": "xla"})
    c = r.choices
    assert (c["attention"], c["attention_why"]) == ("xla", "--arg attention=xla")
    # the frozen base is the checkpoint's dtype (the fixture's torch_dtype: bfloat16), not jaxmem's fp32
    assert (c["lora_rank"], c["lora_targets"], c["base_dtype"]) == (8, "every dense/einsum/conv layer", "bf16")
    assert (c["sources"]["lora_rank"], c["sources"]["lora_targets"], c["sources"]["base_dtype"]) == \
        ("user", "default", "model")
    assert "torch_dtype" in c["base_dtype_why"]
    assert r.options["base_dtype"] == "bf16"   # as compiled
    assert "LoRA r=8 on every dense/einsum/conv layer (user), base bf16 (model)" in levers.choices_line(r)


def test_a_model_file_states_the_attention_its_compiled_program_shows():
    xla = jaxmem.analyze(ROOT / "models" / "gpt2.py", gpu="h100", precision="bf16", batch=2,
                         args={"preset": "tiny"})
    assert xla.choices["attention"] == "xla"
    assert xla.choices["attention_why"].startswith("the model's own: materialized attention scores (")
    assert xla.choices["attention_why"].endswith(",64,64]) in the compiled program")   # tiny: block_size 64
    assert (xla.choices["loss"], xla.choices["loss_why"]) == ("the model's own", "the model file's loss function")
    fused = jaxmem.analyze(ROOT / "models" / "llama.py", gpu="h100", precision="bf16", batch=2,
                           args={"preset": "tiny", "attention": "cudnn"})
    assert fused.choices["attention"] == "cudnn"
    assert "attention cudnn (model), loss the model's own (model)" in _text(fused)


def test_the_compiled_program_decides_a_model_files_attention_or_says_unknown():
    from jaxmem.analysis.choices import attention_in_program

    assert attention_in_program('custom-call(...), custom_call_target="__cudnn$fmhaSoftmax"', 64)[0] == "cudnn"
    assert attention_in_program("%x = f32[2,4,64,64]{3,2,1,0} fusion(...)", 64)[0] == "xla"
    assert attention_in_program("%x = f32[64,64]{1,0} fusion(...)", 64)[0] == "unknown"   # a matrix, no heads
    assert attention_in_program("%x = f32[2,4,32,32]{3,2,1,0} fusion(...)", 64)[0] == "unknown"
    assert attention_in_program("%m = f32[1,1,1,64,64]{4,3,2,1,0} fusion(...)", 64)[0] == "unknown"   # a mask
    # the scores quoted are the largest (..., T, T) buffer, not the mask the program also holds
    both = "%m = f32[1,1,1,64,64]{4,3,2,1,0} fusion(...)\n%s = bf16[2,8,4,64,64]{4,3,2,1,0} fusion(...)"
    assert attention_in_program(both, 64) == ("xla", "materialized attention scores (bf16[2,8,4,64,64]) in the "
                                                     "compiled program")
    assert attention_in_program(None, 64)[0] == "unknown"


def _with_buffers(r: Report, rows: list[tuple[int, str, str]], **breakdown: int) -> Report:
    """`r` with these buffers live at the peak and this breakdown (the peak its sum)."""
    b = {**dict.fromkeys(r.breakdown, 0), **breakdown}
    return dataclasses.replace(r, top_buffers=tuple(BufferRow(size, shape, "f32", "", cat, "fusion", "")
                                                    for size, shape, cat in rows),
                               breakdown=b, per_device_peak_bytes=sum(b.values()), fits=False, verdict="does_not_fit")


def test_hints_name_the_lever_of_the_choice_that_holds_the_peak(config_fp32):
    gib = 1 << 30
    r = _with_buffers(config_fp32, [(4 * gib, "(2, 8, 128, 128)", "temporaries"),
                                    (3 * gib, "(2, 128, 256)", "temporaries")],
                      optimizer_state=2 * gib, activations_and_temporaries=8 * gib)
    r = dataclasses.replace(r, hf_config={**r.hf_config, "vocab_size": 256})
    hs = levers.hints(r)
    assert any(h.startswith("attention scores 4.00 GiB (40% of the peak, (..., 128, 128) buffers)") and
               "--arg attention=cudnn with --precision bf16" in h for h in hs)
    assert any(h.startswith("logits 3.00 GiB (30% of the peak): --arg vocab_tiles=8") for h in hs)
    assert any(h.startswith("optimizer_state 2.00 GiB (20% of the peak): --moment-dtype bf16") and
               "about 1.00 GiB less" in h for h in hs)
    assert any(h.startswith("fp32 compute: --precision bf16") for h in hs)
    # the report's hints: a config.json decoder takes --remat itself (no --remat-at for it)
    assert any(h.startswith("activations_and_temporaries") and "--remat full (or dots_saveable), a smaller" in h
               for h in hints(r))
    cudnn = dataclasses.replace(r, choices={**r.choices, "attention": "cudnn", "loss": "cross_entropy_vocab_tiles=8"})
    assert not any(h.startswith(("attention scores", "logits")) for h in levers.hints(cudnn))


def test_a_peak_that_a_larger_memory_fraction_holds_names_the_environment_variable(config_fp32):
    card = config_fp32.target.memory_bytes
    r = _with_buffers(config_fp32, [], activations_and_temporaries=int(card * 0.8))
    hs = levers.hints(r)
    assert any(h.startswith("memory fraction 0.75: XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 in the training's environment")
               for h in hs)
    asked = dataclasses.replace(r, choices={**r.choices, "mem_fraction_why": "--mem-fraction 0.75"})
    assert not any(h.startswith("memory fraction") for h in levers.hints(asked))


def test_the_frozen_base_is_the_checkpoints_dtype_the_models_or_the_users():
    # a model file without a checkpoint dtype: the dtype its parameters are created in
    mf = jaxmem.analyze(ROOT / "tests" / "fixtures" / "finetune_mlp.py", gpu="h100", precision="bf16", lora=4)
    assert (mf.choices["base_dtype"], mf.choices["sources"]["base_dtype"], mf.options["base_dtype"]) == \
        ("float32", "model", None)
    # --base-dtype overrides the checkpoint's bf16
    q = jaxmem.analyze(LLAMA, gpu="h100", precision="bf16", lora=4, base_dtype="int8", args=SMALL)
    assert (q.choices["base_dtype"], q.choices["sources"]["base_dtype"], q.options["base_dtype"]) == \
        ("int8", "user", "int8")
    # fp32 compute: the bf16 checkpoint upcast (a bf16 base would mix dtypes), said as jaxmem's default
    up = jaxmem.analyze(LLAMA, gpu="h100", lora=4, args=SMALL)
    assert (up.choices["base_dtype"], up.choices["sources"]["base_dtype"], up.options["base_dtype"]) == \
        ("float32", "default", None)
    assert "the checkpoint is bfloat16" in up.choices["base_dtype_why"]
    assert "base float32 (default)" in levers.choices_line(up)
    # the frozen base is the largest part of a peak that does not fit: the hint names --base-dtype
    big = dataclasses.replace(q, choices={**q.choices, "base_dtype": "bf16"}, frozen_bytes=8 << 30,
                              trainable_bytes=1 << 20, per_device_peak_bytes=(12 << 30) + (1 << 20), fits=False,
                              breakdown={**dict.fromkeys(q.breakdown, 0), "params": (8 << 30) + (1 << 20),
                                         "activations_and_temporaries": 4 << 30})
    assert ("frozen base 8.00 GiB (67% of the peak, the largest part, stored bf16): --base-dtype int8 about "
            "4.00 GiB, --base-dtype nf4 about 2.00 GiB") in levers.hints(big)
    small = dataclasses.replace(big, breakdown={**big.breakdown, "activations_and_temporaries": 9 << 30},
                                per_device_peak_bytes=(17 << 30) + (1 << 20))
    assert not any(h.startswith("frozen base") for h in levers.hints(small))


def test_a_configs_checkpoint_dtype_is_read_from_torch_dtype_or_dtype():
    from jaxmem.hf.config import checkpoint_dtype

    assert checkpoint_dtype({"torch_dtype": "bfloat16"}) == "bfloat16"
    assert checkpoint_dtype({"dtype": "float16"}) == "float16"               # transformers 4.56+
    assert checkpoint_dtype({"text_config": {"torch_dtype": "bfloat16"}}) == "bfloat16"   # Gemma 3
    assert checkpoint_dtype({"torch_dtype": "int8"}) is None and checkpoint_dtype({}) is None
    import jax
    import jax.numpy as jnp

    wl = jaxmem.Workload(model=None, batch={"x": jax.ShapeDtypeStruct((2,), jnp.float32)}, checkpoint_dtype="fp8",
                         step=lambda s, b: (s, None), state={"w": jax.ShapeDtypeStruct((2,), jnp.float32)})
    with pytest.raises(jaxmem.UserError, match=r"checkpoint_dtype='fp8'.*'bfloat16'"):
        wl.validate("<workload>")


def test_the_sharding_note_states_every_logical_name_with_its_axes_rules_and_source():
    from jaxmem.present import levers

    c = {"logical_rules": [
        {"name": "batch", "mesh_axes": ["data"], "source": "default", "convention": "jaxmem"},
        {"name": "heads", "mesh_axes": [], "source": "default", "convention": "jaxmem"},
        {"name": "act_batch", "mesh_axes": ["data", "fsdp"], "source": "default", "convention": "big_vision: train.py"},
        {"name": "act_len", "mesh_axes": [], "source": "user", "convention": "--rules r.json rule 1"}],
        "fallback_sharding": "its largest dimension data divides, over data"}
    assert levers.sharding_note(c) == (
        "sharding: batch over data; heads whole (jaxmem's rules, default); act_batch over data+fsdp (big_vision: "
        "train.py, default); act_len whole (--rules r.json rule 1, user); parameters no name places: its largest "
        "dimension data divides, over data")
    assert levers.sharding_note({}) is None   # a report saved before the rules were stated
