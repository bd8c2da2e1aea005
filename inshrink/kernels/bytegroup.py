"""Byte grouping with sign rotation (format stage ``bytegroup``).

Each little-endian word is optionally rotated left by one bit, which moves a float's sign bit
to bit 0 so the top byte holds exactly the exponent (bf16, f32) or its top bits (f16, f64).
Plane ``k`` receives byte ``w-1-k`` of every (rotated) word: plane 0 is the most significant.

Callers guarantee: for ``split_*``, ``planes.shape == (w, n)``; for ``join_*``, the ``w``
planes are separate C-contiguous uint8 arrays of length ``n`` (so decoded planes need no
copying; separate arguments, unlike a tuple, let Numba's dispatcher type them in C); and
``words.shape == (n,)``, C-contiguous.

Each kernel has one explicit signature: the first call compiles (or loads) just that one, and
read-only and writable inputs share it.
"""
from __future__ import annotations

import numpy as np
from .jit import kernel

_IN = "Array(uint8, 1, 'C', readonly=True)"  # a plane that is only read


def _words_in(word: str) -> str:
    return f"Array({word}, 1, 'C', readonly=True)"

_ONE = np.uint64(1)
_SIXTY_THREE = np.uint64(63)
_EIGHT = np.uint64(8)
_BYTE = np.uint64(0xFF)


@kernel(signatures=[f"void({_words_in('uint16')}, boolean, uint8[:, ::1])"])
def split_u16(words, rotate, planes):
    for i in range(words.shape[0]):
        v = words[i]
        if rotate:
            v = ((v << 1) | (v >> 15)) & 0xFFFF
        planes[0, i] = v >> 8
        planes[1, i] = v & 0xFF


@kernel(signatures=[f"void({_IN}, {_IN}, boolean, uint16[::1])"])
def join_u16(high, low, rotate, words):
    for i in range(words.shape[0]):
        v = (np.uint16(high[i]) << 8) | low[i]
        if rotate:
            v = ((v >> 1) | (v << 15)) & 0xFFFF
        words[i] = v


@kernel(signatures=[f"void({_words_in('uint32')}, boolean, uint8[:, ::1])"])
def split_u32(words, rotate, planes):
    for i in range(words.shape[0]):
        v = words[i]
        if rotate:
            v = ((v << 1) | (v >> 31)) & 0xFFFFFFFF
        planes[0, i] = v >> 24
        planes[1, i] = (v >> 16) & 0xFF
        planes[2, i] = (v >> 8) & 0xFF
        planes[3, i] = v & 0xFF


@kernel(signatures=[f"void({', '.join([_IN] * 4)}, boolean, uint32[::1])"])
def join_u32(p0, p1, p2, p3, rotate, words):
    for i in range(words.shape[0]):
        v = ((np.uint32(p0[i]) << 24) | (np.uint32(p1[i]) << 16)
             | (np.uint32(p2[i]) << 8) | np.uint32(p3[i]))
        if rotate:
            v = ((v >> 1) | (v << 31)) & 0xFFFFFFFF
        words[i] = v


@kernel(signatures=[f"void({_words_in('uint64')}, boolean, uint8[:, ::1])"])
def split_u64(words, rotate, planes):
    for i in range(words.shape[0]):
        v = words[i]
        if rotate:
            v = (v << _ONE) | (v >> _SIXTY_THREE)
        for k in range(8):
            planes[k, i] = (v >> np.uint64(56 - 8 * k)) & _BYTE


@kernel(signatures=[f"void({', '.join([_IN] * 8)}, boolean, uint64[::1])"])
def join_u64(p0, p1, p2, p3, p4, p5, p6, p7, rotate, words):
    for i in range(words.shape[0]):
        v = ((np.uint64(p0[i]) << np.uint64(56)) | (np.uint64(p1[i]) << np.uint64(48))
             | (np.uint64(p2[i]) << np.uint64(40)) | (np.uint64(p3[i]) << np.uint64(32))
             | (np.uint64(p4[i]) << np.uint64(24)) | (np.uint64(p5[i]) << np.uint64(16))
             | (np.uint64(p6[i]) << _EIGHT) | np.uint64(p7[i]))
        if rotate:
            v = (v >> _ONE) | (v << _SIXTY_THREE)
        words[i] = v
