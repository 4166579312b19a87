"""Llama in Flax NNX, written as outside NNX code usually is (Flax's own NNX Gemma is): layers in a
Python loop, ``nnx.Linear`` projections, RMSNorm, rotary embeddings, grouped-query attention,
SwiGLU. No ``jax.named_scope`` and no remat hook: ``workload()`` takes no ``remat``.

    jaxmem analyze models/llama_nnx.py --arg preset=1b --mesh data=8 --precision bf16
    jaxmem analyze models/llama_nnx.py --arg preset=1b --mesh data=8 --precision bf16 --remat full --remat-at Block

jaxmem names each module call by its attribute path (``Llama/blocks/3/attn``) while the step is
traced, and ``--remat-at Block`` checkpoints the blocks without the model asking for it
(jaxmem/program/calls.py). The layers' parameters are fp32; the compute follows them (``--precision
bf16`` casts them in the step).
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
    vocab_size: int = 128256
    d_model: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 8
    ffn_dim: int = 14336
    rope_theta: float = 500000.0
    tie_embeddings: bool = False
    seq_len: int = 8192
    batch_size: int = 8

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


PRESETS = {
    "tiny": Config(vocab_size=256, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=128, seq_len=64,
                   batch_size=8, tie_embeddings=True),  # tests
    # Llama 3.2 1B: 1.24 B parameters, tied embeddings
    "1b": Config(d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, tie_embeddings=True),
    "8b": Config(),  # Llama 3 8B
}


def rope(x, theta: float):
    """Rotate (x1, x2) halves of each head by its position's angle. x: (B, T, heads, hd)."""
    t, hd = x.shape[1], x.shape[-1]
    inv = 1.0 / theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
    ang = jnp.arange(t, dtype=jnp.float32)[:, None] * inv[None, :]          # (T, hd/2)
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: Config, rngs: nnx.Rngs):
        d, hd = cfg.d_model, cfg.head_dim
        self.cfg = cfg
        self.q = nnx.Linear(d, cfg.n_heads * hd, use_bias=False, rngs=rngs)
        self.k = nnx.Linear(d, cfg.n_kv_heads * hd, use_bias=False, rngs=rngs)
        self.v = nnx.Linear(d, cfg.n_kv_heads * hd, use_bias=False, rngs=rngs)
        self.o = nnx.Linear(cfg.n_heads * hd, d, use_bias=False, rngs=rngs)

    def __call__(self, x):  # (B, T, d)
        cfg, (b, t, _) = self.cfg, x.shape
        q = rope(self.q(x).reshape(b, t, cfg.n_heads, cfg.head_dim), cfg.rope_theta)
        k = rope(self.k(x).reshape(b, t, cfg.n_kv_heads, cfg.head_dim), cfg.rope_theta)
        v = self.v(x).reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
        group = cfg.n_heads // cfg.n_kv_heads   # grouped-query attention: each K/V head serves `group` queries
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        scores = jnp.einsum("bthd,bshd->bhts", q, k).astype(jnp.float32) / cfg.head_dim ** 0.5
        mask = jnp.tril(jnp.ones((t, t), dtype=bool))
        probs = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1).astype(v.dtype)
        return self.o(jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, -1))


class MLP(nnx.Module):
    def __init__(self, cfg: Config, rngs: nnx.Rngs):
        self.gate = nnx.Linear(cfg.d_model, cfg.ffn_dim, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(cfg.d_model, cfg.ffn_dim, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(cfg.ffn_dim, cfg.d_model, use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class Block(nnx.Module):
    def __init__(self, cfg: Config, rngs: nnx.Rngs):
        self.attn_norm = nnx.RMSNorm(cfg.d_model, rngs=rngs)
        self.attn = Attention(cfg, rngs)
        self.mlp_norm = nnx.RMSNorm(cfg.d_model, rngs=rngs)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nnx.Module):
    def __init__(self, cfg: Config, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.n_layers)])
        self.final_norm = nnx.RMSNorm(cfg.d_model, rngs=rngs)
        if not cfg.tie_embeddings:
            self.lm_head = nnx.Linear(cfg.d_model, cfg.vocab_size, use_bias=False, rngs=rngs)

    def __call__(self, tokens):  # (B, T) int32
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        x = self.final_norm(x)
        return self.embed.attend(x) if self.cfg.tie_embeddings else self.lm_head(x)   # (B, T, vocab)


def loss_fn(model, batch):
    logits = model(batch["tokens"])
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["targets"]).mean()


def workload(preset: str = "tiny", batch_size: int | None = None, seq_len: int | None = None,
             **overrides) -> jaxmem.Workload:
    """The NNX Llama of ``preset`` (keys of PRESETS); ``overrides`` replace Config fields."""
    cfg = jaxmem.choose_preset("llama_nnx", PRESETS, preset, overrides)
    B, T = batch_size or cfg.batch_size, seq_len or cfg.seq_len
    batch = {"tokens": jax.ShapeDtypeStruct((B, T), jnp.int32), "targets": jax.ShapeDtypeStruct((B, T), jnp.int32)}
    return jaxmem.Workload(model=lambda rngs: Llama(cfg, rngs), batch=batch, loss=loss_fn,
                           optimizer=optax.adamw(3e-4), name=f"llama_nnx-{preset}")
