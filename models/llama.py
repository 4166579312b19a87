"""A Llama-3-style decoder in Flax linen: RMSNorm, RoPE, grouped-query attention, SwiGLU.

    jaxmem analyze models/llama.py --arg preset=8b --remat full
    jaxmem analyze models/llama.py --arg preset=70b --arg batch_size=32 --arg seq_len=4096
    jaxmem analyze models/llama.py --arg preset=2-7b --arg attention=cudnn --precision bf16 --mesh data=8
    jaxmem analyze models/llama.py --arg preset=8b --arg numerics=maxtext --arg attention=cudnn
    jaxmem analyze models/llama.py --arg preset=2-70b --remat full --arg remat_save=query_proj,key_proj,value_proj
    jaxmem analyze models/llama.py --arg preset=8b-32k --precision bf16 --remat full --mesh data=8

Written the way large JAX models are (MaxText, the flax examples): the decoder
layers run under ``nn.scan`` (one compiled layer, parameters stacked on a leading
``layers`` axis), each wrapped in ``nn.remat`` when ``remat`` is not "none". Every
parameter carries logical axis names (``nn.with_logical_partitioning``) and the
main activations are constrained with ``nn.with_logical_constraint``, so a
sharding layout is a table of rules from these names to mesh axes:

    parameters:  embed (d_model), mlp (ffn hidden), heads, kv_heads, head_dim,
                 vocab, layers (the scan axis)
    activations: batch, length, embed, heads, mlp, vocab

The projections' outputs carry MaxText's checkpoint names (``query_proj``, ``key_proj``,
``value_proj``, ``context``, ``out_proj``, ``mlpwi_0``, ``mlpwi_1``, ``mlpwo``), so that GPU
recipes' named remat policies can be reproduced: ``--arg remat_save=NAME,...`` adds those
activations to what the ``--remat`` policy saves (with ``--remat full``: exactly MaxText's
``save_only_these_names``; e.g. its ``save_qkv_proj`` is ``remat_save=query_proj,key_proj,value_proj``).

Numerics (``--arg numerics=...``): parameters are always fp32.

    default  the compute dtype follows the parameters and inputs: fp32, or bf16 when
             ``--precision bf16`` casts the parameters in the step.
    maxtext  MaxText's defaults (``weight_dtype: float32``, ``dtype: bfloat16``): the
             embedding output, every matmul and the activations between them in bf16,
             whatever ``--precision`` says; the fp32 weights are cast at each use. Under
             ``--precision fp8`` the output head (``lm_head``, or the tied embedding's
             ``attend``) stays in bf16, as MaxText's ``quantization=fp8`` leaves the logits.

Either way RMSNorm, RoPE, the softmax and the cross-entropy compute in fp32, and cast back.

Attention (``--arg attention=...``): ``xla`` (default) writes it out in jnp, (T, T) scores
in memory; ``cudnn`` calls ``jax.nn.dot_product_attention(..., implementation="cudnn")``,
cuDNN's fused flash attention. cuDNN has no fp32 kernel, so ``cudnn`` needs bf16 compute
(``--precision bf16`` or ``numerics=maxtext``): with fp32 compute the step fails with a
message saying so, rather than quietly casting Q, K and V to bf16 -- a program that differs
from the one asked for (other numerics, extra cast buffers) would be analyzed in its place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.ad_checkpoint import checkpoint_name

import jaxmem
from jaxmem.errors import UserError


@dataclass(frozen=True)
class Config:
    vocab_size: int = 128256  # Llama 3's tokenizer
    d_model: int = 4096
    n_layers: int = 32
    n_heads: int = 32  # query heads
    n_kv_heads: int = 8  # grouped-query attention: 4 query heads share each K/V head
    head_dim: int | None = None  # None: d_model // n_heads
    ffn_dim: int = 14336  # SwiGLU hidden width (about 3.5 x d_model)
    rope_theta: float = 500000.0  # Llama 3's RoPE base (Llama 2 used 10000)
    norm_eps: float = 1e-5
    tie_embeddings: bool = False  # the 1B/3B models share the input embedding with the output head
    seq_len: int = 2048  # default sequence length (RoPE has no table: any length works)
    batch_size: int = 8  # default global batch, in sequences
    remat: str = "none"  # a jaxmem.REMAT_POLICIES name; "none" keeps every activation
    attention: str = "xla"  # "xla": attention written out in jnp; "cudnn": cuDNN flash attention (bf16 compute)
    numerics: str = "default"  # "default": compute follows the parameters; "maxtext": fp32 weights, bf16 compute
    remat_save: str = ""  # checkpoint names (comma-separated) saved on top of the remat policy; see the docstring

    @property
    def hd(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def dtype(self):
        """The compute dtype of embeddings and matmuls (flax's `dtype=`); None: promoted from the operands."""
        return NUMERICS[self.numerics]


NUMERICS = {"default": None, "maxtext": jnp.bfloat16}

PRESETS = {
    # tests: 0.1 M params
    "tiny": Config(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, seq_len=32, batch_size=4),
    # Llama 3.2 1B: 1.24 B params
    "1b": Config(d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, ffn_dim=8192, tie_embeddings=True),
    # Llama 3.2 3B: 3.21 B
    "3b": Config(d_model=3072, n_layers=28, n_heads=24, n_kv_heads=8, head_dim=128, ffn_dim=8192, tie_embeddings=True),
    # Llama 3 8B: 8.03 B
    "8b": Config(),
    # Llama 3 70B: 70.55 B
    "70b": Config(d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672),
    # Llama 3 8B at 32k tokens, the long-context set-up context parallelism is for (Llama 3.1's 8B
    # is this shape; its RoPE scaling changes angles, not memory). cuDNN attention by default: the
    # written-out scores would be (T, T) = 4 GiB per head per sequence in fp32. Needs bf16 compute.
    "8b-32k": Config(seq_len=32768, attention="cudnn"),
    # Llama 2 7B: 6.74 B (multi-head attention, 32k vocabulary, RoPE base 10000)
    "2-7b": Config(vocab_size=32000, n_kv_heads=32, ffn_dim=11008, rope_theta=10000.0, seq_len=4096),
    # Llama 2 70B: 68.98 B
    "2-70b": Config(vocab_size=32000, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672,
                    rope_theta=10000.0, seq_len=4096),
}

# Every parameter is created through _param_init: its initializer with logical axis names.
_INIT = nn.initializers.normal(stddev=0.02)
_dense = partial(nn.Dense, use_bias=False, param_dtype=jnp.float32)  # the 2-D projections


def _param_init(*names: str | None, init=_INIT):
    return nn.with_logical_partitioning(init, names)


def _constrain(x, *names: str | None):
    """Pin an activation's layout (a no-op unless jaxmem sets logical axis rules)."""
    return nn.with_logical_constraint(x, names)


class RMSNorm(nn.Module):
    eps: float = 1e-5

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", _param_init("embed", init=nn.initializers.ones), (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)  # the mean of squares overflows / loses precision in bf16
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * scale).astype(x.dtype)


