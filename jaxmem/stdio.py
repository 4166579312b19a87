"""The `jaxmem` program's standard streams when the shell closed them (`>&-`, `2>&-`).

Python then starts with sys.stdout or sys.stderr set to None, and the next file jaxmem (or XLA, or a
child) opens gets the free descriptor: printed output would land in that file. So a closed
descriptor 0-2 is filled with /dev/null first; a closed stdout becomes a stream whose every write
fails (the command ends as for a closed pipe: exit 2, "cannot write the output (stdout)", on
stderr when it is open); a closed stderr becomes /dev/null (the exit code still says what
happened: nothing can be told).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys


class _Closed(io.TextIOBase):
    """stdout closed by the shell: each write is the OSError a closed pipe gives (exits.run: exit 2)."""

    encoding = "utf-8"
    errors = "strict"

    def __init__(self, fd: int):
        self._fd = fd

    def write(self, s: str) -> int:
        if not s:
            return 0
        raise OSError(errno.EBADF, "stdout is closed (>&-); nothing can be printed")

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return False


def guard() -> None:
    """Fill closed descriptors 0-2 with /dev/null; stand in for a closed sys.stdout / sys.stderr."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
            try:
                new = os.open(os.devnull, os.O_RDWR)
                if new != fd:
                    os.dup2(new, fd)
                    os.close(new)
            except OSError:
                pass
    if 1 in closed or sys.stdout is None:
        sys.stdout = _Closed(1)
    if 2 in closed or sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - for the process's life
    if 0 in closed or sys.stdin is None:
        sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115


def run(main) -> None:
    """main(), where output click writes itself, outside exits.run (--version, --help, gpus), into a
    closed stdout is the environment's: exit 2, said on stderr. Any other OSError is raised again."""
    try:
        main()
    except OSError as e:
        if e.errno != errno.EBADF:
            raise
        with contextlib.suppress(Exception):
            sys.stderr.write(f"error: cannot write the output (stdout): {e.strerror}\n")
        raise SystemExit(2) from None
