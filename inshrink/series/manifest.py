"""What the two series manifests share: the ``manifest.json`` of :class:`~.series.Series`
(spec section 23) and the ``series.json`` of a DCP series (section 25).

Both are one JSON document ``{"format": ..., "version": ..., "checkpoints": [...]}`` listing
the kept steps in increasing order, each with the SHA-256 and size of its file(s); both are
read with a size bound and replaced atomically. Each format keeps its own keys, errors and
messages; the checks of the fields they share, and the step queries, are written once here.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import reprlib
from typing import Any, Protocol, Sequence, TypeVar

from ..atomic import write_file
from ..errors import InvalidArgumentError

MAX_MANIFEST_BYTES = 64 << 20
"""A larger manifest is refused as corrupt (some 300,000 checkpoints)."""
MAX_STEP = 10 ** 12 - 1
"""The largest step: file and directory names hold it in 12 digits."""
SHA256 = re.compile(r"\A[0-9a-f]{64}\Z", re.ASCII)
"""A SHA-256 as a manifest writes it: 64 lowercase hexadecimal digits."""


class Entry(Protocol):
    """A manifest entry of either format: a step, stored whole (a keyframe) or as a delta."""

    @property
    def step(self) -> int: ...

    @property
    def keyframe(self) -> bool: ...


E = TypeVar("E", bound=Entry)


def read_manifest(path: str) -> bytes | None:
    """The bytes of the manifest at ``path``, None if there is none. At most
    :data:`MAX_MANIFEST_BYTES` + 1 bytes are read (more than the bound says it is too large;
    the caller's decoder refuses it) and no more are allocated than the file holds."""
    try:
        with open(path, "rb") as f:
            size = min(os.fstat(f.fileno()).st_size, MAX_MANIFEST_BYTES)
            return f.read(size + 1)
    except FileNotFoundError:
        return None


def write_manifest(path: str, format: str, version: int, entries: Sequence[Any]) -> None:
    """Replace the manifest at ``path`` atomically by the document of ``entries`` (frozen
    dataclasses, each written as the object of its fields, in field order)."""
    doc = {"format": format, "version": version,
           "checkpoints": [dataclasses.asdict(e) for e in entries]}
    write_file(path, json.dumps(doc, indent=1).encode())


def has_exactly(value: Any, keys: frozenset[str] | set[str]) -> bool:
    """``value`` is a JSON object with exactly ``keys``."""
    return type(value) is dict and set(value) == keys


def step_problem(index: int, step: Any, before: Sequence[Entry]) -> str | None:
    """What is wrong with the step of the ``index``-th manifest entry, after the entries
    ``before`` it (None: nothing): an integer in [0, MAX_STEP], greater than the one before."""
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        return f"checkpoint {index}: step must be an integer in [0, {MAX_STEP}]"
    if before and step <= before[-1].step:
        return f"checkpoint {index}: steps must increase ({step} after {before[-1].step})"
    return None


def file_problem(step: int, sha256: Any, size: Any) -> str | None:
    """What is wrong with the SHA-256 and byte count a manifest holds of a file of ``step``
    (None: nothing)."""
    if type(sha256) is not str or not SHA256.match(sha256):
        return f"step {step}: sha256 must be 64 lowercase hexadecimal digits"
    if type(size) is not int or size < 0:
        return f"step {step}: bytes must be a non-negative integer"
    return None


def check_new_step(step: Any) -> None:
    """A step a caller asks to save: an integer in [0, MAX_STEP] (InvalidArgumentError)."""
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        raise InvalidArgumentError(f"step must be an integer in [0, {MAX_STEP}]")


def check_after(entries: Sequence[Entry], step: int, where: str) -> None:
    """``step`` comes after every saved step of the series ``where`` names."""
    if entries and step <= entries[-1].step:
        raise InvalidArgumentError(f"step {step} is not after the latest step "
                                   f"{entries[-1].step} of {where}")


def find_entry(entries: Sequence[E], step: Any, directory: str) -> E:
    """The entry of ``step`` in the series in ``directory`` (InvalidArgumentError if the step
    is not an integer or not saved)."""
    if type(step) is not int:  # not bool either: True would be step 1
        raise InvalidArgumentError(f"step must be an integer, got {reprlib.repr(step)}")
    for e in entries:
        if e.step == step:
            return e
    raise InvalidArgumentError(f"step {step} is not in the series {directory}")
