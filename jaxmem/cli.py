"""The `jaxmem` command line. Click wiring only: the work lives in the modules."""

from __future__ import annotations

import errno
import functools
import json
import sys

import click

from jaxmem.errors import UserError
from jaxmem.program.workload import REMAT_POLICIES

EXIT_FITS, EXIT_BUG, EXIT_USER_ERROR, EXIT_DOES_NOT_FIT = 0, 1, 2, 3
# write errors on stdout (a full device, a closed pipe, a quota): the user's environment, not a jaxmem bug
_OUTPUT_ERRNOS = tuple(getattr(errno, n) for n in ("ENOSPC", "EPIPE", "EDQUOT", "EFBIG", "EIO") if hasattr(errno, n))


def _parse_arg(text: str):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"{text!r}: expected KEY=VALUE")
    for conv in (int, float):
        try:
            return key, conv(value)
        except ValueError:
            pass
    return key, {"true": True, "false": False, "none": None}.get(value.lower(), value)


class _WholeNumber(click.ParamType):
    """An integer in [min, 2^63 - 1]; '1e20' or '8.5' get a message that says what to write."""

    name = "integer"

    def __init__(self, minimum: int, what: str):
        self.minimum, self.what = minimum, what

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            text = str(value).strip().replace("_", "")
            try:
                n = int(text)
            except ValueError:
                self.fail(f"{value!r} is not a whole number; give {self.what} in digits, e.g. 1024", param, ctx)
        if n < self.minimum:
            self.fail(f"{n} is not allowed: {self.what} must be at least {self.minimum}", param, ctx)
        if n > 2**63 - 1:
            self.fail(f"{n} is beyond a 64-bit integer; no device can hold {self.what} that large", param, ctx)
        return n


class _Fraction(click.ParamType):
    """A share of device memory: a finite number in (0, 1]."""

    name = "fraction"

    def convert(self, value, param, ctx):
        import math

        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number; give a share of the card in (0, 1], e.g. 0.9", param, ctx)
        if not math.isfinite(x) or not 0 < x <= 1:
            self.fail(f"{value} is not in (0, 1]; give a share of the card, e.g. 0.9", param, ctx)
        return x


class _Seconds(click.ParamType):
    name = "seconds"

    def convert(self, value, param, ctx):
        import math

        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(x) or x <= 0:
            self.fail(f"{value}: give a positive, finite number of seconds, e.g. 600", param, ctx)
        return x


def _grid(kind: str):
    """A click callback checking one of compare's comma-separated lists before any compile: a bad
    value is the user's typo (exit 2 naming the option), not a row error or a row that "fits"."""

    def check(ctx, param, value):
        if value is None:
            return value
        name = param.opts[0]
        sep = ";" if kind == "mesh" else ","
        items = [v.strip() for v in value.split(sep)]
        if not any(items) or (kind != "mesh" and not all(items)):
            raise click.BadParameter(f"{value!r}: expected {kind} values separated by '{sep}'", ctx, param)
        for v in filter(None, items):
            try:
                _check_grid_value(kind, v)
            except (UserError, ValueError) as e:
                raise click.BadParameter(f"{v!r} in {value!r}: {e}", ctx, param) from None
        return value

    return check


def _check_grid_value(kind: str, v: str) -> None:
    if kind == "batch":
        if not v.isdigit() or int(v) < 1:
            raise ValueError("a global batch is a whole number of at least 1")
    elif kind == "layout":
        from jaxmem.program.layouts import LAYOUTS

        if v not in LAYOUTS:
            raise ValueError(f"unknown layout; known: {', '.join(LAYOUTS)}")
    elif kind == "remat" and v not in REMAT_POLICIES:
        raise ValueError(f"unknown remat policy; known: {', '.join(REMAT_POLICIES)}")
    elif kind == "precision":
        from jaxmem.program.state import PRECISIONS

        if v not in PRECISIONS:
            raise ValueError(f"unknown precision; known: {', '.join(PRECISIONS)}")
    elif kind == "optimizer":
        from jaxmem.program.state import OPTIMIZERS

        if v not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer; known: {', '.join(OPTIMIZERS)}")
    elif kind == "mesh":
        from jaxmem.program.layouts import parse_mesh

        parse_mesh(v)
    elif kind == "gpu":
        from jaxmem.compiler.targets import resolve_gpu_name

        resolve_gpu_name(v)


