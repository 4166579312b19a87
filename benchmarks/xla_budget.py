"""Which memory limit XLA:GPU's scheduler and rematerialization read, settled by compiles (issue 52, item 3).

XLA:GPU budgets a step's temporaries against one limit (xla/service/gpu/gpu_hlo_schedule.cc,
GetSchedulerMemoryLimit): a base -- the module config's ``device_memory_size`` when set, else 80% of the
device description's ``device_memory_size`` -- less the step's inputs and outputs, times
``--xla_gpu_memory_limit_slop_factor`` / 100 (default 95). A JAX run on a card sets the module's
``device_memory_size`` to its allocator's ``bytes_limit`` (jaxlib's PjRt client compiles with
``ExecutableBuildOptions.set_device_memory_size(bytes_limit)``; BFC's and cuda_async's bytes_limit are
total x fraction), so a run compiles against its pool; a deviceless compile has no allocator, and XLA
takes 80% of the topology's ``device_memory_size``.

jaxmem compiles with the run's limit: a catalogue card's deviceless topology is told the run's pool / 0.8
(jaxmem.compiler.targets.xla_device_memory), so that XLA's 80% of it is the pool; under the platform allocator
(no bytes_limit) a run's compile budgets 80% of the card, as a deviceless compile told the card's size.

This compiles one step near its card's limit (Llama 1B, dp over 8 H100s, 29 sequences of 256 per device:
tests/test_pipeline.py's step that XLA rematerializes on jax 0.10.2) in a fresh child per row:

* XLA's own base, 80% of the card (``--allocator platform``: what every deviceless compile used before jaxmem
  gave it the run's pool), at slop 95 / 88 / 85 (``XLA_FLAGS=--xla_gpu_memory_limit_slop_factor=N``);
* XLA_PYTHON_CLIENT_MEM_FRACTION=0.50 and 0.95 in the compile's environment under that allocator, which reads
  no fraction (does the compiler read the fraction itself?);
* a run at fraction 0.75 (JAX's default, jaxmem's default compile) and 0.90 (the variable set): the base is
  the pool;
* the 0.75 row's step compiled again where XLA rematerializes nothing (the report's xla_remat: 4 x the card).

Each row: XLA's temporaries, the instructions XLA's rematerialization pass recomputed (``*.remat``
clones, jaxmem.compiler.compiled.xla_rematerialized), the limit the report says XLA held them to
(target.xla_memory_limit_bytes) and its base, the peak and the step estimate. Prints a markdown table; commit
it as benchmarks/results/xla-budget.md:

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
import json, sys
from jaxmem.compiler import compiled as compiled_mod
import jaxmem
from jaxmem.analysis import stages
step, free = json.loads(sys.argv[1]), sys.argv[2] == "1"
seen = {}
orig = stages.measure
def measure(c):
    seen["remat"] = compiled_mod.xla_rematerialized(c.art.hlo_text)
    return orig(c)
stages.measure = measure
if not free:   # the row's own compile only
    stages.without_remat = lambda *a, **k: None
model = step.pop("model")
r = jaxmem.analyze(model, explain=False, cache=False, **step)
print(json.dumps({"temp": r.xla["temp"], "memory": r.target.memory_bytes, "base": r.target.xla_memory_base_bytes,
                  "limit": r.target.xla_memory_limit_bytes, "slop": r.target.xla_slop_factor,
                  "remat": seen.get("remat", 0), "peak": r.per_device_peak_bytes, "verdict": r.verdict,
                  "step_s": r.step_time.get("estimate_s"), "xla_remat": r.xla_remat,
                  "passed": r.xla_flags.get("passed", [])}))
"""


def row(label: str, env: dict[str, str], options: dict | None = None, free: bool = False) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAXMEM_CACHE"))}
    e.update(env)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps({**STEP, **(options or {})}), "1" if free else "0"],
                         cwd=ROOT, env=e, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{label}: {out.stderr[-3000:]}")
    d = json.loads(out.stdout.strip().splitlines()[-1])
    d |= {"label": label, "env": env, "options": options or {}, "wall_s": time.perf_counter() - t0}
    return d


def main() -> None:
    platform = {"allocator": "platform"}
    rows = []
    for slop in (95, 88, 85):
        env = {} if slop == 95 else {"XLA_FLAGS": f"--xla_gpu_memory_limit_slop_factor={slop}"}
        rows.append(row(f"80% of the card (platform allocator), slop {slop}" + (" (XLA's default)" if slop == 95
                                                                                 else ""), env, platform))
    for frac in ("0.50", "0.95"):
        rows.append(row(f"80% of the card, XLA_PYTHON_CLIENT_MEM_FRACTION={frac} in the compile's environment",
                        {"XLA_PYTHON_CLIENT_MEM_FRACTION": frac}, platform))
    rows.append(row("a run at fraction 0.75 (JAX's default BFC; jaxmem's default compile)", {}))
    rows.append(row("a run at fraction 0.90 (XLA_PYTHON_CLIENT_MEM_FRACTION=0.90)",
                    {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.90"}))
    free = row("a run at fraction 0.75, and the step without XLA's rematerialization", {}, free=True)
    gib = 2 ** 30
    print("# XLA:GPU's memory limit, settled by compiles (issue 52)\n")
    print(f"Step: `jaxmem analyze {STEP['model']} --gpu {GPU} --mesh {STEP['mesh']} --layout {STEP['layout']} "
          f"--batch {STEP['batch']} --arg preset=1b --arg seq_len=256 --no-explain --no-cache`, each row a fresh "
          f"process (`python benchmarks/xla_budget.py`).\n")
    print("| row | base of the limit | slop | XLA's limit (target.xla_memory_limit_bytes) | XLA temporaries | "
          "rematerialized instructions | peak | verdict | step estimate | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d in rows:
        print(f"| {d['label']} | {d['base'] / gib:.2f} GiB ({d['base'] / d['memory']:.0%} of {d['memory'] / gib:.2f} "
              f"GiB) | {d['slop']} | {d['limit'] / gib:.2f} GiB | {d['temp'] / gib:.2f} GiB | {d['remat']} | "
              f"{d['peak'] / gib:.2f} GiB | {d['verdict']} | {d['step_s'] * 1e3:.1f} ms | {d['wall_s']:.0f} |")
    x = free["xla_remat"]
    print()
    print(f"The 0.75 row with its second compile (report's xla_remat, {free['wall_s']:.0f} s for both): XLA "
          f"rematerialized {x['instructions']} instructions, {x['launches']} kernel launches of "
          f"{x['seconds'] * 1e6:.0f} us in the step estimate; compiled again where XLA's base is "
          f"{x['unconstrained_xla_memory_base_bytes'] / gib:.0f} GiB it recomputes {x['unconstrained_instructions']}: "
          f"peak {x['unconstrained_peak_bytes'] / gib:.2f} GiB (vs {free['peak'] / gib:.2f}), step "
          f"{x['unconstrained_step_s'] * 1e3:.1f} ms (vs {free['step_s'] * 1e3:.1f}).")
    print()
    print("XLA_FLAGS passed to each compile: " + "; ".join(
        f"{d['label']}: {' '.join(d['passed']) or '-'}" for d in rows))


if __name__ == "__main__":
    main()
