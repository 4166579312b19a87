"""Many analyses at once: worker processes on this machine, or a Ray cluster.

A :class:`Job` is one ``analyze`` (a model file and its options); each finishes as an
:class:`Outcome` -- a Report, or an error row. Nothing one job does can lose the others:

* a user error (a layout the mesh cannot hold, a batch that does not divide) is ``user_error``;
* anything else raised while compiling (an XLA error) is ``failed``, with its first line;
* a worker that dies (killed by the kernel for memory, a segfault in XLA) is ``failed`` with
  how it died, and a fresh worker takes its place for the remaining jobs.

Local workers are long-lived processes (jax is imported once per worker, not once per job) fed
one job at a time, so the parent always knows which job a dead worker held. They inherit the
parent's environment: set up (``jaxmem.session.prepare``, which ``run_jobs`` calls too) before
the first job, as the CLI and the API do before jax starts.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

from jaxmem import env as env_mod
from jaxmem import scratch, session
from jaxmem.errors import UserError
from jaxmem.pipeline import analyze_model
from jaxmem.plan import ray_start
from jaxmem.program import layouts
from jaxmem.stop import helper as stop_helper

if TYPE_CHECKING:  # imported lazily at run time: no jax in this module
    from jaxmem.program.options import AnalyzeOptions
    from jaxmem.report import Report

STATUSES = ("ok", "user_error", "failed")


@dataclasses.dataclass(frozen=True)
class Job:
    key: str            # the caller's name for it (a row, a probe)
    path: str           # the model file; or (executor "inline" only: it does not pickle) a Workload or a
                        # function returning one, as the Python API takes them
    options: AnalyzeOptions


@dataclasses.dataclass(frozen=True)
class Outcome:
    job: Job
    report: Report | None
    error: str | None
    status: str          # one of STATUSES
    seconds: float = 0.0  # wall time of the job in its worker


def default_jobs() -> int:
    """All cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def prepare_environment(max_devices: int) -> None:
    """The environment every worker needs before jax starts (workers inherit it): the deviceless
    CUDA switch, and enough forced host devices for the largest CPU mesh (jaxmem.session)."""
    session.prepare(cpu_devices=max(1, max_devices))


def run_one(job: Job) -> Outcome:
    """One job, in this process (what a worker does)."""

    t0 = time.perf_counter()
    try:
        # no compile child started ahead: every core is busy with a job, and a cache hit needs none
        report = analyze_model(job.path, job.options, prestart=False)
        return Outcome(job, report, None, "ok", time.perf_counter() - t0)
    except UserError as e:
        return Outcome(job, None, str(e), "user_error", time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 -- an XLA error is this row's failure, not the sweep's
        first = (str(e).strip().splitlines() or [""])[0][:500]
        return Outcome(job, None, f"{type(e).__name__}: {first}", "failed", time.perf_counter() - t0)


def _worker_main(read_fd: int, write_fd: int) -> None:
    """A worker: jobs in on one pipe, Outcomes out on the other, until told to stop."""

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    jobs, results = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    while True:
        try:
            job = jobs.recv()
        except EOFError:
            return
        if job is None:
            return
        results.send(run_one(job))
        _forget()


def _forget() -> None:
    """A worker lives for many jobs: drop jax's caches of the last one (each job traces new
    functions; their compiled and traced forms would otherwise accumulate)."""

    if "jax" in sys.modules:
        sys.modules["jax"].clear_caches()


def _death(exitcode: int | None, stderr_tail: str) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (the kernel's OOM killer?)" if -exitcode == signal.SIGKILL else ""
        msg = f"the worker process died: killed by {name}{hint}"
    else:
        msg = f"the worker process died (exit code {exitcode})"
    return f"{msg}; its last words: {stderr_tail}" if stderr_tail else msg


# First of all, the worker dies with its parent, however the parent dies (SIGKILL included):
# PR_SET_PDEATHSIG on Linux, then a check that the parent did not die before that took effect.
# The job pipe's EOF would end an idle worker too, but not one in the middle of a compile.
_WORKER = ("import sys\n"
           "from jaxmem.plan.sweep import _die_with_parent, _worker_main\n"
           "_die_with_parent(int(sys.argv[3]))\n"
           "_worker_main(int(sys.argv[1]), int(sys.argv[2]))")


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:   # the parent is already gone
        os._exit(0)


class _Worker:
    """One worker process (a fresh `python -c`): a fresh interpreter, so no caller's
    __main__ is re-imported; pickled jobs and Outcomes travel over two pipes (the worker's stdout
    stays the model code's); its stderr goes to a file, quoted when it dies."""

    def __init__(self):
        job_r, job_w = os.pipe()
        res_r, res_w = os.pipe()
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 -- the worker's stderr, closed in close()
        env = session.child_environment()   # the jaxmem this process runs, first on its path
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(job_r), str(res_w), str(os.getpid())],
                                     pass_fds=(job_r, res_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self.log, start_new_session=True, env=env)
        os.close(job_r)
        os.close(res_w)
        self.jobs = Connection(job_w, readable=False)
        self.results = Connection(res_r, writable=False)

    def stderr_tail(self) -> str:
        self.log.seek(0)
        lines = [ln for ln in self.log.read().decode(errors="replace").splitlines() if ln.strip()]
        return " | ".join(lines[-3:])[-600:]

    def close(self, *, kill: bool = False) -> None:
        if not kill:
            try:
                self.jobs.send(None)
            except OSError:
                kill = True
        if kill and self.proc.poll() is None:
            _kill_group(self.proc)
        try:
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 -- not gone in 10 s (TimeoutExpired), or any other failure: killed
            _kill_group(self.proc)
            self.proc.wait()
        for c in (self.jobs, self.results):
            c.close()
        self.log.close()


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the worker's process group (its own session): its compile child goes at the same moment,
    not a moment after through PR_SET_PDEATHSIG -- nothing outlives a stopped explorer or sweep."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (AttributeError, OSError):   # not POSIX, or the group is gone already
        proc.kill()


class LocalPool:
    """Worker processes that take one job at a time; a dead worker's job becomes a failed Outcome."""

    def __init__(self, n_workers: int):
        self._n = max(1, n_workers)
        self._idle: list[_Worker] = []
        self._busy: dict = {}        # results connection -> (worker, job, t0)
        self._queue: deque[Job] = deque()
        self._done: deque[Outcome] = deque()

    def submit(self, job: Job) -> None:
        self._queue.append(job)
        self._dispatch()

    def warm(self) -> None:
        """Start every worker now, idle (each imports jax meanwhile), so the first jobs find them ready."""
        while len(self._idle) + len(self._busy) < self._n:
            self._idle.append(_Worker())

    def running(self) -> list[Job]:
        return [job for _, job, _ in self._busy.values()]

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._busy) + len(self._done)

    def _dispatch(self) -> None:
        while self._queue and (self._idle or len(self._busy) < self._n):
            w = self._idle.pop() if self._idle else _Worker()
            job = self._queue.popleft()
            try:
                w.jobs.send(job)
            except OSError:  # died while idle: start another
                w.close(kill=True)
                self._queue.appendleft(job)
                continue
            self._busy[w.results] = (w, job, time.perf_counter())

    def next(self, timeout: float | None = None) -> Outcome | None:
        """The next finished job (blocking up to `timeout`; None if none finished by then)."""
        if self._done:
            return self._done.popleft()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._busy:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(list(self._busy), timeout=left)
            if not ready:
                return None
            for conn in ready:
                w, job, t0 = self._busy.pop(conn)
                try:
                    out = w.results.recv()  # (conn itself)
                except (EOFError, OSError):  # the worker died holding this job
                    out = None
                if out is not None:
                    self._idle.append(w)
                    out = dataclasses.replace(out, job=job)  # the caller's own Job object
                else:
                    try:
                        code = w.proc.wait(timeout=10)
                    except Exception:  # noqa: BLE001 -- no exit status to report: the death is still reported
                        code = None
                    out = Outcome(job, None, _death(code, w.stderr_tail()), "failed", time.perf_counter() - t0)
                    w.close(kill=True)
                self._done.append(out)
            self._dispatch()
            if self._done:
                return self._done.popleft()
        return None

    def close(self) -> None:
        for w in self._idle:
            w.close()
        for w, _, _ in self._busy.values():
            w.close(kill=True)
        self._idle, self._busy = [], {}


