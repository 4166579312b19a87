"""`jaxmem explore`'s HTTP server: the page and its JSON API, on 127.0.0.1 only.

The standard library's ThreadingHTTPServer rather than a web framework: a loopback server of a few GET
routes returning JSON needs no routing, templating or ASGI stack, and jaxmem gains no dependency for it
(the page is static files, shipped in the package: no CDN, it works offline). One thread per request,
so a client waiting for an exact answer (wait=exact) or advise's search blocks nobody else; the compiles
run in the explorer's worker pool (jaxmem.explore.points), never in a request's thread.

Routes (docs/explore.md; the page and scripts both use them):
  GET /                        the page            GET /static/NAME   its script and style (page/ only)
  GET /api/answer?<options>    the point's answer: exact, predicted, compiling or error (&wait=exact blocks)
  GET /api/controls            the controls and the values this model and card accept; the starting point
  GET /api/points              the points asked for so far, oldest first
  GET /api/advise?<options>    advise's ranked changes at that point (&wait=1 blocks)
  GET /api/fit?<options>       the fit search's largest batch at that point (&wait=1 blocks)
  GET /api/fit_seq?<options>   the longest sequence that fits at that point (&wait=1 blocks)
  GET /api/models              the models the picker offers;  GET /api/model?path=P  switch to one
  GET /api/save?<options>&format=json|html|png   the exact point's report as a download
A value the CLI refuses is a 400 with the CLI's message, before any prediction or compile (the point is
admitted first: jaxmem.analysis.run.admit, analyze's own checks); an unknown parameter a 400 naming it.

Who may ask is jaxmem.explore.guard's: the server's own Host, no other site's page, the token of the printed URL
(403 otherwise). Every response is JSON but the page and its files: 405 (with Allow) for a method not GET, 414
for an overlong URL, 431 for overlong headers, 429 when the compile queue or the background searches are full,
503 when every handler is busy. Handlers are a bounded pool of threads over a deep listen backlog; a client
that sends nothing for TIMEOUT_S (or takes HEADERS_S over its request) is dropped.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import http.client
import http.server
import json
import mimetypes
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxmem.analysis import run as run_mod
from jaxmem.errors import UserError
from jaxmem.explore import controls as controls_mod
from jaxmem.explore import guard as guard_mod
from jaxmem.explore import models as models_mod
from jaxmem.explore import query
from jaxmem.explore.points import Explorer, Point, QueueFull
from jaxmem.plan import advise as advise_mod
from jaxmem.present import html
from jaxmem.program.options import AnalyzeOptions

PAGE = Path(__file__).parent / "page"
HOST = "127.0.0.1"
_STATIC_NAME = re.compile(r"^[A-Za-z0-9_-]+\.(js|css|svg|png|ico|html)$")
MAX_FIELDS = 100        # query parameters a request may carry (analyze has about 30 options)
SAVE_FORMATS = ("json", "html", "png")
MAX_URL = 8192          # bytes of a request's target (414 beyond); the page's longest query is about 1 KiB
MAX_HEADER_BYTES = 32768  # bytes of a request's header lines together (431 beyond)
BACKLOG = 1024          # connections the kernel holds while every handler is busy
HANDLERS = 128          # requests served at once (threads); a connection beyond waits in the backlog
HANDLER_WAIT_S = 10.0   # ... for this long, then a 503
WAITERS = 32            # requests blocked on a compile at once (wait=exact, wait=1): 429 beyond
BACKGROUND = 4          # advise and fit searches running at once: 429 beyond
TIMEOUT_S = 20.0        # a client silent this long is dropped (the socket's timeout)
HEADERS_S = 30.0        # a request's line and headers take at most this long to arrive
ADMITTED = 4096         # points admitted remembered (their checks are not run again)
WORKLOADS = 64          # workloads admission keeps loaded (one per set of model arguments)
ALLOW = "GET"


class _Reply(Exception):
    """A response decided early (a 4xx)."""

    def __init__(self, status: int, body: dict):
        super().__init__(body.get("error", ""))
        self.status, self.body = status, body


class App:
    """The routes over one Explorer."""

    def __init__(self, explorer: Explorer, admit: Callable[..., None] = run_mod.admit):
        self.explorer = explorer
        self._admit = admit
        self._admitted: collections.OrderedDict[str, str | None] = collections.OrderedDict()   # key -> refusal
        self._workloads: dict = {}   # the model's workloads loaded by admission, by their arguments
        self._admit_lock = threading.Lock()    # the model's workload() runs one at a time
        self._waiters = threading.BoundedSemaphore(WAITERS)
        self._jobs: dict[tuple[str, str], dict] = {}   # (kind, key) -> {"thread", "result" | "error"}
        self._jobs_lock = threading.Lock()
        self._partial: dict[tuple[str, str], dict] = {}   # (kind, key) -> the latest snapshot of a search running

    # ------------------------------------------------------------ helpers
    def _opts(self, params: dict[str, list[str]]):
        """The point a request names, admitted: a 400 with the CLI's message for anything analyze refuses."""
        try:
            opts = query.parse(params, self.explorer.start, str(self.explorer.model))
        except UserError as e:
            raise _Reply(400, {"error": str(e)}) from None
        k = query.key(str(self.explorer.model), opts)
        with self._admit_lock:
            if k not in self._admitted:
                if len(self._workloads) > WORKLOADS:
                    self._workloads.clear()
                try:
                    self._admit(self.explorer.model, opts, self._workloads)
                    self._admitted[k] = None
                except UserError as e:
                    self._admitted[k] = str(e)
                while len(self._admitted) > ADMITTED:
                    self._admitted.popitem(last=False)
            refusal = self._admitted[k]
        if refusal is not None:
            raise _Reply(400, {"error": refusal, "key": k})
        return opts

    def _ask(self, opts: AnalyzeOptions) -> Point:
        try:
            return self.explorer.ask(opts)
        except QueueFull as e:
            raise _Reply(429, {"error": str(e)}) from None

    @contextlib.contextmanager
    def _waiting(self, wait: bool):
        """A request that blocks on a compile holds a handler: WAITERS of them at once, a 429 beyond."""
        if not wait:
            yield
            return
        if not self._waiters.acquire(blocking=False):
            raise _Reply(429, {"error": f"{WAITERS} requests already wait for compiles; ask again without wait, "
                                        "or later"})
        try:
            yield
        finally:
            self._waiters.release()

    @staticmethod
    def _flag(params: dict[str, list[str]], name: str) -> str | None:
        v = params.get(name)
        return None if not v else v[-1]

    # ------------------------------------------------------------ routes
    def answer(self, params: dict[str, list[str]]) -> dict:
        wait = self._flag(params, "wait")
        if wait not in (None, "", "exact"):
            raise _Reply(400, {"error": f"wait={wait!r}: give wait=exact (block until the exact answer), or leave "
                                        "it out"})
        p = self._ask(self._opts(params))
        with self._waiting(wait == "exact"):
            if wait == "exact":
                self.explorer.wait(p)
        return self.explorer.answer(p)

    def points(self, params: dict[str, list[str]]) -> list:
        self._no_params(params, "points")
        return [self.explorer.summary(p) for p in self.explorer.asked()]

    def controls(self, params: dict[str, list[str]]) -> dict:
        self._no_params(params, "controls")
        return controls_mod.controls(self.explorer)

    @staticmethod
    def _no_params(params: dict[str, list[str]], route: str) -> None:
        extra = [k for k in params if k not in query.CONTROL]
        if extra:
            raise _Reply(400, {"error": f"/api/{route} takes no parameters; got {', '.join(map(repr, extra))}"})

    def _background(self, kind: str, p: Point, work, wait: bool) -> dict:
        """`work(p)` once per point in a thread of its own; its result when done (or waited for)."""
        with self._jobs_lock:
            job = self._jobs.get((kind, p.key))
            if job is None:
                running = sum(1 for j in self._jobs.values() if "result" not in j and "error" not in j)
                if running >= BACKGROUND:
                    raise _Reply(429, {"error": f"{BACKGROUND} advise and fit searches already run; ask again when "
                                                "one is done"})
                job = {}

                def run():
                    try:
                        job["result"] = work(p)
                    except UserError as e:
                        job["error"] = str(e)
                    except Exception as e:  # noqa: BLE001 -- this request's failure, not the server's
                        job["error"] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"

                job["thread"] = threading.Thread(target=run, name=f"jaxmem-explore-{kind}", daemon=True)
                self._jobs[(kind, p.key)] = job
                job["thread"].start()
        if wait:
            with self._waiting(True):
                job["thread"].join()
        out: dict[str, Any] = {"key": p.key, "command": p.command}
        if "error" in job:
            return {**out, "status": "error", "error": job["error"]}
        if "result" in job:
            return {**out, "status": "done", kind: job["result"]}
        part = self._partial.get((kind, p.key))   # advise's snapshot: ranked rows, predicted or exact, and progress
        return {**out, "status": "running", **({kind: part} if part is not None else {})}

    def advise(self, params: dict[str, list[str]]) -> dict:
        p = self.explorer.point(self._opts(params))
        return self._background("advice", p, self._advise, self._flag(params, "wait") not in (None, "", "0"))

    def _advise(self, p: Point) -> dict:
        ex = self.explorer
        ex.ask(p.opts)   # a full queue (QueueFull) is this search's error
        ex.wait(p)
        base = dataclasses.replace(p.opts, explain=False)
        result = advise_mod.advise(str(ex.model), base, always=True, progress=False, runner=ex.runner(),
                                   original_report=p.report,
                                   on_update=lambda a: self._partial.__setitem__(("advice", p.key), a.to_json()))
        return result.to_json()

    def fit(self, params: dict[str, list[str]]) -> dict:
        p = self.explorer.point(self._opts(params))
        return self._background("fit", p, self.explorer.fit, self._flag(params, "wait") not in (None, "", "0"))

    # the longest sequence that fits, and the model picker (jaxmem.explore.models)
    def fit_seq(self, params: dict[str, list[str]]) -> dict:
        p = self.explorer.point(self._opts(params))
        return self._background("fit_seq", p, self.explorer.fit_seq, self._flag(params, "wait") not in (None, "", "0"))

    def models(self, params: dict[str, list[str]]) -> dict:
        self._no_params(params, "models")
        return models_mod.listing(self.explorer)

    def model(self, params: dict[str, list[str]]) -> dict:
        try:
            out = models_mod.switch(self.explorer, self._flag(params, "path") or "")
        except UserError as e:
            raise _Reply(400, {"error": str(e)}) from None
        with self._jobs_lock:
            self._jobs.clear()   # searches and refusals remembered by point: the other model's
        getattr(self, "_admitted", {}).clear()
        return out

    def save(self, params: dict[str, list[str]]) -> tuple[bytes, str, str]:
        fmt = self._flag(params, "format") or "json"
        if fmt not in SAVE_FORMATS:
            raise _Reply(400, {"error": f"format={fmt!r}: give one of {', '.join(SAVE_FORMATS)}"})
        ex = self.explorer
        p = self._ask(self._opts(params))
        with self._waiting(True):
            ex.wait(p)
        if p.report is None:
            raise _Reply(409, {"error": p.error or "the point has no exact answer yet", "key": p.key})
        digest = hashlib.sha256(p.key.encode()).hexdigest()[:8]   # the point's, the same in every run
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"jaxmem-{p.report.model}-{digest}")
        if fmt == "json":   # byte for byte what `jaxmem analyze --json` prints
            return (json.dumps(p.report.to_json(), indent=2) + "\n").encode(), "application/json", f"{stem}.json"
        if fmt == "html":
            return html.render_html(p.report).encode(), "text/html; charset=utf-8", f"{stem}.html"
        from jaxmem.present import png  # noqa: PLC0415 - matplotlib loads only when a picture is drawn

        folder = tempfile.mkdtemp(prefix="save-")   # in the run's scratch folder (jaxmem.scratch)
        try:
            path = png.write_png(p.report, os.path.join(folder, "bar.png"))
            return Path(path).read_bytes(), "image/png", f"{stem}.png"
        finally:
            shutil.rmtree(folder, ignore_errors=True)


