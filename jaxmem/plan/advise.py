"""`jaxmem advise`: when a step does not fit, the changes that make it fit, fastest first.

The changes users actually make, each a field of the analysis options
(``dataclasses.replace(options, ...)``), on axes ordered from cheapest to dearest -- the free fixes
first, more devices last:

* fraction: a larger share of the card for JAX's pool (0.9, 0.95; JAX preallocates 75% by default),
  set with XLA_PYTHON_CLIENT_MEM_FRACTION (the row names the variable): the same program, a larger
  budget. Offered when --mem-fraction was not given (a share the user states is theirs to keep);
* attention: cuDNN flash attention (``--arg attention=cudnn``, with the bf16 compute it needs) and
* loss: a vocabulary-tiled cross-entropy (``--arg vocab_tiles=8``), each where the model's
  ``workload()`` takes that argument (named in its signature, or ``**kwargs``: then the probe
  decides, and a model that refuses it is "not applicable");
* base: with LoRA, the frozen base stored smaller, bf16 -> int8 -> nf4 (QLoRA);
* moments: the optimizer's moments in bf16 (--moment-dtype), for jaxmem's own optimizers;
* layout: more state sharding, dp -> fsdp -> fsdp_tp (a model axis of 2 split off the data axis);
* precision: bf16 compute (fp32 params and optimizer state kept); fp8 matmuls on cards with FP8
  tensor cores (targets.Performance.fp8_flops), never with LoRA (both put qwix under the matmuls);
* remat: from the least recompute to the most: dots_saveable, dots_with_no_batch_dims_saveable, full;
  and offload_dots (those dots saved in pinned host memory) when activations are most of the peak
  and the host has RAM left (targets.Performance.host_memory);
* microbatch: gradient accumulation over 2, 4, ... microbatches, keeping the global batch;
* devices: twice the data-parallel devices, keeping the global batch;
* offload: the optimizer state in pinned host memory (same training, PCIe traffic);
* lora: fine-tune adapters instead of every weight -- LoRA of rank 16 on the default targets, and
  QLoRA (the same on an nf4-quantized base). These change what is trained: their label says so.
  (Freezing needs to know which parameters: it is left to --freeze.)
* hsdp: FSDP within a host, replicas across hosts (same GPUs), when FSDP's all-gathers and
  reduce-scatters over the network take longer than the step's compute or memory time;
* context: a context axis of 2 or 4 taken from the replicas (or fsdp), when activations are most
  of the peak at a long sequence (>= LONG_SEQUENCE tokens);
* expert: an expert axis of 2, 4 or 8 likewise, when the model's parameters have an experts
  dimension (exp, expert, experts) and the mesh no expert axis;
* pipeline: a stage axis of 2 or 4 (the model's layer scan split into stages, GPipe with the
  smallest microbatch count that keeps every stage busy), when the state (params, optimizer state,
  gradients) is most of the peak: from the replicas on the same GPUs, or on 2x / 4x the GPUs with the
  same batch, which FSDP alone cannot use once each device holds one sample.

No suggestion without its compiled number. The search compiles in two rounds:

1. *probes*: every single change at each of its values (gradient accumulation only at its
   largest: one sample per device), in parallel. Each probe is a candidate itself, and it
   measures how its change scales the state (params, optimizer state, gradients, ...) and the
   activations/temporaries of the original, and its estimated step time.
2. *combinations*: every combination of changes is predicted from those ratios (state and
   activations each as the original's times the ratios of the changes combined; microbatch
   sizes between the probes interpolated linearly); the ones predicted to fit, fastest
   predicted first, are compiled -- and only their compiled numbers are reported.

Candidates that fit are ranked: plans on the GPUs as given before plans that need more, each by its
throughput per device from the compiled, estimated step time (tokens/s, or samples/s for a batch
without a sequence; the global batch is the same in every plan), fewer changes first among equals;
rows whose step-time bands overlap are tied and share a rank. A candidate that cannot apply to this
model (it refuses the option: a user error) is "not applicable", with the reason.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxmem import display, hf, pipeline
from jaxmem.compiler import targets
from jaxmem.compiler.steptime import band, tied_with
from jaxmem.errors import UserError
from jaxmem.plan import meshes, sweep
from jaxmem.program import layouts, rules
from jaxmem.program.options import OPTIMIZER_NAMES, AnalyzeOptions, command_line, offloads_activations
from jaxmem.report import verdict_of

LAYOUT_LADDER = ("dp", "fsdp", "fsdp_tp")
# recompute, least to most; aliases share a rank (checkpoint_dots is dots_saveable)
REMAT_RANK = {"none": 0, "everything_saveable": 0, "dots_saveable": 1, "checkpoint_dots": 1,
              "dots_with_no_batch_dims_saveable": 2, "checkpoint_dots_with_no_batch_dims": 2,
              "full": 3, "nothing_saveable": 3, "offload_dots": 2}
REMAT_LADDER = ("dots_saveable", "dots_with_no_batch_dims_saveable", "full")
LORA_RANK = 16
LONG_SEQUENCE = 1024   # tokens: where context parallelism starts to be what MaxText recipes use
MESH_CHANGES = ("hsdp", "context", "expert", "pipeline")   # each a mesh (the value: its text)
FRACTIONS = (0.9, 0.95)     # JAX's share of the card: what trainers set (0.75 is JAX's default)
BASE_LADDER = ("bf16", "int8", "nf4")   # LoRA's frozen base, from the largest to the smallest
VOCAB_TILES = 8             # the chunked loss's tiles (MaxText's num_vocab_tiling)
# the free fixes first (the same program with a larger budget; bf16 compute; the fused kernels), more devices last
CHANGES = ("fraction", "precision", "attention", "loss", "remat", "accum", "layout", "base", "moments", "offload",
           "lora", *MESH_CHANGES, "devices")
MODEL_ARGS = {"attention": "attention", "loss": "vocab_tiles"}   # the changes made by a workload() argument
SCHEMA = "jaxmem.advise/1"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One compiled configuration: the original, or the original with `changes`."""

    changes: tuple[tuple[str, Any], ...]     # (axis, value): layout, precision, remat, accum, devices
    options: AnalyzeOptions
    report: Any = None                       # Report | None
    error: str | None = None
    status: str = "ok"                       # ok | not_applicable (the model refuses it) | failed
    round: int = 0                           # 0: the original, 1: a probe, 2: a predicted combination
    predicted_peak_bytes: int | None = None  # round 2: what the probes predicted
    bf16_implied: bool = False               # a change that needs bf16 compute brought it (cuDNN, a bf16 base)

    @property
    def label(self) -> str:
        if not self.changes:
            return "as given"
        # a mesh is named as the command compiles it (a context change combined with more devices runs
        # the devices' mesh, not the context probe's)
        mesh = getattr(self.options, "mesh", None)
        roles = getattr(self.options, "axis_roles", None)
        text = ", ".join(_describe(k, mesh if mesh and k in (*MESH_CHANGES, "devices") else v, roles)
                         for k, v in self.changes)
        return text + (", with the bf16 compute it needs" if self.bf16_implied else "")

    @property
    def fits(self) -> bool:
        return bool(self.report is not None and self.report.fits)

    @property
    def peak(self) -> int | None:
        return None if self.report is None else self.report.per_device_peak_bytes

    @property
    def headroom(self) -> int | None:
        return None if self.report is None else self.report.headroom_bytes

    @property
    def step_s(self) -> float | None:
        st = (self.report.step_time or {}) if self.report is not None else {}
        return st.get("estimate_s") if st.get("available") else None

    @property
    def gpu_seconds(self) -> float | None:
        """GPU-seconds per step: the estimated step time times the GPUs it runs on."""
        return None if self.step_s is None else self.step_s * getattr(self.report.target, "devices", 0)

    @property
    def throughput(self) -> tuple[float, str] | None:
        """(per-device throughput, its unit) at the estimated step time: tokens/s for a batch with a
        sequence, samples/s without one; None without an estimate or a global batch."""
        return _per_device(self.report, self.step_s)

    def throughput_band(self) -> tuple[float, float, float] | None:
        """(estimate, low, high) of the throughput, from the step time's band (slow end: low)."""
        b = band(self.report.step_time if self.report is not None else None)
        if b is None or (t := _per_device(self.report, 1.0)) is None:
            return None
        return t[0] / b[0], t[0] / b[2], t[0] / b[1]

    @property
    def environment(self) -> dict[str, str]:
        """What the training's environment must set for this plan (the memory fraction)."""
        f = dict(self.changes).get("fraction")
        return {} if f is None else {fraction_variable(): str(f)}

    def command(self, path: str) -> str:
        return command_line(path, self.options)


