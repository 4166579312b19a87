"""jaxmem explore's backend: the HTTP API over the explorer (jaxmem/explore), on the tiny MLP.

One explorer and server for the module (a worker process compiles its points); the query, prediction
and controls tests need no compile.
"""

import dataclasses
import http.client
import json
import os
import pathlib
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

from jaxmem.explore import controls, predict, query
from jaxmem.program.options import AnalyzeOptions
from jaxmem.report import Report

MLP = str(MODELS / "mlp.py")
START = AnalyzeOptions(gpu="h100", model_args=(("preset", "tiny"),))
GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "jax-0.10.2" / "llama-data8-dp.json"


def get(srv, path: str, params: dict | None = None) -> tuple[int, object, dict]:
    """(status, body: JSON or, for a download, bytes, headers) of a GET on the test server."""
    conn = http.client.HTTPConnection(*srv.server_address, timeout=600)
    try:
        conn.request("GET", path + ("?" + urllib.parse.urlencode(params) if params else ""),
                     headers={"X-Jaxmem-Token": srv.token})
        r = conn.getresponse()
        data, headers = r.read(), dict(r.getheaders())
    finally:
        conn.close()
    download = "Content-Disposition" in headers
    body = json.loads(data) if headers.get("Content-Type") == "application/json" and not download else data
    return r.status, body, headers


@pytest.fixture(scope="module")
def srv():
    from jaxmem.explore import server
    from jaxmem.explore.points import Explorer

    ex = Explorer(MLP, START, jobs=1, seq_arg=None)
    with server.running(ex) as s:
        s.explorer = ex
        yield s
    ex.close()


# ------------------------------------------------------------------------------ no compile

def test_a_query_is_analyzes_options_on_top_of_the_start():
    o = query.parse({"batch": ["16"], "remat": ["full"], "no-donate": [""], "arg.seq_len": ["64"]}, START, MLP)
    assert (o.batch, o.remat, o.donate, o.gpu) == (16, "full", False, "h100")
    assert dict(o.model_args) == {"preset": "tiny", "seq_len": 64}
    assert query.parse({"no-donate": ["0"], "optimizer": [""]}, START, MLP).donate is True
    # one point, one key, whatever the order the model's arguments come in
    a = dataclasses.replace(o, model_args=(("seq_len", 64), ("preset", "tiny")))
    assert query.key(MLP, a) == query.key(MLP, o)
    assert query.parse(query_params(query.to_query(o)), START, MLP) == query.canonical(o)


def query_params(q: dict) -> dict:
    return {k: [v] for k, v in q.items()}


@pytest.mark.parametrize(("params", "words"), [
    ({"batch": ["-1"]}, "Invalid value for '--batch': -1 is not allowed: the global batch must be at least 1"),
    ({"batch": ["nan"]}, "Invalid value for '--batch': 'nan' is not a whole number"),
    ({"batch": ["1e20"]}, "Invalid value for '--batch': '1e20' is not a whole number"),
    ({"batch": ["99999999999999999999"]}, "is beyond a 64-bit integer"),
    ({"batch": ["eight"]}, "'eight' is not a whole number"),
    ({"mem-fraction": ["nan"]}, "Invalid value for '--mem-fraction': nan is not in (0, 1]"),
    ({"lora-alpha": ["inf"]}, "Invalid value for '--lora-alpha': inf is not allowed"),
    ({"accum": ["0"]}, "Invalid value for '--accum': 0 is not in the range x>=1."),
    ({"remat": ["fulll"]}, "is no checkpoint policy (did you mean full?)"),
    ({"gpu": ["h1000"]}, "unknown GPU 'h1000' (did you mean h100?)"),
    ({"bacth": ["8"]}, "unknown option 'bacth' (did you mean batch?)"),
    ({"batch": ["8", "16"]}, "batch is given 2 times"),
    ({"no-donate": ["maybe"]}, "'maybe' is not a switch value"),
    ({"arg.seq_len": ["nan"]}, "arg.seq_len='nan': give a finite number"),
    ({"arg.1x": ["3"]}, "'1x' is not an argument name"),
])
def test_a_value_the_cli_refuses_is_refused_with_its_message(params, words):
    with pytest.raises(query.BadQuery) as e:
        query.parse(params, START, MLP)
    assert words in str(e.value)


def test_options_that_name_files_are_pinned_to_the_start():
    for params in ({"rules": ["/etc/passwd"]}, {"no-cache": ["1"]}, {"arg.preset": ["/etc/passwd"]},
                   {"arg.preset": [""]}, {"arg.config": ["../secrets.json"]}):
        with pytest.raises(query.BadQuery, match="fixed for this explorer"):
            query.parse(params, START, MLP)
    # numbers and booleans move: no workload opens a file named by one
    assert dict(query.parse({"arg.depth": ["3"], "arg.fast": ["true"]}, START, MLP).model_args)["fast"] is True