Response = tuple[int, bytes, str, dict[str, str]]   # status, body, Content-Type, more headers
ROUTES = ("answer", "controls", "points", "advise", "fit", "fit_seq", "models", "model")


def _json(status: int, body: Any) -> Response:
    return status, (json.dumps(body) + "\n").encode(), "application/json", {}


def _page_file(name: str) -> Response:
    """One of the page's own files, by a plain name: no path is ever built from the request."""
    files = {p.name: p for p in PAGE.iterdir()} if PAGE.is_dir() else {}
    if not _STATIC_NAME.match(name) or name not in files:
        return _json(404, {"error": f"no static file {name!r}"})
    try:
        data = files[name].read_bytes()
    except OSError:
        return _json(404, {"error": f"the page's {name} cannot be read from the package"})
    ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if ctype.startswith("text/") or ctype.endswith("javascript"):
        ctype += "; charset=utf-8"
    return 200, data, ctype, {}


def respond(app: App, target: str, guard: guard_mod.Guard | None = None, headers: Any = None) -> Response:
    """The response to GET `target` (a request's path and query string), its `headers` checked by `guard`
    (None: no check, for callers in this process)."""
    url = urllib.parse.urlsplit(target)
    try:
        params = urllib.parse.parse_qs(url.query, keep_blank_values=True, strict_parsing=False,
                                       max_num_fields=MAX_FIELDS, errors="strict")
    except (ValueError, UnicodeDecodeError) as e:
        return _json(400, {"error": f"the query string cannot be read: {e}"})
    path = url.path
    if guard is not None:
        refusal = guard.refusal(path, headers if headers is not None else {}, params)
        if refusal is not None:
            return _json(403, {"error": refusal})
    token_given = "token" in params
    params.pop("token", None)
    try:
        if path in ("/", "/index.html"):
            status, data, ctype, more = _page_file("index.html")
            if status == 200 and guard is not None:
                data = guard.page(data)
                if token_given:   # the printed URL: later loads of the page may leave the token out
                    more = {**more, "Set-Cookie": guard.set_cookie()}
            return status, data, ctype, more
        if path.startswith("/static/"):
            return _page_file(path[len("/static/"):])
        if path == "/api/save":
            data, ctype, name = app.save(params)
            return 200, data, ctype, {"Content-Disposition": f'attachment; filename="{name}"'}
        if path.startswith("/api/") and path[5:] in ROUTES:
            return _json(200, getattr(app, path[5:])(params))
        return _json(404, {"error": f"no route {path!r}; the API is /api/answer, /api/controls, /api/points, "
                                     "/api/advise, /api/fit, /api/save"})
    except _Reply as r:
        return _json(r.status, r.body)
    except Exception as e:  # noqa: BLE001 -- a bug answers this request with 500; the server keeps serving
        if os.environ.get("JAXMEM_DEBUG"):
            traceback.print_exc()
        return _json(500, {"error": f"jaxmem bug: {type(e).__name__}: {e}"})