class InlinePool:
    """The same interface, each job run in this process when its Outcome is asked for: for a model
    that cannot be sent to a worker (a Workload defined in a notebook), and for one job at a time
    without a worker's start-up (the Python API's jobs=1)."""

    def __init__(self):
        self._queue: deque[Job] = deque()

    def submit(self, job: Job) -> None:
        self._queue.append(job)

    def running(self) -> list[Job]:
        return []

    @property
    def pending(self) -> int:
        return len(self._queue)

    def next(self, timeout: float | None = None) -> Outcome | None:
        return run_one(self._queue.popleft()) if self._queue else None

    def close(self) -> None:
        self._queue.clear()


def _ray_run(job: Job) -> Outcome:  # runs on a Ray worker
    try:
        return run_one(job)
    finally:
        _forget()


def _bounded(fn, seconds: float, what: str) -> None:
    """fn() (ray.init on an address) in a thread, given up after `seconds`: ray.init retries a
    cluster that does not answer for minutes. Its errors are the user's (the cluster they named)."""

    box: dict = {}

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - carried to the caller
            box["error"] = e

    t = threading.Thread(target=run, daemon=True, name="ray-init")
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise UserError(f"{what}: the Ray cluster did not accept the connection within {seconds:g} s; check that it "
                        "runs the same Ray version (`ray status` on the head), or fix the address.")
    e = box.get("error")
    if isinstance(e, (ConnectionError, TimeoutError, RuntimeError, ValueError)):
        raise UserError(f"{what}: cannot connect to the Ray cluster ({type(e).__name__}: "
                        f"{(str(e).strip().splitlines() or [''])[0][:300]})") from None
    if e is not None:
        raise e


class RayPool:
    """The same interface over Ray tasks: on an existing cluster (`address`, or RAY_ADDRESS),
    else on a local Ray started for the sweep with `n_workers` CPUs. Each task is one job; a
    worker that dies is the job's failed Outcome (Ray does not retry it: max_retries=0)."""

    def __init__(self, n_workers: int | None, address: str | None, env: dict[str, str]):
        # quiet: Ray's C++ client would print a line a second around jaxmem's one message while it
        # retries a cluster that does not answer (read when ray is imported)
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
        try:
            import ray  # noqa: PLC0415 - optional: pip install 'jaxmem[ray]'
        except ImportError:
            raise UserError("--executor ray needs Ray: pip install 'jaxmem[ray]'") from None
        self._ray = ray
        option = "--ray-address" if address else "RAY_ADDRESS"
        address = address or os.environ.get("RAY_ADDRESS") or None
        runtime_env = {"env_vars": env}
        self._owns = not ray.is_initialized()
        self._temp_dir: str | None = None
        if self._owns:
            if address:
                env_mod.check_ray_address(address, option)   # malformed or unreachable: minutes in ray.init
                _bounded(lambda: ray.init(address=address, runtime_env=runtime_env, log_to_driver=False,
                                          logging_level=logging.ERROR),
                         env_mod.RAY_INIT_S, f"{option} {address!r}")
            else:   # its sockets under a short folder of its own, whatever TMPDIR is
                self._temp_dir = ray_start.init_local(ray, n_workers or default_jobs(), runtime_env)
        # one CPU per task: a compile is single-threaded enough, and the cluster's CPUs bound the parallelism
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_ray_run)
        self._refs: dict = {}
        self._done: deque[Outcome] = deque()

    def submit(self, job: Job) -> None:
        self._refs[self._remote.remote(job)] = (job, time.perf_counter())

    def running(self) -> list[Job]:
        return [job for job, _ in self._refs.values()]

    @property
    def pending(self) -> int:
        return len(self._refs) + len(self._done)

    def next(self, timeout: float | None = None) -> Outcome | None:
        if self._done:
            return self._done.popleft()
        if not self._refs:
            return None
        ready, _ = self._ray.wait(list(self._refs), num_returns=1, timeout=timeout)
        if not ready:
            return None
        ref = ready[0]
        job, t0 = self._refs.pop(ref)
        try:
            return dataclasses.replace(self._ray.get(ref), job=job)
        except Exception as e:  # noqa: BLE001 -- WorkerCrashedError, RayTaskError, ...
            first = (str(e).strip().splitlines() or [""])[0][:300]
            return Outcome(job, None, f"the Ray worker failed: {type(e).__name__}: {first}", "failed",
                           time.perf_counter() - t0)

    def close(self) -> None:
        for ref in self._refs:
            self._ray.cancel(ref, force=True)
        self._refs = {}
        if self._owns:
            # Ray's shutdown of the cluster it started waits on its workers (C++, seconds): the stop helper is told,
            # so that an interrupt's grace covers it rather than ending jaxmem with SIGKILL halfway through
            stop_helper.tell(b"cleanup")
            self._ray.shutdown()
            ray_start.remove(self._temp_dir)


