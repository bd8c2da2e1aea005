"""Atomic file creation: a temporary file in the destination directory, fsync, rename.

Errors name the destination, not the hidden temporary file: an ``OSError`` raised while the
file is created, written or committed is re-raised as an ``OSError`` of the same errno (so
the same subclass, e.g. ``PermissionError``) whose ``filename`` is the destination path.
"""
from __future__ import annotations

import errno
import io
import os
import stat
import tempfile
import time
import weakref

try:
    import fcntl
except ImportError:  # not POSIX: no lock, one writer is the caller's responsibility
    fcntl = None  # type: ignore[assignment]

from .errors import InvalidArgumentError, SeriesLockedError


def check_path(path: str | os.PathLike) -> str:
    """``path`` as a str: a path of another type (None, an int) or with a NUL character is an
    InvalidArgumentError (os functions raise TypeError and ValueError); bytes are decoded as
    the file system does, so that they mix with the str names made beside them."""
    try:
        path = os.fsdecode(os.fspath(path))
    except TypeError:
        raise InvalidArgumentError(f"a path must be a str or os.PathLike, got "
                                   f"{type(path).__name__}") from None
    if "\0" in path:
        raise InvalidArgumentError(f"path {path!r} contains a NUL character")
    return path


def named_error(exc: OSError, path: str) -> OSError:
    """``exc`` as an error about writing ``path`` (unchanged if it names ``path`` already or
    carries no errno)."""
    if exc.errno is None or exc.filename == path:
        return exc
    return OSError(exc.errno, f"{exc.strerror or os.strerror(exc.errno)} while writing", path)


def hidden_prefix(path: str, room: int = len("XXXXXXXX.tmp")) -> str:
    """``.<name>.``, the prefix of a hidden temporary beside ``path``, the name cut so that
    the prefix and ``room`` more characters (mkstemp's random part and a suffix) fit the file
    system's limit on one name: a destination whose own name fits must be writable."""
    # (the absolute path's: "out/", a directory named with its slash, is named "out")
    directory, name = os.path.split(os.path.abspath(path))
    try:
        limit = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no such directory, or not POSIX
        limit = 255
    name = os.fsencode(name)[:max(limit - room - 2, 1)]
    return f".{os.fsdecode(name)}."


class _DestinationFile(io.BufferedRandom):
    """The temporary file, whose write errors (a full disk...) name the destination."""

    def __init__(self, raw: io.FileIO, destination: str) -> None:
        super().__init__(raw)
        self.destination = destination

    def write(self, data) -> int:
        try:
            return super().write(data)
        except OSError as exc:
            raise named_error(exc, self.destination) from exc

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as exc:
            raise named_error(exc, self.destination) from exc


