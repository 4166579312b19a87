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

import contextlib
import dataclasses
import functools
import gc
import json
import math
from collections import Counter
from collections.abc import Iterator
from itertools import chain, compress, repeat
from json.encoder import encode_basestring_ascii as _json_str
from operator import is_, itemgetter, sub
from typing import Any, NamedTuple

from jaxmem import files
from jaxmem.errors import UserError, clip
from jaxmem.report import BREAKDOWN_KEYS

MAX_REPORT_BYTES = 256 << 20   # a report with its timeline is a few MB; far more is not one
REQUIRED = ("per_device_peak_bytes", "breakdown")
# The choices and circumstances that make two reports differ, compared key by key.
SETTINGS = ("model", "source", "layout", "mesh", "options", "target", "versions", "xla_flags")


class Change(NamedTuple):
    """One named thing (a breakdown part, a module, a buffer) in both reports or one (a tuple:
    600,000 of them for two 300,000-module reports are built in C)."""

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

    def to_json(self, rows: bool = True) -> dict[str, Any]:
        """The diff as `jaxmem diff --json` prints it (`rows=False`: its row lists left empty)."""
        def rows_of(changes):
            return [{"name": c.name, "old": c.old, "new": c.new, "delta": c.delta,
                     "change": kind(c)} for c in changes] if rows else []

        return {
            "schema": "jaxmem.diff/1", "old": self.old_path, "new": self.new_path,
            "peak": {"old": self.old_peak, "new": self.new_peak, "delta": self.new_peak - self.old_peak,
                     "growth": self.growth},
            "breakdown": rows_of(self.breakdown), "modules": rows_of(self.modules), "buffers": rows_of(self.buffers),
            "settings": {k: {"old": o, "new": n} for k, (o, n) in self.settings.items()},
            "gate": {"max_growth": self.max_growth, "exceeded": self.exceeded},
        }

    def json_text(self) -> str:
        """`json.dumps(self.to_json(), indent=2, allow_nan=False)`, the same text, with the rows
        written from a template in C's loops: Python 3.12's json writes an indented document a
        value at a time in Python (2.4 s for two 300,000-module reports; this: a fraction)."""
        return "".join(self.json_pieces())

    def json_pieces(self) -> Iterator[str]:
        """json_text in pieces of at most ROWS_A_PIECE rows, as `jaxmem diff --json` writes it:
        the text of two 300,000-module reports is 100 MB, never held whole."""
        rows = {"breakdown": self.breakdown, "modules": self.modules, "buffers": self.buffers}
        yield "{"
        for i, (key, value) in enumerate(self.to_json(rows=False).items()):
            yield f"{',' if i else ''}\n  {json.dumps(key)}: "
            if rows.get(key):
                yield "["
                for n in range(0, len(rows[key]), ROWS_A_PIECE):
                    yield ",\n" if n else "\n"
                    yield _rows_text(rows[key][n:n + ROWS_A_PIECE])
                yield "\n  ]"
            else:
                yield json.dumps(value, indent=2, allow_nan=False).replace("\n", "\n  ")   # strings hold no newline
        yield "\n}"


_new_change = functools.partial(tuple.__new__, Change)   # Change((name, old, new)) without a Python call


_ROW = ('    {\n      "name": %s,\n      "old": %s,\n      "new": %s,\n      "delta": %s,\n      "change": "%s"\n'
        '    }')
ROWS_A_PIECE = 20_000   # rows of the JSON text written at a time: 2 MB


def _rows_text(changes) -> str:
    """The Changes as json.dumps(indent=2) writes their rows of to_json, inside a list of the
    document, joined by ",\n": one template of every row, filled in one `%` (str() of each int, as
    json writes it) -- half the time of a format per row."""
    names, olds, news = zip(*changes, strict=True)
    fields = zip(map(_json_str, names), olds, news, map(sub, news, olds), map(kind, changes),
                 strict=True)
    return ",\n".join(repeat(_ROW, len(changes))) % tuple(chain.from_iterable(fields))


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
    suspect: list[bool] = []   # per level of the document: may it hold a number no report holds
    text_suspect = _text_has_bad(data)   # None: a text in UTF-16 or -32, read by the walk below
    each_level = None if text_suspect is not None else lambda values: suspect.append(_level_has_bad(values))
    try:
        d = files.loads_json(data, f"{option} {path}", each_level=each_level)
    except ValueError as e:   # UnicodeDecodeError included
        raise UserError(f"{option} {path}: not JSON ({str(e)[:120]}); {fix}") from None
    if text_suspect:
        suspect.append(True)
    if not isinstance(d, dict) or d.get("schema", "jaxmem.report/1") != "jaxmem.report/1":
        what = "a list (a `compare` plan?)" if isinstance(d, list) else "not a jaxmem.report/1 object"
        raise UserError(f"{option} {path}: {what}; {fix}")
    missing = [k for k in REQUIRED if k not in d]
    if missing or not isinstance(d.get("breakdown"), dict):
        raise UserError(f"{option} {path}: not an analysis report (no {', '.join(missing) or 'breakdown'}); {fix}")
    _check_values(d, f"{option} {path}", fix, suspect=any(suspect))
    return d


