"""`jaxmem explore`'s server seen by a web page and a hostile client (issue 54): who may ask (Host, origin, token),
what every answer is (JSON, its headers), the protocol's edges (methods, sizes, slow and many clients), the compile
queue's bound, and the refusals made before any work -- the same words from analyze, the API and jaxmem.explore().

Most tests run on an explorer whose pool compiles nothing (its jobs answer with a stored report at once, or never):
what is tested is the server, not a compile. The model is a copy of the tiny MLP in a folder of its own (its
stand-in answers are kept in the cache's store under that copy's bytes, never the shipped file's).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest
from click.testing import CliRunner
from conftest import MODELS, ROOT
from helpers import descendants

from jaxmem.explore import guard, points, server
from jaxmem.plan import sweep
from jaxmem.program.options import AnalyzeOptions
from jaxmem.report import Report

GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "jax-0.10.2" / "llama-data8-dp.json"
START = AnalyzeOptions(gpu="h100", model_args=(("preset", "tiny"),))


class InstantPool:
    """Each job answered at once with one stored report (no compile); `hold`: none answered."""

    def __init__(self, report: Report | None, hold: bool = False):
        self.report, self.hold, self.started, self._done = report, hold, [], []
        self._lock = threading.Lock()

    def submit(self, job):
        with self._lock:
            self.started.append(job)
            if not self.hold:
                self._done.append(sweep.Outcome(job, self.report, None, "ok", 0.01))

    def next(self, timeout=None):
        with self._lock:
            if self._done:
                return self._done.pop(0)
        time.sleep(min(timeout or 0.05, 0.05))
        return None

    def close(self):
        pass


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("explore-server")
    # a copy of its own bytes: the stand-in answers kept in the cache's store are this copy's, no other test's
    (folder / "mlp.py").write_text((MODELS / "mlp.py").read_text() + "\n# tests/test_explore_server.py\n")
    return folder


def _explorer(model_dir, pool, monkeypatch=None):
    from jaxmem.explore.points import Explorer

    return Explorer(os.path.join(str(model_dir), "mlp.py"), START, jobs=1, make_pool=lambda n, e, a: pool)


@pytest.fixture(scope="module")
def srv(model_dir):
    pool = InstantPool(Report.from_json(json.loads(GOLDEN.read_text())))
    ex = _explorer(model_dir, pool)
    with server.running(ex) as s:
        s.explorer, s.pool = ex, pool
        yield s
    ex.close()


def request(srv, method: str, target: str, headers: dict | None = None, *, host: str | None = "own",
            body: bytes | None = None) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one request; host "own" is 127.0.0.1:PORT, None sends no Host at all."""
    port = srv.server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        if host is not None:
            conn.putheader("Host", f"127.0.0.1:{port}" if host == "own" else host)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def api(srv, path: str, params: dict | None = None, headers: dict | None = None, **kw):
    q = dict(params or {})
    target = path + ("?" + urllib.parse.urlencode(q) if q else "")
    status, h, data = request(srv, "GET", target, {"X-Jaxmem-Token": srv.token, **(headers or {})}, **kw)
    return status, (json.loads(data) if h.get("Content-Type") == "application/json" else data), h


def raw(srv, data: bytes, timeout: float = 60) -> bytes:
    """What the server answers to `data` sent as is (the whole answer, until it closes)."""
    with socket.create_connection(srv.server_address, timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
            if b"\r\n\r\n" in out and b"Connection: close" not in out.split(b"\r\n\r\n")[0]:
                break
    return out


def _json_error(data: bytes) -> dict:
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"Content-Type: application/json" in head, head
    return json.loads(body)


# ------------------------------------------------------------------------------ who may ask

@pytest.mark.parametrize("host", ["evil.example", "", "127.0.0.1.nip.io:{port}", "127.0.0.1:1", "localhost",
                                  "evil.example:{port}", None])
def test_a_host_not_the_servers_own_is_refused_403_json(srv, host):
    h = None if host is None else host.format(port=srv.server_address[1])
    status, body, headers = api(srv, "/api/controls", host=h)
    assert status == 403 and "is not this server's" in body["error"]
    assert headers["Content-Type"] == "application/json"


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "LOCALHOST:{port}"])
def test_the_servers_own_names_are_answered(srv, host):
    status, body, _ = api(srv, "/api/controls", host=host.format(port=srv.server_address[1]))
    assert status == 200 and body["start"]["arg.preset"] == "tiny"


