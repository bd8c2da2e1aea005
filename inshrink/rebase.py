"""Rewrite a standalone .ink file as a delta file against another checkpoint.

A series keeps its newest checkpoint whole; when a newer one arrives, the previous one is
rewritten here as a delta against it: quantized tensors get their codes stream re-coded as a
code delta (their escape streams are copied as they are), lossless tensors are XORed with the
new checkpoint's, anything else is copied chunk by chunk. The delta stages are the codec
layer's (:mod:`inshrink.codecs.delta`), and so is the rule for keeping a delta.
"""
from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from .codecs import delta as deltas
from .codecs.chain import Pipeline
from .codecs.entropy import Entropy
from .codecs.lossless import ByteGroup
from .codecs.quant import Quant
from .container.index import TensorEntry
from .container.reader import ContainerReader
from .container.writer import ContainerWriter
from .errors import InvalidArgumentError
from .tensorfile import File, file_minor, pipeline_for


def write_delta(src: str | os.PathLike, dst: str | os.PathLike, *,
                src_codes: Mapping[str, np.ndarray], base_exact: Mapping[str, np.ndarray],
                base_codes: Mapping[str, np.ndarray], base_file: dict,
                level: int | None = None,
                src_exact: Mapping[str, np.ndarray] | None = None) -> None:
    """Write ``dst``: the tensors of the standalone file ``src`` as deltas against a base.

    ``src_exact``/``src_codes`` are what ``src`` decodes to (its lossless tensors and the codes
    of its quantized ones; ``src_exact=None`` reads the lossless tensors back from ``src``);
    ``base_*`` the same for the base file named by ``base_file``. A tensor keeps its delta
    only if its first chunk gets smaller (:func:`inshrink.codecs.delta.keep`).
    """
    if src_exact is None:
        with File(src, threads=1) as f:
            src_exact = {i.name: f[i.name] for i in f.infos() if i.lossless}
    reader = ContainerReader(src, use_mmap=False)
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
                        out.append(writer.write_chunk(c.coding, reader.read_chunk(c),
                                                      c.size, c.crc))
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


def _stored(entry: TensorEntry, c: int) -> int:
    """Payload bytes of chunk ``c`` of a stored tensor, all streams."""
    return sum(stream[c].length for stream in entry.streams)


def _rebase_quant(reader, writer, entry, new, pipeline, src_codes, base_codes,
                  entropy) -> Pipeline | None:
    codes, base = src_codes.get(entry.name), base_codes.get(entry.name)
    if base is not None and (not isinstance(base, np.ndarray) or base.dtype != np.uint16):
        raise InvalidArgumentError(f"base_codes[{entry.name!r}] must be a uint16 array")
    if (not isinstance(pipeline.stage, Quant) or pipeline.is_delta or codes is None
            or base is None or base.shape != (entry.numel,) or not entry.numel):
        return None
    delta, stage = deltas.for_codes(pipeline.stage, base)
    rebased = Pipeline(stage, delta, entropy)
    stored = []
    for c in range(entry.chunk_count):
        start, stop = entry.chunk_range(c)
        chunk = rebased.encode_codes(codes[start:stop], base[start:stop])
        # the escape streams are the same either way
        if c == 0 and not deltas.keep(entry.streams[0][0].length,
                                      deltas.stored_size([chunk])):
            return None  # no gain: keep the tensor standalone
        stored.append(chunk)
    for c, (coding, payload, size) in enumerate(stored):
        new.streams[0].append(writer.write_chunk(coding, payload, size))
        for k in (1, 2):
            old = entry.streams[k][c]
            new.streams[k].append(writer.write_chunk(old.coding, reader.read_chunk(old),
                                                     old.size, old.crc))
    return rebased


def _rebase_lossless(reader, writer, entry, new, pipeline, src_exact, base_exact,
                     entropy) -> Pipeline | None:
    exact, base = src_exact.get(entry.name), base_exact.get(entry.name)
    if (not isinstance(pipeline.stage, ByteGroup) or pipeline.is_delta or exact is None
            or not isinstance(base, np.ndarray) or base.dtype != entry.dtype.numpy
            or base.shape != entry.shape or not entry.numel):
        return None
    rebased = Pipeline(pipeline.stage, deltas.Xor(), entropy)
    mine = np.ascontiguousarray(exact).reshape(-1).view(np.uint8)
    theirs = np.ascontiguousarray(base).reshape(-1).view(np.uint8)
    itemsize = entry.dtype.itemsize
    chunks = []
    for c in range(entry.chunk_count):
        start, stop = (i * itemsize for i in entry.chunk_range(c))
        planes = rebased.encode(mine[start:stop], theirs[start:stop])
        if c == 0 and not deltas.keep(_stored(entry, 0), deltas.stored_size(planes)):
            return None
        chunks.append(planes)
    for planes in chunks:
        for stream, (coding, payload, size) in zip(new.streams, planes):
            stream.append(writer.write_chunk(coding, payload, size))
    return rebased
