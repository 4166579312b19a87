"""Errors a user can cause, and how the CLI reports what is not one (a jaxmem bug)."""

from __future__ import annotations

import difflib
import os
import re
import sysconfig
import traceback
from collections.abc import Iterable

HOW_TO_REPORT = ("This is not your mistake. Please report it to the jaxmem maintainers with the command line, "
                 "`jaxmem --version`, and the traceback that JAXMEM_DEBUG=1 prints.")


class UserError(Exception):
    """A problem with the user's input: its message names the culprit and the fix. A name the user
    gave is shown at most WORD_CHARS characters long (a 100,000-character `offload:` name is no 200 KB
    message), and the whole message at most MESSAGE_CHARS."""

    exit_code = 2

    def __init__(self, *args):
        if args and isinstance(args[0], str) and len(args[0]) > WORD_CHARS:
            args = (shorten(args[0]), *args[1:])
        super().__init__(*args)


WORD_CHARS = 300
MESSAGE_CHARS = 20_000


def shorten(text: str) -> str:
    """`text` with every run of more than WORD_CHARS non-space characters clipped (clip), and cut
    at MESSAGE_CHARS characters."""
    text = re.sub(rf"\S{{{WORD_CHARS + 1},}}", lambda m: clip(m.group(0), WORD_CHARS), text)
    if len(text) <= MESSAGE_CHARS:
        return text
    return f"{text[:MESSAGE_CHARS]}...[{len(text) - MESSAGE_CHARS:,} more characters]"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean NAME?)' for the closest of `choices` to what the user typed, or '' when none
    is close (difflib's ratio at least 0.6): an unknown name's message names the likely one."""
    close = difflib.get_close_matches(str(word).strip().lower(), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


# The installed jaxmem package: a frame is jaxmem's own when its file is in here, wherever the
# checkout or the user's files live (a clone named jaxmem/ holds user files too).
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def in_package(filename: str, package_dir: str = PACKAGE_DIR) -> bool:
    """`filename` is a file of the package installed at `package_dir`."""
    return os.path.abspath(filename).startswith(package_dir + os.sep)


def bug_summary(e: BaseException) -> str:
    """`ExcType: first line (module.py:line in function)` for the innermost jaxmem frame."""
    where = ""
    for frame in traceback.extract_tb(e.__traceback__):
        if in_package(frame.filename):
            inner = os.path.relpath(os.path.abspath(frame.filename), PACKAGE_DIR).replace(os.sep, "/")
            where = f" ({inner}:{frame.lineno} in {frame.name})"
    text = str(e).strip()
    first = text.splitlines()[0][:300] if text else ""
    return f"{type(e).__name__}: {first}{where}" if first else f"{type(e).__name__}{where}"


# The most of an error's explanation a report quotes: jax's and flax's messages say what went wrong
# on their later lines (a scan carry's mismatched dtypes, a shape error's operands), yet a message
# can also hold a whole program's repr.
DESCRIBE_LINES = 25
DESCRIBE_CHARS = 2000


def describe(e: BaseException, *, max_lines: int = DESCRIBE_LINES, max_chars: int = DESCRIBE_CHARS) -> str:
    """``ExcType: message`` for an error in the user's code: the whole message, every line of it,
    then its explicit cause (``raise ... from err``) as ``caused by: ExcType: message``; capped at
    `max_lines` lines and `max_chars` characters, a last line saying what was cut."""
    parts, seen = [], set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        text = str(cur).strip()
        parts.append(f"{type(cur).__name__}: {text}" if text else type(cur).__name__)
        cur = cur.__cause__
    return cap("\ncaused by: ".join(parts), max_lines=max_lines, max_chars=max_chars)


# Frameworks whose frames are not where a model's error is: the innermost frame outside them (and
# outside jaxmem) is the model's or its library's line (tunix, EasyDeL, eformer, the user's file).
FRAMEWORKS = ("jax", "jaxlib", "flax", "optax", "numpy", "qwix", "contextlib", "functools")
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def framework_file(filename: str) -> bool:
    """The file is Python's own or one of the FRAMEWORKS' (not where a model's line is)."""
    path = os.path.abspath(filename)
    if path.startswith(_STDLIB) and "site-packages" not in path:
        return True
    parts = path.split(os.sep)
    return any(p in ("site-packages", "dist-packages") and i + 1 < len(parts) and parts[i + 1] in FRAMEWORKS
               for i, p in enumerate(parts))


def short_path(filename: str) -> str:
    """A frame's file as a user finds it: under site-packages from the package's folder
    (`eformer/escale/mesh.py`), under the working directory relative to it, else whole."""
    path = os.path.abspath(filename)
    for marker in (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    cwd = os.getcwd() + os.sep
    return path[len(cwd):] if path.startswith(cwd) else path


def raised_at(e: BaseException) -> str | None:
    """`file:line in function` of the frame that raised `e` in the user's or a library's code (not
    jaxmem's): the innermost frame outside jaxmem and the frameworks (jax, flax, ...), else the
    innermost frame outside jaxmem; through the explicit causes (`raise ... from err`) to the
    first error. None when every frame is jaxmem's."""
    chain: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__
    for err in reversed(chain):   # the innermost error first: where it all started
        frames = [f for f in traceback.extract_tb(err.__traceback__)
                  if not in_package(f.filename) and not f.filename.startswith("<frozen")]
        if not frames:
            continue
        own = [f for f in frames if not framework_file(f.filename)]
        f = (own or frames)[-1]
        return f"{short_path(f.filename)}:{f.lineno} in {f.name}"
    return None


def located(e: BaseException) -> str:
    """:func:`describe`, then the line it was raised at (:func:`raised_at`): a model's or library's
    error names its place, so the user knows which line to change."""
    where = raised_at(e)
    return describe(e) + (f"\n  raised at {where}" if where else "")


def debug_traceback(e: BaseException) -> str | None:
    """With JAXMEM_DEBUG=1: the whole traceback behind a user error (the model's error it
    explains, which ``raise ... from None`` hides, then the user error's own)."""
    if not os.environ.get("JAXMEM_DEBUG"):
        return None
    inner = e.__cause__ or e.__context__
    parts = [] if inner is None else traceback.format_exception(inner)
    parts += traceback.format_exception(type(e), e, e.__traceback__, chain=False)
    return "".join(parts)


def cap(text: str, *, max_lines: int = DESCRIBE_LINES, max_chars: int = DESCRIBE_CHARS) -> str:
    """`text` cut to at most `max_lines` lines and `max_chars` characters (at a line's end when a
    line fits), with a last line saying how much of it was cut."""
    lines = [line.rstrip() for line in text.strip().splitlines()]
    kept: list[str] = []
    used = 0
    for line in lines[:max_lines]:
        if used + len(line) > max_chars:
            if not kept:   # one huge first line: its start
                kept.append(line[:max_chars])
            break
        kept.append(line)
        used += len(line) + 1
    shown = "\n".join(kept)
    whole = "\n".join(lines)
    if len(shown) == len(whole):
        return shown
    more = len(lines) - len(kept)
    lines_note = f"{more} more line{'s' if more != 1 else ''}, " if more else ""
    return f"{shown}\n[message cut: {lines_note}{len(whole) - len(shown)} more characters]"


def clip(text: str, limit: int = 120) -> str:
    """A name the user gave, as a message shows it: at most `limit` characters (its start and end,
    and how many were left out): a 100,000-character name is no 200 KB message."""
    text = str(text)
    if len(text) <= limit:
        return text
    half = (limit - 20) // 2
    return f"{text[:half]}...[{len(text) - 2 * half:,} characters]...{text[-half:]}"


def trace_error(e: Exception, *, explicit: bool = False) -> str:
    """The explanation of an error raised while tracing the user's model or loss (errors.located).
    `explicit`: the mesh's axes are Explicit, where a call whose output sharding is ambiguous fails."""
    msg = str(e).strip()
    m = re.search(r"unbound axis name: (\w+)", msg)
    if m:
        return (f"the model uses the collective axis {m.group(1)!r} (e.g. BatchNorm(axis_name=...)), written for pmap; "
                "jaxmem runs the step under jit with global arrays, where cross-device statistics are automatic. "
                f"Drop axis_name={m.group(1)!r} from the model for the analysis.")
    if re.search(r"of type:? (AxisType\.)?Auto|axis names that are of type Auto|requires.*Explicit", msg):
        return (f"the model is written for JAX's explicit sharding (out_sharding=, reshard) and the mesh's axes are "
                f"Auto: run with --axis-types explicit (API axis_types='explicit'), or give the Workload "
                f"axis_types='explicit'. ({located(e)})")
    if explicit and (type(e).__name__ == "ShardingTypeError" or "out_sharding" in msg):
        where = raised_at(e)
        call = f"the call at {where}" if where else "a call of the model"
        return (f"under explicit axes (--axis-types explicit) {call} needs out_sharding= (its operands' shardings "
                "do not decide its output's): pass out_sharding=P(...) there (or jax.sharding.reshard its "
                "operands), or analyze this auto-style model with --axis-types auto. "
                f"({describe(e) if where else located(e)})")
    m = re.search(r"Resource axis: (\w+) of .* is not found in mesh", msg)
    if m:
        return (f"the model names the mesh axis {m.group(1)!r}, which --mesh lacks: give the mesh the axes the "
                f"model's trainer has, size 1 where unused (e.g. --mesh fsdp=8,{m.group(1)}=1; --axis-roles "
                f"{m.group(1)}=ROLE for a name without a role). ({located(e)})")
    m = re.search(r"One of .* was given the sharding of .*|divisible", msg)
    if m:
        return f"a sharding does not divide a dimension: {located(e)}"
    return f"tracing the training step failed: {located(e)}"
