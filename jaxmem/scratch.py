"""One scratch directory per command, removed on every way out: signals and crashes included.

Everything a command writes to temporary storage lands in one private directory:
jaxmem's own buffer-assignment dumps (``tempfile``) and XLA's ``tempfile-*`` files
(XLA:GPU's PTX hand-off to ptxas; XLA reads ``TMPDIR`` on every call, see
docs/how-it-works.md "Temporary files"). Removing that one directory leaves nothing behind.

SIGINT, SIGTERM and SIGHUP: the main thread gets :class:`Interrupted` (a KeyboardInterrupt)
and unwinds through every ``finally`` (a measuring child process is killed on the way), then
exits 128 + the signal. A signal is never lost:

* Python runs the handler at its next bytecode; when that is inside a callback whose exceptions
  Python ignores (jax's garbage-collection callback ``_xla_gc_callback``, a ``__del__``, a
  weakref callback), the Interrupted is reported to ``sys.unraisablehook``: the scope's hook
  keeps it quiet (no "Exception ignored in ..." traceback) and raises it again in the main
  thread as soon as that callback has returned.
* A signal that was recorded but never unwound the scope (swallowed by a bare ``except:`` in
  code jaxmem called) is raised when the scope ends, so the command ends 128 + the signal, never
  with a verdict.
* A C++ compile holds the GIL and does not return to Python until it is done, so no thread of
  ours can act then: a small helper process, woken by the signal itself (``signal.set_wakeup_fd``
  writes to its pipe from the C-level handler), removes the directory and ends jaxmem with
  SIGKILL (exit 137) if it has not unwound within GRACE_S (seconds of an idle machine, times the
  load per core: on a loaded 2-core machine an XLA:CPU compile took over 2 s to reach its next
  signal check, and a fixed 2 s killed it), saying which signal and what jaxmem was doing
  (:func:`phase`). The same helper removes the directory when jaxmem dies without
  unwinding at all (SIGKILL, a segfault inside XLA).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from typing import Any

SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
# Those jaxmem was started with ignored (`nohup jaxmem ...` ignores SIGHUP, a shell's `jaxmem ... &` in a script
# SIGINT): they stay ignored, as Python leaves an ignored SIGINT (a hang-up must not end a nohup'ed sweep).
IGNORED_AT_START = frozenset(s for s in SIGNALS if signal.getsignal(s) is signal.SIG_IGN)
# how long the main thread gets to unwind by itself before the helper ends the process, in seconds of
# an idle machine: the helper multiplies it by the load per core when the signal comes (at most 30x)
GRACE_S = 2.0


class Interrupted(KeyboardInterrupt):
    """A signal asked jaxmem to stop."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_state: dict[str, Any] = {"signum": None, "wake_w": None, "armed": True, "phase": "", "phase_at_signal": "",
                          "swallowed_in": None, "helper": None, "reraising": False, "ending": False,
                          "handler": None, "handled": 0}


def interrupted_by_signal() -> bool:
    """Whether a KeyboardInterrupt now unwinding came from a real signal (not a model file's raise)."""
    return _state["signum"] is not None


def received() -> int | None:
    """The first signal the last scope received (None: none)."""
    return _state["signum"]


def describe() -> str:
    """`SIGTERM while <what jaxmem was doing>` and, when it first landed where Python ignores
    exceptions, where that was: the stop message's account of the signal."""
    signum = _state["signum"]
    if signum is None:
        return ""
    text = signal.Signals(signum).name
    if _state["phase_at_signal"]:
        text += f" while {_state['phase_at_signal']}"
    if _state["swallowed_in"]:
        text += (f" (it landed in {_state['swallowed_in']}, where Python ignores exceptions; jaxmem raised it "
                 "again once that returned)")
    return text


@contextlib.contextmanager
def phase(what: str):
    """Name what jaxmem is doing (tracing the step, compiling it ...) for the stop message: the
    helper, which speaks when jaxmem is stuck in C code, is told too."""
    prev = _state["phase"]
    _tell_phase(what)
    try:
        yield
    finally:
        _tell_phase(prev)


def _tell_phase(what: str) -> None:
    _state["phase"] = what
    _tell(b"phase " + what.replace("\n", " ").encode(errors="replace")[:200])


