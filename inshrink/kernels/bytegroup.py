"""Byte grouping with sign rotation (format stage ``bytegroup``).

Each little-endian word is optionally rotated left by one bit, which moves a float's sign bit
to bit 0 so the top byte holds exactly the exponent (bf16, f32) or its top bits (f16, f64).
Plane ``k`` receives byte ``w-1-k`` of every (rotated) word: plane 0 is the most significant.

Callers guarantee: for ``split_*``, ``planes.shape == (w, n)``; for ``join_*``, ``planes`` is a
tuple of ``w`` uint8 arrays of length ``n`` (so decoded planes need no copying); and
``words.shape == (n,)``.
"""
from __future__ import annotations

import numpy as np
from . import kernel

_ONE = np.uint64(1)
_SIXTY_THREE = np.uint64(63)
_EIGHT = np.uint64(8)
_BYTE = np.uint64(0xFF)


@kernel
def split_u16(words, rotate, planes):
    for i in range(words.shape[0]):
        v = words[i]
        if rotate:
            v = ((v << 1) | (v >> 15)) & 0xFFFF
        planes[0, i] = v >> 8
        planes[1, i] = v & 0xFF


@kernel
def join_u16(planes, rotate, words):
    high, low = planes
    for i in range(words.shape[0]):
        v = (np.uint16(high[i]) << 8) | low[i]
        if rotate:
            v = ((v >> 1) | (v << 15)) & 0xFFFF
        words[i] = v


@kernel
def split_u32(words, rotate, planes):
    for i in range(words.shape[0]):
        v = words[i]
        if rotate:
            v = ((v << 1) | (v >> 31)) & 0xFFFFFFFF
        planes[0, i] = v >> 24
        planes[1, i] = (v >> 16) & 0xFF
        planes[2, i] = (v >> 8) & 0xFF
        planes[3, i] = v & 0xFF


@kernel
def join_u32(planes, rotate, words):
    p0, p1, p2, p3 = planes
    for i in range(words.shape[0]):
        v = ((np.uint32(p0[i]) << 24) | (np.uint32(p1[i]) << 16)
             | (np.uint32(p2[i]) << 8) | np.uint32(p3[i]))
        if rotate:
            v = ((v >> 1) | (v << 31)) & 0xFFFFFFFF
        words[i] = v


@kernel
def split_u64(words, rotate, planes):
    for i in range(words.shape[0]):
        v = words[i]
        if rotate:
            v = (v << _ONE) | (v >> _SIXTY_THREE)
        for k in range(8):
            planes[k, i] = (v >> np.uint64(56 - 8 * k)) & _BYTE


@kernel
def join_u64(planes, rotate, words):
    for i in range(words.shape[0]):
        v = np.uint64(0)
        for k in range(8):
            v = (v << _EIGHT) | np.uint64(planes[k][i])
        if rotate:
            v = (v >> _ONE) | (v << _SIXTY_THREE)
        words[i] = v
