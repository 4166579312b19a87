"""jaxmem: per-device GPU memory of a Flax training step, from XLA itself."""

import os

# The CUDA plugin checks the driver at start-up and fails on machines without a
# GPU; deviceless compilation needs the plugin but not the driver (docs/how-it-works.md §1).
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

from jaxmem.program.presets import choose_preset  # noqa: E402
from jaxmem.program.workload import REMAT_POLICIES, Workload, remat_policy  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Workload", "remat_policy", "choose_preset", "REMAT_POLICIES", "__version__"]
