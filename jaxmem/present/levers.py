"""The choices that decide a report's answer (Report.choices), as the text and HTML reports state them,
and the levers they leave: when attention scores, logits, the optimizer's moments, fp32 activations or
JAX's memory fraction decide the peak, a hint names the option that changes it and by about how much."""

from __future__ import annotations

import re

from jaxmem.report import Report
from jaxmem.units import fmt_bytes

SHARE = 0.10              # a part worth a hint: at least a tenth of the peak (as render.hints)
FRACTIONS = (0.9, 0.95)   # the shares trainers give JAX (advise tries the same)
TILES = 8                 # the vocabulary tiles a hint proposes (advise's VOCAB_TILES)


# the choices whose jaxmem default changes the answer most (a user who said nothing should see it was a guess):
# the renderers make their `(default)` stand out
STANDOUT = ("precision", "base_dtype", "attention", "mem_fraction")


def choice_parts(r: Report) -> list[tuple[str, str | None, bool]]:
    """The choices as (text, source, stands_out): `precision bf16`, "user", False. `source`: where the choice
    came from (Choices.sources; None for a report saved before sources were stated); `stands_out`: a default
    of STANDOUT, which the user did not choose and which changes the answer."""
    c = r.choices
    src = c.get("sources") or {}
    parts: list[tuple[str, str | None]] = [
        (f"precision {c.get('precision')}", "precision"), (f"attention {c.get('attention')}", "attention"),
        (f"loss {c.get('loss')}", "loss"), (f"remat {c.get('remat')}", "remat")]
    if c.get("layers") in ("scan", "loop"):   # a config.json decoder's, as compiled
        parts.insert(3, (f"layers {c['layers']}", "layers"))
    if c.get("lora_rank"):
        parts.append((f"LoRA r={c['lora_rank']} on {c.get('lora_targets')}", "lora_rank"))
        if c.get("base_dtype"):
            parts.append((f"base {c['base_dtype']}", "base_dtype"))
    else:
        parts.append(("no LoRA", None))
    frac = c.get("mem_fraction")
    parts.append(("memory fraction -" if frac is None else f"memory fraction {frac:g}", "mem_fraction"))
    if c.get("allocator"):   # the allocator the run uses (bfc, platform, cuda_async): what the fraction means
        parts.append((f"allocator {c['allocator']}", "allocator"))
    return [(text, src.get(key) if key else None, key in STANDOUT and src.get(key) == "default")
            for text, key in parts]


def choices_line(r: Report) -> str | None:
    """`choices: precision bf16 (user), attention cudnn (default), ..., no LoRA, memory fraction 0.75 (default)`:
    each choice with its source (user, model, default)."""
    if not r.choices:
        return None   # a report saved before choices were stated
    return "choices: " + ", ".join(text + (f" ({source})" if source else "")
                                   for text, source, _ in choice_parts(r))


def choice_notes(r: Report) -> list[str]:
    """The reasons worth reading: each of precision, attention, loss and the frozen base whose why says more
    than its flag."""
    c = r.choices
    out = []
    for key in ("precision", "attention", "loss", "base_dtype"):
        why = str(c.get(f"{key}_why") or "")
        if ":" in why:   # "--precision bf16" alone restates the value
            out.append(f"{key}: {why}")
    sharding = sharding_note(c)
    return out + ([sharding] if sharding else [])


def sharding_note(c) -> str | None:
    """`sharding: batch, embed over data; heads, layers whole (jaxmem's rules, default); ...; other parameters:
    ...`: every logical name the model uses with the mesh axes it is split over, grouped by the rules that placed
    it and their source, then the fallback for the parameters no name places (choices.logical_rules)."""
    rules = c.get("logical_rules") or []
    if not rules and not c.get("fallback_sharding"):
        return None
    groups: dict[tuple[str, str], dict[str, list[str]]] = {}
    for r in rules:
        where = "+".join(r.get("mesh_axes") or ()) or ""
        groups.setdefault((str(r.get("convention")), str(r.get("source"))), {}).setdefault(where, []).append(r["name"])
    parts = []
    for (convention, source), by_axes in groups.items():
        split = "; ".join(f"{', '.join(names)} " + (f"over {axes}" if axes else "whole")
                          for axes, names in sorted(by_axes.items(), key=lambda kv: kv[0] == ""))
        whose = "jaxmem's rules" if convention == "jaxmem" else convention
        parts.append(f"{split} ({whose}, {source})")
    if c.get("fallback_sharding"):
        parts.append(f"parameters no name places: {c['fallback_sharding']}")
    return "sharding: " + "; ".join(parts)


