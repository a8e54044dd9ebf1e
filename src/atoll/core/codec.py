"""The wire format of a fragment payload: a flat float32 vector, quantized, framed, checked.

Schemes (bits per value on the wire, before zstd, with the default group of 64):
    fp32  32        lossless
    bf16  16        relative error <= 2^-8 (plus 1e-38 for subnormals)
    int8   8.25     group-wise absmax: |error| <= scale/2, scale ~ absmax/127 (bf16 scales)
    int4   4.25     group-wise absmax: |error| <= scale/2, scale ~ absmax/7   (bf16 scales)

Frame (little endian):
    magic  b"ATF1" | version u8 | scheme u8 | flags u8 (bit 0: zstd) | reserved u8
    numel u64 | group u32 | body_len u32 | crc32(body) u32 | body
Decoding checks every field, the checksum and that all values are finite, and raises
`CodecError` naming what was wrong; it never returns a partial result. Its memory is bounded by
the size of the frame plus a few times the body that `numel` values of the scheme make (the
group of an int frame is at most `numel`, and a zstd body must decompress to exactly that
body: a small frame claiming a huge size is refused before anything is allocated).

Error feedback (`ErrorFeedback`): the sender adds the residual of what it could not send last
time to the next vector, so the sum of what was sent tracks the sum of the true values.
"""

from __future__ import annotations

import math
import struct
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import zstandard

from atoll.checksum import crc32
from atoll.core import quant
from atoll.core.choices import CODECS
from atoll.errors import ConfigError

if TYPE_CHECKING:
    from atoll.core.messages import Contribution, Outgoing

SCHEMES = {name: code for code, name in enumerate(CODECS)}  # fp32 0, bf16 1, int8 2, int4 3
# byte b of an int4 body holds two values: low nibble - 8, then high nibble - 8
QMAX = {"int8": 127, "int4": 7}
_HEADER = struct.Struct("<4sBBBBQIII")
MAGIC = b"ATF1"
VERSION = 1
_SCALE_UP = 1.0 + 2.0**-7  # stored bf16 scales are never smaller than absmax/qmax
QBOUND = {"int8": 128, "int4": 8}  # largest |q| a frame can hold (a crafted one included)
FLT_MAX = float(torch.finfo(torch.float32).max)
_FLT_MIN = float(torch.finfo(torch.float32).tiny)  # the smallest normal float32
MAX_NUMEL = 1 << 31  # decode's default limit on the values of one frame
_ZSTD_FLAG = 1


class CodecError(ValueError):
    """A payload that cannot be decoded; the message says why."""


def digest(t: torch.Tensor) -> bytes:
    """blake2b-128 of a tensor's float32 bytes (C order): equal digests, equal values. A heal
    skips fragments a fresh learner already holds (its Hello carries these by name)."""
    import hashlib

    data = t.detach().to(torch.float32).cpu().contiguous().reshape(-1).numpy()
    return hashlib.blake2b(memoryview(data).cast("B"), digest_size=16).digest()  # no copy


def check_scheme(scheme: str, setting: str = "codec") -> str:
    if scheme not in SCHEMES:
        raise ConfigError(setting, scheme, f"one of {sorted(SCHEMES)}")
    return scheme