def test_a_path_in_any_option_is_refused_or_only_a_pattern():
    """No option a request sets can make jaxmem open a file: a path is refused by its option's rule, or it
    lands in a regular expression (matched against parameter paths) -- never in a field read as a file."""
    accepted = []
    for name in query.FLAGS:
        try:
            o = query.parse({name: ["/etc/passwd"]}, START, MLP)
        except query.BadQuery:
            continue
        accepted.append(name)
        assert o.rules is None
    assert sorted(accepted) == ["freeze", "lora-targets", "remat-at"]


def _known(report: Report, batch: int, scale: dict[str, int]) -> predict.Known:
    """A compiled point at `batch` whose parts grow by `scale[part]` bytes a sample."""
    bd = {k: v + scale.get(k, 0) * batch for k, v in report.breakdown.items()}
    opts = dict(report.options, batch=batch)
    r = dataclasses.replace(report, breakdown=bd, per_device_peak_bytes=sum(bd.values()), options=opts,
                            tokens_per_step=batch * 2048)
    o = AnalyzeOptions(mesh="data=8", gpu="h100", batch=batch)
    return predict.Known(o, r, query.to_query(o))


def test_a_batch_prediction_fits_each_part_on_the_nearest_points_each_side():
    base = Report.from_json(json.loads(GOLDEN.read_text()))
    grow = {"activations_and_temporaries": 3_000_000, "batch": 4096}
    known = [_known(base, b, grow) for b in (8, 16, 64)]
    pred = predict.predict(AnalyzeOptions(mesh="data=8", gpu="h100", batch=32), known, None)
    exact = _known(base, 32, grow).report
    assert pred["breakdown"] == exact.breakdown                         # affine parts: exact by interpolation
    assert pred["per_device_peak_bytes"] == exact.per_device_peak_bytes
    assert [q["batch"] for q in pred["predicted_from"]] == ["16", "64"]   # one on each side
    assert pred["prediction"] == {"kind": "batch", "arg": None, "x": 32, "curve": "affine"}
    # judged as analyze judges it: against the card's usable bytes, the runtime's terms at both ends
    assert pred["verdict"] == "fits"
    assert pred["headroom_bytes"] == exact.target.usable_bytes - exact.per_device_peak_bytes
    # tokens/s per device as compare ranks rows by it (jaxmem.plan.throughput), the tokens scaled with the batch
    from jaxmem.plan import throughput

    assert pred["tokens_per_step"] == 32 * 2048
    assert predict.tokens_per_s(pred) == pytest.approx(throughput.of(exact).tokens_per_s, rel=1e-12)
    huge = predict.predict(AnalyzeOptions(mesh="data=8", gpu="h100", batch=80_000), known, None)
    assert huge["verdict"] == "does_not_fit" and huge["fits"] is False
    # a point that differs in anything but the batch is no neighbour
    assert predict.predict(AnalyzeOptions(mesh="data=8", gpu="h100", batch=32, remat="full"), known, None) is None


def test_a_sequence_prediction_is_quadratic_through_three_points():
    base = Report.from_json(json.loads(GOLDEN.read_text()))
    out = []
    for t in (256, 512, 1024):
        bd = dict(base.breakdown, activations_and_temporaries=base.breakdown["activations_and_temporaries"]
                  + 7 * t * t + 1000 * t)
        r = dataclasses.replace(base, breakdown=bd, per_device_peak_bytes=sum(bd.values()), sequence_length=t)
        o = AnalyzeOptions(mesh="data=8", gpu="h100", model_args=(("seq_len", t),))
        out.append(predict.Known(o, r, query.to_query(o)))
    pred = predict.predict(AnalyzeOptions(mesh="data=8", gpu="h100", model_args=(("seq_len", 768),)), out, "seq_len")
    want = base.breakdown["activations_and_temporaries"] + 7 * 768 * 768 + 1000 * 768
    assert pred["breakdown"]["activations_and_temporaries"] == want
    assert pred["prediction"]["curve"] == "quadratic"
    # two sequence points give no prediction: a line is not the curve
    assert predict.predict(AnalyzeOptions(mesh="data=8", gpu="h100", model_args=(("seq_len", 768),)), out[:2],
                           "seq_len") is None