class AtomicFile:
    """A binary file that appears at ``path`` only when :meth:`commit` succeeds.

    Until then it lives as a hidden temporary file ``.<name>.<random>.tmp`` beside ``path``;
    :meth:`abort` (or a crash, which leaves the temporary behind) leaves any previous file at
    ``path`` untouched; so does dropping it uncommitted (garbage collection or interpreter
    exit aborts it). Every ``OSError`` it raises names ``path`` (see the module docstring).

    A writer holds an ``flock`` on its temporary until the rename: a temporary of ``path``
    that nobody holds and that is older than :data:`STALE_SECONDS` is what a killed writer
    (SIGKILL, a power cut) left, and the next ``AtomicFile`` of ``path`` removes it
    (:func:`remove_stale_temporaries`). Without ``flock`` (not POSIX) nothing is removed.

    As a context manager it commits when the block ends normally and aborts when it raises:

    >>> with AtomicFile("out.bin") as out:   # doctest: +SKIP
    ...     out.file.write(data)
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = check_path(path)
        _check_replaceable(self.path)
        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            fd, self.tmp_path = tempfile.mkstemp(prefix=hidden_prefix(self.path),
                                                 suffix=".tmp", dir=directory)
        except OSError as exc:
            raise named_error(exc, self.path) from exc
        try:
            os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; give what open() would
            self.file = _DestinationFile(io.FileIO(fd, "r+b"), self.path)
        except BaseException as exc:
            os.close(fd)
            _unlink(self.tmp_path)
            if isinstance(exc, OSError):
                raise named_error(exc, self.path) from exc
            raise
        self._lock = _hold(fd)
        # a writer dropped without commit or abort (a Writer never closed) leaves no debris
        self._discard = weakref.finalize(self, _discard, self.file, self.tmp_path, os.getpid(),
                                         self._lock)
        remove_stale_temporaries(self.path)

    def commit(self) -> None:
        """Flush, fsync and rename the file to its destination (the caller aborts on error)."""
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp_path, self.path)
        except OSError as exc:
            raise named_error(exc, self.path) from exc
        self._discard.detach()
        _release(self._lock)  # held past the rename: the temporary was never free to take
        fsync_directory(os.path.dirname(os.path.abspath(self.path)))

    def __enter__(self) -> "AtomicFile":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()

    def abort(self) -> None:
        """Discard the temporary file. Never raises: it runs while another error propagates,
        and closing may fail for the very reason the write did (a full disk), which must not
        keep the temporary file from being removed."""
        self._discard()


def write_file(path: str | os.PathLike, data: bytes) -> None:
    """Replace the file at ``path`` with ``data`` atomically (a manifest, a metadata file)."""
    with AtomicFile(path) as out:
        out.file.write(data)


def _check_replaceable(path: str) -> None:
    """What is at ``path`` may be replaced by a regular file: nothing, a regular file or a
    link (not one into /proc, such as ``/dev/stdout``). A directory would fail only at the
    rename, after the whole write (the OS's error, raised before it); a device, FIFO or
    socket (``/dev/null``) would be replaced by a regular file."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:  # nothing there (or not reachable: the write names the reason)
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if stat.S_ISLNK(mode) and into_proc(path):
        raise InvalidArgumentError(f"{path} is a link into /proc (such as /dev/stdout): it "
                                   f"would be replaced")
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise InvalidArgumentError(f"{path} is not a regular file (a device, FIFO or socket): "
                                   f"it would be replaced")


def into_proc(path: str) -> bool:
    """Whether ``path`` is a link into /proc, as /dev/stdout -> /proc/self/fd/1 is (whatever
    it leads to): renaming a new file over it replaces the link."""
    for _ in range(40):  # one link at a time: the last one leads out of /proc
        if not os.path.islink(path):
            return False
        path = os.path.join(os.path.dirname(os.path.abspath(path)), os.readlink(path))
        if os.path.abspath(path).startswith("/proc/"):
            return True
    return False


STALE_SECONDS = 60.0
"""A temporary nobody holds is removed once this old: between its creation and its lock a
writer holds none (microseconds), and a clock may be a little off."""


def _hold(fd: int) -> int | None:
    """A second descriptor of the temporary ``fd``, holding an ``flock`` on it (None where
    there is none): closing the file before the rename must not free it."""
    if fcntl is None:
        return None
    lock = os.dup(fd)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # a file system without flock: nothing is ever removed as stale
        os.close(lock)
        return None
    return lock


def _release(lock: int | None) -> None:
    if lock is not None:
        try:
            os.close(lock)
        except OSError:
            pass


def remove_stale_temporaries(path: str | os.PathLike,
                             older_than: float = STALE_SECONDS) -> list[str]:
    """Remove the hidden temporaries of ``path`` (``.<name>.<random>.tmp``, as
    :class:`AtomicFile` names them) that no live writer holds and that are older than
    ``older_than`` seconds: what a writer killed before its rename left. Returns the paths
    removed. Safe beside live writers: each holds an ``flock`` on its temporary until its
    rename, so a temporary this function can lock is nobody's (the lock is taken before
    the removal, and the path checked to be the file locked). Best effort: nothing raises.
    """
    if fcntl is None:
        return []
    path = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(path)
    prefix = hidden_prefix(path)
    removed = []
    try:
        entries = [e for e in os.scandir(directory)
                   if e.name.startswith(prefix) and e.name.endswith(".tmp")
                   and len(e.name) == len(prefix) + len("XXXXXXXX.tmp")]
    except OSError:
        return []
    now = time.time()
    for entry in entries:
        try:
            if not entry.is_file(follow_symlinks=False) or \
                    now - entry.stat(follow_symlinks=False).st_mtime < older_than:
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.fstat(fd), os.stat(entry.path, follow_symlinks=False)):
                os.unlink(entry.path)
                removed.append(entry.path)
        except OSError:  # held (a live writer), gone, or not ours to remove
            pass
        finally:
            os.close(fd)
    return removed


def _discard(file: io.BufferedRandom, tmp_path: str, pid: int,
             lock: int | None = None) -> None:
    """:meth:`AtomicFile.abort` (also its finalizer: it holds no reference to the object).
    A forked child exiting leaves its parent's temporary file alone: it shares the parent's
    open file description, so its copy of the buffer, flushed when the file is freed (at
    the child's exit), would be written into the parent's file a second time. The child's
    descriptor is pointed at /dev/null instead of closing it."""
    if os.getpid() != pid:
        _to_devnull(file)
        return  # the lock stays the parent's: its descriptor of it is still open
    try:
        file.close()  # flushes what is buffered, which may fail: nothing to keep
    except (OSError, ValueError):
        pass
    raw = getattr(file, "raw", None)
    if raw is not None and not raw.closed:  # a failed close may leave the descriptor
        try:
            raw.close()
        except OSError:
            pass
    _unlink(tmp_path)
    _release(lock)  # after the removal: a locked temporary is never taken as stale


def _to_devnull(file: io.BufferedRandom) -> None:
    """Point ``file``'s descriptor (in this process only) at /dev/null."""
    raw = getattr(file, "raw", None)
    if raw is None or raw.closed:
        return
    try:
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(null, raw.fileno(), inheritable=False)  # as mkstemp made it
        finally:
            os.close(null)
    except OSError:
        pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:  # gone already, or cannot be removed: the caller's error matters more
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


def take_write_lock(path: str, where: str, busy: str) -> int | None:
    """An exclusive ``flock`` on ``path`` (created if missing), taken without waiting; its
    descriptor, or None where there is no ``flock``. The holder's pid is written into the
    file for the message a second writer gets: :class:`SeriesLockedError`
    ``"{where}: another writer (pid N) {busy}"``."""
    if fcntl is None:
        return None
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        raise SeriesLockedError(
            f"{where}: another writer{f' (pid {holder})' if holder else ''} {busy}") from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass
    return fd


def release_write_lock(fd: int, owner_pid: int | None = None) -> None:
    """Unlock and close a descriptor from :func:`take_write_lock`. With ``owner_pid``, a
    forked child (another pid) only closes it: the lock is its parent's."""
    try:
        if owner_pid is None or os.getpid() == owner_pid:
            os.ftruncate(fd, 0)  # no stale pid for the next holder's contenders
            fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        pass
    finally:
        os.close(fd)