def _per_device(report, step_s: float | None) -> tuple[float, str] | None:
    if report is None or not step_s:
        return None
    batch, devices = _global_batch(report), getattr(report.target, "devices", 0)
    if not batch or not devices:
        return None
    seq = getattr(report, "sequence_length", None)
    return (batch * seq / step_s / devices, "tokens/s") if seq else (batch / step_s / devices, "samples/s")


def fraction_variable() -> str:
    """The variable that sets JAX's memory fraction: XLA_PYTHON_CLIENT_MEM_FRACTION, which every jax reads
    (jaxlib 0.10 as the fallback of XLA_CLIENT_MEM_FRACTION), unless the new name is already set (jax
    refuses both)."""
    return "XLA_CLIENT_MEM_FRACTION" if os.environ.get("XLA_CLIENT_MEM_FRACTION") else \
        "XLA_PYTHON_CLIENT_MEM_FRACTION"


def _describe(axis: str, value, roles: str | None = None) -> str:
    if axis == "fraction":
        return f"memory fraction {value} ({fraction_variable()}={value})"
    if axis == "attention":
        return f"cuDNN flash attention (--arg attention={value})"
    if axis == "loss":
        return f"chunked cross-entropy (--arg vocab_tiles={value})"
    if axis == "base":
        return f"LoRA base stored in {value}" + (" (QLoRA)" if value in ("int8", "nf4") else "")
    if axis == "moments":
        return f"optimizer moments in {value} (--moment-dtype {value})"
    if axis == "accum":
        return f"accumulate {value} microbatches"
    if axis == "devices":
        return f"{layouts.mesh_size(value)} devices (mesh {value})"
    if axis == "layout":
        lo, mesh = value
        return f"layout {lo}" + (f" (mesh {mesh})" if "model" in mesh and lo == "fsdp_tp" else "")
    if axis in MESH_CHANGES:
        spec = layouts.parse_mesh(value, meshes.roles_for(roles, value))
        if axis == "hsdp":
            return f"HSDP: fsdp within a host, data across hosts (mesh {value})"
        if axis == "pipeline":
            return f"pipeline parallelism over {spec.axis_size(spec.axis_of('stage'))} stages (mesh {value})"
        return f"{axis} parallelism over {spec.axis_size(spec.axis_of(axis))} (mesh {value})"
    if axis == "offload":
        return "optimizer state offloaded to host memory"
    if axis == "remat" and value == "offload_dots":
        return "remat offload_dots (the saved dots in pinned host memory)"
    if axis == "lora":
        rank, base = value
        return (f"QLoRA rank {rank} on a {base} base (trains adapters only)" if base
                else f"LoRA rank {rank} (trains adapters only)")
    return f"{axis} {value}"


