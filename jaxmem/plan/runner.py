"""The one way a planner compiles: submit option sets, take their outcomes as they land.

Every planner -- `compare`'s grid, the fit searches, `advise`, the explorer's points and neighbours --
goes through a :class:`Runner`; none drives a worker pool (jaxmem.plan.sweep) or another planner's
private class. A runner has four verbs:

* ``submit(key, options, tag)`` queues one analysis (``tag``: the caller's own handle for it) and
  returns its :class:`Ticket`;
* ``next(timeout)`` is the next :class:`Landed` (ticket and Outcome) in the order they finish, or None
  when none finished within ``timeout`` (or nothing is queued);
* ``cancel(ticket)`` drops a job not started yet (True), or forgets one already running (its
  outcome is not returned; the compile finishes in its worker, whose next job then starts);
* ``close()`` ends the workers.

``progress()`` says how far it is: jobs done, jobs still queued or running, the median wall time of
a compile and so about how long the rest take on its workers. :class:`PoolRunner` runs on local
worker processes, in this process ("inline": a Workload defined in a notebook does not pickle) or on
Ray; the explorer offers the same interface over its own scheduler (jaxmem.explore.points), so its
advise and fit searches share its pool.

A planner is a strategy over a runner: :func:`drive` asks it what to compile next (``propose``), hands
it each outcome (``record``) and cancels what it says can no longer matter (``obsolete``), until it has
nothing left to ask; :func:`run_all` is the plain strategy (every job once, outcomes in order).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from jaxmem import scratch
from jaxmem.errors import UserError
from jaxmem.plan import sweep
from jaxmem.plan.sweep import Job, Outcome, default_jobs
from jaxmem.program import layouts

__all__ = ["Job", "Landed", "Outcome", "PoolRunner", "Progress", "Runner", "Strategy", "Ticket", "bar", "default_jobs",
           "drive", "open_runner", "prepare", "run_all", "run_here"]


@dataclasses.dataclass(frozen=True, eq=False)
class Ticket:
    """One submitted analysis: the caller's key and tag, the options compiled."""

    key: str
    options: Any
    tag: Any = None


@dataclasses.dataclass(frozen=True)
class Landed:
    ticket: Ticket
    outcome: Outcome


