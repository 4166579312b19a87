"""advise with progress (issue 53 point 1): how soon the first ranked list (predicted) and the exact list come.

    python benchmarks/advise_progress.py      # both cases, cold compile cache -> benchmarks/results/advise-progress.md

Each case runs in a fresh Python process (as `jaxmem advise` runs: Python, jax, the worker processes, an empty
compile cache in a temporary JAXMEM_CACHE) through jaxmem.plan.advise.advise with the CLI's options and an
on_update hook; the clock starts before the process does. "first list": the first snapshot (the step as given
compiled, every plan predicted); "exact list": advise returned (the stop rule met). The 1-minute load average
is read at the start and the end of each case: the machine is shared, and a loaded machine stretches both.
Target: the first list within 10 s, the exact list within 90 s on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "README command 1's model on 8 x A10G": [
        "models/llama.py", "--mesh", "data=8", "--remat", "full", "--precision", "bf16", "--gpu", "a10g"],
    "Llama-3.1-8B config.json, LoRA 16, one RTX 4090": [
        "benchmarks/hf_configs/Llama-3.1-8B.json", "--lora", "16", "--base-dtype", "bf16", "--precision", "bf16",
        "--remat", "full", "--batch", "4", "--arg", "seq_len=2048", "--gpu", "rtx-4090", "--mesh", "data=1"],
}
FIRST_S, EXACT_S = 10.0, 90.0


def child(argv: list[str]) -> None:
    """One case in this process: the CLI's options, advise with an on_update hook; JSON on stdout."""
    t0 = float(os.environ["ADVISE_T0"])
    from jaxmem import cli, session  # after the environment is set, as the CLI

    cmd = cli.main.commands["advise"]
    kw = dict(cmd.make_context("advise", list(argv)).params)
    for k in ("as_json", "always", "n_jobs", "change_kinds"):
        kw.pop(k, None)
    cli._prepare(kw)
    session.prepare(cpu_devices=2 * cli.mesh_size(kw["mesh"]))
    from jaxmem.plan import advise  # jax starts here

    seen: list[tuple[float, dict]] = []
    result = advise.advise(kw["model_file"], cli._options(kw, explain=False), progress=False,
                           on_update=lambda a: seen.append((time.time() - t0, a.to_json())))
    out = result.to_json()
    first = seen[0][1] if seen else {}
    print(json.dumps({"first_s": seen[0][0] if seen else None, "exact_s": time.time() - t0,
                      "first_rows": [(r["status"], r["label"], r["fits"]) for r in first.get("candidates", [])][:6],
                      "first_progress": first.get("progress", {}).get("text"), "snapshots": len(seen),
                      "compiles": out["compiles"], "cached": out["cached"], "progress": out["progress"]["text"],
                      "original": out["original"], "rows": out["candidates"]}))


def run(name: str, argv: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="jaxmem-advise-progress-") as cache:
        load0 = os.getloadavg()[0]
        t0 = time.time()
        env = dict(os.environ, JAXMEM_CACHE=cache, ADVISE_T0=repr(t0))
        proc = subprocess.run([sys.executable, __file__, "--child", *argv], cwd=ROOT, env=env, capture_output=True,
                              text=True)
        if proc.returncode != 0:
            sys.exit(f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        d = json.loads(proc.stdout.strip().splitlines()[-1])
    d.update(name=name, argv=argv, load=(load0, os.getloadavg()[0]))
    return d


def gib(b) -> str:
    return "-" if b is None else f"{b / 2**30:.2f} GiB"


def table(d: dict) -> list[str]:
    ok_first, ok_exact = d["first_s"] is not None and d["first_s"] <= FIRST_S, d["exact_s"] <= EXACT_S
    first = (f"| first ranked list (predicted) | {d['first_s']:.1f} | {FIRST_S:.0f} | {'yes' if ok_first else 'no'} "
             f"| {d['load'][0]:.1f} / {d['load'][1]:.1f} |")
    summary = (f"{d['compiles']} compiles ({d['cached']} answered by the cache); {d['progress']}; "
               f"{d['snapshots']} snapshots. The first list said \"{d['first_progress']}\"; its top rows:")
    lines = [f"## {d['name']}", "", f"`jaxmem advise {' '.join(d['argv'])}`", "",
             f"As given: peak {gib(d['original']['per_device_peak_bytes'])}, fits: {d['original']['fits']}.", "",
             "| | seconds | target | met | 1-min load (start / end) |", "|---|---:|---:|---|---|", first,
             f"| exact list (search done) | {d['exact_s']:.1f} | {EXACT_S:.0f} | {'yes' if ok_exact else 'no'} | |",
             "", summary, ""]
    lines += [f"- {s}: {label} (fits: {fits})" for s, label, fits in d["first_rows"]]
    lines += ["", "| # | section | plan | peak | tokens/s/device |", "|---:|---|---|---:|---:|"]
    for r in d["rows"]:
        tp = r["tokens_per_s"] or r["samples_per_s"]
        lines.append(f"| {r['rank'] or '-'} | {r['section']} | {r['label']} | {gib(r['per_device_peak_bytes'])} | "
                     f"{'-' if tp is None else f'{tp:,.0f}'} |")
    return lines + [""]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    intro = (f"`python benchmarks/advise_progress.py` on {cores} cores shared with other work (the load average "
             "beside each timing), a cold compile cache per case; the clock starts before Python does.")
    lines = ["# advise with progress: the first ranked list and the exact list", "", intro, ""]
    for name, argv in CASES.items():
        d = run(name, argv)
        print(f"{name}: first list {d['first_s']:.1f} s, exact {d['exact_s']:.1f} s, {d['compiles']} compiles, "
              f"load {d['load'][0]:.1f}/{d['load'][1]:.1f}")
        lines += table(d)
    out = ROOT / "benchmarks" / "results" / "advise-progress.md"
    out.write_text("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
