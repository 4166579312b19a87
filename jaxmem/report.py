"""The Report: the one contract between the analysis pipeline and its renderers.

Everything a renderer (terminal, JSON, HTML, comparison table) shows comes from
these frozen dataclasses; nothing renders from live JAX objects.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypedDict

# The breakdown keys, in display order; they sum to per_device_peak_bytes. fp8_state is present
# only under --precision fp8 (a column of 0 elsewhere), constants only where XLA keeps some in device
# memory apart from generated_code: every renderer takes the keys from here.
BREAKDOWN_KEYS = (
    "params",
    "optimizer_state",
    "gradients",
    "batch",
    "other_state",
    "fp8_state",
    "activations_and_temporaries",
    "outputs_not_aliased",
    "constants",
    "generated_code",
    "runtime_overhead",
)



def breakdown_in_order(breakdown: dict[str, int]) -> list[tuple[str, int]]:
    """The breakdown's parts in BREAKDOWN_KEYS' order, any key it does not know after them as given:
    the one order every renderer shows them in."""
    known = [(k, breakdown[k]) for k in BREAKDOWN_KEYS if k in breakdown]
    return known + [(k, v) for k, v in breakdown.items() if k not in BREAKDOWN_KEYS]


BREAKDOWN_HELP = {
    "params": "model parameters (per-device shard)",
    "optimizer_state": "optax state: moments, counters",
    "gradients": "gradients, live as XLA temporaries",
    "batch": "the input batch shard",
    "other_state": "mutable collections (BatchNorm stats), RNG keys",
    "fp8_state": "FP8 delayed scaling: scales and amax histories (--precision fp8)",
    "activations_and_temporaries": "activations saved for backward, fusion temporaries, collective buffers, workspaces",
    "outputs_not_aliased": "outputs that could not reuse a donated input buffer",
    "constants": "constants XLA keeps in device memory: tables the step closed over (see constants)",
    "generated_code": "compiled kernels",
    "runtime_overhead": "allocator and runtime cost outside XLA's buffers (see runtime_overhead_source)",
}


class XlaNumbers(TypedDict):
    """XLA's raw per-device numbers (bytes): compiled.memory_analysis() and its lower bound."""

    argument: int
    output: int
    alias: int
    temp: int
    generated_code: int
    peak_memory: int
    lower_bound: int


class StateCheck(TypedDict):
    """jaxmem's count of the step's argument bytes against XLA's."""

    analytic_argument_bytes: int
    compiled_argument_bytes: int


class Timings(TypedDict, total=False):
    """This run's wall clock, in seconds (cache_hit: 1.0 when the compile came from the cache)."""

    build_s: float
    lower_s: float
    compile_s: float
    decode_s: float
    total_s: float
    cache_hit: float


class Options(TypedDict, total=False):
    """What the step was built with, as the user would name it (jaxmem.analysis.fields.options): the
    first six always, the rest where used; and one "arg:<name>" key per model-file argument, which a
    TypedDict cannot name (fields.options casts)."""

    precision: str
    optimizer: str
    batch: int | None
    accum: int
    remat: str
    donate: bool
    collective_axis: str               # the pmap-style axis name the model's collectives use
    remat_at: str                      # --remat-at, and the modules it checkpointed
    remat_placed: list[str]
    freeze: str | None                 # fine-tuning (jaxmem/program/finetune.py)
    lora_rank: int
    lora_targets: str | None
    lora_alpha: float | None
    base_dtype: str | None
    offload: str | None
    rules: str                         # --rules: the file and its digest
    rules_sha256: str
    axis_types: str                    # "explicit" for a mesh of Explicit axes
    moment_dtype: str                  # --moment-dtype: the built-in optimizer's moments (bf16)


