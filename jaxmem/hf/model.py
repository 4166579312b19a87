# ruff: noqa: N806  (B, T, E, H, K, D: the shape letters of the einsum specs, as models/llama.py)
"""The decoder a config.json names, in Flax linen: every family jaxmem.hf.config reads, one module.

Written as models/llama.py and models/moe.py are (MaxText's way): the layers run under ``nn.scan``
(one compiled layer, parameters stacked on a leading ``layers`` axis), wrapped in ``nn.remat`` when
``remat`` is not "none" (``--arg scan=false``: a Python loop instead, the program Hugging Face's Flax
models compile; LayerLoop); every parameter carries logical axis names, so jaxmem's layouts and a
``--rules`` file written for MaxText or models/llama.py split it the same way:

    parameters:  embed, mlp, heads, kv_heads, head_dim, vocab, layers, exp (experts)
    activations: batch, length, embed, heads, mlp, vocab, exp

Parameter names follow Hugging Face's modules (``embed``, ``layers/attn/{q,k,v,o}_proj``,
``layers/mlp/{gate,up,down}_proj``, ``layers/moe/router``, ``lm_head``), the projections'
outputs MaxText's checkpoint names (``query_proj``, ``key_proj``, ``value_proj``, ``context``,
``out_proj``, ``mlpwi_0``, ``mlpwi_1``, ``mlpwo``) so ``--arg remat_save=...`` works as for
models/llama.py. Fused HF kernels (Phi-3's qkv_proj and gate_up_proj, GPT-2's c_attn) are kept as
their parts: the same parameters, split by heads as the unfused families are.

Per-layer differences that keep the parameters' shapes (Gemma's alternating sliding windows) are
a scanned per-layer input, so one layer program serves every layer, as MaxText compiles them; the
input is computed in the program from the layer index (an iota), never listed per layer in Python
or as a constant (a config may name 2^31 - 1 layers). A window at least as wide as the sequence
masks nothing: those layers are built as global attention (jaxmem.hf.config.Windows.mode).

MoE layers are models/moe.py's formulation (MaxText's capacity path, GShard priority): a router,
top-k dispatch with ``capacity_factor`` (``--arg capacity_factor=``, default 1.25), experts stacked
on an ``exp`` axis, and Switch Transformer's load-balancing loss. Hugging Face's PyTorch code is
dropless (a loop over experts); a dropping MoE with factor 1.25 holds 1.25 x the dropless one's
expert activations on average -- the buffer an XLA program of fixed shapes must reserve.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.ad_checkpoint import checkpoint_name

import jaxmem
from jaxmem.errors import UserError
from jaxmem.hf.config import Arch, Windows

_INIT = nn.initializers.normal(stddev=0.02)
NUMERICS = {"default": None, "maxtext": jnp.bfloat16}
CHECKPOINT_NAMES = ("query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")


def _param_init(*names: str | None, init=_INIT):
    return nn.with_logical_partitioning(init, names)


def _constrain(x, *names: str | None):
    return nn.with_logical_constraint(x, names)


@dataclasses.dataclass(frozen=True)
class Opts:
    """The knobs a workload's --arg sets (jaxmem.hf.workload), carried with the Arch."""

    remat: str = "none"
    remat_save: str = ""             # checkpoint names saved on top of the remat policy (models/llama.py)
    attention: str = "auto"          # "auto" (attention_choice), "xla" (written out in jnp) or "cudnn" (flash)
    numerics: str = "default"        # "default" (compute follows the parameters) or "maxtext" (bf16 compute)
    capacity_factor: float = 1.25    # MoE: expert capacity, as models/moe.py
    group_size: int | None = None    # MoE: tokens routed together (None: one sequence)
    aux_loss_coef: float = 0.01      # MoE: Switch Transformer's alpha
    vocab_tiles: int = 1             # > 1: the loss in this many sequence tiles, full logits never live (tiled_loss)
    scan: bool = True                # the layers under nn.scan (MaxText's program); False: a Python loop (HF Flax's)


