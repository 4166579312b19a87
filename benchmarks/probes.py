"""Every hostile-input probe (tests/probe_cases.py; and tests/probe_trust.py: tampered caches, signals at
random points, killed sweeps, the environment) through the real CLI, each in a fresh process.

Prints one row per probe -- the exit code it must give and gave, whether a traceback was
printed, what it left in TMPDIR, the seconds it took and its message -- and writes the same
table to benchmarks/results/probes.md, with a summary per class and the counts the "Answers that
cannot be forged or lost" issue asks for. Exit status 1 when any probe breaks its promise.

    python benchmarks/probes.py                 # all probes (a few minutes on 2 busy cores)
    python benchmarks/probes.py -k SIGTERM      # the probes whose name contains SIGTERM
    python benchmarks/probes.py --round3        # only issue 35's classes (tests/test_hostile.py, test_precheck.py)
    python benchmarks/probes.py --round4        # only issue 47's probes (tests/probe_round4.py): probes-round4.md

Issue 35's classes ("trust, round three") are pytest tests, not Probe rows: they run here through
pytest (each test id a row, its class from the words of its name: ROUND3_CLASSES), and their table
follows the probes' in the results file.
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import platform
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]   # this checkout's jaxmem, as the probes' runs use
import probe_cases as pc  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default=None, help="only probes whose name contains this text")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "probes.md"))
    ap.add_argument("--round2", action="store_true", help="only the probes of tests/probe_round2.py (issue 25)")
    ap.add_argument("--round3", action="store_true", help="only issue 35's classes (pytest: ROUND3_FILES)")
    ap.add_argument("--round4", action="store_true", help="only the probes of tests/probe_round4.py (issue 47)")
    ap.add_argument("--no-load", action="store_true", help="without the second probe process running meanwhile")
    ap.add_argument("--as-load", action="store_true", help=argparse.SUPPRESS)   # the second process itself
    a = ap.parse_args()
    if a.as_load:
        return _load_forever()
    if a.round3:
        lines, broken3 = _round3()
        out3 = a.out if a.out != ap.get_default("out") else str(ROOT / "benchmarks" / "results" / "probes-round3.md")
        pathlib.Path(out3).write_text("\n".join(lines) + "\n")
        print(f"wrote {out3}")
        return 1 if broken3 else 0
    probes = [p for p in pc.PROBES if a.k is None or a.k.lower() in p.id.lower()]
    if a.round2:
        import probe_round2

        probes = [p for p in probes if p in probe_round2.ROUND2]
    if a.round4:
        import probe_round4

        probes = [p for p in probes if p in probe_round4.ROUND4]
    # the load the flaky test met: a second probe process runs the whole time (issue 25)
    load = None if a.no_load else subprocess.Popen([sys.executable, __file__, "--as-load"], stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.DEVNULL, start_new_session=True)
    rows, broken = [], 0
    print(f"{'probe':<52} {'exit':>9} {'tb':>3} {'left':>5} {'s':>6}  message / problems", flush=True)
    for p in probes:
        with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as scratch:
            try:
                out = pc.run_in_subprocess(p, tmp, scratch)
            except Exception as e:  # noqa: BLE001 - a probe whose setup fails is broken, the run goes on
                out = pc.Outcome(-1, "", "", False, [], 0.0, [f"could not run: {type(e).__name__}: {e}"[:300]])
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
    load_runs = 0
    if load is not None:
        import os
        import signal

        os.killpg(load.pid, signal.SIGTERM)   # its own session: the load and what it started
        load.wait()
        load_runs = _LOAD_COUNT.read_text().strip() if _LOAD_COUNT.exists() else "?"
    kept = len(rows) - broken
    print(f"\nwith a second probe process running meanwhile: {load is not None} ({load_runs} probe runs of its own)")
    print(f"\n{kept}/{len(rows)} probes kept their promise; tracebacks: {sum(o.traceback for _, o, _, _ in rows)}; "
          f"runs that left files in TMPDIR: {sum(bool(o.leftovers) for _, o, _, _ in rows)}")
    counts = _counts(rows)
    for k, v in counts.items():
        print(f"{k}: {v}")
    if a.k is None and a.round4:
        out4 = a.out if a.out != ap.get_default("out") else str(ROOT / "benchmarks" / "results" / "probes-round4.md")
        pathlib.Path(out4).write_text("\n".join(_round4_lines(rows, load_runs if load is not None else None)) + "\n")
        print(f"wrote {out4}")
    elif a.k is None:
        if a.round2 and a.out == ap.get_default("out"):
            a.out = str(ROOT / "benchmarks" / "results" / "probes-round2.md")
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
        lines = [
            "# Hostile-input probes (answers that cannot be forged or lost)", "",
            f"`python benchmarks/probes.py` on {datetime.date.today()}, commit {rev.strip()}, "
            f"{platform.machine()} with {platform.python_version()}: every probe of `tests/probe_cases.py` "
            "run as `python -m jaxmem.cli ...` in a fresh process with its own TMPDIR"
            + (f", while a second probe process ran the fast probes of `tests/probe_round2.py` over and over "
               f"({load_runs} runs of its own meanwhile: the load the flaky test met)." if load is not None else "."),
            "",
            f"**{kept}/{len(rows)} kept their promise**; tracebacks: "
            f"{sum(o.traceback for _, o, _, _ in rows)}; runs that left files in TMPDIR: "
            f"{sum(bool(o.leftovers) for _, o, _, _ in rows)}.", "",
            "Exit codes: 0 fits, 3 does not fit, 2 user error, 1 jaxmem bug; 128+N a signal "
            "(a signal during C code that holds the GIL: the clean-up helper ends jaxmem with SIGKILL, 137).", "",
            "Classes (tests/probe_trust.py): *tampered cache* -- a shared `JAXMEM_CACHE` whose entries were "
            "swapped, edited (with and without a recomputed SHA-256), damaged, replaced by a FIFO, a directory or a "
            "link, signed by another cache, written concurrently; each checked for its exit code and its whole "
            "`--json` answer against a `--no-cache` run, and for the entry it used being sound afterwards. "
            "*signals* -- SIGTERM/SIGINT/SIGHUP at seeded random points (some repeated), in a garbage-collection "
            "callback, swallowed by a bare `except:`. *killed sweeps* -- `compare` killed (SIGKILL included) with "
            "its workers tracing, in C code, or compiling. *environment* -- bad `XLA_FLAGS`, `JAX_PLATFORMS`, "
            "`JAX_COMPILATION_CACHE_DIR`, memory variables, Ray addresses. *option gate* -- a bad value of a grid axis, a fine-tuning "
            "option, `--changes`, `--margin`, `--from` beside options that would change its rows, an output path "
            "that cannot be written, offload on the CPU backend: exit 2 naming it before any compile (or, for a write "
            "that fails only at the end, after the results are printed). Every run in a fresh process must leave "
            "no process alive 3 s after it ended on an idle machine, times the load per core (waited for by their "
            "exit: tests/probe_cases.py, wait_gone and load_factor).", "",
            "Trust, round two (tests/probe_round2.py, issue 25): *forged cache (second uid)* -- a real second user "
            "(`useradd jaxmemprobe`; its steps run in a process forked with its uid) that can write the shared folder "
            "replaces the key with its own (or a FIFO, a link, nothing) and re-signs an entry to the opposite verdict, "
            "or reads a key left 0644; read-only readers; a gzip bomb; each against a `--no-cache` run. *bounded "
            "inputs* -- FIFOs kept full by a writer that counts what was read, devices, directories, sparse 1 TB files, "
            "files over the cap, 100,000 nested lists, 5000-digit integers, a YAML alias bomb, as `--rules`, "
            "`compare --from` and the calibration file. *safe writes* -- `--out`/`--html`/`--png` and cache files "
            "that are links onto a user's file. *no verdict from nothing* -- plans of no rows or no answers. *exit 2, "
            "not 1* -- 5000-digit numbers, closed stdin/stdout/stderr. *API ^C* -- SIGINT during `jaxmem.analyze` "
            "(in a gc callback, swallowed, at random points). *smaller items* -- the issue's last list.", "",
            "| class | probes | kept |", "|---|---|---|",
            *[f"| {c or 'hostile input'} | {n} | {k} |" for c, (n, k) in _by_class(rows).items()],
            "", *[f"- {k}: **{v}**" for k, v in counts.items()], "",
            "SIGINT before jaxmem's handler is installed (the first ~0.3 s: Python's own imports) is Python's "
            "KeyboardInterrupt, with its traceback; the random SIGINT points start at 15% of the run. A random point at a share of an unsignalled run's time can still fall after the end when the machine's load changes: such a run must then be a normal one (exit 0), as `SIGINT x2 at 93% ... #21` was.", "",
            "| probe | class | exit (must) | traceback | left in TMPDIR | alive after (3 s x load) | s | kept | message |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [_row(p, out, ok, msg) for p, out, ok, msg in rows]
        if not a.round2:   # issue 35's classes, run through pytest
            round3, broken3 = _round3()
            lines += ["", *round3]
            broken += broken3
        pathlib.Path(a.out).write_text("\n".join(lines) + "\n")
        print(f"wrote {a.out}")
    return 1 if broken else 0


def _row(p, out, ok, msg) -> str:
    return (f"| {p.id} | {p.cls or 'input'} | {out.exit} ({p.exit}) | {'yes' if out.traceback else 'no'} | "
            f"{len(out.leftovers)} | {len(out.alive)} | {out.seconds:.1f} | "
            f"{'yes' if ok else 'NO: ' + '; '.join(out.problems).replace('|', '/')} | {msg} |")


def _round4_lines(rows, load_runs) -> list[str]:
    """Issue 47's probes alone (--round4): what its "Numbers it must reach" count, the classes, the rows."""
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    kept = sum(ok for _, _, ok, _ in rows)
    counts = {
        "exit 1 (jaxmem bug) for user or environment input": sum(o.exit == 1 for _, o, _, _ in rows),
        "tracebacks": sum(o.traceback for _, o, _, _ in rows),
        "runs past 30 s that compile nothing": sum(o.seconds > 30 and not p.compiles for p, o, _, _ in rows),
        "runs over 2 GiB of jaxmem's own memory (where measured)": sum(
            o.rss_mib is not None and o.rss_mib >= 2048 for _, o, _, _ in rows),
    }
    return [
        "# Hostile-input probes, trust round four (issue 47)", "",
        f"`python benchmarks/probes.py --round4` on {datetime.date.today()}, commit {rev.strip()}"
        f"{' with uncommitted changes in ' + str(len(dirty.splitlines())) + ' files' if dirty else ''}, "
        f"{platform.machine()} with {platform.python_version()}: every probe of `tests/probe_round4.py` run as "
        "`python -m jaxmem.cli ...` (or a caller's script of the API) in a fresh process with its own TMPDIR"
        + (f", while a second probe process ran the fast probes of round two ({load_runs} runs of its own)."
           if load_runs is not None else "."), "",
        (f"**{kept}/{len(rows)} kept their promise.** Each class is also a test of the module that keeps it "
         "(tests/probe_round4.py's docstring names them)."), "",
        "| class | probes | kept |", "|---|---|---|",
        *[f"| {c} | {n} | {k} |" for c, (n, k) in _by_class(rows).items()],
        "", *[f"- {k}: **{v}**" for k, v in counts.items()], "",
        "| probe | class | exit (must) | traceback | left in TMPDIR | alive after (3 s x load) | s | kept | message |",
        "|---|---|---|---|---|---|---|---|---|",
        *[_row(p, out, ok, msg) for p, out, ok, msg in rows],
    ]


