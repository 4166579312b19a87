"""Explain the peak: the buffers live there, by category and module, and audits that name a fix.

Input: XLA's decoded buffer assignment (``buffers.py``) and what each entry
parameter of the step is (params, optimizer state, batch...). Output: rows for
the Report.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

from jaxmem.report import BufferRow, ModuleRow, ReportWarning
from jaxmem.xla.buffers import BufferAssignment
from jaxmem.xla.categories import CATEGORIES
from jaxmem.xla.gathered import GatheredParam, gathered_param
from jaxmem.xla.opnames import primitive
from jaxmem.xla.timeline import downsample, downsampled_index

TIMELINE_POINTS = 2000  # the curve is downsampled (max per bucket) so the HTML stays small
STATE = ("params", "optimizer_state", "batch", "other_state")


@dataclasses.dataclass(frozen=True)
class Explanation:
    top: tuple[BufferRow, ...]
    modules: tuple[ModuleRow, ...]
    categories: dict[str, int]
    timeline: tuple[int, ...]
    peak_index: int
    peak_bytes: int
    warnings: tuple[ReportWarning, ...]
    # a pipelined step (jaxmem/program/pipeline_stages.py), at the peak: the activations its stage loop
    # saved for the backward pass, stacked per iteration (dimension 0 or 1 = the loop's trip count),
    # and the buffers of the stage-to-stage sends (collective permutes)
    pipeline: dict[str, int] = dataclasses.field(default_factory=dict)
    # where the backward pass begins and where the optimizer update follows it (the first index after
    # its last allocation), on `timeline`; () when the program shows no backward pass
    phases: tuple[int, ...] = ()
    # the all-gathered parameters live at the peak (gathered activations and reduced gradients are not)
    gathered_params: tuple[GatheredParam, ...] = ()
    scanned: bool = False   # the program gathers a scanned layer's parameters (gathered.GatheredParam.scanned)


def leaf_module(path: str) -> str:
    """'params:layers/attn/wq/kernel' -> 'layers/attn/wq' (the module that owns the leaf)."""
    _, _, rest = path.partition(":")
    parts = [p for p in rest.split("/") if p]
    # optax wraps the params tree: '0/mu/layers/...' -> drop the optimizer's own levels
    while parts and (parts[0].isdigit() or parts[0] in ("mu", "nu", "trace", "v_row", "v_col", "v", "inner_state")):
        parts = parts[1:]
    return "/".join(parts[:-1])


def explain(
    assignment: BufferAssignment,
    leaf_categories: Sequence[str],
    leaf_paths: Sequence[str] = (),
    *,
    top: int = 10,
    depth: int = 2,
    remat: str = "none",
    pipeline_iterations: int | None = None,
) -> Explanation:
    live = assignment.live_at_peak()
    in_flight = transfer = 0
    cats = dict.fromkeys(CATEGORIES, 0)
    rows: list[BufferRow] = []
    modules: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    gathered: list[GatheredParam] = []
    for b in live:
        cat = assignment.categorize(b, leaf_categories)
        if cat == "collectives" and (g := gathered_param(b, leaf_categories, leaf_paths)) is not None:
            gathered.append(g)
        cats[cat] = cats.get(cat, 0) + b.size
        path = b.module_path
        if cat in STATE and b.is_parameter:
            n = b.argument_index
            if 0 <= n < len(leaf_paths):
                path = leaf_module(leaf_paths[n])
        if cat in STATE:
            key = f"[{cat}]"
        elif path:
            key = "/".join(path.split("/")[:depth])
        else:  # XLA-made or outside any module scope (e.g. the bf16 casts of the params): name the op
            key = f"(no module: {primitive(b.op_name) or b.opcode or 'unknown'})"
        modules[key][0] += b.size
        modules[key][1] += 1
        if pipeline_iterations and cat not in STATE:
            # stacked per iteration: the trip count leads, or comes second where XLA transposed the stack
            if len(b.shape) >= 3 and pipeline_iterations in tuple(b.shape[:2]):
                in_flight += b.size
            elif "collective-permute" in (b.opcode or ""):
                transfer += b.size
        rows.append(BufferRow(b.size, str(tuple(b.shape)), b.dtype, path, cat, b.instruction, b.op_name))
    rows.sort(key=lambda r: -r.size)
    mods = sorted((ModuleRow(k, v[0], v[1]) for k, v in modules.items()), key=lambda m: -m.bytes)
    return Explanation(
        top=tuple(rows[:top]),
        modules=tuple(mods),
        categories=cats,
        timeline=downsample(assignment.timeline, TIMELINE_POINTS),
        peak_index=downsampled_index(assignment.peak_index, len(assignment.timeline), TIMELINE_POINTS),
        peak_bytes=int(assignment.peak_bytes),
        warnings=tuple(audits(cats, remat, int(assignment.peak_bytes))),
        pipeline={"activations_in_flight": in_flight, "transfers": transfer} if pipeline_iterations else {},
        phases=phases(assignment),
        gathered_params=tuple(sorted(gathered, key=lambda g: -g.size)),
        scanned=any(b.source_scanned and gathered_param(b, leaf_categories, leaf_paths) for b in assignment.buffers),
    )


def phases(assignment) -> tuple[int, ...]:
    """(backward starts, optimizer update starts) on the downsampled timeline, from the backward
    span (jaxmem.xla.timeline.backward_span); () without one."""
    start, end = assignment.backward_start, assignment.backward_end
    n = len(assignment.timeline)
    if start is None or end is None or not n:
        return ()
    return (downsampled_index(start, n, TIMELINE_POINTS), downsampled_index(min(end + 1, n - 1), n, TIMELINE_POINTS))


def audits(cats: dict[str, int], remat: str, peak: int) -> list[ReportWarning]:
    """Patterns at the peak that have a known fix, each with its byte cost."""
    out = []
    acts = cats.get("activations", 0)
    if remat != "none" and acts > 0.4 * peak:
        # under --remat full the policy saves nothing it could drop: never advise the flag already given
        fix = ("what --remat full leaves is outside the checkpointed layers (or in layers it does not reach: "
               "--remat-at BLOCK names them); gradient accumulation (--accum) or a smaller batch saves less"
               if remat == "full" else "the policy saves more than it should; try --remat full (saves only layer "
               "inputs)")
        out.append(ReportWarning(
            "remat_saves_too_much",
            f"with --remat {remat}, {acts / peak:.0%} of the peak is still activations saved for the backward "
            f"pass: {fix}", acts))
    return out


def check_gradients_split(explained: bool, temp: int, gradients: int) -> list[ReportWarning]:
    """gradients_not_split: without the buffer assignment (--no-explain) nothing tells how much of
    XLA's temporaries are gradients; all of them stay activations_and_temporaries."""
    if explained or not gradients:
        return []
    return [ReportWarning(
        "gradients_not_split", f"--no-explain: XLA's temporaries ({temp / 2**20:,.2f} MiB) are not split into "
        f"gradients (at most {gradients / 2**20:,.2f} MiB, if all were live at once) and activations; all of "
        "them are under activations_and_temporaries. Drop --no-explain to split them.")]
