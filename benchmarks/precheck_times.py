"""The first answer in seconds (issue 35, item 8): how long a typo takes to be reported.

Runs each command below as a user would (`python -m jaxmem.cli ...`, a fresh process each time),
several times, and prints a markdown table: the median wall time, the exit code and the message's
first line. `--tree DIR` times another checkout (e.g. the commit before jaxmem/precheck.py:
`git archive <commit> | tar -x -C /tmp/before`), so the two tables compare the same commands on the
same machine; the 1-minute load average is printed with each table (the machine may be shared).

    python benchmarks/precheck_times.py [--tree DIR] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COMMANDS = [
    ("missing model file", ["analyze", "nosuch.py"]),
    ("missing, a sibling close", ["analyze", "models/lama.py"]),
    ("unknown --gpu", ["analyze", "models/mlp.py", "--gpu", "h1000"]),
    ("unknown mesh role", ["analyze", "models/mlp.py", "--mesh", "fsdpp=8"]),
    ("unknown remat policy", ["analyze", "models/mlp.py", "--remat", "fulll"]),
    ("unknown layout", ["analyze", "models/mlp.py", "--layout", "fsdpp"]),
    ("--hosts not dividing the mesh",
     ["analyze", "models/mlp.py", "--gpu", "h100", "--mesh", "data=6", "--hosts", "4"]),
    ("cpu mesh over XLA_FLAGS' devices", ["analyze", "models/mlp.py", "--gpu", "cpu", "--mesh", "data=16"]),
    ("compare: missing model file", ["compare", "nosuch.py", "--layouts", "dp,fsdp"]),
    ("advise: unknown --gpu", ["advise", "models/mlp.py", "--gpu", "h1000"]),
]


def time_one(tree: Path, argv: list[str]) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "jaxmem.cli", *argv], cwd=tree, env=env, capture_output=True,
                       text=True, timeout=600)
    wall = time.perf_counter() - t0
    lines = [line for line in p.stderr.splitlines() if line.strip() and not line.startswith(("Usage:", "Try "))]
    return wall, p.returncode, (lines[-1] if lines else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout to time (default: this one)")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"tree: {a.tree}; python {sys.version.split()[0]}; {os.cpu_count()} cores; 1-minute load {load:.1f} "
          f"at the start; median of {a.runs} runs (after one not counted)\n")
    print("| typo | command | exit | wall s (median) | min-max | message |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, argv in COMMANDS:
        time_one(a.tree, argv)   # warm the file cache
        runs = [time_one(a.tree, argv) for _ in range(a.runs)]
        walls = [r[0] for r in runs]
        msg = runs[-1][2].replace("|", "\\|")
        msg = msg if len(msg) <= 110 else msg[:107] + "..."
        print(f"| {name} | `jaxmem {' '.join(argv)}` | {runs[-1][1]} | {statistics.median(walls):.2f} | "
              f"{min(walls):.2f}-{max(walls):.2f} | {msg} |")
    print(f"\n1-minute load at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
