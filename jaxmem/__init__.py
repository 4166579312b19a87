"""jaxmem: per-device GPU memory of a Flax training step, from XLA itself.

From Python (a notebook, a script): ``jaxmem.analyze``, ``jaxmem.compare`` and ``jaxmem.advise``
(jaxmem/api.py, docs/api.md) take the CLI's options as keywords and return the objects the CLI
renders; errors are ``jaxmem.UserError``. Import jaxmem before anything touches jax's devices.
"""

import os
import sys
import types

from jaxmem import env as _env

# Before the switch below: whether jax already started without it (a notebook's jax.devices() first).
_env.note_jax_state()
# The CUDA plugin checks the driver at start-up and fails on machines without a GPU; deviceless
# compilation needs the plugin but not the driver (docs/how-it-works.md §1).
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

from jaxmem.api import advise, analyze, compare  # noqa: E402
from jaxmem.errors import UserError  # noqa: E402
from jaxmem.program.presets import choose_preset  # noqa: E402
from jaxmem.program.workload import REMAT_POLICIES, Workload, remat_policy  # noqa: E402
from jaxmem.report import Report  # noqa: E402

__version__ = "0.1.0"
__all__ = ["analyze", "compare", "advise", "Report", "UserError", "Workload", "remat_policy", "choose_preset",
           "REMAT_POLICIES", "__version__"]


class _Package(types.ModuleType):
    """`jaxmem.analyze` is the API's function, and jaxmem/analyze.py the pipeline's module. The
    import system binds a submodule on its package when it is first imported -- lazily, after
    this file ran (the CLI keeps jax out of `import jaxmem`) -- which would replace the function;
    this keeps it. The module stays importable: `from jaxmem.analyze import AnalyzeOptions`."""

    def __setattr__(self, name, value):
        if name == "analyze" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
