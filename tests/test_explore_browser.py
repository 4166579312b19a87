"""The explore page in a real browser (issue 45): headless Chromium, driven by Selenium through Debian's
chromedriver, loads the page `jaxmem explore` serves for a tiny model, moves the batch as a person does
(types a new value into the field), sees the prediction and then the exact answer that replaces it, and
reads the numbers off the page against `jaxmem analyze --json` run with the command line the page shows.

Skipped only where Chromium or its driver is not installed (CI installs both: .ci/run).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import urllib.request

import pytest
from browser import WAIT_S, chromium, explore
from conftest import ROOT

from jaxmem.units import fmt_bytes, fmt_seconds

pytestmark = pytest.mark.once   # the page and the server's HTTP, the same under every jax (.ci/run)

START = ["models/llama.py", "--arg", "preset=tiny", "--batch", "8", "--gpu", "h100"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The server's and analyze's environment: a compile cache of this test's own, so the point the browser
    moves to is compiled by that move (not answered from another test's cache) and analyze then reads it."""
    return {**os.environ, "JAXMEM_CACHE": str(tmp_path_factory.mktemp("explore-cache")), "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def url(env):
    """`jaxmem explore --no-browser` on a free port, as a person starts it; stopped with ^C (SIGINT)."""
    with explore(START, env) as u:
        yield u


@pytest.fixture(scope="module")
def browser():
    with chromium("--window-size=1440,1200") as driver:
        yield driver


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=WAIT_S) as r:
        return json.loads(r.read())


def _answers(driver, pattern: str) -> list[str]:
    """The kinds of answer (predicted, compiling, exact ...) the page received for the points whose key
    matches `pattern`, in the order it received them (the page records each: window.jaxmemExplore)."""
    hist = driver.execute_script("return window.jaxmemExplore.state.history")
    return [h["answer"] for h in hist if h["key"] and re.search(pattern, h["key"])]


def test_a_batch_typed_on_the_page_is_predicted_then_exact_and_its_numbers_are_analyze_json(url, browser, env,
                                                                                           monkeypatch):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    d = browser
    d.get(url)
    wait = WebDriverWait(d, WAIT_S, poll_frequency=0.05)
    wait.until(lambda d: d.find_element(By.ID, "answer").get_attribute("data-answer") == "exact")
    assert "--batch 8 " in d.find_element(By.ID, "command").text
    # the neighbour above compiled (the explorer compiles it while idle; asked here so the test need not wait
    # on idle time): batch 12 then lies between two compiled points, 8 and 16
    base, token = url.split("?token=")
    above = _get(base + f"api/answer?batch=16&wait=exact&token={token}")
    assert above["answer"] == "exact", above.get("error")

    field = d.find_element(By.CSS_SELECTOR, '.ctl[data-name="batch"] input')
    field.click()
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys("12")
    moved = r"--batch 12\b"
    wait.until(lambda d: "exact" in _answers(d, moved))
    seen = _answers(d, moved)
    assert seen[0] == "predicted" and seen[-1] == "exact", seen   # a prediction first, then the exact answer
    answer = d.find_element(By.ID, "answer")
    assert answer.get_attribute("data-answer") == "exact" and re.search(moved, answer.get_attribute("data-key"))
    assert d.find_element(By.ID, "state").text == "EXACT"
    landed = d.find_element(By.ID, "prediction-check")   # how far the prediction was, now that the exact is in
    assert "replaced the prediction" in landed.text and "batch 8" in landed.text and "batch 16" in landed.text

    command = d.find_element(By.ID, "command").text
    argv = shlex.split(command)
    assert argv[:2] == ["jaxmem", "analyze"] and argv[argv.index("--batch") + 1] == "12"
    from click.testing import CliRunner

    from jaxmem import cli

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("JAXMEM_CACHE", env["JAXMEM_CACHE"])   # the explorer's compile, read back
    out = CliRunner().invoke(cli.main, [*argv[1:], "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    rep = json.loads(out.output)

    peak = d.find_element(By.ID, "peak")
    assert peak.text == fmt_bytes(rep["per_device_peak_bytes"])          # as the CLI prints it
    assert peak.get_attribute("data-bytes") == str(rep["per_device_peak_bytes"])
    assert int(landed.get_attribute("data-exact")) == rep["per_device_peak_bytes"]
    for part in ("params", "gradients", "optimizer_state", "activations_and_temporaries", "runtime_overhead"):
        shown = d.find_element(By.CSS_SELECTOR, f'#legend [data-part="{part}"] .bytes').text
        assert shown == fmt_bytes(rep["breakdown"][part]), part
    assert d.find_element(By.ID, "verdict").get_attribute("data-verdict") == rep["verdict"]
    assert d.find_element(By.ID, "headroom").text == fmt_bytes(rep["headroom_bytes"])
    st = rep["step_time"]
    assert d.find_element(By.ID, "step").text == fmt_seconds(st["estimate_s"])
    assert d.find_element(By.ID, "band").text == f"{fmt_seconds(st['low_s'])}-{fmt_seconds(st['high_s'])}"
    devices = rep["target"]["devices"]
    tokens = rep["options"]["batch"] * rep["sequence_length"] / devices / st["estimate_s"]
    assert d.find_element(By.ID, "rate").text == f"{round(tokens):,}"
    shown_buffers = [r.find_element(By.CSS_SELECTOR, "td.num").text
                     for r in d.find_elements(By.CSS_SELECTOR, "#buffers tbody tr")]
    assert shown_buffers == [fmt_bytes(b["size"]) for b in rep["top_buffers"][:len(shown_buffers)]] and shown_buffers
    assert not [e for e in d.get_log("browser") if e["level"] == "SEVERE"]   # no script error, nothing failed to load
