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


# -- jax started before jaxmem was imported (a notebook that ran jax.devices() first) --------------

SWITCH = "JAX_SKIP_CUDA_CONSTRAINTS_CHECK"   # jaxmem/__init__.py sets it: deviceless CUDA needs it
_at_import = {"jax_started": False, "switch": True}


def note_jax_state() -> None:
    """Record, as jaxmem is imported, whether jax had already loaded its plugins and without the
    switch: jax loads them once, so its CUDA plugin then stays refused on a machine without a GPU."""
    import sys

    xb = sys.modules.get("jax._src.xla_bridge")  # never imports jax: only asks one already imported
    started = False
    if xb is not None:
        started = bool(getattr(xb, "_plugins_registered", False))
        is_init = getattr(xb, "backends_are_initialized", None)
        started = started or bool(is_init is not None and is_init())
    _at_import.update(jax_started=started, switch=bool(os.environ.get(SWITCH)))


def jax_started_without_switch() -> bool:
    return _at_import["jax_started"] and not _at_import["switch"]


def started_too_early(what: str) -> UserError:
    """The error when jax started before jaxmem could prepare it (`what`: what that broke)."""
    return UserError(
        f"{what}: jax's backend was initialised before jaxmem was imported (e.g. jax.devices() or a jnp array "
        f"ran first), without {SWITCH}=1, so jax's CUDA plugin, finding no usable GPU, refused to load "
        "(jax loads its plugins once per process). Restart the kernel (the Python process) and `import jaxmem` "
        f"before touching jax, or set {SWITCH}=1 (os.environ, or the shell) before jax starts.")


def too_few_cpu_devices(needed: int, have: int) -> UserError:
    """A CPU mesh larger than the CPU devices jax started with: XLA reads their number once, when jax's
    backend starts (in a notebook, often before the analysis that needs more)."""
    flag = f"--xla_force_host_platform_device_count={needed}"
    return UserError(
        f"the mesh needs {needed} CPU devices but jax has {have}: XLA fixes the number of CPU devices when jax's "
        f"backend starts, from XLA_FLAGS={flag}. Add it to XLA_FLAGS before anything touches jax (the jaxmem CLI "
        "does this itself); in a notebook, restart the kernel and set os.environ['XLA_FLAGS'] in the first cell.")
