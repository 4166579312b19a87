"""The gemma library's Gemma 4 (gm.nn, text only), trained as a plain next-token loss: outside code."""
import jax
import jax.numpy as jnp
import optax
from gemma import gm

import jaxmem


def loss(model, batch):
    logits = model(batch["tokens"]).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], batch["tokens"][:, 1:]).mean()


def workload(batch_size: int = 8, seq_len: int = 1024, size: str = "E2B"):
    return jaxmem.Workload(
        model=getattr(gm.nn, f"Gemma4_{size}")(text_only=True),
        batch={"tokens": jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)},
        loss=loss,
        optimizer=optax.adamw(1e-4),
    )
