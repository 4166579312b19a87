"""The analytic estimate users make today, to compare jaxmem against (benchmarks/accuracy.py).

Two rules, both per device:

* **Train state**: parameters x the classic bytes-per-parameter rule
  (:func:`jaxmem.program.train_state.classic_bytes_per_param`: 16 B/param for Adam in fp32
  or in mixed precision), divided by the devices the layout shards it over
  (``dp``: replicated; ``fsdp``: the data axes; ``tp``: the model axis;
  ``fsdp_tp``: both).
* **Activations**:

  - transformers: Korthikanti et al. 2022, "Reducing Activation Recomputation in
    Large Transformer Models", per layer ``s*b*h*(34 + 5*a*s/h)`` bytes for 16-bit
    activations with 1-byte dropout masks; with tensor parallelism ``t`` (no
    sequence parallelism) ``s*b*h*(10 + 24/t + 5*a*s/(h*t))``; with full
    recomputation only the layer input, ``2*s*b*h``. Plus the output layer
    (final norm, logits, cross entropy): ``4*s*b*h*(1 + v/h)/t``. ``b`` is the
    per-device (data-parallel) batch. In fp32 the 16-bit terms double; the masks
    stay one byte each.
  - everything else (MLPs, CNNs): the rule of torchsummary / Keras ``summary``:
    every layer's output is kept for the backward pass and gets a gradient of
    the same size, so ``2 x sum(layer output elements) x bytes per activation``,
    over the data-parallel devices.

The hyperparameters come from the model's config object (:func:`model_config`):
``workload.model.config`` (linen), ``.cfg`` / ``.config`` of an NNX module, or the
config a ``rngs -> Module`` function closes over. Field names recognised:
layers (``n_layer``, ``n_layers``, ``num_layers``), heads (``n_head``,
``n_heads``, ``num_heads``), hidden size (``n_embd``, ``d_model``,
``hidden_size``, ``embed_dim``), vocabulary (``vocab_size``, else ``n_classes``).
The sequence length is the batch's token axis, or ViT's patch count + 1.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax

from jaxmem.program import layouts, step
from jaxmem.program.state import override_batch
from jaxmem.program.train_state import classic_bytes_per_param

_LAYERS = ("n_layer", "n_layers", "num_layers", "num_hidden_layers")
_HEADS = ("n_head", "n_heads", "num_heads", "num_attention_heads")
_HIDDEN = ("n_embd", "d_model", "hidden_size", "embed_dim")
_VOCAB = ("vocab_size", "n_classes", "num_classes")


@dataclasses.dataclass(frozen=True)
class ClassicEstimate:
    """The analytic per-device estimate, in bytes, and how it was made."""

    state_bytes: int
    activation_bytes: int
    rule: str

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes


def model_config(wl) -> Any | None:
    """The model's config dataclass, wherever the model file keeps it (see module doc)."""
    model = wl.model
    for attr in ("config", "cfg"):
        cfg = getattr(model, attr, None)
        if cfg is not None and dataclasses.is_dataclass(cfg):
            return cfg
    for cell in getattr(model, "__closure__", None) or ():  # `lambda rngs: ViT(cfg, rngs=rngs)`
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return v
    return None


