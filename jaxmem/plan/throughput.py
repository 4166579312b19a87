"""Throughput per device at the estimated step time, and ranks by it: what compare orders its rows by.

A step trains on its global batch: ``Report.tokens_per_step`` tokens where the batch holds token ids
(batch x sequence), else ``options["batch"]`` samples (an image or feature-vector batch has no
tokens). Per device: divided by every device the step runs on (data, model, stage axes alike), the
number trainers quote as tokens/s/GPU, so that rows at different batch sizes or device counts compare.

The step time is an estimate with a band (the spread of the measured rates it rests on,
jaxmem.compiler.steptime.band): the throughput band is the same work over the band's slow and fast
ends. Two rows whose throughput bands overlap are **tied** -- within the estimate's own spread their
order is not known -- and share a rank.
"""

from __future__ import annotations

import dataclasses

from jaxmem.compiler.steptime import band, tied_with


@dataclasses.dataclass(frozen=True)
class Throughput:
    """A step's work per second per device at its estimated step time."""

    unit: str                  # "tokens" (the batch holds token ids) | "samples"
    per_step: int              # global tokens (or samples) one step trains on
    samples_per_step: int      # global samples (the batch)
    devices: int
    step_s: float              # the estimate
    low_s: float               # its band: the fast end ...
    high_s: float              # ... and the slow end

    @property
    def per_s(self) -> float:
        """tokens (or samples) per second per device at the estimate."""
        return self.per_step / self.step_s / self.devices

    @property
    def band(self) -> tuple[float, float, float]:
        """(estimate, low, high) per second per device: low at the band's slow end."""
        return self.per_s, self.per_step / self.high_s / self.devices, self.per_step / self.low_s / self.devices

    @property
    def tokens_per_s(self) -> float | None:
        return self.per_s if self.unit == "tokens" else None

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_step / self.step_s / self.devices


def of(report) -> Throughput | None:
    """The report's throughput per device, or None without a step-time estimate or a global batch."""
    b = band(getattr(report, "step_time", None))
    if b is None or b[0] <= 0:
        return None
    samples = report.options.get("batch")
    devices = report.target.devices
    if not isinstance(samples, int) or samples <= 0 or not devices:
        return None
    tokens = getattr(report, "tokens_per_step", None)   # reports saved before it have none: samples
    est, lo, hi = b
    return Throughput("tokens" if tokens else "samples", tokens or samples, samples, devices, est,
                      lo if lo > 0 else est, max(hi, est))


def samples_band(t: Throughput) -> tuple[float, float, float]:
    """(estimate, low, high) samples per second per device."""
    s = t.samples_per_step / t.devices
    return s / t.step_s, s / t.high_s, s / t.low_s


def ranks(rows: list[Throughput | None]) -> list[int | None]:
    """Each row's rank by throughput per device, 1 the highest, among the rows given a Throughput
    (the caller passes None for a row that does not fit or has no estimate: it is not ranked).

    By tokens/s when every ranked row counts tokens, else by samples/s (rows that count in both units
    cannot be ranked by tokens). Competition ranking (1, 1, 3): a row whose band overlaps that of a row
    above it is tied with it and takes that row's rank. Equal estimates keep the rows' order."""
    by_tokens = unit_of(rows) == "tokens"
    bands = {i: t.band if by_tokens else samples_band(t) for i, t in enumerate(rows) if t is not None}
    order = sorted(bands, key=lambda i: -bands[i][0])
    ties = tied_with([bands[i] for i in order])
    out: list[int | None] = [None] * len(rows)
    for pos, (i, tie) in enumerate(zip(order, ties, strict=True)):
        out[i] = pos + 1 if tie is None else out[order[tie]]
    return out


def fmt_rate(x: float | None) -> str:
    """A rate as a table shows it: `12,345`, `45.6`, `0.123`; `-` for none."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.3g}"


def unit_of(rows: list[Throughput | None]) -> str:
    """The unit rows are ranked and shown in: "tokens" when every row with a throughput counts tokens."""
    have = [t for t in rows if t is not None]
    return "tokens" if have and all(t.unit == "tokens" for t in have) else "samples"


def per_s_in(t: Throughput | None, unit: str) -> float | None:
    """The row's rate per device in `unit` (unit_of the rows shown together)."""
    if t is None:
        return None
    return t.per_s if unit == "tokens" else t.samples_per_s
