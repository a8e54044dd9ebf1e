"""The syncer's HTTP endpoints (atoll.live.syncer.endpoints) against the live syncer service in
this process: /metrics parses as Prometheus text and agrees with the syncer's own books,
/healthz answers, /status.json holds no secret, and a client that connects and sends nothing
does not stop a round from closing."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from atoll.live.syncer.endpoints import HttpEndpoints
from atoll.sim.world import ring_allreduce_bytes
from atoll.wire import PROTOCOL
from atoll.wire import atoll_pb2 as pb
from tests.helpers import SECRET
from tests.integration.test_reliability_service import MD, _merge_two, _wait


def _get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.status, r.read().decode()


def _samples(port: int) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(_get(port, "/metrics")[1]):
        for s in fam.samples:
            key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def test_metrics_agree_with_the_books_and_a_slow_client_holds_nothing(live):
    service, stub, died, _ = live
    http = HttpEndpoints(service.runtime, "127.0.0.1", 0)
    # a client that connects and never sends, opened before the round
    idle = socket.create_connection(("127.0.0.1", http.port))
    try:
        assert http.server.server_address[0] == "127.0.0.1"
        assert _get(http.port, "/healthz") == (200, "ok\n")
        streams = _merge_two(service, stub)
        _wait(lambda: service.proto.rounds_closed >= 1, "a round to close")
        next(streams[0])  # the update sent to both: bytes out, settled before the scrape
        next(streams[1])
        # the syncer counts an update's bytes once its last frame is taken from the stream: wait
        # for both learners' counts (the client can hold the update before the count is made)
        roster = service.runtime.roster
        _wait(lambda: [r.last for r in roster.rows.values()] == ["0@1"] * 2, "both counted")
        m = _samples(http.port)
        with service.lock:
            rounds, acct = service.proto.rounds_closed, dict(service.runtime.acct)
        assert rounds >= 1 and not died
        assert m["atoll_syncer_rounds_total"] == rounds
        assert m["atoll_syncer_received_bytes_total"] == acct["bytes_in"] > 0
        assert m["atoll_syncer_sent_bytes_total"] == acct["bytes_out"] > 0
        assert m["atoll_syncer_contributions_accepted_total"] == acct["accepted"] == 2
        assert m["atoll_syncer_useful_seconds_total"] == acct["useful_s"]
        assert m["atoll_syncer_round_latency_seconds_count"] == rounds
        assert m["atoll_syncer_learners_live"] == 2
        # goodput: useful seconds over (expected learners x the first join to the latest
        # contribution: metrics.Figures)
        window = acct["last_accepted"] - acct["first_join"]
        assert m["atoll_syncer_training_window_seconds"] == pytest.approx(window) and window > 0
        expected = max(service.runtime.opts.expect_learners, 1)
        want = min(acct["useful_s"] / (expected * window), 1.0)
        assert m["atoll_syncer_goodput_ratio"] == pytest.approx(want)
        assert m["atoll_syncer_tokens_total"] == 0  # no beat yet
        # the charts' history: one point per round closed, and the joins marked
        hist = json.loads(_get(http.port, "/history.json")[1])
        assert [p["rounds"] for p in hist["points"]] == list(range(1, rounds + 1))
        assert hist["points"][-1]["goodput"] == pytest.approx(want)
        assert sorted(m["kind"] for m in hist["marks"]) == ["joined", "joined"]
        status, body = _get(http.port, "/status.json")
        assert status == 200 and SECRET not in body and "secret" not in body.lower()
        st = json.loads(body)
        assert st["rounds"] == rounds and st["epoch"] == service.runtime.epoch
        assert (st["shard"], st["shards"]) == (0, 1)
        # each learner's own figures: its contribution's bytes, merged once at staleness 0
        rows = {r["id"]: r for r in st["learners"]}
        assert sum(r["bytes_in"] for r in rows.values()) == acct["bytes_in"]
        assert all((r["merged"], r["staleness"]) == (1, 0) for r in rows.values()), rows
        # and what went down to each: the bytes of its updates, the newest one's version
        assert sum(r["bytes_out"] for r in rows.values()) == acct["bytes_out"]
        assert all(r["last"] == "0@1" and r["ranks"] == 1 for r in rows.values()), rows
        assert all(r["reconnects"] == 0 and r["steps"] == 0 for r in rows.values()), rows
        # a beat's steps: the data-parallel equivalent counts them, and a reconnect is counted
        beat = pb.Beat(learner="L0", incarnation="L0", step=7, tokens=448, step_time=0.1)
        stub.Heartbeat(beat, metadata=MD, timeout=5)
        again = stub.Join(pb.Hello(protocol=PROTOCOL, learner="L0", incarnation="L0", ranks=4),
                          metadata=MD)  # fmt: skip
        next(again)
        st = json.loads(_get(http.port, "/status.json")[1])
        l0 = next(r for r in st["learners"] if r["id"] == "L0")
        assert (l0["steps"], l0["reconnects"], l0["ranks"]) == (7, 1, 4), l0
        workers = max(service.runtime.opts.expect_learners, 2)
        nbytes = service.proto.plan.nbytes_fp32()
        assert st["dp_bytes"] == 7 * ring_allreduce_bytes(nbytes, workers) > 0
        assert _samples(http.port)["atoll_syncer_data_parallel_bytes_total"] == st["dp_bytes"]
        # a session whose final beat came before its stream ended is a finish; one without is
        # a loss (the page and the report list them by kind)
        final = pb.Beat(learner="L0", incarnation="L0", step=8, tokens=512, final=True)
        assert stub.Heartbeat(final, metadata=MD, timeout=5).known
        again.cancel()
        for old in streams:  # L0's first session (replaced by its reconnect) and L1's
            old.cancel()

        def ends() -> list[tuple[str, str]]:
            marks = json.loads(_get(http.port, "/history.json")[1])["marks"]
            return sorted((m["learner"], m["kind"]) for m in marks
                          if m["kind"] in ("finished", "lost"))  # fmt: skip

        _wait(lambda: len(ends()) == 2, "both sessions to end")
        assert ends() == [("L0", "finished"), ("L1", "lost")]
    finally:
        idle.close()
        http.close()


def test_refusals_are_counted_by_reason_and_only_get_is_served(live):
    service, stub, _, _ = live
    http = HttpEndpoints(service.runtime, "127.0.0.1", 0)
    try:
        from atoll.core.events import Refused

        service.runtime.record(Refused(learner="L9", fragment=0, reason="stale"))
        service.runtime.record(Refused(learner="L9", fragment=1, reason="stale"))
        m = _samples(http.port)
        assert m["atoll_syncer_contributions_refused_total{reason=stale}"] == 2
        for method, path, code in (("POST", "/metrics", 501), ("GET", "/nothing", 404)):
            req = urllib.request.Request(f"http://127.0.0.1:{http.port}{path}", method=method)
            with pytest.raises(urllib.error.HTTPError) as exc:
                urllib.request.urlopen(req, timeout=5)
            assert exc.value.code == code
    finally:
        http.close()
