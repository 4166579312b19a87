"""GPT-2 (models/gpt2.py) with a training step written by hand over 8 devices, the way a user writes it.

* ``workload()``: the model file ``jaxmem analyze`` reads -- models/gpt2.py's own workload;
* ``train_step_by_hand()``: plain ``jax.jit`` + ``optax.adamw``, the train state donated,
  shardings written by hand on a ``data`` mesh axis:

  - ``layout="dp"``: state replicated, batch split;
  - ``layout="fsdp"``: every state leaf split on its largest dimension divisible by the
    device count (ZeRO-3 / FSDP as the common JAX recipes write it), batch split; no
    sharding constraint inside the step (XLA propagates from the in/out shardings).

  ``precision="bf16"`` casts the fp32 params to bf16 inside the loss (mixed precision,
  fp32 master weights and optimizer state).

``benchmarks/accuracy.py`` measures it like jaxmem's own step and compares with
``jaxmem analyze benchmarks/handwritten/gpt.py --layout <layout> --precision <precision>``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

_spec = importlib.util.spec_from_file_location("_gpt2_model", Path(__file__).resolve().parents[2] / "models" / "gpt2.py")
gpt2 = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = gpt2  # flax's dataclass transform looks the module up
_spec.loader.exec_module(gpt2)


def workload(batch_size: int = 16, **config):
    return gpt2.workload(preset="gpt2", batch_size=batch_size, **config)


def fsdp_spec(shape, n: int) -> P:
    """The largest dimension divisible by n (the last on ties) split over 'data'; else replicated."""
    dims = [i for i, d in enumerate(shape) if d % n == 0]
    if not dims or n == 1:
        return P()
    best = max(dims, key=lambda i: (shape[i], i))
    return P(*[("data" if i == best else None) for i in range(len(shape))])


def train_step_by_hand(devices, compiler_options=None, batch_size: int = 16, layout: str = "dp",
                       precision: str = "fp32", **config):
    """(compiled step, its arguments placed on `devices`)."""
    wl = workload(batch_size=batch_size, **config)
    model, cfg = wl.model, wl.model.config
    n = len(devices)
    mesh = Mesh(np.array(devices), ("data",))
    tx = optax.adamw(6e-4)
    T = wl.batch["tokens"].shape[1]

    def init(key):
        params = model.init({"params": key}, jnp.zeros((1, T), jnp.int32), train=False)["params"]
        return {"params": params, "opt_state": tx.init(params)}

    abstract = jax.eval_shape(init, jax.random.PRNGKey(0))
    if layout == "dp":
        state_sh = jax.tree.map(lambda _: NamedSharding(mesh, P()), abstract)
    elif layout == "fsdp":
        state_sh = jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(x.shape, n)), abstract)
    else:
        raise ValueError(f"layout {layout!r}: dp or fsdp")
    split, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())

    def train_step(state, batch, key):
        def loss_fn(params):
            if precision == "bf16":
                params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
            logits = model.apply({"params": params}, batch["tokens"], train=True, rngs={"dropout": key})
            return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32),
                                                                   batch["targets"]).mean()

        loss_value, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss_value

    state = jax.jit(init, out_shardings=state_sh)(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (batch_size, T)).astype(np.int32)
    batch = {"tokens": jax.device_put(tokens, split), "targets": jax.device_put(np.roll(tokens, -1, 1), split)}
    key = jax.device_put(jax.random.PRNGKey(1), replicated)
    step = jax.jit(train_step, in_shardings=(state_sh, split, replicated), out_shardings=(state_sh, replicated),
                   donate_argnums=(0,), compiler_options=compiler_options)
    args = (state, batch, key)
    return step.lower(*args).compile(), args
