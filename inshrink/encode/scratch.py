"""This thread's reusable arrays: released sketch counts and per-call temporaries.

A save quantizes tensor after tensor and chunk after chunk on a few threads; taking the
previous call's arrays again instead of allocating (and page-faulting) new ones saves a
noticeable part of a small tensor's work.
"""
from __future__ import annotations

import threading

import numpy as np

_spare = threading.local()


def spare_counts() -> dict[int, np.ndarray]:
    """This thread's released sketch counts, zero, by size."""
    spare = _spare.__dict__.get("counts")
    if spare is None:
        spare = _spare.counts = {}
    return spare


# elements: larger scratch arrays are made per call, not kept (a 4 MiB chunk of bfloat16 is
# 2^21 elements, its positions and others twice that; only their first entries are written)
_SCRATCH_KEPT = 1 << 22


def scratch_array(name: str, dtype: type, n: int) -> np.ndarray:
    """``n`` elements of this thread's scratch array ``name`` (contents undefined): a chunk's
    or a fit's temporaries, taken again by the next one on the thread instead of allocated
    (and page-faulted) per call. Whatever uses it must not keep it, nor call what takes the
    same name while using it."""
    if n > _SCRATCH_KEPT:
        return np.empty(n, dtype)
    kept = _spare.__dict__.setdefault("scratch", {})
    array = kept.get(name)
    if array is None or array.size < n or array.dtype != dtype:
        array = kept[name] = np.empty(min(max(n, 2 * (0 if array is None else array.size)),
                                          _SCRATCH_KEPT), dtype)
    return array[:n]
