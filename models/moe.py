"""A Mixtral-style mixture-of-experts decoder in Flax linen: Llama's attention, a sparse MoE MLP.

    jaxmem analyze models/moe.py --arg preset=tiny --mesh data=2
    jaxmem analyze models/moe.py --arg preset=mixtral-8x7b --mesh data=16 --batch 16 --precision bf16 --remat full
    jaxmem analyze models/moe.py --arg preset=mixtral-8x7b --arg capacity_factor=2.0 --arg attention=cudnn --precision bf16

Each layer is pre-norm attention (RMSNorm, RoPE, grouped-query attention: ``models/llama.py``'s
own ``Attention``) and a sparse MoE block in place of the dense SwiGLU MLP: a router (a
d_model -> n_experts projection), top-k routing (k=2 in Mixtral) with a softmax over the k
chosen logits, and ``n_experts`` SwiGLU experts whose kernels are stacked on a leading experts
axis, ``(n_experts, embed, mlp)`` and ``(n_experts, mlp, embed)``. The layers run under
``nn.scan`` (+ ``nn.remat``) exactly as Llama's do.

Dispatch ("dropping" MoE, GShard / Switch Transformer; MaxText's ``capacity_factor`` path):
tokens are routed in groups of ``group_size`` tokens (default: one sequence, as MaxText
groups them). Each expert takes at most

    capacity = ceil(group_size * top_k * capacity_factor / n_experts)

tokens of a group; choices beyond it are dropped (that token's other expert and the residual
still carry it). All first choices of a group are placed before any second choice, so a
token loses its second expert before another token loses its first (GShard's priority).
Dispatch and combine are one-hot tensors of shape (groups, group_size, n_experts, capacity),
and moving tokens in and out of the experts is two dense einsums with them, which is what XLA
compiles and what the memory analysis sees:

    expert_in  (groups, n_experts, capacity, d_model) = einsum(x, dispatch)
    expert_out (groups, n_experts, capacity, d_model) = SwiGLU experts(expert_in)
    y          (groups, group_size, d_model)          = einsum(expert_out, combine)

So memory is realistic for this formulation: expert activations are top_k * capacity_factor
times a dense MLP's, and dispatch/combine grow with group_size * tokens (quadratic in the
group size: lower ``group_size`` for long sequences). Dropless MoE (MegaBlocks, MaxText's
default ``sparse_matmul``: tokens sorted by expert, grouped GEMMs) is not modelled.

The load-balancing loss is Switch Transformer's (Fedus et al. 2021, eq. 4), per layer:
n_experts * sum_e f_e * P_e, with f_e the fraction of the (token, choice) assignments that
chose expert e (before capacity drops) and P_e the router probability of e averaged over the
tokens; it is 1 when routing is uniform. The loss is cross-entropy plus
``aux_loss_coef`` (default 0.01, Switch's alpha) times its mean over the layers.

Logical axis names are Llama's (one rule set serves both), plus ``exp`` (MaxText's name) for
the experts dimension of the expert kernels and of the expert activations:

    parameters:  embed, mlp, heads, kv_heads, head_dim, vocab, layers, exp
    activations: batch, length, embed, heads, mlp, vocab, exp

The router's kernel is ``(embed, None)``: its n_experts columns are never split. The router
computes in fp32 whatever the numerics (Switch's selective precision: routing decisions in
bf16 flip between experts), the softmaxes and the cross-entropy too. ``attention`` and
``numerics`` are Llama's (see models/llama.py).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

# A sibling model file (jaxmem puts models/ on sys.path while it imports this one): the
# attention, norm, RoPE and named-kernel einsum are Llama's, unchanged.
from llama import (
    NUMERICS,
    Attention,
    Einsum,
    RMSNorm,
    _constrain,
    _dense,
    _param_init,
    rope_tables,
)

import jaxmem
from jaxmem.errors import UserError


@dataclass(frozen=True)
class Config:
    vocab_size: int = 32000  # Mistral's tokenizer (v1)
    d_model: int = 4096
    n_layers: int = 32
    n_heads: int = 32  # query heads
    n_kv_heads: int = 8  # grouped-query attention
    head_dim: int | None = None  # None: d_model // n_heads
    ffn_dim: int = 14336  # each expert's SwiGLU hidden width
    n_experts: int = 8
    top_k: int = 2  # experts per token
    capacity_factor: float = 1.25  # Switch Transformer's training default
    group_size: int | None = None  # tokens routed together; None: one sequence
    aux_loss_coef: float = 0.01  # Switch Transformer's alpha
    rope_theta: float = 1e6  # Mixtral's RoPE base
    norm_eps: float = 1e-5
    seq_len: int = 4096
    batch_size: int = 8  # default global batch, in sequences
    remat: str = "none"  # a jaxmem.REMAT_POLICIES name
    attention: str = "xla"  # "xla" | "cudnn", as models/llama.py
    numerics: str = "default"  # "default" | "maxtext", as models/llama.py

    # llama.Attention reads n_heads, n_kv_heads, hd, dtype and attention from its config.
    @property
    def hd(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def dtype(self):
        return NUMERICS[self.numerics]


PRESETS = {
    # tests: 0.25 M params, compiles in seconds
    "tiny": Config(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, n_experts=4,
                   seq_len=32, batch_size=4),
    # Mixtral 8x7B: 46.7 B params, 12.9 B active per token
    "mixtral-8x7b": Config(),
    # Mixtral 8x22B: 141 B params, 39 B active (v3 tokenizer: 32768 tokens)
    "mixtral-8x22b": Config(vocab_size=32768, d_model=6144, n_layers=56, n_heads=48, n_kv_heads=8, ffn_dim=16384),
}


def expert_capacity(cfg: Config, group_size: int) -> int:
    """Tokens each expert takes from one group; an expert can never get more than the group."""
    return min(group_size, math.ceil(group_size * cfg.top_k * cfg.capacity_factor / cfg.n_experts))


def route(logits, top_k: int, capacity: int, dtype):
    """Top-k routing of one layer's groups of tokens, with capacity.

    logits: (groups, group_size, n_experts) fp32. Returns (dispatch, combine, aux):
    dispatch and combine (groups, group_size, n_experts, capacity) in ``dtype``, and the
    Switch load-balancing loss (a scalar).
    """
    n_experts = logits.shape[-1]
    top_logits, top_idx = jax.lax.top_k(logits, top_k)  # (g, s, k)
    gates = jax.nn.softmax(top_logits, axis=-1)  # Mixtral: the chosen experts' weights sum to 1
    choice = jax.nn.one_hot(top_idx, n_experts, dtype=jnp.int32)  # (g, s, k, E)

    # Place every token's first choice before any second choice: count per expert in the
    # order (choice, token) -- GShard's priority -- and drop what lands beyond capacity.
    g, s = logits.shape[:2]
    by_choice = choice.transpose(0, 2, 1, 3).reshape(g, top_k * s, n_experts)
    position = (jnp.cumsum(by_choice, axis=1) - 1).reshape(g, top_k, s, n_experts).transpose(0, 2, 1, 3)
    kept = choice * (position < capacity)  # (g, s, k, E)
    # The k experts of a token are distinct, so summing over k leaves one slot per (token, expert).
    slot = jnp.where(jnp.sum(kept, axis=2) > 0, jnp.sum(position * kept, axis=2), -1)  # (g, s, E); -1: none
    gate = jnp.sum(gates[..., None] * kept, axis=2)  # (g, s, E): the gate of a kept choice, else 0
    dispatch = jax.nn.one_hot(slot, capacity, dtype=dtype)  # (g, s, E, C); slot -1 is all zeros
    combine = dispatch * gate[..., None].astype(dtype)

    fraction = jnp.mean(choice, axis=(0, 1, 2), dtype=jnp.float32)  # f_e: share of all assignments, sums to 1
    prob = jnp.mean(jax.nn.softmax(logits, axis=-1), axis=(0, 1))  # P_e
    aux = n_experts * jnp.sum(fraction * prob)
    return dispatch, combine, aux


class MoE(nn.Module):
    """The sparse MLP: router, top-k dispatch with capacity, SwiGLU experts, weighted combine."""

    config: Config

    @nn.compact
    def __call__(self, x):  # x: (B, T, d_model)
        cfg = self.config
        B, T, M = x.shape
        E, H = cfg.n_experts, cfg.ffn_dim
        G = cfg.group_size or T
        if T % G:
            raise UserError(f"moe: seq_len={T} is not a multiple of group_size={G}")
        C = expert_capacity(cfg, G)
        dt = cfg.dtype or x.dtype  # one-hot dispatch/combine in the compute dtype, as the tokens

        # Groups split each sequence (batch-major), so the batch sharding carries over to them.
        xg = _constrain(x.reshape(B * T // G, G, M), "batch", "length", "embed")  # (g, G, M)
        logits = Einsum((M, E), "gsm,me->gse", ("embed", None), jnp.float32, name="router")(xg)  # (g, G, E) fp32
        dispatch, combine, aux = route(logits, cfg.top_k, C, dt)

        # Expert activations are group-major, (g, E, C, .): the groups keep the batch's sharding.
        expert_in = jnp.einsum("gsm,gsec->gecm", xg.astype(dt), dispatch)  # (g, E, C, M)
        expert_in = _constrain(expert_in, "batch", "exp", None, "embed")
        gate = Einsum((E, M, H), "gecm,emh->gech", ("exp", "embed", "mlp"), cfg.dtype, name="gate_proj")(expert_in)
        up = Einsum((E, M, H), "gecm,emh->gech", ("exp", "embed", "mlp"), cfg.dtype, name="up_proj")(expert_in)
        h = _constrain(nn.silu(gate) * up, "batch", "exp", None, "mlp")  # (g, E, C, H): SwiGLU per expert
        out = Einsum((E, H, M), "gech,ehm->gecm", ("exp", "mlp", "embed"), cfg.dtype, name="down_proj")(h)
        out = _constrain(out, "batch", "exp", None, "embed")  # (g, E, C, M)
        y = jnp.einsum("gecm,gsec->gsm", out, combine.astype(out.dtype))  # (g, G, M)
        return y.reshape(B, T, M).astype(x.dtype), aux


class DecoderLayer(nn.Module):
    """One pre-norm layer: (x, cos, sin) -> (x, aux), the aux loss stacked by nn.scan over the layers."""

    config: Config

    @nn.compact
    def __call__(self, x, cos, sin):
        cfg = self.config
        x = x + Attention(cfg, family="moe", name="attn")(RMSNorm(cfg.norm_eps, name="attn_norm")(x), cos, sin)
        y, aux = MoE(cfg, name="moe")(RMSNorm(cfg.norm_eps, name="moe_norm")(x))
        return _constrain(x + y, "batch", "length", "embed"), aux


class Mixtral(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, tokens, train: bool = True):  # tokens: (B, T) int32 -> (logits, aux loss)
        cfg = self.config
        T = tokens.shape[1]
        embed = nn.Embed(
            cfg.vocab_size,
            cfg.d_model,
            embedding_init=_param_init("vocab", "embed", init=nn.initializers.normal(stddev=1.0)),
            param_dtype=jnp.float32,
            dtype=cfg.dtype,
            name="embed",
        )
        x = _constrain(embed(tokens), "batch", "length", "embed")  # (B, T, d_model)
        cos, sin = rope_tables(T, cfg.hd, cfg.rope_theta)

        layer = DecoderLayer
        if cfg.remat != "none":
            # prevent_cse=False: scan already keeps XLA from merging the recomputation away
            layer = nn.remat(layer, policy=jaxmem.remat_policy(cfg.remat), prevent_cse=False)
        layers = nn.scan(
            layer,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=(nn.broadcast, nn.broadcast),
            length=cfg.n_layers,
            metadata_params={nn.PARTITION_NAME: "layers"},
        )
        x, aux = layers(cfg, name="layers")(x, cos, sin)  # aux: (n_layers,)
        x = RMSNorm(cfg.norm_eps, name="final_norm")(x)
        logits = _dense(cfg.vocab_size, kernel_init=_param_init("embed", "vocab"), dtype=cfg.dtype, name="lm_head")(x)
        return _constrain(logits, "batch", "length", "vocab"), jnp.mean(aux)


def loss_fn(model, batch):
    logits, aux = model(batch["tokens"], train=True)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["targets"]).mean()
    return ce + model.config.aux_loss_coef * aux


def workload(
    preset: str = "mixtral-8x7b",
    batch_size: int | None = None,
    seq_len: int | None = None,
    remat: str = "none",
    **overrides,
) -> jaxmem.Workload:
    """The MoE of ``preset`` (keys of PRESETS); ``overrides`` replace Config fields
    (``capacity_factor``, ``group_size``, ``attention``, ``numerics``, ...).

    The batch is ``tokens`` and next-token ``targets``, both (batch_size, seq_len) int32.
    """
    cfg = _config(preset, dict(overrides, remat=remat))
    B = batch_size or cfg.batch_size
    T = seq_len or cfg.seq_len
    if T % (cfg.group_size or T):
        raise UserError(f"moe: seq_len={T} is not a multiple of group_size={cfg.group_size}")
    batch = {
        "tokens": jax.ShapeDtypeStruct((B, T), jnp.int32),
        "targets": jax.ShapeDtypeStruct((B, T), jnp.int32),
    }
    return jaxmem.Workload(model=Mixtral(cfg), batch=batch, loss=loss_fn, optimizer=optax.adamw(3e-4),
                           name=f"moe-{preset}")


def _config(preset: str, overrides: dict) -> Config:
    cfg = jaxmem.choose_preset("moe", PRESETS, preset, overrides)
    if cfg.n_heads % cfg.n_kv_heads:
        raise UserError(f"moe: n_heads={cfg.n_heads} is not a multiple of n_kv_heads={cfg.n_kv_heads}")
    if cfg.head_dim is None and cfg.d_model % cfg.n_heads:
        raise UserError(f"moe: d_model={cfg.d_model} is not a multiple of n_heads={cfg.n_heads}; give head_dim")
    if cfg.attention not in ("xla", "cudnn"):
        raise UserError(f"moe: attention={cfg.attention!r}; expected 'xla' or 'cudnn'")
    if cfg.numerics not in NUMERICS:
        raise UserError(f"moe: numerics={cfg.numerics!r}; expected one of {', '.join(map(repr, NUMERICS))}")
    if not 1 <= cfg.top_k <= cfg.n_experts:
        raise UserError(f"moe: top_k={cfg.top_k} must be between 1 and n_experts={cfg.n_experts}")
    cf = cfg.capacity_factor
    if isinstance(cf, bool) or not isinstance(cf, numbers.Real) or not math.isfinite(cf) or not cf > 0:
        # inf reached math.ceil inside flax's scan: an OverflowError blaming flax's axes_scan.py
        raise UserError(f"moe: capacity_factor={cf!r} must be a positive, finite number (dropless MoE is not "
                        f"modelled); {cfg.n_experts / cfg.top_k:g} (n_experts / top_k) already drops no token")
    if cfg.group_size is not None and cfg.group_size < 1:
        raise UserError(f"moe: group_size={cfg.group_size} must be at least 1")
    return cfg
