"""Accuracy benchmark: jaxmem's predicted peak vs the measured peak vs the classic analytic estimate.

    python benchmarks/accuracy.py                 # CPU backend, 8 forced host devices -> results/accuracy-cpu.md
    python benchmarks/accuracy.py --gpu           # the attached NVIDIA GPU(s)        -> results/accuracy-gpu.md
    python benchmarks/accuracy.py --only gpt2     # cases whose id contains "gpt2" (no file written)

For every case: jaxmem's prediction is exactly what ``jaxmem analyze`` reports for
the backend (``--gpu cpu``; with ``--gpu``, the catalogue GPU of the attached card,
compiled devicelessly, else ``--gpu local``), runtime overhead included; the measured
peak comes from running the step once on random data in a fresh process
(:mod:`jaxmem.truth.measure`); the classic estimate is :mod:`jaxmem.truth.classic` (bytes per
parameter + Korthikanti et al. for transformers, torchsummary's rule otherwise).
Errors are signed, (predicted - measured) / measured, per device (the largest device).

Measurements run one at a time in a worker thread (each in its own process) while
the main thread compiles the next predictions, so the 2-core run stays near 6 min.
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
MODELS = ROOT / "models"
N_DEVICES = 8


@dataclasses.dataclass(frozen=True)
class BenchCase:
    id: str
    model: str                     # file in models/
    args: tuple                    # workload() keyword arguments
    mesh: str
    layout: str
    precision: str = "fp32"
    remat: str = "none"

    @property
    def batch(self) -> int:
        return dict(self.args).get("batch_size")

    @property
    def family(self) -> str:
        return self.model.removesuffix(".py")

    @property
    def preset(self) -> str:
        a = dict(self.args)
        extra = ",".join(f"{k}={v}" for k, v in self.args if k not in ("preset", "batch_size"))
        return f"{self.family}/{a.get('preset', '')}" + (f" ({extra})" if extra else "")


# Sizes chosen to run on 2 cores (each step a few seconds) with a measured peak of
# 100 MB+ per device, so that the targets apply to every case.
_MLP = (("preset", "base"), ("hidden", 1024), ("n_layers", 8))
_MLP_WIDE = (("preset", "base"), ("hidden", 4096), ("n_layers", 4))
_MLP_NNX = (("preset", "base"), ("hidden", 2048), ("n_layers", 6), ("n_classes", 100))
_GPT2 = (("preset", "gpt2"), ("n_layer", 4), ("n_embd", 256), ("n_head", 8), ("vocab_size", 8192), ("block_size", 512))
_LLAMA = (("preset", "tiny"), ("d_model", 256), ("n_heads", 8), ("n_kv_heads", 4), ("ffn_dim", 1024), ("n_layers", 4),
          ("vocab_size", 8192), ("seq_len", 512))
_RESNET = (("preset", "resnet18"), ("image_size", 64))
_VIT = (("preset", "vit-s16"), ("image_size", 64), ("patch_size", 4), ("n_layers", 4), ("d_model", 256),
        ("n_heads", 8), ("mlp_dim", 1024), ("n_classes", 100))
DP, TP = f"data={N_DEVICES}", "data=2,model=4"

CASES = (
    BenchCase("mlp-dp", "mlp.py", _MLP + (("batch_size", 256),), DP, "dp"),
    BenchCase("mlp-fsdp-bf16", "mlp.py", _MLP_WIDE + (("batch_size", 256),), DP, "fsdp", "bf16"),
    BenchCase("mlp-tp", "mlp.py", _MLP_WIDE + (("batch_size", 512),), TP, "tp"),
    BenchCase("mlp_nnx-dp", "mlp_nnx.py", _MLP_NNX + (("batch_size", 256),), DP, "dp"),
    BenchCase("mlp_nnx-fsdp-remat", "mlp_nnx.py", _MLP_NNX + (("batch_size", 1024),), DP, "fsdp", "fp32", "full"),
    BenchCase("resnet-dp", "resnet.py", _RESNET + (("batch_size", 32),), DP, "dp"),
    BenchCase("resnet-fsdp-bf16-remat", "resnet.py", _RESNET + (("batch_size", 64),), DP, "fsdp", "bf16", "full"),
    BenchCase("gpt2-dp", "gpt2.py", _GPT2 + (("batch_size", 16),), DP, "dp"),
    BenchCase("gpt2-fsdp-bf16-remat", "gpt2.py", _GPT2 + (("batch_size", 32),), DP, "fsdp", "bf16", "full"),
    BenchCase("gpt2-tp", "gpt2.py", _GPT2 + (("batch_size", 8),), TP, "tp"),
    BenchCase("llama-fsdp", "llama.py", _LLAMA + (("batch_size", 16),), DP, "fsdp"),
    BenchCase("llama-fsdp-bf16-remat", "llama.py", _LLAMA + (("batch_size", 32),), DP, "fsdp", "bf16", "full"),
    BenchCase("llama-tp-bf16", "llama.py", _LLAMA + (("batch_size", 16),), TP, "tp", "bf16"),
    BenchCase("llama-dp-remat", "llama.py", _LLAMA + (("batch_size", 32),), DP, "dp", "fp32", "full"),
    BenchCase("vit-dp", "vit.py", _VIT + (("batch_size", 32),), DP, "dp"),
    BenchCase("vit-fsdp-bf16-remat", "vit.py", _VIT + (("batch_size", 64),), DP, "fsdp", "bf16", "full"),
)
TRANSFORMERS = ("gpt2", "llama", "vit")
TARGET_MIN_BYTES = 100 * 10**6


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


def _fmt(b: int | None) -> str:
    return "-" if b is None else f"{b / 1e6:,.1f} MB"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.2f}%"


def _abs_pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.2f}%"


def run(cases, gpu: bool, out_path: Path | None) -> list[dict]:
    from jaxmem.truth import classic, measure
    from jaxmem.analyze import AnalyzeOptions, analyze_workload
    from jaxmem.truth.verify import relative_error
    from jaxmem.program.workload import load_workload

    backend = "gpu" if gpu else "cpu"
    gpu_name, n_gpus, device = "cpu", N_DEVICES, None
    if gpu:
        import jax

        devs = jax.devices("gpu")
        n_gpus, device = len(devs), devs[0].device_kind
        from jaxmem.truth.verify import catalogue_key

        gpu_name = catalogue_key(device) or "local"  # the deviceless prediction is what jaxmem is for

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    rows, futures = [], []
    t_start = time.perf_counter()
    for c in cases:
        mesh = _gpu_mesh(c.mesh, n_gpus) if gpu else c.mesh
        mcase = measure.Case(model_file=str(MODELS / c.model), model_args=c.args, mesh=mesh, layout=c.layout,
                             precision=c.precision, remat=c.remat, backend=backend)
        futures.append(pool.submit(measure.run_case, mcase, 600.0))
    for c, fut in zip(cases, futures):
        mesh = _gpu_mesh(c.mesh, n_gpus) if gpu else c.mesh
        row = {"case": c, "mesh": mesh}
        try:
            wl = load_workload(MODELS / c.model, remat=c.remat, **dict(c.args))
            opts = AnalyzeOptions(gpu=gpu_name, mesh=mesh, layout=c.layout, precision=c.precision, remat=c.remat,
                                  explain=False, model_args=c.args)
            rep = analyze_workload(wl, opts, source=c.model)
            est = classic.estimate(wl, param_count=rep.param_count, mesh=mesh, layout=c.layout,
                                   precision=c.precision, optimizer=None, remat=c.remat)
            row.update(predicted=rep.per_device_peak_bytes, classic=est.total_bytes, classic_rule=est.rule,
                       params=rep.param_count)
        except Exception as e:  # noqa: BLE001 -- keep the benchmark going; the row says what failed
            row["error"] = f"predict: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        try:
            m = fut.result()
            row["measured"] = max(m["measured_peak_bytes"])
            row["device"] = m["device"]
            row["wall_s"] = m.get("wall_s")
        except Exception as e:  # noqa: BLE001 -- as above
            row["error"] = row.get("error", "") + f" measure: {type(e).__name__}: {str(e).splitlines()[0]}"
        if "measured" in row and "predicted" in row:
            row["err"] = relative_error(row["predicted"], row["measured"])
            row["classic_err"] = relative_error(row["classic"], row["measured"])
        rows.append(row)
        print(f"{c.id:26s} measured {_fmt(row.get('measured')):>12} jaxmem {_fmt(row.get('predicted')):>12} "
              f"({_pct(row.get('err')):>8})  classic {_fmt(row.get('classic')):>12} ({_pct(row.get('classic_err')):>8})"
              f"  {row.get('wall_s', '-')} s  {row.get('error', '')}", flush=True)
    pool.shutdown()
    total_s = time.perf_counter() - t_start
    if out_path is not None:
        out_path.write_text(markdown(rows, backend, device, gpu_name, total_s))
        print(f"wrote {out_path} ({total_s:.0f} s)")
    return rows


def summary(rows) -> dict:
    ok = [r for r in rows if "err" in r]
    big = [r for r in ok if r["measured"] >= TARGET_MIN_BYTES]
    errs = [abs(r["err"]) for r in big]
    trans = [r for r in ok if r["case"].family in TRANSFORMERS]
    return {
        "cases": len(rows), "measured": len(ok), "at_least_100MB": len(big),
        "max_abs_err": max(errs) if errs else None, "median_abs_err": statistics.median(errs) if errs else None,
        "classic_max_abs_err": max((abs(r["classic_err"]) for r in big), default=None),
        "classic_median_abs_err": statistics.median([abs(r["classic_err"]) for r in big]) if big else None,
        "wins": sum(abs(r["err"]) < abs(r["classic_err"]) for r in ok),
        "transformer_wins": sum(abs(r["err"]) < abs(r["classic_err"]) for r in trans), "transformers": len(trans),
        "failed": [r["case"].id for r in rows if "err" not in r],
    }


def markdown(rows, backend: str, device: str | None, gpu_name: str, total_s: float) -> str:
    import flax
    import jax
    import jaxlib
    import optax

    from jaxmem.compiler import runtime, targets
    from jaxmem.truth.verify import cpu_model

    s = summary(rows)
    if backend == "cpu":
        device = f"{cpu_model()} ({os.cpu_count()} cores), {N_DEVICES} forced host devices"
        ovh = runtime.model(targets.Target("cpu", "cpu", "cpu", None, False, (None,) * N_DEVICES)).terms[0]
        how = ("peak RSS per process (`/proc/self/clear_refs` reset after the arguments are placed, glibc serving "
               "blocks >= 64 KiB with mmap): per device = its argument bytes + the step's RSS rise / 8 (one process "
               "holds the 8 host devices; the layouts are symmetric)")
        pred = "`jaxmem analyze --gpu cpu`"
    else:
        ovh = None
        how = "the allocator's `peak_bytes_in_use` per device, each case in a fresh process, `XLA_PYTHON_CLIENT_PREALLOCATE=false`"
        pred = f"`jaxmem analyze --gpu {gpu_name}`" + (" (deviceless)" if gpu_name != "local" else "")
    lines = [
        f"# jaxmem accuracy: {backend.upper()} backend",
        "",
        f"- Backend: {backend}; device: {device}",
        (f"- Versions: jax {jax.__version__}, jaxlib {jaxlib.__version__}, flax {flax.__version__}, optax {optax.__version__}; "
        f"Python {sys.version.split()[0]}"),
        f"- Date: {datetime.date.today().isoformat()}; {len(rows)} cases in {total_s:.0f} s",
        f"- jaxmem predicted: {pred}, runtime overhead included"
        + (f" ({ovh.bytes / 1e6:.1f} MB per device: {ovh.source})" if ovh else ""),
        f"- Measured: {how}",
        ("- Classic: parameters x 16 B (AdamW, fp32 or mixed precision) over the devices the layout shards them "
        "across, + Korthikanti et al. 2022 activations for transformers, + 2 x layer outputs (torchsummary) for "
        "the MLP and the CNN (`jaxmem/classic.py`)"),
        "- Errors: (predicted - measured) / measured, per device (the largest device's peak)",
        "- Reproduce: `python benchmarks/accuracy.py" + (" --gpu" if backend == "gpu" else "") + "`",
        "",
        ("| case | model/preset | layout | mesh | precision | remat | batch | measured | jaxmem predicted | jaxmem error "
        "| classic predicted | classic error |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["case"]
        lines.append(f"| {c.id} | {c.preset} | {c.layout} | {r['mesh']} | {c.precision} | {c.remat} | {c.batch} | "
                     f"{_fmt(r.get('measured'))} | {_fmt(r.get('predicted'))} | {_pct(r.get('err'))} | "
                     f"{_fmt(r.get('classic'))} | {_pct(r.get('classic_err'))} |")
    lines += [
        "",
        "## Summary",
        "",
        f"- Cases with a measured peak of at least 100 MB per device: {s['at_least_100MB']} of {s['cases']}",
        (f"- jaxmem: max |error| {_abs_pct(s['max_abs_err'])}, median |error| {_abs_pct(s['median_abs_err'])} "
        "(targets: 5% and 2%)"),
        f"- classic: max |error| {_abs_pct(s['classic_max_abs_err'])}, median |error| {_abs_pct(s['classic_median_abs_err'])}",
        (f"- jaxmem closer than classic on {s['wins']} of {s['measured']} cases; on {s['transformer_wins']} of "
        f"{s['transformers']} transformer cases"),
    ]
    if s["failed"]:
        lines.append(f"- failed: {', '.join(s['failed'])}: " + "; ".join(r.get("error", "") for r in rows if "err" not in r))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", action="store_true", help="run on the attached NVIDIA GPU(s); writes accuracy-gpu.md")
    p.add_argument("--only", default=None, help="only the cases whose id contains this text (writes no file)")
    p.add_argument("--out", default=None, help="Markdown file to write (default: benchmarks/results/accuracy-<backend>.md)")
    a = p.parse_args(argv)
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    if a.gpu:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the card to the measuring process
    else:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={N_DEVICES}").strip()
        os.environ["JAX_PLATFORMS"] = "cpu"
    cases = [c for c in CASES if a.only is None or a.only in c.id]
    out = Path(a.out) if a.out else (None if a.only else ROOT / "benchmarks" / "results" /
                                     f"accuracy-{'gpu' if a.gpu else 'cpu'}.md")
    rows = run(cases, a.gpu, out)
    s = summary(rows)
    print(f"max |err| {_abs_pct(s['max_abs_err'])}, median |err| {_abs_pct(s['median_abs_err'])} over {s['at_least_100MB']} "
          f"cases >= 100 MB; wins vs classic {s['wins']}/{s['measured']}, transformers "
          f"{s['transformer_wins']}/{s['transformers']}")
    return 1 if s["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