def rope_tables(seq_len: int, head_dim: int, theta: float):
    """cos and sin of the rotary angles: each (seq_len, head_dim // 2), fp32."""
    inv_freq = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)  # (hd/2,)
    angles = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]  # (T, hd/2)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):
    """Rotate (x1, x2) halves of each head by the position's angle. x: (B, T, heads, hd)."""
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)  # 2 x (B, T, heads, hd/2)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # (1, T, 1, hd/2)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class Einsum(nn.Module):
    """A bias-free Dense whose kernel has any rank, each axis named: y = einsum(spec, x, kernel).

    (nn.DenseGeneral would do, but it initializes a flattened 2-D kernel and then
    fails to constrain it to the 3-D logical names when sharding rules are set.)
    """

    shape: tuple[int, ...]
    spec: str
    names: tuple[str, ...]
    dtype: jnp.dtype | None = None  # None: computes in the promoted dtype of x and kernel

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", _param_init(*self.names), self.shape, jnp.float32)
        if self.dtype is not None:
            x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
        return jnp.einsum(self.spec, x, kernel)


class Attention(nn.Module):
    config: Config  # also models/moe.py's Config: reads n_heads, n_kv_heads, hd, dtype, attention
    family: str = "llama"  # the model file its errors name

    @nn.compact
    def __call__(self, x, cos, sin):  # x: (B, T, d_model)
        cfg = self.config
        B, T, E = x.shape
        H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.hd
        dt = cfg.dtype
        q = Einsum((E, H, D), "bte,ehd->bthd", ("embed", "heads", "head_dim"), dt, name="q_proj")(x)  # (B, T, H, D)
        k = Einsum((E, K, D), "bte,ekd->btkd", ("embed", "kv_heads", "head_dim"), dt, name="k_proj")(x)  # (B, T, K, D)
        v = Einsum((E, K, D), "bte,ekd->btkd", ("embed", "kv_heads", "head_dim"), dt, name="v_proj")(x)  # (B, T, K, D)
        # MaxText's names, so that its named remat policies apply (remat_save)
        q, k, v = checkpoint_name(q, "query_proj"), checkpoint_name(k, "key_proj"), checkpoint_name(v, "value_proj")
        q = _constrain(q, "batch", "length", "heads", None)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        if cfg.attention == "cudnn":  # cuDNN's fused flash attention: no (T, T) scores in memory
            if q.dtype not in (jnp.bfloat16, jnp.float16):
                if not self.is_initializing():
                    raise UserError(
                        f"{self.family}: attention=cudnn needs bf16 or fp16 compute (cuDNN's fused attention has no fp32 kernel), "
                        f"but this step computes attention in {q.dtype}; add --precision bf16, or --arg numerics=maxtext "
                        "(fp32 weights, bf16 compute), or use --arg attention=xla")
                # init (jax.eval_shape through the loss) sees the fp32 parameters before --precision
                # casts them in the step: only shapes come out of it
                q, k, v = (t.astype(jnp.bfloat16) for t in (q, k, v))
            out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")  # (B, T, H, D)
            out = checkpoint_name(_constrain(out, "batch", "length", "heads", None), "context")
            out = Einsum((H, D, E), "bthd,hde->bte", ("heads", "head_dim", "embed"), dt, name="o_proj")(out)
            return checkpoint_name(out, "out_proj")
        # Group the query heads by the K/V head they share; K and V are never repeated.
        q = q.reshape(B, T, K, H // K, D)  # (B, T, K, G, D)
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k) / math.sqrt(D)  # (B, K, G, T, T)
        # The causal mask as an additive (T, T) bias: its derivative needs nothing saved. A jnp.where on the
        # scores instead keeps its full-shape (B, K, G, T, T) mask and fill as loop-invariant residuals, which
        # XLA materializes once and every layer reads forward and backward (14 of a 7B step's 38 GB of HBM
        # traffic per layer at T=4096).
        bias = jnp.where(jnp.tril(jnp.ones((T, T), dtype=bool)), 0.0, -1e30).astype(jnp.float32)
        scores = scores.astype(jnp.float32) + bias  # mask and softmax in fp32
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(B, T, H, D)  # heads back in order: (B, T, H, D)
        out = checkpoint_name(_constrain(out, "batch", "length", "heads", None), "context")
        out = Einsum((H, D, E), "bthd,hde->bte", ("heads", "head_dim", "embed"), dt, name="o_proj")(out)  # (B, T, d_model)
        return checkpoint_name(out, "out_proj")