def test_the_controls_offer_the_catalogue_and_the_seq_argument_where_the_model_takes_one():
    assert controls.seq_arg_of(MODELS / "llama.py") == "seq_len"
    assert controls.seq_arg_of(ROOT / "benchmarks" / "hf_configs" / "Qwen3-8B.json") == "seq_len"
    assert controls.seq_arg_of(MLP) is None
    presets = {p["label"]: p for p in controls.mesh_presets(16)}
    assert presets["HSDP"] == {"label": "HSDP", "mesh": "data=2,fsdp=8", "layout": "fsdp"}


class _HeldPool:
    """A pool whose jobs finish only when the test says so (no compile)."""

    def __init__(self):
        self.started, self.finished = [], []

    def submit(self, job):
        self.started.append(job)

    def next(self, timeout=None):
        time.sleep(0.01)
        return self.finished.pop(0) if self.finished else None

    def close(self):
        pass


def _settle(ex, want, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not want() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_neighbours_compile_only_while_idle_and_leave_a_worker_free():
    from jaxmem.explore.points import Explorer
    from jaxmem.plan import sweep

    pool = _HeldPool()
    ex = Explorer(MLP, START, jobs=2, make_pool=lambda n, executor, address: pool)
    try:
        a = ex.ask(dataclasses.replace(START, batch=8))
        _settle(ex, lambda: len(pool.started) == 1)
        time.sleep(0.3)
        assert [j.key for j in pool.started] == [a.key]   # no neighbour while the point asked for compiles
        pool.finished.append(sweep.Outcome(pool.started[0], None, "refused", "user_error"))
        _settle(ex, lambda: len(pool.started) == 2)
        time.sleep(0.3)
        assert a.status == "error" and len(pool.started) == 2    # then one neighbour; the other worker waits
        assert not ex.points[pool.started[1].key].asked            # for the next move
        b = ex.ask(dataclasses.replace(START, batch=64))
        _settle(ex, lambda: len(pool.started) == 3)
        assert pool.started[2].key == b.key and b.status == "compiling"
    finally:
        ex.close()


def test_a_point_an_earlier_explorer_compiled_answers_at_once_without_a_worker(tmp_path):
    """An exact answer is kept in the cache's store: a later explorer of the same model answers it as exact
    from the store (no job for it), byte-identical; a changed model (its file, or a file beside it) is another.
    (A copy of the MLP in its own folder: the module's server must not meet the stand-in report kept here.)"""
    from jaxmem.explore import points
    from jaxmem.explore.points import Explorer
    from jaxmem.plan import sweep

    model = tmp_path / "mlp.py"
    model.write_text(pathlib.Path(MLP).read_text())
    rep = Report.from_json(json.loads(GOLDEN.read_text()))
    pool = _HeldPool()
    ex = Explorer(str(model), START, jobs=1, make_pool=lambda n, executor, address: pool)
    try:
        a = ex.ask(dataclasses.replace(START, batch=8))
        _settle(ex, lambda: len(pool.started) == 1)
        pool.finished.append(sweep.Outcome(pool.started[0], rep, None, "ok"))
        _settle(ex, lambda: a.status == "exact")
        assert a.status == "exact" and not a.remembered
    finally:
        ex.close()
    later = _HeldPool()
    ex = Explorer(str(model), START, jobs=1, make_pool=lambda n, executor, address: later)
    try:
        t0 = time.perf_counter()
        b = ex.ask(dataclasses.replace(START, batch=8))
        answer = ex.answer(b)
        assert time.perf_counter() - t0 < 5   # from the store, not a compile (the claim is timed in benchmarks/)
        assert b.key == a.key and b.status == "exact" and b.remembered and answer["remembered"] is True
        assert answer["answer"] == "exact" and answer["report"] == rep.to_json()
        time.sleep(0.3)
        assert b.key not in [j.key for j in later.started]   # no worker traced it (its neighbours may compile)
    finally:
        ex.close()
    same = points.model_digest(model)
    assert same is not None and same != points.model_digest(MLP)
    (tmp_path / "helper.py").write_text("X = 1\n")   # what the model file may import
    assert points.model_digest(model) not in (same, None)
    edited = points.model_digest(model)
    model.write_text(model.read_text() + "\n# changed\n")
    assert points.model_digest(model) not in (same, edited, None)


# ------------------------------------------------------------------------------ the server

def test_the_exact_answer_is_analyze_json_byte_for_byte(srv):
    status, body, headers = get(srv, "/api/answer", {"wait": "exact"})
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert body["answer"] == "exact"
    assert body["command"] == (f"jaxmem analyze {MLP} --mesh data=1 --layout fsdp --precision fp32 --remat none "
                               "--arg preset=tiny --gpu h100")
    from jaxmem import cli

    r = CliRunner().invoke(cli.main, body["command"].split()[1:] + ["--json"], catch_exceptions=False)
    assert body["report"] == json.loads(r.output)
    status, saved, headers = get(srv, "/api/save", {"format": "json"})
    assert status == 200 and saved == r.output.encode()    # the download: the same bytes analyze prints
    assert headers["Content-Disposition"].startswith('attachment; filename="jaxmem-mlp-tiny-')


def test_a_batch_move_is_predicted_from_compiled_neighbours_then_exact(srv):
    for b in (8, 32):
        assert get(srv, "/api/answer", {"batch": b, "wait": "exact"})[1]["answer"] == "exact"
    status, body, _ = get(srv, "/api/answer", {"batch": 24})   # answered at once: the compile has not run
    assert status == 200 and body["answer"] == "predicted"   # (no neighbour of 8 or 32 is 24 to have compiled it)
    xs = sorted(int(q["batch"]) for q in body["report"]["predicted_from"])
    assert len(xs) == 2 and xs[0] < 24 < xs[1]   # interpolated between the nearest compiled on each side
    predicted = body["report"]["per_device_peak_bytes"]
    exact = get(srv, "/api/answer", {"batch": 24, "wait": "exact"})[1]
    assert exact["answer"] == "exact"
    peak = exact["report"]["per_device_peak_bytes"]
    assert exact["predicted_error"] == {"peak_bytes": predicted, "error_bytes": peak - predicted,
                                        "error_share": (peak - predicted) / peak}
    rows = get(srv, "/api/points")[1]
    assert [r["query"]["batch"] for r in rows if r["query"]["batch"] in ("8", "32", "24")] == ["8", "32", "24"]
    assert all(r["answer"] == "exact" and r["peak"] > 0 and r["verdict"] == "fits" for r in rows
               if r["query"]["batch"] in ("8", "32", "24"))


def test_a_compiled_point_answers_from_memory(srv):
    get(srv, "/api/answer", {"batch": 8, "wait": "exact"})
    status, body, _ = get(srv, "/api/answer", {"batch": 8})   # no wait: from memory, exact
    assert status == 200 and body["answer"] == "exact" and "progress" not in body


def test_refused_and_unknown_parameters_are_400_naming_them(srv):
    status, body, _ = get(srv, "/api/answer", {"batch": "-3"})
    assert status == 400
    assert body["error"] == "Invalid value for '--batch': -3 is not allowed: the global batch must be at least 1"
    status, body, _ = get(srv, "/api/answer", {"bacth": "3"})
    assert status == 400 and body["error"].startswith("unknown option 'bacth' (did you mean batch?)")
    assert get(srv, "/api/answer", {"rules": "/etc/passwd"})[0] == 400
    assert get(srv, "/api/points", {"batch": "8"})[0] == 400
    assert get(srv, "/api/save", {"format": "pdf"})[0] == 400
    assert get(srv, "/api/answer", {"wait": "forever"})[0] == 400
    assert get(srv, "/api/nothing")[0] == 404


def test_static_serves_only_the_pages_own_files(srv):
    for name in ("../server.py", "..%2Fserver.py", "%2e%2e/points.py", "server.py", "/etc/passwd", ""):
        assert get(srv, "/static/" + name)[0] == 404, name
    conn = http.client.HTTPConnection(*srv.server_address, timeout=30)
    conn.request("POST", "/api/answer", headers={"X-Jaxmem-Token": srv.token})
    assert conn.getresponse().status == 405
    conn.close()


def test_an_error_at_compile_time_is_an_error_answer_and_the_server_goes_on(srv):
    status, body, _ = get(srv, "/api/answer", {"batch": str(2**62), "wait": "exact"})
    assert status == 400 and "use a smaller --batch" in body["error"]   # analyze's refusal, before any compile
    from jaxmem.explore import server

    # a refusal only the worker meets (its admission skipped here): the point's error answer, the server goes on
    with server.running(srv.explorer, admit=lambda *a: None) as bare:
        status, body, _ = get(bare, "/api/answer", {"batch": str(2**62), "wait": "exact"})
        assert status == 200 and body["answer"] == "error" and body["error"]
        assert get(bare, "/api/answer", {"batch": 8})[1]["answer"] == "exact"


def test_many_concurrent_requests_each_get_their_answer(srv):
    get(srv, "/api/answer", {"batch": 8, "wait": "exact"})
    results: list = []

    def one(i):
        params = [{"batch": 8}, {"batch": "-1"}, {"frobnicate": "1"}, None][i % 4]
        path = "/api/points" if params is None else "/api/answer"
        results.append((i % 4, get(srv, path, params)[0]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(48)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted((i % 4, [200, 400, 400, 200][i % 4]) for i in range(48))


def test_a_client_that_leaves_mid_compile_leaves_the_server_serving(srv):
    s = socket.create_connection(srv.server_address)
    host = f"127.0.0.1:{srv.server_address[1]}"
    s.sendall(f"GET /api/answer?batch=40&wait=exact&token={srv.token} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    s.close()   # gone before the compile ends
    status, body, _ = get(srv, "/api/answer", {"batch": 40, "wait": "exact"})
    assert status == 200 and body["answer"] == "exact"


def test_controls_list_the_catalogue_and_the_start(srv):
    status, c, _ = get(srv, "/api/controls")
    assert status == 200
    names = [g["name"] for g in c["gpus"]]
    assert "h100" in names and "p5.48xlarge" in names and names.index("h100") < names.index("p5.48xlarge")
    assert "h100" in c["fp8_gpus"] and "a100-80g" not in c["fp8_gpus"]
    assert c["start"]["gpu"] == "h100" and c["start"]["arg.preset"] == "tiny"
    assert c["seq"] is None and c["batch"]["granule"] == 1
    assert {o["name"] for o in c["options"]} == set(query.FLAGS)


def test_save_html_and_png(srv):
    status, page, headers = get(srv, "/api/save", {"format": "html"})
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"<!DOCTYPE html>" in page
    status, png, headers = get(srv, "/api/save", {"format": "png"})
    assert status == 200 and headers["Content-Type"] == "image/png" and png[:8] == b"\x89PNG\r\n\x1a\n"


def test_advise_and_fit_start_in_the_background_and_say_so(srv):
    for route, kind in (("/api/advise", "advice"), ("/api/fit", "fit")):
        status, body, _ = get(srv, route, {"batch": 8})
        assert status == 200 and body["status"] == "running", body.get("error")   # the search compiles on: the request does not wait
        assert body["key"].endswith("--gpu h100")
        again = get(srv, route, {"batch": 8})[1]                # the same search, not a second one
        assert again["status"] == "running" or (again["status"] == "done" and kind in again)
        assert get(srv, route, {"batch": "0"})[0] == 400


# ------------------------------------------------------------------------------ the command


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"   # a zombie has ended (its reaper is not ours)
    except OSError:
        return False


def test_explore_serves_on_loopback_and_stops_cleanly_on_ctrl_c(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "jaxmem.cli", "explore", MLP, "--arg", "preset=tiny", "--gpu", "h100",
                          "--no-browser", "--jobs", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, cwd=ROOT)
    try:
        line = p.stdout.readline()
        assert line.startswith(f"jaxmem explore: serving {MLP} on http://127.0.0.1:"), line
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        token = line.split("?token=")[1].split()[0]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        conn.request("GET", f"/api/answer?wait=exact&token={token}")
        assert json.loads(conn.getresponse().read())["answer"] == "exact"
        conn.close()
        kids = descendants(p.pid)
        assert kids   # the worker (and its compile child)
        assert [d for d in os.listdir(tmp_path) if d.startswith("jaxmem-run-")]
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 130
        assert "stopped by SIGINT; temporary files removed" in p.stderr.read()
        deadline = time.monotonic() + 30   # the stop helper ends on its pipe's EOF, a moment later
        while [k for k in kids if _alive(k)] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [k for k in kids if _alive(k)]
        assert not [d for d in os.listdir(tmp_path) if d.startswith("jaxmem-run-")]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_explore_in_a_notebook_serves_the_page_inline_and_stops():
    import jaxmem

    with pytest.raises(jaxmem.UserError, match="unknown option 'bacth'"):
        jaxmem.explore(MLP, bacth=8)
    with pytest.raises(jaxmem.UserError, match="explore needs the model's path"):
        jaxmem.explore(lambda: None)
    ex = jaxmem.explore(MLP, args={"preset": "tiny"}, gpu="h100", jobs=1)
    try:
        assert ex.url.startswith("http://127.0.0.1:")
        assert f'<iframe src="{ex.url}"' in ex._repr_html_()
        url = urllib.parse.urlsplit(ex.url)
        conn = http.client.HTTPConnection("127.0.0.1", url.port, timeout=60)
        conn.request("GET", "/api/controls?" + url.query)   # the token the URL carries
        assert json.loads(conn.getresponse().read())["start"]["arg.preset"] == "tiny"
        conn.close()
    finally:
        ex.stop()
    assert ex.proc.returncode == 128 + signal.SIGTERM   # the command's own clean stop
