"""`jaxmem diff` as a terminal table (the numbers: jaxmem.plan.diff.ReportDiff)."""

from __future__ import annotations

import json
import sys

from rich.markup import escape
from rich.table import Table

from jaxmem.plan.diff import diff, kind
from jaxmem.present.console import make_console
from jaxmem.units import fmt_bytes


def _signed(n: int) -> str:
    return ("+" if n > 0 else "-" if n < 0 else "") + fmt_bytes(abs(n)) if n else "0 B"


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 70 else text[:67] + "..."


def print_diff(d, top: int = 10) -> None:
    console = make_console()
    growth = "" if d.growth is None else f" ({d.growth:+.1%})"
    console.print(f"jaxmem diff  {escape(d.old_path)} -> {escape(d.new_path)}")
    console.print(f"per-device peak {fmt_bytes(d.old_peak)} -> {fmt_bytes(d.new_peak)}: "
                  f"{_signed(d.new_peak - d.old_peak)}{growth}")
    t = Table(title="breakdown", title_justify="left")
    for name, justify in (("part", "left"), ("old", "right"), ("new", "right"), ("change", "right")):
        t.add_column(name, justify=justify)   # type: ignore[arg-type]
    for c in d.breakdown:
        t.add_row(escape(c.name), fmt_bytes(c.old), fmt_bytes(c.new), _signed(c.delta))
    console.print(t)
    for title, rows, what in (("modules live at the peak", d.modules, "module"),
                              ("buffers live at the peak (module, shape, category)", d.buffers, "buffers")):
        if not rows:
            console.print(f"{title}: no change")
            continue
        t = Table(title=f"{title}, largest change first", title_justify="left")
        for name, justify in ((what, "left"), ("old", "right"), ("new", "right"), ("change", "right"),
                              ("", "left")):
            t.add_column(name, justify=justify)   # type: ignore[arg-type]
        for c in rows[:top]:
            t.add_row(escape(c.name), fmt_bytes(c.old), fmt_bytes(c.new), _signed(c.delta), kind(c))
        if len(rows) > top:
            t.add_row(f"[dim]... {len(rows) - top} more (--json)[/dim]", "", "", "", "")
        console.print(t)
    if d.settings:
        console.print("what differs in how they were made:")
        for key, (old, new) in d.settings.items():
            console.print(f"  {escape(key)}: {escape(_short(old))} -> {escape(_short(new))}")
    else:
        console.print("made the same way: options, target, versions and XLA flags are equal")
    if d.max_growth is not None:
        verdict = "[bold red]GREW[/bold red] past" if d.exceeded else "[bold green]WITHIN[/bold green]"
        console.print(f"{verdict} --max-growth {d.max_growth:.1%}")


def show(old_path: str, new_path: str, *, max_growth: float | None, top: int, as_json: bool) -> bool:
    """`jaxmem diff`: diff the two reports and print the result; True when the gate is exceeded."""

    d = diff(old_path, new_path, max_growth=max_growth)
    if as_json:
        # json.dumps(d.to_json(), indent=2, allow_nan=False) and a newline: strict JSON (load refused NaN), written a
        # piece at a time
        sys.stdout.writelines(d.json_pieces())
        sys.stdout.write("\n")
    else:
        print_diff(d, top)
    return d.exceeded
