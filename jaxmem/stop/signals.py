"""The scope's signal handler (SIGINT, SIGTERM, SIGHUP): installed, given back, and forgotten in a fork."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

from jaxmem.stop import helper, reraise
from jaxmem.stop.state import IGNORED_AT_START, SIGNALS, STATE, Interrupted


def handler(end_stuck: bool):
    """The handler: records the first signal and what jaxmem was doing, then raises Interrupted in the
    main thread (once; held while an extension module initializes). end_stuck: the CLI's insistence
    (raised again until the scope unwinds)."""

    def on_signal(signum, frame):
        STATE["handled"] += 1   # the main thread ran Python again (reraise.signal_main's question)
        if STATE["signum"] is None:
            STATE["signum"], STATE["phase_at_signal"] = signum, STATE["phase"]
        # once (a second ^C must not cut the unwinding short), and never in the scope's own clean-up
        if STATE["armed"] and not STATE["ending"]:
            if _importing(frame):
                # An interrupt inside an extension module's initialization leaves it half-made
                # (numpy's turned ImportError, was caught, and a later import segfaulted on it):
                # held until that is done, then raised (the re-raising thread asks again).
                if not STATE["deferred"]:
                    STATE["deferred"] = True
                    helper.tell(b"deferred")
                reraise.start(signum)
                return
            STATE["armed"] = False
            helper.tell(b"raised")
            if end_stuck:
                reraise.start(signum)
            raise Interrupted(STATE["signum"])

    return on_signal


def install(on_signal, saved_handlers: dict[int, Any]) -> None:
    """The handler for every stop signal; each one it replaces goes into saved_handlers as it is
    replaced (a signal landing half-way still finds the ones to give back)."""
    STATE["handler"] = on_signal
    for s in SIGNALS:
        if s in IGNORED_AT_START:
            continue
        with contextlib.suppress(OSError, ValueError):
            saved_handlers[s] = signal.signal(s, on_signal)


def restore(saved_handlers: dict[int, Any], *, ignore: bool) -> None:
    """The handlers given back. ignore (the CLI is about to exit 128 + N after a signal): a repeated
    signal then must not turn that into a death by the signal."""
    for s, h in saved_handlers.items():
        signal.signal(s, signal.SIG_IGN if ignore else (h if h is not None else signal.SIG_DFL))


def wake_helper_on_signal(wake_w: int) -> int | None:
    """The C-level handler writes each signal to the helper's pipe; returns the wake-up fd it replaced."""
    saved = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    STATE["wake_w"] = wake_w
    return saved


def stop_waking_helper(wake_w: int, saved_wakeup: int | None, *, was_set: bool) -> None:
    """The wake-up fd given back (was_set: :func:`wake_helper_on_signal` ran) and the pipe closed."""
    if was_set and STATE["wake_w"] is not None:
        signal.set_wakeup_fd(saved_wakeup if saved_wakeup is not None else -1)
    STATE["wake_w"] = None
    os.close(wake_w)


def _importing(frame) -> bool:
    """Whether an extension module is being initialized (its loader's create_module or exec_module
    on the stack: its C init may import Python modules, where the handler then runs)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name in ("create_module", "exec_module") and code.co_filename.startswith("<frozen importlib") \
                and type(frame.f_locals.get("self")).__name__ == "ExtensionFileLoader":
            return True
        frame = frame.f_back
    return False


def _forget_in_child() -> None:
    """A forked child (a model's multiprocessing, say) must not wake the helper with its own signals:
    the helper would take them for jaxmem's and end it."""
    if STATE.get("wake_w") is not None:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        STATE["wake_w"] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
