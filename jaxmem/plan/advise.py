"""`jaxmem advise`: when a step does not fit, the changes that make it fit, fastest first.

The changes users actually make, each a field of the analysis options
(``dataclasses.replace(options, ...)``), on axes ordered from cheapest to dearest -- the free fixes
first, more devices last:

* fraction: a larger share of the card for JAX's pool (0.9, 0.95, and the step's fraction floor; JAX
  preallocates 75% by default), none above the step's fraction ceiling (the memory outside the pool
  must fit: Report.fraction_ceiling), set with XLA_PYTHON_CLIENT_MEM_FRACTION (the row names the
  variable): the same program, a larger budget. Offered when --mem-fraction was not given (a share the
  user states is theirs to keep);
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

import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from typing import Any

from jaxmem import display, pipeline
from jaxmem.compiler.steptime import band, tied_with
from jaxmem.errors import UserError
from jaxmem.plan import changes as changes_mod
from jaxmem.plan import sweep
from jaxmem.plan.changes import CHANGES, MESH_CHANGES, axes, mesh_changes, model_takes  # noqa: F401 (advise's names)
from jaxmem.program import rules
from jaxmem.program.options import AnalyzeOptions, command_line
from jaxmem.report import verdict_of

_apply = changes_mod.apply   # the options a set of changes makes (its tests' name)

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
        text = ", ".join(changes_mod.describe(k, mesh if mesh and k in (*MESH_CHANGES, "devices") else v, roles)
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
        return {} if f is None else {changes_mod.fraction_variable(): str(f)}

    def command(self, path: str) -> str:
        return command_line(path, self.options)


def _per_device(report, step_s: float | None) -> tuple[float, str] | None:
    if report is None or not step_s:
        return None
    batch, devices = changes_mod.global_batch(report), getattr(report.target, "devices", 0)
    if not batch or not devices:
        return None
    seq = getattr(report, "sequence_length", None)
    return (batch * seq / step_s / devices, "tokens/s") if seq else (batch / step_s / devices, "samples/s")








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
            return {"changes": {a: changes_mod.shown(a, v) for a, v in c.changes}, "label": c.label,
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
# The axes of change: jaxmem.plan.changes.
# ----------------------------------------------------------------------------------------------



















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

    ax = {k: v for k, v in axes(base, changes_mod.global_batch(original.report), original.report,
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
            implied = bool(self.base is not None and changes_mod.needs_bf16(ch) and "precision" not in dict(ch)
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
        if len(ch) < 2 or not changes_mod.divides(base, ch, changes_mod.global_batch(original.report)):
            continue
        if d.get("precision") == "bf16" and changes_mod.needs_bf16(ch):
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
                                next((ch[1] for ch in c.changes if ch[0] == "fraction"), 0.0), -(c.headroom or 0)))
    rest = sorted((c for c in cands if not c.fits),
                  key=lambda c: (c.report is None, c.peak if c.peak is not None else 0))
    return fit + rest




def _key(changes) -> str:
    return "; ".join(changes_mod.describe(a, v) for a, v in changes) or "as given"


def _opts_key(o: AnalyzeOptions) -> tuple:
    """What makes two candidates the same compile: every field of the options, so an option added
    later (or offload, LoRA, the base dtype, ...) can never make two different steps look alike; a
    rules file by its content."""

    return dataclasses.astuple(o) + (rules.digest(o.rules),)
