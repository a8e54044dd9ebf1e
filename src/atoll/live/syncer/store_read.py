"""Reading the syncer's files back, checked: tape records (framing, crc, torn ends) and
snapshots (their crc32, layout and sizes against the plan). Every failure is a `StoreError`
naming the file, where in it and what is wrong; nothing here changes a file or a protocol
(atoll.live.syncer.store restores with what these return).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load

from atoll.checksum import crc32

REC = struct.Struct("<II")  # a tape record's len u32 | crc32 u32 (then its body)
CRC_KEY = "crc32"  # the snapshot metadata key of its checksum


class StoreError(ValueError):
    """A snapshot or tape that cannot be restored as it is; the message names the file, where
    in it and what is wrong."""


def state_of(prefix: str, meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
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


def upgrade(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """A snapshot of the layout before the fragment-state dicts (`theta.{p}`, `outer.{p}.buf`,
    `hist.{p}.{v}`, fragments by position) renamed in place to this one (`{p}.theta`, ...)."""
    if all("fragment" in f for f in meta["fragments"]):
        return
    for p, f in enumerate(meta["fragments"]):
        f["fragment"] = p
        renames = {f"theta.{p}": "theta", f"public.{p}": "public", f"outer.{p}.buf": "buf",
                   f"outer.{p}.acc": "acc"}  # fmt: skip
        renames.update({f"hist.{p}.{v}": f"hist.{v}" for v in f.get("history", [])})
        for old, new in renames.items():
            if old in tensors:
                tensors[f"{p}.{new}"] = tensors.pop(old)


def read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise StoreError(f"{path}: cannot be read ({exc})") from None


def scan(data: bytes) -> tuple[list[tuple[int, bytes]], int | None]:
    """(offset, body) of each intact record from the start, and the offset where the bytes
    stop being intact records (None: the data ends right after a record)."""
    out = []
    i = 0
    while i < len(data):
        if i + REC.size > len(data):
            return out, i
        n, crc = REC.unpack_from(data, i)
        body = data[i + REC.size : i + REC.size + n]
        # n == 0 is never a record (a body is a safetensors blob), but zeros would pass the
        # crc: the block padding a direct write leaves when the syncer dies before cutting it
        if not n or len(body) != n or (crc32(body) & 0xFFFFFFFF) != crc:
            return out, i
        out.append((i, body))
        i += REC.size + n
    return out, None


def intact_after(data: bytes, bad: int) -> int | None:
    """Where an intact record starts after the damaged one at `bad`, if one does: damage that
    intact records follow is corruption, not a torn write. A body is a safetensors blob (a u64
    header length, then '{"'), which is what the candidates are found by."""
    pos = data.find(b'{"', bad + 1 + 2 * REC.size)
    while pos != -1:
        j = pos - 2 * REC.size
        n, crc = REC.unpack_from(data, j)
        end = j + REC.size + n
        if end <= len(data) and (crc32(data[j + REC.size : end]) & 0xFFFFFFFF) == crc:
            return j
        pos = data.find(b'{"', pos + 1)
    return None


def _metadata(blob: bytes) -> dict[str, str]:
    (hlen,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8 : 8 + hlen])
    return header.get("__metadata__", {})


def parse(blob: bytes, where: str) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict]:
    """(tensors, the JSON metadata, the raw safetensors metadata) of a blob."""
    try:
        tensors = load(blob)
        md = _metadata(blob)
        meta = json.loads(md["json"])
    except Exception as exc:  # whatever the parsers raise on bytes they cannot read
        why = f"{type(exc).__name__}: {exc}"[:200]
        raise StoreError(f"{where}: not a safetensors blob with JSON metadata ({why})") from None
    if not isinstance(meta, dict):
        raise StoreError(f"{where}: metadata is {type(meta).__name__}, expected an object")
    unknown = sorted(set(md) - {"json", CRC_KEY})
    if unknown:  # (a damaged checksum key would otherwise read as a snapshot without one)
        raise StoreError(f"{where}: unknown metadata {unknown}, expected 'json' and '{CRC_KEY}'")
    bad = [k for k, t in tensors.items() if t.dtype != torch.float32]
    if bad:
        raise StoreError(f"{where}: tensor {bad[0]} is {tensors[bad[0]].dtype}, expected float32")
    return tensors, meta, md


def digest(text: str, tensors: dict[str, torch.Tensor]) -> str:
    """crc32 of a snapshot's JSON metadata and of its tensors, by name."""
    c = crc32(text.encode())
    for name in sorted(tensors):
        c = crc32(name.encode(), c)
        c = crc32(tensors[name].contiguous().reshape(-1).view(torch.uint8).numpy(), c)
    return f"{c & 0xFFFFFFFF:08x}"


