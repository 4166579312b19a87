"""Fit searches from a few compiles: the largest batch, the largest value of a workload argument
(a sequence length), the smallest data-parallel size that fits.

Within one compiled regime, per-device memory is close to affine in the batch (activations grow
with it), close to quadratic in the sequence length (attention scores) and close to affine in
1/devices for a fixed global batch. So a search does not double and bisect (~18 compiles): it
compiles two or three points, fits that curve, jumps to the largest value the curve says fits,
and confirms it with a compile there and one at the next step (one granule more; for devices,
the next smaller data-parallel size). When the curve was off, the new points refine it (the fit
uses the points nearest the boundary), bisecting if the predictions stop closing in.

An answer B is proven by two compiles, both kept: B fits, and B plus one granule does not. "Fits"
is the analysis' own verdict with a margin: peak <= (1 - margin) x usable memory.

A search here is a state machine (`propose` the next probes, `record` their peaks) so that many
searches share one pool of workers: `run_searches` drives them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

# Fraction of usable memory a fit answer keeps free. 5%: about twice the largest error jaxmem's
# accuracy benchmark measured against real runs (2.74%; docs/how-it-works.md), so an answer at the
# boundary still fits when the prediction is at its worst; allocator fragmentation takes the rest.
DEFAULT_MARGIN = 0.05

KINDS = ("batch", "seq", "devices")


@dataclasses.dataclass(frozen=True)
class Probe:
    """One compile of the search: the value tried, XLA's answer for it."""

    value: int
    peak_bytes: int | None        # None: XLA refused the program at compile time (does not fit)
    usable_bytes: int | None
    fits: bool                    # with the margin
    cached: bool = False
    error: str | None = None      # the workload refused this value (e.g. a sequence beyond its position table)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    kind: str                     # batch | seq | devices
    arg: str | None               # the workload argument for kind == "seq"
    answer: int | None            # batch / seq: the largest value that fits (0: none);
                                  # devices: the smallest data-parallel size that fits (None: none)
    granule: int                  # the step between candidate values (devices: 0, the list is explicit)
    capped: bool                  # stopped at the search limit: at least `answer` fits
    margin: float
    fits_at: Probe | None         # the compile at the answer (fits)
    fails_at: Probe | None        # the compile one step further (does not fit)
    probes: tuple[Probe, ...]
    compiles: int                 # probes that compiled (the rest came from the cache)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["probes"] = [p.to_json() for p in self.probes]
        return d

    @classmethod
    def from_json(cls, d: dict) -> SearchResult:
        d = dict(d)
        for k in ("fits_at", "fails_at"):
            d[k] = None if d.get(k) is None else Probe(**d[k])
        d["probes"] = tuple(Probe(**p) for p in d.get("probes", ()))
        return cls(**d)


class Search:
    """The largest candidate index whose compile fits, memory growing with the index.

    candidates(i) -> value, for 0 <= i < count; feature(value) -> x, in which the peak is modelled
    as a polynomial of `degree` (1: affine, 2: quadratic).
    """

    def __init__(self, candidates: Callable[[int], int], count: int, feature: Callable[[int], float],
                 degree: int = 1, first: Sequence[int] = (0, 3)):
        self.candidates, self.count, self.feature, self.degree = candidates, count, feature, degree
        self.first = sorted({min(i, count - 1) for i in first})
        self.points: dict[int, tuple[int | None, bool]] = {}   # index -> (peak, fits)
        self.budgets: list[int] = []
        self._last_width: int | None = None

    # -- the state machine ------------------------------------------------------------------
    def record(self, index: int, peak: int | None, fits: bool, budget: int | None) -> None:
        self.points[index] = (peak, fits)
        if budget is not None:
            self.budgets.append(budget)

    def bounds(self) -> tuple[int, int | None]:
        """(largest fitting index or -1, smallest non-fitting index above it or None)."""
        fit = [i for i, (_, ok) in self.points.items() if ok]
        lo = max(fit) if fit else -1
        above = [i for i, (_, ok) in self.points.items() if not ok and i > lo]
        return lo, (min(above) if above else None)

    @property
    def done(self) -> bool:
        if not self.points:
            return False
        if 0 in self.points and not self.points[0][1]:
            return True                    # the first candidate does not fit: nothing does
        lo, hi = self.bounds()
        if hi is not None:
            return hi == lo + 1
        return lo >= self.count - 1        # capped

    def propose(self) -> list[int]:
        """The next indices to compile (in parallel); [] when done.

        Without an upper bound yet: extrapolate the curve through the smallest point and the
        largest that fits (a wide baseline: adjacent points differ by XLA's jitter as much as by
        the batch), or grow 4x while the curve has not risen by 0.1% of the budget. With a bracket: interpolate inside
        it, bisecting whenever an interpolation failed to halve the bracket. Each guess is
        probed with its next step, so a right guess is proven in the same round.
        """
        if self.done:
            return []
        if not self.points:
            return list(self.first)
        lo, hi = self.bounds()
        if lo < 0:                          # the first probes all fail but index 0 is untried
            return [0]
        top = (hi - 1) if hi is not None else self.count - 1
        predicted = True
        if hi is None:
            guess = self._extrapolate(lo, top)
            if guess is None or guess <= lo:
                guess, predicted = 4 * lo + 3, False
        else:
            width = hi - lo
            if self._last_width is not None and width > self._last_width // 2:
                # the last interpolation did not close in enough
                guess, predicted, self._last_width = (lo + hi) // 2, False, None
            else:
                guess = self._fit([lo, hi], lo, top)
                if guess is None:
                    guess, predicted = (lo + hi) // 2, False
                self._last_width = width
        guess = max(lo + 1, min(guess, top))
        # a prediction is probed with its next step (a right guess is proven in the same round);
        # a bisection or growth step alone
        pair = (guess, guess + 1) if predicted else (guess,)
        out = [i for i in pair if i not in self.points and i < self.count and (hi is None or i < hi)]
        return out or [i for i in range(lo + 1, top + 1) if i not in self.points][:1]

    def _extrapolate(self, lo: int, top: int) -> int | None:
        known = sorted(i for i, (p, ok) in self.points.items() if p is not None and ok)
        if len(known) < 2 or not self.budgets:
            return None
        # A rise under 0.1% of the budget is no slope to extrapolate (fixed costs dominate small
        # batches; XLA's choices move the peak by that much): grow instead until it rises.
        lo_peak, first_peak = self.points[lo][0], self.points[known[0]][0]  # (a fitting compile has a peak)
        if lo_peak is None or first_peak is None or lo_peak - first_peak < 0.001 * min(self.budgets):
            return None
        use = [known[0], lo]
        if self.degree >= 2 and len(known) >= 3:
            use.insert(1, known[len(known) // 2] if known[len(known) // 2] not in use else known[1])
        return self._fit(use, lo, top)

    def _fit(self, use: list[int], lo: int, top: int) -> int | None:
        """The largest index in [lo + 1, top] that the curve through the points `use` keeps
        within the budget (lo + 1 when none does; None when the points give no curve)."""

        pts = [(i, self.points[i][0]) for i in dict.fromkeys(use) if self.points.get(i, (None,))[0] is not None]
        if len(pts) < 2 or not self.budgets:
            return None
        budget = min(self.budgets)
        coef = curve([self.feature(self.candidates(i)) for i, _ in pts], [p for _, p in pts if p is not None],
                     self.degree)
        if coef is None:
            return None
        if float(np.polyval(coef, self.feature(self.candidates(top)))) <= float(np.polyval(
                coef, self.feature(self.candidates(lo)))) and top > lo:
            return None                     # the curve does not rise: no boundary to jump to

        def ok(i: int) -> bool:
            return float(np.polyval(coef, self.feature(self.candidates(i)))) <= budget

        if not ok(lo + 1):
            return lo + 1
        if ok(top):
            return top
        a, b = lo + 1, top                  # ok(a), not ok(b): the curve's own boundary
        while b - a > 1:
            m = (a + b) // 2
            a, b = (m, b) if ok(m) else (a, m)
        return a


def curve(xs: Sequence[float], ys: Sequence[float], degree: int) -> np.ndarray | None:
    """The polynomial of `degree` through the points (x, y) by least squares (numpy.polyfit's coefficients,
    highest power first), of a lower degree when fewer points are given; None when the points' distinct
    x values cannot determine it. The searches here and the explorer's predictions (jaxmem.explore.predict)
    fit memory's curve with it."""
    x = np.asarray(xs, dtype=float)
    deg = min(degree, len(x) - 1)
    if deg < 0 or len(set(x.tolist())) <= deg:
        return None
    return np.polyfit(x, np.asarray(ys, dtype=float), deg)


def result(kind: str, arg: str | None, s: Search, probes: dict[int, Probe], granule: int, margin: float,
           cached: int, descending_devices: bool = False) -> SearchResult:
    lo, hi = s.bounds()
    capped = hi is None and lo >= s.count - 1 and lo >= 0
    fits_at = probes.get(lo) if lo >= 0 else None
    fails_at = probes.get(hi) if hi is not None else (probes.get(0) if lo < 0 else None)
    if kind == "devices":
        answer = fits_at.value if fits_at is not None else None
    else:
        answer = fits_at.value if fits_at is not None else 0
    ordered = tuple(sorted(probes.values(), key=lambda p: p.value))
    return SearchResult(kind, arg, answer, granule, capped, margin, fits_at, fails_at, ordered,
                        compiles=len(probes) - cached)


def divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def fits_with_margin(peak: int | None, usable: int | None, margin: float) -> bool:
    if peak is None or usable is None:
        return False
    return peak <= math.floor(usable * (1.0 - margin))
