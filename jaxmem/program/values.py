"""The options' values checked as the command line reads them, without click: one rule and one message
for each kind of flag (jaxmem/program/options.py's Flag.kind) and each of compare's grid lists.

The CLI's click types (jaxmem/cli_params.py) call these, and the Python API (jaxmem/api.py) calls them
for its keywords, so a bad value gets the same words either way. Where the CLI uses click's own
IntRange and Choice, :func:`count` and :func:`choice` say what click says. A leaf: no click, no jax.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from jaxmem.compiler.targets import resolve_gpu_name
from jaxmem.errors import UserError, did_you_mean
from jaxmem.program import patterns
from jaxmem.program.layouts import parse_mesh
from jaxmem.program.options import (
    BASE_DTYPES,
    LAYOUTS,
    OPTIMIZER_NAMES,
    PRECISIONS,
    Flag,
    flagged,
    remat_problem,
    split_remats,
)


class BadValue(ValueError):
    """A value its option refuses; the message says what to write (the option is named by the caller)."""

    @property
    def message(self) -> str:
        return str(self)


def whole(value: Any, minimum: int, what: str) -> int:
    """An integer in [minimum, 2^63 - 1]; '1e20' or '8.5' get a message that says what to write."""
    _no_bool(value, f"{what} in digits, e.g. 1024")
    if isinstance(value, int):
        n = value
    else:
        text = str(value).strip().replace("_", "")
        try:
            n = int(text)
        except ValueError:
            raise BadValue(f"{value!r} is not a whole number; give {what} in digits, e.g. 1024") from None
    if n < minimum:
        raise BadValue(f"{n} is not allowed: {what} must be at least {minimum}")
    if n > 2**63 - 1:
        raise BadValue(f"{n} is beyond a 64-bit integer; no device can hold {what} that large")
    return n


def _no_bool(value: Any, what: str) -> None:
    """True and False are not numbers anywhere (Python's int(True) is 1: `lora=True` would be rank 1)."""
    if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):   # numpy's bool too
        raise BadValue(f"{value!r} is not a number; give {what}")


def count(value: Any, minimum: int | None) -> int:
    """A small integer of at least `minimum`: click.IntRange's rule and words (the CLI's type for it)."""
    _no_bool(value, f"a whole number{'' if minimum is None else f' of at least {minimum}'}")
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise BadValue(f"{value!r} is not a valid integer range.") from None
    if minimum is not None and n < minimum:
        raise BadValue(f"{n} is not in the range x>={minimum}.")
    return n


def choice(value: Any, choices: tuple[str, ...], *, hint: bool = True) -> str:
    """One of `choices`, as written: click.Choice's words, and (hint) the closest choice named."""
    text = str(value)
    if text in choices:
        return text
    listed = f"is not {choices[0]!r}." if len(choices) == 1 else f"is not one of {', '.join(map(repr, choices))}."
    raise BadValue(f"{value!r} {listed}{did_you_mean(text, list(choices)) if hint else ''}")


@dataclasses.dataclass(frozen=True)
class Number:
    """A finite number that `accepts` takes; the messages say what to write (nan and inf refused)."""

    name: str
    accepts: Callable[[float], bool]
    not_a_number: str
    refused: str

    def __call__(self, value: Any) -> float:
        try:
            _no_bool(value, "a number")
        except BadValue:
            raise BadValue(self.not_a_number.format(value=value)) from None
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise BadValue(self.not_a_number.format(value=value)) from None
        if not math.isfinite(x) or not self.accepts(x):
            raise BadValue(self.refused.format(value=value))
        return x


FRACTION = Number("fraction", lambda x: 0 < x <= 1, "{value!r} is not a number; give a share of the card in (0, 1], "
                  "e.g. 0.9", "{value} is not in (0, 1]; give a share of the card, e.g. 0.9")
POSITIVE = Number("number", lambda x: x > 0, "{value!r} is not a number; give a positive number, e.g. 16",
                  "{value} is not allowed: give a positive, finite number, e.g. 16")
NON_NEGATIVE = Number("number", lambda x: x >= 0, "{value!r} is not a number; give a share, e.g. 0.05 for 5%",
                      "{value} is not allowed: give a finite share of at least 0, e.g. 0.05 for 5%")