class _Limited:
    """A request's reader: its header lines together at most MAX_HEADER_BYTES (beyond: http.client's
    LineTooLong, which http.server answers 431), the whole request within HEADERS_S (a client that trickles
    its headers holds a handler no longer). The body is never read (GET only)."""

    def __init__(self, raw):
        self.raw, self.used, self.lines, self.since = raw, 0, 0, time.monotonic()

    def start(self) -> None:
        self.used, self.lines = 0, 0

    def readline(self, limit: int = -1) -> bytes:
        if self.lines and time.monotonic() - self.since > HEADERS_S:
            raise TimeoutError("the request's headers took too long")
        line = self.raw.readline(limit)
        self.lines += 1
        if self.lines == 1:
            self.since = time.monotonic()   # from its first line (an idle keep-alive waits on the socket's timeout)
        else:
            self.used += len(line)
            if self.used > MAX_HEADER_BYTES:
                raise http.client.LineTooLong(f"header lines of more than {MAX_HEADER_BYTES} bytes")
        return line

    def __getattr__(self, name):
        return getattr(self.raw, name)


def _handler(app: App, guard: guard_mod.Guard):
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "jaxmem-explore"
        protocol_version = "HTTP/1.1"
        timeout = TIMEOUT_S   # the socket's: a silent client is dropped (StreamRequestHandler sets it)

        def setup(self):
            super().setup()
            self.limited = _Limited(self.rfile)
            self.rfile = self.limited   # type: ignore[assignment]  # (read by readline only: a stand-in)

        def handle_one_request(self):
            self.limited.start()
            super().handle_one_request()

        def log_message(self, format, *args):  # noqa: A002 -- the base class's name
            pass   # the terminal is the user's: requests are not news

        def parse_request(self):
            if not super().parse_request():
                return False
            if len(self.path) > MAX_URL:
                self.send_error(414, f"the request's URL is {len(self.path)} bytes; the API's are under {MAX_URL}")
                return False
            if self.headers.get("Content-Length", "0").strip() not in ("", "0") or "Transfer-Encoding" in self.headers:
                self.close_connection = True   # a body is never read: the connection cannot carry another request
            return True

        def do_GET(self):   # (http.server's name)
            self._send(*respond(app, self.path, guard, self.headers))

        def __getattr__(self, name: str):
            if name.startswith("do_"):   # every other method (HEAD, OPTIONS, TRACE, POST, made-up ones): 405
                return self._not_allowed
            raise AttributeError(name)

        def _not_allowed(self):
            self.close_connection = True
            self._send(*_json(405, {"error": f"{self.command} is not a method the explorer answers: its API is GET "
                                             "only"}), more={"Allow": ALLOW})

        def send_error(self, code, message=None, explain=None):
            """http.server's refusals (400, 414, 431, 501 ...) as JSON, like every other answer."""
            self.close_connection = True
            if self.request_version in ("", "HTTP/0.9"):   # a line that is no request: a status line all the same
                self.request_version = "HTTP/1.1"
            text = message or self.responses.get(code, ("error",))[0]
            self._send(code, (json.dumps({"error": text}) + "\n").encode(), "application/json", {})

        def _send(self, status: int, data: bytes, ctype: str, headers: dict[str, str], more=None):
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                for k, v in {**guard.headers(ctype), **headers, **(more or {})}.items():
                    self.send_header(k, v)
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError):
                self.close_connection = True   # the client left (a page closed mid-compile): the compile goes on

    return Handler


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True          # a request still waiting does not hold the process at exit
    allow_reuse_address = False    # a port in use is an error, not shared
    request_queue_size = BACKLOG   # listen()'s backlog: 200 clients at once wait, none is refused (the default 5)

    def __init__(self, address, make_handler: Callable[[guard_mod.Guard], Any], *, token: str | None = None,
                 embed: bool | None = None):
        self.token = token or guard_mod.new_token()
        self._slots = threading.BoundedSemaphore(HANDLERS)
        super().__init__(address, None, bind_and_activate=True)   # type: ignore[arg-type]
        self.guard = guard_mod.Guard(self.server_address[1], self.token, embed=embed)
        self.RequestHandlerClass = make_handler(self.guard)

    def process_request(self, request, client_address):
        """A thread of the bounded pool; with none free for HANDLER_WAIT_S, a 503 (the accept loop waits
        meanwhile, and the backlog holds the connections behind)."""
        if not self._slots.acquire(timeout=HANDLER_WAIT_S):
            with contextlib.suppress(OSError):
                request.settimeout(2.0)
                body = json.dumps({"error": f"all {HANDLERS} handlers are busy; ask again"}).encode() + b"\n"
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, socket.timeout)):
            return    # a client that went away
        if os.environ.get("JAXMEM_DEBUG"):
            super().handle_error(request, client_address)


