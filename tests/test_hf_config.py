"""`jaxmem analyze config.json` (jaxmem/hf): tiny configs of each family, counted against a hand
formula; the config routed through the model-file path (analyze, --lora, compare, the API)."""

from __future__ import annotations

import json
import os
import pathlib
import resource
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest
from click.testing import CliRunner

import jaxmem
from jaxmem import cli, hf
from jaxmem.errors import UserError

FIX = pathlib.Path(__file__).parent / "fixtures" / "hf"
FAMILIES = sorted(p.name for p in FIX.iterdir() if (p / "config.json").is_file())
SMALL = ["--arg", "seq_len=32", "--arg", "batch_size=2"]


def hand_count(c: dict) -> int:
    """The parameter count of a Hugging Face config, in closed form, per family (the PyTorch modules'
    weights as transformers defines them; fused kernels counted whole)."""
    t = c["model_type"]
    if t == "gpt2":
        d, n, v, p = c["n_embd"], c["n_layer"], c["vocab_size"], c["n_positions"]
        i = c.get("n_inner") or 4 * d
        block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * i + i) + (i * d + d)
        return v * d + p * d + n * block + 2 * d   # wte, wpe, h.*, ln_f; lm_head tied to wte
    d, n, v = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    h = c["num_attention_heads"]
    k = c.get("num_key_value_heads") or h
    hd = c.get("head_dim") or d // h
    gemma = t in ("gemma2", "gemma3_text")
    attn = d * h * hd + 2 * d * k * hd + h * hd * d
    if t in ("qwen2", "qwen2_moe"):
        attn += h * hd + 2 * k * hd          # q/k/v biases, none on o_proj
    if c.get("attention_bias"):
        attn += h * hd + 2 * k * hd + d      # Llama's attention_bias: all four
    if t in ("qwen3", "qwen3_moe", "gemma3_text"):
        attn += 2 * hd                       # q_norm, k_norm
    norms = (4 if gemma else 2) * d
    if t == "mixtral":
        mlp = d * c["num_local_experts"] + c["num_local_experts"] * 3 * d * c["intermediate_size"]
    elif t in ("qwen2_moe", "qwen3_moe"):
        e, w = c["num_experts"], c["moe_intermediate_size"]
        mlp = d * e + e * 3 * d * w
        if c.get("shared_expert_intermediate_size"):
            mlp += 3 * d * c["shared_expert_intermediate_size"] + d   # shared expert and its sigmoid gate
    else:
        i = c["intermediate_size"]
        mlp = 3 * d * i + ((2 * i + d) if c.get("mlp_bias") else 0)
    tied = c.get("tie_word_embeddings", gemma)
    return v * d * (1 if tied else 2) + n * (attn + mlp + norms) + d


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_count_equals_the_hand_formula_of_each_family(family):
    config = json.loads((FIX / family / "config.json").read_text())
    assert hf.parameter_count(hf.load_arch(FIX / family / "config.json")) == hand_count(config)


def test_the_fields_that_change_memory_change_the_count():
    base = json.loads((FIX / "llama" / "config.json").read_text())

    def count(**changes):
        return hf.parameter_count(hf.config.parse({**base, **changes}, pathlib.Path("x.json")))

    n = count()
    assert count(tie_word_embeddings=True) == n - 256 * 64
    assert count(num_key_value_heads=4) == n + 2 * (2 * 64 * 2 * 16)   # 2 layers x (k, v) x 2 more heads
    assert count(head_dim=32) == n + 2 * (64 * 4 * 16 + 2 * 64 * 2 * 16 + 4 * 16 * 64)
    assert count(attention_bias=True) == n + 2 * (4 * 16 + 2 * 2 * 16 + 64)
    assert count(vocab_size=512) == n + 2 * 256 * 64
    # RoPE scaling changes no parameter and no buffer
    assert count(rope_scaling={"rope_type": "yarn", "factor": 4.0}) == n


