"""The syncer's read-only HTTP endpoints (`atoll syncer --http-port`): the status page `/`
(page.py), `/metrics` in the Prometheus text format, `/healthz`, `/status.json` and
`/history.json` (the charts' points for the whole run: chart_history.py).

The run's figures are metrics.Figures (tokens, rounds, bytes, goodput and its window), the one
fold every surface of a run reads; the series, by the Prometheus conventions (docs/live.md):

    atoll_syncer_rounds_total               rounds closed (merges), restarts included
    atoll_syncer_contributions_accepted_total
    atoll_syncer_contributions_refused_total{reason}   refused by this process, by reason
    atoll_syncer_received_bytes_total       contribution bytes accepted
    atoll_syncer_sent_bytes_total           update bytes sent (the books: syncer_final.json)
    atoll_syncer_useful_seconds_total       step-seconds in accepted contributions
    atoll_syncer_goodput_ratio              useful seconds / (expected learners x the training
                                            window: the first join to the latest contribution)
    atoll_syncer_training_window_seconds    that window
    atoll_syncer_tokens_total               tokens the learners report (the budget's count)
    atoll_syncer_token_budget               the budget (0: none)
    atoll_syncer_data_parallel_bytes_total  what a data-parallel ring all-reduce of fp32
                                            gradients would have sent for the learners' steps
    atoll_syncer_learners_live              live sessions
    atoll_syncer_eval_loss                  the global model's latest held-out loss
                                            (syncer/evaluation.py), when evaluated
    atoll_syncer_round_latency_seconds      histogram: quorum wait + grace of each round
    atoll_syncer_quorum_wait_seconds_total / _grace_seconds_total
    atoll_syncer_info{epoch,shard,shards}   1

Every figure but the histogram, the waits and the refusal reasons (counted from events by
this process, since it started) is read from the books under the runtime's lock, a few
numbers copied; the page is rendered and written with no lock held. Each connection has a
socket timeout and at most MAX_CLIENTS are served at once (the next is closed unanswered),
so a slow or hostile client holds only its own thread. No secret is on any page.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from atoll import metrics
from atoll.bandwidth.model import ring_allreduce_bytes
from atoll.core.events import FINISHED, Evaluated, Event, Joined, Lost, Refused, RoundClosed
from atoll.live.syncer.chart_history import ChartHistory, TokenRates, replayed
from atoll.live.syncer.page import PAGE
from atoll.threads import guarded

if TYPE_CHECKING:
    from atoll.live.syncer.runtime import SyncerRuntime

MAX_CLIENTS = 16
TIMEOUT_S = 5.0
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
MAX_REASONS = 32  # refusal reasons kept as labels; the rest count as "other"
RECENT_ROUNDS = 60  # rounds on the status page's participation strip
RECENT_MARKS = 50  # failures (lost) and (re)joins listed on it
EVALS = 500  # held-out losses on the page's loss chart
INFO_LABELS = ["epoch", "shard", "shards"]


class SyncerMetrics:
    """The metrics of one syncer process: `observe` is called with every event the runtime
    accounts (its lock held: a few additions), `status` reads the runtime when scraped."""

    def __init__(self, rt: SyncerRuntime) -> None:
        self.rt = rt
        self.registry = CollectorRegistry(auto_describe=True)
        p = "atoll_syncer_"
        self.refused = Counter(
            p + "contributions_refused", "contributions refused, by reason", ["reason"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            p + "round_latency_seconds", "quorum wait + grace of each round closed",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.quorum = Counter(p + "quorum_wait_seconds", "quorum waits", registry=self.registry)
        self.grace = Counter(p + "grace_seconds", "grace waits", registry=self.registry)
        self._reasons: set[str] = set()
        self.registry.register(_Books(self))
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_ROUNDS)  # the page's strip
        self.marks: deque[dict[str, Any]] = deque(maxlen=RECENT_MARKS)  # failures, rejoins
        self.evals: deque[dict[str, Any]] = deque(maxlen=EVALS)  # the loss chart's points
        self.history = ChartHistory()  # the goodput and tokens charts' points
        self.rates = TokenRates()
        self.model_bytes = rt.plan.nbytes_fp32()
        self._joined: set[str] = set()
        if rt.restored.found and rt.opts.shard.count == 1:  # (a set's shards share one log)
            self._replay()
        if rt.restored.found:
            self.marks.append({"t": time.time(), "kind": "restored", "learner": "syncer"})
        rt.observers.append(self.observe)

    def _replay(self) -> None:
        """A restarted syncer: the charts, marks and evaluations of the run before its restart,
        from the run's event log (the refusals by reason count this process's only)."""
        from atoll.eventlog import load_events

        if self.rt.events.path is None:
            return
        events = load_events(self.rt.events.path)
        self.history = replayed(events, max(self.rt.opts.expect_learners, 1))
        for e in events:
            if isinstance(e.data, Evaluated | Lost | Joined):
                self.observe(e)

    def figures(self) -> metrics.Figures:
        """The run's figures (lock held)."""
        rt = self.rt
        return rt.books.figures(rt.proto.rounds_closed, rt.opts.expect_learners)

    def observe(self, e: Event) -> None:
        match e.data:
            case Evaluated():
                self.evals.append(eval_row(e.t, e.data))
            case Refused(reason=reason):
                if reason not in self._reasons and len(self._reasons) >= MAX_REASONS:
                    reason = "other"
                self._reasons.add(reason)
                self.refused.labels(reason=reason).inc()
            case RoundClosed(quorum_wait_s=q, grace_s=g):
                self.latency.observe(max(q, 0.0) + max(g, 0.0))
                self.quorum.inc(max(q, 0.0))
                self.grace.inc(max(g, 0.0))
                d = e.data
                self.recent.append(
                    {"t": e.t, "fragment": d.fragment, "participants": list(d.participants)}
                )
                self.history.add(e.t, self.figures())  # the core counted the round already
            case Lost(learner=lid, why=why):
                kind = "finished" if why == FINISHED else "lost"
                self.marks.append({"t": e.t, "kind": kind, "learner": lid, "why": why})
            case Joined(learner=lid):
                kind = "healed" if lid in self._joined else "joined"
                self._joined.add(lid)
                self.marks.append({"t": e.t, "kind": kind, "learner": lid})

    def _dp_bytes(self) -> int:
        """What a data-parallel ring all-reduce of fp32 gradients would have sent for the
        learners' steps: each learner's step one worker's step, as many workers as learners
        expected (or live, if more); lock held."""
        rt = self.rt
        workers = max(rt.opts.expect_learners, len(rt.sessions), 1)
        return rt.roster.total_steps() * ring_allreduce_bytes(self.model_bytes, workers)

    def status(self) -> dict[str, Any]:
        """What /status.json shows, and the books /metrics reads (copied under the lock)."""
        rt, now = self.rt, time.time()
        with rt.lock:
            a = rt.acct
            s = {
                "run_id": rt.opts.run_id,
                "epoch": rt.epoch,
                "shard": rt.opts.shard.index,
                "shards": rt.opts.shard.count,
                **self.figures().as_dict(),
                "versions": list(rt.proto.version),
                "learners_live": len(rt.sessions),
                "learners_expected": rt.opts.expect_learners,
                "dp_bytes": self._dp_bytes(),
                "token_budget": rt.opts.token_budget,
                "refused": a["refused"],
                "bytes_out": a["bytes_out"],
                "restarts": a.get("restarts", 0),
                "start": a.get("start_at") or a["start"],
                "learners": [self._row(lid, x, now) for lid, x in sorted(rt.sessions.items())],
                "quiet_after_s": rt.opts.lost_after_s / 2,  # the page turns an age red past it
                "recent_rounds": list(self.recent),
                "marks": list(self.marks),
                "evals": list(self.evals),
                "finished": rt.stop_requested,
            }
            self.rates.keep({f"{x['id']}/{x['incarnation']}" for x in s["learners"]})
        return s

    def _row(self, lid: str, sess: Any, now: float) -> dict[str, Any]:
        """A live learner's row (lock held): its roster figures, tokens and tokens/s."""
        rt, key = self.rt, f"{lid}/{sess.incarnation}"
        tokens = int(rt.acct["tokens"].get(key, 0))
        return {
            "id": lid,
            "incarnation": sess.incarnation,
            "age_s": round(now - sess.last_seen, 2),
            "tokens": tokens,
            "tokens_per_s": round(self.rates.rate(key, sess.last_seen, tokens), 1),
            **(rt.roster.rows[lid].row() if lid in rt.roster.rows else {}),
        }

    def history_json(self) -> dict[str, Any]:
        """/history.json: the charts' points for the whole run, and the marks on them."""
        with self.rt.lock:
            return {"points": self.history.series(), "marks": list(self.marks)}


