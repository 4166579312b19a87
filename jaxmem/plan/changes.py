"""The changes `jaxmem advise` tries (jaxmem/plan/advise.py): which values each axis of change takes
for a step, the options a set of changes makes, and how a change is named and shown.

The axes, in the order advise tries them (CHANGES: the free fixes first, more devices last): the
memory fraction, compute precision, the attention kernel and the chunked loss (where the model's
workload() takes them), remat, accumulation, layout, LoRA's base dtype, the optimizer's moment dtype,
optimizer offload, LoRA / QLoRA, mesh changes (HSDP, context, expert, pipeline), more devices.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxmem import hf
from jaxmem.compiler import allocator, targets
from jaxmem.errors import UserError
from jaxmem.plan import meshes
from jaxmem.program import layouts
from jaxmem.program.options import OPTIMIZER_NAMES, AnalyzeOptions, offloads_activations

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


def fraction_variable() -> str:
    """The variable that sets JAX's memory fraction: XLA_PYTHON_CLIENT_MEM_FRACTION, which every jax reads
    (jaxlib 0.10 as the fallback of XLA_CLIENT_MEM_FRACTION), unless the new name is already set (jax
    refuses both)."""
    return "XLA_CLIENT_MEM_FRACTION" if os.environ.get("XLA_CLIENT_MEM_FRACTION") else \
        "XLA_PYTHON_CLIENT_MEM_FRACTION"


def describe(axis: str, value, roles: str | None = None) -> str:
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


def shown(axis: str, value):
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


def global_batch(report) -> int | None:
    """The report's global batch (None for a report, or a stand-in, without one)."""
    b = (getattr(report, "options", None) or {}).get("batch")
    return int(b) if isinstance(b, int) else None


def axes(base: AnalyzeOptions, global_batch: int | None, report=None,
         takes: Callable[[str], bool] | None = None) -> dict[str, list]:
    """axis -> the values to try, cheapest first (an empty list: nothing to try on that axis); the axes
    in the order of CHANGES: the free fixes first, more devices last. `report` (the original's) decides
    the mesh changes that answer what dominates it, and whether the optimizer is jaxmem's; `takes(name)`:
    whether the model's workload() may take that argument (None: no model arguments are tried)."""
    spec = layouts.parse_mesh(base.mesh, base.axis_roles)
    out: dict[str, list] = {}
    out["fraction"] = _fractions(base, report)
    args = dict(base.model_args)
    # a config.json decoder's default attention (auto) is cuDNN already wherever cuDNN takes the step at bf16
    # (jaxmem.hf.model.attention_choice): forcing it adds a compile of the program the precision change makes
    auto = bool(getattr(report, "hf_config", None)) and args.get("attention", "auto") == "auto"
    already = (getattr(report, "choices", None) or {}).get("attention") == "cudnn"
    out["attention"] = ["cudnn"] if takes is not None and takes("attention") and args.get("attention") != "cudnn" \
        and not auto and not already else []
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


def _fractions(base: AnalyzeOptions, report=None) -> list[float]:
    """The memory fractions above the one in force, when the user did not state one (--mem-fraction), the
    pool is JAX's fraction of a catalogue card (not an attached GPU's bytes_limit, not the platform
    allocator) and the environment's fraction reads (a bad one is the analysis's error to report). With the
    original's fraction band (Report.fraction_floor / fraction_ceiling): the smallest fraction that holds its
    peak (the floor, rounded up to 2 decimals) beside FRACTIONS, none above the ceiling -- a fraction that
    leaves the memory outside the pool no room is never proposed; where the fraction in force is above the
    ceiling, the largest one under it (room for NCCL and the CUDA context)."""
    if base.mem_fraction is not None or (base.gpu or "").startswith("local") or base.allocator == "platform":
        return []
    try:
        a = allocator.read(os.environ, base.allocator)
    except UserError:
        return []
    if a.kind == "platform":
        return []
    floor, ceiling = getattr(report, "fraction_floor", None), getattr(report, "fraction_ceiling", None)
    if floor is None or ceiling is None:
        return [f for f in FRACTIONS if f > a.fraction]
    lowest = math.ceil(round(floor * 10_000) / 100) / 100
    if ceiling < a.fraction:   # the pool leaves the memory outside it too little: the largest fraction that does not
        highest = math.floor(round(ceiling * 10_000) / 100) / 100
        return [highest] if lowest <= highest else []
    return sorted({f for f in (lowest, *FRACTIONS) if a.fraction < f <= ceiling})


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


def apply(base: AnalyzeOptions, changes: tuple[tuple[str, Any], ...],
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
    if needs_bf16(changes) and kw.get("precision", base.precision) == "fp32":
        kw["precision"] = "bf16"   # cuDNN attention has no fp32 kernel; a bf16 base needs bf16 compute
    return dataclasses.replace(base, mesh=mesh, hosts=hosts, explain=False,
                               axis_roles=meshes.roles_for(base.axis_roles, mesh), **kw)


def needs_bf16(changes) -> bool:
    d = dict(changes)
    return d.get("attention") == "cudnn" or d.get("base") == "bf16"


def divides(base: AnalyzeOptions, changes, global_batch: int | None) -> bool:
    """Whether the global batch still splits into the microbatches over the data devices of `changes`."""
    if not global_batch:
        return True
    opts = apply(base, changes)
    return opts is not None and \
        global_batch % (layouts.parse_mesh(opts.mesh, opts.axis_roles).data_size * opts.accum) == 0


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

