"""The `jaxmem` command line. Click wiring only: the work lives in the modules."""

from __future__ import annotations

import dataclasses
import json
import sys

import click

from jaxmem import cli_params, exits, precheck, session, stdio
from jaxmem.cli_params import NonNegativeNumber, Seconds, Share, WholeNumber, field_option, grid, step_options
from jaxmem.compiler.targets import catalogue_rows
from jaxmem.errors import UserError
from jaxmem.exits import EXIT_DOES_NOT_FIT, EXIT_FITS, EXIT_GREW
from jaxmem.exits import run as _run
from jaxmem.present import outputs
from jaxmem.program.layouts import mesh_size
from jaxmem.program.options import command_line, from_flags, is_cpu_target
from jaxmem.program.sizes import check_mesh_devices


def _prepare(kw: dict, *, cpu_default: bool = False) -> None:
    """Before jax starts: the options' typos (jaxmem.precheck); forced host devices only for a CPU target
    (--gpu cpu, verify's default without a GPU): 10,000 of them alone took a minute to start."""
    precheck.step(kw["model_file"], kw)
    n = max(mesh_size(kw["mesh"]), 1)
    on_cpu = is_cpu_target(kw["gpu"]) or (kw["gpu"] is None and cpu_default)
    check_mesh_devices(n, cpu=on_cpu)
    session.prepare(cpu_devices=n if on_cpu else 0)


def _options(kw: dict, **extra):
    return from_flags(kw, **extra)


def _jax_side():
    """The jax side of the commands (jaxmem.commands): called once a command's options are checked and
    its environment set (jaxmem.session.prepare); the one place the CLI imports jax."""
    from jaxmem import commands  # noqa: PLC0415 - jax loads here, after the environment (jaxmem.session)

    return commands


def _plain_side():
    """The commands that need no jax (jaxmem.plain_commands): cache, diff, gpus."""
    from jaxmem import plain_commands  # noqa: PLC0415 - loaded by the three commands that use it, not by --help

    return plain_commands


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
@cli_params.fields("microbatches", "mem_fraction", "allocator", "top", "module_depth", "explain", "cache")
@click.option("--timings", "with_timings", is_flag=True, help="With --json: include this run's timings (they "
              "differ run to run; without them a cached answer's JSON equals a fresh one's byte for byte).")
@cli_params.side_outputs("Write a self-contained HTML report.", "Write the memory curve as a PNG.")
def analyze(as_json, with_timings, html_path, png_path, **kw):
    """Predict the per-device peak memory of MODEL_FILE's training step.

    MODEL_FILE is a model file (a .py defining workload()), or a Hugging Face config.json (or the
    folder holding it): jaxmem builds the architecture it names (docs/model-files.md).

    Exit code: 0 when it fits, 3 when it does not, 2 on a user error.

    \b
    Example:
      jaxmem analyze models/llama.py --arg preset=8b --gpu h100 --mesh data=8 --layout fsdp
      jaxmem analyze models/gpt2.py --gpu a100-80g --mesh data=4,model=2 --layout fsdp_tp --json
      jaxmem analyze benchmarks/hf_configs/Qwen3-8B.json --gpu 4090 --mesh fsdp=4 --lora 16 --precision bf16
    """

    def go():
        outputs.check_all([("--html", html_path), ("--png", png_path)])  # before jax starts, let alone the compile
        _prepare(kw)
        jx = _jax_side()
        opts = _options(kw)
        if html_path or png_path:   # the page and the curve are drawn from the buffer assignment
            opts = dataclasses.replace(opts, explain=True)
        report = jx.pipeline.analyze_file(kw["model_file"], opts)
        if as_json:
            click.echo(json.dumps(report.to_json(timings=with_timings), indent=2))
        else:
            jx.render.render(report)
        outputs.write(outputs.report_outputs(html_path, png_path), report, "the analysis")
        if report.fits is False:  # where to go next: the same step, the changes that make it fit
            click.echo(f"does not fit: `{command_line(kw['model_file'], opts, 'advise')}` compiles the changes "
                       "that make it fit, ranked by estimated step time", err=as_json)
        sys.exit(EXIT_DOES_NOT_FIT if report.fits is False else EXIT_FITS)

    _run(go)


