"""A ViT written the way big_vision writes it (google-research/big_vision, big_vision/models/vit.py):
linen, nn.compact, the encoder blocks' activations constrained with big_vision's own logical names
("act_batch", "act_len", "act_emb") and nothing else annotated; big_vision's trainer pairs them with
its sharding_rules (train.py's default: [("act_batch", "data")]) and shards the parameters by its own
FSDP strategy. Not shaped for jaxmem: it is analyzed as written (benchmarks/outside_rules.py).

    jaxmem analyze benchmarks/outside/bv_vit.py --arg variant=B/16 --mesh data=8 --precision bf16 --batch 4096
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxmem

WIDTH = {"mu": 32, "Ti": 192, "S": 384, "B": 768, "L": 1024}
DEPTH = {"mu": 2, "Ti": 12, "S": 12, "B": 12, "L": 24}
MLP = {"mu": 128, "Ti": 768, "S": 1536, "B": 3072, "L": 4096}
HEADS = {"mu": 2, "Ti": 3, "S": 6, "B": 12, "L": 16}


class MlpBlock(nn.Module):
    mlp_dim: int | None = None

    @nn.compact
    def __call__(self, x, deterministic=True):
        inits = {"kernel_init": nn.initializers.xavier_uniform(), "bias_init": nn.initializers.normal(stddev=1e-6)}
        d = x.shape[-1]
        x = nn.Dense(self.mlp_dim or 4 * d, **inits)(x)
        x = nn.gelu(x)
        return nn.Dense(d, **inits)(x)


class Encoder1DBlock(nn.Module):
    mlp_dim: int | None = None
    num_heads: int = 12

    @nn.compact
    def __call__(self, x, deterministic=True):
        x = nn.with_logical_constraint(x, ("act_batch", "act_len", "act_emb"))
        y = nn.LayerNorm()(x)
        y = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, kernel_init=nn.initializers.xavier_uniform(),
                                            deterministic=deterministic)(y, y)
        y = nn.with_logical_constraint(y, ("act_batch", "act_len", "act_emb"))
        x = x + y
        y = nn.LayerNorm()(x)
        y = MlpBlock(mlp_dim=self.mlp_dim)(y, deterministic)
        y = nn.with_logical_constraint(y, ("act_batch", "act_len", "act_emb"))
        x = x + y
        return nn.with_logical_constraint(x, ("act_batch", "act_len", "act_emb"))


class Encoder(nn.Module):
    depth: int
    mlp_dim: int | None = None
    num_heads: int = 12

    @nn.compact
    def __call__(self, x, deterministic=True):
        for lyr in range(self.depth):
            x = Encoder1DBlock(name=f"encoderblock_{lyr}", mlp_dim=self.mlp_dim, num_heads=self.num_heads)(
                x, deterministic)
        return nn.LayerNorm(name="encoder_norm")(x)


class ViT(nn.Module):
    num_classes: int = 1000
    patch_size: tuple[int, int] = (16, 16)
    width: int = 768
    depth: int = 12
    mlp_dim: int | None = None
    num_heads: int = 12

    @nn.compact
    def __call__(self, image, *, train=False):
        x = nn.Conv(self.width, self.patch_size, strides=self.patch_size, padding="VALID", name="embedding")(image)
        n, h, w, c = x.shape
        x = jnp.reshape(x, [n, h * w, c])
        x = x + self.param("pos_embedding", nn.initializers.normal(stddev=1 / np.sqrt(c)), (1, h * w, c), x.dtype)
        x = Encoder(depth=self.depth, mlp_dim=self.mlp_dim, num_heads=self.num_heads, name="Transformer")(
            x, deterministic=not train)
        x = jnp.mean(x, axis=1)   # pool_type "gap"
        return nn.Dense(self.num_classes, name="head", kernel_init=nn.initializers.zeros)(x)


def workload(variant: str = "mu/16", batch: int = 16, res: int = 224) -> jaxmem.Workload:
    v, patch = variant.split("/")
    model = ViT(patch_size=(int(patch), int(patch)), width=WIDTH[v], depth=DEPTH[v], mlp_dim=MLP[v],
                num_heads=HEADS[v])
    res = 32 if v == "mu" else res
    images = jax.ShapeDtypeStruct((batch, res, res, 3), jnp.float32)
    labels = jax.ShapeDtypeStruct((batch,), jnp.int32)

    def loss_fn(apply, b):   # big_vision's classification trainer: softmax cross-entropy on the logits
        logits = apply(b["image"], train=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, b["labels"]).mean()

    return jaxmem.Workload(model=model, batch={"image": images, "labels": labels}, loss=loss_fn,
                           optimizer=optax.adamw(1e-3), name=f"bv-vit-{variant}")
