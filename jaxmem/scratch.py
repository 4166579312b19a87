"""One scratch directory per command, removed on every way out: signals and crashes included.

Everything a command writes to temporary storage lands in one private directory:
jaxmem's own buffer-assignment dumps (``tempfile``) and XLA's ``tempfile-*`` files
(XLA:GPU's PTX hand-off to ptxas; XLA reads ``TMPDIR`` on every call, see
docs/how-it-works.md "Temporary files"). Removing that one directory leaves nothing behind.

:func:`run_scope` is the command's scope: the directory, and for its length the stop machinery of
:mod:`jaxmem.stop` (the signal handler, the hooks that keep an interrupt quiet, the helper process
that removes the directory when jaxmem cannot). The names callers use from there are re-exported here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import threading
from typing import Any

from jaxmem.errors import UserError
from jaxmem.stop import helper as _helper
from jaxmem.stop import hooks as _hooks
from jaxmem.stop import signals as _signals
from jaxmem.stop import state as _state
from jaxmem.stop.helper import GRACE_S
from jaxmem.stop.progress import phase
from jaxmem.stop.state import IGNORED_AT_START, SIGNALS, STATE, Interrupted, describe, interrupted_by_signal, received

__all__ = ["GRACE_S", "IGNORED_AT_START", "SIGNALS", "Interrupted", "describe", "interrupted_by_signal", "phase",
           "received",
           "run_scope"]

_TEMP_VARS = ("TMPDIR", "TMP", "TEMP")


def _remove(path: str) -> None:
    # A compile still running may add a file while we remove; a few passes settle it.
    for _ in range(5):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return


def _make_run_dir() -> str:
    base = tempfile.gettempdir()
    try:
        return tempfile.mkdtemp(prefix=f"jaxmem-run-{os.getpid()}-", dir=base)
    except OSError as e:
        raise UserError(f"cannot create a scratch directory in {base} ({e.strerror}); "
                        "set TMPDIR to a writable directory") from None


def _point_tempfiles_at(run_dir: str) -> tuple[dict[str, str | None], str | None]:
    """TMPDIR, TMP, TEMP (and TEST_TMPDIR where set: XLA prefers it) and tempfile.tempdir at run_dir;
    returns what they were."""
    saved_env = {k: os.environ.get(k) for k in (*_TEMP_VARS, "TEST_TMPDIR")}
    saved_tempdir = tempfile.tempdir
    for k in _TEMP_VARS:
        os.environ[k] = run_dir
    if saved_env["TEST_TMPDIR"] is not None:  # XLA prefers it to TMPDIR
        os.environ["TEST_TMPDIR"] = run_dir
    tempfile.tempdir = run_dir
    return saved_env, saved_tempdir


def _restore_tempfiles(saved_env: dict[str, str | None], saved_tempdir: str | None) -> None:
    for k, v in saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    tempfile.tempdir = saved_tempdir


@dataclasses.dataclass
class _Installed:
    """What the scope put in place in the main thread, filled in as it goes (a signal may land half-way)."""

    helper: Any = None
    wake_w: int | None = None
    saved_wakeup: int | None = None
    saved_hooks: tuple | None = None
    saved_handlers: dict[int, Any] = dataclasses.field(default_factory=dict)


def _install(done: _Installed, run_dir: str, end_stuck: bool) -> None:
    """The helper, the hooks, the signal handler and (end_stuck) the helper's wake-up on a signal."""
    done.helper, done.wake_w = _helper.start(run_dir)
    STATE["helper"] = done.helper
    done.saved_hooks = _hooks.install()
    _signals.install(_signals.handler(end_stuck), done.saved_handlers)
    if done.wake_w is not None and end_stuck:
        done.saved_wakeup = _signals.wake_helper_on_signal(done.wake_w)


@contextlib.contextmanager
def run_scope(*, end_stuck: bool = True):
    """A private TMPDIR for the command, removed on exit, on SIGINT/SIGTERM/SIGHUP, and after a crash.

    end_stuck=False (the Python API): a signal during a C++ compile waits for the compile instead of
    the helper ending the process -- in a notebook that process is the user's kernel, and its
    state is worth more than a prompt stop."""
    in_main = threading.current_thread() is threading.main_thread()
    run_dir = _make_run_dir()
    saved_env, saved_tempdir = _point_tempfiles_at(run_dir)
    done = _Installed()
    _state.reset()
    unwound = False
    try:
        # inside the try: a signal that lands while the scope is being set up still runs its clean-up
        if in_main:
            _install(done, run_dir, end_stuck)
        yield run_dir
    except Interrupted:
        unwound = True
        raise
    finally:
        STATE["ending"] = True   # no more raising: the scope's own clean-up runs whole
        if in_main:
            _hooks.restore(done.saved_hooks)
            if done.wake_w is not None:
                _signals.stop_waking_helper(done.wake_w, done.saved_wakeup, was_set=end_stuck)
        _restore_tempfiles(saved_env, saved_tempdir)
        _remove(run_dir)
        stopped = end_stuck and STATE["signum"] is not None
        _helper.finish(done.helper, linger=stopped)   # lingering: the CLI exits now; the folder removed again
        # The handlers last, once nothing is left to clean.
        _signals.restore(done.saved_handlers, ignore=stopped)
        sys.stderr.flush()
    if STATE["signum"] is not None and not unwound:
        # recorded, but swallowed on its way (a bare `except:` in code jaxmem called): the command
        # still ends as a signal, never with the verdict computed meanwhile
        raise Interrupted(STATE["signum"])
