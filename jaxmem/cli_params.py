"""The command line's parameters: click types with messages that say what to write, compare's
grid values checked before any compile, and the options' flags made into click options from
their one definition (jaxmem/program/options.py)."""

from __future__ import annotations

import functools

import click

from jaxmem.errors import UserError, did_you_mean
from jaxmem.program import values
from jaxmem.program.options import (
    AnalyzeOptions,
    flagged,
    parse_pair,
)


def _pairs(ctx, param, values):
    """--arg KEY=VALUE, parsed when the command line is (a malformed one is a usage error)."""

    try:
        return tuple(parse_pair(v) for v in values)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None


class WholeNumber(click.ParamType):
    """An integer in [min, 2^63 - 1]; '1e20' or '8.5' get a message that says what to write."""

    name = "integer"

    def __init__(self, minimum: int, what: str):
        self.minimum, self.what = minimum, what

    def convert(self, value, param, ctx):
        try:
            return values.whole(value, self.minimum, self.what)
        except values.BadValue as e:
            self.fail(e.message, param, ctx)


class Choice(click.Choice):
    """click's Choice whose refusal names the closest choice: --layout fsdpp -> (did you mean fsdp?)."""

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as e:
            hint = did_you_mean(str(value), [str(c) for c in self.choices])
            if not hint:
                raise
            raise click.BadParameter(f"{e.message}{hint}", ctx, param) from None


class RematPolicy(click.ParamType):
    """--remat: a checkpoint policy's name, or offload:NAME[,NAME]."""

    name = "policy"

    def convert(self, value, param, ctx):
        try:
            return values.remat(value)
        except values.BadValue as e:
            self.fail(e.message, param, ctx)


class Regex(click.ParamType):
    """--freeze, --lora-targets, --remat-at: a pattern jaxmem matches in linear time (RE2), checked
    as the command line is read, before jax or the model file (jaxmem.program.patterns)."""

    name = "regex"

    def __init__(self, flag: str):
        self.flag = flag

    def convert(self, value, param, ctx):
        try:
            return values.regex(value, self.flag)   # click names the option itself
        except values.BadValue as e:
            self.fail(e.message, param, ctx)


class Number(click.ParamType):
    """A finite number that `rule` (jaxmem.program.values) takes; the messages say what to write.
    (nan and inf are refused where the command line is read, never passed on.)"""

    def __init__(self, rule: values.Number):
        self.name, self.rule = rule.name, rule

    def convert(self, value, param, ctx):
        try:
            return self.rule(value)
        except values.BadValue as e:
            self.fail(e.message, param, ctx)


def Fraction() -> Number:  # noqa: N802 -- used as a click type, like the classes
    """A share of device memory: a finite number in (0, 1]."""
    return Number(values.FRACTION)


def PositiveNumber() -> Number:  # noqa: N802
    """A finite number above 0."""
    return Number(values.POSITIVE)


def NonNegativeNumber() -> Number:  # noqa: N802
    """A finite number of at least 0 (diff's --max-growth: a share that may exceed 1)."""
    return Number(values.NON_NEGATIVE)


def Share() -> Number:  # noqa: N802
    """A share of usable memory kept free: a finite number in [0, 1)."""
    return Number(values.SHARE)


def Seconds() -> Number:  # noqa: N802
    """A positive, finite number of seconds."""
    return Number(values.SECONDS)


def grid(kind: str):
    """A click callback checking one of compare's comma-separated lists before any compile: a bad
    value is the user's typo (exit 2 naming the option), not a row error or a row that "fits"."""

    def check(ctx, param, value):
        if value is None:
            return value
        try:
            return values.grid(value, kind)
        except values.BadValue as e:
            raise click.BadParameter(e.message, ctx, param) from None

    return check


def pairs_grid(ctx, param, value):
    """compare's repeated --pair LAYOUT:MESH, checked as --layouts and --meshes are: one text, ';' between."""
    if not value:
        return None
    try:
        return values.grid(";".join(value), "pair")
    except values.BadValue as e:
        raise click.BadParameter(e.message, ctx, param) from None


