"""Family `store`: tape segments and snapshots (live/syncer/store.py `restore`).

The fixture is a real run directory: a syncer (Nesterov: outer state too) merges 13 rounds; a
snapshot after record 5; segments 0 (records 0-4, covered by the snapshot), 5 (5-9) and 10
(10-12, a restart). A case damages it (bit flips, zeroed ranges, truncation, junk appended, a
torn record, files deleted, renamed, duplicated, foreign files) or forges it (a record or the
snapshot changed and its checksum made right again), then restores into a fresh syncer.

Damage: restore must refuse with `StoreError` (a message; the protocol and every file
unchanged) or give exactly the state after records 0..k-1 for some k (a consistent prefix,
compared bit for bit with the live run's); a dropped torn record is reported (`torn`), cut off
the file, and a record appended after it is replayed by the next restore. Forgery (a valid
checksum cannot tell it): `StoreError`, or any state the checks let through, but no crash.
"""

from __future__ import annotations

import functools
import json
import shutil
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from safetensors.torch import load, save

from atoll.live.syncer import blob, store
from atoll.live.syncer.store_read import digest
from fuzzing.base import Family, Violation, frozen, mutate, scratch
from fuzzing.world import PLAN, make_syncer, valid_contribution

SNAP = "snapshot.safetensors"
SEGMENTS = ("tape/000000000000.tape", "tape/000000000005.tape", "tape/000000000010.tape")
FILES = (SNAP, *SEGMENTS)


def core(proto: Any) -> Any:
    """What a restore must give back exactly: values, versions, outer state, rounds, grace."""
    st_ = proto.state_dict()
    frags = [(f["fragment"], f["version"], frozen(f["theta"]), frozen(f["public"]),
              frozen(f["outer"])) for f in st_["fragments"]]  # fmt: skip
    return (st_["rounds_closed"], frozen(st_["grace"]), tuple(frags))


@functools.cache
def fixture() -> tuple[dict[str, bytes], tuple, list[bytes]]:
    """(file -> bytes, the core state after each prefix of records, each record's bytes)."""
    tmp = Path(tempfile.mkdtemp(prefix="atoll-fuzz-fixture-"))
    try:
        proto = make_syncer(outer="nesterov", grace=False)
        tape = store.Tape(tmp / "tape")
        tape.open_segment(0)
        prefix = [core(proto)]
        records = []
        for i in range(13):
            if i in (5, 10):
                if i == 5:
                    store.write_snapshot(tmp / SNAP, proto.state_dict(8), 5, {"n": i})
                tape.open_segment(i)
            p = i % PLAN.P
            proto.on_contribution(2.0 + i, valid_contribution(proto, "L0", p, i + 1, seed=i))
            rec = blob.joined(store.commit_record(proto, tape.next_seq, p, {"n": i}))
            records.append(rec)
            tape.append(rec)
            prefix.append(core(proto))
        tape.close()
        files = {f: (tmp / f).read_bytes() for f in FILES}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return files, tuple(prefix), records


FILE = st.sampled_from(FILES)
DAMAGE = st.one_of(
    st.tuples(st.just("flip"), FILE, st.integers(0, 1 << 20), st.integers(0, 7)),
    st.tuples(st.just("zero"), FILE, st.integers(0, 1 << 20), st.integers(1, 4096)),
    st.tuples(st.just("truncate"), FILE, st.integers(0, 1 << 20)),
    st.tuples(st.just("junk"), FILE, st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("torn"), st.integers(0, 12), st.integers(0, 1 << 20)),
    st.tuples(st.just("torn_segment"), st.integers(0, 12), st.integers(0, 1 << 20)),
    st.tuples(st.just("delete"), FILE),
    st.tuples(st.just("rename"), st.sampled_from(SEGMENTS), st.integers(0, 20)),
    st.tuples(st.just("copy"), st.sampled_from(SEGMENTS), st.integers(0, 20)),
    st.tuples(
        st.just("foreign"),
        st.sampled_from(["x.tape", "7.tape", "a.txt", "tape2"]),
        st.binary(max_size=64),
    ),  # fmt: skip
)
FORGERY = st.one_of(
    st.tuples(st.just("forge"), st.sampled_from(SEGMENTS), st.integers(0, 4),
              st.sampled_from(["seq", "fragment", "version", "count", "rounds_closed", "history",
                               "grace", "extra"]),
              st.one_of(st.integers(-5, 30), st.sampled_from([None, "x", [], {}, 1e300]))),
    st.tuples(st.just("forge_snapshot"), st.sampled_from(["tape_next", "rounds_closed", "grace",
              "fragments", "extra"]), st.one_of(st.integers(-5, 30), st.sampled_from([None, []]))),
    st.tuples(st.just("reframe"), st.sampled_from(SEGMENTS), st.integers(0, 4),
              st.integers(0, 1 << 20), st.integers(0, 255)),
)  # fmt: skip
CASES = st.lists(st.one_of(DAMAGE, DAMAGE, FORGERY), min_size=1, max_size=3)


def _records(data: bytes) -> list[tuple[int, int]]:
    """(offset, size) of each record of an intact segment."""
    out, i = [], 0
    while i + 8 <= len(data):
        (n,) = struct.unpack_from("<I", data, i)
        out.append((i, 8 + n))
        i += 8 + n
    return out


def _frame(body: bytes) -> bytes:
    return struct.pack("<II", len(body), zlib.crc32(body) & 0xFFFFFFFF) + body


