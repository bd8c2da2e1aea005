"""Rewrite a standalone .ink file as a delta file against another checkpoint, and some tensors
of a delta file as a standalone file.

A series keeps its newest checkpoint whole; when a newer one arrives, the previous one is
rewritten here as a delta against it: quantized tensors get their codes stream re-coded as a
code delta (their escape streams are copied as they are), lossless tensors are XORed with the
new checkpoint's, anything else is copied chunk by chunk. The delta stages are the codec
layer's (:mod:`inshrink.codecs.delta`), and so is the rule for keeping a delta.
:func:`write_standalone` undoes the delta stages of the tensors it keeps (a series keeps an old
step as its model only): the same decoded values and codes, no base.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Iterator, Mapping

import numpy as np

from ..codecs import delta as deltas
from ..codecs.chain import Pipeline, pipeline_for
from ..codecs.entropy import Entropy
from ..codecs.lossless import ByteGroup
from ..codecs.quant import Quant, packing_bits
from ..container.index import TensorEntry
from ..container.reader import ContainerReader
from ..container.writer import ContainerWriter
from ..errors import InvalidArgumentError
from .file import File
from .writer import file_minor


def write_delta(src: str | os.PathLike, dst: str | os.PathLike, *,
                src_codes: Mapping[str, np.ndarray], base_exact: Mapping[str, np.ndarray],
                base_codes: Mapping[str, np.ndarray], base_file: dict,
                level: int | None = None,
                src_exact: Mapping[str, np.ndarray] | None = None) -> None:
    """Write ``dst``: the tensors of the standalone file ``src`` as deltas against a base.

    ``src_exact``/``src_codes`` are what ``src`` decodes to (its lossless tensors and the codes
    of its quantized ones; ``src_exact=None`` reads each lossless tensor back from ``src`` when
    its delta is tried); ``base_*`` the same for the base file named by ``base_file``. Each
    mapping is read once per tensor, one tensor at a time, so a :class:`Decoded` view of a
    file keeps only one tensor in memory. A tensor keeps its delta only if its first chunk
    gets smaller (:func:`inshrink.codecs.delta.keep`).
    """
    if src_exact is None:
        with File(src, threads=1, mmap=False) as f:
            return write_delta(src, dst, src_codes=src_codes, base_exact=base_exact,
                               base_codes=base_codes, base_file=base_file, level=level,
                               src_exact=Decoded(f, codes=False))
    reader = ContainerReader(src)
    writer = ContainerWriter(dst)
    entropy = Entropy(level)
    try:
        pipelines = []
        for entry in reader.index.tensors:
            new = TensorEntry(entry.name, entry.dtype, entry.shape, entry.codec,
                              entry.chunk_elements, [[] for _ in entry.streams], entry.report)
            pipeline = pipeline_for(entry)
            rebased = (_rebase_quant(reader, writer, entry, new, pipeline, src_codes,
                                     base_codes, entropy)
                       or _rebase_lossless(reader, writer, entry, new, pipeline, src_exact,
                                           base_exact, entropy))
            if rebased is None:
                for stream, out in zip(entry.streams, new.streams):
                    for c in stream:
                        out.append(writer.write_chunk(c[4], reader.read_chunk(c),  # coding
                                                      c[3], c[2]))  # size, crc
            else:
                pipeline = rebased
                new.codec = pipeline.chain()
            pipelines.append(pipeline)
            writer.tensors.append(new)
        reports = any(t.report is not None for t in writer.tensors)
        writer.commit(reader.index.metadata, reader.index.safetensors_header, base_file,
                      file_minor(pipelines, reports))
    except BaseException:
        writer.abort()
        raise
    finally:
        reader.close()


def write_standalone(src: str | os.PathLike, dst: str | os.PathLike, names: list[str], *,
                     src_exact: Mapping[str, np.ndarray], src_codes: Mapping[str, np.ndarray],
                     level: int | None = None, metadata: dict[str, str] | None = None) -> None:
    """Write ``dst``: the tensors ``names`` of the file ``src`` (whole or a delta file), none
    of them a delta: each decodes to what it decodes to in ``src``, bit for bit.

    ``src_exact``/``src_codes`` are what ``src`` decodes to (against its base, if it has one):
    its lossless tensors and the codes of its quantized ones. A tensor stored as a delta is
    encoded again without its delta stage (a quantized one keeps its levels and escapes, its
    codes stream re-coded); any other is copied chunk by chunk. The index metadata is kept,
    or replaced by ``metadata``."""
    reader = ContainerReader(src)
    writer = ContainerWriter(dst)
    entropy = Entropy(level)
    try:
        by_name = {entry.name: entry for entry in reader.index.tensors}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise InvalidArgumentError(f"{src}: no tensor {missing[0]!r}")
        pipelines = []
        for name in names:
            entry = by_name[name]
            new = TensorEntry(entry.name, entry.dtype, entry.shape, entry.codec,
                              entry.chunk_elements, [[] for _ in entry.streams], entry.report)
            pipeline = pipeline_for(entry)
            if pipeline.is_delta:
                pipeline = _without_delta(reader, writer, entry, new, pipeline, src_exact,
                                          src_codes, entropy)
                new.codec = pipeline.chain()
            else:
                for stream, out in zip(entry.streams, new.streams):
                    for c in stream:
                        out.append(writer.write_chunk(c[4], reader.read_chunk(c),  # coding
                                                      c[3], c[2]))  # size, crc
            pipelines.append(pipeline)
            writer.tensors.append(new)
        reports = any(t.report is not None for t in writer.tensors)
        # the safetensors header describes every tensor of the source: not this subset
        writer.commit(reader.index.metadata if metadata is None else metadata, None, None,
                      file_minor(pipelines, reports))
    except BaseException:
        writer.abort()
        raise
    finally:
        reader.close()


def _without_delta(reader, writer, entry, new, pipeline, src_exact, src_codes,
                   entropy) -> Pipeline:
    """Encode the delta-coded tensor ``entry`` of ``reader``'s file again into ``new`` as a
    standalone one, from what it decodes to; return its pipeline."""
    if isinstance(pipeline.stage, Quant):
        codes = src_codes.get(entry.name)
        if not isinstance(codes, np.ndarray) or codes.shape != (entry.numel,):
            raise InvalidArgumentError(f"src_codes[{entry.name!r}]: the codes of a quantized "
                                       f"tensor of {entry.numel} elements are needed")
        stage = replace(pipeline.stage, bits=packing_bits(len(pipeline.stage.levels)))
        plain = Pipeline(stage, None, entropy)
        for c in range(entry.chunk_count):
            start, stop = entry.chunk_range(c)
            new.streams[0].append(writer.write_chunk(*plain.encode_codes(codes[start:stop])))
            for k in (1, 2):  # the escapes do not depend on the delta
                old = entry.streams[k][c]
                new.streams[k].append(writer.write_chunk(old[4], reader.read_chunk(old),
                                                         old[3], old[2]))  # size, crc
        return plain
    exact = src_exact.get(entry.name)
    if (not isinstance(exact, np.ndarray) or exact.dtype != entry.dtype.numpy
            or exact.shape != entry.shape):
        raise InvalidArgumentError(f"src_exact[{entry.name!r}]: the decoded tensor is needed")
    plain = Pipeline(pipeline.stage, None, entropy)
    mine = np.ascontiguousarray(exact).reshape(-1).view(np.uint8)
    itemsize = entry.dtype.itemsize
    for c in range(entry.chunk_count):
        start, stop = (i * itemsize for i in entry.chunk_range(c))
        for stream, (coding, payload, size) in zip(new.streams, plain.encode(mine[start:stop])):
            stream.append(writer.write_chunk(coding, payload, size))
    return plain


class Decoded(Mapping):
    """What an open whole (non-delta) file decodes to, one tensor at a time: its lossless
    tensors (``codes=False``) or the codes of its quantized ones (``codes=True``). Each access
    decodes the tensor again and nothing is cached, so a caller that takes one tensor at a
    time (:func:`write_delta`, :func:`inshrink.digest.decode_digest`) holds one in memory."""

    def __init__(self, file: File, *, codes: bool) -> None:
        self._file, self._codes = file, codes
        self._names = {i.name: None for i in file.infos()
                       if (i.quantized if codes else i.lossless)}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(name)
        return self._file.codes(name) if self._codes else self._file[name]

    def __contains__(self, name: object) -> bool:  # without decoding (Mapping's would)
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _stored(entry: TensorEntry, c: int) -> int:
    """Payload bytes of chunk ``c`` of a stored tensor, all streams."""
    return sum(stream[c][1] for stream in entry.streams)  # lengths


def _rebase_quant(reader, writer, entry, new, pipeline, src_codes, base_codes,
                  entropy) -> Pipeline | None:
    base = base_codes.get(entry.name)
    if base is not None and (not isinstance(base, np.ndarray) or base.dtype != np.uint16):
        raise InvalidArgumentError(f"base_codes[{entry.name!r}] must be a uint16 array")
    if (not isinstance(pipeline.stage, Quant) or pipeline.is_delta or base is None
            or base.shape != (entry.numel,) or not entry.numel):
        return None
    codes = src_codes.get(entry.name)  # only now: it may be decoded from a file
    if codes is None:
        return None
    delta, stage = deltas.for_codes(pipeline.stage, base)
    rebased = Pipeline(stage, delta, entropy)
    for c in range(entry.chunk_count):
        start, stop = entry.chunk_range(c)
        coding, payload, size = chunk = rebased.encode_codes(codes[start:stop],
                                                             base[start:stop])
        # the escape streams are the same either way
        if c == 0 and not deltas.keep(entry.streams[0][0][1],
                                      deltas.stored_size([chunk])):
            return None  # no gain: keep the tensor standalone
        # the first chunk decides: each chunk is written as it is encoded (none is held)
        new.streams[0].append(writer.write_chunk(coding, payload, size))
        for k in (1, 2):
            old = entry.streams[k][c]
            new.streams[k].append(writer.write_chunk(old[4], reader.read_chunk(old),
                                                     old[3], old[2]))  # size, crc
    return rebased


def _rebase_lossless(reader, writer, entry, new, pipeline, src_exact, base_exact,
                     entropy) -> Pipeline | None:
    if (not isinstance(pipeline.stage, ByteGroup) or pipeline.is_delta or not entry.numel
            or entry.name not in src_exact):
        return None
    base = base_exact.get(entry.name)
    if (not isinstance(base, np.ndarray) or base.dtype != entry.dtype.numpy
            or base.shape != entry.shape):
        return None
    exact = src_exact.get(entry.name)  # only now: it may be decoded from a file
    if exact is None:
        return None
    rebased = Pipeline(pipeline.stage, deltas.Xor(), entropy)
    mine = np.ascontiguousarray(exact).reshape(-1).view(np.uint8)
    theirs = np.ascontiguousarray(base).reshape(-1).view(np.uint8)
    itemsize = entry.dtype.itemsize
    for c in range(entry.chunk_count):
        start, stop = (i * itemsize for i in entry.chunk_range(c))
        planes = rebased.encode(mine[start:stop], theirs[start:stop])
        if c == 0 and not deltas.keep(_stored(entry, 0), deltas.stored_size(planes)):
            return None
        for stream, (coding, payload, size) in zip(new.streams, planes):
            stream.append(writer.write_chunk(coding, payload, size))
    return rebased
