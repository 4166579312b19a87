"""The on-disk compile cache: never the same compile twice.

An entry is the :class:`~jaxmem.compiler.artifacts.Artifacts` of one compile, stored as gzipped
JSON under a key made of everything that decides them:

* the lowered program (StableHLO text with its op names -- what the explanation attributes
  buffers to -- but not its file:line locations, and with a custom-partitioned op's per-run
  callback key replaced by a fingerprint of its partitioning rules), so any change to the model file, its
  arguments or the step's options that changes the program misses, and any change that does
  not (a comment, a moved line) hits with the same answer;
* the target: platform, device kind, the GPU's target config (memory size, SM count ... change
  XLA:GPU's decisions), the device ids and hosts of the mesh;
* the compile options, whether the buffer assignment was dumped, ``XLA_FLAGS``, and the XLA
  debug options this process compiles with (XLA parses ``XLA_FLAGS`` once, when first asked:
  a later change to the variable changes nothing XLA does, so the key holds what it parsed);
* the jax, jaxlib, CUDA plugin and jaxmem versions, and this file's format version.

Post-processing (categories, explanation, runtime overhead, fits) is re-done from the Artifacts
on every run, so a cached answer equals a fresh one. Where: ``$JAXMEM_CACHE`` if set, else
``$XDG_CACHE_HOME/jaxmem`` (default ``~/.cache/jaxmem``). Nothing is evicted: ``jaxmem cache``
says where it is and how big; ``jaxmem cache --clear`` empties it.

An entry never answers for anything but its own key, and a damaged one is a miss, never an error
(a research group may point ``JAXMEM_CACHE`` at one shared folder, and jaxmem is a gate):

* each entry holds a header naming its key, the format and the versions, and an HMAC-SHA256 of
  that header and of the whole payload under this cache's secret (``<cache>/secret``, 32 random
  bytes written once, readable as the entries are). An entry whose key, versions or digest does
  not match, that cannot be read, decompressed or parsed, whose payload is not a well-formed
  Artifacts, or that is not a regular file (a FIFO, a symlink, a directory: opened with
  O_NONBLOCK | O_NOFOLLOW and checked with fstat before reading) is a miss; the fresh compile
  then replaces it.
* This catches accidental damage (a flipped byte, a truncated copy), entries swapped or copied
  under another key, entries from another cache, and naive edits of the numbers -- including
  one that recomputes a plain SHA-256. It does NOT stop a deliberate forger who can read the
  secret: whoever can write the folder can usually read it too. Keep a cache you must trust
  writable only by people you trust.
* Writes go to a unique temporary name in the same folder, are flushed to disk, and are renamed
  over the entry: a reader on a shared filesystem sees the old entry or the new one, never part
  of one; concurrent writers of one key each write a whole, equal entry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import hmac
import importlib.metadata as md
import io
import json
import os
import re
import stat
import threading
import zlib
from pathlib import Path
from typing import Any

import jaxmem
from jaxmem import env, files
from jaxmem.compiler import cache_key, targets
from jaxmem.compiler.artifacts import CompiledStats

FORMAT = 5   # bump when Artifacts' JSON or the entry's layout changes (2: header with key, versions, HMAC; 3: an
# early-stopped compile keeps its module's cost: an entry without it would cost its text differently; 4: XLA's
# rematerialization failures in stats.remat_failures, not among the notes; 5: stats.compile_options)
MAGIC = "jaxmem-compile-cache"
# The most an entry may hold: a buffer-assignment dump of a large model is tens of MB; a file far
# larger than any entry is not read into memory (it is a miss).
MAX_ENTRY_BYTES = 256 << 20   # decompressed; read at most MAX_RAW_BYTES
MAX_RAW_BYTES = 64 << 20
SECRET_BYTES = 32
_ENTRY = re.compile(r"[0-9a-f]{64}\.json\.gz")


def cache_dir() -> Path:
    return env.cache_dir()


def _versions() -> dict[str, str]:
    import jax  # noqa: PLC0415 - `jaxmem cache` (info, clear, trust) loads no jax: only the keys need it
    import jaxlib  # noqa: PLC0415 - as jax above

    out = {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "jaxmem": jaxmem.__version__, "format": str(FORMAT)}
    for dist in ("jax-cuda12-plugin", "jax-cuda12-pjrt"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def _xla_flags() -> str:
    # The forced host-device count only sizes the CPU client; the mesh's devices are keyed apart.
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                    if not f.startswith("--xla_force_host_platform_device_count"))


def _debug_options() -> str:
    """A fingerprint of the XLA debug options every compile of this process starts from.

    XLA parses ``XLA_FLAGS`` once per process; jax copies the parse into each compile's options,
    and the compile child receives them serialized (a recipe's ``--xla_disable_hlo_passes=...``
    reaches the deviceless compile that way). An ``XLA_FLAGS`` set after that parse (a library
    user changing ``os.environ`` mid-process) changes the variable, not the compile: keying the
    variable alone would store an unflagged compile under the flagged key."""

    from jax._src.lib import xla_client as xc  # noqa: PLC0415 - as _versions: `jaxmem cache` loads no jax

    options = xc.CompileOptions()
    # the forced host-device count only sizes the CPU client (as in _xla_flags)
    options.executable_build_options.debug_options.xla_force_host_platform_device_count = 0
    return hashlib.sha256(options.SerializeAsString()).hexdigest()


def _target(built, target_config: str | None = None) -> dict:
    devices = list(built.mesh.devices.flat) if built.mesh is not None else []
    kind = devices[0].device_kind if devices else ""
    platform = devices[0].platform if devices else ""
    # A catalogue GPU's full target config: its memory size is the limit XLA budgets the step against (the
    # run's pool, jaxmem.compiler.targets.xla_device_memory), so an answer compiled at another limit misses.
    # `target_config`: the one the compile runs with (an early-stopped compile's child), else the devices'.
    config = target_config or (targets.deviceless_config(devices[0]) if devices else None) or next(
        (spec.target_config() for spec in targets.CATALOGUE.values() if spec.description == kind), None)
    return {"platform": platform, "device_kind": kind, "target_config": config,
            "mesh": None if built.mesh is None else [list(built.mesh.axis_names), list(built.mesh.devices.shape)],
            "devices": [[d.id, getattr(d, "process_index", 0)] for d in devices]}


# A file location in StableHLO's debug info: "path":line:col, maybe "to line:col" / "to :col".
_FILE_LOC = re.compile(r'"[^"]*":\d+:\d+(?: to \d*:?\d+)?')


# A constant of more elements than this is printed elided and keyed by the digest of its bytes: MLIR
# prints a constant as hex (two characters a byte), once per op that holds it, so a step that captures
# N bytes of tables had its key text at 2N or more per copy (Hugging Face's FlaxLlama builds a rotary
# table per layer in numpy: 32 x 128 MiB at Llama-3.1-8B's 131072 positions; the key's text was 8 GiB).
PRINTED_ELEMENTS = 1024
_ELIDED = "dense_resource<__elided__>"


def program_text(lowered) -> str:
    """The lowered program with its op names (the explanation attributes buffers to them) but
    without file:line locations: those name the caller's frames too (the line that called
    analyze), which change nothing XLA decides and nothing jaxmem reports. A custom-partitioned
    op's per-run callback key is replaced by what its callbacks are (jaxmem.compiler.partitioners).
    A large constant is elided in the text and its bytes' digest appended, in program order."""

    from jaxmem.compiler.partitioners import stable_program_text  # noqa: PLC0415 - imports jax: as _versions

    module = lowered.compiler_ir("stablehlo")
    out = io.StringIO()
    module.operation.print(file=out, enable_debug_info=True, large_elements_limit=PRINTED_ELEMENTS)
    text = out.getvalue()
    digests = _large_constant_digests(module) if _ELIDED in text else []   # the walk only where MLIR elided
    if text.count(_ELIDED) != len(digests):   # something elided that is not a constant's elements: print whole
        text, digests = lowered.as_text(debug_info=True), []
    return stable_program_text(_FILE_LOC.sub('"":0:0', text)) + "".join(f"\n// constant sha256:{d}" for d in digests)


