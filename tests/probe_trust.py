"""Probes of "Answers that cannot be forged or lost": a tampered shared cache, signals at random
points, killed sweeps, and the environment jax and XLA read (tests/probe_cases.py runs them).

Cache probes start from one golden cache per session holding two compiles of the tiny model for
an H100: A fits (exit 0), B (a batch of 2^30) does not (exit 3). Each probe copies it into its own
folder, tampers with it as a hostile colleague sharing the folder would, runs jaxmem, and checks
the verdict and the whole --json answer against a --no-cache run of the same step, and that the
entry it used is sound again afterwards (nothing bad left on disk).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import hmac
import http.server
import json
import os
import pathlib
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

from probe_cases import CPU, H, MLP, ROOT, TINY, Probe

H100 = ("--gpu", "h100")
A = ("analyze", TINY, *H100, "--json")                               # fits
B = ("analyze", TINY, *H100, "--batch", str(2**30), "--json")         # does not fit
A_CPU = ("analyze", TINY, *CPU, "--json")
BLOCKS = str(H / "blocks.py")
REFERENCE_ARGS = {"A": A, "B": B, "A_CPU": A_CPU}

_session: dict = {}


def _session_dir() -> pathlib.Path:
    if "dir" not in _session:
        _session["dir"] = pathlib.Path(tempfile.mkdtemp(prefix="jaxmem-probe-trust-"))
        import atexit

        atexit.register(shutil.rmtree, _session["dir"], ignore_errors=True)
    return _session["dir"]


def _jaxmem(args, cache_dir, extra_env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAXMEM_CACHE": str(cache_dir), **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "jaxmem.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def reference(name: str) -> dict:
    """The --json answer of a --no-cache run of REFERENCE_ARGS[name] (once per session)."""
    if name not in _session:
        r = _jaxmem((*REFERENCE_ARGS[name], "--no-cache"), _session_dir() / f"ref-{name}")
        assert r.returncode in (0, 3), r.stderr[-2000:]
        _session[name] = json.loads(r.stdout)
    return _session[name]


def golden() -> tuple[pathlib.Path, str, str]:
    """(a cache holding A's and B's entries, A's file name, B's file name), built once."""
    if "golden" not in _session:
        g = _session_dir() / "golden"
        names = []
        for args in (A, B):
            before = set(os.listdir(g / "compiles")) if (g / "compiles").exists() else set()
            r = _jaxmem(args, g)
            assert r.returncode in (0, 3), r.stderr[-2000:]
            (new,) = set(os.listdir(g / "compiles")) - before
            names.append(new)
        _session["golden"] = (g, names[0], names[1])
    return _session["golden"]


# -- checks (probe_cases.judge calls these) ---------------------------------------------------------

def check(kind: str, arg: str, p: Probe, out, tmp: str) -> list[str]:
    if kind == "same_as":
        try:
            got = json.loads(out.stdout)
        except ValueError:
            return ["stdout is not JSON"]
        want = reference(arg)
        if got == want:
            return []
        diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        return [f"the answer differs from a --no-cache run in {diff[:6]}: peak {got.get('per_device_peak_bytes')} "
                f"vs {want.get('per_device_peak_bytes')}, fits {got.get('fits')} vs {want.get('fits')}"]
    if kind == "cache_sound":
        return _cache_sound(pathlib.Path(tmp, "cache"), arg)
    raise AssertionError(kind)


def _cache_sound(folder: pathlib.Path, which: str) -> list[str]:
    """No partial write left, and the entry the run used (A's or B's file name) is whole and its own."""
    from jaxmem.compiler import cache
    from jaxmem.compiler.compiled import Artifacts

    bad = [f"partial write left: {n}" for n in os.listdir(folder / "compiles") if n.startswith(".tmp-")]
    _, a, b = golden()
    name = {"A": a, "B": b}[which]
    saved = os.environ.get("JAXMEM_CACHE")
    os.environ["JAXMEM_CACHE"] = str(folder)
    try:
        if cache.load(name[: -len(".json.gz")], parse=Artifacts.from_json) is None:
            bad.append(f"{which}'s entry is not sound after the run")
    finally:
        if saved is None:
            os.environ.pop("JAXMEM_CACHE", None)
        else:
            os.environ["JAXMEM_CACHE"] = saved
    return bad


# -- tampering (setups) -----------------------------------------------------------------------------

def _split(data: bytes) -> tuple[dict, bytes]:
    raw = gzip.decompress(data)
    head, _, body = raw.partition(b"\n")
    return json.loads(head), body


def _join(header: dict, body: bytes) -> bytes:
    return gzip.compress(json.dumps(header, sort_keys=True).encode() + b"\n" + body)


def _resign(folder: pathlib.Path, header: dict, body: bytes) -> dict:
    """The header with a digest as jaxmem computes it, under this cache's secret (a forger with the secret)."""
    secret = (folder / "secret").read_bytes()
    head = json.dumps({k: v for k, v in header.items() if k != "digest"}, sort_keys=True).encode()
    return {**header, "size": len(body), "digest": hmac.new(secret, head + b"\n" + body, hashlib.sha256).hexdigest()}


