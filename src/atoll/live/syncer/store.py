"""The syncer's durable state: an append-only event tape of committed merges plus periodic
atomic snapshots (safetensors), and the restore that puts a SyncerProtocol back together.

The protocol's state comes from `SyncerProtocol.state_dict()` / `fragment_state(p)` and goes
back through `load_state_dict()` / `load_fragment_state()` (atoll.core.state); this module
only puts those dicts into files.

Tape: files ``tape/<first seq>.tape`` of records ``len u32 | crc32 u32 | body``; the body is a
safetensors blob holding the fragment's new exact value, public value and outer-optimizer
state, with JSON metadata (seq, fragment, version, grace EMAs, the driver's accounting). A
record is written (to the OS, past its page cache where it can: disk.py; optionally fsync'ed)
*before* the merge is broadcast, so whatever a learner has seen is on the tape. A torn last
record (a crash during the write) fails its length or crc check: restore drops it (it was
never broadcast), says so (`RestoreResult.torn`) and cuts it off the file, so that the next
records follow intact ones.

Snapshot: ``snapshot.safetensors`` written to a temporary file, fsync'ed and renamed (atomic),
with a crc32 of its JSON metadata and tensors (snapshots without one, of earlier versions, are
read unchecked). It covers tape records with seq < ``tape_next``; at each snapshot the tape
starts a new file, and files older than the previous snapshot are deleted (one generation).

Restore = load the snapshot, then replay every tape record with seq >= tape_next in order. Each
record carries the fragment's full state, so replay needs no recomputation and is exact. What
is replayed must be whole: records tape_next, tape_next + 1, ... without a gap, each a version
newer than the fragment's last, every tensor of the plan's size. Anything else (a damaged
snapshot, a damaged record that intact ones follow, a gap, a record that does not parse) is a
`StoreError` naming the file, the place and what is wrong, raised before the protocol or any
file is changed: a syncer never starts from a state that mixes up its history.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from atoll.core.syncer import SyncerProtocol
from atoll.live.syncer import blob, disk
from atoll.live.syncer.store_read import (
    CRC_KEY,
    REC,
    StoreError,
    digest,
    intact_after,
    parse,
    read_file,
    read_record,
    read_snapshot,
    scan,
)


def _tensors(prefix: str, st: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of one fragment state (atoll.core.state), named under `prefix`."""
    out = {f"{prefix}theta": st["theta"].contiguous(), f"{prefix}public": st["public"].contiguous()}
    for k in ("buf", "acc"):
        if st["outer"].get(k) is not None:
            out[f"{prefix}{k}"] = st["outer"][k].contiguous()
    for v, t in st["history"].items():
        if v != st["version"]:  # the current version's value is `public`
            out[f"{prefix}hist.{v}"] = t.contiguous()
    return out


def _meta(st: dict[str, Any]) -> dict[str, Any]:
    return {"fragment": st["fragment"], "version": st["version"], "count": st["outer"]["count"],
            "history": list(st["history"])}  # fmt: skip


def commit_record(proto: SyncerProtocol, seq: int, p: int, extra: dict[str, Any]) -> list[Any]:
    """The tape record of fragment p's state right after a merge, as pieces (`blob`): the
    protocol's own tensors, to be written at once, under the lock."""
    st = proto.fragment_state(p, copy=False)
    meta = {"seq": seq, **_meta(st), "rounds_closed": st["rounds_closed"], "grace": st["grace"],
            "extra": extra}  # fmt: skip
    return blob.pieces(_tensors("", st), {"json": json.dumps(meta)})


class Tape:
    """Append-only record files under `folder` (see the module doc)."""

    def __init__(self, folder: Path, fsync: bool = False) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.next_seq = 0
        self._w: disk.Writer | None = None

    def open_segment(self, start: int) -> None:
        if self._w is not None:
            self._w.close()
        self.next_seq = start
        self._w = disk.Writer(self.folder / f"{start:012d}.tape", fresh=False)

    def append(self, body: bytes | list[Any]) -> int:
        """Write one record (a blob, or its `blob.pieces`); returns its seq. Flushed to the
        OS before returning."""
        seq = self.next_seq
        parts = [body] if isinstance(body, (bytes, bytearray)) else body
        assert self._w is not None, "open_segment first"
        self._w.write([REC.pack(blob.size(parts), blob.crc32(parts)), *parts])
        if self.fsync:
            self._w.sync()
        self.next_seq += 1
        return seq

    def segments(self) -> list[tuple[int, Path]]:
        """(first seq, path) of every segment file, in order (other names are not ours)."""
        out = []
        for f in self.folder.glob("*.tape"):
            if f.stem.isascii() and f.stem.isdigit() and f.is_file():
                out.append((int(f.stem), f))
        return sorted(out)

    def drop_before(self, seq: int) -> None:
        """Delete segments that start before `seq` (whose records a snapshot covers)."""
        for start, f in self.segments():
            if start < seq and (self._w is None or self._w.path != f):
                f.unlink(missing_ok=True)

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
            self._w = None


