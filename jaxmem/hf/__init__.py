"""`jaxmem analyze config.json`: a Hugging Face config, built as a Flax decoder and analyzed like a model file.

jaxmem.hf.config reads the config (no network, no weights), jaxmem.hf.model is the Flax decoder it
names, and :func:`workload_function` is the ``workload()`` a model file would define: it takes
the same ``--arg``s (``batch_size``, ``seq_len``, ``attention`` (auto, xla, cudnn), ``numerics``,
``remat_save``, ``vocab_tiles`` (the loss in that many tiles of the sequence), ``scan`` (false: the layers
as a Python loop, as Hugging Face's Flax models run them), and the MoE's
``capacity_factor``, ``group_size``, ``aux_loss_coef``) and ``remat``, so every option of
analyze, compare, advise and the API applies through the one Workload path
(jaxmem.program.workload.load_workload routes a config there).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import operator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

import jaxmem
from jaxmem.errors import UserError
from jaxmem.hf.config import SUPPORTED, Arch, checkpoint_dtype, config_file, parse, read
from jaxmem.hf.model import CHECKPOINT_NAMES, CUDNN_HEAD_DIM, NUMERICS, Decoder, Opts
from jaxmem.program import sizes
from jaxmem.report import ReportWarning

__all__ = ["SUPPORTED", "Arch", "check_context", "config_file", "context_field", "info", "load_arch", "parameter_count",
           "workload_function"]

DEFAULT_SEQ_LEN = 2048   # models/llama.py's default, capped at the model's own context (GPT-2: 1024)
DEFAULT_BATCH = 8
MOE_ARGS = ("capacity_factor", "group_size", "aux_loss_coef")   # --args only an MoE config's step reads
ATTENTION = ("auto", "xla", "cudnn")   # --arg attention: auto is jaxmem.hf.model.attention_choice
# --arg scan=false: the most layers unrolled (the largest published decoders have a few hundred; each
# layer of a Python loop is traced and compiled on its own)
MAX_UNROLLED_LAYERS = 1024


def load_arch(path: str | Path) -> Arch:
    p = Path(path)
    return parse(read(p), p)


def workload_function(path: Path):
    """The config's ``workload(batch_size, seq_len, remat, ...)``, as a model file defines it."""
    doc = read(Path(path))
    arch, dtype = parse(doc, Path(path)), checkpoint_dtype(doc)

    def workload(batch_size: int | None = None, seq_len: int | None = None, remat: str = "none",
                 attention: str = "auto", numerics: str = "default", remat_save: str = "",
                 capacity_factor: float | None = None, group_size: int | None = None,
                 aux_loss_coef: float | None = None, vocab_tiles: int = 1, scan: bool = True):
        return build_workload(arch, path, batch_size=batch_size, seq_len=seq_len, remat=remat, attention=attention,
                              numerics=numerics, remat_save=remat_save, capacity_factor=capacity_factor,
                              group_size=group_size, aux_loss_coef=aux_loss_coef, vocab_tiles=vocab_tiles,
                              scan=scan, checkpoint_dtype=dtype)

    workload.__qualname__ = workload.__name__ = f"{arch.model_type}"
    return workload