MAX_BYTES = 2**63 - 1   # no byte count a report holds is larger (and every one converts to a float)


def _check_values(d: dict, where: str, fix: str, *, suspect: bool = True) -> None:
    """Every number of the report finite and at most 2^63 in size (NaN, Infinity or a 400-digit
    integer is no report jaxmem wrote: it would print NaN as JSON or overflow a float), every byte
    count a non-negative integer, and modules / top_buffers lists of rows with their fields: a
    UserError naming the field otherwise. `suspect=False`: the walk that read it (_level_has_bad on
    every level) found no number out of bounds."""
    bad = _first_bad_number(d) if suspect else None
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
        if _rows_sound(rows, name_key, size_key):
            continue
        for n, row in enumerate(rows):   # the first row that is not, named
            if not isinstance(row, dict):
                raise UserError(f"{where}: {field}[{n}] is {clip(json.dumps(row), 60)}, not a row (an object); "
                                f"{fix}")
            if name_key is not None and not isinstance(row.get(name_key), str):
                raise UserError(f"{where}: {field}[{n}].{name_key} is missing or not text; {fix}")
            byte_count(row.get(size_key), f"{field}[{n}].{size_key}")


def _rows_sound(rows: list, name_key: str | None, size_key: str) -> bool:
    """Every row an object with a byte count at `size_key` (and text at `name_key`), checked a
    column at a time in C's loops (map, set, min): 300,000 rows in milliseconds. False sends the
    caller to the row-by-row check that names the first bad row."""
    if not rows:
        return True
    if set(map(type, rows)) != {dict}:
        return False
    sizes: list[Any] = list(map(dict.get, rows, repeat(size_key)))   # ints, checked on the next line
    if set(map(type, sizes)) != {int} or min(sizes) < 0:   # bool is its own type, None is not int
        return False
    return name_key is None or set(map(type, map(dict.get, rows, repeat(name_key)))) == {str}


def _bad(x) -> bool:
    return (isinstance(x, float) and not math.isfinite(x)) or (isinstance(x, int) and abs(x) > MAX_BYTES)


def _first_bad_number(d) -> tuple[str, float | int] | None:
    """(its path, the value) of a NaN, an infinity or an integer beyond 2^63 in `d`, else None: a
    walk value by value, for a report whose levels _level_has_bad flagged (load's walk)."""
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


# each digit read as 0, E as e, and + dropped: where the JSON text holds an integer beyond 2^63 (19
# digits or more), a float that is not finite once read (an exponent of 3 digits or more: 1e400,
# 1E+400; 309 digits or more: 19 first) or a NaN/Infinity, one of these marks is
_MARKS_TABLE = bytes.maketrans(b"123456789E", b"000000000e")
_BAD_MARKS = (b"0" * 19, b"e000", b"NaN", b"Infinity")


def _text_has_bad(data: bytes) -> bool | None:
    """Whether the JSON text `data` may hold a number no report holds (as _level_has_bad, from the
    text: read as _MARKS_TABLE says, then a search for each mark, in C's loops -- a 50 MB report in
    tens of milliseconds, against half a second for a walk of its values). True may be a false
    alarm (19 digits within a name) that the walk by value then clears. None: a text not in UTF-8,
    whose numbers this search does not see."""
    if json.detect_encoding(data) not in ("utf-8", "utf-8-sig"):
        return None
    text = data.translate(_MARKS_TABLE, b"+")
    return any(map(text.__contains__, _BAD_MARKS))


def _level_has_bad(values: list) -> bool:
    """Whether `values` (one level of a document) may hold an integer beyond 2^63 or a float that is
    not finite: its integers by their min and max, its floats by their sum (a NaN or an infinity
    makes a sum not finite), in C's loops -- 300,000 rows in a fraction of a second. True may be a
    false alarm (finite floats whose sum overflows) that the walk by value then clears."""
    types = list(map(type, values))
    ints = list(compress(values, map(is_, types, repeat(int))))   # json's own types: bool is not int
    if ints and (max(ints) > MAX_BYTES or min(ints) < -MAX_BYTES):
        return True
    floats = list(compress(values, map(is_, types, repeat(float))))
    return bool(floats) and not math.isfinite(sum(floats))


