"""The whole shard set's HTTP endpoints (`atoll syncer --shards S --http-port P`): the shard
supervisor serves `/`, `/status.json`, `/metrics` and `/healthz` on P, from what each shard
serves on P+1+i (endpoints.py), read over loopback with a short timeout.

`/status.json` is the set as one syncer: rounds, contributions, refusals, bytes and useful
seconds summed over the shards (each accepts only its own fragments' contributions, and a
learner splits each step's time over the fragments, so the run's useful seconds are the sum,
as in the set's syncer_final.json); tokens, the budget, the start and every key this module
does not know from the home shard 0, which counts the budget; goodput from the summed useful
seconds over expected learners x the home shard's window (its start to now, or once the budget
is spent to the last contribution any shard took, as each shard counts it); the learners live on
any shard, each with its worst (largest) heartbeat age; and `shards`, each shard's own
figures and whether it answered. A shard that does not answer (down, restarting, stopped) is
shown down with its last figures, so that the sums do not step back while it restarts.

`/metrics` is every shard's series with a `shard="i"` label added,
`atoll_syncer_shard_up{shard}`: 1 if the shard's own /metrics answered this scrape, and the
set's `atoll_syncer_eval_loss` once the supervisor has evaluated the whole model
(shard_eval.py; a shard holds only its fragments and evaluates nothing: `evals` on
/status.json are the supervisor's too).

The server and handler are endpoints.py's (read-only, bounded client threads, socket
timeouts, no secret); reading the shards takes at most 2 x FETCH_TIMEOUT_S whatever they do.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from atoll import metrics
from atoll.core.events import Evaluated
from atoll.live.syncer.chart_history import combine_history
from atoll.live.syncer.endpoints import (
    EVALS,
    RECENT_MARKS,
    RECENT_ROUNDS,
    _Handler,
    _Server,
    eval_gauge,
    eval_row,
    series,
)
from atoll.threads import OnDeath, guarded

FETCH_TIMEOUT_S = 1.0  # a shard that has not answered by then is shown down
MAX_BODY = 16 << 20  # a shard's page larger than this is refused (it is shown down)
STATUS_TTL_S = 0.5  # /status.json read from the shards at most this often
SUMMED = ("rounds", "accepted", "refused", "bytes_in", "bytes_out", "useful_s", "restarts")
ROW = (*SUMMED, "epoch", "learners_live", "tokens", "goodput")  # a shard's own figures
DEFAULTS: dict[str, Any] = {
    **dict.fromkeys(SUMMED, 0),
    "run_id": "", "epoch": "", "tokens": 0, "token_budget": 0, "learners_expected": 0,
    "start": 0.0, "quiet_after_s": 0.0, "versions": [], "evals": [], "finished": False,
    "first_join": None, "last_accepted": None, "window_s": 0.0, "learners_live": 0,
}  # fmt: skip


@dataclass
class _Shard:
    index: int
    port: int
    status: dict[str, Any] | None = None  # its last /status.json
    seen_at: float = 0.0  # when it last answered
    up: bool = False
    error: str = "not read yet"


def _loopback(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0") else host


class ShardReader:
    """Reads the shards' endpoints: in parallel, each within FETCH_TIMEOUT_S."""

    def __init__(self, host: str, ports: list[int]) -> None:
        self.host = _loopback(host)
        self.shards = [_Shard(i, p) for i, p in enumerate(ports)]
        self.pool = ThreadPoolExecutor(min(len(ports), 8), thread_name_prefix="shard-read")
        self._lock = threading.Lock()  # one status read at a time; the others take its result
        self._combined: tuple[float, dict[str, Any]] | None = None
        self.evals: deque[dict[str, Any]] = deque(maxlen=EVALS)  # the set's (shard_eval.py)
        self.marks: deque[dict[str, Any]] = deque(maxlen=RECENT_MARKS)  # shards down, back

    def evaluated(self, e: Evaluated) -> None:
        """An evaluation of the whole model the supervisor recorded: on the loss chart."""
        self.evals.append(eval_row(time.time(), e))

    def _get(self, port: int, path: str) -> bytes:
        conn = http.client.HTTPConnection(self.host, port, timeout=FETCH_TIMEOUT_S)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            body = r.read(MAX_BODY + 1)
            if r.status != 200 or len(body) > MAX_BODY:
                raise OSError(f"HTTP {r.status}, {len(body)} bytes")
            return body
        finally:
            conn.close()

    def read(self, path: str) -> list[bytes | str]:
        """Each shard's body of `path`, or why it has none (a string)."""
        futs = [self.pool.submit(self._get, sh.port, path) for sh in self.shards]
        wait(futs, FETCH_TIMEOUT_S * 2)
        out: list[bytes | str] = []
        for f in futs:
            if not f.done():
                f.cancel()
                out.append("no answer")
            elif f.exception() is not None:
                out.append(repr(f.exception())[:200])
            else:
                out.append(f.result())
        return out

    def status(self) -> dict[str, Any]:
        """The set's /status.json (read again once STATUS_TTL_S old)."""
        with self._lock:
            if self._combined and time.monotonic() - self._combined[0] < STATUS_TTL_S:
                return self._combined[1]
            now, fresh = time.time(), {}
            for sh, body in zip(self.shards, self.read("/status.json"), strict=True):
                was, sh.up = sh.up, False
                try:
                    if isinstance(body, str):
                        raise OSError(body)
                    st = json.loads(body)
                    if not isinstance(st, dict):
                        raise ValueError("not an object")
                except (OSError, ValueError) as exc:
                    sh.error = str(exc)[:200]
                    if was:
                        self.marks.append({"t": now, "kind": "shard down", "learner": "",
                                           "shard": sh.index, "why": sh.error})  # fmt: skip
                    continue
                if not was and sh.status is not None:  # it answered before: back again
                    self.marks.append(
                        {"t": now, "kind": "shard restored", "learner": "", "shard": sh.index}
                    )
                sh.status, sh.seen_at, sh.up, sh.error = st, now, True, ""
                fresh[sh.index] = st
            combined = combine(self.shards, fresh, now, list(self.evals))
            marks = [*combined["marks"], *self.marks]
            combined["marks"] = sorted(marks, key=lambda m: _num(m.get("t")))[-RECENT_MARKS:]
            self._combined = (time.monotonic(), combined)
            return combined

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def combine(
    shards: list[_Shard], fresh: dict[int, dict[str, Any]], now: float, evals: list | None = None
) -> dict:
    """The set as one syncer, from each shard's last status (`fresh`: those read just now) and
    the supervisor's evaluations (`evals`; none: the home shard's, if it has any)."""
    known = [sh for sh in shards if sh.status is not None]
    home = shards[0].status or (known[0].status if known else {})
    out: dict[str, Any] = {**DEFAULTS, **home}  # keys this module does not know: the home's
    for k in SUMMED:
        out[k] = sum(_num(sh.status.get(k)) for sh in known)  # type: ignore[union-attr]
    out["shard"], out["shards"] = "all", [_row(sh, now) for sh in shards]
    out["versions"] = newest_versions([sh.status.get("versions") for sh in known])  # type: ignore[union-attr]
    learners: dict[str, dict[str, Any]] = {}
    for i, st in sorted(fresh.items()):  # the learners the shards answering now hold
        for row in st.get("learners") or []:
            if not isinstance(row, dict):
                continue
            have = learners.get(row.get("id"))
            if have is None:
                learners[row.get("id")] = {**row, "shards": [i]}
            else:  # every shard's bytes and merges; the oldest beat, the stalest newest
                for k in ("bytes_in", "bytes_out", "merged"):  # merge, the most reconnects
                    have[k] = _num(have.get(k)) + _num(row.get(k))
                for k in ("age_s", "staleness", "reconnects", "steps", "ranks"):
                    have[k] = max(_num(have.get(k)), _num(row.get(k)))
                have["shards"].append(i)
    out["learners"] = [learners[k] for k in sorted(learners, key=str)]
    out["learners_live"] = len(learners)
    out["recent_rounds"] = _newest(fresh, "recent_rounds", RECENT_ROUNDS)
    out["marks"] = _newest(fresh, "marks", RECENT_MARKS)  # each shard heard the final beat
    if not shards[0].status and known:  # the home shard never answered: the others' start
        out["start"] = min(_num(sh.status.get("start")) or now for sh in known)  # type: ignore[union-attr]
    if evals:
        out["evals"] = evals
    # the set's figures as one syncer's (metrics.Figures): sums, the earliest join, the latest
    # contribution any shard took; tokens the home shard's
    f = metrics.combine_figures(
        [_figures(sh.status) for sh in known],
        int(_num(out["learners_expected"])),  # type: ignore[arg-type]
    )
    f.heard_tokens = int(_num(out["tokens"]))
    out.update(f.as_dict())
    out["dp_bytes"] = int(_num(home.get("dp_bytes")))  # each shard counts every step: home's
    return out


