"""A Hugging Face ``config.json``, read into the architecture jaxmem's decoder builds (:class:`Arch`).

Only the fields that change memory or the program are read: sizes (vocabulary, width, layers,
heads, K/V heads, head_dim, MLP width), tied embeddings, biases, QK norms, Gemma's extra norms
and soft-capping, sliding windows (per layer), and the MoE fields (experts, top-k, expert width,
shared experts). RoPE scaling, dropout rates, token ids and initializer ranges change no buffer.
No network and no weights: the file is a local one, read as any file jaxmem reads (jaxmem.files).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from jaxmem import files
from jaxmem.errors import UserError

MAX_CONFIG_BYTES = 4 << 20   # published config.json files are a few KiB

# model_type -> family (the decoder variant) and the published models it covers
SUPPORTED = {
    "llama": "Llama 1/2/3/3.x",
    "mistral": "Mistral",
    "qwen2": "Qwen2/2.5",
    "qwen3": "Qwen3",
    "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3 (text)",
    "gemma3": "Gemma 3 (its text_config)",
    "phi3": "Phi-3",
    "mixtral": "Mixtral",
    "qwen2_moe": "Qwen2-MoE",
    "qwen3_moe": "Qwen3-MoE",
    "gpt2": "GPT-2",
}


@dataclasses.dataclass(frozen=True)
class Arch:
    """One decoder-only transformer, in the terms jaxmem.hf.model builds it from."""

    model_type: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int                       # the dense MLP's hidden width (0 when every layer is MoE)
    norm: str = "rms"                  # "rms" (scale only) or "layer" (scale and bias: GPT-2)
    norm_eps: float = 1e-5
    act: str = "silu"                  # "silu", "gelu_tanh"
    gated_mlp: bool = True             # SwiGLU/GeGLU (gate, up, down); False: GPT-2's fc, proj
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False              # Qwen3, Gemma 3: RMSNorm over head_dim on q and k
    sandwich_norm: bool = False        # Gemma 2/3: norms after attention and after the MLP too
    tie_embeddings: bool = False
    positions: str = "rope"            # "rope" or "learned" (GPT-2's wpe table)
    max_positions: int = 0             # the model's context (GPT-2: the rows of its learned position table)
    rope_theta: float = 10000.0
    embed_scale: bool = False          # Gemma: embeddings times sqrt(d_model)
    attn_softcap: float | None = None  # Gemma 2
    final_softcap: float | None = None
    windows: tuple[int | None, ...] = ()   # per layer: the sliding window, None for global attention
    n_experts: int = 0                 # 0: a dense MLP in every layer
    top_k: int = 0
    expert_dim: int = 0
    shared_expert_dim: int = 0         # Qwen2-MoE: one shared SwiGLU expert, gated by a sigmoid
    norm_topk_prob: bool = True        # renormalize the top-k gates (Mixtral, Qwen3-MoE: yes)
    # dropout rates (training draws masks: memory): on the embeddings, the attention probabilities,
    # and the attention and MLP outputs before the residual add (GPT-2's embd/attn/resid_pdrop)
    embd_dropout: float = 0.0
    attn_dropout: float = 0.0
    resid_dropout: float = 0.0

    @property
    def moe(self) -> bool:
        return self.n_experts > 0


def config_file(path: str | os.PathLike) -> Path | None:
    """The config.json a model argument names: the path when it ends in .json, the config.json of
    a folder holding one; None for anything else (a model file)."""
    p = Path(path)
    if p.suffix.lower() == ".json":
        return p
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    return None


def read(path: Path) -> dict[str, Any]:
    """The config as a dict: a UserError naming the file for anything jaxmem cannot read."""
    fix = "give a Hugging Face config.json (or the folder holding it)"
    data = files.read_user_file(path, MAX_CONFIG_BYTES, "config file", fix)
    try:
        doc = files.loads_json(data, f"config file {path}")
    except ValueError as e:
        raise UserError(f"config file {path}: not JSON ({e}); {fix}") from None
    if not isinstance(doc, dict) or "model_type" not in doc:
        raise UserError(f"config file {path}: has no \"model_type\"; not a Hugging Face config.json. {fix}, or a "
                        "model file (.py defining workload(), docs/model-files.md)")
    return doc


def unsupported(path: Path, model_type: object) -> UserError:
    listed = ", ".join(f"{k} ({v})" for k, v in SUPPORTED.items())
    return UserError(f"config file {path}: model_type {model_type!r} is not one jaxmem builds. Supported: {listed}. "
                     "For another architecture write a model file (a .py defining workload(); see "
                     "docs/model-files.md) and analyze that.")


def parse(doc: dict[str, Any], path: Path) -> Arch:
    """The Arch of a config dict (UserError for a family jaxmem does not build, or a field it needs
    missing or of the wrong type)."""
    model_type = doc.get("model_type")
    if model_type == "gemma3" and isinstance(doc.get("text_config"), dict):
        # the multimodal Gemma 3 config: its language model (the vision tower is not built)
        doc = {"model_type": "gemma3_text", **doc["text_config"]}
        model_type = "gemma3_text"
    if model_type not in SUPPORTED:
        raise unsupported(path, model_type)
    get = _Getter(doc, path)
    if model_type == "gpt2":
        d = get.int("n_embd")
        heads = get.int("n_head")
        return Arch(model_type=model_type, vocab_size=get.int("vocab_size"), d_model=d, n_layers=get.int("n_layer"),
                    n_heads=heads, n_kv_heads=heads, head_dim=_divide(d, heads, "n_embd", "n_head", path),
                    ffn_dim=get.int("n_inner", None) or 4 * d, norm="layer",
                    norm_eps=get.float("layer_norm_epsilon", 1e-5), act="gelu_tanh", gated_mlp=False, qkv_bias=True,
                    o_bias=True, mlp_bias=True, tie_embeddings=get.bool("tie_word_embeddings", True),
                    positions="learned", max_positions=get.int("n_positions"),
                    embd_dropout=get.rate("embd_pdrop", 0.1), attn_dropout=get.rate("attn_pdrop", 0.1),
                    resid_dropout=get.rate("resid_pdrop", 0.1))
    d = get.int("hidden_size")
    n_layers = get.int("num_hidden_layers")
    heads = get.int("num_attention_heads")
    kv = get.int("num_key_value_heads", None) or heads
    if heads % kv:
        raise UserError(f"config file {path}: num_attention_heads={heads} is not a multiple of "
                        f"num_key_value_heads={kv}")
    head_dim = get.int("head_dim", None) or _divide(d, heads, "hidden_size", "num_attention_heads", path)
    gemma = model_type in ("gemma2", "gemma3_text")
    fields: dict[str, Any] = dict(  # noqa: C408 -- the Arch's fields, as keywords
        model_type=model_type, vocab_size=get.int("vocab_size"), d_model=d, n_layers=n_layers, n_heads=heads,
        n_kv_heads=kv, head_dim=head_dim, ffn_dim=get.int("intermediate_size", None) or 0,
        norm_eps=get.float("rms_norm_eps", 1e-6 if gemma else 1e-5), rope_theta=get.float("rope_theta", 10000.0),
        tie_embeddings=get.bool("tie_word_embeddings", gemma), max_positions=get.int("max_position_embeddings", 0),
    )
    act = str(doc.get("hidden_activation") or doc.get("hidden_act") or "silu")
    fields["act"] = "gelu_tanh" if act.startswith("gelu") else "silu"
    if model_type in ("qwen2", "qwen2_moe"):
        fields["qkv_bias"] = get.bool("qkv_bias", True)   # Qwen2's q/k/v projections have biases, o_proj none
    elif model_type in ("llama", "qwen3", "qwen3_moe", "gemma2", "gemma3_text"):
        bias = get.bool("attention_bias", False)
        fields.update(qkv_bias=bias, o_bias=bias)
    if model_type == "llama":
        fields["mlp_bias"] = get.bool("mlp_bias", False)
    fields["qk_norm"] = model_type in ("qwen3", "qwen3_moe", "gemma3_text")
    if gemma:
        fields.update(sandwich_norm=True, embed_scale=True, attn_softcap=get.float("attn_logit_softcapping", None),
                      final_softcap=get.float("final_logit_softcapping", None))
    fields["windows"] = _windows(doc, get, model_type, n_layers, path)
    fields["attn_dropout"] = get.rate("attention_dropout", 0.0)
    if model_type == "phi3":
        fields.update(embd_dropout=get.rate("embd_pdrop", 0.0), resid_dropout=get.rate("resid_pdrop", 0.0))
    if model_type == "mixtral":
        fields.update(n_experts=get.int("num_local_experts"), top_k=get.int("num_experts_per_tok"),
                      expert_dim=get.int("intermediate_size"), ffn_dim=0)
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        if get.int("decoder_sparse_step", 1) != 1 or doc.get("mlp_only_layers"):
            raise UserError(f"config file {path}: decoder_sparse_step={doc.get('decoder_sparse_step')} / "
                            f"mlp_only_layers={doc.get('mlp_only_layers')} mix dense and MoE layers, which jaxmem's "
                            "scanned decoder does not build; write a model file (docs/model-files.md)")
        fields.update(n_experts=get.int("num_experts"), top_k=get.int("num_experts_per_tok"),
                      expert_dim=get.int("moe_intermediate_size"), ffn_dim=0,
                      norm_topk_prob=get.bool("norm_topk_prob", model_type == "qwen3_moe"))
        if model_type == "qwen2_moe":
            fields["shared_expert_dim"] = get.int("shared_expert_intermediate_size", 0)
    arch = Arch(**fields)
    if arch.moe and not 1 <= arch.top_k <= arch.n_experts:
        raise UserError(f"config file {path}: num_experts_per_tok={arch.top_k} must be between 1 and the "
                        f"{arch.n_experts} experts")
    if not arch.moe and arch.ffn_dim <= 0:
        raise UserError(f"config file {path}: needs \"intermediate_size\" (the MLP's hidden width)")
    return arch


def _windows(doc: dict[str, Any], get: _Getter, model_type: str, n_layers: int, path: Path
             ) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: global attention), as the family's code reads the config."""
    window = get.int("sliding_window", None)
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        # Qwen: the window applies only with use_sliding_window, to the layers from max_window_layers on
        if not doc.get("use_sliding_window") or not window:
            return (None,) * n_layers
        first = get.int("max_window_layers", n_layers)
        return tuple(window if i >= first else None for i in range(n_layers))
    if not window:
        return (None,) * n_layers
    types = doc.get("layer_types")
    if isinstance(types, list) and len(types) == n_layers:
        return tuple(window if t == "sliding_attention" else None for t in types)
    if model_type == "gemma2":   # even layers local, odd layers global
        return tuple(window if i % 2 == 0 else None for i in range(n_layers))
    if model_type == "gemma3_text":   # pattern 6: five local layers, then one global
        pattern = get.int("sliding_window_pattern", 6)
        return tuple(None if (i + 1) % pattern == 0 else window for i in range(n_layers))
    return (window,) * n_layers   # Mistral, Phi-3, Mixtral: every layer


