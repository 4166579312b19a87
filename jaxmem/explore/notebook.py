"""jaxmem.explore() in Jupyter: the explorer's page inline, its server started on demand.

The server is `jaxmem explore ... --no-browser` in a child process, not a thread of the kernel: its
workers, compile children and scratch folder then live and stop exactly as the command's do (jaxmem.scratch),
and the kernel stays free. It stops with the interpreter (atexit: SIGTERM, the command's clean stop), and
with the kernel however that dies (PR_SET_PDEATHSIG on Linux: SIGTERM when the kernel is gone).

Its URL carries the server's token (jaxmem.explore.guard), and the child is told (JAXMEM_EXPLORE_EMBED=1) that
a notebook on this machine may frame its page: the one framing the server allows.
"""

from __future__ import annotations

import atexit
import ctypes
import html
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any

from jaxmem import session
from jaxmem.errors import UserError
from jaxmem.program.options import AnalyzeOptions, command_line

START_S = 300.0          # the server prints its URL once jax and the model's options are loaded
_RUNNING: list[Explorer] = []


class Explorer:
    """A running explorer: its page inline in a notebook (an IFrame), ``url``, and ``stop()``."""

    def __init__(self, proc: subprocess.Popen, url: str, command: list[str], height: int):
        self.proc, self.url, self.command, self.height = proc, url, command, height

    def _repr_html_(self) -> str:
        if self.proc.poll() is not None:
            return f"<p>jaxmem explore has stopped (exit code {self.proc.returncode}).</p>"
        src = html.escape(self.url, quote=True)
        return (f'<iframe src="{src}" width="100%" height="{self.height}" style="border:0" '
                f'title="jaxmem explore"></iframe><p style="font-size:12px">jaxmem explore: '
                f'<a href="{src}" target="_blank">{html.escape(self.url)}</a></p>')

    def __repr__(self) -> str:
        state = "running" if self.proc.poll() is None else f"stopped ({self.proc.returncode})"
        return f"<jaxmem explore {self.url} {state}>"

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server, its workers and their compiles (SIGTERM: the command's own clean stop)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self in _RUNNING:
            _RUNNING.remove(self)


def _stop_all() -> None:
    for ex in list(_RUNNING):
        ex.stop()


def _with_the_parent() -> None:   # in the child, before exec: SIGTERM when the kernel's thread is gone
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def start(model: str, opts: AnalyzeOptions, *, port: int = 0, jobs: int | None = None, executor: str = "local",
          ray_address: str | None = None, height: int = 900) -> Explorer:
    """`jaxmem explore MODEL <opts> --no-browser` in a child process; returns once it serves."""
    args = shlex.split(command_line(model, opts, "analyze"))[3:]   # the options, as analyze's flags
    cmd = [sys.executable, "-m", "jaxmem.cli", "explore", model, *args, "--no-browser", "--port", str(port),
           "--executor", executor]
    if jobs is not None:
        cmd += ["--jobs", str(jobs)]
    if ray_address is not None:
        cmd += ["--ray-address", ray_address]
    err = tempfile.TemporaryFile()  # noqa: SIM115 -- the child's stderr, read if it fails to start
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True,
                            env=session.child_environment(JAXMEM_EXPLORE_EMBED="1"), preexec_fn=_with_the_parent)
    box: dict[str, Any] = {}
    reader = threading.Thread(target=lambda: box.setdefault("line", proc.stdout.readline() if proc.stdout else ""),
                              daemon=True)
    reader.start()
    reader.join(START_S)
    line = box.get("line", "")
    if "http://" not in line:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        err.seek(0)
        said = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
        raise UserError(said[-1].removeprefix("error: ") if said else
                        f"jaxmem explore did not start within {START_S:g} s ({' '.join(map(shlex.quote, cmd))})")
    url = line.split("http://", 1)[1].split()[0]
    ex = Explorer(proc, f"http://{url}", cmd, height)
    if not _RUNNING:
        atexit.unregister(_stop_all)   # once
        atexit.register(_stop_all)
    _RUNNING.append(ex)
    return ex


def path_of(model: Any) -> str:
    """The model's path; a Workload or a function is refused (the page's workers load the model by its path)."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    raise UserError("explore needs the model's path (a model file or a config.json): its worker processes load "
                    "the model themselves, and a Workload made in this process cannot reach them. Put the "
                    "workload() in a file and give its path")
