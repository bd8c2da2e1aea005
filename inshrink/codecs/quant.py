"""Dynamic quantization, stage ``quant`` (the paper's protect / prune / quantize): what is stored.

A quantized chunk is one code per element, an index into the stage's table of levels (the
level values in the tensor's dtype), plus the *escaped* elements (protected or non-finite)
whose exact values are stored aside. Decoding is a table lookup on the dtype's raw bit
patterns, so the decoder needs no float arithmetic and reproduces the level table bit for bit.
Choosing the levels and the codes is the encoder's job (:mod:`inshrink.encode.fit`,
:mod:`inshrink.encode.quantizer`).

Streams per chunk: 0 = one code per element, bit-packed at ``bits`` (see :func:`pack_codes`),
an escaped element carrying its nearest level's code; 1 = the escaped elements' positions in
the chunk as uint32 gaps (position minus previous position minus one); 2 = their exact
values, in the tensor's dtype. Each then goes through the entropy stage.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..dtypes import DType
from ..errors import CorruptError
from ..kernels import quant as kernels
from .base import ArrayStage, Undo

STAGE_ID = "quant"
_HEX = re.compile(r"[0-9a-fA-F]*")  # hex digits of either case, nothing else (spec 10.6.1)
MAX_LEVELS = 65_535
DTYPES = ("F64", "F32", "F16", "BF16")
WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class QuantChunk:
    """A chunk as the quant stage stores it: codes (uint16, one per element), the positions
    of its escaped elements (sorted) and their exact values (uint8, the dtype's bytes)."""

    codes: np.ndarray
    positions: np.ndarray
    values: np.ndarray


@dataclass(frozen=True, eq=False)
class Quant(ArrayStage):
    """Stage ``quant``: the level table (sorted values in the tensor's dtype) and the width
    codes are packed at."""

    id: ClassVar[str] = STAGE_ID
    minor: ClassVar[int] = 1
    dtype: DType
    levels: np.ndarray
    bits: int

    @property
    def escape(self) -> int:
        """The code the assignment kernel marks escaped elements with (never stored)."""
        return len(self.levels)

    @functools.cached_property
    def zero_code(self) -> int:
        """The code of the zero level (``escape`` without one); computed once per stage."""
        hits = np.flatnonzero(self.levels.astype(np.float64) == 0)
        return int(hits[0]) if hits.size else self.escape

    def to_dict(self) -> dict:
        return {"id": STAGE_ID, "bits": self.bits, "levels": self.levels.tobytes().hex()}

    @classmethod
    def from_dict(cls, d: dict, dtype: DType) -> "Quant":
        """Validate stage parameters read from a file (decoder side)."""
        if set(d) != {"id", "bits", "levels"} or d["id"] != STAGE_ID:
            raise CorruptError(f"[C-3] bad quant stage parameters {sorted(d)}")
        bits, hexed = d["bits"], d["levels"]
        if type(bits) is not int or not 1 <= bits <= 16:
            raise CorruptError(f"[C-3] quant bits {bits!r} not in [1, 16]")
        # hex digits only: bytes.fromhex alone would skip whitespace
        if (not isinstance(hexed, str) or len(hexed) % (2 * dtype.itemsize)
                or not _HEX.fullmatch(hexed)):
            raise CorruptError("[C-3] quant levels are not a hex string of whole elements")
        if dtype.name not in DTYPES:
            raise CorruptError(f"[C-3] quant stage on a {dtype.name} tensor")
        levels = np.frombuffer(bytes.fromhex(hexed), dtype.numpy)
        if len(levels) > MAX_LEVELS or code_bits(len(levels)) > bits:
            raise CorruptError(f"[C-3] {len(levels)} levels need more than {bits} bits")
        return cls(dtype, levels, bits)

    @property
    def streams(self) -> int:
        return 3

    def stream_sizes_ok(self, n: int, sizes: list[int], itemsize: int) -> bool:
        """Codes take ceil(n × bits / 8) bytes; positions 4 bytes and values one element per
        escaped element, at most n of them."""
        codes, positions, values = sizes
        return (codes == codes_size(n, self.bits) and positions % 4 == 0
                and positions // 4 <= n and values == positions // 4 * itemsize)

    def encode(self, chunk: QuantChunk) -> list[np.ndarray]:
        """The three streams of a chunk."""
        positions = chunk.positions
        gaps = np.empty(positions.size, "<u4")  # position minus previous position minus one
        if positions.size:  # (np.diff with prepend costs more than a small chunk's encoding)
            gaps[0] = positions[0]
            np.subtract(positions[1:], positions[:-1] + 1, out=gaps[1:], casting="unsafe")
        return [self.encode_codes(chunk.codes), gaps.view(np.uint8), chunk.values]

    def encode_codes(self, codes: np.ndarray) -> np.ndarray:
        """The codes stream (before entropy coding) of a chunk's codes."""
        return pack_codes(codes, self.bits)

    def decode_codes(self, stream, n: int, undo: Undo | None = None) -> np.ndarray:
        """The level codes of a chunk of ``n`` elements from its decoded codes stream
        (``undo``: the code delta to reverse)."""
        stored = np.empty(n, np.uint16)
        unpack_codes(np.frombuffer(stream, np.uint8), self.bits, stored)
        return stored if undo is None else undo(stored)

    def decode(self, streams: list, out: np.ndarray, undo: Undo | None = None) -> np.ndarray:
        """Decode one chunk's decoded streams into ``out`` (uint8, n × itemsize bytes);
        ``undo`` reverses a code delta. Returns the codes."""
        packed, gaps, values = streams
        n = out.size // self.dtype.itemsize
        word = WORDS[self.dtype.itemsize]
        words = out.view(word)
        codes = self.decode_codes(packed, n, undo)
        escaped = memoryview(gaps).nbytes // 4  # a whole number of gaps (rule C-5)
        if self.levels.size:
            largest = kernels.lookup_levels(codes, self.levels.view(word), words)
            if largest >= self.levels.size:
                first = int(np.argmax(codes >= self.levels.size))
                raise CorruptError(f"[D-5] quantization code out of range at element {first}")
        elif escaped != n:
            raise CorruptError("[D-5] a chunk without levels must escape every element")
        if escaped:  # most chunks escape nothing: no numpy calls for them
            positions = np.cumsum(np.frombuffer(gaps, "<u4").astype(np.int64) + 1) - 1
            if positions[-1] >= n:
                raise CorruptError("[D-6] escaped position past the end of its chunk")
            words[positions] = np.frombuffer(values, word)
        return codes


def code_bits(levels: int) -> int:
    """Bits per code for a table of ``levels`` levels (at least 1)."""
    return max(1, (levels - 1).bit_length())


def codes_size(n: int, bits: int) -> int:
    """Bytes of the codes stream of a chunk of ``n`` elements."""
    if bits <= 8:
        return (n * bits + 7) // 8
    return n + (n * (bits - 8) + 7) // 8


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes stream: bit-packed up to 8 bits. Wider codes are split into their top 8 bits, one
    byte each, and their remaining low bits, bit-packed: the byte plane carries the skewed
    part of the distribution where zstd's Huffman stage can code it, the low bits are nearly
    uniform anyway (measured within 0.05 bit/code of the codes' entropy on trained weights)."""
    if bits == 8:
        return codes.astype(np.uint8)
    if bits < 8:
        packed = np.zeros(codes_size(codes.size, bits), np.uint8)
        _pack_bits(codes, bits, packed)
        return packed
    low_bits = bits - 8
    low = np.zeros((codes.size * low_bits + 7) // 8, np.uint8)
    _pack_bits(codes & np.uint16((1 << low_bits) - 1), low_bits, low)
    return np.concatenate([(codes >> low_bits).astype(np.uint8), low])


def unpack_codes(stream: np.ndarray, bits: int, out: np.ndarray) -> None:
    """Inverse of :func:`pack_codes` into ``out`` (uint16, one per element)."""
    n = out.size
    if bits == 8:
        out[:] = stream[:n]
        return
    if bits < 8:
        _unpack_bits(stream, bits, n, out)
        return
    low_bits = bits - 8
    _unpack_bits(stream[n:], low_bits, n, out)
    out |= stream[:n].astype(np.uint16) << np.uint16(low_bits)


# Until a process has called the packing kernels, fewer codes of a width that divides a byte
# are packed and unpacked by numpy: a save or load of small tensors then compiles neither
# kernel (about 0.15 s each in a fresh environment, for a few microseconds saved per tensor).
_NUMPY_PACK_MAX = 1 << 14


# ... and once a process has packed this many chunks with numpy, the kernel packs them: it
# has then shown that it packs enough to pay for the compilation (the kernel takes 0.4-3 us
# against numpy's 3-12 us, measured 2026-12-01 on 256-4,096 codes of 1-4 bits).
_PACKS_BEFORE_KERNEL = 256
_packs_so_far = 0


def _pack_bits(codes: np.ndarray, bits: int, out: np.ndarray) -> None:
    """:func:`kernels.pack_bits` (same bytes)."""
    global _packs_so_far
    if kernels.pack_bits.ready or codes.size >= _NUMPY_PACK_MAX or 8 % bits:
        kernels.pack_bits(codes, bits, out)
        return
    _packs_so_far += 1  # unlocked: a lost update only delays the switch a little
    if _packs_so_far > _PACKS_BEFORE_KERNEL:
        kernels.pack_bits(codes, bits, out)
    else:
        _numpy_pack_bits(codes, bits, out)


def _numpy_pack_bits(codes: np.ndarray, bits: int, out: np.ndarray) -> None:
    """:func:`kernels.pack_bits` for ``bits`` in 1, 2, 4."""
    per_byte = 8 // bits
    lanes = np.zeros(out.size * per_byte, np.uint8)  # the padding codes are zero
    np.bitwise_and(codes, (1 << bits) - 1, out=lanes[:codes.size], casting="unsafe")
    lanes = lanes.reshape(out.size, per_byte)
    out[:] = lanes[:, 0]
    for lane in range(1, per_byte):
        out |= lanes[:, lane] << np.uint8(lane * bits)


def _unpack_bits(packed: np.ndarray, bits: int, n: int, out: np.ndarray) -> None:
    """:func:`kernels.unpack_bits` (same codes)."""
    if kernels.unpack_bits.ready or n >= _NUMPY_PACK_MAX or 8 % bits:
        kernels.unpack_bits(packed, bits, n, out)
    else:
        _numpy_unpack_bits(packed, bits, n, out)


def _numpy_unpack_bits(packed: np.ndarray, bits: int, n: int, out: np.ndarray) -> None:
    """:func:`kernels.unpack_bits` for ``bits`` in 1, 2, 4."""
    per_byte = 8 // bits
    used = packed[:(n * bits + 7) // 8]
    lanes = np.empty((used.size, per_byte), np.uint8)
    for lane in range(per_byte):
        np.right_shift(used, np.uint8(lane * bits), out=lanes[:, lane])
    lanes &= np.uint8((1 << bits) - 1)
    out[:] = lanes.reshape(-1)[:n]


def packing_bits(levels: int) -> int:
    """The width the writer packs codes at. Widths that do not divide a byte are widened so
    that codes line up with bytes and zstd's Huffman stage can exploit their skewed
    distribution, which bit-packed codes straddling bytes hide from it: 5-7 bits to 8
    (measured on trained weights: 7 -> 5.8 bits/code at 128 levels, 6 -> 4.9 at 64, 5 -> 4.6
    at 48), 3 bits to 4, two codes a byte (4 levels + pruned zeros: 2.14 -> 1.91 bits/element,
    8 levels: 2.45 -> 2.39, versus 8-bit codes)."""
    bits = code_bits(levels)
    return {3: 4, 5: 8, 6: 8, 7: 8}.get(bits, bits)
