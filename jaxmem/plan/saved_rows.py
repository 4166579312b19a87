"""Saved comparison rows (`jaxmem compare --from FILE.json`): read, checked, and re-judged against
each row's GPU: a verdict is never taken from the file as given."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from jaxmem import files
from jaxmem.compiler import allocator, runtime, targets
from jaxmem.errors import UserError
from jaxmem.plan import search as search_mod
from jaxmem.plan.compare import Cell, from_json, label, ranked
from jaxmem.report import Report
from jaxmem.units import fmt_bytes

# A saved comparison holds each row's full report (tens of kB; with its buffers a few MB): far more
# than any sweep writes, far less than what would exhaust memory.
MAX_PLAN_BYTES = 256 << 20


def load(path: str, on_note: Callable[[str], None] | None = None) -> list[Cell]:
    """Saved rows, re-judged (:func:`rejudge`): a verdict is never taken from the file as given.
    `on_note` gets the lines that say so, and every row whose saved verdict its bytes contradict."""
    data = files.read_user_file(path, MAX_PLAN_BYTES, "--from",
                                "give the FILE.json that jaxmem compare --out (or --json) wrote")
    try:
        d = files.loads_json(data, f"--from {path}")
    except ValueError as e:   # UnicodeDecodeError included
        raise UserError(f"--from {path}: not JSON ({e})") from None
    if d == []:   # a verdict needs a row: "at least one row fits" of none is no answer
        raise UserError(f"--from {path}: holds no rows; give the FILE.json of a comparison that ran")
    try:
        cells, notes = rejudge(from_json(d))
    except UserError as e:
        raise UserError(f"--from {path}: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UserError(f"--from {path}: not a comparison jaxmem can read ({type(e).__name__}: {e})") from None
    if on_note is not None:
        on_note(f"--from {path}: fits and headroom re-judged from each row's saved bytes against its GPU "
                "(the catalogue's memory at the row's memory fraction), not read from the file")
        for n in notes:
            on_note(f"  {n}")
    return ranked(cells)   # the ranks too from the re-judged verdicts, never the file's


def _saved_pools(t, oop: int) -> list[tuple[int, bool]]:
    """The (usable bytes, out-of-pool terms fit) the row's allocator settings give on its catalogue
    GPU: one answer, or two when the note leaves preallocation open (--mem-fraction)."""
    return [(b.usable_bytes, b.out_of_pool_fits) for b in _saved_budgets(t, oop)]


def _saved_budgets(t, oop: int) -> list:
    """The runtime.Budget of each allocator setting the row's note allows (see _saved_pools)."""

    total = targets.CATALOGUE[t.gpu].memory_bytes
    note = t.usable_note or ""
    try:   # the allocator settings the note names (jaxmem.compiler.allocator writes and reads them)
        settings = allocator.from_note(note)
    except ValueError:
        raise UserError(f"the memory settings of a {t.gpu} row are not ones jaxmem writes ({note!r}); "
                        "re-run the comparison") from None
    out = []
    for mode, frac in settings:
        if not (math.isfinite(frac) and 0 < frac <= 1):
            raise UserError(f"a {t.gpu} row's memory fraction {frac} is not in (0, 1]; re-run the comparison")
        usable, room, fits = runtime.pool_budget(total, frac, oop, mode=mode)
        out.append(runtime.Budget(usable, note, room, fits, mode, total, frac))
    return out


