"""Step-time accuracy: jaxmem's estimate beside every published step time in benchmarks/published.py.

    python benchmarks/steptime_accuracy.py            # every published row with a step time
    python benchmarks/steptime_accuracy.py --only 7b  # the rows whose key contains "7b" (no file written)
    python benchmarks/steptime_accuracy.py --remat-check   # + the step as given vs --remat full, shipped models

Each row is the recipe's own `jaxmem analyze` command (benchmarks/published.py: its mesh, batch, remat, XLA
flags), compiled devicelessly (JAXMEM_CACHE makes a rerun cheap). Per row: the estimate, its band
(low-high: every rate at the ends of its published range), the ratio to the published step time, and the
busy time of each kernel class. The rates are public measurements (jaxmem/compiler/steptime.py, each with
its source); none is fitted to these rows, so there is no leave-one-out error to print: the table is an
out-of-sample check as it stands. Writes benchmarks/results/steptime-accuracy.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import published as pub  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "steptime-accuracy.md"
# the shipped models at their tiny (test) presets, and two real ones: (model, analyze options)
REMAT_MODELS = tuple((f"models/{m}.py", {"args": {"preset": "tiny"}})
                     for m in ("llama", "llama_nnx", "gpt2", "mlp", "mlp_nnx", "vit", "moe", "resnet")) + (
    ("models/gpt2.py", {}),)                                            # GPT-2 124M on one H100


def _analyze(argv: list[str], flags: list[str] | None = None) -> dict:
    return pub.run_jaxmem(argv, flags or [])


def accuracy_rows(only: str | None, on_row=None) -> list[dict]:
    """Each published row's estimate; `on_row(rows so far)` after each (the table is rewritten as it grows)."""
    rows = []
    for r in pub.RECIPES:
        if r.step_s is None or (only and only not in r.key):
            continue
        flags, _ = pub.applicable_flags(r.xla_flags)
        argv = pub.analyze_argv(r, r.attention)
        run = _analyze(argv, flags)
        st = run.get("step_time", {}) if "error" not in run else {}
        row = {"key": r.key, "title": r.title, "published_s": r.step_s, "command": pub.command_line(argv, flags),
               "seconds": run.get("seconds")}
        if st.get("available"):
            row.update(estimate_s=st["estimate_s"], low_s=st.get("low_s"), high_s=st.get("high_s"),
                       ratio=st["estimate_s"] / r.step_s,
                       classes={c["class"]: c["time_s"] for c in st.get("kernel_classes", [])},
                       exposed_communication_s=st.get("exposed_communication_s"))
        else:
            row["error"] = run.get("error", st.get("reason", "no estimate"))[-300:]
        print(f"{r.key}: " + (f"estimate {row['estimate_s']:.3f} s, published {r.step_s:g} s, ratio {row['ratio']:.2f}"
                              if "ratio" in row else f"no estimate: {row['error']}"), flush=True)
        rows.append(row)
        if on_row is not None:
            on_row(rows)
    return rows


def remat_rows() -> list[dict]:
    """The step as given (remat none) and with --remat full on every shipped model, in this process."""
    import jaxmem

    out = []
    for model, opts in REMAT_MODELS:
        steps = {}
        for remat in ("none", "full"):
            try:
                st = jaxmem.analyze(model, gpu="h100", remat=remat, explain=False, **opts).step_time
            except jaxmem.UserError as e:   # a model without a remat argument (NNX): no --remat full to compare
                print(f"{model}: {e}", flush=True)
                st = {}
            steps[remat] = st.get("estimate_s") if st.get("available") else None
        ratio = steps["none"] / steps["full"] if steps["none"] and steps["full"] else None
        args = " ".join(f"--{k} {v}" if k != "args" else " ".join(f"--arg {a}={b}" for a, b in v.items())
                        for k, v in opts.items())
        out.append({"model": model, "args": args, "as_given_s": steps["none"], "remat_full_s": steps["full"],
                    "ratio": ratio})
        print(f"{model} {args}: as given {steps['none']}, remat full {steps['full']}, ratio {ratio}", flush=True)
    return out


def _ms(x) -> str:
    return "—" if x is None else (f"{x:.3f} s" if x >= 1 else f"{x * 1e3:.1f} ms")


