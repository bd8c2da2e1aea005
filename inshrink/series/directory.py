"""What a series' writer does to its directory besides the manifest: it holds the series'
lock, and removes what the manifest no longer names.

One writer at a time: a writer takes an exclusive non-blocking ``flock`` on ``.lock`` in the
series directory before it reads the manifest to change it; a second writer gets a
:class:`~inshrink.errors.SeriesLockedError` at once (a save may take minutes) instead of
waiting or silently dropping the other's steps. Files are removed only once a manifest that
no longer names them is in place, and only at best: one left behind is an orphan, which the
next writer removes.
"""
from __future__ import annotations

import os
import shutil

from ..atomic import take_write_lock

LOCK = ".lock"
"""The file a writer of the series holds an exclusive ``flock`` on."""


def take_lock(directory: str, busy: str) -> int | None:
    """Take the series' write lock without waiting: its descriptor (None where there is no
    ``flock``), for :func:`inshrink.atomic.release_write_lock`. SeriesLockedError
    ``"{directory}: another writer (pid N) {busy}"`` if someone holds it."""
    return take_write_lock(os.path.join(directory, LOCK), directory, busy)


def remove(path: str, *, tree: bool = False) -> None:
    """Remove a file the manifest no longer names (with ``tree``, a step directory too), at
    best: what is left is only debris, which the next writer removes, so a failure here does
    not fail what already succeeded. A directory is removed only with ``tree``: a series of
    files never made one, so one named like its files is the user's."""
    try:
        if tree and os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError:
        pass
