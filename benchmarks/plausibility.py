"""jaxmem's answers against public fine-tuning figures: torchtune's README (Llama-2-7B LoRA and QLoRA on
one RTX 4090), the QLoRA paper (65B on one 48 GB GPU) and Unsloth's Llama 3.1 8B max-context table.

    python benchmarks/plausibility.py             # every row -> results/plausibility.md
    python benchmarks/plausibility.py --only unsloth   # the rows whose name contains "unsloth" (no file written)

Each row compiles the public setting through a config.json (the published model's shape: the files in
benchmarks/plausibility/ are the public configs of meta-llama/Llama-2-7b-hf and huggyllama/llama-65b;
Llama 3.1 8B's is benchmarks/hf_configs/Llama-3.1-8B.json) with ``jaxmem analyze ... --json`` in a
subprocess, and sets jaxmem's per-device peak beside the public number: a peak (torchtune: bytes
reserved by PyTorch's allocator, GB = 1e9 bytes) or the card a setting ran on (the QLoRA paper's 48 GB,
Unsloth's VRAM column: what fits on it). "ratio" is jaxmem's peak over the public number (over the
card's memory for the fits-on-a-card rows). No GPU ran anything here: the two programs differ (PyTorch
with bitsandbytes, an allocator that caches, kernels of its own) and "what differs" lists what is known
to move memory between them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "plausibility.md"
L2 = "benchmarks/plausibility/Llama-2-7b-hf.json"
L65 = "benchmarks/plausibility/llama-65b.json"
L31 = "benchmarks/hf_configs/Llama-3.1-8B.json"
TORCHTUNE = ("https://github.com/pytorch/torchtune/blob/fef3ed10dc9efe9e35b118e4397e84c680c0a737/README.md "
             "(table \"minimum memory requirements\"; configs recipes/configs/llama2/7B_lora_single_device.yaml and "
             "7B_qlora_single_device.yaml at that commit; alpaca_cleaned_dataset, max_seq_len 512)")
QLORA = "https://arxiv.org/abs/2305.14314 (abstract: \"finetune a 65B parameter model on a single 48GB GPU\")"
UNSLOTH = ("https://github.com/unslothai/unsloth/blob/e3162dc5bf88bf4c2b598c74cbcaba0706c4067b/README.md "
           "(\"Llama 3.1 (8B) max. context length\")")
UNSLOTH_SETTING = ("Llama 3.1 8B, 4-bit QLoRA r=32 on q, k, v, o, gate, up, down; batch 1, sequences padded to the "
                   "length")


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    source: str
    setting: str
    public: str             # the number as published
    public_bytes: float     # what jaxmem's peak is set against
    args: tuple[str, ...]
    differs: str


def _qlora_unsloth(vram: str, card: str, column: str, tokens: int, seq: int, tiles: int, public: str) -> Row:
    args = (L31, "--gpu", card, "--precision", "bf16", "--lora", "32", "--lora-targets", "attn/|mlp/", "--base-dtype",
            "nf4", "--remat", "full", "--arg", "batch_size=1", "--arg", f"seq_len={seq}")
    if tiles > 1:
        args += ("--arg", f"vocab_tiles={tiles}")
    why = f"a multiple of {tiles} for vocab_tiles={tiles}" if tiles > 1 else "even, as jax's cuDNN attention needs"
    at = f"{seq:,} tokens" + (f" ({tokens:,} rounded up to {why})" if seq != tokens else "")
    unsloth = column == "Unsloth"
    return Row(
        f"unsloth: {column} on {vram}", UNSLOTH, f"{UNSLOTH_SETTING}; {column}: {tokens:,} tokens fit on {vram}",
        public, 0.0, args,
        ("Unsloth offloads the checkpointed activations to host RAM (its gradient checkpointing) and chunks the "
         "loss; jaxmem keeps every layer's saved input on the device (no activation offload for a config.json "
         f"model), with the loss in {tiles} tiles; compiled at {at}. A ratio above 1 is that offload: jaxmem "
         "says this context does not fit on the card without it" if unsloth else
         "Hugging Face + FlashAttention-2 + bitsandbytes with gradient checkpointing, the plain loss: the program "
         f"closest to jaxmem's (cuDNN flash attention, full remat, plain loss), compiled at {at}; bitsandbytes "
         "keeps the output head in 16 bits, qwix's NF4 quantizes every dense kernel, the head's too. jaxmem's "
         "step needs about half the card at the context Hugging Face reached: what else bounded that run (the "
         "caching allocator's reserve, bitsandbytes' per-matmul dequantized weights, transformers' fp32 copy of "
         "the logits in its loss) was not measured here"))


ROWS = (
    Row("torchtune: Llama-2-7B QLoRA, 1 x RTX 4090", TORCHTUNE,
        "QLoRA r=8 alpha 16 on q, k, v, o and the MLP (not the output), NF4 base, dtype bf16, AdamW, batch 2, "
        "activation checkpointing, alpaca (up to 512 tokens)",
        "9.29 GB peak", 9.29e9,
        (L2, "--gpu", "rtx-4090", "--precision", "bf16-pure", "--lora", "8", "--lora-alpha", "16", "--lora-targets",
         "attn/|mlp/", "--base-dtype", "nf4", "--remat", "full", "--arg", "batch_size=2", "--arg", "seq_len=512"),
        "torchtune's peak is torch.cuda.max_memory_reserved (the caching allocator's reserve, above the bytes live) "
        "over a dataset whose batches are padded to their longest sample (up to 512); jaxmem compiles 2 x 512 "
        "tokens, SDPA's flash kernel there, cuDNN's here; torchao's NF4 there, qwix's here "
        "(per-channel fp32 scales), which also quantizes the output head that torchtune keeps in bf16 (about "
        "0.2 GB less here)"),
    Row("torchtune: Llama-2-7B LoRA, 1 x RTX 4090", TORCHTUNE,
        "LoRA r=8 alpha 16 on q and v, bf16 base, dtype bf16, AdamW, batch 2, activation checkpointing, alpaca "
        "(up to 512 tokens)",
        "17.18 GB peak", 17.18e9,
        (L2, "--gpu", "rtx-4090", "--precision", "bf16-pure", "--lora", "8", "--lora-alpha", "16", "--lora-targets",
         "attn/(q|v)_proj", "--base-dtype", "bf16", "--remat", "full", "--arg", "batch_size=2", "--arg",
         "seq_len=512"),
        "as the QLoRA row: reserved bytes against live bytes, padded batches of up to 512 tokens against 2 x 512"),
    Row("QLoRA paper: 65B on one 48 GB GPU", QLORA,
        "LLaMA 65B, NF4 base, LoRA r=64 alpha 16 on every linear layer of the blocks, bf16 compute, gradient "
        "checkpointing, paged AdamW; one 512-token sequence per step here",
        "fits on one 48 GB GPU (RTX A6000)", 0.0,
        (L65, "--gpu", "rtx-a6000", "--precision", "bf16", "--lora", "64", "--lora-alpha", "16", "--lora-targets",
         "attn/|mlp/", "--base-dtype", "nf4", "--remat", "full", "--arg", "batch_size=1", "--arg", "seq_len=512"),
        "the paper pages optimizer states to host RAM when memory spikes (paged optimizers) and double-quantizes "
        "the NF4 scales (about 3 GB less on 65B); jaxmem keeps AdamW's state on the device and qwix's scales in "
        "fp32. It fits only with a larger share of the card for JAX: XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 (JAX's "
        "default 75% leaves it 35.65 GiB), which PyTorch's allocator does not need"),
    _qlora_unsloth("24 GB", "rtx-4090", "Hugging Face + FA2", 5_789, 5_790, 1, "5,789 tokens fit"),
    _qlora_unsloth("24 GB", "rtx-4090", "Unsloth", 78_475, 78_480, 16, "78,475 tokens fit"),
    _qlora_unsloth("80 GB", "a100-80g", "Hugging Face + FA2", 28_454, 28_454, 1, "28,454 tokens fit"),
    _qlora_unsloth("80 GB", "a100-80g", "Unsloth", 342_733, 342_736, 16, "342,733 tokens fit"),
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def analyze(args: tuple[str, ...]) -> dict:
    cmd = [sys.executable, "-m", "jaxmem.cli", "analyze", *args, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=7200)
    if out.returncode not in (0, 3):
        raise RuntimeError(f"{shlex.join(cmd)} exited {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def table(only: str | None) -> list[str]:
    lines = ["| setting (source below) | public | jaxmem peak/device | against | ratio | jaxmem's choices |",
             "|---|---:|---:|---:|---:|---|"]
    notes = []
    for i, row in enumerate(ROWS, 1):
        if only and only.lower() not in row.name.lower():
            continue
        d = analyze(row.args)
        print(f"$ jaxmem analyze {shlex.join(row.args)}: {d['per_device_peak_bytes']:,}", file=sys.stderr, flush=True)
        peak = d["per_device_peak_bytes"]
        against = row.public_bytes or d["target"]["memory_bytes"]
        what = "the public peak" if row.public_bytes else f"the {d['target']['gpu']}'s {against / 2**30:,.2f} GiB"
        c = d["choices"]
        chosen = (f"{c['precision']}, attention {c['attention']}, loss {c['loss']}, remat {c['remat']}, LoRA r="
                  f"{c['lora_rank']}, base {c['base_dtype']}; trainable {d['trainable_param_count']:,}")
        lines.append(f"| [{i}] {row.name} | {row.public} | {peak / 1e9:,.2f} GB ({peak / 2**30:,.2f} GiB) | "
                     f"{what} | {peak / against:.2f} | {chosen} |")
        notes += [f"{i}. **{row.name}**: {row.setting}.", f"   Source: {row.source}.",
                  f"   jaxmem: `jaxmem analyze {shlex.join(row.args)}`.", f"   What differs: {row.differs}.", ""]
    return [*lines, "", *notes]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only")
    a = ap.parse_args()
    import jax

    body = table(a.only)
    text = "\n".join([
        "# Plausibility: jaxmem against public fine-tuning figures",
        "",
        (f"`python benchmarks/plausibility.py` (jax {jax.__version__}, deviceless compiles; "
         "benchmarks/plausibility.py says how each column is made). A ratio near 1 says jaxmem's compiled step "
         "needs what the published run needed; the notes say what differs between the two programs."),
        "",
        *body,
    ])
    if a.only:
        print(text)
    else:
        RESULT.write_text(text)
        print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