def _logical_names(family: str) -> dict[str, tuple]:
    arch = hf.load_arch(FIX / family / "config.json")
    from jaxmem.hf.model import Decoder, Opts

    tokens = jax.ShapeDtypeStruct((1, 4), "int32")
    boxed = jax.eval_shape(lambda key: Decoder(arch, Opts()).init(key, tokens), jax.random.key(0))["params"]
    flat = jax.tree_util.tree_flatten_with_path(boxed, is_leaf=lambda x: hasattr(x, "names"))[0]
    return {"/".join(str(getattr(p, "key", p)) for p in path): tuple(leaf.names) for path, leaf in flat}


def test_parameters_carry_maxtexts_logical_axes_so_layouts_split_heads_mlp_experts_and_vocab():
    dense = _logical_names("llama")
    assert dense["layers/attn/q_proj/kernel"] == ("layers", "embed", "heads", "head_dim")
    assert dense["layers/attn/k_proj/kernel"] == ("layers", "embed", "kv_heads", "head_dim")
    assert dense["layers/mlp/gate_proj/kernel"] == ("layers", "embed", "mlp")
    assert dense["embed/embedding"] == ("vocab", "embed")
    assert dense["lm_head/kernel"] == ("embed", "vocab")
    moe = _logical_names("qwen3_moe")
    assert moe["layers/moe/gate_proj/kernel"] == ("layers", "exp", "embed", "mlp")
    assert moe["layers/moe/router/kernel"] == ("layers", "embed", None)
    assert moe["layers/attn/q_norm/scale"] == ("layers", "head_dim")


def _windows(family: str, **changes) -> tuple:
    arch = hf.config.parse({**json.loads((FIX / family / "config.json").read_text()), **changes}, pathlib.Path("x"))
    return tuple(arch.windows.at(i) for i in range(arch.n_layers))


def test_sliding_windows_are_read_per_layer_as_each_family_does():
    assert _windows("gemma2") == (16, None)                  # even layers local, odd global
    assert _windows("gemma3") == (16, 16, 16)                # pattern 6: the sixth layer is global
    assert _windows("gemma3", num_hidden_layers=7, sliding_window_pattern=3) == (16, 16, None, 16, 16, None, 16)
    assert _windows("mistral") == (16, 16)
    assert _windows("qwen2") == (None, None)                 # use_sliding_window false
    assert _windows("qwen2", use_sliding_window=True, max_window_layers=1) == (None, 512)
    assert _windows("mixtral") == (None, None)
    assert _windows("gemma2", layer_types=["full_attention", "sliding_attention"]) == (None, 16)


def test_a_multimodal_gemma3_config_builds_its_text_model():
    text = json.loads((FIX / "gemma3" / "config.json").read_text())
    wrapped = {"model_type": "gemma3", "text_config": {k: v for k, v in text.items() if k != "model_type"},
               "vision_config": {"hidden_size": 1152}}
    arch = hf.config.parse(wrapped, pathlib.Path("config.json"))
    assert arch.model_type == "gemma3_text" and arch.qk_norm and arch.sandwich_norm


def _run(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args])


def test_an_unsupported_model_type_is_exit_2_listing_the_families_and_the_model_file_contract(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "mamba", "hidden_size": 64}))
    r = _run("analyze", tmp_path, "--gpu", "h100")
    assert r.exit_code == 2, r.output
    assert "'mamba'" in r.output and "qwen3_moe" in r.output and "docs/model-files.md" in r.output
    assert "Traceback" not in r.output


def test_a_json_that_is_not_a_config_and_a_missing_field_are_exit_2(tmp_path):
    other = tmp_path / "rules.json"
    other.write_text("[]")
    r = _run("analyze", other, "--gpu", "h100")
    assert r.exit_code == 2 and "model_type" in r.output, r.output
    partial = tmp_path / "config.json"
    partial.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    r = _run("analyze", partial, "--gpu", "h100")
    assert r.exit_code == 2 and "num_hidden_layers" in r.output, r.output


