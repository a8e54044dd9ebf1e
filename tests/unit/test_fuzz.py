"""Fuzzing, a fast subset: the properties of benchmarks/fuzz.py (families in
benchmarks/fuzzing/) with a few derandomized cases each, and the findings it led to as plain
tests: zstd bombs, torn tape records, damaged tapes and snapshots, malformed settings files and
Welcome messages."""

from __future__ import annotations

import struct
import sys
import tracemalloc
import zlib
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from fuzzing import FAMILIES  # noqa: E402
from fuzzing.frames import rle_zstd  # noqa: E402
from fuzzing.store import SEGMENTS, SNAP, core, fixture  # noqa: E402
from fuzzing.world import PLAN, make_syncer, valid_contribution  # noqa: E402

from atoll.config import build  # noqa: E402
from atoll.core import codec  # noqa: E402
from atoll.errors import ConfigError  # noqa: E402
from atoll.live.syncer import store  # noqa: E402
from atoll.wire import convert  # noqa: E402

EXAMPLES = {"codec": 150, "chunks": 150, "messages": 150, "syncer": 50, "store": 50, "config": 80}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_family_refuses_clearly_or_accepts_checked(name):
    """No crash, no hang, and each input a clear refusal or a checked acceptance (a refused
    contribution or restore leaves the state bit-identical: inside the families' checks)."""
    fam = FAMILIES[name]

    @settings(
        max_examples=EXAMPLES[name],
        database=None,
        deadline=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(fam.cases)
    def run(case):
        assert fam.check(case) in ("refused", "accepted")

    run()


def _frame(body: bytes, numel: int, scheme: str = "fp32", flags: int = 1) -> bytes:
    head = struct.pack("<4sBBBBQIII", b"ATF1", 1, codec.SCHEMES[scheme], flags, 0, numel, 64,
                       len(body), zlib.crc32(body))  # fmt: skip
    return head + body


@pytest.mark.parametrize("declared", [1 << 40, 1 << 33, None])
def test_a_zstd_bomb_is_refused_before_anything_is_allocated(declared):
    """A 40-byte frame whose zstd body declares 1 TiB (or 8 GiB, or no size) was decompressed
    to its declared size: zstd ignores max_output_size when the frame says its size."""
    frame = _frame(rle_zstd(declared, 4, 1 << 17), 1000)
    tracemalloc.start()
    try:
        with pytest.raises(codec.CodecError, match="zstd"):
            codec.decode(frame, expect_numel=1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


def test_an_int_frame_whose_group_pads_it_to_gigabytes_is_refused():
    body = zlib.compress(b"")  # never reached: the group is checked first
    frame = _frame(body, 10, "int8", flags=0)
    frame = frame[:16] + struct.pack("<I", 2**32 - 1) + frame[20:]
    with pytest.raises(codec.CodecError, match="group size 4294967295"):
        codec.decode(frame, expect_numel=10)
    small = torch.randn(5)  # fewer values than a group: one group of all of them, as before
    for scheme in ("int8", "int4"):
        assert torch.equal(
            codec.decode(codec.encode(small, scheme, 64)), codec.quantize(small, scheme)
        )


def _run_dir(tmp_path: Path) -> Path:
    files, _prefix, _records = fixture()
    (tmp_path / "tape").mkdir()
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


def _restore(root: Path):
    proto = make_syncer(outer="nesterov", grace=False)
    tape = store.Tape(root / "tape")
    return proto, tape, store.restore(proto, root / SNAP, tape)


def test_a_torn_last_tape_record_is_dropped_with_a_note_and_cut_off(tmp_path):
    root = _run_dir(tmp_path)
    _files, prefix, records = fixture()
    last = root / SEGMENTS[-1]
    intact = last.read_bytes()
    rec = struct.pack("<II", len(records[0]), zlib.crc32(records[0])) + records[0]
    last.write_bytes(intact + rec[:100])  # the syncer died writing record 13
    proto, tape, r = _restore(root)
    assert r.torn.startswith("000000000010.tape: dropped a torn last record (100 bytes")
    assert r.dropped_bytes == 100 and r.replayed == 8  # records 5..12 kept
    assert core(proto) == prefix[13] and tape.next_seq == 13
    assert last.read_bytes() == intact  # cut off the file
    # a restart with only a torn record in its new segment: appended records follow intact ones
    (root / "tape" / f"{13:012d}.tape").write_bytes(rec[:50])
    proto, tape, r = _restore(root)
    assert r.dropped_bytes == 50 and core(proto) == prefix[13]
    tape.open_segment(tape.next_seq)  # what the syncer does next: append to segment 13
    proto.on_contribution(99.0, valid_contribution(proto, "L0", 1, 1000))
    tape.append(store.commit_record(proto, tape.next_seq, 1, {}))
    tape.close()
    want = core(proto)
    again, _tape, r = _restore(root)
    assert not r.torn and r.replayed == 9 and core(again) == want


def test_the_zeros_a_direct_write_pads_with_are_a_torn_end_not_empty_records(tmp_path):
    """disk.Writer writes whole 4 KB blocks and then cuts the file back to its length: a
    syncer killed in between leaves zeros after its last record. Before, each 8 zero bytes
    read as an intact empty record (length 0, crc32(b"") == 0) and the restore failed on it."""
    root = _run_dir(tmp_path)
    _files, prefix, _records = fixture()
    last = root / SEGMENTS[-1]
    intact = last.read_bytes()
    last.write_bytes(intact + bytes(4096 - len(intact) % 4096))
    proto, _tape, r = _restore(root)
    assert r.torn.startswith("000000000010.tape: dropped a torn last record")
    assert r.replayed == 8 and core(proto) == prefix[13] and last.read_bytes() == intact


def test_a_damaged_record_before_intact_ones_or_a_gap_is_refused_and_changes_nothing(tmp_path):
    root = _run_dir(tmp_path)
    seg = root / SEGMENTS[1]
    data = bytearray(seg.read_bytes())
    data[200] ^= 0x10  # inside record 5, records 6..9 follow
    seg.write_bytes(bytes(data))
    proto = make_syncer(outer="nesterov", grace=False)
    fresh = core(proto)
    with pytest.raises(store.StoreError, match="corrupted, not torn"):
        store.restore(proto, root / SNAP, store.Tape(root / "tape"))
    assert core(proto) == fresh and seg.read_bytes() == bytes(data)
    seg.unlink()  # records 5..9 gone: segment 10 cannot follow the snapshot
    with pytest.raises(store.StoreError, match="records 5..9 are missing"):
        store.restore(proto, root / SNAP, store.Tape(root / "tape"))


def test_a_flipped_bit_anywhere_in_a_snapshot_is_refused(tmp_path):
    root = _run_dir(tmp_path)
    snap = root / SNAP
    blob = snap.read_bytes()
    for pos in range(0, len(blob), max(1, len(blob) // 97)):
        snap.write_bytes(blob[:pos] + bytes([blob[pos] ^ 4]) + blob[pos + 1 :])
        with pytest.raises(store.StoreError):
            store.restore(make_syncer(outer="nesterov"), snap, store.Tape(root / "none"))


@pytest.mark.parametrize(
    "name, text, match",
    [
        ("s.json", "[1, 2]", "a JSON table"),
        ("s.json", "{", "JSONDecodeError"),
        ("s.json", "[" * 100_000, "RecursionError"),
        ("s.toml", "\xff", "TOMLDecodeError"),
        ("s.toml", "[runs]\nlearners = 2", "runs="),
        ("s.json", '{"lr": NaN}', "a finite number"),
        ("s.json", '{"steps": ' + "9" * 5000 + "}", "JSON"),
    ],
)
def test_a_malformed_settings_file_is_a_config_error(tmp_path, name, text, match):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        build([], path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="UTF-8"):
        build([], path)


def test_a_welcome_the_learner_cannot_use_is_a_message_error():
    from atoll.core.learner import LearnerConfig

    w = convert.welcome(PLAN, LearnerConfig(), "E", True, 4096, 1 << 20)
    for field, value, match in [
        ("H", 0, "Welcome.H=0"),
        ("offset", 9, r"fragments\[0\].offset=9"),
        ("index", 2, r"fragments\[0\].index=2"),
        ("codec", "int3", "Welcome.settings.codec='int3'"),
    ]:
        bad = type(w)()
        bad.CopyFrom(w)
        target = bad.settings if field == "codec" else bad.fragments[0] if field != "H" else bad
        setattr(target, field, value)
        with pytest.raises(convert.MessageError, match=match):
            convert.plan_from_welcome(bad)
            convert.learner_config_from_welcome(bad)
