"""advise's predictions: a plan's peak and step time before it compiles (jaxmem/plan/advise.py).

A plan is a set of changes (jaxmem.plan.changes). Its peak is predicted as the original's state (params,
optimizer state, gradients and the rest) and activations/temporaries, each times the ratios of its
changes; its step time likewise. A change's ratios are *measured* once its single probe compiled (the
probe's state, activations and step time over the original's; gradient accumulation between the original
and its largest probe interpolated linearly in the microbatch size), and until then a *prior*: what the
change does to the original's own breakdown (bf16 moments halve the optimizer state, an nf4 base stores the
frozen params in 0.56 bytes each, a remat policy keeps a share of the activations, ...). A memory fraction
changes no program: the same peak against a larger pool (the card's memory times the fraction).

Each prediction carries how far it may be off: 3% of the peak and 1% of the step time per measured change
(their composition is what is not measured), 30% and 25% per prior. A plan *can fit* when its peak, that
much lower, fits its pool; it *can win* when its throughput per device, that much higher, beats the best
compiled plan's of its kind (jaxmem.plan.advise_search).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from jaxmem.plan import changes as changes_mod
from jaxmem.program import layouts
from jaxmem.program.options import AnalyzeOptions

MEASURED_SLACK = (0.03, 0.01)   # (peak, step time) a measured change's prediction may be off by
PRIOR_SLACK = (0.30, 0.25)      # ... and a prior's
MAX_SLACK = 0.6
MAX_CHANGES = 5                 # a plan combines at most this many changes (the five free fixes)
MAX_DEAR = 2                    # ... of which at most two reshape the job (layout, mesh, LoRA, offload, more GPUs)
DEAR = ("layout", "offload", "lora", *changes_mod.MESH_CHANGES, "devices")
BYTES = {"fp32": 4.0, "float32": 4.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "int8": 1.0, "nf4": 0.5625,
         "int4": 0.5625}
REMAT_ACTS = {0: 1.0, 1: 0.65, 2: 0.5, 3: 0.3}     # the share of the activations each recompute rank keeps
REMAT_TIME = {0: 1.0, 1: 1.08, 2: 1.12, 3: 1.3}


@dataclasses.dataclass(frozen=True)
class Prediction:
    peak: float
    step_s: float
    devices: int
    budget: float           # the pool it must fit in (its memory fraction's)
    measured: bool          # every change's ratios come from a compiled probe
    slack: tuple[float, float]

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget

    @property
    def can_fit(self) -> bool:
        return self.peak * (1 - self.slack[0]) <= self.budget

    @property
    def score(self) -> float:
        """Steps per second per device (the global batch is every plan's): throughput per device, in steps."""
        return 1.0 / (self.step_s * self.devices) if self.step_s > 0 and self.devices else 0.0

    def best_score(self) -> float:
        return self.score * (1 + self.slack[1])


def parts(report) -> dict[str, float]:
    b = report.breakdown
    acts = float(b.get("activations_and_temporaries", 0))
    out = {k: float(b.get(k, 0)) for k in ("params", "optimizer_state", "gradients")}
    out["acts"] = acts
    out["state"] = float(report.per_device_peak_bytes) - acts
    return out


def _without(p: dict[str, float], share: float) -> float:
    """The state ratio when `share` bytes of it go."""
    return max(0.05, (p["state"] - share) / p["state"]) if p["state"] > 0 else 1.0


def prior(axis: str, value, base: AnalyzeOptions, p: dict[str, float]) -> tuple[float, float, float]:
    """(state, activations, step time) ratios a change is expected to bring, from the original's breakdown."""
    sharded = p["params"] + p["optimizer_state"] + p["gradients"]
    if axis == "fraction":
        return 1.0, 1.0, 1.0
    if axis == "precision":
        return (1.0, 0.55, 0.5) if value == "bf16" else (1.0, 0.9, 0.8)
    if axis == "attention":
        return 1.0, 0.75, 0.85
    if axis == "loss":
        return 1.0, 0.85, 1.02
    if axis == "remat":
        r0, r1 = changes_mod.REMAT_RANK.get(base.remat, 0), changes_mod.REMAT_RANK.get(value, 0)
        keep = 0.45 if value == "offload_dots" else REMAT_ACTS[r1]
        return 1.0, keep / REMAT_ACTS[r0], REMAT_TIME[r1] / REMAT_TIME[r0] * (1.1 if value == "offload_dots" else 1)
    if axis == "accum":
        share = base.accum / value
        return (p["state"] + p["gradients"]) / p["state"] if p["state"] else 1.0, 0.85 * share + 0.15, 1.03
    if axis == "layout":
        n = layouts.mesh_size(base.mesh)
        return _without(p, sharded * (1 - 1 / max(1, n))), 1.0, 1.08
    if axis in ("base", "lora"):
        return _lora_prior(axis, value, base, p)
    if axis == "moments":
        return _without(p, p["optimizer_state"] / 2), 1.0, 1.0
    if axis == "offload":
        return _without(p, p["optimizer_state"]), 1.0, 1.1
    if axis in changes_mod.MESH_CHANGES or axis == "devices":
        return _mesh_prior(axis, value, base, p, sharded)
    return 1.0, 1.0, 1.0


def _lora_prior(axis: str, value, base: AnalyzeOptions, p: dict[str, float]) -> tuple[float, float, float]:
    old = BYTES.get(base.base_dtype or "", 4.0)
    if axis == "base":
        r = BYTES.get(value, old) / old
        acts = 0.55 if value == "bf16" and base.precision == "fp32" else 1.0
        return _without(p, p["params"] * (1 - r)), acts, 0.6 if acts < 1 else 1.1
    _, quant = value
    gone = p["optimizer_state"] + p["gradients"] + (p["params"] * (1 - BYTES[quant] / 4.0) if quant else 0.0)
    return _without(p, gone), 1.0, 0.8 if quant else 0.7


def _mesh_prior(axis: str, value, base: AnalyzeOptions, p: dict[str, float], sharded: float):
    spec = layouts.parse_mesh(value, changes_mod.meshes.roles_for(base.axis_roles, value))
    if axis == "devices":
        fsdp = base.layout in ("fsdp", "fsdp_tp")
        return (_without(p, sharded / 2) if fsdp else 1.0), 0.5, 0.5
    if axis == "pipeline":
        k = spec.axis_size(spec.axis_of("stage"))
        return _without(p, sharded * (1 - 1 / k)), 1.0, 1.2
    if axis == "context":
        k = spec.axis_size(spec.axis_of("context"))
        return 1.0, 1.0 / k, 1.05
    if axis == "expert":
        return 0.7, 1.0, 1.0
    return 1.0, 1.0, 0.9   # hsdp: the same memory, fsdp's collectives off the network


class Forecast:
    """Predictions of plans from the original's report, priors, and the probes compiled so far."""

    def __init__(self, base: AnalyzeOptions, original, accum_values: list[int]):
        self.base, self.original = base, original
        self.parts = parts(original)
        self.step_s = float((original.step_time or {}).get("estimate_s") or 0.0) \
            if (original.step_time or {}).get("available") else 0.0
        self.devices = getattr(original.target, "devices", 1) or 1
        self.usable = float(original.target.usable_bytes or 0)
        self.accum_max = accum_values[-1] if accum_values else None
        self.measured: dict[tuple[str, Any], tuple[float, float, float]] = {}
        self.refused: set[tuple[str, Any]] = set()   # a probe that did not compile: its change predicts nothing
        self.card = float(getattr(original.target, "memory_bytes", 0) or 0)

    def learn(self, change: tuple[str, Any], report) -> None:
        """A single change's probe landed: its measured ratios replace the prior (None: it did not compile)."""
        if report is None or not (report.step_time or {}).get("available"):
            self.refused.add(change)
            return
        q = parts(report)
        p, t = self.parts, float(report.step_time["estimate_s"])
        self.measured[change] = (q["state"] / p["state"] if p["state"] else 1.0,
                                 q["acts"] / p["acts"] if p["acts"] else 1.0, t / self.step_s if self.step_s else 1.0)

    def probe_for(self, change: tuple[str, Any]) -> tuple[str, Any] | None:
        """The single change whose compile measures `change` (accumulation: its largest value); None: nothing to
        measure (a memory fraction)."""
        axis, _ = change
        if axis == "fraction":
            return None
        if axis == "accum" and self.accum_max is not None:
            return ("accum", self.accum_max)
        return change

    def is_measured(self, change) -> bool:
        probe = self.probe_for(change)
        return probe is None or probe in self.measured

    def _ratios(self, change) -> tuple[tuple[float, float, float], bool] | None:
        axis, value = change
        probe = self.probe_for(change)
        if probe is not None and probe in self.refused:
            return None
        if probe is None or probe not in self.measured:
            return prior(axis, value, self.base, self.parts), probe is None
        r = self.measured[probe]
        if axis == "accum" and value != probe[1]:
            a0, a1 = self.base.accum, probe[1]
            m0, m1, m = 1 / a0, 1 / a1, 1 / value
            frac = (m0 - m) / (m0 - m1) if m0 != m1 else 1.0   # activations linear in the microbatch size
            return (1 + (r[0] - 1) * min(frac, 1.0), 1 + (r[1] - 1) * frac,
                    1 + (r[2] - 1) * (value - a0) / (a1 - a0)), True
        return r, True

    def budget(self, fraction: float | None) -> float:
        """The pool at `fraction` of the card (JAX's pool is the card times the fraction)."""
        return self.usable if fraction is None or not self.card else self.card * fraction

    def predict(self, ch: tuple[tuple[str, Any], ...], devices: int) -> Prediction | None:
        state, acts, t = self.parts["state"], self.parts["acts"], self.step_s or 1.0
        slack, measured = [0.0, 0.0], True
        for change in ch:
            got = self._ratios(change)
            if got is None:
                return None
            (rs, ra, rt), known = got
            state, acts, t = state * rs, acts * ra, t * rt
            if change[0] != "fraction":
                s = MEASURED_SLACK if known else PRIOR_SLACK
                slack = [slack[0] + s[0], slack[1] + s[1]]
            measured = measured and known
        return Prediction(state + acts, t, devices, self.budget(dict(ch).get("fraction")), measured,
                          (min(MAX_SLACK, slack[0]), min(MAX_SLACK, slack[1])))


def universe(base: AnalyzeOptions, ax: dict[str, list], batch: int | None, block: str | None
             ) -> dict[tuple, AnalyzeOptions]:
    """Every plan advise may propose: each combination of at most MAX_CHANGES changes (MAX_DEAR of them dear),
    one value per axis, that makes options analyze accepts and keeps the global batch; a precision change beside
    a change that brings bf16 itself is the same step as without it, and left out. Its options by plan."""
    axes_ = [(a, vs) for a, vs in ax.items() if vs]
    out: dict[tuple, AnalyzeOptions] = {}
    for n in range(1, min(MAX_CHANGES, len(axes_)) + 1):
        for group in itertools.combinations(axes_, n):
            if sum(a in DEAR for a, _ in group) > MAX_DEAR:
                continue
            for values in itertools.product(*(vs for _, vs in group)):
                ch = tuple((a, v) for (a, _), v in zip(group, values, strict=True))
                d = dict(ch)
                if d.get("precision") == "bf16" and changes_mod.needs_bf16(ch):
                    continue
                if n > 1 and not changes_mod.divides(base, ch, batch):
                    continue
                opts = changes_mod.apply(base, ch, block)
                if opts is not None:
                    out[ch] = opts
    return out


def devices_of(opts: AnalyzeOptions) -> int:
    return layouts.mesh_size(opts.mesh)


def needless(ch: tuple, forecast: Forecast, devices: int, fractions: list[float]) -> bool:
    """A plan with a change it does not need: without that change (or with a smaller memory fraction of
    `fractions`) it is predicted to fit, and no more than 1% slower. (A mesh change is never dropped: without it
    the plan runs on other GPUs.)"""
    full = forecast.predict(ch, devices)
    if full is None:
        return True
    frac = dict(ch).get("fraction")
    subs = [tuple(c for c in ch if c != drop) for drop in ch
            if len(ch) > 1 and drop[0] not in ("devices", *changes_mod.MESH_CHANGES)]
    subs += [tuple(c if c[0] != "fraction" else ("fraction", f) for c in ch)
             for f in fractions if frac is not None and f < frac]
    for sub in subs:
        p = forecast.predict(sub, devices)
        if p is not None and p.fits and p.step_s <= full.step_s * 1.01:
            return True
    return False


def score_of(report) -> float:
    st = report.step_time or {}
    t = st.get("estimate_s") if st.get("available") else None
    d = getattr(report.target, "devices", 0) or 0
    return 1.0 / (t * d) if t and d else 0.0