def _tell(line: bytes) -> None:
    """One line to the helper: os.write on the pipe's fd, unbuffered and atomic (a signal handler
    calls this too, maybe while the main thread was in the middle of another line)."""
    helper = _state["helper"]
    if helper is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.write(helper.stdin.fileno(), line + b"\n")


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

deadline, signum, fds, buf, phase, phase_at, raised, importing = None, 0, [0, wake], b"", "", "", False, False
IMPORT_S = 10.0
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
        while b"\n" in buf:  # lines: "phase <what jaxmem is doing>", "raised", "done", "linger"
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
    if wake in ready:
        b = os.read(wake, 1)
        if not b:
            fds.remove(wake)
        elif deadline is None:
            waited = (grace + (IMPORT_S if importing else 0)) * load_factor()
            signum, deadline, phase_at = b[0], time.monotonic() + waited, phase
    if deadline is not None and time.monotonic() >= deadline:  # stuck in C++: end it, then clean up
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = str(signum)
        remove()
        why = ("the interrupt was raised, but code on its way caught it or was slow to unwind" if raised else
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

    saved_handlers: dict[int, Any] = {}
    saved_wakeup: int | None = None
    helper: Any = None
    wake_w: int | None = None
    saved_hook: Any = None
    saved_excepthook: Any = None
    _state.update(signum=None, armed=True, phase="", phase_at_signal="", swallowed_in=None, reraising=False,
                  ending=False, deferred=False, handled=0)

    def on_signal(signum, frame):
        _state["handled"] += 1   # the main thread ran Python again (_signal_main's question)
        if _state["signum"] is None:
            _state["signum"], _state["phase_at_signal"] = signum, _state["phase"]
        # once (a second ^C must not cut the unwinding short), and never in the scope's own clean-up
        if _state["armed"] and not _state["ending"]:
            if _importing(frame):
                # An interrupt inside an extension module's initialization leaves it half-made
                # (numpy's turned ImportError, was caught, and a later import segfaulted on it):
                # held until that is done, then raised (the re-raising thread asks again).
                if not _state["deferred"]:
                    _state["deferred"] = True
                    _tell(b"deferred")
                _start_reraising(signum)
                return
            _state["armed"] = False
            _tell(b"raised")
            if end_stuck:
                _start_reraising(signum)
            raise Interrupted(_state["signum"])

    unwound = False
    try:
        # inside the try: a signal that lands while the scope is being set up still runs its clean-up
        if in_main:
            helper, wake_w = _start_helper(run_dir)
            _state["helper"] = helper
            saved_hook, saved_excepthook = sys.unraisablehook, sys.excepthook
            sys.unraisablehook = functools.partial(_unraisable, saved_hook)
            sys.excepthook = functools.partial(_excepthook, saved_excepthook)
            for name in _QUIET_LOGGERS:
                logging.getLogger(name).addFilter(_QUIET)
            _state["handler"] = on_signal
            for s in SIGNALS:
                if s in IGNORED_AT_START:
                    continue
                with contextlib.suppress(OSError, ValueError):
                    saved_handlers[s] = signal.signal(s, on_signal)
            if wake_w is not None and end_stuck:
                saved_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
                _state["wake_w"] = wake_w
        yield run_dir
    except Interrupted:
        unwound = True
        raise
    finally:
        _state["ending"] = True   # no more raising: the scope's own clean-up runs whole
        if in_main:
            if saved_hook is not None:
                sys.unraisablehook, sys.excepthook = saved_hook, saved_excepthook
            for name in _QUIET_LOGGERS:
                logging.getLogger(name).removeFilter(_QUIET)
            if wake_w is not None:
                if end_stuck and _state["wake_w"] is not None:
                    signal.set_wakeup_fd(saved_wakeup if saved_wakeup is not None else -1)
                _state["wake_w"] = None
                os.close(wake_w)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        tempfile.tempdir = saved_tempdir
        _remove(run_dir)
        if helper is not None and end_stuck and _state["signum"] is not None:
            _tell(b"linger")   # the CLI exits now; the helper removes the folder again once it is gone
        elif helper is not None:
            _tell_helper_done(helper)
            with contextlib.suppress(Exception):
                helper.wait(timeout=5)
        _state["helper"] = None
        # The handlers last, once nothing is left to clean. After a signal the CLI is about to
        # exit 128 + N: a repeated signal then must not turn that into a death by the signal.
        after = signal.SIG_IGN if end_stuck and _state["signum"] is not None else None
        for s, h in saved_handlers.items():
            signal.signal(s, after if after is not None else (h if h is not None else signal.SIG_DFL))
        sys.stderr.flush()
    if _state["signum"] is not None and not unwound:
        # recorded, but swallowed on its way (a bare `except:` in code jaxmem called): the command
        # still ends as a signal, never with the verdict computed meanwhile
        raise Interrupted(_state["signum"])


class _DropInterrupted(logging.Filter):
    """jax catches everything around a plugin's initialize() (a bare `except:`) and logs it with its
    traceback: an interrupt landing there is jaxmem's to report (raised again: the scope's
    re-raising), not a "Jax plugin configuration error" traceback."""

    def filter(self, record) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], Interrupted))


