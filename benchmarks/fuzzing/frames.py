"""Families `codec` (core/codec.py: decode, peek) and `chunks` (wire/chunks.py: Assembler).

codec cases, each decoded the way the syncer does (`expect_numel`: the fragment's size) or the
way a learner does for an unknown fragment (`max_numel`), and peeked:
    random    bytes
    mutated   a valid frame of any scheme, with or without zstd, with header fields set to
              edge values and bytes mutated; the crc and body length optionally fixed again so
              that the decoder gets past them
    bomb      a tiny zstd body of RLE blocks whose frame declares (or does not declare) a huge
              size, under a header claiming any number of values
A clear refusal is `codec.CodecError` with a message; an accepted frame gives a finite float32
vector of the header's size, within the limit, equal to the encoder's value when not mutated.
"""

from __future__ import annotations

import struct
import zlib

import torch
from hypothesis import strategies as st

from atoll.core import codec
from atoll.wire.chunks import Assembler, TransferError, crc32, split
from fuzzing.base import MUTATIONS, Family, Violation, interesting_int, mutate

HEADER = struct.Struct("<4sBBBBQIII")
# header field -> (struct format, byte offset)
FIELDS = {
    "version": ("<B", 4),
    "scheme": ("<B", 5),
    "flags": ("<B", 6),
    "reserved": ("<B", 7),
    "numel": ("<Q", 8),
    "group": ("<I", 16),
    "body_len": ("<I", 20),
    "crc": ("<I", 24),
}
KIB = 1024


def spec() -> st.SearchStrategy[tuple]:
    """(scheme, numel, group, compress, seed, scale) of a valid frame."""
    return st.tuples(
        st.sampled_from(sorted(codec.SCHEMES)),
        st.one_of(st.integers(0, 70), st.integers(0, 600)),
        st.sampled_from([1, 2, 3, 16, 64, 128, 1000]),
        st.booleans(),
        st.integers(0, 2**16),
        st.sampled_from([0.0, 1e-30, 1e-3, 1.0, 1e4, 1e30, 3e38]),
    )


def valid_frame(s: tuple) -> tuple[bytes, torch.Tensor]:
    scheme, n, group, compress, seed, scale = s
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * scale
    x = x.clamp(-3e38, 3e38)
    try:
        return codec.encode(x, scheme, group, compress), x
    except codec.CodecError:  # values too close to the float32 maximum for int schemes
        x = x / 4
        return codec.encode(x, scheme, group, compress), x


def edit_header(frame: bytes, edits: list[tuple[str, int]]) -> bytes:
    b = bytearray(frame)
    for name, value in edits:
        fmt, off = FIELDS[name]
        if len(b) >= off + struct.calcsize(fmt):
            bits = 8 * struct.calcsize(fmt)
            struct.pack_into(fmt, b, off, value % (1 << bits))
    return bytes(b)


def refit(frame: bytes, fix_len: bool, fix_crc: bool) -> bytes:
    """The header's body_len and crc made to match the (mutated) body again."""
    if len(frame) < HEADER.size:
        return frame
    b = bytearray(frame)
    body = frame[HEADER.size :]
    if fix_len:
        struct.pack_into("<I", b, 20, len(body) % (1 << 32))
    if fix_crc:
        struct.pack_into("<I", b, 24, zlib.crc32(body))
    return bytes(b)


def rle_zstd(declared: int | None, blocks: int, size: int) -> bytes:
    """A zstd frame of `blocks` RLE blocks of `size` zero bytes, declaring `declared` bytes
    (None: no size, a window of 128 KiB): a few bytes that decompress to a lot."""
    out = struct.pack("<I", 0xFD2FB528)
    if declared is None:
        out += bytes([0x00, 7 << 3])
    else:
        out += bytes([0xE0]) + struct.pack("<Q", declared % (1 << 64))
    for i in range(blocks):
        last = 1 if i == blocks - 1 else 0
        out += struct.pack("<I", last | (1 << 1) | (size << 3))[:3] + b"\0"
    return out


