"""What jaxmem's activation constraints are worth under FSDP (docs/how-it-works.md §4).

Compiles the same Llama step for 8 H100s with FSDP twice: as jaxmem builds it
(activations kept batch-sharded), and with the constraints switched off (XLA's
sharding propagation left alone). Prints per-device temp bytes and how many
floating-point all-gathers carry the whole global batch.

    python benchmarks/fsdp_constraints.py [preset]     # default 1b; writes results/fsdp-constraints.md
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxmem.compiler import compiled, targets  # noqa: E402
from jaxmem.program import layouts, sharding, step  # noqa: E402
from jaxmem.program.workload import load_workload  # noqa: E402


def batch_gathers(hlo: str, batch: int) -> int:
    n = 0
    for line in hlo.splitlines():
        m = re.search(r"= (.*?) all-gather(?:-done)?\(", line)
        if m:
            n += sum(1 for dt, dims in re.findall(r"(\w+)\[([\d,]*)\]", m.group(1))
                     if dt[0] in "fb" and dims and int(dims.split(",")[0]) == batch)
    return n


def main() -> None:
    preset = sys.argv[1] if len(sys.argv) > 1 else "1b"
    wl = load_workload(ROOT / "models" / "llama.py", preset=preset)
    batch = wl.batch["tokens"].shape[0]
    ms = layouts.parse_mesh("data=8")
    mesh = layouts.build_mesh(targets.make_target("h100", 8).devices, ms)
    rows = []
    for label, off in (("jaxmem (activations batch-sharded)", False), ("constraints off (XLA left alone)", True)):
        with contextlib.ExitStack() as stack:
            if off:
                saved = sharding.activation_constraints, sharding.activation_rules
                sharding.activation_constraints = lambda *a, **k: contextlib.nullcontext()
                sharding.activation_rules = lambda *a, **k: ()
                stack.callback(lambda: setattr(sharding, "activation_constraints", saved[0]))
                stack.callback(lambda: setattr(sharding, "activation_rules", saved[1]))
            built = step.build(step.plan(wl, step.StepOptions(layout="fsdp"), ms), mesh)
            c, stats = compiled.lower_and_compile(built)
        rows.append((label, stats.temp, batch_gathers(c.as_text(), batch)))
        print(f"{label}: temp {stats.temp / 2**30:.2f} GiB, whole-batch float all-gathers {rows[-1][2]}", flush=True)
    text = "\n".join([
        f"# FSDP on 8 x H100: llama {preset}, global batch {batch}, fp32, AdamW, no remat",
        "",
        "Command: `python benchmarks/fsdp_constraints.py " + preset + "`",
        "",
        "| step | temp per device | whole-batch float all-gathers |",
        "|---|---:|---:|",
        *[f"| {label} | {temp / 2**30:.2f} GiB | {n} |" for label, temp, n in rows],
        "",
        f"Ratio: {rows[1][1] / rows[0][1]:.1f}x the temporaries without the constraints.",
        "",
    ])
    (ROOT / "benchmarks" / "results" / f"fsdp-constraints-{preset}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