class MLP(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x):  # x: (B, T, d_model)
        cfg = self.config
        dense = partial(_dense, dtype=cfg.dtype)
        gate = dense(cfg.ffn_dim, kernel_init=_param_init("embed", "mlp"), name="gate_proj")(x)  # (B, T, ffn)
        up = dense(cfg.ffn_dim, kernel_init=_param_init("embed", "mlp"), name="up_proj")(x)  # (B, T, ffn)
        gate, up = checkpoint_name(gate, "mlpwi_0"), checkpoint_name(up, "mlpwi_1")
        h = _constrain(nn.silu(gate) * up, "batch", "length", "mlp")  # SwiGLU
        out = dense(cfg.d_model, kernel_init=_param_init("mlp", "embed"), name="down_proj")(h)  # (B, T, d_model)
        return checkpoint_name(out, "mlpwo")


class DecoderLayer(nn.Module):
    """One pre-norm layer. Signature (carry, *broadcast) -> (carry, None), as nn.scan wants."""

    config: Config

    @nn.compact
    def __call__(self, x, cos, sin):
        cfg = self.config
        x = x + Attention(cfg, name="attn")(RMSNorm(cfg.norm_eps, name="attn_norm")(x), cos, sin)
        x = x + MLP(cfg, name="mlp")(RMSNorm(cfg.norm_eps, name="mlp_norm")(x))
        return _constrain(x, "batch", "length", "embed"), None


