"""Delta kernels: cyclic differences of level codes between checkpoints, and regrouping of
the deltas by the previous code.

The delta of a quantised tensor is ``D = (prev - cur) mod B`` over its codes, regrouped by
``prev``: a stable partition that puts every position whose previous code is 0 first (in
position order), then those whose previous code is 1, and so on. A decoder that knows ``prev``
recomputes the group sizes, undoes the partition and takes ``cur = (prev - D) mod B``, with no
other metadata.

Callers guarantee, for each kernel:

``cyclic_delta(prev, cur, modulus, out)`` and ``cyclic_undelta(prev, delta, modulus, out)``
    ``1 <= modulus <= 65536`` (an integer); ``prev``, ``cur``, ``delta`` and ``out`` are uint16
    of one length, and every element of ``prev``, ``cur`` and ``delta`` is ``< modulus``.

``group_counts(prev, nlevels, counts)``
    ``prev`` is uint16 with every element ``< nlevels``; ``counts`` is int64 of length
    ``>= nlevels``. The first ``nlevels`` counts are overwritten.

``regroup(prev, values, counts, out)`` and ``ungroup(prev, grouped, counts, out)``
    ``prev`` is uint16 with every element ``< len(counts)``; ``counts`` is int64 and equal to
    the counts ``group_counts`` gives for ``prev`` (any extra trailing entries are zero);
    ``values``, ``grouped`` and ``out`` share one dtype and have ``len(prev)`` elements.
"""
from __future__ import annotations

import numpy as np
from .jit import kernel


@kernel
def cyclic_delta(prev, cur, modulus, out):
    """Write ``(prev - cur) mod modulus`` element by element."""
    m = np.int64(modulus)
    for i in range(prev.shape[0]):
        d = np.int64(prev[i]) - np.int64(cur[i])
        if d < 0:
            d += m
        out[i] = d


@kernel
def cyclic_undelta(prev, delta, modulus, out):
    """Write ``(prev - delta) mod modulus`` element by element: the inverse of
    ``cyclic_delta``."""
    m = np.int64(modulus)
    for i in range(prev.shape[0]):
        c = np.int64(prev[i]) - np.int64(delta[i])
        if c < 0:
            c += m
        out[i] = c


@kernel
def group_counts(prev, nlevels, counts):
    """Count the positions holding each code: ``counts[v]`` = number of ``i`` with
    ``prev[i] == v``, for ``v < nlevels``."""
    for v in range(nlevels):
        counts[v] = 0
    for i in range(prev.shape[0]):
        counts[prev[i]] += 1


@kernel
def _group_starts(counts):
    """Exclusive prefix sum of ``counts``: where each group begins."""
    starts = np.empty(counts.shape[0], np.int64)
    total = 0
    for v in range(counts.shape[0]):
        starts[v] = total
        total += counts[v]
    return starts


@kernel
def regroup(prev, values, counts, out):
    """Stable partition of ``values`` by ``prev``: group ``v`` holds, in position order, the
    values at the positions where ``prev`` is ``v``, and the groups follow one another in
    increasing ``v``."""
    starts = _group_starts(counts)
    for i in range(prev.shape[0]):
        v = prev[i]
        j = starts[v]
        out[j] = values[i]
        starts[v] = j + 1


@kernel
def ungroup(prev, grouped, counts, out):
    """Undo ``regroup``: position ``i`` takes the next unread value of group ``prev[i]``."""
    starts = _group_starts(counts)
    for i in range(prev.shape[0]):
        v = prev[i]
        j = starts[v]
        out[i] = grouped[j]
        starts[v] = j + 1
