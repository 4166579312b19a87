"""jaxmem from Python: ``analyze``, ``compare`` and ``advise`` with the CLI's options as keywords.

A thin layer over the pipeline the CLI calls (``jaxmem.pipeline.analyze_model``,
``jaxmem.plan.compare``, ``jaxmem.plan.advise``), returning the objects the CLI renders. The
keywords are the fields of ``AnalyzeOptions`` (plus three names the CLI spells differently), and
each value is checked by the rule the CLI's option of that name applies (jaxmem.program.values, without
click), so a bad value gets the CLI's message. Every
error a user can cause is a ``jaxmem.UserError``. See docs/api.md.

Nothing here imports jax at module level: ``import jaxmem`` stays as light as the CLI's start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import numbers
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jaxmem import precheck
from jaxmem.errors import UserError
from jaxmem.explore import notebook as explore_client
from jaxmem.program import values
from jaxmem.program.layouts import mesh_size
from jaxmem.program.options import AnalyzeOptions
from jaxmem.program.workload import source_label

if TYPE_CHECKING:  # the return types, without importing the pipeline (and jax) with jaxmem
    from jaxmem.plan.advise import Advice
    from jaxmem.plan.compare import Rows
    from jaxmem.report import Report

# The CLI's flags whose names differ from their AnalyzeOptions field.
ALIASES = {"args": "model_args", "lora": "lora_rank", "depth": "module_depth"}
# compare's grid keywords (the CLI's --layouts, --batches, ...) -> the option each one varies
# (jaxmem.plan.compare.AXES; tests/test_api.py checks that every axis has its keyword).
GRID = {"layouts": "layout", "remats": "remat", "precisions": "precision", "batches": "batch",
        "optimizers": "optimizer", "meshes": "mesh", "gpus": "gpu", "loras": "lora_rank",
        "base_dtypes": "base_dtype", "rules_files": "rules", "microbatches": "microbatches", "pairs": "pair"}
# compare's fit-search keywords (the CLI's --find-batch, --find-seq, --find-devices, --granule, --margin)
FIND = ("find_batch", "find_seq", "find_devices", "granule", "margin")
# Forced CPU devices asked for at least: XLA reads their number once, when jax starts, so a
# notebook's first analysis (often data=1) must not leave a later data=8 on the CPU without them.
HOST_DEVICES = 8


def analyze(model, **options: Any) -> Report:
    """Predict the per-device peak memory of a training step: ``jaxmem analyze`` from Python.

    Args:
        model: a model file's path (``str`` or ``Path``, a .py defining ``workload()``), a Hugging
            Face config.json or its folder (jaxmem.hf builds it), a
            ``jaxmem.Workload``, or a function returning one (called as a model file's
            ``workload()`` is: with ``args`` as keywords, and ``remat=`` when it takes it).
        **options: the CLI's options in snake_case, e.g. ``gpu="h100"``, ``mesh="data=8"``,
            ``layout="fsdp"``, ``batch=64``, ``precision="bf16"``, ``remat="full"``, ``accum=4``,
            ``optimizer="adafactor"``, ``donate=False``, ``freeze="embed"``, ``lora=16``,
            ``lora_targets="attn"``, ``lora_alpha=32.0``, ``base_dtype="nf4"``,
            ``offload="optimizer"``, ``mem_fraction=0.9``, ``hosts=2``, ``top=10``, ``depth=3``,
            ``explain=False``, ``cache=False``, and ``args={"preset": "tiny"}`` for the workload's
            own arguments (the CLI's ``--arg``). Any field of ``jaxmem.pipeline.AnalyzeOptions``.

    Returns:
        The ``jaxmem.Report`` the CLI prints: ``per_device_peak_bytes``, ``breakdown``,
        ``fits``, ``headroom_bytes``, ...; ``to_json()`` is what ``jaxmem analyze --json`` prints,
        and in Jupyter it renders as the verdict, the breakdown and the memory curve.

    Raises:
        jaxmem.UserError: an unknown option or a bad value (with the CLI's message), a model that
            fails to load, a mesh the layout cannot use, ...

    Example:
        >>> import jaxmem
        >>> r = jaxmem.analyze("models/mlp.py", args={"preset": "tiny"}, gpu="h100", mesh="data=2")
        >>> r.fits, r.per_device_peak_bytes
    """
    with _session() as cpu_devices:
        opts = _options(options)
        precheck.options(model, opts)   # a typo answered before jax loads
        cpu_devices(mesh_size(opts.mesh) if opts.on_cpu else 0)
        return _jax_side().pipeline.analyze_model(model, opts)


def compare(model, *, jobs: int | None = None, executor: str = "local", ray_address: str | None = None,
            yes: bool = False, find_batch: bool = False, find_seq: str | None = None, find_devices: bool = False,
            granule: int | None = None, margin: float | None = None, **options: Any) -> Rows:
    """Analyze a grid of choices side by side: ``jaxmem compare`` from Python.

    Args:
        model: as for :func:`analyze`. A model file's rows compile in worker processes; a
            ``Workload`` or a function (which cannot be sent to one) compile in this process.
        **options: the grid, each axis a list: ``layouts=["dp", "fsdp"]``, ``remats``,
            ``precisions``, ``batches=[8, 16]``, ``optimizers``, ``meshes=["data=8",
            "data=4,model=2"]``, ``gpus``, ``loras``, ``base_dtypes``, ``rules_files`` (--rules
            files), ``microbatches=[4, 8]`` (with a stage axis); ``pairs=[("dp", "data=8"), ("fsdp_tp",
            "data=4,model=2")]`` (or ``"dp:data=8"`` strings; the CLI's ``--pair``) gives each row its layout
            and mesh instead of ``layouts`` x ``meshes``; every row is the combination on top of the other
            options, which are :func:`analyze`'s.
        find_batch, find_seq, find_devices: make each row a fit search, as the CLI's ``--find-batch``,
            ``--find-seq ARG`` (the workload argument searched, e.g. ``"seq_len"``) and ``--find-devices``
            do; ``granule`` (the step of ``find_seq``) and ``margin`` (the share of usable memory kept
            free) as theirs. The row's ``max_batch`` / ``search`` hold the answer.
        jobs: worker processes (default: all cores); ``1`` compiles the rows in this process.
        executor: ``"local"`` (worker processes) or ``"ray"`` (tasks on a Ray cluster).
        ray_address: the Ray cluster, with ``executor="ray"``.
        yes: start a grid of more than 200 rows (without it, such a grid raises a UserError saying how
            long it expects to take), as the CLI's ``--yes``.

    Returns:
        The rows, one ``Cell`` per combination in grid order (``choice``, ``report``, ``error``,
        ``status``): a list, with ``to_json()`` giving what ``jaxmem compare --json`` prints, and a
        table in Jupyter. A row that fails is an error row; the others are kept.

    Raises:
        jaxmem.UserError: an unknown option or a bad value, or every row failing.

    Example:
        >>> rows = jaxmem.compare("models/mlp.py", args={"preset": "tiny"}, gpu="h100", mesh="data=2",
        ...                       layouts=["dp", "fsdp"], jobs=1)
        >>> [(c.choice["layout"], c.report.per_device_peak_bytes) for c in rows]
    """
    with _session() as cpu_devices:
        spec = {GRID[k]: _grid_text(k, options.pop(k)) for k in list(options) if k in GRID}
        base = _options(options, also=(*GRID, "jobs", "executor", "ray_address", *FIND))
        precheck.options(model, base, grid=spec)   # typos first: before anything imports jax
        find = _find(find_batch, find_seq, find_devices, granule, margin)
        n_jobs = None if jobs is None else _checked("jobs", jobs, values.whole, 1, "the number of worker processes")
        executor = _checked("executor", executor, values.choice, ("local", "ray"), hint=False)
        pair_meshes = ";".join(p.partition(":")[2] for p in (spec.get("pair") or "").split(";") if p.strip())
        meshes = spec.get("mesh") or pair_meshes or base.mesh
        cpu_devices(max(mesh_size(m) for m in meshes.split(";") if m.strip()))
        jx = _jax_side()
        compare_mod = jx.compare
        if find is not None:
            kind, arg, granule, margin = find
            find = compare_mod.Find(kind, arg=arg, granule=granule,
                                    margin=jx.search.DEFAULT_MARGIN if margin is None else margin)
        if not _is_path(model) or (n_jobs == 1 and executor == "local"):
            executor = "inline"   # a Workload does not pickle; one job needs no worker to start
        cells = compare_mod.compare(_path_or(model), base, spec, find=find, n_jobs=n_jobs, executor=executor,
                                    ray_address=ray_address, progress=False, yes=yes is True)
    return compare_mod.Rows(cells)


def advise(model, *, all: bool = False, changes=None, jobs: int | None = None,  # noqa: A002 (the CLI's --all)
           **options: Any) -> Advice:
    """The changes that make a step fit, fastest first: ``jaxmem advise`` from Python.

    Args:
        model: as for :func:`analyze`; a ``Workload`` or a function compiles in this process.
        all: search even when the step fits as given (the CLI's ``--all``).
        changes: the kinds of change to try, a list from ``fraction``, ``precision``, ``attention``,
            ``loss``, ``remat``, ``accum``, ``layout``, ``base``, ``moments``, ``offload``, ``lora``,
            ``hsdp``, ``context``, ``expert``, ``pipeline``, ``devices`` (default: all).
        jobs: worker processes compiling candidates (default: all cores; ``1``: this process).
        **options: the step as given, as for :func:`analyze`; it needs a GPU target (``gpu=``).

    Returns:
        The ``Advice`` the CLI prints: ``original`` (the step as given), ``candidates`` (every
        compiled change, the fitting ones first, fastest estimated step first), ``fitting``;
        ``to_json()`` is what ``jaxmem advise --json`` prints, and a table in Jupyter.

    Raises:
        jaxmem.UserError: an unknown option or a bad value, a CPU target, or a step that does
            not compile as given.

    Example:
        >>> a = jaxmem.advise("models/mlp.py", args={"preset": "tiny"}, gpu="h100", all=True,
        ...                   changes=["precision", "remat"], jobs=1)
        >>> [(c.label, c.fits, c.peak) for c in a.candidates]
    """
    with _session() as cpu_devices:
        base = _options(options, also=("all", "changes", "jobs"))
        n_jobs = None if jobs is None else _checked("jobs", jobs, values.count, 1)
        if not isinstance(all, bool):
            raise UserError(f"all={all!r}: expected True or False")
        precheck.options(model, base)
        cpu_devices(2 * mesh_size(base.mesh))  # a candidate may double the data-parallel devices
        advise_mod = _jax_side().advise
        kinds = advise_mod.CHANGES if changes is None else _list("changes", changes)
        path = _path_or(model)
        if not _is_path(model):  # a Workload does not pickle: its candidates compile here (advise's model=)
            path = source_label(model)   # what the Advice's commands name, as a file's path
        return advise_mod.advise(path, base, always=all, n_jobs=n_jobs, progress=False,
                                 changes=tuple(kinds), model=None if _is_path(model) else model)


def explore(model, *, port: int = 0, jobs: int | None = None, executor: str = "local",
            ray_address: str | None = None, height: int = 900, **options: Any):
    """The what-if page of ``jaxmem explore``, inline in a notebook: ``jaxmem explore`` from Python.

    Args:
        model: a model file's path or a config.json (or its folder); the page's worker processes load it
            by its path, so a ``Workload`` made in this process is refused.
        **options: the starting point, as for :func:`analyze`.
        port: the port on 127.0.0.1 (0: a free one). jobs, executor, ray_address: the worker pool, as
            :func:`compare`'s. height: the inline page's height in pixels.

    Returns:
        The running explorer: in Jupyter its page (an IFrame of the local server); ``url``; ``stop()``.
        The server (a ``jaxmem explore`` child process) stops with the interpreter or the kernel.

    Raises:
        jaxmem.UserError: an unknown option or a bad value (the CLI's message), a model given as an
            object, a server that could not start (its message).

    Example:
        >>> ex = jaxmem.explore("models/mlp.py", args={"preset": "tiny"}, gpu="h100")
        >>> ex.url
    """
    path = explore_client.path_of(model)
    _command_line_args(options.get("args"))
    opts = _options(options)
    port = _checked("port", port, values.count, 0)
    if port > 65535:
        raise UserError(f"port={port}: give a port in 0..65535 (0: a free one)")
    n_jobs = None if jobs is None else _checked("jobs", jobs, values.whole, 1, "the number of worker processes")
    executor = _checked("executor", executor, values.choice, ("local", "ray"), hint=False)
    height = _checked("height", height, values.count, 100)
    precheck.options(path, opts)   # the CLI's own checks, before the server starts
    with _session() as cpu_devices:   # and analyze's refusals of the starting point (the server's own, at start)
        cpu_devices(mesh_size(opts.mesh) if opts.on_cpu else 0)
        _jax_side().explore.admit(path, opts)
    return explore_client.start(path, opts, port=port, jobs=n_jobs, executor=executor, ray_address=ray_address,
                          height=height)


# ------------------------------------------------------------------------------------ the options

def _options(given: dict[str, Any], also: tuple[str, ...] = ()):
    """AnalyzeOptions from the API's keywords; `also`: the calling function's own keywords (named
    when one is misspelt)."""
    fields = {f.name: f for f in dataclasses.fields(AnalyzeOptions)}
    kw: dict[str, Any] = {}
    for key, value in given.items():
        name = ALIASES.get(key, key)
        if name not in fields:
            raise _unknown(key, sorted((set(fields) - set(ALIASES.values())) | set(ALIASES) | set(also)))
        if name in kw:
            raise UserError(f"{key}= and {name}= are the same option; give one of them")
        kw[name] = _value(key, name, value, fields[name])
    return AnalyzeOptions(**kw)


def _unknown(key: str, valid: list[str]) -> UserError:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return UserError(f"unknown option {key!r}{hint}. Valid options: {', '.join(valid)}.")


def _value(key: str, name: str, value: Any, field: Any) -> Any:
    """One option's value, checked and converted as the CLI's option of that name does it."""
    if name == "model_args":
        return _model_args(key, value)
    default = field.default
    if value is None:
        if default is None:
            return None
        raise UserError(f"{key}=None: leave it out for the default ({default!r})")
    if isinstance(default, bool):  # the CLI's on/off flags (--no-donate, --no-explain, --no-cache)
        if not isinstance(value, bool):
            raise UserError(f"{key}={value!r}: expected True or False")
        return value
    flag = field.metadata.get("flag")
    return value if flag is None else _checked(key, value, values.of_flag, flag)


def _model_args(key: str, value: Any) -> tuple[tuple[str, Any], ...]:
    """args={"preset": "tiny"} (or pairs): the workload's own keyword arguments, values as given
    (load_workload checks them against its signature)."""
    try:
        pairs = tuple(value.items()) if hasattr(value, "items") else tuple((k, v) for k, v in value)
    except (TypeError, ValueError):
        raise UserError(f"{key}={value!r}: expected a dict of the workload's arguments, e.g. "
                        f"{key}={{'preset': 'tiny'}}") from None
    for k, _ in pairs:
        if not isinstance(k, str) or not k.isidentifier():
            raise UserError(f"{key}: {k!r} is not an argument name")
    return tuple((k, _plain_number(v)) for k, v in pairs)


def _command_line_args(args: Any) -> None:
    """explore()'s args: a dict whose values a command line can carry (its server is `jaxmem explore --arg ...`
    in a child process); an object would reach the workload as its text."""
    if args is None:
        return
    if not isinstance(args, Mapping):
        raise UserError(f"args={args!r:.80}: expected a dict of the workload's arguments, e.g. args={{'preset': "
                        "'tiny'}}")
    for k, v in args.items():
        if not (v is None or isinstance(v, (str, bool, int, float)) or type(v).__module__ == "numpy"):
            raise UserError(f"args[{k!r}]={v!r:.80}: the explorer's workers get the arguments as --arg text; give a "
                            "str, int, float, bool or None")


def _plain_number(value: Any) -> Any:
    """A numpy integer or float as the Python int or float it is (np.int64(128) is 128 to a workload, as
    --arg 128 is); bools and everything else as given."""
    if isinstance(value, (bool, int, float)) or type(value).__module__ != "numpy":
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value) if isinstance(value, numbers.Real) else value


def _checked(key: str, value: Any, rule, *args, **kwargs) -> Any:
    """`value` through `rule` (jaxmem.program.values: the CLI's option's rule and words) as `key`=."""
    try:
        return rule(value, *args, **kwargs)
    except values.BadValue as e:
        raise UserError(f"{key}={value!r}: {e.message}") from None


def _find(find_batch: Any, find_seq: Any, find_devices: Any, granule: Any, margin: Any):
    """compare's fit search from its keywords, checked as the CLI checks its --find-* options, before jax loads:
    (kind, arg, granule, margin or None for the default), or None: no search."""
    for key, value in (("find_batch", find_batch), ("find_devices", find_devices)):
        if not isinstance(value, bool):
            raise UserError(f"{key}={value!r}: expected True or False")
    if find_seq is not None and (not isinstance(find_seq, str) or not find_seq.isidentifier()):
        raise UserError(f"find_seq={find_seq!r}: expected the name of the workload argument to search, "
                        "e.g. find_seq='seq_len'")
    finds = [k for k, on in (("batch", find_batch), ("seq", find_seq), ("devices", find_devices)) if on]
    if len(finds) > 1:
        raise UserError("one search at a time: find_batch, find_seq or find_devices")
    if granule is not None:
        if not finds or finds[0] != "seq":
            raise UserError("granule= is the step of find_seq; add find_seq='ARG' or drop granule=")
        granule = _checked("granule", granule, values.whole, 1, "the granule")
    if margin is not None:
        if not finds:
            raise UserError("margin= applies to a fit search; add find_batch=True, find_seq='ARG' or "
                            "find_devices=True, or drop margin=")
        margin = _checked("margin", margin, values.SHARE)
    if not finds:
        return None
    return finds[0], find_seq, granule, margin


def _list(key: str, value: Any) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(";" if key in ("meshes", "pairs") else ",")]
    try:
        if key == "pairs":   # ("dp", "data=8") or "dp:data=8"
            return [":".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v) for v in value]
        return [str(v) for v in value]
    except TypeError:
        raise UserError(f"{key}={value!r}: expected a list, e.g. {key}=[...]") from None


def _grid_text(key: str, value: Any) -> str | None:
    """A grid axis as the CLI's comma-separated text (';' between meshes), checked by its option."""
    if value is None:
        return None
    text = (";" if key in ("meshes", "pairs") else ",").join(_list(key, value))
    if key == "rules_files":   # the CLI's --rules A.json,B.json; each file is read (and checked) by compare
        return text
    return _checked(key, text, values.grid, GRID[key])   # each list checked as the CLI checks it


# ------------------------------------------------------------------------------------ the run

def _is_path(model) -> bool:
    return isinstance(model, (str, os.PathLike))


def _path_or(model):
    """A model file's path as text; a Workload or a function as it is (run in this process)."""
    return os.fspath(model) if _is_path(model) else model


@contextlib.contextmanager
def _session():
    """What the CLI does around a command (jaxmem.cli._run), for a caller that stays alive: the
    memory variables checked, one scratch directory removed after, and what the body passes to the
    function it is given: the forced CPU devices to ask for before jax starts (no-op after).

    The whole call runs in the scope, imports and option checks included, so that a ^C anywhere
    in it is the caller's KeyboardInterrupt, after the clean-up: never a Report (a signal that
    landed where Python ignores it, or that code on its way swallowed, is raised at the scope's
    end), and never the error that an interrupted import or plugin made up (a "cannot build a
    deviceless topology" that was really the ^C) -- without ending the process mid-compile.
    (jaxmem.session: the environment first; the body then loads the jax side, _jax_side.)"""
    from jaxmem import scratch, session  # noqa: PLC0415 - signals and scratch on the first call, not at `import jaxmem`

    try:
        with session.scope(end_stuck=False):
            yield lambda n: session.prepare(cpu_devices=max(n, HOST_DEVICES))
    except KeyboardInterrupt:
        raise
    except BaseException:
        signum = scratch.received()
        if signum is not None:   # what the signal broke on its way out is not the answer
            raise scratch.Interrupted(signum) from None
        raise


def _jax_side():
    """The jax side of the calls (jaxmem.commands, which also registers how results render in Jupyter),
    once the options are checked and the environment set: the one place the API imports jax."""
    from jaxmem import commands  # noqa: PLC0415 - jax loads here, after the environment (jaxmem.session)

    return commands