# Issue 35 ("trust, round three"): its classes are pytest tests of these files (those present).
ROUND3_FILES = ("tests/test_hostile.py", "tests/test_precheck.py",
                # only its item-9 tests: the whole file runs every probe above a second time (an hour on 2 cores)
                "tests/test_probes.py::test_a_process_that_really_survives_the_run_is_reported",
                "tests/test_probes.py::test_the_wait_for_a_slow_exit_ends_on_the_exit_not_the_deadline")
# class -> words of the names of the tests that probe it; the first class whose words a test id holds.
ROUND3_CLASSES = (
    ("9. two outputs on one path", ("two_outputs",)),
    ("11. small", ("diffed_with_itself", "empty_output", "character_offload", "clips_long_names",
                   "grid_of_hundreds", "yes_true", "huge_grid")),
    ("1. outputs replace device nodes", ("output_aimed", "special_file", "fifo_that_appeared", "link_to_a_regular")),
    ("2. a wrong verdict", ("advise",)),
    ("3. diff quadratic in modules", ("diff_matches_modules",)),
    ("4. microbatch search walks every integer", ("default_microbatches",)),
    ("10. --remat-at accepted under a hook", ("remat_at",)),
    ("5. pathological regexes", ("pattern", "re2", "catastrophic")),
    ("6. bad grid values become rows", ("grid", "microbatches_are_checked")),
    ("7. diff calls odd reports a bug", ("diff_",)),
    ("8. environment garbage", ("environment_value", "jax_options")),
    ("the first answer in seconds (item 8)", ("typo", "api_answers", "catalogue", "folder_or_json", "suggestion",
                                        "cpu_mesh")),
    ("probes on a loaded machine (item 9)", ("survives", "slow_exit")),
)


