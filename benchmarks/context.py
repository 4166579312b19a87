"""Context parallelism on a long-context Llama: per-device memory at context 1, 2, 4, 8.

The global batch stays the same; an fsdp axis of 8 shards the state; a context axis of c splits
every sequence c ways (8 x c H100s). Prints and writes a table: per-device peak, activations,
state, and the estimated step time with its communication over the context axis (attention's
key/value gathers).

    python benchmarks/context.py                    # llama 8b at 32768 tokens, bf16, cuDNN attention, remat full
    python benchmarks/context.py --arg preset=tiny --arg seq_len=4096 --precision fp32 --remat none --arg attention=xla

Options after the script name are `jaxmem analyze` options (they replace the defaults of the same
name); writes benchmarks/results/context-<preset>.md.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jaxmem
from jaxmem.units import fmt_bytes, fmt_seconds

# Llama 3 8B at 32768 tokens with cuDNN attention (bf16 compute), fully rematerialized
DEFAULTS = {"gpu": "h100", "batch": 8, "precision": "bf16", "remat": "full",
            "args": {"preset": "8b", "seq_len": 32768, "attention": "cudnn"}}
CONTEXTS = (1, 2, 4, 8)


def options(argv: list[str]) -> dict:
    opts = {**DEFAULTS, "args": dict(DEFAULTS["args"])}
    it = iter(argv)
    for flag in it:
        value = next(it)
        if flag == "--arg":
            key, _, v = value.partition("=")
            opts["args"][key] = int(v) if v.isdigit() else v
        else:
            opts[flag.lstrip("-").replace("-", "_")] = int(value) if value.isdigit() else value
    return opts


def main() -> None:
    opts = options(sys.argv[1:])
    rows = []
    for c in CONTEXTS:
        mesh = "fsdp=8" + (f",context={c}" if c > 1 else "")
        r = jaxmem.analyze(ROOT / "models" / "llama.py", mesh=mesh, explain=False, **opts)
        st = r.step_time
        ctx_comm = sum(x["time_s"] for x in st.get("collectives", ()) if "context" in x["axes"])
        rows.append((c, r.target.devices, r.per_device_peak_bytes, r.breakdown["activations_and_temporaries"],
                     r.per_device_peak_bytes - r.breakdown["activations_and_temporaries"],
                     st.get("estimate_s"), ctx_comm, r.fits))
        print(f"context={c}: peak {fmt_bytes(rows[-1][2])}, activations {fmt_bytes(rows[-1][3])}", flush=True)
    base_acts = rows[0][3]
    preset = opts["args"].get("preset", "llama")
    cmd = "python benchmarks/context.py" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:])
    text = "\n".join([
        (f"# Context parallelism: llama {preset}, {opts['args'].get('seq_len', 'default')} tokens, global batch "
         f"{opts['batch']}, {opts['precision']}, remat {opts['remat']}, fsdp=8 x context on {opts['gpu']}"),
        "",
        f"Command: `{cmd}`",
        "",
        ("| context | GPUs | peak per device | activations + temporaries | x context=1 | state and the rest | "
         "step (est.) | of it over context | fits |"),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        *[f"| {c} | {n} | {fmt_bytes(p)} | {fmt_bytes(a)} | {a / base_acts:.3f} | {fmt_bytes(s)} | {fmt_seconds(t)} | "
          f"{fmt_seconds(cc)} | {'yes' if f else 'no'} |" for c, n, p, a, s, t, cc, f in rows],
        "",
    ])
    out = ROOT / "benchmarks" / "results" / f"context-{preset}.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