LIMIT = st.one_of(st.tuples(st.just("expect")), st.tuples(st.just("max"), st.integers(0, 1 << 16)))
CODEC_CASES = st.one_of(
    st.tuples(st.just("random"), st.binary(max_size=300), LIMIT),
    st.tuples(
        st.just("mutated"),
        spec(),
        st.lists(st.tuples(st.sampled_from(sorted(FIELDS)), interesting_int(0)), max_size=3),
        st.one_of(st.just([]), MUTATIONS),
        st.booleans(),
        st.booleans(),
        LIMIT,
    ),
    st.tuples(
        st.just("bomb"),
        st.sampled_from(sorted(codec.SCHEMES)),
        interesting_int(0, 2**64 - 1),  # numel the header claims
        st.sampled_from([1, 64, 1 << 20, 2**32 - 1]),
        st.one_of(st.none(), interesting_int(0, 2**64 - 1), st.integers(0, 1 << 24)),
        st.integers(1, 24),
        st.sampled_from([1, 4096, 1 << 17]),
        st.one_of(  # the syncer's fragment size, or a learner's limit for an unknown fragment
            st.tuples(st.just("expect"), st.integers(0, 1 << 16)),
            st.tuples(st.just("max"), st.integers(0, 1 << 16)),
        ),
    ),
)


def build_codec(case: tuple) -> tuple[bytes, dict, torch.Tensor | None, int]:
    """(frame, decode's limit, the encoded value when the frame is untouched, the limit)."""
    kind = case[0]
    want, value = 0, None
    if kind == "random":
        frame = case[1]
    elif kind == "mutated":
        _, s, edits, ops, fix_len, fix_crc, _limit = case
        frame, x = valid_frame(s)
        want = s[1]
        if not edits and not ops:
            value = x
        frame = refit(mutate(edit_header(frame, edits), ops), fix_len, fix_crc)
    else:
        _, scheme, numel, group, declared, blocks, size, _limit = case
        body = rle_zstd(declared, blocks, size)
        head = HEADER.pack(
            b"ATF1",
            1,
            codec.SCHEMES[scheme],
            1,
            0,
            numel % (1 << 64),
            group,
            len(body),
            zlib.crc32(body),
        )
        frame = head + body
        want = case[-1][1]
    limit = case[-1]
    if limit[0] == "expect":
        return frame, {"expect_numel": want}, value, want
    return frame, {"max_numel": limit[1]}, None, limit[1]


def check_codec(case: tuple) -> str:
    frame, kw, value, _limit = build_codec(case)
    try:
        scheme, numel = codec.peek(frame)
    except codec.CodecError as exc:
        peeked = None
        if not str(exc):
            raise Violation("CodecError without a message") from exc
    else:
        peeked = (scheme, numel)
    try:
        out = codec.decode(frame, **kw)
    except codec.CodecError as exc:
        if not str(exc):
            raise Violation("CodecError without a message") from exc
        return "refused"
    if peeked is None:
        raise Violation("decode accepted a frame that peek refused")
    n = peeked[1]
    if out.dtype != torch.float32 or out.dim() != 1 or out.numel() != n:
        raise Violation(f"decoded {out.dtype} {tuple(out.shape)}, header says ({n},)")
    if n > kw.get("max_numel", 1 << 31) or kw.get("expect_numel", n) != n:
        raise Violation(f"accepted {n} values against the limit {kw}")
    if not bool(torch.isfinite(out).all()):
        raise Violation("decoded non-finite values")
    if value is not None and not torch.equal(out, codec.quantize(value, peeked[0], case[1][2])):
        raise Violation("an untouched frame decoded to another value")
    return "accepted"


def bound_codec(case: tuple) -> int:
    """What decode may allocate (traced): the body sliced off the frame, the decompressed body
    (at most the body `limit` values can make: <= 4 * limit + 64 bytes) and its copy."""
    frame, _kw, _v, limit = build_codec(case)
    return 2 * len(frame) + 2 * (4 * min(limit, 1 << 31) + 64) + 64 * KIB