def render(rows: list[dict], remat: list[dict] | None, header: str) -> str:
    lines = ["# Step-time estimate vs published step times" if rows else "# Step time: as given vs --remat full",
             "", header, ""]
    if rows:
        lines += [("| # | configuration | published | estimate (band) | ratio | GEMM | attention | memory-bound | "
             "collectives (busy) | exposed communication |"),
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(rows, 1):
        if "ratio" not in r:
            lines.append(f"| {i} | {r['title']} | {r['published_s']:g} s | error | — | | | | | |")
            continue
        c = r["classes"]
        flag = "" if 0.75 <= r["ratio"] <= 1.33 else " (outside 0.75-1.33)"
        lines.append(f"| {i} | {r['title']} | {r['published_s']:g} s | {_ms(r['estimate_s'])} ({_ms(r['low_s'])}-"
                     f"{_ms(r['high_s'])}) | {r['ratio']:.2f}{flag} | {_ms(c.get('gemm'))} | "
                     f"{_ms(c.get('attention'))} | "
                     f"{_ms(c.get('memory'))} | {_ms(c.get('collective'))} | {_ms(r['exposed_communication_s'])} |")
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    if ratios:
        inside = sum(0.75 <= x <= 1.33 for x in ratios)
        in_band = sum(r["low_s"] <= r["published_s"] <= r["high_s"] for r in rows if "ratio" in r)
        lines += ["", (f"Ratios (estimate / published): {min(ratios):.2f}-{max(ratios):.2f}, median "
                      f"{statistics.median(ratios):.2f}; {inside} of {len(ratios)} within 0.75-1.33. "
                      f"Published inside the band: {in_band} "
                      f"of {len(ratios)}."),
                  ("Leave-one-out error: none to print: no constant is fitted to these rows (each rate is a public "
                  "microbenchmark, vendor or nccl-tests figure; see docs/how-it-works.md, step time).")]
    if remat:
        lines += ["", "## The step as given vs --remat full (shipped models, H100)", "",
                  "| model | as given | --remat full | as given / full |", "|---|---:|---:|---:|"]
        for r in remat:
            lines.append(f"| {r['model']} {r['args']} | {_ms(r['as_given_s'])} | {_ms(r['remat_full_s'])} | "
                         + ("—" if r["ratio"] is None else f"{r['ratio']:.2f}") + " |")
    if rows:
        lines += ["", "## Commands", ""] + [f"- {r['key']}: `{r['command']}`" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="the rows whose key contains this (no file written)")
    ap.add_argument("--remat-check", action="store_true", help="also compare the step as given with --remat full "
                                                               "on every shipped model")
    ap.add_argument("--remat-only", action="store_true", help="only the --remat-check table (writes "
                                                              "steptime-remat.md)")
    args = ap.parse_args()
    import jax

    t0 = time.time()
    if args.remat_only:
        remat = remat_rows()
        text = render([], remat, f"`python benchmarks/steptime_accuracy.py --remat-only` ({time.strftime('%Y-%m-%d')}; "
                                 f"jax {jax.__version__}; {time.time() - t0:.0f} s). The step as given is never "
                                 "estimated slower than with --remat full by more than 10% (full remat only adds "
                                 "work) where the ratio is at most 1.10.")
        print(text)
        OUT.with_name("steptime-remat.md").write_text(text)
        return
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)

    def partial(rows):
        if not args.only:
            OUT.write_text(render(rows, None, f"(in progress: {len(rows)} rows so far)"))

    rows = accuracy_rows(args.only, partial)
    remat = remat_rows() if args.remat_check else None
    flag = " --remat-check" if remat else ""
    header = (f"`python benchmarks/steptime_accuracy.py{flag}` ({time.strftime('%Y-%m-%d')}; "
              f"jax {jax.__version__}; jaxmem at {rev.stdout.strip() or '?'}; {time.time() - t0:.0f} s, "
              f"JAXMEM_CACHE={os.environ.get('JAXMEM_CACHE', 'default')}). Compile-only: each row is the recipe's "
              "`jaxmem analyze` command; the published step times and their sources are in published.md. Columns "
              "after the ratio: each kernel class's busy time per step (collectives: on their own stream; the part "
              "not hidden behind compute is the last column).")
    text = render(rows, remat, header)
    print(text)
    if not args.only:
        OUT.write_text(text)
        OUT.with_suffix(".json").write_text(json.dumps({"rows": rows, "remat": remat}, indent=1) + "\n")
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