def _edit_stats(body: bytes, **values) -> bytes:
    d = json.loads(body)
    d["stats"].update(values)
    return json.dumps(d, separators=(",", ":")).encode()


def _plain_sha(header: dict, body: bytes) -> dict:
    header = {**header, "size": len(body)}
    head = json.dumps({k: v for k, v in header.items() if k != "digest"}, sort_keys=True).encode()
    return {**header, "digest": hashlib.sha256(head + b"\n" + body).hexdigest()}


def _flip(seed: int):
    def f(data: bytes) -> bytes:
        rng = random.Random(seed)
        b = bytearray(data)
        i = rng.randrange(10, len(b))   # past gzip's header (its mtime/OS bytes are not checked by anyone)
        b[i] ^= 1 << rng.randrange(8)
        return bytes(b)
    return f


def _tamper(which: str, how):
    """A setup: copy the golden cache to {tmp}/cache, then how(folder, a_path, b_path)."""
    def setup(p, tmp, env):
        g, a, b = golden()
        folder = pathlib.Path(tmp, "cache")
        shutil.copytree(g, folder, symlinks=True)
        env["JAXMEM_CACHE"] = str(folder)
        how(folder, folder / "compiles" / a, folder / "compiles" / b)
        return None
    return setup


def _rewrite(fn):
    """Rewrite A's entry: fn(bytes of A, bytes of B) -> new bytes of A."""
    def how(folder, a, b):
        a.write_bytes(fn(a.read_bytes(), b.read_bytes()))
    return how


def _swap(folder, a, b):
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)


def _edited(make_fit: bool, digest):
    """Entry A (fits) edited to peak at a petabyte, or B (does not fit) edited to need nothing."""
    def how(folder, a, b):
        path = b if make_fit else a
        header, body = _split(path.read_bytes())
        body = _edit_stats(body, argument=0, output=0, alias=0, temp=0) if make_fit else _edit_stats(body, temp=10**15)
        header = {"plain": lambda h: h, "sha256": lambda h: _plain_sha(h, body)}[digest](header)
        path.write_bytes(_join(header, body))
    return how


def _other_version(folder, a, b):
    header, body = _split(a.read_bytes())
    header["versions"] = {**header["versions"], "jax": "0.0.1"}
    a.write_bytes(_join(_resign(folder, header, body), body))


def _wrong_shape(edit):
    def how(folder, a, b):
        header, body = _split(a.read_bytes())
        d = json.loads(body)
        edit(d)
        body = json.dumps(d, separators=(",", ":")).encode()
        a.write_bytes(_join(_resign(folder, header, body), body))
    return how


def _fifo(folder, a, b):
    a.unlink()
    os.mkfifo(a)


def _directory(folder, a, b):
    a.unlink()
    a.mkdir()


def _symlink(folder, a, b):
    a.unlink()
    a.symlink_to(b)


def _secret(kind: str):
    def how(folder, a, b):
        s = folder / "secret"
        if kind == "short":
            s.write_bytes(s.read_bytes()[:5])
        elif kind == "other":          # entries copied from another cache
            s.write_bytes(os.urandom(32))
        elif kind == "missing":
            s.unlink()
        elif kind == "fifo":
            s.unlink()
            os.mkfifo(s)
    return how


