"""A zstd payload is exactly one frame of data (spec rules D-2, D-4; I-0a, I-0b for the
index): also when it declares 0 bytes, where zstandard's decompress() returns b"" without
reading the frame, so that skippable frames, trailing bytes and bad checksums went unchecked."""
import struct

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from inshrink.codecs import entropy
from inshrink.container.index import unpack_index
from inshrink.errors import CorruptError

EMPTY = zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress(b"")
DATA = zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress(b"x" * 100)


def _skippable(content: bytes) -> bytes:
    return struct.pack("<II", 0x184D2A50, len(content)) + content


def test_valid_frames_decode():
    assert entropy.decode("zstd", EMPTY, 0) == b""
    assert entropy.decode("zstd", memoryview(EMPTY), 0) == b""
    plain = zstandard.ZstdCompressor(write_checksum=False, write_content_size=True).compress(b"")
    assert entropy.decode("zstd", plain, 0) == b""
    assert entropy.decode("zstd", DATA, 100) == b"x" * 100


@pytest.mark.parametrize("payload, rule", [
    (_skippable(b""), "D-2"),
    (_skippable(b"") + b"garbage", "D-2"),
    (_skippable(b"") + _skippable(b""), "D-2"),
    (_skippable(b"") + EMPTY, "D-2"),
    (EMPTY + _skippable(b""), "D-4"),
    (EMPTY + b"garbage", "D-4"),
    (EMPTY + EMPTY, "D-4"),
    (EMPTY[:-1] + bytes([EMPTY[-1] ^ 1]), "D-4"),  # checksum
    (EMPTY[:-4], "D-4"),  # incomplete: the checksum is missing
], ids=["skippable", "skippable+garbage", "two-skippable", "skippable+frame",
        "frame+skippable", "frame+garbage", "two-frames", "bad-checksum", "truncated"])
def test_a_zero_byte_stream_is_exactly_one_valid_frame(payload, rule):
    with pytest.raises(CorruptError, match=rf"^\[{rule}\]"):
        entropy.decode("zstd", payload, 0)


def test_a_skippable_frame_is_not_a_frame_header_whatever_its_size():
    """Before: D-3 (the skippable frame's length read as a declared content size)."""
    with pytest.raises(CorruptError, match=r"^\[D-2\]"):
        entropy.decode("zstd", _skippable(b"abcd") + DATA, 100)


@given(st.sampled_from([(EMPTY, 0), (DATA, 100)]), st.binary(min_size=1, max_size=40))
def test_any_byte_after_the_frame_is_rejected(frame_and_size, extra):
    frame, size = frame_and_size
    with pytest.raises(CorruptError, match=r"^\[D-4\]"):
        entropy.decode("zstd", frame + extra, size)


@pytest.mark.parametrize("frame, rule", [
    (_skippable(b"{}"), "I-0a"),
    (EMPTY + b"garbage", "I-0b"),
    (EMPTY[:-1] + bytes([EMPTY[-1] ^ 1]), "I-0b"),
], ids=["skippable", "frame+garbage", "bad-checksum"])
def test_a_compressed_index_is_exactly_one_valid_frame(frame, rule):
    with pytest.raises(CorruptError, match=rf"^\[{rule}\]"):
        unpack_index(frame, 1 << 20)
