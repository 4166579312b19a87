"""tunix's Llama 3 (tunix.models.llama3, `google-tunix` on PyPI) as tunix's trainer runs it: the model
built from its own config, whose parameters carry tunix's ('fsdp', 'tp') annotations and whose layers
constrain their activations under the trainer's mesh; a next-token loss over its logits (tunix's
PeftTrainer default: positions and a causal mask given to the model). Outside code: nothing renamed.

    jaxmem analyze benchmarks/outside/tunix_llama.py --gpu h100 --mesh fsdp=8,tp=1

`--arg lora=16`: qwix LoRA of rank 16 applied the way tunix's PEFT examples apply it (qwix.LoraProvider
over the attention and MLP projections, qwix.apply_lora_to_model with the model's get_model_input());
tunix's PeftTrainer then trains the nnx.LoRAParam leaves only, as jaxmem does with a model carrying them.
"""
import jax
import jax.numpy as jnp
import optax
import qwix
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


# tunix's examples: the attention and MLP projections (alpha 2 x rank, as there)
LORA_MODULES = ".*q_proj|.*k_proj|.*v_proj|.*o_proj|.*gate_proj|.*down_proj|.*up_proj"


def build(config, rngs, lora: int):
    model = llama.Llama3(config, rngs=rngs)
    if not lora:
        return model
    provider = qwix.LoraProvider(module_path=LORA_MODULES, rank=lora, alpha=2.0 * lora)
    return qwix.apply_lora_to_model(model, provider, **model.get_model_input())


def workload(batch_size: int = 8, seq_len: int = 1024, size: str = "llama3p2_1b", lora: int = 0):
    config = llama.ModelConfig(**TINY) if size == "tiny" else getattr(llama.ModelConfig, size)()
    return jaxmem.Workload(
        model=lambda rngs: build(config, rngs, lora),
        batch={"tokens": jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)},
        loss=loss,
        optimizer=optax.adamw(1e-4),
    )
