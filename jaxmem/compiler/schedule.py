"""XLA:GPU's scheduler as the compiled program shows it: the memory limit it holds a step to, whether it
ran at all, and which collectives it left with nothing to hide behind; with the report's two warnings
about them (schedule_memory_limited, collectives_not_overlapped).

The step-time estimate (:mod:`jaxmem.compiler.steptime`) already follows XLA's schedule; this module says
why communication shows when it does, and what to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxmem.compiler import rates, targets
from jaxmem.report import ReportWarning
from jaxmem.xla import hlo_text
from jaxmem.xla.collectives import KINDS, Collective

# XLA:GPU's latency-hiding scheduler holds each step to a memory limit (openxla xla/service/gpu/
# gpu_hlo_schedule.cc, GetSchedulerMemoryLimit): a base -- the module's device_memory_size, which a JAX run
# sets to its allocator's pool, else 80% of the device's memory -- less the step's inputs and outputs (an
# aliased output counted once), times --xla_gpu_memory_limit_slop_factor / 100 (default 95,
# xla/debug_options_flags.cc). A step whose temporaries exceed it gets no collective started early where
# that would hold more memory: its communication runs beside no compute. jaxmem compiles with the run's
# base (targets.xla_device_memory).
SCHEDULER_MEMORY_SHARE = targets.XLA_BASE_PERCENT / 100
DEFAULT_SLOP_FACTOR = 95


def _flag(xla_flags: str, name: str) -> str | None:
    """The value XLA_FLAGS gives --`name` (the last one wins, as in XLA; a bare boolean flag is "true")."""
    value = None
    for f in (xla_flags or "").split():
        key, eq, raw = f.partition("=")
        if key == f"--{name}":
            value = raw if eq else "true"
    return value


def slop_factor(xla_flags: str) -> int:
    """--xla_gpu_memory_limit_slop_factor as XLA_FLAGS sets it, else XLA's default."""
    raw = _flag(xla_flags, "xla_gpu_memory_limit_slop_factor")
    return int(raw) if raw and raw.isdigit() else DEFAULT_SLOP_FACTOR


def scheduler_memory_limit(memory_bytes: int, io_bytes: int, slop: int = DEFAULT_SLOP_FACTOR) -> int:
    """The bytes XLA's GPU scheduler allows a step's temporaries on a card of `memory_bytes` (no module
    device_memory_size set: a deviceless compile told the card's size)."""
    return int((SCHEDULER_MEMORY_SHARE * memory_bytes - io_bytes) * slop / 100)


def limit_from_base(base_bytes: int, io_bytes: int, slop: int = DEFAULT_SLOP_FACTOR) -> int:
    """The bytes XLA allows a step's temporaries once its base is known (targets.xla_base of the compile's
    device memory: the run's pool, or 80% of the card)."""
    return int((base_bytes - io_bytes) * slop / 100)


LHS_FLAG = "--xla_gpu_enable_latency_hiding_scheduler=true"
# The compute capabilities whose deviceless compile overlaps collectives without LHS_FLAG. Measured, not read
# from XLA (its flag defaults to false, debug_options_flags.cc): the tiny Llama at --mesh fsdp=4 --batch 8,
# jax 0.9.0, 0.10.2 and 0.12, hides its collectives on h100, h100-pcie, h200 (9.0), b200 and gb200 (10.0) and
# leaves every one alone on a100-80g (8.0), a10g and rtx-3090 (8.6), rtx-4090 and l40s (8.9), rtx-5090 (12.0).
LHS_BY_DEFAULT_MAJOR = frozenset({9, 10})


def lhs_by_default(gpu: str) -> bool:
    """Whether XLA overlaps collectives on this catalogue target without LHS_FLAG (True off the catalogue:
    no claim is made there)."""
    spec = targets.CATALOGUE.get(gpu)
    return spec is None or spec.compute_capability[0] in LHS_BY_DEFAULT_MAJOR


def scheduler_ran(gpu: str, xla_flags: str) -> bool:
    """Whether the compile ran XLA's latency-hiding scheduler: XLA_FLAGS asked for it, or the target
    runs it unasked (lhs_by_default)."""
    raw = _flag(xla_flags, "xla_gpu_enable_latency_hiding_scheduler")
    return raw in ("true", "1") if raw is not None else lhs_by_default(gpu)


