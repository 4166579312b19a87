"""The environment first, then jax: what every jaxmem entry does before jax loads.

jax reads its environment once: the deviceless CUDA switch when it registers its plugins, the
forced CPU devices (``XLA_FLAGS``) and the GPU preallocation when its backends start. So every
entry -- the CLI's commands (jaxmem.cli, through jaxmem.exits.run), the API's calls (jaxmem.api)
and the processes they start (their workers inherit the environment set here) -- goes through
this module first: :func:`scope` checks the variables jax would refuse (jaxmem.env) and holds
the run's scratch directory and signals (jaxmem.scratch); :func:`prepare` sets what jax reads;
:func:`child_environment` is what a child process (a sweep's worker, the compile child) starts with.
Then the caller loads the jax side (jaxmem.commands) in one import; below it, modules import at
their tops. This module, like everything it imports, never imports jax.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from jaxmem import env
from jaxmem.compiler import targets


def prepare(*, cpu_devices: int = 0, measuring: bool = False) -> None:
    """Set what jax reads when it starts: the deviceless CUDA switch (its plugin then loads on a
    machine without a GPU), `cpu_devices` forced CPU devices for a CPU mesh (only when asked: 10,000
    of them alone took a minute to start), and, where a child process measures the GPU
    (`measuring`: verify, calibrate), no preallocation in this one. Effective only before jax's
    backends start; a no-op for what the user already set."""
    os.environ.setdefault(env.SWITCH, "1")
    if measuring:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if cpu_devices:
        targets.ensure_host_devices(cpu_devices)


def child_environment(**extra: str) -> dict[str, str]:
    """The environment a jaxmem child process starts with: this process's (as :func:`prepare` left it),
    the deviceless switch unless the user set it, and this jaxmem first on PYTHONPATH -- `python -c`
    puts the working directory on sys.path, and a folder there named jaxmem (a clone's folder, seen
    from its parent) would shadow the package -- then `extra`."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    return {env.SWITCH: "1", **os.environ, "PYTHONPATH": path, **extra}


@contextlib.contextmanager
def scope(*, end_stuck: bool = True) -> Iterator[None]:
    """One run: the variables jax would reject checked (a UserError naming the first), then the
    run's scratch directory and signal handling (jaxmem.scratch.run_scope) around the body."""
    # scratch's machinery (logging, tempfile, subprocess: 20 ms) loads with a run, not with `jaxmem --help`
    from jaxmem import scratch  # noqa: PLC0415

    env.check()
    with scratch.run_scope(end_stuck=end_stuck):
        yield
