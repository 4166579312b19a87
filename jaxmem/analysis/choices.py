"""The report's `choices`: every choice that decides the answer, stated -- compute precision, attention
kernel, loss, the layers as a scan or a loop, remat policy, LoRA targets and rank, the memory fraction --
each with why it is what it is.

What jaxmem built is known (a config.json decoder's --arg attention / vocab_tiles, the options). What a
model file does is its own: the attention kernel is read from the compiled program (a cuDNN fused
attention call, or score buffers of shape (..., T, T) at the batch's sequence length T), and is
"unknown" when neither is there; the loss is "the model's own". Nothing is guessed.
"""

from __future__ import annotations

import math
import re
from typing import Any

from jaxmem import report
from jaxmem.hf import model as hf_model

CUDNN_ATTENTION = "__cudnn$fmha"   # XLA's custom-call target of cuDNN fused attention (jaxmem.compiler.dots)
LORA_DEFAULT_TARGETS = "every dense/einsum/conv layer"   # --lora-targets' default (options.py)


def attention_in_program(hlo_text: str | None, seq_len: int | None) -> tuple[str, str]:
    """("cudnn" | "xla" | "unknown", what in the compiled program says so)."""
    if not hlo_text:
        return "unknown", "no compiled program text to read"
    if CUDNN_ATTENTION in hlo_text:
        return "cudnn", f"cuDNN fused attention calls ({CUDNN_ATTENTION}*) in the compiled program"
    if seq_len and seq_len > 1:
        # scores have batch and heads before (T, T); a (1, ..., 1, T, T) buffer is a mask or a bias: the largest
        # (..., T, T) buffer of more than one (T, T) plane is quoted
        found = {m.group(0): math.prod(int(d) for d in m.group(1).split(",") if d)
                 for m in re.finditer(rf"\b(?:f32|bf16|f16)\[((?:\d+,)+){seq_len},{seq_len}\]", hlo_text)}
        planes = {shape: n for shape, n in found.items() if n > 1}
        if planes:
            scores = max(planes, key=lambda shape: (planes[shape], shape))
            return "xla", f"materialized attention scores ({scores}) in the compiled program"
    return "unknown", (f"no cuDNN fused attention and no (..., {seq_len}, {seq_len}) score buffer in the compiled "
                       "program" if seq_len else "no cuDNN fused attention in the compiled program")


def choices(*, opts, wl, target, budget, hlo_text: str | None, seq_len: int | None,
            mesh_spec) -> report.Choices:
    """The report's `choices` (report.Choices) for the step analyzed."""
    decoder = wl.model if isinstance(wl.model, hf_model.Decoder) else None
    kernel, seen = attention_in_program(hlo_text, seq_len)
    out: dict[str, Any] = {"precision": opts.precision}
    if decoder is not None and opts.precision == "fp32" and decoder.opts.numerics == "default":
        out["precision_why"] = ("jaxmem's default: fp32 compute; Hugging Face and MaxText trainers compute in bf16 "
                                "(--precision bf16)")
    else:
        out["precision_why"] = f"--precision {opts.precision}"
    if decoder is not None:
        out["attention"], out["attention_why"] = _decoder_attention(decoder, kernel, opts, target, mesh_spec, seq_len)
        tiles = decoder.opts.vocab_tiles
        if tiles > 1:
            out["loss"] = f"cross_entropy_vocab_tiles={tiles}"
            out["loss_why"] = (f"--arg vocab_tiles={tiles}: the cross-entropy in {tiles} tiles of the sequence, each "
                               "tile's logits recomputed in the backward pass; the full logits are never live")
        else:
            out["loss"] = "cross_entropy"
            out["loss_why"] = ("the cross-entropy over the full (batch, seq, vocab) logits in fp32 "
                               "(--arg vocab_tiles=N computes it in N tiles)")
    else:
        out["attention"] = kernel
        out["attention_why"] = f"the model's own: {seen}"
        out["loss"] = "the model's own"
        out["loss_why"] = "the model file's loss function"
    if decoder is not None:
        looped = not decoder.opts.scan
        out["layers"] = "loop" if looped else "scan"
        out["layers_why"] = (
            "--arg scan=false: the layers as a Python loop, as Hugging Face's Flax models run them (each layer's "
            "residuals and gradients its own, freed as the backward pass leaves it)" if looped else
            "the default: the layers under nn.scan, as MaxText compiles them (one layer's program; residuals and "
            "gradients stacked over the layers); --arg scan=false runs them as a Python loop, as Hugging Face's "
            "Flax models do")
    else:
        out["layers"] = "the model's own"
        out["layers_why"] = "the model file's code: a scan or a loop as it wrote them"
    out["remat"] = opts.remat
    ft = opts.finetune()
    out["lora_rank"] = ft.lora_rank or None
    out["lora_targets"] = (ft.lora_targets or LORA_DEFAULT_TARGETS) if ft.lora_rank else None
    out["base_dtype"] = ft.base_dtype
    out["mem_fraction"] = budget.fraction
    out["mem_fraction_why"] = budget.note
    return report.Choices(**out)   # type: ignore[typeddict-item]


def _decoder_attention(decoder, kernel: str, opts, target, mesh_spec, seq_len: int | None) -> tuple[str, str]:
    """The config.json decoder's attention kernel (as compiled) and why: the --arg given, or auto's rule."""
    asked = decoder.opts.attention
    built = "cudnn" if kernel == "cudnn" else "xla"
    if asked != "auto":
        return built, f"--arg attention={asked}"
    # auto's reason, worked out again for the target: the compute dtype as jaxmem's step casts it
    bf16 = decoder.opts.numerics == "maxtext" or opts.precision in ("bf16", "bf16-pure", "fp8")
    ctx = mesh_spec.context_axis
    split = ctx is not None and mesh_spec.axis_size(ctx) > 1
    device = target.devices[0] if target.devices else None
    if device is not None and seq_len:
        again, why = hf_model.attention_choice(decoder.arch, "bfloat16" if bf16 else "float32", seq_len,
                                               sequence_split=split, device=device)
        if again == built:
            return built, f"--arg attention=auto (the default): {why}"
    return built, ("--arg attention=auto (the default): cuDNN flash attention where the target supports it "
                   "(compute capability 8.0+, bf16/fp16 compute, head_dim a multiple of 8 up to 128, an even "
                   "sequence), else xla")
