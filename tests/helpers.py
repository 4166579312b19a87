"""Shared test helpers: the model files most tests analyze, and the golden reports
(tests/fixtures/golden) as Report objects, for renderer tests that need a real report but no compile."""
from __future__ import annotations

import json
import os
import pathlib

from jaxmem.report import Report

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
GOLDEN = FIXTURES / "golden"
MLP_SMALL = str(FIXTURES / "mlp_small.py")   # the small MLP the end-to-end tests analyze (fast to compile)
MLP_MODEL = str(ROOT / "models" / "mlp.py")   # the shipped MLP model file (presets tiny ... large)


def golden_report(name: str = "mlp-data8-fsdp", version: str = "0.10.2") -> Report:
    """The golden report `name` written under jax `version` (the docs' reference leg by default)."""
    return Report.from_json(json.loads((GOLDEN / f"jax-{version}" / f"{name}.json").read_text()))


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, their children ...), read from /proc."""
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out |= {int(d)} | descendants(int(d))
    return out