class Choices(TypedDict, total=False):
    """Every choice that decides the answer (jaxmem.analysis.choices), each with why it is what it is:
    values are what the step compiled with; a model file's attention is read from its compiled program
    ("unknown" where nothing there tells), its loss is "the model's own"."""

    precision: str                     # --precision: the compute precision
    precision_why: str
    attention: str                     # "cudnn" (fused flash attention), "xla" (materialized scores), "unknown"
    attention_why: str
    loss: str                          # "cross_entropy", "cross_entropy_vocab_tiles=N", "the model's own"
    loss_why: str
    layers: str                        # "scan" | "loop" (a config.json decoder's --arg scan), "the model's own"
    layers_why: str
    remat: str                         # --remat policy
    lora_rank: int | None              # None: no LoRA
    lora_targets: str | None           # --lora-targets, or "every dense/einsum/conv layer" (the default)
    base_dtype: str | None             # LoRA's frozen base storage: --base-dtype, the checkpoint's, or as created
    base_dtype_why: str                # ... what decided it (only with --lora)
    mem_fraction: float | None         # JAX's share of the card (None: no fixed memory, an attached GPU's limit)
    mem_fraction_why: str              # what set it: JAX's default, --mem-fraction, the environment
    allocator: str                     # "bfc" | "platform" | "cuda_async": the allocator the run uses (allocator.py)
    allocator_why: str                 # what set it (--allocator, the environment, JAX's default); what can fail
    # every logical axis name the model uses (rules.logical_rules): {name, mesh_axes (split over; [] whole), source,
    # convention (the rule's origin: --rules FILE rule N, jaxmem, a convention's citation, --unmapped), used_at}
    logical_rules: list[dict[str, Any]]
    fallback_sharding: str             # the rule for parameters no logical name places (rules.py), as applied
    fallback_poor: list[dict[str, Any]]  # parameters the fallback split on a poor dimension, with the padding (visible)
    # where each choice above came from, by its name: "user" (a flag or environment variable the user gave),
    # "model" (the model's own code or config file) or "default" (jaxmem's guess)
    sources: dict[str, str]


class NcclInfo(TypedDict):
    """The NCCL communicators of the busiest device, the device groups of the program's collectives."""

    communicators_per_device: int
    groups: list[list[int]]
    nvls: bool


class RuntimeInfo(TypedDict):
    """The runtime's own memory per device (jaxmem.compiler.runtime.Runtime.to_json): named terms in
    JAX's pool (their sum is breakdown["runtime_overhead"]) and outside it, each with its source."""

    in_pool_bytes: int
    out_of_pool_bytes: int
    terms: list[dict[str, Any]]        # runtime.Term.to_json: name, bytes, low/high, in_pool, source ...
    nccl: NcclInfo
    calibrated: bool


class StepTime(TypedDict, total=False):
    """The step-time estimate (jaxmem.compiler.steptime.estimate). Always: label and available; without
    an estimate, `reason`; with one, the rest (`pipeline` only for a step with a stage axis)."""

    label: str
    available: bool
    reason: str
    estimate_s: float
    low_s: float
    high_s: float
    overlapped_s: float
    compute_s: float
    memory_s: float
    communication_s: float
    exposed_communication_s: float
    unoverlapped_collective_s: float   # busy seconds of collectives scheduled with no kernel beside them
    overlap_slowdown_s: float          # compute slowed beside collectives in flight (rates.OVERLAP_SLOWDOWN)
    host_transfer_s: float
    host_transfer_bytes: int
    bound: str
    flops: float
    xla_flops_loops_once: float
    custom_call_flops: float
    bytes_accessed: float
    xla_bytes_accessed: float
    collective_bytes: int
    collectives: list[dict[str, Any]]
    kernel_classes: list[dict[str, Any]]
    dequantization: dict[str, Any] | None   # steptime.dequantization: a quantized base decoded, kernel by kernel
    scan_residuals: dict[str, Any] | None   # jaxmem.compiler.residuals: a scan's stacks' traffic vs recompute
    xla_remat: dict[str, Any]               # steptime.xla_remat: XLA's rematerialized kernels (launches, seconds, ...)
    loops: list[dict[str, Any]]
    loops_counted_once: list[str]
    peak_flops: float
    peak_flops_kind: str
    compute_peaks: list[dict[str, Any]]
    hbm_bandwidth: float
    intra_host_bandwidth: float
    inter_host_bandwidth: float
    host_bandwidth: float
    rate_sources: dict[str, str]
    rule: str
    leaves_out: str
    pipeline: dict[str, Any]           # steptime.pipeline_time: the bubble's share of the estimate


# Per-device bytes in pinned host memory (--offload), by category ("params", "optimizer_state", ...,
# then "activations" or "temporaries": XLA's host temporaries); empty when nothing is offloaded.
HostBytes = dict[str, int]


