"""A shard set's endpoints (atoll.live.syncer.shard_endpoints) over real shard endpoints: shard 0
is the live syncer service in this process with its own endpoints, shard 1 a socket that takes
connections and never answers (a stopped shard), shard 2 a port nobody listens on (a shard
restarting). The set's /metrics parses again with every series labelled by shard, the silent
and the absent shard are shown down within the read timeout, and the page still answers."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from atoll.live.syncer.endpoints import HttpEndpoints
from atoll.live.syncer.shard_endpoints import FETCH_TIMEOUT_S, ShardSetEndpoints
from tests.integration.test_reliability_service import _merge_two, _wait


def _get(port: int, path: str) -> tuple[int, str, float]:
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.status, r.read().decode(), time.monotonic() - t0


def test_the_set_relabels_each_shards_series_and_shows_a_silent_or_absent_shard_down(live):
    service, stub, died, _ = live
    own = HttpEndpoints(service.runtime, "127.0.0.1", 0)
    silent = socket.socket()  # listens, never accepts: a connect succeeds, no answer comes
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        absent = s.getsockname()[1]  # closed again: connections are refused
    deaths: list[str] = []
    ports = [own.port, silent.getsockname()[1], absent]
    page = ShardSetEndpoints("127.0.0.1", 0, ports, lambda name, exc: deaths.append(name))
    try:
        streams = _merge_two(service, stub)
        _wait(lambda: service.proto.rounds_closed >= 1, "a round to close")
        code, body, took = _get(page.port, "/metrics")
        assert code == 200 and took < 2 * FETCH_TIMEOUT_S + 1.0  # the silent shard cost 1 s
        fams = {f.name: f for f in text_string_to_metric_families(body)}
        up = {s.labels["shard"]: s.value for s in fams["atoll_syncer_shard_up"].samples}
        assert up == {"0": 1, "1": 0, "2": 0}
        with service.lock:
            rounds, accepted = service.proto.rounds_closed, service.runtime.acct["accepted"]
        # each shard's series with its label, and the set's own without one (the sums)
        rows = fams["atoll_syncer_rounds"].samples
        got = {(r.name, r.labels.get("shard")): r.value for r in rows}
        assert got == {("atoll_syncer_rounds_total", "0"): rounds,
                       ("atoll_syncer_rounds_total", None): rounds}  # fmt: skip
        for name in ("atoll_syncer_goodput_ratio", "atoll_syncer_training_window_seconds"):
            g = {r.labels.get("shard"): r.value for r in fams[name].samples}
            assert set(g) == {"0", None} and g[None] == pytest.approx(g["0"])
        assert g[None] > 0  # the window: the first join to the latest contribution
        assert fams["atoll_syncer_contributions_accepted"].samples[0].value == accepted == 2
        hist = fams["atoll_syncer_round_latency_seconds"]
        assert hist.type == "histogram"
        count = [s for s in hist.samples if s.name.endswith("_count")]
        assert [(s.labels, s.value) for s in count] == [({"shard": "0"}, rounds)]
        info = fams["atoll_syncer_info"].samples[0].labels
        assert info["shard"] == "0" and info["shards"] == "1"

        code, body, took = _get(page.port, "/status.json")
        assert code == 200 and took < 2 * FETCH_TIMEOUT_S + 1.0
        st = json.loads(body)
        assert [(r["shard"], r["up"]) for r in st["shards"]] == [(0, True), (1, False), (2, False)]
        assert st["shards"][1]["age_s"] is None  # never answered: no figures
        assert st["rounds"] == st["shards"][0]["rounds"] >= 1
        assert {row["id"] for row in st["learners"]} == {"L0", "L1"}
        assert "secret" not in body.lower()
        assert _get(page.port, "/")[:2][0] == 200 and "shardSet" in _get(page.port, "/")[1]
        assert _get(page.port, "/healthz")[:2] == (200, "ok\n")
        assert not deaths and not died
        for s in streams:
            s.cancel()
    finally:
        page.close()
        own.close()
        silent.close()


def test_the_serving_thread_dying_is_reported_to_its_owner(monkeypatch):
    from atoll.live.syncer import endpoints

    def broken(self, poll_interval=0.5):
        raise RuntimeError("the serving loop broke")

    monkeypatch.setattr(endpoints._Server, "serve_forever", broken)
    deaths: list[tuple[str, str]] = []
    done = threading.Event()

    def on_death(name: str, exc: BaseException) -> None:
        deaths.append((name, str(exc)))
        done.set()

    page = ShardSetEndpoints("127.0.0.1", 0, [1], on_death)
    try:
        assert done.wait(5) and deaths == [("shard-set-http", "the serving loop broke")]
    finally:
        page.server.server_close()
        page.reader.close()
