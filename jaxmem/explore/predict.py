"""The explorer's predictions: a point not compiled yet, from compiled neighbours that differ from it only
in the global batch (or only in the sequence length), while its exact compile runs.

Within one compiled regime each part of per-device memory is close to affine in the batch (the
activations grow with it, the state does not) and close to quadratic in the sequence length
(attention scores; a memory-efficient attention leaves it affine, which a quadratic fit also
represents) -- the curves the fit searches already fit (jaxmem.plan.search.curve: the same function
here). So each breakdown part is fitted on its own and the peak is their sum (a least-squares fit is
linear in the values, so this equals fitting the peak). The points used are the nearest on each
side of the value asked where the compiled points bracket it (interpolation), else the nearest and the
farthest (a wide baseline, as the fit searches extrapolate), as many as the curve needs: two for a line,
three for a quadratic.

The verdict is the analysis' own (jaxmem.plan.saved_rows.rejudged: runtime.judge against the card's
usable bytes at the neighbour's memory settings, the runtime's estimated terms at both ends). The step
time's estimate and band are fitted the same way: compute and memory time grow with the tokens while
the gradients' collectives do not, which an affine fit (quadratic in the sequence) holds both of.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import numpy as np

from jaxmem.plan import saved_rows
from jaxmem.plan.search import curve
from jaxmem.program.options import AnalyzeOptions
from jaxmem.report import Options, Report, verdict_of

KINDS = {"batch": 1, "seq": 2}   # the kind of move -> the degree of memory's curve in it
_STEP_KEYS = ("estimate_s", "low_s", "high_s")


@dataclasses.dataclass(frozen=True)
class Known:
    """A compiled point: its options, its report, its value of the axis moved."""

    opts: AnalyzeOptions
    report: Report
    query: dict[str, str]


def batch_of(k: Known) -> int | None:
    b = k.report.options.get("batch")
    return b if isinstance(b, int) else k.opts.batch


def seq_of(k: Known, arg: str) -> int | None:
    v = dict(k.opts.model_args).get(arg)
    return v if isinstance(v, int) and not isinstance(v, bool) else k.report.sequence_length


def _without(opts: AnalyzeOptions, kind: str, arg: str | None) -> AnalyzeOptions:
    """The options with the moved axis taken out: two points are neighbours when these are equal."""
    if kind == "batch":
        return dataclasses.replace(opts, batch=None)
    return dataclasses.replace(opts, model_args=tuple(sorted((k, v) for k, v in opts.model_args if k != arg)))


def _x(opts: AnalyzeOptions, kind: str, arg: str | None) -> int | None:
    if kind == "batch":
        return opts.batch
    v = dict(opts.model_args).get(arg or "")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def choose(x: float, xs: list[float], need: int) -> list[int]:
    """The indices of the `need` points to fit at `x`. Between compiled points: the nearest on each side
    (then the next nearest). Beyond them: the nearest and the farthest, a wide baseline as the fit searches
    extrapolate (jaxmem.plan.search: adjacent points differ by XLA's jitter as much as by the batch), and for
    a quadratic the one between them."""
    order = sorted(range(len(xs)), key=lambda i: (abs(xs[i] - x), xs[i]))
    below = [i for i in order if xs[i] < x]
    above = [i for i in order if xs[i] > x]
    if below and above:
        picked = [below[0], above[0]]
        picked += [i for i in order if i not in picked][:max(0, need - 2)]
        return picked[:need]
    side = below or above    # nearest first
    if need <= 2 or len(side) <= 2:
        return (side[:1] + side[-1:] if need == 2 and len(side) > 1 else side[:need])
    return [side[0], side[len(side) // 2], side[-1]]


def predict(opts: AnalyzeOptions, known: list[Known], seq_arg: str | None) -> dict[str, Any] | None:
    """The predicted report of `opts` from the compiled points `known`, or None when no axis move links it
    to enough compiled points of distinct values: two for a batch move, three for a sequence move (a line
    through two sequence points is the wrong curve: README command 1's seq_len 8192 from 2048 and 4096 came
    out 18% low in benchmarks/explore.py)."""
    for kind in KINDS:
        if kind == "seq" and not seq_arg:
            continue
        x = _x(opts, kind, seq_arg)
        if x is None:
            continue
        base = _without(opts, kind, seq_arg)
        at: dict[int, Known] = {}
        for k in known:
            v = batch_of(k) if kind == "batch" else seq_of(k, seq_arg or "")
            if v is not None and v != x and _without(k.opts, kind, seq_arg) == base:
                at.setdefault(v, k)
        degree = KINDS[kind]
        if len(at) < degree + 1:   # the curve needs its points: a line through two sequence points was 18% off
            continue
        values = sorted(at)
        used = [at[values[i]] for i in choose(float(x), [float(v) for v in values], degree + 1)]
        return _report(opts, kind, seq_arg, x, used, degree)
    return None


def _fit(xs: list[float], ys: list[float], degree: int, x: float) -> float:
    coef = curve(xs, ys, degree)
    assert coef is not None   # (distinct xs, as many as the degree needs)
    return float(np.polyval(coef, x))


def _report(opts: AnalyzeOptions, kind: str, arg: str | None, x: int, used: list[Known], degree: int) -> dict:
    xs = [float(batch_of(k) if kind == "batch" else seq_of(k, arg or "")) for k in used]  # type: ignore[arg-type]
    nearest = used[0].report
    keys = list(nearest.breakdown)
    breakdown = {key: max(0, round(_fit(xs, [k.report.breakdown.get(key, 0) for k in used], degree, x)))
                 for key in keys}
    peak = sum(breakdown.values())
    options: dict[str, Any] = dict(nearest.options)
    if kind == "batch":
        options["batch"] = x
    else:
        options[f"arg:{arg}"] = x
    judged = saved_rows.rejudged(dataclasses.replace(nearest, per_device_peak_bytes=peak, breakdown=breakdown,
                                                     options=cast("Options", options)), "the prediction")
    step = dict(nearest.step_time)
    times: list[dict[str, Any]] = [dict(k.report.step_time) for k in used]
    if all(t.get("available") and all(isinstance(t.get(s), (int, float)) for s in _STEP_KEYS) for t in times):
        fitted = {s: max(0.0, _fit(xs, [float(t[s]) for t in times], degree, x)) for s in _STEP_KEYS}
        step = {"label": nearest.step_time.get("label", ""), "available": True, **fitted,
                "rule": f"fitted {'affine' if degree == 1 else 'quadratic'} in the {kind} through the compiled "
                        "points' estimates"}
    else:
        step = {"label": nearest.step_time.get("label", ""), "available": False,
                "reason": "a neighbour has no step-time estimate"}
    return {
        "per_device_peak_bytes": peak,
        "breakdown": breakdown,
        "verdict": verdict_of(judged),
        "fits": judged.fits,
        "headroom_bytes": judged.headroom_bytes,
        "margin_bytes": judged.margin_bytes,
        "verdict_terms": list(judged.verdict_terms),
        "target": dataclasses.asdict(judged.target),
        "mesh": dict(nearest.mesh),
        "layout": nearest.layout,
        "model": nearest.model,
        "options": options,
        "sequence_length": x if kind == "seq" else nearest.sequence_length,
        # the parameters are the neighbours' (a batch or sequence move changes none)
        "param_count": nearest.param_count,
        "trainable_param_count": nearest.trainable_param_count,
        "frozen_param_count": nearest.frozen_param_count,
        "tokens_per_step": _tokens(nearest, kind, arg, x),
        "step_time": step,
        "predicted_from": [_source(k, kind, arg) for k in used],
        "prediction": {"kind": kind, "arg": arg if kind == "seq" else None, "x": x,
                       "curve": "affine" if degree == 1 else "quadratic"},
    }


def _tokens(r: Report, kind: str, arg: str | None, x: int) -> int | None:
    """The predicted point's tokens a step: the neighbour's, scaled by the batch or the sequence moved."""
    tokens, batch = getattr(r, "tokens_per_step", None), r.options.get("batch")
    was = batch if kind == "batch" else r.sequence_length
    if not isinstance(tokens, int) or not isinstance(was, int) or was <= 0:
        return None
    return tokens * x // was


def _source(k: Known, kind: str, arg: str | None) -> dict[str, str]:
    """A point the prediction used, as its query, the moved axis's value filled in where the point left it
    to the model (its report says what it was)."""
    if kind == "batch":
        return {**k.query, "batch": str(batch_of(k))}
    return {**k.query, f"arg.{arg}": str(seq_of(k, arg or ""))}


def tokens_per_s(report: dict[str, Any]) -> float | None:
    """Tokens per second per device (an exact report's JSON or a prediction): the step's tokens
    (``tokens_per_step``: batch x sequence where the batch holds token ids) over every device, per estimated
    step -- compare's throughput (jaxmem.plan.throughput); None for a batch without tokens or no estimate."""
    step = report.get("step_time") or {}
    tokens = report.get("tokens_per_step")
    devices = (report.get("target") or {}).get("devices")
    est = step.get("estimate_s")
    if not (step.get("available") and isinstance(est, (int, float)) and est > 0 and isinstance(tokens, int)
            and tokens > 0 and isinstance(devices, int) and devices > 0):
        return None
    return tokens / devices / est