class MeshRole(TypedDict):
    """One mesh axis (jaxmem.program.splits.mesh_roles): its role, size and what it splits."""

    role: str | None                   # None: a name no role knows (and no --axis-roles for it)
    size: int
    splits: list[str]                  # of "batch", "sequence", "state"


class PipelineInfo(TypedDict, total=False):
    """A stage axis's schedule (jaxmem.analysis.fields.pipeline_fields) and, from the explanation, what
    the stage loop holds at the peak (its other keys)."""

    schedule: str
    axis: str
    stages: int
    microbatches: int
    repeats: int
    layers: int
    layers_per_stage: int
    layers_per_repeat: int
    iterations: int
    bubble: float
    microbatches_in_flight: int
    stage_remat: bool
    chosen: list[str]
    program: str
    activations_in_flight: int         # at the peak (jaxmem.xla.explain): the stage loop's saved activations
    transfers: int                     # ... and its stage-to-stage transfer buffers


@dataclasses.dataclass(frozen=True)
class TargetInfo:
    gpu: str
    description: str
    platform: str
    devices: int
    hosts: int
    deviceless: bool
    memory_bytes: int | None          # the card's memory (None on CPU)
    usable_bytes: int | None          # what JAX's allocator may use of it
    usable_note: str                  # the allocator settings that decided usable_bytes
    # What XLA compiled against: its scheduler and rematerialization budget the run's pool (what the allocator
    # gives XLA), so the same step may compile to a smaller peak for a smaller pool ("" on CPU).
    xla_budget_note: str = ""
    # The limit XLA held the step's temporaries to (GetSchedulerMemoryLimit): (base - the step's inputs and
    # outputs) x slop / 100, its base (the run's pool: total x fraction under BFC and cuda_async, 80% of the card
    # under the platform allocator; an attached GPU's bytes_limit) and the slop factor (XLA_FLAGS'
    # --xla_gpu_memory_limit_slop_factor, default 95). None on CPU and in reports written before them.
    xla_memory_limit_bytes: int | None = None
    xla_memory_base_bytes: int | None = None
    xla_slop_factor: int | None = None


# Every warning kind a report can carry, with its meaning, in the order the analysis emits them
# (jaxmem/analysis/checks.py: CHECKS). docs/analyze.md "Warnings" names each (tests/test_report.py).
# A new kind: add it here and its check to CHECKS; a ReportWarning of a kind not listed is refused.
WARNING_KINDS: dict[str, str] = {
    "not_donated": "the state is copied, not updated in place (donate it)",
    "runtime_out_of_pool": "the CUDA context and NCCL's communicators need more than JAX's pool leaves on the card",
    "verdict_tight": "the verdict hangs on an estimated runtime term (NCCL, allocator): fits at the low end only",
    "allocator_above_threshold": "cuda_async: the peak is above the release threshold: it runs, failing intermittently",
    "gradients_not_split": "--no-explain: gradients are not told apart from the other temporaries",
    "xla_remat_failed": "XLA:GPU's rematerialization could not bring the program under its memory limit",
    "compile_fallback": "the compile deviated from the default pipeline (no Triton GEMM tiling, an older jax)",
    "untested_jax": "the installed jax or jaxlib is outside the tested range",
    "cpu_fusions_off": "--gpu cpu: the step is compiled with XLA:CPU's YNNPACK fusions off",
    "xla_rematerialized": "XLA recomputed instructions to bring the step under its budget for the card",
    "precision_no_effect": "--precision left most matmul FLOPs in 32-bit: the layers fix their own dtype",
    "scan_residuals_traffic": "a scan's saved residuals move more bytes than --remat full's recompute would take",
    "gradient_reduced_per_iteration": "a pipeline loop reduces the stages' gradients on every iteration, not once",
    "schedule_memory_limited": "the temporaries exceed XLA's scheduler memory limit: collectives run beside no compute",
    "collectives_not_overlapped": "XLA compiled the step without its latency-hiding scheduler: collectives "
                                  "run beside no compute",
    "remat_at_ignored": "--remat-at on a model whose workload() places its own checkpoints",
    "lora_skipped": "--lora left a module without an adapter: it is applied with a params dict the model builds",
    "unsharded_leaf": "a leaf could not be sharded as the layout asked",
    "fallback_poor_dimension": "a parameter split on a small dimension: its largest does not divide (pad it)",
    "batch_replicated": "a constraint of the model's keeps the batch dimension whole on every device",
    "axis_splits_nothing": "a mesh axis that splits nothing of what its role should split",
    "tensor_split_by_size": "a tp layout on weights without logical axis names: each split by its largest dimension",
    "remat_offloaded_nothing": "an offloading --remat policy moved no activation to host memory",
    "offload_not_placed": "--offload: XLA's host bytes differ from the offloaded state",
    "host_memory_exceeded": "pinned host memory per device exceeds the reference system's RAM per GPU",
    "gathered_params_live": "all-gathered parameters of several layers live at the peak",
    "remat_saves_too_much": "a remat policy that still keeps most activations",
    "past_context": "the sequence is longer than the model's context (a config.json's max_position_embeddings)",
}


