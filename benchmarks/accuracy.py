"""Accuracy benchmark: jaxmem's predicted peak vs the measured peak, beside two analytic baselines.

    nice -n 10 python benchmarks/accuracy.py                # CPU, 8 forced host devices -> results/accuracy-cpu.md
    python benchmarks/accuracy.py --only gpt2 --repeats 1   # cases whose id contains "gpt2" (no file written)
    python benchmarks/accuracy.py --gpu                     # the attached NVIDIA GPU(s) -> results/accuracy-gpu.md

What a CPU row shows, and what it does not
------------------------------------------

jaxmem's prediction is exactly what ``jaxmem analyze --gpu cpu`` reports (runtime
overhead included). The measured peak comes from running a step once on random data in
a fresh process (peak RSS, :mod:`jaxmem.truth.measure`), ``--repeats`` times. For the
cases on ``models/`` the measured step is jaxmem's own step, compiled by the same code
as the prediction: the row shows that XLA:CPU's buffer assignment plus the runtime term
matches the OS's view of that same program. It is not a GPU claim. The argument bytes
(params, optimizer state, batch) are exact by construction on both sides, so the error
on the rest -- the *non-argument* part, what XLA had to plan (temporaries, outputs not
aliased, plus the runtime term) -- is reported beside the total.

The ``handwritten`` cases (``benchmarks/handwritten/``) measure a training step written
without jaxmem (plain ``jax.jit`` + ``optax``, ``donate_argnums``, shardings by hand)
against ``jaxmem analyze`` of the same file: they show whether jaxmem's step is the
program users run.

Settings that make a measured run differ from a default JAX run, all stated in the table:
jaxmem compiles CPU programs with XLA:CPU's YNNPACK fusions off
(``xla_cpu_experimental_ynn_fusion_type=""``; their run-time scratch is invisible to
XLA's buffer assignment), and the measured run uses the same option; every step is
therefore measured a second time compiled with XLA's defaults (YNNPACK on), and the
error against that is reported too. The measuring process runs with glibc's
``MALLOC_MMAP_THRESHOLD_=65536`` / ``MALLOC_TRIM_THRESHOLD_=131072`` (freed buffers leave
the RSS at once) and ``--xla_force_host_platform_device_count`` (one process holds
the mesh's CPU devices).

Baselines: the classic rule (:mod:`jaxmem.truth.classic`) and the strongest analytic
calculator we could build (:mod:`jaxmem.truth.simulator`), given the same runtime term.

Measurements run one at a time in a worker thread (each in its own process), repeat
after repeat over all cases (the predicted programs first, then XLA's defaults), while
the main thread compiles the predictions. The raw runs are saved as JSON after every run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
N_DEVICES = 8
YNN_OFF = 'xla_cpu_experimental_ynn_fusion_type=""'


@dataclasses.dataclass(frozen=True)
class BenchCase:
    id: str
    model: str                     # model file, relative to the repository root
    args: tuple                    # workload() keyword arguments
    mesh: str
    layout: str
    precision: str = "fp32"
    remat: str = "none"
    hand_args: tuple | None = None  # set: measure the file's train_step_by_hand(**args, **hand_args) instead

    @property
    def handwritten(self) -> bool:
        return self.hand_args is not None

    @property
    def batch(self) -> int | None:
        return dict(self.args).get("batch_size")

    @property
    def family(self) -> str:
        return Path(self.model).stem

    @property
    def preset(self) -> str:
        a = dict(self.args)
        extra = ",".join(f"{k}={v}" for k, v in self.args if k not in ("preset", "batch_size"))
        name = f"{self.family}/{a['preset']}" if "preset" in a else self.model
        return name + (f" ({extra})" if extra else "")

    def analyze_command(self, gpu: str = "cpu", mesh: str | None = None) -> str:
        """The `jaxmem analyze` command whose number the row's prediction is."""
        parts = ["jaxmem analyze", self.model, "--gpu", gpu, "--mesh", mesh or self.mesh, "--layout", self.layout,
                 "--precision", self.precision]
        if self.remat != "none":
            parts += ["--remat", self.remat]
        parts += [f"--arg {k}={v}" for k, v in self.args]
        return " ".join(parts)