def _changes(old: dict[str, int], new: dict[str, int], order=None) -> tuple[Change, ...]:
    """The parts, modules or buffers of the two reports: in `order` (then by name) with those that
    did not change, or without them, largest change first and ties by name. Dicts and C's loops
    only: a 300,000-module report in linear time, and a fraction of a second."""
    if order is not None:
        both = set(old) | set(new)
        first = [n for n in order if n in both]
        listed = set(first)
        names = first + sorted(n for n in both if n not in listed)
        return tuple(Change(n, int(old.get(n, 0)), int(new.get(n, 0))) for n in names)
    # Every name in the reports' own order (OLD's, then what NEW adds), not a set's: that order has
    # long sorted runs, which the sort by name below merges at once (a set's order: ten times the
    # sort's time). NEW's bytes in that order come from one merge, OLD's as they are: one look-up a
    # name in all (each is a miss of the CPU's caches on a large report).
    news_of = {**dict.fromkeys(old, 0), **new}   # OLD's names first (0 where NEW lacks one), then NEW's own
    names, news = list(news_of), list(news_of.values())
    olds = [*old.values(), *repeat(0, len(names) - len(old))]
    deltas = list(map(sub, news, olds))
    keep = list(compress(range(len(names)), deltas))   # those that changed: only they are sorted
    keep.sort(key=names.__getitem__)   # names are distinct: by name, then (stable) by the change's size
    size = list(map(abs, deltas))
    keep.sort(key=size.__getitem__, reverse=True)   # stable: equal changes stay in name order
    rows = zip(map(names.__getitem__, keep), map(olds.__getitem__, keep), map(news.__getitem__, keep), strict=True)
    return tuple(map(_new_change, rows))


def _modules(d: dict) -> dict[str, int]:
    """Bytes by module path (load checked each row: a path and a byte count)."""
    rows = d.get("modules") or ()
    paths, sizes = list(map(itemgetter("module_path"), rows)), list(map(itemgetter("bytes"), rows))
    out = dict(zip(paths, sizes, strict=True))
    if len(out) == len(paths):
        return out
    summed: Counter[str] = Counter()   # a module listed twice counts twice, in both reports alike
    for path, size in zip(paths, sizes, strict=True):
        summed[path] += size
    return dict(summed)


def _buffers(d: dict) -> dict[str, int]:
    """The buffers live at the peak, summed by (module, shape, category): a buffer renamed by XLA
    between versions (fusion.12 -> fusion.13) is the same buffer here."""
    rows = d.get("top_buffers") or ()
    modules = [m or "-" for m in map(dict.get, rows, repeat("module_path"))]
    keys = list(map("%s %s%s %s".__mod__, zip(modules, map(dict.get, rows, repeat("dtype"), repeat("")),
                                              map(dict.get, rows, repeat("shape")),
                                              map(dict.get, rows, repeat("category")), strict=True)))   # str() each
    sizes = list(map(itemgetter("size"), rows))
    out = dict(zip(keys, sizes, strict=True))
    if len(out) == len(keys):
        return out
    summed: Counter[str] = Counter()   # buffers of one module, shape and category: their bytes summed
    for key, size in zip(keys, sizes, strict=True):
        summed[key] += size
    return dict(summed)


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
    with _collector_paused():
        return _diff(old_path, new_path, max_growth)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while two reports are read and diffed: they are trees of
    plain values (no cycle to find), and the millions of objects two 300,000-module reports hold
    would otherwise be walked again and again as they are made (a fifth of diff's time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _diff(old_path: str, new_path: str, max_growth: float | None) -> ReportDiff:
    (old, old_modules, old_buffers), (new, new_modules, new_buffers) = _read(old_path, "OLD"), _read(new_path, "NEW")
    return ReportDiff(
        old_path=old_path, new_path=new_path,
        old_peak=int(old["per_device_peak_bytes"]), new_peak=int(new["per_device_peak_bytes"]),
        breakdown=_changes(old["breakdown"], new["breakdown"], order=BREAKDOWN_KEYS),
        modules=_changes(old_modules, new_modules), buffers=_changes(old_buffers, new_buffers),
        settings=_settings(old, new), max_growth=max_growth)


def _read(path: str, option: str) -> tuple[dict, dict[str, int], dict[str, int]]:
    """load(path): the report, less its module and buffer rows, and those rows by name. The rows
    (most of a large report) are freed before the other report is read: half the memory at most,
    and the pages the first held are those the second reuses."""
    d = load(path, option)
    modules, buffers = _modules(d), _buffers(d)
    d.pop("modules", None)
    d.pop("top_buffers", None)
    return d, modules, buffers
