"""The keyframe rule of a series: when a saved step is stored whole and when as a delta.

The newest step of a series is always whole, so that restoring it (what resuming training
needs) reads one file per rank. When a newer step is saved, the step before it is rewritten as
a delta against the new one, unless that would make a chain longer than ``keyframe_every``
files: then it stays whole, a keyframe, and starts the chain of the steps before it. Both
:class:`~.series.Series` and the DCP series decide with :func:`previous_becomes_delta`.
"""
from __future__ import annotations

from typing import Sequence

from .manifest import Entry


def previous_becomes_delta(entries: Sequence[Entry], keyframe_every: int, *,
                           compatible: bool = True) -> bool:
    """Whether the newest of the saved ``entries`` is rewritten as a delta against the step
    being saved (True), or stays whole as a keyframe (False).

    It becomes a delta only if it is whole now (a delta is never rewritten), if the new step
    can be its base (``compatible``: for a DCP series, the same world size and shards on each
    rank) and if the chain it then ends stays within ``keyframe_every`` files: the deltas
    right before it, itself, and the new step's whole file."""
    return (bool(entries) and entries[-1].keyframe and compatible
            and deltas_before(entries) + 2 <= keyframe_every)


def deltas_before(entries: Sequence[Entry]) -> int:
    """Deltas right before the newest entry: the files a restore of the oldest of them
    decodes before reaching it."""
    count = 0
    for e in reversed(entries[:-1]):
        if e.keyframe:
            break
        count += 1
    return count
