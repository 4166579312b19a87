"""Every hostile-input probe of tests/probe_cases.py through the real CLI, each in a fresh process.

Prints one row per probe -- the exit code it must give and gave, whether a traceback was
printed, what it left in TMPDIR, the seconds it took and its message -- and writes the same
table to benchmarks/results/probes.md. Exit status 1 when any probe breaks its promise.

    python benchmarks/probes.py                 # all probes (a few minutes on 2 busy cores)
    python benchmarks/probes.py -k SIGTERM      # the probes whose name contains SIGTERM
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import platform
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import probe_cases as pc  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default=None, help="only probes whose name contains this text")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "probes.md"))
    a = ap.parse_args()
    probes = [p for p in pc.PROBES if a.k is None or a.k.lower() in p.id.lower()]
    rows, broken = [], 0
    print(f"{'probe':<52} {'exit':>9} {'tb':>3} {'left':>5} {'s':>6}  message / problems", flush=True)
    for p in probes:
        with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as scratch:
            out = pc.run_in_subprocess(p, tmp, scratch)
        ok = not out.problems
        broken += not ok
        msg = next((ln for ln in out.stderr.splitlines() if ln.startswith(("error:", "Error:", "jaxmem"))), "")
        msg = msg.replace("|", "\\|")[:150]
        if out.after_signal is not None:
            msg = f"[exit {out.after_signal:.1f} s after the signal] {msg}"
        rows.append((p, out, ok, msg))
        print(f"{p.id[:52]:<52} {f'{out.exit}/{p.exit}':>9} {'y' if out.traceback else 'n':>3} "
              f"{len(out.leftovers):>5} {out.seconds:>6.1f}  {'' if ok else 'BROKEN ' + '; '.join(out.problems) + ' | '}"
              f"{msg}", flush=True)
    kept = len(rows) - broken
    print(f"\n{kept}/{len(rows)} probes kept their promise; tracebacks: {sum(o.traceback for _, o, _, _ in rows)}; "
          f"runs that left files in TMPDIR: {sum(bool(o.leftovers) for _, o, _, _ in rows)}")
    if a.k is None:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
        lines = [
            "# Hostile-input probes", "",
            f"`python benchmarks/probes.py` on {datetime.date.today()}, commit {rev.strip()}, "
            f"{platform.machine()} with {platform.python_version()}: every probe of `tests/probe_cases.py` "
            "run as `python -m jaxmem.cli ...` in a fresh process with its own TMPDIR.", "",
            f"**{kept}/{len(rows)} kept their promise**; tracebacks: "
            f"{sum(o.traceback for _, o, _, _ in rows)}; runs that left files in TMPDIR: "
            f"{sum(bool(o.leftovers) for _, o, _, _ in rows)}.", "",
            "Exit codes: 0 fits, 3 does not fit, 2 user error, 1 jaxmem bug; 128+N a signal "
            "(a signal during C code that holds the GIL: the clean-up helper ends jaxmem with SIGKILL, 137).", "",
            "| probe | exit (must) | traceback | left in TMPDIR | s | kept | message |",
            "|---|---|---|---|---|---|---|",
        ]
        for p, out, ok, msg in rows:
            lines.append(f"| {p.id} | {out.exit} ({p.exit}) | {'yes' if out.traceback else 'no'} | "
                         f"{len(out.leftovers)} | {out.seconds:.1f} | {'yes' if ok else 'NO: ' + '; '.join(out.problems)}"
                         f" | {msg} |")
        pathlib.Path(a.out).write_text("\n".join(lines) + "\n")
        print(f"wrote {a.out}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
