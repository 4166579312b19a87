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

No suggestion without its compiled number: the plans it prints are compiled; while it searches it shows
them beside the plans still predicted, each marked. The search (jaxmem.plan.advise_search, its stop
rule in that module's docstring) predicts every combination of changes from the step as given
(jaxmem.plan.forecast: priors from its breakdown, replaced by a change's measured ratios once its probe,
the change alone, compiled), and compiles only the plans that can still win: it stops when every plan
not compiled, at its predicted best, either does not fit or cannot beat the best compiled plan of its
section. Combinations of the free fixes (fraction x accumulation x base dtype x chunked loss x remat)
are plans like any other.

Plans that fit are ranked in two sections: on the GPUs as given, then on more GPUs (each saying how many
it needs and adds), each by its throughput per device from the compiled, estimated step time (tokens/s,
or samples/s for a batch without a sequence; the global batch is the same in every plan), fewer changes
first among equals; rows whose step-time bands overlap are tied and share a rank. Compiled plans that do
not fit are a list of their own. A candidate that cannot apply to this model (it refuses the option: a
user error) is "not applicable", with the reason. A plan's command pastes and runs as shown: a memory
fraction is the environment variable in front of it (what the training sets too).
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import time
from collections.abc import Callable
from typing import Any

from jaxmem import display, pipeline
from jaxmem.compiler.steptime import band, tied_with
from jaxmem.errors import UserError
from jaxmem.plan import advise_search
from jaxmem.plan import changes as changes_mod
from jaxmem.plan import forecast as fc
from jaxmem.plan import runner as runner_mod
from jaxmem.plan.changes import CHANGES, MESH_CHANGES, axes, mesh_changes, model_takes  # noqa: F401 (advise's names)
from jaxmem.program import rules
from jaxmem.program.options import AnalyzeOptions, command_line
from jaxmem.report import verdict_of

_apply = changes_mod.apply   # the options a set of changes makes (its tests' name)

SCHEMA = "jaxmem.advise/2"
MAX_COMPILES = 24   # compiles a search makes at most beside the step as given (a search that stops there says so)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One plan: the original, or the original with `changes`; compiled (report or error), or only predicted."""

    changes: tuple[tuple[str, Any], ...]     # (axis, value): layout, precision, remat, accum, devices
    options: AnalyzeOptions
    report: Any = None                       # Report | None
    error: str | None = None
    status: str = "ok"                       # ok | not_applicable (the model refuses it) | failed | predicted
    round: int = 0                           # 0: the original, 1: one change, 2: a combination
    predicted_peak_bytes: int | None = None  # what the search predicted before it compiled
    bf16_implied: bool = False               # a change that needs bf16 compute brought it (cuDNN, a bf16 base)
    adds_gpus: int = 0                       # the GPUs it needs beyond the original's
    prediction: Any = None                   # forecast.Prediction (status predicted; and what a compile replaced)

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
        text += ", with the bf16 compute it needs" if self.bf16_implied else ""
        if self.adds_gpus > 0:
            n = fc.devices_of(self.options)
            text = f"needs {n} GPUs (+{self.adds_gpus}): {text}"
        return text

    @property
    def exact(self) -> bool:
        return self.status != "predicted"

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
        """The command that analyzes this plan, pasted as it is: a memory fraction is the variable in front of
        it (as the training's environment sets it), not --mem-fraction."""
        env = self.environment
        if not env:
            return command_line(path, self.options)
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        return f"{prefix} {command_line(path, dataclasses.replace(self.options, mem_fraction=None))}"


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
    candidates: tuple[Candidate, ...]   # the compiled plans: fitting ones ranked first (and, while the search
                                        # runs, the plans still predicted, status "predicted")
    compiles: int
    cached: int
    seconds: float
    searched: bool                      # False: the original fits and --all was not given
    done: bool = True                   # False: a snapshot of a search still running
    progress: str = ""                  # "N of M compiled, about S s left" (the final: "N compiled")
    eta_s: float | None = None
    capped: bool = False                # the search stopped at max_compiles with plans still able to win

    @property
    def exact(self) -> list[Candidate]:
        return [c for c in self.candidates if c.exact]

    @property
    def fitting(self) -> list[Candidate]:
        """The compiled plans that fit, ranked: on the GPUs as given first, then those that need more."""
        return [c for c in self.candidates if c.fits]

    @property
    def fitting_here(self) -> list[Candidate]:
        return [c for c in self.fitting if c.adds_gpus <= 0]

    @property
    def fitting_more(self) -> list[Candidate]:
        return [c for c in self.fitting if c.adds_gpus > 0]

    @property
    def not_fitting(self) -> list[Candidate]:
        return [c for c in self.candidates if c.report is not None and not c.fits]

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
        base, mine = self.original.step_s, c.step_s if c.exact else (c.prediction.step_s if c.prediction else None)
        return None if not base or mine is None else mine / base

    def _repr_html_(self) -> str | None:
        return display.html("advice", self)

    def ranks(self) -> dict[int, int]:
        """id(candidate) -> its rank among the plans that fit in its section (1-based, in the order of `fitting`);
        rows whose throughput bands overlap (their step-time bands, scaled) share the rank of the first of them."""
        out: dict[int, int] = {}
        for section in (self.fitting_here, self.fitting_more):
            ties = tied_with([c.throughput_band() for c in section])
            for i, c in enumerate(section):
                above = ties[i]
                out[id(c)] = i + 1 if above is None else out[id(section[above])]
        return out

    def to_json(self) -> dict[str, Any]:
        ranks = self.ranks()
        closest = None if self.fitting or not self.searched or not self.done else self.closest
        return {"schema": SCHEMA, "model_file": self.path, "original": self._row(self.original, ranks),
                "fits_as_given": self.original.fits, "searched": self.searched, "done": self.done,
                "progress": {"compiled": self.compiles, "text": self.progress, "eta_s": self.eta_s,
                             "capped": self.capped},
                "changes_compiled": len(self.compiled),
                "candidates": [self._row(c, ranks) for c in self.candidates],
                "fitting": len(self.fitting), "fitting_on_given_gpus": len(self.fitting_here),
                "fitting_on_more_gpus": len(self.fitting_more),
                "closest": self._row(closest, ranks) if closest is not None else None,
                "compiles": self.compiles, "cached": self.cached, "seconds": round(self.seconds, 1),
                "step_time_rule": "estimates: the per-kernel model at measured rates, with a band (low_s-high_s); "
                                  "rows whose bands overlap are tied (see each candidate's step_time.rule)",
                "rank_rule": "plans that fit, in two sections (section: given_gpus, then more_gpus), each by "
                             "throughput per device (tokens_per_s, or samples_per_s without a sequence) at the "
                             "estimated step time; rows whose bands overlap share a rank (a tie)",
                "stop_rule": "plans are compiled best predicted first while one can still win: the search stops when "
                             "every plan not compiled, at its predicted best (peak less its prediction's slack, "
                             "throughput plus it), does not fit or cannot beat the best compiled plan of its "
                             "section (jaxmem.plan.advise_search)"}

    def _row(self, c: Candidate, ranks: dict[int, int]) -> dict[str, Any]:
        p = c.prediction if not c.exact else None
        tp = c.throughput if c.exact else _predicted_throughput(self.original, p)
        fits = (c.fits if c.report is not None else None) if c.exact else (p.fits if p is not None else None)
        section = ("not_compiled" if c.exact and c.report is None else "does_not_fit" if fits is False else
                   "more_gpus" if c.adds_gpus > 0 else "given_gpus") if c.changes else "as_given"
        return {"changes": {a: changes_mod.shown(a, v) for a, v in c.changes}, "label": c.label,
                "status": "exact" if c.status == "ok" else c.status, "section": section, "adds_gpus": c.adds_gpus,
                "rank": ranks.get(id(c)), "environment": c.environment,
                "tokens_per_s": tp[0] if tp and tp[1] == "tokens/s" else None,
                "samples_per_s": tp[0] if tp and tp[1] == "samples/s" else None,
                "command": c.command(self.path), "error": c.error, "fits": fits,
                "per_device_peak_bytes": c.peak if c.exact else (int(p.peak) if p is not None else None),
                "headroom_bytes": c.headroom if c.exact else (int(p.budget - p.peak) if p is not None else None),
                "step_time_estimate_s": c.step_s if c.exact else (p.step_s if p is not None else None),
                "relative_step_time": self.relative(c),
                "devices": fc.devices_of(c.options) if c.options is not None else None,
                "gpu_seconds_per_step": c.gpu_seconds if c.exact else None,
                "step_time": c.report.step_time if c.report is not None else None,
                "round": c.round, "predicted_peak_bytes": c.predicted_peak_bytes,
                "verdict": verdict_of(c.report) if c.report is not None else None}


def _predicted_throughput(original: Candidate, p) -> tuple[float, str] | None:
    """A predicted plan's throughput per device: the original's, scaled by the predicted step time and devices."""
    tp = original.throughput
    if tp is None or p is None or not p.step_s or original.step_s is None:
        return None
    d0 = getattr(original.report.target, "devices", 0) or 1
    return tp[0] * original.step_s / p.step_s * d0 / max(1, p.devices), tp[1]


NEEDS_GPU = "advise needs a GPU target with fixed memory (jaxmem gpus), not --gpu cpu"


def advise(path: str, base: AnalyzeOptions, *, always: bool = False, n_jobs: int | None = None,
           max_compiles: int = MAX_COMPILES, progress: bool = True, runner: runner_mod.Runner | None = None,
           original_report=None, changes: tuple[str, ...] = CHANGES, model=None,
           on_update: Callable[[Advice], None] | None = None) -> Advice:
    """Compile the plans that can make the step fit and win; rank the ones that do.

    `always`: search even when the original fits (`--all`). `changes`: the kinds of change to try
    (a subset of CHANGES). `runner`: where the compiles run (jaxmem.plan.runner; default: `n_jobs` worker
    processes, or this process for one); `model`: the Workload or function the API was given (`path` is then
    its label; without a `runner` its plans compile in this process). `progress`: a line on stderr
    (a terminal only) while it searches. `on_update(advice)`: a snapshot after every compile that lands
    (compiled rows exact, the rest predicted), and the first one as soon as the step as given compiled.
    The search and its stop rule: jaxmem.plan.advise_search.
    """
    unknown = sorted(set(changes) - set(CHANGES))   # the user's typos, before any compile
    if unknown:
        raise UserError(f"--changes {','.join(unknown)}: unknown; choose from {','.join(CHANGES)}")
    if base.on_cpu:
        raise UserError(NEEDS_GPU)
    t0 = time.perf_counter()
    base = dataclasses.replace(base, explain=False)
    # a Workload or function (the API's model=) does not pickle: its plans compile in this process
    run = runner or (runner_mod.PoolRunner(model, executor="inline") if model is not None else
                     runner_mod.open_runner(path, n_jobs))
    line = advise_search.ProgressLine(progress)
    try:
        if runner is None:
            runner_mod.prepare([base])
        if original_report is None and runner is None and isinstance(run, runner_mod.PoolRunner):
            # the step as given in this process (jax is loaded here already) while the workers start for what follows
            run.warm()
            out = runner_mod.run_here(path if model is None else model, "as given", base)
            original = Candidate((), base, out.report, out.error, out.status, 0)
        elif original_report is None:
            (out,) = runner_mod.run_all(run, [("as given", base)])
            original = Candidate((), base, out.report, out.error, out.status, 0)
        else:
            original = Candidate((), base, original_report, None, "ok", 0)
        if original.report is None:
            raise UserError(f"the original configuration does not compile: {original.error}")
        if original.report.fits is None:
            raise UserError(NEEDS_GPU)
        compiled0 = int(original_report is None)
        if original.fits and not always:
            return Advice(path, original, (), compiled0, 0, time.perf_counter() - t0, searched=False)
        search = _search(path, base, original, changes, model, run, max_compiles)

        def emit(*_):
            snap = _advice(path, original, search, t0, compiled0, done=False)
            line.show(f"advise: {snap.progress}" + (f"; best so far: {snap.fitting[0].label}" if snap.fitting else ""))
            if on_update is not None:
                on_update(snap)

        emit()
        runner_mod.drive(run, search, on_landed=emit)
        return _advice(path, original, search, t0, compiled0, done=True)
    finally:
        line.close()
        if runner is None:
            run.close()


def _search(path: str, base: AnalyzeOptions, original: Candidate, changes, model, run,
            max_compiles: int) -> advise_search.Search:
    batch = changes_mod.global_batch(original.report)
    ax = {k: v for k, v in axes(base, batch, original.report, takes=model_takes(path, model)).items() if k in changes}
    # a model without a remat hook is checkpointed at its repeated block (--remat-at)
    block = pipeline.remat_block(path if model is None else model, base) \
        if ax.get("remat") and base.remat_at is None else None
    plans = fc.universe(base, ax, batch, block)
    forecast = fc.Forecast(base, original.report, ax.get("accum", []))
    devices0 = fc.devices_of(base)

    def make(ch: tuple, opts: AnalyzeOptions, out) -> Candidate:
        implied = changes_mod.needs_bf16(ch) and "precision" not in dict(ch) and base.precision == "fp32"
        p = forecast.predict(ch, fc.devices_of(opts))
        adds = fc.devices_of(opts) - devices0
        if out is None:
            return Candidate(ch, opts, None, None, "predicted", 1 if len(ch) == 1 else 2,
                             int(p.peak) if p else None, implied, adds, p)
        status, err = out.status, out.error
        if status == "user_error":
            status, err = "not_applicable", f"not applicable: {err}"
        return Candidate(ch, opts, out.report, err, status, 1 if len(ch) == 1 else 2, int(p.peak) if p else None,
                         implied, adds, p)

    return advise_search.Search(original, plans, forecast, ax.get("fraction", []),
                                run.progress().workers, max_compiles, make)


def _advice(path: str, original: Candidate, search: advise_search.Search, t0: float, compiled0: int,
            done: bool) -> Advice:
    exact = list(search.exact.values())
    rows = _rank(exact, fc.devices_of(original.options))
    if not done:
        predicted = [search.make(ch, search.plans[ch], None) for ch, _ in search.predicted()]
        rows = _rank(exact + predicted, fc.devices_of(original.options))
    text = search.progress_text() if not done else f"{search.compiles} plans compiled" + (
        f", stopped at the limit of {search.max_compiles} with plans that could still win" if search.capped else
        ", every plan left predicted not to fit or not to beat the best compiled one")
    return Advice(path, original, tuple(rows), search.compiles + compiled0, search.cached,
                  time.perf_counter() - t0, searched=True, done=done, progress=text,
                  eta_s=None if done else search.eta_s(), capped=search.capped)


def _rank(cands: list[Candidate], devices: int) -> list[Candidate]:
    """Fitting first (compiled, or predicted to fit while the search runs): those on the `devices` GPUs as given
    before those that need more, each by its throughput per device, highest first (the global batch is the same
    in all: on the same GPUs, the fastest step first); among equals the fewest changes, then the smallest memory
    fraction, then the most headroom. Then the rest by peak."""
    def fitting(c: Candidate) -> bool:
        return c.fits if c.exact else bool(c.prediction is not None and c.prediction.fits)

    def speed(c: Candidate) -> float:
        if not c.exact:
            return -(c.prediction.score if c.prediction is not None else 0.0)
        s = fc.score_of(c.report) if c.report is not None else 0.0
        return -s if s else math.inf

    fit = sorted((c for c in cands if fitting(c)),
                 key=lambda c: (c.adds_gpus > 0, speed(c), len(c.changes),
                                next((ch[1] for ch in c.changes if ch[0] == "fraction"), 0.0), -(c.headroom or 0)))
    rest = sorted((c for c in cands if not fitting(c)),
                  key=lambda c: (c.report is None, c.peak if c.peak is not None else 0))
    return fit + rest


def _opts_key(o: AnalyzeOptions) -> tuple:
    """What makes two candidates the same compile: every field of the options, so an option added
    later (or offload, LoRA, the base dtype, ...) can never make two different steps look alike; a
    rules file by its content."""

    return dataclasses.astuple(o) + (rules.digest(o.rules),)
