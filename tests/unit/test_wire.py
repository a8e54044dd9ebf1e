"""Wire helpers, durable state and live settings: fast unit tests, no processes."""

import math

import pytest
import torch

from atoll.chaos import Scenario
from atoll.config import build, split_overrides
from atoll.core import codec
from atoll.core.fragments import make_plan
from atoll.core.messages import Contribution, Resume
from atoll.core.syncer import SyncerConfig, SyncerProtocol
from atoll.errors import ConfigError
from atoll.live.comm_mode import resolve_comm
from atoll.live.syncer.store import Tape, commit_record, read_records, restore, write_snapshot
from atoll.wire.auth import load_secret
from atoll.wire.chunks import Assembler, TransferError, crc32, split


def test_chunks_round_trip_any_size():
    for n in (0, 1, 1023, 1024, 5000):
        payload = bytes(range(256)) * (n // 256) + bytes(n % 256)
        asm = Assembler(len(payload), crc32(payload), limit=10_000)
        for c in split(payload, 1024):
            assert len(c) <= 1024
            asm.add(c)
        assert asm.payload() == payload


def test_assembler_refuses_corruption_truncation_and_oversize():
    payload = b"x" * 3000
    asm = Assembler(len(payload), crc32(payload), limit=10_000)
    for c in split(b"y" + payload[1:], 1000):
        asm.add(c)
    with pytest.raises(TransferError, match="checksum"):
        asm.payload()
    asm = Assembler(len(payload), crc32(payload), limit=10_000)
    asm.add(payload[:1000])
    with pytest.raises(TransferError, match="ended after 1000 of 3000"):
        asm.payload()
    with pytest.raises(TransferError, match="over the limit"):
        Assembler(20_000, 0, limit=10_000)
    asm = Assembler(10, 0, limit=100)
    with pytest.raises(TransferError, match="more than"):
        asm.add(b"z" * 11)


def test_secret_from_env_or_file_never_short(tmp_path, monkeypatch):
    monkeypatch.setenv("ATOLL_SECRET", "from-the-env-123")
    assert load_secret() == "from-the-env-123"
    f = tmp_path / "s"
    f.write_text("from-a-file-456\n")
    assert load_secret(f) == "from-a-file-456"
    monkeypatch.setenv("ATOLL_SECRET", "short")
    with pytest.raises(ConfigError, match="at least 8"):
        load_secret()
    with pytest.raises(ConfigError, match="readable file"):
        load_secret(tmp_path / "missing")


def test_settings_split_and_validate(tmp_path):
    sim, live = split_overrides(["learners=3", "pace_s=0.1", "chaos=kill:L1@2+1"])
    assert sim == {"learners": 3} and live == {"pace_s": 0.1, "chaos": "kill:L1@2+1"}
    with pytest.raises(ConfigError, match="known key"):
        split_overrides(["nope=1"])
    cfg = tmp_path / "run.toml"
    cfg.write_text('learners = 2\nshape_mbps = "5,0"\n')
    scfg, lcfg = build([], cfg)
    assert scfg.learners == 2 and lcfg.shape_factors(2) == [5.0, 0.0]
    with pytest.raises(ConfigError, match="shape_mbps"):
        build(["shape_mbps=1,2,3"], cfg)


def test_comm_mode_auto_takes_a_process_only_with_two_cores_per_learner():
    assert build([])[1].comm == "auto"
    with pytest.raises(ConfigError, match="comm"):
        build(["comm=fiber"])
    assert resolve_comm("auto", learners_here=1, cores=2) == "process"
    assert resolve_comm("auto", learners_here=4, cores=2) == "thread"  # atoll demo here
    assert resolve_comm("auto", learners_here=4, cores=8) == "process"
    assert resolve_comm("thread", learners_here=1, cores=64) == "thread"  # explicit wins


def test_chaos_spec():
    def parse(spec, n, seed, horizon, delay):
        return Scenario.from_spec(spec, delay).validate(n).timeline(n, horizon, seed)

    acts = parse("stop:L2@30+2,kill:L1@20+3,kill:syncer@40", 3, 0, 100.0, 1.5)
    assert [(a.at, a.kind, a.target, a.duration) for a in acts] == [
        (20.0, "kill", "L1", 3.0),
        (30.0, "stall", "L2", 2.0),
        (40.0, "kill_syncer", "syncer", 1.5),
    ]
    rnd = parse("random:4", 3, 7, 100.0, 2.0)
    assert len(rnd) == 4 and rnd == parse("random:4", 3, 7, 100.0, 2.0)
    assert all(10.0 <= a.at <= 70.0 and a.target in {"L0", "L1", "L2"} for a in rnd)
    for bad in ("kill:L9@1", "explode:L1@1", "kill:L1", "stop:syncer@3"):
        with pytest.raises(ConfigError):
            parse(bad, 3, 0, 100.0, 1.0)


def _syncer(outer="nesterov"):
    shapes = {"a": (40,), "b": (30,), "c": (20,)}
    plan = make_plan(shapes, P=3, H=3)
    init = {
        k: torch.randn(s, generator=torch.Generator().manual_seed(1)) for k, s in shapes.items()
    }
    cfg = SyncerConfig(quorum=1, grace=False, outer=outer, down_codec="fp32")  # as written
    return plan, lambda: SyncerProtocol(plan, [plan.flatten(init, p) for p in range(3)], cfg)


def _drive(proto, rounds, seed=0):
    gen = torch.Generator().manual_seed(seed)
    proto.on_join(0.0, "L0")
    for i in range(rounds):
        p = i % proto.plan.P
        delta = torch.randn(proto.plan.fragments[p].numel, generator=gen) * 0.01
        c = Contribution(
            "L0", p, i + 1, proto.version[p], codec.encode(delta, "fp32"), 2, 64, 0.0, 0.1
        )
        yield proto.on_contribution(float(i), c)


def _same_state(a, b, tol=0.0):
    def same(x, y):
        return torch.equal(x, y) if tol == 0 else (x - y).abs().max().item() <= tol

    for p in range(a.plan.P):
        assert same(a.theta[p], b.theta[p]) and same(a.public[p], b.public[p])
        assert a.version[p] == b.version[p]
        assert same(a.outer_state[p].buf, b.outer_state[p].buf)
        assert a.version[p] in b.history[p]
    assert a.rounds_closed == b.rounds_closed
    assert a.grace.step.value == b.grace.step.value


@pytest.mark.parametrize("outer", ["nesterov", "delayed_nesterov"])
def test_snapshot_plus_tape_restores_exact_state(tmp_path, outer):
    plan, make = _syncer(outer)
    live = make()
    tape = Tape(tmp_path / "tape")
    tape.open_segment(0)
    for i, _ in enumerate(_drive(live, 14)):
        p = i % plan.P
        tape.append(commit_record(live, tape.next_seq, p, {"n": i}))
        if i == 6:  # snapshot midway, then the tape continues in a new segment
            state = live.state_dict(8)
            write_snapshot(tmp_path / "snap.safetensors", state, tape.next_seq, {"n": i})
            tape.open_segment(tape.next_seq)
    tape.close()
    back = make()
    r = restore(back, tmp_path / "snap.safetensors", Tape(tmp_path / "tape"))
    assert r.found and r.snapshot_seq == 7 and r.replayed == 7 and r.lost_committed_rounds == 0
    assert r.extra == {"n": 13}
    _same_state(live, back)
    # restored syncer keeps working: the next contribution merges on the restored state
    c = Contribution(
        "L0",
        0,
        99,
        back.version[0],
        codec.encode(torch.zeros(plan.fragments[0].numel), "fp32"),
        1,
        1,
        0.0,
        0.1,
    )
    back.on_join(0.0, "L0")
    assert any(getattr(o, "kind", "") == "round_closed" for o in back.on_contribution(20.0, c))


def test_torn_tape_record_is_ignored(tmp_path):
    plan, make = _syncer()
    live = make()
    tape = Tape(tmp_path / "tape")
    tape.open_segment(0)
    for i, _ in enumerate(_drive(live, 3)):
        tape.append(commit_record(live, tape.next_seq, i % plan.P, {}))
    tape.close()
    seg = tape.segments()[0][1]
    data = seg.read_bytes()
    seg.write_bytes(data[:-10])  # a crash in the middle of the last write
    assert len(read_records(seg)) == 2
    back = make()
    r = restore(back, tmp_path / "none.safetensors", Tape(tmp_path / "tape"))
    assert r.replayed == 2 and back.version == [1, 1, 0]
    assert not math.isnan(float(back.theta[0].sum()))


def test_comm_side_encodes_in_send_order_and_drops_obsolete_contributions():
    """The training side hands over plain deltas (`Outgoing`); the communication side encodes
    them later with its ContributionEncoder: the frames equal the core's error feedback, in
    order, and a heal (`Reset`, a newer generation) makes older ones obsolete. In its queue a
    newer send of a fragment supersedes a queued one and carries its work."""
    from atoll.core.messages import Outgoing
    from atoll.live.comm import Comm, CommOptions
    from atoll.live.comm.messages import Reset, StepState, Submit
    from atoll.live.comm.sendqueue import Pending

    torch.manual_seed(0)
    xs = [torch.randn(300) for _ in range(4)]
    ref = codec.ErrorFeedback("int4", 64, True)
    comm = Comm(CommOptions("127.0.0.1:1", "T0", "inc", "run", "secret-123"), [].append)
    comm.session.encoder = codec.ContributionEncoder("int4", 64, True)

    def out(p: int, x: torch.Tensor, generation: int = 0) -> Outgoing:
        return Outgoing("T0", p, 1, 0, 1, 1, 0.0, 0.0, 0.5, generation, x)

    for x in xs:  # what the up thread does, in send order
        c = comm.up.encode(Pending(out(1, x))).encoded
        assert c.payload == ref.encode(1, x) and c.work_s == 0.5  # same frames
    again = comm.up.encode(Pending(out(1, xs[0])))
    assert comm.up.encode(again) is again  # a retry sends the same frame, not encoded again
    stale = Pending(out(2, xs[0]))
    comm.command(Reset(1))  # a heal: a new generation
    assert comm.up.encode(stale) is None  # dropped, not sent
    c = comm.up.encode(Pending(out(1, xs[1], generation=1))).encoded  # residuals start over
    assert c.payload == codec.ErrorFeedback("int4", 64, True).encode(1, xs[1])
    for i in (0, 1):
        sub = (Submit(out(3, xs[i], generation=1)),)
        comm.command(StepState(i + 1, 64 * (i + 1), 0.5 * (i + 1), 0.5, Resume((0,), (0,)), sub))
    item = comm.queue.take()
    assert item.outgoing.delta is xs[1] and item.outgoing.work_s == 1.0
    assert comm.queue.counts()[:2] == (1, 2)  # one in flight, two handed over
    comm.channels.close()


def test_run_directory_of_the_earlier_layout_still_restores(tmp_path):
    """tests/unit/data/old_layout was written by the store before the fragment-state dicts (a
    snapshot after 6 merges, 4 more on the tape); restoring it gives the state the same
    contributions give now."""
    import shutil
    from pathlib import Path

    src = Path(__file__).parent / "data" / "old_layout"
    shutil.copytree(src, tmp_path / "run")
    plan, make = _syncer("nesterov")
    live = make()
    for _ in _drive(live, 10):
        pass
    back = make()
    r = restore(back, tmp_path / "run" / "snapshot.safetensors", Tape(tmp_path / "run" / "tape"))
    assert r.found and r.snapshot_seq == 6 and r.replayed == 4 and r.lost_committed_rounds == 0
    # the files hold values merged by the code of their time; today's merge sums in another
    # order (float32 rounding, BENCHMARKS.md §10)
    _same_state(live, back, tol=1e-6)


def test_contribution_header_round_trip_and_the_send_time_window():
    from atoll.wire import convert

    c = Contribution("L0", 1, 7, 3, b"xyz", 2, 64, 100.0, 0.5, 1.25)
    h = convert.contribution_header(c, "inc")
    assert convert.contribution_from_header(h, b"xyz", 100.0) == c
    assert convert.contribution_from_header(h, b"xyz", 1000.0).sent_at == 1000.0 - 600.0
    h.sent_at = 5000.0  # a clock ahead of the syncer's: taken as now
    assert convert.contribution_from_header(h, b"xyz", 1000.0).sent_at == 1000.0
    h.sent_at = -5.0  # left for the core to refuse
    assert convert.contribution_from_header(h, b"xyz", 1000.0).sent_at == -5.0
