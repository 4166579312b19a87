"""A Hugging Face ``config.json``, read into the architecture jaxmem's decoder builds (:class:`Arch`).

Only the fields that change memory or the program are read: sizes (vocabulary, width, layers,
heads, K/V heads, head_dim, MLP width), tied embeddings, biases, QK norms, Gemma's extra norms
and soft-capping, sliding windows (per layer), and the MoE fields (experts, top-k, expert width,
shared experts). RoPE scaling, dropout rates, token ids and initializer ranges change no buffer.
No network and no weights: the file is a local one, read as any file jaxmem reads (jaxmem.files).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
from pathlib import Path
from typing import Any

from jaxmem import files
from jaxmem.errors import UserError
from jaxmem.program.options import CHECKPOINT_DTYPES
from jaxmem.program.sizes import INT32_MAX, INT64_MAX

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
class Windows:
    """Which layers attend through a sliding window, as a rule rather than a per-layer list (a config
    may name 2^31 - 1 layers): layer i is local when i >= first and i % period is not in global_at."""

    size: int | None = None          # None: every layer attends globally
    period: int = 1
    global_at: tuple[int, ...] = ()  # the residues (mod period) of the global layers
    first: int = 0                   # the layers before it are global (Qwen's max_window_layers)

    def at(self, i: int) -> int | None:
        """Layer i's window (None: global attention)."""
        if self.size is None or i < self.first or i % self.period in self.global_at:
            return None
        return self.size

    def mode(self, n_layers: int, seq_len: int) -> str:
        """"global" (no layer masks anything: no window, or one at least as wide as the sequence, which
        is unbounded for it), "uniform" (every layer the same window) or "mixed". O(len(global_at))."""
        if self.size is None or self.size >= seq_len or self.first >= n_layers:
            return "global"
        span = min(n_layers - self.first, self.period)   # consecutive layers from `first`: distinct residues
        residues = {(self.first + k) % self.period for k in range(min(span, len(self.global_at) + 1))}
        if span > len(self.global_at) or not residues <= set(self.global_at):
            any_global = self.first > 0 or any(g < min(n_layers, self.period) for g in self.global_at)
            return "mixed" if any_global else "uniform"
        return "global"


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
    windows: Windows = Windows()       # which layers attend through a sliding window, and its size
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


def checkpoint_dtype(doc: dict[str, Any]) -> str | None:
    """The dtype the checkpoint's weights are stored in: transformers' `torch_dtype` (`dtype` from
    transformers 4.56), or a multimodal config's text_config's; None when it names none jaxmem knows."""
    text = doc.get("text_config")
    for d in (doc, text if isinstance(text, dict) else {}):
        for key in ("torch_dtype", "dtype"):
            value = d.get(key)
            if isinstance(value, str) and value in CHECKPOINT_DTYPES:
                return value
    return None


def unsupported(path: Path, model_type: object) -> UserError:
    listed = ", ".join(f"{k} ({v})" for k, v in SUPPORTED.items())
    return UserError(f"config file {path}: model_type {model_type!r} is not one jaxmem builds. Supported: {listed}. "
                     "For another architecture write a model file (a .py defining workload(); see "
                     "docs/model-files.md) and analyze that.")