@dataclasses.dataclass(frozen=True)
class ReportWarning:
    kind: str          # one of WARNING_KINDS
    message: str
    bytes: int = 0     # the per-device cost of leaving it as it is

    def __post_init__(self):
        if self.kind not in WARNING_KINDS:   # renderers match kinds by name: a typo would vanish silently
            raise ValueError(f"unknown warning kind {self.kind!r}: add it to jaxmem.report.WARNING_KINDS")


@dataclasses.dataclass(frozen=True)
class BufferRow:
    """One buffer live at the peak moment."""

    size: int
    shape: str
    dtype: str
    module_path: str
    category: str
    instruction: str
    op_name: str


@dataclasses.dataclass(frozen=True)
class ModuleRow:
    module_path: str
    bytes: int
    buffers: int


@dataclasses.dataclass(frozen=True)
class Report:
    model: str
    source: str                        # the model file, or "<workload>"
    target: TargetInfo
    mesh: tuple[tuple[str, int], ...]
    layout: str
    options: Options                   # precision, optimizer, batch, accum, remat, donate, ...
    per_device_peak_bytes: int
    breakdown: dict[str, int]
    xla: XlaNumbers                    # XLA's raw per-device numbers
    param_count: int
    state_check: StateCheck            # analytic vs compiled argument bytes
    runtime_overhead_source: str
    fits: bool | None                  # None when the target has no fixed memory (cpu)
    headroom_bytes: int | None
    warnings: tuple[ReportWarning, ...] = ()
    top_buffers: tuple[BufferRow, ...] = ()
    modules: tuple[ModuleRow, ...] = ()
    peak_categories: dict[str, int] = dataclasses.field(default_factory=dict)
    timeline: tuple[int, ...] = ()     # bytes live over program order (downsampled)
    timeline_peak_index: int = -1
    # indices on `timeline` where the backward pass starts and the optimizer update follows it (the first
    # point after the backward's last allocation); () where the program shows no backward pass
    timeline_phases: tuple[int, ...] = ()
    timings: Timings = dataclasses.field(default_factory=lambda: Timings())
    # What the step was compiled with (jaxmem.compiler.versions.installed): python, jax, jaxlib, flax,
    # optax, qwix, the CUDA plugin and the CUDA runtime / cuDNN the GPU target is described with.
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    # The XLA flags in force (jaxmem.compiler.versions.xla_flags): "passed" to the compile, in XLA_FLAGS
    # order, and "dropped" (flag -> why jaxmem leaves it out of the compile).
    xla_flags: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The runtime's own memory per device (jaxmem.compiler.runtime.Runtime.to_json): named terms in
    # JAX's pool (their sum is breakdown["runtime_overhead"]) and outside it, each with its source.
    runtime: RuntimeInfo | dict = dataclasses.field(default_factory=dict)   # {} where none was modelled
    # An estimated step time from the compiled program (jaxmem.compiler.steptime.estimate): compute,
    # memory and communication times, the estimate and its rule; {"available": False, "reason"} off-catalogue.
    step_time: StepTime = dataclasses.field(default_factory=lambda: StepTime())
    # Fine-tuning (jaxmem/program/finetune.py): global counts of the parameters that train (get
    # gradients and optimizer state) and that stay frozen, and their per-device bytes (their sum is
    # breakdown["params"]); None for a custom step's state, where jaxmem cannot tell.
    trainable_param_count: int | None = None
    frozen_param_count: int | None = None
    trainable_bytes: int | None = None
    frozen_bytes: int | None = None
    # Per-device bytes in pinned host memory (--offload), by category, plus XLA's host temporaries;
    # empty when nothing is offloaded. Not part of the device peak or its breakdown.
    host: HostBytes = dataclasses.field(default_factory=dict)
    # Each mesh axis: its role (jaxmem/program/layouts.py), size and what it splits in this step
    # ("batch", "sequence", "state"); and the largest leaves per device, each with its global shape,
    # PartitionSpec (one entry per dim: null, an axis, or a list of axes) and per-device bytes.
    mesh_roles: dict[str, MeshRole] = dataclasses.field(default_factory=dict)
    shardings: tuple[dict[str, Any], ...] = ()
    # What advise needs to propose context and expert parallelism: the batch's sequence length (dim 1
    # of its first leaf of rank 2+; None without one) and the logical axis names the parameters carry.
    sequence_length: int | None = None
    logical_names: tuple[str, ...] = ()
    # every state leaf (jaxmem.program.visible.state_leaves): path, category, shape, dtype, spec, device_bytes,
    # memory_kind, in the step's argument order
    state_leaves: tuple[dict[str, Any], ...] = ()
    # The tokens one step trains on (global): batch x sequence of the batch's first integer leaf of rank 2
    # (token ids); None for a batch of samples (images, feature vectors). compare and advise rank by
    # throughput per device: tokens/s with it, samples/s without (jaxmem.plan.throughput).
    tokens_per_step: int | None = None
    # A stage axis (jaxmem/program/pipeline_stages.py): the schedule (kind, stages, microbatches,
    # repeats, layers, iterations, bubble, how the microbatches were chosen) and, at the peak, the
    # activations the stage loop saved for the backward pass and the stage-to-stage transfer buffers;
    # `stages`: per stage, its layers (storage rows of the stacked weights), peak and breakdown.
    # Empty without a stage axis.
    pipeline: PipelineInfo = dataclasses.field(default_factory=lambda: PipelineInfo())
    stages: tuple[dict[str, Any], ...] = ()
    # A Hugging Face config.json analyzed (jaxmem/hf): its model_type, the parameter count of the
    # architecture it names (jax.eval_shape of jaxmem's decoder) and its path; empty for a model file.
    hf_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The verdict with the runtime's estimated terms at both ends of their ranges (jaxmem.compiler.runtime.judge):
    # "fits" at the high end of every range, "does_not_fit" even at the low end, "tight" in between (`fits` is
    # True for it); margin_bytes: bytes to spare in the tighter constraint at the estimates (< 0: short by);
    # verdict_terms: for "tight", the estimated terms it hangs on, each {name, low_bytes, bytes, high_bytes}.
    # None / () in reports written before verdicts had margins (verdict_of() reads those from `fits`).
    verdict: str | None = None
    margin_bytes: int | None = None
    verdict_terms: tuple[dict[str, Any], ...] = ()
    # The activation sharding constraints the model applied itself while traced under the mesh in
    # context (jaxmem.program.sharding.model_constraints): their count in the step, how many places
    # make them, and the most used places (`at`: file:line in function) with their specs.
    activation_constraints: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The trainer's trainable set (jaxmem/program/finetune.py, trainable_set): parameter leaves and
    # parameters that get gradients and optimizer state, and what chose them: "every parameter",
    # "nnx.LoRAParam" (the model's own qwix adapters, trained alone as tunix's PEFT trainer does),
    # "--lora", "--freeze", "--train-all". Empty for a custom step's state.
    trainable: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Every choice that decides the answer, stated (Choices; jaxmem.analysis.choices): precision, attention,
    # loss, remat, LoRA targets and rank, base dtype, memory fraction. Empty in reports written before it.
    choices: Choices | dict = dataclasses.field(default_factory=dict)
    # The constants the step captured of 1 MiB or more (jaxmem.program.constants: tables the model's code
    # made from concrete values), by shape and dtype: `count`, `bytes` captured, `modules` that read them,
    # `device_bytes` XLA keeps in device memory (in breakdown.constants) and `on_device`. Only where any.
    constants: tuple[dict[str, Any], ...] = ()
    # The memory fractions the step fits at (jaxmem.compiler.runtime.band): floor = what the pool must hold (the
    # peak, in-pool terms at their high end) / the card, rounded up; ceiling = what the card leaves once the memory
    # outside the pool is resident (at its high end) / the card, rounded down. floor > ceiling: no fraction fits.
    # None on CPU, for an attached GPU's fixed limit, and in reports written before the band.
    fraction_floor: float | None = None
    fraction_ceiling: float | None = None
    # XLA rematerialized to bring the step under its memory limit (jaxmem.analysis.stages): `instructions` it
    # recomputed, and the step compiled again at a limit where it recomputes nothing (its peak and step time:
    # what a larger limit would buy; None where not compiled: far over the line, or an attached GPU). Empty where
    # XLA recomputed nothing, on CPU, and in reports written before it.
    xla_remat: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        total = sum(self.breakdown.values())
        if total != self.per_device_peak_bytes:  # the contract: the breakdown explains the whole peak
            raise ValueError(f"breakdown sums to {total}, peak is {self.per_device_peak_bytes}")

    def to_json(self, *, timeline: bool = False, timings: bool = False) -> dict[str, Any]:
        """The answer as plain JSON values. `timings` (this run's wall clock) are left out unless
        asked: they differ from run to run, and a cached answer must equal a fresh one byte for byte."""
        d = dataclasses.asdict(self)
        d["mesh"] = dict(self.mesh)
        d["target"]["memory_bytes"] = self.target.memory_bytes
        if not timeline:
            d.pop("timeline")
            d.pop("timeline_peak_index")
            d.pop("timeline_phases")
        if not timings:
            d.pop("timings")
        if not self.constants:   # only a step that captured a large constant has them
            d.pop("constants")
        if not self.pipeline:   # only a pipelined step has them (reports without a stage axis are unchanged)
            d.pop("pipeline")
            d.pop("stages")
        d["schema"] = "jaxmem.report/1"
        return d

    def _repr_html_(self) -> str | None:
        """Jupyter's rendering: the verdict, the breakdown and the memory curve (jaxmem.present.notebook)."""
        from jaxmem import display  # noqa: PLC0415 - `import jaxmem` loads the report: only what it needs

        return display.html("report", self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Report:
        """The Report that `to_json` wrote (`compare --from`, saved sweeps): its to_json is the same JSON.

        Fields a newer writer added and this Report lacks are an error, not silently dropped."""
        d = dict(d)
        if d.pop("schema", "jaxmem.report/1") != "jaxmem.report/1":
            raise ValueError("not a jaxmem.report/1 object")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown Report fields {unknown} (written by a newer jaxmem?)")
        d["target"] = TargetInfo(**d["target"])
        d["mesh"] = tuple((str(k), int(v)) for k, v in d["mesh"].items())
        d["warnings"] = tuple(ReportWarning(**w) for w in d.get("warnings", ()))
        d["top_buffers"] = tuple(BufferRow(**b) for b in d.get("top_buffers", ()))
        d["modules"] = tuple(ModuleRow(**m) for m in d.get("modules", ()))
        if "timeline" in d:
            d["timeline"] = tuple(d["timeline"])
        d["timeline_phases"] = tuple(d.get("timeline_phases", ()))
        d["shardings"] = tuple(d.get("shardings", ()))
        d["logical_names"] = tuple(d.get("logical_names", ()))
        d["state_leaves"] = tuple(d.get("state_leaves", ()))
        d["constants"] = tuple(d.get("constants", ()))
        d["stages"] = tuple(d.get("stages", ()))
        d["verdict_terms"] = tuple(d.get("verdict_terms", ()))
        return cls(**d)


VERDICTS = ("fits", "tight", "does_not_fit")
VERDICT_TEXT = {"fits": "fits", "tight": "tight", "does_not_fit": "does not fit"}


def verdict_of(r: Report) -> str | None:
    """The report's verdict -- "fits", "tight" or "does_not_fit" (None: no fixed memory) -- also for a
    report saved before verdicts had margins (then from `fits`). Tight counts as fitting (`fits` is True)."""
    if r.verdict is not None:
        return r.verdict
    return None if r.fits is None else ("fits" if r.fits else "does_not_fit")


def tight_text(r: Report) -> str:
    """What a tight verdict hangs on, e.g. "nccl_communicators 0.30-2.54 GiB" ("" unless tight)."""
    if verdict_of(r) != "tight":
        return ""
    from jaxmem.units import fmt_bytes  # noqa: PLC0415 - as display in Report._repr_html_

    return ", ".join(f"{t['name']} {fmt_bytes(t['low_bytes'])}-{fmt_bytes(t['high_bytes'])}" for t in r.verdict_terms)