class Norm(nn.Module):
    """RMSNorm (scale) or LayerNorm (scale and bias), computed in fp32 and cast back."""

    kind: str = "rms"
    eps: float = 1e-6
    axis_name: str = "embed"

    @nn.compact
    def __call__(self, x):
        n = x.shape[-1]
        scale = self.param("scale", _param_init(self.axis_name, init=nn.initializers.ones), (n,), jnp.float32)
        x32 = x.astype(jnp.float32)
        if self.kind == "layer":
            bias = self.param("bias", _param_init(self.axis_name, init=nn.initializers.zeros), (n,), jnp.float32)
            mean = jnp.mean(x32, axis=-1, keepdims=True)
            var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
            return ((x32 - mean) * jax.lax.rsqrt(var + self.eps) * scale + bias).astype(x.dtype)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * scale).astype(x.dtype)


class Proj(nn.Module):
    """y = einsum(spec, x, kernel) (+ bias): a kernel of any rank, each axis named."""

    shape: tuple[int, ...]
    spec: str
    names: tuple[str | None, ...]
    bias_rank: int = 0          # 0: no bias; else the kernel's last bias_rank axes are the bias's
    dtype: Any = None           # the compute dtype; None: promoted from x and the kernel

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", _param_init(*self.names), self.shape, jnp.float32)
        if self.dtype is not None:
            x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
        if len(self.shape) == 2 and self.spec.split("->")[0].split(",")[1][0] == self.spec.split(",")[0][-1]:
            # x (..., in) @ kernel (in, out): the dot nn.Dense makes, without einsum's tracing cost
            y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
        else:
            y = jnp.einsum(self.spec, x, kernel)
        if self.bias_rank:
            shape, names = self.shape[-self.bias_rank:], self.names[-self.bias_rank:]
            bias = self.param("bias", _param_init(*names, init=nn.initializers.zeros), shape, jnp.float32)
            y = y + bias.astype(y.dtype)
        return y


def rope_tables(seq_len: int, head_dim: int, theta: float):
    inv_freq = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _act(name: str):
    return nn.silu if name == "silu" else partial(nn.gelu, approximate=True)


# Where `--arg attention=auto` (the default) compiles cuDNN flash attention, as MaxText on GPUs and Hugging
# Face's SDPA / FlashAttention-2 trainers run it; XLA's attention, written out in jnp, elsewhere:
# - a CUDA GPU of compute capability 8.0 or later: cuDNN's SDPA "requires SM80 (Ampere) or newer
#   architectures" (its support matrix: docs.nvidia.com/deeplearning/cudnn/frontend/latest/operations/Attention.html);
# - bf16 or fp16 q, k, v: that matrix has no fp32 row, and jax's cudnn path has no fp32 kernel;
# - head_dim a multiple of 8 and at most 128: jax's check (jax/_src/cudnn/fused_attention_stablehlo.py,
#   check_is_flash_attention: "The head dim must be <= {H_max} and a multiple of 8", H_max 256 only when
#   check_compute_capability("9.0") finds a local Hopper GPU, which a deviceless compile has not);
# - an even sequence length: in training jax's check refuses an odd one ("Unsupported sequence length",
#   check_is_flash_attention: it counts the empty bias it passes as a bias, whose lengths must be even);
# - no logit softcap (Gemma 2) and no attention dropout: jax.nn.dot_product_attention takes neither;
# - the sequence not split over a mesh axis: the cuDNN call's partitioning rule refuses a split sequence.
CUDNN_MIN_CAPABILITY = (8, 0)
CUDNN_HEAD_DIM = 128