def _with_meta(blob: bytes, key: str, value: Any, crc: bool) -> bytes:
    """A safetensors blob whose JSON metadata has `key` set (a forger's edit)."""
    tensors = load(blob)
    (hlen,) = struct.unpack_from("<Q", blob, 0)
    md = json.loads(blob[8 : 8 + hlen]).get("__metadata__", {})
    meta = json.loads(md["json"])
    meta[key] = value
    text = json.dumps(meta)
    md = {**md, "json": text}
    if crc and "crc32" in md:
        md["crc32"] = digest(text, tensors)
    return save(tensors, metadata=md)


def apply(root: Path, ops: list[tuple]) -> bool:
    """Write the fixture under `root` and apply `ops`; True when only damage (no forgery)."""
    files, _prefix, records = fixture()
    (root / "tape").mkdir(parents=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    damage_only = True
    for op in ops:
        kind = op[0]
        path = root / op[1] if kind not in ("torn", "torn_segment", "forge_snapshot") else None
        if kind in ("flip", "zero", "truncate", "junk") and path is not None and path.exists():
            data = path.read_bytes()
            if kind == "flip":
                data = mutate(data, [("flip", op[2], op[3])])
            elif kind == "zero" and data:
                i = op[2] % len(data)
                data = data[:i] + bytes(min(op[3], len(data) - i)) + data[i + op[3] :]
            elif kind == "truncate":
                data = data[: op[2] % (len(data) + 1)]
            elif kind == "junk":
                data = data + op[2]
            path.write_bytes(data)
        elif kind == "torn":  # a crash while writing the next record: a prefix of it
            rec = _frame(records[op[1]])
            last = root / SEGMENTS[-1]
            if last.exists():
                last.write_bytes(last.read_bytes() + rec[: op[2] % len(rec)])
        elif kind == "torn_segment":  # a restart opened segment 13, then crashed writing
            rec = _frame(records[op[1]])
            (root / "tape" / f"{13:012d}.tape").write_bytes(rec[: op[2] % len(rec)])
        elif kind == "delete" and path is not None:
            path.unlink(missing_ok=True)
        elif kind in ("rename", "copy") and path is not None and path.exists():
            new = root / "tape" / f"{op[2]:012d}.tape"
            if new != path:
                data = path.read_bytes()
                new.write_bytes(data)
                if kind == "rename":
                    path.unlink()
        elif kind == "foreign":
            (root / "tape" / op[1]).write_bytes(op[2])
        elif kind in ("forge", "reframe"):
            damage_only = False
            seg = root / op[1]
            if not seg.exists():
                continue
            data = seg.read_bytes()
            recs = _records(data)
            if not recs:
                continue
            off, size = recs[op[2] % len(recs)]
            body = data[off + 8 : off + size]
            try:
                if kind == "forge":
                    body = _with_meta(body, op[3], op[4], True)
                else:
                    body = mutate(body, [("set", op[3], op[4])])
            except Exception:  # not a blob the forger can edit (already damaged): leave it
                continue
            seg.write_bytes(data[:off] + _frame(body) + data[off + size :])
        elif kind == "forge_snapshot":
            damage_only = False
            snap = root / SNAP
            if snap.exists():
                try:
                    snap.write_bytes(_with_meta(snap.read_bytes(), op[1], op[2], True))
                except Exception:
                    continue
    return damage_only


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}  # fmt: skip


def check(ops: list[tuple]) -> str:
    _files, prefix, records = fixture()
    root = scratch()
    try:
        damage_only = apply(root, ops)
        before = _tree(root)
        proto = make_syncer(outer="nesterov", grace=False)
        fresh = core(proto)
        try:
            r = store.restore(proto, root / SNAP, store.Tape(root / "tape"))
        except store.StoreError as exc:
            if not str(exc):
                raise Violation("StoreError without a message") from exc
            if core(proto) != fresh or _tree(root) != before:
                raise Violation(f"a refused restore changed the protocol or files: {exc}") from exc
            return "refused"
        got = core(proto)
        if damage_only:
            if got not in prefix:
                raise Violation(f"restored a state that is no prefix of the run ({r})")
            if r.torn:
                _after_torn(root, got, prefix.index(got))
        proto.state_dict()
        return "accepted"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _after_torn(root: Path, got: Any, k: int) -> None:
    """After a dropped torn record: the next restore finds no torn record and the same state;
    a record appended where the syncer goes on is replayed."""
    proto = make_syncer(outer="nesterov", grace=False)
    tape = store.Tape(root / "tape")
    r = store.restore(proto, root / SNAP, tape)
    if r.torn or core(proto) != got:
        raise Violation(f"the torn record was not cut off: {r}")
    tape.open_segment(tape.next_seq)
    p = tape.next_seq % PLAN.P
    proto.on_contribution(50.0, valid_contribution(proto, "L0", p, 999, seed=k))
    tape.append(store.commit_record(proto, tape.next_seq, p, {}))
    tape.close()
    want = core(proto)
    again = make_syncer(outer="nesterov", grace=False)
    r2 = store.restore(again, root / SNAP, store.Tape(root / "tape"))
    if core(again) != want or r2.torn:
        raise Violation(f"a record appended after a dropped torn one was not replayed: {r2}")


def bound(ops: list[tuple]) -> int:
    """A restore reads each file whole and holds every record to replay: a few times the size
    of the run directory."""
    files, _p, _r = fixture()
    return 4 * sum(len(b) for b in files.values()) + 512 * 1024


FAMILY = Family("store", CASES, check, "store.StoreError with a message", bound)
