"""The names of the files of a sharded checkpoint and of a series of them, in one place.

Standard library only, never torch: the command line recognises these directories by their
names before it decides to import torch. Every test matches a whole name (never a prefix),
with ASCII digits only, and is false for anything that is not a ``str`` (names read from
a manifest or from DCP's metadata may be of any type).

A checkpoint directory holds ``.metadata`` (the commit marker), ``chunks.json`` (the chunk
map, readable without torch: :mod:`inshrink.dcp.chunkmap`) and one file per rank and save,
``rank<5 digits>-<12 hex: the save id>.ink``; in a series, the steps are directories
``step_<12 digits>`` beside ``series.json``, and a rank file of an older step is rewritten as
a delta, ``rank<5 digits>-<12 hex>.d.ink``, or as its model only (a weights-only step),
``rank<5 digits>-<12 hex>.w.ink`` (``.w.d.ink`` as a delta). Each is written as a hidden
temporary beside it, ``.<name>.<random>.tmp``, and renamed into place.
"""
from __future__ import annotations

import re
import reprlib

__all__ = ["METADATA", "CHUNK_MAP", "BYTES_PREFIX", "SERIES_MANIFEST", "STEP_DIR_SHAPE",
           "rank_file_name", "delta_name", "weights_name", "weights_delta_name", "step_dir",
           "is_rank_file", "is_delta_file", "is_weights_file",
           "is_rank_temporary", "is_series_temporary", "is_chunk_map_temporary",
           "is_rank_name", "rank_of", "step_of", "is_step_dir"]

METADATA = ".metadata"
"""The commit marker: DCP's metadata, written once every rank's file is in place."""

CHUNK_MAP = "chunks.json"
"""The chunk map: the checkpoint's global layout as JSON, written just before the commit
marker (no rank file, temporary or step directory can have this name)."""

BYTES_PREFIX = "__dcp_bytes__."
"""Tensor-name prefix of non-tensor items (DCP's BYTE_IO write items) in a rank's file."""

SERIES_MANIFEST = "series.json"
"""The manifest of a series of sharded checkpoints, beside its step directories."""

STEP_DIR_SHAPE = "step_<12 digits>"
"""How a step directory is named, for messages."""

_RANK = r"rank([0-9]{5})-[0-9a-f]{12}"
_RANK_FILE = re.compile(_RANK + r"\.ink")
_DELTA_FILE = re.compile(_RANK + r"\.d\.ink")
_WEIGHTS_FILE = re.compile(_RANK + r"\.w(?:\.d)?\.ink")
_ANY_RANK_FILE = re.compile(_RANK + r"(?:\.d|\.w|\.w\.d)?\.ink")
# a hidden temporary: "." + the name + "." + mkstemp's random part + ".tmp"
_RANK_TEMPORARY = re.compile(r"\." + _RANK + r"\.ink\..*\.tmp")
_ANY_RANK_TEMPORARY = re.compile(r"\." + _RANK + r"(?:\.d|\.w|\.w\.d)?\.ink\..*\.tmp")
_SERIES_TEMPORARY = re.compile(r"\.(?:series\.json|" + _RANK
                               + r"(?:\.d|\.w|\.w\.d)?\.ink)\..*\.tmp")
_CHUNK_MAP_TEMPORARY = re.compile(r"\.chunks\.json\..*\.tmp")
_STEP_DIR = re.compile(r"step_([0-9]{12})")


def rank_file_name(rank: int, save_id: str) -> str:
    """The file name of ``rank``'s file of the save ``save_id`` (12 hex digits)."""
    return f"rank{rank:05d}-{save_id}.ink"


def delta_name(name: str) -> str:
    """The name of the rank file ``name`` once rewritten as a delta (``.ink`` -> ``.d.ink``)."""
    return name[:-len(".ink")] + ".d.ink"


def weights_name(name: str) -> str:
    """The name of the rank file ``name`` once rewritten as its kept (model) tensors only
    (``.ink`` -> ``.w.ink``)."""
    return name[:-len(".ink")] + ".w.ink"


def weights_delta_name(name: str) -> str:
    """The name of the rank file ``name`` of a weights-only step once rewritten as a delta
    against the next newer weights-only step (``.ink`` -> ``.w.d.ink``)."""
    return name[:-len(".ink")] + ".w.d.ink"


def step_dir(step: int) -> str:
    """The directory name of ``step``: ``step_`` and the step in 12 digits."""
    return f"step_{step:012d}"


def _full(pattern: re.Pattern, name: object) -> re.Match | None:
    return pattern.fullmatch(name) if isinstance(name, str) else None


def is_rank_file(name: object) -> bool:
    """Whether ``name`` is a committed rank file: ``rank<5 digits>-<12 hex>.ink``."""
    return _full(_RANK_FILE, name) is not None


def is_delta_file(name: object) -> bool:
    """Whether ``name`` is a rank file rewritten as a delta: ``rank<5 digits>-<12 hex>.d.ink``."""
    return _full(_DELTA_FILE, name) is not None


def is_weights_file(name: object) -> bool:
    """Whether ``name`` is a rank file of a weights-only step, whole or a delta:
    ``rank<5 digits>-<12 hex>.w.ink`` or ``….w.d.ink``."""
    return _full(_WEIGHTS_FILE, name) is not None


def is_rank_temporary(name: object) -> bool:
    """Whether ``name`` is the temporary of a rank file (not of a delta) that a save left."""
    return _full(_RANK_TEMPORARY, name) is not None


def is_series_temporary(name: object) -> bool:
    """Whether ``name`` is the temporary of a series' manifest, a rank file or a delta."""
    return _full(_SERIES_TEMPORARY, name) is not None


def is_chunk_map_temporary(name: object) -> bool:
    """Whether ``name`` is the temporary of a chunk map that a save left."""
    return _full(_CHUNK_MAP_TEMPORARY, name) is not None


def is_rank_name(name: object) -> bool:
    """Whether ``name`` is any name a rank's file has: whole or delta, committed or still a
    temporary (a directory with one is a checkpoint, complete or not)."""
    return _full(_ANY_RANK_FILE, name) is not None or _full(_ANY_RANK_TEMPORARY, name) is not None


def rank_of(name: object) -> int | None:
    """The rank that the rank file or delta file ``name`` belongs to; None for another name."""
    match = _full(_ANY_RANK_FILE, name)
    return None if match is None else int(match.group(1))


def save_id_of(name: object) -> str | None:
    """The save id in the rank file or delta file ``name``; None for another name."""
    match = _full(_ANY_RANK_FILE, name)
    return None if match is None else match.group(0)[10:22]


def identity_problem(name: str, metadata: dict) -> str | None:
    """What is wrong with a rank file's ``dcp.rank`` and ``dcp.save_id`` (its index metadata,
    spec section 25.1.1) against its name ``name``; None when they agree."""
    rank, save_id = metadata.get("dcp.rank"), metadata.get("dcp.save_id")
    if rank == str(rank_of(name)) and save_id == save_id_of(name):
        return None
    return (f"its metadata says save {reprlib.repr(save_id)} of rank {reprlib.repr(rank)}, its "
            f"name save {save_id_of(name)} of rank {rank_of(name)}")


def step_of(name: object) -> int | None:
    """The step of the step directory ``name``; None for another name."""
    match = _full(_STEP_DIR, name)
    return None if match is None else int(match.group(1))


def is_step_dir(name: object) -> bool:
    """Whether ``name`` is a step directory's name: ``step_<12 digits>``."""
    return step_of(name) is not None
