"""Activation offload on the shipped Llama: what each remat policy keeps on the device, what moves to
pinned host memory, and what the trip costs in the step-time estimate.

Each row is one `jaxmem analyze` (the command is printed beside it); the policies are MaxText's
(src/maxtext/layers/decoders.py, get_remat_policy; names from maxtext_utils.get_save_and_offload_names),
written as jaxmem's --remat.

    python benchmarks/activation_offload.py                  # Llama 3 8B, FSDP over 8 H100s, bf16
    python benchmarks/activation_offload.py --preset 1b --mesh data=4
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
QKV = "query_proj,key_proj,value_proj"
MINIMAL = "query_proj,key_proj,value_proj,out_proj,mlpwi_0,mlpwi_1,mlpwo"
# (MaxText's remat_policy, jaxmem's arguments)
POLICIES = (
    ("full", ["--remat", "full"]),
    ("save_qkv_proj", ["--remat", "full", "--arg", f"remat_save={QKV}"]),
    ("qkv_proj_offloaded", ["--remat", f"offload:{QKV}"]),
    ("minimal", ["--remat", "full", "--arg", f"remat_save={MINIMAL}"]),
    ("minimal_offloaded", ["--remat", f"offload:{MINIMAL}"]),
    ("(jax) dots_with_no_batch_dims_saveable", ["--remat", "dots_with_no_batch_dims_saveable"]),
    ("(jax) offload_dot_with_no_batch_dims", ["--remat", "offload_dots"]),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="8b")
    ap.add_argument("--mesh", default="data=8")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "activation-offload.md"))
    a = ap.parse_args()
    rows = []
    for maxtext, args in POLICIES:
        cmd = ["jaxmem", "analyze", "models/llama.py", "--arg", f"preset={a.preset}", "--mesh", a.mesh, "--gpu",
               a.gpu, "--precision", "bf16", *args, "--no-explain", "--json"]
        p = subprocess.run([sys.executable, "-m", "jaxmem.cli", *cmd[1:]], cwd=ROOT, capture_output=True, text=True)
        if p.returncode not in (0, 3):
            print(f"{maxtext}: exit {p.returncode}: {p.stderr.strip()[-300:]}", file=sys.stderr)
            return 1
        r = json.loads(p.stdout)
        st = r["step_time"]
        rows.append((maxtext, shlex.join(cmd[:-1]), r["per_device_peak_bytes"],
                     r["breakdown"]["activations_and_temporaries"], r["host"].get("activations", 0),
                     st.get("host_transfer_bytes", 0), st.get("host_transfer_s", 0.0), st.get("estimate_s"),
                     r["fits"]))
        print(f"{maxtext:<58} peak {rows[-1][2] / 2**30:6.2f} GiB  host {rows[-1][4] / 2**30:6.2f} GiB", flush=True)
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    import jax

    lines = [
        "# Activation offload: device peak and host bytes per remat policy",
        "",
        f"`python benchmarks/activation_offload.py --preset {a.preset} --mesh {a.mesh} --gpu {a.gpu}` on "
        f"{datetime.date.today()}, commit {commit.strip()}, jax {jax.__version__}, {platform.machine()} "
        f"(deviceless compiles for {a.gpu}; the host transfers are charged at the card's host link: "
        "`jaxmem gpus --json`, host_bandwidth). Per device, Llama "
        f"{a.preset}, bf16 compute, AdamW, FSDP over `{a.mesh}`.",
        "",
        "| MaxText remat_policy | device peak | activations + temporaries | pinned host | host traffic per step "
        "| of which step time | step estimate | fits | command |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for maxtext, cmd, peak, acts, host, traffic, host_s, est, fits in rows:
        lines.append(f"| {maxtext} | {gib(peak)} | {gib(acts)} | {gib(host)} | {gib(traffic)} | "
                     f"{host_s * 1e3:.1f} ms | {'' if est is None else f'{est * 1e3:.0f} ms'} | {fits} | `{cmd}` |")
    pathlib.Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
