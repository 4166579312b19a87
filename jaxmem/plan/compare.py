"""Side-by-side analyses of a grid of choices (layouts, remat, precisions, batches, meshes, GPUs),
and fit searches per row (the largest batch / sequence length, the fewest devices that fit).

Each row is a full ``analyze`` -- the explanation included, so a row splits memory exactly as
``jaxmem analyze`` does for the same options -- run on a planner's runner (`jaxmem.plan.runner`:
worker processes, this process or Ray), answered from the compile cache when it holds the compile.
A row that fails (a user error, an XLA error, a worker that died) is an error row; the other rows
are kept.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import os
from collections.abc import Callable
from typing import Any

from jaxmem import display, files, pipeline
from jaxmem.analysis.stages import OFFLOAD_ON_CPU
from jaxmem.errors import UserError, clip
from jaxmem.plan import meshes
from jaxmem.plan import runner as runner_mod
from jaxmem.plan import search as search_mod
from jaxmem.plan import throughput as throughput_mod
from jaxmem.program import layouts, rules
from jaxmem.program.options import AnalyzeOptions, split_remats
from jaxmem.report import BREAKDOWN_KEYS, VERDICT_TEXT, Report, verdict_of
from jaxmem.units import fmt_bytes

# option name in AnalyzeOptions -> how a comma-separated value is parsed
AXES: dict[str, Callable[[str], Any]] = {
    "layout": str, "remat": str, "precision": str, "batch": lambda v: _grid_whole(v, 1), "optimizer": str,
    "mesh": str, "gpu": str,
    "lora_rank": lambda v: _grid_whole(v, 0), "base_dtype": lambda v: None if v.lower() == "none" else v, "rules": str,
    "microbatches": lambda v: None if v.lower() in ("none", "default") else _grid_whole(v, 1),
    "pair": lambda v: _pair(v)}
GRID_OPTIONS = {"layout": "--layouts", "remat": "--remats", "precision": "--precisions", "batch": "--batches",
                "optimizer": "--optimizers", "mesh": "--meshes", "gpu": "--gpus", "lora_rank": "--loras",
                "base_dtype": "--base-dtypes", "rules": "--rules", "microbatches": "--microbatches", "pair": "--pair"}
# a grid this large starts only when asked (--yes, yes=True): it says first how long it expects to take
CONFIRM_ROWS = 200
# one row of a real model, compiled on one core: benchmarks/results/planning.md's 8-row GPT-2 XL sweep,
# --jobs 1, took 230 s (29 s a row); a fit search compiles about 4 times per row (the same table)
ROW_SECONDS, SEARCH_COMPILES = 29.0, 4
BATCH_LIMIT = 1 << 16      # samples: a batch search stops here (the answer says "at least")
SEQ_LIMIT = 1 << 20        # tokens: a sequence-length search stops here
DEVICES_LIMIT = 4096       # the largest data-parallel size a devices search tries


@dataclasses.dataclass(frozen=True)
class Find:
    """What a fit search looks for, per row."""

    kind: str                       # batch | seq | devices
    arg: str | None = None          # kind == "seq": the workload argument searched (e.g. seq_len)
    granule: int | None = None      # kind == "seq": the step between values tried (default 1)
    margin: float = search_mod.DEFAULT_MARGIN


@dataclasses.dataclass(frozen=True)
class Cell:
    choice: dict[str, object]
    report: Report | None
    error: str | None = None
    status: str = "ok"                                  # ok | user_error | failed
    search: search_mod.SearchResult | None = None
    # 1-based among the rows that fit, by throughput per device (ranked(); equal for ties), None otherwise
    rank: int | None = None

    @property
    def throughput(self) -> throughput_mod.Throughput | None:
        """Tokens (or samples) per second per device at the row's estimated step time."""
        return throughput_mod.of(self.report)

    @property
    def max_batch(self) -> int | None:
        return self.search.answer if self.search is not None and self.search.kind == "batch" else None

    @property
    def max_batch_capped(self) -> bool:
        return bool(self.search is not None and self.search.kind == "batch" and self.search.capped)

    def to_json(self) -> dict:
        """This row as `jaxmem compare --json` prints it."""
        return row_json(self)