def _display(axis: str, value):
    """A change as JSON shows it: the layout by name (with its mesh when it adds a model axis)."""
    if axis == "layout":
        lo, mesh = value
        return {"layout": lo, "mesh": mesh}
    if axis == "devices":
        return {"mesh": value, "devices": layouts.mesh_size(value)}
    if axis in MESH_CHANGES:
        return {"mesh": value}
    if axis == "lora":
        return {"lora_rank": value[0], "base_dtype": value[1]}
    if axis == "fraction":
        return {"mem_fraction": value, "environment": {fraction_variable(): str(value)}}
    if axis in ("attention", "loss"):
        return {"arg": f"{MODEL_ARGS[axis]}={value}"}
    return value


@dataclasses.dataclass(frozen=True)
class Advice:
    path: str
    original: Candidate
    candidates: tuple[Candidate, ...]   # every compiled change: fitting ones ranked first
    compiles: int
    cached: int
    seconds: float
    searched: bool                      # False: the original fits and --all was not given

    @property
    def fitting(self) -> list[Candidate]:
        return [c for c in self.candidates if c.fits]

    @property
    def compiled(self) -> list[Candidate]:
        """The changes that compiled (a verdict comes only from these)."""
        return [c for c in self.candidates if c.report is not None]

    @property
    def fits(self) -> bool:
        """The verdict: a change fits, or the step fits as given (exit 0 then, --all or not)."""
        return bool(self.fitting) or bool(self.original.fits)

    @property
    def closest(self) -> Candidate | None:
        """The compiled candidate with the smallest peak above what is usable (when none fits)."""
        done = [(c.headroom, c) for c in self.candidates if c.headroom is not None]
        return max(done, key=lambda hc: hc[0])[1] if done else None

    def relative(self, c: Candidate) -> float | None:
        base, mine = self.original.step_s, c.step_s
        return None if not base or mine is None else mine / base

    def _repr_html_(self) -> str | None:
        return display.html("advice", self)

    def ranks(self) -> dict[int, int]:
        """id(candidate) -> its rank among the plans that fit (1-based, in the order of `fitting`); rows whose
        throughput bands overlap (their step-time bands, scaled) share the rank of the first of them."""
        fitting = self.fitting
        ties = tied_with([c.throughput_band() for c in fitting])
        out: dict[int, int] = {}
        for i, c in enumerate(fitting):
            above = ties[i]
            out[id(c)] = i + 1 if above is None else out[id(fitting[above])]
        return out

    def to_json(self) -> dict[str, Any]:
        ranks = self.ranks()

        def row(c: Candidate) -> dict[str, Any]:
            tp = c.throughput
            return {"changes": {a: _display(a, v) for a, v in c.changes}, "label": c.label,
                    "rank": ranks.get(id(c)), "environment": c.environment,
                    "tokens_per_s": tp[0] if tp and tp[1] == "tokens/s" else None,
                    "samples_per_s": tp[0] if tp and tp[1] == "samples/s" else None,
                    "command": c.command(self.path), "status": c.status, "error": c.error,
                    "fits": c.fits if c.report is not None else None,
                    "per_device_peak_bytes": c.peak, "headroom_bytes": c.headroom,
                    "step_time_estimate_s": c.step_s, "relative_step_time": self.relative(c),
                    "devices": getattr(c.report.target, "devices", None) if c.report is not None else None,
                    "gpu_seconds_per_step": c.gpu_seconds,
                    "step_time": c.report.step_time if c.report is not None else None,
                    "round": c.round, "predicted_peak_bytes": c.predicted_peak_bytes,
                    "verdict": verdict_of(c.report) if c.report is not None else None}

        closest = None if self.fitting or not self.searched else self.closest
        return {"schema": SCHEMA, "model_file": self.path, "original": row(self.original),
                "fits_as_given": self.original.fits, "searched": self.searched,
                "changes_compiled": len(self.compiled),
                "candidates": [row(c) for c in self.candidates],
                "fitting": len(self.fitting), "closest": row(closest) if closest is not None else None,
                "compiles": self.compiles, "cached": self.cached, "seconds": round(self.seconds, 1),
                "step_time_rule": "estimates: the per-kernel model at measured rates, with a band (low_s-high_s); "
                                  "rows whose bands overlap are tied (see each candidate's step_time.rule)",
                "rank_rule": "plans that fit, on the GPUs as given first, by throughput per device (tokens_per_s, "
                             "or samples_per_s without a sequence) at the estimated step time; rows whose bands "
                             "overlap share a rank (a tie)"}


