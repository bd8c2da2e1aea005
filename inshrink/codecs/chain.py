"""Codec chains: build the chain for a new tensor, and check a chain read from a file.

Format 1.4 knows five chains, each ending in one array->streams stage followed by per-chunk
zstd/raw coding: ``[bytegroup]`` (lossless), ``[quant]`` (dynamic quantization),
``[xor, bytegroup]`` (lossless delta: the bytes are XORed with the same tensor of the base file
before byte grouping), ``[codedelta, quant]`` (quantization-aware delta: codes stored as
cyclic differences from the base tensor's codes, regrouped by the base code) and
``[factored]`` (a matrix as the outer product of row and column factors).
"""
from __future__ import annotations

from ..container.index import TensorEntry
from ..dtypes import DType
from ..errors import CorruptError, UnknownCodecError
from . import factored, lossless, quant

STAGES = {lossless.STAGE_ID: lossless.ByteGroup.from_dict, quant.STAGE_ID: quant.QuantPlan.from_dict,
          factored.STAGE_ID: factored.FactoredPlan.from_dict}
XOR = "xor"


def for_new_tensor(dtype: DType) -> lossless.ByteGroup:
    """The lossless chain the writer uses for a tensor of this dtype."""
    return lossless.plan(dtype)


def for_entry(entry: TensorEntry):
    """Validate a tensor entry's chain and stream sizes; return the decoder stage."""
    for stage_id in (s["id"] for s in entry.codec):
        if stage_id not in STAGES and stage_id not in (XOR, quant.DELTA_ID):
            raise UnknownCodecError(f"tensor {entry.name!r}: unknown codec stage {stage_id!r}")
    codec, modulus = entry.codec, None
    if len(codec) == 2 and codec[0] == {"id": XOR} and codec[1]["id"] == lossless.STAGE_ID:
        codec = codec[1:]  # the delta is undone by the reader, after the byte planes
    elif (len(codec) == 2 and codec[0]["id"] == quant.DELTA_ID
          and set(codec[0]) == {"id", "modulus"} and codec[1]["id"] == quant.STAGE_ID):
        codec, modulus = codec[1:], codec[0]["modulus"]
    if len(codec) != 1 or codec[0]["id"] not in STAGES:
        raise CorruptError(f"tensor {entry.name!r}: expected one codec stage, "
                           f"[xor, bytegroup] or [codedelta, quant]")
    stage = STAGES[codec[0]["id"]](codec[0], entry.dtype)
    if modulus is not None:
        stage = stage.check_delta(modulus)
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


def is_delta(entry: TensorEntry) -> bool:
    """Whether the tensor decodes against the base file's tensor of the same name."""
    return entry.codec[0]["id"] in (XOR, quant.DELTA_ID)
