"""advise's search, a strategy of jaxmem.plan.runner: which plan to compile next, and when to stop.

Every plan (a combination of changes, jaxmem.plan.forecast.universe) is predicted from the original's
report (jaxmem.plan.forecast: measured ratios once a change's probe compiled, priors until then); the
search keeps the *live* ones and compiles them best first, one job per free worker, re-predicting as each
compile lands:

* a plan is live while it can fit (its peak, less its prediction's slack, fits its memory fraction's pool),
  can win (its throughput per device, plus the slack, beats the best compiled plan that fits of its kind)
  and needs each of its changes (without any one, or with a smaller memory fraction, it is not predicted
  to fit at most 1% slower). The kinds (KINDS), each with its own winner so that one kind's fast plans do
  not hide the best of another: the same training on the GPUs as given (the free fixes, offload, mesh
  changes), a quantized frozen base (int8 / nf4: QLoRA), adapters instead of every weight (LoRA), more GPUs;
* the next job is the best live plan (kinds in that order, then those predicted to fit at the prediction
  itself before those that only might, then the highest predicted throughput per device, then the fewest
  changes): the plan itself when each of its changes is measured, else the probe of its first unmeasured
  change (that single change alone, or accumulation at its largest);
* **the stop rule**: the search ends when no plan is live -- every plan not compiled, at its predicted best
  (peak less its slack, throughput plus its slack), either does not fit or cannot beat the best compiled
  plan of its kind -- or after `max_compiles` compiles (then said so). When nothing compiled fits by then,
  the plan predicted to come closest is compiled once, so that the closest plan named is a compile.

Its snapshot (`rows()`) is the list the user sees while it runs: the compiled plans (exact) and the live
plans predicted to fit (predicted), ranked together, with "N of M compiled, about S s left".
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import Progress as RichProgress
from rich.progress import SpinnerColumn, TextColumn

from jaxmem.plan import forecast as fc
from jaxmem.plan.runner import Outcome
from jaxmem.program.options import AnalyzeOptions

KINDS = ("the same training on the GPUs as given", "a quantized frozen base (QLoRA)", "adapters only (LoRA)",
         "more GPUs")


class Search:
    """The state of one advise search (runner.drive calls propose and record)."""

    def __init__(self, original, plans: dict[tuple, AnalyzeOptions], forecast: fc.Forecast, fractions: list[float],
                 workers: int, max_compiles: int, make: Callable[[tuple, AnalyzeOptions, Outcome | None], Any]):
        self.original, self.plans, self.forecast, self.fractions = original, plans, forecast, fractions
        self.workers, self.max_compiles, self.make = max(1, workers), max_compiles, make
        self.devices0 = getattr(original.report.target, "devices", 1) or 1
        self.devices = {ch: fc.devices_of(o) for ch, o in plans.items()}
        self.exact: dict[tuple, Any] = {}        # plan -> its Candidate
        self.inflight: set[tuple] = set()
        self.compiles = self.cached = 0
        self.durations: list[float] = []
        self.capped = False
        self._closest_tried = False
        self.live: list[tuple[tuple, fc.Prediction]] = []
        self.refresh()

    def kind(self, ch: tuple) -> int:
        """The plan's index in KINDS."""
        d = dict(ch)
        if self.devices.get(ch, self.devices0) > self.devices0:
            return 3
        if "lora" in d:
            return 2
        return 1 if d.get("base") in ("int8", "nf4") else 0

    def refresh(self) -> None:
        """The live plans, best first (the stop rule's terms: the module docstring)."""
        best = [0.0] * len(KINDS)
        for ch, c in self.exact.items():
            if c.fits:
                k = self.kind(ch)
                best[k] = max(best[k], fc.score_of(c.report))
        live = []
        for ch in self.plans:
            if ch in self.exact or ch in self.inflight:
                continue
            p = self.forecast.predict(ch, self.devices[ch])
            if p is None or not p.can_fit or (best[self.kind(ch)] and p.best_score() <= best[self.kind(ch)]):
                continue
            live.append((ch, p))
        live.sort(key=lambda x: (self.kind(x[0]), not x[1].fits, -x[1].score, len(x[0])))
        self.live = [(ch, p) for ch, p in live if not fc.needless(ch, self.forecast, self.devices[ch], self.fractions)]

    def _job(self, ch: tuple) -> tuple | None:
        """What to compile for plan `ch` now: a probe of its first unmeasured change, or the plan itself."""
        if len(ch) > 1:
            for change in ch:
                if not self.forecast.is_measured(change):
                    probe = (self.forecast.probe_for(change),)
                    return probe if probe in self.plans else None
        return ch

    def propose(self) -> list[tuple[str, AnalyzeOptions, tuple]]:
        out: list[tuple[str, AnalyzeOptions, tuple]] = []
        for ch, _ in self.live:
            if len(self.inflight) + len(out) >= self.workers:
                break
            if self.compiles + len(self.inflight) + len(out) >= self.max_compiles:
                self.capped = True
                break
            job = self._job(ch)
            if job is None or job in self.exact or job in self.inflight or any(job == o[2] for o in out):
                continue
            out.append((self.make(job, self.plans[job], None).label, self.plans[job], job))
        if not out and not self.live and not self.inflight and not self._closest_tried and \
                not any(c.fits for c in self.exact.values()):
            # nothing can fit: the plan predicted to come closest is compiled, so that the closest is a compile
            self._closest_tried = True
            closest = self._closest()
            if closest is not None and self.compiles < self.max_compiles:
                out.append((self.make(closest, self.plans[closest], None).label, self.plans[closest], closest))
        self.inflight.update(o[2] for o in out)
        return out

    def _closest(self) -> tuple | None:
        """The plan on the GPUs as given predicted to leave the least excess (peak over its pool), not compiled."""
        best = None
        for ch in self.plans:
            if ch in self.exact or self.kind(ch) == 3:
                continue
            p = self.forecast.predict(ch, self.devices[ch])
            if p is not None and p.budget > 0 and (best is None or p.peak / p.budget < best[0]):
                best = (p.peak / p.budget, len(ch), ch)
        return None if best is None else best[2]

    def record(self, ch: tuple, out: Outcome) -> None:
        self.inflight.discard(ch)
        c = self.make(ch, self.plans[ch], out)
        self.exact[ch] = c
        self.compiles += 1
        hit = bool(out.report is not None and out.report.timings.get("cache_hit"))
        self.cached += hit
        if out.report is not None and not hit:
            self.durations.append(out.seconds)
        if len(ch) == 1 and ch[0][0] != "fraction":
            self.forecast.learn(ch[0], out.report)
        self.refresh()

    # ------------------------------------------------------------------ what the user sees meanwhile
    def planned(self) -> int:
        """Compiles done, running and (about) to come: the distinct jobs the live plans need, to the cap."""
        jobs = {j for ch, _ in self.live if (j := self._job(ch)) is not None and j not in self.exact}
        return min(self.max_compiles, self.compiles + len(self.inflight | jobs))

    def eta_s(self) -> float | None:
        if not self.durations:
            return None
        left = self.planned() - self.compiles
        return statistics.median(self.durations) * -(-left // self.workers)

    def progress_text(self) -> str:
        eta = self.eta_s()
        left = "" if self.planned() == self.compiles else (
            ", timing the first compiles" if eta is None else f", about {eta:.0f} s left")
        return f"{self.compiles} of {self.planned()} compiled{left}"

    def predicted(self, limit: int = 12) -> list[tuple[tuple, fc.Prediction]]:
        """The live plans predicted to fit (at the prediction itself, not its best), best first."""
        return [(ch, p) for ch, p in self.live if p.fits][:limit]


class ProgressLine:
    """advise's line on stderr while it searches (a terminal only): "N of M compiled, about S s left", and the
    best plan so far."""

    def __init__(self, enabled: bool):
        self._p = None
        if enabled and sys.stderr.isatty():
            self._p = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), console=Console(stderr=True),
                                   transient=True)
            self._task = self._p.add_task("advise: compiling the step as given")
            self._p.start()

    def show(self, text: str) -> None:
        if self._p is not None:
            self._p.update(self._task, description=text)

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()
