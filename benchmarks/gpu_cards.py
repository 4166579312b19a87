"""Every catalogue card compiles a shipped model devicelessly, under each installed jax: a table.

    python benchmarks/gpu_cards.py PYTHON [PYTHON ...]    # -> results/gpu-cards.md
    python benchmarks/gpu_cards.py /work/venv12/bin/python /work/venv13/bin/python

For each Python (an environment with jax and its CUDA plugin) and each card of ``--cards`` (default:
the cards added for issue 38), ``jaxmem analyze models/mlp.py --arg preset=tiny --gpu CARD --mesh
data=2 --no-cache --json`` runs in a subprocess; the row says whether XLA compiled it (exit 0), the
per-device peak, and, when it did not, the first line of the error: a card the installed XLA cannot
compile for is listed as such, with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NEW_CARDS = ("rtx-3090", "rtx-4090", "rtx-5090", "rtx-6000-ada", "rtx-pro-6000", "l40s", "l4", "a10g", "a100-40g",
             "h100-pcie", "h100-nvl", "h20", "b300")


def versions(python: str) -> str:
    code = ("import jax, jaxlib, sys; "
            "print(f'jax {jax.__version__}, jaxlib {jaxlib.__version__}, Python ' + sys.version.split()[0])")
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()


def compile_row(python: str, card: str) -> dict:
    cmd = [python, "-m", "jaxmem.cli", "analyze", "models/mlp.py", "--arg", "preset=tiny", "--gpu", card,
           "--mesh", "data=2", "--no-cache", "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    secs = time.perf_counter() - t0
    row = {"card": card, "rc": out.returncode, "seconds": round(secs, 1)}
    if out.returncode == 0:
        d = json.loads(out.stdout)
        row.update(peak=d["per_device_peak_bytes"], device=d["target"]["description"])
    else:
        row["error"] = (out.stderr.strip().splitlines() or ["(no message)"])[-1][:300]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pythons", nargs="+")
    ap.add_argument("--cards", default=",".join(NEW_CARDS))
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from jaxmem.compiler.targets import CATALOGUE

    out = ["# Deviceless compiles per card", "",
           (f"`python benchmarks/gpu_cards.py {' '.join(a.pythons)}`: `jaxmem analyze models/mlp.py --arg "
            "preset=tiny --gpu CARD --mesh data=2 --no-cache --json` per card and environment."), ""]
    for python in a.pythons:
        out += [f"## {versions(python)}", "",
                "| card | device | compute capability | compiled | peak/device | s | why not |",
                "|---|---|---|:-:|---:|---:|---|"]
        for card in a.cards.split(","):
            r = compile_row(python, card)
            cc = ".".join(map(str, CATALOGUE[card].compute_capability))
            out.append(f"| {card} | {CATALOGUE[card].description} | {cc} | {'yes' if r['rc'] == 0 else 'NO'} | "
                       f"{r.get('peak', '')} | {r['seconds']} | {r.get('error', '')} |")
            print(out[-1], flush=True)
        out.append("")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gpu-cards.md").write_text("\n".join(out))
    print("wrote", RESULTS / "gpu-cards.md", file=sys.stderr)


if __name__ == "__main__":
    main()
