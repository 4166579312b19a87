"""How a command ends: its exit code, and the one handler every command runs in.

0 it fits, 3 it does not, 2 the user's (or their environment's) mistake, 1 a jaxmem bug,
128 + N stopped by signal N: never 0 or 3 without a verdict.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import signal
import sys
import threading

import click

from jaxmem import session
from jaxmem.errors import HOW_TO_REPORT, UserError, bug_summary, debug_traceback

EXIT_FITS, EXIT_BUG, EXIT_USER_ERROR, EXIT_DOES_NOT_FIT = 0, 1, 2, 3
EXIT_GREW = 4   # jaxmem diff --max-growth: the peak grew by more than the share allowed
# write errors on stdout (a full device, a closed pipe, a quota): the user's environment, not a jaxmem bug
# (EBADF: stdout closed by the shell, `>&-`: jaxmem.stdio)
_OUTPUT_ERRNOS = tuple(getattr(errno, n) for n in ("ENOSPC", "EPIPE", "EDQUOT", "EFBIG", "EIO", "EBADF")
                       if hasattr(errno, n))


_standalone = False   # set by the `jaxmem` program (cli.entry), not when a command runs in another's process


def standalone() -> None:
    """This process is the `jaxmem` program: it ends with the command (see _late_signals_end_the_process)."""
    global _standalone
    _standalone = True


def _late_signals_end_the_process() -> None:
    """Once the scope is over the answer is final, but the process is not gone yet (printing,
    jax's and XLA's teardown). Python's own SIGINT handler would raise KeyboardInterrupt there,
    which the interpreter's shutdown prints and ignores: exit 0 after a ^C. The signals' default
    action instead ends the process by the signal (-N), never with a verdict."""
    from jaxmem import scratch  # noqa: PLC0415 - loaded by the run (jaxmem.session.scope), not by `jaxmem --help`

    for s in scratch.SIGNALS:   # the ones the run scope handles
        if s in scratch.IGNORED_AT_START:   # nohup's SIGHUP stays ignored
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(s, signal.SIG_DFL)


def run(fn):
    """The one top-level handler of every command.

    User errors: one message, exit 2, no traceback. A signal: temporary files removed,
    exit 128 + signal. Anything else is a jaxmem bug: one line saying so and how to report
    it, exit 1 (JAXMEM_DEBUG=1 shows the traceback). Never 0 or 3 without a verdict.
    """
    from jaxmem import scratch  # noqa: PLC0415 - as in _late_signals_end_the_process

    code, scoped = EXIT_BUG, False
    try:
        try:
            # the environment checked before jax starts (its GPU plugin would fail on a bad one with a
            # traceback), then the run's scratch directory and signals: jaxmem.session
            with session.scope():
                scoped = True
                try:
                    fn()
                    code = EXIT_FITS
                except SystemExit as e:  # the command's own verdict (model files' exits are caught at the source)
                    if isinstance(e.__context__, OSError):  # rich exits so when stdout's reader is gone: say so
                        raise e.__context__ from None
                    code = e.code if isinstance(e.code, int) else EXIT_BUG
        finally:
            if scoped and scratch.received() is None and _standalone:
                _late_signals_end_the_process()
        _flush_stdout()
    except UserError as e:
        if not (scoped and scratch.received()):  # what a signal broke on its way out is not the user's error
            whole = debug_traceback(e)   # JAXMEM_DEBUG=1: the model's traceback behind the message
            if whole:
                click.echo(whole, err=True, nl=False)
            click.echo(f"error: {e}", err=True)
        code = EXIT_USER_ERROR
    except (click.ClickException, click.exceptions.Exit, click.Abort):  # click reports these itself (exit 2)
        raise
    except KeyboardInterrupt as e:
        code = e.exit_code if isinstance(e, scratch.Interrupted) else 130
        what = scratch.describe() if isinstance(e, scratch.Interrupted) else "SIGINT"
        click.echo(f"\njaxmem: stopped by {what}; temporary files removed", err=True)
    except OSError as e:
        if e.errno not in _OUTPUT_ERRNOS:
            if os.environ.get("JAXMEM_DEBUG"):
                raise
            if not (scoped and scratch.received()):
                click.echo(f"jaxmem bug: {bug_summary(e)}\n{HOW_TO_REPORT}", err=True)
            code = EXIT_BUG
        else:
            what = e.filename or "the output (stdout)"
            click.echo(f"error: cannot write {what}: {e.strerror or e}", err=True)
            code = EXIT_USER_ERROR
            if not e.filename:
                _silence_stdout()
    except Exception as e:
        if os.environ.get("JAXMEM_DEBUG"):
            raise
        if not (scoped and scratch.received()):  # e.g. an import that a signal interrupted, turned ImportError
            click.echo(f"jaxmem bug: {bug_summary(e)}\n{HOW_TO_REPORT}", err=True)
        code = EXIT_BUG
    signum = scratch.received() if scoped else None
    if signum is not None:
        if code != 128 + signum:  # a signal that code on its way swallowed or turned into an error
            discarded = "; the result above is discarded" if code in (EXIT_FITS, EXIT_DOES_NOT_FIT) else ""
            click.echo(f"\njaxmem: stopped by {scratch.describe()}{discarded}; temporary files removed", err=True)
        # An XLA compile the signal interrupted leaves its threads running: the interpreter's
        # shutdown would race them (it segfaulted). Exit now; the helper removes what they write.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(128 + signum)
    if _standalone:
        _end_now(code)
    sys.exit(code)


def _end_now(code: int) -> None:
    """End the `jaxmem` program with `code` without the interpreter's teardown of its modules:
    freeing a large analysis' objects and XLA's clients one by one takes 0.2 s (gpt2-medium on
    8 x H100) and decides nothing. The atexit handlers still run (Ray's shutdown, logging's flush)
    and the output is flushed. Only when no other thread is running: a live non-daemon thread
    (an executor's worker) gets the normal exit, which waits for it."""
    if any(t is not threading.current_thread() and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()   # what Python's own exit runs first (no public spelling; stable since Python 2)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _flush_stdout() -> None:
    """Output errors (a full disk, a closed pipe) surface here, not at interpreter exit."""
    sys.stdout.flush()


def _silence_stdout() -> None:
    # After a failed write, the interpreter's own flush at exit would fail again, with a traceback.
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass
