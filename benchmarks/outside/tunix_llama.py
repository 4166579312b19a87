"""tunix's Llama 3 (tunix.models.llama3, `google-tunix` on PyPI) as tunix's trainer runs it: the model
built from its own config, whose parameters carry tunix's ('fsdp', 'tp') annotations and whose layers
constrain their activations under the trainer's mesh; a next-token loss over its logits (tunix's
PeftTrainer default: positions and a causal mask given to the model). Outside code: nothing renamed.

    jaxmem analyze benchmarks/outside/tunix_llama.py --gpu h100 --mesh fsdp=8,tp=1
"""
import jax
import jax.numpy as jnp
import optax
from tunix.models.llama3 import model as llama

import jaxmem

TINY = {"num_layers": 2, "vocab_size": 256, "embed_dim": 64, "hidden_dim": 128, "num_heads": 4, "head_dim": 16,
        "num_kv_heads": 2, "rope_theta": 10_000, "norm_eps": 1e-5, "weight_tying": True}


def loss(model, batch):
    tokens = batch["tokens"]
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), jnp.bool_)), (b, t, t))
    logits, _ = model(tokens, positions, None, mask)
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()


def workload(batch_size: int = 8, seq_len: int = 1024, size: str = "llama3p2_1b"):
    config = llama.ModelConfig(**TINY) if size == "tiny" else getattr(llama.ModelConfig, size)()
    return jaxmem.Workload(
        model=lambda rngs: llama.Llama3(config, rngs=rngs),
        batch={"tokens": jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)},
        loss=loss,
        optimizer=optax.adamw(1e-4),
    )
