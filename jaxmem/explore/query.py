"""A request's query string as analyze's options: the same names, the same rules, the same messages.

`/api/answer?batch=16&remat=full&mesh=fsdp%3D8&arg.seq_len=4096` names analyze's long options without
their dashes and the model's arguments as ``arg.NAME``. Each value goes through the rule the CLI's
option of that name applies (jaxmem.program.values, the rules the click types and the Python API call),
then the whole point through jaxmem.precheck (the GPU, the mesh, the optimizer), so a value the CLI
refuses is refused here with the CLI's words, before anything compiles. An option left out keeps the
starting point's value: a request is a move from where the explorer started.

Nothing a request says may read or write a file (only the model given at start, and the cache): the
options that take a path (--rules) and the switch that bypasses the cache (--no-cache) are pinned to
the starting point's values, and so are the model's text arguments (a workload may open a path it is
given); numbers and booleans, which no workload can take for a file, move freely.

Jax-free itself; the model's closed lists of text values come from jaxmem.explore.modelargs (which reads a
config.json through jaxmem.hf).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jaxmem import precheck
from jaxmem.errors import UserError, did_you_mean
from jaxmem.explore import modelargs
from jaxmem.program import values
from jaxmem.program.options import AnalyzeOptions, Flag, command_line, flagged, parse_pair

# The request parameters that are not options: the answer's own (wait=exact), save's format, a cache-buster.
CONTROL = ("wait", "format", "_")
# Options a request may only repeat: a path (--rules) is a file read; --no-cache bypasses the cache.
PINNED = ("rules", "cache")
ARG_PREFIX = "arg."


class BadQuery(UserError):
    """A request the CLI would refuse (HTTP 400): the message is the CLI's own."""


def _analyze_flags() -> dict[str, tuple[dataclasses.Field, Flag]]:
    """analyze's options by their long name without dashes (the model's --arg apart: arg.NAME)."""
    out = {}
    for f, flag in flagged(AnalyzeOptions):
        if flag.kind == "pairs" or not (flag.shared or "analyze" in flag.commands):
            continue
        out[flag.name.removeprefix("--")] = (f, flag)
    return out


FLAGS = _analyze_flags()
_BY_FIELD = {f.name: name for name, (f, _) in FLAGS.items()}


def name_of(field: str) -> str:
    """The request parameter of the AnalyzeOptions field `field` (e.g. mem_fraction -> mem-fraction)."""
    return _BY_FIELD[field]


def _switch(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low in ("", "1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise BadQuery(f"Invalid value for '--{name}': {text!r} is not a switch value; give 1 (on) or 0 (off)")


def parse(params: dict[str, list[str]], start: AnalyzeOptions, model: str) -> AnalyzeOptions:
    """The options a request names (`params`: parse_qs's lists), on top of `start`: a 400 (BadQuery)
    for an unknown name, a value the CLI refuses, a pinned option moved, or a parameter given twice."""
    kw: dict[str, Any] = {f.name: getattr(start, f.name) for f in dataclasses.fields(AnalyzeOptions)}
    args = dict(start.model_args)
    for key, given in params.items():
        if key in CONTROL:
            continue
        if len(given) != 1:
            raise BadQuery(f"{key} is given {len(given)} times; give it once")
        text = given[0]
        if key.startswith(ARG_PREFIX):
            _arg(key[len(ARG_PREFIX):], text, args, dict(start.model_args), model)
            continue
        if key not in FLAGS:
            known = [*FLAGS, "arg.NAME"]
            raise BadQuery(f"unknown option {key!r}{did_you_mean(key, list(FLAGS))}; the options are analyze's "
                           f"long names without dashes: {', '.join(known)}")
        f, flag = FLAGS[key]
        if flag.kind == "switch":
            on = _switch(key, text)
            value: Any = (not on) if flag.invert else on
        elif text == "":
            value = f.default        # an empty value: analyze's default (no such flag on the command line)
        else:
            try:
                value = values.of_flag(text, flag)
            except values.BadValue as e:
                raise BadQuery(f"Invalid value for '--{key}': {e.message}") from None
        if f.name in PINNED and value != getattr(start, f.name):
            why = "names a file" if f.name == "rules" else "bypasses the compile cache"
            raise BadQuery(f"--{key} is fixed for this explorer (it {why}); restart `jaxmem explore` with the "
                           f"--{key} you want")
        kw[f.name] = value
    kw["model_args"] = tuple(sorted(args.items()))
    opts = AnalyzeOptions(**kw)
    try:
        precheck.options(model, opts)   # the GPU, the mesh, the optimizer: the CLI's checks before jax
    except UserError as e:
        raise BadQuery(str(e)) from None
    return opts


def _arg(name: str, text: str, args: dict[str, Any], start: dict[str, Any], model: str) -> None:
    """arg.NAME=VALUE, read as --arg NAME=VALUE is (numbers as numbers, true/false/none); an empty value
    drops the argument (the workload's default). Text values are pinned to the starting point's, except one of
    the argument's own closed list of values (jaxmem.explore.modelargs: attention=xla, preset=tiny)."""
    if not name.isidentifier():
        raise BadQuery(f"arg.{name}: {name!r} is not an argument name; give arg.NAME=VALUE, e.g. arg.seq_len=4096")
    if text == "":
        if name in start and isinstance(start[name], str):
            raise BadQuery(f"arg.{name} is fixed for this explorer (text arguments may name files); restart "
                           f"`jaxmem explore` with the --arg {name}=... you want")
        args.pop(name, None)
        return
    _, value = parse_pair(f"{name}={text}")
    if isinstance(value, str) and value != start.get(name) and not modelargs.allowed_text(model, name, value):
        given = f" (it was {start[name]!r})" if name in start else ""
        raise BadQuery(f"arg.{name}={text!r}: text arguments are fixed for this explorer{given}, as a workload may "
                       f"read a file they name; numbers and true/false may change. Restart `jaxmem explore` with "
                       f"--arg {name}=... to explore another")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadQuery(f"arg.{name}={text!r}: give a finite number")
    args[name] = value


def canonical(opts: AnalyzeOptions) -> AnalyzeOptions:
    """The options with the model's arguments in name order: one point, one key."""
    return dataclasses.replace(opts, model_args=tuple(sorted(opts.model_args)))


def key(model: str, opts: AnalyzeOptions) -> str:
    """The point's key: the flags of the command line that reproduces it (the model left out)."""
    line = command_line(model, canonical(opts), "analyze")
    prefix = command_line(model, AnalyzeOptions(), "analyze").split(" --", 1)[0]
    return line[len(prefix):].strip()


def to_query(opts: AnalyzeOptions) -> dict[str, str]:
    """Every option's value at this point as a request would write it ("" for an unset one; switches 1/0)."""
    out: dict[str, str] = {}
    for name, (f, flag) in FLAGS.items():
        v = getattr(opts, f.name)
        if flag.kind == "switch":
            out[name] = "1" if (not v if flag.invert else v) else "0"
        elif v is None:
            out[name] = ""
        elif flag.kind in ("float", "fraction"):
            out[name] = repr(float(v))
        else:
            out[name] = str(v)
    for k, v in sorted(opts.model_args):
        out[ARG_PREFIX + k] = "none" if v is None else ("true" if v is True else "false" if v is False else str(v))
    return out
