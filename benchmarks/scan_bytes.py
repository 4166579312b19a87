"""The bytes a scanned step really moves, per kernel, as given and under --remat full (issue 48).

    python benchmarks/scan_bytes.py        # prints the tables, writes benchmarks/results/scan-bytes.md

The newcomer's NNX decoder (benchmarks/outside/nnx_scan_decoder.py: nnx.vmap + nnx.scan, XLA attention,
336 M parameters) on --gpu h100 --mesh fsdp=8 --batch 8: the estimate's kernels (jaxmem.compiler.kernels:
each stacked write charged its slice, each stacked read its slice, a stack's zero fill once), the largest
by bytes per step, with the module that made them, and the saved residuals' traffic against what
--remat full recomputes (step_time.scan_residuals, jaxmem.compiler.residuals).
"""

from __future__ import annotations

import contextlib
import pathlib
import re
import sys
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

import jaxmem  # noqa: E402
from jaxmem.analysis import stages  # noqa: E402
from jaxmem.compiler import kernels, rates, residuals, targets  # noqa: E402
from jaxmem.xla import hlo_text, opnames  # noqa: E402

MODEL = "benchmarks/outside/nnx_scan_decoder.py"
CASES = (("as given", {}), ("--remat full --remat-at Block", {"remat": "full", "remat_at": "Block"}))
TOP = 12


@contextlib.contextmanager
def _program(out: dict):
    """Keep the compiled program's text of the next analysis (the report holds its numbers, not the text)."""
    compile_ = stages.compile_

    def keep(t):
        c = compile_(t)
        out["hlo"] = c.art.hlo_text
        return c

    stages.compile_ = keep
    try:
        yield out
    finally:
        stages.compile_ = compile_


def _role(module: hlo_text.Module, ins, fwd: list[str], bwd: list[str]) -> str:
    if ins.computation in fwd and kernels.updates_in_place(module, ins):
        return "stack write"
    if ins.computation == module.entry and not ins.operand_names and "[" in ins.shape_text and re.search(
            r"broadcast", ins.name):
        return "zero fills"
    if ins.computation in bwd:
        return "backward loop"
    return "forward loop" if ins.computation in fwd else "outside the loops"


def measure(options: dict) -> tuple[jaxmem.Report, list[tuple], dict[str, float]]:
    with _program({}) as got:
        r = jaxmem.analyze(MODEL, gpu="h100", mesh="fsdp=8", batch=8, cache=False, **options)
    module = hlo_text.parse_module(got["hlo"])
    perf = targets.performance("h100")
    rate = rates.rates("h100", perf)
    fwd, bwd = residuals._loops(module)
    rows, roles = [], defaultdict(float)
    for k in kernels.kernels(module):
        if k.klass == "collective":
            continue
        ins = module.by_name[k.name]
        m = re.search(r'op_name="([^"]*)"', ins.attrs)
        role = _role(module, ins, fwd, bwd)
        roles[role] += k.bytes * k.runs
        rows.append((k.bytes * k.runs, k.runs, k.bytes, k.klass, k.name, ins.shape_text.split("{")[0][:44],
                     opnames.module_path(m.group(1)) if m else "", role,
                     rates.kernel_time(k, perf, rate) * k.runs))
    rows.sort(key=lambda x: -x[0])
    return r, rows, dict(roles)


def main() -> None:
    out = ["# Bytes a scanned step moves, per kernel", "",
           (f"`python benchmarks/scan_bytes.py` (jax {jax.__version__}): `jaxmem analyze {MODEL} --gpu h100 "
            "--mesh fsdp=8 --batch 8`, as given and with `--remat full --remat-at Block`. Per device per step; a "
            "kernel in the layer loop runs 24 times. Kernels by where they run: a stack write is an in-place "
            "update in the forward loop; a zero fill an operand-less broadcast before the loops (the stacks' "
            "and the gradient accumulators')."), ""]
    summary = ["| | as given | --remat full |", "|---|---:|---:|"]
    results = [measure(opts) for _, opts in CASES]
    st = [r.step_time for r, _, _ in results]
    summary += [
        f"| estimate | {st[0]['estimate_s'] * 1e3:.1f} ms | {st[1]['estimate_s'] * 1e3:.1f} ms |",
        f"| memory-bound kernels (busy) | {st[0]['memory_s'] * 1e3:.1f} ms | {st[1]['memory_s'] * 1e3:.1f} ms |",
        f"| GEMM and attention (busy) | {st[0]['compute_s'] * 1e3:.1f} ms | {st[1]['compute_s'] * 1e3:.1f} ms |",
        f"| bytes the kernels move | {st[0]['bytes_accessed'] / 1e9:.1f} GB | {st[1]['bytes_accessed'] / 1e9:.1f} GB |",
        (f"| XLA's count (every operand whole) | {st[0]['xla_bytes_accessed'] / 1e9:.1f} GB | "
         f"{st[1]['xla_bytes_accessed'] / 1e9:.1f} GB |"),
    ]
    roles = sorted({k for _, _, rs in results for k in rs})
    summary += [f"| {role} | {results[0][2].get(role, 0) / 1e9:.1f} GB | {results[1][2].get(role, 0) / 1e9:.1f} GB |"
                for role in roles]
    for i, key in enumerate(("written", "filled", "read", "copied")):
        res = [s.get("scan_residuals") or {} for s in st]
        summary.append(f"| saved residuals: {key} | {res[0].get(key, 0) / 1e9:.1f} GB | "
                       f"{res[1].get(key, 0) / 1e9:.1f} GB |")
        if i == 3:
            summary.append(f"| saved residuals at HBM bandwidth / recompute (GEMM, attention) | "
                           f"{res[0].get('seconds', 0) * 1e3:.1f} / {res[0].get('recompute_s', 0) * 1e3:.1f} ms | "
                           f"{res[1].get('seconds', 0) * 1e3:.1f} / {res[1].get('recompute_s', 0) * 1e3:.1f} ms |")
    out += summary + [""]
    warned = [w.message for w in results[0][0].warnings if w.kind == "scan_residuals_traffic"]
    if warned:
        out += ["The report as given warns (`scan_residuals_traffic`):", "", f"> {warned[0]}", ""]
    for (label, _), (_, rows, _) in zip(CASES, results, strict=True):
        out += [f"## {label}: the {TOP} kernels moving the most", "",
                "| GB per step | runs | MB per run | class | kernel | result | module | where | est. ms |",
                "|---:|---:|---:|---|---|---|---|---|---:|"]
        out += [f"| {b / 1e9:.2f} | {n} | {per / 1e6:.1f} | {kl} | `{name}` | `{shape}` | `{mod}` | {role} | "
                f"{t * 1e3:.2f} |" for b, n, per, kl, name, shape, mod, role, t in rows[:TOP]]
        out.append("")
    text = "\n".join(out)
    print(text)
    (ROOT / "benchmarks" / "results" / "scan-bytes.md").write_text(text)


if __name__ == "__main__":
    main()
