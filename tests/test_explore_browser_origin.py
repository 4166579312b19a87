"""A web page from another origin tries to drive the explorer in a real browser (issue 54), and cannot.

Headless Chromium first opens the explorer's page from its printed URL (so the browser holds the page's cookie,
as a user's would), then a page served by a second little server on another port of 127.0.0.1 -- another
origin, yet the same *site*, so SameSite cookies ride along -- whose script tries every way a page has to make
a request: fetch (plain, no-cors with credentials), an image, a script tag, a form POST and a form GET into an
iframe, and an iframe of the explorer's page with a query. The explorer's server sees those requests, refuses
each (403), and no point is made and no compile starts.

Skipped only where Chromium or its driver is not installed (CI installs both: .ci/run).
"""

from __future__ import annotations

import functools
import http.server
import threading
import time

import pytest
from browser import chromium
from conftest import MODELS
from test_explore_server import START, InstantPool

from jaxmem.explore import server

pytestmark = pytest.mark.once   # the page and the server's HTTP, the same under every jax (.ci/run)

WAIT_S = 120   # an upper bound for a loaded machine, never a timing being tested

HOSTILE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>hostile</title></head><body>
<iframe name="sink1"></iframe><iframe name="sink2"></iframe>
<script>
const T = "http://127.0.0.1:%(port)d";
const tries = [];
tries.push(fetch(T + "/api/answer?batch=64").then(r => "fetch " + r.status, e => "fetch failed"));
tries.push(fetch(T + "/api/answer?batch=65&token=guess", {mode: "no-cors", credentials: "include"})
  .then(r => "no-cors " + r.type, e => "no-cors failed"));
tries.push(new Promise(res => { const i = new Image(); i.onload = i.onerror = () => res("img");
  i.src = T + "/api/answer?batch=66"; }));
tries.push(new Promise(res => { const s = document.createElement("script"); s.onload = s.onerror = () => res("script");
  s.src = T + "/api/fit?batch=67"; document.body.appendChild(s); }));
function form(method, action, target, fields) {
  const f = document.createElement("form"); f.method = method; f.action = action; f.target = target;
  for (const [k, v] of Object.entries(fields)) {
    const i = document.createElement("input"); i.name = k; i.value = v; f.appendChild(i); }
  document.body.appendChild(f); f.submit(); }
form("POST", T + "/api/answer?batch=68", "sink1", {batch: "68"});
form("GET", T + "/api/advise", "sink2", {batch: "69"});
const fr = document.createElement("iframe"); fr.src = T + "/?batch=70"; document.body.appendChild(fr);
Promise.all(tries).then(r => { window.results = r; setTimeout(() => { document.title = "done"; }, 3000); });
</script></body></html>
"""


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def test_a_page_from_another_origin_cannot_drive_the_explorer(browser, tmp_path, monkeypatch):
    from selenium.webdriver.support.ui import WebDriverWait

    from jaxmem.explore.points import Explorer

    (tmp_path / "mlp.py").write_text((MODELS / "mlp.py").read_text() + "\n# tests/test_explore_browser_origin.py\n")
    pool = InstantPool(None, hold=True)   # nothing compiles: what the hostile page could start is counted
    ex = Explorer(str(tmp_path / "mlp.py"), START, jobs=1, make_pool=lambda n, e, a: pool)
    seen: list[tuple[str, int]] = []
    real = server.respond

    def respond(app, target, guard=None, headers=None):
        out = real(app, target, guard, headers)
        seen.append((target, out[0]))
        return out

    monkeypatch.setattr(server, "respond", respond)
    site = tmp_path / "site"
    site.mkdir()
    hostile = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=hostile.serve_forever, daemon=True).start()
    try:
        with server.running(ex) as srv:
            (site / "index.html").write_text(HOSTILE % {"port": srv.server_address[1]})
            d, wait = browser, WebDriverWait(browser, WAIT_S, poll_frequency=0.1)
            d.get(server.url_of(srv))   # the user's own page: the browser now holds its cookie
            wait.until(lambda d: d.execute_script("return !!(window.jaxmemExplore && window.jaxmemExplore.state.info)"))
            assert [c for c in d.get_cookies() if c["name"].startswith("jaxmem-explore-")]
            _settle(lambda: (len(pool.started), len(ex.points)))
            points, started, before = set(ex.points), len(pool.started), len(seen)

            d.get(f"http://127.0.0.1:{hostile.server_address[1]}/index.html")
            wait.until(lambda d: d.title == "done")
            _settle(lambda: len(seen))
            hostile_requests = [(t, s) for t, s in seen[before:] if "batch=6" in t or "batch=70" in t]
            assert len({t.split("batch=")[1][:2] for t, _ in hostile_requests}) >= 5, seen[before:]  # they arrived
            assert all(s == 403 for _, s in hostile_requests), hostile_requests   # and were refused
            assert set(ex.points) == points and len(pool.started) == started  # no point made, no compile started
            assert not any(p.asked for k, p in ex.points.items() if "--batch 6" in k or "--batch 70" in k)
    finally:
        hostile.shutdown()
        hostile.server_close()
        ex.close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _settle(value, seconds: float = 1.0, limit: float = WAIT_S) -> None:
    """Until `value()` has not changed for `seconds` (a bound for a loaded machine, not a timing tested)."""
    last, since, deadline = value(), time.monotonic(), time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = value()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return
