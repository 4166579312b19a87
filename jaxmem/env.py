"""The environment jax and XLA read, checked before jax starts: one message naming the variable
and the fix (exit 2), instead of a traceback, an abort or a hang later.

* Memory settings: jaxlib 0.10.2 parses them when its CUDA plugin initializes
  (``jaxlib.xla_client.generate_pjrt_gpu_plugin_options``): a bad value there is a Python
  traceback from inside jax, and a fraction like 5 or -1 is taken as given. jaxmem reads the
  same variables to say how much of a card is usable, so it checks them first and names the
  variable (docs/how-it-works.md "Memory settings").
* ``XLA_FLAGS``: XLA aborts the process at backend start on an unknown flag or a value it cannot
  read, and lists no flags anywhere jax exposes. A subprocess starts XLA's CPU client with the
  user's flags (about 1 s) and its verdict is quoted; a good flags string is remembered in the
  cache folder (keyed by the string, jaxlib and the interpreter), so it is paid once. The memo is
  signed like a compile-cache entry (HMAC-SHA256 under the cache's trusted key,
  jaxmem.compiler.cache_key): an empty file planted in a shared cache vouches for nothing, and
  without a trusted key the flags are probed each run. A blank XLA_FLAGS is refused without a
  probe: XLA takes it for the name of a file of flags and aborts.
* ``JAX_PLATFORMS``: a platform jax does not know, or only platforms this machine cannot start
  (``cuda`` without a GPU), fail inside jax; jaxmem needs none of them (it compiles for GPUs
  without one).
* Ray addresses (``--ray-address``, ``RAY_ADDRESS``; :func:`check_ray_address`): malformed,
  ``ray://`` without Ray Client, or nobody answering gRPC there -- ``ray.init`` would wait for
  minutes.

``JAX_COMPILATION_CACHE_DIR`` is not refused: jaxmem turns JAX's persistent compilation cache off
around its own compiles (jaxmem.compiler.compiled), since an executable from it has no buffer
assignment to explain.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import hmac
import importlib.machinery
import importlib.util
import math
import os
import re
import sys
from pathlib import Path

from jaxmem import files
from jaxmem.compiler import cache_key
from jaxmem.errors import UserError, clip

FRACTIONS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
ALLOCATORS = ("default", "platform", "bfc", "cuda_async", "vmm")   # what jaxlib 0.10.2 accepts
INTEGERS = ("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", "XLA_PYTHON_CLIENT_ABORT_COLLECTIVES_ON_FAILURE",
            "XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT")



def cache_dir() -> Path:
    """Where jaxmem keeps what it remembers between runs (the compile cache, checked XLA_FLAGS):
    $JAXMEM_CACHE, else $XDG_CACHE_HOME/jaxmem (default ~/.cache/jaxmem)."""
    override = os.environ.get("JAXMEM_CACHE")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "jaxmem"

def fraction(name: str, text: str) -> float:
    """A memory fraction from the environment: a finite number in (0, 1]."""
    try:
        x = float(text)
    except ValueError:
        raise UserError(f"{name}={text!r} is not a number; set it to the share of the card JAX may use, in (0, 1] "
                        f"(e.g. {name}=0.9), or unset it (JAX's default: 0.75).") from None
    if not math.isfinite(x) or not 0 < x <= 1:
        raise UserError(f"{name}={text}: the share of the card JAX may use must be in (0, 1] (e.g. {name}=0.9); "
                        "unset it for JAX's default of 0.75.")
    return x


def check(environ=None) -> None:
    """Raise a UserError naming the first variable jax would reject or misread."""
    env = os.environ if environ is None else environ
    given = [n for n in FRACTIONS if env.get(n)]
    if len(given) == 2:
        raise UserError("both XLA_CLIENT_MEM_FRACTION and XLA_PYTHON_CLIENT_MEM_FRACTION are set; jax refuses both: "
                        "unset XLA_PYTHON_CLIENT_MEM_FRACTION (the deprecated name).")
    for n in given:
        fraction(n, env[n])
    alloc = env.get("XLA_PYTHON_CLIENT_ALLOCATOR")
    if alloc is not None and alloc.lower() not in ALLOCATORS:
        raise UserError(f"XLA_PYTHON_CLIENT_ALLOCATOR={alloc!r}: jax accepts {', '.join(ALLOCATORS)}.")
    for n in INTEGERS:
        if env.get(n):
            try:
                int(env[n])
            except ValueError:
                raise UserError(f"{n}={env[n]!r} is not an integer, which jax requires.") from None
    pre = env.get("XLA_PYTHON_CLIENT_PREALLOCATE")
    if pre is not None and pre.strip().lower() not in ("true", "false", "1", "0", ""):
        # jax takes anything but false/0 as true: a typo would silently mean the opposite
        raise UserError(f"XLA_PYTHON_CLIENT_PREALLOCATE={pre!r}: jax reads only 'false' or '0' as off and anything "
                        "else as on; write true or false.")
    check_platforms(env)
    check_jax_config(env)
    check_xla_flags(env)
    from jaxmem.compiler.nccl import NcclSettings  # noqa: PLC0415 - `import jaxmem` loads env: only what it needs

    NcclSettings.from_env(env)   # the NCCL_* numbers the runtime model reads (before any compile)


# -- JAX_* configuration -------------------------------------------------------------------------

TRUTH = ("y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0")   # jax's bool_env


@functools.lru_cache(maxsize=1)
def jax_options() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The environment variables the installed jax reads as configuration (JAX_ENABLE_X64 ...):
    name -> (kind: bool | int | enum, the enum's values), read from jax's own config source
    without importing jax (an import with a bad value is the ValueError this check prevents)."""
    try:   # the path finder alone: locating jax's files runs no import hook (nothing of jax is loaded)
        spec = importlib.machinery.PathFinder.find_spec("jax")
        where = list(spec.submodule_search_locations or ()) if spec else []
        text = (Path(where[0]) / "_src" / "config.py").read_text() if where else ""
    except (ImportError, OSError, ValueError):
        return {}
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for kind, calls in (("bool", "bool_state|bool_flag|optional_bool_state"), ("int", "int_state|int_flag")):
        for name in re.findall(rf"\b(?:{calls})\(\s*(?:name\s*=\s*)?['\"](jax_\w+)['\"]", text):
            out[name.upper()] = (kind, ())
    for kind, call in (("bool", "bool_env"), ("int", "int_env")):
        for name in re.findall(rf"\b{call}\(\s*['\"](JAX_\w+)['\"]", text):
            out[name] = (kind, ())
    for name, values in re.findall(r"\benum_state\(\s*(?:name\s*=\s*)?['\"](jax_\w+)['\"],[^()]*?"
                                   r"enum_values\s*=\s*(\[[^\]]*\])", text, re.S):
        try:
            out[name.upper()] = ("enum", tuple(str(v) for v in ast.literal_eval(values)))
        except (ValueError, SyntaxError):
            pass
    return out