def make_server(explorer: Explorer, port: int = 0, *, token: str | None = None, embed: bool | None = None,
                admit: Callable[..., None] = run_mod.admit) -> Server:
    """The server on 127.0.0.1:`port` (0: a free one); a port in use is a UserError. `token`: the API's
    (None: a fresh random one); `embed`: the page may be framed by a notebook (None: JAXMEM_EXPLORE_EMBED)."""
    app = App(explorer, admit)
    try:
        return Server((HOST, port), lambda guard: _handler(app, guard), token=token, embed=embed)
    except OSError as e:
        raise UserError(f"--port {port}: cannot listen on {HOST}:{port} ({e.strerror or e}); give another port, "
                        "or leave --port out for a free one") from None


def url_of(server: Server) -> str:
    """The page's URL, with the token that opens it (as `jaxmem explore` prints it)."""
    return f"http://{HOST}:{server.server_address[1]}/?token={server.token}"


def start(explorer: Explorer, port: int = 0, **kw: Any) -> tuple[Server, threading.Thread]:
    """The server answering in a thread of its own (the notebook's, the tests')."""
    srv = make_server(explorer, port, **kw)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, name="jaxmem-explore-http",
                         daemon=True)
    t.start()
    return srv, t


@contextlib.contextmanager
def running(explorer: Explorer, port: int = 0, **kw: Any):
    """The server in a thread for the body's length, then shut down (tests, benchmarks)."""
    srv, t = start(explorer, port, **kw)
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=5)


