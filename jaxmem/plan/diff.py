"""Two analyses side by side: what grew, what appeared, and what differs in how they were made.

The canary for upgrades: the same step analyzed under two jax versions (or two commits of the
model, two option sets) and diffed -- the per-device peak, each breakdown part, the modules and
buffers live at the peak that were added, removed, grew or shrank, and the options, versions and
XLA flags that differ. ``jaxmem diff --max-growth SHARE`` turns it into a gate (exit 4).

The two inputs are ``jaxmem analyze --json`` reports read as JSON, not as :class:`Report`
objects: a report of an older or newer jaxmem, with keys this one does not know, still diffs on
what both have.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from typing import Any

from jaxmem import files
from jaxmem.errors import UserError, clip
from jaxmem.report import BREAKDOWN_KEYS

MAX_REPORT_BYTES = 256 << 20   # a report with its timeline is a few MB; far more is not one
REQUIRED = ("per_device_peak_bytes", "breakdown")
# The choices and circumstances that make two reports differ, compared key by key.
SETTINGS = ("model", "source", "layout", "mesh", "options", "target", "versions", "xla_flags")


@dataclasses.dataclass(frozen=True)
class Change:
    """One named thing (a breakdown part, a module, a buffer) in both reports or one."""

    name: str
    old: int
    new: int

    @property
    def delta(self) -> int:
        return self.new - self.old


@dataclasses.dataclass(frozen=True)
class ReportDiff:
    old_path: str
    new_path: str
    old_peak: int
    new_peak: int
    breakdown: tuple[Change, ...]
    modules: tuple[Change, ...]          # modules live at the peak, largest change first
    buffers: tuple[Change, ...]          # buffers live at the peak, by module, shape and category
    settings: dict[str, tuple[Any, Any]]  # what differs in how the two were made: key -> (old, new)
    max_growth: float | None = None

    @property
    def growth(self) -> float | None:
        """The peak's growth as a share of the old peak (None when the old peak is 0)."""
        return None if self.old_peak == 0 else (self.new_peak - self.old_peak) / self.old_peak

    @property
    def exceeded(self) -> bool:
        """The gate: the peak grew by more than max_growth."""
        if self.max_growth is None or self.new_peak <= self.old_peak:
            return False
        return self.growth is None or self.growth > self.max_growth

    def to_json(self) -> dict[str, Any]:
        def rows(changes):
            return [{"name": c.name, "old": c.old, "new": c.new, "delta": c.delta,
                     "change": kind(c)} for c in changes]

        return {
            "schema": "jaxmem.diff/1", "old": self.old_path, "new": self.new_path,
            "peak": {"old": self.old_peak, "new": self.new_peak, "delta": self.new_peak - self.old_peak,
                     "growth": self.growth},
            "breakdown": rows(self.breakdown), "modules": rows(self.modules), "buffers": rows(self.buffers),
            "settings": {k: {"old": o, "new": n} for k, (o, n) in self.settings.items()},
            "gate": {"max_growth": self.max_growth, "exceeded": self.exceeded},
        }


def kind(c: Change) -> str:
    if c.old == 0 and c.new > 0:
        return "added"
    if c.new == 0 and c.old > 0:
        return "removed"
    return "grown" if c.delta > 0 else "shrunk" if c.delta < 0 else "same"


def load(path: str, option: str) -> dict:
    """An `analyze --json` report from `path` (bounded, regular files only); UserError naming it."""
    fix = "give the file that `jaxmem analyze ... --json > FILE.json` wrote"
    data = files.read_user_file(path, MAX_REPORT_BYTES, option, fix)
    try:
        d = files.loads_json(data, f"{option} {path}")
    except ValueError as e:   # UnicodeDecodeError included
        raise UserError(f"{option} {path}: not JSON ({str(e)[:120]}); {fix}") from None
    if not isinstance(d, dict) or d.get("schema", "jaxmem.report/1") != "jaxmem.report/1":
        what = "a list (a `compare` plan?)" if isinstance(d, list) else "not a jaxmem.report/1 object"
        raise UserError(f"{option} {path}: {what}; {fix}")
    missing = [k for k in REQUIRED if k not in d]
    if missing or not isinstance(d.get("breakdown"), dict):
        raise UserError(f"{option} {path}: not an analysis report (no {', '.join(missing) or 'breakdown'}); {fix}")
    _check_values(d, f"{option} {path}", fix)
    return d


MAX_BYTES = 2**63 - 1   # no byte count a report holds is larger (and every one converts to a float)


