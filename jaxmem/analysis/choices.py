"""The report's `choices`: every choice that decides the answer, stated -- compute precision, attention
kernel, loss, the layers as a scan or a loop, remat policy, LoRA targets and rank, the memory fraction --
each with why it is what it is.

What jaxmem built is known (a config.json decoder's --arg attention / vocab_tiles, the options). What a
model file does is its own: the attention kernel is read from the compiled program (a cuDNN fused
attention call, or score buffers of shape (..., T, T) at the batch's sequence length T), and is
"unknown" when neither is there; the loss is "the model's own"; a custom step's precision and remat are
"the step's own" (jaxmem changes neither). Each choice names its source (`sources`): "user" (a flag or
an environment variable given), "model" (the model's code or config file: a checkpoint's torch_dtype)
or "default" (jaxmem's default, where the user said nothing) -- so a guess is never mistaken for a given.
"""

from __future__ import annotations

import math
import re
from typing import Any

from jaxmem import report
from jaxmem.hf import model as hf_model
from jaxmem.program import visible
from jaxmem.program.options import AnalyzeOptions

CUDNN_ATTENTION = "__cudnn$fmha"   # XLA's custom-call target of cuDNN fused attention (jaxmem.compiler.dots)
LORA_DEFAULT_TARGETS = "every dense/einsum/conv layer"   # --lora-targets' default (options.py)
PRECISION_DEFAULT = AnalyzeOptions.precision   # --precision's default: what "default" means for it


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


def choices(*, opts, wl, target, budget, hlo_text: str | None, seq_len: int | None, mesh_spec,
            planned=None, leaves=(), built=None) -> report.Choices:
    """The report's `choices` (report.Choices) for the step analyzed, each with its source (`sources`):
    "user" (a flag or environment variable given), "model" (the model's code or config file) or
    "default" (jaxmem's). `planned`: the step as planned (step.StepPlan: the frozen base's dtype resolved),
    `leaves`: the step's state leaves (the frozen parameters' dtype)."""
    decoder = wl.model if isinstance(wl.model, hf_model.Decoder) else None
    out: dict[str, Any] = {}
    src: dict[str, str] = {}
    _precision(out, src, opts, wl, decoder)
    kernel, seen = attention_in_program(hlo_text, seq_len)
    if decoder is not None:
        out["attention"], out["attention_why"] = _decoder_attention(decoder, kernel, opts, target, mesh_spec, seq_len)
        src["attention"] = "default" if decoder.opts.attention == "auto" else "user"
        _decoder_loss_and_layers(out, src, decoder)
    else:
        out["attention"], out["attention_why"] = kernel, f"the model's own: {seen}"
        out["loss"], out["loss_why"] = "the model's own", "the model file's loss function"
        out["layers"] = "the model's own"
        out["layers_why"] = "the model file's code: a scan or a loop as it wrote them"
        src.update(attention="model", loss="model", layers="model")
    _remat(out, src, opts, wl)
    ft = opts.finetune()
    out["lora_rank"] = ft.lora_rank or None
    out["lora_targets"] = (ft.lora_targets or LORA_DEFAULT_TARGETS) if ft.lora_rank else None
    src["lora_rank"] = "user" if ft.lora_rank else "default"
    if ft.lora_rank:
        src["lora_targets"] = "user" if ft.lora_targets else "default"
    _base(out, src, opts, wl, planned, leaves)
    out["mem_fraction"] = budget.fraction
    out["mem_fraction_why"] = budget.note
    a = getattr(budget, "allocator", None)   # the allocator the run uses (jaxmem.compiler.allocator; None off a card)
    if a is not None:
        out["allocator"], out["allocator_why"] = a.kind, a.why
        src["mem_fraction"], src["allocator"] = a.fraction_source, a.kind_source
    else:
        src["mem_fraction"] = "user" if "--mem-fraction" in budget.note or "XLA_" in budget.note else "default"
    if built is not None and planned is not None:   # every logical name's rule and the fallback, stated
        shard, shard_src = visible.sharding_choices(planned.rules, mesh_spec, built.names_used, opts.unmapped,
                                                    built.issues, built.leaves)
        out.update(shard)
        src.update(shard_src)
    out["sources"] = src
    return report.Choices(**out)   # type: ignore[typeddict-item]