def test_an_unknown_arg_names_what_a_config_takes():
    r = _run("analyze", FIX / "llama" / "config.json", "--gpu", "h100", "--arg", "preset=8b")
    assert r.exit_code == 2 and "seq_len" in r.output and "batch_size" in r.output, r.output


def test_analyze_a_config_folder_names_its_model_type_and_parameter_count():
    r = _run("analyze", FIX / "qwen3_moe", "--gpu", "h100", "--mesh", "data=2", *SMALL, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    config = json.loads((FIX / "qwen3_moe" / "config.json").read_text())
    expected = hand_count(config)
    assert d["hf_config"] == {"model_type": "qwen3_moe", "parameters": expected, "vocab_size": config["vocab_size"],
                              "path": str(FIX / "qwen3_moe" / "config.json")}
    assert d["param_count"] == expected
    assert d["options"]["batch"] == 2 and d["sequence_length"] == 32
    # the experts are split over an expert axis as MaxText's rules do (layout names carried through)
    assert "exp" in d["logical_names"] and "kv_heads" in d["logical_names"]


def test_lora_on_a_config_freezes_the_base_and_trains_adapters():
    r = _run("analyze", FIX / "llama" / "config.json", "--gpu", "h100", *SMALL, "--lora", "4", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    base = hand_count(json.loads((FIX / "llama" / "config.json").read_text()))
    assert d["hf_config"]["parameters"] == base
    assert d["frozen_param_count"] == base and 0 < d["trainable_param_count"] < base / 4


def test_compare_runs_a_config_through_every_layout():
    r = _run("compare", FIX / "gemma2", "--gpu", "h100", "--mesh", "data=2", *SMALL, "--layouts", "dp,fsdp",
             "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert len(rows) == 2


def test_the_api_takes_a_config_path():
    rep = jaxmem.analyze(str(FIX / "gpt2" / "config.json"), gpu="h100", args={"seq_len": 32, "batch_size": 2})
    assert rep.hf_config["model_type"] == "gpt2"
    assert rep.param_count == hand_count(json.loads((FIX / "gpt2" / "config.json").read_text()))
    with pytest.raises(UserError, match="n_positions"):
        jaxmem.analyze(str(FIX / "gpt2"), gpu="h100", args={"seq_len": 4096})


def test_dropout_rates_that_draw_masks_in_training_are_read():
    gpt2 = hf.load_arch(FIX / "gpt2" / "config.json")     # no *_pdrop given: GPT-2's own 0.1
    assert (gpt2.embd_dropout, gpt2.attn_dropout, gpt2.resid_dropout) == (0.1, 0.1, 0.1)
    llama = hf.load_arch(FIX / "llama" / "config.json")
    assert (llama.embd_dropout, llama.attn_dropout, llama.resid_dropout) == (0.0, 0.0, 0.0)
    with pytest.raises(UserError, match="attention_dropout"):
        hf.config.parse({**json.loads((FIX / "llama" / "config.json").read_text()), "attention_dropout": 1.5},
                        pathlib.Path("config.json"))


def test_a_non_numeric_arg_is_exit_2_naming_it():
    r = _run("analyze", FIX / "gpt2", "--gpu", "h100", "--arg", "seq_len=abc")
    assert r.exit_code == 2 and "seq_len" in r.output and "Traceback" not in r.output, r.output


# ------------------------------------------------------------ issue 47: hostile config.json values

LLAMA = json.loads((FIX / "llama" / "config.json").read_text())
BEYOND = "is beyond int32 (2,147,483,647), the largest dimension XLA can shape"


def _parse(family: str = "llama", **changes):
    base = json.loads((FIX / family / "config.json").read_text())
    return hf.config.parse({**base, **changes}, pathlib.Path("config.json"))


@pytest.mark.parametrize("family,changes,message", [
    ("llama", {"vocab_size": 10**12}, f'"vocab_size": 1000000000000 {BEYOND}'),
    ("llama", {"vocab_size": 0}, '"vocab_size": 0 is not a positive integer; the smallest it can be is 1'),
    ("llama", {"head_dim": 10**10}, f'"head_dim": 10000000000 {BEYOND}'),
    ("llama", {"hidden_size": 10**400}, f'"hidden_size": 1.000e400 {BEYOND}'),
    ("llama", {"num_hidden_layers": 2**31}, f'"num_hidden_layers": 2147483648 {BEYOND}'),
    ("llama", {"num_attention_heads": 0}, '"num_attention_heads": 0 is not a positive integer'),
    ("llama", {"hidden_size": 0}, '"hidden_size": 0 is not a positive integer'),
    ("llama", {"num_hidden_layers": 0}, '"num_hidden_layers": 0 is not a positive integer'),
    ("llama", {"num_key_value_heads": 0}, '"num_key_value_heads": 0 is not a positive integer'),
    ("llama", {"intermediate_size": -1}, '"intermediate_size": -1 is not a positive integer'),
    ("llama", {"hidden_size": True}, '"hidden_size": True is not a positive integer'),
    ("llama", {"hidden_size": 64.0}, '"hidden_size": 64.0 is not a positive integer'),
    ("llama", {"vocab_size": "256"}, "\"vocab_size\": '256' is not a positive integer"),
    ("llama", {"num_key_value_heads": 3}, "num_attention_heads=4 is not a multiple of num_key_value_heads=3"),
    ("llama", {"num_attention_heads": 3, "num_key_value_heads": 1},
     "hidden_size=64 is not a multiple of num_attention_heads=3; give head_dim"),
    ("llama", {"head_dim": 15}, "head_dim=15 is odd; rotary position embeddings rotate pairs"),
    ("llama", {"rope_theta": 0}, '"rope_theta": 0.0 is not positive'),
    ("llama", {"rms_norm_eps": 10**400}, '"rms_norm_eps": 1.000e400 is not a finite number'),
    ("llama", {"vocab_size": 2**31 - 1, "hidden_size": 2**31 - 1, "num_attention_heads": 1, "num_key_value_heads": 1,
               "head_dim": 64},
     ("the embedding (vocab_size=2,147,483,647 x hidden_size=2,147,483,647, fp32) is 1.845e+19 bytes, beyond what "
      "XLA's 64-bit byte counts express (2^63 - 1)")),
    ("llama", {"model_type": ["llama"]}, "\"model_type\": ['llama'] is not a string; give one of llama, mistral"),
    ("llama", {"model_type": {"llama": 1}}, "\"model_type\": {'llama': 1} is not a string"),
    ("gemma3", {"sliding_window_pattern": 0}, ('"sliding_window_pattern": 0 is not a positive integer; the smallest '
                                               "it can be is 1 (leave it out, or null, for the default 6)")),
    ("mistral", {"sliding_window": 0}, ('"sliding_window": 0 is not a positive integer; the smallest it can be is 1 '
                                        "(leave it out, or null, for none)")),
    ("mixtral", {"num_local_experts": 0}, '"num_local_experts": 0 is not a positive integer'),
    ("mixtral", {"num_experts_per_tok": 5}, "num_experts_per_tok=5 must be between 1 and the 4 experts"),
    ("gpt2", {"n_head": 0}, '"n_head": 0 is not a positive integer'),
    ("gpt2", {"n_positions": 10**12}, f'"n_positions": 1000000000000 {BEYOND}'),
    ("gpt2", {"n_embd": 2**30}, "n_inner (default 4 x n_embd)=4294967296 is beyond int32"),
])
def test_a_config_value_xla_cannot_shape_is_refused_naming_the_field_its_value_and_the_limit(family, changes,
                                                                                             message):
    with pytest.raises(UserError) as e:
        _parse(family, **changes)
    assert message in str(e.value)
    assert str(e.value).startswith("config file config.json: ")


def test_numpy_integers_are_integers_and_give_the_same_decoder():
    assert _parse(hidden_size=np.int64(64), num_hidden_layers=np.int32(2)) == _parse()


def test_hostile_values_are_exit_2_from_the_command_line_before_jax_builds_anything(tmp_path):
    for text, message in [
        (json.dumps(LLAMA).replace('"hidden_size": 64', '"hidden_size": 1' + "0" * 400), '"hidden_size": 1.000e400'),
        (json.dumps({**LLAMA, "model_type": ["llama"]}), "\"model_type\": ['llama'] is not a string"),
        (json.dumps({**LLAMA, "vocab_size": 0}), '"vocab_size": 0 is not a positive integer'),
    ]:
        (tmp_path / "config.json").write_text(text)
        r = _run("analyze", tmp_path, "--gpu", "h100")
        assert r.exit_code == 2, r.output
        assert message in r.output and "Traceback" not in r.output and "jaxmem bug" not in r.output, r.output


def _lowered(arch, seq_len: int = 32) -> str:
    wl = hf.build_workload(arch, seq_len=seq_len, batch_size=2)
    params = jax.eval_shape(lambda: wl.model.init(jax.random.key(0), wl.batch["tokens"]))
    return jax.jit(lambda p, b: wl.loss(wl.model.bind(p), b)).lower(params, wl.batch).as_text()


def test_a_window_at_least_as_wide_as_the_sequence_is_full_attention_and_no_int32_overflow():
    full = _lowered(_parse("mistral", sliding_window=None))
    for window in (32, 10**12, 2**31):   # the sequence is 32: none of these masks anything
        arch = _parse("mistral", sliding_window=window)
        assert arch.windows.mode(arch.n_layers, 32) == "global"
        assert _lowered(arch) == full
    assert _lowered(_parse("mistral", sliding_window=31)) != full   # one narrower than the sequence does mask


def test_windows_are_a_rule_whatever_the_layer_count():
    arch = _parse("gemma3", num_hidden_layers=2**31 - 1, sliding_window_pattern=6)
    assert arch.windows.mode(arch.n_layers, 32) == "mixed"
    assert [arch.windows.at(i) for i in (0, 4, 5, 2**31 - 3)] == [16, 16, None, None]
    # a pattern longer than the stack: every layer local (one window for all), however long the pattern
    wide = _parse("gemma3", num_hidden_layers=3, sliding_window_pattern=10**12)
    assert wide.windows.mode(3, 32) == "uniform"
    qwen = _parse("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=10**12)
    assert qwen.windows.mode(qwen.n_layers, 32) == "global"   # max_window_layers past the stack: no window
    assert _parse("gemma2").windows.mode(2, 32) == "mixed"


def test_a_gemma3_config_without_text_config_is_built_as_gemma3_text():
    text = json.loads((FIX / "gemma3" / "config.json").read_text())
    bare = hf.config.parse({**text, "model_type": "gemma3"}, pathlib.Path("config.json"))
    assert bare == hf.load_arch(FIX / "gemma3" / "config.json")
    assert bare.model_type == "gemma3_text" and hf.parameter_count(bare) == hand_count(text) == 164_864
    with pytest.raises(UserError, match='"text_config": \\[1\\] is not an object'):
        hf.config.parse({"model_type": "gemma3", "text_config": [1]}, pathlib.Path("config.json"))


def test_a_config_of_a_billion_layers_is_answered_in_seconds_under_a_2_gib_cap(tmp_path):
    """The config is read and refused without a per-layer list in Python (the windows are a rule) and before XLA
    compiles a loop of 10^9 iterations (jaxmem.program.sizes.check_loop). Measured, not assumed: the child runs
    under RLIMIT_DATA = 2 GiB (RLIMIT_AS would count the address space jax and XLA reserve but never touch) and
    its peak resident memory is read from os.wait4's rusage of that child alone."""
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "num_hidden_layers": 10**9}))
    cap = 2 << 30

    def limit():
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))

    with open(tmp_path / "err", "wb") as err:
        child = subprocess.Popen([sys.executable, "-m", "jaxmem.cli", "analyze", str(tmp_path), "--gpu", "h100"],
                                 stdout=subprocess.DEVNULL, stderr=err, preexec_fn=limit)
    watchdog = threading.Timer(300, child.kill)
    watchdog.start()
    try:
        _, status, usage = os.wait4(child.pid, 0)   # this child's own rusage (Popen's wait would drop it)
    finally:
        watchdog.cancel()
    child.returncode = os.waitstatus_to_exitcode(status)
    text = (tmp_path / "err").read_text()
    assert child.returncode == 2, text
    assert "num_hidden_layers=1,000,000,000" in text and "at most 16,384" in text, text
    assert "Traceback" not in text and "MemoryError" not in text
    assert 0 < usage.ru_maxrss * 1024 < cap, usage.ru_maxrss   # Linux: kilobytes


