"""Codec chains: build the chain for a new tensor, and check a chain read from a file.

Format 1.1 knows two chains, each a single array->streams stage followed by per-chunk
zstd/raw coding: ``[bytegroup]`` (lossless) and ``[quant]`` (dynamic quantization).
"""
from __future__ import annotations

from ..container.index import TensorEntry
from ..dtypes import DType
from ..errors import CorruptError, UnknownCodecError
from . import lossless, quant

STAGES = {lossless.STAGE_ID: lossless.ByteGroup.from_dict, quant.STAGE_ID: quant.QuantPlan.from_dict}


def for_new_tensor(dtype: DType) -> lossless.ByteGroup:
    """The lossless chain the writer uses for a tensor of this dtype."""
    return lossless.plan(dtype)


def for_entry(entry: TensorEntry):
    """Validate a tensor entry's chain and stream sizes; return the decoder stage."""
    for stage_id in (s["id"] for s in entry.codec):
        if stage_id not in STAGES:
            raise UnknownCodecError(f"tensor {entry.name!r}: unknown codec stage {stage_id!r}")
    if len(entry.codec) != 1:
        raise CorruptError(f"tensor {entry.name!r}: expected exactly one codec stage")
    stage = STAGES[entry.codec[0]["id"]](entry.codec[0], entry.dtype)
    if len(entry.streams) != stage.streams:
        raise CorruptError(f"tensor {entry.name!r}: {len(entry.streams)} streams, its codec "
                           f"needs {stage.streams}")
    for c in range(entry.chunk_count):
        start, stop = entry.chunk_range(c)
        sizes = [stream[c].size for stream in entry.streams]
        if not stage.stream_sizes_ok(stop - start, sizes, entry.dtype.itemsize):
            raise CorruptError(f"tensor {entry.name!r}: chunk {c} sizes do not match its "
                               f"element range")
    return stage