def step_options(f=None, *, model_file_required: bool = True):
    """Options shared by every command that builds a training step."""
    if f is None:  # @step_options(model_file_required=False)
        return lambda g: step_options(g, model_file_required=model_file_required)
    decorators = [
        click.argument("model_file", type=click.Path(dir_okay=False), required=model_file_required),
        click.option("--gpu", default=None, help="Target GPU: a catalogue name (jaxmem gpus), 'local' or 'cpu'. "
                     "Default: the attached GPU, else h100."),
        click.option("--mesh", default="data=1", show_default=True, help="Device mesh, AXIS=N[,AXIS=N]. "
                     "An axis named model/tensor/tp is the tensor-parallel axis; the others are data axes."),
        click.option("--hosts", type=click.IntRange(min=1), default=None, help="Hosts the devices are spread over (default: 8 GPUs per host)."),
        click.option("--layout", type=click.Choice(["dp", "fsdp", "tp", "fsdp_tp"]), default="fsdp", show_default=True),
        click.option("--batch", type=_WholeNumber(1, "the global batch"), default=None, help="Global batch size (overrides the model's)."),
        click.option("--optimizer", default=None, help="sgd, momentum, adam, adamw, adafactor, lion (default: the workload's, else adamw)."),
        click.option("--precision", type=click.Choice(["fp32", "bf16", "bf16-pure"]), default="fp32", show_default=True,
                     help="bf16: bf16 compute, fp32 params and optimizer state; bf16-pure: everything bf16."),
        click.option("--remat", type=click.Choice(REMAT_POLICIES), default="none", show_default=True),
        click.option("--accum", type=click.IntRange(min=1), default=1, show_default=True, help="Gradient-accumulation microbatches."),
        click.option("--no-donate", "no_donate", is_flag=True, help="Do not donate the train state (shows the cost)."),
        click.option("--freeze", default=None, metavar="REGEX", help="Freeze the parameters whose path matches "
                     "(as the report prints it, e.g. 'embed|layers/.*attn'): no gradients, no optimizer state."),
        click.option("--lora", "lora_rank", type=click.IntRange(min=0), default=0, metavar="RANK",
                     help="LoRA adapters of this rank (qwix) on the dense/einsum/conv weights; the base is frozen."),
        click.option("--lora-targets", default=None, metavar="REGEX", help="With --lora: the module paths that take "
                     "adapters, e.g. 'attn|mlp' (default: every dense/einsum/conv layer)."),
        click.option("--lora-alpha", type=float, default=None, help="With --lora: the scale alpha (default: the rank)."),
        click.option("--base-dtype", type=click.Choice(["bf16", "int8", "int4", "nf4"]), default=None,
                     help="With --lora: the frozen base's storage; int8/int4/nf4 quantized by qwix (QLoRA)."),
        click.option("--offload", default=None, metavar="optimizer",
                     help="Keep the optimizer state in pinned host memory between steps (JAX memory kinds)."),
        click.option("--arg", "model_args", multiple=True, metavar="KEY=VALUE",
                     help="Keyword argument for the model file's workload(), e.g. --arg preset=8b. Repeatable."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables."),
    ]
    return functools.reduce(lambda acc, d: d(acc), reversed(decorators), f)


def _run(fn):
    """The one top-level handler of every command.

    User errors: one message, exit 2, no traceback. A signal: temporary files removed,
    exit 128 + signal. Anything else is a jaxmem bug: one line saying so and how to report
    it, exit 1 (JAXMEM_DEBUG=1 shows the traceback). Never 0 or 3 without a verdict.
    """
    import contextlib
    import os

    from jaxmem import scratch
    from jaxmem.errors import HOW_TO_REPORT, bug_summary

    code, scoped = EXIT_BUG, False
    try:
        from jaxmem import env

        env.check()  # before jax starts: its GPU plugin would fail on these with a traceback
        with scratch.run_scope():
            scoped = True
            try:
                fn()
                code = EXIT_FITS
            except SystemExit as e:  # the command's own verdict (model files' exits are caught at the source)
                if isinstance(e.__context__, OSError):  # rich exits so when stdout's reader is gone: say so
                    raise e.__context__ from None
                code = e.code if isinstance(e.code, int) else EXIT_BUG
        _flush_stdout()
    except UserError as e:
        if not (scoped and scratch.received()):  # what a signal broke on its way out is not the user's error
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
    sys.exit(code)


def _check_writable(option: str, path: str) -> None:
    """A side output's directory (or the nearest one that exists: the writer creates the rest) is writable."""
    import os

    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UserError(f"{option} {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: the directory {parent} is not writable; give a path you can write")


def _write_side_outputs(report, html_path: str | None, png_path: str | None) -> None:
    """After the analysis is printed: a side output failing never loses it (exit 2 with its error)."""
    from jaxmem.present import html

    for option, path, write in (("--html", html_path, html.write), ("--png", png_path, html.write_png)):
        if path:
            try:
                write(report, path)
            except Exception as e:  # noqa: BLE001 - any failure of a side output is reported the same way
                reason = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
                raise UserError(f"{option} {path}: not written ({reason}); the analysis above is complete") from None


def _flush_stdout() -> None:
    """Output errors (a full disk, a closed pipe) surface here, not at interpreter exit."""
    sys.stdout.flush()


def _silence_stdout() -> None:
    # After a failed write, the interpreter's own flush at exit would fail again, with a traceback.
    import os

    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass


def _prepare(mesh: str, gpu: str | None = None, *, cpu_default: bool = False) -> None:
    """Before jax starts: a CPU mesh needs forced host devices -- only when the target may be the
    CPU (--gpu cpu, or verify's default without a GPU): a deviceless GPU mesh needs none, and
    10,000 forced host devices alone took a minute to start."""
    from jaxmem.program import layouts, sizes
    from jaxmem.compiler import targets

    n = max(layouts.parse_mesh(mesh).size, 1)
    on_cpu = (gpu or "").strip().lower() == "cpu" or (gpu is None and cpu_default)
    sizes.check_mesh_devices(n, cpu=on_cpu)
    if on_cpu:
        targets.ensure_host_devices(n)


def _options(kw: dict, **extra):
    from jaxmem.analyze import AnalyzeOptions

    return AnalyzeOptions(gpu=kw["gpu"], mesh=kw["mesh"], layout=kw["layout"], hosts=kw["hosts"],
                          precision=kw["precision"], optimizer=kw["optimizer"], batch=kw["batch"], accum=kw["accum"],
                          remat=kw["remat"], donate=not kw["no_donate"],
                          model_args=tuple(_parse_arg(a) for a in kw["model_args"]),
                          freeze=kw["freeze"], lora_rank=kw["lora_rank"], lora_targets=kw["lora_targets"],
                          lora_alpha=kw["lora_alpha"], base_dtype=kw["base_dtype"], offload=kw["offload"], **extra)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jaxmem")
def main():
    """Per-device GPU memory of a Flax training step, from XLA itself.

    jaxmem lowers your real jitted training step (forward, backward, optax
    update, donated state) for the GPU and mesh you plan to use -- no GPU
    needed -- and tells you the per-device peak, where it goes, and whether it fits.
    """


@main.command()
@step_options
@click.option("--mem-fraction", type=_Fraction(), default=None,
              help="Share of the card JAX may use (default: from XLA_CLIENT_MEM_FRACTION, else 0.75).")
@click.option("--top", type=click.IntRange(min=0), default=10, show_default=True, help="Largest buffers live at the peak to list.")
@click.option("--depth", type=click.IntRange(min=1), default=3, show_default=True, help="Module-path depth of the per-module roll-up.")
@click.option("--no-explain", is_flag=True, help="Skip decoding XLA's buffer assignment (faster; no top buffers).")
@click.option("--no-cache", is_flag=True, help="Compile again instead of answering from the compile cache.")
@click.option("--timings", "with_timings", is_flag=True, help="With --json: include this run's timings (they "
              "differ run to run; without them a cached answer's JSON equals a fresh one's byte for byte).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None, help="Write a self-contained HTML report.")
@click.option("--png", "png_path", type=click.Path(dir_okay=False), default=None, help="Write the memory curve as a PNG.")
def analyze(as_json, mem_fraction, top, depth, no_explain, no_cache, with_timings, html_path, png_path, **kw):
    """Predict the per-device peak memory of MODEL_FILE's training step.

    Exit code: 0 when it fits, 3 when it does not, 2 on a user error.

    \b
    Example:
      jaxmem analyze models/llama.py --arg preset=8b --gpu h100 --mesh data=8 --layout fsdp
      jaxmem analyze models/gpt2.py --gpu a100-80g --mesh data=4,model=2 --layout fsdp_tp --json
    """

    def go():
        for option, path in (("--html", html_path), ("--png", png_path)):
            if path:
                _check_writable(option, path)  # before jax starts, let alone the compile
        _prepare(kw["mesh"], kw["gpu"])
        from jaxmem.analyze import analyze_file

        opts = _options(kw, mem_fraction=mem_fraction, top=top, module_depth=depth,
                        explain=not no_explain or bool(html_path or png_path), cache=not no_cache)
        report = analyze_file(kw["model_file"], opts)
        if as_json:
            click.echo(json.dumps(report.to_json(timings=with_timings), indent=2))
        else:
            from jaxmem.present.render import render

            render(report)
        _write_side_outputs(report, html_path, png_path)
        if report.fits is False:  # where to go next: the same step, the changes that make it fit
            from jaxmem.analyze import command_line

            click.echo(f"does not fit: `{command_line(kw['model_file'], opts, 'advise')}` compiles the changes "
                       "that make it fit, ranked by estimated step time", err=as_json)
        sys.exit(EXIT_DOES_NOT_FIT if report.fits is False else EXIT_FITS)

    _run(go)


@main.command()
@step_options(model_file_required=False)
@click.option("--layouts", default=None, callback=_grid("layout"), help="Layouts to compare, e.g. dp,fsdp,tp,fsdp_tp.")
@click.option("--remats", default=None, callback=_grid("remat"), help="Remat policies to compare, e.g. none,full,dots_saveable.")
@click.option("--precisions", default=None, callback=_grid("precision"), help="Precisions to compare, e.g. fp32,bf16,bf16-pure.")
@click.option("--batches", default=None, callback=_grid("batch"), help="Global batch sizes to compare, e.g. 8,16,32.")
@click.option("--optimizers", default=None, callback=_grid("optimizer"), help="Optimizers to compare, e.g. adamw,adafactor.")
@click.option("--meshes", default=None, callback=_grid("mesh"), help="Meshes to compare, separated by ';', e.g. 'data=8;data=4,model=2'.")
@click.option("--gpus", "gpu_list", default=None, callback=_grid("gpu"), help="GPUs to compare, e.g. a100-80g,h100,h200.")
@click.option("--loras", default=None, help="LoRA ranks to compare, e.g. 0,8,64 (0: every parameter trains).")
@click.option("--base-dtypes", default=None, help="Frozen-base storage to compare under LoRA, e.g. bf16,nf4 "
              "(none: the precision's; rows without LoRA keep it).")
@click.option("--mem-fraction", type=_Fraction(), default=None, help="As for analyze.")
@click.option("--find-batch", is_flag=True, help="Find, per row, the largest global batch that fits (a multiple of "
              "the data-parallel devices x --accum).")
@click.option("--find-seq", "find_seq", metavar="ARG", default=None, help="Find, per row, the largest value of the "
              "workload argument ARG (e.g. seq_len) that fits, in steps of --granule.")
@click.option("--find-devices", is_flag=True, help="Find, per row, the smallest data-parallel size (the mesh's first "
              "data axis) that fits the global --batch.")
@click.option("--granule", type=_WholeNumber(1, "the granule"), default=None,
              help="--find-seq: the step between the values tried (default 1; e.g. 128).")
@click.option("--margin", type=float, default=None, help="Share of usable memory every fit answer keeps free "
              "(default 0.05: about twice the largest error measured against real runs).")
@click.option("--jobs", "n_jobs", type=_WholeNumber(1, "the number of worker processes"), default=None,
              help="Worker processes compiling rows in parallel (default: all cores).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: worker processes on this machine; ray: tasks on a Ray cluster.")
@click.option("--ray-address", default=None, help="The Ray cluster (default: RAY_ADDRESS; without either, a local "
              "Ray is started for the sweep).")
@click.option("--no-cache", is_flag=True, help="Compile every row again instead of answering from the compile cache.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the rows to FILE.json (re-render it with --from) or FILE.csv.")
@click.option("--from", "from_path", type=click.Path(dir_okay=False), default=None,
              help="Re-render rows saved with --out FILE.json (or --json), without compiling.")
def compare(as_json, layouts, remats, precisions, batches, optimizers, meshes, gpu_list, loras, base_dtypes,
            mem_fraction, find_batch,
            find_seq, find_devices, granule, margin, n_jobs, executor, ray_address, no_cache, out_path, from_path, **kw):
    """Analyze a grid of layouts / remat / precisions / batch sizes side by side.

    Every combination of the comma-separated lists is one row, compiled in
    worker processes (--jobs) and answered from the compile cache when it can
    be; rows print as they finish, then sorted by per-device peak. Each row
    splits memory exactly as `jaxmem analyze` does. With --find-batch,
    --find-seq ARG or --find-devices, each row is a fit search: a few compiles
    fit memory's curve, jump to the boundary and prove it (the answer fits,
    one step further does not). Exit code: 0 when at least one row fits, 3 when
    none does, 2 on a user error.

    \b
    Example:
      jaxmem compare models/llama.py --arg preset=8b --mesh data=8 --layouts dp,fsdp --remats none,full
      jaxmem compare models/gpt2.py --batches 8,16,32 --precisions fp32,bf16 --json --out rows.json
      jaxmem compare --from rows.json
      jaxmem compare models/llama.py --arg preset=1b --mesh data=8 --remats none,full --find-batch
      jaxmem compare models/gpt2.py --arg preset=gpt2-medium --mesh data=8 --find-seq seq_len --granule 128
    """

    def go():
        from jaxmem.plan import compare as compare_mod

        if out_path and not out_path.lower().endswith((".json", ".csv")):
            raise UserError(f"--out {out_path}: write FILE.json (re-renderable with --from) or FILE.csv")
        finds = [k for k, on in (("batch", find_batch), ("seq", find_seq), ("devices", find_devices)) if on]
        if len(finds) > 1:
            raise UserError("one search at a time: --find-batch, --find-seq or --find-devices")
        if from_path:
            cells = compare_mod.load(from_path, on_note=lambda line: click.echo(line, err=True))
        else:
            if not kw["model_file"]:
                raise UserError("compare needs MODEL_FILE (or --from FILE.json to re-render saved rows)")
            from jaxmem.program import layouts as layouts_mod
            from jaxmem.plan import sweep
            from jaxmem.plan.search import DEFAULT_MARGIN

            if margin is not None and not 0 <= margin < 1:
                raise UserError(f"--margin {margin}: the share of usable memory kept free must be in [0, 1)")
            if granule is not None and not find_seq:
                raise UserError("--granule is the step of --find-seq; add --find-seq ARG or drop --granule")
            spec = {"layout": layouts, "remat": remats, "precision": precisions, "batch": batches,
                    "optimizer": optimizers, "mesh": meshes, "gpu": gpu_list, "lora_rank": loras,
                    "base_dtype": base_dtypes}
            mesh_texts = [m for m in (meshes or kw["mesh"]).split(";") if m.strip()]
            sweep.prepare_environment(max(layouts_mod.parse_mesh(m).size for m in mesh_texts))
            find = None if not finds else compare_mod.Find(
                finds[0], arg=find_seq, granule=granule, margin=DEFAULT_MARGIN if margin is None else margin)

            def on_row(c):
                if not as_json:
                    click.echo(compare_mod.row_line(c))

            cells = compare_mod.compare(kw["model_file"], _options(kw, mem_fraction=mem_fraction, cache=not no_cache),
                                        spec, find=find, n_jobs=n_jobs, executor=executor, ray_address=ray_address,
                                        on_row=on_row)
        if out_path:
            compare_mod.save(cells, out_path)
        if as_json:
            click.echo(json.dumps(compare_mod.to_json(cells), indent=2))
        else:
            from jaxmem.present.render import render_comparison

            render_comparison(cells)
        ok = [c for c in cells if c.report is not None]
        sys.exit(EXIT_DOES_NOT_FIT if ok and all(c.report.fits is False for c in ok) else EXIT_FITS)

    _run(go)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--require-gpu", is_flag=True, help="Fail (instead of warn) when this machine has no NVIDIA GPU.")
@click.option("--no-smoke", is_flag=True, help="Skip the tiny forward/backward step on the GPU.")
@click.option("--no-compile", is_flag=True, help="Skip the deviceless compile for each catalogue GPU.")
def doctor(as_json, require_gpu, no_smoke, no_compile):
    """Check this machine's GPU stack for JAX: driver and GPUs, versions, a smoke step, memory settings.

    Each check passes, warns or fails with the fix: the NVIDIA driver and GPUs
    (NVML, nvidia-smi); jax / jaxlib / CUDA plugin / CUDA runtime / cuDNN / cuBLAS
    / NCCL versions, as the CUDA plugin itself checks them; a tiny Flax step on the
    GPU that must really run there (no silent CPU fall-back); the memory settings in
    force and what they mean for nvidia-smi; the calibration file; and a tiny
    deviceless compile for every catalogue GPU (what analyze does, GPU or not). Without a GPU: says so (a
    warning) and proves analyze works. Exit code: 0 when no check fails, 3 when one
    fails, 2 on a user error.

    \b
    Example:
      jaxmem doctor
      jaxmem doctor --require-gpu --json
    """

    def go():
        from jaxmem.truth import doctor as doctor_mod

        d = doctor_mod.diagnose(require_gpu=require_gpu, smoke=not no_smoke, deviceless=not no_compile)
        if as_json:
            click.echo(json.dumps(d.to_json(), indent=2))
        else:
            for line in doctor_mod.render_lines(d):
                click.echo(line)
        sys.exit(d.exit_code)

    _run(go)


@main.command()
@step_options
@click.option("--mem-fraction", type=_Fraction(), default=None, help="As for analyze.")
@click.option("--all", "always", is_flag=True, help="Search even when the step fits as given (faster or roomier settings).")
@click.option("--jobs", "n_jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes compiling candidates (default: all cores; 1: in this process).")
@click.option("--changes", "change_kinds", default="layout,precision,remat,accum,devices,offload,lora", show_default=True,
              help="The kinds of change to try, comma-separated.")
def advise(as_json, mem_fraction, always, n_jobs, change_kinds, **kw):
    """When MODEL_FILE's step does not fit: the changes that make it fit, fastest first.

    Compiles the changes users make -- more state sharding (dp -> fsdp -> fsdp_tp), bf16
    compute, remat from the least recompute to full, gradient accumulation keeping the global
    batch, twice the devices -- and their combinations predicted to fit; prints the ones that
    fit, ranked by estimated step time (ties by headroom), each with its peak, headroom, step
    time relative to the step as given, and the `jaxmem analyze` command that reproduces it.
    Fine-tuning changes are tried too: the optimizer state offloaded to host memory, and LoRA /
    QLoRA (rank 16; these train adapters instead of every weight, and say so).
    Exit code: 0 when one fits (or the step fits as given), 3 when none does, 2 on a user error.

    \b
    Example:
      jaxmem advise models/llama.py --arg preset=8b --arg seq_len=4096 --batch 64 --gpu rtx-a6000 --mesh data=8 --layout dp
      jaxmem advise models/gpt2.py --gpu a100-80g --mesh data=4 --all --json
    """

    def go():
        from jaxmem.plan import sweep

        _prepare(kw["mesh"], kw["gpu"])
        # workers inherit the environment; the largest candidate mesh has twice the devices
        from jaxmem.program import layouts as layouts_mod

        sweep.prepare_environment(2 * layouts_mod.parse_mesh(kw["mesh"]).size)
        from jaxmem.plan.advise import advise as run_advise

        result = run_advise(kw["model_file"], _options(kw, mem_fraction=mem_fraction, explain=False),
                            always=always, n_jobs=n_jobs, progress=not as_json,
                            changes=tuple(c.strip() for c in change_kinds.split(",") if c.strip()))
        if as_json:
            click.echo(json.dumps(result.to_json(), indent=2))
        else:
            from jaxmem.present.render import render_advice

            render_advice(result)
        ok = result.fitting or (result.original.fits and not result.searched)
        sys.exit(EXIT_FITS if ok else EXIT_DOES_NOT_FIT)

    _run(go)


@main.command("cache")
@click.option("--clear", is_flag=True, help="Remove every entry (and partial write) of the compile cache.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def cache_command(clear, as_json):
    """Where the compile cache is ($JAXMEM_CACHE, else ~/.cache/jaxmem), its entries and their size.

    \b
    Example:
      jaxmem cache
      jaxmem cache --clear
    """

    def go():
        from jaxmem.compiler import cache

        d = cache.clear() if clear else cache.info()
        if as_json:
            click.echo(json.dumps(d, indent=2))
            return
        from jaxmem.present.render import fmt_bytes

        if clear:
            click.echo(f"removed {d['removed']} file(s) from {d['path']}")
        click.echo(f"{d['path']}: {d['entries']} entries, {fmt_bytes(d['bytes'])}"
                   + (f", {d['partial_writes']} partial write(s) left by killed writers" if d["partial_writes"] else ""))

    _run(go)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def gpus(as_json):
    """List the GPU catalogue jaxmem compiles for devicelessly.

    \b
    Example:
      jaxmem gpus
    """
    from jaxmem.present.render import fmt_bytes
    from jaxmem.compiler.targets import CATALOGUE, DEFAULT_GPU

    import dataclasses

    from jaxmem.compiler.targets import performance

    def perf(key):  # the published peak rates the step-time estimate uses, each with its source
        p = performance(key)
        return None if p is None else {**dataclasses.asdict(p), "sources": [{"fields": f, "source": src}
                                                                          for f, src in p.sources]}

    rows = [{"name": s.key, "description": s.description, "memory_bytes": s.memory_bytes,
             "compute_capability": ".".join(map(str, s.compute_capability)), "aliases": list(s.aliases),
             "default": s.key == DEFAULT_GPU, "performance": perf(s.key)} for s in CATALOGUE.values()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="GPU targets (compiled for devicelessly)", title_justify="left")
    for col in ("name", "device", "memory", "compute capability", "aliases"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"] + (" (default)" if r["default"] else ""), r["description"], fmt_bytes(r["memory_bytes"]),
                  r["compute_capability"], ", ".join(r["aliases"]))
    Console().print(t)
    click.echo("Also: --gpu local (the attached GPU), --gpu cpu (the CPU backend).")


@main.command()
@step_options
@click.option("--timeout", type=_Seconds(), default=600, show_default=True, help="Seconds the measuring process may run.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="Also write an HTML report (on a GPU: NVML's trace of the card while the step ran).")
def verify(as_json, timeout, html_path, **kw):
    """Run MODEL_FILE's step on this machine and compare analyze's prediction with the measured peak.

    The prediction is analyze's for the local backend (--gpu cpu, or the attached
    GPU); the step then runs once on random data in a fresh process. CPU: peak RSS
    (reset through /proc/self/clear_refs), a mesh through forced host devices.
    GPU: the allocator's peak_bytes_in_use. Without --gpu: the attached GPU,
    else the CPU. Exit code: 0 when measured, 2 on a user error or when this
    machine cannot hold the case.

    \b
    Example:
      jaxmem verify models/mlp.py --arg preset=base --gpu cpu
      jaxmem verify models/gpt2.py --arg preset=tiny --arg batch_size=8 --mesh data=8 --layout fsdp --json
    """

    def go():
        from jaxmem.truth import verify as verify_mod

        if html_path:
            _check_writable("--html", html_path)  # before the measurement, not after
        verify_mod.gpu_env_for_parent()
        _prepare(kw["mesh"], kw["gpu"], cpu_default=True)
        result = verify_mod.verify_file(kw["model_file"], _options(kw, explain=False), timeout=timeout)

        def side_outputs():  # after the result is printed: a failed side output never loses it
            if html_path:
                from jaxmem.present import verify_html

                try:
                    verify_html.write(result, html_path)
                except Exception as e:  # noqa: BLE001 - any failure of a side output is reported the same way
                    reason = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
                    raise UserError(f"--html {html_path}: not written ({reason}); the result above is complete") from None

        if as_json:
            click.echo(json.dumps(result.to_json(), indent=2))
            side_outputs()
            return
        from jaxmem.present.render import fmt_bytes

        m = result.method
        click.echo(f"{result.report.model} on {m['devices']} x {m['device']} ({m['backend']}), "
                   f"mesh {kw['mesh']}, layout {kw['layout']}")
        click.echo(f"{'device':>6}  {'predicted':>12}  {'measured':>12}  {'error':>8}")
        for d in result.per_device:
            click.echo(f"{d['device']:>6}  {fmt_bytes(d['predicted_peak_bytes']):>12}  "
                       f"{fmt_bytes(d['measured_peak_bytes']):>12}  {d['relative_error']:>+8.2%}")
        click.echo(f"peak: predicted {fmt_bytes(result.predicted_peak_bytes)}, measured "
                   f"{fmt_bytes(result.measured_peak_bytes)}, error {result.relative_error:+.2%}")
        click.echo(f"method: {m['description']}")
        if m["backend"] == "cpu":
            click.echo(f"  baseline RSS {fmt_bytes(m['baseline_bytes'])}, step added {fmt_bytes(m['step_extra_bytes'])} "
                       f"for all {m['devices']} device(s); {m['split']}")
        click.echo(f"  runtime overhead in the prediction: {fmt_bytes(m['runtime_overhead']['bytes_per_device'])} "
                   f"per device ({m['runtime_overhead']['source']})")
        from jaxmem.truth.monitor import monitor_lines

        for line in monitor_lines(result.monitor):
            click.echo(line)
        for w in result.warnings:
            click.echo(f"warning: {w}")
        side_outputs()

    _run(go)


# verify runs the step here: its default target is this machine's, not the catalogue's.
for _p in verify.params:
    if _p.name == "gpu":
        _p.help = "cpu, or local (the attached GPU). Default: the attached GPU, else the CPU."


@main.command()
@click.option("--gpu", default=None, help="cpu, or local (the attached GPU). Default: the attached GPU, else cpu.")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True, help="Measurements per case (the median is kept).")
@click.option("--dry-run", is_flag=True, help="Measure and print, but do not store.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def calibrate(gpu, repeats, dry_run, as_json):
    """Measure the runtime overhead analyze adds to XLA's numbers, and store it for this device kind.

    Runs a trivial training step (two sizes; on CPU on 1 and 8 host devices) in
    fresh processes and stores measured minus XLA's lower bound, with the machine,
    versions and date, in the calibration file (JAXMEM_CALIBRATION, default
    ~/.config/jaxmem/calibration.json). analyze then uses it for that device kind.

    \b
    Example:
      jaxmem calibrate --gpu cpu
      jaxmem calibrate --gpu local --json
    """

    def go():
        from jaxmem.compiler import targets
        from jaxmem.truth import verify as verify_mod

        verify_mod.gpu_env_for_parent()
        if (gpu or "").lower() == "cpu":
            targets.ensure_host_devices(1)
        cal = verify_mod.calibrate(gpu, repeats=repeats, save=not dry_run)
        if as_json:
            click.echo(json.dumps(cal.to_json(), indent=2))
            return
        from jaxmem.present.render import fmt_bytes

        for r in cal.runs:
            click.echo(f"{r['devices']} device(s), width {r['width']}, batch {r['batch']}: measured "
                       f"{fmt_bytes(r['measured_bytes'])}, XLA {fmt_bytes(r['xla_lower_bound_bytes'])}, "
                       f"excess {fmt_bytes(r['excess_bytes'])}")
        o = cal.overhead
        click.echo(f"{cal.kind}: in-pool {fmt_bytes(o.in_pool_bytes)} per device + {fmt_bytes(o.per_process_bytes)} "
                   f"per process, out-of-pool {fmt_bytes(o.out_of_pool_bytes)} (measured {o.measured_at})")
        if cal.kind != "cpu":
            nccl = "not measured (one GPU): the estimate stays" if o.nccl_communicator_bytes is None else \
                fmt_bytes(o.nccl_communicator_bytes)
            click.echo(f"  runtime terms: allocator {fmt_bytes(o.in_pool_bytes)} in the pool; cuda_context "
                       f"{fmt_bytes(o.out_of_pool_bytes)} outside; one NCCL communicator {nccl}")
        click.echo(f"stored in {cal.path}" if cal.path else "not stored (--dry-run)")

    _run(go)


if __name__ == "__main__":  # pragma: no cover
    main()
