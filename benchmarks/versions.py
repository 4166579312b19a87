"""The same analyses under two (or more) jax versions: the per-device peak and the analysis time.

    python benchmarks/versions.py --env lowest=.venv-lowest/bin/python --env reference=.venv-reference/bin/python \
        --env newest=.venv-newest/bin/python

Each --env names a Python whose environment has jaxmem installed (.ci/run builds the two ends of
the tested range as .venv-lowest and .venv-newest, and the reference jax 0.10.2 on Python 3.13 as
.venv-reference); the last is compared with the first. Every case runs as a user runs it,
``python -m jaxmem.cli analyze ... --json --timings --no-cache``, one at a time, and the table
(benchmarks/results/versions.md) gives the peak, its parts that are jaxmem's count of the train
state (identical across versions: asserted), XLA's temporaries (they may differ) and the wall
time of the analysis, with the commands. ``--quick`` runs the tiny presets instead.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "versions.md"
STATE = ("params", "optimizer_state", "batch", "other_state")

CASES = [
    ("Llama 8B, FSDP 8 x H100, bf16, full remat",
     ["models/llama.py", "--mesh", "data=8", "--remat", "full", "--precision", "bf16", "--gpu", "h100"]),
    ("GPT-2 medium, cuDNN attention, 8 x H100, bf16",
     ["models/gpt2.py", "--arg", "preset=gpt2-medium", "--arg", "attention=cudnn", "--precision", "bf16",
      "--gpu", "h100", "--mesh", "data=8"]),
    ("Mixtral 8x7B MoE, 16 x H100, bf16, full remat",
     ["models/moe.py", "--arg", "preset=mixtral-8x7b", "--mesh", "data=16", "--batch", "16", "--precision", "bf16",
      "--remat", "full", "--gpu", "h100"]),
    ("Llama 8B QLoRA (nf4 base, LoRA r=16), 8 x H100",
     ["models/llama.py", "--lora", "16", "--lora-targets", "attn|mlp", "--base-dtype", "nf4", "--precision", "bf16",
      "--remat", "full", "--mesh", "data=8", "--gpu", "h100"]),
]
QUICK = [(f"{m} tiny, 8 x H100",
          [f"models/{m}.py", "--arg", "preset=tiny", "--mesh", "data=8", "--batch", "8", "--gpu", "h100"])
         for m in ("llama", "gpt2", "moe")]


def run(python: str, args: list[str]) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([python, "-m", "jaxmem.cli", "analyze", *args, "--json", "--timings", "--no-cache"],
                       cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 3):
        raise SystemExit(f"{python} analyze {' '.join(args)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    d = json.loads(p.stdout)
    return {"peak": d["per_device_peak_bytes"], "state": {k: d["breakdown"][k] for k in STATE},
            "temp": d["breakdown"]["activations_and_temporaries"], "wall": wall, "versions": d["versions"]}


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", action="append", required=True, metavar="NAME=PYTHON")
    ap.add_argument("--quick", action="store_true", help="the tiny presets (a check of the script)")
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    a = ap.parse_args()
    envs = [tuple(e.split("=", 1)) for e in a.env]
    cases = QUICK if a.quick else CASES
    results = {name: [run(py, args) for _, args in cases] for name, py in envs}
    lines = ["# The same analyses at both ends of the supported jax range (and the reference between)", "",
             f"Written by `python benchmarks/versions.py {' '.join('--env ' + e for e in a.env)}"
             f"{' --quick' if a.quick else ''}` on this project's 2-core CPU machine (deviceless compiles, "
             "`--no-cache`, one at a time). Parameters, optimizer state, batch and other state are jaxmem's count "
             "of the train state and are identical on every version (asserted by the script); XLA's temporaries "
             "and so the peak are each version's XLA.", ""]
    for name, _ in envs:
        v = results[name][0]["versions"]
        lines.append(f"- **{name}**: Python {v.get('python')}, jax {v.get('jax')}, jaxlib {v.get('jaxlib')}, "
                     f"{v.get('cuda_plugin')} (CUDA {v.get('cuda')}, cuDNN {v.get('cudnn')}), flax {v.get('flax')}, "
                     f"optax {v.get('optax')}, qwix {v.get('qwix', '-')}")
    lines += ["", "| case | " + " | ".join(f"{n} peak | {n} temporaries | {n} analysis" for n, _ in envs)
              + " | peak change |", "|---" * (2 + 3 * len(envs)) + "|"]
    for i, (title, _) in enumerate(cases):
        rows = [results[n][i] for n, _ in envs]
        states = {json.dumps(r["state"], sort_keys=True) for r in rows}
        if len(states) != 1:
            raise SystemExit(f"{title}: the train state's bytes differ between versions: {states}")
        change = (rows[-1]["peak"] - rows[0]["peak"]) / rows[0]["peak"]
        lines.append(f"| {title} | " + " | ".join(f"{gib(r['peak'])} | {gib(r['temp'])} | {r['wall']:.1f} s"
                                                  for r in rows) + f" | {change:+.2%} |")
    lines += ["", "Commands (each with `--json --timings --no-cache`, run by each environment's "
              "`python -m jaxmem.cli analyze`):", ""]
    lines += [f"- {title}: `jaxmem analyze {shlex.join(args)}`" for title, args in cases]
    a.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