# Sizes chosen to run on 2 cores (each step a few seconds) with a measured peak of
# 100 MB+ per device, so that the accuracy targets apply to every case.
_MLP = (("preset", "base"), ("hidden", 1024), ("n_layers", 8))
_MLP_WIDE = (("preset", "base"), ("hidden", 4096), ("n_layers", 4))
_MLP_NNX = (("preset", "base"), ("hidden", 2048), ("n_layers", 6), ("n_classes", 100))
_GPT2_CFG = (("n_layer", 4), ("n_embd", 256), ("n_head", 8), ("vocab_size", 8192), ("block_size", 512))
_GPT2 = (("preset", "gpt2"),) + _GPT2_CFG
_LLAMA = (("preset", "tiny"), ("d_model", 256), ("n_heads", 8), ("n_kv_heads", 4), ("ffn_dim", 1024), ("n_layers", 4),
          ("vocab_size", 8192), ("seq_len", 512))
_RESNET = (("preset", "resnet18"), ("image_size", 64))
_VIT = (("preset", "vit-s16"), ("image_size", 64), ("patch_size", 4), ("n_layers", 4), ("d_model", 256),
        ("n_heads", 8), ("mlp_dim", 1024), ("n_classes", 100))
DP, TP = f"data={N_DEVICES}", "data=2,model=4"
HAND_CNN, HAND_GPT = "benchmarks/handwritten/cnn.py", "benchmarks/handwritten/gpt.py"

CASES = (
    BenchCase("mlp-dp", "models/mlp.py", _MLP + (("batch_size", 256),), DP, "dp"),
    BenchCase("mlp-fsdp-bf16", "models/mlp.py", _MLP_WIDE + (("batch_size", 256),), DP, "fsdp", "bf16"),
    BenchCase("mlp-tp", "models/mlp.py", _MLP_WIDE + (("batch_size", 512),), TP, "tp"),
    BenchCase("mlp_nnx-dp", "models/mlp_nnx.py", _MLP_NNX + (("batch_size", 256),), DP, "dp"),
    BenchCase("mlp_nnx-fsdp-remat", "models/mlp_nnx.py", _MLP_NNX + (("batch_size", 1024),), DP, "fsdp", "fp32", "full"),
    BenchCase("resnet-dp", "models/resnet.py", _RESNET + (("batch_size", 32),), DP, "dp"),
    BenchCase("resnet-fsdp-bf16-remat", "models/resnet.py", _RESNET + (("batch_size", 64),), DP, "fsdp", "bf16", "full"),
    BenchCase("gpt2-dp", "models/gpt2.py", _GPT2 + (("batch_size", 16),), DP, "dp"),
    BenchCase("gpt2-fsdp-bf16-remat", "models/gpt2.py", _GPT2 + (("batch_size", 32),), DP, "fsdp", "bf16", "full"),
    BenchCase("gpt2-tp", "models/gpt2.py", _GPT2 + (("batch_size", 8),), TP, "tp"),
    BenchCase("llama-fsdp", "models/llama.py", _LLAMA + (("batch_size", 16),), DP, "fsdp"),
    BenchCase("llama-fsdp-bf16-remat", "models/llama.py", _LLAMA + (("batch_size", 32),), DP, "fsdp", "bf16", "full"),
    BenchCase("llama-tp-bf16", "models/llama.py", _LLAMA + (("batch_size", 16),), TP, "tp", "bf16"),
    BenchCase("llama-dp-remat", "models/llama.py", _LLAMA + (("batch_size", 32),), DP, "dp", "fp32", "full"),
    BenchCase("vit-dp", "models/vit.py", _VIT + (("batch_size", 32),), DP, "dp"),
    BenchCase("vit-fsdp-bf16-remat", "models/vit.py", _VIT + (("batch_size", 64),), DP, "fsdp", "bf16", "full"),
    # Steps written by hand (not by jaxmem's step builder), measured the same way.
    BenchCase("hand-cnn-1dev", HAND_CNN, (("batch_size", 32),), "data=1", "dp", hand_args=()),
    BenchCase("hand-gpt2-dp", HAND_GPT, _GPT2_CFG + (("batch_size", 16),), DP, "dp",
              hand_args=(("layout", "dp"), ("precision", "fp32"))),
    BenchCase("hand-gpt2-fsdp-bf16", HAND_GPT, _GPT2_CFG + (("batch_size", 16),), DP, "fsdp", "bf16",
              hand_args=(("layout", "fsdp"), ("precision", "bf16"))),
)
TRANSFORMERS = ("gpt2", "llama", "vit", "gpt")
TARGET_MIN_BYTES = 100 * 10**6


# ---------------------------------------------------------------- pure logic (tests/test_accuracy_bench.py)


def relative_error(predicted: float, measured: float) -> float:
    """Signed: (predicted - measured) / measured; negative means the method predicted too little."""
    return (predicted - measured) / measured if measured else float("nan")


