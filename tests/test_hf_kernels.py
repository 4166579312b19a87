"""The config.json decoder as its trainers run it (issue 46): cuDNN flash attention by default where the
target has it (--arg attention=auto), XLA's elsewhere; the vocabulary-tiled loss (--arg vocab_tiles=N)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import types

import pytest

import jaxmem
from jaxmem import hf
from jaxmem.errors import UserError
from jaxmem.hf import model as hf_model
from jaxmem.report import Report

LLAMA = pathlib.Path(__file__).resolve().parent / "fixtures" / "hf" / "llama"


def _dims(shape: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", shape))


def test_auto_attention_is_cudnn_on_an_h100_and_xla_on_a_card_before_ampere():
    from jaxmem.compiler import targets

    arch = hf.load_arch(LLAMA / "config.json")
    h100 = targets.make_target("h100", 1).devices[0]
    assert hf_model.attention_choice(arch, "bfloat16", 128, device=h100)[0] == "cudnn"
    t4 = types.SimpleNamespace(platform="gpu", compute_capability="7.5")   # Turing: no cuDNN flash attention
    kernel, why = hf_model.attention_choice(arch, "bfloat16", 128, device=t4)
    assert (kernel, why) == ("xla", "compute capability 7.5: cuDNN flash attention needs 8.0 (Ampere) or later")
    assert hf_model.attention_choice(arch, "float32", 128, device=h100)[0] == "xla"
    for changed in (dataclasses.replace(arch, head_dim=256), dataclasses.replace(arch, attn_softcap=50.0)):
        assert hf_model.attention_choice(changed, "bfloat16", 128, device=h100)[0] == "xla"
    assert hf_model.attention_choice(arch, "bfloat16", 128, sequence_split=True, device=h100)[0] == "xla"
    assert hf_model.attention_choice(arch, "bfloat16", 127, device=h100) == (
        "xla", "odd sequence length 127: jax's cuDNN attention refuses it in training")
    cpu = types.SimpleNamespace(platform="cpu", compute_capability=None)
    assert hf_model.attention_choice(arch, "bfloat16", 128, device=cpu) == ("xla", "not a CUDA GPU")


@pytest.fixture(scope="module")
def big_vocab(tmp_path_factory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("big_vocab")
    config = json.loads((LLAMA / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 32000}))
    return folder


def _vocab_rows(r: Report, vocab: int) -> list[tuple[int, ...]]:
    """The shapes of the non-parameter buffers at the peak whose last dimension is the vocabulary."""
    return [_dims(b.shape) for b in r.top_buffers
            if _dims(b.shape)[-1:] == (vocab,) and b.category in ("activations", "temporaries")]


def test_vocab_tiles_removes_the_full_logits_buffer_and_keeps_the_parameters(big_vocab):
    args = {"seq_len": 256, "batch_size": 4}
    plain = jaxmem.analyze(big_vocab, gpu="h100", precision="bf16", args=args)
    tiled = jaxmem.analyze(big_vocab, gpu="h100", precision="bf16", args={**args, "vocab_tiles": 4})
    assert (4, 256, 32000) in _vocab_rows(plain, 32000)   # the full fp32 logits
    rows = _vocab_rows(tiled, 32000)
    assert rows and all(r[:-1] != (4, 256) and r[0] * (r[1] if len(r) == 3 else 1) <= 4 * 256 // 4 for r in rows)
    assert tiled.param_count == plain.param_count == hf.parameter_count(hf.load_arch(big_vocab / "config.json"))
    assert tiled.per_device_peak_bytes < plain.per_device_peak_bytes


def test_vocab_tiles_that_do_not_divide_the_sequence_is_a_user_error_naming_a_divisor():
    arch = hf.load_arch(LLAMA / "config.json")
    with pytest.raises(UserError, match=r"--arg vocab_tiles=3 must be at least 1 and divide seq_len=128 .*"
                                        r"e\.g\. --arg vocab_tiles=2"):
        hf.build_workload(arch, LLAMA, seq_len=128, vocab_tiles=3)
    with pytest.raises(UserError, match=r"--arg vocab_tiles=0 .* e\.g\. --arg vocab_tiles=8"):
        hf.build_workload(arch, LLAMA, seq_len=128, vocab_tiles=0)
    with pytest.raises(UserError, match=r"--arg attention='flash'; expected one of 'auto', 'xla', 'cudnn'"):
        hf.build_workload(arch, LLAMA, seq_len=128, attention="flash")


@pytest.mark.parametrize(("family", "change", "culprit"), [
    ("llama", {}, "an odd sequence length (31)"),
    ("llama", {"head_dim": 12}, "head_dim 12"),
    ("gemma2", {}, "attention logit softcapping"),
    ("llama", {"attn_dropout": 0.1}, "attention dropout 0.1"),
])
def test_an_explicit_cudnn_attention_it_cannot_run_is_refused_before_any_trace(family, change, culprit):
    arch = dataclasses.replace(hf.load_arch(pathlib.Path(__file__).parent / "fixtures" / "hf" / family / "config.json"),
                               **change)
    seq = 31 if "odd" in culprit else 32
    with pytest.raises(UserError, match=re.escape(f"--arg attention=cudnn with {culprit}")) as e:
        hf.build_workload(arch, batch_size=2, seq_len=seq, attention="cudnn")
    assert "--arg attention=auto" in str(e.value) and "--arg attention=xla" in str(e.value)
    hf.build_workload(arch, batch_size=2, seq_len=seq, attention="auto")   # auto picks what can run, as before