class Rows(list):
    """The rows (Cells, in grid order) as the Python API returns them: a list, with the JSON that
    `jaxmem compare --json` prints, and a table in a notebook."""

    def to_json(self) -> list[dict]:
        return to_json(self)

    def _repr_html_(self) -> str | None:
        return display.html("rows", self)


def _grid_whole(text: str, minimum: int) -> int:
    """A grid's whole number, refused as analyze's option is (click's IntRange: "0 is not in the range x>=1")."""
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a valid integer.") from None
    if n < minimum:
        raise ValueError(f"{n} is not in the range x>={minimum}.")
    return n


def _pair(text: str) -> tuple[str, str]:
    """`fsdp:data=4,model=2` -> ("fsdp", "data=4,model=2"): one row's layout and mesh (--pair)."""
    layout, sep, mesh = text.partition(":")
    if not sep or not layout.strip() or not mesh.strip():
        raise ValueError("expected LAYOUT:MESH, e.g. dp:data=8 or fsdp_tp:data=4,model=2")
    return layout.strip(), mesh.strip()


def grid(spec: dict[str, str | None], *, yes: bool = True, n_jobs: int | None = None,
         search: bool = False) -> list[dict[str, Any]]:  # AnalyzeOptions field -> value
    """{'layout': 'dp,fsdp', 'remat': 'none,full'} -> every combination. `pair`: (layout, mesh) pairs
    ('dp:data=8;tp:model=8', ';' between pairs) that enter the product as one axis, instead of
    --layouts x --meshes. Every value is checked before any row compiles (a UserError naming the
    option and the value); a grid of more than CONFIRM_ROWS rows is a UserError saying how long it
    would take, unless `yes`."""
    if spec.get("pair") is not None:
        both = [GRID_OPTIONS[k] for k in ("layout", "mesh") if spec.get(k) is not None]
        if both:
            raise UserError(f"--pair gives each row its layout and mesh: drop {' and '.join(both)}, or drop --pair "
                            "and compare every layout on every mesh")
    axes: list[list[tuple[tuple[str, Any], ...]]] = []
    for name, text in spec.items():
        if text is None:
            continue
        conv = AXES[name]
        parts = split_remats(text) if name == "remat" else text.split(";" if name in ("mesh", "pair") else ",")
        values = [v.strip() for v in parts if v.strip()]
        try:
            if name == "pair":
                axes.append([(("layout", lay), ("mesh", mesh)) for lay, mesh in map(conv, values)])
            else:
                axes.append([((name, conv(v)),) for v in values])
        except ValueError as e:
            why = (str(e) if "range" in str(e) or "integer" in str(e) or name == "pair"
                   else "expected comma-separated values")
            raise UserError(f"{GRID_OPTIONS[name]} {clip(text)}: {why}") from None
    n = math.prod(len(a) for a in axes)
    if n > CONFIRM_ROWS and not yes:
        raise UserError(_too_many(n, n_jobs, search))
    rows = [dict(kv for item in combo for kv in item) for combo in itertools.product(*axes)] if axes else [{}]
    return _finetune_rows(rows)


def _too_many(n: int, n_jobs: int | None, search: bool) -> str:
    jobs = n_jobs or os.cpu_count() or 1
    seconds = n * ROW_SECONDS * (SEARCH_COMPILES if search else 1) / jobs
    span = f"{seconds / 3600:.1f} hours" if seconds >= 3600 else f"{seconds / 60:.0f} minutes"
    per = f" x {SEARCH_COMPILES} compiles per fit search" if search else ""
    return (f"this grid is {n:,} rows: at about {ROW_SECONDS:.0f} s a row of a real model per worker (a GPT-2 XL row "
            f"compiled on one core, benchmarks/results/planning.md){per} on {jobs} worker{'s' if jobs != 1 else ''}, "
            f"about {span} (less for rows the compile cache holds); add --yes (yes=True in Python) to start it, or "
            "narrow the grid")


