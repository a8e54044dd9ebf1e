"""The syncer's status page in a real browser: headless Chromium (Debian's chromium and
chromedriver; scripts/test.sh installs them) opens `/` of a syncer with two learners training,
finds both in the learner table, sees a value update, and the charts drawn; a screenshot is
saved in the test's directory. `/metrics`, `/status.json` and `/healthz` are in
tests/integration/test_http_endpoints.py."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import RUN, SECRET, syncer_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "ATOLL_SECRET": SECRET, "OMP_NUM_THREADS": "1"}
SETS = ["--set", "learners=2", "--set", "steps=400"]
# pixels in colour on a canvas: the lines, dots and cells drawn (its label is grey, not counted)
INK = """const c = document.getElementById(arguments[0]), d = c.getContext('2d')
  .getImageData(0, 0, c.width, c.height).data; let n = 0;
for (let i = 0; i < d.length; i += 4)
  if (Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]) > 60) n++;
return n;"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _browser():
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.fail("chromium and chromedriver are needed (scripts/test.sh installs them as root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1100,1000"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def test_the_status_page_shows_the_learners_live_in_a_browser(tmp_path):
    http = _free_port()
    argv = ["--http-port", str(http), "--serve-after-budget", *SETS]  # the page stays up
    proc, addr = syncer_process(tmp_path, argv, ENV, ROOT)
    learners = []
    driver = None
    try:
        for i in range(2):
            cmd = [sys.executable, "-m", "atoll.cli", "learner", *SETS, "--syncer", addr,
                   "--index", str(i), "--run-id", RUN]  # fmt: skip
            log = open(tmp_path / f"L{i}.log", "wb")  # noqa: SIM115 - the process writes it
            learners.append(subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=log, stderr=log))
        driver = _browser()
        driver.get(f"http://127.0.0.1:{http}/")

        def rows() -> list[str]:  # read in the page (it redraws every second)
            return driver.execute_script(
                "return [...document.querySelectorAll('#learners tbody tr')].map(r => r.innerText)"
            )

        def rounds() -> str:
            return driver.execute_script(
                "const e = document.getElementById('rounds'); return e ? e.textContent : ''"
            )

        until = time.time() + 120
        while len(rows()) < 2 or rounds() in ("", "0"):
            assert time.time() < until, driver.page_source[-2000:]
            time.sleep(0.5)
        assert {r.split()[0] for r in rows()} == {"L0", "L1"}

        def cells() -> list[list[str]]:
            return driver.execute_script(
                "return [...document.querySelectorAll('#learners tbody tr')]"
                ".map(r => [...r.cells].map(c => c.innerText))"
            )

        def filled(c: list[str]) -> bool:  # island size, the newest update sent, MB up / down
            mb_down = float(c[11].split("/")[1])  # 0.00 until a few updates went down
            return c[2] == "1" and bool(re.fullmatch(r"\d+@\d+", c[7])) and mb_down > 0

        while not all(filled(c) for c in cells()):
            assert time.time() < until, cells()
            time.sleep(0.5)
        assert driver.execute_script("return document.getElementById('budget') !== null")
        first = rounds()
        while rounds() == first:  # a value updates
            assert time.time() < until
            time.sleep(0.5)
        time.sleep(2.5)  # a few polls: the time charts have points

        def evals() -> int:
            return driver.execute_script("return document.getElementById('lossnote')"
                                         ".textContent === '' ? 1 : 0")  # fmt: skip

        while not evals():  # the syncer's first held-out evaluation, at 1/8 of the budget
            assert time.time() < until, driver.page_source[-2000:]
            time.sleep(0.5)
        until = time.time() + 90  # the loss chart is a line from the second evaluation
        for canvas in ("goodput", "tokens", "strip", "loss"):
            while driver.execute_script(INK, canvas) <= 100:  # drawn, not blank
                assert time.time() < until, (canvas, driver.execute_script(INK, canvas))
                time.sleep(0.5)
        driver.save_screenshot(str(tmp_path / "status_page.png"))
        assert (tmp_path / "status_page.png").stat().st_size > 10_000
        assert SECRET not in driver.page_source
    finally:
        if driver is not None:
            driver.quit()
        for p in learners:
            p.kill()
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0].decode()
    # `atoll syncer` with stdout on a pipe: its plain view lines, every few seconds
    lines = [ln for ln in out.splitlines() if ln.startswith("[atoll syncer] tokens")]
    assert lines and re.search(r"rounds [1-9]\d* .*eval \d+\.\d{4} at", lines[-1]), out[-3000:]
