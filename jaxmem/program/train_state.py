"""Analytic model of the train state: bytes per leaf under its sharding.

Every entry parameter of the step is a leaf we know the global shape, dtype and
sharding of, so its per-device bytes are exact arithmetic; the sum must equal
XLA's ``argument_size_in_bytes`` (asserted in tests). Gradients are not
arguments: they are temporaries with the params' shapes, shardings and storage
dtype (fp32 master weights under ``bf16``; bf16 under ``bf16-pure``).

Also here: the *classic* rule users apply today (bytes per parameter), kept to
compare against in the accuracy benchmark.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from jaxmem.program import fp8
from jaxmem.program.finetune import QUANT_SCALE
from jaxmem.program.options import offloads_activations
from jaxmem.program.sharding import LeafInfo
from jaxmem.report import ReportWarning


@dataclasses.dataclass(frozen=True)
class StateBytes:
    """Per-device bytes of each part of the step's inputs (+ gradients), on the device;
    what lives in pinned host memory (--offload) is in `host`, not in the device parts."""

    params: int
    optimizer_state: int
    other_state: int
    batch: int
    gradients: int
    param_count: int          # global number of parameters
    global_params: int        # global bytes, unsharded
    global_optimizer_state: int
    trainable_count: int | None = None     # global; None when unknown (a custom step's state)
    frozen_count: int | None = None
    trainable_params: int | None = None    # per-device bytes of the trainable / frozen parameters
    frozen_params: int | None = None
    host: dict[str, int] = dataclasses.field(default_factory=dict)   # category -> per-device host bytes
    fp8_state: int = 0        # the part of other_state that is FP8 scaling state (--precision fp8)

    @property
    def arguments(self) -> int:
        return self.params + self.optimizer_state + self.other_state + self.batch

    @property
    def host_arguments(self) -> int:
        return sum(self.host.values())


def summarize(leaves: Iterable[LeafInfo], *, custom_step: bool = False) -> StateBytes:
    """`custom_step`: the state is the user's own (Workload.step): its floating-point parameters are
    the ones its step trains (jaxmem cannot see a freeze inside it), its integer ones frozen."""
    dev = {"params": 0, "optimizer_state": 0, "other_state": 0, "batch": 0}
    glob = {"params": 0, "optimizer_state": 0}
    host: dict[str, int] = {}
    count = 0
    grads = 0
    known = True
    split = {True: [0, 0], False: [0, 0]}   # trainable? -> [count, device bytes]
    fp8_state = 0
    for leaf in leaves:
        if leaf.memory_kind == "device":
            dev[leaf.category] += leaf.device_bytes
            if leaf.category == "other_state" and fp8.is_meta(leaf.path):
                fp8_state += leaf.device_bytes
        else:
            host[leaf.category] = host.get(leaf.category, 0) + leaf.device_bytes
        if leaf.category in glob:
            glob[leaf.category] += leaf.global_bytes
        if leaf.category == "params":
            # a quantized weight's scales are storage of that weight, not parameters of the model
            n = 0 if QUANT_SCALE.search(leaf.path) else leaf.size
            count += n
            if leaf.trainable is None and not custom_step:
                known = False
            trains = leaf.trainable is not False and "float" in leaf.dtype  # integer and frozen leaves get no gradient
            split[trains][0] += n
            split[trains][1] += leaf.device_bytes
            if trains:
                grads += leaf.device_bytes
    return StateBytes(dev["params"], dev["optimizer_state"], dev["other_state"], dev["batch"], grads, count,
                      glob["params"], glob["optimizer_state"],
                      split[True][0] if known else None, split[False][0] if known else None,
                      split[True][1] if known else None, split[False][1] if known else None, host, fp8_state)


# Optimizer slots per parameter in the classic rule (Adam: m and v; Lion and
# momentum: one; Adafactor: factored second moments, ~0 per parameter).
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2, "lion": 1, "adafactor": 0}


def classic_bytes_per_param(optimizer: str, precision: str) -> int:
    """The rule of thumb: weights + grads + optimizer slots (+ fp32 master copy).

    fp32 Adam: 4 + 4 + 8 = 16 B/param; mixed precision Adam (bf16 weights and
    grads, fp32 master + m + v): 2 + 2 + 4 + 8 = 16 B/param; pure bf16 Adam: 8.
    """
    slots = OPTIMIZER_SLOTS.get(optimizer, 2)
    if precision == "fp32":
        return 4 + 4 + 4 * slots
    if precision == "bf16":
        return 2 + 2 + 4 + 4 * slots
    return 2 + 2 + 2 * slots


# ---------------------------------------------------------------- pinned host memory (--offload, offloading remat)


def host_bytes(state: StateBytes, host_temp: int, remat: str) -> dict[str, int]:
    """Per-device pinned-host bytes when something is offloaded ({} otherwise): the offloaded state's
    categories, plus XLA's host temporaries, which under an offloading --remat policy are the
    offloaded activations (the only host buffers the step makes)."""
    if not state.host and not host_temp:
        return {}
    return {**state.host, ("activations" if offloads_activations(remat) else "temporaries"): host_temp}


def check_remat_offload(remat: str, host_temp: int) -> list[ReportWarning]:
    """remat_offloaded_nothing: an offloading --remat policy under which XLA made no host buffer."""
    if not offloads_activations(remat) or host_temp:
        return []
    return [ReportWarning(
        "remat_offloaded_nothing", f"--remat {remat} moved no activation to host memory: the model saves none "
        "that the policy offloads (offload:NAME needs activations named with checkpoint_name inside layers "
        "wrapped in nn.remat/jax.checkpoint with jaxmem.remat_policy(remat); offload_dots needs dots without "
        "batch dimensions there)")]


def check_offload_placed(state: StateBytes, host_argument: int) -> list[ReportWarning]:
    """offload_not_placed: XLA's host_argument must be the offloaded state's bytes; if XLA kept some of
    it on the device, say so (the device numbers already count it: it is in XLA's device arguments)."""
    if not state.host or host_argument == state.host_arguments:
        return []
    return [ReportWarning(
        "offload_not_placed", f"--offload: XLA placed {host_argument:,} bytes of arguments in host memory, "
        f"not the {state.host_arguments:,} offloaded; the device numbers count what stayed on the device",
        max(state.host_arguments - host_argument, 0))]
