"""Known logical-axis naming conventions, as data: each a rules table with the file it comes from.

A model annotates dimensions with logical names (``nn.with_logical_constraint(x, ("act_batch",
"act_len", "act_emb"))``, ``nn.with_logical_partitioning(init, ("embed", "mlp"))``, NNX sharding
metadata) and its trainer maps them to mesh axes (``nn.logical_axis_rules``). jaxmem's own rules
(``rules.py``) know the common names and MaxText's; a name only another library uses would be
replicated by flax without a word. Each convention below says, for the names it adds, what the
trainer it comes from does with them (``axes``: the mesh axes as that source writes them) and which
of jaxmem's names it behaves like (``like``), so that it is applied on any mesh and layout the way
jaxmem applies that name: ``batch`` over the batch axes, ``length`` over the context axis, ``embed``
over the fsdp axes (the fsdp layouts), ``mlp``/``heads``/``vocab`` over the tensor axis (the tp
layouts; ``mlp`` and ``vocab`` also over the fsdp axes), ``exp`` over the expert axis; ``None``
keeps the dimension whole, as the source does.

Names jaxmem has rules for are jaxmem's (a convention that means something else by ``embed``,
t5x's ``None``, does not override jaxmem's layouts); ``--rules`` comes before all. Which
convention mapped each name the model uses is stated in the report's ``choices.logical_rules``
(source ``default``, with the citation).

Libraries whose annotations name mesh axes rather than logical names (tunix's
``nnx.Param(..., sharding=("fsdp", "tp"))``, EasyDeL's ``PartitionAxis``/partition rules over
``dp, fsdp, ep, tp, sp``, praxis' ``weight_split_dims_mapping`` over ``replica, data, mdl``) need no
table: their names are mesh axes, placed as written (``rules._names_mesh_axes``, ``layouts.ROLES``).

A leaf of the package: no jax, nothing of jaxmem.
"""

from __future__ import annotations

import dataclasses

LIKES = ("batch", "length", "embed", "mlp", "heads", "vocab", "exp")   # jaxmem names a convention's name acts as


@dataclasses.dataclass(frozen=True)
class Convention:
    name: str
    repo: str                      # where the table comes from: the repository ...
    path: str                      # ... and the file
    what: str                      # the function / config key in that file
    # (logical name, mesh axes as the source writes them (() none), the jaxmem name it acts as | None: whole)
    rules: tuple[tuple[str, tuple[str, ...], str | None], ...]

    @property
    def citation(self) -> str:
        return f"{self.repo} {self.path} ({self.what})"


BIG_VISION = Convention(
    "big_vision", "google-research/big_vision", "big_vision/train.py",
    'sharding_rules\' default [("act_batch", "data")]; act_len, act_emb have none: flax keeps them whole',
    (("act_batch", ("data",), "batch"),
     ("act_len", (), None),
     ("act_emb", (), None)))

T5X = Convention(
    "t5x/flaxformer", "google-research/t5x", "t5x/partitioning.py",
    "standard_logical_axis_rules (1-D activation and parameter partitioning); flaxformer's layers use these names",
    (("joined_kv", ("model",), "heads"),    # heads x head_dim fused in 2-D attention kernels
     ("kv", (), None),                      # the per-head features
     ("relpos_buckets", (), None),
     ("stack", (), None),
     ("unmodeled", (), None),               # t5x/contrib/moe partitioning: replicated weights
     ("expert", ("data",), "exp"),          # ... experts along the data axis (jaxmem: the expert axis)
     ("expert_mlp", ("model",), "mlp"),
     ("expert_group", (), None)))