def _dims(shape: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", shape or ""))


def attention_score_bytes(r: Report) -> int:
    """Bytes of the buffers live at the peak shaped (..., T, T), T the batch's sequence length."""
    t = r.sequence_length
    if not t or t < 2:
        return 0
    return sum(b.size for b in r.top_buffers if len(d := _dims(b.shape)) >= 3 and d[-2:] == (t, t))


def logits_buffers(r: Report, vocab: int | None) -> list:
    """The activations and temporaries live at the peak shaped as logits: the vocabulary last, after
    (batch, sequence) or (batch x sequence) rows -- not the head's weights or their (embed, vocab) copies."""
    t = r.sequence_length or 1
    if not vocab:
        return []
    out = []
    for b in r.top_buffers:
        d = _dims(b.shape)
        rows = d[0] if len(d) == 2 else 0
        if (d[-1:] == (vocab,) and (len(d) >= 3 or (rows > 0 and rows % t == 0))
                and b.category in ("activations", "temporaries")):
            out.append(b)
    return out


def logits_bytes(r: Report, vocab: int | None) -> int:
    """Bytes of logits_buffers: the logits, their copies and gradients live at the peak."""
    return sum(b.size for b in logits_buffers(r, vocab))


def hints(r: Report) -> list[str]:
    """The levers of the choices: each part they decide that is at least SHARE of the peak, the option
    that changes it and its effect."""
    c = r.choices
    if not c:
        return []
    peak = max(r.per_device_peak_bytes, 1)
    config = bool(r.hf_config)
    fp32 = c.get("precision") == "fp32"
    out = []
    scores = attention_score_bytes(r)
    if scores >= SHARE * peak and c.get("attention") != "cudnn":
        how = (("--arg attention=cudnn" + (" with --precision bf16 (cuDNN has no fp32 kernel)" if fp32 else ""))
               if config else "jax.nn.dot_product_attention(q, k, v, implementation='cudnn') in the model, on bf16 "
               "inputs")
        out.append(f"attention scores {fmt_bytes(scores)} ({scores / peak:.0%} of the peak, (..., "
                   f"{r.sequence_length}, {r.sequence_length}) buffers): flash attention never materializes them: "
                   f"{how}")
    logits = logits_bytes(r, r.hf_config.get("vocab_size")) if config else 0
    if logits >= SHARE * peak and not str(c.get("loss", "")).startswith("cross_entropy_vocab_tiles"):
        out.append(f"logits {fmt_bytes(logits)} ({logits / peak:.0%} of the peak): --arg vocab_tiles={TILES} computes "
                   f"the loss in {TILES} tiles of the sequence, so about 1/{TILES} of them is live at a time "
                   "(the backward recomputes each tile)")
    opt = r.breakdown.get("optimizer_state", 0)
    jaxmems = str(r.options.get("optimizer", "")) not in ("workload's own",) and \
        not str(r.options.get("optimizer", "")).startswith("step's own")
    if opt >= SHARE * peak and jaxmems and not r.options.get("moment_dtype"):
        out.append(f"optimizer_state {fmt_bytes(opt)} ({opt / peak:.0%} of the peak): --moment-dtype bf16 keeps "
                   f"the moments in bf16, about {fmt_bytes(opt // 2)} less")
    acts = r.breakdown.get("activations_and_temporaries", 0)
    if fp32 and acts >= SHARE * peak:
        who = "as this model's trainers do" if config else "as mixed-precision trainers do"
        out.append(f"fp32 compute: --precision bf16 computes in bf16 {who}; activations and temporaries "
                   f"({fmt_bytes(acts)}) mostly halve")
    out.extend(_base_hint(r))
    out.extend(_fraction_hint(r))
    return out


# --base-dtype's smaller storages from each frozen base: (flag value, bytes per weight), after its own bytes
_SMALLER = {"float32": (4, (("bf16", 2), ("int8", 1), ("nf4", 0.5))), "bf16": (2, (("int8", 1), ("nf4", 0.5))),
            "bfloat16": (2, (("int8", 1), ("nf4", 0.5))), "int8": (1, (("nf4", 0.5),))}


def _base_hint(r: Report) -> list[str]:
    """A LoRA step whose frozen base is the largest part of the peak: --base-dtype and what it saves."""
    c, frozen = r.choices, r.frozen_bytes or 0
    others = [v for k, v in r.breakdown.items() if k != "params"] + [r.trainable_bytes or 0]
    base = str(c.get("base_dtype") or "")
    if not c.get("lora_rank") or base not in _SMALLER or frozen <= max(others, default=0):
        return []
    now, smaller = _SMALLER[base]
    fp32 = c.get("precision") == "fp32"   # a bf16 base needs bf16 compute (finetune.check)
    ways = ", ".join(f"--base-dtype {name}{' --precision bf16' if name == 'bf16' and fp32 else ''} about "
                     f"{fmt_bytes(int(frozen * b / now))}" for name, b in smaller)
    return [(f"frozen base {fmt_bytes(frozen)} ({frozen / max(r.per_device_peak_bytes, 1):.0%} of the peak, the "
             f"largest part, stored {base}): {ways}")]


def _fraction_hint(r: Report) -> list[str]:
    """JAX's default share of the card, when a larger one trainers set would hold the peak."""
    t, c = r.target, r.choices
    frac = c.get("mem_fraction")
    asked = "--mem-fraction" in str(c.get("mem_fraction_why"))   # a share the user states is theirs to keep
    if r.fits is not False or frac is None or t.memory_bytes is None or asked:
        return []
    for f in FRACTIONS:
        if f > frac and r.per_device_peak_bytes <= int(t.memory_bytes * f):
            return [(f"memory fraction {frac:g}: XLA_PYTHON_CLIENT_MEM_FRACTION={f} in the training's environment "
                     f"gives JAX {fmt_bytes(int(t.memory_bytes * f))} of the card, which holds this peak "
                     f"(jaxmem: --mem-fraction {f}; the runtime's memory outside the pool must still fit)")]
    return []