def _precision(out: dict, src: dict, opts, wl, decoder) -> None:
    """The compute precision: a custom step's own (jaxmem casts nothing), else --precision or its default."""
    if wl.is_custom_step:
        out["precision"] = "the step's own"
        out["precision_why"] = ("the step computes as its code says: --precision applies to steps jaxmem builds, "
                                "and jaxmem cast nothing")
        src["precision"] = "model"
        return
    out["precision"] = opts.precision
    src["precision"] = "default" if opts.precision == PRECISION_DEFAULT else "user"
    if decoder is not None and opts.precision == "fp32" and decoder.opts.numerics == "default":
        out["precision_why"] = ("jaxmem's default: fp32 compute; Hugging Face and MaxText trainers compute in bf16 "
                                "(--precision bf16)")
    elif src["precision"] == "default":
        out["precision_why"] = ("jaxmem's default: fp32 compute, the parameters' dtype (--precision bf16 computes in "
                                "bf16 as mixed-precision trainers do)")
    else:
        out["precision_why"] = f"--precision {opts.precision}"


def _decoder_loss_and_layers(out: dict, src: dict, decoder) -> None:
    """A config.json decoder's loss (--arg vocab_tiles) and layers (--arg scan), as jaxmem built them."""
    tiles = decoder.opts.vocab_tiles
    if tiles > 1:
        out["loss"] = f"cross_entropy_vocab_tiles={tiles}"
        out["loss_why"] = (f"--arg vocab_tiles={tiles}: the cross-entropy in {tiles} tiles of the sequence, each "
                           "tile's logits recomputed in the backward pass; the full logits are never live")
    else:
        out["loss"] = "cross_entropy"
        out["loss_why"] = ("the cross-entropy over the full (batch, seq, vocab) logits in fp32 "
                           "(--arg vocab_tiles=N computes it in N tiles)")
    looped = not decoder.opts.scan
    out["layers"] = "loop" if looped else "scan"
    out["layers_why"] = (
        "--arg scan=false: the layers as a Python loop, as Hugging Face's Flax models run them (each layer's "
        "residuals and gradients its own, freed as the backward pass leaves it)" if looped else
        "the default: the layers under nn.scan, as MaxText compiles them (one layer's program; residuals and "
        "gradients stacked over the layers); --arg scan=false runs them as a Python loop, as Hugging Face's "
        "Flax models do")
    src.update(loss="user" if tiles > 1 else "default", layers="user" if looped else "default")


def _remat(out: dict, src: dict, opts, wl) -> None:
    """The checkpoint policy: --remat (placed by the model's hook or --remat-at), else none of jaxmem's; a
    custom step's checkpoints are its own unless jaxmem placed some (--remat-at)."""
    out["remat"] = opts.remat
    if opts.remat != "none":
        src["remat"] = "user"
    elif wl.is_custom_step:
        out["remat"], src["remat"] = "the step's own", "model"
    else:
        src["remat"] = "default"


def _base(out: dict, src: dict, opts, wl, planned, leaves) -> None:
    """LoRA's frozen base: --base-dtype, else the checkpoint's dtype (Workload.checkpoint_dtype: a
    config.json's torch_dtype) where the step computes in it, else the dtype the model creates its
    parameters in."""
    ft = opts.finetune()
    if not ft.lora_rank:
        out["base_dtype"] = None
        return
    resolved = planned.options.finetune.base_dtype if planned is not None else ft.base_dtype
    ckpt = getattr(wl, "checkpoint_dtype", None)
    created = sorted({leaf.dtype for leaf in leaves if leaf.category == "params" and leaf.trainable is False})
    if ft.base_dtype is not None:
        out["base_dtype"], why, src["base_dtype"] = ft.base_dtype, f"--base-dtype {ft.base_dtype}", "user"
    elif resolved is not None:
        out["base_dtype"], src["base_dtype"] = resolved, "model"
        why = (f"the checkpoint's dtype ({ckpt}: the model's torch_dtype), as the fine-tuner loads it; --base-dtype "
               "int8/nf4 quantizes it")
    elif ckpt is not None and ckpt != "float32":
        out["base_dtype"], src["base_dtype"] = "/".join(created) or "float32", "default"
        why = (f"the checkpoint is {ckpt}, but --precision {opts.precision} computes in fp32 and a {ckpt} base would "
               "mix dtypes in the model: upcast to fp32 (--precision bf16 keeps it as the checkpoint stores it)")
    else:
        out["base_dtype"], src["base_dtype"] = "/".join(created) or "as created", "model"
        why = "the dtype the model creates its parameters in (--base-dtype bf16/int8/nf4 stores it smaller)"
    out["base_dtype_why"] = why


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