MAXTEXT = Convention(
    "MaxText", "AI-Hypercomputer/maxtext", "src/MaxText/configs/base.yml", "logical_axis_rules",
    (("activation_batch_no_exp", ("data", "fsdp", "fsdp_transpose"), "batch"),
     ("activation_embed_and_logits_batch_sequence", ("data", "stage", "fsdp", "fsdp_transpose", "sequence",
                                                     "context", "expert"), "batch"),
     ("activation_prefill_kv_batch", ("data", "fsdp", "fsdp_transpose", "expert"), "batch"),
     ("activation_kv_batch_no_exp", ("data", "fsdp", "fsdp_transpose"), "batch"),
     ("decode_batch", ("data", "fsdp", "fsdp_transpose", "expert"), "batch"),
     ("activation_attn_length", ("sequence", "context", "expert"), "length"),
     ("activation_attn_length_no_exp", ("sequence", "context"), "length"),
     ("activation_length_no_exp", ("sequence", "context"), "length"),
     ("activation_norm_length", ("tensor_sequence", "context", "sequence"), "length"),
     ("activation_q_length_no_exp", ("context",), "length"),
     ("prefill_activation_length", ("sequence", "context"), "length"),
     ("prefill_activation_norm_length", ("tensor_sequence", "context", "sequence"), "length"),
     ("decode_length", ("sequence",), "length"),
     ("activation_kv_length", (), None),
     ("activation_attn_embed", ("tensor", "tensor_transpose"), "heads"),
     ("activation_embed", ("tensor", "tensor_transpose"), "heads"),
     ("activation_kv", ("tensor", "tensor_transpose", "tensor_sequence"), "heads"),
     ("activation_kv_head_dim", ("tensor", "tensor_transpose", "tensor_sequence"), "heads"),
     ("activation_stage", ("stage",), None),
     ("mlp_no_fsdp", ("tensor", "tensor_sequence", "autoregressive"), "heads"),
     ("embed_no_exp", ("fsdp", "fsdp_transpose", "sequence", "tensor_transpose", "context"), "embed"),
     ("embed_tensor_transpose", ("tensor_transpose",), None),
     ("q_lora", ("fsdp", "fsdp_transpose", "sequence", "context", "tensor_transpose", "expert"), "embed"),
     ("kv_lora", ("fsdp", "fsdp_transpose", "sequence", "context", "tensor_transpose", "expert"), "embed"),
     ("q_lora_up_proj", (), None),
     ("kv_lora_up_proj", (), None),
     ("norm", ("tensor", "tensor_transpose"), "heads"),
     ("qkv", (), None),
     ("kv_head_dim", (), None),
     ("cache_batch_prefill", (), None),
     ("cache_batch", (), None),
     ("cache_heads_none", (), None),
     ("cache_heads", ("autoregressive", "tensor", "tensor_transpose", "tensor_sequence"), "heads"),
     ("cache_kv", (), None),
     ("cache_sequence", (), None),
     ("exp_with_fsdp", ("fsdp",), "embed"),
     ("paged_kv_heads", ("tensor",), "heads"),
     ("num_pages", (), None),
     ("tokens_per_page", (), None),
     ("paged_kv_head_dim_size", (), None),
     ("dense_layers", (), None),
     ("moe_layers", (), None)))

# the order a name two conventions define is taken in (the first wins)
CONVENTIONS: tuple[Convention, ...] = (BIG_VISION, T5X, MAXTEXT)


def table(known: frozenset[str] | set[str] = frozenset()) -> dict[str, tuple[Convention, tuple[str, ...], str | None]]:
    """name -> (its convention, the mesh axes the source writes, the jaxmem name it acts as | None), for
    every convention name not in `known` (jaxmem's own names), the first convention's where two define it."""
    out: dict[str, tuple[Convention, tuple[str, ...], str | None]] = {}
    for conv in CONVENTIONS:
        for name, axes, like in conv.rules:
            if name not in known and name not in out:
                out[name] = (conv, axes, like)
    return out


def aliases(known: frozenset[str] | set[str] = frozenset()) -> dict[str | None, tuple[str, ...]]:
    """jaxmem name (or None: kept whole) -> the convention names that act as it, in table order."""
    out: dict[str | None, list[str]] = {}
    for name, (_, _, like) in table(known).items():
        out.setdefault(like, []).append(name)
    return {k: tuple(v) for k, v in out.items()}
