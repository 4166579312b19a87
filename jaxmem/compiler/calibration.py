"""Runtime measurements per device kind: the shipped ones and the user's calibration file.

``jaxmem calibrate`` measures, on the device, what a real run uses beyond XLA's buffer
assignment and stores it per device kind (the CUDA device name, or "cpu") in the user's
calibration file (``JAXMEM_CALIBRATION``, default ``~/.config/jaxmem/calibration.json``).
Shipped values live in ``jaxmem/data/overhead.json``.

The numbers in these files decide verdicts, so they are checked on every read: a file
that is not a JSON object of entries, or an entry with a missing, negative, non-integer
or absurd value, is a user error naming the file, the entry and the key -- never
silently ignored. Writes are atomic (a temporary file in the same folder, then
``os.replace``) and never replace a file that could not be read: its other device
kinds' entries would be lost.
"""

from __future__ import annotations

import dataclasses
import json
import os
from importlib import resources
from pathlib import Path

from jaxmem import files
from jaxmem.errors import UserError

# No runtime term is anywhere near 1 PiB per device: a larger value is a corrupt file, and
# would make any model "fit" (negative) or nothing fit (huge).
MAX_BYTES = 1 << 50

_INT_KEYS = ("in_pool_bytes", "out_of_pool_bytes")                    # required
_OPTIONAL_INT_KEYS = ("per_process_bytes", "nccl_communicator_bytes")  # optional (null allowed)


@dataclasses.dataclass(frozen=True)
class Entry:
    """What was measured (or is estimated) for one device kind, per device unless said."""

    in_pool_bytes: int                 # inside JAX's pool, beyond XLA's buffers (allocator rounding, runtime buffers)
    out_of_pool_bytes: int             # outside the pool, one process on one device: CUDA context + library handles
    source: str
    measured_at: str | None = None
    # CPU: one process holds every host device, so a cost paid once per process is shared by them.
    per_process_bytes: int = 0
    # GPU: one NCCL communicator's memory, when calibrate could measure it (2+ local GPUs).
    nccl_communicator_bytes: int | None = None


def user_path() -> Path:
    base = os.environ.get("JAXMEM_CALIBRATION") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "jaxmem", "calibration.json")
    return Path(base)


def _bad(path, what: str) -> UserError:
    return UserError(f"calibration file {path}: {what}. Fix or delete it, rerun `jaxmem calibrate` after moving it "
                     f"away, or point JAXMEM_CALIBRATION at another file.")


def validate_entry(path, kind: str, raw) -> Entry:
    """One entry of a calibration file, checked key by key (UserError names file, entry and key)."""
    if not isinstance(raw, dict):
        raise _bad(path, f"entry {kind!r} must be a JSON object, got {type(raw).__name__}")
    values: dict = {}
    for key in _INT_KEYS + _OPTIONAL_INT_KEYS:
        if key not in raw or (raw[key] is None and key in _OPTIONAL_INT_KEYS):
            if key in _INT_KEYS:
                raise _bad(path, f"entry {kind!r} has no {key!r}")
            continue
        v = raw[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise _bad(path, f"entry {kind!r}: {key} must be an integer number of bytes, got {v!r}")
        if not 0 <= v <= MAX_BYTES:
            raise _bad(path, f"entry {kind!r}: {key} = {v} is outside 0 .. {MAX_BYTES} bytes")
        values[key] = v
    source = raw.get("source")
    if not isinstance(source, str) or not source.strip():
        raise _bad(path, f"entry {kind!r}: source must be a non-empty string saying how it was measured, "
                         f"got {source!r}")
    measured_at = raw.get("measured_at")
    if measured_at is not None and not isinstance(measured_at, str):
        raise _bad(path, f"entry {kind!r}: measured_at must be a date string or null, got {measured_at!r}")
    return Entry(source=source, measured_at=measured_at, **values)


def parse(path, text: str) -> dict[str, Entry]:
    """Entries of a calibration file's text; keys starting with '_' are comments."""
    try:
        data = files.loads_json(text, f"calibration file {path}")
    except json.JSONDecodeError as e:
        raise _bad(path, f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except ValueError as e:
        raise _bad(path, f"not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise _bad(path, f"must be a JSON object of device kinds, got {type(data).__name__}")
    return {kind: validate_entry(path, kind, raw) for kind, raw in data.items() if not kind.startswith("_")}


# A calibration file holds a few entries of a few hundred bytes each.
MAX_FILE_BYTES = 1 << 20


def _read_text(path: Path) -> str:
    """Bounded and non-blocking (jaxmem.files): a FIFO or a device here is refused at once."""
    try:
        return files.read_regular(path, MAX_FILE_BYTES).decode("utf-8")
    except files.Refused as e:
        raise _bad(path, f"is {e}, not a calibration file") from None
    except UnicodeDecodeError as e:
        raise _bad(path, f"is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise _bad(path, f"cannot be read ({e.strerror or e})") from None


def read_user(path: Path | None = None) -> dict[str, Entry]:
    """The user's calibrations; {} when there is no file. A bad file is a UserError."""
    path = user_path() if path is None else path
    if not os.path.lexists(path):
        return {}
    return parse(path, _read_text(path))


def shipped_raw() -> dict:
    return json.loads(resources.files("jaxmem").joinpath("data/overhead.json").read_text())


def shipped() -> dict[str, Entry]:
    """The shipped measured entries per kind (today: 'cpu'); GPU estimates are in runtime.py's inputs."""
    raw = shipped_raw()
    return {k: validate_entry("jaxmem/data/overhead.json", k, v) for k, v in raw.items()
            if not k.startswith("_") and isinstance(v, dict) and "in_pool_bytes" in v}


def lookup(kind: str, platform: str) -> tuple[Entry | None, bool]:
    """The entry for a device kind: the user's calibration, else the shipped one for the kind or
    its platform ('cpu'); None when there is none (a GPU nobody calibrated: the runtime model
    estimates). Returns (entry, calibrated_by_user)."""
    user = read_user()
    if kind in user:
        return user[kind], True
    ship = shipped()
    return ship.get(kind) or ship.get(platform), False


def save(kinds: list[str], entry: Entry, path: Path | None = None) -> Path:
    """Store `entry` under each of `kinds`, keeping the file's other entries; atomic.

    An existing file that cannot be read or does not validate is left alone (UserError):
    overwriting it would lose the other device kinds' entries.
    """
    path = user_path() if path is None else path
    existing: dict = {}
    if os.path.lexists(path):
        text = _read_text(path)
        parse(path, text)  # refuse to touch a bad file
        existing = json.loads(text)
    for k in kinds:
        existing[k] = {key: value for key, value in dataclasses.asdict(entry).items()
                       if value is not None or key in ("measured_at",)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)   # jaxmem's own config folder
        # beside it, then renamed: a reader sees the old file or the new one; a link is replaced, not followed
        files.write_atomic(path, (json.dumps(existing, indent=2) + "\n").encode("utf-8"))
    except OSError as e:
        raise UserError(f"cannot write the calibration file {path}: {e.strerror or e}") from None
    return path
