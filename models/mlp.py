"""A plain multilayer perceptron in Flax linen: the smallest workload jaxmem analyzes.

    jaxmem analyze models/mlp.py --arg preset=tiny
    jaxmem analyze models/mlp.py --arg hidden=8192 --arg n_layers=12

Everything here is abstract: the batch is a pytree of ``jax.ShapeDtypeStruct`` and
the model is only a description; jaxmem initializes it with ``jax.eval_shape``.
"""

from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import jaxmem


@dataclass(frozen=True)
class Config:
    d_in: int = 1024  # input features (a flattened 32x32 image, say)
    hidden: int = 4096  # width of every hidden layer
    n_layers: int = 8  # Dense layers in all, the classifier head included
    n_classes: int = 1000  # ImageNet-sized head
    batch_size: int = 256  # default global batch
    remat: str = "none"  # a jaxmem.REMAT_POLICIES name: checkpoint every hidden layer


PRESETS = {
    "tiny": Config(d_in=64, hidden=256, n_layers=4, n_classes=10, batch_size=8),  # tests: ~0.15 M params
    "base": Config(),  # 109 M params: 0.44 GB in fp32
    "large": Config(d_in=4096, hidden=8192, n_layers=12, n_classes=1000, batch_size=256),  # 713 M params
}


class Layer(nn.Module):
    features: int

    @nn.compact
    def __call__(self, x):
        return nn.relu(nn.Dense(self.features, name="dense")(x))  # (B, features)


class MLP(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x, train: bool = True):  # x: (B, d_in)
        cfg = self.config
        layer = Layer
        if cfg.remat != "none":
            layer = nn.remat(Layer, policy=jaxmem.remat_policy(cfg.remat))
        for i in range(cfg.n_layers - 1):
            x = layer(cfg.hidden, name=f"layer_{i}")(x)  # (B, hidden)
        return nn.Dense(cfg.n_classes, name="head")(x)  # (B, n_classes)


def loss_fn(model, batch):
    logits = model(batch["x"], train=True)
    labels = batch["y"]
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()


def workload(preset: str = "base", batch_size: int | None = None, remat: str = "none", **overrides) -> jaxmem.Workload:
    """The MLP of ``preset`` (keys of PRESETS); ``overrides`` replace Config fields.

    ``remat`` (a jaxmem.REMAT_POLICIES name) checkpoints every hidden layer.
    """
    cfg = _config(preset, dict(overrides, remat=remat))
    B = batch_size or cfg.batch_size
    batch = {
        "x": jax.ShapeDtypeStruct((B, cfg.d_in), jnp.float32),
        "y": jax.ShapeDtypeStruct((B,), jnp.int32),
    }
    return jaxmem.Workload(model=MLP(cfg), batch=batch, loss=loss_fn, optimizer=optax.adamw(1e-3), name=f"mlp-{preset}")


def _config(preset: str, overrides: dict) -> Config:
    return jaxmem.choose_preset("mlp", PRESETS, preset, overrides)