def spread(values) -> dict | None:
    """Median, min and max of repeated measurements (None when there are none)."""
    values = list(values)
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def score(predicted: int, runs: list[dict]) -> dict | None:
    """One prediction against repeated runs of one program.

    Each run is {"peak": measured bytes of the largest device, "args": that device's argument
    bytes}. Returns the spread of the measured peak, the error of the prediction against the
    median run and its range over the runs; the same for the non-argument part (measured:
    peak - arguments, predicted: `predicted` - the run's arguments).
    """
    if not runs:
        return None
    peaks = spread(r["peak"] for r in runs)
    errs = [relative_error(predicted, r["peak"]) for r in runs]
    non_arg = [r["peak"] - r["args"] for r in runs]
    args = statistics.median(r["args"] for r in runs)
    pred_non_arg = predicted - args
    non_arg_errs = [relative_error(predicted - r["args"], r["peak"] - r["args"]) for r in runs]
    return {
        "measured": peaks,
        "err": relative_error(predicted, peaks["median"]),
        "err_range": (min(errs), max(errs)),
        "args": args,
        "non_arg_measured": spread(non_arg),
        "non_arg_predicted": pred_non_arg,
        "non_arg_err": relative_error(pred_non_arg, statistics.median(non_arg)),
        "non_arg_err_range": (min(non_arg_errs), max(non_arg_errs)),
    }


def make_row(case: BenchCase, predicted: int | None, runs_jaxmem_options: list[dict], runs_xla_defaults: list[dict],
             classic: int | None = None, simulator: int | None = None, **extra) -> dict:
    """A table row: the prediction scored against the measured program (jaxmem's compile options)
    and against the same program compiled with XLA's defaults; the baselines against the former."""
    row = {"case": case, **extra}
    if predicted is None:
        return row
    row["predicted"] = predicted
    same = score(predicted, runs_jaxmem_options)
    if same is not None:
        row["same"] = same
        measured = same["measured"]["median"]
        if classic is not None:
            row["classic"], row["classic_err"] = classic, relative_error(classic, measured)
        if simulator is not None:
            row["simulator"], row["simulator_err"] = simulator, relative_error(simulator, measured)
    default = score(predicted, runs_xla_defaults)
    if default is not None:
        row["default"] = default
    return row


def _stats(xs):
    xs = [abs(x) for x in xs]
    return (max(xs), statistics.median(xs)) if xs else (None, None)


def summary(rows) -> dict:
    ok = [r for r in rows if "same" in r]
    big = [r for r in ok if r["same"]["measured"]["median"] >= TARGET_MIN_BYTES]
    out = {"cases": len(rows), "measured": len(ok), "at_least_100MB": len(big),
           "handwritten": sum(r["case"].handwritten for r in ok)}
    out["max_abs_err"], out["median_abs_err"] = _stats(r["same"]["err"] for r in big)
    out["worst_repeat_abs_err"] = max((max(abs(e) for e in r["same"]["err_range"]) for r in big), default=None)
    out["non_arg_max_abs_err"], out["non_arg_median_abs_err"] = _stats(r["same"]["non_arg_err"] for r in big)
    dflt = [r for r in big if "default" in r]
    out["default_max_abs_err"], out["default_median_abs_err"] = _stats(r["default"]["err"] for r in dflt)
    for name in ("classic", "simulator"):
        scored = [r for r in big if f"{name}_err" in r]
        out[f"{name}_max_abs_err"], out[f"{name}_median_abs_err"] = _stats(r[f"{name}_err"] for r in scored)
        out[f"{name}_scored"] = len(scored)
        out[f"wins_vs_{name}"] = sum(abs(r["same"]["err"]) < abs(r[f"{name}_err"]) for r in scored)
        out[f"not_better_than_{name}"] = [r["case"].id for r in scored if abs(r["same"]["err"]) >= abs(r[f"{name}_err"])]
    trans = [r for r in ok if r["case"].family in TRANSFORMERS and "classic_err" in r]
    out["transformers"] = len(trans)
    out["transformer_wins_vs_classic"] = sum(abs(r["same"]["err"]) < abs(r["classic_err"]) for r in trans)
    out["failed"] = [r["case"].id for r in rows if "same" not in r]
    return out


def _fmt(b) -> str:
    return "-" if b is None else f"{b / 1e6:,.1f} MB"


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:+.2f}%"


def _abs_pct(x) -> str:
    return "-" if x is None else f"{x * 100:.2f}%"


def _range(r) -> str:
    return "-" if r is None else f"{r[0] * 100:+.2f}..{r[1] * 100:+.2f}%"


