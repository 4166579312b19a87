"""Numbers as people read them: bytes, seconds, SI quantities. A leaf: planners and renderers
both format with it, and it imports nothing of jaxmem."""

from __future__ import annotations


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{n} B"


def fmt_seconds(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.1f} ms"
    return f"{x * 1e6:.1f} us"


def si(x: float, unit: str) -> str:
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:,.1f} {prefix}{unit}"
    return f"{x:,.0f} {unit}"
