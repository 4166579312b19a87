"""The regular expressions users give (--freeze, --lora-targets, --remat-at, Workload.fp8_exclude),
compiled once and matched in linear time.

Python's `re` backtracks: `^(([a-z_/]+)+)+!$` searched in one 60-character parameter path runs for
minutes. These patterns are matched by RE2 (google-re2, the maintained binding of Google's
linear-time engine), with Python's syntax for everything RE2 expresses: a pattern Python's `re`
refuses gets `re`'s own message, and one that only backtracking can match (a backreference `\\1`,
lookaround `(?=`, `(?!`, `(?<=`) is refused with what to write instead, exit 2 either way. qwix
matches its rules' module paths with Python's `re` itself, so the providers of jaxmem.program.finetune
and jaxmem.program.fp8 decide each path here (`lookup_rule`) and hand qwix a trivial pattern.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable

from jaxmem.errors import UserError, clip

NEVER = "(?!)"   # a Python pattern that matches no path: a rule the user's pattern does not select


@functools.lru_cache(maxsize=64)
def compile_pattern(pattern: str, flag: str, label: str | None = None):
    """`pattern` compiled by RE2 (`.search(text)` as `re`'s), or a UserError naming `flag` (the
    message shows `label`, default "FLAG 'PATTERN'")."""
    shown = label or f"{flag} {clip(repr(pattern))}"
    if not isinstance(pattern, str):
        raise UserError(f"{shown}: give a regular expression as text")
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise UserError(f"{shown} is not a valid regular expression ({clip(str(e))})") from None
    import re2  # noqa: PLC0415 - RE2 loads only for a pattern

    options = re2.Options()
    options.log_errors = False   # the UserError says it; no second copy on stderr from RE2's logger
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        why = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise UserError(f"{shown}: jaxmem matches patterns in linear time (RE2), which cannot match this "
                        f"one ({clip(why)}); write it without backreferences (\\1) and lookaround ((?=, (?!, "
                        "(?<=), e.g. a plain alternation 'attn|mlp'") from None


def search(pattern: str, flag: str, text: str) -> bool:
    """`re.search(pattern, text)`, in linear time."""
    return compile_pattern(pattern, flag).search(text) is not None


def lookup_rule(provider, lookup: Callable, op_name: str, **kwargs):
    """qwix's rule lookup for the op running now, with the rules `provider.jaxmem_paths` names
    ({rule index: path -> selected}) decided here: qwix sees ".*" for a path the user's pattern
    selects and NEVER for one it does not, so its own `re.fullmatch` never runs the user's pattern."""
    deciders: dict[int, Callable[[str], bool]] = getattr(provider, "jaxmem_paths", None) or {}
    if not deciders:
        return lookup(op_name, **kwargs)
    from qwix._src.utils import flax_util  # noqa: PLC0415 - qwix loads only for --lora, --base-dtype, fp8

    path = "/".join(map(str, flax_util.get_current_module_path()))
    saved = provider._rules
    provider._rules = [dataclasses.replace(r, module_path=".*" if deciders[i](path) else NEVER) if i in deciders
                       else r for i, r in enumerate(saved)]
    try:
        return lookup(op_name, **kwargs)
    finally:
        provider._rules = saved