def _round3_class(test_id: str) -> str | None:
    return next((c for c, words in ROUND3_CLASSES if any(w in test_id for w in words)), None)


def _round3() -> tuple[list[str], int]:
    """Issue 35's tests through pytest (slow ones included): a markdown section, and how many broke."""
    files = [f for f in ROUND3_FILES if (ROOT / f.split("::")[0]).exists()]
    with tempfile.TemporaryDirectory() as tmp:
        xml = pathlib.Path(tmp, "round3.xml")
        subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-p", "no:randomly", "-q", f"--junitxml={xml}",
                        *files], cwd=ROOT, capture_output=True, text=True)
        cases = ET.parse(xml).getroot().iter("testcase") if xml.exists() else []
        rows = []
        for case in cases:
            test_id = f"{case.get('classname', '').rsplit('.', 1)[-1]}.py::{case.get('name')}"
            cls = _round3_class(case.get("name", ""))
            if cls is None:
                continue
            bad = next((c for c in case if c.tag in ("failure", "error")), None)
            skipped = next((c for c in case if c.tag == "skipped"), None)
            rows.append((cls, test_id, float(case.get("time", 0)), "skipped" if skipped is not None else
                         "yes" if bad is None else "NO: " + (bad.get("message") or "")[:200].replace("|", "/")))
    broken = sum(r[3].startswith("NO") for r in rows)
    classes: dict[str, list[int]] = {}
    for cls, _, _, kept in rows:
        n = classes.setdefault(cls, [0, 0])
        n[0] += 1
        n[1] += kept == "yes"
    lines = ["## Trust, round three (issue 35): its classes, as tests", "",
             (f"`python -m pytest {' '.join(files)}` (every test, slow ones included), each test id one row, its "
              "class from the words of its name (benchmarks/probes.py, ROUND3_CLASSES)."), "",
             f"**{len(rows) - broken}/{len(rows)} kept their promise.**", "",
             "| class | tests | kept |", "|---|---|---|",
             *[f"| {c} | {classes[c][0]} | {classes[c][1]} |" for c, _ in ROUND3_CLASSES if c in classes],
             "", "| test | class | s | kept |", "|---|---|---|---|",
             *[f"| {t} | {c} | {s:.1f} | {k} |" for c, t, s, k in rows]]
    print("\n".join(lines[:8 + len(classes)]))
    return lines, broken


