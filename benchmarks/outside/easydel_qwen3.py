"""EasyDeL's Qwen3 (`easydel` on PyPI) as its trainer runs it: the model built from its own config and
trained through its own compute_loss (nothing renamed, no attribute touched). EasyDeL names its mesh
axes dp, fsdp, ep, tp, sp (jaxmem's common names: no --axis-roles needed), reads the context mesh
through eformer, and caches its RoPE table in the model's state on the first call.

    jaxmem analyze benchmarks/outside/easydel_qwen3.py --gpu h100 --mesh dp=1,fsdp=8,ep=1,tp=1,sp=1
"""
import easydel as ed
import jax
import jax.numpy as jnp
import optax

import jaxmem

CONFIGS = {
    # Qwen/Qwen3-0.6B's config.json
    "0.6b": {"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                 "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
                 "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True},
    "tiny": {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 128,
             "tie_word_embeddings": True},
}


def loss(model, batch):
    _, metrics = model.compute_loss(**batch)
    return metrics.loss


def workload(batch_size: int = 8, seq_len: int = 1024, size: str = "0.6b"):
    config = ed.Qwen3Config(**CONFIGS[size])
    return jaxmem.Workload(
        model=lambda rngs: ed.Qwen3ForCausalLM(config, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=rngs),
        batch={"input_ids": jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32),
               "attention_mask": jax.ShapeDtypeStruct((batch_size, seq_len), jnp.bool_)},
        loss=loss,
        optimizer=optax.adamw(1e-4),
    )
