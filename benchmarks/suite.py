"""How long the tests take: the fast loop (`pytest -m "not slow"`) and the full suite CI runs.

Each run starts as CI's does (no mypy cache, no pytest cache; jaxmem's compile cache is the
session's own, made empty by tests/conftest.py), with the project's pytest options
(pyproject.toml: one worker per core, a file's tests on one worker). Writes
benchmarks/results/suite.md; exit status 1 when a run fails or misses its target.

    python benchmarks/suite.py            # both (about 10 minutes on 2 cores)
    python benchmarks/suite.py --fast     # the fast loop only
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGETS_S = {"fast loop": 180.0, "full suite": 720.0}
COMMANDS = {"fast loop": [sys.executable, "-m", "pytest", "-m", "not slow", "-p", "no:cacheprovider"],
            "full suite": [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]}


def run(name: str) -> dict:
    for cache in (".mypy_cache", ".pytest_cache"):   # cold, as on CI's fresh checkout
        shutil.rmtree(ROOT / cache, ignore_errors=True)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(COMMANDS[name], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    summary = next((ln for ln in reversed(proc.stdout.splitlines()) if re.search(r"\d+ (passed|failed)", ln)), "")
    print(f"{name}: {wall:.0f} s, exit {proc.returncode}: {summary}", flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-4000:], file=sys.stderr)
    return {"name": name, "wall": wall, "rc": proc.returncode, "summary": summary.strip("= "), "load0": load,
            "load1": os.getloadavg()[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true", help="the fast loop only")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "suite.md"))
    a = ap.parse_args()
    rows = [run(n) for n in (["fast loop"] if a.fast else ["fast loop", "full suite"])]
    ok = all(r["rc"] == 0 and r["wall"] <= TARGETS_S[r["name"]] for r in rows)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    lines = ["# Test suite time", "",
             f"`python benchmarks/suite.py` on {datetime.date.today()}, commit {rev.strip()}, {os.cpu_count()} cores "
             f"({platform.machine()}), Python {platform.python_version()}; each run from a cold mypy and pytest cache, "
             "with the project's pytest options (one worker per core).", "",
             "| run | command | wall | target | result | load average (start, end) | ok |",
             "|---|---|---:|---:|---|---|---|"]
    for r in rows:
        cmd = "python -m pytest" + (' -m "not slow"' if r["name"] == "fast loop" else "")
        good = r["rc"] == 0 and r["wall"] <= TARGETS_S[r["name"]]
        lines.append(f"| {r['name']} | `{cmd}` | {r['wall']:.0f} s | {TARGETS_S[r['name']]:.0f} s | {r['summary']} | "
                     f"{r['load0']:.1f}, {r['load1']:.1f} | {'yes' if good else 'NO'} |")
    pathlib.Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
