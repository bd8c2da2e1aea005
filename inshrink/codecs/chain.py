"""Codec chains: build the chain for a new tensor, and check a chain read from a file.

Format 1.0 defines one chain, ``[bytegroup]`` followed by per-chunk zstd/raw coding.
"""
from __future__ import annotations

from ..container.index import TensorEntry
from ..dtypes import DType
from ..errors import CorruptError, UnknownCodecError
from . import lossless


def for_new_tensor(dtype: DType) -> lossless.ByteGroup:
    """The chain the writer uses for a tensor of this dtype (lossless)."""
    return lossless.plan(dtype)


def for_entry(entry: TensorEntry) -> lossless.ByteGroup:
    """Validate a tensor entry's chain and stream sizes; return the decoder stage."""
    for stage_id in (s["id"] for s in entry.codec):
        if stage_id != lossless.STAGE_ID:
            raise UnknownCodecError(f"tensor {entry.name!r}: unknown codec stage {stage_id!r}")
    if len(entry.codec) != 1:
        raise CorruptError(f"tensor {entry.name!r}: expected exactly one codec stage")
    stage = lossless.ByteGroup.from_dict(entry.codec[0], entry.dtype)
    if len(entry.streams) != stage.streams:
        raise CorruptError(f"tensor {entry.name!r}: {len(entry.streams)} streams, "
                           f"bytegroup word {stage.word} needs {stage.streams}")
    words_per_element = entry.dtype.itemsize // stage.word
    for c in range(entry.chunk_count):
        start, stop = entry.chunk_range(c)
        expected = (stop - start) * words_per_element
        if any(stream[c].size != expected for stream in entry.streams):
            raise CorruptError(f"tensor {entry.name!r}: chunk {c} sizes do not match its "
                               f"element range")
    return stage