# ----------------------------------------------------------------------------------------------
# The axes of change, from the original options.
# ----------------------------------------------------------------------------------------------

def _global_batch(report) -> int | None:
    b = report.options.get("batch") if report is not None else None
    return int(b) if isinstance(b, int) else None


def axes(base: AnalyzeOptions, global_batch: int | None, report=None,
         takes: Callable[[str], bool] | None = None) -> dict[str, list]:
    """axis -> the values to try, cheapest first (an empty list: nothing to try on that axis); the axes
    in the order of CHANGES: the free fixes first, more devices last. `report` (the original's) decides
    the mesh changes that answer what dominates it, and whether the optimizer is jaxmem's; `takes(name)`:
    whether the model's workload() may take that argument (None: no model arguments are tried)."""
    spec = layouts.parse_mesh(base.mesh, base.axis_roles)
    out: dict[str, list] = {}
    out["fraction"] = _fractions(base)
    args = dict(base.model_args)
    out["attention"] = ["cudnn"] if takes is not None and takes("attention") and args.get("attention") != "cudnn" \
        else []
    out["loss"] = [VOCAB_TILES] if takes is not None and takes("vocab_tiles") and not args.get("vocab_tiles") else []
    # layout: more state sharding than the original
    ladder = list(LAYOUT_LADDER)
    start = ladder.index(base.layout) + 1 if base.layout in ladder else (2 if base.layout == "tp" else 3)
    lay = []
    for lo in ladder[start:]:
        if lo == "fsdp_tp" and (spec.model_axis is None or spec.axis_size(spec.model_axis) == 1):
            split = meshes.split_model_axis(base.mesh, base.axis_roles)
            if split is None:
                continue
            lay.append(("fsdp_tp", split))
        elif not (lo == "dp" and spec.with_role("fsdp")):
            lay.append((lo, base.mesh))
    out["layout"] = lay
    out["precision"] = (["bf16"] if base.precision == "fp32" else []) + (["fp8"] if _fp8_room(base, report) else [])
    rank = REMAT_RANK.get(base.remat, 0)
    out["remat"] = [r for r in REMAT_LADDER if REMAT_RANK[r] > rank]
    if _offload_room(base, report):   # the same recompute as dots_with_no_batch_dims, the saved dots on the host
        out["remat"].insert(out["remat"].index("full") if "full" in out["remat"] else 0, "offload_dots")
    # microbatches: the global batch kept; each microbatch still split over every data device
    acc = []
    if global_batch:
        k = base.accum * 2
        while global_batch % (spec.data_size * k) == 0:
            acc.append(k)
            k *= 2
    out["accum"] = acc
    # devices: twice the data-parallel devices, the global batch kept
    dev = []
    if global_batch and global_batch % (spec.data_size * 2 * base.accum) == 0 and spec.batch_axes:
        dev.append(meshes.scale_data(base.mesh, 2, base.axis_roles))
    out["devices"] = dev
    # fine-tuning: only for a full fine-tune as given
    out["offload"] = ["optimizer"] if base.offload is None else []
    plain = not base.lora_rank and base.freeze is None
    out["lora"] = [(LORA_RANK, None), (LORA_RANK, "nf4")] if plain else []
    # with LoRA: the frozen base smaller than it is (int4 counts as nf4's size: nothing below it)
    now = BASE_LADDER.index(base.base_dtype) if base.base_dtype in BASE_LADDER else \
        (len(BASE_LADDER) if base.base_dtype else -1)
    out["base"] = list(BASE_LADDER[now + 1:]) if base.lora_rank else []
    out["moments"] = ["bf16"] if base.moment_dtype is None and _builds_optimizer(base, report) else []
    out.update(mesh_changes(base, report))
    out["devices"] = out.pop("devices")   # more devices last
    return {k: out[k] for k in CHANGES}


def _fractions(base: AnalyzeOptions) -> list[float]:
    """The memory fractions above the one in force, when the user did not state one (--mem-fraction), the
    pool is JAX's fraction of a catalogue card (not an attached GPU's bytes_limit, not the platform
    allocator) and the environment's fraction reads (a bad one is the analysis's error to report)."""
    if base.mem_fraction is not None or (base.gpu or "").startswith("local") or \
            os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").lower() == "platform":
        return []
    try:
        now = targets.usable_fraction()[0]
    except UserError:
        return []
    return [f for f in FRACTIONS if f > now]


def _builds_optimizer(base: AnalyzeOptions, report) -> bool:
    """The step's optimizer is one jaxmem builds with moments (--moment-dtype applies to it)."""
    name = base.optimizer or (getattr(report, "options", None) or {}).get("optimizer")
    return name in OPTIMIZER_NAMES and name != "sgd"


