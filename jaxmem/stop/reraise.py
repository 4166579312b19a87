"""Raising a stop again in the main thread, until the scope has unwound.

Code on the way may catch the Interrupted (a bare ``except:``, jax's plugin loading) or the signal may
land where Python ignores exceptions; the main thread is then interrupted again from a thread."""

from __future__ import annotations

import _thread
import contextlib
import signal
import threading
import time

from jaxmem.stop.state import STATE

REPEAT_S = 0.5   # how often the CLI raises a signal again until the scope has unwound
ESCALATE_S = 0.1   # how long the handler may take to run on the flag before a real signal is sent


def start(signum: int) -> None:
    """The re-raising thread, once per scope."""
    if not STATE["reraising"]:
        STATE["reraising"] = True
        threading.Thread(target=_reraise_until_unwound, args=(signum,), daemon=True).start()


def _reraise_until_unwound(signum: int) -> None:
    """The CLI's insistence: code on the way may catch the Interrupted (a bare `except:`) and go on;
    raised again every REPEAT_S until the scope unwinds, the command ends as the signal (128 + N),
    within a second, instead of running on until the helper's SIGKILL."""
    while True:
        time.sleep(REPEAT_S)
        if STATE["ending"]:
            return
        STATE["armed"] = True
        signal_main(signum)


def raise_in_main(signum: int) -> None:
    """Once, from a thread, after the callback that swallowed it has returned."""
    time.sleep(0.01)   # let the callback and the hook return first
    signal_main(signum)


def signal_main(signum: int) -> None:
    """Run the scope's handler in the main thread again: first as Python's flag for its next bytecode
    (_thread.interrupt_main), then, if the handler has not run within ESCALATE_S, as a real signal
    aimed at that thread. The flag never reaches a thread blocked in a call (a model's time.sleep in
    a gc callback, reached again after jax swallowed the first interrupt: CI saw SIGKILL); the signal
    ends that call with EINTR. Not a signal every time: a C extension being initialized (an import)
    may not retry a call that a signal interrupts."""
    seen = STATE["handled"]
    with contextlib.suppress(Exception):
        _thread.interrupt_main(signal.Signals(signum))
    end = time.monotonic() + ESCALATE_S
    while time.monotonic() < end:
        time.sleep(0.01)
        if STATE["handled"] != seen or STATE["ending"]:
            return
    main = threading.main_thread().ident
    # only while the scope's handler is installed: after it, a default SIGTERM would kill the process
    if hasattr(signal, "pthread_kill") and main is not None and signal.getsignal(signum) is STATE["handler"]:
        with contextlib.suppress(Exception):
            signal.pthread_kill(main, signum)
