"""Issue 35's "linear-time work on every input", measured: `jaxmem diff` of reports with 10k, 40k and
300k modules (and as many buffers), the default pipeline microbatch search on huge and prime
batches, and a catastrophic --freeze/--lora-targets/--remat-at pattern matched against many paths.
Each row is the wall time of the call itself (no jax import); the table goes to
benchmarks/results/hostile-scale.md.

    python benchmarks/hostile_scale.py
    python benchmarks/hostile_scale.py --baseline /tmp/old   # diff's rows also run with that checkout's jaxmem

`--baseline DIR`: a checkout (e.g. `git archive 7c99905 jaxmem | tar -x -C /tmp/old`) whose jaxmem
diffs the same reports in the same run, so a loaded machine's times compare like with like.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "jax-0.10.2" / "gpt2-data8-fsdp.json"


def _report(n: int, shift: int, folder: pathlib.Path) -> pathlib.Path:
    d = json.loads(GOLDEN.read_text())
    d["modules"] = [{"module_path": f"model/layers_{i}/mlp", "bytes": 1000 + i + (i % 3) * shift, "buffers": 1}
                    for i in range(shift, n + shift)]
    d["top_buffers"] = [{"module_path": f"model/layers_{i}", "shape": [i], "dtype": "f32", "category": "temp",
                         "size": 4 * i + shift} for i in range(n)]
    p = folder / f"r{n}-{shift}.json"
    p.write_text(json.dumps(d))
    return p


def _time(argv: list[str], tree: pathlib.Path = ROOT) -> tuple[float, float, int]:
    """(wall s, CPU s of the child, exit code) of `jaxmem ARGV` (CPU: what a loaded machine's wall hides)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    # cwd=tree: `python -m` puts the working folder first on sys.path, before PYTHONPATH
    r = subprocess.run([sys.executable, "-m", "jaxmem.cli", *argv], cwd=tree, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=900, env={**os.environ, "PYTHONPATH": str(tree)})
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, r.returncode


def _call(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=pathlib.Path, default=None, help="a checkout whose jaxmem diffs too")
    ap.add_argument("--baseline-note", default="another checkout's jaxmem",
                    help="what the baseline is, for the table's heading (e.g. 'main at 6eefa7f')")
    a = ap.parse_args()
    trees = [("this checkout", ROOT)] + ([("baseline", a.baseline)] if a.baseline else [])
    rows = []
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        for n in (10_000, 40_000, 300_000):
            old, new = _report(n, 0, folder), _report(n, 7, folder)
            for mode in ("--json", "table"):
                for label, tree in trees:
                    secs, cpu, rc = _time(["diff", str(old), str(new), *([mode] if mode == "--json" else [])], tree)
                    what = (f"jaxmem diff{' --json' if mode == '--json' else ''}, {n:,} modules and {n:,} buffers "
                            f"({old.stat().st_size / 2**20:.1f} MB each){', ' + label if a.baseline else ''}")
                    rows.append((what, f"{secs:.2f} s ({cpu:.2f} s CPU)", f"exit {rc}; load {os.getloadavg()[0]:.1f}"))
                    print(*rows[-1], flush=True)
    sys.path.insert(0, str(ROOT))
    from jaxmem.program import pipeline_stages

    for batch in (2_000_000_000, 2_147_483_647, 999_999_937):
        secs = _call(lambda b=batch: pipeline_stages.default_microbatches(2, b, 1))
        rows.append((f"default microbatches, batch {batch:,}, 2 stages",
                     f"{secs * 1e3:.2f} ms", str(pipeline_stages.default_microbatches(2, batch, 1))))
    from jaxmem.program import patterns

    rx = patterns.compile_pattern("^(([a-z_/]+)+)+!$", "--freeze")
    paths = [f"model/layers_{i}/attention/query_projection/kernel" * 4 for i in range(10_000)]
    secs = _call(lambda: [rx.search(p) for p in paths])
    rows.append(("--freeze '^(([a-z_/]+)+)+!$' over 10,000 paths of 200 characters", f"{secs:.2f} s", "no match"))
    command = shlex.join(["python", "benchmarks/hostile_scale.py", *sys.argv[1:]])
    out = ["# Linear-time work on hostile inputs (issue 35)", "",
           (f"`{command}` on {platform.node()} ({os.cpu_count()} cores, "
           f"Python {platform.python_version()}), {time.strftime('%Y-%m-%d')}; load average {load_start:.1f} at the "
           f"start, {os.getloadavg()[0]:.1f} at the end (wall times on a loaded machine: the CPU column is the "
           "command's own; load: the 1-minute load average after the row)" +
           (f"; baseline: {a.baseline}, {a.baseline_note}, on the same reports in the same run" if a.baseline else "")
           + "."), "",
           "| case | wall | answer |", "|---|---:|---|", *(f"| {a} | {b} | {c} |" for a, b, c in rows)]
    text = "\n".join(out) + "\n"
    print(text)
    (ROOT / "benchmarks" / "results" / "hostile-scale.md").write_text(text)


if __name__ == "__main__":
    main()
