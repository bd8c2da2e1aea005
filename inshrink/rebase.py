"""Rewrite a standalone .ink file as a delta file against another checkpoint.

A series keeps its newest checkpoint whole; when a newer one arrives, the previous one is
rewritten here as a delta against it: quantized tensors get their codes stream re-coded as a
code delta (their escape streams are copied as they are), lossless tensors are XORed with the
new checkpoint's, anything else is copied chunk by chunk.
"""
from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from .codecs import chain, entropy, lossless, quant
from .container.index import TensorEntry
from .container.reader import ContainerReader
from .container.writer import ContainerWriter


def write_delta(src: str | os.PathLike, dst: str | os.PathLike, *,
                src_exact: Mapping[str, np.ndarray], src_codes: Mapping[str, np.ndarray],
                base_exact: Mapping[str, np.ndarray], base_codes: Mapping[str, np.ndarray],
                base_file: dict, level: int | None = None) -> None:
    """Write ``dst``: the tensors of the standalone file ``src`` as deltas against a base.

    ``src_exact``/``src_codes`` are what ``src`` decodes to (its lossless tensors and the codes
    of its quantized ones); ``base_*`` the same for the base file named by ``base_file``.
    A tensor keeps its delta only if its first chunk gets smaller.
    """
    reader = ContainerReader(src, use_mmap=False)
    writer = ContainerWriter(dst)
    try:
        for entry in reader.index.tensors:
            new = TensorEntry(entry.name, entry.dtype, entry.shape, entry.codec,
                              entry.chunk_elements, [[] for _ in entry.streams], entry.report)
            stage = chain.for_entry(entry)
            if not _rebase_quant(reader, writer, entry, new, stage, src_codes, base_codes,
                                 level) and not _rebase_lossless(
                    reader, writer, entry, new, stage, src_exact, base_exact, level):
                for stream, out in zip(entry.streams, new.streams):
                    for c in stream:
                        out.append(writer.write_chunk(c.coding, reader.read_chunk(c),
                                                      c.size, c.crc))
            writer.tensors.append(new)
        writer.commit(reader.index.metadata, reader.index.safetensors_header, base_file)
    except BaseException:
        writer.abort()
        raise
    finally:
        reader.close()


def _rebase_quant(reader, writer, entry, new, stage, src_codes, base_codes, level) -> bool:
    codes, base = src_codes.get(entry.name), base_codes.get(entry.name)
    if (not isinstance(stage, quant.QuantPlan) or stage.modulus is not None or codes is None
            or base is None or base.shape != (entry.numel,) or not entry.numel):
        return False
    plan = stage.with_delta(base)
    stored = []
    for c in range(entry.chunk_count):
        start, stop = entry.chunk_range(c)
        grouped = quant.code_delta(base[start:stop], codes[start:stop], plan.modulus)
        packed = quant.pack_codes(grouped, plan.bits)
        coding, payload = entropy.encode(packed, level)
        if c == 0 and len(memoryview(payload)) >= entry.streams[0][0].length:
            return False  # no gain: keep the tensor standalone
        stored.append((coding, payload, packed.size))
    for c, (coding, payload, size) in enumerate(stored):
        new.streams[0].append(writer.write_chunk(coding, payload, size))
        for k in (1, 2):
            old = entry.streams[k][c]
            new.streams[k].append(writer.write_chunk(old.coding, reader.read_chunk(old),
                                                     old.size, old.crc))
    new.codec = plan.chain()
    return True


def _rebase_lossless(reader, writer, entry, new, stage, src_exact, base_exact, level) -> bool:
    exact, base = src_exact.get(entry.name), base_exact.get(entry.name)
    if (not isinstance(stage, lossless.ByteGroup) or chain.is_delta(entry) or exact is None
            or base is None or base.dtype != entry.dtype.numpy or base.shape != entry.shape
            or not entry.numel):
        return False
    mine = np.ascontiguousarray(exact).reshape(-1).view(np.uint8)
    theirs = np.ascontiguousarray(base).reshape(-1).view(np.uint8)
    itemsize = entry.dtype.itemsize
    chunks = []
    for c in range(entry.chunk_count):
        start, stop = (i * itemsize for i in entry.chunk_range(c))
        planes = lossless.encode_chunk(np.bitwise_xor(mine[start:stop], theirs[start:stop]),
                                       stage, level)
        if c == 0 and sum(len(memoryview(p)) for _, p in planes) >= sum(
                s[0].length for s in entry.streams):
            return False
        chunks.append(((stop - start) // stage.word, planes))
    for size, planes in chunks:
        for stream, (coding, payload) in zip(new.streams, planes):
            stream.append(writer.write_chunk(coding, payload, size))
    new.codec = [{"id": chain.XOR}, stage.to_dict()]
    return True