def check_jax_config(env) -> None:
    """A JAX_* variable the installed jax reads at import and would refuse (a ValueError out of
    `import jax`): JAX_ENABLE_X64=garbage. UserError naming it."""
    for name, (kind, values) in jax_options().items():
        value = env.get(name)
        if value is None:
            continue
        shown = clip(repr(value), 80)
        if kind == "bool" and value.lower() not in TRUTH:
            raise UserError(f"{name}={shown}: jax reads it as true or false (1/0, true/false, yes/no, on/off) and "
                            f"refuses anything else at import; set it so, or unset {name}.")
        if kind == "int":
            try:
                int(value)
            except ValueError:
                raise UserError(f"{name}={shown}: jax reads it as a whole number and refuses anything else at "
                                f"import; set it so, or unset {name}.") from None
        if kind == "enum" and value not in values:
            raise UserError(f"{name}={shown}: jax accepts {', '.join(values)}; set one, or unset {name}.")


# -- JAX_PLATFORMS -------------------------------------------------------------------------------

PLATFORMS = ("cpu", "cuda", "gpu", "rocm", "tpu")


def _platform_available(name: str) -> bool:
    import glob  # noqa: PLC0415 - only with JAX_PLATFORMS: `import jaxmem` loads no glob

    if name == "cpu":
        return True
    if name in ("cuda", "gpu"):
        return bool(glob.glob("/dev/nvidia[0-9]*")) or (name == "gpu" and os.path.exists("/dev/kfd"))
    if name == "rocm":
        return os.path.exists("/dev/kfd")
    return importlib.util.find_spec("libtpu") is not None   # tpu


