"""Side-by-side analysis of a grid of choices: layouts, remat, precisions, batch sizes.

Each cell is a full `analyze` (its own compile); the grid is the cartesian
product of the axes the user varies, everything else as in `analyze`.
"""

from __future__ import annotations

import dataclasses
import itertools

from jaxmem.analyze import AnalyzeOptions, analyze_workload
from jaxmem.errors import UserError
from jaxmem.report import Report
from jaxmem.program.workload import load_workload

# option name in AnalyzeOptions -> how a comma-separated value is parsed
AXES = {"layout": str, "remat": str, "precision": str, "batch": int, "optimizer": str, "mesh": str, "gpu": str}


@dataclasses.dataclass(frozen=True)
class Cell:
    choice: dict[str, object]
    report: Report | None
    error: str | None = None
    max_batch: int | None = None     # with find_batch: the largest global batch that fits (0: none)
    max_batch_capped: bool = False   # the search stopped at its limit: at least max_batch fits


def grid(spec: dict[str, str | None]) -> list[dict[str, object]]:
    """{'layout': 'dp,fsdp', 'remat': 'none,full'} -> every combination."""
    axes = []
    for name, text in spec.items():
        if text is None:
            continue
        conv = AXES[name]
        values = [v.strip() for v in text.split(";" if name == "mesh" else ",") if v.strip()]
        try:
            axes.append([(name, conv(v)) for v in values])
        except ValueError:
            raise UserError(f"--{name} {text!r}: expected comma-separated values") from None
    return [dict(combo) for combo in itertools.product(*axes)] if axes else [{}]


def compare(path: str, base: AnalyzeOptions, spec: dict[str, str | None], find_batch: bool = False) -> list[Cell]:
    cells = []
    # The model file is imported once per remat policy (the model applies it).
    workloads = {}
    for choice in grid(spec):
        opts = dataclasses.replace(base, **choice)
        if opts.remat not in workloads:
            workloads[opts.remat] = load_workload(path, remat=opts.remat, **dict(opts.model_args))
        try:
            wl = workloads[opts.remat]
            if find_batch:
                best, capped, report = largest_batch(wl, opts, path)
                cells.append(Cell(choice, report, max_batch=best, max_batch_capped=capped))
            else:
                cells.append(Cell(choice, analyze_workload(wl, opts, source=path)))
        except UserError as e:  # one impossible cell (e.g. tp without a model axis) is a row, not a failure
            cells.append(Cell(choice, None, str(e)))
    if all(c.report is None for c in cells):
        raise UserError(cells[0].error)
    return cells


def largest_batch(wl, opts: AnalyzeOptions, path: str, limit: int = 1 << 16) -> tuple[int, bool, Report]:
    """The largest global batch that fits, a multiple of the data-parallel devices (0: none fits);
    whether the search stopped at `limit` samples (then at least that many fit); and the
    analysis at that batch (at the smallest batch when none fits).

    Peak memory grows with the batch, so: double from one sample per device until it
    does not fit, then bisect. Each probe is a full compile (without the explanation).
    """
    from jaxmem.program import layouts

    unit = layouts.parse_mesh(opts.mesh).data_size * opts.accum
    probes: dict[int, Report] = {}

    def fits(n_units: int) -> bool:
        r = probes[n_units] = analyze_workload(wl, dataclasses.replace(opts, batch=n_units * unit, explain=False),
                                               source=path)
        if r.fits is None:
            raise UserError("finding the largest batch needs a GPU target with fixed memory, not --gpu cpu")
        return r.fits

    if not fits(1):
        return 0, False, probes[1]
    lo, hi = 1, 2
    while hi * unit <= limit and fits(hi):
        lo, hi = hi, hi * 2
    capped = hi * unit > limit
    while not capped and hi - lo > 1:  # fits(lo) and not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * unit, capped, probes[lo]
