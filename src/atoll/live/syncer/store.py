"""The syncer's durable state: an append-only event tape of committed merges plus periodic
atomic snapshots (safetensors), and the restore that puts a SyncerProtocol back together.

The protocol's state comes from `SyncerProtocol.state_dict()` / `fragment_state(p)` and goes
back through `load_state_dict()` / `load_fragment_state()` (atoll.core.state); this module
only puts those dicts into files.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, save

from atoll.core.syncer import SyncerProtocol

_REC = struct.Struct("<II")


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


def _state(prefix: str, meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A fragment state back from `_meta` and `_tensors`."""
    public = tensors[f"{prefix}public"]
    return {
        "fragment": meta["fragment"],
        "version": meta["version"],
        "theta": tensors[f"{prefix}theta"],
        "public": public,
        "outer": {
            "buf": tensors.get(f"{prefix}buf"),
            "acc": tensors.get(f"{prefix}acc"),
            "count": meta["count"],
        },
        "history": {
            v: tensors.get(f"{prefix}hist.{v}", public)
            for v in meta.get("history", [meta["version"]])  # older tapes: the current one
        },
    }


def _upgrade(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """A snapshot of the layout before the fragment-state dicts (`theta.{p}`, `outer.{p}.buf`,
    `hist.{p}.{v}`, fragments by position) renamed in place to this one (`{p}.theta`, ...)."""
    if all("fragment" in f for f in meta["fragments"]):
        return
    for p, f in enumerate(meta["fragments"]):
        f["fragment"] = p
        renames = {f"theta.{p}": "theta", f"public.{p}": "public", f"outer.{p}.buf": "buf",
                   f"outer.{p}.acc": "acc"}  # fmt: skip
        renames.update({f"hist.{p}.{v}": f"hist.{v}" for v in f["history"]})
        for old, new in renames.items():
            if old in tensors:
                tensors[f"{p}.{new}"] = tensors.pop(old)


def commit_record(proto: SyncerProtocol, seq: int, p: int, extra: dict[str, Any]) -> bytes:
    """The tape record of fragment p's state right after a merge."""
    st = proto.fragment_state(p, copy=False)  # serialized right here, under the lock
    meta = {"seq": seq, **_meta(st), "rounds_closed": st["rounds_closed"], "grace": st["grace"],
            "extra": extra}  # fmt: skip
    return save(_tensors("", st), metadata={"json": json.dumps(meta)})


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
    path: Path, state: dict[str, Any], tape_next: int, extra: dict[str, Any]
) -> None:
    """Atomically write a syncer state (`SyncerProtocol.state_dict()`, copies)."""
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
    blob = save(tensors, metadata={"json": json.dumps(meta)})
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


def restore(proto: SyncerProtocol, snapshot: Path, tape: Tape) -> Restored:
    """Load snapshot + tape into `proto` (freshly built from the same plan and config) through
    its `load_state_dict` / `load_fragment_state` only."""
    out = Restored()
    if snapshot.exists():
        blob = snapshot.read_bytes()
        tensors = load(blob)
        meta = json.loads(_metadata(blob)["json"])
        _upgrade(meta, tensors)
        frags = [_state(f"{f['fragment']}.", f, tensors) for f in meta["fragments"]]
        proto.load_state_dict(
            {"rounds_closed": meta["rounds_closed"], "grace": meta["grace"], "fragments": frags}
        )
        out.snapshot_seq = meta["tape_next"]
        out.extra = meta["extra"]
        out.found = True
    committed: dict[int, int] = {}  # fragment -> newest version on the tape
    next_seq = out.snapshot_seq
    for _start, path in tape.segments():
        for tensors, meta in read_records(path):
            if meta["seq"] < out.snapshot_seq:
                continue
            st = _state("", meta, tensors)
            proto.load_fragment_state(
                {**st, "rounds_closed": meta["rounds_closed"], "grace": meta["grace"]}
            )
            committed[meta["fragment"]] = max(committed.get(meta["fragment"], 0), meta["version"])
            out.replayed += 1
            out.extra = meta["extra"]
            out.found = True
            next_seq = max(next_seq, meta["seq"] + 1)
    # check the tape against the restored state: every committed version must be there
    out.lost_committed_rounds = sum(max(0, v - proto.version[p]) for p, v in committed.items())
    if out.replayed or not out.found:  # (load_state_dict already did this for a snapshot)
        proto.loaded()
    tape.next_seq = next_seq
    return out