def _figures(st: dict[str, Any]) -> metrics.Figures:
    """A shard's figures from its /status.json."""
    times = {k: (st.get(k) if isinstance(st.get(k), int | float) else None)
             for k in ("first_join", "last_accepted")}  # fmt: skip
    return metrics.Figures(
        rounds=int(_num(st.get("rounds"))),
        accepted=int(_num(st.get("accepted"))),
        received_bytes=int(_num(st.get("bytes_in"))),
        useful_s=float(_num(st.get("useful_s"))),
        start=times["first_join"],
        last_accepted=times["last_accepted"],
    )


def _num(v: Any) -> float:
    return v if isinstance(v, int | float) and not isinstance(v, bool) else 0


def _row(sh: _Shard, now: float) -> dict[str, Any]:
    st = sh.status or {}
    return {
        "shard": sh.index,
        "up": sh.up,
        "port": sh.port,
        "age_s": round(now - sh.seen_at, 2) if sh.seen_at else None,  # of these figures
        "error": sh.error,
        **{k: st.get(k) for k in ROW},
    }


def newest_versions(lists: list[Any]) -> list:
    """Each fragment's version: the shard that serves it holds the newest."""
    lists = [v for v in lists if isinstance(v, list)]
    n = max((len(v) for v in lists), default=0)
    return [max(_num(v[p]) for v in lists if p < len(v)) for p in range(n)]


