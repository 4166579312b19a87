"""Errors a user can cause, and how the CLI reports what is not one (a jaxmem bug)."""

from __future__ import annotations

import traceback

HOW_TO_REPORT = ("This is not your mistake. Please report it to the jaxmem maintainers with the command line, "
                 "`jaxmem --version`, and the traceback that JAXMEM_DEBUG=1 prints.")


class UserError(Exception):
    """A problem with the user's input: its message names the culprit and the fix."""

    exit_code = 2


def bug_summary(e: BaseException) -> str:
    """`ExcType: first line (module.py:line in function)` for the innermost jaxmem frame."""
    where = ""
    for frame in traceback.extract_tb(e.__traceback__):
        if "/jaxmem/" in frame.filename.replace("\\", "/"):
            where = f" ({frame.filename.replace(chr(92), '/').rsplit('/jaxmem/', 1)[1]}:{frame.lineno} in {frame.name})"
    text = str(e).strip()
    first = text.splitlines()[0][:300] if text else ""
    return f"{type(e).__name__}: {first}{where}" if first else f"{type(e).__name__}{where}"
