"""The helper process: it acts when jaxmem cannot (a C++ compile holding the GIL, a crash, SIGKILL).

Started by the scope with the scratch directory to remove; woken by the signal itself through
``signal.set_wakeup_fd``; told what jaxmem is doing one line at a time (:func:`tell`). It never
imports jax (``python -S``: fast to start)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

from jaxmem.stop.state import STATE

# how long the main thread gets to unwind by itself before the helper ends the process, in seconds of
# an idle machine: the helper multiplies it by the load per core when the signal comes (at most 30x)
GRACE_S = 2.0

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

deadline, signum, fds, buf, phase, phase_at, raised, importing = None, 0, [0, wake], b"", "", "", False, False
cleaning = False
IMPORT_S = 10.0
CLEANUP_S = 20.0  # a known slow teardown (a local Ray cluster's shutdown waits on its workers in C++)
waited = 0.0

def load_factor():
    # the grace is seconds of an idle machine: on one with more runnable threads than cores, jaxmem's
    # unwinding (an XLA:CPU compile reaching its next signal check) waits for a core as long
    try:
        return min(30.0, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))
    except (OSError, AttributeError):
        return 1.0
while True:
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    ready = select.select(fds, [], [], timeout)[0]
    if 0 in ready:
        data = os.read(0, 4096)
        if not data:  # jaxmem ended without finishing: a crash, SIGKILL, or the kill below
            remove()
            sys.exit(0)
        buf += data
        while b"\n" in buf:  # lines: "phase <what jaxmem is doing>", "raised", "done", "linger", "deferred", "cleanup"
            line, buf = buf.split(b"\n", 1)
            if line == b"done":
                sys.exit(0)
            # "linger": jaxmem stopped on a signal and exits now; code it interrupted (an XLA compile's
            # threads) may still write here until it is gone: remove the folder again at the EOF
            if line.startswith(b"phase "):
                phase = line[6:].decode(errors="replace")
            if line == b"raised":  # jaxmem's handler ran: Python got the signal
                raised = True
            if line == b"deferred" and not importing:  # held until an import is done: imports take seconds
                importing = True
                if deadline is not None:
                    extra = IMPORT_S * load_factor()
                    deadline, waited = deadline + extra, waited + extra
            if line == b"cleanup" and not cleaning:  # jaxmem is tearing down what it started: seconds, not a hang
                cleaning = True
                if deadline is not None:
                    extra = CLEANUP_S * load_factor()
                    deadline, waited = deadline + extra, waited + extra
    if wake in ready:
        b = os.read(wake, 1)
        if not b:
            fds.remove(wake)
        elif deadline is None:
            waited = (grace + (IMPORT_S if importing else 0) + (CLEANUP_S if cleaning else 0)) * load_factor()
            signum, deadline, phase_at = b[0], time.monotonic() + waited, phase
    if deadline is not None and time.monotonic() >= deadline:  # stuck in C++: end it, then clean up
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = str(signum)
        remove()
        why = ("its cleanup (a local Ray cluster's shutdown) did not end" if cleaning else
               "the interrupt was raised, but code on its way caught it or was slow to unwind" if raised else
               "it was initializing an extension module, where jaxmem holds an interrupt until that is done"
               if importing
               else "it did not return to Python: C code such as an XLA compile holds it until done")
        os.write(2, ("\njaxmem: stopped by %s%s; jaxmem had not stopped %.3g s later (%s), so it was ended with "
                     "SIGKILL (exit 137); temporary files removed\n"
                     % (name, " while " + phase_at if phase_at else "", waited, why)).encode())
        try:
            os.kill(parent, signal.SIGKILL)
        except OSError:
            pass
        remove()
        sys.exit(0)
"""



def start(run_dir: str):
    """The helper process and the write end of its wake-up pipe, or (None, None) where it cannot start
    (then the in-process cleanup is all there is)."""
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


def tell(line: bytes) -> None:
    """One line to the helper: os.write on the pipe's fd, unbuffered and atomic (a signal handler
    calls this too, maybe while the main thread was in the middle of another line)."""
    helper = STATE["helper"]
    if helper is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.write(helper.stdin.fileno(), line + b"\n")


def finish(helper, *, linger: bool) -> None:
    """The scope is over. linger (the CLI exits on a signal now): the helper removes the folder again
    once jaxmem is gone; else it is told it is done and waited for."""
    if helper is not None and linger:
        tell(b"linger")
    elif helper is not None:
        _tell_done(helper)
        with contextlib.suppress(Exception):
            helper.wait(timeout=5)
    STATE["helper"] = None


def _tell_done(helper) -> None:
    with contextlib.suppress(OSError, ValueError):
        os.write(helper.stdin.fileno(), b"done\n")
    with contextlib.suppress(OSError, ValueError):
        helper.stdin.close()