def _int(d: dict, key: str, where: str) -> int:
    v = d.get(key)
    if type(v) is not int or v < 0:
        raise StoreError(f"{where}: {key}={v!r}, expected an integer >= 0")
    return v


def _grace(d: dict, where: str) -> dict[str, float | None]:
    g = d.get("grace")
    ok = isinstance(g, dict) and all(
        v is None or (type(v) in (int, float) and math.isfinite(v)) for v in g.values()
    )
    if not ok:
        raise StoreError(f"{where}: grace={g!r}, expected an object of finite numbers or null")
    return g


def _fragment(
    meta: dict, tensors: dict[str, torch.Tensor], prefix: str, numels: list[int], where: str
) -> dict[str, Any]:
    """A fragment state from its metadata and tensors, checked against the values the syncer
    holds per fragment (`numels`: the plan's; 0 for those another shard serves)."""
    P = len(numels)
    if not isinstance(meta, dict):
        raise StoreError(f"{where}: fragment entry {meta!r}, expected an object")
    p = _int(meta, "fragment", where)
    if p >= P:
        raise StoreError(f"{where}: fragment {p} out of range [0, {P})")
    version = _int(meta, "version", where)
    _int(meta, "count", where)
    hist = meta.get("history", [version])
    if not isinstance(hist, list) or any(type(v) is not int or not 0 <= v <= version for v in hist):
        raise StoreError(f"{where}: history={hist!r}, expected versions in [0, {version}]")
    for k in ("theta", "public"):
        if f"{prefix}{k}" not in tensors:
            raise StoreError(f"{where}: tensor {prefix}{k} is missing")
    st = state_of(prefix, meta, tensors)
    numel = numels[p]
    named = {"theta": st["theta"], "public": st["public"], **st["outer"]}
    named.update({f"hist.{v}": t for v, t in st["history"].items()})
    for k, t in named.items():
        if isinstance(t, torch.Tensor) and tuple(t.shape) != (numel,):
            whose = ("none: another shard serves it" if not numel else
                     "the plan's: this state holds none of it (another shard's state?)"
                     if t.numel() == 0 else "the plan's")  # fmt: skip
            raise StoreError(
                f"{where}: fragment {p} {k} has shape {tuple(t.shape)}, expected ({numel},): "
                f"{whose}"
            )
    return st


def read_snapshot(path: Path, numels: list[int]) -> tuple[dict[str, Any], int, dict[str, Any]]:
    """(state for load_state_dict, tape_next, extra) of a snapshot file, checked against the
    values held per fragment."""
    P = len(numels)
    where = path.name
    tensors, meta, md = parse(read_file(path), where)
    if CRC_KEY in md and md[CRC_KEY] != digest(md["json"], tensors):
        raise StoreError(f"{where}: checksum mismatch: the snapshot was corrupted")
    tape_next = _int(meta, "tape_next", where)
    rounds = _int(meta, "rounds_closed", where)
    grace = _grace(meta, where)
    extra = meta.get("extra", {})
    frags = meta.get("fragments")
    if not isinstance(extra, dict) or not isinstance(frags, list):
        raise StoreError(f"{where}: expected 'fragments' (a list) and 'extra' (an object)")
    if len(frags) != P or not all(isinstance(f, dict) for f in frags):
        raise StoreError(f"{where}: {len(frags)} fragment entries, the plan has {P}")
    upgrade(meta, tensors)
    states = [_fragment(f, tensors, f"{f.get('fragment')}.", numels, where) for f in frags]
    if sorted(st["fragment"] for st in states) != list(range(P)):
        raise StoreError(f"{where}: fragments {[st['fragment'] for st in states]}, not 0..P-1")
    return {"rounds_closed": rounds, "grace": grace, "fragments": states}, tape_next, extra


def read_record(
    body: bytes, numels: list[int], where: str
) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(seq, fragment state for load_fragment_state, extra) of a tape record, checked."""
    tensors, meta, _md = parse(body, where)
    seq = _int(meta, "seq", where)
    st = _fragment(meta, tensors, "", numels, where)
    st.update(rounds_closed=_int(meta, "rounds_closed", where), grace=_grace(meta, where))
    extra = meta.get("extra", {})
    if not isinstance(extra, dict):
        raise StoreError(f"{where}: extra={extra!r}, expected an object")
    return seq, st, extra