CODEC = Family(
    "codec",
    CODEC_CASES,
    check_codec,
    "codec.CodecError with a message",
    bound_codec,
)


# -- chunks ------------------------------------------------------------------------------------
CHUNK_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("drop"), st.integers(0, 999)),
        st.tuples(st.just("dup"), st.integers(0, 999)),
        st.tuples(st.just("swap"), st.integers(0, 999), st.integers(0, 999)),
        st.tuples(st.just("corrupt"), st.integers(0, 999), st.integers(0, 9999)),
        st.tuples(st.just("extra"), st.binary(max_size=64)),
        st.tuples(st.just("empty"), st.integers(0, 999)),
    ),
    max_size=3,
)
CHUNK_CASES = st.tuples(
    st.binary(max_size=3000),  # payload
    st.integers(1, 1024),  # chunk size
    st.one_of(
        st.just(("exact",)),
        st.tuples(st.just("delta"), st.integers(-64, 64)),
        st.tuples(st.just("value"), interesting_int()),
    ),
    st.sampled_from(["right", "wrong", "zero"]),
    st.one_of(
        st.tuples(st.just("above"), st.integers(0, 4096)),
        st.tuples(st.just("value"), interesting_int()),
    ),
    CHUNK_OPS,
)


def build_chunks(case: tuple) -> tuple[bytes, list[bytes], int, int, int]:
    payload, size, total, crc, limit, ops = case
    chunks = list(split(payload, size))
    for op in ops:
        n = len(chunks)
        if op[0] == "drop" and n:
            del chunks[op[1] % n]
        elif op[0] == "dup" and n:
            chunks.insert(op[1] % n, chunks[op[1] % n])
        elif op[0] == "swap" and n:
            i, j = op[1] % n, op[2] % n
            chunks[i], chunks[j] = chunks[j], chunks[i]
        elif op[0] == "corrupt" and n:
            c = bytearray(chunks[op[1] % n])
            if c:
                c[op[2] % len(c)] ^= 0x5A
                chunks[op[1] % n] = bytes(c)
        elif op[0] == "extra":
            chunks.append(op[1])
        elif op[0] == "empty":
            chunks.insert(op[1] % (n + 1), b"")
    if total[0] == "exact":
        announced = len(payload)
    elif total[0] == "delta":
        announced = len(payload) + total[1]
    else:
        announced = total[1]
    c = {"right": crc32(payload), "wrong": crc32(payload) ^ 1, "zero": 0}[crc]
    lim = announced + limit[1] if limit[0] == "above" else limit[1]
    return payload, chunks, announced, c, lim


def check_chunks(case: tuple) -> str:
    payload, chunks, total, crc, limit = build_chunks(case)
    untouched = not case[5] and case[2] == ("exact",) and case[3] == "right"
    try:
        asm = Assembler(total, crc, limit)
        for ch in chunks:
            asm.add(ch)
            if not asm.size <= asm.total <= limit:
                raise Violation(f"holds {asm.size} bytes of {asm.total}, limit {limit}")
        data = asm.payload()
    except TransferError as exc:
        if not str(exc):
            raise Violation("TransferError without a message") from exc
        if untouched and total <= limit:
            raise Violation(f"an intact transfer was refused: {exc}") from exc
        return "refused"
    if len(data) != total or crc32(data) != crc or total > limit:
        raise Violation(f"accepted {len(data)} bytes (crc {crc32(data)}), announced {total}/{crc}")
    if case[3] == "wrong":
        raise Violation("accepted a payload whose announced crc is wrong")
    if untouched and data != payload:
        raise Violation("an intact transfer gave other bytes")
    return "accepted"


def bound_chunks(case: tuple) -> int:
    """The chunks kept (<= announced size <= limit) and their join."""
    _p, chunks, total, _crc, limit = build_chunks(case)
    held = max(0, min(total, limit, sum(len(c) for c in chunks)))
    return 2 * held + 64 * KIB


CHUNKS = Family("chunks", CHUNK_CASES, check_chunks, "TransferError with a message", bound_chunks)
