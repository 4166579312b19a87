"""Planning speed: fit searches, sweeps, the compile cache and one analysis, against their targets.

Every case is a fresh `jaxmem` process, timed wall-clock, median of REPEATS, each with its own
empty compile cache (JAXMEM_CACHE) unless it measures the cache:

1. `compare --find-batch`, Llama 1B preset, 8 x h100, dp/fsdp x remat none/full (4 rows): <= 90 s.
2. The 12-row `compare` example of docs/planning.md: <= 300 s cold; <= 10 s re-run on its cache (the
   targets were set for the GPT-2 XL grid the docs had before; `--only gpt2xl` times that one).
3. An 8-row sweep with --jobs 2 against --jobs 1: speed-up >= 1.7x.
4. One `analyze` of the gpt2-medium preset (unrolled) on 8 x h100 (`--single gpt2_cudnn`: with cuDNN
   attention): wall <= 1.25 x the time XLA spends on its HLO passes plus buffer assignment, read
   from XLA's own timers (TF_CPP_VMODULE=gpu_compiler=1,buffer_assignment=1) in the same run; the
   run's timeline (request sent, dump received, XLA's log) splits the rest, and the part of it that
   is JAX's and XLA's own work (imports, tracing and lowering, PJRT's conversion, the dump) gives
   the lowest ratio any analysis built this way can reach. Whole compiles in separate runs, with
   jaxmem's fast backend options and without, show what those options save.

    python benchmarks/planning.py            # all four; writes benchmarks/results/planning.md
    python benchmarks/planning.py --quick    # a smoke test on tiny models (1 repeat, writes nothing)
    python benchmarks/planning.py --only find_batch,sweep   # some cases: writes planning-find_batch-sweep.md

Run it on an idle machine: the targets are wall-clock.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JAXMEM = [sys.executable, "-m", "jaxmem.cli"]

FULL = {
    "find_batch": ["compare", "models/llama.py", "--arg", "preset=1b", "--gpu", "h100", "--mesh", "data=8",
                   "--layouts", "dp,fsdp", "--remats", "none,full", "--find-batch"],
    # the 12-row example of docs/planning.md (a scanned Llama 8B), and the GPT-2 XL grid it replaced (--only gpt2xl)
    "readme": ["compare", "models/llama.py", "--arg", "preset=8b", "--precision", "bf16", "--meshes", "data=8;data=16",
               "--remats", "none,full", "--batches", "16,32,64"],
    "gpt2xl": ["compare", "models/gpt2.py", "--arg", "preset=gpt2-xl", "--meshes", "data=8;data=4,model=2",
               "--layouts", "fsdp,fsdp_tp", "--batches", "16,32,64"],
    "sweep8": ["compare", "models/gpt2.py", "--arg", "preset=gpt2", "--gpu", "h100", "--mesh", "data=8",
               "--layouts", "dp,fsdp", "--remats", "none,full", "--precisions", "fp32,bf16"],
    "single": ["analyze", "models/gpt2.py", "--arg", "preset=gpt2-medium", "--gpu", "h100", "--mesh", "data=8"],
    # one row of the GPT-2 XL grid (--single gpt2xl_row): XLA's own time per row bounds that grid
    "gpt2xl_row": ["analyze", "models/gpt2.py", "--arg", "preset=gpt2-xl", "--gpu", "h100", "--mesh", "data=8",
                   "--layout", "fsdp", "--batch", "16"],
    # the same analysis with cuDNN flash attention (--single gpt2_cudnn): a custom-partitioned op,
    # whose partitioning XLA asks the parent for while the child compiles
    "gpt2_cudnn": ["analyze", "models/gpt2.py", "--arg", "preset=gpt2-medium", "--arg", "attention=cudnn",
                   "--precision", "bf16", "--gpu", "h100", "--mesh", "data=8"],
}
QUICK = {
    "find_batch": ["compare", "models/llama.py", "--arg", "preset=tiny", "--gpu", "h100", "--mesh", "data=2",
                   "--layouts", "dp", "--remats", "none,full", "--find-batch", "--mem-fraction", "0.002"],
    "readme": ["compare", "models/gpt2.py", "--arg", "preset=tiny", "--gpu", "h100", "--mesh", "data=2",
               "--layouts", "dp,fsdp", "--batches", "8,16"],
    "gpt2xl": ["compare", "models/gpt2.py", "--arg", "preset=tiny", "--gpu", "h100", "--mesh", "data=2",
               "--layouts", "dp", "--batches", "8,16"],
    "sweep8": ["compare", "models/gpt2.py", "--arg", "preset=tiny", "--gpu", "h100", "--mesh", "data=2",
               "--layouts", "dp,fsdp", "--batches", "8,16"],
    "single": ["analyze", "models/gpt2.py", "--arg", "preset=tiny", "--gpu", "h100", "--mesh", "data=2",
               "--batch", "8"],
}
TARGETS = {"find_batch_s": 90.0, "readme_cold_s": 300.0, "readme_warm_s": 10.0, "speedup": 1.7, "single_ratio": 1.25}

# The analysis run with XLA's timers on: the whole compile, in this process (not stopped after
# buffer assignment: XLA's backend timer is part of the table), with XLA's log let through to
# stderr (jaxmem captures it during a compile to keep one line of it); FAST=0 also turns the fast
# backend options off.
TIMED_CHILD = """
import contextlib, os, sys
import jaxmem.compiler.compiled as c
import jaxmem.compiler.early_stop as e
c._xla_log = lambda notes: contextlib.nullcontext()
e.applies = lambda target: False
if os.environ.get("PLANNING_FAST") == "0":
    c.FAST_GPU_OPTIONS = {}
