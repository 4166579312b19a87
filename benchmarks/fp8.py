"""--precision fp8 against bf16 on the shipped Llama: the device peak, where it goes, and the
step-time estimate (FP8 dots at the card's FP8 rate, read from the compiled program's operand types).

    python benchmarks/fp8.py                      # Llama 3 8B, FSDP over 8 H100s
    python benchmarks/fp8.py --preset 1b --mesh data=4
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

ROOT = pathlib.Path(__file__).resolve().parent.parent
KEYS = ("params", "optimizer_state", "fp8_state", "activations_and_temporaries")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="8b")
    ap.add_argument("--mesh", default="data=8")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--remat", default="full")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fp8.md"))
    a = ap.parse_args()
    rows = []
    for precision in ("bf16", "fp8"):
        cmd = ["jaxmem", "analyze", "models/llama.py", "--arg", f"preset={a.preset}", "--mesh", a.mesh, "--gpu", a.gpu,
               "--remat", a.remat, "--precision", precision, "--no-explain", "--json"]
        p = subprocess.run([sys.executable, "-m", "jaxmem.cli", *cmd[1:]], cwd=ROOT, capture_output=True, text=True)
        if p.returncode not in (0, 3):
            print(f"{precision}: exit {p.returncode}: {p.stderr.strip()[-400:]}", file=sys.stderr)
            return 1
        r = json.loads(p.stdout)
        st = r["step_time"]
        peaks = {x["kind"]: x for x in st["compute_peaks"]}
        dots = sum(x["flops"] for k, x in peaks.items() if k != "non-dot")
        fp8_share = peaks["fp8"]["flops"] / dots if "fp8" in peaks and dots else 0.0
        rows.append((precision, shlex.join(cmd[:-1]), r["per_device_peak_bytes"], r["breakdown"], fp8_share,
                     st["compute_s"], st["estimate_s"], r["fits"]))
        print(f"{precision}: peak {r['per_device_peak_bytes'] / 2**30:.2f} GiB, step {st['estimate_s'] * 1e3:.0f} ms",
              flush=True)
    gib = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.2f} MiB"  # noqa: E731
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    import jax

    lines = [
        "# FP8 against bf16: device peak and step estimate",
        "",
        f"`python benchmarks/fp8.py --preset {a.preset} --mesh {a.mesh} --gpu {a.gpu} --remat {a.remat}` on "
        f"{datetime.date.today()}, commit {commit.strip()}, jax {jax.__version__}, {platform.machine()} (deviceless "
        f"compiles for {a.gpu}). Per device, Llama {a.preset}, AdamW, FSDP over `{a.mesh}`, --remat {a.remat}.",
        "",
        "| precision | device peak | " + " | ".join(KEYS) + " | dot FLOPs in FP8 | compute | step estimate | fits "
        "| command |",
        "|---" * (len(KEYS) + 7) + "|",
    ]
    for precision, cmd, peak, bd, share, comp, est, fits in rows:
        lines.append(f"| {precision} | {gib(peak)} | " + " | ".join(gib(bd.get(k, 0)) for k in KEYS)
                     + f" | {100 * share:.1f}% | {comp * 1e3:.0f} ms | {est * 1e3:.0f} ms | {fits} | `{cmd}` |")
    pathlib.Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
