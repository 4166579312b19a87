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
from jaxmem.workload import load_workload

# option name in AnalyzeOptions -> how a comma-separated value is parsed
AXES = {"layout": str, "remat": str, "precision": str, "batch": int, "optimizer": str, "mesh": str, "gpu": str}


@dataclasses.dataclass(frozen=True)
class Cell:
    choice: dict[str, object]
    report: Report | None
    error: str | None = None


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


def compare(path: str, base: AnalyzeOptions, spec: dict[str, str | None]) -> list[Cell]:
    cells = []
    # The model file is imported once per remat policy (the model applies it).
    workloads = {}
    for choice in grid(spec):
        opts = dataclasses.replace(base, **choice)
        if opts.remat not in workloads:
            workloads[opts.remat] = load_workload(path, remat=opts.remat, **dict(opts.model_args))
        try:
            cells.append(Cell(choice, analyze_workload(workloads[opts.remat], opts, source=path)))
        except UserError as e:  # one impossible cell (e.g. tp without a model axis) is a row, not a failure
            cells.append(Cell(choice, None, str(e)))
    if all(c.report is None for c in cells):
        raise UserError(cells[0].error)
    return cells
