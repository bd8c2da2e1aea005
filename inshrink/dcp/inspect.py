"""What a committed checkpoint holds, without loading it into a model: :func:`describe`
reads the rank files' indexes (no data decoded), :func:`verify` decodes every file and checks
its checksums."""
from __future__ import annotations

import os
from typing import Iterator, Mapping

from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata

from ..errors import CorruptError, InshrinkError, InvalidArgumentError
from ..io.file import File
from ..io.info import TensorInfo
from ..torch.convert import dtype_name
from .calls import named
from .metadata import read_metadata
from .names import METADATA

__all__ = ["describe", "describe_metadata", "verify", "verify_rank_files"]

def _chunks(metadata: Metadata) -> Iterator[tuple[MetadataIndex, tuple[int, ...] | None]]:
    """Every stored chunk's index and sizes (None for a non-tensor item)."""
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            for chunk in item.chunks:
                yield MetadataIndex(fqn, chunk.offsets), tuple(int(d) for d in chunk.sizes)
        else:
            yield MetadataIndex(fqn), None


def describe(path: str | os.PathLike) -> list[dict]:
    """What the committed checkpoint in the directory ``path`` holds, chunk by chunk, without
    decoding any data: a list of dicts, one per stored chunk, with ``fqn``, ``offsets`` and
    ``sizes`` (None for a non-tensor item), ``file``, ``tensor`` (its name in the file),
    ``dtype``, ``codec``, ``nbytes``, ``stored_bytes``, ``role`` and ``error`` (the error the
    encoder measured for a lossy shard: ``max_abs_error``, ``rel_l2_error``...; None for a
    lossless one).
    """
    return describe_metadata(read_metadata(path), os.fspath(path))


def describe_metadata(metadata: Metadata, path: str,
                      stored: Mapping[str, str] | None = None) -> list[dict]:
    """:func:`describe` of a checkpoint's metadata; ``stored`` maps a rank file the metadata
    names to the file that holds it now, if another (a series' delta file)."""
    stored = stored or {}
    infos: dict[str, dict[str, TensorInfo]] = {}
    for name in sorted({e["file"] for e in metadata.storage_data.values()}):
        file_path = os.path.join(path, stored.get(name, name))
        with named(file_path, lambda: File(file_path, threads=1)) as f:
            infos[name] = {info.name: info for info in f.infos()}
    rows = []
    for index, sizes in _chunks(metadata):
        entry = metadata.storage_data[index]
        info = infos[entry["file"]].get(entry["tensor"])
        file_name = stored.get(entry["file"], entry["file"])
        if info is None:
            raise CorruptError(f"{os.path.join(path, file_name)}: no tensor named "
                               f"{entry['tensor']!r}, which {METADATA} names")
        _check_info(os.path.join(path, file_name), info, metadata, index.fqn, sizes)
        rows.append({"fqn": index.fqn,
                     "offsets": None if sizes is None else tuple(int(d) for d in index.offset),
                     "sizes": sizes, "file": file_name, "tensor": entry["tensor"],
                     "dtype": info.dtype, "codec": info.codec, "nbytes": info.nbytes,
                     "stored_bytes": info.stored_bytes, "role": info.role,
                     "error": info.error})
    return rows


def _check_info(path: str, info: TensorInfo, metadata: Metadata, fqn: str,
                sizes: tuple[int, ...] | None) -> None:
    """A stored tensor is what the metadata says its chunk is (from the file's index)."""
    if sizes is None:
        expected = "U8", (info.shape[0] if len(info.shape) == 1 else -1,)
    else:
        expected = (dtype_name(metadata.state_dict_metadata[fqn].properties.dtype, fqn), sizes)
    if (info.dtype, tuple(info.shape)) != expected:
        raise CorruptError(f"{path}: {info.name!r} is {info.dtype}{list(info.shape)}, the "
                           f"metadata says {expected[0]}{list(expected[1])}")


def verify(path: str | os.PathLike, threads: int | None = None) -> list[str]:
    """Check a committed checkpoint completely: every file named by the metadata exists and
    decodes with every checksum right, and every chunk is stored with its dtype and sizes.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint directory.
    threads : int, optional
        Decoder threads (default: every core).

    Returns
    -------
    list of str
        The problems found, each naming its file (``ErrorClass: message``); empty when the
        checkpoint checks. What it holds is :func:`describe`'s.

    Raises
    ------
    InvalidArgumentError
        ``path`` is not a path.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError("path must be a str or os.PathLike")
    path = os.fspath(path)
    try:
        metadata = read_metadata(path)
        describe_metadata(metadata, path)
    except InvalidArgumentError:
        raise
    except (InshrinkError, OSError) as exc:  # no metadata, a missing file, a wrong index
        return [f"{type(exc).__name__}: {exc}"]
    return verify_rank_files(metadata, path, threads)


def verify_rank_files(metadata: Metadata, path: str, threads: int | None = None) -> list[str]:
    """:func:`verify`'s decoding of every rank file that ``metadata`` (read and described
    already) names: the problems, each naming its file."""
    problems = []
    for name in sorted({e["file"] for e in metadata.storage_data.values()}):
        file_path = os.path.join(path, name)
        with File(file_path, threads=threads) as f:
            problems += [f"{file_path}: {problem}" for problem in f.verify()]
    return problems