def attention_choice(arch: Arch, dtype, seq_len: int, *, sequence_split: bool = False,
                     device=None) -> tuple[str, str]:
    """("cudnn" | "xla", why): the kernel `--arg attention=auto` compiles for `device` (default: the first of
    jax.devices(), which answers with the target's devices while jaxmem traces the step)."""
    if device is None:
        device = jax.devices()[0]
    capability = str(getattr(device, "compute_capability", "") or "")
    if getattr(device, "platform", "") not in ("gpu", "cuda") or not capability:
        return "xla", "not a CUDA GPU"
    cc = tuple(int(x) for x in capability.split(".")[:2])
    if cc < CUDNN_MIN_CAPABILITY:
        return "xla", f"compute capability {capability}: cuDNN flash attention needs 8.0 (Ampere) or later"
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return "xla", (f"{jnp.dtype(dtype).name} compute: cuDNN flash attention has bf16/fp16 kernels only "
                       "(--precision bf16 selects it)")
    if arch.head_dim % 8 or arch.head_dim > CUDNN_HEAD_DIM:
        return "xla", (f"head_dim {arch.head_dim}: jax's cuDNN attention takes a multiple of 8 up to "
                       f"{CUDNN_HEAD_DIM} in a deviceless compile")
    if seq_len % 2:
        return "xla", f"odd sequence length {seq_len}: jax's cuDNN attention refuses it in training"
    if arch.attn_softcap:
        return "xla", "attention logit softcapping: jax's cuDNN attention has none"
    if arch.attn_dropout:
        return "xla", f"attention dropout {arch.attn_dropout}: jax's cuDNN attention takes no dropout"
    if sequence_split:
        return "xla", "the sequence is split over a mesh axis, which the cuDNN call's partitioning refuses"
    return "cudnn", (f"cuDNN flash attention: compute capability {capability}, {jnp.dtype(dtype).name} compute, "
                     f"head_dim {arch.head_dim}")


def _sequence_split() -> bool:
    """Whether the logical-axis rules in context split the sequence ("length") over a mesh axis of size > 1."""
    try:
        spec = nn.logical_to_mesh_axes(("length",))
        axes = spec[0] if spec is not None else None
        sizes = dict(jax.sharding.get_abstract_mesh().shape)
    except Exception:  # noqa: BLE001 -- no rules or mesh in context: nothing splits the sequence
        return False
    names = axes if isinstance(axes, tuple) else (axes,)
    return any(sizes.get(n, 1) > 1 for n in names if n is not None)