def check_platforms(env) -> None:
    text = env.get("JAX_PLATFORMS")
    if not text or not text.strip():
        return
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PLATFORMS]
    if unknown:
        raise UserError(f"JAX_PLATFORMS={text}: jax knows no platform {unknown[0]!r} "
                        f"(it knows {', '.join(PLATFORMS)}); "
                        "unset JAX_PLATFORMS: jaxmem picks jax's platforms itself.")
    if not any(_platform_available(n) for n in names):
        what = {"cuda": "no NVIDIA GPU (no /dev/nvidia0)", "gpu": "no GPU (no /dev/nvidia0 or /dev/kfd)",
                "rocm": "no AMD GPU (no /dev/kfd)", "tpu": "no TPU runtime (libtpu is not installed)"}[names[0]]
        raise UserError(f"JAX_PLATFORMS={text}: this machine has {what}, so jax cannot start any platform it allows. "
                        "jaxmem compiles for GPUs without one: unset JAX_PLATFORMS (or set JAX_PLATFORMS=cpu).")


# -- XLA_FLAGS -----------------------------------------------------------------------------------

_PROBE = "from jaxlib import xla_client as xc; xc.make_cpu_client()"
PROBE_TIMEOUT_S = 60


def _only_host_devices(flags: str) -> bool:
    """The flag jaxmem itself sets (forced CPU devices) and nothing else: known good, no probe."""
    return all(re.fullmatch(r"--xla_force_host_platform_device_count=\d+", f) for f in flags.split())


_MEMO_TAG = b"jaxmem xla-flags-ok\n"   # what a memo's signature covers besides its key: no other entry's digest
_MEMO_BYTES = 64                        # a memo is the hex HMAC-SHA256 of its key


def _memo_key(flags: str) -> str:
    import importlib.metadata as md  # noqa: PLC0415 - only with XLA_FLAGS: `import jaxmem` does not load it

    try:
        jaxlib = md.version("jaxlib")
    except md.PackageNotFoundError:
        jaxlib = "?"
    return hashlib.sha256(f"{flags}\0{jaxlib}\0{sys.executable}".encode()).hexdigest()


def _memo_digest(secret: bytes, key: str) -> bytes:
    return hmac.new(secret, _MEMO_TAG + key.encode(), hashlib.sha256).hexdigest().encode()


def _memo_holds(key: str) -> bool:
    """A memo for `key` signed with this cache's trusted key (a regular file, not a link, of the
    digest's size): what an empty or copied file in a shared cache is not."""
    path = cache_dir() / "xla-flags-ok" / key
    if not os.path.lexists(path):
        return False
    secret = cache_key.for_use(cache_dir(), create=False)
    try:
        data = files.read_regular(path, _MEMO_BYTES, follow=False)
    except (OSError, files.Refused):
        return False
    return secret is not None and hmac.compare_digest(data, _memo_digest(secret, key))


def _remember(key: str) -> None:
    """Sign a memo for `key` (never in read-only mode, nor without a key this user trusts)."""
    if cache_key.read_only():
        return
    try:
        path = cache_dir() / "xla-flags-ok" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        secret = cache_key.for_use(cache_dir(), create=True)
        if secret is not None:
            files.write_atomic(path, _memo_digest(secret, key))
    except OSError:
        pass