@main.command()
@step_options(model_file_required=False)
@click.option("--layouts", default=None, callback=grid("layout"), help="Layouts to compare, e.g. dp,fsdp,tp,fsdp_tp.")
@click.option("--remats", default=None, callback=grid("remat"),
              help="Remat policies to compare, e.g. none,full,dots_saveable.")
@click.option("--precisions", default=None, callback=grid("precision"),
              help="Precisions to compare, e.g. fp32,bf16,bf16-pure.")
@click.option("--batches", default=None, callback=grid("batch"), help="Global batch sizes to compare, e.g. 8,16,32.")
@click.option("--optimizers", default=None, callback=grid("optimizer"),
              help="Optimizers to compare, e.g. adamw,adafactor.")
@click.option("--meshes", default=None, callback=grid("mesh"),
              help="Meshes to compare, separated by ';', e.g. 'data=8;data=4,model=2'.")
@click.option("--pair", "pairs", multiple=True, metavar="LAYOUT:MESH", callback=cli_params.pairs_grid,
              help="A layout with the mesh it runs on, e.g. --pair dp:data=8 --pair fsdp_tp:data=4,model=2; "
              "repeat it: each pair is one row (times the other lists), instead of --layouts x --meshes.")
@click.option("--gpus", "gpu_list", default=None, callback=grid("gpu"),
              help="GPUs to compare, e.g. a100-80g,h100,h200.")
@click.option("--loras", default=None, callback=grid("lora_rank"),
              help="LoRA ranks to compare, e.g. 0,8,64 (0: every parameter trains).")
@click.option("--base-dtypes", default=None, callback=grid("base_dtype"),
              help="Frozen-base storage to compare under LoRA, e.g. bf16,nf4 "
              "(none: the precision's; rows without LoRA keep it).")
@cli_params.MICROBATCHES_GRID
@field_option("mem_fraction")
@field_option("allocator")
@click.option("--find-batch", is_flag=True, help="Find, per row, the largest global batch that fits (a multiple of "
              "the data-parallel devices x --accum).")
@click.option("--find-seq", "find_seq", metavar="ARG", default=None, help="Find, per row, the largest value of the "
              "workload argument ARG (e.g. seq_len) that fits, in steps of --granule.")
@click.option("--find-devices", is_flag=True, help="Find, per row, the smallest data-parallel size (the mesh's first "
              "axis that splits the batch: data, fsdp or expert) that fits the global --batch.")
@click.option("--granule", type=WholeNumber(1, "the granule"), default=None,
              help="--find-seq: the step between the values tried (default 1, or the context axis; e.g. 128).")
@click.option("--margin", type=Share(), default=None, help="With a search: the share of usable memory every fit "
              "answer keeps free (default 0.05: about twice the largest error measured against real runs).")
@click.option("--jobs", "n_jobs", type=WholeNumber(1, "the number of worker processes"), default=None,
              help="Worker processes compiling rows in parallel (default: all cores).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: worker processes on this machine; ray: tasks on a Ray cluster.")
@click.option("--ray-address", default=None, help="The Ray cluster (default: RAY_ADDRESS; without either, a local "
              "Ray is started for the sweep).")
@field_option("cache")
@click.option("--yes", is_flag=True, help="Start a grid of more than 200 rows (without it, such a grid says how long "
              "it expects to take, and exits 2).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the rows to FILE.json (re-render it with --from) or FILE.csv.")
@click.option("--from", "from_path", type=click.Path(dir_okay=False), default=None,
              help="Re-render rows saved with --out FILE.json (or --json), without compiling.")
@cli_params.side_outputs("Write the rows as a self-contained HTML page: a stacked bar per row against its usable "
                         "memory, the fit searches' curves.", "Write the same pictures as a PNG.")