def _fp8_room(base: AnalyzeOptions, report) -> bool:
    """FP8 is a candidate where the card has FP8 tensor cores and the step computes in fp32/bf16."""

    perf = targets.performance(getattr(getattr(report, "target", None), "gpu", "") or base.gpu or "")
    return (perf is not None and perf.fp8_flops is not None and base.precision in ("fp32", "bf16")
            and not base.lora_rank)


def _offload_room(base: AnalyzeOptions, report) -> bool:
    """Activation offload is worth a probe: activations are most of the peak, the remat policy keeps
    its activations on the device, and the target's host has RAM left beside what is offloaded."""

    if report is None or offloads_activations(base.remat) or REMAT_RANK.get(base.remat, 0) >= 3:
        return False
    perf = targets.performance(getattr(report.target, "gpu", "") or "")
    acts = report.breakdown.get("activations_and_temporaries", 0)
    on_host = sum((getattr(report, "host", None) or {}).values())   # saved reports before `host` have none
    return (perf is not None and perf.host_memory is not None and perf.host_bandwidth > 0
            and 2 * acts >= report.per_device_peak_bytes and on_host < perf.host_memory)


def mesh_changes(base: AnalyzeOptions, report) -> dict[str, list[str]]:
    """HSDP, context and expert parallelism on the same GPUs, each where the original's report says
    it answers what dominates: FSDP's collectives over the network, activations at a long sequence,
    a model with experts."""
    out: dict[str, list[str]] = {"hsdp": [], "context": [], "expert": [], "pipeline": []}
    if report is None:
        return out
    st = report.step_time or {}
    if st.get("available") and base.layout in ("fsdp", "fsdp_tp"):
        net = sum(r["time_s"] for r in st.get("collectives", ())
                  if r["kind"] in ("all-gather", "reduce-scatter") and r["link"] == "network")
        if net > max(st.get("compute_s", 0.0), st.get("memory_s", 0.0)):
            hosts = getattr(report.target, "hosts", 1)
            out["hsdp"] = [m for m in [meshes.hsdp(base.mesh, hosts, base.axis_roles)] if m]
    seq = getattr(report, "sequence_length", None)   # reports saved before these fields have neither
    acts = report.breakdown.get("activations_and_temporaries", 0)
    if seq and seq >= LONG_SEQUENCE and 2 * acts >= report.per_device_peak_bytes:
        out["context"] = [m for k in (2, 4) if seq % k == 0
                          for m in [meshes.carve(base.mesh, "context", k, base.axis_roles)] if m]
    if set(getattr(report, "logical_names", ())) & {"exp", "expert", "experts"}:
        out["expert"] = [m for k in (2, 4, 8) for m in [meshes.carve(base.mesh, "expert", k, base.axis_roles)] if m]
    b = report.breakdown
    xla_peak = report.per_device_peak_bytes - b.get("runtime_overhead", 0)
    if 2 * (b.get("params", 0) + b.get("optimizer_state", 0) + b.get("gradients", 0)) >= xla_peak:
        out["pipeline"] = [m for k in (2, 4) for m in meshes.pipelined(base.mesh, k, base.axis_roles)]
    return out


