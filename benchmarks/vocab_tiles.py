"""The vocabulary-tiled loss (``--arg vocab_tiles=N``, as MaxText's ``num_vocab_tiling``) against the
plain loss on public config.json models: the per-device peak, the logits live at it, and the step time.

    python benchmarks/vocab_tiles.py              # every setting -> results/vocab-tiles.md
    python benchmarks/vocab_tiles.py --only gemma # the settings whose name contains "gemma" (no file written)

Each row is ``jaxmem analyze CONFIG --gpu h100 --precision bf16 --remat full --lora 16 --arg batch_size=B
--arg seq_len=T --arg vocab_tiles=N --json`` in a subprocess. "logits at the peak" sums the buffers live
at the peak whose last dimension is the vocabulary and whose rows are at least one sequence's
(jaxmem.present.levers.logits_buffers: the fp32 logits, their bf16 copies and gradients; not the
head's weights or their (embed, vocab) copies); "largest of them" is the largest such buffer. The step
time is jaxmem's estimate from the compiled program (no GPU ran it): kernels at measured rates; tiling
adds the recomputed logits (one more head matmul forward per tile) and the scan's per-tile launches.
"TFLOP" is the estimate's FLOPs per device per step. "XLA rematerialized": XLA's own pass recomputed
instructions to bring the step under its budget for the card (about 80% of it): such a row's peak sits at
that budget and its time holds the recompute (the report's xla_rematerialized warning).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "benchmarks" / "hf_configs"
RESULT = ROOT / "benchmarks" / "results" / "vocab-tiles.md"
COMMON = ("--gpu", "h100", "--precision", "bf16", "--remat", "full", "--lora", "16")

# name -> (config, batch, seq_len, the tile counts): Llama 3.1 8B is the case (batch 4 x 2048, where
# the f32 logits were the top buffer); Gemma 2 9B has the largest vocabulary (256,000) and a tied head
SETTINGS = {
    "Llama-3.1-8B": ("Llama-3.1-8B.json", 4, 2048, (1, 4, 8, 16)),
    "gemma-2-9b": ("gemma-2-9b.json", 2, 2048, (1, 8)),
}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def analyze(args: list[str]) -> dict:
    cmd = [sys.executable, "-m", "jaxmem.cli", "analyze", *args, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=3600)
    if out.returncode not in (0, 3):
        raise RuntimeError(f"{shlex.join(cmd)} exited {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def _squeezed(r) -> str:
    """Whether XLA's rematerialization pass recomputed to bring the step under its budget for the card
    (then the peak sits at that budget and the estimate holds the recompute)."""
    w = next((w for w in r.warnings if w.kind == "xla_rematerialized"), None)
    return "no" if w is None else f"yes (as written {gib(r.per_device_peak_bytes + w.bytes)})" if w.bytes else "yes"


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def rows(only: str | None) -> list[str]:
    import jaxmem  # noqa: F401  (jax's environment first)
    from jaxmem.present import levers
    from jaxmem.report import Report

    out = [("| model | batch x seq | vocab_tiles | peak/device | logits at the peak | largest of them | "
            "step (estimate, band) | TFLOP | peak vs plain | step vs plain | XLA rematerialized |"),
           "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for name, (config, batch, seq, tiles) in SETTINGS.items():
        if only and only.lower() not in name.lower():
            continue
        plain: Report | None = None
        for n in tiles:
            args = [f"benchmarks/hf_configs/{config}", *COMMON, "--arg", f"batch_size={batch}", "--arg",
                    f"seq_len={seq}", "--arg", f"vocab_tiles={n}"]
            r = Report.from_json(analyze(args))
            print(f"$ jaxmem analyze {shlex.join(args)}: {r.per_device_peak_bytes:,}", file=sys.stderr, flush=True)
            plain = plain or r
            st = r.step_time
            shaped = levers.logits_buffers(r, r.hf_config["vocab_size"])
            top = max(shaped, key=lambda b: b.size, default=None)
            logits = sum(b.size for b in shaped)
            out.append(
                f"| {name} | {batch} x {seq} | {n} | {gib(r.per_device_peak_bytes)} | {gib(logits)} | "
                f"{'-' if top is None else f'{top.dtype}{top.shape} {gib(top.size)}'} | "
                f"{st['estimate_s'] * 1e3:,.0f} ms "
                f"({st['low_s'] * 1e3:,.0f}-{st['high_s'] * 1e3:,.0f}) | {st['flops'] / 1e12:,.1f} | "
                f"{r.per_device_peak_bytes / plain.per_device_peak_bytes:.2f} | "
                f"{st['estimate_s'] / plain.step_time['estimate_s']:.2f} | {_squeezed(r)} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only")
    a = ap.parse_args()
    table = rows(a.only)
    import jax

    text = "\n".join([
        "# The vocabulary-tiled loss against the plain loss",
        "",
        f"`python benchmarks/vocab_tiles.py` (jax {jax.__version__}; benchmarks/vocab_tiles.py says how each column "
        "is made). Every row: `jaxmem analyze benchmarks/hf_configs/MODEL.json " + " ".join(COMMON)
        + " --arg batch_size=B --arg seq_len=T --arg vocab_tiles=N`; vocab_tiles=1 is the plain loss.",
        "",
        *table,
        "",
    ])
    if a.only:
        print(text)
    else:
        RESULT.write_text(text)
        print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
