"""Pipeline parallelism at real sizes: the same GPUs and batch as FSDP, split into stages instead.

    python benchmarks/pipeline.py                 # Llama 3 8B on 8 H100s, Llama 3 70B on 32
    python benchmarks/pipeline.py --only 8b

Each row is one `jaxmem analyze --json` in a subprocess, as printed with the row (deviceless compiles):
the per-device peak and its state / activations parts, the stage loop's activations in flight at the
peak, the schedule's bubble and its share of the step estimate, and the wall time of the analysis.
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import shlex
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
COMMON = ["--precision", "bf16", "--remat", "full", "--gpu", "h100", "--no-cache"]
# (size, batch, mesh, extra options): FSDP first, then the same devices with a stage axis
ROWS = {
    "8b": [("8b", 32, "fsdp=8", []), ("8b", 32, "stage=2,fsdp=4", []), ("8b", 32, "stage=4,fsdp=2", []),
           ("8b", 32, "stage=4,fsdp=2", ["--microbatches", "8"]),
           ("8b", 32, "stage=4,fsdp=2", ["--pipeline", "circular", "--microbatches", "8"])],
    "70b": [("70b", 64, "fsdp=32", []), ("70b", 64, "stage=4,fsdp=8", []),
            ("70b", 64, "stage=4,fsdp=8", ["--pipeline", "circular", "--repeats", "4", "--microbatches", "8"])],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(ROWS), default=None)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pipeline.md"))
    a = ap.parse_args()
    rows = []
    for key in [a.only] if a.only else list(ROWS):
        for size, batch, mesh, extra in ROWS[key]:
            cmd = ["jaxmem", "analyze", "models/llama.py", "--arg", f"preset={size}", "--mesh", mesh, "--batch",
                   str(batch), *COMMON, *extra]
            t = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "jaxmem.cli", *cmd[1:], "--json"], cwd=ROOT, capture_output=True,
                               text=True)
            wall = time.perf_counter() - t
            if p.returncode not in (0, 3):
                print(f"{shlex.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-600:]}", file=sys.stderr)
                return 1
            r = json.loads(p.stdout)
            rows.append((shlex.join(cmd), r, wall))
            print(f"{mesh} {' '.join(extra)}: peak {r['per_device_peak_bytes'] / 2**30:.2f} GiB in {wall:.0f} s",
                  flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    import jax

    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    lines = [
        "# Pipeline parallelism at real sizes",
        "",
        f"`python benchmarks/pipeline.py{' --only ' + a.only if a.only else ''}` on {datetime.date.today()}, commit "
        f"{commit.strip()}, jax {jax.__version__}, {platform.machine()} with 2 cores (deviceless compiles for H100). "
        "Llama 3 (models/llama.py), AdamW, bf16 compute with fp32 weights, full remat, per device. The state is "
        "params + optimizer state + gradients; in flight: the stage loop's saved activations live at the peak; "
        "bubble: the share of each stage's iterations spent on no microbatch, and what that costs in the step "
        "estimate (the SPMD program computes it).",
        "",
        "| model | mesh | schedule | microbatches | device peak | state | activations + temps | in flight | bubble | "
        "step estimate | of it bubble | fits | analysis | command |",
        "|---" * 14 + "|",
    ]
    for cmd, r, wall in rows:
        b, p, st = r["breakdown"], r.get("pipeline") or {}, r["step_time"]
        state = b["params"] + b["optimizer_state"] + b["gradients"]
        sched = (f"{p['schedule']}" + (f", {p['repeats']} repeats" if p["schedule"] == "circular" else "")) if p else "-"
        bubble = f"{100 * p['bubble']:.0f}%" if p else "-"
        of_it = f"{st['pipeline']['bubble_s'] * 1e3:.0f} ms" if p and st.get("pipeline") else "-"
        lines.append(
            f"| {r['model']} | {','.join(f'{k}={v}' for k, v in r['mesh'].items())} | {sched} | "
            f"{p.get('microbatches', '-')} | {gib(r['per_device_peak_bytes'])} | {gib(state)} | "
            f"{gib(b['activations_and_temporaries'])} | {gib(p['activations_in_flight']) if 'activations_in_flight' in p else '-'} | "
            f"{bubble} | {st['estimate_s'] * 1e3:.0f} ms | {of_it} | {r['fits']} | {wall:.0f} s | `{cmd}` |")
    pathlib.Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