class Llama(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, tokens, train: bool = True):  # tokens: (B, T) int32; no dropout, `train` unused
        cfg = self.config
        T = tokens.shape[1]
        embed = nn.Embed(
            cfg.vocab_size,
            cfg.d_model,
            embedding_init=_param_init("vocab", "embed", init=nn.initializers.normal(stddev=1.0)),
            param_dtype=jnp.float32,
            dtype=cfg.dtype,  # the lookup's output, and the tied output head's matmul
            name="embed",
        )
        x = _constrain(embed(tokens), "batch", "length", "embed")  # (B, T, d_model)
        cos, sin = rope_tables(T, cfg.hd, cfg.rope_theta)

        layer = DecoderLayer
        if cfg.remat != "none":
            # prevent_cse=False: scan already keeps XLA from merging the recomputation away
            layer = nn.remat(layer, policy=_policy(cfg), prevent_cse=False)
        layers = nn.scan(
            layer,
            # every parameter (and --precision fp8's scaling state, as MaxText's decoder) gets a leading (n_layers,) axis
            variable_axes={"params": 0, "_overwrite_with_gradient": 0},
            split_rngs={"params": True},  # ... initialized independently per layer
            in_axes=(nn.broadcast, nn.broadcast),  # cos, sin: the same for every layer
            length=cfg.n_layers,
            metadata_params={nn.PARTITION_NAME: "layers"},  # ... named 'layers' for the sharding rules
        )
        x, _ = layers(cfg, name="layers")(x, cos, sin)
        x = RMSNorm(cfg.norm_eps, name="final_norm")(x)
        if cfg.tie_embeddings:
            logits = embed.attend(x)  # (B, T, vocab)
        else:
            logits = _dense(cfg.vocab_size, kernel_init=_param_init("embed", "vocab"), dtype=cfg.dtype,
                            name="lm_head")(x)  # (B, T, vocab)
        return _constrain(logits, "batch", "length", "vocab")


# The names the layers give their activations (checkpoint_name), in MaxText's terms.
CHECKPOINT_NAMES = ("query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")


def _policy(cfg: Config):
    """The --remat policy, plus the named activations of ``remat_save``."""
    return jaxmem.remat_policy(cfg.remat, save=[n for n in cfg.remat_save.split(",") if n])


def loss_fn(model, batch):
    logits = model(batch["tokens"], train=True)  # (B, T, vocab)
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["targets"]).mean()


def workload(
    preset: str = "8b",
    batch_size: int | None = None,
    seq_len: int | None = None,
    remat: str = "none",
    **overrides,
) -> jaxmem.Workload:
    """The Llama of ``preset`` (keys of PRESETS); ``overrides`` replace Config fields.

    The batch is ``tokens`` and next-token ``targets``, both (batch_size, seq_len) int32.
    """
    cfg = _config(preset, dict(overrides, remat=remat))
    B = batch_size or cfg.batch_size
    T = seq_len or cfg.seq_len
    batch = {
        "tokens": jax.ShapeDtypeStruct((B, T), jnp.int32),
        "targets": jax.ShapeDtypeStruct((B, T), jnp.int32),
    }
    return jaxmem.Workload(
        model=Llama(cfg), batch=batch, loss=loss_fn, optimizer=optax.adamw(3e-4), name=f"llama-{preset}",
        # MaxText does not quantize the logits matmul (its decoder's logits_dense, or the embedding's attend)
        fp8_exclude=r"(^|/)(lm_head|embed)$" if cfg.numerics == "maxtext" else None,
    )


def _config(preset: str, overrides: dict) -> Config:
    cfg = jaxmem.choose_preset("llama", PRESETS, preset, overrides)
    if cfg.n_heads % cfg.n_kv_heads:
        raise UserError(f"llama: n_heads={cfg.n_heads} is not a multiple of n_kv_heads={cfg.n_kv_heads}")
    if cfg.attention not in ("xla", "cudnn"):
        raise UserError(f"llama: attention={cfg.attention!r}; expected 'xla' or 'cudnn'")
    if cfg.numerics not in NUMERICS:
        raise UserError(f"llama: numerics={cfg.numerics!r}; expected one of {', '.join(map(repr, NUMERICS))}")
    unknown = [n for n in cfg.remat_save.split(",") if n and n not in CHECKPOINT_NAMES]
    if unknown:
        raise UserError(f"llama: remat_save names {', '.join(unknown)}; known: {', '.join(CHECKPOINT_NAMES)}")
    if cfg.remat.startswith("offload:"):
        unknown = [n for n in cfg.remat[len("offload:"):].split(",") if n not in CHECKPOINT_NAMES]
        if unknown:
            raise UserError(f"llama: --remat {cfg.remat} offloads {', '.join(unknown)}, which no layer names; "
                            f"known: {', '.join(CHECKPOINT_NAMES)}")
    if cfg.remat_save and cfg.remat == "none":
        raise UserError("llama: remat_save names what a remat policy also saves; give --remat too "
                        "(--remat full: only the named activations are saved)")
    if cfg.head_dim is None and cfg.d_model % cfg.n_heads:
        raise UserError(f"llama: d_model={cfg.d_model} is not a multiple of n_heads={cfg.n_heads}; give head_dim")
    return cfg
