"""The one record of a stop the scope's parts share: which signal came, while doing what, where it landed.

Process-wide by nature (a signal handler has no caller to pass it): one dict, reset by each scope."""

from __future__ import annotations

import signal
from typing import Any

SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
# Those jaxmem was started with ignored (`nohup jaxmem ...` ignores SIGHUP, a shell's `jaxmem ... &` in a script
# SIGINT): they stay ignored, as Python leaves an ignored SIGINT (a hang-up must not end a nohup'ed sweep).
IGNORED_AT_START = frozenset(s for s in SIGNALS if signal.getsignal(s) is signal.SIG_IGN)


class Interrupted(KeyboardInterrupt):
    """A signal asked jaxmem to stop."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


STATE: dict[str, Any] = {"signum": None, "wake_w": None, "armed": True, "phase": "", "phase_at_signal": "",
                         "swallowed_in": None, "helper": None, "reraising": False, "ending": False,
                         "handler": None, "handled": 0}


def reset() -> None:
    """A new scope: no signal yet, the handler armed."""
    STATE.update(signum=None, armed=True, phase="", phase_at_signal="", swallowed_in=None, reraising=False,
                 ending=False, deferred=False, handled=0)


def interrupted_by_signal() -> bool:
    """Whether a KeyboardInterrupt now unwinding came from a real signal (not a model file's raise)."""
    return STATE["signum"] is not None


def received() -> int | None:
    """The first signal the last scope received (None: none)."""
    return STATE["signum"]


def describe() -> str:
    """`SIGTERM while <what jaxmem was doing>` and, when it first landed where Python ignores
    exceptions, where that was: the stop message's account of the signal."""
    signum = STATE["signum"]
    if signum is None:
        return ""
    text = signal.Signals(signum).name
    if STATE["phase_at_signal"]:
        text += f" while {STATE['phase_at_signal']}"
    if STATE["swallowed_in"]:
        text += (f" (it landed in {STATE['swallowed_in']}, where Python ignores exceptions; jaxmem raised it "
                 "again once that returned)")
    return text
