"""jaxmem: per-device GPU memory of a Flax training step, from XLA itself.

From Python (a notebook, a script): ``jaxmem.analyze``, ``jaxmem.compare``, ``jaxmem.advise`` and ``jaxmem.explore``
(jaxmem/api.py, docs/api.md) take the CLI's options as keywords and return the objects the CLI
renders; errors are ``jaxmem.UserError``. Import jaxmem before anything touches jax's devices.
"""

import os

from jaxmem import env as _env

# Before the switch below: whether jax already started without it (a notebook's jax.devices() first).
_env.note_jax_state()
# The CUDA plugin checks the driver at start-up and fails on machines without a GPU; deviceless
# compilation needs the plugin but not the driver (docs/how-it-works.md §1).
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

from jaxmem._lazy import __getattr__ as __getattr__  # noqa: E402  (Advice, Rows, AnalyzeOptions: loaded on first use)
from jaxmem.api import advise, analyze, compare, explore  # noqa: E402
from jaxmem.errors import UserError  # noqa: E402
from jaxmem.program.presets import choose_preset  # noqa: E402
from jaxmem.program.workload import REMAT_POLICIES, Workload, remat_policy  # noqa: E402
from jaxmem.report import Report, ReportWarning  # noqa: E402

__version__ = "0.1.0"
__all__ = ["REMAT_POLICIES", "Advice", "AnalyzeOptions", "Report", "ReportWarning", "Rows", "UserError", "Workload",
           "__version__", "advise", "analyze", "choose_preset", "compare", "equinox_workload", "explore",
           "remat_policy"]
