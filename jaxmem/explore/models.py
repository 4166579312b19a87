"""The model picker: the models an explorer may switch to without a restart, and the switch.

Offered: the config.json files jaxmem ships (benchmarks/hf_configs, where the checkout has them), and the model
files (a .py defining workload()) and config.json files under the folder `jaxmem explore` started in (a bounded
walk). Any other path under that folder may be typed. A path outside it is refused (a 400): a request may make
jaxmem read no file the person who started it did not put within its reach.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jaxmem
from jaxmem.errors import UserError
from jaxmem.explore import controls as controls_mod
from jaxmem.explore import modelargs
from jaxmem.hf import config as hf_config

SHIPPED = Path(jaxmem.__file__).resolve().parent.parent / "benchmarks" / "hf_configs"
MAX_LISTED = 100          # models listed from the starting folder
MAX_SCANNED = 4000        # files looked at while listing them
MAX_DEPTH = 3             # folders below the starting one
MAX_READ = 256 << 10      # bytes of a file read to tell a model file or a config.json
SKIP_DIRS = {"node_modules", "__pycache__", "site-packages", "venv", "build", "dist"}


def shipped() -> list[Path]:
    return sorted(SHIPPED.glob("*.json")) if SHIPPED.is_dir() else []


def _is_model(path: Path) -> str | None:
    """"model file" or "config.json" where `path` is one (read at most MAX_READ bytes), else None."""
    try:
        if path.stat().st_size > MAX_READ:
            return None
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if path.suffix == ".py":
        return "model file" if "\ndef workload(" in "\n" + text else None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return "config.json" if isinstance(doc, dict) and isinstance(doc.get("model_type"), str) else None


def found(root: str) -> list[dict[str, str]]:
    """The model files and config.json files under `root`, breadth first, bounded."""
    out: list[dict[str, str]] = []
    scanned = 0
    level = [Path(root)]
    for _ in range(MAX_DEPTH + 1):
        nxt = []
        for folder in level:
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            for e in entries:
                if e.name.startswith(".") or e.is_symlink():
                    continue
                if e.is_dir():
                    if e.name not in SKIP_DIRS:
                        nxt.append(Path(e.path))
                    continue
                scanned += 1
                if scanned > MAX_SCANNED or len(out) >= MAX_LISTED:
                    return out
                if e.name.endswith((".py", ".json")):
                    kind = _is_model(Path(e.path))
                    if kind:
                        out.append({"path": os.path.relpath(e.path, root), "kind": kind})
        level = nxt
    return out


def listing(ex) -> dict[str, Any]:
    """/api/models: the current model, the shipped configs, the models under the starting folder."""
    return {"current": str(ex.model), "root": ex.root,
            "shipped": [{"path": _named(p, ex.root), "label": p.stem, "kind": "config.json"} for p in shipped()],
            "found": found(ex.root)}


def _named(path: Path, root: str) -> str:
    """A path as the explorer names it: relative to the starting folder where it lies under it."""
    real = os.path.realpath(path)
    return os.path.relpath(real, root) if os.path.commonpath([real, root]) == root else real


def resolve(text: str, root: str) -> str:
    """The model a request names, as the explorer will name it (relative to the starting folder where it lies
    under it); a UserError for a path outside it (a shipped config apart), or one that is no model."""
    if not text:
        raise UserError("model: give the path of a model file or a config.json, e.g. model=models/llama.py")
    given = Path(text).expanduser()
    real = os.path.realpath(given if given.is_absolute() else Path(root) / given)
    inside = os.path.commonpath([real, root]) == root
    if not inside and real not in {os.path.realpath(p) for p in shipped()}:
        raise UserError(f"model={text!r} is outside the folder jaxmem explore started in ({root}); the picker opens "
                        "models under it and the config.json files jaxmem ships. Start `jaxmem explore` in the "
                        "folder that holds the model")
    path = Path(real)
    if not path.exists():
        raise UserError(f"model={text!r}: no such file or folder")
    cfg = hf_config.config_file(path)
    if cfg is None and not (path.suffix == ".py" and _is_model(path)):
        raise UserError(f"model={text!r} is neither a model file (a .py defining workload()) nor a Hugging Face "
                        "config.json (or the folder holding one)")
    return _named(path, root)


def start_for(ex, model: str):
    """The starting point for `model`: the explorer's current start, keeping only the model arguments the new
    model takes (its own defaults for the rest)."""
    info = modelargs.of(model)
    names = {a["name"] for a in info["args"]}
    keep = tuple((k, v) for k, v in ex.start.model_args if info["open"] or k in names)
    return dataclasses.replace(ex.start, model_args=keep)


def switch(ex, text: str) -> dict[str, Any]:
    """Move the explorer `ex` to the model `text` names; its controls (as /api/controls)."""
    model = resolve(text, ex.root)
    start = start_for(ex, model)
    ex.use(model, start, controls_mod.seq_arg_of(model))
    ex.ask(ex.start)   # the new starting point compiles while the page redraws
    return controls_mod.controls(ex)