def test_another_sites_request_is_refused_and_no_point_is_made(srv):
    port = srv.server_address[1]
    before = set(srv.explorer.points)
    for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Origin": "http://127.0.0.1:1"},
                    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                    {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-site"}):
        status, body, _ = api(srv, "/api/answer", {"batch": 96}, headers)
        assert status == 403 and "page" in body["error"], headers
    assert set(srv.explorer.points) == before   # nothing asked, nothing queued
    for headers in ({"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"},
                    {"Origin": f"http://localhost:{port}"}, {"Sec-Fetch-Site": "none"}):
        assert api(srv, "/api/controls", None, headers)[0] == 200, headers


def test_every_api_call_needs_the_token_and_the_cookie_opens_only_the_page(srv):
    t = srv.token
    cookie = {"Cookie": f"{guard.cookie_name(srv.server_address[1])}={t}"}
    assert request(srv, "GET", "/api/controls")[0] == 403                                  # none
    wrong = t[:-1] + ("y" if t.endswith("x") else "x")
    status, _, data = request(srv, "GET", "/api/controls?token=" + wrong)                  # wrong
    assert status == 403 and "wrong token" in json.loads(data)["error"]
    assert request(srv, "GET", "/api/controls?token=" + t)[0] == 200                       # query
    assert request(srv, "GET", "/api/controls", {"X-Jaxmem-Token": t})[0] == 200           # header
    assert request(srv, "GET", "/api/controls", {"Authorization": f"token {t}"})[0] == 200  # as Jupyter's
    assert request(srv, "GET", "/api/controls", cookie)[0] == 403   # a cookie rides on other pages' requests
    # the page: opened by the printed URL (which sets the cookie), then by the cookie; never without either
    status, headers, page = request(srv, "GET", "/?token=" + t)
    assert status == 200 and f'<meta name="jaxmem-token" content="{t}">'.encode() in page
    set_cookie = headers["Set-Cookie"]
    assert set_cookie.startswith(f"{guard.cookie_name(srv.server_address[1])}={t};")
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
    assert request(srv, "GET", "/", cookie)[0] == 200
    status, headers, data = request(srv, "GET", "/")
    assert status == 403 and "open the URL" in json.loads(data)["error"]
    assert t.encode() not in data
    assert request(srv, "GET", "/static/explore.js")[0] == 200   # public code: no token
    assert server.url_of(srv) == f"http://127.0.0.1:{srv.server_address[1]}/?token={t}"


def test_no_cors_header_and_the_page_cannot_be_framed(srv):
    for target in ("/?token=" + srv.token, "/api/controls?token=" + srv.token, "/api/controls", "/static/explore.js"):
        _, headers, _ = request(srv, "GET", target, {"Origin": f"http://127.0.0.1:{srv.server_address[1]}"})
        assert not [k for k in headers if k.lower().startswith("access-control-")], target
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    page_csp = request(srv, "GET", "/?token=" + srv.token)[1]["Content-Security-Policy"]
    assert "script-src 'self'" in page_csp and "connect-src 'self'" in page_csp
    # a notebook's server (jaxmem.explore(): JAXMEM_EXPLORE_EMBED=1) lets a notebook on this machine frame it
    g = guard.Guard(8888, "t", embed=True).headers("text/html")
    assert "X-Frame-Options" not in g and "http://localhost:*" in g["Content-Security-Policy"]
    assert "*" not in g["Content-Security-Policy"].split("frame-ancestors")[1].split()


def test_the_model_is_named_as_typed_not_by_an_absolute_path(model_dir, monkeypatch):
    monkeypatch.chdir(model_dir)
    pool = InstantPool(Report.from_json(json.loads(GOLDEN.read_text())))
    from jaxmem.explore.points import Explorer

    ex = Explorer("mlp.py", START, jobs=1, make_pool=lambda n, e, a: pool)
    try:
        with server.running(ex) as s:
            s_token = s.token
            answer = api(s, "/api/answer", {"batch": 8, "wait": "exact"})[1]
            rows = api(s, "/api/points")[1]
            controls = api(s, "/api/controls")[1]
            refused = api(s, "/api/answer", {"batch": 7, "mesh": "data=2"})[1]
        text = json.dumps([answer, rows, controls, refused])
        assert s_token and str(model_dir) not in text and os.path.abspath("mlp.py") not in text
        assert answer["command"].startswith("jaxmem analyze mlp.py ") and rows[0]["command"] == answer["command"]
    finally:
        ex.close()


# ------------------------------------------------------------------------------ HTTP done properly

@pytest.mark.parametrize("method", ["OPTIONS", "HEAD", "TRACE", "POST", "PUT", "DELETE", "PATCH", "FROBNICATE"])
def test_every_other_method_is_405_json_with_allow(srv, method):
    status, headers, data = request(srv, method, "/api/answer?token=" + srv.token,
                                    body=b"batch=8" if method in ("POST", "PUT", "PATCH") else None)
    assert status == 405 and headers["Allow"] == "GET" and headers["Content-Type"] == "application/json"
    if method != "HEAD":
        assert "GET only" in json.loads(data)["error"]


def test_overlong_urls_are_414_and_overlong_headers_431_json(srv):
    assert _json_error(raw(srv, b"GET /api/answer?x=" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: h\r\n\r\n")) \
        and b" 414 " in raw(srv, b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: h\r\n\r\n").split(b"\r\n")[0]
    line = raw(srv, b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n")   # past http.server's own limit
    assert b" 414 " in line.split(b"\r\n")[0] and "error" in _json_error(line)
    big = raw(srv, b"GET /api/controls HTTP/1.1\r\nHost: h\r\nX-Big: " + b"b" * 40_000 + b"\r\n\r\n")
    assert b" 431 " in big.split(b"\r\n")[0] and "error" in _json_error(big)
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(150))
    out = raw(srv, b"GET /api/controls HTTP/1.1\r\nHost: h\r\n" + many + b"\r\n")
    assert b" 431 " in out.split(b"\r\n")[0] and "error" in _json_error(out)
    junk = raw(srv, b"NOT A REQUEST\r\n\r\n")
    assert b" 400 " in junk.split(b"\r\n")[0] and "error" in _json_error(junk)


def test_a_silent_client_is_dropped_and_holds_no_one(model_dir, monkeypatch):
    monkeypatch.setattr(server, "TIMEOUT_S", 1.0)
    pool = InstantPool(None, hold=True)
    ex = _explorer(model_dir, pool)
    try:
        with server.running(ex) as s:
            silent = socket.create_connection(s.server_address, timeout=120)
            silent.sendall(b"GET /api/controls HTTP/1.1\r\nHost: ")   # and nothing more
            assert api(s, "/api/controls")[0] == 200                  # others are answered meanwhile
            assert silent.recv(1024) == b""                           # the server closed it (its timeout)
            silent.close()
    finally:
        ex.close()


def test_200_concurrent_gets_of_an_answered_point_are_all_answered(srv):
    assert api(srv, "/api/answer", {"batch": 8, "wait": "exact"})[1]["answer"] == "exact"
    out: list = []

    def one():
        try:
            status, body, _ = api(srv, "/api/answer", {"batch": 8})
            out.append((status, body.get("answer")))
        except OSError as e:   # a refused or reset connection is a failure the assertion names
            out.append((type(e).__name__, None))

    threads = [threading.Thread(target=one) for _ in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [(200, "exact")] * 200


def test_the_compile_queue_is_bounded_and_a_refused_move_leaves_nothing(model_dir):
    pool = InstantPool(None, hold=True)   # the first job never ends: every later point waits
    ex = _explorer(model_dir, pool)
    try:
        with server.running(ex) as s:
            statuses = [api(s, "/api/answer", {"batch": b})[0] for b in range(1, points.QUEUE_LIMIT + 10)]
            made = len(ex.points)
            refused = api(s, "/api/answer", {"batch": 1000})
            assert refused[0] == 429 and "wait for a worker" in refused[1]["error"]
            assert len(ex.points) == made                      # the refused point was not made
            assert statuses.count(200) >= points.QUEUE_LIMIT and set(statuses) == {200, 429}
            assert api(s, "/api/answer", {"batch": 1})[0] == 200   # a point already asked is still answered
    finally:
        ex.close()


# ------------------------------------------------------------------------------ refusals before any work

MLP = str(MODELS / "mlp.py")
LLAMA = str(MODELS / "llama.py")
# (the options as analyze's flags, the same point as request parameters, words of the refusal)
REFUSALS = [
    (["--batch", "7", "--mesh", "data=2"], {"batch": "7", "mesh": "data=2"}, "not divisible by the 2 devices"),
    (["--accum", "3", "--batch", "8"], {"accum": "3", "batch": "8"}, "--accum 3: global batch 8 must split"),
    (["--base-dtype", "nf4"], {"base-dtype": "nf4"}, "stores the frozen base of a LoRA fine-tune"),
    (["--precision", "fp8", "--gpu", "a100-80g"], {"precision": "fp8", "gpu": "a100-80g"}, "needs FP8 tensor cores"),
    (["--precision", "fp8", "--gpu", "cpu"], {"precision": "fp8", "gpu": "cpu"}, "needs FP8 tensor cores"),
    (["--arg", "nosuch=3"], {"arg.nosuch": "3"}, "unknown argument(s) nosuch"),
    (["--arg", "batch_size=0"], {"arg.batch_size": "0"}, "--arg batch_size=0 must be at least 1"),
    (["--arg", "batch_size=-4"], {"arg.batch_size": "-4"}, "--arg batch_size=-4 must be at least 1"),
    (["--offload", "optimizer", "--gpu", "cpu"], {"offload": "optimizer", "gpu": "cpu"}, "offload"),
]


def _api_kw(params: dict) -> dict:
    """The same point as jaxmem.explore()'s keywords."""
    kw: dict = {"args": {"preset": "tiny"}, "gpu": "h100"}
    for k, v in params.items():
        if k.startswith("arg."):
            kw["args"][k[4:]] = int(v)
        else:
            name = {"base-dtype": "base_dtype"}.get(k, k)
            kw[name] = int(v) if v.lstrip("-").isdigit() else v
    return kw


@pytest.mark.parametrize(("flags", "params", "words"), REFUSALS, ids=[" ".join(c[0]) for c in REFUSALS])
def test_a_refusal_is_the_same_from_analyze_the_api_and_jaxmem_explore(srv, flags, params, words, monkeypatch):
    import jaxmem
    from jaxmem import cli

    out = CliRunner().invoke(cli.main, ["analyze", MLP, "--arg", "preset=tiny", "--gpu", "h100", *flags])
    assert out.exit_code == 2, out.output
    said = out.output.strip().splitlines()[-1].removeprefix("error: ")
    assert words in said
    model = srv.explorer.model
    status, body, _ = api(srv, "/api/answer", params)   # the module's server: the same MLP, in its own folder
    assert status == 400, body
    assert body["error"] == said.replace(MLP, model), (body["error"], said)
    before = len(srv.pool.started)
    with pytest.raises(jaxmem.UserError) as e:
        jaxmem.explore(MLP, **_api_kw(params))
    assert str(e.value) == said
    assert len(srv.pool.started) == before   # and nothing compiled for it


def test_explore_refuses_a_rules_file_analyze_refuses_at_start(tmp_path):
    """`explore --rules /etc/passwd` exits 2 with analyze's message before serving; jaxmem.explore() too."""
    import jaxmem

    args = [MLP, "--arg", "preset=tiny", "--gpu", "h100", "--rules", "/etc/passwd"]
    a = subprocess.run([sys.executable, "-m", "jaxmem.cli", "analyze", *args], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    e = subprocess.run([sys.executable, "-m", "jaxmem.cli", "explore", *args, "--no-browser"], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert a.returncode == 2 and e.returncode == 2, (a.stderr, e.stderr)
    assert e.stdout == "" and e.stderr.strip() == a.stderr.strip()   # no URL: it never served
    with pytest.raises(jaxmem.UserError) as err:
        jaxmem.explore(MLP, args={"preset": "tiny"}, gpu="h100", rules="/etc/passwd")
    assert str(err.value) == a.stderr.strip().splitlines()[-1].removeprefix("error: ")


@pytest.mark.parametrize("args", [object(), "preset=tiny", ["ab"], {"preset": object()}, {"preset": ["tiny"]}])
def test_jaxmem_explore_args_must_be_a_dict_of_command_line_values(args):
    import jaxmem

    with pytest.raises(jaxmem.UserError, match="args"):
        jaxmem.explore(MLP, args=args, gpu="h100")


# ------------------------------------------------------------------------------ the command's lifecycle


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_after_sigterm_no_compile_child_outlives_the_server(tmp_path):
    env = {**os.environ, "JAXMEM_CACHE": str(tmp_path / "cache")}   # nothing cached: the compile runs
    p = subprocess.Popen([sys.executable, "-m", "jaxmem.cli", "explore", LLAMA, "--arg", "preset=tiny", "--gpu",
                          "h100", "--no-browser", "--jobs", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, cwd=ROOT)
    try:
        line = p.stdout.readline()
        assert "?token=" in line, line + p.stderr.read()
        deadline = time.monotonic() + 300
        compiling: set[int] = set()
        while not compiling and time.monotonic() < deadline:   # the starting point's compile child
            compiling = {k for k in descendants(p.pid) if "jaxmem.compiler.early_stop" in _cmdline(k)}
            time.sleep(0.05)
        workers = {k for k in descendants(p.pid) if "_worker_main" in _cmdline(k)}
        assert compiling and workers
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=120) == 128 + signal.SIGTERM
        assert not [k for k in compiling | workers if _alive(k)]   # gone by the time the server is
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# ------------------------------------------------------------------------------ Ray under a long TMPDIR

def _long_tmpdir(tmp_path) -> str:
    """A TMPDIR of 100 characters (macOS's /var/folders/... are about 50; the scratch folder goes inside)."""
    base = str(tmp_path)
    path = os.path.join(base, "t" * (99 - len(base)))
    os.makedirs(path)
    assert len(path) == 100
    return path


def test_a_local_rays_folder_is_short_whatever_tmpdir_is_and_a_failed_start_is_the_users_error(tmp_path,
                                                                                               monkeypatch):
    import jaxmem
    from jaxmem.plan import ray_start

    monkeypatch.setenv("TMPDIR", _long_tmpdir(tmp_path))
    folder = ray_start.short_temp_dir()
    try:
        assert len(folder) + ray_start.RAY_TAIL <= ray_start.SOCKET_MAX and os.path.isdir(folder)
    finally:
        ray_start.remove(folder)

    class Broken:
        @staticmethod
        def init(**kw):
            assert len(kw["_temp_dir"]) + ray_start.RAY_TAIL <= ray_start.SOCKET_MAX
            raise RuntimeError("Failed to start the GCS server\nmore lines")

    with pytest.raises(jaxmem.UserError, match=r"Ray did not start on this machine \(RuntimeError: Failed to start "
                                               r"the GCS server\)"):
        ray_start.init_local(Broken, 1, {})
    assert not [d for d in os.listdir("/tmp") if d.startswith("jxm-ray-") and
                os.path.getmtime(os.path.join("/tmp", d)) > time.time() - 5 and not os.listdir(os.path.join("/tmp", d))]


@pytest.mark.once   # Ray's socket paths under TMPDIR: the same under every jax (.ci/run)
def test_compare_and_explore_run_on_ray_under_a_100_character_tmpdir(tmp_path):
    pytest.importorskip("ray")
    env = {**os.environ, "TMPDIR": _long_tmpdir(tmp_path), "RAY_ADDRESS": ""}
    c = subprocess.run([sys.executable, "-m", "jaxmem.cli", "compare", MLP, "--arg", "preset=tiny", "--gpu", "h100",
                        "--batches", "8,16", "--executor", "ray", "--jobs", "1", "--json"], capture_output=True,
                       text=True, timeout=600, env=env, cwd=ROOT)
    assert c.returncode == 0, c.stderr
    rows = json.loads(c.stdout)
    assert [r["status"] for r in rows] == ["ok", "ok"], rows
    p = subprocess.Popen([sys.executable, "-m", "jaxmem.cli", "explore", MLP, "--arg", "preset=tiny", "--gpu", "h100",
                          "--no-browser", "--executor", "ray", "--jobs", "1"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        line = p.stdout.readline()
        assert "?token=" in line, line + p.stderr.read()
        url = urllib.parse.urlsplit(line.split(" on ", 1)[1].split()[0])
        conn = http.client.HTTPConnection("127.0.0.1", url.port, timeout=600)
        conn.request("GET", f"/api/answer?wait=exact&batch=16&{url.query}")
        body = json.loads(conn.getresponse().read())
        conn.close()
        assert body["answer"] == "exact", body
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=120) == 130
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
