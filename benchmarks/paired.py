"""README command 1 on two environments, run in turn: wall time and the CPU time of the whole process tree.

On a shared, loaded machine wall time measures the neighbours as much as jaxmem; CPU time (user + sys)
does not. Each run is `python -m jaxmem.cli analyze models/llama.py --mesh data=8 --remat full --precision
bf16 --timings --no-cache --json` under a wrapper that is the child subreaper of everything below it
(prctl PR_SET_CHILD_SUBREAPER), so the compile child (jaxmem/compiler/early_stop.py, killed after buffer
assignment and reaped by a thread that may not finish before jaxmem exits) is reaped into the wrapper's
RUSAGE_CHILDREN whoever reaps it: the CPU columns are jaxmem and its compile child together.

    python benchmarks/paired.py A=/work/venv12/bin/python B=/work/venv13/bin/python [--runs 3] [--warmup 1]

Prints, per environment, min/median/max of wall, tree user, tree sys, tree CPU and jaxmem's own `compile_s`
and `total_s` (--timings), then the ratios A/B pair by pair (run i of A against run i of B).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ["-m", "jaxmem.cli", "analyze", "models/llama.py", "--mesh", "data=8", "--remat", "full", "--precision",
           "bf16", "--timings", "--no-cache", "--json"]
# run argv[1:] as the child subreaper of its whole tree; print the tree's rusage (and its output) as JSON
WRAPPER = """
import ctypes, json, os, resource, subprocess, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
t0 = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
wall = time.perf_counter() - t0
while True:   # orphans of the tree (a compile child jaxmem left to a thread) are reparented here
    try:
        os.wait()
    except ChildProcessError:
        break
r = resource.getrusage(resource.RUSAGE_CHILDREN)
json.dump({"rc": p.returncode, "wall": wall, "user": r.ru_utime, "sys": r.ru_stime,
           "stdout": p.stdout.decode(errors="replace"), "stderr": p.stderr.decode(errors="replace")[-3000:]},
          sys.stdout)
"""


def once(python: str, env: dict[str, str]) -> dict:
    proc = subprocess.run([python, "-c", WRAPPER, python, *COMMAND], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True)
    data = json.loads(proc.stdout)
    if data["rc"] not in (0, 3):
        raise SystemExit(f"{python}: exit {data['rc']}\n{data['stderr']}")
    timings = json.loads(data["stdout"]).get("timings") or {}
    return {"wall": data["wall"], "user": data["user"], "sys": data["sys"], "cpu": data["user"] + data["sys"],
            "compile_s": timings.get("compile_s", float("nan")), "total_s": timings.get("total_s", float("nan")),
            "load": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("envs", nargs=2, metavar="LABEL=PYTHON", help="the two interpreters, A then B")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()
    envs = [(lab, py) for lab, _, py in (e.partition("=") for e in a.envs)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(a.warmup):
        for _, py in envs:
            once(py, env)
    runs: dict[str, list[dict]] = {lab: [] for lab, _ in envs}
    for i in range(a.runs):
        for lab, py in envs if i % 2 == 0 else envs[::-1]:   # alternate which goes first
            runs[lab].append(once(py, env))
            print(f"{lab} run {len(runs[lab])}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[lab][-1].items()),
                  file=sys.stderr, flush=True)
    (la, _), (lb, _) = envs
    keys = ("wall", "user", "sys", "cpu", "compile_s", "total_s")
    print(f"{'':22}{'min':>10}{'median':>10}{'max':>10}   n {a.runs} each, warm-up {a.warmup}; "
          f"1-minute load {min(r['load'] for v in runs.values() for r in v):.1f}-"
          f"{max(r['load'] for v in runs.values() for r in v):.1f} ({os.cpu_count()} cores), "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for lab in (la, lb):
        for k in keys:
            xs = [r[k] for r in runs[lab]]
            print(f"{lab + ' ' + k + ' s':22}{min(xs):10.3f}{statistics.median(xs):10.3f}{max(xs):10.3f}")
    for k in keys:
        xs = [ra[k] / rb[k] for ra, rb in zip(runs[la], runs[lb], strict=True)]
        print(f"{la + '/' + lb + ' ' + k:22}{min(xs):10.3f}{statistics.median(xs):10.3f}{max(xs):10.3f}")


if __name__ == "__main__":
    main()
