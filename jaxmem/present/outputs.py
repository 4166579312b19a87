"""Side outputs (--html, --png): their paths checked before any work, and written after the
result is printed, so that a failed write never loses it (exit 2 naming the option)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from jaxmem import files
from jaxmem.errors import UserError, clip


def check_writable(option: str, path: str) -> None:
    """A side output's directory (or the nearest one that exists: the writer creates the rest) is
    writable, and the path itself is not a directory or a file that cannot be overwritten. Only
    regular files are written: a device, a FIFO, a socket or a link into /dev, /proc or /sys is
    refused (the writer's rename would replace it: as root, /dev/null would become a PNG)."""
    if not path:
        raise UserError(f"{option} '': an empty path; give a file name, e.g. {option} report{_SUFFIX.get(option, '')}")
    special = files.special_kind(path)
    if special:
        raise UserError(f"{option} {clip(path)}: is {special}, not a regular file; jaxmem writes only regular "
                        "files: give a file path")
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


_SUFFIX = {"--html": ".html", "--png": ".png", "--out": ".json"}


def check_all(paths: list[tuple[str, str | None]]) -> None:
    """Every output of one command checked (check_writable) before any work, and no two on one
    file (the second would silently replace the first)."""
    seen: dict[str, str] = {}
    for option, path in paths:
        if path is None:
            continue
        check_writable(option, path)
        key = os.path.realpath(path)
        if key in seen:
            raise UserError(f"{seen[key]} and {option} both write {clip(path)}; the second would replace the "
                            "first: give each its own file")
        seen[key] = option


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
    # the writers import jax; outputs is jax-free at import: used before jax starts (jaxmem.session)
    from jaxmem.present import html  # noqa: PLC0415

    return [("--html", html_path, html.write), ("--png", png_path, _report_png)]


def compare_outputs(html_path: str | None, png_path: str | None) -> list:
    """compare's side outputs of its rows."""
    # the writers import jax; outputs is jax-free at import: used before jax starts (jaxmem.session)
    from jaxmem.present import compare_figs  # noqa: PLC0415

    return [("--html", html_path, compare_figs.write_html), ("--png", png_path, _compare_png)]


def _report_png(report, path):
    from jaxmem.present import png  # noqa: PLC0415 - png loads matplotlib: only when a picture is drawn

    return png.write_png(report, path)


def _compare_png(cells, path):
    from jaxmem.present import compare_png  # noqa: PLC0415 - as png in _report_png

    return compare_png.write_png(cells, path)