def _field(cfg, names):
    for n in names:
        v = getattr(cfg, n, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


@dataclasses.dataclass(frozen=True)
class TransformerDims:
    layers: int
    heads: int
    hidden: int
    vocab: int
    seq: int


def transformer_dims(wl, batch_leaves) -> TransformerDims | None:
    cfg = model_config(wl)
    if cfg is None:
        return None
    L, a, h = _field(cfg, _LAYERS), _field(cfg, _HEADS), _field(cfg, _HIDDEN)  # noqa: N806 -- the paper's L
    if not (L and a and h):
        return None
    v = _field(cfg, _VOCAB) or 0
    patch, image = getattr(cfg, "patch_size", None), getattr(cfg, "image_size", None)
    if patch and image:
        seq = (image // patch) ** 2 + 1  # patches + the class token
    else:
        tokens = [x for x in batch_leaves if len(x.shape) == 2 and "int" in str(x.dtype)]
        if not tokens:
            return None
        seq = tokens[0].shape[1]
    return TransformerDims(L, a, h, v, seq)


def korthikanti_bytes(d: TransformerDims, b: int, t: int, precision: str, remat: str) -> int:
    """Korthikanti et al. activation memory per device: b = per-device batch, t = tensor parallel."""
    s, h, a, L, v = d.seq, d.hidden, d.heads, d.layers, d.vocab  # noqa: N806 -- the paper's symbols
    scale = 2 if precision == "fp32" else 1  # the formula counts 2-byte activations
    per_layer: float
    if remat in ("full", "nothing_saveable"):
        per_layer = 2 * s * b * h * scale
    else:
        # 16-bit part (34sbh + 5as^2b less the masks) and 1-byte dropout masks (2sbh + as^2b), split by t as in
        # the paper
        sixteen = s * b * h * (8 + 24 / t) + 4 * a * s * s * b / t
        masks = s * b * h * 2 + a * s * s * b / t
        per_layer = sixteen * scale + masks
    output = 4 * s * b * h * (1 + v / h) / t * scale
    return int(L * per_layer + output)


def layer_output_elements(wl, batch) -> int:
    """Sum of the output elements of every Flax layer (Dense, Conv, norms...) for `batch`, abstractly."""

    total = [0]

    def record(out):
        for x in jax.tree.leaves(out):
            if hasattr(x, "shape") and hasattr(x, "dtype") and "float" in str(x.dtype):
                total[0] += math.prod(x.shape)
        return out

    def flax_layer(cls) -> bool:  # Dense, Conv, norms...: the layers the rule counts
        return cls.__module__.startswith("flax.")

    if step.is_nnx(wl):
        from flax import nnx  # noqa: PLC0415 - flax.nnx (0.7 s) loads only for NNX models

        def run(batch):
            model = wl.model if isinstance(wl.model, nnx.Module) else wl.model(nnx.Rngs(0))
            with step.module_outputs(model, record, which=flax_layer):
                return wl.loss(model, batch)
    else:
        def run(batch):
            rngs = {c: jax.random.key(0) for c in ("params", *wl.rng_collections)}
            variables = wl.model.init(rngs, batch, method=lambda m, bb: wl.loss(m, bb))
            bound = wl.model.bind(nn.unbox(variables), rngs={c: jax.random.key(1) for c in wl.rng_collections},
                                  mutable=[k for k in variables if k != "params"])
            with step.module_outputs(None, record, which=flax_layer):
                return wl.loss(bound, batch)

    jax.eval_shape(run, batch)
    return total[0]


def estimate(wl, *, param_count: int, mesh: str, layout: str, precision: str, optimizer: str | None,
             remat: str, batch_size: int | None = None) -> ClassicEstimate:
    """The classic per-device estimate for the step jaxmem analyzes with these options."""

    mesh_spec = layouts.parse_mesh(mesh)
    data, model = mesh_spec.data_size, mesh_spec.axis_size(mesh_spec.model_axis)
    opt = (optimizer or "adamw").lower()
    bpp = classic_bytes_per_param(opt, precision)
    zero = mesh_spec.axis_size(mesh_spec.state_axes)   # the fsdp axes (HSDP), else the data axes
    shards = {"dp": 1, "fsdp": zero, "tp": model, "fsdp_tp": zero * model}.get(layout, 1)
    state = param_count * bpp // shards
    rule = f"state {bpp} B/param ({opt}, {precision}) / {shards}"

    batch = override_batch(wl.batch, batch_size)
    leaves = jax.tree.leaves(batch)
    global_b = leaves[0].shape[0] if leaves and leaves[0].shape else 1
    b = max(global_b // max(data, 1), 1)
    t = model if layout in ("tp", "fsdp_tp") else 1
    dims = transformer_dims(wl, leaves)
    if dims is not None:
        act = korthikanti_bytes(dims, b, t, precision, remat)
        rule += (f" + Korthikanti activations (L={dims.layers}, h={dims.hidden}, a={dims.heads}, s={dims.seq}, "
                 f"v={dims.vocab}, b={b}, t={t}, remat={remat})")
    else:
        act_bytes = 4 if precision == "fp32" else 2
        elements = layer_output_elements(wl, batch)
        act = 2 * elements * act_bytes // max(data, 1)
        rule += f" + 2 x layer outputs x {act_bytes} B / {data} (torchsummary rule)"
    return ClassicEstimate(int(state), int(act), rule)
