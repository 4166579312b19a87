"""Shared test helpers: the golden reports (tests/fixtures/golden) as Report objects, for renderer
tests that need a real report but not a compile."""
from __future__ import annotations

import json
import pathlib

from jaxmem.report import Report

GOLDEN = pathlib.Path(__file__).resolve().parent / "fixtures" / "golden"


def golden_report(name: str = "mlp-data8-fsdp", version: str = "0.10.2") -> Report:
    """The golden report `name` written under jax `version` (the docs' reference leg by default)."""
    return Report.from_json(json.loads((GOLDEN / f"jax-{version}" / f"{name}.json").read_text()))