def check_xla_flags(env) -> None:
    """Raise a UserError naming the flag of XLA_FLAGS that XLA would abort on."""
    flags = env.get("XLA_FLAGS", "")
    if flags and not flags.strip():
        raise UserError(f"XLA_FLAGS={clip(repr(flags), 40)} is blank: XLA takes a value that does not start with "
                        "'--' for the name of a file of flags, and aborts when it cannot open it; unset XLA_FLAGS, "
                        "or give flags as --xla_name=value.")
    for m in re.finditer(r"--xla_force_host_platform_device_count=(\S*)", flags):
        # XLA reads 0 but its CPU backend cannot start with it; past int32 XLA aborts without a word of why
        # (a value XLA cannot read otherwise: the probe quotes XLA)
        if m.group(1).isdigit() and not 1 <= int(m.group(1)) <= 2**31 - 1:
            raise UserError(f"XLA_FLAGS: {clip(m.group(0), 100)}: XLA's CPU backend needs between 1 and 2^31 - 1 "
                            "devices (a 32-bit count); remove the flag (jaxmem forces the host devices a CPU mesh "
                            "needs itself) or give a count of at least 1.")
    if not flags.strip() or _only_host_devices(flags):
        return
    key = _memo_key(flags)
    if _memo_holds(key):
        return
    import subprocess  # noqa: PLC0415 - only for a probe: `import jaxmem` loads no subprocess

    child_env = {k: v for k, v in env.items() if k != "JAX_PLATFORMS"}
    child_env["TF_CPP_MIN_LOG_LEVEL"] = "1"
    try:
        p = subprocess.run([sys.executable, "-c", _PROBE], env=child_env, capture_output=True, text=True,
                           errors="replace", timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return   # the probe itself could not run: XLA will say it later, if anything
    if p.returncode != 0:
        problem = _flags_problem(flags, p.stderr)
        if problem is not None:
            raise UserError(problem)
        return   # not a flags problem (a broken install is reported where it bites)
    _remember(key)


def _flags_problem(flags: str, stderr: str) -> str | None:
    fix = "fix or remove it in XLA_FLAGS (XLA aborts at start-up on it)"
    m = re.search(r"Unknown flags? in XLA_FLAGS: (.*)", stderr)
    if m:
        names = ", ".join(m.group(1).split())
        return (f"XLA_FLAGS: XLA knows no flag {names}; {fix}. Each flag is --xla_name=value, "
                "e.g. --xla_gpu_enable_triton_gemm=false.")
    m = re.search(r"Couldn't interpret value (.*) for flag (\S+?)\.?$", stderr, re.M)
    if m:
        return f"XLA_FLAGS: --{m.group(2)}={m.group(1)}: XLA cannot read the value {m.group(1)!r}; {fix}."
    m = re.search(r'Could not open file "(.*)" to read flags', stderr)
    if m:
        return (f"XLA_FLAGS={flags!r}: it does not start with '--', so XLA takes it for a file of flags and cannot "
                f"open {m.group(1)!r}; write each flag as --xla_name=value.")
    m = re.search(r"^F\d{4} [^\]]*\] (.*XLA_FLAGS.*|.*[Ff]lag parsing failed.*)$", stderr, re.M)
    if m:
        return f"XLA_FLAGS={flags!r}: XLA refuses it: {m.group(1).strip()}; {fix}."
    return None


# -- Ray addresses -------------------------------------------------------------------------------

RAY_CONNECT_S = 4.0   # per step of the reachability check: TCP connect, then gRPC's answer
RAY_INIT_S = 15.0     # ray.init itself, once something answers gRPC there (a child process)
# HTTP/2's connection preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, Ray Client's
# server) answers with a SETTINGS frame of its own; anything else does not.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def check_ray_address(address: str, option: str) -> None:
    """Raise a UserError naming `option` (--ray-address or RAY_ADDRESS) when the address is
    malformed, needs Ray Client that is not installed, or nothing there speaks gRPC: ray.init
    would hang for minutes. Within about 2 x RAY_CONNECT_S."""
    import socket  # noqa: PLC0415 - only with a Ray address

    text = address.strip()
    if text in ("auto", "local"):
        return   # ray's own look-ups: a running local cluster, or a new one
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    fix = (f"give {option} as HOST:PORT (the head's GCS, port 6379 by default) or ray://HOST:PORT (Ray Client, "
           "port 10001), or leave it unset for a local Ray")
    if scheme not in ("", "ray"):
        raise UserError(f"{option} {address!r}: Ray does not connect over {scheme}://; {fix}.")
    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})", rest)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise UserError(f"{option} {address!r} is not HOST:PORT; {fix}.")
    if scheme == "ray":
        try:
            # optional: what ray[client] adds
            import grpc  # noqa: F401, PLC0415 - optional: what ray[client] adds
        except ImportError:
            raise UserError(f"{option} {address!r}: a ray:// address needs Ray Client: pip install 'ray[client]' "
                            "(or give the GCS address HOST:6379 from a machine inside the cluster).") from None
    host, port = m.group(1).strip("[]"), int(m.group(2))
    try:
        with socket.create_connection((host, port), timeout=RAY_CONNECT_S) as sock:
            sock.settimeout(RAY_CONNECT_S)
            sock.sendall(_H2_PREFACE)
            head = sock.recv(9)
    except OSError as e:
        reason = "timed out" if isinstance(e, socket.timeout) else (e.strerror or str(e))
        raise UserError(f"{option} {address!r}: cannot reach the Ray cluster ({reason}); start it "
                        f"(`ray start --head`), or fix {option}.") from None
    if len(head) < 9 or head[3] != 4:
        raise UserError(f"{option} {address!r}: something answers at {host}:{port}, but not Ray (no gRPC "
                        f"server); {fix}.")
    _probe_ray(text, option)