def _check_values(d: dict, where: str, fix: str) -> None:
    """Every number of the report finite and at most 2^63 in size (NaN, Infinity or a 400-digit
    integer is no report jaxmem wrote: it would print NaN as JSON or overflow a float), every byte
    count a non-negative integer, and modules / top_buffers lists of rows with their fields: a
    UserError naming the field otherwise."""
    bad = _first_bad_number(d)
    if bad is not None:
        at, x = bad
        if isinstance(x, float):
            raise UserError(f"{where}: {at or 'the document'} is {x}, not a finite number; {fix}")
        raise UserError(f"{where}: {at} is an integer of {len(str(abs(x)))} digits, beyond any byte count; {fix}")

    def byte_count(value, field: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"{where}: {field} is {clip(json.dumps(value), 60)}, not a byte count (a whole number "
                            f"of at least 0); {fix}")

    byte_count(d["per_device_peak_bytes"], "per_device_peak_bytes")
    for k, v in d["breakdown"].items():
        byte_count(v, f"breakdown.{clip(str(k), 60)}")
    for field, name_key, size_key in (("modules", "module_path", "bytes"), ("top_buffers", None, "size")):
        rows = d.get(field)
        if rows is None:
            continue
        if not isinstance(rows, list):
            raise UserError(f"{where}: {field} is {clip(json.dumps(rows), 60)}, not a list of rows; {fix}")
        for n, row in enumerate(rows):
            if not isinstance(row, dict):
                raise UserError(f"{where}: {field}[{n}] is {clip(json.dumps(row), 60)}, not a row (an object); "
                                f"{fix}")
            if name_key is not None and not isinstance(row.get(name_key), str):
                raise UserError(f"{where}: {field}[{n}].{name_key} is missing or not text; {fix}")
            byte_count(row.get(size_key), f"{field}[{n}].{size_key}")


def _bad(x) -> bool:
    return (isinstance(x, float) and not math.isfinite(x)) or (isinstance(x, int) and abs(x) > MAX_BYTES)


def _first_bad_number(d) -> tuple[str, float | int] | None:
    """(its path, the value) of a NaN, an infinity or an integer beyond 2^63 in `d`, else None. The
    walk keeps no paths (a 300,000-row report in a fraction of a second); the path is found again
    only for a value that is bad."""
    todo = [d]
    found = False
    big, inf = MAX_BYTES, math.inf
    while todo and not found:   # json's own types, compared by type: this walk is most of diff's time
        x = todo.pop()
        for v in x.values() if type(x) is dict else x:
            t = type(v)
            if t is dict or t is list:
                todo.append(v)
            elif (t is int and not -big <= v <= big) or (t is float and (v != v or v == inf or v == -inf)):
                found = True
                break
    if not found:
        return None
    paths: list[tuple[Any, str]] = [(d, "")]
    while paths:
        x, at = paths.pop()
        items = ((clip(str(k), 60), v) for k, v in x.items()) if isinstance(x, dict) else \
            ((f"[{n}]", v) for n, v in enumerate(x))
        for k, v in items:
            here = f"{at}.{k}" if at and not k.startswith("[") else f"{at}{k}"
            if isinstance(v, (dict, list)):
                paths.append((v, here))
            elif _bad(v):
                return here, v
    return None


def _changes(old: dict[str, int], new: dict[str, int], order=None) -> tuple[Change, ...]:
    both = set(old) | set(new)   # sets and dicts only: a 300,000-module report diffs in linear time
    first = [n for n in order if n in both] if order is not None else []
    listed = set(first)
    names = first + sorted(n for n in both if n not in listed)
    out = [Change(n, int(old.get(n, 0)), int(new.get(n, 0))) for n in names]
    if order is None:   # largest change first; ties by name
        out.sort(key=lambda c: (-abs(c.delta), c.name))
    return tuple(c for c in out if order is not None or c.delta)


def _modules(d: dict) -> dict[str, int]:
    out: Counter[str] = Counter()   # a module listed twice counts twice, in both reports alike
    for m in d.get("modules") or ():
        out[str(m["module_path"])] += int(m["bytes"])
    return dict(out)


def _buffers(d: dict) -> dict[str, int]:
    """The buffers live at the peak, summed by (module, shape, category): a buffer renamed by XLA
    between versions (fusion.12 -> fusion.13) is the same buffer here."""
    out: Counter[str] = Counter()
    for b in d.get("top_buffers") or ():
        key = f"{b.get('module_path') or '-'} {b.get('dtype', '')}{b.get('shape')} {b.get('category')}"
        out[key] += int(b["size"])
    return dict(out)


def _settings(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    out: dict[str, tuple[Any, Any]] = {}
    for key in SETTINGS:
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                if a.get(k) != b.get(k):
                    out[f"{key}.{k}"] = (a.get(k), b.get(k))
        elif a != b:
            out[key] = (a, b)
    return out


def diff(old_path: str, new_path: str, *, max_growth: float | None = None) -> ReportDiff:
    old, new = load(old_path, "OLD"), load(new_path, "NEW")
    return ReportDiff(
        old_path=old_path, new_path=new_path,
        old_peak=int(old["per_device_peak_bytes"]), new_peak=int(new["per_device_peak_bytes"]),
        breakdown=_changes(old["breakdown"], new["breakdown"], order=BREAKDOWN_KEYS),
        modules=_changes(_modules(old), _modules(new)),
        buffers=_changes(_buffers(old), _buffers(new)),
        settings=_settings(old, new), max_growth=max_growth)
