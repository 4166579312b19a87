"""The explorer's state: the points asked for and compiled, compiled on compare's worker pool.

One scheduler thread owns the runner (jaxmem.plan.runner: long-lived local workers, or Ray tasks; it
is not shared between threads) and feeds it one job per free worker, from three queues in this order:
the points a client asked for (the newest first: the page's current point), the compiles advise and the
fit search ask for, and the current point's neighbours, compiled while nothing else waits (the next and
previous batch, the other remat policies, the sequence length halved and doubled, the neighbouring
meshes), so that the next move is usually exact already. Jobs wait in these queues, never in the pool's
own: a new request goes before every neighbour not yet started, and the neighbour queue is bounded and
replaced on each move.

A compiled point is held for the explorer's life: asking again answers from memory. Each worker's
analyze goes through the compile cache, so a point compiled by an earlier explorer (or `analyze`)
compiles no more (it is traced and looked up). An explorer also keeps each exact answer in the compile
cache's store (signed and verified like its entries, versions included: jaxmem.compiler.cache), keyed by the
point and the bytes of the model (its file and the Python files beside it, or its config.json): a later
explorer of the same model answers such a point at once, without a worker's trace.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from jaxmem.compiler import cache
from jaxmem.errors import UserError
from jaxmem.explore import predict, query
from jaxmem.plan import compare, meshes
from jaxmem.plan import runner as runner_mod
from jaxmem.program import layouts
from jaxmem.program.options import AnalyzeOptions, command_line
from jaxmem.report import Report, verdict_of

NEIGHBOURS = 8         # neighbour compiles queued at most (replaced on every move)
REMAT_NEIGHBOURS = ("none", "full", "dots_with_no_batch_dims_saveable")
WAIT_LIMIT_S = 3600.0  # a client's wait=exact gives up after this long (the compile goes on)
SEQ_GRANULE = 128      # the longest-sequence search's step: the lengths people train at (and attention tiles)
QUEUE_LIMIT = 32       # points asked for and waiting for a worker at most: one more is refused (HTTP 429)


class QueueFull(UserError):
    """A new point asked for while QUEUE_LIMIT points wait for a worker already."""


@dataclasses.dataclass
class Point:
    key: str
    opts: AnalyzeOptions
    query: dict[str, str]
    command: str
    status: str = "new"            # new | queued | compiling | exact | error
    report: Report | None = None
    error: str | None = None
    asked: bool = False            # a client asked for it (listed by /api/points)
    asked_at: float = 0.0
    started_at: float | None = None
    seconds: float | None = None   # the compile's wall time in its worker
    prediction: dict | None = None  # the first prediction answered for it, kept to say how far it was
    remembered: bool = False       # its exact answer is an earlier explorer's, from the cache's store

    def predicted_error(self) -> dict | None:
        if self.prediction is None or self.report is None:
            return None
        p, x = self.prediction["per_device_peak_bytes"], self.report.per_device_peak_bytes
        return {"peak_bytes": p, "error_bytes": x - p, "error_share": (x - p) / x if x else None}


class Explorer:
    """The points of one model, compiled on one pool; thread-safe (the HTTP server's threads call it)."""

    def __init__(self, model, start: AnalyzeOptions, *, jobs: int | None = None, executor: str = "local",
                 ray_address: str | None = None, seq_arg: str | None = None,
                 make_pool: Callable[..., Any] | None = None):
        self.model = model
        self.start = query.canonical(start)
        self.seq_arg = seq_arg
        self.root = os.path.realpath(os.getcwd())   # the folder it started in: the model picker's bound
        self.generation = 0                         # bumps on every model switch (use): older jobs are ignored
        self.jobs = max(1, jobs or max(1, runner_mod.default_jobs() - 1))   # a core left for the server and the page
        self._runner = runner_mod.PoolRunner(model, self.jobs, executor, ray_address, make_pool=make_pool)
        self._lock = threading.Condition()
        self.points: dict[str, Point] = {}
        self._asked: list[str] = []
        self._urgent: collections.deque[str] = collections.deque()
        self._side: collections.deque[tuple[str, AnalyzeOptions, dict]] = collections.deque()   # (label, opts, box)
        self._idle: collections.deque[str] = collections.deque()
        self._inflight: dict[runner_mod.Ticket, tuple[str, Any, int]] = {}  # ("point", key | "side", box, generation)
        self._durations: list[float] = []
        self._model_digest = model_digest(model)
        self._stopping = False
        self.crashed: str | None = None   # why the scheduler stopped on its own (_run), None while it runs
        self._thread = threading.Thread(target=self._run, name="jaxmem-explore-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ asking
    def point(self, opts: AnalyzeOptions) -> Point:
        """The point of `opts` (made on first use; not queued)."""
        opts = query.canonical(opts)
        with self._lock:
            model, gen = self.model, self.generation
        k = query.key(str(model), opts)
        with self._lock:
            p = self.points.get(k)
        if p is not None:
            return p
        known = self._remembered(k)   # read outside the lock: a file of the cache
        with self._lock:
            if gen != self.generation:   # the model changed meanwhile: the point is the new model's
                return self.point(opts)
            p = self.points.get(k)
            if p is None:
                p = Point(k, opts, query.to_query(opts), command_line(str(model), opts, "analyze"))
                if known is not None:
                    p.status, p.report, p.remembered = "exact", known, True
                self.points[k] = p
            return p

    def _store_key(self, k: str) -> str | None:
        if self._model_digest is None:
            return None
        return "explore-" + hashlib.sha256(f"{self._model_digest}\n{k}".encode()).hexdigest()

    def _remembered(self, k: str) -> Report | None:
        """An earlier explorer's exact answer for the point `k` of this same model (None: none kept)."""
        sk = self._store_key(k)
        return None if sk is None else cache.load(sk, parse=Report.from_json)

    def _remember(self, p: Point) -> None:
        sk = self._store_key(p.key)
        if sk is not None and p.report is not None:
            cache.store(sk, p.report.to_json())

    def ask(self, opts: AnalyzeOptions) -> Point:
        """A client's move to `opts`: its compile goes first, its neighbours' after everything else. QueueFull
        when it would be compiled and QUEUE_LIMIT points wait already (checked before the point is made: a
        refused request leaves nothing behind)."""
        k = query.key(str(self.model), query.canonical(opts))
        with self._lock:
            known = self.points.get(k)
            if (known is None or known.status in ("new", "queued")) and k not in self._urgent \
                    and len(self._urgent) >= QUEUE_LIMIT:
                raise QueueFull(f"{QUEUE_LIMIT} points already wait for a worker; ask again once some are answered")
        p = self.point(opts)
        with self._lock:
            if not p.asked:
                p.asked, p.asked_at = True, time.monotonic()
                self._asked.append(p.key)
            if p.status in ("new", "queued"):
                if p.key in self._urgent:
                    self._urgent.remove(p.key)
                if p.key in self._idle:
                    self._idle.remove(p.key)
                self._urgent.appendleft(p.key)
                p.status = "queued"
            self._queue_neighbours(p)
            self._lock.notify_all()
        return p

    def wait(self, p: Point, timeout: float = WAIT_LIMIT_S) -> Point:
        """Block until `p` is exact or an error (or `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while p.status not in ("exact", "error") and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(min(left, 1.0))
        return p

    def predict(self, p: Point) -> dict | None:
        """A prediction of `p` from the compiled points (kept on the point the first time, to say later how
        far it was from the exact compile)."""
        with self._lock:
            if p.prediction is not None:
                return p.prediction
            known = [predict.Known(q.opts, q.report, q.query) for q in self.points.values()
                     if q.status == "exact" and q.report is not None]
        try:
            pred = predict.predict(p.opts, known, self.seq_arg)
        except UserError:   # a neighbour's memory settings jaxmem cannot judge again (saved_rows): no prediction
            pred = None
        with self._lock:
            if pred is not None and p.prediction is None and p.status != "exact":
                p.prediction = pred
            return p.prediction if p.prediction is not None else pred

    def progress(self, p: Point) -> dict:
        """How long the point has waited, and about how long it has left (the median compile so far)."""
        with self._lock:
            now = time.monotonic()
            typical = statistics.median(self._durations) if self._durations else None
            elapsed = now - (p.started_at if p.started_at is not None else p.asked_at or now)
            ahead = list(self._urgent).index(p.key) if p.key in self._urgent else 0
            eta = None
            if typical is not None:
                running = max(0.0, typical - elapsed) if p.status == "compiling" else typical
                eta = running + ahead * typical / self.jobs
            return {"status": p.status, "elapsed_s": round(elapsed, 2), "eta_s": None if eta is None else round(eta, 1),
                    "queued_before": ahead}

    def asked(self) -> list[Point]:
        with self._lock:
            return [self.points[k] for k in self._asked]

    def exact(self) -> list[Point]:
        with self._lock:
            return [p for p in self.points.values() if p.status == "exact"]

    def runner(self, generation: int | None = None) -> runner_mod.Runner:
        """A planner's runner on this pool (jaxmem.plan.runner's interface: advise's plans, the fit search's
        probes): its jobs go before any neighbour. With `generation`: a UserError once the model has changed."""
        return _SideRunner(self, self.generation if generation is None else generation)

    @property
    def advise_runner(self) -> runner_mod.Runner:
        """advise's runner on this pool (the name the server passes it by)."""
        return self.runner()

    def run_jobs(self, items: list[tuple[str, AnalyzeOptions]],
                 generation: int | None = None) -> list[runner_mod.Outcome]:
        """Compile `items` on the pool before any neighbour; their Outcomes in order. Blocks."""
        return runner_mod.run_all(self.runner(generation), items)

    # ------------------------------------------------------------------ neighbours
    def _queue_neighbours(self, p: Point) -> None:
        """The idle queue: `p`'s neighbours not compiled yet (the previous move's are dropped)."""
        fresh = []
        for opts in neighbours(p.opts, self._known_batch(p), self._known_seq(p), self.seq_arg):
            q = self.point(opts)
            if q.status == "new" and q.key not in fresh:
                fresh.append(q.key)
        for k in self._idle:
            if self.points[k].status == "queued":
                self.points[k].status = "new"
        self._idle = collections.deque(fresh[:NEIGHBOURS])
        for k in self._idle:
            self.points[k].status = "queued"

    def _known_batch(self, p: Point) -> int | None:
        if p.opts.batch is not None:
            return p.opts.batch
        for q in self.points.values():   # the model's own batch, once any point with it compiled
            if q.report is not None and q.opts.batch is None:
                b = q.report.options.get("batch")
                return b if isinstance(b, int) else None
        return None

    def _known_seq(self, p: Point) -> int | None:
        if not self.seq_arg:
            return None
        v = dict(p.opts.model_args).get(self.seq_arg)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        for q in self.points.values():
            if q.report is not None and self.seq_arg not in dict(q.opts.model_args):
                return q.report.sequence_length
        return None

    # ------------------------------------------------------------------ the scheduler thread
    def _next_job(self) -> tuple[str, AnalyzeOptions, tuple[str, Any]] | None:
        """The next job to start (lock held): a client's point, then a side job, then a neighbour -- only
        while no point a client asked for compiles, and leaving one worker free when there are two or more,
        so that a move starts at once on a warm worker instead of waiting for a neighbour's compile (its
        exact answer then comes no later than `analyze` alone would give it)."""
        nxt = self._pop(self._urgent)
        if nxt is None and self._side:
            label, opts, box = self._side.popleft()
            return label, opts, ("side", box)
        if nxt is not None:
            return nxt
        points = [self.points[k] for kind, k, gen in self._inflight.values()
                  if kind == "point" and gen == self.generation and k in self.points]
        if any(p.asked for p in points):
            return None   # idle means idle: a neighbour would slow the compile a client waits for (a core each)
        neighbours = len(points)
        return self._pop(self._idle) if self.jobs == 1 or neighbours < self.jobs - 1 else None

    def _pop(self, q: collections.deque[str]) -> tuple[str, AnalyzeOptions, tuple[str, Any]] | None:
        while q:
            p = self.points[q.popleft()]
            if p.status == "queued":
                p.status, p.started_at = "compiling", time.monotonic()
                return p.key, p.opts, ("point", p.key)
        return None

    def _run(self) -> None:
        """The scheduler. Should it fail (a pool that raises), every point not yet answered becomes an error
        naming why, and every waiter wakes: a dead scheduler never leaves a request waiting on it."""
        try:
            self._schedule()
        except Exception as e:  # noqa: BLE001 -- reported on every unanswered point, never a silent hang
            self._crash(f"the explorer's scheduler stopped: {type(e).__name__}: {e}")

    def _crash(self, why: str) -> None:
        with self._lock:
            self.crashed, self._stopping = why, True
            for p in self.points.values():
                if p.status not in ("exact", "error"):
                    p.status, p.error = "error", why
            self._lock.notify_all()

    def _schedule(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and len(self._inflight) < self.jobs:
                    nxt = self._next_job()
                    if nxt is None:
                        break
                    label, opts, (kind, what) = nxt
                    t = self._runner.submit(label, opts, model=self.model)
                    self._inflight[t] = (kind, what, self.generation)
                if self._stopping:
                    return
                if not self._inflight:
                    self._lock.wait(0.5)
                    continue
            got = self._runner.next(timeout=0.2)   # outside the lock: requests go on while a compile runs
            if got is not None:
                self._record(got.ticket, got.outcome)

    def _record(self, ticket: runner_mod.Ticket, out: runner_mod.Outcome) -> None:
        with self._lock:
            owner = self._inflight.pop(ticket, None)
            if owner is None:
                return
            kind, what, gen = owner
            if kind == "side":
                what["out"] = out
                what["landed"].append(what)
            elif gen != self.generation:
                pass   # a point of the model before a switch: its worker is free again, its answer unwanted
            else:
                p = self.points[what]
                p.seconds = out.seconds
                if out.report is not None:
                    p.status, p.report = "exact", out.report
                    self._remember(p)
                    if not out.report.timings.get("cache_hit"):
                        self._durations.append(out.seconds)
                else:
                    p.status, p.error = "error", out.error or "the compile failed"
                if p.status == "exact" and p.asked and p.key == (self._asked[-1] if self._asked else None):
                    self._queue_neighbours(p)   # now that its batch and sequence are known
            self._lock.notify_all()

    def use(self, model, start: AnalyzeOptions, seq_arg: str | None) -> None:
        """Explore `model` from `start` from now on, on the same workers (the model picker: no restart). The
        points asked so far are dropped (they were the other model's); a compile of the old model still running
        finishes on its worker and is ignored; advise's and the fit search's compiles still waiting fail."""
        digest = model_digest(model)
        with self._lock:
            self.generation += 1
            self.model, self.start, self.seq_arg, self._model_digest = model, query.canonical(start), seq_arg, digest
            self.points, self._asked, self._durations = {}, [], []
            self._urgent.clear()
            self._idle.clear()
            for label, opts, box in self._side:
                box["out"] = runner_mod.Outcome(runner_mod.Job(label, self.model, opts), None,
                                                "the explorer moved to another model", "failed")
                box["landed"].append(box)
            self._side.clear()
            self._lock.notify_all()

    def close(self) -> None:
        """Stop the scheduler and the pool: its workers and their compile children end with it."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._thread.join(timeout=5)
        self._runner.close()

    # ------------------------------------------------------------------ answers
    def answer(self, p: Point) -> dict:
        """/api/answer's object for `p` as it stands."""
        out: dict[str, Any] = {"key": p.key, "command": p.command, "query": p.query}
        if p.status == "exact" and p.report is not None:
            rep = p.report.to_json()
            out.update(answer="exact", report=rep, tokens_per_s=predict.tokens_per_s(rep),
                       prediction=p.prediction, predicted_error=p.predicted_error(), remembered=p.remembered)
            return out
        if p.status == "error":
            out.update(answer="error", report=None, error=p.error)
            return out
        pred = self.predict(p)
        if pred is not None:
            out.update(answer="predicted", report=pred, tokens_per_s=predict.tokens_per_s(pred))
        else:
            out.update(answer="compiling", report=None, tokens_per_s=None)
        out["progress"] = self.progress(p)
        return out

    def summary(self, p: Point) -> dict:
        """One row of /api/points."""
        rep: dict | None = None
        answer = p.status if p.status in ("exact", "error") else "compiling"
        if p.report is not None:
            rep = {"per_device_peak_bytes": p.report.per_device_peak_bytes, "verdict": verdict_of(p.report),
                   "step_time": dict(p.report.step_time), "options": p.report.options,
                   "sequence_length": p.report.sequence_length, "target": dataclasses.asdict(p.report.target),
                   "tokens_per_step": getattr(p.report, "tokens_per_step", None)}
        elif p.prediction is not None and p.status != "error":
            rep, answer = p.prediction, "predicted"
        step = (rep or {}).get("step_time") or {}
        return {"key": p.key, "query": p.query, "answer": answer, "command": p.command,
                "peak": None if rep is None else rep["per_device_peak_bytes"],
                "verdict": None if rep is None else rep["verdict"],
                "step_time": step.get("estimate_s") if step.get("available") else None,
                "tokens_per_s": None if rep is None else predict.tokens_per_s(rep),
                "predicted_error": p.predicted_error(), "error": p.error}

    def fit(self, p: Point) -> dict:
        """The fit search's largest batch at `p`'s other options (compare --find-batch's search, its
        probes compiled on this pool)."""
        return self._search(compare.Find("batch"), dataclasses.replace(p.opts, batch=None), "max_batch")

    def fit_seq(self, p: Point) -> dict:
        """The longest sequence that fits at `p`'s other options, its batch included (compare --find-seq's
        search over the model's sequence argument, in steps of SEQ_GRANULE and of the chunked loss's tiles)."""
        if not self.seq_arg:
            raise UserError(f"{self.model} takes no sequence-length argument: there is no sequence to search")
        args = dict(p.opts.model_args)
        tiles = args.get("vocab_tiles")
        granule = math.lcm(SEQ_GRANULE, tiles if isinstance(tiles, int) and not isinstance(tiles, bool)
                           and tiles > 0 else 1)
        opts = dataclasses.replace(p.opts, model_args=tuple(sorted((k, v) for k, v in args.items()
                                                                  if k != self.seq_arg)))
        out = self._search(compare.Find("seq", arg=self.seq_arg, granule=granule), opts, "max_seq")
        out["arg"] = self.seq_arg
        return out

    def _search(self, find: compare.Find, opts: AnalyzeOptions, answer: str) -> dict:
        """One fit search (compare's, as a row of its own), its probes compiled on this pool."""
        strategy = compare.RowSearches([compare.RowSearch(0, {}, opts, find)])   # one row's search
        runner_mod.drive(self.runner(), strategy)
        cell = strategy.cells[0]
        assert cell is not None   # (drive ran until the row was done)
        if cell.search is None:
            return {answer: None, "error": cell.error, "search": None}
        return {answer: cell.search.answer, "capped": cell.search.capped, "margin": cell.search.margin,
                "search": cell.search.to_json(), "error": None}


class _SideRunner:
    """jaxmem.plan.runner's interface over an Explorer's side queue (Explorer.runner()), for one model."""

    def __init__(self, ex: Explorer, generation: int):
        self.ex, self.generation = ex, generation
        self._landed: collections.deque[dict] = collections.deque()
        self._boxes: list[dict] = []
        self._done = 0

    def submit(self, key: str, options, tag: Any = None) -> runner_mod.Ticket:
        t = runner_mod.Ticket(key, options, tag)
        box: dict = {"ticket": t, "landed": self._landed}
        with self.ex._lock:
            if self.generation != self.ex.generation:
                raise UserError("the explorer moved to another model; ask again")
            self.ex._side.append((key, options, box))
            self._boxes.append(box)
            self.ex._lock.notify_all()
        return t

    def next(self, timeout: float | None = None) -> runner_mod.Landed | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.ex._lock:
            while not self._landed:
                if not self._boxes:
                    return None
                if self.ex._stopping:
                    raise RuntimeError(self.ex.crashed or "the explorer stopped")
                left = 1.0 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    return None
                self.ex._lock.wait(min(left, 1.0))
            box = self._landed.popleft()
            self._boxes.remove(box)
            self._done += 1
            return runner_mod.Landed(box["ticket"], box["out"])

    def cancel(self, ticket: runner_mod.Ticket) -> bool:
        """A job not started leaves the queue (True); a running one's outcome is dropped when it lands."""
        with self.ex._lock:
            box = next((b for b in self._boxes if b["ticket"] is ticket), None)
            if box is None:
                return False
            self._boxes.remove(box)
            for item in self.ex._side:
                if item[2] is box:
                    self.ex._side.remove(item)
                    return True
            box["landed"] = collections.deque()
            return False

    def progress(self) -> runner_mod.Progress:
        with self.ex._lock:
            typical = statistics.median(self.ex._durations) if self.ex._durations else None
            return runner_mod.Progress(self._done, len(self._boxes) - len(self._landed), typical, self.ex.jobs)

    def close(self) -> None:
        for box in list(self._boxes):
            self.cancel(box["ticket"])


# The most Python files beside a model file that its identity reads (a folder of a thousand scripts is no
# model's own package: the answers are then not kept)
MAX_SIBLINGS = 200


def model_digest(model) -> str | None:
    """What an exact answer of `model` depends on beyond its options, as a digest: the bytes of the model
    file and of the Python files beside it (what it may import), or of a config.json. (The versions of jaxmem
    and the stack are the store's own business: an entry written under others is a miss, cache.load.) None
    where that cannot be read: no answers are kept."""
    path = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    if path is None:
        return None
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            h.update(f.read())
        if path.endswith(".py"):
            folder = os.path.dirname(os.path.abspath(path))
            siblings = sorted(n for n in os.listdir(folder) if n.endswith(".py"))
            if len(siblings) > MAX_SIBLINGS:
                return None
            for name in siblings:
                with open(os.path.join(folder, name), "rb") as f:
                    h.update(name.encode() + b"\0" + f.read())
    except OSError:
        return None
    return h.hexdigest()


def neighbours(opts: AnalyzeOptions, batch: int | None, seq: int | None, seq_arg: str | None) -> list[AnalyzeOptions]:
    """The points one move away, the likeliest next moves first: the batch doubled and halved (the page's
    batch steps; they also bracket most batch moves, which the predictions then interpolate), the other
    remat policies, the sequence halved and doubled, the mesh with twice and half the data-parallel
    devices, then the next and previous batch (a step of the data-parallel size x accumulation)."""
    out: list[AnalyzeOptions] = []
    try:
        spec = layouts.parse_mesh(opts.mesh, opts.axis_roles)
    except Exception:  # noqa: BLE001 -- a mesh this point refuses has no neighbours; its own answer says why
        return out
    g = max(1, spec.data_size * opts.accum)
    if batch is not None:
        out += [dataclasses.replace(opts, batch=b) for b in (2 * batch, batch // 2) if b >= g and b % g == 0]
    out += [dataclasses.replace(opts, remat=r) for r in REMAT_NEIGHBOURS if r != opts.remat]
    if seq_arg and seq:
        args = dict(opts.model_args)
        for s in (seq * 2, seq // 2):
            if s >= 1 and s != seq:
                out.append(dataclasses.replace(opts, model_args=tuple(sorted({**args, seq_arg: s}.items()))))
    d = spec.data_size
    for m in (meshes.scale_data(opts.mesh, 2, opts.axis_roles),
              meshes.with_data_size(opts.mesh, d // 2, opts.axis_roles) if d % 2 == 0 and d > 1 else None):
        if m and (batch is None or batch % max(1, layouts.parse_mesh(m, opts.axis_roles).data_size) == 0):
            out.append(dataclasses.replace(opts, mesh=m))
    if batch is not None:
        out += [dataclasses.replace(opts, batch=b) for b in (batch + g, batch - g) if b >= g]
    return out