def build_workload(arch: Arch, path: Path | str = "<config>", *, batch_size: int | None = None,
                   seq_len: int | None = None, checkpoint_dtype: str | None = None, **options: Any):

    where = f"config file {path}"
    for key, value, kind in (("batch_size", batch_size, int), ("seq_len", seq_len, int),
                             ("group_size", options.get("group_size"), int),
                             ("capacity_factor", options.get("capacity_factor"), float),
                             ("aux_loss_coef", options.get("aux_loss_coef"), float),
                             ("vocab_tiles", options.get("vocab_tiles"), int)):
        if value is not None and not _number(value, kind):
            what = "an integer" if kind is int else "a finite number"
            raise UserError(f"{where}: --arg {key}={value!r} is not {what}; give e.g. --arg {key}=8")
    batch_size, seq_len = _index(batch_size), _index(seq_len)
    options = {k: _index(v) if k == "group_size" else v for k, v in options.items()}
    moe_only = {k: v for k in MOE_ARGS if (v := options.get(k)) is not None}
    if moe_only and not arch.moe:   # an argument the step would ignore: the step analyzed would not be the one asked
        given = " ".join(f"--arg {k}={v}" for k, v in moe_only.items())
        raise UserError(f"{where}: {given}: {arch.model_type} is a dense decoder (no experts), and "
                        f"{', '.join(MOE_ARGS)} set its MoE layers' routing; drop them, or give an MoE config "
                        "(mixtral, qwen2_moe, qwen3_moe)")
    opts = Opts(**{k: v for k, v in options.items() if v is not None or k == "group_size"})
    if not isinstance(opts.scan, bool):
        raise UserError(f"{where}: --arg scan={opts.scan!r}; expected true (the layers under nn.scan, the default) "
                        "or false (a Python loop, as Hugging Face's Flax models run them)")
    if opts.attention not in ATTENTION:
        raise UserError(f"{where}: --arg attention={opts.attention!r}; expected one of "
                        f"{', '.join(map(repr, ATTENTION))} (auto: cuDNN flash attention where the target supports it, "
                        "else xla)")
    if opts.numerics not in NUMERICS:
        raise UserError(f"{where}: --arg numerics={opts.numerics!r}; expected one of {', '.join(map(repr, NUMERICS))}")
    unknown = [n for n in opts.remat_save.split(",") if n and n not in CHECKPOINT_NAMES]
    if opts.remat.startswith("offload:"):
        unknown += [n for n in opts.remat[len("offload:"):].split(",") if n not in CHECKPOINT_NAMES]
    if unknown:
        raise UserError(f"{where}: {', '.join(unknown)} is no activation the decoder names; known: "
                        f"{', '.join(CHECKPOINT_NAMES)}")
    if opts.remat_save and opts.remat == "none":
        raise UserError(f"{where}: --arg remat_save names what a remat policy also saves; give --remat too")
    if not opts.capacity_factor > 0:
        raise UserError(f"{where}: --arg capacity_factor={opts.capacity_factor} must be positive")
    # the defaults only where the argument was not given: a 0 given is refused, never replaced
    b = DEFAULT_BATCH if batch_size is None else batch_size
    t = (min(DEFAULT_SEQ_LEN, arch.max_positions) if arch.max_positions else DEFAULT_SEQ_LEN) if seq_len is None \
        else seq_len
    for key, value in (("batch_size", b), ("seq_len", t)):
        if not 1 <= value <= sizes.INT32_MAX:
            raise UserError(f"{where}: --arg {key}={value} must be at least 1 and at most {sizes.INT32_MAX:,} "
                            "(int32, the largest dimension XLA can shape)")
    # one compiled layer run as a loop of n_layers iterations: XLA's compile time grows with it (jaxmem.program.sizes)
    sizes.check_loop(arch.n_layers, f"{where}: {'n_layer' if arch.model_type == 'gpt2' else 'num_hidden_layers'}="
                     f"{arch.n_layers:,}: the decoder's layer loop (nn.scan)",
                     "the largest published decoders have a few hundred layers; check the config")
    if not opts.scan and arch.n_layers > MAX_UNROLLED_LAYERS:   # a Python loop traces every layer on its own
        raise UserError(f"{where}: --arg scan=false with {arch.n_layers:,} layers: the Python loop traces and "
                        f"compiles each layer on its own, and jaxmem unrolls at most {MAX_UNROLLED_LAYERS:,}; "
                        "drop --arg scan=false (the layers under nn.scan compile once)")
    if opts.attention == "cudnn":   # what jax's cuDNN attention refuses, said before any trace
        _check_cudnn(arch, t, where)
    if arch.positions == "learned" and arch.max_positions < t:
        raise UserError(f"{where}: --arg seq_len={t} is longer than the model's {arch.max_positions} learned "
                        "positions (n_positions)")
    if opts.vocab_tiles < 1 or t % opts.vocab_tiles:
        want = opts.vocab_tiles if opts.vocab_tiles >= 1 else 8
        fit = max(d for d in range(1, min(t, want) + 1) if t % d == 0)
        raise UserError(f"{where}: --arg vocab_tiles={opts.vocab_tiles} must be at least 1 and divide seq_len={t} "
                        "(the loss is computed in that many equal tiles of each sequence); "
                        f"e.g. --arg vocab_tiles={fit}")
    if arch.moe and opts.group_size is not None and (opts.group_size < 1 or t % opts.group_size):
        raise UserError(f"{where}: --arg group_size={opts.group_size} must divide seq_len={t}")
    batch = {"tokens": jax.ShapeDtypeStruct((b, t), jnp.int32), "targets": jax.ShapeDtypeStruct((b, t), jnp.int32)}
    # no optimizer of its own: jaxmem's AdamW (optax.adamw's state and update; the rate changes no byte), so
    # --optimizer and --moment-dtype apply to a config.json model as its trainers' options would
    return jaxmem.Workload(
        model=Decoder(arch, opts), batch=batch, loss=_loss, name=arch.model_type, checkpoint_dtype=checkpoint_dtype,
        fp8_exclude=r"(^|/)(lm_head|embed)$" if opts.numerics == "maxtext" else None)