def _large_constant_digests(module) -> list[str]:
    """The SHA-256 of each constant MLIR elides at PRINTED_ELEMENTS, in the order it prints them
    (the module's op order): read from the attribute's own storage, never copied."""
    from jax._src.lib.mlir import ir  # noqa: PLC0415 - imports jax: as _versions

    digests: list[str] = []

    def visit(op):
        attrs = op.attributes
        for i in range(len(attrs)):
            attr = attrs[i].attr
            if (isinstance(attr, ir.DenseElementsAttr) and not attr.is_splat
                    and len(attr) > PRINTED_ELEMENTS):
                digests.append(hashlib.sha256(memoryview(attr)).hexdigest())
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)   # as the printer meets them
    return digests


def keys(lowered, built, options: dict, *, explain: bool, until: str = "executable",
         target_config: str | None = None) -> list[str]:
    """The cache keys that answer compiling `lowered` (of `built`) with `options`, in the order to try:
    an entry compiled with the explanation serves a request without it (same compile, the dump is
    dropped), so without `explain` both keys, the last one being where a fresh compile is stored.
    The lowered program is serialized and hashed once for both. `until`: how far XLA ran
    ("executable", or "buffer_assignment" for jaxmem.compiler.early_stop, whose HLO text lacks the
    module-config attributes of the header line): a cached answer equals a fresh one of its kind.
    `target_config`: the target config XLA compiles for when it is not the mesh's devices' (a child's)."""

    material = {"program": hashlib.sha256(program_text(lowered).encode()).hexdigest(),
                "target": _target(built, target_config),
                "options": {k: str(v) for k, v in sorted(options.items())},
                "xla_flags": _xla_flags(), "debug_options": _debug_options(), "versions": _versions(), "until": until,
                # what an entry holds: a field added to CompiledStats must not be read back as its default
                "stats_fields": [f.name for f in dataclasses.fields(CompiledStats)]}
    digest = lambda e: hashlib.sha256(json.dumps({**material, "explain": e}, sort_keys=True).encode()).hexdigest()  # noqa: E731
    return [digest(True)] if explain else [digest(True), digest(False)]


