"""Atomic file creation: a temporary file in the destination directory, fsync, rename."""
from __future__ import annotations

import os
import tempfile


class AtomicFile:
    """A binary file that appears at ``path`` only when :meth:`commit` succeeds.

    Until then it lives as a hidden temporary file beside ``path``; :meth:`abort` (or a crash)
    leaves any previous file at ``path`` untouched.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, self.tmp_path = tempfile.mkstemp(prefix=f".{os.path.basename(self.path)}.",
                                             suffix=".tmp", dir=directory)
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; give what open() would
        self.file = os.fdopen(fd, "w+b")

    def commit(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp_path, self.path)
        fsync_directory(os.path.dirname(os.path.abspath(self.path)))

    def abort(self) -> None:
        if not self.file.closed:
            self.file.close()
        try:
            os.unlink(self.tmp_path)
        except FileNotFoundError:
            pass


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_directory(directory: str) -> None:
    """Make a rename in ``directory`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
