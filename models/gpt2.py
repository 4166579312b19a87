"""GPT-2 in Flax linen, after nanoGPT's model.py: learned positions, tied embeddings, dropout.

    jaxmem analyze models/gpt2.py --arg preset=gpt2-medium --arg batch_size=16 --remat full

Dropout draws from the ``dropout`` rng (jaxmem binds the model with
``rngs={"dropout": key}``). With ``remat`` other than "none" every Block is
wrapped in ``nn.remat`` with that checkpoint policy.

Attention (``--arg attention=...``): ``xla`` (default) writes it out in jnp, as nanoGPT's
slow path; ``cudnn`` calls ``jax.nn.dot_product_attention(..., implementation="cudnn")``,
cuDNN's fused flash attention (nanoGPT's fast path is PyTorch's flash attention). Two
differences, both the library's: cuDNN has no fp32 kernel, so ``cudnn`` needs
``--precision bf16`` (with fp32 compute the step fails with a message saying so, rather than
quietly analyzing a program with other numerics); and ``jax.nn.dot_product_attention`` takes
no dropout, so ``cudnn`` drops the dropout on the attention probabilities (the residual and
MLP dropout stay).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import jaxmem
from jaxmem.errors import UserError


@dataclass(frozen=True)
class Config:
    block_size: int = 1024  # max sequence length: the learned position table has this many rows
    vocab_size: int = 50257  # GPT-2's BPE vocabulary (nanoGPT pads to 50304 for speed)
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.1  # GPT-2's own value; it makes the step draw random masks, as real training does
    batch_size: int = 8  # default global batch
    remat: str = "none"  # a jaxmem.REMAT_POLICIES name; "none" keeps every activation
    attention: str = "xla"  # "xla": attention written out in jnp; "cudnn": cuDNN flash attention (bf16 compute)


PRESETS = {
    "tiny": Config(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_embd=64, batch_size=4),  # tests
    "gpt2": Config(),  # 124 M params
    "gpt2-medium": Config(n_layer=24, n_head=16, n_embd=1024),  # 355 M
    "gpt2-large": Config(n_layer=36, n_head=20, n_embd=1280),  # 774 M
    "gpt2-xl": Config(n_layer=48, n_head=25, n_embd=1600),  # 1.56 B
}


def _init(std):
    return nn.initializers.normal(stddev=std)


class CausalSelfAttention(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x, train: bool):
        cfg = self.config
        B, T, C = x.shape
        nh, hs = cfg.n_head, C // cfg.n_head
        qkv = nn.Dense(3 * C, kernel_init=_init(0.02), name="c_attn")(x)  # (B, T, 3C)
        q, k, v = jnp.split(qkv, 3, axis=-1)  # 3 x (B, T, C)
        q, k, v = (t.reshape(B, T, nh, hs) for t in (q, k, v))  # (B, T, nh, hs)
        if cfg.attention == "cudnn":  # fused: no (T, T) scores, probabilities or dropout mask in memory
            if q.dtype not in (jnp.bfloat16, jnp.float16):
                if not self.is_initializing():
                    raise UserError(
                        f"gpt2: attention=cudnn needs bf16 or fp16 compute (cuDNN's fused attention has no fp32 kernel), "
                        f"but this step computes attention in {q.dtype}; add --precision bf16, or use --arg attention=xla")
                # init (jax.eval_shape through the loss) sees the fp32 parameters before --precision
                # casts them in the step: only shapes come out of it
                q, k, v = (t.astype(jnp.bfloat16) for t in (q, k, v))
            y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn").reshape(B, T, C)
        else:
            att = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hs)  # (B, nh, T, T)
            causal = jnp.tril(jnp.ones((T, T), dtype=bool))
            att = jnp.where(causal, att, jnp.finfo(att.dtype).min)
            att = jax.nn.softmax(att.astype(jnp.float32), axis=-1).astype(x.dtype)  # softmax in fp32
            att = nn.Dropout(cfg.dropout, name="attn_dropout")(att, deterministic=not train)
            y = jnp.einsum("bhts,bshd->bthd", att, v).reshape(B, T, C)  # re-assemble heads: (B, T, C)
        # residual projections get a smaller init, scaled by depth (GPT-2 paper)
        y = nn.Dense(C, kernel_init=_init(0.02 / math.sqrt(2 * cfg.n_layer)), name="c_proj")(y)
        return nn.Dropout(cfg.dropout, name="resid_dropout")(y, deterministic=not train)


class MLP(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x, train: bool):
        cfg = self.config
        x = nn.Dense(4 * cfg.n_embd, kernel_init=_init(0.02), name="c_fc")(x)  # (B, T, 4C)
        x = nn.gelu(x, approximate=True)  # GPT-2 uses the tanh approximation
        x = nn.Dense(cfg.n_embd, kernel_init=_init(0.02 / math.sqrt(2 * cfg.n_layer)), name="c_proj")(x)
        return nn.Dropout(cfg.dropout, name="dropout")(x, deterministic=not train)


class Block(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x, train: bool):
        x = x + CausalSelfAttention(self.config, name="attn")(nn.LayerNorm(epsilon=1e-5, name="ln_1")(x), train)
        x = x + MLP(self.config, name="mlp")(nn.LayerNorm(epsilon=1e-5, name="ln_2")(x), train)
        return x


class GPT(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, tokens, train: bool = True):  # tokens: (B, T) int32
        cfg = self.config
        B, T = tokens.shape
        block = Block
        if cfg.remat != "none":
            # argnum 2 is `train` (self counts as 0): a Python bool, so static
            block = nn.remat(Block, policy=jaxmem.remat_policy(cfg.remat), static_argnums=(2,))
        wte = nn.Embed(cfg.vocab_size, cfg.n_embd, embedding_init=_init(0.02), name="wte")
        wpe = nn.Embed(cfg.block_size, cfg.n_embd, embedding_init=_init(0.02), name="wpe")
        x = wte(tokens) + wpe(jnp.arange(T))[None]  # (B, T, C) + (1, T, C)
        x = nn.Dropout(cfg.dropout, name="drop")(x, deterministic=not train)
        for i in range(cfg.n_layer):
            x = block(cfg, name=f"block_{i}")(x, train)  # positional `train`: nn.remat's static_argnums
        x = nn.LayerNorm(epsilon=1e-5, name="ln_f")(x)
        return wte.attend(x)  # tied output head: (B, T, vocab)


def loss_fn(model, batch):
    logits = model(batch["tokens"], train=True)  # (B, T, vocab)
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["targets"]).mean()


def workload(
    preset: str = "gpt2",
    batch_size: int | None = None,
    seq_len: int | None = None,
    remat: str = "none",
    **overrides,
) -> jaxmem.Workload:
    """The GPT-2 of ``preset`` (keys of PRESETS); ``overrides`` replace Config fields.

    The batch is ``tokens`` and next-token ``targets``, both (batch_size, seq_len)
    int32; seq_len defaults to block_size and cannot exceed it.
    """
    cfg = _config(preset, dict(overrides, remat=remat))
    B = batch_size or cfg.batch_size
    T = seq_len or cfg.block_size
    if T > cfg.block_size:
        raise UserError(
            f"gpt2: seq_len={T} exceeds block_size={cfg.block_size} (the learned position table); raise block_size too"
        )
    batch = {
        "tokens": jax.ShapeDtypeStruct((B, T), jnp.int32),
        "targets": jax.ShapeDtypeStruct((B, T), jnp.int32),
    }
    name = preset if preset.startswith("gpt2") else f"gpt2-{preset}"
    return jaxmem.Workload(model=GPT(cfg), batch=batch, loss=loss_fn, optimizer=optax.adamw(6e-4), name=name)


def _config(preset: str, overrides: dict) -> Config:
    cfg = jaxmem.choose_preset("gpt2", PRESETS, preset, overrides, extra_args=("seq_len",))
    if cfg.n_embd % cfg.n_head:
        raise UserError(f"gpt2: n_embd={cfg.n_embd} is not a multiple of n_head={cfg.n_head}")
    if cfg.attention not in ("xla", "cudnn"):
        raise UserError(f"gpt2: attention={cfg.attention!r}; expected 'xla' or 'cudnn'")
    return cfg
