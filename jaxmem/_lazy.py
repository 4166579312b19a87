"""The names `jaxmem` exports whose modules import jax (what advise and compare return, and the
options they take), loaded on first use so that `import jaxmem` stays jax-free and fast (PEP 562)."""

from __future__ import annotations

import importlib

LAZY = {"Advice": "jaxmem.plan.advise", "Rows": "jaxmem.plan.compare", "AnalyzeOptions": "jaxmem.program.options",
        "equinox_workload": "jaxmem.program.equinox"}


def __getattr__(name: str):
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'jaxmem' has no attribute {name!r}")
