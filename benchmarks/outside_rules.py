"""Outside code run as written, with and without the user's own rules (issue 51 points 2 and 5): the
peak, the verdict, every `choices` source, the logical names' rules as stated, and the warnings.

    python benchmarks/outside_rules.py            # writes benchmarks/results/outside-rules.md

Rows: big_vision's ViT-B/16 as big_vision writes it (benchmarks/outside/bv_vit.py, act_* names) on
8 x H100, fsdp, bf16, batch 4096 -- jaxmem's default (big_vision's convention recognised) and the user's
own big_vision rule (--rules), against act_batch kept whole (--rules [["act_batch", null]]: what
jaxmem did silently before it knew big_vision's names); an Equinox GPT-2 small
(benchmarks/outside/eqx_gpt2.py) with GPT-2's 50257-row vocabulary and nanoGPT's padded 50304; the
NNX models of ../shared/outside. Each row is one ``python -m jaxmem.cli analyze ... --json --no-cache``
in a child process.
"""

from __future__ import annotations

import json
import pathlib
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "outside-rules.md"
SHARED = ROOT.parent / "shared" / "outside"
VIT = ["benchmarks/outside/bv_vit.py", "--arg", "variant=B/16", "--mesh", "data=8", "--precision", "bf16",
       "--batch", "4096", "--layout", "fsdp"]
GPT2 = ["benchmarks/outside/eqx_gpt2.py", "--mesh", "data=8"]


def rows(rules_file: str) -> list[tuple[str, list[str]]]:
    out = [("big_vision ViT-B/16, jaxmem's default", VIT),
           ("big_vision ViT-B/16, act_batch kept whole (the old silent answer, now only by --rules)",
            VIT + ["--rules", rules_file.replace("big_vision_rules", "act_whole")]),
           ("big_vision ViT-B/16, the user's big_vision rule (--rules)", VIT + ["--rules", rules_file]),
           ("Equinox GPT-2 small, vocab 50257", GPT2 + ["--arg", "vocab=50257"]),
           ("Equinox GPT-2 small, vocab 50304 (nanoGPT's padding)", GPT2 + ["--arg", "vocab=50304"])]
    for name in ("nnx_bf16.py", "nnx_scan_vmap.py", "encoder_dense_general.py", "scan_bf16_cudnn.py"):
        out.append((f"shared/outside/{name}", [str(SHARED / name), "--mesh", "data=8", "--batch", "16"]))
    out.append(("shared/outside/nnx_explicit.py", [str(SHARED / "nnx_explicit.py"), "--mesh", "fsdp=2",
                                                   "--axis-types", "explicit"]))
    return out


def run(args: list[str]) -> tuple[dict | None, str, float, int]:
    cmd = [sys.executable, "-m", "jaxmem.cli", "analyze", *args, "--gpu", "h100", "--json", "--no-cache"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - t0
    try:
        return json.loads(p.stdout), "", took, p.returncode
    except json.JSONDecodeError:
        return None, (p.stderr or p.stdout).strip().splitlines()[0][:160], took, p.returncode


def describe(d: dict) -> tuple[str, str, str]:
    c = d.get("choices", {})
    sources = ", ".join(f"{k}={v}" for k, v in sorted(c.get("sources", {}).items()))
    names = "; ".join(f"{r['name']}->{r['mesh_axes'] or 'whole'} ({r['source']}: {r['convention'].split(':')[0][:40]})"
                      for r in c.get("logical_rules", ())) or "none"
    poor = [f"{p['path']} pad {p['padded_to']}" for p in c.get("fallback_poor", ())]
    warnings = ", ".join(sorted({w["kind"] for w in d.get("warnings", ())})) or "none"
    return sources, names + (f"; fallback poor: {', '.join(poor)}" if poor else ""), warnings


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rules_file = str(pathlib.Path(tmp) / "big_vision_rules.json")
        pathlib.Path(rules_file).write_text(json.dumps([["act_batch", "data"]]))   # big_vision/train.py's default
        # what jaxmem did before it knew big_vision's names: every act_* dimension whole
        (pathlib.Path(tmp) / "act_whole.json").write_text(json.dumps([["act_batch", None]]))
        lines = ["# Outside code, with and without the user's rules (benchmarks/outside_rules.py)", "",
                 (f"`python benchmarks/outside_rules.py`, jaxmem analyze --gpu h100 --json --no-cache per row; "
                  f"{time.strftime('%Y-%m-%d')}, this CPU-only machine (deviceless compiles)."), "",
                 "| case | command | exit | peak GiB | verdict | logical names as stated | warnings | s |",
                 "|---|---|---|---|---|---|---|---|"]
        detail = ["", "## choices sources per row", ""]
        for name, args in rows(rules_file):
            d, err, took, rc = run(args)
            shown = " ".join(shlex.quote(a.replace(str(SHARED), "../shared/outside").replace(tmp + "/", ""))
                             for a in args)
            if d is None:
                lines.append(f"| {name} | `{shown}` | {rc} | - | - | {err} | - | {took:.0f} |")
                print(name, rc, err, flush=True)
                continue
            sources, names, warnings = describe(d)
            peak = d["per_device_peak_bytes"] / 2**30
            lines.append(f"| {name} | `{shown}` | {rc} | {peak:.2f} | {d.get('verdict')} | {names} | {warnings} | "
                         f"{took:.0f} |")
            detail.append(f"- {name}: {sources}")
            print(name, f"{peak:.2f} GiB", d.get("verdict"), warnings, flush=True)
    OUT.write_text("\n".join(lines + detail) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
