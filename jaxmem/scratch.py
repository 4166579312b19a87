"""One scratch directory per command, removed on every way out: signals and crashes included.

Everything a command writes to temporary storage lands in one private directory:
jaxmem's own buffer-assignment dumps (``tempfile``) and XLA's ``tempfile-*`` files
(XLA:GPU's PTX hand-off to ptxas; XLA reads ``TMPDIR`` on every call, see
docs/how-it-works.md "Temporary files"). Removing that one directory leaves nothing behind.

SIGINT, SIGTERM and SIGHUP: the main thread gets :class:`Interrupted` (a KeyboardInterrupt)
and unwinds through every ``finally`` (a measuring child process is killed on the way), then
exits 128 + the signal. A C++ compile holds the GIL and does not return to Python until it is
done, so no thread of ours can act then: a small helper process, woken by the signal itself
(``signal.set_wakeup_fd`` writes to its pipe from the C-level handler), removes the directory
and ends jaxmem if it has not unwound within GRACE_S. The same helper removes the directory
when jaxmem dies without unwinding at all (SIGKILL, a segfault inside XLA).
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
GRACE_S = 2.0   # how long the main thread gets to unwind by itself before the helper ends the process


class Interrupted(KeyboardInterrupt):
    """A signal asked jaxmem to stop."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_state = {"signum": None, "wake_w": None}


def interrupted_by_signal() -> bool:
    """Whether a KeyboardInterrupt now unwinding came from a real signal (not a model file's raise)."""
    return _state["signum"] is not None


def _remove(path: str) -> None:
    # A compile still running may add a file while we remove; a few passes settle it.
    for _ in range(5):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return


# The helper: its stdin is jaxmem's lifeline (end of file: jaxmem is gone; b"done": it finished),
# argv[4] the read end of the signal wake-up pipe. It never imports jax (python -S: fast to start).
_HELPER = r"""
import os, select, shutil, signal, sys, time
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)  # a group-wide ^C or hang-up must not stop the one who cleans up
run_dir, parent, grace, wake = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])

def remove():
    for _ in range(20):
        shutil.rmtree(run_dir, ignore_errors=True)
        if not os.path.exists(run_dir):
            return
        time.sleep(0.05)

deadline, signum, fds = None, 0, [0, wake]
while True:
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    ready = select.select(fds, [], [], timeout)[0]
    if 0 in ready:
        data = os.read(0, 16)
        if data.startswith(b"done"):
            sys.exit(0)
        if not data:  # jaxmem ended without finishing: a crash, SIGKILL, or the kill below
            remove()
            sys.exit(0)
    if wake in ready:
        b = os.read(wake, 1)
        if not b:
            fds.remove(wake)
        elif deadline is None:
            signum, deadline = b[0], time.monotonic() + grace
    if deadline is not None and time.monotonic() >= deadline:  # stuck in C++: end it, then clean up
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = str(signum)
        remove()
        os.write(2, ("\njaxmem: stopped by %s during a compile; temporary files removed\n" % name).encode())
        try:
            os.kill(parent, signal.SIGKILL)
        except OSError:
            pass
        remove()
        sys.exit(0)
"""


def _forget_in_child() -> None:
    """A forked child (a model's multiprocessing, say) must not wake the helper with its own signals:
    the helper would take them for jaxmem's and end it."""
    if _state.get("wake_w") is not None:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        _state["wake_w"] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _start_helper(run_dir: str):
    """The helper process, or None where it cannot start (then the in-process cleanup is all there is)."""
    import subprocess

    wake_r, wake_w = os.pipe()
    try:
        helper = subprocess.Popen([sys.executable, "-S", "-c", _HELPER, run_dir, str(os.getpid()), str(GRACE_S),
                                   str(wake_r)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  pass_fds=(wake_r,), start_new_session=True)
    except OSError:
        os.close(wake_r)
        os.close(wake_w)
        return None, None
    os.close(wake_r)
    os.set_blocking(wake_w, False)
    return helper, wake_w


@contextlib.contextmanager
def run_scope(*, end_stuck: bool = True):
    """A private TMPDIR for the command, removed on exit, on SIGINT/SIGTERM/SIGHUP, and after a crash.

    end_stuck=False (the Python API): a signal during a C++ compile waits for the compile instead of
    the helper ending the process -- in a notebook that process is the user's kernel, and its
    state is worth more than a prompt stop."""
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

    saved_handlers, saved_wakeup, helper, wake_w = {}, None, None, None
    _state["signum"] = None
    if in_main:
        def on_signal(signum, frame):
            first = _state["signum"] is None
            _state["signum"] = signum
            if first:
                raise Interrupted(signum)

        helper, wake_w = _start_helper(run_dir)
        for s in SIGNALS:
            with contextlib.suppress(OSError, ValueError):
                saved_handlers[s] = signal.signal(s, on_signal)
        if wake_w is not None and end_stuck:
            saved_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
            _state["wake_w"] = wake_w
    try:
        yield run_dir
    finally:
        if in_main:
            if wake_w is not None:
                if end_stuck:
                    signal.set_wakeup_fd(saved_wakeup if saved_wakeup is not None else -1)
                _state["wake_w"] = None
                os.close(wake_w)
            for s, h in saved_handlers.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        tempfile.tempdir = saved_tempdir
        _remove(run_dir)
        if helper is not None:
            with contextlib.suppress(OSError):
                helper.stdin.write(b"done")
                helper.stdin.close()
            with contextlib.suppress(Exception):
                helper.wait(timeout=5)
        sys.stderr.flush()