def eval_row(t: float, e: Evaluated) -> dict[str, Any]:
    """An evaluation as the page's loss chart reads it: a loss that is not finite (a run
    diverging) is null, which JSON can say (NaN it cannot: the page would stop parsing)."""
    loss = e.eval_loss if math.isfinite(e.eval_loss) else None
    return {"t": t, "tokens": e.tokens, "rounds": e.rounds, "loss": loss}


def eval_gauge(evals: Any) -> Any:
    """`atoll_syncer_eval_loss`: the latest evaluation's loss (NaN when it was not finite)."""
    if evals:
        loss = evals[-1]["loss"]
        yield GaugeMetricFamily(
            "atoll_syncer_eval_loss", "the latest held-out loss", math.nan if loss is None else loss
        )


class _Books:
    """The figures read from the books at each scrape."""

    def __init__(self, m: SyncerMetrics) -> None:
        self.m = m

    def describe(self) -> list:
        return []

    def collect(self) -> Any:
        s = self.m.status()
        yield from series(s)
        yield from info_series(s)
        what = "thread CPU seconds by step (live/syncer/cpu.py)"
        cpu = CounterMetricFamily("atoll_syncer_cpu_seconds", what, labels=["step"])
        for step, seconds in self.m.rt.cpu.read().items():
            cpu.add_metric([step], seconds)
        yield cpu