def _divide(a: int, b: int, an: str, bn: str, path: Path) -> int:
    if b <= 0 or a % b:
        raise UserError(f"config file {path}: {an}={a} is not a multiple of {bn}={b}; give head_dim")
    return a // b


_MISSING = object()


class _Getter:
    """Typed reads of config fields: a missing required field or a wrong type is a UserError naming it."""

    def __init__(self, doc: dict[str, Any], path: Path):
        self.doc, self.path = doc, path

    def _get(self, key: str, default: Any):
        value = self.doc.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise UserError(f"config file {self.path}: has no \"{key}\", which a {self.doc.get('model_type')} "
                                "config needs")
            return default, False
        return value, True

    def int(self, key: str, default: Any = _MISSING):
        value, given = self._get(key, default)
        if given and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise UserError(f"config file {self.path}: \"{key}\": {value!r} is not a non-negative integer")
        return value

    def float(self, key: str, default: Any = _MISSING):
        value, given = self._get(key, default)
        if given and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise UserError(f"config file {self.path}: \"{key}\": {value!r} is not a number")
        return float(value) if given else value

    def rate(self, key: str, default: Any = _MISSING):
        value = self.float(key, default)
        if not 0.0 <= value < 1.0:
            raise UserError(f"config file {self.path}: \"{key}\": {value!r} is not a dropout rate in [0, 1)")
        return value

    def bool(self, key: str, default: Any = _MISSING):
        value, given = self._get(key, default)
        if given and not isinstance(value, bool):
            raise UserError(f"config file {self.path}: \"{key}\": {value!r} is not true or false")
        return value
