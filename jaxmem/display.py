"""Jupyter's HTML for jaxmem's results, without the result types importing their renderer.

Renderers sit above the results they draw: :mod:`jaxmem.present.notebook` registers one per kind
when it is imported (the Python API imports it), and a result's ``_repr_html_`` asks here. With
no renderer loaded a result has no HTML, and Jupyter shows its plain repr.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_HTML: dict[str, Callable[[Any], str]] = {}


def register(kind: str, render: Callable[[Any], str]) -> None:
    _HTML[kind] = render


def html(kind: str, obj: Any) -> str | None:
    render = _HTML.get(kind)
    return None if render is None else render(obj)
