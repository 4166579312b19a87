"""Which memory limit XLA:GPU's scheduler and rematerialization read, settled by compiles (issue 52, item 3).

XLA:GPU budgets a step's temporaries against one limit (xla/service/gpu/gpu_hlo_schedule.cc,
GetSchedulerMemoryLimit): a base -- the module config's ``device_memory_size`` when set, else 80% of the
device description's ``device_memory_size`` -- less the step's inputs and outputs, times
``--xla_gpu_memory_limit_slop_factor`` / 100 (default 95). A JAX run on a card sets the module's
``device_memory_size`` to its allocator's ``bytes_limit`` (jaxlib's PjRt client compiles with
``ExecutableBuildOptions.set_device_memory_size(bytes_limit)``; BFC's and cuda_async's bytes_limit are
total x fraction), so a run compiles against its pool; a deviceless compile has no allocator, and XLA
takes 80% of the topology's ``device_memory_size``.

This compiles one step near its card's limit (Llama 1B, dp over 8 H100s, 29 sequences of 256 per device:
tests/test_pipeline.py's step that XLA rematerializes on jax 0.10.2) in a fresh child per row:

* slop 95 / 88 / 85 (``XLA_FLAGS=--xla_gpu_memory_limit_slop_factor=N``, as a user would set it);
* XLA_PYTHON_CLIENT_MEM_FRACTION=0.50 and 0.95 in the environment of the deviceless compile (does the
  compiler read the fraction itself?);
* the topology's device_memory_size set to total x fraction / 0.8 (0.75, 0.90), so that XLA's 80% base
  is the pool a run at that fraction compiles against -- what the run's own compile sees.

Each row: XLA's temporaries, the instructions XLA's rematerialization pass recomputed (``*.remat``
clones, jaxmem.compiler.compiled.xla_rematerialized) and the limit GetSchedulerMemoryLimit gives for that
row (jaxmem.compiler.schedule.scheduler_memory_limit). Prints a markdown table; commit it as
benchmarks/results/xla-budget.md:

    python benchmarks/xla_budget.py > benchmarks/results/xla-budget.md
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU = "h100"
STEP = {"model": "models/llama.py", "gpu": GPU, "mesh": "data=8", "layout": "dp", "batch": 232,
        "args": {"preset": "1b", "seq_len": 256}}

CHILD = r"""
import dataclasses, json, sys
from jaxmem.compiler import catalogue, targets
from jaxmem.compiler import compiled as compiled_mod
step, scale = json.loads(sys.argv[1]), float(sys.argv[2])
if scale != 1.0:   # the topology's device_memory_size scaled: XLA's 80% base becomes total x fraction
    spec = catalogue.CATALOGUE[step["gpu"]]
    catalogue.CATALOGUE[step["gpu"]] = dataclasses.replace(spec, memory_bytes=int(spec.memory_bytes * scale))
    targets.CATALOGUE[step["gpu"]] = catalogue.CATALOGUE[step["gpu"]]
import jaxmem
from jaxmem.analysis import stages
seen = {}
orig = stages.measure
def measure(c):
    seen["remat"] = compiled_mod.xla_rematerialized(c.art.hlo_text)
    return orig(c)
stages.measure = measure
stages.as_written = lambda *a, **k: None   # the row's own compile only
model = step.pop("model")
r = jaxmem.analyze(model, explain=False, cache=False, **step)
print(json.dumps({"temp": r.xla["temp"], "argument": r.xla["argument"], "output": r.xla["output"],
                  "alias": r.xla["alias"], "memory": r.target.memory_bytes, "remat": seen.get("remat", 0),
                  "passed": r.xla_flags.get("passed", [])}))
"""


def row(label: str, env: dict[str, str], scale: float = 1.0) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAXMEM_CACHE"))}
    e.update(env)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(STEP), str(scale)], cwd=ROOT, env=e,
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{label}: {out.stderr[-3000:]}")
    d = json.loads(out.stdout.strip().splitlines()[-1])
    d |= {"label": label, "env": env, "scale": scale, "wall_s": time.perf_counter() - t0}
    return d


def main() -> None:
    from jaxmem.compiler import schedule   # noqa: PLC0415 -- jax-free; after argv, like the rows

    total = None
    rows = []
    for slop in (95, 88, 85):
        env = {} if slop == 95 else {"XLA_FLAGS": f"--xla_gpu_memory_limit_slop_factor={slop}"}
        rows.append((slop, 0.80, row(f"slop {slop}" + (" (XLA's default)" if slop == 95 else ""), env)))
    for frac in ("0.50", "0.95"):
        rows.append((95, 0.80, row(f"XLA_PYTHON_CLIENT_MEM_FRACTION={frac} (deviceless)",
                                   {"XLA_PYTHON_CLIENT_MEM_FRACTION": frac})))
    for frac in (0.75, 0.90):
        rows.append((95, frac, row(f"device_memory_size = total x {frac} / 0.8 (a run at fraction {frac})", {},
                                   scale=frac / 0.8)))
    gib = 2 ** 30
    print(f"# XLA:GPU's memory limit, settled by compiles (issue 52)\n")
    print(f"Step: `jaxmem analyze {STEP['model']} --gpu {GPU} --mesh {STEP['mesh']} --layout {STEP['layout']} "
          f"--batch {STEP['batch']} --arg preset=1b --arg seq_len=256 --no-explain --no-cache`, each row a fresh "
          f"process (`python benchmarks/xla_budget.py`).\n")
    print("| row | base of the limit | slop | XLA's limit (GetSchedulerMemoryLimit) | XLA temporaries | "
          "rematerialized instructions | compile s |")
    print("|---|---|---|---|---|---|---|")
    for slop, share, d in rows:
        total = total or d["memory"] if d["scale"] == 1.0 else total
        card = int(d["memory"] / d["scale"])
        io = d["argument"] + d["output"] - d["alias"]
        base = int(schedule.SCHEDULER_MEMORY_SHARE * d["memory"])
        limit = schedule.scheduler_memory_limit(d["memory"], io, slop)
        print(f"| {d['label']} | {base / gib:.2f} GiB ({share:.0%} of {card / gib:.2f} GiB) | {slop} | "
              f"{limit / gib:.2f} GiB | {d['temp'] / gib:.2f} GiB | {d['remat']} | {d['wall_s']:.0f} |")
    print()
    print("XLA_FLAGS passed to each compile: " + "; ".join(
        f"{d['label']}: {' '.join(d['passed']) or '-'}" for _, _, d in rows))


if __name__ == "__main__":
    main()