def _whole(x, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise UserError(f"{what} is {x!r}, not a whole number of bytes; re-run the comparison")
    return x


def _rejudged_report(r: Report, name: str, notes: list[str]) -> Report:
    peak = _whole(r.per_device_peak_bytes, f"row {name}: per_device_peak_bytes")
    for k, v in r.breakdown.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise UserError(f"row {name}: breakdown.{k} is {v!r}, not a number of bytes; re-run the comparison")

    t = r.target
    judged: tuple = (None, None, ())
    if t.gpu == "cpu":
        memory = usable = fits = headroom = None
    elif t.gpu in targets.CATALOGUE:
        oop = _whole((r.runtime or {}).get("out_of_pool_bytes"), f"row {name}: runtime.out_of_pool_bytes")
        budgets = _saved_budgets(t, oop)
        bud = next((b for b in budgets if b.usable_bytes == t.usable_bytes), budgets[0])
        usable = bud.usable_bytes
        memory = targets.CATALOGUE[t.gpu].memory_bytes
        # judged as analyze does: the runtime's saved terms at both ends of their ranges (runtime.judge)
        rt = runtime.Runtime.from_json(r.runtime or {})
        jv = runtime.judge(bud, peak - rt.in_pool_bytes, rt)
        fits, headroom = jv.fits, usable - peak
        judged = (jv.verdict, jv.margin_bytes, jv.terms)
    elif t.gpu.startswith("local:"):
        # an attached card's size is not in the catalogue: kept, but the verdict still follows from the bytes
        memory = _whole(t.memory_bytes, f"row {name}: target.memory_bytes")
        usable = min(_whole(t.usable_bytes, f"row {name}: target.usable_bytes"), memory)
        rt = runtime.Runtime.from_json(r.runtime or {})
        jv = runtime.judge(runtime.Budget(usable, t.usable_note, None, mode="fixed", total_bytes=memory),
                           peak - rt.in_pool_bytes, rt)
        fits, headroom, judged = jv.fits, usable - peak, (jv.verdict, jv.margin_bytes, jv.terms)
    else:
        raise UserError(f"row {name}: unknown GPU {t.gpu!r}; re-run the comparison")
    if r.verdict is None:   # saved before verdicts had margins: judged as then, from `fits`
        judged = (None, None, ())
    floor, ceiling = runtime.band_of_report(r) if t.gpu in targets.CATALOGUE else (None, None)
    if (fits, headroom, usable, memory, judged) == (r.fits, r.headroom_bytes, t.usable_bytes, t.memory_bytes,
                                                    (r.verdict, r.margin_bytes, r.verdict_terms)):
        return r if (floor, ceiling) == (r.fraction_floor, r.fraction_ceiling) else \
            dataclasses.replace(r, fraction_floor=floor, fraction_ceiling=ceiling)

    def verdict(f, h, u):
        return "no verdict (CPU)" if f is None else (
            f"{'fits' if f else 'does not fit'}, headroom {fmt_bytes(h)} of {fmt_bytes(u)} usable")

    notes.append(f"row {name}: the file said {verdict(r.fits, r.headroom_bytes, t.usable_bytes)}; its peak "
                 f"{fmt_bytes(peak)} on {t.gpu} says {verdict(fits, headroom, usable)}")
    return dataclasses.replace(r, fits=fits, headroom_bytes=headroom, verdict=judged[0], margin_bytes=judged[1],
                               verdict_terms=tuple(judged[2]), fraction_floor=floor, fraction_ceiling=ceiling,
                               target=dataclasses.replace(t, memory_bytes=memory, usable_bytes=usable))


def rejudged(r: Report, name: str) -> Report:
    """`r` with its verdict, fits and headroom judged again from its bytes against its GPU, as analyze judges
    (runtime.judge): for a report whose bytes were not compiled (the explorer's predictions, saved rows)."""
    return _rejudged_report(r, name, [])


def rejudge(cells: list[Cell]) -> tuple[list[Cell], list[str]]:
    """Saved rows with every verdict recomputed from their bytes: fits and headroom from the peak
    (the sum of its breakdown, which Report checks) against the usable memory of the row's GPU
    -- the catalogue's card size at the row's memory fraction -- and a search's probes against the
    same. A row whose search answer its own probes no longer support becomes an error row.
    Returns (cells, one note per row that differed from the file)."""

    notes: list[str] = []
    out = []
    for c in cells:
        name = label(c.choice)
        if c.report is None:
            out.append(c)
            continue
        r = _rejudged_report(c.report, name, notes)
        s = c.search
        if s is not None and r.target.usable_bytes is not None and r.target.gpu in targets.CATALOGUE:
            if not (isinstance(s.margin, (int, float)) and 0 <= s.margin < 1):
                raise UserError(f"row {name}: search margin {s.margin!r} is not in [0, 1); re-run the comparison")
            # each probe against its own usable bytes (a devices search's runtime differs per mesh),
            # which the row's settings bound: no probe may have more than the whole pool
            ceiling = max(u for u, _ in _saved_pools(r.target, 0))
            wrong: list = [p for p in s.probes if p.peak_bytes is not None and (
                _whole(p.usable_bytes, f"row {name}: a probe's usable_bytes") > ceiling
                or p.fits != search_mod.fits_with_margin(_whole(p.peak_bytes, f"row {name}: a probe's peak_bytes"),
                                                         p.usable_bytes, s.margin))]
            wrong += [p for p in (s.fits_at, s.fails_at) if p is not None and p not in s.probes]
            if s.fits_at is not None and not s.fits_at.fits:
                wrong.append(s.fits_at)
            if s.fails_at is not None and s.fails_at.fits:
                wrong.append(s.fails_at)
            if s.answer != (s.fits_at.value if s.fits_at is not None else (None if s.kind == "devices" else 0)):
                wrong.append(s.fits_at)
            if wrong:
                notes.append(f"row {name}: its search's probes do not support its answer once re-judged; "
                             "shown as an error row")
                out.append(Cell(c.choice, None, "the saved search's probes, re-judged against the GPU's usable "
                                "memory, do not support its answer; re-run the search", "user_error"))
                continue
        out.append(dataclasses.replace(c, report=r))
    if cells and all(c.report is None for c in out):
        raise UserError(f"no row has an answer: {out[0].error}")
    return out, notes
