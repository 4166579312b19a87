"""What must not print an interrupt as a traceback: sys.unraisablehook, sys.excepthook and jax's
plugin-loading log, each replaced for the scope and given back after it."""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading

from jaxmem.stop import reraise
from jaxmem.stop.state import STATE, Interrupted


class _DropInterrupted(logging.Filter):
    """jax catches everything around a plugin's initialize() (a bare `except:`) and logs it with its
    traceback: an interrupt landing there is jaxmem's to report (raised again: the scope's
    re-raising), not a "Jax plugin configuration error" traceback."""

    def filter(self, record) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], Interrupted))


_QUIET = _DropInterrupted()
_QUIET_LOGGERS = ("jax._src.xla_bridge",)


def install() -> tuple:
    """The scope's hooks and log filter in place; returns the hooks they replaced (for :func:`restore`)."""
    saved = (sys.unraisablehook, sys.excepthook)
    sys.unraisablehook = functools.partial(_unraisable, saved[0])
    sys.excepthook = functools.partial(_excepthook, saved[1])
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).addFilter(_QUIET)
    return saved


def restore(saved: tuple | None) -> None:
    """The hooks given back (saved None: they were never replaced), the log filter removed."""
    if saved is not None:
        sys.unraisablehook, sys.excepthook = saved
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).removeFilter(_QUIET)


def _unraisable(default, u) -> None:
    """sys.unraisablehook in a scope: an Interrupted that Python could not raise (it landed in a
    garbage-collection callback, a __del__ ...) is raised again in the main thread once that code
    has returned, without the "Exception ignored in" traceback; anything else as before."""
    if not isinstance(u.exc_value, Interrupted):
        default(u)
        return
    name = getattr(u.object, "__qualname__", None) or type(u.object).__name__
    STATE["swallowed_in"] = f"{name}()" if callable(u.object) else repr(name)
    STATE["armed"] = True
    signum = u.exc_value.signum
    # From a thread: raised here, in the hook, it would be ignored again.
    try:
        threading.Thread(target=reraise.raise_in_main, args=(signum,), daemon=True).start()
    except Interrupted:
        # The next signal landed while that thread started (Thread.start waits for it): raised out of
        # this hook it would print "Exception ignored in sys.unraisablehook". Whether or not the thread
        # got going, the scope's re-raising thread raises it again in the main thread until it unwinds.
        STATE["armed"] = True
        with contextlib.suppress(Interrupted):
            reraise.start(signum)


def _excepthook(default, etype, value, tb) -> None:
    """sys.excepthook in a scope: C code that prints the error it caught (PyErr_Print: an extension
    module's initialization, interrupted, then raises ImportError instead) must not print jaxmem's
    interrupt as a traceback; the scope raises it again."""
    if isinstance(value, Interrupted):
        STATE["armed"] = True   # raised again by the scope (every REPEAT_S in the CLI; at its end)
        return
    default(etype, value, tb)