def _by_class(rows) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = {}
    for p, _, ok, _ in rows:
        n = out.setdefault(p.cls, [0, 0])
        n[0] += 1
        n[1] += ok
    return {c: tuple(v) for c, v in out.items()}


def _counts(rows) -> dict[str, int]:
    """What the issue asks to publish."""
    cache = [(p, o) for p, o, _, _ in rows if p.cls == "tampered cache"]
    import probe_round2

    ids = {p.id for p in probe_round2.ROUND2}
    round2 = [(p, o) for p, o, _, _ in rows if p.id in ids]
    return {
        "probes published": len(rows),
        "wrong verdicts from a tampered cache (exit or --json answer not the --no-cache run's)": sum(
            any(("exit " in x and "expected" in x) or "the answer differs" in x for x in o.problems) for _, o in cache),
        "exit 1 (jaxmem bug) for user or environment inputs": sum(o.exit == 1 for _, o, _, _ in rows),
        "exit 0 or 3 (a verdict) after a signal": sum(o.signalled and o.exit in (0, 3) for _, o, _, _ in rows),
        "processes alive 3 s after a killed sweep": sum(len(o.alive) for p, o, _, _ in rows if p.cls == "killed sweeps"),
        "processes alive 3 s after any run": sum(len(o.alive) for _, o, _, _ in rows),
        "round two: wrong verdicts (exit or --json answer)": sum(
            any(("exit " in x and "expected" in x) or "the answer differs" in x or "a verdict" in x for x in o.problems)
            for p, o in round2),
        "round two: exit 1": sum(o.exit == 1 for _, o in round2),
        "round two: runs past 30 s (hangs)": sum(o.seconds > 30 for _, o in round2),
        "round two: bytes read past a cap (read from a FIFO kept full; peak RSS over its bound)": sum(
            any("bytes read from the FIFO" in x or "peak RSS" in x for x in o.problems) for _, o in round2),
        "round two: files written through a link": sum(
            any("written through the link" in x or "target was created" in x for x in o.problems) for _, o in round2),
    }


_LOAD_COUNT = pathlib.Path(tempfile.gettempdir(), "jaxmem-probes-load-count")


def _load_forever() -> int:
    """The second probe process: the fast probes of round two, over and over, until ended."""
    import probe_round2

    fast = [p for p in probe_round2.ROUND2 if not p.compiles and not p.signal and not p.bench_only]
    n = 0
    while True:
        for p in fast:
            with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as scratch:
                pc.run_in_subprocess(p, tmp, scratch)
            n += 1
            _LOAD_COUNT.write_text(str(n))


if __name__ == "__main__":
    sys.exit(main())