def _partial_and_fifo(folder, a, b):
    (folder / "compiles" / ".tmp-1-dead").write_bytes(b"half an entry")
    os.mkfifo(folder / "compiles" / ("f" * 64 + ".json.gz"))


def _empty_cache(p, tmp, env):
    env["JAXMEM_CACHE"] = str(pathlib.Path(tmp, "cache"))


def _persistent_cache(p, tmp, env):
    """JAX's persistent cache at {tmp}/jcc, filled by one run first (the second one failed before)."""
    env.update(JAX_COMPILATION_CACHE_DIR=str(pathlib.Path(tmp, "jcc")), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", JAXMEM_CACHE=str(pathlib.Path(tmp, "cache")))
    r = subprocess.run([sys.executable, "-m", "jaxmem.cli", *A_CPU, "--no-cache"], env={**os.environ, **env}, cwd=ROOT,
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    # jaxmem runs nothing concretely (its model init is abstract): an entry of JAX's own fills the cache
    fill = "import jax, jax.numpy as jnp; jax.jit(lambda x: x * 2 + 1)(jnp.ones(3)).block_until_ready()"
    r = subprocess.run([sys.executable, "-c", fill], env={**os.environ, **env, "JAX_PLATFORMS": "cpu"},
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert any(n.startswith("jit_") for n in os.listdir(pathlib.Path(tmp, "jcc")))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _refused_port(p, tmp, env):
    """{port}: a local port nothing listens on."""
    env["PROBE_PORT"] = str(_free_port())


class _QuietHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):   # the probe's output is jaxmem's, not the server's
        pass


def _http_server(p, tmp, env):
    """{port}: a local HTTP server (answers, but not gRPC)."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env["PROBE_PORT"] = str(server.server_port)
    return server.shutdown


SETUPS = {
    "swap": _tamper("AB", _swap),
    "copy B over A": _tamper("A", _rewrite(lambda a, b: b)),
    "edit A, no digest": _tamper("A", _edited(False, "plain")),
    "edit B, no digest": _tamper("B", _edited(True, "plain")),
    "edit A, plain sha256": _tamper("A", _edited(False, "sha256")),
    "edit B, plain sha256": _tamper("B", _edited(True, "sha256")),
    "truncate A": _tamper("A", _rewrite(lambda a, b: a[: len(a) // 2])),
    "empty A": _tamper("A", _rewrite(lambda a, b: b"")),
    "A not gzip": _tamper("A", _rewrite(lambda a, b: b"this is not a cache entry\n")),
    "A old format": _tamper("A", _rewrite(lambda a, b: gzip.compress(_split(a)[1]))),
    "A other version": _tamper("A", _other_version),
    "A stats of the wrong type": _tamper("A", _wrong_shape(lambda d: d["stats"].update(temp="lots"))),
    "A dump not base64": _tamper("A", _wrong_shape(lambda d: d.update(dump="%%%"))),
    "A without hlo_text": _tamper("A", _wrong_shape(lambda d: d.pop("hlo_text"))),
    "A is a FIFO": _tamper("A", _fifo),
    "A is a directory": _tamper("A", _directory),
    "A links to B": _tamper("A", _symlink),
    "secret cut short": _tamper("A", _secret("short")),
    "secret of another cache": _tamper("A", _secret("other")),
    "secret missing": _tamper("A", _secret("missing")),
    "secret is a FIFO": _tamper("A", _secret("fifo")),
    "partial write and a FIFO": _tamper("A", _partial_and_fifo),
    **{f"flip A {i}": _tamper("A", _rewrite(lambda a, b, i=i: _flip(i)(a))) for i in range(6)},
    "empty cache": _empty_cache,
    "persistent cache": _persistent_cache,
    "refused port": _refused_port,
    "http server": _http_server,
}


# -- the probes -------------------------------------------------------------------------------------

def _cache_probe(setup: str, which: str = "A", *, extra=(), bench_only=False, checks=(), **kw) -> Probe:
    args = (*(A if which == "A" else B), *extra)
    return Probe(f"cache: {setup} -> {which} {'fits' if which == 'A' else 'does not fit'}", args,
                 0 if which == "A" else 3, None, process=True, compiles=True, setup=setup, bench_only=bench_only,
                 checks=(f"same_as:{which}", f"cache_sound:{which}", *checks), cls="tampered cache", **kw)


_IN_TESTS = {"swap", "edit A, plain sha256", "edit B, no digest", "flip A 0", "A is a FIFO", "A other version",
             "A stats of the wrong type", "secret of another cache"}

CACHE = [
    _cache_probe("swap", "A"), _cache_probe("swap", "B", bench_only=True),
    _cache_probe("copy B over A", bench_only=True),
    *[_cache_probe(s, "B" if s.startswith("edit B") else "A", bench_only=s not in _IN_TESTS)
      for s in ("edit A, no digest", "edit B, no digest", "edit A, plain sha256", "edit B, plain sha256")],
    *[_cache_probe(s, bench_only=s not in _IN_TESTS, checks=("fast:120",) if "FIFO" in s else ())
      for s in ("truncate A", "empty A", "A not gzip", "A old format", "A other version", "A stats of the wrong type",
                "A dump not base64", "A without hlo_text", "A is a FIFO", "A is a directory", "A links to B",
                "secret cut short", "secret of another cache", "secret missing", "secret is a FIFO",
                *[f"flip A {i}" for i in range(6)])],
    # --no-cache repairs a damaged entry (it stores the fresh answer)
    Probe("cache: a flipped byte, then --no-cache -> A repaired", (*A, "--no-cache"), 0, None, process=True,
          compiles=True, setup="flip A 1", checks=("same_as:A", "cache_sound:A"), cls="tampered cache"),
    # concurrent writers on one folder: every run answers, nothing partial is left
    Probe("cache: 3 concurrent writers of A", A, 0, None, process=True, compiles=True, setup="empty cache", parallel=3,
          checks=("same_as:A", "cache_sound:A"), cls="tampered cache"),
    Probe("cache: 2 concurrent writers of B", B, 3, None, process=True, compiles=True, setup="empty cache", parallel=2,
          checks=("same_as:B", "cache_sound:B"), cls="tampered cache", bench_only=True),
    Probe("jaxmem cache: a FIFO and a partial write are counted, not read", ("cache",), 0, None,
          setup="partial write and a FIFO", checks=("stdout:2 entries", "stdout:1 partial write(s)", "fast:30"),
          cls="tampered cache"),
    Probe("jaxmem cache --clear: entries, partial writes and the FIFO removed", ("cache", "--clear"), 0, None,
          setup="partial write and a FIFO", checks=("stdout:removed 4 file(s)", "stdout: 0 entries"), cls="tampered cache"),
]


def baseline_seconds(args: tuple, env: dict, argv: tuple = ()) -> float:
    """How long an unsignalled run of `args` takes here and now (once per session): random signal
    points are shares of it, so that they land inside the run however loaded the machine is."""
    key = ("baseline", args, argv)
    if key not in _session:
        import time

        t0 = time.perf_counter()
        command = [sys.executable, *argv] if argv else [sys.executable, "-m", "jaxmem.cli", *args]
        r = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, timeout=600)
        assert r.returncode in (0, 3), r.stderr[-2000:]
        _session[key] = time.perf_counter() - t0
    return _session[key]


def _random_signals() -> list[Probe]:
    """Signals at seeded random points of a deviceless H100 analysis (start-up, loading, tracing,
    lowering, the compile child, the explanation) and of a CPU compile (XLA:CPU, which checks for
    signals while its threads run), some repeated: each at a share of an unsignalled run's time."""
    rng = random.Random(20261130)
    out = []
    plans = ([("SIGTERM", 1)] * 8 + [("SIGTERM", 3)] * 4 + [("SIGHUP", 1)] * 4 + [("SIGINT", 1)] * 4
             + [("SIGINT", 2)] * 2)
    for i, (sig, times) in enumerate(plans):
        cpu = i % 3 == 2
        # SIGINT from 15%: before jaxmem's handler is installed (Python's own imports, ~0.3 s) it is
        # Python's KeyboardInterrupt, with its traceback (see benchmarks/results/probes.md)
        frac = round(rng.uniform(0.15 if sig == "SIGINT" else 0.02, 0.95), 2)
        args = ("analyze", TINY, *(CPU if cpu else H100), "--no-cache")
        name = f"{sig} x{times} at {frac:.0%} of the run ({'cpu compile' if cpu else 'h100'}) #{i + 1}"
        out.append(Probe(name, args,
                         128 + int(getattr(__import__('signal'), sig)), None, process=True, signal=sig,
                         signal_fraction=frac, signals=times, signal_every=round(rng.uniform(0.05, 0.4), 2),
                         compiles=True, cls="signals", bench_only=i % 4 != 0))
    return out


SIGNALS = [
    Probe("SIGTERM in a gc callback (jax's _xla_gc_callback)", ("analyze", BLOCKS, *CPU), 143,
          "stopped by SIGTERM while building and tracing the step (it landed in _xla_gc_callback()", process=True,
          signal="SIGTERM", env=(("PROBE_BLOCK", "gc"),), checks=("no_text:Exception ignored", "fast:60"),
          cls="signals"),
    Probe("SIGINT in a gc callback", ("analyze", BLOCKS, *CPU), 130, "stopped by SIGINT", process=True, signal="SIGINT",
          env=(("PROBE_BLOCK", "gc"),), checks=("no_text:Exception ignored",), cls="signals"),
    Probe("SIGTERM swallowed by a bare except: raised again", ("analyze", BLOCKS, *CPU), 143, "stopped by SIGTERM",
          process=True, signal="SIGTERM", env=(("PROBE_BLOCK", "swallow"),), cls="signals"),
    # the re-raise must be a real signal: jax swallowed an interrupt and the model's second call then
    # blocked in a gc callback's sleep, which a flag for the next bytecode never ended (CI: SIGKILL, -9)
    Probe("SIGINT swallowed, then a blocking call: raised again as a signal", ("analyze", BLOCKS, *CPU), 130,
          "stopped by SIGINT", process=True, signal="SIGINT", env=(("PROBE_BLOCK", "swallow_then_block"),),
          cls="signals"),
    # jaxlib checks for signals during an XLA:CPU compile and raises while XLA's threads still run:
    # the interpreter's shutdown then segfaulted (-11) and the compile's dump outlived the clean-up
    *[Probe(f"{sig} during an XLA:CPU compile", ("analyze", TINY, *CPU, "--no-cache"), 128 + n,
            f"stopped by {sig} while compiling the step (XLA)", process=True, signal=sig, wait_for="compile_dir",
            compiles=True, cls="signals", bench_only=sig != "SIGINT")
      for sig, n in (("SIGINT", 2), ("SIGTERM", 15), ("SIGHUP", 1))],
    Probe("SIGTERM x3 while tracing", ("analyze", BLOCKS, *CPU), 143, "stopped by SIGTERM", process=True,
          signal="SIGTERM", signals=3, signal_every=0.1, cls="signals"),
    Probe("SIGTERM then SIGINT while tracing: the first one counts", ("analyze", BLOCKS, *CPU), 143,
          "stopped by SIGTERM", process=True, signal="SIGTERM", signals=2, signal_every=0.05, cls="signals"),
    *_random_signals(),
    # early points: jax's own import, where an interrupt inside an extension module's initialization
    # (numpy's) was caught and turned ImportError, and a later import segfaulted (-11)
    *[Probe(f"{sig} at {at} s (jax's import)", ("analyze", TINY, *H100, "--no-cache"), 128 + n, None, process=True,
            signal=sig, signal_at=at, compiles=True, cls="signals", bench_only=at != 0.8)
      for sig, n in (("SIGHUP", 1), ("SIGTERM", 15)) for at in (0.6, 0.7, 0.8, 0.9, 1.0, 1.2)],
]

_SWEEP = ("compare", BLOCKS, *CPU, "--layouts", "dp,fsdp", "--jobs", "2")
_SWEEP_H100 = ("compare", TINY, *H100, "--batches", "8,16,24,32", "--jobs", "2", "--no-cache")

SWEEPS = [
    *[Probe(f"sweep killed by {sig} while its workers trace", _SWEEP, {"SIGKILL": 137}.get(sig, 128 + n),
            None if sig == "SIGKILL" else f"stopped by {sig}", process=True, signal=sig, exits=(-n,),
            env=(("PROBE_BLOCK", "sleep"),), cls="killed sweeps")
      for sig, n in (("SIGKILL", 9), ("SIGTERM", 15), ("SIGINT", 2), ("SIGHUP", 1))],
    *[Probe(f"sweep killed by {sig} while its workers are in C code", _SWEEP, {"SIGKILL": 137}.get(sig, 128 + n),
            None, process=True, signal=sig, exits=(-n,), env=(("PROBE_BLOCK", "c"),), cls="killed sweeps",
            bench_only=sig != "SIGKILL")
      for sig, n in (("SIGKILL", 9), ("SIGTERM", 15))],
    *[Probe(f"h100 sweep killed by SIGKILL at {f:.0%} of the run", _SWEEP_H100, 137, None, process=True,
            signal="SIGKILL", signal_fraction=f, exits=(-9,), compiles=True, cls="killed sweeps", bench_only=True)
      for f in (0.1, 0.3, 0.55, 0.8)],
    *[Probe(f"h100 sweep: {sig} at {f:.0%} of the run", _SWEEP_H100, 128 + n, None, process=True, signal=sig,
            signal_fraction=f, compiles=True, cls="killed sweeps", bench_only=True)
      for sig, n, f in (("SIGTERM", 15, 0.4), ("SIGINT", 2, 0.7))],
    Probe("gpt2 sweep killed by SIGKILL mid-compile", ("compare", str(ROOT / "models" / "gpt2.py"), "--arg",
                                                        "preset=gpt2", *H100, "--batches", "8,16", "--jobs", "2",
                                                        "--no-cache"), 137, None, process=True, signal="SIGKILL",
          exits=(-9,), wait_for="compile_child", compiles=True, cls="killed sweeps", bench_only=True),
]


def _env(name: str, value: str, message: str, args=("analyze", TINY, *H100), code: int = 2, **kw) -> Probe:
    return Probe(f"{name}={value}" + (f" ({args[0]})" if args[0] != "analyze" else ""), args, code, message,
                 env=((name, value),), cls="environment", **kw)


_RAY = ("compare", TINY, *H100, "--batches", "8,16", "--executor", "ray")
_NO_GPU = not any(pathlib.Path("/dev").glob("nvidia[0-9]*"))

ENVIRONMENT = [
    _env("XLA_FLAGS", "--xla_bogus_flag=1", "XLA_FLAGS: XLA knows no flag --xla_bogus_flag=1; fix or remove it"),
    _env("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=false --xla_nope=3", "XLA knows no flag --xla_nope=3"),
    _env("XLA_FLAGS", "-xla_gpu_autotune_level=0", "XLA knows no flag -xla_gpu_autotune_level=0"),
    _env("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=maybe", "--xla_gpu_enable_triton_gemm=maybe: XLA cannot read "
         "the value 'maybe'"),
    _env("XLA_FLAGS", "--xla_force_host_platform_device_count=abc", "XLA cannot read the value 'abc'"),
    _env("XLA_FLAGS", "xla_gpu_enable_triton_gemm=false", "does not start with '--', so XLA takes it for a file"),
    _env("XLA_FLAGS", "--xla_bogus_flag=1", "XLA knows no flag", args=("compare", TINY, *H100, "--batches", "8,16")),
    _env("XLA_FLAGS", "--xla_bogus_flag=1", "XLA knows no flag", args=("verify", TINY, *CPU)),
    _env("XLA_FLAGS", "--xla_bogus_flag=1", "XLA knows no flag", args=("advise", TINY, *H100)),
    Probe("XLA_FLAGS good: analyzed, as without", (*A_CPU,), 0, None, env=(("XLA_FLAGS", "--xla_cpu_enable_fast_math"
                                                                             "=false"),), process=True,
          compiles=True, checks=("json",), cls="environment"),
    _env("JAX_PLATFORMS", "bogus", "JAX_PLATFORMS=bogus: jax knows no platform 'bogus'"),
    _env("JAX_PLATFORMS", "tpu", "JAX_PLATFORMS=tpu: this machine has no TPU runtime"),
    *([_env("JAX_PLATFORMS", "cuda", "JAX_PLATFORMS=cuda: this machine has no NVIDIA GPU (no /dev/nvidia0)"),
       _env("JAX_PLATFORMS", "cuda", "this machine has no NVIDIA GPU", args=("compare", TINY, "--batches", "8,16"))]
      if _NO_GPU else []),
    Probe("JAX_PLATFORMS=cuda,cpu: falls back to the CPU, analyzed", A, 0, None, env=(("JAX_PLATFORMS", "cuda,cpu"),),
          process=True, compiles=True, setup="empty cache", checks=("same_as:A",), cls="environment"),
    Probe("JAX_COMPILATION_CACHE_DIR: a second --gpu cpu run", (*A_CPU, "--no-cache"), 0, None, process=True,
          compiles=True, setup="persistent cache", checks=("same_as:A_CPU",), cls="environment"),
    _env("XLA_PYTHON_CLIENT_PREALLOCATE", "flase", "XLA_PYTHON_CLIENT_PREALLOCATE='flase'"),
    _env("XLA_PYTHON_CLIENT_MEM_FRACTION", "nan", "XLA_PYTHON_CLIENT_MEM_FRACTION=nan: the share"),
    _env("XLA_PYTHON_CLIENT_MEM_FRACTION", "inf", "XLA_PYTHON_CLIENT_MEM_FRACTION=inf: the share"),
    _env("XLA_PYTHON_CLIENT_MEM_FRACTION", "1e-400", "XLA_PYTHON_CLIENT_MEM_FRACTION=1e-400: the share"),
    _env("XLA_PYTHON_CLIENT_MEM_FRACTION", "75%", "XLA_PYTHON_CLIENT_MEM_FRACTION='75%' is not a number"),
    _env("XLA_CLIENT_MEM_FRACTION", "1.5", "XLA_CLIENT_MEM_FRACTION=1.5", args=("compare", TINY, "--batches", "8,16")),
    _env("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", "lots", "XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB='lots' is not "
         "an integer"),
    Probe("--ray-address nohost", (*_RAY, "--ray-address", "nohost"), 2, "--ray-address 'nohost' is not HOST:PORT",
          cls="environment"),
    Probe("--ray-address head:99999", (*_RAY, "--ray-address", "head:99999"), 2, "is not HOST:PORT", cls="environment"),
    Probe("--ray-address http://head:8265 (the dashboard)", (*_RAY, "--ray-address", "http://head:8265"), 2,
          "Ray does not connect over http://", cls="environment"),
    Probe("--ray-address ray://... without ray[client]", (*_RAY, "--ray-address", "ray://127.0.0.1:10001"), 2,
          "a ray:// address needs Ray Client: pip install 'ray[client]'", cls="environment"),
    Probe("RAY_ADDRESS=nohost:1:2", _RAY, 2, "RAY_ADDRESS 'nohost:1:2' is not HOST:PORT",
          env=(("RAY_ADDRESS", "nohost:1:2"),), cls="environment"),
    Probe("--ray-address to a closed port: gives up at once", (*_RAY, "--ray-address", "127.0.0.1:{port}"), 2,
          "cannot reach the Ray cluster", setup="refused port", checks=("fast:30",), process=True, cls="environment"),
    Probe("RAY_ADDRESS to an HTTP server: not Ray", _RAY, 2, "but not Ray (no gRPC server)",
          env=(("RAY_ADDRESS", "127.0.0.1:{port}"),), setup="http server", checks=("fast:30",), process=True,
          cls="environment"),
    Probe("--ray-address to a host that does not answer: under 30 s", (*_RAY, "--ray-address", "10.255.255.1:6379"),
          2, "--ray-address '10.255.255.1:6379'", checks=("fast:35",), process=True, cls="environment",
          bench_only=True),
]

TRUST_PROBES = CACHE + SIGNALS + SWEEPS + ENVIRONMENT