def read_records(path: Path) -> list[tuple[dict[str, torch.Tensor], dict[str, Any]]]:
    """Every intact record of one tape file, in order; stops at a torn or corrupt record."""
    out = []
    for off, rec in scan(read_file(path))[0]:
        tensors, meta, _md = parse(rec, f"{path.name} at byte {off}")
        out.append((tensors, meta))
    return out


@dataclass
class RestoreResult:
    snapshot_seq: int = 0  # tape records covered by the snapshot
    replayed: int = 0  # tape records replayed on top
    extra: dict[str, Any] = field(default_factory=dict)  # the driver's last accounting
    lost_committed_rounds: int = 0  # tape commits not reflected in the restored state
    found: bool = False
    torn: str = ""  # a torn last record that was dropped: which file, where, how many bytes
    dropped_bytes: int = 0  # its size (cut off the file)


def write_snapshot(
    path: Path, state: dict[str, Any], tape_next: int, extra: dict[str, Any]
) -> None:
    """Atomically write a syncer state (`SyncerProtocol.state_dict()`: tensors the protocol
    no longer writes into, or copies)."""
    tensors: dict[str, torch.Tensor] = {}
    for st in state["fragments"]:
        tensors.update(_tensors(f"{st['fragment']}.", st))
    meta = {
        "tape_next": tape_next,
        "rounds_closed": state["rounds_closed"],
        "grace": state["grace"],
        "fragments": [_meta(st) for st in state["fragments"]],
        "extra": extra,
    }
    text = json.dumps(meta)
    parts = blob.pieces(tensors, {"json": text, CRC_KEY: digest(text, tensors)})
    tmp = path.with_suffix(".tmp")
    with disk.Writer(tmp) as w:  # past the page cache (disk.py)
        w.write(parts)
        w.sync()
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def restore(proto: SyncerProtocol, snapshot: Path, tape: Tape) -> RestoreResult:
    """Load snapshot + tape into `proto` (freshly built from the same plan and config) through
    its `load_state_dict` / `load_fragment_state` only. Everything is read and checked first:
    on a `StoreError` neither `proto` nor any file has changed."""
    out = RestoreResult()
    plan = proto.plan
    base = None
    versions = list(proto.version)
    if snapshot.exists():
        base, out.snapshot_seq, out.extra = read_snapshot(snapshot, proto.state.numels)
        versions = [0] * plan.P
        for st in base["fragments"]:
            versions[st["fragment"]] = st["version"]
        out.found = True
    replay: list[dict[str, Any]] = []
    due = out.snapshot_seq  # the seq of the next record to replay
    segments = tape.segments()
    torn: tuple[Path, int, int] | None = None
    for k, (start, path) in enumerate(segments):
        if start > due:  # a segment is named after the first record it was opened for
            raise StoreError(
                f"{path.name} begins at record {start} where record {due} was due: records "
                f"{due}..{start - 1} are missing" + ("" if base else f" ({snapshot.name} too)")
            )
        data = read_file(path)
        records, bad = scan(data)
        for off, body in records:
            where = f"{path.name} at byte {off}"
            seq, st, extra = read_record(body, proto.state.numels, where)
            if seq < out.snapshot_seq:  # covered by the snapshot
                continue
            if seq != due:
                missing = f"records {due}..{seq - 1} are missing" if seq > due else "out of order"
                raise StoreError(f"{where}: record {seq} where {due} was due: {missing}")
            p = st["fragment"]
            if st["version"] <= versions[p]:
                raise StoreError(
                    f"{where}: record {seq} takes fragment {p} from version {versions[p]} to "
                    f"{st['version']}: a merge always makes a newer version"
                )
            versions[p] = st["version"]
            replay.append(st)
            out.extra = extra
            due += 1
        covered = k + 1 < len(segments) and segments[k + 1][0] <= out.snapshot_seq
        if bad is not None and not covered:  # (damage the snapshot covers does not matter)
            after = intact_after(data, bad)
            if after is not None:
                raise StoreError(
                    f"{path.name}: damaged record at byte {bad} with an intact one after it "
                    f"(byte {after}): the tape is corrupted, not torn by a crash"
                )
            if k == len(segments) - 1:
                torn = (path, bad, len(data) - bad)
            # a damaged end of an earlier segment: the syncer restarted after a torn record
            # and began the next segment, whose first record must be the one due (checked)
    if torn is not None:  # cut off, so that records appended later follow intact ones
        path, at, n = torn
        try:
            os.truncate(path, at)
        except OSError as exc:
            raise StoreError(f"{path}: cannot drop its torn last record ({exc})") from None
        out.torn = f"{path.name}: dropped a torn last record ({n} bytes at byte {at})"
        out.dropped_bytes = n
    if base is not None:
        proto.load_state_dict(base)
    committed: dict[int, int] = {}  # fragment -> newest version on the tape
    for st in replay:
        proto.load_fragment_state(st)
        committed[st["fragment"]] = max(committed.get(st["fragment"], 0), st["version"])
    out.replayed = len(replay)
    out.found = out.found or bool(replay)
    # check the tape against the restored state: every committed version must be there
    out.lost_committed_rounds = sum(max(0, v - proto.version[p]) for p, v in committed.items())
    if out.replayed or not out.found:  # (load_state_dict already did this for a snapshot)
        proto.loaded()
    tape.next_seq = due
    return out
