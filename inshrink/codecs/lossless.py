"""Lossless codec: sign rotation + byte grouping (Numba), stage ``bytegroup``.

A tensor's bytes are cut into chunks of whole elements; every chunk is split into ``word``
planes and each plane is entropy-coded on its own, so a tensor has ``word`` streams with one
chunk each per element range. See spec/FORMAT.md, "Stage bytegroup".
"""
from __future__ import annotations

import collections
import contextlib
import operator
import os
import threading
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
        return sizes.count(n * itemsize // self.word) == len(sizes)  # one C loop

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
        planes = _new_planes(self.word, words.size)
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
                _join_small(streams, self.rotate, out)
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


def _join_small(planes: list, rotate: bool, out: np.ndarray) -> None:
    """Inverse of :func:`_split_small`: the words the planes (buffers of ``n`` bytes each)
    hold, written to ``out`` (uint8, ``len(planes) * n`` bytes) as the kernels write them.
    Each plane is copied straight to its byte of every word (no stacked copy, no byte
    swap): about 2.5 us less per chunk of a few thousand words."""
    word = len(planes)
    grid = out.reshape(-1, word)
    for k, plane in enumerate(planes):  # plane 0: the most significant byte, the last one
        grid[:, word - 1 - k] = np.frombuffer(plane, np.uint8)  # of a little-endian word
    if rotate:
        words = out.view(_WORD_TYPES[word])
        np.bitwise_or(words >> 1, words << (8 * word - 1), out=words)


_SIZE = operator.attrgetter("size")


class PlanePool:
    """Plane buffers that writers hand back once their records are written, to be filled
    again by the next chunks, of this save or the next one.

    A fresh 4 MiB buffer per chunk costs page faults when threads encode: glibc gives freed
    buffers of that size back to the kernel (a worker thread's arena at once, the main one
    when a save's buffers are freed together), which zeroes the pages again on the next use:
    9,000-20,000 faults per 256 MB save with 2 threads, 25-35% more CPU than with one.
    Buffers under ``min_bytes`` come from malloc's own free lists cheaply and are not pooled.

    Parameters
    ----------
    keep_bytes : int
        Free buffers kept between uses, at most this many bytes together (the largest kept).
    min_bytes : int
        Smaller requests get a new buffer, which is not kept.
    """

    def __init__(self, keep_bytes: int, min_bytes: int = 64 << 10) -> None:
        self._keep_bytes, self._min_bytes = keep_bytes, min_bytes
        self._free: list[np.ndarray] = []  # largest first
        # chunks submitted whose planes are not taken yet, by size: a checkpoint's tensors
        # come in a few sizes, and a promise of one size must not count another's buffers
        self._promised: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def _fitting(self, nbytes: int) -> int | None:
        """Index of the free buffer to take for ``nbytes``: one of that size, else the
        smallest of up to twice that size; None if there is none (holding the lock)."""
        best = None
        for i, buf in enumerate(self._free):  # largest first
            if buf.size < nbytes:
                break
            if buf.size <= 2 * nbytes:
                best = i
        return best

    def take(self, nbytes: int) -> np.ndarray:
        """A uint8 buffer of ``nbytes`` (a free one of that size, else the smallest of up to
        twice that size, sliced)."""
        if nbytes >= self._min_bytes:
            with self._lock:
                if self._promised[nbytes] > 0:
                    self._promised[nbytes] -= 1
                i = self._fitting(nbytes)
                if i is not None:
                    return self._free.pop(i)[:nbytes]
        return np.empty(nbytes, np.uint8)

    def reserve(self, nbytes: int) -> None:
        """Make sure a free buffer of ``nbytes`` waits for the :meth:`take` of a chunk just
        submitted, allocating it here, on the calling thread: freed memory of the main
        arena is reused, a worker's would go back to the kernel."""
        if nbytes < self._min_bytes:
            return
        with self._lock:
            self._promised[nbytes] += 1
            if sum(buf.size == nbytes for buf in self._free) < self._promised[nbytes]:
                self._free.append(np.empty(nbytes, np.uint8))
                self._free.sort(key=_SIZE, reverse=True)

    def give(self, buffers: list[np.ndarray]) -> None:
        """Hand back buffers from :meth:`take` whose contents nobody reads any more."""
        with self._lock:
            for buf in buffers:
                base = buf if buf.base is None else buf.base
                if base.size >= self._min_bytes:
                    self._free.append(base)
            self._free.sort(key=_SIZE, reverse=True)  # stable, as a sort by -size
            # keep those promised to submitted chunks, then the largest within the budget
            # (a plain dict's copy: a Counter's runs Python code, ~1.5 us of each give)
            promised = dict(self._promised)
            kept, total = [], 0
            for buf in self._free:
                size = buf.size
                if promised.get(size, 0) > 0:
                    promised[size] -= 1
                elif total + size > self._keep_bytes:
                    continue
                kept.append(buf)
                total += size
            self._free = kept

    @property
    def free_bytes(self) -> int:
        """Bytes held in free buffers."""
        with self._lock:
            return sum(buf.size for buf in self._free)


# Shared by every writer of the process: 7 chunks of the default 4 MiB are in flight with 2
# threads; a checkpoint saved again finds them mapped.
PLANES = PlanePool(keep_bytes=32 << 20)
# a child forked while another thread held the pool's lock would wait for it forever
os.register_at_fork(after_in_child=lambda: PLANES.__init__(32 << 20))


_lent = threading.local()


@contextlib.contextmanager
def planes_from(pool: PlanePool | None):
    """While active, :meth:`ByteGroup.encode` on this thread takes its planes from ``pool``;
    yields the list of buffers taken, for :meth:`PlanePool.give` once they are written."""
    taken: list[np.ndarray] = []
    previous = getattr(_lent, "lease", None)
    _lent.lease = None if pool is None else (pool, taken)
    try:
        yield taken
    finally:
        _lent.lease = previous


def _new_planes(word: int, n: int) -> np.ndarray:
    """An uninitialised ``(word, n)`` uint8 array, from the lent pool if there is one."""
    lease = getattr(_lent, "lease", None)
    if lease is None:
        return np.empty((word, n), np.uint8)
    pool, taken = lease
    buf = pool.take(word * n)
    taken.append(buf)
    return buf.reshape(word, n)


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