from jaxmem.cli import entry
sys.argv = ["jaxmem", *sys.argv[1:]]
entry()
"""


# The analysis itself, as users run it (stopped after buffer assignment, in the compile child),
# with the child's XLA log echoed to stderr: XLA's timers for the same compile the wall clock
# measured (XLA's time varies by a few seconds from run to run on a shared machine, so a ratio
# of two separate runs is mostly that noise). Logging these two modules adds ~2,700 lines. It
# also prints when the compile request is sent and when the parent has the dump (PLANNING lines:
# epoch seconds), which with XLA's log timestamps split the wall clock into a timeline.
PAIRED_CHILD = """
import sys, time
import jaxmem.compiler.early_stop as e
_log, _send, _dump = e.Child._log_so_far, e._send, e._finished_dump
def log_so_far(self):
    log = _log(self)
    sys.stderr.write(log)
    return log
def send(stream, message):
    if isinstance(message, dict) and "module" in message:
        sys.stderr.write(f"PLANNING sent {time.time():.6f}\\n")
    _send(stream, message)
def finished_dump(*a, **k):
    data = _dump(*a, **k)
    if data is not None:
        sys.stderr.write(f"PLANNING dump {time.time():.6f}\\n")
    return data
e.Child._log_so_far, e._send, e._finished_dump = log_so_far, send, finished_dump
from jaxmem.cli import entry
sys.argv = ["jaxmem", *sys.argv[1:]]
entry()
"""


def run(args: list[str], cache: str, *, jobs: int | None = None, json_out: bool = True, env: dict | None = None,
        child: list[str] | None = None) -> dict:
    argv = (child or JAXMEM) + args + (["--jobs", str(jobs)] if jobs else []) + (["--json"] if json_out else [])
    t0, epoch0 = time.perf_counter(), time.time()
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "JAXMEM_CACHE": cache, **(env or {})})
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return {"wall_s": wall, "stdout": p.stdout, "stderr": p.stderr, "started": epoch0}


def fresh_cache() -> str:
    return tempfile.mkdtemp(prefix="jaxmem-bench-cache-")


def xla_timers(stderr: str) -> dict:
    """XLA's own timers for the jit_step module: HLO passes, buffer assignment, backend (seconds)."""
    def ts(line: str) -> float:
        m = re.match(r"[IWE]\d{4} (\d+):(\d+):([\d.]+)", line)
        return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))

    passes = backend = None
    t_passes_end = t_ba_done = None
    in_step_ba = False
    for line in stderr.splitlines():
        m = re.search(r"GpuCompiler::RunHloPasses for jit_step time: .*?\((\d+) us\)", line)
        if m:
            passes, t_passes_end = int(m.group(1)) / 1e6, ts(line)
        if "Assigning buffers to module jit_step" in line:
            in_step_ba = True
        if in_step_ba and "Buffer assignment done" in line and t_ba_done is None:
            t_ba_done = ts(line)
        m = re.search(r"GpuCompiler::RunBackend for jit_step time: .*?\((\d+) us\)", line)
        if m:
            backend = int(m.group(1)) / 1e6
    if passes is None or t_ba_done is None:
        raise SystemExit("XLA's timers were not found in the log (TF_CPP_VMODULE)")
    ba = t_ba_done - t_passes_end
    # time of day (the log's clock) when the passes started and buffer assignment was done
    return {"hlo_passes_s": passes, "buffer_assignment_s": ba, "passes_plus_ba_s": passes + ba,
            "backend_s": backend, "backend_after_ba_s": None if backend is None else backend - ba,
            "passes_start_tod": t_passes_end - passes, "ba_done_tod": t_ba_done}


