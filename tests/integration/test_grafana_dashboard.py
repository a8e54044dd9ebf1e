"""deploy/grafana/atoll.json against the series a syncer exports: every PromQL expression of
every panel names only series that a syncer (and a shard set over it) serves on /metrics, so a
dashboard with a renamed or missing series fails here, not on a user's import."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from atoll.core.events import Evaluated, Refused
from atoll.live.syncer.endpoints import HttpEndpoints
from atoll.live.syncer.shard_endpoints import ShardSetEndpoints
from tests.integration.test_reliability_service import _merge_two, _wait

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "atoll.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
SERIES = re.compile(r"\batoll_[a-z0-9_]+")


def exported(port: int) -> set[str]:
    """The series names on a /metrics: its samples' and, for a family with none yet (a labelled
    counter before its first label), the names its type gives."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = set()
    for fam in text_string_to_metric_families(text):
        out |= {s.name for s in fam.samples}
        out |= {fam.name + suffix for suffix in SUFFIXES.get(fam.type, ("",))}
    return out


def expressions(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def missing(dashboard: dict, names: set[str]) -> list[tuple[str, str]]:
    """(expression, series) for each series an expression names that is not exported."""
    return [(e, n) for e in expressions(dashboard) for n in SERIES.findall(e) if n not in names]


def test_every_expression_in_the_dashboard_names_a_series_the_syncer_exports(live):
    service, stub, died, _ = live
    own = HttpEndpoints(service.runtime, "127.0.0.1", 0)
    page = ShardSetEndpoints("127.0.0.1", 0, [own.port], lambda name, exc: None)
    try:
        streams = _merge_two(service, stub)
        _wait(lambda: service.proto.rounds_closed >= 1, "a round to close")
        # the series that appear with their first event: a refusal, an evaluation
        service.runtime.record(Refused(learner="L9", fragment=0, reason="stale"))
        service.runtime.record(Evaluated(tokens=0, rounds=1, eval_loss=3.0, eval_s=0.1))
        names = exported(own.port) | exported(page.port)
        dashboard = json.loads(DASHBOARD.read_text())
        exprs = expressions(dashboard)
        assert len(exprs) >= 10 and all(SERIES.search(e) for e in exprs), exprs
        assert missing(dashboard, names) == []
        # every series the syncer exports about the run is on a panel
        shown = {n for e in exprs for n in SERIES.findall(e)}
        for name in (
            "goodput_ratio",
            "received_bytes_total",
            "sent_bytes_total",
            "tokens_total",
            "rounds_total",
            "data_parallel_bytes_total",
            "eval_loss",
        ):
            assert f"atoll_syncer_{name}" in shown, name
        # and the check fails a dashboard naming a series that is not served (an old name)
        old = json.loads(DASHBOARD.read_text().replace("received_bytes_total", "bytes_in_total"))
        assert {n for _, n in missing(old, names)} == {"atoll_syncer_bytes_in_total"}
        assert not died
        for s in streams:
            s.cancel()
    finally:
        page.close()
        own.close()