@dataclasses.dataclass(frozen=True)
class Progress:
    done: int          # outcomes returned so far
    left: int          # jobs queued or running
    typical_s: float | None   # the median wall time of a compile that did not come from the cache
    workers: int

    @property
    def eta_s(self) -> float | None:
        """About how long the jobs left take: the median compile, `left` of them over the workers."""
        if self.typical_s is None:
            return None
        return self.typical_s * -(-self.left // max(1, self.workers))


class Runner(Protocol):
    def submit(self, key: str, options, tag: Any = None) -> Ticket: ...

    def next(self, timeout: float | None = None) -> Landed | None: ...

    def cancel(self, ticket: Ticket) -> bool: ...

    def progress(self) -> Progress: ...

    def close(self) -> None: ...


class PoolRunner:
    """A Runner over one worker pool: local processes (`executor="local"`), this process ("inline") or Ray.

    Jobs wait in the runner's own queue and go to the pool one per free worker, so that a job not started
    can be cancelled. `bar`: a rich progress line on stderr (when it is a terminal) of what landed."""

    def __init__(self, model, n_jobs: int | None = None, executor: str = "local", ray_address: str | None = None,
                 *, bar: bool = False, what: str = "compiles", make_pool: Callable[..., Any] | None = None):
        self.model = model
        self.workers = 1 if executor == "inline" else max(1, n_jobs or default_jobs())
        self._make = (make_pool or sweep.make_pool, executor, ray_address)
        self._pool = None
        self._queue: deque[tuple[Job, Ticket]] = deque()
        self._running: dict[int, Ticket] = {}     # id(job) -> ticket
        self._forgotten: set[int] = set()         # cancelled while running: their outcomes are dropped
        self._durations: list[float] = []
        self._done = 0
        self._bar = sweep.Progress(0, bar, what) if bar else None

    def _started(self):
        if self._pool is None:
            make, executor, address = self._make
            self._pool = make(self.workers, executor, address)
        return self._pool

    def submit(self, key: str, options, tag: Any = None, *, model=None) -> Ticket:
        """`model`: another model than the runner's (the explorer's model picker switches without a restart)."""
        t = Ticket(key, options, tag)
        self._queue.append((Job(key, self.model if model is None else model, options), t))
        if self._bar is not None:
            self._bar.grow(1)
        self._feed()
        return t

    def _feed(self) -> None:
        pool = None
        while self._queue and len(self._running) < self.workers:
            pool = pool or self._started()
            job, t = self._queue.popleft()
            self._running[id(job)] = t
            pool.submit(job)
        if self._bar is not None:
            self._bar.update(running=", ".join(t.key for t in self._running.values()))

    def warm(self) -> None:
        """Start the workers now (a local pool's import jax meanwhile), before the first job is known."""
        warm = getattr(self._started(), "warm", None)
        if warm is not None:
            warm()

    def next(self, timeout: float | None = None) -> Landed | None:
        while self._running:
            if timeout is None:   # a planner's blocking wait: a Ctrl-C meanwhile names it
                with scratch.phase("waiting for the planner's worker processes"):
                    out = self._started().next()
            else:
                out = self._started().next(timeout=timeout)
            if out is None:
                return None
            t = self._running.pop(id(out.job), None)
            forgotten = id(out.job) in self._forgotten
            self._forgotten.discard(id(out.job))
            self._feed()
            if t is None or forgotten:
                continue
            if out.report is not None and not out.report.timings.get("cache_hit"):
                self._durations.append(out.seconds)
            self._done += 1
            if self._bar is not None:
                self._bar.update(advance=1)
            return Landed(t, out)
        return None

    def cancel(self, ticket: Ticket) -> bool:
        for item in self._queue:
            if item[1] is ticket:
                self._queue.remove(item)
                if self._bar is not None:
                    self._bar.grow(-1)
                return True
        for jid, t in self._running.items():
            if t is ticket:
                self._forgotten.add(jid)
                return False
        return False

    def progress(self) -> Progress:
        typical = statistics.median(self._durations) if self._durations else None
        left = len(self._queue) + len(self._running) - len(self._forgotten)
        return Progress(self._done, left, typical, self.workers)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def run_here(model, key: str, options) -> Outcome:
    """One analysis in this process, as a worker runs it (no worker to start: what a planner needs first)."""
    return sweep.run_one(Job(key, model, options))


def bar(total: int, enabled: bool = True, what: str = "rows"):
    """A rich progress line on stderr (silent when stderr is not a terminal, or not `enabled`): `update(advance=,
    running=)`, `grow(n)`, `close()`."""
    return sweep.Progress(total, enabled, what)


def prepare(options: Iterable) -> None:
    """What the CLI does before jax starts, for callers that did not: enough forced host devices for the
    largest mesh among `options` (a no-op when set already). A mesh that does not parse is its job's error."""
    sizes = []
    for o in options:
        try:
            sizes.append(layouts.mesh_size(o.mesh))
        except UserError:
            pass
    sweep.prepare_environment(max(sizes, default=1))


class Strategy(Protocol):
    """A planner, as :func:`drive` runs it."""

    def propose(self) -> list[tuple[str, Any, Any]]:
        """(key, options, tag) of the jobs to submit now ([]: none now)."""
        ...

    def record(self, tag: Any, outcome: Outcome) -> None: ...


def drive(runner: Runner, strategy: Strategy, *, on_landed: Callable[[Any, Outcome], None] | None = None) -> None:
    """Run `strategy` on `runner` until it proposes nothing and nothing it asked for is in flight. A strategy
    with an ``obsolete(tickets)`` method names the tickets (of those in flight) it no longer needs: they are
    cancelled. `on_landed(tag, outcome)` sees each outcome after the strategy recorded it."""
    inflight: list[Ticket] = []
    obsolete = getattr(strategy, "obsolete", None)
    while True:
        for key, opts, tag in strategy.propose():
            inflight.append(runner.submit(key, opts, tag))
        if not inflight:
            return
        got = runner.next()
        if got is None:
            raise RuntimeError("the runner lost track of a job")
        inflight.remove(got.ticket)
        strategy.record(got.ticket.tag, got.outcome)
        if on_landed is not None:
            on_landed(got.ticket.tag, got.outcome)
        if obsolete is not None:
            for t in obsolete(list(inflight)):
                runner.cancel(t)
                inflight.remove(t)


def run_all(runner: Runner, items: list[tuple[str, Any]],
            on_result: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
    """Every (key, options) once; their Outcomes in the order given. `on_result(i, outcome)` as each lands."""
    outs: dict[int, Outcome] = {}
    for i, (key, opts) in enumerate(items):
        runner.submit(key, opts, i)
    while len(outs) < len(items):
        got = runner.next()
        if got is None:
            raise RuntimeError("the runner lost track of a job")
        outs[got.ticket.tag] = got.outcome
        if on_result is not None:
            on_result(got.ticket.tag, got.outcome)
    return [outs[i] for i in range(len(items))]


def open_runner(model, n_jobs: int | None = None, executor: str = "local", ray_address: str | None = None,
                *, bar: bool = False, what: str = "compiles", count: int | None = None) -> PoolRunner:
    """The runner a planner opens for itself: in this process for one job at a time (no worker start-up:
    `n_jobs=1`, or `count=1` job in all) or for a model that cannot be sent to a worker (a Workload or
    function, not a path), else on `n_jobs` workers (all cores by default, no more than `count`)."""
    inline = executor == "local" and (n_jobs == 1 or count == 1 or not isinstance(model, str))
    n = n_jobs or default_jobs()
    if count is not None:
        n = max(1, min(n, count))
    return PoolRunner(model, n, "inline" if inline else executor, ray_address, bar=bar, what=what)
