"""A config.json decoder as a scan (the default) or a Python loop (--arg scan=false), against Hugging Face's
own Flax model of the same config (a Python loop of its layers), at the same settings (issue 48).

    python benchmarks/scan_or_loop.py       # prints the table, writes benchmarks/results/scan-or-loop.md

TinyLlama-1.1B (8 x 2048) and GPT-2 (8 x 1024), fp32 as the HF models default, --gpu h100 --mesh fsdp=8,
--remat none. HF's model is benchmarks/outside/hf_flax.py (transformers 4.57.6, `_do_init=False`, its
`.module`); its loss drops the last position, as a causal LM's does, so its logits are one row shorter.
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

import jaxmem  # noqa: E402

TINYLLAMA = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 32,
             "num_key_value_heads": 4, "num_hidden_layers": 22, "vocab_size": 32000, "max_position_embeddings": 2048,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu"}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024,
        "n_ctx": 1024, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
MODELS = (("TinyLlama-1.1B", TINYLLAMA, 2048), ("GPT-2 (124M)", GPT2, 1024))
COMMON = {"gpu": "h100", "mesh": "fsdp=8", "remat": "none", "cache": False}


def main() -> None:
    out = ["# A config.json decoder as a scan or a loop, beside Hugging Face's Flax model", "",
           (f"`python benchmarks/scan_or_loop.py` (jax {jax.__version__}): `--gpu h100 --mesh fsdp=8 --remat none`, "
            "fp32, batch 8 (global). The config.json rows are `jaxmem analyze CONFIG --arg batch_size=8 --arg "
            "seq_len=T` with `--arg scan=true` (the default) or `--arg scan=false`; HF's is `jaxmem analyze "
            "benchmarks/outside/hf_flax.py --arg config=CONFIG --arg batch_size=8 --arg seq_len=T`."), "",
           "| model | program | parameters | per-device peak | activations and temporaries | vs HF's loop |",
           "|---|---|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg, seq in MODELS:
            path = pathlib.Path(tmp) / name.split()[0] / "config.json"
            path.parent.mkdir()
            path.write_text(json.dumps(cfg))
            runs = [("Hugging Face's Flax model (a Python loop)", "benchmarks/outside/hf_flax.py",
                     {"config": str(path), "batch_size": 8, "seq_len": seq}),
                    ("config.json, --arg scan=true (nn.scan)", str(path), {"batch_size": 8, "seq_len": seq}),
                    ("config.json, --arg scan=false (a Python loop)", str(path),
                     {"batch_size": 8, "seq_len": seq, "scan": False})]
            hf_peak = None
            for label, model, args in runs:
                t = time.perf_counter()
                r = jaxmem.analyze(str(ROOT / model) if model.startswith("benchmarks") else model, args=args,
                                   **COMMON)
                peak = r.per_device_peak_bytes
                hf_peak = hf_peak or peak
                line = (f"| {name} | {label} | {r.param_count:,} | {peak / 2**30:.2f} GiB | "
                        f"{r.breakdown['activations_and_temporaries'] / 2**30:.2f} GiB | {peak / hf_peak - 1:+.1%} |")
                print(line, f"({time.perf_counter() - t:.0f} s)", flush=True)
                out.append(line)
    (ROOT / "benchmarks" / "results" / "scan-or-loop.md").write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