def _newest(fresh: dict[int, dict[str, Any]], key: str, keep: int) -> list:
    """The shards' `key` lists merged by time (each entry names its shard), the newest kept."""
    rows = [
        {**r, "shard": i}
        for i, st in fresh.items()
        for r in st.get(key) or []
        if isinstance(r, dict)
    ]
    rows.sort(key=lambda r: _num(r.get("t")))
    return rows[-keep:]


class _ShardSeries:
    """A registry collector: every shard's /metrics, re-emitted with a `shard` label (it has
    no `describe`, and its registry does not collect to learn its names: nothing is read from
    the shards until a scrape)."""

    def __init__(self, reader: ShardReader) -> None:
        self.reader = reader

    def collect(self) -> Any:
        families: dict[str, Metric] = {}
        up = GaugeMetricFamily(
            "atoll_syncer_shard_up", "1 if the shard's /metrics answered", labels=["shard"]
        )
        for sh, body in zip(self.reader.shards, self.reader.read("/metrics"), strict=True):
            try:
                if isinstance(body, str):
                    raise OSError(body)
                parsed = list(text_string_to_metric_families(body.decode()))
            except (OSError, ValueError):
                up.add_metric([str(sh.index)], 0)
                continue
            up.add_metric([str(sh.index)], 1)
            for fam in parsed:
                out = families.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type))
                if out.type != fam.type:
                    continue  # a shard of another version: its family is left out
                for s in fam.samples:
                    labels = {**s.labels, "shard": str(sh.index)}
                    out.add_sample(s.name, labels, s.value, s.timestamp, s.exemplar)
        for fam in series(self.reader.status()):  # the set's own, without a shard label
            out = families.setdefault(fam.name, fam)
            if out is not fam and out.type == fam.type:
                out.samples.extend(fam.samples)
        yield up
        yield from families.values()
        if "atoll_syncer_eval_loss" not in families:  # the set's, not a shard's
            yield from eval_gauge(self.reader.evals)


class ShardSetMetrics:
    """What endpoints.py's handler serves (`registry`, `status`), for the shard set."""

    def __init__(self, reader: ShardReader) -> None:
        self.reader = reader
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_ShardSeries(reader))

    def status(self) -> dict[str, Any]:
        return self.reader.status()

    def history_json(self) -> dict[str, Any]:
        """/history.json of the set: its shards' points combined (chart_history.py)."""
        s = self.reader.status()
        parts: list[list[dict[str, Any]]] = []
        for body in self.reader.read("/history.json"):
            try:
                h = json.loads(body) if isinstance(body, bytes) else {}
            except ValueError:
                h = {}
            parts.append(h.get("points") or [] if isinstance(h, dict) else [])
        learners = int(_num(s.get("learners_expected")))
        return {"points": combine_history(parts, s.get("first_join"), learners),
                "marks": s["marks"]}  # fmt: skip


class ShardSetEndpoints:
    """The set's endpoints on `host:port`, reading shard i on `shard_ports[i]`, served on a
    guarded thread: its death calls `on_death` (the supervisor then ends the set loudly)."""

    def __init__(self, host: str, port: int, shard_ports: list[int], on_death: OnDeath) -> None:
        self.reader = ShardReader(host, shard_ports)
        self.metrics = ShardSetMetrics(self.reader)
        handler = type("Handler", (_Handler,), {"metrics": self.metrics})
        self.server = _Server((host, port), handler)
        self.port = self.server.server_address[1]
        self._thread = guarded("shard-set-http", self.server.serve_forever, on_death)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.reader.close()
