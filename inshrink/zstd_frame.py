"""One zstd frame of data: its header, the largest window a reader accepts, and its exact
decompression (spec/FORMAT.md, rules D-2 ... D-4 for chunks, I-0a and I-0b for the index).

Both the entropy stage (chunk payloads) and the container (the compressed index) read zstd
frames, and neither may import the other: the rules they share live here, with
:func:`zstd`, which imports zstandard when a frame is first made or read (not on
``import inshrink``).
"""
from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import zstandard

MAX_ZSTD_WINDOW = 1 << 27   # spec "Limits": Window_Size of any zstd frame (chunks and the index)
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def zstd() -> ModuleType:
    """The :mod:`zstandard` module, imported on first use."""
    import zstandard as module  # a look-up in sys.modules once imported
    return module


def zstd_frame_parameters(payload) -> zstandard.FrameParameters:
    """The header of the zstd frame ``payload`` starts with; ``zstandard.ZstdError`` if it
    does not start with one (a skippable frame holds no data: it is not one)."""
    if bytes(payload[:4]) != ZSTD_MAGIC:
        raise zstd().ZstdError("no zstd frame magic number")
    return zstd().get_frame_parameters(payload)


def zstd_decompress_frame(decompressor: zstandard.ZstdDecompressor, payload,
                          size: int) -> bytes:
    """``payload`` decompressed, exactly one zstd frame declaring ``size`` bytes with no byte
    after it; ``zstandard.ZstdError`` otherwise (the output may still differ from ``size``:
    the caller checks)."""
    if size:
        return decompressor.decompress(payload, max_output_size=size, allow_extra_data=False)
    # decompress() returns b"" for a frame declaring 0 bytes without reading on: its blocks,
    # its checksum and the bytes after it would go unchecked
    stream = decompressor.decompressobj()
    out = stream.decompress(payload)
    if not stream.eof:
        raise zstd().ZstdError("the frame is incomplete")
    if stream.unused_data:
        raise zstd().ZstdError(f"{len(stream.unused_data)} bytes follow the frame")
    return out
