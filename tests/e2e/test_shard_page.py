"""The shard set's endpoints as processes: `atoll syncer --shards 2 --http-port P` serves the
whole set on P (each shard its own on P+1+i) while two built-in learners train. The set's
/metrics parses with every shard's series labelled, the shards' rounds add up to the set's,
the page in headless Chromium has a row per shard, a killed shard is shown down (on
/status.json and as atoll_syncer_shard_up 0) while the page still answers, and at the end the
set's figures are those of its syncer_final.json."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from atoll.eventlog import read_events
from atoll.live.address import free_port
from tests.e2e.test_shards import ENV, ROOT, SETS, _learner, _shard_pid, _syncer_cli, end_set
from tests.e2e.test_status_page import _browser
from tests.helpers import syncer_process

pytestmark = pytest.mark.slow


def _get(port: int, path: str) -> tuple[str, float]:
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        assert r.status == 200
        return r.read().decode(), time.monotonic() - t0


def _status(port: int) -> dict:
    return json.loads(_get(port, "/status.json")[0])


def _metrics(port: int) -> dict[tuple[str, str], float]:
    """(sample name, shard) -> value, of the series without other labels; shard_up too."""
    out = {}
    for fam in text_string_to_metric_families(_get(port, "/metrics")[0]):
        for s in fam.samples:
            if set(s.labels) == {"shard"}:
                out[(s.name, s.labels["shard"])] = s.value
    return out


def _down(port: int, shard: int) -> dict | None:
    st = _status(port)
    return None if st["shards"][shard]["up"] else st


def _until(cond, what: str, within: float = 60.0):
    until = time.time() + within
    while not (got := cond()):
        assert time.time() < until, f"timed out waiting for {what}"
        time.sleep(0.2)
    return got


def _in_a_browser(port: int, tmp_path) -> None:
    """The page in headless Chromium: one row per shard, both up, and both learners."""
    driver = _browser()
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        rows = "return [...document.querySelectorAll('#%s tbody tr')].map(r => r.innerText)"

        def shown() -> bool:
            shards, learners = (
                driver.execute_script(rows % "shards"),
                driver.execute_script(rows % "learners"),
            )
            return len(shards) == 2 and len(learners) == 2

        _until(shown, "the page's shard rows", 30)
        shards = driver.execute_script(rows % "shards")
        assert [r.split()[:2] for r in shards] == [["0", "up"], ["1", "up"]], shards
        assert "2 shards" in driver.find_element("id", "who").text
        driver.save_screenshot(str(tmp_path / "shard_page.png"))
    finally:
        driver.quit()


def test_the_set_page_sums_its_shards_shows_a_killed_one_down_and_ends_as_its_books(tmp_path):
    http = free_port("127.0.0.1", 3)
    # --serve-after-budget: the set's figures are read once the learners have left
    argv = ["--shards", "2", "--http-port", str(http), "--serve-after-budget", *SETS]
    proc, addr = syncer_process(tmp_path, argv, ENV, ROOT)
    learners = [_learner(addr, i, tmp_path) for i in range(2)]
    try:
        _until(lambda: all(r["rounds"] for r in _status(http)["shards"]), "both shards merging")
        own = json.loads(_get(http + 2, "/status.json")[0])  # shard 1's own endpoints
        assert own["shard"] == 1 and own["rounds"] > 0
        m = _metrics(http)
        assert m[("atoll_syncer_shard_up", "0")] == m[("atoll_syncer_shard_up", "1")] == 1
        _in_a_browser(http, tmp_path)
        assert m[("atoll_syncer_round_latency_seconds_count", "1")] >= 1

        for _ in range(3):  # killed; again if it was back before /metrics was read
            os.kill(_shard_pid(1, tmp_path), signal.SIGKILL)
            st = _until(lambda: _down(http, 1), "shard 1 shown down", 10)
            page, took = _get(http, "/")
            m = _metrics(http)
            if m[("atoll_syncer_shard_up", "1")] == 0:
                break
        assert m[("atoll_syncer_shard_up", "1")] == 0 and m[("atoll_syncer_shard_up", "0")] == 1
        assert ("atoll_syncer_rounds_total", "1") not in m and (
            "atoll_syncer_rounds_total",
            "0",
        ) in m
        assert st["shards"][0]["up"] and st["shards"][1]["rounds"] > 0  # its last figures
        assert st["rounds"] == sum(r["rounds"] for r in st["shards"])
        assert "shardSet" in page and took < 3.0
        back = _until(lambda: (s := _status(http))["shards"][1]["up"] and s, "shard 1 back", 60)
        # listed by kind: the shard down, then restored
        kinds = [m["kind"] for m in back["marks"] if m.get("shard") == 1 and not m["learner"]]
        assert kinds[-2:] == ["shard down", "shard restored"], back["marks"]

        for p in learners:
            assert p.wait(150) == 0, (tmp_path / "L0.log").read_text()[-3000:]
        keys = ("rounds", "accepted", "refused", "bytes_in", "bytes_out", "tokens")
        last: list = []

        def settled() -> dict | None:  # two reads a second apart with the same figures
            st = _status(http)
            now = [st[k] for k in keys] + [r["up"] for r in st["shards"]]
            same = now == last and all(r["up"] for r in st["shards"])
            last[:] = now
            time.sleep(1.0)
            return st if same else None

        st = _until(settled, "the set's figures to settle", 30)
        m = _metrics(http)
        for name, key in (("atoll_syncer_rounds_total", "rounds"),
                          ("atoll_syncer_contributions_accepted_total", "accepted"),
                          ("atoll_syncer_received_bytes_total", "bytes_in")):  # fmt: skip
            per_shard = [m[(name, str(i))] for i in range(2)]
            assert sum(per_shard) == st[key], (name, per_shard, st[key])
            assert per_shard == [r[key] for r in st["shards"]]
        assert m[("atoll_syncer_tokens_total", "0")] == st["tokens"]  # the home shard's
        # the whole model's evaluations are the supervisor's (no shard evaluates): the page's
        # loss chart has those in the set's event stream, /metrics the latest
        evaluated = [e["data"] for e in read_events(tmp_path / "events.jsonl")
                     if e["kind"] == "evaluated"]  # fmt: skip
        assert st["evals"] and len(st["evals"]) <= len(evaluated)
        losses = [e["eval_loss"] for e in evaluated]
        assert [e["loss"] for e in st["evals"]] == losses[: len(st["evals"])]
        text = _get(http, "/metrics")[0]
        assert f"atoll_syncer_eval_loss {float(st['evals'][-1]['loss'])!r}" in text, text[-800:]
    finally:
        end_set(proc, learners)
    books = json.loads((tmp_path / "syncer_final.json").read_text())
    for k in ("rounds", "accepted", "refused", "bytes_in", "bytes_out"):
        assert books[k] == st[k], (k, books[k], st[k])
    assert sum(books["tokens"].values()) == st["tokens"]
    assert books["useful_s"] == pytest.approx(st["useful_s"])
    assert books["versions"] == st["versions"] and min(st["versions"]) > 0


def test_an_http_port_in_use_stops_the_set_with_one_line_before_any_shard_starts(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = _syncer_cli("--run-dir", str(tmp_path / "r"), "--shards", "2", "--http-port",
                          str(port))  # fmt: skip
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert f"http-port={port}" in lines[0] and "in use" in lines[0]
    assert not (tmp_path / "r" / "shard-0").exists()  # no shard was started
