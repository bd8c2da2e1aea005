"""The writer's per-record fast paths give the bytes of the plain ones."""
from __future__ import annotations

import numpy as np
import pytest

from inshrink.codecs import entropy
from inshrink.container import layout
from inshrink.container.index import Chunk
from inshrink.container.reader import ContainerReader
from inshrink.container.writer import ContainerWriter


def _payloads(rng: np.random.Generator) -> list:
    """Payloads of the kinds a save writes: zstd frames (bytes), raw planes (uint8 arrays,
    views too), empty ones, and some over the size written on its own."""
    out = []
    for size in (0, 1, 63, 64, 65, 3000, 70_000, 5, 200_000, 17):
        data = rng.integers(0, 256, size + 3, dtype=np.uint8)
        out.append(data[3:] if size % 2 else data[3:].tobytes())
    return out


def test_write_chunks_writes_what_write_chunk_writes(tmp_path):
    payloads = _payloads(np.random.default_rng(0))
    records = [("raw", p, len(p), layout.crc32(p)) for p in payloads]
    one = ContainerWriter(tmp_path / "one.ink")
    entries_one = [one.write_chunk(*r) for r in records[:4]]
    entries_one += [one.write_chunk(*r) for r in records[4:]]
    many = ContainerWriter(tmp_path / "many.ink")
    entries_many = many.write_chunks(records[:4]) + many.write_chunks(records[4:])
    assert many.write_chunks([]) == []
    assert entries_many == entries_one  # plain tuples, equal to the Chunks
    assert many.bytes_written == one.bytes_written
    for w in (one, many):
        w.commit({})
    assert (tmp_path / "one.ink").read_bytes() == (tmp_path / "many.ink").read_bytes()
    reader = ContainerReader(tmp_path / "many.ink")  # every record reads back
    try:
        for entry, payload in zip(entries_many, payloads):
            assert bytes(reader.read_chunk(Chunk(*entry))) == bytes(payload)
    finally:
        reader.close()


@pytest.mark.parametrize("level", [None, 3])
@pytest.mark.parametrize("size", [0, 10, 5000, entropy.PROBE_MIN_BYTES])
def test_entropy_stage_encodes_as_the_function_does(level, size):
    rng = np.random.default_rng(size)
    noise = rng.integers(0, 256, size, dtype=np.uint8)
    skewed = (rng.standard_normal(size) * 2).astype(np.int8).view(np.uint8)
    stage = entropy.Entropy(level)
    for data in (noise, skewed, skewed.tobytes(), memoryview(noise), noise.reshape(-1, 1)):
        coding, payload, nbytes = stage.encode(data)
        assert (coding, nbytes) == (entropy.encode(data, level)[0], size)
        assert bytes(payload) == bytes(entropy.encode(data, level)[1])
        assert bytes(entropy.decode(coding, payload, size)) == memoryview(data).tobytes()