@pytest.mark.parametrize("args,culprit", [
    (("batch_size=0",), "--arg batch_size=0 must be at least 1"),
    (("seq_len=0",), "--arg seq_len=0 must be at least 1"),
    (("seq_len=0", "batch_size=0"), "--arg batch_size=0 must be at least 1"),
    (("batch_size=-2",), "--arg batch_size=-2 must be at least 1"),
    (("seq_len=2147483648",), "--arg seq_len=2147483648 must be at least 1 and at most 2,147,483,647"),
    (("group_size=4",), "--arg group_size=4: llama is a dense decoder (no experts)"),
    (("capacity_factor=2",), "--arg capacity_factor=2: llama is a dense decoder"),
    (("aux_loss_coef=0.1",), "--arg aux_loss_coef=0.1: llama is a dense decoder"),
])
def test_an_arg_the_step_cannot_honour_is_exit_2_naming_it_never_another_step(args, culprit):
    r = _run("analyze", FIX / "llama", "--gpu", "h100", *(a for arg in args for a in ("--arg", arg)))
    assert r.exit_code == 2, r.output
    assert culprit in r.output and "Traceback" not in r.output, r.output


def test_numpy_integer_args_build_the_step_asked():
    wl = hf.build_workload(hf.load_arch(FIX / "mixtral" / "config.json"), batch_size=np.int64(3),
                           seq_len=np.int32(16), group_size=np.int64(8))
    assert wl.batch["tokens"].shape == (3, 16) and type(wl.batch["tokens"].shape[0]) is int
    assert wl.model.opts.group_size == 8
    with pytest.raises(UserError, match="--arg capacity_factor=inf is not a finite number"):
        hf.build_workload(hf.load_arch(FIX / "mixtral" / "config.json"), capacity_factor=float("inf"))


def test_the_default_step_is_the_models_own_context_capped_at_2048():
    for family in FAMILIES:
        arch = hf.load_arch(FIX / family / "config.json")
        expected = min(2048, arch.max_positions) if arch.max_positions else 2048
        assert hf.build_workload(arch).batch["tokens"].shape == (8, expected), family


@pytest.mark.parametrize("family", FAMILIES)
def test_the_reports_options_and_the_analyzed_shapes_agree_on_every_family(family):
    # the shapes are the workload's, whatever the target: the CPU compile is the fastest to ask
    rep = jaxmem.analyze(str(FIX / family), gpu="cpu", args={"batch_size": 3, "seq_len": 16}, explain=False)
    assert rep.options["arg:batch_size"] == rep.options["batch"] == 3
    assert rep.options["arg:seq_len"] == rep.sequence_length == 16