def compare(as_json, layouts, remats, precisions, batches, optimizers, meshes, pairs, gpu_list, loras, base_dtypes,
            microbatches_grid, find_batch, find_seq, find_devices, granule, margin, n_jobs, executor, ray_address,
            yes, out_path, from_path, html_path, png_path, **kw):
    """Analyze a grid of layouts / remat / precisions / batch sizes side by side.

    Every combination of the comma-separated lists is one row, compiled in
    worker processes (--jobs) and answered from the compile cache when it can
    be; rows print as they finish, then ranked by throughput per device
    among the rows that fit (tokens/s, or samples/s without a sequence), the
    rest by per-device peak. --pair LAYOUT:MESH gives (layout, mesh) pairs
    instead of every layout on every mesh. Each row
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
        pair_meshes = ";".join(p.partition(":")[2] for p in (pairs or "").split(";") if p.strip()) or None
        precheck.step(kw["model_file"], kw, grid={"mesh": meshes, "pair": pairs, "gpu": gpu_list, "from": from_path})
        if out_path and not out_path.lower().endswith((".json", ".csv")):
            raise UserError(f"--out {out_path}: write FILE.json (re-renderable with --from) or FILE.csv")
        outputs.check_all([("--out", out_path), ("--html", html_path), ("--png", png_path)])  # before any compile
        finds = [k for k, on in (("batch", find_batch), ("seq", find_seq), ("devices", find_devices)) if on]
        if len(finds) > 1:
            raise UserError("one search at a time: --find-batch, --find-seq or --find-devices")
        if not finds:
            for option, value in (("--margin", margin), ("--granule", granule)):
                if value is not None:
                    raise UserError(f"{option} applies to a fit search; add --find-batch, --find-seq ARG or "
                                    f"--find-devices, or drop {option}")
        if from_path:
            cli_params.only_rendering_beside_from(click.get_current_context())
            jx = _jax_side()
            cells = jx.saved_rows.load(from_path, on_note=lambda line: click.echo(line, err=True))
        else:
            if not kw["model_file"]:
                raise UserError("compare needs MODEL_FILE (or --from FILE.json to re-render saved rows)")
            if granule is not None and not find_seq:
                raise UserError("--granule is the step of --find-seq; add --find-seq ARG or drop --granule")
            spec = {"layout": layouts, "remat": remats, "precision": precisions, "batch": batches,
                    "optimizer": optimizers, "mesh": meshes, "gpu": gpu_list, "lora_rank": loras,
                    "base_dtype": base_dtypes, "rules": kw["rules"] if "," in (kw["rules"] or "") else None,
                    "microbatches": microbatches_grid, "pair": pairs}
            mesh_texts = [m for m in (meshes or pair_meshes or kw["mesh"]).split(";") if m.strip()]
            session.prepare(cpu_devices=max(1, *(mesh_size(m) for m in mesh_texts)))  # the workers inherit it
            jx = _jax_side()
            find = None if not finds else jx.compare.Find(
                finds[0], arg=find_seq, granule=granule, margin=jx.search.DEFAULT_MARGIN if margin is None else margin)

            def on_row(c):
                if not as_json:
                    click.echo(jx.compare.row_line(c))

            cells = jx.compare.compare(kw["model_file"], _options(kw),
                                       spec, find=find, n_jobs=n_jobs, executor=executor, ray_address=ray_address,
                                       on_row=on_row, yes=yes)
        if as_json:
            click.echo(json.dumps(jx.compare.to_json(cells), indent=2))
        else:
            jx.render.render_comparison(cells)
        # after the rows are printed: a failed write never loses them
        outputs.write([("--out", out_path, jx.compare.save), *outputs.compare_outputs(html_path, png_path)], cells,
                      "the comparison")
        ok = [c.report for c in cells if c.report is not None]
        sys.exit(EXIT_DOES_NOT_FIT if ok and all(r.fits is False for r in ok) else EXIT_FITS)

    _run(go)


# compare prints many reports: its --json is a list, not analyze's one object.
cli_params.set_help(compare, "as_json",
                    "Print a JSON list instead of tables: one object per row, each with its full report.")


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
        doctor_mod = _jax_side().doctor
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
@cli_params.fields("microbatches", "mem_fraction", "allocator")
@click.option("--all", "always", is_flag=True,
              help="Search even when the step fits as given (faster or roomier settings).")
@click.option("--jobs", "n_jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes compiling candidates (default: all cores; 1: in this process).")
@click.option("--changes", "change_kinds", show_default=True,
              default="fraction,precision,attention,loss,remat,accum,layout,base,moments,offload,lora,hsdp,context,"
                      "expert,pipeline,devices",
              help="The kinds of change to try, comma-separated.")
def advise(as_json, always, n_jobs, change_kinds, **kw):
    """When MODEL_FILE's step does not fit: the changes that make it fit, highest throughput first.

    Compiles the changes users make, free ones first: a larger memory fraction (with the variable
    to set), bf16, cuDNN attention / a chunked loss where the model takes them, remat, accumulation,
    sharding, mesh changes, twice the devices last; for fine-tunes bf16 moments, optimizer offload,
    a smaller LoRA base, LoRA / QLoRA (these train adapters only, and say so). Then combinations
    predicted to fit. Plans that fit, on the GPUs as given first, are ranked by tokens/s per device
    (overlapping bands tied), each with its `jaxmem analyze` command.
    Exit code: 0 when one fits (or the step fits as given), 3 when none does, 2 on a user error.

    \b
    Example:
      jaxmem advise models/llama.py --arg preset=8b --arg seq_len=4096 --batch 64 --gpu a6000 --mesh data=8 --layout dp
      jaxmem advise models/gpt2.py --gpu a100-80g --mesh data=4 --all --json
    """

    def go():
        _prepare(kw)
        # workers inherit the environment; the largest candidate mesh has twice the devices
        session.prepare(cpu_devices=max(1, 2 * mesh_size(kw["mesh"])))
        jx = _jax_side()
        result = jx.advise.advise(kw["model_file"], _options(kw, explain=False),
                                  always=always, n_jobs=n_jobs, progress=not as_json,
                                  changes=tuple(c.strip() for c in change_kinds.split(",") if c.strip()))
        if as_json:
            click.echo(json.dumps(result.to_json(), indent=2))
        else:
            jx.render.render_advice(result)
        sys.exit(EXIT_FITS if result.fits else EXIT_DOES_NOT_FIT)

    _run(go)


@main.command()
@step_options(json=False)
@cli_params.fields("microbatches", "mem_fraction", "allocator", "top", "module_depth", "explain", "cache")
@cli_params.serving_options
def explore(port, no_browser, n_jobs, executor, ray_address, **kw):
    """A local page of what-ifs on MODEL_FILE's step from the options given, every number the compiler's:
    compiled points answer at once, a batch move is predicted from compiled neighbours until its compile
    lands (docs/explore.md). Serves on 127.0.0.1; Ctrl-C stops it and its workers. Example:
    jaxmem explore models/llama.py --mesh data=8 --remat full --precision bf16"""

    def go():
        _prepare(kw)
        _jax_side().explore.serve(kw["model_file"], _options(kw), port=port, browser=not no_browser, jobs=n_jobs,
                                  executor=executor, ray_address=ray_address, echo=click.echo)

    _run(go)


@main.command("cache")
@click.option("--clear", is_flag=True, help="Remove every entry (and partial write) of the compile cache.")
@click.option("--trust", "trust_fp", metavar="FINGERPRINT", default=None,
              help="Trust the cache's key (a team member's, shown by `jaxmem cache`) for this cache.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def cache_command(clear, trust_fp, as_json):
    """Where the compile cache is ($JAXMEM_CACHE, else ~/.cache/jaxmem), its entries, their size, and its key.

    The key's owner says who can sign entries (docs/planning.md); JAXMEM_CACHE_READONLY=1 never writes.

    \b
    Example:
      jaxmem cache
      jaxmem cache --clear
      jaxmem cache --trust sha256:0123456789abcdef0123456789abcdef
    """

    def go():
        jx = _plain_side()
        cache = jx.cache
        if trust_fp is not None:
            cache.trust(trust_fp)
        d = cache.clear() if clear else cache.info()
        if as_json:
            click.echo(json.dumps(d, indent=2))
            return
        for line in jx.text.cache_lines(d, cleared=clear):
            click.echo(line)

    _run(go)


@main.command()
@click.argument("old_path", metavar="OLD.json")
@click.argument("new_path", metavar="NEW.json")
@click.option("--max-growth", "max_growth", type=NonNegativeNumber(), default=None, metavar="SHARE",
              help="Exit 4 when the per-device peak grew by more than this share of OLD's (0.05: 5%).")
@click.option("--top", type=WholeNumber(1, "the number of rows"), default=10, show_default=True,
              help="Rows of the module and buffer tables.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def diff(old_path, new_path, max_growth, top, as_json):
    """Two `analyze --json` reports side by side: the peak, each part, the modules and buffers added, removed
    or grown, and the options, versions, XLA flags that differ (docs/planning.md). Exit code: 0, or 4 with
    --max-growth when the peak grew by more than SHARE; 2 on a user error. Example: jaxmem diff old.json new.json"""
    def go():
        if _plain_side().diff_view.show(old_path, new_path, max_growth=max_growth, top=top, as_json=as_json):
            sys.exit(EXIT_GREW)

    _run(go)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def gpus(as_json):
    """List the GPU catalogue jaxmem compiles for devicelessly.

    \b
    Example:
      jaxmem gpus
    """
    def go():   # in the commands' handler: a full device or closed pipe is exit 2, as for analyze and cache
        rows = catalogue_rows()
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        _plain_side().text.print_gpus(rows)

    _run(go)


@main.command()
@step_options
@field_option("microbatches")
@click.option("--timeout", type=Seconds(), default=600, show_default=True,
              help="Seconds the measuring process may run.")
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
        outputs.check_all([("--html", html_path)])  # before the measurement, not after
        session.prepare(measuring=True)
        _prepare(kw, cpu_default=True)
        jx = _jax_side()
        result = jx.verify.verify_file(kw["model_file"], _options(kw, explain=False), timeout=timeout)

        def side_outputs():  # after the result is printed: a failed side output never loses it
            outputs.write([("--html", html_path, jx.verify_html.write)], result, "the result")

        if as_json:
            click.echo(json.dumps(result.to_json(), indent=2))
            side_outputs()
            return
        for line in jx.text.verify_lines(result, kw["mesh"], kw["layout"]):
            click.echo(line)
        side_outputs()

    _run(go)


# verify runs the step here: its default target is this machine's, not the catalogue's.
for _p in verify.params:
    if _p.name == "gpu":
        _p.help = "cpu, or local (the attached GPU). Default: the attached GPU, else the CPU."


@main.command()
@click.option("--gpu", default=None, help="cpu, or local (the attached GPU). Default: the attached GPU, else cpu.")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Measurements per case (the median is kept).")
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
        session.prepare(cpu_devices=1 if is_cpu_target(gpu) else 0, measuring=True)
        jx = _jax_side()
        cal = jx.verify.calibrate(gpu, repeats=repeats, save=not dry_run)
        if as_json:
            click.echo(json.dumps(cal.to_json(), indent=2))
            return
        for line in jx.text.calibration_lines(cal):
            click.echo(line)

    _run(go)


def entry():
    """The `jaxmem` program (and `python -m jaxmem.cli`): this process ends with the command."""
    stdio.guard()   # before anything opens a file: a closed fd 1 must not become that file
    exits.standalone()
    stdio.run(main)


if __name__ == "__main__":  # pragma: no cover
    entry()
