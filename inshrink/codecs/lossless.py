"""Lossless codec: sign rotation + byte grouping (Numba), then zstd or raw per plane.

A tensor's bytes are cut into chunks of whole elements; every chunk is split into ``word``
planes and each plane is coded on its own, so a tensor has ``word`` streams with one chunk
each per element range. See spec/FORMAT.md, "Stage bytegroup".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import CorruptError
from ..kernels import bytegroup as kernels
from . import entropy

STAGE_ID = "bytegroup"

_WORD_TYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SPLIT = {2: kernels.split_u16, 4: kernels.split_u32, 8: kernels.split_u64}
_JOIN = {2: kernels.join_u16, 4: kernels.join_u32, 8: kernels.join_u64}


@dataclass(frozen=True)
class ByteGroup:
    """Parameters of the ``bytegroup`` stage: word width in bytes and sign rotation."""

    word: int
    rotate: bool

    def to_dict(self) -> dict:
        return {"id": STAGE_ID, "word": self.word, "rotate": self.rotate}

    @classmethod
    def from_dict(cls, d: dict, dtype: DType) -> "ByteGroup":
        """Validate stage parameters read from a file against the tensor's dtype."""
        if set(d) != {"id", "word", "rotate"} or d["id"] != STAGE_ID:
            raise CorruptError(f"[C-3] bad bytegroup stage parameters {d!r}")
        word, rotate = d["word"], d["rotate"]
        if type(word) is not int or word not in _WORD_TYPES or dtype.itemsize % word:
            raise CorruptError(f"[C-3] bytegroup word {word!r} does not divide {dtype.name}")
        if type(rotate) is not bool or (rotate and word == 1):
            raise CorruptError(f"[C-3] bad bytegroup rotate flag {rotate!r}")
        return cls(word, rotate)

    @property
    def streams(self) -> int:
        return self.word

    def stream_sizes_ok(self, n: int, sizes: list[int], itemsize: int) -> bool:
        """Every plane of a chunk of ``n`` elements holds n × itemsize / word bytes."""
        return all(size == n * itemsize // self.word for size in sizes)

    def decode(self, chunks: list[tuple], out: np.ndarray) -> None:
        """Decode one chunk from its planes' (coding, payload, size) into ``out``."""
        decode_chunk([(coding, payload) for coding, payload, _ in chunks], self, out)


def plan(dtype: DType) -> ByteGroup:
    """Choose the stage for a dtype: floats rotate their sign into the low byte."""
    if dtype.word > 1:
        return ByteGroup(dtype.word, True)
    return ByteGroup(dtype.itemsize if dtype.word == 0 else 1, False)  # integers, bool, fp8


def _readonly(plane: np.ndarray) -> np.ndarray:
    # Raw planes are views of a read buffer, decoded ones of immutable bytes: marking all
    # read-only gives the join kernel one type signature instead of one per mixture.
    plane.flags.writeable = False
    return plane


def encode_chunk(chunk: np.ndarray, stage: ByteGroup, level: int | None) -> list[tuple[str, bytes]]:
    """Encode one chunk (uint8, a whole number of words) into one (coding, payload) per plane."""
    if stage.word == 1:
        return [entropy.encode(chunk, level)]
    words = chunk.view(_WORD_TYPES[stage.word])
    planes = np.empty((stage.word, words.size), np.uint8)
    _SPLIT[stage.word](words, stage.rotate, planes)
    return [entropy.encode(plane, level) for plane in planes]


def decode_chunk(payloads: list[tuple[str, Any]], stage: ByteGroup, out: np.ndarray) -> None:
    """Decode the planes of one chunk into ``out`` (uint8, ``word`` × plane size bytes)."""
    n = out.size // stage.word
    planes = tuple(_readonly(np.frombuffer(entropy.decode(coding, payload, n), np.uint8))
                   for coding, payload in payloads)
    if stage.word == 1:
        out[:] = planes[0]
    else:
        _JOIN[stage.word](planes, stage.rotate, out.view(_WORD_TYPES[stage.word]))
