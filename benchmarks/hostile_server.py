"""Issue 54's hostile client against a fresh `jaxmem explore`: a few hundred probes across the classes a web page
or a local script can send -- other Hosts, other origins, no or a wrong token, other methods, overlong URLs and
headers, junk request lines, values the CLI refuses, a flood of new points past the compile queue, 100 cross-site
GETs that would each start a compile, 200 concurrent GETs, clients that stall mid-request -- then SIGTERM.

Measured: the requests by class and by status; the server's peak memory (VmHWM of the `jaxmem explore` process);
the compiles the hostile classes started (the explorer's /api/points, asked with the token, before and after);
what is left running after the server stopped (its descendants); the files written outside the compile cache
(a fresh HOME, TMPDIR and working folder, listed after). The table goes to benchmarks/results/hostile-server.md.

    python benchmarks/hostile_server.py
"""

from __future__ import annotations

import collections
import http.client
import json
import os
import pathlib
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "hostile-server.md"
START = ["--arg", "preset=tiny", "--gpu", "h100", "--no-browser", "--jobs", "1"]


class Target:
    def __init__(self, port: int, token: str):
        self.port, self.token = port, token
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self._lock = threading.Lock()

    def note(self, cls: str, status) -> None:
        with self._lock:
            self.counts[cls][status] += 1

    def send(self, cls: str, method: str, target: str, headers: dict | None = None, host: str | None = "own",
             body: bytes | None = None, token: bool = True) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            if host is not None:
                conn.putheader("Host", f"127.0.0.1:{self.port}" if host == "own" else host)
            if token:
                conn.putheader("X-Jaxmem-Token", self.token)
            for k, v in (headers or {}).items():
                conn.putheader(k, v)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            r = conn.getresponse()
            status, data = r.status, r.read()
            ctype = r.getheader("Content-Type") or ""
        except OSError as e:
            self.note(cls, type(e).__name__)
            return 0, b""
        finally:
            conn.close()
        if status >= 400 and ctype != "application/json":
            status = f"{status} (not JSON)"
        self.note(cls, status)
        return status, data

    def raw(self, cls: str, data: bytes) -> None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=60) as s:
                s.sendall(data)
                out = b""
                while chunk := s.recv(65536):
                    out += chunk
            line = out.split(b"\r\n", 1)[0].split()
            head, _, _ = out.partition(b"\r\n\r\n")
            status = int(line[1]) if len(line) > 1 and line[1].isdigit() else "no status"
            if b"application/json" not in head:
                status = f"{status} (not JSON)"
            self.note(cls, status)
        except OSError as e:
            self.note(cls, type(e).__name__)

    def points(self) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.request("GET", f"/api/points?token={self.token}")
        rows = json.loads(conn.getresponse().read())
        conn.close()
        return len(rows)


