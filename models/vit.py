"""A Vision Transformer (ViT, Dosovitskiy et al. 2020) in Flax NNX.

    jaxmem analyze models/vit.py --arg preset=vit-l16 --arg batch_size=64 --remat full

``model=`` is a function ``rngs -> ViT``: jaxmem calls it under ``nnx.eval_shape``,
so no parameter is ever allocated. NNX puts no module names into the compiled
program, so each block names itself with ``jax.named_scope`` (``block_3/attn/...``):
that is what lets jaxmem say which layer a buffer belongs to.

Dropout modules hold their own ``dropout`` rng stream (NNX state that the step
updates), and are active: NNX modules start in training mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import jaxmem
from jaxmem.errors import UserError


@dataclass(frozen=True)
class Config:
    image_size: int = 224  # ImageNet crops
    patch_size: int = 16  # 16x16 patches: 14 x 14 = 196 tokens at 224
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    mlp_dim: int = 3072  # 4 x d_model
    n_classes: int = 1000
    dropout: float = 0.1  # the paper's rate for ImageNet training
    batch_size: int = 128  # default global batch
    remat: str = "none"  # a jaxmem.REMAT_POLICIES name; "none" keeps every activation


PRESETS = {
    # tests: 81 k params
    "tiny": Config(image_size=32, patch_size=8, d_model=64, n_layers=2, n_heads=4, mlp_dim=128, n_classes=10, batch_size=4),
    "vit-s16": Config(d_model=384, n_layers=12, n_heads=6, mlp_dim=1536),  # 22 M params
    "vit-b16": Config(),  # 86.6 M
    "vit-l16": Config(d_model=1024, n_layers=24, n_heads=16, mlp_dim=4096),  # 304 M
    "vit-h14": Config(patch_size=14, d_model=1280, n_layers=32, n_heads=16, mlp_dim=5120),  # 632 M
}


class Attention(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        self.n_heads = cfg.n_heads
        self.qkv = nnx.Linear(cfg.d_model, 3 * cfg.d_model, rngs=rngs)
        self.proj = nnx.Linear(cfg.d_model, cfg.d_model, rngs=rngs)

    def __call__(self, x):  # x: (B, N, C)
        B, N, C = x.shape
        hs = C // self.n_heads
        qkv = self.qkv(x).reshape(B, N, 3, self.n_heads, hs)  # (B, N, 3, heads, hs)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # 3 x (B, N, heads, hs)
        att = jnp.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(hs)  # (B, heads, N, N)
        att = jax.nn.softmax(att.astype(jnp.float32), axis=-1).astype(v.dtype)  # softmax in fp32
        out = jnp.einsum("bhnm,bmhd->bnhd", att, v).reshape(B, N, C)  # heads back together: (B, N, C)
        return self.proj(out)


class MLP(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(cfg.d_model, cfg.mlp_dim, rngs=rngs)
        self.fc2 = nnx.Linear(cfg.mlp_dim, cfg.d_model, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, x):
        x = self.dropout(nnx.gelu(self.fc1(x), approximate=False))  # (B, N, mlp_dim)
        return self.dropout(self.fc2(x))  # (B, N, C)


class Block(nnx.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: Config, index: int, *, rngs: nnx.Rngs):
        self.scope = f"block_{index}"  # a plain str attribute: static, part of the graph definition
        self.ln1 = nnx.LayerNorm(cfg.d_model, epsilon=1e-6, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.attn_dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.ln2 = nnx.LayerNorm(cfg.d_model, epsilon=1e-6, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x):
        with jax.named_scope(self.scope):
            with jax.named_scope("attn"):
                x = x + self.attn_dropout(self.attn(self.ln1(x)))
            with jax.named_scope("mlp"):
                x = x + self.mlp(self.ln2(x))
            return x


def _run_block(block: Block, x):
    return block(x)


class ViT(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        self.cfg = cfg  # a frozen dataclass: static
        p, d = cfg.patch_size, cfg.d_model
        n_patches = (cfg.image_size // p) ** 2
        self.patch_embed = nnx.Conv(3, d, kernel_size=(p, p), strides=(p, p), padding="VALID", rngs=rngs)
        self.cls_token = nnx.Param(jnp.zeros((1, 1, d)))
        # learned positions, one more for the class token
        self.pos_embed = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, n_patches + 1, d)))
        self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, i, rngs=rngs) for i in range(cfg.n_layers)])
        self.norm = nnx.LayerNorm(d, epsilon=1e-6, rngs=rngs)
        self.head = nnx.Linear(d, cfg.n_classes, rngs=rngs)

    def __call__(self, images):  # images: (B, H, W, 3)
        with jax.named_scope("ViT"):  # the root of every op_name, as linen's top module name is
            return self._forward(images)

    def _forward(self, images):
        cfg = self.cfg
        with jax.named_scope("patch_embed"):
            x = self.patch_embed(images)  # (B, H/p, W/p, C)
            B, h, w, C = x.shape
            x = x.reshape(B, h * w, C)  # one token per patch: (B, N, C)
            cls = jnp.broadcast_to(self.cls_token[...].astype(x.dtype), (B, 1, C))
            x = jnp.concatenate([cls, x], axis=1) + self.pos_embed[...].astype(x.dtype)  # (B, N+1, C)
            x = self.dropout(x)
        run = _run_block
        if cfg.remat != "none":
            run = nnx.remat(_run_block, policy=jaxmem.remat_policy(cfg.remat))
        for block in self.blocks:
            x = run(block, x)
        with jax.named_scope("head"):
            return self.head(self.norm(x[:, 0]))  # classify from the cls token: (B, n_classes)


def loss_fn(model, batch):
    logits = model(batch["image"])
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["label"]).mean()


def workload(
    preset: str = "vit-b16",
    batch_size: int | None = None,
    image_size: int | None = None,
    remat: str = "none",
    **overrides,
) -> jaxmem.Workload:
    """The ViT of ``preset`` (keys of PRESETS); ``overrides`` replace Config fields.

    ``image_size`` changes the number of patches, and so the size of the learned
    position table.
    """
    if image_size is not None:
        overrides["image_size"] = image_size
    cfg = _config(preset, dict(overrides, remat=remat))
    B = batch_size or cfg.batch_size
    S = cfg.image_size
    batch = {
        "image": jax.ShapeDtypeStruct((B, S, S, 3), jnp.float32),  # NHWC
        "label": jax.ShapeDtypeStruct((B,), jnp.int32),
    }
    return jaxmem.Workload(
        model=lambda rngs: ViT(cfg, rngs=rngs),
        batch=batch,
        loss=loss_fn,
        optimizer=optax.adamw(1e-3),
        name=preset if preset.startswith("vit") else f"vit-{preset}",
    )


def _config(preset: str, overrides: dict) -> Config:
    cfg = jaxmem.choose_preset("vit", PRESETS, preset, overrides)
    if cfg.image_size % cfg.patch_size:
        raise UserError(f"vit: image_size={cfg.image_size} is not a multiple of patch_size={cfg.patch_size}")
    if cfg.d_model % cfg.n_heads:
        raise UserError(f"vit: d_model={cfg.d_model} is not a multiple of n_heads={cfg.n_heads}")
    return cfg
