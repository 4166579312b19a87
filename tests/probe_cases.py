"""Hostile and careless inputs to the jaxmem CLI, and how to run one.

Each probe says what a user must get: the exit code, a message on stderr that names the
culprit, no traceback, and nothing left in TMPDIR. `tests/test_probes.py` runs them (in
process through click's CliRunner where a probe allows it; in a fresh process where it
must: exits, signals, segfault-class sizes, stdout on a full device);
`benchmarks/probes.py` runs every one in a fresh process and prints the table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
H = FIX / "hostile"
TINY = str(H / "tiny.py")
from helpers import MLP_SMALL as MLP  # noqa: E402

CPU = ("--gpu", "cpu")
ALIVE_S = 3.0   # every process a run started is gone this long after it ended (idle machine; times load_factor())
LOAD_FACTOR_MAX = 20.0


def load_factor() -> float:
    """How much slower than idle this machine runs now: the 1-minute load average per core, at least 1
    (at most LOAD_FACTOR_MAX). Every deadline of the probes is seconds of an idle machine times this:
    on a loaded 2-core machine, killed compile children took over 3 s to be reaped."""
    try:
        return min(LOAD_FACTOR_MAX, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))
    except (OSError, AttributeError):
        return 1.0


def wait_gone(pids, seconds: float) -> list[int]:
    """Wait, on the processes' own exit (a pidfd each, readable once the process has exited), until
    every one of `pids` is gone or `seconds` have passed; the pids still running then. A process
    that really survives is still running at the deadline, however loaded the machine."""
    import select

    deadline = time.monotonic() + seconds
    fds: dict[int, int] = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except (OSError, AttributeError):   # gone already, or no pidfd (then: polled below)
            if _running(pid):
                fds[-pid] = pid
    try:
        while fds and (left := deadline - time.monotonic()) > 0:
            real = [fd for fd in fds if fd >= 0]
            ready = select.select(real, [], [], min(left, 0.05) if len(real) < len(fds) else left)[0]
            for fd in ready:
                os.close(fd)
                del fds[fd]
            for fd in [fd for fd in fds if fd < 0 and not _running(fds[fd])]:
                del fds[fd]
        return sorted(pid for pid in fds.values() if _running(pid))
    finally:
        for fd in fds:
            if fd >= 0:
                os.close(fd)


def _running(pid: int) -> bool:
    """`pid` exists and has not exited (a zombie, exited but not yet reaped, is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
    except OSError:
        return False
    return st[st.rindex(")") + 2:].split()[0] not in "ZX"


@dataclasses.dataclass(frozen=True)
class Probe:
    id: str
    args: tuple[str, ...]                 # after `jaxmem`; "{tmp}" is the probe's own folder
    exit: int                             # the exit code a user must get
    message: str | None                   # on stderr: names the culprit
    env: tuple[tuple[str, str], ...] = ()
    process: bool = False                 # needs a fresh process (exits, signals, crashes, fds)
    checks: tuple[str, ...] = ()          # json | analysis | file:NAME | no_ellipsis | once:TEXT | stdout:TEXT
    files: tuple[tuple[str, bytes], ...] = ()   # written into {tmp} first
    signal: str | None = None             # sent once the model signals it is blocked (PROBE_MARKER), or at signal_at
    stdout_to: str | None = None          # a path (e.g. /dev/full) or "closed pipe"
    compiles: bool = False                # reaches a compile (slower)
    exits: tuple[int, ...] = ()           # other acceptable exit codes (a signal's two spellings)
    wait_for: str = "marker"              # signal when: "marker" (the model is blocked) | "xla_tempfile" (XLA wrote
                                          # one) | "compile_child" (a compile child process runs) | "compile_dir"
                                          # (the compile's dump folder exists: XLA is compiling)
    bench_only: bool = False              # too slow for the test suite (a real GPU compile)
    # -- "Answers that cannot be forged or lost" (tests/probe_trust.py builds these) --------------
    setup: str | None = None              # a name in SETUPS: prepares {tmp} (a tampered cache, a server ...)
    signal_at: float | None = None        # send the signal this many seconds after the start (a random point)
    signal_fraction: float | None = None  # ... or at this share of an unsignalled run's duration (measured once)
    signals: int = 1                      # how many times (repeated signals), `signal_every` apart
    signal_every: float = 0.2
    parallel: int = 1                     # run the command this many times at once (concurrent writers)
    cls: str = ""                         # the probe's class in the published table
    # -- "Trust, round two" (tests/probe_round2.py) ------------------------------------------------
    close_fds: tuple[int, ...] = ()       # descriptors the run starts without (the shell's `>&-`, `2>&-`, `<&-`)
    argv: tuple[str, ...] = ()            # run `python ARGV...` instead of `python -m jaxmem.cli ARGS`


def _cal(entry: object) -> tuple[tuple[str, bytes], ...]:
    return (("cal.json", json.dumps(entry).encode()),)


_GOOD_ENTRY = {"in_pool_bytes": 0, "out_of_pool_bytes": 0, "source": "probe"}

PROBES: list[Probe] = [
    # ------------------------------------------------------------ a model file's own exits never read as a verdict
    Probe("model sys.exit(0) at import", ("analyze", str(H / "exit0_import.py")), 2, "called sys.exit(0)"),
    Probe("model sys.exit(0) in workload()", ("analyze", str(H / "exit0_workload.py")), 2, "called sys.exit(0)"),
    Probe("model sys.exit(3) in workload()", ("analyze", str(H / "exit3_workload.py")), 2, "called sys.exit(3)"),
    Probe("model sys.exit('msg')", ("analyze", str(H / "exit_msg.py")), 2, "sys.exit('giving up: no data')"),
    Probe("model sys.exit(0) while traced", ("analyze", str(H / "exit_in_loss.py"), *CPU), 2,
          "exit_in_loss.py: the model file called sys.exit(0)"),
    Probe("model os._exit(0) at import", ("analyze", str(H / "os_exit0.py")), 2, "called os._exit(0)", process=True),
    Probe("model os._exit(0) in workload()", ("analyze", str(H / "os_exit0_workload.py")), 2, "called os._exit(0)",
          process=True),
    Probe("model raises KeyboardInterrupt", ("analyze", str(H / "keyboard_interrupt.py")), 2,
          "raised KeyboardInterrupt"),
    Probe("verify: model sys.exit(0)", ("verify", str(H / "exit0_workload.py"), *CPU), 2, "called sys.exit(0)"),
    Probe("compare: model sys.exit(0)", ("compare", str(H / "exit0_workload.py"), "--layouts", "dp,fsdp", *CPU,
                                         "--jobs", "1"), 2, "called sys.exit(0)"),
    # ------------------------------------------------------------ broken model files
    Probe("model raises ValueError", ("analyze", str(H / "raises_value.py")), 2,
          "ValueError: the preset table is empty (raises_value.py, line 5)"),
    Probe("model syntax error: location once", ("analyze", str(H / "syntax_error.py")), 2, "SyntaxError",
          checks=("once:line 1",)),
    Probe("model not UTF-8", ("analyze", str(H / "not_utf8.py")), 2, "not_utf8.py: failed to import"),
    Probe("model imports a missing package", ("analyze", str(H / "import_error.py")), 2, "nonexistent_package_xyz"),
    Probe("workload() returns a dict", ("analyze", str(H / "not_a_workload.py")), 2, "returned dict"),
    Probe("workload() recurses forever", ("analyze", str(H / "recursion.py")), 2, "RecursionError"),
    Probe("model file missing", ("analyze", str(H / "nope.py")), 2, "nope.py"),
    Probe("model file is a directory", ("analyze", str(H)), 2, "is a directory"),
    Probe("model file is /dev/null", ("analyze", "/dev/null"), 2, "/dev/null is not a regular file"),
    Probe("model file is not .py", ("analyze", "{tmp}/model.txt"), 2, "not a Python file",
          files=(("model.txt", b"def workload(): pass\n"),)),
    Probe("model file without workload()", ("analyze", str(FIX / "no_workload.py")), 2, "defines no `workload()`"),
    Probe("loss returns a tuple", ("analyze", str(H / "loss_tuple.py"), *CPU), 2, "loss(model, batch) returned a tuple"),
    Probe("loss returns a vector", ("analyze", str(H / "loss_vector.py"), *CPU), 2, "array of shape (8,)"),
    Probe("custom step returns a scalar", ("analyze", str(H / "custom_step_scalar.py"), *CPU), 2,
          "step(state, batch) returned an array of shape ()"),
    Probe("batch leaf is a string", ("analyze", str(H / "nonarray_batch_leaf.py"), *CPU), 2,
          "batch['name'] is a str"),
    Probe("batch leaf is a scalar (replicated)", ("analyze", str(H / "scalar_batch_leaf.py"), *CPU, "--mesh", "data=2",
                                                  "--no-explain"), 0, None, compiles=True),
    # ------------------------------------------------------------ the model's stdout never reaches jaxmem's
    Probe("model prints: analyze --json stays JSON", ("analyze", str(H / "prints.py"), *CPU, "--json", "--no-explain"),
          0, None, checks=("json",), compiles=True),
    Probe("model prints, fd 1: analyze --json", ("analyze", str(H / "prints.py"), *CPU, "--json", "--no-explain"), 0,
          None, checks=("json",), process=True, compiles=True),
    Probe("model prints: verify --json stays JSON", ("verify", str(H / "prints.py"), *CPU, "--json"), 0, None,
          checks=("json",), process=True, compiles=True),
    # ------------------------------------------------------------ options: refused up front, named
    Probe("--batch 0", ("analyze", TINY, "--batch", "0"), 2, "'--batch': 0 is not allowed"),
    Probe("--batch -8", ("analyze", TINY, "--batch", "-8"), 2, "'--batch': -8 is not allowed"),
    Probe("--batch 1e20", ("analyze", TINY, "--batch", "1e20"), 2, "'--batch': '1e20' is not a whole number"),
    Probe("--batch 8.5", ("analyze", TINY, "--batch", "8.5"), 2, "'--batch': '8.5' is not a whole number"),
    Probe("--batch 2^70", ("analyze", TINY, "--batch", str(2**70)), 2, "beyond a 64-bit integer"),
    Probe("--batch 1e12 (segfault before)", ("analyze", TINY, "--batch", "1000000000000"), 2,
          "batch:x float32[1000000000000, 16] has a dimension of 1,000,000,000,000, beyond int32", process=True),
    Probe("--batch 5e11 (RET_CHECK before)", ("analyze", TINY, "--batch", "500000000000"), 2, "beyond int32"),
    Probe("--batch 2^31", ("analyze", TINY, "--batch", str(2**31)), 2, "beyond int32"),
    Probe("--batch 2^62 (bytes beyond int64)", ("analyze", TINY, "--batch", str(2**62)), 2,
          "beyond what XLA's 64-bit byte counts can express"),
    Probe("--arg hidden=3e9 (params beyond int32)", ("analyze", TINY, "--arg", "hidden=3000000000"), 2,
          "has a dimension of 3,000,000,000, beyond int32"),
    Probe("--hosts 0", ("analyze", TINY, "--hosts", "0"), 2, "'--hosts': 0 is not in the range x>=1"),
    Probe("--hosts -2", ("analyze", TINY, "--hosts", "-2"), 2, "'--hosts'"),
    Probe("--hosts 3 on 8 devices", ("analyze", TINY, "--mesh", "data=8", "--hosts", "3"), 2, "--hosts 3 does not divide"),
    Probe("--top -1", ("analyze", TINY, "--top", "-1"), 2, "'--top': -1 is not in the range x>=0"),
    Probe("--depth -1", ("analyze", TINY, "--depth", "-1"), 2, "'--depth'"),
    Probe("--depth 0", ("analyze", TINY, "--depth", "0"), 2, "'--depth': 0 is not in the range x>=1"),
    Probe("--accum 0", ("analyze", TINY, "--accum", "0"), 2, "'--accum'"),
    Probe("--mem-fraction 0", ("analyze", TINY, "--mem-fraction", "0"), 2, "'--mem-fraction': 0 is not in (0, 1]"),
    Probe("--mem-fraction 1.5", ("analyze", TINY, "--mem-fraction", "1.5"), 2, "'--mem-fraction'"),
    Probe("--mem-fraction -1", ("analyze", TINY, "--mem-fraction", "-1"), 2, "'--mem-fraction'"),
    Probe("--mem-fraction nan", ("analyze", TINY, "--mem-fraction", "nan"), 2, "'--mem-fraction': nan"),
    Probe("--mem-fraction abc", ("analyze", TINY, "--mem-fraction", "abc"), 2, "'--mem-fraction': 'abc' is not a number"),
    Probe("--mem-fraction on --gpu cpu", ("analyze", TINY, "--mem-fraction", "0.5", *CPU), 2,
          "--gpu cpu has no fixed device memory"),
    Probe("--mesh data=10000 (divisibility before devices)", ("analyze", TINY, "--mesh", "data=10000"), 2,
          "global batch 8 is not divisible by the 10000 devices", checks=("fast:30",)),
    Probe("--mesh data=1000000 (crashed XLA before)", ("analyze", TINY, "--mesh", "data=1000000", "--batch", "1000000"),
          2, "--mesh has 1,000,000 devices: jaxmem builds deviceless meshes of at most 131,072"),
    Probe("--mesh data=10000 on --gpu cpu", ("analyze", TINY, *CPU, "--mesh", "data=10000", "--batch", "10000"), 2,
          "--gpu cpu starts each as a host device of this one process, at most 8,192"),
    Probe("--mesh data=0", ("analyze", TINY, "--mesh", "data=0"), 2, "axis data must have at least 1 device"),
    Probe("--mesh data=abc", ("analyze", TINY, "--mesh", "data=abc"), 2, "--mesh 'data=abc'"),
    Probe("--mesh ''", ("analyze", TINY, "--mesh", ""), 2, "--mesh is empty"),
    Probe("--mesh data=2,data=2", ("analyze", TINY, "--mesh", "data=2,data=2"), 2, "axis data given twice"),
    Probe("--gpu v100", ("analyze", TINY, "--gpu", "v100"), 2, "unknown GPU 'v100'"),
    Probe("--layout tp without a model axis", ("analyze", TINY, "--mesh", "data=2", "--layout", "tp"), 2,
          "needs a model axis"),
    Probe("--layout tp on an axis named tp", ("analyze", TINY, "--mesh", "tp=2", "--layout", "tp", *CPU, "--no-explain"),
          0, None, compiles=True),
    Probe("--arg hidden=abc (an int)", ("analyze", TINY, "--arg", "hidden=abc"), 2,
          "--arg hidden=abc: workload() expects hidden to be int (default 32)"),
    Probe("--arg without =", ("analyze", TINY, "--arg", "nokey"), 2, "'nokey': expected KEY=VALUE"),
    Probe("--arg unknown name", ("analyze", TINY, "--arg", "depth=3"), 2, "workload() has no argument 'depth'"),
    Probe("--optimizer adamax", ("analyze", TINY, "--optimizer", "adamax"), 2, "unknown optimizer 'adamax'"),
    Probe("--remat full, workload() takes no remat", ("analyze", TINY, "--remat", "full"), 2,
          "takes no `remat` argument"),
    # ------------------------------------------------------------ memory settings in the environment
    Probe("XLA_PYTHON_CLIENT_MEM_FRACTION=abc", ("analyze", TINY), 2, "XLA_PYTHON_CLIENT_MEM_FRACTION='abc' is not a number",
          env=(("XLA_PYTHON_CLIENT_MEM_FRACTION", "abc"),)),
    Probe("XLA_CLIENT_MEM_FRACTION=5", ("analyze", TINY), 2, "XLA_CLIENT_MEM_FRACTION=5: the share",
          env=(("XLA_CLIENT_MEM_FRACTION", "5"),)),
    Probe("XLA_CLIENT_MEM_FRACTION=-1", ("analyze", TINY), 2, "XLA_CLIENT_MEM_FRACTION=-1",
          env=(("XLA_CLIENT_MEM_FRACTION", "-1"),)),
    Probe("XLA_CLIENT_MEM_FRACTION=0", ("analyze", TINY), 2, "XLA_CLIENT_MEM_FRACTION=0",
          env=(("XLA_CLIENT_MEM_FRACTION", "0"),)),
    Probe("both MEM_FRACTION variables", ("analyze", TINY), 2, "unset XLA_PYTHON_CLIENT_MEM_FRACTION",
          env=(("XLA_CLIENT_MEM_FRACTION", "0.9"), ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.8"))),
    Probe("XLA_PYTHON_CLIENT_ALLOCATOR=bogus", ("analyze", TINY), 2, "XLA_PYTHON_CLIENT_ALLOCATOR='bogus'",
          env=(("XLA_PYTHON_CLIENT_ALLOCATOR", "bogus"),)),
    Probe("XLA_CLIENT_MEM_FRACTION=abc on verify", ("verify", TINY), 2, "XLA_CLIENT_MEM_FRACTION='abc'",
          env=(("XLA_CLIENT_MEM_FRACTION", "abc"),)),
    # ------------------------------------------------------------ side outputs: the analysis is never lost
    Probe("--html under a file (before the compile)", ("analyze", TINY, "--html", "{tmp}/afile/r.html"), 2,
          "is a file, not a directory", files=(("afile", b"x"),)),
    Probe("--html unwritable: analysis printed, then exit 2", ("analyze", TINY, *CPU, "--html", "/proc/nope/r.html"), 2,
          "--html /proc/nope/r.html: not written", checks=("analysis",), compiles=True),
    Probe("--png unwritable: analysis printed, then exit 2", ("analyze", TINY, *CPU, "--png", "/proc/nope/r.png"), 2,
          "--png /proc/nope/r.png: not written", checks=("analysis",), compiles=True),
    Probe("--png with $...$ in the model name", ("analyze", str(H / "dollar_name.py"), *CPU, "--png", "{tmp}/d.png"), 0,
          None, checks=("file:d.png",), compiles=True),
    Probe("--json to a full device", ("analyze", TINY, *CPU, "--json", "--no-explain"), 2,
          "cannot write the output (stdout): No space left on device", process=True, stdout_to="/dev/full",
          compiles=True),
    Probe("stdout's reader gone (a closed pipe)", ("analyze", TINY, *CPU, "--no-explain"), 2,
          "cannot write the output (stdout): Broken pipe", process=True, stdout_to="closed pipe", compiles=True),
    # ------------------------------------------------------------ verify and compare options
    Probe("verify --timeout 0", ("verify", TINY, "--timeout", "0"), 2, "'--timeout': 0"),
    Probe("verify --timeout -1", ("verify", TINY, "--timeout", "-1"), 2, "'--timeout'"),
    Probe("verify --timeout nan", ("verify", TINY, "--timeout", "nan"), 2, "'--timeout'"),
    Probe("verify --timeout 0.01: says 0.01 s", ("verify", TINY, *CPU, "--timeout", "0.01"), 2,
          "ran past --timeout 0.01 s", compiles=True),
    Probe("verify --html under a file (before measuring)", ("verify", TINY, *CPU, "--html", "{tmp}/afile/v.html"), 2,
          "is a file, not a directory", files=(("afile", b"x"),)),
    Probe("verify --help: default is the CPU", ("verify", "--help"), 0, None, checks=("stdout:else the CPU",)),
    Probe("compare --batches 0,8", ("compare", TINY, "--batches", "0,8"), 2, "'--batches': '0' in '0,8'"),
    Probe("compare --batches abc", ("compare", TINY, "--batches", "abc"), 2, "'--batches': 'abc'"),
    Probe("compare --batches 8,,16", ("compare", TINY, "--batches", "8,,16"), 2, "'--batches'"),
    Probe("compare --layouts dp,bogus", ("compare", TINY, "--layouts", "dp,bogus"), 2,
          "'--layouts': 'bogus' in 'dp,bogus': unknown layout"),
    Probe("compare --remats none,fast", ("compare", TINY, "--remats", "none,fast"), 2, "'--remats': 'fast'"),
    Probe("compare --precisions fp16", ("compare", TINY, "--precisions", "fp16"), 2, "'--precisions': 'fp16'"),
    Probe("compare --optimizers adamax", ("compare", TINY, "--optimizers", "adamax"), 2, "'--optimizers': 'adamax'"),
    Probe("compare --meshes 'data=8;data=x'", ("compare", TINY, "--meshes", "data=8;data=x"), 2, "'--meshes': 'data=x'"),
    Probe("compare --gpus h100,v100", ("compare", TINY, "--gpus", "h100,v100"), 2, "'--gpus': 'v100'"),
    Probe("compare: a 1e12 row is an error row", ("compare", TINY, "--batches", "8,1000000000000", "--gpu", "h100",
                                                  "--jobs", "1"), 0, None, checks=("stdout:beyond int32",),
          compiles=True, process=True),
    # ------------------------------------------------------------ the gate: every option checked before a compile
    Probe("--lora-alpha nan", ("analyze", TINY, "--lora", "4", "--lora-alpha", "nan"), 2,
          "'--lora-alpha': nan is not allowed", cls="option gate"),
    Probe("--lora-alpha inf", ("analyze", TINY, "--lora", "4", "--lora-alpha", "inf"), 2,
          "'--lora-alpha': inf is not allowed", cls="option gate"),
    Probe("--lora-alpha -8", ("analyze", TINY, "--lora", "4", "--lora-alpha", "-8"), 2, "'--lora-alpha': -8",
          cls="option gate"),
    Probe("--lora-alpha without --lora", ("analyze", TINY, "--lora-alpha", "8"), 2, "need --lora RANK",
          cls="option gate"),
    Probe("compare --loras 0,-4", ("compare", TINY, "--loras", "0,-4"), 2, "'--loras': '-4' in '0,-4'",
          cls="option gate"),
    Probe("compare --loras 8,x", ("compare", TINY, "--loras", "8,x"), 2, "'--loras': 'x' in '8,x'", cls="option gate"),
    Probe("compare --base-dtypes fp8", ("compare", TINY, "--loras", "8", "--base-dtypes", "fp8"), 2,
          "'--base-dtypes': 'fp8' in 'fp8': unknown base dtype", cls="option gate"),
    Probe("advise --changes bogus", ("advise", TINY, "--changes", "layout,bogus"), 2, "--changes bogus: unknown",
          cls="option gate"),
    Probe("compare --margin without a search", ("compare", TINY, "--margin", "0.1"), 2,
          "--margin applies to a fit search", cls="option gate"),
    Probe("compare --margin nan", ("compare", TINY, "--find-batch", "--margin", "nan"), 2,
          "'--margin': nan is not in [0, 1)", cls="option gate"),
    Probe("compare --margin 1", ("compare", TINY, "--find-batch", "--margin", "1"), 2, "'--margin': 1 is not in [0, 1)",
          cls="option gate"),
    Probe("compare --granule without a search", ("compare", TINY, "--granule", "128"), 2,
          "--granule applies to a fit search", cls="option gate"),
    Probe("compare --from with --layouts", ("compare", "--from", "{tmp}/rows.json", "--layouts", "dp,fsdp"), 2,
          "--layouts would change them", files=(("rows.json", b"[]"),), cls="option gate"),
    Probe("compare --from with MODEL_FILE and --mesh", ("compare", TINY, "--from", "{tmp}/rows.json", "--mesh",
                                                         "data=2"), 2, "MODEL_FILE, --mesh would change them",
          files=(("rows.json", b"[]"),), cls="option gate"),
    Probe("compare --from with --find-batch", ("compare", "--from", "{tmp}/rows.json", "--find-batch"), 2,
          "--find-batch would change them", files=(("rows.json", b"[]"),), cls="option gate"),
    Probe("compare --out under a file (before the compile)", ("compare", TINY, "--out", "{tmp}/afile/rows.json"), 2,
          "is a file, not a directory", files=(("afile", b"x"),), cls="option gate"),
    Probe("analyze --html to a directory (before the compile)", ("analyze", TINY, "--html", "{tmp}"), 2,
          "is a directory", cls="option gate"),
    Probe("compare --out unwritable: rows printed, then exit 2", ("compare", TINY, *CPU, "--jobs", "1", "--out",
                                                                  "/proc/nope/rows.json"), 2,
          "--out /proc/nope/rows.json: not written", checks=("stdout:per-device peak and throughput by choice",),
          compiles=True, cls="option gate"),
    Probe("--offload optimizer --gpu cpu", ("analyze", TINY, *CPU, "--offload", "optimizer"), 2,
          "--offload optimizer needs a GPU target", cls="option gate"),
    Probe("compare --offload optimizer --gpu cpu", ("compare", TINY, *CPU, "--offload", "optimizer"), 2,
          "--offload optimizer needs a GPU target", cls="option gate"),
    # ------------------------------------------------------------ calibration files (validated on read)
    Probe("calibration: negative in_pool_bytes", ("analyze", TINY, *CPU), 2, "in_pool_bytes = -1",
          env=(("JAXMEM_CALIBRATION", "{tmp}/cal.json"),),
          files=_cal({"cpu": {**_GOOD_ENTRY, "in_pool_bytes": -1}})),
    Probe("calibration: a string for bytes", ("analyze", TINY, *CPU), 2, "in_pool_bytes must be an integer",
          env=(("JAXMEM_CALIBRATION", "{tmp}/cal.json"),),
          files=_cal({"cpu": {**_GOOD_ENTRY, "in_pool_bytes": "lots"}})),
    Probe("calibration: a JSON list", ("analyze", TINY, *CPU), 2, "cal.json: must be a JSON object",
          env=(("JAXMEM_CALIBRATION", "{tmp}/cal.json"),), files=_cal([1, 2])),
    Probe("calibration: a missing key", ("analyze", TINY, *CPU), 2, "has no 'in_pool_bytes'",
          env=(("JAXMEM_CALIBRATION", "{tmp}/cal.json"),), files=_cal({"cpu": {"source": "x"}})),
    Probe("calibration: not UTF-8", ("analyze", TINY, *CPU), 2, "is not UTF-8",
          env=(("JAXMEM_CALIBRATION", "{tmp}/cal.json"),), files=(("cal.json", b"\xff\xfe{}"),)),
    Probe("calibration: not JSON", ("analyze", TINY, *CPU), 2, "not valid JSON",
          env=(("JAXMEM_CALIBRATION", "{tmp}/cal.json"),), files=(("cal.json", b"{oops"),)),
    Probe("calibration: a directory", ("analyze", TINY, *CPU), 2, "is a directory",
          env=(("JAXMEM_CALIBRATION", "{tmp}"),)),
    Probe("calibrate over a corrupt file: kept", ("calibrate", *CPU), 2, "not valid JSON",
          env=(("JAXMEM_CALIBRATION", "{tmp}/cal.json"),), files=(("cal.json", b"{oops"),),
          checks=("unchanged:cal.json",)),
    Probe("calibrate to a directory", ("calibrate", *CPU), 2, "is a directory",
          env=(("JAXMEM_CALIBRATION", "{tmp}"),)),
    # ------------------------------------------------------------ signals: nothing left in TMPDIR
    Probe("SIGTERM while tracing", ("analyze", str(H / "blocks.py"), *CPU), 143, "stopped by SIGTERM",
          process=True, signal="SIGTERM", exits=(-15,)),
    Probe("SIGINT while tracing", ("analyze", str(H / "blocks.py"), *CPU), 130, "stopped by SIGINT",
          process=True, signal="SIGINT", exits=(-2,)),
    Probe("SIGHUP while tracing", ("analyze", str(H / "blocks.py"), *CPU), 129, "stopped by SIGHUP",
          process=True, signal="SIGHUP", exits=(-1,)),
    Probe("SIGTERM in C code holding the GIL", ("analyze", str(H / "blocks.py"), *CPU), 137,
          "stopped by SIGTERM while building and tracing the step; jaxmem had not stopped", process=True,
          signal="SIGTERM", exits=(-9,), env=(("PROBE_BLOCK", "c"),),
          checks=("once:s later (it did not return to Python",)),
    # the compile runs in a child stopped after buffer assignment (jaxmem.compiler.early_stop): jaxmem
    # itself waits in Python, so it stops at once, and the child dies with it
    Probe("SIGTERM during a real compile (gpt2, h100)", ("analyze", str(ROOT / "models" / "gpt2.py"), "--arg",
                                                        "preset=gpt2", "--gpu", "h100", "--no-cache"), 143,
          "stopped by SIGTERM while compiling the step (XLA, in a child process)", process=True, signal="SIGTERM",
          wait_for="compile_dir", bench_only=True, compiles=True),
    # ------------------------------------------------------------ output off a terminal is not cut
    Probe("piped tables are not cut at 80 columns", ("analyze", MLP, "--gpu", "h100", "--top", "3"), 0, None,
          checks=("no_ellipsis",), compiles=True),
]


@dataclasses.dataclass
class Outcome:
    exit: int
    stdout: str
    stderr: str
    traceback: bool
    leftovers: list[str]
    seconds: float
    problems: list[str]          # what the probe's promise found wrong (empty: kept)
    after_signal: float | None = None   # seconds from the signal to the exit
    alive: list[str] = dataclasses.field(default_factory=list)   # processes of the run alive alive_s after it ended
    signalled: bool = False      # a signal reached the run while it was running
    rss_mib: int | None = None   # the run's peak RSS (VmHWM, polled while it ran)
    alive_s: float = ALIVE_S     # how long its processes were waited for: ALIVE_S times the load factor


def _fill(text: str, tmp: str) -> str:
    return text.replace("{tmp}", tmp)


def _prepare(p: Probe, tmp: str) -> tuple[list[str], dict[str, str]]:
    for name, data in p.files:
        pathlib.Path(tmp, name).write_bytes(data)
    return [_fill(a, tmp) for a in p.args], {k: _fill(v, tmp) for k, v in p.env}


def judge(p: Probe, out: Outcome, tmp: str) -> list[str]:
    """Everything the probe's promise finds wrong with an outcome."""
    bad = []
    if p.signal and (p.signal_at is not None or p.signal_fraction is not None):
        bad += _judge_random_signal(p, out)
    elif out.exit != p.exit and out.exit not in p.exits:
        bad.append(f"exit {out.exit}, expected {p.exit}")
    if out.alive:
        bad.append(f"{len(out.alive)} process(es) alive {out.alive_s:.3g} s after the run (ALIVE_S {ALIVE_S:g} s x "
                   f"the load per core): {out.alive}")
    if out.traceback:
        bad.append("traceback")
    if p.message and p.message not in out.stderr:
        bad.append(f"stderr lacks {p.message!r}")
    if out.leftovers:
        bad.append(f"left in TMPDIR: {out.leftovers}")
    for c in p.checks:
        kind, _, arg = c.partition(":")
        if kind == "json":
            try:
                json.loads(out.stdout)
            except ValueError:
                bad.append("stdout is not JSON")
        elif kind == "analysis" and "per-device memory at the peak" not in out.stdout:
            bad.append("the analysis was not printed")
        elif kind == "file" and not pathlib.Path(tmp, arg).is_file():
            bad.append(f"{arg} not written")
        elif kind == "no_ellipsis" and "…" in out.stdout:
            bad.append("output cut with …")
        elif kind == "once" and out.stderr.count(arg) != 1:
            bad.append(f"{arg!r} appears {out.stderr.count(arg)} times")
        elif kind == "stdout" and arg not in out.stdout:
            bad.append(f"stdout lacks {arg!r}")
        elif kind == "fast" and out.seconds > float(arg) * load_factor():
            bad.append(f"took {out.seconds:.0f} s (> {arg} s x {load_factor():.2g}, the load per core)")
        elif kind == "unchanged":
            data = dict(p.files)[arg]
            if pathlib.Path(tmp, arg).read_bytes() != data:
                bad.append(f"{arg} was changed")
        elif kind == "no_text" and arg in out.stdout + out.stderr:
            bad.append(f"printed {arg!r}")
        elif kind == "round2":
            import probe_round2

            try:
                bad += probe_round2.check(arg, p, out, tmp)
            except Exception as e:  # noqa: BLE001 - as below
                bad.append(f"round2:{arg} could not be checked: {type(e).__name__}: {e}")
        elif kind in ("same_as", "cache_sound"):
            import probe_trust

            try:
                bad += probe_trust.check(kind, arg, p, out, tmp)
            except Exception as e:  # noqa: BLE001 - a check that cannot run is the probe's failure, not the runner's
                bad.append(f"{kind}:{arg} could not be checked: {type(e).__name__}: {e}")
    return bad


def _judge_random_signal(p: Probe, out: Outcome) -> list[str]:
    """A signal at a random point: the run ends as the signal -- 128 + N (jaxmem's own exit, with
    its message), -N (the signal's default action, before jaxmem's handler or after it), or
    SIGKILL from the clean-up helper when jaxmem was stuck in C (137, saying so) -- never 0 or 3.
    A run that had finished before the signal was sent must simply be a normal one."""
    n = int(getattr(signal, p.signal))
    if not out.signalled:
        return [] if out.exit in (0, 3) else [f"finished before the signal with exit {out.exit}"]
    if out.exit in (0, 3):
        return [f"exit {out.exit} (a verdict) after {p.signal}"]
    if out.exit == 128 + n:
        return [] if f"stopped by {p.signal}" in out.stderr else [f"exit {out.exit} without 'stopped by {p.signal}'"]
    if out.exit == -n:
        return []
    if out.exit in (137, -9):
        return [] if "had not stopped" in out.stderr else ["SIGKILL without the helper's message"]
    return [f"exit {out.exit} after {p.signal} (expected {128 + n})"]


def _exiting(pid: int) -> bool:
    """The process has called exit and the kernel is tearing it down (PF_EXITING): not reaped yet, so
    poll() says it runs, but a signal sent now is dropped and its exit status is already final. (A
    1 GB process with XLA's threads takes tens of ms there: a signal sent then looked lost.)"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False   # not Linux, or already reaped
    return bool(int(stat[stat.rindex(")") + 2:].split()[6]) & 0x4)


def _leftovers(scratch: str) -> list[str]:
    return sorted(os.listdir(scratch)) if os.path.isdir(scratch) else []


def run_in_process(p: Probe, tmp: str, scratch: str) -> Outcome:
    """Through click's CliRunner; TMPDIR is `scratch` for the command (tempfile.tempdir)."""
    from click.testing import CliRunner

    from jaxmem import cli

    args, env = _prepare(p, tmp)
    teardown = _setup(p, tmp, env, args)
    saved = tempfile.tempdir
    tempfile.tempdir = scratch
    t0 = time.perf_counter()
    try:
        r = CliRunner().invoke(cli.main, args, env=env)
    finally:
        tempfile.tempdir = saved
        if teardown is not None:
            teardown()
    seconds = time.perf_counter() - t0
    tb = r.exception is not None and not isinstance(r.exception, SystemExit)
    out = Outcome(r.exit_code, r.stdout, r.stderr, tb or "Traceback (most recent call last)" in r.output,
                  _leftovers(scratch), seconds, [])
    out.problems = judge(p, out, tmp)
    return out


def _setup(p: Probe, tmp: str, env: dict, args: list[str]) -> object:
    """Run the probe's setup (tests/probe_trust.py): it may change `env` (PROBE_PORT fills "{port}"
    in the arguments and the environment); returns a teardown or None."""
    if p.setup is None:
        return None
    import probe_trust

    teardown = probe_trust.SETUPS[p.setup](p, tmp, env)
    port = env.get("PROBE_PORT")
    if port:
        args[:] = [a.replace("{port}", port) for a in args]
        for k, v in list(env.items()):
            if "{port}" in v:
                env[k] = v.replace("{port}", port)
    return teardown


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            rest = st[st.rindex(")") + 2:].split()
            out[int(d)] = (int(rest[1]), rest[0])
    return out


def _descendants(root: int) -> set[int]:
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


class _Watch:
    """Every process the runs start (their descendants, polled), to find the ones alive after."""

    def __init__(self, procs):
        import threading

        self.procs, self.seen, self._stop = procs, {}, threading.Event()
        self.hwm_kib = 0   # the first run's peak RSS
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(0.1)

    def poll(self):
        try:
            with open(f"/proc/{self.procs[0].pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        self.hwm_kib = max(self.hwm_kib, int(line.split()[1]))
        except (OSError, ValueError):
            pass
        for proc in self.procs:
            if proc.poll() is None:
                for d in _descendants(proc.pid):
                    self.seen.setdefault(d, _cmdline(d))

    def stop(self) -> None:
        self._stop.set()
        self._t.join()

    def alive(self) -> list[str]:
        table = _proc_table()
        return [f"{pid} {cmd}" for pid, cmd in self.seen.items() if pid in table and table[pid][1] not in "ZX"]


def run_in_subprocess(p: Probe, tmp: str, scratch: str, timeout: float = 300) -> Outcome:
    """`python -m jaxmem.cli ARGS` with TMPDIR=scratch; a signal probe signals once the model is
    blocked (or at `signal_at`). Every process the run started must be gone ALIVE_S (3 s on an idle machine, times
    load_factor()) after it ended, waited for by their exit (wait_gone)."""
    args, env = _prepare(p, tmp)
    timeout *= load_factor()
    marker = os.path.join(tmp, "blocked")
    env = {**os.environ, **env, "TMPDIR": scratch, "PROBE_MARKER": marker}
    teardown = _setup(p, tmp, env, args)
    if p.stdout_to == "closed pipe":  # its reader already gone, as in `jaxmem ... | head -0`
        read_end, stdout = os.pipe()
        os.close(read_end)
    else:
        stdout = open(p.stdout_to, "wb") if p.stdout_to else subprocess.PIPE
    signal_at = p.signal_at
    if p.signal_fraction is not None:
        import probe_trust

        signal_at = p.signal_fraction * probe_trust.baseline_seconds(tuple(args), env, p.argv)
    t0 = time.perf_counter()
    t_signal, signalled, extra = None, False, []
    try:
        def child_setup():   # in the child, before exec
            # as a terminal's shell starts it, whatever this harness inherited (`nohup python
            # benchmarks/probes.py` ignores SIGHUP, and a child would inherit that: no hang-up probe then)
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(s, signal.SIG_DFL)
            for fd in p.close_fds:   # it starts as after the shell's `N>&-`
                os.close(fd)

        command = [sys.executable, *p.argv] if p.argv else [sys.executable, "-m", "jaxmem.cli", *args]
        procs = [subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE, env=env, cwd=ROOT,
                                  preexec_fn=child_setup) for _ in range(p.parallel)]
        proc = procs[0]
        watch = _Watch(procs)
        if p.signal:
            def ready():
                if signal_at is not None:
                    return time.perf_counter() - t0 >= signal_at
                if p.wait_for == "xla_tempfile":
                    return bool(glob.glob(os.path.join(scratch, "jaxmem-run-*", "tempfile-*")))
                if p.wait_for == "compile_child":   # a worker's XLA compile child is running
                    return any("jaxmem.compiler.early_stop" in _cmdline(d) for d in _descendants(proc.pid))
                if p.wait_for == "compile_dir":     # the compile's dump folder exists: XLA is compiling
                    return bool(glob.glob(os.path.join(scratch, "jaxmem-run-*", "jaxmem-*")))
                return os.path.exists(marker)

            while not ready() and proc.poll() is None and time.perf_counter() - t0 < timeout:
                time.sleep(0.02)
            if signal_at is None:
                time.sleep(0.2)
            for i in range(p.signals):
                watch.poll()
                if proc.poll() is not None or _exiting(proc.pid):
                    break
                proc.send_signal(getattr(signal, p.signal))
                signalled = True
                if t_signal is None:
                    t_signal = time.perf_counter()
                if i + 1 < p.signals:
                    time.sleep(p.signal_every)
        try:
            o, e = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            o, e = proc.communicate()
        for other in procs[1:]:
            try:
                extra.append(other.communicate(timeout=timeout) + (other.returncode,))
            except subprocess.TimeoutExpired:
                other.kill()
                extra.append(other.communicate() + (other.returncode,))
    finally:
        if p.stdout_to == "closed pipe":
            os.close(stdout)
        elif p.stdout_to:
            stdout.close()
    t_end = time.perf_counter()
    seconds = t_end - t0
    after_signal = t_end - t_signal if t_signal is not None else None
    watch.stop()
    # a crash's clean-up is the helper process's, which may finish just after; and everything
    # the run started (workers, compile children) must be gone within ALIVE_S: waited for by their
    # exit, not a fixed second (a loaded machine took longer to reap two killed compile children)
    alive_s = ALIVE_S * load_factor()
    still = set(wait_gone([int(a.split()[0]) for a in watch.alive()], max(0.0, t_end + alive_s - time.perf_counter())))
    alive = [a for a in watch.alive() if int(a.split()[0]) in still]
    for pid in [int(a.split()[0]) for a in alive]:  # leave nothing behind for the next probe
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if teardown is not None:
        teardown()
    o = (o or b"").decode(errors="replace")
    e = e.decode(errors="replace")
    out = Outcome(proc.returncode, o, e, "Traceback (most recent call last)" in o + e, _leftovers(scratch), seconds, [],
                  after_signal, alive, signalled, watch.hwm_kib // 1024 or None, alive_s)
    out.problems = judge(p, out, tmp)
    for i, (o2, e2, code) in enumerate(extra, start=2):   # the concurrent runs keep the same promise
        o2, e2 = (o2 or b"").decode(errors="replace"), e2.decode(errors="replace")
        other = Outcome(code, o2, e2, "Traceback (most recent call last)" in o2 + e2, [], seconds, [])
        out.problems += [f"run {i}: {x}" for x in judge(p, other, tmp)]
    return out


# "Answers that cannot be forged or lost": a tampered shared cache, signals at random points, killed
# sweeps, the environment (tests/probe_trust.py; it imports this module's Probe).
from probe_trust import TRUST_PROBES  # noqa: E402

PROBES += TRUST_PROBES

# "Trust, round two" (issue 25): a second user forging the shared cache, inputs without an end,
# writes through links, plans without rows, exit 1 escapes, ^C in the API (tests/probe_round2.py).
from probe_round2 import ROUND2  # noqa: E402

PROBES += ROUND2

# "Trust, round four" (issue 47): hostile config.json values, another step than asked, cloud hosts, the
# environment and outputs, batches past XLA's shapes, the API's types (tests/probe_round4.py; the benchmark's).
from probe_round4 import ROUND4  # noqa: E402

PROBES += ROUND4