def _model_type(doc: dict[str, Any], path: Path) -> tuple[dict[str, Any], str]:
    """The config's model_type, one jaxmem builds, and the dict its decoder's fields are read from."""
    model_type = doc.get("model_type")
    if not isinstance(model_type, str):
        raise UserError(f"config file {path}: \"model_type\": {_show(model_type)} is not a string; give one of "
                        f"{', '.join(SUPPORTED)}")
    if model_type == "gemma3":
        # the multimodal Gemma 3 config: its language model (the vision tower is not built). Without a
        # text_config the text model's fields are the config's own: the same decoder as gemma3_text
        text = doc.get("text_config")
        if text is not None and not isinstance(text, dict):
            raise UserError(f"config file {path}: \"text_config\": {_show(text)} is not an object; give Gemma 3's "
                            "text_config (its language model's fields)")
        doc = {**(doc if text is None else text), "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    if model_type not in SUPPORTED:
        raise unsupported(path, model_type)
    return doc, model_type


def _gpt2(get: _Getter, path: Path) -> Arch:
    """GPT-2's Arch: its own field names, learned positions, LayerNorm, biases everywhere."""
    d = get.size("n_embd")
    heads = get.size("n_head")
    arch = Arch(model_type="gpt2", vocab_size=get.size("vocab_size"), d_model=d, n_layers=get.size("n_layer"),
                n_heads=heads, n_kv_heads=heads, head_dim=_divide(d, heads, "n_embd", "n_head", path),
                ffn_dim=get.size("n_inner", None) or 4 * d, norm="layer",
                norm_eps=get.float("layer_norm_epsilon", 1e-5), act="gelu_tanh", gated_mlp=False, qkv_bias=True,
                o_bias=True, mlp_bias=True, tie_embeddings=get.bool("tie_word_embeddings", True),
                positions="learned", max_positions=get.size("n_positions"),
                embd_dropout=get.rate("embd_pdrop", 0.1), attn_dropout=get.rate("attn_pdrop", 0.1),
                resid_dropout=get.rate("resid_pdrop", 0.1))
    _check_arrays(arch, _GPT2_NAMES, path)
    return arch


def _experts(doc: dict[str, Any], get: _Getter, model_type: str, path: Path) -> dict[str, Any]:
    """A mixture of experts' fields (Mixtral, Qwen2-MoE, Qwen3-MoE); none for a dense model."""
    if model_type == "mixtral":
        return {"n_experts": get.size("num_local_experts"), "top_k": get.size("num_experts_per_tok"),
                "expert_dim": get.size("intermediate_size")}
    if model_type not in ("qwen2_moe", "qwen3_moe"):
        return {}
    if get.positive("decoder_sparse_step", 1) != 1 or doc.get("mlp_only_layers"):
        raise UserError(f"config file {path}: decoder_sparse_step={doc.get('decoder_sparse_step')} / "
                        f"mlp_only_layers={doc.get('mlp_only_layers')} mix dense and MoE layers, which jaxmem's "
                        "scanned decoder does not build; write a model file (docs/model-files.md)")
    fields = {"n_experts": get.size("num_experts"), "top_k": get.size("num_experts_per_tok"),
              "expert_dim": get.size("moe_intermediate_size"),
              "norm_topk_prob": get.bool("norm_topk_prob", model_type == "qwen3_moe")}
    if model_type == "qwen2_moe":
        fields["shared_expert_dim"] = get.size("shared_expert_intermediate_size", 0, zero=True)
    return fields


def parse(doc: dict[str, Any], path: Path) -> Arch:
    """The Arch of a config dict: every field it reads checked first (a UserError naming the field,
    its value and the limit), so that nothing is built from a size XLA cannot shape."""
    doc, model_type = _model_type(doc, path)
    get = _Getter(doc, path)
    if model_type == "gpt2":
        return _gpt2(get, path)
    d = get.size("hidden_size")
    n_layers = get.size("num_hidden_layers")
    heads = get.size("num_attention_heads")
    kv = get.size("num_key_value_heads", None) or heads
    if heads % kv:
        raise UserError(f"config file {path}: num_attention_heads={heads} is not a multiple of "
                        f"num_key_value_heads={kv}; each K/V head serves a whole group of query heads")
    head_dim = get.size("head_dim", None) or _divide(d, heads, "hidden_size", "num_attention_heads", path)
    if head_dim % 2:
        raise UserError(f"config file {path}: head_dim={head_dim} is odd; rotary position embeddings rotate "
                        "pairs of dimensions, so a head needs an even head_dim")
    gemma = model_type in ("gemma2", "gemma3_text")
    moe = model_type in ("mixtral", "qwen2_moe", "qwen3_moe")
    fields: dict[str, Any] = dict(  # noqa: C408 -- the Arch's fields, as keywords
        model_type=model_type, vocab_size=get.size("vocab_size"), d_model=d, n_layers=n_layers, n_heads=heads,
        n_kv_heads=kv, head_dim=head_dim, ffn_dim=0 if moe else get.size("intermediate_size"),
        norm_eps=get.float("rms_norm_eps", 1e-6 if gemma else 1e-5), rope_theta=get.float("rope_theta", 10000.0),
        tie_embeddings=get.bool("tie_word_embeddings", gemma), max_positions=get.size("max_position_embeddings", 0),
    )
    if not fields["rope_theta"] > 0:
        raise UserError(f"config file {path}: \"rope_theta\": {fields['rope_theta']!r} is not positive; it is the "
                        "base of the rotary embeddings' frequencies")
    act = doc.get("hidden_activation") or doc.get("hidden_act") or "silu"
    fields["act"] = "gelu_tanh" if isinstance(act, str) and act.startswith("gelu") else "silu"
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
    fields["windows"] = _windows(doc, get, model_type, n_layers)
    fields["attn_dropout"] = get.rate("attention_dropout", 0.0)
    if model_type == "phi3":
        fields.update(embd_dropout=get.rate("embd_pdrop", 0.0), resid_dropout=get.rate("resid_pdrop", 0.0))
    fields.update(_experts(doc, get, model_type, path))
    arch = Arch(**fields)
    if arch.moe and not arch.top_k <= arch.n_experts:
        raise UserError(f"config file {path}: num_experts_per_tok={arch.top_k} must be between 1 and the "
                        f"{arch.n_experts} experts")
    _check_arrays(arch, {**_NAMES, "n_experts": "num_local_experts" if model_type == "mixtral" else "num_experts",
                         "expert_dim": "intermediate_size" if model_type == "mixtral" else "moe_intermediate_size"},
                  path)
    return arch


def _windows(doc: dict[str, Any], get: _Getter, model_type: str, n_layers: int) -> Windows:
    """Which layers attend through a sliding window, as the family's code reads the config: a rule,
    never a per-layer list (a config may name 2^31 - 1 layers). A window of any size is taken: one
    wider than the sequence masks nothing, so it is full attention (Windows.mode)."""
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        # Qwen: the window applies only with use_sliding_window, to the layers from max_window_layers on
        if not get.bool("use_sliding_window", False):
            return Windows()
        window = get.positive("sliding_window", None)
        if window is None:
            return Windows()
        return Windows(window, first=get.count("max_window_layers", n_layers))
    window = get.positive("sliding_window", None)
    if window is None:
        return Windows()
    types = doc.get("layer_types")
    if isinstance(types, list) and len(types) == n_layers:   # the list is the config's own: bounded by its size
        return Windows(window, period=n_layers,
                       global_at=tuple(i for i, t in enumerate(types) if t != "sliding_attention"))
    if model_type == "gemma2":   # even layers local, odd layers global
        return Windows(window, period=2, global_at=(1,))
    if model_type == "gemma3_text":   # pattern 6: five local layers, then one global
        pattern = get.positive("sliding_window_pattern", 6)
        return Windows(window, period=pattern, global_at=(pattern - 1,))
    return Windows(window)   # Mistral, Phi-3, Mixtral: every layer


def _divide(a: int, b: int, an: str, bn: str, path: Path) -> int:
    if a % b:
        raise UserError(f"config file {path}: {an}={a} is not a multiple of {bn}={b}; give head_dim")
    return a // b


# The Arch's sizes by the config fields that give them (for the messages of _check_arrays)
_NAMES = {"vocab_size": "vocab_size", "d_model": "hidden_size", "n_layers": "num_hidden_layers",
          "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
          "ffn_dim": "intermediate_size", "shared_expert_dim": "shared_expert_intermediate_size"}
_GPT2_NAMES = {"vocab_size": "vocab_size", "d_model": "n_embd", "n_layers": "n_layer", "n_heads": "n_head",
               "head_dim": "n_embd / n_head", "ffn_dim": "n_inner (default 4 x n_embd)", "max_positions": "n_positions"}
PARAM_BYTES = 4   # the decoder's parameters are fp32 (and so is AdamW's state of each)


def _check_arrays(arch: Arch, names: dict[str, str], path: Path) -> None:
    """The largest parameters the Arch makes, within XLA's limits: every dimension in int32, every
    array's bytes in int64 (jaxmem.program.sizes, which checks every leaf again once traced). Here the
    message can name the config fields that make the array."""
    a = arch
    stacks = [("the embedding", ("vocab_size", "d_model")),
              ("each attention projection", ("n_layers", "d_model", "n_heads", "head_dim")),
              ("the MLP", ("n_layers", "d_model", "ffn_dim")),
              ("the experts", ("n_layers", "n_experts", "d_model", "expert_dim")),
              ("the shared expert", ("n_layers", "d_model", "shared_expert_dim")),
              ("the position table", ("max_positions", "d_model") if a.positions == "learned" else ())]
    stacks = [(what, dims) for what, dims in stacks if dims and all(getattr(a, f) for f in dims)]
    for f in dict.fromkeys(f for _, dims in stacks for f in dims):   # the derived sizes (GPT-2's 4 x n_embd)
        if getattr(a, f) > INT32_MAX:
            raise UserError(f"config file {path}: {names.get(f, f)}={_show(getattr(a, f))} is beyond int32 "
                            f"({INT32_MAX:,}), the largest dimension XLA can shape; check the config's sizes")
    for what, dims in stacks:
        values = [getattr(a, f) for f in dims]
        nbytes = math.prod(values) * PARAM_BYTES
        if nbytes > INT64_MAX:
            given = " x ".join(f"{names.get(f, f)}={v:,}" for f, v in zip(dims, values, strict=True))
            raise UserError(f"config file {path}: {what} ({given}, fp32) is {nbytes:.3e} bytes, beyond what XLA's "
                            "64-bit byte counts express (2^63 - 1); check the config's sizes")


def _show(value: Any) -> str:
    """A config value as a message quotes it: a huge integer by its magnitude, not its 400 digits."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        digits = str(abs(value))
        return f"{'-' if value < 0 else ''}{digits[0]}.{digits[1:4]}e{len(digits) - 1}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_MISSING = object()


class _Getter:
    """Typed reads of config fields: a missing required field, a wrong type or a value out of bounds
    is a UserError naming the field, its value and the limit."""

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

    def _integer(self, key: str, value: Any, what: str) -> int:
        """`value` as an int: an integer of any kind (numpy's too), never a bool, a float or a string."""
        if not isinstance(value, bool):
            try:
                return operator.index(value)
            except TypeError:
                pass
        raise UserError(f"config file {self.path}: \"{key}\": {_show(value)} is not {what}")

    def size(self, key: str, default: Any = _MISSING, *, zero: bool = False):
        """A dimension of the decoder's arrays: a positive integer (`zero`: or 0, for none) within int32."""
        value, given = self._get(key, default)
        if not given:
            return value
        what = "a non-negative integer" if zero else "a positive integer"
        n = self._integer(key, value, what)
        if n < (0 if zero else 1):
            raise UserError(f"config file {self.path}: \"{key}\": {_show(n)} is not {what}; the smallest it can be "
                            f"is {0 if zero else 1}")
        if n > INT32_MAX:
            raise UserError(f"config file {self.path}: \"{key}\": {_show(n)} is beyond int32 ({INT32_MAX:,}), the "
                            "largest dimension XLA can shape (jax indexes arrays with int32); check the config")
        return n

    def positive(self, key: str, default: Any = _MISSING):
        """A positive integer of any size (a window, a pattern: no array has it as a dimension)."""
        value, given = self._get(key, default)
        if not given:
            return value
        n = self._integer(key, value, "a positive integer")
        if n < 1:
            unset = "null, for none" if default is None else f"null, for the default {default}"
            raise UserError(f"config file {self.path}: \"{key}\": {_show(n)} is not a positive integer; the smallest "
                            f"it can be is 1 (leave it out, or {unset})")
        return n

    def count(self, key: str, default: Any = _MISSING):
        """A non-negative integer of any size (a layer index)."""
        value, given = self._get(key, default)
        if not given:
            return value
        n = self._integer(key, value, "a non-negative integer")
        if n < 0:
            raise UserError(f"config file {self.path}: \"{key}\": {_show(n)} is not a non-negative integer")
        return n

    def float(self, key: str, default: Any = _MISSING):
        value, given = self._get(key, default)
        if not given:
            return value
        try:
            number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
        except OverflowError:   # an integer past float's range
            number = math.inf
        if not math.isfinite(number):
            raise UserError(f"config file {self.path}: \"{key}\": {_show(value)} is not a finite number")
        return number

    def rate(self, key: str, default: Any = _MISSING):
        value = self.float(key, default)
        if not 0.0 <= value < 1.0:
            raise UserError(f"config file {self.path}: \"{key}\": {value!r} is not a dropout rate in [0, 1)")
        return value

    def bool(self, key: str, default: Any = _MISSING):
        value, given = self._get(key, default)
        if given and not isinstance(value, bool):
            raise UserError(f"config file {self.path}: \"{key}\": {_show(value)} is not true or false")
        return value
