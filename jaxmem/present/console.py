"""The terminal console every renderer prints to (jax-free: `jaxmem diff`, `cache`, `gpus` load no jax)."""

from __future__ import annotations

import os

from rich.console import Console

PIPE_WIDTH = 1000         # stdout is a file or a pipe: no screen to fit, so no column is cut


def make_console() -> Console:
    """A terminal console; off a terminal (a pipe, a file, CI logs) one wide enough that nothing is cut.

    rich falls back to 80 columns when stdout is not a terminal, which cut instruction names
    (`gemm_fusion_d…`); COLUMNS, when set, still wins.
    """

    c = Console()
    if not c.is_terminal and not os.environ.get("COLUMNS"):
        c = Console(width=PIPE_WIDTH)
    return c
