"""The options of an analysis, defined once.

Every field of :class:`StepChoice` (what defines the training step) and :class:`AnalyzeOptions`
(where and how it is analyzed) carries its command-line flag as metadata (:class:`Flag`). From
these alone jaxmem.cli makes the click options, :func:`command_line` writes options back as the
command that reproduces them, the Python API takes its keywords, and advise keys what it has
compiled: an option added here reaches all of them. The names each choice accepts are the
constants below, which the modules that implement them use too.

A leaf of the package: it imports nothing of jaxmem and no jax, so the CLI starts fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex
from typing import Any

LAYOUTS = ("dp", "fsdp", "tp", "fsdp_tp")
PRECISIONS = ("fp32", "bf16", "bf16-pure", "fp8")
OPTIMIZER_NAMES = ("sgd", "momentum", "adam", "adamw", "adafactor", "lion")
# "none" and "full" are jaxmem's; the rest are jax.checkpoint_policies of the same name
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "checkpoint_dots",
                  "checkpoint_dots_with_no_batch_dims", "everything_saveable", "nothing_saveable", "offload_dots")
# policies that keep what they save in pinned host memory: offload_dots (jax's offload_dot_with_no_batch_dims)
# and offload:NAME,NAME (save_and_offload_only_these_names over the model's checkpoint_name()s)
OFFLOAD_PREFIX = "offload:"
BASE_DTYPES = ("bf16", "int8", "int4", "nf4")
# the dtypes a checkpoint stores its weights in (Workload.checkpoint_dtype; a config.json's torch_dtype): a LoRA
# step's frozen base defaults to it (jaxmem.program.finetune.resolve_base)
CHECKPOINT_DTYPES = ("float32", "bfloat16", "float16")
OFFLOADS = ("optimizer",)
# --moment-dtype: the storage of the built-in optimizers' moments (jaxmem/program/state.py). int8 is not offered:
# no maintained JAX library keeps 8-bit optimizer states (optax 0.2.8, qwix 0.1.8 have none; praxis's int8
# Adafactor momentum is unmaintained since 2024), and a hand-made one would predict a program no trainer runs.
MOMENT_DTYPES = ("bf16",)
# jax.sharding.AxisType of every mesh axis: Auto (XLA's propagation places what the code leaves
# open) or Explicit (shardings are part of the types: code written with out_sharding=, reshard)
AXIS_TYPES = ("auto", "explicit")
# pipeline schedules over a stage axis (jaxmem/program/pipeline_stages.py): all forward then all backward,
# and MaxText's circular (repeating) pipeline
PIPELINES = ("gpipe", "circular")
# --unmapped: a logical axis name no rule maps (jaxmem/program/rules.py) is an error, or replicated as the user asks
UNMAPPED = ("error", "replicate")


@dataclasses.dataclass(frozen=True)
class Flag:
    """How one option is written on the command line.

    kind: text | choice | whole (an integer >= minimum, any size) | count (a small integer >=
    minimum) | float (positive, finite) | fraction (in (0, 1]) | switch (a flag; `invert`: the flag sets the field
    False) | pairs (repeatable KEY=VALUE). shared: every step command has it (else a command
    declares it: `commands` lists which). always: command_line writes it even at its default.
    """

    name: str
    help: str = ""
    kind: str = "text"
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    minimum: int | None = None
    what: str = ""                 # for kind=whole: what the number is, in its error messages
    invert: bool = False
    shared: bool = True
    commands: tuple[str, ...] = ()
    always: bool = False
    show_default: bool = False


def _opt(default: Any, flag: Flag) -> Any:
    return dataclasses.field(default=default, metadata={"flag": flag})


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepChoice:
    """What defines the training step besides the model file: the same for `analyze`, which
    predicts it, and `verify`, which measures it (one definition, so they cannot drift)."""

    mesh: str = _opt("data=1", Flag(
        "--mesh", "Device mesh, AXIS=N[,AXIS=N]; each axis named for its role or given one (--axis-roles): "
        "data (alias dp, batch: replicas), fsdp (state sharded), tensor (alias model, tp), context (alias "
        "sequence, sp, seq), expert (alias ep), stage (alias pp).", always=True,
        show_default=True))
    axis_roles: str | None = _opt(None, Flag(
        "--axis-roles", "The roles of --mesh axes named as the model names them, AXIS=ROLE[,AXIS=ROLE], e.g. "
        "--mesh dp=2,fsdp=8,tp=1 --axis-roles dp=data,tp=tensor (common names need none: dp/batch are data, "
        "tp/model tensor, sp/seq context, ep expert, pp stage).", metavar="AXIS=ROLE"))
    layout: str = _opt("fsdp", Flag("--layout", kind="choice", choices=LAYOUTS, always=True, show_default=True))
    axis_types: str = _opt("auto", Flag(
        "--axis-types", "The mesh axes' jax.sharding.AxisType: auto, or explicit for code written for explicit "
        "sharding (out_sharding=, reshard; a mesh from jax.make_mesh). A workload may ask for explicit itself.",
        kind="choice", choices=AXIS_TYPES, show_default=True))
    rules: str | None = _opt(None, Flag(
        "--rules", "Logical-axis rules, JSON or YAML: a list of [logical_name, mesh_axis | [mesh_axes]] (MaxText's "
        "logical_axis_rules; a MaxText config works), tried before the layout's.", metavar="FILE"))
    unmapped: str = _opt("error", Flag(
        "--unmapped", "A logical axis name no rule maps (not --rules, not jaxmem's, not a known convention's): error "
        "(exit 2, listing each and the --rules lines that would map it) or replicate (keep its dimensions whole, as "
        "flax does).", kind="choice", choices=UNMAPPED, show_default=True))
    batch: int | None = _opt(None, Flag(
        "--batch", "Global batch size (overrides the model's).", kind="whole", minimum=1, what="the global batch"))
    optimizer: str | None = _opt(None, Flag(
        "--optimizer", f"{', '.join(OPTIMIZER_NAMES)} (default: the workload's, else adamw)."))
    precision: str = _opt("fp32", Flag(
        "--precision", "bf16: bf16 compute, fp32 params and optimizer state; bf16-pure: everything bf16; fp8: as "
        "bf16, with the dense/einsum matmuls in FP8 (E4M3, E5M2 gradients, delayed scaling; Hopper and newer).",
        kind="choice", choices=PRECISIONS, always=True, show_default=True))
    remat: str = _opt("none", Flag(
        "--remat", f"Checkpoint policy of the model's layers: {', '.join(REMAT_POLICIES)}, or offload:NAME[,NAME] "
        "(the activations the model names with checkpoint_name go to pinned host memory; offload_dots sends the "
        "dots without batch dimensions there).", kind="remat", metavar="POLICY", always=True, show_default=True))
    remat_at: str | None = _opt(None, Flag(
        "--remat-at", "Checkpoint, with the --remat policy, the calls of the linen/NNX modules whose class name or "
        "path this finds (e.g. Block, 'layers/\\d+$'): for models without a remat hook of their own.",
        metavar="REGEX"))
    accum: int = _opt(1, Flag("--accum", "Gradient-accumulation microbatches.", kind="count", minimum=1,
                              show_default=True))
    pipeline: str = _opt("gpipe", Flag(
        "--pipeline", "With a stage axis in --mesh: the schedule of the pipelined layers: gpipe (every microbatch "
        "forward, then backward) or circular (MaxText's repeating pipeline).", kind="choice", choices=PIPELINES,
        show_default=True))
    microbatches: int | None = _opt(None, Flag(
        "--microbatches", "With a stage axis: microbatches the batch is split into for the pipeline (default: the "
        "smallest number that keeps every stage busy).", kind="count", minimum=1, shared=False,
        commands=("analyze", "advise", "verify")))   # compare: --microbatches 4,8 is a grid axis there
    repeats: int | None = _opt(None, Flag(
        "--repeats", "With --pipeline circular: how many times a microbatch passes through the stages (default: "
        "one layer per stage per repeat, MaxText's default).", kind="count", minimum=1))
    stage_remat: bool = _opt(False, Flag(
        "--stage-remat", "With a stage axis: checkpoint each stage's pass at its input (Pax's pipeline remat): a "
        "stage keeps one activation per microbatch in flight instead of what the model saves in every layer, "
        "and recomputes its layers in the backward (always so under --pipeline circular).", kind="switch"))
    donate: bool = _opt(True, Flag("--no-donate", "Do not donate the train state (shows the cost).",
                                   kind="switch", invert=True))
    model_args: tuple[tuple[str, Any], ...] = _opt((), Flag(
        "--arg", "Keyword argument for the model file's workload(), e.g. --arg preset=8b. Repeatable.",
        kind="pairs", metavar="KEY=VALUE"))
    # fine-tuning (jaxmem/program/finetune.py): frozen parameters, LoRA / QLoRA adapters, host offload
    freeze: str | None = _opt(None, Flag(
        "--freeze", "Freeze the parameters whose path matches (as the report prints it, e.g. "
        "'embed|layers/.*attn'): no gradients, no optimizer state.", metavar="REGEX"))
    lora_rank: int = _opt(0, Flag(
        "--lora", "LoRA adapters of this rank (qwix) on the dense/einsum/conv weights; the base is frozen.",
        kind="count", minimum=0, metavar="RANK"))
    lora_targets: str | None = _opt(None, Flag(
        "--lora-targets", "With --lora: the module paths that take adapters, e.g. 'attn|mlp' (default: every "
        "dense/einsum/conv layer).", metavar="REGEX"))
    lora_alpha: float | None = _opt(None, Flag("--lora-alpha", "With --lora: the scale alpha (default: the rank).",
                                               kind="float"))
    base_dtype: str | None = _opt(None, Flag(
        "--base-dtype", "With --lora: the frozen base's storage; int8/int4/nf4 quantized by qwix (QLoRA).",
        kind="choice", choices=BASE_DTYPES))
    offload: str | None = _opt(None, Flag(
        "--offload", "Keep the optimizer state in pinned host memory between steps (JAX memory kinds).",
        kind="choice", choices=OFFLOADS))
    moment_dtype: str | None = _opt(None, Flag(
        "--moment-dtype", "Keep the moments of jaxmem's optimizers (--optimizer, or the default AdamW) in this dtype "
        "(bf16: optax's mu_dtype, the second moments cast likewise); a workload's own optimizer is its own.",
        kind="choice", choices=MOMENT_DTYPES))
    train_all: bool = _opt(False, Flag(
        "--train-all", "Train every parameter, also of a model that carries its own trainable set (nnx.LoRAParam "
        "adapters, which are otherwise the only leaves trained, as tunix's PEFT trainer does).", kind="switch"))

    def finetune(self) -> FineTune:
        return FineTune(self.freeze, self.lora_rank, self.lora_targets, self.lora_alpha, self.base_dtype, self.offload,
                        self.train_all)

    def step_options(self) -> StepOptions:
        return StepOptions(self.layout, self.precision, self.optimizer, self.batch, self.accum, self.donate,
                           self.finetune(), self.rules, self.axis_types, self.remat, self.pipeline, self.microbatches,
                           self.repeats, self.stage_remat, self.moment_dtype, self.unmapped)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnalyzeOptions(StepChoice):
    """The step (StepChoice) and where and how it is analyzed."""

    gpu: str | None = _opt(None, Flag(
        "--gpu", "Target GPU: a catalogue name (jaxmem gpus), 'local' or 'cpu'. Default: the attached GPU, else h100."))
    hosts: int | None = _opt(None, Flag(
        "--hosts", "Hosts the devices are spread over (default: the fewest that split the mesh evenly with at most "
        "8 GPUs each, or a cloud machine type's GPUs).", kind="count", minimum=1))
    mem_fraction: float | None = _opt(None, Flag(
        "--mem-fraction", "Share of the card JAX may use (default: from XLA_CLIENT_MEM_FRACTION, else 0.75).",
        kind="fraction", shared=False, commands=("analyze", "compare", "advise")))
    allocator: str | None = _opt(None, Flag(
        "--allocator", "The allocator the run uses, as XLA_PYTHON_CLIENT_ALLOCATOR names it: bfc (JAX's default), "
        "platform, cuda_async (default: from XLA_PYTHON_CLIENT_ALLOCATOR, else bfc).", kind="choice",
        choices=("bfc", "platform", "cuda_async"), shared=False, commands=("analyze", "compare", "advise")))
    # what the report holds (analyze's display options)
    explain: bool = _opt(True, Flag("--no-explain", "Skip decoding XLA's buffer assignment (faster; no top buffers).",
                                    kind="switch", invert=True, shared=False, commands=("analyze",)))
    top: int = _opt(10, Flag("--top", "Largest buffers live at the peak to list.", kind="count", minimum=0,
                             shared=False, commands=("analyze",), show_default=True))
    module_depth: int = _opt(3, Flag("--depth", "Module-path depth of the per-module roll-up.", kind="count",
                                     minimum=1, shared=False, commands=("analyze",), show_default=True))
    cache: bool = _opt(True, Flag("--no-cache", "Compile again instead of answering from the compile cache.",
                                  kind="switch", invert=True, shared=False, commands=("analyze", "compare")))

    @property
    def on_cpu(self) -> bool:
        """The target is XLA:CPU (--gpu cpu)."""
        return is_cpu_target(self.gpu)


@dataclasses.dataclass(frozen=True)
class FineTune:
    """The fine-tuning choices of one step (all off by default)."""

    freeze: str | None = None
    lora_rank: int = 0
    lora_targets: str | None = None
    lora_alpha: float | None = None
    base_dtype: str | None = None
    offload: str | None = None
    train_all: bool = False        # --train-all: every parameter trains, whatever the model marks

    @property
    def active(self) -> bool:
        return bool(self.freeze or self.lora_rank or self.base_dtype or self.offload or self.train_all)

    @property
    def offload_optimizer(self) -> bool:
        return self.offload == "optimizer"


@dataclasses.dataclass(frozen=True)
class StepOptions:
    """What jaxmem.program.step builds the step from (the choices resolved to the step's terms)."""

    layout: str = "fsdp"
    precision: str = "fp32"
    optimizer: str | None = None    # None: the workload's, else AdamW
    batch_size: int | None = None   # global; overrides the leading dim of every batch leaf
    accum: int = 1
    donate: bool = True
    finetune: FineTune = FineTune()
    rules: str | None = None        # --rules: the rules file's path (jaxmem.program.rules)
    axis_types: str = "auto"        # --axis-types (the workload's own wish is applied in step.plan)
    remat: str = "none"             # the policy of the checkpoints Workload.remat_at places (jaxmem.program.calls)
    pipeline: str = "gpipe"         # with a stage axis: the schedule (jaxmem.program.pipeline_stages)
    microbatches: int | None = None  # ... the pipeline's microbatches (step.plan resolves the default)
    repeats: int | None = None      # ... the circular schedule's repeats (None: one layer per stage per repeat)
    stage_remat: bool = False       # ... each stage's pass checkpointed at its input
    moment_dtype: str | None = None  # --moment-dtype: the built-in optimizers' moments (None: the parameters' dtype)
    unmapped: str = "error"         # --unmapped: a logical name no rule maps is an error, or replicated (rules.py)


def remat_problem(name: str) -> str | None:
    """Why `name` is no --remat policy (None when it is one): a REMAT_POLICIES name, or offload:NAME[,NAME]."""
    if name in REMAT_POLICIES:
        return None
    if name.startswith(OFFLOAD_PREFIX):
        names = name[len(OFFLOAD_PREFIX):].split(",")
        if all(n.strip() for n in names):
            return None
        return (f"{name!r}: offload: takes the checkpoint names of the activations to offload, e.g. "
                "offload:query_proj,key_proj,value_proj")
    close = difflib.get_close_matches(name.strip().lower(), REMAT_POLICIES, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"remat={name!r} is no checkpoint policy{hint}; known: {', '.join(REMAT_POLICIES)}, offload:NAME[,NAME]"


def offloaded_names(name: str) -> tuple[str, ...]:
    """The checkpoint names an offload:NAME,... policy sends to the host (() for any other policy)."""
    if not name.startswith(OFFLOAD_PREFIX):
        return ()
    return tuple(n.strip() for n in name[len(OFFLOAD_PREFIX):].split(","))


def offloads_activations(name: str) -> bool:
    """The --remat policy keeps saved activations in pinned host memory."""
    return name == "offload_dots" or name.startswith(OFFLOAD_PREFIX)


def split_remats(text: str) -> list[str]:
    """compare's --remats list: comma-separated policies, where the names after offload: belong to it
    (`none,offload:query_proj,key_proj,full` is three policies)."""
    out: list[str] = []
    for item in (v.strip() for v in text.split(",")):
        if out and out[-1].startswith(OFFLOAD_PREFIX) and item and item not in REMAT_POLICIES \
                and not item.startswith(OFFLOAD_PREFIX):
            out[-1] = f"{out[-1]},{item}"
        else:
            out.append(item)
    return out


def is_cpu_target(gpu: str | None) -> bool:
    """--gpu names the CPU backend (XLA:CPU: no fixed device memory, host and device one memory)."""
    return (gpu or "").strip().lower() == "cpu"


def flagged(cls=AnalyzeOptions) -> list[tuple[dataclasses.Field, Flag]]:
    """The fields of `cls` that have a flag, in declaration order."""
    return [(f, f.metadata["flag"]) for f in dataclasses.fields(cls) if "flag" in f.metadata]


def from_flags(values: dict[str, Any], **extra: Any) -> AnalyzeOptions:
    """AnalyzeOptions from the values click parsed for each field's flag (keyed by field name;
    fields a command does not have keep their defaults); `extra` overrides."""
    kw: dict[str, Any] = {}
    for f, flag in flagged():
        if f.name not in values:
            continue
        v = values[f.name]
        if flag.kind == "switch" and flag.invert:
            v = not v
        elif flag.kind == "pairs":
            v = tuple(parse_pair(a) if isinstance(a, str) else tuple(a) for a in v)
        kw[f.name] = v
    return AnalyzeOptions(**{**kw, **extra})


def parse_pair(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` as --arg takes it: numbers as numbers, true/false/none as such, else text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{text!r}: expected KEY=VALUE")
    for conv in (int, float):
        try:
            return key, conv(value)
        except ValueError:
            pass
    return key, {"true": True, "false": False, "none": None}.get(value.lower(), value)


def _pair_text(value: Any) -> str:
    """A --arg value as parse_pair reads it back (true/false/none, numbers, text)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def command_line(path: str, options: AnalyzeOptions, command: str = "analyze") -> str:
    """The exact `jaxmem <command>` line (shell-quoted) that reproduces `options` on `path`:
    every flag whose value differs from its default (and those written always), for the
    flags `command` has. tests/test_options.py round-trips it through the CLI's parser."""
    defaults = AnalyzeOptions()
    parts = ["jaxmem", command, str(path)]
    for f, flag in flagged():
        if not flag.shared and command not in flag.commands:
            continue
        value = getattr(options, f.name)
        if value == getattr(defaults, f.name) and not flag.always:
            continue
        if flag.kind == "switch":
            parts.append(flag.name)       # only a non-default value gets here: the flag given
        elif flag.kind == "pairs":
            for key, v in value:
                parts.extend([flag.name, f"{key}={_pair_text(v)}"])
        elif flag.kind in ("float", "fraction"):
            parts.extend([flag.name, repr(float(value))])
        else:
            parts.extend([flag.name, str(value)])
    return " ".join(shlex.quote(p) for p in parts)
