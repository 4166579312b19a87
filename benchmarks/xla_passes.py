"""Where README command 1's compile time goes, pass by pass, on two jax versions (issue 36, item 5).

Runs `jaxmem analyze models/llama.py --mesh data=8 --remat full --precision bf16 --no-cache` in a
child of each given Python (a venv's interpreter), with the whole compile in that process (not
stopped after buffer assignment) and XLA's pass timers on (TF_CPP_VMODULE=hlo_pass_pipeline=1,
gpu_compiler=1: each pass logs "HLO pass: NAME time: ..."), and prints a markdown table: XLA's
`GpuCompiler::RunHloPasses` total, then the passes whose summed time differs most between the two
runs. `--without-skip` also runs each one without the option jaxmem sets against the cost found
(xla_gpu_experimental_enable_fusion_autotuner=false, jaxmem/compiler/compiled.py), to show what it
saves. `--variant LABEL=JSON` also runs the last interpreter with those XLA options on top (a candidate
skip), and the table says whether the report's JSON (timings and flags aside) is identical to that
interpreter's plain run, and the peak and temporaries. `--logs LABEL=FILE ...` tabulates logs written before
(stderr of such runs) instead.

    python benchmarks/xla_passes.py /work/venv13/bin/python /work/venv12/bin/python [--without-skip]
    python benchmarks/xla_passes.py /work/venv13/bin/python /work/venv12/bin/python \
        --variant 'xla_gpu_enable_triton_gemm=false={"xla_gpu_enable_triton_gemm": false}'
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ["analyze", "models/llama.py", "--mesh", "data=8", "--remat", "full", "--precision", "bf16", "--no-cache",
           "--json"]
# the analysis with the compile whole and in this process, XLA's log let through
CHILD = """
import contextlib, json, os, sys
import jaxmem.compiler.compiled as c
import jaxmem.compiler.early_stop as e
c._xla_log = lambda notes: contextlib.nullcontext()
e.applies = lambda target: False
if os.environ.get("XLA_PASSES_NO_SKIP") == "1":
    c.FAST_GPU_OPTIONS.pop("xla_gpu_experimental_enable_fusion_autotuner", None)
c.FAST_GPU_OPTIONS.update(json.loads(os.environ.get("XLA_PASSES_EXTRA") or "{}"))
from jaxmem.cli import entry
sys.argv = ["jaxmem", *sys.argv[1:]]
entry()
"""


def run(python: str, skip: bool, extra: dict | None = None) -> tuple[str, dict]:
    """(XLA's log, the report as JSON) of one run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "0",
           "TF_CPP_VMODULE": "hlo_pass_pipeline=1,gpu_compiler=1", "XLA_PASSES_NO_SKIP": "0" if skip else "1",
           "XLA_PASSES_EXTRA": json.dumps(extra or {})}
    p = subprocess.run([python, "-c", CHILD, *COMMAND], cwd=ROOT, env=env, capture_output=True, text=True,
                       errors="replace")
    if p.returncode not in (0, 3):
        raise SystemExit(f"{python}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return p.stderr, json.loads(p.stdout)


def _answer(report: dict) -> str:
    """The report without what differs between two runs of the same compile (times, flags)."""
    return json.dumps({k: v for k, v in report.items() if k not in ("timings", "xla_flags")}, sort_keys=True)


def passes(log: str) -> tuple[float | None, dict[str, float], dict[str, int], int]:
    """(RunHloPasses s, seconds per pass name summed, calls per name, fusions compiled inside config-assigner)."""
    total, secs, calls = None, collections.Counter(), collections.Counter()
    inside, compiled = False, 0
    for line in log.splitlines():
        m = re.search(r"HLO pass: (\S+) time: .*?\((\d+) us\)", line)
        if m:
            secs[m.group(1)] += int(m.group(2)) / 1e6
            calls[m.group(1)] += 1
            if m.group(1) == "config-assigner":
                inside = False
        elif re.search(r"HLO pass config-assigner$", line):
            inside = True
        elif inside and re.search(r"Running HLO pass pipeline on module .*: fusion-dispatch-pipeline", line):
            compiled += 1
        m = re.search(r"GpuCompiler::RunHloPasses for jit_step time: .*?\((\d+) us\)", line)
        if m:
            total = int(m.group(1)) / 1e6
    return total, dict(secs), dict(calls), compiled


def table(logs: list[tuple[str, str]], top: int = 12, reports: dict[str, list[str]] | None = None) -> list[str]:
    parsed = [(label, passes(text)) for label, text in logs]
    out = ["| | " + " | ".join(label for label, _ in parsed) + " |", "|---" * (len(parsed) + 1) + "|",
           "| XLA `RunHloPasses` (s) | " + " | ".join(f"{p[0]:.2f}" if p[0] else "?" for _, p in parsed) + " |",
           "| fusions compiled inside `config-assigner` | " + " | ".join(str(p[3]) for _, p in parsed) + " |"]
    for row, cells in (reports or {}).items():
        out.append(f"| {row} | " + " | ".join(cells) + " |")
    first = parsed[0][1][1]
    names = sorted(set().union(*(p[1] for _, p in parsed)),
                   key=lambda n: -max(abs(p[1].get(n, 0) - first.get(n, 0)) for _, p in parsed))
    for n in names[:top]:
        out.append(f"| pass `{n}` (s, calls) | " + " | ".join(
            f"{p[1].get(n, 0):.2f} ({p[2].get(n, 0)})" for _, p in parsed) + " |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pythons", nargs="*", help="interpreters of the environments to compare (the reference first)")
    ap.add_argument("--without-skip", action="store_true", help="also run each without jaxmem's skip option")
    ap.add_argument("--logs", nargs="*", default=[], metavar="LABEL=FILE", help="tabulate these logs instead")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL=JSON",
                    help="also run the last interpreter with these XLA options on top (LABEL={...})")
    a = ap.parse_args()
    logs = [(lab, Path(f).read_text(errors="replace")) for lab, _, f in (x.rpartition("=") for x in a.logs)]
    answers: list[tuple[str, dict]] = []   # (the plain run's label, report) per run, in the table's order
    for i, py in enumerate(a.pythons):
        version = subprocess.run([py, "-c", "import jax; print(jax.__version__)"], capture_output=True,
                                 text=True).stdout.strip()
        runs = [(f"jax {version}, without the skip", False, {})] if a.without_skip else []
        runs.append((f"jax {version}", True, {}))
        if i == len(a.pythons) - 1:
            runs += [(f"jax {version}, {v[:v.index('={')]}", True, json.loads(v[v.index("={") + 1:]))
                     for v in a.variant]   # the label may hold "=": the options start at "={"
        for label, skip, extra in runs:
            log, report = run(py, skip=skip, extra=extra)
            logs.append((label, log))
            answers.append((f"jax {version}", report))
    reports = None
    if answers:
        plain = {base: r for (label, _), (base, r) in zip(logs[-len(answers):], answers, strict=True) if label == base}
        reports = {
            "per-device peak (bytes)": [f"{r['per_device_peak_bytes']:,}" for _, r in answers],
            "activations and temporaries (bytes)": [f"{r['breakdown']['activations_and_temporaries']:,}"
                                                    for _, r in answers],
            "report JSON identical to this jax's plain run": [
                "yes" if _answer(r) == _answer(plain.get(b, r)) else "**no**" for b, r in answers]}
    print(f"`jaxmem {' '.join(COMMAND)}`, the whole compile in one process with XLA's pass timers; 1-minute load "
          f"{os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} cores)\n")
    print("\n".join(table(logs, reports=reports)))


if __name__ == "__main__":
    sys.exit(main())