def field_option(name: str):
    """The click option of the options field `name`, made from its Flag (jaxmem/program/options.py)."""

    field, flag = next((f, fl) for f, fl in flagged(AnalyzeOptions) if f.name == name)
    help_, metavar = flag.help or None, flag.metavar
    if flag.kind == "switch":
        return click.option(flag.name, name, is_flag=True, help=flag.help)
    if flag.kind == "pairs":
        return click.option(flag.name, name, multiple=True, callback=_pairs, help=help_, metavar=metavar)
    kind = {"choice": lambda: Choice(flag.choices), "whole": lambda: WholeNumber(flag.minimum or 0, flag.what),
            "count": lambda: click.IntRange(min=flag.minimum), "float": PositiveNumber, "fraction": Fraction,
            "remat": RematPolicy, "text": lambda: Regex(flag.name) if flag.metavar == "REGEX" else None}[flag.kind]()
    return click.option(flag.name, name, type=kind, default=field.default, show_default=flag.show_default,
                        help=help_, metavar=metavar)


def step_options(f=None, *, model_file_required: bool = True, json: bool = True):
    """Options shared by every command that builds a training step: the shared flags of the
    options fields (jaxmem/program/options.py), in their order, and --json (unless `json` is False:
    explore prints no result)."""
    if f is None:  # @step_options(model_file_required=False)
        return lambda g: step_options(g, model_file_required=model_file_required, json=json)

    decorators = [click.argument("model_file", type=click.Path(dir_okay=True), required=model_file_required),
                  *(field_option(field.name) for field, flag in flagged() if flag.shared),
                  *([click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")]
                    if json else [])]
    return functools.reduce(lambda acc, d: d(acc), reversed(decorators), f)


def fields(*names: str):
    """The options of these fields (options.py), in this order: one decorator for a command's own."""
    def apply(f):
        return functools.reduce(lambda acc, d: d(acc), reversed([field_option(n) for n in names]), f)
    return apply


# compare: the pipeline's microbatches as a grid axis (analyze, advise and verify take one number)
MICROBATCHES_GRID = click.option(
    "--microbatches", "microbatches_grid", default=None, callback=grid("microbatches"),
    help="With a stage axis: pipeline microbatches to compare, e.g. 4,8,16 (default: the smallest that keeps every "
    "stage busy).")


def serving_options(f):
    """explore's own options: where it serves, and its worker pool (as compare's --jobs, --executor)."""
    for d in reversed([
        click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
                     help="The port on 127.0.0.1 to serve on (0: a free one)."),
        click.option("--no-browser", is_flag=True, help="Print the URL only; do not open a browser."),
        click.option("--jobs", "n_jobs", type=WholeNumber(1, "the number of worker processes"), default=None,
                     help="Worker processes compiling points (default: all cores but one)."),
        click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
                     help="local: worker processes on this machine; ray: tasks on a Ray cluster."),
        click.option("--ray-address", default=None, help="The Ray cluster (default: RAY_ADDRESS; without either, a "
                     "local Ray is started).")]):
        f = d(f)
    return f


def only_rendering_beside_from(ctx: click.Context) -> None:
    """compare --from re-renders saved rows: an option that would change a row (a grid, a step option, a
    search) is the user's mistake, not silently ignored."""
    # options that change no row
    rendering = {"from_path", "out_path", "as_json", "n_jobs", "executor", "ray_address", "cache", "yes"}
    given = [p for p in ctx.command.params if p.name not in rendering
             and ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE]
    if given:
        names = ", ".join(p.opts[0] if p.opts[0].startswith("-") else (p.name or "").upper() for p in given)
        raise UserError(f"--from re-renders saved rows as they were computed; {names} would change them: drop "
                        f"{'it' if len(given) == 1 else 'them'}, or run compare on MODEL_FILE instead of --from")


def set_help(command: click.Command, name: str, text: str) -> None:
    """Give the option `name` of `command` its own help text (a shared option that reads otherwise)."""
    for p in command.params:
        if p.name == name and isinstance(p, click.Option):
            p.help = text


def side_outputs(html_help: str, png_help: str):
    """--html FILE and --png FILE (analyze's report, compare's rows: jaxmem.present.outputs)."""
    def deco(f):
        f = click.option("--png", "png_path", type=click.Path(dir_okay=False), default=None, help=png_help)(f)
        return click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None, help=html_help)(f)
    return deco