def context_field(arch: Arch) -> str:
    """The config.json field that holds the model's context."""
    return "n_positions" if arch.model_type == "gpt2" else "max_position_embeddings"


def check_context(model: Any, seq_len: int | None) -> list[ReportWarning]:
    """A config.json decoder given a sequence longer than its context (max_position_embeddings): RoPE computes
    any length, so the step compiles and its memory is the memory of that length, but the model was not trained
    on positions that far (a learned position table refuses it earlier, in build_workload)."""
    arch = model.arch if isinstance(model, Decoder) else None
    if arch is None or not arch.max_positions or seq_len is None or seq_len <= arch.max_positions:
        return []
    field = context_field(arch)
    return [ReportWarning("past_context", (
        f"the sequence length {seq_len:,} is past the model's context: its config.json's {field} is "
        f"{arch.max_positions:,}. The memory shown is that of {seq_len:,} tokens, but the model was not trained on "
        f"positions that far: give --arg seq_len={arch.max_positions} or less, or extend the context "
        "(rope_scaling, and a config whose " + field + " says so)"))]


def _number(value: Any, kind: type) -> bool:
    """An --arg value of the kind asked: an integer of any type (numpy's too), never a bool; a float
    also from an integer, and finite."""
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Integral):
        return True
    return kind is float and isinstance(value, numbers.Real) and math.isfinite(value)


def _index(value: Any) -> Any:
    """An integer --arg as Python's int (numpy's too), for the shapes built from it."""
    return operator.index(value) if isinstance(value, numbers.Integral) else value


def _loss(model, batch):
    if model.opts.vocab_tiles > 1:   # the cross-entropy tile by tile: the full logits are never live
        ce, aux = model(batch["tokens"], train=True, targets=batch["targets"])
        return ce + model.opts.aux_loss_coef * aux if model.arch.moe else ce
    logits, aux = model(batch["tokens"], train=True)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["targets"]).mean()
    return ce + model.opts.aux_loss_coef * aux if model.arch.moe else ce


@functools.lru_cache(maxsize=32)
def parameter_count(arch: Arch) -> int:
    """The parameters of the decoder an Arch names, counted from jax.eval_shape (nothing allocated)."""

    tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    # the key made inside the traced function: no concrete array, so no backend is started for it
    shapes = jax.eval_shape(lambda: Decoder(arch, Opts()).init(jax.random.key(0), tokens))
    return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(shapes))


def info(path: str | Path) -> dict[str, Any]:
    """The report's `hf_config`: the config's model_type, its parameter count, its vocabulary (the logits'
    last dimension, which the report's hints find them by) and its path."""
    p = Path(path)
    cfg = config_file(p) or p
    arch = load_arch(cfg)
    return {"model_type": arch.model_type, "parameters": parameter_count(arch), "vocab_size": arch.vocab_size,
            "path": str(cfg)}


def info_if_config(path: str | Path) -> dict[str, Any] | None:
    """:func:`info` when `path` is a config.json (or its folder); None for a model file."""
    return None if config_file(path) is None else info(path)


def with_config(report, config: dict[str, Any] | None):
    """`report` with its `hf_config` set from :func:`info_if_config` (as it is for a model file)."""

    return report if config is None else dataclasses.replace(report, hf_config=config)


def _check_cudnn(arch, seq_len: int, where: str) -> None:
    """--arg attention=cudnn where jax's cuDNN attention cannot run this model: one message naming the limit and
    the fix (auto's rule, jaxmem.hf.model.attention_choice, picks xla for these on its own)."""
    why = None
    if seq_len % 2:
        why = f"an odd sequence length ({seq_len}): jax's cuDNN attention refuses it in training"
    elif arch.head_dim % 8 or arch.head_dim > CUDNN_HEAD_DIM:
        why = f"head_dim {arch.head_dim}: jax's cuDNN attention takes a multiple of 8 up to {CUDNN_HEAD_DIM}"
    elif arch.attn_softcap:
        why = "attention logit softcapping, which jax's cuDNN attention does not have"
    elif arch.attn_dropout:
        why = f"attention dropout {arch.attn_dropout}, which jax's cuDNN attention does not take"
    if why:
        raise UserError(f"{where}: --arg attention=cudnn with {why}; use --arg attention=auto (cuDNN where it "
                        "can run, else xla) or --arg attention=xla" + (", or an even --arg seq_len" if seq_len % 2
                                                                      else ""))

