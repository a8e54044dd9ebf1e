"""The syncer's durable state: an append-only event tape of committed merges plus periodic
atomic snapshots (safetensors), and the restore that puts a SyncerProtocol back together.

Tape: files ``tape/<first seq>.tape`` of records ``len u32 | crc32 u32 | body``; the body is a
safetensors blob holding the fragment's new exact value, public value and outer-optimizer
state, with JSON metadata (seq, fragment, version, grace EMAs, the driver's accounting). A
record is written (and flushed to the OS, optionally fsync'ed) *before* the merge is broadcast,
so whatever a learner has seen is on the tape. A torn last record (a crash during the write)
fails its length or crc check and is ignored: it was never broadcast.

Snapshot: ``snapshot.safetensors`` written to a temporary file, fsync'ed and renamed (atomic).
It covers tape records with seq < ``tape_next``; at each snapshot the tape starts a new file,
and files older than the previous snapshot are deleted (one generation is kept).

Restore = load the snapshot, then replay every tape record with seq >= tape_next in order. Each
record carries the fragment's full state, so replay needs no recomputation and is exact.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, save

from atoll.core.outer import OuterState
from atoll.core.syncer import SyncerProtocol

_REC = struct.Struct("<II")


def _outer_tensors(prefix: str, st: OuterState) -> dict[str, torch.Tensor]:
    out = {}
    if st.buf is not None:
        out[f"{prefix}buf"] = st.buf.contiguous()
    if st.acc is not None:
        out[f"{prefix}acc"] = st.acc.contiguous()
    return out


def _grace_state(proto: SyncerProtocol) -> dict[str, float | None]:
    g = proto.grace
    return {"step": g.step.value, "to_quorum": g.to_quorum.value, "sync": g.sync.value}


def _set_grace(proto: SyncerProtocol, st: dict[str, float | None]) -> None:
    proto.grace.step.value = st.get("step")
    proto.grace.to_quorum.value = st.get("to_quorum")
    proto.grace.sync.value = st.get("sync")


def commit_record(proto: SyncerProtocol, seq: int, p: int, extra: dict[str, Any]) -> bytes:
    """The tape record of fragment p's state right after a merge."""
    tensors = {"theta": proto.theta[p].contiguous(), "public": proto.public[p].contiguous()}
    tensors.update(_outer_tensors("", proto.outer_state[p]))
    meta = {
        "seq": seq,
        "fragment": p,
        "version": proto.version[p],
        "count": proto.outer_state[p].count,
        "rounds_closed": proto.rounds_closed,
        "grace": _grace_state(proto),
        "extra": extra,
    }
    return save(tensors, metadata={"json": json.dumps(meta)})


class Tape:
    """Append-only record files under `folder` (see the module doc)."""

    def __init__(self, folder: Path, fsync: bool = False) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.next_seq = 0
        self._fh: Any = None

    def open_segment(self, start: int) -> None:
        if self._fh is not None:
            self._fh.close()
        self.next_seq = start
        self._fh = open(self.folder / f"{start:012d}.tape", "ab")

    def append(self, body: bytes) -> int:
        """Write one record; returns its seq. Flushed to the OS before returning."""
        seq = self.next_seq
        self._fh.write(_REC.pack(len(body), zlib.crc32(body) & 0xFFFFFFFF) + body)
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())
        self.next_seq += 1
        return seq

    def segments(self) -> list[tuple[int, Path]]:
        out = []
        for f in self.folder.glob("*.tape"):
            try:
                out.append((int(f.stem), f))
            except ValueError:
                continue
        return sorted(out)

    def drop_before(self, seq: int) -> None:
        """Delete segments that start before `seq` (whose records a snapshot covers)."""
        for start, f in self.segments():
            if start < seq and (self._fh is None or Path(self._fh.name) != f):
                f.unlink(missing_ok=True)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_records(path: Path) -> list[tuple[dict[str, torch.Tensor], dict[str, Any]]]:
    """Every intact record of one tape file, in order; stops at a torn or corrupt record."""
    data = path.read_bytes()
    out = []
    i = 0
    while i + _REC.size <= len(data):
        n, crc = _REC.unpack_from(data, i)
        body = data[i + _REC.size : i + _REC.size + n]
        if len(body) != n or (zlib.crc32(body) & 0xFFFFFFFF) != crc:
            break
        tensors = load(body)
        meta = json.loads(_metadata(body)["json"])
        out.append((tensors, meta))
        i += _REC.size + n
    return out


