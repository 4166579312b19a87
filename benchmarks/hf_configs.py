"""Public Hugging Face configs through `jaxmem analyze config.json`: parameter counts against the
published models', and parameter + optimizer bytes per device on --mesh fsdp=8 against a hand count.

    python benchmarks/hf_configs.py                 # every config -> results/hf-configs.md
    python benchmarks/hf_configs.py --only qwen3    # the configs whose file name contains "qwen3" (no file written)
    python benchmarks/hf_configs.py --timing        # also: an 8B config vs models/llama.py's 8b, --timings
    python benchmarks/hf_configs.py --timing-only --repeats 4   # only that table, rewritten in place

The configs in benchmarks/hf_configs/ are the public config.json files of the models named (their
Hugging Face repositories). "published" is the model's parameter count as its repository states it:
the safetensors index's ``metadata.total_size`` divided by the bytes of its stored dtype (bf16: 2,
Gemma 2's fp32: 4), which is the count the model page shows rounded. "ours" is the parameter count
of the Flax decoder jaxmem builds for the config (jax.eval_shape, nothing allocated).

Per device on ``--mesh fsdp=8`` (fp32 parameters, AdamW: two fp32 moments), each config is
compiled by ``jaxmem analyze CONFIG --gpu h100 --mesh fsdp=8 --arg seq_len=512 --arg batch_size=8
--json`` in a subprocess (the sequence is shortened: parameter and optimizer bytes do not depend on
it) and its report's ``breakdown`` is compared with the hand count: every weight of these models
has a dimension 8 divides, so FSDP leaves 4 N / 8 bytes of parameters and 2 x 4 N / 8 of moments on
each device, plus AdamW's step counter (one int32, replicated: 4 bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "benchmarks" / "hf_configs"
RESULTS = ROOT / "benchmarks" / "results"

# model -> (published parameter count, where it is published)
PUBLISHED = {
    "Llama-3.1-8B": (8_030_261_248, ("meta-llama/Llama-3.1-8B: model.safetensors.index.json total_size "
                                    "16,060,522,496 B (bf16) / 2; model page: 8.03B params")),
    "Mistral-7B-v0.1": (7_241_732_096, "mistralai/Mistral-7B-v0.1: total_size 14,483,464,192 B (bf16) / 2; 7.24B"),
    "Qwen2.5-7B": (7_615_616_512, "Qwen/Qwen2.5-7B: total_size 15,231,233,024 B (bf16) / 2; model card: 7.61B"),
    "Qwen3-8B": (8_190_735_360, "Qwen/Qwen3-8B: total_size 16,381,470,720 B (bf16) / 2; model page: 8.19B"),
    "gemma-2-9b": (9_241_705_984, "google/gemma-2-9b: total_size 36,966,823,936 B (fp32) / 4; model page: 9.24B"),
    "Phi-3-mini-4k-instruct": (3_821_079_552, ("microsoft/Phi-3-mini-4k-instruct: total_size 7,642,159,104 B (bf16) / "
                                              "2; model card: 3.8B")),
    "Mixtral-8x7B-v0.1": (46_702_792_704, ("mistralai/Mixtral-8x7B-v0.1: total_size 93,405,585,408 B (bf16) / 2; "
                                          "46.7B")),
    "Qwen3-30B-A3B": (30_532_122_624, ("Qwen/Qwen3-30B-A3B: total_size 61,064,245,248 B (bf16) / 2; model card: "
                                     "30.5B")),
}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def analyze(model: str, *args: str, timeout: int = 1800) -> tuple[dict, list[str]]:
    cmd = [sys.executable, "-m", "jaxmem.cli", "analyze", model, *args, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=timeout)
    if out.returncode not in (0, 3):
        raise RuntimeError(f"{shlex.join(cmd)} exited {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout), cmd


def gib(n: int) -> str:
    return f"{n / 2**30:,.3f} GiB"


def count_rows(only: str | None) -> list[str]:
    import jaxmem  # noqa: F401  (jax's environment first)
    from jaxmem import hf

    lines = ["| model | model_type | published | ours (jax.eval_shape) | equal | published source |",
             "|---|---|---:|---:|:-:|---|"]
    for name, (published, source) in PUBLISHED.items():
        if only and only.lower() not in name.lower():
            continue
        arch = hf.load_arch(CONFIGS / f"{name}.json")
        ours = hf.parameter_count(arch)
        equal = "yes" if ours == published else "NO"
        lines.append(f"| {name} | {arch.model_type} | {published:,} | {ours:,} | {equal} "
                     f"| {source} |")
        print(lines[-1], flush=True)
    return lines


def fsdp_rows(only: str | None) -> list[str]:
    lines = [("| model | params/device (jaxmem) | by hand 4N/8 | optimizer/device (jaxmem) | by hand 8N/8 + 4 | "
             "equal | compile s |"), "|---|---:|---:|---:|---:|:-:|---:|"]
    for name, (_published, _) in PUBLISHED.items():
        if only and only.lower() not in name.lower():
            continue
        t0 = time.perf_counter()
        d, _cmd = analyze(f"benchmarks/hf_configs/{name}.json", "--gpu", "h100", "--mesh", "fsdp=8",
                         "--arg", "seq_len=512", "--arg", "batch_size=8", "--no-cache")
        secs = time.perf_counter() - t0
        n = d["hf_config"]["parameters"]
        params, opt = d["breakdown"]["params"], d["breakdown"]["optimizer_state"]
        hand_p, hand_o = 4 * n // 8, 8 * n // 8 + 4
        ok = params == hand_p and opt == hand_o
        lines.append(f"| {name} | {params:,} ({gib(params)}) | {hand_p:,} | {opt:,} ({gib(opt)}) | {hand_o:,} | "
                     f"{'yes' if ok else 'NO'} | {secs:.0f} |")
        print(lines[-1], flush=True)
    return lines


def timing_rows(repeats: int) -> list[str]:
    """An 8B config against the same model from models/llama.py, same options, compile cache off."""
    common = ["--gpu", "h100", "--mesh", "fsdp=8", "--no-cache", "--timings"]
    cases = [("benchmarks/hf_configs/Llama-3.1-8B.json", []), ("models/llama.py", ["--arg", "preset=8b"])]
    lines = ["| run | model | process wall s | jaxmem total_s | lowered s | compiled s | peak/device | params |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for i in range(repeats):
        # ABBA order: a load that rises or falls over the run falls on both alike
        for model, extra in (cases if i % 2 == 0 else cases[::-1]):
            t0 = time.perf_counter()
            d, _ = analyze(model, *extra, *common)
            wall = time.perf_counter() - t0
            t = d["timings"]
            lines.append(f"| {i + 1} | `{model}` | {wall:.1f} | {t.get('total_s', float('nan')):.1f} | "
                         f"{t.get('lower_s', float('nan')):.1f} | {t.get('compile_s', float('nan')):.1f} | "
                         f"{gib(d['per_device_peak_bytes'])} | {d['param_count']:,} |")
            print(lines[-1], flush=True)
    return lines


def same_program() -> str:
    """Whether the config's model and models/llama.py's 8b lower to the same program: the StableHLO of
    jax.jit(jax.value_and_grad(loss)) over the abstract parameters and batch, compared as text."""
    import jax

    import jaxmem  # noqa: F401  (jax's environment first)
    from jaxmem.program.workload import load_workload

    def text(path: str, **args) -> str:
        wl = load_workload(str(ROOT / path), **args)
        params = jax.eval_shape(lambda: wl.model.init(jax.random.key(0), wl.batch["tokens"]))
        step = jax.jit(jax.value_and_grad(lambda p, b: wl.loss(wl.model.bind(p), b)))
        return step.lower(params, wl.batch).as_text()

    a = text("benchmarks/hf_configs/Llama-3.1-8B.json")
    b = text("models/llama.py", preset="8b")
    return (f"The two lower to {'the same' if a == b else 'DIFFERENT'} program: the StableHLO text of "
            f"`jax.jit(jax.value_and_grad(loss))` is {'identical' if a == b else 'not identical'} "
            f"({len(a):,} and {len(b):,} characters), so their compile times differ only by the machine's load "
            "(2 shared cores, other jobs running): each row is one run.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="only the configs whose name contains this (no file written)")
    ap.add_argument("--timing", action="store_true", help="also time an 8B config against models/llama.py")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-fsdp", action="store_true", help="skip the fsdp=8 compiles (counts only)")
    ap.add_argument("--timing-only", action="store_true",
                    help="only the timing table, replacing that section of results/hf-configs.md")
    a = ap.parse_args()
    heading = ("## A config.json against the same model's file (Llama 3.1 8B, `--gpu h100 --mesh fsdp=8 "
               "--no-cache`; ABBA order)")
    if a.timing_only:
        path = RESULTS / "hf-configs.md"
        kept = path.read_text().split("\n## A config.json against")[0].rstrip("\n")
        rows = timing_rows(a.repeats)
        path.write_text(kept + "\n\n" + heading + "\n\n`python benchmarks/hf_configs.py --timing-only "
                        f"--repeats {a.repeats}`\n\n" + "\n".join(rows) + "\n\n" + same_program() + "\n")
        return
    out = ["# Hugging Face configs: parameter counts and per-device state", "",
           "`python benchmarks/hf_configs.py" + (" --timing" if a.timing else "") + "` (benchmarks/hf_configs.py "
           "says how each column is made).", "", "## Parameter counts", ""]
    out += count_rows(a.only)
    if not a.no_fsdp:
        out += ["", "## Parameters and optimizer state per device, `--mesh fsdp=8` (fp32, AdamW)", ""]
        out += fsdp_rows(a.only)
    if a.timing:
        out += ["", heading, ""]
        out += timing_rows(a.repeats)
        out += ["", same_program()]
    if a.only is None:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "hf-configs.md").write_text("\n".join(out) + "\n")
        print("wrote", RESULTS / "hf-configs.md", file=sys.stderr)


if __name__ == "__main__":
    main()