class Attention(nn.Module):
    arch: Arch
    opts: Opts
    train: bool = True   # dropout draws masks only in training (cuDNN attention takes no dropout)

    @nn.compact
    def __call__(self, x, cos, sin, window):  # x: (B, T, E); window: this layer's sliding window (0: global),
        # scanned where the layers differ (Windows.mode "mixed"), else None
        a, dt = self.arch, NUMERICS[self.opts.numerics]
        B, T, E = x.shape
        H, K, D = a.n_heads, a.n_kv_heads, a.head_dim
        qkv_bias = 2 if a.qkv_bias else 0
        q = Proj((E, H, D), "bte,ehd->bthd", ("embed", "heads", "head_dim"), qkv_bias, dt, name="q_proj")(x)
        k = Proj((E, K, D), "bte,ekd->btkd", ("embed", "kv_heads", "head_dim"), qkv_bias, dt, name="k_proj")(x)
        v = Proj((E, K, D), "bte,ekd->btkd", ("embed", "kv_heads", "head_dim"), qkv_bias, dt, name="v_proj")(x)
        q, k, v = checkpoint_name(q, "query_proj"), checkpoint_name(k, "key_proj"), checkpoint_name(v, "value_proj")
        if a.qk_norm:
            q = Norm(eps=a.norm_eps, axis_name="head_dim", name="q_norm")(q)
            k = Norm(eps=a.norm_eps, axis_name="head_dim", name="k_norm")(k)
        q = _constrain(q, "batch", "length", "heads", None)
        if a.positions == "rope":
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        mode = a.windows.mode(a.n_layers, T)
        if mode == "uniform":
            window = a.windows.size
        kernel = self.opts.attention
        if kernel == "auto":   # as the trainers run it: flash attention where the target has it
            kernel = attention_choice(a, q.dtype, T, sequence_split=_sequence_split())[0]
        if kernel == "cudnn":
            out = self._cudnn(q, k, v, window, mode)
        else:
            qg = q.reshape(B, T, K, H // K, D)  # query heads grouped by the K/V head they share
            scores = jnp.einsum("btkgd,bskd->bkgts", qg, k).astype(jnp.float32) / math.sqrt(D)
            if a.attn_softcap:
                scores = a.attn_softcap * jnp.tanh(scores / a.attn_softcap)
            mask = jnp.tril(jnp.ones((T, T), dtype=bool))   # causal, as models/llama.py
            if mode != "global":
                i, j = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
                mask = mask & ((window == 0) | (i - j < window))
            # an additive bias, as models/llama.py: a jnp.where on the scores would keep its full-shape mask
            # and fill as the layer scan's loop-invariant residuals
            probs = jax.nn.softmax(scores + jnp.where(mask, 0.0, -1e30), axis=-1).astype(v.dtype)
            if a.attn_dropout:
                probs = nn.Dropout(a.attn_dropout)(probs, deterministic=not self.train)
            out = jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(B, T, H, D)
        out = checkpoint_name(_constrain(out, "batch", "length", "heads", None), "context")
        o_bias = 1 if a.o_bias else 0
        out = Proj((H, D, E), "bthd,hde->bte", ("heads", "head_dim", "embed"), o_bias, dt, name="o_proj")(out)
        return checkpoint_name(out, "out_proj")

    def _cudnn(self, q, k, v, window, mode):
        if q.dtype not in (jnp.bfloat16, jnp.float16):
            if not self.is_initializing():
                raise UserError(
                    f"{self.arch.model_type} config: attention=cudnn needs bf16 or fp16 compute (cuDNN's fused "
                    f"attention has no fp32 kernel), but this step computes attention in {q.dtype}; add "
                    "--precision bf16, or --arg numerics=maxtext, or use --arg attention=xla")
            q, k, v = (t.astype(jnp.bfloat16) for t in (q, k, v))

        def attend(size):
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn",
                                                local_window_size=None if size is None else (size - 1, 0))

        local = self.arch.windows.size
        if mode != "mixed":
            return attend(local if mode == "uniform" else None)
        if isinstance(window, int):   # a layer of the Python loop (LayerLoop): its own kernel only
            return attend(None if window == 0 else local)
        # local and global layers in one scanned program: both kernels compiled, one runs per layer
        return jax.lax.cond(window == 0, lambda: attend(None), lambda: attend(local))


class MLP(nn.Module):
    arch: Arch
    opts: Opts
    width: int = 0   # 0: arch.ffn_dim

    @nn.compact
    def __call__(self, x):
        a, dt = self.arch, NUMERICS[self.opts.numerics]
        E, W = x.shape[-1], self.width or a.ffn_dim
        bias = 1 if a.mlp_bias else 0
        act = _act(a.act)
        if not a.gated_mlp:   # GPT-2: fc -> gelu -> proj
            h = Proj((E, W), "bte,em->btm", ("embed", "mlp"), bias, dt, name="up_proj")(x)
            h = _constrain(act(checkpoint_name(h, "mlpwi_1")), "batch", "length", "mlp")
        else:
            gate = Proj((E, W), "bte,em->btm", ("embed", "mlp"), bias, dt, name="gate_proj")(x)
            up = Proj((E, W), "bte,em->btm", ("embed", "mlp"), bias, dt, name="up_proj")(x)
            gate, up = checkpoint_name(gate, "mlpwi_0"), checkpoint_name(up, "mlpwi_1")
            h = _constrain(act(gate) * up, "batch", "length", "mlp")
        out = Proj((W, E), "btm,me->bte", ("mlp", "embed"), bias, dt, name="down_proj")(h)
        return checkpoint_name(out, "mlpwo")


