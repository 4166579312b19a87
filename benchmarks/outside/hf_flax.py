"""Hugging Face transformers' Flax models (4.57.6, the last release that ships them) as their own code
builds them: the model class from a config.json, `_do_init=False` (no weights allocated), its linen
`.module` given to jaxmem, a next-token loss over its logits. Outside code: nothing renamed.

    jaxmem analyze benchmarks/outside/hf_flax.py --arg config=benchmarks/hf_configs/Llama-3.1-8B.json \\
        --arg layers=4 --gpu h100 --mesh fsdp=8

`config`: a config.json (its `model_type` picks the class: llama, mistral, gpt2); `layers`,
`positions`: override num_hidden_layers / max_position_embeddings (0: as the file says).
`positions_as_data=1` gives the model position ids as a batch input: XLA then cannot slice the rotary
table HF's FlaxLlama computes in numpy in `setup` (max_position_embeddings rows), and keeps it whole.
"""
import json
import pathlib

import jax
import jax.numpy as jnp
import optax
import transformers

import jaxmem

CLASSES = {"llama": "FlaxLlamaForCausalLM", "mistral": "FlaxMistralForCausalLM", "gpt2": "FlaxGPT2LMHeadModel"}
TINY = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}


def loss_of(positions_as_data: bool):
    def loss(model, batch):
        tokens = batch["tokens"]
        b, t = tokens.shape   # as HF's own __call__ makes them (the module takes them given)
        positions = batch["positions"] if positions_as_data else jnp.broadcast_to(jnp.arange(t), (b, t))
        logits = model(tokens, jnp.ones_like(tokens), positions).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()
    return loss


def workload(batch_size: int = 8, seq_len: int = 1024, config: str = "tiny", layers: int = 0, positions: int = 0,
             positions_as_data: bool = False):
    d = dict(TINY) if config == "tiny" else json.loads(pathlib.Path(config).read_text())
    if layers:
        d["num_hidden_layers" if d["model_type"] != "gpt2" else "n_layer"] = layers
    if positions:
        d["max_position_embeddings" if d["model_type"] != "gpt2" else "n_positions"] = positions
    cfg = transformers.AutoConfig.for_model(**d)
    model = getattr(transformers, CLASSES[d["model_type"]])(cfg, _do_init=False, dtype=jnp.float32)
    batch = {"tokens": jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)}
    if positions_as_data:
        batch["positions"] = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)
    return jaxmem.Workload(model=model.module, batch=batch, loss=loss_of(positions_as_data),
                           optimizer=optax.adamw(1e-4))
