"""A held-out CNN and its training step written by hand, the way a user writes it.

Two things live here, on purpose in one file:

* ``workload()``: the model file ``jaxmem analyze`` reads (the model, the batch, the loss,
  the optimizer) -- jaxmem builds its own step from it;
* ``train_step_by_hand()``: the same model trained by a step written without jaxmem:
  plain ``jax.jit`` + ``optax``, the train state donated (``donate_argnums``), the
  shardings given by hand (state replicated, batch split over a ``data`` axis).

``benchmarks/accuracy.py`` measures the second with the same peak-RSS method as
jaxmem's own step and compares it with ``jaxmem analyze`` of this file: the table
then shows whether jaxmem's step is the program users run.

The model (not one of models/): three conv stages with BatchNorm and ReLU, average
pooling, dropout before the head; SGD with momentum; 64x64 RGB images.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmem


class CNN(nn.Module):
    width: int = 64
    n_classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool = True):
        for i, f in enumerate((self.width, 2 * self.width, 4 * self.width)):
            x = nn.Conv(f, (3, 3), use_bias=False, name=f"conv{i}")(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9, name=f"bn{i}")(x)
            x = nn.relu(x)
            x = nn.Conv(f, (3, 3), name=f"conv{i}b")(x)
            x = nn.relu(x)
            x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = x.mean(axis=(1, 2))
        x = nn.Dropout(0.2)(x, deterministic=not train)
        return nn.Dense(self.n_classes, name="head")(x)


def optimizer():
    return optax.sgd(0.05, momentum=0.9)


def loss(model, batch):
    logits = model(batch["image"], train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()


def workload(batch_size: int = 32, image_size: int = 64, width: int = 64) -> jaxmem.Workload:
    batch = {"image": jax.ShapeDtypeStruct((batch_size, image_size, image_size, 3), jnp.float32),
             "label": jax.ShapeDtypeStruct((batch_size,), jnp.int32)}
    return jaxmem.Workload(model=CNN(width), batch=batch, loss=loss, optimizer=optimizer(), name="handwritten-cnn")


def train_step_by_hand(devices, compiler_options=None, batch_size: int = 32, image_size: int = 64,
                       width: int = 64):
    """(compiled step, its arguments placed on `devices`): a user's data-parallel step, not jaxmem's."""
    mesh = Mesh(np.array(devices), ("data",))
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    model, tx = CNN(width), optimizer()

    @jax.jit
    def init(key):
        variables = model.init({"params": key}, jnp.zeros((1, image_size, image_size, 3)), train=False)
        params = variables["params"]
        return {"params": params, "batch_stats": variables["batch_stats"], "opt_state": tx.init(params)}

    def train_step(state, batch, key):
        def loss_fn(params):
            logits, updates = model.apply({"params": params, "batch_stats": state["batch_stats"]}, batch["image"],
                                          train=True, rngs={"dropout": key}, mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), updates

        (loss_value, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        deltas, opt_state = tx.update(grads, state["opt_state"], state["params"])
        new_state = {"params": optax.apply_updates(state["params"], deltas),
                     "batch_stats": updates["batch_stats"], "opt_state": opt_state}
        return new_state, loss_value

    state = jax.device_put(init(jax.random.key(0)), replicated)
    rng = np.random.default_rng(0)
    batch = {"image": jax.device_put(rng.standard_normal((batch_size, image_size, image_size, 3), np.float32), split),
             "label": jax.device_put(rng.integers(0, 10, batch_size).astype(np.int32), split)}
    key = jax.device_put(jax.random.PRNGKey(1), replicated)  # raw uint32 key data, as most training loops keep it
    step = jax.jit(train_step, in_shardings=(replicated, split, replicated), out_shardings=(replicated, replicated),
                   donate_argnums=(0,), compiler_options=compiler_options)
    args = (state, batch, key)
    return step.lower(*args).compile(), args
