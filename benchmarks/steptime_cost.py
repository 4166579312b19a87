"""What the step-time estimate costs the analysis of README command 1 (issue 37: at most 10% of it).

    python benchmarks/steptime_cost.py      # -> benchmarks/results/steptime-cost.md

One `jaxmem.analyze` of command 1 (models/llama.py --mesh data=8 --remat full --precision bf16, H100),
then `steptime.estimate` again on the program that analysis built, best of 5, and its passes: the
kernel list, the schedule's simulation at the three ends of the band, the unoverlapped collectives.
Wall times on this machine, so they move with its load (printed beside them).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "benchmarks" / "results" / "steptime-cost.md"


def best(fn, n: int = 5) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    import jax

    import jaxmem
    from jaxmem.compiler import kernels, rates, schedule, steptime

    saved: dict = {}
    real = steptime.estimate

    def keep(hlo, **kw):
        saved.update(module=hlo, kw=kw)
        return real(hlo, **kw)

    # the analysis calls the estimate through the module that imported it: swap it there too
    holders = [m for m in list(sys.modules.values()) if getattr(m, "estimate", None) is real]
    for m in holders:
        m.estimate = keep
    load = os.getloadavg()[0]
    t = time.perf_counter()
    jaxmem.analyze("models/llama.py", mesh="data=8", remat="full", precision="bf16", gpu="h100", cache=False)
    total = time.perf_counter() - t
    for m in holders:
        m.estimate = real
    module, kw = saved["module"], saved["kw"]
    perf = steptime.targets.performance("h100")
    r = rates.rates("h100", perf)
    colls = steptime.collectives(module, kw["mesh_axes"])
    ks = kernels.kernels(module)
    rows = [
        ("steptime.estimate (all of it)", best(lambda: real(module, **kw))),
        ("the kernel list (kernels.kernels)", best(lambda: kernels.kernels(module))),
        ("one simulation of the schedule (rates.simulate)", best(lambda: rates.simulate(module, ks, colls, perf, r, 8))),
        ("the collectives with no kernel beside them (schedule.unoverlapped_collective_seconds)",
         best(lambda: schedule.unoverlapped_collective_seconds(module, colls, ks, perf, r, 8))),
    ]
    lines = ["# What the step-time estimate costs README command 1", "",
             f"`python benchmarks/steptime_cost.py` ({time.strftime('%Y-%m-%d')}; jax {jax.__version__}; load average "
             f"{load:.1f} at the start). One `jaxmem.analyze` of command 1 without the cache took {total:.2f} s; each "
             "row is the best of 5 runs on the program it built.", "",
             "| part | seconds | share of the analysis |", "|---|---:|---:|"]
    lines += [f"| {name} | {s:.4f} | {s / total:.1%} |" for name, s in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.write_text(text)


if __name__ == "__main__":
    main()