_QUIET = _DropInterrupted()
_QUIET_LOGGERS = ("jax._src.xla_bridge",)


def _tell_helper_done(helper) -> None:
    with contextlib.suppress(OSError, ValueError):
        os.write(helper.stdin.fileno(), b"done\n")
    with contextlib.suppress(OSError, ValueError):
        helper.stdin.close()


def _unraisable(default, u) -> None:
    """sys.unraisablehook in a scope: an Interrupted that Python could not raise (it landed in a
    garbage-collection callback, a __del__ ...) is raised again in the main thread once that code
    has returned, without the "Exception ignored in" traceback; anything else as before."""
    if not isinstance(u.exc_value, Interrupted):
        default(u)
        return
    name = getattr(u.object, "__qualname__", None) or type(u.object).__name__
    _state["swallowed_in"] = f"{name}()" if callable(u.object) else repr(name)
    _state["armed"] = True
    signum = u.exc_value.signum
    # From a thread: raised here, in the hook, it would be ignored again.
    threading.Thread(target=_raise_in_main, args=(signum,), daemon=True).start()


REPEAT_S = 0.5   # how often the CLI raises a signal again until the scope has unwound


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


def _start_reraising(signum: int) -> None:
    if not _state["reraising"]:
        _state["reraising"] = True
        threading.Thread(target=_reraise_until_unwound, args=(signum,), daemon=True).start()


def _reraise_until_unwound(signum: int) -> None:
    """The CLI's insistence: code on the way may catch the Interrupted (a bare `except:`) and go on;
    raised again every REPEAT_S until the scope unwinds, the command ends as the signal (128 + N),
    within a second, instead of running on until the helper's SIGKILL."""
    import time

    while True:
        time.sleep(REPEAT_S)
        if _state["ending"]:
            return
        _state["armed"] = True
        _signal_main(signum)


def _excepthook(default, etype, value, tb) -> None:
    """sys.excepthook in a scope: C code that prints the error it caught (PyErr_Print: an extension
    module's initialization, interrupted, then raises ImportError instead) must not print jaxmem's
    interrupt as a traceback; the scope raises it again."""
    if isinstance(value, Interrupted):
        _state["armed"] = True   # raised again by the scope (every REPEAT_S in the CLI; at its end)
        return
    default(etype, value, tb)


def _raise_in_main(signum: int) -> None:
    import time

    time.sleep(0.01)   # let the callback and the hook return first
    _signal_main(signum)


ESCALATE_S = 0.1   # how long the handler may take to run on the flag before a real signal is sent


def _signal_main(signum: int) -> None:
    """Run the scope's handler in the main thread again: first as Python's flag for its next bytecode
    (_thread.interrupt_main), then, if the handler has not run within ESCALATE_S, as a real signal
    aimed at that thread. The flag never reaches a thread blocked in a call (a model's time.sleep in
    a gc callback, reached again after jax swallowed the first interrupt: CI saw SIGKILL); the signal
    ends that call with EINTR. Not a signal every time: a C extension being initialized (an import)
    may not retry a call that a signal interrupts."""
    import _thread
    import time

    seen = _state["handled"]
    with contextlib.suppress(Exception):
        _thread.interrupt_main(signal.Signals(signum))
    end = time.monotonic() + ESCALATE_S
    while time.monotonic() < end:
        time.sleep(0.01)
        if _state["handled"] != seen or _state["ending"]:
            return
    main = threading.main_thread().ident
    # only while the scope's handler is installed: after it, a default SIGTERM would kill the process
    if hasattr(signal, "pthread_kill") and main is not None and signal.getsignal(signum) is _state["handler"]:
        with contextlib.suppress(Exception):
            signal.pthread_kill(main, signum)