def _worker_env() -> dict[str, str]:
    keep = ("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "XLA_FLAGS", "JAXMEM_CACHE", "XDG_CACHE_HOME",
            "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE",
            "XLA_PYTHON_CLIENT_ALLOCATOR", "JAXMEM_CALIBRATION", "XDG_CONFIG_HOME",
            "NCCL_NVLS_ENABLE")  # the runtime model reads the calibration file and NVLS's switch
    return {k: os.environ[k] for k in keep if k in os.environ}


def make_pool(n_jobs: int | None = None, executor: str = "local", ray_address: str | None = None):
    if executor == "local":
        return LocalPool(n_jobs or default_jobs())
    if executor == "ray":
        return RayPool(n_jobs, ray_address, _worker_env())
    if executor == "inline":
        return InlinePool()
    raise UserError(f"--executor {executor!r}: expected local or ray")


def _label(job: Job) -> str:
    return job.key


class Progress:
    """A rich progress bar on stderr: rows done / total, the row running now, elapsed, ETA.
    Silent when stderr is not a terminal (logs stay clean) or when disabled."""

    def __init__(self, total: int, enabled: bool = True, what: str = "rows"):
        self._p = None
        if enabled and sys.stderr.isatty():
            self._p = RichProgress(TextColumn(f"{what}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                   TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.description}"),
                                   console=Console(stderr=True), transient=True)
            self._task = self._p.add_task("", total=total)
            self._p.start()

    def update(self, *, advance: int = 0, running: str | None = None) -> None:
        if self._p is not None:
            self._p.update(self._task, advance=advance, description=running)  # None: the description stays

    def grow(self, n: int) -> None:
        """`n` more jobs in the total (fewer when negative: cancelled before they started)."""
        if self._p is not None:
            task = self._p.tasks[0]
            self._p.update(self._task, total=max(task.completed, (task.total or 0) + n))

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()


def run_jobs(jobs: Iterable[Job], *, n_jobs: int | None = None, executor: str = "local",
             ray_address: str | None = None, progress: bool = True,
             on_result: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run every job; Outcomes in the order of `jobs`. `on_result` sees each as it finishes."""
    jobs = list(jobs)
    if not jobs:
        return []

    # what the CLI does before jax starts, for callers that did not (a no-op when already set)
    sizes = []
    for j in jobs:
        try:
            sizes.append(layouts.mesh_size(j.options.mesh))
        except UserError:
            pass  # that job's own error row
    prepare_environment(max(sizes, default=1))
    n = min(n_jobs or default_jobs(), len(jobs))
    pool = make_pool(n, executor, ray_address)
    bar = Progress(len(jobs), progress)
    results: dict[int, Outcome] = {}
    positions: dict[int, deque[int]] = {}
    for i, j in enumerate(jobs):
        positions.setdefault(id(j), deque()).append(i)

    try:
        for j in jobs:
            pool.submit(j)
        bar.update(running=", ".join(_label(j) for j in pool.running()))
        while len(results) < len(jobs):
            with scratch.phase("waiting for the sweep's worker processes"):
                out = pool.next()
            if out is None:
                raise RuntimeError("the pool lost track of a job")
            results[positions[id(out.job)].popleft()] = out
            bar.update(advance=1, running=", ".join(_label(j) for j in pool.running()))
            if on_result is not None:
                on_result(out)
    finally:
        bar.close()
        pool.close()
    return [results[i] for i in range(len(jobs))]

