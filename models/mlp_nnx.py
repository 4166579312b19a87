"""An MLP with BatchNorm and dropout in Flax NNX: the smallest model with mutable NNX state.

    jaxmem analyze models/mlp_nnx.py --arg preset=tiny

Besides its ``nnx.Param``s the model holds ``nnx.BatchStat`` running statistics
(updated by every training step: NNX modules start in training mode) and the
dropout rng stream's key and counter; a correct step carries all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import jaxmem


@dataclass(frozen=True)
class Config:
    d_in: int = 1024  # input features
    hidden: int = 4096  # width of every hidden layer
    n_layers: int = 8  # Linear layers in all, the classifier head included
    n_classes: int = 1000
    dropout: float = 0.1  # makes the step draw from the dropout rng stream
    batch_size: int = 256  # default global batch
    remat: str = "none"  # a jaxmem.REMAT_POLICIES name: checkpoint every hidden layer


PRESETS = {
    "tiny": Config(d_in=64, hidden=256, n_layers=4, n_classes=10, batch_size=8),  # tests
    "base": Config(),  # 109 M params, as models/mlp.py's base
}


class Layer(nnx.Module):
    """Linear -> BatchNorm -> relu -> dropout, under its own name scope."""

    def __init__(self, d_in: int, d_out: int, dropout: float, index: int, *, rngs: nnx.Rngs):
        self.scope = f"layer_{index}"
        self.linear = nnx.Linear(d_in, d_out, use_bias=False, rngs=rngs)  # BatchNorm's bias replaces it
        self.norm = nnx.BatchNorm(d_out, momentum=0.9, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x):
        with jax.named_scope(self.scope):
            return self.dropout(nnx.relu(self.norm(self.linear(x))))  # (B, d_out)


def _run_layer(layer: Layer, x):
    return layer(x)


class MLP(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        dims = [cfg.d_in] + [cfg.hidden] * (cfg.n_layers - 1)
        pairs = zip(dims[:-1], dims[1:])  # (d_in, hidden), (hidden, hidden), ...
        self.layers = nnx.List([Layer(a, b, cfg.dropout, i, rngs=rngs) for i, (a, b) in enumerate(pairs)])
        self.head = nnx.Linear(cfg.hidden, cfg.n_classes, rngs=rngs)
        self.remat = cfg.remat

    def __call__(self, x):  # x: (B, d_in)
        run = _run_layer
        if self.remat != "none":
            run = nnx.remat(_run_layer, policy=jaxmem.remat_policy(self.remat))
        with jax.named_scope("MLP"):
            for layer in self.layers:
                x = run(layer, x)
            with jax.named_scope("head"):
                return self.head(x)  # (B, n_classes)


def loss_fn(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["y"]).mean()


def workload(preset: str = "tiny", batch_size: int | None = None, remat: str = "none", **overrides) -> jaxmem.Workload:
    """The MLP of ``preset`` (keys of PRESETS); ``overrides`` replace Config fields.

    ``remat`` (a jaxmem.REMAT_POLICIES name) checkpoints every hidden layer.
    """
    cfg = jaxmem.choose_preset("mlp_nnx", PRESETS, preset, dict(overrides, remat=remat))
    B = batch_size or cfg.batch_size
    batch = {
        "x": jax.ShapeDtypeStruct((B, cfg.d_in), jnp.float32),
        "y": jax.ShapeDtypeStruct((B,), jnp.int32),
    }
    return jaxmem.Workload(
        model=lambda rngs: MLP(cfg, rngs=rngs),
        batch=batch,
        loss=loss_fn,
        optimizer=optax.adamw(1e-3),
        name=f"mlp_nnx-{preset}",
    )
