"""Speed and footprint of `jaxmem analyze` on real model sizes, on this machine.

Each case is a fresh `jaxmem analyze` process (Python start-up included), timed
wall-clock, with two memory footprints: the largest single process (ru_maxrss, from the
kernel) and the whole process tree at once (jaxmem and the child its GPU compile runs in,
summed; sampled from /proc every 0.1 s, so a shorter peak can be missed); each is run
REPEATS times and the median wall time (max footprints) is reported.

    python benchmarks/speed.py            # prints the table, writes benchmarks/results/speed.md
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPEATS = 3
CASES = [
    # name, args, target wall seconds, target peak RSS bytes
    # README's command 1, exactly as printed there (README cites this row for its time and RSS)
    ("README command 1: llama 8b, fsdp data=8, h100, remat full, bf16",
     ["models/llama.py", "--mesh", "data=8", "--remat", "full", "--precision", "bf16"], 20, 2 << 30),
    ("llama 8b, fsdp data=8, h100", ["models/llama.py", "--arg", "preset=8b", "--gpu", "h100", "--mesh", "data=8",
                                     "--layout", "fsdp"], 20, 2 << 30),
    ("llama 8b, fsdp data=8, h100, --no-explain", ["models/llama.py", "--arg", "preset=8b", "--gpu", "h100", "--mesh",
                                                   "data=8", "--layout", "fsdp", "--no-explain"], 20, 2 << 30),
    ("llama 70b, fsdp 4 hosts x 8, h100", ["models/llama.py", "--arg", "preset=70b", "--gpu", "h100", "--mesh",
                                           "data=32", "--hosts", "4", "--batch", "32", "--layout", "fsdp"], 60, None),
    ("llama 70b, fsdp 4 hosts x 8, h100, --no-explain", ["models/llama.py", "--arg", "preset=70b", "--gpu", "h100",
                                                         "--mesh", "data=32", "--hosts", "4", "--batch", "32",
                                                         "--layout", "fsdp", "--no-explain"], 60, None),
]


def one(args: list[str]) -> dict:
    """Run one analysis in a child process; wall time and the child's peak RSS."""
    t0 = time.perf_counter()
    # A wrapper process per case, so RUSAGE_CHILDREN is this case's alone.
    code = ("import resource,subprocess,sys,json;"
            "p=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
            "print(json.dumps({'rc':p.returncode,'out':p.stdout,'err':p.stderr[-2000:],"
            "'rss':resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss*1024}))")
    # --no-cache: every repeat compiles (a cache hit would time the cache); --timings: the phases in the JSON
    jaxmem = [sys.executable, "-m", "jaxmem.cli", "analyze", *args, "--json", "--no-cache", "--timings"]
    proc = subprocess.Popen([sys.executable, "-c", code, *jaxmem], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)
    out: dict = {}
    reader = threading.Thread(target=lambda: out.update(zip(("stdout", "stderr"), proc.communicate())))
    reader.start()
    tree = 0
    while reader.is_alive():
        tree = max(tree, _tree_rss(proc.pid))
        reader.join(0.1)
    wall = time.perf_counter() - t0
    res = json.loads(out["stdout"])
    if res["rc"] not in (0, 3):
        raise SystemExit(f"{' '.join(args)} failed:\n{res['err']}")
    report = json.loads(res["out"])
    return {"wall_s": wall, "rss": res["rss"], "tree_rss": tree, "report": report}


def _tree_rss(root: int) -> int:
    """Resident bytes of `root` and all its descendants, now (Linux /proc)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    total, stack, page = 0, [root], os.sysconf("SC_PAGE_SIZE")
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
        stack += kids.get(pid, [])
    return total


def gib(n):
    return f"{n / (1 << 30):.2f} GiB"


def main() -> None:
    load0 = os.getloadavg()[0]
    rows = []
    for name, args, t_wall, t_rss in CASES:
        runs = [one(args) for _ in range(REPEATS)]
        r = sorted(runs, key=lambda x: x["wall_s"])[REPEATS // 2]
        r = {**r, "rss": max(x["rss"] for x in runs), "tree_rss": max(x["tree_rss"] for x in runs)}
        rep = r["report"]
        ok = r["wall_s"] <= t_wall and (t_rss is None or max(r["rss"], r["tree_rss"]) <= t_rss)
        rows.append((name, r, rep, t_wall, t_rss, ok))
        print(f"{name}: {r['wall_s']:.1f} s, RSS {gib(r['rss'])}, peak/device {gib(rep['per_device_peak_bytes'])}, "
              f"compile {rep['timings']['compile_s']:.1f} s, decode {rep['timings']['decode_s']:.2f} s", flush=True)

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    lines = [
        "# jaxmem analyze: speed and footprint",
        "",
        f"Machine: {os.cpu_count()} cores ({cpu}); Python {platform.python_version()}; "
        f"jax {rows[0][2]['versions']['jax']}, flax {rows[0][2]['versions']['flax']}; "
        f"{datetime.date.today().isoformat()}. Command: `python benchmarks/speed.py`.",
        "",
        f"Wall time is the whole `jaxmem analyze ... --json` process, Python start-up included; median of "
        f"{REPEATS} runs (footprints: the largest). A deviceless GPU compile runs in a child process "
        "(jaxmem/compiler/early_stop.py): `peak RSS` is the largest single process, `tree` the parent and its "
        f"child at once (sampled every 0.1 s); the target applies to both. Load average at the start: {load0:.1f}.",
        "",
        "| case | params | per-device peak | fits | wall | target | peak RSS | tree | target | compile | "
        "decode+attribution | ok |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r, rep, t_wall, t_rss, ok in rows:
        lines.append(
            f"| {name} | {rep['param_count'] / 1e9:.2f} B | {gib(rep['per_device_peak_bytes'])} | {rep['fits']} | "
            f"{r['wall_s']:.1f} s | <= {t_wall} s | {gib(r['rss'])} | {gib(r['tree_rss'])} | "
            f"{'<= ' + gib(t_rss) if t_rss else '-'} | "
            f"{rep['timings']['compile_s']:.1f} s | {rep['timings']['decode_s']:.2f} s | {'yes' if ok else 'NO'} |")
    # The budget: decoding + attribution at most 20% of analyze's time.
    pairs = [(rows[0], rows[1]), (rows[2], rows[3])]
    lines += ["", "| case | with explanation | without | added |", "|---|---:|---:|---:|"]
    for (n1, r1, *_), (_, r2, *_) in pairs:
        lines.append(f"| {n1} | {r1['wall_s']:.1f} s | {r2['wall_s']:.1f} s | "
                     f"{100 * (r1['wall_s'] - r2['wall_s']) / r2['wall_s']:+.0f}% |")
    # The budget: the HTML report of the 8B preset under 5 MB.
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "llama-8b.html"
        one(CASES[0][1] + ["--html", str(html)])
        lines += ["", f"HTML report of the first case (`--html`): {html.stat().st_size / 1024:.0f} KiB (budget 5 MB)."]
    text = "\n".join(lines) + "\n"
    out = ROOT / "benchmarks" / "results" / "speed.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
