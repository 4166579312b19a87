"""ResNet v1.5 in Flax linen (after flax/examples/imagenet), with BatchNorm statistics.

    jaxmem analyze models/resnet.py --arg preset=resnet18 --arg batch_size=512

BatchNorm keeps running statistics in the mutable ``batch_stats`` collection; the
training step updates them (``use_running_average=not train``). By default BatchNorm
names no ``axis_name``: under ``jit`` with a sharded batch XLA computes the global batch
statistics itself. ``--arg axis_name=batch`` writes it as the flax example does, for
``pmap``: jaxmem then runs the loss per data-parallel device group with that axis bound
(jaxmem/program/calls.py), the statistics' mean an all-reduce over the data axes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import jaxmem
from jaxmem.errors import UserError


@dataclass(frozen=True)
class Config:
    stage_sizes: tuple[int, ...] = (3, 4, 6, 3)  # blocks per stage: ResNet-50
    block: str = "bottleneck"  # "basic" (ResNet-18/34) or "bottleneck" (ResNet-50+)
    width: int = 64  # channels of the first stage; doubled at every stage
    n_classes: int = 1000  # ImageNet
    image_size: int = 224  # ImageNet crops
    batch_size: int = 256  # default global batch (the classic 8 GPUs x 32)
    remat: str = "none"  # a jaxmem.REMAT_POLICIES name: checkpoint every residual block
    axis_name: str | None = None  # BatchNorm's cross-device axis as flax's pmap example names it ("batch")


PRESETS = {
    "tiny": Config(stage_sizes=(1, 1), block="basic", width=16, n_classes=10, image_size=32, batch_size=8),  # tests
    "resnet18": Config(stage_sizes=(2, 2, 2, 2), block="basic"),  # 11.7 M params
    "resnet34": Config(stage_sizes=(3, 4, 6, 3), block="basic"),  # 21.8 M params
    "resnet50": Config(),  # 25.6 M params
    "resnet101": Config(stage_sizes=(3, 4, 23, 3)),  # 44.5 M params
}


class BasicBlock(nn.Module):
    filters: int
    strides: int = 1
    axis_name: str | None = None

    @nn.compact
    def __call__(self, x, train: bool):
        norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5,
                       axis_name=self.axis_name)
        residual = x
        y = nn.Conv(self.filters, (3, 3), (self.strides, self.strides), use_bias=False, name="conv1")(x)
        y = nn.relu(norm(name="bn1")(y))
        y = nn.Conv(self.filters, (3, 3), use_bias=False, name="conv2")(y)
        y = norm(name="bn2", scale_init=nn.initializers.zeros)(y)  # zero-init: each block starts as identity
        if residual.shape != y.shape:  # stage boundary: project the shortcut
            proj = nn.Conv(self.filters, (1, 1), (self.strides, self.strides), use_bias=False, name="proj")
            residual = proj(residual)
            residual = norm(name="proj_bn")(residual)
        return nn.relu(residual + y)


class Bottleneck(nn.Module):
    filters: int
    strides: int = 1
    axis_name: str | None = None

    @nn.compact
    def __call__(self, x, train: bool):
        norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5,
                       axis_name=self.axis_name)
        residual = x
        y = nn.Conv(self.filters, (1, 1), use_bias=False, name="conv1")(x)
        y = nn.relu(norm(name="bn1")(y))
        # v1.5: the stride sits on the 3x3 conv, not the first 1x1
        y = nn.Conv(self.filters, (3, 3), (self.strides, self.strides), use_bias=False, name="conv2")(y)
        y = nn.relu(norm(name="bn2")(y))
        y = nn.Conv(self.filters * 4, (1, 1), use_bias=False, name="conv3")(y)  # expand 4x
        y = norm(name="bn3", scale_init=nn.initializers.zeros)(y)
        if residual.shape != y.shape:
            proj = nn.Conv(self.filters * 4, (1, 1), (self.strides, self.strides), use_bias=False, name="proj")
            residual = proj(residual)
            residual = norm(name="proj_bn")(residual)
        return nn.relu(residual + y)


class ResNet(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x, train: bool = True):  # x: (B, H, W, 3)
        cfg = self.config
        block_cls = {"basic": BasicBlock, "bottleneck": Bottleneck}[cfg.block]
        if cfg.remat != "none":
            # argnum 2 is `train` (self counts as 0): a Python bool, so static
            block_cls = nn.remat(block_cls, policy=jaxmem.remat_policy(cfg.remat), static_argnums=(2,))
        x = nn.Conv(cfg.width, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], use_bias=False, name="stem_conv")(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, axis_name=cfg.axis_name,
                         name="stem_bn")(x)
        x = nn.relu(x)
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")  # (B, H/4, W/4, width)
        for stage, n_blocks in enumerate(cfg.stage_sizes):
            for b in range(n_blocks):
                strides = 2 if stage > 0 and b == 0 else 1
                x = block_cls(cfg.width * 2**stage, strides, cfg.axis_name, name=f"stage{stage + 1}_block{b}")(x, train)
        x = jnp.mean(x, axis=(1, 2))  # global average pool: (B, C)
        return nn.Dense(cfg.n_classes, name="head")(x)  # (B, n_classes)


def loss_fn(model, batch):
    logits = model(batch["image"], train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["label"]).mean()


def workload(
    preset: str = "resnet50",
    batch_size: int | None = None,
    image_size: int | None = None,
    remat: str = "none",
    **overrides,
) -> jaxmem.Workload:
    """The ResNet of ``preset`` (keys of PRESETS); ``overrides`` replace Config fields.

    ``remat`` (a jaxmem.REMAT_POLICIES name) checkpoints every residual block.
    """
    cfg = _config(preset, dict(overrides, remat=remat))
    B = batch_size or cfg.batch_size
    S = image_size or cfg.image_size
    batch = {
        "image": jax.ShapeDtypeStruct((B, S, S, 3), jnp.float32),  # NHWC
        "label": jax.ShapeDtypeStruct((B,), jnp.int32),
    }
    name = preset if preset.startswith("resnet") else f"resnet-{preset}"
    return jaxmem.Workload(model=ResNet(cfg), batch=batch, loss=loss_fn, optimizer=optax.adamw(1e-3), name=name)


def _config(preset: str, overrides: dict) -> Config:
    cfg = jaxmem.choose_preset("resnet", PRESETS, preset, overrides)
    if cfg.block not in ("basic", "bottleneck"):
        raise UserError(f"resnet: block={cfg.block!r}; choose 'basic' or 'bottleneck'")
    return cfg