def series(s: dict[str, Any], labels: dict[str, str] | None = None) -> Any:
    """The run's figures of a /status.json (`s`) as metric families (`labels` on each)."""
    p, names, values = "atoll_syncer_", list(labels or {}), list((labels or {}).values())
    for name, key, what in (
        ("rounds", "rounds", "rounds closed (merges)"),
        ("contributions_accepted", "accepted", "contributions accepted"),
        ("received_bytes", "bytes_in", "contribution bytes accepted"),
        ("sent_bytes", "bytes_out", "update bytes sent"),
        ("useful_seconds", "useful_s", "step-seconds in accepted contributions"),
        ("tokens", "tokens", "tokens the learners report"),
        ("data_parallel_bytes", "dp_bytes", "a data-parallel all-reduce's bytes for the steps"),
    ):
        c = CounterMetricFamily(p + name, what, labels=names)
        c.add_metric(values, s[key])
        yield c
    for name, key, what in (
        ("goodput_ratio", "goodput", "useful s / (learners x the training window)"),
        ("training_window_seconds", "window_s", "the first join to the latest contribution"),
        ("token_budget", "token_budget", "the token budget (0: none)"),
        ("learners_live", "learners_live", "live sessions"),
    ):
        g = GaugeMetricFamily(p + name, what, labels=names)
        g.add_metric(values, s[key] or 0)
        yield g


def info_series(s: dict[str, Any]) -> Any:
    yield from eval_gauge(s["evals"])
    info = GaugeMetricFamily("atoll_syncer_info", "this syncer", labels=INFO_LABELS)
    info.add_metric([s["epoch"], str(s["shard"]), str(s["shards"])], 1)
    yield info


class _Handler(BaseHTTPRequestHandler):
    timeout = TIMEOUT_S  # the socket's: a client that sends nothing is dropped
    metrics: SyncerMetrics  # set on the subclass `serve` makes

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", PAGE.encode())
        elif path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry))
        elif path == "/healthz":
            self._send(200, "text/plain; charset=utf-8", b"ok\n")
        elif path == "/status.json":
            self._send(200, "application/json", json.dumps(self.metrics.status()).encode())
        elif path == "/history.json":
            body = json.dumps(self.metrics.history_json()).encode()
            self._send(200, "application/json", body)
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _send(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # no line per request on the syncer's stderr


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], handler: type) -> None:
        super().__init__(addr, handler)
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # every slot held: closed unanswered
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class HttpEndpoints:
    """The endpoints on a daemon thread: `port` is the one bound (0 asks for a free one).
    A request that raises is the server's to answer (it logs it and goes on); the thread
    itself dying takes the syncer down loudly, as its other threads do (atoll.threads)."""

    def __init__(self, rt: SyncerRuntime, host: str = "127.0.0.1", port: int = 0) -> None:
        self.metrics = SyncerMetrics(rt)
        handler = type("Handler", (_Handler,), {"metrics": self.metrics})
        self.server = _Server((host, port), handler)
        self.port = self.server.server_address[1]
        self._thread = guarded("http-endpoints", self.server.serve_forever, rt.thread_died)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
