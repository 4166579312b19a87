"""Shared test helpers: the model files most tests analyze, and the golden reports
(tests/fixtures/golden) as Report objects, for renderer tests that need a real report but no compile."""
from __future__ import annotations

import json
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
