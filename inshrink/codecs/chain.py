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


def for_entry(entry: TensorEntry, has_base: bool = True):
    """Validate a tensor entry's chain and stream sizes; return the decoder stage.

    ``has_base``: whether the file names a base (a delta chain is invalid otherwise).
    Rules C-1 ... C-5 of spec section 16, in their order.
    """
    for stage_id in (s["id"] for s in entry.codec):
        if stage_id not in STAGES and stage_id not in (XOR, quant.DELTA_ID):
            raise UnknownCodecError(f"[C-1] tensor {entry.name!r}: unknown codec stage "
                                    f"{stage_id!r}")
    codec, delta = entry.codec, None
    if len(codec) == 2 and codec[0] == {"id": XOR} and codec[1]["id"] == lossless.STAGE_ID:
        codec, delta = codec[1:], XOR  # the delta is undone by the reader, after the planes
    elif (len(codec) == 2 and codec[0]["id"] == quant.DELTA_ID
          and set(codec[0]) == {"id", "modulus"} and codec[1]["id"] == quant.STAGE_ID):
        codec, delta = codec[1:], quant.DELTA_ID
    if len(codec) != 1 or codec[0]["id"] not in STAGES:
        raise CorruptError(f"[C-2] tensor {entry.name!r}: expected one codec stage, "
                           f"[xor, bytegroup] or [codedelta, quant]")
    if delta is not None and not has_base:
        raise CorruptError(f"[C-2] tensor {entry.name!r}: a {delta} chain in a file that "
                           f"names no base")
    stage = STAGES[codec[0]["id"]](codec[0], entry.dtype)
    if delta == quant.DELTA_ID:
        stage = stage.check_delta(entry.codec[0]["modulus"])
    if len(entry.streams) != stage.streams:
        raise CorruptError(f"[C-4] tensor {entry.name!r}: {len(entry.streams)} streams, its "
                           f"codec needs {stage.streams}")
    for c in range(entry.chunk_count):
        start, stop = entry.chunk_range(c)
        sizes = [stream[c].size for stream in entry.streams]
        if not stage.stream_sizes_ok(stop - start, sizes, entry.dtype.itemsize):
            raise CorruptError(f"[C-5] tensor {entry.name!r}: chunk {c} sizes do not match "
                               f"its element range")
    return stage


def is_delta(entry: TensorEntry) -> bool:
    """Whether the tensor decodes against the base file's tensor of the same name."""
    return entry.codec[0]["id"] in (XOR, quant.DELTA_ID)