def _metadata(blob: bytes) -> dict[str, str]:
    (hlen,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8 : 8 + hlen])
    return header.get("__metadata__", {})


@dataclass
class Restored:
    snapshot_seq: int = 0  # tape records covered by the snapshot
    replayed: int = 0  # tape records replayed on top
    extra: dict[str, Any] = field(default_factory=dict)  # the driver's last accounting
    lost_committed_rounds: int = 0  # tape commits not reflected in the restored state
    found: bool = False


def write_snapshot(
    path: Path, proto: SyncerProtocol, tape_next: int, extra: dict[str, Any], keep_history: int
) -> None:
    """Atomically write the whole syncer state (call with the state's lock held or on copies)."""
    tensors: dict[str, torch.Tensor] = {}
    frags = []
    for p in range(proto.plan.P):
        tensors[f"theta.{p}"] = proto.theta[p].contiguous()
        tensors[f"public.{p}"] = proto.public[p].contiguous()
        tensors.update(_outer_tensors(f"outer.{p}.", proto.outer_state[p]))
        hist = list(proto.history[p].items())[-keep_history:]
        for v, t in hist:
            if v != proto.version[p]:
                tensors[f"hist.{p}.{v}"] = t.contiguous()
        frags.append(
            {
                "version": proto.version[p],
                "count": proto.outer_state[p].count,
                "history": [v for v, _ in hist],
            }
        )
    meta = {
        "tape_next": tape_next,
        "rounds_closed": proto.rounds_closed,
        "grace": _grace_state(proto),
        "fragments": frags,
        "extra": extra,
    }
    blob = save({k: v.clone() for k, v in tensors.items()}, metadata={"json": json.dumps(meta)})
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        fh.write(blob)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _apply_record(proto: SyncerProtocol, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    p, v = meta["fragment"], meta["version"]
    proto.theta[p] = tensors["theta"].clone()
    proto.public[p] = tensors["public"].clone()
    proto.version[p] = v
    proto.outer_state[p] = OuterState(
        buf=tensors["buf"].clone() if "buf" in tensors else None,
        acc=tensors["acc"].clone() if "acc" in tensors else None,
        count=meta["count"],
    )
    hist = proto.history[p]
    hist[v] = proto.public[p].clone()
    while len(hist) > proto.cfg.history:
        hist.popitem(last=False)
    proto.rounds_closed = meta["rounds_closed"]
    _set_grace(proto, meta["grace"])


def restore(proto: SyncerProtocol, snapshot: Path, tape: Tape) -> Restored:
    """Load snapshot + tape into `proto` (freshly built from the same plan and config)."""
    out = Restored()
    if snapshot.exists():
        blob = snapshot.read_bytes()
        tensors = load(blob)
        meta = json.loads(_metadata(blob)["json"])
        for p, f in enumerate(meta["fragments"]):
            proto.theta[p] = tensors[f"theta.{p}"].clone()
            proto.public[p] = tensors[f"public.{p}"].clone()
            proto.version[p] = f["version"]
            buf, acc = tensors.get(f"outer.{p}.buf"), tensors.get(f"outer.{p}.acc")
            proto.outer_state[p] = OuterState(
                buf=None if buf is None else buf.clone(),
                acc=None if acc is None else acc.clone(),
                count=f["count"],
            )
            hist: OrderedDict[int, torch.Tensor] = OrderedDict()
            for v in f["history"]:
                key = f"hist.{p}.{v}"
                hist[v] = tensors[key].clone() if key in tensors else proto.public[p].clone()
            proto.history[p] = hist
        proto.rounds_closed = meta["rounds_closed"]
        _set_grace(proto, meta["grace"])
        out.snapshot_seq = meta["tape_next"]
        out.extra = meta["extra"]
        out.found = True
    committed: dict[int, int] = {}  # fragment -> newest version on the tape
    next_seq = out.snapshot_seq
    for _start, path in tape.segments():
        for tensors, meta in read_records(path):
            if meta["seq"] < out.snapshot_seq:
                continue
            _apply_record(proto, tensors, meta)
            committed[meta["fragment"]] = max(committed.get(meta["fragment"], 0), meta["version"])
            out.replayed += 1
            out.extra = meta["extra"]
            out.found = True
            next_seq = max(next_seq, meta["seq"] + 1)
    # check the tape against the restored state: every committed version must be there
    out.lost_committed_rounds = sum(max(0, v - proto.version[p]) for p, v in committed.items())
    proto.round_id = [r + 1 for r in proto.round_id]
    tape.next_seq = next_seq
    return out
