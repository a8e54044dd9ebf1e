"""The syncer's held-out evaluations while a run goes (atoll.live.syncer.evaluation) against the
live syncer service in this process: the values evaluated are the global model's after a merge,
the `evaluated` event reaches the log, /status.json and /metrics; the points follow the token
budget; and an evaluation that raises stops the evaluations, not the run."""

from __future__ import annotations

import json
import urllib.request

import torch

from atoll.core.events import Evaluated
from atoll.eventlog import load_events
from atoll.live.syncer.endpoints import HttpEndpoints
from atoll.live.syncer.evaluation import LiveEvaluation
from tests.integration.test_http_endpoints import _samples
from tests.integration.test_reliability_service import _merge_two, _wait


def test_an_evaluation_sees_the_merged_global_model_and_is_shown(live):
    service, stub, died, run_dir = live
    http = HttpEndpoints(service.runtime, "127.0.0.1", 0)
    try:
        streams = _merge_two(service, stub)
        _wait(lambda: service.proto.rounds_closed >= 1, "a round to close")
        seen: list[dict[str, torch.Tensor]] = []

        def evaluate(params: dict[str, torch.Tensor]) -> float:
            seen.append(params)
            return float(sum(v.double().square().sum() for v in params.values()))

        ev = LiveEvaluation(service.runtime, evaluate, points=4)
        e = ev.once()
        with service.lock:
            now = service.proto.global_params()
            rounds = service.proto.rounds_closed
        assert isinstance(e, Evaluated) and e.rounds == rounds >= 1
        assert set(seen[0]) == set(now) and all(torch.equal(seen[0][k], now[k]) for k in now)
        # a copy: not the syncer's own storage (the next merge does not change it)
        with service.lock:
            theta = service.proto.delivery.state.theta
            held = {t.untyped_storage().data_ptr() for t in theta if t.numel()}
        assert all(v.untyped_storage().data_ptr() not in held for v in seen[0].values())
        assert e.eval_loss == evaluate(now)
        status = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{http.port}/status.json", timeout=5).read())  # fmt: skip
        assert status["evals"][-1]["loss"] == e.eval_loss
        assert _samples(http.port)["atoll_syncer_eval_loss"] == e.eval_loss
        del streams
    finally:
        http.close()
    logged = [x for x in load_events(run_dir / "events.jsonl") if x.kind == "evaluated"]
    assert [x.data.eval_loss for x in logged] == [e.eval_loss] and not died


def test_points_follow_the_budget_and_a_failing_evaluation_stops_only_itself(live):
    service, stub, died, _ = live
    rt = service.runtime
    budget = rt.opts.token_budget
    ev = LiveEvaluation(rt, lambda p: 1.0, points=4)
    assert not ev.due(0.0)  # no tokens yet
    with rt.lock:
        rt.books.beat("L0", "a", 10, budget // 4, 1.0)  # a quarter of the budget reached
    assert ev.due(0.0) and not ev.due(0.0)  # once per point
    with rt.lock:
        rt.books.beat("L0", "a", 20, budget, 2.0)
    assert ev.due(0.0) and not ev.due(0.0)  # the three points left, at once

    def broken(params: dict[str, torch.Tensor]) -> float:
        raise RuntimeError("a user's evaluation raised")

    bad = LiveEvaluation(rt, broken, points=4)
    assert bad.once() is None and "raised" in (bad.failed or "")
    assert bad.once() is None  # no more evaluations
    _merge_two(service, stub)  # and the run goes on: rounds close
    _wait(lambda: service.proto.rounds_closed >= 1, "a round to close")
    assert not died


def test_without_a_budget_it_evaluates_every_few_seconds_from_the_runs_start(live):
    service, _, _, _ = live
    rt = service.runtime
    ev = LiveEvaluation(rt, lambda p: 1.0, points=0, every_s=30.0)
    t = rt.acct["start"]  # the syncer's first start (the books keep it through restarts)
    assert not ev.due(t + 10.0) and ev.due(t + 31.0) and not ev.due(t + 40.0)
    assert ev.point == 1 and ev.due(t + 95.0) and ev.point == 3  # periods passed at once
    # a restarted syncer (its books restored) numbers the same instants alike
    again = LiveEvaluation(rt, lambda p: 1.0, points=0, every_s=30.0)
    assert again.due(t + 95.0) and again.point == 3


def test_a_loss_that_is_not_finite_keeps_the_page_readable(live):
    service, stub, died, _ = live
    http = HttpEndpoints(service.runtime, "127.0.0.1", 0)
    try:
        ev = LiveEvaluation(service.runtime, lambda p: float("nan"), points=4)
        assert ev.once() is not None  # a diverged run's loss is still a result
        body = urllib.request.urlopen(f"http://127.0.0.1:{http.port}/status.json", timeout=5)

        def strict(c: str) -> None:
            raise ValueError(f"{c} is not JSON")  # what a browser's JSON.parse refuses

        status = json.loads(body.read(), parse_constant=strict)
        assert status["evals"][-1]["loss"] is None
        assert (
            _samples(http.port)["atoll_syncer_eval_loss"]
            != _samples(http.port)["atoll_syncer_eval_loss"]
        )  # NaN on /metrics
    finally:
        http.close()
    assert not died
