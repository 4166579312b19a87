"""Side outputs (--html, --png): their paths checked before any work, and written after the
result is printed, so that a failed write never loses it (exit 2 naming the option)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from jaxmem.errors import UserError


def check_writable(option: str, path: str) -> None:
    """A side output's directory (or the nearest one that exists: the writer creates the rest) is
    writable, and the path itself is not a directory or a file that cannot be overwritten."""
    if os.path.isdir(path):
        raise UserError(f"{option} {path}: is a directory; give a file name inside it")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise UserError(f"{option} {path}: the file exists and is not writable; give a path you can write")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UserError(f"{option} {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: the directory {parent} is not writable; give a path you can write")


def write(outputs: list[tuple[str, str | None, Callable[[Any, str], Any]]], result: Any, what: str) -> None:
    """Each (option, path, writer) with a path: writer(result, path); `what` names the printed result."""
    for option, path, writer in outputs:
        if not path:
            continue
        try:
            writer(result, path)
        except Exception as e:  # noqa: BLE001 - any failure of a side output is reported the same way
            reason = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
            raise UserError(f"{option} {path}: not written ({reason}); {what} above is complete") from None


def report_outputs(html_path: str | None, png_path: str | None) -> list:
    """analyze's side outputs of a Report."""
    from jaxmem.present import html, png

    return [("--html", html_path, html.write), ("--png", png_path, png.write_png)]


def compare_outputs(html_path: str | None, png_path: str | None) -> list:
    """compare's side outputs of its rows."""
    from jaxmem.present import compare_figs

    return [("--html", html_path, compare_figs.write_html), ("--png", png_path, compare_figs.write_png)]