def _probes(t: Target) -> dict[str, int]:
    port = t.port
    routes = ["/api/controls", "/api/points", "/api/answer?batch=24", "/?x=1"]
    for host in ("evil.example", "", f"127.0.0.1.nip.io:{port}", "127.0.0.1:1", "localhost", f"0.0.0.0:{port}",
                 f"127.1:{port}", f"evil.example:{port}", f"[::2]:{port}"):
        for r in routes:
            t.send("hosts", "GET", r, host=host)
    for r in routes:
        t.send("hosts", "GET", r, host=None)
    for h in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Origin": f"http://127.0.0.1:{port + 1}"},
              {"Origin": f"https://127.0.0.1:{port}"}, {"Sec-Fetch-Site": "cross-site"},
              {"Sec-Fetch-Site": "same-site"}, {"Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"}):
        for r in routes:
            t.send("origins", "GET", r, h)
    for r in routes:
        t.send("token", "GET", r, token=False)
        t.send("token", "GET", r + ("&" if "?" in r else "?") + "token=wrong", token=False)
        t.send("token", "GET", r, {"Cookie": f"jaxmem-explore-{port}=wrong"}, token=False)
        t.send("token", "GET", r, {"Authorization": "token nope"}, token=False)
    for m in ("OPTIONS", "HEAD", "TRACE", "POST", "PUT", "DELETE", "PATCH", "FROBNICATE", "PROPFIND"):
        for r in ("/api/answer?batch=8", "/"):
            t.send("methods", m, r, body=b"batch=8" if m in ("POST", "PUT", "PATCH") else None)
    for _ in range(3):
        t.raw("sizes", b"GET /api/answer?x=" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: h\r\n\r\n")
        t.raw("sizes", b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n")
        t.raw("sizes", b"GET /api/controls HTTP/1.1\r\nHost: h\r\nX-Big: " + b"b" * 40_000 + b"\r\n\r\n")
        t.raw("sizes", b"GET /api/controls HTTP/1.1\r\nHost: h\r\n" +
              b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n")
    for junk in (b"NOT A REQUEST\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
                 b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"GET / HTTP/1.1\r\nHost\r\n\r\n"):
        t.raw("junk", junk)
    refused = [{"batch": "7", "mesh": "data=2"}, {"accum": "3", "batch": "8"}, {"base-dtype": "nf4"},
               {"precision": "fp8", "gpu": "cpu"}, {"precision": "fp8", "gpu": "a100-80g"}, {"arg.nosuch": "3"},
               {"arg.batch_size": "0"}, {"arg.batch_size": "-1"}, {"offload": "optimizer", "gpu": "cpu"},
               {"batch": "-1"}, {"batch": "nan"}, {"batch": "1e20"}, {"bacth": "8"}, {"rules": "/etc/passwd"},
               {"arg.preset": "/etc/passwd"}, {"no-cache": "1"}, {"remat": "fulll"}, {"gpu": "h1000"},
               {"mesh": "data=0"}, {"batch": str(2 ** 62)}]
    for params in refused:
        for route in ("answer", "advise", "fit"):
            t.send("refusals", "GET", f"/api/{route}?" + urllib.parse.urlencode(params))
    before = t.points()
    threads = [threading.Thread(target=t.send, args=("cross-site GETs", "GET", f"/api/answer?batch={b}"),
                                kwargs={"headers": {"Sec-Fetch-Site": "cross-site"}, "token": False})
               for b in range(100, 200)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    cross_site = t.points() - before
    for b in range(1, 61):   # a flood of new points: the queue takes QUEUE_LIMIT, then 429
        t.send("queue flood", "GET", f"/api/answer?batch={b}")
    threads = [threading.Thread(target=t.send, args=("200 concurrent", "GET", "/api/answer")) for _ in range(200)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {"cross_site": cross_site}


def _stalled(t: Target, n: int = 5) -> tuple[int, float]:
    """`n` clients that send half a request and stall: (how many the server dropped, seconds until the last)."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", t.port), timeout=120)
        s.sendall(b"GET /api/controls HTTP/1.1\r\nHost: ")
        socks.append(s)
    t0 = time.monotonic()
    t.send("while stalled", "GET", "/api/controls")   # others answered meanwhile
    dropped = 0
    for s in socks:
        try:
            if s.recv(1024) == b"":
                dropped += 1
        except OSError:
            pass
        s.close()
    for _ in range(n):
        t.note("stalled clients", "dropped" if dropped else "held")
    return dropped, time.monotonic() - t0


def _descendants(pid: int) -> set[int]:
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out |= {int(d)} | _descendants(int(d))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _files(*folders: pathlib.Path, skip: pathlib.Path) -> list[str]:
    out = []
    for folder in folders:
        for p in folder.rglob("*"):
            if p.is_file() and skip not in p.parents:
                out.append(str(p))
    return out


def main() -> None:
    root = pathlib.Path(tempfile.mkdtemp(prefix="jxm-hostile-"))
    home, tmp, work, cache = root / "home", root / "tmp", root / "work", root / "home" / "cache"
    for d in (home, tmp, work, cache):
        d.mkdir(parents=True)
    shutil.copy(ROOT / "models" / "mlp.py", work / "mlp.py")
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmp), "JAXMEM_CACHE": str(cache),
           "XDG_CACHE_HOME": str(home / ".cache"), "PYTHONPATH": str(ROOT), "MPLCONFIGDIR": str(tmp / "mpl")}
    env.pop("RAY_ADDRESS", None)
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "jaxmem.cli", "explore", "mlp.py", *START], cwd=work, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    url = urllib.parse.urlsplit(line.split(" on ", 1)[1].split()[0])
    t = Target(url.port, urllib.parse.parse_qs(url.query)["token"][0])
    t.send("setup", "GET", "/api/answer?wait=exact")   # the starting point, compiled
    load0 = os.getloadavg()[0]
    extra = _probes(t)
    dropped, stall_s = _stalled(t)
    peak = _hwm(p.pid)
    kids = _descendants(p.pid)
    p.send_signal(signal.SIGTERM)
    code = p.wait(timeout=120)
    left = [k for k in kids | _descendants(p.pid) if _alive(k)]
    mpl = tmp / "mpl"
    stray = [f for f in _files(home, tmp, work, skip=cache) if pathlib.Path(f) != work / "mlp.py"
             and mpl not in pathlib.Path(f).parents]
    wall = time.perf_counter() - t0
    _write(t, extra, dropped, stall_s, peak, code, left, stray, kids, wall, load0)
    shutil.rmtree(root, ignore_errors=True)


def _write(t, extra, dropped, stall_s, peak, code, left, stray, kids, wall, load0) -> None:
    statuses = sorted({s for c in t.counts.values() for s in c}, key=str)
    classes = [c for c in t.counts if c != "setup"]
    head = "| class | requests | " + " | ".join(str(s) for s in statuses) + " |"
    rows = [head, "|---|---:|" + "---:|" * len(statuses)]
    total = collections.Counter()
    for c in classes:
        total.update(t.counts[c])
        rows.append(f"| {c} | {sum(t.counts[c].values())} | " +
                    " | ".join(str(t.counts[c].get(s, "")) for s in statuses) + " |")
    rows.append(f"| **all** | **{sum(total.values())}** | " + " | ".join(f"**{total.get(s, '')}**" for s in statuses)
                + " |")
    facts = [
        (f"- requests: {sum(total.values())}; refusals by status: "
         + ", ".join(f"{s}: {n}" for s, n in sorted(total.items(), key=lambda kv: str(kv[0])) if str(s) != "200")
         + f"; answers (200): {total.get(200, 0)}"),
        (f"- compiles the 100 cross-site GETs started: {extra['cross_site']} (points listed by /api/points before "
         "and after them)"),
        (f"- clients stalled mid-request: {dropped} of 5 dropped by the server ({stall_s:.1f} s after they stalled, "
         "its 20 s socket timeout), others answered meanwhile"),
        f"- the server's peak memory (VmHWM of `jaxmem explore`, its workers apart): {peak / 2 ** 20:.0f} MiB",
        (f"- after SIGTERM: exit {code}; processes left of its {len(kids)} descendants (workers, compile "
         f"children): {len(left)}"),
        (f"- files written outside the compile cache (a fresh HOME, TMPDIR and working folder): {len(stray)}"
         + (f" ({', '.join(stray[:5])})" if stray else "")),
    ]
    intro = (f"`python benchmarks/hostile_server.py` on {platform.node()} ({os.cpu_count()} cores, Python "
             f"{platform.python_version()}), {time.strftime('%Y-%m-%d')}; {wall:.0f} s in all, load average "
             f"{load0:.1f} at the start. A fresh `jaxmem explore mlp.py --arg preset=tiny --gpu h100 --jobs 1` (a "
             "copy of models/mlp.py in a fresh working folder, HOME, TMPDIR and compile cache), its starting point "
             "compiled, then the probes below, then SIGTERM. Statuses: the answer's (every one JSON; `(not JSON)` "
             "would say otherwise), or what the client saw. `origins`: 7 foreign Origin / Sec-Fetch-Site headers on "
             "4 routes; the two 200s are the page itself loaded with the token by another site (Sec-Fetch-Site "
             "cross-site and same-site), which is how a notebook's iframe opens it; every /api call of that class "
             "is 403. `queue flood`: 60 new points asked at once (the compile queue holds 32: 429 beyond); "
             "`refusals`: 20 values analyze refuses, each to /api/answer, /api/advise and /api/fit (400 before any "
             "prediction or compile); `cross-site GETs`: 100 requests with Sec-Fetch-Site: cross-site and no token, "
             "each a new point; `junk`: five lines that are no request (400; HTTP/9.9 505; a header line without a "
             "colon leaves no Host: 403).")
    text = "\n".join(["# A hostile client against `jaxmem explore` (issue 54)", "", intro, "", *rows, "", *facts, ""])
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
