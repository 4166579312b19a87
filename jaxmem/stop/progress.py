"""The label of what jaxmem is doing (loading the model file, compiling ...): the stop message's "while"."""

from __future__ import annotations

import contextlib

from jaxmem.stop import helper
from jaxmem.stop.state import STATE


@contextlib.contextmanager
def phase(what: str):
    """Name what jaxmem is doing (tracing the step, compiling it ...) for the stop message: the
    helper, which speaks when jaxmem is stuck in C code, is told too."""
    prev = STATE["phase"]
    _tell_phase(what)
    try:
        yield
    finally:
        _tell_phase(prev)


def _tell_phase(what: str) -> None:
    STATE["phase"] = what
    helper.tell(b"phase " + what.replace("\n", " ").encode(errors="replace")[:200])
