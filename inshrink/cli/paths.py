"""The user's paths: input and output checks, default output names, and OS errors named by
the path the user knows (never a temporary file's)."""
from __future__ import annotations

import errno
import os
import re

from ..atomic import into_proc
from .status import UsageError


def default_output(src: str, is_dir: bool, old: str, new: str, dir_suffix: str) -> str:
    """``src`` with its suffix ``old`` replaced by ``new``, or a directory's name with
    ``dir_suffix``."""
    src = src.rstrip("/\\") or src
    if is_dir:
        return src + dir_suffix
    return (src[:-len(old)] if src.endswith(old) else src) + new


def _special(path: str) -> bool:
    """Whether ``path`` exists and is neither a regular file nor a directory (a FIFO, a
    device, a socket): reading a FIFO waits forever, and renaming a new file over a device
    such as /dev/null replaces the device."""
    return os.path.exists(path) and not (os.path.isfile(path) or os.path.isdir(path))


def check_input(src: str) -> None:
    """Refuse an input that does not exist or is no regular file or directory."""
    if not os.path.exists(src):
        raise UsageError(f"{src}: no such file or directory")
    if _special(src):
        raise UsageError(f"{src} is not a regular file (a device, FIFO or socket)")


def _same_file(src: str, dst: str) -> bool:
    """Whether ``dst`` is ``src``, also through a link or another spelling of its path."""
    if os.path.abspath(src) == os.path.abspath(dst):
        return True
    try:
        return os.path.samefile(src, dst)
    except OSError:  # one of them does not exist
        return False


def check_output(src: str, dst: str, force: bool, inside: str | None = None) -> None:
    """Refuse an output that would replace the input or, with ``inside`` (the directory of
    a series or checkpoint that the command reads), one that would be written into it."""
    if _same_file(src, dst):
        raise UsageError(f"{dst}: the output would overwrite the input {src}")
    if _special(dst) or into_proc(dst):
        raise UsageError(f"{dst} is not a regular file (a device, FIFO, socket or "
                         f"/dev/stdout): the output is written whole and renamed into place, "
                         f"which would replace it")
    if (os.path.isdir(dst) or dst.endswith(("/", os.sep))) and not os.path.isdir(src):
        raise UsageError(f"{dst} is a directory; give a file name with -o")
    if inside is not None and os.path.isdir(inside):
        parent = os.path.realpath(os.path.dirname(os.path.abspath(dst)))
        if os.path.commonpath([parent, os.path.realpath(inside)]) == os.path.realpath(inside):
            raise UsageError(f"{dst}: the output would be written inside the input "
                             f"directory {inside}; give a path outside it with -o")
    if os.path.exists(dst) and not force:
        raise UsageError(f"{dst} exists (use --force to overwrite)")


def check_checkpoint_output(dst: str) -> None:
    """Refuse an output of one checkpoint whose name does not say its format."""
    if not dst.endswith((".safetensors", ".ink")):
        raise UsageError(f"{dst}: the output must end with .safetensors or .ink (its format)")


def check_lossy_overwrite(args, dst: str, lossy: bool) -> None:
    """Refuse to replace an existing ``dst`` with lossy data without
    ``--allow-lossy-overwrite``."""
    if lossy and os.path.exists(dst) and not args.allow_lossy_overwrite:
        raise UsageError(f"{dst} exists and the new data is lossy (quantized): -f alone "
                         f"does not replace a file with approximate values; add "
                         f"--allow-lossy-overwrite, or write elsewhere with -o")


def files_in(target: str, suffix: str) -> list[str]:
    """``target`` itself, or the ``suffix`` files under a directory (none: a usage error)."""
    from ..safetensors import tensor_files
    check_input(target)
    if not os.path.isdir(target):
        return [target]
    found = tensor_files(target, suffix)
    if not found:
        raise UsageError(f"{target} holds no {suffix} files (subdirectories included)")
    return found


def size_or_zero(path: str) -> int:
    """The size of ``path``; 0 when it cannot be read."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def names_in(path: str) -> list[str]:
    """The names in the directory ``path``; none when it cannot be read."""
    try:
        return os.listdir(path)
    except OSError:
        return []


# -- OS errors -------------------------------------------------------------------------------

_TEMPORARY = re.compile(r"^\.(.+)\.(?:old\.)?[A-Za-z0-9_]{8}(?:\.tmp)?$")


def _user_path(path, destination: str | None):
    """``path`` as the user knows it: a hidden temporary file or directory that inshrink
    writes beside ``destination`` (``.m.ink.k2x9a7qz.tmp``) is named as what it becomes."""
    if not destination or not isinstance(path, str):
        return path
    shown = os.sep.join(m.group(1) if (m := _TEMPORARY.match(part)) else part
                        for part in path.split(os.sep))
    target = os.path.abspath(destination)
    absolute = os.path.abspath(shown)
    if absolute == target or absolute.startswith(target + os.sep):
        return os.path.join(destination, os.path.relpath(absolute, target)) \
            if absolute != target else destination
    return path


_WRITE_ERRORS = {errno.ENOSPC, errno.EFBIG, errno.EROFS, getattr(errno, "EDQUOT", errno.ENOSPC)}


def os_error_message(exc: OSError, args) -> str:
    """One line naming the user's path: never a temporary name, never a bare errno."""
    destination = getattr(args, "destination", None)
    reason = exc.strerror or str(exc)
    path = _user_path(exc.filename, destination)
    if path is None:  # e.g. a write into an open file: a full disk names the destination
        path = destination if exc.errno in _WRITE_ERRORS and destination else \
            getattr(args, "source", None) or destination
        return f"{path}: {reason}" if path else reason
    second = _user_path(exc.filename2, destination)
    if second is not None and second != path:
        return f"{path} -> {second}: {reason}"
    return f"{path}: {reason}"


def error_entry_message(exc: BaseException, args) -> str:
    """``Type: message`` of an error met while reading one input, for its report entry."""
    message = os_error_message(exc, args) if isinstance(exc, OSError) else str(exc)
    return f"{type(exc).__name__}: {message}"