def _groupscales_of(x: torch.Tensor, qmax: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x padded to whole groups, one row per group; bf16 scales, 1 for all-zero groups)."""
    pad = (-x.numel()) % group
    g = (torch.nn.functional.pad(x, (0, pad)) if pad else x).view(-1, group)
    absmax = quant.group_absmax(g)
    check_encodable(absmax.max().item() if absmax.numel() else 0.0)  # max propagates NaN, inf
    # a group whose scale would be below the smallest normal float is sent as zeros: such a
    # scale can round to 0 in bf16, and x/0 would make what the sender believes it sent NaN
    # (error feedback then carries NaN into every later frame of the fragment; residuals of a
    # fragment that stops changing shrink ~14x per frame and get there in a few dozen)
    zero = absmax < qmax * _FLT_MIN
    scales = absmax.div_(qmax).mul_(_SCALE_UP).to(torch.bfloat16).masked_fill_(zero, 1.0)
    return g, scales


def check_encodable(top: float) -> None:
    """Refuse a vector whose largest |value| is `top` when an int frame cannot hold it."""
    if not math.isfinite(top):
        raise CodecError("refusing to encode non-finite values")
    if top * _SCALE_UP * _SCALE_UP > FLT_MAX:  # its scale times qmax would overflow float32
        raise CodecError(f"refusing to encode |x| = {top:.3g}: too close to the float32 maximum")


def quantize(x: torch.Tensor, scheme: str, group: int = 64) -> torch.Tensor:
    """Round-trip `x` through `scheme` without framing (what the receiver will see)."""
    return decode(encode(x, scheme, group, compress=False))


def error_bound(x: torch.Tensor, scheme: str, group: int = 64) -> torch.Tensor:
    """Per-element bound on |x - quantize(x)|."""
    x = x.reshape(-1).float()
    if scheme == "fp32":
        return torch.zeros_like(x)
    if scheme == "bf16":
        return x.abs() * 2.0**-8 + 1e-38  # relative, plus bf16 subnormal spacing
    _, scales = _groupscales_of(x, QMAX[scheme], group)
    per = (scales.float() / 2).repeat_interleave(group)[: x.numel()]
    return per * (1 + 1e-6) + 1e-30


def all_finite(x: torch.Tensor) -> bool:
    """Whether every value of float tensor `x` is finite: its sum is (a NaN or an infinity
    makes the sum NaN or infinite) or, when the sum overflows, its least and largest values
    are (one pass each, no tensor of flags)."""
    if math.isfinite(float(x.sum())):
        return True
    lo, hi = torch.aminmax(x) if x.numel() else (x.new_zeros(()), x.new_zeros(()))
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def _check_finite(x: torch.Tensor) -> None:
    if not all_finite(x):
        raise CodecError("refusing to encode non-finite values")


def encode(x: torch.Tensor, scheme: str, group: int = 64, compress: bool = True) -> bytes:
    return _encode(x, scheme, group, compress)[0]


def encode_sent(x: torch.Tensor, scheme: str, group: int = 64) -> tuple[bytes, torch.Tensor]:
    """(frame, what `decode` returns for it), without decoding it."""
    frame, sent = _encode(x, scheme, group, want_sent=True)
    assert sent is not None
    return frame, sent


def _encode(
    x: torch.Tensor, scheme: str, group: int = 64, compress: bool = True, want_sent: bool = False
) -> tuple[bytes, torch.Tensor | None]:
    """(frame, what the receiver will decode from it when `want_sent`, else None). The
    decoded value is computed here with the same arithmetic as `decode`, so that error
    feedback needs no decode of its own (one torch op costs a GIL round trip on the learner's
    communication thread)."""
    check_scheme(scheme)
    x = x.detach().reshape(-1).float().contiguous()
    # one group of all the values when they are fewer than `group`: the same scale and values,
    # without padding (a decoder refuses a group larger than the frame's values)
    group = max(1, min(group, x.numel()))
    sent = None
    if scheme == "fp32":
        _check_finite(x)
        body = x.numpy().tobytes()
        sent = x if want_sent else None
    elif scheme == "bf16":
        _check_finite(x)
        b = x.to(torch.bfloat16)
        body = b.view(torch.int16).numpy().tobytes()
        sent = b.float() if want_sent else None
    else:
        qmax = QMAX[scheme]
        g, scales = _groupscales_of(x, qmax, group)
        sf = scales.float().unsqueeze(1)
        n_groups = g.shape[0]
        body_arr = bytearray(body_len(scheme, x.numel(), group))
        with warnings.catch_warnings():  # torch warns of every non-writable buffer, not this
            warnings.simplefilter("ignore", UserWarning)
            raw = (
                torch.frombuffer(body_arr, dtype=torch.uint8)
                if body_arr
                else torch.zeros(0, dtype=torch.uint8)
            )
        raw[: 2 * n_groups].view(torch.int16).copy_(scales.view(torch.int16))
        out = torch.empty(g.numel()) if want_sent else None
        quant.quantize(g, sf, scheme, qmax, raw[2 * n_groups :], out)
        sent = out[: x.numel()] if out is not None else None
        body = bytes(body_arr) if not compress else body_arr
    return framed(scheme, x.numel(), group, body, compress), sent


def framed(scheme: str, numel: int, group: int, body: bytes | bytearray, compress: bool = True):
    """The frame of an encoded `body` (zstd-compressed when `compress`): its header and it."""
    flags = 0
    if compress:
        body = zstandard.ZstdCompressor(level=1).compress(body)
        flags |= _ZSTD_FLAG
    header = _HEADER.pack(
        MAGIC, VERSION, SCHEMES[scheme], flags, 0, numel, group, len(body), crc32(body)
    )
    return header + body


def peek(frame: bytes) -> tuple[str, int]:
    """(scheme, numel) of a frame, after checking its header only."""
    if len(frame) < _HEADER.size:
        raise CodecError(
            f"frame of {len(frame)} bytes is shorter than its {_HEADER.size}-byte header"
        )
    magic, version, scheme_id, flags, reserved, numel, _g, _blen, _crc = _HEADER.unpack_from(frame)
    if magic != MAGIC:
        raise CodecError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise CodecError(f"frame version {version}, this atoll reads version {VERSION}")
    names = {v: k for k, v in SCHEMES.items()}
    if scheme_id not in names:
        raise CodecError(f"unknown scheme id {scheme_id}, known: {sorted(names)}")
    if flags & ~_ZSTD_FLAG:
        raise CodecError(f"flags {flags:#04x}: only bit 0 (zstd) is defined")
    if reserved:
        raise CodecError(f"reserved byte is {reserved}, must be 0")
    return names[scheme_id], numel


def decode(
    frame: bytes, expect_numel: int | None = None, max_numel: int = MAX_NUMEL
) -> torch.Tensor:
    return decode_body(*checked_body(frame, expect_numel, max_numel))


def decode_body(scheme: str, numel: int, group: int, raw: torch.Tensor) -> torch.Tensor:
    """The values of a frame's body (`checked_body`), checked finite."""
    if numel == 0:
        return torch.zeros(0)
    if scheme == "fp32":
        out = raw.view(torch.float32).clone()
    elif scheme == "bf16":
        out = raw.view(torch.int16).view(torch.bfloat16).float()
    else:
        n_groups, sf, top = scales_of(raw, numel, group)
        out = torch.empty(n_groups * group)
        quant.dequantize(raw[2 * n_groups :], sf, group, scheme, out)
        out = out[:numel]
        if top * QBOUND[scheme] <= FLT_MAX:  # |q| <= QBOUND: every value is finite
            return out
    if not all_finite(out):
        raise CodecError("payload holds non-finite values")
    return out