def route(logits, top_k: int, capacity: int, dtype, renormalize: bool):
    """Top-k routing with capacity (models/moe.py's, GShard's priority): dispatch and combine
    (groups, group_size, experts, capacity) and the Switch load-balancing loss."""
    n_experts = logits.shape[-1]
    probs = jax.nn.softmax(logits, axis=-1)
    top_p, top_idx = jax.lax.top_k(probs, top_k)   # (g, s, k)
    gates = top_p / jnp.sum(top_p, axis=-1, keepdims=True) if renormalize else top_p
    choice = jax.nn.one_hot(top_idx, n_experts, dtype=jnp.int32)   # (g, s, k, E)
    g, s = logits.shape[:2]
    by_choice = choice.transpose(0, 2, 1, 3).reshape(g, top_k * s, n_experts)
    position = (jnp.cumsum(by_choice, axis=1) - 1).reshape(g, top_k, s, n_experts).transpose(0, 2, 1, 3)
    kept = choice * (position < capacity)
    slot = jnp.where(jnp.sum(kept, axis=2) > 0, jnp.sum(position * kept, axis=2), -1)   # (g, s, E)
    gate = jnp.sum(gates[..., None] * kept, axis=2)
    dispatch = jax.nn.one_hot(slot, capacity, dtype=dtype)
    combine = dispatch * gate[..., None].astype(dtype)
    fraction = jnp.mean(choice, axis=(0, 1, 2), dtype=jnp.float32)
    aux = n_experts * jnp.sum(fraction * jnp.mean(probs, axis=(0, 1)))
    return dispatch, combine, aux