_RAY_PROBE = ("import sys, ray; ray.init(address=sys.argv[1], log_to_driver=False, logging_level='ERROR'); "
              "ray.shutdown()")


def _probe_ray(address: str, option: str) -> None:
    """ray.init on the address in a child process, given up after RAY_INIT_S: a gRPC server that
    is not Ray's GCS (or another Ray version's) keeps ray.init retrying, printing a line a second,
    for minutes. The child's noise stays in the child."""
    import subprocess  # noqa: PLC0415 - as in check_xla_flags

    try:
        p = subprocess.run([sys.executable, "-c", _RAY_PROBE, address], capture_output=True, text=True,
                           errors="replace", timeout=RAY_INIT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UserError(f"{option} {address!r}: the Ray cluster did not accept a connection within {RAY_INIT_S:g} s "
                        "(something answers gRPC there, but not as a Ray head of this Ray version: `ray status` "
                        f"on the head says); fix {option}.") from None
    except OSError:
        return
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith(("[", " "))]
        last = (lines or ["(no message)"])[-1][:300]
        raise UserError(f"{option} {address!r}: cannot connect to the Ray cluster: {last}")


# -- jax started before jaxmem was imported (a notebook that ran jax.devices() first) --------------

SWITCH = "JAX_SKIP_CUDA_CONSTRAINTS_CHECK"   # jaxmem/__init__.py sets it: deviceless CUDA needs it
_at_import = {"jax_started": False, "switch": True}


def note_jax_state() -> None:
    """Record, as jaxmem is imported, whether jax had already loaded its plugins and without the
    switch: jax loads them once, so its CUDA plugin then stays refused on a machine without a GPU."""
    xb = sys.modules.get("jax._src.xla_bridge")  # never imports jax: only asks one already imported
    started = False
    if xb is not None:
        started = bool(getattr(xb, "_plugins_registered", False))
        is_init = getattr(xb, "backends_are_initialized", None)
        started = started or bool(is_init is not None and is_init())
    _at_import.update(jax_started=started, switch=bool(os.environ.get(SWITCH)))


def jax_started_without_switch() -> bool:
    return _at_import["jax_started"] and not _at_import["switch"]


def started_too_early(what: str) -> UserError:
    """The error when jax started before jaxmem could prepare it (`what`: what that broke)."""
    return UserError(
        f"{what}: jax's backend was initialised before jaxmem was imported (e.g. jax.devices() or a jnp array "
        f"ran first), without {SWITCH}=1, so jax's CUDA plugin, finding no usable GPU, refused to load "
        "(jax loads its plugins once per process). Restart the kernel (the Python process) and `import jaxmem` "
        f"before touching jax, or set {SWITCH}=1 (os.environ, or the shell) before jax starts.")


def too_few_cpu_devices(needed: int, have: int) -> UserError:
    """A CPU mesh larger than the CPU devices jax started with: XLA reads their number once, when jax's
    backend starts (in a notebook, often before the analysis that needs more)."""
    flag = f"--xla_force_host_platform_device_count={needed}"
    return UserError(
        f"the mesh needs {needed} CPU devices but jax has {have}: XLA fixes the number of CPU devices when jax's "
        f"backend starts, from XLA_FLAGS={flag}. Add it to XLA_FLAGS before anything touches jax (the jaxmem CLI "
        "does this itself); in a notebook, restart the kernel and set os.environ['XLA_FLAGS'] in the first cell.")