def scales_of(raw: torch.Tensor, numel: int, group: int) -> tuple[int, torch.Tensor, float]:
    n_groups = -(-numel // group)
    sf = raw[: 2 * n_groups].view(torch.int16).view(torch.bfloat16).float()
    top = sf.abs().max().item() if n_groups else 0.0
    if not math.isfinite(top):
        raise CodecError("payload holds non-finite values")
    return n_groups, sf, top


def checked_body(
    frame: bytes, expect_numel: int | None, max_numel: int
) -> tuple[str, int, int, torch.Tensor]:
    """(scheme, numel, group, the body's bytes) of a frame whose every field was checked."""
    scheme, numel = peek(frame)
    _m, _v, _s, flags, _r, _n, group, blen, crc = _HEADER.unpack_from(frame)
    if expect_numel is not None and numel != expect_numel:
        raise CodecError(f"frame holds {numel} values, expected {expect_numel}")
    if numel > max_numel:
        raise CodecError(f"frame holds {numel} values, over the limit of {max_numel}")
    if scheme in QMAX and not 1 <= group <= max(numel, 1):
        raise CodecError(
            f"group size {group} of a frame of {numel} values: must be in [1, {max(numel, 1)}]"
        )
    body = memoryview(frame)[_HEADER.size :]  # not a copy of the body
    if len(body) != blen:
        raise CodecError(f"body is {len(body)} bytes, header says {blen}")
    if crc32(body) != crc:
        raise CodecError("checksum mismatch: the payload was corrupted")
    expected = body_len(scheme, numel, group)
    if flags & _ZSTD_FLAG:
        body = _decompress(body, expected)
    if len(body) != expected:
        raise CodecError(
            f"{scheme} body of {len(body)} bytes, expected {expected} for {numel} values"
        )
    if not len(body):
        return scheme, numel, group, torch.zeros(0, dtype=torch.uint8)
    with warnings.catch_warnings():  # a read-only buffer: only read, never written
        warnings.simplefilter("ignore", UserWarning)
        return scheme, numel, group, torch.frombuffer(body, dtype=torch.uint8)  # not a copy


def _decompress(body: bytes, expected: int) -> bytes:
    """A zstd body that must decompress to exactly `expected` bytes; the size its frame
    declares is checked before any output is allocated (zstd trusts it)."""
    try:
        declared = zstandard.get_frame_parameters(body).content_size
        if declared != zstandard.CONTENTSIZE_UNKNOWN and declared != expected:
            raise CodecError(
                f"zstd frame declares {declared} bytes, the header's values make {expected}"
            )
        return zstandard.ZstdDecompressor().decompress(
            body, max_output_size=expected, allow_extra_data=False
        )
    except zstandard.ZstdError as exc:
        raise CodecError(f"zstd: {exc}") from exc


def body_len(scheme: str, numel: int, group: int) -> int:
    if scheme == "fp32":
        return 4 * numel
    if scheme == "bf16":
        return 2 * numel
    n_groups = -(-numel // group)
    padded = n_groups * group
    return 2 * n_groups + (padded if scheme == "int8" else -(-padded // 2))


@dataclass
class ErrorFeedback:
    """Keeps, per key, what quantization left out, and adds it to the next vector."""

    scheme: str
    group: int = 64
    enabled: bool = True
    residual: dict[object, torch.Tensor] = field(default_factory=dict)

    def encode(self, key: object, x: torch.Tensor) -> bytes:
        x = x.reshape(-1).float()
        if self.enabled and key in self.residual:
            x = x + self.residual[key]
        track = self.enabled and self.scheme != "fp32"
        frame, sent = _encode(x, self.scheme, self.group, want_sent=track)
        if track:
            assert sent is not None
            self.residual[key] = x - sent
        return frame

    def reset(self, key: object | None = None) -> None:
        if key is None:
            self.residual.clear()
        else:
            self.residual.pop(key, None)


class ContributionEncoder:
    """A learner's encoder, owned by its driver: encodes `Outgoing` contributions in send
    order with error feedback. A newer heal generation starts the residuals over; an
    `Outgoing` of an older generation is obsolete (the heal replaced its base): None."""

    def __init__(self, scheme: str, group: int = 64, error_feedback: bool = True) -> None:
        self.ef = ErrorFeedback(check_scheme(scheme), group, error_feedback)
        self.generation = 0

    def encode(self, o: Outgoing) -> Contribution | None:
        if o.generation < self.generation:
            return None
        if o.generation > self.generation:
            self.ef.reset()
            self.generation = o.generation
        return o.encoded(self.ef.encode(o.fragment, o.delta))
