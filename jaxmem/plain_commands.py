"""The commands' side that needs no jax (jaxmem.commands has the rest): the compile cache's info, clear and
trust, diff of two saved reports, the GPU table. `jaxmem cache`, `diff` and `gpus` answer without loading
jax, flax or the CUDA plugin (seconds on a loaded machine)."""

from jaxmem.compiler import cache
from jaxmem.present import diff as diff_view
from jaxmem.present import text

__all__ = ["cache", "diff_view", "text"]
