"""`jaxmem analyze config.json`: a Hugging Face config, built as a Flax decoder and analyzed like a model file.

jaxmem.hf.config reads the config (no network, no weights), jaxmem.hf.model is the Flax decoder it
names, and :func:`workload_function` is the ``workload()`` a model file would define: it takes
the same ``--arg``s (``batch_size``, ``seq_len``, ``attention`` (auto, xla, cudnn), ``numerics``,
``remat_save``, ``vocab_tiles`` (the loss in that many tiles of the sequence), and the MoE's
``capacity_factor``, ``group_size``, ``aux_loss_coef``) and ``remat``, so every option of
analyze, compare, advise and the API applies through the one Workload path
(jaxmem.program.workload.load_workload routes a config there).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

import jaxmem
from jaxmem.errors import UserError
from jaxmem.hf.config import SUPPORTED, Arch, config_file, parse, read
from jaxmem.hf.model import CHECKPOINT_NAMES, NUMERICS, Decoder, Opts

__all__ = ["SUPPORTED", "Arch", "config_file", "info", "load_arch", "parameter_count", "workload_function"]

DEFAULT_SEQ_LEN = 2048   # models/llama.py's default, capped at the model's own context (GPT-2: 1024)
DEFAULT_BATCH = 8
ATTENTION = ("auto", "xla", "cudnn")   # --arg attention: auto is jaxmem.hf.model.attention_choice


def load_arch(path: str | Path) -> Arch:
    p = Path(path)
    return parse(read(p), p)


def workload_function(path: Path):
    """The config's ``workload(batch_size, seq_len, remat, ...)``, as a model file defines it."""
    arch = load_arch(path)

    def workload(batch_size: int | None = None, seq_len: int | None = None, remat: str = "none",
                 attention: str = "auto", numerics: str = "default", remat_save: str = "",
                 capacity_factor: float = 1.25, group_size: int | None = None, aux_loss_coef: float = 0.01,
                 vocab_tiles: int = 1):
        return build_workload(arch, path, batch_size=batch_size, seq_len=seq_len, remat=remat, attention=attention,
                              numerics=numerics, remat_save=remat_save, capacity_factor=capacity_factor,
                              group_size=group_size, aux_loss_coef=aux_loss_coef, vocab_tiles=vocab_tiles)

    workload.__qualname__ = workload.__name__ = f"{arch.model_type}"
    return workload


def build_workload(arch: Arch, path: Path | str = "<config>", *, batch_size: int | None = None,
                   seq_len: int | None = None, **options: Any):

    where = f"config file {path}"
    for key, value, kind in (("batch_size", batch_size, int), ("seq_len", seq_len, int),
                             ("group_size", options.get("group_size"), int),
                             ("capacity_factor", options.get("capacity_factor"), (int, float)),
                             ("aux_loss_coef", options.get("aux_loss_coef"), (int, float)),
                             ("vocab_tiles", options.get("vocab_tiles"), int)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise UserError(f"{where}: --arg {key}={value!r} is not a number; give e.g. --arg {key}=8")
    opts = Opts(**options)
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
    b = batch_size or DEFAULT_BATCH
    t = seq_len or (min(DEFAULT_SEQ_LEN, arch.max_positions) if arch.max_positions else DEFAULT_SEQ_LEN)
    if b < 1 or t < 1:
        raise UserError(f"{where}: --arg batch_size={b} seq_len={t}: both must be at least 1")
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
        model=Decoder(arch, opts), batch=batch, loss=_loss, name=arch.model_type,
        fp8_exclude=r"(^|/)(lm_head|embed)$" if opts.numerics == "maxtext" else None)


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