SHARE = Number("share", lambda x: 0 <= x < 1, "{value!r} is not a number; give a share in [0, 1), e.g. 0.05",
               "{value} is not in [0, 1); give the share of usable memory to keep free, e.g. 0.05")
SECONDS = Number("seconds", lambda x: x > 0, "{value!r} is not a number of seconds",
                 "{value}: give a positive, finite number of seconds, e.g. 600")


def remat(value: Any) -> str:
    """--remat: a checkpoint policy's name, or offload:NAME[,NAME]."""
    problem = remat_problem(str(value))
    if problem:
        raise BadValue(problem)
    return str(value)


def regex(value: Any, flag: str) -> str:
    """--freeze, --lora-targets, --remat-at: a pattern jaxmem matches in linear time (RE2)."""
    try:
        patterns.compile_pattern(str(value), flag)
    except UserError as e:
        raise BadValue(str(e).removeprefix(f"{flag} ")) from None   # the caller names the option
    return str(value)


def of_flag(value: Any, flag: Flag) -> Any:
    """`value` for the option `flag` (not a switch or KEY=VALUE pairs: those are the caller's)."""
    if flag.kind == "choice":
        return choice(value, flag.choices)
    if flag.kind == "whole":
        return whole(value, flag.minimum or 0, flag.what)
    if flag.kind == "count":
        return count(value, flag.minimum)
    number = {"float": POSITIVE, "fraction": FRACTION}.get(flag.kind)
    if number is not None:
        return number(value)
    if flag.kind == "remat":
        return remat(value)
    return regex(value, flag.name) if flag.metavar == "REGEX" else str(value)


_BATCH = next(flag for f, flag in flagged() if f.name == "batch")


def grid(value: str, kind: str) -> str:
    """One of compare's lists (';' between meshes and --pair's LAYOUT:MESH pairs, ',' elsewhere), each
    value checked before any compile."""
    sep = ";" if kind in ("mesh", "pair") else ","
    items = split_remats(value) if kind == "remat" else [v.strip() for v in value.split(sep)]
    if not any(items) or (kind not in ("mesh", "pair") and not all(items)):
        raise BadValue(f"{value!r}: expected {kind} values separated by '{sep}'")
    for v in filter(None, items):
        try:
            grid_value(kind, v)
        except (UserError, ValueError) as e:
            raise BadValue(f"{v!r} in {value!r}: {e}") from None
    return value


def grid_value(kind: str, v: str) -> None:
    """One value of a grid list, as the option it varies refuses it."""
    if kind == "microbatches":   # as analyze's --microbatches refuses it
        if v.lower() not in ("none", "default"):
            count(v, 1)
    elif kind == "batch":   # as analyze's --batch refuses it (its flag's rule and words)
        of_flag(v, _BATCH)
    elif kind == "lora_rank":
        if not v.isdigit():
            raise ValueError("a LoRA rank is a whole number: 0 (every parameter trains) or a positive rank")
    elif kind == "base_dtype":
        if v.lower() != "none" and v not in BASE_DTYPES:
            raise ValueError(f"unknown base dtype; known: none, {', '.join(BASE_DTYPES)}")
    elif kind == "layout":
        if v not in LAYOUTS:
            raise ValueError(f"unknown layout; known: {', '.join(LAYOUTS)}")
    elif kind == "remat" and (problem := remat_problem(v)):
        raise ValueError(problem)
    elif kind == "precision":
        if v not in PRECISIONS:
            raise ValueError(f"unknown precision; known: {', '.join(PRECISIONS)}")
    elif kind == "optimizer":
        if v not in OPTIMIZER_NAMES:
            raise ValueError(f"unknown optimizer; known: {', '.join(OPTIMIZER_NAMES)}")
    elif kind == "mesh":
        parse_mesh(v, need_roles=False)   # the axes' roles may come with --axis-roles: checked with it
    elif kind == "gpu":
        resolve_gpu_name(v)
    elif kind == "pair":   # LAYOUT:MESH, each half as --layouts and --meshes refuse it
        layout, sep, mesh = v.partition(":")
        if not sep:
            raise ValueError("expected LAYOUT:MESH, e.g. dp:data=8 or fsdp_tp:data=4,model=2")
        grid_value("layout", layout.strip())
        grid_value("mesh", mesh.strip())