def _path(k: str) -> Path:
    return cache_dir() / "compiles" / f"{k}.json.gz"


def _read_regular(path: Path, limit: int) -> bytes | None:
    """The bytes of `path` if it is a regular file (not a link) of at most `limit` bytes, else None
    (jaxmem.files: O_NONBLOCK, so opening a FIFO waits for no writer; fstat then refuses it)."""
    try:
        return files.read_regular(path, limit, follow=False)
    except (OSError, files.Refused):
        return None


def _write_atomic(path: Path, data: bytes) -> None:
    """Write `data` under a unique temporary name beside `path`, flush it to disk, rename it over
    `path`. Raises OSError; the temporary file never survives a failure."""
    files.write_atomic(path, data)


def _secret(*, create: bool) -> bytes | None:
    """This cache's HMAC key when it is trusted (jaxmem.compiler.cache_key: whose it is, who could
    have read it); with `create`, made on first use. None where there is none to trust."""
    return cache_key.for_use(cache_dir(), create=create)


def _digest(secret: bytes, header: dict, payload: bytes) -> str:
    head = json.dumps({k: v for k, v in header.items() if k != "digest"}, sort_keys=True).encode()
    return hmac.new(secret, head + b"\n" + payload, hashlib.sha256).hexdigest()


def _decompress(raw: bytes) -> bytes | None:
    """One whole gzip member of at most MAX_ENTRY_BYTES, else None (truncated, damaged, a bomb).
    In steps of 4 MiB into one growing buffer: a bomb costs the cap, not zlib's guess of the size."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = bytearray()
    data = raw
    try:
        while not d.eof:
            chunk = d.decompress(data, 4 << 20)
            out += chunk
            if len(out) > MAX_ENTRY_BYTES:
                return None
            data = d.unconsumed_tail
            if not chunk and not data:   # input spent before the member's end: truncated
                break
    except zlib.error:
        return None
    if not d.eof or d.unused_data:
        return None
    return bytes(out)


def _discard(path: Path, raw_size: int | None) -> None:
    """Remove an entry found bad, so that it costs one check, not one per run. Best effort: a FIFO,
    a link, a regular file of the size read, an empty directory (never a directory's contents); a
    writer that renamed a good entry over it meanwhile loses at most one compile. Never in
    read-only mode (JAXMEM_CACHE_READONLY: a reader changes nothing)."""
    if cache_key.read_only():
        return
    try:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(path)
        elif stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode) or stat.S_ISLNK(st.st_mode) or (
                stat.S_ISREG(st.st_mode) and (raw_size is None or st.st_size == raw_size)):
            os.unlink(path)
    except OSError:
        pass


def load(k: str, *, parse=None):
    """The stored Artifacts JSON for key `k` (or `parse` of it), or None: a miss when there is none,
    and when the entry is not this key's own, undamaged entry (see the module's docstring), or
    `parse` raises on it (Artifacts.from_json: a payload of the wrong shape). A bad entry is
    removed; the fresh compile's store puts a good one there. Without a key this user trusts,
    every entry is a miss and none is removed (they may be good under their owner's key)."""
    path = _path(k)
    if not os.path.lexists(path):
        return None
    secret = _secret(create=False)
    if secret is None:
        return None
    raw = _read_regular(path, MAX_RAW_BYTES)
    if raw is None:
        if os.path.lexists(path):
            _discard(path, None)
        return None
    out = _verified(k, raw, secret)
    if out is not None and parse is not None:
        try:
            out = parse(out)
        except Exception:  # noqa: BLE001 - whatever a malformed payload raises, it is a miss
            out = None
    if out is None:
        _discard(path, len(raw))
    return out


def _verified(k: str, raw: bytes, secret: bytes) -> dict | None:
    data = _decompress(raw)
    if data is None:
        return None
    head, sep, body = data.partition(b"\n")
    if not sep:
        return None
    try:
        header = json.loads(head)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(header, dict) or header.get("magic") != MAGIC or header.get("format") != FORMAT \
            or header.get("key") != k or header.get("size") != len(body) or not isinstance(header.get("digest"), str):
        return None
    if header.get("versions") != _versions():   # keyed already; checked again in case it was copied in
        return None
    if not hmac.compare_digest(_digest(secret, header, body), header["digest"]):
        return None
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return payload if isinstance(payload, dict) else None


_pending: list = []   # stores still being written (store_in_background)


def store_in_background(k: str, payload: dict) -> None:
    """store() on a thread of its own. Hashing, gzip and the write release the GIL, so an entry of
    tens of MB is written on another core while the analysis reads its compile (about 0.6 s of a
    gpt2-medium analysis otherwise). A plain (non-daemon) thread: the interpreter waits for it at
    exit; :func:`wait_for_stores` waits where the entry must be there."""

    t = threading.Thread(target=store, args=(k, payload), name="jaxmem-cache-store")
    t.start()
    _pending.append(t)


def wait_for_stores() -> None:
    while _pending:
        _pending.pop().join()


@contextlib.contextmanager
def stores_settled():
    """The span in which store_in_background may write behind the caller: on leaving it (returned or
    raised), every entry written inside is on disk (an analysis' answer is there when it returns)."""
    try:
        yield
    finally:
        wait_for_stores()


def store(k: str, payload: dict) -> None:
    """Write atomically; a cache that cannot be written is skipped, not an error, and so is one
    in read-only mode or whose key this user does not trust (cache_key)."""
    if cache_key.read_only():
        return
    path = _path(k)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        secret = _secret(create=True)
        if secret is None:
            return
        body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        header = {"magic": MAGIC, "format": FORMAT, "key": k, "versions": _versions(), "size": len(body)}
        header["digest"] = _digest(secret, header, body)
        data = gzip.compress(json.dumps(header, sort_keys=True).encode() + b"\n" + body, compresslevel=3, mtime=0)
        _write_atomic(path, data)
    except OSError:
        pass


# -- `jaxmem cache`: where, how much, and clearing ------------------------------------------------

def info() -> dict:
    """Where the cache is and what it holds: entries (regular files named as entries), their bytes,
    partial writes (temporary files a killed writer left), and anything else found there."""
    folder = cache_dir() / "compiles"
    out: dict[str, Any] = {"path": str(cache_dir()), "entries": 0, "bytes": 0, "partial_writes": 0, "other": 0,
           "secret": os.path.isfile(cache_dir() / "secret"), "key": cache_key.inspect(cache_dir()).to_json()}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for n in names:
        try:
            st = os.lstat(folder / n)
        except OSError:
            continue
        if _ENTRY.fullmatch(n) and stat.S_ISREG(st.st_mode):
            out["entries"] += 1
            out["bytes"] += st.st_size
        elif n.startswith(".tmp-") and stat.S_ISREG(st.st_mode):
            out["partial_writes"] += 1
            out["bytes"] += st.st_size
        else:
            out["other"] += 1
    return out


def trust(fp: str) -> dict:
    """`jaxmem cache --trust FINGERPRINT`: this user trusts the cache's key (cache_key.trust)."""
    cache_key.trust(cache_dir(), fp)
    return info()


def clear() -> dict:
    """Remove every entry and partial write (and anything else named as an entry that is not a
    directory); leaves other files alone: JAXMEM_CACHE may point anywhere. Returns info() after,
    with how many files were removed."""
    folder = cache_dir() / "compiles"
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        names = []
    for n in names:
        if not (_ENTRY.fullmatch(n) or n.startswith(".tmp-")):
            continue
        try:
            if not stat.S_ISDIR(os.lstat(folder / n).st_mode):
                os.unlink(folder / n)
                removed += 1
        except OSError:
            pass
    return {**info(), "removed": removed}