def check_collectives_not_overlapped(step_time: Mapping[str, Any], ran: bool) -> list[ReportWarning]:
    """collectives_not_overlapped: XLA's latency-hiding scheduler did not run (`ran`: scheduler_ran), at
    least 90% of the collectives' time runs with no kernel beside it and at least 10% of the estimate is
    exposed communication. Where the scheduler ran, collectives alone are the program's own (nothing to
    overlap them with) or memory's (schedule_memory_limited): the flag would change nothing."""
    if ran or not step_time.get("available") or "unoverlapped_collective_s" not in step_time:
        return []
    exposed, step, busy = (step_time["exposed_communication_s"], step_time["estimate_s"],
                           step_time["communication_s"])
    alone = step_time["unoverlapped_collective_s"]
    if exposed < 0.1 * step or not busy or alone < 0.9 * busy:
        return []
    return [ReportWarning(
        "collectives_not_overlapped",
        f"XLA scheduled {alone / busy:.0%} of the step's collective time with no kernel beside it, so {exposed:.3g} "
        f"s of the {step:.3g} s estimate is communication beside no compute. Its latency-hiding scheduler, which "
        "overlaps collectives with compute, runs only where XLA turns it on (measured at jax 0.9-0.12: on for the "
        "H100, H200, B200 and GB200 targets, off for the A100, the Ampere and Ada cards and the RTX 5090); set "
        f"XLA_FLAGS={LHS_FLAG}, as the public GPU recipes do, and analyze again to see the step with its "
        "collectives overlapped")]


def check_memory_limited_schedule(step_time: Mapping[str, Any], temp: int, io_bytes: int,
                                  base_bytes: int | None, xla_flags: str, ran: bool = True) -> list[ReportWarning]:
    """schedule_memory_limited: the step's temporaries exceed XLA's scheduler memory limit and at least
    10% of the estimate is collectives with no kernel beside them: the step time is of that schedule,
    slower than the same collectives hidden once the step is under the limit. `base_bytes`: what XLA budgeted
    from in this compile, the run's (the allocator's pool a run's compile is given: jaxlib's
    set_device_memory_size; 80% of the card under the platform allocator). Not where the scheduler did not run
    at all (`ran`: scheduler_ran; collectives_not_overlapped's case)."""
    if not ran or not base_bytes or not step_time.get("available") or "unoverlapped_collective_s" not in step_time:
        return []
    slop = slop_factor(xla_flags)
    limit = limit_from_base(base_bytes, io_bytes, slop)
    exposed, step = step_time["exposed_communication_s"], step_time["estimate_s"]
    if temp <= limit or step_time["unoverlapped_collective_s"] < 0.1 * step:
        return []
    return [ReportWarning(
        "schedule_memory_limited",
        f"the step's temporaries ({temp / 2**30:,.2f} GiB per device) exceed the memory XLA's scheduler allowed "
        f"them ({max(limit, 0) / 2**30:,.2f} GiB: the {base_bytes / 2**30:,.2f} GiB XLA budgets from in the run "
        f"(its allocator's pool) less the step's inputs and outputs, {io_bytes / 2**30:,.2f} GiB, "
        f"x {slop}% (--xla_gpu_memory_limit_slop_factor)), so it held back collectives that would have needed "
        f"more memory: {exposed:.3g} s of the {step:.3g} s estimate is communication beside no compute. The "
        "step time is of this schedule; a change that brings the temporaries under the limit (remat, more "
        "sharding, a smaller batch) lets the same collectives hide behind compute, so compare step times among "
        "layouts under it")]


def unoverlapped_collective_seconds(module: hlo_text.Module, colls: list[Collective], ks: list, perf,
                                    r: rates.Rates, devices_per_host: int) -> float:
    """Busy seconds per step of the collectives XLA scheduled with nothing to hide behind: synchronous ones,
    and async ones with no kernel or loop between their ``*-start`` and ``*-done`` (without a latency-hiding
    schedule XLA converts collectives to async pairs and leaves each done right after its start)."""
    kernels = {(k.computation, k.name) for k in ks if k.klass != "collective"}
    alone: set[tuple[str, str]] = set()
    for cname, comp in module.computations.items():
        open_starts: dict[str, bool] = {}          # start -> whether compute was scheduled since
        for ins in comp.instructions:
            key = (cname, ins.name)
            if ins.opcode.endswith("-start") and ins.opcode != "fusion-start":
                open_starts[ins.name] = False
            elif ins.opcode.endswith("-done"):
                ops = ins.operand_names
                if ops and ops[0] in open_starts and not open_starts.pop(ops[0]):
                    alone.add((cname, ops[0]))
            elif key in kernels or ins.opcode in ("while", "conditional", "call"):
                open_starts = dict.fromkeys(open_starts, True)
        alone.update((cname, i.name) for i in comp.instructions if i.opcode in KINDS)   # synchronous ones
    return sum((rates.collective_time(c, perf, r, devices_per_host, r.nvls)[0] * c.count_in_loop for c in colls
                if (c.computation, c.name) in alone), 0.0)
