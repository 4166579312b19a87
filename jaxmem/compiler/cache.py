"""The on-disk compile cache: never the same compile twice.

An entry is the :class:`~jaxmem.compiler.compiled.Artifacts` of one compile, stored as gzipped
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
``$XDG_CACHE_HOME/jaxmem`` (default ``~/.cache/jaxmem``). Writes are atomic (a worker may die,
and several write at once). Nothing is evicted: delete the directory to clear it.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

FORMAT = 1   # bump when Artifacts' JSON changes


def cache_dir() -> Path:
    override = os.environ.get("JAXMEM_CACHE")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "jaxmem"


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    import jax
    import jaxlib

    import jaxmem

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
    from jax._src.lib import xla_client as xc

    options = xc.CompileOptions()
    # the forced host-device count only sizes the CPU client (as in _xla_flags)
    options.executable_build_options.debug_options.xla_force_host_platform_device_count = 0
    return hashlib.sha256(options.SerializeAsString()).hexdigest()


def _target(built) -> dict:
    from jaxmem.compiler import targets

    devices = list(built.mesh.devices.flat) if built.mesh is not None else []
    kind = devices[0].device_kind if devices else ""
    platform = devices[0].platform if devices else ""
    # A catalogue GPU's full target config (its memory size changes XLA's scheduling).
    config = next((spec.target_config() for spec in targets.CATALOGUE.values() if spec.description == kind), None)
    return {"platform": platform, "device_kind": kind, "target_config": config,
            "mesh": None if built.mesh is None else [list(built.mesh.axis_names), list(built.mesh.devices.shape)],
            "devices": [[d.id, getattr(d, "process_index", 0)] for d in devices]}


# A file location in StableHLO's debug info: "path":line:col, maybe "to line:col" / "to :col".
_FILE_LOC = re.compile(r'"[^"]*":\d+:\d+(?: to \d*:?\d+)?')


def program_text(lowered) -> str:
    """The lowered program with its op names (the explanation attributes buffers to them) but
    without file:line locations: those name the caller's frames too (the line that called
    analyze), which change nothing XLA decides and nothing jaxmem reports. A custom-partitioned
    op's per-run callback key is replaced by what its callbacks are (jaxmem.compiler.partitioners)."""
    from jaxmem.compiler.partitioners import stable_program_text

    return stable_program_text(_FILE_LOC.sub('"":0:0', lowered.as_text(debug_info=True)))


def keys(lowered, built, options: dict, *, explain: bool, until: str = "executable") -> list[str]:
    """The cache keys that answer compiling `lowered` (of `built`) with `options`, in the order to try:
    an entry compiled with the explanation serves a request without it (same compile, the dump is
    dropped), so without `explain` both keys, the last one being where a fresh compile is stored.
    The lowered program is serialized and hashed once for both. `until`: how far XLA ran
    ("executable", or "buffer_assignment" for jaxmem.compiler.early_stop, whose HLO text lacks the
    module-config attributes of the header line): a cached answer equals a fresh one of its kind."""
    from jaxmem.compiler.compiled import CompiledStats

    material = {"program": hashlib.sha256(program_text(lowered).encode()).hexdigest(), "target": _target(built),
                "options": {k: str(v) for k, v in sorted(options.items())},
                "xla_flags": _xla_flags(), "debug_options": _debug_options(), "versions": _versions(), "until": until,
                # what an entry holds: a field added to CompiledStats must not be read back as its default
                "stats_fields": [f.name for f in dataclasses.fields(CompiledStats)]}
    digest = lambda e: hashlib.sha256(json.dumps({**material, "explain": e}, sort_keys=True).encode()).hexdigest()  # noqa: E731
    return [digest(True)] if explain else [digest(True), digest(False)]


def _path(k: str) -> Path:
    return cache_dir() / "compiles" / f"{k}.json.gz"


def load(k: str) -> dict | None:
    """The stored Artifacts JSON for key `k`, or None (missing or unreadable: a miss)."""
    try:
        with gzip.open(_path(k), "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, EOFError, ValueError):
        return None


def store(k: str, payload: dict) -> None:
    """Write atomically; a cache that cannot be written is skipped, not an error."""
    path = _path(k)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json.gz")
        try:
            with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=3, mtime=0) as f:
                f.write(json.dumps(payload).encode("utf-8"))
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
