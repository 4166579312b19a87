"""jaxmem explore through its HTTP API: a scripted sequence of moves, timed (issue 45).

    python benchmarks/explore.py                      # both models -> benchmarks/results/explore.md
    python benchmarks/explore.py --only llama         # one of them
    python benchmarks/explore.py --table              # the table again from explore.json

For each model, `jaxmem explore MODEL ... --no-browser --jobs 2` runs as a child process with an empty
compile cache of its own, and the script replays its moves one after the other, as a person would: each
move asks /api/answer (the first answer: exact, predicted or compiling), then /api/answer?wait=exact (the
exact one), then the next move. Between moves the explorer compiles the current point's neighbours, as
it does while a person reads. Per kind of move it prints the time to the first answer and to the exact
one (median, max), and each prediction's error against the exact compile that replaced it.

`analyze alone`: the same machine's `jaxmem analyze --json` of three of the points (the start, a batch
move, a sequence move), each with an empty compile cache: what the exact answer costs without the explorer.

Targets (the issue's): a compiled point answers in under 200 ms; a batch move's prediction in under 1 s
and within 2% of the exact peak; the exact answer no later than `analyze` alone gives it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "explore.md"
RAW = ROOT / "benchmarks" / "results" / "explore.json"

# README command 1's model as printed there (Llama-3 8B, 8 x H100, FSDP, bf16, full remat)
LLAMA = ("models/llama.py", ["--mesh", "data=8", "--remat", "full", "--precision", "bf16"])
# a config.json model: Phi-3-mini (3.8B; its 4096 positions bound the sequence moves)
CONFIG = ("benchmarks/hf_configs/Phi-3-mini-4k-instruct.json", ["--mesh", "fsdp=8", "--precision", "bf16",
                                                                 "--remat", "full"])

# (kind, query) in order; a query is the whole move from the start (left-out options keep the start's).
# Kinds: start; batch (the global batch); seq (the sequence length argument); remat; precision; mesh;
# gpu; revisit (a point answered before).
MOVES_LLAMA = [
    ("start", {}),
    ("batch", {"batch": 16}), ("batch", {"batch": 32}), ("batch", {"batch": 24}), ("batch", {"batch": 48}),
    ("batch", {"batch": 40}), ("revisit", {"batch": 16}), ("batch", {"batch": 64}), ("batch", {"batch": 56}),
    ("remat", {"remat": "none"}), ("remat", {"remat": "dots_with_no_batch_dims_saveable"}),
    ("revisit", {}),
    ("seq", {"arg.seq_len": 4096}), ("seq", {"arg.seq_len": 8192}), ("seq", {"arg.seq_len": 3072}),
    ("seq", {"arg.seq_len": 6144}), ("revisit", {"arg.seq_len": 4096}),
    ("batch", {"batch": 16, "arg.seq_len": 4096}), ("batch", {"batch": 24, "arg.seq_len": 4096}),
    ("precision", {"precision": "fp32"}), ("precision", {"precision": "fp8"}),
    ("mesh", {"mesh": "data=16", "batch": 16}), ("mesh", {"mesh": "data=4"}), ("mesh", {"mesh": "fsdp=8"}),
    ("gpu", {"gpu": "h200"}), ("gpu", {"gpu": "a100-80g"}),
    ("batch", {"gpu": "h200", "batch": 16}), ("batch", {"gpu": "h200", "batch": 32}),
    ("batch", {"gpu": "h200", "batch": 24}), ("batch", {"batch": 72}), ("batch", {"batch": 80}),
    ("revisit", {"batch": 32}),
]
MOVES_CONFIG = [
    ("start", {}),
    ("batch", {"batch": 16}), ("batch", {"batch": 32}), ("batch", {"batch": 24}), ("batch", {"batch": 40}),
    ("batch", {"batch": 48}), ("revisit", {"batch": 16}), ("batch", {"batch": 64}), ("batch", {"batch": 56}),
    ("remat", {"remat": "none"}), ("remat", {"remat": "dots_with_no_batch_dims_saveable"}),
    ("revisit", {}),
    ("seq", {"arg.seq_len": 1024}), ("seq", {"arg.seq_len": 4096}), ("seq", {"arg.seq_len": 3072}),
    ("seq", {"arg.seq_len": 1536}), ("revisit", {"arg.seq_len": 4096}),
    ("batch", {"batch": 16, "arg.seq_len": 4096}), ("batch", {"batch": 24, "arg.seq_len": 4096}),
    ("precision", {"precision": "fp32"}), ("lora", {"lora": 16}), ("lora", {"lora": 16, "base-dtype": "nf4"}),
    ("mesh", {"mesh": "fsdp=16", "batch": 16}), ("mesh", {"mesh": "fsdp=4"}),
    ("gpu", {"gpu": "h200"}), ("gpu", {"gpu": "rtx-4090"}),
    ("batch", {"gpu": "h200", "batch": 16}), ("batch", {"gpu": "h200", "batch": 32}),
    ("batch", {"gpu": "h200", "batch": 24}), ("batch", {"batch": 72}), ("batch", {"batch": 80}),
    ("revisit", {"batch": 32}),
]
MODELS = {"llama": (LLAMA, MOVES_LLAMA, [{}, {"batch": 16}, {"arg.seq_len": 4096}]),
          "config": (CONFIG, MOVES_CONFIG, [{}, {"batch": 16}, {"arg.seq_len": 4096}])}


def get(url: str, timeout: float = 1200.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _flags(q: dict) -> list[str]:
    out = []
    for k, v in q.items():
        out += ["--arg", f"{k[4:]}={v}"] if k.startswith("arg.") else [f"--{k}", str(v)]
    return out


def analyze_alone(model: str, args: list[str], q: dict) -> float:
    """Wall seconds of `jaxmem analyze --json` for the point, with an empty compile cache."""
    with tempfile.TemporaryDirectory() as cache:
        t = time.perf_counter()
        subprocess.run(["jaxmem", "analyze", model, *args, *_flags(q), "--json"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "JAXMEM_CACHE": cache})
        return time.perf_counter() - t


def replay(name: str) -> dict:
    (model, args), moves, baseline = MODELS[name]
    alone = [analyze_alone(model, args, q) for q in baseline]
    cache = tempfile.mkdtemp(prefix="jaxmem-explore-bench-")
    cmd = ["jaxmem", "explore", model, *args, "--no-browser", "--jobs", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "JAXMEM_CACHE": cache})
    rows = []
    try:
        line = proc.stdout.readline()
        printed = "http://" + line.split("http://", 1)[1].split()[0]
        base, _, token = printed.partition("/?token=")   # the API's token, carried by the printed URL
        for kind, q in moves:
            url = f"{base}/api/answer?{urllib.parse.urlencode({**q, 'token': token})}"
            t0 = time.perf_counter()
            first = get(url)
            t_first = time.perf_counter() - t0
            exact = first if first["answer"] in ("exact", "error") else get(url + "&wait=exact")
            t_exact = time.perf_counter() - t0
            row = {"kind": kind, "query": q, "first": first["answer"], "t_first": t_first, "t_exact": t_exact,
                   "exact": exact["answer"], "error": exact.get("error")}
            if exact["answer"] == "exact":
                row["peak"] = exact["report"]["per_device_peak_bytes"]
            if first["answer"] == "predicted":
                pred = first["report"]
                row["predicted"] = pred["per_device_peak_bytes"]
                row["predicted_from"] = [{k: v for k, v in p.items() if k in ("batch", "arg.seq_len", "gpu")}
                                         for p in pred["predicted_from"]]
                row["curve"] = pred["prediction"]["curve"]
                if "peak" in row:
                    row["error_share"] = (row["predicted"] - row["peak"]) / row["peak"]
                    row["verdict_agrees"] = pred["verdict"] == exact["report"]["verdict"]
            rows.append(row)
            print(f"{name} {kind:9} {json.dumps(q):42} first {first['answer']:9} {t_first:7.3f} s  exact "
                  f"{t_exact:7.1f} s" + (f"  prediction error {100 * row['error_share']:+.2f}%"
                                         if "error_share" in row else ""), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)   # (a background job ignores SIGINT, and jaxmem leaves it ignored)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {"model": model, "args": args, "command": " ".join(map(shlex.quote, cmd)), "analyze_alone_s": alone,
            "moves": rows}


def _ms(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.3f} / {max(xs):.3f}"


def _s(xs: list[float]) -> str:
    return "-" if not xs else f"{statistics.median(xs):.1f} / {max(xs):.1f}"


def table(run: dict) -> list[str]:
    rows = run["moves"]
    alone = run["analyze_alone_s"]
    out = [f"### `{run['command']}`", "",
           ("`jaxmem analyze` alone, empty cache (start, batch 16, seq_len 4096): "
            f"{', '.join(f'{t:.1f} s' for t in alone)}; median {statistics.median(alone):.1f} s"), "",
           ("| kind | moves | first answer (exact / predicted / compiling) | to first answer, s (median / max) "
            "| to exact, s (median / max) | prediction error (median / max of abs) | predictions within 2% |"),
           "|---|---:|---|---:|---:|---:|---:|"]
    for k in dict.fromkeys(r["kind"] for r in rows):
        rs = [r for r in rows if r["kind"] == k]
        counts = "/".join(str(sum(r["first"] == a for r in rs)) for a in ("exact", "predicted", "compiling"))
        errs = [abs(r["error_share"]) for r in rs if "error_share" in r]
        err = "-" if not errs else f"{100 * statistics.median(errs):.2f}% / {100 * max(errs):.2f}%"
        within = "-" if not errs else f"{sum(e <= 0.02 for e in errs)} of {len(errs)}"
        out.append(f"| {k} | {len(rs)} | {counts} | {_ms([r['t_first'] for r in rs])} | "
                   f"{_s([r['t_exact'] for r in rs])} | {err} | {within} |")
    compiled = [r["t_first"] for r in rows if r["first"] == "exact"]
    predicted = [r for r in rows if r["first"] == "predicted"]
    agree = sum(r.get("verdict_agrees", False) for r in predicted)
    judged = sum("verdict_agrees" in r for r in predicted)
    errors = [r["query"] for r in rows if r["exact"] == "error"]
    out += ["", (f"- answered exact at once (compiled before): {len(compiled)} moves, max "
                 f"{max(compiled, default=0):.3f} s (target < 0.200 s)"),
            (f"- predicted first: {len(predicted)} moves, max {max((r['t_first'] for r in predicted), default=0):.3f} "
             f"s to the prediction (target < 1 s); its verdict the exact one's in {agree} of {judged}"),
            f"- moves whose exact answer was an error: {errors}" if errors else "- every move got its exact answer"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=sorted(MODELS))
    ap.add_argument("--table", action="store_true", help="Only write the table again from explore.json.")
    a = ap.parse_args()
    runs = {}
    if RAW.exists():
        runs = json.loads(RAW.read_text())
    for name in [] if a.table else ([a.only] if a.only else list(MODELS)):
        runs[name] = replay(name)
        RAW.write_text(json.dumps(runs, indent=1) + "\n")
    load = os.getloadavg()[0]
    lines = ["# jaxmem explore: moves through the HTTP API (issue 45)", "",
             (f"Made by `python benchmarks/explore.py` (jax {_jax()}), on a 2-core machine shared with other work "
              f"(load average {load:.1f} when the table was written); raw rows in `explore.json`."), ""]
    for name in MODELS:
        if name in runs:
            lines += table(runs[name]) + [""]
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))


def _jax() -> str:
    import importlib.metadata as md

    return md.version("jax")


if __name__ == "__main__":
    sys.exit(main())