def admit(model, opts: AnalyzeOptions) -> None:
    """jaxmem.analysis.run.admit: analyze's refusals of a point, before any work (jaxmem.explore()'s too)."""
    run_mod.admit(model, opts)


def serve(model: str, opts: AnalyzeOptions, *, port: int = 0, browser: bool = True, jobs: int | None = None,
          executor: str = "local", ray_address: str | None = None, echo: Callable[[str], None] = print) -> None:
    """`jaxmem explore`: serve the explorer of `model` from the point `opts` until interrupted (^C, SIGTERM: the
    scope of jaxmem.scratch raises Interrupted here); then its workers, their compile children and the server
    stop, and the scope removes the scratch folder. A starting point analyze refuses (a --rules file it cannot
    read, a batch the mesh cannot split) is refused here, before anything starts: exit 2."""
    admit(model, opts)
    explorer = Explorer(model, opts, jobs=jobs, executor=executor, ray_address=ray_address,
                        seq_arg=controls_mod.seq_arg_of(model))
    try:
        srv = make_server(explorer, port)
        try:
            url = url_of(srv)
            explorer.ask(opts)   # the starting point compiles while the page loads
            echo(f"jaxmem explore: serving {model} on {url}  (Ctrl-C stops it)")
            if browser:   # in a thread: a browser that takes its time to start must not hold the server
                threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
            srv.serve_forever(poll_interval=0.2)
        finally:
            srv.server_close()
    finally:
        explorer.close()
