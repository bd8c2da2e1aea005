"""Typed errors. Every failure inshrink reports is an :class:`InshrinkError`.

The root derives from :class:`ValueError` so existing ``except ValueError`` clauses keep working.
"""
from __future__ import annotations

import os
import re


class InshrinkError(ValueError):
    """Root of every error raised by inshrink."""


class InvalidArgumentError(InshrinkError, TypeError):
    """A caller passed an argument inshrink cannot use (wrong type, value or combination)."""


class CorruptError(InshrinkError):
    """A file is structurally invalid: bad magic, inconsistent index, impossible values."""


class TruncatedError(CorruptError):
    """A file ends before a structure it declares is complete."""


class ChecksumError(CorruptError):
    """Stored bytes do not match their recorded checksum."""


class UnsupportedVersionError(InshrinkError):
    """The file was written with a format major version this reader does not implement."""


class UnsupportedFeatureError(InshrinkError):
    """The file requires a feature bit this reader does not implement."""


class UnknownCodecError(CorruptError):
    """The index names a codec stage or dtype this reader does not know."""


class LimitExceededError(InshrinkError):
    """A declared size, count or length exceeds a normative limit of the format."""


class BaseMismatchError(InshrinkError):
    """A delta file's base is missing, modified, or not the file the delta was made against."""


class SeriesLockedError(InshrinkError):
    """Another writer is saving into (or pruning) the same checkpoint series right now."""


class TensorNotFoundError(InshrinkError, KeyError):
    """A tensor name is not present in the file."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class IncompleteCheckpointError(TruncatedError):
    """A multi-file checkpoint lacks the commit marker written last: its save did not finish."""


class LossyFallbackWarning(UserWarning):
    """A lossy codec stored data exactly: no setting it may use met its error bound (it
    compresses less than asked, loses nothing)."""


_RULE = re.compile(r"\[[A-Z]-\d+[a-z]?\] ")  # the rule id a file error starts with


def with_path(exc: InshrinkError, path: str | os.PathLike) -> InshrinkError:
    """``exc`` with ``path`` in its message unless it names it already (a reader's error says
    what is wrong; which file is wrong is the caller's to say): after the rule id a message
    starts with (the spec's ``[H-2] ``), else first."""
    path = os.fsdecode(os.fspath(path))
    text = str(exc)
    if path in text:
        return exc
    rule = _RULE.match(text)
    cut = rule.end() if rule else 0
    try:
        named = type(exc)(f"{text[:cut]}{path}: {text[cut:]}")
    except TypeError:  # a subclass with another signature
        named = InshrinkError(f"{text[:cut]}{path}: {text[cut:]}")
    named.__cause__ = exc.__cause__
    return named
