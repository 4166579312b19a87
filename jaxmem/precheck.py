"""The first answer in seconds: a typo in the command line is reported before jax or the model loads.

Importing jax, flax and the CUDA plugin takes seconds (tens on a cold, loaded machine); a missing
model file, an unknown --gpu, mesh role or remat policy, or a mesh the target cannot hold needs
none of it. Each check here is the same rule the later stage applies (they share its data and
functions: the GPU catalogue, jaxmem.program.layouts, jaxmem.program.options), asked earlier, and
each names the closest valid spelling (difflib). A leaf: it imports nothing that imports jax
(tests/test_precheck.py checks that in a fresh process).
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from typing import Any

from jaxmem import files
from jaxmem.compiler.targets import host_count, resolve_gpu_name
from jaxmem.errors import UserError, did_you_mean
from jaxmem.program import layouts, sizes
from jaxmem.program.options import OPTIMIZER_NAMES, is_cpu_target

__all__ = ["did_you_mean", "gpu", "mesh", "model_file", "optimizer", "options", "step"]


def model_file(path: str | os.PathLike) -> None:
    """A model path that cannot be loaded: missing (with the closest sibling), not a regular file,
    or unreadable. A directory or a .json that exists is left to the loader (a config.json folder
    is a model too)."""
    text = os.fspath(path)
    if not text.strip():
        raise UserError("MODEL_FILE is empty; give the model file (a .py defining workload())")
    try:
        st = os.stat(text)
    except FileNotFoundError:
        if os.path.islink(text):   # not "did you mean" the very same name
            raise UserError(f"{text} is a symbolic link to {os.readlink(text)}, which does not exist; fix the link, "
                            "or give the model file itself") from None
        raise UserError(f"model file not found: {text}{_closest_sibling(text)}") from None
    except NotADirectoryError:
        raise UserError(f"model file not found: {text} (a part of the path is a file, not a folder)") from None
    except PermissionError as e:
        raise UserError(f"cannot read the model file {text}: {e.strerror}; check the folder's permissions") from None
    except OSError as e:   # a name too long, a loop of links: the file cannot be reached
        raise UserError(f"cannot read the model file {text}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        config = os.path.join(text, "config.json")
        kind = files.special_kind(config) if os.path.lexists(config) else None
        if kind is not None:   # the folder is fine; what it holds is not (a link to /dev/zero)
            raise UserError(f"the folder {text} holds config.json, which is not a regular file ({kind}); give a "
                            "folder whose config.json is the model's Hugging Face config")
        return
    if not stat.S_ISREG(st.st_mode):   # a FIFO would block the import; a device is no model
        kind = files.special_kind(text)
        raise UserError(f"{text} is not a regular file{f' ({kind})' if kind else ''}; give the model file (a .py "
                        "defining workload()).")
    try:
        with open(text, "rb") as f:
            f.read(1)
    except OSError as e:
        raise UserError(f"cannot read the model file {text}: {e.strerror or e}; check its permissions") from None


def _closest_sibling(text: str) -> str:
    """' (did you mean models/llama.py?)' from the model files beside the missing one."""
    folder, name = os.path.split(text)
    try:
        entries = os.listdir(folder or ".")
    except OSError:
        return "" if not folder else f" (no folder {folder})"
    candidates = [e for e in entries if e.endswith((".py", ".json")) or os.path.isdir(os.path.join(folder or ".", e))]
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean {os.path.join(folder, close[0])}?)" if close else ""


def gpu(name: str | None) -> None:
    """--gpu: a catalogue name or alias, local or cpu (None: decided once jax sees the devices)."""
    if name is not None:
        resolve_gpu_name(name)


def mesh(text: str, *, gpu_name: str | None = None, hosts: int | None = None, roles: str | None = None) -> None:
    """--mesh: every axis has a role (the closest one named), and the target takes its device count:
    jaxmem's limits, XLA_FLAGS' forced CPU devices under --gpu cpu, --hosts dividing it. (A batch the
    mesh cannot split is the workload's to tell: its leaves' shapes are known once it loads.)"""
    spec = layouts.parse_mesh(text, roles)
    n = spec.size
    on_cpu = is_cpu_target(gpu_name)
    sizes.check_mesh_devices(n, cpu=on_cpu)
    if on_cpu:
        forced = _forced_host_devices()
        if forced is not None and 0 < forced < n:
            raise UserError(f"the mesh needs {n} CPU devices but XLA_FLAGS forces {forced} "
                            f"(--xla_force_host_platform_device_count={forced}); make it {n}, or leave it out (the "
                            "jaxmem CLI asks for the mesh's devices itself)")
    elif hosts is not None and gpu_name is not None and gpu_name.strip().lower() != "local":
        if n % hosts:
            raise UserError(f"--hosts {hosts} does not divide the {n} devices of the mesh {text!r}; give a --hosts "
                            f"that divides {n}, or a mesh of a multiple of {hosts} devices")
        host_count(n, hosts, resolve_gpu_name(gpu_name))   # a cloud machine holds its GPUs, no more


def _forced_host_devices() -> int | None:
    """The CPU device count XLA_FLAGS forces (None when it forces none, or says it unreadably: the
    environment check reports that)."""
    m = re.findall(r"--xla_force_host_platform_device_count=(\d{1,9})\b", os.environ.get("XLA_FLAGS", ""))
    return int(m[-1]) if m else None


def optimizer(name: str | None) -> None:
    """--optimizer: one of optax's that jaxmem builds (jaxmem.program.state)."""
    if name is not None and name.lower() not in OPTIMIZER_NAMES:
        raise UserError(f"unknown optimizer {name!r}{did_you_mean(name, OPTIMIZER_NAMES)}. "
                        f"Known: {', '.join(OPTIMIZER_NAMES)}.")


def step(model: Any, values: dict[str, Any], *, grid: dict[str, Any] | None = None) -> None:
    """Every check above, on a command's options (click's values, or AnalyzeOptions' fields as a
    dict): called first by each CLI command that builds a step, and by the API. `model`: a path is
    checked; anything else (None, a Workload, a function) is the caller's. `grid`: compare's --meshes
    (or --pair's meshes) and --gpus text, which replace --mesh and --gpu (each of the grid's meshes is
    checked instead), and its --from: re-rendering saved rows builds no step, so nothing here applies (compare names any
    option given beside it)."""
    grid = grid or {}
    if grid.get("from"):
        return
    gpu_name = None if grid.get("gpu") else values.get("gpu")
    if isinstance(model, (str, os.PathLike)):
        model_file(model)
    gpu(gpu_name)
    optimizer(values.get("optimizer"))
    if grid.get("pair") and not grid.get("mesh"):   # --pair LAYOUT:MESH: the pairs' meshes are the grid's
        grid = {**grid, "mesh": ";".join(p.partition(":")[2] for p in grid["pair"].split(";") if p.strip())}
    meshes = (grid.get("mesh") or values.get("mesh") or "").split(";" if grid.get("mesh") else "\0")
    for text in filter(str.strip, meshes):
        mesh(text, gpu_name=gpu_name, hosts=values.get("hosts"), roles=values.get("axis_roles"))


def options(model: Any, opts: Any, *, grid: dict[str, Any] | None = None) -> None:
    """step() for the API: `opts` an AnalyzeOptions; `grid`: compare's axes, as their CLI text."""
    step(model, {"gpu": opts.gpu, "optimizer": opts.optimizer, "hosts": opts.hosts, "mesh": opts.mesh,
                        "axis_roles": getattr(opts, "axis_roles", None)}, grid=grid)
