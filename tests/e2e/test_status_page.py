"""The syncer's status page in a real browser: headless Chromium (Debian's chromium and
chromedriver; scripts/test.sh installs them) opens `/` of a syncer late, with half the budget
spent and two learners training: both are in the learner table with their tokens/s, every
column has a tooltip, the goodput and tokens charts hold the whole run from its first round
(/history.json), the joins are listed by kind, and every chart is drawn; a screenshot is saved
in the test's directory (docs/status_page.png is one). `/metrics`, `/status.json` and
`/healthz` are in tests/integration/test_http_endpoints.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from atoll.live.address import free_port
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


def _status(port: int, path: str = "/status.json") -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


def test_the_status_page_opened_late_draws_the_whole_run_in_a_browser(tmp_path):
    http = free_port()
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
        # the page is opened late: half the budget spent, two held-out losses taken
        until = time.time() + 180
        while (st := _status(http))["tokens"] < st["token_budget"] / 2 or len(st["evals"]) < 2:
            assert time.time() < until, st
            time.sleep(0.5)
        driver = _browser()
        driver.get(f"http://127.0.0.1:{http}/")

        def cells() -> list[list[str]]:  # read in the page (it redraws every second)
            return driver.execute_script(
                "return [...document.querySelectorAll('#learners tbody tr')]"
                ".map(r => [...r.cells].map(c => c.innerText))"
            )

        def filled(c: list[str]) -> bool:  # island size, tokens/s, the newest update sent
            return c[2] == "1" and int(c[6].replace(",", "")) > 0 and "@" in c[7]

        until = time.time() + 60
        while len(rows := cells()) < 2 or not all(filled(c) for c in rows):
            assert time.time() < until, rows
            time.sleep(0.3)
        assert {c[0] for c in rows} == {"L0", "L1"}
        # every column explained
        tips = driver.execute_script(
            "return [...document.querySelectorAll('#learners th')].map(h => h.title)"
        )
        assert len(tips) == 12 and all(tips), tips
        # the goodput and tokens charts hold the run from its first round, not from the
        # moment the page opened
        drawn = driver.execute_script("return window.atollHistory || []")
        hist = _status(http, "/history.json")["points"]  # read after: it only grew since
        assert len(drawn) >= 20 and drawn[0]["rounds"] == 1, drawn[:3]
        assert [p["t"] for p in drawn] == [p["t"] for p in hist[: len(drawn)]]
        assert drawn[-1]["tokens"] >= st["token_budget"] / 2
        marks = driver.execute_script(
            "return [...document.querySelectorAll('#marks li')].map(l => l.innerText)"
        )
        assert sum(" joined L" in m for m in marks) == 2, marks
        assert driver.execute_script("return document.getElementById('budget') !== null")
        for canvas in ("goodput", "tokens", "strip", "loss"):
            assert driver.execute_script(INK, canvas) > 100, canvas  # drawn, not blank
        driver.save_screenshot(str(tmp_path / "status_page_late.png"))
        assert (tmp_path / "status_page_late.png").stat().st_size > 10_000
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
