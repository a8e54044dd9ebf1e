import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from atoll.core import codec

arrays = st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=300)


@settings(max_examples=80, deadline=None)
@given(arrays, st.sampled_from(sorted(codec.SCHEMES)), st.sampled_from([1, 7, 64]))
def test_round_trip_error_within_bound(xs, scheme, group):
    x = torch.tensor(xs, dtype=torch.float32)
    y = codec.decode(codec.encode(x, scheme, group), expect_numel=x.numel())
    assert ((x - y).abs() <= codec.error_bound(x, scheme, group)).all()
    if scheme == "fp32":
        assert torch.equal(x, y)


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 200),
    st.integers(2, 30),
    st.sampled_from(["int4", "int8", "bf16"]),
    st.integers(0, 10_000),
)
def test_error_feedback_sum_tracks_true_sum(n, rounds, scheme, seed):
    g = torch.Generator().manual_seed(seed)
    ef = codec.ErrorFeedback(scheme, group=16)
    true_sum, sent_sum = torch.zeros(n), torch.zeros(n)
    for _ in range(rounds):
        x = torch.randn(n, generator=g)
        true_sum += x
        sent_sum += codec.decode(ef.encode("k", x))
    # what is still missing is exactly the residual, itself within one quantization step
    assert torch.allclose(true_sum - sent_sum, ef.residual["k"], atol=1e-4)
    bound = codec.error_bound(true_sum - sent_sum + sent_sum, scheme, 16)
    assert ((true_sum - sent_sum).abs() <= bound.max() + 8 * 4.0 / 7 + 1e-3).all()


def test_error_feedback_beats_plain_quantization():
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(256, generator=g) * 0.01 + 0.003 for _ in range(50)]
    ef = codec.ErrorFeedback("int4")
    with_ef = sum(codec.decode(ef.encode(0, x)) for x in xs)
    without = sum(codec.quantize(x, "int4") for x in xs)
    truth = sum(xs)
    assert (with_ef - truth).norm() < 0.5 * (without - truth).norm()


def test_int4_is_about_eight_times_smaller_than_fp32():
    x = torch.randn(64 * 1024)
    assert len(codec.encode(x, "fp32")) / len(codec.encode(x, "int4")) > 7


def test_corrupted_frame_is_refused():
    frame = bytearray(codec.encode(torch.randn(100), "int8"))
    frame[-3] ^= 0xFF
    with pytest.raises(codec.CodecError, match="checksum"):
        codec.decode(bytes(frame))


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda f: f[:10], "shorter"),
        (lambda f: b"XXXX" + f[4:], "magic"),
        (lambda f: f[:4] + bytes([9]) + f[5:], "version"),
        (lambda f: f[:5] + bytes([77]) + f[6:], "scheme"),
        (lambda f: f + b"extra", "body"),
    ],
)
def test_malformed_frames_are_refused(mutate, match):
    with pytest.raises(codec.CodecError, match=match):
        codec.decode(mutate(codec.encode(torch.randn(10), "int4")))


def test_wrong_size_and_non_finite_are_refused():
    frame = codec.encode(torch.randn(10), "fp32")
    with pytest.raises(codec.CodecError, match="expected 12"):
        codec.decode(frame, expect_numel=12)
    with pytest.raises(codec.CodecError, match="non-finite"):
        codec.encode(torch.tensor([1.0, float("nan")]), "fp32")
    raw = torch.tensor([1.0, float("inf")]).numpy().tobytes()
    good = codec.encode(torch.tensor([1.0, 2.0]), "fp32", compress=False)
    bad = bytearray(good[:-8] + raw)
    import struct
    import zlib

    struct.pack_into("<I", bad, 24, zlib.crc32(raw))
    with pytest.raises(codec.CodecError, match="non-finite"):
        codec.decode(bytes(bad))


def test_unknown_scheme_is_a_config_error():
    from atoll.errors import ConfigError

    with pytest.raises(ConfigError, match="codec='int3'"):
        codec.encode(torch.ones(3), "int3")


def test_int_frames_refuse_values_near_the_float32_maximum_and_overflowing_frames():
    import zlib

    for scheme in ("int4", "int8"):
        with pytest.raises(codec.CodecError, match="float32 maximum"):
            codec.encode(torch.tensor([3.39e38, 1.0]), scheme)
        y = codec.decode(codec.encode(torch.tensor([3.0e38, -1.0]), scheme))
        assert torch.isfinite(y).all() and y[0] > 2.9e38
        assert codec.decode(codec.encode(torch.zeros(0), scheme)).numel() == 0
    # a crafted int8 frame: q = -128 (never written by encode) times a finite scale overflows
    scale = torch.tensor([3.0e38]).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    body = scale + bytes([0x80]) + bytes(63)
    head = codec._HEADER.pack(
        codec.MAGIC, codec.VERSION, codec.SCHEMES["int8"], 0, 0, 64, 64, len(body), zlib.crc32(body)
    )
    with pytest.raises(codec.CodecError, match="non-finite"):
        codec.decode(head + body)
