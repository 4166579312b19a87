"""The memory settings JAX's GPU client reads from the environment, checked before jax starts.

jaxlib 0.10.2 parses them when its CUDA plugin initializes
(``jaxlib.xla_client.generate_pjrt_gpu_plugin_options``): a bad value there is a
Python traceback from inside jax, and a fraction like 5 or -1 is taken as given.
jaxmem reads the same variables to say how much of a card is usable, so it checks
them first and names the variable (docs/how-it-works.md "Memory settings").
"""

from __future__ import annotations

import math
import os

from jaxmem.errors import UserError

FRACTIONS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
ALLOCATORS = ("default", "platform", "bfc", "cuda_async", "vmm")   # what jaxlib 0.10.2 accepts
INTEGERS = ("XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB", "XLA_PYTHON_CLIENT_ABORT_COLLECTIVES_ON_FAILURE",
            "XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT")


def fraction(name: str, text: str) -> float:
    """A memory fraction from the environment: a finite number in (0, 1]."""
    try:
        x = float(text)
    except ValueError:
        raise UserError(f"{name}={text!r} is not a number; set it to the share of the card JAX may use, in (0, 1] "
                        f"(e.g. {name}=0.9), or unset it (JAX's default: 0.75).") from None
    if not math.isfinite(x) or not 0 < x <= 1:
        raise UserError(f"{name}={text}: the share of the card JAX may use must be in (0, 1] (e.g. {name}=0.9); "
                        "unset it for JAX's default of 0.75.")
    return x


def check(environ=None) -> None:
    """Raise a UserError naming the first variable jax would reject or misread."""
    env = os.environ if environ is None else environ
    given = [n for n in FRACTIONS if env.get(n)]
    if len(given) == 2:
        raise UserError("both XLA_CLIENT_MEM_FRACTION and XLA_PYTHON_CLIENT_MEM_FRACTION are set; jax refuses both: "
                        "unset XLA_PYTHON_CLIENT_MEM_FRACTION (the deprecated name).")
    for n in given:
        fraction(n, env[n])
    alloc = env.get("XLA_PYTHON_CLIENT_ALLOCATOR")
    if alloc is not None and alloc.lower() not in ALLOCATORS:
        raise UserError(f"XLA_PYTHON_CLIENT_ALLOCATOR={alloc!r}: jax accepts {', '.join(ALLOCATORS)}.")
    for n in INTEGERS:
        if env.get(n):
            try:
                int(env[n])
            except ValueError:
                raise UserError(f"{n}={env[n]!r} is not an integer, which jax requires.") from None