def _apply(base: AnalyzeOptions, changes: tuple[tuple[str, Any], ...],
           remat_block: str | None = None) -> AnalyzeOptions | None:
    """The options with `changes`; None when two changes contradict (two different meshes).
    `remat_block`: where a remat change checkpoints on a model without a remat hook (--remat-at)."""
    kw: dict[str, Any] = {}
    new_meshes = []
    for axis, value in changes:
        if axis == "layout":
            kw["layout"], mesh_l = value
            if mesh_l != base.mesh:
                new_meshes.append(mesh_l)
        elif axis in MESH_CHANGES:
            new_meshes.append(value)
        elif axis == "devices":
            kw["_devices"] = value
        elif axis == "lora":
            kw["lora_rank"], kw["base_dtype"] = value
            if dict(changes).get("precision") == "fp8":
                return None   # refused: LoRA and FP8 both put qwix under the matmuls
        elif axis in MODEL_ARGS:
            args = dict(kw.get("model_args", base.model_args))
            args[MODEL_ARGS[axis]] = value
            kw["model_args"] = tuple(args.items())
        elif axis == "fraction":
            kw["mem_fraction"] = value
        elif axis == "base":
            kw["base_dtype"] = value
        elif axis == "moments":
            kw["moment_dtype"] = value
        else:
            kw[axis] = value
            if axis == "remat" and remat_block is not None and base.remat_at is None:
                kw["remat_at"] = remat_block
    if len(new_meshes) > 1:
        return None
    mesh = new_meshes[0] if new_meshes else base.mesh
    if "_devices" in kw:
        factor = layouts.mesh_size(kw.pop("_devices")) // layouts.mesh_size(base.mesh)
        mesh = meshes.scale_data(mesh, factor, meshes.roles_for(base.axis_roles, mesh))
        if mesh is None:
            return None
    hosts = base.hosts
    if hosts is not None and mesh != base.mesh:
        n_old, n_new = layouts.mesh_size(base.mesh), layouts.mesh_size(mesh)
        hosts = max(1, hosts * n_new // n_old)
    if _needs_bf16(changes) and kw.get("precision", base.precision) == "fp32":
        kw["precision"] = "bf16"   # cuDNN attention has no fp32 kernel; a bf16 base needs bf16 compute
    return dataclasses.replace(base, mesh=mesh, hosts=hosts, explain=False,
                               axis_roles=meshes.roles_for(base.axis_roles, mesh), **kw)


def _needs_bf16(changes) -> bool:
    d = dict(changes)
    return d.get("attention") == "cudnn" or d.get("base") == "bf16"


# ----------------------------------------------------------------------------------------------
# Prediction of combinations from the probes.
# ----------------------------------------------------------------------------------------------

def _split(report) -> tuple[float, float]:
    """(state, activations) of a report: activations_and_temporaries vs everything else."""
    acts = float(report.breakdown["activations_and_temporaries"])
    return float(report.per_device_peak_bytes) - acts, acts


@dataclasses.dataclass
class _Model:
    base_state: float
    base_acts: float
    base_time: float
    ratios: dict[tuple[str, Any], tuple[float, float, float]]   # (axis, value) -> (state, acts, time) ratios
    accum_line: tuple[float, float, float, float] | None = None  # (a_base, a_max, acts ratio, time ratio) at a_max

    def predict(self, changes) -> tuple[float, float]:
        state, acts, t = self.base_state, self.base_acts, self.base_time
        for axis, value in changes:
            if axis == "accum" and self.accum_line is not None:
                a0, a1, r_acts, r_time = self.accum_line
                r_state = self.ratios[("accum", a1)][0]
                # activations linear in the microbatch size (1/accum); time linear in accum
                m0, m1, m = 1 / a0, 1 / a1, 1 / value
                frac = (m0 - m) / (m0 - m1) if m0 != m1 else 1.0
                state *= 1 + (r_state - 1) * min(frac, 1.0)
                acts *= 1 + (r_acts - 1) * frac
                t *= 1 + (r_time - 1) * (value - a0) / (a1 - a0) if a1 != a0 else r_time
                continue
            r = self.ratios.get((axis, value))
            if r is None:
                return math.inf, math.inf
            state, acts, t = state * r[0], acts * r[1], t * r[2]
        return state + acts, t


def _model(original: Candidate, probes: list[Candidate], accum_values: list[int]) -> _Model | None:
    if original.report is None or original.step_s is None:
        return None
    s0, a0 = _split(original.report)
    ratios = {}
    for p in probes:
        if p.report is None or p.step_s is None or len(p.changes) != 1:
            continue
        s, a = _split(p.report)
        ratios[p.changes[0]] = (s / s0 if s0 else 1.0, a / a0 if a0 else 1.0, p.step_s / original.step_s)
    m = _Model(s0, a0, original.step_s, ratios)
    if accum_values and ("accum", accum_values[-1]) in ratios:
        r = ratios[("accum", accum_values[-1])]
        m.accum_line = (original.options.accum, accum_values[-1], r[1], r[2])
    return m


# ----------------------------------------------------------------------------------------------
# The search.
# ----------------------------------------------------------------------------------------------

Runner = Callable[[list[tuple[str, AnalyzeOptions]]], list[tuple[Any, str | None, str, bool]]]


def run_analyses(path: str, jobs: list[tuple[str, AnalyzeOptions]], n_jobs: int | None = None,
                 progress: bool = True) -> list[tuple[Any, str | None, str, bool]]:
    """(report, error, status, from cache) per job: in worker processes (jaxmem.plan.sweep), or in
    this process when one job at a time is asked (no worker start-up)."""

    sweep_jobs = [sweep.Job(key, path, opts) for key, opts in jobs]
    if n_jobs == 1:
        outs = [sweep.run_one(j) for j in sweep_jobs]
    else:
        outs = sweep.run_jobs(sweep_jobs, n_jobs=n_jobs, progress=progress)
    return [(o.report, o.error, o.status, bool(o.report is not None and o.report.timings.get("cache_hit")))
            for o in outs]


NEEDS_GPU = "advise needs a GPU target with fixed memory (jaxmem gpus), not --gpu cpu"


def advise(path: str, base: AnalyzeOptions, *, always: bool = False, n_jobs: int | None = None,
           combinations: int = 8, progress: bool = True, runner: Runner | None = None,
           original_report=None, changes: tuple[str, ...] = CHANGES, model=None) -> Advice:
    """Compile the changes that could make the step fit; rank the ones that do.

    `always`: search even when the original fits (`--all`). `changes`: the kinds of change to try
    (a subset of CHANGES). `model`: the Workload or function the API was given (`path` is then its
    label; `runner` compiles it), for what is traced outside the runner. `combinations`: how many predicted
    combinations to compile per round (two rounds at most, the second only when fewer than three
    candidates fit).
    """
    unknown = sorted(set(changes) - set(CHANGES))   # the user's typos, before any compile
    if unknown:
        raise UserError(f"--changes {','.join(unknown)}: unknown; choose from {','.join(CHANGES)}")
    if base.on_cpu:
        raise UserError(NEEDS_GPU)
    t0 = time.perf_counter()
    compiler = _Compiler(runner or (lambda jobs: run_analyses(path, jobs, n_jobs, progress)), base)
    base = dataclasses.replace(base, explain=False)
    if original_report is None:
        original = compiler.compile_all([((), base)], 0)[0]
    else:
        original = Candidate((), base, original_report, None, "ok", 0)
    if original.report is None:
        raise UserError(f"the original configuration does not compile: {original.error}")
    if original.report.fits is None:
        raise UserError(NEEDS_GPU)
    if original.fits and not always:
        return Advice(path, original, (), compiler.compiles, compiler.cached, time.perf_counter() - t0,
                      searched=False)

    ax = {k: v for k, v in axes(base, _global_batch(original.report), original.report,
                                takes=model_takes(path, model)).items() if k in changes}
    # a model without a remat hook is checkpointed at its repeated block (--remat-at)
    block = pipeline.remat_block(path if model is None else model, base) \
        if ax.get("remat") and base.remat_at is None else None
    # round 1: every single change (accumulation at its largest only: the line between is interpolated)
    singles = [(axis, v) for axis, values in ax.items() for v in (values[-1:] if axis == "accum" else values)]
    probe_items = [((single,), opts) for single in singles if (opts := _apply(base, (single,), block)) is not None]
    probes = _smallest_fraction(compiler.compile_all(probe_items, 1))
    predictor = _model(original, probes, ax.get("accum", []))
    extra = [] if predictor is None else _round_two(compiler, predictor, original, probes, ax, base, block,
                                                    combinations)
    ranked = _rank(probes + extra, _devices(original))
    return Advice(path, original, tuple(ranked), compiler.compiles, compiler.cached, time.perf_counter() - t0,
                  searched=True)


def _smallest_fraction(probes: list[Candidate]) -> list[Candidate]:
    """The memory-fraction probes compile the same program: of those that fit, the smallest fraction only."""
    fits = [p.changes[0][1] for p in probes if p.changes[0][0] == "fraction" and p.fits]
    return [p for p in probes if p.changes[0][0] != "fraction" or not fits or p.changes[0][1] == min(fits)]


class _Compiler:
    """The search's compiles through one runner, counted (and those the cache answered). A candidate the
    model or jaxmem refuses before compiling (a user error: an argument the model does not take, a
    combination analyze refuses) is not applicable to this step: its status says so, with the reason."""

    def __init__(self, run, base: AnalyzeOptions | None = None):
        self.run = run
        self.base = base
        self.compiles = self.cached = 0

    def compile_all(self, items: list[tuple[tuple, AnalyzeOptions]], round_: int, predicted=None) -> list[Candidate]:
        if not items:
            return []
        outs = self.run([(_key(ch), opts) for ch, opts in items])
        result = []
        for (ch, opts), (rep, err, status, hit) in zip(items, outs, strict=True):
            self.compiles += 1
            self.cached += hit
            if ch and status == "user_error":
                status, err = "not_applicable", f"not applicable: {err}"
            implied = bool(self.base is not None and _needs_bf16(ch) and "precision" not in dict(ch)
                           and self.base.precision == "fp32")
            result.append(Candidate(tuple(ch), opts, rep, err, status, round_,
                                    None if predicted is None else int(predicted.get(ch, 0)), implied))
        return result


def _round_two(compiler: _Compiler, predictor, original: Candidate, probes: list[Candidate], ax: dict,
               base: AnalyzeOptions, block, combinations: int) -> list[Candidate]:
    """Round 2: combinations predicted to fit, fastest first, `combinations` a batch (two while < 3 fit)."""
    usable = original.report.target.usable_bytes
    # a larger memory fraction compiles the same program with a larger budget: its probe's
    budgets = {p.changes[0][1]: p.report.target.usable_bytes for p in probes
               if p.report is not None and len(p.changes) == 1 and p.changes[0][0] == "fraction"}
    choices = [[None, *[(axis, v) for v in values]] for axis, values in ax.items() if values]
    scored = []
    for combo in itertools.product(*choices):
        ch = tuple(c for c in combo if c is not None)
        d = dict(ch)
        if len(ch) < 2 or not _divides(base, ch, _global_batch(original.report)):
            continue
        if d.get("precision") == "bf16" and _needs_bf16(ch):
            continue   # the same step as without the precision change (it brings bf16 compute itself)
        if "fraction" in d and d["fraction"] not in budgets:
            continue
        peak, t = predictor.predict(tuple(c for c in ch if c[0] != "fraction"))
        if peak <= budgets.get(d.get("fraction"), usable) * 1.05 and not _needless(ch, predictor, usable, budgets):
            scored.append((t, peak, ch))  # a small margin above: the compile decides
    scored.sort(key=lambda x: (x[0], x[1]))
    predicted = {ch: peak for _, peak, ch in scored}
    queue = _interleave([ch for _, _, ch in scored])
    # the predictions compose single changes' ratios and can be optimistic for many changes at once: while
    # nothing fits yet, every other compile is the plan predicted to leave the most room
    roomy = [ch for _, _, ch in sorted(scored, key=lambda x: (x[1] / budgets.get(dict(x[2]).get("fraction"), usable),
                                                               x[0]))]
    done = {_opts_key(c.options) for c in [original, *probes]}
    extra: list[Candidate] = []
    for _ in range(2):
        batch: list[tuple[tuple, AnalyzeOptions]] = []
        none_fit = not any(c.fits for c in probes + extra)
        while queue and len(batch) < combinations:
            ch = roomy.pop(0) if none_fit and roomy and len(batch) % 2 else queue.pop(0)
            if ch in queue:
                queue.remove(ch)
            opts = _apply(base, ch, block)
            if opts is None or _opts_key(opts) in done:
                continue
            done.add(_opts_key(opts))
            batch.append((ch, opts))
        extra += compiler.compile_all(batch, 2, predicted)
        if sum(c.fits for c in probes + extra) >= 3 or not queue:
            break
    return extra


def _needless(ch, predictor, usable: int, budgets: dict) -> bool:
    """A combination with a change it does not need: without that change it is predicted to fit, and no
    more than 1% slower (a larger memory fraction, an offload or a smaller state the plan can do without)."""
    def predicted(sub):
        d = dict(sub)
        if "fraction" in d and d["fraction"] not in budgets:
            return math.inf, math.inf, 0
        peak, t = predictor.predict(tuple(c for c in sub if c[0] != "fraction"))
        return peak, t, budgets.get(d.get("fraction"), usable)

    _, t_all, _ = predicted(ch)
    frac = dict(ch).get("fraction")
    smaller = [tuple(c if c[0] != "fraction" else ("fraction", f) for c in ch) for f in budgets if f < (frac or 0)]
    for sub in [tuple(c for c in ch if c != drop) for drop in ch] + smaller:
        peak, t, room = predicted(sub)
        if peak <= room and t <= t_all * 1.01:
            return True
    return False


def _divides(base: AnalyzeOptions, changes, global_batch: int | None) -> bool:
    """Whether the global batch still splits into the microbatches over the data devices of `changes`."""
    if not global_batch:
        return True
    opts = _apply(base, changes)
    return opts is not None and \
        global_batch % (layouts.parse_mesh(opts.mesh, opts.axis_roles).data_size * opts.accum) == 0


# Which kind of plan a combination is: the same training on the same GPUs first, then with its
# optimizer state offloaded, then on more GPUs, then a different training (LoRA, QLoRA).
def _plan_kind(changes) -> tuple:
    d = dict(changes)
    return (d.get("lora") is not None, d.get("lora", (0, None))[1] is not None, "devices" in d, "offload" in d)


def _interleave(queue: list) -> list:
    """Fastest predicted first within each kind of plan, the kinds taken in turn: a faster plan on
    twice the GPUs or with LoRA does not crowd out every full fine-tune on the GPUs as given."""
    groups: dict[tuple, list] = {}
    for ch in queue:
        groups.setdefault(_plan_kind(ch), []).append(ch)
    order = [groups[k] for k in sorted(groups)]
    out = []
    for i in range(max((len(g) for g in order), default=0)):
        out += [g[i] for g in order if i < len(g)]
    return out


def _devices(c: Candidate) -> int:
    return getattr(c.report.target, "devices", 0)


def _rank(cands: list[Candidate], devices: int) -> list[Candidate]:
    """Fitting first: those on the `devices` GPUs as given before those that need more, each by its
    throughput per device, highest first (the global batch is the same in all: on the same GPUs, the
    fastest step first); among equals the fewest changes, then the smallest memory fraction, then the
    most headroom. Then the rest by peak."""
    def speed(c: Candidate) -> float:
        tp = c.throughput
        return -tp[0] if tp is not None else (c.step_s if c.step_s is not None else math.inf)

    fit = sorted((c for c in cands if c.fits),
                 key=lambda c: (_devices(c) > devices, c.throughput is None, speed(c), len(c.changes),
                                dict(c.changes).get("fraction", 0.0), -(c.headroom or 0)))
    rest = sorted((c for c in cands if not c.fits),
                  key=lambda c: (c.report is None, c.peak if c.peak is not None else 0))
    return fit + rest


def model_takes(path: str, model=None) -> Callable[[str], bool]:
    """Whether the model's workload() may take an argument: it names it, or takes **kwargs (then the
    probe decides: a model that refuses it is "not applicable"). Read from the function the API was given,
    the config.json decoder's, or a model file's source (parsed, not imported); a Workload object takes none."""
    names: set[str] = set()
    anything = False
    try:
        if model is not None:
            if callable(model) and not hasattr(model, "batch"):
                params = inspect.signature(model).parameters.values()
                names = {p.name for p in params}
                anything = any(p.kind is p.VAR_KEYWORD for p in params)
        else:
            config = hf.config_file(path)
            if config is not None:
                names = set(inspect.signature(hf.workload_function(config)).parameters)
            else:
                tree = ast.parse(Path(path).read_text())
                fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "workload"), None)
                if fn is not None:
                    a = fn.args
                    names = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
                    anything = a.kwarg is not None
    except (OSError, SyntaxError, ValueError, TypeError, UserError):
        pass   # unreadable here: the analysis reports it; no argument is tried
    return lambda name: anything or name in names


def _key(changes) -> str:
    return "; ".join(_describe(a, v) for a, v in changes) or "as given"


def _opts_key(o: AnalyzeOptions) -> tuple:
    """What makes two candidates the same compile: every field of the options, so an option added
    later (or offload, LoRA, the base dtype, ...) can never make two different steps look alike; a
    rules file by its content."""

    return dataclasses.astuple(o) + (rules.digest(o.rules),)