class MoE(nn.Module):
    arch: Arch
    opts: Opts

    @nn.compact
    def __call__(self, x):
        a, cdt = self.arch, NUMERICS[self.opts.numerics]
        B, T, M = x.shape
        E, W = a.n_experts, a.expert_dim
        G = self.opts.group_size or T
        C = min(G, math.ceil(G * a.top_k * self.opts.capacity_factor / E))
        dt = cdt or x.dtype
        xg = _constrain(x.reshape(B * T // G, G, M), "batch", "length", "embed")
        logits = Proj((M, E), "gsm,me->gse", ("embed", None), 0, jnp.float32, name="router")(xg)
        dispatch, combine, aux = route(logits, a.top_k, C, dt, a.norm_topk_prob)
        expert_in = _constrain(jnp.einsum("gsm,gsec->gecm", xg.astype(dt), dispatch), "batch", "exp", None, "embed")
        gate = Proj((E, M, W), "gecm,emh->gech", ("exp", "embed", "mlp"), 0, cdt, name="gate_proj")(expert_in)
        up = Proj((E, M, W), "gecm,emh->gech", ("exp", "embed", "mlp"), 0, cdt, name="up_proj")(expert_in)
        h = _constrain(_act(a.act)(gate) * up, "batch", "exp", None, "mlp")
        out = Proj((E, W, M), "gech,ehm->gecm", ("exp", "mlp", "embed"), 0, cdt, name="down_proj")(h)
        out = _constrain(out, "batch", "exp", None, "embed")
        y = jnp.einsum("gecm,gsec->gsm", out, combine.astype(out.dtype)).reshape(B, T, M).astype(x.dtype)
        if a.shared_expert_dim:   # Qwen2-MoE: a dense expert every token takes, scaled by a sigmoid gate
            shared = MLP(a, self.opts, a.shared_expert_dim, name="shared_expert")(x)
            scale = Proj((M, 1), "btm,mo->bto", ("embed", None), 0, cdt, name="shared_expert_gate")(x)
            y = y + (jax.nn.sigmoid(scale.astype(jnp.float32)) * shared).astype(x.dtype)
        return y, aux


class DecoderLayer(nn.Module):
    """One pre-norm layer, (x, window) -> (x, aux) as nn.scan wants (window: this layer's, scanned)."""

    arch: Arch
    opts: Opts
    train: bool = True

    @nn.compact
    def __call__(self, x, window, cos, sin):
        a = self.arch
        norm = partial(Norm, a.norm, a.norm_eps)
        drop = partial(nn.Dropout, a.resid_dropout, deterministic=not self.train)
        h = Attention(a, self.opts, self.train, name="attn")(norm(name="attn_norm")(x), cos, sin, window)
        if a.sandwich_norm:
            h = norm(name="post_attn_norm")(h)
        x = x + (drop()(h) if a.resid_dropout else h)
        y = norm(name="mlp_norm")(x)
        if a.moe:
            h, aux = MoE(a, self.opts, name="moe")(y)
        else:
            h, aux = MLP(a, self.opts, name="mlp")(y), None   # a dense layer: the scan stacks nothing
        if a.sandwich_norm:
            h = norm(name="post_mlp_norm")(h)
        if a.resid_dropout:
            h = drop()(h)
        return _constrain(x + h, "batch", "length", "embed"), aux


def _layer_windows(w: Windows, n_layers: int):
    """int32[n_layers]: each layer's window, 0 for a global layer, computed in the program from the
    layer index (a config's periodic rule); from the config's own per-layer list when it gave one."""
    if len(w.global_at) > 2:   # layer_types: as long as the list the config holds
        return jnp.asarray(np.array([w.at(i) or 0 for i in range(n_layers)], np.int32))
    i = jax.lax.iota(jnp.int32, n_layers)
    local = i >= w.first
    for g in w.global_at:
        local = local & (i % w.period != g)
    return jnp.where(local, jnp.int32(w.size), jnp.int32(0))


class Decoder(nn.Module):
    arch: Arch
    opts: Opts

    @nn.compact
    def __call__(self, tokens, train: bool = True, targets=None):
        # tokens: (B, T) int32 -> (logits, aux loss); with targets and opts.vocab_tiles > 1: (the mean
        # cross-entropy, aux loss), the logits made tile by tile (tiled_loss) and never whole
        a, dt = self.arch, NUMERICS[self.opts.numerics]
        T = tokens.shape[1]
        embed = nn.Embed(a.vocab_size, a.d_model, param_dtype=jnp.float32, dtype=dt, name="embed",
                         embedding_init=_param_init("vocab", "embed", init=nn.initializers.normal(stddev=1.0)))
        x = embed(tokens)
        if a.embed_scale:
            x = x * jnp.asarray(math.sqrt(a.d_model), x.dtype)
        cos = sin = None
        if a.positions == "learned":
            wpe = self.param("pos_embed", _param_init(None, "embed"), (a.max_positions, a.d_model), jnp.float32)
            x = x + wpe[:T].astype(x.dtype)[None]
        else:
            cos, sin = rope_tables(T, a.head_dim, a.rope_theta)
        if a.embd_dropout:
            x = nn.Dropout(a.embd_dropout)(x, deterministic=not train)
        x = _constrain(x, "batch", "length", "embed")
        windowed = a.windows.mode(a.n_layers, T) == "mixed"
        layer = DecoderLayer
        if self.opts.remat != "none":
            save = [n for n in self.opts.remat_save.split(",") if n]
            # prevent_cse=False only under the scan (its loop keeps XLA from merging the recomputation into the
            # forward); a Python loop of remats needs the barrier, or XLA's CSE undoes every layer's remat
            layer = nn.remat(layer, policy=jaxmem.remat_policy(self.opts.remat, save=save),
                             prevent_cse=not self.opts.scan)
        if not self.opts.scan:
            x, aux = LayerLoop(a, self.opts, train, layer, name="layers")(x, cos, sin)
        else:
            layers = nn.scan(
                layer,
                variable_axes={"params": 0, "_overwrite_with_gradient": 0},
                # a dropout rng split per layer only where a layer draws masks (the split is in the program)
                split_rngs={"params": True, "dropout": bool(a.attn_dropout or a.resid_dropout)},
                # each layer's window (scanned) where the layers differ; cos, sin shared
                in_axes=(0 if windowed else nn.broadcast, nn.broadcast, nn.broadcast),
                length=a.n_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            windows = _layer_windows(a.windows, a.n_layers) if windowed else None
            x, aux = layers(a, self.opts, train, name="layers")(x, windows, cos, sin)
        x = Norm(a.norm, a.norm_eps, name="final_norm")(x)
        if targets is not None and self.opts.vocab_tiles > 1:
            table = embed.embedding if a.tie_embeddings else None
            return tiled_loss(a, self.opts, x, targets, table), (jnp.mean(aux) if a.moe else None)
        if a.tie_embeddings:
            logits = embed.attend(x)
        else:
            logits = Proj((a.d_model, a.vocab_size), "bte,ev->btv", ("embed", "vocab"), 0, dt, name="lm_head")(x)
        if a.final_softcap:
            logits = (a.final_softcap * jnp.tanh(logits.astype(jnp.float32) / a.final_softcap)).astype(logits.dtype)
        return _constrain(logits, "batch", "length", "vocab"), (jnp.mean(aux) if a.moe else None)


class LayerLoop(nn.Module):
    """The layers as a Python loop, as Hugging Face's Flax models run them (FlaxLlamaLayerCollection:
    ``layers/0``, ``layers/1``, ...): each layer its own code in the program, its parameters unstacked,
    each wrapped in its own remat; XLA frees a layer's temporaries (and, under FSDP, reduce-scatters its
    gradients) as it goes, where a scan stacks the residuals of all layers and carries stacked gradients."""

    arch: Arch
    opts: Opts
    train: bool
    layer: Any   # DecoderLayer, or its nn.remat as the Decoder wraps it

    @nn.compact
    def __call__(self, x, cos, sin):
        a = self.arch
        windowed = a.windows.mode(a.n_layers, x.shape[1]) == "mixed"
        auxes = []
        for i in range(a.n_layers):
            # this layer's window as a Python int (0: global), as the scan's per-layer input holds it
            window = (a.windows.at(i) or 0) if windowed else None
            x, aux = self.layer(a, self.opts, self.train, name=str(i))(x, window, cos, sin)
            auxes.append(aux)
        return x, (jnp.stack(auxes) if a.moe else None)


class HeadTile(nn.Module):
    """One tile of the vocabulary-tiled loss: the logits of T/n positions (lm_head's kernel, or the tied
    embedding table) and their summed cross-entropy, as nn.scan wants: (total, (x, labels), table) ->
    (total, None). Its kernel is lm_head's own (same name, shape, axes and init): the parameters are
    those of the plain loss."""

    arch: Arch
    opts: Opts

    @nn.compact
    def __call__(self, total, xs, table):
        a, dt = self.arch, NUMERICS[self.opts.numerics]
        x, labels = xs
        if table is None:
            kernel = self.param("kernel", _param_init("embed", "vocab"), (a.d_model, a.vocab_size), jnp.float32)
            if dt is not None:
                x, kernel = x.astype(dt), kernel.astype(dt)
            logits = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
        else:   # as nn.Embed.attend: the table's transpose, in the promoted dtype
            x, table = nn.dtypes.promote_dtype(x, table, dtype=dt)
            logits = jnp.dot(x, table.T)
        if a.final_softcap:
            logits = a.final_softcap * jnp.tanh(logits.astype(jnp.float32) / a.final_softcap)
        logits = _constrain(logits, "batch", "length", "vocab")
        ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
        return total + jnp.sum(ce), None


def tiled_loss(arch: Arch, opts: Opts, x, targets, table):
    """The mean cross-entropy of final hidden states x (B, T, E) against targets (B, T), in opts.vocab_tiles
    tiles of the sequence (MaxText's num_vocab_tiling, which tiles the flattened batch x sequence: here each
    sequence is cut, so the batch keeps its mesh axis and the scan never runs over a split dimension). Each
    tile is rematerialized (nn.remat): the forward keeps no logits, the backward recomputes one tile's at a
    time, so the (B, T, vocab) logits and their gradient are never live, only a tile's (B, T/n, vocab)."""
    n = opts.vocab_tiles
    B, T, E = x.shape
    xs = _constrain(x.reshape(B, n, T // n, E).swapaxes(0, 1), None, "batch", "length", "embed")
    labels = targets.reshape(B, n, T // n).swapaxes(0, 1)
    tiles = nn.scan(nn.remat(HeadTile, prevent_cse=False), variable_broadcast="params",
                    split_rngs={"params": False}, in_axes=(0, nn.broadcast), length=n)
    # untied: named lm_head, so its kernel is the plain head's parameter (lm_head/kernel)
    total, _ = tiles(arch, opts, name="tied_head" if table is not None else "lm_head")(
        jnp.zeros((), jnp.float32), (xs, labels), table)
    return total / (B * T)
