"""Preset configs for model files: `--arg preset=8b --arg seq_len=4096` -> a validated config."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from jaxmem.errors import UserError
from jaxmem.program.options import remat_problem

C = TypeVar("C", bound="DataclassInstance")


def choose_preset(family: str, presets: Mapping[str, C], preset: str, overrides: dict[str, Any],
                  extra_args: tuple[str, ...] = ()) -> C:
    """`presets[preset]` with `overrides` replacing its fields; one clear error for any mistake.

    `extra_args` are the workload() arguments that are not config fields (named in the error).
    Values from the command line arrive as text or numbers: boolean fields accept true/false/1/0.
    """
    if preset not in presets:
        raise UserError(f"{family}: unknown preset {preset!r}; known presets: {', '.join(presets)}")
    base = presets[preset]
    fields = {f.name: f for f in dataclasses.fields(base)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        known = ", ".join(["preset", *extra_args, *fields])
        raise UserError(f"{family}: unknown argument(s) {', '.join(unknown)}; known: {known}")
    problem = remat_problem(str(overrides.get("remat", "none")))
    if problem:
        raise UserError(f"{family}: {problem}")
    values = dict(overrides)
    for name, value in overrides.items():
        if isinstance(getattr(base, name), bool) and not isinstance(value, bool):
            values[name] = str(value).lower() in ("1", "true", "yes")
    return dataclasses.replace(base, **values)
