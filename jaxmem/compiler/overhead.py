"""Runtime overhead: memory a real run uses beyond XLA's buffer assignment.

Kept as its own named term, never folded into XLA's numbers. Values come from
``jaxmem/data/overhead.json`` (shipped, per platform) overridden by a per-user
calibration file written by ``jaxmem calibrate`` (per device kind).
"""

from __future__ import annotations

import dataclasses
import json
import os
from importlib import resources
from pathlib import Path

from jaxmem.compiler.targets import Target


@dataclasses.dataclass(frozen=True)
class Overhead:
    in_pool_bytes: int
    out_of_pool_bytes: int
    source: str
    measured_at: str | None = None
    # CPU: one process holds every host device, so a cost paid once per process
    # (thread pools, first-run set-up) is shared by them: lookup() adds per_process_bytes / n_devices.
    per_process_bytes: int = 0


def user_calibration_path() -> Path:
    base = os.environ.get("JAXMEM_CALIBRATION") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME", os.path.expanduser("~/.config")), "jaxmem", "calibration.json")
    return Path(base)


def _shipped() -> dict:
    return json.loads(resources.files("jaxmem").joinpath("data/overhead.json").read_text())


def _user() -> dict:
    p = user_calibration_path()
    if not p.is_file():
        return {}
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def kind_key(target: Target) -> str:
    """Calibrations are per device kind: 'cpu', or the CUDA device name."""
    return "cpu" if target.platform == "cpu" else target.description


def lookup(target: Target) -> Overhead:
    entry = _user().get(kind_key(target)) or _shipped().get(kind_key(target)) or _shipped()[target.platform]
    per_process = int(entry.get("per_process_bytes", 0))
    in_pool = int(entry["in_pool_bytes"]) + per_process // max(len(target.devices), 1)
    return Overhead(in_pool, int(entry["out_of_pool_bytes"]), entry["source"], entry.get("measured_at"), per_process)


def save(target: Target, overhead: Overhead) -> Path:
    p = user_calibration_path()
    data = _user()
    data[kind_key(target)] = dataclasses.asdict(overhead)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=2) + "\n")
    return p
