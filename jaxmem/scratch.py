"""One scratch directory per command, removed on every way out, signals included.

Everything a command writes to temporary storage lands in one private directory:
jaxmem's own buffer-assignment dumps (``tempfile``) and XLA's ``tempfile-*`` files
(XLA:GPU's PTX/cubin hand-off to ptxas; XLA reads ``TMPDIR`` on every call, see
docs/how-it-works.md "Temporary files"). Removing that one directory on the way out
leaves nothing behind, whatever was running.

SIGINT, SIGTERM and SIGHUP: the main thread gets :class:`Interrupted` (a
KeyboardInterrupt) and unwinds through every ``finally``. A C++ compile does not return
to Python until it is done, so a watcher thread, woken by the signal itself
(``signal.set_wakeup_fd``), removes the directory and ends the process if the main
thread has not finished within a grace period.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading

SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
GRACE_S = 2.0   # how long the main thread gets to unwind by itself before the watcher ends the process


class Interrupted(KeyboardInterrupt):
    """A signal asked jaxmem to stop."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_state = {"signum": None}


def interrupted_by_signal() -> bool:
    """Whether a KeyboardInterrupt now unwinding came from a real signal (not a model file's raise)."""
    return _state["signum"] is not None


def _remove(path: str) -> None:
    # A compile still running may add a file while we remove; a few passes settle it.
    for _ in range(5):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return


@contextlib.contextmanager
def run_scope():
    """A private TMPDIR for the command, removed on exit and on SIGINT/SIGTERM/SIGHUP."""
    in_main = threading.current_thread() is threading.main_thread()
    base = tempfile.gettempdir()
    try:
        run_dir = tempfile.mkdtemp(prefix=f"jaxmem-run-{os.getpid()}-", dir=base)
    except OSError as e:
        from jaxmem.errors import UserError

        raise UserError(f"cannot create a scratch directory in {base} ({e.strerror}); "
                        "set TMPDIR to a writable directory") from None
    saved_env = {k: os.environ.get(k) for k in ("TMPDIR", "TMP", "TEMP", "TEST_TMPDIR")}
    saved_tempdir = tempfile.tempdir
    for k in ("TMPDIR", "TMP", "TEMP"):
        os.environ[k] = run_dir
    if saved_env["TEST_TMPDIR"] is not None:  # XLA prefers it to TMPDIR
        os.environ["TEST_TMPDIR"] = run_dir
    tempfile.tempdir = run_dir

    done = threading.Event()
    saved_handlers, saved_wakeup, read_fd, write_fd = {}, None, None, None
    _state["signum"] = None
    if in_main:
        def on_signal(signum, frame):
            first = _state["signum"] is None
            _state["signum"] = signum
            if first:
                raise Interrupted(signum)

        for s in SIGNALS:
            try:
                saved_handlers[s] = signal.signal(s, on_signal)
            except (OSError, ValueError):  # pragma: no cover - platform without it
                pass
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        saved_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

        def watch():
            try:
                data = os.read(read_fd, 1)
            except OSError:
                return
            finally:
                os.close(read_fd)  # only here: the reader owns it, so its number is never reused under a read
            if not data or done.is_set():
                return
            if done.wait(GRACE_S):
                return
            signum = data[0]
            _remove(run_dir)
            try:
                os.write(2, f"\njaxmem: stopped by {signal.Signals(signum).name}; temporary files removed\n".encode())
            except (OSError, ValueError):
                pass
            os._exit(128 + signum)

        threading.Thread(target=watch, name="jaxmem-signal-watch", daemon=True).start()
    try:
        yield run_dir
    finally:
        done.set()
        if in_main:
            signal.set_wakeup_fd(saved_wakeup if saved_wakeup is not None else -1)
            for s, h in saved_handlers.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)
            os.close(write_fd)  # wakes the watcher (end of file): it returns
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        tempfile.tempdir = saved_tempdir
        _remove(run_dir)
        sys.stderr.flush()