def run_imports() -> float:
    """Wall clock of a Python process that only imports what any Flax training step needs."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import jax, flax.linen, optax"], cwd=ROOT, check=True)
    return time.perf_counter() - t0


# the parts of the timeline that are JAX's and XLA's own work (with the imports: the floor)
LOWERING = "  of it: tracing and lowering the step (jax)"
TO_PASSES = "request sent until XLA's passes start (child: MLIR read, StableHLO to HLO through PJRT)"
DUMP_WRITE = "buffer assignment done until the parent has the dump (XLA writes it)"


def timeline(r: dict, xla: dict) -> dict:
    """The paired run's wall clock, part by part, from its PLANNING lines and XLA's log timestamps."""
    marks = dict(re.findall(r"^PLANNING (sent|dump) ([\d.]+)$", r["stderr"], re.M))
    midnight = datetime.datetime.fromtimestamp(r["started"]).replace(hour=0, minute=0, second=0,
                                                                      microsecond=0).timestamp()
    sent, dump = float(marks["sent"]), float(marks["dump"])
    passes, ba_done = midnight + xla["passes_start_tod"], midnight + xla["ba_done_tod"]
    t = json.loads(r["stdout"])["timings"]
    return {
        "process start until the compile request is sent": sent - r["started"],
        "  of it: loading the model, the target, the abstract state": t["build_s"],
        LOWERING: t["lower_s"],
        TO_PASSES: passes - sent,
        "XLA's passes + buffer assignment": ba_done - passes,
        DUMP_WRITE: dump - ba_done,
        "dump to exit (HLO text, buffer assignment, step time, runtime model, report)":
            r["started"] + r["wall_s"] - dump,
    }


def median(xs):
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny models, one repeat, nothing written")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="find_batch,readme,sweep,single",
                    help="cases to run (comma-separated): find_batch, readme, gpt2xl, sweep, single")
    ap.add_argument("--single", default="single", choices=["single", "gpt2xl_row", "gpt2_cudnn"],
                    help="the analysis the `single` case times (gpt2xl_row: one row of the GPT-2 XL grid; "
                         "gpt2_cudnn: gpt2-medium with cuDNN attention)")
    ns = ap.parse_args()
    only = set(ns.only.split(","))
    cases, repeats = (QUICK, 1) if ns.quick else (FULL, ns.repeats)
    if ns.single != "single" and not ns.quick:
        cases = {**cases, "single": cases[ns.single]}
    load0 = os.getloadavg()[0]
    res: dict = {}

    def note(msg):
        print(msg, file=sys.stderr, flush=True)

    # 1. fit search, cold cache
    walls, compiles = [], None
    for _ in range(repeats if "find_batch" in only else 0):
        r = run(cases["find_batch"], fresh_cache())
        walls.append(r["wall_s"])
        rows = json.loads(r["stdout"])
        compiles = [(x["choice"], x["search"]["answer"] if x["search"] else None,
                     x["search"]["compiles"] if x["search"] else None, x["error"]) for x in rows]
        note(f"find-batch: {r['wall_s']:.1f} s {compiles}")
    if walls:
        res["find_batch_s"], res["find_batch_rows"] = median(walls), compiles
        res["runs"] = {"find-batch, cold (s)": walls}

    # 2. the docs' 12-row example (and, asked for, the GPT-2 XL grid it replaced), cold then warm on the same cache
    for name in ("readme", "gpt2xl"):
        cold, warm = [], []
        for _ in range(repeats if name in only else 0):
            cache = fresh_cache()
            c = run(cases[name], cache)
            w = run(cases[name], cache)
            assert w["stdout"] == c["stdout"], "a cached sweep printed other rows than the cold one"
            cold.append(c["wall_s"])
            warm.append(w["wall_s"])
            note(f"{name}: cold {c['wall_s']:.1f} s, warm {w['wall_s']:.1f} s")
        if cold:
            res[f"{name}_cold_s"], res[f"{name}_warm_s"] = median(cold), median(warm)
            res[f"{name}_rows"] = len(json.loads(c["stdout"]))
            res.setdefault("runs", {}).update({f"{name}, cold (s)": cold, f"{name}, re-run (s)": warm})

    # 3. parallel speed-up, each cold
    one, two = [], []
    for _ in range(repeats if "sweep" in only else 0):
        a = run(cases["sweep8"], fresh_cache(), jobs=1)
        b = run(cases["sweep8"], fresh_cache(), jobs=2)
        one.append(a["wall_s"])
        two.append(b["wall_s"])
        note(f"sweep: --jobs 1 {a['wall_s']:.1f} s, --jobs 2 {b['wall_s']:.1f} s")
    if one:
        res["sweep_rows"] = len(json.loads(a["stdout"]))
        res["jobs1_s"], res["jobs2_s"] = median(one), median(two)
        res["speedup"] = res["jobs1_s"] / res["jobs2_s"]
        res.setdefault("runs", {}).update({"sweep, --jobs 1 (s)": one, "sweep, --jobs 2 (s)": two,
                                           "sweep, speed-up of each repeat": [a / b for a, b in zip(one, two)]})

    # 4. one analysis against XLA's own timers of the same compile (paired), and, for the table,
    # the whole compile's timers with jaxmem's options and with XLA's defaults
    walls, paired, ratios, timers, timers_slow, parts, imports, floors = [], [], [], [], [], [], [], []
    log_env = {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "gpu_compiler=1,buffer_assignment=1"}
    child = [sys.executable, "-c", TIMED_CHILD]
    for _ in range(repeats if "single" in only else 0):
        r = run(cases["single"] + ["--no-cache", "--timings"], fresh_cache(), env=log_env,
                child=[sys.executable, "-c", PAIRED_CHILD])
        walls.append(r["wall_s"])
        paired.append(xla_timers(r["stderr"]))
        parts.append(timeline(r, paired[-1]))
        imports.append(run_imports())
        floors.append(imports[-1] + sum(parts[-1][k] for k in (LOWERING, TO_PASSES, DUMP_WRITE)))
        ratios.append(walls[-1] / paired[-1]["passes_plus_ba_s"])
        timers.append(xla_timers(run(cases["single"] + ["--no-cache"], fresh_cache(), env=log_env,
                                     child=child)["stderr"]))
        timers_slow.append(xla_timers(run(cases["single"] + ["--no-cache"], fresh_cache(),
                                          env={**log_env, "PLANNING_FAST": "0"}, child=child)["stderr"]))
        note(f"single: {walls[-1]:.1f} s, its XLA passes + BA {paired[-1]['passes_plus_ba_s']:.1f} s "
             f"({ratios[-1]:.2f}x); whole compile, fast options {timers[-1]}; XLA default {timers_slow[-1]}")
    if walls:
        res["single_s"] = median(walls)
        res["single_xla_s"] = median([t["passes_plus_ba_s"] for t in paired])
        res["xla"] = {k: median([t[k] for t in timers]) for k in timers[0] if timers[0][k] is not None}
        res["xla_default"] = {k: median([t[k] for t in timers_slow]) for k in timers_slow[0]
                              if timers_slow[0][k] is not None}
        res["single_ratio"] = median(ratios)
        res["single_parts"] = {k: median([p[k] for p in parts]) for k in parts[0]}
        res["imports_s"], res["floor_s"] = median(imports), median(floors)
        res["floor_ratio"] = median([(x["passes_plus_ba_s"] + f) / x["passes_plus_ba_s"] for x, f in zip(paired, floors)])
        res.setdefault("runs", {}).update({
            "python start + import jax, flax.linen, optax alone (s)": imports,
            "one analysis, wall (s)": walls,
            "its compile's XLA HLO passes + buffer assignment (s)": [t["passes_plus_ba_s"] for t in paired],
            "their ratio, run by run": ratios,
            "whole compile in a separate run, XLA HLO passes + buffer assignment (s)":
                [t["passes_plus_ba_s"] for t in timers]})
    res["load_start"], res["load_end"] = load0, os.getloadavg()[0]

    table = render(res, cases, repeats)
    print(table)
    if not ns.quick:
        name = "planning.md" if only >= {"find_batch", "readme", "sweep", "single"} and ns.single == "single" else \
            f"planning-{'-'.join(sorted(only | ({ns.single} - {'single'})))}.md"
        (ROOT / "benchmarks" / "results" / name).write_text(table)


def render(res: dict, cases: dict, repeats: int) -> str:
    def ok(v, t, le=True):
        return "yes" if (v <= t if le else v >= t) else "NO"

    cmd = {k: "jaxmem " + " ".join(a if " " not in a and ";" not in a else f"'{a}'" for a in v)
           for k, v in cases.items()}
    lines = [
        "# jaxmem planning speed",
        "",
        f"Machine: {os.cpu_count()} cores ({platform.processor() or platform.machine()}); Python "
        f"{platform.python_version()}; {datetime.date.today()}. Command: `python benchmarks/planning.py`. "
        f"Median of {repeats}; every run a fresh process with an empty compile cache unless it says re-run. "
        f"Load average {res['load_start']:.1f} at the start, {res['load_end']:.1f} at the end.",
        "",
        "| case | measured | target | ok |",
        "|---|---:|---:|---|",
    ]
    if "find_batch_s" in res:
        lines.append(f"| `--find-batch`, {len(res['find_batch_rows'])} rows, cold | {res['find_batch_s']:.1f} s | "
                     f"<= 90 s | {ok(res['find_batch_s'], TARGETS['find_batch_s'])} |")
    for name, label in (("readme", "the 12-row compare example of docs/planning.md (Llama 8B)"), ("gpt2xl", "the GPT-2 XL grid it replaced")):
        if f"{name}_cold_s" in res:
            lines.append(f"| {label}, {res[f'{name}_rows']} rows, cold | {res[f'{name}_cold_s']:.1f} s | <= 300 s | "
                         f"{ok(res[f'{name}_cold_s'], TARGETS['readme_cold_s'])} |")
            lines.append(f"| the same, re-run (cache) | {res[f'{name}_warm_s']:.1f} s | <= 10 s | "
                         f"{ok(res[f'{name}_warm_s'], TARGETS['readme_warm_s'])} |")
    if "speedup" in res:
        lines.append(f"| {res['sweep_rows']}-row sweep, `--jobs 1` / `--jobs 2` | {res['jobs1_s']:.1f} s / "
                     f"{res['jobs2_s']:.1f} s = {res['speedup']:.2f}x | >= 1.7x | "
                     f"{ok(res['speedup'], TARGETS['speedup'], le=False)} |")
    if "single_s" in res:
        x = res["xla"]
        lines.append(f"| one analysis / its own compile's XLA HLO passes + buffer assignment (median of the "
                     f"per-run ratios) | {res['single_s']:.1f} s / {res['single_xla_s']:.1f} s (medians); "
                     f"{res['single_ratio']:.2f}x | <= 1.25x | "
                     f"{ok(res['single_ratio'], TARGETS['single_ratio'])} |")
    if "find_batch_rows" in res:
        lines += ["", "Fit search, compiles per row (last run): " + "; ".join(
            f"{' '.join(f'{k}={v}' for k, v in ch.items())}: batch {ans}, {n} compiles" + (f" ({err})" if err else "")
            for ch, ans, n, err in res["find_batch_rows"])]
    if "single_s" in res:
        x, xd = res["xla"], res["xla_default"]
        lines += [
            "",
            "XLA's own timers (`TF_CPP_VMODULE=gpu_compiler=1,buffer_assignment=1`), seconds. The ratio above "
            "reads them from the analysis' own compile child (its log echoed: the same compile the wall clock "
            "timed); the table below, from whole compiles in separate runs (the backend's time is only there):",
            "",
            "| compile options | HLO passes | buffer assignment | backend after buffer assignment |",
            "|---|---:|---:|---:|",
            f"| jaxmem's (fast backend options) | {x['hlo_passes_s']:.1f} | {x['buffer_assignment_s']:.1f} | "
            f"{x.get('backend_after_ba_s', float('nan')):.1f} |",
            f"| XLA's defaults | {xd['hlo_passes_s']:.1f} | {xd['buffer_assignment_s']:.1f} | "
            f"{xd.get('backend_after_ba_s', float('nan')):.1f} |",
        ]
    if "single_parts" in res:
        lines += ["", "Where the single analysis' wall clock goes (medians, seconds; the run's own timestamps: when "
                  "the compile request was sent and the dump received, XLA's log for its passes and buffer "
                  "assignment, `--timings` for the two parts marked \"of it\"):", "",
                  "| part | s |", "|---|---:|",
                  *[f"| {k.replace('  of it:', '&nbsp;&nbsp;of it:')} | {v:.2f} |" for k, v in res["single_parts"].items()]]
        lines += ["", f"What any analysis that traces the step with JAX and compiles it through PJRT pays besides "
                  f"XLA's passes + buffer assignment, measured in these runs: Python start and the import of jax, "
                  f"flax.linen and optax ({res['imports_s']:.2f} s, a process that does only that), tracing and "
                  f"lowering the step, the request until XLA's passes start, and XLA writing its dump: "
                  f"{res['floor_s']:.2f} s, so no analysis built this way gets below **{res['floor_ratio']:.2f}x** on "
                  f"this machine for this step (median of the per-run ratios). The rest of the wall clock "
                  f"({res['single_s'] - res['single_xla_s'] - res['floor_s']:.2f} s of the medians) is loading the "
                  f"model file and its abstract state (jax.eval_shape of its init), jaxmem's checks, reading the "
                  f"dump, the step time and the report."]
    if res.get("runs"):
        lines += ["", "Every run (in order; the table shows medians):", ""]
        lines += [f"- {k}: {', '.join(f'{v:.2f}' for v in vs)}" for k, vs in res["runs"].items()]
    lines += ["", "Commands:", "", *[f"- {k}: `{c}`" for k, c in cmd.items()], ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