def _measured(s) -> str:
    if s is None:
        return "-"
    return f"{s['median'] / 1e6:,.1f} MB ({s['min'] / 1e6:,.1f}-{s['max'] / 1e6:,.1f}, n={s['n']})"


def markdown(rows, meta: dict) -> str:
    """The results file. `meta`: backend, device, versions, date, total_s, repeats, overhead, gpu_name."""
    s = summary(rows)
    cpu = meta["backend"] == "cpu"
    lines = [
        f"# jaxmem accuracy: {meta['backend'].upper()} backend",
        "",
        f"- Backend: {meta['backend']}; device: {meta['device']}",
        f"- Versions: {meta['versions']}",
        f"- Date: {meta['date']}; {len(rows)} cases x {meta['repeats']} repeats in {meta['total_s']:.0f} s",
        f"- Reproduce: `{meta['command']}`",
        f"- jaxmem predicted: `jaxmem analyze --gpu {meta['gpu_name']}` of the case's model file (the command of "
        f"each row is in the last table), runtime overhead included ({meta['overhead']})",
        f"- Measured: {meta['how']}",
        "- Errors: (predicted - measured) / measured, per device (the largest device's peak), against the median of "
        "the repeats; the range is the error against each repeat",
        "",
    ]
    if cpu:
        lines += [
            "## What this table shows, and what it does not",
            "",
            "- For the cases on `models/`, the measured step is jaxmem's own step, compiled by the same code as the "
            "prediction: a row shows that XLA:CPU's buffer assignment plus jaxmem's runtime term matches the OS's view "
            "(peak RSS) of the same program. **It is not a GPU accuracy claim**: no GPU was measured here.",
            "- Argument bytes (params, optimizer state, batch, mutable state) are exact by construction on both sides; "
            "the *non-argument* columns isolate what XLA had to plan: temporaries + outputs not aliased (+ the runtime "
            "term), predicted vs measured peak minus arguments.",
            "- The `hand-*` cases measure a training step written without jaxmem (plain `jax.jit` + `optax`, "
            "`donate_argnums`, shardings by hand: `benchmarks/handwritten/`) against `jaxmem analyze` of the same "
            "file: whether jaxmem's step is the program a user runs.",
            "- Settings that make a measured run differ from a default JAX run:",
            f"  - XLA:CPU's YNNPACK fusions are off (`{YNN_OFF}`): jaxmem compiles CPU programs so, because "
            "YNNPACK allocates run-time scratch that XLA's buffer assignment does not see. The same step compiled with "
            "XLA's defaults is measured too (the *default XLA:CPU settings* table); `--gpu cpu` predicts the program "
            "with the fusions off. To run that program in your own training: "
            "`jax.jit(step, ..., compiler_options={\"xla_cpu_experimental_ynn_fusion_type\": \"\"})`, or "
            "`XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=` for the whole process.",
            "  - The measuring process runs with glibc's `MALLOC_MMAP_THRESHOLD_=65536` and "
            "`MALLOC_TRIM_THRESHOLD_=131072` (freed blocks leave the RSS at once, so the RSS follows the live buffers), "
            "and `--xla_force_host_platform_device_count=N` (one process holds the N CPU devices of the mesh; its RSS "
            "rise is split equally over them: the layouts are symmetric).",
            "  - Arguments are random data placed on the devices before the peak is reset; one step is run.",
            "",
        ]
    lines += [
        "## jaxmem against the measured program",
        "",
        "| case | model/preset | layout | mesh | precision | remat | batch | measured: median (min-max, n) | "
        "jaxmem predicted | error | error range | non-arg measured | non-arg predicted | non-arg error | "
        "non-arg error range |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, m = r["case"], r.get("same")
        lines.append(
            f"| {c.id} | {c.preset} | {c.layout} | {r.get('mesh', c.mesh)} | {c.precision} | {c.remat} | {c.batch} | "
            f"{_measured(m and m['measured'])} | {_fmt(r.get('predicted'))} | {_pct(m and m['err'])} | "
            f"{_range(m and m['err_range'])} | {_fmt(m and m['non_arg_measured']['median'])} | "
            f"{_fmt(m and m['non_arg_predicted'])} | {_pct(m and m['non_arg_err'])} | "
            f"{_range(m and m['non_arg_err_range'])} |")
    if cpu:
        lines += [
            "",
            "## Default XLA:CPU settings (YNNPACK fusions on): what a plain `jax.jit` runs",
            "",
            "The same steps compiled with XLA's default options, measured the same way, against the same "
            "`jaxmem analyze --gpu cpu` prediction (which is for the fusions-off program).",
            "",
            "| case | measured with the fusions off | measured with XLA's defaults: median (min-max, n) | "
            "jaxmem error vs defaults | error range | non-arg error vs defaults |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            m, d = r.get("same"), r.get("default")
            lines.append(f"| {r['case'].id} | {_fmt(m and m['measured']['median'])} | {_measured(d and d['measured'])} "
                         f"| {_pct(d and d['err'])} | {_range(d and d['err_range'])} | {_pct(d and d['non_arg_err'])} |")
    lines += [
        "",
        "## Analytic baselines",
        "",
        "- classic: the rule users apply today (`jaxmem/truth/classic.py`): 16 B/param for (mixed-precision) Adam "
        "over the devices the layout shards it across, + Korthikanti et al. 2022 activations for transformers, "
        "+ 2 x layer outputs (torchsummary) otherwise.",
        "- simulator: the strongest analytic calculator we could build (`jaxmem/truth/simulator.py`): exact "
        "param / gradient / optimizer-state bytes per precision and optimizer, sharded per ZeRO stage / FSDP / TP; "
        "Korthikanti activations with the model's real shapes, fp32 softmax, the recompute working set of one "
        "layer under remat; the loss's logits, their fp32 copy and gradient; one layer's gathered weights and "
        "unreduced gradient under FSDP; the same runtime term as jaxmem.",
        "",
        "| case | measured (median) | jaxmem error | simulator predicted | simulator error | classic predicted | "
        "classic error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r.get("same")
        lines.append(f"| {r['case'].id} | {_fmt(m and m['measured']['median'])} | {_pct(m and m['err'])} | "
                     f"{_fmt(r.get('simulator'))} | {_pct(r.get('simulator_err'))} | {_fmt(r.get('classic'))} | "
                     f"{_pct(r.get('classic_err'))} |")
    hand = [r for r in rows if r["case"].handwritten]
    if hand:
        lines += [
            "",
            "## Hand-written steps: jaxmem's program against the user's",
            "",
            "XLA's own numbers for the two compiles (fusions off on both): jaxmem's step (`jaxmem analyze`) and the "
            "hand-written step (`train_step_by_hand` in the file).",
            "",
            "| case | jaxmem XLA temp | hand-written XLA temp | difference | jaxmem arguments | hand-written arguments |",
            "|---|---|---|---|---|---|",
        ]
        for r in hand:
            jt, ht = r.get("xla_temp"), r.get("hand_xla_temp")
            diff = _pct(relative_error(jt, ht)) if jt is not None and ht else "-"
            lines.append(f"| {r['case'].id} | {_fmt(jt)} | {_fmt(ht)} | {diff} | {_fmt(r.get('xla_argument'))} | "
                         f"{_fmt(r.get('hand_xla_argument'))} |")
    lines += ["", "## Summary", ""]
    lines += [
        f"- Cases measured: {s['measured']} of {s['cases']} ({s['handwritten']} hand-written); with a measured peak of "
        f"at least 100 MB per device: {s['at_least_100MB']}",
        f"- jaxmem, total: max |error| {_abs_pct(s['max_abs_err'])}, median |error| {_abs_pct(s['median_abs_err'])}; "
        f"worst single repeat {_abs_pct(s['worst_repeat_abs_err'])}",
        f"- jaxmem, non-argument part: max |error| {_abs_pct(s['non_arg_max_abs_err'])}, median |error| "
        f"{_abs_pct(s['non_arg_median_abs_err'])}",
    ]
    if cpu:
        lines.append(f"- jaxmem against XLA's default CPU settings (YNNPACK on): max |error| "
                     f"{_abs_pct(s['default_max_abs_err'])}, median |error| {_abs_pct(s['default_median_abs_err'])}")
    for name in ("simulator", "classic"):
        worse = s[f"not_better_than_{name}"]
        lines.append(f"- {name}: max |error| {_abs_pct(s[f'{name}_max_abs_err'])}, median |error| "
                     f"{_abs_pct(s[f'{name}_median_abs_err'])}; jaxmem closer on {s[f'wins_vs_{name}']} of "
                     f"{s[f'{name}_scored']} cases" + (f"; **not closer on: {', '.join(worse)}**" if worse else ""))
    if s["failed"]:
        lines.append(f"- failed: {', '.join(s['failed'])}: " +
                     "; ".join(r.get("error", "") for r in rows if "same" not in r))
    lines += ["", "## Commands of the predictions", ""]
    lines += [f"- {r['case'].id}: `{r['case'].analyze_command(meta['gpu_name'], r.get('mesh'))}`" for r in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- running it


def _gpu_mesh(mesh: str, n_gpus: int) -> str:
    """The CPU case's mesh on the attached GPUs (as many as there are, up to the case's size)."""
    from jaxmem.program import layouts

    spec = layouts.parse_mesh(mesh)
    if spec.size <= n_gpus:
        return mesh
    if spec.model_axis:
        model = min(spec.axis_size(spec.model_axis), n_gpus)
        return f"data={max(n_gpus // model, 1)},model={model}"
    return f"data={n_gpus}"


def measure_once(case: BenchCase, mesh: str, backend: str, xla_defaults: bool) -> dict:
    """One measured run: {"peak", "args" (of the largest device), "xla", "wall_s"}."""
    from jaxmem.program import layouts
    from jaxmem.truth import measure

    if case.handwritten:
        sys.path.insert(0, str(ROOT / "benchmarks" / "handwritten"))
        import measure_hand

        m = measure_hand.run(str(ROOT / case.model), case.args + case.hand_args, layouts.parse_mesh(mesh).size,
                             xla_defaults)
    else:
        m = measure.run_case(measure.Case(model_file=str(ROOT / case.model), model_args=case.args, mesh=mesh,
                                          layout=case.layout, precision=case.precision, remat=case.remat,
                                          backend=backend, xla_defaults=xla_defaults), 600.0)
    i = max(range(len(m["measured_peak_bytes"])), key=lambda k: m["measured_peak_bytes"][k])
    return {"peak": m["measured_peak_bytes"][i], "args": m["args_bytes"][i], "xla": m.get("xla", {}),
            "wall_s": m.get("wall_s"), "device": m.get("device")}


def predict(case: BenchCase, mesh: str, gpu_name: str) -> dict:
    from jaxmem.pipeline import AnalyzeOptions, analyze_workload
    from jaxmem.program.workload import load_workload
    from jaxmem.truth import classic, simulator

    wl = load_workload(ROOT / case.model, remat=case.remat, **dict(case.args))
    opts = AnalyzeOptions(gpu=gpu_name, mesh=mesh, layout=case.layout, precision=case.precision, remat=case.remat,
                          explain=False, model_args=case.args)
    rep = analyze_workload(wl, opts, source=case.model)
    est = classic.estimate(wl, param_count=rep.param_count, mesh=mesh, layout=case.layout, precision=case.precision,
                           optimizer=None, remat=case.remat)
    sim = simulator.estimate(wl, mesh=mesh, layout=case.layout, precision=case.precision, optimizer=None,
                             remat=case.remat, overhead_bytes=rep.breakdown["runtime_overhead"])
    return {"predicted": rep.per_device_peak_bytes, "classic": est.total_bytes, "simulator": sim.total_bytes,
            "xla_temp": rep.xla["temp"], "xla_argument": rep.xla["argument"], "params": rep.param_count,
            "runtime_overhead_source": rep.runtime_overhead_source}


def build_rows(cases, predictions: dict, runs: dict, errors: dict, meshes: dict) -> list[dict]:
    """Table rows from the predictions and the measured runs (keyed by case id; runs by (id, xla_defaults))."""
    rows = []
    for c in cases:
        p = predictions.get(c.id, {"error": "not predicted"})
        own = runs.get((c.id, False), [])
        extra = {"mesh": meshes.get(c.id, c.mesh), "xla_temp": p.get("xla_temp"), "xla_argument": p.get("xla_argument")}
        if c.handwritten and own:
            extra.update(hand_xla_temp=own[0]["xla"].get("temp"), hand_xla_argument=own[0]["xla"].get("argument"))
        err = (p.get("error", "") + errors.get(c.id, "")).strip()
        if err:
            extra["error"] = err
        rows.append(make_row(c, p.get("predicted"), own, runs.get((c.id, True), []), p.get("classic"),
                             p.get("simulator"), **extra))
    return rows


def save_raw(path: Path, meta: dict, predictions: dict, runs: dict, errors: dict, meshes: dict) -> None:
    """Everything measured so far, as JSON (rewritten after every run): `--from-json` renders it again."""
    import json

    raw = {"meta": meta, "predictions": predictions, "errors": errors, "meshes": meshes,
           "runs": [{"case": cid, "xla_defaults": xd, "runs": rs} for (cid, xd), rs in runs.items()]}
    path.write_text(json.dumps(raw, indent=1, default=str) + "\n")


def render_raw(paths, out_path: Path | None) -> list[dict]:
    """Rows (and the Markdown) from one run's raw JSON, or from several runs' merged: the predictions of the
    first file that has each, every measured run of every file (so processes that measured different
    settings or repeats at the same time add up)."""
    import json

    raws = [json.loads(Path(p).read_text()) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    by_id = {c.id: c for c in CASES}
    predictions, errors, meshes, runs = {}, {}, {}, {}
    for raw in raws:
        for cid, p in raw["predictions"].items():
            if cid not in predictions or "error" in predictions[cid]:
                predictions[cid] = p
        for cid, e in raw["errors"].items():
            errors[cid] = (errors.get(cid, "") + " " + e).strip()
        meshes.update(raw["meshes"])
        for r in raw["runs"]:
            runs.setdefault((r["case"], r["xla_defaults"]), []).extend(r["runs"])
    cases = [c for c in CASES if c.id in meshes]
    rows = build_rows(cases, predictions, runs, errors, meshes)
    if out_path is not None:
        meta = dict(next((r["meta"] for r in raws if r["predictions"]), raws[0]["meta"]))
        done = {len(rs) for rs in runs.values()}
        meta["repeats"] = f"{min(done)}-{max(done)}" if len(done) > 1 else (done.pop() if done else 0)
        if len(raws) > 1:
            commits = sorted({r["meta"]["how"].rsplit("commit ", 1)[-1] for r in raws})
            meta["how"] += (f"; merged from {len(raws)} benchmark processes run at the same time "
                            f"(commits {', '.join(commits)}; each measurement in its own fresh process)")
            meta["total_s"] = max(r["meta"]["total_s"] for r in raws)
        out_path.write_text(markdown(rows, meta))
        print(f"wrote {out_path}")
    return rows


def run(cases, gpu: bool, repeats: int, out_path: Path | None, command: str, settings: str = "both",
        predict_cases: bool = True) -> list[dict]:
    backend = "gpu" if gpu else "cpu"
    gpu_name, n_gpus, device = "cpu", N_DEVICES, None
    if gpu:
        import jax

        from jaxmem.truth.verify import catalogue_key

        devs = jax.devices("gpu")
        n_gpus, device = len(devs), devs[0].device_kind
        gpu_name = catalogue_key(device) or "local"  # the deviceless prediction is what jaxmem is for
        cases = [c for c in cases if not c.handwritten]  # the hand-written harness measures CPU runs only
    meshes = {c.id: (_gpu_mesh(c.mesh, n_gpus) if gpu else c.mesh) for c in cases}
    variants = (False,) if gpu else (False, True)   # on CPU: jaxmem's compile options, then XLA's defaults
    variants = {"both": variants, "jaxmem": (False,), "defaults": (True,)}[settings]

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    jobs = []
    t_start = time.perf_counter()
    for xd in variants:   # every repeat of the predicted program first; XLA's defaults after
        for rep in range(repeats):
            for c in cases:
                jobs.append((c.id, xd, rep, pool.submit(measure_once, c, meshes[c.id], backend, xd)))
    predictions = {}
    for c in cases if predict_cases else ():
        try:
            predictions[c.id] = predict(c, meshes[c.id], gpu_name)
        except Exception as e:  # noqa: BLE001 -- keep the benchmark going; the row says what failed
            predictions[c.id] = {"error": f"predict: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        p = predictions[c.id]
        print(f"predicted {c.id:24s} jaxmem {_fmt(p.get('predicted')):>12} simulator {_fmt(p.get('simulator')):>12} "
              f"classic {_fmt(p.get('classic')):>12} {p.get('error', '')}", flush=True)
    runs: dict[tuple[str, bool], list[dict]] = {}
    errors: dict[str, str] = {}
    raw_path = out_path.with_suffix(".json") if out_path is not None else None
    for cid, xd, rep, fut in jobs:
        try:
            m = fut.result()
            runs.setdefault((cid, xd), []).append(m)
            if raw_path is not None:
                save_raw(raw_path, _meta(backend, device, gpu_name, time.perf_counter() - t_start, repeats,
                                         predictions, command), predictions, runs, errors, meshes)
            p = predictions.get(cid, {}).get("predicted")
            print(f"measured  {cid:24s} {'xla-defaults' if xd else 'jaxmem-opts '} repeat {rep + 1}: "
                  f"{_fmt(m['peak']):>12} (jaxmem {_pct(relative_error(p, m['peak']) if p else None)}) "
                  f"{m['wall_s']} s", flush=True)
        except Exception as e:  # noqa: BLE001 -- as above
            errors[cid] = errors.get(cid, "") + f" measure: {type(e).__name__}: {str(e).splitlines()[0]}"
    pool.shutdown()
    rows = build_rows(cases, predictions, runs, errors, meshes)
    total_s = time.perf_counter() - t_start
    if out_path is not None:
        meta = _meta(backend, device, gpu_name, total_s, repeats, predictions, command)
        save_raw(raw_path, meta, predictions, runs, errors, meshes)
        out_path.write_text(markdown(rows, meta))
        print(f"wrote {out_path} and {raw_path.name} ({total_s:.0f} s)")
    return rows


def _meta(backend, device, gpu_name, total_s, repeats, predictions, command) -> dict:
    import flax
    import jax
    import jaxlib
    import optax

    from jaxmem.truth.verify import cpu_model

    sources = {p["runtime_overhead_source"] for p in predictions.values() if "runtime_overhead_source" in p}
    if backend == "cpu":
        device = f"{cpu_model()} ({os.cpu_count()} cores), forced host devices (8, or 1 for the 1-device case)"
        how = ("peak RSS per process (`/proc/self/clear_refs` reset after the arguments are placed): per device = "
               "its argument bytes + the step's RSS rise / the number of devices, each run in a fresh process")
    else:
        how = ("the allocator's `peak_bytes_in_use` per device, each case in a fresh process, "
               "`XLA_PYTHON_CLIENT_PREALLOCATE=false`")
    commit = os.environ.get("JAXMEM_COMMIT")
    if not commit:
        import subprocess

        git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
        commit = git("rev-parse", "--short", "HEAD") or "unknown"
        if git("status", "--porcelain", "--untracked-files=no"):
            commit += " + uncommitted changes"
    how += f"; code: jaxmem at commit {commit}"
    return {"backend": backend, "device": device, "gpu_name": gpu_name, "total_s": total_s, "repeats": repeats,
            "date": datetime.date.today().isoformat(), "how": how, "command": command,
            "versions": (f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, flax {flax.__version__}, "
                         f"optax {optax.__version__}; Python {sys.version.split()[0]}"),
            "overhead": " | ".join(sorted(sources)) or "-"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", action="store_true", help="run on the attached NVIDIA GPU(s); writes accuracy-gpu.md")
    p.add_argument("--only", default=None, help="only the cases whose id contains this text, or one of these comma-separated texts (writes no file)")
    p.add_argument("--repeats", type=int, default=3, help="measured runs per case and setting (default 3)")
    p.add_argument("--out", default=None, help="Markdown file to write (default: benchmarks/results/accuracy-<backend>.md)")
    p.add_argument("--settings", choices=("both", "jaxmem", "defaults"), default="both",
                   help="CPU: measure the program jaxmem predicts (YNNPACK fusions off), XLA's defaults, or both")
    p.add_argument("--reverse", action="store_true",
                   help="measure the cases in reverse order (spreads the large cases when processes run at once)")
    p.add_argument("--measure-only", action="store_true", help="skip the predictions (to merge with a run that has them)")
    p.add_argument("--from-json", nargs="+", default=None,
                   help="render the Markdown again from raw JSON (several: merged), without measuring")
    a = p.parse_args(argv)
    if a.from_json:
        rows = render_raw(a.from_json, Path(a.out) if a.out else Path(a.from_json[0]).with_suffix(".md"))
        return 1 if summary(rows)["failed"] else 0
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    if a.gpu:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the card to the measuring process
    else:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={N_DEVICES}").strip()
        os.environ["JAX_PLATFORMS"] = "cpu"
    only = None if a.only is None else [o for o in a.only.split(",") if o]
    cases = [c for c in CASES if only is None or any(o in c.id for o in only)]
    cases = cases[::-1] if a.reverse else cases
    out = Path(a.out) if a.out else (None if a.only else ROOT / "benchmarks" / "results" /
                                     f"accuracy-{'gpu' if a.gpu else 'cpu'}.md")
    command = "python benchmarks/accuracy.py" + (" --gpu" if a.gpu else "") + \
        (f" --repeats {a.repeats}" if a.repeats != 3 else "")
    rows = run(cases, a.gpu, max(a.repeats, 1), out, command, a.settings, not a.measure_only)
    s = summary(rows)
    print(f"jaxmem max |err| {_abs_pct(s['max_abs_err'])}, median {_abs_pct(s['median_abs_err'])}; non-arg max "
          f"{_abs_pct(s['non_arg_max_abs_err'])}; vs XLA defaults max {_abs_pct(s['default_max_abs_err'])}; "
          f"simulator max {_abs_pct(s['simulator_max_abs_err'])}; classic max {_abs_pct(s['classic_max_abs_err'])}")
    return 1 if s["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
