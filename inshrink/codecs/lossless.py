"""Lossless codec: sign rotation + byte grouping (Numba), stage ``bytegroup``.

A tensor's bytes are cut into chunks of whole elements; every chunk is split into ``word``
planes and each plane is entropy-coded on its own, so a tensor has ``word`` streams with one
chunk each per element range. See spec/FORMAT.md, "Stage bytegroup".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..dtypes import DType
from ..errors import CorruptError
from ..kernels import bytegroup as kernels
from . import entropy
from .base import ArrayStage, Undo

STAGE_ID = "bytegroup"

_WORD_TYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SPLIT = {2: kernels.split_u16, 4: kernels.split_u32, 8: kernels.split_u64}
_JOIN = {2: kernels.join_u16, 4: kernels.join_u32, 8: kernels.join_u64}


@dataclass(frozen=True, eq=False)
class ByteGroup(ArrayStage):
    """Stage ``bytegroup``: word width in bytes and sign rotation."""

    id: ClassVar[str] = STAGE_ID
    minor: ClassVar[int] = 0
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

    @classmethod
    def for_dtype(cls, dtype: DType) -> "ByteGroup":
        """The writer's default for a dtype: floats rotate their sign into the low byte."""
        if dtype.word > 1:
            return cls(dtype.word, True)
        return cls(dtype.itemsize if dtype.word == 0 else 1, False)  # integers, bool, fp8

    @property
    def streams(self) -> int:
        return self.word

    def stream_sizes_ok(self, n: int, sizes: list[int], itemsize: int) -> bool:
        """Every plane of a chunk of ``n`` elements holds n × itemsize / word bytes."""
        return all(size == n * itemsize // self.word for size in sizes)

    def encode(self, chunk: np.ndarray) -> list[np.ndarray]:
        """The planes of one chunk (uint8, a whole number of words)."""
        if self.word == 1:
            return [chunk]
        words = chunk.view(_WORD_TYPES[self.word])
        split = _SPLIT[self.word]
        if words.size < SMALL_CHUNK_WORDS and not split.ready:
            return list(_split_small(words, self.rotate))
        if not words.flags.aligned:  # the kernels are compiled for aligned words only
            words = words.copy()
        planes = np.empty((self.word, words.size), np.uint8)
        split(words, self.rotate, planes)
        return list(planes)

    def decode(self, streams: list, out: np.ndarray, undo: Undo | None = None) -> None:
        """Join one chunk's decoded planes into ``out`` (uint8, ``word`` × plane size bytes);
        ``undo`` (an XOR delta) then applies to the joined bytes."""
        if self.word == 1:
            out[:] = np.frombuffer(streams[0], np.uint8)
        else:
            words = out.view(_WORD_TYPES[self.word])
            join = _JOIN[self.word]
            if words.size < SMALL_CHUNK_WORDS and not join.ready:
                words[:] = _join_small([np.frombuffer(plane, np.uint8) for plane in streams],
                                       self.rotate, words.dtype)
                if undo is not None:
                    undo(out)
                return
            target = words if words.flags.aligned else np.empty_like(words)
            join(*[np.frombuffer(plane, np.uint8) for plane in streams], self.rotate, target)
            if target is not words:
                words[:] = target
        if undo is not None:
            undo(out)


# Chunks of fewer words are grouped with numpy instead of the kernels until the kernel is
# compiled (by a larger chunk): numpy is about 10 us slower per call, but a dtype that only
# small tensors use (step counters, biases) then needs no kernel compiled, and a file of
# small tensors no Numba started (0.1 s per kernel the first time on a machine, 0.3 s to
# start Numba in each process). Both give the same bytes.
SMALL_CHUNK_WORDS = 4096


def _split_small(words: np.ndarray, rotate: bool) -> np.ndarray:
    """The ``(word, n)`` planes of ``words`` in numpy: what the split kernels compute."""
    bits = 8 * words.dtype.itemsize
    if rotate:
        words = (words << 1) | (words >> (bits - 1))
    big_endian = words.astype(words.dtype.newbyteorder(">"))  # plane 0: most significant
    return np.ascontiguousarray(big_endian.view(np.uint8).reshape(-1, bits // 8).T)


def _join_small(planes: list[np.ndarray], rotate: bool, dtype: np.dtype) -> np.ndarray:
    """Inverse of :func:`_split_small`: the words (of ``dtype``) the planes hold."""
    bits = 8 * dtype.itemsize
    big_endian = np.stack(planes, axis=1).view(dtype.newbyteorder(">")).reshape(-1)
    words = big_endian.astype(dtype)
    if rotate:
        words = (words >> 1) | (words << (bits - 1))
    return words


# The chunk functions of earlier releases, which benchmarks/bench_series.py and the fuzzer call.

def plan(dtype: DType) -> ByteGroup:
    """The writer's default stage for a dtype (:meth:`ByteGroup.for_dtype`)."""
    return ByteGroup.for_dtype(dtype)


def encode_chunk(chunk: np.ndarray, stage: ByteGroup, level: int | None) -> list[tuple[str, Any]]:
    """One (coding, payload) per plane of a chunk (uint8, a whole number of words)."""
    return [entropy.encode(plane, level) for plane in stage.encode(chunk)]


def decode_chunk(payloads: list[tuple[str, Any]], stage: ByteGroup, out: np.ndarray) -> None:
    """Decode the planes of one chunk into ``out`` (uint8, ``word`` × plane size bytes)."""
    n = out.size // stage.word
    stage.decode([entropy.decode(coding, payload, n) for coding, payload in payloads], out)