def _finetune_rows(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """A base dtype is the storage of a LoRA run's frozen base: a row without LoRA (lora_rank 0,
    a full fine-tune) has none, so `--loras 0,16 --base-dtypes bf16,nf4` gives one full row, not two."""
    out: list[dict[str, object]] = []
    seen: set[tuple] = set()   # grid values are text, numbers or None: hashable, and a set keeps this linear
    for row in rows:
        if row.get("lora_rank") == 0 and row.get("base_dtype") is not None:
            row = {**row, "base_dtype": None}
        key = tuple(row.items())
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def _remat_at_block(path: str, rows: list[tuple[dict, AnalyzeOptions]]) -> list[tuple[dict, AnalyzeOptions]]:
    """Rows that rematerialize, on a model without a remat hook of its own: checkpointed at its
    repeated block (--remat-at, found by tracing the step once), as advise does."""
    wants = [o for _, o in rows if o.remat != "none" and o.remat_at is None]
    if not wants:
        return rows

    block = pipeline.remat_block(path, wants[0])
    if block is None:
        return rows
    return [(c, dataclasses.replace(o, remat_at=block) if o.remat != "none" and o.remat_at is None else o)
            for c, o in rows]


def shown(choice: dict[str, object]) -> dict[str, str]:
    """A row's choices as its labels show them: a value left to its default (None: --microbatches
    default, --base-dtypes none) reads "default"; a full fine-tune's base dtype, which it does not
    have (lora_rank 0), is left out."""
    return {k: "default" if v is None else str(v) for k, v in choice.items()
            if not (k == "base_dtype" and v is None and choice.get("lora_rank") == 0)}


def label(choice: dict[str, object]) -> str:
    return " ".join(f"{k}={v}" for k, v in shown(choice).items()) or "row"


def searched_at(c: Cell) -> str:
    """What a searched row's report was compiled at (`batch=448`): its answer, or the first value
    tried when none fits; "" for a row without a search or a report."""
    s, r = c.search, c.report
    if s is None or r is None:
        return ""
    if s.kind == "batch":
        return f"batch={r.options.get('batch')}"
    if s.kind == "seq":
        options: dict[str, Any] = dict(r.options)   # the model's arguments are "arg:NAME" keys
        return f"{s.arg}={options.get(f'arg:{s.arg}')}"
    # the axis a devices search grows: the mesh's first that splits the batch (as RowSearch.what names it)
    roles: dict[str, Any] = dict(r.mesh_roles)
    grown = next((n for n, _ in r.mesh if "batch" in (roles.get(n) or {}).get("splits", ())), r.mesh[0][0])
    return f"{grown}={dict(r.mesh)[grown]}"


def row_label(c: Cell) -> str:
    """The row's label wherever it is shown: its choices, and for a fit search the value its report is
    at (rows of a search are compared each at its own batch, sequence or size)."""
    at = searched_at(c)
    base = label(c.choice)
    return f"{base} at {at}" if at and base != "row" else (at or base)


def ranked(cells: list[Cell]) -> list[Cell]:
    """The cells with their `rank`: by throughput per device (tokens/s, or samples/s for a batch
    without a sequence: jaxmem.plan.throughput) at the estimated step time, 1 the highest, among the
    rows that fit (verdict fits or tight); rows whose throughput bands overlap are tied and share the
    rank of the higher one. A row that does not fit, failed, or has no step-time estimate: None."""
    tps = [c.throughput if getattr(c.report, "fits", None) is True else None for c in cells]
    return [dataclasses.replace(c, rank=r) for c, r in zip(cells, throughput_mod.ranks(tps), strict=True)]


def in_rank_order(cells: list[Cell]) -> list[Cell]:
    """The rows as the table and the pictures list them (ranked()): the ranked rows, highest throughput
    first (a tied row after the row whose rank it shares); then the rows that fit without a rank (no
    step-time estimate), then those that do not fit, each smallest peak first; the errors last."""
    cells = ranked(cells)
    unit = throughput_mod.unit_of([c.throughput for c in cells])

    def key(c: Cell) -> tuple:
        rate = throughput_mod.per_s_in(c.throughput, unit) if c.rank is not None else None
        return (c.report is None, c.rank is None, getattr(c.report, "fits", None) is not True, c.rank or 0,
                -(rate or 0.0), c.report.per_device_peak_bytes if c.report is not None else 0)
    return sorted(cells, key=key)


def compare(path: str, base: AnalyzeOptions, spec: dict[str, str | None], *, find: Find | None = None,
            n_jobs: int | None = None, executor: str = "local", ray_address: str | None = None,
            progress: bool = True, on_row: Callable[[Cell], None] | None = None,
            find_batch: bool = False, yes: bool = False) -> list[Cell]:
    """One Cell per grid row, in grid order. `on_row` sees each row as it finishes.
    (`find_batch=True` is `find=Find("batch")`.) `yes`: start a grid of more than CONFIRM_ROWS rows."""
    if find_batch and find is None:
        find = Find("batch")
    choices = grid(spec, yes=yes, n_jobs=n_jobs, search=find is not None)
    rows = _remat_at_block(path, [(choice, dataclasses.replace(base, **choice)) for choice in choices])
    for _, opts in rows:
        _check(opts, find)
    if find is not None:
        cells = _search_rows(path, rows, find, n_jobs, executor, ray_address, progress, on_row)
    else:
        slots: list[Cell | None] = [None] * len(rows)

        def done(i: int, out: runner_mod.Outcome) -> None:
            cell = slots[i] = Cell(rows[i][0], out.report, out.error, out.status)
            if on_row is not None:
                on_row(cell)

        runner_mod.prepare(opts for _, opts in rows)
        run = runner_mod.open_runner(path, n_jobs, executor, ray_address, bar=progress, what="rows", count=len(rows))
        try:
            runner_mod.run_all(run, [(label(choice), opts) for choice, opts in rows], done)
        finally:
            run.close()
        cells = [c for c in slots if c is not None]
    if all(c.report is None for c in cells):
        raise UserError(cells[0].error)
    return ranked(cells)


def _check(opts: AnalyzeOptions, find: Find | None) -> None:
    """User errors that need no compile, before any worker starts."""

    layouts.parse_mesh(opts.mesh, opts.axis_roles)   # a mesh with an axis without a role: exit 2 before any worker
    for flag, value, least in (("--microbatches", opts.microbatches, 1), ("--repeats", opts.repeats, 1),
                               ("--batch", opts.batch, 1), ("--accum", opts.accum, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise UserError(f"--{flag.lstrip('-')} {value}: {value} is not in the range x>={least}.")
    if opts.rules:
        rules.load(opts.rules)   # a file that cannot be read or parsed: exit 2 before any worker
    if opts.offload is not None and opts.on_cpu:
        raise UserError(OFFLOAD_ON_CPU)
    if find is None:
        return
    if not 0 <= find.margin < 1:
        raise UserError(f"--margin {find.margin}: the share of usable memory kept free must be in [0, 1)")
    if opts.on_cpu:
        raise UserError(f"--find-{find.kind} needs a GPU target with fixed memory, not --gpu cpu")
    if find.kind == "batch" and opts.batch is not None:
        raise UserError("--find-batch searches the batch: drop --batch/--batches")
    if find.kind == "seq":
        if not find.arg:
            raise UserError("--find-seq needs the workload argument to search, e.g. --find-seq seq_len")
        if any(k == find.arg for k, _ in opts.model_args):
            raise UserError(f"--find-seq {find.arg} searches that argument: drop --arg {find.arg}=...")
    if find.kind == "devices":
        if opts.batch is None:
            raise UserError("--find-devices needs --batch N: the global batch the devices must hold")
        if opts.batch % (opts.accum * meshes.other_batch(opts.mesh, opts.axis_roles)):
            raise UserError(f"--batch {opts.batch} is not a multiple of --accum {opts.accum} x the other data axes")


class RowSearch:
    """One row's fit search: its candidates, probes and in-flight jobs (the explorer's fit runs one too)."""

    def __init__(self, i: int, choice: dict, opts: AnalyzeOptions, find: Find):
        self.i, self.choice, self.opts, self.find = i, choice, opts, find
        mesh = layouts.parse_mesh(opts.mesh, opts.axis_roles)
        if find.kind == "batch":
            # a pipelined row splits each data shard into its microbatches (default: one per stage)
            stage = mesh.axis_size(mesh.axis_of("stage"))
            self.granule = mesh.data_size * opts.accum * (opts.microbatches or stage)
            count = max(1, BATCH_LIMIT // self.granule)
            self.search = search_mod.Search(lambda k: (k + 1) * self.granule, count, float, degree=1, first=(0, 15))
        elif find.kind == "seq":
            # a context axis splits the sequence: every length tried must be a multiple of it
            self.granule = math.lcm(find.granule or 1, mesh.axis_size(mesh.context_axis))
            count = max(1, SEQ_LIMIT // self.granule)
            # quadratic: attention scores grow with the square of the sequence
            self.search = search_mod.Search(lambda k: (k + 1) * self.granule, count, float, degree=2,
                                            first=(0, 3, 15))
        else:
            self.granule = 0
            assert opts.batch is not None  # (_check: --find-devices needs --batch)
            per = opts.batch // (opts.accum * meshes.other_batch(opts.mesh, opts.axis_roles))
            self.values = sorted(search_mod.divisors(per, DEVICES_LIMIT), reverse=True)
            self.search = search_mod.Search(lambda k: self.values[k], len(self.values), lambda d: 1.0 / d,
                                            degree=1, first=(0, 3))
        self.probes: dict[int, search_mod.Probe] = {}
        self.reports: dict[int, Report] = {}
        self.inflight: set[int] = set()
        self.cached = 0
        self.error: tuple[str, str] | None = None     # (status, message)

    def value(self, k: int) -> int:
        return self.search.candidates(k)

    def options(self, k: int) -> AnalyzeOptions:
        v = self.value(k)
        if self.find.kind == "batch":
            return dataclasses.replace(self.opts, batch=v)
        if self.find.kind == "seq":
            assert self.find.arg is not None  # (_check: --find-seq names the argument)
            return dataclasses.replace(self.opts, model_args=self.opts.model_args + ((self.find.arg, v),))
        return dataclasses.replace(self.opts, mesh=meshes.with_data_size(self.opts.mesh, v, self.opts.axis_roles))

    def what(self, k: int) -> str:
        v = self.value(k)
        grown = (layouts.parse_mesh(self.opts.mesh, self.opts.axis_roles).batch_axes
                 or ("data",))[0]   # the axis a devices search grows
        return {"batch": f"batch={v}", "seq": f"{self.find.arg}={v}", "devices": f"{grown}={v}"}[self.find.kind]

    def record(self, k: int, out: runner_mod.Outcome) -> None:
        if self.error is not None:
            return
        if out.status == "ok":
            r = out.report
            assert r is not None  # (an "ok" outcome carries its report)
            if r.target.usable_bytes is None:
                self.error = ("user_error", f"--find-{self.find.kind} needs a GPU target with fixed memory")
                return
            ok = search_mod.fits_with_margin(r.per_device_peak_bytes, r.target.usable_bytes, self.find.margin)
            cached = bool(r.timings.get("cache_hit"))
            self.cached += cached
            self.probes[k] = search_mod.Probe(self.value(k), r.per_device_peak_bytes, r.target.usable_bytes, ok, cached)
            self.reports[k] = r
            budget = int(r.target.usable_bytes * (1.0 - self.find.margin))
            self.search.record(k, r.per_device_peak_bytes, ok, budget)
        elif out.status == "user_error" and "could not fit the program at compile time" in (out.error or ""):
            self.probes[k] = search_mod.Probe(self.value(k), None, None, False)
            self.search.record(k, None, False, None)
        elif out.status == "user_error" and k != 0:
            # The workload refuses a larger value (a sequence beyond its position table): a bound
            # the answer cannot pass, shown as the proof's second half with the workload's reason.
            self.probes[k] = search_mod.Probe(self.value(k), None, None, False, error=out.error)
            self.search.record(k, None, False, None)
        else:
            self.error = (out.status, f"at {self.what(k)}: {out.error}")

    def cell(self) -> Cell:
        if self.error is not None:
            return Cell(self.choice, None, self.error[1], self.error[0])
        res = search_mod.result(self.find.kind, self.find.arg, self.search, self.probes, self.granule,
                                self.find.margin, self.cached)
        lo, hi = self.search.bounds()
        at = lo if lo >= 0 else (hi if hi is not None else 0)
        return Cell(self.choice, self.reports.get(at), None, "ok", res)


class RowSearches:
    """The fit searches of many rows as one strategy (jaxmem.plan.runner.drive): each row's next probes as soon
    as its last ones landed; a row is done when its search proposes nothing more (`on_done(i, cell)`)."""

    def __init__(self, searches: list[RowSearch], on_done: Callable[[int, Cell], None] | None = None):
        self.searches = searches
        self.cells: list[Cell | None] = [None] * len(searches)
        self._fresh = list(searches)
        self._on_done = on_done

    def propose(self) -> list[tuple[str, AnalyzeOptions, tuple[RowSearch, int]]]:
        out = []
        fresh, self._fresh = self._fresh, []
        for s in fresh:
            nxt = [] if s.error is not None else s.search.propose()
            if not nxt:
                cell = self.cells[s.i] = s.cell()
                if self._on_done is not None:
                    self._on_done(s.i, cell)
                continue
            for k in nxt:
                s.inflight.add(k)
                out.append((f"{label(s.choice)} {s.what(k)}", s.options(k), (s, k)))
        return out

    def record(self, tag: tuple[RowSearch, int], out: runner_mod.Outcome) -> None:
        s, k = tag
        s.inflight.discard(k)
        s.record(k, out)
        if not s.inflight:
            self._fresh.append(s)


def _search_rows(path, rows, find, n_jobs, executor, ray_address, progress, on_row) -> list[Cell]:
    searches = [RowSearch(i, choice, opts, find) for i, (choice, opts) in enumerate(rows)]
    bar = runner_mod.bar(len(rows), progress)

    def done(i: int, cell: Cell) -> None:
        bar.update(advance=1)
        if on_row is not None:
            on_row(cell)

    strategy = RowSearches(searches, done)
    runner_mod.prepare(opts for _, opts in rows)
    run = runner_mod.open_runner(path, n_jobs, executor, ray_address)
    try:
        runner_mod.drive(run, strategy)
    finally:
        bar.close()
        run.close()
    return [c for c in strategy.cells if c is not None]  # (all of them: drive ran until every row was done)


def probe_count(s: search_mod.SearchResult) -> str:
    """'4 compiles', or '4 probes: 1 compiled, 3 from the cache'."""
    cached = len(s.probes) - s.compiles
    if not cached:
        return f"{len(s.probes)} compiles"
    return f"{len(s.probes)} probes: {s.compiles} compiled, {cached} from the cache"


def row_line(c: Cell) -> str:
    """One line for a row the moment it finishes (the sorted table follows at the end)."""

    name = label(c.choice)
    if c.report is None:
        return f"{'failed' if c.status == 'failed' else 'error'}  {name}: {c.error}"
    r = c.report
    verdict = VERDICT_TEXT.get(verdict_of(r) or "", "-")
    line = f"done  {name}: peak {fmt_bytes(r.per_device_peak_bytes)}, {verdict}"
    s = c.search
    if s is not None:
        what = {"batch": "max batch", "seq": f"max {s.arg}", "devices": "min data size"}[s.kind]
        answer = "none" if (s.answer in (None, 0) and s.kind != "devices") or s.answer is None else (
            f">= {s.answer}" if s.capped else str(s.answer))
        line += f"; {what} {answer} ({probe_count(s)})"
    return line


# -- saved results: JSON (re-rendered by `compare --from`) and CSV -------------------------------

def row_json(c: Cell) -> dict:
    tp = c.throughput
    # rank: 1-based among the rows that fit, by throughput per device (ranked()); tokens_per_s: the
    # tokens (batch x sequence of the token ids) per second per device at the estimated step time, null
    # for a batch without a sequence; samples_per_s: the global batch per second per device
    d: dict = {"choice": c.choice, "status": c.status, "error": c.error, "rank": c.rank,
               "tokens_per_s": None if tp is None else tp.tokens_per_s,
               "samples_per_s": None if tp is None else tp.samples_per_s}
    if c.search is not None and c.search.kind == "batch":  # the keys --find-batch always had
        d["max_batch"], d["max_batch_capped"] = c.search.answer, c.search.capped
    if c.report is not None:
        d.update(per_device_peak_bytes=c.report.per_device_peak_bytes, fits=c.report.fits,
                 headroom_bytes=c.report.headroom_bytes, breakdown=c.report.breakdown)
    d["search"] = None if c.search is None else c.search.to_json()
    d["report"] = None if c.report is None else c.report.to_json()
    return d


def to_json(cells: list[Cell]) -> list[dict]:
    """What `--json` prints and `--out FILE.json` writes: one object per row, each with its full
    report, so `--from` re-renders it (table or the same JSON) without compiling."""
    return [row_json(c) for c in ranked(cells)]


def from_json(rows: list) -> list[Cell]:
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "choice" in r for r in rows):
        raise UserError("not a saved comparison (expected the JSON list that jaxmem compare --json or "
                        "--out FILE.json writes)")
    cells = []
    for r in rows:
        cells.append(Cell(dict(r["choice"]), None if r.get("report") is None else Report.from_json(r["report"]),
                          r.get("error"), r.get("status", "ok"),
                          None if r.get("search") is None else search_mod.SearchResult.from_json(r["search"])))
    return cells


def to_csv(cells: list[Cell]) -> str:
    axes = list(dict.fromkeys(k for c in cells for k in c.choice))
    cols = axes + ["status", "error", "rank", "tokens_per_s", "samples_per_s", "per_device_peak_bytes", "fits",
                   "headroom_bytes", "usable_bytes", "step_time_estimate_s"]
    cols += [f"breakdown.{k}" for k in BREAKDOWN_KEYS]
    cols += ["search", "answer", "capped", "fits_at", "fits_at_peak_bytes", "fails_at", "fails_at_peak_bytes",
             "fails_at_refused",
             "compiles", "margin"]
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for c in ranked(cells):
        row: dict = {a: c.choice.get(a, "") for a in axes}
        tp = c.throughput
        row.update(status=c.status, error=c.error or "", rank=c.rank or "",
                   tokens_per_s="" if tp is None or tp.tokens_per_s is None else tp.tokens_per_s,
                   samples_per_s="" if tp is None else tp.samples_per_s)
        if c.report is not None:
            row.update(per_device_peak_bytes=c.report.per_device_peak_bytes, fits=c.report.fits,
                       headroom_bytes=c.report.headroom_bytes, usable_bytes=c.report.target.usable_bytes)
            row.update({f"breakdown.{k}": c.report.breakdown.get(k, 0) for k in BREAKDOWN_KEYS})
            st = c.report.step_time or {}
            row["step_time_estimate_s"] = st.get("estimate_s", "") if st.get("available") else ""
        s = c.search
        if s is not None:
            row.update(search=s.kind if s.kind != "seq" else f"seq:{s.arg}", answer=s.answer, capped=s.capped,
                       compiles=s.compiles, margin=s.margin)
            if s.fits_at is not None:
                row.update(fits_at=s.fits_at.value, fits_at_peak_bytes=s.fits_at.peak_bytes)
            if s.fails_at is not None:
                row.update(fails_at=s.fails_at.value, fails_at_peak_bytes=s.fails_at.peak_bytes,
                           fails_at_refused=s.fails_at.error or "")
        w.writerow(row)
    return out.getvalue()


def save(cells: list[Cell], path: str) -> None:
    if path.lower().endswith(".csv"):
        text = to_csv(cells)
    elif path.lower().endswith(".json"):
        text = json.dumps(to_json(cells), indent=2) + "\n"   # exactly what --json prints
    else:
        raise UserError(f"--out {path}: write FILE.json (re-renderable with --from) or FILE.csv")
    # beside the target, then renamed: never through a link; an OSError is the caller's to report
    files.write_output(path, text.encode("utf-8"), option="--out")
