"""What the browser tests share: headless Chromium through Debian's chromedriver, and `jaxmem explore` started as a
person starts it (its printed URL, stopped with ^C). The tests using them are skipped only where Chromium or its
driver is not installed (CI installs both: .ci/run)."""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from conftest import ROOT

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
DRIVER = shutil.which("chromedriver")
WAIT_S = 180          # an upper bound for a loaded machine, never a timing being tested


@contextlib.contextmanager
def chromium(*arguments: str) -> Iterator:
    """A headless Chromium driven by Selenium (the page's own window size and flags in `arguments`)."""
    if not (CHROMIUM and DRIVER):
        pytest.skip("Chromium and chromedriver are not installed (Debian: apt-get install chromium chromium-driver; "
                    ".ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", *arguments):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


@contextlib.contextmanager
def explore(start: list[str], env: dict[str, str], *, url=r"http://127\.0\.0\.1:\d+/\?token=[\w-]+") -> Iterator[str]:
    """`jaxmem explore START --no-browser --jobs 2` in the checkout: yields the URL it prints (with its token); stopped
    with ^C (SIGINT) as a person stops it, killed only if it outlives a minute."""
    proc = subprocess.Popen([sys.executable, "-m", "jaxmem.cli", "explore", *start, "--no-browser", "--jobs", "2"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    found: list[str] = []
    lines: list[str] = []
    ready = threading.Event()

    def read():   # the URL it prints; the rest is kept for a failure's message
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            m = re.search(url, line)
            if m and not found:
                found.append(m.group(0))
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(WAIT_S)
    try:
        assert found, f"jaxmem explore printed no URL:\n{''.join(lines)}"
        yield found[0]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
